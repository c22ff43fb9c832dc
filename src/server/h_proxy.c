/* h_proxy.c - the metering proxy: POST /v1/chat/completions (OpenAI
 * shape) and POST /v1/messages (Anthropic shape), docs/proxy.md.
 *
 * One request, on the worker thread that read it:
 *   1. the caller's subject key names the subject (routes.c); the body
 *      gives the model, the input estimate and the output cap
 *      (qg__request_fields); qg_engine_check reserves, or the request is
 *      refused like /v1/check (429, headers, JSON body) and the upstream
 *      is never called - unless the policy in force for the refusal is
 *      downgrade and the lighter model is admitted (docs/proxy.md,
 *      "Overage: downgrade"): then the body names the lighter model -
 *      or it is queue and the retry fits max_wait ("Overage: queue"):
 *      then the request is held on a timer of the worker's loop and
 *      checked again at the retry instant;
 *   2. the request goes upstream on the worker's event base through a
 *      pooled keep-alive connection of our own HTTP client (upstream.h),
 *      with the gateway's own credential instead of the caller's key;
 *   3. a non-streaming answer is read whole, its usage read, the charge
 *      settled, the answer passed on; a stream is passed on chunk by
 *      chunk as it arrives while an SSE parser reads its usage, and
 *      settled when it ends.
 * The unhappy paths each have one rule (docs/proxy.md), all settled
 * through px_settle: the ledger row's status and estimated flag say
 * which rule applied.  Usage the upstream reports beyond what the request
 * allowed (output above max_tokens) or beyond the token bound is never
 * charged as reported (px_tokens): the row's detail, a log line and a
 * metric say what was charged instead, and the settle always happens.
 *
 * A caller who leaves is handled from a zero timer (px_abort_cb), never
 * from inside the upstream client's callbacks. */
#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "fault.h"
#include "headers.h"
#include "json_out.h"
#include "metrics.h"
#include "proxy.h"
#include "rules.h"
#include "server.h"
#include "sse.h"
#include "upstream.h"
#include "usage.h"

#define SSE_MAX_EVENT (1u << 20)
#define MAX_BUFFERED_BODY (64u << 20)

typedef struct px px;

typedef struct qslot {
    char plan[128];
    int n;                     /* requests held for this plan */
} qslot;

/* Per worker: the upstream of each model of one rules generation (the
 * rules' address is the key: generations are retired, never freed, while
 * the server runs), so a request finds its upstream without a lock. */
typedef struct upcache {
    const qg_rules *rules;
    qg_upstream *m[QG_MAX_MODELS];
} upcache;

struct qg_proxy {
    qg_upstream *up;           /* --upstream, or NULL */
    qg_upstream_set *set;      /* every upstream, by URL, until stop */
    upcache *cache;            /* per worker */
    int nworkers;
    px **live;                 /* per worker: requests in flight or held */
    pthread_mutex_t qlock;     /* the overage queues, shared by workers */
    qslot *qs;
    int nqs, capqs;
};

/* Take a slot of plan's queue (bounded by cap, over all workers).
 * Returns 0, or -1 when the queue is full (or out of memory). */
static int q_take(qg_proxy *pr, const char *plan, int cap)
{
    int rc = -1, i;
    pthread_mutex_lock(&pr->qlock);
    for (i = 0; i < pr->nqs; i++)
        if (!strcmp(pr->qs[i].plan, plan))
            break;
    if (i == pr->nqs) {
        if (pr->nqs == pr->capqs) {
            int nc = pr->capqs ? pr->capqs * 2 : 8;
            qslot *q = realloc(pr->qs, (size_t)nc * sizeof *q);
            if (!q)
                goto out;
            pr->qs = q;
            pr->capqs = nc;
        }
        memset(&pr->qs[i], 0, sizeof pr->qs[i]);
        snprintf(pr->qs[i].plan, sizeof pr->qs[i].plan, "%s", plan);
        pr->nqs++;
    }
    if (pr->qs[i].n < cap) {
        pr->qs[i].n++;
        rc = 0;
    }
out:
    pthread_mutex_unlock(&pr->qlock);
    return rc;
}

static void q_give(qg_proxy *pr, const char *plan)
{
    pthread_mutex_lock(&pr->qlock);
    for (int i = 0; i < pr->nqs; i++)
        if (!strcmp(pr->qs[i].plan, plan) && pr->qs[i].n > 0) {
            pr->qs[i].n--;
            break;
        }
    pthread_mutex_unlock(&pr->qlock);
}

struct px {
    qg_server *s;
    qg_http_req *r;
    int worker;
    int shape;
    int route;
    struct event_base *base;
    qg_upstream *up;               /* this request's (its model's) */
    qg_upcall *call;               /* NULL once finished or cancelled */
    struct event *defer;           /* zero timer: abort after client gone */
    px *prev, *next;               /* in qg_proxy.live[worker] */

    char rid[QG_REQUEST_ID_MAX + 1];
    int64_t in_est;                /* admission's input estimate */
    int caller_stream;             /* the caller asked "stream": true */
    int filter;                    /* drop the usage-only chunk */
    int streaming;                 /* qg__http_stream_start done */
    int client_gone;
    int settled;
    int no_charge;                 /* settle at 0 (upstream 429) */
    int paused;
    int status;                    /* the upstream's status */
    char ctype[128];
    char retry_after[64];
    struct evbuffer *body;         /* buffered (non-stream) answer */
    struct evbuffer *pend;         /* filter mode: the current event */
    struct evbuffer *outq;         /* stream bytes of this upstream read */
    qg_sse *sse;
    qg_sse_split split;
    int drop;                      /* set by on_event: drop this event */
    qg_usage_counts u;
    int final_usage;               /* the stream's final usage arrived */
    int64_t content_bytes;
    qg_hdr_buf hb;                 /* the decision's rate-limit headers */
    char dg_from[QG_REQUEST_MODEL_MAX]; /* downgraded: the requested model */
    char dg_model[QG_REQUEST_MODEL_MAX]; /* downgraded: the model served */

