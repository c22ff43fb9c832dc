/* ledger_sqlite.h - private to the SQLite ledger backend: the handle
 * shared by ledger_sqlite.c (schema, writer thread, request rows) and
 * ledger_sqlite_admin.c (subjects and keys), and small binding helpers.
 * Not for use outside src/ledger. */
#ifndef QG_LEDGER_SQLITE_H
#define QG_LEDGER_SQLITE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "idfilter.h"
#include "ledger.h"

/* One queued row with its callback. */
typedef struct qg__sq_item {
    qg_ledger_row row;
    qg_ledger_done done;
    void *arg;
    size_t merged;              /* writer: folded into row merged - 1 of
                                   its batch (coalesce), not written; 0 no */
    int refused;                /* writer: not written, the ledger holds
                                   the id for another request (guards) */
} qg__sq_item;

typedef struct qg__sq {
    qg_ledger_opts o;
    char path[1024];

    sqlite3 *wdb;               /* writer thread only (and open/close) */
    sqlite3_stmt *upsert;
    sqlite3_stmt *settle;        /* upsert of a settle's columns only */
    sqlite3_stmt *owner;         /* who holds a request id (guards) */
    sqlite3_stmt *begin_st, *commit_st, *rollback_st;

    pthread_mutex_t scan_mu;    /* guards sdb and scan_st */
    sqlite3 *sdb;
    sqlite3_stmt *scan_st;

    pthread_mutex_t admin_mu;   /* guards adb */
    sqlite3 *adb;

    qg__idf idf;                /* ids in the ledger (opts.id_filter) */

    pthread_mutex_t get_mu;     /* guards gdb and get_st: one row by id,
                                   asked on every check of an id the
                                   counters do not remember */
    sqlite3 *gdb;
    sqlite3_stmt *get_st;

    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t cv;
    qg__sq_item *q;             /* queued rows */
    size_t qlen, qcap;
    int64_t q_since_us;         /* monotonic time q became non-empty */
    qg__sq_item *w;             /* the writer's rows (writer thread only) */
    size_t wcap;
    uint32_t *cmap;             /* writer: request id -> row, per batch */
    size_t cmap_cap;
    size_t inflight;            /* rows taken by the writer, not done */
    _Atomic size_t depth;       /* qlen + inflight, for lock-free reads */
    size_t q_urgent;            /* rows in q with a done callback (DURABLE:
                                   someone waits for them) */
    int stop;
    qg_ledger_stats st;
    /* failed transactions (the writer's; read under mu for stats) */
    char werr[256];             /* writer only: SQLite's reason, last fail */
    char wconflict[400];        /* writer only: the last row a guard kept
                                   out (guard_refused) */
    int64_t retry_at_us;        /* after a failure: no write before this */
    int64_t backoff_us;         /* the pause before the next retry */
    int64_t fail_log_us;        /* when a failure was last logged */
    uint64_t fail_txns;         /* failed transactions in this failure */

    pthread_t thread;
    int thread_started;
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

/* Remember why a read on db failed (stats' last_read_error). */
void qg__sq_read_failed(qg__sq *s, sqlite3 *db);

/* Subjects and keys (ledger_sqlite_admin.c), on the admin connection
 * under admin_mu; the method table's semantics (ledger.h). */
int qg__sq_put_subject(void *b, const char *subject, const char *plan,
                       const char *org, int64_t anchor_ms, int64_t now_ms);
int qg__sq_scan_subjects(void *b,
                         int (*fn)(const char *subject, const char *plan,
                                   const char *org, int64_t anchor_ms,
                                   void *ud),
                         void *ud);
int qg__sq_put_key(void *b, const qg_key_rec *k);
int qg__sq_get_key(void *b, const char *id, qg_key_rec *out);
int qg__sq_list_keys(void *b, int (*fn)(const qg_key_rec *k, void *ud),
                     void *ud);
int qg__sq_revoke_key(void *b, const char *id, int64_t now_ms);


/* Shared by ledger_sqlite.c (open, schema, reads) and
 * ledger_sqlite_writer.c (the queue and the writer thread). */
int64_t qg__sq_mono_us(void);
/* Say something to the operator (opts.log), printf-style. */
void qg__sq_log(const qg__sq *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Bind a row's columns to an upsert statement (ledger_sqlite.c's
 * ROW_COLS order). */
int qg__sq_bind_row(sqlite3_stmt *st, const qg_ledger_row *r);
/* The writer thread (started by open, joined by close). */
void *qg__sq_writer_main(void *arg);
/* The backend's submit (ledger.h). */
int qg__sq_submit(void *b, const qg_ledger_row *row, qg_ledger_done done,
                  void *arg);

/* ledger_sqlite_schema.c: "ledger PATH: what: SQLite's message" into
 * err (QG_EIO); the file's schema version; the refusal of a version newer
 * than this build (QG_ESTATE); the pending migrations, in one transaction
 * (QG_OK, or the error with err). */
int qg__sq_fail_db(sqlite3 *db, const char *path, const char *what,
                   char *err, size_t errcap);
int qg__sq_user_version(sqlite3 *db, int *out);
int qg__sq_too_new(int v, const char *path, char *err, size_t errcap);
int qg__sq_migrate(sqlite3 *db, const char *path, char *err, size_t errcap);

#endif
