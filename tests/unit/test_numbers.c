/* test_numbers.c - numbers that could wrap, end to end (issue 8, failures
 * 2 and 4; quotagate.h "bounds", docs/decisions.md "Bounds",
 * docs/proxy.md "Usage beyond what was allowed").
 *
 * The real server ($QG_BIN serve) in front of the upstream double
 * ($QG_UPSTREAM_BIN, made to report absurd usage with its usage-in= and
 * usage-out= modes), on tests/data/numbers/rules.yaml:
 *  - settles recovering lost reservations at and beyond the weight bound;
 *  - ledger rows with amounts beyond the bounds (as older builds wrote
 *    them) replayed by two starts in a row: no crash loop, the subject not
 *    admitted everything;
 *  - the proxy with 2.3e18 prompt tokens on five concurrent calls, with
 *    INT64_MAX usage (both shapes, streamed or not), and with output above
 *    max_tokens: every call settled once, its slot freed, the anomaly in
 *    the row's detail, the log and the metric;
 *  - out_of_range answers of /v1/check, /v1/settle and /v1/authz, and the
 *    bounds of simulate traces and rules files (the CLI).
 * Under the ASan+UBSan build a wrap would abort the server, which the
 * checks of its health after each test would see. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dblproc.h"
#include "httpc.h"
#include "qgproc.h"
#include "runcli.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY
#define PROMPT "hello there friend"   /* 18 bytes: an estimate of 5 tokens */
#define BOUND_POINTS 1000000000000000.0 /* QG_AMOUNT_MAX_MILLI in points */
#define I64MAX "9223372036854775807"

static qgproc P;
static httpc C;
static dblproc D;

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

/* ------------------------------------------------------------ requests */

static http_resp *call(const char *method, const char *path, const char *key,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response (the server died?): %s", method, path,
                 C.err);
    return r;
}

static void want_alive(void)
{
    WANT(call("GET", "/healthz", NULL, NULL), 200, "healthz");
    if (!qgproc_alive(&P, NULL))
        fail_msg("the server is gone");
}

/* 400 out_of_range whose message names `field` and `bound`. */
static void want_range(const http_resp *r, const char *field,
                       const char *bound, const char *what)
{
    const char *msg;
    WANT(r, 400, what);
    if (strcmp(tst_error_type(r, what), "out_of_range") != 0)
        fail_msg("%s: type %s, want out_of_range: %s", what,
                 tst_error_type(r, what), tst_excerpt(r));
    msg = tst_jstr(json_object_get(tst_jparse(r, what), "error"), "message",
                   what);
    if (!strstr(msg, field) || !strstr(msg, bound))
        fail_msg("%s: the message does not name %s and %s: %s", what, field,
                 bound, msg);
}

static json_t *usage_of(const char *subject)
{
    http_resp *r = call("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    WANT(r, 200, "usage");
    return tst_jparse(r, "usage");
}

static json_t *window_of(json_t *u, const char *name)
{
    json_t *w;
    size_t i;
    json_array_foreach(json_object_get(u, "windows"), i, w)
        if (!strcmp(tst_jstr(w, "name", "window"), name))
            return w;
    fail_msg("no window %s in %s", name, tst_dump(u));
    return NULL;
}

static double used_of(const char *subject, const char *name)
{
    return tst_jnum(window_of(usage_of(subject), name), "used", name);
}

/* ------------------------------------------------------------ fixtures */

static int group_setup(void **state)
{
    const char *src = getenv("QG_TESTDATA"), *ub = getenv("QG_UPSTREAM_BIN");
    char path[1024], up[128];
    const char *args[3];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!src || !ub) {
        fprintf(stderr, "QG_TESTDATA / QG_UPSTREAM_BIN not set (run through "
                "tests/run.sh)\n");
        return -1;
    }
    if (dblproc_start(&D, ub) < 0) {
        fprintf(stderr, "cannot start the upstream double %s\n", ub);
        return -1;
    }
    if (qgproc_init(&P) < 0) {
        fprintf(stderr, "qgproc_init: %s\n", P.why);
        dblproc_stop(&D);
        return -1;
    }
    snprintf(path, sizeof path, "%s/numbers/rules.yaml", src);
    snprintf(up, sizeof up, "http://127.0.0.1:%d", D.port);
    args[0] = "--upstream";
    args[1] = up;
    args[2] = NULL;
    if (qgproc_start_copy(&P, path, args, NULL) < 0) {
        dblproc_stop(&D);
        return -1;
    }
    httpc_init(&C, qgproc_port(&P));
    return 0;
}

