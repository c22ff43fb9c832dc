/* respscan.c - see respscan.h: the checked yajl pass (qg__json_scan) that
 * the response and request readers share, and the response reader on it.
 * libyajl's event callbacks walk the text once
 * while a small stack of "nodes" says where we are (the top object, its
 * "usage", "choices"[i]."delta", ...).  A key is compared only against the
 * names that matter under its own parent node, so a "usage" inside a
 * choice or inside a string is never taken for the top-level one.  Every
 * member we keep is overwritten when its key comes again (last wins).
 *
 * yajl is more lenient than jansson in a few places (it takes \v and \f as
 * whitespace, checks only the shape of UTF-8 sequences, turns a lone
 * surrogate escape into '?', and leaves number ranges to its callers), so a
 * pre-pass over the raw text refuses what jansson refuses there, and the
 * number callback checks ranges as jansson's strtoll/strtod do. */
#include <errno.h>
#include <math.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "respscan.h"

#define MAX_DEPTH 2048      /* jansson's JSON_PARSER_MAX_DEPTH: values,
                               scalars included, nest at most this deep */

/* Where a container sits.  Only the paths we read get a node of their own;
 * everything else is N_OTHER, and so is all beneath it. */
enum {
    N_OTHER, N_TOP, N_ROOT, N_USAGE, N_MUSAGE, N_ERROR, N_MESSAGE,
    N_CHOICES, N_CHOICE, N_DELTA, N_TOOLS, N_TOOL, N_FUNC, N_ADELTA
};
#define NODE_DEPTH 7        /* root .choices [i] .delta .tool_calls [j]
                               .function: the deepest node we name */

/* The key just read, among those that matter under its parent. */
enum {
    K_OTHER, K_USAGE, K_ERROR, K_CHOICES, K_TYPE, K_MESSAGE, K_DELTA,
    K_CODE, K_CONTENT, K_TOOL_CALLS, K_FUNCTION, K_ARGUMENTS, K_TEXT,
    K_PARTIAL_JSON, K_THINKING,
    K_COUNT                 /* + QG__UC_*: a usage count */
};

#define V_NULL QG__V_NULL
#define V_BOOL QG__V_BOOL
#define V_INT QG__V_INT
#define V_REAL QG__V_REAL
#define V_STR QG__V_STR
#define V_MAP QG__V_MAP
#define V_ARR QG__V_ARR

/* A small bump allocator for yajl's handle, lexer and stacks, so a scan
 * of an ordinary event calls malloc not at all; bigger needs (a long
 * escaped string) go to malloc.  Under AddressSanitizer yajl uses malloc
 * directly, so its own memory use stays checked. */
#define ARENA_BYTES 6144
typedef struct arena {
    alignas(max_align_t) unsigned char b[ARENA_BYTES];
    size_t used;
} arena;
#define ARENA_HDR sizeof(max_align_t)   /* block size, kept before it */

/* The shared pass: the client's callbacks, the nesting, the arena. */
typedef struct jscan {
    const qg__json_ops *ops;
    void *ctx;
    int depth;                      /* containers open */
    yajl_handle h;                  /* NULL: end is not kept */
    size_t end;                     /* bytes up to the top value's end */
    arena mem;
} jscan;

/* The response reader's state. */
typedef struct scan {
    qg__resp *r;
    unsigned char node[NODE_DEPTH]; /* node of each open container */
    int key;                        /* K_* of the key just read */
    int64_t d_content, d_tools;     /* the current choice's delta */
    int64_t t_args;                 /* the current tool call's arguments */
    int64_t a_text[3];              /* .delta text, partial_json, thinking */
} scan;

/* ------------------------------------------------------------ pre-pass */

static int hex4(const unsigned char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
            d = (c | 0x20) - 'a' + 10;
        else
            return 0;
        *v = *v << 4 | d;
    }
    return 1;
}

/* Length of the valid UTF-8 sequence at s (jansson's rules: no overlong
 * forms, no surrogates, nothing above U+10FFFF), 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0], v;
    size_t k;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        v = c & 0x07;
    } else {
        return 0;
    }
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if ((k == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) ||
        (k == 4 && (v < 0x10000 || v > 0x10FFFF)))
        return 0;
    return k;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
#define HAS_ZERO(w) (((w) - ONES) & ~(w) & HIGHS)
#define HAS_BYTE(w, b) HAS_ZERO((w) ^ (ONES * (b)))

/* Refuse what yajl would take but jansson does not: a \v or \f byte
 * anywhere (yajl's whitespace; a control character inside a string),
 * invalid UTF-8 anywhere, a \u escape of a lone surrogate.  Backslashes
 * only start escapes in valid JSON, so skipping each escape whole keeps
 * this pass in step with the strings.  0 or -1. */
