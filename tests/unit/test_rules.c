/* test_rules.c - compiling rules files (rules_yaml.c, rules.c).
 *
 * One test parses the example of PRODUCT.md section 2 (plus the optional
 * parts) and checks every compiled value; the rest each break one thing
 * and check the error code, the exact line:column and the message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "quotagate.h"
#include "rules.h"
#include "tz.h"

/* Resolves "UTC" only and counts its calls in *(int *)ud. */
static qg_tz *utc_only(const char *name, void *ud, char *err, size_t errcap)
{
    if (ud)
        (*(int *)ud)++;
    if (strcmp(name, "UTC") == 0)
        return qg__tz_utc();
    snprintf(err, errcap, "no zone named %s", name);
    return NULL;
}

static const char example[] =
    "version: \"2026-11-01\"\n"
    "unit: \"weight points\"\n"
    "effective: \"2026-11-01\"\n"
    "notice: 14d\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-10-15\"\n"
    "  models:\n"
    "    light:    { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    standard: { per_request: 1, input_per_1k: 1,    output_per_1k: 5 }\n"
    "plans:\n"
    "  free:\n"                                                   /* 12 */
    "    price: { usd_month: 20 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling,  length: 5h, limit: 5 }\n"
    "      - { name: weekly,   type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 100 }\n"
    "      - { name: rpm,      type: rate,     per: 1m, limit: 10, unit: requests }\n"
    "    concurrency: 2\n"
    "    overage: { policy: reject }\n"
    "  max20:\n"                                                  /* 20 */
    "    price: { usd_month: 200.5 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling,  length: 5h, limit: 100, precision: 5m }\n"
    "      - { name: weekly,   type: calendar, every: week, at: \"SUN 18:30\", tz: \"UTC\", limit: 600 }\n"
    "      - { name: big,      type: session,  length: 5h, limit: 2.5, models: [standard] }\n"
    "      - { name: daily,    type: calendar, every: day, at: \"06:15\", limit: 50 }\n"
    "    concurrency: 8\n"
    "    lease_ttl: 2m\n"
    "    overage: { policy: downgrade, to_model: light }\n"
    "    claims:\n"
    "      - { multiplier: 20, vs: free, window: burst_5h, disclose_effective: true }\n"
    "  payg:\n"
    "    windows:\n"
    "      - { name: r, type: rate, per: 1s, limit: 1, burst: 5,\n"
    "          overage: { policy: queue, max_wait: 30s } }\n"
    "    overage: { policy: payg, price_per_unit: 0.0015, spending_cap: { usd_month: 50 } }\n"
    "subjects:\n"
    "  alice: { plan: max20, org: acme, billing_anchor: \"2026-01-31T09:00:00Z\" }\n"
    "  bob: { plan: free }\n"
    "orgs:\n"
    "  acme: { windows: [ { name: monthly, type: calendar, every: month, anchor: billing, limit: 100000 } ], concurrency: 3 }\n"
    "default_plan: free\n"
    "analysis:\n"
    "  request: { model: standard, input_tokens: 2000, output_tokens: 500 }\n"
    "  period: 7d\n";

