/* fuzz_reqjson.c - the decision API's strict request bodies (reqjson.c):
 * the bytes are a body read as /v1/check, /v1/settle and the two admin
 * routes read theirs (the same allowed keys, getters and bounds as
 * h_decide.c and h_admin.c), checked against a reference built here.
 *
 * The reference walks the same text with yajl (whose number callback
 * gives a number's raw text) once jansson accepted it, and says from the
 * text alone what each getter must answer:
 *  - qg__reqjson_parse: an object, at most QG_JSON_MAX_DEPTH deep, with
 *    only allowed keys;
 *  - qg__reqjson_int: an integer literal within the bounds, exactly;
 *  - qg__reqjson_milli: the decimal's exact value in milli-units: refused
 *    when negative or when it has digits beyond the third decimal;
 *    accepted, exactly, from 0 up to 10^12 points; above that the
 *    getter may refuse, and what it accepts must be exact.  Texts with
 *    more than 15 significant digits or an exponent beyond +-300 are
 *    not compared (a double holds 15 digits exactly; beyond, or past its
 *    range, the text and the double jansson reads differ);
 *  - qg__reqjson_str: a string of 1..maxlen bytes without NUL.
 * A refusal is any negative return (a range error may have its own).
 * Then the one-pass reading must agree with jansson's on everything
 * (tests/support/reqjsonref.c).  A disagreement aborts. */
#include <string.h>

#include <jansson.h>
#include <yajl/yajl_parse.h>

#include "fuzz.h"
#include "quotagate.h"
#include "reqjson.h"
#include "reqjsonref.h"
#include "rules.h"

#define ERRCAP 320
#define MILLI_SURE_MAX INT64_C(1000000000000000) /* 10^12 points */

/* ---- the reference: the top object's members, from the raw text */

#define MAXMEM 16
typedef struct member {
    char key[32];           /* "" when longer (no allowed key is) */
    int vt;                 /* 0 other, 1 number, 2 string */
    char num[64];           /* a number's raw text (truncated: "long") */
    int num_long;
    size_t slen;            /* a string's decoded bytes */
    int snul;               /* it holds a NUL */
} member;

typedef struct ref {
    int depth, max_depth;
    int nmem;
    member mem[MAXMEM];
    int cur;                /* member of the top object being read, -1 */
} ref;

static member *top_value(ref *f)
{
    return f->depth == 1 && f->cur >= 0 ? &f->mem[f->cur] : NULL;
}

static int r_number(void *ctx, const char *s, size_t l)
{
    member *m = top_value(ctx);
    if (m) {
        m->vt = 1;
        m->num_long = l >= sizeof m->num;
        memcpy(m->num, s, m->num_long ? 0 : l);
        m->num[m->num_long ? 0 : l] = '\0';
    }
    return 1;
}

static int r_string(void *ctx, const unsigned char *s, size_t l)
{
    member *m = top_value(ctx);
    if (m) {
        m->vt = 2;
        m->slen = l;
        m->snul = memchr(s, '\0', l) != NULL;
    }
    return 1;
}

static int r_other(void *ctx)
{
    (void)ctx;
    return 1;
}

static int r_bool(void *ctx, int b)
{
    (void)b;
    return r_other(ctx);
}

static int r_open(void *ctx)
{
    ref *f = ctx;
    if (++f->depth > f->max_depth)
        f->max_depth = f->depth;
    return 1;
}

static int r_close(void *ctx)
{
    ref *f = ctx;
    f->depth--;
    return 1;
}

static int r_key(void *ctx, const unsigned char *s, size_t l)
{
    ref *f = ctx;
    f->cur = -1;
    if (f->depth != 1 || f->nmem == MAXMEM)
        return 1;
    f->cur = f->nmem++;
    memset(&f->mem[f->cur], 0, sizeof f->mem[0]);
    if (l < sizeof f->mem[0].key && !memchr(s, '\0', l))
        memcpy(f->mem[f->cur].key, s, l);
    return 1;
}

static const yajl_callbacks ref_cb = {
    .yajl_null = r_other, .yajl_boolean = r_bool, .yajl_number = r_number,
    .yajl_string = r_string, .yajl_start_map = r_open, .yajl_map_key = r_key,
    .yajl_end_map = r_close, .yajl_start_array = r_open,
    .yajl_end_array = r_close,
};