    /* admission (kept for a held request's re-check) */
    char subject[256];
    qg_request_info info;
    /* overage queue (docs/proxy.md, "Overage: queue") */
    int linked;                    /* in qg_proxy.live[worker] */
    int queued;                    /* held: takes a slot of q_plan's queue */
    struct event *qtimer;          /* fires at the retry instant */
    int64_t q_start_ms;            /* when the hold began */
    char q_plan[128];
    char qms[24];                  /* x-quotagate-queued-ms, "" = no wait */
};

static _Atomic uint64_t px_counter;

/* ------------------------------------------------- allocations of a call */

/* Each allocation of a call asks fault.h first, so that a test can fail
 * any of them (docs/fault-injection.md); site names the point. */

static struct evbuffer *px_evbuffer(const char *site)
{
    return qg__alloc_fails(site) ? NULL : evbuffer_new();
}

/* evbuffer_add: 0, or -1 out of memory. */
static int px_add(struct evbuffer *b, const void *data, size_t len,
                  const char *site)
{
    return qg__alloc_fails(site) || evbuffer_add(b, data, len) != 0 ? -1 : 0;
}

/* b's bytes in one piece ("" when empty), or NULL out of memory. */
static const char *px_pullup(struct evbuffer *b, const char *site)
{
    if (evbuffer_get_length(b) == 0)
        return "";
    return qg__alloc_fails(site) ? NULL
                                 : (const char *)evbuffer_pullup(b, -1);
}


/* -------------------------------------------------------- lifecycle */

static void px_link(px *p)
{
    qg_proxy *pr = p->s->proxy;
    if (p->linked)
        return;
    p->linked = 1;
    p->prev = NULL;
    p->next = pr->live[p->worker];
    if (p->next)
        p->next->prev = p;
    pr->live[p->worker] = p;
}

static void px_free(px *p)
{
    qg_proxy *pr = p->s->proxy;
    if (p->linked) {
        if (p->prev)
            p->prev->next = p->next;
        else if (pr->live[p->worker] == p)
            pr->live[p->worker] = p->next;
        if (p->next)
            p->next->prev = p->prev;
    }
    if (p->qtimer)
        event_free(p->qtimer);
    if (p->queued)
        q_give(pr, p->q_plan);
    if (p->call)
        qg__upcall_cancel(p->call);
    if (p->defer)
        event_free(p->defer);
    if (p->body)
        evbuffer_free(p->body);
    if (p->pend)
        evbuffer_free(p->pend);
    if (p->outq)
        evbuffer_free(p->outq);
    qg__sse_free(p->sse);
    free(p);
}

/* Cancel the upstream request (also from inside its callbacks: the
 * client closes the connection when its parser returns). */
static void px_cancel_upstream(px *p)
{
    if (p->call) {
        qg__upcall_cancel(p->call);
        p->call = NULL;
    }
}

/* ------------------------------------------------------------ settle */

/* What px_tokens charged instead of the upstream's report: the ledger
 * row's detail (empty when the report was charged as it came). */
typedef struct px_charge {
    int64_t in, out;
    int est;
    char detail[sizeof ((qg_ledger_row *)0)->detail];
} px_charge;

/* Note an anomaly: the row's detail, a log line, the metric. */
static void px_anomaly(const px *p, px_charge *c, qg_metrics_anomaly kind,
                       const char *what)
{
    size_t n = strlen(c->detail);
    if (n + 2 < sizeof c->detail)
        snprintf(c->detail + n, sizeof c->detail - n, "%s%s", n ? "; " : "",
                 what);
    fprintf(stderr, "quotagate: proxy: request %s: %s\n", p->rid, what);
    qg__metrics_usage_anomaly(p->s->metrics, kind);
}

/* Tokens to charge from what the response showed (docs/proxy.md):
 * reported counts when present, else the input estimate and ceil(content
 * bytes / 4); a stream's output counts as reported only when its final
 * usage came.  Then the limits of what a caller can be charged:
 *  - output never above the request's max_tokens (max_completion_tokens)
 *    when it set one: a report above it is charged at the cap;
 *  - a reported count above QG_TOKENS_MAX is no report at all: it is
 *    replaced by the estimate (output then within the cap too).
 * So the settle can never fail on the numbers. */
static void px_tokens(const px *p, px_charge *c)
{
    int64_t by_bytes = (p->content_bytes + 3) / 4;
    int64_t cap = p->info.max_output_tokens;   /* -1: none asked */
    char what[128];
    c->est = 0;
    c->detail[0] = '\0';
    if (p->u.have_input && p->u.input_tokens <= QG_TOKENS_MAX) {
        c->in = p->u.input_tokens;
    } else {
        c->in = p->in_est;
        c->est = 1;
        if (p->u.have_input) {
            snprintf(what, sizeof what, "input_tokens %lld reported, above "
                     "the bound: charged the estimate %lld",
                     (long long)p->u.input_tokens, (long long)c->in);
            px_anomaly(p, c, QG_ANOMALY_INPUT_OVER_BOUND, what);
        }
    }
    if (p->final_usage && p->u.have_output &&
        (p->u.output_tokens <= QG_TOKENS_MAX || cap >= 0)) {
        c->out = p->u.output_tokens;
        if (cap >= 0 && c->out > cap) {
            c->out = cap;
            snprintf(what, sizeof what, "output_tokens %lld reported, above "
                     "max_tokens: charged max_tokens %lld",
                     (long long)p->u.output_tokens, (long long)cap);
            px_anomaly(p, c, QG_ANOMALY_OUTPUT_OVER_CAP, what);
        }
    } else {
        int64_t seen = p->u.have_output ? p->u.output_tokens : 0;
        if (seen > QG_TOKENS_MAX) {
            snprintf(what, sizeof what, "output_tokens %lld reported, above "
                     "the bound: charged the estimate %lld",
                     (long long)seen,
                     (long long)(cap >= 0 && by_bytes > cap ? cap : by_bytes));
            px_anomaly(p, c, QG_ANOMALY_OUTPUT_OVER_BOUND, what);
            seen = 0;
        }
        c->out = seen > by_bytes ? seen : by_bytes;
        if (cap >= 0 && c->out > cap)
            c->out = cap;      /* an estimate never passes the cap either */
        if (c->out > QG_TOKENS_MAX)
            c->out = QG_TOKENS_MAX;
        c->est = 1;
    }
}

static void px_settle_with(px *p, qg_settle_status st, const px_charge *c);

