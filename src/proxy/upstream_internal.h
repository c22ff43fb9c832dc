/* upstream_internal.h - the upstream client's objects, shared by
 * upstream.c (an upstream: its URL, TLS context and per-worker pools, and
 * the set of upstreams by URL) and upcall.c (one connection and the call
 * it carries).  Internal to src/proxy. */
#ifndef QG_UPSTREAM_INTERNAL_H
#define QG_UPSTREAM_INTERNAL_H

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <http_parser.h>
#include <openssl/ssl.h>
#include <stdatomic.h>
#include <stddef.h>
#include "upstream.h"
#include "url.h"

#define READ_CHUNK 16384        /* bytes per recv */

typedef struct pool {
    qg_upcall *idle;            /* idle connections, most recent first */
    int nidle;
} pool;

struct qg_upstream {
    char host[QG_URL_HOST_MAX]; /* without brackets or port */
    int port;
    char host_hdr[300];
    char prefix[QG_URL_PREFIX_MAX];
    int timeout_ms;
    int tls;
    int host_is_ip;
    SSL_CTX *ssl;              /* https: verify peer + host name */
    int nworkers;
    pool *pools;               /* one per worker */
    _Atomic size_t open;
};

struct qg_upcall {
    qg_upstream *u;
    pool *pl;                  /* its worker's pool */
    struct event_base *base;
    int fd;                    /* plain; -1 with TLS (the bufferevent's) */
    struct event *rev;         /* plain: read, persistent while open */
    struct event *wev;         /* plain: connecting, or the socket full */
    struct bufferevent *bev;   /* TLS */
    struct event *tmo;         /* the timeout; also delivers early errors */
    struct event *kick;        /* TLS: read what was buffered while paused */
    int connected;             /* plain: the connect completed */
    int served;                /* calls finished on this connection */
    qg_upcall *prev, *next;    /* in pl->idle */
    int in_pool;

    /* the call (cb NULL: idle) */
    const qg_upcall_cbs *cb;
    void *ud;
    char *req;                 /* request bytes, until a response byte */
    size_t req_len, req_off;
    int resent;                /* already sent again once */
    int got;                   /* a response byte arrived */
    int pending_err;           /* to deliver from tmo */
    int paused;
    int done;                  /* the response is complete */
    int interim;               /* reading a 1xx (skipped) */
    int depth;                 /* inside http_parser_execute */
    int cancelled;             /* cancelled inside a parser callback */
    http_parser hp;
    qg_upresp resp;
    char hname[16];            /* the header name being read (cut) */
    size_t hname_len;
    int hname_long;
    int in_value;
    char *hdst;                /* where the value goes, or NULL */
    size_t hcap, hlen;
};

/* Close connection c (deferred while one of its parser callbacks runs:
 * upcall.c's depth), taking it off its pool. */
void qg__upcall_close(qg_upcall *c);

#endif