static int group_teardown(void **state)
{
    int rc;
    (void)state;
    httpc_close(&C);
    rc = qgproc_finish(&P);
    dblproc_stop(&D);
    return rc;
}

/* =========================================== failure 2: recovered settles */

/* The report's five settles: each weight is beyond the bound on one
 * request's weight, so each is refused, and nothing is charged. */
static void test_recovered_settles_beyond_bound(void **state)
{
    const char *s = tst_uid("ovf");
    (void)state;
    for (int i = 0; i < 5; i++) {
        http_resp *r = call("POST", "/v1/settle", SERVICE, tst_fmt(
            "{\"request_id\":\"%s-%d\",\"status\":\"completed\","
            "\"subject\":\"%s\",\"weight\":2305843009213693}", s, i, s));
        want_range(r, "weight", "1000000000000000", "settle beyond the bound");
    }
    want_alive();
    assert_true(used_of(s, "burst_5h") == 0);
}

/* Five recovered settles at the bound: every window saturates at it (the
 * sums never wrap), and the subject is refused, not admitted everything. */
static void test_recovered_settles_at_bound(void **state)
{
    const char *s = tst_uid("ovf");
    json_t *u;
    (void)state;
    for (int i = 0; i < 5; i++) {
        http_resp *r = call("POST", "/v1/settle", SERVICE, tst_fmt(
            "{\"request_id\":\"%s-%d\",\"status\":\"completed\","
            "\"subject\":\"%s\",\"weight\":1000000000000000}", s, i, s));
        WANT(r, 200, "recovered settle at the bound");
        assert_true(tst_jbool(tst_jparse(r, "settle"), "recovered", "settle"));
    }
    u = usage_of(s);
    for (const char *w = "burst_5h\0weekly\0session\0"; *w;
         w += strlen(w) + 1) {
        json_t *v = window_of(u, w);
        double used = tst_jnum(v, "used", w);
        if (used != BOUND_POINTS)
            fail_msg("%s used %.0f after five charges at the bound, want "
                     "the bound %.0f", w, used, BOUND_POINTS);
        assert_true(tst_jnum(v, "remaining", w) == 0);
    }
    /* the rate bucket holds what drains by the end of time: full */
    assert_true(tst_jnum(window_of(u, "wpm"), "remaining", "wpm") == 0);
    assert_true(tst_jnum(window_of(u, "wpm"), "used", "wpm") >= 100);
    for (int i = 0; i < 3; i++) {
        http_resp *r = call("POST", "/v1/check", SERVICE, tst_fmt(
            "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":%s}", s,
            tst_uid("after"), i == 0 ? "1" : i == 1 ? "0.001" : "1000"));
        if (r->status != 429)
            fail_msg("a check after the bound was reached: HTTP %d, want "
                     "429: %s", r->status, tst_excerpt(r));
    }
    want_alive();
}

/* ============================== failure 2: the rows left by older builds */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sql(sqlite3 *db, const char *text)
{
    char *e = NULL;
    if (sqlite3_exec(db, text, NULL, NULL, &e) != SQLITE_OK)
        fail_msg("sqlite: %s: %s", text, e ? e : "?");
}

/* One row as an older build wrote it (schema 1's columns only). */
static void put_row(sqlite3 *db, const char *rid, const char *subject,
                    int status, const char *reserved, const char *weight,
                    long long created_ms)
{
    sql(db, tst_fmt("INSERT INTO requests (request_id, subject, plan, model, "
                    "decision, status, reserved_milli, weight_milli, "
                    "created_ms, settled_ms) VALUES ('%s', '%s', 'wide', '', "
                    "1, %d, %s, %s, %lld, %lld)", rid, subject, status,
                    reserved, weight, created_ms,
                    status == 1 ? 0LL : created_ms));
}

static int log_mentions(qgproc *p, const char *a, const char *b)
{
    FILE *f = fopen(qgproc_path(p, "stderr.log"), "r");
    char line[2048];
    int found = 0;
    if (!f)
        return 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, a) && (!b || strstr(line, b));
    fclose(f);
    return found;
}