static int prepass(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {           /* 8 plain ASCII bytes at once */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & HIGHS) && !HAS_BYTE(w, '\\') && !HAS_BYTE(w, 0x0B) &&
                !HAS_BYTE(w, 0x0C)) {
                i += 8;
                continue;
            }
        }
        unsigned c = s[i];
        if (c >= 0x80) {
            size_t k = utf8_seq(s + i, n - i);
            if (!k)
                return -1;
            i += k;
        } else if (c == 0x0B || c == 0x0C) {
            return -1;
        } else if (c == '\\' && i + 1 < n && s[i + 1] == 'u') {
            unsigned v, lo;
            if (n - i < 6 || !hex4(s + i + 2, &v)) {
                i += 2;             /* yajl refuses the bad escape */
                continue;
            }
            if (v >= 0xDC00 && v <= 0xDFFF)
                return -1;
            if (v >= 0xD800 && v <= 0xDBFF) {
                if (n - i < 12 || s[i + 6] != '\\' || s[i + 7] != 'u' ||
                    !hex4(s + i + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                i += 12;
            } else {
                i += 6;
            }
        } else {
            i += c == '\\' ? 2 : 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- values */

/* The bytes of a string before its first NUL. */
static size_t cstr_len(const unsigned char *s, size_t l)
{
    const unsigned char *z = l ? memchr(s, '\0', l) : NULL;
    return z ? (size_t)(z - s) : l;
}

static void copy_name(char dst[64], int vt, const unsigned char *s,
                      size_t l)
{
    size_t n = vt == V_STR ? cstr_len(s, l) : 0;
    if (n > 63)
        n = 63;
    if (n)
        memcpy(dst, s, n);
    dst[n] = '\0';
}

int qg__resp_type(const char *name, size_t l)
{
    const unsigned char *s = (const unsigned char *)name;
    static const struct { const char *name; int t; } types[] = {
        {"message_start", QG__T_MESSAGE_START},
        {"message_delta", QG__T_MESSAGE_DELTA},
        {"message_stop", QG__T_MESSAGE_STOP},
        {"error", QG__T_ERROR},
    };
    size_t n = cstr_len(s, l);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strlen(types[i].name) == n && memcmp(types[i].name, s, n) == 0)
            return types[i].t;
    return QG__T_OTHER;
}

static void set_count(qg__count *c, int vt, int64_t iv)
{
    c->v = 0;
    c->state = vt == V_NULL ? 0 : (vt == V_INT && iv >= 0) ? 1 : -1;
    if (c->state == 1)
        c->v = iv;
}

static void set_usage(qg__usage *u, int vt)
{
    memset(u, 0, sizeof *u);
    u->state = vt == V_NULL ? 0 : vt == V_MAP ? 1 : -1;
}

/* One value (a scalar, or the start of a container) at the current
 * position: record it when its path matters, and open the container's
 * node.  Returns 1, or 0 to stop the parse (refused). */
static int resp_value(void *ctx, int depth, int vt, const unsigned char *s,
                      size_t l, int64_t iv)
{
    scan *sc = ctx;
    qg__resp *r = sc->r;
    int parent = depth == 0 ? N_TOP
                 : depth <= NODE_DEPTH ? sc->node[depth - 1] : N_OTHER;
    int k = sc->key, child = N_OTHER;
    int64_t slen = vt == V_STR ? (int64_t)l : 0;

    switch (parent) {
    case N_TOP:
        child = N_ROOT;             /* an object: qg__json_scan checked */
        break;
    case N_ROOT:
        if (k == K_USAGE) {
            set_usage(&r->usage, vt);
            child = N_USAGE;
        } else if (k == K_ERROR) {
            r->error = vt == V_MAP;
            r->error_type[0] = r->error_code[0] = '\0';
            child = N_ERROR;
        } else if (k == K_CHOICES) {
            r->choices_array = vt == V_ARR;
            r->choices_n = 0;
            r->openai_chunk_bytes = 0;
            child = N_CHOICES;
        } else if (k == K_TYPE) {
            r->type = vt == V_STR ? qg__resp_type((const char *)s, l)
                                  : QG__T_NONE;
        } else if (k == K_MESSAGE) {
            r->message = vt == V_MAP ? 1 : -1;
            memset(&r->msg_usage, 0, sizeof r->msg_usage);
            child = N_MESSAGE;
        } else if (k == K_DELTA) {
            memset(sc->a_text, 0, sizeof sc->a_text);
            r->anthropic_event_bytes = 0;
            child = N_ADELTA;
        }
        break;
    case N_USAGE:
    case N_MUSAGE:
        if (k >= K_COUNT)
            set_count((parent == N_USAGE ? &r->usage : &r->msg_usage)
                          ->c + (k - K_COUNT), vt, iv);
        break;
    case N_ERROR:
        if (k == K_TYPE)
            copy_name(r->error_type, vt, s, l);
        else if (k == K_CODE)
            copy_name(r->error_code, vt, s, l);
        break;
    case N_MESSAGE:
        if (k == K_USAGE) {
            set_usage(&r->msg_usage, vt);
            child = N_MUSAGE;
        }
        break;
    case N_CHOICES:
        r->choices_n++;
        sc->d_content = sc->d_tools = 0;
        child = N_CHOICE;
        break;
    case N_CHOICE:
        if (k == K_DELTA) {
            sc->d_content = sc->d_tools = 0;
            child = N_DELTA;
        }
        break;
    case N_DELTA:
        if (k == K_CONTENT) {
            sc->d_content = slen;
        } else if (k == K_TOOL_CALLS) {
            sc->d_tools = 0;
            child = N_TOOLS;
        }
        break;
    case N_TOOLS:
        sc->t_args = 0;
        child = N_TOOL;
        break;
    case N_TOOL:
        if (k == K_FUNCTION) {
            sc->t_args = 0;
            child = N_FUNC;
        }
        break;
    case N_FUNC:
        if (k == K_ARGUMENTS)
            sc->t_args = slen;
        break;
    case N_ADELTA:
        if (k >= K_TEXT && k <= K_THINKING)
            sc->a_text[k - K_TEXT] = slen;
        break;
    default:
        break;
    }
    if (vt == V_MAP || vt == V_ARR) {
        /* a node only for the container type its path expects */
        int want_arr = child == N_CHOICES || child == N_TOOLS;
        if (child != N_OTHER && want_arr != (vt == V_ARR))
            child = N_OTHER;
        if (depth < NODE_DEPTH)
            sc->node[depth] = (unsigned char)child;
    }
    return 1;
}

static int resp_end(void *ctx, int depth)
{
    scan *sc = ctx;
    int node = depth <= NODE_DEPTH ? sc->node[depth - 1] : N_OTHER;
    if (node == N_TOOL)
        sc->d_tools += sc->t_args;
    else if (node == N_CHOICE)
        sc->r->openai_chunk_bytes += sc->d_content + sc->d_tools;
    else if (node == N_ADELTA)
        sc->r->anthropic_event_bytes =
            sc->a_text[0] + sc->a_text[1] + sc->a_text[2];
    return 1;
}

/* ---------------------------------------------------------- callbacks */

/* The shared checks on every value, then the client's callback; a
 * container opens a level. */
static int on_value(void *ctx, int vt, const unsigned char *s, size_t l,
                    int64_t iv)
{
    jscan *js = ctx;
    if (js->depth >= MAX_DEPTH)
        return 0;                   /* this value would be 2049 deep */
    if (js->depth == 0 && vt != V_MAP)
        return 0;                   /* only an object at the top */
    if (!js->ops->value(js->ctx, js->depth, vt, s, l, iv))
        return 0;
    if (vt == V_MAP || vt == V_ARR)
        js->depth++;
    return 1;
}

static int on_end(void *ctx)
{
    jscan *js = ctx;
    int ok = js->ops->end ? js->ops->end(js->ctx, js->depth) : 1;
    if (--js->depth == 0 && js->h)
        js->end = yajl_get_bytes_consumed(js->h);
    return ok;
}

static int on_null(void *ctx)
{
    return on_value(ctx, V_NULL, NULL, 0, 0);
}

static int on_bool(void *ctx, int b)
{
    return on_value(ctx, V_BOOL, NULL, 0, b != 0);
}

/* A real's text overflows a double (strtod gives HUGE_VAL): jansson
 * refuses those.  Most reals are far from the limit: a value with D
 * integer digits and exponent E is below 10^(D+E), so strtod is only asked
 * when D+E > 308. */
static int real_overflows(const char *s, size_t l)
{
    size_t i = s[0] == '-', d = 0;
    long e = 0;
    int eneg = 0;
    char small[128], *buf;
    double v;
    while (i < l && s[i] >= '0' && s[i] <= '9') {
        i++;
        d++;
    }
    while (i < l && s[i] != 'e' && s[i] != 'E')
        i++;
    if (i < l) {
        i++;
        if (i < l && (s[i] == '+' || s[i] == '-'))
            eneg = s[i++] == '-';
        while (i < l && s[i] >= '0' && s[i] <= '9')
            if ((e = e * 10 + (s[i++] - '0')) > 100000)
                e = 100000;
    }
    if (eneg || (long)d + e <= 308)
        return 0;
    buf = l < sizeof small ? small : malloc(l + 1);
    if (!buf)
        return 1;
    memcpy(buf, s, l);
    buf[l] = '\0';
    errno = 0;
    v = strtod(buf, NULL);
    if (buf != small)
        free(buf);
    return (v == HUGE_VAL || v == -HUGE_VAL) && errno == ERANGE;
}

static int on_number(void *ctx, const char *s, size_t l)
{
    uint64_t acc = 0, limit;
    int neg = l && s[0] == '-';
    if (memchr(s, '.', l) || memchr(s, 'e', l) || memchr(s, 'E', l))
        return real_overflows(s, l) ? 0
                                    : on_value(ctx, V_REAL,
                                               (const unsigned char *)s, l,
                                               0);
    limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (size_t i = neg; i < l; i++) {
        unsigned dg = (unsigned)(s[i] - '0');
        if (acc > (limit - dg) / 10)
            return 0;               /* jansson: "too big integer" */
        acc = acc * 10 + dg;
    }
    return on_value(ctx, V_INT, NULL, 0,
                    !neg ? (int64_t)acc
                    : acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN
                                                     : -(int64_t)acc);
}

static int on_string(void *ctx, const unsigned char *s, size_t l)
{
    return on_value(ctx, V_STR, s, l, 0);
}

static int on_start_map(void *ctx)
{
    return on_value(ctx, V_MAP, NULL, 0, 0);
}

static int on_start_array(void *ctx)
{
    return on_value(ctx, V_ARR, NULL, 0, 0);
}

static int on_key(void *ctx, const unsigned char *s, size_t l)
{
    jscan *js = ctx;
    if (memchr(s, '\0', l))
        return 0;                   /* jansson refuses NUL in keys */
    return js->ops->key(js->ctx, js->depth, s, l);
}

static int key_is(const unsigned char *s, size_t l, const char *name)
{
    return strlen(name) == l && memcmp(s, name, l) == 0;
}

static int resp_key(void *ctx, int depth, const unsigned char *s, size_t l)
{
    static const char *const counts[QG__UC_N] = {
        [QG__UC_PROMPT] = "prompt_tokens",
        [QG__UC_COMPLETION] = "completion_tokens",
        [QG__UC_INPUT] = "input_tokens",
        [QG__UC_OUTPUT] = "output_tokens",
        [QG__UC_CACHE_CREATION] = "cache_creation_input_tokens",
        [QG__UC_CACHE_READ] = "cache_read_input_tokens",
    };
    scan *sc = ctx;
    int node = depth <= NODE_DEPTH ? sc->node[depth - 1] : N_OTHER;
    int k = K_OTHER;
    switch (node) {
    case N_ROOT:
        k = key_is(s, l, "usage")     ? K_USAGE
            : key_is(s, l, "choices") ? K_CHOICES
            : key_is(s, l, "type")    ? K_TYPE
            : key_is(s, l, "delta")   ? K_DELTA
            : key_is(s, l, "error")   ? K_ERROR
            : key_is(s, l, "message") ? K_MESSAGE
                                      : K_OTHER;
        break;
    case N_USAGE:
    case N_MUSAGE:
        for (int i = 0; i < QG__UC_N; i++)
            if (key_is(s, l, counts[i]))
                k = K_COUNT + i;
        break;
    case N_ERROR:
        k = key_is(s, l, "type") ? K_TYPE
            : key_is(s, l, "code") ? K_CODE : K_OTHER;
        break;
    case N_MESSAGE:
        k = key_is(s, l, "usage") ? K_USAGE : K_OTHER;
        break;
    case N_CHOICE:
        k = key_is(s, l, "delta") ? K_DELTA : K_OTHER;
        break;
    case N_DELTA:
        k = key_is(s, l, "content") ? K_CONTENT
            : key_is(s, l, "tool_calls") ? K_TOOL_CALLS : K_OTHER;
        break;
    case N_TOOL:
        k = key_is(s, l, "function") ? K_FUNCTION : K_OTHER;
        break;
    case N_FUNC:
        k = key_is(s, l, "arguments") ? K_ARGUMENTS : K_OTHER;
        break;
    case N_ADELTA:
        k = key_is(s, l, "text")           ? K_TEXT
            : key_is(s, l, "partial_json") ? K_PARTIAL_JSON
            : key_is(s, l, "thinking")     ? K_THINKING
                                           : K_OTHER;
        break;
    default:
        break;
    }
    sc->key = k;
    return 1;
}

static const yajl_callbacks callbacks = {
    .yajl_null = on_null,
    .yajl_boolean = on_bool,
    .yajl_number = on_number,       /* raw text: ranges checked here */
    .yajl_string = on_string,
    .yajl_start_map = on_start_map,
    .yajl_map_key = on_key,
    .yajl_end_map = on_end,
    .yajl_start_array = on_start_array,
    .yajl_end_array = on_end,
};

/* -------------------------------------------------------------- arena */

#ifndef __SANITIZE_ADDRESS__
static int in_arena(const arena *a, const void *p)
{
    return (const unsigned char *)p >= a->b &&
           (const unsigned char *)p < a->b + ARENA_BYTES;
}

static void *arena_malloc(void *ctx, size_t size)
{
    arena *a = ctx;
    size_t need = (size + ARENA_HDR - 1) / ARENA_HDR * ARENA_HDR;
    unsigned char *p;
    if (need < size || ARENA_BYTES - a->used < need + ARENA_HDR)
        return malloc(size);
    p = a->b + a->used;
    memcpy(p, &need, sizeof need);
    a->used += need + ARENA_HDR;
    return p + ARENA_HDR;
}

static void arena_free(void *ctx, void *p)
{
    if (p && !in_arena(ctx, p))
        free(p);
}

static void *arena_realloc(void *ctx, void *p, size_t size)
{
    size_t old;
    void *q;
    if (!p)
        return arena_malloc(ctx, size);
    if (!in_arena(ctx, p))
        return realloc(p, size);
    memcpy(&old, (unsigned char *)p - ARENA_HDR, sizeof old);
    if (size <= old)
        return p;
    if ((q = arena_malloc(ctx, size)) != NULL)
        memcpy(q, p, old);
    return q;                       /* the old block is simply left */
}
#endif

/* --------------------------------------------------------------- scan */

int qg__json_scan(const char *text, size_t len, const qg__json_ops *ops,
                  void *ctx)
{
    jscan js;
    yajl_handle h;
    int ok;
    if (!text || prepass((const unsigned char *)text, len) != 0)
        return -1;
    js.ops = ops;
    js.ctx = ctx;
    js.depth = 0;
#ifdef __SANITIZE_ADDRESS__
    h = yajl_alloc(&callbacks, NULL, &js);
#else
    js.mem.used = 0;
    yajl_alloc_funcs af = {arena_malloc, arena_realloc, arena_free,
                           &js.mem};
    h = yajl_alloc(&callbacks, &af, &js);
#endif
    if (!h)
        return -1;
    js.h = h;
    js.end = 0;
    /* UTF-8 was checked (more strictly) by the pre-pass */
    yajl_config(h, yajl_dont_validate_strings, 1);
    ok = yajl_parse(h, (const unsigned char *)text, len) == yajl_status_ok &&
         yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    /* yajl's end of text (a space it feeds itself) leaves a string that
     * was opened after the top value unfinished rather than refused:
     * only JSON whitespace may follow the top value. */
    for (size_t i = js.end; ok && i < len; i++)
        ok = text[i] == ' ' || text[i] == '\t' || text[i] == '\n' ||
             text[i] == '\r';
    return ok ? 0 : -1;
}

int qg__resp_scan(const char *text, size_t len, qg__resp *out)
{
    static const qg__json_ops ops = {resp_value, resp_key, resp_end};
    scan sc;
    memset(out, 0, sizeof *out);
    sc.r = out;
    sc.key = K_OTHER;
    sc.d_content = sc.d_tools = sc.t_args = 0;
    memset(sc.a_text, 0, sizeof sc.a_text);
    if (qg__json_scan(text, len, &ops, &sc) != 0) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    return 0;
}
