/* conn.c - one HTTP connection: accept, read, feed the parser (request.c),
 * write the response, time out, close.
 *
 * Why not bufferevents or evhttp: they cost ~7 system calls per request.
 * Here a keep-alive request costs one recv and one send (plus a share of
 * epoll_wait): the read event stays armed for the connection's life, the
 * write event is armed only when the socket buffer is full, and timeouts
 * are deadlines checked by a periodic sweep (server.c) rather than timers
 * re-armed per request.  Buffers live with the connection and are reused,
 * so a request normally allocates nothing.
 *
 * One request at a time: the parser pauses at the end of each message, so
 * bytes of a pipelined next request wait in the input buffer until the
 * current one is answered (and its response fully handed to the kernel:
 * that is the backpressure on a client that does not read).
 *
 * Lifetime: code reached from an event callback or qg__http_respond only
 * marks a connection want_close; the outermost entry point (nest == 0)
 * closes it in conn_end.  While the handler holds the request (busy) the
 * object outlives its socket, and qg__http_respond frees it.  Closing a
 * held request's socket (the client's EOF or reset, a failed write, a
 * write stuck past idle_timeout_ms) marks it gone and runs the owner's
 * on_close hook from notify_ev, a per-connection event activated by hand
 * so that hooks never run inside the owner's own calls.
 *
 * Limits (http.h, limits.c): accept() makes room before it takes a
 * connection, by shedding the oldest idle one, else the oldest unfinished
 * read (of the same address when the address is at its limit), or
 * refuses the new one when nothing can be shed.  Each phase change puts
 * the connection in the right shed queue; the sweep counts what it
 * closes at a deadline by reason.
 *
 * Streaming (qg_http_stream_*): the head is queued like a response with
 * chunked framing (or none, for HTTP/1.0, ending at close); each write is
 * one sendmsg of chunk header, data and CRLF when nothing is pending, else
 * appended to out (compacted as the socket drains its front).  Pending
 * bytes above stream_high_water make writes return 1; on_write kicks the
 * owner's on_drain once they fall to a quarter of it. */
#include <errno.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "http_internal.h"

enum { IN_INIT = 4096, IN_SOFT = 64 * 1024, LINGER_MS = 2000,
       OUT_KEEP = 256 * 1024 };    /* a bigger idle out buffer is freed */

/* How a response body is delimited. */
enum { FR_LENGTH, FR_CHUNKED, FR_CLOSE };

static void conn_process(qg__conn *c);

/* ---- small helpers --------------------------------------------------- */

static void rev_set(qg__conn *c, int on)
{
    if (c->fd < 0 || c->rev_on == (unsigned)!!on)
        return;
    if ((on ? event_add(&c->rev, NULL) : event_del(&c->rev)) == 0)
        c->rev_on = !!on;
    else if (on)
        c->want_close = 1;
}

static void wev_set(qg__conn *c, int on)
{
    if (c->fd < 0 || c->wev_on == (unsigned)!!on)
        return;
    if ((on ? event_add(&c->wev, NULL) : event_del(&c->wev)) == 0)
        c->wev_on = !!on;
    else if (on)
        c->want_close = 1;
}

/* ---- writing ---------------------------------------------------------- */

