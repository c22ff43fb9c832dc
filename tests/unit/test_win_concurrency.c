/* test_win_concurrency.c - concurrency windows: slots as leases, expiry at
 * the lease instant, release, the hard cap on the lease array, views and
 * recovery. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "window.h"
#include "wintest.h"

static void test_slots_and_expiry(void **state)
{
    (void)state;
    qg_window_spec s = tst_conc_spec(2, 10000);
    qg_win_state st = { 0 };
    assert_int_equal(qg__win_amount(&s, 5555), 1000);
    assert_int_equal(tst_conc_admit(&s, &st, 1000), 1000);
    assert_int_equal(tst_conc_charge(&s, &st, 1000, 11), 0);
    assert_int_equal(tst_conc_admit(&s, &st, 2000), 2000);
    assert_int_equal(tst_conc_charge(&s, &st, 2000, 22), 0);
    assert_int_equal(tst_conc_admit(&s, &st, 3000), 11000);
    assert_int_equal(tst_conc_admit(&s, &st, 10999), 11000);
    assert_int_equal(tst_win_view(&s, &st, 10999).used_milli, 2000);
    /* lease 11 gone */
    assert_int_equal(tst_conc_admit(&s, &st, 11000), 11000);
    qg_window_view v = tst_win_view(&s, &st, 11000);
    assert_int_equal(v.used_milli, 1000);
    assert_int_equal(v.limit_milli, 2000);
    assert_int_equal(v.remaining_milli, 1000);
    assert_int_equal(v.reset_at_ms, 12000);
    assert_int_equal(v.unit, QG_UNIT_REQUESTS);
    assert_int_equal(v.type, QG_WIN_CONCURRENCY);
    v = tst_win_view(&s, &st, 12000);
    assert_int_equal(v.used_milli, 0);
    assert_int_equal(v.reset_at_ms, 0);
    qg__win_free(&s, &st);
}

static void test_release(void **state)
{
    (void)state;
    qg_window_spec s = tst_conc_spec(2, 10000);
    qg_win_state st = { 0 };
    tst_conc_charge(&s, &st, 1000, 11);
    tst_conc_charge(&s, &st, 1000, 22);
    assert_int_equal(tst_conc_admit(&s, &st, 1500), 11000);
    assert_int_equal(tst_conc_release(&s, &st, 1500, 22), 1);
    assert_int_equal(tst_conc_release(&s, &st, 1500, 22), 0);
    assert_int_equal(tst_conc_release(&s, &st, 1500, 99), 0);
    assert_int_equal(tst_conc_admit(&s, &st, 1500), 1500);
    assert_int_equal(tst_win_view(&s, &st, 1500).used_milli, 1000);
    /* an expired lease cannot be released */
    assert_int_equal(tst_conc_release(&s, &st, 11000, 11), 0);
    /* release is a no-op for other window types */
    qg_window_spec r = tst_conc_spec(2, 0);
    r.type = QG_WIN_SESSION;
    qg_win_state rs = { 0 };
    assert_int_equal(tst_conc_release(&r, &rs, 1, 11), 0);
    qg__win_free(&s, &st);
}

static void test_same_rid_refreshes(void **state)
{
    (void)state;
    qg_window_spec s = tst_conc_spec(2, 10000);
    qg_win_state st = { 0 };
    tst_conc_charge(&s, &st, 1000, 7);
    tst_conc_charge(&s, &st, 5000, 7);
    qg_window_view v = tst_win_view(&s, &st, 5000);
    assert_int_equal(v.used_milli, 1000);
    assert_int_equal(v.reset_at_ms, 15000);
    qg__win_free(&s, &st);
}

static void test_never_default_ttl(void **state)
{
    (void)state;
    qg_window_spec z = tst_conc_spec(0, 0);
    qg_win_state st = { 0 };
    assert_int_equal(tst_conc_admit(&z, &st, 1000), QG_NEVER);
    qg_win_ctx c = { .now_ms = 1000 };
    assert_int_equal(qg__win_admit_at(&z, &st, &c, 0), 1000);
    qg__win_free(&z, &st);

    qg_window_spec s = tst_conc_spec(1, 0);             /* ttl 15 min */
    tst_conc_charge(&s, &st, 1000, 1);
    assert_int_equal(tst_conc_admit(&s, &st, 1000), 1000 + 15 * 60 * 1000);
    qg__win_free(&s, &st);
}

