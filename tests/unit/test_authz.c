/* test_authz.c - GET /v1/authz (forward-auth), end to end.
 *
 * (1) Direct HTTP to the real server (tests/support/qgproc + httpc):
 *     allow with headers, refusal 429 with Retry-After, ?mode=nginx 403 +
 *     X-Quotagate-Status, unknown subject, missing/invalid keys, weight
 *     and model headers, charges in /v1/usage counted once, and no
 *     concurrency slot held after an allowed call.
 * (2) A REAL nginx (/usr/sbin/nginx; skipped with a message when it is
 *     not installed) running the configuration of docs/forward-auth.md
 *     with auth_request against the server: allowed requests reach the
 *     upstream, refused ones get a real 429 with Retry-After, RateLimit
 *     headers and the JSON body.
 *
 * Rules: tests/data/authz/rules.yaml ("small": 5 points per 5 h;
 * concurrency 1 in both plans).  Loopback only; every loop is bounded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "httpc.h"
#include "srvtest.h"
#include "ports.h"
#include "qgproc.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY
#define NGINX_BIN "/usr/sbin/nginx"

static qgproc P;
static httpc C;

/* ------------------------------------------------------------ garbage */

static pid_t nginx_pid;        /* stopped by the teardown if a test fails */
static httpc *own_c;

static void nginx_stop(void);

static int gc_teardown(void **state)
{
    (void)state;
    nginx_stop();
    if (own_c)
        httpc_close(own_c);
    own_c = NULL;
    tst_gc_free_all();
    return 0;
}

/* ------------------------------------------------------------ requests */

static const char *hdr(const http_resp *r, const char *name, const char *what)
{
    const char *v = http_resp_header(r, name);
    if (!v || !*v)
        fail_msg("%s: header %s missing (HTTP %d, body %s)", what, name,
                 r->status, tst_excerpt(r));
    return v;
}

/* GET path on c with the NULL-terminated header list. */
static http_resp *get_on(httpc *c, const char *path, const char *const *h)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_request(c, "GET", path, h, NULL, 0, r) < 0)
        fail_msg("GET %s: no response: %s", path, c->err);
    return r;
}

/* /v1/authz with the service key, an explicit subject, a fresh request
 * id and optional extra headers (up to 4, NULL-terminated). */
static http_resp *authz_subject(const char *query, const char *subject,
                                const char *extra1, const char *extra2)
{
    const char *h[8];
    int n = 0;
    h[n++] = "X-Quotagate-Key: " SERVICE;
    h[n++] = tst_fmt("X-Quotagate-Subject: %s", subject);
    h[n++] = tst_fmt("X-Request-Id: %s", tst_uid("authz"));
    if (extra1)
        h[n++] = extra1;
    if (extra2)
        h[n++] = extra2;
    h[n] = NULL;
    return get_on(&C, tst_fmt("/v1/authz%s", query ? query : ""), h);
}

static http_resp *call(const char *method, const char *path, const char *key,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, C.err);
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

static double used_in(const char *subject, const char *window)
{
    http_resp *r = call("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    json_t *ws, *w;
    size_t i;
    WANT(r, 200, "usage");
    ws = json_object_get(tst_jparse(r, "usage"), "windows");
    json_array_foreach(ws, i, w)
        if (!strcmp(tst_jstr(w, "name", "usage"), window))
            return tst_jnum(w, "used", "usage");
    fail_msg("usage of %s: no window %s: %s", subject, window, tst_excerpt(r));
    return -1;
}

/* ----------------------------------------------------------- fixtures */

static int group_setup(void **state)
{
    const char *src = getenv("QG_TESTDATA");
    char path[1024];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!src) {
        fprintf(stderr, "QG_TESTDATA is not set (run through tests/run.sh)\n");
        return -1;
    }
    if (qgproc_init(&P) < 0) {
        fprintf(stderr, "qgproc_init: %s\n", P.why);
        return -1;
    }
    snprintf(path, sizeof path, "%s/authz/rules.yaml", src);
    if (qgproc_start_copy(&P, path, NULL, NULL) < 0)
        return -1;
    httpc_init(&C, qgproc_port(&P));
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    httpc_close(&C);
    return qgproc_finish(&P);
}

