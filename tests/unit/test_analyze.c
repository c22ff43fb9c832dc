/* test_analyze.c - the analysis library called directly: closed-form caps
 * per window type (rolling, calendar, session, rate, concurrency, with a
 * weight that does not divide the limits), a plan whose windows interact so
 * that the min window ratio differs from the effective multiplier, the
 * engine-driven simulation agreeing with the arithmetic, claims, baseline
 * choice, lint findings on rules held in memory, and the trace parser. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis.h"
#include "civil.h"
#include "rules.h"
#include "tz.h"

#define DAY QG_MS_PER_DAY

static const char RULES[] =
    "version: \"t1\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    std: { per_request: 1, input_per_1k: 1, output_per_1k: 2 }\n"
    "plans:\n"
    "  base:\n"
    "    price: { usd_month: 10 }\n"
    "    windows:\n"
    "      - { name: hourly, type: rolling, length: 1h, limit: 10 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 6, unit: requests }\n"
    "    concurrency: 1\n"
    "  big:\n"
    "    price: { usd_month: 30 }\n"
    "    windows:\n"
    "      - { name: hourly, type: rolling, length: 1h, limit: 30 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", "
    "tz: \"UTC\", limit: 360 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 6, unit: requests }\n"
    "    concurrency: 2\n"
    "    claims:\n"
    "      - { multiplier: 3, vs: base, window: hourly, unit: \"weight "
    "points\" }\n"
    "  ratey:\n"
    "    price: { usd_month: 30 }\n"
    "    windows:\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 2, burst: 5, unit: "
    "requests }\n"
    "  sess:\n"
    "    windows:\n"
    "      - { name: hourly, type: session, length: 5h, limit: 20 }\n"
    "  slots:\n"
    "    windows:\n"
    "      - { name: hourly, type: rolling, length: 1h, limit: 3000 }\n"
    "    concurrency: 1\n"
    "analysis:\n"
    "  request: { weight: 3 }\n"
    "  duration: 10s\n";

static qg_tz *utc_only(const char *name, void *ud, char *err, size_t errcap)
{
    (void)ud;
    if (strcmp(name, "UTC") == 0)
        return qg__tz_utc();
    snprintf(err, errcap, "unknown zone %s", name);
    return NULL;
}

static qg_rules *parse_text(const char *text)
{
    qg_rules *r = NULL;
    qg_diag d;
    char msg[700];
    if (qg__rules_parse(text, strlen(text), "test.yaml", utc_only, NULL, &r,
                       &d) != QG_OK) {
        qg__diag_format(&d, msg, sizeof msg);
        fail_msg("rules: %s", msg);
    }
    return r;
}

static qg_rules *reload(void *ud, char *err, size_t errcap)
{
    (void)err;
    (void)errcap;
    return parse_text((const char *)ud);
}

static const qg_an_plan *plan(const qg_analysis *a, const char *name)
{
    for (int i = 0; i < a->nplans; i++)
        if (strcmp(a->plans[i].name, name) == 0)
            return &a->plans[i];
    fail_msg("no plan %s", name);
    return NULL;
}

static const qg_an_window *win(const qg_an_plan *p, const char *name)
{
    for (int i = 0; i < p->nwindows; i++)
        if (strcmp(p->windows[i].name, name) == 0)
            return &p->windows[i];
    fail_msg("no window %s", name);
    return NULL;
}

/* The analysis borrows names from the rules: free both with release(). */
static qg_rules *held;

static qg_analysis *analyze(const char *text, const char *baseline,
                            int64_t period, int simulate)
{
    qg_rules *r = held = parse_text(text);
    qg_analyze_opts o = { baseline, period, simulate, reload, (void *)text };
    qg_analysis *a = NULL;
    char err[512];
    if (qg__analyze(r, &o, &a, err, sizeof err) != QG_OK)
        fail_msg("analyze: %s", err);
    return a;
}

static void release(qg_analysis *a)
{
    qg__analysis_free(a);
    qg_rules_free(held);
    held = NULL;
}

