/* engine.c - the decision engine: subjects, request resolution, store.
 *
 * The engine turns a request (subject, model, tokens) into one
 * self-contained store instruction: it looks the subject up (plan, org,
 * billing anchor), computes the weight in fixed point, hashes the request
 * id, and lets the store decide atomically.  The subject registry is
 * sharded with a read-write lock per shard so that decisions on different
 * threads do not share a cache line.  Subjects are keyed by the 128-bit
 * hash of their name; the name is kept for listings.
 *
 * Rules generations: a reload builds a new generation (rules plus derived
 * tables), remaps every registered subject's plan and org by name under
 * all registry write locks, and publishes it.
 *
 * Versions over time (PRODUCT.md 8): a generation holds every version of
 * its rules file, and each call picks the one in force at its own instant
 * (the last whose effective <= now), so a crossing needs no reload and a
 * version is never enforced early.  The registry names plans and orgs by
 * an index into the generation's union of names; each version maps that
 * index to its own (or -1 where it lacks the plan).  Stores carry a
 * window's state across versions by name and type, as across reloads.  A reader copies its subject
 * and the generation under the same shard read lock, so the two always
 * agree.  Old generations are retired, not freed, until the engine is
 * freed: a store may still hold pointers into their window specs and
 * models (few reloads happen in a process's life; each costs one rules
 * allocation).
 *
 * Bounds (quotagate.h): every number a caller hands in is checked here,
 * once, before the store sees it: instants within [0, QG_TIME_MAX_MS],
 * token counts within QG_TOKENS_MAX, weights (given, or computed from the
 * tokens of a check) within QG_AMOUNT_MAX_MILLI, and a restored row's
 * amounts within the amount and money bounds.  Out of bounds is QG_ERANGE
 * with a message naming the field and the bound (an instant: QG_EINVAL);
 * below this line nothing can overflow (window.h, decide.c).
 *
 * qg_engine_check_many decides a group of checks one after the other,
 * as qg_engine_check would, having first asked for the memory each needs
 * (hashes and registry slots, then entities, then what they point at),
 * so that one check's cache misses overlap another's.
 *
 * Calls on lanes (a store across a network) are counted in flight, by
 * generation, until their callers are told: a reconciliation waits for
 * the ones sent before its cut (qg_engine_calls_mark). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "civil.h"
#include "error.h"
#include "fixed.h"
#include "fallback.h"
#include "payg.h"
#include "rules.h"
#include "store.h"
#include "weights.h"
#include "window.h"

#define REG_SHARDS 64
#define SEED_SUBJECT 0x7173756271676d31ULL
#define SEED_ORG 0x7173756271676f72ULL
#define SEED_RID 0x7173756271677269ULL

typedef struct subject {
    qg_key key;
    char *name;
    int plan, org;
    int64_t anchor_ms;
    void *_Atomic hint;          /* the store's hint for this member */
} subject;

typedef struct reg_shard {
    pthread_rwlock_t lock;
    subject *slots;
    uint32_t cap, count;
    char pad[64];
} reg_shard;

/* One version of a generation and its derived tables. */
typedef struct ver {
    const qg_rules *rules;       /* owned by the generation's chain */
    qg_key *org_keys;            /* per org index of this version */
    void *_Atomic *org_hints;    /* per org index: the store's hint for the
                                    org (qg_store_check.org_hint) */
    int *plan_of;                /* registry plan index -> this version's
                                    plan index, -1 when it has none */
    int *org_of;                 /* likewise for orgs */
    int *org_reg;                /* this version's org index -> registry
                                    org index (gen_org: by the rules'
                                    name index, not a scan of the names) */
} ver;

typedef struct gen {
    qg_rules *rules;             /* the chain's first version (owned) */
    ver *vers;                   /* in the order they take effect */
    int nvers;
    const char **plan_names;     /* the registry's plan indices: every
                                    version's plans, by first appearance */
    int nplan_names;
    const char **org_names;
    int norg_names;
    int64_t reach_ms;            /* how far back usage can still count */
    struct gen *prev;            /* retired generations */
} gen;

/* How reg_get picks a version when none is in force yet at the instant:
 * a decision is refused, a replay of older usage takes the first. */
enum { PICK_IN_FORCE, PICK_OR_FIRST };

struct qg_engine {
    gen *_Atomic cur;
    qg_store *store;
    qg__fallback *fb;            /* local decisions while the store is down
                                    (fallback.h), NULL until enabled */
    pthread_mutex_t reload_mu;
    qg_tz *utc;                  /* payg cap periods (payg.c) */
    /* checks and settles sent on lanes whose callers are not yet told
     * (qg_engine_calls_mark): by generation, gen & 1 */
    _Atomic unsigned calls_gen;
    _Atomic long calls_in[2];
    reg_shard reg[REG_SHARDS];
};

static gen *cur_gen(const qg_engine *e)
{
    return atomic_load_explicit(&((qg_engine *)e)->cur, memory_order_acquire);
}

static qg_key hash_key(const char *s, size_t len, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(s, len, seed);
    qg_key k = {h.high64, h.low64};
    if (k.hi == 0 && k.lo == 0)
        k.lo = 1;                /* zero means "empty slot" in tables */
    return k;
}


/* --------------------------------------------------------- registry */

static subject *reg_find(reg_shard *sh, qg_key k)
{
    if (!sh->cap)
        return NULL;
    for (uint32_t j = (uint32_t)k.lo & (sh->cap - 1); sh->slots[j].name;
         j = (j + 1) & (sh->cap - 1))
        if (sh->slots[j].key.hi == k.hi && sh->slots[j].key.lo == k.lo)
            return &sh->slots[j];
    return NULL;
}

static int reg_grow(reg_shard *sh)
{
    uint32_t ncap = sh->cap ? sh->cap * 2 : 64;
    subject *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return QG_ENOMEM;
    for (uint32_t i = 0; i < sh->cap; i++) {
        uint32_t j;
        if (!sh->slots[i].name)
            continue;
        for (j = (uint32_t)sh->slots[i].key.lo & (ncap - 1); ns[j].name;
             j = (j + 1) & (ncap - 1))
            ;
        ns[j] = sh->slots[i];
    }
    free(sh->slots);
    /* atomic: reg_prefetch reads them without the lock */
    __atomic_store_n(&sh->slots, ns, __ATOMIC_RELAXED);
    __atomic_store_n(&sh->cap, ncap, __ATOMIC_RELAXED);
    return QG_OK;
}

static int reg_put(qg_engine *e, const char *name, int plan, int org,
                   int64_t anchor)
{
    qg_key k = hash_key(name, strlen(name), SEED_SUBJECT);
    reg_shard *sh = &e->reg[k.hi % REG_SHARDS];
    subject *s;
    int rc = QG_OK;

    pthread_rwlock_wrlock(&sh->lock);
    if (!(s = reg_find(sh, k))) {
        uint32_t j;
        char *copy;
        if ((sh->count + 1) * 2 > sh->cap && (rc = reg_grow(sh)) != QG_OK)
            goto out;
        if (!(copy = strdup(name))) {
            rc = QG_ENOMEM;
            goto out;
        }
        for (j = (uint32_t)k.lo & (sh->cap - 1); sh->slots[j].name;
             j = (j + 1) & (sh->cap - 1))
            ;
        s = &sh->slots[j];
        s->key = k;
        s->name = copy;
        sh->count++;
    }
    s->plan = plan;
    s->org = org;
    s->anchor_ms = anchor;
    atomic_store(&s->hint, NULL);   /* the member may move to another shard */
out:
    pthread_rwlock_unlock(&sh->lock);
    return rc;
}

