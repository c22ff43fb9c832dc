/* metrics_internal.h - the metrics registry's structures, shared by the
 * counting (metrics.c) and the rendering of /metrics (metrics_render.c).
 * Internal to src/server. */
#ifndef QG_METRICS_INTERNAL_H
#define QG_METRICS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include "metrics.h"

/* The HTTP status codes counted one by one (others: "other"). */
extern const int qg__metrics_codes[];
#define NCODES 21

#define NOUT 3

typedef struct series {
    _Atomic uint64_t n[NOUT];      /* by QG_M_* outcome */
    char *window;                  /* window name, or "none" */
    unsigned char base;            /* outcome bit set: shown even at 0 */
} series;

typedef struct block {
    char *plan;
    series **s;
    int n, cap;
} block;

typedef struct table {
    int nplans, norgs, nids;       /* window ids 0..nids-1; nids = none */
    series **cell;                 /* [plan * (nids + 1) + id] */
    int *plan_first, *plan_n;      /* plan p's window k: ids[plan_first+k] */
    int *org_first, *org_n;
    int *ids;
    const char **plan_ptr;         /* the rules' name pointers (compared, */
    const char **org_ptr;          /* never dereferenced) */
    char **plan_name;              /* our copies */
    char **org_name;
    char *rules_version, *weights_version;
    struct table *retired;         /* the table this one replaced */
} table;


struct qg_metrics {
    _Atomic(table *) cur;
    pthread_mutex_t lock;          /* rules swaps, renders, blocks */
    block **blocks;
    int nblocks, capblocks;
    _Atomic uint64_t settles[4];   /* by qg_settle_status */
    _Atomic uint64_t mismatch[2];  /* over, under */
    _Atomic uint64_t anomaly[QG_ANOMALY_COUNT];
    _Atomic uint64_t mismatch_milli[2];
    _Atomic uint64_t overage_milli;   /* payg, final at settle */
    _Atomic uint64_t overage_micro;
    _Atomic uint64_t http[QG_ROUTE_COUNT][NCODES + 1]; /* last: other */
};

#endif
