/* ledger_sqlite_subject_rows.c - a subject's rows by time (subject_rows,
 * schema 10), filled by the writer in subject order once per interval,
 * in slices of subjects over consecutive batches (schema 12).
 *
 * Why: an index on requests (subject, created_ms) takes every row at its
 * subject's place in the B-tree, so a commit of N rows over many subjects
 * dirties about N leaf pages, each written to the WAL and checkpointed:
 * at 1,000 subjects 1.6 page writes and 1.8 page reads per row, a third
 * of the gateway's CPU per check (docs/benchmarks.md, "Ledger").  The
 * rows are appended to requests instead, and every subject_index_ms (or
 * subject_index_rows rows) the rows above the mark go into subject_rows
 * in INSERT ... SELECT ordered by its key, in a batch's own transaction:
 * each subject's leaf is written once per interval, not once per row.
 *
 * Slices (schema 12).  Once subject_rows holds days of rows, each
 * subject's newest leaf is a page of its own, and a fill over 1,000
 * subjects wrote 1,000 pages in one batch: 10-15 ms of filling and a
 * 10 ms commit that the batch's settles waited for, 2-3 times a second
 * (the check+settle p99 of an aged ledger, docs/benchmarks.md, "An aged
 * ledger").  So a round of filling is cut by subject name into up to
 * QG_SQ_SLICES slices, slice j the subjects from lo[j] up to lo[j + 1],
 * and each batch fills one slice: the same pages in all, fewer per batch.
 * Every slice has its mark (subject_rows_mark: lo, seq).  The cut is
 * made at a round's start, when every mark is the same, from the names
 * of QG_SQ_SAMPLE rows of the round spread evenly; with fewer than
 * SLICE_DISTINCT different names among them the round is one slice (a
 * few subjects share a few pages, and each slice reads all the round's
 * rows again).
 *
 * Readers (sql_latest, sql_scan_entity) take the indexed part from
 * subject_rows and the tail, the rows above the mark of the subject's
 * slice (QG_SQ_MARK_OF; at most two rounds of rows), by rowid: one
 * statement, one snapshot, so a row is read from exactly one of the two.
 * An update that moves an indexed row in time (a refusal decided again:
 * sql_upsert sets created_ms) moves its entry by the trigger
 * requests_subject_rows; rows are never deleted.  At open the rows above
 * the marks are filled first and the slices made one again (catch_up):
 * the last round's after a stop, all of them after another program
 * appended rows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* A round cut into slices when as many different subjects as this are
 * among its QG_SQ_SAMPLE rows (~100 subjects or more at random). */
#define SLICE_DISTINCT 48

/* Slice ?3 .. ?4 (NULL: no end) of the rows ?1 < rowid <= ?2. */
static const char sql_fill[] =
    "INSERT OR IGNORE INTO subject_rows (subject, created_ms, seq)"
    " SELECT subject, created_ms, rowid FROM requests"
    " WHERE rowid > ?1 AND rowid <= ?2 AND subject >= ?3"
    " AND (?4 IS NULL OR subject < ?4) ORDER BY subject, created_ms, rowid";

static const char sql_top[] = "SELECT coalesce(max(rowid), 0) FROM requests";

static const char sql_mark[] =
    "UPDATE subject_rows_mark SET seq = ?1 WHERE lo = ?2";

static const char sql_read_marks[] =
    "SELECT lo, seq FROM subject_rows_mark ORDER BY lo";

static const char sql_sample[] =
    "SELECT subject FROM requests WHERE rowid = ?1";

static const char sql_unmark[] = "DELETE FROM subject_rows_mark";

static const char sql_add_mark[] =
    "INSERT INTO subject_rows_mark (lo, seq) VALUES (?1, ?2)";

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The slices and marks in the file: lo ascending from "", at most
 * QG_SQ_SLICES of them.  QG_OK or QG_EIO. */
