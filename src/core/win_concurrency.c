/* win_concurrency.c - concurrency windows: requests in flight as leases.
 *
 * A plan's `concurrency: N` holds N slots (limit_milli = N * 1000).  Each
 * admitted request takes a lease {rid, expires} that lasts lease_ttl_ms
 * (0 means 15 minutes), so a settle that never arrives cannot hold a slot
 * forever: leases with expires <= now are simply dropped.  A refused
 * request fits again at the earliest lease expiry (or sooner, by release).
 *
 * The lease array is small and unsorted (removal swaps with the last).  It
 * grows up to N + CONC_SLACK entries (forced charges may overshoot N) and
 * never beyond CONC_HARD_CAP; past that a charge fails with QG_EFULL. */
#include <stdlib.h>
#include <string.h>
#include "window.h"
#include "store.h"   /* QG_WIN_BORROWED */

#define CONC_DEFAULT_TTL_MS (15LL * 60 * 1000)
#define CONC_SLACK 16u
#define CONC_HARD_CAP 65536u

static int64_t slots_of(const qg_window_spec *s)
{
    return s->limit_milli > 0 ? s->limit_milli / 1000 : 0;
}

/* Clamp now, record it, and drop expired leases. */
static int64_t advance(qg_win_state *st, const qg_win_ctx *ctx)
{
    int64_t now = ctx->now_ms > st->u.conc.seen_ms ? ctx->now_ms
                                                   : st->u.conc.seen_ms;
    st->u.conc.seen_ms = now;
    uint32_t i = 0;
    while (i < st->u.conc.count) {
        if (st->u.conc.leases[i].expires_ms <= now)
            st->u.conc.leases[i] = st->u.conc.leases[--st->u.conc.count];
        else
            i++;
    }
    return now;
}

static int64_t earliest_expiry(const qg_win_state *st)
{
    int64_t e = 0;
    for (uint32_t i = 0; i < st->u.conc.count; i++)
        if (e == 0 || st->u.conc.leases[i].expires_ms < e)
            e = st->u.conc.leases[i].expires_ms;
    return e;
}

int64_t qg__concurrency_admit_at(const qg_window_spec *s, qg_win_state *st,
                                 const qg_win_ctx *ctx, int64_t a)
{
    int64_t now = advance(st, ctx);
    int64_t slots = slots_of(s);
    if (a <= 0 || (int64_t)st->u.conc.count < slots)
        return now;
    if (slots == 0)
        return QG_NEVER;
    /* Full: a slot frees when the earliest lease expires (if count exceeds
     * the slots after forced charges, several must go; count them off in
     * expiry order). */
    int64_t excess = (int64_t)st->u.conc.count - slots;  /* >= 0 */
    int64_t prev = INT64_MIN, t = 0;
    for (int64_t k = 0; k <= excess; ) {
        /* next distinct expiry after prev, and how many leases share it */
        int64_t nxt = INT64_MAX;
        uint32_t same = 0;
        for (uint32_t i = 0; i < st->u.conc.count; i++) {
            int64_t e = st->u.conc.leases[i].expires_ms;
            if (e > prev && e < nxt) {
                nxt = e;
                same = 1;
            } else if (e == nxt) {
                same++;
            }
        }
        t = nxt;
        prev = nxt;
        k += same;
    }
    return t;
}

