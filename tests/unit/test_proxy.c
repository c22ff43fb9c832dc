/* test_proxy.c - the metering proxy end to end: the real server binary
 * ($QG_BIN serve --upstream ...) in front of the upstream double
 * ($QG_UPSTREAM_BIN, tests/upstream/upstream_double.c), both as child
 * processes.  Each test checks what the caller got, what the upstream got
 * (/_double/last, /_double/count), the charge in /v1/usage and the ledger
 * row (read from BASE/data/ledger.db with SQLite, polled until the settle
 * is written: the proxy does not wait for the settle to be durable).
 *
 * Rules: tests/data/proxy/rules.yaml (weight = 1 + (in + out) / 1000).
 * Token counts of the double: prompt = ceil(text bytes / 4), completion =
 * max_tokens; "hello there friend" (18 bytes) is 5 prompt tokens.
 * Loopback only; every wait is bounded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dblproc.h"
#include "httpc.h"
#include "srvtest.h"
#include "qgproc.h"

#define ADMIN QGPROC_ADMIN_KEY
#define UPKEY "upstream-secret-of-the-gateway-42"
#define PROMPT "hello there friend"

static qgproc P;
static httpc C;                /* to quotagate */
static httpc D;                /* to the double */
static pid_t dbl_pid;
static int dbl_port;

/* ------------------------------------------------------------ garbage */

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

static const char *hdr(const http_resp *r, const char *name, const char *what)
{
    const char *v = http_resp_header(r, name);
    if (!v || !*v)
        fail_msg("%s: header %s missing (HTTP %d, body %s)", what, name,
                 r->status, tst_excerpt(r));
    return v;
}

/* ------------------------------------------------------------ requests */

static http_resp *call_on(httpc *c, const char *method, const char *path,
                          const char *key, const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(c, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, c->err);
    return r;
}

static http_resp *call(const char *method, const char *path, const char *key,
                       const char *body)
{
    return call_on(&C, method, path, key, body);
}

/* POST to the proxy with the NULL-terminated extra headers. */
static http_resp *post(const char *path, const char *const *h,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_request(&C, "POST", path, h, body, strlen(body), r) < 0)
        fail_msg("POST %s: no response: %s", path, C.err);
    return r;
}

static const char *new_subject(const char *plan)
{
    const char *s = tst_uid("s");
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

static double used_in(const char *subject)
{
    http_resp *r = call("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    json_t *ws, *w;
    size_t i;
    WANT(r, 200, "usage");
    ws = json_object_get(tst_jparse(r, "usage"), "windows");
    json_array_foreach(ws, i, w)
        if (!strcmp(tst_jstr(w, "name", "usage"), "burst_5h"))
            return tst_jnum(w, "used", "usage");
    fail_msg("usage of %s: no window burst_5h: %s", subject, tst_excerpt(r));
    return -1;
}

static double used_in_window(const char *subject, const char *name)
{
    http_resp *r = call("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    json_t *ws, *w;
    size_t i;
    WANT(r, 200, "usage");
    ws = json_object_get(tst_jparse(r, "usage"), "windows");
    json_array_foreach(ws, i, w)
        if (!strcmp(tst_jstr(w, "name", "usage"), name))
            return tst_jnum(w, "used", "usage");
    fail_msg("usage of %s: no window %s: %s", subject, name, tst_excerpt(r));
    return -1;
}

static long double_count(void)
{
    http_resp *r = call_on(&D, "GET", "/_double/count", NULL, NULL);
    WANT(r, 200, "/_double/count");
    return (long)tst_jnum(tst_jparse(r, "count"), "count", "count");
}

static json_t *double_last(void)
{
    http_resp *r = call_on(&D, "GET", "/_double/last", NULL, NULL);
    WANT(r, 200, "/_double/last");
    return tst_jparse(r, "last");
}

/* ------------------------------------------------------------- ledger */

typedef struct lrow {
    int status, estimated;
    long long in, out, weight_milli, settled_ms;
} lrow;

/* The row of rid once settled (polled up to 10 s). */
static lrow ledger_row(const char *rid)
{
    long long v[6];
    tst_ledger_ints(P.data, rid, "status, estimated, input_tokens, "
                    "output_tokens, weight_milli, settled_ms", v, 6);
    return (lrow){(int)v[0], (int)v[1], v[2], v[3], v[4], v[5]};
}

/* The model and window columns of rid's row (polled up to 10 s). */
static void ledger_model_window(const char *rid, const char **model,
                                const char **window)
{
    const char **v = tst_ledger_cols(P.data, rid, "model, window", 2, 0);
    *model = v[0];
    *window = v[1];
}

/* ------------------------------------------------------- raw sockets */

static int raw_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((unsigned short)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        fail_msg("connect: %s", strerror(errno));
    return fd;
}

static void raw_send(int fd, const char *text)
{
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t k = write(fd, text + off, n - off);
        if (k < 0 && errno == EINTR)
            continue;
        assert_true(k > 0);
        off += (size_t)k;
    }
}

/* Read until EOF, until `until` appears (when non-NULL) or timeout_ms. */
static char *raw_read(int fd, const char *until, int timeout_ms)
{
    size_t len = 0, cap = 65536;
    char *buf = tst_gc_add(GC_MEM, calloc(1, cap + 1));
    long long t0 = qg_now_ms();
    while (len < cap && qg_now_ms() - t0 < timeout_ms) {
        struct pollfd pf = {fd, POLLIN, 0};
        ssize_t k;
        if (poll(&pf, 1, 50) <= 0)
            continue;
        k = read(fd, buf + len, cap - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        buf[len] = '\0';
        if (until && strstr(buf, until))
            break;
    }
    return buf;
}

static const char *raw_request(const char *path, const char *key,
                               const char *extra, const char *body)
{
    return tst_fmt("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\n%sContent-Length: %zu\r\n"
               "\r\n%s", path, key, extra ? extra : "", strlen(body), body);
}

/* ------------------------------------------------------- the double */

/* The double through dblproc (tests/support), its pid and port kept in
 * this file's globals. */
static int double_start(const char *bin)
{
    dblproc d = {0, 0};
    if (dblproc_start(&d, bin) != 0)
        return -1;
    dbl_pid = d.pid;
    dbl_port = d.port;
    return 0;
}

static void double_stop(void)
{
    if (dbl_pid > 0) {
        int st;
        kill(dbl_pid, SIGTERM);
        waitpid(dbl_pid, &st, 0);
        dbl_pid = 0;
    }
}

/* ----------------------------------------------------------- fixtures */

static int group_setup(void **state)
{
    const char *src = getenv("QG_TESTDATA"), *ub = getenv("QG_UPSTREAM_BIN");
    char path[1024], up[128];
    const char *args[3], *env[3];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!src || !ub) {
        fprintf(stderr, "QG_TESTDATA / QG_UPSTREAM_BIN not set (run through "
                "tests/run.sh)\n");
        return -1;
    }
    if (double_start(ub) < 0) {
        fprintf(stderr, "cannot start the upstream double %s\n", ub);
        double_stop();
        return -1;
    }
    if (qgproc_init(&P) < 0) {
        fprintf(stderr, "qgproc_init: %s\n", P.why);
        double_stop();
        return -1;
    }
    snprintf(path, sizeof path, "%s/proxy/rules.yaml", src);
    snprintf(up, sizeof up, "http://127.0.0.1:%d", dbl_port);
    args[0] = "--upstream";
    args[1] = up;
    args[2] = NULL;
    env[0] = "QUOTAGATE_UPSTREAM_KEY=" UPKEY;
    env[1] = "QUOTAGATE_UPSTREAM_TIMEOUT_MS=1500";
    env[2] = NULL;
    if (qgproc_start_copy(&P, path, args, env) < 0) {
        double_stop();
        return -1;
    }
    httpc_init(&C, qgproc_port(&P));
    httpc_init(&D, dbl_port);
    return 0;
}

static int group_teardown(void **state)
{
    int rc;
    (void)state;
    httpc_close(&C);
    httpc_close(&D);
    rc = qgproc_finish(&P);
    double_stop();
    return rc;
}

/* ============================================================== tests */

static const char *openai_body(int stream, int max_tokens, const char *more)
{
    return tst_fmt("{\"model\":\"light\",%s\"messages\":[{\"role\":\"user\","
               "\"content\":\"" PROMPT "\"}],\"max_tokens\":%d%s}",
               stream ? "\"stream\":true," : "", max_tokens,
               more ? more : "");
}

static const char *anthropic_body(int stream, int max_tokens)
{
    return tst_fmt("{\"model\":\"claude-light\",%s\"messages\":[{\"role\":"
               "\"user\",\"content\":\"" PROMPT "\"}],\"max_tokens\":%d}",
               stream ? "\"stream\":true," : "", max_tokens);
}

static void test_openai_plain(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("plain");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid), NULL};
    http_resp *r;
    json_t *j, *u;
    lrow row;
    (void)state;
    r = post("/v1/chat/completions", h, openai_body(0, 7, NULL));
    WANT(r, 200, "plain completion");
    assert_string_equal(hdr(r, "X-Request-Id", "plain"), rid);
    assert_non_null(strstr(hdr(r, "RateLimit", "plain"), "burst_5h"));
    hdr(r, "RateLimit-Policy", "plain");
    j = tst_jparse(r, "plain");
    u = json_object_get(j, "usage");
    assert_true(NEAR(tst_jnum(u, "prompt_tokens", "usage"), 5));
    assert_true(NEAR(tst_jnum(u, "completion_tokens", "usage"), 7));
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);           /* completed */
    assert_int_equal(row.estimated, 0);
    assert_int_equal(row.in, 5);
    assert_int_equal(row.out, 7);
    assert_int_equal(row.weight_milli, 1012);
    assert_true(NEAR(used_in(s), 1.012));
}

