/* fuzz_upstream_response.c - the proxy's upstream response reader (our
 * HTTP/1.1 client, src/proxy/upstream.c: qg__upstream_send, its parser
 * callbacks, the end of a response, the keep-alive pool) fed arbitrary
 * bytes as an upstream's answer over a real loopback connection, in this
 * thread.
 *
 * One upstream object (one worker, "http://127.0.0.1:PORT", a timeout no
 * run reaches) and a listening socket standing for the upstream are made
 * once; an event base is pumped here (event_base_loop EVLOOP_NONBLOCK),
 * as fuzz_http_request.c pumps its server, so each input runs the same
 * way every time.  Per input: send one request through the client,
 * accept its connection, read the request, then write the input as the
 * answer in pieces (pumping between them, so the parser sees status
 * lines, headers, chunk sizes and bodies split anywhere), pump, then
 * half-close and pump until the call has ended and the connection is
 * gone.
 *
 * Input: byte 0 picks the piece sizes (whole, 1 byte at first, or sizes
 * from a generator seeded by byte 1, up to 64 or 512); the rest is what
 * the upstream sends.
 *
 * The reference is libhttp-parser run plainly over the same bytes, one
 * byte at a time (so that it hands over every body byte before an
 * error), with the rules the reader documents: interim responses (1xx,
 * RFC 9110 15.2) are skipped, head and body; a 101 is refused (the proxy
 * never asks to switch protocols); the answer is the first final
 * response, and nothing after it counts.  Checked:
 *  - on_head comes at most once, and only when the reference read the
 *    answer's head, with its status, Content-Type and Retry-After (the
 *    last of each, cut to the reader's fields);
 *  - the body handed over equals the reference's (a prefix of it when the
 *    answer is cut short or malformed), never a byte of what follows;
 *  - on_done comes exactly once: QG_UP_OK when the reference completed
 *    the answer (also by the end of the input, for a body that lasts
 *    until the close), QG_UP_EPROTO when it failed to parse it,
 *    QG_UP_ECONN when the input ended inside it; no callback after it;
 *  - before the half-close the connection is kept (pooled) exactly when
 *    the answer completed, both sides keep alive and no byte follows it;
 *    after it, no connection is left.
 * A disagreement aborts. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <http_parser.h>

#include "fuzz.h"
#include "upstream.h"

#define PUMP_LIMIT 100000       /* loop turns without progress: a hang */
#define CTYPE_CAP (sizeof ((qg_upresp *)0)->ctype)
#define RETRY_CAP (sizeof ((qg_upresp *)0)->retry_after)

static const char REQ_HEAD[] = "POST /v1/chat/completions HTTP/1.1\r\n"
                               "Host: upstream\r\nContent-Length: 2\r\n\r\n";
static const char REQ_BODY[] = "{}";

static struct event_base *base;
static qg_upstream *up;
static int lfd = -1;
static const uint8_t *cur_data;
static size_t cur_size;

#define FAIL(what) fuzz_fail((what), cur_data, cur_size)

/* ---- what the reader handed over */

typedef struct got {
    int heads, dones, err, after_done;
    qg_upresp head;
    char *body;
    size_t blen, bcap;
} got;

static got G;

static void g_head(void *ud, const qg_upresp *r)
{
    (void)ud;
    if (G.dones)
        G.after_done = 1;
    if (G.heads++ == 0)
        G.head = *r;
}

static void g_body(void *ud, const char *data, size_t len)
{
    (void)ud;
    if (G.dones)
        G.after_done = 1;
    if (G.heads == 0)
        FAIL("body before the head");
    if (G.blen + len > G.bcap) {
        size_t nc = (G.blen + len) * 2 + 64;
        char *nb = realloc(G.body, nc);
        if (!nb)
            abort();
        G.body = nb;
        G.bcap = nc;
    }
    memcpy(G.body + G.blen, data, len);
    G.blen += len;
}

static void g_done(void *ud, int err)
{
    (void)ud;
    if (G.dones++ == 0)
        G.err = err;
}

static void g_read_end(void *ud)
{
    (void)ud;
    if (G.dones)
        G.after_done = 1;
}

static const qg_upcall_cbs cbs = {g_head, g_body, g_done, g_read_end};

/* ---- the reference */

typedef struct ref {
    int interim;                /* inside a 1xx */
    int final_head;             /* the answer's head was read */
    int complete, at_eof, keep, error;
    size_t end;                 /* offset just after the answer */
    qg_upresp head;
    char name[64], *value;      /* the header being read */
    size_t nlen, vlen, vcap;
    int in_value, name_long;
    char *body;
    size_t blen, bcap;
} ref;

static ref R;

