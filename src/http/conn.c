/* conn.c - one HTTP connection: accept, read, feed the parser (request.c),
 * time out, close.  Writing the responses is response.c's.
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
 * closes at a deadline by reason. */
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

/* ---- small helpers --------------------------------------------------- */

void qg__conn_rev_set(qg__conn *c, int on)
{
    if (c->fd < 0 || c->rev_on == (unsigned)!!on)
        return;
    if ((on ? event_add(&c->rev, NULL) : event_del(&c->rev)) == 0)
        c->rev_on = !!on;
    else if (on)
        c->want_close = 1;
}

void qg__conn_wev_set(qg__conn *c, int on)
{
    if (c->fd < 0 || c->wev_on == (unsigned)!!on)
        return;
    if ((on ? event_add(&c->wev, NULL) : event_del(&c->wev)) == 0)
        c->wev_on = !!on;
    else if (on)
        c->want_close = 1;
}

void qg__conn_process(qg__conn *c)
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
            qg__conn_error(c, c->err_status ? c->err_status
                        : e == HPE_HEADER_OVERFLOW ? 431 : 400);
            break;
        }
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    if (c->rd_full && c->in_len < c->in_cap) {
        c->rd_full = 0;
        qg__conn_rev_set(c, 1);
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

void qg__conn_notify_kick(qg__conn *c)
{
    event_active(&c->notify_ev, EV_TIMEOUT, 1);
}

/* End of an entry point: close if asked, unless we are nested.  Closed
 * while the handler holds the request: the client is gone (on_close). */
void qg__conn_end(qg__conn *c)
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
            qg__conn_notify_kick(c);
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
            qg__conn_rev_set(c, 0);
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
            qg__conn_rev_set(c, 0);
            c->rd_full = 1;
            return;
        }
    }
    space = c->in_cap - c->in_len;
    n = recv(c->fd, c->in + c->in_len, space, 0);
    if (n > 0) {
        c->in_len += (size_t)n;
        if (!c->busy)
            qg__conn_process(c);
        /* A bulk upload filled the buffer: read bigger pieces. */
        if ((size_t)n == space && c->in_cap < IN_SOFT)
            qg__reserve(&c->in, &c->in_cap, c->in_cap * 2, IN_SOFT);
    } else if (n == 0) {
        c->rd_eof = 1;
        qg__conn_rev_set(c, 0);
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
    qg__conn_end(c);
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
        qg__conn_written(c);
        qg__conn_process(c);
    }
    if (rc >= 0 && c->busy && c->drain_fn &&
        qg__conn_pending(c) <= qg__opts(c)->stream_high_water / 4)
        qg__conn_notify_kick(c);
    c->nest--;
    qg__conn_end(c);
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
        qg__conn_pending(c) <= qg__opts(c)->stream_high_water / 4) {
        fn = c->drain_fn;
        fa = c->drain_arg;
        c->drain_fn = NULL;
        fn(fa);
    }
    if (!c->busy)
        qg__conn_process(c);                /* released: pipelined requests */
    c->nest--;
    qg__conn_end(c);
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
        (void)qg__conn_queue(v, 503, NULL, 0, "application/json", body,
                         sizeof body - 1, 0, FR_LENGTH);
    }
    qg__drop(w, slow ? QG_HTTP_SHED_SLOW : QG_HTTP_SHED_IDLE);
    v->want_close = 1;
    v->nest--;
    qg__conn_end(v);                        /* frees v */
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
            qg__conn_error(c, 408);
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
        qg__conn_end(c);
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
        qg__conn_end(c);
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