static int read_marks(qg__sq *s)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    sqlite3_stmt *st = NULL;
    int rc, n = 0;
    if (sqlite3_prepare_v2(s->wdb, sql_read_marks, -1, &st, NULL) !=
        SQLITE_OK)
        return QG_EIO;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && n < QG_SQ_SLICES) {
        const char *lo = (const char *)sqlite3_column_text(st, 0);
        snprintf(x->cut.lo[n], sizeof x->cut.lo[n], "%s", lo ? lo : "");
        x->marks[n++] = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE || n == 0 || x->cut.lo[0][0] != '\0')
        return QG_EIO;
    x->cut.n = n;
    return QG_OK;
}

int qg__sq_subject_rows_prepare(qg__sq *s)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    const struct { const char *sql; sqlite3_stmt **st; } sts[] = {
        { sql_fill, &x->fill }, { sql_top, &x->top },
        { sql_mark, &x->mark_st }, { sql_sample, &x->sample },
        { sql_unmark, &x->unmark }, { sql_add_mark, &x->add_mark },
    };
    x->every_rows = s->o.subject_index_rows > 0 ? s->o.subject_index_rows
                                                : DEFAULT_ROWS;
    x->every_ms = s->o.subject_index_ms > 0 ? s->o.subject_index_ms
                                            : DEFAULT_MS;
    for (size_t k = 0; k < sizeof sts / sizeof *sts; k++)
        if (sqlite3_prepare_v3(s->wdb, sts[k].sql, -1,
                               SQLITE_PREPARE_PERSISTENT, sts[k].st,
                               NULL) != SQLITE_OK)
            return QG_EIO;
    if (read_marks(s) != QG_OK)
        return QG_EIO;
    x->next = x->cut.n;
    x->pending = -1;
    x->recut = 0;
    x->waiting = 0;
    x->since_ms = 0;
    return QG_OK;
}

void qg__sq_subject_rows_finalize(qg__sq *s)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    sqlite3_stmt **sts[] = { &x->fill, &x->top, &x->mark_st, &x->sample,
                             &x->unmark, &x->add_mark };
    for (size_t k = 0; k < sizeof sts / sizeof *sts; k++) {
        sqlite3_finalize(*sts[k]);
        *sts[k] = NULL;
    }
}

