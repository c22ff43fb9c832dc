/* civil.h - proleptic Gregorian calendar arithmetic on day numbers.
 *
 * Pure integer arithmetic, no time zones: days since 1970-01-01 <-> y/m/d,
 * weekday, month lengths and leap years.  Time zones are in tz.h. */
#ifndef QG_CIVIL_H
#define QG_CIVIL_H

#include <stdint.h>
#include "quotagate.h"

#define QG_MS_PER_DAY 86400000LL

typedef struct qg_civil {
    int year, month, day;     /* month 1..12, day 1..31 */
    int hour, minute, second; /* local time of day */
    int ms;                   /* 0..999 */
} qg_civil;

/* Days since 1970-01-01 for a Gregorian date (month 1..12). */
int64_t qg__days_from_civil(int y, int m, int d);
/* Inverse of qg__days_from_civil. */
void qg__civil_from_days(int64_t days, int *y, int *m, int *d);
/* 0 = Monday ... 6 = Sunday. */
int qg__weekday_from_days(int64_t days);
int qg__is_leap(int y);
int qg__days_in_month(int y, int m);

/* Milliseconds since the epoch of a civil time taken as UTC, and back. */
int64_t qg__civil_to_ms(const qg_civil *c);
void qg__ms_to_civil(int64_t ms, qg_civil *c);

/* qg_iso8601_parse and qg_iso8601_format are public (quotagate.h). */

#endif
