/* json_decision.c - the bodies of decisions: /v1/check (allowed and
 * refused), /v1/settle, /v1/usage and every error (json_out.h), written
 * directly as text (json_text.h): these are answered on every request,
 * and each window and recovery schedule has one writer here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fixed.h"
#include "json_out.h"
#include "json_text.h"
#include "headers.h"
#include "phrase.h"

/* A view's one name: "NAME", or "org.NAME" for an org's window
 * (phrase.h; docs/api.md "Window names"). */
static void jb_view_name(qg__jb *b, const qg_window_view *v)
{
    char buf[QG_NAME_MAX + 8];
    if (qg__phrase_window_name(v->name, v->org, buf, sizeof buf) < 0)
        buf[0] = '\0';
    qg__jb_str(b, buf);
}

/* --------------------------------------------------------------- check */

/* The window a refusal names: the binding one, or for a request no window
 * can hold, the first whose limit is below the weight. */
static int refusing_view(const qg_decision *d)
{
    if (d->binding >= 0 && d->binding < d->nviews)
        return d->binding;
    for (int i = 0; i < d->nviews; i++)
        if (d->outcome == QG_REJECT_NEVER
                ? d->views[i].limit_milli < d->weight_milli
                : d->views[i].remaining_milli < d->weight_milli)
            return i;
    return -1;
}

/* The refusal's plain sentence, in the words pricing and the console use:
 * with the rules, the window as `quotagate pricing` says it (phrase.c),
 * "burst_5h limit reached (50 weight points per rolling 5 hours): ...". */
static void refusal_message(const qg_decision *d, int b, const qg_rules *r,
                            const char *unit, char *buf, size_t cap)
{
    char used[32], limit[32], weight[32], at[40], name[QG_NAME_MAX + 8];
    char phrase[256], said[272] = "";
    qg_fixed_format(d->weight_milli, 3, weight, sizeof weight);
    if (b < 0) {
        snprintf(buf, cap, "request refused: this request (%s) does not fit",
                 weight);
        return;
    }
    const qg_window_view *v = &d->views[b];
    const char *u = qg__json_unit_of(v, unit);
    const qg_window_spec *spec = qg__view_spec(r, d, v);
    if (qg__phrase_window_name(v->name, v->org, name, sizeof name) < 0)
        name[0] = '\0';
    if (spec && qg__phrase_window(r, spec, phrase, sizeof phrase) >= 0)
        snprintf(said, sizeof said, " (%s)", phrase);
    qg_fixed_format(v->used_milli, 3, used, sizeof used);
    qg_fixed_format(v->limit_milli, 3, limit, sizeof limit);
    if (d->outcome == QG_REJECT_NEVER) {
        snprintf(buf, cap,
                 "this request (%s %s) exceeds the %s limit%s of %s %s on "
                 "plan %s: it can never be admitted",
                 weight, unit ? unit : "weight points", name, said, limit, u,
                 d->plan ? d->plan : "?");
        return;
    }
    qg_iso8601_format(d->decided_at_ms + d->retry_after_ms, at,
                      (int)sizeof at);
    /* A request-unit window counts this request as one request: its
     * weight would be a number in another unit, so it is left out. */
    if (v->unit == QG_UNIT_REQUESTS)
        snprintf(buf, cap,
                 "%s limit reached%s: %s of %s %s %s; this request fits "
                 "again at %s",
                 name, said, used, limit, u,
                 v->type == QG_WIN_CONCURRENCY ? "in flight" : "used", at);
    else
        snprintf(buf, cap,
                 "%s limit reached%s: %s of %s %s used; this request (%s) "
                 "fits again at %s",
                 name, said, used, limit, u, weight, at);
}

