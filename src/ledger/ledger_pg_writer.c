/* ledger_pg_writer.c - write_batch of the PostgreSQL ledger: a batch of
 * rows in one transaction, with the guards every backend keeps
 * (ledger_backend.h) and the spool mark in the same transaction.
 *
 * The guards are the SQLite backend's, as statements (ledger_pg_rows.c):
 * a whole row is INSERT ... ON CONFLICT (request_id) DO UPDATE ... WHERE
 * the held row is a refusal of the same subject; a settle is the same with its own
 * columns, WHERE the held row is admitted, unsettled and of the settle's
 * subject (or any, when the settle names none).  A row the WHERE stops
 * changed nothing; PostgreSQL still locks the row it conflicted with
 * until our commit, so reading its owner afterwards in the same
 * transaction gives the exact answer guard_refused gives in SQLite: the
 * row is refused, except a settle that finds its admitted row settled
 * already (a repeated settle).
 *
 * One statement may not touch a row twice (ON CONFLICT DO UPDATE refuses
 * to), and a refusal must be judged before a later row of the same id
 * changes the held row: the batch is cut into rounds, in which every id
 * is unique (a row goes one round after the previous row of its id), and
 * the rounds run in order.  Nearly every batch is one round.
 *
 * A round's rows of one kind (whole rows, settles) are sent in one of two
 * ways (qg__pg_write_mode; the figures are in docs/ledger-postgresql.md):
 * as one statement of arrays (INSERT ... SELECT FROM unnest($1, ...,
 * $23) ... RETURNING request_id: a row not returned was stopped by a
 * guard) when there are QG_PG_ARRAY_MIN or more, else one prepared
 * statement per row, pipelined (a row whose command tag says 0 was
 * stopped).  Either way BEGIN, the round's statements and the mark go in
 * one round trip (libpq's pipeline mode), the owners of stopped rows in
 * a second one when there are any, COMMIT in the last.  All parameters
 * and arrays are binary: no number is printed or parsed, no text is
 * escaped.
 *
 * Several instances may write one database.  Every row a batch writes
 * moves its subject's rollup slots (usage_slots, by triggers: one upsert
 * per statement and kind of row), so a batch first locks its subjects,
 * in one order (send_lock, in the trip of BEGIN): two writers that meet
 * on a subject take turns instead of each holding a slot the other
 * waits for, the deadlock PostgreSQL would end after deadlock_timeout
 * (1 s) by rolling one batch back.
 *
 * A batch that fails before COMMIT was sent committed nothing; when it
 * failed because an old connection had died (the server restarted since
 * the last batch), it is written once more on a new connection.  One the
 * server rolled back for a conflict with another transaction (a deadlock
 * with a session that does not lock subjects, a serialization failure)
 * is written again at once, up to ROLLED_BACK_TRIES times, and logged. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <xxhash.h>

#include "quotagate.h"
#include "ledger_pg.h"

/* --------------------------------------------------------- the rounds */

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    void *q;
    if (want <= *cap)
        return QG_OK;
    if (!(q = realloc(*p, want * elem)))
        return QG_ENOMEM;
    *p = q;
    *cap = want;
    return QG_OK;
}

static uint64_t id_hash(const char *id, size_t len)
{
    return XXH3_64bits(id, len);
}


/* g->round[i]: the round of item i (a row one round after the previous
 * row of its id; merged items and rows that cannot be stored
 * UINT32_MAX); *nrounds.  A row whose text is not valid UTF-8 would make
 * the server refuse the statement, and with it the batch, every time the
 * front tries it again: it is not sent, and is `refused` (not written;
 * logged), the rest of the batch goes on.  Open addressing on
 * g->map: item index + 1 of the latest row of each id.  Also makes room
 * in g->pick for 2n items: [0, n) the rows of a round's array statements,
 * [n, 2n) the rows the guards stopped. */
