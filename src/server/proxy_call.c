/* proxy_call.c - one admitted call of the metering proxy, forwarded
 * (proxy_call.h, docs/proxy.md).
 *
 * The request goes upstream on the worker's event base through a pooled
 * keep-alive connection of our own HTTP client (upstream.h), with the
 * gateway's own credential instead of the caller's key.  A non-streaming
 * answer is read whole, its usage read, the charge settled, the answer
 * passed on; a stream is passed on as it arrives (stream.h reads its usage
 * on the way and drops the usage chunk the gateway added) and settled when
 * it ends.  Writes to the caller are gathered per upstream read and sent
 * in one go, pausing the upstream above the high-water mark.
 *
 * The unhappy paths each have one rule (docs/proxy.md), all settled
 * through qg__px_settle with the tokens charge.c derives: the ledger row's
 * status, estimated flag and detail say which rule applied, and the settle
 * always happens, once.  A caller who leaves is handled from a zero timer
 * (abort_cb), never from inside the upstream client's callbacks.  Each
 * allocation of a call asks fault.h first, so that a test can fail any of
 * them (docs/fault-injection.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "fault.h"
#include "gate.h"
#include "json_out.h"
#include "metrics.h"
#include "proxy_call.h"

#define MAX_OUT_HDR (QG_HDR_MAX + 7)

static struct evbuffer *px_evbuffer(const char *site)
{
    return qg__alloc_fails(site) ? NULL : evbuffer_new();
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

void qg__px_free(qg__px *p)
{
    qg__proxy *pr = p->s->proxy;
    qg__proxy_unlink(pr, p->worker, &p->link);
    if (p->qtimer)
        event_free(p->qtimer);
    if (p->queued)
        qg__proxy_queue_give(pr, p->q_plan);
    if (p->call)
        qg__upcall_cancel(p->call);
    if (p->defer)
        event_free(p->defer);
    if (p->body)
        evbuffer_free(p->body);
    qg__stream_free(p->stream);
    free(p);
}

/* Cancel the upstream request (also from inside its callbacks: the
 * client closes the connection when its parser returns). */
static void px_cancel_upstream(qg__px *p)
{
    if (p->call) {
        qg__upcall_cancel(p->call);
        p->call = NULL;
    }
}

/* ------------------------------------------------------------ settle */

static void px_settle_with(qg__px *p, qg_settle_status st,
                           const qg__charge *c)
{
    qg__settle se;
    if (p->settled)
        return;
    p->settled = 1;
    for (int i = 0; i < c->nanomalies; i++)
        qg__metrics_usage_anomaly(p->s->metrics, c->anomaly[i]);
    if (c->detail[0])
        fprintf(stderr, "quotagate: proxy: request %s: %s\n", p->rid,
                c->detail);
    memset(&se, 0, sizeof se);
    se.req = (qg_settle_req){.request_id = p->rid, .status = st,
                             .input_tokens = c->in, .output_tokens = c->out,
                             .weight_milli = -1, .no_charge = p->no_charge};
    se.row_subject = p->subject;
    se.estimated = c->est;
    se.detail = c->detail;
    /* nobody waits: the gate applies it, queues the row, logs a failure */
    if (qg__gate_settle(p->s, &se, p->worker, p->base, NULL, NULL) != QG_OK)
        fprintf(stderr, "quotagate: proxy: settle of %s: out of memory\n",
                p->rid);
}

void qg__px_settle(qg__px *p, qg_settle_status st, int64_t in, int64_t out,
                   int estimated)
{
    qg__charge c;
    memset(&c, 0, sizeof c);
    c.in = in;
    c.out = out;
    c.est = estimated;
    px_settle_with(p, st, &c);
}

/* The tokens the answer showed (charge.h). */
static void px_tokens(const qg__px *p, qg__charge *c)
{
    qg__charge_in ci;
    memset(&ci, 0, sizeof ci);
    if (p->stream && p->streaming) {
        ci.u = *qg__stream_usage(p->stream, &ci.final_usage,
                                 &ci.content_bytes);
    } else {
        ci.u = p->u;
        ci.final_usage = p->final_usage;
        ci.content_bytes = p->content_bytes;
    }
    ci.input_estimate = p->info.input_tokens_estimate;
    ci.max_output = p->info.max_output_tokens;
    qg__charge_tokens(&ci, c);
}

/* Settle with what was seen so far (status cancelled). */
static void px_settle_partial(qg__px *p)
{
    qg__charge c;
    if (p->settled)
        return;
    px_tokens(p, &c);
    px_settle_with(p, QG_SETTLE_CANCELLED, &c);
}

/* ----------------------------------------------------------- replies */

