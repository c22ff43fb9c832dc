/* upcall.c - the upstream client's connections and calls (upstream.h):
 * our HTTP/1.1 client on plain sockets on the worker's loop (TLS through
 * bufferevent_openssl), a call per connection at a time, the connection
 * back to its worker's pool when the answer was whole and keep-alive.
 *
 * One struct qg_upcall is one connection; while it carries a call it also
 * holds that call's state (callbacks, the request bytes until the first
 * response byte, the response parser).  Lifetimes: a connection is freed
 * by qg__upcall_close only when no parser callback of it is running
 * (depth 0); a cancel from inside one marks it and the reader closes it
 * after http_parser_execute returns.  The parser stops at the end of the
 * response: bytes after it close the connection. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <http_parser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "fault.h"
#include "upstream_internal.h"

/* -------------------------------------------------------- connections */

static void pool_remove(qg_upcall *c)
{
    if (!c->in_pool)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->pl->idle = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->in_pool = 0;
    c->pl->nidle--;
}

static void conn_teardown(qg_upcall *c);

void qg__upcall_close(qg_upcall *c)
{
    pool_remove(c);
    conn_teardown(c);
    if (c->tmo)
        event_free(c->tmo);
    if (c->kick)
        event_free(c->kick);
    free(c->req);
    atomic_fetch_sub(&c->u->open, 1);
    free(c);
}

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void on_timer(evutil_socket_t fd, short what, void *arg);
static void tls_read(struct bufferevent *bev, void *arg);
static void on_kick(evutil_socket_t fd, short what, void *arg);
static void tls_event(struct bufferevent *bev, short what, void *arg);

/* Resolve HOST:PORT (getaddrinfo: blocking for a name that is not in
 * /etc/hosts, instant for an address). */
static int resolve(const qg_upstream *u, struct sockaddr_storage *sa,
                   socklen_t *salen)
{
    struct addrinfo hints, *res = NULL;
    char port[8];
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", u->port);
    if (getaddrinfo(u->host, port, &hints, &res) != 0 || !res)
        return -1;
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *salen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static SSL *tls_new(qg_upstream *u)
{
    SSL *ssl = SSL_new(u->ssl);
    if (!ssl)
        return NULL;
    if (u->host_is_ip) {
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), u->host) != 1)
            goto fail;
    } else if (SSL_set_tlsext_host_name(ssl, u->host) != 1 ||
               SSL_set1_host(ssl, u->host) != 1) {
        goto fail;
    }
    return ssl;
fail:
    SSL_free(ssl);
    return NULL;
}

/* Drop c's transport (socket, events, TLS), keeping the struct. */
static void conn_teardown(qg_upcall *c)
{
    if (c->rev)
        event_free(c->rev);
    if (c->wev)
        event_free(c->wev);
    if (c->bev)
        bufferevent_free(c->bev);      /* closes its socket */
    else if (c->fd >= 0)
        close(c->fd);
    c->rev = c->wev = NULL;
    c->bev = NULL;
    c->fd = -1;
    c->connected = 0;
    c->pending_err = 0;
}

/* Open c's transport: resolve, then a non-blocking connect.  Returns -1
 * only when out of memory; a failed connect is left in pending_err, so
 * the call fails through on_done like every other failure. */
