/* h_proxy.c - the metering proxy's routes: POST /v1/chat/completions
 * (OpenAI shape) and POST /v1/messages (Anthropic shape), docs/proxy.md.
 *
 * One request, on the worker thread that read it:
 *   1. the caller's subject key names the subject (routes.c); the body
 *      gives the model, the input estimate and the output cap
 *      (qg__request_fields);
 *   2. admission through the gate (gate.c) reserves, or the request is
 *      refused like /v1/check (429, headers, JSON body) and the upstream
 *      is never called - unless the overage policy in force for the
 *      refusal (overage.c) says downgrade and the lighter model is
 *      admitted: then the body names the lighter model - or queue, and the
 *      retry fits max_wait: then the request is held on a timer of the
 *      worker's loop and decided again at the retry instant; only the
 *      final decision is recorded;
 *   3. the admitted call is forwarded (proxy_call.c). */
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fault.h"
#include "gate.h"
#include "json_out.h"
#include "metrics.h"
#include "overage.h"
#include "proxy_call.h"
#include "rules.h"

static _Atomic uint64_t px_counter;

static void px_admit(qg__px *p);

/* Release a request that never reached the upstream (the reply is sent
 * by the caller, through r, after this). */
static void px_discard(qg__px *p)
{
    qg__http_on_close(p->r, NULL, NULL);
    qg__px_free(p);
}

/* Answer a request whose model has no usable upstream (nothing reserved,
 * nothing recorded). */
static void px_no_upstream(qg__px *p, const char *model, const char *why)
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

/* --------------------------------------------------------------- hold */

/* The caller left while held: nothing was reserved, nothing is counted. */
static void px_q_gone(void *arg)
{
    qg__px *p = arg;
    qg__http_on_close(p->r, NULL, NULL);
    qg__http_respond(p->r, 499, NULL, 0, NULL, NULL, 0);
    qg__px_free(p);
}

static void px_q_fire(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    px_admit(arg);
}

/* A held call at shutdown: nothing reserved, answer 503. */
static void px_q_stop(qg__proxy_call *link)
{
    qg__px *p = (qg__px *)(void *)link;   /* link is p's first member */
    qg__http_respond(p->r, 503, NULL, 0, NULL, NULL, 0);
    qg__px_free(p);
}

/* Hold p for ms (a timer on the worker's loop, never a blocked thread);
 * the first hold takes a slot of plan's queue (bounded by cap).
 * Returns 0; 1 when the queue is full; -1 out of memory (answer the
 * refusal instead). */
static int px_hold(qg__px *p, const char *plan, int cap, int64_t ms,
                   int64_t now)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    if (!p->qtimer && !(p->qtimer = evtimer_new(p->base, px_q_fire, p)))
        return -1;
    if (!p->queued) {
        if (qg__proxy_queue_take(p->s->proxy, plan, cap) < 0)
            return 1;
        p->queued = 1;
        p->q_start_ms = now;
        qg__row_copy(p->q_plan, sizeof p->q_plan, plan);
        p->settled = 1;                 /* nothing reserved while held */
        p->link.stop = px_q_stop;
        qg__proxy_link(p->s->proxy, p->worker, &p->link);
        qg__http_on_close(p->r, px_q_gone, p);
    }
    if (evtimer_add(p->qtimer, &tv) != 0)
        return -1;
    return 0;
}

/* Leave the queue (the final decision is made): its slot goes back. */
static void px_unhold(qg__px *p, int64_t now)
{
    int64_t w = now - p->q_start_ms;
    if (!p->queued)
        return;
    snprintf(p->qms, sizeof p->qms, "%lld", (long long)(w > 0 ? w : 0));
    qg__proxy_queue_give(p->s->proxy, p->q_plan);
    qg__proxy_unlink(p->s->proxy, p->worker, &p->link);
    qg__http_on_close(p->r, NULL, NULL);
    p->queued = 0;
    p->settled = 0;
}

/* ---------------------------------------------------------- admission */

