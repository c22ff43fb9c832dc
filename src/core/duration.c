/* duration.c - durations as written in rules files ("90s", "1h30m").
 *
 * A duration is one or more <digits><unit> terms with units in strictly
 * decreasing size, held as int64 milliseconds.  The unit table below is the
 * one list of accepted units; parsing and formatting both read it. */
#include "duration.h"

#include <stdio.h>
#include <string.h>

typedef struct unit_def {
    const char *name;
    int64_t ms;
    int format;         /* used when formatting ("w" is parse-only) */
} unit_def;

/* Largest first; "ms" precedes "m" so the longer suffix wins. */
static const unit_def units[] = {
    { "w", 7 * 86400000LL, 0 },
    { "d", 86400000LL, 1 },
    { "h", 3600000LL, 1 },
    { "ms", 1LL, 1 },
    { "m", 60000LL, 1 },
    { "s", 1000LL, 1 },
};
#define NUNITS (sizeof units / sizeof units[0])

static int match_unit(const char *s, size_t len)
{
    size_t u;
    for (u = 0; u < NUNITS; u++) {
        size_t n = strlen(units[u].name);
        if (n <= len && memcmp(s, units[u].name, n) == 0)
            return (int)u;
    }
    return -1;
}

int qg_duration_parse(const char *s, size_t len, int64_t *out_ms)
{
    size_t i = 0;
    int64_t total = 0, last_unit_ms = INT64_MAX;

    if (!s || len == 0)
        return -1;
    while (i < len) {
        int64_t n = 0;
        size_t start = i;
        int u;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (n > (INT64_MAX - (s[i] - '0')) / 10)
                return -3;
            n = n * 10 + (s[i] - '0');
            i++;
        }
        if (i == start)
            return -1;
        u = match_unit(s + i, len - i);
        if (u < 0)
            return -1;
        i += strlen(units[u].name);
        /* each unit at most once, larger before smaller */
        if (units[u].ms >= last_unit_ms)
            return -1;
        last_unit_ms = units[u].ms;
        if (n > INT64_MAX / units[u].ms)
            return -3;
        n *= units[u].ms;
        if (total > INT64_MAX - n)
            return -3;
        total += n;
    }
    *out_ms = total;
    return 0;
}

/* Order of units when formatting, largest first. */
static const int fmt_order[] = { 1, 2, 4, 5, 3 }; /* d h m s ms */
#define NFMT (sizeof fmt_order / sizeof fmt_order[0])

size_t qg_duration_format(int64_t ms, char *buf, size_t cap)
{
    char best[64], cand[64];
    uint64_t mag = ms < 0 ? (uint64_t)0 - (uint64_t)ms : (uint64_t)ms;
    const char *sign = ms < 0 ? "-" : "";
    size_t k, n, blen;
    int pos = 0;

    if (mag == 0) {
        snprintf(best, sizeof best, "0s");
    } else {
        /* candidate 1: the sum of terms, largest units first */
        uint64_t rest = mag;
        pos = snprintf(best, sizeof best, "%s", sign);
        for (k = 0; k < NFMT; k++) {
            const unit_def *u = &units[fmt_order[k]];
            uint64_t q = rest / (uint64_t)u->ms;
            if (q) {
                pos += snprintf(best + pos, sizeof best - (size_t)pos,
                                "%llu%s", (unsigned long long)q, u->name);
                rest -= q * (uint64_t)u->ms;
            }
        }
        /* candidates 2..: a single unit that divides exactly; shorter or
         * equal wins, so "90m" beats "1h30m" */
        for (k = 0; k < NFMT; k++) {
            const unit_def *u = &units[fmt_order[k]];
            if (mag % (uint64_t)u->ms)
                continue;
            snprintf(cand, sizeof cand, "%s%llu%s", sign,
                     (unsigned long long)(mag / (uint64_t)u->ms), u->name);
            if (strlen(cand) <= strlen(best))
                memcpy(best, cand, strlen(cand) + 1);
            break;  /* larger units give shorter numbers */
        }
    }
    blen = strlen(best);
    if (cap == 0)
        return 0;
    n = blen < cap ? blen : cap - 1;
    memcpy(buf, best, n);
    buf[n] = '\0';
    return n;
}
