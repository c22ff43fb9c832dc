/* overage.h - what a refusal turns into when the policy in force for it
 * is downgrade or queue (PRODUCT.md section 3, docs/proxy.md "Overage"):
 * the choice only, without I/O, next to the engine's decision.  The
 * metering proxy acts on it (serve a lighter model, hold the request on a
 * timer); payg is decided inside the engine itself (decide.c). */
#ifndef QG_OVERAGE_H
#define QG_OVERAGE_H

#include <stdint.h>
#include "quotagate.h"
#include "rules.h"

/* The policy in force for a refusal: the binding window's own policy when
 * it sets one, else the plan's.  NULL when the decision names no plan of
 * these rules. */
const qg_overage *qg__overage_of_refusal(const qg_rules *rules,
                                         const qg_decision *d);

typedef enum qg__overage_act {
    QG_OVERAGE_REFUSE = 0,      /* answer the refusal */
    QG_OVERAGE_DOWNGRADE,       /* try model `to_model` instead */
    QG_OVERAGE_HOLD             /* wait hold_ms, then decide again */
} qg__overage_act;

typedef struct qg__overage_choice {
    qg__overage_act act;
    int to_model;               /* downgrade: a model index of the rules */
    int64_t hold_ms;            /* hold: until the exact retry instant */
    int queue_size;             /* hold: the plan's bound on held requests */
} qg__overage_choice;

/* For decision d of a request for model index `model` (-1 weight-only)
 * that has waited waited_ms so far (0 on its first decision): downgrade
 * when the policy says so and names another model; hold when it says
 * queue, the refusal is retryable and the retry instant still falls
 * within max_wait counted from the first decision; else refuse (also
 * for an admitted d). */
void qg__overage_choose(const qg_rules *rules, const qg_decision *d,
                        int model, int64_t waited_ms,
                        qg__overage_choice *out);

#endif