static void test_key_never_forwarded(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    json_t *last, *hs;
    const char *k, *dump;
    json_t *it;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 3, NULL)), 200,
         "openai");
    last = double_last();
    hs = json_object_get(last, "headers");
    assert_string_equal(tst_jstr(hs, "authorization", "last"), "Bearer " UPKEY);
    assert_null(json_object_get(hs, "x-api-key"));
    dump = tst_gc_add(GC_MEM, json_dumps(last, 0));
    assert_null(strstr(dump, key));
    /* Anthropic: x-api-key in, the gateway's x-api-key out, the
     * anthropic-version header passed on */
    h[0] = tst_fmt("x-api-key: %s", key);
    h[1] = "anthropic-version: 2023-06-01";
    h[2] = NULL;
    WANT(post("/v1/messages", h, anthropic_body(0, 3)), 200, "anthropic");
    last = double_last();
    hs = json_object_get(last, "headers");
    assert_string_equal(tst_jstr(hs, "x-api-key", "last"), UPKEY);
    assert_string_equal(tst_jstr(hs, "anthropic-version", "last"), "2023-06-01");
    assert_null(json_object_get(hs, "authorization"));
    json_object_foreach(hs, k, it)
        assert_null(strstr(json_string_value(it) ? json_string_value(it) : "",
                           key));
    dump = tst_gc_add(GC_MEM, json_dumps(last, 0));
    assert_null(strstr(dump, key));
}

static void test_openai_stream_usage_added(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("st");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid), NULL};
    http_resp *r;
    json_t *last;
    lrow row;
    (void)state;
    r = post("/v1/chat/completions", h, openai_body(1, 4, NULL));
    WANT(r, 200, "stream");
    assert_non_null(strstr(hdr(r, "Content-Type", "stream"),
                           "text/event-stream"));
    assert_non_null(strstr(r->body, "tok3"));
    assert_non_null(strstr(r->body, "data: [DONE]"));
    /* the usage-only chunk the gateway asked for is not passed on */
    assert_null(strstr(r->body, "\"choices\":[]"));
    assert_null(strstr(r->body, "\"prompt_tokens\""));
    /* ... but the upstream was asked for it */
    last = double_last();
    assert_true(json_is_true(json_object_get(
        json_object_get(json_object_get(last, "body_json"),
                        "stream_options"), "include_usage")));
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 0);
    assert_int_equal(row.in, 5);
    assert_int_equal(row.out, 4);
    assert_true(NEAR(used_in(s), 1.009));
}

static void test_openai_stream_usage_asked(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("st2");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid), NULL};
    http_resp *r;
    lrow row;
    (void)state;
    r = post("/v1/chat/completions", h,
             openai_body(1, 6, ",\"stream_options\":{\"include_usage\":true}"));
    WANT(r, 200, "stream with include_usage");
    /* the caller asked: the usage chunk is passed on */
    assert_non_null(strstr(r->body, "\"choices\":[]"));
    assert_non_null(strstr(r->body, "\"completion_tokens\":6"));
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 0);
    assert_int_equal(row.in, 5);
    assert_int_equal(row.out, 6);
}

static void test_anthropic_stream(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("an");
    const char *h[5] = {tst_fmt("x-api-key: %s", key),
                        "anthropic-version: 2023-06-01",
                        tst_fmt("X-Request-Id: %s", rid), NULL};
    http_resp *r;
    lrow row;
    (void)state;
    r = post("/v1/messages", h, anthropic_body(1, 9));
    WANT(r, 200, "anthropic stream");
    assert_non_null(strstr(r->body, "event: message_start"));
    assert_non_null(strstr(r->body, "event: message_delta"));
    assert_non_null(strstr(r->body, "event: message_stop"));
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 0);
    assert_int_equal(row.in, 5);
    assert_int_equal(row.out, 9);      /* the last message_delta, not 1 + 9 */
    assert_true(NEAR(used_in(s), 1.014));
    /* non-streaming Anthropic too */
    rid = tst_uid("an2");
    h[2] = tst_fmt("X-Request-Id: %s", rid);
    WANT(post("/v1/messages", h, anthropic_body(0, 2)), 200, "anthropic");
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 0);
    assert_int_equal(row.out, 2);
}

static void test_caller_disconnects(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("gone");
    int fd = raw_connect(qgproc_port(&P));
    char *got;
    lrow row;
    (void)state;
    raw_send(fd, raw_request("/v1/chat/completions", key,
                             tst_fmt("X-Request-Id: %s\r\n"
                                 "X-Double-Mode: slow=100\r\n", rid),
                             openai_body(1, 200, NULL)));
    got = raw_read(fd, "tok2", 10000);
    assert_non_null(strstr(got, "tok2"));
    close(fd);
    row = ledger_row(rid);
    assert_int_equal(row.status, 3);           /* cancelled */
    assert_int_equal(row.estimated, 1);        /* no usage arrived */
    assert_int_equal(row.in, 5);
    assert_true(row.out >= 3 && row.out < 200);
    /* the upstream stream was stopped: the next call still works */
    WANT(post("/v1/chat/completions",
              (const char *const[]){tst_fmt("Authorization: Bearer %s", key),
                                    NULL},
              openai_body(0, 1, NULL)), 200, "after the disconnect");
}

static void test_reset_mid_stream(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("rst");
    int fd = raw_connect(qgproc_port(&P));
    char *got;
    lrow row;
    (void)state;
    raw_send(fd, raw_request("/v1/chat/completions", key,
                             tst_fmt("X-Request-Id: %s\r\n"
                                 "X-Double-Mode: reset-after=4,slow=60\r\n",
                                 rid),
                             openai_body(1, 50, NULL)));
    got = raw_read(fd, NULL, 10000);           /* until the gateway closes */
    close(fd);
    if (!strstr(got, "200 OK") || !strstr(got, "tok1"))
        fail_msg("reset mid-stream: got %.2000s", got);
    assert_null(strstr(got, "[DONE]"));
    assert_null(strstr(got, "\r\n0\r\n\r\n")); /* truncated: no last chunk */
    row = ledger_row(rid);
    assert_int_equal(row.status, 3);
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.in, 5);
    /* "" + "tok0" + " tok1" + " tok2" = 14 bytes: 4 tokens; the RST may
     * discard the last event before the gateway read it (9 bytes: 3) */
    assert_true(row.out == 4 || row.out == 3);
}

static void test_no_usage(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("nu");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid),
                        "X-Double-Mode: no-usage", NULL};
    lrow row;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 6, NULL)), 200,
         "no usage");
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.in, 5);                /* ceil(18 / 4) */
    /* "tok0 .. tok5": 29 bytes, ceil(29 / 4) = 8, but an estimate never
     * passes max_tokens (docs/proxy.md) */
    assert_int_equal(row.out, 6);
    /* streaming, no usage chunk at all */
    rid = tst_uid("nus");
    h[1] = tst_fmt("X-Request-Id: %s", rid);
    WANT(post("/v1/chat/completions", h, openai_body(1, 6, NULL)), 200,
         "no usage, stream");
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.out, 6);
}

static void test_upstream_429(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("u429");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid),
                        "X-Double-Mode: status=429", NULL};
    http_resp *r;
    lrow row;
    (void)state;
    r = post("/v1/chat/completions", h, openai_body(0, 6, NULL));
    WANT(r, 429, "upstream 429 passed through");
    assert_string_equal(hdr(r, "Retry-After", "429"), "2");
    assert_string_equal(tst_jstr(json_object_get(tst_jparse(r, "429"), "error"),
                             "code", "429"), "rate_limit_exceeded");
    row = ledger_row(rid);
    assert_int_equal(row.status, 4);            /* failed */
    assert_int_equal(row.in, 0);
    assert_int_equal(row.out, 0);
    /* the documented rule: the upstream's 429 costs nothing, not even
     * the per-request base */
    assert_int_equal(row.weight_milli, 0);
    assert_true(NEAR(used_in(s), 0.0));
}

static void test_upstream_500(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("u500");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid),
                        "X-Double-Mode: status=500", NULL};
    http_resp *r;
    lrow row;
    (void)state;
    r = post("/v1/chat/completions", h, openai_body(1, 6, NULL));
    WANT(r, 502, "upstream 500");
    assert_string_equal(tst_error_type(r, "500"), "upstream_error");
    row = ledger_row(rid);
    assert_int_equal(row.status, 4);
    assert_int_equal(row.out, 0);
    assert_int_equal(row.weight_milli, 1000);
    assert_true(NEAR(used_in(s), 1.0));
}

