/* ledger_sqlite.h - private to the SQLite ledger backend: the handle
 * shared by ledger_sqlite.c (opening, reading request rows),
 * ledger_sqlite_writer.c (the batch writer) and ledger_sqlite_admin.c
 * (subjects and keys), and small binding helpers.
 * Not for use outside src/ledger. */
#ifndef QG_LEDGER_SQLITE_H
#define QG_LEDGER_SQLITE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_backend.h"

/* The writer's sums of the history's rollup for the batch being written
 * (ledger_sqlite_rollup.c). */
struct qg__sq_sum;
typedef struct qg__sq_rollup {
    sqlite3_stmt *prior, *add, *bump, *bump_old, *move, *unrecent;
    struct qg__sq_sum *sums;    /* open addressing, cap a power of 2 */
    uint32_t *used;             /* the n slots of sums in use */
    uint32_t cap;
    size_t n;
    int64_t newest_ms;          /* the newest row counted since the open */
    int64_t moved_before;       /* recent slots before it were moved */
    int64_t moving;             /* what the open transaction moves, or 0 */
} qg__sq_rollup;

/* The writer's filling of subject_rows (ledger_sqlite_subject_rows.c):
 * subjects in at most QG_SQ_SLICES slices by name, each with its mark. */
#define QG_SQ_SLICES 8
#define QG_SQ_SAMPLE 64         /* rows read to cut a fill into slices */
typedef struct qg__sq_slices {
    int n;                      /* slice j: subjects from lo[j] up to */
    char lo[QG_SQ_SLICES][sizeof ((qg_ledger_row *)0)->subject];
                                /* lo[j + 1] (lo[0] is "") */
} qg__sq_slices;
typedef struct qg__sq_subject_rows {
    sqlite3_stmt *fill, *top, *mark_st, *sample, *unmark, *add_mark;
    qg__sq_slices cut;          /* the slices in the file */
    int64_t marks[QG_SQ_SLICES];    /* slice j's last rowid filled */
    int next;                   /* the round's next slice; cut.n: none */
    int64_t round_top;          /* the round's last rowid */
    int pending;                /* the slice the open transaction fills
                                 * (-1: none), up to pending_to */
    int64_t pending_to;
    int recut;                  /* the open transaction wrote next_cut
                                 * into the file, every mark the old one */
    qg__sq_slices next_cut;
    size_t waiting;             /* rows written since the last round */
    int64_t since_ms;           /* when the first of them was */
    int every_rows, every_ms;
    char samples[QG_SQ_SAMPLE][sizeof ((qg_ledger_row *)0)->subject];
} qg__sq_subject_rows;

/* The mark of the slice holding the subject named by the SQL expression
 * subj: the rows above it are not in subject_rows yet. */
#define QG_SQ_MARK_OF(subj) \
    "(SELECT seq FROM subject_rows_mark WHERE lo <= " subj \
    " ORDER BY lo DESC LIMIT 1)"

/* The row a statement may replace, read just before it: what it counts
 * (the rollup) and who holds its request id (the writer's guards). */
typedef struct qg__sq_prior {
    int found, decision;
    int64_t weight_milli, created_ms;
    char subject[sizeof ((qg_ledger_row *)0)->subject];
    char model[sizeof ((qg_ledger_row *)0)->model];
} qg__sq_prior;

/* The checkpointer (ledger_sqlite_checkpoint.c): the WAL checkpointed
 * on its own thread and connection, not inside the writer's COMMITs. */
typedef struct qg__sq_ckpt {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sqlite3 *db;                /* its own connection (sq_open's cdb) */
    int pending, stop, ready, started;
    int woken_at;               /* WAL frames at the last wake (writer's) */
} qg__sq_ckpt;

/* The writer's page cache, which starts at 2 MiB and doubles up to
 * max_kb (0: QG_SQ_CACHE_MAX_KB) while more than a quarter of the rows
 * written read a page from the file, and tries half its size again
 * once they read almost none (ledger_sqlite_pcache.c). */
#define QG_SQ_CACHE_MAX_KB 65536
typedef struct qg__sq_cache {
    atomic_int kb;              /* now (written by the writer only) */
    int max_kb;                 /* the most it grows to */
    int min_kb;                 /* the least it shrinks to: where it began */
    uint64_t rows;              /* written since the last look */
    int quiet;                  /* looks in a row that found almost no
                                   page read */
    int quiet_need;             /* quiet looks before half is tried */
    int trying;                 /* 1: halved at the last look, which the
                                   next one judges */
} qg__sq_cache;

