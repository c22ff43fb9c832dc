/* forecast.h - when a window runs out at the subject's pace (PRODUCT.md
 * section 7, docs/forecast.md).
 *
 * Pure: the caller gives the window's view and recovery schedule at now
 * (as /v1/usage has them, from any store), the usage that window counted
 * over the basis, and the basis; the answer is the pace and the instant
 * the remaining allowance reaches zero if the pace goes on, or none.  The
 * pace is a ratio of integers (counted_milli per basis_ms) and every
 * instant is computed from it exactly (128-bit products, rounded up to the
 * next ms), never through a floating rate. */
#ifndef QG_FORECAST_H
#define QG_FORECAST_H

#include <stdint.h>
#include "quotagate.h"
#include "rules.h"

#define QG_FORECAST_MIN_BASIS_MS INT64_C(3600000)       /* one hour */
#define QG_FORECAST_DEFAULT_BASIS_MS (7 * INT64_C(86400000))
#define QG_FORECAST_MAX_BASIS_MS (90 * INT64_C(86400000))

typedef struct qg_forecast {
    int64_t basis_ms;           /* the span the pace is measured over */
    int64_t per_hour_milli;     /* the pace per hour, rounded down (shown
                                   only: exhausted_at uses the exact
                                   ratio) */
    int64_t exhausted_at_ms;    /* 0: the pace never exhausts it */
    int before_reset;           /* exhausted before the window resets or
                                   is whole again (docs/forecast.md) */
} qg_forecast;

/* The basis at now: the configured one (basis_cfg_ms), or since the
 * subject's first usage (first_ms, -1 when it has none) when that is
 * shorter, and at least QG_FORECAST_MIN_BASIS_MS. */
int64_t qg__forecast_basis(int64_t basis_cfg_ms, int64_t first_ms,
                           int64_t now_ms);

/* The forecast of window w (its view v at now_ms and the recovery
 * schedule rec[0..nrec), as qg_engine_usage gives them; anchor_ms the
 * member's billing anchor, for calendar periods) at the pace of
 * counted_milli (in the window's unit: weight, or 1000 per request) per
 * basis_ms.  Fills out; never fails. */
void qg__forecast(const qg_window_spec *w, const qg_window_view *v,
                  const qg_recovery_point *rec, int nrec, int64_t anchor_ms,
                  int64_t counted_milli, int64_t basis_ms, int64_t now_ms,
                  qg_forecast *out);

#endif
