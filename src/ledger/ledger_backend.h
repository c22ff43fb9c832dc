/* ledger_backend.h - what a ledger backend implements, private to
 * src/ledger.  The front (ledger.c, ledger_writer.c, ledger_spool.c) owns
 * everything that is the same for every database: the queue of rows, the
 * writer thread and its group commit, coalescing a settle into its
 * check's row, retries after a failed transaction, the request-id filter,
 * the spool of a shared ledger that cannot be reached, and statistics.
 * A backend writes one batch of rows in one transaction and reads; its
 * concerns are four method tables: usage rows, subjects, API keys, and
 * (version 3) the history reads.
 *
 * Threads: rows->write_batch is called by the writer thread only (and
 * rows->spool_applied from it or before it starts); every other method
 * may be called from any thread at any time, and a backend serialises
 * them itself (a connection per concern under a mutex). */
#ifndef QG_LEDGER_BACKEND_H
#define QG_LEDGER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ledger.h"

#define QG_LEDGER_BACKEND_VERSION 5

/* One queued row with its callback, as the writer hands it over. */
typedef struct qg__ledger_item {
    qg_ledger_row row;
    qg_ledger_done done;
    void *arg;
    size_t merged;              /* folded into item merged - 1 of the same
                                   batch by the front (a settle into its
                                   check's row): the backend skips it */
    int refused;                /* set by write_batch: not written, the
                                   ledger holds the id for another request
                                   (the guards, below) */
    int64_t seq;                /* spool sequence number (ledger_spool.c),
                                   0 when the row was never spooled */
} qg__ledger_item;

/* Where a replayed spool stands: write_batch records (spool_id, seq) in
 * the same transaction as the rows, so a replay interrupted anywhere
 * resumes after the last committed row, never writing one twice. */
typedef struct qg__spool_mark {
    const char *spool_id;       /* this instance's spool (ledger_spool.c) */
    int64_t seq;                /* the batch's last row */
} qg__spool_mark;

/* Usage rows.
 *
 * write_batch: write it[0..n) (skipping merged items) in ONE transaction
 * and commit it durably, or write none.  The guards (the same in every
 * backend, tested against each): a whole row (settle_only 0) is inserted,
 * or replaces a row of the same request id only when that row is of the
 * same subject and either a refusal (decision != 1) or an admitted,
 * unsettled row that the whole row settles (decision 1, status not 1: the
 * request's check row with its settle folded in, replayed from a spool
 * after a commit of the check row whose answer was lost); a settle-only
 * row updates status, estimated, input/output tokens, weight_milli, settled_ms,
 * overage_milli, overage_cost_micro and detail of an admitted (decision
 * 1), unsettled (status 1) row of its request id whose subject is the
 * settle's (or any, when the settle's subject is ""), or is inserted whole
 * when there is no row.  A statement the guards stop changes nothing: the
 * row is `refused`, except a settle-only row that finds its request's
 * admitted row of the same subject (or none named) settled already (a
 * repeated settle: not refused).  mark, when not NULL, is recorded in the
 * same transaction (spool_applied reads it back).  Returns QG_OK (why:
 * what the last refused row was, for the log, or ""), or an error with
 * the database's reason in why: QG_ELEDGER when the database
 * cannot be reached (connection refused, lost, not accepting writes: a
 * spool may take the rows), another code otherwise.
 *
 * scan / get: as qg__ledger_scan / qg__ledger_get (ledger.h).
 * scan_ids: every request id of the ledger, any order, for the filter;
 * fn returns 0 to go on.  spool_applied: the last seq recorded for
 * spool_id, 0 when none.  last_read_error: why the last failed read
 * failed, copied into out (empty when none).  estimate: the number of
 * rows, roughly (to size the filter), or -1.  cache_bytes: the most
 * the writer's page cache holds now (any thread). */
typedef struct qg__ledger_rows_ops {
    int (*write_batch)(void *b, qg__ledger_item *it, size_t n,
                       const qg__spool_mark *mark, char *why, size_t whycap);
    int (*scan)(void *b, int64_t since_ms,
                int (*fn)(const qg_ledger_row *row, void *ud), void *ud);
    int (*get)(void *b, const char *request_id, qg_ledger_row *out);
    int (*scan_ids)(void *b, int (*fn)(const char *id, size_t len, void *ud),
                    void *ud);
    int (*spool_applied)(void *b, const char *spool_id, int64_t *seq);
    void (*last_read_error)(void *b, char *out, size_t cap);
    int64_t (*estimate)(void *b);   /* rows in the ledger, roughly (to size
                                       the id filter); -1 unknown */
    int (*scan_entity)(void *b, const char *subject, const char *org,
                       int64_t since_ms, int64_t until_ms,
                       int (*fn)(const qg_ledger_row *row, void *ud),
                       void *ud);
    int64_t (*cache_bytes)(void *b);  /* the writer's page cache now;
                                         NULL: none (PostgreSQL) */
} qg__ledger_rows_ops;

