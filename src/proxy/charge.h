/* charge.h - the tokens a proxied call is charged, from what its response
 * showed (docs/proxy.md, "What is charged").  No I/O: the route settles
 * with the result and reports its anomalies (log line, metric, the ledger
 * row's detail). */
#ifndef QG_CHARGE_H
#define QG_CHARGE_H

#include <stdint.h>
#include "usage.h"

/* Usage reported beyond what a caller can be charged. */
typedef enum qg__anomaly {
    QG_ANOMALY_OUTPUT_OVER_CAP = 0,   /* output above max_tokens */
    QG_ANOMALY_OUTPUT_OVER_BOUND,     /* output above QG_TOKENS_MAX */
    QG_ANOMALY_INPUT_OVER_BOUND,      /* input above QG_TOKENS_MAX */
    QG_ANOMALY_RESPONSE_TOO_LARGE,    /* a buffered answer over 64 MiB */
    QG_ANOMALY_COUNT                  /* also: an anomaly without metric */
} qg__anomaly;

#define QG_CHARGE_DETAIL_MAX 160      /* = the ledger row's detail */

typedef struct qg__charge_in {
    qg_usage_counts u;          /* what the response reported */
    int final_usage;            /* its final usage arrived (a stream's
                                   last usage event, a whole body's) */
    int64_t content_bytes;      /* generated text seen */
    int64_t input_estimate;     /* admission's estimate */
    int64_t max_output;         /* the request's max_tokens, -1 none */
} qg__charge_in;

typedef struct qg__charge {
    int64_t in, out;            /* tokens to settle with */
    int est;                    /* either is an estimate */
    int nanomalies;
    qg__anomaly anomaly[3];
    char detail[QG_CHARGE_DETAIL_MAX];  /* what was charged instead of the
                                           report, "" when none */
} qg__charge;

/* Reported counts when present, else the input estimate and ceil(content
 * bytes / 4); a stream's output counts as reported only with its final
 * usage.  Then the limits of what a caller can be charged: output never
 * above max_output when set (a report above it is charged at the cap); a
 * count above QG_TOKENS_MAX is no report (replaced by the estimate).  So
 * the settle can never fail on the numbers. */
void qg__charge_tokens(const qg__charge_in *in, qg__charge *out);

/* Add an anomaly of kind (QG_ANOMALY_COUNT: none to count) with its words
 * to c's detail. */
void qg__charge_note(qg__charge *c, qg__anomaly kind, const char *what);

#endif
