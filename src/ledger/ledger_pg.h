/* ledger_pg.h - private to the PostgreSQL ledger backend: the handle
 * shared by ledger_pg.c (open, close, reads, the method table),
 * ledger_pg_conn.c (connections and what a failure means),
 * ledger_pg_rows.c (the writer's statements and parameters),
 * ledger_pg_writer.c (write_batch), ledger_pg_schema.c (migrations) and
 * ledger_pg_admin.c (subjects and keys), and the helpers they share.
 * Not for use outside src/ledger. */
#ifndef QG_LEDGER_PG_H
#define QG_LEDGER_PG_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "quotagate.h"

/* ledger.h still declares the front's first method table under the name
 * ledger_backend.h gives the new one (and qg__ledger_sqlite as one of
 * those).  Until the front moves to ledger_backend.h, the old names are
 * set aside while ledger.h is read; with the new ledger.h these two
 * renames touch nothing. */
#define qg__ledger_backend qg__ledger_backend_v1
#define qg__ledger_sqlite qg__ledger_sqlite_v1
#include "ledger.h"
#undef qg__ledger_backend
#undef qg__ledger_sqlite
#include "ledger_backend.h"

/* The PostgreSQL schema's own version (its migrations are not SQLite's:
 * version 1 already has every column of SQLite's version 4; version 2
 * adds what SQLite's version 5 adds, the webhook outbox; version 3 what
 * SQLite's version 6 adds, the history; version 4 what SQLite's version 7
 * adds, the indexes explain reads a subject's and an org's rows by). */
#define QG_PG_SCHEMA_VERSION 4

/* The first key of the advisory locks a writer takes on a batch's
 * subjects before it writes them ("qgls"; the second key is the hash of
 * the subject): every row a batch inserts or updates moves the rollup
 * slots of its subject (usage_slots, kept by triggers one upsert per
 * statement), so two instances' writers that lock their subjects first,
 * in one order, never wait for each other's slots in a cycle. */
#define QG_PG_SUBJECT_LOCKS "1902603379"

/* Built-in type OIDs (fixed in every PostgreSQL; pg_type.h is a server
 * header), for statements prepared with binary parameters. */
#define QG_PG_BYTEA 17
#define QG_PG_INT8 20
#define QG_PG_INT4 23
#define QG_PG_TEXT 25
#define QG_PG_INT4ARRAY 1007
#define QG_PG_TEXTARRAY 1009
#define QG_PG_INT8ARRAY 1016

/* Row columns, in the order of qg_ledger_row (and of every statement
 * that names them). */
#define QG_PG_ROW_COLS \
    "request_id, subject, org, plan, rules_version, weights_version, model," \
    " \"window\", decision, status, estimated, input_tokens, output_tokens," \
    " reserved_milli, weight_milli, created_ms, settled_ms, overage_milli," \
    " overage_price_micro, overage_cost_micro, headroom_milli, detail," \
    " fallback"
#define QG_PG_NCOLS 23

/* How write_batch sends a round's rows of one kind (docs/ledger-postgresql.md
 * measures the ways): one prepared statement per row, pipelined, or one
 * statement of arrays (unnest).  The arrays cost more for a few rows
 * (about 190 us a statement against 75 us for one row) and much less per
 * row for many (1.5x the rows/s from 256 rows on); AUTO sends fewer than
 * QG_PG_ARRAY_MIN rows one by one and more as arrays.  Every way sends a
 * transaction in as few round trips, with the same guards. */
typedef enum qg__pg_write_mode {
    QG_PG_WRITE_AUTO = 0,       /* the default */
    QG_PG_WRITE_ARRAYS = 1,     /* always arrays (measurements, tests) */
    QG_PG_WRITE_PIPELINE = 2    /* always row by row (the same) */
} qg__pg_write_mode;
#define QG_PG_ARRAY_MIN 16

typedef struct qg__pg qg__pg;

/* One connection and what it is for.  Used under mu only; connected on
 * first use and again after it was lost (qg__pg_use). */
