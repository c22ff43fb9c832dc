/* test_engine.c - decisions through the public engine API (quotagate.h),
 * with rules parsed from a string and the memory store.
 *
 * Covers what a caller relies on: the binding window is the one that stays
 * closed longest; retry_after is exact (admitted at now + retry_after,
 * refused a millisecond earlier); a request no window could hold is
 * QG_REJECT_NEVER; request ids are idempotent (replays charge nothing,
 * refusals are not remembered, another subject's id is QG_EINVAL); the
 * reserve/settle cycle (refunds, extra charges, cancelled and failed
 * requests, replayed and unknown settles, late settles after the lease
 * expired); the member + org decision is all or nothing; model-scoped
 * windows; a reservation table full of live reservations; usage views and
 * recovery schedules; versions over time (the version in force chosen by
 * each decision's instant, usage kept across versions by window name). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <cmocka.h>
#include "quotagate.h"
#include "rules.h"
#include "ruletest.h"
#include "sametest.h"

#define MIN_MS 60000LL
#define HOUR_MS 3600000LL
#define DAY_MS 86400000LL
#define MONDAY_MS 1772409600000LL      /* 2026-03-02T00:00:00Z, a Monday */
#define T_MS (MONDAY_MS + 10 * HOUR_MS) /* 10:00 that day */

static const char rules_text[] =
    "version: \"e1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 5 }\n"
    "plans:\n"
    "  basic:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 15 }\n"
    "    concurrency: 2\n"
    "    lease_ttl: 10m\n"
    "  big:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 100 }\n"
    "      - { name: weekly_large, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 20, models: [large] }\n"
    "  team:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 50 }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_hourly, type: rolling, length: 1h, limit: 30 }\n"
    "subjects:\n"
    "  alice: { plan: basic }\n"
    "  bob: { plan: big }\n"
    "  m1: { plan: team, org: acme }\n"
    "  m2: { plan: team, org: acme }\n"
    "default_plan: basic\n";

typedef struct fixture {
    qg_store *store;
    qg_engine *eng;
} fixture;

static fixture *fixture_new(const qg_memory_opts *mo)
{
    static fixture f;
    qg_rules *rules = tst_rules_parse(rules_text);

    f.store = qg_store_memory_new(mo);
    assert_non_null(f.store);
    f.eng = qg_engine_new(rules, f.store);
    assert_non_null(f.eng);
    return &f;
}

static int setup(void **state)
{
    *state = fixture_new(NULL);
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    qg_engine_free(f->eng);
    qg_store_free(f->store);
    return 0;
}

/* A weight-only check; returns the outcome (asserting rc 0). */
static qg_outcome check_w(fixture *f, const char *subject, const char *rid,
                          int64_t w, int64_t now, qg_decision *d)
{
    qg_check_req req = { .subject = subject, .request_id = rid,
                         .weight_milli = w };
    char err[200];
    int rc = qg_engine_check(f->eng, &req, now, d, err, sizeof err);
    if (rc != 0)
        fail_msg("check %s %s: rc %d %s", subject, rid, rc, err);
    return d->outcome;
}

static qg_outcome check_m(fixture *f, const char *subject, const char *rid,
                          const char *model, int64_t in, int64_t out,
                          int64_t now, qg_decision *d)
{
    qg_check_req req = { .subject = subject, .request_id = rid,
                         .model = model, .input_tokens = in,
                         .max_output_tokens = out };
    char err[200];
    int rc = qg_engine_check(f->eng, &req, now, d, err, sizeof err);
    if (rc != 0)
        fail_msg("check %s %s: rc %d %s", subject, rid, rc, err);
    return d->outcome;
}

static int settle_w(fixture *f, const char *rid, int64_t w, int64_t now,
                    qg_settle_result *res)
{
    qg_settle_req sr = { .request_id = rid, .status = QG_SETTLE_COMPLETED,
                         .weight_milli = w };
    return qg_engine_settle(f->eng, &sr, now, res, NULL, 0);
}

static int settle_t(fixture *f, const char *rid, qg_settle_status st,
                    int64_t in, int64_t out, int64_t now,
                    qg_settle_result *res)
{
    qg_settle_req sr = { .request_id = rid, .status = st,
                         .input_tokens = in, .output_tokens = out,
                         .weight_milli = -1 };
    return qg_engine_settle(f->eng, &sr, now, res, NULL, 0);
}

static const qg_window_view *view_of(const qg_decision *d, const char *name)
{
    for (int i = 0; i < d->nviews; i++)
        if (strcmp(d->views[i].name, name) == 0)
            return &d->views[i];
    fail_msg("no window %s", name);
    return NULL;
}

static int64_t used(fixture *f, const char *subject, const char *window,
                    int64_t now)
{
    static qg_decision d;
    assert_int_equal(qg_engine_usage(f->eng, subject, now, &d), 0);
    return view_of(&d, window)->used_milli;
}

static const char *binding(const qg_decision *d)
{
    return d->binding >= 0 ? d->views[d->binding].name : "-";
}

/* --------------------------------------------------------------- tests */

static void test_binding_longest_closed(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    int64_t now = T_MS + 1000, midnight = MONDAY_MS + DAY_MS;

    assert_int_equal(check_w(f, "alice", "b1", 10000, T_MS, &d), QG_ALLOW);
    /* 6 more: burst reopens at T + 1h, daily (10 + 6 > 15) only at
     * midnight: daily binds, and the retry is midnight. */
    assert_int_equal(check_w(f, "alice", "b2", 6000, now, &d), QG_REJECT);
    assert_string_equal(binding(&d), "daily");
    assert_int_equal(d.retry_after_ms, midnight - now);
    assert_int_equal(d.views[d.binding].org, 0);
    /* 4 more fit the day: only the burst binds. */
    assert_int_equal(check_w(f, "alice", "b3", 4000, now, &d), QG_REJECT);
    assert_string_equal(binding(&d), "burst");
    assert_int_equal(d.retry_after_ms, T_MS + HOUR_MS - now);
    /* Refusals carry a recovery schedule for the binding window. */
    assert_true(d.nrecovery[d.binding] >= 1);
    assert_int_equal(d.recovery[d.binding][d.nrecovery[d.binding] - 1].at_ms,
                     T_MS + HOUR_MS);
}