static void test_upstream_timeout(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("hang");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid), "X-Double-Mode: hang",
                        NULL};
    http_resp *r;
    int fd;
    char *got;
    lrow row;
    long long t0 = qg_now_ms();
    (void)state;
    /* no answer at all: 502 upstream_timeout after the 1.5 s timeout */
    r = post("/v1/chat/completions", h, openai_body(0, 5, NULL));
    WANT(r, 502, "upstream hangs");
    assert_string_equal(tst_error_type(r, "hang"), "upstream_timeout");
    assert_true(qg_now_ms() - t0 >= 1400);
    row = ledger_row(rid);
    assert_int_equal(row.status, 4);
    assert_int_equal(row.weight_milli, 1000);
    /* mid-stream: the first event at once, the next one 3 s later */
    rid = tst_uid("slow");
    fd = raw_connect(qgproc_port(&P));
    raw_send(fd, raw_request("/v1/messages", key,
                             tst_fmt("X-Request-Id: %s\r\n"
                                 "X-Double-Mode: slow=3000\r\n", rid),
                             anthropic_body(1, 20)));
    got = raw_read(fd, NULL, 10000);
    close(fd);
    assert_non_null(strstr(got, "message_start"));
    assert_null(strstr(got, "message_stop"));
    assert_null(strstr(got, "\r\n0\r\n\r\n"));
    row = ledger_row(rid);
    assert_int_equal(row.status, 3);            /* cancelled */
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.in, 5);                /* from message_start */
    assert_int_equal(row.out, 1);               /* message_start's count */
}

/* Issue 8, failure 5: a non-streamed answer over the 64 MiB the proxy
 * holds to read its usage was passed on cut (200, a damaged body).  Now:
 * 502 upstream_response_too_large as soon as it passes the bound, the
 * upstream call cancelled, one settle at the reservation (cancelled,
 * estimated), the slot freed (plan single: concurrency 1, so the next
 * call is admitted only if it was) and the server serving.  The double's
 * big=MIB makes the body as it goes (Content-Length; big-chunked: chunked
 * coding), for both API shapes. */
static void test_body_too_large(void **state)
{
    const char *s = new_subject("single"), *key = new_key(s);
    const char *rid = tst_uid("big"), *detail;
    const char *h[5] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid),
                        "X-Double-Mode: big=1", NULL};
    http_resp *r;
    json_t *j;
    lrow row;
    (void)state;
    /* under the bound: passed on whole (1 MiB of text, valid JSON) */
    r = post("/v1/chat/completions", h, openai_body(0, 7, NULL));
    WANT(r, 200, "a 1 MiB answer");
    j = tst_jparse(r, "1 MiB");
    assert_int_equal(strlen(tst_jstr(json_object_get(json_array_get(
                         json_object_get(j, "choices"), 0), "message"),
                         "content", "1 MiB")), 1u << 20);
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.estimated, 0);
    /* over it, with Content-Length */
    rid = tst_uid("big");
    h[1] = tst_fmt("X-Request-Id: %s", rid);
    h[2] = "X-Double-Mode: big=65";
    r = post("/v1/chat/completions", h, openai_body(0, 7, NULL));
    WANT(r, 502, "a 65 MiB answer");
    assert_string_equal(tst_error_type(r, "65 MiB"),
                        "upstream_response_too_large");
    assert_non_null(strstr(r->body, "67108864 bytes"));
    assert_string_equal(hdr(r, "X-Request-Id", "65 MiB"), rid);
    row = ledger_row(rid);
    assert_int_equal(row.status, 3);            /* cancelled */
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.in, 5);                /* the reservation: */
    assert_int_equal(row.out, 7);               /* input estimate, max_tokens */
    assert_int_equal(row.weight_milli, 1012);
    detail = tst_ledger_cols(P.data, rid, "detail", 1, 1)[0];
    if (!strstr(detail, "passed 67108864 bytes"))
        fail_msg("detail: %s", detail);
    /* the slot was freed and the server serves */
    WANT(post("/v1/chat/completions",
              (const char *const[]){h[0], NULL}, openai_body(0, 2, NULL)),
         200, "after the 65 MiB answer");
    assert_true(NEAR(used_in(s), 1.0 + 12 / 1000.0 + 1.0 + 12 / 1000.0 +
                                     1.0 + 7 / 1000.0));
    /* Anthropic, chunked; no max_tokens cut of the text changes that */
    rid = tst_uid("bigc");
    h[0] = tst_fmt("x-api-key: %s", key);
    h[1] = tst_fmt("X-Request-Id: %s", rid);
    h[2] = "X-Double-Mode: big-chunked=65";
    h[3] = "anthropic-version: 2023-06-01";
    r = post("/v1/messages", h, anthropic_body(0, 9));
    WANT(r, 502, "a 65 MiB chunked answer");
    assert_string_equal(tst_error_type(r, "65 MiB chunked"),
                        "upstream_response_too_large");
    row = ledger_row(rid);
    assert_int_equal(row.status, 3);
    assert_int_equal(row.estimated, 1);
    assert_int_equal(row.in, 5);
    assert_int_equal(row.out, 9);
    assert_int_equal(row.weight_milli, 1014);
    h[1] = "anthropic-version: 2023-06-01";
    h[2] = NULL;
    WANT(post("/v1/messages", h, anthropic_body(0, 2)), 200,
         "after the 65 MiB chunked answer");
}

/* The port the double saw the last API request come from (its
 * connection from the gateway). */
static int double_last_port(void)
{
    return (int)tst_jnum(double_last(), "peer_port", "last");
}

/* The text of an OpenAI answer's first choice. */
static const char *choice_text(const http_resp *r, const char *what)
{
    json_t *j = tst_jparse(r, what);
    return tst_jstr(json_object_get(json_array_get(json_object_get(j,
                        "choices"), 0), "message"), "content", what);
}

/* Issue 8: two upstream responses in one write reached the caller joined
 * (the parser went on into the second).  The double's twice mode writes
 * its answer and then a second complete response in the same write.  The
 * caller must get exactly the first (its body, valid JSON, its
 * Content-Length) and be charged its usage, not the second's; the
 * connection must be closed, not pooled: the next call goes out on
 * another connection (the double sees another client port) and gets a
 * fresh, correct answer, not the stale second response. */
static void test_two_responses_one_write(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("twice");
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid),
                        "X-Double-Mode: twice", NULL};
    http_resp *r;
    lrow row;
    int port;
    (void)state;
    for (int shape = 0; shape < 2; shape++) {
        rid = tst_uid("twice");
        h[1] = tst_fmt("X-Request-Id: %s", rid);
        if (shape == 0) {
            r = post("/v1/chat/completions", h, openai_body(0, 7, NULL));
            WANT(r, 200, "twice");
            assert_string_equal(choice_text(r, "twice"),
                                "tok0 tok1 tok2 tok3 tok4 tok5 tok6");
        } else {
            h[0] = tst_fmt("x-api-key: %s", key);
            r = post("/v1/messages", h, anthropic_body(0, 7));
            WANT(r, 200, "twice, anthropic");
            assert_string_equal(tst_jstr(json_array_get(json_object_get(
                                    tst_jparse(r, "twice"), "content"), 0),
                                    "text", "twice"),
                                "tok0 tok1 tok2 tok3 tok4 tok5 tok6");
        }
        assert_null(strstr(r->body, "stale"));
        assert_int_equal(strlen(r->body), r->body_len);
        assert_int_equal(atol(hdr(r, "Content-Length", "twice")),
                         (long)r->body_len);
        row = ledger_row(rid);
        assert_int_equal(row.status, 2);
        assert_int_equal(row.in, 5);
        assert_int_equal(row.out, 7);
        port = double_last_port();
        /* the next call on that worker's pool: a fresh connection */
        rid = tst_uid("after");
        h[1] = tst_fmt("X-Request-Id: %s", rid);
        h[2] = NULL;
        if (shape == 0) {
            r = post("/v1/chat/completions", h, openai_body(0, 3, NULL));
            WANT(r, 200, "after twice");
            assert_string_equal(choice_text(r, "after twice"),
                                "tok0 tok1 tok2");
        } else {
            r = post("/v1/messages", h, anthropic_body(0, 3));
            WANT(r, 200, "after twice, anthropic");
            assert_null(strstr(r->body, "stale"));
        }
        row = ledger_row(rid);
        assert_int_equal(row.status, 2);
        assert_int_equal(row.in, 5);
        assert_int_equal(row.out, 3);
        if (double_last_port() == port)
            fail_msg("the connection that carried a second response was "
                     "reused (port %d)", port);
        h[2] = "X-Double-Mode: twice";
    }
}

