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
 * other failures QG_EIO.
 *
 * Durability: the writer and the admin connections make sure
 * synchronous_commit is not "off" (a settle is acknowledged only after its
 * row is committed), except the writer in ASYNC mode, which sets it off
 * (the front acknowledged its rows already; the same trade as SQLite's
 * synchronous=NORMAL there).  Passwords come from the URL or libpq's own
 * PGPASSWORD and never appear in a message. */
#include <stdarg.h>
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

void qg__pg_log(const qg__pg *g, const char *fmt, ...)
{
    char line[1536];
    va_list ap;
    if (!g->o.log)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    g->o.log(g->o.log_ud, line);
}

/* libpq's messages end with a newline and may hold more lines ("server
 * closed the connection unexpectedly\n\tThis probably means..."): one
 * line for a log or an HTTP answer. */
static void one_line(char *dst, size_t cap, const char *msg)
{
    size_t n = 0;
    int space = 0;
    for (; msg && *msg && n + 1 < cap; msg++) {
        if (*msg == '\n' || *msg == '\t' || *msg == '\r' || *msg == ' ') {
            space = n > 0;
            continue;
        }
        if (space && n + 2 < cap)
            dst[n++] = ' ';
        space = 0;
        dst[n++] = *msg;
    }
    dst[n] = '\0';
}

/* SQLSTATEs that mean "the server cannot take our statements now"
 * rather than "this statement is wrong": a spool may take the rows. */
static int unreachable_state(const char *s)
{
    static const char *const states[] = {
        "57P01",                 /* admin_shutdown */
        "57P02",                 /* crash_shutdown */
        "57P03",                 /* cannot_connect_now (starting, recovery) */
        "25006",                 /* read_only_sql_transaction (a standby) */
        "53300",                 /* too_many_connections */
    };
    if (!s || !*s)
        return 0;
    if (strncmp(s, "08", 2) == 0)   /* connection_exception */
        return 1;
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        if (strcmp(s, states[i]) == 0)
            return 1;
    return 0;
}

int qg__pg_fail(PGconn *c, const PGresult *r, char *why, size_t cap)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r ? PQresultErrorMessage(r) : NULL;
    if (!msg || !*msg)
        msg = c ? PQerrorMessage(c) : "out of memory";
    if (!msg || !*msg)
        msg = "unknown error";
    if (why && cap) {
        char line[512];
        one_line(line, sizeof line, msg);
        if (state && *state)
            snprintf(why, cap, "%s (SQLSTATE %s)", line, state);
        else
            snprintf(why, cap, "%s", line);
    }
    if (!c || PQstatus(c) != CONNECTION_OK || unreachable_state(state))
        return QG_ELEDGER;
    return QG_EIO;
}

void qg__pg_read_failed(qg__pg *g, const char *why)
{
    pthread_mutex_lock(&g->err_mu);
    snprintf(g->read_err, sizeof g->read_err, "%s", why);
    pthread_mutex_unlock(&g->err_mu);
}

/* The URL for messages: "postgresql://user:secret@host/db?password=x"
 * becomes "postgresql://user@host/db" plus its other parameters. */
static void redact(const char *url, char *out, size_t cap)
{
    const char *p = strstr(url, "://"), *auth, *end, *at = NULL, *colon;
    size_t n = 0;
    out[0] = '\0';
    if (!p) {
        snprintf(out, cap, "(a connection string)");
        return;
    }
    auth = p + 3;
    end = auth + strcspn(auth, "/?");
    for (const char *q = auth; q < end; q++)
        if (*q == '@')
            at = q;
    colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
#define OUT(s, len)                                                       \
    do {                                                                  \
        size_t l_ = (len);                                                \
        if (n + l_ >= cap)                                                \
            l_ = cap - 1 - n;                                             \
        memcpy(out + n, (s), l_);                                         \
        n += l_;                                                          \
    } while (0)
    if (colon) {
        OUT(url, (size_t)(colon - url));
        OUT(at, (size_t)(end - at));
    } else {
        OUT(url, (size_t)(end - url));
    }
    /* the path, then the query without password=... */
    p = end;
    end = p + strcspn(p, "?");
    OUT(p, (size_t)(end - p));
    if (*end == '?') {
        char sep = '?';
        for (p = end + 1; *p;) {
            size_t len = strcspn(p, "&");
            if (strncmp(p, "password=", 9) != 0) {
                OUT(&sep, 1);
                OUT(p, len);
                sep = '&';
            }
            p += len + (p[len] == '&');
        }
    }
#undef OUT
    out[n] = '\0';
}

