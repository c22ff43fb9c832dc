/* fuzz_http_request.c - the HTTP server's request path (src/http: conn.c
 * reading, request.c's parser callbacks, pipelining, limits, responses)
 * fed arbitrary bytes over a real loopback connection, in this thread.
 *
 * One server (qg__http_server_new: one worker, port 0, small limits) is
 * made once; its worker's event loop is not run on a thread but pumped
 * here (event_base_loop EVLOOP_NONBLOCK), so each input runs the same
 * way every time.  Per input: connect, send the bytes in pieces (pumping
 * between them, so the server reads each piece alone and the parser's
 * callbacks see names, values and bodies split anywhere), half-close,
 * and read the answers until the server closes.
 *
 * Input: byte 0 chooses the piece sizes (whole, 1 byte at first, or
 * sizes from a generator seeded by byte 1) and how the handler answers (at once, a
 * streamed response, or either later from a loop callback); the rest is
 * what the client sends.
 *
 * The reference is libhttp-parser run plainly over the same bytes with
 * the documented limits (http.h: header bytes counted as request.c counts
 * them, 431; body bytes, 413; anything malformed, 400) and keep-alive
 * rule (HTTP/1.1, no Connection: close, no upgrade).  Checked:
 *  - every request the handler gets equals the reference's message at
 *    the same place (method, path, query, headers as trimmed, body), and
 *    its strings are NUL-terminated and within the limits;
 *  - the answers parse as HTTP responses, 1xx aside one per request in
 *    order (each carries its request's index), then the error the
 *    reference expects, if any; then the server closes.  A server
 *    stricter than the reference (fewer requests, then a 4xx) passes, as
 *    does an error answer to a request cut short by the end of input, and
 *    a 413 as soon as a chunk's size exceeds what the body may still hold.
 * A disagreement aborts. */
#include <errno.h>
#include <limits.h>
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
#include "http.h"
#include "http_internal.h"

#define MAX_HDR 2048
#define MAX_BODY 4096
#define MAX_REQS 4096
#define MAX_HEADERS 32
#define OUT_CAP (1u << 20)
#define PUMP_LIMIT 200000   /* loop turns without the server closing */

/* ---- a request as seen (by the handler, or by the reference) */

typedef struct hdr {
    char *name, *value;
    size_t nlen, vlen;
} hdr;

typedef struct msg {
    int method;                 /* QG_HTTP_* */
    char *url;                  /* reference: the raw URL */
    char *path, *query;         /* handler: as given */
    hdr h[MAX_HEADERS];
    int nh, nh_over;            /* more headers than kept */
    char *body;
    size_t body_len;
    int keep;                   /* reference: keep-alive after it */
} msg;

typedef struct seen {
    msg m[MAX_REQS];
    int n;
} seen;

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d)
        abort();
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static char *append(char *old, size_t *len, const char *s, size_t n)
{
    char *d = realloc(old, *len + n + 1);
    if (!d)
        abort();
    if (n)
        memcpy(d + *len, s, n);
    *len += n;
    d[*len] = '\0';
    return d;
}

static void msg_free(msg *m)
{
    free(m->url);
    free(m->path);
    free(m->query);
    for (int i = 0; i < m->nh; i++) {
        free(m->h[i].name);
        free(m->h[i].value);
    }
    free(m->body);
    memset(m, 0, sizeof *m);
}

static void seen_reset(seen *s)
{
    for (int i = 0; i < s->n; i++)
        msg_free(&s->m[i]);
    s->n = 0;
}

/* ---- the server and its handler */

static qg_http_server *srv;
static struct event_base *base;
static int port;
static const uint8_t *cur_data;
static size_t cur_size;
static int answer_mode;         /* 0 now, 1 stream, 2 later, 3 later stream */
static seen got;
static qg_http_req *later[MAX_REQS];
static int later_idx[MAX_REQS];
static int nlater;
static struct event *later_ev;

static void answer(qg_http_req *r, int idx, int stream)
{
    char body[32];
    int n = snprintf(body, sizeof body, "r%d", idx);
    if (!stream) {
        qg__http_respond(r, 200, NULL, 0, "text/plain", body, (size_t)n);
        return;
    }
    if (qg__http_stream_start(r, 200, NULL, 0, "text/plain") == 0) {
        qg__http_stream_write(r, body, (size_t)n);
        qg__http_stream_write(r, "-s", 2);
    }
    qg__http_stream_end(r);
}

