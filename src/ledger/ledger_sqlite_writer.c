/* ledger_sqlite_writer.c - the SQLite ledger's writer: a batch of rows
 * in one transaction, on the writer's connection (ledger_sqlite.h).
 *
 * A new decision row is inserted without reading anything first, 16 to
 * a statement where 16 come in a row (write_run); a settle, or a row
 * whose request id the file holds already, is written by an upsert
 * under the guards below, after the row it may replace has been read for
 * the history's rollup (ledger_sqlite_rollup.c).  The batch's
 * subject_rows fill and its rollup sums join the same transaction. */
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

/* A row once written is changed only by its own request: a whole row
 * (a decision) replaces only a refusal of the same subject (a refused
 * request decided again), or an admitted, unsettled row of the same
 * subject that it settles (the check row with its settle folded in, as a
 * spool replays it when the check row's commit had lost its answer:
 * ledger_backend.h); a settle changes only an admitted, unsettled row of
 * its subject ("" = not named: any).  Another subject's row, an admitted
 * row otherwise, a settled row are never overwritten: the statement then
 * changes nothing and the writer reports it (guard_refused).  The server
 * refuses a reused request id before it gets here (docs/decisions.md,
 * "Idempotency"); these guards hold even if it did not. */
static const char sql_upsert[] =
    "INSERT INTO requests (" ROW_COLS ") VALUES"
    " (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
    " ?17, ?18, ?19, ?20, ?21, ?22, ?23) ON CONFLICT(request_id) DO UPDATE"
    " SET subject = excluded.subject, org = excluded.org, plan = excluded.plan,"
    " rules_version = excluded.rules_version,"
    " weights_version = excluded.weights_version, model = excluded.model,"
    " \"window\" = excluded.\"window\", decision = excluded.decision,"
    " status = excluded.status, estimated = excluded.estimated,"
    " input_tokens = excluded.input_tokens,"
    " output_tokens = excluded.output_tokens,"
    " reserved_milli = excluded.reserved_milli,"
    " weight_milli = excluded.weight_milli,"
    " created_ms = excluded.created_ms, settled_ms = excluded.settled_ms,"
    " overage_milli = excluded.overage_milli,"
    " overage_price_micro = excluded.overage_price_micro,"
    " overage_cost_micro = excluded.overage_cost_micro,"
    " headroom_milli = excluded.headroom_milli, detail = excluded.detail,"
    " fallback = excluded.fallback"
    " WHERE requests.subject = excluded.subject AND (requests.decision <> 1"
    " OR (requests.status = 1 AND excluded.decision = 1"
    " AND excluded.status <> 1))";

/* A decision row whose request id the ledger does not hold yet (nearly
 * every one): inserted without reading anything first; when the id is
 * there (a refusal decided again) nothing changes and the writer reads
 * the row for the rollup, then runs sql_upsert. */
static const char sql_insert_new[] =
    "INSERT INTO requests (" ROW_COLS ") VALUES"
    " (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
    " ?17, ?18, ?19, ?20, ?21, ?22, ?23) ON CONFLICT(request_id) DO NOTHING";

/* INSERT_RUN new decision rows in one statement (sql_insert_new's
 * VALUES repeated; prepare_insert_run): each statement run costs SQLite
 * a fixed part (its program's start and end) that one row per statement
 * pays in full.  Measured with a C loop on the requests table and its
 * indexes, transactions of 512 rows of growing ids: 2.5 us per row one by
 * one, 1.7 us in statements of 16 (docs/benchmarks.md, "Ledger").  The
 * rows a run did not insert (an id the file holds already: a refusal
 * decided again, a replayed spool, or the same id twice in the run) are
 * found afterwards by their rowids, run_rest(). */
#define INSERT_RUN 16
#define ROW_PARAMS 23

/* The rowid of the row holding a request id (run_rest). */
static const char sql_rowid_of[] =
    "SELECT rowid FROM requests WHERE request_id = ?1";

/* A settle: the row is normally there already (its check's row was
 * queued before it); only the settle's columns change.  When the check's
 * row was lost in a crash, the settle's row is inserted whole. */