static void px_settle(px *p, qg_settle_status st, int64_t in, int64_t out,
                      int estimated)
{
    px_charge c = {.in = in, .out = out, .est = estimated};
    px_settle_with(p, st, &c);
}

static void px_settle_with(px *p, qg_settle_status st, const px_charge *c)
{
    static const int row_status[] = {0, QG_ROW_COMPLETED, QG_ROW_CANCELLED,
                                     QG_ROW_FAILED};
    char err[256];
    qg_settle_req req;
    qg_settle_result res;
    qg_ledger_row row;
    int64_t now;

    if (p->settled)
        return;
    p->settled = 1;
    now = qg__server_now(p->s);
    req = (qg_settle_req){.request_id = p->rid, .status = st,
                          .input_tokens = c->in, .output_tokens = c->out,
                          .weight_milli = -1, .no_charge = p->no_charge};
    if (qg_engine_settle(p->s->engine, &req, now, &res, err, sizeof err) !=
        QG_OK) {
        fprintf(stderr, "quotagate: proxy: settle of %s: %s\n", p->rid, err);
        return;
    }
    qg__metrics_settle(p->s->metrics, &res);
    qg__row_of_settle(&row, p->rid, p->subject, row_status[st], c->in,
                     c->out, &res, now);
    row.estimated = c->est;
    qg__row_copy(row.detail, sizeof row.detail, c->detail);
    if (qg__ledger_submit(p->s->ledger, &row, NULL, NULL) != QG_OK)
        fprintf(stderr, "quotagate: ledger queue full: the settle of "
                "request %s was not queued\n", p->rid);
}

/* Settle with what was seen so far (status cancelled). */
static void px_settle_partial(px *p)
{
    px_charge c;
    if (p->settled)
        return;
    px_tokens(p, &c);
    px_settle_with(p, QG_SETTLE_CANCELLED, &c);
}

/* ----------------------------------------------------------- replies */

#define MAX_OUT_HDR (QG_HDR_MAX + 7)

static int px_headers(px *p, qg_http_out_header *h, int with_retry)
{
    int n = 0;
    for (int i = 0; i < p->hb.n; i++)
        h[n++] = p->hb.h[i];
    h[n++] = (qg_http_out_header){"X-Request-Id", p->rid};
    if (p->dg_from[0]) {
        h[n++] = (qg_http_out_header){"x-quotagate-downgraded-from",
                                      p->dg_from};
        h[n++] = (qg_http_out_header){"x-quotagate-model", p->dg_model};
    }
    if (p->qms[0])
        h[n++] = (qg_http_out_header){"x-quotagate-queued-ms", p->qms};
    if (with_retry && p->retry_after[0])
        h[n++] = (qg_http_out_header){"Retry-After", p->retry_after};
    return n;
}

/* Answer (releases r) and free p. */
static void px_reply(px *p, int status, const char *ctype, const char *body,
                     size_t len, int with_retry)
{
    qg_http_out_header h[MAX_OUT_HDR];
    int n = px_headers(p, h, with_retry);
    qg__metrics_http(p->s->metrics, p->route, status);
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_respond(p->r, status, h, n, ctype, body, len);
    px_free(p);
}

static void px_reply_error(px *p, int status, const char *type,
                           const char *msg)
{
    char *body = qg__alloc_fails("error body") ? NULL
                                               : qg__json_error(type, msg);
    px_reply(p, status, "application/json", body ? body : "{}",
             body ? strlen(body) : 2, 0);
    free(body);
}

/* ----------------------------------------------------------- streams */

static void px_abort_cb(evutil_socket_t fd, short what, void *arg);

/* The caller is gone (on_close, or a failed write): stop the upstream,
 * charge what was produced, release r.  Soon, from the event loop. */
static void px_schedule_abort(px *p)
{
    struct timeval zero = {0, 0};
    p->client_gone = 1;
    if (p->defer)
        event_add(p->defer, &zero);
}

/* Queue stream bytes for the caller: what one upstream read brought is
 * written in one go by px_flush (one system call instead of one per SSE
 * event; nothing waits longer than the read being handled). */
static void px_write(px *p, const char *data, size_t len)
{
    if (p->client_gone || len == 0)
        return;
    if (px_add(p->outq, data, len, "stream output") != 0)
        px_schedule_abort(p);
}

static void px_drained(void *arg);

/* Write what px_write queued; pause the upstream above the high-water
 * mark (resumed by px_drained). */
static void px_flush(px *p)
{
    size_t n = evbuffer_get_length(p->outq);
    const char *out;
    int rc;
    if (n == 0)
        return;
    if (p->client_gone) {
        evbuffer_drain(p->outq, n);
        return;
    }
    out = px_pullup(p->outq, "stream output pullup");
    rc = out ? qg__http_stream_write(p->r, out, n) : -1;
    evbuffer_drain(p->outq, n);
    if (rc < 0) {
        px_schedule_abort(p);
    } else if (rc == 1 && !p->paused && p->call) {
        qg__upcall_pause(p->call, 1);
        p->paused = 1;
        qg__http_stream_on_drain(p->r, px_drained, p);
    }
}

static void px_drained(void *arg)
{
    px *p = arg;
    if (p->paused && p->call)
        qg__upcall_pause(p->call, 0);
    p->paused = 0;
}

static int on_event(const char *event, size_t elen, const char *data,
                    size_t dlen, void *ud)
{
    px *p = ud;
    if (p->shape == QG_SHAPE_OPENAI) {
        int only = 0, rc;
        if (dlen == 6 && memcmp(data, "[DONE]", 6) == 0)
            return 0;
        int64_t cb;
        rc = qg__usage_openai_chunk_bytes(data, dlen, &p->u, &only, &cb);
        if (rc == 1) {
            p->final_usage = 1;
            if (only && p->filter)
                p->drop = 1;
        }
        if (rc >= 0)
            p->content_bytes += cb;
    } else {
        int64_t cb;
        int rc = qg__usage_anthropic_event_bytes(event, elen, data, dlen,
                                                &p->u, &cb);
        if (rc == 1 && !memmem(data, dlen, "\"message_start\"", 15))
            p->final_usage = 1;          /* a message_delta's usage */
        if (rc == 0)
            p->content_bytes += cb;
    }
    return 0;
}

