/* analyze.c - honest multipliers: ratios, redeemable allowance, claims.
 *
 * The figure a pricing page may claim for a plan is not a window's ratio
 * but the allowance a saturating client can actually redeem over a period
 * T, bounded by every window at once.  This file computes that bound per
 * window in closed form (integers only, exact on half-open [t0, t0 + T)),
 * takes the minimum and the binding window, and then measures the same
 * figure by driving the real engine (qg_engine_check / qg_engine_settle)
 * on a virtual clock, so that the enforcing code proves the arithmetic.
 * No printing: the CLI renders a qg_analysis. */
#include "analysis.h"
#include "rules.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calendar.h"
#include "civil.h"
#include "duration.h"
#include "fixed.h"
#include "weights.h"
#include "window.h"

#define SIM_MAX_DECISIONS 50000000LL  /* a runaway guard, not a target */

/* Nominal length of a calendar period, indexed by qg_every. */
static const int64_t every_ms[] = {
    [QG_EVERY_DAY] = QG_MS_PER_DAY,
    [QG_EVERY_WEEK] = 7 * QG_MS_PER_DAY,
    [QG_EVERY_MONTH] = 30 * QG_MS_PER_DAY,
};

static int64_t sat64(__int128 v)
{
    return v > INT64_MAX ? INT64_MAX : v < 0 ? 0 : (int64_t)v;
}

int64_t qg__ratio_milli(int64_t a, int64_t b)
{
    if (b <= 0)
        return -1;
    return sat64((__int128)a * 1000 / b);
}

static int64_t ceil_div128(__int128 a, __int128 b)
{
    return sat64(a <= 0 ? 0 : (a + b - 1) / b);
}

/* The span a window counts over, 0 for concurrency. */
static int64_t win_span(const qg_window_spec *w)
{
    if (w->type == QG_WIN_CALENDAR)
        return (unsigned)w->cal.every < sizeof every_ms / sizeof every_ms[0]
                   ? every_ms[w->cal.every] : 0;
    if (w->type == QG_WIN_CONCURRENCY)
        return 0;
    return w->length_ms;
}

int64_t qg__analysis_default_period(const qg_rules *r)
{
    int64_t best = 0;
    int i, j;
    for (i = 0; i < r->nplans; i++)
        for (j = 0; j < r->plans[i].nwindows; j++)
            if (win_span(&r->plans[i].windows[j]) > best)
                best = win_span(&r->plans[i].windows[j]);
    return best > 0 ? best : 7 * QG_MS_PER_DAY;
}

/* ------------------------------------------------------ analytic caps */

/* What a cap function needs to know. */
typedef struct cap_in {
    int64_t w;          /* reference weight, milli */
    int64_t t0, T;      /* period [t0, t0 + T) */
    int64_t duration;   /* how long one request holds a slot */
} cap_in;

/* Each returns the number of reference requests window s lets through. */
typedef int64_t (*cap_fn)(const qg_window_spec *s, int64_t amount,
                          const cap_in *in);

/* Rolling and session: a full limit per length L, and at most ceil(T/L)
 * windows open in [t0, t0 + T) (each starts where the last expired). */
static int64_t cap_span(const qg_window_spec *s, int64_t amount,
                        const cap_in *in)
{
    return sat64((__int128)(s->limit_milli / amount) *
                 ceil_div128(in->T, s->length_ms));
}

/* Calendar: a full limit per period that [t0, t0 + T) touches, counted on
 * the window's own reset instants. */
static int64_t cap_calendar(const qg_window_spec *s, int64_t amount,
                            const cap_in *in)
{
    int64_t t = in->t0, end = in->t0 + in->T, n = 0, ps, pe;
    while (t < end) {
        if (qg__calendar_period(&s->cal, 0, t, &ps, &pe) < 0 || pe <= t) {
            n = ceil_div128(in->T, win_span(s) > 0 ? win_span(s) : in->T);
            break;
        }
        n++;
        t = pe;
    }
    return sat64((__int128)(s->limit_milli / amount) * n);
}

