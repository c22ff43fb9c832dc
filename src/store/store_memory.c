/* store_memory.c - the in-process store: counters in sharded hash tables.
 *
 * Two kinds of shard, each with its own mutex:
 *  - entity shards hold the window states of members and orgs.  A member
 *    lives in the shard of its org (or its own when it has none), so one
 *    decision takes exactly one entity lock for the member and its org:
 *    all-or-nothing without lock ordering, and the same grouping a Redis
 *    Cluster gets from hash-tagging a member's keys with its org.
 *  - reservation shards remember request ids (idempotency) and the
 *    reservations awaiting settle, bounded: each shard keeps at most
 *    max_reservations / shards ids and forgets the oldest settled (or
 *    expired) one to make room; when every remembered id is still an
 *    unexpired reservation the check is refused with QG_EFULL.
 * Lock order is always reservation shard, then entity shard.  The tables
 * are mem_entities.c and mem_reservations.c (mem_tables.h); this file
 * holds the store's methods.
 *
 * Memory per subject: one entity block (header plus 32 bytes per window)
 * and a table slot; rolling logs and lease arrays grow on demand within
 * their caps (window.h).
 *
 * Bounds (quotagate.h): the engine hands in amounts within them; a
 * settle's weight from tokens is charged at most QG_AMOUNT_MAX_MILLI, the
 * windows saturate (window.h), spent amounts saturate at
 * QG_MONEY_MAX_MICRO (and keep the bound against refunds, like the
 * windows), and lease expiries saturate. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "decide.h"
#include "fixed.h"
#include "mem_tables.h"
#include "weights.h"

/* Shards: 256 unless the request ids would leave fewer than MIN_PER_SHARD
 * to a shard (each shard forgets its own oldest id, so a small bound is
 * better kept in few shards).  Two threads deciding at a million subjects
 * made a futex call for every ~19 decisions with 64 plain mutexes, one
 * for every ~550 with 256 adaptive ones (docs/benchmarks.md, "Engine"). */
#define DEFAULT_SHARDS 256
#define MIN_PER_SHARD 1024u
#define DEFAULT_RESERVATIONS (1u << 19)
#define DEFAULT_LEASE_MS (15 * 60 * 1000LL)

/* ------------------------------------------------------------- methods */

static uint32_t shard_of(const mem_store *ms, qg_key k)
{
    return (uint32_t)(k.hi >> 32) & (uint32_t)(ms->nshards - 1);
}

static int mem_known(qg_store *s, qg_key rid)
{
    mem_store *ms = (mem_store *)s;
    resv_shard *rs = &ms->resvs[shard_of(ms, rid)];
    int found;
    pthread_mutex_lock(&rs->mu);
    found = qg__mem_resv_find(rs, rid) != NULL;
    pthread_mutex_unlock(&rs->mu);
    return found;
}

/* How long a reservation of this plan lives unsettled: the concurrency
 * window's lease, else the plan's lease_ttl. */
static int64_t lease_ttl(const qg_plan *p)
{
    for (int i = 0; i < p->nwindows; i++)
        if (p->windows[i].type == QG_WIN_CONCURRENCY &&
            p->windows[i].lease_ttl_ms > 0)
            return p->windows[i].lease_ttl_ms;
    return p->lease_ttl_ms > 0 ? p->lease_ttl_ms : DEFAULT_LEASE_MS;
}