static void test_refusal(void **state)
{
    const char *s = new_subject("tiny"), *key = new_key(s);
    const char *h[4] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    http_resp *r;
    json_t *j;
    long before;
    (void)state;
    /* 1 + (5 + 1000) / 1000 = 2.005 of 3 */
    WANT(post("/v1/chat/completions", h, openai_body(0, 1000, NULL)), 200,
         "first");
    before = double_count();
    r = post("/v1/chat/completions", h, openai_body(0, 1000, NULL));
    WANT(r, 429, "over the plan");
    assert_true(atol(hdr(r, "Retry-After", "refusal")) > 0);
    hdr(r, "RateLimit", "refusal");
    hdr(r, "RateLimit-Policy", "refusal");
    j = tst_jparse(r, "refusal");
    assert_string_equal(tst_jstr(j, "decision", "refusal"), "reject");
    assert_string_equal(tst_error_type(r, "refusal"), "quota_exceeded");
    assert_int_equal(double_count(), before);   /* upstream not called */
    assert_true(NEAR(used_in(s), 2.005));
    /* an unknown model: 400, upstream not called */
    r = post("/v1/chat/completions", h,
             "{\"model\":\"nope\",\"messages\":[],\"max_tokens\":1}");
    WANT(r, 400, "unknown model");
    assert_string_equal(tst_error_type(r, "model"), "unknown_model");
    assert_int_equal(double_count(), before);
    /* no key, a bad body */
    r = post("/v1/chat/completions", NULL, openai_body(0, 1, NULL));
    WANT(r, 401, "no key");
    r = post("/v1/chat/completions", h, "not json");
    WANT(r, 400, "bad body");
    assert_int_equal(double_count(), before);
}

static const char *large_body(int stream)
{
    return tst_fmt("{\"model\":\"large\",%s\"messages\":[{\"role\":\"user\","
               "\"content\":\"" PROMPT "\"}],\"max_tokens\":7}",
               stream ? "\"stream\":true," : "");
}

/* Plan dg: large_5h (3 points, models [large]) has its own overage
 * {downgrade, to_model: light}; light_5h holds 2 points.  large costs
 * 2 + 12/1000 = 2.012 a call, light 1.012. */
static void test_downgrade(void **state)
{
    const char *s = new_subject("dg"), *key = new_key(s);
    const char *rid1 = tst_uid("dg1"), *rid2 = tst_uid("dg2"), *rid3 = tst_uid("dg3");
    const char *h1[3] = {tst_fmt("Authorization: Bearer %s", key),
                         tst_fmt("X-Request-Id: %s", rid1), NULL};
    const char *h2[3] = {h1[0], tst_fmt("X-Request-Id: %s", rid2), NULL};
    const char *h3[3] = {h1[0], tst_fmt("X-Request-Id: %s", rid3), NULL};
    const char *model, *window;
    http_resp *r;
    json_t *j, *last;
    lrow row;
    long before;
    (void)state;
    /* 1: served as large */
    r = post("/v1/chat/completions", h1, large_body(0));
    WANT(r, 200, "large");
    assert_null(http_resp_header(r, "x-quotagate-downgraded-from"));
    last = json_object_get(double_last(), "body_json");
    assert_string_equal(tst_jstr(last, "model", "last"), "large");
    row = ledger_row(rid1);
    assert_int_equal(row.weight_milli, 2012);
    assert_true(NEAR(used_in_window(s, "large_5h"), 2.012));
    /* 2: large_5h refuses (4.024 > 3): served by light, and says so */
    r = post("/v1/chat/completions", h2, large_body(0));
    WANT(r, 200, "downgraded");
    assert_string_equal(hdr(r, "x-quotagate-downgraded-from", "dg"),
                        "large");
    assert_string_equal(hdr(r, "x-quotagate-model", "dg"), "light");
    assert_string_equal(hdr(r, "X-Request-Id", "dg"), rid2);
    j = tst_jparse(r, "downgraded");
    assert_string_equal(tst_jstr(j, "model", "downgraded"), "light");
    last = json_object_get(double_last(), "body_json");
    assert_string_equal(tst_jstr(last, "model", "last"), "light");
    row = ledger_row(rid2);
    assert_int_equal(row.status, 2);
    assert_int_equal(row.weight_milli, 1012);      /* light's weights */
    ledger_model_window(rid2, &model, &window);
    assert_string_equal(model, "light");
    assert_string_equal(window, "downgraded:large_5h");
    assert_true(NEAR(used_in_window(s, "large_5h"), 2.012));  /* unchanged */
    assert_true(NEAR(used_in_window(s, "light_5h"), 1.012));
    assert_true(NEAR(used_in(s), 3.024));
    /* 3: light is full too (2.024 > 2): the original refusal */
    before = double_count();
    r = post("/v1/chat/completions", h3, large_body(0));
    WANT(r, 429, "both refuse");
    assert_null(http_resp_header(r, "x-quotagate-downgraded-from"));
    assert_true(atol(hdr(r, "Retry-After", "both")) > 0);
    hdr(r, "RateLimit", "both");
    j = tst_jparse(r, "both");
    assert_string_equal(tst_jstr(j, "decision", "both"), "reject");
    assert_string_equal(tst_error_type(r, "both"), "quota_exceeded");
    assert_non_null(strstr(r->body, "large_5h"));
    assert_int_equal(double_count(), before);
    ledger_model_window(rid3, &model, &window);
    assert_string_equal(model, "large");
    assert_string_equal(window, "large_5h");
    assert_true(NEAR(used_in_window(s, "large_5h"), 2.012));
    assert_true(NEAR(used_in_window(s, "light_5h"), 1.012));
}

/* A streamed downgrade: the rewritten body asks for the usage chunk and
 * names light; the stream's headers say so. */
static void test_downgrade_stream(void **state)
{
    const char *s = new_subject("dg"), *key = new_key(s);
    const char *rid = tst_uid("dgs");
    const char *h1[3] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    const char *h2[3] = {h1[0], tst_fmt("X-Request-Id: %s", rid), NULL};
    http_resp *r;
    json_t *last;
    lrow row;
    (void)state;
    WANT(post("/v1/chat/completions", h1, large_body(0)), 200, "large");
    r = post("/v1/chat/completions", h2, large_body(1));
    WANT(r, 200, "downgraded stream");
    assert_string_equal(hdr(r, "x-quotagate-downgraded-from", "dgs"),
                        "large");
    assert_string_equal(hdr(r, "x-quotagate-model", "dgs"), "light");
    assert_non_null(strstr(r->body, "\"model\":\"light\""));
    last = json_object_get(double_last(), "body_json");
    assert_string_equal(tst_jstr(last, "model", "last"), "light");
    assert_true(json_is_true(json_object_get(
        json_object_get(last, "stream_options"), "include_usage")));
    row = ledger_row(rid);
    assert_int_equal(row.estimated, 0);
    assert_int_equal(row.weight_milli, 1012);
    assert_true(NEAR(used_in_window(s, "large_5h"), 2.012));
    assert_true(NEAR(used_in_window(s, "light_5h"), 1.012));
}

/* The Anthropic shape downgrades the same way (qg__request_replace_model). */
static void test_downgrade_anthropic(void **state)
{
    const char *s = new_subject("dg"), *key = new_key(s);
    const char *h[3] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    const char *body = "{\"model\":\"large\",\"messages\":[{\"role\":"
                       "\"user\",\"content\":\"" PROMPT "\"}],"
                       "\"max_tokens\":7}";
    http_resp *r;
    json_t *last;
    (void)state;
    WANT(post("/v1/messages", h, body), 200, "large");
    r = post("/v1/messages", h, body);
    WANT(r, 200, "downgraded messages");
    assert_string_equal(hdr(r, "x-quotagate-downgraded-from", "dga"),
                        "large");
    assert_string_equal(hdr(r, "x-quotagate-model", "dga"), "light");
    last = json_object_get(double_last(), "body_json");
    assert_string_equal(tst_jstr(last, "model", "last"), "light");
    assert_string_equal(tst_jstr(tst_jparse(r, "dga"), "model", "dga"), "light");
    assert_true(NEAR(used_in_window(s, "large_5h"), 2.012));
    assert_true(NEAR(used_in_window(s, "light_5h"), 1.012));
}

/* Plans q, q_short, q_one: a rate window of 1 request per 2 s with
 * overage {queue, max_wait 5s (q_short: 1s), queue_size 2 (q_one: 1)}.
 * Bounds are generous: these check behaviour, not speed. */
/* Plan pg: burst_5h holds 3 points, then payg at $0.01 a point up to
 * $0.02.  A call with max_tokens 1000 weighs 1 + (5 + 1000) / 1000 =
 * 2.005 (the double reports 5 prompt tokens and max_tokens completion
 * tokens); the admission's estimate is the same. */
