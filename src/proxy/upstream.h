/* upstream.h - the proxy's upstream: its URL and our own small HTTP/1.1
 * client on each worker's event loop, with a keep-alive pool per worker.
 *
 * Why not libevent's evhttp client: it cost about six extra system calls
 * per proxied request (epoll_ctl to enable and disable events around
 * every request, FIONREAD, ...) and a dozen allocations (docs/benchmarks.md).
 * This client keeps each pooled socket registered for reading once, writes
 * a request with one writev (a write event only when the socket is full),
 * reads with one recv per readiness and parses the response with
 * http-parser (chunked transfer decoding included), handing body bytes to
 * the caller as they arrive, without copying them.  TLS connections go
 * through bufferevent_openssl (libevent cannot do TLS on a raw socket
 * for us), with the same peer and host-name verification as before.
 *
 * A connection carries one call at a time.  When a call ends well and
 * both sides keep the connection alive, it goes back to its worker's idle
 * list (at most QG_UPSTREAM_MAX_CONNS idle per worker; more are closed);
 * an idle connection the upstream closes is noticed by its read event and
 * dropped.  The parser stops at the end of the response: bytes after it
 * (a second response in the same read) never reach the caller, and they
 * close the connection instead of returning it to the pool (an upstream
 * that sends what was not asked for is broken).  Interim responses (1xx)
 * before the answer are skipped; a 101 is refused (QG_UP_EPROTO).  A
 * call that fails on a reused connection before any response byte
 * arrived (the upstream closed it as we reused it) is sent again once on
 * a fresh connection.
 *
 * Threading: a call and its callbacks live on one worker's thread (the
 * one whose base was given); new/free on any thread while no worker runs. */
#ifndef QG_UPSTREAM_H
#define QG_UPSTREAM_H

#include <stddef.h>

struct event_base;
typedef struct qg_upstream qg_upstream;

#define QG_UPSTREAM_MAX_CONNS 256      /* idle connections kept per worker */

/* Parse url ("http[s]://HOST[:PORT][/PREFIX]", url.h).  https: TLS 1.2+
 * through bufferevent_openssl, the peer's certificate verified against
 * ca_file (a PEM bundle; NULL or "": the system's default trust store)
 * and its name against HOST (SNI and SSL_set1_host; an IP address is
 * matched against the certificate's IP addresses).  timeout_ms bounds
 * each wait for the upstream (connect, and silence while a call runs).
 * Returns NULL with a message in err. */
qg_upstream *qg__upstream_new(const char *url, int workers, int timeout_ms,
                             const char *ca_file, char *err, size_t errcap);
void qg__upstream_free(qg_upstream *u);

/* "HOST[:PORT]" for the Host header, and the path prefix ("" or
 * "/PREFIX" without a trailing slash). */
const char *qg__upstream_host(const qg_upstream *u);
const char *qg__upstream_prefix(const qg_upstream *u);

/* Connections open now, summed over workers (for tests and metrics). */
size_t qg__upstream_connections(qg_upstream *u);

/* ------------------------------------------------------------- calls */

/* What the upstream answered, as far as the proxy needs it. */
typedef struct qg_upresp {
    int status;
    char ctype[128];           /* Content-Type ("" none; cut to fit) */
    char retry_after[64];      /* Retry-After ("" none; cut to fit) */
} qg_upresp;

/* Why a call ended (on_done). */
enum {
    QG_UP_OK = 0,
    QG_UP_ECONN,               /* connect failed, reset, or closed early */
    QG_UP_ETIMEOUT,            /* connect or silence longer than timeout */
    QG_UP_EPROTO               /* not a valid HTTP/1.1 response */
};

/* The caller's side of one call.  on_head once (status and headers);
 * on_body for each piece of the (de-chunked) body, pointing into the
 * client's read buffer (valid during the call only); on_read_end (may be
 * NULL) after the pieces of one read from the socket were handed over,
 * so that the caller can pass them on in one write; on_done exactly once
 * unless the call was cancelled: the call is over and its handle gone
 * (on_read_end is not called for the read that ended it).  Any of them
 * may cancel or pause the call. */
typedef struct qg_upcall_cbs {
    void (*on_head)(void *ud, const qg_upresp *r);
    void (*on_body)(void *ud, const char *data, size_t len);
    void (*on_done)(void *ud, int err);
    void (*on_read_end)(void *ud);
} qg_upcall_cbs;

typedef struct qg_upcall qg_upcall;

/* Send one request on worker `worker` (whose event base is base): head
 * is the request line and headers ending with the blank line, body its
 * Content-Length bytes (both copied).  Returns the call, or NULL when it
 * could not start (out of memory): then no callback comes.  Failures
 * after that (even an immediate connect error) arrive through on_done,
 * never from inside this function.  cb must outlive the call. */
qg_upcall *qg__upstream_send(qg_upstream *u, int worker,
                            struct event_base *base, const char *head,
                            size_t head_len, const char *body,
                            size_t body_len, const qg_upcall_cbs *cb,
                            void *ud);

/* Stop the call: no callback follows, its connection is closed (a
 * response cut short cannot be reused).  Safe from its own callbacks. */
void qg__upcall_cancel(qg_upcall *c);

/* Backpressure: stop (1) or resume (0) reading the response. */
void qg__upcall_pause(qg_upcall *c, int pause);

/* ------------------------------------------- the set of upstreams by URL */

/* Every upstream the proxy has used, one per distinct URL (--upstream and
 * the models' `upstream:` of every rules generation seen), each with its
 * own per-worker pools.  An upstream is created at its first use and
 * kept until qg__upstream_set_free (shutdown): a rules reload never frees
 * one that a request in flight may still hold.  Thread-safe. */
typedef struct qg_upstream_set qg_upstream_set;

qg_upstream_set *qg__upstream_set_new(int workers, int timeout_ms,
                                     const char *ca_file);
/* The upstream for url (compared byte for byte), created on first use.
 * NULL with a message in err when url is unusable or out of memory.
 * The result lives until the set is freed. */
qg_upstream *qg__upstream_set_get(qg_upstream_set *set, const char *url,
                                 char *err, size_t errcap);
/* Frees every upstream (after every call was cancelled or finished). */
void qg__upstream_set_free(qg_upstream_set *set);

#endif
