/* calendar.h - reset instants of calendar windows.
 *
 * A calendar window resets at fixed local times in an IANA zone: every day
 * at HH:MM, every week on a weekday at HH:MM, every month on a day D at
 * HH:MM (D past the month's end means its last day) or on the subject's
 * billing anchor (its day-of-month and time of day, in the window's zone,
 * likewise clamped to short months, so a 31st anchor resets on Feb 28/29).
 * The period containing `now` is [start, end) with start <= now < end. */
#ifndef QG_CALENDAR_H
#define QG_CALENDAR_H

#include <stdint.h>
#include "tz.h"

typedef enum qg_every { QG_EVERY_DAY = 1, QG_EVERY_WEEK, QG_EVERY_MONTH } qg_every;

typedef struct qg_calendar_spec {
    qg_every every;
    int weekday;        /* QG_EVERY_WEEK: 0 = Monday .. 6 = Sunday */
    int mday;           /* QG_EVERY_MONTH: 1..31 (clamped per month) */
    int minute_of_day;  /* 0..1439 local */
    int anchor_billing; /* QG_EVERY_MONTH: use the subject's billing anchor */
    const qg_tz *tz;    /* not owned */
} qg_calendar_spec;

/* Compute the period containing now_ms.  anchor_ms is the subject's billing
 * anchor instant (used only with anchor_billing; when it is 0 the window
 * falls back to mday/minute_of_day).  Returns 0, or -1 on bad spec. */
int qg__calendar_period(const qg_calendar_spec *c, int64_t anchor_ms,
                       int64_t now_ms, int64_t *start_ms, int64_t *end_ms);

#endif