/* Rate (GCRA): a full bucket of floor(burst/amount) at t0, then one
 * request per emission interval I = per * amount / limit; the k-th extra
 * one falls at t0 + k*I, inside the period while k*I < T, that is
 * k <= ceil(T / I) - 1. */
static int64_t cap_rate(const qg_window_spec *s, int64_t amount,
                        const cap_in *in)
{
    __int128 num = (__int128)in->T * s->limit_milli;
    __int128 den = (__int128)s->length_ms * amount;
    int64_t extra = den > 0 ? ceil_div128(num, den) : 0;
    if (extra > 0)
        extra--;
    return sat64((__int128)(s->burst_milli / amount) + extra);
}

/* Concurrency: each slot starts a request every `duration`. */
static int64_t cap_concurrency(const qg_window_spec *s, int64_t amount,
                               const cap_in *in)
{
    (void)amount;
    return sat64((__int128)(s->limit_milli / QG_MILLI) *
                 ceil_div128(in->T, in->duration > 0 ? in->duration : 1));
}

static const cap_fn cap_fns[] = {
    [QG_WIN_ROLLING] = cap_span,        [QG_WIN_CALENDAR] = cap_calendar,
    [QG_WIN_SESSION] = cap_span,        [QG_WIN_RATE] = cap_rate,
    [QG_WIN_CONCURRENCY] = cap_concurrency,
};

/* Weight window s lets through over the period, -1 when it does not
 * count the reference request. */
static int64_t window_cap(const qg_window_spec *s, int model,
                          const cap_in *in)
{
    int64_t amount = qg__win_amount(s, in->w);
    if (!qg__window_applies(s, model) ||
        (unsigned)s->type >= sizeof cap_fns / sizeof cap_fns[0] ||
        !cap_fns[s->type] || amount <= 0)
        return -1;
    return sat64((__int128)cap_fns[s->type](s, amount, in) * in->w);
}

/* A reset instant at or after the origin of the plan's longest calendar
 * window, so that its periods start whole. */
static int64_t plan_t0(const qg_plan *p)
{
    const qg_window_spec *longest = NULL;
    int64_t ps, pe;
    int i;
    for (i = 0; i < p->nwindows; i++)
        if (p->windows[i].type == QG_WIN_CALENDAR &&
            (!longest || win_span(&p->windows[i]) > win_span(longest)))
            longest = &p->windows[i];
    if (!longest ||
        qg__calendar_period(&longest->cal, 0, QG_SIM_ORIGIN_MS, &ps, &pe) < 0)
        return QG_SIM_ORIGIN_MS;
    return ps == QG_SIM_ORIGIN_MS ? ps : pe;
}

/* --------------------------------------------------------- simulation */

/* Requests in flight, settled first in first out (one duration for all,
 * admitted at non-decreasing instants). */
typedef struct inflight {
    int64_t *due, *id;
    size_t head, tail, cap;
} inflight;

static int inflight_push(inflight *q, int64_t due, int64_t id)
{
    if (q->tail == q->cap) {
        if (q->head > 0) {
            memmove(q->due, q->due + q->head,
                    (q->tail - q->head) * sizeof *q->due);
            memmove(q->id, q->id + q->head,
                    (q->tail - q->head) * sizeof *q->id);
            q->tail -= q->head;
            q->head = 0;
        } else {
            size_t ncap = q->cap ? q->cap * 2 : 16;
            int64_t *nd = realloc(q->due, ncap * sizeof *nd);
            int64_t *ni;
            if (!nd)
                return QG_ENOMEM;
            q->due = nd;
            if (!(ni = realloc(q->id, ncap * sizeof *ni)))
                return QG_ENOMEM;
            q->id = ni;
            q->cap = ncap;
        }
    }
    q->due[q->tail] = due;
    q->id[q->tail++] = id;
    return QG_OK;
}

/* The saturating client's state. */
typedef struct sim {
    qg_engine *e;
    const qg_rules *r;
    char subject[QG_NAME_MAX + 8];
    const char *model;        /* NULL: weight-only requests */
    int64_t w;
    int has_slots;            /* the plan limits concurrency */
    inflight q;
} sim;

