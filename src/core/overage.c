/* overage.c - see overage.h: downgrade and queue, chosen without I/O. */
#include <string.h>
#include "overage.h"

const qg_overage *qg__overage_of_refusal(const qg_rules *rules,
                                         const qg_decision *d)
{
    int pi = d->plan ? qg__rules_find_plan(rules, d->plan) : -1;
    const qg_plan *plan;
    const qg_window_spec *w = NULL;
    if (pi < 0)
        return NULL;
    plan = &rules->plans[pi];
    if (d->binding >= 0 && d->binding < d->nviews) {
        const qg_window_view *v = &d->views[d->binding];
        if (v->org) {
            int oi = d->org ? qg__rules_find_org(rules, d->org) : -1;
            if (oi >= 0) {
                const qg_org_spec *o = &rules->orgs[oi];
                for (int i = 0; i < o->nwindows; i++)
                    if (v->name && !strcmp(o->windows[i].name, v->name))
                        w = &o->windows[i];
            }
        } else if (v->name) {
            w = qg__plan_find_window(plan, v->name);
        }
    }
    if (w && w->overage.policy != QG_POLICY_NONE)
        return &w->overage;
    return &plan->overage;
}

void qg__overage_choose(const qg_rules *rules, const qg_decision *d,
                        int model, int64_t waited_ms,
                        qg__overage_choice *out)
{
    const qg_overage *ov;
    memset(out, 0, sizeof *out);
    out->act = QG_OVERAGE_REFUSE;
    out->to_model = -1;
    if (d->outcome != QG_REJECT && d->outcome != QG_REJECT_NEVER)
        return;
    if (!(ov = qg__overage_of_refusal(rules, d)))
        return;
    /* the refusal charged nothing and is not remembered: the lighter model
     * is checked under the same request id */
    if (ov->policy == QG_POLICY_DOWNGRADE && ov->to_model >= 0 &&
        ov->to_model < rules->nmodels && ov->to_model != model) {
        out->act = QG_OVERAGE_DOWNGRADE;
        out->to_model = ov->to_model;
        return;
    }
    if (ov->policy == QG_POLICY_QUEUE && d->outcome == QG_REJECT &&
        d->retry_after_ms > 0 && d->plan) {
        if (waited_ms < 0)
            waited_ms = 0;
        if (waited_ms + d->retry_after_ms <= ov->max_wait_ms) {
            out->act = QG_OVERAGE_HOLD;
            out->hold_ms = d->retry_after_ms;
            out->queue_size = (int)ov->queue_size;
        }
    }
}
