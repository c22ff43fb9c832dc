/* win_rate.c - rate windows: a smooth rate by GCRA (a token bucket).
 *
 * The window admits limit_milli per period P = length_ms with a bucket of
 * burst_milli (burst_milli 0 means limit).  All arithmetic is exact in
 * __int128 "scaled time": S(t) = t * limit_milli.  One milli-unit then
 * costs exactly P scaled units (P / limit ms of real time), an amount a
 * costs a * P, and the tolerance is tau = burst * P.  The state is the
 * theoretical arrival time tat (scaled).  A request of a fits at now when
 *     max(tat, S(now)) + a*P - S(now) <= tau.
 * When it does not (and a <= burst), tat > S(now) and the condition holds
 * from the first t with S(t) >= tat + a*P - tau, i.e.
 *     t = ceil((tat + a*P - tau) / limit_milli);
 * one millisecond earlier S(t - 1) < tat + a*P - tau <= tat, so it fails:
 * the retry instant is exact.  No rounding happens anywhere else.
 *
 * Bounds (quotagate.h): amounts are clamped to QG_AMOUNT_MAX_MILLI, and the
 * bucket never holds more than it could drain, beyond its burst, by the
 * end of time: tat <= S(now) + tau + limit * QG_TIME_MAX_MS.  Whatever is
 * cut off could only have mattered after the last representable instant,
 * so every instant this window names up to QG_TIME_MAX_MS is the exact
 * one, and every product stays far inside 128 bits (limits, bursts and
 * amounts <= 10^18, periods and times < 2^63: each term < 2^126).  A
 * bucket that was cut (`capped`) keeps its fill against refunds until it
 * has drained, since its real fill is larger.  Views report the fill
 * clamped to the bound, and instants (reset, recovery) at most
 * QG_TIME_MAX_MS. */
#include "fixed.h"
#include "window.h"

typedef __int128 i128;

static int64_t clamp_now(qg_win_state *st, const qg_win_ctx *ctx)
{
    int64_t now = ctx->now_ms > st->u.rate.seen_ms ? ctx->now_ms
                                                   : st->u.rate.seen_ms;
    st->u.rate.seen_ms = now;
    return now;
}

static int64_t burst_of(const qg_window_spec *s)
{
    return s->burst_milli > 0 ? s->burst_milli : s->limit_milli;
}

static i128 scaled(const qg_window_spec *s, int64_t t)
{
    return (i128)t * s->limit_milli;
}

/* ceil(n / d) for d > 0, any sign of n; saturated to int64. */
static int64_t ceil_div128(i128 n, i128 d)
{
    /* Values of real clocks and limits fit 64 bits: a 64-bit division
     * gives the same quotient without the __divti3 call. */
    if (n == (int64_t)n && d == (int64_t)d) {
        int64_t n64 = (int64_t)n, d64 = (int64_t)d;
        int64_t q64 = n64 / d64;
        if (n64 % d64 != 0 && n64 > 0)
            q64++;
        return q64;
    }
    i128 q = n / d;
    if (n % d != 0 && n > 0)
        q++;
    if (q > INT64_MAX)
        return INT64_MAX;
    if (q < INT64_MIN)
        return INT64_MIN;
    return (int64_t)q;
}

static int valid(const qg_window_spec *s)
{
    return s->limit_milli > 0 && s->length_ms > 0;
}

/* Most the bucket may hold beyond S(now): tau plus what drains by the
 * end of time (see the top). */
static i128 fill_cap(const qg_window_spec *s)
{
    return (i128)burst_of(s) * s->length_ms +
           (i128)s->limit_milli * QG_TIME_MAX_MS;
}

int64_t qg__rate_admit_at(const qg_window_spec *s, qg_win_state *st,
                          const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = clamp_now(st, ctx);
    if (a <= 0)
        return now;
    if (!valid(s) || a > burst_of(s) || a > QG_AMOUNT_MAX_MILLI)
        return QG_NEVER;
    i128 P = s->length_ms, tau = (i128)burst_of(s) * P, sn = scaled(s, now);
    i128 tat = st->u.rate.tat > sn ? st->u.rate.tat : sn;
    if (tat + (i128)a * P - sn <= tau)
        return now;
    return ceil_div128(st->u.rate.tat + (i128)a * P - tau, s->limit_milli);
}

