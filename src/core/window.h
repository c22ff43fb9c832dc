/* window.h - per-subject state of one window, and the operations on it.
 *
 * Each window type (rolling, calendar, session, rate, concurrency) keeps a
 * small state struct and implements the same operations, dispatched on
 * spec->type in window.c.  These are pure functions of (spec, state, now):
 * no locks, no clock, no I/O.  A store calls them under its own lock (the
 * memory store) or mirrors them in a server-side script (Redis).
 *
 * Amounts are milli-units of the window's unit: for QG_UNIT_WEIGHT the
 * request's weight, for QG_UNIT_REQUESTS always 1000 per request.
 *
 * Time may be presented out of order by a caller; every operation first
 * clamps now to the newest instant the state has seen, so state never
 * moves backwards. */
#ifndef QG_WINDOW_H
#define QG_WINDOW_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"
#include "rules.h"

#define QG_NEVER INT64_MAX    /* "no time at which it fits" */

typedef struct qg_roll_entry {
    int64_t t_ms;             /* instant of the charge */
    int64_t amount_milli;     /* charged at t_ms (coalesced per ms) */
} qg_roll_entry;

typedef struct qg_lease {
    uint64_t rid;             /* low 64 bits of the request id hash */
    int64_t expires_ms;
} qg_lease;

/* 32 bytes whatever the type.  Owned by whoever holds the subject.
 * Amounts in the states never exceed QG_AMOUNT_MAX_MILLI (quotagate.h):
 * forced charges saturate there (each win_*.c says how). */
typedef struct qg_win_state {
    union {
        struct {              /* rolling: ring of entries, oldest at head */
            qg_roll_entry *ring;
            uint32_t cap, head, count;
            uint32_t pad;
            int64_t total_milli;  /* sum of amounts in the ring */
        } roll;
        struct {              /* calendar: the cached current period */
            int64_t start_ms, end_ms;
            int64_t used_milli;
        } cal;
        struct {              /* session: open since start_ms, 0 = none */
            int64_t start_ms;
            int64_t used_milli;
            int64_t seen_ms;
        } sess;
        struct {              /* rate: GCRA theoretical arrival time, in
                                 scaled units of ms * limit_milli */
            __int128 tat;
            int64_t seen_ms;
            int64_t capped;   /* 1: tat was cut at the bound (win_rate.c) */
        } rate;
        struct {              /* concurrency: active leases */
            qg_lease *leases;
            uint32_t count, cap;
            int64_t seen_ms;
        } conc;
    } u;
} qg_win_state;
_Static_assert(sizeof(qg_win_state) == 32, "window states are 32 bytes");

/* Inputs that are not part of the state. */
typedef struct qg_win_ctx {
    int64_t now_ms;
    int64_t anchor_ms;        /* subject's billing anchor (calendar) */
    uint64_t rid;             /* request id (concurrency leases) */
} qg_win_ctx;

/* Amount a request of weight w puts on window spec. */
static inline int64_t qg__win_amount(const qg_window_spec *s, int64_t w)
{
    return s->unit == QG_UNIT_REQUESTS || s->type == QG_WIN_CONCURRENCY
               ? 1000 : w;
}

/* Earliest instant >= now at which `amount` fits, assuming nothing else is
 * charged meanwhile; ctx->now_ms when it fits now; QG_NEVER when it can
 * never fit (amount exceeds the limit or the burst).  May drop expired
 * state (that is why the state is not const).  Amounts <= 0 always fit
 * now. */
int64_t qg__win_admit_at(const qg_window_spec *s, qg_win_state *st,
                        const qg_win_ctx *ctx, int64_t amount_milli);

/* Record a charge of `amount` at ctx->now_ms (call only after admit_at
 * returned now, or to force a charge).  Returns 0, or QG_ENOMEM, QG_EFULL
 * (a lease array at its cap) or QG_EINVAL (a calendar period that cannot
 * be computed), in which case nothing was recorded. */
