/* mem_reservations.c - the memory store's request ids (mem_tables.h):
 * each reservation shard remembers at most max ids and forgets the oldest
 * settled (or expired) one to make room; when every remembered id is
 * still a live reservation, a new check is refused with QG_EFULL.
 *
 * The entries sit in a ring in insertion order, so the oldest is always
 * at head and a new one goes to head + count: both ends are sequential
 * memory.  Finding an id probes the index (8 bytes a slot, linear
 * probing, deletion by backward shift: no tombstones) and reads the one
 * entry its slot names to compare the whole id. */
#include <stdlib.h>
#include <string.h>
#include "mem_tables.h"

#define SLOT_POS(v) ((uint32_t)(v))          /* ring position + 1 */
#define SLOT_TAG(v) ((uint32_t)((v) >> 32))

resv *qg__mem_resv_find(resv_shard *sh, qg_key rid)
{
    uint32_t tag = resv_tag(rid), mask = sh->cap - 1;
    for (uint32_t j = tag & mask; sh->index[j]; j = (j + 1) & mask) {
        uint64_t v = sh->index[j];
        if (SLOT_TAG(v) == tag) {
            resv *r = &sh->ring[SLOT_POS(v) - 1];
            if (key_eq(r->rid, rid))
                return r;
        }
    }
    return NULL;
}

/* Remove the index slot i, shifting later members of its probe run back
 * so that lookups never stop early. */
static void index_delete_at(resv_shard *sh, uint32_t i)
{
    uint32_t mask = sh->cap - 1, j = i;
    sh->index[i] = 0;
    for (;;) {
        uint32_t home;
        j = (j + 1) & mask;
        if (!sh->index[j])
            return;
        home = SLOT_TAG(sh->index[j]) & mask;
        /* move j back to i when home is not cyclically within (i, j] */
        if ((i <= j) ? (home <= i || home > j) : (home <= i && home > j)) {
            sh->index[i] = sh->index[j];
            sh->index[j] = 0;
            i = j;
        }
    }
}

/* Forget the oldest id (the entry at head) and its index slot. */
static void forget_oldest(resv_shard *sh)
{
    resv *r = &sh->ring[sh->head];
    uint32_t mask = sh->cap - 1, pos = sh->head + 1;
    for (uint32_t j = resv_tag(r->rid) & mask; sh->index[j];
         j = (j + 1) & mask)
        if (SLOT_POS(sh->index[j]) == pos) {
            index_delete_at(sh, j);
            break;
        }
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
    uint32_t tag = resv_tag(rid), mask = sh->cap - 1, j;
    uint32_t pos = sh->head + sh->count;
    resv *r;
    if (pos >= sh->max)
        pos -= sh->max;
    for (j = tag & mask; sh->index[j]; j = (j + 1) & mask)
        ;
    sh->index[j] = (uint64_t)tag << 32 | (pos + 1);
    r = &sh->ring[pos];
    memset(r, 0, sizeof *r);
    r->rid = rid;
    r->state = R_RESERVED;
    sh->count++;
    sh->live++;
    return r;
}
