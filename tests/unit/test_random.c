/* test_random.c - the engine against the plain reference model on long
 * random streams.
 *
 * The same deterministic stream of checks and settles (fixed seed; ten
 * subjects in two orgs plus walk-ins on the default plan; random models,
 * weights, repeated request ids, time steps from 0 ms to hours, settles
 * below, at and above the reservation, late settles) drives the real engine
 * (memory store) and tests/support/refmodel.c, which keeps a literal log of
 * every charge and decides by scanning it.
 *
 *  - exact mode (rolling windows exact): every decision must be identical:
 *    outcome, replay, weight, retry_after_ms, binding window, and the used
 *    amount of every window; every settle result too.  For a sample of
 *    refusals the reference itself must admit at now + retry_after and
 *    refuse one millisecond earlier.
 *  - bounded mode (rolling max_entries 16, or precision 1m): the engine may
 *    refuse more but must never admit what the reference refuses, and its
 *    retry instant is never earlier than the reference's.  The reference is
 *    charged only with what the engine admitted, so both see one history.
 *  - at the bounds (quotagate.h): limits, weights and settles near
 *    QG_AMOUNT_MAX_MILLI and token counts up to QG_TOKENS_MAX, so that
 *    window sums pass the bound and saturate; compared as in bounded mode
 *    with the reference's exact 128-bit sums (a saturated counter may only
 *    refuse more), settles exactly, and a check whose tokens weigh more
 *    than the bound must be refused with QG_ERANGE.
 *
 * The stream length can be overridden with QG_RANDOM_OPS; under
 * AddressSanitizer the default is shorter (the reference is quadratic). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"
#include "weights.h"
#include "refmodel.h"

#if defined(__SANITIZE_ADDRESS__)
#define DEFAULT_OPS 50000L
#else
#define DEFAULT_OPS 200000L
#endif

#define T0_MS 1772323200000LL        /* 2026-03-01T00:00:00Z */
#define ANCHOR_MS 1769850000000LL    /* 2026-01-31T09:00:00Z */
#define NSUBJ 10
#define RECENT 64                    /* request ids kept for repeats */

/* ------------------------------------------------------------- PRNG */

static uint64_t rng_state;
static int trace;                     /* QG_RANDOM_TRACE=1: print each op */
static int nozero;                    /* QG_RANDOM_NOZERO=1: no 0 weights */
static int huge;                      /* amounts at the bounds (huge_rules) */

static uint64_t rnd(void)             /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t rnd_range(int64_t lo, int64_t hi)   /* [lo, hi] */
{
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static int chance(int percent_tenths)  /* probability in 1/1000 */
{
    return (int)(rnd() % 1000) < percent_tenths;
}

/* --------------------------------------------------------- rules text */

static const char exact_rules[] =
    "version: \"rand-1\"\n"
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

static const char bounded16_rules[] =
    "version: \"rand-b16\"\n"
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
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 2h, limit: 120, max_entries: 16 }\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 30m, limit: 60, max_entries: 16 }\n"
    "default_plan: basic\n";

static const char precision_rules[] =
    "version: \"rand-p1m\"\n"
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
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 3h, limit: 150, precision: 1m }\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 1h, limit: 70, precision: 1m }\n"
    "default_plan: basic\n";

/* Limits at and near the bound; the model "large" weighs up to 1.3e15
 * points at the token bound, past the weight bound. */
static const char huge_rules[] =
    "version: \"rand-huge\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    large: { per_request: 2, input_per_1k: 500000, output_per_1k: 800000 }\n"
    "plans:\n"
    "  basic:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 1000000000000000, max_entries: 1000000 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 600000000000000 }\n"
    "      - { name: sess, type: session, length: 2h, limit: 900000000000000 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 4, burst: 6, unit: requests }\n"
    "      - { name: wrate, type: rate, per: 1h, limit: 1000000000000000 }\n"
    "    concurrency: 3\n"
    "    lease_ttl: 10m\n"
    "  pro:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 700000000000000, max_entries: 1000000 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 09:30\", tz: \"Europe/Berlin\", limit: 1000000000000000 }\n"
    "      - { name: sess, type: session, length: 30m, limit: 500000000000000, models: [large] }\n"
    "    concurrency: 2\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 3h, limit: 1000000000000000, max_entries: 1000000 }\n"
    "    concurrency: 5\n"
    "  globex:\n"
    "    windows:\n"
    "      - { name: org_daily, type: calendar, every: day, at: \"06:00\", tz: \"America/New_York\", limit: 1000000000000000 }\n"
    "default_plan: basic\n";

