/* fixed.c - exact decimal parsing and formatting for scaled integers.
 *
 * Limits, weights and prices are written in rules files as plain decimals
 * and held as int64 scaled by a power of ten (milli, micro).  Parsing is
 * strict: no exponent, no '+', no rounding - a value with more fractional
 * digits than the scale holds is refused, as is one that overflows int64. */
#include "fixed.h"

#include <string.h>

int qg_fixed_parse(const char *s, size_t len, int scale_digits, int64_t *out)
{
    size_t i = 0;
    int neg = 0, frac = 0, seen_dot = 0, int_digits = 0;
    uint64_t mag = 0, lim;

    if (!s || scale_digits < 0 || scale_digits > 18)
        return -1;
    if (i < len && s[i] == '-') {
        neg = 1;
        i++;
    }
    /* magnitude limit: |INT64_MIN| for negatives, INT64_MAX otherwise */
    lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    for (; i < len; i++) {
        char c = s[i];
        if (c == '.') {
            if (seen_dot || int_digits == 0)
                return -1;
            seen_dot = 1;
            continue;
        }
        if (c < '0' || c > '9')
            return -1;
        if (seen_dot) {
            if (++frac > scale_digits)
                return -2;
        } else {
            int_digits++;
        }
        if (mag > (lim - (uint64_t)(c - '0')) / 10u)
            return -3;
        mag = mag * 10u + (uint64_t)(c - '0');
    }
    if (int_digits == 0 || (seen_dot && frac == 0))
        return -1;
    /* scale up the digits not written */
    for (; frac < scale_digits; frac++) {
        if (mag > lim / 10u)
            return -3;
        mag *= 10u;
    }
    if (neg)
        *out = mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag;
    else
        *out = (int64_t)mag;
    return 0;
}

static const char dig2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233"
    "34353637383940414243444546474849505152535455565758596061626364656667"
    "6869707172737475767778798081828384858687888990919293949596979899";

static const uint64_t p10[QG_DEC_MAX] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL,
    10000000ULL, 100000000ULL, 1000000000ULL, 10000000000ULL,
    100000000000ULL, 1000000000000ULL, 10000000000000ULL,
    100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
    100000000000000000ULL, 1000000000000000000ULL,
    10000000000000000000ULL};

/* From the bit length b: t = b * 1233 / 4096 is floor(b * log10(2)) for
 * every b up to 64, and v, in [2^(b-1), 2^b), has t or t + 1 digits:
 * t + 1 when v >= 10^t. */
size_t qg__dec_len(uint64_t v)
{
    unsigned t;
    if (v < 10)
        return 1;
    t = (unsigned)(64 - __builtin_clzll(v)) * 1233u >> 12;
    return t + (v >= p10[t]);
}

/* Two digits of v < 100 at o. */
static inline void put2(char *o, uint32_t v)
{
    memcpy(o, dig2 + 2 * v, 2);
}

/* Exactly eight digits of v < 10^8 at o, in 32-bit arithmetic. */
static inline void put8(char *o, uint32_t v)
{
    uint32_t hi = v / 10000, lo = v % 10000;
    put2(o, hi / 100);
    put2(o + 2, hi % 100);
    put2(o + 4, lo / 100);
    put2(o + 6, lo % 100);
}

/* Backwards from the end: eight digits at a time while v needs more than
 * eight (one 64-bit division each), then the rest in 32 bits.  About a
 * third of the instructions of a loop dividing v by 100 in 64 bits, for
 * the 13-digit millisecond timestamps the answers carry. */
size_t qg__dec_u64(char *out, uint64_t v)
{
    size_t n = qg__dec_len(v);
    char *o = out + n;
    uint32_t w;
    while (v >= 100000000ULL) {
        uint64_t q = v / 100000000ULL;
        o -= 8;
        put8(o, (uint32_t)(v - q * 100000000ULL));
        v = q;
    }
    w = (uint32_t)v;
    while (w >= 100) {
        o -= 2;
        put2(o, w % 100);
        w /= 100;
    }
    if (w >= 10)
        put2(o - 2, w);
    else
        o[-1] = (char)('0' + w);
    return n;
}

size_t qg__dec_i64(char *out, int64_t v)
{
    if (v >= 0)
        return qg__dec_u64(out, (uint64_t)v);
    out[0] = '-';
    return 1 + qg__dec_u64(out + 1, (uint64_t)0 - (uint64_t)v);
}

size_t qg_fixed_format(int64_t v, int scale_digits, char *buf, size_t cap)
{
    char tmp[48];
    char *p = tmp + sizeof tmp;
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int d, frac_started = 0;
    size_t n;

    if (scale_digits < 0)
        scale_digits = 0;
    if (scale_digits > 18)
        scale_digits = 18;
    *--p = '\0';
    /* fractional digits, dropping trailing zeros */
    for (d = 0; d < scale_digits; d++) {
        char c = (char)('0' + mag % 10u);
        mag /= 10u;
        if (c != '0' || frac_started) {
            *--p = c;
            frac_started = 1;
        }
    }
    if (frac_started)
        *--p = '.';
    do {
        *--p = (char)('0' + mag % 10u);
        mag /= 10u;
    } while (mag);
    if (v < 0)
        *--p = '-';
    n = strlen(p);
    if (cap == 0)
        return 0;
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return n;
}
