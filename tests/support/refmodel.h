/* refmodel.h - a plain reference model of quotagate's decisions, for tests
 * and the benchmark.
 *
 * The engine keeps compact per-window state (rings, cached periods, GCRA
 * arrival times, lease arrays) and answers each decision in near-constant
 * time.  This model keeps the opposite: for every subject and org, for every
 * window, a LITERAL log of every charge {t, amount, reservation} that is
 * never pruned nor compacted, and it answers every question by scanning
 * that whole log.  It shares no code with src/core/win_*.c or decide.c;
 * it uses only the rules (rules.h), the calendar period function
 * (calendar.h, a tested module of its own) and the window-scope predicate.
 *
 * Semantics mirrored (PRODUCT.md sections 2-3, window.h):
 *  - rolling L: a charge at t counts at T while t > T - L;
 *  - calendar: charges with t in the period [start, end) containing T;
 *  - session L: sessions found by walking the log (a charge at or after
 *    the previous session's end opens a new one at its instant);
 *  - rate: a token bucket replayed from the log with exact integer
 *    arithmetic (levels scaled by the period, drained by limit per ms);
 *  - concurrency: leases of unsettled reservations with t + ttl > T;
 *  - retry_after: the smallest candidate instant at which a fresh full
 *    evaluation admits the same request (candidates: now, every log
 *    entry's t + L, period ends, session ends, the bucket formula, lease
 *    expiries); binding = the window whose own earliest instant is latest
 *    (the first such in member-then-org order), or for a request no window
 *    could ever hold, the first such window (QG_REJECT_NEVER).
 *
 * Time must be presented in non-decreasing order across calls (the tests
 * drive it that way); the model does not mirror the engine's clamping of
 * out-of-order time.  Not thread-safe. */
#ifndef QG_REFMODEL_H
#define QG_REFMODEL_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"
#include "rules.h"

typedef struct ref_model ref_model;

typedef struct ref_decision {
    int rc;                   /* QG_OK, QG_EINVAL (request id of another
                                 subject), QG_ENOSUBJECT */
    qg_outcome outcome;
    int replayed;
    int64_t weight_milli;
    int64_t retry_after_ms;   /* QG_REJECT only */
    int binding;              /* index in member-then-org window order, -1 */
    const char *binding_name; /* window name, NULL when none */
    int binding_org;          /* 1 when the binding window is the org's */
} ref_decision;

typedef struct ref_settle_result {
    int rc;                   /* QG_OK or QG_ENOTFOUND */
    int replayed, late;
    int64_t reserved_milli, actual_milli, charged_milli;
} ref_settle_result;

/* A model over `rules` (borrowed, must outlive the model). */
ref_model *ref_new(const qg_rules *rules);
void ref_free(ref_model *m);

/* Register or update a subject (indices into the rules; org -1 = none). */
int ref_set_subject(ref_model *m, const char *name, int plan, int org,
                    int64_t anchor_ms);

/* Decide a request of `weight_milli` for model index `model` (-1 = a
 * weight-only request) at now_ms; when commit is non-zero and it is
 * admitted, charge every applicable window and remember the request id.
 * With commit 0 nothing changes (a dry run; replays are still answered).
 * Returns out->rc. */
int ref_check_ex(ref_model *m, const char *subject, const char *rid,
                 int model, int64_t weight_milli, int64_t now_ms, int commit,
                 ref_decision *out);
int ref_check(ref_model *m, const char *subject, const char *rid, int model,
              int64_t weight_milli, int64_t now_ms, ref_decision *out);

/* Settle request `rid` with the actual weight (-1 = keep the reserved
 * weight) at now_ms.  Returns out->rc. */
int ref_settle(ref_model *m, const char *rid, int64_t actual_milli,
               int64_t now_ms, ref_settle_result *out);

/* Pure evaluation: would the request be admitted at t_ms (>= the latest
 * now seen) if nothing else were charged?  1 yes, 0 no, -1 unknown
 * subject. */
int ref_admits_at(ref_model *m, const char *subject, int model,
                  int64_t weight_milli, int64_t t_ms);

/* Used amount of each of the subject's windows (member then org order, as
 * the engine's views) at now_ms, as the engine reports it (rate: bucket
 * fill rounded up).  Returns the number of windows written (<= max), or
 * -1 for an unknown subject. */
int ref_used(ref_model *m, const char *subject, int64_t now_ms,
             int64_t *used_milli, int max);

/* Total log entries held (for the benchmark's report). */
size_t ref_log_entries(const ref_model *m);

/* Non-zero when the model's own cross-checks failed (its combined search
 * disagreed with its per-window instants); the message says where. */
int ref_internal_errors(const ref_model *m, const char **message);

#endif