static const char sql_settle[] =
    "INSERT INTO requests (" ROW_COLS ") VALUES"
    " (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
    " ?17, ?18, ?19, ?20, ?21, ?22, ?23) ON CONFLICT(request_id) DO UPDATE"
    " SET status = excluded.status, estimated = excluded.estimated,"
    " input_tokens = excluded.input_tokens,"
    " output_tokens = excluded.output_tokens,"
    " weight_milli = excluded.weight_milli,"
    " settled_ms = excluded.settled_ms,"
    " overage_milli = excluded.overage_milli,"
    " overage_cost_micro = excluded.overage_cost_micro,"
    " detail = excluded.detail"
    " WHERE requests.decision = 1 AND requests.status = 1"
    " AND (excluded.subject = '' OR requests.subject = excluded.subject)";

/* Bind r to parameters base + 1 .. base + ROW_PARAMS of st (base 0: a
 * one-row statement; a run's row j: j * ROW_PARAMS). */
static int bind_row_at(sqlite3_stmt *st, int base, const qg_ledger_row *r)
{
    /* parameters 1-8: the texts, 9-21: the numbers, 22: detail, 23 */
    const struct { const char *f; size_t cap; } text[] = {
        { r->request_id, sizeof r->request_id },
        { r->subject, sizeof r->subject },
        { r->org, sizeof r->org },
        { r->plan, sizeof r->plan },
        { r->rules_version, sizeof r->rules_version },
        { r->weights_version, sizeof r->weights_version },
        { r->model, sizeof r->model },
        { r->window, sizeof r->window },
    };
    const int64_t num[] = {
        r->decision, r->status, r->estimated, r->input_tokens,
        r->output_tokens, r->reserved_milli, r->weight_milli, r->created_ms,
        r->settled_ms, r->overage_milli, r->overage_price_micro,
        r->overage_cost_micro, r->headroom_milli,
    };
    int rc = SQLITE_OK, p = base + 1;
    for (size_t k = 0; rc == SQLITE_OK && k < sizeof text / sizeof *text;
         k++)
        rc = qg__sq_bind_field(st, p++, text[k].f, text[k].cap);
    for (size_t k = 0; rc == SQLITE_OK && k < sizeof num / sizeof *num; k++)
        rc = sqlite3_bind_int64(st, p++, num[k]);
    if (rc == SQLITE_OK)
        rc = BIND_STR(st, base + 22, r->detail);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int(st, base + 23, r->fallback);
    return rc;
}

static int bind_row(sqlite3_stmt *st, const qg_ledger_row *r)
{
    return bind_row_at(st, 0, r);
}

/* sql_insert_new for INSERT_RUN rows of parameters (numbered in order:
 * row j's are j * ROW_PARAMS + 1 ..), as INSERT OR IGNORE: a statement
 * of several rows that a constraint could abort half way (ON CONFLICT
 * names only the id's; NOT NULL would abort) keeps a statement journal,
 * a copy of every page it changes, which SQLite spills to a temporary
 * file past 64 KB: with request ids at random places of their index, a
 * run of 16 touches more pages than that, and the pipelined ledger bench
 * fell from ~80k to ~60k rows/s.  OR IGNORE cannot abort, so there is no
 * journal; a row it passes over for any reason (its id, or a NOT NULL
 * this code never binds) goes through run_rest's upsert, which reports
 * the error the row would have raised. */
static int prepare_insert_run(qg__sq *s)
{
    static const char head[] =
        "INSERT OR IGNORE INTO requests (" ROW_COLS ") VALUES";
    char sql[sizeof head + INSERT_RUN * (2 * ROW_PARAMS + 3)];
    size_t n = 0;
    memcpy(sql, head, sizeof head - 1);
    n = sizeof head - 1;
    for (int j = 0; j < INSERT_RUN; j++) {
        sql[n++] = j ? ',' : ' ';
        sql[n++] = '(';
        for (int c = 0; c < ROW_PARAMS; c++) {
            if (c)
                sql[n++] = ',';
            sql[n++] = '?';
        }
        sql[n++] = ')';
    }
    sql[n] = '\0';
    return sqlite3_prepare_v3(s->wdb, sql, -1, SQLITE_PREPARE_PERSISTENT,
                              &s->insert_run, NULL);
}

