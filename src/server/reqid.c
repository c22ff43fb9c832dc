/* reqid.c - request ids the counters do not remember: the ledger answers
 * for them.
 *
 * The counters remember a bounded number of request ids (--request-ids;
 * the oldest settled or expired one is forgotten first), and a restart
 * rebuilds only those inside the rules' reach.  Idempotency must not end
 * there: the ledger holds every request ever decided, so before an id the
 * counters do not remember is decided or settled, its row is looked up
 * (one primary-key lookup; docs/decisions.md, "Idempotency"):
 *  - a check: another subject's id is refused (400, as a remembered one
 *    is); an admitted request of the same subject is answered from its
 *    row as the replay it is, charging nothing; a refusal of the same
 *    subject is decided again (a refusal charges nothing and is never
 *    remembered); an unknown id is decided.
 *  - a settle: another subject's id is refused (400); a settled row
 *    answers its original settle (replayed); an admitted, unsettled row
 *    is settled late: its reservation was final already (its lease
 *    expired before the counters forgot it, or it lies beyond the
 *    rebuild's reach), so the charge can grow but never shrink, and what
 *    it grows by is charged to the counters when the request is inside
 *    the rules' reach.
 * A ledger that cannot be read answers QG_EIO (503 ledger_unavailable):
 * the id's history cannot be checked, and a guess could charge twice or
 * let one subject take another's id.  The ledger's own guards
 * (ledger_sqlite.c) keep a written row from being overwritten even if a
 * request got past this (a race with rows not yet committed). */
#include <stdio.h>
#include <string.h>
#include "decide.h"
#include "rules.h"
#include "server.h"
#include "weights.h"

/* The ledger's row of rid: 1 found, 0 none, or QG_EIO with err set. */
static int lookup(qg_server *s, const char *rid, qg_ledger_row *row,
                  char *err, size_t errcap)
{
    int rc = qg__ledger_get(s->ledger, rid, row);
    if (rc == QG_OK)
        return 1;
    if (rc == QG_ENOTFOUND)
        return 0;
    {
        qg_ledger_stats ls;
        qg__ledger_stats_get(s->ledger, &ls);
        snprintf(err, errcap, "the ledger cannot be read to look request_id "
                 "\"%s\" up: %s", rid,
                 ls.last_read_error[0] ? ls.last_read_error
                                       : qg_strerror(rc));
    }
    return QG_EIO;
}

static int other_subject(const char *rid, char *err, size_t errcap)
{
    snprintf(err, errcap, "request_id \"%s\" was already used by another "
             "subject", rid);
    return QG_EINVAL;
}

/* An admitted request of this subject found in the ledger: its original
 * decision, with the windows as they stand now (as a remembered replay
 * has them). */
static int replay_of_row(qg_server *s, const qg_check_req *req,
                         int64_t now_ms, qg_decision *d,
                         const qg_ledger_row *prior, char *err,
                         size_t errcap)
{
    int rc;
    if ((rc = qg_engine_usage(s->engine, req->subject, now_ms, d)) != QG_OK) {
        snprintf(err, errcap, "unknown subject \"%s\"", req->subject);
        return rc;
    }
    d->outcome = QG_ALLOW;
    d->replayed = 1;
    d->weight_milli = prior->reserved_milli;
    d->decided_at_ms = prior->created_ms;
    d->retry_after_ms = 0;
    d->binding = -1;
    d->plan = prior->plan;
    d->org = prior->org[0] ? prior->org : NULL;
    d->model = prior->model[0] ? prior->model : NULL;
    d->rules_version = prior->rules_version;
    d->weights_version = prior->weights_version;
    d->headroom_milli = prior->headroom_milli;
    d->overage_price_micro = prior->overage_price_micro;
    d->overage_milli = qg__overage_of(prior->reserved_milli,
                                     prior->headroom_milli);
    d->overage_cost_micro = prior->overage_cost_micro;
    d->cap_reached = 0;
    return QG_OK;
}

int qg__server_check_async(qg_server *s, qg_store_lane *lane,
                           const qg_check_req *req, int64_t now_ms,
                           qg_decision *d, qg_ledger_row *prior, char *err,
                           size_t errcap, qg_engine_done done, void *ud)
{
    int found;

    /* A shared store is not asked whether it remembers the id (a round
     * trip): its own record answers a replay within the decision, and the
     * ledger (its id filter answers new ids without reading the file) is
     * asked first for what the counters may have forgotten. */
    if (!req->request_id || !req->subject ||
        (!(qg_store_flags(s->store) & QG_STORE_SHARED) &&
         qg_engine_remembers(s->engine, req->request_id)))
        return qg_engine_check_async(s->engine, lane, req, now_ms, d, err,
                                     errcap, done, ud);
    if ((found = lookup(s, req->request_id, prior, err, errcap)) < 0)
        return found;
    if (found && strncmp(prior->subject, req->subject,
                         sizeof prior->subject) != 0)
        return other_subject(req->request_id, err, errcap);
    if (!found || prior->decision != QG_ALLOW)
        return qg_engine_check_async(s->engine, lane, req, now_ms, d, err,
                                     errcap, done, ud);
    return replay_of_row(s, req, now_ms, d, prior, err, errcap);
}

