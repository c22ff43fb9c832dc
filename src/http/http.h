/* http.h - the HTTP/1.1 server quotagate serves on.
 *
 * N worker threads, each with its own libevent event_base and its own
 * SO_REUSEPORT listening socket (the kernel spreads connections), reading
 * and writing sockets directly (no bufferevents: fewer system calls per
 * request) and parsing with Debian's libhttp-parser.  Keep-alive; requests
 * on one connection are handled one at a time, in order (a pipelined
 * request waits until the previous response is queued).
 *
 * Limits, each answered with a JSON error and the connection closed:
 * header bytes (431), body bytes (413), malformed requests (400), a client
 * that does not finish its headers in time (408), idle keep-alive
 * connections are closed silently after idle_timeout_ms.
 *
 * A handler runs on the worker thread that read the request.  It may
 * respond at once, or keep the request and respond later from the same
 * worker thread (e.g. after the ledger made a charge durable, using
 * qg_http_post to get back onto that thread).  Every request must be
 * responded to exactly once; if the client went away meanwhile the
 * response is discarded. */
#ifndef QG_HTTP_H
#define QG_HTTP_H

#include <stddef.h>
#include <stdint.h>

typedef struct qg_http_server qg_http_server;

enum { QG_HTTP_GET = 1, QG_HTTP_POST, QG_HTTP_PUT, QG_HTTP_DELETE,
       QG_HTTP_HEAD, QG_HTTP_OTHER };

typedef struct qg_http_header {
    const char *name;          /* as received; compare case-insensitively */
    size_t name_len;
    const char *value;
    size_t value_len;
} qg_http_header;

/* A request, valid until it is responded to.  Fields are read-only. */
typedef struct qg_http_req {
    int method;
    const char *path;          /* NUL-terminated, without the query */
    const char *query;         /* NUL-terminated, "" when none */
    const qg_http_header *headers;
    int nheaders;
    const char *body;          /* NUL-terminated (the NUL is not counted) */
    size_t body_len;
    int worker;                /* index of the worker thread */
    void *priv;                /* the server's */
} qg_http_req;

/* Value of the first header called `name` (case-insensitive), or NULL.
 * *len gets its length when len is non-NULL. */
const char *qg_http_header_get(const qg_http_req *r, const char *name,
                               size_t *len);

typedef struct qg_http_out_header {
    const char *name;
    const char *value;
} qg_http_out_header;

/* Send the response to r and release r (do not touch r afterwards).
 * Must be called on r's worker thread.  Headers and body are copied.
 * content_type may be NULL (then "application/json").  A request still
 * held when qg_http_server_run returned may be responded to from the
 * thread that called run, before qg_http_server_free (the response is
 * discarded); requests never responded to are freed by the latter. */
void qg_http_respond(qg_http_req *r, int status,
                     const qg_http_out_header *headers, int nheaders,
                     const char *content_type, const char *body, size_t len);

typedef void (*qg_http_handler)(qg_http_req *r, void *ud);

typedef struct qg_http_opts {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* 0 = any free port (see qg_http_server_port) */
    int workers;               /* default 2 */
    size_t max_header_bytes;   /* default 16 KiB */
    size_t max_body_bytes;     /* default 1 MiB */
    int header_timeout_ms;     /* default 10 s: to receive a whole header */
    int idle_timeout_ms;       /* default 60 s between requests */
    int max_connections;       /* per worker, default 4096 */
} qg_http_opts;

/* Bind and listen (every worker's socket) without serving yet.  Returns
 * NULL and writes why into err on failure (e.g. address in use). */
qg_http_server *qg_http_server_new(const qg_http_opts *opts,
                                   qg_http_handler handler, void *ud,
                                   char *err, size_t errcap);
/* The bound port. */
int qg_http_server_port(const qg_http_server *s);
/* Serve on the worker threads until qg_http_server_stop; blocks the
 * caller.  Returns 0 after a clean stop. */
int qg_http_server_run(qg_http_server *s);
/* Ask the server to stop: stops accepting, lets queued responses flush,
 * and makes qg_http_server_run return.  Thread-safe, and safe to call
 * from a signal handler. */
void qg_http_server_stop(qg_http_server *s);
/* Run fn(arg) on worker `worker`'s thread, soon.  Thread-safe.  Returns 0
 * or -1 when the server is stopping (fn is then not called).  A post that
 * returned 0 runs even if the stop comes first (at the latest as the
 * worker exits, when its connections are already closed). */
int qg_http_post(qg_http_server *s, int worker, void (*fn)(void *),
                 void *arg);
void qg_http_server_free(qg_http_server *s);

/* Counters for /metrics, summed over workers. */
typedef struct qg_http_stats {
    uint64_t connections_open;
    uint64_t connections_total;
    uint64_t requests_total;
    uint64_t errors_total;     /* 4xx answered by the HTTP layer itself */
} qg_http_stats;
void qg_http_server_stats(qg_http_server *s, qg_http_stats *out);

#endif
