/* test_payg.c - the pay-as-you-go overage policy through the public engine
 * API (quotagate.h) with the memory store (docs/decisions.md, "Overage:
 * payg").
 *
 * Covers: a request beyond a lifted window is admitted and its overage
 * (the weight beyond the least room left in the lifted windows) priced,
 * rounded up; a settle reprices from the final charge (down to nothing
 * when the actual usage fits); rate windows, request-count windows and
 * concurrency are never lifted; a window whose own policy is reject still
 * refuses; org windows follow the plan's payg; the spending cap refuses
 * with cap_reached and an exact retry_after (when the lifted windows have
 * room again, or the cap period ends, whichever is first); the spent
 * amount resets with the cap period (the billing month when the subject
 * has an anchor); replays report the original overage; a rebuild from
 * ledger rows (qg_engine_restore) brings back the spent amount and lets a
 * restored reservation be repriced by its settle. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "quotagate.h"
#include "rules.h"
#include "ruletest.h"

#define MIN_MS 60000LL
#define HOUR_MS 3600000LL
#define DAY_MS 86400000LL
#define T_MS (1772409600000LL + 10 * HOUR_MS) /* 2026-03-02T10:00:00Z */
#define APRIL_MS 1775001600000LL               /* 2026-04-01T00:00:00Z */

static const char rules_text[] =
    "version: \"p1\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 1, output_per_1k: 1 }\n"
    "plans:\n"
    "  pay:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
    "      - { name: monthly, type: calendar, every: month, at: \"1 00:00\", tz: \"UTC\", limit: 100 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 20, unit: requests }\n"
    "    concurrency: 2\n"
    "    overage: { policy: payg, price_per_unit: 0.01, spending_cap: { usd_month: 0.5 } }\n"
    "  mixed:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10, overage: { policy: payg, price_per_unit: 0.02 } }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 15 }\n"
    "    overage: { policy: reject }\n"
    "  team:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
    "    overage: { policy: payg, price_per_unit: 0.001 }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_hourly, type: rolling, length: 1h, limit: 12 }\n"
    "subjects:\n"
    "  p1: { plan: pay }\n"
    "  p2: { plan: pay, billing_anchor: \"2026-01-15T12:00:00Z\" }\n"
    "  mx: { plan: mixed }\n"
    "  o1: { plan: team, org: acme }\n"
    "  o2: { plan: team, org: acme }\n";

typedef struct fixture {
    qg_store *store;
    qg_engine *eng;
} fixture;

static int setup(void **state)
{
    static fixture f;
    f.store = qg_store_memory_new(NULL);
    assert_non_null(f.store);
    f.eng = qg_engine_new(tst_rules_parse(rules_text), f.store);
    assert_non_null(f.eng);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    qg_engine_free(f->eng);
    qg_store_free(f->store);
    return 0;
}

/* A weight-only check of w points; returns the outcome. */
static int check_w(fixture *f, const char *subject, const char *rid,
                   int64_t points_milli, int64_t now, qg_decision *d)
{
    char err[256];
    qg_check_req req = {.subject = subject, .request_id = rid,
                        .weight_milli = points_milli};
    assert_int_equal(qg_engine_check(f->eng, &req, now, d, err, sizeof err),
                     QG_OK);
    return d->outcome;
}

static void settle_w(fixture *f, const char *rid, int64_t w, int64_t now,
                     qg_settle_result *res)
{
    char err[256];
    qg_settle_req req = {.request_id = rid, .status = QG_SETTLE_COMPLETED,
                         .weight_milli = w};
    assert_int_equal(qg_engine_settle(f->eng, &req, now, res, err,
                                      sizeof err), QG_OK);
}

static const qg_window_view *view_of(const qg_decision *d, const char *name)
{
    for (int i = 0; i < d->nviews; i++)
        if (strcmp(d->views[i].name, name) == 0)
            return &d->views[i];
    fail_msg("no window %s", name);
    return NULL;
}