/* Closed-form caps over one day for a request of weight 3. */
static void test_caps_per_window_type(void **state)
{
    qg_analysis *a = analyze(RULES, NULL, DAY, 0);
    const qg_an_plan *p;
    (void)state;

    assert_int_equal(a->period_ms, DAY);
    assert_int_equal(a->weight_milli, 3000);
    assert_string_equal(a->plans[a->baseline].name, "base");
    p = plan(a, "base");
    /* rolling 1h limit 10: 3 requests (9 points) per hour, 24 hours */
    assert_int_equal(win(p, "hourly")->cap_milli, 9000 * 24);
    /* rate 6/min, burst 6: 6 at once, then one every 10s while < 1d */
    assert_int_equal(win(p, "rpm")->cap_milli, (6 + 8640 - 1) * 3000LL);
    /* one slot, 10s each */
    assert_int_equal(win(p, "concurrency")->cap_milli, 8640 * 3000LL);
    assert_int_equal(p->redeemable_milli, 216000);
    assert_string_equal(p->windows[p->binding].name, "hourly");

    p = plan(a, "big");
    assert_int_equal(win(p, "daily")->cap_milli, 360000);
    assert_int_equal(p->redeemable_milli, 360000);
    assert_string_equal(p->windows[p->binding].name, "daily");

    p = plan(a, "ratey");           /* burst 5, then 2/min: 5 + 2879 */
    assert_int_equal(p->redeemable_milli, 2884 * 3000LL);
    assert_string_equal(p->windows[p->binding].name, "rpm");
    assert_int_equal(p->min_ratio_milli, 333);  /* rpm 2 vs 6, rounded down */

    p = plan(a, "sess");            /* 6 requests per 5h session, 5 sessions */
    assert_int_equal(p->redeemable_milli, 18000 * 5);

    p = plan(a, "slots");           /* concurrency binds: 8640 requests */
    assert_int_equal(p->redeemable_milli, 8640 * 3000LL);
    assert_string_equal(p->windows[p->binding].name, "concurrency");
    release(a);
}

/* big: hourly 3x, rpm 1x, concurrency 2x -> min ratio 1x; but its daily
 * total binds at 360 against base's 216 a day: 1.666x effective. */
static void test_interacting_windows(void **state)
{
    qg_analysis *a = analyze(RULES, NULL, DAY, 1);
    const qg_an_plan *p = plan(a, "big");
    const qg_an_claim *c;
    (void)state;

    assert_int_equal(win(p, "hourly")->ratio_milli, 3000);
    assert_int_equal(win(p, "rpm")->ratio_milli, 1000);
    assert_int_equal(win(p, "concurrency")->ratio_milli, 2000);
    assert_int_equal(win(p, "daily")->ratio_milli, -1);
    assert_int_equal(p->min_ratio_milli, 1000);
    assert_int_equal(p->effective_milli, 1666);
    assert_true(p->min_ratio_milli != p->effective_milli);
    assert_int_equal(p->nclaims, 1);
    c = &p->claims[0];
    assert_true(c->ok);
    assert_true(c->needs_disclosure);
    assert_int_equal(c->effective_milli, 1666);
    assert_non_null(strstr(c->message, "3x holds for hourly (30 vs 10 weight "
                                       "points)"));
    assert_non_null(strstr(c->message, "effective over 1d is 1.666x "
                                       "(binding: daily)"));
    release(a);
}

/* The engine, driven by a saturating client, admits exactly the computed
 * allowance for every window type. */
static void test_simulation_agrees(void **state)
{
    qg_analysis *a = analyze(RULES, NULL, DAY, 1);
    (void)state;
    for (int i = 0; i < a->nplans; i++) {
        const qg_an_plan *p = &a->plans[i];
        assert_true(p->simulated);
        if (!p->agree)
            fail_msg("plan %s: analytic %lld, simulated %lld", p->name,
                     (long long)p->redeemable_milli,
                     (long long)p->sim_redeemable_milli);
        assert_int_equal(p->sim_effective_milli, p->effective_milli);
        assert_true(p->sim_decisions > 0);
    }
    release(a);
}

