/* test_explain.c - one request's charge reconstructed from the ledger
 * (PRODUCT.md 8 "Explain", docs/api.md, docs/cli.md): GET
 * /v1/admin/requests/{id} through a real `quotagate serve`, and
 * `quotagate explain` on the same ledger, for an allowed request settled
 * lower than reserved, a cancelled one, a refused one and a payg one.
 * Every figure is checked against the decisions that made it: the
 * check's answer (its windows' used after the reservation, the weight),
 * the settle's answer (charged, overage), the 429's binding window and
 * retry-after; none is written down by hand.  The CLI's --json is the
 * API's JSON; an unknown id is 404 and exit 1.
 *
 * Run twice: on the SQLite ledger, then on a PostgreSQL one (pgproc). */
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

#include "httpc.h"
#include "pgproc.h"
#include "qgproc.h"
#include "runcli.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY

static qgproc P;
static httpc C;
static pgproc PG;
static int on_pg;
static char pg_db[64], pg_url[256], rules_src[1024];

static http_resp *call(const char *method, const char *path, const char *key,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, C.err);
    return r;
}

static json_t *check(const char *subject, const char *rid, const char *model,
                     int in, int max_out, int status)
{
    http_resp *r = call("POST", "/v1/check", SERVICE, tst_fmt(
        "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":\"%s\","
        "\"input_tokens\":%d,\"max_output_tokens\":%d}", subject, rid, model,
        in, max_out));
    WANT(r, status, "check");
    return tst_jparse(r, "check");
}

static json_t *settle(const char *rid, int in, int out, const char *status)
{
    http_resp *r = call("POST", "/v1/settle", SERVICE, tst_fmt(
        "{\"request_id\":\"%s\",\"input_tokens\":%d,\"output_tokens\":%d,"
        "\"status\":\"%s\"}", rid, in, out, status));
    WANT(r, 200, "settle");
    return tst_jparse(r, "settle");
}

static json_t *explain_api(const char *rid)
{
    http_resp *r = call("GET", tst_fmt("/v1/admin/requests/%s", rid), ADMIN,
                        NULL);
    WANT(r, 200, "explain");
    return tst_jparse(r, "explain");
}

/* The window of a check's answer named as explain names it: an org's
 * window is "org.NAME" (docs/api.md "Window names"). */
static json_t *window_of(json_t *windows, const char *name)
{
    size_t i;
    json_t *w;
    json_array_foreach(windows, i, w) {
        const char *n = json_string_value(json_object_get(w, "name"));
        const char *sc = json_string_value(json_object_get(w, "scope"));
        char q[160];
        snprintf(q, sizeof q, "%s%s",
                 sc && !strcmp(sc, "org") && strncmp(n, "org.", 4) ? "org."
                                                                    : "",
                 n);
        if (!strcmp(q, name))
            return w;
    }
    fail_msg("no window %s in %s", name, tst_dump(windows));
    return NULL;
}

static double num(json_t *o, const char *k)
{
    return tst_jnum(o, k, k);
}

/* Each window of explain e against the check's answer c that made it:
 * used_before = what the check saw used minus its own reservation (in
 * the windows that count it), used_after = used_before + charged. */
static void want_windows_match(json_t *e, json_t *c, double reserved)
{
    size_t i;
    json_t *w;
    assert_true(json_array_size(json_object_get(e, "windows")) ==
                json_array_size(json_object_get(c, "windows")));
    json_array_foreach(json_object_get(e, "windows"), i, w) {
        const char *name = tst_jstr(w, "name", "explain window");
        json_t *cw = window_of(json_object_get(c, "windows"), name);
        assert_true(NEAR(num(w, "limit"), num(cw, "limit")));
        assert_true(NEAR(num(w, "used_after"),
                         num(w, "used_before") + num(w, "charged")));
        if (!strcmp(tst_jstr(w, "unit", name), "requests"))
            continue;            /* the rate's refill moves with time */
        if (num(w, "charged") == 0 && reserved > 0 &&
            NEAR(num(cw, "used"), num(w, "used_before")))
            continue;            /* a window not counting this model */
        assert_true(NEAR(num(w, "used_before"),
                         num(cw, "used") - reserved));
    }
}

static json_t *explain_window(json_t *e, const char *name)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(e, "windows"), i, w)
        if (!strcmp(tst_jstr(w, "name", name), name))
            return w;
    fail_msg("explain has no window %s: %s", name, tst_dump(e));
    return NULL;
}

static tst_cli_result cli_explain(const char *rid, int json)
{
    const char *src = on_pg ? "--ledger" : "--data";
    const char *where = on_pg ? pg_url : P.data;
    return tst_cli_run("explain", rid, src, where, "-c", rules_src,
                       json ? "--json" : NULL, NULL);
}

