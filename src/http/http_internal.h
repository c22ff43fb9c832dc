/* http_internal.h - what the four files of the HTTP layer share:
 * server.c (sockets, worker threads, posting, stopping), conn.c (one
 * connection: accept, read, write, time out, respond), request.c
 * (parser callbacks, building the qg_http_req) and limits.c (capacity,
 * per-address counts, the queues connections are shed from) - conn.c
 * also streams responses (qg_http_stream_*).  Not part of the public
 * API: only src/http/ includes it.
 *
 * Threading: everything in a qg__worker except the post queue (mu, q*)
 * and the stats is touched only by that worker's thread (or by the owner
 * before run / after run returned).  Other threads reach a worker through
 * its eventfd, which is why the event bases can run without locks. */
#ifndef QG_HTTP_INTERNAL_H
#define QG_HTTP_INTERNAL_H

#include <event2/event.h>
#include <event2/event_struct.h>
#include <http_parser.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include "http.h"

typedef struct qg__conn qg__conn;

uint64_t qg__now_ms(void);             /* monotonic, coarse (server.c) */

/* A client address as a key: IPv4 as ::ffff:a.b.c.d, IPv6 cut to its
 * /64 prefix (one host of IPv6 usually holds a whole /64). */
typedef struct qg__akey {
    unsigned char b[16];
} qg__akey;

/* One address's open connections on a worker (n 0: the slot is free). */
typedef struct qg__addr {
    qg__akey key;
    uint32_t hash;
    uint32_t n;
} qg__addr;

/* The shed queues a connection waits in (limits.c), oldest first. */
enum { Q_NONE, Q_IDLE, Q_READ };

typedef struct qg__post {
    void (*fn)(void *);
    void *arg;
} qg__post;

typedef struct qg__worker {
    qg_http_server *srv;
    int idx;
    int lfd;                   /* listening socket, -1 once closed */
    int efd;                   /* eventfd: posts and stop wake the loop */
    struct event_base *base;
    struct event accept_ev, wake_ev, sweep_ev, grace_ev, retry_ev;
    int accept_on;             /* accept_ev is added */
    pthread_t thread;
    int thread_started;

    /* Post queue: filled by any thread under mu, drained by the worker
     * (it swaps q with runq so fn runs without the lock held). */
    pthread_mutex_t mu;
    qg__post *q, *runq;
    size_t qlen, qcap, runcap;
    int q_closed;              /* worker exited: posts are refused */

    /* Connections (worker thread only). */
    qg__conn *conns;           /* doubly linked */
    int nopen;                 /* connections whose socket is open */
    int cap;                   /* at most this many open (per worker) */
    int per_client;            /* per address, 0: no limit */
    qg__conn *qhead[3], *qtail[3];  /* Q_IDLE, Q_READ (limits.c) */
    qg__addr *addrs;           /* open addressing, addr_mask + 1 slots */
    size_t addr_mask;
    uint64_t addr_seed;
    int stopping;              /* this worker began its clean stop */
    int exited;                /* its loop returned */
    int in_begin_stop;

    time_t date_sec;           /* Date header cache, per second */
    char date[40];

    /* Counters, written by the worker, read by qg__http_server_stats. */
    _Alignas(64) _Atomic uint64_t st_open;
    _Atomic uint64_t st_total, st_requests, st_errors;
    _Atomic uint64_t st_drops[QG_HTTP_DROP_COUNT];
} qg__worker;

struct qg_http_server {
    qg_http_opts o;            /* opts with defaults filled in */
    char host[256];
    qg_http_handler handler;
    void *ud;
    int port;
    int nworkers;
    qg__worker *workers;
    atomic_int stopping;
    atomic_int running;
};

/* One connection (conn.c owns it; request.c fills the request part).
 * What the connection is waiting for decides what its deadline means. */
enum { PH_FIRST,       /* a new connection's first byte (silent close) */
       PH_IDLE,        /* the next request on a keep-alive connection */
       PH_HEADERS,     /* the rest of the headers (408) */
       PH_BODY,        /* the rest of the body (408) */
       PH_HANDLER,     /* the handler's response (no deadline) */
       PH_LINGER };    /* the client's FIN after our last response */

typedef struct qg__hoff {          /* a header as offsets into the arena */
    size_t name_off, name_len, value_off, value_len;
} qg__hoff;

struct qg__conn {
    qg__worker *w;
    qg__conn *prev, *next;
    qg__conn *qprev, *qnext;   /* in w's shed queue q */
    int q;                     /* Q_NONE, Q_IDLE, Q_READ */
    int counted;               /* counted under key in w->addrs */
    qg__akey key;
    int fd;                    /* -1 once closed */
    int nest;                  /* entry points on the stack */
    struct event rev, wev;
    struct event notify_ev;    /* runs on_close / on_drain from the loop */
    unsigned rev_on : 1, wev_on : 1;
    unsigned busy : 1;         /* the handler holds req */
    unsigned msg_done : 1;     /* the parser paused after a message */
    unsigned keepalive : 1;    /* the current request allows another */
    unsigned closing : 1;      /* no more requests: close once written */
    unsigned rd_eof : 1, rd_full : 1;
    unsigned want_close : 1;
    unsigned url_done : 1;
    unsigned head : 1;         /* HEAD: no response body */
    /* Streaming (qg_http_stream_*) and the held request's owner hooks. */
    unsigned streaming : 1;    /* stream_start done, stream_end not yet */
    unsigned st_chunked : 1;   /* chunked framing (else: ends at close) */
    unsigned st_nobody : 1;    /* HEAD, 1xx, 204, 304: writes discarded */
    unsigned gone : 1;         /* the client went away while busy */
    unsigned close_fired : 1;
    void (*close_fn)(void *);
    void *close_arg;
    void (*drain_fn)(void *);
    void *drain_arg;
    int phase;
    int err_status;            /* set by a parser callback that failed */
    int hkind;                 /* last header callback: 1 field, 2 value */
    uint64_t deadline_ms;      /* 0: none */
    uint64_t body_t0_ms;       /* the head ended: the body deadline's start */
    uint64_t body_declared;    /* Content-Length, or chunk sizes so far */
    http_parser hp;
    char *in;                  /* received, not yet parsed: [in_off, in_len) */
    size_t in_off, in_len, in_cap;
    char *out;                 /* to send: [out_off, out_len) */
    size_t out_off, out_len, out_cap;
    char *ar;                  /* URL and headers of the current request */
    size_t ar_len, ar_cap, hdr_bytes;
    qg__hoff *ho;
    int nh, ho_cap;
    qg_http_header *hdrs;
    int hdrs_cap;
    char *body;
    size_t body_len, body_cap;
    qg_http_req req;
};