static int rounds(qg__pg *g, qg__ledger_item *it, size_t n,
                  uint32_t *nrounds)
{
    size_t cap = 16, mask;
    *nrounds = 0;
    while (cap < 2 * n)
        cap *= 2;
    if (grow((void **)&g->map, &g->map_cap, cap, sizeof *g->map) ||
        grow((void **)&g->round, &g->round_cap, n ? n : 1,
             sizeof *g->round) ||
        grow((void **)&g->pick, &g->pick_cap, 2 * n + 2, sizeof *g->pick))
        return QG_ENOMEM;
    memset(g->map, 0, cap * sizeof *g->map);
    mask = cap - 1;
    for (size_t i = 0; i < n; i++) {
        const char *id = it[i].row.request_id;
        size_t len = strnlen(id, sizeof it[i].row.request_id), h;
        const char *bad;
        if (it[i].merged) {
            g->round[i] = UINT32_MAX;
            continue;
        }
        if ((bad = qg__pg_bad_text(&it[i].row)) != NULL) {
            char hex[2 * 16 + 1];
            for (size_t j = 0; j < 16 && j < len; j++)
                snprintf(hex + 2 * j, 3, "%02x", (unsigned char)id[j]);
            hex[2 * (len < 16 ? len : 16)] = '\0';
            qg__pg_log(g, "ledger %s: a row not written: its %s is not "
                       "valid UTF-8 (request id starting with bytes %s)",
                       g->shown, bad, hex);
            it[i].refused = 1;
            g->round[i] = UINT32_MAX;
            continue;
        }
        g->round[i] = 0;
        for (h = (size_t)id_hash(id, len) & mask;; h = (h + 1) & mask) {
            uint32_t j = g->map[h];
            if (j == 0)
                break;
            if (strncmp(it[j - 1].row.request_id, id,
                        sizeof it[i].row.request_id) == 0) {
                g->round[i] = g->round[j - 1] + 1;
                break;
            }
        }
        g->map[h] = (uint32_t)i + 1;
        if (g->round[i] + 1 > *nrounds)
            *nrounds = g->round[i] + 1;
    }
    return QG_OK;
}


/* ------------------------------------------------------------ results */

/* A statement sent in the current round trip, and what it was. */
typedef struct sent {
    int kind;                /* SENT_CTL, SENT_ROW, SENT_ARRAY, SENT_OWNER */
    size_t first, count;     /* ROW: its item; ARRAY, OWNER: a g->pick
                                range */
} sent;
enum { SENT_CTL, SENT_ROW, SENT_ARRAY, SENT_OWNER };

/* One transaction's state on the writer's connection. */
typedef struct txn {
    qg__pg *g;
    PGconn *c;
    qg__ledger_item *it;
    size_t n;                /* items; stopped rows go to g->pick[n...] */
    sent *q;                 /* this round trip's statements */
    size_t nq, qcap;
    char conflict[512];      /* the last refused row, for the log */
    char state[6];           /* the first failed statement's SQLSTATE */
} txn;

/* The result of the next statement of the pipeline, having read the NULL
 * that ends it.  NULL when the connection failed. */
static PGresult *next_result(PGconn *c)
{
    PGresult *r = PQgetResult(c), *end;
    if (!r || PQresultStatus(r) == PGRES_PIPELINE_SYNC)
        return r;
    while ((end = PQgetResult(c)) != NULL)   /* normally none */
        PQclear(end);
    return r;
}

/* Read results up to and including the pipeline's sync point.  0, or -1
 * when the connection failed or nothing is pending (two NULLs in a row:
 * one ends each statement's results, two mean the pipeline is empty). */
static int drain_to_sync(PGconn *c)
{
    for (int nulls = 0;;) {
        PGresult *r = PQgetResult(c);
        ExecStatusType st;
        if (!r) {
            if (PQstatus(c) != CONNECTION_OK || ++nulls > 1)
                return -1;
            continue;
        }
        nulls = 0;
        st = PQresultStatus(r);
        PQclear(r);
        if (st == PGRES_PIPELINE_SYNC)
            return 0;
    }
}