static void test_example(void **state)
{
    qg_rules *r = NULL;
    qg_diag d;
    const qg_plan *free_p, *max_p, *payg;
    const qg_window_spec *w;
    int calls = 0, rc;
    (void)state;

    rc = qg__rules_parse(example, strlen(example), "ex.yaml", utc_only, &calls,
                        &r, &d);
    if (rc != 0)
        fail_msg("%s:%d:%d: %s", d.path, d.line, d.column, d.message);
    assert_non_null(r);
    assert_string_equal(r->version, "2026-11-01");
    assert_string_equal(r->unit, "weight points");
    assert_string_equal(r->path, "ex.yaml");
    assert_string_equal(r->weights_version, "w1");
    assert_true(r->calibrated_ms == 1792022400000LL);   /* 2026-10-15 */
    assert_true(r->effective_ms == 1793491200000LL);    /* 2026-11-01 */
    assert_true(r->announced_ms == 0);
    assert_true(r->notice_ms == 14 * 86400000LL);

    assert_int_equal(r->nmodels, 2);
    assert_string_equal(r->models[0].name, "light");
    assert_int_equal(r->models[1].index, 1);
    assert_int_equal(r->models[0].line, 9);
    assert_true(r->models[0].per_request_milli == 1000);
    assert_true(r->models[0].input_per_1k_micro == 250000);
    assert_true(r->models[1].output_per_1k_micro == 5000000);
    assert_int_equal(qg_rules_find_model(r, "standard"), 1);
    assert_int_equal(qg_rules_find_model(r, "huge"), -1);

    assert_int_equal(r->nplans, 3);
    free_p = &r->plans[0];
    max_p = &r->plans[1];
    payg = &r->plans[2];
    assert_int_equal(qg__rules_find_plan(r, "max20"), 1);
    assert_int_equal(max_p->index, 1);
    assert_int_equal(free_p->line, 12);
    assert_int_equal(max_p->line, 20);
    assert_true(free_p->price_micro == 20000000);
    assert_true(max_p->price_micro == 200500000);
    assert_true(payg->price_micro == -1);

    /* free: three windows + concurrency appended */
    assert_int_equal(free_p->nwindows, 4);
    w = &free_p->windows[0];
    assert_string_equal(w->name, "burst_5h");
    assert_int_equal(w->type, QG_WIN_ROLLING);
    assert_true(w->limit_milli == 5000);
    assert_true(w->length_ms == 5 * 3600000LL);
    assert_true(w->precision_ms == 0);
    assert_int_equal(w->max_entries, 1024);
    assert_int_equal(w->unit, QG_UNIT_WEIGHT);
    assert_true(w->model_mask == 0);
    assert_int_equal(w->overage.policy, QG_POLICY_NONE);
    assert_int_equal(w->line, 15);
    w = &free_p->windows[1];
    assert_int_equal(w->type, QG_WIN_CALENDAR);
    assert_int_equal(w->cal.every, QG_EVERY_WEEK);
    assert_int_equal(w->cal.weekday, 0);
    assert_int_equal(w->cal.minute_of_day, 0);
    assert_non_null(w->cal.tz);
    assert_string_equal(qg__tz_name(w->cal.tz), "UTC");
    w = qg__plan_find_window(free_p, "rpm");
    assert_non_null(w);
    assert_int_equal(w->type, QG_WIN_RATE);
    assert_int_equal(w->unit, QG_UNIT_REQUESTS);
    assert_true(w->length_ms == 60000);
    assert_true(w->burst_milli == 10000);
    w = &free_p->windows[3];
    assert_string_equal(w->name, "concurrency");
    assert_int_equal(w->type, QG_WIN_CONCURRENCY);
    assert_int_equal(w->unit, QG_UNIT_REQUESTS);
    assert_true(w->limit_milli == 2000);
    assert_true(w->lease_ttl_ms == 15 * 60000LL);
    assert_true(free_p->concurrency == 2);
    assert_int_equal(free_p->overage.policy, QG_POLICY_REJECT);
    assert_null(qg__plan_find_window(free_p, "nope"));

    /* max20 */
    assert_int_equal(max_p->nwindows, 5);
    assert_true(max_p->windows[0].precision_ms == 300000);
    w = &max_p->windows[1];
    assert_int_equal(w->cal.weekday, 6);
    assert_int_equal(w->cal.minute_of_day, 18 * 60 + 30);
    w = &max_p->windows[2];
    assert_int_equal(w->type, QG_WIN_SESSION);
    assert_true(w->limit_milli == 2500);
    assert_true(w->model_mask == 2);
    assert_true(qg__window_applies(w, 1));
    assert_false(qg__window_applies(w, 0));
    w = &max_p->windows[3];
    assert_int_equal(w->cal.every, QG_EVERY_DAY);
    assert_int_equal(w->cal.minute_of_day, 6 * 60 + 15);
    assert_string_equal(qg__tz_name(w->cal.tz), "UTC");
    w = &max_p->windows[4];
    assert_true(w->limit_milli == 8000);
    assert_true(w->lease_ttl_ms == 120000);
    assert_int_equal(max_p->overage.policy, QG_POLICY_DOWNGRADE);
    assert_int_equal(max_p->overage.to_model, 0);
    assert_int_equal(max_p->nclaims, 1);
    assert_true(max_p->claims[0].multiplier_milli == 20000);
    assert_int_equal(max_p->claims[0].vs_plan, 0);
    assert_string_equal(max_p->claims[0].window, "burst_5h");
    assert_null(max_p->claims[0].unit);
    assert_int_equal(max_p->claims[0].disclose_effective, 1);
    assert_int_equal(max_p->claims[0].line, 31);

    /* payg: window-level queue policy, plan-level payg */
    assert_int_equal(payg->nwindows, 1);
    assert_true(payg->concurrency == 0);
    w = &payg->windows[0];
    assert_true(w->burst_milli == 5000);
    assert_int_equal(w->overage.policy, QG_POLICY_QUEUE);
    assert_true(w->overage.max_wait_ms == 30000);
    assert_int_equal(w->overage.queue_size, 64);
    assert_int_equal(payg->overage.policy, QG_POLICY_PAYG);
    assert_true(payg->overage.price_per_unit_micro == 1500);
    assert_true(payg->overage.spending_cap_micro == 50000000);

    /* orgs and subjects */
    assert_int_equal(r->norgs, 1);
    assert_int_equal(r->orgs[0].nwindows, 2);
    w = &r->orgs[0].windows[0];
    assert_int_equal(w->cal.every, QG_EVERY_MONTH);
    assert_int_equal(w->cal.anchor_billing, 1);
    assert_int_equal(w->cal.mday, 1);
    assert_true(w->limit_milli == 100000000);
    assert_int_equal(r->orgs[0].windows[1].type, QG_WIN_CONCURRENCY);
    assert_true(r->orgs[0].windows[1].limit_milli == 3000);
    assert_int_equal(r->nsubjects, 2);
    assert_int_equal(qg_rules_find_subject(r, "alice"), 0);
    assert_int_equal(r->subjects[0].plan, 1);
    assert_int_equal(r->subjects[0].org, 0);
    assert_true(r->subjects[0].billing_anchor_ms == 1769850000000LL);
    assert_int_equal(r->subjects[1].org, -1);
    assert_int_equal(qg__rules_find_org(r, "acme"), 0);
    assert_int_equal(r->default_plan, 0);

    assert_int_equal(r->analysis.model, 1);
    assert_true(r->analysis.input_tokens == 2000);
    assert_true(r->analysis.output_tokens == 500);
    assert_true(r->analysis.duration_ms == 60000);
    assert_true(r->analysis.period_ms == 7 * 86400000LL);

    /* "UTC" named four times (once by default) but resolved once */
    assert_int_equal(r->nzones, 1);
    assert_int_equal(calls, 1);
    qg_rules_free(r);
}