/* The refusal's answer: 429 as /v1/check's, or queue_full. */
static void px_refuse(qg__px *p, const qg__admit *a, int queue_full,
                      int queue_size)
{
    qg_server *s = p->s;
    qg_http_req *r = p->r;
    qg_http_out_header h[QG_HDR_MAX + 2];
    int n = 0;
    char *json;
    if (queue_full) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "the quota is used up and the queue of plan %s is full (%d "
                 "requests already waiting); retry after Retry-After "
                 "seconds", a->d.plan, queue_size);
        json = qg__json_error("queue_full", msg);
    } else {
        json = qg__json_check(&a->d, p->rid,
                              qg_engine_rules_at(s->engine, a->now_ms));
    }
    for (int i = 0; i < p->hb.n; i++)
        h[n++] = p->hb.h[i];
    h[n++] = (qg_http_out_header){"X-Request-Id", p->rid};
    if (p->qms[0])
        h[n++] = (qg_http_out_header){"x-quotagate-queued-ms", p->qms};
    qg__http_on_close(r, NULL, NULL);
    qg__reply_json(s, r, 429, json, h, n);   /* h points into p */
    qg__px_free(p);
}

/* One admission of p, while the store decides (heap: two decisions are
 * ~16 KB): the decision for the model asked (a), the one for the lighter
 * model of a downgrade (b), the overage choice, the row's window note. */
typedef struct px_adm {
    qg__admit a, b;
    qg__overage_choice ch;
    int model;                     /* the model asked, an index */
    char window[sizeof ((qg_ledger_row *)0)->window];
} px_adm;

static void px_conclude(qg__px *p, px_adm *x, qg__admit *d);

/* The lighter model's decision is made: it serves when admitted, else
 * the original refusal stands. */
static void px_downgraded(qg__admit *b, void *ud)
{
    qg__px *p = ud;
    px_adm *x = (px_adm *)((char *)b - offsetof(px_adm, b));
    const qg_rules *rules = qg_engine_rules_at(p->s->engine, b->now_ms);
    char err[QG_GATE_ERRCAP];
    if (b->rc != QG_OK || b->d.replayed || b->d.outcome != QG_ALLOW) {
        px_conclude(p, x, &x->a);
        return;
    }
    p->up = qg__proxy_upstream(p->s->proxy, p->worker, rules,
                               x->ch.to_model, err, sizeof err);
    qg__row_copy(p->dg_from, sizeof p->dg_from, p->info.model);
    qg__row_copy(p->dg_model, sizeof p->dg_model, b->req.model);
    snprintf(x->window, sizeof x->window, "downgraded:%s",
             x->a.d.binding >= 0 ? x->a.d.views[x->a.d.binding].name : "");
    px_conclude(p, x, b);
}

/* The decision for the model asked is made: answer an error or a replay,
 * or act on the overage choice (a downgrade decides again, for the
 * lighter model under the same request id: the refusal charged nothing
 * and is not remembered). */
static void px_decided(qg__admit *a, void *ud)
{
    qg__px *p = ud;
    px_adm *x = (px_adm *)((char *)a - offsetof(px_adm, a));
    qg_server *s = p->s;
    qg_http_req *r = p->r;
    const qg_rules *rules = qg_engine_rules_at(s->engine, a->now_ms);
    char err[QG_GATE_ERRCAP];

    if (a->rc == QG_ERANGE && p->info.max_output_tokens > QG_TOKENS_MAX)
        snprintf(a->err, sizeof a->err, "%s must be at most %lld (the bound "
                 "on a token count)", p->shape == QG_SHAPE_OPENAI
                     ? "max_tokens (or max_completion_tokens)" : "max_tokens",
                 (long long)QG_TOKENS_MAX);
    if (a->rc != QG_OK) {
        px_discard(p);
        qg__reply_engine_error(s, r, a->rc, a->err);
        free(x);
        return;
    }
    if (a->d.replayed) {
        px_discard(p);
        qg__reply_error(s, r, 409, "duplicate_request_id",
                        "this X-Request-Id was already used; every proxied "
                        "call needs a fresh one");
        free(x);
        return;
    }
    qg__overage_choose(rules, &a->d, x->model,
                       p->queued ? a->now_ms - p->q_start_ms : 0, &x->ch);
    if (x->ch.act != QG_OVERAGE_DOWNGRADE) {
        px_conclude(p, x, a);
        return;
    }
    if (!qg__proxy_upstream(s->proxy, p->worker, rules, x->ch.to_model, err,
                            sizeof err)) {
        px_no_upstream(p, rules->models[x->ch.to_model].name, err);
        free(x);
        return;
    }
    x->b = *a;
    x->b.req.model = rules->models[x->ch.to_model].name;
    qg__gate_decide_on(s, p->worker, p->base, &x->b, px_downgraded, p);
}

/* Admission, first or again for a held request (docs/proxy.md): decide
 * (px_decided, px_downgraded), then hold (queue) or refuse as the
 * overage policy says, or forward (px_conclude). */