/* Pass stream bytes on (event by event in filter mode) and read them.
 * Out of memory the stream is cut like a caller who left (px_abort_cb):
 * never an event lost or two joined in a stream that goes on; in filter
 * mode nothing more is split once the caller is gone. */
static void px_stream_bytes(px *p, const char *data, size_t n)
{
    if (!p->filter) {
        if (qg__sse_feed(p->sse, data, n, on_event, p) == QG_ENOMEM)
            px_schedule_abort(p);       /* its usage can no longer be read */
        px_write(p, data, n);
        return;
    }
    while (n > 0 && !p->client_gone) {
        size_t k = qg__sse_split_next(&p->split, data, n);
        if (px_add(p->pend, data, k ? k : n, "stream event") != 0) {
            px_schedule_abort(p);
            return;
        }
        if (k == 0)
            return;                     /* the event goes on */
        data += k;
        n -= k;
        {
            size_t elen = evbuffer_get_length(p->pend);
            const char *ev = px_pullup(p->pend, "stream event pullup");
            if (!ev) {
                px_schedule_abort(p);
                return;
            }
            p->drop = 0;
            if (qg__sse_feed(p->sse, ev, elen, on_event, p) == QG_ENOMEM) {
                px_schedule_abort(p);   /* the usage chunk is not known */
                return;
            }
            if (!p->drop)
                px_write(p, ev, elen);
            evbuffer_drain(p->pend, elen);
        }
    }
}

/* ---------------------------------------------- upstream callbacks */

static void up_head(void *arg, const qg_upresp *ur)
{
    px *p = arg;
    p->status = ur->status;
    qg__row_copy(p->ctype, sizeof p->ctype, ur->ctype);
    qg__row_copy(p->retry_after, sizeof p->retry_after, ur->retry_after);
    if (p->caller_stream && p->status == 200 &&
        strncasecmp(p->ctype, "text/event-stream", 17) == 0 &&
        !p->client_gone) {
        qg_http_out_header h[MAX_OUT_HDR + 1];
        int n = px_headers(p, h, 0);
        h[n++] = (qg_http_out_header){"Cache-Control", "no-cache"};
        if (qg__http_stream_start(p->r, 200, h, n, p->ctype) == 0) {
            p->streaming = 1;
            qg__http_stream_on_drain(p->r, NULL, NULL);
            qg__metrics_http(p->s->metrics, p->route, 200);
        } else {
            px_schedule_abort(p);
        }
    }
}

/* A non-streamed answer that cannot be held whole to read its usage
 * (docs/proxy.md, "Answers too large to hold"): past MAX_BUFFERED_BODY it
 * is 502 upstream_response_too_large, out of memory 500.  Never a 200
 * with a damaged body.  The upstream call is cancelled at once (its
 * connection closed, never pooled) and the request settled once: a 2xx
 * answer at its reservation in full, status cancelled (the usage is in
 * the part never read, and the upstream produced at least that much),
 * with a detail (and, too large, the anomaly metric); an error answer by
 * its status's own rule (failed; a 429 charges nothing).  From up_body,
 * inside the upstream client's callback: p is freed. */
static void px_cut_buffered(px *p, int oom)
{
    char msg[200];
    snprintf(msg, sizeof msg, "the upstream's answer passed %u bytes "
             "(64 MiB), the most a non-streamed answer may hold to read its "
             "usage: it was cut off and not passed on", MAX_BUFFERED_BODY);
    px_cancel_upstream(p);
    if (p->status >= 200 && p->status <= 299) {
        int64_t out = p->info.max_output_tokens;
        px_charge c = {.in = p->in_est,
                       .out = out < 0 ? QG_DEFAULT_OUTPUT_ESTIMATE : out,
                       .est = 1};
        char what[160];
        if (oom)
            snprintf(what, sizeof what, "out of memory holding the "
                     "response body: cut off, usage unread, charged the "
                     "reservation");
        else
            snprintf(what, sizeof what, "the response body passed %u "
                     "bytes: cut off, usage unread, charged the reservation",
                     MAX_BUFFERED_BODY);
        /* QG_ANOMALY_COUNT: the detail and the log line, no metric */
        px_anomaly(p, &c, oom ? QG_ANOMALY_COUNT
                              : QG_ANOMALY_RESPONSE_TOO_LARGE, what);
        px_settle_with(p, QG_SETTLE_CANCELLED, &c);
    } else {
        p->no_charge = p->status == 429;
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
    }
    if (oom)
        px_reply_error(p, 500, "internal_error", "out of memory");
    else
        px_reply_error(p, 502, "upstream_response_too_large", msg);
}

/* A piece of the upstream's (de-chunked) body, as it arrives. */
static void up_body(void *arg, const char *data, size_t n)
{
    px *p = arg;
    if (n == 0)
        return;
    if (p->streaming)
        px_stream_bytes(p, data, n);    /* written at up_read_end */
    else if (n > MAX_BUFFERED_BODY - evbuffer_get_length(p->body))
        px_cut_buffered(p, 0);          /* p is gone */
    else if (px_add(p->body, data, n, "answer body") != 0)
        px_cut_buffered(p, 1);          /* p is gone */
}

/* The upstream answered whole (non-stream). */
static void px_finish_buffered(px *p)
{
    size_t len = evbuffer_get_length(p->body);
    const char *body = px_pullup(p->body, "answer body pullup");
    qg_settle_status ok = p->client_gone ? QG_SETTLE_CANCELLED
                                         : QG_SETTLE_COMPLETED;
    char msg[160];

    if (!body) {                        /* out of memory: unreadable */
        px_cut_buffered(p, 1);
        return;
    }

    if (p->status >= 500) {
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        snprintf(msg, sizeof msg, "the upstream answered HTTP %d",
                 p->status);
        px_reply_error(p, 502, "upstream_error", msg);
        return;
    }
    if (p->status < 200 || p->status > 299) {
        /* Refusals are passed through.  The upstream's 429 costs
         * nothing at all (its rate limit is not the caller's usage);
         * other 4xx, the caller's own errors, the per-request base. */
        p->no_charge = p->status == 429;
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        px_reply(p, p->status, p->ctype[0] ? p->ctype : NULL, body, len, 1);
        return;
    }
    {
        int rc = p->shape == QG_SHAPE_OPENAI
                     ? qg__usage_openai_json(body, len, &p->u)
                     : qg__usage_anthropic_json(body, len, &p->u);
        px_charge c;
        if (rc != 1)
            memset(&p->u, 0, sizeof p->u);
        p->final_usage = rc == 1;
        if (!(p->final_usage && p->u.have_output &&
              p->u.output_tokens <= QG_TOKENS_MAX))  /* else unused */
            p->content_bytes = qg__content_bytes_json(body, len, p->shape);
        if (!p->settled) {
            px_tokens(p, &c);
            px_settle_with(p, ok, &c);
        }
    }
    px_reply(p, p->status, p->ctype[0] ? p->ctype : NULL, body, len, 0);
}

