/* test_win_rate.c - rate windows (GCRA): burst then steady rate, exact
 * retry instants including amounts above one unit and rates that do not
 * divide evenly, adjustments, the view of the bucket and its recovery. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "window.h"
#include "wintest.h"

/* Admission answers t: asserts one ms earlier is refused, t admits. */
static void check_retry(const qg_window_spec *s, const qg_win_state *st,
                        int64_t now, int64_t a, int64_t want)
{
    qg_win_state a1 = *st, a2 = *st;   /* rate state has no heap part */
    assert_int_equal(tst_win_admit(s, &a1, now, a), want);
    if (want > now) {
        assert_int_equal(tst_win_admit(s, &a2, want - 1, a), want);
        a2 = *st;
    }
    assert_int_equal(tst_win_admit(s, &a2, want, a), want);
}

static void test_burst_then_steady(void **state)
{
    (void)state;
    qg_window_spec s = tst_rate_spec(10000, 60000, 0, QG_UNIT_REQUESTS);
    qg_win_state st = { 0 };
    int64_t a = qg__win_amount(&s, 123456);    /* requests: always 1000 */
    assert_int_equal(a, 1000);
    const int64_t t0 = 100000;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(tst_win_admit(&s, &st, t0, a), t0);
        tst_win_charge(&s, &st, t0, a);
    }
    check_retry(&s, &st, t0, a, t0 + 6000);   /* the 11th */
    tst_win_charge(&s, &st, t0 + 6000, a);
    check_retry(&s, &st, t0 + 6000, a, t0 + 12000);
    /* steady: one every 6 s */
    for (int i = 2; i < 20; i++) {
        int64_t t = t0 + 6000 * i;
        assert_int_equal(tst_win_admit(&s, &st, t - 1, a), t);
        assert_int_equal(tst_win_admit(&s, &st, t, a), t);
        tst_win_charge(&s, &st, t, a);
    }
    qg_window_view v = tst_win_view(&s, &st, t0 + 6000 * 19);
    assert_int_equal(v.limit_milli, 10000);
    assert_int_equal(v.used_milli, 10000);
    assert_int_equal(v.remaining_milli, 0);
    assert_int_equal(v.unit, QG_UNIT_REQUESTS);
}

static void test_custom_burst_and_never(void **state)
{
    (void)state;
    qg_window_spec s = tst_rate_spec(10000, 60000, 5000, QG_UNIT_REQUESTS);
    qg_win_state st = { 0 };
    for (int i = 0; i < 5; i++) {
        assert_int_equal(tst_win_admit(&s, &st, 1000, 1000), 1000);
        tst_win_charge(&s, &st, 1000, 1000);
    }
    check_retry(&s, &st, 1000, 1000, 7000);
    assert_int_equal(tst_win_admit(&s, &st, 1000, 5001), QG_NEVER);
    assert_int_equal(tst_win_admit(&s, &st, 1000, 5000), 31000);
    assert_int_equal(tst_win_admit(&s, &st, 1000, 0), 1000);
}

static void test_retry_multi_unit(void **state)
{
    (void)state;
    qg_window_spec s = tst_rate_spec(10000, 60000, 0, QG_UNIT_WEIGHT);
    qg_win_state st = { 0 };
    assert_int_equal(qg__win_amount(&s, 3000), 3000);
    tst_win_charge(&s, &st, 0, 10000);                   /* bucket full */
    check_retry(&s, &st, 0, 3000, 18000);        /* 3 units at 6 s each */
    check_retry(&s, &st, 0, 10000, 60000);
    check_retry(&s, &st, 5000, 2500, 15000);
    assert_int_equal(tst_win_admit(&s, &st, 0, 10001), QG_NEVER);
}

static void test_uneven_rate(void **state)
{
    (void)state;
    /* 7 per second: one unit every 142.857... ms */
    qg_window_spec s = tst_rate_spec(7000, 1000, 0, QG_UNIT_REQUESTS);
    qg_win_state st = { 0 };
    for (int i = 0; i < 7; i++)
        tst_win_charge(&s, &st, 0, 1000);
    check_retry(&s, &st, 0, 1000, 143);
    check_retry(&s, &st, 0, 2000, 286);          /* ceil(285.71) */
    tst_win_charge(&s, &st, 143, 1000);
    check_retry(&s, &st, 143, 1000, 286);
    tst_win_charge(&s, &st, 286, 1000);
    check_retry(&s, &st, 286, 1000, 429);        /* ceil(428.57) */
    qg_window_view v = tst_win_view(&s, &st, 286);
    /* tat 9e6, S(286) = 2002000: fill 6998000 / P 1000 */
    assert_int_equal(v.used_milli, 6998);
}