/* 0 when yajl could not walk the text (then nothing is compared). */
static int ref_walk(const char *s, size_t n, ref *f)
{
    yajl_handle h = yajl_alloc(&ref_cb, NULL, f);
    int ok;
    memset(f, 0, sizeof *f);
    f->cur = -1;
    if (!h)
        return 0;
    ok = yajl_parse(h, (const unsigned char *)s, n) == yajl_status_ok &&
         yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    return ok;
}

static const member *ref_get(const ref *f, const char *key)
{
    for (int i = 0; i < f->nmem; i++)
        if (strcmp(f->mem[i].key, key) == 0)
            return &f->mem[i];
    return NULL;
}

/* A JSON number's text as sign * D * 10^e, D below 10^15 with its
 * trailing zeros moved into e (D 0: e 0).  0 when it has more than 15
 * significant digits or e is beyond +-300.  *is_int: an integer literal (no '.', no
 * exponent), which jansson reads as an integer. */
static int decimal_of(const char *t, int *neg, int64_t *d, int64_t *e,
                      int *is_int)
{
    char dig[64];
    size_t n = 0, lo = 0;
    int64_t frac = 0, x = 0;
    const char *p = t;
    *neg = *p == '-';
    p += *neg;
    *is_int = 1;
    for (; *p >= '0' && *p <= '9'; p++)
        if (n < sizeof dig)
            dig[n++] = *p;
    if (*p == '.') {
        *is_int = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, frac++)
            if (n < sizeof dig)
                dig[n++] = *p;
    }
    if (*p == 'e' || *p == 'E') {
        int eneg;
        *is_int = 0;
        p++;
        eneg = *p == '-';
        p += *p == '-' || *p == '+';
        for (; *p >= '0' && *p <= '9'; p++)
            if (x < 100000)
                x = x * 10 + (*p - '0');
        if (eneg)
            x = -x;
    }
    while (lo < n && dig[lo] == '0')
        lo++;
    *d = 0;
    *e = 0;
    if (lo == n)
        return 1;                   /* zero */
    x -= frac;
    while (dig[n - 1] == '0') {
        n--;
        x++;
    }
    if (n - lo > 15 || n == sizeof dig || x < -300 || x > 300)
        return 0;                   /* beyond a double's exactness */
    for (size_t i = lo; i < n; i++)
        *d = *d * 10 + (dig[i] - '0');
    *e = x;
    return 1;
}

/* ---- the routes' bodies (their own key lists, reqjson.h) */

typedef struct input {
    const uint8_t *data;
    size_t size;
    qg__reqjson o;
    const ref *f;           /* NULL: no comparison */
} input;

static void check_str(const input *in, const char *key, int required,
                      size_t maxlen)
{
    char err[ERRCAP];
    const char *out = NULL;
    int rc = qg__reqjson_str(&in->o, key, required, maxlen, &out, err,
                            sizeof err);
    const member *m = in->f ? ref_get(in->f, key) : NULL;
    if (rc == 1 && (!out || strlen(out) == 0 || strlen(out) > maxlen))
        fuzz_fail("qg__reqjson_str returned a bad string", in->data, in->size);
    if (!in->f || !m || m->vt == 0)
        return;                     /* absent, null, or another type */
    if (m->vt == 2 && (rc == 1) != (m->slen >= 1 && m->slen <= maxlen &&
                                    !m->snul))
        fuzz_fail("qg__reqjson_str differs from the reference", in->data,
                  in->size);
    if (m->vt == 1 && rc >= 0)
        fuzz_fail("qg__reqjson_str took a number", in->data, in->size);
}

static void check_int(const input *in, const char *key, int64_t max)
{
    char err[ERRCAP];
    int64_t v = -7;
    int rc = qg__reqjson_int(&in->o, key, 0, 0, max, &v, err, sizeof err);
    const member *m = in->f ? ref_get(in->f, key) : NULL;
    int neg, is_int;
    int64_t d, e;
    if (!m || m->vt != 1 || m->num_long ||
        !decimal_of(m->num, &neg, &d, &e, &is_int))
        return;
    if (!is_int) {
        if (rc >= 0)
            fuzz_fail("qg__reqjson_int took a real", in->data, in->size);
        return;
    }
    for (; e > 0 && d <= max; e--)
        d *= 10;
    if ((neg && d != 0) || d > max) {
        if (rc >= 0)
            fuzz_fail("qg__reqjson_int took an integer out of range",
                      in->data, in->size);
    } else if (rc != 1 || v != d) {
        fuzz_fail("qg__reqjson_int differs from the reference", in->data,
                  in->size);
    }
}