static int px_headers(qg__px *p, qg_http_out_header *h, int with_retry)
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
static void px_reply(qg__px *p, int status, const char *ctype,
                     const char *body, size_t len, int with_retry)
{
    qg_http_out_header h[MAX_OUT_HDR];
    int n = px_headers(p, h, with_retry);
    qg__metrics_http(p->s->metrics, p->route, status);
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_respond(p->r, status, h, n, ctype, body, len);
    qg__px_free(p);
}

void qg__px_reply_error(qg__px *p, int status, const char *type,
                        const char *msg)
{
    char *body = qg__alloc_fails("error body") ? NULL
                                               : qg__json_error(type, msg);
    px_reply(p, status, "application/json", body ? body : "{}",
             body ? strlen(body) : 2, 0);
    free(body);
}

/* ----------------------------------------------------------- streams */

/* The caller is gone (on_close, or a failed write): stop the upstream,
 * charge what was produced, release r.  Soon, from the event loop. */
static void px_schedule_abort(qg__px *p)
{
    struct timeval zero = {0, 0};
    p->client_gone = 1;
    if (p->defer)
        event_add(p->defer, &zero);
}

static void px_drained(void *arg)
{
    qg__px *p = arg;
    if (p->paused && p->call)
        qg__upcall_pause(p->call, 0);
    p->paused = 0;
}

/* Write what the stream gathered for the caller in one go; pause the
 * upstream above the high-water mark (resumed by px_drained). */
static void px_flush(qg__px *p)
{
    struct evbuffer *q = qg__stream_output(p->stream);
    size_t n = evbuffer_get_length(q);
    const char *out;
    int rc;
    if (n == 0)
        return;
    if (p->client_gone) {
        evbuffer_drain(q, n);
        return;
    }
    out = px_pullup(q, "stream output pullup");
    rc = out ? qg__http_stream_write(p->r, out, n) : -1;
    evbuffer_drain(q, n);
    if (rc < 0) {
        px_schedule_abort(p);
    } else if (rc == 1 && !p->paused && p->call) {
        qg__upcall_pause(p->call, 1);
        p->paused = 1;
        qg__http_stream_on_drain(p->r, px_drained, p);
    }
}

/* ---------------------------------------------- upstream callbacks */

static void up_head(void *arg, const qg_upresp *ur)
{
    qg__px *p = arg;
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
 * (docs/proxy.md, "Answers too large to hold"): past QG_PX_MAX_BUFFERED
 * it is 502 upstream_response_too_large, out of memory 500.  Never a 200
 * with a damaged body.  The upstream call is cancelled at once (its
 * connection closed, never pooled) and the request settled once: a 2xx
 * answer at its reservation in full, status cancelled (the usage is in
 * the part never read, and the upstream produced at least that much),
 * with a detail (and, too large, the anomaly metric); an error answer by
 * its status's own rule (failed; a 429 charges nothing).  From up_body,
 * inside the upstream client's callback: p is freed. */
static void px_cut_buffered(qg__px *p, int oom)
{
    char msg[200];
    snprintf(msg, sizeof msg, "the upstream's answer passed %u bytes "
             "(64 MiB), the most a non-streamed answer may hold to read its "
             "usage: it was cut off and not passed on", QG_PX_MAX_BUFFERED);
    px_cancel_upstream(p);
    if (p->status >= 200 && p->status <= 299) {
        int64_t out = p->info.max_output_tokens;
        qg__charge c;
        char what[160];
        memset(&c, 0, sizeof c);
        c.in = p->info.input_tokens_estimate;
        c.out = out < 0 ? QG_DEFAULT_OUTPUT_ESTIMATE : out;
        c.est = 1;
        if (oom)
            snprintf(what, sizeof what, "out of memory holding the "
                     "response body: cut off, usage unread, charged the "
                     "reservation");
        else
            snprintf(what, sizeof what, "the response body passed %u "
                     "bytes: cut off, usage unread, charged the reservation",
                     QG_PX_MAX_BUFFERED);
        /* QG_ANOMALY_COUNT: the detail and the log line, no metric */
        qg__charge_note(&c, oom ? QG_ANOMALY_COUNT
                                : QG_ANOMALY_RESPONSE_TOO_LARGE, what);
        px_settle_with(p, QG_SETTLE_CANCELLED, &c);
    } else {
        p->no_charge = p->status == 429;
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
    }
    if (oom)
        qg__px_reply_error(p, 500, "internal_error", "out of memory");
    else
        qg__px_reply_error(p, 502, "upstream_response_too_large", msg);
}

/* A piece of the upstream's (de-chunked) body, as it arrives. */
static void up_body(void *arg, const char *data, size_t n)
{
    qg__px *p = arg;
    if (n == 0)
        return;
    if (p->streaming) {
        /* written at up_read_end; out of memory the stream is cut like a
         * caller who left */
        if (qg__stream_feed(p->stream, data, n, !p->client_gone) != QG_OK)
            px_schedule_abort(p);
    } else if (n > QG_PX_MAX_BUFFERED - evbuffer_get_length(p->body)) {
        px_cut_buffered(p, 0);          /* p is gone */
    } else if (qg__alloc_fails("answer body") ||
               evbuffer_add(p->body, data, n) != 0) {
        px_cut_buffered(p, 1);          /* p is gone */
    }
}

/* The upstream answered whole (non-stream). */
static void px_finish_buffered(qg__px *p)
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
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        snprintf(msg, sizeof msg, "the upstream answered HTTP %d",
                 p->status);
        qg__px_reply_error(p, 502, "upstream_error", msg);
        return;
    }
    if (p->status < 200 || p->status > 299) {
        /* Refusals are passed through.  The upstream's 429 costs
         * nothing at all (its rate limit is not the caller's usage);
         * other 4xx, the caller's own errors, the per-request base. */
        p->no_charge = p->status == 429;
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        px_reply(p, p->status, p->ctype[0] ? p->ctype : NULL, body, len, 1);
        return;
    }
    {
        int rc = p->shape == QG_SHAPE_OPENAI
                     ? qg__usage_openai_json(body, len, &p->u)
                     : qg__usage_anthropic_json(body, len, &p->u);
        qg__charge c;
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
    qg__px *p = arg;
    if (p->streaming)
        px_flush(p);
}