static void test_rebuild_rows_beyond_bounds(void **state)
{
    static qgproc p;
    static httpc k;
    const char *src = getenv("QG_TESTDATA"), *sub = "loop";
    sqlite3 *db;
    int64_t now = wall_ms();
    (void)state;
    if (qgproc_init(&p) < 0)
        fail_msg("qgproc_init: %s", p.why);
    if (qgproc_start_copy(&p, tst_fmt("%s/numbers/rules.yaml", src), NULL,
                          NULL) < 0)
        fail_msg("start: %s", p.why);
    if (qgproc_stop(&p, 20000) != 0) {
        qgproc_cleanup(&p);
        fail_msg("the first stop was not clean");
    }
    if (sqlite3_open(tst_fmt("%s/ledger.db", p.data), &db) != SQLITE_OK) {
        qgproc_cleanup(&p);
        fail_msg("cannot open the ledger");
    }
    /* what five settles at weight 2305843009213693 left in an older
     * build's ledger, plus rows no build should have written */
    for (int i = 1; i <= 5; i++)
        put_row(db, tst_fmt("loop%d", i), sub, 2, "2305843009213693000",
                "2305843009213693000", (long long)(now - 5000 + i));
    put_row(db, "loop-open", sub, 1, I64MAX, I64MAX, (long long)(now - 900));
    put_row(db, "loop-neg", sub, 2, "-5000", "-5000", (long long)(now - 800));
    put_row(db, "loop-future", sub, 2, "1000", "1000", 253402300800000LL);
    sqlite3_close(db);
    for (int round = 0; round < 2; round++) {
        http_resp *r;
        json_t *u;
        if (qgproc_restart(&p) < 0) {
            qgproc_cleanup(&p);
            fail_msg("start %d on the ledger with rows beyond the bounds "
                     "failed: %s", round + 1, p.why);
        }
        httpc_init(&k, qgproc_port(&p));
        r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
        if (httpc_call(&k, "POST", "/v1/check", "bearer", SERVICE,
                       tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                               "\"weight\":1}", sub, tst_uid("lc")), r) < 0 ||
            r->status != 429) {
            int st = r->status;
            httpc_close(&k);
            qgproc_cleanup(&p);
            fail_msg("start %d: a check of the subject: HTTP %d, want 429",
                     round + 1, st);
        }
        r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
        if (httpc_call(&k, "GET", tst_fmt("/v1/usage/%s", sub), "bearer",
                       ADMIN, NULL, r) < 0 || r->status != 200) {
            httpc_close(&k);
            qgproc_cleanup(&p);
            fail_msg("start %d: usage after the check failed", round + 1);
        }
        u = tst_jparse(r, "usage");
        assert_true(tst_jnum(window_of(u, "burst_5h"), "used", "u") ==
                    BOUND_POINTS);
        /* the open reservation holds its slot */
        assert_true(tst_jnum(window_of(u, "concurrency"), "used", "u") == 1);
        httpc_close(&k);
        if (!qgproc_alive(&p, NULL)) {
            qgproc_cleanup(&p);
            fail_msg("start %d: the server died after the check", round + 1);
        }
        if (qgproc_stop(&p, 20000) != 0) {
            qgproc_cleanup(&p);
            fail_msg("start %d: the server did not stop cleanly", round + 1);
        }
    }
    /* reported on stderr, with the request ids */
    assert_true(log_mentions(&p, "loop1", "clamped"));
    assert_true(log_mentions(&p, "loop-open", "clamped"));
    assert_true(log_mentions(&p, "loop-neg", "clamped"));
    assert_true(log_mentions(&p, "loop-future", "skipped"));
    qgproc_cleanup(&p);
}

/* ======================================= failures 2 and 4: the proxy */

/* POST with the NULL-terminated headers. */
static http_resp *post(const char *path, const char *const *h,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_request(&C, "POST", path, h, body, strlen(body), r) < 0)
        fail_msg("POST %s: no response (the server died?): %s", path, C.err);
    return r;
}

static const char *new_subject(const char *plan)
{
    const char *s = tst_uid("n");
    http_resp *r = call("POST", "/v1/admin/subjects", ADMIN,
                        tst_fmt("{\"subject\":\"%s\",\"plan\":\"%s\"}", s, plan));
    if (r->status != 200 && r->status != 201)
        fail_msg("create subject: %d %s", r->status, tst_excerpt(r));
    return s;
}

