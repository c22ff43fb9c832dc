/* ledger_pg.c - the shared ledger backend: PostgreSQL through libpq.
 *
 * Several quotagate instances write one database (PRODUCT.md 5.1 point
 * 6); the front (ledger_backend.h) queues rows, groups them and spools
 * them while the database cannot be reached; this backend writes a batch
 * in one transaction and reads.  Five connections, one per concern, each
 * under its own mutex so that a long scan never waits for a commit nor a
 * key lookup for a scan:
 *  - the writer's (write_batch, spool_applied; ledger_pg_writer.c);
 *  - the scan connection (scan, scan_ids), which reads through a cursor
 *    in chunks, so that a million rows are never one result in memory;
 *  - the lookup connection (get), asked for request ids the counters
 *    forgot;
 *  - the subjects' and the keys' connections (ledger_pg_admin.c).
 * The writer's connects at open (an unreachable server fails the open,
 * naming the URL without its password and libpq's reason), creating or
 * migrating the schema on the way (ledger_pg_schema.c); the others
 * connect on first use.  A connection that was lost is made again on the
 * next call, with its session settings and its prepared statements; a
 * read or an idempotent write that fails because an old connection died
 * meanwhile (the server restarted) is tried once more on a new one.
 * While the server cannot be reached (refused, lost, shutting down,
 * read-only or in recovery) calls return QG_ELEDGER with libpq's message;
 * other failures QG_EIO (ledger_pg_conn.c: connections and failures).
 *
 * Durability: the writer and the admin connections make sure
 * synchronous_commit is not "off" (a settle is acknowledged only after its
 * row is committed), except the writer in ASYNC mode, which sets it off
 * (the front acknowledged its rows already; the same trade as SQLite's
 * synchronous=NORMAL there).  Passwords come from the URL or libpq's own
 * PGPASSWORD and never appear in a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

/* ---------------------------------------------------- values, messages */

void qg__pg_put64(unsigned char *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--, u >>= 8)
        p[i] = (unsigned char)(u & 0xff);
}

void qg__pg_put32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 3; i >= 0; i--, u >>= 8)
        p[i] = (unsigned char)(u & 0xff);
}

/* A binary integer cell of 2, 4 or 8 bytes (NULL: 0). */
int64_t qg__pg_int(const PGresult *r, int row, int col)
{
    const unsigned char *p = (const unsigned char *)PQgetvalue(r, row, col);
    int len = PQgetlength(r, row, col);
    uint64_t u = 0;
    if (PQgetisnull(r, row, col) || (len != 2 && len != 4 && len != 8))
        return 0;
    for (int i = 0; i < len; i++)
        u = u << 8 | p[i];
    if (len == 2)
        return (int16_t)(uint16_t)u;
    if (len == 4)
        return (int32_t)(uint32_t)u;
    return (int64_t)u;
}

void qg__pg_text(const PGresult *r, int row, int col, char *dst, size_t cap)
{
    size_t n = PQgetisnull(r, row, col) ? 0
                                        : (size_t)PQgetlength(r, row, col);
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(dst, PQgetvalue(r, row, col), n);
    dst[n] = '\0';
}

int qg__pg_buf_add(qg__pg_buf *b, const void *p, size_t n, size_t cap)
{
    if (n > cap || b->len > cap - n)
        return QG_ENOMEM;
    if (b->len + n > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        char *q;
        while (c < b->len + n)
            c *= 2;
        if (c > cap)
            c = cap;
        if (!(q = realloc(b->p, c)))
            return QG_ENOMEM;
        b->p = q;
        b->cap = c;
    }
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return QG_OK;
}

/* Strict UTF-8 as PostgreSQL checks it: no overlong forms, no
 * surrogates, nothing past U+10FFFF. */
int qg__pg_utf8_ok(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        unsigned c = *p;
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2
                                   : (c & 0xf0) == 0xe0 ? 3
                                   : (c & 0xf8) == 0xf0 ? 4 : 0;
        uint32_t cp;
        if (!len || (size_t)(end - p) < len)
            return 0;
        cp = len == 1 ? c : c & (0x7fu >> len);
        for (size_t i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i] & 0x3fu);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
            (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        p += len;
    }
    return 1;
}

#define TEXT(r, i, col, f) qg__pg_text(r, i, col, f, sizeof(f))

