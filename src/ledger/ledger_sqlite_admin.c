/* ledger_sqlite_admin.c - subjects and API keys in the SQLite ledger.
 *
 * Rare, small writes (the admin API, `quotagate keys`): each is one
 * statement on the admin connection, autocommitted with synchronous=FULL,
 * so it is durable when the call returns.  Statements are prepared per
 * call; none of this is on a hot path.  Keys are stored as the SHA-256 of
 * the key only (keys.h). */
#include <pthread.h>
#include <string.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

/* Run one statement on the admin connection (admin_mu held by caller). */
static int admin_prepare(qg__sq *s, const char *sql, sqlite3_stmt **st)
{
    return sqlite3_prepare_v2(s->adb, sql, -1, st, NULL) == SQLITE_OK
               ? QG_OK
               : QG_EIO;
}

static int sq_put_subject(void *b, const char *subject, const char *plan,
                       const char *org, int64_t anchor_ms, int64_t now_ms)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc;
    pthread_mutex_lock(&s->admin_mu);
    rc = admin_prepare(s,
        "INSERT INTO subjects (subject, plan, org, billing_anchor_ms,"
        " updated_ms) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(subject) DO"
        " UPDATE SET plan = excluded.plan, org = excluded.org,"
        " billing_anchor_ms = excluded.billing_anchor_ms,"
        " updated_ms = excluded.updated_ms", &st);
    if (rc == QG_OK) {
        sqlite3_bind_text(st, 1, subject, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, plan, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, org, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, anchor_ms);
        sqlite3_bind_int64(st, 5, now_ms);
        rc = sqlite3_step(st) == SQLITE_DONE
                 ? QG_OK
                 : qg__sq_map_rc(sqlite3_errcode(s->adb));
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->admin_mu);
    return rc;
}

static int sq_get_subject(void *b, const char *subject, char *plan,
                          size_t plancap, char *org, size_t orgcap,
                          int64_t *anchor_ms)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc;
    pthread_mutex_lock(&s->admin_mu);
    rc = admin_prepare(s, "SELECT plan, org, billing_anchor_ms FROM subjects"
                          " WHERE subject = ?1", &st);
    if (rc == QG_OK) {
        sqlite3_bind_text(st, 1, subject, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            qg__sq_col_text(st, 0, plan, plancap);
            qg__sq_col_text(st, 1, org, orgcap);
            *anchor_ms = sqlite3_column_int64(st, 2);
            rc = QG_OK;
        } else if (rc == SQLITE_DONE) {
            rc = QG_ENOTFOUND;
        } else {
            qg__sq_read_failed(s, s->adb);
            rc = QG_EIO;
        }
    } else {
        qg__sq_read_failed(s, s->adb);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->admin_mu);
    return rc;
}

static int sq_scan_subjects(void *b, int64_t since_ms,
                            int (*fn)(const char *subject, const char *plan,
                                      const char *org, int64_t anchor_ms,
                                      void *ud),
                            void *ud)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc, out = QG_OK;
    pthread_mutex_lock(&s->admin_mu);
    out = admin_prepare(s,
        "SELECT subject, plan, org, billing_anchor_ms FROM subjects"
        " WHERE updated_ms >= ?1 ORDER BY subject", &st);
    if (out == QG_OK) {
        sqlite3_bind_int64(st, 1, since_ms);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const char *org = (const char *)sqlite3_column_text(st, 2);
            if ((out = fn((const char *)sqlite3_column_text(st, 0),
                          (const char *)sqlite3_column_text(st, 1),
                          org ? org : "", sqlite3_column_int64(st, 3),
                          ud)) != 0)
                break;
        }
        if (out == 0 && rc != SQLITE_DONE) {
            qg__sq_read_failed(s, s->adb);
            out = QG_EIO;
        }
    } else {
        qg__sq_read_failed(s, s->adb);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->admin_mu);
    return out;
}