/* ---------------------------------------------------------- connections */

/* The server's notices: below WARNING they say nothing an operator
 * needs ("relation ... already exists, skipping"); warnings go to the
 * log.  libpq would print them all on stderr. */
static void on_notice(void *arg, const PGresult *r)
{
    const qg__pg *g = arg;
    const char *sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    char line[512];
    if (!sev || strcmp(sev, "WARNING") != 0)
        return;
    one_line(line, sizeof line, PQresultErrorMessage(r));
    qg__pg_log(g, "ledger %s: %s", g->shown, line);
}

/* A new connection to g->url: libpq parses the URL (its own keywords may
 * override ours: they come after them).  Bounded: a connect gives up after
 * 10 s, and a server that vanishes without a reset (a host gone, a cable
 * cut) is noticed within about a minute by TCP keepalives (idle 30 s,
 * then 3 probes 10 s apart) and tcp_user_timeout (60 s for data sent and
 * not acknowledged), instead of a read that waits for ever.  NULL with
 * why when it failed. */
static PGconn *conn_new(qg__pg *g, char *why, size_t cap)
{
    const char *keys[] = {"connect_timeout", "fallback_application_name",
                          "client_encoding", "keepalives_idle",
                          "keepalives_interval", "keepalives_count",
                          "tcp_user_timeout", "dbname", NULL};
    const char *vals[] = {"10", "quotagate", "UTF8", "30", "10", "3",
                          "60000", g->url, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        qg__pg_fail(c, NULL, why, cap);
        PQfinish(c);
        return NULL;
    }
    PQsetNoticeReceiver(c, on_notice, g);
    return c;
}

static int run_ctl(PGconn *c, const char *sql, char *why, size_t cap)
{
    PGresult *r = PQexec(c, sql);
    int rc = QG_OK;
    if (PQresultStatus(r) != PGRES_COMMAND_OK &&
        PQresultStatus(r) != PGRES_TUPLES_OK)
        rc = qg__pg_fail(c, r, why, cap);
    PQclear(r);
    return rc;
}

/* The session settings of k, then its statements. */
static int conn_setup(qg__pg_conn *k, char *why, size_t cap)
{
    int rc = QG_OK;
    if (k->sync_off) {
        rc = run_ctl(k->c, "SET synchronous_commit = off", why, cap);
    } else if (k->sync_on) {
        PGresult *r = PQexec(k->c, "SHOW synchronous_commit");
        if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
            rc = qg__pg_fail(k->c, r, why, cap);
        else if (strcmp(PQgetvalue(r, 0, 0), "off") == 0)
            rc = run_ctl(k->c, "SET synchronous_commit = on", why, cap);
        PQclear(r);
    }
    if (rc == QG_OK && k->prepare)
        rc = k->prepare(k->c, why, cap);
    return rc;
}

void qg__pg_drop(qg__pg_conn *k)
{
    PQfinish(k->c);
    k->c = NULL;
}

int qg__pg_use(qg__pg *g, qg__pg_conn *k, char *why, size_t cap)
{
    char msg[400];
    int rc;
    /* a connection in any other state (a transaction or a pipeline left
     * behind by a failure) is not reused: a new one is certain */
    if (k->c && PQstatus(k->c) == CONNECTION_OK &&
        PQtransactionStatus(k->c) == PQTRANS_IDLE &&
        PQpipelineStatus(k->c) == PQ_PIPELINE_OFF)
        return QG_OK;
    qg__pg_drop(k);
    if (!(k->c = conn_new(g, msg, sizeof msg))) {
        snprintf(why, cap, "%s: cannot connect (%s): %s", g->shown, k->name,
                 msg);
        return QG_ELEDGER;
    }
    if ((rc = conn_setup(k, msg, sizeof msg)) != QG_OK) {
        snprintf(why, cap, "%s: cannot set up the %s connection: %s",
                 g->shown, k->name, msg);
        qg__pg_drop(k);
        return rc;
    }
    return QG_OK;
}

