/* h_forecast.c - the forecast on every window of /v1/usage: the views the
 * store gave (any store: the same views), the subject's pace from the
 * ledger's rollup through the pace table (pace.h: at most one ledger read
 * per subject per 30 s, on the worker's thread), and the core's
 * arithmetic (forecast.c).  docs/forecast.md says what each window type's
 * forecast means. */
#include <string.h>
#include "forecast.h"
#include "pace.h"
#include "rules.h"
#include "server.h"

/* The spec of view i: views list the member's plan windows, then its
 * org's, in the rules' order; matched by name and scope. */
static const qg_window_spec *view_spec(const qg_rules *r,
                                       const qg_decision *d,
                                       const qg_window_view *v)
{
    int p = d->plan ? qg__rules_find_plan(r, d->plan) : -1;
    int o = d->org ? qg__rules_find_org(r, d->org) : -1;
    const qg_window_spec *w = NULL;
    int n = 0;
    if (!v->org && p >= 0) {
        w = r->plans[p].windows;
        n = r->plans[p].nwindows;
    } else if (v->org && o >= 0) {
        w = r->orgs[o].windows;
        n = r->orgs[o].nwindows;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(w[i].name, v->name) == 0)
            return &w[i];
    return NULL;
}

void qg__usage_forecasts(qg_server *s, const qg_rules *rules,
                         const qg_decision *d, const char *subject,
                         int64_t now_ms, qg_forecast *fc)
{
    qg_pace_sample ps;
    int have = qg__pace_get(s->pace, s->ledger, subject,
                            rules->forecast_basis_ms, now_ms, &ps) == QG_OK;
    for (int i = 0; i < d->nviews; i++) {
        const qg_window_spec *w = view_spec(rules, d, &d->views[i]);
        int n = d->nrecovery[i] > QG_MAX_RECOVERY ? QG_MAX_RECOVERY
                                                  : d->nrecovery[i];
        int64_t basis = have ? ps.at_ms - ps.from_ms
                             : qg__forecast_basis(rules->forecast_basis_ms,
                                                  -1, now_ms);
        memset(&fc[i], 0, sizeof fc[i]);
        fc[i].basis_ms = basis;
        if (!w)
            continue;
        qg__forecast(w, &d->views[i], d->recovery[i], n, d->anchor_ms,
                     have ? qg__pace_counted(&ps, rules, w) : 0, basis,
                     now_ms, &fc[i]);
    }
}
