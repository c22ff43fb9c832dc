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
 * header bytes (431), body bytes (413, as soon as a Content-Length or a
 * chunk size line says the body will exceed max_body_bytes, before its
 * bytes are read), malformed requests (400), a client that does not
 * finish in time (408).  Idle keep-alive connections are closed silently
 * after idle_timeout_ms.
 *
 * Deadlines are totals, never re-armed by a byte that arrives:
 *   head  header_timeout_ms, counted from accept for a connection's first
 *         request and from the first byte of each later one;
 *   body  from the end of the head: header_timeout_ms plus the declared
 *         size at min_body_rate bytes per second (Content-Length, or the
 *         chunk sizes announced so far, so a chunked body's deadline grows
 *         chunk by chunk but never past max_body_bytes at that rate).
 * A request the handler holds (deferred or streaming) has no read
 * deadline; pipelined requests wait unparsed, their head's deadline
 * starts when they are parsed.  Deadlines are checked by each worker's
 * periodic sweep (a quarter of the shorter timeout, 5 ms to 1 s), not by
 * a timer per request.
 *
 * Capacity: at most max_connections open sockets, split evenly over the
 * workers (each holds ceil(max / workers)), and per client address
 * (IPv4 address, or IPv6 /64 prefix) at most max_conns_per_client, also
 * counted per worker as ceil(limit / workers) (the kernel spreads one
 * address's connections over the SO_REUSEPORT sockets by port).  A new
 * connection that finds its worker (or its address's share) full makes
 * room by shedding, in this order: the oldest idle connection (between
 * keep-alive requests, or lingering after its last response; closed
 * silently), then the connection whose unfinished request began longest
 * ago (a head or body still being received, or no byte yet; answered a
 * best-effort 503 "overloaded" and closed at once).  For the address
 * limit only that address's connections are candidates.  A connection
 * whose request the handler holds, or whose response is being written,
 * is never shed; when nothing can be shed the new connection is closed
 * at once (refused).  So a client that sends a whole request promptly is
 * served while idle and slow connections fill every slot.
 *
 * A handler runs on the worker thread that read the request.  It may
 * respond at once, or keep the request and respond later from the same
 * worker thread (e.g. after the ledger made a charge durable, using
 * qg__http_post to get back onto that thread).  Every request must be
 * responded to exactly once; if the client went away meanwhile the
 * response is discarded.
 *
 * Instead of one response a handler may stream one (qg_http_stream_*,
 * below): the status and headers first, then the body piece by piece as
 * it is produced, each piece handed to the socket at once. */
#ifndef QG_HTTP_H
#define QG_HTTP_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
typedef struct qg_http_server qg_http_server;

enum { QG_HTTP_GET = 1, QG_HTTP_POST, QG_HTTP_PUT, QG_HTTP_DELETE,
       QG_HTTP_HEAD, QG_HTTP_OTHER };

typedef struct qg_http_header {
    const char *name;          /* as received; compare case-insensitively */
    size_t name_len;
    const char *value;
    size_t value_len;
} qg_http_header;

/* A request, valid until it is responded to.  Fields are read-only,
 * except `tag`, which the handler may set for its own use (0 at first). */
typedef struct qg_http_req {
    int method;
    const char *path;          /* NUL-terminated, without the query */
    const char *query;         /* NUL-terminated, "" when none */
    const qg_http_header *headers;
    int nheaders;
    const char *body;          /* NUL-terminated (the NUL is not counted) */
    size_t body_len;
    int worker;                /* index of the worker thread */
    int tag;                   /* the handler's (quotagate: the route group) */
    void *priv;                /* the server's */
} qg_http_req;

/* Value of the first header called `name` (case-insensitive), or NULL.
 * *len gets its length when len is non-NULL. */
const char *qg__http_header_get(const qg_http_req *r, const char *name,
                               size_t *len);

typedef struct qg_http_out_header {
    const char *name;
    const char *value;
} qg_http_out_header;

/* Send the response to r and release r (do not touch r afterwards).
 * On a stream already started (qg__http_stream_start) it aborts the
 * stream instead: status, headers and body are ignored, what was queued
 * is still sent, then the connection is closed without the terminating
 * chunk, so the client sees a truncated response (use it when the
 * upstream failed mid-stream).
 * Must be called on r's worker thread.  Headers and body are copied.
 * content_type may be NULL (then "application/json").  A request still
 * held when qg__http_server_run returned may be responded to from the
 * thread that called run, before qg__http_server_free (the response is
 * discarded); requests never responded to are freed by the latter. */
void qg__http_respond(qg_http_req *r, int status,
                     const qg_http_out_header *headers, int nheaders,
                     const char *content_type, const char *body, size_t len);

/* ---- Streaming responses and the held request's hooks -----------------
 *
 * Threading: every function below must be called on r's worker thread
 * (from the handler, a callback of r's worker's event base, or a
 * function run there by qg__http_post), and every callback registered
 * here runs on that thread, from the worker's event loop (never from
 * inside one of these calls).  Other threads use qg__http_post.
 *
 * Releasing r: a stream, once started, is released by qg__http_stream_end
 * (or aborted by qg__http_respond); a stream that was not started (or
 * whose start failed) by qg__http_respond or qg__http_stream_end (the
 * latter then closes the connection without a response).  Exactly one
 * release per request, as always, and also after the client went away.
 *
 * Output that the socket does not take at once is buffered without limit;
 * the owner keeps it bounded by pausing its producer when a write
 * returns 1 and resuming from qg__http_stream_on_drain. */

/* Status line and headers of a streamed response.  HTTP/1.1 client:
 * "Transfer-Encoding: chunked", keep-alive continues after the end when
 * the request allows it.  HTTP/1.0 client: no framing, "Connection:
 * close", the body ends when the server closes.  No body is sent for
 * HEAD or status 1xx/204/304 (writes are accepted and discarded).
 * content_type NULL means "application/json".  Returns 0, or -1 when
 * the client is gone, r is not held, or the stream was already started
 * (r stays held either way). */
int qg__http_stream_start(qg_http_req *r, int status,
                         const qg_http_out_header *headers, int nheaders,
                         const char *content_type);

/* One piece of the body (a chunk: hex length CRLF data CRLF; raw bytes
 * for HTTP/1.0), sent at once as far as the socket takes it, the rest
 * buffered (data is copied).  len 0 sends nothing.  Returns
 *    0  sent or buffered;
 *    1  sent or buffered, but the connection's pending output now
 *       exceeds the high-water mark (opts.stream_high_water): pause the
 *       producer until qg__http_stream_on_drain's callback runs;
 *   -1  the client is gone (or no stream was started): stop producing
 *       (e.g. cancel the upstream request) and release r. */
int qg__http_stream_write(qg_http_req *r, const char *data, size_t len);

/* Call fn(arg) once, when the pending output is at or below the
 * low-water mark (a quarter of the high-water mark), soon if it already
 * is.  One callback at a time: a new call replaces the previous one; fn
 * NULL cancels.  Not called if the client goes away (on_close is). */
void qg__http_stream_on_drain(qg_http_req *r, void (*fn)(void *), void *arg);

/* The terminating zero-length chunk; then r is released exactly like
 * qg__http_respond releases it (keep-alive continues with the next
 * request once the output is written; HTTP/1.0: the connection closes). */
void qg__http_stream_end(qg_http_req *r);

/* Call fn(arg) once if the client disconnects while r is held (streaming
 * or deferred): the client closed or reset the connection (end of file
 * counts: a client that half-closes while its request is held loses the
 * response), a write failed, or the pending output made no progress for
 * idle_timeout_ms.  The socket is then already closed: writes return -1,
 * a response is discarded, and the owner must still release r (from the
 * callback or later).  Registered after the disconnect: fn runs soon.
 * The rule: fn is never called after the owner released r, and not when
 * the server stops (writes then return -1; the owner releases r as
 * qg__http_respond says).  A new call replaces the previous callback; fn
 * NULL cancels. */
void qg__http_on_close(qg_http_req *r, void (*fn)(void *), void *arg);

/* r's worker's event base, for timers and upstream I/O on r's thread. */
struct event_base *qg__http_req_base(qg_http_req *r);

typedef void (*qg_http_handler)(qg_http_req *r, void *ud);

typedef struct qg_http_opts {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* 0 = any free port (see qg__http_server_port) */
    int workers;               /* default 2 */
    size_t max_header_bytes;   /* default 16 KiB */
    size_t max_body_bytes;     /* default 1 MiB */
    int header_timeout_ms;     /* default 10 s: the head's deadline, and
                                * the base of the body's */
    int idle_timeout_ms;       /* default 60 s between requests */
    int min_body_rate;         /* bytes per second the body deadline
                                * allows, default 8192 */
    int max_connections;       /* in total, default
                                * qg__http_default_max_connections() */
    int max_conns_per_client;  /* per client address; 0: half of
                                * max_connections (at least 1); -1: none */
    size_t stream_high_water;  /* default 256 KiB of pending output, see
                                * qg__http_stream_write */
} qg_http_opts;

/* Bind and listen (every worker's socket) without serving yet.  Returns
 * NULL and writes why into err on failure (e.g. address in use). */
qg_http_server *qg__http_server_new(const qg_http_opts *opts,
                                   qg_http_handler handler, void *ud,
                                   char *err, size_t errcap);
/* The bound port. */
int qg__http_server_port(const qg_http_server *s);
/* Serve on the worker threads until qg__http_server_stop; blocks the
 * caller.  Returns 0 after a clean stop. */
int qg__http_server_run(qg_http_server *s);
/* Ask the server to stop: stops accepting, lets queued responses flush,
 * and makes qg__http_server_run return.  Thread-safe, and safe to call
 * from a signal handler. */
void qg__http_server_stop(qg_http_server *s);
/* Run fn(arg) on worker `worker`'s thread, soon.  Thread-safe.  Returns 0
 * or -1 when the server is stopping (fn is then not called).  A post that
 * returned 0 runs even if the stop comes first (at the latest as the
 * worker exits, when its connections are already closed). */
int qg__http_post(qg_http_server *s, int worker, void (*fn)(void *),
                 void *arg);
void qg__http_server_free(qg_http_server *s);

/* Descriptors this process can give to connections: the soft
 * RLIMIT_NOFILE minus a reserve of 64 + 4 per worker (standard streams,
 * logs, the ledger's database, WAL and journal files, and each worker's
 * listening socket, event loop and eventfd).  At least 1.  Raise the
 * limit first (setrlimit) if you mean to. */
int qg__http_fd_budget(int workers);
/* The default max_connections: three quarters of qg__http_fd_budget (the
 * last quarter stays free for upstream sockets: a proxied call holds one
 * while its client's connection waits), at most 65536 (each connection
 * costs ~5 KiB of buffers before the kernel's; set more explicitly). */
int qg__http_default_max_connections(int workers);

/* Connections the server closed before serving them to the end, by
 * reason.  qg_http_drop_names gives each its metric family ("shed",
 * "refused", "timed_out") and reason label; /metrics derives its series
 * from that table. */
typedef enum qg_http_drop {
    QG_HTTP_SHED_IDLE,         /* idle keep-alive or lingering, to make room */
    QG_HTTP_SHED_SLOW,         /* an unfinished request, to make room */
    QG_HTTP_REFUSED_CAPACITY,  /* new, its worker full, nothing to shed */
    QG_HTTP_REFUSED_PER_CLIENT,/* new, its address at its limit, ditto */
    QG_HTTP_TIMEOUT_HEAD,      /* head deadline (408; silent before a byte) */
    QG_HTTP_TIMEOUT_BODY,      /* body deadline (408) */
    QG_HTTP_TIMEOUT_IDLE,      /* idle_timeout_ms between requests */
    QG_HTTP_TIMEOUT_WRITE,     /* the client did not take our output for
                                * idle_timeout_ms */
    QG_HTTP_DROP_COUNT
} qg_http_drop;

typedef struct qg_http_drop_name {
    const char *kind;          /* "shed", "refused", "timed_out" */
    const char *reason;
} qg_http_drop_name;
extern const qg_http_drop_name qg_http_drop_names[QG_HTTP_DROP_COUNT];

/* Counters for /metrics, summed over workers. */
typedef struct qg_http_stats {
    uint64_t connections_open;
    uint64_t connections_total;
    uint64_t requests_total;
    uint64_t errors_total;     /* 4xx answered by the HTTP layer itself */
    uint64_t max_connections;      /* in force (workers x per worker) */
    uint64_t max_conns_per_client; /* in force, 0: none */
    uint64_t drops[QG_HTTP_DROP_COUNT];
} qg_http_stats;
void qg__http_server_stats(qg_http_server *s, qg_http_stats *out);

#endif