static const int binary[QG_PG_NCOLS + 1] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

int qg__pg_exec(qg__pg *g, qg__pg_conn *k, const char *stmt, int n,
                const char *const *vals, const int *lens, int retry,
                PGresult **res, char *why, size_t cap)
{
    *res = NULL;
    for (int attempt = 0;; attempt++) {
        int fresh = !k->c, rc;
        PGresult *r;
        ExecStatusType st;
        if ((rc = qg__pg_use(g, k, why, cap)) != QG_OK)
            return rc;
        r = PQexecPrepared(k->c, stmt, n, vals, lens, binary, 1);
        st = PQresultStatus(r);
        if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
            *res = r;
            return QG_OK;
        }
        rc = qg__pg_fail(k->c, r, why, cap);
        PQclear(r);
        if (rc != QG_ELEDGER)
            return rc;
        /* the server went away, or will not take this now: a new
         * connection next time (after a failover it may reach another) */
        qg__pg_drop(k);
        if (!retry || fresh || attempt > 0)
            return rc;
    }
}

/* Read a query's rows in chunks through a cursor on k (held): fn for each
 * row of each chunk (binary results); fn's nonzero return stops the scan
 * and is returned.  A connection that died before the first row is made
 * again once.  QG_OK, fn's value, or an error with why. */
#define CURSOR_CHUNK "1024"
static int cursor_scan(qg__pg *g, qg__pg_conn *k, const char *sql, int n,
                       const Oid *types, const char *const *vals,
                       const int *lens,
                       int (*fn)(const PGresult *r, int row, void *ud),
                       void *ud, char *why, size_t cap)
{
    char decl[1024];
    int rc = QG_OK, out = 0;
    snprintf(decl, sizeof decl, "DECLARE qg_cursor NO SCROLL CURSOR FOR %s",
             sql);
    for (int attempt = 0;; attempt++) {
        int fresh = !k->c;
        if ((rc = qg__pg_use(g, k, why, cap)) != QG_OK)
            return rc;
        if ((rc = run_ctl(k->c, "BEGIN", why, cap)) == QG_OK)
            break;
        qg__pg_drop(k);
        if (rc != QG_ELEDGER || fresh || attempt > 0)
            return rc;
    }
    {
        PGresult *r = PQexecParams(k->c, decl, n, types, vals, lens, binary,
                                   1);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            rc = qg__pg_fail(k->c, r, why, cap);
        PQclear(r);
    }
    while (rc == QG_OK && out == 0) {
        PGresult *r = PQexecParams(k->c, "FETCH " CURSOR_CHUNK
                                   " FROM qg_cursor", 0, NULL, NULL, NULL,
                                   NULL, 1);
        int rows;
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            rc = qg__pg_fail(k->c, r, why, cap);
            PQclear(r);
            break;
        }
        rows = PQntuples(r);
        for (int i = 0; i < rows && out == 0; i++)
            out = fn(r, i, ud);
        PQclear(r);
        if (rows == 0)
            break;
    }
    /* read only: ending it is all that is left (the cursor goes too) */
    if (run_ctl(k->c, "ROLLBACK", NULL, 0) != QG_OK || rc == QG_ELEDGER)
        qg__pg_drop(k);
    return rc != QG_OK ? rc : out;
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
    rc = cursor_scan(g, &g->scan,
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
    rc = cursor_scan(g, &g->scan, "SELECT request_id FROM requests", 0,
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
    redact(target, g->shown, sizeof g->shown);
    g->mode = QG_PG_WRITE_ARRAYS;
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
    if (!(c = conn_new(g, msg, sizeof msg))) {
        snprintf(err, errcap, "ledger %s: cannot connect: %s", g->shown,
                 msg);
        goto fail;
    }
    if ((rc = qg__pg_migrate(c, g->shown, err, errcap)) != QG_OK) {
        PQfinish(c);
        goto fail;
    }
    g->w.c = c;
    if (conn_setup(&g->w, msg, sizeof msg) != QG_OK) {
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
    &qg__pg_history_ops,
};