static void test_payg(void **state)
{
    const char *s = new_subject("pg"), *key = new_key(s);
    const char *rid1 = tst_uid("pg"), *rid2 = tst_uid("pg");
    const char *h1[4] = {tst_fmt("Authorization: Bearer %s", key),
                         tst_fmt("X-Request-Id: %s", rid1), NULL};
    const char *h2[4] = {tst_fmt("Authorization: Bearer %s", key),
                         tst_fmt("X-Request-Id: %s", rid2), NULL};
    const char *h3[4] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    long long v[4];
    http_resp *r;
    long before;
    (void)state;
    /* within burst_5h: no overage headers */
    r = post("/v1/chat/completions", h1, openai_body(0, 1000, NULL));
    WANT(r, 200, "payg: first call fits");
    assert_null(http_resp_header(r, "x-quotagate-overage-units"));
    /* streamed past the limit: 2.005 with 0.995 of room = 1.01 points of
     * overage, $0.0101, said in the stream's headers */
    r = post("/v1/chat/completions", h2, openai_body(1, 1000, NULL));
    WANT(r, 200, "payg: streamed beyond the limit");
    assert_string_equal(hdr(r, "x-quotagate-overage-units", "payg"), "1.01");
    assert_string_equal(hdr(r, "x-quotagate-overage-cost-usd", "payg"),
                        "0.0101");
    assert_non_null(strstr(r->body, "data: [DONE]"));
    tst_ledger_ints(P.data, rid2, "weight_milli, overage_milli, "
                    "overage_cost_micro, headroom_milli", v, 4);
    assert_int_equal(v[0], 2005);
    assert_int_equal(v[1], 1010);
    assert_int_equal(v[2], 10100);
    assert_int_equal(v[3], 995);
    assert_true(NEAR(used_in(s), 4.01));
    /* another 2.005 points, all beyond: $0.02005 more would pass the
     * $0.02 cap: refused like any refusal (retryable: burst_5h will have
     * room), the upstream not called */
    before = double_count();
    r = post("/v1/chat/completions", h3, openai_body(0, 1000, NULL));
    WANT(r, 429, "payg: past the spending cap");
    assert_string_equal(tst_error_type(r, "cap"), "spending_cap_reached");
    assert_true(atol(hdr(r, "Retry-After", "cap")) > 0);
    /* 6.005 points: more than burst_5h could ever hold, and its overage
     * alone costs more than the whole cap: never */
    r = post("/v1/chat/completions", h3, openai_body(0, 5000, NULL));
    WANT(r, 429, "payg: never within the cap");
    assert_string_equal(tst_error_type(r, "never"), "spending_cap_reached");
    assert_null(http_resp_header(r, "Retry-After"));
    assert_false(tst_jbool(tst_jparse(r, "never"), "retryable", "never"));
    assert_int_equal(double_count(), before);
    assert_true(NEAR(used_in(s), 4.01));
}

static void test_queue_waits(void **state)
{
    const char *s = new_subject("q"), *key = new_key(s);
    const char *rid = tst_uid("q2");
    const char *h1[3] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    const char *h2[3] = {h1[0], tst_fmt("X-Request-Id: %s", rid), NULL};
    http_resp *r;
    long before, qms;
    long long t0;
    lrow row;
    (void)state;
    r = post("/v1/chat/completions", h1, openai_body(0, 1, NULL));
    WANT(r, 200, "first");
    assert_null(http_resp_header(r, "x-quotagate-queued-ms"));
    before = double_count();
    t0 = qg_now_ms();
    r = post("/v1/chat/completions", h2, openai_body(0, 1, NULL));
    WANT(r, 200, "held, then served");
    qms = atol(hdr(r, "x-quotagate-queued-ms", "queued"));
    assert_true(qms >= 1000 && qms <= 5000);
    assert_true(qg_now_ms() - t0 >= 1000);
    assert_string_equal(hdr(r, "X-Request-Id", "queued"), rid);
    assert_int_equal(double_count(), before + 1);
    row = ledger_row(rid);
    assert_int_equal(row.status, 2);            /* completed */
}

static void test_queue_too_long(void **state)
{
    const char *s = new_subject("q_short"), *key = new_key(s);
    const char *h[3] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    http_resp *r;
    long before;
    long long t0;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 1, NULL)), 200,
         "first");
    before = double_count();
    t0 = qg_now_ms();
    r = post("/v1/chat/completions", h, openai_body(0, 1, NULL));
    WANT(r, 429, "retry beyond max_wait");
    assert_true(qg_now_ms() - t0 < 1000);       /* not held */
    assert_string_equal(tst_error_type(r, "too long"), "quota_exceeded");
    assert_true(atol(hdr(r, "Retry-After", "too long")) > 0);
    assert_null(http_resp_header(r, "x-quotagate-queued-ms"));
    assert_int_equal(double_count(), before);
}

static void test_queue_full(void **state)
{
    const char *s = new_subject("q_one"), *key = new_key(s);
    const char *h[3] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    const char *rid2 = tst_uid("qf2");
    http_resp *r;
    int fd;
    char *got;
    long before;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 1, NULL)), 200,
         "first");
    before = double_count();
    fd = raw_connect(qgproc_port(&P));
    raw_send(fd, raw_request("/v1/chat/completions", key,
                             tst_fmt("X-Request-Id: %s\r\nConnection: close\r\n",
                                 rid2),
                             openai_body(0, 1, NULL)));
    tst_sleep_ms(300);                              /* the second is held */
    r = post("/v1/chat/completions", h, openai_body(0, 1, NULL));
    WANT(r, 429, "third: queue full");
    assert_string_equal(tst_error_type(r, "full"), "queue_full");
    assert_true(atol(hdr(r, "Retry-After", "full")) > 0);
    got = raw_read(fd, NULL, 10000);
    close(fd);
    assert_non_null(strstr(got, "HTTP/1.1 200"));
    assert_non_null(strcasestr(got, "x-quotagate-queued-ms"));
    assert_int_equal(double_count(), before + 1);
    assert_int_equal(ledger_row(rid2).status, 2);
}

/* A held caller that leaves: nothing reserved, nothing forwarded. */
static void test_queue_caller_leaves(void **state)
{
    const char *s = new_subject("q"), *key = new_key(s);
    const char *h[3] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    http_resp *r;
    int fd;
    long before;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 1, NULL)), 200,
         "first");
    before = double_count();
    fd = raw_connect(qgproc_port(&P));
    raw_send(fd, raw_request("/v1/chat/completions", key, NULL,
                             openai_body(0, 1, NULL)));
    tst_sleep_ms(300);
    close(fd);
    tst_sleep_ms(2500);            /* past the retry instant of the held one */
    assert_int_equal(double_count(), before);
    r = post("/v1/chat/completions", h, openai_body(0, 1, NULL));
    WANT(r, 200, "after the held caller left");
    assert_null(http_resp_header(r, "x-quotagate-queued-ms"));
    assert_int_equal(double_count(), before + 1);
}

/* ------------------------------------------------ per-model upstreams */

/* Per-model upstreams run on a server of their own (rules with the
 * second double's port, reloaded mid-test), so the shared one is left
 * as it was. */
typedef struct mu_env {
    qgproc q;
    httpc c, d2;
    pid_t d2_pid;
    int d2_port;
} mu_env;

static mu_env MU;              /* stopped by mu_teardown if a test fails */

/* A second double: double_start, keeping the first one's globals. */
static int mu_double2(mu_env *e)
{
    pid_t pid0 = dbl_pid;
    int port0 = dbl_port, rc = double_start(getenv("QG_UPSTREAM_BIN"));
    e->d2_pid = dbl_pid;
    e->d2_port = dbl_port;
    dbl_pid = pid0;
    dbl_port = port0;
    return rc;
}

/* Rules where light goes to light_url and large to large_url ("" = no
 * upstream: key); large_5h (3 points) downgrades large to light. */
static const char *mu_rules(const char *light_url, const char *large_url)
{
    return tst_fmt(
        "version: \"mu-%s\"\n"
        "weights:\n"
        "  version: \"w1\"\n"
        "  calibrated: \"2026-11-29\"\n"
        "  models:\n"
        "    light: { per_request: 1, input_per_1k: 1, output_per_1k: 1%s%s%s }\n"
        "    large: { per_request: 2, input_per_1k: 1, output_per_1k: 1%s%s%s }\n"
        "plans:\n"
        "  mu:\n"
        "    windows:\n"
        "      - { name: burst_5h, type: rolling, length: 5h, limit: 100000 }\n"
        "      - { name: large_5h, type: rolling, length: 5h, limit: 3,\n"
        "          models: [large],\n"
        "          overage: { policy: downgrade, to_model: light } }\n"
        "    concurrency: 8\n"
        "default_plan: mu\n", tst_uid("v"),
        *light_url ? ", upstream: \"" : "", light_url, *light_url ? "\"" : "",
        *large_url ? ", upstream: \"" : "", large_url, *large_url ? "\"" : "");
}

/* Start e's server on rules text (with --upstream when upstream is
 * non-NULL) and the second double; returns a subject key. */
