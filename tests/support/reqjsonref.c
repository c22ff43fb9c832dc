/* reqjsonref.c - see reqjsonref.h. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "quotagate.h"
#include "reqjson.h"
#include "reqjsonref.h"

#define ERRCAP 320

/* the routes' own lists, check's first (tst_reqjson_last_pass) */
static const char *const *const routes[] = {
    qg__check_keys, qg__settle_keys, qg__subject_keys, qg__key_keys,
    qg__reconcile_keys};

static int last_pass;

/* One getter's answer: its result, value and message. */
typedef struct answer {
    int rc;
    int64_t v;
    char s[1100];
    char err[ERRCAP];
} answer;

static int differ(const char *what, const char *key, const answer *a,
                  const answer *b, const char *text, size_t n)
{
    if (a->rc == b->rc && a->v == b->v && strcmp(a->s, b->s) == 0 &&
        (a->rc >= 0 || strcmp(a->err, b->err) == 0))
        return 0;
    fprintf(stderr, "reqjson: %s(%s) differs on %.*s:\n"
            "  one pass: %d %lld \"%s\" %s\n  jansson:  %d %lld \"%s\" %s\n",
            what, key, (int)(n > 200 ? 200 : n), text ? text : "", a->rc,
            (long long)a->v, a->s, a->rc < 0 ? a->err : "", b->rc,
            (long long)b->v, b->s, b->rc < 0 ? b->err : "");
    return 1;
}

static void get_str(qg__reqjson *rj, const char *key, int req, size_t max,
                    answer *a)
{
    const char *out = NULL;
    memset(a, 0, sizeof *a);
    a->rc = qg__reqjson_str(rj, key, req, max, &out, a->err, sizeof a->err);
    if (a->rc == 1)
        snprintf(a->s, sizeof a->s, "%s", out);
}

static void get_int(qg__reqjson *rj, const char *key, int req, int64_t min,
                    int64_t max, answer *a)
{
    memset(a, 0, sizeof *a);
    a->v = -7;
    a->rc = qg__reqjson_int(rj, key, req, min, max, &a->v, a->err,
                            sizeof a->err);
}

static void get_milli(qg__reqjson *rj, const char *key, int req, answer *a)
{
    memset(a, 0, sizeof *a);
    a->v = -7;
    a->rc = qg__reqjson_milli(rj, key, req, &a->v, a->err, sizeof a->err);
}

static void get_bool(qg__reqjson *rj, const char *key, answer *a)
{
    int b = -7;
    memset(a, 0, sizeof *a);
    a->rc = qg__reqjson_bool(rj, key, &b, a->err, sizeof a->err);
    a->v = b;
}

/* Every getter of every allowed key (and one key not allowed). */
static int getters_agree(qg__reqjson *p, qg__reqjson *t,
                         const char *const *allowed, const char *s, size_t n)
{
    static const size_t maxlens[] = {1, 16, 63, 64, QG_REQUEST_ID_MAX};
    static const int64_t bounds[][2] = {
        {0, QG_TOKENS_MAX}, {-5, 5}, {INT64_MIN, INT64_MAX}};
    answer a, b;
    for (int k = 0; allowed[k] || k == 0; k++) {
        const char *key = allowed[k] ? allowed[k] : "absent";
        for (int req = 0; req <= 1; req++) {
            for (size_t m = 0; m < sizeof maxlens / sizeof maxlens[0]; m++) {
                get_str(p, key, req, maxlens[m], &a);
                get_str(t, key, req, maxlens[m], &b);
                if (differ("str", key, &a, &b, s, n))
                    return 0;
            }
            for (size_t m = 0; m < sizeof bounds / sizeof bounds[0]; m++) {
                get_int(p, key, req, bounds[m][0], bounds[m][1], &a);
                get_int(t, key, req, bounds[m][0], bounds[m][1], &b);
                if (differ("int", key, &a, &b, s, n))
                    return 0;
            }
            get_milli(p, key, req, &a);
            get_milli(t, key, req, &b);
            if (differ("milli", key, &a, &b, s, n))
                return 0;
        }
        get_bool(p, key, &a);
        get_bool(t, key, &b);
        if (differ("bool", key, &a, &b, s, n))
            return 0;
        if (!allowed[k])
            break;
    }
    return 1;
}

int tst_reqjson_agree(const char *s, size_t n)
{
    for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++) {
        qg__reqjson p, t;
        answer a, b;
        int ok = 1;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        a.rc = qg__reqjson_parse(&p, s, n, routes[r], a.err, sizeof a.err);
        b.rc = qg__reqjson_parse_tree(&t, s, n, routes[r], b.err,
                                      sizeof b.err);
        if (r == 0)
            last_pass = a.rc == 0 && p.tree == NULL;
        if (differ("parse", "", &a, &b, s, n))
            ok = 0;
        else if (a.rc == 0)
            ok = getters_agree(&p, &t, routes[r], s, n);
        qg__reqjson_free(&p);
        qg__reqjson_free(&t);
        if (!ok)
            return 0;
    }
    return 1;
}

int tst_reqjson_last_pass(void)
{
    return last_pass;
}
