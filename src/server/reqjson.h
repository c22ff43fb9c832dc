/* reqjson.h - reading JSON request bodies strictly.
 *
 * What a body may be is jansson's reading of it (json_loadb with
 * JSON_REJECT_DUPLICATES) after a scan that bounds nesting depth
 * (jansson's own limit is 2048 levels); every field is read with its type,
 * range and presence checked, and unknown keys are refused, so a typo
 * ("max_output_token") is an error naming the key rather than a silent
 * default.  Decimal weights are read into milli-units exactly.
 *
 * The common body (a flat object of allowed keys, scalar values, short
 * strings without NUL) is read in one pass of respscan.c's checked yajl
 * scan into the reader itself, without a tree: jansson's tree cost ~14k
 * instructions per /v1/check (docs/benchmarks.md).  Every other body
 * (malformed, nested, a duplicate or unknown key, a NUL, long strings) is
 * read by jansson, which also words every refusal, so both readings give
 * the same fields and the same messages (tests/unit/test_reqjson.c
 * compares them). */
#ifndef QG_REQJSON_H
#define QG_REQJSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define QG_JSON_MAX_DEPTH 16

/* The keys each route's body may hold (h_decide.c, h_admin.c; the tests
 * and fuzz_reqjson read the routes' own lists). */
extern const char *const qg__check_keys[];      /* POST /v1/check */
extern const char *const qg__settle_keys[];     /* POST /v1/settle */
extern const char *const qg__subject_keys[];    /* POST /v1/admin/subjects */
extern const char *const qg__key_keys[];        /* POST /v1/admin/keys */
extern const char *const qg__reconcile_keys[];  /* POST /v1/admin/reconcile */

#define QG_REQJSON_FIELDS 8      /* members the one-pass reading holds */
#define QG_REQJSON_BYTES 1024    /* its decoded strings, NULs included */

/* One member of a body read in one pass: its allowed key, its JSON type
 * (QG__V_* of respscan.h), a string's bytes (NUL-terminated, in buf), an
 * integer's value, a real's value as jansson reads it (strtod). */
typedef struct qg__reqfield {
    const char *key;
    int vt;
    const char *s;
    size_t l;
    int64_t iv;
    double dv;
} qg__reqfield;

/* A body read: its members (one pass), or jansson's tree.  Lives on the
 * caller's stack; strings the getters return are borrowed from it. */
typedef struct qg__reqjson {
    json_t *tree;                 /* jansson's reading, else NULL */
    int n;
    qg__reqfield f[QG_REQJSON_FIELDS];
    size_t used;
    char buf[QG_REQJSON_BYTES];
} qg__reqjson;

/* Read an object body into rj.  0, or -1 with a message in err on
 * malformed JSON, too deep nesting, a non-object, a duplicate key, or a
 * key not in `allowed` (a NULL terminated list); rj needs
 * qg__reqjson_free either way. */
int qg__reqjson_parse(qg__reqjson *rj, const char *body, size_t len,
                      const char *const *allowed, char *err, size_t cap);

/* The same through jansson alone (the reading every refusal comes from;
 * tests compare the two). */
int qg__reqjson_parse_tree(qg__reqjson *rj, const char *body, size_t len,
                           const char *const *allowed, char *err,
                           size_t cap);

void qg__reqjson_free(qg__reqjson *rj);

/* Field getters: 1 found, 0 absent (and not required), -1 error (err
 * written), -2 a number of the right type beyond its bound (err names the
 * field and the bound: the caller answers 400 out_of_range).  Strings are
 * borrowed from rj. */
int qg__reqjson_str(const qg__reqjson *rj, const char *key, int required,
                    size_t maxlen, const char **out, char *err, size_t cap);
int qg__reqjson_int(const qg__reqjson *rj, const char *key, int required,
                    int64_t min, int64_t max, int64_t *out, char *err,
                    size_t cap);
/* A number with at most 3 decimals, >= 0, into milli-units; at most
 * QG_AMOUNT_MAX_MILLI (an integer), or 10^12 when written with a
 * fraction (a double holds the milli exactly only that far). */
int qg__reqjson_milli(const qg__reqjson *rj, const char *key, int required,
                      int64_t *out, char *err, size_t cap);
/* A boolean: 1 found (*out 0 or 1), 0 absent, -1 another type, null
 * included (err: "KEY must be true or false"). */
int qg__reqjson_bool(const qg__reqjson *rj, const char *key, int *out,
                     char *err, size_t cap);

#endif