static int sim_settle(sim *s, int64_t id, int64_t at, char *err,
                      size_t errcap)
{
    char rid[32];
    qg_settle_req req;
    qg_settle_result res;
    snprintf(rid, sizeof rid, "sim-%lld", (long long)id);
    memset(&req, 0, sizeof req);
    req.request_id = rid;
    req.status = QG_SETTLE_COMPLETED;
    req.input_tokens = s->model ? s->r->analysis.input_tokens : 0;
    req.output_tokens = s->model ? s->r->analysis.output_tokens : 0;
    req.weight_milli = s->model ? -1 : s->w;
    return qg_engine_settle(s->e, &req, at, &res, err, errcap);
}

/* Settle every request due at or before now. */
static int sim_settle_due(sim *s, int64_t now, char *err, size_t errcap)
{
    int rc = QG_OK;
    while (rc == QG_OK && s->q.head < s->q.tail && s->q.due[s->q.head] <= now) {
        rc = sim_settle(s, s->q.id[s->q.head], s->q.due[s->q.head], err,
                        errcap);
        s->q.head++;
    }
    return rc;
}

static int sim_loop(sim *s, int64_t t0, int64_t T, int64_t *admitted,
                    int64_t *decisions, char *err, size_t errcap)
{
    int64_t now = t0, end = t0 + T, n = 0, dur = s->r->analysis.duration_ms;
    qg_check_req req;
    qg_decision d;
    char rid[32];
    int rc = QG_OK;

    memset(&req, 0, sizeof req);
    req.subject = s->subject;
    req.request_id = rid;
    req.model = s->model;
    req.input_tokens = s->r->analysis.input_tokens;
    req.max_output_tokens = s->r->analysis.output_tokens;
    req.weight_milli = s->w;
    *admitted = 0;
    while (now < end) {
        if ((rc = sim_settle_due(s, now, err, errcap)) != QG_OK)
            break;
        if (n >= SIM_MAX_DECISIONS) {
            snprintf(err, errcap, "simulation stopped after %lld decisions",
                     (long long)n);
            rc = QG_ERANGE;
            break;
        }
        snprintf(rid, sizeof rid, "sim-%lld", (long long)n);
        n++;
        if ((rc = qg_engine_check(s->e, &req, now, &d, err, errcap)) != QG_OK)
            break;
        if (d.outcome == QG_ALLOW) {
            *admitted += d.weight_milli;
            if (!s->has_slots)
                rc = sim_settle(s, n - 1, now, err, errcap);
            else
                rc = inflight_push(&s->q, now + dur, n - 1);
            if (rc != QG_OK)
                break;
        } else if (d.outcome == QG_REJECT) {
            int64_t next = now + (d.retry_after_ms > 0 ? d.retry_after_ms : 1);
            if (s->q.head < s->q.tail && s->q.due[s->q.head] < next)
                next = s->q.due[s->q.head];
            now = next > now ? next : now + 1;
        } else {
            break;              /* never fits: the client can do no more */
        }
    }
    *decisions = n;
    return rc;
}

int qg__simulate_plan(qg_rules *rules, const char *plan, int64_t t0_ms,
                     int64_t period_ms, int64_t *admitted_milli,
                     int64_t *decisions, char *err, size_t errcap)
{
    qg_store *store = NULL;
    sim s;
    int rc = QG_ENOMEM, pi;

    memset(&s, 0, sizeof s);
    *admitted_milli = 0;
    *decisions = 0;
    pi = qg__rules_find_plan(rules, plan);
    if (pi < 0) {
        snprintf(err, errcap, "unknown plan \"%s\"", plan);
        rc = QG_EINVAL;
        qg_rules_free(rules);
        goto done;
    }
    s.r = rules;
    s.has_slots = rules->plans[pi].concurrency > 0;
    s.model = rules->analysis.model >= 0
                  ? rules->models[rules->analysis.model].name : NULL;
    s.w = s.model ? qg__weight_milli(&rules->models[rules->analysis.model],
                                    rules->analysis.input_tokens,
                                    rules->analysis.output_tokens)
                  : rules->analysis.weight_milli;
    snprintf(s.subject, sizeof s.subject, "sim-%s", plan);
    if (!(store = qg_store_memory_new(NULL)) ||
        !(s.e = qg_engine_new(rules, store))) {
        snprintf(err, errcap, "out of memory");
        qg_rules_free(rules);
        goto done;
    }
    if ((rc = qg_engine_set_subject(s.e, s.subject, plan, NULL, 0, err,
                                    errcap)) != QG_OK)
        goto done;
    rc = sim_loop(&s, t0_ms, period_ms, admitted_milli, decisions, err,
                  errcap);
done:
    qg_engine_free(s.e);
    qg_store_free(store);
    free(s.q.due);
    free(s.q.id);
    return rc;
}

