/* duration.h - durations written as "90s", "30m", "5h", "7d" (also "500ms",
 * "1w", and sums such as "1h30m").  Held as int64 milliseconds. */
#ifndef QG_DURATION_H
#define QG_DURATION_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"

/* qg_duration_parse and qg_duration_format are public (quotagate.h). */

#endif
