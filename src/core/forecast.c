/* forecast.c - when a window runs out at the subject's pace (forecast.h;
 * the semantics per window type are docs/forecast.md's).
 *
 * The pace p = counted / basis (milli-units per ms) is kept as the pair of
 * integers; the time to use an amount A at that pace is
 * ceil(A * basis / counted) ms, computed in 128 bits.  "Runs out" means
 * the remaining allowance reaches zero; a request larger than what is
 * left is refused a little earlier, by its own weight.
 *
 * Per type, with R the remaining now and L the window's length:
 *  - calendar: the period ends at E (calendar.c).  At now + A(R) < E it
 *    runs out in this period (before_reset); otherwise the next period
 *    [E, E2) starts whole and runs out at E + A(limit) when that is < E2;
 *    otherwise never.
 *  - session: an open session ends at reset_at: as calendar, with the next
 *    session opened by the pace's first charge at its end and lasting L.
 *    No open session: the pace's next charge opens one now.
 *  - rolling: with nothing more charged, the remaining grows step by step
 *    (the recovery schedule rem(t)); with the pace going on, it runs out
 *    at the first t >= now with p * (t - now) >= rem(t), looked for while
 *    t - now <= L (after L the pace's own charges expire as fast as they
 *    come: the window then holds p * L, and when that is below the limit
 *    it had not run out by now + L, it never does).  Between two steps of
 *    a truncated schedule the earlier step's remaining is taken, so the
 *    answer errs early, never late.  before_reset: it runs out before the
 *    window is whole again (the schedule's last step).
 *  - rate: the bucket refills at limit / per; a pace above that drains
 *    what is left at (p - limit / per) and runs out before it refills
 *    (before_reset); a pace at or below it never empties it.
 *  - concurrency: a pace of requests per hour says nothing about how many
 *    are in flight at once: exhausted only when no slot is free now.
 * A window with nothing left is exhausted now, before it resets. */
#include <string.h>
#include "calendar.h"
#include "forecast.h"

#define HOUR_MS INT64_C(3600000)

int64_t qg__forecast_basis(int64_t basis_cfg_ms, int64_t first_ms,
                           int64_t now_ms)
{
    int64_t b = basis_cfg_ms > 0 ? basis_cfg_ms : QG_FORECAST_DEFAULT_BASIS_MS;
    if (first_ms >= 0 && first_ms <= now_ms && now_ms - first_ms < b)
        b = now_ms - first_ms;
    return b < QG_FORECAST_MIN_BASIS_MS ? QG_FORECAST_MIN_BASIS_MS : b;
}

/* ceil(a * b * c / d) for a, b, c >= 0 and d > 0; INT64_MAX when it does
 * not fit (or the product would overflow 128 bits). */
static int64_t muldiv_ceil(int64_t a, int64_t b, int64_t c, int64_t d)
{
    typedef unsigned __int128 u128;
    u128 p = (u128)(uint64_t)a * (uint64_t)b, q;
    if (c != 1) {
        if (c != 0 && p > ~(u128)0 / (uint64_t)c)
            return INT64_MAX;
        p *= (uint64_t)c;
    }
    q = p / (uint64_t)d + (p % (uint64_t)d != 0);
    return q > (u128)INT64_MAX ? INT64_MAX : (int64_t)q;
}

/* now + the time to use amount at the pace; INT64_MAX when beyond every
 * instant the gateway represents. */
static int64_t at_pace(int64_t now_ms, int64_t amount, int64_t counted,
                       int64_t basis_ms)
{
    int64_t dt = muldiv_ceil(amount > 0 ? amount : 0, basis_ms, 1, counted);
    if (dt == INT64_MAX || dt > QG_TIME_MAX_MS - now_ms)
        return INT64_MAX;
    return now_ms + dt;
}

static void set(qg_forecast *out, int64_t at, int before)
{
    if (at == INT64_MAX || at <= 0) {
        out->exhausted_at_ms = 0;
        out->before_reset = 0;
    } else {
        out->exhausted_at_ms = at;
        out->before_reset = before;
    }
}

/* Runs out now + A(rem) when that is before end; else in the next
 * period [end, next_end) at end + A(limit) when that is before next_end;
 * else never. */