static const char *mu_start(mu_env *e, const char *rules, const char *upstream)
{
    const char *args[3] = {"--upstream", upstream, NULL};
    const char *env[2] = {"QUOTAGATE_UPSTREAM_TIMEOUT_MS=5000", NULL};
    http_resp *r;
    memset(e, 0, sizeof *e);
    httpc_init(&e->c, 0);
    httpc_init(&e->d2, 0);
    if (mu_double2(e) < 0)
        fail_msg("cannot start a second upstream double");
    if (qgproc_init(&e->q) < 0)
        fail_msg("qgproc_init: %s", e->q.why);
    if (qgproc_write_file(qgproc_path(&e->q, "rules.yaml"),
                          tst_fmt(rules, e->d2_port)) < 0 ||
        qgproc_start(&e->q, qgproc_path(&e->q, "rules.yaml"),
                     upstream ? args : NULL, env) < 0)
        fail_msg("cannot start the server: %s", e->q.why);
    httpc_set_port(&e->c, qgproc_port(&e->q));
    httpc_set_port(&e->d2, e->d2_port);
    r = call_on(&e->c, "POST", "/v1/admin/keys", ADMIN,
                "{\"subject\":\"mu-caller\"}");
    if (r->status != 200 && r->status != 201)
        fail_msg("create key: %d %s", r->status, tst_excerpt(r));
    return tst_jstr(tst_jparse(r, "keys"), "key", "keys");
}

static int mu_teardown(void **state)
{
    mu_env *e = &MU;
    httpc_close(&e->c);
    httpc_close(&e->d2);
    if (e->q.pid > 0)
        qgproc_stop(&e->q, 20000);
    if (e->q.base[0])
        qgproc_cleanup(&e->q);
    if (e->d2_pid > 0) {
        int st;
        kill(e->d2_pid, SIGTERM);
        waitpid(e->d2_pid, &st, 0);
    }
    memset(e, 0, sizeof *e);
    return gc_teardown(state);
}

static long mu_count(httpc *d)
{
    http_resp *r = call_on(d, "GET", "/_double/count", NULL, NULL);
    WANT(r, 200, "/_double/count");
    return (long)tst_jnum(tst_jparse(r, "count"), "count", "count");
}

/* The model named in the body the double behind d received last. */
static const char *mu_last_model(httpc *d)
{
    http_resp *r = call_on(d, "GET", "/_double/last", NULL, NULL);
    WANT(r, 200, "/_double/last");
    return tst_jstr(json_object_get(tst_jparse(r, "last"), "body_json"),
                    "model", "last");
}

/* POST a chat completion for model through e; expect status; then
 * expect d1 (the --upstream double) and d2 to have gained n1 and n2. */
static http_resp *mu_call(mu_env *e, const char *key, const char *model,
                          int stream, int status, long n1, long n2)
{
    const char *h[2] = {tst_fmt("Authorization: Bearer %s", key), NULL};
    const char *body = tst_fmt(
        "{\"model\":\"%s\",%s\"messages\":[{\"role\":\"user\",\"content\":"
        "\"" PROMPT "\"}],\"max_tokens\":3}", model,
        stream ? "\"stream\":true," : "");
    long c1 = double_count(), c2 = mu_count(&e->d2);
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_request(&e->c, "POST", "/v1/chat/completions", h, body,
                      strlen(body), r) < 0)
        fail_msg("POST %s: no response: %s", model, e->c.err);
    WANT(r, status, model);
    if (double_count() != c1 + n1 || mu_count(&e->d2) != c2 + n2)
        fail_msg("%s: upstream 1 got %ld, upstream 2 got %ld; expected "
                 "%ld and %ld", model, double_count() - c1,
                 mu_count(&e->d2) - c2, n1, n2);
    return r;
}

/* Model large names the second double; light has none and goes to
 * --upstream (the first); a downgraded large goes to light's upstream;
 * after a reload that swaps them, new requests follow the new rules. */
static void test_model_upstreams(void **state)
{
    mu_env *e = &MU;
    const char *key, *up1 = tst_fmt("http://127.0.0.1:%d", dbl_port);
    http_resp *r;
    (void)state;
    key = mu_start(e, mu_rules("", "http://127.0.0.1:%d/"), up1);
    /* large: its own upstream, double 2 */
    r = mu_call(e, key, "large", 0, 200, 0, 1);
    assert_string_equal(mu_last_model(&e->d2), "large");
    assert_null(http_resp_header(r, "x-quotagate-downgraded-from"));
    /* light: no upstream of its own, --upstream (double 1) */
    mu_call(e, key, "light", 0, 200, 1, 0);
    assert_string_equal(tst_jstr(json_object_get(double_last(), "body_json"),
                                 "model", "last"), "light");
    /* large_5h (3 points) now refuses large: downgraded to light, which
     * is served by light's upstream (double 1) */
    r = mu_call(e, key, "large", 0, 200, 1, 0);
    assert_string_equal(hdr(r, "x-quotagate-downgraded-from", "mu"),
                        "large");
    assert_string_equal(hdr(r, "x-quotagate-model", "mu"), "light");
    /* reload: light now names double 2, large none (--upstream) */
    if (qgproc_write_file(qgproc_path(&e->q, "rules.yaml"),
                          tst_fmt(mu_rules("http://127.0.0.1:%d", ""),
                                  e->d2_port)) < 0)
        fail_msg("cannot rewrite the rules");
    WANT(call_on(&e->c, "POST", "/v1/admin/reload", ADMIN, NULL), 200,
         "reload");
    /* a stream of light: double 2 now, passed through to [DONE] */
    r = mu_call(e, key, "light", 1, 200, 0, 1);
    assert_non_null(strstr(r->body, "data: [DONE]"));
    /* large is still refused by large_5h: downgraded, to double 2 */
    r = mu_call(e, key, "large", 0, 200, 0, 1);
    assert_string_equal(hdr(r, "x-quotagate-model", "mu"), "light");
    assert_string_equal(mu_last_model(&e->d2), "light");
}

/* Without --upstream: a model with its own upstream is served, one
 * without is answered 503 no_upstream and reaches no upstream. */
static void test_model_upstream_only(void **state)
{
    mu_env *e = &MU;
    const char *key;
    http_resp *r;
    (void)state;
    key = mu_start(e, mu_rules("http://127.0.0.1:%d", ""), NULL);
    mu_call(e, key, "light", 0, 200, 0, 1);
    r = mu_call(e, key, "large", 0, 503, 0, 0);
    assert_string_equal(tst_error_type(r, "no upstream"), "no_upstream");
}

/* ------------------------------------------------------- backpressure */

static int flood_events(void);
#define FLOOD_EVENTS flood_events()     /* >= 40000 events, ~1.2 kB each */

/* The double's /_double/stats: flood bytes handed to its socket, and how
 * many flood streams it sent to the end. */
static void double_stats(long long *bytes, long *done)
{
    http_resp *r = call_on(&D, "GET", "/_double/stats", NULL, NULL);
    json_t *j;
    WANT(r, 200, "/_double/stats");
    j = tst_jparse(r, "stats");
    *bytes = (long long)tst_jnum(j, "flood_bytes", "stats");
    *done = (long)tst_jnum(j, "floods_done", "stats");
}

/* Read from fd (after the have_len bytes already read) into a buffer
 * sized for the flood until the terminating chunk ends the response, EOF, or
 * timeout_ms.  *len gets the byte count. */
