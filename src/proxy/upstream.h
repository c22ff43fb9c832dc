/* upstream.h - the proxy's upstream: its URL and a keep-alive pool of
 * libevent HTTP client connections per worker thread.
 *
 * A new evhttp_connection per request would leak a socket until the
 * upstream closes it (DEPENDENCY-NOTES.md), so connections are kept and
 * reused: each worker has its own pool (a connection belongs to one
 * event base), created lazily on that worker's thread.  acquire picks an
 * idle connection (no request in flight), else opens a new one while the
 * worker has fewer than QG_UPSTREAM_MAX_CONNS, else queues on the least
 * busy one (libevent runs a connection's requests one after the other).
 *
 * Threading: acquire/release for worker w only on w's thread; new/free on
 * any thread while no worker runs (free: after every request was
 * cancelled or finished). */
#ifndef QG_UPSTREAM_H
#define QG_UPSTREAM_H

#include <stddef.h>

struct event_base;
struct evhttp_connection;
typedef struct qg_upstream qg_upstream;

#define QG_UPSTREAM_MAX_CONNS 256      /* per worker */

/* Parse url ("http[s]://HOST[:PORT][/PREFIX]").  https: TLS 1.2+ through
 * bufferevent_openssl, the peer's certificate verified against ca_file
 * (a PEM bundle; NULL or "": the system's default trust store) and its
 * name against HOST (SNI and SSL_set1_host; an IP address is matched
 * against the certificate's IP addresses).  timeout_ms bounds each wait
 * for the upstream (connect, and inactivity while reading or writing).
 * Returns NULL with a message in err. */
qg_upstream *qg_upstream_new(const char *url, int workers, int timeout_ms,
                             const char *ca_file, char *err, size_t errcap);
void qg_upstream_free(qg_upstream *u);

/* "HOST[:PORT]" for the Host header, and the path prefix ("" or
 * "/PREFIX" without a trailing slash). */
const char *qg_upstream_host(const qg_upstream *u);
const char *qg_upstream_prefix(const qg_upstream *u);

/* A connection for one request on worker `worker` (whose base is base);
 * NULL on out of memory.  Give it back with qg_upstream_release when the
 * request is finished, failed or cancelled. */
struct evhttp_connection *qg_upstream_acquire(qg_upstream *u, int worker,
                                              struct event_base *base);
void qg_upstream_release(qg_upstream *u, int worker,
                         struct evhttp_connection *c);

/* Connections open now, summed over workers (for tests and metrics). */
size_t qg_upstream_connections(qg_upstream *u);

/* Every upstream the proxy has used, one per distinct URL (--upstream and
 * the models' `upstream:` of every rules generation seen), each with its
 * own per-worker pools.  An upstream is created at its first use and
 * kept until qg_upstream_set_free (shutdown): a rules reload never frees
 * one that a request in flight may still hold.  Thread-safe. */
typedef struct qg_upstream_set qg_upstream_set;

qg_upstream_set *qg_upstream_set_new(int workers, int timeout_ms,
                                     const char *ca_file);
/* The upstream for url (compared byte for byte), created on first use.
 * NULL with a message in err when url is unusable or out of memory.
 * The result lives until the set is freed. */
qg_upstream *qg_upstream_set_get(qg_upstream_set *set, const char *url,
                                 char *err, size_t errcap);
/* Frees every upstream (after every request was cancelled or finished). */
void qg_upstream_set_free(qg_upstream_set *set);

#endif
