/* h_decide.c - POST /v1/check and POST /v1/settle.
 *
 * A check is decided by the engine on the worker thread and answered at
 * once; its ledger row is queued without waiting (a crash may lose it: the
 * settle carries the final charge).  A settle is applied to the counters
 * at once but answered only when its ledger row is durable: the ledger's
 * writer thread calls back, and the answer is posted back to the worker
 * that owns the connection.  Request ids the counters do not remember
 * are answered from the ledger (reqid.c).
 *
 * Numbers are bounded (quotagate.h, docs/decisions.md "Bounds"): token
 * counts at most QG_TOKENS_MAX, weights at most QG_AMOUNT_MAX_MILLI; a
 * number beyond its bound is 400 out_of_range naming the field and the
 * bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "headers.h"
#include "json_out.h"
#include "metrics.h"
#include "reqjson.h"
#include "rules.h"
#include "server.h"
#include "weights.h"

#define ERRCAP 320



/* A lock-free read of the writer's backlog (rows queued or being
 * written), checked on every check and settle. */
static int ledger_full(qg_server *s)
{
    return qg__ledger_queued(s->ledger) + 1024 >= 65536;
}

/* ---------------------------------------------------------------- check */

static const char *const check_keys[] = {
    "subject", "request_id", "model", "input_tokens", "max_output_tokens",
    "weight", NULL};

void qg__h_check(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[ERRCAP];
    const char *subject = NULL, *rid = NULL, *model = NULL;
    int64_t in_tokens = 0, max_out = -1, weight = 0, now;
    qg_check_req req;
    qg_decision dbuf, *d = &dbuf;   /* ~5 KB: on the worker's stack */
    qg_hdr_buf hb;
    qg_ledger_row row, prior;       /* prior: a replay from the ledger */
    const qg_rules *rules;
    json_t *o;
    int rc, has_weight = 0;

    (void)caller;
    if (!(o = qg__reqjson_parse(r->body, r->body_len, check_keys, err,
                               sizeof err))) {
        qg__reply_error(s, r, 400, "invalid_request", err);
        return;
    }
    if ((rc = qg__reqjson_str(o, "subject", 1, 255, &subject, err,
                             sizeof err)) < 0 ||
        (rc = qg__reqjson_str(o, "request_id", 1, QG_REQUEST_ID_MAX, &rid,
                             err, sizeof err)) < 0 ||
        (rc = qg__reqjson_str(o, "model", 0, QG_NAME_MAX - 1, &model, err,
                             sizeof err)) < 0 ||
        (rc = qg__reqjson_int(o, "input_tokens", 0, 0, QG_TOKENS_MAX,
                             &in_tokens, err, sizeof err)) < 0 ||
        (rc = qg__reqjson_int(o, "max_output_tokens", 0, 0, QG_TOKENS_MAX,
                             &max_out, err, sizeof err)) < 0 ||
        (rc = has_weight = qg__reqjson_milli(o, "weight", 0, &weight, err,
                                            sizeof err)) < 0)
        goto bad;
    if (!model == !has_weight) {
        snprintf(err, sizeof err, "give either model (with input_tokens and "
                 "max_output_tokens) or weight");
        rc = -1;
        goto bad;
    }
    if (ledger_full(s)) {
        qg__reply_error(s, r, 503, "overloaded",
                       "the ledger is behind; retry shortly");
        goto out;
    }
    req = (qg_check_req){.subject = subject, .request_id = rid,
                         .model = model, .input_tokens = in_tokens,
                         .max_output_tokens = max_out,
                         .weight_milli = weight};
    now = qg__server_now(s);
    rc = qg__server_check(s, &req, now, d, &prior, err, sizeof err);
    if (rc != QG_OK) {
        qg__reply_engine_error(s, r, rc, err);
        goto out;
    }
    rules = qg_engine_rules(s->engine);
    qg__metrics_record(s->metrics, d);
    if (!d->replayed) {
        qg__row_of_decision(&row, d, rid, subject, in_tokens,
                           model ? (max_out < 0 ? QG_DEFAULT_OUTPUT_ESTIMATE
                                                : max_out)
                                 : 0);
        if (qg__ledger_submit(s->ledger, &row, NULL, NULL) != QG_OK)
            fprintf(stderr, "quotagate: ledger queue full: the row of "
                    "request %s was not queued\n", rid);
    }
    if (qg__headers_for_decision(d, rules, now, &hb) < 0)
        hb.n = 0;
    qg__reply_json(s, r, d->outcome == QG_ALLOW ? 200 : 429,
                  qg__json_check(d, rid, rules->unit), hb.h, hb.n);
    goto out;
bad:
    qg__reply_error(s, r, 400, rc == -2 ? "out_of_range" : "invalid_request",
                   err);
out:
    json_decref(o);
}

