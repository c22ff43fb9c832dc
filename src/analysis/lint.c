/* lint.c - the pre-release checklist that the rules themselves can prove.
 *
 * Each check is one function in a table; each produces findings (a stable
 * code, the plan and window concerned, a message).  The checks: every plan
 * sets every dimension (a short window, a period total, concurrency);
 * multipliers are derivable (a window shared with the baseline); every
 * claim names its unit, matches the window's unit, is redeemable by the
 * window ratio and, when above the effective multiplier, is published with
 * it; weights were calibrated after every model last changed; a change
 * that gives a subject less (rules_diff.c), from one version of the file
 * to the next or from --previous to the first, is announced at least
 * `notice` before it takes effect (change-without-notice); notifications
 * go to https and reach every plan.  Every version is checked; each
 * finding names its version.  No
 * printing: the CLI renders the findings. */
#include "analysis.h"
#include "phrase.h"
#include "rules.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "civil.h"
#include "crossing.h"
#include "duration.h"
#include "fixed.h"
#include "rules_diff.h"

typedef struct lint_ctx {
    const qg_rules *r, *prev;
    const qg_analysis *a;     /* NULL when the analysis failed */
    qg_lint_result *res;
    int cap;
    int oom;
} lint_ctx;

static void add(lint_ctx *c, const char *code, const char *plan,
                const char *window, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void add(lint_ctx *c, const char *code, const char *plan,
                const char *window, const char *fmt, ...)
{
    qg_finding *f;
    va_list ap;

    if (c->res->nfindings == c->cap) {
        int ncap = c->cap ? c->cap * 2 : 16;
        qg_finding *nf = realloc(c->res->findings, (size_t)ncap * sizeof *nf);
        if (!nf) {
            c->oom = 1;
            return;
        }
        c->res->findings = nf;
        c->cap = ncap;
    }
    f = &c->res->findings[c->res->nfindings++];
    memset(f, 0, sizeof *f);
    f->code = code;
    snprintf(f->plan, sizeof f->plan, "%s", plan ? plan : "");
    snprintf(f->window, sizeof f->window, "%s", window ? window : "");
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof f->message, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------ dimensions */

static int is_short(const qg_window_spec *w)
{
    if (w->type == QG_WIN_CALENDAR)
        return w->cal.every == QG_EVERY_DAY;
    return (w->type == QG_WIN_ROLLING || w->type == QG_WIN_SESSION ||
            w->type == QG_WIN_RATE) && w->length_ms <= QG_MS_PER_DAY;
}

static int is_period_total(const qg_window_spec *w)
{
    if (w->type == QG_WIN_CALENDAR)
        return w->cal.every == QG_EVERY_WEEK || w->cal.every == QG_EVERY_MONTH;
    return (w->type == QG_WIN_ROLLING || w->type == QG_WIN_SESSION) &&
           w->length_ms >= 7 * QG_MS_PER_DAY;
}

static int is_concurrency(const qg_window_spec *w)
{
    return w->type == QG_WIN_CONCURRENCY;
}

/* The dimensions every plan must set explicitly. */
static const struct dimension {
    const char *code;
    int (*has)(const qg_window_spec *);
    const char *what;
} dimensions[] = {
    { "missing-short-window", is_short,
      "has no short window (rolling, session or rate of at most 1d, or a "
      "daily calendar window)" },
    { "missing-period-total", is_period_total,
      "has no period total (a weekly or monthly calendar window, or a "
      "rolling or session window of at least 7d)" },
    { "missing-concurrency", is_concurrency,
      "has no concurrency limit (concurrency: N)" },
};

static void check_dimensions(lint_ctx *c)
{
    size_t d;
    int i, j, found;
    for (i = 0; i < c->r->nplans; i++) {
        const qg_plan *p = &c->r->plans[i];
        for (d = 0; d < sizeof dimensions / sizeof dimensions[0]; d++) {
            for (j = 0, found = 0; j < p->nwindows && !found; j++)
                found = dimensions[d].has(&p->windows[j]);
            if (!found)
                add(c, dimensions[d].code, p->name, NULL, "%s",
                    dimensions[d].what);
        }
    }
}

/* ------------------------------------------------------ multipliers */

static void check_derivable(lint_ctx *c)
{
    int i;
    if (!c->a)
        return;
    for (i = 0; i < c->a->nplans; i++)
        if (i != c->a->baseline && c->a->plans[i].min_ratio_milli < 0)
            add(c, "multiplier-not-derivable", c->a->plans[i].name, NULL,
                "shares no window name with the baseline plan %s, so no "
                "multiplier can be derived", c->r->plans[c->a->baseline].name);
}

/* ----------------------------------------------------------- claims */

/* A claim above the effective multiplier, published without it. */
static void disclosure(lint_ctx *c, const qg_plan *p, const qg_claim *cl,
                       const qg_an_claim *ac, const char *m)
{
    const qg_an_plan *ap = &c->a->plans[p->index];
    char eff[32], per[32];
    qg_fixed_format(ac->effective_milli, 3, eff, sizeof eff);
    qg_duration_format(c->a->period_ms, per, sizeof per);
    add(c, "claim-needs-disclosure", p->name, cl->window,
        "claim %sx on %s (line %d) exceeds the effective %sx vs %s over %s "
        "(binding: %s) and must be published together with it; set "
        "disclose_effective: true once the page shows it", m, cl->window,
        cl->line, eff, ac->vs, per,
        ap->binding >= 0 ? ap->windows[ap->binding].name : "none");
}

static void check_claims(lint_ctx *c)
{
    int i, j;
    char m[32];
    for (i = 0; i < c->r->nplans; i++) {
        const qg_plan *p = &c->r->plans[i];
        for (j = 0; j < p->nclaims; j++) {
            const qg_claim *cl = &p->claims[j];
            const qg_window_spec *w = qg__plan_find_window(p, cl->window);
            const qg_an_claim *ac =
                c->a && j < c->a->plans[i].nclaims ? &c->a->plans[i].claims[j]
                                                   : NULL;
            const char *wunit = w && w->unit == QG_UNIT_REQUESTS ? "requests"
                                                                  : c->r->unit;
            qg_fixed_format(cl->multiplier_milli, 3, m, sizeof m);
            if (!cl->window || !*cl->window)
                add(c, "claim-no-window", p->name, NULL,
                    "claim %sx (line %d) names no window", m, cl->line);
            if (!cl->unit)
                add(c, "claim-no-unit", p->name, cl->window,
                    "claim %sx on %s (line %d) names no unit (the window "
                    "counts %s)", m, cl->window, cl->line, wunit);
            else if (w && strcmp(cl->unit, wunit) != 0)
                add(c, "claim-unit-mismatch", p->name, cl->window,
                    "claim %sx on %s (line %d) is in \"%s\" but the window "
                    "counts %s", m, cl->window, cl->line, cl->unit, wunit);
            if (ac && !ac->ok)
                add(c, "claim-not-redeemable", p->name, cl->window,
                    "claim %s (line %d)", ac->message, cl->line);
            if (ac && ac->needs_disclosure)
                disclosure(c, p, cl, ac, m);
            /* pricing prints every claim in the phrase builder's words
             * (phrase.c): one it cannot word would go missing there */
            {
                char text[512];
                const qg_plan *vs = &c->r->plans[cl->vs_plan];
                if (qg__phrase_claim(c->r, cl->multiplier_milli, vs->name, w,
                                     qg__plan_find_window(vs, cl->window),
                                     text, sizeof text) < 0)
                    add(c, "claim-unprintable", p->name, cl->window,
                        "claim %sx on %s (line %d): pricing cannot state it "
                        "(the window must exist in %s and %s)", m,
                        cl->window ? cl->window : "(none)", cl->line, p->name,
                        vs->name);
            }
        }
    }
}

/* ---------------------------------------------------------- weights */

static void check_weights(lint_ctx *c)
{
    char cal[40], chg[40];
    int i;
    if (c->r->calibrated_ms <= 0) {
        add(c, "weights-uncalibrated", NULL, NULL,
            "weights %s carry no calibrated date",
            c->r->weights_version ? c->r->weights_version : "");
        return;
    }
    qg_iso8601_format(c->r->calibrated_ms, cal, sizeof cal);
    for (i = 0; i < c->r->nmodels; i++) {
        const qg_model *m = &c->r->models[i];
        if (m->changed_ms <= c->r->calibrated_ms)
            continue;
        qg_iso8601_format(m->changed_ms, chg, sizeof chg);
        add(c, "weights-stale", NULL, NULL,
            "model %s changed %s, after the weights were calibrated %s",
            m->name, chg, cal);
    }
}

/* ------------------------------------------- change without notice */

/* Every change from the version before (c->prev) to c->r that gives a
 * subject less (rules_diff.c) needs r announced at least its notice
 * before it takes effect. */
static void check_notice(lint_ctx *c)
{
    const qg_rules *r = c->r;
    qg_rules_change *ch = NULL;
    char ann[40], eff[40], need[32], owner[QG_NAME_MAX + 8];
    int n = 0;

    if (!c->prev || qg__rules_notice_ok(r))
        return;
    if (qg__rules_diff(c->prev, r, &ch, &n) != QG_OK) {
        c->oom = 1;
        return;
    }
    snprintf(ann, sizeof ann, "unset");
    snprintf(eff, sizeof eff, "unset");
    if (r->announced_ms > 0)
        qg_iso8601_format(r->announced_ms, ann, sizeof ann);
    if (r->effective_ms > 0)
        qg_iso8601_format(r->effective_ms, eff, sizeof eff);
    qg_duration_format(r->notice_ms, need, sizeof need);
    for (int i = 0; i < n; i++) {
        const qg_rules_change *x = &ch[i];
        if (!x->less)
            continue;
        if (x->org[0])
            snprintf(owner, sizeof owner, "org %s: ", x->org);
        else
            owner[0] = '\0';
        add(c, "change-without-notice", x->plan[0] ? x->plan : NULL,
            x->item[0] ? x->item : NULL,
            "%s%s%s%s: %s -> %s gives less; it needs announcing at least %s "
            "before it takes effect (version %s after %s; announced: %s, "
            "effective: %s)",
            owner, x->kind, x->item[0] ? " " : "", x->item, x->from, x->to,
            need, r->version, c->prev->version, ann, eff);
    }
    free(ch);
}

/* ------------------------------------------------------------- run */

/* ------------------------------------------------------------ payg */

/* payg without a cap bills without bound; payg on a plan (or window) that
 * lifts no window is a policy that can never apply (docs/decisions.md). */
static void check_payg(lint_ctx *c)
{
    for (int i = 0; i < c->r->nplans; i++) {
        const qg_plan *p = &c->r->plans[i];
        int plan_payg = p->overage.policy == QG_POLICY_PAYG;
        if (plan_payg && p->overage.spending_cap_micro == 0)
            add(c, "payg-without-cap", p->name, NULL, "overage is payg "
                "without a spending_cap: a member's overage per month is "
                "unbounded");
        if (plan_payg && p->payg_mask == 0)
            add(c, "payg-lifts-nothing", p->name, NULL, "overage is payg, "
                "but no window of the plan can be exceeded (payg lifts "
                "rolling, calendar and session windows in weight units "
                "only)");
        for (int k = 0; k < p->nwindows && k < 32; k++) {
            const qg_window_spec *w = &p->windows[k];
            if (w->overage.policy != QG_POLICY_PAYG)
                continue;
            if (!((p->payg_mask >> k) & 1u))
                add(c, "payg-lifts-nothing", p->name, w->name, "window %s "
                    "has a payg policy but payg cannot lift a %s window",
                    w->name, w->unit == QG_UNIT_REQUESTS
                                 ? "request-count" : "rate");
            else if (w->overage.spending_cap_micro == 0)
                add(c, "payg-without-cap", p->name, w->name, "window %s's "
                    "payg has no spending_cap: a member's overage per month "
                    "is unbounded", w->name);
        }
    }
}

/* ---------------------------------------------------- notifications */

/* A webhook over plain http carries every subject's usage in clear text
 * (the signature still authenticates it); a plan with no calendar,
 * rolling or session window is never notified (crossing.h). */
static void check_notify(lint_ctx *c)
{
    const qg_notify_spec *ns = &c->r->notify;
    if (ns->nwebhooks == 0)
        return;
    for (int i = 0; i < ns->nwebhooks; i++)
        if (strncasecmp(ns->webhooks[i].url, "http://", 7) == 0)
            add(c, "notify-plain-http", NULL, NULL, "webhook %s is plain "
                "http: its events (subjects' usage) travel unencrypted; "
                "use https", ns->webhooks[i].url);
    for (int i = 0; i < c->r->nplans; i++) {
        const qg_plan *p = &c->r->plans[i];
        int any = 0;
        for (int k = 0; k < p->nwindows; k++)
            any |= qg__crossing_applies(p->windows[k].type);
        if (!any)
            add(c, "notify-no-window", p->name, NULL, "notifications are "
                "on, but the plan has no calendar, rolling or session "
                "window: its members are never notified");
    }
}

static void (*const checks[])(lint_ctx *) = {
    check_dimensions, check_derivable, check_claims, check_weights,
    check_notice, check_payg, check_notify,
};

int qg__lint(const qg_rules *r, const qg_rules *previous, qg_lint_result *out,
            char *err, size_t errcap)
{
    qg_analyze_opts o = { NULL, 0, 0, NULL, NULL };
    lint_ctx c;
    char why[512];
    const qg_rules *v;
    size_t i;

    memset(out, 0, sizeof *out);
    memset(&c, 0, sizeof c);
    c.res = out;
    /* Every version of the file, each against the one before it (the
     * first against --previous, the rules in force now, when given). */
    for (v = r; v && !c.oom; v = v->next) {
        qg_analysis *a = NULL;
        int first = out->nfindings;
        c.r = v;
        c.prev = v == r ? previous : c.prev;
        if (qg__analyze(v, &o, &a, why, sizeof why) != QG_OK)
            add(&c, "analysis-failed", NULL, NULL, "%s", why);
        c.a = a;
        for (i = 0; i < sizeof checks / sizeof checks[0] && !c.oom; i++)
            checks[i](&c);
        qg__analysis_free(a);
        for (int k = first; k < out->nfindings; k++)
            snprintf(out->findings[k].version,
                     sizeof out->findings[k].version, "%s", v->version);
        c.prev = v;
    }
    if (!c.oom)
        return QG_OK;
    snprintf(err, errcap, "out of memory");
    qg__lint_free(out);
    return QG_ENOMEM;
}

void qg__lint_free(qg_lint_result *res)
{
    if (!res)
        return;
    free(res->findings);
    res->findings = NULL;
    res->nfindings = 0;
}