/* Remember the store's hint for a registered subject, unless the record
 * changed meanwhile (a concurrent set_subject resets it). */
static void reg_set_hint(qg_engine *e, qg_key k, void *expected, void *hint)
{
    reg_shard *sh = &e->reg[k.hi % REG_SHARDS];
    subject *s;
    pthread_rwlock_rdlock(&sh->lock);
    if ((s = reg_find(sh, k)) != NULL)
        atomic_compare_exchange_strong(&s->hint, &expected, hint);
    pthread_rwlock_unlock(&sh->lock);
}

static const ver *gen_pick(const gen *g, int64_t t_ms, int how)
{
    const ver *v = NULL;
    for (int i = 0; i < g->nvers && g->vers[i].rules->effective_ms <= t_ms;
         i++)
        v = &g->vers[i];
    return v ? v : how == PICK_OR_FIRST ? &g->vers[0] : NULL;
}

/* Copy out a subject's registration and the generation it belongs to,
 * with the version in force at t_ms and the subject's plan and org as
 * that version's indices; unknown subjects fall back to its default plan.
 * QG_ENOSUBJECT (unknown, no default plan), or QG_EINVAL with the reason
 * in err: no version in force yet, or the version lacks the plan (not
 * QG_ESTATE, which the server reads as its store rebuilding). */
static int reg_get_keyed(qg_engine *e, const char *name, int64_t t_ms,
                         int how, const qg_key *k, subject *out, gen **g,
                         const ver **vp, char *err, size_t errcap)
{
    reg_shard *sh;
    subject *s;
    const ver *v;
    char when[40];

    sh = &e->reg[k->hi % REG_SHARDS];
    pthread_rwlock_rdlock(&sh->lock);
    *g = cur_gen(e);
    s = reg_find(sh, *k);
    if (s) {
        out->key = s->key;
        out->name = s->name;
        out->plan = s->plan;
        out->org = s->org;
        out->anchor_ms = s->anchor_ms;
        out->hint = atomic_load_explicit(&s->hint, memory_order_relaxed);
    }
    pthread_rwlock_unlock(&sh->lock);
    if (!(v = *vp = gen_pick(*g, t_ms, how))) {
        qg_iso8601_format((*g)->rules->effective_ms, when, sizeof when);
        qg__errf(err, errcap, "no rules version is in force yet: the first, "
                 "\"%s\", takes effect at %s", (*g)->rules->version, when);
        return QG_EINVAL;
    }
    if (s) {
        int p = v->plan_of[out->plan];
        if (p < 0) {
            qg__errf(err, errcap, "plan \"%s\" of subject \"%s\" is not "
                     "in rules version \"%s\", in force at that instant",
                     (*g)->plan_names[out->plan], name, v->rules->version);
            return QG_EINVAL;
        }
        out->plan = p;
        out->org = out->org >= 0 ? v->org_of[out->org] : -1;
        return QG_OK;
    }
    if (v->rules->default_plan < 0)
        return QG_ENOSUBJECT;
    out->plan = v->rules->default_plan;
    out->org = -1;
    out->anchor_ms = 0;
    out->hint = NULL;
    return QG_OK;
}

static int reg_get(qg_engine *e, const char *name, int64_t t_ms, int how,
                   qg_key *k, subject *out, gen **g, const ver **vp,
                   char *err, size_t errcap)
{
    *k = hash_key(name, strlen(name), SEED_SUBJECT);
    return reg_get_keyed(e, name, t_ms, how, k, out, g, vp, err, errcap);
}

/* Start loading the registry slot where the subject of key k starts its
 * probe (qg_engine_check_many).  Read without the shard's lock: the
 * array and its size are stored atomically by reg_grow, and a stale pair
 * only makes the prefetch useless (a prefetch never faults). */
static void reg_prefetch(qg_engine *e, qg_key k)
{
    reg_shard *sh = &e->reg[k.hi % REG_SHARDS];
    subject *slots = __atomic_load_n(&sh->slots, __ATOMIC_RELAXED);
    uint32_t cap = __atomic_load_n(&sh->cap, __ATOMIC_RELAXED);
    if (cap)
        __builtin_prefetch(&slots[(uint32_t)k.lo & (cap - 1)]);
}

/* a * b for non-negative a, b, saturated at INT64_MAX. */
static int64_t sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Longest time a charge can still matter to some window of the rules
 * (window.h). */
int64_t qg__window_reach(const qg_window_spec *w, int n)
{
    int64_t reach = 0;
    for (int i = 0; i < n; i++) {
        int64_t r = 0;
        switch (w[i].type) {
        case QG_WIN_ROLLING:
        case QG_WIN_SESSION:
            r = w[i].length_ms;
            break;
        case QG_WIN_CALENDAR:
            r = (w[i].cal.every == QG_EVERY_DAY ? 2 :
                 w[i].cal.every == QG_EVERY_WEEK ? 8 : 32) * 86400000LL;
            break;
        case QG_WIN_RATE: {
            /* a full bucket drains in burst/limit periods */
            int64_t b = w[i].burst_milli > 0 ? w[i].burst_milli
                                             : w[i].limit_milli;
            r = sat_mul(w[i].length_ms, qg__ceil_div(b, w[i].limit_milli));
            break;
        }
        case QG_WIN_CONCURRENCY:
            r = w[i].lease_ttl_ms;
            break;
        }
        if (r > reach)
            reach = r;
    }
    return reach;
}