static void test_baseline_and_period(void **state)
{
    qg_rules *r = parse_text(RULES);
    qg_analyze_opts o = { "nope", 0, 0, NULL, NULL };
    qg_analysis *a = NULL;
    char err[256];
    (void)state;

    assert_int_equal(qg__analysis_default_period(r), DAY);
    assert_int_equal(qg__analyze(r, &o, &a, err, sizeof err), QG_EINVAL);
    assert_null(a);
    assert_non_null(strstr(err, "nope"));
    o.baseline = "big";
    assert_int_equal(qg__analyze(r, &o, &a, err, sizeof err), QG_OK);
    assert_int_equal(a->period_ms, DAY);
    assert_string_equal(a->plans[a->baseline].name, "big");
    assert_int_equal(plan(a, "big")->effective_milli, 1000);
    assert_int_equal(plan(a, "base")->effective_milli, 600);
    /* the claim is still measured against its own "vs" plan */
    assert_int_equal(plan(a, "big")->claims[0].effective_milli, 1666);
    qg__analysis_free(a);
    qg_rules_free(r);
    assert_int_equal(qg__ratio_milli(7, 2), 3500);
    assert_int_equal(qg__ratio_milli(1, 3), 333);
    assert_int_equal(qg__ratio_milli(1, 0), -1);
}

/* A simulation on its own, over one hour from the origin. */
static void test_simulate_plan(void **state)
{
    int64_t adm, n;
    char err[256];
    (void)state;
    assert_int_equal(qg__simulate_plan(parse_text(RULES), "base",
                                      QG_SIM_ORIGIN_MS, 3600000, &adm, &n, err,
                                      sizeof err),
                     QG_OK);
    assert_int_equal(adm, 9000);
    assert_int_equal(qg__simulate_plan(parse_text(RULES), "none",
                                      QG_SIM_ORIGIN_MS, 3600000, &adm, &n, err,
                                      sizeof err),
                     QG_EINVAL);
}

/* ------------------------------------------------------------- lint */

static int has_finding(const qg_lint_result *res, const char *code,
                       const char *planname)
{
    for (int i = 0; i < res->nfindings; i++)
        if (strcmp(res->findings[i].code, code) == 0 &&
            (!planname || strcmp(res->findings[i].plan, planname) == 0))
            return 1;
    return 0;
}

static void test_lint_direct(void **state)
{
    qg_rules *r = parse_text(RULES), *prev;
    qg_lint_result res;
    char err[256], *older;
    (void)state;

    assert_int_equal(qg__lint(r, NULL, &res, err, sizeof err), QG_OK);
    assert_true(has_finding(&res, "claim-needs-disclosure", "big"));
    assert_true(has_finding(&res, "missing-period-total", "base"));
    assert_true(has_finding(&res, "missing-concurrency", "ratey"));
    assert_true(has_finding(&res, "missing-short-window", "big") == 0);
    assert_false(has_finding(&res, "weights-stale", NULL));
    qg__lint_free(&res);

    /* the previous rules gave base 12 an hour: this file lowers it to 10
     * without any announcement */
    older = strdup(RULES);
    assert_non_null(older);
    memcpy(strstr(older, "limit: 10 }"), "limit: 12 }", 11);
    prev = parse_text(older);
    assert_int_equal(qg__lint(r, prev, &res, err, sizeof err), QG_OK);
    assert_true(has_finding(&res, "change-without-notice", "base"));
    assert_false(has_finding(&res, "change-without-notice", "big"));
    qg__lint_free(&res);
    qg_rules_free(prev);
    free(older);
    qg_rules_free(r);
}

/* change-without-notice across the versions of one file: each kind of
 * change that gives a subject less, made alone in a second version. */
#define CN_BODY                                                               \
    "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"              \
    "  models:\n"                                                             \
    "    light: { per_request: 1, input_per_1k: 1, output_per_1k: 2 }\n"       \
    "    large: { per_request: 2 }\n"                                         \
    "plans:\n"                                                                \
    "  pro:\n    windows:\n"                                                  \
    "      - { name: burst, type: rolling, length: 5h, limit: 100 }\n"         \
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", " \
    "tz: \"UTC\", limit: 500 }\n"                                             \
    "      - { name: rpm, type: rate, per: 1m, limit: 10, burst: 20, "         \
    "unit: requests }\n"                                                      \
    "    concurrency: 4\n"                                                    \
    "  team:\n    windows:\n"                                                 \
    "      - { name: burst, type: rolling, length: 5h, limit: 200 }\n"

/* Lint v1 + v2, v2 being CN_BODY with `from` replaced by `to` (from ""
 * appends to), announced `announced` (NULL: not). */
