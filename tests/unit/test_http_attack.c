/* test_http_attack.c - the HTTP layer under the attacks of issue 8: slow
 * uploads, idle and half-sent connections filling every slot, one address
 * taking every connection, and bodies declared too large.
 *
 * The in-process tests start the server (src/http) on port 0 with small
 * limits set through qg_http_opts, so each runs in about a second, and
 * speak to it over plain blocking sockets (a bounded wait on each, so a
 * bug fails a test instead of hanging it).  Nothing here asserts on time:
 * a deadline is shown to work by an ordering (the 408 arrives while the
 * client still has bytes of its declared body to send) and the limits by
 * which connections the server closed and its counters.  The last two
 * tests do the same against the real binary ($QG_BIN serve).
 *
 * Handler: /hold keeps the request (released by a post); anything else
 * answers 200 "ok n=BODY_LEN". */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "httpc.h"
#include "qgproc.h"

/* ---- server under test ------------------------------------------------ */

typedef struct srv {
    qg_http_server *s;
    pthread_t th;
    int port, run_rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qg_http_req *held[8];
    int nheld;
} srv;

static void handler(qg_http_req *r, void *ud)
{
    srv *x = ud;
    char buf[64];
    int n;
    if (!strcmp(r->path, "/hold")) {
        pthread_mutex_lock(&x->mu);
        if (x->nheld < 8)
            x->held[x->nheld++] = r;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        return;
    }
    n = snprintf(buf, sizeof buf, "ok n=%zu", r->body_len);
    qg__http_respond(r, 200, NULL, 0, "text/plain", buf, (size_t)n);
}

static void *run_thread(void *arg)
{
    srv *x = arg;
    x->run_rc = qg__http_server_run(x->s);
    return NULL;
}

static srv *start(const qg_http_opts *o)
{
    char err[256] = "";
    srv *x = calloc(1, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->s = qg__http_server_new(o, handler, x, err, sizeof err);
    if (!x->s)
        fail_msg("server_new: %s", err);
    x->port = qg__http_server_port(x->s);
    assert_int_equal(pthread_create(&x->th, NULL, run_thread, x), 0);
    return x;
}

/* Respond to the oldest held request (run on its worker by a post). */
static void release_one(void *arg)
{
    srv *x = arg;
    qg_http_req *r = NULL;
    pthread_mutex_lock(&x->mu);
    if (x->nheld > 0) {
        r = x->held[0];
        memmove(x->held, x->held + 1, (size_t)--x->nheld * sizeof *x->held);
    }
    pthread_mutex_unlock(&x->mu);
    if (r)
        qg__http_respond(r, 202, NULL, 0, NULL, "{}", 2);
}

static void release_all(srv *x)
{
    int n;
    pthread_mutex_lock(&x->mu);
    n = x->nheld;
    pthread_mutex_unlock(&x->mu);
    while (n-- > 0)
        assert_int_equal(qg__http_post(x->s, 0, release_one, x), 0);
}

static void wait_held(srv *x, int count)
{
    struct timespec ts;
    int got;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 5;
    pthread_mutex_lock(&x->mu);
    while (x->nheld < count && pthread_cond_timedwait(&x->cv, &x->mu, &ts) == 0)
        ;
    got = x->nheld;
    pthread_mutex_unlock(&x->mu);
    if (got < count)
        fail_msg("the handler holds %d requests, want %d", got, count);
}

static void finish(srv *x)
{
    qg__http_server_stop(x->s);
    pthread_join(x->th, NULL);
    assert_int_equal(x->run_rc, 0);
    qg__http_server_free(x->s);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}

static uint64_t drops(srv *x, int which)
{
    qg_http_stats st;
    qg__http_server_stats(x->s, &st);
    return st.drops[which];
}

static uint64_t open_conns(srv *x)
{
    qg_http_stats st;
    qg__http_server_stats(x->s, &st);
    return st.connections_open;
}

/* Poll the server's open-connection count until it is n (5 s at most). */
static void wait_open(srv *x, uint64_t n)
{
    for (int i = 0; i < 500 && open_conns(x) != n; i++)
        usleep(10000);
    if (open_conns(x) != n)
        fail_msg("the server has %llu connections open, want %llu",
                 (unsigned long long)open_conns(x), (unsigned long long)n);
}

/* ---- client ------------------------------------------------------------ */

typedef struct cli {
    int fd;
    char buf[8192];            /* received, not yet consumed */
    size_t len;
    char last[8192];           /* the last response (or what drain got) */
    size_t last_len;
} cli;

/* A connection to port from source address src ("127.0.0.1" when NULL). */
static cli *cli_from(const char *src, int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET }, b = { .sin_family = AF_INET };
    cli *c = calloc(1, sizeof *c);
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    if (src) {
        assert_int_equal(inet_pton(AF_INET, src, &b.sin_addr), 1);
        assert_int_equal(bind(c->fd, (struct sockaddr *)&b, sizeof b), 0);
    }
    assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof a), 0);
    return c;
}

