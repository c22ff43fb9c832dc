/* crossing.c - see crossing.h: thresholds reached, the period of a
 * crossing, the pace forecast.
 *
 * The arithmetic is exact: used and limit are milli-units up to
 * QG_AMOUNT_MAX_MILLI (1e18), so "used >= t x limit / 1000" is compared
 * as used x 1000 >= t x limit in 128 bits, and the forecast's
 * remaining x basis / used likewise.  The pace is this gateway's own,
 * taken over the window's current period (the forecast of /v1/usage may
 * come to use the ledger's history instead; both answer "does the
 * remaining allowance run out before the window resets"). */
#include "crossing.h"
#include "calendar.h"

#define HOUR_MS INT64_C(3600000)

int qg__crossing_applies(qg_win_type t)
{
    return t == QG_WIN_CALENDAR || t == QG_WIN_ROLLING ||
           t == QG_WIN_SESSION;
}

int qg__crossing_rearms(qg_win_type t)
{
    return t == QG_WIN_ROLLING || t == QG_WIN_SESSION;
}

int qg__crossing_level(const int64_t *thr_milli, int n, int64_t used_milli,
                       int64_t limit_milli)
{
    int level = 0;
    if (limit_milli <= 0 || used_milli <= 0)
        return 0;
    while (level < n &&
           (__int128)used_milli * 1000 >=
               (__int128)thr_milli[level] * limit_milli)
        level++;
    return level;
}

int64_t qg__crossing_period(const qg_window_view *v)
{
    return v->type == QG_WIN_CALENDAR ? v->reset_at_ms : 0;
}

int64_t qg__crossing_start(const qg_window_spec *w, int64_t anchor_ms,
                           int64_t now_ms, int64_t reset_at_ms)
{
    int64_t start, end;
    if (w->type == QG_WIN_CALENDAR)
        return qg__calendar_period(&w->cal, anchor_ms, now_ms, &start,
                                   &end) == 0 ? start : -1;
    if (w->type == QG_WIN_SESSION && reset_at_ms > 0)
        return reset_at_ms - w->length_ms;
    return -1;
}

int qg__forecast_pace(int64_t used_milli, int64_t limit_milli,
                      int64_t start_ms, int64_t now_ms, int64_t reset_at_ms,
                      qg_pace *out)
{
    int64_t basis = now_ms - start_ms, remaining = limit_milli - used_milli;
    out->basis_ms = basis < HOUR_MS ? HOUR_MS : basis;
    out->weight_per_hour_milli = 0;
    out->exhausted_at_ms = 0;
    out->before_reset = 0;
    if (used_milli <= 0 || limit_milli <= 0)
        return 0;
    out->weight_per_hour_milli =
        (int64_t)((__int128)used_milli * HOUR_MS / out->basis_ms);
    if (remaining <= 0) {
        out->exhausted_at_ms = now_ms;
    } else {
        /* remaining / (used / basis) ms from now, rounded up */
        __int128 ms = ((__int128)remaining * out->basis_ms + used_milli - 1) /
                      used_milli;
        if (ms > (__int128)INT64_MAX - now_ms)
            return 0;                  /* beyond any date: never */
        out->exhausted_at_ms = now_ms + (int64_t)ms;
    }
    out->before_reset = reset_at_ms > 0 && out->exhausted_at_ms < reset_at_ms;
    return out->before_reset;
}
