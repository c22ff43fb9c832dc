/* error.h - writing an error message into a caller's buffer, the way
 * every layer reports "what was wrong" next to its qg_err code. */
#ifndef QG_ERROR_H
#define QG_ERROR_H

#include <stddef.h>

/* snprintf into err (cap bytes); nothing when err is NULL or cap 0. */
void qg__errf(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