static void r_append(char **buf, size_t *len, size_t *cap, const char *s,
                     size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            abort();
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
}

/* A header ended: keep the value of the two the reader reports (the last
 * occurrence wins, cut to its field, as a C string). */
static void r_header_end(void)
{
    char *dst = NULL;
    size_t cap = 0;
    if (!R.in_value || R.final_head)
        return;
    if (!R.name_long && R.nlen == 12 &&
        strncasecmp(R.name, "content-type", 12) == 0) {
        dst = R.head.ctype;
        cap = CTYPE_CAP;
    } else if (!R.name_long && R.nlen == 11 &&
               strncasecmp(R.name, "retry-after", 11) == 0) {
        dst = R.head.retry_after;
        cap = RETRY_CAP;
    }
    if (dst) {
        size_t n = R.vlen < cap - 1 ? R.vlen : cap - 1;
        memcpy(dst, R.value ? R.value : "", n);
        dst[n] = '\0';
    }
    R.in_value = 0;
    R.nlen = R.vlen = 0;
    R.name_long = 0;
}

static int rf_begin(http_parser *p)
{
    (void)p;
    memset(&R.head, 0, sizeof R.head);
    R.nlen = R.vlen = 0;
    R.in_value = R.name_long = 0;
    return 0;
}

static int rf_field(http_parser *p, const char *at, size_t n)
{
    (void)p;
    if (R.in_value)
        r_header_end();
    if (R.nlen + n > sizeof R.name)
        R.name_long = 1;
    else
        memcpy(R.name + R.nlen, at, n);
    R.nlen += n;
    return 0;
}

static int rf_value(http_parser *p, const char *at, size_t n)
{
    (void)p;
    R.in_value = 1;
    r_append(&R.value, &R.vlen, &R.vcap, at, n);
    return 0;
}

static int rf_headers(http_parser *p)
{
    r_header_end();
    if (p->status_code == 101)
        return -1;                  /* never asked for: refused */
    if (p->status_code / 100 == 1) {
        R.interim = 1;
        return 1;                   /* an interim response has no body */
    }
    R.head.status = p->status_code;
    R.final_head = 1;
    return 0;
}

static int rf_body(http_parser *p, const char *at, size_t n)
{
    (void)p;
    if (R.final_head)
        r_append(&R.body, &R.blen, &R.bcap, at, n);
    return 0;
}

static int rf_done(http_parser *p)
{
    if (R.interim) {
        R.interim = 0;
        return 0;
    }
    R.complete = 1;
    R.keep = http_should_keep_alive(p);
    http_parser_pause(p, 1);        /* nothing after the answer counts */
    return 0;
}

static const http_parser_settings ref_settings = {
    .on_message_begin = rf_begin, .on_header_field = rf_field,
    .on_header_value = rf_value, .on_headers_complete = rf_headers,
    .on_body = rf_body, .on_message_complete = rf_done,
};

static void ref_run(const char *s, size_t n)
{
    http_parser p;
    size_t i;
    char *value = R.value, *body = R.body;
    size_t vcap = R.vcap, bcap = R.bcap;
    memset(&R, 0, sizeof R);
    R.value = value;
    R.vcap = vcap;
    R.body = body;
    R.bcap = bcap;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &R;
    for (i = 0; i < n && !R.complete && !R.error; i++) {
        http_parser_execute(&p, &ref_settings, s + i, 1);
        if (HTTP_PARSER_ERRNO(&p) != HPE_OK && !R.complete)
            R.error = 1;
    }
    if (R.complete) {
        R.end = i;
    } else if (!R.error) {
        http_parser_execute(&p, &ref_settings, NULL, 0);    /* the close */
        if (R.complete)
            R.at_eof = 1;
        R.end = n;
    }
}

/* ---- driving */

static int port_of(int fd)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        abort();
    return ntohs(a.sin_port);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sockaddr_in a = {0};
    char url[64], err[256];
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    if (!(base = event_base_new()))
        abort();
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(lfd, 16) != 0)
        abort();
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port_of(lfd));
    if (!(up = qg__upstream_new(url, 1, 600000000, NULL, err, sizeof err))) {
        fprintf(stderr, "fuzz_upstream_response: %s\n", err);
        abort();
    }
    return 0;
}

static void pump(void)
{
    for (int i = 0; i < 2; i++)     /* a read, then what it activated */
        event_base_loop(base, EVLOOP_NONBLOCK);
}

/* Read what the client sent (the request) without blocking; 1 at EOF. */
static int drain(int fd, size_t *got_bytes)
{
    char buf[4096];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k > 0)
            *got_bytes += (size_t)k;
        else if (k == 0 || (errno != EAGAIN && errno != EINTR))
            return 1;
        else
            return 0;
    }
}

