/* duration.h - durations written as "90s", "30m", "5h", "7d" (also "500ms",
 * "1w", and sums such as "1h30m").  Held as int64 milliseconds. */
#ifndef QG_DURATION_H
#define QG_DURATION_H

#include <stddef.h>
#include <stdint.h>

/* Parse a duration.  Returns 0 and sets *out_ms, or -1 on a syntax error,
 * -3 on overflow.  Zero is accepted here; callers reject it where needed. */
int qg_duration_parse(const char *s, size_t len, int64_t *out_ms);

/* Format the shortest exact form ("5h", "1h30m", "7d", "250ms"). */
size_t qg_duration_format(int64_t ms, char *buf, size_t cap);

#endif
