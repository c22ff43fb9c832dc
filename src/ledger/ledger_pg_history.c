/* ledger_pg_history.c - the PostgreSQL ledger's history reads
 * (ledger_backend.h, qg__ledger_history_ops): a subject's usage slots, its
 * first usage, its latest rows.
 *
 * On the history connection of their own (g->hist), prepared statements
 * with binary parameters and results, one round trip each.  The slots are
 * a range of usage_slots' primary key (subject, slot_ms, model); the
 * latest rows a backward range of requests_subject (subject, created_ms,
 * seq) with LIMIT: neither reads a subject's rows beyond what it returns.
 * Both made by migration 2 (ledger_pg_schema.c).  A read that finds its
 * connection lost is tried once more on a new one (reads are
 * idempotent). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

typedef struct hstmt {
    const char *name;
    const char *sql;
    int n;
    Oid types[3];
} hstmt;

static const hstmt stmts[] = {
    {"qg_hslots",
     "SELECT slot_ms, model, weight_milli, admitted, requests, refused"
     " FROM usage_slots WHERE subject = $1 AND slot_ms >= $2"
     " AND slot_ms < $3 ORDER BY slot_ms, model",
     3, {QG_PG_TEXT, QG_PG_INT8, QG_PG_INT8}},
    {"qg_hfirst",
     "SELECT slot_ms FROM usage_slots WHERE subject = $1 AND admitted > 0"
     " ORDER BY slot_ms LIMIT 1",
     1, {QG_PG_TEXT}},
    {"qg_hlatest",
     "SELECT " QG_PG_ROW_COLS " FROM requests WHERE subject = $1"
     " AND created_ms < $2 ORDER BY created_ms DESC, seq DESC LIMIT $3",
     3, {QG_PG_TEXT, QG_PG_INT8, QG_PG_INT8}},
};

int qg__pg_prepare_history(PGconn *c, char *why, size_t cap)
{
    for (size_t i = 0; i < sizeof stmts / sizeof stmts[0]; i++) {
        PGresult *r = PQprepare(c, stmts[i].name, stmts[i].sql, stmts[i].n,
                                stmts[i].types);
        int rc = PQresultStatus(r) == PGRES_COMMAND_OK
                     ? QG_OK
                     : qg__pg_fail(c, r, why, cap);
        PQclear(r);
        if (rc != QG_OK)
            return rc;
    }
    return QG_OK;
}

/* Run one of stmts on the history connection: *res to PQclear. */
static int hexec(qg__pg *g, const char *stmt, int n, const char *const *vals,
                 const int *lens, PGresult **res)
{
    char why[512];
    int rc;
    pthread_mutex_lock(&g->hist.mu);
    rc = qg__pg_exec(g, &g->hist, stmt, n, vals, lens, 1, res, why,
                     sizeof why);
    pthread_mutex_unlock(&g->hist.mu);
    if (rc != QG_OK)
        qg__pg_read_failed(g, why);
    return rc;
}

static int pg_slots(void *b, const char *subject, int64_t from_ms,
                    int64_t to_ms, int (*fn)(const qg_usage_slot *s, void *ud),
                    void *ud)
{
    qg__pg *g = b;
    unsigned char from[8], to[8];
    const char *vals[3] = {subject, (const char *)from, (const char *)to};
    int lens[3] = {(int)strlen(subject), 8, 8}, rc, out = 0;
    PGresult *r;
    qg__pg_put64(from, from_ms);
    qg__pg_put64(to, to_ms);
    if ((rc = hexec(g, "qg_hslots", 3, vals, lens, &r)) != QG_OK)
        return rc;
    for (int i = 0, n = PQntuples(r); i < n && out == 0; i++) {
        qg_usage_slot sl;
        sl.start_ms = qg__pg_int(r, i, 0);
        qg__pg_text(r, i, 1, sl.model, sizeof sl.model);
        sl.weight_milli = qg__pg_int(r, i, 2);
        sl.admitted = qg__pg_int(r, i, 3);
        sl.requests = qg__pg_int(r, i, 4);
        sl.refused = qg__pg_int(r, i, 5);
        out = fn(&sl, ud);
    }
    PQclear(r);
    return out;
}

static int pg_first_usage(void *b, const char *subject, int64_t *start_ms)
{
    qg__pg *g = b;
    const char *vals[1] = {subject};
    int lens[1] = {(int)strlen(subject)}, rc;
    PGresult *r;
    if ((rc = hexec(g, "qg_hfirst", 1, vals, lens, &r)) != QG_OK)
        return rc;
    if (PQntuples(r) > 0)
        *start_ms = qg__pg_int(r, 0, 0);
    else
        rc = QG_ENOTFOUND;
    PQclear(r);
    return rc;
}

static int pg_latest(void *b, const char *subject, int64_t before_ms,
                     int limit, int (*fn)(const qg_ledger_row *row, void *ud),
                     void *ud)
{
    qg__pg *g = b;
    unsigned char before[8], lim[8];
    const char *vals[3] = {subject, (const char *)before, (const char *)lim};
    int lens[3] = {(int)strlen(subject), 8, 8}, rc, out = 0;
    qg_ledger_row *row;
    PGresult *r;
    qg__pg_put64(before, before_ms);
    qg__pg_put64(lim, limit);
    if (!(row = malloc(sizeof *row)))
        return QG_ENOMEM;
    if ((rc = hexec(g, "qg_hlatest", 3, vals, lens, &r)) != QG_OK) {
        free(row);
        return rc;
    }
    for (int i = 0, n = PQntuples(r); i < n && out == 0; i++) {
        memset(row, 0, sizeof *row);
        qg__pg_read_row(r, i, row);
        out = fn(row, ud);
    }
    PQclear(r);
    free(row);
    return out;
}

const qg__ledger_history_ops qg__pg_history_ops = {
    pg_slots,
    pg_first_usage,
    pg_latest,
};