static char *raw_read_big(int fd, const char *have, size_t have_len,
                          size_t *len, int timeout_ms)
{
    size_t n = have_len, cap = (size_t)FLOOD_EVENTS * 1300 + (1u << 20);
    char *buf = tst_gc_add(GC_MEM, malloc(cap + 1));
    long long t0 = qg_now_ms();
    assert_non_null(buf);
    memcpy(buf, have, have_len);
    while (qg_now_ms() - t0 < timeout_ms) {
        struct pollfd pf = {fd, POLLIN, 0};
        ssize_t k;
        if (n >= 5 && memcmp(buf + n - 5, "0\r\n\r\n", 5) == 0)
            break;
        if (n == cap)
            fail_msg("response larger than %zu bytes", cap);
        if (poll(&pf, 1, 100) <= 0)
            continue;
        k = read(fd, buf + n, cap - n);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The body of a chunked response in raw (headers, chunks); NULL when the
 * framing is broken or the terminating chunk is missing. */
static char *dechunk(const char *raw, size_t len, size_t *blen)
{
    const char *p = strstr(raw, "\r\n\r\n"), *end = raw + len;
    char *out = tst_gc_add(GC_MEM, malloc(len + 1));
    size_t n = 0;
    assert_non_null(out);
    if (!p)
        return NULL;
    p += 4;
    for (;;) {
        char *e;
        unsigned long sz = strtoul(p, &e, 16);
        if (e == p || e + 2 > end || e[0] != '\r' || e[1] != '\n')
            return NULL;
        p = e + 2;
        if (sz == 0)
            break;
        if ((size_t)(end - p) < sz + 2 || p[sz] != '\r' || p[sz + 1] != '\n')
            return NULL;
        memcpy(out + n, p, sz);
        n += sz;
        p += sz + 2;
    }
    out[n] = '\0';
    *blen = n;
    return out;
}

/* The third field of /proc/sys/net/ipv4/NAME (a tcp_rmem or tcp_wmem
 * maximum), or dflt. */
static long long tcp_mem_max(const char *name, long long dflt)
{
    long long lo, def, max = dflt;
    FILE *f = fopen(tst_fmt("/proc/sys/net/ipv4/%s", name), "r");
    if (f) {
        if (fscanf(f, "%lld %lld %lld", &lo, &def, &max) != 3)
            max = dflt;
        fclose(f);
    }
    return max;
}

/* What may be in flight while the caller does not read, besides what
 * the caller's socket holds (its receive buffer is pinned to 16 KiB, the
 * kernel doubles it): the gateway's send buffer to the caller, which the
 * kernel lets grow to net.ipv4.tcp_wmem's maximum (4 MiB by default:
 * measured, it fills); the gateway's receive buffer from the double,
 * which the kernel's autotuning grows while the gateway reads, up to
 * net.ipv4.tcp_rmem's maximum (measured under load: 9.07 MB left the
 * double in all, more than a bound without this term); plus 3 MiB for
 * the rest: the gateway's pending output (the 256 KiB high-water mark of
 * qg__http_stream_write plus one upstream read) and the double's pinned
 * 64 KiB send buffer (doubled by the kernel) and 64 KiB batch.  Without
 * backpressure the whole stream leaves the double. */
static long long in_flight_bound(void)
{
    return tcp_mem_max("tcp_wmem", 4 << 20) + tcp_mem_max("tcp_rmem", 6 << 20)
           + (3 << 20);
}

/* The flood is three times what the kernels' buffers could hold, so
 * that the double stopping short of the end shows backpressure: 40,000
 * events (~48 MB) with the default limits, more where tcp_rmem's
 * maximum is raised (32 MiB on some machines: ~102,000 events). */
static int flood_events(void)
{
    long long n = in_flight_bound() * 3 / 1200 + 1;
    return n < 40000 ? 40000 : n > 1000000 ? 1000000 : (int)n;
}

/* A caller that stops reading a long stream (flood_events()): the gateway must pause
 * reading from the upstream (qg__http_stream_write returns 1 above the
 * high-water mark; h_proxy.c then disables the upstream bufferevent's
 * reads until the drain callback), so the double, which writes only as
 * fast as its socket takes bytes (flood mode), stops far short of the
 * end; once the caller reads, every byte arrives, in order, and the
 * stream is settled from its usage chunk. */
static void backpressure(int include_usage)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *rid = tst_uid("bp");
    long long b0, b1, b2, bend, t0;
    long done0, done1, doneend;
    int fd, rcv = 16384, next = 0;
    size_t rawlen, blen = 0;
    char *head, *raw, *body, *p, *eol, *last = NULL, *prev = NULL;
    double_stats(&b0, &done0);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    /* a small receive window: the caller's own socket holds little */
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv),
                     0);
    {
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((unsigned short)
                                                  qgproc_port(&P))};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
            fail_msg("connect: %s", strerror(errno));
    }
    raw_send(fd, raw_request("/v1/chat/completions", key,
                             tst_fmt("X-Request-Id: %s\r\nConnection: close\r\n"
                                     "X-Double-Mode: flood=%d\r\n", rid,
                                     FLOOD_EVENTS),
                             /* max_tokens as large as the flood: output
                              * above it would be charged at it */
                             openai_body(1, FLOOD_EVENTS, include_usage
                                         ? ",\"stream_options\":"
                                           "{\"include_usage\":true}"
                                         : NULL)));
    head = raw_read(fd, "\r\n\r\n", 10000);
    if (!strstr(head, "HTTP/1.1 200"))
        fail_msg("flood: no 200 stream: %.600s", head);
    /* stop reading; wait until the double stops advancing (no progress
     * over 1 s), or it finished: the latter is the failure */
    t0 = qg_now_ms();
    double_stats(&b1, &done1);
    for (;;) {
        tst_sleep_ms(1000);
        double_stats(&b2, &done1);
        if (b2 == b1 || done1 != done0 || qg_now_ms() - t0 > 30000)
            break;
        b1 = b2;
    }
    print_message("backpressure: the double wrote %lld bytes while the "
                  "caller did not read (bound %lld)\n", b2 - b0,
                  in_flight_bound());
    if (done1 != done0)
        fail_msg("backpressure: the double sent the whole stream while the "
                 "caller did not read");
    if (b2 != b1)
        fail_msg("backpressure: the double still advances after 30 s "
                 "(%lld bytes)", b2 - b0);
    if (b2 - b0 >= in_flight_bound())
        fail_msg("backpressure: %lld bytes left the double while the caller "
                 "did not read, more than the bound %lld", b2 - b0,
                 in_flight_bound());
    /* stay paused past QUOTAGATE_UPSTREAM_TIMEOUT_MS (1.5 s here): a
     * paused upstream read is not a silent upstream */
    tst_sleep_ms(1600);
    double_stats(&b1, &done1);
    assert_true(b1 == b2 && done1 == done0);
    /* now read it all: every byte, in order */
    raw = raw_read_big(fd, head, strlen(head), &rawlen, 120000);
    close(fd);
    body = dechunk(raw, rawlen, &blen);
    if (!body)
        fail_msg("flood: broken or truncated chunked framing (%zu bytes "
                 "read)", rawlen);
    double_stats(&bend, &doneend);
    assert_int_equal(doneend, done0 + 1);
    if (include_usage) {
        assert_int_equal((long long)blen, bend - b0);   /* byte for byte */
    } else {
        /* all but the usage-only chunk, which the gateway hid */
        const char *usage = tst_fmt(
            "data: {\"id\":\"chatcmpl-double-%ld\",\"object\":"
            "\"chat.completion.chunk\",\"created\":1700000000,\"model\":"
            "\"light\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
            "\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
            double_count(), FLOOD_EVENTS, FLOOD_EVENTS + 5);
        assert_int_equal((long long)(blen + strlen(usage)), bend - b0);
    }
    /* event by event (memchr, never strstr over the 48 MB: under ASan
     * every strstr measures its whole haystack): the content events in
     * order, then the finish chunk, the usage chunk (when asked for)
     * and [DONE] */
    for (p = body; p < body + blen; p = eol + 2) {
        const char *tok;
        eol = memchr(p, '\n', (size_t)(body + blen - p));
        if (!eol || eol + 1 >= body + blen || eol[1] != '\n')
            fail_msg("flood: event %d does not end with a blank line", next);
        tok = memmem(p, (size_t)(eol - p), "\"content\":\"tok", 14);
        if (tok) {
            if (atoi(tok + 14) != next)
                fail_msg("flood: content event %d found where %d was due",
                         atoi(tok + 14), next);
            next++;
        }
        prev = last;
        last = p;
    }
    assert_int_equal(next, FLOOD_EVENTS);
    assert_non_null(prev);
    if (include_usage) {
        const char *ct = tst_fmt("\"completion_tokens\":%d", FLOOD_EVENTS);
        assert_non_null(memmem(prev, (size_t)(last - prev), "\"choices\":[]",
                               12));
        assert_non_null(memmem(prev, (size_t)(last - prev), ct, strlen(ct)));
    } else {
        assert_non_null(memmem(prev, (size_t)(last - prev),
                               "\"finish_reason\":\"stop\"", 22));
    }
    assert_true(blen > 14);
    assert_memory_equal(body + blen - 14, "data: [DONE]\n\n", 14);
    {
        lrow row = ledger_row(rid);
        assert_int_equal(row.status, 2);            /* completed */
        assert_int_equal(row.estimated, 0);
        assert_int_equal(row.in, 5);
        assert_int_equal(row.out, FLOOD_EVENTS);
        assert_int_equal(row.weight_milli, 1000 + 5 + FLOOD_EVENTS);
    }
    assert_true(NEAR(used_in(s), (1000.0 + 5 + FLOOD_EVENTS) / 1000));
}

/* The caller asked for the usage chunk: the stream is passed on byte for
 * byte as each upstream chunk arrives. */
static void test_backpressure(void **state)
{
    (void)state;
    backpressure(1);
}

/* The usage chunk was added by the gateway: the stream is passed on
 * event by event (px_stream_bytes) and the usage chunk hidden. */
static void test_backpressure_events(void **state)
{
    (void)state;
    backpressure(0);
}

/* ------------------------------------------- queue: refused again */

/* The row of rid as the check left it: decision (1 allow, 2 reject),
 * window, created_ms (polled up to 10 s). */
static void ledger_decision(const char *rid, int *decision,
                            const char **window, long long *created_ms)
{
    const char **v = tst_ledger_cols(P.data, rid,
                                     "decision, window, created_ms", 3, 0);
    *decision = atoi(v[0]);
    *window = v[1];
    *created_ms = atoll(v[2]);
}

/* quotagate_decisions_total for plan, window ("none" for allows) and
 * outcome; 0 when the series is absent. */
