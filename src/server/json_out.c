/* json_out.c - building the API's JSON bodies with jansson.
 *
 * Each body is assembled as a json_t tree and dumped compact.  Builders
 * take new references and hand them to their parent with the *_new
 * setters, so one json_decref of the root releases everything; a failed
 * allocation anywhere yields NULL at the root (jansson's setters accept a
 * NULL value and fail, and every body checks its final tree).  The only
 * floating point in quotagate lives in qg_json_scaled, at the output
 * boundary, where an exact integer-scaled value becomes a JSON number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "civil.h"
#include "fixed.h"
#include "json_out.h"
#include "tz.h"

/* --------------------------------------------------------------- atoms */

json_t *qg_json_scaled(int64_t v, int scale_digits)
{
    int64_t p = 1;
    for (int i = 0; i < scale_digits; i++)
        p *= 10;
    if (v % p == 0)
        return json_integer(v / p);
    /* v / p is correctly rounded; %.15g prints it back as the decimal. */
    return json_real((double)v / (double)p);
}

json_t *qg_json_milli(int64_t v)
{
    return qg_json_scaled(v, 3);
}

json_t *qg_json_time(int64_t ms)
{
    char buf[40];
    if (ms == 0)
        return json_null();
    qg_iso8601_format(ms, buf, (int)sizeof buf);
    return json_string(buf);
}

/* A string member, or null when s is NULL. */
static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

char *qg_json_dump_steal(json_t *j)
{
    char *s;
    if (!j)
        return NULL;
    s = json_dumps(j, QG_JSON_DUMP_FLAGS);
    json_decref(j);
    return s;
}

const char *qg_json_win_type_name(int type)
{
    static const char *const names[] = {"?", "rolling", "calendar", "session",
                                        "rate", "concurrency"};
    return type >= 1 && type <= QG_WIN_CONCURRENCY ? names[type] : "?";
}

const char *qg_json_settle_status_name(int status)
{
    static const char *const names[] = {"?", "completed", "cancelled",
                                        "failed"};
    return status >= 1 && status <= QG_SETTLE_FAILED ? names[status] : "?";
}

const char *qg_json_policy_name(int policy)
{
    /* A plan without an explicit policy rejects. */
    static const char *const names[] = {"reject", "reject", "queue",
                                        "downgrade", "payg"};
    return policy >= 0 && policy <= QG_POLICY_PAYG ? names[policy] : "?";
}

static const char *unit_of(const qg_window_view *v, const char *unit_name)
{
    if (v->unit == QG_UNIT_REQUESTS)
        return "requests";
    return unit_name ? unit_name : "weight points";
}

/* ------------------------------------------------------------- windows */