static int setup(void **state)
{
    const char *td = getenv("QG_TESTDATA");
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    httpc_init(&C, 0);
    if (!td) {
        fprintf(stderr, "QG_TESTDATA is not set (run through tests/run.sh)\n");
        return -1;
    }
    snprintf(rules_src, sizeof rules_src, "%s/explain/rules.yaml", td);
    if (qgproc_init(&P) < 0) {
        fprintf(stderr, "qgproc_init: %s\n", P.why);
        return -1;
    }
    if (on_pg) {
        const char *args[] = {"--ledger", pg_url, NULL};
        if (pgproc_start(&PG) < 0 ||
            pgproc_createdb(&PG, pg_db, sizeof pg_db) < 0) {
            fprintf(stderr, "PostgreSQL: %s\n", PG.why);
            return -1;
        }
        pgproc_url(&PG, pg_db, pg_url, sizeof pg_url);
        if (qgproc_start_copy(&P, rules_src, args, NULL) < 0)
            return -1;
    } else if (qgproc_start_copy(&P, rules_src, NULL, NULL) < 0) {
        return -1;
    }
    httpc_init(&C, qgproc_port(&P));
    return 0;
}

static int teardown(void **state)
{
    int rc;
    (void)state;
    httpc_close(&C);
    rc = qgproc_finish(&P);
    tst_gc_free_all();
    if (on_pg)
        pgproc_destroy(&PG);
    return rc;
}

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

/* Allowed, settled lower than reserved; the org's pool holds another
 * member's charge before it. */
static void test_allowed_settled_lower(void **state)
{
    const char *r0 = tst_uid("x-m2"), *r1 = tst_uid("x-m1");
    json_t *c, *s, *e, *w;
    tst_cli_result cr;
    (void)state;
    check("m2", r0, "std", 1000, 1000, 200);
    settle(r0, 1000, 400, "completed");
    c = check("m1", r1, "std", 1000, 2000, 200);
    s = settle(r1, 1000, 1000, "completed");
    e = explain_api(r1);
    assert_string_equal(tst_jstr(e, "request_id", "e"), r1);
    assert_string_equal(tst_jstr(e, "subject", "e"), "m1");
    assert_string_equal(tst_jstr(e, "org", "e"), "team");
    assert_string_equal(tst_jstr(e, "plan", "e"), "basic");
    assert_string_equal(tst_jstr(e, "rule_version", "e"),
                        tst_jstr(c, "rules_version", "c"));
    assert_string_equal(tst_jstr(e, "weight_version", "e"),
                        tst_jstr(c, "weights_version", "c"));
    assert_string_equal(tst_jstr(e, "model", "e"), "std");
    assert_string_equal(tst_jstr(e, "decision", "e"), "allow");
    assert_string_equal(tst_jstr(e, "status", "e"), "completed");
    assert_true(json_is_string(json_object_get(e, "settled_at")));
    assert_true(json_is_null(json_object_get(e, "retry_after_s")));
    w = json_object_get(e, "weight");
    assert_true(NEAR(num(w, "reserved"), num(c, "weight")));
    assert_true(NEAR(num(w, "charged"), num(s, "charged")));
    assert_true(NEAR(num(w, "computed"), num(s, "actual")));
    assert_true(num(w, "charged") < num(w, "reserved"));
    assert_true(num(w, "input_tokens") == 1000);
    assert_true(num(w, "output_tokens") == 1000);
    assert_non_null(strstr(tst_jstr(w, "formula", "w"), "1000 output tokens"));
    want_windows_match(e, c, num(c, "weight"));
    /* the charge counts in its windows, not in the one of another model */
    assert_true(NEAR(num(explain_window(e, "burst_1h"), "charged"),
                     num(s, "charged")));
    assert_true(NEAR(num(explain_window(e, "org.pool"), "charged"),
                     num(s, "charged")));
    assert_true(num(explain_window(e, "weekly_big"), "charged") == 0);
    /* m2's row is in the pool before it */
    assert_true(num(explain_window(e, "org.pool"), "used_before") >=
                num(explain_window(e, "burst_1h"), "used_before") + 3);
    assert_true(json_is_false(json_object_get(e, "fallback")));
    assert_true(json_is_null(json_object_get(e, "overage")));

    /* the CLI on the same ledger: the same JSON; in words by default */
    cr = cli_explain(r1, 1);
    if (cr.rc != 0)
        fail_msg("explain --json: exit %d: %s", cr.rc, cr.err);
    {
        json_t *j = tst_jparse_text(cr.out, strlen(cr.out), "cli");
        if (!json_equal(j, e))
            fail_msg("CLI %s\nAPI %s", cr.out, tst_dump(e));
    }
    tst_cli_done(&cr);
    cr = cli_explain(r1, 0);
    assert_int_equal(cr.rc, 0);
    assert_non_null(strstr(cr.out, r1));
    assert_non_null(strstr(cr.out, "used before"));
    assert_non_null(strstr(cr.out, "org.pool"));
    tst_cli_done(&cr);
}