static const char *reason(int status)
{
    static const struct { int code; const char *text; } tab[] = {
        { 100, "Continue" }, { 200, "OK" }, { 201, "Created" },
        { 202, "Accepted" }, { 204, "No Content" },
        { 301, "Moved Permanently" }, { 302, "Found" },
        { 304, "Not Modified" }, { 400, "Bad Request" },
        { 401, "Unauthorized" }, { 402, "Payment Required" },
        { 403, "Forbidden" }, { 404, "Not Found" },
        { 405, "Method Not Allowed" }, { 408, "Request Timeout" },
        { 409, "Conflict" }, { 413, "Content Too Large" },
        { 415, "Unsupported Media Type" }, { 422, "Unprocessable Content" },
        { 429, "Too Many Requests" },
        { 431, "Request Header Fields Too Large" },
        { 500, "Internal Server Error" }, { 501, "Not Implemented" },
        { 502, "Bad Gateway" }, { 503, "Service Unavailable" },
        { 504, "Gateway Timeout" },
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (tab[i].code == status)
            return tab[i].text;
    return status < 300 ? "OK" : status < 400 ? "Redirect"
         : status < 500 ? "Client Error" : "Server Error";
}

static char *put(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

static char *put_u(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* 1: all written; 0: waiting for EV_WRITE; -1: error (want_close set). */
int qg__conn_flush(qg__conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            wev_set(c, 1);
            qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
            return 0;
        } else {
            c->want_close = 1;
            return -1;
        }
    }
    c->out_off = c->out_len = 0;
    wev_set(c, 0);
    return 1;
}

static size_t pending(const qg__conn *c)
{
    return c->out_len - c->out_off;
}

/* Room for n more bytes at the end of out, moving the unsent rest to the
 * front first when that avoids growing (a stream keeps appending while
 * the socket drains the front). */
static int out_room(qg__conn *c, size_t n)
{
    if (c->out_off > 0 && c->out_len + n > c->out_cap) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    return qg__reserve(&c->out, &c->out_cap, c->out_len + n, SIZE_MAX / 2);
}

/* Send the iovecs now if nothing is pending, buffer what the socket does
 * not take (all of it behind pending output).  -1: dead socket or no
 * memory. */
static int out_sendv(qg__conn *c, const struct iovec *iov, int niov)
{
    size_t total = 0, sent = 0;
    int was_empty = pending(c) == 0;
    for (int i = 0; i < niov; i++)
        total += iov[i].iov_len;
    if (was_empty) {
        struct msghdr mh = { .msg_iov = (struct iovec *)iov,
                             .msg_iovlen = (size_t)niov };
        ssize_t n;
        c->out_off = c->out_len = 0;
        do
            n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        sent = n < 0 ? 0 : (size_t)n;
        if (sent == total)
            return 0;
    }
    if (out_room(c, total - sent) < 0)
        return -1;
    for (int i = 0; i < niov; i++) {
        size_t l = iov[i].iov_len;
        const char *b = iov[i].iov_base;
        if (sent >= l) {
            sent -= l;
            continue;
        }
        memcpy(c->out + c->out_len, b + sent, l - sent);
        c->out_len += l - sent;
        sent = 0;
    }
    if (was_empty) {
        wev_set(c, 1);
        qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
    }
    return 0;
}

/* Format a response and send it; what the socket does not take now is
 * kept in out (the body is passed by iovec, not copied, when nothing is
 * pending).  framing FR_CHUNKED / FR_CLOSE: the head of a stream (len
 * 0).  Returns -1 on a dead socket or no memory. */
static int conn_queue(qg__conn *c, int status, const qg_http_out_header *hs,
                      int nhs, const char *ctype, const char *body,
                      size_t len, int keep, int framing)
{
    const char *why = reason(status), *date = qg__date(c->w);
    int with_body = !c->head && len > 0;
    int no_len = status < 200 || status == 204;
    int direct = c->out_off == c->out_len;
    size_t need = 160 + strlen(why) + strlen(ctype) + strlen(date), hlen, sent;
    char *p0, *p;
    ssize_t n;
    for (int i = 0; i < nhs; i++)
        need += strlen(hs[i].name) + strlen(hs[i].value) + 4;
    if (direct)
        c->out_off = c->out_len = 0;
    if (qg__reserve(&c->out, &c->out_cap, c->out_len + need +
                (with_body && !direct ? len : 0), SIZE_MAX / 2) < 0)
        return -1;
    p = p0 = c->out + c->out_len;
    p = put(p, "HTTP/1.1 ");
    p = put_u(p, (uint64_t)status);
    *p++ = ' ';
    p = put(p, why);
    p = put(put(put(p, "\r\nContent-Type: "), ctype), "\r\n");
    if (!no_len && framing == FR_LENGTH)
        p = put(put_u(put(p, "Content-Length: "), len), "\r\n");
    else if (!no_len && framing == FR_CHUNKED)
        p = put(p, "Transfer-Encoding: chunked\r\n");
    p = put(p, keep ? "Connection: keep-alive\r\nDate: "
                    : "Connection: close\r\nDate: ");
    p = put(put(p, date), "\r\n");
    for (int i = 0; i < nhs; i++)
        p = put(put(put(put(p, hs[i].name), ": "), hs[i].value), "\r\n");
    p = put(p, "\r\n");
    hlen = (size_t)(p - p0);
    if (!direct) {                      /* behind unsent output: append */
        c->out_len += hlen;
        if (with_body) {
            memcpy(c->out + c->out_len, body, len);
            c->out_len += len;
        }
        return 0;
    }
    {
        struct iovec iov[2] = { { p0, hlen }, { (void *)body, len } };
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = with_body ? 2 : 1 };
        do
            n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return -1;
    sent = n < 0 ? 0 : (size_t)n;
    if (!with_body)
        len = 0;
    if (sent >= hlen + len) {
        c->out_off = c->out_len = 0;
        return 0;
    }
    if (sent < hlen) {                  /* keep the header's rest, add body */
        c->out_off = sent;
        c->out_len = hlen;
    } else {
        body += sent - hlen;
        len -= sent - hlen;
        c->out_off = c->out_len = 0;
    }
    if (len > 0) {
        if (qg__reserve(&c->out, &c->out_cap, c->out_len + len, SIZE_MAX / 2) < 0)
            return -1;
        memcpy(c->out + c->out_len, body, len);
        c->out_len += len;
    }
    wev_set(c, 1);
    qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
    return 0;
}

/* Output is empty: after a last response shut our side and wait (briefly)
 * for the client's FIN, so unread input does not turn close() into a RST
 * that could destroy the response; otherwise wait for the next request. */
static void conn_written(qg__conn *c)
{
    if (c->busy || c->fd < 0 || c->want_close)
        return;
    if (c->out_cap > OUT_KEEP && pending(c) == 0) {  /* after a big one */
        free(c->out);
        c->out = NULL;
        c->out_cap = c->out_off = c->out_len = 0;
    }
    if (c->closing) {
        if (c->rd_eof || c->w->stopping) {
            c->want_close = 1;
            return;
        }
        shutdown(c->fd, SHUT_WR);
        c->phase = PH_LINGER;
        qg__set_deadline(c, LINGER_MS < qg__opts(c)->idle_timeout_ms
                        ? LINGER_MS : qg__opts(c)->idle_timeout_ms);
        rev_set(c, 1);
        qg__conn_enqueue(c, Q_IDLE);
    } else if (c->phase == PH_HANDLER) {
        c->phase = PH_IDLE;
        qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
        qg__conn_enqueue(c, Q_IDLE);
    }
}

static void conn_error(qg__conn *c, int status)
{
    const qg_http_opts *o = qg__opts(c);
    const char *type, *msg;
    char body[200];
    int n;
    switch (status) {
    case 400: type = "invalid_request"; msg = "malformed HTTP request"; break;
    case 408: type = "timeout"; msg = "request not received in time"; break;
    case 413: type = "request_too_large"; msg = "request body too large"; break;
    case 431: type = "headers_too_large"; msg = "request headers too large";
        break;
    default: type = "internal"; msg = "out of memory"; break;
    }
    n = snprintf(body, sizeof body,
                 "{\"error\":{\"type\":\"%s\",\"message\":\"%s (limits: "
                 "headers %zu bytes, body %zu bytes)\"}}",
                 type, msg, o->max_header_bytes, o->max_body_bytes);
    if (status == 400 || status == 408 || status >= 500)
        n = snprintf(body, sizeof body,
                     "{\"error\":{\"type\":\"%s\",\"message\":\"%s\"}}",
                     type, msg);
    c->closing = 1;
    c->head = 0;
    qg__stat_add(&c->w->st_errors, 1);
    if (conn_queue(c, status, NULL, 0, "application/json", body,
                   (size_t)n, 0, FR_LENGTH) < 0)
        c->want_close = 1;
    else if (c->out_len == 0)
        conn_written(c);
}

/* Parse what is buffered, one request at a time: stop while the handler
 * holds a request or a response is still being written. */
static void conn_process(qg__conn *c)
{
    while (!c->busy && !c->closing && !c->want_close && c->fd >= 0 &&
           c->out_len == 0 && c->in_off < c->in_len) {
        size_t n = http_parser_execute(&c->hp, &qg__parser_settings, c->in + c->in_off,
                                       c->in_len - c->in_off);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->hp);
        c->in_off += n;
        if (c->want_close)
            break;
        if (c->msg_done) {
            c->msg_done = 0;
            http_parser_pause(&c->hp, 0);
            qg__conn_dispatch(c);
        } else if (e != HPE_OK) {
            conn_error(c, c->err_status ? c->err_status
                        : e == HPE_HEADER_OVERFLOW ? 431 : 400);
            break;
        }
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    if (c->rd_full && c->in_len < c->in_cap) {
        c->rd_full = 0;
        rev_set(c, 1);
    }
}

/* ---- connection life -------------------------------------------------- */

static void conn_shutdown(qg__conn *c)
{
    if (c->fd < 0)
        return;
    if (c->rev_on)
        event_del(&c->rev);
    if (c->wev_on)
        event_del(&c->wev);
    c->rev_on = c->wev_on = 0;
    close(c->fd);
    c->fd = -1;
    qg__conn_enqueue(c, Q_NONE);
    qg__addr_remove(c);
    c->w->nopen--;
    qg__stat_add(&c->w->st_open, -1);
}

static void conn_free(qg__conn *c)
{
    qg__worker *w = c->w;
    conn_shutdown(c);
    event_del(&c->notify_ev);
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->in);
    free(c->out);
    free(c->ar);
    free(c->ho);
    free(c->hdrs);
    free(c->body);
    free(c);
}