/* The rows of an array statement (g->pick[first, first + count)) that its
 * RETURNING did not name: a guard stopped them; appended at
 * g->pick[t->n + *nstop]. */
static int missing_rows(txn *t, const PGresult *r, size_t first,
                        size_t count, size_t *nstop)
{
    qg__pg *g = t->g;
    size_t rows = (size_t)PQntuples(r), cap = 16, mask;
    while (cap < 2 * rows)
        cap *= 2;
    if (grow((void **)&g->map, &g->map_cap, cap, sizeof *g->map))
        return QG_ENOMEM;
    memset(g->map, 0, cap * sizeof *g->map);
    mask = cap - 1;
    for (size_t i = 0; i < rows; i++) {
        size_t h = (size_t)id_hash(PQgetvalue(r, (int)i, 0),
                                   (size_t)PQgetlength(r, (int)i, 0)) & mask;
        while (g->map[h])
            h = (h + 1) & mask;
        g->map[h] = (uint32_t)i + 1;
    }
    for (size_t i = first; i < first + count; i++) {
        const char *id = t->it[g->pick[i]].row.request_id;
        size_t len = strnlen(id, sizeof t->it[0].row.request_id), h;
        int found = 0;
        for (h = (size_t)id_hash(id, len) & mask; g->map[h] && !found;
             h = (h + 1) & mask) {
            int j = (int)g->map[h] - 1;
            found = (size_t)PQgetlength(r, j, 0) == len &&
                    memcmp(PQgetvalue(r, j, 0), id, len) == 0;
        }
        if (!found)
            g->pick[t->n + (*nstop)++] = g->pick[i];
    }
    return QG_OK;
}

/* A stopped row, judged by the row its id holds (locked by us since the
 * statement): refused, except a repeated settle (ledger_backend.h). */
static void judge(txn *t, qg__ledger_item *it, const PGresult *r, int i)
{
    const qg_ledger_row *row = &it->row;
    char owner[256];
    int decision;
    if (PQgetisnull(r, i, 0)) {
        it->refused = 0;     /* cannot happen: the insert would have run */
        return;
    }
    qg__pg_text(r, i, 0, owner, sizeof owner);
    decision = (int)qg__pg_int(r, i, 1);
    if (row->settle_only)
        it->refused = decision != 1 ||
                      (row->subject[0] &&
                       strncmp(owner, row->subject, sizeof row->subject));
    else
        it->refused = 1;
    if (it->refused)
        snprintf(t->conflict, sizeof t->conflict, "request id %.80s is held "
                 "by a %s row of subject %.80s: the %s of subject %.80s was "
                 "not written", row->request_id,
                 decision == 1 ? "admitted" : "refused", owner,
                 row->settle_only ? "settle" : "row",
                 row->subject[0] ? row->subject : "(not named)");
}

static int push(txn *t, int kind, size_t first, size_t count)
{
    if (t->nq == t->qcap) {
        size_t cap = t->qcap ? 2 * t->qcap : 64;
        sent *q = realloc(t->q, cap * sizeof *q);
        if (!q)
            return QG_ENOMEM;
        t->q = q;
        t->qcap = cap;
    }
    t->q[t->nq].kind = kind;
    t->q[t->nq].first = first;
    t->q[t->nq].count = count;
    t->nq++;
    return QG_OK;
}

static int send_ctl(txn *t, const char *sql, char *why, size_t cap)
{
    if (!PQsendQueryParams(t->c, sql, 0, NULL, NULL, NULL, NULL, 0))
        return qg__pg_fail(t->c, NULL, why, cap);
    return push(t, SENT_CTL, 0, 0);
}

