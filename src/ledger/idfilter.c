/* idfilter.c - the Bloom filter of the ledger's request ids (idfilter.h).
 *
 * Blocked: one XXH3-128 hash picks a 512-bit block (one cache line) with
 * its low half and 7 bits inside it with 9-bit slices of its high half, so
 * a test costs one cache miss per level, not seven.  At 10 bits per id
 * the false positive rate is about 1% (a little above an unblocked
 * filter's 0.8%).  A block is found by a multiply and a shift, not a
 * division; the levels and how they grow: idfilter.h. */
#include <stdlib.h>
#include <xxhash.h>

#include "idfilter.h"

#define K 7
#define BLOCK_WORDS 8            /* 512 bits */
#define MIN_BITS (1ULL << 24)
#define MAX_BITS (1ULL << 30)

/* Level i's bits per id: 10, 12, 14, then 16. */
static uint64_t bits_per_id(int i)
{
    return i < 3 ? 10 + 2 * (uint64_t)i : 16;
}

/* Make level i (not yet counted in nlevels) for `expected` ids: whole
 * blocks, at least MIN_BITS, at most MAX_BITS. */
static int level_make(qg__idf *f, int i, uint64_t expected)
{
    qg__idf_level *l = &f->lv[i];
    uint64_t per = bits_per_id(i), bits;
    bits = expected < MAX_BITS / per ? expected * per : MAX_BITS;
    bits = bits < MIN_BITS ? MIN_BITS : (bits + 511) / 512 * 512;
    l->words = calloc((size_t)(bits / 64), sizeof *l->words);
    if (!l->words)
        return -1;
    l->blocks = bits / 512;
    l->capacity = bits / per;
    f->bytes += bits / 8;
    return 0;
}

int qg__idf_init(qg__idf *f, uint64_t expected)
{
    atomic_store(&f->nlevels, 0);
    atomic_store(&f->ready, 0);
    f->held = 0;
    f->ids = 0;
    f->bytes = 0;
    if (level_make(f, 0, expected) != 0)
        return -1;
    atomic_store_explicit(&f->nlevels, 1, memory_order_release);
    return 0;
}

void qg__idf_free(qg__idf *f)
{
    int n = atomic_load(&f->nlevels);
    for (int i = 0; i < n; i++) {
        free((void *)f->lv[i].words);
        f->lv[i].words = NULL;
    }
    atomic_store(&f->nlevels, 0);
}

/* The block of id in level l: its first word (the hash's low half
 * scaled to the block count: levels need not be powers of two). */
static _Atomic uint64_t *block_of(const qg__idf_level *l, XXH128_hash_t h)
{
    uint64_t b = (uint64_t)(((unsigned __int128)h.low64 * l->blocks) >> 64);
    return l->words + b * BLOCK_WORDS;
}

void qg__idf_add(qg__idf *f, const char *id, size_t len)
{
    int n = atomic_load_explicit(&f->nlevels, memory_order_acquire);
    XXH128_hash_t h;
    _Atomic uint64_t *blk;
    if (n == 0)
        return;
    h = XXH3_128bits(id, len);
    blk = block_of(&f->lv[n - 1], h);
    for (int i = 0; i < K; i++) {
        unsigned b = (unsigned)(h.high64 >> (9 * i)) & 511;
        atomic_fetch_or_explicit(&blk[b >> 6], 1ULL << (b & 63),
                                 memory_order_release);
    }
}

int qg__idf_maybe(qg__idf *f, const char *id, size_t len)
{
    int n = atomic_load_explicit(&f->nlevels, memory_order_acquire);
    XXH128_hash_t h;
    if (n == 0 || !atomic_load_explicit(&f->ready, memory_order_acquire))
        return 1;
    h = XXH3_128bits(id, len);
    for (int lv = 0; lv < n; lv++) {
        _Atomic uint64_t *blk = block_of(&f->lv[lv], h);
        int all = 1;
        for (int i = 0; i < K && all; i++) {
            unsigned b = (unsigned)(h.high64 >> (9 * i)) & 511;
            all = (atomic_load_explicit(&blk[b >> 6], memory_order_acquire) &
                   (1ULL << (b & 63))) != 0;
        }
        if (all)
            return 1;
    }
    return 0;
}

int qg__idf_count(qg__idf *f, uint64_t n)
{
    int levels = atomic_load_explicit(&f->nlevels, memory_order_relaxed);
    if (levels == 0)
        return 0;
    f->held += n;
    f->ids += n;
    if (f->held < f->lv[levels - 1].capacity)
        return 0;
    f->held = 0;                 /* a failure is tried again a level later */
    if (levels == QG_IDF_LEVELS ||
        level_make(f, levels, 2 * f->lv[levels - 1].capacity) != 0)
        return -1;
    atomic_store_explicit(&f->nlevels, levels + 1, memory_order_release);
    return 1;
}