/* ------------------------------------------------------------ harness */

typedef struct pending {
    char rid[32];
    int model;                /* -1 weight-only */
    int64_t reserved;
    int64_t in_tokens, out_est;
} pending;

typedef struct stats {
    long checks, allow, reject, never, replay, einval;
    long settles, late, settle_replay, notfound;
    long stricter, retry_checked;
} stats;

typedef struct harness {
    qg_engine *eng;
    qg_store *store;
    ref_model *ref;
    const qg_rules *rules;
    int exact;
    char subj[NSUBJ + 1][16];
    char recent[RECENT][32];
    int nrecent;
    pending *pend;
    int npend, cappend;
    char settled[RECENT][32];
    int nsettled;
    stats st;
} harness;

static harness *active;   /* freed by the teardown when a check fails */

static void harness_init(harness *h, const char *text, int exact)
{
    qg_rules *rules = NULL;
    qg_diag diag;
    char err[256];
    qg_memory_opts mo = { .shards = 4, .max_reservations = 1u << 19 };

    memset(h, 0, sizeof *h);
    if (qg__rules_parse(text, strlen(text), "test", qg__tz_load_system, NULL,
                       &rules, &diag) != 0) {
        qg__diag_format(&diag, err, sizeof err);
        fail_msg("rules: %s", err);
    }
    h->store = qg_store_memory_new(&mo);
    assert_non_null(h->store);
    h->eng = qg_engine_new(rules, h->store);
    assert_non_null(h->eng);
    h->rules = qg_engine_rules(h->eng);
    h->ref = ref_new(h->rules);
    assert_non_null(h->ref);
    h->exact = exact;
    for (int i = 0; i < NSUBJ; i++) {
        const char *plan = i % 3 == 2 ? "pro" : "basic";
        const char *org = i % 2 ? "globex" : "acme";
        int64_t anchor = i % 4 == 1 ? ANCHOR_MS + i * 3600000LL : 0;
        snprintf(h->subj[i], sizeof h->subj[i], "s%d", i);
        assert_int_equal(qg_engine_set_subject(h->eng, h->subj[i], plan, org,
                                               anchor, err, sizeof err), 0);
        assert_int_equal(ref_set_subject(h->ref, h->subj[i],
                                         qg__rules_find_plan(h->rules, plan),
                                         qg__rules_find_org(h->rules, org),
                                         anchor), 0);
    }
    snprintf(h->subj[NSUBJ], sizeof h->subj[NSUBJ], "walkin");
    active = h;
}

static void harness_release(harness *h)
{
    ref_free(h->ref);
    qg_engine_free(h->eng);
    qg_store_free(h->store);
    free(h->pend);
    active = NULL;
}

static void harness_free(harness *h)
{
    const char *msg;
    int errs = ref_internal_errors(h->ref, &msg);
    if (errs)
        fail_msg("reference model inconsistency: %s", msg);
    harness_release(h);
}

static int teardown(void **state)
{
    (void)state;
    if (active)
        harness_release(active);
    return 0;
}

static void remember(char ring[RECENT][32], int *n, const char *rid)
{
    snprintf(ring[*n % RECENT], 32, "%s", rid);
    (*n)++;
}

static void push_pending(harness *h, const pending *p)
{
    if (h->npend == h->cappend) {
        h->cappend = h->cappend ? h->cappend * 2 : 64;
        h->pend = realloc(h->pend, (size_t)h->cappend * sizeof *h->pend);
        assert_non_null(h->pend);
    }
    h->pend[h->npend++] = *p;
}

/* Time step: mostly small, sometimes minutes, rarely hours. */
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
    return rnd_range(1800000, 6 * 3600000LL);
}

static void describe(char *buf, size_t cap, long op, const char *subject,
                     const char *rid, int model, int64_t w, int64_t now)
{
    snprintf(buf, cap, "op %ld: subject %s rid %s model %d weight %lld "
             "now %lld (t0+%lld ms)", op, subject, rid, model, (long long)w,
             (long long)now, (long long)(now - T0_MS));
}

