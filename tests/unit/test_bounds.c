/* test_bounds.c - the arithmetic at its bounds (quotagate.h "bounds",
 * docs/decisions.md "Bounds"): every window type pushed to the bound of
 * its sums by forced charges (rebuilds and recovered settles charge
 * without deciding), which must saturate and refuse, never wrap and
 * admit; weights from huge token counts; payg prices and spent amounts;
 * and a randomized comparison of the window arithmetic with a plain
 * 128-bit reference at the bounds.  Under UBSan any signed overflow
 * aborts the binary, so reaching the end is itself a check. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "civil.h"
#include "decide.h"
#include "fixed.h"
#include "weights.h"
#include "window.h"
#include "wintest.h"

#define MAXA QG_AMOUNT_MAX_MILLI
#define T0 (INT64_C(20550) * QG_MS_PER_DAY + 3600000)   /* 2026-04-06 01:00Z */

typedef __int128 i128;

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

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* A uniform value in [0, n). */
static int64_t below(int64_t n)
{
    return n <= 0 ? 0 : (int64_t)(rnd() % (uint64_t)n);
}

/* An amount: mostly huge (near the bound), sometimes small or zero. */
static int64_t amount(void)
{
    switch (rnd() % 6) {
    case 0: return 0;
    case 1: return below(5000);
    case 2: return MAXA;
    case 3: return MAXA - below(1000);
    default: return below(MAXA) + 1;
    }
}

/* ----------------------------------------------------------- weights */

static void test_weight_bounds(void **state)
{
    (void)state;
    qg_model m;
    memset(&m, 0, sizeof m);
    m.per_request_milli = 1000;
    m.input_per_1k_micro = 1000000;         /* 1 point per 1k tokens */
    m.output_per_1k_micro = 5000000;
    /* the token bound itself is fine and exact */
    assert_true(qg__weight_milli(&m, QG_TOKENS_MAX, QG_TOKENS_MAX) ==
                1000 + QG_TOKENS_MAX + 5 * QG_TOKENS_MAX);
    /* beyond the token bound: refused */
    assert_true(qg__weight_milli(&m, QG_TOKENS_MAX + 1, 0) < 0);
    assert_true(qg__weight_milli(&m, 0, INT64_MAX) < 0);
    assert_true(qg__weight_milli(&m, INT64_MAX, INT64_MAX) < 0);
    assert_true(qg__weight_milli(&m, -1, 0) < 0);
    /* coefficients so large that bounded tokens weigh more than the
     * bound: reported as over the bound, never wrapped */
    m.input_per_1k_micro = INT64_MAX;
    m.output_per_1k_micro = INT64_MAX;
    m.per_request_milli = MAXA;
    assert_true(qg__weight_milli(&m, QG_TOKENS_MAX, QG_TOKENS_MAX) > MAXA);
    assert_true(qg__weight_milli(&m, 0, 0) == MAXA);
    /* randomized against the formula in 128 bits */
    for (int i = 0; i < 20000; i++) {
        int64_t in = below(QG_TOKENS_MAX + 1), out = below(QG_TOKENS_MAX + 1);
        m.per_request_milli = below(MAXA + 1);
        m.input_per_1k_micro = (rnd() & 1) ? below(INT64_MAX) : below(10000000);
        m.output_per_1k_micro = (rnd() & 1) ? below(INT64_MAX) : below(10000000);
        i128 nano = (i128)in * m.input_per_1k_micro +
                    (i128)out * m.output_per_1k_micro;
        i128 w = (nano + 999999) / 1000000 + m.per_request_milli;
        int64_t got = qg__weight_milli(&m, in, out);
        if (w <= MAXA)
            assert_true(got == (int64_t)w);
        else
            assert_true(got > MAXA);
    }
}

static void test_ceil_div_extremes(void **state)
{
    (void)state;
    assert_true(qg__ceil_div(INT64_MAX, 1) == INT64_MAX);
    assert_true(qg__ceil_div(INT64_MAX, 2) == INT64_MAX / 2 + 1);
    assert_true(qg__ceil_div(INT64_MAX - 1, INT64_MAX) == 1);
    assert_true(qg__ceil_div(0, INT64_MAX) == 0);
}

/* ------------------------------------------------ windows at the bound */

/* Forced charges: charge without asking (a rebuild, a recovered
 * settle), five of the bound's size as in the report. */
static void force5(const qg_window_spec *s, qg_win_state *st, int64_t t0,
                   int64_t step)
{
    for (int i = 0; i < 5; i++)
        tst_win_charge(s, st, t0 + i * step, MAXA);
}