void qg__pg_read_row(const PGresult *r, int i, qg_ledger_row *o)
{
    TEXT(r, i, 0, o->request_id);
    TEXT(r, i, 1, o->subject);
    TEXT(r, i, 2, o->org);
    TEXT(r, i, 3, o->plan);
    TEXT(r, i, 4, o->rules_version);
    TEXT(r, i, 5, o->weights_version);
    TEXT(r, i, 6, o->model);
    TEXT(r, i, 7, o->window);
    o->decision = (int)qg__pg_int(r, i, 8);
    o->status = (int)qg__pg_int(r, i, 9);
    o->estimated = (int)qg__pg_int(r, i, 10);
    o->input_tokens = qg__pg_int(r, i, 11);
    o->output_tokens = qg__pg_int(r, i, 12);
    o->reserved_milli = qg__pg_int(r, i, 13);
    o->weight_milli = qg__pg_int(r, i, 14);
    o->created_ms = qg__pg_int(r, i, 15);
    o->settled_ms = qg__pg_int(r, i, 16);
    o->overage_milli = qg__pg_int(r, i, 17);
    o->overage_price_micro = qg__pg_int(r, i, 18);
    o->overage_cost_micro = qg__pg_int(r, i, 19);
    o->headroom_milli = qg__pg_int(r, i, 20);
    TEXT(r, i, 21, o->detail);
    o->fallback = (int)qg__pg_int(r, i, 22);
    o->settle_only = 0;
}


/* ------------------------------------------------------------- reads */

typedef struct scan_ud {
    int (*fn)(const qg_ledger_row *row, void *ud);
    void *ud;
    qg_ledger_row row;
} scan_ud;

static int scan_row(const PGresult *r, int i, void *ud)
{
    scan_ud *s = ud;
    qg__pg_read_row(r, i, &s->row);
    return s->fn(&s->row, s->ud);
}

static int pg_scan(void *b, int64_t since_ms,
                   int (*fn)(const qg_ledger_row *row, void *ud), void *ud)
{
    qg__pg *g = b;
    static const Oid types[1] = {QG_PG_INT8};
    unsigned char since[8];
    const char *vals[1] = {(const char *)since};
    int lens[1] = {8}, rc;
    char why[512];
    scan_ud *s = calloc(1, sizeof *s);
    if (!s)
        return QG_ENOMEM;
    s->fn = fn;
    s->ud = ud;
    qg__pg_put64(since, since_ms);
    pthread_mutex_lock(&g->scan.mu);
    rc = qg__pg_cursor(g, &g->scan,
                     "SELECT " QG_PG_ROW_COLS " FROM requests"
                     " WHERE decision = 1 AND created_ms >= $1"
                     " ORDER BY created_ms, seq",
                     1, types, vals, lens, scan_row, s, why, sizeof why);
    pthread_mutex_unlock(&g->scan.mu);
    if (rc < 0)
        qg__pg_read_failed(g, why);
    free(s);
    return rc;
}

/* One subject's rows and its org's other members' rows, each half from
 * its own index (schema 3). */
static int pg_scan_entity(void *b, const char *subject, const char *org,
                          int64_t since_ms, int64_t until_ms,
                          int (*fn)(const qg_ledger_row *row, void *ud),
                          void *ud)
{
    qg__pg *g = b;
    static const Oid types[4] = {QG_PG_TEXT, QG_PG_TEXT, QG_PG_INT8,
                                 QG_PG_INT8};
    unsigned char since[8], until[8];
    const char *vals[4] = {subject, org, (const char *)since,
                           (const char *)until};
    int lens[4] = {(int)strlen(subject), (int)strlen(org), 8, 8}, rc;
    char why[512];
    scan_ud *s = calloc(1, sizeof *s);
    if (!s)
        return QG_ENOMEM;
    s->fn = fn;
    s->ud = ud;
    qg__pg_put64(since, since_ms);
    qg__pg_put64(until, until_ms);
    pthread_mutex_lock(&g->scan.mu);
    rc = qg__pg_cursor(g, &g->scan,
                     "SELECT * FROM ("
                     "SELECT " QG_PG_ROW_COLS ", seq FROM requests"
                     " WHERE subject = $1 AND decision = 1"
                     "   AND created_ms >= $3 AND created_ms <= $4"
                     " UNION ALL "
                     "SELECT " QG_PG_ROW_COLS ", seq FROM requests"
                     " WHERE $2 <> '' AND org = $2 AND subject <> $1"
                     "   AND decision = 1"
                     "   AND created_ms >= $3 AND created_ms <= $4) AS e"
                     " ORDER BY created_ms, seq",
                     4, types, vals, lens, scan_row, s, why, sizeof why);
    pthread_mutex_unlock(&g->scan.mu);
    if (rc < 0)
        qg__pg_read_failed(g, why);
    free(s);
    return rc;
}