static const char *new_key(const char *subject)
{
    http_resp *r = call("POST", "/v1/admin/keys", ADMIN,
                        tst_fmt("{\"subject\":\"%s\"}", subject));
    if (r->status != 200 && r->status != 201)
        fail_msg("create key: %d %s", r->status, tst_excerpt(r));
    return tst_jstr(tst_jparse(r, "keys"), "key", "keys");
}

/* The settled row of rid: status, estimated, tokens, weight. */
typedef struct lrow {
    long long status, estimated, in, out, weight_milli;
} lrow;

static lrow ledger_row(const char *rid)
{
    long long v[5];
    tst_ledger_ints(P.data, rid, "status, estimated, input_tokens, "
                    "output_tokens, weight_milli", v, 5);
    return (lrow){v[0], v[1], v[2], v[3], v[4]};
}

static const char *ledger_detail(const char *rid)
{
    return tst_ledger_cols(P.data, rid, "detail", 1, 1)[0];
}

/* The value of the sample line_prefix, 0 when absent. */
static unsigned long long metric(const char *line_prefix)
{
    http_resp *r = call("GET", "/metrics", NULL, NULL);
    const char *p;
    WANT(r, 200, "metrics");
    if (!(p = strstr(r->body, line_prefix)))
        return 0;
    return strtoull(p + strlen(line_prefix), NULL, 10);
}

static const char *openai_body(int stream, int max_tokens)
{
    if (max_tokens < 0)
        return tst_fmt("{\"model\":\"light\",%s\"messages\":[{\"role\":"
                       "\"user\",\"content\":\"" PROMPT "\"}]}",
                       stream ? "\"stream\":true," : "");
    return tst_fmt("{\"model\":\"light\",%s\"messages\":[{\"role\":\"user\","
                   "\"content\":\"" PROMPT "\"}],\"max_tokens\":%d}",
                   stream ? "\"stream\":true," : "", max_tokens);
}

static const char *anthropic_body(int stream, int max_tokens)
{
    return tst_fmt("{\"model\":\"claude-light\",%s\"messages\":[{\"role\":"
                   "\"user\",\"content\":\"" PROMPT "\"}],\"max_tokens\":%d}",
                   stream ? "\"stream\":true," : "", max_tokens);
}

typedef struct pcall {
    int port;
    const char *key, *rid, *mode, *path, *body;
    int status;
} pcall;

static void *pcall_run(void *arg)
{
    pcall *c = arg;
    httpc h;
    http_resp r;
    const char *hd[4];
    char a[512], b[300], m[200];
    snprintf(a, sizeof a, "Authorization: Bearer %s", c->key);
    snprintf(b, sizeof b, "X-Request-Id: %s", c->rid);
    snprintf(m, sizeof m, "X-Double-Mode: %s", c->mode);
    hd[0] = a;
    hd[1] = b;
    hd[2] = m;
    hd[3] = NULL;
    httpc_init(&h, c->port);
    memset(&r, 0, sizeof r);
    c->status = httpc_request(&h, "POST", c->path, hd, c->body,
                              strlen(c->body), &r) < 0 ? 0 : r.status;
    http_resp_free(&r);
    httpc_close(&h);
    return NULL;
}

/* The report's proxy variant: five concurrent calls whose upstream
 * reports 2.3e18 prompt tokens.  A count beyond the token bound is no
 * report: each call is charged its admission estimate, once. */
