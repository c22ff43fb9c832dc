/* fallback.h - decisions while the shared store is down (PRODUCT.md 5.1
 * point 4, `down: local`): conservative local limits, without I/O.
 *
 * While the gateway reaches its store, the engine notes each member's and
 * org's last views (what each window had left): the view the store
 * decided last by its own clock, since answers of several connections
 * are handled in any order (an older one never loosens a view).  An
 * answer that arrives during an outage lowers the budgets to share x
 * what it says is left (a check in flight that the store still applied
 * is not granted again locally).  When the store is down,
 * a subject's first local decision freezes, per window, a budget of
 * share x what the window had left in that last view (the whole limit
 * for a subject this instance never saw): weight and request windows
 * (rolling, calendar, session) admit at most that budget for the rest of
 * the outage, nothing comes back meanwhile; rate windows run at share x
 * their rate and burst, starting from share x the bucket that was left;
 * concurrency allows share x its slots, at least one.  Tighter, never
 * looser: with share <= 1 / instances no window is over-admitted across
 * the deployment (by the views each instance saw), and a subject refused
 * before the outage (nothing left) stays refused.  payg lifts nothing in
 * fallback.
 *
 * Every request admitted locally is journalled; when the store answers
 * again, the journal is handed over request by request (as restores, with
 * the request ids, so a store that already holds one leaves it alone:
 * charged exactly once), and the local state is dropped.
 *
 * Thread-safe: one mutex (fallback decisions are the exception). */
#ifndef QG_FALLBACK_H
#define QG_FALLBACK_H

#include <stdint.h>
#include "quotagate.h"
#include "rules.h"
#include "store.h"

typedef struct qg__fallback qg__fallback;

/* A fallback keeping the last views of at most max_subjects members and
 * orgs (0: 262144).  NULL out of memory. */
qg__fallback *qg__fallback_new(uint32_t max_subjects);
void qg__fallback_free(qg__fallback *f);

/* The store answered decision d (a check, a usage read) of this member
 * (and org): keep what its windows had left. */
void qg__fallback_note(qg__fallback *f, const qg_store_check *in,
                       const qg_decision *d);

/* Decide locally, as the store would have been asked to (in), with share
 * in milli (1..1000); the request's names are for the journal.  Fills
 * out's outcome, weight, binding, retry_after, views; returns 0 or
 * QG_ENOMEM / QG_EFULL (the journal is full: refuse rather than admit
 * unjournalled). */
int qg__fallback_check(qg__fallback *f, const qg_store_check *in,
                       int64_t share_milli, const char *subject,
                       const char *request_id, const char *model,
                       qg_decision *out);

/* Settle a request admitted in fallback (QG_ENOTFOUND for another):
 * the journal keeps the final charge, the budgets get the difference, the
 * lease is freed. */
int qg__fallback_settle(qg__fallback *f, const qg_store_settle *in,
                        int64_t actual_milli, qg_settle_result *out);

/* Whether a request id was admitted in fallback (and not yet handed
 * over); and its model's name ("" weight-only): 0 or QG_ENOTFOUND. */
int qg__fallback_knows(qg__fallback *f, qg_key rid);
int qg__fallback_model(qg__fallback *f, qg_key rid, char *model,
                       size_t cap);

/* The journal, oldest first: each admitted request as a restore of the
 * engine (charged_milli the final charge, settled when it was), handed
 * to fn; fn returns 0 to go on (the entry is dropped), or an error to
 * stop (the entry and the rest stay for the next try).  When the journal
 * is empty the local state is dropped, and each view keeps what the
 * outage spent, counted for every instance (used / share): an outage that
 * follows before a fresh view grants no allowance twice.
 * Returns 0, or fn's error. */
int qg__fallback_drain(qg__fallback *f,
                       int (*fn)(const qg_restore_req *rr, void *ud),
                       void *ud);

/* Requests journalled and not yet handed over; decisions made locally. */
uint64_t qg__fallback_pending(qg__fallback *f);
/* End the outage's local decisions when the journal is empty (returns 1;
 * from then on qg__fallback_check is QG_ESTATE: ask the store), else 0
 * (drain again).  open: a new outage, local decisions again. */
int qg__fallback_close(qg__fallback *f);
void qg__fallback_open(qg__fallback *f);
uint64_t qg__fallback_decisions(qg__fallback *f);

#endif
