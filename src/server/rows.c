/* rows.c - the ledger row of a decision, built the same way by every
 * route that decides (/v1/check, /v1/authz, the proxy), and the one
 * mapping of engine errors to HTTP answers (QG_EIO: the ledger could not
 * be read to check a request id, reqid.c). */
#include <string.h>
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
    if (d->binding >= 0)
        qg__row_copy(row->window, sizeof row->window,
                    d->views[d->binding].name);
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

void qg__reply_engine_error(qg_server *s, qg_http_req *r, int rc,
                           const char *msg)
{
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
            qg__reply_error(s, r, map[i].status, map[i].type, msg);
            return;
        }
    qg__reply_error(s, r, 500, "internal_error", msg);
}
