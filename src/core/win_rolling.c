/* win_rolling.c - rolling windows: a charge at t counts while t > now - L.
 *
 * State is a ring of (t, amount) entries, oldest first, with charges in the
 * same millisecond coalesced into one entry, plus their running total.  A
 * charge therefore stops counting at exactly t + L, and the earliest instant
 * a refused amount fits is the expiry t + L of the entry whose departure
 * frees enough room (see roll_admit_at).
 *
 * Memory is bounded.  The ring starts at 4 entries and doubles up to
 * M = spec->max_entries (0 means 1024; values below 16 are raised to 16,
 * and M never exceeds ROLL_HARD_CAP).  When a charge would need an (M+1)th
 * distinct entry the ring is COMPACTED: every entry's time is rounded UP to
 * a grid of g = ceil(L / (M/2)) ms and entries equal after rounding merge.
 * Moving a charge later only makes it expire later, so the window may admit
 * less than an exact log, never more.  Error bound: the window is exact
 * until a subject has more than M distinct charge instants inside one window
 * length; past that, a charge may count for at most g ms longer than exact
 * (g doubles only in the pathological case that one pass did not free room,
 * which cannot happen with clamped time and M >= 16).
 *
 * Bucketed mode (precision_ms = p > 0): each charge time is rounded up to a
 * multiple of p before it is stored (the same conservative direction), so at
 * most L/p + 1 entries are live; the same cap and compaction still apply.
 *
 * Bounds (quotagate.h): amounts are clamped to QG_AMOUNT_MAX_MILLI, and
 * both an entry and the total saturate there, so nothing can wrap however
 * many charges are forced in (rebuilds, recovered settles).  Invariant:
 * total = min(bound, sum of entries), each entry min(bound, its charges).
 * Below the bound the total is therefore exact, and when it sits at the
 * bound the exact sum is recomputed from the entries (only then: an
 * absurd state) as entries leave.  An entry that reached the bound keeps
 * it against refunds (its real amount is unknown and larger), which can
 * only refuse more.  Since limits never exceed the bound, a saturated
 * window refuses every positive amount until enough entries expire,
 * exactly when the unbounded sums would have.
 *
 * Clamping: the state has no seen_ms field, so the newest instant it has
 * seen is derived as newest entry time minus a slack kept in roll.pad (how
 * far rounding moved the newest entry past the real newest charge instant;
 * saturated at UINT32_MAX, which only makes the clamp weaker, never wrong).
 * Clamping now to a LOWER bound of the real newest instant is always safe:
 * it can only prune less. */
#include <stdlib.h>
#include <string.h>
#include "window.h"
#include "fixed.h"
#include "store.h"   /* QG_WIN_BORROWED */

#define ROLL_START_CAP 4u
#define ROLL_MIN_MAX 16u
#define ROLL_DEFAULT_MAX 1024u
#define ROLL_HARD_CAP (1u << 20)   /* 16 MiB of entries per subject, max */

static int64_t sat_add(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    return a + b;
}

#define AMAX QG_AMOUNT_MAX_MILLI

static uint32_t max_entries(const qg_window_spec *s)
{
    uint32_t m = s->max_entries ? s->max_entries : ROLL_DEFAULT_MAX;
    if (m < ROLL_MIN_MAX)
        m = ROLL_MIN_MAX;
    if (m > ROLL_HARD_CAP)
        m = ROLL_HARD_CAP;
    return m;
}

/* Ring capacity without the borrowed bit (store.h). */
static uint32_t rcap(const qg_win_state *st)
{
    return st->u.roll.cap & ~QG_WIN_BORROWED;
}

/* i-th entry counting from the oldest. */
static qg_roll_entry *ent(const qg_win_state *st, uint32_t i)
{
    uint32_t k = st->u.roll.head + i;
    if (k >= rcap(st))
        k -= rcap(st);
    return &st->u.roll.ring[k];
}

/* Lower bound of the newest instant this state has seen. */
static int64_t clamp_now(const qg_win_state *st, int64_t now)
{
    if (st->u.roll.count == 0)
        return now;
    int64_t seen = ent(st, st->u.roll.count - 1)->t_ms - (int64_t)st->u.roll.pad;
    return now > seen ? now : seen;
}

