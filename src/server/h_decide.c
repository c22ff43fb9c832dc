/* h_decide.c - POST /v1/check and POST /v1/settle.
 *
 * Both read and check their JSON bodies here and leave the sequence to
 * the gate (gate.c): a check is decided and answered at once, its ledger
 * row queued without waiting (a crash may lose it: the settle carries the
 * final charge); a settle is applied at once but answered only when its
 * ledger row is durable.
 *
 * Numbers are bounded (quotagate.h, docs/decisions.md "Bounds"): token
 * counts at most QG_TOKENS_MAX, weights at most QG_AMOUNT_MAX_MILLI; a
 * number beyond its bound is 400 out_of_range naming the field and the
 * bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gate.h"
#include "json_out.h"
#include "reqjson.h"
#include "rules.h"

#define ERRCAP 320

/* ---------------------------------------------------------------- check */

const char *const qg__check_keys[] = {
    "subject", "request_id", "model", "input_tokens", "max_output_tokens",
    "weight", NULL};

/* The decision is made (gate.c): record it and answer. */
static void check_decided(qg__admit *a, void *ud)
{
    qg_http_req *r = ud;
    qg_server *s = a->s;
    qg_hdr_buf hb;
    if (a->rc != QG_OK) {
        qg__reply_engine_error(s, r, a->rc, a->err);
    } else {
        qg__gate_record(s, a, NULL);
        qg__gate_headers(s, a, &hb);
        qg__reply_json(s, r, a->d.outcome == QG_ALLOW ? 200 : 429,
                       qg__json_check(&a->d, a->req.request_id,
                                      qg_engine_rules_at(s->engine,
                                                         a->now_ms)),
                       hb.h, hb.n);
    }
    free(a);
}

void qg__h_check(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[ERRCAP];
    const char *subject = NULL, *rid = NULL, *model = NULL;
    int64_t in_tokens = 0, max_out = -1, weight = 0;
    qg__admit *a;                   /* ~8 KB: the heap, not the stack */
    qg__reqjson o;
    int rc, has_weight = 0;

    (void)caller;
    if (qg__reqjson_parse(&o, r->body, r->body_len, qg__check_keys, err,
                          sizeof err) != 0) {
        qg__reply_error(s, r, 400, "invalid_request", err);
        qg__reqjson_free(&o);
        return;
    }
    if ((rc = qg__reqjson_str(&o, "subject", 1, 255, &subject, err,
                              sizeof err)) < 0 ||
        (rc = qg__reqjson_str(&o, "request_id", 1, QG_REQUEST_ID_MAX, &rid,
                              err, sizeof err)) < 0 ||
        (rc = qg__reqjson_str(&o, "model", 0, QG_NAME_MAX - 1, &model, err,
                              sizeof err)) < 0 ||
        (rc = qg__reqjson_int(&o, "input_tokens", 0, 0, QG_TOKENS_MAX,
                              &in_tokens, err, sizeof err)) < 0 ||
        (rc = qg__reqjson_int(&o, "max_output_tokens", 0, 0, QG_TOKENS_MAX,
                              &max_out, err, sizeof err)) < 0 ||
        (rc = has_weight = qg__reqjson_milli(&o, "weight", 0, &weight, err,
                                             sizeof err)) < 0)
        goto bad;
    if (!model == !has_weight) {
        snprintf(err, sizeof err, "give either model (with input_tokens and "
                 "max_output_tokens) or weight");
        rc = -1;
        goto bad;
    }
    if (!(a = malloc(sizeof *a))) {
        qg__reply_error(s, r, 503, "overloaded", "out of memory");
        goto out;
    }
    a->req = (qg_check_req){.subject = subject, .request_id = rid,
                            .model = model, .input_tokens = in_tokens,
                            .max_output_tokens = max_out,
                            .weight_milli = weight};
    a->row_output_tokens = model ? (max_out < 0 ? QG_DEFAULT_OUTPUT_ESTIMATE
                                                : max_out)
                                 : 0;
    a->estimated = 0;
    qg__gate_decide(s, r, a, check_decided, r);  /* copies the strings */
    goto out;
bad:
    qg__reply_error(s, r, 400, rc == -2 ? "out_of_range" : "invalid_request",
                    err);
out:
    qg__reqjson_free(&o);
}