static void notify_kick(qg__conn *c)
{
    event_active(&c->notify_ev, EV_TIMEOUT, 1);
}

/* End of an entry point: close if asked, unless we are nested.  Closed
 * while the handler holds the request: the client is gone (on_close). */
static void conn_end(qg__conn *c)
{
    qg__worker *w = c->w;
    if (c->nest > 0 || !c->want_close)
        return;
    conn_shutdown(c);
    if (!c->busy) {
        conn_free(c);
    } else if (!c->gone) {
        c->gone = 1;
        if (c->close_fn && !c->close_fired)
            notify_kick(c);
    }
    if (w->stopping)
        qg__worker_check_exit(w);
}

static void conn_read(qg__conn *c)
{
    const qg_http_opts *o = qg__opts(c);
    size_t space;
    ssize_t n;
    if (c->closing && !c->busy) {       /* answered for good: discard */
        n = recv(c->fd, c->in, c->in_cap, 0);
        c->in_off = c->in_len = 0;
        if (n == 0) {
            c->rd_eof = 1;
            rev_set(c, 0);
            if (c->out_len == 0)
                c->want_close = 1;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                   errno != EINTR) {
            c->want_close = 1;
        }
        return;
    }
    if (c->in_len == c->in_cap) {
        if (c->in_off > 0) {
            memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
            c->in_len -= c->in_off;
            c->in_off = 0;
        } else if (qg__reserve(&c->in, &c->in_cap, c->in_cap + 1,
                           o->max_header_bytes + o->max_body_bytes) < 0) {
            /* Full of a pipelined request: wait for the current one. */
            rev_set(c, 0);
            c->rd_full = 1;
            return;
        }
    }
    space = c->in_cap - c->in_len;
    n = recv(c->fd, c->in + c->in_len, space, 0);
    if (n > 0) {
        c->in_len += (size_t)n;
        if (!c->busy)
            conn_process(c);
        /* A bulk upload filled the buffer: read bigger pieces. */
        if ((size_t)n == space && c->in_cap < IN_SOFT)
            qg__reserve(&c->in, &c->in_cap, c->in_cap * 2, IN_SOFT);
    } else if (n == 0) {
        c->rd_eof = 1;
        rev_set(c, 0);
        if (!c->busy && c->out_len > 0)
            c->closing = 1;             /* finish writing, then close */
        else
            c->want_close = 1;          /* held: the client is gone */
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        c->want_close = 1;
    }
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    qg__conn *c = arg;
    (void)fd;
    (void)what;
    c->nest++;
    conn_read(c);
    c->nest--;
    conn_end(c);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    qg__conn *c = arg;
    int rc;
    (void)fd;
    (void)what;
    c->nest++;
    rc = qg__conn_flush(c);
    if (rc == 1) {
        if (c->busy)
            c->deadline_ms = 0;         /* a stream waits for its producer */
        conn_written(c);
        conn_process(c);
    }
    if (rc >= 0 && c->busy && c->drain_fn &&
        pending(c) <= qg__opts(c)->stream_high_water / 4)
        notify_kick(c);
    c->nest--;
    conn_end(c);
}