static int conn_connect(qg_upcall *c)
{
    qg_upstream *u = c->u;
    struct sockaddr_storage sa;
    socklen_t salen = 0;
    int one = 1, ok = resolve(u, &sa, &salen) == 0;

    if (u->tls) {
        SSL *ssl = qg__alloc_fails("upstream tls") ? NULL : tls_new(u);
        if (!ssl)
            return -1;
        c->bev = qg__alloc_fails("upstream tls bufferevent") ? NULL
                 : bufferevent_openssl_socket_new(
                       c->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                       BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (!c->bev) {
            SSL_free(ssl);
            return -1;
        }
        bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
        bufferevent_setcb(c->bev, tls_read, NULL, tls_event, c);
        if (!ok || bufferevent_socket_connect(c->bev, (struct sockaddr *)&sa,
                                              (int)salen) != 0)
            c->pending_err = QG_UP_ECONN;
        else
            bufferevent_enable(c->bev, EV_READ | EV_WRITE);
        if (bufferevent_getfd(c->bev) >= 0)
            setsockopt(bufferevent_getfd(c->bev), IPPROTO_TCP, TCP_NODELAY,
                       &one, sizeof one);
        return 0;
    }
    if (!ok) {
        c->pending_err = QG_UP_ECONN;
        return 0;
    }
    c->fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                   0);
    if (c->fd < 0) {
        c->pending_err = QG_UP_ECONN;
        return 0;
    }
    /* the request goes in one write, but our small answers to a
     * streaming caller and the upstream's are not held back by Nagle */
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (qg__alloc_fails("upstream read event") ||
        !(c->rev = event_new(c->base, c->fd, EV_READ | EV_PERSIST, on_read,
                             c)) ||
        qg__alloc_fails("upstream write event") ||
        !(c->wev = event_new(c->base, c->fd, EV_WRITE, on_write, c)))
        return -1;
    if (connect(c->fd, (struct sockaddr *)&sa, salen) == 0) {
        c->connected = 1;
    } else if (errno == EINPROGRESS) {
        event_add(c->wev, NULL);
    } else {
        c->pending_err = QG_UP_ECONN;
        return 0;
    }
    event_add(c->rev, NULL);            /* once: stays while c is open */
    return 0;
}

/* A new connection on pl's worker, or NULL when out of memory. */
static qg_upcall *conn_open(qg_upstream *u, pool *pl, struct event_base *base)
{
    qg_upcall *c = qg__alloc_fails("upstream connection")
                       ? NULL : calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->u = u;
    c->pl = pl;
    c->base = base;
    c->fd = -1;
    atomic_fetch_add(&u->open, 1);
    if (qg__alloc_fails("upstream timer") ||
        !(c->tmo = evtimer_new(base, on_timer, c)) || conn_connect(c) < 0) {
        qg__upcall_close(c);
        return NULL;
    }
    return c;
}

/* ------------------------------------------------------------- parser */

/* A response begins: the answer, or an interim (1xx) one before it,
 * whose headers must not reach the answer's. */
static int hp_message_begin(http_parser *hp)
{
    qg_upcall *c = hp->data;
    memset(&c->resp, 0, sizeof c->resp);
    c->hname_len = 0;
    c->hname_long = 0;
    c->in_value = 0;
    c->hdst = NULL;
    return 0;
}

static int hp_header_field(http_parser *hp, const char *at, size_t len)
{
    qg_upcall *c = hp->data;
    if (c->in_value) {                  /* a new header begins */
        c->in_value = 0;
        c->hname_len = 0;
        c->hname_long = 0;
        c->hdst = NULL;
    }
    if (c->hname_len + len >= sizeof c->hname) {
        c->hname_long = 1;
        return 0;
    }
    memcpy(c->hname + c->hname_len, at, len);
    c->hname_len += len;
    return 0;
}

static int hp_header_value(http_parser *hp, const char *at, size_t len)
{
    qg_upcall *c = hp->data;
    if (!c->in_value) {
        c->in_value = 1;
        c->hdst = NULL;
        c->hlen = 0;
        if (c->hname_long) {
            ;
        } else if (c->hname_len == 12 &&
                   strncasecmp(c->hname, "content-type", 12) == 0) {
            c->hdst = c->resp.ctype;
            c->hcap = sizeof c->resp.ctype;
        } else if (c->hname_len == 11 &&
                   strncasecmp(c->hname, "retry-after", 11) == 0) {
            c->hdst = c->resp.retry_after;
            c->hcap = sizeof c->resp.retry_after;
        }
        c->hname_len = 0;
        c->hname_long = 0;
    }
    if (c->hdst) {
        size_t n = c->hlen + len < c->hcap ? len : c->hcap - 1 - c->hlen;
        memcpy(c->hdst + c->hlen, at, n);
        c->hlen += n;
        c->hdst[c->hlen] = '\0';
    }
    return 0;
}

