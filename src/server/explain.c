/* explain.c - one request's charge reconstructed from the ledger
 * (PRODUCT.md 8 "Explain"; docs/cli.md "explain", docs/api.md): the
 * JSON that `quotagate explain` prints and GET /v1/admin/requests/{id}
 * answers, built here once for both.
 *
 * The row itself says who, when, what was reserved and charged, how it
 * was settled, the payg overage and the fallback mark.  What each window
 * held just before the decision is not on the row: it is replayed.  The
 * admitted rows of the subject and of its org's members decided within
 * the rules' reach before the row (qg__ledger_scan_entity: read through
 * the per-subject and per-org indexes, so the cost follows that subject's
 * and org's rows in the span, not the ledger's size) go through a fresh
 * engine over an empty in-process store with qg_engine_restore, the call
 * the start's rebuild and reconciliation make, each as it stood at the
 * decision (settled later: still a reservation then).  The views of that
 * engine at the decision's instant are `used_before`; the row's own
 * charge restored on top gives `used_after`, so `charged` is what the
 * enforcing code counts of it in each window (0 in a window scoped to
 * other models).  A refused row is decided again by qg_engine_check on
 * the replayed state: its binding window and retry-after are the ones
 * the engine computes from exactly what the ledger held, and `replay`
 * says whether that decision agrees with the ledger's.
 *
 * Rows decided at the same millisecond as the explained one count before
 * it when the ledger wrote them first (an admitted row), or all of them
 * (a refusal: it was decided against what was admitted up to it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "json_out.h"
#include "rules.h"
#include "server.h"
#include "weights.h"

#define SEEN_MAX (1u << 16)          /* members of one org replayed */

typedef struct replay_ctx {
    qg_engine *e;
    const qg_ledger_row *target;
    char **seen;                     /* subjects registered (open hash) */
    uint32_t seen_cap;
    uint64_t rows, skipped;
    int rc;
    char *err;
    size_t errcap;
} replay_ctx;

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Register a subject of another row once, with the plan and org its row
 * was decided under.  0, or an error (the table is full: QG_EFULL). */
static int register_once(replay_ctx *c, const qg_ledger_row *row)
{
    uint32_t i = name_hash(row->subject) & (c->seen_cap - 1);
    char err[256];
    for (uint32_t n = 0; n < c->seen_cap; n++, i = (i + 1) & (c->seen_cap - 1)) {
        if (!c->seen[i])
            break;
        if (strcmp(c->seen[i], row->subject) == 0)
            return QG_OK;
    }
    if (c->seen[i] || !(c->seen[i] = strdup(row->subject)))
        return c->seen[i] ? QG_EFULL : QG_ENOMEM;
    /* unusable (a plan the rules dropped): its rows are skipped below;
     * its billing anchor does not matter, only its org's windows count */
    qg_engine_set_subject(c->e, row->subject, row->plan,
                          row->org[0] ? row->org : NULL, 0, err, sizeof err);
    return QG_OK;
}

static int replay_row(const qg_ledger_row *row, void *ud)
{
    replay_ctx *c = ud;
    const qg_ledger_row *t = c->target;
    qg_restore_req rr;
    char why[256] = "";
    int rc;
    if (strcmp(row->request_id, t->request_id) == 0)
        return 1;                    /* the row itself: what came before */
    if (row->created_ms > t->created_ms)
        return 1;
    if (strcmp(row->subject, t->subject) != 0 &&
        (rc = register_once(c, row)) != QG_OK) {
        snprintf(c->err, c->errcap, "too many members of org %s to replay",
                 t->org);
        c->rc = rc;
        return 1;
    }
    qg__row_restore_req(row, &rr);
    if (qg__row_in_bounds(&rr, why, sizeof why) < 0) {
        c->skipped++;                /* the rebuild skips it too */
        return 0;
    }
    if (rr.settled && row->settled_ms > t->created_ms) {
        rr.settled = 0;              /* a reservation at the decision */
        rr.charged_milli = rr.reserved_milli;
    }
    if (qg_engine_restore(c->e, &rr, why, sizeof why) != QG_OK)
        c->skipped++;
    else
        c->rows++;
    return 0;
}