static void test_overage_priced(void **state)
{
    fixture *f = *state;
    qg_decision d;
    qg_settle_result res;

    /* within the limits: lifted windows, no overage */
    assert_int_equal(check_w(f, "p1", "a1", 8000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.headroom_milli, 10000);
    assert_int_equal(d.overage_milli, 0);
    assert_int_equal(d.overage_cost_micro, 0);
    assert_int_equal(d.overage_price_micro, 10000);
    assert_int_equal(d.spending_cap_micro, 500000);
    assert_int_equal(d.cap_period_end_ms, APRIL_MS);
    settle_w(f, "a1", -1, T_MS + 1, &res);
    assert_int_equal(res.overage_milli, 0);

    /* 4 points with 2 left in burst: 2 points of overage at $0.01 */
    assert_int_equal(check_w(f, "p1", "a2", 4000, T_MS + 2, &d), QG_ALLOW);
    assert_int_equal(d.headroom_milli, 2000);
    assert_int_equal(d.overage_milli, 2000);
    assert_int_equal(d.overage_cost_micro, 20000);
    assert_int_equal(d.spent_micro, 20000);
    assert_int_equal(view_of(&d, "burst")->used_milli, 12000);
    assert_int_equal(view_of(&d, "burst")->remaining_milli, 0);

    /* a replay says the same and charges nothing */
    assert_int_equal(check_w(f, "p1", "a2", 4000, T_MS + 3, &d), QG_ALLOW);
    assert_true(d.replayed);
    assert_int_equal(d.overage_milli, 2000);
    assert_int_equal(d.overage_cost_micro, 20000);
    assert_int_equal(d.spent_micro, 20000);

    /* the settle reprices: 3.5 points used -> 1.5 of overage, $0.015 */
    settle_w(f, "a2", 3500, T_MS + 4, &res);
    assert_int_equal(res.charged_milli, 3500);
    assert_int_equal(res.overage_milli, 1500);
    assert_int_equal(res.overage_cost_micro, 15000);
    /* rounding is up, to the micro-dollar: 0.001 points at $0.01 */
    assert_int_equal(check_w(f, "p1", "a3", 1, T_MS + 5, &d), QG_ALLOW);
    assert_int_equal(d.overage_milli, 1);
    assert_int_equal(d.overage_cost_micro, 10);   /* 0.001 pt * 10000 */
    assert_int_equal(d.spent_micro, 15010);
    /* a settle that fits refunds the overage */
    settle_w(f, "a3", 0, T_MS + 6, &res);
    assert_int_equal(res.overage_milli, 0);
    assert_int_equal(res.overage_cost_micro, 0);
    {
        qg_decision u;
        assert_int_equal(qg_engine_usage(f->eng, "p1", T_MS + 7, &u), QG_OK);
        assert_int_equal(u.spent_micro, 15000);
        assert_int_equal(u.spending_cap_micro, 500000);
        assert_int_equal(u.cap_period_end_ms, APRIL_MS);
    }
}

static void test_cap(void **state)
{
    fixture *f = *state;
    qg_decision d;
    qg_settle_result res;
    char rid[32];

    /* fill burst (10), then 45 points of overage = $0.45 */
    assert_int_equal(check_w(f, "p1", "c0", 10000, T_MS, &d), QG_ALLOW);
    settle_w(f, "c0", -1, T_MS, &res);
    for (int i = 0; i < 9; i++) {
        snprintf(rid, sizeof rid, "c%d", i + 1);
        assert_int_equal(check_w(f, "p1", rid, 5000, T_MS + MIN_MS * i, &d),
                         QG_ALLOW);
        assert_int_equal(d.overage_cost_micro, 50000);
        settle_w(f, rid, -1, T_MS + MIN_MS * i, &res);
    }
    assert_int_equal(d.spent_micro, 450000);
    /* $0.05 left: 5 points fit, 6 do not */
    assert_int_equal(check_w(f, "p1", "c10", 6000, T_MS + 10 * MIN_MS, &d),
                     QG_REJECT);
    assert_true(d.cap_reached);
    assert_string_equal(d.views[d.binding].name, "burst");
    assert_int_equal(d.overage_milli, 6000);
    assert_int_equal(d.overage_cost_micro, 60000);
    assert_int_equal(d.spent_micro, 450000);
    /* burst has room for 6 points (used <= 4) only when c9 expires at
     * T + 8 min + 1 h; the cap period ends later */
    assert_int_equal(d.retry_after_ms, 58 * MIN_MS);
    /* 5 points cost $0.05: exactly the cap */
    assert_int_equal(check_w(f, "p1", "c11", 5000, T_MS + 10 * MIN_MS, &d),
                     QG_ALLOW);
    assert_int_equal(d.spent_micro, 500000);
    assert_int_equal(check_w(f, "p1", "c12", 1, T_MS + 10 * MIN_MS, &d),
                     QG_REJECT);
    assert_true(d.cap_reached);
    /* the next month starts afresh */
    assert_int_equal(check_w(f, "p1", "c13", 6000, APRIL_MS, &d), QG_ALLOW);
    assert_int_equal(d.spent_micro, d.overage_cost_micro);
    assert_int_equal(d.cap_period_end_ms, 1777593600000LL); /* May 1st */
}

static void test_cap_never(void **state)
{
    fixture *f = *state;
    qg_decision d;
    /* 70 points in an empty burst of 10: 60 of overage cost $0.60 > the
     * whole cap: never, with cap_reached */
    assert_int_equal(check_w(f, "p1", "n1", 70000, T_MS, &d),
                     QG_REJECT_NEVER);
    assert_true(d.cap_reached);
    /* 12 points: 2 of overage, admitted although burst alone could never
     * hold them */
    assert_int_equal(check_w(f, "p1", "n2", 12000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.overage_milli, 2000);
}

static void test_billing_month(void **state)
{
    fixture *f = *state;
    qg_decision d;
    /* p2's anchor is the 15th 12:00 UTC: the cap period runs to Mar 15 */
    assert_int_equal(check_w(f, "p2", "b1", 11000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.overage_cost_micro, 10000);
    assert_int_equal(d.cap_period_end_ms, 1773576000000LL);
    assert_int_equal(check_w(f, "p2", "b2", 1000, 1773576000000LL, &d),
                     QG_ALLOW);
    assert_int_equal(d.spent_micro, 0);   /* burst expired, new period */
}

static void test_hard_windows(void **state)
{
    fixture *f = *state;
    qg_decision d;
    char rid[32];

    /* the rate window (20 requests a minute) is never lifted */
    for (int i = 0; i < 20; i++) {
        qg_settle_result res;
        snprintf(rid, sizeof rid, "r%d", i);
        assert_int_equal(check_w(f, "p1", rid, 1, T_MS, &d), QG_ALLOW);
        settle_w(f, rid, -1, T_MS, &res);
    }
    assert_int_equal(check_w(f, "p1", "r20", 1, T_MS, &d), QG_REJECT);
    assert_false(d.cap_reached);
    assert_string_equal(d.views[d.binding].name, "rpm");
    assert_int_equal(d.retry_after_ms, 3000);
    /* a window's own policy: mx's burst is lifted (its own payg), daily
     * (the plan's reject) refuses */
    assert_int_equal(check_w(f, "mx", "m1", 14000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.overage_milli, 4000);
    assert_int_equal(d.overage_cost_micro, 80000);   /* $0.02 a point */
    assert_int_equal(check_w(f, "mx", "m2", 2000, T_MS, &d), QG_REJECT);
    assert_string_equal(d.views[d.binding].name, "daily");
    assert_false(d.cap_reached);
}

static void test_concurrency_not_lifted(void **state)
{
    fixture *f = *state;
    qg_decision d;
    /* p2 (concurrency 2): two unsettled reservations hold both slots */
    assert_int_equal(check_w(f, "p2", "k1", 11000, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_w(f, "p2", "k2", 1000, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_w(f, "p2", "k3", 1000, T_MS, &d), QG_REJECT);
    assert_false(d.cap_reached);
    assert_int_equal(d.views[d.binding].type, QG_WIN_CONCURRENCY);
}

static void test_org_inherits(void **state)
{
    fixture *f = *state;
    qg_decision d;
    /* team's payg lifts acme's org_hourly (no policy of its own) too */
    assert_int_equal(check_w(f, "o2", "g1", 9000, T_MS, &d), QG_ALLOW);
    /* o1: burst has 10, org_hourly 3 left: 5 points -> 2 of overage */
    assert_int_equal(check_w(f, "o1", "g2", 5000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.headroom_milli, 3000);
    assert_int_equal(d.overage_milli, 2000);
    assert_int_equal(d.overage_cost_micro, 2000);
    assert_int_equal(d.spending_cap_micro, 0);
    assert_int_equal(view_of(&d, "org_hourly")->used_milli, 14000);
}

static void test_restore(void **state)
{
    fixture *f = *state;
    char err[256];
    qg_decision d;
    qg_settle_result res;
    /* the ledger had: a settled request with $0.40 of overage this month,
     * one of last month (not counted), and an unsettled reservation of 5
     * points admitted with 1 point of room */
    qg_restore_req rows[] = {
        {.subject = "p1", .request_id = "old", .decided_at_ms = T_MS - 5 * DAY_MS,
         .reserved_milli = 50000, .charged_milli = 50000, .settled = 1,
         .status = QG_SETTLE_COMPLETED, .headroom_milli = 0,
         .overage_price_micro = 10000, .overage_cost_micro = 500000},
        {.subject = "p1", .request_id = "s1", .decided_at_ms = T_MS - 10 * MIN_MS,
         .reserved_milli = 49000, .charged_milli = 49000, .settled = 1,
         .status = QG_SETTLE_COMPLETED, .headroom_milli = 9000,
         .overage_price_micro = 10000, .overage_cost_micro = 400000},
        {.subject = "p1", .request_id = "u1", .decided_at_ms = T_MS - MIN_MS,
         .reserved_milli = 5000, .charged_milli = 5000, .settled = 0,
         .headroom_milli = 0, .overage_price_micro = 10000,
         .overage_cost_micro = 50000},
    };
    /* "old" is of February: move it there */
    rows[0].decided_at_ms = T_MS - 20 * DAY_MS;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        assert_int_equal(qg_engine_restore(f->eng, &rows[i], err, sizeof err),
                         QG_OK);
    /* $0.45 spent: 5 more points of overage fit, 6 do not */
    assert_int_equal(check_w(f, "p1", "x1", 6000, T_MS, &d), QG_REJECT);
    assert_true(d.cap_reached);
    assert_int_equal(d.spent_micro, 450000);
    /* the restored reservation settles at 2 points: $0.02, refunds $0.03 */
    settle_w(f, "u1", 2000, T_MS, &res);
    assert_int_equal(res.overage_milli, 2000);
    assert_int_equal(res.overage_cost_micro, 20000);
    assert_int_equal(check_w(f, "p1", "x2", 8000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.spent_micro, 500000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_overage_priced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_never, setup, teardown),
        cmocka_unit_test_setup_teardown(test_billing_month, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hard_windows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrency_not_lifted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_org_inherits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