/* Subjects created through the admin API; durable on return.  get: 0 or
 * QG_ENOTFOUND.  scan_since: subjects whose updated_ms >= since_ms (0:
 * all), as qg__ledger_scan_subjects. */
typedef struct qg__ledger_subjects_ops {
    int (*put)(void *b, const char *subject, const char *plan,
               const char *org, int64_t anchor_ms, int64_t now_ms);
    int (*get)(void *b, const char *subject, char *plan, size_t plancap,
               char *org, size_t orgcap, int64_t *anchor_ms);
    int (*scan_since)(void *b, int64_t since_ms,
                      int (*fn)(const char *subject, const char *plan,
                                const char *org, int64_t anchor_ms,
                                void *ud),
                      void *ud);
} qg__ledger_subjects_ops;

/* API keys (hashes only), as qg__ledger_put_key and the rest (ledger.h). */
typedef struct qg__ledger_keys_ops {
    int (*put)(void *b, const qg_key_rec *k);
    int (*get)(void *b, const char *id, qg_key_rec *out);
    int (*list)(void *b, int (*fn)(const qg_key_rec *k, void *ud), void *ud);
    int (*revoke)(void *b, const char *id, int64_t now_ms);
} qg__ledger_keys_ops;

/* The webhook outbox (version 3; ledger.h, "the webhook outbox"): open
 * makes a handle with its own connection to the backend b is (one per
 * thread that uses it: the front never shares one between threads);
 * the rest as the qg__outbox_* functions of ledger.h, given the event id
 * the front derived (id_of) for fire.  fire takes the mark and inserts
 * the rows in one transaction, and must be safe against other processes
 * doing the same at once (a unique key decides, never a read first). */
typedef struct qg__ledger_outbox_ops {
    void *(*open)(void *b, char *err, size_t errcap);
    void (*close)(void *ob);
    int (*fire)(void *ob, qg_outbox_event *ev, const char *const *urls,
                int nurls, int *fired,
                void (*id_of)(const qg_outbox_event *ev, int64_t episode,
                              char *id),
                char *why, size_t whycap);
    int (*rearm)(void *ob, const char *subject, const char *window,
                 int64_t threshold_milli, char *why, size_t whycap);
    int (*claim)(void *ob, const char *owner, int64_t now_ms,
                 int64_t lease_ms, qg_outbox_event *out, int max, int *n,
                 char *why, size_t whycap);
    int (*release)(void *ob, const char *owner, char *why, size_t whycap);
    /* state 1 delivered, 2 given up: the row's end; error may be NULL */
    int (*finish)(void *ob, const char *id, const char *url, int state,
                  int64_t now_ms, const char *error, char *why,
                  size_t whycap);
    int (*retry)(void *ob, const char *id, const char *url, int64_t next_ms,
                 int attempts, const char *error, char *why, size_t whycap);
    int (*backlog)(void *ob, int64_t *pending, int64_t *oldest_ms,
                   char *why, size_t whycap);
} qg__ledger_outbox_ops;
/* History reads (version 4), as qg__ledger_slots, qg__ledger_first_usage
 * and qg__ledger_latest (ledger.h), on a connection of their own so that
 * a long read never holds up the writer, get or scan.  The rollup
 * (usage_slots) is the backend's to keep, in the same transaction as the
 * rows (both backends: triggers created by the schema's migration). */
typedef struct qg__ledger_history_ops {
    int (*slots)(void *b, const char *subject, int64_t from_ms,
                 int64_t to_ms, int (*fn)(const qg_usage_slot *s, void *ud),
                 void *ud);
    int (*first_usage)(void *b, const char *subject, int64_t *start_ms);
    int (*latest)(void *b, const char *subject, int64_t before_ms, int limit,
                  int (*fn)(const qg_ledger_row *row, void *ud), void *ud);
} qg__ledger_history_ops;

typedef struct qg__ledger_backend {
    const char *name;           /* "sqlite", "postgresql" */
    int version;                /* QG_LEDGER_BACKEND_VERSION */
    int shared;                 /* other processes write rows to the same
                                   ledger at the same time (PostgreSQL):
                                   the id filter then cannot answer
                                   "absent" alone, and the front spools
                                   when the database is unreachable */
    /* target: the URL without "sqlite:" (a path) or the whole libpq URL;
     * opts with defaults filled in.  NULL with a message in err. */
    void *(*open)(const char *target, const qg_ledger_opts *opts, char *err,
                  size_t errcap);
    void (*close)(void *b);
    const qg__ledger_rows_ops *rows;
    const qg__ledger_subjects_ops *subjects;
    const qg__ledger_keys_ops *keys;
    const qg__ledger_outbox_ops *outbox;   /* version 3 */
    const qg__ledger_history_ops *history;
} qg__ledger_backend;

extern const qg__ledger_backend qg__ledger_sqlite;
extern const qg__ledger_backend qg__ledger_postgresql;

#endif