static int send_mark(txn *t, const qg__spool_mark *m, char *why, size_t cap)
{
    unsigned char seq[8];
    const char *v[2] = {m->spool_id, (const char *)seq};
    int len[2] = {(int)strlen(m->spool_id), 8};
    qg__pg_put64(seq, m->seq);
    if (!PQsendQueryPrepared(t->c, "qg_mark", 2, v, len, qg__pg_binary, 1))
        return qg__pg_fail(t->c, NULL, why, cap);
    return push(t, SENT_CTL, 0, 0);
}

/* Sync and read this round trip's results: rows the guards stopped are
 * appended at g->pick[t->n + *nstop]; an owner query's rows judge theirs.
 * The first failure is returned (the statements after it were aborted by
 * the server). */
static int finish_trip(txn *t, size_t *nstop, char *why, size_t cap)
{
    qg__pg *g = t->g;
    int rc = QG_OK;
    if (!PQpipelineSync(t->c))
        return qg__pg_fail(t->c, NULL, why, cap);
    for (size_t i = 0; i < t->nq; i++) {
        const sent *s = &t->q[i];
        PGresult *r = next_result(t->c);
        ExecStatusType st = PQresultStatus(r);
        if (!r || st == PGRES_PIPELINE_SYNC) {   /* lost, or out of step */
            if (rc == QG_OK)
                rc = qg__pg_fail(t->c, NULL, why, cap);
            if (rc == QG_OK) {
                snprintf(why, cap, "the pipeline's results are out of step");
                rc = QG_EIO;
            }
            PQclear(r);
            t->nq = 0;   /* the pipeline stays on: qg__pg_use drops it */
            return rc;
        }
        if (rc == QG_OK && st != PGRES_COMMAND_OK &&
            st != PGRES_TUPLES_OK) {
            const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            snprintf(t->state, sizeof t->state, "%s", state ? state : "");
            rc = qg__pg_fail(t->c, r, why, cap);
        }
        if (rc == QG_OK) {
            if (s->kind == SENT_ROW && strcmp(PQcmdTuples(r), "0") == 0)
                g->pick[t->n + (*nstop)++] = (uint32_t)s->first;
            else if (s->kind == SENT_ARRAY &&
                     (size_t)PQntuples(r) < s->count)
                rc = missing_rows(t, r, s->first, s->count, nstop);
            else if (s->kind == SENT_OWNER)
                for (size_t j = 0; j < s->count && (int)j < PQntuples(r);
                     j++)
                    judge(t, &t->it[g->pick[s->first + j]], r, (int)j);
        }
        PQclear(r);
    }
    t->nq = 0;
    if (drain_to_sync(t->c) != 0 && rc == QG_OK)
        rc = qg__pg_fail(t->c, NULL, why, cap);
    return rc;
}

/* Lock the subjects of the batch's rows, in one order (qg_lock): the
 * subjects the rows name, and those of the rows held by the settles that
 * name none.  Sent right after BEGIN. */
static int send_lock(txn *t, char *why, size_t cap)
{
    qg__pg *g = t->g;
    qg__pg_buf *named = &g->col[0], *ids = &g->scratch;
    const char *v[2];
    int len[2], rc;
    size_t nn = 0, ni = 0;
    if ((rc = qg__pg_array_start(named, QG_PG_TEXT)) != QG_OK ||
        (rc = qg__pg_array_start(ids, QG_PG_TEXT)) != QG_OK)
        goto nomem;
    for (size_t i = 0; i < t->n; i++) {
        const qg_ledger_row *row = &t->it[i].row;
        if (g->round[i] == UINT32_MAX)     /* merged, or not sent */
            continue;
        if (row->subject[0]) {
            rc = qg__pg_array_add(named, row->subject,
                                  strnlen(row->subject, sizeof row->subject));
            nn++;
        } else {
            rc = qg__pg_array_add(ids, row->request_id,
                                  strnlen(row->request_id,
                                          sizeof row->request_id));
            ni++;
        }
        if (rc != QG_OK)
            goto nomem;
    }
    qg__pg_array_count(named, nn);
    qg__pg_array_count(ids, ni);
    v[0] = named->p;
    len[0] = (int)named->len;
    v[1] = ids->p;
    len[1] = (int)ids->len;
    if (!PQsendQueryPrepared(t->c, ni ? "qg_lock_held" : "qg_lock",
                             ni ? 2 : 1, v, len, qg__pg_binary, 1))
        return qg__pg_fail(t->c, NULL, why, cap);
    return push(t, SENT_CTL, 0, 0);
nomem:
    snprintf(why, cap, "out of memory");
    return rc;
}