static const char *row_status_name(int status)
{
    switch (status) {
    case QG_ROW_RESERVED: return "reserved";
    case QG_ROW_COMPLETED: return "completed";
    case QG_ROW_CANCELLED: return "cancelled";
    case QG_ROW_FAILED: return "failed";
    case QG_ROW_REJECTED: return "rejected";
    case QG_ROW_EXPIRED: return "expired";
    }
    return "unknown";
}

/* The qualified name of a view: "org.NAME" for an org's window, as in
 * error.window and the headers (docs/api.md, "Window names"). */
static json_t *view_name(const qg_window_view *v)
{
    char buf[QG_NAME_MAX + 8];
    snprintf(buf, sizeof buf, "%s%s", v->org ? "org." : "",
             v->name ? v->name : "");
    return json_string(buf);
}

/* "weight": the coefficients of the model as the rules give them, the
 * formula in words, and what the arithmetic gives for the row's tokens
 * (`computed`, the charge of those tokens; `charged` is what counts). */
static json_t *weight_json(const qg_rules *r, const qg_ledger_row *row)
{
    json_t *w = json_object();
    int mi = row->model[0] ? qg_rules_find_model(r, row->model) : -1;
    char f[512], a[40], b[40], c[40], d[40];
    json_object_set_new(w, "input_tokens", json_integer(row->input_tokens));
    json_object_set_new(w, "output_tokens", json_integer(row->output_tokens));
    if (!row->model[0]) {
        qg_fixed_format(row->reserved_milli, 3, a, sizeof a);
        snprintf(f, sizeof f, "weight given by the caller: %s %s", a,
                 qg_rules_unit(r));
    } else if (mi < 0) {
        snprintf(f, sizeof f, "model %s is not in the rules loaded "
                 "(weights %s): its coefficients cannot be shown",
                 row->model, r->weights_version ? r->weights_version : "");
    } else {
        const qg_model *m = &r->models[mi];
        int64_t x = qg__weight_milli(m, row->input_tokens,
                                     row->output_tokens);
        qg_fixed_format(m->per_request_milli, 3, a, sizeof a);
        qg_fixed_format(m->input_per_1k_micro, 6, b, sizeof b);
        qg_fixed_format(m->output_per_1k_micro, 6, c, sizeof c);
        qg_fixed_format(x < 0 ? 0 : x, 3, d, sizeof d);
        snprintf(f, sizeof f, "%s per request + %lld input tokens x %s per "
                 "1k + %lld output tokens x %s per 1k = %s %s (rounded up "
                 "to 0.001)", a, (long long)row->input_tokens, b,
                 (long long)row->output_tokens, c, d, qg_rules_unit(r));
        json_object_set_new(w, "per_request", qg__json_milli(m->per_request_milli));
        json_object_set_new(w, "input_per_1k",
                            qg__json_scaled(m->input_per_1k_micro, 6));
        json_object_set_new(w, "output_per_1k",
                            qg__json_scaled(m->output_per_1k_micro, 6));
        if (x >= 0)
            json_object_set_new(w, "computed", qg__json_milli(x));
    }
    json_object_set_new(w, "formula", json_string(f));
    json_object_set_new(w, "reserved", qg__json_milli(row->reserved_milli));
    json_object_set_new(w, "charged", qg__json_milli(row->weight_milli));
    if (row->detail[0])
        json_object_set_new(w, "detail", json_string(row->detail));
    return w;
}

static const qg_window_view *find_view(const qg_decision *d,
                                       const qg_window_view *v)
{
    for (int i = 0; i < d->nviews; i++)
        if (d->views[i].org == v->org &&
            strcmp(d->views[i].name, v->name) == 0)
            return &d->views[i];
    return NULL;
}