/* The spending-cap refusal's sentence. */
static void cap_message(const qg_decision *d, int b, const char *unit,
                        char *buf, size_t cap)
{
    char spent[32], capv[32], cost[32], over[32], at[40];
    char name[QG_NAME_MAX + 8] = "the limit";
    if (b >= 0 && qg__phrase_window_name(d->views[b].name, d->views[b].org,
                                         name, sizeof name) < 0)
        snprintf(name, sizeof name, "the limit");
    qg_fixed_format(d->spent_micro, 6, spent, sizeof spent);
    qg_fixed_format(d->spending_cap_micro, 6, capv, sizeof capv);
    qg_fixed_format(d->overage_cost_micro, 6, cost, sizeof cost);
    qg_fixed_format(d->overage_milli, 3, over, sizeof over);
    if (d->outcome == QG_REJECT_NEVER) {
        snprintf(buf, cap, "spending cap reached: this request's overage "
                 "(%s %s beyond %s) would cost $%s, more than the whole "
                 "spending cap of $%s: it can never be admitted", over,
                 unit ? unit : "weight points",
                 name, cost, capv);
        return;
    }
    qg_iso8601_format(d->decided_at_ms + d->retry_after_ms, at,
                      (int)sizeof at);
    snprintf(buf, cap, "spending cap reached: $%s of $%s spent this period; "
             "this request's overage (%s %s beyond %s) would cost $%s; it "
             "fits again at %s", spent, capv, over,
             unit ? unit : "weight points",
             name, cost, at);
}

/* The payg object of a decision (docs/api.md). */
static void overage_text(qg__jb *b, const qg_decision *d)
{
    QG__JB_LIT(b, ",\"overage\":{\"policy\":\"payg\",\"units\":");
    qg__jb_milli(b, d->overage_milli);
    QG__JB_LIT(b, ",\"price_per_unit_usd\":");
    qg__jb_scaled(b, d->overage_price_micro, 6);
    QG__JB_LIT(b, ",\"cost_usd\":");
    qg__jb_scaled(b, d->overage_cost_micro, 6);
    QG__JB_LIT(b, ",\"spent_usd\":");
    qg__jb_scaled(b, d->spent_micro, 6);
    QG__JB_LIT(b, ",\"spending_cap_usd\":");
    if (d->spending_cap_micro > 0)
        qg__jb_scaled(b, d->spending_cap_micro, 6);
    else
        QG__JB_LIT(b, "null");
    QG__JB_LIT(b, ",\"cap_resets_at\":");
    qg__jb_time(b, d->cap_period_end_ms);
    QG__JB_LIT(b, "}");
}

/* A window's members (json_out.h "window"), without the closing brace. */
static void window_open(qg__jb *b, const qg_window_view *v,
                        const char *unit_name)
{
    QG__JB_LIT(b, "{\"name\":");
    jb_view_name(b, v);
    if (v->org)
        QG__JB_LIT(b, ",\"scope\":\"org\",\"type\":");
    else
        QG__JB_LIT(b, ",\"scope\":\"member\",\"type\":");
    qg__jb_str(b, qg__json_win_type_name(v->type));
    QG__JB_LIT(b, ",\"unit\":");
    qg__jb_str(b, qg__json_unit_of(v, unit_name));
    QG__JB_LIT(b, ",\"limit\":");
    qg__jb_milli(b, v->limit_milli);
    QG__JB_LIT(b, ",\"used\":");
    qg__jb_milli(b, v->used_milli);
    QG__JB_LIT(b, ",\"remaining\":");
    qg__jb_milli(b, v->remaining_milli);
    QG__JB_LIT(b, ",\"reset_at\":");
    qg__jb_time(b, v->reset_at_ms);
}

static void window_text(qg__jb *b, const qg_window_view *v,
                        const char *unit_name)
{
    window_open(b, v, unit_name);
    QG__JB_LIT(b, "}");
}

/* The recovery steps of view `only` (unnamed), or with only < 0 of every
 * view, each named by its window. */
static void recovers_text(qg__jb *b, const qg_decision *d, int only,
                          int64_t now_ms)
{
    int first = 1;
    QG__JB_LIT(b, "[");
    for (int i = 0; i < d->nviews; i++) {
        if (only >= 0 && i != only)
            continue;
        int n = d->nrecovery[i];
        if (n > QG_MAX_RECOVERY)
            n = QG_MAX_RECOVERY;
        for (int k = 0; k < n; k++) {
            const qg_recovery_point *p = &d->recovery[i][k];
            int64_t in = p->at_ms > now_ms ? p->at_ms - now_ms : 0;
            if (!first)
                QG__JB_LIT(b, ",");
            first = 0;
            if (only < 0 && d->views[i].name) {
                QG__JB_LIT(b, "{\"window\":");
                jb_view_name(b, &d->views[i]);
                QG__JB_LIT(b, ",\"at\":");
            } else {
                QG__JB_LIT(b, "{\"at\":");
            }
            qg__jb_time(b, p->at_ms);
            QG__JB_LIT(b, ",\"in_s\":");
            qg__jb_milli(b, in);
            QG__JB_LIT(b, ",\"remaining\":");
            qg__jb_milli(b, p->remaining_milli);
            QG__JB_LIT(b, "}");
        }
    }
    QG__JB_LIT(b, "]");
}

