/* test_win_calendar.c - calendar windows on top of qg__calendar_period: the
 * reset instant (a retry at the reset succeeds, one ms earlier does not),
 * adjustments that belong to the current period only, clamped time, weekly
 * and billing-anchored periods, views and recovery, and a bad spec failing
 * closed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "window.h"
#include "wintest.h"
#include "civil.h"

static qg_tz *utc;

static int setup(void **state)
{
    (void)state;
    utc = qg__tz_utc();
    return utc ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    qg__tz_free(utc);
    return 0;
}

static int64_t day_ms(int y, int m, int d)
{
    return qg__days_from_civil(y, m, d) * QG_MS_PER_DAY;
}

static void test_daily_reset_boundary(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 0, utc);
    qg_win_state st = { 0 };
    const int64_t d0 = day_ms(2026, 1, 10), d1 = day_ms(2026, 1, 11);
    const int64_t noon = d0 + 12 * 3600000LL;
    tst_win_charge(&s, &st, noon, 6000);
    assert_int_equal(tst_win_admit(&s, &st, noon, 4000), noon);
    int64_t t = tst_win_admit(&s, &st, noon, 5000);
    assert_int_equal(t, d1);
    assert_int_equal(tst_win_admit(&s, &st, d1 - 1, 5000), d1);
    qg_window_view v = tst_win_view(&s, &st, d1 - 1);
    assert_int_equal(v.used_milli, 6000);
    assert_int_equal(v.remaining_milli, 4000);
    assert_int_equal(v.reset_at_ms, d1);
    assert_int_equal(v.period_ms, QG_MS_PER_DAY);   /* [d0, d1) */
    assert_int_equal(v.limit_milli, 10000);
    assert_int_equal(v.type, QG_WIN_CALENDAR);
    assert_int_equal(tst_win_admit(&s, &st, d1, 5000), d1);
    v = tst_win_view(&s, &st, d1);
    assert_int_equal(v.used_milli, 0);
    assert_int_equal(v.reset_at_ms, d1 + QG_MS_PER_DAY);
    assert_int_equal(v.period_ms, QG_MS_PER_DAY);
    assert_int_equal(qg__win_bytes(&s, &st), 0);
    qg__win_free(&s, &st);
}

static void test_reset_at_time_of_day(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 6 * 60 + 30, utc);
    qg_win_state st = { 0 };
    const int64_t d0 = day_ms(2026, 3, 1);
    const int64_t reset = d0 + (6 * 60 + 30) * 60000LL;
    tst_win_charge(&s, &st, reset - 1, 10000);  /* last ms of the old day */
    assert_int_equal(tst_win_admit(&s, &st, reset - 1, 1), reset);
    assert_int_equal(tst_win_view(&s, &st, reset - 1).reset_at_ms, reset);
    assert_int_equal(tst_win_admit(&s, &st, reset, 10000), reset);
    tst_win_charge(&s, &st, reset, 10000);
    assert_int_equal(tst_win_admit(&s, &st, reset, 1), reset + QG_MS_PER_DAY);
    qg__win_free(&s, &st);
}

static void test_never(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 0, utc);
    qg_win_state st = { 0 };
    const int64_t t = day_ms(2026, 1, 10) + 1000;
    assert_int_equal(tst_win_admit(&s, &st, t, 10001), QG_NEVER);
    assert_int_equal(tst_win_admit(&s, &st, t, 10000), t);
    assert_int_equal(tst_win_admit(&s, &st, t, 0), t);
    tst_win_charge(&s, &st, t, 10000);
    assert_int_equal(tst_win_admit(&s, &st, t, 10001), QG_NEVER);
    qg__win_free(&s, &st);
}

static void test_adjust(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 0, utc);
    qg_win_state st = { 0 };
    const int64_t d0 = day_ms(2026, 1, 10), d1 = day_ms(2026, 1, 11);
    tst_win_charge(&s, &st, d0 + 5000, 3000);
    tst_win_adjust(&s, &st, d0 + 6000, d0 + 5000, 2500);
    assert_int_equal(tst_win_view(&s, &st, d0 + 6000).used_milli, 5500);
    tst_win_adjust(&s, &st, d0 + 6000, d0 + 5000, -9999);
    assert_int_equal(tst_win_view(&s, &st, d0 + 6000).used_milli, 0);
    tst_win_adjust(&s, &st, d0 + 6000, d0 + 5000, 12000);   /* may exceed */
    assert_int_equal(tst_win_view(&s, &st, d0 + 6000).remaining_milli, 0);
    assert_int_equal(tst_win_admit(&s, &st, d0 + 6000, 1), d1);
    /* after the reset, yesterday's charge settles into nothing */
    tst_win_charge(&s, &st, d1 + 10, 1000);
    tst_win_adjust(&s, &st, d1 + 20, d0 + 5000, 4000);
    assert_int_equal(tst_win_view(&s, &st, d1 + 20).used_milli, 1000);
    tst_win_adjust(&s, &st, d1 + 20, d1 + 10, -500);
    assert_int_equal(tst_win_view(&s, &st, d1 + 20).used_milli, 500);
    qg__win_free(&s, &st);
}

