/* test_http.c - the HTTP server (src/http) spoken to over real sockets.
 *
 * Each test starts a server on port 0 with a test handler, runs it in a
 * thread and talks to it with plain blocking sockets (3 s receive
 * timeout, so a bug fails a test instead of hanging it).  The handler
 * echoes what it parsed ("m=1 p=/x q=a=1 h=... b=...") so one response
 * checks method, path, query, header lookup and body; /hold keeps the
 * request so a test can answer it later through qg__http_post; /big
 * answers 4 MiB to exercise partial writes.  /stream, /forever, /flood
 * and /holdc exercise streaming responses and the on_close hook (see
 * "streaming handlers" below). */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "http.h"

/* ---- server under test ------------------------------------------------ */

typedef struct srv {
    qg_http_server *s;
    pthread_t th;
    int port, run_rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qg_http_req *held;
    int held_count;
    int on_thread;            /* the handler ran on a worker thread */
    /* Streaming handlers' observations (under mu, signalled on cv). */
    int st_done;              /* streams released */
    int st_closed;            /* on_close calls */
    int st_write_after;       /* a write's result after on_close */
    int st_start_rc;
    int flood_rc;             /* the flood's last write result */
    size_t flood_bytes;       /* body bytes written by the flood */
    int flood_ready;          /* the flood reached the high-water mark */
    int drained;              /* on_drain calls */
    int st_bad;               /* unexpected results on the worker */
} srv;

enum { BIG = 4 << 20, NCHUNK = 5, GAP_MS = 50, FLOOD_PIECE = 16384 };

static void handler(qg_http_req *r, void *ud);

/* ---- streaming handlers ------------------------------------------------
 * /stream: NCHUNK chunks "data: i\n\n", GAP_MS apart on a timer of the
 * worker's base, then the end.  /forever: a chunk every 10 ms until the
 * client goes away; on_close records, writes once more (must be -1) and
 * ends.  /flood: writes until the high-water mark, then waits for on_drain
 * to write "end" and finish.  /holdc: a deferred request with on_close. */

typedef struct strm {
    srv *x;
    qg_http_req *r;
    struct event *tev;
    int i, forever;
} strm;