static long decisions(const char *plan, const char *window,
                      const char *outcome)
{
    http_resp *r = call("GET", "/metrics", NULL, NULL);
    const char *key = tst_fmt("quotagate_decisions_total{plan=\"%s\","
                              "window=\"%s\",outcome=\"%s\"} ", plan, window,
                              outcome);
    const char *p;
    WANT(r, 200, "/metrics");
    for (p = r->body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, key, strlen(key)))
            return atol(p + strlen(key));
    return 0;
}

/* A weight-only /v1/check for subject (the service key): not limited by
 * the windows scoped to a model. */
static void charge_weight(const char *subject, const char *weight)
{
    http_resp *r = call("POST", "/v1/check", QGPROC_SERVICE_KEY,
                        tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                                "\"weight\":%s}", subject, tst_uid("w"),
                                weight));
    WANT(r, 200, "weight-only check");
}

/* Send a light call on its own connection (Connection: close) and
 * return the socket; the answer is read with raw_read. */
static int send_light(const char *key, const char *rid)
{
    int fd = raw_connect(qgproc_port(&P));
    raw_send(fd, raw_request("/v1/chat/completions", key,
                             tst_fmt("X-Request-Id: %s\r\nConnection: close\r\n",
                                     rid),
                             openai_body(0, 1, NULL)));
    return fd;
}

/* Plan q_refill: burst_5h holds 3 points, rps one light call per 3 s,
 * queue up to 10 s.  A (1.006) is served; B, at once, is refused by rps
 * only and held until A's rps slot frees (3 s).  While B waits, a
 * weight-only check of 1.5 for the same subject is admitted (it is not a
 * light call: rps does not apply).  At B's retry instant burst_5h has
 * 2.506 and refuses B (1.006) for 5 h, more than max_wait: the latest
 * refusal is answered, after the wait, and only it is recorded.
 * B must be held before the check lands (1 s later; B's timer fires
 * after 3 s): either order of events would otherwise be detected, as B
 * would be answered at once without x-quotagate-queued-ms. */
static void test_queue_refused_again(void **state)
{
    const char *s = new_subject("q_refill"), *key = new_key(s);
    const char *rid_a = tst_uid("qra"), *rid_b = tst_uid("qrb");
    const char *h[3] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid_a), NULL};
    const char *got, *window, *body;
    json_t *j;
    long before;
    long long created;
    int fd, decision;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 1, NULL)), 200,
         "A");
    before = double_count();
    fd = send_light(key, rid_b);
    tst_sleep_ms(1000);                         /* B is held */
    charge_weight(s, "1.5");
    got = raw_read(fd, NULL, 30000);
    close(fd);
    if (strncmp(got, "HTTP/1.1 429", 12) != 0)
        fail_msg("B: expected 429 after the wait, got %.800s", got);
    if (!strcasestr(got, "\r\nx-quotagate-queued-ms: "))
        fail_msg("B: answered without x-quotagate-queued-ms (not held?): "
                 "%.800s", got);
    assert_true(atol(strcasestr(got, "\r\nx-quotagate-queued-ms: ") + 25) > 0);
    assert_non_null(strcasestr(got, tst_fmt("\r\nX-Request-Id: %s\r\n",
                                            rid_b)));
    assert_non_null(strcasestr(got, "\r\nRateLimit: "));
    assert_true(atol(strcasestr(got, "\r\nRetry-After: ") + 15) > 3600);
    body = strstr(got, "\r\n\r\n");
    assert_non_null(body);
    j = tst_jparse_text(body + 4, strlen(body + 4), "B");
    assert_string_equal(tst_jstr(j, "decision", "B"), "reject");
    assert_string_equal(tst_jstr(json_object_get(j, "error"), "type", "B"),
                        "quota_exceeded");
    assert_string_equal(tst_jstr(json_object_get(j, "error"), "window", "B"),
                        "burst_5h");
    assert_int_equal(double_count(), before);   /* B never forwarded */
    ledger_decision(rid_b, &decision, &window, &created);
    assert_int_equal(decision, 2);              /* reject */
    assert_string_equal(window, "burst_5h");    /* the final refusal */
    /* the metrics count A, the check and B's final refusal: not B's
     * first refusal by rps */
    assert_int_equal(decisions("q_refill", "none", "allow"), 2);
    assert_int_equal(decisions("q_refill", "burst_5h", "reject"), 1);
    assert_int_equal(decisions("q_refill", "rps", "reject"), 0);
    assert_true(NEAR(used_in(s), 2.506));       /* B charged nothing */
}

/* Plan q_again: rps one light call per 3 s, roll_6s (a 6 s rolling
 * window) 3.1 points, queue up to 12 s.  A (1.006) is served; B is held
 * by rps until +3 s; meanwhile a weight-only check of 2 fills roll_6s to
 * 3.006.  At B's retry instant roll_6s refuses B until A's charge leaves
 * it (+6 s): 3 s waited plus 3 s still fits 12 s, so B waits again, and
 * is then admitted (2 + 1.006 <= 3.1) and served.  Only the final
 * decision is recorded. */
static void test_queue_waits_again(void **state)
{
    const char *s = new_subject("q_again"), *key = new_key(s);
    const char *rid_a = tst_uid("qwa"), *rid_b = tst_uid("qwb");
    const char *h[3] = {tst_fmt("Authorization: Bearer %s", key),
                        tst_fmt("X-Request-Id: %s", rid_a), NULL};
    const char *got, *window;
    long before;
    long long created_a, created_b;
    int fd, decision;
    lrow row;
    (void)state;
    WANT(post("/v1/chat/completions", h, openai_body(0, 1, NULL)), 200,
         "A");
    before = double_count();
    fd = send_light(key, rid_b);
    tst_sleep_ms(1000);                         /* B is held */
    charge_weight(s, "2");
    got = raw_read(fd, NULL, 30000);
    close(fd);
    if (strncmp(got, "HTTP/1.1 200", 12) != 0)
        fail_msg("B: expected 200 after waiting twice, got %.800s", got);
    assert_non_null(strcasestr(got, "\r\nx-quotagate-queued-ms: "));
    assert_non_null(strstr(got, "\"completion_tokens\":1"));
    assert_int_equal(double_count(), before + 1);
    row = ledger_row(rid_b);
    assert_int_equal(row.status, 2);            /* completed */
    assert_int_equal(row.weight_milli, 1006);
    /* B was admitted only once A's charge had left roll_6s: past its
     * first retry instant (the rps slot, 3 s after A) */
    ledger_decision(rid_a, &decision, &window, &created_a);
    ledger_decision(rid_b, &decision, &window, &created_b);
    assert_int_equal(decision, 1);
    assert_true(created_b - created_a >= 6000);
    /* metrics: A, the check, B's admission; none of B's refusals */
    assert_int_equal(decisions("q_again", "none", "allow"), 3);
    assert_int_equal(decisions("q_again", "rps", "reject"), 0);
    assert_int_equal(decisions("q_again", "roll_6s", "reject"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_openai_plain, gc_teardown),
        cmocka_unit_test_teardown(test_key_never_forwarded, gc_teardown),
        cmocka_unit_test_teardown(test_openai_stream_usage_added,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_openai_stream_usage_asked,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_anthropic_stream, gc_teardown),
        cmocka_unit_test_teardown(test_caller_disconnects, gc_teardown),
        cmocka_unit_test_teardown(test_reset_mid_stream, gc_teardown),
        cmocka_unit_test_teardown(test_no_usage, gc_teardown),
        cmocka_unit_test_teardown(test_upstream_429, gc_teardown),
        cmocka_unit_test_teardown(test_upstream_500, gc_teardown),
        cmocka_unit_test_teardown(test_upstream_timeout, gc_teardown),
        cmocka_unit_test_teardown(test_body_too_large, gc_teardown),
        cmocka_unit_test_teardown(test_two_responses_one_write, gc_teardown),
        cmocka_unit_test_teardown(test_refusal, gc_teardown),
        cmocka_unit_test_teardown(test_downgrade, gc_teardown),
        cmocka_unit_test_teardown(test_downgrade_stream, gc_teardown),
        cmocka_unit_test_teardown(test_downgrade_anthropic, gc_teardown),
        cmocka_unit_test_teardown(test_payg, gc_teardown),
        cmocka_unit_test_teardown(test_queue_waits, gc_teardown),
        cmocka_unit_test_teardown(test_queue_too_long, gc_teardown),
        cmocka_unit_test_teardown(test_queue_full, gc_teardown),
        cmocka_unit_test_teardown(test_queue_caller_leaves, gc_teardown),
        cmocka_unit_test_teardown(test_model_upstreams, mu_teardown),
        cmocka_unit_test_teardown(test_model_upstream_only, mu_teardown),
        cmocka_unit_test_teardown(test_backpressure, gc_teardown),
        cmocka_unit_test_teardown(test_queue_refused_again, gc_teardown),
        cmocka_unit_test_teardown(test_queue_waits_again, gc_teardown),
        cmocka_unit_test_teardown(test_backpressure_events, gc_teardown),
    };
    if (getenv("QG_TEST_FILTER"))           /* e.g. "*too_large*" */
        cmocka_set_test_filter(getenv("QG_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