static int sq_put_key(void *b, const qg_key_rec *k)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc;
    pthread_mutex_lock(&s->admin_mu);
    rc = admin_prepare(s,
        "INSERT INTO keys (id, subject, role, hash, created_ms, revoked_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6)", &st);
    if (rc == QG_OK) {
        BIND_STR(st, 1, k->id);
        BIND_STR(st, 2, k->subject);
        BIND_STR(st, 3, k->role);
        sqlite3_bind_blob(st, 4, k->hash, sizeof k->hash, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, k->created_ms);
        sqlite3_bind_int64(st, 6, k->revoked_ms);
        rc = sqlite3_step(st) == SQLITE_DONE
                 ? QG_OK
                 : qg__sq_map_rc(sqlite3_errcode(s->adb));
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->admin_mu);
    return rc;
}

static void read_key(sqlite3_stmt *st, qg_key_rec *k)
{
    const void *h;
    memset(k, 0, sizeof *k);
    COL_STR(st, 0, k->id);
    COL_STR(st, 1, k->subject);
    COL_STR(st, 2, k->role);
    h = sqlite3_column_blob(st, 3);
    if (h && sqlite3_column_bytes(st, 3) == (int)sizeof k->hash)
        memcpy(k->hash, h, sizeof k->hash);
    else   /* a damaged hash verifies nothing: treat the key as revoked */
        k->revoked_ms = -1;
    k->created_ms = sqlite3_column_int64(st, 4);
    if (k->revoked_ms == 0)
        k->revoked_ms = sqlite3_column_int64(st, 5);
}

#define KEY_COLS "id, subject, role, hash, created_ms, revoked_ms"

static int sq_get_key(void *b, const char *id, qg_key_rec *out)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc;
    pthread_mutex_lock(&s->admin_mu);
    rc = admin_prepare(s, "SELECT " KEY_COLS " FROM keys WHERE id = ?1",
                       &st);
    if (rc == QG_OK) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            read_key(st, out);
            rc = QG_OK;
        } else {
            rc = rc == SQLITE_DONE ? QG_ENOTFOUND : QG_EIO;
        }
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->admin_mu);
    return rc;
}

static int sq_list_keys(void *b, int (*fn)(const qg_key_rec *k, void *ud),
                        void *ud)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    qg_key_rec k;
    int rc, out;
    pthread_mutex_lock(&s->admin_mu);
    out = admin_prepare(s, "SELECT " KEY_COLS " FROM keys"
                           " ORDER BY created_ms, id", &st);
    if (out == QG_OK) {
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            read_key(st, &k);
            if ((out = fn(&k, ud)) != 0)
                break;
        }
        if (out == 0 && rc != SQLITE_DONE)
            out = QG_EIO;
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->admin_mu);
    return out;
}

static int sq_revoke_key(void *b, const char *id, int64_t now_ms)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc;
    pthread_mutex_lock(&s->admin_mu);
    /* keeps the first revocation time when revoked twice */
    rc = admin_prepare(s, "UPDATE keys SET revoked_ms = ?2"
                          " WHERE id = ?1 AND revoked_ms = 0", &st);
    if (rc == QG_OK) {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, now_ms > 0 ? now_ms : 1);
        rc = sqlite3_step(st) == SQLITE_DONE ? QG_OK : QG_EIO;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc == QG_OK && sqlite3_changes(s->adb) == 0) {
        rc = admin_prepare(s, "SELECT 1 FROM keys WHERE id = ?1", &st);
        if (rc == QG_OK) {
            sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
            rc = sqlite3_step(st);
            rc = rc == SQLITE_ROW    ? QG_OK
                 : rc == SQLITE_DONE ? QG_ENOTFOUND
                                     : QG_EIO;
        }
        sqlite3_finalize(st);
    }
    pthread_mutex_unlock(&s->admin_mu);
    return rc;
}

const qg__ledger_subjects_ops qg__sq_subjects = {
    sq_put_subject,
    sq_get_subject,
    sq_scan_subjects,
};

const qg__ledger_keys_ops qg__sq_keys = {
    sq_put_key,
    sq_get_key,
    sq_list_keys,
    sq_revoke_key,
};