/* The end of one upstream read: pass its stream bytes on. */
static void up_read_end(void *arg)
{
    px *p = arg;
    if (p->streaming)
        px_flush(p);
}

static void up_done(void *arg, int uerr)
{
    px *p = arg;
    p->call = NULL;                     /* over: the client forgot it */
    if (p->streaming)
        px_flush(p);                    /* what arrived before the end */
    if (uerr != QG_UP_OK || p->status == 0) {
        /* the upstream failed (connect, reset, timeout, bad answer) */
        if (p->streaming) {
            /* mid-stream: charge what was produced, truncate */
            px_settle_partial(p);
            qg__http_on_close(p->r, NULL, NULL);
            qg__http_respond(p->r, 502, NULL, 0, NULL, NULL, 0);
            px_free(p);
        } else {
            px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
            px_reply_error(p, 502,
                           uerr == QG_UP_ETIMEOUT ? "upstream_timeout"
                                                  : "upstream_unavailable",
                           uerr == QG_UP_ETIMEOUT
                               ? "the upstream did not answer in time"
                               : "the upstream could not be reached or "
                                 "closed the connection");
        }
        return;
    }
    if (!p->streaming) {
        px_finish_buffered(p);
        return;
    }
    /* a stream that ended: flush a last partial event, settle, end */
    if (p->filter && evbuffer_get_length(p->pend)) {
        size_t n = evbuffer_get_length(p->pend);
        const char *ev = px_pullup(p->pend, "stream event pullup");
        if (ev)
            px_write(p, ev, n);
        else
            px_schedule_abort(p);       /* cut, not passed on short */
        evbuffer_drain(p->pend, n);
        px_flush(p);
    }
    qg__sse_finish(p->sse);
    if (!p->settled) {
        px_charge c;
        px_tokens(p, &c);
        px_settle_with(p, p->client_gone ? QG_SETTLE_CANCELLED
                                         : QG_SETTLE_COMPLETED, &c);
    }
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_stream_on_drain(p->r, NULL, NULL);
    if (p->client_gone)
        qg__http_respond(p->r, 502, NULL, 0, NULL, NULL, 0);
    else
        qg__http_stream_end(p->r);
    px_free(p);
}

/* The caller went away: a stream (or a streaming request still waiting
 * for its headers) stops the upstream and is charged what was produced;
 * a non-streaming request lets the upstream finish so that the real
 * usage is charged (status cancelled). */
static void px_abort_cb(evutil_socket_t fd, short what, void *arg)
{
    px *p = arg;
    (void)fd;
    (void)what;
    if (!p->streaming && !p->caller_stream && p->call)
        return;                         /* settled when the answer comes */
    px_cancel_upstream(p);
    px_settle_partial(p);
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_stream_on_drain(p->r, NULL, NULL);
    qg__http_respond(p->r, 499, NULL, 0, NULL, NULL, 0);
    px_free(p);
}

static void px_on_close(void *arg)
{
    px *p = arg;
    p->client_gone = 1;
    px_abort_cb(-1, 0, p);
}

/* ----------------------------------------------------------- handler */


/* The overage policy in force for a refusal: the binding window's own
 * policy when it sets one, else the plan's.  NULL when unknown. */
static const qg_overage *refusal_overage(const qg_rules *rules,
                                         const qg_decision *d)
{
    int pi = d->plan ? qg__rules_find_plan(rules, d->plan) : -1;
    const qg_plan *plan;
    const qg_window_spec *w = NULL;
    if (pi < 0)
        return NULL;
    plan = &rules->plans[pi];
    if (d->binding >= 0 && d->binding < d->nviews) {
        const qg_window_view *v = &d->views[d->binding];
        if (v->org) {
            int oi = d->org ? qg__rules_find_org(rules, d->org) : -1;
            if (oi >= 0) {
                const qg_org_spec *o = &rules->orgs[oi];
                for (int i = 0; i < o->nwindows; i++)
                    if (v->name && !strcmp(o->windows[i].name, v->name))
                        w = &o->windows[i];
            }
        } else if (v->name) {
            w = qg__plan_find_window(plan, v->name);
        }
    }
    if (w && w->overage.policy != QG_POLICY_NONE)
        return &w->overage;
    return &plan->overage;
}

static void check_row(qg_ledger_row *row, const qg_decision *d,
                      const char *rid, const char *subject,
                      const qg_request_info *info)
{
    qg__row_of_decision(row, d, rid, subject, info->input_tokens_estimate,
                       info->max_output_tokens < 0
                           ? QG_DEFAULT_OUTPUT_ESTIMATE
                           : info->max_output_tokens);
    row->estimated = 1;
}

/* 1 when s[0..n) holds a CR or LF (it would end the header early). */
static int has_eol(const char *s, size_t n)
{
    return memchr(s, '\r', n) != NULL || memchr(s, '\n', n) != NULL;
}

/* The request line and headers sent upstream, into out: the caller's
 * headers that go upstream (those longer than the old evhttp-based
 * client's limits are dropped, as before), then the proxy's own.
 * Returns 0, QG_EINVAL when a header cannot be forwarded (a CR or LF in
 * it), or QG_ENOMEM. */
