/* ledger_sqlite_history.c - the SQLite ledger's history reads
 * (ledger_backend.h, qg__ledger_history_ops): a subject's usage slots, its
 * first usage, its latest rows.
 *
 * They run on a connection of their own (hdb, under hist_mu): in WAL mode
 * a reader sees a snapshot and never waits for the writer, and the
 * lookups the decision path makes (get, on gdb) never wait for a history
 * read.  The slots come from the rollup, usage_slots and its recent
 * slots in usage_slots_recent (schema 11), whose primary key (subject,
 * slot_ms, model) is the order asked for: a range of each, never the
 * subject's rows.  The latest rows come from subject_rows (subject,
 * created_ms, rowid), read backwards from `before`: LIMIT rows, however
 * many the subject has, and from the rows above its mark, which the
 * writer has not put there yet (at most one interval of all subjects'
 * rows, ledger_sqlite_subject_rows.c).  The rollup is migration 5's,
 * subject_rows migration 10's (ledger_sqlite_schema.c). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"

#include "ledger_sqlite.h"


/* A slot is in one of the two tables (ledger_sqlite_rollup.c); sq_slots
 * adds up lines of the same slot and model all the same. */
static const char sql_slots[] =
    "SELECT slot_ms, model, weight_milli, admitted, requests, refused"
    " FROM usage_slots WHERE subject = ?1 AND slot_ms >= ?2 AND slot_ms < ?3"
    " UNION ALL"
    " SELECT slot_ms, model, weight_milli, admitted, requests, refused"
    " FROM usage_slots_recent"
    " WHERE subject = ?1 AND slot_ms >= ?2 AND slot_ms < ?3"
    " ORDER BY 1, 2";

/* NULL when neither table has an admitted request of the subject. */
static const char sql_first[] =
    "SELECT min(s) FROM (SELECT (SELECT slot_ms FROM usage_slots"
    " WHERE subject = ?1 AND admitted > 0 ORDER BY slot_ms LIMIT 1) AS s"
    " UNION ALL SELECT (SELECT slot_ms FROM usage_slots_recent"
    " WHERE subject = ?1 AND admitted > 0 ORDER BY slot_ms LIMIT 1))";

/* The rows above the mark are read by rowid (NOT INDEXED): the index on
 * created_ms matches the ORDER BY, and the planner would scan it, every
 * row before ?2, instead of the few rows above the mark. */
static const char sql_latest[] =
    "SELECT " ROW_COLS ", rowid AS seq FROM requests WHERE rowid IN"
    " (SELECT seq FROM subject_rows WHERE subject = ?1 AND created_ms < ?2"
    "  ORDER BY created_ms DESC, seq DESC LIMIT ?3)"
    " UNION ALL "
    "SELECT " ROW_COLS ", rowid AS seq FROM requests NOT INDEXED"
    " WHERE rowid > " QG_SQ_MARK_OF("?1") " AND subject = ?1"
    " AND created_ms < ?2"
    " ORDER BY created_ms DESC, seq DESC LIMIT ?3";

int qg__sq_history_prepare(qg__sq *s, char *err, size_t errcap)
{
    if (sqlite3_prepare_v3(s->hdb, sql_slots, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->slots_st, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->hdb, sql_first, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->first_st, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->hdb, sql_latest, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->latest_st, NULL) != SQLITE_OK)
        return qg__sq_fail_db(s->hdb, s->path,
                              "cannot prepare the history reads", err,
                              errcap);
    return QG_OK;
}

void qg__sq_history_finalize(qg__sq *s)
{
    sqlite3_finalize(s->slots_st);
    sqlite3_finalize(s->first_st);
    sqlite3_finalize(s->latest_st);
    sqlite3_close(s->hdb);
    s->slots_st = s->first_st = s->latest_st = NULL;
    s->hdb = NULL;
}

/* Step st to its end, calling row for each row; fn's nonzero return
 * stops and is returned.  Resets st.  hist_mu held. */
static int run(qg__sq *s, sqlite3_stmt *st,
               int (*row)(sqlite3_stmt *st, void *ud), void *ud)
{
    int rc, out = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if ((out = row(st, ud)) != 0)
            break;
    if (out == 0 && rc != SQLITE_DONE) {
        qg__sq_read_failed(s, s->hdb);
        out = qg__sq_map_rc(rc);
        if (out == QG_OK)
            out = QG_EIO;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return out;
}

typedef struct slots_ud {
    int (*fn)(const qg_usage_slot *s, void *ud);
    void *ud;
    qg_usage_slot cur;           /* the slot being added up */
    int have;
} slots_ud;

/* a + b, held at the int64 range (a file another program wrote could
 * hold anything). */
static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (!__builtin_add_overflow(a, b, &r))
        return r;
    return b > 0 ? INT64_MAX : INT64_MIN;
}