/* --------------------------------------------------------------- settle */

static const char *const settle_keys[] = {
    "request_id", "status", "input_tokens", "output_tokens", "weight",
    "subject", "model", NULL};

static const struct {
    const char *name;
    qg_settle_status status;
    int row_status;
} statuses[] = {
    {"completed", QG_SETTLE_COMPLETED, QG_ROW_COMPLETED},
    {"cancelled", QG_SETTLE_CANCELLED, QG_ROW_CANCELLED},
    {"failed", QG_SETTLE_FAILED, QG_ROW_FAILED},
};

typedef struct pending {
    qg_server *s;
    qg_http_req *r;
    char *body;
    int rc;
} pending;

static void settle_finish(void *arg)
{
    pending *p = arg;
    if (p->rc == QG_OK) {
        qg__reply_json(p->s, p->r, 200, p->body, NULL, 0);
    } else if (p->rc == QG_ESTATE) {
        /* the ledger's guard kept another request's row (reqid.c) */
        free(p->body);
        qg__reply_error(p->s, p->r, 400, "invalid_request",
                       "the ledger holds this request_id for another "
                       "request; the settle was not recorded");
    } else {
        free(p->body);
        qg__reply_error(p->s, p->r, 503, "ledger_unavailable",
                       "the settle could not be made durable; retry it");
    }
    free(p);
}

/* Writer thread: the row is durable (or failed); answer on the worker. */
static void settle_durable(void *arg, int rc)
{
    pending *p = arg;
    p->rc = rc;
    if (qg__http_post(p->s->http, p->r->worker, settle_finish, p) != 0) {
        /* Shutting down: the connection is being closed anyway. */
        free(p->body);
        free(p);
    }
}

/* A settle whose reservation the engine does not know (lost in a crash
 * before its row was durable): record the charge from the settle itself,
 * which must then name the subject (and the model, for token counts). */
static int settle_recover(qg_server *s, const char *rid, const char *subject,
                          const char *model, int64_t in_t, int64_t out_t,
                          int64_t weight, int has_weight, int status_i,
                          int64_t now, qg_settle_result *res,
                          qg_ledger_row *row, char *err, size_t cap)
{
    const qg_rules *rules = qg_engine_rules(s->engine);
    qg_restore_req rr;
    qg_decision *u;
    int64_t w = weight;
    int rc;

    if (model) {
        int mi = qg_rules_find_model(rules, model);
        if (mi < 0) {
            snprintf(err, cap, "unknown model \"%s\"", model);
            return QG_EMODEL;
        }
        /* tokens within the bound (parsed so); a weight over the bound is
         * charged at the bound, as every settle is (engine.c) */
        w = qg__weight_milli(&rules->models[mi], in_t, out_t);
        if (w > QG_AMOUNT_MAX_MILLI)
            w = QG_AMOUNT_MAX_MILLI;
    } else if (!has_weight) {
        snprintf(err, cap, "no reservation for request_id \"%s\": a settle "
                 "that records a lost reservation needs model and tokens, "
                 "or weight", rid);
        return QG_ENOTFOUND;
    }
    rr = (qg_restore_req){.subject = subject, .request_id = rid,
                          .model = model, .decided_at_ms = now,
                          .reserved_milli = w, .charged_milli = w,
                          .settled = 1,
                          .status = statuses[status_i].status,
                          .headroom_milli = -1};
    if ((rc = qg_engine_restore(s->engine, &rr, err, cap)) != QG_OK)
        return rc;
    if (!(u = malloc(sizeof *u)))
        return QG_ENOMEM;
    rc = qg_engine_usage(s->engine, subject, now, u);
    memset(res, 0, sizeof *res);
    res->reserved_milli = res->actual_milli = res->charged_milli = w;
    res->decided_at_ms = now;
    res->status = statuses[status_i].status;
    qg__row_copy(row->subject, sizeof row->subject, subject);
    if (rc == QG_OK) {
        qg__row_copy(row->org, sizeof row->org, u->org);
        qg__row_copy(row->plan, sizeof row->plan, u->plan);
        qg__row_copy(row->rules_version, sizeof row->rules_version,
                 u->rules_version);
        qg__row_copy(row->weights_version, sizeof row->weights_version,
                 u->weights_version);
    }
    free(u);
    qg__row_copy(row->model, sizeof row->model, model);
    row->decision = QG_ALLOW;
    row->created_ms = now;
    row->reserved_milli = w;
    row->settle_only = 0;
    return QG_OK;
}