typedef struct qg__sq {
    qg_ledger_opts o;
    char path[1024];

    sqlite3 *wdb;               /* writer thread only (and open/close) */
    sqlite3_stmt *upsert;
    sqlite3_stmt *settle;        /* upsert of a settle's columns only */
    sqlite3_stmt *insert_new;    /* insert of a row whose id is not there */
    sqlite3_stmt *insert_run;    /* insert_new for INSERT_RUN rows at once */
    sqlite3_stmt *rowid_of;      /* a request id's rowid */
    sqlite3_stmt *begin_st, *commit_st, *rollback_st;
    qg__sq_cache cache;         /* writer thread only */
    qg__sq_rollup rollup;       /* writer thread only */
    qg__sq_subject_rows subject_rows; /* writer thread only */
    sqlite3 *cdb;               /* the checkpointer's */
    qg__sq_ckpt ckpt;

    pthread_mutex_t scan_mu;    /* guards sdb and scan_st */
    sqlite3 *sdb;
    sqlite3_stmt *scan_st;

    pthread_mutex_t admin_mu;   /* guards adb */
    sqlite3 *adb;


    pthread_mutex_t get_mu;     /* guards gdb and get_st: one row by id,
                                   asked on every check of an id the
                                   counters do not remember */
    sqlite3 *gdb;
    sqlite3_stmt *get_st;

    pthread_mutex_t hist_mu;    /* guards hdb and its statements: the
                                   history reads (ledger_sqlite_history.c) */
    sqlite3 *hdb;
    sqlite3_stmt *slots_st, *first_st, *latest_st;

    pthread_mutex_t err_mu;     /* guards read_err */
    char read_err[256];         /* why the last failed read failed */
    int mutexes_ready;
} qg__sq;

/* SQLite result code -> QG error code. */
static inline int qg__sq_map_rc(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return QG_OK;
    case SQLITE_NOMEM:
        return QG_ENOMEM;
    case SQLITE_CONSTRAINT:
        return QG_ESTATE;
    case SQLITE_TOOBIG:
    case SQLITE_RANGE:
        return QG_EINVAL;
    default:
        return QG_EIO;
    }
}

/* Bind a fixed-size char field as text (bounded even if not terminated).
 * SQLITE_STATIC: the row outlives the statement's step. */
static inline int qg__sq_bind_field(sqlite3_stmt *st, int i,
                                    const char *f, size_t cap)
{
    return sqlite3_bind_text(st, i, f, (int)strnlen(f, cap), SQLITE_STATIC);
}

#define BIND_STR(st, i, field) \
    qg__sq_bind_field(st, i, field, sizeof(field))

/* Copy a text column into a fixed buffer, truncating; no allocation. */
static inline void qg__sq_col_text(sqlite3_stmt *st, int i, char *dst,
                                   size_t cap)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    size_t n = t ? (size_t)sqlite3_column_bytes(st, i) : 0;
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(dst, t, n);
    dst[n] = '\0';
}

#define COL_STR(st, i, field) qg__sq_col_text(st, i, field, sizeof(field))

/* The requests table's columns in the order every statement reads and
 * binds them, and a row read back from a statement that selected them. */
#define ROW_COLS \
    "request_id, subject, org, plan, rules_version, weights_version, model," \
    " \"window\", decision, status, estimated, input_tokens, output_tokens," \
    " reserved_milli, weight_milli, created_ms, settled_ms, overage_milli," \
    " overage_price_micro, overage_cost_micro, headroom_milli, detail," \
    " fallback"
void qg__sq_read_row(sqlite3_stmt *st, qg_ledger_row *r);

/* ledger_sqlite_writer.c: the writer's statements (prepare: SQLite's
 * code; finalize: any of them NULL is fine) and a batch of rows in one
 * transaction (ledger_backend.h, write_batch). */
int qg__sq_writer_prepare(qg__sq *s);
void qg__sq_writer_finalize(qg__sq *s);
int qg__sq_write_batch(void *b, qg__ledger_item *it, size_t n,
                       const qg__spool_mark *mark, char *why, size_t whycap);

/* Remember why a read on db failed (stats' last_read_error). */
void qg__sq_read_failed(qg__sq *s, sqlite3 *db);

/* Subjects and keys (ledger_sqlite_admin.c), on the admin connection
 * under admin_mu; the method tables' semantics (ledger_backend.h). */
extern const qg__ledger_subjects_ops qg__sq_subjects;
extern const qg__ledger_keys_ops qg__sq_keys;

/* The webhook outbox (ledger_sqlite_outbox.c): its own connection per
 * handle. */
extern const qg__ledger_outbox_ops qg__sq_outbox_ops;

/* The rollup (ledger_sqlite_rollup.c), on the writer's connection:
 * prepare/finalize with the writer's statements; per row, before (read
 * the row the statement may replace) and, when the statement changed
 * the row, after (sum the old counts out and the new in); flush writes
 * the sums and moves the slots no longer recent (SQLite codes), clear
 * drops the sums (a failed batch), done after the COMMIT (ok) or the
 * ROLLBACK. */
