/* lint.c - the pre-release checklist that the rules themselves can prove.
 *
 * Each check is one function in a table; each produces findings (a stable
 * code, the plan and window concerned, a message).  The checks: every plan
 * sets every dimension (a short window, a period total, concurrency);
 * multipliers are derivable (a window shared with the baseline); every
 * claim names its unit, matches the window's unit, is redeemable by the
 * window ratio and, when above the effective multiplier, is published with
 * it; weights were calibrated after every model last changed; and a rule
 * change that lowers any limit is announced at least `notice` before it
 * takes effect; notifications go to https and reach every plan.  No
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

/* ---------------------------------------------------- lowered limits */

/* Why window `now` is tighter than `was` (NULL: it is not), into buf. */
static const char *tighter(const qg_rules *r, const qg_window_spec *now,
                           const qg_window_spec *was, char *buf, size_t cap)
{
    char a[32], b[32];
    const char *unit = now->unit == QG_UNIT_REQUESTS ? "requests" : r->unit;
    if (!was) {
        snprintf(buf, cap, "window %s is new (a limit where there was none)",
                 now->name);
        return buf;
    }
    if (now->limit_milli < was->limit_milli ||
        (now->type == QG_WIN_RATE && now->burst_milli < was->burst_milli)) {
        int burst = now->limit_milli >= was->limit_milli;
        qg_fixed_format(burst ? was->burst_milli : was->limit_milli, 3, a,
                        sizeof a);
        qg_fixed_format(burst ? now->burst_milli : now->limit_milli, 3, b,
                        sizeof b);
        snprintf(buf, cap, "%s %s lowered from %s to %s %s", now->name,
                 burst ? "burst" : "limit", a, b,
                 now->type == QG_WIN_CONCURRENCY ? "slots" : unit);
        return buf;
    }
    if (now->type == was->type && now->type != QG_WIN_CALENDAR &&
        now->type != QG_WIN_CONCURRENCY && now->length_ms > was->length_ms) {
        qg_duration_format(was->length_ms, a, sizeof a);
        qg_duration_format(now->length_ms, b, sizeof b);
        snprintf(buf, cap, "%s now spreads its limit over %s instead of %s",
                 now->name, b, a);
        return buf;
    }
    return NULL;
}

static void compare_windows(lint_ctx *c, const char *kind, const char *owner,
                            const qg_window_spec *now, int nnow,
                            const qg_window_spec *was, int nwas)
{
    const qg_rules *r = c->r;
    char why[200], ann[40], eff[40], need[32];
    int i, j, announced_ok;

    announced_ok = r->announced_ms > 0 && r->effective_ms > 0 &&
                   r->effective_ms - r->announced_ms >= r->notice_ms;
    if (announced_ok)
        return;
    for (i = 0; i < nnow; i++) {
        const qg_window_spec *prev = NULL;
        for (j = 0; j < nwas && !prev; j++)
            if (strcmp(was[j].name, now[i].name) == 0)
                prev = &was[j];
        if (!tighter(r, &now[i], prev, why, sizeof why))
            continue;
        snprintf(ann, sizeof ann, "unset");
        snprintf(eff, sizeof eff, "unset");
        if (r->announced_ms > 0)
            qg_iso8601_format(r->announced_ms, ann, sizeof ann);
        if (r->effective_ms > 0)
            qg_iso8601_format(r->effective_ms, eff, sizeof eff);
        qg_duration_format(r->notice_ms, need, sizeof need);
        add(c, "limit-lowered-without-notice",
            strcmp(kind, "plan") == 0 ? owner : NULL, now[i].name,
            "%s%s%s%s: a lowered limit needs announcing at least %s before "
            "it takes effect (announced: %s, effective: %s)",
            strcmp(kind, "org") == 0 ? "org " : "",
            strcmp(kind, "org") == 0 ? owner : "",
            strcmp(kind, "org") == 0 ? ": " : "", why, need, ann, eff);
    }
}

static void check_lowered(lint_ctx *c)
{
    int i, k;
    if (!c->prev)
        return;
    for (i = 0; i < c->r->nplans; i++) {
        const qg_plan *p = &c->r->plans[i];
        if ((k = qg__rules_find_plan(c->prev, p->name)) >= 0)
            compare_windows(c, "plan", p->name, p->windows, p->nwindows,
                            c->prev->plans[k].windows,
                            c->prev->plans[k].nwindows);
    }
    for (i = 0; i < c->r->norgs; i++) {
        const qg_org_spec *o = &c->r->orgs[i];
        if ((k = qg__rules_find_org(c->prev, o->name)) >= 0)
            compare_windows(c, "org", o->name, o->windows, o->nwindows,
                            c->prev->orgs[k].windows,
                            c->prev->orgs[k].nwindows);
    }
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
    check_lowered, check_payg, check_notify,
};

int qg__lint(const qg_rules *r, const qg_rules *previous, qg_lint_result *out,
            char *err, size_t errcap)
{
    qg_analyze_opts o = { NULL, 0, 0, NULL, NULL };
    qg_analysis *a = NULL;
    lint_ctx c;
    char why[512];
    size_t i;

    memset(out, 0, sizeof *out);
    memset(&c, 0, sizeof c);
    c.r = r;
    c.prev = previous;
    c.res = out;
    if (qg__analyze(r, &o, &a, why, sizeof why) != QG_OK)
        add(&c, "analysis-failed", NULL, NULL, "%s", why);
    c.a = a;
    for (i = 0; i < sizeof checks / sizeof checks[0] && !c.oom; i++)
        checks[i](&c);
    qg__analysis_free(a);
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
