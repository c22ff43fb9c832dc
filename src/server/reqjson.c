/* reqjson.c - strict reading of JSON request bodies (reqjson.h): one
 * pass of the checked yajl scan for the common body, jansson for the
 * rest; the getters read either through one view of a member. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quotagate.h"
#include "reqjson.h"
#include "respscan.h"

/* Deepest nesting of [ and { outside strings. */
static int depth_of(const char *s, size_t len)
{
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max)
                max = depth;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return max;
}

/* ------------------------------------------------------- one pass */

/* The pass's state: the reader, the allowed keys, the member being read
 * (-1 none), which allowed keys were seen (a duplicate is left to
 * jansson, which refuses it). */
typedef struct pass {
    qg__reqjson *rj;
    const char *const *allowed;
    int cur;
    unsigned seen;
} pass;

/* The index of allowed key s[0..l), or -1. */
static int allowed_index(const char *const *allowed, const unsigned char *s,
                         size_t l)
{
    for (int i = 0; allowed[i]; i++)
        if (strncmp(allowed[i], (const char *)s, l) == 0 &&
            allowed[i][l] == '\0')
            return i;
    return -1;
}

static int p_key(void *ctx, int depth, const unsigned char *s, size_t l)
{
    pass *p = ctx;
    qg__reqjson *rj = p->rj;
    int k;
    (void)depth;                    /* 1: no member opens a container */
    if ((k = allowed_index(p->allowed, s, l)) < 0 || k >= 32 ||
        (p->seen & (1u << k)) || rj->n == QG_REQJSON_FIELDS)
        return 0;                   /* jansson words it */
    p->seen |= 1u << k;
    p->cur = rj->n++;
    rj->f[p->cur] = (qg__reqfield){.key = p->allowed[k], .vt = QG__V_NULL};
    return 1;
}

static int p_value(void *ctx, int depth, int vt, const unsigned char *s,
                   size_t l, int64_t iv)
{
    pass *p = ctx;
    qg__reqjson *rj = p->rj;
    qg__reqfield *f;
    char num[64];
    if (depth == 0)
        return 1;                   /* the top object (the scan checked) */
    if (vt == QG__V_MAP || vt == QG__V_ARR || p->cur < 0)
        return 0;                   /* nested: jansson's reading */
    f = &rj->f[p->cur];
    f->vt = vt;
    switch (vt) {
    case QG__V_STR:
        /* jansson refuses \u0000 (no JSON_ALLOW_NUL) */
        if (memchr(s, '\0', l) || l >= sizeof rj->buf - rj->used)
            return 0;
        f->s = rj->buf + rj->used;
        memcpy(rj->buf + rj->used, s, l);
        rj->buf[rj->used + l] = '\0';
        rj->used += l + 1;
        f->l = l;
        break;
    case QG__V_REAL:
        /* jansson reads a real with strtod (in the C locale) */
        if (l >= sizeof num)
            return 0;
        memcpy(num, s, l);
        num[l] = '\0';
        f->dv = strtod(num, NULL);
        break;
    default:
        f->iv = iv;
        break;
    }
    p->cur = -1;
    return 1;
}

int qg__reqjson_parse_tree(qg__reqjson *rj, const char *body, size_t len,
                           const char *const *allowed, char *err, size_t cap)
{
    json_error_t je;
    json_t *o;
    const char *key;
    json_t *v;

    rj->tree = NULL;
    rj->n = 0;
    rj->used = 0;
    if (len == 0) {
        snprintf(err, cap, "the request body must be a JSON object");
        return -1;
    }
    if (depth_of(body, len) > QG_JSON_MAX_DEPTH) {
        snprintf(err, cap, "JSON nested deeper than %d levels",
                 QG_JSON_MAX_DEPTH);
        return -1;
    }
    o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        snprintf(err, cap, "malformed JSON at line %d column %d: %s",
                 je.line, je.column, je.text);
        return -1;
    }
    if (!json_is_object(o)) {
        snprintf(err, cap, "the request body must be a JSON object");
        json_decref(o);
        return -1;
    }
    json_object_foreach(o, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok) {
            snprintf(err, cap, "unknown field \"%.64s\"", key);
            json_decref(o);
            return -1;
        }
    }
    rj->tree = o;
    return 0;
}

int qg__reqjson_parse(qg__reqjson *rj, const char *body, size_t len,
                      const char *const *allowed, char *err, size_t cap)
{
    static const qg__json_ops ops = {p_value, p_key, NULL};
    pass p = {rj, allowed, -1, 0};
    rj->tree = NULL;
    rj->n = 0;
    rj->used = 0;
    /* nesting needs no bound here: a member that opens a container
     * leaves the body to parse_tree, which bounds it */
    if (len > 0 && qg__json_scan(body, len, &ops, &p) == 0)
        return 0;
    return qg__reqjson_parse_tree(rj, body, len, allowed, err, cap);
}

void qg__reqjson_free(qg__reqjson *rj)
{
    json_decref(rj->tree);
    rj->tree = NULL;
    rj->n = 0;
}

/* ---------------------------------------------------------- getters */

/* A member as the getters see it, from either reading: its type
 * (QG__V_*) and value.  0 when absent. */