/* Piece sizes: 0 whole; 1 byte by byte for the first 128 bytes, then the
 * rest; 2 and 3 from a generator, up to 64 or 512 bytes. */
static size_t next_piece(int mode, unsigned *seed, size_t at)
{
    if (mode == 0)
        return (size_t)-1;
    if (mode == 1)
        return at < 128 ? 1 : (size_t)-1;
    *seed = *seed * 1103515245u + 12345u;
    return 1 + (*seed >> 16) % (mode == 2 ? 64 : 512);
}

static void check(size_t n, size_t pooled)
{
    int want_err = R.complete ? QG_UP_OK : R.error ? QG_UP_EPROTO
                                                   : QG_UP_ECONN;
    int want_pool = R.complete && !R.at_eof && R.keep && R.end == n;
    if (G.dones != 1)
        FAIL(G.dones ? "on_done came more than once" : "on_done never came");
    if (G.after_done)
        FAIL("a callback after on_done");
    if (G.err != want_err) {
        fprintf(stderr, "fuzz: on_done %d, the reference wants %d\n", G.err,
                want_err);
        FAIL("the call ended otherwise than the reference");
    }
    if (G.heads > 1)
        FAIL("on_head came more than once");
    if (G.heads != R.final_head && (G.heads || R.complete))
        FAIL("a head delivered or missing against the reference");
    if (G.heads && (G.head.status != R.head.status ||
                    strcmp(G.head.ctype, R.head.ctype) != 0 ||
                    strcmp(G.head.retry_after, R.head.retry_after) != 0)) {
        fprintf(stderr, "fuzz: head %d [%s] [%s], reference %d [%s] [%s]\n",
                G.head.status, G.head.ctype, G.head.retry_after,
                R.head.status, R.head.ctype, R.head.retry_after);
        FAIL("the head differs from the reference");
    }
    if (R.complete ? G.blen != R.blen : G.blen > R.blen)
        FAIL("the body's length differs from the reference");
    if (G.blen && memcmp(G.body, R.body, G.blen) != 0)
        FAIL("the body differs from the reference");
    if ((pooled == 1) != want_pool || pooled > 1)
        FAIL(want_pool ? "a clean keep-alive answer's connection was not "
                         "kept" : "a connection was kept after an answer "
                         "that cannot be followed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    qg_upcall *call;
    size_t at = 0, req_got = 0, pooled;
    int sfd = -1, peer_closed = 0, turns = 0;
    unsigned seed;
    if (size < 2)
        return 0;
    if (!up)
        LLVMFuzzerInitialize(NULL, NULL);
    cur_data = data;
    cur_size = size;
    seed = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    ref_run(s, n);
    G.heads = G.dones = G.err = G.after_done = 0;
    G.blen = 0;
    memset(&G.head, 0, sizeof G.head);

    call = qg__upstream_send(up, 0, base, REQ_HEAD, sizeof REQ_HEAD - 1,
                            REQ_BODY, sizeof REQ_BODY - 1, &cbs, NULL);
    if (!call)
        abort();
    /* the upstream's side of the connection, and the whole request */
    while (sfd < 0 || req_got < sizeof REQ_HEAD - 1 + sizeof REQ_BODY - 1) {
        pump();
        if (sfd < 0)
            sfd = accept4(lfd, (struct sockaddr *)&a, &alen,
                          SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (sfd >= 0 && drain(sfd, &req_got))
            FAIL("the client closed before sending its request");
        if (++turns > PUMP_LIMIT)
            FAIL("the request never arrived");
    }
    /* the answer, in pieces */
    while (at < n && !peer_closed) {
        size_t k = next_piece(data[0] & 3, &seed, at), end;
        end = k > n - at ? n : at + k;
        while (at < end && !peer_closed) {
            ssize_t w = send(sfd, s + at, end - at, MSG_NOSIGNAL);
            if (w > 0)
                at += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                peer_closed = 1;    /* the client gave up: it said why */
            pump();
            peer_closed |= drain(sfd, &req_got);
            if (++turns > PUMP_LIMIT)
                FAIL("the client stopped reading");
        }
    }
    pump();
    peer_closed |= drain(sfd, &req_got);
    pooled = G.dones ? qg__upstream_connections(up) : 0;
    /* the close: every call ends, no connection is left */
    shutdown(sfd, SHUT_WR);
    turns = 0;
    while (!G.dones || qg__upstream_connections(up) > 0) {
        pump();
        if (++turns > PUMP_LIMIT)
            FAIL(G.dones ? "a connection outlived the upstream's close"
                         : "the call never ended");
    }
    close(sfd);
    check(n, pooled);
    return 0;
}