static void up_done(void *arg, int uerr)
{
    qg__px *p = arg;
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
            qg__px_free(p);
        } else {
            qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
            qg__px_reply_error(p, 502,
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
    /* a stream that ended: pass a last partial event on, settle, end */
    if (qg__stream_end(p->stream, !p->client_gone) != QG_OK)
        px_schedule_abort(p);           /* cut, not passed on short */
    px_flush(p);
    if (!p->settled) {
        qg__charge c;
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
    qg__px_free(p);
}

/* The caller went away: a stream (or a streaming request still waiting
 * for its headers) stops the upstream and is charged what was produced;
 * a non-streaming request lets the upstream finish so that the real
 * usage is charged (status cancelled). */
static void abort_cb(evutil_socket_t fd, short what, void *arg)
{
    qg__px *p = arg;
    (void)fd;
    (void)what;
    if (!p->streaming && !p->caller_stream && p->call)
        return;                         /* settled when the answer comes */
    px_cancel_upstream(p);
    px_settle_partial(p);
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_stream_on_drain(p->r, NULL, NULL);
    qg__http_respond(p->r, 499, NULL, 0, NULL, NULL, 0);
    qg__px_free(p);
}

static void on_close(void *arg)
{
    qg__px *p = arg;
    p->client_gone = 1;
    abort_cb(-1, 0, p);
}

void qg__px_stop(qg__proxy_call *link)
{
    qg__px *p = (qg__px *)(void *)link;   /* link is p's first member */
    px_cancel_upstream(p);
    px_settle_partial(p);
    qg__http_respond(p->r, 503, NULL, 0, NULL, NULL, 0);
    qg__px_free(p);
}

/* ---------------------------------------------------------- forward */

/* The upstream client's callbacks (upstream.h). */
static const qg_upcall_cbs up_cbs = {up_head, up_body, up_done,
                                     up_read_end};

void qg__px_forward(qg__px *p, const char *body, size_t blen)
{
    struct evbuffer *head = NULL;
    const char *h;
    int rc;

    p->caller_stream = p->info.stream;
    p->link.stop = qg__px_stop;
    qg__proxy_link(p->s->proxy, p->worker, &p->link);
    if (!(p->body = px_evbuffer("answer buffer")) ||
        !(p->stream = qg__stream_new(p->shape, p->filter,
                                     QG_PX_SSE_MAX_EVENT)) ||
        qg__alloc_fails("abort timer") ||
        !(p->defer = event_new(p->base, -1, 0, abort_cb, p)) ||
        !(head = px_evbuffer("request head"))) {
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        qg__px_reply_error(p, 500, "internal_error", "out of memory");
        return;
    }
    rc = qg__proxy_request_head(head, p->up, p->r->path, p->r->headers,
                                p->r->nheaders, blen, p->rid, p->shape,
                                p->s->upstream_key);
    if (rc != QG_OK) {
        evbuffer_free(head);
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        if (rc == QG_ENOMEM)
            qg__px_reply_error(p, 500, "internal_error", "out of memory");
        else
            qg__px_reply_error(p, 400, "invalid_request",
                               "a request header cannot be forwarded");
        return;
    }
    h = px_pullup(head, "request head pullup");
    if (h)
        p->call = qg__upstream_send(p->up, p->worker, p->base, h,
                                    evbuffer_get_length(head), body, blen,
                                    &up_cbs, p);
    evbuffer_free(head);
    if (!p->call) {
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        qg__px_reply_error(p, 500, "internal_error", "out of memory");
        return;
    }
    qg__http_on_close(p->r, on_close, p);
}