/* ============================================================== tests */

static void test_allow(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *h[4];
    http_resp *r;
    json_t *j;
    (void)state;
    h[0] = "X-Quotagate-Key: " SERVICE;
    h[1] = tst_fmt("Authorization: Bearer %s", key);
    h[2] = tst_fmt("X-Request-Id: %s", tst_uid("a"));
    h[3] = NULL;
    r = get_on(&C, "/v1/authz", h);
    WANT(r, 200, "authz with the client's Bearer key");
    assert_string_equal(hdr(r, "X-Quotagate-Subject", "allow"), s);
    assert_string_equal(hdr(r, "X-Quotagate-Weight", "allow"), "1");
    assert_string_equal(hdr(r, "X-Quotagate-Request-Id", "allow"),
                        h[2] + strlen("X-Request-Id: "));
    assert_non_null(strstr(hdr(r, "RateLimit", "allow"), "burst_5h"));
    assert_non_null(strstr(hdr(r, "RateLimit-Policy", "allow"), "burst_5h"));
    hdr(r, "x-ratelimit-remaining-tokens", "allow");
    hdr(r, "x-ratelimit-remaining-requests", "allow");
    assert_null(http_resp_header(r, "Retry-After"));
    assert_null(http_resp_header(r, "X-Quotagate-Status"));
    j = tst_jparse(r, "allow");
    assert_string_equal(tst_jstr(j, "decision", "allow"), "allow");
    /* x-api-key, no request id (generated), nginx mode: still 200 */
    h[1] = tst_fmt("x-api-key: %s", key);
    h[2] = NULL;
    r = get_on(&C, "/v1/authz?mode=nginx", h);
    WANT(r, 200, "authz with x-api-key in nginx mode");
    assert_string_equal(hdr(r, "X-Quotagate-Subject", "x-api-key"), s);
    assert_non_null(strstr(hdr(r, "X-Quotagate-Request-Id", "gen"),
                           "authz-"));
    assert_true(NEAR(used_in(s, "burst_5h"), 2));
    /* POST is answered like GET (Envoy checks with the client's method):
     * the service key in Authorization without X-Quotagate-Subject is
     * not a forward-auth call, so 401 as for GET */
    {
        http_resp *p = call("POST", "/v1/authz", SERVICE, "{}");
        WANT(p, 401, "POST /v1/authz without X-Quotagate-Key");
        p = call("GET", "/v1/authz", SERVICE, NULL);
        WANT(p, 401, "GET /v1/authz without X-Quotagate-Key");
    }
}

static void test_refusal(void **state)
{
    const char *s = new_subject("small");
    http_resp *r;
    json_t *j, *b;
    const char *ra;
    (void)state;
    WANT(authz_subject(NULL, s, "X-Quotagate-Weight: 2", NULL), 200, "2");
    WANT(authz_subject(NULL, s, "X-Quotagate-Weight: 2", NULL), 200, "4");
    WANT(authz_subject(NULL, s, NULL, NULL), 200, "5");
    r = authz_subject(NULL, s, NULL, NULL);
    WANT(r, 429, "over the limit");
    ra = hdr(r, "Retry-After", "refusal");
    assert_true(atol(ra) > 0);
    hdr(r, "RateLimit", "refusal");
    hdr(r, "RateLimit-Policy", "refusal");
    hdr(r, "x-should-retry", "refusal");
    assert_null(http_resp_header(r, "X-Quotagate-Status"));
    j = tst_jparse(r, "refusal");
    assert_string_equal(tst_jstr(j, "decision", "refusal"), "reject");
    assert_string_equal(tst_error_type(r, "refusal"), "quota_exceeded");
    assert_true(tst_jnum(j, "retry_after_s", "refusal") > 0);
    assert_true(json_is_array(json_object_get(j, "recovers")));
    /* the refusal charged nothing */
    assert_true(NEAR(used_in(s, "burst_5h"), 5));

    /* nginx mode: 403, the real status, the same headers and body */
    r = authz_subject("?mode=nginx", s, NULL, NULL);
    WANT(r, 403, "nginx mode refusal");
    assert_string_equal(hdr(r, "X-Quotagate-Status", "nginx"), "429");
    assert_true(atol(hdr(r, "Retry-After", "nginx")) > 0);
    hdr(r, "RateLimit", "nginx");
    hdr(r, "RateLimit-Policy", "nginx");
    assert_string_equal(tst_error_type(r, "nginx"), "quota_exceeded");
    b = tst_jparse_text(hdr(r, "X-Quotagate-Body", "nginx"),
                    strlen(hdr(r, "X-Quotagate-Body", "nginx")),
                    "X-Quotagate-Body");
    assert_string_equal(tst_jstr(b, "decision", "body header"), "reject");
    assert_true(tst_jnum(b, "retry_after_s", "body header") > 0);
    assert_true(NEAR(used_in(s, "burst_5h"), 5));
}

