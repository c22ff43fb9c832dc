/* test_store_redis.c - the Redis store (store_redis.c and its scripts)
 * against the memory store, on a real redis-server started by the test
 * (tests/support/redisproc.c).
 *
 * Every case drives two engines with the same rules and the same calls:
 * one on qg_store_memory (the reference semantics, store_memory.c) and
 * one on the Redis store, and requires identical answers: return code,
 * outcome, replay, weight, decision instant, retry_after_ms, binding
 * window, payg fields, every view (limit, used, remaining, reset_at) and
 * every recovery schedule, and every settle result.  On top of that the
 * unit cases check the expected values themselves.
 *
 *  - unit cases: each window type, payg, replays and reused ids (in the
 *    same org and across orgs, which lands in another hash slot),
 *    settles (completed, cancelled, failed, late, no_charge, another
 *    subject's, without a subject), concurrency lease expiry, restores,
 *    the refusal of rules outside the store's exact range, flushed
 *    Function libraries ("Function not found") and script cache
 *    (NOSCRIPT, on a server where FCALL may not be used: the EVALSHA
 *    fallback), a flushed data set (FLUSHALL: the epoch),
 *    a server that went away (QG_ESTORE), round trips per operation, and the
 *    bignum helper the scripts use for 128-bit arithmetic;
 *  - the differential test: long random streams of checks, settles,
 *    usage, restores and known-id queries over rules with every window
 *    type, org windows, model-scoped windows, payg and concurrency, in
 *    exact mode and in the two bounded rolling modes (max_entries 16,
 *    precision 1m), and exact mode again through EVALSHA (FCALL denied
 *    by an ACL), fixed seed.  QG_REDIS_DIFF_OPS=N and
 *    QG_REDIS_DIFF_SEED=S for a long run; it prints the ops and the seed,
 *    the round trips per check and settle, and the bytes Redis holds per
 *    active subject (MEMORY USAGE over every key).
 *
 * Skipped, with a message, only when no redis-server can be found
 * (make test installs it). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include "quotagate.h"
#include "redis_script.h"
#include "redisproc.h"
#include "rules.h"
#include "ruletest.h"
#include "sametest.h"
#include "weights.h"

#define T0_MS 1772323200000LL        /* 2026-03-01T00:00:00Z */
#define ANCHOR_MS 1769850000000LL    /* 2026-01-31T09:00:00Z */
#define MIN_MS 60000LL
#define HOUR_MS 3600000LL
#define DAY_MS 86400000LL

#if defined(__SANITIZE_ADDRESS__)
#define DIFF_OPS 6000L
#else
#define DIFF_OPS 20000L
#endif

static redisproc srv;
static int have_server;
static long g_op = -1;           /* the differential's current operation */
static int g_trace;              /* QG_REDIS_DIFF_TRACE: print every call */

/* ------------------------------------------------------------ twins */

typedef struct twin {
    qg_store *ms, *rs;
    qg_engine *me, *re;
    const qg_rules *rules;     /* the memory engine's */
    long checks, settles;      /* calls made, for round-trip counts */
} twin;

static twin *open_twin;        /* closed by the teardown on failure */

static void need_server(void)
{
    if (!have_server) {
        print_message("SKIPPED: no redis-server found (install the Debian "
                      "package redis-server, or set QG_REDIS_SERVER)\n");
        skip();
    }
}

static rediscluster *g_cluster;  /* test_diff_cluster: the store's Cluster */
static char g_url[256];          /* its redis-cluster:// URL */

static void flushall(void)
{
    char out[64];
    if (g_cluster) {
        for (int i = 0; i < g_cluster->n; i++)
            assert_int_equal(redisproc_cmd(&g_cluster->node[i], out,
                                           sizeof out, "FLUSHALL", NULL), 0);
        return;
    }
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FLUSHALL", NULL), 0);
}

static int64_t g_lib_keep_ms;       /* test_old_libraries */

static qg_store *redis_store(qg_rules *rules)
{
    qg_redis_opts o = {.rules = rules, .server_time = 0,
                       .library_keep_ms = g_lib_keep_ms};
    char err[300];
    qg_store *s = qg_store_redis_new(g_cluster ? g_url : redisproc_url(&srv),
                                     &o, err, sizeof err);
    if (!s)
        fail_msg("qg_store_redis_new: %s", err);
    return s;
}

static void twin_open(twin *t, const char *text)
{
    qg_memory_opts mo = {.shards = 4, .max_reservations = 1u << 19};
    qg_rules *r1 = tst_rules_parse(text), *r2 = tst_rules_parse(text);
    need_server();
    flushall();
    memset(t, 0, sizeof *t);
    assert_non_null(t->ms = qg_store_memory_new(&mo));
    t->rs = redis_store(r2);
    assert_non_null(t->me = qg_engine_new(r1, t->ms));
    assert_non_null(t->re = qg_engine_new(r2, t->rs));
    t->rules = qg_engine_rules(t->me);
    open_twin = t;
}

static void twin_close(twin *t)
{
    if (t->me)
        qg_engine_free(t->me);
    if (t->re)
        qg_engine_free(t->re);
    if (t->ms)
        qg_store_free(t->ms);
    if (t->rs)
        qg_store_free(t->rs);
    memset(t, 0, sizeof *t);
    open_twin = NULL;
}

static int teardown(void **state)
{
    (void)state;
    if (open_twin)
        twin_close(open_twin);
    if (g_cluster) {
        rediscluster_stop(g_cluster);
        g_cluster = NULL;
    }
    return 0;
}

static void set_subject(twin *t, const char *name, const char *plan,
                        const char *org, int64_t anchor)
{
    char err[256];
    assert_int_equal(qg_engine_set_subject(t->me, name, plan, org, anchor,
                                           err, sizeof err), 0);
    assert_int_equal(qg_engine_set_subject(t->re, name, plan, org, anchor,
                                           err, sizeof err), 0);
}

static int t_check(twin *t, const char *subject, const char *rid,
                   const char *model, int64_t a, int64_t b, int64_t now,
                   qg_decision *out)
{
    qg_check_req q = {.subject = subject, .request_id = rid, .model = model};
    qg_decision d1, d2;
    char e1[256], e2[256], what[200];
    int rc1, rc2;
    if (model) {
        q.input_tokens = a;
        q.max_output_tokens = b;
    } else {
        q.weight_milli = a;
    }
    memset(&d1, 0, sizeof d1);
    memset(&d2, 0, sizeof d2);
    rc1 = qg_engine_check(t->me, &q, now, &d1, e1, sizeof e1);
    rc2 = qg_engine_check(t->re, &q, now, &d2, e2, sizeof e2);
    t->checks++;
    snprintf(what, sizeof what, "op %ld: check %s %s %s %lld/%lld at t0+%lld",
             g_op, subject, rid, model ? model : "-", (long long)a,
             (long long)b, (long long)(now - T0_MS));
    if (g_trace)
        printf("# %s -> rc %d outcome %d replayed %d retry %lld\n", what, rc1,
               d1.outcome, d1.replayed, (long long)d1.retry_after_ms);
    if (rc1 != rc2)
        fail_msg("%s: rc memory %d (%s), redis %d (%s; %s)", what, rc1,
                 rc1 ? e1 : "", rc2, rc2 ? e2 : "",
                 qg_store_redis_error(t->rs));
    if (rc1 == QG_OK)
        tst_same_decision(what, "memory", "redis", &d1, &d2);
    if (out)
        *out = d1;
    return rc1;
}

static void same_settle(const char *what, const qg_settle_result *a,
                        const qg_settle_result *b)
{
    if (a->replayed != b->replayed || a->late != b->late ||
        a->reserved_milli != b->reserved_milli ||
        a->actual_milli != b->actual_milli ||
        a->charged_milli != b->charged_milli ||
        a->decided_at_ms != b->decided_at_ms || a->status != b->status ||
        a->overage_milli != b->overage_milli ||
        a->overage_cost_micro != b->overage_cost_micro)
        fail_msg("%s: memory replayed %d late %d reserved %lld actual %lld "
                 "charged %lld at %lld status %d overage %lld cost %lld; "
                 "redis %d %d %lld %lld %lld %lld %d %lld %lld", what,
                 a->replayed, a->late, (long long)a->reserved_milli,
                 (long long)a->actual_milli, (long long)a->charged_milli,
                 (long long)a->decided_at_ms, a->status,
                 (long long)a->overage_milli, (long long)a->overage_cost_micro,
                 b->replayed, b->late, (long long)b->reserved_milli,
                 (long long)b->actual_milli, (long long)b->charged_milli,
                 (long long)b->decided_at_ms, b->status,
                 (long long)b->overage_milli, (long long)b->overage_cost_micro);
}

static int t_settle_req(twin *t, const qg_settle_req *q, int64_t now,
                        qg_settle_result *out)
{
    qg_settle_result r1, r2;
    char e1[256], e2[256], what[200];
    int rc1, rc2;
    memset(&r1, 0, sizeof r1);
    memset(&r2, 0, sizeof r2);
    rc1 = qg_engine_settle(t->me, q, now, &r1, e1, sizeof e1);
    rc2 = qg_engine_settle(t->re, q, now, &r2, e2, sizeof e2);
    t->settles++;
    snprintf(what, sizeof what, "op %ld: settle %s status %d in %lld out %lld "
             "weight %lld%s%s at t0+%lld", g_op, q->request_id, q->status,
             (long long)q->input_tokens, (long long)q->output_tokens,
             (long long)q->weight_milli, q->no_charge ? " no_charge" : "",
             q->subject ? " named" : "", (long long)(now - T0_MS));
    if (g_trace)
        printf("# %s -> rc %d charged %lld late %d\n", what, rc1,
               (long long)r1.charged_milli, r1.late);
    if (rc1 != rc2)
        fail_msg("%s: rc memory %d, redis %d (%s)", what, rc1, rc2,
                 qg_store_redis_error(t->rs));
    if (rc1 == QG_OK)
        same_settle(what, &r1, &r2);
    if (out)
        *out = r1;
    return rc1;
}

static int t_settle(twin *t, const char *rid, qg_settle_status st,
                    int64_t in, int64_t out_tokens, int64_t weight,
                    int64_t now, qg_settle_result *out)
{
    qg_settle_req q = {.request_id = rid, .status = st, .input_tokens = in,
                       .output_tokens = out_tokens, .weight_milli = weight};
    return t_settle_req(t, &q, now, out);
}

static void t_usage(twin *t, const char *subject, int64_t now,
                    qg_decision *out)
{
    qg_decision d1, d2;
    char what[160];
    int rc1 = qg_engine_usage(t->me, subject, now, &d1);
    int rc2 = qg_engine_usage(t->re, subject, now, &d2);
    snprintf(what, sizeof what, "op %ld: usage %s at t0+%lld", g_op, subject,
             (long long)(now - T0_MS));
    if (rc1 != rc2)
        fail_msg("%s: rc memory %d, redis %d (%s)", what, rc1, rc2,
                 qg_store_redis_error(t->rs));
    if (rc1 == QG_OK)
        tst_same_decision(what, "memory", "redis", &d1, &d2);
    if (out)
        *out = d1;
}

static int t_restore(twin *t, const qg_restore_req *q)
{
    char e1[256], e2[256];
    int rc1 = qg_engine_restore(t->me, q, e1, sizeof e1);
    int rc2 = qg_engine_restore(t->re, q, e2, sizeof e2);
    if (g_trace)
        printf("# op %ld: restore %s %s at %lld res %lld chg %lld settled %d "
               "charge_only %d -> %d\n", g_op, q->subject, q->request_id,
               (long long)(q->decided_at_ms - T0_MS),
               (long long)q->reserved_milli, (long long)q->charged_milli,
               q->settled, q->charge_only, rc1);
    if (rc1 != rc2)
        fail_msg("restore %s: rc memory %d (%s), redis %d (%s; %s)",
                 q->request_id, rc1, e1, rc2, e2, qg_store_redis_error(t->rs));
    return rc1;
}

static void t_known(twin *t, const char *rid)
{
    int a = qg_engine_remembers(t->me, rid), b = qg_engine_remembers(t->re, rid);
    if (a != b)
        fail_msg("known %s: memory %d, redis %d", rid, a, b);
}

/* The view of `name` in d (fails when absent). */
static const qg_window_view *view_of(const qg_decision *d, const char *name)
{
    for (int i = 0; i < d->nviews; i++)
        if (strcmp(d->views[i].name, name) == 0)
            return &d->views[i];
    fail_msg("no window %s", name);
    return NULL;
}

/* --------------------------------------------------------- unit cases */

