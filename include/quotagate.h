/* quotagate.h - the public interface of the quotagate library.
 *
 * quotagate decides whether a request to an AI service fits every quota
 * window of its subject (member) and of the subject's organisation, charges
 * it atomically when it does, and explains every refusal: which window
 * binds, the exact instant the same request would fit, and how each window
 * recovers.  See docs/architecture.md for the layering.
 *
 * Conventions:
 *  - functions return 0 (QG_OK) or a negative qg_err; qg_strerror() names it;
 *  - times are int64 milliseconds since the Unix epoch (UTC), passed in by
 *    the caller: the library never reads a clock;
 *  - quantities are int64 milli-units: 1 weight point = 1000, 1 request =
 *    1000;
 *  - handles are opaque, created by _new and released by _free; a function
 *    that takes ownership of an argument says so.
 *  - the engine and stores are thread-safe; rules are immutable. */
#ifndef QUOTAGATE_H
#define QUOTAGATE_H

#include <stddef.h>
#include <stdint.h>

#define QG_VERSION "0.1.0"

typedef enum qg_err {
    QG_OK = 0,
    QG_ENOMEM = -1,      /* out of memory */
    QG_EINVAL = -2,      /* invalid argument or request */
    QG_ERULES = -3,      /* rules file unusable */
    QG_ENOSUBJECT = -4,  /* unknown subject and no default plan */
    QG_ENOTFOUND = -5,   /* e.g. settle of an unknown request id */
    QG_EFULL = -6,       /* a bounded table is full of live entries */
    QG_EIO = -7,         /* file or network I/O failed */
    QG_ESTATE = -8,      /* operation not valid in this state */
    QG_ERANGE = -9,      /* a number out of range (overflow) */
    QG_EMODEL = -10      /* unknown model */
} qg_err;

/* Static message for an error code. */
const char *qg_strerror(int rc);

typedef struct qg_rules qg_rules;
typedef struct qg_store qg_store;
typedef struct qg_engine qg_engine;

/* ---------------------------------------------------------------- views */

#define QG_MAX_VIEWS 32     /* member + org windows of one decision */
#define QG_MAX_RECOVERY 4   /* recovery steps reported per window */

/* What a client sees of one window at one instant. */
typedef struct qg_window_view {
    const char *name;         /* window name, owned by the rules */
    int type;                 /* qg_win_type (rules.h) */
    int unit;                 /* 0 weight, 1 requests */
    int org;                  /* 1 when the window is the organisation's */
    int64_t limit_milli;
    int64_t used_milli;
    int64_t remaining_milli;  /* max(0, limit - used) */
    int64_t reset_at_ms;      /* when used next falls: calendar period end,
                                 rolling oldest expiry, session end, rate
                                 bucket full, earliest lease expiry; 0 when
                                 nothing is used */
} qg_window_view;

/* At at_ms, the window's remaining allowance becomes remaining_milli. */
typedef struct qg_recovery_point {
    int64_t at_ms;
    int64_t remaining_milli;
} qg_recovery_point;

#endif