static void periods(qg_forecast *out, int64_t now_ms, int64_t rem,
                    int64_t limit, int64_t end, int64_t next_end,
                    int64_t counted, int64_t basis_ms)
{
    int64_t t = at_pace(now_ms, rem, counted, basis_ms);
    if (t < end) {
        set(out, t, 1);
        return;
    }
    t = at_pace(end, limit, counted, basis_ms);
    set(out, t < next_end ? t : INT64_MAX, 0);
}

static void rolling(qg_forecast *out, const qg_window_spec *w,
                    const qg_window_view *v, const qg_recovery_point *rec,
                    int nrec, int64_t counted, int64_t basis_ms,
                    int64_t now_ms)
{
    int64_t horizon = now_ms + w->length_ms, whole = 0;
    int64_t a = now_ms, rem = v->remaining_milli;
    if (nrec > 0 && rec[nrec - 1].remaining_milli >= v->limit_milli)
        whole = rec[nrec - 1].at_ms;
    for (int k = 0; k <= nrec; k++) {
        /* [a, b) with rem left if nothing more were charged */
        int64_t b = k < nrec ? rec[k].at_ms : INT64_MAX;
        int64_t t = at_pace(now_ms, rem, counted, basis_ms);
        if (t < a)
            t = a;
        if (t > horizon)
            break;
        if (t < b) {
            set(out, t, whole > 0 && t < whole);
            return;
        }
        if (k < nrec) {
            a = b;
            if (rec[k].remaining_milli > rem)
                rem = rec[k].remaining_milli;
        }
    }
    set(out, INT64_MAX, 0);
}

void qg__forecast(const qg_window_spec *w, const qg_window_view *v,
                  const qg_recovery_point *rec, int nrec, int64_t anchor_ms,
                  int64_t counted_milli, int64_t basis_ms, int64_t now_ms,
                  qg_forecast *out)
{
    int64_t rem = v->remaining_milli, end, next_end, start;

    memset(out, 0, sizeof *out);
    if (basis_ms < 1)
        basis_ms = QG_FORECAST_MIN_BASIS_MS;
    if (counted_milli < 0)
        counted_milli = 0;
    out->basis_ms = basis_ms;
    out->per_hour_milli = (int64_t)((__int128)counted_milli * HOUR_MS /
                                    basis_ms);
    if (rem <= 0) {                     /* nothing left: exhausted now */
        set(out, now_ms, 1);
        return;
    }
    if (w->type == QG_WIN_CONCURRENCY || counted_milli == 0)
        return;                         /* never, at this pace */
    switch (w->type) {
    case QG_WIN_CALENDAR:
        if (qg__calendar_period(&w->cal, anchor_ms, now_ms, &start, &end) <
                0 ||
            qg__calendar_period(&w->cal, anchor_ms, end, &start,
                                &next_end) < 0)
            return;
        periods(out, now_ms, rem, v->limit_milli, end, next_end,
                counted_milli, basis_ms);
        return;
    case QG_WIN_SESSION:
        if (v->reset_at_ms > now_ms) {  /* a session is open until then */
            end = v->reset_at_ms;
            periods(out, now_ms, rem, v->limit_milli, end,
                    end + w->length_ms, counted_milli, basis_ms);
        } else {                        /* the pace opens one now */
            int64_t t = at_pace(now_ms, v->limit_milli, counted_milli,
                                basis_ms);
            set(out, t < now_ms + w->length_ms ? t : INT64_MAX, 1);
        }
        return;
    case QG_WIN_ROLLING:
        rolling(out, w, v, rec, nrec, counted_milli, basis_ms, now_ms);
        return;
    case QG_WIN_RATE: {
        /* drain = counted / basis - limit / per, over basis * per */
        __int128 num = (__int128)counted_milli * w->length_ms -
                       (__int128)w->limit_milli * basis_ms;
        int64_t dt;
        if (num <= 0)
            return;                     /* the refill keeps up */
        if (num > INT64_MAX) {          /* drains within a ms or so */
            set(out, now_ms + 1, 1);
            return;
        }
        dt = muldiv_ceil(rem, basis_ms, w->length_ms, (int64_t)num);
        if (dt != INT64_MAX && dt <= QG_TIME_MAX_MS - now_ms)
            set(out, now_ms + dt, 1);
        return;
    }
    default:
        return;
    }
}
