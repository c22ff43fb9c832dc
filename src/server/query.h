/* query.h - the query string of a GET request (after '?'), read without
 * I/O: "key=value&key=value", percent-decoded ('+' is a space), every key
 * at most once and known to the route.  Used by the history and requests
 * routes (h_history.c). */
#ifndef QG_QUERY_H
#define QG_QUERY_H

#include <stddef.h>

#define QG_QUERY_MAX_PARAMS 8
#define QG_QUERY_VALUE_MAX 256

typedef struct qg_query {
    int n;
    char key[QG_QUERY_MAX_PARAMS][32];
    char value[QG_QUERY_MAX_PARAMS][QG_QUERY_VALUE_MAX];
} qg_query;

/* Parse q ("" allowed) into out, accepting only the keys in allowed[0..n).
 * Returns 0, or -1 with a sentence for the caller in msg: an unknown or
 * repeated key, a key or value too long, bad percent-encoding, too many
 * parameters. */
int qg__query_parse(const char *q, const char *const *allowed, int n,
                    qg_query *out, char *msg, size_t msgcap);

/* The value of key, or NULL when it was not given. */
const char *qg__query_get(const qg_query *q, const char *key);

#endif