static const char unit_rules[] =
    "version: \"u1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 4 }\n"
    "plans:\n"
    "  roll:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
    "  cal:\n"
    "    windows:\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"Europe/Berlin\", limit: 10 }\n"
    "      - { name: monthly, type: calendar, every: month, anchor: billing, tz: \"UTC\", limit: 100 }\n"
    "  sess:\n"
    "    windows:\n"
    "      - { name: s5h, type: session, length: 5h, limit: 10 }\n"
    "  rate:\n"
    "    windows:\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 4, burst: 6, unit: requests }\n"
    "      - { name: wrate, type: rate, per: 1h, limit: 25, burst: 30 }\n"
    "  conc:\n"
    "    windows:\n"
    "      - { name: big, type: rolling, length: 1h, limit: 1000 }\n"
    "    concurrency: 2\n"
    "    lease_ttl: 10m\n"
    "  scoped:\n"
    "    windows:\n"
    "      - { name: all, type: rolling, length: 1h, limit: 100 }\n"
    "      - { name: large_daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 10, models: [large] }\n"
    "  pay:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 20, unit: requests }\n"
    "    concurrency: 4\n"
    "    overage: { policy: payg, price_per_unit: 0.01, spending_cap: { usd_month: 0.5 } }\n"
    "  team:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 50 }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_hourly, type: rolling, length: 1h, limit: 12 }\n"
    "    concurrency: 3\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_hourly, type: rolling, length: 1h, limit: 100 }\n"
    "subjects:\n"
    "  r1: { plan: roll }\n"
    "  c1: { plan: cal, billing_anchor: \"2026-01-31T09:00:00Z\" }\n"
    "  s1: { plan: sess }\n"
    "  q1: { plan: rate }\n"
    "  k1: { plan: conc }\n"
    "  m1: { plan: scoped }\n"
    "  p1: { plan: pay }\n"
    "  a1: { plan: team, org: acme }\n"
    "  a2: { plan: team, org: acme }\n"
    "  g1: { plan: team, org: globex }\n";

