/* test_server.c - `quotagate serve` end to end over HTTP, against the
 * contract (PRODUCT.md sections 3-5): every endpoint, every error type,
 * each header family on allows and refusals, key scoping, malformed and
 * oversized input, slow clients, reload (admin API and SIGHUP), metrics
 * through promtool, crash recovery and clean shutdown.
 *
 * The server is $QG_BIN, started by tests/support/qgproc on a copy of
 * tests/data/server/rules.yaml in a temporary directory (the reload tests
 * rewrite that copy).  One server serves the group; tests that need their
 * own (header timeout, crash, shutdown) start one.  Every test uses its
 * own subjects and request ids, so tests do not depend on each other. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "httpc.h"
#include "srvtest.h"
#include "qgproc.h"

#define ADMIN QGPROC_ADMIN_KEY
#define QG_TEST_MAXW 48         /* list members parsed per header */
#define SERVICE QGPROC_SERVICE_KEY

static qgproc P;           /* the group's server */
static httpc C;            /* a keep-alive connection to it */

/* ------------------------------------------------------------ garbage */



/* A test's own server and connection (static: a failing test longjmps
 * out; the teardown stops and removes them). */
static qgproc *own_p;
static httpc *own_c;

static int gc_teardown(void **state)
{
    (void)state;
    if (own_c)
        httpc_close(own_c);
    own_c = NULL;
    if (own_p)
        qgproc_cleanup(own_p);
    own_p = NULL;
    tst_gc_free_all();
    return 0;
}


static char *slurp_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long n;
    if (!f)
        fail_msg("cannot read %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = tst_gc_add(GC_MEM, malloc((size_t)n + 1));
    assert_non_null(buf);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n)
        fail_msg("short read on %s", path);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static const char *td(const char *rel)
{
    const char *d = getenv("QG_TESTDATA");
    if (!d)
        fail_msg("QG_TESTDATA is not set (run through tests/run.sh)");
    return tst_fmt("%s/%s", d, rel);
}



/* ------------------------------------------------------------ requests */

static http_resp *req_on(httpc *c, const char *method, const char *path,
                         const char *auth, const char *key,
                         const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(c, method, path, auth, key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, c->err);
    return r;
}

static http_resp *req(const char *method, const char *path, const char *key,
                      const char *body)
{
    return req_on(&C, method, path, "bearer", key, body);
}









/* The error object of an error response, checked for status and type. */
#define WANT_ERR(r, st, type, what) want_error((r), (st), (type), (what), __LINE__)
static json_t *want_error(const http_resp *r, int status, const char *type,
                          const char *what, int line)
{
    json_t *j, *e;
    tst_want_status(r, status, what, line);
    j = tst_jparse(r, what);
    e = json_object_get(j, "error");
    if (!json_is_object(e))
        fail_msg("line %d: %s: no \"error\" object: %s", line, what,
                 tst_excerpt(r));
    if (type && strcmp(tst_jstr(e, "type", what), type) != 0)
        fail_msg("line %d: %s: error.type \"%s\", expected \"%s\": %s", line,
                 what, tst_jstr(e, "type", what), type, tst_excerpt(r));
    if (!*tst_jstr(e, "message", what))
        fail_msg("line %d: %s: empty error.message", line, what);
    return e;
}

/* Does any key or string value inside j equal s? */
static int json_mentions(json_t *j, const char *s)
{
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_string(j))
        return !strcmp(json_string_value(j), s);
    if (json_is_object(j)) {
        json_object_foreach(j, k, v)
            if (!strcmp(k, s) || json_mentions(v, s))
                return 1;
    }
    if (json_is_array(j))
        json_array_foreach(j, i, v)
            if (json_mentions(v, s))
                return 1;
    return 0;
}

static const char *new_subject(const char *plan, const char *org)
{
    const char *s = tst_uid("s");
    const char *body =
        org ? tst_fmt("{\"subject\":\"%s\",\"plan\":\"%s\",\"org\":\"%s\","
                  "\"billing_anchor\":\"2026-01-31T09:00:00Z\"}", s, plan, org)
            : tst_fmt("{\"subject\":\"%s\",\"plan\":\"%s\"}", s, plan);
    http_resp *r = req("POST", "/v1/admin/subjects", ADMIN, body);
    if (r->status != 200 && r->status != 201)
        fail_msg("POST /v1/admin/subjects %s: expected 200/201, got %d: %s",
                 body, r->status, tst_excerpt(r));
    return s;
}

static http_resp *check_w(const char *subject, const char *rid, double w)
{
    return req("POST", "/v1/check", SERVICE,
               tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":%g}",
                   subject, rid, w));
}

static http_resp *settle_w(const char *rid, double w, const char *status)
{
    return req("POST", "/v1/settle", SERVICE,
               tst_fmt("{\"request_id\":\"%s\",\"weight\":%g,\"status\":\"%s\"}",
                   rid, w, status));
}

static json_t *find_window(json_t *windows, const char *name)
{
    size_t i;
    json_t *w;
    json_array_foreach(windows, i, w)
        if (json_is_string(json_object_get(w, "name")) &&
            !strcmp(json_string_value(json_object_get(w, "name")), name))
            return w;
    return NULL;
}

static json_t *usage_of(const char *subject)
{
    http_resp *r = req("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    json_t *j;
    WANT(r, 200, tst_fmt("GET /v1/usage/%s", subject));
    j = tst_jparse(r, "usage");
    if (strcmp(tst_jstr(j, "subject", "usage"), subject) != 0)
        fail_msg("usage of %s names subject %s", subject,
                 tst_jstr(j, "subject", "usage"));
    if (!json_is_array(json_object_get(j, "windows")))
        fail_msg("usage of %s: no windows array: %s", subject, tst_excerpt(r));
    return j;
}

static double used_in(const char *subject, const char *window)
{
    json_t *u = usage_of(subject);
    json_t *w = find_window(json_object_get(u, "windows"), window);
    if (!w)
        fail_msg("usage of %s has no window %s", subject, window);
    return tst_jnum(w, "used", "usage window");
}

/* ------------------------------------------------- header families */

typedef struct sf_item {
    char name[128];
    int np;
    char k[8][16];
    char v[8][64];
} sf_item;

/* Parse `"name";a=1;b=2, "other";a=3` (names must be quoted strings). */
static int sf_parse(const char *s, sf_item *items, int max, const char *what)
{
    int n = 0;
    for (;;) {
        sf_item *it;
        size_t l;
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s)
            break;
        if (n == max)
            fail_msg("%s: too many list members", what);
        it = &items[n++];
        memset(it, 0, sizeof *it);
        if (*s != '"')
            fail_msg("%s: member does not start with a quoted name: %s", what,
                     s);
        s++;
        l = strcspn(s, "\"");
        if (!s[l] || l >= sizeof it->name)
            fail_msg("%s: unterminated name", what);
        memcpy(it->name, s, l);
        s += l + 1;
        while (*s == ';') {
            s++;
            while (*s == ' ')
                s++;
            l = strcspn(s, "=;, ");
            if (it->np == 8 || l == 0 || l >= 16 || s[l] != '=')
                fail_msg("%s: bad parameter at %s", what, s);
            memcpy(it->k[it->np], s, l);
            s += l + 1;
            l = strcspn(s, ";, ");
            if (l == 0 || l >= 64)
                fail_msg("%s: bad parameter value at %s", what, s);
            memcpy(it->v[it->np], s, l);
            it->np++;
            s += l;
        }
        while (*s == ' ')
            s++;
        if (*s == ',')
            s++;
        else if (*s)
            fail_msg("%s: expected ',' at %s", what, s);
    }
    return n;
}

/* Integer parameter k of it; fails unless present and an integer. */
static long long sf_int(const sf_item *it, const char *k, const char *what)
{
    for (int i = 0; i < it->np; i++)
        if (!strcmp(it->k[i], k)) {
            char *e;
            long long v = strtoll(it->v[i], &e, 10);
            if (e == it->v[i] || *e)
                fail_msg("%s: \"%s\";%s=%s is not an integer", what,
                         it->name, k, it->v[i]);
            return v;
        }
    fail_msg("%s: \"%s\" has no %s parameter", what, it->name, k);
    return 0;
}

/* Does the policy name denote window `name` of `scope`?  The name alone,
 * or qualified by the scope ("org.monthly", "org:monthly", ...). */
static int pol_matches(const char *pol, const char *name, const char *scope)
{
    size_t sl;
    if (!strcmp(pol, name))
        return 1;
    if (!scope)
        return 0;
    sl = strlen(scope);
    return !strncmp(pol, scope, sl) && pol[sl] && strchr(".:_/-", pol[sl]) &&
           !strcmp(pol + sl + 1, name);
}

typedef struct rule_win {
    const char *name;
    long long limit;
    long long w;               /* expected w= seconds, -1 unchecked */
} rule_win;

static const rule_win BASIC[] = { { "burst_5h", 50, 18000 },
                                  { "weekly", 400, -1 },
                                  { "rpm", 20, 60 },
                                  { NULL, 0, 0 } };
static const rule_win ROOMY[] = { { "burst_5h", 100000, 18000 },
                                  { "weekly", 1000000, -1 },
                                  { "rpm", 100000, 60 },
                                  { NULL, 0, 0 } };
static const rule_win ACME[] = { { "org_monthly", 1000000, -1 },
                                 { NULL, 0, 0 } };

static const char *DUR_RE =
    "^([0-9]+h)?([0-9]+m)?([0-9]+(\\.[0-9]+)?(ms|s))?$";

static void want_duration(const http_resp *r, const char *hname,
                          const char *what)
{
    const char *v = http_resp_header(r, hname);
    regex_t re;
    int ok;
    if (!v || !*v)
        fail_msg("%s: header %s missing", what, hname);
    assert_int_equal(regcomp(&re, DUR_RE, REG_EXTENDED | REG_NOSUB), 0);
    ok = regexec(&re, v, 0, NULL, 0) == 0;
    regfree(&re);
    if (!ok)
        fail_msg("%s: %s: %s is not a duration like \"6m0s\"", what, hname, v);
}

static long long hdr_int(const http_resp *r, const char *hname,
                         const char *what)
{
    const char *v = http_resp_header(r, hname);
    char *e;
    long long n;
    if (!v)
        fail_msg("%s: header %s missing", what, hname);
    n = strtoll(v, &e, 10);
    if (e == v || *e)
        fail_msg("%s: header %s: \"%s\" is not an integer", what, hname, v);
    return n;
}

static int is_requests_window(json_t *w)
{
    json_t *u = json_object_get(w, "unit"), *t = json_object_get(w, "type");
    return (json_is_string(u) && strstr(json_string_value(u), "request")) ||
           (json_is_string(t) && !strcmp(json_string_value(t), "concurrency"));
}