/* Gather member and org windows for a decision. */
static void gather(qg_decide_in *din, entity *m, entity *o, int model,
                   int64_t weight, int64_t now, int64_t anchor, qg_key rid)
{
    /* Time never runs backwards for a member and its org: callers on
     * several threads may present instants slightly out of order, and every
     * window must judge the request at the same instant. */
    if (m->seen_ms > now)
        now = m->seen_ms;
    if (o && o->seen_ms > now)
        now = o->seen_ms;
    m->seen_ms = now;
    if (o)
        o->seen_ms = now;
    din->n = 0;
    din->soft = 0;
    din->model = model;
    din->weight_milli = weight;
    din->ctx[0].now_ms = din->ctx[1].now_ms = now;
    din->ctx[0].anchor_ms = anchor;
    din->ctx[1].anchor_ms = 0;
    din->ctx[0].rid = din->ctx[1].rid = rid.lo;
    /* qg__decide_add inlined (get_entities checked the total fits). */
    int n = 0;
    for (uint32_t i = 0; i < m->lay->n; i++, n++) {
        din->spec[n] = &m->lay->specs[i];
        din->state[n] = &m->win[i];
        din->org[n] = 0;
    }
    if (o)
        for (uint32_t i = 0; i < o->lay->n; i++, n++) {
            din->spec[n] = &o->lay->specs[i];
            din->state[n] = &o->win[i];
            din->org[n] = 1;
        }
    din->n = n;
}

/* Is the entity a hint points at still the one for key, with this window
 * list?  Entities live as long as the store, so any pointer it handed out
 * can be read. */
static int hint_ok(const entity *h, const ent_shard *es, qg_key key,
                   const qg_window_spec *specs)
{
    return h && h->shard == es->index && key_eq(h->key, key) &&
           h->lay->specs == specs;
}

/* hint, org_hint: the entities this member and its org were found at
 * before (the engine caches them per subject and per org), used when they
 * are still the right ones; each saves the probe of the shard's table, a
 * cache miss per decision at a million subjects. */
static int get_entities(ent_shard *es, qg_key member, const qg_plan *plan,
                        int has_org, qg_key org, const qg_org_spec *os,
                        void *hint, void *org_hint, entity **m, entity **o)
{
    int rc;
    if (hint_ok(hint, es, member, plan->windows)) {
        *m = hint;
        rc = QG_OK;
    } else {
        rc = qg__mem_ent_get(es, member, plan->windows, plan->nwindows, m);
    }
    *o = NULL;
    if (rc == QG_OK && has_org && os) {
        if (hint_ok(org_hint, es, org, os->windows))
            *o = org_hint;
        else
            rc = qg__mem_ent_get(es, org, os->windows, os->nwindows, o);
    }
    if (rc == QG_OK && (int)(*m)->lay->n + (*o ? (int)(*o)->lay->n : 0) > QG_MAX_VIEWS)
        rc = QG_EINVAL;
    return rc;
}

static void payg_setup(qg_decide_in *din, entity *m, const qg_store_check *in)
{
    din->soft = in->payg_mask;
    din->price_micro = in->price_micro;
    din->cap_micro = in->cap_micro;
    din->cap_end_ms = in->cap_end_ms;
    din->spent_micro = qg__payg_spent_in(&m->spent, in->cap_start_ms);
}

/* When a reservation made at t0 stops holding its lease. */
static int64_t expiry(int64_t t0, const qg_plan *p)
{
    int64_t ttl = lease_ttl(p);
    return t0 > INT64_MAX - ttl ? INT64_MAX : t0 + ttl;
}

/* Start loading the index slot of rid and, when the shard is full, the
 * oldest id, which resv_make_room reads and forgets and the new id's
 * entry then overwrites (step 0: the three lines its 136-byte entry
 * spans; the middle one only the overwrite reads), and that id's index
 * slot (step 1, which reads the entry: after step 0 had time to land;
 * QG_PREFETCH_ALL: both at once).  The ring's head is read without the
 * lock: a stale value only makes the prefetch useless, never wrong. */
static inline void resv_prefetch(const resv_shard *rs, qg_key rid, int step)
{
    uint32_t h;
    const resv *r;
    if (step != 1)
        __builtin_prefetch(resv_slot_at(rs, resv_tag(rid) & (rs->cap - 1)));
    if (__atomic_load_n(&rs->count, __ATOMIC_RELAXED) < rs->max)
        return;
    h = __atomic_load_n(&rs->head, __ATOMIC_RELAXED);
    r = &rs->ring[h < rs->max ? h : 0];
    if (step != 1) {
        __builtin_prefetch(r);
        __builtin_prefetch((const char *)r + 64);
        __builtin_prefetch((const char *)(r + 1) - 1);
    }
    if (step != 0) {
        qg_key old = {0, 0};
        old.lo = __atomic_load_n(&r->rid.lo, __ATOMIC_RELAXED);
        __builtin_prefetch(resv_slot_at(rs, resv_tag(old) & (rs->cap - 1)));
    }
}