static void check_milli(const input *in, const char *key)
{
    char err[ERRCAP];
    int64_t v = -7, d, e;
    int rc = qg__reqjson_milli(&in->o, key, 0, &v, err, sizeof err);
    const member *m = in->f ? ref_get(in->f, key) : NULL;
    int neg, is_int, big = 0;
    if (rc == 1 && v < 0)
        fuzz_fail("qg__reqjson_milli returned a negative", in->data, in->size);
    if (!m || m->vt != 1 || m->num_long ||
        !decimal_of(m->num, &neg, &d, &e, &is_int))
        return;
    e += 3;                         /* points to milli-points */
    if (d != 0 && neg) {
        if (rc >= 0)
            fuzz_fail("qg__reqjson_milli took a negative number", in->data,
                      in->size);
        return;
    }
    if (d != 0 && e < 0) {
        if (rc >= 0)
            fuzz_fail("qg__reqjson_milli took more than 3 decimals",
                      in->data, in->size);
        return;
    }
    for (; d != 0 && e > 0 && !big; e--) {
        if (d > INT64_MAX / 10)
            big = 1;
        else
            d *= 10;
    }
    if (big || d > MILLI_SURE_MAX) {
        if (rc == 1 && (big || v != d))
            fuzz_fail("qg__reqjson_milli took a large number inexactly",
                      in->data, in->size);
    } else if (rc != 1 || v != d) {
        fuzz_fail("qg__reqjson_milli differs from the reference", in->data,
                  in->size);
    }
}

/* Parse as one route does into o; 1 when taken.  Then its getters. */
static int route(const uint8_t *data, size_t size, const ref *f,
                 const char *const *allowed, qg__reqjson *o)
{
    char err[ERRCAP];
    int rc;
    err[0] = '\0';
    rc = qg__reqjson_parse(o, (const char *)data, size, allowed, err,
                           sizeof err);
    if (rc != 0 && !err[0])
        fuzz_fail("qg__reqjson_parse refused without a message", data, size);
    if (f) {
        int ok = f->max_depth <= QG_JSON_MAX_DEPTH && f->nmem < MAXMEM;
        for (int i = 0; ok && i < f->nmem; i++) {
            int known = 0;
            for (const char *const *a = allowed; *a && f->mem[i].key[0];
                 a++)
                known |= strcmp(*a, f->mem[i].key) == 0;
            ok = known;
        }
        /* nmem == MAXMEM: keys beyond were not recorded; not compared */
        if (f->nmem < MAXMEM && (rc == 0) != ok)
            fuzz_fail("qg__reqjson_parse differs from the reference", data,
                      size);
    }
    if (rc != 0)
        qg__reqjson_free(o);
    return rc == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    ref f;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES,
                           &je);
    /* compared only where jansson took an object and yajl could walk it */
    const ref *fp = json_is_object(j) &&
                    ref_walk((const char *)data, size, &f) ? &f : NULL;
    input in = {.data = data, .size = size, .f = fp};
    json_decref(j);

    if (!tst_reqjson_agree((const char *)data, size))
        fuzz_fail("the one-pass reading differs from jansson's", data, size);
    if (route(data, size, fp, qg__check_keys, &in.o)) {
        check_str(&in, "subject", 1, 255);
        check_str(&in, "request_id", 1, QG_REQUEST_ID_MAX);
        check_str(&in, "model", 0, QG_NAME_MAX - 1);
        check_int(&in, "input_tokens", INT64_C(1) << 40);
        check_int(&in, "max_output_tokens", INT64_C(1) << 40);
        check_milli(&in, "weight");
        qg__reqjson_free(&in.o);
    }
    if (route(data, size, fp, qg__settle_keys, &in.o)) {
        check_str(&in, "request_id", 1, QG_REQUEST_ID_MAX);
        check_str(&in, "status", 1, 16);
        check_int(&in, "output_tokens", INT64_C(1) << 40);
        check_milli(&in, "weight");
        qg__reqjson_free(&in.o);
    }
    if (route(data, size, fp, qg__subject_keys, &in.o)) {
        check_str(&in, "plan", 1, 63);
        check_str(&in, "billing_anchor", 0, 64);
        qg__reqjson_free(&in.o);
    }
    if (route(data, size, fp, qg__key_keys, &in.o)) {
        check_str(&in, "subject", 1, 255);
        qg__reqjson_free(&in.o);
    }
    return 0;
}