/* The smallest valid file: defaults everywhere. */
static const char base[] =
    "version: \"v1\"\n"                                                /* 1 */
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-10-15\"\n"
    "  models:\n"                                                      /* 5 */
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    standard: { per_request: 1, input_per_1k: 1, output_per_1k: 5 }\n"
    "plans:\n"
    "  free:\n"
    "    windows:\n"                                                   /* 10 */
    "      - { name: burst, type: rolling, length: 5h, limit: 5 }\n";  /* 11 */

static void test_defaults(void **state)
{
    qg_rules *r = NULL;
    qg_diag d;
    (void)state;
    assert_int_equal(qg__rules_parse(base, strlen(base), "b.yaml", utc_only,
                                    NULL, &r, &d), 0);
    assert_string_equal(r->unit, "weight points");
    assert_true(r->notice_ms == 30 * 86400000LL);
    assert_int_equal(r->default_plan, -1);
    assert_int_equal(r->analysis.model, -1);
    assert_true(r->analysis.weight_milli == 1000);
    assert_true(r->analysis.duration_ms == 60000);
    assert_true(r->analysis.period_ms == 0);
    assert_int_equal(r->plans[0].nwindows, 1);
    assert_true(r->plans[0].concurrency == 0);
    assert_true(r->plans[0].price_micro == -1);
    assert_int_equal(r->plans[0].overage.policy, QG_POLICY_REJECT);
    assert_int_equal(r->norgs, 0);
    assert_int_equal(r->nsubjects, 0);
    assert_int_equal(r->nzones, 0);
    assert_true(r->reconcile.every_ms == 0);    /* no periodic run */
    assert_true(r->reconcile.tolerance_milli == 0);
    assert_int_equal(r->reconcile.repair, 0);
    qg_rules_free(r);
    qg_rules_free(NULL);
}

/* Parse base + tail; expect QG_ERULES at line:col with `phrase`. */
static void expect_err(const char *tail, int line, int col, const char *phrase)
{
    char text[4096], shown[1024];
    qg_rules *r = (qg_rules *)1;
    qg_diag d;
    int rc;

    snprintf(text, sizeof text, "%s%s", base, tail);
    rc = qg__rules_parse(text, strlen(text), "t.yaml", utc_only, NULL, &r, &d);
    qg__diag_format(&d, shown, sizeof shown);
    if (rc != QG_ERULES || r != NULL || d.line != line || d.column != col ||
        !strstr(d.message, phrase))
        fail_msg("rc %d, want %d:%d \"%s\"; got %s", rc, line, col, phrase,
                 shown);
}