static void test_unknown_subject(void **state)
{
    const char *nobody = tst_uid("nobody");
    http_resp *r;
    (void)state;
    r = authz_subject(NULL, nobody, NULL, NULL);
    WANT(r, 404, "unknown subject");
    assert_string_equal(tst_error_type(r, "unknown"), "unknown_subject");
    r = authz_subject("?mode=nginx", nobody, NULL, NULL);
    WANT(r, 403, "unknown subject, nginx mode");
    assert_string_equal(hdr(r, "X-Quotagate-Status", "unknown"), "404");
    assert_string_equal(tst_error_type(r, "unknown nginx"), "unknown_subject");
    r = authz_subject("?mode=bogus", nobody, NULL, NULL);
    WANT(r, 400, "unknown mode");
}

static void test_keys(void **state)
{
    const char *s = new_subject("roomy"), *key = new_key(s);
    const char *h[4];
    http_resp *r;
    (void)state;
    /* no service key at all: the client's key alone is not enough */
    h[0] = tst_fmt("Authorization: Bearer %s", key);
    h[1] = NULL;
    r = get_on(&C, "/v1/authz", h);
    WANT(r, 401, "no service key");
    assert_string_equal(tst_error_type(r, "no key"), "unauthorized");
    r = get_on(&C, "/v1/authz?mode=nginx", h);
    WANT(r, 401, "no service key, nginx mode (401 passes nginx)");
    r = get_on(&C, "/v1/authz", NULL);
    WANT(r, 401, "no headers");
    /* a wrong service key; a subject key as the service key */
    h[0] = "X-Quotagate-Key: not-the-service-key";
    h[1] = tst_fmt("Authorization: Bearer %s", key);
    h[2] = NULL;
    WANT(get_on(&C, "/v1/authz", h), 401, "wrong service key");
    h[0] = tst_fmt("X-Quotagate-Key: %s", key);
    WANT(get_on(&C, "/v1/authz", h), 401, "subject key as service key");
    /* service key, but no client key (and no subject) */
    h[0] = "X-Quotagate-Key: " SERVICE;
    h[1] = NULL;
    r = get_on(&C, "/v1/authz", h);
    WANT(r, 401, "no client key");
    assert_string_equal(tst_error_type(r, "no client key"), "unauthorized");
    /* an invalid client key; the service key as the client's key */
    h[1] = "Authorization: Bearer qg_bogus_key";
    WANT(get_on(&C, "/v1/authz", h), 401, "invalid client key");
    h[1] = "Authorization: Bearer " SERVICE;
    WANT(get_on(&C, "/v1/authz", h), 401, "service key as client key");
    /* explicit subject with the service key in Authorization */
    h[0] = "Authorization: Bearer " SERVICE;
    h[1] = tst_fmt("X-Quotagate-Subject: %s", s);
    h[2] = NULL;
    r = get_on(&C, "/v1/authz", h);
    WANT(r, 200, "service key in Authorization with a subject");
    assert_string_equal(hdr(r, "X-Quotagate-Subject", "explicit"), s);
    /* ...but not a subject key with an explicit subject */
    h[0] = tst_fmt("Authorization: Bearer %s", key);
    WANT(get_on(&C, "/v1/authz", h), 401, "subject key + X-Quotagate-Subject");
    assert_true(NEAR(used_in(s, "burst_5h"), 1));
}

