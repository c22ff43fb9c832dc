/* tzfile.h - loading IANA time zones from the system zoneinfo database.
 *
 * The only file I/O of time zones: reads /usr/share/zoneinfo/<name> (or
 * $TZDIR, or a directory given by the caller) and hands the bytes to
 * qg__tz_from_tzif().  Has the shape of qg_tz_resolver (rules.h). */
#ifndef QG_TZFILE_H
#define QG_TZFILE_H

#include <stddef.h>
#include "tz.h"

/* Largest zone file accepted. */
#define QG_TZFILE_MAX (1024 * 1024)

/* Load zone `name` ("Europe/Berlin").  ud is NULL (use $TZDIR when set,
 * else /usr/share/zoneinfo) or a `const char *` zoneinfo directory.
 * "UTC" and "Etc/UTC" work even without any file.  Returns a new zone the
 * caller frees with qg__tz_free, or NULL writing why into err. */
qg_tz *qg__tz_load_system(const char *name, void *ud, char *err, size_t errcap);

#endif