/* reconcile: { every, tolerance, repair } (docs/reconcile.md). */
static void test_reconcile_block(void **state)
{
    char text[4096];
    qg_rules *r = NULL;
    qg_diag d;
    (void)state;
    snprintf(text, sizeof text, "%sreconcile: { every: 30m, tolerance: 2.5, "
             "repair: true }\n", base);
    assert_int_equal(qg__rules_parse(text, strlen(text), "t.yaml", utc_only,
                                     NULL, &r, &d), 0);
    assert_true(r->reconcile.every_ms == 30 * 60000LL);
    assert_true(r->reconcile.tolerance_milli == 2500);
    assert_int_equal(r->reconcile.repair, 1);
    qg_rules_free(r);
    snprintf(text, sizeof text, "%sreconcile: {}\n", base);
    assert_int_equal(qg__rules_parse(text, strlen(text), "t.yaml", utc_only,
                                     NULL, &r, &d), 0);
    assert_true(r->reconcile.every_ms == 5 * 60000LL);  /* the default */
    qg_rules_free(r);
    expect_err("reconcile: { every: 5m, tolerence: 0 }\n", 12, 25,
               "reconcile: unknown key \"tolerence\" (expected one of: "
               "every, tolerance, repair)");
    expect_err("reconcile: { every: soon }\n", 12, 21, "reconcile.every");
    expect_err("reconcile: { every: 100ms }\n", 12, 21, "at least 1s");
    expect_err("reconcile: { tolerance: -1 }\n", 12, 25,
               "reconcile.tolerance");
    expect_err("reconcile: { repair: maybe }\n", 12, 22, "reconcile.repair");
}

/* A second version as a tail of `base`: "---" is line 12, then version
 * (13), effective (14), the extra lines (15...), weights (15 + extra). */
#define V2_HEAD "---\nversion: \"v2\"\neffective: \"2027-01-15T00:00:00Z\"\n"
#define V2_BODY                                                         \
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-10-15\"\n"        \
    "  models:\n    light: { per_request: 1 }\n"                          \
    "plans:\n  free:\n    windows:\n"                                     \
    "      - { name: burst, type: rolling, length: 5h, limit: 4 }\n"

/* Several documents: a chain of versions, the one in force by instant. */
static void test_versions(void **state)
{
    char text[4096];
    qg_rules *r = NULL;
    const qg_rules *v2;
    qg_diag d;
    (void)state;
    snprintf(text, sizeof text, "%snotice: 45d\n" V2_HEAD
             "announced: \"2026-12-01T00:00:00Z\"\n"
             "changes: \"free: burst lowered from 5 to 4\"\n" V2_BODY, base);
    assert_int_equal(qg__rules_parse(text, strlen(text), "v.yaml", utc_only,
                                     NULL, &r, &d), 0);
    assert_string_equal(r->version, "v1");
    assert_true(r->effective_ms == 0);
    assert_int_equal(r->line, 1);
    assert_null(r->changes);
    v2 = qg_rules_next(r);
    assert_non_null(v2);
    assert_null(qg_rules_next(v2));
    assert_string_equal(v2->version, "v2");
    assert_int_equal(v2->line, 14);      /* its mapping's first line */
    assert_true(v2->effective_ms == 1799971200000LL);  /* 2027-01-15 */
    assert_true(v2->announced_ms == 1796083200000LL);  /* 2026-12-01 */
    assert_true(v2->notice_ms == 45 * 86400000LL);     /* v1's, inherited */
    assert_string_equal(v2->changes, "free: burst lowered from 5 to 4");
    assert_true(v2->plans[0].windows[0].limit_milli == 4000);
    assert_int_equal(v2->nmodels, 1);
    /* the version in force: the last whose effective <= t */
    assert_ptr_equal(qg_rules_at(r, 0), r);
    assert_ptr_equal(qg_rules_at(r, 1799971200000LL - 1), r);
    assert_ptr_equal(qg_rules_at(r, 1799971200000LL), v2);
    assert_ptr_equal(qg_rules_at(r, 1900000000000LL), v2);
    qg_rules_free(r);
    /* a single document with effective: nothing in force before it */
    snprintf(text, sizeof text, "%seffective: \"2027-01-15\"\n", base);
    assert_int_equal(qg__rules_parse(text, strlen(text), "s.yaml", utc_only,
                                     NULL, &r, &d), 0);
    assert_null(qg_rules_next(r));
    assert_null(qg_rules_at(r, 1799971200000LL - 1));
    assert_ptr_equal(qg_rules_at(r, 1799971200000LL), r);
    qg_rules_free(r);
}