static int up_headers(px *p, struct evbuffer *out, size_t body_len)
{
    const qg_http_req *r = p->r;
    const char *key = getenv("QUOTAGATE_UPSTREAM_KEY");
    int have_ctype = 0, rc = 0;

    rc |= qg__alloc_fails("request head") ||
          evbuffer_add_printf(out, "POST %s%s HTTP/1.1\r\nHost: %s\r\n",
                              qg__upstream_prefix(p->up), r->path,
                              qg__upstream_host(p->up)) < 0;
    for (int i = 0; i < r->nheaders; i++) {
        const qg_http_header *h = &r->headers[i];
        if (!qg__proxy_forward_header(h->name, h->name_len) ||
            h->name_len >= 256 || h->value_len >= 8192)
            continue;
        if (has_eol(h->name, h->name_len) || has_eol(h->value, h->value_len))
            return QG_EINVAL;
        if (h->name_len == 12 && strncasecmp(h->name, "content-type", 12) == 0)
            have_ctype = 1;
        rc |= px_add(out, h->name, h->name_len, "request head");
        rc |= px_add(out, ": ", 2, "request head");
        rc |= px_add(out, h->value, h->value_len, "request head");
        rc |= px_add(out, "\r\n", 2, "request head");
    }
    rc |= qg__alloc_fails("request head") ||
          evbuffer_add_printf(out, "Content-Length: %zu\r\nX-Request-Id: "
                              "%s\r\n%s", body_len, p->rid,
                              have_ctype ? "" : "Content-Type: "
                                                "application/json\r\n") < 0;
    if (key && *key) {
        if (has_eol(key, strlen(key)))
            return QG_EINVAL;
        if (p->shape == QG_SHAPE_OPENAI)
            rc |= qg__alloc_fails("request head") ||
                  evbuffer_add_printf(out, "Authorization: Bearer %s\r\n",
                                      key) < 0;
        else
            rc |= qg__alloc_fails("request head") ||
                  evbuffer_add_printf(out, "x-api-key: %s\r\n", key) < 0;
    }
    rc |= px_add(out, "\r\n", 2, "request head");
    return rc ? QG_ENOMEM : QG_OK;
}

/* The upstream client's callbacks (upstream.h). */
static const qg_upcall_cbs up_cbs = {up_head, up_body, up_done,
                                     up_read_end};

static void px_admit(px *p);
static void px_discard(px *p);

/* The upstream of model m (an index of rules): its own `upstream:`, else
 * --upstream.  NULL when it has none (err "") or its URL cannot be used
 * (err says why).  On p's worker thread. */
static qg_upstream *model_upstream(px *p, const qg_rules *rules, int m,
                                   char *err, size_t errcap)
{
    qg_proxy *pr = p->s->proxy;
    const char *url;
    upcache *c;
    err[0] = '\0';
    if (m < 0 || m >= rules->nmodels || !(url = rules->models[m].upstream))
        return pr->up;
    c = &pr->cache[p->worker];
    if (c->rules != rules) {
        memset(c, 0, sizeof *c);
        c->rules = rules;
    }
    if (!c->m[m])
        c->m[m] = qg__upstream_set_get(pr->set, url, err, errcap);
    return c->m[m];
}

/* Answer a request whose model has no usable upstream (nothing reserved,
 * nothing recorded). */
static void px_no_upstream(px *p, const char *model, const char *why)
{
    char msg[512];
    qg_server *s = p->s;
    qg_http_req *r = p->r;
    if (*why)
        snprintf(msg, sizeof msg, "the upstream of model %s cannot be "
                 "used: %s", model, why);
    else
        snprintf(msg, sizeof msg, "model %s has no upstream: give it "
                 "upstream: in the rules or start the gateway with "
                 "--upstream URL", model);
    px_discard(p);                      /* model may live in p */
    if (*why)
        qg__reply_error(s, r, 502, "upstream_unavailable", msg);
    else
        qg__reply_error(s, r, 503, "no_upstream", msg);
}

/* Release a request that never reached the upstream (the reply is sent
 * by the caller, through r, after this). */
static void px_discard(px *p)
{
    qg__http_on_close(p->r, NULL, NULL);
    px_free(p);
}

/* The caller left while held: nothing was reserved, nothing is counted. */
static void px_q_gone(void *arg)
{
    px *p = arg;
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_respond(p->r, 499, NULL, 0, NULL, NULL, 0);
    px_free(p);
}

static void px_q_fire(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    px_admit(arg);
}

/* Hold p for ms (a timer on the worker's loop, never a blocked thread);
 * the first hold takes a slot of plan's queue (bounded by cap).
 * Returns 0; 1 when the queue is full; -1 out of memory (answer the
 * refusal instead). */
static int px_hold(px *p, const char *plan, int cap, int64_t ms,
                   int64_t now)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (!p->qtimer && !(p->qtimer = evtimer_new(p->base, px_q_fire, p)))
        return -1;
    if (!p->queued) {
        if (q_take(p->s->proxy, plan, cap) < 0)
            return 1;
        p->queued = 1;
        p->q_start_ms = now;
        qg__row_copy(p->q_plan, sizeof p->q_plan, plan);
        p->settled = 1;                 /* nothing reserved while held */
        px_link(p);
        qg__http_on_close(p->r, px_q_gone, p);
    }
    if (evtimer_add(p->qtimer, &tv) != 0)
        return -1;
    return 0;
}

static void proxy(qg_server *s, qg_http_req *r, const char *subject,
                  int shape)
{
    qg_request_info info;
    const char *v;
    size_t vlen;
    int rc;
    px *p;

    if (!s->proxy) {
        qg__reply_error(s, r, 503, "no_upstream",
                       "this gateway has no upstream: start it with "
                       "--upstream URL");
        return;
    }
    if (!subject) {
        qg__reply_error(s, r, 403, "forbidden",
                       "the proxy needs a subject key");
        return;
    }
    rc = qg__request_fields(r->body, r->body_len, shape, &info);
    if (rc != QG_OK) {
        if (rc == QG_ENOMEM)
            qg__reply_error(s, r, 500, "internal_error", "out of memory");
        else
            qg__reply_error(s, r, 400, "invalid_request",
                           shape == QG_SHAPE_OPENAI
                               ? "the body is not a valid chat completions "
                                 "request (JSON object with a model, "
                                 "messages, optional integer max_tokens)"
                               : "the body is not a valid messages request "
                                 "(JSON object with a model, messages and "
                                 "an integer max_tokens)");
        return;
    }
    if (qg__alloc_fails("px") || !(p = calloc(1, sizeof *p))) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    p->s = s;
    p->r = r;
    p->worker = r->worker;
    p->shape = shape;
    p->route = shape == QG_SHAPE_OPENAI ? QG_ROUTE_CHAT : QG_ROUTE_MESSAGES;
    p->base = qg__http_req_base(r);
    p->info = info;
    qg__row_copy(p->subject, sizeof p->subject, subject);
    v = qg__http_header_get(r, "x-request-id", &vlen);
    if (v && vlen > 0) {
        if (vlen > QG_REQUEST_ID_MAX) {
            free(p);
            qg__reply_error(s, r, 400, "invalid_request",
                           "X-Request-Id is longer than 255 bytes");
            return;
        }
        memcpy(p->rid, v, vlen);
        p->rid[vlen] = '\0';
    } else {
        snprintf(p->rid, sizeof p->rid, "px-%lld-%d-%" PRIu64,
                 (long long)qg__server_now(s), r->worker,
                 atomic_fetch_add(&px_counter, 1) + 1);
    }
    px_admit(p);
}

