/* proxy.h - the metering proxy's own state, below the route that uses it
 * (src/server/h_proxy.c): the upstreams (one per distinct URL, pooled per
 * worker, kept until shutdown), each worker's model -> upstream cache of
 * the rules generation it last saw, the overage queues' slots, the calls
 * in flight (so that a shutdown can end them), and the request head sent
 * upstream.  It knows nothing of the server: a call in flight is a link
 * with a stop function the route supplies. */
#ifndef QG_PROXY_H
#define QG_PROXY_H

#include <stddef.h>
#include <stdint.h>
#include <event2/buffer.h>
#include "http.h"
#include "rules.h"
#include "upstream.h"

typedef struct qg__proxy qg__proxy;

/* A proxy for nworkers worker threads whose requests go to default_url
 * (NULL: only models that name their own upstream), with the upstream
 * client's timeout (0: its default) and CA file (NULL: the system's).
 * NULL with the reason in err. */
qg__proxy *qg__proxy_new(int nworkers, const char *default_url,
                         int timeout_ms, const char *ca_file, char *err,
                         size_t errcap);
/* End every call still linked (their stop functions), then free. */
void qg__proxy_free(qg__proxy *pr);

/* The upstream of model index m of rules: its own `upstream:`, else the
 * default.  NULL when it has none (err "") or its URL cannot be used (err
 * says why).  On worker's thread (its cache is unlocked). */
qg_upstream *qg__proxy_upstream(qg__proxy *pr, int worker,
                                const qg_rules *rules, int m, char *err,
                                size_t errcap);

/* A slot of plan's overage queue, bounded by cap over all workers: 0, or
 * -1 when the queue is full (or out of memory).  give returns it.
 * Thread-safe. */
int qg__proxy_queue_take(qg__proxy *pr, const char *plan, int cap);
void qg__proxy_queue_give(qg__proxy *pr, const char *plan);

/* A call in flight or held, on one worker's list (unlocked: the worker's
 * own thread links and unlinks).  At qg__proxy_free, stop(link) must end
 * the call and unlink it. */
typedef struct qg__proxy_call {
    struct qg__proxy_call *prev, *next;
    int linked;
    void (*stop)(struct qg__proxy_call *link);
} qg__proxy_call;
void qg__proxy_link(qg__proxy *pr, int worker, qg__proxy_call *c);
void qg__proxy_unlink(qg__proxy *pr, int worker, qg__proxy_call *c);

/* 1 when the caller's request header `name` is passed upstream: every
 * header except the caller's credentials (Authorization, x-api-key,
 * anything X-Quotagate-*), hop-by-hop ones (Connection, Keep-Alive, TE,
 * Transfer-Encoding, Upgrade, Proxy-*), Host and Content-Length (set by
 * the proxy), Accept-Encoding (usage is read from the response, so it
 * must not be compressed) and X-Request-Id (set by the proxy). */
int qg__proxy_forward_header(const char *name, size_t len);

/* The request line and headers sent upstream, into out: the caller's
 * headers that go upstream (those over 255 bytes of name or 8191 of value
 * are dropped), then Content-Length, X-Request-Id, a Content-Type when the
 * caller gave none, and the gateway's own credential (key, when set: as
 * Authorization: Bearer for the OpenAI shape, x-api-key otherwise).
 * Returns 0, QG_EINVAL when a header cannot be forwarded (a CR or LF in
 * it), or QG_ENOMEM. */
int qg__proxy_request_head(struct evbuffer *out, const qg_upstream *up,
                           const char *path, const qg_http_header *hdrs,
                           int nhdrs, size_t body_len, const char *rid,
                           int shape, const char *key);

#endif