/* ------------------------------------------------------------ analyze */

static qg_rules *load_from_path(void *ud, char *err, size_t errcap)
{
    qg_rules *r = NULL;
    if (qg_rules_load((const char *)ud, &r, err, errcap) != QG_OK)
        return NULL;
    return r;
}

/* Cheapest plan by price; ties and unpriced plans give the first. */
static int default_baseline(const qg_rules *r)
{
    int i, best = 0;
    for (i = 0; i < r->nplans; i++)
        if (r->plans[i].price_micro >= 0 &&
            (r->plans[best].price_micro < 0 ||
             r->plans[i].price_micro < r->plans[best].price_micro))
            best = i;
    return best;
}

static void analyze_windows(const qg_plan *p,
                            const qg_plan *base, const cap_in *in, int model,
                            qg_an_plan *ap)
{
    int j;
    ap->min_ratio_milli = -1;
    ap->redeemable_milli = -1;
    ap->binding = -1;
    ap->nwindows = p->nwindows < QG_MAX_PLAN_WINDOWS ? p->nwindows
                                                     : QG_MAX_PLAN_WINDOWS;
    for (j = 0; j < ap->nwindows; j++) {
        const qg_window_spec *s = &p->windows[j];
        const qg_window_spec *b = qg__plan_find_window(base, s->name);
        qg_an_window *aw = &ap->windows[j];
        aw->name = s->name;
        aw->type = s->type;
        aw->unit = s->unit;
        aw->limit_milli = s->limit_milli;
        aw->base_limit_milli = b ? b->limit_milli : -1;
        aw->ratio_milli = b ? qg__ratio_milli(s->limit_milli, b->limit_milli)
                            : -1;
        if (aw->ratio_milli >= 0 &&
            (ap->min_ratio_milli < 0 || aw->ratio_milli < ap->min_ratio_milli))
            ap->min_ratio_milli = aw->ratio_milli;
        aw->cap_milli = window_cap(s, model, in);
        aw->applies = aw->cap_milli >= 0;
        if (aw->applies && (ap->redeemable_milli < 0 ||
                            aw->cap_milli < ap->redeemable_milli)) {
            ap->redeemable_milli = aw->cap_milli;
            ap->binding = j;
        }
    }
}

static const char *unit_name(const qg_rules *r, const qg_window_spec *s)
{
    return s->unit == QG_UNIT_REQUESTS ? "requests" : r->unit;
}

static void fmt_milli(int64_t v, char *buf, size_t cap)
{
    qg_fixed_format(v, 3, buf, cap);
}