static inline const qg_http_opts *qg__opts(const qg__conn *c)
{
    return &c->w->srv->o;
}

static inline void qg__set_deadline(qg__conn *c, int ms)
{
    c->deadline_ms = qg__now_ms() + (uint64_t)ms;
}

/* limits.c */
/* Set w->cap and w->per_client from the server's options and allocate
 * w's address table (none without a per-client limit): 0 or -1. */
int qg__limits_init(qg__worker *w);
void qg__limits_free(qg__worker *w);
void qg__akey_of(const struct sockaddr *sa, qg__akey *k);
/* Open connections of k's address on w. */
uint32_t qg__addr_count(const qg__worker *w, const qg__akey *k);
/* Count c under its key (c->counted tells whether it could be). */
void qg__addr_add(qg__conn *c);
void qg__addr_remove(qg__conn *c);
/* Move c to the tail of queue q (Q_NONE: out of any); no-op when it is
 * in q already, so a connection keeps its place in Q_READ from accept
 * through its first request's head and body. */
void qg__conn_enqueue(qg__conn *c, int q);
/* The connection to shed for room: the oldest idle, else the oldest
 * unfinished read; with k, only connections of k's address (a bounded
 * scan).  NULL when there is none. */
qg__conn *qg__shed_pick(qg__worker *w, const qg__akey *k);

/* request.c */
extern const http_parser_settings qg__parser_settings;
/* Grow *buf to hold need bytes, never beyond hard: 0 or -1. */
int qg__reserve(char **buf, size_t *cap, size_t need, size_t hard);
/* A message is complete: build c->req and call the handler. */
void qg__conn_dispatch(qg__conn *c);

/* conn.c */
/* Send what is in c->out: 1 all written, 0 waiting for EV_WRITE, -1 the
 * socket failed (c->want_close is set). */
int qg__conn_flush(qg__conn *c);
void qg__on_accept(evutil_socket_t lfd, short what, void *arg);
/* Close and free idle connections at a timeout; called every sweep. */
void qg__conns_sweep(qg__worker *w);
/* Begin a clean stop: close idle connections, mark the others to close
 * once their response is written. */
void qg__conns_begin_stop(qg__worker *w);
/* Connections the stopping worker still waits for (unwritten output). */
int qg__conns_draining(const qg__worker *w);
/* Close every socket; free connections unless a handler still holds
 * their request (final: free those too, at qg__http_server_free). */
void qg__conns_release(qg__worker *w, int final);

/* server.c */
/* accept() failed for lack of descriptors: stop accepting briefly. */
void qg__accept_pause(qg__worker *w);
void qg__worker_check_exit(qg__worker *w);
const char *qg__date(qg__worker *w);   /* "Sun, 06 Nov 1994 08:49:37 GMT" */

/* Relaxed single-writer counter update (no locked instruction). */
static inline void qg__stat_add(_Atomic uint64_t *c, int64_t d)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed)
                          + (uint64_t)d, memory_order_relaxed);
}

/* Count a connection closed for reason why (a qg_http_drop). */
static inline void qg__drop(qg__worker *w, int why)
{
    qg__stat_add(&w->st_drops[why], 1);
}


/* Buffer sizes of a connection: its input buffer starts at IN_INIT and
 * doubles up to IN_SOFT while reads fill it; an out buffer that grew past
 * OUT_KEEP is freed once empty; after its last response a connection
 * lingers up to LINGER_MS for the client's FIN. */
enum { IN_INIT = 4096, IN_SOFT = 64 * 1024, LINGER_MS = 2000,
       OUT_KEEP = 256 * 1024 };

/* How a response body is delimited. */
enum { FR_LENGTH, FR_CHUNKED, FR_CLOSE };

/* Shared by conn.c (a connection's life) and response.c (its writing). */
int qg__conn_queue(qg__conn *c, int status, const qg_http_out_header *hs,
                   int nhs, const char *ctype, const char *body, size_t len,
                   int keep, int framing);
size_t qg__conn_pending(const qg__conn *c);
void qg__conn_written(qg__conn *c);
void qg__conn_error(qg__conn *c, int status);
void qg__conn_rev_set(qg__conn *c, int on);
void qg__conn_wev_set(qg__conn *c, int on);
void qg__conn_process(qg__conn *c);
void qg__conn_notify_kick(qg__conn *c);
void qg__conn_end(qg__conn *c);

#endif
