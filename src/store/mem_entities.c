/* mem_entities.c - the memory store's entity tables (mem_tables.h):
 * one block per member or org holding the states of its windows, found
 * by the 128-bit key in its shard's open-addressing table, and carried
 * over window by window (same name and type) when its plan's window list
 * changes, as after a rules reload. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "mem_tables.h"

/* ------------------------------------------------------------ entities */

static uint64_t name_hash(const char *name)
{
    return XXH3_64bits(name, strlen(name));
}

static const layout *layout_get(ent_shard *sh, const qg_window_spec *specs,
                                int n)
{
    layout *l;
    for (l = sh->layouts; l; l = l->next)
        if (l->specs == specs)
            return l;
    if (n > QG_MAX_PLAN_WINDOWS || !(l = calloc(1, sizeof *l)))
        return NULL;
    l->specs = specs;
    l->n = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        l->type[i] = (uint8_t)specs[i].type;
        l->name_hash[i] = name_hash(specs[i].name);
    }
    l->next = sh->layouts;
    sh->layouts = l;
    return l;
}

/* Rolling rings and lease arrays start inside the entity's block (lent,
 * store.h): a decision then reads one block, which mem_check prefetches,
 * instead of chasing two more pointers to scattered heap blocks.  They
 * move to the heap only when they outgrow these. */
#define INLINE_RING 4            /* = the rolling ring's first capacity */
#define INLINE_LEASES 4

static size_t inline_bytes(const layout *lay)
{
    size_t b = 0;
    for (uint32_t i = 0; i < lay->n; i++)
        if (lay->type[i] == QG_WIN_ROLLING)
            b += INLINE_RING * sizeof(qg_roll_entry);
        else if (lay->type[i] == QG_WIN_CONCURRENCY)
            b += INLINE_LEASES * sizeof(qg_lease);
    return b;
}

static size_t entity_bytes(const layout *lay)
{
    return sizeof(entity) + (size_t)lay->n * sizeof(qg_win_state) +
           inline_bytes(lay);
}

static entity *entity_new(qg_key key, const layout *lay)
{
    entity *e = calloc(1, entity_bytes(lay));
    if (!e)
        return NULL;
    e->key = key;
    e->lay = lay;
    e->win = e->inline_win;
    e->inline_n = (uint16_t)lay->n;
    char *p = (char *)&e->inline_win[lay->n];
    for (uint32_t i = 0; i < lay->n; i++) {
        qg_win_state *st = &e->win[i];
        if (lay->type[i] == QG_WIN_ROLLING) {
            st->u.roll.ring = (qg_roll_entry *)(void *)p;
            st->u.roll.cap = INLINE_RING | QG_WIN_BORROWED;
            p += INLINE_RING * sizeof(qg_roll_entry);
        } else if (lay->type[i] == QG_WIN_CONCURRENCY) {
            st->u.conc.leases = (qg_lease *)(void *)p;
            st->u.conc.cap = INLINE_LEASES | QG_WIN_BORROWED;
            p += INLINE_LEASES * sizeof(qg_lease);
        }
    }
    return e;
}

void qg__mem_entity_free(entity *e)
{
    for (uint32_t i = 0; i < e->lay->n; i++)
        qg__win_free_type((qg_win_type)e->lay->type[i], &e->win[i]);
    if (e->separate)
        free(e->win);
    free(e);
}

/* The rules changed the layout (a new plan, or reloaded rules): carry each
 * window's state over to the same-named window of the same type. */
static int entity_relayout(entity *e, const layout *nl)
{
    const layout *ol = e->lay;
    qg_win_state *nw = calloc(nl->n ? nl->n : 1, sizeof *nw);
    if (!nw)
        return QG_ENOMEM;
    for (uint32_t i = 0; i < nl->n; i++)
        for (uint32_t j = 0; j < ol->n; j++)
            if (ol->type[j] == nl->type[i] &&
                ol->name_hash[j] == nl->name_hash[i]) {
                nw[i] = e->win[j];
                memset(&e->win[j], 0, sizeof e->win[j]);
                break;
            }
    for (uint32_t j = 0; j < ol->n; j++)
        qg__win_free_type((qg_win_type)ol->type[j], &e->win[j]);
    if (e->separate)
        free(e->win);
    e->win = nw;
    e->separate = 1;
    e->lay = nl;
    return QG_OK;
}

static int ent_grow(ent_shard *sh)
{
    uint32_t ncap = sh->cap ? sh->cap * 2 : 1024;
    ent_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return QG_ENOMEM;
    for (uint32_t i = 0; i < sh->cap; i++) {
        ent_slot *o = &sh->slots[i];
        uint32_t j;
        if (key_zero(o->key))
            continue;
        for (j = (uint32_t)o->key.lo & (ncap - 1); !key_zero(ns[j].key);
             j = (j + 1) & (ncap - 1))
            ;
        ns[j] = *o;
    }
    free(sh->slots);
    sh->slots = ns;
    sh->cap = ncap;
    return QG_OK;
}

/* Find or create the entity for key with the given layout. */
int qg__mem_ent_get(ent_shard *sh, qg_key key, const qg_window_spec *specs,
                   int n, entity **out)
{
    const layout *lay;
    uint32_t j;
    entity *e;

    if (sh->cap) {
        for (j = (uint32_t)key.lo & (sh->cap - 1); !key_zero(sh->slots[j].key);
             j = (j + 1) & (sh->cap - 1))
            if (key_eq(sh->slots[j].key, key)) {
                e = sh->slots[j].e;
                if (e->lay->specs != specs) {
                    const layout *l = layout_get(sh, specs, n);
                    if (!l || entity_relayout(e, l) != QG_OK)
                        return QG_ENOMEM;
                }
                *out = e;
                return QG_OK;
            }
    }
    if ((sh->count + 1) * 2 > sh->cap && ent_grow(sh) != QG_OK)
        return QG_ENOMEM;
    if (!(lay = layout_get(sh, specs, n)) || !(e = entity_new(key, lay)))
        return QG_ENOMEM;
    e->shard = sh->index;
    for (j = (uint32_t)key.lo & (sh->cap - 1); !key_zero(sh->slots[j].key);
         j = (j + 1) & (sh->cap - 1))
        ;
    sh->slots[j].key = key;
    sh->slots[j].e = e;
    sh->count++;
    sh->bytes += entity_bytes(lay);
    *out = e;
    return QG_OK;
}