static void strm_signal(srv *x, int *field, int v)
{
    pthread_mutex_lock(&x->mu);
    *field += v;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static void strm_free(strm *st)
{
    srv *x = st->x;
    event_free(st->tev);
    free(st);
    strm_signal(x, &x->st_done, 1);
}

static void strm_arm(strm *st, int ms)
{
    struct timeval tv = { 0, ms * 1000 };
    evtimer_add(st->tev, &tv);
}

static void strm_tick(evutil_socket_t fd, short what, void *arg)
{
    strm *st = arg;
    char b[32];
    int n, rc;
    (void)fd;
    (void)what;
    n = snprintf(b, sizeof b, "data: %d\n\n", st->i++);
    rc = qg__http_stream_write(st->r, b, (size_t)n);
    if (rc < 0)
        return;                         /* gone: on_close ends it */
    if (st->forever) {
        strm_arm(st, 10);
        return;
    }
    if (rc != 0)
        strm_signal(st->x, &st->x->st_bad, 1);
    if (st->i < NCHUNK) {
        strm_arm(st, GAP_MS);
        return;
    }
    qg__http_stream_end(st->r);
    strm_free(st);
}

static void strm_closed(void *arg)
{
    strm *st = arg;
    srv *x = st->x;
    pthread_mutex_lock(&x->mu);
    x->st_write_after = qg__http_stream_write(st->r, "late", 4);
    pthread_mutex_unlock(&x->mu);
    evtimer_del(st->tev);
    qg__http_stream_end(st->r);
    strm_free(st);
    strm_signal(x, &x->st_closed, 1);
}

static void flood_drained(void *arg)
{
    strm *st = arg;
    srv *x = st->x;
    strm_signal(x, &x->drained, 1);
    if (qg__http_stream_write(st->r, "end", 3) < 0)
        strm_signal(x, &x->st_bad, 1);
    qg__http_stream_end(st->r);
    strm_free(st);
}

static void holdc_closed(void *arg)
{
    strm *st = arg;
    srv *x = st->x;
    qg__http_respond(st->r, 200, NULL, 0, NULL, "{}", 2);  /* discarded */
    strm_free(st);
    strm_signal(x, &x->st_closed, 1);
}

static int stream_handler(qg_http_req *r, srv *x)
{
    qg_http_out_header oh[] = { { "Cache-Control", "no-cache" } };
    strm *st;
    int forever = !strcmp(r->path, "/forever");
    if (!strcmp(r->path, "/abort")) {       /* a truncated stream */
        if (qg__http_stream_start(r, 200, NULL, 0, "text/plain") != 0 ||
            qg__http_stream_write(r, "x", 1) != 0)
            strm_signal(x, &x->st_bad, 1);
        qg__http_respond(r, 500, NULL, 0, NULL, "ignored", 7);
        return 1;
    }
    if (strcmp(r->path, "/stream") && !forever && strcmp(r->path, "/flood")
        && strcmp(r->path, "/holdc"))
        return 0;
    st = calloc(1, sizeof *st);
    st->x = x;
    st->r = r;
    st->forever = forever;
    st->tev = evtimer_new(qg__http_req_base(r), strm_tick, st);
    if (!strcmp(r->path, "/holdc")) {
        qg__http_on_close(r, holdc_closed, st);
        strm_signal(x, &x->held_count, 1);
        return 1;
    }
    x->st_start_rc = qg__http_stream_start(r, 200, oh, 1,
                                          "text/event-stream");
    if (!strcmp(r->path, "/flood")) {
        char *piece = malloc(FLOOD_PIECE);
        size_t total = 0;
        int rc = 0;
        memset(piece, 'f', FLOOD_PIECE);
        while (rc == 0 && total < ((size_t)256 << 20)) {
            rc = qg__http_stream_write(r, piece, FLOOD_PIECE);
            total += FLOOD_PIECE;
        }
        free(piece);
        qg__http_stream_on_drain(r, flood_drained, st);
        pthread_mutex_lock(&x->mu);
        x->flood_rc = rc;
        x->flood_bytes = total;
        x->flood_ready = 1;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        return 1;
    }
    qg__http_on_close(r, strm_closed, st);
    strm_tick(-1, 0, st);               /* the first chunk at once */
    return 1;
}

static void handler(qg_http_req *r, void *ud)
{
    srv *x = ud;
    char buf[1024];
    size_t hl = 0;
    const char *h;
    int n;
    qg_http_out_header oh[] = { { "X-Served-By", "test" } };
    if (stream_handler(r, x))
        return;
    if (!strcmp(r->path, "/hold")) {
        pthread_mutex_lock(&x->mu);
        x->held = r;
        x->held_count++;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        return;
    }
    if (!strcmp(r->path, "/big")) {
        char *b = malloc(BIG);
        memset(b, 'z', BIG);
        qg__http_respond(r, 200, NULL, 0, "text/plain", b, BIG);
        free(b);
        return;
    }
    h = qg__http_header_get(r, "X-Test", &hl);
    n = snprintf(buf, sizeof buf, "m=%d p=%s q=%s h=%.*s b=%.200s n=%zu",
                 r->method, r->path, r->query, h ? (int)hl : 1, h ? h : "-",
                 r->body, r->body_len);
    qg__http_respond(r, 200, oh, 1, "text/plain", buf, (size_t)n);
}

static void *run_thread(void *arg)
{
    srv *x = arg;
    x->run_rc = qg__http_server_run(x->s);
    return NULL;
}

static qg_http_opts base_opts(void)
{
    qg_http_opts o = { 0 };
    o.host = "127.0.0.1";
    o.workers = 2;
    return o;
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
    assert_true(x->port > 0);
    assert_int_equal(pthread_create(&x->th, NULL, run_thread, x), 0);
    return x;
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

/* Wait until the handler holds `count` requests in total. */
static qg_http_req *wait_held(srv *x, int count)
{
    qg_http_req *r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 3;
    pthread_mutex_lock(&x->mu);
    while (x->held_count < count &&
           pthread_cond_timedwait(&x->cv, &x->mu, &ts) == 0)
        ;
    r = x->held_count >= count ? x->held : NULL;
    pthread_mutex_unlock(&x->mu);
    assert_non_null(r);
    return r;
}

static void respond_held(void *arg)
{
    srv *x = arg;
    qg_http_req *r;
    pthread_mutex_lock(&x->mu);
    r = x->held;
    x->held = NULL;
    pthread_mutex_unlock(&x->mu);
    qg__http_respond(r, 202, NULL, 0, NULL, "{\"deferred\":true}", 17);
}

/* ---- client ------------------------------------------------------------ */

typedef struct cli {
    int fd;
    char *buf;
    size_t len, cap;
} cli;

typedef struct resp {
    int status;
    char head[2048];
    char *body;
    size_t body_len;
} resp;

static cli *cli_open(int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET };
    struct timeval tv = { 3, 0 };
    cli *c = calloc(1, sizeof *c);
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&a, sizeof a), 0);
    c->cap = 1 << 16;
    c->buf = malloc(c->cap);
    return c;
}

static void cli_close(cli *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->buf);
    free(c);
}

static void cli_send(cli *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(c->fd, s, n, MSG_NOSIGNAL);
        assert_true(k > 0);
        s += k;
        n -= (size_t)k;
    }
}

static void cli_sends(cli *c, const char *s)
{
    cli_send(c, s, strlen(s));
}