/* The head is read.  An interim response (1xx but 101, RFC 9110 15.2:
 * 100 Continue, 103 Early Hints, ...) is skipped, head and body (it has
 * none: 1 tells http-parser so), and the answer follows it.  A 101 is
 * refused: the proxy never asks to switch protocols. */
static int hp_headers_complete(http_parser *hp)
{
    qg_upcall *c = hp->data;
    if (hp->status_code == 101)
        return -1;
    if (hp->status_code / 100 == 1) {
        c->interim = 1;
        return 1;
    }
    c->resp.status = hp->status_code;
    if (c->cb)
        c->cb->on_head(c->ud, &c->resp);
    return c->cb ? 0 : -1;              /* cancelled: stop */
}

static int hp_body(http_parser *hp, const char *at, size_t len)
{
    qg_upcall *c = hp->data;
    if (c->cb)
        c->cb->on_body(c->ud, at, len);
    return c->cb ? 0 : -1;
}

/* The end of the response: stop the parser here, so that nothing after
 * it (a second response in the same read) reaches the caller. */
static int hp_message_complete(http_parser *hp)
{
    qg_upcall *c = hp->data;
    if (c->interim) {                   /* the answer is still to come */
        c->interim = 0;
        return 0;
    }
    c->done = 1;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings hp_settings = {
    .on_message_begin = hp_message_begin,
    .on_header_field = hp_header_field,
    .on_header_value = hp_header_value,
    .on_headers_complete = hp_headers_complete,
    .on_body = hp_body,
    .on_message_complete = hp_message_complete,
};

/* ---------------------------------------------------------- the call */

static void call_send(qg_upcall *c);
static void call_begin(qg_upcall *c, const qg_upcall_cbs *cb, void *ud,
                       char *req, size_t len, int resent);

/* The call is over: free the connection or keep it, then tell the
 * caller (the last thing touching c's call). */
static int call_end(qg_upcall *c, int err, int keep)
{
    const qg_upcall_cbs *cb = c->cb;
    void *ud = c->ud;
    c->cb = NULL;
    c->ud = NULL;
    free(c->req);
    c->req = NULL;
    evtimer_del(c->tmo);
    if (keep && !err && c->pl->nidle < QG_UPSTREAM_MAX_CONNS) {
        c->served++;
        c->done = 0;
        if (c->paused) {
            c->paused = 0;
            if (c->bev)
                bufferevent_enable(c->bev, EV_READ);
            else
                event_add(c->rev, NULL);
        }
        c->next = c->pl->idle;
        c->prev = NULL;
        if (c->next)
            c->next->prev = c;
        c->pl->idle = c;
        c->pl->nidle++;
        c->in_pool = 1;
    } else {
        qg__upcall_close(c);
        keep = 0;
    }
    if (cb)
        cb->on_done(ud, err);
    return keep && !err;
}

/* Start the call's request on connection c (fresh or idle). */
static void call_begin(qg_upcall *c, const qg_upcall_cbs *cb, void *ud,
                       char *req, size_t len, int resent)
{
    struct timeval tv = {c->u->timeout_ms / 1000,
                         (c->u->timeout_ms % 1000) * 1000};
    c->cb = cb;
    c->ud = ud;
    c->req = req;
    c->req_len = len;
    c->req_off = 0;
    c->resent = resent;
    c->got = c->done = c->cancelled = c->paused = c->interim = 0;
    memset(&c->resp, 0, sizeof c->resp);
    http_parser_init(&c->hp, HTTP_RESPONSE);
    c->hp.data = c;
    if (c->pending_err) {
        struct timeval zero = {0, 0};
        evtimer_add(c->tmo, &zero);
        return;
    }
    evtimer_add(c->tmo, &tv);
    call_send(c);
}

/* A failure of the call on c: once, a call on a reused connection that
 * broke before any response byte is sent again on a fresh one (the
 * upstream closed the idle connection as we reused it). */
static int call_fail(qg_upcall *c, int err)
{
    if (c->cb && err == QG_UP_ECONN && !c->got && c->served > 0 &&
        !c->resent && c->req) {
        conn_teardown(c);               /* the same call, a new socket */
        c->served = 0;
        if (conn_connect(c) == 0) {
            call_begin(c, c->cb, c->ud, c->req, c->req_len, 1);
            return 1;
        }
    }
    call_end(c, err, 0);
    return 0;
}

/* Write what is left of the request (plain: one send, a write event only
 * when the socket is full; TLS: into the bufferevent). */
static void call_send(qg_upcall *c)
{
    if (c->bev) {
        if (bufferevent_write(c->bev, c->req, c->req_len) != 0) {
            struct timeval zero = {0, 0};
            c->pending_err = QG_UP_ECONN;
            evtimer_add(c->tmo, &zero);
        }
        c->req_off = c->req_len;
        return;
    }
    if (!c->connected)
        return;                         /* on_write sends it */
    while (c->req_off < c->req_len) {
        ssize_t n = send(c->fd, c->req + c->req_off, c->req_len - c->req_off,
                         MSG_NOSIGNAL);
        if (n > 0) {
            c->req_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(c->wev, NULL);
            return;
        } else {
            struct timeval zero = {0, 0};
            c->pending_err = QG_UP_ECONN;   /* reported from the loop */
            evtimer_add(c->tmo, &zero);
            return;
        }
    }
}

/* 1 when fd has bytes (or an end of file) waiting: a read that filled
 * the whole buffer may have left some behind. */
static int bytes_waiting(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

/* Response bytes (or EOF: data NULL) for c.  Returns 1 while c still
 * carries its call; 0 when c was freed or went back to the pool. */
static int conn_feed(qg_upcall *c, const char *data, size_t len)
{
    struct timeval tv = {c->u->timeout_ms / 1000,
                         (c->u->timeout_ms % 1000) * 1000};
    size_t used;
    enum http_errno e;

    if (!c->cb) {                       /* idle: closed or garbage */
        qg__upcall_close(c);
        return 0;
    }
    if (!data && !c->got)
        return call_fail(c, QG_UP_ECONN);
    if (data) {
        if (!c->got) {
            c->got = 1;
            free(c->req);               /* never sent again now */
            c->req = NULL;
        }
        if (!c->paused)
            evtimer_add(c->tmo, &tv);
    }
    c->depth++;
    used = http_parser_execute(&c->hp, &hp_settings, data, data ? len : 0);
    c->depth--;
    e = HTTP_PARSER_ERRNO(&c->hp);
    if (c->cancelled) {
        qg__upcall_close(c);
        return 0;
    }
    if (c->done) {
        /* bytes after the end of the response (in this read, in the TLS
         * input, or waiting behind a full read): an upstream that sends
         * what nobody asked for is broken, and its connection is closed,
         * never pooled, so the next call cannot take them for its answer */
        int keep = data && used == len && e == HPE_PAUSED &&
                   http_should_keep_alive(&c->hp);
        if (keep && c->bev)
            keep = evbuffer_get_length(bufferevent_get_input(c->bev)) == 0;
        else if (keep && len == READ_CHUNK)
            keep = !bytes_waiting(c->fd);
        call_end(c, QG_UP_OK, keep);
        return 0;
    }
    if (!data)                          /* EOF before the end */
        return call_fail(c, QG_UP_ECONN);
    if (e != HPE_OK || used != len)
        return call_fail(c, QG_UP_EPROTO);
    if (c->cb->on_read_end) {
        c->depth++;
        c->cb->on_read_end(c->ud);
        c->depth--;
        if (c->cancelled) {
            qg__upcall_close(c);
            return 0;
        }
    }
    return 1;
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    qg_upcall *c = arg;
    char buf[READ_CHUNK];
    ssize_t n;
    (void)what;
    n = recv(fd, buf, sizeof buf, 0);
    if (n > 0)
        conn_feed(c, buf, (size_t)n);
    else if (n == 0)
        conn_feed(c, NULL, 0);
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        conn_feed(c, NULL, 0);          /* reset: like an early EOF */
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    qg_upcall *c = arg;
    (void)what;
    if (!c->connected) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
            if (c->cb)
                call_fail(c, QG_UP_ECONN);
            else
                c->pending_err = QG_UP_ECONN;
            return;
        }
        c->connected = 1;
    }
    if (c->cb && c->req)
        call_send(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    qg_upcall *c = arg;
    (void)fd;
    (void)what;
    if (!c->cb)
        return;
    if (c->pending_err)
        call_fail(c, c->pending_err);
    else
        call_fail(c, QG_UP_ETIMEOUT);
}

static void tls_read(struct bufferevent *bev, void *arg)
{
    qg_upcall *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    char buf[READ_CHUNK];
    size_t n;
    while ((n = evbuffer_get_length(in)) > 0) {
        if (!c->cb) {                   /* idle: garbage closes it */
            qg__upcall_close(c);
            return;
        }
        if (n > sizeof buf)
            n = sizeof buf;
        evbuffer_remove(in, buf, n);
        if (!conn_feed(c, buf, n) || c->paused)
            return;                     /* gone, idle, or paused */
    }
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    qg_upcall *c = arg;
    (void)fd;
    (void)what;
    if (c->bev && !c->paused)
        tls_read(c->bev, c);
}

static void tls_event(struct bufferevent *bev, short what, void *arg)
{
    qg_upcall *c = arg;
    (void)bev;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        if (!c->cb) {
            qg__upcall_close(c);
            return;
        }
        conn_feed(c, NULL, 0);
    }
}