/* The held request's owner hooks, run from the loop (never from inside
 * the owner's own calls): on_close once the client is gone, on_drain
 * once the pending output is low. */
static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    qg__conn *c = arg;
    void (*fn)(void *);
    void *fa;
    (void)fd;
    (void)what;
    c->nest++;
    if (c->busy && c->gone && c->close_fn && !c->close_fired) {
        fn = c->close_fn;
        fa = c->close_arg;
        c->close_fired = 1;
        c->close_fn = NULL;
        fn(fa);
    }
    if (c->busy && !c->gone && c->drain_fn &&
        pending(c) <= qg__opts(c)->stream_high_water / 4) {
        fn = c->drain_fn;
        fa = c->drain_arg;
        c->drain_fn = NULL;
        fn(fa);
    }
    if (!c->busy)
        conn_process(c);                /* released: pipelined requests */
    c->nest--;
    conn_end(c);
}

static int conn_new(qg__worker *w, int fd, const qg__akey *key)
{
    int one = 1;
    qg__conn *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->in = malloc(IN_INIT);
    if (!c->in) {
        free(c);
        return -1;
    }
    c->in_cap = IN_INIT;
    c->w = w;
    c->fd = fd;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    http_parser_init(&c->hp, HTTP_REQUEST);
    c->hp.data = c;
    event_assign(&c->rev, w->base, fd, EV_READ | EV_PERSIST, on_read, c);
    event_assign(&c->wev, w->base, fd, EV_WRITE | EV_PERSIST, on_write, c);
    event_assign(&c->notify_ev, w->base, -1, 0, on_notify, c);
    if (event_add(&c->rev, NULL) < 0) {
        free(c->in);
        free(c);
        return -1;
    }
    c->rev_on = 1;
    c->phase = PH_FIRST;
    qg__set_deadline(c, w->srv->o.header_timeout_ms);
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    c->key = *key;
    qg__addr_add(c);
    qg__conn_enqueue(c, Q_READ);
    w->nopen++;
    qg__stat_add(&w->st_open, 1);
    qg__stat_add(&w->st_total, 1);
    return 0;
}

