/* reqscan.h - one streaming pass over a request body's JSON text that
 * collects what qg__request_fields (usage.h) reads, without a tree: the
 * request-side client of respscan.h's checked yajl pass, so what counts as
 * valid JSON is the same (jansson's, see respscan.h), except that a
 * duplicate key in any object refuses the text, as jansson's
 * JSON_REJECT_DUPLICATES did for requests (usage.c says why).
 *
 * Internal to the proxy (qg__ prefix); reentrant. */
#ifndef QG_REQSCAN_H
#define QG_REQSCAN_H

#include <stddef.h>
#include <stdint.h>

#include "respscan.h"

#define QG__REQ_MODEL_MAX 256

/* What one pass collects from a top-level object. */
typedef struct qg__req {
    int model;              /* .model: 0 absent, 1 a string, -1 other */
    size_t model_len;       /* its decoded bytes (a \u0000 counting 1) */
    int model_nul;          /* it holds a NUL */
    char model_s[QG__REQ_MODEL_MAX]; /* it, NUL-terminated, when
                                        model_len < QG__REQ_MODEL_MAX */
    int stream;             /* .stream: -1 absent, else a QG__V_* */
    int stream_true;        /* .stream is true */
    int stream_options;     /* .stream_options: -1 absent, else a QG__V_* */
    qg__count max_completion_tokens, max_tokens;
    int messages;           /* .messages: 0 absent or null, 1 an array,
                               -1 other */
    /* UTF-8 bytes of prompt text: .messages[].content and .system, each
     * a string or an array of parts whose "text" string counts, or else
     * (first level only) whose "content" counts the same way */
    int64_t input_bytes;
} qg__req;

/* Scan text[0..len) into *out.  0 when the text is valid JSON with an
 * object at the top and no duplicate key; -1 otherwise; -2 out of
 * memory (many keys).  *out is zeroed on failure. */
int qg__req_scan(const char *text, size_t len, qg__req *out);

#endif