static void test_rolling(void **state)
{
    static twin t;
    qg_decision d;
    qg_settle_result sr;
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "r1", "a", NULL, 4000, 0, T0_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_check(&t, "r1", "b", NULL, 4000, 0, T0_MS + 10 * MIN_MS, &d), 0);
    /* 8 used, 4 more do not fit until the first charge leaves at t0 + 1h */
    assert_int_equal(t_check(&t, "r1", "c", NULL, 4000, 0, T0_MS + 20 * MIN_MS, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(d.retry_after_ms, 40 * MIN_MS);
    assert_int_equal(d.nrecovery[0], 2);
    /* the same request one millisecond before and at the instant */
    assert_int_equal(t_check(&t, "r1", "c", NULL, 4000, 0, T0_MS + HOUR_MS - 1, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(d.retry_after_ms, 1);
    assert_int_equal(t_check(&t, "r1", "c", NULL, 4000, 0, T0_MS + HOUR_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* a settle below the reservation refunds at the reservation's
     * instant; one after its lease (15 minutes) is final */
    assert_int_equal(t_settle(&t, "c", QG_SETTLE_COMPLETED, 0, 0, 1000,
                              T0_MS + HOUR_MS + 1, &sr), 0);
    assert_int_equal(sr.charged_milli, 1000);
    assert_int_equal(t_settle(&t, "b", QG_SETTLE_COMPLETED, 0, 0, 1000,
                              T0_MS + HOUR_MS + 1, &sr), 0);
    assert_int_equal(sr.late, 1);
    assert_int_equal(sr.charged_milli, 4000);
    t_usage(&t, "r1", T0_MS + HOUR_MS + 2, &d);
    assert_int_equal(view_of(&d, "burst")->used_milli, 5000);
    /* a request larger than the limit is never admitted */
    assert_int_equal(t_check(&t, "r1", "huge", NULL, 11000, 0, T0_MS + HOUR_MS + 3, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT_NEVER);
    /* many charges in one millisecond coalesce; zero weights count 0 */
    for (int i = 0; i < 5; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "z%d", i);
        t_check(&t, "r1", rid, NULL, i ? 1000 : 0, 0, T0_MS + 2 * HOUR_MS, NULL);
    }
    t_usage(&t, "r1", T0_MS + 2 * HOUR_MS, &d);
    twin_close(&t);
}

static void test_calendar(void **state)
{
    static twin t;
    qg_decision d;
    /* 2026-03-28 23:30 UTC: Berlin's daily resets at 23:00 UTC in winter,
     * 22:00 UTC from the 29th (DST) */
    int64_t t1 = 1774740600000LL;
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "c1", "a", NULL, 8000, 0, t1, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_check(&t, "c1", "b", NULL, 5000, 0, t1 + 1000, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    /* the next Berlin midnight is 2026-03-29T22:00Z (a 23-hour day) */
    assert_int_equal(d.decided_at_ms + d.retry_after_ms, 1774821600000LL);
    assert_int_equal(t_check(&t, "c1", "b", NULL, 5000, 0, 1774821600000LL - 1, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(t_check(&t, "c1", "b", NULL, 5000, 0, 1774821600000LL, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* the billing month: the anchor is the 31st 09:00, so it resets on
     * March 31 09:00 UTC */
    assert_int_equal(view_of(&d, "monthly")->reset_at_ms, 1774947600000LL);
    t_usage(&t, "c1", 1774947600000LL, &d);
    assert_int_equal(view_of(&d, "monthly")->used_milli, 0);
    twin_close(&t);
}

static void test_session(void **state)
{
    static twin t;
    qg_decision d;
    (void)state;
    twin_open(&t, unit_rules);
    /* nothing runs until the first charge opens the session */
    t_usage(&t, "s1", T0_MS, &d);
    assert_int_equal(view_of(&d, "s5h")->reset_at_ms, 0);
    assert_int_equal(t_check(&t, "s1", "a", NULL, 6000, 0, T0_MS + HOUR_MS, &d), 0);
    assert_int_equal(view_of(&d, "s5h")->reset_at_ms, T0_MS + 6 * HOUR_MS);
    assert_int_equal(t_check(&t, "s1", "b", NULL, 6000, 0, T0_MS + 2 * HOUR_MS, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(d.retry_after_ms, 4 * HOUR_MS);
    assert_int_equal(t_check(&t, "s1", "b", NULL, 6000, 0, T0_MS + 6 * HOUR_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(view_of(&d, "s5h")->reset_at_ms, T0_MS + 11 * HOUR_MS);
    twin_close(&t);
}

static void test_rate(void **state)
{
    static twin t;
    qg_decision d;
    int64_t now = T0_MS + 17;
    (void)state;
    twin_open(&t, unit_rules);
    /* burst 6 requests, then one per 15 s */
    for (int i = 0; i < 6; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "b%d", i);
        assert_int_equal(t_check(&t, "q1", rid, NULL, 1000, 0, now, &d), 0);
        assert_int_equal(d.outcome, QG_ALLOW);
    }
    assert_int_equal(t_check(&t, "q1", "x", NULL, 1000, 0, now, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(d.retry_after_ms, 15000);
    assert_int_equal(d.nrecovery[0], 4);
    assert_int_equal(t_check(&t, "q1", "x", NULL, 1000, 0, now + 14999, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(t_check(&t, "q1", "x", NULL, 1000, 0, now + 15000, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* weight rate 25 points an hour: 30.001 points never fit the burst */
    assert_int_equal(t_check(&t, "q1", "w", NULL, 30001, 0, now + 15001, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT_NEVER);
    /* an amount whose scaled arithmetic passes 2^53: exact, 7.123 points
     * refill at 25 per hour */
    assert_int_equal(t_check(&t, "q1", "w2", NULL, 22999, 0, now + 30000, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_check(&t, "q1", "w3", NULL, 7123, 0, now + 45000, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_string_equal(d.views[d.binding].name, "wrate");
    t_usage(&t, "q1", now + 50000, &d);
    twin_close(&t);
}

static void test_concurrency_lease_expiry(void **state)
{
    static twin t;
    qg_decision d;
    qg_settle_result sr;
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "k1", "a", NULL, 1000, 0, T0_MS, &d), 0);
    assert_int_equal(t_check(&t, "k1", "b", NULL, 1000, 0, T0_MS + 1000, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_check(&t, "k1", "c", NULL, 1000, 0, T0_MS + 2000, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    /* the earliest lease expires at t0 + 10 min */
    assert_int_equal(d.retry_after_ms, 10 * MIN_MS - 2000);
    /* a settle frees a slot at once */
    assert_int_equal(t_settle(&t, "b", QG_SETTLE_COMPLETED, 0, 0, -1,
                              T0_MS + 3000, &sr), 0);
    assert_int_equal(t_check(&t, "k1", "c", NULL, 1000, 0, T0_MS + 4000, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* "a" was never settled: its lease expires, the reservation is final */
    assert_int_equal(t_check(&t, "k1", "d", NULL, 1000, 0, T0_MS + 10 * MIN_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_settle(&t, "a", QG_SETTLE_COMPLETED, 0, 0, 0,
                              T0_MS + 11 * MIN_MS, &sr), 0);
    assert_int_equal(sr.late, 1);
    assert_int_equal(sr.charged_milli, 1000);   /* never refunded */
    assert_int_equal(t_settle(&t, "c", QG_SETTLE_COMPLETED, 0, 0, 3000,
                              T0_MS + 12 * MIN_MS, &sr), 0);
    assert_int_equal(sr.late, 1);
    assert_int_equal(sr.charged_milli, 3000);   /* a larger charge counts */
    t_usage(&t, "k1", T0_MS + 12 * MIN_MS, &d);
    assert_int_equal(view_of(&d, "concurrency")->used_milli, 1000);
    twin_close(&t);
}

static void test_model_scoped(void **state)
{
    static twin t;
    qg_decision d;
    (void)state;
    twin_open(&t, unit_rules);
    /* large: 2 + 1 * 1 + 4 * 1 = 7 points for 1000 in, 1000 out */
    assert_int_equal(t_check(&t, "m1", "a", "large", 1000, 1000, T0_MS, &d), 0);
    assert_int_equal(d.weight_milli, 7000);
    assert_int_equal(t_check(&t, "m1", "b", "large", 1000, 1000, T0_MS + 1, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_string_equal(d.views[d.binding].name, "large_daily");
    /* light requests and weight-only requests do not meet large_daily */
    assert_int_equal(t_check(&t, "m1", "c", "light", 1000, 1000, T0_MS + 2, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_check(&t, "m1", "d", NULL, 9000, 0, T0_MS + 3, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* a settle from tokens, computed by the script in wide arithmetic */
    assert_int_equal(t_settle(&t, "a", QG_SETTLE_COMPLETED, 1000000000000LL,
                              1000000000000LL, -1, T0_MS + 4, NULL), 0);
    t_usage(&t, "m1", T0_MS + 5, &d);
    twin_close(&t);
}

static void test_payg(void **state)
{
    static twin t;
    qg_decision d;
    qg_settle_result sr;
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "p1", "a", NULL, 8000, 0, T0_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(d.overage_milli, 0);
    /* 5 points with 2 of room: 3 points of overage at 0.01 USD */
    assert_int_equal(t_check(&t, "p1", "b", NULL, 5000, 0, T0_MS + 1, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(d.headroom_milli, 2000);
    assert_int_equal(d.overage_milli, 3000);
    assert_int_equal(d.overage_cost_micro, 30000);
    assert_int_equal(d.spent_micro, 30000);
    /* the settle reprices from the final charge */
    assert_int_equal(t_settle(&t, "b", QG_SETTLE_COMPLETED, 0, 0, 2500,
                              T0_MS + 2, &sr), 0);
    assert_int_equal(sr.overage_milli, 500);
    assert_int_equal(sr.overage_cost_micro, 5000);
    /* the cap (0.5 USD): 9 points beyond the room cost 0.09, six times */
    for (int i = 0; i < 6; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "f%d", i);
        assert_int_equal(t_check(&t, "p1", rid, NULL, 9000, 0, T0_MS + 3, &d), 0);
        assert_int_equal(d.outcome, i < 5 ? QG_ALLOW : QG_REJECT);
        if (i < 5)    /* settled at once: concurrency 4 */
            assert_int_equal(t_settle(&t, rid, QG_SETTLE_COMPLETED, 0, 0, -1,
                                      T0_MS + 3, NULL), 0);
    }
    assert_int_equal(d.cap_reached, 1);
    assert_int_equal(d.overage_cost_micro, 90000);
    /* 60 points no lifted window could ever hold, priced beyond the
     * whole cap: never */
    assert_int_equal(t_check(&t, "p1", "c", NULL, 60000, 0, T0_MS + 3, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT_NEVER);
    assert_int_equal(d.cap_reached, 1);
    /* a replay reports the original overage */
    assert_int_equal(t_check(&t, "p1", "b", NULL, 5000, 0, T0_MS + 4, &d), 0);
    assert_int_equal(d.replayed, 1);
    assert_int_equal(d.overage_milli, 3000);
    t_usage(&t, "p1", T0_MS + 5, &d);
    /* the spent amount resets with the cap period (April) */
    assert_int_equal(t_check(&t, "p1", "e", NULL, 9000, 0, 1775001600000LL, &d), 0);
    assert_int_equal(d.spent_micro, 0);
    twin_close(&t);
}

static void test_replays_and_reused_ids(void **state)
{
    static twin t;
    qg_decision d, first;
    qg_redis_counters c0, c1;
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "a1", "id1", NULL, 5000, 0, T0_MS, &first), 0);
    /* the same subject later: the original decision, nothing charged */
    assert_int_equal(t_check(&t, "a1", "id1", NULL, 9000, 0, T0_MS + MIN_MS, &d), 0);
    assert_int_equal(d.replayed, 1);
    assert_int_equal(d.weight_milli, 5000);
    assert_int_equal(d.decided_at_ms, T0_MS);
    /* another member of the same org (same hash slot): refused */
    assert_int_equal(t_check(&t, "a2", "id1", NULL, 1000, 0, T0_MS + MIN_MS, &d),
                     QG_EINVAL);
    /* a member of another org (another hash slot): refused, and the
     * admission its script made meanwhile is taken back exactly */
    qg_store_redis_counters(t.rs, &c0);
    assert_int_equal(t_check(&t, "g1", "id1", NULL, 1000, 0, T0_MS + MIN_MS, &d),
                     QG_EINVAL);
    assert_int_equal(t_check(&t, "r1", "id1", NULL, 1000, 0, T0_MS + MIN_MS, &d),
                     QG_EINVAL);
    qg_store_redis_counters(t.rs, &c1);
    assert_int_equal(c1.voids - c0.voids, 2);
    t_usage(&t, "g1", T0_MS + MIN_MS + 1, &d);
    assert_int_equal(view_of(&d, "burst")->used_milli, 0);
    t_usage(&t, "r1", T0_MS + MIN_MS + 1, &d);
    assert_int_equal(view_of(&d, "burst")->used_milli, 0);
    /* a refusal is not remembered: another subject may use the id */
    assert_int_equal(t_check(&t, "a2", "id2", NULL, 10000, 0, T0_MS + 2 * MIN_MS, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    t_known(&t, "id2");
    assert_int_equal(t_check(&t, "g1", "id2", NULL, 1000, 0, T0_MS + 2 * MIN_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    assert_int_equal(t_check(&t, "g1", "id2", NULL, 1000, 0, T0_MS + 3 * MIN_MS, &d), 0);
    assert_int_equal(d.replayed, 1);
    t_known(&t, "id1");
    t_known(&t, "id2");
    t_known(&t, "never");
    assert_int_equal(qg_engine_remembers(t.re, "id2"), 1);
    twin_close(&t);
}

static void test_settles(void **state)
{
    static twin t;
    qg_settle_result sr;
    qg_settle_req q;
    qg_decision d;
    (void)state;
    twin_open(&t, unit_rules);
    /* light: 1 + 0.25 * 2 + 1 * 1 = 2.5 points reserved */
    assert_int_equal(t_check(&t, "a1", "m", "light", 2000, 1000, T0_MS, &d), 0);
    assert_int_equal(d.weight_milli, 2500);
    assert_int_equal(t_check(&t, "a1", "n", "light", 2000, 1000, T0_MS, &d), 0);
    assert_int_equal(t_check(&t, "a1", "o", "light", 2000, 1000, T0_MS, &d), 0);
    assert_int_equal(t_check(&t, "g1", "p", NULL, 3000, 0, T0_MS, &d), 0);
    assert_int_equal(d.outcome, QG_ALLOW);
    /* completed, with more output than estimated */
    assert_int_equal(t_settle(&t, "m", QG_SETTLE_COMPLETED, 2000, 3000, -1,
                              T0_MS + 1000, &sr), 0);
    assert_int_equal(sr.charged_milli, 4500);
    /* cancelled with what was produced; failed before any output */
    assert_int_equal(t_settle(&t, "n", QG_SETTLE_CANCELLED, 2000, 100, -1,
                              T0_MS + 1000, &sr), 0);
    assert_int_equal(sr.charged_milli, 1600);
    assert_int_equal(t_settle(&t, "o", QG_SETTLE_FAILED, 0, 0, -1,
                              T0_MS + 1000, &sr), 0);
    assert_int_equal(sr.charged_milli, 1000);
    /* settled twice: the original result */
    assert_int_equal(t_settle(&t, "m", QG_SETTLE_FAILED, 0, 0, -1,
                              T0_MS + 2000, &sr), 0);
    assert_int_equal(sr.replayed, 1);
    assert_int_equal(sr.charged_milli, 4500);
    /* naming another subject: refused, nothing settled */
    memset(&q, 0, sizeof q);
    q.request_id = "p";
    q.status = QG_SETTLE_COMPLETED;
    q.weight_milli = 0;
    q.subject = "a1";
    assert_int_equal(t_settle_req(&t, &q, T0_MS + 3000, NULL), QG_EINVAL);
    q.subject = "r1";          /* no org: found through the index */
    assert_int_equal(t_settle_req(&t, &q, T0_MS + 3000, NULL), QG_EINVAL);
    /* no_charge, naming its own subject */
    q.subject = "g1";
    q.no_charge = 1;
    q.weight_milli = 2000;
    assert_int_equal(t_settle_req(&t, &q, T0_MS + 3000, &sr), 0);
    assert_int_equal(sr.charged_milli, 0);
    /* unknown ids */
    assert_int_equal(t_settle(&t, "nobody", QG_SETTLE_COMPLETED, 0, 0, -1,
                              T0_MS + 4000, NULL), QG_ENOTFOUND);
    q.request_id = "nobody";
    assert_int_equal(t_settle_req(&t, &q, T0_MS + 4000, NULL), QG_ENOTFOUND);
    t_usage(&t, "a1", T0_MS + 5000, &d);
    assert_int_equal(view_of(&d, "org_hourly")->used_milli, 4500 + 1600 + 1000);
    t_usage(&t, "g1", T0_MS + 5000, &d);
    assert_int_equal(view_of(&d, "org_hourly")->used_milli, 0);
    twin_close(&t);
}

static void test_restore(void **state)
{
    static twin t;
    qg_decision d;
    qg_restore_req q;
    (void)state;
    twin_open(&t, unit_rules);
    memset(&q, 0, sizeof q);
    q.subject = "a1";
    q.request_id = "old1";
    q.decided_at_ms = T0_MS;
    q.reserved_milli = q.charged_milli = 4000;
    q.headroom_milli = -1;
    assert_int_equal(t_restore(&t, &q), 0);
    q.request_id = "old2";
    q.decided_at_ms = T0_MS + 1000;
    q.reserved_milli = 3000;
    q.charged_milli = 2000;
    q.settled = 1;
    q.status = QG_SETTLE_COMPLETED;
    assert_int_equal(t_restore(&t, &q), 0);
    assert_int_equal(t_restore(&t, &q), 0);   /* already restored: left alone */
    q.request_id = "old3";
    q.charge_only = 1;
    assert_int_equal(t_restore(&t, &q), 0);
    t_known(&t, "old1");
    t_known(&t, "old3");
    t_usage(&t, "a1", T0_MS + 2000, &d);
    assert_int_equal(view_of(&d, "org_hourly")->used_milli, 8000);
    /* a restored reservation replays and settles */
    assert_int_equal(t_check(&t, "a1", "old1", NULL, 1000, 0, T0_MS + 3000, &d), 0);
    assert_int_equal(d.replayed, 1);
    assert_int_equal(t_settle(&t, "old1", QG_SETTLE_COMPLETED, 0, 0, 1000,
                              T0_MS + 4000, NULL), 0);
    assert_int_equal(t_settle(&t, "old2", QG_SETTLE_COMPLETED, 0, 0, 1000,
                              T0_MS + 4000, NULL), 0);
    twin_close(&t);
}

static void test_domain_refused(void **state)
{
    static const char *bad[] = {
        /* a limit above 10^12 points */
        "plans:\n  big:\n    windows:\n"
        "      - { name: huge, type: rolling, length: 1h, limit: 2000000000000 }\n",
        /* a burst above it */
        "plans:\n  big:\n    windows:\n"
        "      - { name: r, type: rate, per: 1h, limit: 1, burst: 1000000000001 }\n",
        /* a bucket that drains after the end of time */
        "plans:\n  slow:\n    windows:\n"
        "      - { name: r, type: rate, per: 36500d, limit: 0.001, burst: 1000000 }\n",
        /* a price above 10^9 USD a point */
        "plans:\n  pay:\n    windows:\n"
        "      - { name: b, type: rolling, length: 1h, limit: 1 }\n"
        "    overage: { policy: payg, price_per_unit: 2000000000 }\n",
        /* an org window */
        "plans:\n  p:\n    windows:\n"
        "      - { name: b, type: rolling, length: 1h, limit: 1 }\n"
        "orgs:\n  o:\n    windows:\n"
        "      - { name: org_huge, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 5000000000000 }\n",
    };
    static const char *names[] = {"\"huge\"", "\"r\"", "\"r\"", "\"pay\"",
                                  "\"org_huge\""};
    (void)state;
    need_server();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024], err[300];
        qg_rules *r;
        qg_redis_opts o = {.server_time = 0};
        snprintf(text, sizeof text, "version: \"d%zu\"\nweights:\n  version: \"w\"\n"
                 "  calibrated: \"2026-01-01\"\n  models:\n"
                 "    m: { per_request: 1 }\n%s", i, bad[i]);
        r = tst_rules_parse(text);
        o.rules = r;
        assert_null(qg_store_redis_new(redisproc_url(&srv), &o, err, sizeof err));
        if (!strstr(err, names[i]) || !strstr(err, "Redis store"))
            fail_msg("case %zu: message \"%s\" does not name %s", i, err,
                     names[i]);
        print_message("refused: %s\n", err);
        assert_int_equal(qg_redis_rules_check(r, err, sizeof err), QG_ERANGE);
        qg_rules_free(r);
    }
    /* the memory store's bound is not the Redis store's: a weight within
     * the one and beyond the other is a range error, with a message */
    {
        static twin t;
        qg_check_req q = {.subject = "r1", .request_id = "w",
                          .weight_milli = QG_REDIS_AMOUNT_MAX + 1};
        qg_decision d;
        char err[256];
        twin_open(&t, unit_rules);
        assert_int_equal(qg_engine_check(t.re, &q, T0_MS, &d, err, sizeof err),
                         QG_ERANGE);
        assert_non_null(strstr(qg_store_redis_error(t.rs), "exactly"));
        twin_close(&t);
    }
}

/* Rules changes: a subject moved to another plan, and a reload that
 * changes limits (a rate window's too), adds and removes windows.  Window
 * state follows the same-named window of the same type (store_memory.c,
 * entity_relayout); an entity left on the old windows is still read
 * through them by a replay or a settle. */
static const char relayout_v1[] =
    "version: \"r1\"\n"
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "plans:\n"
    "  basic:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 20 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 50 }\n"
    "      - { name: sess, type: session, length: 2h, limit: 30 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 6, unit: requests }\n"
    "    concurrency: 3\n"
    "  pro:\n    windows:\n"
    "      - { name: sess, type: session, length: 2h, limit: 40 }\n"
    "      - { name: burst, type: rolling, length: 2h, limit: 30 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 10, unit: requests }\n"
    "      - { name: daily, type: rolling, length: 1d, limit: 80 }\n"
    "    concurrency: 5\n"
    "subjects:\n  u: { plan: basic }\n  w: { plan: basic }\n";

static const char relayout_v2[] =
    "version: \"r2\"\n"
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "plans:\n"
    "  basic:\n    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 25 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 200 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 7, burst: 9, unit: requests }\n"
    "    concurrency: 3\n"
    "  pro:\n    windows:\n"
    "      - { name: sess, type: session, length: 3h, limit: 40 }\n"
    "      - { name: burst, type: rolling, length: 2h, limit: 35 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 13, unit: requests }\n"
    "    concurrency: 4\n"
    "subjects:\n  u: { plan: basic }\n  w: { plan: basic }\n";

static void test_relayout(void **state)
{
    static twin t;
    char err[256];
    int64_t now = T0_MS + 7 * HOUR_MS;
    (void)state;
    twin_open(&t, relayout_v1);
    for (int i = 0; i < 12; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "a%d", i);
        t_check(&t, i % 3 ? "u" : "w", rid, i % 2 ? "light" : NULL, 2000,
                300, now + i * 7000, NULL);
    }
    t_settle(&t, "a1", QG_SETTLE_COMPLETED, 2000, 500, -1, now + 90000, NULL);
    /* u moves to pro: burst, sess, rpm and the lease carry over; daily
     * (a calendar window there, a rolling one here) starts afresh */
    set_subject(&t, "u", "pro", NULL, 0);
    t_check(&t, "u", "b1", NULL, 3000, 0, now + 100000, NULL);
    t_usage(&t, "u", now + 100001, NULL);
    t_settle(&t, "a2", QG_SETTLE_COMPLETED, 0, 0, 500, now + 100002, NULL);
    /* a reload: limits change (rpm's rescales tat exactly), windows come
     * and go */
    {
        qg_rules *r1 = tst_rules_parse(relayout_v2), *r2 = tst_rules_parse(relayout_v2);
        assert_int_equal(qg_engine_reload(t.me, r1, err, sizeof err), 0);
        assert_int_equal(qg_engine_reload(t.re, r2, err, sizeof err), 0);
        t.rules = qg_engine_rules(t.me);
    }
    /* w is still on the old windows: its replay and its settle read them */
    t_check(&t, "w", "a3", NULL, 2000, 0, now + 110000, NULL);
    t_settle(&t, "a6", QG_SETTLE_CANCELLED, 0, 0, 100, now + 110001, NULL);
    t_check(&t, "u", "b2", NULL, 3000, 0, now + 120000, NULL);
    t_check(&t, "w", "c1", "light", 1000, 100, now + 130000, NULL);
    t_usage(&t, "w", now + 130001, NULL);
    t_usage(&t, "u", now + 130002, NULL);
    t_settle(&t, "a9", QG_SETTLE_COMPLETED, 0, 0, 4000, now + 140000, NULL);
    t_settle(&t, "b1", QG_SETTLE_COMPLETED, 0, 0, 4000, now + 140001, NULL);
    for (int i = 0; i < 20; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "d%d", i);
        t_check(&t, i % 2 ? "u" : "w", rid, NULL, 1500, 0, now + 150000 + i * 3000, NULL);
    }
    t_usage(&t, "w", now + 300000, NULL);
    t_usage(&t, "u", now + 300000, NULL);
    twin_close(&t);
}

/* At the bound: forced charges (a rebuild) take a window's usage past
 * what the Redis store counts (10^12 points): it saturates there, refuses
 * every positive amount as the memory store's does (whose own bound is
 * larger), and finds the same retry instant from the exact sum of its
 * entries; only the view shows the bound. */
static void test_at_the_bound(void **state)
{
    static twin t;
    static const char text[] =
        "version: \"b1\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    m: { per_request: 1 }\n"
        "plans:\n  big:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 1h, limit: 1000000000000 }\n"
        "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 1000000000000 }\n"
        "subjects:\n  b: { plan: big }\n";
    qg_restore_req q;
    qg_check_req c = {.subject = "b", .request_id = "after", .weight_milli = 1};
    qg_decision d1, d2;
    (void)state;
    twin_open(&t, text);
    memset(&q, 0, sizeof q);
    q.subject = "b";
    q.headroom_milli = -1;
    q.settled = 1;
    q.status = QG_SETTLE_COMPLETED;
    for (int i = 0; i < 3; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "old%d", i);
        q.request_id = rid;
        q.decided_at_ms = T0_MS + i * MIN_MS;
        q.reserved_milli = q.charged_milli = 600000000000000LL;   /* 6e11 points */
        assert_int_equal(t_restore(&t, &q), 0);
    }
    assert_int_equal(qg_engine_check(t.me, &c, T0_MS + 3 * MIN_MS, &d1, NULL, 0), 0);
    assert_int_equal(qg_engine_check(t.re, &c, T0_MS + 3 * MIN_MS, &d2, NULL, 0), 0);
    assert_int_equal(d1.outcome, QG_REJECT);
    assert_int_equal(d2.outcome, QG_REJECT);
    assert_int_equal(d1.binding, d2.binding);
    assert_int_equal(d1.retry_after_ms, d2.retry_after_ms);
    /* two entries must leave before 1 milli fits: at t0 + 1 min + 1 h...
     * but the daily window holds all three until midnight */
    assert_int_equal(d2.decided_at_ms + d2.retry_after_ms, T0_MS + DAY_MS);
    assert_int_equal(d1.views[0].used_milli, 1800000000000000LL);
    assert_int_equal(d2.views[0].used_milli, QG_REDIS_AMOUNT_MAX);
    assert_int_equal(d2.views[1].used_milli, QG_REDIS_AMOUNT_MAX);
    assert_int_equal(d1.nrecovery[0], d2.nrecovery[0]);
    for (int k = 0; k < d1.nrecovery[0]; k++) {
        assert_int_equal(d1.recovery[0][k].at_ms, d2.recovery[0][k].at_ms);
        assert_int_equal(d1.recovery[0][k].remaining_milli,
                         d2.recovery[0][k].remaining_milli);
    }
    twin_close(&t);
}

/* -------------------------------------------------- the transport edge */

static void test_script_flush(void **state)
{
    static twin t;
    qg_decision d;
    qg_redis_counters c0, c1;
    char out[64];
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "r1", "a", NULL, 4000, 0, T0_MS, &d), 0);
    qg_store_redis_counters(t.rs, &c0);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "FLUSH", NULL), 0);
    /* "Function not found": the library loaded again, the same answers */
    assert_int_equal(t_check(&t, "r1", "b", NULL, 4000, 0, T0_MS + 1, &d), 0);
    assert_int_equal(t_check(&t, "r1", "c", NULL, 4000, 0, T0_MS + 2, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    qg_store_redis_counters(t.rs, &c1);
    assert_int_equal(c1.script_loads - c0.script_loads, 1);
    /* the decisions are FCALLs: a flushed script cache changes nothing */
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "SCRIPT", "FLUSH", NULL), 0);
    assert_int_equal(t_settle(&t, "a", QG_SETTLE_COMPLETED, 0, 0, 1000,
                              T0_MS + 3, NULL), 0);
    qg_store_redis_counters(t.rs, &c0);
    assert_int_equal(c0.script_loads - c1.script_loads, 0);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "FLUSH", NULL), 0);
    t_usage(&t, "r1", T0_MS + 4, &d);
    twin_close(&t);
    /* a server where FCALL may not be used (ACL; Redis < 7 has none):
     * EVALSHA, and NOSCRIPT after SCRIPT FLUSH loads the script */
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "ACL", "SETUSER",
                                   "default", "-fcall", NULL), 0);
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "r1", "a", NULL, 4000, 0, T0_MS, &d), 0);
    qg_store_redis_counters(t.rs, &c0);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "SCRIPT", "FLUSH", NULL), 0);
    assert_int_equal(t_check(&t, "r1", "b", NULL, 4000, 0, T0_MS + 1, &d), 0);
    assert_int_equal(t_check(&t, "r1", "c", NULL, 4000, 0, T0_MS + 2, &d), 0);
    assert_int_equal(d.outcome, QG_REJECT);
    qg_store_redis_counters(t.rs, &c1);
    assert_int_equal(c1.script_loads - c0.script_loads, 1);
    twin_close(&t);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "ACL", "SETUSER",
                                   "default", "+@all", NULL), 0);
}

/* Old rules versions' Function libraries: a load at a node deletes the
 * other libraries of ours there that nobody loaded within
 * library_keep_ms (or that record no load instant: an older quotagate's),
 * never the one loaded nor anyone else's; an instance whose library was
 * deleted loads it again and answers as before. */
static int has_library(const char *name)
{
    char out[8192];
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "LIST",
                                   NULL), 0);
    return strstr(out, name) != NULL;
}

/* Run store calls (each turns the lane's loop) until the library's
 * presence is as wanted: the prune is a command nobody waits for. */
static void await_library(twin *t, qg_engine *e, const char *name, int want)
{
    for (int i = 0; i < 200 && has_library(name) != want; i++) {
        qg_decision d;
        if (t)
            t_usage(t, "r1", T0_MS + 10, &d);
        else
            assert_int_equal(qg_engine_usage(e, "u", T0_MS + 10, &d), 0);
        usleep(2000);
    }
    if (has_library(name) != want)
        fail_msg("library %s is %s", name, want ? "missing" : "still there");
}

static void test_old_libraries(void **state)
{
    static twin t;
    static const char old_name[] = "qg_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    static const char fresh_name[] = "qg_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    char out[512], lib[512], stamp[64], v1[64], v2[64];
    qg_redis_counters c0, c1;
    qg_decision d;
    struct timeval tv;
    (void)state;
    need_server();
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "FLUSH",
                                   NULL), 0);
    /* an older quotagate's library (no load instant), one loaded just now
     * by another instance, and a library that is not ours */
    snprintf(lib, sizeof lib, "#!lua name=%s\nredis.register_function("
             "'%s', function() return 1 end)", old_name, old_name);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "LOAD",
                                   lib, NULL), 0);
    gettimeofday(&tv, NULL);
    snprintf(stamp, sizeof stamp, "loaded_ms=%013lld",
             (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    snprintf(lib, sizeof lib, "#!lua name=%s\nredis.register_function{"
             "function_name='%s', description='%s', callback=function() "
             "return 1 end}", fresh_name, fresh_name, stamp);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "LOAD",
                                   lib, NULL), 0);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "LOAD",
        "#!lua name=userlib\nredis.register_function('userfn', "
        "function() return 2 end)", NULL), 0);

    /* instance A (rules u1, a minute's keep) loads its library: the
     * older quotagate's goes, the fresh one and the user's stay */
    g_lib_keep_ms = 60000;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "r1", "a", NULL, 4000, 0, T0_MS, &d), 0);
    await_library(&t, NULL, old_name, 0);
    assert_true(has_library(fresh_name));
    assert_true(has_library("userlib"));
    qg_store_redis_counters(t.rs, &c0);
    assert_int_equal(c0.libraries_deleted, 1);
    {   /* A's own library, by elimination: the one qg_ name left besides
         * the fresh one */
        char all[8192], *p;
        assert_int_equal(redisproc_cmd(&srv, all, sizeof all, "FUNCTION",
                                       "LIST", "LIBRARYNAME", "qg_*", NULL),
                         0);
        v1[0] = 0;
        for (p = all; (p = strstr(p, "qg_")) != NULL; p += 43)
            if (strncmp(p, fresh_name, 43) != 0) {
                snprintf(v1, sizeof v1, "%.43s", p);
                break;
            }
        assert_int_equal(strlen(v1), 43);
        p = strstr(all, "loaded_ms=");
        assert_non_null(p);                 /* its load instant is shown */
    }

    /* instance B (other rules, a keep of 1 ms) loads its own: A's and the
     * "fresh" one are now past B's keep and go; the user's stays */
    usleep(5000);
    {
        qg_rules *r = tst_rules_parse(relayout_v1);
        qg_store *bs;
        qg_engine *be;
        qg_check_req q = {.subject = "u", .request_id = "b-1",
                          .weight_milli = 1000};
        char err[256];
        g_lib_keep_ms = 1;
        bs = redis_store(r);
        assert_non_null(be = qg_engine_new(r, bs));
        assert_int_equal(qg_engine_check(be, &q, T0_MS, &d, err, sizeof err),
                         0);
        assert_int_equal(d.outcome, QG_ALLOW);
        await_library(NULL, be, v1, 0);
        await_library(NULL, be, fresh_name, 0);
        assert_true(has_library("userlib"));
        qg_store_redis_counters(bs, &c1);
        assert_int_equal(c1.libraries_deleted, 2);
        {
            char all[8192], *p;
            assert_int_equal(redisproc_cmd(&srv, all, sizeof all, "FUNCTION",
                                           "LIST", "LIBRARYNAME", "qg_*",
                                           NULL), 0);
            p = strstr(all, "qg_");
            assert_non_null(p);
            snprintf(v2, sizeof v2, "%.43s", p);
        }
        /* A still answers, as the memory store does: "Function not
         * found", its library loaded again; its prune (a minute's keep)
         * leaves B's, loaded just now */
        qg_store_redis_counters(t.rs, &c0);
        assert_int_equal(t_check(&t, "r1", "b", NULL, 4000, 0, T0_MS + 1, &d),
                         0);
        assert_int_equal(d.outcome, QG_ALLOW);
        assert_int_equal(t_check(&t, "r1", "c", NULL, 4000, 0, T0_MS + 2, &d),
                         0);
        assert_int_equal(d.outcome, QG_REJECT);
        for (int i = 0; i < 5; i++)         /* A's prune has run */
            t_usage(&t, "r1", T0_MS + 3, &d);
        qg_store_redis_counters(t.rs, &c1);
        assert_int_equal(c1.script_loads - c0.script_loads, 1);
        assert_int_equal(c1.libraries_deleted, 1);
        assert_true(has_library(v1));
        assert_true(has_library(v2));
        qg_engine_free(be);
        qg_store_free(bs);
    }
    g_lib_keep_ms = 0;
    twin_close(&t);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "FUNCTION", "DELETE",
                                   "userlib", NULL), 0);
}

static void test_flushall(void **state)
{
    static twin t;
    qg_check_req q = {.subject = "r1", .request_id = "after", .weight_milli = 4000};
    qg_decision d;
    char err[256];
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "r1", "a", NULL, 9000, 0, T0_MS, &d), 0);
    assert_int_equal(qg_store_redis_data_lost(t.rs), 0);
    flushall();
    /* noticed on the next decision: refused with QG_ESTATE, nothing
     * admitted, until the counters are rebuilt and the loss accepted */
    assert_int_equal(qg_engine_check(t.re, &q, T0_MS + 1, &d, err, sizeof err),
                     QG_ESTATE);
    assert_int_equal(qg_store_redis_data_lost(t.rs), 1);
    assert_int_equal(qg_engine_check(t.re, &q, T0_MS + 2, &d, err, sizeof err),
                     QG_ESTATE);
    print_message("after FLUSHALL: %s\n", qg_store_redis_error(t.rs));
    {
        /* the rebuild: the ledger's rows restored, then accepted */
        qg_restore_req r = {.subject = "r1", .request_id = "a",
                            .decided_at_ms = T0_MS, .reserved_milli = 9000,
                            .charged_milli = 9000, .headroom_milli = -1};
        assert_int_equal(qg_engine_restore(t.re, &r, err, sizeof err), 0);
    }
    assert_int_equal(qg_store_redis_accept_loss(t.rs), 0);
    assert_int_equal(qg_store_redis_data_lost(t.rs), 0);
    assert_int_equal(qg_engine_check(t.re, &q, T0_MS + 3, &d, err, sizeof err), 0);
    assert_int_equal(d.outcome, QG_REJECT);   /* the rebuilt 9 points count */
    twin_close(&t);
}

static void test_server_gone(void **state)
{
    static twin t;
    redisproc other;
    qg_store *s;
    qg_redis_opts o = {.server_time = 0};
    char err[256];
    (void)state;
    need_server();
    /* nothing listens: the constructor says so */
    assert_null(qg_store_redis_new("redis://127.0.0.1:1", &o, err, sizeof err));
    assert_non_null(strstr(err, "connect"));
    assert_null(qg_store_redis_new("http://x", &o, err, sizeof err));
    assert_null(qg_store_redis_new("redis://h:99999", &o, err, sizeof err));
    /* a server that goes away: QG_ESTORE with a message, no crash */
    assert_int_equal(redisproc_start(&other, NULL), 0);
    s = qg_store_redis_new(redisproc_url(&other), &o, err, sizeof err);
    assert_non_null(s);
    {
        qg_rules *r = tst_rules_parse(unit_rules);
        qg_engine *e = qg_engine_new(r, s);
        qg_check_req q = {.subject = "r1", .request_id = "x", .weight_milli = 1000};
        qg_settle_req sq = {.request_id = "x", .status = QG_SETTLE_COMPLETED,
                            .weight_milli = -1};
        qg_decision d;
        qg_settle_result sr;
        assert_int_equal(qg_engine_check(e, &q, T0_MS, &d, err, sizeof err), 0);
        redisproc_stop(&other);
        assert_int_equal(qg_engine_check(e, &q, T0_MS, &d, err, sizeof err), QG_ESTORE);
        print_message("server gone: %s\n", qg_store_redis_error(s));
        assert_int_equal(qg_engine_settle(e, &sq, T0_MS, &sr, err, sizeof err), QG_ESTORE);
        assert_int_equal(qg_engine_usage(e, "r1", T0_MS, &d), QG_ESTORE);
        assert_int_equal(qg_engine_remembers(e, "x"), 0);
        qg_engine_free(e);
    }
    qg_store_free(s);
    (void)t;
}

static void test_round_trips(void **state)
{
    static twin t;
    qg_redis_counters c0, c1;
    qg_decision d;
    qg_settle_req q;
    (void)state;
    twin_open(&t, unit_rules);
    assert_int_equal(t_check(&t, "r1", "warm", NULL, 100, 0, T0_MS, &d), 0);
    qg_store_redis_counters(t.rs, &c0);
    for (int i = 0; i < 10; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "rt%d", i);
        assert_int_equal(t_check(&t, "r1", rid, NULL, 100, 0, T0_MS + i, &d), 0);
        assert_int_equal(d.outcome, QG_ALLOW);
    }
    qg_store_redis_counters(t.rs, &c1);
    print_message("check: %.2f round trips, %.2f commands\n",
                  (double)(c1.round_trips - c0.round_trips) / 10,
                  (double)(c1.commands - c0.commands) / 10);
    assert_int_equal(c1.round_trips - c0.round_trips, 10);
    c0 = c1;
    memset(&q, 0, sizeof q);
    q.status = QG_SETTLE_COMPLETED;
    q.weight_milli = 50;
    for (int i = 0; i < 10; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "rt%d", i);
        q.request_id = rid;
        q.subject = i < 5 ? "r1" : NULL;
        assert_int_equal(t_settle_req(&t, &q, T0_MS + 100, NULL), 0);
    }
    qg_store_redis_counters(t.rs, &c1);
    print_message("settle: 5 naming the subject and 5 not, all admitted by "
                  "this store: %llu round trips\n",
                  (unsigned long long)(c1.round_trips - c0.round_trips));
    assert_int_equal(c1.round_trips - c0.round_trips, 10);
    {
        /* admitted by another instance: one unnamed settle here GETs the
         * index first (two round trips), a named one needs one, a member
         * of an org too (the engine hands the store the org, whose tag
         * places the reservation: QG_STORE_SETTLE_ORG) */
        qg_rules *r3 = tst_rules_parse(unit_rules);
        qg_store *s2 = redis_store(r3);
        qg_engine *e2 = qg_engine_new(r3, s2);
        qg_settle_result sr;
        char err[256];
        assert_non_null(e2);
        for (int i = 0; i < 6; i++) {
            char rid[16];
            qg_check_req cq = {.subject = i < 4 ? "r1" : "a1",
                               .weight_milli = 100};
            snprintf(rid, sizeof rid, "ot%d", i);
            cq.request_id = rid;
            assert_int_equal(qg_engine_check(e2, &cq, T0_MS + 200 + i, &d,
                                             err, sizeof err), 0);
            assert_int_equal(d.outcome, QG_ALLOW);
        }
        qg_store_redis_counters(t.rs, &c0);
        for (int i = 0; i < 6; i++) {
            char rid[16];
            snprintf(rid, sizeof rid, "ot%d", i);
            q.request_id = rid;
            q.subject = i < 2 ? "r1" : i < 4 ? NULL : "a1";
            assert_int_equal(qg_engine_settle(t.re, &q, T0_MS + 300, &sr,
                                              err, sizeof err), 0);
        }
        qg_store_redis_counters(t.rs, &c1);
        print_message("settle of another instance's admissions: 2 naming the "
                      "subject, 2 not, 2 naming a member of an org: %llu "
                      "round trips\n",
                      (unsigned long long)(c1.round_trips - c0.round_trips));
        assert_int_equal(c1.round_trips - c0.round_trips,
                         2 * 1 + 2 * 2 + 2 * 1);
        qg_engine_free(e2);
        qg_store_free(s2);
    }
    twin_close(&t);
}

/* Checks and settles on a lane are counted in flight from their send
 * until their caller's done has returned, by generation
 * (qg_engine_calls_mark): a reconciliation waits so for the rows of
 * decisions whose replies are still on their way (docs/reconcile.md). */
typedef struct flight {
    qg_engine *e;
    unsigned mark;
    long left_in_done;           /* calls_left seen inside done */
    int done, rc;
} flight;

static void flight_done(void *ud, int rc)
{
    flight *f = ud;
    f->left_in_done = qg_engine_calls_left(f->e, f->mark);
    f->rc = rc;
    f->done = 1;
}

static void test_calls_in_flight(void **state)
{
    static twin t;
    struct event_base *base;
    qg_store_lane *lane;
    qg_check_req q = {.subject = "r1", .weight_milli = 100};
    qg_settle_req sq;
    qg_decision da, db;
    qg_settle_result sr;
    flight a = {0}, b = {0}, c = {0};
    char err[256], ea[256], eb[256], ec[256];
    unsigned m;
    (void)state;
    twin_open(&t, unit_rules);
    assert_non_null(base = event_base_new());
    lane = qg_store_lane_new(t.rs, base, err, sizeof err);
    if (!lane)
        fail_msg("lane: %s", err);
    qg_engine_calls_mark(t.re);
    q.request_id = "fa";
    a.e = b.e = c.e = t.re;
    assert_int_equal(qg_engine_check_async(t.re, lane, &q, T0_MS, &da, ea,
                                           sizeof ea, flight_done, &a),
                     QG_PENDING);
    m = qg_engine_calls_mark(t.re);
    a.mark = b.mark = c.mark = m;
    /* a is of the generation before the mark; b, sent after it, is not */
    assert_int_equal(qg_engine_calls_left(t.re, m), 1);
    q.request_id = "fb";
    assert_int_equal(qg_engine_check_async(t.re, lane, &q, T0_MS, &db, eb,
                                           sizeof eb, flight_done, &b),
                     QG_PENDING);
    assert_int_equal(qg_engine_calls_left(t.re, m), 1);
    assert_int_equal(qg_engine_calls_left(t.re, m + 1), 1);
    /* a call refused before it is sent is never counted */
    q.subject = "nobody";
    q.request_id = "fx";
    assert_int_equal(qg_engine_check_async(t.re, lane, &q, T0_MS, &da, ea,
                                           sizeof ea, flight_done, &a),
                     QG_ENOSUBJECT);
    assert_int_equal(qg_engine_calls_left(t.re, m + 1), 1);
    for (int i = 0; i < 5000 && !(a.done && b.done); i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(a.done && b.done);
    assert_int_equal(a.rc, QG_OK);
    assert_int_equal(b.rc, QG_OK);
    /* still counted while its done ran: its row is queued there */
    assert_int_equal(a.left_in_done, 1);
    assert_int_equal(qg_engine_calls_left(t.re, m), 0);
    assert_int_equal(qg_engine_calls_left(t.re, m + 1), 0);
    /* a settle too */
    memset(&sq, 0, sizeof sq);
    sq.request_id = "fa";
    sq.status = QG_SETTLE_COMPLETED;
    sq.weight_milli = 50;
    m = qg_engine_calls_mark(t.re);
    assert_int_equal(qg_engine_settle_async(t.re, lane, &sq, T0_MS + 10, &sr,
                                            ec, sizeof ec, flight_done, &c),
                     QG_PENDING);
    c.mark = qg_engine_calls_mark(t.re);
    assert_int_equal(qg_engine_calls_left(t.re, c.mark), 1);
    for (int i = 0; i < 5000 && !c.done; i++)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(c.done);
    assert_int_equal(c.rc, QG_OK);
    assert_int_equal(c.left_in_done, 1);
    assert_int_equal(qg_engine_calls_left(t.re, c.mark), 0);
    qg_store_lane_free(t.rs, lane);
    event_base_free(base);
    twin_close(&t);
}

/* ------------------------------------------------------------- pure */

/* The arguments' text, written by hand (redis_args.c), equals printf's;
 * the arena keeps every argument intact as it grows and moves. */
static void test_argument_text(void **state)
{
    static const int64_t nums[] = {0, 7, -1, 10, -10, 999999, 1000000,
                                   INT64_MAX, INT64_MIN, INT64_MIN + 1,
                                   1772445600000LL};
    char got[40], want[40], key[QG__RS_KEY_MAX], big[200];
    qg_key k = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
    qg__rs_args a;
    (void)state;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        size_t n = qg__rs_dec(got, nums[i]);
        snprintf(want, sizeof want, "%lld", (long long)nums[i]);
        assert_string_equal(got, want);
        assert_int_equal(n, strlen(want));
    }
    qg__rs_hex(k, got);
    assert_string_equal(got, "0123456789abcdeffedcba9876543210");
    qg__rs_hex_lo(k, got);
    assert_string_equal(got, "fedcba9876543210");
    qg__rs_key_state("tag", "ent", key);
    assert_string_equal(key, "qg:{tag}:e:ent");
    qg__rs_key_log("tag", "ent", key);
    assert_string_equal(key, "qg:{tag}:l:ent");
    qg__rs_key_rec("tag", "rid", key);
    assert_string_equal(key, "qg:{tag}:q:rid");
    qg__rs_key_index("rid", key);
    assert_string_equal(key, "qg:rid:{rid}");
    /* cut at the bound, as snprintf cut */
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    qg__rs_key_state("tag", big, key);
    assert_int_equal(strlen(key), QG__RS_KEY_MAX - 1);
    assert_memory_equal(key, "qg:{tag}:e:xxx", 14);

    qg__rs_args_init(&a);
    for (int round = 0; round < 2; round++) {   /* again after a reset */
        for (int i = 0; i < 300; i++) {
            if (i % 3 == 0)
                qg__rs_addi(&a, (int64_t)i * -1000003);
            else
                qg__rs_add(&a, big, (size_t)(i % 190));
        }
        assert_false(a.failed);
        assert_int_equal(a.argc, 300);
        for (int i = 0; i < 300; i++) {
            if (i % 3 == 0) {
                snprintf(want, sizeof want, "%lld", (long long)i * -1000003);
                assert_string_equal(a.argv[i], want);
            } else {
                assert_int_equal(a.len[i], (size_t)(i % 190));
                assert_memory_equal(a.argv[i], big, a.len[i]);
                assert_int_equal(a.argv[i][a.len[i]], 0);
            }
        }
        qg__rs_args_reset(&a);
    }
    qg__rs_args_free(&a);
}

static void test_reply_decoding(void **state)
{
    qg_rules *r = tst_rules_parse(unit_rules);
    int vrc;
    char verr[200];
    qg__rs_version *v = qg__rs_version_new(r, NULL, &vrc, verr, sizeof verr);
    qg_decision d;
    qg_settle_result sr;
    qg__rs_result res;
    qg__rs_place pl;
    qg__rs_item ok[] = {{1, 0, "ok", 2}, {0, 2, 0, 0}, {0, 0, 0, 0},
                        {0, 5000, 0, 0}, {0, 77, 0, 0}, {0, 10, 0, 0},
                        {0, 0, 0, 0}, {0, -1, 0, 0}, {0, 0, 0, 0},
                        {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0},
                        {0, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 0, 0},
                        {0, 1, 0, 0}, {0, 10000, 0, 0},
                        {0, 9000, 0, 0}, {0, 1000, 0, 0}, {0, 99, 0, 0},
                        {0, 1, 0, 0}, {0, 99, 0, 0}, {0, 10000, 0, 0},
                        {0, 4, 0, 0}, {0, 0, 0, 0}, {0, 1, 0, 0},
                        {0, 1, 0, 0}, {0, 2, 0, 0}, {1, 0, "t", 1},
                        {1, 0, "5", 1}};
    (void)state;
    memset(&d, 0, sizeof d);
    qg__rs_decode_check(ok, 30, v, &d, &res);
    assert_int_equal(res.kind, QG__RS_OK);
    assert_int_equal(res.nundo, 1);
    assert_int_equal(res.mv, 4);
    assert_int_equal(d.outcome, QG_REJECT);
    assert_int_equal(d.retry_after_ms, 10);
    assert_string_equal(d.views[0].name, "burst");
    assert_int_equal(d.recovery[0][0].at_ms, 99);
    /* every truncation, and a string where a number belongs, is BAD */
    for (int n = 1; n < 30; n++) {
        qg__rs_decode_check(ok, n, v, &d, &res);
        assert_int_equal(res.kind, QG__RS_BAD);
    }
    ok[5].is_str = 1;
    ok[5].s = "x";
    qg__rs_decode_check(ok, 30, v, &d, &res);
    assert_int_equal(res.kind, QG__RS_BAD);
    {
        qg__rs_item junk[] = {{1, 0, "weird", 5}};
        qg__rs_item period[] = {{1, 0, "period", 6}, {0, 5, 0, 0}, {0, 6, 0, 0}};
        qg__rs_item moved[] = {{1, 0, "moved", 5},
                               {1, 0, "0123456789abcdef0123456789abcdef", 32},
                               {1, 0, "-", 1}};
        qg__rs_decode_check(junk, 1, v, &d, &res);
        assert_int_equal(res.kind, QG__RS_BAD);
        qg__rs_decode_check(period, 3, v, &d, &res);
        assert_int_equal(res.kind, QG__RS_PERIOD);
        assert_int_equal(res.need_now, 6);
        qg__rs_decode_settle(moved, 3, &sr, &res);
        assert_int_equal(res.kind, QG__RS_MOVED);
        assert_string_equal(res.moved.tag, "0123456789abcdef0123456789abcdef");
        assert_string_equal(res.moved.org, "-");
        qg__rs_decode_settle(moved, 2, &sr, &res);
        assert_int_equal(res.kind, QG__RS_BAD);
    }
    assert_int_equal(qg__rs_index_parse("zz", 2, &pl), -1);
    assert_int_equal(qg__rs_index_parse(
        "0123456789abcdef0123456789abcdefffffffffffffffff0123456789abcdef",
        64, &pl), 0);
    assert_string_equal(pl.org, "0123456789abcdef0123456789abcdef");
    qg__rs_version_free(v);
    qg_rules_free(r);
}

/* bignum.lua against __int128: products, sums, differences and
 * divisions of random values up to 2^53, run in the real server. */
static void test_bignum(void **state)
{
    FILE *f = fopen("src/store/redis/bignum.lua", "r");
    static char lib[16384];
    char script[20000];
    size_t n;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    struct timeval tv = {2, 0};
    redisContext *c;
    (void)state;
    need_server();
    assert_non_null(f);
    n = fread(lib, 1, sizeof lib - 1, f);
    fclose(f);
    lib[n] = 0;
    snprintf(script, sizeof script, "%s\n"
             "local a, b, c, d = tonumber(ARGV[1]), tonumber(ARGV[2]), "
             "tonumber(ARGV[3]), tonumber(ARGV[4])\n"
             "local p = BN.add(BN.mul(BN.new(a), BN.new(b)), BN.new(c))\n"
             "local q, r = BN.divmod(p, d)\n"
             "local s = BN.fromdec(BN.todec(p))\n"
             "return {BN.todec(p), q == math.huge and 'huge' or string.format('%%d', q), "
             "string.format('%%d', r), BN.cmp(s, p), "
             "string.format('%%d', BN.ceil_diff_div(BN.new(c), BN.new(a), d))}\n",
             lib);
    assert_non_null(c = redisConnectWithTimeout("127.0.0.1", srv.port, tv));
    for (int i = 0; i < 400; i++) {
        uint64_t v[4];
        char s[4][32], want[48];
        redisReply *r;
        unsigned __int128 p, q;
        for (int k = 0; k < 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v[k] = x % (1ULL << (k == 3 ? 1 + (x >> 58) % 52 : (x >> 58) % 54));
        }
        if (v[3] == 0)
            v[3] = 1;
        if (i < 4) {          /* the edges: 0, 2^53 - 1 */
            v[0] = i & 1 ? (1ULL << 53) - 1 : 0;
            v[1] = (1ULL << 53) - 1;
            v[2] = (1ULL << 53) - 1;
            v[3] = i & 2 ? (1ULL << 53) - 1 : 3;
        }
        for (int k = 0; k < 4; k++)
            snprintf(s[k], sizeof s[k], "%llu", (unsigned long long)v[k]);
        r = redisCommand(c, "EVAL %s 0 %s %s %s %s", script, s[0], s[1], s[2], s[3]);
        assert_non_null(r);
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 5)
            fail_msg("bignum script: %s", r->type == REDIS_REPLY_ERROR ? r->str : "?");
        p = (unsigned __int128)v[0] * v[1] + v[2];
        q = p / v[3];
        {
            char dec[48];
            int k = 47;
            unsigned __int128 t = p;
            dec[k] = 0;
            do {
                dec[--k] = (char)('0' + (int)(t % 10));
                t /= 10;
            } while (t);
            snprintf(want, sizeof want, "%s", dec + k);
        }
        assert_string_equal(r->element[0]->str, want);
        if (q >= (1ULL << 53)) {
            assert_string_equal(r->element[1]->str, "huge");
        } else {
            char qs[32], rs[32];
            snprintf(qs, sizeof qs, "%llu", (unsigned long long)q);
            snprintf(rs, sizeof rs, "%llu", (unsigned long long)(p % v[3]));
            assert_string_equal(r->element[1]->str, qs);
            assert_string_equal(r->element[2]->str, rs);
        }
        assert_int_equal(r->element[3]->integer, 0);
        {
            /* ceil((c - a) / d), either sign */
            __int128 diff = (__int128)v[2] - (__int128)v[0];
            __int128 cq = diff >= 0 ? (diff + (__int128)v[3] - 1) / (__int128)v[3]
                                    : -((-diff) / (__int128)v[3]);
            char cs[32];
            snprintf(cs, sizeof cs, "%lld", (long long)cq);
            assert_string_equal(r->element[4]->str, cs);
        }
        freeReplyObject(r);
    }
    redisFree(c);
}