/* The fresh engine the rows are replayed into: the rules (ownership
 * passes), an empty store, the subject as its row was decided. */
static qg_engine *fresh_engine(qg_rules *rules, qg_store *st, qg_ledger *l,
                               const qg_ledger_row *row, char *err,
                               size_t errcap)
{
    char plan[64], org[64];
    int64_t anchor_ms = 0;
    int si = qg_rules_find_subject(rules, row->subject);
    qg_engine *e;
    if (si >= 0)
        anchor_ms = rules->subjects[si].billing_anchor_ms;
    if (qg__ledger_get_subject(l, row->subject, plan, sizeof plan, org,
                               sizeof org, &anchor_ms) != QG_OK && si < 0)
        anchor_ms = 0;
    if (!(e = qg_engine_new(rules, st))) {
        qg_rules_free(rules);
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    if (qg_engine_set_subject(e, row->subject, row->plan,
                              row->org[0] ? row->org : NULL, anchor_ms, err,
                              errcap) != QG_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errcap, "the row's plan %s or org %s is not in the "
                 "rules loaded (version %s): %s", row->plan,
                 row->org[0] ? row->org : "(none)",
                 qg_rules_version(qg_engine_rules(e)), why);
        qg_engine_free(e);
        return NULL;
    }
    return e;
}

/* A refusal decided again on the replayed state (module comment). */
static json_t *recheck(qg_engine *e, const qg_ledger_row *row,
                       qg_decision *d)
{
    qg_check_req q;
    char rid[QG_REQUEST_ID_MAX + 16], err[256];
    json_t *j = json_object();
    memset(&q, 0, sizeof q);
    snprintf(rid, sizeof rid, "explain:%.255s", row->request_id);
    q.subject = row->subject;
    q.request_id = rid;
    if (row->model[0]) {
        q.model = row->model;
        q.input_tokens = row->input_tokens;
        q.max_output_tokens = row->output_tokens;
    } else {
        q.weight_milli = row->reserved_milli;
    }
    if (qg_engine_check(e, &q, row->created_ms, d, err, sizeof err) != QG_OK) {
        json_object_set_new(j, "error", json_string(err));
        d->outcome = QG_NONE;
        return j;
    }
    json_object_set_new(j, "decision", json_string(
        d->outcome == QG_ALLOW ? "allow" : "reject"));
    json_object_set_new(j, "window", d->binding >= 0
                        ? view_name(&d->views[d->binding]) : json_null());
    json_object_set_new(j, "agrees", json_boolean(
        d->outcome != QG_ALLOW &&
        (d->binding < 0 ? !row->window[0]
         : strcmp(d->views[d->binding].name, row->window) == 0 ||
           (d->views[d->binding].org &&
            strncmp(row->window, "org.", 4) == 0 &&
            strcmp(d->views[d->binding].name, row->window + 4) == 0))));
    return j;
}