/* Ask who holds the ids of the stopped rows g->pick[from, to) and judge
 * them: one round trip. */
static int ask_owners(txn *t, size_t from, size_t to, char *why, size_t cap)
{
    qg__pg *g = t->g;
    const char *v[1];
    int len[1], rc;
    size_t none = 0;
    if ((rc = qg__pg_array_start(&g->scratch, QG_PG_TEXT)) != QG_OK)
        return rc;
    for (size_t i = from; i < to && rc == QG_OK; i++) {
        const char *id = t->it[g->pick[i]].row.request_id;
        rc = qg__pg_array_add(&g->scratch, id,
                       strnlen(id, sizeof t->it[0].row.request_id));
    }
    if (rc != QG_OK) {
        snprintf(why, cap, "out of memory");
        return rc;
    }
    qg__pg_array_count(&g->scratch, to - from);
    v[0] = g->scratch.p;
    len[0] = (int)g->scratch.len;
    if (!PQsendQueryPrepared(t->c, "qg_own", 1, v, len, qg__pg_binary, 1))
        return qg__pg_fail(t->c, NULL, why, cap);
    if ((rc = push(t, SENT_OWNER, from, to - from)) != QG_OK)
        return rc;
    return finish_trip(t, &none, why, cap);
}

/* Send round r's rows: the whole rows, then the settles (their items
 * collected in g->pick[0, n)), each kind as one array statement or as
 * one prepared statement per row (qg__pg_write_mode). */
static int send_round(txn *t, uint32_t r, char *why, size_t cap)
{
    qg__pg *g = t->g;
    size_t k = 0;
    int rc = QG_OK;
    for (int settle = 0; settle < 2 && rc == QG_OK; settle++) {
        size_t first = k;
        int rows_one_by_one;
        for (size_t i = 0; i < t->n; i++)
            if (g->round[i] == r && !!t->it[i].row.settle_only == settle)
                g->pick[k++] = (uint32_t)i;
        if (k == first)
            continue;
        rows_one_by_one = g->mode == QG_PG_WRITE_PIPELINE ||
                          (g->mode == QG_PG_WRITE_AUTO &&
                           k - first < QG_PG_ARRAY_MIN);
        if (!rows_one_by_one) {
            if ((rc = qg__pg_send_arrays(g, t->c, t->it, first, k - first,
                                         settle, why, cap)) == QG_OK)
                rc = push(t, SENT_ARRAY, first, k - first);
            continue;
        }
        for (size_t j = first; j < k && rc == QG_OK; j++) {
            if (!qg__pg_send_row(t->c, &t->it[g->pick[j]].row))
                return qg__pg_fail(t->c, NULL, why, cap);
            rc = push(t, SENT_ROW, g->pick[j], 1);
        }
    }
    return rc;
}

/* The batch as one transaction: BEGIN, each round (the mark with the
 * last), the owners of stopped rows after their round, COMMIT; the
 * subjects are locked first (send_lock).  state: the SQLSTATE of the
 * statement that failed ("" when none did). */