/* min(bound, sum of the entries), stopping once the bound is reached. */
static int64_t resum(const qg_win_state *st)
{
    int64_t t = 0;
    for (uint32_t i = 0; i < st->u.roll.count && t < AMAX; i++)
        t = qg__amount_add(t, ent(st, i)->amount_milli);
    return t;
}

/* The exact sum of the entries, for a total at the bound. */
static __int128 exact_sum(const qg_win_state *st)
{
    __int128 t = 0;
    for (uint32_t i = 0; i < st->u.roll.count; i++)
        t += ent(st, i)->amount_milli;
    return t;
}

/* Drop entries that no longer count: t + L <= now (prune, below). */
static void prune_slow(const qg_window_spec *s, qg_win_state *st,
                       int64_t now)
{
    int saturated = st->u.roll.total_milli >= AMAX, dropped = 0;
    while (st->u.roll.count) {
        qg_roll_entry *e = ent(st, 0);
        if (sat_add(e->t_ms, s->length_ms) > now)
            break;
        if (!saturated)
            st->u.roll.total_milli -= e->amount_milli;
        dropped = 1;
        st->u.roll.head = st->u.roll.head + 1 == rcap(st)
                              ? 0 : st->u.roll.head + 1;
        st->u.roll.count--;
    }
    if (st->u.roll.count == 0) {
        st->u.roll.head = 0;
        st->u.roll.total_milli = 0;
        st->u.roll.pad = 0;
    } else if (saturated && dropped) {
        st->u.roll.total_milli = resum(st);
    }
}

/* Drop entries that no longer count.  A decision calls it for each of
 * its steps (admit, charge, view) and most find the oldest entry still
 * counting: that test inline, the walk out of line. */
static inline void prune(const qg_window_spec *s, qg_win_state *st,
                         int64_t now)
{
    if (st->u.roll.count && sat_add(ent(st, 0)->t_ms, s->length_ms) > now)
        return;
    prune_slow(s, st, now);
}

/* Reallocate the ring to newcap (>= count), oldest entry at index 0. */
static int resize(qg_win_state *st, uint32_t newcap)
{
    qg_roll_entry *n = malloc((size_t)newcap * sizeof *n);
    if (!n)
        return QG_ENOMEM;
    for (uint32_t i = 0; i < st->u.roll.count; i++)
        n[i] = *ent(st, i);
    if (!(st->u.roll.cap & QG_WIN_BORROWED))
        free(st->u.roll.ring);
    st->u.roll.ring = n;
    st->u.roll.cap = newcap;
    st->u.roll.head = 0;
    return 0;
}

/* Round every entry's time up to a multiple of g and merge equal ones, in
 * place (the write index never overtakes the read index). */
static void compact(qg_win_state *st, int64_t g)
{
    int64_t seen = ent(st, st->u.roll.count - 1)->t_ms - (int64_t)st->u.roll.pad;
    uint32_t w = 0;
    for (uint32_t r = 0; r < st->u.roll.count; r++) {
        qg_roll_entry e = *ent(st, r);
        e.t_ms = qg__ceil_div(e.t_ms, g) * g;
        if (w > 0 && ent(st, w - 1)->t_ms == e.t_ms)
            ent(st, w - 1)->amount_milli =
                qg__amount_add(ent(st, w - 1)->amount_milli, e.amount_milli);
        else
            *ent(st, w++) = e;
    }
    st->u.roll.count = w;
    int64_t slack = ent(st, w - 1)->t_ms - seen;
    st->u.roll.pad = slack > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)slack;
}

int64_t qg__rolling_admit_at(const qg_window_spec *s, qg_win_state *st,
                             const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = clamp_now(st, ctx->now_ms);
    prune(s, st, now);
    /* a <= limit - total: no addition that could wrap (both are >= 0) */
    if (a <= 0 || a <= s->limit_milli - st->u.roll.total_milli)
        return now;
    if (a > s->limit_milli || a > AMAX)
        return QG_NEVER;
    /* Room is needed for `a`: entries leave oldest first, entry e at exactly
     * e.t + L (at that instant t > now - L no longer holds).  The answer is
     * the departure that first brings total - freed + a within the limit;
     * one millisecond earlier that entry still counts, so it is exact. */
    if (st->u.roll.total_milli < AMAX) {
        int64_t freed = 0;
        for (uint32_t i = 0; i < st->u.roll.count; i++) {
            const qg_roll_entry *e = ent(st, i);
            freed += e->amount_milli;
            if (st->u.roll.total_milli - freed + a <= s->limit_milli)
                return sat_add(e->t_ms, s->length_ms);
        }
        return QG_NEVER; /* unreachable: freeing all leaves a <= limit */
    }
    /* At the bound: the same walk over the exact sum of the entries. */
    __int128 rest = exact_sum(st);
    for (uint32_t i = 0; i < st->u.roll.count; i++) {
        const qg_roll_entry *e = ent(st, i);
        rest -= e->amount_milli;
        if (rest + a <= s->limit_milli)
            return sat_add(e->t_ms, s->length_ms);
    }
    return QG_NEVER;
}