static int lint_change(const char *from, const char *to, const char *announced,
                       qg_lint_result *res)
{
    char body[2048], text[4096], err[256];
    const char *at;
    qg_rules *r;
    int rc;
    snprintf(body, sizeof body, "%s", CN_BODY);
    if (!*from) {
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s", to);
    } else {
        at = strstr(CN_BODY, from);
        if (!at)
            fail_msg("no \"%s\" in the body", from);
        snprintf(body, sizeof body, "%.*s%s%s", (int)(at - CN_BODY), CN_BODY,
                 to, at + strlen(from));
    }
    snprintf(text, sizeof text, "version: \"v1\"\nnotice: 30d\n%s---\n"
             "version: \"v2\"\neffective: \"2027-01-15T00:00:00Z\"\n"
             "%s%s%s%s", CN_BODY, announced ? "announced: \"" : "",
             announced ? announced : "", announced ? "\"\n" : "", body);
    r = parse_text(text);
    rc = qg__lint(r, NULL, res, err, sizeof err);
    qg_rules_free(r);
    return rc;
}

/* The change-without-notice finding of version v2 whose message holds
 * `what`, or NULL. */
static const qg_finding *notice_finding(const qg_lint_result *res,
                                        const char *what)
{
    for (int i = 0; i < res->nfindings; i++)
        if (strcmp(res->findings[i].code, "change-without-notice") == 0 &&
            strcmp(res->findings[i].version, "v2") == 0 &&
            strstr(res->findings[i].message, what))
            return &res->findings[i];
    return NULL;
}

static int count_code(const qg_lint_result *res, const char *code)
{
    int n = 0;
    for (int i = 0; i < res->nfindings; i++)
        n += strcmp(res->findings[i].code, code) == 0;
    return n;
}

static void test_lint_change_without_notice(void **state)
{
    static const struct {
        const char *from, *to, *what, *plan, *item;
    } cases[] = {
        { "limit: 100 }", "limit: 90 }",
          "limit burst: 100 weight points -> 90 weight points", "pro",
          "burst" },
        { "limit: 10, burst", "limit: 5, burst",
          "rate rpm: 10 requests -> 5 requests", "pro", "rpm" },
        { "burst: 20", "burst: 15", "burst rpm: 20 requests -> 15 requests",
          "pro", "rpm" },
        { "length: 5h, limit: 100", "length: 6h, limit: 100",
          "length burst: 5h -> 6h", "pro", "burst" },
        { "every: week, at: \"MON 00:00\"", "every: month, at: \"1 00:00\"",
          "period weekly: week -> month", "pro", "weekly" },
        { "output_per_1k: 2", "output_per_1k: 3", "weight light: 1 + 1/1k in "
          "+ 2/1k out -> 1 + 1/1k in + 3/1k out", "", "light" },
        { "concurrency: 4", "concurrency: 3",
          "concurrency concurrency: 4 slots -> 3 slots", "pro",
          "concurrency" },
        { "  team:\n    windows:\n"
          "      - { name: burst, type: rolling, length: 5h, limit: 200 }\n",
          "", "plan-removed: 1 windows -> none", "team", "" },
        { "    large: { per_request: 2 }\n", "",
          "model-removed large: 2 + 0/1k in + 0/1k out -> none", "", "large" },
        { "", "      - { name: daily, type: calendar, every: day, at: "
          "\"00:00\", tz: \"UTC\", limit: 150 }\n",
          "window-added daily: none -> 150 weight points", "team", "daily" },
    };
    qg_lint_result res;
    const qg_finding *f;
    size_t i;
    (void)state;

    /* the same version twice: nothing changes, nothing to announce */
    assert_int_equal(lint_change("limit: 100 }", "limit: 100 }", NULL, &res),
                     QG_OK);
    assert_int_equal(count_code(&res, "change-without-notice"), 0);
    qg__lint_free(&res);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* unannounced: the finding, naming the change */
        assert_int_equal(lint_change(cases[i].from, cases[i].to, NULL, &res),
                         QG_OK);
        if (!(f = notice_finding(&res, cases[i].what)))
            fail_msg("case %zu: no change-without-notice \"%s\" (%d "
                     "findings%s%s)", i, cases[i].what, res.nfindings,
                     res.nfindings ? ", first: " : "",
                     res.nfindings ? res.findings[0].message : "");
        assert_int_equal(count_code(&res, "change-without-notice"), 1);
        assert_string_equal(f->plan, cases[i].plan);
        assert_string_equal(f->window, cases[i].item);
        assert_non_null(strstr(f->message, "at least 30d"));
        qg__lint_free(&res);
        /* announced 20 days ahead: still short of 30d */
        assert_int_equal(lint_change(cases[i].from, cases[i].to,
                                     "2026-12-26T00:00:00Z", &res), QG_OK);
        assert_non_null(notice_finding(&res, cases[i].what));
        qg__lint_free(&res);
        /* announced exactly 30 days ahead: enough */
        assert_int_equal(lint_change(cases[i].from, cases[i].to,
                                     "2026-12-16T00:00:00Z", &res), QG_OK);
        assert_int_equal(count_code(&res, "change-without-notice"), 0);
        qg__lint_free(&res);
    }
    /* changes that give more need no notice */
    assert_int_equal(lint_change("limit: 100 }", "limit: 120 }", NULL, &res),
                     QG_OK);
    assert_int_equal(count_code(&res, "change-without-notice"), 0);
    qg__lint_free(&res);
    assert_int_equal(lint_change("output_per_1k: 2", "output_per_1k: 1", NULL,
                                 &res), QG_OK);
    assert_int_equal(count_code(&res, "change-without-notice"), 0);
    qg__lint_free(&res);
}

