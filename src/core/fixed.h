/* fixed.h - fixed-point decimal numbers for limits, weights and prices.
 *
 * quotagate never uses floating point for money or weight.  A quantity of
 * "weight points" is held as int64 milli-points (1 point = 1000 milli);
 * weight coefficients "per 1k tokens" are held as int64 micro-points per
 * 1000 tokens, so that 0.000125 points per 1k tokens is still exact.
 * Parsing rejects values that do not fit the scale instead of rounding. */
#ifndef QG_FIXED_H
#define QG_FIXED_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"

#define QG_MILLI 1000LL
#define QG_MICRO 1000000LL

/* qg_fixed_parse and qg_fixed_format are public (quotagate.h). */

/* v in decimal at out (at most QG_DEC_MAX bytes, no NUL); the length.
 * Two digits per step from a table: the hot path formats ~16 integers
 * per decision answer (docs/benchmarks.md, "HTTP", the eighth session's
 * steps). */
#define QG_DEC_MAX 20
size_t qg__dec_u64(char *out, uint64_t v);
/* How many digits qg__dec_u64 writes for v. */
size_t qg__dec_len(uint64_t v);
/* The same for a signed value ('-' first; at most QG_DEC_MAX + 1). */
size_t qg__dec_i64(char *out, int64_t v);

/* Ceiling division for a positive denominator (any numerator > INT64_MIN);
 * never overflows, whatever the numerator. */
static inline int64_t qg__ceil_div(int64_t a, int64_t b)
{
    return a <= 0 ? -((-a) / b) : a / b + (a % b != 0);
}

/* a + b for amounts within the bounds (quotagate.h): a in [0,
 * QG_AMOUNT_MAX_MILLI], b >= 0 (any int64); the sum saturates at the
 * bound.  Two bounded amounts sum below 2^62, so only a b beyond the
 * bound needs the clamp before the addition. */
static inline int64_t qg__amount_add(int64_t a, int64_t b)
{
    if (b > QG_AMOUNT_MAX_MILLI)
        b = QG_AMOUNT_MAX_MILLI;
    a += b;
    return a > QG_AMOUNT_MAX_MILLI ? QG_AMOUNT_MAX_MILLI : a;
}

/* The same for money (QG_MONEY_MAX_MICRO). */
static inline int64_t qg__money_add(int64_t a, int64_t b)
{
    if (b > QG_MONEY_MAX_MICRO)
        b = QG_MONEY_MAX_MICRO;
    a += b;
    return a > QG_MONEY_MAX_MICRO ? QG_MONEY_MAX_MICRO : a;
}

#endif
