/* respscan.h - one streaming pass over an upstream response's JSON text
 * (a whole body, or one SSE event's payload) that collects the few values
 * usage.c and proxy.c read from it, without building a tree.
 *
 * The proxy reads every response body and every stream event, and a jansson
 * tree per event cost most of its parsing time; libyajl's callbacks let us
 * keep only what we need.  What counts as valid JSON is jansson's (which
 * the proxy used before and which its request rewrite still uses): UTF-8
 * checked strictly, lone surrogate escapes refused, numbers that overflow a
 * 64-bit integer or a double refused, NUL refused in keys but allowed in
 * strings (as JSON_ALLOW_NUL), values nested at most 2048 deep (a scalar
 * counting as a level, as in jansson), only an object or an array at the
 * top, nothing after it but JSON whitespace.  One difference, on purpose:
 * jansson 2.14 skips a raw NUL byte right after a number or a literal
 * ({"a":1<NUL>}); that text is not JSON, and it is refused here.
 * Duplicate keys: the last one wins, as jansson's json_loadb without
 * JSON_REJECT_DUPLICATES.  Keys are matched at their exact path only.
 *
 * Internal to the proxy (qg__ prefix); reentrant, no allocation beyond
 * the parser's own (kept on the stack for small texts). */
#ifndef QG_RESPSCAN_H
#define QG_RESPSCAN_H

#include <stddef.h>
#include <stdint.h>

/* A token count member: state 0 absent or null, 1 a non-negative integer
 * (in v), -1 anything else (negative, fractional, string, ...). */
typedef struct qg__count {
    int state;
    int64_t v;
} qg__count;

enum {
    QG__UC_PROMPT,          /* prompt_tokens */
    QG__UC_COMPLETION,      /* completion_tokens */
    QG__UC_INPUT,           /* input_tokens */
    QG__UC_OUTPUT,          /* output_tokens */
    QG__UC_CACHE_CREATION,  /* cache_creation_input_tokens */
    QG__UC_CACHE_READ,      /* cache_read_input_tokens */
    QG__UC_N
};

/* A "usage" member: state 0 absent or null, 1 an object (its counts in
 * c[]), -1 another type. */
typedef struct qg__usage {
    int state;
    qg__count c[QG__UC_N];
} qg__usage;

/* The top-level "type" string, compared up to its first NUL (as strcmp on
 * jansson's value would). */
enum {
    QG__T_NONE,             /* absent, or not a string */
    QG__T_OTHER,
    QG__T_MESSAGE_START,
    QG__T_MESSAGE_DELTA,
    QG__T_MESSAGE_STOP,
    QG__T_ERROR
};

/* What one pass collects from a top-level object. */
typedef struct qg__resp {
    qg__usage usage;        /* .usage */
    qg__usage msg_usage;    /* .message.usage */
    int message;            /* .message: 0 absent, 1 object, -1 other
                               (null included) */
    int type;               /* .type, QG__T_* */
    int error;              /* .error is an object */
    char error_type[64];    /* .error.type / .error.code when a non-empty */
    char error_code[64];    /* string (up to a NUL, at most 63 bytes); ""
                               otherwise */
    int choices_array;      /* .choices is an array ... */
    int64_t choices_n;      /* ... of this many elements */
    /* bytes of generated text (decoded UTF-8, a \u0000 counting 1):
     * OpenAI chunk .choices[].delta.content and
     * .choices[].delta.tool_calls[].function.arguments; Anthropic event
     * .delta.text, .delta.partial_json and .delta.thinking */
    int64_t openai_chunk_bytes;
    int64_t anthropic_event_bytes;
} qg__resp;

/* Scan text[0..len) into *out (zeroed first).  Returns 0 when the text
 * is valid JSON (as above) with an object at the top, -1 otherwise (*out
 * is then zeroed). */
int qg__resp_scan(const char *text, size_t len, qg__resp *out);

/* The QG__T_* of a type name s[0..l) (up to its first NUL). */
int qg__resp_type(const char *s, size_t l);

/* ------------------------------------------------ the shared pass */

/* The pass under qg__resp_scan, for other readers (reqscan.c): the checks
 * above (UTF-8, escapes, numbers, depth, an object at the top, no NUL in
 * keys) are made here, and a client sees only the events of valid text.
 * depth is the number of containers open before the event (0 for the
 * top object's start; 1 for the top object's keys).  Strings come
 * decoded, l bytes (a \u0000 counting 1); a real comes as its text (s, l:
 * the JSON number as written, within a double's range); iv is an
 * integer's value or a boolean's 0/1.  A callback returns 1, or 0 to stop
 * (refused). */
enum { QG__V_NULL, QG__V_BOOL, QG__V_INT, QG__V_REAL, QG__V_STR, QG__V_MAP,
       QG__V_ARR };

typedef struct qg__json_ops {
    /* a scalar, or a container's start (the container opens after) */
    int (*value)(void *ctx, int depth, int vt, const unsigned char *s,
                 size_t l, int64_t iv);
    int (*key)(void *ctx, int depth, const unsigned char *s, size_t l);
    /* a container's end; depth still counts it */
    int (*end)(void *ctx, int depth);
} qg__json_ops;

/* Scan text[0..len) through ops.  0 when valid, -1 otherwise (the client
 * may have seen events of a prefix). */
int qg__json_scan(const char *text, size_t len, const qg__json_ops *ops,
                  void *ctx);

#endif