static void test_rolling_saturates(void **state)
{
    (void)state;
    const int64_t L = 5 * 3600000LL;
    qg_window_spec s = tst_roll_spec(50000, L, 0, 0);
    qg_win_state st = { 0 };
    force5(&s, &st, T0, 1000);
    qg_window_view v = tst_win_view(&s, &st, T0 + 5000);
    assert_true(v.used_milli == MAXA);
    assert_true(v.remaining_milli == 0);
    /* refused; the earliest fit is when the last of the five leaves */
    assert_true(tst_win_admit(&s, &st, T0 + 5000, 1) == T0 + 4000 + L);
    assert_true(tst_win_admit(&s, &st, T0 + 5000, 0) == T0 + 5000);
    /* four of them gone: the fifth still holds the bound */
    v = tst_win_view(&s, &st, T0 + 3000 + L);
    assert_true(v.used_milli == MAXA);
    assert_true(tst_win_admit(&s, &st, T0 + 3000 + L, 1) == T0 + 4000 + L);
    /* recovery steps stay within the bound */
    qg_recovery_point pts[4];
    qg_win_ctx c = { .now_ms = T0 + 3000 + L };
    int n = qg__win_recovery(&s, &st, &c, pts, 4);
    assert_true(n >= 1);
    assert_true(pts[n - 1].at_ms == T0 + 4000 + L);
    assert_true(pts[n - 1].remaining_milli == 50000);
    /* all gone */
    v = tst_win_view(&s, &st, T0 + 4000 + L);
    assert_true(v.used_milli == 0);
    assert_true(tst_win_admit(&s, &st, T0 + 4000 + L, 50000) == T0 + 4000 + L);
    qg__win_free(&s, &st);

    /* the same millisecond: one entry holding the bound; a refund of a
     * saturated entry cannot bring it back under (its real amount is
     * unknown, and larger) */
    st = (qg_win_state){ 0 };
    force5(&s, &st, T0, 0);
    assert_true(tst_win_view(&s, &st, T0).used_milli == MAXA);
    tst_win_adjust(&s, &st, T0 + 1, T0, -MAXA);
    assert_true(tst_win_view(&s, &st, T0 + 1).used_milli == MAXA);
    assert_true(tst_win_admit(&s, &st, T0 + 1, 1) == T0 + L);
    assert_true(tst_win_view(&s, &st, T0 + L).used_milli == 0);
    qg__win_free(&s, &st);

    /* compaction merging saturated entries */
    qg_window_spec c16 = tst_roll_spec(MAXA, L, 0, 16);
    st = (qg_win_state){ 0 };
    for (int i = 0; i < 200; i++)
        tst_win_charge(&c16, &st, T0 + i * 7, MAXA / 3);
    assert_true(tst_win_view(&c16, &st, T0 + 2000).used_milli == MAXA);
    assert_true(tst_win_admit(&c16, &st, T0 + 2000, 1) > T0 + 2000);
    qg__win_free(&c16, &st);
}

static void test_calendar_saturates(void **state)
{
    (void)state;
    qg_window_spec s = tst_cal_spec(400000, QG_EVERY_DAY, 0, utc);
    qg_win_state st = { 0 };
    const int64_t day_end = T0 - 3600000 + QG_MS_PER_DAY;
    force5(&s, &st, T0, 1);
    qg_window_view v = tst_win_view(&s, &st, T0 + 10);
    assert_true(v.used_milli == MAXA);
    assert_true(v.remaining_milli == 0);
    assert_true(tst_win_admit(&s, &st, T0 + 10, 1) == day_end);
    /* sticky: a refund cannot bring a saturated counter under */
    tst_win_adjust(&s, &st, T0 + 20, T0, -MAXA);
    assert_true(tst_win_view(&s, &st, T0 + 20).used_milli == MAXA);
    assert_true(tst_win_admit(&s, &st, T0 + 20, 1) == day_end);
    /* the reset clears it */
    assert_true(tst_win_view(&s, &st, day_end).used_milli == 0);
    assert_true(tst_win_admit(&s, &st, day_end, 400000) == day_end);
    qg__win_free(&s, &st);
}

static void test_session_saturates(void **state)
{
    (void)state;
    const int64_t L = 5 * 3600000LL;
    qg_window_spec s = tst_sess_spec(400000, L);
    qg_win_state st = { 0 };
    force5(&s, &st, T0, 1);
    qg_window_view v = tst_win_view(&s, &st, T0 + 10);
    assert_true(v.used_milli == MAXA);
    assert_true(tst_win_admit(&s, &st, T0 + 10, 1) == T0 + L);
    tst_win_adjust(&s, &st, T0 + 20, T0 + 1, -MAXA);
    assert_true(tst_win_view(&s, &st, T0 + 20).used_milli == MAXA);
    assert_true(tst_win_view(&s, &st, T0 + L).used_milli == 0);
    assert_true(tst_win_admit(&s, &st, T0 + L, 1) == T0 + L);
    qg__win_free(&s, &st);
}

