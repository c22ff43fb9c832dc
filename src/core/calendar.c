/* calendar.c - the period of a calendar window containing an instant.
 *
 * Resets are local wall-clock times in the window's zone (daily HH:MM,
 * weekly weekday HH:MM, monthly day D HH:MM or the billing anchor), turned
 * into instants with qg__tz_local_to_utc, so DST makes some days 23 or 25
 * hours long and a reset inside a spring-forward gap happens when the clock
 * jumps past it.
 *
 * Resets are numbered by an integer index k (a local day, week or month),
 * and reset(k) is increasing in k.  From the local date of `now` we guess
 * the k whose reset precedes now, then step back or forward until
 * reset(k) <= now < reset(k + 1).  An instant exactly equal to a reset
 * therefore starts the new period. */
#include "calendar.h"
#include "civil.h"

/* Instants accepted: years 0000..9999, far from any overflow. */
#define CAL_MIN_MS (-62167219200000LL)   /* 0000-01-01T00:00:00Z */
#define CAL_MAX_MS (253402300799999LL)   /* 9999-12-31T23:59:59.999Z */

typedef struct cal {
    const qg_tz *tz;
    qg_every every;
    int weekday;     /* week */
    int mday;        /* month */
    int64_t tod_ms;  /* local time of day of the reset */
} cal;

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0)
        q--;
    return q;
}

/* Local day number of reset k. */
static int64_t reset_day(const cal *c, int64_t k)
{
    switch (c->every) {
    case QG_EVERY_DAY:
        return k;
    case QG_EVERY_WEEK:
        /* Week k starts on Monday k*7 - 3 (day -3 = 1969-12-29, a
         * Monday). */
        return k * 7 - 3 + c->weekday;
    case QG_EVERY_MONTH:
    default: {
        /* k counts months: k = year * 12 + (month - 1). */
        int y = (int)floor_div(k, 12);
        int m = (int)(k - (int64_t)y * 12) + 1;
        int dim = qg__days_in_month(y, m);
        return qg__days_from_civil(y, m, c->mday < dim ? c->mday : dim);
    }
    }
}

static int64_t reset_at(const cal *c, int64_t k)
{
    return qg__tz_local_to_utc(c->tz, reset_day(c, k) * QG_MS_PER_DAY +
                                         c->tod_ms);
}

/* Index of the day, week or month holding local day `day`. */
static int64_t index_of(const cal *c, int64_t day)
{
    int y, m, d;
    switch (c->every) {
    case QG_EVERY_DAY:
        return day;
    case QG_EVERY_WEEK:
        return floor_div(day + 3, 7);
    case QG_EVERY_MONTH:
    default:
        qg__civil_from_days(day, &y, &m, &d);
        return (int64_t)y * 12 + (m - 1);
    }
}

int qg__calendar_period(const qg_calendar_spec *spec, int64_t anchor_ms,
                       int64_t now_ms, int64_t *start_ms, int64_t *end_ms)
{
    cal c;
    int64_t k, lo, hi;

    if (!spec || !spec->tz || !start_ms || !end_ms)
        return -1;
    if (now_ms < CAL_MIN_MS || now_ms > CAL_MAX_MS)
        return -1;
    c.tz = spec->tz;
    c.every = spec->every;
    c.weekday = spec->weekday;
    c.mday = spec->mday;
    c.tod_ms = (int64_t)spec->minute_of_day * 60000;
    switch (spec->every) {
    case QG_EVERY_DAY:
        break;
    case QG_EVERY_WEEK:
        if (c.weekday < 0 || c.weekday > 6)
            return -1;
        break;
    case QG_EVERY_MONTH:
        if (spec->anchor_billing && anchor_ms != 0) {
            /* The anchor's local day-of-month and time of day. */
            qg_civil a;
            if (anchor_ms < CAL_MIN_MS || anchor_ms > CAL_MAX_MS)
                return -1;
            qg__ms_to_civil(qg__tz_utc_to_local(c.tz, anchor_ms), &a);
            c.mday = a.day;
            c.tod_ms = (((int64_t)a.hour * 60 + a.minute) * 60 + a.second) *
                           1000 + a.ms;
            break;
        }
        if (c.mday < 1 || c.mday > 31)
            return -1;
        break;
    default:
        return -1;
    }
    if (c.tod_ms < 0 || c.tod_ms >= QG_MS_PER_DAY)
        return -1;

    k = index_of(&c, floor_div(qg__tz_utc_to_local(c.tz, now_ms),
                               QG_MS_PER_DAY));
    /* The guess is off by at most one in either direction; the bounds
     * only guard against a pathological zone. */
    for (int i = 0; i < 8 && reset_at(&c, k) > now_ms; i++)
        k--;
    for (int i = 0; i < 8 && reset_at(&c, k + 1) <= now_ms; i++)
        k++;
    lo = reset_at(&c, k);
    hi = reset_at(&c, k + 1);
    if (!(lo <= now_ms && now_ms < hi))
        return -1;
    *start_ms = lo;
    *end_ms = hi;
    return 0;
}
