/* mem_reservations.c - the memory store's request ids (mem_tables.h):
 * each reservation shard remembers at most max ids and forgets the oldest
 * settled (or expired) one to make room; when every remembered id is
 * still a live reservation, a new check is refused with QG_EFULL. */
#include <stdlib.h>
#include <string.h>
#include "mem_tables.h"

/* -------------------------------------------------------- reservations */

resv *qg__mem_resv_find(resv_shard *sh, qg_key rid)
{
    for (uint32_t j = (uint32_t)(rid.lo >> 8) & (sh->cap - 1);
         sh->slots[j].state != R_EMPTY; j = (j + 1) & (sh->cap - 1))
        if (key_eq(sh->slots[j].rid, rid))
            return &sh->slots[j];
    return NULL;
}

/* Remove the entry at slot i, shifting later members of its probe run
 * back so that lookups never stop early (no tombstones). */
static void resv_delete_at(resv_shard *sh, uint32_t i)
{
    uint32_t mask = sh->cap - 1, j = i;
    if (sh->slots[i].state == R_RESERVED)
        sh->live--;
    sh->slots[i].state = R_EMPTY;
    sh->count--;
    for (;;) {
        uint32_t home;
        j = (j + 1) & mask;
        if (sh->slots[j].state == R_EMPTY)
            return;
        home = (uint32_t)(sh->slots[j].rid.lo >> 8) & mask;
        /* move j back to i when home is not cyclically within (i, j] */
        if ((i <= j) ? (home <= i || home > j) : (home <= i && home > j)) {
            sh->slots[i] = sh->slots[j];
            sh->slots[j].state = R_EMPTY;
            i = j;
        }
    }
}

/* Make room for one more id: forget the oldest if it is settled or its
 * lease has expired.  Returns 0 or QG_EFULL. */
int qg__mem_resv_make_room(resv_shard *sh, int64_t now)
{
    while (sh->count >= sh->max && sh->fifo_count) {
        qg_key old = sh->fifo[sh->fifo_head];
        resv *r = qg__mem_resv_find(sh, old);
        if (r && r->state == R_RESERVED && now < r->expires_ms)
            return QG_EFULL;
        sh->fifo_head = (sh->fifo_head + 1) % sh->max;
        sh->fifo_count--;
        if (r)
            resv_delete_at(sh, (uint32_t)(r - sh->slots));
    }
    return sh->count < sh->max ? QG_OK : QG_EFULL;
}

resv *qg__mem_resv_insert(resv_shard *sh, qg_key rid)
{
    uint32_t j;
    for (j = (uint32_t)(rid.lo >> 8) & (sh->cap - 1);
         sh->slots[j].state != R_EMPTY; j = (j + 1) & (sh->cap - 1))
        ;
    memset(&sh->slots[j], 0, sizeof sh->slots[j]);
    sh->slots[j].rid = rid;
    sh->slots[j].state = R_RESERVED;
    sh->count++;
    sh->live++;
    sh->fifo[(sh->fifo_head + sh->fifo_count) % sh->max] = rid;
    sh->fifo_count++;
    return &sh->slots[j];
}