static void do_check(harness *h, long op, int64_t now)
{
    char rid[32], what[256], err[256];
    int si = chance(20) ? NSUBJ : (int)(rnd() % NSUBJ);
    const char *subject = h->subj[si];
    int model = -1;
    int64_t in = 0, out_est = 0, weight = 0;
    qg_check_req req = { .subject = subject };
    qg_decision d;
    ref_decision rd;

    if (h->nrecent && chance(30))      /* a repeated request id */
        snprintf(rid, sizeof rid, "%s",
                 h->recent[rnd() % (uint64_t)(h->nrecent < RECENT ? h->nrecent
                                                                 : RECENT)]);
    else
        snprintf(rid, sizeof rid, "r%ld", op);
    req.request_id = rid;
    if (chance(450)) {
        uint64_t r = rnd() % 1000;
        int64_t small = rnd_range(1, 8000);
        weight = r < 30 ? (nozero ? small : 0)
                 : r < 40 ? rnd_range(41000, 400000) : small;
        if (huge && r >= 30)
            weight = r < 100 ? QG_AMOUNT_MAX_MILLI
                     : r < 700 ? rnd_range(QG_AMOUNT_MAX_MILLI / 20,
                                           QG_AMOUNT_MAX_MILLI)
                               : small;
        req.weight_milli = weight;
    } else {
        model = (int)(rnd() % 2);
        in = huge ? rnd_range(0, QG_TOKENS_MAX) : rnd_range(0, 3000);
        out_est = chance(100) ? -1
                  : huge ? rnd_range(0, QG_TOKENS_MAX) : rnd_range(0, 1500);
        req.model = h->rules->models[model].name;
        req.input_tokens = in;
        req.max_output_tokens = out_est;
        if (out_est < 0)
            out_est = QG_DEFAULT_OUTPUT_ESTIMATE;
        weight = qg__weight_milli(&h->rules->models[model], in, out_est);
    }
    describe(what, sizeof what, op, subject, rid, model, weight, now);

    int rc = qg_engine_check(h->eng, &req, now, &d, err, sizeof err);
    if (trace)
        printf("# check %s -> rc %d outcome %d replayed %d retry %lld\n",
               what, rc, d.outcome, d.replayed, (long long)d.retry_after_ms);
    if (weight > QG_AMOUNT_MAX_MILLI) {
        /* tokens that weigh more than the bound: refused, nothing charged */
        if (rc != QG_ERANGE)
            fail_msg("%s: engine rc %d for a weight over the bound", what, rc);
        h->st.einval++;
        return;
    }
    if (h->exact) {
        ref_check(h->ref, subject, rid, model, weight, now, &rd);
    } else {
        ref_check_ex(h->ref, subject, rid, model, weight, now, 0, &rd);
    }
    h->st.checks++;
    if (rc != rd.rc)
        fail_msg("%s: engine rc %d (%s), reference rc %d", what, rc, err,
                 rd.rc);
    if (rc != QG_OK) {
        h->st.einval++;
        return;
    }
    if (d.outcome == QG_ALLOW && !d.replayed)
        assert_int_equal(d.weight_milli, weight);

    if (!h->exact) {
        /* Bounded: never admit what the reference refuses. */
        if (d.outcome == QG_ALLOW && rd.outcome != QG_ALLOW)
            fail_msg("%s: engine admits, reference refuses (%d, window %s, "
                     "retry %lld)", what, rd.outcome,
                     rd.binding_name ? rd.binding_name : "-",
                     (long long)rd.retry_after_ms);
        if (d.replayed != rd.replayed)
            fail_msg("%s: replayed %d vs reference %d", what, d.replayed,
                     rd.replayed);
        if (d.outcome == QG_ALLOW && !d.replayed) {
            ref_check(h->ref, subject, rid, model, weight, now, &rd);
            assert_int_equal(rd.outcome, QG_ALLOW);
        } else if (d.outcome != QG_ALLOW && rd.outcome == QG_ALLOW) {
            h->st.stricter++;
        } else if (d.outcome == QG_REJECT && rd.outcome == QG_REJECT &&
                   d.retry_after_ms < rd.retry_after_ms) {
            fail_msg("%s: engine retry %lld earlier than the reference's "
                     "%lld", what, (long long)d.retry_after_ms,
                     (long long)rd.retry_after_ms);
        } else if (d.outcome != rd.outcome && rd.outcome == QG_REJECT_NEVER) {
            fail_msg("%s: engine outcome %d, reference never", what,
                     d.outcome);
        }
    } else {
        const char *bname = d.binding >= 0 ? d.views[d.binding].name : NULL;
        int borg = d.binding >= 0 ? d.views[d.binding].org : 0;
        if (d.outcome != rd.outcome || d.replayed != rd.replayed ||
            d.weight_milli != rd.weight_milli ||
            d.retry_after_ms != rd.retry_after_ms ||
            (bname == NULL) != (rd.binding_name == NULL) ||
            (bname && strcmp(bname, rd.binding_name) != 0) ||
            borg != rd.binding_org)
            fail_msg("%s:\n  engine    outcome %d replayed %d weight %lld "
                     "retry_after %lld binding %s%s\n  reference outcome %d "
                     "replayed %d weight %lld retry_after %lld binding %s%s",
                     what, d.outcome, d.replayed, (long long)d.weight_milli,
                     (long long)d.retry_after_ms, bname ? bname : "-",
                     borg ? " (org)" : "", rd.outcome, rd.replayed,
                     (long long)rd.weight_milli, (long long)rd.retry_after_ms,
                     rd.binding_name ? rd.binding_name : "-",
                     rd.binding_org ? " (org)" : "");
        int64_t used[QG_MAX_VIEWS];
        int n = ref_used(h->ref, subject, now, used, QG_MAX_VIEWS);
        if (n != d.nviews)
            fail_msg("%s: %d views, reference %d windows", what, d.nviews, n);
        for (int i = 0; i < n; i++)
            if (d.views[i].used_milli != used[i])
                fail_msg("%s: window %s used %lld, reference %lld", what,
                         d.views[i].name, (long long)d.views[i].used_milli,
                         (long long)used[i]);
        if (d.outcome == QG_REJECT && chance(250)) {
            /* The reference's own boundary: admitted at the instant found,
             * refused one millisecond before. */
            int64_t at = now + rd.retry_after_ms;
            if (ref_admits_at(h->ref, subject, model, weight, at) != 1 ||
                ref_admits_at(h->ref, subject, model, weight, at - 1) != 0)
                fail_msg("%s: reference retry instant %lld is not exact",
                         what, (long long)at);
            h->st.retry_checked++;
        }
    }
    switch (d.outcome) {
    case QG_ALLOW:
        if (d.replayed) {
            h->st.replay++;
        } else {
            pending p;
            snprintf(p.rid, sizeof p.rid, "%s", rid);
            p.model = model;
            p.reserved = weight;
            p.in_tokens = in;
            p.out_est = out_est;
            push_pending(h, &p);
            h->st.allow++;
        }
        break;
    case QG_REJECT:
        h->st.reject++;
        break;
    default:
        h->st.never++;
        break;
    }
    remember(h->recent, &h->nrecent, rid);
}

