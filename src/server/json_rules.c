/* json_rules.c - the bodies that describe the rules: /v1/plans and
 * /v1/weights (json_out.h), built as jansson trees (they are answered
 * rarely, and their shape follows the rules).  Builders take new
 * references and hand them to their parent with the *_new setters, so one
 * json_decref of the root releases everything; a failed allocation
 * anywhere yields NULL at the root.
 *
 * Each plan of /v1/plans carries its "statements" and each window its
 * "text", in the words `quotagate pricing` prints (one phrase builder,
 * phrase.c: PRODUCT.md section 8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "civil.h"
#include "fixed.h"
#include "json_out.h"
#include "json_text.h"
#include "rules_diff.h"
#include "analysis.h"
#include "phrase.h"
#include "pricing.h"
#include "tz.h"

/* A string member, or null when s is NULL. */
static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* --------------------------------------------------------------- plans */

static json_t *overage_of(const qg_rules *r, const qg_overage *ov)
{
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "policy",
                                  json_string(qg__json_policy_name(
                                      ov->policy))))
        goto fail;
    switch (ov->policy) {
    case QG_POLICY_QUEUE:
        if (json_object_set_new(o, "max_wait_s",
                                qg__json_milli(ov->max_wait_ms)) ||
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
                                qg__json_scaled(ov->price_per_unit_micro, 6)) ||
            json_object_set_new(o, "spending_cap_usd_month",
                                ov->spending_cap_micro > 0
                                    ? qg__json_scaled(ov->spending_cap_micro, 6)
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
    char text[512];
    rc |= json_object_set_new(o, "name", json_string(w->name));
    rc |= json_object_set_new(o, "type",
                              json_string(qg__json_win_type_name(w->type)));
    /* the window in pricing's words (phrase.c) */
    if (qg__phrase_window(r, w, text, sizeof text) >= 0)
        rc |= json_object_set_new(o, "text", json_string(text));
    rc |= json_object_set_new(o, "limit", qg__json_milli(w->limit_milli));
    rc |= json_object_set_new(o, "unit",
                              json_string(w->unit == QG_UNIT_REQUESTS
                                              ? "requests"
                                              : r->unit ? r->unit
                                                        : "weight points"));
    switch (w->type) {
    case QG_WIN_ROLLING:
    case QG_WIN_SESSION:
        rc |= json_object_set_new(o, "length_s", qg__json_milli(w->length_ms));
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
            o, "tz", str_or_null(w->cal.tz ? qg__tz_name(w->cal.tz) : NULL));
        break;
    case QG_WIN_RATE:
        rc |= json_object_set_new(o, "per_s", qg__json_milli(w->length_ms));
        rc |= json_object_set_new(o, "burst", qg__json_milli(w->burst_milli));
        break;
    case QG_WIN_CONCURRENCY:
        rc |= json_object_set_new(o, "lease_ttl_s",
                                  qg__json_milli(w->lease_ttl_ms));
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

/* name, windows and concurrency of a plan or an org; 0 or -1 (o keeps
 * what was set: the caller releases it). */
static int windows_members(json_t *o, const qg_rules *r, const char *name,
                           const qg_window_spec *w, int n)
{
    int64_t conc = 0;
    int rc = json_object_set_new(o, "name", json_string(name));
    rc |= json_object_set_new(o, "windows", specs_array(r, w, n, &conc));
    rc |= json_object_set_new(o, "concurrency",
                              conc > 0 ? json_integer(conc) : json_null());
    return rc ? -1 : 0;
}

static json_t *plan_obj(const qg_rules *r, const qg_plan *p,
                        const qg_analysis *a)
{
    json_t *o = json_object();
    int rc;
    if (!o)
        return NULL;
    rc = windows_members(o, r, p->name, p->windows, p->nwindows);
    /* the plan's statements exactly as `quotagate pricing` words them
     * (the console shows these) */
    rc |= json_object_set_new(o, "statements",
                              a ? qg__pricing_statements(r, a, p->index)
                                : json_array());
    rc |= json_object_set_new(o, "price_usd_month",
                              p->price_micro >= 0
                                  ? qg__json_scaled(p->price_micro, 6)
                                  : json_null());
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
    if (!o)
        return NULL;
    if (windows_members(o, r, g->name, g->windows, g->nwindows) < 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ------------------------------------------------------------ upcoming */

static json_t *instant_or_null(int64_t ms)
{
    char buf[40];
    if (ms <= 0)
        return json_null();
    qg_iso8601_format(ms, buf, (int)sizeof buf);
    return json_string(buf);
}

/* The versions of `chain` that take effect after `now`, each with its
 * differences from the version before it (rules_diff.c); with plan set
 * (a member's plan and org), only the differences that touch it, and only
 * the versions that have some.  NULL on out of memory. */
static json_t *upcoming_of(const qg_rules *chain, int64_t now,
                           const char *plan, const char *org)
{
    json_t *arr = json_array();
    const qg_rules *prev = qg_rules_at(chain, now), *v;
    for (v = prev ? prev->next : chain; arr && v; prev = v, v = v->next) {
        qg_rules_change *ch = NULL;
        json_t *e, *diffs = json_array();
        int n = 0, rc = 0;
        if (!diffs || (prev && qg__rules_diff(prev, v, &ch, &n) != QG_OK)) {
            json_decref(diffs);
            goto fail;
        }
        for (int i = 0; i < n && !rc; i++) {
            const qg_rules_change *c = &ch[i];
            int model = !c->plan[0] && !c->org[0];
            if (plan && !qg__rules_change_touches(c, plan, org))
                continue;
            rc |= json_array_append_new(diffs, json_pack(
                "{s:s, s:s?, s:s?, s:s?, s:s?, s:s, s:s, s:b}", "kind",
                c->kind, "plan", c->plan[0] ? c->plan : NULL, "org",
                c->org[0] ? c->org : NULL, "window",
                !model && c->item[0] ? c->item : NULL, "model",
                model ? c->item : NULL, "from", c->from, "to", c->to,
                "less", c->less));
        }
        free(ch);
        if (plan && !rc && json_array_size(diffs) == 0) {
            json_decref(diffs);
            continue;
        }
        e = json_pack("{s:s, s:o, s:o, s:o, s:o}", "version", v->version,
                      "announced", instant_or_null(v->announced_ms),
                      "effective", instant_or_null(v->effective_ms),
                      "changes", str_or_null(v->changes), "differences",
                      diffs);
        if (rc || !e || json_array_append_new(arr, e)) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}

char *qg__json_usage_upcoming(char *body, const qg_rules *chain, int64_t now,
                              const char *plan, const char *org)
{
    const qg_rules *v = qg_rules_at(chain, now);
    json_t *o, *up;
    if (!body || !(v ? v->next : chain))
        return body;             /* nothing upcoming: the body as it is */
    if (!(o = json_loads(body, 0, NULL)) ||
        !(up = upcoming_of(chain, now, plan, org)) ||
        json_object_set_new(o, "upcoming_changes", up)) {
        json_decref(o);
        free(body);
        return NULL;
    }
    free(body);
    return qg__json_dump_steal(o);
}

char *qg__json_plans(const qg_rules *chain, int64_t now)
{
    json_t *o = json_object(), *plans = json_array(), *orgs = json_array();
    qg_analyze_opts ao = {NULL, 0, 0, NULL, NULL};   /* analytic only */
    qg_analysis *a = NULL;
    char err[256];
    const qg_rules *r = qg_rules_at(chain, now);
    int rc = 0;

    if (!r)
        r = chain;               /* none in force yet: the first */
    if (qg__analyze(r, &ao, &a, err, sizeof err) != QG_OK)
        a = NULL;                    /* no baseline: no statements */
    rc |= json_object_set_new(o, "effective", instant_or_null(r->effective_ms));
    rc |= json_object_set_new(o, "announced", instant_or_null(r->announced_ms));
    rc |= json_object_set_new(o, "changes", str_or_null(r->changes));
    rc |= json_object_set_new(o, "upcoming", upcoming_of(chain, now, NULL,
                                                         NULL));
    rc |= json_object_set_new(o, "rules_version", str_or_null(r->version));
    if (a)
        rc |= json_object_set_new(o, "baseline",
                                  json_string(r->plans[a->baseline].name));
    rc |= json_object_set_new(o, "weights_version",
                              str_or_null(r->weights_version));
    rc |= json_object_set_new(o, "unit",
                              json_string(r->unit ? r->unit : "weight points"));
    rc |= json_object_set_new(o, "plans", plans);
    rc |= json_object_set_new(o, "orgs", orgs);
    for (int i = 0; !rc && i < r->nplans; i++)
        rc |= json_array_append_new(plans, plan_obj(r, &r->plans[i], a));
    for (int i = 0; !rc && i < r->norgs; i++)
        rc |= json_array_append_new(orgs, org_obj(r, &r->orgs[i]));
    qg__analysis_free(a);
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return qg__json_dump_steal(o);
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

char *qg__json_weights(const qg_rules *r)
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
                                  qg__json_milli(m->per_request_milli));
        rc |= json_object_set_new(e, "input_per_1k",
                                  qg__json_scaled(m->input_per_1k_micro, 6));
        rc |= json_object_set_new(e, "output_per_1k",
                                  qg__json_scaled(m->output_per_1k_micro, 6));
    }
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return qg__json_dump_steal(o);
}