static void check_claim(const qg_rules *r, const qg_analysis *a,
                        const qg_plan *p, const qg_claim *c, qg_an_claim *ac)
{
    const qg_plan *vs = &r->plans[c->vs_plan];
    const qg_window_spec *wp = qg__plan_find_window(p, c->window);
    const qg_window_spec *wv = qg__plan_find_window(vs, c->window);
    const qg_an_plan *ap = &a->plans[p->index], *av = &a->plans[vs->index];
    char mult[32], ratio[32], lp[32], lv[32], eff[32], per[32];
    int64_t rt;
    size_t off;

    ac->multiplier_milli = c->multiplier_milli;
    ac->window = c->window;
    ac->unit = c->unit;
    ac->vs = vs->name;
    ac->effective_milli =
        ap->redeemable_milli >= 0 && av->redeemable_milli > 0
            ? qg__ratio_milli(ap->redeemable_milli, av->redeemable_milli) : -1;
    fmt_milli(c->multiplier_milli, mult, sizeof mult);
    if (!wp || !wv) {
        snprintf(ac->message, sizeof ac->message,
                 "%sx on %s cannot be checked: plan %s has no window %s",
                 mult, c->window, wp ? vs->name : p->name, c->window);
        return;
    }
    rt = qg__ratio_milli(wp->limit_milli, wv->limit_milli);
    fmt_milli(rt, ratio, sizeof ratio);
    fmt_milli(wp->limit_milli, lp, sizeof lp);
    fmt_milli(wv->limit_milli, lv, sizeof lv);
    ac->ok = c->multiplier_milli <= rt;
    if (!ac->ok) {
        snprintf(ac->message, sizeof ac->message,
                 "%sx does not hold for %s: %s vs %s %s is only %sx %s",
                 mult, c->window, lp, lv, unit_name(r, wp), ratio, vs->name);
        return;
    }
    qg_duration_format(a->period_ms, per, sizeof per);
    off = (size_t)snprintf(ac->message, sizeof ac->message,
                           "%sx holds for %s (%s vs %s %s); ", mult, c->window,
                           lp, lv, unit_name(r, wp));
    if (off >= sizeof ac->message)
        return;
    if (ac->effective_milli < 0) {
        snprintf(ac->message + off, sizeof ac->message - off,
                 "effective over %s is not bounded", per);
        return;
    }
    fmt_milli(ac->effective_milli, eff, sizeof eff);
    off += (size_t)snprintf(ac->message + off, sizeof ac->message - off,
                            "effective over %s is %sx (binding: %s)", per, eff,
                            ap->binding >= 0 ? ap->windows[ap->binding].name
                                             : "none");
    if (off >= sizeof ac->message || c->multiplier_milli <= ac->effective_milli)
        return;
    if (c->disclose_effective) {
        snprintf(ac->message + off, sizeof ac->message - off,
                 "; published together with the effective figure");
        return;
    }
    ac->needs_disclosure = 1;
    snprintf(ac->message + off, sizeof ac->message - off,
             "; %sx exceeds it and must be published together with the "
             "effective %sx", mult, eff);
}

/* The reference request's weight, or an error. */
static int reference_weight(const qg_rules *r, int64_t *w, char *err,
                            size_t errcap)
{
    const qg_analysis_spec *an = &r->analysis;
    *w = an->model >= 0 ? qg__weight_milli(&r->models[an->model],
                                          an->input_tokens, an->output_tokens)
                        : an->weight_milli;
    if (*w > QG_AMOUNT_MAX_MILLI) {
        snprintf(err, errcap, "%s: the analysis request weighs more than "
                 "%lld points (the bound on one request's weight)",
                 r->path ? r->path : "rules",
                 (long long)(QG_AMOUNT_MAX_MILLI / 1000));
        return QG_ERANGE;
    }
    if (*w > 0)
        return QG_OK;
    snprintf(err, errcap, "%s: the analysis request has no positive weight",
             r->path ? r->path : "rules");
    return QG_EINVAL;
}

static int simulate_all(const qg_rules *r, const qg_analyze_opts *o,
                        qg_analysis *a, char *err, size_t errcap)
{
    qg_rules_loader load = o->load ? o->load : load_from_path;
    void *ud = o->load ? o->load_ud : (void *)r->path;
    int i, rc = QG_OK;
    char why[512];

    for (i = 0; i < a->nplans && rc == QG_OK; i++) {
        qg_an_plan *ap = &a->plans[i];
        qg_rules *copy = load(ud, why, sizeof why);
        if (!copy) {
            snprintf(err, errcap, "simulation of %s: %s", ap->name, why);
            return QG_ERULES;
        }
        /* the version under analysis alone, in force on the whole
         * virtual clock (its own effective instant is another date) */
        if (!(copy = qg__rules_take_version(copy, r->version))) {
            snprintf(err, errcap, "simulation of %s: the rules file no "
                     "longer holds version \"%s\"", ap->name, r->version);
            return QG_ERULES;
        }
        copy->effective_ms = 0;
        rc = qg__simulate_plan(copy, ap->name, ap->t0_ms, a->period_ms,
                              &ap->sim_redeemable_milli, &ap->sim_decisions,
                              why, sizeof why);
        if (rc != QG_OK)
            snprintf(err, errcap, "simulation of %s: %s", ap->name, why);
        ap->simulated = rc == QG_OK;
        ap->agree = ap->sim_redeemable_milli == ap->redeemable_milli;
    }
    for (i = 0; i < a->nplans && rc == QG_OK; i++)
        a->plans[i].sim_effective_milli =
            a->plans[a->baseline].sim_redeemable_milli > 0
                ? qg__ratio_milli(a->plans[i].sim_redeemable_milli,
                                 a->plans[a->baseline].sim_redeemable_milli)
                : -1;
    return rc;
}