static void test_weight(void **state)
{
    const char *s = new_subject("roomy");
    http_resp *r;
    (void)state;
    r = authz_subject(NULL, s, "X-Quotagate-Weight: 2.5", NULL);
    WANT(r, 200, "weight 2.5");
    assert_string_equal(hdr(r, "X-Quotagate-Weight", "2.5"), "2.5");
    assert_true(NEAR(tst_jnum(tst_jparse(r, "w"), "weight", "w"), 2.5));
    assert_true(NEAR(used_in(s, "burst_5h"), 2.5));
    r = authz_subject(NULL, s, "X-Quotagate-Weight: 0.125", NULL);
    WANT(r, 200, "weight 0.125");
    assert_string_equal(hdr(r, "X-Quotagate-Weight", "0.125"), "0.125");
    assert_true(NEAR(used_in(s, "burst_5h"), 2.625));
    /* model weights: light = 1 + 0.25/1k in + 1/1k out = 2.25 */
    r = authz_subject(NULL, s,
                      "X-Quotagate-Model: light",
                      "X-Quotagate-Input-Tokens: 1000");
    WANT(r, 200, "model without max output (default estimate)");
    {
        const char *h[7];
        h[0] = "X-Quotagate-Key: " SERVICE;
        h[1] = tst_fmt("X-Quotagate-Subject: %s", s);
        h[2] = "X-Quotagate-Model: light";
        h[3] = "X-Quotagate-Input-Tokens: 1000";
        h[4] = "X-Quotagate-Max-Output-Tokens: 1000";
        h[5] = tst_fmt("X-Request-Id: %s", tst_uid("m"));
        h[6] = NULL;
        double before = used_in(s, "burst_5h");
        r = get_on(&C, "/v1/authz", h);
        WANT(r, 200, "model weights");
        assert_string_equal(hdr(r, "X-Quotagate-Weight", "model"), "2.25");
        assert_true(NEAR(used_in(s, "burst_5h") - before, 2.25));
    }
    /* malformed */
    WANT(authz_subject(NULL, s, "X-Quotagate-Weight: 1.2345", NULL), 400,
         "4 decimals");
    WANT(authz_subject(NULL, s, "X-Quotagate-Weight: -1", NULL), 400,
         "negative");
    WANT(authz_subject(NULL, s, "X-Quotagate-Weight: abc", NULL), 400, "abc");
    r = authz_subject("?mode=nginx", s, "X-Quotagate-Weight: 1e3", NULL);
    WANT(r, 403, "bad weight, nginx mode");
    assert_string_equal(hdr(r, "X-Quotagate-Status", "bad"), "400");
    WANT(authz_subject(NULL, s, "X-Quotagate-Weight: 1",
                       "X-Quotagate-Model: light"), 400, "weight and model");
    WANT(authz_subject(NULL, s, "X-Quotagate-Model: nosuch", NULL), 400,
         "unknown model");
}

static void test_counted_once(void **state)
{
    const char *s = new_subject("roomy");
    const char *h[4];
    http_resp *r;
    (void)state;
    for (int i = 0; i < 7; i++)
        WANT(authz_subject(NULL, s, NULL, NULL), 200, "one of seven");
    assert_true(NEAR(used_in(s, "burst_5h"), 7));
    /* a repeated request id is the original decision, not a new charge */
    h[0] = "X-Quotagate-Key: " SERVICE;
    h[1] = tst_fmt("X-Quotagate-Subject: %s", s);
    h[2] = tst_fmt("X-Request-Id: %s", tst_uid("rep"));
    h[3] = NULL;
    WANT(get_on(&C, "/v1/authz", h), 200, "first");
    r = get_on(&C, "/v1/authz", h);
    WANT(r, 200, "repeat");
    assert_true(json_is_true(json_object_get(tst_jparse(r, "rep"), "replayed")));
    assert_true(NEAR(used_in(s, "burst_5h"), 8));
    /* the ledger has the rows: a restart rebuilds the same usage */
    httpc_close(&C);
    if (qgproc_stop(&P, 20000) != 0)
        fail_msg("stop: %s", P.why);
    if (qgproc_restart(&P) < 0)
        fail_msg("restart: %s", P.why);
    httpc_set_port(&C, qgproc_port(&P));
    assert_true(NEAR(used_in(s, "burst_5h"), 8));
}