static void compare_settle(const char *what, int rc,
                           const qg_settle_result *e,
                           const ref_settle_result *r)
{
    if (rc != r->rc)
        fail_msg("%s: settle rc %d vs reference %d", what, rc, r->rc);
    if (rc != QG_OK)
        return;
    if (e->replayed != r->replayed || e->late != r->late ||
        e->reserved_milli != r->reserved_milli ||
        e->actual_milli != r->actual_milli ||
        e->charged_milli != r->charged_milli)
        fail_msg("%s: settle engine replayed %d late %d reserved %lld actual "
                 "%lld charged %lld; reference %d %d %lld %lld %lld", what,
                 e->replayed, e->late, (long long)e->reserved_milli,
                 (long long)e->actual_milli, (long long)e->charged_milli,
                 r->replayed, r->late, (long long)r->reserved_milli,
                 (long long)r->actual_milli, (long long)r->charged_milli);
}

static void do_settle(harness *h, long op, int64_t now)
{
    char what[160], err[256];
    qg_settle_req sr;
    qg_settle_result res;
    ref_settle_result rr;
    int rc;

    memset(&sr, 0, sizeof sr);
    if (h->nsettled && chance(80)) {          /* settled twice: replayed */
        const char *rid = h->settled[rnd() % (uint64_t)(h->nsettled < RECENT
                                                            ? h->nsettled
                                                            : RECENT)];
        sr.request_id = rid;
        sr.status = QG_SETTLE_COMPLETED;
        sr.weight_milli = 1000;
        sr.output_tokens = 10;
        snprintf(what, sizeof what, "op %ld: settle again %s", op, rid);
        rc = qg_engine_settle(h->eng, &sr, now, &res, err, sizeof err);
        ref_settle(h->ref, rid, -2, now, &rr);
        compare_settle(what, rc, &res, &rr);
        if (rc == QG_OK)
            assert_int_equal(res.replayed, 1);
        return;
    }
    if (!h->npend || chance(20)) {            /* an unknown request id */
        char rid[32];
        snprintf(rid, sizeof rid, "nobody-%ld", op);
        sr.request_id = rid;
        sr.status = QG_SETTLE_COMPLETED;
        sr.weight_milli = -1;
        rc = qg_engine_settle(h->eng, &sr, now, &res, err, sizeof err);
        ref_settle(h->ref, rid, -1, now, &rr);
        snprintf(what, sizeof what, "op %ld: settle unknown", op);
        compare_settle(what, rc, &res, &rr);
        assert_int_equal(rc, QG_ENOTFOUND);
        h->st.notfound++;
        return;
    }
    /* Mostly the newest reservations; sometimes an old one (late). */
    uint64_t pick = rnd() % 4;
    int k = pick < 2 ? h->npend - 1
            : pick == 2 ? h->npend - 1 - (int)(rnd() % (uint64_t)(h->npend < 8
                                                                  ? h->npend
                                                                  : 8))
                        : (int)(rnd() % (uint64_t)h->npend);
    pending p = h->pend[k];
    memmove(&h->pend[k], &h->pend[k + 1],
            (size_t)(h->npend - k - 1) * sizeof *h->pend);
    h->npend--;
    int64_t actual;
    sr.request_id = p.rid;
    sr.status = (qg_settle_status)rnd_range(1, 3);
    uint64_t how = rnd() % 4;              /* < = > reserved, or keep */
    if (p.model < 0) {
        actual = how == 0 ? (p.reserved ? rnd_range(0, p.reserved - 1) : 0)
                 : how == 1 ? p.reserved
                 : how == 2 ? (huge ? rnd_range(p.reserved, QG_AMOUNT_MAX_MILLI)
                                    : p.reserved + rnd_range(1, 20000))
                 : -1;
        sr.weight_milli = actual;
    } else {
        int64_t out = how == 0 ? (p.out_est ? rnd_range(0, p.out_est - 1) : 0)
                      : how == 1 ? p.out_est
                      : huge ? rnd_range(p.out_est, QG_TOKENS_MAX)
                             : p.out_est + rnd_range(1, 4000);
        sr.input_tokens = p.in_tokens;
        sr.output_tokens = out;
        sr.weight_milli = -1;
        actual = qg__weight_milli(&h->rules->models[p.model], p.in_tokens, out);
        if (actual > QG_AMOUNT_MAX_MILLI)
            actual = QG_AMOUNT_MAX_MILLI;   /* a settle charges the bound */
    }
    snprintf(what, sizeof what, "op %ld: settle %s reserved %lld actual %lld "
             "now %lld", op, p.rid, (long long)p.reserved, (long long)actual,
             (long long)now);
    rc = qg_engine_settle(h->eng, &sr, now, &res, err, sizeof err);
    if (trace)
        printf("# %s -> rc %d late %d charged %lld\n", what, rc, res.late,
               (long long)res.charged_milli);
    ref_settle(h->ref, p.rid, actual, now, &rr);
    compare_settle(what, rc, &res, &rr);
    h->st.settles++;
    h->st.late += res.late;
    remember(h->settled, &h->nsettled, p.rid);
}

