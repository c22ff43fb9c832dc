/* reqscan.c - see reqscan.h: respscan.c's checked pass with callbacks
 * that follow a few paths of a request (.model, .messages[i].content[j],
 * ...), as its response reader does, plus a set of the keys seen so far
 * in each open object to refuse duplicates.  The set is keyed by
 * (object serial, key bytes) and kept on the stack for ordinary bodies;
 * a body with many keys moves it to malloc. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "reqscan.h"

#define MAX_DEPTH 2048      /* as respscan.c: containers open at most */

enum {
    N_OTHER, N_ROOT, N_MSGS, N_MSG, N_CONTENT0, N_PART0, N_CONTENT1,
    N_PART1
};
#define NODE_DEPTH 7        /* root .messages [i] .content [j] .content [k] */

enum {
    K_OTHER, K_MODEL, K_STREAM, K_STREAM_OPTIONS, K_MCT, K_MT, K_MESSAGES,
    K_SYSTEM, K_CONTENT, K_TEXT
};

/* A key seen: its hash, its object's serial, its bytes in the store. */
typedef struct kent {
    uint64_t h;
    uint32_t obj;           /* 0: an empty slot */
    uint32_t len;
    size_t off;
} kent;

#define TAB0 64             /* slots on the stack (a power of two) */
#define BYTES0 1024

typedef struct rscan {
    qg__req *r;
    unsigned char node[NODE_DEPTH];
    int key;
    int64_t part_text, part_inner; /* the current first-level part */
    int part_has_text;
    int enomem;
    /* the duplicate-key set */
    uint32_t obj[MAX_DEPTH];        /* serial of the object at each depth */
    uint32_t next_obj;
    kent *tab;
    size_t cap, n;
    unsigned char *bytes;
    size_t bcap, bused;
    kent tab0[TAB0];
    unsigned char bytes0[BYTES0];
} rscan;

/* ---------------------------------------------------- the key set */

static int grow_tab(rscan *sc)
{
    size_t cap = sc->cap * 2;
    kent *t = calloc(cap, sizeof *t);
    if (!t)
        return -1;
    for (size_t i = 0; i < sc->cap; i++) {
        kent *e = &sc->tab[i];
        if (!e->obj)
            continue;
        size_t j = (size_t)e->h & (cap - 1);
        while (t[j].obj)
            j = (j + 1) & (cap - 1);
        t[j] = *e;
    }
    if (sc->tab != sc->tab0)
        free(sc->tab);
    sc->tab = t;
    sc->cap = cap;
    return 0;
}

static int grow_bytes(rscan *sc, size_t need)
{
    size_t cap = sc->bcap;
    unsigned char *b;
    while (cap - sc->bused < need)
        cap *= 2;
    if (sc->bytes == sc->bytes0) {
        if ((b = malloc(cap)) != NULL)
            memcpy(b, sc->bytes0, sc->bused);
    } else {
        b = realloc(sc->bytes, cap);
    }
    if (!b)
        return -1;
    sc->bytes = b;
    sc->bcap = cap;
    return 0;
}

/* Add key s[0..l) of object obj: 1, or 0 when it is already there (or
 * memory ran out: sc->enomem). */