json_t *qg_json_window(const qg_window_view *v, const char *unit_name)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (json_object_set_new(o, "name", str_or_null(v->name)) ||
        json_object_set_new(o, "scope",
                            json_string(v->org ? "org" : "member")) ||
        json_object_set_new(o, "type",
                            json_string(qg_json_win_type_name(v->type))) ||
        json_object_set_new(o, "unit", json_string(unit_of(v, unit_name))) ||
        json_object_set_new(o, "limit", qg_json_milli(v->limit_milli)) ||
        json_object_set_new(o, "used", qg_json_milli(v->used_milli)) ||
        json_object_set_new(o, "remaining",
                            qg_json_milli(v->remaining_milli)) ||
        json_object_set_new(o, "reset_at", qg_json_time(v->reset_at_ms))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *windows_array(const qg_decision *d, const char *unit_name)
{
    json_t *a = json_array();
    for (int i = 0; a && i < d->nviews; i++)
        if (json_array_append_new(a, qg_json_window(&d->views[i],
                                                    unit_name))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* One recovery step; window name included when name is non-NULL. */
static json_t *recovery_point(const char *name, const qg_recovery_point *p,
                              int64_t now_ms)
{
    json_t *o = json_object();
    int64_t in = p->at_ms > now_ms ? p->at_ms - now_ms : 0;
    if (!o)
        return NULL;
    if ((name && json_object_set_new(o, "window", json_string(name))) ||
        json_object_set_new(o, "at", qg_json_time(p->at_ms)) ||
        json_object_set_new(o, "in_s", qg_json_milli(in)) ||
        json_object_set_new(o, "remaining",
                            qg_json_milli(p->remaining_milli))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Recovery steps of view i (all views when i < 0, each named). */
static json_t *recovers_array(const qg_decision *d, int only, int64_t now_ms)
{
    json_t *a = json_array();
    for (int i = 0; a && i < d->nviews; i++) {
        if (only >= 0 && i != only)
            continue;
        int n = d->nrecovery[i];
        if (n > QG_MAX_RECOVERY)
            n = QG_MAX_RECOVERY;
        for (int k = 0; k < n; k++)
            if (json_array_append_new(
                    a, recovery_point(only >= 0 ? NULL : d->views[i].name,
                                      &d->recovery[i][k], now_ms))) {
                json_decref(a);
                return NULL;
            }
    }
    return a;
}

/* --------------------------------------------------------------- check */

static int set_names(json_t *o, const qg_decision *d)
{
    if (json_object_set_new(o, "plan", str_or_null(d->plan)))
        return -1;
    if (d->org && json_object_set_new(o, "org", json_string(d->org)))
        return -1;
    if (d->model && json_object_set_new(o, "model", json_string(d->model)))
        return -1;
    if (json_object_set_new(o, "rules_version",
                            str_or_null(d->rules_version)) ||
        json_object_set_new(o, "weights_version",
                            str_or_null(d->weights_version)))
        return -1;
    return 0;
}

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

/* The refusal's plain sentence, in the words pricing and the console use. */
static void refusal_message(const qg_decision *d, int b, const char *unit,
                            char *buf, size_t cap)
{
    char used[32], limit[32], weight[32], at[40];
    qg_fixed_format(d->weight_milli, 3, weight, sizeof weight);
    if (b < 0) {
        snprintf(buf, cap, "request refused: this request (%s) does not fit",
                 weight);
        return;
    }
    const qg_window_view *v = &d->views[b];
    const char *u = unit_of(v, unit);
    qg_fixed_format(v->used_milli, 3, used, sizeof used);
    qg_fixed_format(v->limit_milli, 3, limit, sizeof limit);
    if (d->outcome == QG_REJECT_NEVER) {
        snprintf(buf, cap,
                 "this request (%s %s) exceeds the %s limit of %s %s on "
                 "plan %s: it can never be admitted",
                 weight, unit ? unit : "weight points", v->name, limit, u,
                 d->plan ? d->plan : "?");
        return;
    }
    qg_iso8601_format(d->decided_at_ms + d->retry_after_ms, at,
                      (int)sizeof at);
    /* A request-unit window counts this request as one request: its
     * weight would be a number in another unit, so it is left out. */
    if (v->unit == QG_UNIT_REQUESTS)
        snprintf(buf, cap,
                 "%s limit reached: %s of %s %s %s; this request fits "
                 "again at %s",
                 v->name, used, limit, u,
                 v->type == QG_WIN_CONCURRENCY ? "in flight" : "used", at);
    else
        snprintf(buf, cap,
                 "%s limit reached: %s of %s %s used; this request (%s) "
                 "fits again at %s",
                 v->name, used, limit, u, weight, at);
}

char *qg_json_check(const qg_decision *d, const char *request_id,
                    const char *unit_name)
{
    json_t *o = json_object();
    int refused = d->outcome == QG_REJECT || d->outcome == QG_REJECT_NEVER;
    char msg[512];

    if (!o)
        return NULL;
    if (json_object_set_new(o, "decision",
                            json_string(refused ? "reject" : "allow")) ||
        json_object_set_new(o, "request_id", str_or_null(request_id)) ||
        json_object_set_new(o, "weight", qg_json_milli(d->weight_milli)) ||
        set_names(o, d) < 0)
        goto fail;
    if (!refused) {
        if (json_object_set_new(o, "replayed", json_boolean(d->replayed)))
            goto fail;
    } else {
        int b = refusing_view(d);
        int never = d->outcome == QG_REJECT_NEVER;
        json_t *err = json_object();
        refusal_message(d, b, unit_name, msg, sizeof msg);
        if (json_object_set_new(o, "error", err) ||
            json_object_set_new(err, "type",
                                json_string(never ? "request_too_large_for_plan"
                                                  : "quota_exceeded")) ||
            json_object_set_new(err, "window",
                                str_or_null(b >= 0 ? d->views[b].name
                                                   : NULL)) ||
            json_object_set_new(err, "message", json_string(msg)) ||
            json_object_set_new(o, "retryable", json_boolean(!never)))
            goto fail;
        if (!never &&
            json_object_set_new(o, "retry_after_s",
                                qg_json_milli(d->retry_after_ms > 0
                                                  ? d->retry_after_ms
                                                  : 0)))
            goto fail;
        if (json_object_set_new(o, "recovers",
                                recovers_array(d, -1, d->decided_at_ms)))
            goto fail;
    }
    if (json_object_set_new(o, "windows", windows_array(d, unit_name)))
        goto fail;
    return qg_json_dump_steal(o);
fail:
    json_decref(o);
    return NULL;
}

/* -------------------------------------------------------------- settle */

char *qg_json_settle(const qg_settle_result *s, const char *request_id)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (json_object_set_new(o, "request_id", str_or_null(request_id)) ||
        json_object_set_new(o, "status",
                            json_string(qg_json_settle_status_name(
                                s->status))) ||
        json_object_set_new(o, "reserved", qg_json_milli(s->reserved_milli)) ||
        json_object_set_new(o, "actual", qg_json_milli(s->actual_milli)) ||
        json_object_set_new(o, "charged", qg_json_milli(s->charged_milli)) ||
        json_object_set_new(o, "late", json_boolean(s->late)) ||
        json_object_set_new(o, "replayed", json_boolean(s->replayed))) {
        json_decref(o);
        return NULL;
    }
    return qg_json_dump_steal(o);
}

/* --------------------------------------------------------------- usage */

static json_t *forecast_of(const qg_decision *d, int i)
{
    const qg_window_view *v = &d->views[i];
    int n = d->nrecovery[i] > QG_MAX_RECOVERY ? QG_MAX_RECOVERY
                                              : d->nrecovery[i];
    json_t *next = json_null();
    int64_t full_at = 0;

    /* The schedule's last step is the full recovery when it reaches the
     * limit (rolling schedules keep it even when truncated). */
    if (v->used_milli > 0 && n > 0 &&
        d->recovery[i][n - 1].remaining_milli >= v->limit_milli)
        full_at = d->recovery[i][n - 1].at_ms;
    if (n > 0) {
        json_decref(next);
        next = json_pack("{s:o,s:o}", "at",
                         qg_json_time(d->recovery[i][0].at_ms), "remaining",
                         qg_json_milli(d->recovery[i][0].remaining_milli));
    }
    /* json_pack steals the "o" references, also when it fails. */
    return json_pack("{s:o,s:o,s:o}", "name", str_or_null(v->name),
                     "full_at", qg_json_time(full_at), "next_recovery", next);
}

char *qg_json_usage(const qg_decision *d, const char *subject,
                    int64_t now_ms, const char *unit_name)
{
    json_t *o = json_object(), *wins = json_array(), *fc = json_array();

    if (json_object_set_new(o, "subject", str_or_null(subject)) ||
        json_object_set_new(o, "plan", str_or_null(d->plan)) ||
        json_object_set_new(o, "org", str_or_null(d->org)) ||
        json_object_set_new(o, "rules_version",
                            str_or_null(d->rules_version)) ||
        json_object_set_new(o, "unit",
                            json_string(unit_name ? unit_name
                                                  : "weight points")) ||
        json_object_set_new(o, "windows", json_incref(wins)) ||
        json_object_set_new(o, "forecast", json_incref(fc)))
        goto fail;
    for (int i = 0; i < d->nviews; i++) {
        json_t *w = qg_json_window(&d->views[i], unit_name);
        if (json_array_append_new(wins, w) ||
            json_object_set_new(w, "recovers", recovers_array(d, i, now_ms)) ||
            json_array_append_new(fc, forecast_of(d, i)))
            goto fail;
    }
    json_decref(wins);
    json_decref(fc);
    return qg_json_dump_steal(o);
fail:
    json_decref(wins);
    json_decref(fc);
    json_decref(o);
    return NULL;
}

/* --------------------------------------------------------------- plans */

static json_t *overage_of(const qg_rules *r, const qg_overage *ov)
{
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "policy",
                                  json_string(qg_json_policy_name(
                                      ov->policy))))
        goto fail;
    switch (ov->policy) {
    case QG_POLICY_QUEUE:
        if (json_object_set_new(o, "max_wait_s",
                                qg_json_milli(ov->max_wait_ms)) ||
            json_object_set_new(o, "queue_size",
                                json_integer(ov->queue_size)))
            goto fail;
        break;
    case QG_POLICY_DOWNGRADE:
        if (json_object_set_new(
                o, "to_model",
                str_or_null(ov->to_model >= 0 && ov->to_model < r->nmodels
                                ? r->models[ov->to_model].name
                                : NULL)))
            goto fail;
        break;
    case QG_POLICY_PAYG:
        if (json_object_set_new(o, "price_per_unit_usd",
                                qg_json_scaled(ov->price_per_unit_micro, 6)) ||
            json_object_set_new(o, "spending_cap_usd_month",
                                ov->spending_cap_micro > 0
                                    ? qg_json_scaled(ov->spending_cap_micro, 6)
                                    : json_null()))
            goto fail;
        break;
    default:
        break;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

/* The calendar's "at" as written in rules: "00:00", "MON 00:00", "1 00:00". */
static void calendar_at(const qg_calendar_spec *c, char *buf, size_t cap)
{
    static const char *const wd[] = {"MON", "TUE", "WED", "THU",
                                     "FRI", "SAT", "SUN"};
    int hh = c->minute_of_day / 60, mm = c->minute_of_day % 60;
    if (c->every == QG_EVERY_WEEK && c->weekday >= 0 && c->weekday < 7)
        snprintf(buf, cap, "%s %02d:%02d", wd[c->weekday], hh, mm);
    else if (c->every == QG_EVERY_MONTH)
        snprintf(buf, cap, "%d %02d:%02d", c->mday, hh, mm);
    else
        snprintf(buf, cap, "%02d:%02d", hh, mm);
}

static json_t *window_spec(const qg_rules *r, const qg_window_spec *w)
{
    static const char *const every[] = {"?", "day", "week", "month"};
    json_t *o = json_object();
    char at[32];
    int rc = 0;

    if (!o)
        return NULL;
    rc |= json_object_set_new(o, "name", json_string(w->name));
    rc |= json_object_set_new(o, "type",
                              json_string(qg_json_win_type_name(w->type)));
    rc |= json_object_set_new(o, "limit", qg_json_milli(w->limit_milli));
    rc |= json_object_set_new(o, "unit",
                              json_string(w->unit == QG_UNIT_REQUESTS
                                              ? "requests"
                                              : r->unit ? r->unit
                                                        : "weight points"));
    switch (w->type) {
    case QG_WIN_ROLLING:
    case QG_WIN_SESSION:
        rc |= json_object_set_new(o, "length_s", qg_json_milli(w->length_ms));
        break;
    case QG_WIN_CALENDAR:
        rc |= json_object_set_new(
            o, "every",
            json_string(w->cal.every >= 1 && w->cal.every <= 3
                            ? every[w->cal.every]
                            : "?"));
        if (w->cal.every == QG_EVERY_MONTH && w->cal.anchor_billing) {
            rc |= json_object_set_new(o, "anchor", json_string("billing"));
        } else {
            calendar_at(&w->cal, at, sizeof at);
            rc |= json_object_set_new(o, "at", json_string(at));
        }
        rc |= json_object_set_new(
            o, "tz", str_or_null(w->cal.tz ? qg_tz_name(w->cal.tz) : NULL));
        break;
    case QG_WIN_RATE:
        rc |= json_object_set_new(o, "per_s", qg_json_milli(w->length_ms));
        rc |= json_object_set_new(o, "burst", qg_json_milli(w->burst_milli));
        break;
    case QG_WIN_CONCURRENCY:
        rc |= json_object_set_new(o, "lease_ttl_s",
                                  qg_json_milli(w->lease_ttl_ms));
        break;
    }
    if (w->model_mask) {
        json_t *m = json_array();
        rc |= json_object_set_new(o, "models", m);
        for (int i = 0; m && i < r->nmodels && i < QG_MAX_MODELS; i++)
            if ((w->model_mask >> i) & 1)
                rc |= json_array_append_new(m,
                                            json_string(r->models[i].name));
    }
    if (w->overage.policy != QG_POLICY_NONE)
        rc |= json_object_set_new(o, "overage", overage_of(r, &w->overage));
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The windows of a plan or org except concurrency (given on its own). */
static json_t *specs_array(const qg_rules *r, const qg_window_spec *w, int n,
                           int64_t *concurrency)
{
    json_t *a = json_array();
    *concurrency = 0;
    for (int i = 0; a && i < n; i++) {
        if (w[i].type == QG_WIN_CONCURRENCY) {
            *concurrency = w[i].limit_milli / QG_MILLI;
            continue;
        }
        if (json_array_append_new(a, window_spec(r, &w[i]))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *plan_obj(const qg_rules *r, const qg_plan *p)
{
    json_t *o = json_object();
    int64_t conc = 0;
    int rc = 0;

    if (!o)
        return NULL;
    rc |= json_object_set_new(o, "name", json_string(p->name));
    rc |= json_object_set_new(o, "price_usd_month",
                              p->price_micro >= 0
                                  ? qg_json_scaled(p->price_micro, 6)
                                  : json_null());
    rc |= json_object_set_new(o, "windows",
                              specs_array(r, p->windows, p->nwindows, &conc));
    rc |= json_object_set_new(o, "concurrency",
                              conc > 0 ? json_integer(conc) : json_null());
    rc |= json_object_set_new(o, "overage", overage_of(r, &p->overage));
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *org_obj(const qg_rules *r, const qg_org_spec *g)
{
    json_t *o = json_object();
    int64_t conc = 0;
    int rc = 0;

    if (!o)
        return NULL;
    rc |= json_object_set_new(o, "name", json_string(g->name));
    rc |= json_object_set_new(o, "windows",
                              specs_array(r, g->windows, g->nwindows, &conc));
    rc |= json_object_set_new(o, "concurrency",
                              conc > 0 ? json_integer(conc) : json_null());
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *qg_json_plans(const qg_rules *r)
{
    json_t *o = json_object(), *plans = json_array(), *orgs = json_array();
    int rc = 0;

    rc |= json_object_set_new(o, "rules_version", str_or_null(r->version));
    rc |= json_object_set_new(o, "weights_version",
                              str_or_null(r->weights_version));
    rc |= json_object_set_new(o, "unit",
                              json_string(r->unit ? r->unit : "weight points"));
    rc |= json_object_set_new(o, "plans", plans);
    rc |= json_object_set_new(o, "orgs", orgs);
    for (int i = 0; !rc && i < r->nplans; i++)
        rc |= json_array_append_new(plans, plan_obj(r, &r->plans[i]));
    for (int i = 0; !rc && i < r->norgs; i++)
        rc |= json_array_append_new(orgs, org_obj(r, &r->orgs[i]));
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return qg_json_dump_steal(o);
}

/* A calibration instant: its date when at midnight UTC, as rules write
 * it, else the full ISO 8601 time. */
static json_t *date_of(int64_t ms)
{
    char buf[40];
    if (ms == 0)
        return json_null();
    qg_iso8601_format(ms, buf, (int)sizeof buf);
    if (ms % QG_MS_PER_DAY == 0)
        buf[10] = '\0';
    return json_string(buf);
}

char *qg_json_weights(const qg_rules *r)
{
    json_t *o = json_object(), *models = json_array();
    int rc = 0;

    rc |= json_object_set_new(o, "version", str_or_null(r->weights_version));
    rc |= json_object_set_new(o, "calibrated", date_of(r->calibrated_ms));
    rc |= json_object_set_new(o, "unit",
                              json_string(r->unit ? r->unit : "weight points"));
    rc |= json_object_set_new(o, "models", models);
    for (int i = 0; !rc && i < r->nmodels; i++) {
        const qg_model *m = &r->models[i];
        json_t *e = json_object();
        rc |= json_array_append_new(models, e);
        if (rc)
            break;
        rc |= json_object_set_new(e, "name", json_string(m->name));
        rc |= json_object_set_new(e, "per_request",
                                  qg_json_milli(m->per_request_milli));
        rc |= json_object_set_new(e, "input_per_1k",
                                  qg_json_scaled(m->input_per_1k_micro, 6));
        rc |= json_object_set_new(e, "output_per_1k",
                                  qg_json_scaled(m->output_per_1k_micro, 6));
    }
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return qg_json_dump_steal(o);
}

char *qg_json_error(const char *type, const char *message)
{
    json_t *o = json_object(), *e = json_object();
    if (json_object_set_new(o, "error", e) ||
        json_object_set_new(e, "type", str_or_null(type)) ||
        json_object_set_new(e, "message", str_or_null(message))) {
        json_decref(o);
        return NULL;
    }
    return qg_json_dump_steal(o);
}