static void mem_prefetch(qg_store *s, qg_key rid, int step)
{
    mem_store *ms = (mem_store *)s;
    resv_prefetch(&ms->resvs[shard_of(ms, rid)], rid, step);
}

/* The entity's header, 4-5 window states and the lent ring and leases:
 * up to 6 lines for the plans seen so far. */
static inline void ent_prefetch(const void *hint)
{
    const char *h = hint;
    if (h)
        for (int i = 0; i < 6; i++)
            __builtin_prefetch(h + 64 * i);
}

/* Step 1, once the block is in: the entries of its rolling rings that
 * moved to the heap which the decision reads (the oldest, pruned) and
 * writes (the next).  Read without the shard's lock, from memory that
 * lives as long as the store (the block, inline window states, layouts):
 * a stale ring only makes the prefetch useless; a prefetch never faults.
 * Window states moved apart from the block (a relayout) are skipped. */
static void ring_prefetch(const entity *e)
{
    const layout *lay = __atomic_load_n(&e->lay, __ATOMIC_RELAXED);
    uint32_t n = lay->n < e->inline_n ? lay->n : e->inline_n;
    if (__atomic_load_n(&e->separate, __ATOMIC_RELAXED))
        return;
    /* n: a relayout seen half-way (a new layout, not yet separate) reads
     * states of the block only, at worst as the wrong type */
    for (uint32_t i = 0; i < n; i++) {
        const qg_win_state *st = &e->inline_win[i];
        qg_roll_entry *ring;
        uint32_t cap, head, count;
        if (lay->type[i] != QG_WIN_ROLLING)
            continue;
        cap = __atomic_load_n(&st->u.roll.cap, __ATOMIC_RELAXED);
        if (cap & QG_WIN_BORROWED)
            continue;            /* in the block: loaded with it */
        ring = __atomic_load_n(&st->u.roll.ring, __ATOMIC_RELAXED);
        head = __atomic_load_n(&st->u.roll.head, __ATOMIC_RELAXED);
        count = __atomic_load_n(&st->u.roll.count, __ATOMIC_RELAXED);
        if (!ring || !cap || head >= cap || count > cap)
            continue;
        __builtin_prefetch(&ring[head]);
        __builtin_prefetch(&ring[(head + count) % cap]);
    }
}

static void mem_prefetch_member(qg_store *s, const void *hint, int step)
{
    (void)s;
    if (!hint)
        return;
    if (step == 0)
        ent_prefetch(hint);
    else
        ring_prefetch(hint);
}