/* Every header family of a decision response (PRODUCT.md section 4),
 * against its body and the rules of the plan (and org). */
static void check_rate_headers(const http_resp *r, json_t *body,
                               const rule_win *plan, const rule_win *org,
                               const char *what)
{
    json_t *windows = json_object_get(body, "windows"), *w;
    const char *pol = http_resp_header(r, "RateLimit-Policy");
    const char *rl = http_resp_header(r, "RateLimit");
    sf_item P_[QG_TEST_MAXW], R_[QG_TEST_MAXW];
    int np, nr, found;
    size_t i;

    if (!json_is_array(windows) || json_array_size(windows) == 0)
        fail_msg("%s: no windows in the body: %s", what, tst_excerpt(r));
    if (!pol)
        fail_msg("%s: RateLimit-Policy missing", what);
    if (!rl)
        fail_msg("%s: RateLimit missing", what);
    np = sf_parse(pol, P_, QG_TEST_MAXW, tst_fmt("%s: RateLimit-Policy", what));
    nr = sf_parse(rl, R_, QG_TEST_MAXW, tst_fmt("%s: RateLimit", what));

    /* policy names are unique: RateLimit refers to them by name */
    for (int a = 0; a < np; a++)
        for (int b = a + 1; b < np; b++)
            if (!strcmp(P_[a].name, P_[b].name))
                fail_msg("%s: RateLimit-Policy names \"%s\" twice (windows "
                         "of the same name in member and org scope must be "
                         "told apart): %s", what, P_[a].name, pol);
    /* one named policy per window of the body, q = its limit */
    if ((size_t)np != json_array_size(windows))
        fail_msg("%s: %d policies in RateLimit-Policy \"%s\" for %zu windows "
                 "in the body", what, np, pol, json_array_size(windows));
    json_array_foreach(windows, i, w) {
        const char *name = tst_jstr(w, "name", what);
        json_t *sc = json_object_get(w, "scope");
        const char *scope = json_is_string(sc) ? json_string_value(sc) : NULL;
        double limit = tst_jnum(w, "limit", what),
               remaining = tst_jnum(w, "remaining", what);
        int pi = -1, ri = -1;
        for (const char *k = "scope\0type\0unit\0used\0reset_at\0"; *k;
             k += strlen(k) + 1)
            if (!json_object_get(w, k))
                fail_msg("%s: window %s has no \"%s\"", what, name, k);
        for (int k = 0; k < np && pi < 0; k++) /* scope-qualified first */
            if (strcmp(P_[k].name, name) && pol_matches(P_[k].name, name, scope))
                pi = k;
        for (int k = 0; k < np && pi < 0; k++)
            if (!strcmp(P_[k].name, name))
                pi = k;
        if (pi < 0)
            fail_msg("%s: window %s has no policy in RateLimit-Policy: %s",
                     what, name, pol);
        if (sf_int(&P_[pi], "q", what) != llround(limit))
            fail_msg("%s: policy %s q=%lld, window limit %g", what, name,
                     sf_int(&P_[pi], "q", what), limit);
        /* w (seconds) for windows of time; a concurrency limit has none */
        if (strcmp(tst_jstr(w, "type", what), "concurrency") != 0)
            sf_int(&P_[pi], "w", what);
        for (int k = 0; k < nr; k++)
            if (!strcmp(R_[k].name, P_[pi].name))
                ri = k;
        if (ri < 0)
            fail_msg("%s: policy %s missing from RateLimit: %s", what,
                     P_[pi].name, rl);
        if (sf_int(&R_[ri], "r", what) != (long long)floor(remaining + 1e-9))
            fail_msg("%s: RateLimit %s r=%lld, window remaining %g", what,
                     name, sf_int(&R_[ri], "r", what), remaining);
        if (sf_int(&R_[ri], "t", what) < 0)
            fail_msg("%s: RateLimit %s t < 0", what, name);
    }
    if (nr != np)
        fail_msg("%s: RateLimit has %d members, RateLimit-Policy %d", what,
                 nr, np);

    /* against the rules: every window present with its limit (and w) */
    for (int pass = 0; pass < 2; pass++) {
        const rule_win *rw = pass ? org : plan;
        for (; rw && rw->name; rw++) {
            int pi = -1;
            /* an org's window is "org.NAME" in the body too */
            json_t *bw = find_window(windows, pass ? tst_fmt("org.%s",
                                                             rw->name)
                                                   : rw->name);
            if (!bw)
                fail_msg("%s: rules window %s missing from the body", what,
                         rw->name);
            if (llround(tst_jnum(bw, "limit", what)) != rw->limit)
                fail_msg("%s: window %s limit %g, rules say %lld", what,
                         rw->name, tst_jnum(bw, "limit", what), rw->limit);
            for (int k = 0; k < np; k++) {
                json_t *sc = json_object_get(bw, "scope");
                if (pol_matches(P_[k].name, rw->name,
                                json_is_string(sc) ? json_string_value(sc)
                                                   : NULL))
                    pi = k;
            }
            if (pi < 0)
                fail_msg("%s: rules window %s has no policy: %s", what,
                         rw->name, pol);
            if (sf_int(&P_[pi], "q", what) != rw->limit)
                fail_msg("%s: policy %s q=%lld, rules limit %lld", what,
                         rw->name, sf_int(&P_[pi], "q", what), rw->limit);
            if (rw->w >= 0 && sf_int(&P_[pi], "w", what) != rw->w)
                fail_msg("%s: policy %s w=%lld, rules say %lld s", what,
                         rw->name, sf_int(&P_[pi], "w", what), rw->w);
        }
    }

    /* OpenAI-style families: -requests from a requests window, -tokens
     * from a weight window, limit and remaining of the same window */
    {
        long long lr = hdr_int(r, "x-ratelimit-limit-requests", what),
                  rr = hdr_int(r, "x-ratelimit-remaining-requests", what),
                  lt = hdr_int(r, "x-ratelimit-limit-tokens", what),
                  rt = hdr_int(r, "x-ratelimit-remaining-tokens", what);
        want_duration(r, "x-ratelimit-reset-requests", what);
        want_duration(r, "x-ratelimit-reset-tokens", what);
        found = 0;
        json_array_foreach(windows, i, w)
            if (is_requests_window(w) &&
                llround(tst_jnum(w, "limit", what)) == lr &&
                (long long)floor(tst_jnum(w, "remaining", what) + 1e-9) == rr)
                found = 1;
        if (!found)
            fail_msg("%s: x-ratelimit-limit-requests %lld / remaining %lld "
                     "match no requests window: %s", what, lr, rr,
                     tst_excerpt(r));
        found = 0;
        json_array_foreach(windows, i, w)
            if (!is_requests_window(w) &&
                llround(tst_jnum(w, "limit", what)) == lt &&
                (long long)floor(tst_jnum(w, "remaining", what) + 1e-9) == rt)
                found = 1;
        if (!found)
            fail_msg("%s: x-ratelimit-limit-tokens %lld / remaining %lld "
                     "match no weight window: %s", what, lt, rt, tst_excerpt(r));
    }
}

/* Retry-After family of a retryable 429. */
static void check_retry_headers(const http_resp *r, json_t *body,
                                const char *what)
{
    double ra = tst_jnum(body, "retry_after_s", what);
    long long h = hdr_int(r, "Retry-After", what);
    long long ms = hdr_int(r, "retry-after-ms", what);
    const char *sr = http_resp_header(r, "x-should-retry");
    if (ra <= 0)
        fail_msg("%s: retry_after_s %g <= 0", what, ra);
    if (h != (long long)ceil(ra - 1e-9))
        fail_msg("%s: Retry-After %lld, expected ceil(retry_after_s %g) = %lld",
                 what, h, ra, (long long)ceil(ra - 1e-9));
    if (llabs(ms - llround(ra * 1000)) > 1)
        fail_msg("%s: retry-after-ms %lld, retry_after_s %g", what, ms, ra);
    if (!sr)
        fail_msg("%s: x-should-retry missing", what);
    if (strcmp(sr, ra <= 60 ? "true" : "false") != 0)
        fail_msg("%s: x-should-retry %s with retry_after_s %g", what, sr, ra);
}

/* ----------------------------------------------------------- fixtures */

static int group_setup(void **state)
{
    const char *src = getenv("QG_TESTDATA");
    char path[1024];
    (void)state;
    httpc_init(&C, 0);
    signal(SIGPIPE, SIG_IGN);
    if (!src) {
        fprintf(stderr, "QG_TESTDATA is not set (run through tests/run.sh)\n");
        return -1;
    }
    if (qgproc_init(&P) < 0) {
        fprintf(stderr, "qgproc_init: %s\n", P.why);
        return -1;
    }
    snprintf(path, sizeof path, "%s/server/rules.yaml", src);
    if (qgproc_copy_file(path, qgproc_path(&P, "rules.yaml")) < 0) {
        fprintf(stderr, "cannot copy %s\n", path);
        qgproc_cleanup(&P);
        return -1;
    }
    if (qgproc_start(&P, qgproc_path(&P, "rules.yaml"), NULL, NULL) < 0) {
        qgproc_cleanup(&P);
        return -1;
    }
    httpc_init(&C, qgproc_port(&P));
    return 0;
}

static int group_teardown(void **state)
{
    int rc = 0;
    (void)state;
    httpc_close(&C);
    if (P.pid > 0) {
        int st = qgproc_stop(&P, 20000);
        if (st != 0) {
            fprintf(stderr, "group server: SIGTERM gave %d (%s)\n", st, P.why);
            qgproc_dump_stderr(&P);
            rc = -1;
        }
    }
    qgproc_cleanup(&P);
    return rc;
}

/* A second server of the test's own, on a copy of the test rules. */
static void own_server(qgproc *p, const char *const *args)
{
    char w[512];
    own_p = p;
    if (qgproc_init(p) < 0)
        fail_msg("qgproc_init: %s", p->why);
    if (qgproc_copy_file(td("server/rules.yaml"),
                         qgproc_path(p, "rules.yaml")) < 0) {
        qgproc_cleanup(p);
        fail_msg("cannot copy the rules");
    }
    if (qgproc_start(p, qgproc_path(p, "rules.yaml"), args, NULL) < 0) {
        snprintf(w, sizeof w, "%s", p->why);
        qgproc_cleanup(p);
        fail_msg("serve did not start: %s", w);
    }
}

/* ============================================================== tests */

static void test_healthz(void **state)
{
    http_resp *r;
    json_t *j;
    (void)state;
    r = req("GET", "/healthz", NULL, NULL);
    WANT(r, 200, "GET /healthz");
    j = tst_jparse(r, "healthz");
    assert_string_equal(tst_jstr(j, "status", "healthz"), "ok");
    assert_string_equal(tst_jstr(j, "store", "healthz"), "memory");
    if (!http_resp_header(r, "Content-Type") ||
        !strstr(http_resp_header(r, "Content-Type"), "application/json"))
        fail_msg("healthz Content-Type %s",
                 http_resp_header(r, "Content-Type"));
}

