/* test_server_payg.c - the payg overage policy through `quotagate serve`
 * (docs/decisions.md "Overage: payg", docs/api.md): /v1/check admits past
 * a lifted window with the priced overage in its body and headers,
 * /v1/settle reprices it, /v1/usage shows the spent amount, the ledger
 * row carries the overage columns, the spending cap refuses with 429
 * spending_cap_reached (Retry-After, the overage object), a rate window
 * still refuses, and after kill -9 the spent amount is rebuilt from the
 * ledger, so the cap still holds.
 *
 * One server of its own on tests/data/payg/rules.yaml (qgproc). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "httpc.h"
#include "pgproc.h"
#include "qgproc.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY

static qgproc P;
static httpc C;
/* The second run's ledger: a database on a real PostgreSQL (pgproc). */
static pgproc PG;
static int on_pg;
static char pg_db[64], pg_url[256];

static http_resp *call(const char *method, const char *path, const char *key,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, C.err);
    return r;
}

static http_resp *check_w(const char *subject, const char *rid, double w)
{
    return call("POST", "/v1/check", SERVICE,
                tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                        "\"weight\":%g}", subject, rid, w));
}

static http_resp *settle_w(const char *rid, double w)
{
    return call("POST", "/v1/settle", SERVICE,
                tst_fmt("{\"request_id\":\"%s\",\"status\":\"completed\","
                        "\"weight\":%g}", rid, w));
}

static json_t *overage_of(json_t *j, const char *what)
{
    json_t *o = json_object_get(j, "overage");
    if (!json_is_object(o))
        fail_msg("%s: no overage object: %s", what, tst_dump(j));
    assert_string_equal(tst_jstr(o, "policy", what), "payg");
    return o;
}

