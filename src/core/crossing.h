/* crossing.h - which notification thresholds a window's usage has
 * reached, which period a crossing belongs to, and the pace forecast that
 * sends quota.forecast (PRODUCT.md 7).  No I/O, no clock: every function
 * takes the instant it judges.
 *
 * Thresholds apply to the windows that meter an allowance: calendar,
 * rolling and session.  A calendar window's crossing belongs to its
 * period (fires once per period); a rolling or session window's fires
 * again only after usage fell back below the threshold (its period key
 * is 0 and the mark is re-armed).  Rate and concurrency windows refill
 * within seconds and are not notified. */
#ifndef QG_CROSSING_H
#define QG_CROSSING_H

#include <stdint.h>

#include "quotagate.h"
#include "rules.h"

/* 1 for the window types thresholds apply to. */
int qg__crossing_applies(qg_win_type t);
/* 1 when a crossing of this type fires again only after a fall below it
 * (rolling, session), 0 when once per period (calendar). */
int qg__crossing_rearms(qg_win_type t);
/* How many of the ascending thresholds thr_milli[0..n) used has reached:
 * used >= threshold x limit (exact: 128-bit products).  0 when limit <= 0. */
int qg__crossing_level(const int64_t *thr_milli, int n, int64_t used_milli,
                       int64_t limit_milli);
/* The period a crossing of view v belongs to: a calendar window's period
 * end (its reset_at_ms), 0 for the windows that re-arm. */
int64_t qg__crossing_period(const qg_window_view *v);

/* The pace forecast of one window at now_ms (qg__forecast_pace):
 * weight counted since start_ms (the period's start, at least an hour
 * before now) per hour, and when the remaining allowance runs out at that
 * pace. */
typedef struct qg_pace {
    int64_t basis_ms;              /* the span the pace is taken over */
    int64_t weight_per_hour_milli; /* used / basis, per hour */
    int64_t exhausted_at_ms;       /* 0: never at this pace */
    int before_reset;              /* runs out before reset_at_ms */
} qg_pace;

/* The start of the window's current period for the forecast: a calendar
 * window's period start (anchor_ms: the member's billing anchor), a
 * session's reset_at_ms minus its length; -1 for windows without a
 * period that runs out (rolling, rate, concurrency: at a steady pace a
 * rolling window's usage stays where it is). */
int64_t qg__crossing_start(const qg_window_spec *w, int64_t anchor_ms,
                           int64_t now_ms, int64_t reset_at_ms);
/* Forecast: pace = used / max(now - start, 1 h); exhausted_at = now +
 * remaining / pace (rounded up to the ms), before_reset when that comes
 * before reset_at_ms.  Returns 1 when before_reset, else 0. */
int qg__forecast_pace(int64_t used_milli, int64_t limit_milli,
                      int64_t start_ms, int64_t now_ms, int64_t reset_at_ms,
                      qg_pace *out);

#endif
