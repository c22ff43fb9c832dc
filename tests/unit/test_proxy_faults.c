/* test_proxy_faults.c - the metering proxy under injected allocation
 * failures, the way test_ledger_faults.c treats the ledger: fail the Nth
 * allocation of a proxied call, for N = 1, 2, ... until a call completes
 * without reaching N; once failing only the Nth (a transient fault), once
 * failing every one from the Nth on (memory that stays gone).
 *
 * The injection points are those of src/proxy/fault.h: every allocation
 * h_proxy.c makes for one call (the px struct, its evbuffers, the SSE
 * parser and its buffers, the abort timer, the request head and its
 * pullup, the rewritten body, the pieces of the answer and of a stream,
 * an error body) and every one of the upstream client (src/proxy/
 * upstream.c: the request bytes, the connection, its timer and events).
 * The hook counts only while armed, and only one call is in flight then.
 *
 * The server runs in this process (qg_serve on a thread, one worker, the
 * signals it waits for blocked here first, SIGTERM to ourselves to stop
 * it), so that the test installs the hook directly: nothing in the
 * binary reads a fault setting.  The upstream double runs as a child.
 * Each call is sent on its own connection with Connection: close and read
 * to the end, then checked:
 *  - one answer: an HTTP response, either whole (200 with the double's
 *    complete body or stream, every token and the end marker there, the
 *    hidden usage chunk still hidden; or a 5xx error) or a stream whose
 *    200 head came and which was cut (the documented signal);
 *  - one settle for an admitted call, none for one that failed before
 *    admission (quotagate_settles_total against the admitted decisions
 *    of quotagate_decisions_total), and the concurrency slot free (plan
 *    single holds one: a leaked lease would also refuse the next call);
 *  - no crash (also under ASan and UBSan) and, at exit, no leak (the ASan
 *    build's LeakSanitizer covers the server too: it is this process).
 * Each loop prints its injection points and outcomes
 * (docs/fault-injection.md).  QG_FAULTS_FULL=1 adds a longer stream
 * (200 tokens: a point per read); make test runs the rest, all of them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <http_parser.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dblproc.h"
#include "fault.h"
#include "httpc.h"
#include "ports.h"
#include "qgproc.h"
#include "server.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define PROMPT "hello there friend"
#define MAX_N 100000            /* a loop that never ends is a failure */
#define READ_MS 10000

/* ------------------------------------------------------------ faults */

static struct {
    atomic_int armed;
    atomic_long calls;
    long fail_at;               /* N */
    int persist;                /* fail every call from N on */
    const char *_Atomic site;   /* where the Nth call was */
} fi;

static int hook(const char *site)
{
    long n;
    if (!atomic_load(&fi.armed))
        return 0;
    n = atomic_fetch_add(&fi.calls, 1) + 1;
    if (n == fi.fail_at)
        atomic_store(&fi.site, site);
    return n == fi.fail_at || (fi.persist && n > fi.fail_at);
}

static void arm(long n, int persist)
{
    atomic_store(&fi.calls, 0);
    atomic_store(&fi.site, NULL);
    fi.fail_at = n;
    fi.persist = persist;
    atomic_store(&fi.armed, 1);
}

/* The sites failed so far (the Nth call's), with how often. */
#define MAX_SITES 64
static struct {
    const char *name;
    long n;
} sites[MAX_SITES];
static int nsites;

static void site_count(const char *site)
{
    int i;
    if (!site)
        return;
    for (i = 0; i < nsites && strcmp(sites[i].name, site) != 0; i++)
        ;
    if (i == nsites && nsites < MAX_SITES) {
        sites[nsites].name = site;
        sites[nsites++].n = 0;
    }
    if (i < nsites)
        sites[i].n++;
}

static void sites_print(const char *what)
{
    printf("faults: %s, sites failed:", what);
    for (int i = 0; i < nsites; i++)
        printf("%s %s %ld", i ? "," : "", sites[i].name, sites[i].n);
    printf("\n");
    fflush(stdout);
    nsites = 0;
}

/* Stop injecting; returns whether the Nth call was reached. */
static int disarm(void)
{
    atomic_store(&fi.armed, 0);
    return atomic_load(&fi.calls) >= fi.fail_at;
}

/* ------------------------------------------------- the server in here */

static qgproc Q;                /* only its directory */
static dblproc DBL;
static qg_serve_opts O;
static pthread_t server_th;
static int server_rc = -1, port;
static char listen_at[64], upstream[64], rules[1024];
static httpc C;
static const char *key, *subject;