char *qg__json_check(const qg_decision *d, const char *request_id,
                    const qg_rules *r)
{
    const char *unit_name = r ? r->unit : NULL;
    int refused = d->outcome == QG_REJECT || d->outcome == QG_REJECT_NEVER;
    char msg[1024];
    qg__jb b;

    if (qg__jb_init(&b, 256 + 256 * (size_t)(d->nviews > 0 ? d->nviews : 1)) < 0)
        return NULL;
    if (refused)
        QG__JB_LIT(&b, "{\"decision\":\"reject\",\"request_id\":");
    else
        QG__JB_LIT(&b, "{\"decision\":\"allow\",\"request_id\":");
    qg__jb_str(&b, request_id);
    QG__JB_LIT(&b, ",\"weight\":");
    qg__jb_milli(&b, d->weight_milli);
    QG__JB_LIT(&b, ",\"plan\":");
    qg__jb_str(&b, d->plan);
    if (d->org) {
        QG__JB_LIT(&b, ",\"org\":");
        qg__jb_str(&b, d->org);
    }
    if (d->model) {
        QG__JB_LIT(&b, ",\"model\":");
        qg__jb_str(&b, d->model);
    }
    QG__JB_LIT(&b, ",\"rules_version\":");
    qg__jb_str(&b, d->rules_version);
    QG__JB_LIT(&b, ",\"weights_version\":");
    qg__jb_str(&b, d->weights_version);
    if (!refused) {
        QG__JB_LIT(&b, ",\"replayed\":");
        qg__jb_bool(&b, d->replayed);
        if (d->headroom_milli >= 0)
            overage_text(&b, d);
    } else {
        int v = refusing_view(d);
        int never = d->outcome == QG_REJECT_NEVER;
        if (d->cap_reached)
            cap_message(d, v, unit_name, msg, sizeof msg);
        else
            refusal_message(d, v, r, unit_name, msg, sizeof msg);
        if (d->cap_reached)
            QG__JB_LIT(&b, ",\"error\":{\"type\":\"spending_cap_reached\""
                       ",\"window\":");
        else if (never)
            QG__JB_LIT(&b, ",\"error\":{\"type\":\"request_too_large_for_plan\""
                       ",\"window\":");
        else
            QG__JB_LIT(&b, ",\"error\":{\"type\":\"quota_exceeded\",\"window\":");
        if (v >= 0)
            jb_view_name(&b, &d->views[v]);
        else
            QG__JB_LIT(&b, "null");
        QG__JB_LIT(&b, ",\"message\":");
        qg__jb_str(&b, msg);
        QG__JB_LIT(&b, "},\"retryable\":");
        qg__jb_bool(&b, !never);
        if (!never) {
            QG__JB_LIT(&b, ",\"retry_after_s\":");
            qg__jb_milli(&b, d->retry_after_ms > 0 ? d->retry_after_ms : 0);
        }
        if (d->cap_reached)
            overage_text(&b, d);
        QG__JB_LIT(&b, ",\"recovers\":");
        recovers_text(&b, d, -1, d->decided_at_ms);
    }
    QG__JB_LIT(&b, ",\"windows\":[");
    for (int i = 0; i < d->nviews; i++) {
        if (i)
            QG__JB_LIT(&b, ",");
        window_text(&b, &d->views[i], unit_name);
    }
    QG__JB_LIT(&b, "]}");
    return qg__jb_finish(&b);
}

/* -------------------------------------------------------------- settle */

char *qg__json_settle(const qg_settle_result *s, const char *request_id)
{
    qg__jb b;
    if (qg__jb_init(&b, 256) < 0)
        return NULL;
    QG__JB_LIT(&b, "{\"request_id\":");
    qg__jb_str(&b, request_id);
    QG__JB_LIT(&b, ",\"status\":");
    qg__jb_str(&b, qg__json_settle_status_name(s->status));
    QG__JB_LIT(&b, ",\"reserved\":");
    qg__jb_milli(&b, s->reserved_milli);
    QG__JB_LIT(&b, ",\"actual\":");
    qg__jb_milli(&b, s->actual_milli);
    QG__JB_LIT(&b, ",\"charged\":");
    qg__jb_milli(&b, s->charged_milli);
    QG__JB_LIT(&b, ",\"late\":");
    qg__jb_bool(&b, s->late);
    QG__JB_LIT(&b, ",\"replayed\":");
    qg__jb_bool(&b, s->replayed);
    if (s->overage_milli > 0 || s->overage_cost_micro > 0) {
        QG__JB_LIT(&b, ",\"overage_units\":");
        qg__jb_milli(&b, s->overage_milli);
        QG__JB_LIT(&b, ",\"overage_cost_usd\":");
        qg__jb_scaled(&b, s->overage_cost_micro, 6);
    }
    QG__JB_LIT(&b, "}");
    return qg__jb_finish(&b);
}

