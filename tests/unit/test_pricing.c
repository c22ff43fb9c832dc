/* test_pricing.c - `quotagate pricing` (PRODUCT.md 8 "Pricing",
 * docs/cli.md): the three formats of examples/rules.yaml with every
 * figure checked against `analyze --json` (limits, redeemable allowances,
 * effective multipliers, binding windows, claims); the Markdown and HTML
 * pages say exactly the JSON's sentences; docs/pricing.md is the current
 * output; and the one phrase builder's words are the same string in
 * pricing, in GET /v1/plans (windows' text, plans' statements) and in a
 * 429's error.message, through a real `quotagate serve`. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "httpc.h"
#include "qgproc.h"
#include "runcli.h"
#include "srvtest.h"

#define SERVICE QGPROC_SERVICE_KEY

static char rules[1024], docs_pricing[1024];

static tst_cli_result run_ok(tst_cli_result r, const char *what)
{
    if (r.rc != 0)
        fail_msg("%s: exit %d: %s", what, r.rc, r.err);
    return r;
}

/* r's stdout as JSON (freed at teardown, tst_gc), r released */
static json_t *parse_out(tst_cli_result *r, const char *what)
{
    json_t *j = tst_jparse_text(r->out, strlen(r->out), what);
    tst_cli_done(r);
    return j;
}

static json_t *by_key(json_t *arr, const char *key, const char *val)
{
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o) {
        const char *s = json_string_value(json_object_get(o, key));
        if (s && !strcmp(s, val))
            return o;
    }
    return NULL;
}

static double num(json_t *o, const char *k)
{
    return tst_jnum(o, k, k);
}

static int setup(void **state)
{
    const char *ex = getenv("QG_EXAMPLES");
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!ex) {
        fprintf(stderr, "QG_EXAMPLES is not set (run through tests/run.sh)\n");
        return -1;
    }
    snprintf(rules, sizeof rules, "%s/rules.yaml", ex);
    snprintf(docs_pricing, sizeof docs_pricing, "%s/../docs/pricing.md", ex);
    return 0;
}

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

/* Every figure of pricing --format json against analyze --json. */
static void test_json_against_analyze(void **state)
{
    tst_cli_result r;
    json_t *pj, *aj, *pp, *ap;
    size_t i, k;
    int window_statements = 0, effective_statements = 0;
    (void)state;
    r = run_ok(tst_cli_run("pricing", "-c", rules, "--format", "json", NULL),
               "pricing json");
    pj = parse_out(&r, "pricing json");
    r = run_ok(tst_cli_run("analyze", "-c", rules, "--json", NULL), "analyze");
    aj = parse_out(&r, "analyze json");
    assert_string_equal(tst_jstr(pj, "baseline", "p"),
                        tst_jstr(aj, "baseline", "a"));
    assert_string_equal(tst_jstr(pj, "unit", "p"), tst_jstr(aj, "unit", "a"));
    assert_true(num(pj, "period_s") == num(aj, "period_s"));
    assert_true(json_array_size(json_object_get(pj, "plans")) ==
                json_array_size(json_object_get(aj, "plans")));
    json_array_foreach(json_object_get(pj, "plans"), i, pp) {
        const char *plan = tst_jstr(pp, "plan", "plan");
        json_t *w, *s;
        ap = by_key(json_object_get(aj, "plans"), "plan", plan);
        assert_non_null(ap);
        assert_true(NEAR(num(pp, "redeemable"), num(ap, "redeemable")));
        json_array_foreach(json_object_get(pp, "windows"), k, w) {
            const char *name = tst_jstr(w, "name", "w");
            json_t *aw = by_key(json_object_get(ap, "windows"), "name", name);
            if (!aw)
                aw = by_key(json_object_get(ap, "other_windows"), "name", name);
            if (!aw)
                fail_msg("analyze has no window %s of %s", name, plan);
            assert_true(NEAR(num(w, "limit"), num(aw, "limit")));
            assert_true(strlen(tst_jstr(w, "text", "text")) > 0);
        }
        json_array_foreach(json_object_get(pp, "statements"), k, s) {
            const char *kind = tst_jstr(s, "kind", "kind");
            if (!strcmp(kind, "effective")) {
                effective_statements++;
                assert_true(NEAR(num(s, "multiplier"),
                                 num(ap, "effective_multiplier")));
                assert_string_equal(tst_jstr(s, "window", "w"),
                                    tst_jstr(ap, "binding_window", "b"));
                /* always after the window statements of the plan */
                assert_int_equal(k, json_array_size(json_object_get(
                                        pp, "statements")) - 1);
            } else {
                json_t *c = by_key(json_object_get(ap, "claims"), "window",
                                   tst_jstr(s, "window", "w"));
                assert_string_equal(kind, "window");
                assert_non_null(c);
                window_statements++;
                assert_true(NEAR(num(s, "multiplier"), num(c, "multiplier")));
            }
        }
    }
    /* the example's claims: 5x and 20x, with 3.5x and 6x after them */
    assert_int_equal(window_statements, 2);
    assert_int_equal(effective_statements, 2);
    {
        json_t *m5 = json_object_get(by_key(json_object_get(pj, "plans"),
                                            "plan", "max5"), "statements");
        json_t *m20 = json_object_get(by_key(json_object_get(pj, "plans"),
                                             "plan", "max20"), "statements");
        assert_non_null(strstr(tst_jstr(json_array_get(m5, 0), "text", "t"),
                               "up to 5\xc3\x97 Pro"));
        assert_non_null(strstr(tst_jstr(json_array_get(m5, 1), "text", "t"),
                               "3.5\xc3\x97 Pro per week"));
        assert_non_null(strstr(tst_jstr(json_array_get(m20, 0), "text", "t"),
                               "up to 20\xc3\x97 Pro"));
        assert_non_null(strstr(tst_jstr(json_array_get(m20, 1), "text", "t"),
                               "6\xc3\x97 Pro per week"));
    }
    assert_int_equal(json_array_size(json_object_get(pj, "weights")), 3);
    assert_true(json_is_array(json_object_get(pj, "changes")));
}