static void test_no_lease_held(void **state)
{
    const char *s = new_subject("roomy");   /* concurrency 1 */
    const char *rid = tst_uid("chk");
    http_resp *r;
    (void)state;
    for (int i = 0; i < 3; i++)
        WANT(authz_subject(NULL, s, NULL, NULL), 200,
             "sequential authz calls under concurrency 1");
    /* the limit is real: a /v1/check holds the one slot... */
    r = call("POST", "/v1/check", SERVICE,
             tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":1}",
                 s, rid));
    WANT(r, 200, "check holding the slot");
    r = authz_subject(NULL, s, NULL, NULL);
    WANT(r, 429, "authz while the slot is held");
    assert_non_null(strstr(tst_excerpt(r), "concurrency"));
    /* ...and once it is settled, authz is admitted again */
    r = call("POST", "/v1/settle", SERVICE,
             tst_fmt("{\"request_id\":\"%s\",\"weight\":1,\"status\":"
                 "\"completed\"}", rid));
    WANT(r, 200, "settle");
    WANT(authz_subject(NULL, s, NULL, NULL), 200, "after the settle");
    assert_true(NEAR(used_in(s, "concurrency"), 0));
}

/* ------------------------------------------------------------- nginx */

static char nginx_dir[512];

static void nginx_stop(void)
{
    int st;
    if (nginx_pid <= 0)
        return;
    kill(nginx_pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(nginx_pid, &st, WNOHANG) == nginx_pid) {
            nginx_pid = 0;
            return;
        }
        tst_sleep_ms(50);
    }
    kill(nginx_pid, SIGKILL);
    waitpid(nginx_pid, &st, 0);
    nginx_pid = 0;
}

static void dump_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    if (!f)
        return;
    fprintf(stderr, "---- %s\n", path);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fclose(f);
}

/* The configuration of docs/forward-auth.md, with test ports, the test
 * service key and paths of a temporary prefix around it. */