typedef struct qg__pg_conn {
    pthread_mutex_t mu;
    PGconn *c;
    const char *name;           /* "writer", "scan", ... for messages */
    int sync_on;                /* make synchronous_commit at least "on" */
    int sync_off;               /* synchronous_commit off (ASYNC writer) */
    /* the statements of this concern, prepared on every new connection */
    int (*prepare)(PGconn *c, char *why, size_t cap);
} qg__pg_conn;

/* A growable byte buffer with a hard cap (arrays of a batch). */
typedef struct qg__pg_buf {
    char *p;
    size_t len, cap;
} qg__pg_buf;

struct qg__pg {
    qg_ledger_opts o;
    char url[1024];             /* as given: libpq reads it */
    char shown[1024];           /* the same without a password, for
                                   messages */
    qg__pg_conn w;              /* the writer: write_batch, spool_applied */
    qg__pg_conn scan;           /* scan, scan_ids */
    qg__pg_conn get;            /* get */
    qg__pg_conn subj;           /* subjects */
    qg__pg_conn keys;           /* keys */
    qg__pg_conn hist;           /* history reads (ledger_pg_history.c) */
    pthread_mutex_t err_mu;     /* guards read_err */
    char read_err[512];         /* why the last failed read failed */
    int mutexes;                /* how many mutexes are initialised */

    /* the writer's (writer thread only) */
    qg__pg_write_mode mode;
    qg__pg_buf col[QG_PG_NCOLS];   /* arrays: one binary array per column */
    qg__pg_buf scratch;            /* pipeline: one row's numbers; ids */
    uint32_t *map;                 /* request id -> item + 1, per batch */
    size_t map_cap;
    uint32_t *round;               /* each item's round (ids unique in
                                      one round) */
    size_t round_cap;
    uint32_t *pick;                /* [0, n): the items of a round's
                                      statements; [n, 2n): the rows the
                                      guards stopped */
    size_t pick_cap;
};

/* ------------------------------------------------ ledger_pg_conn.c */

/* A new connection to g->url, with our defaults under the URL's own
 * settings.  NULL with libpq's reason in why. */
PGconn *qg__pg_conn_new(qg__pg *g, char *why, size_t cap);
/* k->c's session settings, then k->prepare.  QG_OK or an error. */
int qg__pg_conn_setup(qg__pg_conn *k, char *why, size_t cap);
/* One statement without parameters (BEGIN, ROLLBACK, SET ...); why may
 * be NULL.  QG_OK or an error. */
int qg__pg_run_ctl(PGconn *c, const char *sql, char *why, size_t cap);
/* The URL for messages: without a password (user:secret@, password=). */
void qg__pg_redact(const char *url, char *out, size_t cap);

/* Make sure k is connected (connecting, or again after a loss: session
 * settings and k->prepare).  k->mu held.  QG_OK, or QG_ELEDGER with
 * libpq's reason in why. */
int qg__pg_use(qg__pg *g, qg__pg_conn *k, char *why, size_t cap);
/* Drop k's connection (the next qg__pg_use makes a new one). */
void qg__pg_drop(qg__pg_conn *k);
/* The code and message of a failed statement (r may be NULL: the
 * connection's message): QG_ELEDGER when the server cannot be reached
 * (connection refused or lost, shutting down, read-only or in recovery),
 * QG_EIO otherwise.  The message without libpq's trailing newline. */
