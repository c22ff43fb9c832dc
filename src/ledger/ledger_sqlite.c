/* ledger_sqlite.c - the embedded ledger backend: SQLite in WAL mode
 * (ledger_backend.h: the front owns the queue and the writer thread).
 *
 * Connections to one file, each used by one thread at a time:
 *  - the writer's, used by the front's writer thread: write_batch, one
 *    transaction per batch (BEGIN IMMEDIATE, one prepared insert or upsert
 *    per row, the history rollup's sums (ledger_sqlite_rollup.c), COMMIT:
 *    an fsync of the WAL with synchronous=FULL in DURABLE mode, NORMAL in
 *    ASYNC mode);
 *  - the scan connection (scan_mu): scan streams rows from it while the
 *    writer goes on (WAL readers see a snapshot, never block);
 *  - the lookup connection (get_mu): single rows by request id (get),
 *    asked by the server for every request id its counters do not
 *    remember and the front's id filter cannot rule out;
 *  - the admin connection (admin_mu): subjects and keys, written
 *    synchronously with synchronous=FULL so they are durable on return;
 *  - the checkpointer's (ledger_sqlite_checkpoint.c): the WAL's
 *    checkpoints, on a thread of their own, not inside the writer's
 *    COMMITs.
 * Other processes (the CLI's `keys` command next to a running server) may
 * use the same file: busy_timeout makes a writer wait for the other's
 * write lock instead of failing.
 *
 * Subjects and keys are in ledger_sqlite_admin.c, the schema and its
 * migrations in ledger_sqlite_schema.c; this file opens the database,
 * closes it, writes batches of rows and reads them (scan, get, ids).
 *
 * Files: a new database is created with mode 0600 (its -wal and -shm
 * files follow it): it holds every subject's usage and the key hashes.
 *
 * Schema: PRAGMA user_version is the schema version; migrations[i] brings
 * version i to i + 1 and all pending ones run in one transaction at open.
 * A file with a newer version than this build knows is refused. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

/* ------------------------------------------------------------- schema */


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
 * one, 1.7 us in statements of 16 (docs/benchmarks.md, "Ledger").  The rows a run did not insert (an id
 * the file holds already: a refusal decided again, a replayed spool, or
 * the same id twice in the run) are found afterwards by their rowids,
 * run_rest(). */
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

/* The index on created_ms holds rowid as its last column, so this order
 * is read straight from the index, without a sort.  Only the columns a
 * replay reads (ledger.h, qg__ledger_scan): 11 of 23, the rebuild's scan
 * being the slower half of a restart (docs/benchmarks.md, "Rebuild"). */
#define SCAN_COLS \
    "request_id, subject, model, status, reserved_milli, weight_milli," \
    " created_ms, settled_ms, overage_price_micro, overage_cost_micro," \
    " headroom_milli"
static const char sql_scan[] =
    "SELECT " SCAN_COLS " FROM requests"
    " WHERE decision = 1 AND created_ms >= ?1 ORDER BY created_ms, rowid";

/* A row of sql_scan: the replay's columns; the others empty, decision
 * allow (the only rows it reads). */
static void read_scan_row(sqlite3_stmt *st, qg_ledger_row *r)
{
    COL_STR(st, 0, r->request_id);
    COL_STR(st, 1, r->subject);
    COL_STR(st, 2, r->model);
    r->status = sqlite3_column_int(st, 3);
    r->reserved_milli = sqlite3_column_int64(st, 4);
    r->weight_milli = sqlite3_column_int64(st, 5);
    r->created_ms = sqlite3_column_int64(st, 6);
    r->settled_ms = sqlite3_column_int64(st, 7);
    r->overage_price_micro = sqlite3_column_int64(st, 8);
    r->overage_cost_micro = sqlite3_column_int64(st, 9);
    r->headroom_milli = sqlite3_column_int64(st, 10);
}

/* One subject's rows and its org's other members' rows: the subject's
 * from subject_rows and the rows above its mark (schema 10,
 * ledger_sqlite_subject_rows.c; NOT INDEXED: by rowid, not by the index
 * on created_ms), the org's from its index (schemas 6 and 9:
 * "org <> ''" is the org index's own condition, which the planner must
 * see to use it); only these rows are sorted. */