static const char *nginx_conf(int listen_port, int app_port, int qg_port)
{
    return tst_fmt(
        "daemon off;\n"
        "master_process off;\n"
        "worker_processes 1;\n"
        "pid %s/nginx.pid;\n"
        "error_log %s/error.log info;\n"
        "events { worker_connections 64; }\n"
        "http {\n"
        "  access_log %s/access.log;\n"
        "  client_body_temp_path %s/client_body;\n"
        "  proxy_temp_path %s/proxy;\n"
        "  fastcgi_temp_path %s/fastcgi;\n"
        "  uwsgi_temp_path %s/uwsgi;\n"
        "  scgi_temp_path %s/scgi;\n"
        "\n"
        "  upstream quotagate {\n"
        "    server 127.0.0.1:%d;\n"
        "    keepalive 16;\n"
        "  }\n"
        "\n"
        "  server {\n"
        "    listen 127.0.0.1:%d;\n"
        "\n"
        "    location /api/ {\n"
        "      auth_request /_qg_authz;\n"
        "      set $qg_weight 1;\n"
        "\n"
        "      auth_request_set $qg_subject          $upstream_http_x_quotagate_subject;\n"
        "      auth_request_set $qg_status           $upstream_http_x_quotagate_status;\n"
        "      auth_request_set $qg_body             $upstream_http_x_quotagate_body;\n"
        "      auth_request_set $qg_retry_after      $upstream_http_retry_after;\n"
        "      auth_request_set $qg_ratelimit        $upstream_http_ratelimit;\n"
        "      auth_request_set $qg_ratelimit_policy $upstream_http_ratelimit_policy;\n"
        "      auth_request_set $qg_should_retry     $upstream_http_x_should_retry;\n"
        "      error_page 403 = @quota_exceeded;\n"
        "\n"
        "      add_header RateLimit        $qg_ratelimit always;\n"
        "      add_header RateLimit-Policy $qg_ratelimit_policy always;\n"
        "      proxy_set_header X-Quotagate-Subject $qg_subject;\n"
        "      proxy_pass http://127.0.0.1:%d;\n"
        "    }\n"
        "\n"
        "    location = /_qg_authz {\n"
        "      internal;\n"
        "      proxy_pass http://quotagate/v1/authz?mode=nginx;\n"
        "      proxy_http_version 1.1;\n"
        "      proxy_set_header Connection \"\";\n"
        "      proxy_pass_request_body off;\n"
        "      proxy_set_header Content-Length \"\";\n"
        "      proxy_set_header X-Quotagate-Key \"%s\";\n"
        "      proxy_set_header X-Request-Id $request_id;\n"
        "      proxy_set_header X-Original-URI $request_uri;\n"
        "      proxy_set_header X-Quotagate-Subject \"\";\n"
        "      proxy_set_header X-Quotagate-Model \"\";\n"
        "      proxy_set_header X-Quotagate-Weight $qg_weight;\n"
        "      proxy_buffer_size 16k;\n"
        "      proxy_buffers 4 16k;\n"
        "    }\n"
        "\n"
        "    location @quota_exceeded {\n"
        "      default_type application/json;\n"
        "      add_header Retry-After      $qg_retry_after always;\n"
        "      add_header RateLimit        $qg_ratelimit always;\n"
        "      add_header RateLimit-Policy $qg_ratelimit_policy always;\n"
        "      add_header x-should-retry   $qg_should_retry always;\n"
        "      if ($qg_status = 429) {\n"
        "        return 429 $qg_body;\n"
        "      }\n"
        "      if ($qg_status = 400) {\n"
        "        return 400 $qg_body;\n"
        "      }\n"
        "      if ($qg_status = 503) {\n"
        "        return 503 $qg_body;\n"
        "      }\n"
        "      return 403 $qg_body;\n"
        "    }\n"
        "  }\n"
        "\n"
        "  # the application behind the gateway\n"
        "  server {\n"
        "    listen 127.0.0.1:%d;\n"
        "    location / {\n"
        "      default_type text/plain;\n"
        "      return 200 \"upstream ok\";\n"
        "    }\n"
        "  }\n"
        "}\n",
        nginx_dir, nginx_dir, nginx_dir, nginx_dir, nginx_dir, nginx_dir,
        nginx_dir, nginx_dir, qg_port, listen_port, app_port, SERVICE,
        app_port);
}