/* One line of sql_slots: into the current slot, or the current one to
 * the caller and this one started. */
static int slot_row(sqlite3_stmt *st, void *ud)
{
    slots_ud *u = ud;
    qg_usage_slot sl;
    int out = 0;
    sl.start_ms = sqlite3_column_int64(st, 0);
    COL_STR(st, 1, sl.model);
    sl.weight_milli = sqlite3_column_int64(st, 2);
    sl.admitted = sqlite3_column_int64(st, 3);
    sl.requests = sqlite3_column_int64(st, 4);
    sl.refused = sqlite3_column_int64(st, 5);
    if (u->have && u->cur.start_ms == sl.start_ms &&
        strcmp(u->cur.model, sl.model) == 0) {
        u->cur.weight_milli = sat_add(u->cur.weight_milli, sl.weight_milli);
        u->cur.admitted = sat_add(u->cur.admitted, sl.admitted);
        u->cur.requests = sat_add(u->cur.requests, sl.requests);
        u->cur.refused = sat_add(u->cur.refused, sl.refused);
        return 0;
    }
    if (u->have)
        out = u->fn(&u->cur, u->ud);
    u->cur = sl;
    u->have = 1;
    return out;
}

static int sq_slots(void *b, const char *subject, int64_t from_ms,
                    int64_t to_ms, int (*fn)(const qg_usage_slot *s, void *ud),
                    void *ud)
{
    qg__sq *s = b;
    slots_ud u = {fn, ud, {0}, 0};
    int rc;
    pthread_mutex_lock(&s->hist_mu);
    sqlite3_bind_text(s->slots_st, 1, subject, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s->slots_st, 2, from_ms);
    sqlite3_bind_int64(s->slots_st, 3, to_ms);
    rc = run(s, s->slots_st, slot_row, &u);
    pthread_mutex_unlock(&s->hist_mu);
    if (rc == 0 && u.have)
        rc = fn(&u.cur, ud);
    return rc;
}

static int first_row(sqlite3_stmt *st, void *ud)
{
    if (sqlite3_column_type(st, 0) != SQLITE_NULL)
        *(int64_t *)ud = sqlite3_column_int64(st, 0);
    return 1;
}

static int sq_first_usage(void *b, const char *subject, int64_t *start_ms)
{
    qg__sq *s = b;
    int64_t t = -1;
    int rc;
    pthread_mutex_lock(&s->hist_mu);
    sqlite3_bind_text(s->first_st, 1, subject, -1, SQLITE_STATIC);
    rc = run(s, s->first_st, first_row, &t);
    pthread_mutex_unlock(&s->hist_mu);
    if (rc < 0)
        return rc;
    if (t < 0)
        return QG_ENOTFOUND;
    *start_ms = t;
    return QG_OK;
}

typedef struct latest_ud {
    int (*fn)(const qg_ledger_row *row, void *ud);
    void *ud;
    qg_ledger_row row;
} latest_ud;

/* A row in ROW_COLS order (ledger_sqlite.h), to the caller's fn. */
static int latest_row(sqlite3_stmt *st, void *ud)
{
    latest_ud *u = ud;
    memset(&u->row, 0, sizeof u->row);
    qg__sq_read_row(st, &u->row);
    return u->fn(&u->row, u->ud);
}

static int sq_latest(void *b, const char *subject, int64_t before_ms,
                     int limit, int (*fn)(const qg_ledger_row *row, void *ud),
                     void *ud)
{
    qg__sq *s = b;
    latest_ud *u;
    int rc;
    /* a row is 3 KB: not on a worker's stack */
    if (!(u = sqlite3_malloc(sizeof *u)))
        return QG_ENOMEM;
    u->fn = fn;
    u->ud = ud;
    pthread_mutex_lock(&s->hist_mu);
    sqlite3_bind_text(s->latest_st, 1, subject, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s->latest_st, 2, before_ms);
    sqlite3_bind_int(s->latest_st, 3, limit);
    rc = run(s, s->latest_st, latest_row, u);
    pthread_mutex_unlock(&s->hist_mu);
    sqlite3_free(u);
    return rc;
}

const qg__ledger_history_ops qg__sq_history = {
    sq_slots,
    sq_first_usage,
    sq_latest,
};
