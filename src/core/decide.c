/* decide.c - the all-or-nothing decision over a member's and its org's
 * windows (decide.h).  No locks and no clock: the store holds the lock and
 * passes now in the window contexts.
 *
 * Bounds (quotagate.h): weights and window sums stay within
 * QG_AMOUNT_MAX_MILLI (the windows saturate), prices, costs and spent
 * amounts within QG_MONEY_MAX_MICRO: a cost is formed in 128 bits and
 * clamped, a spent amount saturates, and the cap is compared with the
 * unclamped sum of two bounded amounts (< 2^62), so a spent amount at the
 * bound passes any cap. */
#include <string.h>
#include "decide.h"
#include "fixed.h"

int qg__decide_add(qg_decide_in *in, const qg_window_spec *specs, int n,
                  qg_win_state *states, int org)
{
    if (in->n + n > QG_MAX_VIEWS)
        return QG_EINVAL;
    for (int i = 0; i < n; i++) {
        in->spec[in->n] = &specs[i];
        in->state[in->n] = &states[i];
        in->org[in->n] = (unsigned char)(org != 0);
        in->n++;
    }
    return QG_OK;
}

static const qg_win_ctx *ctx_of(const qg_decide_in *in, int i)
{
    return &in->ctx[in->org[i]];
}

/* Direct per-type calls (the same functions window.c's table forwards to,
 * with the same answers for an unknown type): the decision path calls
 * them several times per window, and the table lookup, the view's memset
 * and the out-of-line dispatchers showed in profiles. */
static inline int64_t admit_at(const qg_window_spec *s, qg_win_state *st,
                               const qg_win_ctx *ctx, int64_t a)
{
    switch (s->type) {
    case QG_WIN_ROLLING: return qg__rolling_admit_at(s, st, ctx, a);
    case QG_WIN_CALENDAR: return qg__calendar_admit_at(s, st, ctx, a);
    case QG_WIN_SESSION: return qg__session_admit_at(s, st, ctx, a);
    case QG_WIN_RATE: return qg__rate_admit_at(s, st, ctx, a);
    case QG_WIN_CONCURRENCY: return qg__concurrency_admit_at(s, st, ctx, a);
    default: return QG_NEVER;
    }
}

static inline int charge(const qg_window_spec *s, qg_win_state *st,
                         const qg_win_ctx *ctx, int64_t a)
{
    switch (s->type) {
    case QG_WIN_ROLLING: return qg__rolling_charge(s, st, ctx, a);
    case QG_WIN_CALENDAR: return qg__calendar_charge(s, st, ctx, a);
    case QG_WIN_SESSION: return qg__session_charge(s, st, ctx, a);
    case QG_WIN_RATE: return qg__rate_charge(s, st, ctx, a);
    case QG_WIN_CONCURRENCY: return qg__concurrency_charge(s, st, ctx, a);
    default: return QG_EINVAL;
    }
}

/* qg__win_view without the memset: every type fills the four amounts
 * and the reset instant. */
static inline void view(const qg_window_spec *s, qg_win_state *st,
                        const qg_win_ctx *ctx, qg_window_view *out)
{
    out->name = s->name;
    out->type = (int)s->type;
    out->unit = s->type == QG_WIN_CONCURRENCY ? (int)QG_UNIT_REQUESTS
                                              : (int)s->unit;
    out->period_ms = 0;          /* the calendar's view sets it */
    switch (s->type) {
    case QG_WIN_ROLLING: qg__rolling_view(s, st, ctx, out); break;
    case QG_WIN_CALENDAR: qg__calendar_view(s, st, ctx, out); break;
    case QG_WIN_SESSION: qg__session_view(s, st, ctx, out); break;
    case QG_WIN_RATE: qg__rate_view(s, st, ctx, out); break;
    case QG_WIN_CONCURRENCY: qg__concurrency_view(s, st, ctx, out); break;
    default:
        out->limit_milli = out->used_milli = out->remaining_milli = 0;
        out->reset_at_ms = 0;
        break;
    }
}

void qg__decide_views(qg_decide_in *in, qg_decision *out, int with_recovery)
{
    out->nviews = in->n;
    for (int i = 0; i < in->n; i++) {
        const qg_win_ctx *ctx = ctx_of(in, i);
        view(in->spec[i], in->state[i], ctx, &out->views[i]);
        out->views[i].org = in->org[i];
        out->nrecovery[i] = 0;
        if (with_recovery && out->views[i].used_milli > 0)
            out->nrecovery[i] =
                qg__win_recovery(in->spec[i], in->state[i], ctx,
                                out->recovery[i], QG_MAX_RECOVERY);
    }
}

/* Undo the charges of windows [0, upto) after a later one failed. */
static void rollback(qg_decide_in *in, int upto)
{
    for (int i = 0; i < upto; i++) {
        const qg_window_spec *s = in->spec[i];
        if (!qg__window_applies(s, in->model))
            continue;
        if (s->type == QG_WIN_CONCURRENCY)
            qg__win_release(s, in->state[i], ctx_of(in, i));
        else
            qg__win_adjust(s, in->state[i], ctx_of(in, i), ctx_of(in, i)->now_ms,
                          -qg__win_amount(s, in->weight_milli));
    }
}

