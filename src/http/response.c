/* response.c - writing HTTP responses on a connection (conn.c reads
 * them): the status line and headers, the body's framing, the output
 * queue and the public qg__http_respond / qg__http_stream_* calls.
 *
 * A response normally goes out in one sendmsg (status line and headers
 * gathered with the body in an iovec); what the socket does not take
 * waits in the connection's out buffer, and the write event is armed only
 * then.
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
            qg__conn_wev_set(c, 1);
            qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
            return 0;
        } else {
            c->want_close = 1;
            return -1;
        }
    }
    c->out_off = c->out_len = 0;
    qg__conn_wev_set(c, 0);
    return 1;
}

size_t qg__conn_pending(const qg__conn *c)
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
    int was_empty = qg__conn_pending(c) == 0;
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
        qg__conn_wev_set(c, 1);
        qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
    }
    return 0;
}

/* Format a response and send it; what the socket does not take now is
 * kept in out (the body is passed by iovec, not copied, when nothing is
 * pending).  framing FR_CHUNKED / FR_CLOSE: the head of a stream (len
 * 0).  Returns -1 on a dead socket or no memory. */
int qg__conn_queue(qg__conn *c, int status, const qg_http_out_header *hs,
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
    qg__conn_wev_set(c, 1);
    qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
    return 0;
}

/* Output is empty: after a last response shut our side and wait (briefly)
 * for the client's FIN, so unread input does not turn close() into a RST
 * that could destroy the response; otherwise wait for the next request. */
void qg__conn_written(qg__conn *c)
{
    if (c->busy || c->fd < 0 || c->want_close)
        return;
    /* after a big one */
    if (c->out_cap > OUT_KEEP && qg__conn_pending(c) == 0) {
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
        qg__conn_rev_set(c, 1);
        qg__conn_enqueue(c, Q_IDLE);
    } else if (c->phase == PH_HANDLER) {
        c->phase = PH_IDLE;
        qg__set_deadline(c, qg__opts(c)->idle_timeout_ms);
        qg__conn_enqueue(c, Q_IDLE);
    }
}

void qg__conn_error(qg__conn *c, int status)
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
    if (qg__conn_queue(c, status, NULL, 0, "application/json", body,
                   (size_t)n, 0, FR_LENGTH) < 0)
        c->want_close = 1;
    else if (c->out_len == 0)
        qg__conn_written(c);
}

/* Parse what is buffered, one request at a time: stop while the handler
 * holds a request or a response is still being written. */
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
        if (qg__conn_pending(c) == 0)
            qg__conn_written(c);
    } else {
        c->want_close = 1;
    }
    c->nest--;
    qg__conn_end(c);
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
        if (qg__conn_queue(c, status, headers, nheaders,
                       content_type ? content_type : "application/json",
                       body ? body : "", body ? len : 0, keep, FR_LENGTH) < 0)
            c->want_close = 1;
        else if (c->out_len == 0)
            qg__conn_written(c);
        /* Deferred response: resume pipelined requests here (inside the
         * handler the parse loop below us does it). */
        if (c->nest == 1)
            qg__conn_process(c);
    } else {
        c->want_close = 1;              /* the client is gone: discard */
    }
    c->nest--;
    qg__conn_end(c);
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
    if (qg__conn_queue(c, status, headers, nheaders,
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
    qg__conn_end(c);
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
        return qg__conn_pending(c) > hw ? 1 : 0;
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
    rc = !alive(c) ? -1 : qg__conn_pending(c) > hw ? 1 : 0;
    qg__conn_end(c);
    return rc;
}

void qg__http_stream_on_drain(qg_http_req *r, void (*fn)(void *), void *arg)
{
    qg__conn *c = r ? r->priv : NULL;
    if (!c || !c->busy)
        return;
    c->drain_fn = fn;
    c->drain_arg = arg;
    if (fn && !c->gone && qg__conn_pending(c) <= qg__opts(c)->stream_high_water / 4)
        qg__conn_notify_kick(c);
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
        else if (qg__conn_pending(c) == 0)
            qg__conn_written(c);
        if (c->nest == 1)
            qg__conn_process(c);
    } else {
        c->want_close = 1;              /* gone, or no stream: close */
    }
    c->nest--;
    qg__conn_end(c);
}

void qg__http_on_close(qg_http_req *r, void (*fn)(void *), void *arg)
{
    qg__conn *c = r ? r->priv : NULL;
    if (!c || !c->busy)
        return;
    c->close_fn = fn;
    c->close_arg = arg;
    if (fn && c->gone && !c->close_fired)
        qg__conn_notify_kick(c);
}

struct event_base *qg__http_req_base(qg_http_req *r)
{
    qg__conn *c = r ? r->priv : NULL;
    return c ? c->w->base : NULL;
}