/* Close v (idle or reading, never held) to make room.  A connection
 * with a request under way is told why when its socket takes it: a 503
 * in one send, best effort (unread input turns the close into a reset
 * that may overtake it). */
static void conn_shed(qg__conn *v)
{
    qg__worker *w = v->w;
    int slow = v->q == Q_READ;
    v->nest++;
    if (slow && v->out_len == 0) {
        static const char body[] = "{\"error\":{\"type\":\"overloaded\","
            "\"message\":\"connection closed to make room: the request "
            "was not received in time\"}}";
        v->head = 0;
        (void)conn_queue(v, 503, NULL, 0, "application/json", body,
                         sizeof body - 1, 0, FR_LENGTH);
    }
    qg__drop(w, slow ? QG_HTTP_SHED_SLOW : QG_HTTP_SHED_IDLE);
    v->want_close = 1;
    v->nest--;
    conn_end(v);                        /* frees v */
}

/* Room for a new connection from key: shed one of the address's own when
 * it is at its limit, then one of any when the worker is full.  0: no
 * room (counted as refused). */
static int conn_room(qg__worker *w, const qg__akey *key)
{
    qg__conn *v;
    if (w->per_client > 0 && qg__addr_count(w, key) >= (uint32_t)w->per_client) {
        if (!(v = qg__shed_pick(w, key))) {
            qg__drop(w, QG_HTTP_REFUSED_PER_CLIENT);
            return 0;
        }
        conn_shed(v);
    }
    if (w->nopen >= w->cap) {
        if (!(v = qg__shed_pick(w, NULL))) {
            qg__drop(w, QG_HTTP_REFUSED_CAPACITY);
            return 0;
        }
        conn_shed(v);
    }
    return 1;
}