/* md and html say the JSON's sentences, each one. */
static void test_pages_say_the_json(void **state)
{
    tst_cli_result r, md, html;
    json_t *pj, *pp, *o;
    size_t i, k;
    (void)state;
    r = run_ok(tst_cli_run("pricing", "-c", rules, "--format", "json", NULL),
               "pricing json");
    pj = parse_out(&r, "pricing json");
    md = run_ok(tst_cli_run("pricing", "-c", rules, NULL), "pricing md");
    html = run_ok(tst_cli_run("pricing", "-c", rules, "--format", "html",
                              NULL), "pricing html");
    assert_non_null(strstr(html.out, "<!DOCTYPE html>"));
    assert_true(md.out[0] == '#');
    json_array_foreach(json_object_get(pj, "plans"), i, pp) {
        json_array_foreach(json_object_get(pp, "windows"), k, o) {
            const char *t = tst_jstr(o, "text", "t");
            if (!strstr(md.out, t) || !strstr(html.out, t))
                fail_msg("window text \"%s\" missing from a page", t);
        }
        json_array_foreach(json_object_get(pp, "statements"), k, o) {
            const char *t = tst_jstr(o, "text", "t");
            if (!strstr(md.out, t) || !strstr(html.out, t))
                fail_msg("statement \"%s\" missing from a page", t);
        }
    }
    json_array_foreach(json_object_get(pj, "weights"), i, o)
        assert_non_null(strstr(md.out, tst_jstr(o, "text", "t")));
    tst_cli_done(&md);
    tst_cli_done(&html);
    /* flags */
    r = tst_cli_run("pricing", "-c", rules, "--format", "pdf", NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("pricing", "-c", rules, "--baseline", "nope", NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
}

/* docs/pricing.md is what the build would write now. */
static void test_docs_pricing_current(void **state)
{
    tst_cli_result r;
    FILE *f;
    char *doc;
    long n;
    (void)state;
    r = run_ok(tst_cli_run("pricing", "-c", rules, "--at",
                           "2026-11-01T00:00:00Z", NULL), "pricing md");
    if (!(f = fopen(docs_pricing, "rb")))
        fail_msg("cannot open %s", docs_pricing);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    doc = calloc(1, (size_t)n + 1);
    assert_non_null(doc);
    assert_int_equal(fread(doc, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (strcmp(doc, r.out) != 0)
        fail_msg("docs/pricing.md is stale: regenerate it with build/quotagate "
                 "pricing -c examples/rules.yaml --at 2026-11-01T00:00:00Z");
    free(doc);
    tst_cli_done(&r);
}

/* The same words in pricing, /v1/plans and a 429's message. */
static void test_one_phrase_everywhere(void **state)
{
    qgproc p;
    httpc c;
    http_resp *r;
    tst_cli_result cr;
    json_t *pj, *plans, *pro, *text, *e;
    const char *burst;
    (void)state;
    cr = run_ok(tst_cli_run("pricing", "-c", rules, "--format", "json", NULL),
                "pricing json");
    pj = parse_out(&cr, "pricing json");
    burst = tst_jstr(by_key(json_object_get(by_key(json_object_get(pj,
                     "plans"), "plan", "pro"), "windows"), "name", "burst_5h"),
                     "text", "burst text");
    assert_int_equal(qgproc_init(&p), 0);
    if (qgproc_start_copy(&p, rules, NULL, NULL) < 0)
        fail_msg("serve: %s", p.why);
    httpc_init(&c, qgproc_port(&p));
    r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_int_equal(httpc_call(&c, "GET", "/v1/plans", NULL, NULL, NULL, r),
                     0);
    WANT(r, 200, "plans");
    plans = tst_jparse(r, "plans");
    pro = by_key(json_object_get(plans, "plans"), "name", "pro");
    text = json_object_get(by_key(json_object_get(pro, "windows"), "name",
                                  "burst_5h"), "text");
    assert_string_equal(json_string_value(text), burst);
    /* each plan's statements: pricing's, the same */
    for (int i = 0; i < 3; i++) {
        static const char *const names[] = {"pro", "max5", "max20"};
        json_t *a = json_object_get(by_key(json_object_get(plans, "plans"),
                                           "name", names[i]), "statements");
        json_t *b = json_object_get(by_key(json_object_get(pj, "plans"),
                                           "plan", names[i]), "statements");
        if (!json_equal(a, b))
            fail_msg("%s: /v1/plans %s, pricing %s", names[i], tst_dump(a),
                     tst_dump(b));
    }
    /* bob (pro) fills burst_5h: the 429 says the window in those words */
    r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_int_equal(httpc_call(&c, "POST", "/v1/check", "bearer", SERVICE,
                                "{\"subject\":\"bob\",\"request_id\":\"p1\","
                                "\"weight\":50}", r), 0);
    WANT(r, 200, "fill");
    r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_int_equal(httpc_call(&c, "POST", "/v1/check", "bearer", SERVICE,
                                "{\"subject\":\"bob\",\"request_id\":\"p2\","
                                "\"weight\":1}", r), 0);
    WANT(r, 429, "refused");
    e = json_object_get(tst_jparse(r, "429"), "error");
    assert_string_equal(tst_jstr(e, "window", "e"), "burst_5h");
    if (!strstr(tst_jstr(e, "message", "e"), burst))
        fail_msg("429 message \"%s\" lacks pricing's \"%s\"",
                 tst_jstr(e, "message", "e"), burst);
    httpc_close(&c);
    assert_int_equal(qgproc_finish(&p), 0);
}

/* --at across the versions of one file (PRODUCT.md 8): before v2's
 * instant the page is v1's and lists v2 with its date and words; at it,
 * the page is v2's (its lower limit in the window's text) and lists
 * nothing upcoming. */
static void test_at_across_versions(void **state)
{
    char path[] = "/tmp/qgpricing.XXXXXX";
    int fd = mkstemp(path);
    static const char text[] =
        "version: \"v1\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    light: { per_request: 1 }\n"
        "plans:\n  basic:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
        "---\n"
        "version: \"v2\"\n"
        "effective: \"2027-01-15T00:00:00Z\"\n"
        "announced: \"2026-12-01T00:00:00Z\"\n"
        "notice: 30d\n"
        "changes: \"basic: burst lowered from 10 to 4\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    light: { per_request: 1 }\n"
        "plans:\n  basic:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 1h, limit: 4 }\n";
    tst_cli_result r;
    json_t *j, *ch, *w;
    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    r = run_ok(tst_cli_run("pricing", "-c", path, "--format", "json", "--at",
                           "2027-01-14T23:59:59Z", NULL), "pricing --at before");
    j = parse_out(&r, "pricing before");
    assert_string_equal(tst_jstr(j, "rule_version", "before"), "v1");
    ch = json_object_get(j, "changes");
    assert_int_equal(json_array_size(ch), 1);
    assert_string_equal(tst_jstr(json_array_get(ch, 0), "version", "change"),
                        "v2");
    assert_string_equal(tst_jstr(json_array_get(ch, 0), "effective", "change"),
                        "2027-01-15T00:00:00Z");
    assert_string_equal(tst_jstr(json_array_get(ch, 0), "changes", "change"),
                        "basic: burst lowered from 10 to 4");
    w = json_array_get(json_object_get(json_array_get(json_object_get(j,
                       "plans"), 0), "windows"), 0);
    assert_true(num(w, "limit") == 10);
    r = run_ok(tst_cli_run("pricing", "-c", path, "--format", "json", "--at",
                           "2027-01-15T00:00:00Z", NULL), "pricing --at after");
    j = parse_out(&r, "pricing after");
    assert_string_equal(tst_jstr(j, "rule_version", "after"), "v2");
    assert_int_equal(json_array_size(json_object_get(j, "changes")), 0);
    w = json_array_get(json_object_get(json_array_get(json_object_get(j,
                       "plans"), 0), "windows"), 0);
    assert_true(num(w, "limit") == 4);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_json_against_analyze, gc_teardown),
        cmocka_unit_test_teardown(test_pages_say_the_json, gc_teardown),
        cmocka_unit_test_teardown(test_docs_pricing_current, gc_teardown),
        cmocka_unit_test_teardown(test_one_phrase_everywhere, gc_teardown),
        cmocka_unit_test_teardown(test_at_across_versions, gc_teardown),
    };
    return cmocka_run_group_tests_name("pricing", tests, setup, NULL);
}