/* The writer's statements, prepared once on its connection (so that
 * running them needs no parsing and little memory): SQLite's code. */
int qg__sq_writer_prepare(qg__sq *s)
{
    int rc = sqlite3_prepare_v3(s->wdb, sql_upsert, -1,
                                SQLITE_PREPARE_PERSISTENT, &s->upsert, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(s->wdb, sql_settle, -1,
                                SQLITE_PREPARE_PERSISTENT, &s->settle, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(s->wdb, sql_insert_new, -1,
                                SQLITE_PREPARE_PERSISTENT, &s->insert_new,
                                NULL);
    if (rc == SQLITE_OK)
        rc = prepare_insert_run(s);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(s->wdb, sql_rowid_of, -1,
                                SQLITE_PREPARE_PERSISTENT, &s->rowid_of, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(s->wdb, "BEGIN IMMEDIATE", -1,
                                SQLITE_PREPARE_PERSISTENT, &s->begin_st,
                                NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(s->wdb, "COMMIT", -1,
                                SQLITE_PREPARE_PERSISTENT, &s->commit_st,
                                NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v3(s->wdb, "ROLLBACK", -1,
                                SQLITE_PREPARE_PERSISTENT, &s->rollback_st,
                                NULL);
    return rc;
}

void qg__sq_writer_finalize(qg__sq *s)
{
    sqlite3_finalize(s->upsert);
    sqlite3_finalize(s->settle);
    sqlite3_finalize(s->insert_new);
    sqlite3_finalize(s->insert_run);
    sqlite3_finalize(s->rowid_of);
    sqlite3_finalize(s->begin_st);
    sqlite3_finalize(s->commit_st);
    sqlite3_finalize(s->rollback_st);
}

/* The statement of `it` changed nothing: a guard kept the row the ledger
 * holds for its request id.  That is expected for a settle repeated
 * after its row was settled (the same subject, or none named); anything
 * else is another request's row: `it` is marked refused.  held is that
 * row, as write_row read it just before the statement (the same
 * transaction: qg__sq_rollup_before). */
static void guard_refused(qg__ledger_item *it, const qg__sq_prior *held,
                          char *why, size_t whycap)
{
    const qg_ledger_row *r = &it->row;
    int same;
    if (!held->found)
        return;                  /* cannot happen: an insert would have */
    same = strncmp(held->subject, r->subject, sizeof r->subject) == 0;
    if (r->settle_only)
        it->refused = held->decision != 1 || (r->subject[0] && !same);
    else
        it->refused = 1;
    if (it->refused)
        snprintf(why, whycap, "request id %.80s "
                 "is held by a %s row of subject %.80s: the %s of "
                 "subject %.80s was not written",
                 r->request_id, held->decision == 1 ? "admitted" : "refused",
                 held->subject, r->settle_only ? "settle" : "row",
                 r->subject[0] ? r->subject : "(not named)");
}

/* Step a transaction-control statement (prepared once at open, so that
 * running it needs no parsing and little memory).  An SQLite code. */
static int run_ctl(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int batch_failed(qg__sq *s, int rc, char *why, size_t whycap)
{
    snprintf(why, whycap, "%s (SQLite error %d)",
             sqlite3_errmsg(s->wdb), sqlite3_extended_errcode(s->wdb));
    return qg__sq_map_rc(rc) == QG_OK ? QG_EIO : qg__sq_map_rc(rc);
}

/* Run st on the row (bound, stepped, reset): SQLite's code. */
static int step_row(sqlite3_stmt *st, const qg_ledger_row *r)
{
    int rc = bind_row(st, r);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* No row replaced: what a new row's counts go into the rollup with. */
static const qg__sq_prior no_prior;

/* A written row's counts into the rollup's sums (prior: the row it
 * replaced, if any): SQLite's code. */
static int counted(qg__sq *s, const qg_ledger_row *row,
                   const qg__sq_prior *prior)
{
    int rc = qg__sq_rollup_after(s, row, prior);
    return rc == QG_OK ? SQLITE_OK
                       : rc == QG_ENOMEM ? SQLITE_NOMEM : SQLITE_IOERR;
}

/* A row whose id the file may hold already (a settle, or a decision row
 * the insert did not take): the row it may replace is read first, then
 * the upsert runs, under its guards. */
static int write_over(qg__sq *s, qg__ledger_item *it, char *why,
                      size_t whycap)
{
    qg__sq_prior prior;
    int rc;
    prior.found = 0;
    if ((rc = qg__sq_rollup_before(s, &it->row, &prior)) != SQLITE_OK ||
        (rc = step_row(it->row.settle_only ? s->settle : s->upsert,
                       &it->row)) != SQLITE_OK)
        return rc;
    if (sqlite3_changes(s->wdb) == 0) {
        guard_refused(it, &prior, why, whycap);
        return SQLITE_OK;
    }
    return counted(s, &it->row, &prior);
}

/* One row of a batch, and its counts into the rollup's sums: a new
 * decision row is inserted at once; a settle, or a decision whose id is
 * there already, first reads the row it may replace. */
static int write_row(qg__sq *s, qg__ledger_item *it, char *why, size_t whycap)
{
    int rc;
    if (!it->row.settle_only) {
        if ((rc = step_row(s->insert_new, &it->row)) != SQLITE_OK)
            return rc;
        if (sqlite3_changes(s->wdb) == 1)
            return counted(s, &it->row, &no_prior);
    }
    return write_over(s, it, why, whycap);
}

/* The positions of the INSERT_RUN items from i on that one run statement
 * takes: decision rows (not settles), the merged items between them
 * passed over.  Returns INSERT_RUN, or 0 when a settle comes first or
 * fewer rows are left (they go one by one). */
static size_t run_at(const qg__ledger_item *it, size_t i, size_t n,
                     size_t idx[INSERT_RUN])
{
    size_t k = 0;
    for (; i < n && k < INSERT_RUN; i++) {
        if (it[i].merged)
            continue;
        if (it[i].row.settle_only)
            return 0;
        idx[k++] = i;
    }
    return k == INSERT_RUN ? k : 0;
}

/* The rowid of the row holding rid, or -1 (none): SQLite's code. */
static int rowid_of(qg__sq *s, const char *rid, size_t cap,
                    sqlite3_int64 *out)
{
    int rc = qg__sq_bind_field(s->rowid_of, 1, rid, cap);
    *out = -1;
    if (rc == SQLITE_OK && (rc = sqlite3_step(s->rowid_of)) == SQLITE_ROW) {
        *out = sqlite3_column_int64(s->rowid_of, 0);
        rc = SQLITE_DONE;
    }
    sqlite3_reset(s->rowid_of);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* A run statement inserted `inserted` of its rows, not all: those hold
 * the rowids last - inserted + 1 .. last, in the run's order (a new row
 * takes the largest rowid + 1, and nothing else inserts into requests
 * during the statement).  A row whose rowid is the next of them was
 * inserted; any other found its id in the file, or earlier in the run
 * (its lookup finds that row's rowid), and is written as write_row
 * writes a decision the insert did not take. */
static int run_rest(qg__sq *s, qg__ledger_item *it,
                    const size_t idx[INSERT_RUN], int inserted, char *why,
                    size_t whycap)
{
    sqlite3_int64 next = sqlite3_last_insert_rowid(s->wdb) - inserted + 1;
    int rc = SQLITE_OK;
    for (size_t j = 0; j < INSERT_RUN && rc == SQLITE_OK; j++) {
        qg__ledger_item *x = &it[idx[j]];
        sqlite3_int64 rowid;
        if ((rc = rowid_of(s, x->row.request_id, sizeof x->row.request_id,
                           &rowid)) != SQLITE_OK)
            break;
        if (inserted > 0 && rowid == next) {
            next++;
            rc = counted(s, &x->row, &no_prior);
        } else {
            rc = write_over(s, x, why, whycap);
        }
    }
    return rc;
}

/* INSERT_RUN decision rows (their positions in idx) in one statement. */
static int write_run(qg__sq *s, qg__ledger_item *it,
                     const size_t idx[INSERT_RUN], char *why, size_t whycap)
{
    int rc = SQLITE_OK, inserted;
    for (size_t j = 0; j < INSERT_RUN && rc == SQLITE_OK; j++)
        rc = bind_row_at(s->insert_run, (int)j * ROW_PARAMS,
                         &it[idx[j]].row);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s->insert_run);
    sqlite3_reset(s->insert_run);
    if (rc != SQLITE_DONE)
        return rc == SQLITE_ROW ? SQLITE_ERROR : rc;
    inserted = sqlite3_changes(s->wdb);
    if (inserted != INSERT_RUN)
        return run_rest(s, it, idx, inserted, why, whycap);
    for (size_t j = 0; j < INSERT_RUN; j++)
        if ((rc = counted(s, &it[idx[j]].row, &no_prior)) != SQLITE_OK)
            return rc;
    return SQLITE_OK;
}

/* The row statements hold pointers into the batch's rows (SQLITE_STATIC):
 * let go of them before the batch is handed back. */
static void clear_row_bindings(qg__sq *s)
{
    sqlite3_clear_bindings(s->upsert);
    sqlite3_clear_bindings(s->settle);
    sqlite3_clear_bindings(s->insert_new);
    sqlite3_clear_bindings(s->insert_run);
    sqlite3_clear_bindings(s->rowid_of);
}

/* The writer's page cache after a commit of n rows: it may grow or
 * shrink (ledger_sqlite_pcache.c), which the operator is told. */
static void cache_count(qg__sq *s, size_t n)
{
    uint64_t misses = 0, rows = 0;
    int was = atomic_load_explicit(&s->cache.kb, memory_order_relaxed);
    int kb = qg__sq_cache_count(&s->cache, s->wdb, n, &rows, &misses);
    if (kb)
        qg__sq_log(s, "ledger %s: the writer's page cache %s to %d MiB "
                   "(its last %llu rows read %llu pages from the file)",
                   s->path, kb > was ? "grows" : "shrinks", kb / 1024,
                   (unsigned long long)rows, (unsigned long long)misses);
}

/* Write n rows in one transaction (ledger_backend.h).  Returns 0 (why:
 * the last row a guard kept out, or "") or a QG error with why.  SQLite's
 * file is local: it is never "unreachable" (QG_ELEDGER). */
int qg__sq_write_batch(void *b, qg__ledger_item *it, size_t n,
                       const qg__spool_mark *mark, char *why, size_t whycap)
{
    qg__sq *s = b;
    size_t i;
    int rc;
    (void)mark;
    why[0] = '\0';
    /* A ROLLBACK that failed (out of memory, I/O error) leaves the
     * transaction open, and every later BEGIN would fail: end it first. */
    if (!sqlite3_get_autocommit(s->wdb) &&
        (rc = run_ctl(s->rollback_st)) != SQLITE_OK &&
        !sqlite3_get_autocommit(s->wdb))
        return batch_failed(s, rc, why, whycap);
    if ((rc = run_ctl(s->begin_st)) != SQLITE_OK)
        return batch_failed(s, rc, why, whycap);
    for (i = 0; i < n; i++)
        it[i].refused = 0;   /* a merged item shares its row's fate */
    for (i = 0; i < n;) {
        size_t idx[INSERT_RUN];
        if (it[i].merged) {
            i++;
        } else if (run_at(it, i, n, idx)) {
            if ((rc = write_run(s, it, idx, why, whycap)) != SQLITE_OK)
                goto fail;
            i = idx[INSERT_RUN - 1] + 1;
        } else {
            if ((rc = write_row(s, &it[i], why, whycap)) != SQLITE_OK)
                goto fail;
            i++;
        }
    }
    clear_row_bindings(s);
    if ((rc = qg__sq_rollup_flush(s)) != SQLITE_OK ||
        (rc = qg__sq_subject_rows_flush(s, n)) != SQLITE_OK ||
        (rc = run_ctl(s->commit_st)) != SQLITE_OK)
        goto fail;
    qg__sq_subject_rows_done(s, 1);
    qg__sq_rollup_done(s, 1);
    cache_count(s, n);
    return QG_OK;
fail:
    qg__sq_rollup_clear(s);
    qg__sq_subject_rows_done(s, 0);
    qg__sq_rollup_done(s, 0);
    rc = batch_failed(s, rc, why, whycap);
    clear_row_bindings(s);
    if (!sqlite3_get_autocommit(s->wdb))
        run_ctl(s->rollback_st);   /* if this fails too: the next batch */
    return rc;
}