/* Admission, first or again for a held request (docs/proxy.md): check,
 * then downgrade, hold (queue) or refuse as the overage policy says, or
 * forward. */
static void px_admit(px *p)
{
    qg_server *s = p->s;
    qg_http_req *r = p->r;
    const qg_request_info *info = &p->info;
    const char *subject = p->subject;
    char err[320];
    qg_decision dbuf, dg, *d = &dbuf;
    char dg_window[sizeof ((qg_ledger_row *)0)->window];
    qg_check_req creq;
    qg_ledger_row row, prior;    /* prior: a replay from the ledger */
    const qg_rules *rules;
    const qg_overage *ov = NULL;
    char *nbody = NULL;
    const char *body = r->body, *head;
    size_t blen = r->body_len, nlen;
    int added = 0, rewrite_failed = 0, queue_full = 0, rc;
    int64_t now;

    if (qg__ledger_queued(s->ledger) + 1024 >= 65536) {
        px_discard(p);
        qg__reply_error(s, r, 503, "overloaded",
                       "the ledger is behind; retry shortly");
        return;
    }

    /* the model's upstream (an unknown model is the engine's to refuse) */
    rules = qg_engine_rules(s->engine);
    {
        int m = qg_rules_find_model(rules, info->model);
        if (m >= 0 && !(p->up = model_upstream(p, rules, m, err,
                                               sizeof err))) {
            px_no_upstream(p, info->model, err);
            return;
        }
    }

    /* admission */
    now = qg__server_now(s);
    creq = (qg_check_req){.subject = subject, .request_id = p->rid,
                          .model = info->model,
                          .input_tokens = info->input_tokens_estimate,
                          .max_output_tokens = info->max_output_tokens};
    rc = qg__server_check(s, &creq, now, d, &prior, err, sizeof err);
    if (rc == QG_ERANGE && info->max_output_tokens > QG_TOKENS_MAX)
        snprintf(err, sizeof err, "%s must be at most %lld (the bound on a "
                 "token count)", p->shape == QG_SHAPE_OPENAI
                     ? "max_tokens (or max_completion_tokens)" : "max_tokens",
                 (long long)QG_TOKENS_MAX);
    if (rc != QG_OK) {
        px_discard(p);
        qg__reply_engine_error(s, r, rc, err);
        return;
    }
    rules = qg_engine_rules(s->engine);
    if (d->replayed) {
        px_discard(p);
        qg__reply_error(s, r, 409, "duplicate_request_id",
                       "this X-Request-Id was already used; every proxied "
                       "call needs a fresh one");
        return;
    }
    if (d->outcome == QG_REJECT || d->outcome == QG_REJECT_NEVER)
        ov = refusal_overage(rules, d);
    /* downgrade: the refusal charged nothing and is not remembered, so
     * the lighter model is checked under the same request id */
    if (ov && ov->policy == QG_POLICY_DOWNGRADE && ov->to_model >= 0 &&
        ov->to_model < rules->nmodels &&
        strcmp(rules->models[ov->to_model].name, info->model) != 0) {
        const char *to = rules->models[ov->to_model].name;
        qg_check_req c2 = creq;
        qg_upstream *to_up = model_upstream(p, rules, ov->to_model, err,
                                            sizeof err);
        c2.model = to;
        if (!to_up) {                   /* the refusal charged nothing */
            px_no_upstream(p, to, err);
            return;
        }
        if (qg_engine_check(s->engine, &c2, now, &dg, NULL, 0) == QG_OK &&
            !dg.replayed && dg.outcome == QG_ALLOW) {
            p->up = to_up;
            qg__row_copy(p->dg_from, sizeof p->dg_from, info->model);
            qg__row_copy(p->dg_model, sizeof p->dg_model, to);
            if (d->binding >= 0)
                snprintf(dg_window, sizeof dg_window, "downgraded:%s",
                         d->views[d->binding].name);
            else
                snprintf(dg_window, sizeof dg_window, "downgraded:");
            d = &dg;
        }
    }
    /* queue: hold while the exact retry instant still fits max_wait (the
     * refusal charged nothing and is not remembered: the re-check runs
     * under the same request id); only the final decision is recorded */
    if (ov && ov->policy == QG_POLICY_QUEUE && d->outcome == QG_REJECT &&
        d->retry_after_ms > 0 && d->plan) {
        int64_t waited = p->queued ? now - p->q_start_ms : 0;
        if (waited < 0)
            waited = 0;
        if (waited + d->retry_after_ms <= ov->max_wait_ms) {
            rc = px_hold(p, d->plan, ov->queue_size, d->retry_after_ms, now);
            if (rc == 0)
                return;
            queue_full = rc == 1;
        }
    }
    if (p->queued) {
        int64_t w = now - p->q_start_ms;
        snprintf(p->qms, sizeof p->qms, "%lld", (long long)(w > 0 ? w : 0));
        q_give(s->proxy, p->q_plan);    /* frees its slot */
        p->queued = 0;
        p->settled = 0;
    }
    qg__metrics_record(s->metrics, d);
    check_row(&row, d, p->rid, subject, info);
    if (p->dg_from[0])
        qg__row_copy(row.window, sizeof row.window, dg_window);
    if (qg__ledger_submit(s->ledger, &row, NULL, NULL) != QG_OK)
        fprintf(stderr, "quotagate: ledger queue full: the row of request "
                "%s was not queued\n", p->rid);
    if (qg__headers_for_decision(d, rules, now, &p->hb) < 0)
        p->hb.n = 0;
    if (d->outcome != QG_ALLOW) {
        qg_http_out_header h[MAX_OUT_HDR];
        int n = 0;
        char *json;
        if (queue_full) {
            char msg[400];
            snprintf(msg, sizeof msg,
                     "the quota is used up and the queue of plan %s is "
                     "full (%d requests already waiting); retry after "
                     "Retry-After seconds", d->plan,
                     (int)ov->queue_size);
            json = qg__json_error("queue_full", msg);
        } else {
            json = qg__json_check(d, p->rid, rules->unit);
        }
        for (int i = 0; i < p->hb.n; i++)
            h[n++] = p->hb.h[i];
        h[n++] = (qg_http_out_header){"X-Request-Id", p->rid};
        if (p->qms[0])
            h[n++] = (qg_http_out_header){"x-quotagate-queued-ms", p->qms};
        qg__reply_json(s, r, 429, json, h, n);
        px_discard(p);
        return;
    }

    /* the upstream request */
    p->in_est = info->input_tokens_estimate;
    p->caller_stream = info->stream;
    if (p->shape == QG_SHAPE_OPENAI && (info->stream || p->dg_from[0])) {
        if (!qg__alloc_fails("rewritten body") &&
            qg__request_rewrite_openai(r->body, r->body_len, &nbody, &nlen,
                                      &added,
                                      p->dg_from[0] ? p->dg_model : NULL) ==
            QG_OK) {
            body = nbody;
            blen = nlen;
            p->filter = added;
        } else if (p->dg_from[0]) {
            rewrite_failed = 1;
        }
    } else if (p->dg_from[0]) {
        if (!qg__alloc_fails("rewritten body") &&
            qg__request_replace_model(r->body, r->body_len, p->dg_model,
                                     &nbody, &nlen) == QG_OK) {
            body = nbody;
            blen = nlen;
        } else {
            rewrite_failed = 1;
        }
    }
    px_link(p);
    if (!(p->body = px_evbuffer("answer buffer")) ||
        !(p->pend = px_evbuffer("event buffer")) ||
        !(p->outq = px_evbuffer("output buffer")) ||
        !(p->sse = qg__sse_new(SSE_MAX_EVENT)) ||
        qg__alloc_fails("abort timer") ||
        !(p->defer = event_new(p->base, -1, 0, px_abort_cb, p))) {
        free(nbody);
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        px_reply_error(p, 500, "internal_error", "out of memory");
        return;
    }
    if (rewrite_failed) {
        /* a body that qg__request_fields accepted: only out of memory */
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        px_reply_error(p, 500, "internal_error",
                       "the downgraded request could not be written");
        return;
    }
    /* the request head is built in p->pend (empty until the stream) */
    if ((rc = up_headers(p, p->pend, blen)) != QG_OK) {
        free(nbody);
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        if (rc == QG_ENOMEM)
            px_reply_error(p, 500, "internal_error", "out of memory");
        else
            px_reply_error(p, 400, "invalid_request",
                           "a request header cannot be forwarded");
        return;
    }
    head = px_pullup(p->pend, "request head pullup");
    if (head)
        p->call = qg__upstream_send(p->up, p->worker, p->base, head,
                                   evbuffer_get_length(p->pend), body, blen,
                                   &up_cbs, p);
    evbuffer_drain(p->pend, evbuffer_get_length(p->pend));
    free(nbody);
    if (!p->call) {
        px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        px_reply_error(p, 500, "internal_error", "out of memory");
        return;
    }
    qg__http_on_close(r, px_on_close, p);
}