static void px_admit(qg__px *p)
{
    qg_server *s = p->s;
    qg_http_req *r = p->r;
    /* the version in force now: its models and their upstreams */
    const qg_rules *rules = qg_engine_rules_at(s->engine, qg__server_now(s));
    char err[QG_GATE_ERRCAP];
    px_adm *x;
    int m;

    /* the model's upstream (an unknown model is the engine's to refuse) */
    m = qg_rules_find_model(rules, p->info.model);
    if (m >= 0 && !(p->up = qg__proxy_upstream(s->proxy, p->worker, rules, m,
                                               err, sizeof err))) {
        px_no_upstream(p, p->info.model, err);
        return;
    }
    if (qg__alloc_fails("admission") || !(x = malloc(sizeof *x))) {
        px_discard(p);
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    x->model = m;
    x->window[0] = '\0';
    x->a.req = (qg_check_req){.subject = p->subject, .request_id = p->rid,
                              .model = p->info.model,
                              .input_tokens = p->info.input_tokens_estimate,
                              .max_output_tokens =
                                  p->info.max_output_tokens};
    x->a.row_output_tokens = p->info.max_output_tokens < 0
                                 ? QG_DEFAULT_OUTPUT_ESTIMATE
                                 : p->info.max_output_tokens;
    x->a.estimated = 1;
    qg__gate_decide_on(s, p->worker, p->base, &x->a, px_decided, p);
}

/* The final decision d: hold while the exact retry instant still fits
 * max_wait (the refusal charged nothing and is not remembered: the
 * decision is made again under the same request id; only the final one
 * is recorded), refuse, or forward. */
static void px_conclude(qg__px *p, px_adm *x, qg__admit *d)
{
    qg_server *s = p->s;
    qg_http_req *r = p->r;
    char *nbody = NULL;
    const char *body = r->body;
    size_t blen = r->body_len, nlen;
    int added = 0, rewrite_failed = 0, queue_full = 0, rc;

    if (d->d.outcome != QG_ALLOW && x->ch.act == QG_OVERAGE_HOLD) {
        rc = px_hold(p, d->d.plan, x->ch.queue_size, x->ch.hold_ms,
                     d->now_ms);
        if (rc == 0)
            goto out;
        queue_full = rc == 1;
    }
    px_unhold(p, d->now_ms);
    qg__gate_record(s, d, p->dg_from[0] ? x->window : NULL);
    qg__gate_headers(s, d, &p->hb);
    if (d->d.outcome != QG_ALLOW) {
        px_refuse(p, d, queue_full, x->ch.queue_size);
        goto out;
    }

    /* the upstream request: a stream gets include_usage (the usage-only
     * chunk it adds is filtered out), a downgrade the lighter model; a
     * stream without stream_options (nearly every one) by adding the
     * member to the caller's text, the rest through jansson */
    if (p->shape == QG_SHAPE_OPENAI && (p->info.stream || p->dg_from[0])) {
        int splice = p->info.stream && !p->info.stream_options &&
                     !p->dg_from[0];
        rc = qg__alloc_fails("rewritten body") ? QG_ENOMEM
             : splice ? qg__request_add_include_usage(r->body, r->body_len,
                                                      &nbody, &nlen)
                      : qg__request_rewrite_openai(
                            r->body, r->body_len, &nbody, &nlen, &added,
                            p->dg_from[0] ? p->dg_model : NULL);
        if (rc == QG_OK) {
            body = nbody;
            blen = nlen;
            p->filter = splice || added;
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
    if (rewrite_failed) {
        /* a body that qg__request_fields accepted: only out of memory */
        qg__px_settle(p, QG_SETTLE_FAILED, 0, 0, 0);
        qg__px_reply_error(p, 500, "internal_error",
                           "the downgraded request could not be written");
        goto out;
    }
    qg__px_forward(p, body, blen);
out:
    free(nbody);
    free(x);
}

/* ------------------------------------------------------------- routes */

static void proxy(qg_server *s, qg_http_req *r, const char *subject,
                  int shape)
{
    qg_request_info info;
    const char *v;
    size_t vlen;
    int rc;
    qg__px *p;

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

void qg__h_proxy_openai(qg_server *s, qg_http_req *r, const char *subject)
{
    proxy(s, r, subject, QG_SHAPE_OPENAI);
}

void qg__h_proxy_anthropic(qg_server *s, qg_http_req *r, const char *subject)
{
    proxy(s, r, subject, QG_SHAPE_ANTHROPIC);
}