/* Bad multi-document files: each error at the document's own lines. */
static void test_err_versions(void **state)
{
    (void)state;
    /* a later version must say when it takes effect */
    expect_err("---\nversion: \"v2\"\n" V2_BODY, 13, 1,
               "effective: expected an effective instant");
    /* strictly later than the one before it, in file order */
    expect_err("effective: \"2027-02-01\"\n" V2_HEAD V2_BODY, 15, 12,
               "effective: expected an instant after 2027-02-01T00:00:00Z, "
               "when version \"v1\" (line 1) takes effect");
    expect_err("effective: \"2027-01-15\"\n" V2_HEAD V2_BODY, 15, 12,
               "versions are listed in the order they take effect");
    /* a version name of its own */
    expect_err("---\nversion: \"v1\"\neffective: \"2027-01-15\"\n" V2_BODY,
               13, 10, "\"v1\" is also the version of the document at "
               "line 1");
    /* a complete version: the second document's own errors, at its lines */
    expect_err(V2_HEAD "weights:\n  version: \"w1\"\n"
               "  calibrated: \"2026-10-15\"\n"
               "  models:\n    light: { per_request: 1 }\n", 13, 1,
               "missing required key \"plans\"");
    expect_err(V2_HEAD "chanegs: x\n" V2_BODY, 15, 1,
               "unknown key \"chanegs\"");
    expect_err(V2_HEAD V2_BODY "      - { name: w2, type: rolling, length: 5h,"
               " limit: -1 }\n", 24, 55, "plans.free.windows[1].limit");
    expect_err("---\n[1, 2]\n", 13, 1, "expected a mapping");
    /* a "---" with nothing after it is an empty version, refused */
    expect_err("---\n", 13, 1, "expected a rules version");
}

static void test_err_syntax(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling\n  pro: {}\n", 13, 6,
               "YAML syntax error: did not find expected ',' or '}'");
    expect_err("   bad: x\n", 12, 4, "YAML syntax error");
}

static void test_err_unknown_key(void **state)
{
    (void)state;
    expect_err("verison: x\n", 12, 1,
               "unknown key \"verison\" (expected one of: version, unit,");
    expect_err("      - { name: w2, type: rolling, lenght: 5h, limit: 5 }\n",
               12, 36,
               "plans.free.windows[1]: unknown key \"lenght\" (expected one "
               "of: name, type, limit, unit, length, ");
    expect_err("version: x\n", 12, 1, "duplicate key \"version\"");
}

static void test_err_wrong_type(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling, length: 5h, limit: abc }\n",
               12, 55,
               "plans.free.windows[1].limit: expected a positive number, "
               "got \"abc\"");
    expect_err("  pro:\n    windows: { name: x }\n", 13, 14,
               "plans.pro.windows: expected a list of windows, got a mapping");
    expect_err("  pro: [1, 2]\n", 12, 8,
               "plans.pro: expected a mapping, got a list");
}

static void test_err_limits(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling, length: 5h, limit: -5 }\n",
               12, 55,
               "plans.free.windows[1].limit: expected a positive number, "
               "got \"-5\"");
    expect_err("      - { name: w2, type: rolling, length: 5h, limit: 0 }\n",
               12, 55, "expected a positive number, got \"0\"");
    expect_err("      - { name: w2, type: rolling, length: 5h, limit: 1.2345 }\n",
               12, 55, "at most 3 decimal places");
}

static void test_err_overflow(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling, length: 5h, "
               "limit: 99999999999999999999 }\n",
               12, 55, "number out of range");
    expect_err("    concurrency: 9223372036854775807\n", 12, 18,
               "plans.free.concurrency: number out of range");
    expect_err("      - { name: w2, type: rolling, length: 999999999999999w, "
               "limit: 1 }\n", 12, 44, "duration out of range");
}

static void test_err_unknown_model(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling, length: 5h, limit: 5, "
               "models: [huge] }\n", 12, 67,
               "plans.free.windows[1].models[0]: unknown model \"huge\" "
               "(models are: light, standard)");
    expect_err("    overage: { policy: downgrade, to_model: big }\n", 12, 45,
               "plans.free.overage.to_model: unknown model \"big\"");
}

static void test_err_unknown_plan(void **state)
{
    (void)state;
    expect_err("subjects:\n  alice: { plan: gold }\n", 13, 18,
               "subjects.alice.plan: unknown plan \"gold\" (plans are: free)");
    expect_err("default_plan: gold\n", 12, 15,
               "default_plan: unknown plan \"gold\" (plans are: free)");
    expect_err("    claims:\n      - { multiplier: 2, vs: gold, window: burst }\n",
               13, 30, "plans.free.claims[0].vs: unknown plan \"gold\"");
    expect_err("subjects:\n  alice: { plan: free, org: acme }\n", 13, 29,
               "unknown org \"acme\" (no orgs are defined)");
}

static void test_err_duplicate_window(void **state)
{
    (void)state;
    expect_err("      - { name: burst, type: rolling, length: 1h, limit: 5 }\n",
               12, 17,
               "plans.free.windows[1].name: duplicate window name \"burst\" "
               "(first defined at line 11)");
    expect_err("      - { name: concurrency, type: rate, per: 1s, limit: 5 }\n",
               12, 17, "reserved");
}

