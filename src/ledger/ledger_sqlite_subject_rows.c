/* ledger_sqlite_subject_rows.c - a subject's rows by time (subject_rows,
 * schema 10), filled by the writer in subject order once per interval.
 *
 * Why: an index on requests (subject, created_ms) takes every row at its
 * subject's place in the B-tree, so a commit of N rows over many subjects
 * dirties about N leaf pages, each written to the WAL and checkpointed:
 * at 1,000 subjects 1.6 page writes and 1.8 page reads per row, a third
 * of the gateway's CPU per check (docs/benchmarks.md, "Ledger").  The
 * rows are appended to requests instead, and every subject_index_ms (or
 * subject_index_rows rows) the rows above the mark go into subject_rows
 * in one INSERT ... SELECT ordered by its key, in the batch's own
 * transaction: each subject's leaf is written once per interval, not
 * once per row.
 *
 * Readers (sql_latest, sql_scan_entity) take the indexed part from
 * subject_rows and the tail, the rows above subject_rows_mark (at most one
 * interval of them), by rowid: one statement, one snapshot, so a row is
 * read from exactly one of the two.  An update that moves an indexed row
 * in time (a refusal decided again: sql_upsert sets created_ms) moves its
 * entry by the trigger requests_subject_rows; rows are never deleted.
 * At open the rows above the mark are filled first (catch_up): the last
 * interval's after a stop, all of them after another program appended
 * rows. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

#define DEFAULT_ROWS 8192
#define DEFAULT_MS 250
/* At most 8 x every_rows rows per fill (65,536 by default): rows written
 * by another program (a generated or imported ledger) are taken in steps,
 * not in one long transaction the writer's batches would wait for. */
#define FILL_STEPS 8

static const char sql_fill[] =
    "INSERT OR IGNORE INTO subject_rows (subject, created_ms, seq)"
    " SELECT subject, created_ms, rowid FROM requests"
    " WHERE rowid > ?1 AND rowid <= ?2 ORDER BY subject, created_ms, rowid";

static const char sql_top[] = "SELECT coalesce(max(rowid), 0) FROM requests";

static const char sql_mark[] = "UPDATE subject_rows_mark SET seq = ?1";

static const char sql_read_mark[] = "SELECT seq FROM subject_rows_mark";

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int qg__sq_subject_rows_prepare(qg__sq *s)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    sqlite3_stmt *st = NULL;
    int rc;
    x->every_rows = s->o.subject_index_rows > 0 ? s->o.subject_index_rows
                                                : DEFAULT_ROWS;
    x->every_ms = s->o.subject_index_ms > 0 ? s->o.subject_index_ms
                                            : DEFAULT_MS;
    if (sqlite3_prepare_v3(s->wdb, sql_fill, -1, SQLITE_PREPARE_PERSISTENT,
                           &x->fill, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_top, -1, SQLITE_PREPARE_PERSISTENT,
                           &x->top, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_mark, -1, SQLITE_PREPARE_PERSISTENT,
                           &x->mark_st, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->wdb, sql_read_mark, -1, &st, NULL) != SQLITE_OK)
        return QG_EIO;
    rc = sqlite3_step(st);
    x->mark = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW)
        return QG_EIO;
    x->pending = -1;
    x->waiting = 0;
    x->since_ms = 0;
    return QG_OK;
}

void qg__sq_subject_rows_finalize(qg__sq *s)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    sqlite3_finalize(x->fill);
    sqlite3_finalize(x->top);
    sqlite3_finalize(x->mark_st);
    x->fill = x->top = x->mark_st = NULL;
}

static int step_done(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* One fill, in the open transaction: the rows above the mark, at most a
 * step of them, into subject_rows, and the mark moved past them.  *to:
 * the new mark (the old one when no row is above it).  SQLite's code. */
static int fill_step(qg__sq_subject_rows *x, int64_t *to)
{
    int64_t top;
    int rc;
    *to = x->mark;
    if ((rc = sqlite3_step(x->top)) != SQLITE_ROW) {
        sqlite3_reset(x->top);
        return rc;
    }
    top = sqlite3_column_int64(x->top, 0);
    sqlite3_reset(x->top);
    if (top <= x->mark)
        return SQLITE_OK;
    if (top - x->mark > (int64_t)x->every_rows * FILL_STEPS)
        top = x->mark + (int64_t)x->every_rows * FILL_STEPS;
    sqlite3_bind_int64(x->fill, 1, x->mark);
    sqlite3_bind_int64(x->fill, 2, top);
    sqlite3_bind_int64(x->mark_st, 1, top);
    if ((rc = step_done(x->fill)) != SQLITE_OK ||
        (rc = step_done(x->mark_st)) != SQLITE_OK)
        return rc;
    *to = top;
    return SQLITE_OK;
}

/* At open, before the writer starts: every row above the mark into
 * subject_rows, a fill step per transaction, so that the reads find at
 * most an interval's rows above the mark from then on.  After a normal
 * stop those are the last interval's rows; after another program
 * appended rows (a generated or imported ledger), all of them.  Returns
 * the number of rows filled, or -1 with SQLite's reason in why. */
int64_t qg__sq_subject_rows_catch_up(qg__sq *s, char *why, size_t whycap)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    int64_t done = 0, to;
    for (;;) {
        if (sqlite3_exec(s->wdb, "BEGIN IMMEDIATE", NULL, NULL, NULL) !=
            SQLITE_OK) {
            snprintf(why, whycap, "%s", sqlite3_errmsg(s->wdb));
            return -1;
        }
        if (fill_step(x, &to) != SQLITE_OK ||
            sqlite3_exec(s->wdb, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
            /* the reason before the ROLLBACK clears it */
            snprintf(why, whycap, "%s", sqlite3_errmsg(s->wdb));
            sqlite3_exec(s->wdb, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
        if (to == x->mark)
            return done;
        done += to - x->mark;
        x->mark = to;
    }
}

/* In the batch's transaction, after its rows (rows of them): a fill when
 * due.  SQLite's code. */
int qg__sq_subject_rows_flush(qg__sq *s, size_t rows)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    int64_t now = mono_ms(), to;
    int rc;
    x->pending = -1;
    if (x->waiting == 0)
        x->since_ms = now;
    x->waiting += rows;
    if (x->waiting < (size_t)x->every_rows && now - x->since_ms < x->every_ms)
        return SQLITE_OK;
    if ((rc = fill_step(x, &to)) != SQLITE_OK)
        return rc;
    x->pending = to;         /* the mark once committed; waiting restarts */
    return SQLITE_OK;
}

/* After the batch's transaction: committed (ok) or rolled back. */
void qg__sq_subject_rows_done(qg__sq *s, int ok)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    if (ok && x->pending >= 0) {
        x->mark = x->pending;
        x->waiting = 0;     /* more above a step: at the next fill */
    }
    x->pending = -1;
}