static void test_adjust(void **state)
{
    (void)state;
    qg_window_spec s = tst_rate_spec(10000, 60000, 0, QG_UNIT_WEIGHT);
    qg_win_state st = { 0 };
    qg_win_ctx c = { .now_ms = 0 };
    tst_win_charge(&s, &st, 0, 4000);
    qg__win_adjust(&s, &st, &c, 0, 2000);         /* settle up */
    assert_int_equal(tst_win_view(&s, &st, 0).used_milli, 6000);
    check_retry(&s, &st, 0, 6000, 12000);
    qg__win_adjust(&s, &st, &c, 0, -5000);        /* settle down */
    assert_int_equal(tst_win_view(&s, &st, 0).used_milli, 1000);
    assert_int_equal(tst_win_view(&s, &st, 0).reset_at_ms, 6000);
    /* a refund larger than the fill leaves a full bucket, no credit */
    qg__win_adjust(&s, &st, &c, 0, -100000);
    assert_int_equal(tst_win_view(&s, &st, 0).used_milli, 0);
    assert_int_equal(tst_win_view(&s, &st, 0).reset_at_ms, 0);
    assert_int_equal(tst_win_admit(&s, &st, 0, 10000), 0);
    tst_win_charge(&s, &st, 0, 10000);
    assert_int_equal(tst_win_admit(&s, &st, 0, 1), 6);
}

static void test_time_backwards(void **state)
{
    (void)state;
    qg_window_spec s = tst_rate_spec(10000, 60000, 0, QG_UNIT_REQUESTS);
    qg_win_state st = { 0 };
    for (int i = 0; i < 10; i++)
        tst_win_charge(&s, &st, 100000, 1000);
    assert_int_equal(tst_win_admit(&s, &st, 50000, 1000), 106000);
    assert_int_equal(tst_win_admit(&s, &st, 50000, 0), 100000);
    /* a charge presented at an earlier time is taken at the clamped now */
    tst_win_charge(&s, &st, 20000, 1000);
    assert_int_equal(tst_win_admit(&s, &st, 20000, 1000), 112000);
    assert_int_equal(tst_win_view(&s, &st, 20000).used_milli, 11000);
}

static void test_view_recovery(void **state)
{
    (void)state;
    qg_window_spec s = tst_rate_spec(10000, 60000, 0, QG_UNIT_REQUESTS);
    qg_win_state st = { 0 };
    qg_win_ctx c = { .now_ms = 100000 };
    qg_recovery_point p[4];
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 0);
    for (int i = 0; i < 10; i++)
        tst_win_charge(&s, &st, 100000, 1000);
    qg_window_view v = tst_win_view(&s, &st, 100000);
    assert_int_equal(v.used_milli, 10000);
    assert_int_equal(v.reset_at_ms, 160000);
    v = tst_win_view(&s, &st, 130000);
    assert_int_equal(v.used_milli, 5000);
    assert_int_equal(v.remaining_milli, 5000);

    qg_win_state s2 = { 0 };
    for (int i = 0; i < 10; i++)
        tst_win_charge(&s, &s2, 100000, 1000);
    assert_int_equal(qg__win_recovery(&s, &s2, &c, p, 4), 4);
    const int64_t want_at[4] = { 115000, 130000, 145000, 160000 };
    const int64_t want_r[4] = { 2500, 5000, 7500, 10000 };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(p[i].at_ms, want_at[i]);
        assert_int_equal(p[i].remaining_milli, want_r[i]);
        qg_win_state a = s2;
        assert_true(tst_win_view(&s, &a, p[i].at_ms - 1).remaining_milli <
                    p[i].remaining_milli);
        a = s2;
        assert_int_equal(tst_win_view(&s, &a, p[i].at_ms).remaining_milli,
                         p[i].remaining_milli);
    }
    assert_int_equal(qg__win_recovery(&s, &s2, &c, p, 1), 1);
    assert_int_equal(p[0].at_ms, 160000);
    assert_int_equal(p[0].remaining_milli, 10000);
    assert_int_equal(qg__win_bytes(&s, &s2), 0);
    qg__win_free(&s, &s2);
    assert_true(s2.u.rate.tat == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_then_steady),
        cmocka_unit_test(test_custom_burst_and_never),
        cmocka_unit_test(test_retry_multi_unit),
        cmocka_unit_test(test_uneven_rate),
        cmocka_unit_test(test_adjust),
        cmocka_unit_test(test_time_backwards),
        cmocka_unit_test(test_view_recovery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