/* ------------------------------------------------------- differential */

static const char diff_exact[] =
    "version: \"diff-exact\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 4 }\n"
    "plans:\n"
    "  basic:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 40, max_entries: 1000000 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 90 }\n"
    "      - { name: sess, type: session, length: 2h, limit: 30 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 4, burst: 6, unit: requests }\n"
    "      - { name: wrate, type: rate, per: 1h, limit: 25, burst: 30 }\n"
    "      - { name: large_weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"Europe/Berlin\", limit: 150, models: [large] }\n"
    "      - { name: monthly, type: calendar, every: month, anchor: billing, tz: \"UTC\", limit: 1500 }\n"
    "    concurrency: 3\n"
    "    lease_ttl: 10m\n"
    "  pro:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 35, max_entries: 1000000 }\n"
    "      - { name: light_5h, type: rolling, length: 5h, limit: 30, models: [light], max_entries: 1000000 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 09:30\", tz: \"Europe/Berlin\", limit: 450 }\n"
    "      - { name: sess, type: session, length: 30m, limit: 25, models: [large] }\n"
    "      - { name: rps, type: rate, per: 10s, limit: 1, burst: 3, unit: requests }\n"
    "    concurrency: 2\n"
    "  pay:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 20, max_entries: 1000000 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 50 }\n"
    "      - { name: sess, type: session, length: 1h, limit: 30, overage: { policy: reject } }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 6, unit: requests }\n"
    "    concurrency: 2\n"
    "    lease_ttl: 3m\n"
    "    overage: { policy: payg, price_per_unit: 0.013, spending_cap: { usd_month: 2 } }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 3h, limit: 150, max_entries: 1000000 }\n"
    "    concurrency: 5\n"
    "    lease_ttl: 5m\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_daily, type: calendar, every: day, at: \"06:00\", tz: \"America/New_York\", limit: 250 }\n"
    "      - { name: org_rate, type: rate, per: 1h, limit: 100 }\n"
    "default_plan: basic\n";