int qg__sq_rollup_prepare(qg__sq *s);
void qg__sq_rollup_finalize(qg__sq *s);
int qg__sq_rollup_before(qg__sq *s, const qg_ledger_row *row,
                         qg__sq_prior *p);
int qg__sq_rollup_after(qg__sq *s, const qg_ledger_row *row,
                        const qg__sq_prior *p);
int qg__sq_rollup_flush(qg__sq *s);
void qg__sq_rollup_clear(qg__sq *s);
void qg__sq_rollup_done(qg__sq *s, int ok);

/* subject_rows (ledger_sqlite_subject_rows.c), on the writer's connection:
 * prepare (reads the mark; QG_OK or QG_EIO) and finalize with the
 * writer's statements; catch_up, at open, fills it from every row above
 * the mark (rows filled, or -1 and SQLite's reason in why); flush, in
 * each batch's transaction after its rows (the number given), fills the
 * table from the rows above the mark when due (SQLite codes); done after
 * the COMMIT (ok) or the ROLLBACK. */
int qg__sq_subject_rows_prepare(qg__sq *s);
void qg__sq_subject_rows_finalize(qg__sq *s);
int64_t qg__sq_subject_rows_catch_up(qg__sq *s, char *why,
                                     size_t whycap);
int qg__sq_subject_rows_flush(qg__sq *s, size_t rows);
void qg__sq_subject_rows_done(qg__sq *s, int ok);

/* Start the checkpointer on its connection own, hooked to the writer's
 * commits (QG_OK; else the writer keeps SQLite's automatic checkpoints);
 * stop it (the writer's automatic checkpoints back) before either
 * connection closes. */
int qg__sq_ckpt_start(qg__sq_ckpt *c, sqlite3 *writer, sqlite3 *own);
void qg__sq_ckpt_stop(qg__sq_ckpt *c, sqlite3 *writer);

/* ledger_sqlite_vfs.c: the VFS the writer's connection opens in durable
 * mode, which gathers a transaction's WAL writes into one write;
 * registered (not as the default) on the first call, SQLITE_OK once it
 * is there. */
#define QG_SQ_VFS "qg-gather"
int qg__sq_vfs_register(void);

/* One line for the operator through the options' log (nothing without
 * one), from the opening thread or the writer's. */
void qg__sq_log(const qg__sq *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ledger_sqlite_pcache.c: the writer's page cache (qg__sq_cache above).
 * Set the first size on db (the writer's connection): an SQLite code. */
int qg__sq_cache_open(qg__sq_cache *c, sqlite3 *db, int max_kb);
/* After a commit of n rows: the new size in KiB when the cache grew or
 * shrank (the rows since the last look in *rows, the pages they read
 * from the file in *misses), else 0. */
int qg__sq_cache_count(qg__sq_cache *c, sqlite3 *db, size_t n,
                       uint64_t *rows, uint64_t *misses);
/* The size after a look at `rows` rows that read `misses` pages: what
 * qg__sq_cache_count decides, without SQLite (tests drive it). */
int qg__sq_cache_next(qg__sq_cache *c, uint64_t rows, uint64_t misses);

/* And the layer under SQLite's default page cache that gives the
 * B-tree's page swaps a number just above the cache's pages, so that a
 * commit does not walk a large cache whole.  Installed once, before
 * SQLite initializes (qg__ledger_process_init); SQLITE_OK when it is in
 * (then or before), else sqlite3_config's refusal.  Whether it is in,
 * and the swaps it has renumbered so far: for the tests. */
int qg__sq_pcache_install(void);
int qg__sq_pcache_installed(void);
unsigned long qg__sq_pcache_swaps(void);

/* ledger_sqlite_schema.c: "ledger PATH: what: SQLite's message" into
 * err (QG_EIO); the file's schema version; the refusal of a version newer
 * than this build (QG_ESTATE); the pending migrations, in one transaction
 * (QG_OK, or the error with err). */
int qg__sq_fail_db(sqlite3 *db, const char *path, const char *what,
                   char *err, size_t errcap);
int qg__sq_user_version(sqlite3 *db, int *out);
int qg__sq_too_new(int v, const char *path, char *err, size_t errcap);
int qg__sq_migrate(sqlite3 *db, const char *path, char *err, size_t errcap);

/* History reads (ledger_sqlite_history.c), on hdb under hist_mu.
 * prepare: the statements on hdb (open, after the migration); QG_OK or
 * QG_EIO with err.  finalize: closes what prepare made (close). */
extern const qg__ledger_history_ops qg__sq_history;
int qg__sq_history_prepare(qg__sq *s, char *err, size_t errcap);
void qg__sq_history_finalize(qg__sq *s);

#endif
