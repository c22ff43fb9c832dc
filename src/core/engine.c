/* engine.c - the decision engine: subjects, request resolution, store.
 *
 * The engine turns a request (subject, model, tokens) into one
 * self-contained store instruction: it looks the subject up (plan, org,
 * billing anchor), computes the weight in fixed point, hashes the request
 * id, and lets the store decide atomically.  The subject registry is
 * sharded with a read-write lock per shard so that decisions on different
 * threads do not share a cache line.  Subjects are keyed by the 128-bit
 * hash of their name; the name is kept for listings. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "fixed.h"
#include "rules.h"
#include "store.h"
#include "weights.h"

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

struct qg_engine {
    qg_rules *rules;
    qg_store *store;
    qg_key *org_keys;            /* per org index */
    reg_shard reg[REG_SHARDS];
};

static qg_key hash_key(const char *s, size_t len, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(s, len, seed);
    qg_key k = {h.high64, h.low64};
    if (k.hi == 0 && k.lo == 0)
        k.lo = 1;                /* zero means "empty slot" in tables */
    return k;
}

static void seterr(char *err, size_t cap, const char *fmt, const char *arg)
{
    if (err && cap)
        snprintf(err, cap, fmt, arg);
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
    sh->slots = ns;
    sh->cap = ncap;
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

/* Copy out a subject's registration; falls back to the default plan. */
static int reg_get(qg_engine *e, const char *name, qg_key *k, subject *out)
{
    reg_shard *sh;
    subject *s;

    *k = hash_key(name, strlen(name), SEED_SUBJECT);
    sh = &e->reg[k->hi % REG_SHARDS];
    pthread_rwlock_rdlock(&sh->lock);
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
    if (s)
        return QG_OK;
    if (e->rules->default_plan < 0)
        return QG_ENOSUBJECT;
    out->plan = e->rules->default_plan;
    out->org = -1;
    out->anchor_ms = 0;
    out->hint = NULL;
    return QG_OK;
}

/* ----------------------------------------------------------- lifecycle */

qg_engine *qg_engine_new(qg_rules *rules, qg_store *store)
{
    qg_engine *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->rules = rules;
    e->store = store;
    for (int i = 0; i < REG_SHARDS; i++)
        pthread_rwlock_init(&e->reg[i].lock, NULL);
    e->org_keys = calloc((size_t)rules->norgs + 1, sizeof *e->org_keys);
    if (!e->org_keys)
        goto fail;
    for (int i = 0; i < rules->norgs; i++)
        e->org_keys[i] = hash_key(rules->orgs[i].name,
                                  strlen(rules->orgs[i].name), SEED_ORG);
    for (int i = 0; i < rules->nsubjects; i++) {
        const qg_subject_spec *s = &rules->subjects[i];
        if (reg_put(e, s->name, s->plan, s->org, s->billing_anchor_ms) != QG_OK)
            goto fail;
    }
    return e;
fail:
    e->rules = NULL;             /* the caller keeps the rules on failure */
    qg_engine_free(e);
    return NULL;
}

void qg_engine_free(qg_engine *e)
{
    if (!e)
        return;
    for (int i = 0; i < REG_SHARDS; i++) {
        for (uint32_t j = 0; j < e->reg[i].cap; j++)
            free(e->reg[i].slots[j].name);
        free(e->reg[i].slots);
        pthread_rwlock_destroy(&e->reg[i].lock);
    }
    free(e->org_keys);
    qg_rules_free(e->rules);
    free(e);
}

const qg_rules *qg_engine_rules(const qg_engine *e)
{
    return e->rules;
}

int qg_engine_set_subject(qg_engine *e, const char *subject_name,
                          const char *plan, const char *org,
                          int64_t billing_anchor_ms, char *err, size_t errcap)
{
    int p, o = -1;

    if (!subject_name || !*subject_name || strlen(subject_name) > 255) {
        seterr(err, errcap, "%s", "subject must be 1 to 255 bytes");
        return QG_EINVAL;
    }
    if (!plan || (p = qg_rules_find_plan(e->rules, plan)) < 0) {
        seterr(err, errcap, "unknown plan \"%s\"", plan ? plan : "");
        return QG_EINVAL;
    }
    if (org && *org && (o = qg_rules_find_org(e->rules, org)) < 0) {
        seterr(err, errcap, "unknown org \"%s\"", org);
        return QG_EINVAL;
    }
    return reg_put(e, subject_name, p, o, billing_anchor_ms);
}

/* ------------------------------------------------------------ decisions */

static void fill_names(const qg_engine *e, const subject *s, int model,
                       qg_decision *out)
{
    const qg_rules *r = e->rules;
    out->plan = r->plans[s->plan].name;
    out->org = s->org >= 0 ? r->orgs[s->org].name : NULL;
    out->model = model >= 0 ? r->models[model].name : NULL;
    out->rules_version = r->version;
    out->weights_version = r->weights_version;
}

int qg_engine_check(qg_engine *e, const qg_check_req *req, int64_t now_ms,
                    qg_decision *out, char *err, size_t errcap)
{
    const qg_rules *r = e->rules;
    qg_store_check in;
    subject s;
    size_t idlen;
    int rc;

    if (!req->subject || !*req->subject) {
        seterr(err, errcap, "%s", "subject is required");
        return QG_EINVAL;
    }
    if (!req->request_id || !(idlen = strlen(req->request_id)) ||
        idlen > QG_REQUEST_ID_MAX) {
        seterr(err, errcap, "%s", "request_id is required (1 to 255 bytes)");
        return QG_EINVAL;
    }
    if ((rc = reg_get(e, req->subject, &in.member, &s)) != QG_OK) {
        seterr(err, errcap, "unknown subject \"%s\"", req->subject);
        return rc;
    }
    in.model = -1;
    if (req->model) {
        int64_t out_tokens = req->max_output_tokens < 0
                                 ? QG_DEFAULT_OUTPUT_ESTIMATE
                                 : req->max_output_tokens;
        if ((in.model = qg_rules_find_model(r, req->model)) < 0) {
            seterr(err, errcap, "unknown model \"%s\"", req->model);
            return QG_EMODEL;
        }
        if (req->input_tokens < 0) {
            seterr(err, errcap, "%s", "input_tokens must be >= 0");
            return QG_EINVAL;
        }
        in.weight_milli = qg_weight_milli(&r->models[in.model],
                                          req->input_tokens, out_tokens);
        if (in.weight_milli < 0) {
            seterr(err, errcap, "%s", "token counts too large");
            return QG_ERANGE;
        }
    } else {
        if (req->weight_milli < 0) {
            seterr(err, errcap, "%s", "weight must be >= 0");
            return QG_EINVAL;
        }
        in.weight_milli = req->weight_milli;
    }
    in.rid = hash_key(req->request_id, idlen, SEED_RID);
    in.has_org = s.org >= 0;
    in.org = in.has_org ? e->org_keys[s.org] : (qg_key){0, 0};
    in.plan = &r->plans[s.plan];
    in.orgspec = in.has_org ? &r->orgs[s.org] : NULL;
    in.anchor_ms = s.anchor_ms;
    in.now_ms = now_ms;
    {
        void *before = atomic_load_explicit(&s.hint, memory_order_relaxed);
        void *hint = before;
        in.hint = &hint;
        rc = e->store->m->check(e->store, &in, out);
        if (hint != before)
            reg_set_hint(e, in.member, before, hint);
    }
    if (rc == QG_EINVAL)
        seterr(err, errcap, "request_id \"%s\" was already used by another "
               "subject", req->request_id);
    else if (rc == QG_EFULL)
        seterr(err, errcap, "%s", "too many unsettled reservations; settle "
               "requests or raise the reservation limit");
    else if (rc != QG_OK)
        seterr(err, errcap, "%s", qg_strerror(rc));
    if (rc == QG_OK)
        fill_names(e, &s, in.model, out);
    return rc;
}

int qg_engine_settle(qg_engine *e, const qg_settle_req *req, int64_t now_ms,
                     qg_settle_result *out, char *err, size_t errcap)
{
    qg_store_settle in;
    size_t idlen;
    int rc;

    if (!req->request_id || !(idlen = strlen(req->request_id)) ||
        idlen > QG_REQUEST_ID_MAX) {
        seterr(err, errcap, "%s", "request_id is required (1 to 255 bytes)");
        return QG_EINVAL;
    }
    if (req->status < QG_SETTLE_COMPLETED || req->status > QG_SETTLE_FAILED) {
        seterr(err, errcap, "%s", "status must be completed, cancelled or "
               "failed");
        return QG_EINVAL;
    }
    if (req->input_tokens < 0 || req->output_tokens < 0) {
        seterr(err, errcap, "%s", "token counts must be >= 0");
        return QG_EINVAL;
    }
    in.rid = hash_key(req->request_id, idlen, SEED_RID);
    in.now_ms = now_ms;
    in.status = req->status;
    in.input_tokens = req->input_tokens;
    in.output_tokens = req->output_tokens;
    in.weight_milli = req->weight_milli;
    in.rules = e->rules;
    rc = e->store->m->settle(e->store, &in, out);
    if (rc == QG_ENOTFOUND)
        seterr(err, errcap, "no reservation for request_id \"%s\" (never "
               "admitted, or forgotten)", req->request_id);
    else if (rc != QG_OK)
        seterr(err, errcap, "%s", qg_strerror(rc));
    return rc;
}

int qg_engine_usage(qg_engine *e, const char *subject_name, int64_t now_ms,
                    qg_decision *out)
{
    qg_store_usage in;
    subject s;
    int rc;

    if (!subject_name || !*subject_name)
        return QG_EINVAL;
    if ((rc = reg_get(e, subject_name, &in.member, &s)) != QG_OK)
        return rc;
    in.has_org = s.org >= 0;
    in.org = in.has_org ? e->org_keys[s.org] : (qg_key){0, 0};
    in.plan = &e->rules->plans[s.plan];
    in.orgspec = in.has_org ? &e->rules->orgs[s.org] : NULL;
    in.anchor_ms = s.anchor_ms;
    in.now_ms = now_ms;
    memset(out, 0, sizeof *out);
    rc = e->store->m->usage(e->store, &in, out);
    if (rc == QG_OK)
        fill_names(e, &s, -1, out);
    return rc;
}