static void test_plans_and_weights(void **state)
{
    http_resp *r;
    json_t *j;
    (void)state;
    r = req("GET", "/v1/plans", NULL, NULL);
    WANT(r, 200, "GET /v1/plans without a key");
    j = tst_jparse(r, "plans");
    for (const char *s = "basic\0roomy\0burst_5h\0weekly\0rpm\0srv-1\0"; *s;
         s += strlen(s) + 1)
        if (!json_mentions(j, s))
            fail_msg("GET /v1/plans does not mention %s: %s", s, tst_excerpt(r));
    r = req("GET", "/v1/weights", NULL, NULL);
    WANT(r, 200, "GET /v1/weights without a key");
    j = tst_jparse(r, "weights");
    for (const char *s = "w1\0light\0standard\0"; *s; s += strlen(s) + 1)
        if (!json_mentions(j, s))
            fail_msg("GET /v1/weights does not mention %s: %s", s,
                     tst_excerpt(r));
}

/* /v1/plans: each plan's statements carry analyze's effective multiplier
 * (the oracle: `quotagate analyze --json` on the same rules). */
static void test_plans_statements(void **state)
{
    const char *argv[] = {"analyze", "-c", qgproc_path(&P, "rules.yaml"),
                          "--json", NULL};
    char *out = NULL;
    json_t *j, *an, *p, *st;
    size_t i, k;
    (void)state;
    assert_int_equal(qg_run_cli(argv, 60000, &out, NULL), 0);
    an = tst_jparse_text(out, strlen(out), "analyze");   /* freed at teardown */
    free(out);
    j = tst_jparse(req("GET", "/v1/plans", NULL, NULL), "plans");
    assert_string_equal(tst_jstr(j, "baseline", "plans"),
                        tst_jstr(an, "baseline", "analyze"));
    json_array_foreach(json_object_get(j, "plans"), i, p) {
        const char *name = tst_jstr(p, "name", "plan");
        json_t *ap = NULL, *x, *eff = NULL;
        json_array_foreach(json_object_get(an, "plans"), k, x)
            if (!strcmp(tst_jstr(x, "plan", "analyze"), name))
                ap = x;
        assert_non_null(ap);
        json_array_foreach(json_object_get(p, "statements"), k, st)
            if (!strcmp(tst_jstr(st, "kind", "statement"), "effective"))
                eff = st;
        /* the baseline states no multiplier of itself (pricing's words) */
        if (strcmp(name, tst_jstr(an, "baseline", "analyze")) == 0)
            continue;
        if (!eff)
            fail_msg("plan %s: no effective statement: %s", name, tst_dump(p));
        if (!NEAR(tst_jnum(eff, "multiplier", "statement"),
                  tst_jnum(ap, "effective_multiplier", "analyze")))
            fail_msg("plan %s: statement %s, analyze %s", name, tst_dump(eff),
                     tst_dump(ap));
        if (strcmp(tst_jstr(eff, "vs", "statement"),
                   tst_jstr(an, "baseline", "analyze")) != 0)
            fail_msg("plan %s: the statement is not against the baseline "
                     "%s: %s", name, tst_jstr(an, "baseline", "analyze"),
                     tst_dump(eff));
    }
}

/* GET /console and its files; GET /v1/whoami; GET /v1/orgs/{org}/usage. */
static void test_console_routes(void **state)
{
    const char *a = new_subject("roomy", "acme"), *b = new_subject("basic", "acme");
    const char *loner = new_subject("basic", NULL);
    http_resp *r;
    json_t *j, *m, *w, *org_w = NULL;
    const char *etag, *key, *asset;
    size_t i, k, found = 0;
    (void)state;

    r = req("GET", "/console", NULL, NULL);
    WANT(r, 200, "GET /console");
    assert_non_null(strstr(http_resp_header(r, "content-type"), "text/html"));
    assert_string_equal(http_resp_header(r, "cache-control"), "no-cache");
    assert_non_null(strstr(http_resp_header(r, "content-security-policy"),
                           "script-src 'self'"));
    assert_null(strstr(http_resp_header(r, "content-security-policy"),
                       "unsafe-inline"));
    assert_non_null(strstr(r->body, "name=\"key\""));
    etag = tst_fmt("%s", http_resp_header(r, "etag"));
    assert_true(strlen(etag) > 2);
    asset = strstr(r->body, "/console/app-");
    assert_non_null(asset);
    asset = tst_fmt("%.*s", (int)strcspn(asset, "\""), asset);
    {
        const char *h[] = {tst_fmt("If-None-Match: %s", etag), NULL};
        r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
        if (httpc_request(&C, "GET", "/console", h, NULL, 0, r) < 0)
            fail_msg("GET /console again: %s", C.err);
        if (r->status != 304 || r->body_len != 0)
            fail_msg("If-None-Match %s: %d with %zu bytes", etag, r->status,
                     r->body_len);
    }
    WANT(req("GET", "/console/", NULL, NULL), 200, "GET /console/");
    r = req("GET", asset, NULL, NULL);
    WANT(r, 200, asset);
    assert_non_null(strstr(http_resp_header(r, "content-type"), "text/javascript"));
    assert_non_null(strstr(http_resp_header(r, "cache-control"), "immutable"));
    WANT_ERR(req("GET", "/console/nothing.js", NULL, NULL), 404, "not_found",
             "an unknown console file");

    /* whoami: the admin, a subject, nobody else */
    j = tst_jparse(req("GET", "/v1/whoami", ADMIN, NULL), "whoami admin");
    assert_string_equal(tst_jstr(j, "role", "whoami"), "admin");
    assert_null(json_object_get(j, "subject"));
    r = req("POST", "/v1/admin/keys", ADMIN, tst_fmt("{\"subject\":\"%s\"}", a));
    key = tst_jstr(tst_jparse(r, "keys"), "key", "keys");
    j = tst_jparse(req("GET", "/v1/whoami", key, NULL), "whoami subject");
    assert_string_equal(tst_jstr(j, "role", "whoami"), "subject");
    assert_string_equal(tst_jstr(j, "subject", "whoami"), a);
    WANT_ERR(req("GET", "/v1/whoami", SERVICE, NULL), 403, "forbidden",
             "whoami with the service key");
    WANT_ERR(req("GET", "/v1/whoami", NULL, NULL), 401, "unauthorized",
             "whoami without a key");

    /* the org: both members with their own windows, the org's windows as
     * each member's usage shows them */
    WANT(check_w(a, tst_uid("r"), 3), 200, "check a");
    WANT(check_w(b, tst_uid("r"), 4.5), 200, "check b");
    r = req("GET", "/v1/orgs/acme/usage", ADMIN, NULL);
    WANT(r, 200, "GET /v1/orgs/acme/usage");
    j = tst_jparse(r, "org");
    assert_string_equal(tst_jstr(j, "org", "org"), "acme");
    assert_false(tst_jbool(j, "truncated", "org"));
    assert_int_equal((size_t)tst_jnum(j, "members_total", "org"),
                     json_array_size(json_object_get(j, "members")));
    json_array_foreach(json_object_get(j, "windows"), i, w) {
        assert_string_equal(tst_jstr(w, "scope", "org window"), "org");
        if (!strcmp(tst_jstr(w, "name", "org window"), "org.org_monthly"))
            org_w = w;
    }
    assert_non_null(org_w);
    {
        json_t *ua = find_window(json_object_get(usage_of(a), "windows"),
                                 "org.org_monthly");
        assert_non_null(ua);
        assert_true(NEAR(tst_jnum(org_w, "used", "org"),
                         tst_jnum(ua, "used", "a's view")));
    }
    const char *prev = "";
    json_array_foreach(json_object_get(j, "members"), i, m) {
        const char *name = tst_jstr(m, "subject", "member");
        double want = !strcmp(name, a) ? 3 : !strcmp(name, b) ? 4.5 : -1;
        if (strcmp(prev, name) >= 0)
            fail_msg("members not sorted: %s after %s", name, prev);
        prev = name;
        if (!strcmp(name, loner))
            fail_msg("%s is not in acme: %s", loner, tst_excerpt(r));
        json_array_foreach(json_object_get(m, "windows"), k, w)
            assert_string_equal(tst_jstr(w, "scope", "member window"), "member");
        if (want < 0)
            continue;
        found++;
        w = find_window(json_object_get(m, "windows"), "burst_5h");
        assert_non_null(w);
        assert_true(NEAR(tst_jnum(w, "used", "member"), want));
    }
    assert_int_equal(found, 2);
    WANT_ERR(req("GET", "/v1/orgs/nowhere/usage", ADMIN, NULL), 404,
             "unknown_org", "an unknown org");
    WANT_ERR(req("GET", "/v1/orgs/acme/usage", key, NULL), 403, "forbidden",
             "a subject key reading an org");
    WANT_ERR(req("GET", "/v1/orgs/acme", ADMIN, NULL), 404, "not_found",
             "/v1/orgs/acme");
    WANT_ERR(req("GET", "/v1/orgs/acme/usage/x", ADMIN, NULL), 404,
             "not_found", "/v1/orgs/acme/usage/x");
}

static void test_check_allow_weight(void **state)
{
    const char *s = new_subject("roomy", "acme"), *rid = tst_uid("r");
    http_resp *r;
    json_t *j, *bw;
    (void)state;
    r = check_w(s, rid, 2);
    WANT(r, 200, "check weight 2 (roomy)");
    j = tst_jparse(r, "check");
    assert_string_equal(tst_jstr(j, "decision", "check"), "allow");
    assert_string_equal(tst_jstr(j, "request_id", "check"), rid);
    assert_true(NEAR(tst_jnum(j, "weight", "check"), 2));
    if (json_object_get(j, "replayed") && tst_jbool(j, "replayed", "check"))
        fail_msg("first check says replayed: %s", tst_excerpt(r));
    bw = find_window(json_object_get(j, "windows"), "burst_5h");
    assert_non_null(bw);
    assert_true(NEAR(tst_jnum(bw, "used", "burst_5h"), 2));
    assert_true(NEAR(tst_jnum(bw, "remaining", "burst_5h"), 99998));
    assert_string_equal(tst_jstr(find_window(json_object_get(j, "windows"),
                                         "org.org_monthly"), "scope", "org"),
                        "org");
    assert_string_equal(tst_jstr(bw, "type", "burst_5h"), "rolling");
    check_rate_headers(r, j, ROOMY, ACME, "allow (roomy+acme)");
    if (http_resp_header(r, "Retry-After"))
        fail_msg("an allow carries Retry-After: %s",
                 http_resp_header(r, "Retry-After"));
    {   /* RateLimit t of a rolling window just charged: about its length */
        sf_item it[QG_TEST_MAXW];
        int n = sf_parse(http_resp_header(r, "RateLimit"), it, QG_TEST_MAXW,
                         "RateLimit");
        for (int k = 0; k < n; k++)
            if (strstr(it[k].name, "burst_5h")) {
                long long t = sf_int(&it[k], "t", "RateLimit");
                if (t < 17900 || t > 18000)
                    fail_msg("RateLimit burst_5h t=%lld after a charge now "
                             "(expected about 18000)", t);
            }
    }
    /* x-api-key works as well as Bearer */
    r = req_on(&C, "POST", "/v1/check", "x-api-key", SERVICE,
               tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":1}",
                   s, tst_uid("r")));
    WANT(r, 200, "check with x-api-key");
    assert_true(NEAR(used_in(s, "burst_5h"), 3));
}

