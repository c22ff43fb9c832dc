/* keeper.h - the shared store's keeper thread (keeper.c): probes a store
 * that stopped answering or lost its data, charges back what was decided
 * locally meanwhile, applies settles that waited, rebuilds lost counters
 * from the ledger, and only then lets the workers use the store again.
 * Internal to src/server. */
#ifndef QG_KEEPER_H
#define QG_KEEPER_H

#include "gate.h"
#include "server.h"

/* Start the keeper of s's store (NULL: out of memory or no thread). */
qg__keeper *qg__keeper_new(qg_server *s);
/* A worker met QG_ESTORE (the store does not answer) or QG_ESTATE (it
 * lost its data): the workers decide locally from now on, the keeper
 * probes.  Thread-safe. */
void qg__keeper_report(qg__keeper *k, int rc);
/* A settle that could not reach the store (nobody waits for it): applied
 * (and its row written) once the store answers again.  0, or QG_EFULL.
 * Thread-safe. */
int qg__keeper_hold_settle(qg__keeper *k, const qg__settle *st);
/* A check the store may have applied although this instance answered
 * it otherwise (its call failed, then the request was refused locally or
 * answered 503): once the store answers again, whatever it charged for
 * request_id is taken back (a settle with nothing charged; no ledger
 * row: the ledger holds the answer the caller got).  0, or QG_EFULL.
 * Thread-safe. */
int qg__keeper_hold_void(qg__keeper *k, const char *request_id,
                         const char *subject, int64_t now_ms);
/* Stop the thread (settles still waiting are logged and dropped: their
 * reservations stand until their leases end). */
void qg__keeper_free(qg__keeper *k);

#endif