static void on_later(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    for (int i = 0; i < nlater; i++)
        answer(later[i], later_idx[i], answer_mode == 3);
    nlater = 0;
}

static void handler(qg_http_req *r, void *ud)
{
    msg *m;
    size_t hbytes;
    (void)ud;
    if (got.n == MAX_REQS)
        fuzz_fail("too many requests", cur_data, cur_size);
    m = &got.m[got.n];
    if (r->method < QG_HTTP_GET || r->method > QG_HTTP_OTHER || !r->path ||
        !r->query || !r->body || r->body[r->body_len] != '\0' ||
        r->body_len > MAX_BODY || r->nheaders < 0)
        fuzz_fail("a malformed qg_http_req", cur_data, cur_size);
    m->method = r->method;
    m->path = dup_n(r->path, strlen(r->path));
    m->query = dup_n(r->query, strlen(r->query));
    m->body = dup_n(r->body, r->body_len);
    m->body_len = r->body_len;
    hbytes = strlen(r->path) + strlen(r->query);
    for (int i = 0; i < r->nheaders; i++) {
        const qg_http_header *h = &r->headers[i];
        if (h->name[h->name_len] != '\0' || h->value[h->value_len] != '\0')
            fuzz_fail("a header not NUL-terminated", cur_data, cur_size);
        if (h->value_len && (h->value[h->value_len - 1] == ' ' ||
                             h->value[h->value_len - 1] == '\t'))
            fuzz_fail("a header value not trimmed", cur_data, cur_size);
        hbytes += h->name_len + h->value_len + 4;
        if (i < MAX_HEADERS) {
            m->h[i].name = dup_n(h->name, h->name_len);
            m->h[i].nlen = h->name_len;
            m->h[i].value = dup_n(h->value, h->value_len);
            m->h[i].vlen = h->value_len;
            m->nh = i + 1;
        } else {
            m->nh_over = 1;
        }
        if (qg__http_header_get(r, h->name, NULL) == NULL)
            fuzz_fail("qg__http_header_get misses a header", cur_data,
                      cur_size);
    }
    if (hbytes > MAX_HDR)
        fuzz_fail("a request over the header limit was handled", cur_data,
                  cur_size);
    got.n++;
    if (answer_mode < 2) {
        answer(r, got.n - 1, answer_mode == 1);
        return;
    }
    later_idx[nlater] = got.n - 1;
    later[nlater++] = r;
    event_active(later_ev, EV_TIMEOUT, 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    qg_http_opts o = {
        .host = "127.0.0.1", .port = 0, .workers = 1,
        .max_header_bytes = MAX_HDR, .max_body_bytes = MAX_BODY,
        .header_timeout_ms = 600000, .idle_timeout_ms = 600000,
    };
    char err[256];
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    srv = qg__http_server_new(&o, handler, NULL, err, sizeof err);
    if (!srv) {
        fprintf(stderr, "fuzz_http_request: %s\n", err);
        abort();
    }
    port = qg__http_server_port(srv);
    base = srv->workers[0].base;
    later_ev = event_new(base, -1, 0, on_later, NULL);
    if (!later_ev)
        abort();
    return 0;
}

/* ---- the reference */

typedef struct refp {
    seen s;
    msg cur;
    int in_msg;                 /* inside a message */
    int in_headers, hkind, kept;
    size_t hbytes, body;
    int err_status;             /* 431 or 413 set by a callback */
    int stop;                   /* after a message that does not keep alive */
    int chunk_over;             /* index of the message whose chunk size
                                   announced more than the body limit, -1 */
} refp;

static int rb_begin(http_parser *p)
{
    refp *f = p->data;
    msg_free(&f->cur);
    f->in_msg = 1;
    f->in_headers = 1;
    f->hkind = 0;
    f->hbytes = 16;
    f->body = 0;
    return 0;
}

static int hcount(refp *f, size_t n)
{
    f->hbytes += n;
    if (f->hbytes > MAX_HDR) {
        f->err_status = 431;
        return -1;
    }
    return 0;
}

static int rb_url(http_parser *p, const char *at, size_t n)
{
    refp *f = p->data;
    size_t len = f->cur.url ? strlen(f->cur.url) : 0;
    if (hcount(f, n))
        return -1;
    f->cur.url = append(f->cur.url, &len, at, n);
    return 0;
}

static int rb_field(http_parser *p, const char *at, size_t n)
{
    refp *f = p->data;
    hdr *h;
    if (!f->in_headers)
        return 0;                   /* trailers are ignored */
    if (f->hkind != 1) {
        if (hcount(f, 4))
            return -1;
        f->kept = f->cur.nh < MAX_HEADERS;
        if (f->kept)
            f->cur.nh++;
        else
            f->cur.nh_over = 1;
        f->hkind = 1;
    }
    if (hcount(f, n))
        return -1;
    if (f->kept) {
        h = &f->cur.h[f->cur.nh - 1];
        h->name = append(h->name, &h->nlen, at, n);
    }
    return 0;
}

static int rb_value(http_parser *p, const char *at, size_t n)
{
    refp *f = p->data;
    if (!f->in_headers || f->hkind == 0)
        return 0;
    f->hkind = 2;
    if (hcount(f, n))
        return -1;
    if (f->kept) {
        hdr *h = &f->cur.h[f->cur.nh - 1];
        h->value = append(h->value, &h->vlen, at, n);
    }
    return 0;
}

static int rb_headers_done(http_parser *p)
{
    refp *f = p->data;
    int chunked = (p->flags & F_CHUNKED) != 0;
    f->in_headers = 0;
    /* decided by the head: a Connection field among chunked trailers is
     * ignored, as trailers may not carry one (RFC 9110, 6.5.1) */
    f->cur.keep = http_should_keep_alive(p) && p->http_major == 1 &&
                  p->http_minor >= 1 && !p->upgrade;
    if (!chunked && p->content_length != ULLONG_MAX &&
        p->content_length > MAX_BODY) {
        f->err_status = 413;
        return -1;
    }
    return 0;
}

static int rb_body(http_parser *p, const char *at, size_t n)
{
    refp *f = p->data;
    if (f->cur.body_len + n > MAX_BODY) {
        f->err_status = 413;
        return -1;
    }
    f->cur.body = append(f->cur.body, &f->cur.body_len, at, n);
    return 0;
}

/* A chunk bigger than what the body may still hold: the server may
 * answer 413 at once (issue 8) instead of waiting for its bytes. */
static int rb_chunk(http_parser *p)
{
    refp *f = p->data;
    if (f->chunk_over < 0 && p->content_length > MAX_BODY - f->cur.body_len)
        f->chunk_over = f->s.n;
    return 0;
}

static int method_of(unsigned m)
{
    switch (m) {
    case HTTP_GET: return QG_HTTP_GET;
    case HTTP_POST: return QG_HTTP_POST;
    case HTTP_PUT: return QG_HTTP_PUT;
    case HTTP_DELETE: return QG_HTTP_DELETE;
    case HTTP_HEAD: return QG_HTTP_HEAD;
    default: return QG_HTTP_OTHER;
    }
}

static int rb_done(http_parser *p)
{
    refp *f = p->data;
    msg *m;
    if (f->s.n == MAX_REQS)
        return -1;
    f->in_msg = 0;
    m = &f->s.m[f->s.n++];
    *m = f->cur;
    memset(&f->cur, 0, sizeof f->cur);
    m->method = method_of(p->method);
    if (!m->url)
        m->url = dup_n("", 0);
    if (!m->body)
        m->body = dup_n("", 0);
    for (int i = 0; i < m->nh; i++) {
        if (!m->h[i].value)
            m->h[i].value = dup_n("", 0);
        if (!m->h[i].name)
            m->h[i].name = dup_n("", 0);
        while (m->h[i].vlen && (m->h[i].value[m->h[i].vlen - 1] == ' ' ||
                                m->h[i].value[m->h[i].vlen - 1] == '\t'))
            m->h[i].value[--m->h[i].vlen] = '\0';
    }
    if (!m->keep) {
        f->stop = 1;
        return -1;                  /* nothing after it is read */
    }
    return 0;
}

static const http_parser_settings ref_settings = {
    .on_message_begin = rb_begin, .on_url = rb_url,
    .on_header_field = rb_field, .on_header_value = rb_value,
    .on_headers_complete = rb_headers_done, .on_body = rb_body,
    .on_message_complete = rb_done, .on_chunk_header = rb_chunk,
};

/* Parse the whole input: the messages the server must hand over, and the
 * status it must answer after them (0: none; the input ends inside a
 * message, *partial, or after the last one). */
static int ref_run(const char *s, size_t n, refp *f, int *partial)
{
    http_parser p;
    size_t done;
    enum http_errno e;
    /* f->s is empty (seen_reset); the rest is small */
    memset(&f->cur, 0, sizeof f->cur);
    f->in_msg = f->in_headers = f->hkind = f->kept = 0;
    f->hbytes = f->body = 0;
    f->err_status = f->stop = 0;
    f->chunk_over = -1;
    http_parser_init(&p, HTTP_REQUEST);
    p.data = f;
    done = http_parser_execute(&p, &ref_settings, s, n);
    e = HTTP_PARSER_ERRNO(&p);
    msg_free(&f->cur);
    *partial = !f->stop && e == HPE_OK && done == n && f->in_msg;
    if (f->stop || (e == HPE_OK && done == n) || (p.upgrade && e == HPE_OK))
        return 0;
    if (f->err_status)
        return f->err_status;
    return e == HPE_HEADER_OVERFLOW ? 431 : 400;
}

/* ---- comparing */

static void same_request(const msg *g, const msg *r)
{
    const char *url = r->url, *q;
    size_t plen;
    int absolute = !strncasecmp(url, "http://", 7) ||
                   !strncasecmp(url, "https://", 8);
    if (g->method != r->method || g->body_len != r->body_len ||
        memcmp(g->body, r->body, r->body_len) != 0 ||
        g->nh != r->nh || g->nh_over != r->nh_over)
        fuzz_fail("a request differs from the reference", cur_data,
                  cur_size);
    for (int i = 0; i < r->nh; i++)
        if (g->h[i].nlen != r->h[i].nlen || g->h[i].vlen != r->h[i].vlen ||
            memcmp(g->h[i].name, r->h[i].name, r->h[i].nlen) != 0 ||
            memcmp(g->h[i].value, r->h[i].value, r->h[i].vlen) != 0)
            fuzz_fail("a header differs from the reference", cur_data,
                      cur_size);
    if (absolute)
        return;                     /* the path is cut from the authority */
    q = strchr(url, '?');
    plen = q ? (size_t)(q - url) : strlen(url);
    if (plen == 0 ? strcmp(g->path, "/") != 0
                  : strlen(g->path) != plen || memcmp(g->path, url, plen) ||
        strcmp(g->query, q ? q + 1 : "") != 0)
        fuzz_fail("a path or query differs from the reference", cur_data,
                  cur_size);
}

/* The answers, parsed as responses; HEAD answers have no body. */
typedef struct resp {
    int status[MAX_REQS + 2];
    char body[MAX_REQS + 2][64];
    size_t blen[MAX_REQS + 2];
    int n;
    const seen *g;
} resp;

static int rs_begin(http_parser *p)
{
    resp *r = p->data;
    if (r->n <= MAX_REQS)
        r->blen[r->n] = 0;
    return 0;
}

static int rs_headers(http_parser *p)
{
    resp *r = p->data;
    if (p->status_code < 200)
        return 0;
    if (r->n < r->g->n && r->g->m[r->n].method == QG_HTTP_HEAD)
        return 1;                   /* no body follows */
    return 0;
}

static int rs_body(http_parser *p, const char *at, size_t n)
{
    resp *r = p->data;
    if (r->n <= MAX_REQS) {
        size_t k = n;
        if (r->blen[r->n] + k > sizeof r->body[0] - 1)
            k = sizeof r->body[0] - 1 - r->blen[r->n];
        memcpy(r->body[r->n] + r->blen[r->n], at, k);
        r->blen[r->n] += k;
    }
    return 0;
}

static int rs_done(http_parser *p)
{
    resp *r = p->data;
    if (p->status_code < 200)
        return 0;                   /* 100 Continue */
    if (r->n > MAX_REQS)
        return -1;
    r->status[r->n++] = p->status_code;
    return 0;
}

static const http_parser_settings resp_settings = {
    .on_message_begin = rs_begin, .on_headers_complete = rs_headers,
    .on_body = rs_body, .on_message_complete = rs_done,
};

static void check_answers(const char *out, size_t n, int want_err,
                          int ref_n, int cut_short, int chunk_over)
{
    static resp r;
    http_parser p;
    size_t done;
    r.n = 0;                        /* blen: zeroed per message */
    r.g = &got;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &r;
    done = http_parser_execute(&p, &resp_settings, out, n);
    if (done == n && HTTP_PARSER_ERRNO(&p) == HPE_OK)
        http_parser_execute(&p, &resp_settings, NULL, 0);   /* EOF */
    if (HTTP_PARSER_ERRNO(&p) != HPE_OK)
        fuzz_fail("the answers are not HTTP responses", cur_data, cur_size);
    for (int i = 0; i < got.n && i < r.n; i++) {
        char want[32];
        int k = snprintf(want, sizeof want, answer_mode & 1 ? "r%d-s" : "r%d",
                         i);
        if (r.status[i] != 200 ||
            (got.m[i].method != QG_HTTP_HEAD &&
             (r.blen[i] != (size_t)k || memcmp(r.body[i], want, k) != 0)))
            fuzz_fail("an answer out of order or damaged", cur_data,
                      cur_size);
    }
    if (got.n == chunk_over && r.n == got.n + 1 && r.status[got.n] == 413)
        return;                     /* 413 at the chunk size */
    if (got.n == ref_n) {
        if (want_err ? r.n != got.n + 1 || r.status[got.n] != want_err
                     : r.n != got.n &&
                       !(cut_short && r.n == got.n + 1 &&
                         r.status[got.n] >= 400))
            fuzz_fail("the answers differ from the reference", cur_data,
                      cur_size);
    } else if (r.n != got.n + 1 || r.status[got.n] < 400 ||
               r.status[got.n] > 499) {
        fuzz_fail("requests were dropped without an error answer",
                  cur_data, cur_size);
    }
}

/* ---- driving */

static unsigned long open_conns(void)
{
    qg_http_stats st;
    qg__http_server_stats(srv, &st);
    return (unsigned long)st.connections_open;
}

/* Run the server's loop a few turns and take what it sent. */
static int pump(int fd, char *out, size_t *outlen, int *eof)
{
    int progress = 0;
    for (int i = 0; i < 2; i++)     /* a read, then what it activated */
        event_base_loop(base, EVLOOP_NONBLOCK);
    while (!*eof) {
        ssize_t k = recv(fd, out + *outlen, OUT_CAP - *outlen, 0);
        if (k > 0) {
            *outlen += (size_t)k;
            progress = 1;
            if (*outlen == OUT_CAP)
                fuzz_fail("answers too long", cur_data, cur_size);
        } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
            *eof = 1;               /* closed (a reset too) */
            progress = 1;
        } else {
            break;
        }
    }
    return progress;
}