static void test_rate_saturates(void **state)
{
    (void)state;
    /* 20 points a minute in weight units, and the widest spec the
     * bounds allow (limit and burst at the bound, the longest period) */
    qg_window_spec specs[2] = {
        tst_rate_spec(20000, 60000, 0, QG_UNIT_WEIGHT),
        tst_rate_spec(MAXA, QG_DURATION_MAX_MS, MAXA, QG_UNIT_WEIGHT),
    };
    for (int k = 0; k < 2; k++) {
        const qg_window_spec *s = &specs[k];
        qg_win_state st = { 0 };
        for (int i = 0; i < 50; i++)
            tst_win_charge(s, &st, T0 + i, MAXA);
        qg_window_view v = tst_win_view(s, &st, T0 + 100);
        assert_true(v.used_milli > 0 && v.used_milli <= MAXA);
        assert_true(v.remaining_milli == 0 || k == 1);
        int64_t at = tst_win_admit(s, &st, T0 + 100, 1000);
        assert_true(at > T0 + 100);
        if (k == 0) {
            /* no instant before the end of time admits it, and the
             * instants the view names stay within the time bound */
            qg_recovery_point pts[4];
            qg_win_ctx c = { .now_ms = T0 + 100 };
            int n = qg__win_recovery(s, &st, &c, pts, 4);
            assert_true(at > QG_TIME_MAX_MS);
            assert_true(v.reset_at_ms == QG_TIME_MAX_MS);
            assert_true(n >= 1 && pts[n - 1].at_ms == QG_TIME_MAX_MS &&
                        pts[n - 1].remaining_milli == 20000);
            tst_win_adjust(s, &st, T0 + 200, T0, -MAXA);
            assert_true(tst_win_admit(s, &st, T0 + 200, 1000) >
                        QG_TIME_MAX_MS);
        }
        qg__win_free(s, &st);
    }
}

static void test_concurrency_bound(void **state)
{
    (void)state;
    /* the most slots a rules file can give: the view's amounts are the
     * slot count times 1000, at the bound and exact */
    qg_window_spec s = tst_conc_spec(MAXA / 1000, 60000);
    qg_win_state st = { 0 };
    for (uint64_t i = 1; i <= 100; i++) {
        assert_true(tst_conc_admit(&s, &st, T0) == T0);
        assert_int_equal(tst_conc_charge(&s, &st, T0, i), 0);
    }
    qg_window_view v = tst_win_view(&s, &st, T0);
    assert_true(v.limit_milli == MAXA);
    assert_true(v.used_milli == 100000);
    assert_true(v.remaining_milli == MAXA - 100000);
    qg_recovery_point pts[4];
    qg_win_ctx c = { .now_ms = T0 };
    int n = qg__win_recovery(&s, &st, &c, pts, 4);
    assert_true(n == 1 && pts[0].at_ms == T0 + 60000 &&
                pts[0].remaining_milli == MAXA);
    qg__win_free(&s, &st);
}

/* ----------------------------------------------------------------- payg */