int qg__analyze(const qg_rules *r, const qg_analyze_opts *opts,
               qg_analysis **out, char *err, size_t errcap)
{
    static const qg_analyze_opts defaults = { NULL, 0, 1, NULL, NULL };
    const qg_analyze_opts *o = opts ? opts : &defaults;
    qg_analysis *a = NULL;
    int i, j, rc = QG_ENOMEM;

    *out = NULL;
    if (err && errcap)
        err[0] = '\0';
    if (!r || r->nplans <= 0) {
        snprintf(err, errcap, "no plans to analyse");
        return QG_EINVAL;
    }
    if (!(a = calloc(1, sizeof *a)) ||
        !(a->plans = calloc((size_t)r->nplans, sizeof *a->plans)))
        goto fail;
    a->nplans = r->nplans;
    a->model = r->analysis.model;
    a->hold_ms = r->analysis.duration_ms;
    a->baseline = o->baseline ? qg__rules_find_plan(r, o->baseline)
                              : default_baseline(r);
    if (a->baseline < 0) {
        snprintf(err, errcap, "unknown baseline plan \"%s\"", o->baseline);
        rc = QG_EINVAL;
        goto fail;
    }
    a->period_ms = o->period_ms > 0 ? o->period_ms
                   : r->analysis.period_ms > 0 ? r->analysis.period_ms
                                               : qg__analysis_default_period(r);
    if ((rc = reference_weight(r, &a->weight_milli, err, errcap)) != QG_OK)
        goto fail;
    rc = QG_ENOMEM;
    for (i = 0; i < r->nplans; i++) {
        qg_an_plan *ap = &a->plans[i];
        cap_in in = { a->weight_milli, 0, a->period_ms,
                      r->analysis.duration_ms };
        ap->name = r->plans[i].name;
        ap->index = i;
        ap->price_micro = r->plans[i].price_micro;
        ap->t0_ms = in.t0 = plan_t0(&r->plans[i]);
        ap->sim_effective_milli = -1;
        analyze_windows(&r->plans[i], &r->plans[a->baseline], &in,
                        a->model, ap);
    }
    for (i = 0; i < r->nplans; i++) {
        qg_an_plan *ap = &a->plans[i];
        const qg_an_plan *bp = &a->plans[a->baseline];
        ap->effective_milli =
            ap->redeemable_milli >= 0 && bp->redeemable_milli > 0
                ? qg__ratio_milli(ap->redeemable_milli, bp->redeemable_milli)
                : -1;
        if (r->plans[i].nclaims > 0 &&
            !(ap->claims = calloc((size_t)r->plans[i].nclaims,
                                  sizeof *ap->claims)))
            goto fail;
        ap->nclaims = r->plans[i].nclaims;
        for (j = 0; j < ap->nclaims; j++)
            check_claim(r, a, &r->plans[i], &r->plans[i].claims[j],
                        &ap->claims[j]);
    }
    if (o->simulate && (rc = simulate_all(r, o, a, err, errcap)) != QG_OK)
        goto fail;
    *out = a;
    return QG_OK;
fail:
    if (rc == QG_ENOMEM && err && !*err)
        snprintf(err, errcap, "out of memory");
    qg__analysis_free(a);
    return rc;
}

void qg__analysis_free(qg_analysis *a)
{
    int i;
    if (!a)
        return;
    for (i = 0; a->plans && i < a->nplans; i++)
        free(a->plans[i].claims);
    free(a->plans);
    free(a);
}