static void test_check_allow_model(void **state)
{
    const char *s = new_subject("roomy", NULL), *rid = tst_uid("r");
    http_resp *r;
    json_t *j;
    (void)state;
    /* standard: 1 + 1000/1000*1 + 200/1000*5 = 3 */
    r = req("POST", "/v1/check", SERVICE,
            tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                "\"standard\",\"input_tokens\":1000,\"max_output_tokens\":200}",
                s, rid));
    WANT(r, 200, "model check");
    j = tst_jparse(r, "model check");
    assert_string_equal(tst_jstr(j, "decision", "model check"), "allow");
    if (!NEAR(tst_jnum(j, "weight", "model check"), 3))
        fail_msg("standard 1000 in / 200 out weighs 3, got %g",
                 tst_jnum(j, "weight", "model check"));
    check_rate_headers(r, j, ROOMY, NULL, "model allow");
    assert_true(NEAR(used_in(s, "weekly"), 3));
    /* light: 1 + 2000/1000*0.25 + 1000/1000*1 = 2.5 */
    r = req("POST", "/v1/check", SERVICE,
            tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                "\"light\",\"input_tokens\":2000,\"max_output_tokens\":1000}",
                s, tst_uid("r")));
    WANT(r, 200, "light check");
    if (!NEAR(tst_jnum(tst_jparse(r, "light"), "weight", "light"), 2.5))
        fail_msg("light 2000 in / 1000 out weighs 2.5: %s", tst_excerpt(r));
    r = req("POST", "/v1/check", SERVICE,
            tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                "\"gpt-nope\",\"input_tokens\":10,\"max_output_tokens\":10}",
                s, tst_uid("r")));
    WANT_ERR(r, 400, "unknown_model", "check with an unknown model");
    assert_true(NEAR(used_in(s, "weekly"), 5.5));
}

static void test_check_replay(void **state)
{
    const char *s = new_subject("roomy", NULL), *rid = tst_uid("r");
    http_resp *r;
    json_t *j;
    (void)state;
    WANT(check_w(s, rid, 4), 200, "first check");
    r = check_w(s, rid, 4);
    WANT(r, 200, "repeated request_id");
    j = tst_jparse(r, "replay");
    assert_string_equal(tst_jstr(j, "decision", "replay"), "allow");
    if (!tst_jbool(j, "replayed", "replay"))
        fail_msg("repeated request_id not replayed: %s", tst_excerpt(r));
    assert_string_equal(tst_jstr(j, "request_id", "replay"), rid);
    assert_true(NEAR(used_in(s, "burst_5h"), 4));
    /* a repeat with another weight still answers the original */
    r = check_w(s, rid, 9);
    WANT(r, 200, "repeated request_id, other weight");
    assert_true(tst_jbool(tst_jparse(r, "replay"), "replayed", "replay"));
    assert_true(NEAR(used_in(s, "burst_5h"), 4));
}

static void test_reject_rate_retryable(void **state)
{
    const char *s = new_subject("basic", NULL);
    http_resp *r = NULL;
    json_t *j, *e;
    int admitted = 0;
    long long ms;
    (void)state;
    for (int i = 0; i < 30; i++) {
        r = check_w(s, tst_uid("r"), 1);
        if (r->status != 200)
            break;
        check_rate_headers(r, tst_jparse(r, "allow"), BASIC, NULL,
                           tst_fmt("allow #%d (basic)", i + 1));
        admitted++;
    }
    e = WANT_ERR(r, 429, "quota_exceeded", "check past rpm");
    j = tst_jparse(r, "reject");
    assert_string_equal(tst_jstr(j, "decision", "reject"), "reject");
    if (strcmp(tst_jstr(e, "window", "reject"), "rpm") != 0)
        fail_msg("refusal after %d requests names window %s, expected rpm",
                 admitted, tst_jstr(e, "window", "reject"));
    if (admitted < 1 || admitted > 20)
        fail_msg("%d requests admitted by a 20/min rate", admitted);
    if (!json_is_array(json_object_get(j, "recovers")) ||
        json_array_size(json_object_get(j, "recovers")) == 0)
        fail_msg("refusal without recovers: %s", tst_excerpt(r));
    if (!json_mentions(json_object_get(j, "recovers"), "rpm"))
        fail_msg("recovers does not mention rpm: %s", tst_excerpt(r));
    check_retry_headers(r, j, "rpm refusal");
    if (tst_jnum(j, "retry_after_s", "rpm") > 60)
        fail_msg("rpm retry_after_s %g > 60", tst_jnum(j, "retry_after_s", "r"));
    check_rate_headers(r, j, BASIC, NULL, "rpm refusal");
    if (json_object_get(j, "retryable") && !tst_jbool(j, "retryable", "rpm"))
        fail_msg("a retryable refusal says retryable false");
    /* nothing was charged by the refusal */
    assert_true(NEAR(used_in(s, "burst_5h"), admitted));
    /* a retry at retry_after succeeds (PRODUCT.md section 3) */
    ms = hdr_int(r, "retry-after-ms", "rpm");
    tst_sleep_ms((int)ms + 20);
    r = check_w(s, tst_uid("r"), 1);
    WANT(r, 200, tst_fmt("retry %lld ms after an rpm refusal", ms));
}

static void test_reject_burst_long(void **state)
{
    const char *s = new_subject("basic", NULL);
    http_resp *r;
    json_t *j, *e, *bw;
    double ra;
    (void)state;
    WANT(check_w(s, tst_uid("r"), 50), 200, "check 50 of a 50 burst");
    r = check_w(s, tst_uid("r"), 1);
    e = WANT_ERR(r, 429, "quota_exceeded", "check past burst_5h");
    j = tst_jparse(r, "reject");
    assert_string_equal(tst_jstr(e, "window", "reject"), "burst_5h");
    ra = tst_jnum(j, "retry_after_s", "reject");
    if (ra < 17900 || ra > 18000)
        fail_msg("burst_5h refusal retry_after_s %g, expected about 18000",
                 ra);
    check_retry_headers(r, j, "burst refusal");
    check_rate_headers(r, j, BASIC, NULL, "burst refusal");
    bw = find_window(json_object_get(j, "windows"), "burst_5h");
    assert_true(NEAR(tst_jnum(bw, "used", "burst"), 50));
    assert_true(NEAR(tst_jnum(bw, "remaining", "burst"), 0));
    if (!json_mentions(json_object_get(j, "recovers"), "burst_5h"))
        fail_msg("recovers does not mention burst_5h: %s", tst_excerpt(r));
    assert_true(NEAR(used_in(s, "burst_5h"), 50));
}

static void test_reject_never(void **state)
{
    const char *s = new_subject("basic", NULL);
    http_resp *r;
    json_t *j;
    const char *sr;
    (void)state;
    r = check_w(s, tst_uid("r"), 51);
    WANT_ERR(r, 429, "request_too_large_for_plan", "weight 51 > limit 50");
    j = tst_jparse(r, "never");
    if (tst_jbool(j, "retryable", "never"))
        fail_msg("too large for the plan but retryable: %s", tst_excerpt(r));
    if (http_resp_header(r, "Retry-After"))
        fail_msg("not-retryable refusal carries Retry-After: %s",
                 http_resp_header(r, "Retry-After"));
    sr = http_resp_header(r, "x-should-retry");
    if (!sr || strcmp(sr, "false") != 0)
        fail_msg("not-retryable refusal: x-should-retry %s",
                 sr ? sr : "(missing)");
    check_rate_headers(r, j, BASIC, NULL, "not-retryable refusal");
    assert_true(NEAR(used_in(s, "burst_5h"), 0));
}

static void test_settle(void **state)
{
    const char *s = new_subject("roomy", NULL);
    const char *a = tst_uid("r"), *b = tst_uid("r"), *c = tst_uid("r"), *d = tst_uid("r");
    http_resp *r;
    json_t *j;
    (void)state;
    WANT(check_w(s, a, 5), 200, "check 5");
    r = settle_w(a, 3, "completed");
    WANT(r, 200, "settle 3 of 5");
    j = tst_jparse(r, "settle");
    assert_string_equal(tst_jstr(j, "request_id", "settle"), a);
    assert_string_equal(tst_jstr(j, "status", "settle"), "completed");
    if (!NEAR(tst_jnum(j, "reserved", "settle"), 5) ||
        !NEAR(tst_jnum(j, "actual", "settle"), 3) ||
        !NEAR(tst_jnum(j, "charged", "settle"), 3))
        fail_msg("settle 3 of 5: %s", tst_excerpt(r));
    assert_false(tst_jbool(j, "late", "settle"));
    assert_false(tst_jbool(j, "replayed", "settle"));
    assert_true(NEAR(used_in(s, "burst_5h"), 3));
    /* settling again: the original result, nothing charged */
    r = settle_w(a, 4, "completed");
    WANT(r, 200, "settle again");
    j = tst_jparse(r, "settle again");
    if (!tst_jbool(j, "replayed", "settle again"))
        fail_msg("second settle not replayed: %s", tst_excerpt(r));
    assert_true(NEAR(tst_jnum(j, "charged", "settle again"), 3));
    assert_true(NEAR(used_in(s, "burst_5h"), 3));
    /* model: reserve 3 (1000 in, 200 out), completed with 100 out = 2.5 */
    WANT(req("POST", "/v1/check", SERVICE,
             tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":"
                 "\"standard\",\"input_tokens\":1000,\"max_output_tokens\":200}",
                 s, b)), 200, "model check");
    r = req("POST", "/v1/settle", SERVICE,
            tst_fmt("{\"request_id\":\"%s\",\"input_tokens\":1000,"
                "\"output_tokens\":100,\"status\":\"completed\"}", b));
    WANT(r, 200, "model settle");
    j = tst_jparse(r, "model settle");
    if (!NEAR(tst_jnum(j, "reserved", "ms"), 3) ||
        !NEAR(tst_jnum(j, "actual", "ms"), 2.5) ||
        !NEAR(tst_jnum(j, "charged", "ms"), 2.5))
        fail_msg("model settle 1000 in / 100 out: %s", tst_excerpt(r));
    assert_true(NEAR(used_in(s, "burst_5h"), 5.5));
    /* cancelled with partial usage counts what was produced */
    WANT(check_w(s, c, 4), 200, "check 4");
    r = settle_w(c, 1, "cancelled");
    WANT(r, 200, "cancelled settle");
    j = tst_jparse(r, "cancelled");
    assert_string_equal(tst_jstr(j, "status", "cancelled"), "cancelled");
    assert_true(NEAR(tst_jnum(j, "charged", "cancelled"), 1));
    assert_true(NEAR(used_in(s, "burst_5h"), 6.5));
    WANT(check_w(s, d, 2), 200, "check 2");
    r = settle_w(d, 2, "failed");
    WANT(r, 200, "failed settle");
    assert_string_equal(tst_jstr(tst_jparse(r, "failed"), "status", "failed"),
                        "failed");
    /* errors */
    WANT_ERR(settle_w(tst_uid("never-checked"), 1, "completed"), 404,
             "unknown_request", "settle of an unknown request id");
    WANT_ERR(settle_w(a, 1, "done"), 400, "invalid_request",
             "settle with status \"done\"");
    WANT_ERR(req("POST", "/v1/settle", SERVICE,
                 "{\"weight\":1,\"status\":\"completed\"}"), 400,
             "invalid_request", "settle without request_id");
    WANT_ERR(req("POST", "/v1/settle", SERVICE,
                 tst_fmt("{\"request_id\":\"%s\",\"weight\":\"x\","
                     "\"status\":\"completed\"}", tst_uid("r"))), 400,
             "invalid_request", "settle with a string weight");
}

