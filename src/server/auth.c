/* auth.c - API keys to roles (auth.h).  Generated keys are read from
 * the ledger and cached per key id for CACHE_TTL_MS; the cache's lock is
 * held for a slot's copy only, never across a ledger read. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>
#include "auth.h"
#include "keys.h"
#include "quotagate.h"

#define CACHE_SLOTS 1024
/* A key created or revoked through any instance sharing the ledger is
 * seen by every one within a second (PRODUCT.md 5.1 point 6). */
#define CACHE_TTL_MS 500

/* Environment keys up to this length are compared byte for byte, padded
 * with zeros to it, in constant time (length and content hidden alike);
 * longer ones by their SHA-256 hash.  The hash costs ~3k instructions, a
 * tenth of a /v1/check; CRYPTO_memcmp ~7 per byte, so the pad is no
 * longer than common keys need: `openssl rand -hex 32` is 64 characters,
 * a generated key (QG_KEY_LEN) 60 (docs/benchmarks.md, "HTTP", the
 * eighth session's steps). */
#define ENV_PAD 64

typedef struct cache_ent {
    int used;
    int64_t loaded_ms;
    qg_key_rec rec;               /* rec.id[0] == 0: known absent */
    char id[32];
} cache_ent;

typedef struct env_key {
    int have;                     /* set from the environment */
    size_t len;
    unsigned char pad[ENV_PAD];   /* len <= ENV_PAD: the key, zero padded */
    unsigned char hash[QG_KEY_HASH_LEN];   /* len > ENV_PAD */
} env_key;

struct qg_auth {
    qg_ledger *ledger;
    env_key env_admin, env_service;
    pthread_mutex_t mu;
    cache_ent cache[CACHE_SLOTS];
};

static void env_set(env_key *e, const char *key)
{
    if (!key || !*key)
        return;
    e->have = 1;
    e->len = strlen(key);
    if (e->len <= ENV_PAD)
        memcpy(e->pad, key, e->len);
    else
        qg__key_hash(key, e->len, e->hash);
}

qg_auth *qg__auth_new(qg_ledger *l, const char *env_admin,
                     const char *env_service)
{
    qg_auth *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->ledger = l;
    pthread_mutex_init(&a->mu, NULL);
    env_set(&a->env_admin, env_admin);
    env_set(&a->env_service, env_service);
    return a;
}

void qg__auth_free(qg_auth *a)
{
    if (!a)
        return;
    pthread_mutex_destroy(&a->mu);
    OPENSSL_cleanse(a, sizeof *a);
    free(a);
}

/* Whether a presented key is environment key e: pad is the presented key
 * zero padded to ENV_PAD when it is that short (else NULL), h its hash
 * when it is longer (computed once by the caller). */
static int env_match(const env_key *e, const unsigned char *pad, size_t len,
                     const unsigned char *h)
{
    if (!e->have)
        return 0;
    if (pad) {
        /* the length folded in without a branch on the key's bytes */
        int same = CRYPTO_memcmp(pad, e->pad, ENV_PAD) == 0;
        return same & (len == e->len);
    }
    return e->len > ENV_PAD && qg__key_hash_equal(h, e->hash);
}

typedef struct find_role {
    const char *role;
    int found;
} find_role;

static int has_role(const qg_key_rec *k, void *ud)
{
    find_role *f = ud;
    if (k->revoked_ms == 0 && strcmp(k->role, f->role) == 0)
        f->found = 1;
    return 0;
}

int qg__auth_bootstrap(qg_auth *a, int64_t now_ms, FILE *out)
{
    static const char *const roles[] = {"admin", "service"};
    for (int i = 0; i < 2; i++) {
        find_role f = {roles[i], 0};
        char key[QG_KEY_LEN + 1];
        qg_key_rec rec;
        int rc;
        if ((i == 0 && a->env_admin.have) || (i == 1 && a->env_service.have))
            continue;
        if ((rc = qg__ledger_list_keys(a->ledger, has_role, &f)) != QG_OK)
            return rc;
        if (f.found)
            continue;
        if ((rc = qg__key_generate(roles[i], "", now_ms, key, sizeof key,
                                  &rec)) != QG_OK ||
            (rc = qg__ledger_put_key(a->ledger, &rec)) != QG_OK)
            return rc;
        fprintf(out, "quotagate: generated %s key (shown once, stored only "
                "as a hash): %s\n", roles[i], key);
        memset(key, 0, sizeof key);
    }
    fflush(out);
    return QG_OK;
}