int qg__win_charge(const qg_window_spec *s, qg_win_state *st,
                  const qg_win_ctx *ctx, int64_t amount_milli);

/* Change a charge made at t0_ms by delta (settle: actual - reserved).  A
 * charge whose window has since expired or reset is left alone.  The
 * usage may exceed the limit after a positive delta. */
void qg__win_adjust(const qg_window_spec *s, qg_win_state *st,
                   const qg_win_ctx *ctx, int64_t t0_ms, int64_t delta_milli);

/* Concurrency: free the lease of ctx->rid (no-op for other types or when
 * absent).  Returns 1 when a lease was freed. */
int qg__win_release(const qg_window_spec *s, qg_win_state *st,
                   const qg_win_ctx *ctx);

/* Fill a view of the window at ctx->now_ms. */
void qg__win_view(const qg_window_spec *s, qg_win_state *st,
                 const qg_win_ctx *ctx, qg_window_view *out);

/* Up to `max` future steps at which remaining grows, earliest first; the
 * last step written is when the window is fully recovered (or the point
 * where `max` ran out).  Returns the number written. */
int qg__win_recovery(const qg_window_spec *s, qg_win_state *st,
                    const qg_win_ctx *ctx, qg_recovery_point *pts, int max);

/* Heap bytes held by the state (not counting the 32-byte struct). */
size_t qg__win_bytes(const qg_window_spec *s, const qg_win_state *st);

/* Release heap memory; the state is left zeroed. */
void qg__win_free(const qg_window_spec *s, qg_win_state *st);

/* The same two by type alone, for holders of state that may outlive the
 * rules that described it (a store across a rules reload). */
size_t qg__win_bytes_type(qg_win_type t, const qg_win_state *st);
void qg__win_free_type(qg_win_type t, qg_win_state *st);

/* Per-type implementations, called by the dispatchers in window.c. */
#define QG__WIN_OPS(T)                                                        \
    int64_t qg__##T##_admit_at(const qg_window_spec *, qg_win_state *,       \
                               const qg_win_ctx *, int64_t);                  \
    int qg__##T##_charge(const qg_window_spec *, qg_win_state *,             \
                         const qg_win_ctx *, int64_t);                        \
    void qg__##T##_adjust(const qg_window_spec *, qg_win_state *,            \
                          const qg_win_ctx *, int64_t, int64_t);              \
    void qg__##T##_view(const qg_window_spec *, qg_win_state *,              \
                        const qg_win_ctx *, qg_window_view *);                \
    int qg__##T##_recovery(const qg_window_spec *, qg_win_state *,           \
                           const qg_win_ctx *, qg_recovery_point *, int);
QG__WIN_OPS(rolling)
QG__WIN_OPS(calendar)
QG__WIN_OPS(session)
QG__WIN_OPS(rate)
QG__WIN_OPS(concurrency)
#undef QG__WIN_OPS
int qg__concurrency_release(const qg_window_spec *, qg_win_state *,
                            const qg_win_ctx *);
/* Heap bytes of an array of cap elements, 0 when the memory is lent by
 * the store (QG_WIN_BORROWED: counted in the lender's block); and its
 * release (lent memory is not the window's to free). */
size_t qg__lent_bytes(uint32_t cap, size_t elem);
void qg__lent_free(void *p, uint32_t cap);
size_t qg__rolling_bytes(const qg_window_spec *, const qg_win_state *);
void qg__rolling_free(qg_win_state *);
size_t qg__concurrency_bytes(const qg_window_spec *, const qg_win_state *);
void qg__concurrency_free(qg_win_state *);

/* The longest time a charge can still matter to one of the n windows w:
 * rolling and session their length, calendar two, eight or 32 days (day,
 * week, month), rate the drain of a full bucket, concurrency the lease
 * (engine.c; a rebuild and a reconciliation read the ledger that far
 * back). */
int64_t qg__window_reach(const qg_window_spec *w, int n);

#endif