static void test_usage_and_keys(void **state)
{
    const char *s = new_subject("basic", NULL), *t = new_subject("roomy", NULL);
    http_resp *r;
    json_t *j;
    const char *key, *kid;
    (void)state;
    WANT(check_w(s, tst_uid("r"), 7), 200, "check 7");
    /* admin reads anyone's */
    j = usage_of(s);
    assert_string_equal(tst_jstr(j, "plan", "usage"), "basic");
    {
        json_t *bw = find_window(json_object_get(j, "windows"), "burst_5h");
        assert_non_null(bw);
        assert_true(NEAR(tst_jnum(bw, "used", "u"), 7));
        assert_true(NEAR(tst_jnum(bw, "limit", "u"), 50));
        assert_true(NEAR(tst_jnum(bw, "remaining", "u"), 43));
        assert_non_null(json_object_get(bw, "reset_at"));
    }
    WANT_ERR(req("GET", tst_fmt("/v1/usage/%s", tst_uid("nobody")), ADMIN, NULL), 404,
             "unknown_subject", "usage of an unknown subject");
    /* a subject key */
    r = req("POST", "/v1/admin/keys", ADMIN, tst_fmt("{\"subject\":\"%s\"}", s));
    if (r->status != 200 && r->status != 201)
        fail_msg("POST /v1/admin/keys: %d %s", r->status, tst_excerpt(r));
    j = tst_jparse(r, "keys");
    key = tst_jstr(j, "key", "keys");
    kid = tst_jstr(j, "id", "keys");
    if (strlen(key) < 16)
        fail_msg("a new key of %zu characters", strlen(key));
    if (!*kid)
        fail_msg("empty key id");
    r = req("GET", "/v1/usage", key, NULL);
    WANT(r, 200, "GET /v1/usage with the subject's key");
    j = tst_jparse(r, "own usage");
    assert_string_equal(tst_jstr(j, "subject", "own"), s);
    assert_string_equal(tst_jstr(j, "plan", "own"), "basic");
    assert_true(NEAR(tst_jnum(find_window(json_object_get(j, "windows"),
                                      "burst_5h"), "used", "own"), 7));
    r = req_on(&C, "GET", "/v1/usage", "x-api-key", key, NULL);
    WANT(r, 200, "GET /v1/usage with x-api-key");
    /* not another's */
    WANT_ERR(req("GET", tst_fmt("/v1/usage/%s", t), key, NULL), 403, "forbidden",
             "subject key reading another subject's usage");
    /* a subject key is neither the service key nor the admin key */
    r = req("POST", "/v1/check", key,
            tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":1}", s,
                tst_uid("r")));
    if (r->status != 401 && r->status != 403)
        fail_msg("subject key on /v1/check: %d, expected 401/403",
                 r->status);
    r = req("POST", "/v1/admin/subjects", key,
            tst_fmt("{\"subject\":\"%s\",\"plan\":\"roomy\"}", s));
    if (r->status != 401 && r->status != 403)
        fail_msg("subject key on /v1/admin/subjects: %d, expected 401/403",
                 r->status);
    /* GET /v1/usage needs a subject key */
    r = req("GET", "/v1/usage", ADMIN, NULL);
    if (r->status != 400 && r->status != 401 && r->status != 403)
        fail_msg("GET /v1/usage with the admin key (no subject): %d",
                 r->status);
    /* keys for unknown subjects are refused */
    WANT_ERR(req("POST", "/v1/admin/keys", ADMIN,
                 tst_fmt("{\"subject\":\"%s\"}", tst_uid("nobody"))), 404,
             "unknown_subject", "key for an unknown subject");
    WANT_ERR(req("POST", "/v1/admin/keys", ADMIN, "{}"), 400,
             "invalid_request", "key without subject");
}

static void test_admin_subjects(void **state)
{
    const char *s = tst_uid("adm");
    http_resp *r;
    (void)state;
    r = req("POST", "/v1/admin/subjects", ADMIN,
            tst_fmt("{\"subject\":\"%s\",\"plan\":\"basic\",\"org\":\"acme\","
                "\"billing_anchor\":\"2026-01-31T09:00:00Z\"}", s));
    if (r->status != 200 && r->status != 201)
        fail_msg("create subject: %d %s", r->status, tst_excerpt(r));
    assert_string_equal(tst_jstr(usage_of(s), "plan", "usage"), "basic");
    if (!find_window(json_object_get(usage_of(s), "windows"),
                     "org.org_monthly"))
        fail_msg("subject in org acme has no org.org_monthly window");
    /* update */
    r = req("POST", "/v1/admin/subjects", ADMIN,
            tst_fmt("{\"subject\":\"%s\",\"plan\":\"roomy\"}", s));
    if (r->status != 200 && r->status != 201)
        fail_msg("update subject: %d %s", r->status, tst_excerpt(r));
    assert_string_equal(tst_jstr(usage_of(s), "plan", "usage"), "roomy");
    WANT(check_w(s, tst_uid("r"), 60), 200, "check 60 on roomy after update");
    /* errors */
    r = req("POST", "/v1/admin/subjects", ADMIN,
            tst_fmt("{\"subject\":\"%s\",\"plan\":\"platinum\"}", tst_uid("adm")));
    WANT_ERR(r, 400, NULL, "subject with an unknown plan");
    if (!strstr(r->body, "platinum"))
        fail_msg("unknown plan error does not name it: %s", tst_excerpt(r));
    WANT_ERR(req("POST", "/v1/admin/subjects", ADMIN,
                 tst_fmt("{\"subject\":\"%s\",\"plan\":\"basic\",\"org\":"
                     "\"nosuchorg\"}", tst_uid("adm"))), 400, NULL,
             "subject with an unknown org");
    WANT_ERR(req("POST", "/v1/admin/subjects", ADMIN, "{\"plan\":\"basic\"}"),
             400, "invalid_request", "subject without a name");
    WANT_ERR(req("POST", "/v1/admin/subjects", ADMIN,
                 tst_fmt("{\"subject\":\"%s\",\"plan\":\"basic\",\"billing_anchor"
                     "\":\"yesterday\"}", tst_uid("adm"))), 400,
             "invalid_request", "subject with a bad billing_anchor");
}

static void test_auth(void **state)
{
    const char *s = new_subject("roomy", NULL);
    const char *body = tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                           "\"weight\":1}", s, tst_uid("r"));
    const char *protected_[][3] = {
        { "POST", "/v1/check", "service" },
        { "POST", "/v1/settle", "service" },
        { "GET", "/v1/usage", "subject" },
        { "GET", "/v1/usage/bob", "admin" },
        { "POST", "/v1/admin/subjects", "admin" },
        { "POST", "/v1/admin/keys", "admin" },
        { "POST", "/v1/admin/reload", "admin" },
    };
    http_resp *r;
    (void)state;
    for (size_t i = 0; i < sizeof protected_ / sizeof protected_[0]; i++) {
        const char *m = protected_[i][0], *p = protected_[i][1];
        const char *b = !strcmp(m, "POST") ? body : NULL;
        WANT_ERR(req(m, p, NULL, b), 401, "unauthorized",
                 tst_fmt("%s %s without a key", m, p));
        WANT_ERR(req(m, p, "not-a-key-at-all", b), 401, "unauthorized",
                 tst_fmt("%s %s with a wrong key", m, p));
        WANT_ERR(req_on(&C, m, p, "x-api-key", "qgk_wrong_0000000000", b),
                 401, "unauthorized", tst_fmt("%s %s with a wrong x-api-key", m, p));
        {   /* a malformed Authorization header */
            const char *h[] = { "Authorization: Basic Zm9vOmJhcg==",
                                "Content-Type: application/json", NULL };
            http_resp *rr = tst_gc_add(GC_RESP, calloc(1, sizeof *rr));
            if (httpc_request(&C, m, p, h, b, b ? strlen(b) : 0, rr) < 0)
                fail_msg("%s %s: %s", m, p, C.err);
            WANT_ERR(rr, 401, "unauthorized",
                     tst_fmt("%s %s with Basic auth", m, p));
        }
    }
    /* the service key is not the admin key, nor the reverse */
    r = req("GET", "/v1/usage/bob", SERVICE, NULL);
    if (r->status != 401 && r->status != 403)
        fail_msg("service key on GET /v1/usage/bob: %d", r->status);
    /* open endpoints */
    WANT(req("GET", "/healthz", NULL, NULL), 200, "healthz without a key");
    WANT(req("GET", "/metrics", NULL, NULL), 200, "metrics without a key");
}

