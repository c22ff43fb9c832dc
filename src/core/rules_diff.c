/* rules_diff.c - what changes from one rules version to the next
 * (PRODUCT.md 8), computed from the compiled rules, never from the
 * `changes` text.
 *
 * One list serves two readers: lint's change-without-notice (every change
 * marked `less`, one that gives a subject less, needs the notice period)
 * and the differences per plan that /v1/plans and /v1/usage show.  A
 * change gives less when a limit, rate, burst or concurrency is lower, a
 * window spreads its limit over a longer length (or a calendar window over
 * a longer period), a window appears where there was none or changes
 * type, a model's weight coefficients rise, or a plan or model is
 * removed.  Raised limits, removed windows and new plans or models are
 * listed too, as not less.  No I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rules.h"
#include "rules_diff.h"

typedef struct diff_ctx {
    qg_rules_change *v;
    int n, cap;
    int oom;
} diff_ctx;

static qg_rules_change *push(diff_ctx *d, const char *kind, int less,
                             const char *plan, const char *org,
                             const char *item)
{
    qg_rules_change *c;
    if (d->oom)
        return NULL;
    if (d->n == d->cap) {
        int ncap = d->cap ? d->cap * 2 : 8;
        qg_rules_change *nv;
        if (ncap > QG_RULES_CHANGES_MAX ||
            !(nv = realloc(d->v, (size_t)ncap * sizeof *nv))) {
            d->oom = 1;
            return NULL;
        }
        d->v = nv;
        d->cap = ncap;
    }
    c = &d->v[d->n++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->less = less;
    snprintf(c->plan, sizeof c->plan, "%s", plan ? plan : "");
    snprintf(c->org, sizeof c->org, "%s", org ? org : "");
    snprintf(c->item, sizeof c->item, "%s", item ? item : "");
    return c;
}

static void amount(const qg_rules *r, const qg_window_spec *w, int64_t milli,
                   char *buf, size_t cap)
{
    char num[40];
    qg_fixed_format(milli, 3, num, sizeof num);
    snprintf(buf, cap, "%s %s", num,
             w->type == QG_WIN_CONCURRENCY ? "slots"
             : w->unit == QG_UNIT_REQUESTS ? "requests" : r->unit);
}

static const char *type_name(qg_win_type t)
{
    switch (t) {
    case QG_WIN_ROLLING: return "rolling";
    case QG_WIN_CALENDAR: return "calendar";
    case QG_WIN_SESSION: return "session";
    case QG_WIN_RATE: return "rate";
    case QG_WIN_CONCURRENCY: return "concurrency";
    }
    return "?";
}

static const char *every_name(qg_every e)
{
    return e == QG_EVERY_DAY ? "day" : e == QG_EVERY_WEEK ? "week" : "month";
}

/* The changes of one window that exists in both versions. */
static void diff_window(diff_ctx *d, const qg_rules *now, const char *plan,
                        const char *org, const qg_window_spec *was,
                        const qg_window_spec *w)
{
    qg_rules_change *c;
    if (was->type != w->type) {
        if ((c = push(d, "type", 1, plan, org, w->name))) {
            snprintf(c->from, sizeof c->from, "%s", type_name(was->type));
            snprintf(c->to, sizeof c->to, "%s", type_name(w->type));
        }
        return;                  /* its state does not carry over either */
    }
    if (was->limit_milli != w->limit_milli &&
        (c = push(d, w->type == QG_WIN_RATE          ? "rate"
                     : w->type == QG_WIN_CONCURRENCY ? "concurrency"
                                                     : "limit",
                  w->limit_milli < was->limit_milli, plan, org, w->name))) {
        amount(now, was, was->limit_milli, c->from, sizeof c->from);
        amount(now, w, w->limit_milli, c->to, sizeof c->to);
    }
    if (w->type == QG_WIN_RATE && was->burst_milli != w->burst_milli &&
        (c = push(d, "burst", w->burst_milli < was->burst_milli, plan, org,
                  w->name))) {
        amount(now, was, was->burst_milli, c->from, sizeof c->from);
        amount(now, w, w->burst_milli, c->to, sizeof c->to);
    }
    if ((w->type == QG_WIN_ROLLING || w->type == QG_WIN_SESSION ||
         w->type == QG_WIN_RATE) && was->length_ms != w->length_ms &&
        (c = push(d, "length", w->length_ms > was->length_ms, plan, org,
                  w->name))) {
        qg_duration_format(was->length_ms, c->from, sizeof c->from);
        qg_duration_format(w->length_ms, c->to, sizeof c->to);
    }
    if (w->type == QG_WIN_CALENDAR && was->cal.every != w->cal.every &&
        (c = push(d, "period", w->cal.every > was->cal.every, plan, org,
                  w->name))) {
        snprintf(c->from, sizeof c->from, "%s", every_name(was->cal.every));
        snprintf(c->to, sizeof c->to, "%s", every_name(w->cal.every));
    }
}

