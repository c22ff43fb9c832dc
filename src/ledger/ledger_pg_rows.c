/* ledger_pg_rows.c - the PostgreSQL writer's statements and how a row
 * becomes their parameters: the upserts with the guards (a whole row, a
 * settle; one row, or 23 arrays of many), prepared once per connection;
 * a row's 23 binary parameters; binary one-dimensional arrays; the check
 * that a row's text can be stored.  ledger_pg_writer.c runs them in a
 * transaction and reads what they did. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

const int qg__pg_binary[QG_PG_NCOLS] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

/* the most one column's array of one statement may take */
#define COL_CAP ((size_t)64 << 20)

#define VALUES_23 \
    "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15," \
    " $16, $17, $18, $19, $20, $21, $22, $23"

#define UPSERT_SET \
    " ON CONFLICT (request_id) DO UPDATE" \
    " SET subject = EXCLUDED.subject, org = EXCLUDED.org," \
    " plan = EXCLUDED.plan, rules_version = EXCLUDED.rules_version," \
    " weights_version = EXCLUDED.weights_version, model = EXCLUDED.model," \
    " \"window\" = EXCLUDED.\"window\", decision = EXCLUDED.decision," \
    " status = EXCLUDED.status, estimated = EXCLUDED.estimated," \
    " input_tokens = EXCLUDED.input_tokens," \
    " output_tokens = EXCLUDED.output_tokens," \
    " reserved_milli = EXCLUDED.reserved_milli," \
    " weight_milli = EXCLUDED.weight_milli," \
    " created_ms = EXCLUDED.created_ms, settled_ms = EXCLUDED.settled_ms," \
    " overage_milli = EXCLUDED.overage_milli," \
    " overage_price_micro = EXCLUDED.overage_price_micro," \
    " overage_cost_micro = EXCLUDED.overage_cost_micro," \
    " headroom_milli = EXCLUDED.headroom_milli, detail = EXCLUDED.detail," \
    " fallback = EXCLUDED.fallback" \
    " WHERE requests.subject = EXCLUDED.subject AND (requests.decision <> 1" \
    " OR (requests.status = 1 AND EXCLUDED.decision = 1" \
    " AND EXCLUDED.status <> 1))"

#define SETTLE_SET \
    " ON CONFLICT (request_id) DO UPDATE" \
    " SET status = EXCLUDED.status, estimated = EXCLUDED.estimated," \
    " input_tokens = EXCLUDED.input_tokens," \
    " output_tokens = EXCLUDED.output_tokens," \
    " weight_milli = EXCLUDED.weight_milli," \
    " settled_ms = EXCLUDED.settled_ms," \
    " overage_milli = EXCLUDED.overage_milli," \
    " overage_cost_micro = EXCLUDED.overage_cost_micro," \
    " detail = EXCLUDED.detail" \
    " WHERE requests.decision = 1 AND requests.status = 1" \
    " AND (EXCLUDED.subject = '' OR requests.subject = EXCLUDED.subject)"

/* Lock the subjects SUBJECTS (a query of one text column) returns, each
 * once, in the order of their hashes. */
#define LOCK_SUBJECTS(SUBJECTS) \
    "SELECT pg_advisory_xact_lock(" QG_PG_SUBJECT_LOCKS ", k)" \
    " FROM (SELECT DISTINCT hashtext(s) AS k FROM (" SUBJECTS ") u(s)" \
    " ORDER BY 1) l"

#define INSERT_ROW "INSERT INTO requests (" QG_PG_ROW_COLS ") VALUES (" \
    VALUES_23 ")"
#define INSERT_ARRAYS "INSERT INTO requests (" QG_PG_ROW_COLS ")" \
    " SELECT * FROM unnest(" VALUES_23 ")"

/* Each column's type, in QG_PG_ROW_COLS order. */
static const Oid col_type[QG_PG_NCOLS] = {
    QG_PG_TEXT, QG_PG_TEXT, QG_PG_TEXT, QG_PG_TEXT, QG_PG_TEXT, QG_PG_TEXT,
    QG_PG_TEXT, QG_PG_TEXT, QG_PG_INT4, QG_PG_INT4, QG_PG_INT4, QG_PG_INT8,
    QG_PG_INT8, QG_PG_INT8, QG_PG_INT8, QG_PG_INT8, QG_PG_INT8, QG_PG_INT8,
    QG_PG_INT8, QG_PG_INT8, QG_PG_INT8, QG_PG_TEXT, QG_PG_INT4,
};

static Oid array_of(Oid t)
{
    return t == QG_PG_TEXT ? QG_PG_TEXTARRAY
           : t == QG_PG_INT4 ? QG_PG_INT4ARRAY
                             : QG_PG_INT8ARRAY;
}