static const char sql_scan_entity[] =
    "SELECT " ROW_COLS ", rowid AS seq FROM requests"
    " WHERE rowid IN (SELECT seq FROM subject_rows WHERE subject = ?1"
    "   AND created_ms >= ?3 AND created_ms <= ?4) AND decision = 1"
    " UNION ALL "
    "SELECT " ROW_COLS ", rowid AS seq FROM requests NOT INDEXED"
    " WHERE rowid > (SELECT seq FROM subject_rows_mark) AND subject = ?1"
    "   AND decision = 1 AND created_ms >= ?3 AND created_ms <= ?4"
    " UNION ALL "
    "SELECT " ROW_COLS ", rowid AS seq FROM requests"
    " WHERE ?2 <> '' AND org = ?2 AND org <> '' AND subject <> ?1"
    "   AND decision = 1"
    "   AND created_ms >= ?3 AND created_ms <= ?4"
    " ORDER BY created_ms, seq";

static const char sql_get[] =
    "SELECT " ROW_COLS " FROM requests WHERE request_id = ?1";


/* Bind r to parameters base + 1 .. base + ROW_PARAMS of st (base 0: a
 * one-row statement; a run's row j: j * ROW_PARAMS). */
static int bind_row_at(sqlite3_stmt *st, int base, const qg_ledger_row *r)
{
    int rc = BIND_STR(st, base + 1, r->request_id);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 2, r->subject);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 3, r->org);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 4, r->plan);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 5, r->rules_version);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 6, r->weights_version);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 7, r->model);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 8, r->window);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, base + 9, r->decision);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, base + 10, r->status);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, base + 11, r->estimated);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 12, r->input_tokens);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 13, r->output_tokens);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 14, r->reserved_milli);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 15, r->weight_milli);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 16, r->created_ms);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 17, r->settled_ms);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 18, r->overage_milli);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(st, base + 19, r->overage_price_micro);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(st, base + 20, r->overage_cost_micro);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, base + 21, r->headroom_milli);
    if (rc == SQLITE_OK) rc = BIND_STR(st, base + 22, r->detail);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, base + 23, r->fallback);
    return rc;
}

static int bind_row(sqlite3_stmt *st, const qg_ledger_row *r)
{
    return bind_row_at(st, 0, r);
}

void qg__sq_read_row(sqlite3_stmt *st, qg_ledger_row *r)
{
    COL_STR(st, 0, r->request_id);
    COL_STR(st, 1, r->subject);
    COL_STR(st, 2, r->org);
    COL_STR(st, 3, r->plan);
    COL_STR(st, 4, r->rules_version);
    COL_STR(st, 5, r->weights_version);
    COL_STR(st, 6, r->model);
    COL_STR(st, 7, r->window);
    r->decision = sqlite3_column_int(st, 8);
    r->status = sqlite3_column_int(st, 9);
    r->estimated = sqlite3_column_int(st, 10);
    r->input_tokens = sqlite3_column_int64(st, 11);
    r->output_tokens = sqlite3_column_int64(st, 12);
    r->reserved_milli = sqlite3_column_int64(st, 13);
    r->weight_milli = sqlite3_column_int64(st, 14);
    r->created_ms = sqlite3_column_int64(st, 15);
    r->settled_ms = sqlite3_column_int64(st, 16);
    r->overage_milli = sqlite3_column_int64(st, 17);
    r->overage_price_micro = sqlite3_column_int64(st, 18);
    r->overage_cost_micro = sqlite3_column_int64(st, 19);
    r->headroom_milli = sqlite3_column_int64(st, 20);
    COL_STR(st, 21, r->detail);
    r->fallback = sqlite3_column_int(st, 22);
}

/* ------------------------------------------------------ opening, schema */