static void diff_windows(diff_ctx *d, const qg_rules *was_r,
                         const qg_rules *now, const char *plan,
                         const char *org, const qg_window_spec *was, int nwas,
                         const qg_window_spec *w, int nw)
{
    qg_rules_change *c;
    int i, j;
    for (i = 0; i < nw; i++) {
        for (j = 0; j < nwas && strcmp(was[j].name, w[i].name) != 0; j++)
            ;
        if (j < nwas) {
            diff_window(d, now, plan, org, &was[j], &w[i]);
        } else if ((c = push(d, "window-added", 1, plan, org, w[i].name))) {
            snprintf(c->from, sizeof c->from, "none");
            amount(now, &w[i], w[i].limit_milli, c->to, sizeof c->to);
        }
    }
    for (j = 0; j < nwas; j++) {
        for (i = 0; i < nw && strcmp(was[j].name, w[i].name) != 0; i++)
            ;
        if (i == nw &&
            (c = push(d, "window-removed", 0, plan, org, was[j].name))) {
            amount(was_r, &was[j], was[j].limit_milli, c->from,
                   sizeof c->from);
            snprintf(c->to, sizeof c->to, "none");
        }
    }
}

static void weight_text(const qg_model *m, char *buf, size_t cap)
{
    char a[32], b[32], c[32];
    qg_fixed_format(m->per_request_milli, 3, a, sizeof a);
    qg_fixed_format(m->input_per_1k_micro, 6, b, sizeof b);
    qg_fixed_format(m->output_per_1k_micro, 6, c, sizeof c);
    snprintf(buf, cap, "%s + %s/1k in + %s/1k out", a, b, c);
}

static void diff_models(diff_ctx *d, const qg_rules *was, const qg_rules *now)
{
    qg_rules_change *c;
    for (int i = 0; i < now->nmodels; i++) {
        const qg_model *m = &now->models[i];
        int k = qg_rules_find_model(was, m->name);
        const qg_model *o = k >= 0 ? &was->models[k] : NULL;
        if (!o) {
            if ((c = push(d, "model-added", 0, NULL, NULL, m->name))) {
                snprintf(c->from, sizeof c->from, "none");
                weight_text(m, c->to, sizeof c->to);
            }
            continue;
        }
        if (o->per_request_milli == m->per_request_milli &&
            o->input_per_1k_micro == m->input_per_1k_micro &&
            o->output_per_1k_micro == m->output_per_1k_micro)
            continue;
        /* costlier when any coefficient rises: some request then weighs
         * more */
        if ((c = push(d, "weight",
                      m->per_request_milli > o->per_request_milli ||
                          m->input_per_1k_micro > o->input_per_1k_micro ||
                          m->output_per_1k_micro > o->output_per_1k_micro,
                      NULL, NULL, m->name))) {
            weight_text(o, c->from, sizeof c->from);
            weight_text(m, c->to, sizeof c->to);
        }
    }
    for (int i = 0; i < was->nmodels; i++)
        if (qg_rules_find_model(now, was->models[i].name) < 0 &&
            (c = push(d, "model-removed", 1, NULL, NULL,
                      was->models[i].name))) {
            weight_text(&was->models[i], c->from, sizeof c->from);
            snprintf(c->to, sizeof c->to, "none");
        }
}

int qg__rules_diff(const qg_rules *was, const qg_rules *now,
                   qg_rules_change **out, int *nout)
{
    diff_ctx d;
    qg_rules_change *c;
    int i, k;

    memset(&d, 0, sizeof d);
    *out = NULL;
    *nout = 0;
    for (i = 0; i < now->nplans; i++) {
        const qg_plan *p = &now->plans[i];
        if ((k = qg__rules_find_plan(was, p->name)) >= 0)
            diff_windows(&d, was, now, p->name, NULL, was->plans[k].windows,
                         was->plans[k].nwindows, p->windows, p->nwindows);
        else if ((c = push(&d, "plan-added", 0, p->name, NULL, NULL))) {
            snprintf(c->from, sizeof c->from, "none");
            snprintf(c->to, sizeof c->to, "%d windows", p->nwindows);
        }
    }
    for (i = 0; i < was->nplans; i++)
        if (qg__rules_find_plan(now, was->plans[i].name) < 0 &&
            (c = push(&d, "plan-removed", 1, was->plans[i].name, NULL,
                      NULL))) {
            snprintf(c->from, sizeof c->from, "%d windows",
                     was->plans[i].nwindows);
            snprintf(c->to, sizeof c->to, "none");
        }
    for (i = 0; i < now->norgs; i++) {
        const qg_org_spec *o = &now->orgs[i];
        if ((k = qg__rules_find_org(was, o->name)) >= 0)
            diff_windows(&d, was, now, NULL, o->name, was->orgs[k].windows,
                         was->orgs[k].nwindows, o->windows, o->nwindows);
    }
    diff_models(&d, was, now);
    if (d.oom) {
        free(d.v);
        return QG_ENOMEM;
    }
    *out = d.v;
    *nout = d.n;
    return QG_OK;
}

int qg__rules_change_touches(const qg_rules_change *c, const char *plan,
                             const char *org)
{
    if (c->plan[0])
        return plan && strcmp(c->plan, plan) == 0;
    if (c->org[0])
        return org && strcmp(c->org, org) == 0;
    return 1;                    /* a model's weight touches every plan */
}

int qg__rules_notice_ok(const qg_rules *r)
{
    return r->announced_ms > 0 && r->effective_ms > 0 &&
           r->effective_ms - r->announced_ms >= r->notice_ms;
}
