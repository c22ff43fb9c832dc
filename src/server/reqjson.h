/* reqjson.h - reading JSON request bodies strictly.
 *
 * Bodies are parsed by jansson after a scan that bounds nesting depth
 * (jansson's own limit is 2048 levels); every field is read with its type,
 * range and presence checked, and unknown keys are refused, so a typo
 * ("max_output_token") is an error naming the key rather than a silent
 * default.  Decimal weights are read into milli-units exactly. */
#ifndef QG_REQJSON_H
#define QG_REQJSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define QG_JSON_MAX_DEPTH 16

/* Parse an object body.  NULL with a message in err on malformed JSON,
 * too deep nesting, a non-object, or a key not in `allowed` (a NULL
 * terminated list). */
json_t *qg__reqjson_parse(const char *body, size_t len,
                         const char *const *allowed, char *err, size_t cap);

/* Field getters: 1 found, 0 absent (and not required), -1 error (err
 * written), -2 a number of the right type beyond its bound (err names the
 * field and the bound: the caller answers 400 out_of_range).  Strings are
 * borrowed from the object. */
int qg__reqjson_str(json_t *o, const char *key, int required, size_t maxlen,
                   const char **out, char *err, size_t cap);
int qg__reqjson_int(json_t *o, const char *key, int required, int64_t min,
                   int64_t max, int64_t *out, char *err, size_t cap);
/* A number with at most 3 decimals, >= 0, into milli-units; at most
 * QG_AMOUNT_MAX_MILLI (an integer), or 10^12 when written with a
 * fraction (a double holds the milli exactly only that far). */
int qg__reqjson_milli(json_t *o, const char *key, int required, int64_t *out,
                     char *err, size_t cap);

#endif
