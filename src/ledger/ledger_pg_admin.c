/* ledger_pg_admin.c - subjects and API keys in the PostgreSQL ledger.
 *
 * Rare, small writes (the admin API, `quotagate keys`), each one
 * autocommitted statement, prepared once per connection, on the subjects'
 * or the keys' own connection; synchronous_commit is at least "on" there
 * (ledger_pg.c), so a write is durable when the call returns, and every
 * instance on the database sees it at its next read.  Keys are stored as
 * the SHA-256 of the key only (keys.h).  Writes here are idempotent
 * (an upsert, a revocation that keeps the first time) except a key's
 * insert, which is therefore not retried after a lost connection. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

typedef struct stmt_def {
    const char *name;
    const char *sql;
    int n;
    Oid types[6];
} stmt_def;

static int prepare_all(PGconn *c, const stmt_def *d, size_t n, char *why,
                       size_t cap)
{
    for (size_t i = 0; i < n; i++) {
        PGresult *r = PQprepare(c, d[i].name, d[i].sql, d[i].n, d[i].types);
        int rc = PQresultStatus(r) == PGRES_COMMAND_OK
                     ? QG_OK
                     : qg__pg_fail(c, r, why, cap);
        PQclear(r);
        if (rc != QG_OK)
            return rc;
    }
    return QG_OK;
}

/* ------------------------------------------------------------ subjects */

static const stmt_def subject_stmts[] = {
    {"qg_sput",
     "INSERT INTO subjects (subject, plan, org, billing_anchor_ms,"
     " updated_ms) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (subject) DO"
     " UPDATE SET plan = EXCLUDED.plan, org = EXCLUDED.org,"
     " billing_anchor_ms = EXCLUDED.billing_anchor_ms,"
     " updated_ms = EXCLUDED.updated_ms",
     5, {QG_PG_TEXT, QG_PG_TEXT, QG_PG_TEXT, QG_PG_INT8, QG_PG_INT8}},
    {"qg_sget",
     "SELECT plan, org, billing_anchor_ms FROM subjects WHERE subject = $1",
     1, {QG_PG_TEXT}},
    {"qg_sscan",
     "SELECT subject, plan, org, billing_anchor_ms FROM subjects"
     " WHERE updated_ms >= $1 ORDER BY subject",
     1, {QG_PG_INT8}},
};

int qg__pg_prepare_subjects(PGconn *c, char *why, size_t cap)
{
    return prepare_all(c, subject_stmts,
                       sizeof subject_stmts / sizeof subject_stmts[0], why,
                       cap);
}

static int subj_put(void *b, const char *subject, const char *plan,
                    const char *org, int64_t anchor_ms, int64_t now_ms)
{
    qg__pg *g = b;
    unsigned char anchor[8], now[8];
    const char *vals[5] = {subject, plan, org ? org : "",
                           (const char *)anchor, (const char *)now};
    int lens[5] = {(int)strlen(subject), (int)strlen(plan),
                   (int)strlen(vals[2]), 8, 8};
    char why[512];
    PGresult *r;
    int rc;
    qg__pg_put64(anchor, anchor_ms);
    qg__pg_put64(now, now_ms);
    pthread_mutex_lock(&g->subj.mu);
    rc = qg__pg_exec(g, &g->subj, "qg_sput", 5, vals, lens, 1, &r, why,
                     sizeof why);
    PQclear(r);
    pthread_mutex_unlock(&g->subj.mu);
    if (rc != QG_OK)
        qg__pg_read_failed(g, why);
    return rc;
}