void qg__on_accept(evutil_socket_t lfd, short what, void *arg)
{
    qg__worker *w = arg;
    (void)what;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        qg__akey key;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM)
                qg__accept_pause(w);
            return;
        }
        qg__akey_of((struct sockaddr *)&ss, &key);
        /* No room: refuse by closing at once. */
        if (w->stopping || !conn_room(w, &key) || conn_new(w, fd, &key) < 0)
            close(fd);
    }
}

void qg__conns_sweep(qg__worker *w)
{
    uint64_t now = qg__now_ms();
    qg__conn *c, *next;
    for (c = w->conns; c; c = next) {
        next = c->next;
        if (c->fd < 0 || c->deadline_ms == 0 || now < c->deadline_ms)
            continue;
        c->nest++;
        c->deadline_ms = 0;
        if (c->out_len == 0 && (c->phase == PH_HEADERS || c->phase == PH_BODY)) {
            qg__drop(w, c->phase == PH_BODY ? QG_HTTP_TIMEOUT_BODY
                                            : QG_HTTP_TIMEOUT_HEAD);
            conn_error(c, 408);
        } else if (!c->busy || c->out_off < c->out_len) {
            c->want_close = 1;          /* idle, lingering or stuck writing
                                         * (held: the client is gone) */
            if (c->out_off < c->out_len)
                qg__drop(w, QG_HTTP_TIMEOUT_WRITE);
            else if (c->phase == PH_FIRST)
                qg__drop(w, QG_HTTP_TIMEOUT_HEAD);
            else if (c->phase == PH_IDLE)
                qg__drop(w, QG_HTTP_TIMEOUT_IDLE);
        }
        c->nest--;
        conn_end(c);
    }
}

void qg__conns_begin_stop(qg__worker *w)
{
    qg__conn *c, *next;
    for (c = w->conns; c; c = next) {
        next = c->next;
        if (c->fd < 0)
            continue;
        c->nest++;
        if (c->busy || c->out_len > 0)
            c->closing = 1;             /* answer or finish writing, close */
        else
            c->want_close = 1;
        c->nest--;
        conn_end(c);
    }
}

int qg__conns_draining(const qg__worker *w)
{
    int n = 0;
    for (const qg__conn *c = w->conns; c; c = c->next)
        if (c->fd >= 0 && !c->busy)
            n++;
    return n;
}

void qg__conns_release(qg__worker *w, int final)
{
    qg__conn *c, *next;
    for (c = w->conns; c; c = next) {
        next = c->next;
        conn_shutdown(c);
        if (final || !c->busy)
            conn_free(c);
    }
}

/* ---- public ----------------------------------------------------------- */

static int alive(const qg__conn *c)
{
    return c->fd >= 0 && !c->want_close && !c->gone;
}

/* The owner lets go of the request: forget its hooks. */
static void req_release(qg__conn *c)
{
    c->busy = 0;
    c->streaming = c->st_chunked = c->st_nobody = 0;
    c->close_fired = 0;
    c->close_fn = c->drain_fn = NULL;
    c->close_arg = c->drain_arg = NULL;
    event_del(&c->notify_ev);
}

/* A started stream released by qg__http_respond: send what is queued,
 * then close without the terminating chunk (a truncated response). */
static void stream_abort(qg__conn *c)
{
    req_release(c);
    c->nest++;
    if (alive(c)) {
        c->closing = 1;
        if (pending(c) == 0)
            conn_written(c);
    } else {
        c->want_close = 1;
    }
    c->nest--;
    conn_end(c);
}

void qg__http_respond(qg_http_req *r, int status,
                     const qg_http_out_header *headers, int nheaders,
                     const char *content_type, const char *body, size_t len)
{
    qg__conn *c = r ? r->priv : NULL;
    if (!c || !c->busy)
        return;
    if (c->streaming) {
        stream_abort(c);
        return;
    }
    req_release(c);
    c->nest++;
    if (alive(c)) {
        int keep = c->keepalive && !c->closing && !c->w->stopping;
        if (!keep)
            c->closing = 1;
        if (conn_queue(c, status, headers, nheaders,
                       content_type ? content_type : "application/json",
                       body ? body : "", body ? len : 0, keep, FR_LENGTH) < 0)
            c->want_close = 1;
        else if (c->out_len == 0)
            conn_written(c);
        /* Deferred response: resume pipelined requests here (inside the
         * handler the parse loop below us does it). */
        if (c->nest == 1)
            conn_process(c);
    } else {
        c->want_close = 1;              /* the client is gone: discard */
    }
    c->nest--;
    conn_end(c);
}