int qg__server_check(qg_server *s, const qg_check_req *req, int64_t now_ms,
                    qg_decision *d, qg_ledger_row *prior, char *err,
                    size_t errcap)
{
    return qg__server_check_async(s, NULL, req, now_ms, d, prior, err, errcap,
                                  NULL, NULL);
}

static qg_settle_status status_of_row(int row_status)
{
    return row_status == QG_ROW_CANCELLED ? QG_SETTLE_CANCELLED
           : row_status == QG_ROW_FAILED  ? QG_SETTLE_FAILED
                                          : QG_SETTLE_COMPLETED;
}

/* The weight of the settle's usage, as the store computes it. */
static int actual_weight(qg_server *s, const qg_settle_req *req,
                         const qg_ledger_row *prior, int64_t *out)
{
    const qg_rules *rules = qg_engine_rules(s->engine);
    int mi = prior->model[0] ? qg_rules_find_model(rules, prior->model) : -1;
    if (req->no_charge)
        *out = 0;
    else if (mi >= 0)
        *out = qg__weight_milli(&rules->models[mi], req->input_tokens,
                               req->output_tokens);
    else
        *out = req->weight_milli >= 0 ? req->weight_milli
                                      : prior->reserved_milli;
    return *out < 0 ? QG_ERANGE : QG_OK;
}

int qg__server_settle_prior(qg_server *s, const qg_settle_req *req,
                           int64_t now_ms, qg_settle_result *res,
                           qg_ledger_row *row, char *err, size_t errcap)
{
    qg_ledger_row prior;
    int64_t actual, charged, delta;
    int found, rc;

    if ((found = lookup(s, req->request_id, &prior, err, errcap)) < 0)
        return found;
    if (!found)
        return QG_ENOTFOUND;
    if (req->subject && *req->subject &&
        strncmp(prior.subject, req->subject, sizeof prior.subject) != 0)
        return other_subject(req->request_id, err, errcap);
    if (prior.decision != QG_ALLOW)
        return QG_ENOTFOUND;       /* refused: nothing was reserved */
    memset(res, 0, sizeof *res);
    res->reserved_milli = prior.reserved_milli;
    res->decided_at_ms = prior.created_ms;
    if (prior.status != QG_ROW_RESERVED) {
        /* settled: its original answer */
        res->replayed = 1;
        res->actual_milli = res->charged_milli = prior.weight_milli;
        res->status = status_of_row(prior.status);
        res->overage_milli = prior.overage_milli;
        res->overage_cost_micro = prior.overage_cost_micro;
        return QG_OK;
    }
    /* admitted, never settled, no longer held by the counters: final at
     * its reservation, so a late settle can only add */
    if ((rc = actual_weight(s, req, &prior, &actual)) != QG_OK) {
        snprintf(err, errcap, "token counts too large");
        return rc;
    }
    charged = actual > prior.reserved_milli ? actual : prior.reserved_milli;
    delta = charged - prior.reserved_milli;
    res->late = 1;
    res->actual_milli = actual;
    res->charged_milli = charged;
    res->status = req->status;
    res->overage_milli = qg__overage_of(charged, prior.headroom_milli);
    res->overage_cost_micro =
        qg__overage_cost(res->overage_milli, prior.overage_price_micro);
    if (delta > 0 &&
        prior.created_ms >= now_ms - qg_engine_reach_ms(s->engine)) {
        int64_t extra = res->overage_cost_micro - prior.overage_cost_micro;
        qg_restore_req rr = {.subject = prior.subject,
                             .request_id = req->request_id,
                             .model = prior.model,
                             .decided_at_ms = prior.created_ms,
                             .reserved_milli = delta,
                             .charged_milli = delta,
                             .settled = 1,
                             .status = req->status,
                             .headroom_milli = -1,
                             .overage_price_micro = prior.overage_price_micro,
                             .overage_cost_micro = extra > 0 ? extra : 0,
                             .charge_only = 1};
        if ((rc = qg_engine_restore(s->engine, &rr, err, errcap)) != QG_OK)
            return rc;
    }
    memset(row, 0, sizeof *row);
    row->settle_only = 1;
    row->headroom_milli = -1;
    qg__row_copy(row->subject, sizeof row->subject, prior.subject);
    return QG_OK;
}