static void sq_log(const qg__sq *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sq_log(const qg__sq *s, const char *fmt, ...)
{
    char line[1536];
    va_list ap;
    if (!s->o.log)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->o.log(s->o.log_ud, line);
}

/* The ledger holds every subject's usage and the API keys' hashes: a new
 * file is created readable and writable by our user only (0600, before
 * SQLite opens it; SQLite gives the -wal and -shm files the database
 * file's mode).  An existing file keeps its mode, with a warning when
 * others may read it. */
static int create_private(qg__sq *s, const char *path, char *err,
                          size_t errcap)
{
    static const char *const sfx[] = {"", "-wal", "-shm"};
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
        return QG_OK;
    }
    if (errno != EEXIST) {
        snprintf(err, errcap, "ledger %s: cannot create: %s", path,
                 strerror(errno));
        return QG_EIO;
    }
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        char f[1100];
        struct stat sb;
        snprintf(f, sizeof f, "%s%s", path, sfx[i]);
        if (stat(f, &sb) == 0 && (sb.st_mode & 077))
            sq_log(s, "ledger %s: mode %03o lets other users read it (it "
                   "holds every subject's usage and the key hashes): "
                   "chmod 600 %s*", f, (unsigned)(sb.st_mode & 0777), path);
    }
    return QG_OK;
}

/* SQLite's allocation statistics off (ledger.h): sqlite3_config works
 * only before SQLite initializes; later it refuses and changes nothing.
 * Debian's SQLite is built without lookaside memory (OMIT_LOOKASIDE), so
 * every record SQLite builds is a malloc and a free. */
void qg__ledger_process_init(void)
{
    (void)sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

/* One connection with the settings every connection shares; vfs NULL is
 * SQLite's default. */
static int conn_open_vfs(const char *path, int busy_ms, int sync_full,
                         const char *vfs, sqlite3 **out, char *err,
                         size_t errcap)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                 SQLITE_OPEN_NOMUTEX,
                             vfs);
    if (rc != SQLITE_OK) {
        qg__sq_fail_db(db, path, "cannot open", err, errcap);
        sqlite3_close(db);
        return QG_EIO;
    }
    sqlite3_busy_timeout(db, busy_ms);
    if (sqlite3_exec(db, sync_full ? "PRAGMA synchronous=FULL"
                                   : "PRAGMA synchronous=NORMAL",
                     NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "PRAGMA foreign_keys=OFF", NULL, NULL, NULL) !=
            SQLITE_OK) {
        qg__sq_fail_db(db, path, "cannot configure", err, errcap);
        sqlite3_close(db);
        return QG_EIO;
    }
    *out = db;
    return QG_OK;
}

static int conn_open(const char *path, int busy_ms, int sync_full,
                     sqlite3 **out, char *err, size_t errcap)
{
    return conn_open_vfs(path, busy_ms, sync_full, NULL, out, err, errcap);
}

static int set_wal(sqlite3 *db, const char *path, char *err, size_t errcap)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st,
                                NULL);
    int ok = 0;
    if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0);
        ok = m && sqlite3_stricmp(m, "wal") == 0;
    }
    if (!ok) {
        qg__sq_fail_db(db, path, "cannot switch to WAL journal mode", err, errcap);
        sqlite3_finalize(st);
        return QG_EIO;
    }
    sqlite3_finalize(st);
    return QG_OK;
}

/* ------------------------------------------------------- open and close */