int qg__pg_fail(PGconn *c, const PGresult *r, char *why, size_t cap);
/* Remember why a read failed (last_read_error). */
void qg__pg_read_failed(qg__pg *g, const char *why);
/* Say something to the operator (opts.log), printf-style. */
void qg__pg_log(const qg__pg *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Run a prepared statement with binary parameters (formats all 1) and
 * binary results, on k (held), connecting first; a statement that fails
 * because an old connection was lost is tried once more on a new one
 * when retry is set (reads and idempotent writes).  Returns QG_OK with
 * *res (PQclear it), or an error with why. */
int qg__pg_exec(qg__pg *g, qg__pg_conn *k, const char *stmt, int n,
                const char *const *vals, const int *lens, int retry,
                PGresult **res, char *why, size_t cap);

/* Read a query's rows in chunks through a cursor on k (held), binary
 * parameters of the given types and binary results: fn for each row; a
 * nonzero return stops and is returned.  A connection that died before
 * the first row is made again once.  QG_OK, fn's value, or an error. */
int qg__pg_cursor(qg__pg *g, qg__pg_conn *k, const char *sql, int n,
                  const Oid *types, const char *const *vals, const int *lens,
                  int (*fn)(const PGresult *r, int row, void *ud), void *ud,
                  char *why, size_t cap);

/* ------------------------------------------------------ ledger_pg.c */

/* Binary values: big-endian integers in and out, text cells bounded. */
void qg__pg_put64(unsigned char *p, int64_t v);
void qg__pg_put32(unsigned char *p, int32_t v);
int64_t qg__pg_int(const PGresult *r, int row, int col);
void qg__pg_text(const PGresult *r, int row, int col, char *dst,
                 size_t cap);

/* Append to a buffer, growing it up to cap bytes.  0 or QG_ENOMEM. */
int qg__pg_buf_add(qg__pg_buf *b, const void *p, size_t n, size_t cap);

/* 1 when s[0..n) is valid UTF-8 (what a UTF8 database stores). */
int qg__pg_utf8_ok(const char *s, size_t n);

/* Row columns from a binary result's row (QG_PG_ROW_COLS order). */
void qg__pg_read_row(const PGresult *r, int row, qg_ledger_row *out);

/* ------------------------------------------------ ledger_pg_rows.c */

/* All parameters binary (formats of QG_PG_NCOLS parameters). */
extern const int qg__pg_binary[QG_PG_NCOLS];
/* The writer's statements (its connection's prepare). */
int qg__pg_prepare_writer(PGconn *c, char *why, size_t cap);
/* The name of r's first text field that is not valid UTF-8, or NULL. */
const char *qg__pg_bad_text(const qg_ledger_row *r);
/* Send r's upsert (whole row or settle) into the pipeline: PQsend's
 * 1 or 0. */
int qg__pg_send_row(PGconn *c, const qg_ledger_row *r);
/* Send the rows it[g->pick[first ... first + k)] (all whole rows, or all
 * settles) as one statement of arrays (g->col).  QG_OK or an error. */
int qg__pg_send_arrays(qg__pg *g, PGconn *c, const qg__ledger_item *it,
                       size_t first, size_t k, int settle, char *why,
                       size_t cap);
/* A binary one-dimensional array of elem in b: start (b emptied), add
 * each element, then set its count.  0 or QG_ENOMEM (its cap: 64 MiB). */
int qg__pg_array_start(qg__pg_buf *b, Oid elem);
int qg__pg_array_add(qg__pg_buf *b, const void *p, size_t n);
void qg__pg_array_count(qg__pg_buf *b, size_t n);

/* ---------------------------------------------- ledger_pg_writer.c */

int qg__pg_write_batch(void *b, qg__ledger_item *it, size_t n,
                       const qg__spool_mark *mark, char *why, size_t whycap);
/* Choose how batches are sent (the benchmark measures every way, the
 * tests run each); before the writer runs, or from its thread. */
void qg__pg_set_write_mode(void *b, qg__pg_write_mode mode);

/* ---------------------------------------------- ledger_pg_schema.c */

/* Create or migrate the schema on c, in one transaction under an
 * advisory lock (several instances opening at once migrate once); a
 * database newer than this build is refused (QG_ESTATE).  QG_OK or an
 * error with a message naming `shown` in err. */
int qg__pg_migrate(PGconn *c, const char *shown, char *err, size_t errcap);

/* ----------------------------------------------- ledger_pg_admin.c */

extern const qg__ledger_subjects_ops qg__pg_subjects_ops;
extern const qg__ledger_keys_ops qg__pg_keys_ops;
int qg__pg_prepare_subjects(PGconn *c, char *why, size_t cap);
int qg__pg_prepare_keys(PGconn *c, char *why, size_t cap);

/* ---------------------------------------------- ledger_pg_outbox.c */

extern const qg__ledger_outbox_ops qg__pg_outbox_ops;
/* --------------------------------------------- ledger_pg_history.c */

extern const qg__ledger_history_ops qg__pg_history_ops;
int qg__pg_prepare_history(PGconn *c, char *why, size_t cap);

#endif