/* Piece sizes: 0 whole; 1 byte by byte for the first 128 bytes, then
 * the rest; 2 and 3 from a generator, up to 64 or 512 bytes. */
static size_t next_piece(int mode, unsigned *seed, size_t at)
{
    if (mode == 0)
        return (size_t)-1;
    if (mode == 1)
        return at < 128 ? 1 : (size_t)-1;
    *seed = *seed * 1103515245u + 12345u;
    return 1 + (*seed >> 16) % (mode == 2 ? 64 : 512);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char out[OUT_CAP];
    static refp ref;
    struct sockaddr_in a = {0};
    size_t outlen = 0, at = 0;
    int fd, eof = 0, want_err, turns = 0, partial = 0;
    unsigned seed;
    if (size < 2)
        return 0;
    if (!srv)
        LLVMFuzzerInitialize(NULL, NULL);
    cur_data = data;
    cur_size = size;
    answer_mode = (data[0] >> 2) & 3;
    seed = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    want_err = ref_run(s, n, &ref, &partial);

    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        abort();
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 &&
        errno != EINPROGRESS)
        abort();
    pump(fd, out, &outlen, &eof);
    while (at < n && !eof) {
        size_t k = next_piece(data[0] & 3, &seed, at), end;
        end = k > n - at ? n : at + k;
        while (at < end && !eof) {  /* one piece, then the server reads */
            ssize_t w = send(fd, s + at, end - at, MSG_NOSIGNAL);
            if (w > 0)
                at += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                eof = 1;            /* the server closed: it answered */
            pump(fd, out, &outlen, &eof);
            if (++turns > PUMP_LIMIT)
                fuzz_fail("the server stopped reading", data, size);
        }
    }
    turns = 0;
    shutdown(fd, SHUT_WR);
    while (!eof || open_conns() > 0) {
        pump(fd, out, &outlen, &eof);
        if (++turns > PUMP_LIMIT)
            fuzz_fail("the server never closed the connection", data, size);
    }
    close(fd);

    if (got.n > ref.s.n)
        fuzz_fail("more requests than the reference", data, size);
    for (int i = 0; i < got.n; i++)
        same_request(&got.m[i], &ref.s.m[i]);
    check_answers(out, outlen, want_err, ref.s.n, partial, ref.chunk_over);
    seen_reset(&got);
    seen_reset(&ref.s);
    nlater = 0;
    return 0;
}