void qg__h_proxy_openai(qg_server *s, qg_http_req *r, const char *subject)
{
    proxy(s, r, subject, QG_SHAPE_OPENAI);
}

void qg__h_proxy_anthropic(qg_server *s, qg_http_req *r, const char *subject)
{
    proxy(s, r, subject, QG_SHAPE_ANTHROPIC);
}

/* ------------------------------------------------------ start / stop */

int qg__proxy_start(qg_server *s, char *err, size_t errcap)
{
    qg_proxy *pr;
    const char *t = getenv("QUOTAGATE_UPSTREAM_TIMEOUT_MS");
    int timeout = t ? atoi(t) : 0;
    int workers = s->opts.workers > 0 ? s->opts.workers : 2;

    /* always set up: models may name their own upstreams (rules.h) */
    s->proxy = NULL;
    if (!(pr = calloc(1, sizeof *pr)) ||
        !(pr->live = calloc((size_t)workers, sizeof *pr->live)) ||
        !(pr->cache = calloc((size_t)workers, sizeof *pr->cache)) ||
        !(pr->set = qg__upstream_set_new(workers, timeout,
                                        getenv("QUOTAGATE_UPSTREAM_CA")))) {
        if (pr) {
            free(pr->live);
            free(pr->cache);
        }
        free(pr);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    pr->nworkers = workers;
    pthread_mutex_init(&pr->qlock, NULL);
    if (s->opts.upstream && *s->opts.upstream &&
        !(pr->up = qg__upstream_set_get(pr->set, s->opts.upstream, err,
                                       errcap))) {
        qg__upstream_set_free(pr->set);
        pthread_mutex_destroy(&pr->qlock);
        free(pr->cache);
        free(pr->live);
        free(pr);
        return -1;
    }
    s->proxy = pr;
    return 0;
}

void qg__proxy_stop(qg_server *s)
{
    qg_proxy *pr = s->proxy;
    if (!pr)
        return;
    for (int w = 0; w < pr->nworkers; w++)
        while (pr->live[w]) {
            px *p = pr->live[w];
            px_cancel_upstream(p);
            px_settle_partial(p);
            qg__http_respond(p->r, 503, NULL, 0, NULL, NULL, 0);
            px_free(p);
        }
    qg__upstream_set_free(pr->set);
    pthread_mutex_destroy(&pr->qlock);
    free(pr->cache);
    free(pr->qs);
    free(pr->live);
    free(pr);
    s->proxy = NULL;
}