static int write_txn(qg__pg *g, qg__ledger_item *it, size_t n,
                     const qg__spool_mark *mark, int *commit_sent,
                     char state[6], char *why, size_t cap)
{
    txn t = {g, g->w.c, it, n, NULL, 0, 0, "", ""};
    uint32_t nr = 0;
    size_t none = 0;
    int rc;
    for (size_t i = 0; i < n; i++)
        it[i].refused = 0;
    if ((rc = rounds(g, it, n, &nr)) != QG_OK) {
        snprintf(why, cap, "out of memory");
        return rc;
    }
    if (!PQenterPipelineMode(t.c))
        return qg__pg_fail(t.c, NULL, why, cap);
    rc = send_ctl(&t, "BEGIN", why, cap);
    if (rc == QG_OK)
        rc = send_lock(&t, why, cap);
    for (uint32_t r = 0; rc == QG_OK && (r < nr || r == 0); r++) {
        size_t nstop = 0;
        if (r < nr)
            rc = send_round(&t, r, why, cap);
        if (rc == QG_OK && mark && r + 1 >= nr)
            rc = send_mark(&t, mark, why, cap);
        if (rc == QG_OK)
            rc = finish_trip(&t, &nstop, why, cap);
        if (rc == QG_OK && nstop)
            rc = ask_owners(&t, n, n + nstop, why, cap);
    }
    if (rc == QG_OK) {
        *commit_sent = 1;
        rc = send_ctl(&t, "COMMIT", why, cap);
        if (rc == QG_OK)
            rc = finish_trip(&t, &none, why, cap);
    }
    memcpy(state, t.state, sizeof t.state);
    /* statements sent and not read (a failure while sending) */
    if (t.nq && PQstatus(t.c) == CONNECTION_OK &&
        (!PQpipelineSync(t.c) || drain_to_sync(t.c) != 0))
        qg__pg_fail(t.c, NULL, NULL, 0);
    free(t.q);
    if (PQstatus(t.c) == CONNECTION_OK && PQexitPipelineMode(t.c) &&
        rc != QG_OK && PQtransactionStatus(t.c) != PQTRANS_IDLE)
        PQclear(PQexec(t.c, "ROLLBACK"));
    /* a connection left in a pipeline or a transaction is not used
     * again: qg__pg_use makes a new one */
    if (rc == QG_OK) {
        for (size_t i = 0; i < n; i++)
            if (it[i].merged)
                it[i].refused = it[it[i].merged - 1].refused;
        snprintf(why, cap, "%s", t.conflict);
    }
    return rc;
}

/* How many times a batch the server rolled back for a conflict with
 * another transaction is written again before its rows fail. */
#define ROLLED_BACK_TRIES 5

int qg__pg_write_batch(void *b, qg__ledger_item *it, size_t n,
                       const qg__spool_mark *mark, char *why, size_t whycap)
{
    qg__pg *g = b;
    int rc, reconnected = 0, rollbacks = 0;
    pthread_mutex_lock(&g->w.mu);
    for (;;) {
        int fresh = !g->w.c, commit_sent = 0;
        char state[6] = "";
        const char *conflict;
        if ((rc = qg__pg_use(g, &g->w, why, whycap)) != QG_OK)
            break;
        rc = write_txn(g, it, n, mark, &commit_sent, state, why, whycap);
        if (rc == QG_OK)
            break;
        /* SQLSTATE class 40: the server rolled the transaction back for a
         * conflict with another; nothing of it was committed, and the
         * same batch may well go through on a second try */
        conflict = strcmp(state, "40P01") == 0   ? "a deadlock"
                   : strcmp(state, "40001") == 0 ? "a serialization failure"
                                                 : NULL;
        if (conflict && rollbacks < ROLLED_BACK_TRIES) {
            rollbacks++;
            qg__pg_log(g, "ledger %s: the server rolled back a batch of %zu "
                       "rows for %s (SQLSTATE %s); writing it again (try "
                       "%d): %s", g->shown, n, conflict, state,
                       rollbacks + 1, why);
            continue;
        }
        if (rc == QG_ELEDGER)
            qg__pg_drop(&g->w);
        /* nothing was committed unless COMMIT was sent: a batch that met
         * a connection dead since the last one is written again, once */
        if (rc != QG_ELEDGER || fresh || commit_sent || reconnected)
            break;
        reconnected = 1;
    }
    pthread_mutex_unlock(&g->w.mu);
    return rc;
}
