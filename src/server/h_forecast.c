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
#include "headers.h"
#include "server.h"

void qg__usage_forecasts(qg_server *s, const qg_rules *rules,
                         const qg_decision *d, const char *subject,
                         int64_t now_ms, qg_forecast *fc)
{
    qg_pace_sample ps;
    int have = qg__pace_get(s->pace, s->ledger, subject,
                            rules->forecast_basis_ms, now_ms, &ps) == QG_OK;
    for (int i = 0; i < d->nviews; i++) {
        const qg_window_spec *w = qg__view_spec(rules, d, &d->views[i]);
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