typedef struct ids_ud {
    int (*fn)(const char *id, size_t len, void *ud);
    void *ud;
} ids_ud;

static int id_row(const PGresult *r, int i, void *ud)
{
    ids_ud *s = ud;
    return s->fn(PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0), s->ud);
}

static int pg_scan_ids(void *b, int (*fn)(const char *id, size_t len,
                                          void *ud),
                       void *ud)
{
    qg__pg *g = b;
    ids_ud s = {fn, ud};
    char why[512];
    int rc;
    pthread_mutex_lock(&g->scan.mu);
    rc = qg__pg_cursor(g, &g->scan, "SELECT request_id FROM requests", 0,
                     NULL, NULL, NULL, id_row, &s, why, sizeof why);
    pthread_mutex_unlock(&g->scan.mu);
    if (rc < 0)
        qg__pg_read_failed(g, why);
    return rc;
}

static int prepare_get(PGconn *c, char *why, size_t cap)
{
    static const Oid types[1] = {QG_PG_TEXT};
    PGresult *r = PQprepare(c, "qg_get", "SELECT " QG_PG_ROW_COLS
                            " FROM requests WHERE request_id = $1", 1,
                            types);
    int rc = PQresultStatus(r) == PGRES_COMMAND_OK
                 ? QG_OK
                 : qg__pg_fail(c, r, why, cap);
    PQclear(r);
    if (rc != QG_OK)
        return rc;
    /* the planner's row count: enough to size the id filter, no scan */
    r = PQprepare(c, "qg_estimate", "SELECT greatest(reltuples, 0)::bigint"
                  " FROM pg_class WHERE oid = 'requests'::regclass", 0,
                  NULL);
    rc = PQresultStatus(r) == PGRES_COMMAND_OK ? QG_OK
                                               : qg__pg_fail(c, r, why, cap);
    PQclear(r);
    return rc;
}

static int64_t pg_estimate(void *b)
{
    qg__pg *g = b;
    char why[512];
    PGresult *r;
    int64_t rows = -1;
    pthread_mutex_lock(&g->get.mu);
    if (qg__pg_exec(g, &g->get, "qg_estimate", 0, NULL, NULL, 1, &r, why,
                    sizeof why) == QG_OK) {
        if (PQntuples(r) > 0)
            rows = qg__pg_int(r, 0, 0);
        PQclear(r);
    }
    pthread_mutex_unlock(&g->get.mu);
    return rows;
}

static int pg_get(void *b, const char *request_id, qg_ledger_row *out)
{
    qg__pg *g = b;
    const char *vals[1] = {request_id};
    int lens[1] = {(int)strlen(request_id)}, rc;
    char why[512];
    PGresult *r;
    if (!qg__pg_utf8_ok(request_id, (size_t)lens[0]))
        return QG_ENOTFOUND;     /* never written (ledger_pg_writer.c) */
    pthread_mutex_lock(&g->get.mu);
    rc = qg__pg_exec(g, &g->get, "qg_get", 1, vals, lens, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        if (PQntuples(r) > 0) {
            memset(out, 0, sizeof *out);
            qg__pg_read_row(r, 0, out);
        } else {
            rc = QG_ENOTFOUND;
        }
        PQclear(r);
    }
    pthread_mutex_unlock(&g->get.mu);
    if (rc < 0 && rc != QG_ENOTFOUND)
        qg__pg_read_failed(g, why);
    return rc;
}

static int pg_spool_applied(void *b, const char *spool_id, int64_t *seq)
{
    qg__pg *g = b;
    const char *vals[1] = {spool_id};
    int lens[1] = {(int)strlen(spool_id)}, rc;
    char why[512];
    PGresult *r;
    *seq = 0;
    pthread_mutex_lock(&g->w.mu);
    rc = qg__pg_exec(g, &g->w, "qg_applied", 1, vals, lens, 1, &r, why,
                     sizeof why);
    if (rc == QG_OK) {
        if (PQntuples(r) > 0)
            *seq = qg__pg_int(r, 0, 0);
        PQclear(r);
    }
    pthread_mutex_unlock(&g->w.mu);
    if (rc != QG_OK)
        qg__pg_read_failed(g, why);
    return rc;
}