static const char diff_bounded[] =
    "version: \"diff-b16\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 4 }\n"
    "plans:\n"
    "  basic:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 40, max_entries: 16 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 200 }\n"
    "    concurrency: 4\n"
    "  pro:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 60, max_entries: 16 }\n"
    "      - { name: large_1h, type: rolling, length: 1h, limit: 30, max_entries: 16, models: [large] }\n"
    "  pay:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 20, max_entries: 16 }\n"
    "    overage: { policy: payg, price_per_unit: 0.02 }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 2h, limit: 120, max_entries: 16 }\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 30m, limit: 60, max_entries: 16 }\n"
    "default_plan: basic\n";

static const char diff_precision[] =
    "version: \"diff-p1m\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 4 }\n"
    "plans:\n"
    "  basic:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 40, precision: 1m }\n"
    "      - { name: short, type: rolling, length: 10m, limit: 12, precision: 1m }\n"
    "    concurrency: 3\n"
    "  pro:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 35, precision: 1m }\n"
    "      - { name: exact, type: rolling, length: 30m, limit: 20, max_entries: 1000000 }\n"
    "  pay:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 20, precision: 1m }\n"
    "    overage: { policy: payg, price_per_unit: 0.02, spending_cap: { usd_month: 1 } }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 3h, limit: 150, precision: 1m }\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 1h, limit: 70, precision: 1m }\n"
    "default_plan: basic\n";

