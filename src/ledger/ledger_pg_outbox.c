/* ledger_pg_outbox.c - the webhook outbox in the PostgreSQL ledger
 * (ledger_backend.h, qg__ledger_outbox_ops; the tables are schema 2's of
 * ledger_pg_schema.c), for several instances on one database.
 *
 * Once only, whoever is first: fire is one transaction whose mark upsert
 * (INSERT ... ON CONFLICT DO UPDATE ... WHERE the mark may fire
 * RETURNING episode) is decided by the primary key of notify_marks.  Two
 * instances crossing the same threshold at once both reach the row; the
 * second waits for the first's row lock, then finds the mark taken (the
 * WHERE is evaluated again on the committed row) and returns nothing, so
 * it inserts no event.  One instance per attempt: claim takes due rows
 * with FOR UPDATE SKIP LOCKED and writes a lease (owner, until) in the
 * same statement; rows another instance holds, locked or leased, are
 * skipped.  A lease outlives the sender's timeout, and an instance that
 * died holding rows loses them to the others when the lease ends (or to
 * itself at once: release at start).
 *
 * Each handle has its own connection (made on first use and again after
 * a loss, synchronous_commit at least on), text parameters and results:
 * nothing here is on a hot path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

typedef struct pg_outbox {
    qg__pg *g;
    qg__pg_conn k;
} pg_outbox;

static void *ob_open(void *b, char *err, size_t errcap)
{
    pg_outbox *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    o->g = b;
    o->k.name = "outbox";
    o->k.sync_on = 1;
    pthread_mutex_init(&o->k.mu, NULL);
    return o;
}

static void ob_close(void *ob)
{
    pg_outbox *o = ob;
    if (!o)
        return;
    qg__pg_drop(&o->k);
    pthread_mutex_destroy(&o->k.mu);
    free(o);
}

/* Run sql with text parameters on the handle's connection (held);
 * *res kept when asked (PQclear it).  QG_OK or an error with why; a
 * connection that failed is dropped (the next call makes a new one). */
static int exec_text(pg_outbox *o, const char *sql, int n,
                     const char *const *vals, PGresult **res, char *why,
                     size_t whycap)
{
    PGresult *r;
    int rc;
    if ((rc = qg__pg_use(o->g, &o->k, why, whycap)) != QG_OK)
        return rc;
    r = PQexecParams(o->k.c, sql, n, NULL, vals, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK &&
        PQresultStatus(r) != PGRES_TUPLES_OK) {
        char msg[400];
        rc = qg__pg_fail(o->k.c, r, msg, sizeof msg);
        snprintf(why, whycap, "outbox: %s", msg);
        PQclear(r);
        if (rc == QG_ELEDGER)
            qg__pg_drop(&o->k);
        return rc;
    }
    if (res)
        *res = r;
    else
        PQclear(r);
    return QG_OK;
}

static void end_failed(pg_outbox *o)
{
    if (o->k.c && PQtransactionStatus(o->k.c) != PQTRANS_IDLE) {
        PGresult *r = PQexec(o->k.c, "ROLLBACK");
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            qg__pg_drop(&o->k);
        PQclear(r);
    }
}

static const char sql_mark[] =
    "INSERT INTO notify_marks (subject, \"window\", threshold_milli,"
    " period_key, armed, episode, fired_ms) VALUES ($1, $2, $3, $4, 0, 1, $5)"
    " ON CONFLICT (subject, \"window\", threshold_milli) DO UPDATE SET"
    " period_key = excluded.period_key, armed = 0,"
    " episode = notify_marks.episode + 1, fired_ms = excluded.fired_ms"
    " WHERE notify_marks.armed = 1"
    " OR excluded.period_key > notify_marks.period_key"
    " RETURNING episode";

static const char sql_event[] =
    "INSERT INTO webhook_outbox (id, url, type, subject, \"window\","
    " threshold_milli, period_key, body, created_ms, next_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)"
    " ON CONFLICT (id, url) DO NOTHING";

static int ob_fire(void *ob, qg_outbox_event *ev, const char *const *urls,
                   int nurls, int *fired,
                   void (*id_of)(const qg_outbox_event *ev, int64_t episode,
                                 char *id),
                   char *why, size_t whycap)
{
    pg_outbox *o = ob;
    char thr[24], per[24], at[24];
    const char *mv[5] = {ev->subject, ev->window, thr, per, at};
    PGresult *r = NULL;
    int64_t episode = 0;
    int rc;

    snprintf(thr, sizeof thr, "%lld", (long long)ev->threshold_milli);
    snprintf(per, sizeof per, "%lld", (long long)ev->period_key);
    snprintf(at, sizeof at, "%lld", (long long)ev->created_ms);
    pthread_mutex_lock(&o->k.mu);
    if ((rc = exec_text(o, "BEGIN", 0, NULL, NULL, why, whycap)) != QG_OK)
        goto out;
    if ((rc = exec_text(o, sql_mark, 5, mv, &r, why, whycap)) != QG_OK)
        goto fail;
    if (PQntuples(r) > 0)
        episode = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    if (episode == 0) {                 /* the mark held it back */
        rc = exec_text(o, "ROLLBACK", 0, NULL, NULL, why, whycap);
        goto out;
    }
    id_of(ev, episode, ev->id);
    for (int i = 0; i < nurls; i++) {
        const char *v[9] = {ev->id, urls[i], ev->type, ev->subject,
                            ev->window, thr, per, ev->body, at};
        if ((rc = exec_text(o, sql_event, 9, v, NULL, why, whycap)) !=
            QG_OK)
            goto fail;
    }
    if ((rc = exec_text(o, "COMMIT", 0, NULL, NULL, why, whycap)) != QG_OK)
        goto fail;
    *fired = 1;
    goto out;
fail:
    end_failed(o);
out:
    pthread_mutex_unlock(&o->k.mu);
    return rc;
}