void qg__h_settle(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[ERRCAP];
    const char *rid = NULL, *status = NULL, *subject = NULL, *model = NULL;
    int64_t in_t = 0, out_t = 0, weight = -1, now;
    int has_weight, status_i = -1, rc, recovered = 0, from_ledger = 0;
    qg_settle_result res;
    qg_settle_req req;
    qg_ledger_row row;
    pending *p;
    json_t *o;
    char *body;

    (void)caller;
    if (!(o = qg__reqjson_parse(r->body, r->body_len, settle_keys, err,
                               sizeof err))) {
        qg__reply_error(s, r, 400, "invalid_request", err);
        return;
    }
    if ((rc = qg__reqjson_str(o, "request_id", 1, QG_REQUEST_ID_MAX, &rid,
                             err, sizeof err)) < 0 ||
        (rc = qg__reqjson_str(o, "status", 1, 16, &status, err,
                             sizeof err)) < 0 ||
        (rc = qg__reqjson_str(o, "subject", 0, 255, &subject, err,
                             sizeof err)) < 0 ||
        (rc = qg__reqjson_str(o, "model", 0, QG_NAME_MAX - 1, &model, err,
                             sizeof err)) < 0 ||
        (rc = qg__reqjson_int(o, "input_tokens", 0, 0, QG_TOKENS_MAX, &in_t,
                             err, sizeof err)) < 0 ||
        (rc = qg__reqjson_int(o, "output_tokens", 0, 0, QG_TOKENS_MAX, &out_t,
                             err, sizeof err)) < 0 ||
        (rc = has_weight = qg__reqjson_milli(o, "weight", 0, &weight, err,
                                            sizeof err)) < 0)
        goto bad;
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (strcmp(statuses[i].name, status) == 0)
            status_i = (int)i;
    if (status_i < 0) {
        snprintf(err, sizeof err, "status must be completed, cancelled or "
                 "failed");
        rc = -1;
        goto bad;
    }
    if (ledger_full(s)) {
        qg__reply_error(s, r, 503, "overloaded",
                       "the ledger is behind; retry shortly");
        goto out;
    }
    now = qg__server_now(s);
    memset(&row, 0, sizeof row);
    row.headroom_milli = -1;
    req = (qg_settle_req){.request_id = rid,
                          .status = statuses[status_i].status,
                          .input_tokens = in_t, .output_tokens = out_t,
                          .weight_milli = has_weight ? weight : -1,
                          .subject = subject};
    rc = qg_engine_settle(s->engine, &req, now, &res, err, sizeof err);
    if (rc == QG_ENOTFOUND) {
        /* the counters do not know it: the ledger may (reqid.c) */
        char lerr[ERRCAP];
        int lrc = qg__server_settle_prior(s, &req, now, &res, &row, lerr,
                                         sizeof lerr);
        if (lrc != QG_ENOTFOUND) {
            rc = lrc;
            from_ledger = rc == QG_OK;
            memcpy(err, lerr, sizeof err);
        }
    }
    if (rc == QG_ENOTFOUND && subject) {
        rc = settle_recover(s, rid, subject, model, in_t, out_t, weight,
                            has_weight, status_i, now, &res, &row, err,
                            sizeof err);
        recovered = rc == QG_OK;
    }
    if (rc != QG_OK) {
        qg__reply_engine_error(s, r, rc, err);
        goto out;
    }
    if (from_ledger && res.replayed) {
        /* settled long ago: its original answer, durable already */
        qg__reply_json(s, r, 200, qg__json_settle(&res, rid), NULL, 0);
        goto out;
    }
    qg__metrics_settle(s->metrics, &res);
    /* a recovered settle's row is whole (settle_recover), else only the
     * settle's columns change, of the row of the subject the settle named
     * (the engine checked it) or that the ledger holds */
    row.settle_only = !recovered;
    if (!recovered && !from_ledger)
        qg__row_copy(row.subject, sizeof row.subject, subject);
    qg__row_fill_settle(&row, rid, statuses[status_i].row_status, in_t, out_t,
                       &res, now);
    if (!(body = qg__json_settle(&res, rid)) || !(p = calloc(1, sizeof *p))) {
        free(body);
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        goto out;
    }
    if (recovered) {
        /* say so in the answer: the reservation had been lost */
        json_t *j = json_loads(body, 0, NULL);
        if (j) {
            json_object_set_new(j, "recovered", json_true());
            free(body);
            body = qg__json_dump_steal(j);
        }
    }
    p->s = s;
    p->r = r;
    p->body = body;
    /* Answered from settle_durable once the row is durable. */
    if (qg__ledger_submit(s->ledger, &row, settle_durable, p) != QG_OK) {
        free(p->body);
        free(p);
        qg__reply_error(s, r, 503, "overloaded",
                       "the ledger is behind; retry shortly");
    }
    goto out;
bad:
    qg__reply_error(s, r, 400, rc == -2 ? "out_of_range" : "invalid_request",
                   err);
out:
    json_decref(o);
}