static int prepare1(PGconn *c, const char *name, const char *sql, int n,
                    const Oid *types, char *why, size_t cap)
{
    PGresult *r = PQprepare(c, name, sql, n, types);
    int rc = PQresultStatus(r) == PGRES_COMMAND_OK
                 ? QG_OK
                 : qg__pg_fail(c, r, why, cap);
    PQclear(r);
    return rc;
}

int qg__pg_prepare_writer(PGconn *c, char *why, size_t cap)
{
    static const Oid mark_t[2] = {QG_PG_TEXT, QG_PG_INT8};
    static const Oid own_t[1] = {QG_PG_TEXTARRAY};
    static const Oid own2_t[2] = {QG_PG_TEXTARRAY, QG_PG_TEXTARRAY};
    Oid arr_t[QG_PG_NCOLS];
    int rc;
    for (int i = 0; i < QG_PG_NCOLS; i++)
        arr_t[i] = array_of(col_type[i]);
    if ((rc = prepare1(c, "qg_up", INSERT_ROW UPSERT_SET, QG_PG_NCOLS,
                       col_type, why, cap)) != QG_OK ||
        (rc = prepare1(c, "qg_st", INSERT_ROW SETTLE_SET, QG_PG_NCOLS,
                       col_type, why, cap)) != QG_OK ||
        (rc = prepare1(c, "qg_upa", INSERT_ARRAYS UPSERT_SET
                       " RETURNING request_id", QG_PG_NCOLS, arr_t, why,
                       cap)) != QG_OK ||
        (rc = prepare1(c, "qg_sta", INSERT_ARRAYS SETTLE_SET
                       " RETURNING request_id", QG_PG_NCOLS, arr_t, why,
                       cap)) != QG_OK ||
        /* the owners of the stopped rows, in the order asked */
        (rc = prepare1(c, "qg_own",
                       "SELECT o.subject, o.decision"
                       " FROM unnest($1) WITH ORDINALITY AS q(id, n)"
                       " LEFT JOIN requests o ON o.request_id = q.id"
                       " ORDER BY q.n", 1, own_t, why, cap)) != QG_OK ||
        (rc = prepare1(c, "qg_mark",
                       "INSERT INTO spool_marks (spool_id, seq)"
                       " VALUES ($1, $2) ON CONFLICT (spool_id)"
                       " DO UPDATE SET seq = EXCLUDED.seq", 2, mark_t, why,
                       cap)) != QG_OK ||
        (rc = prepare1(c, "qg_applied",
                       "SELECT seq FROM spool_marks WHERE spool_id = $1", 1,
                       mark_t, why, cap)) != QG_OK ||
        /* a batch's subjects, locked in the order of their hashes (the
         * subquery sorts before the outer query locks): the ones named
         * ($1); qg_lock_held also those of the rows of the settles that
         * name none ($2) */
        (rc = prepare1(c, "qg_lock", LOCK_SUBJECTS("SELECT unnest($1)"), 1,
                       own_t, why, cap)) != QG_OK ||
        (rc = prepare1(c, "qg_lock_held",
                       LOCK_SUBJECTS("SELECT unnest($1) UNION ALL SELECT"
                                     " subject FROM requests"
                                     " WHERE request_id = ANY($2)"),
                       2, own2_t, why, cap)) != QG_OK)
        return rc;
    return QG_OK;
}

void qg__pg_set_write_mode(void *b, qg__pg_write_mode mode)
{
    ((qg__pg *)b)->mode = mode;
}

/* The first text field of r that is not valid UTF-8, or NULL. */
const char *qg__pg_bad_text(const qg_ledger_row *r)
{
    const char *f[9] = {r->request_id, r->subject, r->org, r->plan,
                        r->rules_version, r->weights_version, r->model,
                        r->window, r->detail};
    const size_t cap[9] = {sizeof r->request_id, sizeof r->subject,
                           sizeof r->org, sizeof r->plan,
                           sizeof r->rules_version, sizeof r->weights_version,
                           sizeof r->model, sizeof r->window,
                           sizeof r->detail};
    static const char *const names[9] = {"request_id", "subject", "org",
                                         "plan", "rules_version",
                                         "weights_version", "model",
                                         "window", "detail"};
    for (int i = 0; i < 9; i++)
        if (!qg__pg_utf8_ok(f[i], strnlen(f[i], cap[i])))
            return names[i];
    return NULL;
}

/* ------------------------------------------------------------ sending */