int qg__rolling_charge(const qg_window_spec *s, qg_win_state *st,
                       const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = clamp_now(st, ctx->now_ms);
    prune(s, st, now);
    /* A zero charge is still recorded: a settle may add to it later, and
     * its entry is where that addition belongs. */
    if (a < 0)
        return 0;
    if (a > AMAX)
        a = AMAX;
    /* Conservative storage time: rounded up to the precision grid, and
     * never before the newest entry (time presented out of order joins the
     * newest entry, i.e. counts a little longer, never shorter). */
    int64_t t = now;
    if (s->precision_ms > 0)
        t = qg__ceil_div(now, s->precision_ms) * s->precision_ms;
    uint32_t n = st->u.roll.count;
    if (n && ent(st, n - 1)->t_ms >= t) {
        qg_roll_entry *last = ent(st, n - 1);
        last->amount_milli = qg__amount_add(last->amount_milli, a);
        st->u.roll.total_milli = qg__amount_add(st->u.roll.total_milli, a);
        /* The newest seen instant becomes max(old, now); keep its slack. */
        int64_t seen_old = last->t_ms - (int64_t)st->u.roll.pad;
        int64_t seen = now > seen_old ? now : seen_old;
        int64_t sl = last->t_ms - seen;
        st->u.roll.pad = sl > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)sl;
        return 0;
    }
    uint32_t m = max_entries(s);
    if (n >= m) {
        /* g = ceil(L / (M/2)): after rounding, the live span (now - L, now]
         * holds at most M/2 + 2 grid points, leaving room to append. */
        int64_t g = qg__ceil_div(s->length_ms > 0 ? s->length_ms : 1,
                                (int64_t)(m / 2));
        if (g < 1)
            g = 1;
        while (st->u.roll.count >= m) {
            compact(st, g);
            if (g > INT64_MAX / 4)
                break;
            g *= 2;
        }
        n = st->u.roll.count;
        if (n >= m)
            return QG_EFULL;   /* cannot happen with sane times */
        /* The rounded newest entry may now lie at or after t: join it. */
        if (n && ent(st, n - 1)->t_ms >= t)
            return qg__rolling_charge(s, st, ctx, a);
    }
    if (n == rcap(st)) {
        uint32_t nc = rcap(st) ? rcap(st) * 2 : ROLL_START_CAP;
        if (nc > m)
            nc = m;
        int rc = resize(st, nc);
        if (rc)
            return rc;
    } else if (rcap(st) > 4 * ROLL_START_CAP &&
               (n + 1) * 4 <= rcap(st)) {
        /* Mostly empty after a burst expired: give memory back.  A failed
         * shrink is harmless. */
        (void)resize(st, rcap(st) / 2);
    }
    qg_roll_entry *e = ent(st, n);
    e->t_ms = t;
    e->amount_milli = a;
    st->u.roll.count = n + 1;
    st->u.roll.total_milli = qg__amount_add(st->u.roll.total_milli, a);
    int64_t sl = t - now;
    st->u.roll.pad = sl > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)sl;
    return 0;
}

