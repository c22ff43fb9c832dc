/* weights.h - the cost-aware weight of a request, in fixed point.
 *
 * weight = per_request + ceil((input_tokens * input_per_1k
 *                              + output_tokens * output_per_1k) / 1e6)
 * all in milli-points: coefficients are micro-points per 1000 tokens, so
 * tokens * coefficient is in 1e-9 points and one division by 1e6 brings it
 * to milli-points, rounded up once.  The result never loses a fraction in
 * the payer's favour and never drifts. */
#ifndef QG_WEIGHTS_H
#define QG_WEIGHTS_H

#include <stdint.h>
#include "rules.h"

/* Weight in milli-points of a request to model m, formed in 128 bits.
 * Token counts must be in [0, QG_TOKENS_MAX] (quotagate.h): -1 otherwise.
 * A weight above QG_AMOUNT_MAX_MILLI is returned as QG_AMOUNT_MAX_MILLI + 1
 * ("over the bound"): a check refuses it, a settle charges the bound. */
int64_t qg__weight_milli(const qg_model *m, int64_t input_tokens,
                        int64_t output_tokens);

#endif