/* ------------------------------------------------------------- API */

qg_upcall *qg__upstream_send(qg_upstream *u, int worker,
                            struct event_base *base, const char *head,
                            size_t head_len, const char *body,
                            size_t body_len, const qg_upcall_cbs *cb,
                            void *ud)
{
    pool *pl;
    qg_upcall *c;
    char *req;

    if (worker < 0 || worker >= u->nworkers)
        return NULL;
    pl = &u->pools[worker];
    if (qg__alloc_fails("upstream request") ||
        !(req = malloc(head_len + body_len + 1)))
        return NULL;
    memcpy(req, head, head_len);
    if (body_len)
        memcpy(req + head_len, body, body_len);
    if ((c = pl->idle)) {
        pool_remove(c);
    } else if (!(c = conn_open(u, pl, base))) {
        free(req);
        return NULL;
    }
    call_begin(c, cb, ud, req, head_len + body_len, 0);
    return c;                           /* errors come through on_done */
}

void qg__upcall_cancel(qg_upcall *c)
{
    if (!c || !c->cb)
        return;
    c->cb = NULL;
    c->ud = NULL;
    if (c->depth > 0)
        c->cancelled = 1;               /* closed when the parser returns */
    else
        qg__upcall_close(c);
}

void qg__upcall_pause(qg_upcall *c, int pause)
{
    struct timeval tv;
    if (!c || !c->cb || c->paused == !!pause)
        return;
    c->paused = !!pause;
    if (c->bev) {
        struct timeval zero = {0, 0};
        if (pause) {
            bufferevent_disable(c->bev, EV_READ);
        } else {
            bufferevent_enable(c->bev, EV_READ);
            /* bytes already decrypted wait in the input buffer: no new
             * read callback comes for them, so read them from the loop */
            if (evbuffer_get_length(bufferevent_get_input(c->bev)) &&
                (c->kick || (!qg__alloc_fails("upstream kick timer") &&
                             (c->kick = evtimer_new(c->base, on_kick, c)))))
                evtimer_add(c->kick, &zero);
        }
    } else if (pause) {
        event_del(c->rev);
    } else {
        event_add(c->rev, NULL);
    }
    /* the silence timeout counts the upstream's silence, not ours */
    if (pause) {
        evtimer_del(c->tmo);
    } else {
        tv.tv_sec = c->u->timeout_ms / 1000;
        tv.tv_usec = (c->u->timeout_ms % 1000) * 1000;
        evtimer_add(c->tmo, &tv);
    }
}

