/* ledger_sqlite_outbox.c - the webhook outbox in the SQLite ledger
 * (ledger_backend.h, qg__ledger_outbox_ops; the tables are schema 5's).
 *
 * Each handle has its own connection to the ledger's file with
 * synchronous=FULL: an event is on disk before fire returns, so a kill -9
 * after it loses nothing.  fire is one BEGIN IMMEDIATE transaction: the
 * mark's upsert, guarded so that it changes the row only when the mark
 * may fire (re-armed, or a later calendar period), says by its RETURNING
 * row whether this call fired; the event's rows follow in the same
 * transaction.  Several processes on one file are serialised by SQLite's
 * write lock (busy_timeout), and the guard, not a read before the write,
 * decides.  The statements are small and rare (a crossing, an attempt):
 * prepared per call.  A claim with nothing due only reads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

typedef struct sq_outbox {
    sqlite3 *db;
    pthread_mutex_t mu;
} sq_outbox;

static int fail(sq_outbox *o, const char *what, char *why, size_t whycap)
{
    snprintf(why, whycap, "outbox: %s: %s (SQLite error %d)", what,
             sqlite3_errmsg(o->db), sqlite3_extended_errcode(o->db));
    return QG_EIO;
}

static void *ob_open(void *b, char *err, size_t errcap)
{
    qg__sq *s = b;
    sq_outbox *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    pthread_mutex_init(&o->mu, NULL);
    if (sqlite3_open_v2(s->path, &o->db, SQLITE_OPEN_READWRITE |
                        SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(o->db, s->o.busy_timeout_ms) != SQLITE_OK ||
        sqlite3_exec(o->db, "PRAGMA synchronous=FULL", NULL, NULL, NULL) !=
            SQLITE_OK) {
        snprintf(err, errcap, "ledger %s: cannot open the outbox: %s",
                 s->path, o->db ? sqlite3_errmsg(o->db) : "out of memory");
        sqlite3_close(o->db);
        pthread_mutex_destroy(&o->mu);
        free(o);
        return NULL;
    }
    return o;
}

static void ob_close(void *ob)
{
    sq_outbox *o = ob;
    if (!o)
        return;
    sqlite3_close(o->db);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

static const char sql_mark[] =
    "INSERT INTO notify_marks (subject, \"window\", threshold_milli,"
    " period_key, armed, episode, fired_ms) VALUES (?1, ?2, ?3, ?4, 0, 1, ?5)"
    " ON CONFLICT (subject, \"window\", threshold_milli) DO UPDATE SET"
    " period_key = excluded.period_key, armed = 0,"
    " episode = notify_marks.episode + 1, fired_ms = excluded.fired_ms"
    " WHERE notify_marks.armed = 1"
    " OR excluded.period_key > notify_marks.period_key"
    " RETURNING episode";

static const char sql_event[] =
    "INSERT INTO webhook_outbox (id, url, type, subject, \"window\","
    " threshold_milli, period_key, body, created_ms, next_ms)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)"
    " ON CONFLICT (id, url) DO NOTHING";

static int ob_fire(void *ob, qg_outbox_event *ev, const char *const *urls,
                   int nurls, int *fired,
                   void (*id_of)(const qg_outbox_event *ev, int64_t episode,
                                 char *id),
                   char *why, size_t whycap)
{
    sq_outbox *o = ob;
    sqlite3_stmt *st = NULL;
    int rc = QG_OK, step;
    int64_t episode = 0;

    pthread_mutex_lock(&o->mu);
    if (sqlite3_exec(o->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) !=
        SQLITE_OK) {
        rc = fail(o, "cannot begin", why, whycap);
        goto out;
    }
    if (sqlite3_prepare_v2(o->db, sql_mark, -1, &st, NULL) != SQLITE_OK) {
        rc = fail(o, "cannot prepare the mark", why, whycap);
        goto fail;
    }
    sqlite3_bind_text(st, 1, ev->subject, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, ev->window, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, ev->threshold_milli);
    sqlite3_bind_int64(st, 4, ev->period_key);
    sqlite3_bind_int64(st, 5, ev->created_ms);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        episode = sqlite3_column_int64(st, 0);
        step = sqlite3_step(st);
    }
    if (step != SQLITE_DONE) {
        rc = fail(o, "cannot take the mark", why, whycap);
        goto fail;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (episode == 0) {                 /* the mark held it back */
        sqlite3_exec(o->db, "ROLLBACK", NULL, NULL, NULL);
        goto out;
    }
    id_of(ev, episode, ev->id);
    if (sqlite3_prepare_v2(o->db, sql_event, -1, &st, NULL) != SQLITE_OK) {
        rc = fail(o, "cannot prepare the event", why, whycap);
        goto fail;
    }
    for (int i = 0; i < nurls; i++) {
        sqlite3_bind_text(st, 1, ev->id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, urls[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, ev->type, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, ev->subject, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, ev->window, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 6, ev->threshold_milli);
        sqlite3_bind_int64(st, 7, ev->period_key);
        sqlite3_bind_text(st, 8, ev->body, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 9, ev->created_ms);
        if (sqlite3_step(st) != SQLITE_DONE) {
            rc = fail(o, "cannot insert the event", why, whycap);
            goto fail;
        }
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_exec(o->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        rc = fail(o, "cannot commit", why, whycap);
        goto fail;
    }
    *fired = 1;
    goto out;
fail:
    sqlite3_finalize(st);
    if (!sqlite3_get_autocommit(o->db))
        sqlite3_exec(o->db, "ROLLBACK", NULL, NULL, NULL);
out:
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* One statement, autocommitted, its parameters bound in order:
 * texts t[0..nt) as ?1..?nt, then integers v[0..nv). */
static int run(sq_outbox *o, const char *sql, const char *const *t, int nt,
               const int64_t *v, int nv, const char *what, char *why,
               size_t whycap)
{
    sqlite3_stmt *st = NULL;
    int rc = QG_OK;
    pthread_mutex_lock(&o->mu);
    if (sqlite3_prepare_v2(o->db, sql, -1, &st, NULL) != SQLITE_OK) {
        rc = fail(o, what, why, whycap);
        goto out;
    }
    for (int i = 0; i < nt; i++)
        sqlite3_bind_text(st, i + 1, t[i], -1, SQLITE_STATIC);
    for (int i = 0; i < nv; i++)
        sqlite3_bind_int64(st, nt + i + 1, v[i]);
    if (sqlite3_step(st) != SQLITE_DONE)
        rc = fail(o, what, why, whycap);
out:
    sqlite3_finalize(st);
    pthread_mutex_unlock(&o->mu);
    return rc;
}

static int ob_rearm(void *ob, const char *subject, const char *window,
                    int64_t threshold_milli, char *why, size_t whycap)
{
    const char *t[2] = {subject, window};
    return run(ob, "UPDATE notify_marks SET armed = 1 WHERE subject = ?1"
               " AND \"window\" = ?2 AND threshold_milli = ?3 AND armed = 0"
               " AND period_key = 0", t, 2, &threshold_milli, 1,
               "cannot re-arm", why, whycap);
}

static int ob_claim(void *ob, const char *owner, int64_t now_ms,
                    int64_t lease_ms, qg_outbox_event *out, int max, int *n,
                    char *why, size_t whycap)
{
    sq_outbox *o = ob;
    sqlite3_stmt *st = NULL;
    int rc = QG_OK, step;
    pthread_mutex_lock(&o->mu);
    /* A read first: a WAL reader never waits for, nor blocks, the
     * ledger's writer, where the UPDATE takes the file's write lock even
     * when nothing is due (and the writer's busy handler sleeps while it
     * is held: decisions would feel every idle poll). */
    if (sqlite3_prepare_v2(o->db, "SELECT 1 FROM webhook_outbox WHERE"
                           " state = 0 AND next_ms <= ?1 AND lease_until"
                           " <= ?1 LIMIT 1", -1, &st, NULL) != SQLITE_OK) {
        rc = fail(o, "cannot prepare the claim", why, whycap);
        goto out;
    }
    sqlite3_bind_int64(st, 1, now_ms);
    step = sqlite3_step(st);
    sqlite3_finalize(st);
    st = NULL;
    if (step == SQLITE_DONE)
        goto out;                       /* nothing due */
    if (sqlite3_prepare_v2(o->db,
            "UPDATE webhook_outbox SET lease_owner = ?1,"
            " lease_until = ?2 + ?3 WHERE rowid IN (SELECT rowid FROM"
            " webhook_outbox WHERE state = 0 AND next_ms <= ?2"
            " AND lease_until <= ?2 ORDER BY next_ms LIMIT ?4)"
            " RETURNING id, url, type, subject, \"window\", threshold_milli,"
            " period_key, body, created_ms, next_ms, attempts", -1, &st,
            NULL) != SQLITE_OK) {
        rc = fail(o, "cannot prepare the claim", why, whycap);
        goto out;
    }
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, now_ms);
    sqlite3_bind_int64(st, 3, lease_ms);
    sqlite3_bind_int(st, 4, max);
    while ((step = sqlite3_step(st)) == SQLITE_ROW && *n < max) {
        qg_outbox_event *e = &out[(*n)++];
        memset(e, 0, sizeof *e);
        COL_STR(st, 0, e->id);
        COL_STR(st, 1, e->url);
        COL_STR(st, 2, e->type);
        COL_STR(st, 3, e->subject);
        COL_STR(st, 4, e->window);
        e->threshold_milli = sqlite3_column_int64(st, 5);
        e->period_key = sqlite3_column_int64(st, 6);
        COL_STR(st, 7, e->body);
        e->created_ms = sqlite3_column_int64(st, 8);
        e->next_ms = sqlite3_column_int64(st, 9);
        e->attempts = sqlite3_column_int(st, 10);
    }
    if (step != SQLITE_DONE && step != SQLITE_ROW)
        rc = fail(o, "cannot claim", why, whycap);
out:
    sqlite3_finalize(st);
    pthread_mutex_unlock(&o->mu);
    return rc;
}

static int ob_release(void *ob, const char *owner, char *why, size_t whycap)
{
    return run(ob, "UPDATE webhook_outbox SET lease_until = 0,"
               " lease_owner = '' WHERE lease_owner = ?1 AND state = 0",
               &owner, 1, NULL, 0, "cannot release the leases", why, whycap);
}

static int ob_finish(void *ob, const char *id, const char *url, int state,
                     int64_t now_ms, const char *error, char *why,
                     size_t whycap)
{
    const char *t[3] = {id, url, error ? error : ""};
    int64_t v[2] = {state, now_ms};
    return run(ob, "UPDATE webhook_outbox SET last_error = ?3, state = ?4,"
               " done_ms = ?5, lease_until = 0 WHERE id = ?1 AND url = ?2"
               " AND state = 0", t, 3, v, 2, "cannot record the outcome",
               why, whycap);
}

static int ob_retry(void *ob, const char *id, const char *url,
                    int64_t next_ms, int attempts, const char *error,
                    char *why, size_t whycap)
{
    const char *t[3] = {id, url, error};
    int64_t v[2] = {next_ms, attempts};
    return run(ob, "UPDATE webhook_outbox SET last_error = ?3,"
               " next_ms = ?4, attempts = ?5, lease_until = 0,"
               " lease_owner = '' WHERE id = ?1 AND url = ?2 AND state = 0",
               t, 3, v, 2, "cannot schedule the retry", why, whycap);
}

static int ob_backlog(void *ob, int64_t *pending, int64_t *oldest_ms,
                      char *why, size_t whycap)
{
    sq_outbox *o = ob;
    sqlite3_stmt *st = NULL;
    int rc = QG_OK;
    pthread_mutex_lock(&o->mu);
    if (sqlite3_prepare_v2(o->db, "SELECT count(*), coalesce(min(created_ms),"
                           " 0) FROM webhook_outbox WHERE state = 0", -1,
                           &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = fail(o, "cannot count the backlog", why, whycap);
    } else {
        *pending = sqlite3_column_int64(st, 0);
        *oldest_ms = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&o->mu);
    return rc;
}

const qg__ledger_outbox_ops qg__sq_outbox_ops = {
    ob_open, ob_close, ob_fire, ob_rearm, ob_claim, ob_release, ob_finish,
    ob_retry, ob_backlog,
};
