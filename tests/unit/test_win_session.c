/* test_win_session.c - session windows: opening at the first charge, the
 * closing instant, exact retry, adjustments scoped to the open session and
 * clamped time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "window.h"
#include "wintest.h"

static void test_opens_at_first_charge(void **state)
{
    (void)state;
    qg_window_spec s = tst_sess_spec(5000, 10000);
    qg_win_state st = { 0 };
    qg_window_view v = tst_win_view(&s, &st, 500);
    assert_int_equal(v.used_milli, 0);
    assert_int_equal(v.reset_at_ms, 0);
    /* no session yet */
    assert_int_equal(tst_win_admit(&s, &st, 500, 5000), 500);
    tst_win_charge(&s, &st, 1000, 2000);
    v = tst_win_view(&s, &st, 10999);
    assert_int_equal(v.used_milli, 2000);
    assert_int_equal(v.remaining_milli, 3000);
    assert_int_equal(v.reset_at_ms, 11000);
    assert_int_equal(v.type, QG_WIN_SESSION);
    v = tst_win_view(&s, &st, 11000);                          /* closed */
    assert_int_equal(v.used_milli, 0);
    assert_int_equal(v.reset_at_ms, 0);
    /* the next session opens at the next charge, not at 11000 */
    tst_win_charge(&s, &st, 15000, 1000);
    assert_int_equal(tst_win_view(&s, &st, 15000).reset_at_ms, 25000);
    assert_int_equal(qg__win_bytes(&s, &st), 0);
    qg__win_free(&s, &st);
}

static void test_retry_exact(void **state)
{
    (void)state;
    qg_window_spec s = tst_sess_spec(5000, 10000);
    qg_win_state st = { 0 };
    tst_win_charge(&s, &st, 1000, 2000);
    assert_int_equal(tst_win_admit(&s, &st, 5000, 3000), 5000);
    int64_t t = tst_win_admit(&s, &st, 5000, 4000);
    assert_int_equal(t, 11000);
    assert_int_equal(tst_win_admit(&s, &st, t - 1, 4000), t);
    assert_int_equal(tst_win_admit(&s, &st, t, 4000), t);
    tst_win_charge(&s, &st, t, 4000);
    assert_int_equal(tst_win_view(&s, &st, t).used_milli, 4000);
    assert_int_equal(tst_win_view(&s, &st, t).reset_at_ms, t + 10000);
    qg__win_free(&s, &st);
}

static void test_never_and_zero(void **state)
{
    (void)state;
    qg_window_spec s = tst_sess_spec(5000, 10000);
    qg_win_state st = { 0 };
    assert_int_equal(tst_win_admit(&s, &st, 1000, 5001), QG_NEVER);
    tst_win_charge(&s, &st, 1000, 5000);
    assert_int_equal(tst_win_admit(&s, &st, 2000, 5001), QG_NEVER);
    assert_int_equal(tst_win_admit(&s, &st, 2000, 0), 2000);
    assert_int_equal(tst_win_admit(&s, &st, 2000, 1), 11000);
    qg__win_free(&s, &st);
}

static void test_adjust(void **state)
{
    (void)state;
    qg_window_spec s = tst_sess_spec(5000, 10000);
    qg_win_state st = { 0 };
    tst_win_charge(&s, &st, 1000, 2000);
    tst_win_adjust(&s, &st, 3000, 1000, 1500);
    assert_int_equal(tst_win_view(&s, &st, 3000).used_milli, 3500);
    tst_win_adjust(&s, &st, 3000, 1000, -99999);
    assert_int_equal(tst_win_view(&s, &st, 3000).used_milli, 0);
    tst_win_adjust(&s, &st, 3000, 1000, 9000);     /* may exceed the limit */
    assert_int_equal(tst_win_view(&s, &st, 3000).remaining_milli, 0);
    assert_int_equal(tst_win_admit(&s, &st, 3000, 1), 11000);
    tst_win_adjust(&s, &st, 3000, 500,
                   -9000);  /* before the session: ignored */
    assert_int_equal(tst_win_view(&s, &st, 3000).used_milli, 9000);
    /* after the session closed and a new one opened, an old charge's
     * settlement is ignored */
    tst_win_charge(&s, &st, 12000, 1000);
    tst_win_adjust(&s, &st, 12500, 1000, 3000);
    assert_int_equal(tst_win_view(&s, &st, 12500).used_milli, 1000);
    tst_win_adjust(&s, &st, 12500, 12000, 500);
    assert_int_equal(tst_win_view(&s, &st, 12500).used_milli, 1500);
    qg__win_free(&s, &st);
}

static void test_time_backwards(void **state)
{
    (void)state;
    qg_window_spec s = tst_sess_spec(5000, 10000);
    qg_win_state st = { 0 };
    tst_win_charge(&s, &st, 5000, 5000);
    assert_int_equal(tst_win_admit(&s, &st, 100, 1), 15000);
    assert_int_equal(tst_win_admit(&s, &st, 100, 0), 5000);  /* clamped now */
    assert_int_equal(tst_win_view(&s, &st, 100).used_milli, 5000);
    assert_int_equal(tst_win_view(&s, &st, 16000).used_milli, 0);
    /* once closed, an earlier instant does not reopen it */
    assert_int_equal(tst_win_view(&s, &st, 14000).used_milli, 0);
    tst_win_charge(&s, &st, 14000, 1000);   /* clamped to 16000: opens there */
    assert_int_equal(tst_win_view(&s, &st, 14000).reset_at_ms, 26000);
    qg__win_free(&s, &st);
}

static void test_recovery(void **state)
{
    (void)state;
    qg_window_spec s = tst_sess_spec(5000, 10000);
    qg_win_state st = { 0 };
    qg_win_ctx c = { .now_ms = 500 };
    qg_recovery_point p[4];
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 0);
    tst_win_charge(&s, &st, 1000, 4000);
    c.now_ms = 2000;
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 1);
    assert_int_equal(p[0].at_ms, 11000);
    assert_int_equal(p[0].remaining_milli, 5000);
    c.now_ms = 11000;
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 0);
    qg__win_free(&s, &st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opens_at_first_charge),
        cmocka_unit_test(test_retry_exact),
        cmocka_unit_test(test_never_and_zero),
        cmocka_unit_test(test_adjust),
        cmocka_unit_test(test_time_backwards),
        cmocka_unit_test(test_recovery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
