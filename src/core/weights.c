/* weights.c - weight of one request from its token counts (weights.h).
 *
 * Coefficients are micro-points per 1000 tokens, so tokens * coefficient
 * is in nano-points (1e-9).  Both products are summed before the single
 * rounding step, so a request is never charged twice for a fraction.
 * Everything is formed in 128 bits and checked against the bounds of
 * quotagate.h before it becomes an int64. */
#include "weights.h"
#include "fixed.h"

int64_t qg__weight_milli(const qg_model *m, int64_t input_tokens,
                        int64_t output_tokens)
{
    __int128 nano;

    if (input_tokens < 0 || output_tokens < 0 ||
        input_tokens > QG_TOKENS_MAX || output_tokens > QG_TOKENS_MAX)
        return -1;
    /* < 2 * 10^12 * 2^63: far inside 128 bits, whatever the coefficients */
    nano = (__int128)input_tokens * m->input_per_1k_micro +
           (__int128)output_tokens * m->output_per_1k_micro;
    /* nano-points -> milli-points: divide by 1e6, rounding up. */
    nano = (nano + QG_MICRO - 1) / QG_MICRO;
    nano += m->per_request_milli;
    if (nano > QG_AMOUNT_MAX_MILLI)
        return QG_AMOUNT_MAX_MILLI + 1;
    return (int64_t)nano;
}