int qg__rate_charge(const qg_window_spec *s, qg_win_state *st,
                    const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = clamp_now(st, ctx);
    if (a <= 0 || !valid(s))
        return 0;
    if (a > QG_AMOUNT_MAX_MILLI)
        a = QG_AMOUNT_MAX_MILLI;
    i128 sn = scaled(s, now);
    i128 tat;
    if (st->u.rate.tat > sn) {
        tat = st->u.rate.tat;
    } else {
        tat = sn;
        st->u.rate.capped = 0;   /* drained: nothing cut is left */
    }
    tat += (i128)a * s->length_ms;
    /* the cap is at least limit * QG_TIME_MAX_MS >= QG_TIME_MAX_MS: a
     * fill below that (any real one) needs no multiplication */
    if (tat - sn > QG_TIME_MAX_MS && tat - sn > fill_cap(s)) {
        tat = sn + fill_cap(s);
        st->u.rate.capped = 1;
    }
    st->u.rate.tat = tat;
    return 0;
}

void qg__rate_adjust(const qg_window_spec *s, qg_win_state *st,
                     const qg_win_ctx *ctx, int64_t t0, int64_t delta)
{
    (void)t0;   /* a bucket has no per-charge record: settle the difference */
    int64_t now = clamp_now(st, ctx);
    if (!valid(s))
        return;
    if (delta > 0) {
        qg__rate_charge(s, st, ctx, delta);
        return;
    }
    /* Giving back: tat below S(now) simply means a full bucket, so the
     * result is floored there (which keeps it bounded).  A bucket that
     * was cut keeps its fill: its real fill is larger. */
    i128 sn = scaled(s, now);
    if (st->u.rate.capped && st->u.rate.tat > sn)
        return;
    st->u.rate.capped = 0;
    i128 d = -(i128)delta;
    if (d > QG_AMOUNT_MAX_MILLI)
        d = QG_AMOUNT_MAX_MILLI;
    st->u.rate.tat -= d * s->length_ms;
    if (st->u.rate.tat < sn)
        st->u.rate.tat = sn;
}

void qg__rate_view(const qg_window_spec *s, qg_win_state *st,
                   const qg_win_ctx *ctx, qg_window_view *out)
{
    int64_t now = clamp_now(st, ctx);
    int64_t burst = burst_of(s);
    out->limit_milli = burst;
    out->used_milli = 0;
    out->reset_at_ms = 0;
    if (valid(s)) {
        i128 fill = st->u.rate.tat - scaled(s, now);
        if (fill > 0) {
            /* Bucket fill in milli-units, rounded up (never under-report),
             * at most the bound. */
            out->used_milli = ceil_div128(fill, s->length_ms);
            if (out->used_milli > QG_AMOUNT_MAX_MILLI)
                out->used_milli = QG_AMOUNT_MAX_MILLI;
            out->reset_at_ms = ceil_div128(st->u.rate.tat, s->limit_milli);
            if (out->reset_at_ms > QG_TIME_MAX_MS)   /* a cut bucket */
                out->reset_at_ms = QG_TIME_MAX_MS;
        }
    }
    out->remaining_milli = burst > out->used_milli ? burst - out->used_milli : 0;
}

int qg__rate_recovery(const qg_window_spec *s, qg_win_state *st,
                      const qg_win_ctx *ctx, qg_recovery_point *pts, int max)
{
    qg_window_view v;
    qg__rate_view(s, st, ctx, &v);
    if (max <= 0 || v.reset_at_ms == 0)
        return 0;
    int64_t burst = v.limit_milli, cur = v.remaining_milli;
    i128 P = s->length_ms, tat = st->u.rate.tat;
    int n = 0;
    /* Levels evenly spaced from the current remaining up to the burst.
     * remaining(t) = burst - ceil((tat - S(t)) / P) >= r exactly when
     * tat - S(t) <= (burst - r) * P, so level r is reached at
     *     t_r = ceil((tat - (burst - r) * P) / limit_milli)
     * (r = burst gives reset_at). */
    for (int i = 1; i <= max; i++) {
        int64_t r = cur + (int64_t)(((i128)(burst - cur) * i + max - 1) / max);
        if (n > 0 && r <= pts[n - 1].remaining_milli)
            continue;
        pts[n].remaining_milli = r;
        pts[n].at_ms = ceil_div128(tat - (i128)(burst - r) * P, s->limit_milli);
        if (pts[n].at_ms > QG_TIME_MAX_MS) {
            /* a cut bucket: nothing comes back before the end of time */
            pts[n].at_ms = QG_TIME_MAX_MS;
            pts[n].remaining_milli = burst;
            n++;
            break;
        }
        n++;
    }
    return n;
}
