/* bench_util.h - what the C benchmarks share: a monotonic clock in
 * seconds, a positive number from the environment, and a comparison of
 * doubles for qsort (medians and spreads).  Header-only: each bench is
 * one program built from its own file. */
#ifndef QG_BENCH_UTIL_H
#define QG_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* NAME as a positive integer, else dflt. */
static inline long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    long n = v ? strtol(v, NULL, 10) : 0;
    return n > 0 ? n : dflt;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