/* Index of name in names[0..n), else append it (names has room). */
static int name_slot(const char **names, int *n, const char *name)
{
    for (int i = 0; i < *n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    names[*n] = name;
    return (*n)++;
}

static int64_t version_reach(const qg_rules *rules)
{
    int64_t reach = 0;
    for (int i = 0; i < rules->nplans; i++) {
        int64_t r = qg__window_reach(rules->plans[i].windows,
                                 rules->plans[i].nwindows);
        /* payg: the spent amount of a cap period (a month at most) is
         * rebuilt from the rows of that period */
        if (rules->plans[i].payg && r < 32 * QG_MS_PER_DAY)
            r = 32 * QG_MS_PER_DAY;
        if (r > reach)
            reach = r;
    }
    for (int i = 0; i < rules->norgs; i++) {
        int64_t r = qg__window_reach(rules->orgs[i].windows,
                                 rules->orgs[i].nwindows);
        if (rules->orgs[i].payg && r < 32 * QG_MS_PER_DAY)
            r = 32 * QG_MS_PER_DAY;
        if (r > reach)
            reach = r;
    }
    return reach;
}

static void gen_free_one(gen *g)
{
    for (int i = 0; g->vers && i < g->nvers; i++) {
        free(g->vers[i].org_keys);
        free((void *)g->vers[i].org_hints);
        free(g->vers[i].plan_of);
        free(g->vers[i].org_of);
        free(g->vers[i].org_reg);
    }
    free(g->vers);
    free(g->plan_names);
    free(g->org_names);
    qg_rules_free(g->rules);
    free(g);
}

static gen *gen_new(qg_rules *rules)
{
    gen *g = calloc(1, sizeof *g);
    const qg_rules *r;
    size_t np = 0, no = 0;
    int n = 0;

    if (!g)
        return NULL;
    for (r = rules; r; r = r->next) {
        n++;
        np += (size_t)r->nplans;
        no += (size_t)r->norgs;
    }
    if (!(g->vers = calloc((size_t)n, sizeof *g->vers)) ||
        !(g->plan_names = calloc(np + 1, sizeof *g->plan_names)) ||
        !(g->org_names = calloc(no + 1, sizeof *g->org_names)))
        goto fail;
    g->nvers = n;
    n = 0;
    for (r = rules; r; r = r->next, n++) {
        ver *v = &g->vers[n];
        v->rules = r;
        for (int i = 0; i < r->nplans; i++)
            name_slot(g->plan_names, &g->nplan_names, r->plans[i].name);
        if (!(v->org_reg = calloc((size_t)r->norgs + 1, sizeof(int))))
            goto fail;
        /* an org an earlier version has keeps its registry index */
        for (int i = 0; i < r->norgs; i++) {
            int slot = -1;
            for (int j = 0; j < n && slot < 0; j++) {
                int o = qg__rules_find_org(g->vers[j].rules, r->orgs[i].name);
                if (o >= 0)
                    slot = g->vers[j].org_reg[o];
            }
            if (slot < 0) {
                slot = g->norg_names++;
                g->org_names[slot] = r->orgs[i].name;
            }
            v->org_reg[i] = slot;
        }
    }
    n = 0;
    for (r = rules; r; r = r->next, n++) {
        ver *v = &g->vers[n];
        int64_t reach;
        if (!(v->org_keys = calloc((size_t)r->norgs + 1, sizeof *v->org_keys)) ||
            !(v->org_hints = calloc((size_t)r->norgs + 1,
                                    sizeof *v->org_hints)) ||
            !(v->plan_of = calloc((size_t)g->nplan_names + 1, sizeof(int))) ||
            !(v->org_of = calloc((size_t)g->norg_names + 1, sizeof(int))))
            goto fail;
        for (int i = 0; i < r->norgs; i++)
            v->org_keys[i] = hash_key(r->orgs[i].name, strlen(r->orgs[i].name),
                                      SEED_ORG);
        for (int i = 0; i < g->nplan_names; i++)
            v->plan_of[i] = qg__rules_find_plan(r, g->plan_names[i]);
        for (int i = 0; i < g->norg_names; i++)
            v->org_of[i] = -1;
        for (int i = 0; i < r->norgs; i++)
            v->org_of[v->org_reg[i]] = i;
        if ((reach = version_reach(r)) > g->reach_ms)
            g->reach_ms = reach;
    }
    g->rules = rules;
    return g;
fail:
    gen_free_one(g);            /* g->rules is still NULL: not freed */
    return NULL;
}

/* The registry index of plan (org) `name`, -1 when no version has it. */
static int gen_plan(const gen *g, const char *name)
{
    for (int i = 0; name && i < g->nplan_names; i++)
        if (strcmp(g->plan_names[i], name) == 0)
            return i;
    return -1;
}

/* Through each version's index of org names (a deployment may have
 * thousands of orgs; this runs for every subject registered and, on a
 * reload, for every subject the registry holds). */
static int gen_org(const gen *g, const char *name)
{
    for (int k = 0; name && k < g->nvers; k++) {
        int o = qg__rules_find_org(g->vers[k].rules, name);
        if (o >= 0)
            return g->vers[k].org_reg[o];
    }
    return -1;
}

static void gen_free_chain(gen *g)
{
    while (g) {
        gen *p = g->prev;
        gen_free_one(g);
        g = p;
    }
}

/* ----------------------------------------------------------- lifecycle */

/* Register the subjects every version lists (a later version's entry of
 * the same subject wins: a file lists them again in each version). */
static int reg_load_subjects(qg_engine *e, const gen *g)
{
    for (const qg_rules *r = g->rules; r; r = r->next)
        for (int i = 0; i < r->nsubjects; i++) {
            const qg_subject_spec *s = &r->subjects[i];
            int rc = reg_put(e, s->name, gen_plan(g, r->plans[s->plan].name),
                             s->org >= 0 ? gen_org(g, r->orgs[s->org].name)
                                         : -1,
                             s->billing_anchor_ms);
            if (rc != QG_OK)
                return rc;
        }
    return QG_OK;
}

qg_engine *qg_engine_new(qg_rules *rules, qg_store *store)
{
    qg_engine *e;
    gen *g;
    if (!store || store->m->api != QG_STORE_API ||
        !(e = calloc(1, sizeof *e)))
        return NULL;            /* another contract: refused */
    e->store = store;
    if (!(e->utc = qg__tz_utc())) {
        free(e);
        return NULL;
    }
    pthread_mutex_init(&e->reload_mu, NULL);
    for (int i = 0; i < REG_SHARDS; i++)
        pthread_rwlock_init(&e->reg[i].lock, NULL);
    if (!(g = gen_new(rules)))
        goto fail;
    atomic_store(&e->cur, g);
    if (reg_load_subjects(e, g) != QG_OK)
        goto fail;
    return e;
fail:
    if (g)
        g->rules = NULL;         /* the caller keeps the rules on failure */
    qg_engine_free(e);
    return NULL;
}

void qg_engine_free(qg_engine *e)
{
    if (e)
        qg__fallback_free(e->fb);
    if (!e)
        return;
    for (int i = 0; i < REG_SHARDS; i++) {
        for (uint32_t j = 0; j < e->reg[i].cap; j++)
            free(e->reg[i].slots[j].name);
        free(e->reg[i].slots);
        pthread_rwlock_destroy(&e->reg[i].lock);
    }
    gen_free_chain(atomic_load(&e->cur));
    pthread_mutex_destroy(&e->reload_mu);
    qg__tz_free(e->utc);
    free(e);
}

const qg_rules *qg_engine_rules(const qg_engine *e)
{
    return cur_gen(e)->rules;
}

const qg_rules *qg_engine_rules_at(const qg_engine *e, int64_t t_ms)
{
    return gen_pick(cur_gen(e), t_ms, PICK_OR_FIRST)->rules;
}

int64_t qg_engine_reach_ms(const qg_engine *e)
{
    return cur_gen(e)->reach_ms;
}

int qg_engine_org_members(qg_engine *e, const char *org, size_t cap,
                          char ***names, size_t *n, size_t *total)
{
    char **out = NULL;
    size_t got = 0, all = 0;
    int rc = QG_OK;

    *names = NULL;
    *n = 0;
    if (total)
        *total = 0;
    if (qg__rules_find_org(cur_gen(e)->rules, org) < 0)
        return QG_ENOTFOUND;
    if (cap && !(out = calloc(cap, sizeof *out)))
        return QG_ENOMEM;
    for (int i = 0; i < REG_SHARDS && rc == QG_OK; i++) {
        reg_shard *sh = &e->reg[i];
        pthread_rwlock_rdlock(&sh->lock);
        /* the org's index in the generation this shard's records follow
         * (a reload remaps them under every shard's write lock) */
        int ix = qg__rules_find_org(cur_gen(e)->rules, org);
        for (uint32_t j = 0; ix >= 0 && j < sh->cap; j++) {
            if (!sh->slots[j].name || sh->slots[j].org != ix)
                continue;
            all++;
            if (got < cap && !(out[got++] = strdup(sh->slots[j].name))) {
                got--;
                rc = QG_ENOMEM;
                break;
            }
        }
        pthread_rwlock_unlock(&sh->lock);
    }
    if (rc != QG_OK) {
        qg_engine_names_free(out, got);
        return rc;
    }
    *names = out;
    *n = got;
    if (total)
        *total = all;
    return QG_OK;
}

void qg_engine_names_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

int qg_engine_reload(qg_engine *e, qg_rules *rules, char *err, size_t errcap)
{
    gen *old, *g;
    int rc = QG_OK;

    if (!(g = gen_new(rules)))
        return QG_ENOMEM;
    pthread_mutex_lock(&e->reload_mu);
    old = cur_gen(e);
    for (int i = 0; i < REG_SHARDS; i++)
        pthread_rwlock_wrlock(&e->reg[i].lock);
    /* First pass: every registered subject's plan and org must exist. */
    for (int i = 0; i < REG_SHARDS && rc == QG_OK; i++)
        for (uint32_t j = 0; j < e->reg[i].cap && rc == QG_OK; j++) {
            subject *s = &e->reg[i].slots[j];
            const char *pn, *on;
            if (!s->name)
                continue;
            pn = old->plan_names[s->plan];
            on = s->org >= 0 ? old->org_names[s->org] : NULL;
            if (gen_plan(g, pn) < 0) {
                qg__errf(err, errcap, "the new rules drop plan \"%s\", which "
                       "subjects use", pn);
                rc = QG_EINVAL;
            } else if (on && gen_org(g, on) < 0) {
                qg__errf(err, errcap, "the new rules drop org \"%s\", which "
                       "subjects use", on);
                rc = QG_EINVAL;
            }
        }
    if (rc == QG_OK) {
        for (int i = 0; i < REG_SHARDS; i++)
            for (uint32_t j = 0; j < e->reg[i].cap; j++) {
                subject *s = &e->reg[i].slots[j];
                if (!s->name)
                    continue;
                s->plan = gen_plan(g, old->plan_names[s->plan]);
                if (s->org >= 0)
                    s->org = gen_org(g, old->org_names[s->org]);
            }
        g->prev = old;
        atomic_store_explicit(&e->cur, g, memory_order_release);
    }
    for (int i = REG_SHARDS; i-- > 0;)
        pthread_rwlock_unlock(&e->reg[i].lock);
    pthread_mutex_unlock(&e->reload_mu);
    if (rc != QG_OK) {
        g->rules = NULL;         /* the caller keeps the rejected rules */
        gen_free_chain(g);
    }
    return rc;
}

int qg_engine_set_subject(qg_engine *e, const char *subject_name,
                          const char *plan, const char *org,
                          int64_t billing_anchor_ms, char *err, size_t errcap)
{
    int p, o = -1;

    if (!subject_name || !*subject_name || strlen(subject_name) > 255) {
        qg__errf(err, errcap, "%s", "subject must be 1 to 255 bytes");
        return QG_EINVAL;
    }
    const gen *g = cur_gen(e);

    /* a plan of any version: a decision outside the versions that have
     * it is refused (reg_get) */
    if (!plan || (p = gen_plan(g, plan)) < 0) {
        qg__errf(err, errcap, "unknown plan \"%s\"", plan ? plan : "");
        return QG_EINVAL;
    }
    if (org && *org && (o = gen_org(g, org)) < 0) {
        qg__errf(err, errcap, "unknown org \"%s\"", org);
        return QG_EINVAL;
    }
    return reg_put(e, subject_name, p, o, billing_anchor_ms);
}

int qg_engine_knows_subject(qg_engine *e, const char *subject_name)
{
    subject s;
    qg_key k;
    gen *g;
    const ver *v;
    if (!subject_name || !*subject_name)
        return 0;
    /* known to the registry, or admitted by a default plan of some
     * version: the first's */
    return reg_get(e, subject_name, 0, PICK_OR_FIRST, &k, &s, &g, &v, NULL,
                   0) != QG_ENOSUBJECT;
}

/* ------------------------------------------------------------ decisions */

/* An instant the arithmetic accepts (quotagate.h). */
static int time_ok(int64_t t_ms, const char *what, char *err, size_t errcap)
{
    if (t_ms >= 0 && t_ms <= QG_TIME_MAX_MS)
        return 1;
    qg__errf(err, errcap, "%s %lld is out of range (0 to %lld ms since "
             "1970, i.e. up to 9999-12-31)", what, (long long)t_ms,
             (long long)QG_TIME_MAX_MS);
    return 0;
}

/* A token count within [0, QG_TOKENS_MAX]: 0, else QG_EINVAL (negative)
 * or QG_ERANGE (over the bound) with the message. */
static int tokens_ok(int64_t n, const char *field, char *err, size_t errcap)
{
    if (n < 0) {
        qg__errf(err, errcap, "%s must be >= 0", field);
        return QG_EINVAL;
    }
    if (n > QG_TOKENS_MAX) {
        qg__errf(err, errcap, "%s must be at most %lld (the bound on a "
                 "token count)", field, (long long)QG_TOKENS_MAX);
        return QG_ERANGE;
    }
    return QG_OK;
}

/* A weight within [0, QG_AMOUNT_MAX_MILLI], as tokens_ok. */
static int weight_ok(int64_t w, const char *field, char *err, size_t errcap)
{
    if (w < 0) {
        qg__errf(err, errcap, "%s must be >= 0", field);
        return QG_EINVAL;
    }
    if (w > QG_AMOUNT_MAX_MILLI) {
        qg__errf(err, errcap, "%s must be at most %lld points (the bound on "
                 "one request's weight)", field,
                 (long long)(QG_AMOUNT_MAX_MILLI / QG_MILLI));
        return QG_ERANGE;
    }
    return QG_OK;
}

static void fill_names(const ver *v, const subject *s, int model,
                       qg_decision *out)
{
    const qg_rules *r = v->rules;
    out->plan = r->plans[s->plan].name;
    out->org = s->org >= 0 ? r->orgs[s->org].name : NULL;
    out->model = model >= 0 ? r->models[model].name : NULL;
    out->rules_version = r->version;
    out->weights_version = r->weights_version;
    out->anchor_ms = s->anchor_ms;
}

/* One call of the engine to its store, from the request's checks to the
 * answer's names: built by prepare_*, finished by finish_* once the store
 * has answered (at once, or later on a lane). */
typedef struct call {
    qg_engine *e;
    int kind;                    /* CALL_CHECK, CALL_SETTLE, CALL_USAGE */
    union {
        qg_store_check check;
        qg_store_settle settle;
        qg_store_usage usage;
    } in;
    subject s;                   /* check, usage: the subject, its plan and
                                    org as indices of v */
    gen *g;
    const ver *v;                /* the version in force at the call */
    char rid[QG_REQUEST_ID_MAX + 1], subject[256];
    void *out;
    char *err;
    size_t errcap;
    qg_engine_done done;
    void *ud;
    unsigned slot;               /* check, settle: its calls_in slot */
} call;

enum { CALL_CHECK = 1, CALL_SETTLE, CALL_USAGE };

/* keys: the request id's and the subject's hashes when the caller has
 * them (qg_engine_check_many, which prefetched with them), else NULL. */
static int prepare_check(qg_engine *e, const qg_check_req *req,
                         int64_t now_ms, const qg_key *keys, call *c,
                         char *err, size_t errcap)
{
    const qg_rules *r;
    qg_store_check *in = &c->in.check;
    size_t idlen;
    int rc;

    if (!req->subject || !*req->subject) {
        qg__errf(err, errcap, "%s", "subject is required");
        return QG_EINVAL;
    }
    if (!req->request_id || !(idlen = strlen(req->request_id)) ||
        idlen > QG_REQUEST_ID_MAX) {
        qg__errf(err, errcap, "%s", "request_id is required (1 to 255 bytes)");
        return QG_EINVAL;
    }
    if (!time_ok(now_ms, "the decision's instant", err, errcap))
        return QG_EINVAL;
    /* the request id first: the store starts loading its slot while the
     * subject is looked up (both are cache misses in a large table) */
    if (keys) {
        in->rid = keys[0];
        in->member = keys[1];
    } else {
        in->rid = hash_key(req->request_id, idlen, SEED_RID);
        if (e->store->m->prefetch)
            e->store->m->prefetch(e->store, in->rid, QG_PREFETCH_ALL);
        in->member = hash_key(req->subject, strlen(req->subject),
                              SEED_SUBJECT);
    }
    if ((rc = reg_get_keyed(e, req->subject, now_ms, PICK_IN_FORCE,
                            &in->member, &c->s, &c->g, &c->v, err,
                            errcap)) != QG_OK) {
        if (rc == QG_ENOSUBJECT)
            qg__errf(err, errcap, "unknown subject \"%s\"", req->subject);
        return rc;
    }
    memcpy(c->rid, req->request_id, idlen + 1);
    r = c->v->rules;
    in->rules = r;
    in->model = -1;
    in->model_spec = NULL;
    if (req->model) {
        int64_t out_tokens = req->max_output_tokens < 0
                                 ? QG_DEFAULT_OUTPUT_ESTIMATE
                                 : req->max_output_tokens;
        if ((in->model = qg_rules_find_model(r, req->model)) < 0) {
            qg__errf(err, errcap, "unknown model \"%s\"", req->model);
            return QG_EMODEL;
        }
        if ((rc = tokens_ok(req->input_tokens, "input_tokens", err,
                            errcap)) != QG_OK ||
            (rc = tokens_ok(out_tokens, "max_output_tokens", err,
                            errcap)) != QG_OK)
            return rc;
        in->model_spec = &r->models[in->model];
        in->weight_milli = qg__weight_milli(in->model_spec,
                                            req->input_tokens, out_tokens);
        if (in->weight_milli > QG_AMOUNT_MAX_MILLI) {
            qg__errf(err, errcap, "the weight of input_tokens and "
                     "max_output_tokens for model \"%s\" is over %lld "
                     "points (the bound on one request's weight)",
                     req->model, (long long)(QG_AMOUNT_MAX_MILLI / QG_MILLI));
            return QG_ERANGE;
        }
    } else {
        if ((rc = weight_ok(req->weight_milli, "weight", err, errcap)) !=
            QG_OK)
            return rc;
        in->weight_milli = req->weight_milli;
    }
    in->has_org = c->s.org >= 0;
    in->org = in->has_org ? c->v->org_keys[c->s.org] : (qg_key){0, 0};
    in->plan = &r->plans[c->s.plan];
    in->orgspec = in->has_org ? &r->orgs[c->s.org] : NULL;
    in->anchor_ms = c->s.anchor_ms;
    in->now_ms = now_ms;
    in->hint = NULL;
    in->org_hint = NULL;
    qg__payg_fill(e->utc, in);
    return QG_OK;
}

static int finish_check(call *c, int rc, qg_decision *out, char *err,
                        size_t errcap)
{
    const qg_store_check *in = &c->in.check;
    if (rc == QG_EINVAL)
        qg__errf(err, errcap, "request_id \"%s\" was already used by another "
               "subject", c->rid);
    else if (rc == QG_EFULL)
        qg__errf(err, errcap, "%s", "too many unsettled reservations; settle "
               "requests or raise the reservation limit");
    else if (rc == QG_ESTORE)
        qg__errf(err, errcap, "%s", "the counters' store cannot be reached");
    else if (rc != QG_OK)
        qg__errf(err, errcap, "%s", qg_strerror(rc));
    if (rc == QG_OK) {
        if (c->e->fb)
            qg__fallback_note(c->e->fb, in, out);
        fill_names(c->v, &c->s, in->model, out);
        out->spending_cap_micro = in->payg_mask ? in->cap_micro : 0;
        out->cap_period_end_ms = in->payg_mask ? in->cap_end_ms : 0;
        if (!in->payg_mask)
            out->spent_micro = 0;
    }
    return rc;
}

/* The store's half of a prepared check, and its end. */
static int run_check(call *c, qg_decision *out, char *err, size_t errcap);

int qg_engine_check(qg_engine *e, const qg_check_req *req, int64_t now_ms,
                    qg_decision *out, char *err, size_t errcap)
{
    call c;
    int rc;
    c.e = e;
    if ((rc = prepare_check(e, req, now_ms, NULL, &c, err, errcap)) != QG_OK)
        return rc;
    return run_check(&c, out, err, errcap);
}

/* qg_engine_check_many's group: the checks whose memory is asked for
 * together (~14 lines a check, counted from the code).  At a million
 * subjects groups of 4 ran ~9% faster than groups of 16, and 6 or 8 no
 * faster than 16 (rounds alternated in one process: docs/benchmarks.md,
 * "Engine", twenty-seventh session); a pipeline that keeps every stage
 * busy at once ran 0.58-0.89x these groups (twenty-eighth session). */
#define CHECK_GROUP 4

int qg_engine_check_many(qg_engine *e, size_t n, const qg_check_req *reqs,
                         int64_t now_ms, qg_decision *outs, int *rcs)
{
    call c[CHECK_GROUP];
    qg_key keys[CHECK_GROUP][2];
    int bad = 0;

    for (size_t at = 0; at < n; at += CHECK_GROUP) {
        size_t m = n - at < CHECK_GROUP ? n - at : CHECK_GROUP;
        const qg_check_req *rq = reqs + at;
        /* 1: every request's id slot and registry slot start loading */
        for (size_t i = 0; i < m; i++) {
            const char *id = rq[i].request_id, *sub = rq[i].subject;
            keys[i][0].hi = keys[i][0].lo = 0;
            if (!id || !sub)
                continue;        /* prepare_check says what is wrong */
            keys[i][0] = hash_key(id, strlen(id), SEED_RID);
            keys[i][1] = hash_key(sub, strlen(sub), SEED_SUBJECT);
            if (e->store->m->prefetch)
                e->store->m->prefetch(e->store, keys[i][0], 0);
            reg_prefetch(e, keys[i][1]);
        }
        /* 2: the registry, then the member's state starts loading */
        for (size_t i = 0; i < m; i++) {
            const qg_key *k = keys[i][0].lo || keys[i][0].hi ? keys[i]
                                                             : NULL;
            c[i].e = e;
            if (k && e->store->m->prefetch)
                e->store->m->prefetch(e->store, k[0], 1);
            rcs[at + i] = prepare_check(e, &rq[i], now_ms, k, &c[i], NULL,
                                        0);
            if (rcs[at + i] == QG_OK && e->store->m->prefetch_member)
                e->store->m->prefetch_member(
                    e->store, atomic_load_explicit(&c[i].s.hint,
                                                   memory_order_relaxed), 0);
        }
        /* 3: what the member's state points at starts loading */
        if (e->store->m->prefetch_member)
            for (size_t i = 0; i < m; i++)
                if (rcs[at + i] == QG_OK)
                    e->store->m->prefetch_member(
                        e->store, atomic_load_explicit(&c[i].s.hint,
                                                       memory_order_relaxed),
                        1);
        /* 4: the decisions, in order */
        for (size_t i = 0; i < m; i++) {
            if (rcs[at + i] == QG_OK)
                rcs[at + i] = run_check(&c[i], &outs[at + i], NULL, 0);
            bad += rcs[at + i] != QG_OK;
        }
    }
    return bad;
}

static int run_check(call *c, qg_decision *out, char *err, size_t errcap)
{
    qg_engine *e = c->e;
    int rc;
    /* the memory store's entity of this member, to skip a probe */
    void *before = atomic_load_explicit(&c->s.hint, memory_order_relaxed);
    void *hint = before, *obefore = NULL, *ohint = NULL;
    void *_Atomic *oslot = c->in.check.has_org
                               ? &c->v->org_hints[c->s.org] : NULL;
    c->in.check.hint = &hint;
    if (oslot) {
        /* and its org's: any entity the store handed out will do, it
         * checks before use, so a plain store is enough */
        ohint = obefore = atomic_load_explicit(oslot, memory_order_relaxed);
        c->in.check.org_hint = &ohint;
    }
    rc = e->store->m->check(e->store, &c->in.check, out);
    if (hint != before)
        reg_set_hint(e, c->in.check.member, before, hint);
    if (oslot && ohint != obefore)
        atomic_store_explicit(oslot, ohint, memory_order_relaxed);
    return finish_check(c, rc, out, err, errcap);
}

static int prepare_settle(qg_engine *e, const qg_settle_req *req,
                          int64_t now_ms, call *c, char *err, size_t errcap)
{
    qg_store_settle *in = &c->in.settle;
    size_t idlen;
    int rc;

    if (!req->request_id || !(idlen = strlen(req->request_id)) ||
        idlen > QG_REQUEST_ID_MAX) {
        qg__errf(err, errcap, "%s", "request_id is required (1 to 255 bytes)");
        return QG_EINVAL;
    }
    if (req->status < QG_SETTLE_COMPLETED || req->status > QG_SETTLE_FAILED) {
        qg__errf(err, errcap, "%s", "status must be completed, cancelled or "
               "failed");
        return QG_EINVAL;
    }
    if (!time_ok(now_ms, "the settle's instant", err, errcap))
        return QG_EINVAL;
    if ((rc = tokens_ok(req->input_tokens, "input_tokens", err, errcap)) !=
            QG_OK ||
        (rc = tokens_ok(req->output_tokens, "output_tokens", err, errcap)) !=
            QG_OK)
        return rc;
    if (req->weight_milli >= 0 &&
        (rc = weight_ok(req->weight_milli, "weight", err, errcap)) != QG_OK)
        return rc;
    memcpy(c->rid, req->request_id, idlen + 1);
    c->subject[0] = '\0';
    if (req->subject) {          /* for the error message: cut to fit */
        size_t n = strnlen(req->subject, sizeof c->subject - 1);
        memcpy(c->subject, req->subject, n);
        c->subject[n] = '\0';
    }
    in->rid = hash_key(req->request_id, idlen, SEED_RID);
    if (e->store->m->prefetch)
        e->store->m->prefetch(e->store, in->rid, QG_PREFETCH_ALL);
    in->now_ms = now_ms;
    in->status = req->status;
    in->input_tokens = req->input_tokens;
    in->output_tokens = req->output_tokens;
    in->weight_milli = req->weight_milli;
    in->no_charge = req->no_charge;
    in->has_member = req->subject && *req->subject;
    in->member = (qg_key){0, 0};
    in->has_org = 0;
    in->org = (qg_key){0, 0};
    if (in->has_member && (e->store->m->flags & QG_STORE_SETTLE_ORG)) {
        /* the subject's org now: where a remote store finds its keys
         * (reg_get hashes the name into in->member either way) */
        subject s;
        gen *g;
        const ver *v;
        if (reg_get(e, req->subject, now_ms, PICK_OR_FIRST, &in->member, &s,
                    &g, &v, NULL, 0) == QG_OK && s.org >= 0) {
            in->has_org = 1;
            in->org = v->org_keys[s.org];
        }
    } else if (in->has_member)
        in->member = hash_key(req->subject, strlen(req->subject),
                              SEED_SUBJECT);
    return QG_OK;
}

static int finish_settle(call *c, int rc, char *err, size_t errcap)
{
    if (rc == QG_ENOTFOUND)
        qg__errf(err, errcap, "no reservation for request_id \"%s\" (never "
               "admitted, or forgotten)", c->rid);
    else if (rc == QG_EINVAL)
        qg__errf(err, errcap, "request_id \"%s\" was reserved for another "
               "subject than \"%s\"; nothing was settled", c->rid,
               c->subject);
    else if (rc == QG_ESTORE)
        qg__errf(err, errcap, "%s", "the counters' store cannot be reached");
    else if (rc != QG_OK)
        qg__errf(err, errcap, "%s", qg_strerror(rc));
    return rc;
}

int qg_engine_settle(qg_engine *e, const qg_settle_req *req, int64_t now_ms,
                     qg_settle_result *out, char *err, size_t errcap)
{
    call c;
    int rc;
    c.e = e;
    if ((rc = prepare_settle(e, req, now_ms, &c, err, errcap)) != QG_OK)
        return rc;
    rc = e->store->m->settle(e->store, &c.in.settle, out);
    return finish_settle(&c, rc, err, errcap);
}

int qg_engine_remembers(qg_engine *e, const char *request_id)
{
    size_t len = request_id ? strlen(request_id) : 0;
    if (!len || len > QG_REQUEST_ID_MAX)
        return 0;
    return e->store->m->known(e->store,
                              hash_key(request_id, len, SEED_RID));
}

static int prepare_usage(qg_engine *e, const char *subject_name,
                         int64_t now_ms, call *c, qg_decision *out)
{
    qg_store_usage *in = &c->in.usage;
    int rc;

    if (!subject_name || !*subject_name ||
        !time_ok(now_ms, "now", NULL, 0))
        return QG_EINVAL;
    if ((rc = reg_get(e, subject_name, now_ms, PICK_IN_FORCE, &in->member,
                      &c->s, &c->g, &c->v, NULL, 0)) != QG_OK)
        return rc;
    in->rules = c->v->rules;
    in->has_org = c->s.org >= 0;
    in->org = in->has_org ? c->v->org_keys[c->s.org] : (qg_key){0, 0};
    in->plan = &c->v->rules->plans[c->s.plan];
    in->orgspec = in->has_org ? &c->v->rules->orgs[c->s.org] : NULL;
    in->anchor_ms = c->s.anchor_ms;
    in->now_ms = now_ms;
    memset(out, 0, sizeof *out);
    out->headroom_milli = -1;
    {
        const qg_overage *ov;
        int64_t end = 0;
        in->cap_start_ms = -1;
        if (qg__payg_mask(in->plan, in->orgspec, &ov)) {
            qg__payg_cap_period(e->utc, in->anchor_ms, now_ms,
                                &in->cap_start_ms, &end);
            out->spending_cap_micro = ov->spending_cap_micro;
            out->overage_price_micro = ov->price_per_unit_micro;
            out->cap_period_end_ms = end;
        }
    }
    return QG_OK;
}

static int finish_usage(call *c, int rc, qg_decision *out)
{
    if (rc == QG_OK)
        fill_names(c->v, &c->s, -1, out);
    return rc;
}

int qg_engine_usage(qg_engine *e, const char *subject_name, int64_t now_ms,
                    qg_decision *out)
{
    call c;
    int rc;
    c.e = e;
    if ((rc = prepare_usage(e, subject_name, now_ms, &c, out)) != QG_OK)
        return rc;
    rc = e->store->m->usage(e->store, &c.in.usage, out);
    return finish_usage(&c, rc, out);
}

/* ------------------------------------------------------------ on lanes */

/* A check or settle goes to the store on a lane: counted in flight
 * until its caller has been told (call_done). */
static void call_sent(call *c)
{
    c->slot = atomic_load(&c->e->calls_gen) & 1u;
    atomic_fetch_add(&c->e->calls_in[c->slot], 1);
}

static void call_over(call *c)
{
    atomic_fetch_sub(&c->e->calls_in[c->slot], 1);
}

/* The store answered a pending call: finish it, tell the caller. */
static void call_done(void *arg, int rc)
{
    call *c = arg;
    if (c->kind == CALL_CHECK)
        rc = finish_check(c, rc, c->out, c->err, c->errcap);
    else if (c->kind == CALL_SETTLE)
        rc = finish_settle(c, rc, c->err, c->errcap);
    else
        rc = finish_usage(c, rc, c->out);
    c->done(c->ud, rc);
    if (c->kind != CALL_USAGE)
        call_over(c);
    free(c);
}

unsigned qg_engine_calls_mark(qg_engine *e)
{
    return atomic_fetch_add(&e->calls_gen, 1);
}

long qg_engine_calls_left(const qg_engine *e, unsigned mark)
{
    return atomic_load(&((qg_engine *)e)->calls_in[mark & 1u]);
}

static call *call_new(qg_engine *e, int kind, void *out, char *err,
                      size_t errcap, qg_engine_done done, void *ud)
{
    call *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    c->e = e;
    c->kind = kind;
    c->out = out;
    c->err = err;
    c->errcap = errcap;
    c->done = done;
    c->ud = ud;
    return c;
}

int qg_engine_check_async(qg_engine *e, qg_store_lane *lane,
                          const qg_check_req *req, int64_t now_ms,
                          qg_decision *out, char *err, size_t errcap,
                          qg_engine_done done, void *ud)
{
    call *c;
    int rc;
    if (!lane || !e->store->m->check_async)
        return qg_engine_check(e, req, now_ms, out, err, errcap);
    if (!(c = call_new(e, CALL_CHECK, out, err, errcap, done, ud)))
        return QG_ENOMEM;
    if ((rc = prepare_check(e, req, now_ms, NULL, c, err, errcap)) ==
        QG_OK) {
        call_sent(c);
        rc = e->store->m->check_async(e->store, lane, &c->in.check, out,
                                      call_done, c);
        if (rc == QG_PENDING)
            return QG_PENDING;
        call_over(c);
        rc = finish_check(c, rc, out, err, errcap);
    }
    free(c);
    return rc;
}

int qg_engine_settle_async(qg_engine *e, qg_store_lane *lane,
                           const qg_settle_req *req, int64_t now_ms,
                           qg_settle_result *out, char *err, size_t errcap,
                           qg_engine_done done, void *ud)
{
    call *c;
    int rc;
    if (!lane || !e->store->m->settle_async)
        return qg_engine_settle(e, req, now_ms, out, err, errcap);
    if (!(c = call_new(e, CALL_SETTLE, out, err, errcap, done, ud)))
        return QG_ENOMEM;
    if ((rc = prepare_settle(e, req, now_ms, c, err, errcap)) == QG_OK) {
        call_sent(c);
        rc = e->store->m->settle_async(e->store, lane, &c->in.settle, out,
                                       call_done, c);
        if (rc == QG_PENDING)
            return QG_PENDING;
        call_over(c);
        rc = finish_settle(c, rc, err, errcap);
    }
    free(c);
    return rc;
}

int qg_engine_usage_async(qg_engine *e, qg_store_lane *lane,
                          const char *subject_name, int64_t now_ms,
                          qg_decision *out, qg_engine_done done, void *ud)
{
    call *c;
    int rc;
    if (!lane || !e->store->m->usage_async)
        return qg_engine_usage(e, subject_name, now_ms, out);
    if (!(c = call_new(e, CALL_USAGE, out, NULL, 0, done, ud)))
        return QG_ENOMEM;
    if ((rc = prepare_usage(e, subject_name, now_ms, c, out)) == QG_OK) {
        rc = e->store->m->usage_async(e->store, lane, &c->in.usage, out,
                                      call_done, c);
        if (rc == QG_PENDING)
            return QG_PENDING;
        rc = finish_usage(c, rc, out);
    }
    free(c);
    return rc;
}

int qg_engine_restore(qg_engine *e, const qg_restore_req *req, char *err,
                      size_t errcap)
{
    qg_store_restore in;
    subject s;
    gen *g;
    const ver *v;
    size_t idlen;
    int rc;

    if (!req->subject || !req->request_id ||
        !(idlen = strlen(req->request_id)) || idlen > QG_REQUEST_ID_MAX) {
        qg__errf(err, errcap, "%s", "restore: subject and request_id required");
        return QG_EINVAL;
    }
    if (!time_ok(req->decided_at_ms, "restore: created_ms", err, errcap))
        return QG_EINVAL;
    if ((rc = weight_ok(req->reserved_milli, "restore: reserved_milli", err,
                        errcap)) != QG_OK ||
        (rc = weight_ok(req->charged_milli, "restore: weight_milli", err,
                        errcap)) != QG_OK)
        return rc;
    if (req->headroom_milli < -1 || req->headroom_milli > QG_AMOUNT_MAX_MILLI ||
        req->overage_price_micro < 0 ||
        req->overage_price_micro > QG_MONEY_MAX_MICRO ||
        req->overage_cost_micro < 0 ||
        req->overage_cost_micro > QG_MONEY_MAX_MICRO) {
        qg__errf(err, errcap, "restore: payg amounts out of range (headroom "
                 "%lld, price %lld, cost %lld; money at most %lld micro-USD)",
                 (long long)req->headroom_milli,
                 (long long)req->overage_price_micro,
                 (long long)req->overage_cost_micro,
                 (long long)QG_MONEY_MAX_MICRO);
        return QG_ERANGE;
    }
    /* the usage of a row counts under the version in force when it was
     * decided (the first, for rows older than every version) */
    if ((rc = reg_get(e, req->subject, req->decided_at_ms, PICK_OR_FIRST,
                      &in.member, &s, &g, &v, err, errcap)) != QG_OK) {
        if (rc == QG_ENOSUBJECT)
            qg__errf(err, errcap, "restore: unknown subject \"%s\"",
                     req->subject);
        return rc;
    }
    in.model = -1;
    in.model_spec = NULL;
    if (req->model && *req->model) {
        /* A model the current rules no longer price still counts in the
         * unscoped windows, as a weight-only charge. */
        in.model = qg_rules_find_model(v->rules, req->model);
        if (in.model >= 0)
            in.model_spec = &v->rules->models[in.model];
    }
    in.rules = v->rules;
    in.rid = hash_key(req->request_id, idlen, SEED_RID);
    in.has_org = s.org >= 0;
    in.org = in.has_org ? v->org_keys[s.org] : (qg_key){0, 0};
    in.plan = &v->rules->plans[s.plan];
    in.orgspec = in.has_org ? &v->rules->orgs[s.org] : NULL;
    in.anchor_ms = s.anchor_ms;
    in.at_ms = req->decided_at_ms;
    in.reserved_milli = req->reserved_milli;
    in.charged_milli = req->charged_milli;
    in.settled = req->settled;
    in.status = req->status;
    in.headroom_milli = req->headroom_milli;
    in.price_micro = req->overage_price_micro;
    in.cost_micro = req->overage_cost_micro;
    in.cap_start_ms = 0;
    in.charge_only = req->charge_only;
    if (req->headroom_milli >= 0 || req->overage_cost_micro > 0) {
        int64_t end;
        qg__payg_cap_period(e->utc, in.anchor_ms, in.at_ms,
                            &in.cap_start_ms, &end);
    }
    rc = e->store->m->restore(e->store, &in);
    if (rc != QG_OK)
        qg__errf(err, errcap, "restore: %s", qg_strerror(rc));
    return rc;
}

/* ------------------------------------------------- the store down */

int qg_engine_fallback_enable(qg_engine *e, uint32_t max_subjects)
{
    if (e->fb)
        return QG_OK;
    return (e->fb = qg__fallback_new(max_subjects)) ? QG_OK : QG_ENOMEM;
}

int qg_engine_check_local(qg_engine *e, const qg_check_req *req,
                          int64_t now_ms, int64_t share_milli,
                          qg_decision *out, char *err, size_t errcap)
{
    call c;
    int rc;
    if (!e->fb)
        return QG_ESTATE;
    c.e = e;
    if ((rc = prepare_check(e, req, now_ms, NULL, &c, err, errcap)) !=
        QG_OK)
        return rc;
    rc = qg__fallback_check(e->fb, &c.in.check, share_milli, req->subject,
                            req->request_id, req->model, out);
    if (rc == QG_EFULL) {
        qg__errf(err, errcap, "%s", "the counters' store is down and the "
                 "local journal of what was admitted meanwhile is full");
        return rc;
    }
    if (rc == QG_OK) {
        fill_names(c.v, &c.s, c.in.check.model, out);
        out->spent_micro = 0;
    }
    return rc;
}

int qg_engine_settle_local(qg_engine *e, const qg_settle_req *req,
                           int64_t now_ms, qg_settle_result *out, char *err,
                           size_t errcap)
{
    call c;
    char model[QG_NAME_MAX];
    int64_t actual;
    int rc;
    if (!e->fb)
        return QG_ENOTFOUND;
    c.e = e;
    if ((rc = prepare_settle(e, req, now_ms, &c, err, errcap)) != QG_OK)
        return rc;
    if (qg__fallback_model(e->fb, c.in.settle.rid, model, sizeof model) !=
        QG_OK)
        return QG_ENOTFOUND;
    actual = req->weight_milli;
    if (model[0]) {
        const qg_rules *r = qg_engine_rules_at(e, now_ms);
        int m = qg_rules_find_model(r, model);
        actual = m >= 0 ? qg__weight_milli(&r->models[m], req->input_tokens,
                                           req->output_tokens)
                        : -1;
        if (actual > QG_AMOUNT_MAX_MILLI)
            actual = QG_AMOUNT_MAX_MILLI;
    }
    rc = qg__fallback_settle(e->fb, &c.in.settle, actual, out);
    if (rc == QG_OK && actual < 0 && !req->no_charge)
        out->charged_milli = out->actual_milli = out->reserved_milli;
    return finish_settle(&c, rc, err, errcap);
}

int qg_engine_local_knows(qg_engine *e, const char *request_id)
{
    if (!e->fb || !request_id)
        return 0;
    return qg__fallback_knows(e->fb, hash_key(request_id, strlen(request_id),
                                              SEED_RID));
}

int qg_engine_local_drain(qg_engine *e,
                          int (*fn)(const qg_restore_req *rr, void *ud),
                          void *ud)
{
    return e->fb ? qg__fallback_drain(e->fb, fn, ud) : QG_OK;
}

int qg_engine_local_close(qg_engine *e)
{
    return e->fb ? qg__fallback_close(e->fb) : 1;
}

void qg_engine_local_open(qg_engine *e)
{
    if (e->fb)
        qg__fallback_open(e->fb);
}

uint64_t qg_engine_local_pending(qg_engine *e)
{
    return e->fb ? qg__fallback_pending(e->fb) : 0;
}

uint64_t qg_engine_local_decisions(qg_engine *e)
{
    return e->fb ? qg__fallback_decisions(e->fb) : 0;
}