static int mem_check(qg_store *s, const qg_store_check *in, qg_decision *out)
{
    mem_store *ms = (mem_store *)s;
    resv_shard *rs = &ms->resvs[shard_of(ms, in->rid)];
    uint32_t esi = shard_of(ms, in->has_org ? in->org : in->member);
    ent_shard *es = &ms->ents[esi];
    qg_decide_in din;
    entity *m, *o;
    resv *r;
    int rc;

    /* The request id's index slot and the member's entity are far apart
     * in memory and both needed: start loading them together.  The
     * engine asked already (mem_prefetch, before its subject lookup);
     * asking again here measured 2-3% faster on the heavy rounds than
     * not (bench_engine pinned, 6 alternated runs), so it stays. */
    resv_prefetch(rs, in->rid, QG_PREFETCH_ALL);
    if (in->hint)
        ent_prefetch(*in->hint);
    pthread_mutex_lock(&rs->mu);
    if ((r = qg__mem_resv_find(rs, in->rid)) != NULL) {
        if (!key_eq(r->member->key, in->member)) {
            rc = QG_EINVAL;
            goto out_rs;
        }
        pthread_mutex_lock(&ms->ents[r->shard].mu);
        gather(&din, r->member, r->org, r->model, r->reserved_milli,
               in->now_ms, r->anchor_ms, in->rid);
        qg__decide_views(&din, out, 0);
        pthread_mutex_unlock(&ms->ents[r->shard].mu);
        out->outcome = QG_ALLOW;
        out->replayed = 1;
        out->weight_milli = r->reserved_milli;
        out->headroom_milli = r->headroom_milli;
        out->overage_price_micro = r->price_micro;
        out->overage_milli = qg__overage_of(r->reserved_milli,
                                           r->headroom_milli);
        out->overage_cost_micro = r->cost_micro;
        out->cap_reached = 0;
        out->spent_micro = r->member->spent.micro;
        out->decided_at_ms = r->t0_ms;
        out->retry_after_ms = 0;
        out->binding = -1;
        rc = QG_OK;
        goto out_rs;
    }
    if ((rc = qg__mem_resv_make_room(rs, in->now_ms)) != QG_OK)
        goto out_rs;

    pthread_mutex_lock(&es->mu);
    rc = get_entities(es, in->member, in->plan, in->has_org, in->org,
                      in->orgspec, in->hint ? *in->hint : NULL,
                      in->org_hint ? *in->org_hint : NULL, &m, &o);
    if (rc == QG_OK) {
        if (in->hint)
            *in->hint = m;
        if (in->org_hint && o)
            *in->org_hint = o;
        gather(&din, m, o, in->model, in->weight_milli, in->now_ms,
               in->anchor_ms, in->rid);
        if (in->payg_mask)
            payg_setup(&din, m, in);
        rc = qg__decide(&din, out);
        out->spent_micro = m->spent.micro;
    }
    pthread_mutex_unlock(&es->mu);
    if (rc != QG_OK)
        goto out_rs;
    out->replayed = 0;
    out->decided_at_ms = din.ctx[0].now_ms;   /* clamped, see gather() */
    if (out->outcome == QG_ALLOW) {
        r = qg__mem_resv_insert(rs, in->rid);
        r->member = m;
        r->org = o;
        r->shard = (uint16_t)esi;
        r->t0_ms = din.ctx[0].now_ms;
        r->expires_ms = expiry(r->t0_ms, in->plan);
        r->reserved_milli = r->charged_milli = in->weight_milli;
        r->anchor_ms = in->anchor_ms;
        r->model = in->model;
        r->model_spec = in->model_spec;
        r->headroom_milli = out->headroom_milli;
        r->price_micro = out->overage_price_micro;
        r->cost_micro = out->overage_cost_micro;
        r->cap_start_ms = in->cap_start_ms;
    }
out_rs:
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

static void settle_result(const resv *r, int replayed, qg_settle_result *out)
{
    out->replayed = replayed;
    out->late = r->late;
    out->reserved_milli = r->reserved_milli;
    out->actual_milli = r->actual_milli;
    out->charged_milli = r->charged_milli;
    out->decided_at_ms = r->t0_ms;
    out->status = (qg_settle_status)r->status;
    out->overage_milli = qg__overage_of(r->charged_milli, r->headroom_milli);
    out->overage_cost_micro = r->cost_micro;
}

static int mem_settle(qg_store *s, const qg_store_settle *in,
                      qg_settle_result *out)
{
    mem_store *ms = (mem_store *)s;
    resv_shard *rs = &ms->resvs[shard_of(ms, in->rid)];
    qg_decide_in din;
    int64_t actual, delta;
    resv *r;
    int rc = QG_OK;

    pthread_mutex_lock(&rs->mu);
    if (!(r = qg__mem_resv_find(rs, in->rid))) {
        rc = QG_ENOTFOUND;
        goto out;
    }
    if (in->has_member && !key_eq(r->member->key, in->member)) {
        rc = QG_EINVAL;          /* another subject's request: untouched */
        goto out;
    }
    if (r->state == R_SETTLED) {
        settle_result(r, 1, out);
        goto out;
    }
    if (in->no_charge) {
        actual = 0;
    } else if (r->model_spec) {
        /* tokens within the bound (the engine checked): a weight over the
         * bound is charged at the bound */
        actual = qg__weight_milli(r->model_spec, in->input_tokens,
                                 in->output_tokens);
        if (actual > QG_AMOUNT_MAX_MILLI)
            actual = QG_AMOUNT_MAX_MILLI;
    } else {
        actual = in->weight_milli >= 0 ? in->weight_milli : r->reserved_milli;
    }
    if (actual < 0) {
        rc = QG_ERANGE;
        goto out;
    }
    delta = actual - r->reserved_milli;
    r->late = in->now_ms >= r->expires_ms;
    /* A reservation whose lease expired is final: never refunded. */
    if (r->late && delta < 0)
        delta = 0;
    int64_t cost = qg__overage_cost(
        qg__overage_of(r->reserved_milli + delta, r->headroom_milli),
        r->price_micro);
    pthread_mutex_lock(&ms->ents[r->shard].mu);
    gather(&din, r->member, r->org, r->model, r->reserved_milli, in->now_ms,
           r->anchor_ms, in->rid);
    qg__decide_settle(&din, r->t0_ms, delta);
    qg__payg_spent_adjust(&r->member->spent, r->cap_start_ms,
                          cost - r->cost_micro);
    pthread_mutex_unlock(&ms->ents[r->shard].mu);
    r->cost_micro = cost;
    r->actual_milli = actual;
    r->charged_milli = r->reserved_milli + delta;
    r->status = (uint8_t)in->status;
    r->state = R_SETTLED;
    rs->live--;
    settle_result(r, 0, out);
out:
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

static int mem_usage(qg_store *s, const qg_store_usage *in, qg_decision *out)
{
    mem_store *ms = (mem_store *)s;
    ent_shard *es = &ms->ents[shard_of(ms, in->has_org ? in->org : in->member)];
    qg_decide_in din;
    entity *m, *o;
    qg_key none = {0, 0};
    int rc;

    pthread_mutex_lock(&es->mu);
    rc = get_entities(es, in->member, in->plan, in->has_org, in->org,
                      in->orgspec, NULL, NULL, &m, &o);
    if (rc == QG_OK) {
        gather(&din, m, o, -1, 0, in->now_ms, in->anchor_ms, none);
        qg__decide_views(&din, out, 1);
        if (in->cap_start_ms >= 0 && m->spent.start_ms == in->cap_start_ms)
            out->spent_micro = m->spent.micro;
    }
    pthread_mutex_unlock(&es->mu);
    out->outcome = QG_NONE;
    out->binding = -1;
    return rc;
}

static int mem_restore(qg_store *s, const qg_store_restore *in)
{
    mem_store *ms = (mem_store *)s;
    resv_shard *rs = &ms->resvs[shard_of(ms, in->rid)];
    uint32_t esi = shard_of(ms, in->has_org ? in->org : in->member);
    ent_shard *es = &ms->ents[esi];
    qg_decide_in din;
    entity *m, *o;
    resv *r;
    int rc, remember;

    pthread_mutex_lock(&rs->mu);
    if (!in->charge_only && qg__mem_resv_find(rs, in->rid)) {
        rc = QG_OK;              /* already restored */
        goto out;
    }
    /* Past the idempotency memory the charge still counts; only the id
     * is not remembered. */
    remember = !in->charge_only && qg__mem_resv_make_room(rs, in->at_ms) == QG_OK;
    pthread_mutex_lock(&es->mu);
    rc = get_entities(es, in->member, in->plan, in->has_org, in->org,
                      in->orgspec, NULL, NULL, &m, &o);
    if (rc == QG_OK) {
        qg_key rid = in->rid;
        gather(&din, m, o, in->model, in->charged_milli, in->at_ms,
               in->anchor_ms, rid);
        for (int i = 0; i < din.n && rc == QG_OK; i++) {
            const qg_window_spec *w = din.spec[i];
            if (!qg__window_applies(w, in->model))
                continue;
            /* A settled request no longer holds a concurrency slot. */
            if (w->type == QG_WIN_CONCURRENCY && in->settled)
                continue;
            rc = qg__win_charge(w, din.state[i], &din.ctx[din.org[i]],
                               qg__win_amount(w, in->charged_milli));
        }
        if (rc == QG_OK && in->cost_micro > 0) {
            qg__payg_spent_in(&m->spent, in->cap_start_ms);
            qg__payg_spent_adjust(&m->spent, in->cap_start_ms,
                                  in->cost_micro);
        }
    }
    pthread_mutex_unlock(&es->mu);
    if (rc == QG_OK && remember) {
        r = qg__mem_resv_insert(rs, in->rid);
        r->member = m;
        r->org = o;
        r->shard = (uint16_t)esi;
        r->t0_ms = din.ctx[0].now_ms;
        r->expires_ms = expiry(r->t0_ms, in->plan);
        r->reserved_milli = in->reserved_milli;
        r->charged_milli = in->charged_milli;
        r->anchor_ms = in->anchor_ms;
        r->model = in->model;
        r->model_spec = in->model_spec;
        r->headroom_milli = in->headroom_milli;
        r->price_micro = in->price_micro;
        r->cost_micro = in->cost_micro;
        r->cap_start_ms = in->cap_start_ms;
        if (in->settled) {
            r->state = R_SETTLED;
            r->actual_milli = in->charged_milli;
            r->status = (uint8_t)in->status;
            rs->live--;
        }
    }
out:
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

static void mem_stats(qg_store *s, qg_store_stats *out)
{
    mem_store *ms = (mem_store *)s;
    memset(out, 0, sizeof *out);
    out->backend = "memory";
    for (int i = 0; i < ms->nshards; i++) {
        ent_shard *es = &ms->ents[i];
        resv_shard *rs = &ms->resvs[i];
        pthread_mutex_lock(&es->mu);
        out->subjects += es->count;
        out->bytes += es->bytes + (size_t)es->cap * sizeof(ent_slot);
        for (uint32_t j = 0; j < es->cap; j++) {
            entity *e = es->slots[j].e;
            if (key_zero(es->slots[j].key))
                continue;
            for (uint32_t w = 0; w < e->lay->n; w++)
                out->bytes += qg__win_bytes_type((qg_win_type)e->lay->type[w],
                                                &e->win[w]);
        }
        pthread_mutex_unlock(&es->mu);
        pthread_mutex_lock(&rs->mu);
        out->reservations += rs->count;
        out->reservations_live += rs->live;
        out->bytes += (size_t)rs->cap * resv_slot_bytes(rs) +
                      (size_t)rs->max * sizeof(resv);
        pthread_mutex_unlock(&rs->mu);
    }
}

static void mem_free(qg_store *s)
{
    mem_store *ms = (mem_store *)s;
    if (!ms)
        return;
    for (int i = 0; i < ms->nshards; i++) {
        if (ms->ents) {
            ent_shard *es = &ms->ents[i];
            for (uint32_t j = 0; j < es->cap; j++)
                if (!key_zero(es->slots[j].key))
                    qg__mem_entity_free(es->slots[j].e);
            free(es->slots);
            while (es->layouts) {
                layout *l = es->layouts;
                es->layouts = l->next;
                free(l);
            }
            pthread_mutex_destroy(&es->mu);
        }
        if (ms->resvs)
            pthread_mutex_destroy(&ms->resvs[i].mu);
    }
    if (ms->resv_region)
        munmap(ms->resv_region, ms->resv_region_len);
    free(ms->ents);
    free(ms->resvs);
    free(ms);
}

#define HUGE_PAGE ((size_t)2 << 20)

/* Make [a, a + len) resident: MADV_POPULATE_WRITE (Linux 5.14), else a
 * write to every 4 KB page. Without it, each of the region's huge pages was
 * faulted in by the decision that first touched it, under a reservation
 * shard's lock; with transparent huge pages on "madvise", a fault may
 * compact memory first. Cold `serve` runs under check+settle pairs: a p99
 * of 33-50 ms (against 6-8 ms) in 4 runs of 21 before, none in 8 with huge
 * pages off, none in 16 with this (docs/benchmarks.md, "HTTP", twelfth
 * session). */
static void populate(char *a, size_t len)
{
#ifdef MADV_POPULATE_WRITE
    if (madvise(a, len, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (size_t off = 0; off < len; off += 4096)
        ((volatile char *)a)[off] = 0;
}

/* The reservation shards' rings and indexes, one zeroed mapping for all
 * of them (72 MiB at the default 2^19 ids: 68 MiB of entries, 4 MiB of
 * index), in huge pages where the kernel has them (MADV_HUGEPAGE; ignored
 * where it does not): touched first by checks, 4 KB pages cost a page
 * fault (and a TLB shootdown across the process's threads) every 30
 * entries, which a check-only load measured at 7-12% of the server's CPU
 * (docs/benchmarks.md, issue 14). */
static char *resv_region_new(mem_store *ms, size_t len, int prefault)
{
    size_t n = len + HUGE_PAGE;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a;
    if (p == MAP_FAILED)
        return NULL;
    ms->resv_region = p;
    ms->resv_region_len = n;
    a = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(a, len, MADV_HUGEPAGE);
#endif
    if (prefault)
        populate(a, len);
    return a;
}

/* A shard's lock spins a little before it sleeps (glibc's adaptive
 * mutex): it is held for well under a microsecond, a futex sleep and
 * wake-up cost several.  Two threads at a million subjects made 356k
 * futex calls in 8M decisions with plain mutexes, 26k with these
 * (docs/benchmarks.md, "Engine"). */
static void shard_lock_attr(pthread_mutexattr_t *ma)
{
    pthread_mutexattr_init(ma);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
}

static const qg_store_methods memory_methods = {
    .api = QG_STORE_API,
    .name = "memory",
    .flags = 0,
    .check = mem_check,
    .settle = mem_settle,
    .usage = mem_usage,
    .restore = mem_restore,
    .known = mem_known,
    .stats = mem_stats,
    .free = mem_free,
    .prefetch = mem_prefetch,
    .prefetch_member = mem_prefetch_member,
};

qg_store *qg_store_memory_new(const qg_memory_opts *opts)
{
    int n = opts && opts->shards > 0 ? opts->shards : DEFAULT_SHARDS;
    uint32_t maxr = opts && opts->max_reservations ? opts->max_reservations
                                                   : DEFAULT_RESERVATIONS;
    uint32_t per, cap;
    size_t slot;
    mem_store *ms;
    char *region;
    size_t ring_len;
    pthread_mutexattr_t ma;

    if (n & (n - 1) || n > 4096)
        return NULL;
    if (!(opts && opts->shards > 0))
        while (n > 1 && maxr / (uint32_t)n < MIN_PER_SHARD)
            n /= 2;
    per = maxr / (uint32_t)n ? maxr / (uint32_t)n : 1;
    for (cap = 4; cap < per * 2; cap <<= 1)
        ;
    slot = qg__mem_resv_slot_size(per, cap);
    if (!(ms = calloc(1, sizeof *ms)))
        return NULL;
    ms->base.m = &memory_methods;
    ms->nshards = n;
    ms->ents = calloc((size_t)n, sizeof *ms->ents);
    ms->resvs = calloc((size_t)n, sizeof *ms->resvs);
    if (!ms->ents || !ms->resvs)
        goto fail;
    /* rings first (sizeof(resv) keeps them 8-byte aligned), then indexes */
    ring_len = (size_t)n * per * sizeof(resv);
    if (!(region = resv_region_new(ms, ring_len +
                                           (size_t)n * cap * slot,
                                   opts && opts->prefault)))
        goto fail;
    shard_lock_attr(&ma);
    for (int i = 0; i < n; i++) {
        resv_shard *rs = &ms->resvs[i];
        pthread_mutex_init(&ms->ents[i].mu, &ma);
        ms->ents[i].index = (uint16_t)i;
        pthread_mutex_init(&rs->mu, &ma);
        qg__mem_resv_init(rs, (resv *)region + (size_t)i * per,
                          region + ring_len + (size_t)i * cap * slot, per,
                          cap);
    }
    pthread_mutexattr_destroy(&ma);
    return &ms->base;
fail:
    mem_free(&ms->base);
    return NULL;
}