static void test_hard_cap_and_bytes(void **state)
{
    (void)state;
    qg_window_spec s = tst_conc_spec(1, 10000);
    qg_win_state st = { 0 };
    int rc = 0, n = 0;
    /* forced charges beyond the slots: the array stops at slots + slack */
    while ((rc = tst_conc_charge(&s, &st, 1000, (uint64_t)n + 1)) == 0 &&
           n < 1000)
        n++;
    assert_int_equal(rc, QG_EFULL);
    assert_int_equal(n, 17);
    assert_int_equal(qg__win_bytes(&s, &st), st.u.conc.cap * sizeof(qg_lease));
    assert_true(st.u.conc.cap <= 17);
    /* with 17 leases on 1 slot, 17 must go: all expire at 11000 */
    assert_int_equal(tst_conc_admit(&s, &st, 2000), 11000);
    /* once they expire there is room again */
    assert_int_equal(tst_conc_charge(&s, &st, 11000, 999), 0);
    qg__win_free(&s, &st);
    assert_int_equal(qg__win_bytes(&s, &st), 0);
    assert_null(st.u.conc.leases);
}

static void test_overfull_and_recovery(void **state)
{
    (void)state;
    qg_window_spec s = tst_conc_spec(2, 10000);
    qg_win_state st = { 0 };
    qg_win_ctx c = { .now_ms = 3500 };
    qg_recovery_point p[4];
    qg_win_state empty = { 0 };
    assert_int_equal(qg__win_recovery(&s, &empty, &c, p, 4), 0);
    tst_conc_charge(&s, &st, 3000, 3);      /* out of order on purpose */
    tst_conc_charge(&s, &st, 1000, 1);      /* clamped to 3000 */
    tst_conc_charge(&s, &st, 3000, 2);
    /* all three expire at 13000 */
    assert_int_equal(tst_conc_admit(&s, &st, 3500), 13000);
    qg__win_free(&s, &st);

    tst_conc_charge(&s, &st, 1000, 1);
    tst_conc_charge(&s, &st, 2000, 2);
    tst_conc_charge(&s, &st, 3000, 3);      /* forced: 3 leases on 2 slots */
    /* two must go for one slot: the second expiry */
    assert_int_equal(tst_conc_admit(&s, &st, 3500), 12000);
    assert_int_equal(tst_conc_admit(&s, &st, 11999), 12000);
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 4), 2);
    assert_int_equal(p[0].at_ms, 12000);          /* 11000 frees nothing */
    assert_int_equal(p[0].remaining_milli, 1000);
    assert_int_equal(p[1].at_ms, 13000);
    assert_int_equal(p[1].remaining_milli, 2000);
    assert_int_equal(qg__win_recovery(&s, &st, &c, p, 1), 1);
    assert_int_equal(p[0].at_ms, 13000);
    assert_int_equal(p[0].remaining_milli, 2000);
    assert_int_equal(tst_conc_admit(&s, &st, 12000), 12000);
    qg__win_free(&s, &st);
}

static void test_time_backwards(void **state)
{
    (void)state;
    qg_window_spec s = tst_conc_spec(1, 10000);
    qg_win_state st = { 0 };
    tst_conc_charge(&s, &st, 5000, 1);
    assert_int_equal(tst_conc_admit(&s, &st, 1000), 15000);
    assert_int_equal(tst_win_view(&s, &st, 16000).used_milli, 0);
    tst_conc_charge(&s, &st, 2000, 2);      /* clamped to 16000 */
    assert_int_equal(tst_win_view(&s, &st, 2000).reset_at_ms, 26000);
    qg__win_free(&s, &st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_and_expiry),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_same_rid_refreshes),
        cmocka_unit_test(test_never_default_ttl),
        cmocka_unit_test(test_hard_cap_and_bytes),
        cmocka_unit_test(test_overfull_and_recovery),
        cmocka_unit_test(test_time_backwards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