static int member(const qg__reqjson *rj, const char *key, qg__reqfield *m)
{
    json_t *v;
    if (!rj->tree) {
        for (int i = 0; i < rj->n; i++)
            if (strcmp(rj->f[i].key, key) == 0) {
                *m = rj->f[i];
                return 1;
            }
        return 0;
    }
    if (!(v = json_object_get(rj->tree, key)))
        return 0;
    *m = (qg__reqfield){.key = key};
    switch (json_typeof(v)) {
    case JSON_STRING:
        m->vt = QG__V_STR;
        m->s = json_string_value(v);
        m->l = json_string_length(v);
        break;
    case JSON_INTEGER:
        m->vt = QG__V_INT;
        m->iv = json_integer_value(v);
        break;
    case JSON_REAL:
        m->vt = QG__V_REAL;
        m->dv = json_real_value(v);
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        m->vt = QG__V_BOOL;
        m->iv = json_is_true(v);
        break;
    case JSON_OBJECT:
        m->vt = QG__V_MAP;
        break;
    case JSON_ARRAY:
        m->vt = QG__V_ARR;
        break;
    default:
        m->vt = QG__V_NULL;
        break;
    }
    return 1;
}

/* The member of key, 1; 0 when absent or null (-1 with the message when
 * required). */
static int present(const qg__reqjson *rj, const char *key, int required,
                   qg__reqfield *m, char *err, size_t cap)
{
    if (member(rj, key, m) && m->vt != QG__V_NULL)
        return 1;
    if (required) {
        snprintf(err, cap, "%s is required", key);
        return -1;
    }
    return 0;
}

int qg__reqjson_str(const qg__reqjson *rj, const char *key, int required,
                    size_t maxlen, const char **out, char *err, size_t cap)
{
    qg__reqfield m;
    int rc = present(rj, key, required, &m, err, cap);
    if (rc <= 0)
        return rc;
    if (m.vt != QG__V_STR || m.l == 0 || m.l > maxlen ||
        strlen(m.s) != m.l) {
        snprintf(err, cap, "%s must be a string of 1 to %zu bytes", key,
                 maxlen);
        return -1;
    }
    *out = m.s;
    return 1;
}

int qg__reqjson_int(const qg__reqjson *rj, const char *key, int required,
                    int64_t min, int64_t max, int64_t *out, char *err,
                    size_t cap)
{
    qg__reqfield m;
    int rc = present(rj, key, required, &m, err, cap);
    if (rc <= 0)
        return rc;
    if (m.vt == QG__V_INT && m.iv > max) {
        snprintf(err, cap, "%s must be at most %lld", key, (long long)max);
        return -2;
    }
    if (m.vt != QG__V_INT || m.iv < min) {
        snprintf(err, cap, "%s must be an integer from %lld to %lld", key,
                 (long long)min, (long long)max);
        return -1;
    }
    *out = m.iv;
    return 1;
}

int qg__reqjson_milli(const qg__reqjson *rj, const char *key, int required,
                      int64_t *out, char *err, size_t cap)
{
    qg__reqfield m;
    int rc = present(rj, key, required, &m, err, cap);
    if (rc <= 0)
        return rc;
    if (m.vt == QG__V_INT) {
        if (m.iv < 0) {
            snprintf(err, cap, "%s must be a number >= 0", key);
            return -1;
        }
        if (m.iv > QG_AMOUNT_MAX_MILLI / 1000) {
            snprintf(err, cap, "%s must be at most %lld (the bound on one "
                     "request's weight)", key,
                     (long long)(QG_AMOUNT_MAX_MILLI / 1000));
            return -2;
        }
        *out = m.iv * 1000;
        return 1;
    }
    if (m.vt == QG__V_REAL) {
        /* The input boundary: a decimal from JSON into milli-units; it
         * must be exact to the milli (at most 3 decimals).  r is the
         * nearest milli count (below 2^53: exact); r / 1000 is the
         * double nearest that 3-decimal value, and the text's own double
         * equals it only when the text is that value: two decimals of at
         * most 15 significant digits never share a double.  (A test
         * relative to the value let 999.9999 through as 1000.) */
        double d = m.dv, r = nearbyint(d * 1000.0);
        if (d > 1e12) {
            snprintf(err, cap, "%s with a fraction or exponent must be at "
                     "most 1000000000000 (whole numbers up to %lld)", key,
                     (long long)(QG_AMOUNT_MAX_MILLI / 1000));
            return -2;
        }
        if (!(d >= 0) || r / 1000.0 != d) {
            snprintf(err, cap, "%s must be a number >= 0 with at most 3 "
                     "decimals", key);
            return -1;
        }
        *out = (int64_t)r;
        return 1;
    }
    snprintf(err, cap, "%s must be a number", key);
    return -1;
}

int qg__reqjson_bool(const qg__reqjson *rj, const char *key, int *out,
                     char *err, size_t cap)
{
    qg__reqfield m;
    if (!member(rj, key, &m))
        return 0;
    if (m.vt != QG__V_BOOL) {
        snprintf(err, cap, "%s must be true or false", key);
        return -1;
    }
    *out = (int)m.iv;
    return 1;
}