static void sq_close(void *b)
{
    qg__sq *s = b;
    if (!s)
        return;
    qg__sq_ckpt_stop(&s->ckpt, s->wdb);
    sqlite3_close(s->cdb);
    sqlite3_finalize(s->upsert);
    sqlite3_finalize(s->settle);
    sqlite3_finalize(s->insert_new);
    sqlite3_finalize(s->insert_run);
    sqlite3_finalize(s->rowid_of);
    sqlite3_finalize(s->begin_st);
    sqlite3_finalize(s->commit_st);
    sqlite3_finalize(s->rollback_st);
    qg__sq_rollup_finalize(s);
    qg__sq_subject_rows_finalize(s);
    sqlite3_finalize(s->scan_st);
    sqlite3_finalize(s->get_st);
    qg__sq_history_finalize(s);
    sqlite3_close(s->sdb);
    sqlite3_close(s->gdb);
    sqlite3_close(s->adb);
    sqlite3_close(s->wdb);   /* the last one checkpoints the WAL */
    if (s->mutexes_ready) {
        pthread_mutex_destroy(&s->scan_mu);
        pthread_mutex_destroy(&s->admin_mu);
        pthread_mutex_destroy(&s->get_mu);
        pthread_mutex_destroy(&s->hist_mu);
        pthread_mutex_destroy(&s->err_mu);
    }
    free(s);
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

static void *sq_open(const char *path, const qg_ledger_opts *o, char *err,
                     size_t errcap)
{
    qg__sq *s;
    int v = 0, full = o->sync == QG_LEDGER_DURABLE;

    if (strlen(path) >= sizeof s->path) {
        snprintf(err, errcap, "ledger: path too long");
        return NULL;
    }
    if (!(s = calloc(1, sizeof *s))) {
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    s->o = *o;
    strcpy(s->path, path);
    pthread_mutex_init(&s->scan_mu, NULL);
    pthread_mutex_init(&s->admin_mu, NULL);
    pthread_mutex_init(&s->get_mu, NULL);
    pthread_mutex_init(&s->hist_mu, NULL);
    pthread_mutex_init(&s->err_mu, NULL);
    s->mutexes_ready = 1;

    if (create_private(s, path, err, errcap) ||
        conn_open_vfs(path, o->busy_timeout_ms, full,
                      full && qg__sq_vfs_register() == SQLITE_OK ? QG_SQ_VFS
                                                                 : NULL,
                      &s->wdb, err, errcap))
        goto fail;
    /* refuse a newer schema before changing anything in the file */
    if (qg__sq_user_version(s->wdb, &v) != SQLITE_OK) {
        qg__sq_fail_db(s->wdb, path, "not a readable SQLite database", err, errcap);
        goto fail;
    }
    if (v > QG_LEDGER_SCHEMA_VERSION) {
        qg__sq_too_new(v, path, err, errcap);
        goto fail;
    }
    if (set_wal(s->wdb, path, err, errcap) ||
        qg__sq_migrate(s->wdb, path, err, errcap))
        goto fail;
    if (sqlite3_prepare_v3(s->wdb, sql_upsert, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->upsert, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_settle, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->settle, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_insert_new, -1,
                           SQLITE_PREPARE_PERSISTENT, &s->insert_new,
                           NULL) != SQLITE_OK ||
        prepare_insert_run(s) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_rowid_of, -1,
                           SQLITE_PREPARE_PERSISTENT, &s->rowid_of,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, "BEGIN IMMEDIATE", -1,
                           SQLITE_PREPARE_PERSISTENT, &s->begin_st,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, "COMMIT", -1, SQLITE_PREPARE_PERSISTENT,
                           &s->commit_st, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, "ROLLBACK", -1, SQLITE_PREPARE_PERSISTENT,
                           &s->rollback_st, NULL) != SQLITE_OK ||
        qg__sq_rollup_prepare(s) != QG_OK ||
        qg__sq_subject_rows_prepare(s) != QG_OK) {
        qg__sq_fail_db(s->wdb, path, "cannot prepare the upsert", err, errcap);
        goto fail;
    }
    {
        char why[256];
        int64_t tail = qg__sq_subject_rows_catch_up(s, why, sizeof why);
        if (tail < 0) {
            snprintf(err, errcap, "ledger %s: cannot fill subject_rows: %s",
                     path, why);
            goto fail;
        }
        if (tail > 65536)
            sq_log(s, "ledger %s: %lld rows written by another program "
                   "put in subject_rows (a subject's rows by time)", path,
                   (long long)tail);
    }
    if (conn_open(path, o->busy_timeout_ms, full, &s->sdb, err, errcap) ||
        conn_open(path, o->busy_timeout_ms, full, &s->gdb, err, errcap) ||
        conn_open(path, o->busy_timeout_ms, 1, &s->adb, err, errcap))
        goto fail;
    /* No memory-mapped I/O (PRAGMA mmap_size): a read error on a mapped
     * page is a SIGBUS that kills the process, where read() gives SQLite an
     * error to report; the 1M-row scan measured no faster with it (issue
     * 8, docs/benchmarks.md). */
    if (sqlite3_prepare_v3(s->sdb, sql_scan, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->scan_st, NULL) != SQLITE_OK) {
        qg__sq_fail_db(s->sdb, path, "cannot prepare the scan", err, errcap);
        goto fail;
    }
    if (sqlite3_prepare_v3(s->gdb, sql_get, -1, SQLITE_PREPARE_PERSISTENT,
                           &s->get_st, NULL) != SQLITE_OK) {
        qg__sq_fail_db(s->gdb, path, "cannot prepare the lookup", err, errcap);
        goto fail;
    }
    if (conn_open(path, o->busy_timeout_ms, full, &s->hdb, err, errcap) ||
        qg__sq_history_prepare(s, err, errcap) ||
        conn_open(path, o->busy_timeout_ms, full, &s->cdb, err, errcap))
        goto fail;
    (void)qg__sq_ckpt_start(&s->ckpt, s->wdb, s->cdb);
    return s;
fail:
    sq_close(s);
    return NULL;
}

/* --------------------------------------------------------- operations */

void qg__sq_read_failed(qg__sq *s, sqlite3 *db)
{
    pthread_mutex_lock(&s->err_mu);
    snprintf(s->read_err, sizeof s->read_err, "%s (SQLite error %d)",
             sqlite3_errmsg(db), sqlite3_extended_errcode(db));
    pthread_mutex_unlock(&s->err_mu);
}

static void sq_last_read_error(void *b, char *out, size_t cap)
{
    qg__sq *s = b;
    pthread_mutex_lock(&s->err_mu);
    snprintf(out, cap, "%s", s->read_err);
    pthread_mutex_unlock(&s->err_mu);
}

static int sq_scan(void *b, int64_t since_ms,
                   int (*fn)(const qg_ledger_row *row, void *ud), void *ud)
{
    qg__sq *s = b;
    qg_ledger_row r;
    int rc, out = QG_OK;
    pthread_mutex_lock(&s->scan_mu);
    memset(&r, 0, sizeof r);
    r.decision = 1;
    sqlite3_bind_int64(s->scan_st, 1, since_ms);
    while ((rc = sqlite3_step(s->scan_st)) == SQLITE_ROW) {
        read_scan_row(s->scan_st, &r);
        if ((out = fn(&r, ud)) != 0)
            break;
    }
    if (out == 0 && rc != SQLITE_DONE) {
        out = qg__sq_map_rc(rc) == QG_OK ? QG_EIO : qg__sq_map_rc(rc);
        qg__sq_read_failed(s, s->sdb);
    }
    sqlite3_reset(s->scan_st);
    pthread_mutex_unlock(&s->scan_mu);
    return out;
}

static int sq_scan_entity(void *b, const char *subject, const char *org,
                          int64_t since_ms, int64_t until_ms,
                          int (*fn)(const qg_ledger_row *row, void *ud),
                          void *ud)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    qg_ledger_row r;
    int rc, out = QG_OK;
    pthread_mutex_lock(&s->scan_mu);
    if (sqlite3_prepare_v2(s->sdb, sql_scan_entity, -1, &st, NULL) !=
        SQLITE_OK) {
        qg__sq_read_failed(s, s->sdb);
        pthread_mutex_unlock(&s->scan_mu);
        return QG_EIO;
    }
    sqlite3_bind_text(st, 1, subject, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, org, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, since_ms);
    sqlite3_bind_int64(st, 4, until_ms);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        memset(&r, 0, sizeof r);
        qg__sq_read_row(st, &r);
        if ((out = fn(&r, ud)) != 0)
            break;
    }
    if (out == 0 && rc != SQLITE_DONE) {
        out = qg__sq_map_rc(rc) == QG_OK ? QG_EIO : qg__sq_map_rc(rc);
        qg__sq_read_failed(s, s->sdb);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->scan_mu);
    return out;
}