#define NSUBJ 12
#define RECENT 64

static uint64_t rng;

static uint64_t rnd(void)             /* splitmix64 */
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t rnd_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static int chance(int tenths) { return (int)(rnd() % 1000) < tenths; }

static int64_t time_step(void)
{
    uint64_t r = rnd() % 1000;
    if (r < 300)
        return 0;
    if (r < 650)
        return rnd_range(1, 1500);
    if (r < 930)
        return rnd_range(1500, 60000);
    if (r < 990)
        return rnd_range(60000, 1800000);
    return rnd_range(1800000, 6 * HOUR_MS);
}

typedef struct pending {
    char rid[32];
    int model;
    int64_t reserved, in, out;
    int subj;
} pending;

typedef struct diff {
    twin t;
    char subj[NSUBJ + 1][16];
    char recent[RECENT][32];
    int nrecent;
    pending pend[48];
    int npend;
    char settled[RECENT][32];
    int nsettled;
    long checks, allow, reject, never, replay, einval, settles, late,
         usage, restores, known;
} diff;

static void remember(char ring[RECENT][32], int *n, const char *rid)
{
    snprintf(ring[*n % RECENT], 32, "%s", rid);
    (*n)++;
}

static const char *pick(char ring[RECENT][32], int n)
{
    return ring[rnd() % (uint64_t)(n < RECENT ? n : RECENT)];
}