static void *server_main(void *arg)
{
    (void)arg;
    server_rc = qg_serve(&O);
    return NULL;
}

static http_resp *call(const char *method, const char *path, const char *k,
                       const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, method, path, "bearer", k, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, C.err);
    return r;
}

static int group_setup(void **state)
{
    const char *src = getenv("QG_TESTDATA"), *ub = getenv("QG_UPSTREAM_BIN");
    long long t0;
    http_resp *r;
    sigset_t set;
    (void)state;
    if (!src || !ub) {
        fprintf(stderr, "QG_TESTDATA / QG_UPSTREAM_BIN not set (run through "
                "tests/run.sh)\n");
        return -1;
    }
    if (dblproc_start(&DBL, ub) < 0 || qgproc_init(&Q) < 0 ||
        (port = tst_free_port()) < 0) {
        fprintf(stderr, "cannot start the double or make a directory\n");
        dblproc_stop(&DBL);
        return -1;
    }
    /* qg_serve's signal thread waits for these: no other thread of this
     * process may take them, so they are blocked here before any thread
     * starts (after the double's fork: it must keep its SIGTERM) */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    snprintf(rules, sizeof rules, "%s/proxy/rules.yaml", src);
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", port);
    snprintf(upstream, sizeof upstream, "http://127.0.0.1:%d", DBL.port);
    setenv("QUOTAGATE_ADMIN_KEY", ADMIN, 1);
    setenv("QUOTAGATE_SERVICE_KEY", QGPROC_SERVICE_KEY, 1);
    setenv("QUOTAGATE_UPSTREAM_TIMEOUT_MS", "5000", 1);
    unsetenv("QUOTAGATE_UPSTREAM_KEY");
    O.rules_path = rules;
    O.listen = listen_at;
    O.data_dir = Q.data;
    O.upstream = upstream;
    O.workers = 1;
    atomic_store(&qg__alloc_fail_hook, hook);
    if (pthread_create(&server_th, NULL, server_main, NULL) != 0)
        return -1;
    httpc_init(&C, port);
    for (t0 = qg_now_ms(); qg_now_ms() - t0 < 20000; tst_sleep_ms(50)) {
        http_resp hr;
        memset(&hr, 0, sizeof hr);
        if (httpc_call(&C, "GET", "/healthz", NULL, NULL, NULL, &hr) == 0 &&
            hr.status == 200) {
            http_resp_free(&hr);
            break;
        }
        http_resp_free(&hr);
        httpc_close(&C);
        httpc_init(&C, port);
    }
    subject = strdup(tst_uid("faults"));
    r = call("POST", "/v1/admin/subjects", ADMIN,
             tst_fmt("{\"subject\":\"%s\",\"plan\":\"single\"}", subject));
    if (r->status != 200 && r->status != 201)
        return -1;
    r = call("POST", "/v1/admin/keys", ADMIN,
             tst_fmt("{\"subject\":\"%s\"}", subject));
    if (r->status != 200 && r->status != 201)
        return -1;
    key = strdup(tst_jstr(tst_jparse(r, "keys"), "key", "keys"));
    tst_gc_free_all();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    disarm();                       /* a failed check may have left it */
    httpc_close(&C);
    kill(getpid(), SIGTERM);        /* the server's signal thread */
    pthread_join(server_th, NULL);
    atomic_store(&qg__alloc_fail_hook, NULL);
    dblproc_stop(&DBL);
    qgproc_cleanup(&Q);
    free((void *)key);
    free((void *)subject);
    tst_gc_free_all();
    return server_rc == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ a call */

typedef struct answer {
    int status;                 /* 0: no response head at all */
    int complete;               /* the response ended properly */
    char *body;                 /* de-chunked, NUL-terminated */
    size_t blen;
    char ctype[128];
    char hname[32];
    int in_ctype;
} answer;

static int a_field(http_parser *hp, const char *at, size_t n)
{
    answer *a = hp->data;
    size_t k = strlen(a->hname);
    a->in_ctype = 0;
    if (k + n < sizeof a->hname) {
        memcpy(a->hname + k, at, n);
        a->hname[k + n] = '\0';
    }
    return 0;
}

static int a_value(http_parser *hp, const char *at, size_t n)
{
    answer *a = hp->data;
    if (a->hname[0]) {
        a->in_ctype = !strcasecmp(a->hname, "content-type");
        a->hname[0] = '\0';
        if (a->in_ctype)
            a->ctype[0] = '\0';
    }
    if (a->in_ctype) {
        size_t k = strlen(a->ctype);
        if (k + n < sizeof a->ctype) {
            memcpy(a->ctype + k, at, n);
            a->ctype[k + n] = '\0';
        }
    }
    return 0;
}

static int a_headers(http_parser *hp)
{
    ((answer *)hp->data)->status = hp->status_code;
    return 0;
}

static int a_body(http_parser *hp, const char *at, size_t n)
{
    answer *a = hp->data;
    char *nb = realloc(a->body, a->blen + n + 1);
    assert_non_null(nb);
    memcpy(nb + a->blen, at, n);
    a->blen += n;
    nb[a->blen] = '\0';
    a->body = nb;
    return 0;
}

static int a_done(http_parser *hp)
{
    ((answer *)hp->data)->complete = 1;
    return 0;
}

static const http_parser_settings a_settings = {
    .on_header_field = a_field, .on_header_value = a_value,
    .on_headers_complete = a_headers, .on_body = a_body,
    .on_message_complete = a_done,
};

/* POST body to path with the extra header lines (each ending CRLF) on a
 * connection of its own, read to the server's close, parse. */
static void post(const char *path, const char *extra, const char *body,
                 answer *a)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((unsigned short)port)};
    const char *req = tst_fmt(
        "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        "Content-Type: application/json\r\n%sContent-Length: %zu\r\n\r\n%s",
        path, extra, strlen(body), body);
    size_t off = 0, len = strlen(req);
    long long t0 = qg_now_ms();
    http_parser hp;
    int fd = socket(AF_INET, SOCK_STREAM, 0), eof = 0;
    memset(a, 0, sizeof *a);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        fail_msg("connect: %s", strerror(errno));
    while (off < len) {
        ssize_t k = write(fd, req + off, len - off);
        assert_true(k > 0);
        off += (size_t)k;
    }
    http_parser_init(&hp, HTTP_RESPONSE);
    hp.data = a;
    while (!eof && qg_now_ms() - t0 < READ_MS) {
        struct pollfd pf = {fd, POLLIN, 0};
        char buf[16384];
        ssize_t k;
        if (poll(&pf, 1, 100) <= 0)
            continue;
        k = read(fd, buf, sizeof buf);
        if (k <= 0) {
            eof = 1;
            if (HTTP_PARSER_ERRNO(&hp) == HPE_OK)
                http_parser_execute(&hp, &a_settings, NULL, 0);
        } else if (HTTP_PARSER_ERRNO(&hp) == HPE_OK) {
            http_parser_execute(&hp, &a_settings, buf, (size_t)k);
        }
    }
    close(fd);
    if (!eof)
        fail_msg("%s: the gateway did not close within %d ms", path,
                 READ_MS);
    if (HTTP_PARSER_ERRNO(&hp) != HPE_OK && !a->complete &&
        HTTP_PARSER_ERRNO(&hp) != HPE_INVALID_EOF_STATE)
        fail_msg("%s: the answer is not HTTP: %s", path,
                 http_errno_name(HTTP_PARSER_ERRNO(&hp)));
    if (!a->body)
        a->body = calloc(1, 1);
    tst_gc_add(GC_MEM, a->body);
}

