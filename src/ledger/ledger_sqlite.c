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
 * migrations in ledger_sqlite_schema.c, the writer's batches of rows in
 * ledger_sqlite_writer.c; this file opens the database, closes it and
 * reads rows (scan, get, ids).
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
    " WHERE rowid > " QG_SQ_MARK_OF("?1") " AND subject = ?1"
    "   AND decision = 1 AND created_ms >= ?3 AND created_ms <= ?4"
    " UNION ALL "
    "SELECT " ROW_COLS ", rowid AS seq FROM requests"
    " WHERE ?2 <> '' AND org = ?2 AND org <> '' AND subject <> ?1"
    "   AND decision = 1"
    "   AND created_ms >= ?3 AND created_ms <= ?4"
    " ORDER BY created_ms, seq";

static const char sql_get[] =
    "SELECT " ROW_COLS " FROM requests WHERE request_id = ?1";


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

void qg__sq_log(const qg__sq *s, const char *fmt, ...)
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
            qg__sq_log(s, "ledger %s: mode %03o lets other users read it (it "
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
    (void)qg__sq_pcache_install();
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
    qg__sq_writer_finalize(s);
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
    if (qg__sq_cache_open(&s->cache, s->wdb, o->cache_kb) != SQLITE_OK) {
        qg__sq_fail_db(s->wdb, path, "cannot size the page cache", err,
                       errcap);
        goto fail;
    }
    if (qg__sq_writer_prepare(s) != SQLITE_OK ||
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
            qg__sq_log(s, "ledger %s: %lld rows written by another program "
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

static int64_t sq_cache_bytes(void *b)
{
    qg__sq *s = b;
    return (int64_t)atomic_load_explicit(&s->cache.kb,
                                         memory_order_relaxed) * 1024;
}

static const qg__ledger_rows_ops sq_rows = {
    qg__sq_write_batch,
    sq_scan,
    sq_get,
    sq_scan_ids,
    sq_spool_applied,
    sq_last_read_error,
    sq_estimate,
    sq_scan_entity,
    sq_cache_bytes,
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