/* --------------------------------------------------------------- settle */

const char *const qg__settle_keys[] = {
    "request_id", "status", "input_tokens", "output_tokens", "weight",
    "subject", "model", NULL};

/* The answer's body: /v1/settle's JSON, saying so when the reservation
 * had been lost and the settle recorded it. */
static char *settle_body(const qg__settle *st)
{
    char *body = qg__json_settle(&st->res, st->req.request_id);
    json_t *j;
    if (!body || !st->recovered)
        return body;
    if ((j = json_loads(body, 0, NULL))) {
        json_object_set_new(j, "recovered", json_true());
        free(body);
        body = qg__json_dump_steal(j);
    }
    return body;
}

/* The settle ended (gate.c, on the worker): answer. */
static void settle_done(qg__settle *st, void *ud)
{
    qg_http_req *r = ud;
    qg_server *s = st->s;
    if (st->stopping)
        return;                     /* the connection goes with the server */
    if (st->rc == QG_OK)
        qg__reply_json(s, r, 200, settle_body(st), NULL, 0);
    else if (st->rc == QG_ESTATE)
        /* the ledger's guard kept another request's row (reqid.c) */
        qg__reply_error(s, r, 400, "invalid_request",
                        "the ledger holds this request_id for another "
                        "request; the settle was not recorded");
    else if (st->rc == QG_EIO && st->row.request_id[0])
        qg__reply_error(s, r, 503, "ledger_unavailable",
                        "the settle could not be made durable; retry it");
    else
        qg__reply_engine_error(s, r, st->rc, st->err);
}

void qg__h_settle(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[ERRCAP];
    const char *rid = NULL, *status = NULL, *subject = NULL, *model = NULL;
    int64_t in_t = 0, out_t = 0, weight = -1;
    int has_weight, st_code, rc;
    qg__settle st;
    qg__reqjson o;

    (void)caller;
    if (qg__reqjson_parse(&o, r->body, r->body_len, qg__settle_keys, err,
                          sizeof err) != 0) {
        qg__reply_error(s, r, 400, "invalid_request", err);
        qg__reqjson_free(&o);
        return;
    }
    if ((rc = qg__reqjson_str(&o, "request_id", 1, QG_REQUEST_ID_MAX, &rid,
                              err, sizeof err)) < 0 ||
        (rc = qg__reqjson_str(&o, "status", 1, 16, &status, err,
                              sizeof err)) < 0 ||
        (rc = qg__reqjson_str(&o, "subject", 0, 255, &subject, err,
                              sizeof err)) < 0 ||
        (rc = qg__reqjson_str(&o, "model", 0, QG_NAME_MAX - 1, &model, err,
                              sizeof err)) < 0 ||
        (rc = qg__reqjson_int(&o, "input_tokens", 0, 0, QG_TOKENS_MAX, &in_t,
                              err, sizeof err)) < 0 ||
        (rc = qg__reqjson_int(&o, "output_tokens", 0, 0, QG_TOKENS_MAX,
                              &out_t, err, sizeof err)) < 0 ||
        (rc = has_weight = qg__reqjson_milli(&o, "weight", 0, &weight, err,
                                             sizeof err)) < 0)
        goto bad;
    if ((st_code = qg__settle_status_parse(status)) < 0) {
        snprintf(err, sizeof err, "status must be completed, cancelled or "
                 "failed");
        rc = -1;
        goto bad;
    }
    memset(&st, 0, sizeof st);
    st.req = (qg_settle_req){.request_id = rid,
                             .status = (qg_settle_status)st_code,
                             .input_tokens = in_t, .output_tokens = out_t,
                             .weight_milli = has_weight ? weight : -1,
                             .subject = subject};
    st.model = model;
    st.recover = 1;
    /* answered by settle_done once the row is durable, or with what
     * stopped it (the gate copies the strings) */
    if (qg__gate_settle(s, &st, r->worker, qg__http_req_base(r), settle_done,
                        r) != QG_OK)
        qg__reply_error(s, r, 503, "overloaded", "out of memory");
    goto out;
bad:
    qg__reply_error(s, r, 400, rc == -2 ? "out_of_range" : "invalid_request",
                    err);
out:
    qg__reqjson_free(&o);
}