static void do_usage(harness *h, long op, int64_t now)
{
    const char *subject = h->subj[rnd() % NSUBJ];
    qg_decision d;
    int64_t used[QG_MAX_VIEWS];
    assert_int_equal(qg_engine_usage(h->eng, subject, now, &d), 0);
    int n = ref_used(h->ref, subject, now, used, QG_MAX_VIEWS);
    assert_int_equal(n, d.nviews);
    if (!h->exact)
        return;
    for (int i = 0; i < n; i++)
        if (d.views[i].used_milli != used[i])
            fail_msg("op %ld: usage of %s window %s: %lld, reference %lld",
                     op, subject, d.views[i].name,
                     (long long)d.views[i].used_milli, (long long)used[i]);
}

/* Total operations of a test: QG_RANDOM_OPS, or the default. */
static long stream_ops(long dflt)
{
    const char *e = getenv("QG_RANDOM_OPS");
    long n = e ? strtol(e, NULL, 10) : 0;
    return n > 0 ? n : dflt;
}

/* One stream of nops operations from `start` on a fresh engine and model. */
static void run_epoch(const char *text, int exact, long nops, int64_t start,
                      const char *label, stats *total)
{
    static harness h;        /* static: the teardown may free it */
    int64_t now = start;

    harness_init(&h, text, exact);
    for (long op = 0; op < nops; op++) {
        now += time_step();
        uint64_t r = rnd() % 1000;
        if (r < 750)
            do_check(&h, op, now);
        else if (r < 980)
            do_settle(&h, op, now);
        else
            do_usage(&h, op, now);
        /* Forget reservations that nobody will settle (leases expire). */
        if (h.npend > 40)
            memmove(&h.pend[0], &h.pend[1], (size_t)--h.npend * sizeof *h.pend);
    }
    printf("# %s: %ld ops from %lld over %lld h: %ld checks (%ld allowed, "
           "%ld refused, %ld never, %ld replayed, %ld bad id), %ld settles "
           "(%ld late, %ld unknown), %ld retries verified, %ld stricter, "
           "%zu log entries\n",
           label, nops, (long long)start, (long long)((now - start) / 3600000),
           h.st.checks, h.st.allow, h.st.reject, h.st.never, h.st.replay,
           h.st.einval, h.st.settles, h.st.late, h.st.notfound,
           h.st.retry_checked, h.st.stricter, ref_log_entries(h.ref));
    total->allow += h.st.allow;
    total->reject += h.st.reject;
    total->never += h.st.never;
    harness_free(&h);
}