int qg__http_stream_start(qg_http_req *r, int status,
                         const qg_http_out_header *headers, int nheaders,
                         const char *content_type)
{
    qg__conn *c = r ? r->priv : NULL;
    int v11, keep, nobody, rc;
    if (!c || !c->busy || c->streaming || !alive(c))
        return -1;
    v11 = c->hp.http_major > 1 ||
          (c->hp.http_major == 1 && c->hp.http_minor >= 1);
    nobody = c->head || status < 200 || status == 204 || status == 304;
    keep = v11 && c->keepalive && !c->closing && !c->w->stopping;
    if (!keep)
        c->closing = 1;
    c->nest++;
    if (conn_queue(c, status, headers, nheaders,
                   content_type ? content_type : "application/json", "", 0,
                   keep, v11 ? FR_CHUNKED : FR_CLOSE) < 0) {
        c->want_close = 1;
    } else {
        c->streaming = 1;
        c->st_chunked = v11 && !nobody;
        c->st_nobody = nobody;
    }
    c->nest--;
    rc = alive(c) ? 0 : -1;
    conn_end(c);
    return rc;
}

int qg__http_stream_write(qg_http_req *r, const char *data, size_t len)
{
    qg__conn *c = r ? r->priv : NULL;
    size_t hw;
    int rc = 0;
    if (!c || !c->busy || !c->streaming || !alive(c))
        return -1;
    hw = qg__opts(c)->stream_high_water;
    if (len == 0 || c->st_nobody)
        return pending(c) > hw ? 1 : 0;
    c->nest++;
    if (c->st_chunked) {
        char hdr[24];
        int n = snprintf(hdr, sizeof hdr, "%zx\r\n", len);
        struct iovec iov[3] = { { hdr, (size_t)n }, { (void *)data, len },
                                { (void *)"\r\n", 2 } };
        rc = out_sendv(c, iov, 3);
    } else {
        struct iovec iov = { (void *)data, len };
        rc = out_sendv(c, &iov, 1);
    }
    if (rc < 0)
        c->want_close = 1;
    c->nest--;
    rc = !alive(c) ? -1 : pending(c) > hw ? 1 : 0;
    conn_end(c);
    return rc;
}

void qg__http_stream_on_drain(qg_http_req *r, void (*fn)(void *), void *arg)
{
    qg__conn *c = r ? r->priv : NULL;
    if (!c || !c->busy)
        return;
    c->drain_fn = fn;
    c->drain_arg = arg;
    if (fn && !c->gone && pending(c) <= qg__opts(c)->stream_high_water / 4)
        notify_kick(c);
}

void qg__http_stream_end(qg_http_req *r)
{
    qg__conn *c = r ? r->priv : NULL;
    int started, chunked;
    if (!c || !c->busy)
        return;
    started = c->streaming;
    chunked = c->st_chunked;
    req_release(c);
    c->nest++;
    if (started && alive(c)) {
        static const struct iovec last = { (void *)"0\r\n\r\n", 5 };
        if (chunked && out_sendv(c, &last, 1) < 0)
            c->want_close = 1;
        else if (pending(c) == 0)
            conn_written(c);
        if (c->nest == 1)
            conn_process(c);
    } else {
        c->want_close = 1;              /* gone, or no stream: close */
    }
    c->nest--;
    conn_end(c);
}

void qg__http_on_close(qg_http_req *r, void (*fn)(void *), void *arg)
{
    qg__conn *c = r ? r->priv : NULL;
    if (!c || !c->busy)
        return;
    c->close_fn = fn;
    c->close_arg = arg;
    if (fn && c->gone && !c->close_fired)
        notify_kick(c);
}

struct event_base *qg__http_req_base(qg_http_req *r)
{
    qg__conn *c = r ? r->priv : NULL;
    return c ? c->w->base : NULL;
}
