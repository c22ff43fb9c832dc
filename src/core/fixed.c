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

size_t qg__dec_len(uint64_t v)
{
    static const uint64_t p10[QG_DEC_MAX] = {
        1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL,
        10000000ULL, 100000000ULL, 1000000000ULL, 10000000000ULL,
        100000000000ULL, 1000000000000ULL, 10000000000000ULL,
        100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
        100000000000000000ULL, 1000000000000000000ULL,
        10000000000000000000ULL};
    size_t n = 1;
    while (n < QG_DEC_MAX && v >= p10[n])
        n++;
    return n;
}

size_t qg__dec_u64(char *out, uint64_t v)
{
    size_t n = qg__dec_len(v), i = n;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        out[--i] = dig2[2 * r + 1];
        out[--i] = dig2[2 * r];
    }
    if (v >= 10) {
        out[1] = dig2[2 * v + 1];
        out[0] = dig2[2 * v];
    } else {
        out[0] = (char)('0' + v);
    }
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