int qg__explain(qg_ledger *l, const char *rules_path, const char *request_id,
                json_t **out, char *err, size_t errcap)
{
    qg_ledger_row row;
    qg_rules *rules = NULL;
    qg_store *st = NULL;
    qg_engine *e = NULL;
    qg_decision *before = NULL, *after = NULL, *re = NULL;
    replay_ctx c;
    json_t *j = NULL, *wins, *replay = NULL;
    char lerr[1024];
    int rc;

    *out = NULL;
    memset(&c, 0, sizeof c);
    if ((rc = qg__ledger_get(l, request_id, &row)) != QG_OK) {
        snprintf(err, errcap, rc == QG_ENOTFOUND
                 ? "no request %s in the ledger"
                 : "the ledger could not be read for request %s", request_id);
        return rc;
    }
    if (qg_rules_load(rules_path, &rules, lerr, sizeof lerr) != QG_OK) {
        snprintf(err, errcap, "the rules could not be read: %s", lerr);
        return QG_ERULES;
    }
    if (!(st = qg_store_memory_new(NULL)) ||
        !(before = calloc(1, sizeof *before)) ||
        !(after = calloc(1, sizeof *after)) ||
        !(re = calloc(1, sizeof *re)) ||
        !(c.seen = calloc(SEEN_MAX, sizeof *c.seen))) {
        qg_rules_free(rules);
        snprintf(err, errcap, "out of memory");
        rc = QG_ENOMEM;
        goto done;
    }
    if (!(e = fresh_engine(rules, st, l, &row, err, errcap))) {
        rc = QG_EINVAL;
        goto done;
    }
    c.e = e;
    c.target = &row;
    c.seen_cap = SEEN_MAX;
    c.err = err;
    c.errcap = errcap;
    {
        int64_t reach = qg_engine_reach_ms(e);
        int64_t since = row.created_ms > reach ? row.created_ms - reach : 0;
        rc = qg__ledger_scan_entity(l, row.subject, row.org, since,
                                    row.created_ms, replay_row, &c);
    }
    if (c.rc != QG_OK) {
        rc = c.rc;
        goto done;
    }
    if (rc < 0) {
        snprintf(err, errcap, "the ledger could not be read: %s",
                 qg_strerror(rc));
        goto done;
    }
    if ((rc = qg_engine_usage(e, row.subject, row.created_ms, before)) !=
        QG_OK) {
        snprintf(err, errcap, "the subject's windows: %s", qg_strerror(rc));
        goto done;
    }
    if (row.decision == QG_ALLOW) {
        qg_restore_req rr;
        char why[256] = "";
        qg__row_restore_req(&row, &rr);
        if (qg__row_in_bounds(&rr, why, sizeof why) >= 0)
            qg_engine_restore(e, &rr, why, sizeof why);
        rc = qg_engine_usage(e, row.subject, row.created_ms, after);
    } else {
        if (row.model[0])
            replay = recheck(e, &row, re);
        *after = *before;            /* a refusal charges nothing */
        rc = QG_OK;
    }
    if (rc != QG_OK) {
        snprintf(err, errcap, "the subject's windows: %s", qg_strerror(rc));
        goto done;
    }
    {
        /* the version in force at the decision (PRODUCT.md 8): its
         * coefficients, units and name are what the row was decided by */
        const qg_rules *r = qg_engine_rules_at(e, row.created_ms);
        j = json_object();
        json_object_set_new(j, "request_id", json_string(row.request_id));
        json_object_set_new(j, "subject", json_string(row.subject));
        json_object_set_new(j, "org", row.org[0] ? json_string(row.org)
                                                  : json_null());
        json_object_set_new(j, "plan", json_string(row.plan));
        json_object_set_new(j, "rule_version", json_string(row.rules_version));
        json_object_set_new(j, "weight_version",
                            json_string(row.weights_version));
        json_object_set_new(j, "model", row.model[0] ? json_string(row.model)
                                                      : json_null());
        json_object_set_new(j, "decided_at", qg__json_time(row.created_ms));
        json_object_set_new(j, "decision", json_string(
            row.decision == QG_ALLOW ? "allow" : "reject"));
        json_object_set_new(j, "window", row.window[0]
                            ? json_string(row.window) : json_null());
        json_object_set_new(j, "retry_after_s",
                            replay && re->outcome == QG_REJECT
                            ? qg__json_milli(re->retry_after_ms)
                            : json_null());
        if (row.decision == QG_REJECT_NEVER)
            json_object_set_new(j, "retryable", json_false());
        json_object_set_new(j, "weight", weight_json(r, &row));
        json_object_set_new(j, "status",
                            json_string(row_status_name(row.status)));
        json_object_set_new(j, "settled_at", qg__json_time(row.settled_ms));
        wins = json_array();
        for (int i = 0; i < before->nviews; i++) {
            const qg_window_view *b = &before->views[i];
            const qg_window_view *a = find_view(after, b);
            int64_t ua = a ? a->used_milli : b->used_milli;
            json_t *w = json_object();
            json_object_set_new(w, "name", view_name(b));
            json_object_set_new(w, "type", json_string(
                qg__json_win_type_name(b->type)));
            json_object_set_new(w, "unit", json_string(
                qg__json_unit_of(b, qg_rules_unit(r))));
            json_object_set_new(w, "limit", qg__json_milli(b->limit_milli));
            json_object_set_new(w, "used_before",
                                qg__json_milli(b->used_milli));
            json_object_set_new(w, "charged",
                                qg__json_milli(ua - b->used_milli));
            json_object_set_new(w, "used_after", qg__json_milli(ua));
            json_array_append_new(wins, w);
        }
        json_object_set_new(j, "windows", wins);
        if (row.headroom_milli >= 0 || row.overage_milli > 0)
            json_object_set_new(j, "overage", json_pack(
                "{s:o, s:o, s:o}", "weight",
                qg__json_milli(row.overage_milli), "price_usd_per_unit",
                qg__json_scaled(row.overage_price_micro, 6), "cost_usd",
                qg__json_scaled(row.overage_cost_micro, 6)));
        else
            json_object_set_new(j, "overage", json_null());
        json_object_set_new(j, "fallback", json_boolean(row.fallback));
        /* how the figures were obtained: enough to redo them */
        json_object_set_new(j, "replay", json_pack(
            "{s:s, s:I, s:I}", "rules_loaded", qg_rules_version(r),
            "rows", (json_int_t)c.rows, "rows_skipped",
            (json_int_t)c.skipped));
        if (replay)
            json_object_set_new(json_object_get(j, "replay"), "recheck",
                                replay);
        else if (row.decision != QG_ALLOW)
            json_object_set_new(json_object_get(j, "replay"), "recheck",
                                json_string("not possible: a refused "
                                            "weight-only check's weight is "
                                            "not on its row"));
        if (strcmp(qg_rules_version(r), row.rules_version) != 0)
            json_object_set_new(j, "warning", json_sprintf(
                "the row was decided under rule version %s, the figures "
                "are replayed under version %s", row.rules_version,
                qg_rules_version(r)));
        else if (r->weights_version &&
                 strcmp(r->weights_version, row.weights_version) != 0)
            json_object_set_new(j, "warning", json_sprintf(
                "the row was weighed with weights %s, the formula shows "
                "the coefficients of weights %s", row.weights_version,
                r->weights_version));
        replay = NULL;
    }
    *out = j;
    rc = QG_OK;
done:
    json_decref(replay);
    if (c.seen) {
        for (uint32_t i = 0; i < SEEN_MAX; i++)
            free(c.seen[i]);
        free(c.seen);
    }
    qg_engine_free(e);
    qg_store_free(st);
    free(before);
    free(after);
    free(re);
    return rc;
}

/* The public form, for the CLI (quotagate.h). */
int qg_explain(const char *ledger_url, const char *rules_path,
               const char *request_id, char **json_out, char *err,
               size_t errcap)
{
    qg_ledger_opts lo;
    qg_ledger *l;
    json_t *j = NULL;
    int rc;
    *json_out = NULL;
    memset(&lo, 0, sizeof lo);
    if (!(l = qg__ledger_open(ledger_url, &lo, err, errcap)))
        return QG_EIO;
    rc = qg__explain(l, rules_path, request_id, &j, err, errcap);
    qg__ledger_close(l);
    if (rc != QG_OK)
        return rc;
    if (!(*json_out = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                        JSON_REAL_PRECISION(15)))) {
        json_decref(j);
        snprintf(err, errcap, "out of memory");
        return QG_ENOMEM;
    }
    json_decref(j);
    return QG_OK;
}