static void test_proxy_huge_prompt_concurrent(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    unsigned long long before = metric(
        "quotagate_proxy_usage_anomalies_total{kind=\"input_over_bound\"} ");
    pcall c[5];
    pthread_t t[5];
    (void)state;
    for (int i = 0; i < 5; i++) {
        c[i] = (pcall){qgproc_port(&P), key, tst_uid("hp"),
                       "usage-in=2300000000000000000", "/v1/chat/completions",
                       openai_body(0, 9), 0};
        assert_int_equal(pthread_create(&t[i], NULL, pcall_run, &c[i]), 0);
    }
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 5; i++) {
        lrow row;
        if (c[i].status != 200)
            fail_msg("call %d: HTTP %d", i, c[i].status);
        row = ledger_row(c[i].rid);
        assert_int_equal(row.status, 2);        /* completed */
        assert_int_equal(row.estimated, 1);
        assert_int_equal(row.in, 5);            /* the admission estimate */
        assert_int_equal(row.out, 9);
        assert_int_equal(row.weight_milli, 1000 + 5 + 9);
        if (!strstr(ledger_detail(c[i].rid), "input_tokens 2300000000000000000"))
            fail_msg("call %d: detail \"%s\"", i, ledger_detail(c[i].rid));
    }
    assert_true(used_of(s, "burst_5h") * 1000 == 5 * (1000 + 5 + 9));
    assert_true(used_of(s, "concurrency") == 0);
    assert_true(metric("quotagate_proxy_usage_anomalies_total{kind="
                       "\"input_over_bound\"} ") >= before + 5);
    want_alive();
}

/* INT64_MAX input and output, both shapes, streamed or not: the caller
 * gets its answer, the call is settled (not left reserved), its slot is
 * freed, output is charged at max_tokens and input at the estimate. */
static void test_proxy_int64_usage(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *mode = "X-Double-Mode: usage-in=" I64MAX ",usage-out=" I64MAX;
    (void)state;
    for (int shape = 0; shape < 2; shape++)
        for (int stream = 0; stream < 2; stream++) {
            const char *rid = tst_uid("i64"), *d;
            const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                                tst_fmt("X-Request-Id: %s", rid), mode, NULL};
            http_resp *r = post(shape ? "/v1/messages" : "/v1/chat/completions",
                                h, shape ? anthropic_body(stream, 7)
                                         : openai_body(stream, 7));
            lrow row;
            WANT(r, 200, "INT64_MAX usage");
            row = ledger_row(rid);
            if (row.status != 2)
                fail_msg("%s %s: row status %lld, want 2 (completed)",
                         shape ? "anthropic" : "openai",
                         stream ? "stream" : "json", row.status);
            assert_int_equal(row.in, 5);
            assert_int_equal(row.out, 7);
            assert_int_equal(row.estimated, 1);
            assert_int_equal(row.weight_milli, 1000 + 5 + 7);
            d = ledger_detail(rid);
            if (!strstr(d, "input_tokens " I64MAX) ||
                !strstr(d, "output_tokens " I64MAX) ||
                !strstr(d, "max_tokens"))
                fail_msg("detail \"%s\"", d);
        }
    assert_true(used_of(s, "concurrency") == 0);
    assert_true(used_of(s, "burst_5h") * 1000 == 4 * (1000 + 5 + 7));
    want_alive();
}

/* Output above max_tokens is charged at max_tokens ("1e14 tokens were
 * charged as 1e11 points"); without max_tokens a count beyond the bound
 * is replaced by the estimate from the text. */
static void test_proxy_output_over_max_tokens(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("om"), *d;
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid),
                        "X-Double-Mode: usage-out=100000000000000", NULL};
    unsigned long long before = metric(
        "quotagate_proxy_usage_anomalies_total{kind=\"output_over_max_tokens\"} ");
    lrow row;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 50)), 200, "over");
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.in, 5);
    assert_int_equal(row.out, 50);
    assert_int_equal(row.estimated, 0);          /* both counts reported */
    assert_int_equal(row.weight_milli, 1000 + 5 + 50);
    d = ledger_detail(rid);
    if (!strstr(d, "output_tokens 100000000000000 reported, above max_tokens"))
        fail_msg("detail \"%s\"", d);
    assert_true(metric("quotagate_proxy_usage_anomalies_total{kind="
                       "\"output_over_max_tokens\"} ") == before + 1);
    /* no max_tokens: the estimate from the 20 words of text (109 bytes) */
    rid = tst_uid("ob");
    h[1] = tst_fmt("X-Request-Id: %s", rid);
    h[2] = "X-Double-Mode: usage-out=" I64MAX;
    WANT(post("/v1/chat/completions", h, openai_body(0, -1)), 200, "bound");
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.out, 28);
    if (!strstr(ledger_detail(rid), "above the bound"))
        fail_msg("detail \"%s\"", ledger_detail(rid));
    /* a request whose max_tokens is beyond the bound: refused before the
     * upstream, nothing reserved */
    rid = tst_uid("mx");
    h[1] = tst_fmt("X-Request-Id: %s", rid);
    h[2] = NULL;
    want_range(post("/v1/chat/completions", h, tst_fmt(
                   "{\"model\":\"light\",\"messages\":[{\"role\":\"user\","
                   "\"content\":\"hi\"}],\"max_tokens\":" I64MAX "}")),
               "max_tokens", "1000000000000", "proxy max_tokens");
    /* a sane report is charged as reported, with no detail */
    rid = tst_uid("ok");
    h[1] = tst_fmt("X-Request-Id: %s", rid);
    h[2] = NULL;
    WANT(post("/v1/chat/completions", h, openai_body(0, 50)), 200, "sane");
    row = ledger_row(rid);
    assert_int_equal(row.out, 50);
    assert_string_equal(ledger_detail(rid), "");
    assert_true(used_of(s, "concurrency") == 0);
    want_alive();
}