/* A test: `total_ops` operations as independent epochs of EPOCH_OPS (the
 * reference's cost grows with the square of a stream's length), each
 * starting at a different instant so that month ends, DST changes and
 * week starts fall at different points of the streams. */
#define EPOCH_OPS 15000L
static void run_stream(const char *text, int exact, uint64_t seed,
                       const char *label, long total_ops)
{
    stats total;
    long nops = stream_ops(total_ops);

    if (getenv("QG_RANDOM_ONLY") && strcmp(getenv("QG_RANDOM_ONLY"), label))
        skip();
    trace = getenv("QG_RANDOM_TRACE") != NULL;
    nozero = getenv("QG_RANDOM_NOZERO") != NULL;
    memset(&total, 0, sizeof total);
    if (getenv("QG_RANDOM_SEED"))
        seed ^= strtoull(getenv("QG_RANDOM_SEED"), NULL, 0);
    rng_state = seed;
    for (long done = 0, e = 0; done < nops; e++) {
        long n = nops - done < EPOCH_OPS ? nops - done : EPOCH_OPS;
        int64_t start = T0_MS + e * 41 * 86400000LL + rnd_range(0, 86400000);
        run_epoch(text, exact, n, start, label, &total);
        done += n;
    }
    assert_true(total.allow > 0 && total.reject > 0 && total.never > 0);
}

static void test_random_exact(void **state)
{
    (void)state;
    run_stream(exact_rules, 1, 0x5eed0001ULL, "exact", DEFAULT_OPS);
}

static void test_random_bounded_entries(void **state)
{
    (void)state;
    run_stream(bounded16_rules, 0, 0x5eed0002ULL, "max_entries 16",
               DEFAULT_OPS / 2);
}

static void test_random_bounded_precision(void **state)
{
    (void)state;
    run_stream(precision_rules, 0, 0x5eed0003ULL, "precision 1m",
               DEFAULT_OPS / 2);
}

static void test_random_at_the_bounds(void **state)
{
    (void)state;
    huge = 1;
    run_stream(huge_rules, 0, 0x5eed0004ULL, "at the bounds",
               DEFAULT_OPS / 4);
    huge = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_random_exact, teardown),
        cmocka_unit_test_teardown(test_random_bounded_entries, teardown),
        cmocka_unit_test_teardown(test_random_bounded_precision, teardown),
        cmocka_unit_test_teardown(test_random_at_the_bounds, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
