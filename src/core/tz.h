/* tz.h - IANA time zones, parsed from TZif bytes without any I/O.
 *
 * A qg_tz is built from the bytes of a TZif file (versions 1-4, the v2+
 * 64-bit section when present) including the POSIX TZ footer that governs
 * instants after the last listed transition.  Reading the bytes from
 * /usr/share/zoneinfo is the caller's job (see src/io/tzfile.c), so this
 * module can be unit-tested on buffers.  A qg_tz is immutable once built
 * and may be shared by threads. */
#ifndef QG_TZ_H
#define QG_TZ_H

#include <stddef.h>
#include <stdint.h>

typedef struct qg_tz qg_tz;

/* Build a zone from TZif bytes.  `name` is copied.  Returns NULL on
 * malformed data (writing why into err) or out of memory. */
qg_tz *qg__tz_from_tzif(const char *name, const unsigned char *buf, size_t len,
                       char *err, size_t errcap);
/* The UTC zone, without any file.  Caller owns it. */
qg_tz *qg__tz_utc(void);
/* A zone with one fixed offset (seconds east of UTC) for all time, named
 * `name` (copied).  qg__tz_utc() is qg__tz_fixed("UTC", 0). */
qg_tz *qg__tz_fixed(const char *name, int32_t utoff);
void qg__tz_free(qg_tz *tz);
const char *qg__tz_name(const qg_tz *tz);

/* UTC offset in seconds (east positive) in force at instant `ms`. */
int32_t qg__tz_offset_at(const qg_tz *tz, int64_t ms);

/* The instant of a local wall-clock time (ms since the epoch of the local
 * civil time read as if UTC).  Rules for times that do not exist or exist
 * twice:
 *  - a gap (spring forward, e.g. 02:30 on a US DST day): the instant the
 *    wall clock jumps over it, i.e. the first instant after the gap
 *    (02:30 -> 03:00 local);
 *  - an overlap (fall back, 01:30 occurs twice): the first occurrence. */
int64_t qg__tz_local_to_utc(const qg_tz *tz, int64_t local_ms);
/* Local wall-clock ms for instant `ms` (ms + offset). */
int64_t qg__tz_utc_to_local(const qg_tz *tz, int64_t ms);

#endif
