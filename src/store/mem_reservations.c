/* mem_reservations.c - the memory store's request ids (mem_tables.h):
 * each reservation shard remembers at most max ids and forgets the oldest
 * settled (or expired) one to make room; when every remembered id is
 * still a live reservation, a new check is refused with QG_EFULL.
 *
 * The entries sit in a ring in insertion order, so the oldest is always
 * at head and a new one goes to head + count: both ends are sequential
 * memory.  Finding an id probes the index (4 or 8 bytes a slot,
 * mem_tables.h; linear probing, deletion by backward shift: no
 * tombstones) and reads the entry a slot whose hash bits match names to
 * compare the whole id. */
#include <stdlib.h>
#include <string.h>
#include "mem_tables.h"

/* Bits needed to write v (v > 0). */
static unsigned bits_of(uint32_t v)
{
    return 32u - (unsigned)__builtin_clz(v);
}

size_t qg__mem_resv_slot_size(uint32_t max, uint32_t cap)
{
    /* positions + 1 up to max; home slots below cap (a power of two) */
    unsigned need = bits_of(max ? max : 1) + bits_of(cap) - 1;
    return need + RESV_FILTER_BITS <= 32 ? 4 : 8;
}

void qg__mem_resv_init(resv_shard *sh, resv *ring, void *index,
                       uint32_t max, uint32_t cap)
{
    sh->ring = ring;
    sh->index = index;
    sh->max = max;
    sh->cap = cap;
    sh->wide = qg__mem_resv_slot_size(max, cap) == 8;
    sh->pos_bits = (uint8_t)(sh->wide ? 32 : bits_of(max ? max : 1));
    sh->tag_mask = sh->wide ? UINT32_MAX
                            : (uint32_t)((1ull << (32 - sh->pos_bits)) - 1);
}

/* The index's code is written once for both widths and inlined twice,
 * each copy with its width a constant: the entry points pick one per
 * call, not per slot (a branch per slot: 2% slower in the heavy rounds'
 * median, within their noise). */
#define SPECIALISED static inline __attribute__((always_inline))

/* Slot j's value and a slot's parts. */
SPECIALISED uint64_t slot_get(const resv_shard *sh, uint32_t j, int wide)
{
    return wide ? ((const uint64_t *)sh->index)[j]
                : ((const uint32_t *)sh->index)[j];
}

SPECIALISED void slot_put(resv_shard *sh, uint32_t j, uint64_t v, int wide)
{
    if (wide)
        ((uint64_t *)sh->index)[j] = v;
    else
        ((uint32_t *)sh->index)[j] = (uint32_t)v;
}

static inline uint32_t slot_pos(const resv_shard *sh, uint64_t v)
{
    return (uint32_t)(v & ((1ull << sh->pos_bits) - 1));   /* pos + 1 */
}

static inline uint32_t slot_tag(const resv_shard *sh, uint64_t v)
{
    return (uint32_t)(v >> sh->pos_bits);
}

SPECIALISED resv *find_in(resv_shard *sh, qg_key rid, int wide)
{
    uint32_t tag = resv_tag(rid) & sh->tag_mask, mask = sh->cap - 1;
    uint64_t v;
    for (uint32_t j = tag & mask; (v = slot_get(sh, j, wide)) != 0;
         j = (j + 1) & mask) {
        if (slot_tag(sh, v) == tag) {
            resv *r = &sh->ring[slot_pos(sh, v) - 1];
            if (key_eq(r->rid, rid))
                return r;
        }
    }
    return NULL;
}

resv *qg__mem_resv_find(resv_shard *sh, qg_key rid)
{
    return sh->wide ? find_in(sh, rid, 1) : find_in(sh, rid, 0);
}

/* Remove the index slot i, shifting later members of its probe run back
 * so that lookups never stop early. */
SPECIALISED void index_delete_at(resv_shard *sh, uint32_t i, int wide)
{
    uint32_t mask = sh->cap - 1, j = i;
    slot_put(sh, i, 0, wide);
    for (;;) {
        uint32_t home;
        uint64_t v;
        j = (j + 1) & mask;
        if ((v = slot_get(sh, j, wide)) == 0)
            return;
        home = slot_tag(sh, v) & mask;
        /* move j back to i when home is not cyclically within (i, j] */
        if ((i <= j) ? (home <= i || home > j) : (home <= i && home > j)) {
            slot_put(sh, i, v, wide);
            slot_put(sh, j, 0, wide);
            i = j;
        }
    }
}

/* The index slot of the entry at ring position pos - 1 (hash bits tag),
 * removed. */
SPECIALISED void index_forget(resv_shard *sh, uint32_t tag, uint32_t pos,
                              int wide)
{
    uint32_t mask = sh->cap - 1;
    uint64_t v;
    for (uint32_t j = tag & mask; (v = slot_get(sh, j, wide)) != 0;
         j = (j + 1) & mask)
        if (slot_pos(sh, v) == pos) {
            index_delete_at(sh, j, wide);
            return;
        }
}

/* A slot for the entry at ring position pos (hash bits tag, masked), at
 * the end of its home's probe run. */
SPECIALISED void index_put(resv_shard *sh, uint32_t tag, uint32_t pos,
                           int wide)
{
    uint32_t mask = sh->cap - 1, j;
    for (j = tag & mask; slot_get(sh, j, wide); j = (j + 1) & mask)
        ;
    slot_put(sh, j, (uint64_t)tag << sh->pos_bits | (pos + 1), wide);
}

/* Forget the oldest id (the entry at head) and its index slot. */
static void forget_oldest(resv_shard *sh)
{
    resv *r = &sh->ring[sh->head];
    uint32_t tag = resv_tag(r->rid), pos = sh->head + 1;
    if (sh->wide)
        index_forget(sh, tag, pos, 1);
    else
        index_forget(sh, tag, pos, 0);
    if (r->state == R_RESERVED)
        sh->live--;
    r->state = R_EMPTY;
    sh->head = sh->head + 1 == sh->max ? 0 : sh->head + 1;
    sh->count--;
}

/* Make room for one more id: forget the oldest if it is settled or its
 * lease has expired.  Returns 0 or QG_EFULL. */
int qg__mem_resv_make_room(resv_shard *sh, int64_t now)
{
    while (sh->count >= sh->max && sh->count) {
        const resv *r = &sh->ring[sh->head];
        if (r->state == R_RESERVED && now < r->expires_ms)
            return QG_EFULL;
        forget_oldest(sh);
    }
    return sh->count < sh->max ? QG_OK : QG_EFULL;
}

/* Remember rid (not yet remembered; the caller made room): its entry,
 * zeroed but for the id and R_RESERVED. */
resv *qg__mem_resv_insert(resv_shard *sh, qg_key rid)
{
    uint32_t tag = resv_tag(rid) & sh->tag_mask;
    uint32_t pos = sh->head + sh->count;
    resv *r;
    if (pos >= sh->max)
        pos -= sh->max;
    if (sh->wide)
        index_put(sh, tag, pos, 1);
    else
        index_put(sh, tag, pos, 0);
    r = &sh->ring[pos];
    memset(r, 0, sizeof *r);
    r->rid = rid;
    r->state = R_RESERVED;
    sh->count++;
    sh->live++;
    return r;
}