static int nginx_start(int listen_port, int app_port)
{
    const char *conf = tst_fmt("%s/nginx.conf", nginx_dir);
    const char *err = tst_fmt("%s/error.log", nginx_dir);
    int st;
    if (qgproc_write_file(conf, nginx_conf(listen_port, app_port,
                                           qgproc_port(&P))) < 0)
        fail_msg("cannot write %s", conf);
    nginx_pid = fork();
    if (nginx_pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (nginx_pid == 0) {
        int fd = open(tst_fmt("%s/stderr.log", nginx_dir),
                      O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(NGINX_BIN, "nginx", "-p", nginx_dir, "-c", conf, "-e", err,
              (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {   /* up to 10 s */
        if (waitpid(nginx_pid, &st, WNOHANG) == nginx_pid) {
            nginx_pid = 0;
            dump_file(tst_fmt("%s/stderr.log", nginx_dir));
            dump_file(err);
            return -1;
        }
        if (tst_port_open(listen_port) && tst_port_open(app_port))
            return 0;
        tst_sleep_ms(50);
    }
    return -1;
}

static void test_nginx(void **state)
{
    static httpc N;
    const char *s, *key, *other, *h[3];
    int listen_port, app_port, allowed = 0;
    http_resp *r = NULL;
    json_t *j;
    (void)state;
    if (access(NGINX_BIN, X_OK) != 0) {
        fprintf(stderr, "test_nginx: SKIPPED: %s is not installed "
                "(make test's deps install nginx-light)\n", NGINX_BIN);
        skip();
    }
    snprintf(nginx_dir, sizeof nginx_dir, "%s", qgproc_path(&P, "nginx"));
    if (mkdir(nginx_dir, 0700) < 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", nginx_dir, strerror(errno));
    listen_port = tst_free_port();
    app_port = tst_free_port();
    while (app_port == listen_port)
        app_port = tst_free_port();
    assert_true(listen_port > 0 && app_port > 0);
    if (nginx_start(listen_port, app_port) < 0)
        fail_msg("nginx did not start (see the logs above)");

    s = new_subject("small");       /* 5 points per 5 h */
    key = new_key(s);
    other = new_subject("roomy");
    httpc_init(&N, listen_port);
    own_c = &N;

    /* allowed requests reach the upstream; the rate-limit state comes
     * back; the five points run out after five requests */
    h[0] = tst_fmt("Authorization: Bearer %s", key);
    /* a client trying to charge someone else is ignored */
    h[1] = tst_fmt("X-Quotagate-Subject: %s", other);
    h[2] = NULL;
    for (int i = 0; i < 10; i++) {
        r = get_on(&N, tst_fmt("/api/hello/%d", i), h);
        if (r->status != 200)
            break;
        if (strcmp(r->body, "upstream ok") != 0)
            fail_msg("nginx allowed request %d: body \"%s\"", i,
                     tst_excerpt(r));
        hdr(r, "RateLimit", "nginx allowed");
        assert_null(http_resp_header(r, "Retry-After"));
        allowed++;
    }
    if (allowed != 5)
        fail_msg("nginx admitted %d requests of a 5-point plan; last: HTTP "
                 "%d %s", allowed, r->status, tst_excerpt(r));
    /* the refusal is a real 429 with the headers and the JSON body */
    WANT(r, 429, "nginx refusal");
    assert_true(atol(hdr(r, "Retry-After", "nginx 429")) > 0);
    assert_non_null(strstr(hdr(r, "RateLimit", "nginx 429"), "burst_5h"));
    assert_non_null(strstr(hdr(r, "RateLimit-Policy", "nginx 429"),
                           "burst_5h"));
    hdr(r, "x-should-retry", "nginx 429");
    assert_non_null(strstr(hdr(r, "Content-Type", "nginx 429"),
                           "application/json"));
    j = tst_jparse(r, "nginx 429 body");
    assert_string_equal(tst_jstr(j, "decision", "nginx 429"), "reject");
    assert_string_equal(tst_error_type(r, "nginx 429"), "quota_exceeded");
    assert_true(tst_jnum(j, "retry_after_s", "nginx 429") > 0);
    assert_null(http_resp_header(r, "X-Quotagate-Body"));
    /* charged once each, to the key's subject only */
    assert_true(NEAR(used_in(s, "burst_5h"), 5));
    assert_true(NEAR(used_in(other, "burst_5h"), 0));
    /* another refusal: still 429, nothing charged */
    r = get_on(&N, "/api/again", h);
    WANT(r, 429, "nginx second refusal");
    assert_true(NEAR(used_in(s, "burst_5h"), 5));
    /* no client key: quotagate's 401 passes nginx as a 401 */
    r = get_on(&N, "/api/anonymous", NULL);
    WANT(r, 401, "nginx without a client key");
    nginx_stop();
    if (nginx_pid != 0)
        fail_msg("nginx did not stop");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_allow, gc_teardown),
        cmocka_unit_test_teardown(test_refusal, gc_teardown),
        cmocka_unit_test_teardown(test_unknown_subject, gc_teardown),
        cmocka_unit_test_teardown(test_keys, gc_teardown),
        cmocka_unit_test_teardown(test_weight, gc_teardown),
        cmocka_unit_test_teardown(test_counted_once, gc_teardown),
        cmocka_unit_test_teardown(test_no_lease_held, gc_teardown),
        cmocka_unit_test_teardown(test_nginx, gc_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