static void test_cancelled(void **state)
{
    const char *rid = tst_uid("x-c");
    json_t *c, *s, *e;
    (void)state;
    c = check("m1", rid, "std", 500, 3000, 200);
    s = settle(rid, 500, 200, "cancelled");
    e = explain_api(rid);
    assert_string_equal(tst_jstr(e, "status", "e"), "cancelled");
    assert_true(NEAR(num(json_object_get(e, "weight"), "charged"),
                     num(s, "charged")));
    assert_true(NEAR(num(json_object_get(e, "weight"), "reserved"),
                     num(c, "weight")));
    want_windows_match(e, c, num(c, "weight"));
    assert_true(NEAR(num(explain_window(e, "weekly"), "charged"),
                     num(s, "charged")));
}

/* Refused: the binding window and the retry-after the engine computes
 * from what the ledger held are the 429's. */
static void test_refused(void **state)
{
    const char *r1 = tst_uid("x-s"), *r2 = tst_uid("x-s");
    json_t *c, *e, *err, *w;
    tst_cli_result cr;
    (void)state;
    check("solo", r1, "std", 0, 7000, 200);       /* 36 of 40 */
    settle(r1, 0, 7000, "completed");
    c = check("solo", r2, "std", 0, 2000, 429);   /* 11 more: refused */
    err = json_object_get(c, "error");
    e = explain_api(r2);
    assert_string_equal(tst_jstr(e, "decision", "e"), "reject");
    assert_string_equal(tst_jstr(e, "status", "e"), "rejected");
    assert_string_equal(tst_jstr(e, "window", "e"),
                        tst_jstr(err, "window", "error"));
    assert_true(NEAR(num(e, "retry_after_s"), num(c, "retry_after_s")));
    assert_true(num(json_object_get(e, "weight"), "charged") == 0);
    want_windows_match(e, c, 0);
    w = explain_window(e, "burst_1h");
    assert_true(num(w, "charged") == 0);
    assert_true(NEAR(num(w, "used_before"), 36));
    assert_true(json_is_true(json_object_get(json_object_get(
        json_object_get(e, "replay"), "recheck"), "agrees")));

    /* an unknown id: 404 and exit 1 */
    WANT(call("GET", "/v1/admin/requests/no-such-id", ADMIN, NULL), 404,
         "unknown id");
    cr = cli_explain("no-such-id", 0);
    assert_int_equal(cr.rc, 1);
    assert_non_null(strstr(cr.err, "no-such-id"));
    tst_cli_done(&cr);
    /* the admin key only */
    WANT(call("GET", tst_fmt("/v1/admin/requests/%s", r2), SERVICE, NULL),
         403, "service key");
}

/* payg: the overage is the settle's. */
static void test_payg(void **state)
{
    const char *r1 = tst_uid("x-p"), *r2 = tst_uid("x-p");
    json_t *s, *e, *o;
    (void)state;
    check("payer", r1, "std", 0, 1800, 200);      /* 10: fills burst_1h */
    settle(r1, 0, 1800, "completed");
    check("payer", r2, "std", 0, 1000, 200);      /* 6 beyond: payg */
    s = settle(r2, 0, 600, "completed");          /* 4 beyond */
    e = explain_api(r2);
    o = json_object_get(e, "overage");
    if (!json_is_object(o))
        fail_msg("no overage: %s", tst_dump(e));
    assert_true(NEAR(num(o, "weight"), num(s, "overage_units")));
    assert_true(NEAR(num(o, "cost_usd"), num(s, "overage_cost_usd")));
    assert_true(num(o, "weight") > 0);
    assert_true(NEAR(num(explain_window(e, "burst_1h"), "used_before"), 10));
}

static void test_no_ledger(void **state)
{
    tst_cli_result cr;
    (void)state;
    cr = tst_cli_run("explain", "x", "--data", "/nonexistent-qg-dir", "-c",
                     rules_src, NULL);
    assert_int_equal(cr.rc, 2);
    assert_non_null(strstr(cr.err, "no ledger"));
    tst_cli_done(&cr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_allowed_settled_lower, gc_teardown),
        cmocka_unit_test_teardown(test_cancelled, gc_teardown),
        cmocka_unit_test_teardown(test_refused, gc_teardown),
        cmocka_unit_test_teardown(test_payg, gc_teardown),
        cmocka_unit_test_teardown(test_no_ledger, gc_teardown),
    };
    int failed = cmocka_run_group_tests_name("explain_sqlite", tests, setup,
                                             teardown);
    if (!pgproc_bindir()) {
        fprintf(stderr, "no PostgreSQL binaries: make test installs "
                "Debian's postgresql\n");
        return 1;
    }
    on_pg = 1;
    return failed + cmocka_run_group_tests_name("explain_postgresql", tests,
                                                setup, teardown);
}
