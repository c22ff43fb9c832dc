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

#define QG_MILLI 1000LL
#define QG_MICRO 1000000LL

/* Parse a plain decimal ("12", "0.25", "1e3" is NOT accepted) with at most
 * `scale_digits` fractional digits into an integer scaled by 10^scale_digits.
 * Returns 0 on success, -1 on syntax error, -2 on too many fractional digits,
 * -3 on overflow.  A leading '-' is accepted (callers reject negatives). */
int qg_fixed_parse(const char *s, size_t len, int scale_digits, int64_t *out);

/* Format a scaled integer as a decimal without trailing zeros ("2.5", "3").
 * Writes at most `cap` bytes including NUL; returns the length written. */
size_t qg_fixed_format(int64_t v, int scale_digits, char *buf, size_t cap);

/* Ceiling division for non-negative numerator and positive denominator. */
static inline int64_t qg_ceil_div(int64_t a, int64_t b)
{
    return a <= 0 ? -((-a) / b) : (a + b - 1) / b;
}

#endif