static int run(pg_outbox *o, const char *sql, int n,
               const char *const *vals, char *why, size_t whycap)
{
    int rc;
    pthread_mutex_lock(&o->k.mu);
    rc = exec_text(o, sql, n, vals, NULL, why, whycap);
    pthread_mutex_unlock(&o->k.mu);
    return rc;
}

static int ob_rearm(void *ob, const char *subject, const char *window,
                    int64_t threshold_milli, char *why, size_t whycap)
{
    char thr[24];
    const char *v[3] = {subject, window, thr};
    snprintf(thr, sizeof thr, "%lld", (long long)threshold_milli);
    return run(ob, "UPDATE notify_marks SET armed = 1 WHERE subject = $1"
               " AND \"window\" = $2 AND threshold_milli = $3 AND armed = 0"
               " AND period_key = 0", 3, v, why, whycap);
}

#define TEXT(r, i, col, f) qg__pg_text(r, i, col, f, sizeof(f))

static int ob_claim(void *ob, const char *owner, int64_t now_ms,
                    int64_t lease_ms, qg_outbox_event *out, int max, int *n,
                    char *why, size_t whycap)
{
    pg_outbox *o = ob;
    char now[24], lease[24], lim[24];
    const char *v[4] = {owner, now, lease, lim};
    PGresult *r = NULL;
    int rc;
    snprintf(now, sizeof now, "%lld", (long long)now_ms);
    snprintf(lease, sizeof lease, "%lld", (long long)lease_ms);
    snprintf(lim, sizeof lim, "%d", max);
    pthread_mutex_lock(&o->k.mu);
    rc = exec_text(o,
        "UPDATE webhook_outbox o SET lease_owner = $1,"
        " lease_until = $2::bigint + $3::bigint FROM (SELECT id, url FROM"
        " webhook_outbox WHERE state = 0 AND next_ms <= $2::bigint"
        " AND lease_until <= $2::bigint ORDER BY next_ms LIMIT $4::int"
        " FOR UPDATE SKIP LOCKED) c WHERE o.id = c.id AND o.url = c.url"
        " RETURNING o.id, o.url, o.type, o.subject, o.\"window\","
        " o.threshold_milli, o.period_key, o.body, o.created_ms, o.next_ms,"
        " o.attempts", 4, v, &r, why, whycap);
    if (rc == QG_OK) {
        for (int i = 0; i < PQntuples(r) && *n < max; i++) {
            qg_outbox_event *e = &out[(*n)++];
            memset(e, 0, sizeof *e);
            TEXT(r, i, 0, e->id);
            TEXT(r, i, 1, e->url);
            TEXT(r, i, 2, e->type);
            TEXT(r, i, 3, e->subject);
            TEXT(r, i, 4, e->window);
            e->threshold_milli = strtoll(PQgetvalue(r, i, 5), NULL, 10);
            e->period_key = strtoll(PQgetvalue(r, i, 6), NULL, 10);
            TEXT(r, i, 7, e->body);
            e->created_ms = strtoll(PQgetvalue(r, i, 8), NULL, 10);
            e->next_ms = strtoll(PQgetvalue(r, i, 9), NULL, 10);
            e->attempts = atoi(PQgetvalue(r, i, 10));
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&o->k.mu);
    return rc;
}

static int ob_release(void *ob, const char *owner, char *why, size_t whycap)
{
    return run(ob, "UPDATE webhook_outbox SET lease_until = 0,"
               " lease_owner = '' WHERE lease_owner = $1 AND state = 0", 1,
               &owner, why, whycap);
}

static int ob_finish(void *ob, const char *id, const char *url, int state,
                     int64_t now_ms, const char *error, char *why,
                     size_t whycap)
{
    char st[8], now[24];
    const char *v[5] = {id, url, error ? error : "", st, now};
    snprintf(st, sizeof st, "%d", state);
    snprintf(now, sizeof now, "%lld", (long long)now_ms);
    return run(ob, "UPDATE webhook_outbox SET last_error = $3,"
               " state = $4::int, done_ms = $5::bigint, lease_until = 0"
               " WHERE id = $1 AND url = $2 AND state = 0", 5, v, why,
               whycap);
}

static int ob_retry(void *ob, const char *id, const char *url,
                    int64_t next_ms, int attempts, const char *error,
                    char *why, size_t whycap)
{
    char next[24], att[16];
    const char *v[5] = {id, url, error, next, att};
    snprintf(next, sizeof next, "%lld", (long long)next_ms);
    snprintf(att, sizeof att, "%d", attempts);
    return run(ob, "UPDATE webhook_outbox SET last_error = $3,"
               " next_ms = $4::bigint, attempts = $5::int, lease_until = 0,"
               " lease_owner = '' WHERE id = $1 AND url = $2 AND state = 0",
               5, v, why, whycap);
}

static int ob_backlog(void *ob, int64_t *pending, int64_t *oldest_ms,
                      char *why, size_t whycap)
{
    pg_outbox *o = ob;
    PGresult *r = NULL;
    int rc;
    pthread_mutex_lock(&o->k.mu);
    rc = exec_text(o, "SELECT count(*), coalesce(min(created_ms), 0) FROM"
                   " webhook_outbox WHERE state = 0", 0, NULL, &r, why,
                   whycap);
    if (rc == QG_OK) {
        if (PQntuples(r) == 1) {
            *pending = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
            *oldest_ms = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&o->k.mu);
    return rc;
}

const qg__ledger_outbox_ops qg__pg_outbox_ops = {
    ob_open, ob_close, ob_fire, ob_rearm, ob_claim, ob_release, ob_finish,
    ob_retry, ob_backlog,
};