static void test_payg_at_bound(void **state)
{
    (void)state;
    assert_true(qg__overage_cost(MAXA, QG_MONEY_MAX_MICRO) ==
                QG_MONEY_MAX_MICRO);
    assert_true(qg__overage_cost(MAXA, 1000) == MAXA);
    for (int i = 0; i < 20000; i++) {
        int64_t o = amount(), p = below(QG_MONEY_MAX_MICRO + 1);
        i128 c = ((i128)o * p + 999) / 1000;
        if (c > QG_MONEY_MAX_MICRO)
            c = QG_MONEY_MAX_MICRO;
        assert_true(qg__overage_cost(o, p) == (int64_t)c);
    }
    /* a decision whose member has spent the bound: with a cap it is
     * refused (however large the cap), without one it is admitted; the
     * spent amount never passes the bound */
    qg_window_spec w = tst_cal_spec(1000, QG_EVERY_DAY, 0, utc);
    for (int capped = 0; capped < 2; capped++) {
        qg_win_state st = { 0 };
        int64_t spent = QG_MONEY_MAX_MICRO - 5;
        qg_decide_in in;
        qg_decision *d = calloc(1, sizeof *d);
        assert_non_null(d);
        memset(&in, 0, sizeof in);
        assert_int_equal(qg__decide_add(&in, &w, 1, &st, 0), 0);
        in.ctx[0].now_ms = in.ctx[1].now_ms = T0;
        in.model = -1;
        in.weight_milli = MAXA;
        in.soft = 1;
        in.price_micro = QG_MONEY_MAX_MICRO;
        in.cap_micro = capped ? QG_MONEY_MAX_MICRO : 0;
        in.cap_end_ms = T0 + QG_MS_PER_DAY;
        in.spent_micro = &spent;
        assert_int_equal(qg__decide(&in, d), 0);
        if (capped) {
            assert_int_equal(d->outcome, QG_REJECT);
            assert_true(d->cap_reached);
            assert_true(spent == QG_MONEY_MAX_MICRO - 5);
        } else {
            assert_int_equal(d->outcome, QG_ALLOW);
            assert_true(spent == QG_MONEY_MAX_MICRO);
            assert_true(d->overage_cost_micro == QG_MONEY_MAX_MICRO);
            /* the lifted window is over its limit: usage is never hidden,
             * and it is within the bound */
            assert_true(tst_win_view(&w, &st, T0).used_milli == MAXA);
        }
        qg__win_free(&w, &st);
        free(d);
    }
}

/* ------------------------------------------ randomized, 128-bit reference */

/* The reference keeps every charge exactly (128 bits), per millisecond
 * as the engine coalesces them, and mirrors only the documented rule for
 * a saturated counter: a refund cannot bring it under (it is "sticky").
 * The engine must then show min(bound, exact) and answer the same
 * earliest instant. */
typedef struct rent {
    int64_t t;
    i128 a;
} rent;

#define RMAX 512

typedef struct rref {
    rent e[RMAX];
    int n;
} rref;

static i128 clamp_sum(i128 v)
{
    return v > MAXA ? MAXA : v;
}

static i128 rroll_used(const rref *r, int64_t L, int64_t now)
{
    i128 u = 0;
    for (int i = 0; i < r->n; i++)
        if (r->e[i].t + L > now)
            u += r->e[i].a > MAXA ? MAXA : r->e[i].a;
    return u;
}

static int64_t rroll_admit(const rref *r, int64_t L, int64_t lim,
                           int64_t now, int64_t a)
{
    i128 used = rroll_used(r, L, now);
    if (a <= 0 || used + a <= lim)
        return now;
    if (a > lim)
        return QG_NEVER;
    for (int i = 0; i < r->n; i++) {
        int64_t t = r->e[i].t + L;
        if (t > now && rroll_used(r, L, t) + a <= lim)
            return t;
    }
    return QG_NEVER;
}

static void test_random_rolling(void **state)
{
    (void)state;
    for (int round = 0; round < 40; round++) {
        const int64_t L = 1000;
        int64_t lim = (int64_t[]){50000, MAXA / 2, MAXA}[round % 3];
        qg_window_spec s = tst_roll_spec(lim, L, 0, RMAX);
        qg_win_state st = { 0 };
        static rref r;
        int64_t now = T0;
        r.n = 0;
        for (int op = 0; op < 400; op++) {
            now += below(60);
            int kind = (int)(rnd() % 4);
            int64_t a = amount();
            if (kind <= 1) {
                /* a forced charge, coalesced per ms as the engine does */
                if (r.n && r.e[r.n - 1].t == now) {
                    r.e[r.n - 1].a += a;
                } else if (r.n < RMAX) {
                    r.e[r.n].t = now;
                    r.e[r.n].a = a;
                    r.n++;
                } else {
                    continue;
                }
                tst_win_charge(&s, &st, now, a);
            } else if (kind == 2 && r.n) {
                /* adjust a live charge */
                int i = (int)below(r.n);
                int64_t d = (rnd() & 1) ? -amount() : amount();
                if (r.e[i].t + L <= now)
                    continue;
                if (!(r.e[i].a >= MAXA && d < 0)) {
                    r.e[i].a += d;
                    if (r.e[i].a < 0)
                        r.e[i].a = 0;
                }
                tst_win_adjust(&s, &st, now, r.e[i].t, d);
            } else {
                assert_true(tst_win_admit(&s, &st, now, a) ==
                            rroll_admit(&r, L, lim, now, a));
            }
            assert_true(tst_win_view(&s, &st, now).used_milli ==
                        (int64_t)clamp_sum(rroll_used(&r, L, now)));
        }
        qg__win_free(&s, &st);
    }
}