static void test_revoked_key(void **state)
{
    const char *s = new_subject("roomy", NULL);
    const char *help[] = { "keys", "--help", NULL };
    const char *revoke[8];
    char *out = NULL, *err = NULL;
    http_resp *r;
    json_t *j;
    const char *key, *kid;
    int rc;
    long long t0;
    (void)state;
    rc = qg_run_cli(help, 10000, &out, &err);
    free(out);
    free(err);
    if (rc != 0) {
        print_message("SKIPPED revoked key: `quotagate keys --help` exits %d "
                      "(no keys command yet), and the API has no revoke "
                      "endpoint\n", rc);
        skip();
    }
    r = req("POST", "/v1/admin/keys", ADMIN, tst_fmt("{\"subject\":\"%s\"}", s));
    if (r->status != 200 && r->status != 201)
        fail_msg("POST /v1/admin/keys: %d %s", r->status, tst_excerpt(r));
    j = tst_jparse(r, "keys");
    key = tst_jstr(j, "key", "keys");
    kid = tst_jstr(j, "id", "keys");
    WANT(req("GET", "/v1/usage", key, NULL), 200, "usage with a new key");
    revoke[0] = "keys";
    revoke[1] = "revoke";
    revoke[2] = kid;
    revoke[3] = "--data";
    revoke[4] = P.data;
    revoke[5] = NULL;
    rc = qg_run_cli(revoke, 20000, &out, &err);
    if (rc != 0) {
        char *o = tst_fmt("%s", out ? out : ""), *e = tst_fmt("%s", err ? err : "");
        free(out);
        free(err);
        fail_msg("`quotagate keys revoke %s --data %s` (server running) "
                 "exit %d\nstdout: %s\nstderr: %s", kid, P.data, rc, o, e);
    }
    free(out);
    free(err);
    /* The server must stop honouring it.  Allow it up to 5 s to notice a
     * revocation made by another process. */
    t0 = qg_now_ms();
    for (;;) {
        r = req("GET", "/v1/usage", key, NULL);
        if (r->status != 200 || qg_now_ms() - t0 > 5000)
            break;
        tst_sleep_ms(100);
    }
    WANT_ERR(r, 401, "unauthorized",
             tst_fmt("a key revoked %lld ms ago", qg_now_ms() - t0));
}

static void test_bad_requests(void **state)
{
    const char *s = new_subject("roomy", NULL);
    const char *bad[][2] = {
        { "{\"subject\":", "truncated JSON" },
        { "not json at all", "not JSON" },
        { "[1,2,3]", "a JSON array" },
        { "{\"subject\":\"%s\",\"request_id\":\"x\",\"weight\":1,}",
          "trailing comma" },
        { "{\"subject\":5,\"request_id\":\"%s\",\"weight\":1}",
          "numeric subject" },
        { "{\"subject\":\"%s\",\"request_id\":7,\"weight\":1}",
          "numeric request_id" },
        { "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":\"1\"}",
          "string weight" },
        { "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":-1}",
          "negative weight" },
        { "{\"subject\":\"%s\",\"request_id\":\"%s\",\"weight\":true}",
          "boolean weight" },
        { "{\"subject\":\"%s\",\"weight\":1}", "no request_id" },
        { "{\"request_id\":\"%s\",\"weight\":1}", "no subject" },
        { "{\"subject\":\"%s\",\"request_id\":\"%s\"}",
          "neither weight nor model" },
        { "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":\"standard\","
          "\"input_tokens\":\"many\",\"max_output_tokens\":1}",
          "string input_tokens" },
        { "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":\"standard\","
          "\"input_tokens\":-5,\"max_output_tokens\":1}",
          "negative input_tokens" },
        { "", "empty body" },
    };
    http_resp *r;
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* fill %s placeholders: subject then a fresh request id */
        const char *t = bad[i][0];
        char *b;
        if (strstr(t, "%s") && strstr(strstr(t, "%s") + 2, "%s"))
            b = tst_fmt(t, s, tst_uid("r"));
        else if (strstr(t, "%s"))
            b = tst_fmt(t, strstr(t, "\"subject\":\"%s") ? s : tst_uid("r"));
        else
            b = tst_fmt("%s", t);
        r = req("POST", "/v1/check", SERVICE, b);
        WANT_ERR(r, 400, "invalid_request", tst_fmt("check with %s", bad[i][1]));
    }
    /* request id longer than 255 bytes */
    {
        char idb[300];
        memset(idb, 'i', 299);
        idb[299] = '\0';
        WANT_ERR(check_w(s, idb, 1), 400, "invalid_request",
                 "check with a 299-byte request_id");
    }
    /* unknown subject (no default plan in these rules) */
    WANT_ERR(check_w(tst_uid("nobody"), tst_uid("r"), 1), 404, "unknown_subject",
             "check for an unknown subject");
    /* nothing was charged by any of it */
    assert_true(NEAR(used_in(s, "burst_5h"), 0));
    /* routes */
    WANT_ERR(req("GET", "/v1/nonexistent", NULL, NULL), 404, "not_found",
             "GET /v1/nonexistent");
    WANT_ERR(req("POST", "/nope", SERVICE, "{}"), 404, "not_found",
             "POST /nope");
    WANT_ERR(req("GET", "/v1/check", SERVICE, NULL), 405,
             "method_not_allowed", "GET /v1/check");
    WANT_ERR(req("DELETE", "/v1/plans", NULL, NULL), 405,
             "method_not_allowed", "DELETE /v1/plans");
    WANT_ERR(req("PUT", "/v1/settle", SERVICE, "{}"), 405,
             "method_not_allowed", "PUT /v1/settle");
    WANT_ERR(req("POST", "/healthz", NULL, "{}"), 405, "method_not_allowed",
             "POST /healthz");
    /* the connection survived all of that (or was reopened cleanly) and the
     * server still answers */
    WANT(req("GET", "/healthz", NULL, NULL), 200, "healthz afterwards");
}

static void test_keepalive_and_pipelining(void **state)
{
    httpc k;
    http_resp r1, r2;
    const char *two = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /v1/plans HTTP/1.1\r\nHost: x\r\n\r\n";
    (void)state;
    httpc_init(&k, qgproc_port(&P));
    for (int i = 0; i < 20; i++) {
        http_resp *r = req_on(&k, "GET", "/healthz", NULL, NULL, NULL);
        WANT(r, 200, "keep-alive healthz");
        if (r->closed)
            fail_msg("server closed a keep-alive connection after request %d",
                     i + 1);
    }
    if (k.connects != 1)
        fail_msg("20 requests used %d connections (keep-alive)", k.connects);
    if (httpc_send_raw(&k, two, strlen(two)) != (long)strlen(two))
        fail_msg("send: %s", k.err);
    if (httpc_read_response(&k, 0, &r1) < 0)
        fail_msg("first pipelined response: %s", k.err);
    if (httpc_read_response(&k, 0, &r2) < 0) {
        http_resp_free(&r1);
        fail_msg("second pipelined response: %s", k.err);
    }
    {
        int s1 = r1.status, s2 = r2.status, pl = strstr(r2.body, "basic") != NULL,
            hz = strstr(r1.body, "ok") != NULL;
        http_resp_free(&r1);
        http_resp_free(&r2);
        httpc_close(&k);
        if (s1 != 200 || s2 != 200 || !hz || !pl)
            fail_msg("pipelined: %d (healthz %d) then %d (plans %d)", s1, hz,
                     s2, pl);
    }
}

/* Send head, then body bytes from gen in pieces, until the server answers
 * (it may answer before the whole body is sent).  Returns the response. */
static http_resp *send_until_answer(httpc *k, const char *head,
                                    size_t body_total, int chunked)
{
    char piece[65536 + 32];
    size_t sent = 0;
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    k->timeout_ms = 10000;
    if (httpc_send_raw(k, head, strlen(head)) != (long)strlen(head))
        fail_msg("sending the head: %s", k->err);
    while (sent < body_total) {
        size_t n = body_total - sent > 65536 ? 65536 : body_total - sent;
        size_t len = n;
        if (httpc_wait_readable(k, 0) == 1)
            break;
        memset(piece, 'a', sizeof piece);
        if (chunked) {
            int h = snprintf(piece, sizeof piece, "%zx\r\n", n);
            memset(piece + h, 'a', n);
            memcpy(piece + h + n, "\r\n", 2);
            len = (size_t)h + n + 2;
        }
        if (httpc_send_raw(k, piece, len) != (long)len)
            break; /* the server closed its side: read the answer */
        sent += n;
    }
    if (chunked && sent >= body_total)
        httpc_send_raw(k, "0\r\n\r\n", 5);
    if (httpc_read_response(k, 0, r) < 0)
        fail_msg("no response after sending %zu of %zu body bytes: %s", sent,
                 body_total, k->err);
    return r;
}

static void test_body_too_large(void **state)
{
    httpc k;
    http_resp *r;
    const char *head;
    (void)state;
    /* a big body under the limit is served: 1,000,000 bytes of JSON */
    {
        const char *s = new_subject("roomy", NULL);
        const char *core = tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                               "\"weight\":1", s, tst_uid("r"));
        size_t total = 1000000, cl = strlen(core);
        char *b = tst_gc_add(GC_MEM, malloc(total + 1));
        memcpy(b, core, cl);
        memset(b + cl, ' ', total - cl - 1);
        b[total - 1] = '}';
        b[total] = '\0';
        r = req("POST", "/v1/check", SERVICE, b);
        WANT(r, 200, "check with a 1,000,000-byte body (under 1 MiB)");
    }
    httpc_init(&k, qgproc_port(&P));
    head = tst_fmt("POST /v1/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
               "\r\nContent-Type: application/json\r\nContent-Length: %d"
               "\r\n\r\n", SERVICE, 2 * 1024 * 1024);
    r = send_until_answer(&k, head, 2 * 1024 * 1024, 0);
    httpc_close(&k);
    WANT_ERR(r, 413, "request_too_large", "2 MiB body (Content-Length)");

    httpc_init(&k, qgproc_port(&P));
    head = tst_fmt("POST /v1/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
               "\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\n\r\n", SERVICE);
    r = send_until_answer(&k, head, 2 * 1024 * 1024, 1);
    httpc_close(&k);
    WANT_ERR(r, 413, "request_too_large", "2 MiB body (chunked)");

    httpc_init(&k, qgproc_port(&P));
    head = tst_fmt("POST /v1/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
               "\r\nContent-Length: %d\r\n\r\n", SERVICE, 1024 * 1024 + 1);
    r = send_until_answer(&k, head, 1024 * 1024 + 1, 0);
    httpc_close(&k);
    WANT_ERR(r, 413, "request_too_large", "body of 1 MiB + 1 byte");
    WANT(req("GET", "/healthz", NULL, NULL), 200, "healthz afterwards");
}