/* Bytes from the socket into the buffer: >0, 0 on EOF, -1 error/timeout. */
static ssize_t cli_fill(cli *c)
{
    ssize_t n;
    if (c->len == c->cap) {
        c->cap *= 2;
        c->buf = realloc(c->buf, c->cap);
    }
    n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (n > 0)
        c->len += (size_t)n;
    return n;
}

static void resp_free(resp *r)
{
    free(r->body);
    r->body = NULL;
}

/* Read one response (no_body: a HEAD's); 0 or -1 on EOF/timeout. */
static int cli_read(cli *c, resp *r, int no_body)
{
    char *end, *cl;
    size_t hlen, blen = 0;
    memset(r, 0, sizeof *r);
    for (;;) {
        end = c->len ? memmem(c->buf, c->len, "\r\n\r\n", 4) : NULL;
        if (end)
            break;
        if (cli_fill(c) <= 0)
            return -1;
    }
    hlen = (size_t)(end - c->buf) + 4;
    assert_true(hlen < sizeof r->head);
    memcpy(r->head, c->buf, hlen);
    r->head[hlen] = '\0';
    r->status = atoi(r->head + 9);
    cl = strcasestr(r->head, "\r\nContent-Length: ");
    if (cl && !no_body)
        blen = strtoul(cl + 18, NULL, 10);
    while (c->len < hlen + blen)
        if (cli_fill(c) <= 0)
            return -1;
    r->body = malloc(blen + 1);
    memcpy(r->body, c->buf + hlen, blen);
    r->body[blen] = '\0';
    r->body_len = blen;
    memmove(c->buf, c->buf + hlen + blen, c->len - hlen - blen);
    c->len -= hlen + blen;
    return 0;
}

/* The server closed the connection (EOF or reset) within ms. */
static int cli_closed(cli *c, int ms)
{
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    char b[256];
    for (;;) {
        ssize_t n;
        if (poll(&p, 1, ms) <= 0)
            return 0;
        n = recv(c->fd, b, sizeof b, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0)
            return 0;
    }
}

static void expect_ok(cli *c, const char *body_part)
{
    resp r;
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    if (!strstr(r.body, body_part))
        fail_msg("body %s lacks %s", r.body, body_part);
    resp_free(&r);
}

static void expect_error(cli *c, int status, const char *type)
{
    resp r;
    char want[64];
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, status);
    assert_non_null(strstr(r.head, "Connection: close"));
    assert_non_null(strstr(r.head, "Content-Type: application/json"));
    snprintf(want, sizeof want, "{\"error\":{\"type\":\"%s\"", type);
    if (strncmp(r.body, want, strlen(want)) != 0)
        fail_msg("body %s", r.body);
    resp_free(&r);
    assert_true(cli_closed(c, 3000));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One chunk of a chunked body into out (up to cap bytes, NUL-terminated
 * when it fits): its length, 0 for the last chunk (with an empty
 * trailer), -1 on bad framing, EOF or timeout. */
static long cli_chunk(cli *c, char *out, size_t cap)
{
    char *crlf, *endp;
    size_t hl;
    unsigned long n;
    for (;;) {
        crlf = c->len ? memmem(c->buf, c->len, "\r\n", 2) : NULL;
        if (crlf)
            break;
        if (c->len > 32 || cli_fill(c) <= 0)
            return -1;
    }
    n = strtoul(c->buf, &endp, 16);
    if (endp == c->buf || endp != crlf)
        return -1;
    hl = (size_t)(crlf - c->buf) + 2;
    while (c->len < hl + n + 2)
        if (cli_fill(c) <= 0)
            return -1;
    if (memcmp(c->buf + hl + n, "\r\n", 2) != 0)
        return -1;
    if (out && n < cap) {
        memcpy(out, c->buf + hl, n);
        out[n] = '\0';
    }
    memmove(c->buf, c->buf + hl + n + 2, c->len - hl - n - 2);
    c->len -= hl + n + 2;
    return (long)n;
}

/* Wait until *field >= want (under x->mu); its value. */
static int wait_field(srv *x, const int *field, int want, int secs)
{
    struct timespec ts;
    int v;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += secs;
    pthread_mutex_lock(&x->mu);
    while (*field < want && pthread_cond_timedwait(&x->cv, &x->mu, &ts) == 0)
        ;
    v = *field;
    pthread_mutex_unlock(&x->mu);
    return v;
}

