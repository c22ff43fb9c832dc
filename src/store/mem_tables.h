/* mem_tables.h - the memory store's tables, shared by its three files:
 * entities (mem_entities.c: the window states of members and orgs),
 * reservations (mem_reservations.c: request ids and reservations awaiting
 * settle) and the store's methods (store_memory.c).  Internal to
 * src/store. */
#ifndef QG_MEM_TABLES_H
#define QG_MEM_TABLES_H

#include <pthread.h>
#include <stdint.h>
#include "payg.h"
#include "store.h"
#include "window.h"

/* The windows an entity's states follow.  Interned per shard, one per
 * window list (plan or org) of the rules in force; kept until the store
 * is freed.  The types and name hashes are copies, so that states can be
 * freed and carried across a rules reload without touching old rules;
 * specs is dereferenced only while it is the current rules' list. */
typedef struct layout {
    const qg_window_spec *specs;
    uint32_t n;
    uint8_t type[QG_MAX_PLAN_WINDOWS];
    uint64_t name_hash[QG_MAX_PLAN_WINDOWS];
    struct layout *next;
} layout;

typedef struct entity {
    qg_key key;
    int64_t seen_ms;              /* newest instant a decision used */
    const layout *lay;
    qg_win_state *win;            /* points into the block, or separate */
    uint16_t separate;            /* win allocated apart from the block */
    uint16_t shard;               /* entity shard it lives in */
    uint16_t inline_n;            /* window states the block holds */
    qg__payg_spent spent;         /* payg: spent in the cap period */
    qg_win_state inline_win[];
} entity;

typedef struct ent_slot {
    qg_key key;                   /* {0,0} = empty */
    entity *e;
} ent_slot;

typedef struct ent_shard {
    pthread_mutex_t mu;
    ent_slot *slots;
    uint32_t cap, count;          /* cap is a power of two */
    size_t bytes;                 /* entity blocks */
    layout *layouts;
    uint16_t index;
    char pad[64];
} ent_shard;

enum { R_EMPTY = 0, R_RESERVED = 1, R_SETTLED = 2 };

typedef struct resv {
    qg_key rid;
    entity *member, *org;
    const qg_model *model_spec;   /* NULL: weight-only */
    int64_t t0_ms, expires_ms;
    int64_t reserved_milli, actual_milli, charged_milli;
    int64_t anchor_ms;
    int64_t headroom_milli;       /* payg: room at admission, -1 none */
    int64_t price_micro, cost_micro, cap_start_ms;
    int32_t model;
    uint16_t shard;               /* entity shard */
    uint8_t state, status;
    uint8_t late;
} resv;

/* A shard's request ids: the entries themselves in a ring of max, in
 * insertion order (the oldest at head, the next at head + count), found
 * through an open-addressing index of cap slots, each the id's hash bits
 * (the high part; its home slot too) and its ring position + 1 (the low
 * pos_bits; 0: an empty slot).  Entries never move, so a resv pointer
 * stays valid until its id is forgotten; lookups probe the small index,
 * not the 136-byte entries (docs/benchmarks.md, issue 14).
 *
 * A slot takes 4 bytes when the position, the home slot's bits and at
 * least RESV_FILTER_BITS more hash bits fit in 32 (up to 4,096 ids a
 * shard: 1M ids at the default 256 shards), else 8 (wide): 32 bits of
 * hash above 32 of position.  The index's bytes are read at random, one
 * line a lookup, so half the bytes keep more of it in cache (the heavy
 * rounds of build/bench_engine: +7.7%, docs/benchmarks.md, "Engine"). */
typedef struct resv_shard {
    pthread_mutex_t mu;
    void *index;                  /* cap slots of 4 bytes, or 8 if wide */
    resv *ring;                   /* max entries */
    uint32_t cap, count, max;     /* cap power of two >= 2 * max */
    uint32_t head;                /* ring position of the oldest id */
    uint32_t live;                /* R_RESERVED entries */
    uint32_t tag_mask;            /* the hash bits a slot keeps */
    uint8_t pos_bits;             /* a slot's low bits: position + 1 */
    uint8_t wide;                 /* 8-byte slots */
    char pad[64];
} resv_shard;

/* Hash bits a 4-byte slot keeps beyond its home slot's, so that a lookup
 * reads a wrong entry for at most 1 in 64 of the ids sharing its home. */
#define RESV_FILTER_BITS 6

/* The index's hash bits of a request id (its home slot is these masked). */
static inline uint32_t resv_tag(qg_key rid) { return (uint32_t)(rid.lo >> 8); }

/* Bytes a slot of a shard's index takes, and the address of slot j (for
 * prefetching). */
static inline size_t resv_slot_bytes(const resv_shard *sh)
{
    return sh->wide ? 8 : 4;
}

static inline const void *resv_slot_at(const resv_shard *sh, uint32_t j)
{
    return (const char *)sh->index + (size_t)j * resv_slot_bytes(sh);
}

typedef struct mem_store {
    qg_store base;
    int nshards;
    ent_shard *ents;
    resv_shard *resvs;
    void *resv_region;            /* the mapping that holds every shard's
                                     slots (store_memory.c) */
    size_t resv_region_len;
} mem_store;

static inline int key_zero(qg_key k) { return k.hi == 0 && k.lo == 0; }
static inline int key_eq(qg_key a, qg_key b) { return a.hi == b.hi && a.lo == b.lo; }

/* mem_entities.c: find or create the entity for key with the window
 * list specs (carrying state over by window name when the list changed),
 * and release one. */
int qg__mem_ent_get(ent_shard *sh, qg_key key, const qg_window_spec *specs,
                    int n, entity **out);
void qg__mem_entity_free(entity *e);

/* mem_reservations.c: the request-id table of one shard (a ring in
 * insertion order under an open-addressing index without tombstones).
 * Bytes an index slot takes for max ids in cap slots (4 or 8), and a
 * shard set up over its ring and index (zeroed, cap slots of that size). */
size_t qg__mem_resv_slot_size(uint32_t max, uint32_t cap);
void qg__mem_resv_init(resv_shard *sh, resv *ring, void *index,
                       uint32_t max, uint32_t cap);
resv *qg__mem_resv_find(resv_shard *sh, qg_key rid);
/* Make room for one more id: forget the oldest if it is settled or its
 * lease has expired.  Returns 0 or QG_EFULL. */
int qg__mem_resv_make_room(resv_shard *sh, int64_t now);
resv *qg__mem_resv_insert(resv_shard *sh, qg_key rid);

#endif