static cli *cli_open(int port)
{
    return cli_from(NULL, port);
}

static void cli_close(cli *c)
{
    close(c->fd);
    free(c);
}

/* Send all of s; 0, or -1 when the server already closed. */
static int cli_send(cli *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(c->fd, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

static void cli_sends(cli *c, const char *s)
{
    assert_int_equal(cli_send(c, s, strlen(s)), 0);
}

/* Readable (data, EOF or reset) within ms. */
static int cli_readable(cli *c, int ms)
{
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    return poll(&p, 1, ms) == 1;
}

/* Bytes into buf: >0, 0 at EOF, -1 reset, error or nothing in 5 s. */
static ssize_t cli_fill(cli *c)
{
    ssize_t n;
    if (c->len == sizeof c->buf - 1 || !cli_readable(c, 5000))
        return -1;
    n = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
    if (n > 0)
        c->len += (size_t)n;
    c->buf[c->len] = '\0';
    return n;
}

/* What remains and whatever comes until the server closes (at most 5 s)
 * into c->last; 1 when it closed (EOF or reset), 0 when it did not. */
static int cli_drain(cli *c)
{
    int closed = 0;
    for (;;) {
        ssize_t n = cli_fill(c);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            closed = 1;
            break;
        }
        if (n < 0)
            break;
        if (c->len > sizeof c->buf / 2)
            c->len = 0;                 /* a flood: keep the tail only */
    }
    memcpy(c->last, c->buf, c->len + 1);
    c->last_len = c->len;
    c->len = 0;
    return closed;
}

/* The next response (Content-Length bodies) into c->last: its status, or
 * -1 when the connection closed or nothing came within 5 s. */
static int cli_response(cli *c)
{
    for (;;) {
        char *end, *cl;
        size_t hl, total;
        c->buf[c->len] = '\0';
        end = strstr(c->buf, "\r\n\r\n");
        if (end) {
            hl = (size_t)(end + 4 - c->buf);
            cl = strcasestr(c->buf, "\r\nContent-Length: ");
            total = hl + (cl && cl < end ? strtoul(cl + 18, NULL, 10) : 0);
            if (total < sizeof c->last && c->len >= total) {
                memcpy(c->last, c->buf, total);
                c->last[total] = '\0';
                c->last_len = total;
                memmove(c->buf, c->buf + total, c->len - total);
                c->len -= total;
                return atoi(c->last + 9);
            }
        }
        if (cli_fill(c) <= 0)
            return -1;
    }
}

/* A whole request answered 200 on a fresh connection from src. */
static void healthy(srv *x, const char *src)
{
    cli *h = cli_from(src, x->port);
    int st;
    cli_sends(h, "POST /healthy HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                 "\r\nhello");
    st = cli_response(h);
    if (st != 200)
        fail_msg("a healthy client (from %s) got %d, want 200 (-1: the "
                 "connection was closed without a response)",
                 src ? src : "127.0.0.1", st);
    assert_non_null(strstr(h->last, "ok n=5"));
    cli_close(h);
}

static qg_http_opts base_opts(void)
{
    qg_http_opts o = { 0 };
    o.host = "127.0.0.1";
    o.workers = 1;
    return o;
}

/* ---- deadlines ---------------------------------------------------------- */

/* A body sent one byte at a time is cut by its total deadline (header
 * timeout + declared size / minimum rate = 300 ms + 50 ms here) with a
 * 408, while the client still has most of its declared body to send;
 * the old idle timer (reset by every byte) never fired.  A healthy
 * client is served meanwhile. */
static void test_body_drip_cut(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *d;
    int sent = 0, st;
    enum { DECLARED = 500 };
    (void)state;
    o.header_timeout_ms = 300;
    o.min_body_rate = 10000;
    x = start(&o);
    d = cli_open(x->port);
    cli_sends(d, "POST /drip HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n");
    while (sent < DECLARED && !cli_readable(d, 20)) {
        if (cli_send(d, "x", 1) < 0)
            break;
        if (++sent == 3)
            healthy(x, NULL);
    }
    if (sent == DECLARED)
        fail_msg("the whole body was dripped (%d bytes, one per 20 ms) "
                 "without a 408: no body deadline", sent);
    st = cli_response(d);
    assert_int_equal(st, 408);
    assert_non_null(strstr(d->last, "\"type\":\"timeout\""));
    assert_non_null(strstr(d->last, "Connection: close"));
    assert_true(cli_drain(d));
    cli_close(d);
    assert_int_equal(drops(x, QG_HTTP_TIMEOUT_BODY), 1);

    /* Chunked: the deadline grows with the chunks declared, no more. */
    d = cli_open(x->port);
    cli_sends(d, "POST /drip HTTP/1.1\r\nHost: x\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n");
    for (sent = 0; sent < DECLARED && !cli_readable(d, 20); sent++)
        if (cli_send(d, "1\r\nx\r\n", 6) < 0)
            break;
    if (sent == DECLARED)
        fail_msg("%d one-byte chunks were dripped without a 408", sent);
    assert_int_equal(cli_response(d), 408);
    cli_close(d);
    assert_int_equal(drops(x, QG_HTTP_TIMEOUT_BODY), 2);
    finish(x);
}

/* The head has a total deadline too: a trickled header line is cut. */
static void test_head_drip_cut(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *d;
    int sent = 0;
    (void)state;
    o.header_timeout_ms = 300;
    x = start(&o);
    d = cli_open(x->port);
    cli_sends(d, "GET / HTTP/1.1\r\nX-Slow: ");
    while (sent < 500 && !cli_readable(d, 20) && cli_send(d, "a", 1) == 0)
        sent++;
    if (sent == 500)
        fail_msg("500 header bytes dripped without a 408");
    assert_int_equal(cli_response(d), 408);
    cli_close(d);
    assert_int_equal(drops(x, QG_HTTP_TIMEOUT_HEAD), 1);
    finish(x);
}

/* A request that the handler holds is not subject to the read
 * deadlines, and keep-alive pipelining still works under them. */
static void test_held_and_pipelined(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *c;
    (void)state;
    o.header_timeout_ms = 100;
    o.min_body_rate = 1000000;
    x = start(&o);
    c = cli_open(x->port);
    cli_sends(c, "GET /hold HTTP/1.1\r\n\r\n"
                 "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nab"
                 "GET /b HTTP/1.1\r\n\r\n");
    wait_held(x, 1);
    /* Hold it past both deadlines: wait for a drip elsewhere to be cut. */
    {
        cli *d = cli_open(x->port);
        cli_sends(d, "GET / HTTP/1.1\r\n");
        assert_int_equal(cli_response(d), 408);
        cli_close(d);
    }
    release_all(x);
    assert_int_equal(cli_response(c), 202);
    assert_int_equal(cli_response(c), 200);
    assert_non_null(strstr(c->last, "ok n=2"));
    assert_int_equal(cli_response(c), 200);
    cli_close(c);
    assert_int_equal(drops(x, QG_HTTP_TIMEOUT_HEAD), 1);
    assert_int_equal(drops(x, QG_HTTP_TIMEOUT_BODY), 0);
    finish(x);
}

/* ---- capacity and shedding --------------------------------------------- */

/* Four slots: two idle keep-alive connections and two half-sent heads.
 * Each new connection sheds one: the oldest idle first, then the oldest
 * unfinished read; the healthy client that sends a whole request is
 * served.  Before: new connections were closed at once. */
static void test_full_sheds_idle_then_slow(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *i1, *i2, *s1, *s2, *s3, *s4, *s5;
    (void)state;
    o.max_connections = 4;
    o.max_conns_per_client = -1;
    o.header_timeout_ms = 60000;
    x = start(&o);
    i1 = cli_open(x->port);
    cli_sends(i1, "GET /i1 HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(i1), 200);
    i2 = cli_open(x->port);
    cli_sends(i2, "GET /i2 HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_response(i2), 200);
    s1 = cli_open(x->port);
    cli_sends(s1, "POST /s1 HTTP/1.1\r\nContent-Length: 100000\r\n\r\n{");
    s2 = cli_open(x->port);
    cli_sends(s2, "GET /s2 HTTP/1.1\r\nX-Slow: a");
    wait_open(x, 4);

    s3 = cli_open(x->port);             /* full: sheds i1 (oldest idle) */
    if (!cli_drain(i1))
        fail_msg("a fifth connection did not shed the oldest idle one");
    assert_int_equal(i1->last_len, 0);       /* idle: closed silently */
    cli_sends(s3, "GET /s3 HTTP/1.1\r\nX-Slow: a");
    s4 = cli_open(x->port);             /* sheds i2 */
    assert_true(cli_drain(i2));
    s5 = cli_open(x->port);             /* no idle left: the oldest read */
    assert_true(cli_drain(s1));
    if (s1->last_len > 0)                    /* best effort: 503 then close */
        assert_non_null(strstr(s1->last, "503"));
    assert_int_equal(drops(x, QG_HTTP_SHED_IDLE), 2);
    assert_int_equal(drops(x, QG_HTTP_SHED_SLOW), 1);

    healthy(x, NULL);                   /* sheds s2, is served */
    assert_true(cli_drain(s2));
    assert_int_equal(drops(x, QG_HTTP_SHED_SLOW), 2);
    assert_int_equal(drops(x, QG_HTTP_REFUSED_CAPACITY), 0);
    cli_close(i1);
    cli_close(i2);
    cli_close(s1);
    cli_close(s2);
    cli_close(s3);
    cli_close(s4);
    cli_close(s5);
    finish(x);
}

/* A connection whose request the handler holds is never shed: with every
 * slot held, a new connection is refused (closed at once). */
static void test_held_never_shed(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *a, *b, *c;
    (void)state;
    o.max_connections = 2;
    o.max_conns_per_client = -1;
    x = start(&o);
    a = cli_open(x->port);
    cli_sends(a, "GET /hold HTTP/1.1\r\n\r\n");
    b = cli_open(x->port);
    cli_sends(b, "GET /hold HTTP/1.1\r\n\r\n");
    wait_held(x, 2);
    c = cli_open(x->port);
    assert_true(cli_drain(c));
    assert_int_equal(c->last_len, 0);
    assert_int_equal(drops(x, QG_HTTP_REFUSED_CAPACITY), 1);
    release_all(x);
    assert_int_equal(cli_response(a), 202);
    assert_int_equal(cli_response(b), 202);
    cli_close(a);
    cli_close(b);
    cli_close(c);
    finish(x);
}

/* Two connections per address: a third from 127.0.0.1 is refused while
 * both are held, another address is served, and once one of the first
 * two is idle a new connection from 127.0.0.1 replaces it. */
static void test_per_client_limit(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *a, *b, *c;
    (void)state;
    o.max_connections = 100;
    o.max_conns_per_client = 2;
    x = start(&o);
    a = cli_open(x->port);
    cli_sends(a, "GET /hold HTTP/1.1\r\n\r\n");
    b = cli_open(x->port);
    cli_sends(b, "GET /hold HTTP/1.1\r\n\r\n");
    wait_held(x, 2);
    c = cli_open(x->port);
    (void)cli_send(c, "GET /c HTTP/1.1\r\n\r\n", 19);
    if (!cli_drain(c) || c->last_len > 0)
        fail_msg("a third connection from one address was served: %s",
                 c->last_len ? c->last : "(no close)");
    cli_close(c);
    assert_int_equal(drops(x, QG_HTTP_REFUSED_PER_CLIENT), 1);
    healthy(x, "127.0.0.2");            /* another address */

    assert_int_equal(qg__http_post(x->s, 0, release_one, x), 0);
    assert_int_equal(cli_response(a), 202);   /* a is idle now */
    healthy(x, NULL);                   /* replaces a */
    assert_true(cli_drain(a));
    assert_int_equal(drops(x, QG_HTTP_SHED_IDLE), 1);
    release_all(x);
    assert_int_equal(cli_response(b), 202);
    cli_close(a);
    cli_close(b);
    finish(x);
}

/* ---- 413 as soon as the size is known ---------------------------------- */

/* Deadlines of an hour: any answer here comes from the size alone. */
static void want_413(srv *x, const char *req, const char *what)
{
    cli *c = cli_open(x->port);
    int st;
    cli_sends(c, req);
    st = cli_response(c);
    if (st != 413)
        fail_msg("%s: got %d, want 413 at once (-1: no response)", what, st);
    assert_non_null(strstr(c->last, "\"type\":\"request_too_large\""));
    assert_non_null(strstr(c->last, "Connection: close"));
    assert_true(cli_drain(c));
    cli_close(c);
}

static void test_413_at_once(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    (void)state;
    o.max_body_bytes = 1024;
    o.header_timeout_ms = 3600000;
    o.idle_timeout_ms = 3600000;
    o.min_body_rate = 1;
    x = start(&o);
    want_413(x, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                "7fffffffffffffff\r\nabc", "chunk size 7fffffffffffffff");
    want_413(x, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                "401\r\nabc", "one chunk of limit + 1");
    {
        /* The second chunk takes the sum over the limit. */
        char req[1200];
        int n = snprintf(req, sizeof req, "POST / HTTP/1.1\r\nTransfer-"
                         "Encoding: chunked\r\n\r\n3e8\r\n");
        memset(req + n, 'b', 1000);
        snprintf(req + n + 1000, sizeof req - (size_t)n - 1000,
                 "\r\n19\r\nab");
        want_413(x, req, "chunks summing to limit + 1");
    }
    want_413(x, "POST / HTTP/1.1\r\nContent-Length: 1025\r\n\r\nab",
             "Content-Length limit + 1, short body");
    want_413(x, "POST / HTTP/1.1\r\nContent-Length: 100000000000\r\n\r\n",
             "Content-Length 1e11, no body");
    healthy(x, NULL);
    finish(x);
}

/* ---- the real binary ----------------------------------------------------- */

static void serve(qgproc *p, const char *const *args)
{
    const char *src = getenv("QG_EXAMPLES");
    char rules[1024];
    if (!src)
        fail_msg("QG_EXAMPLES is not set (run through tests/run.sh)");
    snprintf(rules, sizeof rules, "%s/rules.yaml", src);
    if (qgproc_init(p) < 0)
        fail_msg("qgproc_init: %s", p->why);
    if (qgproc_start_copy(p, rules, args, NULL) < 0)
        fail_msg("serve did not start");
}

/* POST /v1/check with a body dripped one byte per 20 ms: the default
 * minimum rate (8 KiB/s) on 1,000 declared bytes plus --header-timeout
 * 300 cut it with a 408 long before the drip ends. */
static void test_serve_drip_cut(void **state)
{
    static qgproc p;
    const char *args[] = { "--header-timeout", "300", "--workers", "1", NULL };
    char head[512];
    cli *d;
    int sent = 0, st;
    (void)state;
    serve(&p, args);
    d = cli_open(qgproc_port(&p));
    snprintf(head, sizeof head, "POST /v1/check HTTP/1.1\r\nHost: x\r\n"
             "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
             "Content-Length: 1000\r\n\r\n{", QGPROC_SERVICE_KEY);
    cli_sends(d, head);
    while (sent < 999 && !cli_readable(d, 20) && cli_send(d, " ", 1) == 0)
        sent++;
    st = cli_response(d);
    cli_close(d);
    if (sent == 999 || st != 408) {
        qgproc_finish(&p);
        fail_msg("a dripped /v1/check body: %d bytes sent, got %d, want a "
                 "408 before the body ends", sent, st);
    }
    assert_int_equal(qgproc_finish(&p), 0);
}

/* More half-sent connections than --max-connections holds, then a
 * healthy client: /healthz and /v1/check are served, and /metrics counts
 * the connections shed. */
static void test_serve_full_healthy_served(void **state)
{
    static qgproc p;
    const char *args[] = { "--max-connections", "6",
                           "--max-connections-per-client", "0",
                           "--workers", "1", NULL };
    cli *slow[10];
    httpc h;
    http_resp r;
    const char *line;
    long shed = -1;
    (void)state;
    serve(&p, args);
    for (int i = 0; i < 10; i++) {
        slow[i] = cli_open(qgproc_port(&p));
        cli_sends(slow[i], "POST /v1/check HTTP/1.1\r\nContent-Length: "
                           "100000\r\n\r\n{");
    }
    /* The first four were shed by the last four. */
    for (int i = 0; i < 4; i++)
        if (!cli_drain(slow[i])) {
            qgproc_finish(&p);
            fail_msg("slow connection %d was not shed", i);
        }
    httpc_init(&h, qgproc_port(&p));
    if (httpc_get(&h, "/healthz", NULL, &r) < 0 || r.status != 200) {
        qgproc_finish(&p);
        fail_msg("healthz while full of slow connections: %s", h.err);
    }
    http_resp_free(&r);
    if (httpc_post_json(&h, "/v1/check", QGPROC_SERVICE_KEY,
                        "{\"subject\":\"bob\",\"request_id\":\"att-1\","
                        "\"weight\":1}", &r) < 0 || r.status != 200) {
        qgproc_finish(&p);
        fail_msg("check while full of slow connections: %s", h.err);
    }
    http_resp_free(&r);
    if (httpc_get(&h, "/metrics", QGPROC_SERVICE_KEY, &r) < 0 ||
        r.status != 200) {
        qgproc_finish(&p);
        fail_msg("metrics: %s", h.err);
    }
    line = strstr(r.body, "\nquotagate_http_connections_shed_total{reason=\"slow\"} ");
    if (line)
        shed = atol(strchr(line + 1, '}') + 2);
    http_resp_free(&r);
    httpc_close(&h);
    for (int i = 0; i < 10; i++)
        cli_close(slow[i]);
    assert_int_equal(qgproc_finish(&p), 0);
    if (shed < 5)
        fail_msg("quotagate_http_connections_shed_total{reason=\"slow\"} is "
                 "%ld, want at least 5", shed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_body_drip_cut),
        cmocka_unit_test(test_head_drip_cut),
        cmocka_unit_test(test_held_and_pipelined),
        cmocka_unit_test(test_full_sheds_idle_then_slow),
        cmocka_unit_test(test_held_never_shed),
        cmocka_unit_test(test_per_client_limit),
        cmocka_unit_test(test_413_at_once),
        cmocka_unit_test(test_serve_drip_cut),
        cmocka_unit_test(test_serve_full_healthy_served),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