static void no_overage(qg_decision *out)
{
    out->overage_milli = out->overage_cost_micro = 0;
    out->overage_price_micro = 0;
    out->headroom_milli = -1;
    out->cap_reached = 0;
}

/* Charge every applicable window (after every one admitted). */
static int charge_all(qg_decide_in *in)
{
    for (int i = 0; i < in->n; i++) {
        const qg_window_spec *s = in->spec[i];
        int rc;
        if (!qg__window_applies(s, in->model))
            continue;
        rc = charge(s, in->state[i], ctx_of(in, i),
                    qg__win_amount(s, in->weight_milli));
        if (rc != QG_OK) {
            rollback(in, i);
            return rc;
        }
    }
    return QG_OK;
}

/* One pass over the windows.  Hard windows decide as always.  Lifted
 * (soft, payg) windows never refuse: they only say how much room is left
 * (the overage is what the request takes beyond the least of it) and
 * when they would admit it without overage (soft_fit).  A refusal by a
 * hard window is retryable when the hard windows admit it and, if the cap
 * could not pay the overage now, also the soft windows have room or the
 * cap period has ended, whichever comes first. */
int qg__decide(qg_decide_in *in, qg_decision *out)
{
    int64_t now = in->ctx[0].now_ms, latest = now, soft_latest = now;
    int binding = -1, never = -1, soft_bind = -1, soft_never = -1;
    int64_t room = INT64_MAX, over = 0, cost = 0, spent_after = 0;
    int cap_ok = 1;

    out->weight_milli = in->weight_milli;
    out->retry_after_ms = 0;
    no_overage(out);
    for (int i = 0; i < in->n; i++) {
        const qg_window_spec *s = in->spec[i];
        int64_t at;
        if (!qg__window_applies(s, in->model))
            continue;
        at = admit_at(s, in->state[i], ctx_of(in, i),
                      qg__win_amount(s, in->weight_milli));
        if (((in->soft >> i) & 1u) == 0) {
            if (at == QG_NEVER) {
                /* The first window that can never hold it binds. */
                if (never < 0)
                    never = i;
            } else if (at > latest) {
                latest = at;
                binding = i;
            }
            continue;
        }
        qg_window_view v;
        view(s, in->state[i], ctx_of(in, i), &v);
        if (v.remaining_milli < room)
            room = v.remaining_milli;
        if (at == QG_NEVER) {
            if (soft_never < 0)
                soft_never = i;
        } else if (at > soft_latest) {
            soft_latest = at;
            soft_bind = i;
        }
    }
    if (in->soft) {
        out->headroom_milli = room == INT64_MAX ? -1 : room;
        out->overage_price_micro = in->price_micro;
        over = qg__overage_of(in->weight_milli, out->headroom_milli);
        cost = qg__overage_cost(over, in->price_micro);
        /* spent and cost are within the money bound: the sum cannot wrap */
        cap_ok = in->cap_micro <= 0 || *in->spent_micro + cost <= in->cap_micro;
        spent_after = qg__money_add(*in->spent_micro, cost);
    }
    if (never >= 0) {
        out->outcome = QG_REJECT_NEVER;
        out->binding = never;
    } else if (binding >= 0 || !cap_ok) {
        int64_t soft_fit = soft_never >= 0 ? QG_NEVER : soft_latest;
        int64_t retry_at = soft_fit < in->cap_end_ms ? soft_fit
                                                     : in->cap_end_ms;
        out->outcome = QG_REJECT;
        out->binding = binding;
        if (binding < 0) {
            /* Only the cap refuses (some lifted window lacks room). */
            out->cap_reached = 1;
            out->overage_milli = over;
            out->overage_cost_micro = cost;
            out->binding = soft_bind >= 0 ? soft_bind : soft_never;
            latest = retry_at;
            if (soft_never >= 0 && in->cap_micro > 0 && cost > in->cap_micro)
                out->outcome = QG_REJECT_NEVER;
        } else if (!cap_ok && retry_at > latest) {
            latest = retry_at;
        }
        if (out->outcome == QG_REJECT)
            out->retry_after_ms = latest - now;
    } else {
        int rc = charge_all(in);
        if (rc != QG_OK)
            return rc;
        if (in->soft) {
            *in->spent_micro = spent_after;
            out->overage_milli = over;
            out->overage_cost_micro = cost;
        }
        out->outcome = QG_ALLOW;
        out->binding = -1;
    }
    qg__decide_views(in, out, out->outcome != QG_ALLOW);
    return QG_OK;
}

void qg__decide_settle(qg_decide_in *in, int64_t t0_ms, int64_t delta_milli)
{
    for (int i = 0; i < in->n; i++) {
        const qg_window_spec *s = in->spec[i];
        if (!qg__window_applies(s, in->model))
            continue;
        if (s->type == QG_WIN_CONCURRENCY)
            qg__win_release(s, in->state[i], ctx_of(in, i));
        else if (s->unit == QG_UNIT_WEIGHT && delta_milli != 0)
            qg__win_adjust(s, in->state[i], ctx_of(in, i), t0_ms, delta_milli);
    }
}
