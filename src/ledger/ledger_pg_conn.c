/* ledger_pg_conn.c - the PostgreSQL ledger's connections: making one
 * (libpq parses the URL; bounded connects and reads), its session
 * settings and prepared statements, using it again or making it anew
 * after a loss, running a prepared statement with one retry when an old
 * connection died, reading a query through a cursor, and what a failure
 * means: QG_ELEDGER while the server cannot be reached (refused, lost,
 * shutting down, read-only or in recovery), QG_EIO otherwise, with
 * libpq's message on one line.  ledger_pg.c's opening comment tells the
 * design. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

/* --------------------------------------------------------------- messages */

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
void qg__pg_redact(const char *url, char *out, size_t cap)
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
PGconn *qg__pg_conn_new(qg__pg *g, char *why, size_t cap)
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

int qg__pg_run_ctl(PGconn *c, const char *sql, char *why, size_t cap)
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
int qg__pg_conn_setup(qg__pg_conn *k, char *why, size_t cap)
{
    int rc = QG_OK;
    if (k->sync_off) {
        rc = qg__pg_run_ctl(k->c, "SET synchronous_commit = off", why, cap);
    } else if (k->sync_on) {
        PGresult *r = PQexec(k->c, "SHOW synchronous_commit");
        if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
            rc = qg__pg_fail(k->c, r, why, cap);
        else if (strcmp(PQgetvalue(r, 0, 0), "off") == 0)
            rc = qg__pg_run_ctl(k->c, "SET synchronous_commit = on", why, cap);
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
    if (!(k->c = qg__pg_conn_new(g, msg, sizeof msg))) {
        snprintf(why, cap, "%s: cannot connect (%s): %s", g->shown, k->name,
                 msg);
        return QG_ELEDGER;
    }
    if ((rc = qg__pg_conn_setup(k, msg, sizeof msg)) != QG_OK) {
        snprintf(why, cap, "%s: cannot set up the %s connection: %s",
                 g->shown, k->name, msg);
        qg__pg_drop(k);
        return rc;
    }
    return QG_OK;
}


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
        r = PQexecPrepared(k->c, stmt, n, vals, lens, qg__pg_binary, 1);
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
int qg__pg_cursor(qg__pg *g, qg__pg_conn *k, const char *sql, int n,
                  const Oid *types, const char *const *vals, const int *lens,
                  int (*fn)(const PGresult *r, int row, void *ud), void *ud,
                  char *why, size_t cap)
{
    char decl[1024];
    int rc = QG_OK, out = 0;
    snprintf(decl, sizeof decl, "DECLARE qg_cursor NO SCROLL CURSOR FOR %s",
             sql);
    for (int attempt = 0;; attempt++) {
        int fresh = !k->c;
        if ((rc = qg__pg_use(g, k, why, cap)) != QG_OK)
            return rc;
        if ((rc = qg__pg_run_ctl(k->c, "BEGIN", why, cap)) == QG_OK)
            break;
        qg__pg_drop(k);
        if (rc != QG_ELEDGER || fresh || attempt > 0)
            return rc;
    }
    {
        PGresult *r = PQexecParams(k->c, decl, n, types, vals, lens,
                                   qg__pg_binary, 1);
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
    if (qg__pg_run_ctl(k->c, "ROLLBACK", NULL, 0) != QG_OK || rc == QG_ELEDGER)
        qg__pg_drop(k);
    return rc != QG_OK ? rc : out;
}
