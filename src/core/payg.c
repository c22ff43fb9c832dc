/* payg.c - see payg.h: pay as you go, without I/O. */
#include "calendar.h"
#include "fixed.h"
#include "payg.h"

/* payg lifts only windows that total weight (rolling, calendar, session
 * in weight units): rate and request-count windows and concurrency guard
 * capacity, and money does not buy past them (docs/decisions.md). */
static int payg_liftable(const qg_window_spec *w)
{
    return w->unit == QG_UNIT_WEIGHT &&
           (w->type == QG_WIN_ROLLING || w->type == QG_WIN_CALENDAR ||
            w->type == QG_WIN_SESSION);
}

void qg__rules_payg(qg_rules *r)
{
    for (int i = 0; i < r->nplans; i++) {
        qg_plan *p = &r->plans[i];
        int plan_payg = p->overage.policy == QG_POLICY_PAYG;
        p->payg_mask = 0;
        p->payg = plan_payg ? &p->overage : NULL;
        for (int k = 0; k < p->nwindows && k < 32; k++) {
            const qg_window_spec *w = &p->windows[k];
            qg_policy pol = w->overage.policy != QG_POLICY_NONE
                                ? w->overage.policy : p->overage.policy;
            if (pol != QG_POLICY_PAYG || !payg_liftable(w))
                continue;
            p->payg_mask |= 1u << k;
            if (!p->payg && w->overage.policy == QG_POLICY_PAYG)
                p->payg = &w->overage;
        }
    }
    for (int i = 0; i < r->norgs; i++) {
        qg_org_spec *o = &r->orgs[i];
        o->payg_own_mask = o->payg_inherit_mask = 0;
        o->payg = NULL;
        for (int k = 0; k < o->nwindows && k < 32; k++) {
            const qg_window_spec *w = &o->windows[k];
            if (!payg_liftable(w))
                continue;
            if (w->overage.policy == QG_POLICY_PAYG) {
                o->payg_own_mask |= 1u << k;
                if (!o->payg)
                    o->payg = &w->overage;
            } else if (w->overage.policy == QG_POLICY_NONE) {
                o->payg_inherit_mask |= 1u << k;
            }
        }
    }
}


/* The spending cap's period containing at_ms: the member's billing month
 * (its anchor's day and time of day, UTC, clamped to short months), or
 * the calendar month in UTC when it has no anchor. */
void qg__payg_cap_period(const qg_tz *utc, int64_t anchor_ms, int64_t at_ms,
                         int64_t *start, int64_t *end)
{
    qg_calendar_spec c = {QG_EVERY_MONTH, 0, 1, 0, 1, utc};
    if (qg__calendar_period(&c, anchor_ms, at_ms, start, end) != 0) {
        *start = 0;
        *end = INT64_MAX;
    }
}

/* payg: which windows of this member and org the policy lifts (the bit
 * order of the store's decision: member windows, then org windows), and
 * the policy whose price and cap apply.  0 when none. */
uint32_t qg__payg_mask(const qg_plan *p, const qg_org_spec *o,
                       const qg_overage **ov)
{
    uint32_t mask = p->payg_mask;
    *ov = p->payg;
    if (o) {
        uint32_t om = o->payg_own_mask;
        if (p->overage.policy == QG_POLICY_PAYG)
            om |= o->payg_inherit_mask;
        if (!*ov)
            *ov = o->payg;
        mask |= om << p->nwindows;
    }
    return *ov ? mask : 0;
}

void qg__payg_fill(const qg_tz *utc, qg_store_check *in)
{
    const qg_overage *ov;
    in->payg_mask = 0;
    if (!in->plan->payg && !(in->orgspec && in->orgspec->payg))
        return;
    if (!(in->payg_mask = qg__payg_mask(in->plan, in->orgspec, &ov)))
        return;
    in->price_micro = ov->price_per_unit_micro;
    in->cap_micro = ov->spending_cap_micro;
    qg__payg_cap_period(utc, in->anchor_ms, in->now_ms, &in->cap_start_ms,
                        &in->cap_end_ms);
}


int64_t qg__overage_cost(int64_t overage_milli, int64_t price_micro)
{
    if (overage_milli <= 0 || price_micro <= 0)
        return 0;
    __int128 c = ((__int128)overage_milli * price_micro + 999) / 1000;
    return c > QG_MONEY_MAX_MICRO ? QG_MONEY_MAX_MICRO : (int64_t)c;
}

int64_t qg__overage_of(int64_t charged_milli, int64_t headroom_milli)
{
    if (headroom_milli < 0 || charged_milli <= headroom_milli)
        return 0;
    return charged_milli - headroom_milli;
}


int64_t *qg__payg_spent_in(qg__payg_spent *s, int64_t start_ms)
{
    if (s->start_ms != start_ms && start_ms >= s->start_ms) {
        s->micro = 0;
        s->start_ms = start_ms;
    }
    return &s->micro;
}

void qg__payg_spent_adjust(qg__payg_spent *s, int64_t start_ms, int64_t delta)
{
    if (delta == 0 || s->start_ms != start_ms)
        return;
    if (delta > 0) {
        s->micro = qg__money_add(s->micro, delta);
    } else if (s->micro < QG_MONEY_MAX_MICRO) {
        s->micro += delta < -QG_MONEY_MAX_MICRO ? -QG_MONEY_MAX_MICRO : delta;
        if (s->micro < 0)
            s->micro = 0;
    }
}