static void wait_no_connections(srv *x)
{
    qg_http_stats st;
    for (int i = 0; i < 300; i++) {
        qg__http_server_stats(x->s, &st);
        if (st.connections_open == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(st.connections_open, 0);
}

/* ---- tests -------------------------------------------------------------- */

static void test_get_keepalive(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    cli_sends(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(r.head, "Connection: keep-alive\r\n"));
    assert_non_null(strstr(r.head, "Content-Type: text/plain\r\n"));
    assert_non_null(strstr(r.head, "X-Served-By: test\r\n"));
    assert_non_null(strstr(r.head, "\r\nDate: "));
    assert_non_null(strstr(r.head, " GMT\r\n"));
    assert_string_equal(r.body, "m=1 p=/a q= h=- b= n=0");
    resp_free(&r);
    cli_sends(c, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_ok(c, "p=/b ");
    cli_close(c);
    finish(x);
}

static void test_post_content_length(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    (void)state;
    cli_sends(c, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n"
                 "hello");
    usleep(20000);                      /* the body arrives in two reads */
    cli_sends(c, " world");
    expect_ok(c, "m=2 p=/p q= h=- b=hello world n=11");
    cli_sends(c, "PUT /q HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
                 "DELETE /d HTTP/1.1\r\n\r\n");
    expect_ok(c, "m=3 p=/q");
    expect_ok(c, "m=4 p=/d");
    cli_close(c);
    finish(x);
}

static void test_post_chunked(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    (void)state;
    cli_sends(c, "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                 "\r\n\r\n5\r\nhello\r\n");
    usleep(20000);
    cli_sends(c, "6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n");
    expect_ok(c, "b=hello world n=11");
    /* Keep-alive after a chunked body. */
    cli_sends(c, "GET /after HTTP/1.1\r\n\r\n");
    expect_ok(c, "p=/after ");
    cli_close(c);
    finish(x);
}

static void test_query_and_headers(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    (void)state;
    cli_sends(c, "GET /s/t?a=1&b=2 HTTP/1.1\r\nhost: x\r\nx-TEST:  Foo Bar \r\n"
                 "Empty:\r\n\r\n");
    expect_ok(c, "p=/s/t q=a=1&b=2 h=Foo Bar b=");
    /* A header split over two writes, and an absolute-form URL. */
    cli_sends(c, "GET http://example.com/abs?z=9 HTTP/1.1\r\nX-Te");
    usleep(20000);
    cli_sends(c, "st: spl");
    usleep(20000);
    cli_sends(c, "it\r\n\r\n");
    expect_ok(c, "p=/abs q=z=9 h=split ");
    cli_close(c);
    finish(x);
}

static void test_pipelined(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    (void)state;
    cli_sends(c, "GET /one HTTP/1.1\r\n\r\n"
                 "POST /two HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                 "GET /three HTTP/1.1\r\n\r\n");
    expect_ok(c, "p=/one ");
    expect_ok(c, "p=/two q= h=- b=abc");
    expect_ok(c, "p=/three ");
    cli_close(c);
    finish(x);
}

static void test_head(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    cli_sends(c, "HEAD /h HTTP/1.1\r\n\r\nGET /g HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 1), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "Content-Length: "));
    resp_free(&r);
    expect_ok(c, "m=1 p=/g ");         /* no stray body in between */
    cli_close(c);
    finish(x);
}

static void test_big_response(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    cli_sends(c, "GET /big HTTP/1.1\r\n\r\nGET /small HTTP/1.1\r\n\r\n");
    usleep(100000);                    /* let the socket buffer fill up */
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.body_len, BIG);
    assert_int_equal(r.body[0], 'z');
    assert_int_equal(r.body[BIG - 1], 'z');
    resp_free(&r);
    expect_ok(c, "p=/small ");
    cli_close(c);
    finish(x);
}

static void test_deferred(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    qg_http_req *r;
    resp rs;
    (void)state;
    /* The second request must wait for the first's deferred response. */
    cli_sends(c, "GET /hold HTTP/1.1\r\n\r\nGET /next HTTP/1.1\r\n\r\n");
    r = wait_held(x, 1);
    assert_true(r->worker >= 0 && r->worker < 2);
    usleep(50000);
    {
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        assert_int_equal(poll(&p, 1, 0), 0);   /* nothing answered yet */
    }
    assert_int_equal(qg__http_post(x->s, r->worker, respond_held, x), 0);
    assert_int_equal(cli_read(c, &rs, 0), 0);
    assert_int_equal(rs.status, 202);
    assert_non_null(strstr(rs.head, "HTTP/1.1 202 Accepted\r\n"));
    assert_non_null(strstr(rs.head, "Content-Type: application/json\r\n"));
    assert_string_equal(rs.body, "{\"deferred\":true}");
    resp_free(&rs);
    expect_ok(c, "p=/next ");
    assert_int_equal(qg__http_post(x->s, 7, respond_held, x), -1);
    cli_close(c);
    finish(x);
}

static void test_deferred_disconnect(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    qg_http_req *r;
    qg_http_stats st;
    (void)state;
    cli_sends(c, "GET /hold HTTP/1.1\r\n\r\n");
    r = wait_held(x, 1);
    cli_close(c);                       /* gone before the response */
    usleep(100000);
    assert_int_equal(qg__http_post(x->s, r->worker, respond_held, x), 0);
    for (int i = 0; i < 300; i++) {
        int held;
        qg__http_server_stats(x->s, &st);
        pthread_mutex_lock(&x->mu);
        held = x->held != NULL;
        pthread_mutex_unlock(&x->mu);
        if (st.connections_open == 0 && !held)
            break;
        usleep(10000);
    }
    assert_int_equal(st.connections_open, 0);
    pthread_mutex_lock(&x->mu);
    assert_null(x->held);
    pthread_mutex_unlock(&x->mu);
    /* A hard reset while held, too. */
    c = cli_open(x->port);
    cli_sends(c, "GET /hold HTTP/1.1\r\n\r\n");
    r = wait_held(x, 2);
    {
        struct linger l = { 1, 0 };
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    cli_close(c);
    usleep(100000);
    assert_int_equal(qg__http_post(x->s, r->worker, respond_held, x), 0);
    usleep(100000);
    finish(x);
}

static void test_headers_too_large(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *c;
    char *big = malloc(8192);
    (void)state;
    o.max_header_bytes = 1024;
    x = start(&o);
    c = cli_open(x->port);
    memset(big, 'a', 8191);
    big[8191] = '\0';
    cli_sends(c, "GET / HTTP/1.1\r\nX-Big: ");
    cli_sends(c, big);
    cli_sends(c, "\r\n\r\n");
    expect_error(c, 431, "headers_too_large");
    cli_close(c);
    /* Many small headers add up too. */
    c = cli_open(x->port);
    cli_sends(c, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 100; i++)
        cli_sends(c, "X-Some-Header: 0123456789\r\n");
    cli_sends(c, "\r\n");
    expect_error(c, 431, "headers_too_large");
    cli_close(c);
    free(big);
    finish(x);
}

static void test_body_too_large(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *c;
    char chunk[2100];
    (void)state;
    o.max_body_bytes = 1024;
    x = start(&o);
    c = cli_open(x->port);
    cli_sends(c, "POST / HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n");
    expect_error(c, 413, "request_too_large");
    cli_close(c);
    /* Chunked: only the decoded size tells. */
    c = cli_open(x->port);
    memset(chunk, 'b', sizeof chunk);
    cli_sends(c, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "834\r\n");
    cli_send(c, chunk, 2100);
    cli_sends(c, "\r\n0\r\n\r\n");
    expect_error(c, 413, "request_too_large");
    cli_close(c);
    /* Exactly the limit passes. */
    c = cli_open(x->port);
    cli_sends(c, "POST /ok HTTP/1.1\r\nContent-Length: 1024\r\n\r\n");
    cli_send(c, chunk, 1024);
    expect_ok(c, "p=/ok ");
    cli_close(c);
    finish(x);
}

static void test_garbage(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    qg_http_stats st;
    (void)state;
    cli_sends(c, "HELLO THERE\x01\r\n\r\n");
    expect_error(c, 400, "invalid_request");
    cli_close(c);
    c = cli_open(x->port);
    cli_sends(c, "GET / HTTP/1.1\r\nContent-Length: zz\r\n\r\n");
    expect_error(c, 400, "invalid_request");
    cli_close(c);
    qg__http_server_stats(x->s, &st);
    assert_int_equal(st.errors_total, 2);
    assert_int_equal(st.connections_total, 2);
    assert_int_equal(st.requests_total, 0);
    finish(x);
}

static void test_header_timeout(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *c;
    double t0;
    (void)state;
    o.header_timeout_ms = 200;
    x = start(&o);
    c = cli_open(x->port);
    t0 = now_s();
    cli_sends(c, "GET / HTTP/1.1\r\nHost: x\r\n");
    expect_error(c, 408, "timeout");
    assert_true(now_s() - t0 >= 0.15);
    assert_true(now_s() - t0 < 2.0);
    cli_close(c);
    finish(x);
}

static void test_idle_timeout(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *c;
    double t0;
    qg_http_stats st;
    (void)state;
    o.idle_timeout_ms = 200;
    x = start(&o);
    c = cli_open(x->port);
    cli_sends(c, "GET / HTTP/1.1\r\n\r\n");
    expect_ok(c, "p=/ ");
    t0 = now_s();
    assert_true(cli_closed(c, 3000));
    assert_true(now_s() - t0 >= 0.15);
    cli_close(c);
    qg__http_server_stats(x->s, &st);
    assert_int_equal(st.errors_total, 0);  /* silent */
    finish(x);
}

static void test_connection_close(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    cli_sends(c, "GET /c HTTP/1.1\r\nConnection: close\r\n\r\n"
                 "GET /ignored HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_non_null(strstr(r.head, "Connection: close\r\n"));
    assert_non_null(strstr(r.body, "p=/c "));
    resp_free(&r);
    assert_true(cli_closed(c, 3000));
    cli_close(c);
    finish(x);
}

static void test_http10(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    cli_sends(c, "GET /old HTTP/1.0\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_non_null(strstr(r.head, "Connection: close\r\n"));
    assert_non_null(strstr(r.body, "p=/old "));
    resp_free(&r);
    assert_true(cli_closed(c, 3000));
    cli_close(c);
    c = cli_open(x->port);
    cli_sends(c, "GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_non_null(strstr(r.head, "Connection: close\r\n"));
    resp_free(&r);
    assert_true(cli_closed(c, 3000));
    cli_close(c);
    finish(x);
}

static void test_expect_continue(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    char b[64] = "";
    ssize_t n;
    (void)state;
    cli_sends(c, "POST /e HTTP/1.1\r\nContent-Length: 4\r\n"
                 "Expect: 100-continue\r\n\r\n");
    n = recv(c->fd, b, sizeof b - 1, 0);
    assert_int_equal(n, 25);
    assert_string_equal(b, "HTTP/1.1 100 Continue\r\n\r\n");
    cli_sends(c, "data");
    expect_ok(c, "p=/e q= h=- b=data");
    cli_close(c);
    finish(x);
}

static void test_max_connections(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *a, *b, *c;
    (void)state;
    o.workers = 1;
    o.max_connections = 2;
    o.max_conns_per_client = -1;
    x = start(&o);
    a = cli_open(x->port);
    b = cli_open(x->port);
    cli_sends(a, "GET /hold HTTP/1.1\r\n\r\n");
    wait_held(x, 1);
    cli_sends(b, "GET /b HTTP/1.1\r\n\r\n");
    expect_ok(b, "p=/b ");
    /* Full: the new connection takes the idle one's place (b), the held
     * one (a) is never shed (test_http_attack.c has the whole policy). */
    c = cli_open(x->port);
    cli_sends(c, "GET /c HTTP/1.1\r\n\r\n");
    expect_ok(c, "p=/c ");
    assert_true(cli_closed(b, 3000));
    cli_close(b);
    assert_int_equal(qg__http_post(x->s, 0, respond_held, x), 0);
    {
        resp rs;
        assert_int_equal(cli_read(a, &rs, 0), 0);
        assert_int_equal(rs.status, 202);
        resp_free(&rs);
    }
    cli_close(c);
    cli_close(a);
    finish(x);
}

static void test_stop_with_open_connections(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *idle = cli_open(x->port), *partial = cli_open(x->port);
    cli *held = cli_open(x->port);
    qg_http_req *r;
    qg_http_stats st;
    double t0;
    (void)state;
    cli_sends(idle, "GET / HTTP/1.1\r\n\r\n");
    expect_ok(idle, "p=/ ");
    cli_sends(partial, "GET / HTTP/1.1\r\nHo");
    cli_sends(held, "GET /hold HTTP/1.1\r\n\r\n");
    r = wait_held(x, 1);
    t0 = now_s();
    qg__http_server_stop(x->s);
    pthread_join(x->th, NULL);
    assert_int_equal(x->run_rc, 0);
    assert_true(now_s() - t0 < 1.5);    /* did not wait for the held one */
    assert_true(cli_closed(idle, 1000));
    assert_true(cli_closed(partial, 1000));
    assert_true(cli_closed(held, 1000));
    assert_int_equal(qg__http_post(x->s, 0, respond_held, x), -1);
    /* The owner answers after run returned: discarded, freed. */
    assert_ptr_equal(x->held, r);
    respond_held(x);
    qg__http_server_stats(x->s, &st);
    assert_int_equal(st.connections_open, 0);
    qg__http_server_free(x->s);
    cli_close(idle);
    cli_close(partial);
    cli_close(held);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
}

static void test_stop_frees_held(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    (void)state;
    cli_sends(c, "POST /hold HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
    wait_held(x, 1);
    finish(x);                          /* never answered: freed by free */
    cli_close(c);
}

static void test_stop_before_run(void **state)
{
    qg_http_opts o = base_opts();
    char err[128];
    qg_http_server *s = qg__http_server_new(&o, handler, NULL, err, sizeof err);
    (void)state;
    assert_non_null(s);
    qg__http_server_stop(s);
    assert_int_equal(qg__http_server_run(s), 0);
    qg__http_server_free(s);
    /* Freed without ever running. */
    s = qg__http_server_new(&o, handler, NULL, err, sizeof err);
    assert_non_null(s);
    qg__http_server_free(s);
}

static void test_port_in_use(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    char err[256] = "";
    qg_http_server *s2;
    (void)state;
    o.port = x->port;
    s2 = qg__http_server_new(&o, handler, NULL, err, sizeof err);
    assert_null(s2);
    assert_non_null(strstr(err, "in use"));
    o.host = "no.such.host.invalid";
    o.port = 0;
    assert_null(qg__http_server_new(&o, handler, NULL, err, sizeof err));
    finish(x);
}

static void post_count(void *arg)
{
    (*(int *)arg)++;
}

static void test_post_many(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    int counts[2] = { 0, 0 };
    (void)state;
    for (int i = 0; i < 10000; i++)
        assert_int_equal(qg__http_post(x->s, i & 1, post_count, &counts[i & 1]),
                         0);
    finish(x);                          /* posted before stop: all run */
    assert_int_equal(counts[0], 5000);
    assert_int_equal(counts[1], 5000);
}

static void test_stats(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    qg_http_stats st;
    (void)state;
    for (int i = 0; i < 5; i++) {
        cli_sends(c, "GET / HTTP/1.1\r\n\r\n");
        expect_ok(c, "p=/ ");
    }
    qg__http_server_stats(x->s, &st);
    assert_int_equal(st.requests_total, 5);
    assert_int_equal(st.connections_open, 1);
    assert_int_equal(st.connections_total, 1);
    assert_int_equal(st.errors_total, 0);
    cli_close(c);
    finish(x);
}

static void test_stream_chunks(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    char b[64], want[64];
    double t[NCHUNK];
    (void)state;
    cli_sends(c, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "\r\nTransfer-Encoding: chunked\r\n"));
    assert_non_null(strstr(r.head, "\r\nContent-Type: text/event-stream\r\n"));
    assert_non_null(strstr(r.head, "\r\nConnection: keep-alive\r\n"));
    assert_non_null(strstr(r.head, "\r\nCache-Control: no-cache\r\n"));
    assert_null(strcasestr(r.head, "Content-Length"));
    resp_free(&r);
    for (int i = 0; i < NCHUNK; i++) {
        long n = cli_chunk(c, b, sizeof b);
        t[i] = now_s();
        snprintf(want, sizeof want, "data: %d\n\n", i);
        assert_int_equal(n, (long)strlen(want));
        assert_string_equal(b, want);
    }
    assert_int_equal(cli_chunk(c, NULL, 0), 0);
    assert_int_equal(c->len, 0);        /* nothing after the last chunk */
    /* Each chunk arrived on its own, not buffered up to the end: the
     * producer waits GAP_MS between chunks, so must the arrivals. */
    for (int i = 1; i < NCHUNK; i++)
        if (t[i] - t[i - 1] <= 0.030)
            fail_msg("chunk %d arrived %.1f ms after the previous one", i,
                     (t[i] - t[i - 1]) * 1e3);
    /* Keep-alive continues after the stream. */
    cli_sends(c, "GET /after HTTP/1.1\r\n\r\n");
    expect_ok(c, "p=/after ");
    assert_int_equal(wait_field(x, &x->st_done, 1, 3), 1);
    assert_int_equal(x->st_start_rc, 0);
    assert_int_equal(x->st_closed, 0);
    assert_int_equal(x->st_bad, 0);
    cli_close(c);
    finish(x);
}

static void test_stream_pipelined_and_head(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    /* HEAD: the stream's head only; the pipelined GET waits for the end. */
    cli_sends(c, "HEAD /stream HTTP/1.1\r\n\r\nGET /next HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 1), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "Transfer-Encoding: chunked\r\n"));
    resp_free(&r);
    expect_ok(c, "p=/next ");
    assert_int_equal(wait_field(x, &x->st_done, 1, 3), 1);
    /* A stream then a pipelined request: the request waits for the end. */
    cli_sends(c, "GET /stream HTTP/1.1\r\n\r\nGET /then HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    resp_free(&r);
    for (int i = 0; i < NCHUNK; i++)
        assert_true(cli_chunk(c, NULL, 0) > 0);
    assert_int_equal(cli_chunk(c, NULL, 0), 0);
    expect_ok(c, "p=/then ");
    assert_int_equal(x->st_bad, 0);
    cli_close(c);
    finish(x);
}

static void test_stream_http10(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    char want[256] = "";
    ssize_t n;
    (void)state;
    cli_sends(c, "GET /stream HTTP/1.0\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.head, "\r\nConnection: close\r\n"));
    assert_null(strcasestr(r.head, "Transfer-Encoding"));
    assert_null(strcasestr(r.head, "Content-Length"));
    resp_free(&r);
    while ((n = cli_fill(c)) > 0)       /* the body ends at close */
        ;
    assert_int_equal(n, 0);
    for (int i = 0; i < NCHUNK; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want),
                 "data: %d\n\n", i);
    assert_int_equal(c->len, strlen(want));
    assert_memory_equal(c->buf, want, c->len);
    assert_int_equal(wait_field(x, &x->st_done, 1, 3), 1);
    assert_int_equal(x->st_bad, 0);
    cli_close(c);
    finish(x);
}

static void test_stream_client_closes(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    (void)state;
    cli_sends(c, "GET /forever HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    resp_free(&r);
    assert_true(cli_chunk(c, NULL, 0) > 0);
    assert_true(cli_chunk(c, NULL, 0) > 0);
    cli_close(c);                       /* gone mid-stream */
    assert_int_equal(wait_field(x, &x->st_closed, 1, 5), 1);
    assert_int_equal(x->st_write_after, -1);
    assert_int_equal(wait_field(x, &x->st_done, 1, 3), 1);
    wait_no_connections(x);
    /* A hard reset mid-stream. */
    x->st_write_after = 0;
    c = cli_open(x->port);
    cli_sends(c, "GET /forever HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    resp_free(&r);
    assert_true(cli_chunk(c, NULL, 0) > 0);
    {
        struct linger l = { 1, 0 };
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    cli_close(c);
    assert_int_equal(wait_field(x, &x->st_closed, 2, 5), 2);
    assert_int_equal(x->st_write_after, -1);
    assert_int_equal(wait_field(x, &x->st_done, 2, 3), 2);
    /* A deferred (not streaming) request learns of the disconnect too. */
    c = cli_open(x->port);
    cli_sends(c, "GET /holdc HTTP/1.1\r\n\r\n");
    assert_int_equal(wait_field(x, &x->held_count, 1, 3), 1);
    cli_close(c);
    assert_int_equal(wait_field(x, &x->st_closed, 3, 5), 3);
    assert_int_equal(wait_field(x, &x->st_done, 3, 3), 3);
    wait_no_connections(x);
    assert_int_equal(x->st_bad, 0);
    finish(x);
}

static void test_stream_abort(void **state)
{
    qg_http_opts o = base_opts();
    srv *x = start(&o);
    cli *c = cli_open(x->port);
    resp r;
    char b[8];
    (void)state;
    cli_sends(c, "GET /abort HTTP/1.1\r\n\r\n");
    assert_int_equal(cli_read(c, &r, 0), 0);
    assert_int_equal(r.status, 200);
    resp_free(&r);
    assert_int_equal(cli_chunk(c, b, sizeof b), 1);
    assert_string_equal(b, "x");
    assert_int_equal(cli_chunk(c, NULL, 0), -1);   /* EOF, no last chunk */
    assert_int_equal(x->st_bad, 0);
    cli_close(c);
    finish(x);
}

static void test_stream_high_water(void **state)
{
    qg_http_opts o = base_opts();
    srv *x;
    cli *c;
    resp r;
    char b[FLOOD_PIECE + 1], last[8] = "";
    size_t got = 0;
    long n;
    (void)state;
    o.workers = 1;
    x = start(&o);
    c = cli_open(x->port);
    /* The client does not read: writes fill the socket, then the buffer. */
    cli_sends(c, "GET /flood HTTP/1.1\r\n\r\n");
    assert_int_equal(wait_field(x, &x->flood_ready, 1, 20), 1);
    assert_int_equal(x->flood_rc, 1);
    usleep(50000);
    assert_int_equal(x->drained, 0);    /* nothing read: no drain yet */
    /* Now read everything: on_drain fires, writes "end" and ends. */
    assert_int_equal(cli_read(c, &r, 0), 0);
    resp_free(&r);
    while ((n = cli_chunk(c, b, sizeof b)) > 0) {
        got += (size_t)n;
        if (n < (long)sizeof last)
            memcpy(last, b, (size_t)n + 1);
    }
    assert_int_equal(n, 0);
    assert_string_equal(last, "end");
    assert_int_equal(got, x->flood_bytes + 3);
    assert_int_equal(wait_field(x, &x->drained, 1, 3), 1);
    assert_int_equal(wait_field(x, &x->st_done, 1, 3), 1);
    cli_sends(c, "GET /after HTTP/1.1\r\n\r\n");
    expect_ok(c, "p=/after ");
    assert_int_equal(x->st_bad, 0);
    cli_close(c);
    finish(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_keepalive),
        cmocka_unit_test(test_post_content_length),
        cmocka_unit_test(test_post_chunked),
        cmocka_unit_test(test_query_and_headers),
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_head),
        cmocka_unit_test(test_big_response),
        cmocka_unit_test(test_deferred),
        cmocka_unit_test(test_deferred_disconnect),
        cmocka_unit_test(test_headers_too_large),
        cmocka_unit_test(test_body_too_large),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_header_timeout),
        cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_connection_close),
        cmocka_unit_test(test_http10),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_stop_with_open_connections),
        cmocka_unit_test(test_stop_frees_held),
        cmocka_unit_test(test_stop_before_run),
        cmocka_unit_test(test_port_in_use),
        cmocka_unit_test(test_post_many),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_stream_chunks),
        cmocka_unit_test(test_stream_pipelined_and_head),
        cmocka_unit_test(test_stream_http10),
        cmocka_unit_test(test_stream_client_closes),
        cmocka_unit_test(test_stream_abort),
        cmocka_unit_test(test_stream_high_water),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