/* --------------------------------------------------------------- usage */

/* What comes back if nothing more is charged (json_out.h "forecast"). */
static void forecast_text(qg__jb *b, const qg_decision *d, int i)
{
    const qg_window_view *v = &d->views[i];
    int n = d->nrecovery[i] > QG_MAX_RECOVERY ? QG_MAX_RECOVERY
                                              : d->nrecovery[i];
    int64_t full_at = 0;

    /* The schedule's last step is the full recovery when it reaches the
     * limit (rolling schedules keep it even when truncated). */
    if (v->used_milli > 0 && n > 0 &&
        d->recovery[i][n - 1].remaining_milli >= v->limit_milli)
        full_at = d->recovery[i][n - 1].at_ms;
    QG__JB_LIT(b, "{\"name\":");
    jb_view_name(b, v);
    QG__JB_LIT(b, ",\"full_at\":");
    qg__jb_time(b, full_at);
    QG__JB_LIT(b, ",\"next_recovery\":");
    if (n > 0) {
        QG__JB_LIT(b, "{\"at\":");
        qg__jb_time(b, d->recovery[i][0].at_ms);
        QG__JB_LIT(b, ",\"remaining\":");
        qg__jb_milli(b, d->recovery[i][0].remaining_milli);
        QG__JB_LIT(b, "}}");
    } else {
        QG__JB_LIT(b, "null}");
    }
}

/* A window's forecast at the subject's pace (json_out.h "forecast"). */
static void pace_text(qg__jb *b, const qg_forecast *f)
{
    QG__JB_LIT(b, ",\"forecast\":{\"basis_s\":");
    qg__jb_i64(b, f->basis_ms / 1000);
    QG__JB_LIT(b, ",\"weight_per_hour\":");
    qg__jb_milli(b, f->per_hour_milli);
    QG__JB_LIT(b, ",\"exhausted_at\":");
    qg__jb_time(b, f->exhausted_at_ms);
    QG__JB_LIT(b, ",\"before_reset\":");
    qg__jb_bool(b, f->exhausted_at_ms > 0 && f->before_reset);
    QG__JB_LIT(b, "}");
}

char *qg__json_usage(const qg_decision *d, const char *subject,
                     int64_t now_ms, const char *unit_name)
{
    return qg__json_usage_forecast(d, subject, now_ms, unit_name, NULL);
}

char *qg__json_usage_forecast(const qg_decision *d, const char *subject,
                              int64_t now_ms, const char *unit_name,
                              const qg_forecast *fc)
{
    qg__jb b;
    if (qg__jb_init(&b, 512 + 512 * (size_t)(d->nviews > 0 ? d->nviews : 1)) <
        0)
        return NULL;
    QG__JB_LIT(&b, "{\"subject\":");
    qg__jb_str(&b, subject);
    QG__JB_LIT(&b, ",\"plan\":");
    qg__jb_str(&b, d->plan);
    QG__JB_LIT(&b, ",\"org\":");
    qg__jb_str(&b, d->org);
    QG__JB_LIT(&b, ",\"rules_version\":");
    qg__jb_str(&b, d->rules_version);
    QG__JB_LIT(&b, ",\"unit\":");
    qg__jb_str(&b, unit_name ? unit_name : "weight points");
    QG__JB_LIT(&b, ",\"windows\":[");
    for (int i = 0; i < d->nviews; i++) {
        if (i)
            QG__JB_LIT(&b, ",");
        window_open(&b, &d->views[i], unit_name);
        QG__JB_LIT(&b, ",\"recovers\":");
        recovers_text(&b, d, i, now_ms);
        if (fc)
            pace_text(&b, &fc[i]);
        QG__JB_LIT(&b, "}");
    }
    QG__JB_LIT(&b, "],\"forecast\":[");
    for (int i = 0; i < d->nviews; i++) {
        if (i)
            QG__JB_LIT(&b, ",");
        forecast_text(&b, d, i);
    }
    QG__JB_LIT(&b, "]");
    if (d->cap_period_end_ms > 0) {
        /* payg: the money side (docs/api.md) */
        QG__JB_LIT(&b, ",\"overage\":{\"policy\":\"payg\""
                       ",\"price_per_unit_usd\":");
        qg__jb_scaled(&b, d->overage_price_micro, 6);
        QG__JB_LIT(&b, ",\"spent_usd\":");
        qg__jb_scaled(&b, d->spent_micro, 6);
        QG__JB_LIT(&b, ",\"spending_cap_usd\":");
        if (d->spending_cap_micro > 0)
            qg__jb_scaled(&b, d->spending_cap_micro, 6);
        else
            QG__JB_LIT(&b, "null");
        QG__JB_LIT(&b, ",\"cap_resets_at\":");
        qg__jb_time(&b, d->cap_period_end_ms);
        QG__JB_LIT(&b, "}");
    }
    QG__JB_LIT(&b, "}");
    return qg__jb_finish(&b);
}