/* The sum of a /metrics counter's samples whose line has `with`. */
static long long metric_sum(const char *name, const char *with)
{
    http_resp *r = call("GET", "/metrics", NULL, NULL);
    long long sum = 0;
    size_t nlen = strlen(name);
    for (const char *l = r->body; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t ll = e ? (size_t)(e - l) : strlen(l);
        if (ll > nlen && !strncmp(l, name, nlen) &&
            (l[nlen] == '{' || l[nlen] == ' ') &&
            (!with || memmem(l, ll, with, strlen(with)))) {
            const char *sp = memrchr(l, ' ', ll);
            sum += sp ? atoll(sp + 1) : 0;
        }
        l = e ? e + 1 : l + ll;
    }
    return sum;
}

static double concurrency_used(void)
{
    http_resp *r = call("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    json_t *w;
    size_t i;
    WANT(r, 200, "usage");
    json_array_foreach(json_object_get(tst_jparse(r, "usage"), "windows"), i,
                       w)
        if (!strcmp(tst_jstr(w, "name", "usage"), "concurrency"))
            return tst_jnum(w, "used", "usage");
    fail_msg("usage: no concurrency window: %s", tst_excerpt(r));
    return -1;
}

/* ------------------------------------------------------- the scenarios */

typedef struct scenario {
    const char *name;
    int anthropic, stream, include_usage, tokens;
    int big_mib;                /* the double's big=MIB: MiB of text */
    const char *mode;           /* X-Double-Mode */
    int want_status;            /* of the fault-free answer */
    int sample;                 /* past SAMPLE_FROM, every SAMPLE_STEP-th N
                                   unless QG_FAULTS_FULL=1 */
} scenario;

#define SAMPLE_FROM 32          /* a call's own points come first */
#define SAMPLE_STEP 8           /* then the same sites, read after read */

/* The last two run with QG_FAULTS_FULL=1 only. */
static const scenario SCEN[] = {
    {"openai, fresh connection", 0, 0, 0, 7, 0, "close", 200, 0},
    {"openai, pooled connection", 0, 0, 0, 7, 0, NULL, 200, 0},
    {"openai stream, usage chunk added", 0, 1, 0, 7, 0, "close,slow=0", 200,
     0},
    {"openai stream, usage chunk asked", 0, 1, 1, 7, 0, "close,slow=0", 200,
     0},
    {"anthropic", 1, 0, 0, 7, 0, "close", 200, 0},
    {"anthropic stream", 1, 1, 0, 7, 0, "close,slow=0", 200, 0},
    {"upstream 500", 0, 0, 0, 7, 0, "close,status=500", 502, 0},
    {"upstream 429", 1, 0, 0, 7, 0, "close,status=429", 429, 0},
    {"openai stream, 200 tokens", 0, 1, 0, 200, 0, "close,slow=0", 200, 1},
    {"openai, 1 MiB answer", 0, 0, 0, 7, 1, "close,big=1", 200, 0},
    {"anthropic stream, 2000 tokens", 1, 1, 0, 2000, 0, "close,slow=0", 200,
     0},
    {"openai, 8 MiB answer", 0, 0, 0, 7, 8, "close,big=8", 200, 0},
};

typedef struct tally {
    long runs, whole, errors, cut, before_admission;
} tally;

/* Was the fault-free answer of sc given whole?  (text: every token and
 * the end; a hidden usage chunk stays hidden) */
static int whole(const scenario *sc, const answer *a)
{
    if (!a->complete || a->status != sc->want_status)
        return 0;
    if (sc->want_status != 200) {
        json_t *j = json_loadb(a->body, a->blen, 0, NULL);
        int ok = j != NULL;
        json_decref(j);
        return ok;
    }
    if (!sc->stream) {
        json_t *j = json_loadb(a->body, a->blen, 0, NULL);
        json_t *t = sc->anthropic
            ? json_object_get(json_array_get(json_object_get(j, "content"),
                                             0), "text")
            : json_object_get(json_object_get(json_array_get(
                  json_object_get(j, "choices"), 0), "message"), "content");
        int ok = json_is_string(t) &&
                 (sc->big_mib ? json_string_length(t) ==
                                    (size_t)sc->big_mib << 20
                              : strstr(json_string_value(t),
                                       tst_fmt("tok%d", sc->tokens - 1)) !=
                                    NULL);
        json_decref(j);
        return ok;
    }
    for (int i = 0; i < sc->tokens; i++)
        if (!strstr(a->body, tst_fmt("\"%stok%d\"", i ? " " : "", i)))
            return 0;
    if (sc->anthropic)
        return strstr(a->body, "event: message_stop") != NULL;
    if (!strstr(a->body, "data: [DONE]"))
        return 0;
    return sc->include_usage == (strstr(a->body, "\"choices\":[]") != NULL);
}

/* One call of sc; checks its answer and its settle; counts it. */
static void run(const scenario *sc, tally *t, long n)
{
    const char *rid = tst_uid("f");
    const char *body = sc->anthropic
        ? tst_fmt("{\"model\":\"claude-light\",%s\"messages\":[{\"role\":"
                  "\"user\",\"content\":\"" PROMPT "\"}],\"max_tokens\":%d}",
                  sc->stream ? "\"stream\":true," : "", sc->tokens)
        : tst_fmt("{\"model\":\"light\",%s\"messages\":[{\"role\":\"user\","
                  "\"content\":\"" PROMPT "\"}],\"max_tokens\":%d%s}",
                  sc->stream ? "\"stream\":true," : "", sc->tokens,
                  sc->include_usage
                      ? ",\"stream_options\":{\"include_usage\":true}" : "");
    const char *extra = tst_fmt(
        "%s: %s%s\r\nX-Request-Id: %s\r\n%s%s%s", sc->anthropic ? "x-api-key"
        : "Authorization", sc->anthropic ? "" : "Bearer ", key, rid,
        sc->mode ? "X-Double-Mode: " : "", sc->mode ? sc->mode : "",
        sc->mode ? "\r\n" : "");
    long long settles0 = metric_sum("quotagate_settles_total", NULL);
    long long allows0 = metric_sum("quotagate_decisions_total",
                                   "outcome=\"allow\"");
    long long settles, allows;
    const char *site;
    answer a;

    post(sc->anthropic ? "/v1/messages" : "/v1/chat/completions", extra, body,
         &a);
    site = atomic_load(&fi.site);
    if (n > 0)
        site_count(site);
    settles = metric_sum("quotagate_settles_total", NULL) - settles0;
    allows = metric_sum("quotagate_decisions_total", "outcome=\"allow\"") -
             allows0;
    t->runs++;
    if (a.status == 0)
        fail_msg("%s, N=%ld (%s): no answer at all", sc->name, n,
                 site ? site : "-");
    if (allows != settles || allows > 1)
        fail_msg("%s, N=%ld (%s): %lld admitted, %lld settles", sc->name, n,
                 site ? site : "-", allows, settles);
    if (concurrency_used() != 0)
        fail_msg("%s, N=%ld (%s): the concurrency slot is still taken",
                 sc->name, n, site ? site : "-");
    if (whole(sc, &a)) {
        t->whole++;
    } else if (a.complete && a.status >= 500 && a.status <= 599) {
        t->errors++;
    } else if (!a.complete && a.status == 200 && sc->stream) {
        t->cut++;               /* the stream's documented signal */
    } else {
        fail_msg("%s, N=%ld (%s): HTTP %d%s, a damaged answer: %.300s",
                 sc->name, n, site ? site : "-", a.status,
                 a.complete ? "" : " cut", a.body);
    }
    if (allows == 0) {
        t->before_admission++;
        if (a.status != 500)
            fail_msg("%s, N=%ld (%s): not admitted, answered %d", sc->name,
                     n, site ? site : "-", a.status);
    }
}

/* The loop over N for one scenario and mode; prints its figures. */
static void loop(const scenario *sc, int persist)
{
    tally t = {0};
    long n, clean, last = 0;
    int step = sc->sample && !getenv("QG_FAULTS_FULL") ? SAMPLE_STEP : 1;
    arm(MAX_N + 1, 0);              /* counts, fails nothing */
    run(sc, &t, 0);
    disarm();
    clean = atomic_load(&fi.calls);
    if (t.whole != 1)
        fail_msg("%s: the fault-free call was not answered whole",
                 sc->name);
    t = (tally){0};
    for (n = 1; n <= MAX_N; n += n < SAMPLE_FROM ? 1 : step) {
        int reached;
        arm(n, persist);
        run(sc, &t, n);
        reached = disarm();
        tst_gc_free_all();
        if (!reached)
            break;
        last = n;
    }
    if (n > MAX_N)
        fail_msg("%s: never completed without reaching N", sc->name);
    printf("faults: %-34s %-8s %4ld points%s (fault-free call: %ld), %ld "
           "runs: %ld whole, %ld error answers (%ld before admission), %ld "
           "streams cut\n", sc->name, persist ? "from Nth" : "Nth only",
           last, step > 1 ? tst_fmt(" (every %dth past %d)", step,
                                    SAMPLE_FROM) : "",
           clean, t.runs - 1, t.whole - 1, t.errors, t.before_admission,
           t.cut);
    fflush(stdout);
}

static void test_transient(void **state)
{
    size_t k = sizeof SCEN / sizeof SCEN[0] - (getenv("QG_FAULTS_FULL") ? 0 : 2);
    (void)state;
    for (size_t i = 0; i < k; i++)
        loop(&SCEN[i], 0);
    sites_print("Nth only");
}

static void test_persistent(void **state)
{
    size_t k = sizeof SCEN / sizeof SCEN[0] - (getenv("QG_FAULTS_FULL") ? 0 : 2);
    (void)state;
    for (size_t i = 0; i < k; i++)
        loop(&SCEN[i], 1);
    sites_print("from Nth");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transient),
        cmocka_unit_test(test_persistent),
    };
    signal(SIGPIPE, SIG_IGN);
    if (getenv("QG_TEST_FILTER"))
        cmocka_set_test_filter(getenv("QG_TEST_FILTER"));
    return cmocka_run_group_tests_name("proxy_faults", tests, group_setup,
                                       group_teardown);
}
