/* rows.c - the ledger row of a decision, built the same way by every
 * route that decides (/v1/check, /v1/authz, the proxy), and the one
 * mapping of engine errors to HTTP answers (QG_EIO: the ledger could not
 * be read to check a request id, reqid.c); and the other way, a row as
 * the restore request that replays it (the rebuilds, reconciliation). */
#include <stdio.h>
#include <string.h>
#include "phrase.h"
#include "server.h"

void qg__row_copy(char *dst, size_t cap, const char *src)
{
    size_t n;
    if (cap == 0)
        return;
    n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

void qg__row_of_decision(qg_ledger_row *row, const qg_decision *d,
                        const char *rid, const char *subject,
                        int64_t input_tokens, int64_t output_tokens)
{
    memset(row, 0, sizeof *row);
    qg__row_copy(row->request_id, sizeof row->request_id, rid);
    qg__row_copy(row->subject, sizeof row->subject, subject);
    qg__row_copy(row->org, sizeof row->org, d->org);
    qg__row_copy(row->plan, sizeof row->plan, d->plan);
    qg__row_copy(row->rules_version, sizeof row->rules_version,
                d->rules_version);
    qg__row_copy(row->weights_version, sizeof row->weights_version,
                d->weights_version);
    qg__row_copy(row->model, sizeof row->model, d->model);
    if (d->binding >= 0)               /* its one name: "org.NAME" too */
        qg__phrase_window_name(d->views[d->binding].name,
                               d->views[d->binding].org, row->window,
                               sizeof row->window);
    row->decision = d->outcome;
    row->status = d->outcome == QG_ALLOW ? QG_ROW_RESERVED : QG_ROW_REJECTED;
    row->input_tokens = input_tokens;
    row->output_tokens = output_tokens;
    row->reserved_milli = d->outcome == QG_ALLOW ? d->weight_milli : 0;
    row->weight_milli = row->reserved_milli;
    row->created_ms = d->decided_at_ms;
    row->headroom_milli = -1;
    if (d->outcome == QG_ALLOW && d->headroom_milli >= 0) {
        row->headroom_milli = d->headroom_milli;
        row->overage_price_micro = d->overage_price_micro;
        row->overage_milli = d->overage_milli;
        row->overage_cost_micro = d->overage_cost_micro;
    }
}

void qg__row_fill_settle(qg_ledger_row *row, const char *rid, int row_status,
                        int64_t input_tokens, int64_t output_tokens,
                        const qg_settle_result *res, int64_t now_ms)
{
    qg__row_copy(row->request_id, sizeof row->request_id, rid);
    row->decision = QG_ALLOW;
    row->created_ms = res->decided_at_ms;
    row->reserved_milli = res->reserved_milli;
    row->status = row_status;
    row->input_tokens = input_tokens;
    row->output_tokens = output_tokens;
    row->weight_milli = res->charged_milli;
    row->settled_ms = now_ms;
    row->overage_milli = res->overage_milli;
    row->overage_cost_micro = res->overage_cost_micro;
}

void qg__row_of_settle(qg_ledger_row *row, const char *rid,
                      const char *subject, int row_status,
                      int64_t input_tokens, int64_t output_tokens,
                      const qg_settle_result *res, int64_t now_ms)
{
    memset(row, 0, sizeof *row);
    row->settle_only = 1;
    qg__row_copy(row->subject, sizeof row->subject, subject);
    row->headroom_milli = -1;
    qg__row_fill_settle(row, rid, row_status, input_tokens, output_tokens, res,
                       now_ms);
}

const char *qg__engine_error_hint(qg_server *s, int rc, const char *msg,
                                  char *buf, size_t cap)
{
    const qg_rules *rules = qg_engine_rules(s->engine);
    size_t n;
    if (rc == QG_ENOSUBJECT) {
        snprintf(buf, cap, "%s; a subject is created with POST "
                 "/v1/admin/subjects (admin key) or listed under subjects: "
                 "in the rules, and with default_plan: any subject is "
                 "decided on that plan", msg ? msg : "unknown subject");
        return buf;
    }
    if (rc != QG_EMODEL || !rules)
        return msg;
    n = (size_t)snprintf(buf, cap, "%s; the models of the rules (weights "
                         "%s) are:", msg ? msg : "unknown model",
                         rules->weights_version ? rules->weights_version : "");
    for (int i = 0; i < rules->nmodels && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s %s", i ? "," : "",
                              rules->models[i].name);
    return buf;
}

void qg__reply_engine_error(qg_server *s, qg_http_req *r, int rc,
                           const char *msg)
{
    char hint[1024];
    static const struct {
        int rc, status;
        const char *type;
    } map[] = {
        {QG_ENOSUBJECT, 404, "unknown_subject"},
        {QG_EMODEL, 400, "unknown_model"},
        {QG_ENOTFOUND, 404, "unknown_request"},
        {QG_EFULL, 503, "overloaded"},
        {QG_EINVAL, 400, "invalid_request"},
        {QG_ERANGE, 400, "out_of_range"},
        {QG_EIO, 503, "ledger_unavailable"},
        {QG_ELEDGER, 503, "ledger_unavailable"},
        {QG_ESTORE, 503, "store_unavailable"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].rc == rc) {
            qg__reply_error(s, r, map[i].status, map[i].type,
                            qg__engine_error_hint(s, rc, msg, hint,
                                                  sizeof hint));
            return;
        }
    qg__reply_error(s, r, 500, "internal_error", msg);
}

void qg__row_restore_req(const qg_ledger_row *row, qg_restore_req *rr)
{
    int settled = row->status != QG_ROW_RESERVED;
    memset(rr, 0, sizeof *rr);
    rr->subject = row->subject;
    rr->request_id = row->request_id;
    rr->model = row->model;
    rr->decided_at_ms = row->created_ms;
    rr->reserved_milli = row->reserved_milli;
    rr->charged_milli = settled ? row->weight_milli : row->reserved_milli;
    rr->settled = settled;
    rr->status = row->status == QG_ROW_CANCELLED ? QG_SETTLE_CANCELLED
                 : row->status == QG_ROW_FAILED  ? QG_SETTLE_FAILED
                                                 : QG_SETTLE_COMPLETED;
    rr->headroom_milli = row->headroom_milli;
    rr->overage_price_micro = row->overage_price_micro;
    rr->overage_cost_micro = row->overage_cost_micro;
}

/* Clamp *v into [lo, hi]; describe it in why (appending) when it moved. */
static int clamp_field(int64_t *v, int64_t lo, int64_t hi, const char *name,
                       char *why, size_t cap)
{
    int64_t old = *v;
    size_t n = strlen(why);
    if (old >= lo && old <= hi)
        return 0;
    *v = old < lo ? lo : hi;
    if (n < cap)
        snprintf(why + n, cap - n, "%s%s %lld -> %lld", n ? ", " : "", name,
                 (long long)old, (long long)*v);
    return 1;
}

/* A row against the bounds (server.h; quotagate.h, docs/operations.md "Rebuild"):
 * rows written before the bounds existed may hold any amount.  Amounts
 * are clamped into them: an amount over the bound becomes the bound
 * (still at least any window's limit, so the subject is refused exactly
 * as long as the row would have refused it: nobody gains allowance), a
 * negative one 0 (nothing to charge, but the request id is remembered).
 * A row whose instant is out of range cannot be placed in any window and
 * is skipped.  Returns 0 as is, 1 clamped, -1 skip; why says what. */
int qg__row_in_bounds(qg_restore_req *rr, char *why, size_t cap)
{
    int n = 0;
    why[0] = '\0';
    if (rr->decided_at_ms < 0 || rr->decided_at_ms > QG_TIME_MAX_MS) {
        snprintf(why, cap, "created_ms %lld out of range",
                 (long long)rr->decided_at_ms);
        return -1;
    }
    n += clamp_field(&rr->reserved_milli, 0, QG_AMOUNT_MAX_MILLI,
                     "reserved_milli", why, cap);
    n += clamp_field(&rr->charged_milli, 0, QG_AMOUNT_MAX_MILLI,
                     "weight_milli", why, cap);
    n += clamp_field(&rr->headroom_milli, -1, QG_AMOUNT_MAX_MILLI,
                     "headroom_milli", why, cap);
    n += clamp_field(&rr->overage_price_micro, 0, QG_MONEY_MAX_MICRO,
                     "overage_price_micro", why, cap);
    n += clamp_field(&rr->overage_cost_micro, 0, QG_MONEY_MAX_MICRO,
                     "overage_cost_micro", why, cap);
    return n > 0;
}