static void test_retry_exact(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    int64_t now = T_MS + 20 * MIN_MS, at;
    qg_settle_result res;

    assert_int_equal(check_w(f, "alice", "x1", 3000, T_MS, &d), QG_ALLOW);
    assert_int_equal(settle_w(f, "x1", -1, T_MS, &res), 0);
    assert_int_equal(check_w(f, "alice", "x2", 5000, T_MS + 10 * MIN_MS, &d),
                     QG_ALLOW);
    assert_int_equal(settle_w(f, "x2", -1, T_MS + 10 * MIN_MS, &res), 0);
    /* 8 used; 6 needs both charges gone: x2 leaves at T + 70 min. */
    assert_int_equal(check_w(f, "alice", "x3", 6000, now, &d), QG_REJECT);
    at = now + d.retry_after_ms;
    assert_int_equal(at, T_MS + 70 * MIN_MS);
    assert_int_equal(check_w(f, "alice", "x3", 6000, at - 1, &d), QG_REJECT);
    assert_string_equal(binding(&d), "burst");
    assert_int_equal(d.retry_after_ms, 1);
    assert_int_equal(check_w(f, "alice", "x3", 6000, at, &d), QG_ALLOW);
    assert_int_equal(d.replayed, 0);
}

static void test_not_retryable(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    assert_int_equal(check_w(f, "alice", "n1", 10001, T_MS, &d),
                     QG_REJECT_NEVER);
    assert_string_equal(binding(&d), "burst");
    assert_int_equal(d.retry_after_ms, 0);
    /* A window that can never hold it wins over one that only refuses
     * for now: the burst is full, weekly_large can never take 22. */
    assert_int_equal(check_w(f, "bob", "n2", 100000, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_m(f, "bob", "n3", "large", 0, 4000, T_MS, &d),
                     QG_REJECT_NEVER);   /* 2 + 20 = 22 > 20 points */
    assert_string_equal(binding(&d), "weekly_large");
    assert_int_equal(d.weight_milli, 22000);
}

static void test_idempotency(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    char err[200];

    assert_int_equal(check_w(f, "alice", "i1", 4000, T_MS, &d), QG_ALLOW);
    assert_int_equal(d.replayed, 0);
    /* The same id again, even with another weight: the original answer,
     * nothing charged. */
    assert_int_equal(check_w(f, "alice", "i1", 9000, T_MS + 5, &d), QG_ALLOW);
    assert_int_equal(d.replayed, 1);
    assert_int_equal(d.weight_milli, 4000);
    assert_int_equal(d.decided_at_ms, T_MS);
    assert_int_equal(used(f, "alice", "burst", T_MS + 5), 4000);
    assert_int_equal(used(f, "alice", "daily", T_MS + 5), 4000);
    /* Another subject with the same id is a client error. */
    qg_check_req req = { .subject = "bob", .request_id = "i1",
                         .weight_milli = 1000 };
    assert_int_equal(qg_engine_check(f->eng, &req, T_MS + 6, &d, err,
                                     sizeof err), QG_EINVAL);
    assert_int_equal(used(f, "bob", "burst", T_MS + 6), 0);
    /* A refusal is not remembered: the retry is decided afresh. */
    assert_int_equal(check_w(f, "alice", "i2", 7000, T_MS + 10, &d),
                     QG_REJECT);
    assert_int_equal(check_w(f, "alice", "i2", 7000, T_MS + 10 + d.retry_after_ms,
                             &d), QG_ALLOW);
    assert_int_equal(d.replayed, 0);
    /* A settle that names a subject must name the reservation's: another
     * subject's is refused and changes nothing. */
    {
        qg_settle_req sr = { .request_id = "i4",
                             .status = QG_SETTLE_COMPLETED,
                             .weight_milli = 1000, .subject = "alice" };
        qg_settle_result res;
        int64_t now = T_MS + 20;
        assert_int_equal(check_w(f, "bob", "i4", 4000, now, &d), QG_ALLOW);
        assert_int_equal(qg_engine_settle(f->eng, &sr, now, &res, err,
                                          sizeof err), QG_EINVAL);
        assert_non_null(strstr(err, "another subject"));
        assert_int_equal(used(f, "bob", "burst", now), 4000);
        sr.subject = "bob";
        assert_int_equal(qg_engine_settle(f->eng, &sr, now, &res, err,
                                          sizeof err), QG_OK);
        assert_int_equal(res.charged_milli, 1000);
        assert_int_equal(used(f, "bob", "burst", now), 1000);
    }
}

static void test_reserve_settle(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    qg_settle_result r;
    int64_t now = T_MS;

    /* light: 1 + 0.25/1k in + 1/1k out.  1000 in + 1000 out = 2.25. */
    assert_int_equal(check_m(f, "bob", "s1", "light", 1000, 1000, now, &d),
                     QG_ALLOW);
    assert_int_equal(d.weight_milli, 2250);
    assert_int_equal(used(f, "bob", "burst", now), 2250);
    /* Completed lower: refund. */
    assert_int_equal(settle_t(f, "s1", QG_SETTLE_COMPLETED, 1000, 200, now + 1,
                              &r), 0);
    assert_int_equal(r.replayed, 0);
    assert_int_equal(r.late, 0);
    assert_int_equal(r.reserved_milli, 2250);
    assert_int_equal(r.actual_milli, 1450);
    assert_int_equal(r.charged_milli, 1450);
    assert_int_equal(used(f, "bob", "burst", now + 1), 1450);
    /* Settled twice: the original result, nothing changes. */
    assert_int_equal(settle_t(f, "s1", QG_SETTLE_COMPLETED, 1000, 9000, now + 2,
                              &r), 0);
    assert_int_equal(r.replayed, 1);
    assert_int_equal(r.charged_milli, 1450);
    assert_int_equal(used(f, "bob", "burst", now + 2), 1450);
    /* Completed higher: the extra is charged. */
    assert_int_equal(check_m(f, "bob", "s2", "light", 1000, 1000, now + 3, &d),
                     QG_ALLOW);
    assert_int_equal(settle_t(f, "s2", QG_SETTLE_COMPLETED, 1000, 3000, now + 4,
                              &r), 0);
    assert_int_equal(r.charged_milli, 4250);
    assert_int_equal(used(f, "bob", "burst", now + 4), 1450 + 4250);
    /* Cancelled with partial output: what was produced counts. */
    assert_int_equal(check_m(f, "bob", "s3", "light", 0, 1000, now + 5, &d),
                     QG_ALLOW);
    assert_int_equal(d.weight_milli, 2000);
    assert_int_equal(settle_t(f, "s3", QG_SETTLE_CANCELLED, 0, 100, now + 6,
                              &r), 0);
    assert_int_equal(r.charged_milli, 1100);
    assert_int_equal(r.status, QG_SETTLE_CANCELLED);
    /* Failed without tokens: the base weight of the model. */
    assert_int_equal(check_m(f, "bob", "s4", "light", 400, 1000, now + 7, &d),
                     QG_ALLOW);
    assert_int_equal(settle_t(f, "s4", QG_SETTLE_FAILED, 0, 0, now + 8, &r), 0);
    assert_int_equal(r.charged_milli, 1000);
    assert_int_equal(used(f, "bob", "burst", now + 8),
                     1450 + 4250 + 1100 + 1000);
    /* no_charge (the upstream refused with 429): nothing counts */
    assert_int_equal(check_m(f, "bob", "s4b", "light", 400, 1000, now + 8, &d),
                     QG_ALLOW);
    {
        qg_settle_req sr = {.request_id = "s4b", .status = QG_SETTLE_FAILED,
                            .weight_milli = -1, .no_charge = 1};
        assert_int_equal(qg_engine_settle(f->eng, &sr, now + 8, &r, NULL, 0),
                         0);
    }
    assert_int_equal(r.charged_milli, 0);
    assert_int_equal(used(f, "bob", "burst", now + 8),
                     1450 + 4250 + 1100 + 1000);
    /* Unknown request id. */
    assert_int_equal(settle_w(f, "nobody", 1000, now + 9, &r), QG_ENOTFOUND);
    /* Settle after the lease expired (15 min default for a plan without
     * concurrency): late, the reservation is final, no refund... */
    assert_int_equal(check_w(f, "bob", "s5", 10000, now + 10, &d), QG_ALLOW);
    int64_t late_at = now + 10 + 15 * MIN_MS;
    int64_t before = used(f, "bob", "burst", late_at);
    assert_int_equal(settle_w(f, "s5", 2000, late_at, &r), 0);
    assert_int_equal(r.late, 1);
    assert_int_equal(r.charged_milli, 10000);
    assert_int_equal(used(f, "bob", "burst", late_at), before);
    /* ...but a larger actual is still charged. */
    assert_int_equal(check_w(f, "bob", "s6", 1000, late_at, &d), QG_ALLOW);
    assert_int_equal(settle_w(f, "s6", 3000, late_at + 15 * MIN_MS, &r), 0);
    assert_int_equal(r.late, 1);
    assert_int_equal(r.charged_milli, 3000);
    assert_int_equal(used(f, "bob", "burst", late_at + 15 * MIN_MS),
                     before + 3000);
}

static void test_concurrency_leases(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    qg_settle_result r;

    assert_int_equal(check_w(f, "alice", "c1", 1000, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_w(f, "alice", "c2", 1000, T_MS + 1000, &d),
                     QG_ALLOW);
    assert_int_equal(view_of(&d, "concurrency")->used_milli, 2000);
    assert_int_equal(check_w(f, "alice", "c3", 1000, T_MS + 2000, &d),
                     QG_REJECT);
    assert_string_equal(binding(&d), "concurrency");
    /* The first lease expires at T + 10 min (lease_ttl). */
    assert_int_equal(d.retry_after_ms, 10 * MIN_MS - 2000);
    /* A settle frees the slot at once. */
    assert_int_equal(settle_w(f, "c1", -1, T_MS + 3000, &r), 0);
    assert_int_equal(check_w(f, "alice", "c3", 1000, T_MS + 3000, &d),
                     QG_ALLOW);
}

static void test_org_all_or_nothing(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    char rid[16];

    for (int i = 0; i < 3; i++) {
        snprintf(rid, sizeof rid, "o%d", i);
        assert_int_equal(check_w(f, "m1", rid, 10000, T_MS + i, &d), QG_ALLOW);
    }
    assert_int_equal(view_of(&d, "org_hourly")->used_milli, 30000);
    assert_int_equal(view_of(&d, "org_hourly")->org, 1);
    /* m2's own burst admits; the org refuses: nothing is charged. */
    assert_int_equal(check_w(f, "m2", "o9", 5000, T_MS + 100, &d), QG_REJECT);
    assert_string_equal(binding(&d), "org_hourly");
    assert_int_equal(d.views[d.binding].org, 1);
    assert_string_equal(d.org, "acme");
    assert_int_equal(d.retry_after_ms, HOUR_MS - 100);   /* o0 leaves */
    assert_int_equal(used(f, "m2", "burst", T_MS + 100), 0);
    assert_int_equal(used(f, "m2", "org_hourly", T_MS + 100), 30000);
    /* And the retry instant holds for the org too. */
    assert_int_equal(check_w(f, "m2", "o9", 5000, T_MS + HOUR_MS - 1, &d),
                     QG_REJECT);
    assert_int_equal(check_w(f, "m2", "o9", 5000, T_MS + HOUR_MS, &d),
                     QG_ALLOW);
    assert_int_equal(used(f, "m2", "burst", T_MS + HOUR_MS), 5000);
    assert_int_equal(used(f, "m1", "org_hourly", T_MS + HOUR_MS), 25000);
}

static void test_model_scoped(void **state)
{
    fixture *f = *state;
    static qg_decision d;

    /* light requests do not count in weekly_large. */
    assert_int_equal(check_m(f, "bob", "l1", "light", 0, 5000, T_MS, &d),
                     QG_ALLOW);
    assert_int_equal(d.weight_milli, 6000);
    assert_int_equal(view_of(&d, "weekly_large")->used_milli, 0);
    assert_int_equal(view_of(&d, "burst")->used_milli, 6000);
    /* large ones do: 2 + 10 = 12 points. */
    assert_int_equal(check_m(f, "bob", "g1", "large", 0, 2000, T_MS + 1, &d),
                     QG_ALLOW);
    assert_int_equal(view_of(&d, "weekly_large")->used_milli, 12000);
    /* Another 12 on large: refused until next Monday; light still fine. */
    assert_int_equal(check_m(f, "bob", "g2", "large", 0, 2000, T_MS + 2, &d),
                     QG_REJECT);
    assert_string_equal(binding(&d), "weekly_large");
    assert_int_equal(d.retry_after_ms, MONDAY_MS + 7 * DAY_MS - (T_MS + 2));
    assert_string_equal(d.model, "large");
    assert_int_equal(check_m(f, "bob", "l2", "light", 0, 5000, T_MS + 3, &d),
                     QG_ALLOW);
    assert_int_equal(view_of(&d, "weekly_large")->used_milli, 12000);
    /* A weight-only check is no model's: the scoped window ignores it. */
    assert_int_equal(check_w(f, "bob", "w1", 50000, T_MS + 4, &d), QG_ALLOW);
    assert_int_equal(view_of(&d, "weekly_large")->used_milli, 12000);
}

static void test_reservations_full(void **state)
{
    (void)state;
    qg_memory_opts mo = { .shards = 1, .max_reservations = 3 };
    fixture *f = fixture_new(&mo);
    static qg_decision d;
    qg_settle_result r;
    qg_check_req req = { .subject = "bob", .request_id = "f4",
                         .weight_milli = 1000 };
    char err[200] = "";

    assert_int_equal(check_w(f, "bob", "f1", 1000, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_w(f, "bob", "f2", 1000, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_w(f, "bob", "f3", 1000, T_MS, &d), QG_ALLOW);
    assert_int_equal(qg_engine_check(f->eng, &req, T_MS + 1, &d, err,
                                     sizeof err), QG_EFULL);
    assert_true(strlen(err) > 0);
    assert_int_equal(used(f, "bob", "burst", T_MS + 1), 3000);
    /* Replays of remembered ids still answer. */
    assert_int_equal(check_w(f, "bob", "f2", 1000, T_MS + 1, &d), QG_ALLOW);
    assert_int_equal(d.replayed, 1);
    /* Settling the oldest makes room (it may be forgotten). */
    assert_int_equal(settle_w(f, "f1", -1, T_MS + 2, &r), 0);
    assert_int_equal(qg_engine_check(f->eng, &req, T_MS + 3, &d, err,
                                     sizeof err), QG_OK);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* Reservations whose lease expired make room too. */
    req.request_id = "f5";
    assert_int_equal(qg_engine_check(f->eng, &req, T_MS + 4, &d, err,
                                     sizeof err), QG_EFULL);
    assert_int_equal(qg_engine_check(f->eng, &req, T_MS + 15 * MIN_MS, &d,
                                     err, sizeof err), QG_OK);
    qg_store_stats st;
    qg_store_stats_get(f->store, &st);
    assert_string_equal(st.backend, "memory");
    assert_true(st.reservations <= 3);
    assert_true(st.bytes > 0);
    qg_engine_free(f->eng);
    qg_store_free(f->store);
}

/* The default shard count keeps a small bound whole: 90 ids (under the
 * 1,024 a shard keeps at least) in one shard, so 90 live reservations of
 * 1 point each are admitted wherever their ids hash, and the 91st is
 * refused as full (with 64 shards of 1 id, the second id to land in a
 * shard was refused). */
static void test_reservations_small_bound(void **state)
{
    (void)state;
    enum { MAX = 90 };
    qg_memory_opts mo = { .max_reservations = MAX };
    fixture *f = fixture_new(&mo);
    static qg_decision d;
    qg_check_req req = { .subject = "bob", .request_id = "sb-full",
                         .weight_milli = 1000 };
    char rid[32], err[200] = "";

    for (int i = 0; i < MAX; i++) {
        snprintf(rid, sizeof rid, "sb-%d", i);
        assert_int_equal(check_w(f, "bob", rid, 1000, T_MS + i, &d),
                         QG_ALLOW);
    }
    assert_int_equal(qg_engine_check(f->eng, &req, T_MS + MAX, &d, err,
                                     sizeof err), QG_EFULL);
    qg_store_stats st;
    qg_store_stats_get(f->store, &st);
    assert_int_equal(st.reservations_live, MAX);
    qg_engine_free(f->eng);
    qg_store_free(f->store);
}

/* The request-id table under churn: one shard of 64 ids, 20000 steps of
 * new ids (checked and settled) and replays of recent ones, against a
 * plain list of the ids the table should still hold (the newest 64, all
 * settled, so the oldest is forgotten first).  A replay answers from the
 * table exactly when the id is in the list; a forgotten id is a new
 * request again.  Wraps the ring hundreds of times and deletes from every
 * position of the index's probe runs. */
static void test_reservations_churn(void **state)
{
    (void)state;
    enum { MAX = 64, STEPS = 20000 };
    qg_memory_opts mo = { .shards = 1, .max_reservations = MAX };
    fixture *f = fixture_new(&mo);
    static qg_decision d;
    qg_settle_result r;
    int held[MAX], nheld = 0, next = 0;
    uint64_t x = 88172645463325252ull;
    char rid[32];

    for (int step = 0; step < STEPS; step++) {
        int id, in_table = 0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (x % 10 < 6 || next < 100)
            id = next++;
        else
            id = next - 1 - (int)((x >> 8) % 100);   /* one of the last 100 */
        for (int i = 0; i < nheld; i++)
            if (held[i] == id)
                in_table = 1;
        snprintf(rid, sizeof rid, "churn-%d", id);
        assert_int_equal(check_w(f, "bob", rid, 1, T_MS + step, &d), QG_ALLOW);
        if (d.replayed != in_table)
            fail_msg("step %d id %d: replayed %d, expected %d", step, id,
                     d.replayed, in_table);
        if (in_table)
            continue;
        assert_int_equal(settle_w(f, rid, 1, T_MS + step, &r), 0);
        if (nheld == MAX) {                /* the oldest is forgotten */
            memmove(held, held + 1, (MAX - 1) * sizeof *held);
            nheld--;
        }
        held[nheld++] = id;
    }
    qg_store_stats st;
    qg_store_stats_get(f->store, &st);
    assert_int_equal(st.reservations, MAX);
    assert_int_equal(st.reservations_live, 0);
    qg_engine_free(f->eng);
    qg_store_free(f->store);
}

static void test_usage_and_recovery(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    int64_t now = T_MS + 20 * MIN_MS;

    assert_int_equal(check_m(f, "bob", "u1", "large", 0, 200, T_MS, &d),
                     QG_ALLOW);                          /* 3 points */
    assert_int_equal(check_w(f, "bob", "u2", 2000, T_MS + 10 * MIN_MS, &d),
                     QG_ALLOW);
    assert_int_equal(qg_engine_usage(f->eng, "bob", now, &d), 0);
    assert_int_equal(d.outcome, QG_NONE);
    assert_int_equal(d.binding, -1);
    assert_string_equal(d.plan, "big");
    assert_null(d.org);
    assert_string_equal(d.rules_version, "e1");
    assert_string_equal(d.weights_version, "w1");
    assert_int_equal(d.nviews, 2);

    const qg_window_view *b = view_of(&d, "burst");
    int bi = (int)(b - d.views);
    assert_int_equal(b->type, QG_WIN_ROLLING);
    assert_int_equal(b->limit_milli, 100000);
    assert_int_equal(b->used_milli, 5000);
    assert_int_equal(b->remaining_milli, 95000);
    assert_int_equal(b->reset_at_ms, T_MS + 5 * HOUR_MS);
    assert_int_equal(d.nrecovery[bi], 2);
    assert_int_equal(d.recovery[bi][0].at_ms, T_MS + 5 * HOUR_MS);
    assert_int_equal(d.recovery[bi][0].remaining_milli, 98000);
    assert_int_equal(d.recovery[bi][1].at_ms, T_MS + 5 * HOUR_MS + 10 * MIN_MS);
    assert_int_equal(d.recovery[bi][1].remaining_milli, 100000);

    const qg_window_view *w = view_of(&d, "weekly_large");
    int wi = (int)(w - d.views);
    assert_int_equal(w->type, QG_WIN_CALENDAR);
    assert_int_equal(w->used_milli, 3000);
    assert_int_equal(w->remaining_milli, 17000);
    assert_int_equal(w->reset_at_ms, MONDAY_MS + 7 * DAY_MS);
    assert_int_equal(d.nrecovery[wi], 1);
    assert_int_equal(d.recovery[wi][0].at_ms, MONDAY_MS + 7 * DAY_MS);
    assert_int_equal(d.recovery[wi][0].remaining_milli, 20000);

    /* Unknown subjects: the default plan; no recovery when nothing used. */
    assert_int_equal(qg_engine_usage(f->eng, "stranger", now, &d), 0);
    assert_string_equal(d.plan, "basic");
    assert_int_equal(d.nviews, 3);
    for (int i = 0; i < d.nviews; i++) {
        assert_int_equal(d.views[i].used_milli, 0);
        assert_int_equal(d.nrecovery[i], 0);
    }
    assert_int_equal(view_of(&d, "concurrency")->limit_milli, 2000);
}

/* A reservation of weight 0 settled with a positive actual weight: the
 * usage happened at t0 and must count in every weight window, as a
 * reservation of any other size does. */
static void test_settle_after_zero_reservation(void **state)
{
    fixture *f = *state;
    static qg_decision d;
    qg_settle_result r;

    assert_int_equal(check_w(f, "alice", "z1", 0, T_MS, &d), QG_ALLOW);
    assert_int_equal(settle_w(f, "z1", 8000, T_MS + 1, &r), 0);
    assert_int_equal(r.charged_milli, 8000);
    assert_int_equal(used(f, "alice", "daily", T_MS + 2), 8000);
    assert_int_equal(used(f, "alice", "burst", T_MS + 2), 8000);
    /* 8 + 5 > 10 in the burst window. */
    assert_int_equal(check_w(f, "alice", "z2", 5000, T_MS + 2, &d), QG_REJECT);
    assert_string_equal(binding(&d), "burst");
}

/* Versions over time: a rules file of two documents, v2 (effective at
 * T_MS + 1h) lowering burst from 10 to 6, adding plan `solo` and
 * dropping plan `old`.  The engine picks the version by each decision's
 * instant on a virtual clock: no reload happens. */
static const char versions_text[] =
    "version: \"v1\"\n"
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
    "  models:\n    light: { per_request: 1 }\n"
    "plans:\n"
    "  basic:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 10 }\n"
    "  old:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 10 }\n"
    "subjects:\n  alice: { plan: basic }\n  olga: { plan: old }\n"
    "default_plan: basic\n"
    "---\n"
    "version: \"v2\"\n"
    "effective: \"2026-03-02T11:00:00Z\"\n"
    "announced: \"2026-01-01T00:00:00Z\"\n"
    "changes: \"basic: burst lowered from 10 to 6\"\n"
    "weights:\n  version: \"w2\"\n  calibrated: \"2026-01-01\"\n"
    "  models:\n    light: { per_request: 1 }\n"
    "plans:\n"
    "  basic:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 6 }\n"
    "  solo:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 2 }\n"
    "subjects:\n  alice: { plan: basic }\n  sam: { plan: solo }\n"
    "default_plan: basic\n";

static void test_versions_by_instant(void **state)
{
    fixture f;
    qg_decision d;
    char err[256], rid[32];
    const int64_t eff = T_MS + HOUR_MS;   /* 2026-03-02T11:00:00Z */
    qg_check_req req = { .subject = "sam", .request_id = "s1",
                         .weight_milli = 1000 };
    int i;
    (void)state;

    f.store = qg_store_memory_new(NULL);
    assert_non_null(f.store);
    f.eng = qg_engine_new(tst_rules_parse(versions_text), f.store);
    assert_non_null(f.eng);
    assert_string_equal(qg_rules_version(qg_engine_rules_at(f.eng, eff - 1)),
                        "v1");
    assert_string_equal(qg_rules_version(qg_engine_rules_at(f.eng, eff)),
                        "v2");
    /* before the instant: v1's limit 10 decides; 7 points admitted */
    for (i = 0; i < 7; i++) {
        snprintf(rid, sizeof rid, "a%d", i);
        assert_int_equal(check_w(&f, "alice", rid, 1000, eff - 7 + i, &d),
                         QG_ALLOW);
        assert_string_equal(d.rules_version, "v1");
        assert_string_equal(d.weights_version, "w1");
        assert_true(view_of(&d, "burst")->limit_milli == 10000);
    }
    /* a millisecond before it, still v1 and room under 10 */
    assert_int_equal(check_w(&f, "alice", "a7", 1000, eff - 1, &d), QG_ALLOW);
    assert_string_equal(d.rules_version, "v1");
    /* at the instant: v2's 6, and the 8 points already used count (the
     * same window by name): refused, and the row would say v2 */
    assert_int_equal(check_w(&f, "alice", "a8", 1000, eff, &d), QG_REJECT);
    assert_string_equal(d.rules_version, "v2");
    assert_string_equal(d.weights_version, "w2");
    assert_string_equal(binding(&d), "burst");
    assert_true(view_of(&d, "burst")->limit_milli == 6000);
    assert_true(view_of(&d, "burst")->used_milli == 8000);
    /* usage follows the instant too */
    assert_true(used(&f, "alice", "burst", eff - 1) == 8000);
    assert_int_equal(qg_engine_usage(f.eng, "alice", eff - 1, &d), 0);
    assert_string_equal(d.rules_version, "v1");
    assert_true(view_of(&d, "burst")->limit_milli == 10000);
    /* a plan only v2 has: refused before it exists, decided after */
    assert_int_equal(qg_engine_check(f.eng, &req, eff - 1, &d, err,
                                     sizeof err), QG_EINVAL);
    assert_non_null(strstr(err, "plan \"solo\" of subject \"sam\" is not in "
                           "rules version \"v1\""));
    assert_int_equal(check_w(&f, "sam", "s1", 1000, eff, &d), QG_ALLOW);
    assert_string_equal(d.plan, "solo");
    /* a plan v2 dropped: decided before, refused after */
    assert_int_equal(check_w(&f, "olga", "o1", 1000, eff - 1, &d), QG_ALLOW);
    req.subject = "olga";
    req.request_id = "o2";
    assert_int_equal(qg_engine_check(f.eng, &req, eff, &d, err, sizeof err),
                     QG_EINVAL);
    assert_non_null(strstr(err, "rules version \"v2\""));
    /* an unknown subject takes the default plan of the version in force */
    assert_int_equal(check_w(&f, "newbie", "n1", 1000, eff, &d), QG_ALLOW);
    assert_string_equal(d.rules_version, "v2");
    assert_true(view_of(&d, "burst")->limit_milli == 6000);
    /* set_subject accepts a plan of any version */
    assert_int_equal(qg_engine_set_subject(f.eng, "carl", "solo", NULL, 0,
                                           err, sizeof err), 0);
    assert_int_equal(qg_engine_set_subject(f.eng, "carl", "nope", NULL, 0,
                                           err, sizeof err), QG_EINVAL);
    qg_engine_free(f.eng);
    qg_store_free(f.store);
}

/* Orgs across versions: v1 has acme and beta, v2 gamma and acme, in
 * another order (acme is index 0 in one, 1 in the other).  A member of
 * acme shares one pool across the instant (the pool is the org's, by
 * name); each version's limit decides; set_subject takes an org of any
 * version, and a reload keeps every member in its org. */
static const char org_versions_text[] =
    "version: \"v1\"\n"
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
    "  models:\n    light: { per_request: 1 }\n"
    "plans:\n  team:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 100 }\n"
    "orgs:\n"
    "  acme:\n    windows:\n"
    "      - { name: pool, type: rolling, length: 5h, limit: 10 }\n"
    "  beta:\n    windows:\n"
    "      - { name: pool, type: rolling, length: 5h, limit: 5 }\n"
    "subjects:\n  m1: { plan: team, org: acme }\n"
    "  m2: { plan: team, org: acme }\n  b1: { plan: team, org: beta }\n"
    "default_plan: team\n"
    "---\n"
    "version: \"v2\"\n"
    "effective: \"2026-03-02T11:00:00Z\"\n"
    "announced: \"2026-01-01T00:00:00Z\"\n"
    "changes: \"acme: pool lowered from 10 to 8; gamma added\"\n"
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
    "  models:\n    light: { per_request: 1 }\n"
    "plans:\n  team:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 100 }\n"
    "orgs:\n"
    "  gamma:\n    windows:\n"
    "      - { name: pool, type: rolling, length: 5h, limit: 3 }\n"
    "  acme:\n    windows:\n"
    "      - { name: pool, type: rolling, length: 5h, limit: 8 }\n"
    "subjects:\n  m1: { plan: team, org: acme }\n"
    "  m2: { plan: team, org: acme }\n  g1: { plan: team, org: gamma }\n"
    "default_plan: team\n";

static void test_org_versions(void **state)
{
    fixture f;
    qg_decision d;
    char err[256], rid[32];
    const int64_t eff = T_MS + HOUR_MS;
    int i;
    (void)state;

    f.store = qg_store_memory_new(NULL);
    assert_non_null(f.store);
    f.eng = qg_engine_new(tst_rules_parse(org_versions_text), f.store);
    assert_non_null(f.eng);
    /* v1: m1 and m2 fill 8 of acme's 10; b1 takes beta's pool */
    for (i = 0; i < 8; i++) {
        snprintf(rid, sizeof rid, "a%d", i);
        assert_int_equal(check_w(&f, i % 2 ? "m2" : "m1", rid, 1000,
                                 eff - 20 + i, &d), QG_ALLOW);
        assert_string_equal(d.org, "acme");
        assert_true(view_of(&d, "pool")->limit_milli == 10000);
    }
    assert_int_equal(check_w(&f, "b1", "b0", 1000, eff - 5, &d), QG_ALLOW);
    assert_string_equal(d.org, "beta");
    assert_true(view_of(&d, "pool")->limit_milli == 5000);
    assert_true(view_of(&d, "pool")->used_milli == 1000);
    /* v2: acme's 8 are used, its limit is 8 now: refused by the pool */
    assert_int_equal(check_w(&f, "m1", "a8", 1000, eff, &d), QG_REJECT);
    assert_string_equal(binding(&d), "pool");
    assert_string_equal(d.org, "acme");
    assert_true(view_of(&d, "pool")->limit_milli == 8000);
    assert_true(view_of(&d, "pool")->used_milli == 8000);
    /* gamma, only in v2, has its own pool of 3 */
    for (i = 0; i < 3; i++) {
        snprintf(rid, sizeof rid, "g%d", i);
        assert_int_equal(check_w(&f, "g1", rid, 1000, eff + i, &d),
                         QG_ALLOW);
        assert_string_equal(d.org, "gamma");
    }
    assert_int_equal(check_w(&f, "g1", "g3", 1000, eff + 3, &d), QG_REJECT);
    assert_true(view_of(&d, "pool")->used_milli == 3000);
    /* set_subject: an org of either version, not an unknown one */
    assert_int_equal(qg_engine_set_subject(f.eng, "n1", "team", "gamma", 0,
                                           err, sizeof err), 0);
    assert_int_equal(qg_engine_set_subject(f.eng, "n2", "team", "beta", 0,
                                           err, sizeof err), 0);
    assert_int_equal(qg_engine_set_subject(f.eng, "n3", "team", "nope", 0,
                                           err, sizeof err), QG_EINVAL);
    assert_non_null(strstr(err, "nope"));
    assert_int_equal(check_w(&f, "n1", "n1a", 1000, eff + 4, &d), QG_REJECT);
    assert_string_equal(d.org, "gamma");
    /* a reload with the same versions keeps every member in its org */
    assert_int_equal(qg_engine_reload(f.eng, tst_rules_parse(
                         org_versions_text), err, sizeof err), 0);
    assert_int_equal(check_w(&f, "m2", "a9", 1000, eff + 5, &d), QG_REJECT);
    assert_string_equal(d.org, "acme");
    assert_true(view_of(&d, "pool")->used_milli == 8000);
    assert_int_equal(check_w(&f, "n1", "n1b", 1000, eff + 6, &d), QG_REJECT);
    assert_string_equal(d.org, "gamma");
    qg_engine_free(f.eng);
    qg_store_free(f.store);
}

/* A single version whose effective instant is ahead: never enforced
 * early; decisions are refused with the reason until it takes effect. */
static void test_version_not_yet(void **state)
{
    fixture f;
    qg_decision d;
    char err[256];
    qg_check_req req = { .subject = "alice", .request_id = "r1",
                         .weight_milli = 1000 };
    static const char text[] =
        "version: \"later\"\n"
        "effective: \"2026-03-02T11:00:00Z\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    light: { per_request: 1 }\n"
        "plans:\n  basic:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 5h, limit: 3 }\n"
        "default_plan: basic\n";
    (void)state;
    f.store = qg_store_memory_new(NULL);
    f.eng = qg_engine_new(tst_rules_parse(text), f.store);
    assert_non_null(f.eng);
    assert_int_equal(qg_engine_check(f.eng, &req, T_MS, &d, err, sizeof err),
                     QG_EINVAL);
    assert_non_null(strstr(err, "no rules version is in force yet: the "
                           "first, \"later\", takes effect at "
                           "2026-03-02T11:00:00Z"));
    assert_int_equal(qg_engine_usage(f.eng, "alice", T_MS, &d), QG_EINVAL);
    assert_int_equal(qg_engine_check(f.eng, &req, T_MS + HOUR_MS, &d, err,
                                     sizeof err), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_string_equal(d.rules_version, "later");
    qg_engine_free(f.eng);
    qg_store_free(f.store);
}

/* VmRSS of this process in kB, from /proc/self/status. */
static long rss_kb(void)
{
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* .prefault makes the reservation memory (76 MB for the default 2^19
 * request ids) resident when the store is made, as serve asks, so that
 * decisions never fault it in; without it the memory stays untouched
 * until used.  A store made either way decides the same. */
static void test_prefault(void **state)
{
    qg_memory_opts lazy = {.max_reservations = 1u << 19}, eager = lazy;
    qg_store *a, *b;
    long r0, r1, r2;
    (void)state;
    eager.prefault = 1;
    r0 = rss_kb();
    a = qg_store_memory_new(&lazy);
    r1 = rss_kb();
    b = qg_store_memory_new(&eager);
    r2 = rss_kb();
    assert_non_null(a);
    assert_non_null(b);
    if (r1 - r0 >= 16 * 1024)
        fail_msg("a lazy store made %ld kB resident", r1 - r0);
    if (r2 - r1 < 70 * 1024)
        fail_msg("a prefaulted store made only %ld kB resident", r2 - r1);
    for (int k = 0; k < 2; k++) {
        fixture f = {k ? b : a, NULL};
        qg_decision d;
        f.eng = qg_engine_new(tst_rules_parse(rules_text), f.store);
        assert_non_null(f.eng);
        assert_int_equal(check_w(&f, "alice", "pf-1", 1000, T_MS, &d),
                         QG_ALLOW);
        qg_engine_free(f.eng);
    }
    qg_store_free(a);
    qg_store_free(b);
}

/* qg_engine_check_many decides as qg_engine_check does, one request
 * after the other: two engines on the same rules take the same stream,
 * one in batches (of 0 to 40 requests: up to ten of the engine's groups
 * of 4), the other one by one, and every answer must match:
 * fresh ids, replays (of earlier batches and inside one), another
 * subject's id, unknown subjects on the default plan, bad requests (no
 * subject, an empty id, an unknown model), refusals, settles between the
 * batches. */
static unsigned long many_rnd(unsigned long *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void test_check_many(void **state)
{
    static const char *subjects[] = {"alice", "bob", "m1", "m2", "zed",
                                     "yan", NULL};
    static const char *models[] = {NULL, "light", "large", "nope"};
    static qg_decision dm[40], d1;
    qg_check_req req[40];
    char rid[40][24];
    int rcs[40];
    qg_store *s1 = qg_store_memory_new(NULL), *s2 = qg_store_memory_new(NULL);
    qg_engine *many = qg_engine_new(tst_rules_parse(rules_text), s1);
    qg_engine *one = qg_engine_new(tst_rules_parse(rules_text), s2);
    unsigned long x = 0x9e3779b97f4a7c15UL;
    long next_id = 0, seen[6] = {0};
    int64_t now = T_MS;
    (void)state;
    assert_non_null(many);
    assert_non_null(one);
    assert_int_equal(qg_engine_check_many(many, 0, req, now, dm, rcs), 0);
    for (int round = 0; round < 300; round++) {
        int n = (int)(many_rnd(&x) % 41), bad;
        now += (int64_t)(many_rnd(&x) % (3 * MIN_MS));
        for (int i = 0; i < n; i++) {
            unsigned long r = many_rnd(&x);
            long id = next_id++;
            if (r % 4 == 0 && id > 0)
                id = (long)(many_rnd(&x) % (unsigned long)id);  /* replay */
            snprintf(rid[i], sizeof rid[i], "m-%ld", id);
            memset(&req[i], 0, sizeof req[i]);
            req[i].subject = subjects[r / 8 % 7];
            req[i].request_id = r / 64 % 50 == 0 ? "" : rid[i];
            req[i].model = models[r / 4096 % 4 == 3 && r % 5 ? 0 :
                                  r / 4096 % 4];
            if (req[i].model) {
                req[i].input_tokens = (int64_t)(r >> 20 & 4095);
                req[i].max_output_tokens = (int64_t)(r >> 32 & 2047);
            } else
                req[i].weight_milli = (int64_t)(r >> 24 & 7) * 1000 + 1;
        }
        bad = qg_engine_check_many(many, (size_t)n, req, now, dm, rcs);
        for (int i = 0; i < n; i++) {
            int rc = qg_engine_check(one, &req[i], now, &d1, NULL, 0);
            assert_int_equal(rcs[i], rc);
            bad -= rc != QG_OK;
            if (rc == QG_OK) {
                char what[64];
                snprintf(what, sizeof what, "batch %d, request %d (%s)",
                         round, i, req[i].request_id);
                tst_same_decision(what, "in a batch", "alone", &dm[i], &d1);
                if (d1.outcome == QG_ALLOW)
                    seen[d1.replayed ? 1 : 0]++;
            } else
                seen[rc == QG_EINVAL ? 2 : rc == QG_EMODEL ? 3 : 4]++;
            if (rc == QG_OK && dm[i].outcome != QG_ALLOW)
                seen[5]++;
        }
        assert_int_equal(bad, 0);
        /* settle some of this batch's admissions on both engines */
        for (int i = 0; i < n; i++) {
            qg_settle_req sr = {.request_id = req[i].request_id,
                                .status = QG_SETTLE_COMPLETED,
                                .weight_milli = 500};
            qg_settle_result a, b;
            if (rcs[i] != QG_OK || dm[i].outcome != QG_ALLOW ||
                many_rnd(&x) % 3 == 0)
                continue;
            assert_int_equal(qg_engine_settle(many, &sr, now, &a, NULL, 0),
                             qg_engine_settle(one, &sr, now, &b, NULL, 0));
        }
    }
    /* the stream had each kind in it */
    print_message("check_many: %ld admitted, %ld replayed, %ld refused, %ld "
                  "QG_EINVAL, %ld QG_EMODEL, %ld other errors\n", seen[0],
                  seen[1], seen[5], seen[2], seen[3], seen[4]);
    assert_true(seen[0] > 100 && seen[1] > 10 && seen[5] > 100 &&
                seen[2] > 10 && seen[3] > 10);
    qg_engine_free(many);
    qg_engine_free(one);
    qg_store_free(s1);
    qg_store_free(s2);
}

/* Batches on one thread while another reloads rules that add and drop a
 * rolling window (every entity's window states move apart from its
 * block): the prefetches read entities without their shard's lock, which
 * ASan checks here; every batch's answers stay whole. */
typedef struct many_run {
    qg_engine *e;
    atomic_int stop;
    long batches, admitted;
} many_run;

static void *many_thread(void *p)
{
    many_run *m = p;
    static const char *subjects[] = {"alice", "bob", "m1", "m2", "u1",
                                     "u2", "u3", "u4"};
    static __thread qg_decision d[QG_CHECK_MANY_MAX];
    qg_check_req req[QG_CHECK_MANY_MAX];
    char rid[QG_CHECK_MANY_MAX][48];
    int rcs[QG_CHECK_MANY_MAX];
    int64_t now = T_MS;
    for (long b = 0; !atomic_load(&m->stop); b++) {
        now += 20 * MIN_MS;       /* the rolling windows empty out */
        for (int i = 0; i < QG_CHECK_MANY_MAX; i++) {
            snprintf(rid[i], sizeof rid[i], "r-%ld-%d", b, i);
            req[i] = (qg_check_req){.subject = subjects[(b + i) % 8],
                                    .request_id = rid[i],
                                    .weight_milli = 100};
        }
        if (qg_engine_check_many(m->e, QG_CHECK_MANY_MAX, req, now, d,
                                 rcs) != 0)
            fail_msg("a batch had errors");
        for (int i = 0; i < QG_CHECK_MANY_MAX; i++)
            m->admitted += d[i].outcome == QG_ALLOW;
        m->batches++;
    }
    return NULL;
}

static void test_check_many_reload(void **state)
{
    static const char at[] = "    concurrency: 2\n";
    static const char extra[] =
        "      - { name: extra, type: rolling, length: 2h, limit: 40 }\n";
    char other[sizeof rules_text + sizeof extra], err[256];
    const char *cut = strstr(rules_text, at);
    qg_store *st = qg_store_memory_new(NULL);
    many_run m = {0};
    pthread_t th;
    int reloads = 0;
    (void)state;
    assert_non_null(cut);
    snprintf(other, sizeof other, "%.*s%s%s", (int)(cut - rules_text),
             rules_text, extra, cut);
    m.e = qg_engine_new(tst_rules_parse(rules_text), st);
    assert_non_null(m.e);
    assert_int_equal(pthread_create(&th, NULL, many_thread, &m), 0);
    for (; reloads < 200; reloads++) {
        qg_rules *r = tst_rules_parse(reloads % 2 ? rules_text : other);
        assert_int_equal(qg_engine_reload(m.e, r, err, sizeof err), 0);
        usleep(500);
    }
    atomic_store(&m.stop, 1);
    pthread_join(th, NULL);
    print_message("check_many under reloads: %ld batches, %ld admitted, "
                  "%d reloads\n", m.batches, m.admitted, reloads);
    assert_true(m.batches > 0 && m.admitted > 0);
    qg_engine_free(m.e);
    qg_store_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_binding_longest_closed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_retry_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_retryable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_settle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrency_leases, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_org_all_or_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_model_scoped, setup, teardown),
        cmocka_unit_test(test_reservations_full),
        cmocka_unit_test(test_reservations_churn),
        cmocka_unit_test(test_reservations_small_bound),
        cmocka_unit_test(test_prefault),
        cmocka_unit_test(test_check_many),
        cmocka_unit_test(test_check_many_reload),
        cmocka_unit_test(test_versions_by_instant),
        cmocka_unit_test(test_org_versions),
        cmocka_unit_test(test_version_not_yet),
        cmocka_unit_test_setup_teardown(test_usage_and_recovery, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_settle_after_zero_reservation,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