static void diff_subjects(diff *h)
{
    static const char *plans[] = {"basic", "pro", "pay"};
    for (int i = 0; i < NSUBJ; i++) {
        const char *org = i % 4 == 3 ? NULL : i % 2 ? "globex" : "acme";
        int64_t anchor = i % 5 == 1 ? ANCHOR_MS + i * HOUR_MS : 0;
        snprintf(h->subj[i], sizeof h->subj[i], "s%d", i);
        set_subject(&h->t, h->subj[i], plans[i % 3], org, anchor);
    }
    snprintf(h->subj[NSUBJ], sizeof h->subj[NSUBJ], "walkin");
}

static void diff_check(diff *h, long op, int64_t now)
{
    char rid[32];
    int si = chance(100) ? NSUBJ : (int)(rnd() % NSUBJ);
    const char *model = NULL;
    int64_t a, b = 0;
    qg_decision d;
    int rc;

    if (h->nrecent && chance(300))
        snprintf(rid, sizeof rid, "%s", pick(h->recent, h->nrecent));
    else
        snprintf(rid, sizeof rid, "r%ld", op);
    if (chance(450)) {
        uint64_t r = rnd() % 1000;
        a = r < 30 ? 0 : r < 40 ? rnd_range(41000, 400000) : rnd_range(1, 8000);
    } else {
        int m = (int)(rnd() % 2);
        model = h->t.rules->models[m].name;
        a = rnd_range(0, 3000);
        b = chance(100) ? -1 : rnd_range(0, 1500);
    }
    rc = t_check(&h->t, h->subj[si], rid, model, a, b, now, &d);
    h->checks++;
    if (rc != QG_OK) {
        h->einval++;
        return;
    }
    if (d.outcome == QG_ALLOW && d.replayed) {
        h->replay++;
    } else if (d.outcome == QG_ALLOW) {
        pending *p;
        h->allow++;
        if (h->npend == (int)(sizeof h->pend / sizeof h->pend[0])) {
            memmove(&h->pend[0], &h->pend[1], (size_t)--h->npend * sizeof *h->pend);
        }
        p = &h->pend[h->npend++];
        snprintf(p->rid, sizeof p->rid, "%s", rid);
        p->model = model ? qg_rules_find_model(h->t.rules, model) : -1;
        p->reserved = d.weight_milli;
        p->in = a;
        p->out = b < 0 ? QG_DEFAULT_OUTPUT_ESTIMATE : b;
        p->subj = si;
    } else if (d.outcome == QG_REJECT) {
        h->reject++;
    } else {
        h->never++;
    }
    remember(h->recent, &h->nrecent, rid);
}

static void diff_settle(diff *h, long op, int64_t now)
{
    qg_settle_req q;
    qg_settle_result sr;
    char rid[32];
    pending p;
    int k;
    memset(&q, 0, sizeof q);
    if (h->nsettled && chance(80)) {              /* settled twice */
        q.request_id = pick(h->settled, h->nsettled);
        q.status = QG_SETTLE_COMPLETED;
        q.weight_milli = 1000;
        t_settle_req(&h->t, &q, now, NULL);
        return;
    }
    if (!h->npend || chance(20)) {                /* an unknown id */
        snprintf(rid, sizeof rid, "nobody-%ld", op);
        q.request_id = rid;
        q.status = QG_SETTLE_COMPLETED;
        q.weight_milli = -1;
        q.subject = chance(500) ? h->subj[rnd() % NSUBJ] : NULL;
        assert_int_equal(t_settle_req(&h->t, &q, now, NULL), QG_ENOTFOUND);
        return;
    }
    k = rnd() % 4 < 2 ? h->npend - 1 : (int)(rnd() % (uint64_t)h->npend);
    p = h->pend[k];
    memmove(&h->pend[k], &h->pend[k + 1], (size_t)(h->npend - k - 1) * sizeof *h->pend);
    h->npend--;
    q.request_id = p.rid;
    q.status = (qg_settle_status)rnd_range(1, 3);
    if (p.model < 0) {
        uint64_t how = rnd() % 4;
        q.weight_milli = how == 0 ? (p.reserved ? rnd_range(0, p.reserved - 1) : 0)
                         : how == 1 ? p.reserved
                         : how == 2 ? p.reserved + rnd_range(1, 20000) : -1;
    } else {
        uint64_t how = rnd() % 3;
        q.input_tokens = p.in;
        q.output_tokens = how == 0 ? (p.out ? rnd_range(0, p.out - 1) : 0)
                          : how == 1 ? p.out : p.out + rnd_range(1, 4000);
        q.weight_milli = -1;
    }
    q.no_charge = chance(50);
    /* named: its own subject, rarely another one (refused) */
    if (chance(400))
        q.subject = h->subj[p.subj];
    else if (chance(30))
        q.subject = h->subj[rnd() % NSUBJ];
    if (t_settle_req(&h->t, &q, now, &sr) == QG_OK) {
        h->settles++;
        h->late += sr.late;
        remember(h->settled, &h->nsettled, p.rid);
    } else if (h->npend < (int)(sizeof h->pend / sizeof h->pend[0])) {
        h->pend[h->npend++] = p;   /* refused (another subject): later */
    }
}

static void diff_restore(diff *h, long op, int64_t now)
{
    qg_restore_req q;
    char rid[32];
    int si = (int)(rnd() % NSUBJ);
    memset(&q, 0, sizeof q);
    if (h->nrecent && chance(200))
        snprintf(rid, sizeof rid, "%s", pick(h->recent, h->nrecent));
    else
        snprintf(rid, sizeof rid, "x%ld", op);
    q.subject = h->subj[si];
    q.request_id = rid;
    q.model = chance(300) ? h->t.rules->models[rnd() % 2].name : NULL;
    q.decided_at_ms = now - rnd_range(0, 120000);
    q.reserved_milli = rnd_range(0, 6000);
    q.settled = chance(500);
    q.charged_milli = q.settled ? rnd_range(0, 8000) : q.reserved_milli;
    q.status = QG_SETTLE_COMPLETED;
    q.headroom_milli = -1;
    if (si % 3 == 2 && chance(500)) {          /* a payg row */
        q.headroom_milli = rnd_range(0, q.reserved_milli);
        q.overage_price_micro = 13000;
        q.overage_cost_micro = rnd_range(0, 100000);
    }
    q.charge_only = chance(150);
    t_restore(&h->t, &q);
    h->restores++;
}

/* Bytes Redis holds (MEMORY USAGE of every key, the epoch aside): window
 * state (s: and z: keys), request-id records (q:) and their index (rid:),
 * with the number of entities and records. */
typedef struct redis_mem {
    size_t state, records, index;
    long entities, nrecords, nindex;
} redis_mem;

static void redis_memory(redis_mem *m)
{
    redisContext *c;
    struct timeval tv = {5, 0};
    char cursor[32] = "0";
    memset(m, 0, sizeof *m);
    c = redisConnectWithTimeout("127.0.0.1", srv.port, tv);
    assert_non_null(c);
    do {
        redisReply *r = redisCommand(c, "SCAN %s COUNT 1000", cursor);
        assert_non_null(r);
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            const char *k = r->element[1]->element[i]->str;
            redisReply *u = redisCommand(c, "MEMORY USAGE %s SAMPLES 0", k);
            size_t b = u && u->type == REDIS_REPLY_INTEGER ? (size_t)u->integer : 0;
            if (strstr(k, "}:e:")) {
                m->state += b;
                m->entities++;
            } else if (strstr(k, "}:l:")) {
                m->state += b;
            } else if (strstr(k, "}:q:")) {
                m->records += b;
                m->nrecords++;
            } else if (strncmp(k, "qg:rid:", 7) == 0) {
                m->index += b;
                m->nindex++;
            }
            if (u)
                freeReplyObject(u);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    redisFree(c);
}

static long env_long(const char *name, long dflt)
{
    const char *e = getenv(name);
    long v = e ? strtol(e, NULL, 0) : 0;
    return v > 0 ? v : dflt;
}

static void run_diff(const char *text, const char *label, uint64_t seed,
                     long dflt_ops, int report_memory)
{
    static diff h;
    long nops = env_long("QG_REDIS_DIFF_OPS", dflt_ops);
    int64_t now;
    qg_redis_counters c0, c1;
    const char *s = getenv("QG_REDIS_DIFF_SEED");
    long paranoid = env_long("QG_REDIS_DIFF_PARANOID", 0);
    long paranoid_from = env_long("QG_REDIS_DIFF_PARANOID_FROM", nops);

    memset(&h, 0, sizeof h);
    if (s)
        seed ^= strtoull(s, NULL, 0);
    rng = seed;
    twin_open(&h.t, text);
    diff_subjects(&h);
    now = T0_MS + rnd_range(0, 40 * DAY_MS);
    qg_store_redis_counters(h.t.rs, &c0);
    g_trace = getenv("QG_REDIS_DIFF_TRACE") != NULL;
    for (long op = 0; op < nops; op++) {
        uint64_t r = rnd() % 1000;
        g_op = op;
        now += time_step();
        if (r < 700) {
            diff_check(&h, op, now);
        } else if (r < 920) {
            diff_settle(&h, op, now);
        } else if (r < 960) {
            t_usage(&h.t, h.subj[rnd() % (NSUBJ + 1)], now, NULL);
            h.usage++;
        } else if (r < 985) {
            diff_restore(&h, op, now);
        } else {
            if (h.nrecent)
                t_known(&h.t, pick(h.recent, h.nrecent));
            h.known++;
        }
        if (paranoid && (op % paranoid == 0 || op >= paranoid_from)) {
            /* QG_REDIS_DIFF_PARANOID: every subject's views after every
             * operation, to find where two states first part */
            for (int i = 0; i <= NSUBJ; i++)
                t_usage(&h.t, h.subj[i], now, NULL);
        }
    }
    g_op = -1;
    qg_store_redis_counters(h.t.rs, &c1);
    print_message("%s: %ld ops, seed 0x%llx, over %lld h: %ld checks (%ld "
                  "allowed, %ld refused, %ld never, %ld replayed, %ld "
                  "refused ids), %ld settles (%ld late), %ld usage, %ld "
                  "restores, %ld known; Redis: %.2f round trips and %.2f "
                  "commands per call, %llu voids (%llu by rollback), %llu "
                  "lookups, %llu period retries, %llu script loads\n",
                  label, nops, (unsigned long long)seed,
                  (long long)((now - T0_MS) / HOUR_MS), h.checks, h.allow,
                  h.reject, h.never, h.replay, h.einval, h.settles, h.late,
                  h.usage, h.restores, h.known,
                  (double)(c1.round_trips - c0.round_trips) / (double)nops,
                  (double)(c1.commands - c0.commands) / (double)nops,
                  (unsigned long long)(c1.voids - c0.voids),
                  (unsigned long long)(c1.void_rollbacks - c0.void_rollbacks),
                  (unsigned long long)(c1.lookups - c0.lookups),
                  (unsigned long long)(c1.period_retries - c0.period_retries),
                  (unsigned long long)(c1.script_loads - c0.script_loads));
    assert_true(h.allow > 0 && h.reject > 0 && h.never > 0 && h.replay > 0);
    if (getenv("QG_REDIS_DIFF_STATS")) {
        static char st[65536];
        const char *e;
        redisproc_cmd(&srv, st, sizeof st, "INFO", "commandstats", NULL);
        if ((e = strstr(st, "cmdstat_evalsha:")) != NULL)
            print_message("%s: %.*s\n", label, (int)strcspn(e, "\r\n"), e);
        redisproc_cmd(&srv, st, sizeof st, "CONFIG", "RESETSTAT", NULL);
    }
    if (report_memory) {
        redis_mem m;
        redis_memory(&m);
        print_message("%s: Redis holds %zu bytes of window state for %ld "
                      "entities (members and orgs), %zu bytes in %ld "
                      "request-id records and %zu in %ld index keys\n",
                      label, m.state, m.entities, m.records, m.nrecords,
                      m.index, m.nindex);
    }
    twin_close(&h.t);
}

static void test_diff_exact(void **state)
{
    (void)state;
    need_server();
    run_diff(diff_exact, "exact", 0x5eedd001ULL, DIFF_OPS, 1);
}

static void test_diff_bounded_entries(void **state)
{
    (void)state;
    need_server();
    run_diff(diff_bounded, "max_entries 16", 0x5eedd002ULL, DIFF_OPS / 3, 0);
}

static void test_diff_bounded_precision(void **state)
{
    (void)state;
    need_server();
    run_diff(diff_precision, "precision 1m", 0x5eedd003ULL, DIFF_OPS / 3, 0);
}

/* The exact-mode differential through EVALSHA: a server where FCALL may
 * not be used (an ACL here; Redis < 7 has no FCALL) makes the store fall
 * back to the script, the same code run as its body at every call. */
static long evalsha_calls(void)
{
    static char buf[32768];
    const char *p;
    if (redisproc_cmd(&srv, buf, sizeof buf, "INFO", "commandstats", NULL) != 0 ||
        !(p = strstr(buf, "cmdstat_evalsha:calls=")))
        return 0;
    return strtol(p + 22, NULL, 10);
}

static void test_diff_evalsha(void **state)
{
    char out[64];
    long before;
    (void)state;
    need_server();
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "ACL", "SETUSER",
                                   "default", "-fcall", NULL), 0);
    before = evalsha_calls();
    run_diff(diff_exact, "exact through EVALSHA", 0x5eedd005ULL, DIFF_OPS / 3, 0);
    assert_int_equal(redisproc_cmd(&srv, out, sizeof out, "ACL", "SETUSER",
                                   "default", "+@all", NULL), 0);
    /* every script call went through EVALSHA (the claims' compare-and-set
     * are EVALSHAs too, so at least one per check) */
    if (evalsha_calls() - before < DIFF_OPS / 6)
        fail_msg("only %ld EVALSHA calls: the store did not fall back",
                 evalsha_calls() - before);
}

