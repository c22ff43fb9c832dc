/* wintest.c - helpers shared by the window unit tests (test_win_*.c):
 * spec builders per window type and admit/charge/view/adjust/release
 * wrappers at a given instant.  See wintest.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "wintest.h"

qg_window_spec tst_roll_spec(int64_t limit, int64_t len, int64_t prec,
                             uint32_t maxe)
{
    qg_window_spec s;
    memset(&s, 0, sizeof s);
    s.name = (char *)"burst";
    s.type = QG_WIN_ROLLING;
    s.unit = QG_UNIT_WEIGHT;
    s.limit_milli = limit;
    s.length_ms = len;
    s.precision_ms = prec;
    s.max_entries = maxe;
    return s;
}

qg_window_spec tst_sess_spec(int64_t limit, int64_t len)
{
    qg_window_spec s;
    memset(&s, 0, sizeof s);
    s.name = (char *)"session_5h";
    s.type = QG_WIN_SESSION;
    s.limit_milli = limit;
    s.length_ms = len;
    return s;
}

qg_window_spec tst_rate_spec(int64_t limit, int64_t per, int64_t burst,
                             qg_unit unit)
{
    qg_window_spec s;
    memset(&s, 0, sizeof s);
    s.name = (char *)"rpm";
    s.type = QG_WIN_RATE;
    s.unit = unit;
    s.limit_milli = limit;
    s.length_ms = per;
    s.burst_milli = burst;
    return s;
}

qg_window_spec tst_cal_spec(int64_t limit, qg_every every, int minute,
                            const qg_tz *tz)
{
    qg_window_spec s;
    memset(&s, 0, sizeof s);
    s.name = (char *)"daily";
    s.type = QG_WIN_CALENDAR;
    s.limit_milli = limit;
    s.cal.every = every;
    s.cal.minute_of_day = minute;
    s.cal.mday = 1;
    s.cal.tz = tz;
    return s;
}

qg_window_spec tst_conc_spec(int64_t slots, int64_t ttl)
{
    qg_window_spec s;
    memset(&s, 0, sizeof s);
    s.name = (char *)"concurrency";
    s.type = QG_WIN_CONCURRENCY;
    s.limit_milli = slots * 1000;
    s.lease_ttl_ms = ttl;
    return s;
}

int64_t tst_win_admit(const qg_window_spec *s, qg_win_state *st, int64_t now,
                      int64_t a)
{
    qg_win_ctx c = { .now_ms = now };
    return qg__win_admit_at(s, st, &c, a);
}

void tst_win_charge(const qg_window_spec *s, qg_win_state *st, int64_t now,
                    int64_t a)
{
    qg_win_ctx c = { .now_ms = now };
    assert_int_equal(qg__win_charge(s, st, &c, a), 0);
}

qg_window_view tst_win_view(const qg_window_spec *s, qg_win_state *st,
                            int64_t now)
{
    qg_win_ctx c = { .now_ms = now };
    qg_window_view v;
    qg__win_view(s, st, &c, &v);
    return v;
}

void tst_win_adjust(const qg_window_spec *s, qg_win_state *st, int64_t now,
                    int64_t t0, int64_t d)
{
    qg_win_ctx c = { .now_ms = now };
    qg__win_adjust(s, st, &c, t0, d);
}

int64_t tst_conc_admit(const qg_window_spec *s, qg_win_state *st, int64_t now)
{
    qg_win_ctx c = { .now_ms = now };
    return qg__win_admit_at(s, st, &c, qg__win_amount(s, 5555));
}

int tst_conc_charge(const qg_window_spec *s, qg_win_state *st, int64_t now,
                    uint64_t rid)
{
    qg_win_ctx c = { .now_ms = now, .rid = rid };
    return qg__win_charge(s, st, &c, qg__win_amount(s, 5555));
}

int tst_conc_release(const qg_window_spec *s, qg_win_state *st, int64_t now,
                     uint64_t rid)
{
    qg_win_ctx c = { .now_ms = now, .rid = rid };
    return qg__win_release(s, st, &c);
}