/* The views of one scope (org or member) with their recovery steps. */
static void scope_windows(qg__jb *b, const qg_decision *d, int org,
                          int64_t now_ms, const char *unit_name)
{
    int first = 1;
    QG__JB_LIT(b, "[");
    for (int i = 0; i < d->nviews; i++) {
        if (!d->views[i].org != !org)
            continue;
        if (!first)
            QG__JB_LIT(b, ",");
        first = 0;
        window_open(b, &d->views[i], unit_name);
        QG__JB_LIT(b, ",\"recovers\":");
        recovers_text(b, d, i, now_ms);
        QG__JB_LIT(b, "}");
    }
    QG__JB_LIT(b, "]");
}

char *qg__json_org_usage(const char *org, const qg_org_member *m, int n,
                         size_t total, int64_t now_ms, const char *unit_name)
{
    const qg_decision *any = NULL;
    qg__jb b;

    if (qg__jb_init(&b, 512 + 1024 * (size_t)(n > 0 ? n : 1)) < 0)
        return NULL;
    for (int i = 0; i < n && !any; i++)
        if (m[i].rc == QG_OK)
            any = m[i].d;
    QG__JB_LIT(&b, "{\"org\":");
    qg__jb_str(&b, org);
    QG__JB_LIT(&b, ",\"unit\":");
    qg__jb_str(&b, unit_name ? unit_name : "weight points");
    QG__JB_LIT(&b, ",\"windows\":");
    if (any)
        scope_windows(&b, any, 1, now_ms, unit_name);
    else
        QG__JB_LIT(&b, "[]");
    QG__JB_LIT(&b, ",\"members_total\":");
    qg__jb_i64(&b, (int64_t)total);
    QG__JB_LIT(&b, ",\"truncated\":");
    qg__jb_bool(&b, total > (size_t)n);
    QG__JB_LIT(&b, ",\"members\":[");
    for (int i = 0; i < n; i++) {
        if (i)
            QG__JB_LIT(&b, ",");
        QG__JB_LIT(&b, "{\"subject\":");
        qg__jb_str(&b, m[i].subject);
        if (m[i].rc != QG_OK) {
            QG__JB_LIT(&b, ",\"error\":");
            qg__jb_str(&b, qg_strerror(m[i].rc));
        } else {
            QG__JB_LIT(&b, ",\"plan\":");
            qg__jb_str(&b, m[i].d->plan);
            QG__JB_LIT(&b, ",\"windows\":");
            scope_windows(&b, m[i].d, 0, now_ms, unit_name);
        }
        QG__JB_LIT(&b, "}");
    }
    QG__JB_LIT(&b, "]}");
    return qg__jb_finish(&b);
}

/* --------------------------------------------------------------- error */

char *qg__json_error(const char *type, const char *message)
{
    qg__jb b;
    if (qg__jb_init(&b, 128 + (message ? strlen(message) : 0)) < 0)
        return NULL;
    QG__JB_LIT(&b, "{\"error\":{\"type\":");
    qg__jb_str(&b, type);
    QG__JB_LIT(&b, ",\"message\":");
    qg__jb_str(&b, message);
    QG__JB_LIT(&b, "}}");
    return qg__jb_finish(&b);
}