static void test_err_claim_window(void **state)
{
    (void)state;
    expect_err("  pro:\n    windows:\n"
               "      - { name: burst, type: rolling, length: 5h, limit: 50 }\n"
               "    claims:\n"
               "      - { multiplier: 10, vs: free, window: weekly }\n",
               16, 45,
               "plans.pro.claims[0].window: plan pro has no window \"weekly\"");
    expect_err("  pro:\n    windows:\n"
               "      - { name: weekly, type: rolling, length: 7d, limit: 50 }\n"
               "    claims:\n"
               "      - { multiplier: 10, vs: free, window: weekly }\n",
               16, 45, "plan free has no window \"weekly\"");
}

static void test_err_missing_key(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling, length: 5h }\n", 12, 9,
               "plans.free.windows[1]: missing required key \"limit\"");
    expect_err("      - { name: w2, type: rolling, limit: 5 }\n", 12, 9,
               "missing required key \"length\"");
    expect_err("    overage: { policy: queue }\n", 12, 14,
               "plans.free.overage: missing required key \"max_wait\"");
}

static void test_err_missing_top(void **state)
{
    static const char text[] = "version: \"v1\"\nunit: x\n";
    qg_rules *r = NULL;
    qg_diag d;
    (void)state;
    assert_int_equal(qg__rules_parse(text, strlen(text), "m.yaml", utc_only,
                                    NULL, &r, &d), QG_ERULES);
    assert_null(r);
    assert_int_equal(d.line, 1);
    assert_int_equal(d.column, 1);
    assert_non_null(strstr(d.message, "missing required key \"weights\""));
    assert_int_equal(qg__rules_parse("", 0, "e.yaml", utc_only, NULL, &r, &d),
                     QG_ERULES);
    assert_non_null(strstr(d.message, "empty rules file"));
}

static void test_err_window_type(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: fixed, limit: 5 }\n", 12, 27,
               "plans.free.windows[1].type: unknown window type \"fixed\" "
               "(expected one of: rolling, calendar, session, rate)");
}

static void test_err_duration(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: rolling, length: 5x, limit: 5 }\n",
               12, 44,
               "plans.free.windows[1].length: expected a duration such as "
               "90s, 30m, 5h, 7d, got \"5x\"");
    expect_err("      - { name: w2, type: rolling, length: 0s, limit: 5 }\n",
               12, 44, "expected a duration > 0");
    expect_err("      - { name: w2, type: rolling, length: 1h, limit: 5, "
               "precision: 2h }\n", 12, 69, "at most the window length");
}

static void test_err_key_for_type(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: calendar, every: day, length: 5h, "
               "limit: 5 }\n", 12, 49,
               "plans.free.windows[1]: length is not used by calendar "
               "windows");
    expect_err("    overage: { policy: reject, max_wait: 5s }\n", 12, 32,
               "max_wait is not used by the reject policy");
    expect_err("      - { name: w2, type: calendar, every: day, anchor: "
               "billing, limit: 5 }\n", 12, 57,
               "anchor: billing needs every: month");
    expect_err("      - { name: w2, type: calendar, every: week, at: \"XYZ "
               "00:00\", limit: 5 }\n", 12, 54, "expected \"DAY HH:MM\"");
}

static void test_err_tz(void **state)
{
    (void)state;
    expect_err("      - { name: w2, type: calendar, every: day, "
               "tz: \"Mars/Olympus\", limit: 5 }\n", 12, 53,
               "plans.free.windows[1].tz: unknown time zone \"Mars/Olympus\": "
               "no zone named Mars/Olympus");
}

static void test_err_anchor(void **state)
{
    (void)state;
    expect_err("default_plan: &p free\n", 12, 15, "anchors are not supported");
}

/* Every prefix of the example is parsed without a crash or a leak, and
 * every failure carries a position and a message. */
/* Read $QG_TESTDATA/rel into buf (NUL-terminated); returns its length. */
static size_t read_data(const char *rel, char *buf, size_t cap)
{
    const char *dir = getenv("QG_TESTDATA");
    char path[1024];
    FILE *f;
    size_t n;
    if (!dir)
        fail_msg("QG_TESTDATA is not set (run through tests/run.sh)");
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (!(f = fopen(path, "rb")))
        fail_msg("cannot open %s", path);
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n;
}

/* A model's `upstream:` is kept as written (its shape checked); absent,
 * NULL (the server's --upstream). */
static void test_upstreams(void **state)
{
    char text[4096];
    size_t n = read_data("rules/upstreams.yaml", text, sizeof text);
    qg_rules *r = NULL;
    qg_diag d;
    (void)state;
    assert_int_equal(qg__rules_parse(text, n, "upstreams.yaml", utc_only,
                                    NULL, &r, &d), 0);
    assert_int_equal(r->nmodels, 3);
    assert_null(r->models[qg_rules_find_model(r, "light")].upstream);
    assert_string_equal(r->models[qg_rules_find_model(r, "large")].upstream,
                        "http://10.0.0.7:8000/openai/");
    assert_string_equal(r->models[qg_rules_find_model(r, "claude")].upstream,
                        "HTTPS://[::1]:8443");
    qg_rules_free(r);
}

