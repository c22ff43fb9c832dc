/* test_history_server.c - GET /v1/usage/history and /v1/usage/requests
 * (and the admin's /v1/usage/{subject}/...) end to end: a real
 * `quotagate serve` (tests/support/qgproc) on SQLite, then on a real
 * PostgreSQL 15 (tests/support/pgproc), rules in
 * tests/data/history/rules.yaml.
 *
 *  - rows written into the ledger before the server starts, at instants
 *    around a day boundary of Asia/Kolkata (UTC+5:30), of three models
 *    (one weight-only), allowed, refused and settled to another weight:
 *    daily buckets of the standard-only window start at 18:30 UTC and hold
 *    exactly the standard rows of their day, hourly buckets of the rolling
 *    window hold every model's rows of their UTC hour (the expected
 *    figures computed by the test from its rows: a fixed offset zone);
 *  - decisions made through /v1/check now (some refused by the rolling
 *    window): the history's totals are the decisions' (weight of the
 *    admitted, every decision, the refused), per window and its models;
 *  - the latest requests: newest first, limit, before, next_before, the
 *    fields of a row;
 *  - who may read what (a subject key its own, the admin any), and bad
 *    parameters: 400 with a message naming the parameter. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "httpc.h"
#include "ledger.h"
#include "pgproc.h"
#include "qgproc.h"
#include "quotagate.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY
#define HOUR INT64_C(3600000)
#define DAY (24 * HOUR)
#define IST (5 * HOUR + HOUR / 2)      /* Asia/Kolkata: no DST since 1945 */

static pgproc PG;
static int on_pg;
static char URL[512];
static qgproc P;

static const char *td(const char *name)
{
    const char *d = getenv("QG_TESTDATA");
    return tst_fmt("%s/%s", d ? d : "tests/data", name);
}