static double spent(const char *subject)
{
    http_resp *r = call("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    WANT(r, 200, "usage");
    return tst_jnum(overage_of(tst_jparse(r, "usage"), "usage"), "spent_usd",
                    "usage");
}

typedef struct orow {
    long long weight, over, price, cost, headroom;
} orow;

/* The overage columns of rid's row once settled. */
static orow ledger_overage(const char *rid)
{
    long long v[5];
    if (on_pg) {
        char out[256];
        if (pgproc_sql(&PG, pg_db, tst_fmt("SELECT weight_milli || ' ' || "
                       "overage_milli || ' ' || overage_price_micro || ' ' "
                       "|| overage_cost_micro || ' ' || headroom_milli FROM "
                       "requests WHERE request_id = '%s'", rid), out,
                       sizeof out) < 0 ||
            sscanf(out, "%lld %lld %lld %lld %lld", &v[0], &v[1], &v[2],
                   &v[3], &v[4]) != 5)
            fail_msg("ledger row of %s on PostgreSQL: %s", rid, PG.why);
        return (orow){v[0], v[1], v[2], v[3], v[4]};
    }
    tst_ledger_ints(P.data, rid, "weight_milli, overage_milli, "
                    "overage_price_micro, overage_cost_micro, headroom_milli",
                    v, 5);
    return (orow){v[0], v[1], v[2], v[3], v[4]};
}

static int setup(void **state)
{
    const char *src = getenv("QG_TESTDATA");
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    httpc_init(&C, 0);
    if (!src) {
        fprintf(stderr, "QG_TESTDATA is not set (run through tests/run.sh)\n");
        return -1;
    }
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
        if (qgproc_start_copy(&P, tst_fmt("%s/payg/rules.yaml", src), args,
                              NULL) < 0)
            return -1;
    } else if (qgproc_start_copy(&P, tst_fmt("%s/payg/rules.yaml", src),
                                 NULL, NULL) < 0) {
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

static void test_overage_check_settle(void **state)
{
    const char *r1 = tst_uid("a"), *r2 = tst_uid("a");
    http_resp *r;
    json_t *j, *o;
    (void)state;
    /* 10 points fill burst_1h: admitted, nothing beyond */
    r = check_w("payer", r1, 10);
    WANT(r, 200, "check 10 (fills burst_1h)");
    o = overage_of(tst_jparse(r, "check"), "check");
    assert_true(NEAR(tst_jnum(o, "units", "check"), 0));
    assert_true(NEAR(tst_jnum(o, "cost_usd", "check"), 0));
    assert_true(NEAR(tst_jnum(o, "price_per_unit_usd", "check"), 0.01));
    assert_true(NEAR(tst_jnum(o, "spending_cap_usd", "check"), 0.1));
    if (http_resp_header(r, "x-quotagate-overage-units"))
        fail_msg("an allow within the limits says overage");
    WANT(settle_w(r1, 10), 200, "settle 10");

    /* 4 more: all overage, $0.04, said in body and headers */
    r = check_w("payer", r2, 4);
    WANT(r, 200, "check 4 beyond burst_1h (payg)");
    j = tst_jparse(r, "check");
    assert_string_equal(tst_jstr(j, "decision", "check"), "allow");
    o = overage_of(j, "check");
    assert_true(NEAR(tst_jnum(o, "units", "check"), 4));
    assert_true(NEAR(tst_jnum(o, "cost_usd", "check"), 0.04));
    assert_true(NEAR(tst_jnum(o, "spent_usd", "check"), 0.04));
    assert_non_null(http_resp_header(r, "x-quotagate-overage-units"));
    assert_string_equal(http_resp_header(r, "x-quotagate-overage-units"), "4");
    assert_string_equal(http_resp_header(r, "x-quotagate-overage-cost-usd"),
                        "0.04");
    /* the settle reprices from the real usage: 3 points, $0.03 */
    r = settle_w(r2, 3);
    WANT(r, 200, "settle 3");
    j = tst_jparse(r, "settle");
    assert_true(NEAR(tst_jnum(j, "overage_units", "settle"), 3));
    assert_true(NEAR(tst_jnum(j, "overage_cost_usd", "settle"), 0.03));
    assert_true(NEAR(spent("payer"), 0.03));
    {
        orow row = ledger_overage(r2);
        assert_int_equal(row.weight, 3000);
        assert_int_equal(row.over, 3000);
        assert_int_equal(row.price, 10000);
        assert_int_equal(row.cost, 30000);
        assert_int_equal(row.headroom, 0);
        row = ledger_overage(r1);
        assert_int_equal(row.over, 0);
        assert_int_equal(row.headroom, 10000);
    }
    /* the metrics count settled overage */
    r = call("GET", "/metrics", NULL, NULL);
    WANT(r, 200, "metrics");
    if (!strstr(r->body, "\nquotagate_overage_weight_total 3\n") ||
        !strstr(r->body, "\nquotagate_overage_cost_usd_total 0.03\n"))
        fail_msg("metrics without the overage: %s", tst_excerpt(r));
}

static void test_cap_and_restart(void **state)
{
    const char *rid;
    http_resp *r;
    json_t *j;
    (void)state;
    rid = tst_uid("c");
    WANT(check_w("payer2", rid, 10), 200, "check 10");
    WANT(settle_w(rid, 10), 200, "settle 10");
    /* $0.09 of overage */
    rid = tst_uid("c");
    WANT(check_w("payer2", rid, 9), 200, "check 9 (overage)");
    WANT(settle_w(rid, 9), 200, "settle 9");
    /* 2 more would make $0.11 > the $0.10 cap */
    r = check_w("payer2", tst_uid("c"), 2);
    WANT(r, 429, "check 2 past the spending cap");
    assert_string_equal(tst_error_type(r, "cap"), "spending_cap_reached");
    j = tst_jparse(r, "cap");
    assert_string_equal(tst_jstr(j, "decision", "cap"), "reject");
    assert_string_equal(tst_jstr(json_object_get(j, "error"), "window", "cap"),
                        "burst_1h");
    if (!strstr(tst_jstr(json_object_get(j, "error"), "message", "cap"),
                "spending cap"))
        fail_msg("cap message: %s", tst_dump(j));
    assert_true(NEAR(tst_jnum(overage_of(j, "cap"), "cost_usd", "cap"), 0.02));
    assert_true(NEAR(tst_jnum(overage_of(j, "cap"), "spent_usd", "cap"), 0.09));
    assert_true(tst_jbool(j, "retryable", "cap"));
    /* burst_1h has room for 2 points in an hour */
    {
        const char *ra = http_resp_header(r, "Retry-After");
        assert_non_null(ra);
        if (atol(ra) < 3500 || atol(ra) > 3600)
            fail_msg("Retry-After %s, expected about 3600", ra);
    }
    /* one point still fits ($0.10 exactly) */
    rid = tst_uid("c");
    WANT(check_w("payer2", rid, 1), 200, "check 1 up to the cap");
    WANT(settle_w(rid, 1), 200, "settle 1");
    assert_true(NEAR(spent("payer2"), 0.1));

    /* kill -9: the spent amount comes back from the ledger */
    qgproc_kill9(&P);
    httpc_close(&C);
    if (qgproc_restart(&P) < 0)
        fail_msg("restart after kill -9: %s", P.why);
    httpc_init(&C, qgproc_port(&P));
    assert_true(NEAR(spent("payer2"), 0.1));
    r = check_w("payer2", tst_uid("c"), 0.5);
    WANT(r, 429, "check past the cap after kill -9");
    assert_string_equal(tst_error_type(r, "cap after restart"),
                        "spending_cap_reached");
}

static void test_rate_not_lifted(void **state)
{
    http_resp *r = NULL;
    int refused = 0;
    (void)state;
    /* 100 requests a minute (a burst of 100): the 101st in the same
     * moment is refused by rpm, not charged as overage */
    for (int i = 0; i < 110 && !refused; i++) {
        const char *rid = tst_uid("q");
        r = check_w("payer3", rid, 0.001);
        if (r->status == 429)
            refused = 1;
        else
            WANT(settle_w(rid, 0.001), 200, "settle");
    }
    assert_true(refused);
    assert_string_equal(tst_error_type(r, "rpm"), "quota_exceeded");
    assert_string_equal(tst_jstr(json_object_get(tst_jparse(r, "rpm"), "error"),
                                 "window", "rpm"), "rpm");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_overage_check_settle, gc_teardown),
        cmocka_unit_test_teardown(test_cap_and_restart, gc_teardown),
        cmocka_unit_test_teardown(test_rate_not_lifted, gc_teardown),
    };
    int failed = cmocka_run_group_tests_name("payg_sqlite", tests, setup,
                                             teardown);
    /* the same, on a PostgreSQL ledger: spending after a restart comes
     * back from PostgreSQL */
    if (!pgproc_bindir()) {
        fprintf(stderr, "no PostgreSQL binaries: make test installs "
                "Debian's postgresql\n");
        return 1;
    }
    on_pg = 1;
    return failed + cmocka_run_group_tests_name("payg_postgresql", tests,
                                                setup, teardown);
}