/* One row's 23 binary parameters; numbers written into num. */
static void row_params(const qg_ledger_row *r, const char **v, int *len,
                       unsigned char num[][8])
{
    const char *s[8] = {r->request_id, r->subject, r->org, r->plan,
                        r->rules_version, r->weights_version, r->model,
                        r->window};
    const size_t sc[8] = {sizeof r->request_id, sizeof r->subject,
                          sizeof r->org, sizeof r->plan,
                          sizeof r->rules_version, sizeof r->weights_version,
                          sizeof r->model, sizeof r->window};
    const int32_t i4[3] = {r->decision, r->status, r->estimated};
    const int64_t i8[10] = {r->input_tokens, r->output_tokens,
                            r->reserved_milli, r->weight_milli,
                            r->created_ms, r->settled_ms, r->overage_milli,
                            r->overage_price_micro, r->overage_cost_micro,
                            r->headroom_milli};
    int k = 0;
    for (int i = 0; i < 8; i++, k++) {
        v[k] = s[i];
        len[k] = (int)strnlen(s[i], sc[i]);
    }
    for (int i = 0; i < 3; i++, k++) {
        qg__pg_put32(num[i], i4[i]);
        v[k] = (const char *)num[i];
        len[k] = 4;
    }
    for (int i = 0; i < 10; i++, k++) {
        qg__pg_put64(num[3 + i], i8[i]);
        v[k] = (const char *)num[3 + i];
        len[k] = 8;
    }
    v[k] = r->detail;
    len[k++] = (int)strnlen(r->detail, sizeof r->detail);
    qg__pg_put32(num[13], r->fallback);
    v[k] = (const char *)num[13];
    len[k] = 4;
}


int qg__pg_send_row(PGconn *c, const qg_ledger_row *r)
{
    const char *v[QG_PG_NCOLS];
    int len[QG_PG_NCOLS];
    unsigned char num[14][8];
    row_params(r, v, len, num);
    return PQsendQueryPrepared(c, r->settle_only ? "qg_st" : "qg_up",
                               QG_PG_NCOLS, v, len, qg__pg_binary, 1);
}

/* A binary one-dimensional array's header; its length is set by
 * array_done. */
int qg__pg_array_start(qg__pg_buf *b, Oid elem)
{
    unsigned char h[20];
    qg__pg_put32(h, 1);              /* dimensions */
    qg__pg_put32(h + 4, 0);          /* no NULLs */
    qg__pg_put32(h + 8, (int32_t)elem);
    qg__pg_put32(h + 12, 0);         /* length, set at the end */
    qg__pg_put32(h + 16, 1);         /* lower bound */
    b->len = 0;
    return qg__pg_buf_add(b, h, sizeof h, COL_CAP);
}

void qg__pg_array_count(qg__pg_buf *b, size_t n)
{
    qg__pg_put32((unsigned char *)b->p + 12, (int32_t)n);
}

int qg__pg_array_add(qg__pg_buf *b, const void *p, size_t n)
{
    unsigned char l[4];
    qg__pg_put32(l, (int32_t)n);
    if (qg__pg_buf_add(b, l, 4, COL_CAP) != QG_OK)
        return QG_ENOMEM;
    return qg__pg_buf_add(b, p, n, COL_CAP);
}

/* The rows g->pick[first, first + k) as one statement of 23 arrays. */
int qg__pg_send_arrays(qg__pg *g, PGconn *c, const qg__ledger_item *it,
                       size_t first, size_t k, int settle, char *why,
                       size_t cap)
{
    const char *v[QG_PG_NCOLS];
    int len[QG_PG_NCOLS];
    int rc = QG_OK;
    for (int col = 0; col < QG_PG_NCOLS && rc == QG_OK; col++)
        rc = qg__pg_array_start(&g->col[col], col_type[col]);
    for (size_t i = first; i < first + k && rc == QG_OK; i++) {
        unsigned char num[14][8];
        row_params(&it[g->pick[i]].row, v, len, num);
        for (int col = 0; col < QG_PG_NCOLS && rc == QG_OK; col++)
            rc = qg__pg_array_add(&g->col[col], v[col], (size_t)len[col]);
    }
    if (rc != QG_OK) {
        snprintf(why, cap, "a batch of %zu rows does not fit the arrays' "
                 "bound (%zu MiB a column)", k, COL_CAP >> 20);
        return rc;
    }
    for (int col = 0; col < QG_PG_NCOLS; col++) {
        qg__pg_array_count(&g->col[col], k);
        v[col] = g->col[col].p;
        len[col] = (int)g->col[col].len;
    }
    if (!PQsendQueryPrepared(c, settle ? "qg_sta" : "qg_upa", QG_PG_NCOLS, v,
                             len, qg__pg_binary, 1))
        return qg__pg_fail(c, NULL, why, cap);
    return QG_OK;
}