/* A malformed upstream URL is a rules error at the URL's position. */
static void test_err_upstream(void **state)
{
    char text[4096], shown[1024];
    size_t n = read_data("rules/bad_upstream_url.yaml", text, sizeof text);
    qg_rules *r = NULL;
    qg_diag d;
    (void)state;
    assert_int_equal(qg__rules_parse(text, n, "bad_upstream_url.yaml",
                                    utc_only, NULL, &r, &d), QG_ERULES);
    qg__diag_format(&d, shown, sizeof shown);
    /* the file's first line says what is expected */
    assert_non_null(strstr(text, shown));
    assert_int_equal(d.line, 8);
    assert_int_equal(d.column, 40);
}

/* A file whose one model (line 6) has upstream: value; expect the error
 * at 6:col naming why. */
static void expect_upstream_err(const char *value, int col, const char *why)
{
    char text[2048], shown[1024];
    qg_rules *r = (qg_rules *)1;
    qg_diag d;
    int rc;
    snprintf(text, sizeof text,
             "version: \"v1\"\n"
             "weights:\n"
             "  version: \"w1\"\n"
             "  calibrated: \"2026-10-15\"\n"
             "  models:\n"
             "    m: { per_request: 1, upstream: %s }\n"
             "plans:\n"
             "  free:\n"
             "    windows: [ { name: b, type: rolling, length: 5h, "
             "limit: 5 } ]\n", value);
    rc = qg__rules_parse(text, strlen(text), "u.yaml", utc_only, NULL, &r, &d);
    qg__diag_format(&d, shown, sizeof shown);
    if (rc != QG_ERULES || r != NULL || d.line != 6 || d.column != col ||
        !strstr(d.message, "weights.models.m.upstream: expected an "
                           "upstream URL") ||
        !strstr(d.message, why))
        fail_msg("%s: want 6:%d \"%s\"; got %s", value, col, why, shown);
}

static void test_err_upstream_shapes(void **state)
{
    (void)state;
    expect_upstream_err("\"ftp://h/x\"", 36, "the scheme must be http");
    expect_upstream_err("\"http://\"", 36, "the host is missing");
    expect_upstream_err("\"http://u@h\"", 36, "user info");
    expect_upstream_err("\"http://h:0\"", 36, "the port must be");
    expect_upstream_err("\"http://h/v1?x=1\"", 36, "a query or fragment");
    expect_upstream_err("\"http://h/a b\"", 36, "a space");
    expect_upstream_err("\"http://[zz]\"", 36, "[ADDRESS]");
    expect_upstream_err("[ \"http://h\" ]", 36, "got a list");
}

static void test_prefixes(void **state)
{
    size_t n;
    (void)state;
    for (n = 0; n < sizeof example - 1; n++) {
        qg_rules *r = NULL;
        qg_diag d;
        int rc = qg__rules_parse(example, n, "p.yaml", utc_only, NULL, &r, &d);
        if (rc == 0) {
            qg_rules_free(r);
            continue;
        }
        assert_int_equal(rc, QG_ERULES);
        assert_null(r);
        assert_true(d.line >= 1 && d.column >= 1);
        assert_true(d.message[0] != '\0');
    }
}

/* Without a resolver only "UTC" is known. */
static void test_no_resolver(void **state)
{
    qg_rules *r = NULL;
    qg_diag d;
    (void)state;
    assert_int_equal(qg__rules_parse(example, strlen(example), "x.yaml", NULL,
                                    NULL, &r, &d), 0);
    assert_int_equal(r->nzones, 1);
    qg_rules_free(r);
}

static void test_diag_format(void **state)
{
    qg_diag d;
    char buf[600];
    (void)state;
    memset(&d, 0, sizeof d);
    strcpy(d.path, "r.yaml");
    d.line = 3;
    d.column = 7;
    strcpy(d.message, "boom");
    qg__diag_format(&d, buf, sizeof buf);
    assert_string_equal(buf, "r.yaml:3:7: boom");
    d.line = 0;
    qg__diag_format(&d, buf, sizeof buf);
    assert_string_equal(buf, "r.yaml: boom");
}

/* Orgs and subjects by the tens of thousands: names are checked for
 * repeats and orgs looked up by name without a scan per pair (these were
 * quadratic); a repeat is reported at its own line, the first one in
 * document order, as before. */
