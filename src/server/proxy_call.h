/* proxy_call.h - one proxied call of the metering proxy, shared by the
 * route (h_proxy.c: admission, overage, holding) and the forwarding
 * (proxy_call.c: the upstream call, the answer relayed to the caller, the
 * settle).  Internal to src/server. */
#ifndef QG_PROXY_CALL_H
#define QG_PROXY_CALL_H

#include <event2/buffer.h>
#include <event2/event.h>
#include "charge.h"
#include "headers.h"
#include "proxy.h"
#include "server.h"
#include "stream.h"
#include "upstream.h"
#include "usage.h"

#define QG_PX_MAX_BUFFERED (64u << 20)  /* a non-streamed answer, at most */
#define QG_PX_SSE_MAX_EVENT (1u << 20)

typedef struct qg__px {
    qg__proxy_call link;           /* in the proxy's live list (proxy.h) */
    qg_server *s;
    qg_http_req *r;
    int worker;
    int shape;                     /* QG_SHAPE_* */
    int route;                     /* the metrics route */
    struct event_base *base;
    qg_upstream *up;               /* this request's (its model's) */
    qg_upcall *call;               /* NULL once finished or cancelled */
    struct event *defer;           /* zero timer: abort after client gone */

    char rid[QG_REQUEST_ID_MAX + 1];
    char subject[256];
    qg_request_info info;          /* admission's fields of the body */
    int caller_stream;             /* the caller asked "stream": true */
    int filter;                    /* drop the usage-only chunk */
    int streaming;                 /* the caller's stream was started */
    int client_gone;
    int settled;
    int no_charge;                 /* settle at 0 (upstream 429) */
    int paused;
    int status;                    /* the upstream's status */
    char ctype[128];
    char retry_after[64];
    struct evbuffer *body;         /* a buffered (non-stream) answer */
    qg__stream *stream;            /* the pass-through (stream.h) */
    qg_usage_counts u;             /* a buffered answer's usage */
    int final_usage;
    int64_t content_bytes;
    qg_hdr_buf hb;                 /* the decision's rate-limit headers */
    char dg_from[QG_REQUEST_MODEL_MAX];  /* downgraded: the model asked */
    char dg_model[QG_REQUEST_MODEL_MAX]; /* downgraded: the model served */

    /* the overage queue (docs/proxy.md, "Overage: queue") */
    int queued;                    /* held: takes a slot of q_plan's queue */
    struct event *qtimer;          /* fires at the retry instant */
    int64_t q_start_ms;            /* when the hold began */
    char q_plan[128];
    char qms[24];                  /* x-quotagate-queued-ms, "" = no wait */
} qg__px;

/* Free p (cancels its upstream call, gives back its queue slot, unlinks
 * it); r must have been released or be released by the caller after. */
void qg__px_free(qg__px *p);

/* Settle p once, with what its answer showed (status cancelled when the
 * caller left, else st), or at the tokens given. */
void qg__px_settle(qg__px *p, qg_settle_status st, int64_t in, int64_t out,
                   int estimated);

/* Answer with an error (releases r) and free p. */
void qg__px_reply_error(qg__px *p, int status, const char *type,
                        const char *msg);

/* Forward the admitted p upstream with body (blen bytes, p's own or a
 * rewrite; copied): the caller is answered from the upstream's callbacks,
 * the request settled once whatever happens.  On failure p is answered
 * and freed here. */
void qg__px_forward(qg__px *p, const char *body, size_t blen);

/* The proxy's stop function for a call still linked at shutdown. */
void qg__px_stop(qg__proxy_call *link);

#endif
