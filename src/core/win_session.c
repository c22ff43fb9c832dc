/* win_session.c - session windows: a fixed window of length L that opens at
 * the first charge after the previous session closed.
 *
 * This is the "5-hour session that starts with your first message": no
 * clock runs until someone is charged; the session then lasts exactly
 * [start, start + L) and resets whole when it closes.  State: start_ms
 * (0 = no open session), used_milli, and seen_ms for clamping time that is
 * presented out of order.  A refused amount fits again at start + L, the
 * instant the session closes (a new one opens with the retried charge).
 *
 * Bounds: as calendar windows (win_calendar.c), used saturates at
 * QG_AMOUNT_MAX_MILLI and stays there against refunds until the session
 * closes. */
#include "fixed.h"
#include "window.h"

static int64_t sat_add(int64_t a, int64_t b)
{
    return b > 0 && a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* Clamp now, record it, and close a session that has run its length. */
static int64_t advance(const qg_window_spec *s, qg_win_state *st,
                       const qg_win_ctx *ctx)
{
    int64_t now = ctx->now_ms > st->u.sess.seen_ms ? ctx->now_ms
                                                   : st->u.sess.seen_ms;
    st->u.sess.seen_ms = now;
    if (st->u.sess.start_ms != 0 &&
        now >= sat_add(st->u.sess.start_ms, s->length_ms)) {
        st->u.sess.start_ms = 0;
        st->u.sess.used_milli = 0;
    }
    return now;
}

int64_t qg__session_admit_at(const qg_window_spec *s, qg_win_state *st,
                             const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = advance(s, st, ctx);
    if (a <= 0)
        return now;
    if (a > s->limit_milli)
        return QG_NEVER;
    /* a <= limit - used: no addition that could wrap (both are >= 0) */
    if (st->u.sess.start_ms == 0 || a <= s->limit_milli - st->u.sess.used_milli)
        return now;
    /* The open session holds too much: at start + L it closes, used drops
     * to 0 and a <= limit fits in the session the retry opens. */
    return sat_add(st->u.sess.start_ms, s->length_ms);
}

int qg__session_charge(const qg_window_spec *s, qg_win_state *st,
                       const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = advance(s, st, ctx);
    /* Every admitted request opens a session, even a zero-weight one whose
     * settle will carry the real charge. */
    if (a < 0)
        return 0;
    if (st->u.sess.start_ms == 0)
        st->u.sess.start_ms = now;
    st->u.sess.used_milli = qg__amount_add(st->u.sess.used_milli, a);
    return 0;
}

void qg__session_adjust(const qg_window_spec *s, qg_win_state *st,
                        const qg_win_ctx *ctx, int64_t t0, int64_t delta)
{
    advance(s, st, ctx);
    /* Only a charge made inside the open session belongs to it. */
    if (st->u.sess.start_ms == 0 || t0 < st->u.sess.start_ms ||
        t0 >= sat_add(st->u.sess.start_ms, s->length_ms))
        return;
    if (delta > 0) {
        st->u.sess.used_milli = qg__amount_add(st->u.sess.used_milli, delta);
    } else if (st->u.sess.used_milli < QG_AMOUNT_MAX_MILLI) {
        int64_t v = st->u.sess.used_milli + delta;
        st->u.sess.used_milli = v < 0 ? 0 : v;
    }
}

void qg__session_view(const qg_window_spec *s, qg_win_state *st,
                      const qg_win_ctx *ctx, qg_window_view *out)
{
    advance(s, st, ctx);
    out->limit_milli = s->limit_milli;
    out->used_milli = st->u.sess.used_milli;
    out->remaining_milli = s->limit_milli > out->used_milli
                               ? s->limit_milli - out->used_milli : 0;
    out->reset_at_ms = st->u.sess.start_ms
                           ? sat_add(st->u.sess.start_ms, s->length_ms) : 0;
}

int qg__session_recovery(const qg_window_spec *s, qg_win_state *st,
                         const qg_win_ctx *ctx, qg_recovery_point *pts, int max)
{
    advance(s, st, ctx);
    if (max <= 0 || st->u.sess.start_ms == 0 || st->u.sess.used_milli <= 0)
        return 0;
    pts[0].at_ms = sat_add(st->u.sess.start_ms, s->length_ms);
    pts[0].remaining_milli = s->limit_milli;
    return 1;
}