static char *many_names(int norgs, int nsubjects, int dup_at, int dup_of)
{
    size_t cap = 256 + (size_t)norgs * 80 + (size_t)nsubjects * 48;
    char *t = malloc(cap);
    size_t n;
    assert_non_null(t);
    n = (size_t)snprintf(t, cap,
        "version: \"v\"\n"
        "weights:\n  version: \"w\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    m: { per_request: 1 }\n"
        "plans:\n  p:\n    windows:\n"
        "      - { name: w, type: rolling, length: 1h, limit: 5 }\n"
        "orgs:\n");
    for (int i = 0; i < norgs; i++)
        n += (size_t)snprintf(t + n, cap - n, "  org%d: { windows: [] }\n",
                              i == dup_at ? dup_of : i);
    n += (size_t)snprintf(t + n, cap - n, "subjects:\n");
    for (int i = 0; i < nsubjects; i++)
        n += (size_t)snprintf(t + n, cap - n,
                              "  user%d: { plan: p, org: org%d }\n", i,
                              (norgs - 1 - i % norgs));
    return t;
}

static void test_many_names(void **state)
{
    qg_rules *r = NULL;
    qg_diag d;
    char *t;
    (void)state;
    t = many_names(20000, 40000, -1, 0);
    assert_int_equal(qg__rules_parse(t, strlen(t), "many.yaml", utc_only, NULL,
                                    &r, &d), QG_OK);
    assert_int_equal(r->norgs, 20000);
    assert_int_equal(r->nsubjects, 40000);
    assert_int_equal(qg__rules_find_org(r, "org19999"), 19999);
    assert_int_equal(qg__rules_find_org(r, "org0"), 0);
    assert_int_equal(qg__rules_find_org(r, "org123"), 123);
    assert_int_equal(qg__rules_find_org(r, "org20000"), -1);
    assert_int_equal(qg__rules_find_org(r, ""), -1);
    assert_int_equal(r->subjects[0].org, 19999);
    assert_int_equal(r->subjects[39999].org, 20000 - 1 - 39999 % 20000);
    assert_int_equal(qg_rules_find_subject(r, "user39999"), 39999);
    assert_int_equal(qg_rules_find_subject(r, "user7"), 7);
    assert_int_equal(qg_rules_find_subject(r, "user40000"), -1);
    qg_rules_free(r);
    free(t);
    /* org15000 is written as a second org7: reported at its line (org0
     * is on line 12, one line per org) */
    t = many_names(20000, 10, 15000, 7);
    r = (qg_rules *)1;
    assert_int_equal(qg__rules_parse(t, strlen(t), "many.yaml", utc_only, NULL,
                                    &r, &d), QG_ERULES);
    assert_null(r);
    assert_int_equal(d.line, 12 + 15000);
    assert_non_null(strstr(d.message, "duplicate name \"org7\""));
    free(t);
    /* two repeats: the first in document order is reported */
    {
        static const char two[] =
            "version: \"v\"\n"
            "weights:\n  version: \"w\"\n  calibrated: \"2026-01-01\"\n"
            "  models:\n    m: { per_request: 1 }\n"
            "plans:\n  p:\n    windows:\n"
            "      - { name: w, type: rolling, length: 1h, limit: 5 }\n"
            "orgs:\n"
            "  b: { windows: [] }\n"
            "  a: { windows: [] }\n"
            "  c: { windows: [] }\n"
            "  b: { windows: [] }\n"
            "  a: { windows: [] }\n";
        r = (qg_rules *)1;
        assert_int_equal(qg__rules_parse(two, strlen(two), "two.yaml",
                                        utc_only, NULL, &r, &d), QG_ERULES);
        assert_int_equal(d.line, 15);
        assert_non_null(strstr(d.message, "duplicate name \"b\""));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_err_versions),
        cmocka_unit_test(test_err_syntax),
        cmocka_unit_test(test_err_unknown_key),
        cmocka_unit_test(test_err_wrong_type),
        cmocka_unit_test(test_err_limits),
        cmocka_unit_test(test_err_overflow),
        cmocka_unit_test(test_err_unknown_model),
        cmocka_unit_test(test_err_unknown_plan),
        cmocka_unit_test(test_err_duplicate_window),
        cmocka_unit_test(test_err_claim_window),
        cmocka_unit_test(test_err_missing_key),
        cmocka_unit_test(test_err_missing_top),
        cmocka_unit_test(test_err_window_type),
        cmocka_unit_test(test_err_duration),
        cmocka_unit_test(test_reconcile_block),
        cmocka_unit_test(test_err_key_for_type),
        cmocka_unit_test(test_err_tz),
        cmocka_unit_test(test_err_anchor),
        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_no_resolver),
        cmocka_unit_test(test_diag_format),
        cmocka_unit_test(test_upstreams),
        cmocka_unit_test(test_err_upstream),
        cmocka_unit_test(test_err_upstream_shapes),
        cmocka_unit_test(test_many_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