/* ====================================== typed refusals of callers' input */

static void test_check_settle_bounds(void **state)
{
    const char *s = tst_uid("b");
    http_resp *r;
    (void)state;
    want_range(call("POST", "/v1/check", SERVICE, tst_fmt(
                   "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":"
                   "1000000000000001}", s, tst_uid("c"))),
               "weight", "1000000000000000", "check weight");
    want_range(call("POST", "/v1/check", SERVICE, tst_fmt(
                   "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":"
                   "1e13}", s, tst_uid("c"))),
               "weight", "1000000000000", "check weight as a real");
    want_range(call("POST", "/v1/check", SERVICE, tst_fmt(
                   "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                   "\"light\",\"input_tokens\":1000000000001}", s,
                   tst_uid("c"))),
               "input_tokens", "1000000000000", "check input_tokens");
    want_range(call("POST", "/v1/check", SERVICE, tst_fmt(
                   "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                   "\"light\",\"input_tokens\":1,\"max_output_tokens\":"
                   I64MAX "}", s, tst_uid("c"))),
               "max_output_tokens", "1000000000000", "check max_output");
    /* tokens within their bound, weighing more than the weight bound */
    want_range(call("POST", "/v1/check", SERVICE, tst_fmt(
                   "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                   "\"huge\",\"input_tokens\":1000000000,"
                   "\"max_output_tokens\":1}", s, tst_uid("c"))),
               "weight", "1000000000000000", "check huge weight");
    /* at the bound: a refusal, never retryable (no window holds it) */
    r = call("POST", "/v1/check", SERVICE, tst_fmt(
            "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":"
            "1000000000000000}", s, tst_uid("c")));
    WANT(r, 429, "check at the bound");
    assert_string_equal(tst_error_type(r, "at the bound"),
                        "request_too_large_for_plan");
    /* settles */
    want_range(call("POST", "/v1/settle", SERVICE, tst_fmt(
                   "{\"request_id\":\"%s\",\"status\":\"completed\","
                   "\"input_tokens\":1,\"output_tokens\":1000000000001}",
                   tst_uid("st"))),
               "output_tokens", "1000000000000", "settle output_tokens");
    /* a recovered settle of a model whose bounded tokens weigh more than
     * the bound is charged the bound */
    r = call("POST", "/v1/settle", SERVICE, tst_fmt(
            "{\"request_id\":\"%s\",\"status\":\"completed\",\"subject\":"
            "\"%s\",\"model\":\"huge\",\"input_tokens\":1000000000000,"
            "\"output_tokens\":1000000000000}", tst_uid("st"), s));
    WANT(r, 200, "recovered settle over the bound");
    assert_true(tst_jnum(tst_jparse(r, "s"), "charged", "s") == BOUND_POINTS);
    assert_true(used_of(s, "burst_5h") == BOUND_POINTS);
    want_alive();
}

