/* reconcile.h - counters against the ledger, without I/O (PRODUCT.md 5.2,
 * docs/reconcile.md).
 *
 * The caller supplies the ledger's rows (a scan callback), a way to wait
 * until every row decided so far is readable, fresh engines (the same
 * rules and subjects over an empty in-process store) and the clock; this
 * file measures the live engine's counters, replays the rows into the
 * fresh engines with qg_engine_restore (the rebuild's own call, so there
 * is one semantics), compares window by window and, when asked, restores
 * into the live store the rows it does not know.  The server
 * (src/server/reconcile_run.c) gives it the ledger and the engine of a
 * running gateway or of `quotagate reconcile`. */
#ifndef QG_RECONCILE_H
#define QG_RECONCILE_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"

/* One admitted ledger row: the rebuild's restore request of the row as it
 * is now (its strings borrowed for the callback's duration), when it was
 * settled (0: not yet). */
typedef struct qg_recon_row {
    qg_restore_req rr;
    int64_t settled_ms;
} qg_recon_row;

typedef int (*qg_recon_row_fn)(const qg_recon_row *row, void *arg);

typedef struct qg_recon_src {
    /* every admitted row decided at or after since_ms, in decision order;
     * fn returns 0 to go on, else the scan stops and returns it */
    int (*scan)(void *ud, int64_t since_ms, qg_recon_row_fn fn, void *arg);
    /* return once every row submitted before the call can be scanned
     * (the ledger writer's queue drained past this point): 0 or an error
     * with the reason in err */
    int (*catch_up)(void *ud, char *err, size_t errcap);
    /* a new engine with the live one's rules and subjects over an empty
     * in-process store; NULL with err; fresh_free frees it */
    qg_engine *(*fresh)(void *ud, char *err, size_t errcap);
    void (*fresh_free)(void *ud, qg_engine *e);
    /* the instant, ms since the epoch (time is a parameter) */
    int64_t (*now)(void *ud);
    void *ud;
} qg_recon_src;

typedef struct qg_recon_opts {
    const char *subject;        /* NULL: every subject with rows */
    int repair;
    int64_t tolerance_milli;    /* |drift| above this is reported */
    /* How far from the instant compared a decision or settle may still be
     * on its way between the store and the ledger (its instant taken on
     * one side, applied on the other a moment later): a window whose
     * store figure lies between the least and the most the ledger's rows
     * allow with every such row counted either way has no drift, and a
     * lost row is named only when it is older than this.  0: exact. */
    int64_t margin_ms;
} qg_recon_opts;

/* The row as it stood at cut_ms: 0 when it was decided after cut_ms (not
 * counted), else 1 with *out its restore request then (settled after
 * cut_ms: still a reservation of its reserved weight). */
int qg__recon_row_at(const qg_recon_row *row, int64_t cut_ms,
                     qg_restore_req *out);

/* 1 when a drift is beyond the tolerance (|drift| > tolerance). */
int qg__recon_exceeds(int64_t drift_milli, int64_t tolerance_milli);

/* Compare one entity's windows: the store's views (the live engine's,
 * nstore of them, all of one side) against ledger, a fresh engine's views
 * of the same subject at the same instant, side 0 the subject's own
 * windows, 1 its org's; matched by name (a window the ledger's views lack
 * counts 0).  Calls fn for every store window (drift = store - ledger)
 * and returns how many were compared. */
int qg__recon_compare(const qg_window_view *store, int nstore,
                      const qg_decision *ledger, int side,
                      void (*fn)(int i, int64_t ledger_milli, void *arg),
                      void *arg);

/* Run one reconciliation (module comment).  Returns 0 with *out (free
 * with qg_reconcile_report_free), or QG_ENOSUBJECT (o->subject is
 * neither in the ledger nor decided by the rules), QG_ESTORE, QG_EIO,
 * QG_ENOMEM with the reason in err.  Thread-safe as the engine is. */
int qg__reconcile(qg_engine *live, const qg_recon_src *src,
                  const qg_recon_opts *o, qg_reconcile_report **out,
                  char *err, size_t errcap);

#endif