static http_resp *call(const char *method, const char *path, const char *key,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    httpc c;
    assert_non_null(r);
    httpc_init(&c, qgproc_port(&P));
    if (httpc_call(&c, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, c.err);
    httpc_close(&c);
    return r;
}

static int64_t iso(const char *s)
{
    int64_t t;
    if (qg_iso8601_parse(s, &t) < 0)
        fail_msg("not an instant: %s", s);
    return t;
}

/* ------------------------------------------------------ seeded rows */

typedef struct seed {
    const char *at;
    const char *model;
    int decision;
    int64_t weight_milli;      /* what counts (after the settle) */
} seed;

static const seed SEEDS[] = {
    {"2026-03-01T18:29:59.999Z", "standard", 1, 5000},
    {"2026-03-01T18:30:00Z", "standard", 1, 7000},
    {"2026-03-01T18:30:00Z", "light", 1, 1000},
    {"2026-03-01T20:00:00Z", "standard", 2, 0},
    {"2026-03-01T20:59:59Z", "light", 2, 0},
    {"2026-03-02T18:29:00Z", "", 1, 2000},
    {"2026-03-02T18:31:00Z", "standard", 1, 9000},  /* settled from 4000 */
    {"2026-03-02T18:45:00Z", "standard", 1, 3000},
};
#define NSEEDS (int)(sizeof SEEDS / sizeof SEEDS[0])

static void seed_done(void *arg, int rc)
{
    (void)arg;
    assert_int_equal(rc, 0);
}

static void seed_ledger(const char *url)
{
    char err[512];
    qg_ledger_opts o = {0};
    qg_ledger *l = qg__ledger_open(url, &o, err, sizeof err);
    if (!l)
        fail_msg("open %s: %s", url, err);
    for (int i = 0; i < NSEEDS; i++) {
        qg_ledger_row r;
        memset(&r, 0, sizeof r);
        snprintf(r.request_id, sizeof r.request_id, "seed-%d", i);
        strcpy(r.subject, "hist");
        strcpy(r.plan, "p");
        strcpy(r.rules_version, "hist-1");
        strcpy(r.weights_version, "w1");
        strcpy(r.model, SEEDS[i].model);
        r.decision = SEEDS[i].decision;
        r.status = r.decision == 1 ? QG_ROW_RESERVED : QG_ROW_REJECTED;
        if (r.decision != 1)
            strcpy(r.window, "burst");
        r.created_ms = iso(SEEDS[i].at);
        r.reserved_milli = i == 6 ? 4000 : SEEDS[i].weight_milli;
        r.weight_milli = r.reserved_milli;
        r.headroom_milli = -1;
        assert_int_equal(qg__ledger_submit(l, &r, seed_done, NULL), 0);
        if (i == 6) {           /* its settle: another weight */
            r.settle_only = 1;
            r.status = QG_ROW_COMPLETED;
            r.weight_milli = SEEDS[i].weight_milli;
            r.settled_ms = r.created_ms + 2000;
            assert_int_equal(qg__ledger_submit(l, &r, seed_done, NULL), 0);
        }
    }
    qg__ledger_close(l);        /* drains: every row committed */
}

/* ---------------------------------------------------------- helpers */

static void start(void)
{
    const char *args[] = {"--ledger", URL, NULL};
    if (qgproc_init(&P) < 0)
        fail_msg("qgproc_init: %s", P.why);
    if (!on_pg)
        snprintf(URL, sizeof URL, "sqlite:%s/ledger.db", P.data);
    seed_ledger(URL);
    if (qgproc_copy_file(td("history/rules.yaml"),
                         qgproc_path(&P, "rules.yaml")) < 0 ||
        qgproc_start(&P, qgproc_path(&P, "rules.yaml"), args, NULL) < 0)
        fail_msg("serve did not start: %s", P.why);
}

static const char *subject_key(const char *subject)
{
    http_resp *r = call("POST", "/v1/admin/keys", ADMIN,
                        tst_fmt("{\"subject\":\"%s\"}", subject));
    WANT(r, 200, "POST /v1/admin/keys");
    return tst_fmt("%s", tst_jstr(tst_jparse(r, "keys"), "key", "keys"));
}

static json_t *get_ok(const char *path, const char *key)
{
    http_resp *r = call("GET", path, key, NULL);
    WANT(r, 200, path);
    return tst_jparse(r, path);
}

static void want_400(const char *path, const char *key, const char *word)
{
    http_resp *r = call("GET", path, key, NULL);
    WANT(r, 400, path);
    json_t *j = tst_jparse(r, path);
    const char *msg = json_string_value(
        json_object_get(json_object_get(j, "error"), "message"));
    if (!msg || !strstr(msg, word))
        fail_msg("%s: message \"%s\" does not name %s", path,
                 msg ? msg : "(none)", word);
}

/* The bucket of b whose start is `start` (ms), or NULL. */
static json_t *bucket_at(json_t *h, int64_t start)
{
    json_t *bs = json_object_get(h, "buckets"), *b;
    size_t i;
    json_array_foreach(bs, i, b) {
        if (iso(json_string_value(json_object_get(b, "start"))) == start)
            return b;
    }
    return NULL;
}

static int64_t milli(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_true(json_is_number(v));
    return (int64_t)(json_number_value(v) * 1000 + 0.5);
}

/* ------------------------------------------------------------- tests */

/* The seeded rows in their buckets: days of Kolkata for the
 * standard-only window, hours of UTC for the rolling one. */
static void test_buckets_of_seeded_rows(void **state)
{
    (void)state;
    const char *key;
    json_t *h, *b;
    size_t i;
    start();
    key = subject_key("hist");

    h = get_ok("/v1/usage/history?window=std_daily&bucket=1d"
               "&from=2026-02-28T00:00:00Z&to=2026-03-04T00:00:00Z", key);
    assert_string_equal(tst_jstr(h, "subject", "history"), "hist");
    assert_string_equal(tst_jstr(h, "window", "history"), "std_daily");
    assert_string_equal(tst_jstr(h, "unit", "history"), "weight points");
    assert_string_equal(tst_jstr(h, "tz", "history"), "Asia/Kolkata");
    assert_int_equal((int)tst_jnum(h, "bucket_s", "history"), 86400);
    json_array_foreach(json_object_get(h, "buckets"), i, b) {
        int64_t s = iso(json_string_value(json_object_get(b, "start")));
        int64_t w = 0, n = 0, x = 0;
        /* a Kolkata midnight */
        assert_int_equal(((s + IST) % DAY + DAY) % DAY, 0);
        for (int k = 0; k < NSEEDS; k++) {
            int64_t t = iso(SEEDS[k].at);
            if (strcmp(SEEDS[k].model, "standard") != 0 || t < s ||
                t >= s + DAY)
                continue;
            n++;
            if (SEEDS[k].decision == 1)
                w += SEEDS[k].weight_milli;
            else
                x++;
        }
        assert_int_equal(milli(b, "weight"), w);
        assert_int_equal((int64_t)tst_jnum(b, "requests", "bucket"), n);
        assert_int_equal((int64_t)tst_jnum(b, "refused", "bucket"), x);
    }
    /* from 2026-02-27T18:30Z (the day holding `from`) to the day holding
     * `to` - 1 */
    assert_int_equal(json_array_size(json_object_get(h, "buckets")), 5);
    assert_non_null(bucket_at(h, iso("2026-03-01T18:30:00Z")));

    /* the rolling window: UTC hours, every model */
    h = get_ok("/v1/usage/hist/history?window=burst&bucket=1h"
               "&from=2026-03-01T18:00:00Z&to=2026-03-02T19:00:00Z", ADMIN);
    assert_string_equal(tst_jstr(h, "tz", "history"), "UTC");
    assert_int_equal((int)tst_jnum(h, "bucket_s", "history"), 3600);
    assert_int_equal(json_array_size(json_object_get(h, "buckets")), 25);
    int64_t total = 0;
    json_array_foreach(json_object_get(h, "buckets"), i, b) {
        int64_t s = iso(json_string_value(json_object_get(b, "start")));
        int64_t w = 0, n = 0, x = 0;
        assert_int_equal(s % HOUR, 0);
        for (int k = 0; k < NSEEDS; k++) {
            int64_t t = iso(SEEDS[k].at);
            if (t < s || t >= s + HOUR)
                continue;
            n++;
            if (SEEDS[k].decision == 1)
                w += SEEDS[k].weight_milli;
            else
                x++;
        }
        assert_int_equal(milli(b, "weight"), w);
        assert_int_equal((int64_t)tst_jnum(b, "requests", "bucket"), n);
        assert_int_equal((int64_t)tst_jnum(b, "refused", "bucket"), x);
        total += n;
    }
    assert_int_equal(total, NSEEDS);
    qgproc_finish(&P);
    tst_gc_free_all();
}

/* Decisions made now, and the history and listing they make. */
static void test_live_decisions(void **state)
{
    (void)state;
    const char *key;
    int64_t all_w = 0, all_n = 0, all_x = 0, std_w = 0, std_n = 0,
            std_x = 0;
    char ids[40][64];
    int n = 0;
    json_t *h, *b;
    size_t i;
    start();
    key = subject_key("hist");

    /* light (1) and standard (3) in turn against a 5h limit of 30: the
     * last ones are refused by the rolling window */
    for (n = 0; n < 24; n++) {
        const char *model = n % 2 ? "standard" : "light";
        snprintf(ids[n], sizeof ids[n], "%s", tst_uid("live"));
        http_resp *r = call("POST", "/v1/check", SERVICE,
            tst_fmt("{\"subject\":\"hist\",\"request_id\":\"%s\",\"model\":"
                    "\"%s\",\"input_tokens\":10,\"max_output_tokens\":0}",
                    ids[n], model));
        json_t *j = tst_jparse(r, "check");
        int allowed = strcmp(tst_jstr(j, "decision", "check"), "allow") == 0;
        assert_int_equal(r->status, allowed ? 200 : 429);
        int64_t w = allowed ? milli(j, "weight") : 0;
        all_n++;
        all_w += w;
        all_x += !allowed;
        if (n % 2) {
            std_n++;
            std_w += w;
            std_x += !allowed;
        }
    }
    assert_true(all_x > 0 && std_x > 0);

    /* the ledger has them all once the listing does */
    json_t *ls = NULL;
    for (int k = 0; k < 200; k++) {
        ls = get_ok("/v1/usage/requests?limit=500", key);
        if (json_array_size(json_object_get(ls, "requests")) ==
            (size_t)(n + NSEEDS))
            break;
        tst_sleep_ms(50);
    }
    json_t *rows = json_object_get(ls, "requests");
    assert_int_equal(json_array_size(rows), n + NSEEDS);
    assert_true(json_is_null(json_object_get(ls, "next_before")));
    /* newest first: the last check first, the seeds (March) last */
    for (int k = 0; k < n; k++)
        assert_string_equal(json_string_value(json_object_get(
                                json_array_get(rows, (size_t)k),
                                "request_id")),
                            ids[n - 1 - k]);
    for (size_t k = 1; k < json_array_size(rows); k++)
        assert_true(iso(json_string_value(json_object_get(
                        json_array_get(rows, k - 1), "time"))) >=
                    iso(json_string_value(json_object_get(
                        json_array_get(rows, k), "time"))));
    json_t *r0 = json_array_get(rows, 0);
    assert_string_equal(tst_jstr(r0, "model", "row"), "standard");
    assert_string_equal(tst_jstr(r0, "decision", "row"), "reject");
    assert_string_equal(tst_jstr(r0, "window", "row"), "burst");
    assert_string_equal(tst_jstr(r0, "status", "row"), "rejected");
    assert_int_equal((int)tst_jnum(r0, "input_tokens", "row"), 10);

    /* limit and before: pages that join up */
    json_t *p1 = get_ok("/v1/usage/requests?limit=5", key);
    assert_int_equal(json_array_size(json_object_get(p1, "requests")), 5);
    const char *nb = tst_jstr(p1, "next_before", "page");
    json_t *p2 = get_ok(tst_fmt("/v1/usage/requests?limit=500&before=%s",
                                nb), key);
    json_t *row;
    json_array_foreach(json_object_get(p2, "requests"), i, row)
        assert_true(iso(tst_jstr(row, "time", "row")) < iso(nb));
    /* the admin's view of the same subject is the same list */
    json_t *pa = get_ok("/v1/usage/hist/requests?limit=5", ADMIN);
    assert_string_equal(tst_dump(json_object_get(pa, "requests")),
                        tst_dump(json_object_get(p1, "requests")));

    /* totals of the last day: what the decisions were */
    int64_t w = 0, rq = 0, rf = 0;
    h = get_ok("/v1/usage/history?window=burst", key);
    json_array_foreach(json_object_get(h, "buckets"), i, b) {
        w += milli(b, "weight");
        rq += (int64_t)tst_jnum(b, "requests", "bucket");
        rf += (int64_t)tst_jnum(b, "refused", "bucket");
    }
    assert_int_equal(w, all_w);
    assert_int_equal(rq, all_n);
    assert_int_equal(rf, all_x);
    w = rq = rf = 0;
    h = get_ok("/v1/usage/history?window=std_daily&bucket=1d", key);
    json_array_foreach(json_object_get(h, "buckets"), i, b) {
        w += milli(b, "weight");
        rq += (int64_t)tst_jnum(b, "requests", "bucket");
        rf += (int64_t)tst_jnum(b, "refused", "bucket");
    }
    assert_int_equal(w, std_w);
    assert_int_equal(rq, std_n);
    assert_int_equal(rf, std_x);
    /* a request-unit window counts admitted requests */
    w = 0;
    h = get_ok("/v1/usage/history?window=rpm", key);
    assert_string_equal(tst_jstr(h, "unit", "history"), "requests");
    json_array_foreach(json_object_get(h, "buckets"), i, b)
        w += milli(b, "weight");
    assert_int_equal(w, (all_n - all_x) * 1000);
    qgproc_finish(&P);
    tst_gc_free_all();
}

static void test_access_and_bad_input(void **state)
{
    (void)state;
    const char *key;
    http_resp *r;
    start();
    key = subject_key("hist");

    r = call("GET", "/v1/usage/other/history?window=burst", key, NULL);
    WANT(r, 403, "another subject's history");
    r = call("GET", "/v1/usage/other/requests", key, NULL);
    WANT(r, 403, "another subject's requests");
    r = call("GET", "/v1/usage/history?window=burst", NULL, NULL);
    WANT(r, 401, "no key");
    r = call("GET", "/v1/usage/hist/histories", ADMIN, NULL);
    WANT(r, 404, "no such endpoint");
    want_400("/v1/usage/history?window=burst", ADMIN, "{subject}");
    want_400("/v1/usage/history", key, "window");
    r = call("GET", "/v1/usage/history?window=nope", key, NULL);
    WANT(r, 404, "unknown window");
    assert_string_equal(tst_error_type(r, "unknown window"),
                        "unknown_window");
    want_400("/v1/usage/history?window=burst&bucket=2h", key, "bucket");
    want_400("/v1/usage/history?window=burst&from=yesterday", key, "from");
    want_400("/v1/usage/history?window=burst&to=2026-13-01", key, "to");
    want_400("/v1/usage/history?window=burst&from=2026-03-02T00:00:00Z"
             "&to=2026-03-01T00:00:00Z", key, "before");
    want_400("/v1/usage/history?window=burst&from=2026-01-01T00:00:00Z"
             "&to=2026-03-01T00:00:00Z", key, "744");
    want_400("/v1/usage/history?window=burst&bucket=1d"
             "&from=2020-01-01T00:00:00Z&to=2026-03-01T00:00:00Z", key,
             "400");
    want_400("/v1/usage/history?window=burst&window=rpm", key, "twice");
    want_400("/v1/usage/history?window=burst&colour=red", key, "colour");
    want_400("/v1/usage/history?window=%zz", key, "percent");
    want_400("/v1/usage/requests?limit=0", key, "limit");
    want_400("/v1/usage/requests?limit=501", key, "limit");
    want_400("/v1/usage/requests?limit=ten", key, "limit");
    want_400("/v1/usage/requests?before=soon", key, "before");
    /* an offset in an instant, '+' percent-encoded */
    json_t *h = get_ok("/v1/usage/history?window=burst"
                       "&from=2026-03-01T23:00:00%2B05:00"
                       "&to=2026-03-02T00:00:00Z", key);
    assert_int_equal(json_array_size(json_object_get(h, "buckets")), 6);
    /* the server still serves */
    r = call("GET", "/healthz", NULL, NULL);
    WANT(r, 200, "healthz");
    qgproc_finish(&P);
    tst_gc_free_all();
}

static int teardown(void **state)
{
    (void)state;
    qgproc_cleanup(&P);
    tst_gc_free_all();
    return 0;
}

static int pg_setup(void **state)
{
    (void)state;
    if (pgproc_start(&PG) < 0) {
        fprintf(stderr, "PostgreSQL: %s\n", PG.why);
        return -1;
    }
    on_pg = 1;
    return 0;
}

static int pg_test_setup(void **state)
{
    char db[64];
    (void)state;
    if (pgproc_createdb(&PG, db, sizeof db) < 0) {
        fprintf(stderr, "createdb: %s\n", PG.why);
        return -1;
    }
    pgproc_url(&PG, db, URL, sizeof URL);
    return 0;
}

static int pg_teardown(void **state)
{
    (void)state;
    pgproc_destroy(&PG);
    on_pg = 0;
    return 0;
}

#define T(f) cmocka_unit_test_teardown(f, teardown)
#define PG_T(f) {"postgresql: " #f, f, pg_test_setup, teardown, NULL}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_buckets_of_seeded_rows),
        T(test_live_decisions),
        T(test_access_and_bad_input),
    };
    const struct CMUnitTest pg_tests[] = {
        PG_T(test_buckets_of_seeded_rows),
        PG_T(test_live_decisions),
    };
    int failed = cmocka_run_group_tests_name("sqlite", tests, NULL, NULL);
    if (!pgproc_bindir()) {
        fprintf(stderr, "no PostgreSQL binaries: make test installs "
                "Debian's postgresql\n");
        return 1;
    }
    return failed + cmocka_run_group_tests_name("postgresql", pg_tests,
                                                pg_setup, pg_teardown);
}