static void test_authz_bounds(void **state)
{
    const char *s = tst_uid("az");
    (void)state;
    for (int i = 0; i < 3; i++) {
        const char *h[5] = {"X-Quotagate-Key: " SERVICE,
                            tst_fmt("X-Quotagate-Subject: %s", s),
                            i == 0 ? "X-Quotagate-Weight: 1000000000000001"
                                   : "X-Quotagate-Model: light",
                            i == 1 ? "X-Quotagate-Input-Tokens: 1000000000001"
                            : i == 2 ? "X-Quotagate-Max-Output-Tokens: "
                                       "99999999999999999999999"
                                     : NULL,
                            NULL};
        http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
        if (httpc_request(&C, "GET", "/v1/authz", h, NULL, 0, r) < 0)
            fail_msg("authz: no response");
        want_range(r, i == 0 ? "X-Quotagate-Weight"
                      : i == 1 ? "X-Quotagate-Input-Tokens"
                               : "X-Quotagate-Max-Output-Tokens",
                   i == 0 ? "1000000000000000" : "1000000000000", "authz");
    }
    want_alive();
}

/* ============================================ simulate traces, rules (CLI) */

static const char *tmp_file(const char *name, const char *text)
{
    const char *path = tst_fmt("%s", qgproc_path(&P, name));
    if (qgproc_write_file(path, text) < 0)
        fail_msg("cannot write %s", path);
    return path;
}

static void want_cli_error(tst_cli_result *r, int rc, const char *a,
                           const char *b, const char *what)
{
    if (r->rc != rc || !strstr(r->err, a) || (b && !strstr(r->err, b)))
        fail_msg("%s: exit %d (want %d), stderr: %s", what, r->rc, rc, r->err);
    tst_cli_done(r);
}

/* The start of a rules file (every required key but the plans). */
#define HEAD "version: \"b\"\nunit: \"points\"\nweights:\n  version: " \
             "\"w\"\n  calibrated: \"2026-01-01\"\n  models:\n    m: " \
             "{ per_request: 1 }\n"

static void test_cli_bounds(void **state)
{
    const char *rules = tst_fmt("%s/numbers/rules.yaml", getenv("QG_TESTDATA"));
    tst_cli_result r;
    (void)state;
    r = tst_cli_run("simulate", "-c", rules, "--trace",
                    tmp_file("w.csv", "t,subject,weight\n0,a,1\n"
                                      "1,a,1000000000000001\n"), NULL);
    want_cli_error(&r, r.rc ? r.rc : -1, "w.csv:3:", "out of range",
                   "trace weight");
    r = tst_cli_run("simulate", "-c", rules, "--trace",
                    tmp_file("t.csv", "t,subject,model,input_tokens,"
                                      "output_tokens\n0,a,light,"
                                      "1000000000001,1\n"), NULL);
    want_cli_error(&r, r.rc ? r.rc : -1, "t.csv:2:", "out of range",
                   "trace tokens");
    r = tst_cli_run("simulate", "-c", rules, "--start",
                    "9999-12-31T23:59:59Z", "--trace",
                    tmp_file("e.csv", "t,subject,weight\n10,a,1\n"), NULL);
    want_cli_error(&r, r.rc ? r.rc : -1, "e.csv:2:", "out of range",
                   "trace end");
    /* rules: a limit beyond the bound, a duration beyond 36500 days */
    r = tst_cli_run("lint", "-c", tmp_file("l.yaml",
        HEAD "plans:\n  p:\n    windows:\n"
        "      - { name: w, type: calendar, every: day, at: \"00:00\", "
        "tz: \"UTC\", limit: 1000000000000001 }\ndefault_plan: p\n"), NULL);
    want_cli_error(&r, 2, "out of range (at most 1000000000000000)", NULL,
                   "rules limit");
    r = tst_cli_run("lint", "-c", tmp_file("d.yaml",
        HEAD "plans:\n  p:\n    windows:\n"
        "      - { name: w, type: rolling, length: 36501d, limit: 5 }\n"
        "default_plan: p\n"), NULL);
    want_cli_error(&r, 2, "duration out of range (at most 36500d)", NULL,
                   "rules duration");
    r = tst_cli_run("analyze", "-c", rules, "--period", "36501d", NULL);
    want_cli_error(&r, 2, "at most 36500d", NULL, "analyze --period");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_recovered_settles_beyond_bound,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_recovered_settles_at_bound,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_rebuild_rows_beyond_bounds,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_proxy_huge_prompt_concurrent,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_proxy_int64_usage, gc_teardown),
        cmocka_unit_test_teardown(test_proxy_output_over_max_tokens,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_check_settle_bounds, gc_teardown),
        cmocka_unit_test_teardown(test_authz_bounds, gc_teardown),
        cmocka_unit_test_teardown(test_cli_bounds, gc_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
