/* error.c - the one table of error codes and their messages. */
#include <stdarg.h>
#include <stdio.h>
#include "error.h"
#include "quotagate.h"

static const char *const messages[] = {
    [0] = "ok",
    [1] = "out of memory",
    [2] = "invalid argument",
    [3] = "rules file unusable",
    [4] = "unknown subject",
    [5] = "not found",
    [6] = "table full",
    [7] = "I/O error",
    [8] = "invalid state",
    [9] = "number out of range",
    [10] = "unknown model",
    [11] = "the store cannot be reached",
    [12] = "the ledger's database cannot be reached",
};

const char *qg_strerror(int rc)
{
    unsigned i = rc <= 0 ? (unsigned)-rc : 0u;
    if (rc > 0 || i >= sizeof messages / sizeof messages[0])
        return "unknown error";
    return messages[i];
}

void qg__errf(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    if (!err || cap == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}