static void pg_last_read_error(void *b, char *out, size_t cap)
{
    qg__pg *g = b;
    pthread_mutex_lock(&g->err_mu);
    snprintf(out, cap, "%s", g->read_err);
    pthread_mutex_unlock(&g->err_mu);
}

/* ------------------------------------------------------- open and close */

static qg__pg_conn *conn_at(qg__pg *g, int i)
{
    qg__pg_conn *all[] = {&g->w,    &g->scan, &g->get,
                          &g->subj, &g->keys, &g->hist};
    return all[i];
}
#define NCONN 6

static void pg_close(void *b)
{
    qg__pg *g = b;
    if (!g)
        return;
    for (int i = 0; i < NCONN; i++) {
        qg__pg_conn *k = conn_at(g, i);
        qg__pg_drop(k);
        if (i < g->mutexes)
            pthread_mutex_destroy(&k->mu);
    }
    if (g->mutexes > NCONN)
        pthread_mutex_destroy(&g->err_mu);
    for (int i = 0; i < QG_PG_NCOLS; i++)
        free(g->col[i].p);
    free(g->scratch.p);
    free(g->map);
    free(g->round);
    free(g->pick);
    free(g);
}

static void *pg_open(const char *target, const qg_ledger_opts *o, char *err,
                     size_t errcap)
{
    static const char *const names[NCONN] = {"writer", "scan", "lookup",
                                             "subjects", "keys", "history"};
    int (*const prep[NCONN])(PGconn *, char *, size_t) = {
        qg__pg_prepare_writer, NULL, prepare_get, qg__pg_prepare_subjects,
        qg__pg_prepare_keys, qg__pg_prepare_history};
    char msg[512];
    qg__pg *g;
    PGconn *c;
    int rc;

    if (strlen(target) >= sizeof g->url) {
        snprintf(err, errcap, "ledger: URL too long");
        return NULL;
    }
    if (!(g = calloc(1, sizeof *g))) {
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    g->o = *o;
    strcpy(g->url, target);
    qg__pg_redact(target, g->shown, sizeof g->shown);
    g->mode = QG_PG_WRITE_AUTO;
    for (int i = 0; i < NCONN; i++) {
        qg__pg_conn *k = conn_at(g, i);
        if (pthread_mutex_init(&k->mu, NULL) != 0)
            goto nomem;
        g->mutexes++;
        k->name = names[i];
        k->prepare = prep[i];
    }
    if (pthread_mutex_init(&g->err_mu, NULL) != 0)
        goto nomem;
    g->mutexes++;
    g->w.sync_off = o->sync == QG_LEDGER_ASYNC;
    g->w.sync_on = !g->w.sync_off;
    g->subj.sync_on = g->keys.sync_on = 1;

    /* the writer's connection: first the schema, then its statements */
    if (!(c = qg__pg_conn_new(g, msg, sizeof msg))) {
        snprintf(err, errcap, "ledger %s: cannot connect: %s", g->shown,
                 msg);
        goto fail;
    }
    if ((rc = qg__pg_migrate(c, g->shown, err, errcap)) != QG_OK) {
        PQfinish(c);
        goto fail;
    }
    g->w.c = c;
    if (qg__pg_conn_setup(&g->w, msg, sizeof msg) != QG_OK) {
        snprintf(err, errcap, "ledger %s: cannot prepare the writer's "
                 "statements: %s", g->shown, msg);
        goto fail;
    }
    return g;
nomem:
    snprintf(err, errcap, "ledger: out of memory");
fail:
    pg_close(g);
    return NULL;
}

static const qg__ledger_rows_ops pg_rows = {
    qg__pg_write_batch,
    pg_scan,
    pg_get,
    pg_scan_ids,
    pg_spool_applied,
    pg_last_read_error,
    pg_estimate,
    pg_scan_entity,
    NULL,                       /* no page cache of ours */
};

const qg__ledger_backend qg__ledger_postgresql = {
    "postgresql",
    QG_LEDGER_BACKEND_VERSION,
    1,
    pg_open,
    pg_close,
    &pg_rows,
    &qg__pg_subjects_ops,
    &qg__pg_keys_ops,
    &qg__pg_outbox_ops,
    &qg__pg_history_ops,
};