void qg__rolling_adjust(const qg_window_spec *s, qg_win_state *st,
                        const qg_win_ctx *ctx, int64_t t0, int64_t delta)
{
    int64_t now = clamp_now(st, ctx->now_ms);
    prune(s, st, now);
    /* A charge made at t0 expired at t0 + L: leave it alone after that. */
    if (sat_add(t0, s->length_ms) <= now)
        return;
    /* The charge lives in the first entry with t >= t0: storage only ever
     * moves a charge later, and merges keep the order.  A settle names a
     * recent charge, near the log's end: gallop back from the end (the
     * entries there are in cache) to bracket it, then bisect. */
    uint32_t lo = 0, hi = st->u.roll.count;
    for (uint32_t step = 1; hi > lo;) {
        uint32_t i = hi > step ? hi - step : 0;
        if (ent(st, i)->t_ms < t0) {
            lo = i + 1;
            break;
        }
        hi = i;
        step *= 2;
    }
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ent(st, mid)->t_ms < t0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == st->u.roll.count)
        return;
    qg_roll_entry *e = ent(st, lo);
    int64_t v;
    if (delta > 0) {
        v = qg__amount_add(e->amount_milli, delta);
    } else {
        if (e->amount_milli >= AMAX)
            return;            /* saturated: its real amount is unknown */
        v = e->amount_milli + delta;
        if (v < 0)
            v = 0;
    }
    if (st->u.roll.total_milli < AMAX) {
        /* exact below the bound: both amounts are within it */
        st->u.roll.total_milli =
            qg__amount_add(st->u.roll.total_milli - e->amount_milli, v);
        e->amount_milli = v;
    } else {
        e->amount_milli = v;
        if (delta < 0)
            st->u.roll.total_milli = resum(st);
    }
}

void qg__rolling_view(const qg_window_spec *s, qg_win_state *st,
                      const qg_win_ctx *ctx, qg_window_view *out)
{
    int64_t now = clamp_now(st, ctx->now_ms);
    prune(s, st, now);
    out->limit_milli = s->limit_milli;
    out->used_milli = st->u.roll.total_milli;
    out->remaining_milli = s->limit_milli > out->used_milli
                               ? s->limit_milli - out->used_milli : 0;
    out->reset_at_ms = 0;
    /* When used next falls: the first entry that still carries an amount
     * (an adjustment may have zeroed older ones). */
    for (uint32_t i = 0; i < st->u.roll.count; i++) {
        const qg_roll_entry *e = ent(st, i);
        if (e->amount_milli > 0) {
            out->reset_at_ms = sat_add(e->t_ms, s->length_ms);
            break;
        }
    }
}

int qg__rolling_recovery(const qg_window_spec *s, qg_win_state *st,
                         const qg_win_ctx *ctx, qg_recovery_point *pts, int max)
{
    int64_t now = clamp_now(st, ctx->now_ms);
    prune(s, st, now);
    /* exact: at the bound, the sum of the entries */
    __int128 used = st->u.roll.total_milli < AMAX ? st->u.roll.total_milli
                                                  : exact_sum(st);
    int64_t prev = s->limit_milli > used ? (int64_t)(s->limit_milli - used)
                                         : 0;
    int n = 0;
    int64_t final_at = 0;
    /* Each entry's departure t + L gives back its amount; only departures
     * that raise remaining are steps.  Keep the first max-1 steps and the
     * final one (full recovery), so the last point is always the latter. */
    for (uint32_t i = 0; i < st->u.roll.count && n < max - 1; i++) {
        const qg_roll_entry *e = ent(st, i);
        if (e->amount_milli <= 0)
            continue;
        used -= e->amount_milli;
        int64_t rem = s->limit_milli > used ? (int64_t)(s->limit_milli - used)
                                            : 0;
        if (rem > prev) {
            pts[n].at_ms = sat_add(e->t_ms, s->length_ms);
            pts[n].remaining_milli = rem;
            n++;
            prev = rem;
        }
    }
    /* Full recovery: the departure of the newest entry that holds any
     * amount.  Found from the newest end, so a refusal on a heavy subject
     * costs O(max), not O(entries). */
    for (uint32_t i = st->u.roll.count; i-- > 0;)
        if (ent(st, i)->amount_milli > 0) {
            final_at = sat_add(ent(st, i)->t_ms, s->length_ms);
            break;
        }
    if (final_at == 0)
        return n;
    if (n == 0 || pts[n - 1].at_ms != final_at) {
        pts[n].at_ms = final_at;
        pts[n].remaining_milli = s->limit_milli;
        n++;
    }
    return n;
}

size_t qg__rolling_bytes(const qg_window_spec *s, const qg_win_state *st)
{
    (void)s;
    return qg__lent_bytes(st->u.roll.cap, sizeof(qg_roll_entry));
}

void qg__rolling_free(qg_win_state *st)
{
    qg__lent_free(st->u.roll.ring, st->u.roll.cap);
    memset(st, 0, sizeof *st);
}