static int role_of(const char *role)
{
    if (strcmp(role, "admin") == 0)
        return QG_ROLE_ADMIN;
    if (strcmp(role, "service") == 0)
        return QG_ROLE_SERVICE;
    if (strcmp(role, "subject") == 0)
        return QG_ROLE_SUBJECT;
    return QG_ROLE_NONE;
}

int qg__auth_identify(qg_auth *a, const char *key, size_t len, int64_t now_ms,
                     char *subject, size_t cap)
{
    unsigned char h[QG_KEY_HASH_LEN], pad[ENV_PAD];
    char id[32], copy[QG_KEY_LEN + 1];
    qg_key_rec rec;
    cache_ent *c;
    unsigned slot = 0;
    int role = QG_ROLE_NONE, fresh;

    if (!key || len == 0 || len > 4096)
        return QG_ROLE_NONE;
    /* Environment keys first, in constant time (ENV_PAD above): the key
     * zero padded when it is that short, else its hash. */
    const unsigned char *kp = NULL, *kh = NULL;
    if (len <= ENV_PAD) {
        memset(pad, 0, sizeof pad);
        memcpy(pad, key, len);
        kp = pad;
    } else {
        qg__key_hash(key, len, h);
        kh = h;
    }
    role = env_match(&a->env_service, kp, len, kh)  ? QG_ROLE_SERVICE
           : env_match(&a->env_admin, kp, len, kh) ? QG_ROLE_ADMIN
                                                     : QG_ROLE_NONE;
    OPENSSL_cleanse(pad, sizeof pad);
    if (role != QG_ROLE_NONE || len != QG_KEY_LEN)
        return role;
    memcpy(copy, key, len);
    copy[len] = '\0';
    if (qg__key_parse_id(copy, id, sizeof id) != QG_OK) {
        OPENSSL_cleanse(copy, sizeof copy);
        return QG_ROLE_NONE;
    }
    for (const char *p = id; *p; p++)
        slot = slot * 31u + (unsigned char)*p;
    slot %= CACHE_SLOTS;

    pthread_mutex_lock(&a->mu);
    c = &a->cache[slot];
    fresh = c->used && strcmp(c->id, id) == 0 &&
            now_ms - c->loaded_ms < CACHE_TTL_MS && now_ms >= c->loaded_ms;
    rec = c->rec;
    pthread_mutex_unlock(&a->mu);
    if (!fresh) {
        /* read without the cache's lock: a ledger that is slow to answer
         * (a shared database far away, or gone) holds up this request
         * only, not every key's on every worker */
        qg_key_rec got;
        int rc = qg__ledger_get_key(a->ledger, id, &got), same;
        pthread_mutex_lock(&a->mu);
        c = &a->cache[slot];
        same = c->used && strcmp(c->id, id) == 0;
        if (rc == QG_OK || rc == QG_ENOTFOUND || !same) {
            c->used = 1;
            c->loaded_ms = now_ms;
            snprintf(c->id, sizeof c->id, "%s", id);
            if (rc == QG_OK)
                c->rec = got;
            else
                memset(&c->rec, 0, sizeof c->rec);
        }
        /* else: the ledger cannot be read now; the key's last known state
         * answers (a database away for a moment locks nobody out) and the
         * next request asks again */
        rec = c->rec;
        pthread_mutex_unlock(&a->mu);
    }

    if (rec.id[0] && qg__key_verify(copy, &rec) == 1) {
        role = role_of(rec.role);
        if (role == QG_ROLE_SUBJECT && subject)
            snprintf(subject, cap, "%s", rec.subject);
    }
    OPENSSL_cleanse(copy, sizeof copy);
    return role;
}