static void test_headers_too_large(void **state)
{
    httpc k;
    http_resp *r;
    char *big;
    size_t n = 64 * 1024;
    (void)state;
    /* an 8 KiB header is fine */
    {
        char *v = tst_gc_add(GC_MEM, malloc(8 * 1024 + 32));
        const char *h[2];
        memcpy(v, "X-Filler: ", 10);
        memset(v + 10, 'f', 8 * 1024);
        v[10 + 8 * 1024] = '\0';
        h[0] = v;
        h[1] = NULL;
        r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
        if (httpc_request(&C, "GET", "/healthz", h, NULL, 0, r) < 0)
            fail_msg("8 KiB header: %s", C.err);
        WANT(r, 200, "healthz with an 8 KiB header");
    }
    /* one huge header */
    big = tst_gc_add(GC_MEM, malloc(n + 256));
    n = (size_t)sprintf(big, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(big + n, 'b', 64 * 1024);
    n += 64 * 1024;
    memcpy(big + n, "\r\n\r\n", 5);
    httpc_init(&k, qgproc_port(&P));
    r = send_until_answer(&k, big, 0, 0);
    httpc_close(&k);
    WANT_ERR(r, 431, "headers_too_large", "a 64 KiB header");
    /* many small headers */
    {
        size_t cap = 4000 * 24 + 256, len = 0;
        char *m = tst_gc_add(GC_MEM, malloc(cap));
        len += (size_t)sprintf(m, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
        for (int i = 0; i < 4000; i++)
            len += (size_t)sprintf(m + len, "X-H%d: v\r\n", i);
        memcpy(m + len, "\r\n", 3);
        httpc_init(&k, qgproc_port(&P));
        r = send_until_answer(&k, m, 0, 0);
        httpc_close(&k);
        WANT_ERR(r, 431, "headers_too_large", "4000 headers");
    }
    WANT(req("GET", "/healthz", NULL, NULL), 200, "healthz afterwards");
}

static void test_header_timeout(void **state)
{
    static qgproc p;
    const char *args[] = { "--header-timeout", "500", NULL };
    static httpc k;
    http_resp *r;
    long long t0;
    const char *part = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    (void)state;
    own_server(&p, args);
    /* headers that never end */
    httpc_init(&k, qgproc_port(&p));
    own_c = &k;
    k.timeout_ms = 5000;
    t0 = qg_now_ms();
    if (httpc_send_raw(&k, part, strlen(part)) != (long)strlen(part))
        fail_msg("send: %s", k.err);
    r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    if (httpc_read_response(&k, 0, r) < 0) {
        char *e = tst_fmt("%s", k.err);
        httpc_close(&k);
        qgproc_cleanup(&p);
        fail_msg("unfinished headers with --header-timeout 500: no 408 "
                 "within 5 s (%s)", e);
    }
    httpc_close(&k);
    if (r->status != 408) {
        int st = r->status;
        qgproc_cleanup(&p);
        fail_msg("unfinished headers: HTTP %d, expected 408", st);
    }
    WANT_ERR(r, 408, "timeout", "unfinished headers");
    print_message("408 after %lld ms (--header-timeout 500)\n",
                  qg_now_ms() - t0);
    /* a client that trickles a byte every 100 ms never finishes either */
    httpc_init(&k, qgproc_port(&p));
    own_c = &k;
    t0 = qg_now_ms();
    {
        const char *trickle = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        size_t i = 0;
        int answered = 0;
        while (qg_now_ms() - t0 < 5000 && i < strlen(trickle)) {
            if (httpc_wait_readable(&k, 100) == 1) {
                answered = 1;
                break;
            }
            if (httpc_send_raw(&k, trickle + i, 1) != 1)
                break;
            i++;
        }
        r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
        k.timeout_ms = 1000;
        if (httpc_read_response(&k, 0, r) < 0) {
            char *e = tst_fmt("%s", k.err);
            httpc_close(&k);
            qgproc_cleanup(&p);
            fail_msg("trickling client (a byte per 100 ms, %zu sent, answered "
                     "%d): no 408 within 5 s (%s)", i, answered, e);
        }
        httpc_close(&k);
    }
    if (r->status != 408) {
        int st = r->status;
        qgproc_cleanup(&p);
        fail_msg("trickling headers: HTTP %d, expected 408", st);
    }
    print_message("trickling client: 408 after %lld ms\n", qg_now_ms() - t0);
    /* still serving */
    httpc_init(&k, qgproc_port(&p));
    own_c = &k;
    r = req_on(&k, "GET", "/healthz", NULL, NULL, NULL);
    httpc_close(&k);
    {
        int st = r->status, rc = qgproc_stop(&p, 20000);
        qgproc_cleanup(&p);
        assert_int_equal(st, 200);
        assert_int_equal(rc, 0);
    }
}

/* Run a program with `input` on stdin; returns its exit status, output in
 * *out (gc'd). */
static int run_stdin(const char *const *argv, const char *input, size_t len,
                     char **out)
{
    char ip[] = "/tmp/qgin.XXXXXX", op[] = "/tmp/qgout.XXXXXX";
    int ifd = mkstemp(ip), ofd = mkstemp(op), st;
    pid_t pid;
    assert_true(ifd >= 0 && ofd >= 0);
    unlink(ip);
    unlink(op);
    assert_int_equal(write(ifd, input, len), (ssize_t)len);
    lseek(ifd, 0, SEEK_SET);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(ifd, 0);
        dup2(ofd, 1);
        dup2(ofd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    {
        off_t n = lseek(ofd, 0, SEEK_END);
        char *b = tst_gc_add(GC_MEM, malloc((size_t)n + 1));
        lseek(ofd, 0, SEEK_SET);
        n = read(ofd, b, (size_t)n);
        b[n < 0 ? 0 : n] = '\0';
        *out = b;
    }
    close(ifd);
    close(ofd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_metrics(void **state)
{
    const char *s = new_subject("basic", NULL);
    http_resp *r;
    const char *ct;
    (void)state;
    /* some activity first: allows, a refusal, a settle, an error */
    const char *rid = tst_uid("m");
    WANT(check_w(s, rid, 1), 200, "check");
    WANT(settle_w(rid, 1, "completed"), 200, "settle");
    check_w(s, tst_uid("r"), 60);
    req("GET", "/v1/nope", NULL, NULL);
    r = req("GET", "/metrics", NULL, NULL);
    WANT(r, 200, "GET /metrics");
    ct = http_resp_header(r, "Content-Type");
    if (!ct || strncmp(ct, "text/plain", 10) != 0)
        fail_msg("/metrics Content-Type %s, expected text/plain",
                 ct ? ct : "(none)");
    if (!strstr(r->body, "# TYPE ") || !strstr(r->body, "# HELP "))
        fail_msg("/metrics without # HELP / # TYPE lines: %s", tst_excerpt(r));
    if (!strstr(r->body, "\nquotagate_") && strncmp(r->body, "quotagate_", 10))
        fail_msg("/metrics has no quotagate_ samples: %s", tst_excerpt(r));
    if (access("/usr/bin/promtool", X_OK) == 0) {
        const char *argv[] = { "/usr/bin/promtool", "check", "metrics", NULL };
        char *out;
        int rc = run_stdin(argv, r->body, r->body_len, &out);
        if (rc != 0)
            fail_msg("promtool check metrics exit %d:\n%s\n--- metrics ---\n%s",
                     rc, out, tst_fmt("%.3000s", r->body));
    } else {
        print_message("promtool not installed: /metrics not linted\n");
    }
}

/* rules.yaml with extra text inserted before "orgs:" and another version */
static const char *rules_variant(const char *extra_plans, const char *version)
{
    const char *orig = slurp_file(td("server/rules.yaml"));
    const char *o = strstr(orig, "\norgs:\n"), *v;
    char *out;
    assert_non_null(o);
    out = tst_fmt("%.*s\n%s%s", (int)(o - orig), orig, extra_plans, o + 1);
    v = strstr(out, "version: \"srv-1\"");
    assert_non_null(v);
    return tst_fmt("%.*sversion: \"%s\"%s", (int)(v - out), out, version,
               v + strlen("version: \"srv-1\""));
}

static int plans_mention(const char *what)
{
    http_resp *r = req("GET", "/v1/plans", NULL, NULL);
    WANT(r, 200, "GET /v1/plans");
    return json_mentions(tst_jparse(r, "plans"), what);
}

static void test_reload(void **state)
{
    const char *rules = qgproc_path(&P, "rules.yaml");
    const char *gold = "  gold:\n"
                       "    price: { usd_month: 50 }\n"
                       "    windows:\n"
                       "      - { name: burst_5h, type: rolling, length: 5h, "
                       "limit: 77 }\n"
                       "    concurrency: 4\n";
    const char *plat = "  platinum:\n"
                       "    price: { usd_month: 90 }\n"
                       "    windows:\n"
                       "      - { name: burst_5h, type: rolling, length: 5h, "
                       "limit: 99 }\n"
                       "    concurrency: 4\n";
    const char *s, *msg;
    http_resp *r;
    json_t *e;
    long long t0;
    (void)state;
    rules = tst_fmt("%s", rules);
    s = new_subject("roomy", NULL);
    /* a broken file: 400 naming file:line, old rules keep serving */
    assert_int_equal(qgproc_copy_file(td("server/rules_broken.yaml"), rules),
                     0);
    r = req("POST", "/v1/admin/reload", ADMIN, NULL);
    e = WANT_ERR(r, 400, NULL, "reload of a broken rules file");
    msg = tst_jstr(e, "message", "reload");
    if (!strstr(msg, "rules.yaml:22"))
        fail_msg("reload error does not name rules.yaml:22 (the unknown key "
                 "bogus_key): %s", msg);
    if (!plans_mention("srv-1") || !plans_mention("basic"))
        fail_msg("after a failed reload the old rules are not served");
    WANT(check_w(s, tst_uid("r"), 1), 200, "check after a failed reload");
    /* a good file: 200, new plan served */
    assert_int_equal(qgproc_write_file(rules, rules_variant(gold, "srv-2")),
                     0);
    r = req("POST", "/v1/admin/reload", ADMIN, NULL);
    WANT(r, 200, "reload of a good rules file");
    if (!plans_mention("gold") || !plans_mention("srv-2"))
        fail_msg("after reload GET /v1/plans lacks plan gold / srv-2");
    {
        const char *g = new_subject("gold", NULL);
        r = check_w(g, tst_uid("r"), 78);
        WANT_ERR(r, 429, "request_too_large_for_plan",
                 "weight 78 on gold (limit 77)");
        WANT(check_w(g, tst_uid("r"), 77), 200, "weight 77 on gold");
        /* put it back on a plan every later file has */
        r = req("POST", "/v1/admin/subjects", ADMIN,
                tst_fmt("{\"subject\":\"%s\",\"plan\":\"roomy\"}", g));
        if (r->status != 200 && r->status != 201)
            fail_msg("moving %s back to roomy: %d %s", g, r->status,
                     tst_excerpt(r));
    }
    /* SIGHUP: reload of the file, no HTTP */
    assert_int_equal(qgproc_write_file(rules, rules_variant(plat, "srv-3")),
                     0);
    assert_int_equal(qgproc_signal(&P, SIGHUP), 0);
    t0 = qg_now_ms();
    while (!plans_mention("platinum") && qg_now_ms() - t0 < 10000)
        tst_sleep_ms(50);
    if (!plans_mention("platinum") || !plans_mention("srv-3"))
        fail_msg("SIGHUP did not reload the rules within 10 s");
    /* SIGHUP with a broken file: keeps serving the old rules */
    assert_int_equal(qgproc_copy_file(td("server/rules_broken.yaml"), rules),
                     0);
    assert_int_equal(qgproc_signal(&P, SIGHUP), 0);
    tst_sleep_ms(500);
    if (!qgproc_alive(&P, NULL))
        fail_msg("serve died on SIGHUP with a broken rules file");
    if (!plans_mention("srv-3"))
        fail_msg("SIGHUP with a broken file replaced the rules");
    WANT(check_w(s, tst_uid("r"), 1), 200, "check after a failed SIGHUP reload");
    /* back to the original */
    assert_int_equal(qgproc_copy_file(td("server/rules.yaml"), rules), 0);
    WANT(req("POST", "/v1/admin/reload", ADMIN, NULL), 200,
         "reload of the original rules");
    if (!plans_mention("srv-1") || plans_mention("platinum"))
        fail_msg("the original rules are not back");
    assert_true(NEAR(used_in(s, "burst_5h"), 2));
}

static void test_crash_recovery(void **state)
{
    static qgproc p;
    static httpc k;
    http_resp *r;
    json_t *j;
    const char *ra = tst_uid("cr"), *rb = tst_uid("cr"), *sub = tst_uid("dur"), *key;
    int cycle;
    (void)state;
    own_server(&p, NULL);
    httpc_init(&k, qgproc_port(&p));
    own_c = &k;
    /* a reservation left open, a settled request, a subject and a key */
    WANT(req_on(&k, "POST", "/v1/check", "bearer", SERVICE,
                tst_fmt("{\"subject\":\"alice\",\"request_id\":\"%s\","
                    "\"weight\":5}", ra)), 200, "check 5");
    WANT(req_on(&k, "POST", "/v1/check", "bearer", SERVICE,
                tst_fmt("{\"subject\":\"alice\",\"request_id\":\"%s\","
                    "\"weight\":7}", rb)), 200, "check 7");
    WANT(req_on(&k, "POST", "/v1/settle", "bearer", SERVICE,
                tst_fmt("{\"request_id\":\"%s\",\"weight\":4,\"status\":"
                    "\"completed\"}", rb)), 200, "settle 4 of 7");
    r = req_on(&k, "POST", "/v1/admin/subjects", "bearer", ADMIN,
               tst_fmt("{\"subject\":\"%s\",\"plan\":\"basic\"}", sub));
    if (r->status != 200 && r->status != 201)
        fail_msg("create subject: %d", r->status);
    r = req_on(&k, "POST", "/v1/admin/keys", "bearer", ADMIN,
               tst_fmt("{\"subject\":\"%s\"}", sub));
    if (r->status != 200 && r->status != 201)
        fail_msg("create key: %d", r->status);
    key = tst_jstr(tst_jparse(r, "key"), "key", "key");
    for (cycle = 0; cycle < 2; cycle++) {
        qgproc_kill9(&p);
        if (qgproc_restart(&p) < 0) {
            qgproc_cleanup(&p);
            httpc_close(&k);
            fail_msg("restart after kill -9 failed");
        }
        httpc_set_port(&k, qgproc_port(&p));
        r = req_on(&k, "GET", "/v1/usage/alice", "bearer", ADMIN, NULL);
        WANT(r, 200, "usage after kill -9");
        j = tst_jparse(r, "usage");
        for (const char *w = "burst_5h\0weekly\0org.org_monthly\0"; *w;
             w += strlen(w) + 1) {
            json_t *win = find_window(json_object_get(j, "windows"), w);
            if (!win)
                fail_msg("no %s after restart", w);
            if (!NEAR(tst_jnum(win, "used", w), 9))
                fail_msg("after kill -9 #%d alice's %s used %g, expected 9 "
                         "(reservation 5 + settled 4)", cycle + 1, w,
                         tst_jnum(win, "used", w));
        }
        r = req_on(&k, "POST", "/v1/check", "bearer", SERVICE,
                   tst_fmt("{\"subject\":\"alice\",\"request_id\":\"%s\","
                       "\"weight\":5}", ra));
        WANT(r, 200, "repeat of the open reservation after restart");
        j = tst_jparse(r, "replay");
        if (!tst_jbool(j, "replayed", "replay"))
            fail_msg("acknowledged request_id not replayed after kill -9: %s",
                     tst_excerpt(r));
        r = req_on(&k, "POST", "/v1/settle", "bearer", SERVICE,
                   tst_fmt("{\"request_id\":\"%s\",\"weight\":4,\"status\":"
                       "\"completed\"}", rb));
        WANT(r, 200, "repeat of the acknowledged settle after restart");
        j = tst_jparse(r, "settle replay");
        if (!tst_jbool(j, "replayed", "settle replay") ||
            !NEAR(tst_jnum(j, "charged", "settle replay"), 4))
            fail_msg("settle repeated after kill -9: %s", tst_excerpt(r));
        r = req_on(&k, "GET", tst_fmt("/v1/usage/%s", sub), "bearer", ADMIN,
                   NULL);
        WANT(r, 200, "admin-created subject after kill -9");
        assert_string_equal(tst_jstr(tst_jparse(r, "u"), "plan", "u"), "basic");
        WANT(req_on(&k, "GET", "/v1/usage", "bearer", key, NULL), 200,
             "a subject key after kill -9");
        assert_true(NEAR(tst_jnum(find_window(json_object_get(
                                              tst_jparse(req_on(&k, "GET",
                                                            "/v1/usage/alice",
                                                            "bearer", ADMIN,
                                                            NULL), "u"),
                                              "windows"), "burst_5h"),
                              "used", "u"), 9));
    }
    httpc_close(&k);
    {
        int rc = qgproc_stop(&p, 20000);
        qgproc_cleanup(&p);
        assert_int_equal(rc, 0);
    }
}

static void test_clean_shutdown(void **state)
{
    static qgproc p;
    static httpc k;
    const char *rid = tst_uid("sd"), *open_ = tst_uid("sd");
    int rc;
    (void)state;
    own_server(&p, NULL);
    httpc_init(&k, qgproc_port(&p));
    own_c = &k;
    WANT(req_on(&k, "POST", "/v1/check", "bearer", SERVICE,
                tst_fmt("{\"subject\":\"bob\",\"request_id\":\"%s\","
                    "\"weight\":6}", rid)), 200, "check 6");
    WANT(req_on(&k, "POST", "/v1/settle", "bearer", SERVICE,
                tst_fmt("{\"request_id\":\"%s\",\"weight\":2,\"status\":"
                    "\"completed\"}", rid)), 200, "settle 2");
    WANT(req_on(&k, "POST", "/v1/check", "bearer", SERVICE,
                tst_fmt("{\"subject\":\"bob\",\"request_id\":\"%s\","
                    "\"weight\":3}", open_)), 200, "check 3");
    /* SIGTERM with an idle keep-alive connection open */
    rc = qgproc_stop(&p, 20000);
    if (rc != 0) {
        char w[512];
        snprintf(w, sizeof w, "%s", p.why);
        qgproc_dump_stderr(&p);
        httpc_close(&k);
        qgproc_cleanup(&p);
        fail_msg("SIGTERM: exit %d (%s), expected 0", rc, w);
    }
    if (qgproc_restart(&p) < 0) {
        httpc_close(&k);
        qgproc_cleanup(&p);
        fail_msg("restart after SIGTERM failed");
    }
    httpc_set_port(&k, qgproc_port(&p));
    {
        http_resp *r = req_on(&k, "GET", "/v1/usage/bob", "bearer", ADMIN,
                              NULL);
        json_t *w;
        WANT(r, 200, "usage after a clean restart");
        w = find_window(json_object_get(tst_jparse(r, "u"), "windows"), "weekly");
        if (!w || !NEAR(tst_jnum(w, "used", "weekly"), 5))
            fail_msg("after SIGTERM and restart bob's weekly used is not 5 "
                     "(settled 2 + open 3): %s", tst_excerpt(r));
    }
    httpc_close(&k);
    /* SIGINT is a clean shutdown too */
    assert_int_equal(qgproc_signal(&p, SIGINT), 0);
    {
        long long t0 = qg_now_ms();
        int st = 0;
        while (qgproc_alive(&p, &st) && qg_now_ms() - t0 < 20000)
            tst_sleep_ms(10);
        if (p.pid > 0) {
            qgproc_cleanup(&p);
            fail_msg("serve did not exit within 20 s of SIGINT");
        }
        qgproc_cleanup(&p);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("SIGINT: wait status 0x%x, expected exit 0", st);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_healthz, gc_teardown),
        cmocka_unit_test_teardown(test_plans_and_weights, gc_teardown),
        cmocka_unit_test_teardown(test_plans_statements, gc_teardown),
        cmocka_unit_test_teardown(test_console_routes, gc_teardown),
        cmocka_unit_test_teardown(test_check_allow_weight, gc_teardown),
        cmocka_unit_test_teardown(test_check_allow_model, gc_teardown),
        cmocka_unit_test_teardown(test_check_replay, gc_teardown),
        cmocka_unit_test_teardown(test_reject_rate_retryable, gc_teardown),
        cmocka_unit_test_teardown(test_reject_burst_long, gc_teardown),
        cmocka_unit_test_teardown(test_reject_never, gc_teardown),
        cmocka_unit_test_teardown(test_settle, gc_teardown),
        cmocka_unit_test_teardown(test_usage_and_keys, gc_teardown),
        cmocka_unit_test_teardown(test_admin_subjects, gc_teardown),
        cmocka_unit_test_teardown(test_auth, gc_teardown),
        cmocka_unit_test_teardown(test_revoked_key, gc_teardown),
        cmocka_unit_test_teardown(test_bad_requests, gc_teardown),
        cmocka_unit_test_teardown(test_keepalive_and_pipelining, gc_teardown),
        cmocka_unit_test_teardown(test_body_too_large, gc_teardown),
        cmocka_unit_test_teardown(test_headers_too_large, gc_teardown),
        cmocka_unit_test_teardown(test_header_timeout, gc_teardown),
        cmocka_unit_test_teardown(test_metrics, gc_teardown),
        cmocka_unit_test_teardown(test_reload, gc_teardown),
        cmocka_unit_test_teardown(test_crash_recovery, gc_teardown),
        cmocka_unit_test_teardown(test_clean_shutdown, gc_teardown),
    };
    return cmocka_run_group_tests_name("server", tests, group_setup,
                                       group_teardown);
}
