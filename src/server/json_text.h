/* json_text.h - writing JSON text: the atoms every body uses and the
 * direct text builder of the bodies answered on every request.
 *
 *
 * The bodies answered on every request (check, settle, error) are written
 * straight into one growing buffer instead of a json_t tree dumped by
 * jansson (a tree costs a malloc per member and the dump a printf per
 * atom).  The text is byte for byte what jansson writes with
 * QG_JSON_DUMP_FLAGS: members in insertion order, compact separators,
 * strings escaped as jansson does ('"', '\\', control characters; UTF-8
 * passed through), integers as %lld, reals through jansson's own dtostr
 * rules (%.15g, ".0" added to an integral-looking real, exponent without
 * '+' or leading zeros).  A string that is not valid UTF-8 fails the
 * body (NULL), as json_string() would.
 *
 * The jansson atoms (qg__json_scaled, _milli, _time) return a new
 * reference the caller owns; they serve the bodies built as trees
 * (json_rules.c, the admin routes). */
#ifndef QG_JSON_TEXT_H
#define QG_JSON_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <jansson.h>
#include "quotagate.h"

#define QG_JSON_DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

/* v / 10^scale as a JSON number: an integer when whole, else a real whose
 * 15 significant digits print the exact decimal back. */
json_t *qg__json_scaled(int64_t v, int scale_digits);
json_t *qg__json_milli(int64_t v);
/* An ISO 8601 string, or null for 0. */
json_t *qg__json_time(int64_t ms);
/* json_dumps with QG_JSON_DUMP_FLAGS, then json_decref (j may be NULL). */
char *qg__json_dump_steal(json_t *j);

/* Names the API uses for the engine's enums. */
const char *qg__json_win_type_name(int type);
const char *qg__json_settle_status_name(int status);
const char *qg__json_policy_name(int policy);
/* A view's unit: "requests", or the rules' unit name (default "weight
 * points"). */
const char *qg__json_unit_of(const qg_window_view *v, const char *unit_name);

/* ------------------------------------------------ the text builder */

typedef struct qg__jb {
    char *p;
    size_t len, cap;
    int err;
} qg__jb;

/* Start a text of at most cap bytes before it grows.  -1 out of memory
 * (b->err set: every later call does nothing, qg__jb_finish gives NULL). */
int qg__jb_init(qg__jb *b, size_t cap);
int qg__jb_grow(qg__jb *b, size_t more);

static inline int qg__jb_room(qg__jb *b, size_t more)
{
    if (b->err)
        return -1;
    return b->cap - b->len >= more + 1 ? 0 : qg__jb_grow(b, more);
}

static inline void qg__jb_raw(qg__jb *b, const char *s, size_t n)
{
    if (qg__jb_room(b, n) < 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

#define QG__JB_LIT(b, lit) qg__jb_raw((b), (lit), sizeof(lit) - 1)

/* Atoms, written as jansson writes them. */
void qg__jb_i64(qg__jb *b, int64_t v);
void qg__jb_real(qg__jb *b, double v);
void qg__jb_scaled(qg__jb *b, int64_t v, int scale_digits);
void qg__jb_milli(qg__jb *b, int64_t v);
/* A string, escaped; NULL is null; invalid UTF-8 fails the text. */
void qg__jb_str(qg__jb *b, const char *s);
void qg__jb_bool(qg__jb *b, int v);
/* An ISO 8601 string, null for 0. */
void qg__jb_time(qg__jb *b, int64_t ms);
/* The text (the caller frees it), or NULL when anything failed. */
char *qg__jb_finish(qg__jb *b);

#endif
