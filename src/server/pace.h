/* pace.h - each subject's recent usage per model, as the forecast of
 * /v1/usage needs it (docs/forecast.md "Where the pace comes from"): read
 * from the ledger's rollup at most once per subject per QG_PACE_TTL_MS,
 * and kept in a bounded table meanwhile, so that /v1/usage costs no
 * ledger read per request.  The ledger is the one source every instance
 * and every store (memory, Redis) shares, so all of them give a subject
 * the same pace. */
#ifndef QG_PACE_H
#define QG_PACE_H

#include <stdint.h>
#include "ledger.h"
#include "rules.h"

#define QG_PACE_TTL_MS 30000
#define QG_PACE_SLOTS 4096           /* subjects kept; a newer one evicts
                                        the entry in its place */
#define QG_PACE_MODELS 32            /* distinct models per subject kept
                                        (more are added to the last) */

typedef struct qg__pace qg__pace;

/* A subject's usage in [from_ms, at_ms), and its first usage. */
typedef struct qg_pace_sample {
    int64_t from_ms;                 /* a slot boundary (QG_LEDGER_SLOT_MS) */
    int64_t at_ms;                   /* when it was read */
    int64_t first_ms;                /* its first usage's slot, -1 none */
    int n;
    struct {
        char model[64];
        int64_t weight_milli;
        int64_t admitted;
    } m[QG_PACE_MODELS];
} qg_pace_sample;

qg__pace *qg__pace_new(void);
void qg__pace_free(qg__pace *p);

/* The subject's sample: the kept one when younger than QG_PACE_TTL_MS,
 * else read now from l (on the caller's thread: the ledger's history
 * connection) over the basis basis_cfg_ms (qg__forecast_basis) and kept.
 * Thread-safe.  0, or the ledger's error (out then holds no usage). */
int qg__pace_get(qg__pace *p, qg_ledger *l, const char *subject,
                 int64_t basis_cfg_ms, int64_t now_ms, qg_pace_sample *out);

/* What window w counted in the sample (its models; weight, or 1000 per
 * admitted request in a request-unit window). */
int64_t qg__pace_counted(const qg_pace_sample *s, const qg_rules *r,
                         const qg_window_spec *w);

#endif
