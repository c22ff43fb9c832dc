/* redis_reply_mem.c - where hiredis puts a reply's objects: one block per
 * reply (redis_link_int.h, qg__rl_reply_fns).
 *
 * hiredis's own reader functions make every element of an array reply
 * its own calloc, and every string a malloc, then free them one by one:
 * a decision's reply (an array of ~20 integers and a kind) cost the
 * gateway about as many instructions in malloc and free as in reading
 * it (callgrind, docs/benchmarks.md).  hiredis lets a reader build its
 * objects with other functions (redisReplyObjectFunctions); these build
 * the same redisReply trees, so every caller reads them as before, but
 * from one block sized when the reply's first line says what it is: its
 * root, the root's element array and room for that many elements and
 * their strings.  An object that does not fit (a long string, a nested
 * array) gets an allocation of its own, freed with the block.
 *
 * The reader asks freeObject to free a reply's root only (after the
 * reply's callback, or a half-read root when it fails or is freed); the
 * block's header sits just before the root.  A child finds the block
 * through its task's parents: the root task's obj is the root.  When a
 * child's string or element array cannot be had, the child stays linked
 * in its tree (the reader then frees the root, and with it the tree); a
 * root that cannot be completed frees its block itself (the reader has
 * not taken it yet). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "redis_link_int.h"

typedef struct blk {
    size_t cap, used;           /* bytes after the header */
} blk;

#define HDR ((sizeof(blk) + 15) & ~(size_t)15)
#define ELEM_ROOM 24            /* string bytes per element budgeted */
#define MAX_BLOCK (64u << 10)   /* beyond this, objects of their own */

static blk *blk_of(const redisReply *root)
{
    return (blk *)(void *)((char *)root - HDR);
}

static int inside(const blk *b, const void *p)
{
    const char *c = p, *s = (const char *)b + HDR;
    return c >= s && c < s + b->cap;
}

/* n bytes (8-aligned) from b, or NULL when they do not fit. */
static void *take(blk *b, size_t n)
{
    char *p;
    n = (n + 7) & ~(size_t)7;
    if (!b || b->cap - b->used < n)
        return NULL;
    p = (char *)b + HDR + b->used;
    b->used += n;
    return p;
}

/* A new object for task t with room for `extra` more bytes when it is a
 * root (a block of its own), else from its root's block or the heap;
 * linked into its parent.  *bp: the block, NULL when none. */
static redisReply *object(const redisReadTask *t, size_t extra, blk **bp)
{
    redisReply *r;
    blk *b;

    if (!t->parent) {
        size_t cap = sizeof(redisReply) + extra;
        if (!(b = malloc(HDR + cap)))
            return NULL;
        b->cap = cap;
        b->used = 0;
        r = take(b, sizeof *r);
    } else {
        const redisReadTask *root = t;
        while (root->parent)
            root = root->parent;
        b = root->obj ? blk_of(root->obj) : NULL;
        if (!(r = take(b, sizeof *r)) && !(r = malloc(sizeof *r)))
            return NULL;
    }
    memset(r, 0, sizeof *r);
    r->type = t->type;
    if (t->parent) {
        redisReply *parent = t->parent->obj;
        parent->element[t->idx] = r;
    }
    *bp = b;
    return r;
}

static void *create_string(const redisReadTask *t, char *str, size_t len)
{
    blk *b;
    redisReply *r = object(t, len + 1, &b);
    char *s;
    if (!r)
        return NULL;
    if (!(s = take(b, len + 1)) && !(s = malloc(len + 1))) {
        /* a child stays in its tree, which the reader frees whole */
        if (!t->parent)
            free(b);
        return NULL;
    }
    memcpy(s, str, len);
    s[len] = 0;
    r->str = s;
    r->len = len;
    return r;
}

static void *create_array(const redisReadTask *t, int elements)
{
    size_t n = elements > 0 ? (size_t)elements : 0;
    size_t extra = n * (sizeof(redisReply *) + sizeof(redisReply) + ELEM_ROOM);
    blk *b;
    redisReply *r;
    void **el = NULL;

    if (extra > MAX_BLOCK)
        extra = n * sizeof(redisReply *) <= MAX_BLOCK
                    ? n * sizeof(redisReply *) : 0;
    if (!(r = object(t, extra, &b)))
        return NULL;
    if (n) {
        if ((el = take(b, n * sizeof *el)) != NULL)
            memset(el, 0, n * sizeof *el);
        else if (!(el = calloc(n, sizeof *el))) {
            if (!t->parent)
                free(b);
            return NULL;
        }
    }
    r->element = (redisReply **)el;
    r->elements = n;
    return r;
}

static void *create_integer(const redisReadTask *t, long long v)
{
    blk *b;
    redisReply *r = object(t, 0, &b);
    if (r)
        r->integer = v;
    return r;
}

static void *create_nil(const redisReadTask *t)
{
    blk *b;
    redisReply *r = object(t, 0, &b);
    if (r)
        r->type = REDIS_REPLY_NIL;   /* the task's type says "$" or "*" */
    return r;
}

/* Free what of r's tree lies outside b. */
static void free_outside(blk *b, redisReply *r)
{
    if (r->element) {
        for (size_t i = 0; i < r->elements; i++)
            if (r->element[i])
                free_outside(b, r->element[i]);
        if (!inside(b, r->element))
            free(r->element);
    }
    if (r->str && !inside(b, r->str))
        free(r->str);
    if (!inside(b, r))
        free(r);
}

static void free_object(void *p)
{
    redisReply *root = p;
    blk *b;
    if (!root)
        return;
    b = blk_of(root);
    free_outside(b, root);
    free(b);
}

redisReplyObjectFunctions qg__rl_reply_fns = {
    create_string, create_array, create_integer, create_nil, free_object,
};
