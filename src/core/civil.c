/* civil.c - proleptic Gregorian calendar arithmetic and ISO 8601 text.
 *
 * Everything here is pure integer arithmetic on day numbers (days since
 * 1970-01-01) and milliseconds since the epoch.  Time zones live in tz.c;
 * this file only knows UTC.  Negative day numbers and instants before 1970
 * are handled with floor division so that, e.g., ms = -1 is 1969-12-31
 * 23:59:59.999 rather than a time "before midnight" of 1970-01-01. */
#include <stdio.h>
#include <string.h>

#include "civil.h"

/* Floor division and the matching non-negative remainder (b > 0). */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0)
        q--;
    return q;
}

static int64_t floor_mod(int64_t a, int64_t b)
{
    return a - floor_div(a, b) * b;
}

int qg__is_leap(int y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

int qg__days_in_month(int y, int m)
{
    static const unsigned char len[12] = {31, 28, 31, 30, 31, 30,
                                          31, 31, 30, 31, 30, 31};
    if (m < 1 || m > 12)
        return 0;
    return len[m - 1] + (m == 2 && qg__is_leap(y));
}

/* The computation treats the year as starting on March 1st, so that the
 * leap day is the very last day of a "computational year".  Then:
 *  - the Gregorian cycle is 400 years = 146097 days (an "era"), so the
 *    date splits into era * 146097 + day-of-era;
 *  - inside an era, year-of-era yoe (0..399) contributes
 *    365*yoe + yoe/4 - yoe/100 days (the era starts right after a leap
 *    day of a year divisible by 400, so the /400 term is always zero);
 *  - inside the March-based year, months March..January have lengths
 *    31,30,31,30,31,31,30,31,30,31,31,(28|29); the day offset of month
 *    mp (0 = March) is (153*mp + 2) / 5, a line that hits exactly the
 *    cumulative sums 0,31,61,92,122,153,184,214,245,275,306,337.
 * 0000-03-01 is day -719468 relative to 1970-01-01. */
int64_t qg__days_from_civil(int y, int m, int d)
{
    int64_t yy = (int64_t)y - (m <= 2);        /* March-based year */
    int64_t era = floor_div(yy, 400);
    int64_t yoe = yy - era * 400;              /* 0..399 */
    int64_t mp = (m + 9) % 12;                 /* March = 0 .. Feb = 11 */
    int64_t doy = (153 * mp + 2) / 5 + d - 1;  /* 0..365 */
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

void qg__civil_from_days(int64_t days, int *y, int *m, int *d)
{
    int64_t z = days + 719468;                 /* days since 0000-03-01 */
    int64_t era = floor_div(z, 146097);
    int64_t doe = z - era * 146097;            /* 0..146096 */
    /* Year of era: remove the leap days accumulated before doe.  A leap
     * day is added every 1460 days (4 years), removed every 36524 (100
     * years) and the era's final day 146096 counts as one more. */
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;          /* inverse of the line above */
    int64_t dd = doy - (153 * mp + 2) / 5 + 1;
    int64_t mm = mp < 10 ? mp + 3 : mp - 9;
    int64_t yy = yoe + era * 400 + (mm <= 2);
    *y = (int)yy;
    *m = (int)mm;
    *d = (int)dd;
}

int qg__weekday_from_days(int64_t days)
{
    /* 1970-01-01 was a Thursday (3 when Monday is 0). */
    return (int)floor_mod(days + 3, 7);
}

int64_t qg__civil_to_ms(const qg_civil *c)
{
    int64_t days = qg__days_from_civil(c->year, c->month, c->day);
    int64_t secs = (int64_t)c->hour * 3600 + (int64_t)c->minute * 60 +
                   c->second;
    return days * QG_MS_PER_DAY + secs * 1000 + c->ms;
}

void qg__ms_to_civil(int64_t ms, qg_civil *c)
{
    int64_t days = floor_div(ms, QG_MS_PER_DAY);
    int64_t rem = ms - days * QG_MS_PER_DAY;   /* 0..86399999 */
    qg__civil_from_days(days, &c->year, &c->month, &c->day);
    c->hour = (int)(rem / 3600000);
    c->minute = (int)(rem / 60000 % 60);
    c->second = (int)(rem / 1000 % 60);
    c->ms = (int)(rem % 1000);
}

/* Read exactly n decimal digits at *p; -1 when any is not a digit. */
static int digits(const char **p, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char ch = (*p)[i];
        if (ch < '0' || ch > '9')
            return -1;
        v = v * 10 + (ch - '0');
    }
    *p += n;
    return v;
}

int qg_iso8601_parse(const char *s, int64_t *out_ms)
{
    const char *p = s;
    qg_civil c;
    int64_t offset_s = 0;

    if (!s || !out_ms)
        return -1;
    memset(&c, 0, sizeof c);
    if ((c.year = digits(&p, 4)) < 0 || *p++ != '-' ||
        (c.month = digits(&p, 2)) < 0 || *p++ != '-' ||
        (c.day = digits(&p, 2)) < 0)
        return -1;
    if (c.month < 1 || c.month > 12 || c.day < 1 ||
        c.day > qg__days_in_month(c.year, c.month))
        return -1;
    if (*p == '\0') {                          /* date only: midnight UTC */
        *out_ms = qg__civil_to_ms(&c);
        return 0;
    }
    if (*p != 'T' && *p != 't')
        return -1;
    p++;
    if ((c.hour = digits(&p, 2)) < 0 || *p++ != ':' ||
        (c.minute = digits(&p, 2)) < 0)
        return -1;
    if (*p == ':') {
        p++;
        if ((c.second = digits(&p, 2)) < 0)
            return -1;
        if (*p == '.' || *p == ',') {
            /* Keep milliseconds; further digits are truncated but must
             * still be digits.  At least one digit is required. */
            int n = 0;
            p++;
            while (*p >= '0' && *p <= '9') {
                if (n < 3)
                    c.ms = c.ms * 10 + (*p - '0');
                n++;
                p++;
            }
            if (n == 0 || n > 9)
                return -1;
            for (; n < 3; n++)
                c.ms *= 10;
        }
    }
    if (c.hour > 23 || c.minute > 59 || c.second > 59)
        return -1;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1;
        int oh, om;
        if ((oh = digits(&p, 2)) < 0)
            return -1;
        if (*p == ':')
            p++;
        if ((om = digits(&p, 2)) < 0 || oh > 23 || om > 59)
            return -1;
        offset_s = sign * (oh * 3600 + om * 60);
    } else {
        return -1;                             /* a zone is required */
    }
    if (*p != '\0')
        return -1;
    /* Local time minus its offset east of UTC is the UTC instant. */
    *out_ms = qg__civil_to_ms(&c) - offset_s * 1000;
    return 0;
}

void qg_iso8601_format(int64_t ms, char *buf, int cap)
{
    qg_civil c;
    if (!buf || cap <= 0)
        return;
    qg__ms_to_civil(ms, &c);
    if (c.ms != 0)
        snprintf(buf, (size_t)cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                 c.year, c.month, c.day, c.hour, c.minute, c.second, c.ms);
    else
        snprintf(buf, (size_t)cap, "%04d-%02d-%02dT%02d:%02d:%02dZ", c.year,
                 c.month, c.day, c.hour, c.minute, c.second);
}