/* ------------------------------------------------------------ trace */

static void test_trace_parse(void **state)
{
    static const char csv[] =
        "subject,t,model,output_tokens,input_tokens,request_id\r\n"
        "alice,0,std,10,100,a1\r\n"
        "\r\n"
        "\"bob \"\"b\"\"\",1.25,std,0,0,\r\n";
    qg_trace *t = NULL;
    char err[256];
    (void)state;

    assert_int_equal(qg__trace_parse(csv, strlen(csv), "x.csv", &t, err,
                                    sizeof err), QG_OK);
    assert_int_equal(t->nrows, 2);
    assert_string_equal(t->rows[0].subject, "alice");
    assert_string_equal(t->rows[0].model, "std");
    assert_int_equal(t->rows[0].input_tokens, 100);
    assert_int_equal(t->rows[0].output_tokens, 10);
    assert_string_equal(t->rows[0].request_id, "a1");
    assert_int_equal(t->rows[0].line, 2);
    assert_string_equal(t->rows[1].subject, "bob \"b\"");
    assert_int_equal(t->rows[1].t_ms, 1250);
    assert_null(t->rows[1].request_id);
    assert_int_equal(t->rows[1].line, 4);
    qg__trace_free(t);
}

static void test_trace_errors(void **state)
{
    static const struct { const char *csv, *want; } bad[] = {
        { "", "x.csv:1: header:" },
        { "t,subject\n0,a\n", "x.csv:1: header: expected a weight column" },
        { "t,subject,weight,model,input_tokens,output_tokens\n",
          "not both" },
        { "t,subject,weight,colour\n", "x.csv:1: header: unknown column "
                                       "\"colour\"" },
        { "t,t,subject,weight\n", "appears twice" },
        { "t,subject,weight\n0,a,1\n1,a\n", "x.csv:3: expected 3 fields" },
        { "t,subject,weight\n0,a,1\n-1,a,1\n", "x.csv:3: t: expected seconds" },
        { "t,subject,weight\n0.0001,a,1\n", "x.csv:2: t: expected seconds" },
        { "t,subject,weight\n2,a,1\n1,a,1\n", "x.csv:3: t: 1 is before" },
        { "t,subject,weight\n0,,1\n", "x.csv:2: subject: expected a value" },
        { "t,subject,weight\n0,a,x\n", "x.csv:2: weight: expected" },
        { "t,subject,weight\n0,\"a,1\n", "x.csv:2: unterminated" },
        { "t,subject,weight\n0,a\"b,1\n", "x.csv:2: a quote" },
    };
    char err[256];
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qg_trace *t = (qg_trace *)1;
        assert_int_equal(qg__trace_parse(bad[i].csv, strlen(bad[i].csv),
                                        "x.csv", &t, err, sizeof err),
                         QG_EINVAL);
        assert_null(t);
        if (!strstr(err, bad[i].want))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err, bad[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps_per_window_type),
        cmocka_unit_test(test_interacting_windows),
        cmocka_unit_test(test_simulation_agrees),
        cmocka_unit_test(test_baseline_and_period),
        cmocka_unit_test(test_simulate_plan),
        cmocka_unit_test(test_lint_direct),
        cmocka_unit_test(test_lint_change_without_notice),
        cmocka_unit_test(test_trace_parse),
        cmocka_unit_test(test_trace_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