static int add_key(rscan *sc, uint32_t obj, const unsigned char *s, size_t l)
{
    uint64_t h = XXH3_64bits_withSeed(s, l, obj);
    size_t j = (size_t)h & (sc->cap - 1);
    for (; sc->tab[j].obj; j = (j + 1) & (sc->cap - 1)) {
        const kent *e = &sc->tab[j];
        if (e->h == h && e->obj == obj && e->len == l &&
            memcmp(sc->bytes + e->off, s, l) == 0)
            return 0;               /* a duplicate key */
    }
    if (l > UINT32_MAX ||
        (sc->bcap - sc->bused < l && grow_bytes(sc, l) != 0)) {
        sc->enomem = 1;
        return 0;
    }
    if (l)
        memcpy(sc->bytes + sc->bused, s, l);
    sc->tab[j] = (kent){h, obj, (uint32_t)l, sc->bused};
    sc->bused += l;
    if (++sc->n * 2 > sc->cap && grow_tab(sc) != 0) {
        sc->enomem = 1;
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------ callbacks */

static void set_count(qg__count *c, int vt, int64_t iv)
{
    c->v = 0;
    c->state = vt == QG__V_NULL ? 0
               : (vt == QG__V_INT && iv >= 0) ? 1 : -1;
    if (c->state == 1)
        c->v = iv;
}

static int req_value(void *ctx, int depth, int vt, const unsigned char *s,
                     size_t l, int64_t iv)
{
    rscan *sc = ctx;
    qg__req *r = sc->r;
    int parent = depth == 0 ? -1
                 : depth <= NODE_DEPTH ? sc->node[depth - 1] : N_OTHER;
    int k = sc->key, child = N_OTHER;
    int64_t slen = vt == QG__V_STR ? (int64_t)l : 0;

    switch (parent) {
    case -1:
        child = N_ROOT;             /* an object: qg__json_scan checked */
        break;
    case N_ROOT:
        switch (k) {
        case K_MODEL:
            r->model = vt == QG__V_STR ? 1 : -1;
            r->model_len = vt == QG__V_STR ? l : 0;
            r->model_nul = 0;
            r->model_s[0] = '\0';
            if (vt == QG__V_STR && l < sizeof r->model_s) {
                r->model_nul = l && memchr(s, '\0', l) != NULL;
                if (l)
                    memcpy(r->model_s, s, l);
                r->model_s[l] = '\0';
            }
            break;
        case K_STREAM:
            r->stream = vt;
            r->stream_true = vt == QG__V_BOOL && iv;
            break;
        case K_STREAM_OPTIONS:
            r->stream_options = vt;
            break;
        case K_MCT:
            set_count(&r->max_completion_tokens, vt, iv);
            break;
        case K_MT:
            set_count(&r->max_tokens, vt, iv);
            break;
        case K_MESSAGES:
            r->messages = vt == QG__V_NULL ? 0 : vt == QG__V_ARR ? 1 : -1;
            child = N_MSGS;
            break;
        case K_SYSTEM:
            r->input_bytes += slen;
            child = N_CONTENT0;
            break;
        default:
            break;
        }
        break;
    case N_MSGS:
        child = N_MSG;
        break;
    case N_MSG:
        if (k == K_CONTENT) {
            r->input_bytes += slen;
            child = N_CONTENT0;
        }
        break;
    case N_CONTENT0:
        sc->part_text = sc->part_inner = 0;
        sc->part_has_text = 0;
        child = N_PART0;
        break;
    case N_PART0:
        if (k == K_TEXT) {
            sc->part_has_text = vt == QG__V_STR;
            sc->part_text = slen;
        } else if (k == K_CONTENT) {
            sc->part_inner = slen;
            child = N_CONTENT1;
        }
        break;
    case N_CONTENT1:
        child = N_PART1;
        break;
    case N_PART1:
        if (k == K_TEXT)
            sc->part_inner += slen;
        break;
    default:
        break;
    }
    if (vt == QG__V_MAP || vt == QG__V_ARR) {
        /* a node only for the container type its path expects */
        int want_arr = child == N_MSGS || child == N_CONTENT0 ||
                       child == N_CONTENT1;
        if (child != N_OTHER && want_arr != (vt == QG__V_ARR))
            child = N_OTHER;
        if (depth < NODE_DEPTH)
            sc->node[depth] = (unsigned char)child;
        if (vt == QG__V_MAP)
            sc->obj[depth] = ++sc->next_obj;
    }
    return 1;
}

static int req_end(void *ctx, int depth)
{
    rscan *sc = ctx;
    if (depth <= NODE_DEPTH && sc->node[depth - 1] == N_PART0)
        sc->r->input_bytes +=
            sc->part_has_text ? sc->part_text : sc->part_inner;
    return 1;
}

static int key_is(const unsigned char *s, size_t l, const char *name)
{
    return strlen(name) == l && memcmp(s, name, l) == 0;
}

static int req_key(void *ctx, int depth, const unsigned char *s, size_t l)
{
    rscan *sc = ctx;
    int node = depth <= NODE_DEPTH ? sc->node[depth - 1] : N_OTHER;
    int k = K_OTHER;
    if (!add_key(sc, sc->obj[depth - 1], s, l))
        return 0;
    switch (node) {
    case N_ROOT:
        k = key_is(s, l, "model")                   ? K_MODEL
            : key_is(s, l, "messages")              ? K_MESSAGES
            : key_is(s, l, "stream")                ? K_STREAM
            : key_is(s, l, "stream_options")        ? K_STREAM_OPTIONS
            : key_is(s, l, "max_tokens")            ? K_MT
            : key_is(s, l, "max_completion_tokens") ? K_MCT
            : key_is(s, l, "system")                ? K_SYSTEM
                                                    : K_OTHER;
        break;
    case N_MSG:
        k = key_is(s, l, "content") ? K_CONTENT : K_OTHER;
        break;
    case N_PART0:
        k = key_is(s, l, "text")      ? K_TEXT
            : key_is(s, l, "content") ? K_CONTENT
                                      : K_OTHER;
        break;
    case N_PART1:
        k = key_is(s, l, "text") ? K_TEXT : K_OTHER;
        break;
    default:
        break;
    }
    sc->key = k;
    return 1;
}

/* ----------------------------------------------------------- scan */

int qg__req_scan(const char *text, size_t len, qg__req *out)
{
    static const qg__json_ops ops = {req_value, req_key, req_end};
    rscan sc;
    int rc;
    memset(out, 0, sizeof *out);
    out->stream = out->stream_options = -1;
    sc.r = out;
    sc.key = K_OTHER;
    sc.part_text = sc.part_inner = 0;
    sc.part_has_text = 0;
    sc.enomem = 0;
    sc.next_obj = 0;
    memset(sc.tab0, 0, sizeof sc.tab0);
    sc.tab = sc.tab0;
    sc.cap = TAB0;
    sc.n = 0;
    sc.bytes = sc.bytes0;
    sc.bcap = BYTES0;
    sc.bused = 0;
    rc = qg__json_scan(text, len, &ops, &sc);
    if (sc.tab != sc.tab0)
        free(sc.tab);
    if (sc.bytes != sc.bytes0)
        free(sc.bytes);
    if (rc != 0) {
        memset(out, 0, sizeof *out);
        out->stream = out->stream_options = -1;
        return sc.enomem ? -2 : -1;
    }
    return 0;
}
