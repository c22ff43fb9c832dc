/* win_calendar.c - calendar windows: usage resets at fixed local instants.
 *
 * The state caches the current period [start, end) computed by
 * qg__calendar_period() (calendar.c, DST-correct in the window's zone, with
 * the subject's billing anchor from ctx->anchor_ms) and the usage charged
 * in it.  When now reaches end the period is recomputed and used restarts
 * at 0, so a refused amount that fits the limit fits again exactly at end.
 *
 * Clamping: once a period is cached, now is raised to at least its start,
 * so time presented out of order can never reopen an earlier period and
 * forget its usage.  A spec whose period cannot be computed (a bad spec
 * that validation should have refused) fails closed: it never admits.
 *
 * Bounds (quotagate.h): used saturates at QG_AMOUNT_MAX_MILLI, and once
 * there a refund leaves it there (the real usage is unknown and larger),
 * until the reset: a saturated window refuses every positive amount for
 * the rest of its period, never wraps and admits. */
#include "fixed.h"
#include "window.h"

/* Clamp now and roll the cached period forward.  Returns 0, or -1 when the
 * period cannot be computed. */
static int advance(const qg_window_spec *s, qg_win_state *st,
                   const qg_win_ctx *ctx, int64_t *now_out)
{
    int64_t now = ctx->now_ms;
    int have = st->u.cal.end_ms != 0;
    if (have && now < st->u.cal.start_ms)
        now = st->u.cal.start_ms;
    *now_out = now;
    if (have && now < st->u.cal.end_ms)
        return 0;
    int64_t start, end;
    if (qg__calendar_period(&s->cal, ctx->anchor_ms, now, &start, &end) != 0 ||
        end <= now || start > now)
        return -1;
    st->u.cal.start_ms = start;
    st->u.cal.end_ms = end;
    st->u.cal.used_milli = 0;
    return 0;
}

int64_t qg__calendar_admit_at(const qg_window_spec *s, qg_win_state *st,
                              const qg_win_ctx *ctx, int64_t a)
{
    int64_t now;
    if (advance(s, st, ctx, &now) != 0)
        return QG_NEVER;
    /* a <= limit - used: no addition that could wrap (both are >= 0) */
    if (a <= 0 || a <= s->limit_milli - st->u.cal.used_milli)
        return now;
    if (a > s->limit_milli)
        return QG_NEVER;
    return st->u.cal.end_ms;   /* the next reset: used is 0 from then on */
}

int qg__calendar_charge(const qg_window_spec *s, qg_win_state *st,
                        const qg_win_ctx *ctx, int64_t a)
{
    int64_t now;
    if (advance(s, st, ctx, &now) != 0)
        return QG_EINVAL;
    if (a > 0)
        st->u.cal.used_milli = qg__amount_add(st->u.cal.used_milli, a);
    return 0;
}

void qg__calendar_adjust(const qg_window_spec *s, qg_win_state *st,
                         const qg_win_ctx *ctx, int64_t t0, int64_t delta)
{
    int64_t now;
    if (advance(s, st, ctx, &now) != 0)
        return;
    /* A charge from an earlier period was wiped by the reset. */
    if (t0 < st->u.cal.start_ms || t0 >= st->u.cal.end_ms)
        return;
    if (delta > 0) {
        st->u.cal.used_milli = qg__amount_add(st->u.cal.used_milli, delta);
    } else if (st->u.cal.used_milli < QG_AMOUNT_MAX_MILLI) {
        int64_t v = st->u.cal.used_milli + delta;
        st->u.cal.used_milli = v < 0 ? 0 : v;
    }
}

void qg__calendar_view(const qg_window_spec *s, qg_win_state *st,
                       const qg_win_ctx *ctx, qg_window_view *out)
{
    int64_t now;
    int ok = advance(s, st, ctx, &now) == 0;
    out->limit_milli = s->limit_milli;
    out->used_milli = ok ? st->u.cal.used_milli : 0;
    out->remaining_milli = s->limit_milli > out->used_milli
                               ? s->limit_milli - out->used_milli : 0;
    out->reset_at_ms = ok ? st->u.cal.end_ms : 0;
    out->period_ms = ok ? st->u.cal.end_ms - st->u.cal.start_ms : 0;
}

int qg__calendar_recovery(const qg_window_spec *s, qg_win_state *st,
                          const qg_win_ctx *ctx, qg_recovery_point *pts,
                          int max)
{
    int64_t now;
    if (max <= 0 || advance(s, st, ctx, &now) != 0 ||
        st->u.cal.used_milli <= 0)
        return 0;
    pts[0].at_ms = st->u.cal.end_ms;
    pts[0].remaining_milli = s->limit_milli;
    return 1;
}