static int subj_get(void *b, const char *subject, char *plan, size_t plancap,
                    char *org, size_t orgcap, int64_t *anchor_ms)
{
    qg__pg *g = b;
    const char *vals[1] = {subject};
    int lens[1] = {(int)strlen(subject)}, rc;
    char why[512];
    PGresult *r;
    pthread_mutex_lock(&g->subj.mu);
    rc = qg__pg_exec(g, &g->subj, "qg_sget", 1, vals, lens, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        if (PQntuples(r) > 0) {
            qg__pg_text(r, 0, 0, plan, plancap);
            qg__pg_text(r, 0, 1, org, orgcap);
            *anchor_ms = qg__pg_int(r, 0, 2);
        } else {
            rc = QG_ENOTFOUND;
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&g->subj.mu);
    if (rc != QG_OK && rc != QG_ENOTFOUND)
        qg__pg_read_failed(g, why);
    return rc;
}

/* Callbacks run with the subjects' connection held (ledger.h). */
static int subj_scan_since(void *b, int64_t since_ms,
                           int (*fn)(const char *subject, const char *plan,
                                     const char *org, int64_t anchor_ms,
                                     void *ud),
                           void *ud)
{
    qg__pg *g = b;
    unsigned char since[8];
    const char *vals[1] = {(const char *)since};
    int lens[1] = {8}, rc, out = 0;
    char why[512], subject[256], plan[64], org[64];
    PGresult *r;
    qg__pg_put64(since, since_ms);
    pthread_mutex_lock(&g->subj.mu);
    rc = qg__pg_exec(g, &g->subj, "qg_sscan", 1, vals, lens, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        for (int i = 0; i < PQntuples(r) && out == 0; i++) {
            qg__pg_text(r, i, 0, subject, sizeof subject);
            qg__pg_text(r, i, 1, plan, sizeof plan);
            qg__pg_text(r, i, 2, org, sizeof org);
            out = fn(subject, plan, org, qg__pg_int(r, i, 3), ud);
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&g->subj.mu);
    if (rc != QG_OK)
        qg__pg_read_failed(g, why);
    return rc != QG_OK ? rc : out;
}

const qg__ledger_subjects_ops qg__pg_subjects_ops = {
    subj_put,
    subj_get,
    subj_scan_since,
};

/* ---------------------------------------------------------------- keys */

#define KEY_COLS "id, subject, role, hash, created_ms, revoked_ms"

static const stmt_def key_stmts[] = {
    {"qg_kput",
     "INSERT INTO keys (" KEY_COLS ") VALUES ($1, $2, $3, $4, $5, $6)"
     " ON CONFLICT (id) DO NOTHING",
     6, {QG_PG_TEXT, QG_PG_TEXT, QG_PG_TEXT, QG_PG_BYTEA, QG_PG_INT8,
         QG_PG_INT8}},
    {"qg_kget", "SELECT " KEY_COLS " FROM keys WHERE id = $1", 1,
     {QG_PG_TEXT}},
    {"qg_klist", "SELECT " KEY_COLS " FROM keys ORDER BY created_ms, id", 0,
     {0}},
    /* keeps the first revocation time; true when the key exists */
    {"qg_krevoke",
     "WITH u AS (UPDATE keys SET revoked_ms = $2"
     " WHERE id = $1 AND revoked_ms = 0 RETURNING 1)"
     " SELECT EXISTS (SELECT 1 FROM u)"
     " OR EXISTS (SELECT 1 FROM keys WHERE id = $1)",
     2, {QG_PG_TEXT, QG_PG_INT8}},
};

int qg__pg_prepare_keys(PGconn *c, char *why, size_t cap)
{
    return prepare_all(c, key_stmts, sizeof key_stmts / sizeof key_stmts[0],
                       why, cap);
}

static void read_key(const PGresult *r, int i, qg_key_rec *k)
{
    memset(k, 0, sizeof *k);
    qg__pg_text(r, i, 0, k->id, sizeof k->id);
    qg__pg_text(r, i, 1, k->subject, sizeof k->subject);
    qg__pg_text(r, i, 2, k->role, sizeof k->role);
    if (!PQgetisnull(r, i, 3) && PQgetlength(r, i, 3) == (int)sizeof k->hash)
        memcpy(k->hash, PQgetvalue(r, i, 3), sizeof k->hash);
    else   /* a damaged hash verifies nothing: treat the key as revoked */
        k->revoked_ms = -1;
    k->created_ms = qg__pg_int(r, i, 4);
    if (k->revoked_ms == 0)
        k->revoked_ms = qg__pg_int(r, i, 5);
}

static int key_put(void *b, const qg_key_rec *k)
{
    qg__pg *g = b;
    unsigned char created[8], revoked[8];
    const char *vals[6] = {k->id, k->subject, k->role,
                           (const char *)k->hash, (const char *)created,
                           (const char *)revoked};
    int lens[6] = {(int)strnlen(k->id, sizeof k->id),
                   (int)strnlen(k->subject, sizeof k->subject),
                   (int)strnlen(k->role, sizeof k->role),
                   (int)sizeof k->hash, 8, 8};
    char why[512];
    PGresult *r;
    int rc;
    qg__pg_put64(created, k->created_ms);
    qg__pg_put64(revoked, k->revoked_ms);
    pthread_mutex_lock(&g->keys.mu);
    rc = qg__pg_exec(g, &g->keys, "qg_kput", 6, vals, lens, 0, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        if (strcmp(PQcmdTuples(r), "1") != 0)
            rc = QG_ESTATE;          /* the id exists */
        PQclear(r);
    }
    pthread_mutex_unlock(&g->keys.mu);
    if (rc != QG_OK && rc != QG_ESTATE)
        qg__pg_read_failed(g, why);
    return rc;
}

static int key_get(void *b, const char *id, qg_key_rec *out)
{
    qg__pg *g = b;
    const char *vals[1] = {id};
    int lens[1] = {(int)strlen(id)}, rc;
    char why[512];
    PGresult *r;
    pthread_mutex_lock(&g->keys.mu);
    rc = qg__pg_exec(g, &g->keys, "qg_kget", 1, vals, lens, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        if (PQntuples(r) > 0)
            read_key(r, 0, out);
        else
            rc = QG_ENOTFOUND;
        PQclear(r);
    }
    pthread_mutex_unlock(&g->keys.mu);
    if (rc != QG_OK && rc != QG_ENOTFOUND)
        qg__pg_read_failed(g, why);
    return rc;
}

static int key_list(void *b, int (*fn)(const qg_key_rec *k, void *ud),
                    void *ud)
{
    qg__pg *g = b;
    qg_key_rec k;
    char why[512];
    PGresult *r;
    int rc, out = 0;
    pthread_mutex_lock(&g->keys.mu);
    rc = qg__pg_exec(g, &g->keys, "qg_klist", 0, NULL, NULL, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        for (int i = 0; i < PQntuples(r) && out == 0; i++) {
            read_key(r, i, &k);
            out = fn(&k, ud);
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&g->keys.mu);
    if (rc != QG_OK)
        qg__pg_read_failed(g, why);
    return rc != QG_OK ? rc : out;
}

static int key_revoke(void *b, const char *id, int64_t now_ms)
{
    qg__pg *g = b;
    unsigned char now[8];
    const char *vals[2] = {id, (const char *)now};
    int lens[2] = {(int)strlen(id), 8}, rc;
    char why[512];
    PGresult *r;
    qg__pg_put64(now, now_ms > 0 ? now_ms : 1);
    pthread_mutex_lock(&g->keys.mu);
    rc = qg__pg_exec(g, &g->keys, "qg_krevoke", 2, vals, lens, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        /* a binary boolean: one byte, 1 for true */
        if (PQntuples(r) != 1 || PQgetlength(r, 0, 0) != 1 ||
            PQgetvalue(r, 0, 0)[0] != 1)
            rc = QG_ENOTFOUND;
        PQclear(r);
    }
    pthread_mutex_unlock(&g->keys.mu);
    if (rc != QG_OK && rc != QG_ENOTFOUND)
        qg__pg_read_failed(g, why);
    return rc;
}

const qg__ledger_keys_ops qg__pg_keys_ops = {
    key_put,
    key_get,
    key_list,
    key_revoke,
};