int qg__concurrency_charge(const qg_window_spec *s, qg_win_state *st,
                           const qg_win_ctx *ctx, int64_t a)
{
    (void)a;   /* one lease per request whatever the amount */
    int64_t now = advance(st, ctx);
    int64_t ttl = s->lease_ttl_ms > 0 ? s->lease_ttl_ms : CONC_DEFAULT_TTL_MS;
    int64_t exp = now > INT64_MAX - ttl ? INT64_MAX : now + ttl;
    /* The same request charged again refreshes its lease. */
    for (uint32_t i = 0; i < st->u.conc.count; i++) {
        if (st->u.conc.leases[i].rid == ctx->rid) {
            st->u.conc.leases[i].expires_ms = exp;
            return 0;
        }
    }
    uint32_t cap = st->u.conc.cap & ~QG_WIN_BORROWED;
    if (st->u.conc.count == cap) {
        int64_t lim = slots_of(s) + CONC_SLACK;
        if (lim > CONC_HARD_CAP)
            lim = CONC_HARD_CAP;
        if ((int64_t)cap >= lim)
            return QG_EFULL;
        uint32_t nc = cap ? cap * 2 : 2;
        if ((int64_t)nc > lim)
            nc = (uint32_t)lim;
        qg_lease *n;
        if (st->u.conc.cap & QG_WIN_BORROWED) {
            /* Lent by the store (store.h): move to the heap. */
            if ((n = malloc((size_t)nc * sizeof *n)) != NULL)
                memcpy(n, st->u.conc.leases,
                       (size_t)st->u.conc.count * sizeof *n);
        } else {
            n = realloc(st->u.conc.leases, (size_t)nc * sizeof *n);
        }
        if (!n)
            return QG_ENOMEM;
        st->u.conc.leases = n;
        st->u.conc.cap = nc;
    }
    st->u.conc.leases[st->u.conc.count].rid = ctx->rid;
    st->u.conc.leases[st->u.conc.count].expires_ms = exp;
    st->u.conc.count++;
    return 0;
}

void qg__concurrency_adjust(const qg_window_spec *s, qg_win_state *st,
                            const qg_win_ctx *ctx, int64_t t0, int64_t delta)
{
    (void)s; (void)st; (void)ctx; (void)t0; (void)delta;
}

int qg__concurrency_release(const qg_window_spec *s, qg_win_state *st,
                            const qg_win_ctx *ctx)
{
    (void)s;
    advance(st, ctx);
    for (uint32_t i = 0; i < st->u.conc.count; i++) {
        if (st->u.conc.leases[i].rid == ctx->rid) {
            st->u.conc.leases[i] = st->u.conc.leases[--st->u.conc.count];
            return 1;
        }
    }
    return 0;
}

void qg__concurrency_view(const qg_window_spec *s, qg_win_state *st,
                          const qg_win_ctx *ctx, qg_window_view *out)
{
    advance(st, ctx);
    out->limit_milli = slots_of(s) * 1000;
    out->used_milli = (int64_t)st->u.conc.count * 1000;
    out->remaining_milli = out->limit_milli > out->used_milli
                               ? out->limit_milli - out->used_milli : 0;
    out->reset_at_ms = earliest_expiry(st);
}

int qg__concurrency_recovery(const qg_window_spec *s, qg_win_state *st,
                             const qg_win_ctx *ctx, qg_recovery_point *pts,
                             int max)
{
    advance(st, ctx);
    int64_t limit = slots_of(s) * 1000;
    int64_t used = (int64_t)st->u.conc.count * 1000;
    int64_t prev = limit > used ? limit - used : 0, prev_at = INT64_MIN;
    int64_t last_at = 0;
    int n = 0;
    /* Expiries in order (leases sharing an instant leave together); keep
     * the steps that raise remaining, the first max-1 of them and then the
     * final one, when every lease has gone. */
    for (;;) {
        int64_t nxt = INT64_MAX;
        uint32_t same = 0;
        for (uint32_t i = 0; i < st->u.conc.count; i++) {
            int64_t e = st->u.conc.leases[i].expires_ms;
            if (e > prev_at && e < nxt) {
                nxt = e;
                same = 1;
            } else if (e == nxt) {
                same++;
            }
        }
        if (same == 0)
            break;
        prev_at = last_at = nxt;
        used -= (int64_t)same * 1000;
        int64_t rem = limit > used ? limit - used : 0;
        if (rem > prev && n < max - 1) {
            pts[n].at_ms = nxt;
            pts[n].remaining_milli = rem;
            n++;
        }
        if (rem > prev)
            prev = rem;
    }
    if (last_at == 0 || limit == 0)
        return 0;
    if (n == 0 || pts[n - 1].at_ms != last_at) {
        pts[n].at_ms = last_at;
        pts[n].remaining_milli = limit;
        n++;
    }
    return n;
}

size_t qg__concurrency_bytes(const qg_window_spec *s, const qg_win_state *st)
{
    (void)s;
    return qg__lent_bytes(st->u.conc.cap, sizeof(qg_lease));
}

void qg__concurrency_free(qg_win_state *st)
{
    qg__lent_free(st->u.conc.leases, st->u.conc.cap);
    memset(st, 0, sizeof *st);
}