/* Calendar and session: one counter each, sticky at the bound. */
static void test_random_counters(void **state)
{
    (void)state;
    const int64_t L = 5000;
    for (int round = 0; round < 60; round++) {
        int64_t lim = (int64_t[]){50000, MAXA / 2, MAXA}[round % 3];
        int sess = round & 1;
        qg_window_spec s = sess ? tst_sess_spec(lim, L)
                                : tst_cal_spec(lim, QG_EVERY_DAY, 0, utc);
        qg_win_state st = { 0 };
        /* calendar: one day; session: one session opened at T0 */
        int64_t now = T0, start = T0;
        i128 used = 0;
        tst_win_charge(&s, &st, now, 0);
        for (int op = 0; op < 300; op++) {
            now += below(sess ? 15 : 200);
            if (sess && now >= start + L)
                break;
            int64_t a = amount();
            switch (rnd() % 3) {
            case 0:
                tst_win_charge(&s, &st, now, a);
                used += a;
                break;
            case 1: {
                int64_t d = -amount();
                if (used < MAXA) {
                    used += d;
                    if (used < 0)
                        used = 0;
                }
                tst_win_adjust(&s, &st, now, start, d);
                break;
            }
            default: {
                int64_t want = a <= 0 || clamp_sum(used) + a <= lim ? now
                               : a > lim ? QG_NEVER
                               : sess ? start + L
                                      : T0 - 3600000 + QG_MS_PER_DAY;
                assert_true(tst_win_admit(&s, &st, now, a) == want);
            }
            }
            assert_true(tst_win_view(&s, &st, now).used_milli ==
                        (int64_t)clamp_sum(used));
        }
        qg__win_free(&s, &st);
    }
}

/* Rate: an exact 128-bit bucket; the engine may only forget what could
 * not drain before the end of time, so every instant it names up to
 * QG_TIME_MAX_MS is the exact one, and when the exact instant lies
 * beyond, so does the engine's. */
static void test_random_rate(void **state)
{
    (void)state;
    for (int round = 0; round < 60; round++) {
        int64_t lim = (int64_t[]){20000, MAXA / 7, MAXA}[round % 3];
        int64_t P = (int64_t[]){60000, 1, QG_DURATION_MAX_MS}[(round / 3) % 3];
        int64_t burst = (round & 1) ? lim : MAXA;
        qg_window_spec s = tst_rate_spec(lim, P, burst, QG_UNIT_WEIGHT);
        qg_win_state st = { 0 };
        i128 tat = 0;
        int64_t now = T0;
        int sticky = 0;
        for (int op = 0; op < 300; op++) {
            now += below(1000);
            i128 sn = (i128)now * lim, tau = (i128)burst * P;
            int64_t a = amount();
            switch (rnd() % 3) {
            case 0:
                if (a > 0) {
                    tat = (tat > sn ? tat : sn) + (i128)a * P;
                    if (tat - sn > tau + (i128)lim * QG_TIME_MAX_MS)
                        sticky = 1;
                }
                tst_win_charge(&s, &st, now, a);
                break;
            case 1:
                if (!sticky) {
                    tat -= (i128)a * P;
                    if (tat < sn)
                        tat = sn;
                }
                tst_win_adjust(&s, &st, now, now, -a);
                break;
            default: {
                int64_t got = tst_win_admit(&s, &st, now, a);
                i128 want;
                if (a <= 0)
                    want = now;
                else if (a > burst)
                    want = QG_NEVER;
                else if ((tat > sn ? tat : sn) + (i128)a * P - sn <= tau)
                    want = now;
                else {
                    i128 n = tat + (i128)a * P - tau;
                    want = n / lim + (n % lim != 0);
                }
                if (want <= QG_TIME_MAX_MS)
                    assert_true(got == (int64_t)want);
                else
                    assert_true(got > QG_TIME_MAX_MS);
            }
            }
            qg_window_view v = tst_win_view(&s, &st, now);
            assert_true(v.used_milli >= 0 && v.used_milli <= MAXA);
        }
        qg__win_free(&s, &st);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_bounds),
        cmocka_unit_test(test_ceil_div_extremes),
        cmocka_unit_test(test_rolling_saturates),
        cmocka_unit_test(test_calendar_saturates),
        cmocka_unit_test(test_session_saturates),
        cmocka_unit_test(test_rate_saturates),
        cmocka_unit_test(test_concurrency_bound),
        cmocka_unit_test(test_payg_at_bound),
        cmocka_unit_test(test_random_rolling),
        cmocka_unit_test(test_random_counters),
        cmocka_unit_test(test_random_rate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