static void test_time_backwards(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 0, utc);
    qg_win_state st = { 0 };
    const int64_t d0 = day_ms(2026, 1, 10), d1 = day_ms(2026, 1, 11);
    tst_win_charge(&s, &st, d0 + 1000, 4000);
    tst_win_charge(&s, &st, d1 + 1000, 7000);
    /* an instant of the previous day does not reopen it */
    qg_window_view v = tst_win_view(&s, &st, d0 + 2000);
    assert_int_equal(v.used_milli, 7000);
    assert_int_equal(v.reset_at_ms, d1 + QG_MS_PER_DAY);
    /* clamped */
    assert_int_equal(tst_win_admit(&s, &st, d0 + 2000, 3000), d1);
    assert_int_equal(tst_win_admit(&s, &st, d0 + 2000, 4000),
                     d1 + QG_MS_PER_DAY);
    qg__win_free(&s, &st);
}

static void test_weekly_and_billing(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_WEEK, 0, utc);
    s.cal.weekday = 0;                               /* Monday */
    qg_win_state st = { 0 };
    const int64_t mon = day_ms(2026, 1, 12);
    assert_int_equal(qg__weekday_from_days(mon / QG_MS_PER_DAY), 0);
    tst_win_charge(&s, &st, day_ms(2026, 1, 14), 10000);     /* a Wednesday */
    assert_int_equal(tst_win_admit(&s, &st, day_ms(2026, 1, 14), 1),
                     mon + 7 * QG_MS_PER_DAY);
    assert_int_equal(
        tst_win_view(&s, &st, mon + 7 * QG_MS_PER_DAY - 1).used_milli, 10000);
    assert_int_equal(
        tst_win_view(&s, &st, mon + 7 * QG_MS_PER_DAY).used_milli, 0);
    qg__win_free(&s, &st);

    /* a billing anchor on the 31st at 09:00 resets on Feb 28 at 09:00 */
    qg_window_spec b = tst_cal_spec(10000, QG_EVERY_MONTH, 0, utc);
    b.cal.anchor_billing = 1;
    const int64_t anchor = day_ms(2026, 1, 31) + 9 * 3600000LL;
    const int64_t feb28 = day_ms(2026, 2, 28) + 9 * 3600000LL;
    qg_win_ctx c = { .now_ms = day_ms(2026, 2, 10), .anchor_ms = anchor };
    assert_int_equal(qg__win_charge(&b, &st, &c, 10000), 0);
    assert_int_equal(qg__win_admit_at(&b, &st, &c, 1), feb28);
    c.now_ms = feb28 - 1;
    assert_int_equal(qg__win_admit_at(&b, &st, &c, 1), feb28);
    c.now_ms = feb28;
    assert_int_equal(qg__win_admit_at(&b, &st, &c, 1), feb28);
    qg__win_free(&b, &st);
}

static void test_recovery(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 0, utc);
    qg_win_state st = { 0 };
    const int64_t d0 = day_ms(2026, 1, 10), d1 = day_ms(2026, 1, 11);
    qg_win_ctx c = { .now_ms = d0 + 100 };
    qg_recovery_point p[4];
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 0);
    tst_win_charge(&s, &st, d0 + 100, 2500);
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 1);
    assert_int_equal(p[0].at_ms, d1);
    assert_int_equal(p[0].remaining_milli, 10000);
    qg__win_free(&s, &st);
}

static void test_bad_spec_fails_closed(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(10000, QG_EVERY_DAY, 0, utc);
    s.cal.tz = NULL;
    qg_win_state st = { 0 };
    qg_win_ctx c = { .now_ms = 1000 };
    assert_int_equal(qg__win_admit_at(&s, &st, &c, 1), QG_NEVER);
    assert_int_equal(qg__win_charge(&s, &st, &c, 1), QG_EINVAL);
    qg_window_view v;
    qg__win_view(&s, &st, &c, &v);
    assert_int_equal(v.used_milli, 0);
    assert_int_equal(v.reset_at_ms, 0);
    assert_int_equal(v.period_ms, 0);
    /* and an unknown window type is refused by the dispatcher */
    s.type = (qg_win_type)99;
    assert_int_equal(qg__win_admit_at(&s, &st, &c, 1), QG_NEVER);
    assert_int_equal(qg__win_charge(&s, &st, &c, 1), QG_EINVAL);
    assert_int_equal(qg__win_recovery(&s, &st, &c, NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daily_reset_boundary),
        cmocka_unit_test(test_reset_at_time_of_day),
        cmocka_unit_test(test_never),
        cmocka_unit_test(test_adjust),
        cmocka_unit_test(test_time_backwards),
        cmocka_unit_test(test_weekly_and_billing),
        cmocka_unit_test(test_recovery),
        cmocka_unit_test(test_bad_spec_fails_closed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