/* The same differential over a Redis Cluster of three masters: a
 * decision's keys on the master of its tag's slot, its request id's index
 * on the master of the id's, so one check talks to two nodes at once. */
static void test_diff_cluster(void **state)
{
    static rediscluster c;
    (void)state;
    need_server();
    if (rediscluster_start(&c) != 0)
        fail_msg("cluster: %s", c.why);
    snprintf(g_url, sizeof g_url, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d",
             c.node[0].port, c.node[1].port);
    g_cluster = &c;
    run_diff(diff_exact, "cluster", 0x5eedd004ULL, DIFF_OPS / 2, 0);
    g_cluster = NULL;
    rediscluster_stop(&c);
}

/* Memory per active subject: 1000 members in 100 orgs on a plan with
 * every window type, each with 4 settled requests a minute apart, and
 * the MEMORY USAGE of it all (docs/redis-store.md reports the figures). */
static void test_memory_per_subject(void **state)
{
    static twin t;
    static char text[16384];
    size_t n;
    redis_mem m;
    (void)state;
    n = (size_t)snprintf(text, sizeof text,
        "version: \"mem\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n"
        "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 4 }\n"
        "plans:\n  p:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 5h, limit: 400 }\n"
        "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 900 }\n"
        "      - { name: sess, type: session, length: 5h, limit: 300 }\n"
        "      - { name: rpm, type: rate, per: 1m, limit: 10, unit: requests }\n"
        "      - { name: monthly, type: calendar, every: month, anchor: billing, tz: \"UTC\", limit: 15000 }\n"
        "    concurrency: 4\n"
        "orgs:\n");
    for (int o = 0; o < 100; o++)
        n += (size_t)snprintf(text + n, sizeof text - n,
            "  o%d:\n    windows:\n"
            "      - { name: org_burst, type: rolling, length: 5h, limit: 100000 }\n"
            "    concurrency: 50\n", o);
    twin_open(&t, text);
    for (int i = 0; i < 1000; i++) {
        char name[16], org[16];
        snprintf(name, sizeof name, "m%d", i);
        snprintf(org, sizeof org, "o%d", i % 100);
        assert_int_equal(qg_engine_set_subject(t.re, name, "p", org, 0, NULL, 0), 0);
        for (int k = 0; k < 4; k++) {
            char rid[32];
            qg_check_req q = {.subject = name, .request_id = rid,
                              .model = "large", .input_tokens = 300,
                              .max_output_tokens = 200};
            qg_settle_req sq = {.request_id = rid, .status = QG_SETTLE_COMPLETED,
                                .input_tokens = 300, .output_tokens = 150,
                                .weight_milli = -1, .subject = name};
            qg_decision d;
            qg_settle_result sr;
            int64_t at = T0_MS + k * MIN_MS + i;
            snprintf(rid, sizeof rid, "mem-%d-%d", i, k);
            assert_int_equal(qg_engine_check(t.re, &q, at, &d, NULL, 0), 0);
            assert_int_equal(d.outcome, QG_ALLOW);
            assert_int_equal(qg_engine_settle(t.re, &sq, at + 500, &sr, NULL, 0), 0);
        }
    }
    redis_memory(&m);
    print_message("memory: 1000 members in 100 orgs, 4 settled requests each: "
                  "%zu bytes of window state in %ld entities (%zu per member, "
                  "its org's share included); %zu bytes in %ld request-id "
                  "records (%zu each) and %zu in %ld index keys (%zu each)\n",
                  m.state, m.entities, m.state / 1000, m.records, m.nrecords,
                  m.nrecords ? m.records / (size_t)m.nrecords : 0, m.index,
                  m.nindex, m.nindex ? m.index / (size_t)m.nindex : 0);
    assert_int_equal(m.entities, 1100);
    assert_int_equal(m.nrecords, 4000);
    twin_close(&t);
}

/* Decisions at Redis's clock (server_time, the default for serve): the
 * engine's instant is only the estimate C computes calendar periods and
 * the payg cap period for.  An estimate days off (an instance whose clock
 * is wrong) costs one retry and changes nothing: the decision is made at
 * Redis's instant. */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_server_time(void **state)
{
    qg_rules *r;
    qg_store *s;
    qg_engine *e;
    qg_redis_opts o = {.server_time = 1};
    qg_redis_counters c0, c1;
    qg_decision d;
    char err[256];
    int64_t now = wall_ms();
    (void)state;
    need_server();
    flushall();
    r = tst_rules_parse(unit_rules);
    o.rules = r;
    assert_non_null(s = qg_store_redis_new(redisproc_url(&srv), &o, err, sizeof err));
    assert_non_null(e = qg_engine_new(r, s));
    qg_store_redis_counters(s, &c0);
    {
        /* an estimate three days behind, on a window with no period yet:
         * the periods C computed do not hold Redis's instant: one retry */
        qg_check_req q = {.subject = "c1", .request_id = "t1", .weight_milli = 1000};
        assert_int_equal(qg_engine_check(e, &q, now - 3 * DAY_MS, &d, err, sizeof err), 0);
        assert_int_equal(d.outcome, QG_ALLOW);
        assert_true(d.decided_at_ms >= now - 5000 && d.decided_at_ms <= now + 5000);
    }
    {
        /* once the period is known, the estimate does not matter */
        qg_check_req q = {.subject = "c1", .request_id = "t2", .weight_milli = 1000};
        assert_int_equal(qg_engine_check(e, &q, now - 3 * DAY_MS, &d, err, sizeof err), 0);
        assert_int_equal(d.outcome, QG_ALLOW);
        assert_true(d.decided_at_ms >= now - 5000 && d.decided_at_ms <= now + 5000);
        assert_int_equal(view_of(&d, "daily")->used_milli, 2000);
        assert_true(view_of(&d, "daily")->reset_at_ms > d.decided_at_ms);
    }
    {
        /* payg: a cap period 40 days off is recomputed at Redis's instant */
        qg_check_req q = {.subject = "p1", .request_id = "t3", .weight_milli = 12000};
        assert_int_equal(qg_engine_check(e, &q, now - 40 * DAY_MS, &d, err, sizeof err), 0);
        assert_int_equal(d.outcome, QG_ALLOW);
        assert_int_equal(d.overage_milli, 2000);
        assert_int_equal(d.spent_micro, 20000);
        assert_true(d.decided_at_ms >= now - 5000);
    }
    qg_store_redis_counters(s, &c1);
    assert_true(c1.period_retries - c0.period_retries >= 2);
    {
        /* settles and usage at Redis's clock too */
        qg_settle_req q = {.request_id = "t2", .status = QG_SETTLE_COMPLETED,
                           .weight_milli = 500};
        qg_settle_result sr;
        assert_int_equal(qg_engine_settle(e, &q, now - 3 * DAY_MS, &sr, err, sizeof err), 0);
        assert_int_equal(sr.late, 0);
        assert_int_equal(sr.charged_milli, 500);
        assert_int_equal(qg_engine_usage(e, "c1", now - 3 * DAY_MS, &d), 0);
        assert_int_equal(view_of(&d, "daily")->used_milli, 1500);
    }
    qg_engine_free(e);
    qg_store_free(s);
}

/* The Cluster helper for the Cluster routing to come: three masters
 * joined by redis-cli, and every key one decision touches (record,
 * member, org) in one hash slot, the org's. */
static void test_cluster_helper(void **state)
{
    rediscluster c;
    char out[64], slot0[64];
    const char *keys[] = {
        "qg:{0123456789abcdef0123456789abcdef}:q:00000000000000aa",
        "qg:{0123456789abcdef0123456789abcdef}:e:fedcba9876543210fedcba9876543210",
        "qg:{0123456789abcdef0123456789abcdef}:l:fedcba9876543210fedcba9876543210",
        "qg:{0123456789abcdef0123456789abcdef}:e:0123456789abcdef0123456789abcdef",
        "qg:{0123456789abcdef0123456789abcdef}:l:0123456789abcdef0123456789abcdef",
    };
    (void)state;
    need_server();
    if (rediscluster_start(&c) != 0)
        fail_msg("cluster: %s", c.why);
    assert_int_equal(redisproc_cmd(&c.node[0], slot0, sizeof slot0,
                                   "CLUSTER", "KEYSLOT", keys[0], NULL), 0);
    for (size_t i = 1; i < sizeof keys / sizeof keys[0]; i++) {
        assert_int_equal(redisproc_cmd(&c.node[1], out, sizeof out,
                                       "CLUSTER", "KEYSLOT", keys[i], NULL), 0);
        assert_string_equal(out, slot0);
    }
    assert_int_equal(redisproc_cmd(&c.node[2], out, sizeof out, "CLUSTER",
                                   "INFO", NULL), 0);
    rediscluster_stop(&c);
}

static int group_setup(void **state)
{
    (void)state;
    if (!redisproc_binary())
        return 0;
    if (redisproc_start(&srv, NULL) != 0) {
        fprintf(stderr, "redis-server would not start: %s\n", srv.why);
        return -1;
    }
    have_server = 1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    redisproc_stop(&srv);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argument_text),
        cmocka_unit_test(test_reply_decoding),
        cmocka_unit_test(test_bignum),
        cmocka_unit_test_teardown(test_rolling, teardown),
        cmocka_unit_test_teardown(test_calendar, teardown),
        cmocka_unit_test_teardown(test_session, teardown),
        cmocka_unit_test_teardown(test_rate, teardown),
        cmocka_unit_test_teardown(test_concurrency_lease_expiry, teardown),
        cmocka_unit_test_teardown(test_model_scoped, teardown),
        cmocka_unit_test_teardown(test_payg, teardown),
        cmocka_unit_test_teardown(test_replays_and_reused_ids, teardown),
        cmocka_unit_test_teardown(test_settles, teardown),
        cmocka_unit_test_teardown(test_restore, teardown),
        cmocka_unit_test_teardown(test_relayout, teardown),
        cmocka_unit_test_teardown(test_domain_refused, teardown),
        cmocka_unit_test_teardown(test_at_the_bound, teardown),
        cmocka_unit_test_teardown(test_script_flush, teardown),
        cmocka_unit_test_teardown(test_old_libraries, teardown),
        cmocka_unit_test_teardown(test_flushall, teardown),
        cmocka_unit_test_teardown(test_server_gone, teardown),
        cmocka_unit_test_teardown(test_round_trips, teardown),
        cmocka_unit_test_teardown(test_calls_in_flight, teardown),
        cmocka_unit_test(test_server_time),
        cmocka_unit_test(test_cluster_helper),
        cmocka_unit_test_teardown(test_diff_exact, teardown),
        cmocka_unit_test_teardown(test_diff_bounded_entries, teardown),
        cmocka_unit_test_teardown(test_diff_bounded_precision, teardown),
        cmocka_unit_test_teardown(test_diff_evalsha, teardown),
        cmocka_unit_test_teardown(test_diff_cluster, teardown),
        cmocka_unit_test_teardown(test_memory_per_subject, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