static int step_done(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* The last rowid of requests, in *top.  SQLite's code. */
static int read_top(qg__sq_subject_rows *x, int64_t *top)
{
    int rc = sqlite3_step(x->top);
    *top = rc == SQLITE_ROW ? sqlite3_column_int64(x->top, 0) : 0;
    sqlite3_reset(x->top);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* In the open transaction: slice j of cut, its rows from its mark from
 * up to to, into subject_rows, and its mark moved to to.  SQLite's
 * code. */
static int fill_slice(qg__sq_subject_rows *x, const qg__sq_slices *cut,
                      int j, int64_t from, int64_t to)
{
    int rc;
    sqlite3_bind_int64(x->fill, 1, from);
    sqlite3_bind_int64(x->fill, 2, to);
    sqlite3_bind_text(x->fill, 3, cut->lo[j], -1, SQLITE_STATIC);
    if (j + 1 < cut->n)
        sqlite3_bind_text(x->fill, 4, cut->lo[j + 1], -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(x->fill, 4);
    sqlite3_bind_int64(x->mark_st, 1, to);
    sqlite3_bind_text(x->mark_st, 2, cut->lo[j], -1, SQLITE_STATIC);
    rc = step_done(x->fill);
    if (rc == SQLITE_OK)
        rc = step_done(x->mark_st);
    sqlite3_clear_bindings(x->fill);
    sqlite3_clear_bindings(x->mark_st);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The cut of a round over the rows from < rowid <= to, from the names
 * of QG_SQ_SAMPLE of them spread evenly (their order is the key order of
 * subject_rows and of SQLite's text comparison: bytes).  SQLite's code. */
static int make_cut(qg__sq_subject_rows *x, int64_t from, int64_t to,
                    qg__sq_slices *out)
{
    int64_t span = to - from;
    int n = 0, distinct = 0, rc = SQLITE_OK;
    out->n = 1;
    out->lo[0][0] = '\0';
    for (int i = 0; i < QG_SQ_SAMPLE && i < span; i++) {
        int64_t id = from + 1 + (span > QG_SQ_SAMPLE
                                     ? span * i / QG_SQ_SAMPLE : i);
        sqlite3_bind_int64(x->sample, 1, id);
        rc = sqlite3_step(x->sample);
        if (rc == SQLITE_ROW) {
            const char *name = (const char *)sqlite3_column_text(x->sample,
                                                                 0);
            snprintf(x->samples[n++], sizeof x->samples[0], "%s",
                     name ? name : "");
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;             /* no such rowid: a gap */
        }
        sqlite3_reset(x->sample);
        if (rc != SQLITE_OK)
            return rc;
    }
    qsort(x->samples, (size_t)n, sizeof x->samples[0], by_name);
    for (int i = 0; i < n; i++)
        distinct += i == 0 || strcmp(x->samples[i], x->samples[i - 1]) != 0;
    if (distinct < SLICE_DISTINCT)
        return SQLITE_OK;
    for (int j = 1; j < QG_SQ_SLICES; j++) {
        const char *lo = x->samples[j * n / QG_SQ_SLICES];
        if (strcmp(lo, out->lo[out->n - 1]) > 0)     /* same size */
            memcpy(out->lo[out->n++], lo, strlen(lo) + 1);
    }
    return SQLITE_OK;
}

static int same_cut(const qg__sq_slices *a, const qg__sq_slices *b)
{
    if (a->n != b->n)
        return 0;
    for (int j = 0; j < a->n; j++)
        if (strcmp(a->lo[j], b->lo[j]) != 0)
            return 0;
    return 1;
}

/* In the open transaction: the file's slices made cut, every mark at
 * mark.  SQLite's code. */
static int write_cut(qg__sq_subject_rows *x, const qg__sq_slices *cut,
                     int64_t mark)
{
    int rc = step_done(x->unmark);
    for (int j = 0; rc == SQLITE_OK && j < cut->n; j++) {
        sqlite3_bind_text(x->add_mark, 1, cut->lo[j], -1, SQLITE_STATIC);
        sqlite3_bind_int64(x->add_mark, 2, mark);
        rc = step_done(x->add_mark);
        sqlite3_clear_bindings(x->add_mark);
    }
    return rc;
}

/* step in a transaction of its own (catch_up): QG_OK, or -1 with
 * SQLite's reason in why. */
static int in_transaction(qg__sq *s, int (*step)(qg__sq *s, void *ud),
                          void *ud, char *why, size_t whycap)
{
    if (sqlite3_exec(s->wdb, "BEGIN IMMEDIATE", NULL, NULL, NULL) !=
            SQLITE_OK ||
        step(s, ud) != SQLITE_OK ||
        sqlite3_exec(s->wdb, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        /* the reason before the ROLLBACK clears it */
        snprintf(why, whycap, "%s", sqlite3_errmsg(s->wdb));
        sqlite3_exec(s->wdb, "ROLLBACK", NULL, NULL, NULL);
        return -1;
    }
    return QG_OK;
}

struct catch_step {
    int j;
    int64_t to;
};

static int catch_slice(qg__sq *s, void *ud)
{
    struct catch_step *c = ud;
    qg__sq_subject_rows *x = &s->subject_rows;
    return fill_slice(x, &x->cut, c->j, x->marks[c->j], c->to);
}

static int catch_one_slice(qg__sq *s, void *ud)
{
    static const qg__sq_slices one = { .n = 1 };
    return write_cut(&s->subject_rows, &one, *(int64_t *)ud);
}

/* At open, before the writer starts: every row above its slice's mark
 * into subject_rows, a fill step of at most FILL_STEPS x every_rows rows
 * per transaction, then the slices made one, so that the reads find at
 * most a round's rows above the marks from then on.  After a normal stop
 * those are the last round's rows; after another program appended rows
 * (a generated or imported ledger), all of them.  Returns the number of
 * rows filled, or -1 with SQLite's reason in why. */
int64_t qg__sq_subject_rows_catch_up(qg__sq *s, char *why, size_t whycap)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    int64_t done = 0, top, step = (int64_t)x->every_rows * FILL_STEPS;
    if (read_top(x, &top) != SQLITE_OK) {
        snprintf(why, whycap, "%s", sqlite3_errmsg(s->wdb));
        return -1;
    }
    for (int j = 0; j < x->cut.n; j++)
        if (x->marks[j] > top)
            top = x->marks[j];      /* rows deleted by another program */
    for (int j = 0; j < x->cut.n; j++)
        while (x->marks[j] < top) {
            struct catch_step c = { j, top - x->marks[j] > step
                                           ? x->marks[j] + step : top };
            if (in_transaction(s, catch_slice, &c, why, whycap) != QG_OK)
                return -1;
            done += c.to - x->marks[j];
            x->marks[j] = c.to;
        }
    if (x->cut.n > 1) {
        if (in_transaction(s, catch_one_slice, &top, why, whycap) != QG_OK)
            return -1;
        x->cut.n = 1;
        x->cut.lo[0][0] = '\0';
        x->marks[0] = top;
    }
    x->next = x->cut.n;
    return done;
}

/* In the batch's transaction, after its rows (rows of them): the round's
 * next slice while a round runs, else a new round when due, cut into
 * slices, and its first slice.  SQLite's code. */
int qg__sq_subject_rows_flush(qg__sq *s, size_t rows)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    int64_t now = mono_ms(), top, mark = x->marks[0];
    int rc;
    x->pending = -1;
    x->recut = 0;
    if (x->waiting == 0)
        x->since_ms = now;
    x->waiting += rows;
    if (x->next < x->cut.n) {
        rc = fill_slice(x, &x->cut, x->next, x->marks[x->next],
                        x->round_top);
        if (rc == SQLITE_OK) {
            x->pending = x->next;
            x->pending_to = x->round_top;
        }
        return rc;
    }
    if (x->waiting < (size_t)x->every_rows && now - x->since_ms < x->every_ms)
        return SQLITE_OK;
    /* a new round: every mark is the last round's top */
    if ((rc = read_top(x, &top)) != SQLITE_OK || top <= mark)
        return rc;
    if (top - mark > (int64_t)x->every_rows * FILL_STEPS)
        top = mark + (int64_t)x->every_rows * FILL_STEPS;
    if ((rc = make_cut(x, mark, top, &x->next_cut)) != SQLITE_OK)
        return rc;
    if (!same_cut(&x->next_cut, &x->cut)) {
        if ((rc = write_cut(x, &x->next_cut, mark)) != SQLITE_OK)
            return rc;
        x->recut = 1;
    }
    rc = fill_slice(x, x->recut ? &x->next_cut : &x->cut, 0, mark, top);
    if (rc == SQLITE_OK) {
        x->pending = 0;
        x->pending_to = top;
    }
    return rc;
}

/* After the batch's transaction: committed (ok) or rolled back. */
void qg__sq_subject_rows_done(qg__sq *s, int ok)
{
    qg__sq_subject_rows *x = &s->subject_rows;
    if (ok && x->pending >= 0) {
        if (x->recut) {
            int64_t mark = x->marks[0];
            x->cut = x->next_cut;
            for (int j = 0; j < x->cut.n; j++)
                x->marks[j] = mark;
        }
        x->marks[x->pending] = x->pending_to;
        if (x->pending == 0) {      /* a round started: waiting restarts */
            x->round_top = x->pending_to;
            x->waiting = 0;
        }
        x->next = x->pending + 1;
    }
    x->pending = -1;
    x->recut = 0;
}
