/* decide.h - one decision over all windows of a member and its org.
 *
 * Pure: the caller (a store) gathers the window states of the member and
 * of its org under its lock and calls qg__decide(), which either charges
 * every applicable window or none.  The answer names the binding window
 * and the exact instant the same request would fit: each window's
 * earliest-fit instant is monotone (once a window would admit the request
 * at t, it admits it at every later t if nothing else is charged), so the
 * instant every window admits is the latest of the per-window instants. */
#ifndef QG_DECIDE_H
#define QG_DECIDE_H

#include "quotagate.h"
#include "payg.h"
#include "rules.h"
#include "window.h"

typedef struct qg_decide_in {
    int n;                                  /* windows, member first */
    const qg_window_spec *spec[QG_MAX_VIEWS];
    qg_win_state *state[QG_MAX_VIEWS];
    unsigned char org[QG_MAX_VIEWS];        /* 1 = org window */
    qg_win_ctx ctx[2];                      /* [0] member, [1] org */
    int model;                              /* -1 weight-only */
    int64_t weight_milli;
    /* Pay as you go: windows in `soft` (bit i = window i) are lifted:
     * they never refuse, and what the request takes beyond the least room
     * left among them is overage, priced at price_micro per point and
     * added to *spent_micro, unless that would pass cap_micro (when > 0):
     * then the request is refused with cap_reached.  soft = 0: none. */
    uint32_t soft;
    int64_t price_micro, cap_micro, cap_end_ms;
    int64_t *spent_micro;
} qg_decide_in;

/* Append windows to in (member: org = 0).  Returns 0, or QG_EINVAL when
 * there would be more than QG_MAX_VIEWS. */
int qg__decide_add(qg_decide_in *in, const qg_window_spec *specs, int n,
                  qg_win_state *states, int org);

/* Decide; when every window admits, charge them all (all or nothing).
 * Fills outcome, weight, retry_after, binding, views, and the recovery
 * schedules on refusal.  Returns 0, or QG_ENOMEM / QG_EFULL when a window
 * could not record the charge (then nothing is charged). */
int qg__decide(qg_decide_in *in, qg_decision *out);


/* Views (and recovery schedules when with_recovery) without deciding. */
void qg__decide_views(qg_decide_in *in, qg_decision *out, int with_recovery);

/* Settle: adjust every window applicable to the model by delta (amounts
 * per window unit: request-unit windows do not change) for a charge made
 * at t0, and free the request's concurrency lease. */
void qg__decide_settle(qg_decide_in *in, int64_t t0_ms, int64_t delta_milli);

#endif