static int sq_get(void *b, const char *request_id, qg_ledger_row *out)
{
    qg__sq *s = b;
    int rc;
    pthread_mutex_lock(&s->get_mu);
    sqlite3_bind_text(s->get_st, 1, request_id, -1, SQLITE_STATIC);
    rc = sqlite3_step(s->get_st);
    if (rc == SQLITE_ROW) {
        memset(out, 0, sizeof *out);
        qg__sq_read_row(s->get_st, out);
        rc = QG_OK;
    } else if (rc == SQLITE_DONE) {
        rc = QG_ENOTFOUND;
    } else {
        qg__sq_read_failed(s, s->gdb);
        rc = QG_EIO;
    }
    sqlite3_reset(s->get_st);
    sqlite3_clear_bindings(s->get_st);
    pthread_mutex_unlock(&s->get_mu);
    return rc;
}

/* ---------------------------------------------------- writing rows */

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

/* Write n rows in one transaction (ledger_backend.h).  Returns 0 (why:
 * the last row a guard kept out, or "") or a QG error with why.  SQLite's
 * file is local: it is never "unreachable" (QG_ELEDGER). */
/* Run st on the row (bound, stepped, reset): SQLite's code. */
static int step_row(sqlite3_stmt *st, const qg_ledger_row *r)
{
    int rc = bind_row(st, r);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

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
    static const qg__sq_prior none;
    int rc;
    if (!it->row.settle_only) {
        if ((rc = step_row(s->insert_new, &it->row)) != SQLITE_OK)
            return rc;
        if (sqlite3_changes(s->wdb) == 1)
            return counted(s, &it->row, &none);
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
    static const qg__sq_prior none;
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
            rc = counted(s, &x->row, &none);
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
    static const qg__sq_prior none;
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
        if ((rc = counted(s, &it[idx[j]].row, &none)) != SQLITE_OK)
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

static int sq_write_batch(void *b, qg__ledger_item *it, size_t n,
                          const qg__spool_mark *mark, char *why,
                          size_t whycap)
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
    return QG_OK;
fail:
    qg__sq_rollup_clear(s);
    qg__sq_subject_rows_done(s, 0);
    rc = batch_failed(s, rc, why, whycap);
    clear_row_bindings(s);
    if (!sqlite3_get_autocommit(s->wdb))
        run_ctl(s->rollback_st);   /* if this fails too: the next batch */
    return rc;
}

/* ------------------------------------------------------ reading ids */

static int sq_scan_ids(void *b, int (*fn)(const char *id, size_t len,
                                          void *ud), void *ud)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int rc, out = QG_OK;
    pthread_mutex_lock(&s->scan_mu);
    rc = sqlite3_prepare_v2(s->sdb, "SELECT request_id FROM requests", -1,
                            &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        if (id && (out = fn(id, (size_t)sqlite3_column_bytes(st, 0), ud)))
            break;
        rc = SQLITE_OK;
    }
    if (out == QG_OK && rc != SQLITE_DONE) {
        qg__sq_read_failed(s, s->sdb);
        out = QG_EIO;
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->scan_mu);
    return out;
}

static int64_t sq_estimate(void *b)
{
    qg__sq *s = b;
    sqlite3_stmt *st = NULL;
    int64_t rows = -1;
    pthread_mutex_lock(&s->scan_mu);
    if (sqlite3_prepare_v2(s->sdb, "SELECT max(rowid) FROM requests", -1,
                           &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        rows = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->scan_mu);
    return rows;
}

/* Only a shared ledger spools (ledger_spool.c): a local file has no mark. */
static int sq_spool_applied(void *b, const char *spool_id, int64_t *seq)
{
    (void)b;
    (void)spool_id;
    *seq = 0;
    return QG_OK;
}

static const qg__ledger_rows_ops sq_rows = {
    sq_write_batch,
    sq_scan,
    sq_get,
    sq_scan_ids,
    sq_spool_applied,
    sq_last_read_error,
    sq_estimate,
    sq_scan_entity,
};

const qg__ledger_backend qg__ledger_sqlite = {
    "sqlite",
    QG_LEDGER_BACKEND_VERSION,
    0,
    sq_open,
    sq_close,
    &sq_rows,
    &qg__sq_subjects,
    &qg__sq_keys,
    &qg__sq_outbox_ops,
    &qg__sq_history,
};
