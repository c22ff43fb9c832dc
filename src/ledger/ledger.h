/* ledger.h - the durable usage ledger: one row per request.
 *
 * Counters are a cache of the ledger: on start the server rebuilds every
 * window from the rows inside the windows' reach (qg__ledger_scan).  Rows
 * are written by one dedicated writer thread with group commit, off the
 * decision path: qg__ledger_submit copies the row into a bounded queue and
 * returns; the writer takes everything queued, writes it in one
 * transaction, commits (fsync in durable mode), then calls each row's
 * `done` callback on the writer thread.  A settle is acknowledged to its
 * client only from `done`; a check's row needs no callback (its settle
 * carries the final charge with the reservation's instant and weight, so
 * a settle whose check row never reached the file is still counted).
 *
 * When a transaction fails (disk full, I/O error, another process holding
 * the write lock past busy_timeout_ms), rows somebody waits for get their
 * `done` with the error and every other row (in ASYNC mode: every row,
 * already acknowledged) is put back at the head of the queue and written
 * again after a pause (10 ms, doubling up to 1 s), in its original order;
 * opts.log hears of the failure, of a failure that lasts (every 10 s) and
 * of the first success after it.  Only rows still failing when the ledger
 * closes are given up (counted and logged).
 *
 * Backends behind one method table (ledger_backend.h): SQLite (embedded
 * default, WAL) and PostgreSQL (many instances on one database).  The same
 * database holds the subjects created through the admin API and the API
 * keys (hashes only).  The queue, the writer thread and the retries are
 * the front's, the same for both (ledger_writer.c); a PostgreSQL ledger
 * that cannot be reached writes its rows to a local spool
 * (ledger_spool.c). */
#ifndef QG_LEDGER_H
#define QG_LEDGER_H

#include <stddef.h>
#include <stdint.h>

typedef struct qg_ledger qg_ledger;

#define QG_LEDGER_SCHEMA_VERSION 12

typedef enum qg_row_status {
    QG_ROW_RESERVED = 1,   /* admitted, not settled yet */
    QG_ROW_COMPLETED = 2,
    QG_ROW_CANCELLED = 3,
    QG_ROW_FAILED = 4,
    QG_ROW_REJECTED = 5,   /* refused: nothing charged */
    QG_ROW_EXPIRED = 6     /* never settled: final at the reserved weight */
} qg_row_status;

typedef struct qg_ledger_row {
    char request_id[256];
    char subject[256];
    char org[64];              /* "" when none */
    char plan[64];
    char rules_version[64];
    char weights_version[64];
    char model[64];            /* "" for weight-only requests */
    char window[64];           /* binding window of a refusal, else "" */
    int decision;              /* qg_outcome: 1 allow, 2 reject, 3 never */
    int status;                /* qg_row_status */
    int estimated;             /* usage estimated, not reported */
    int64_t input_tokens;
    int64_t output_tokens;     /* reported (settle), or max_output_tokens */
    int64_t reserved_milli;    /* weight reserved at the check */
    int64_t weight_milli;      /* weight that counts (= reserved until settle) */
    int64_t created_ms;        /* the decision's instant */
    int64_t settled_ms;        /* 0 until settled */
    /* Pay as you go (schema 2): of weight_milli, the points beyond the
     * room the lifted windows had (overage_milli), at overage_price_micro
     * micro-USD per point = overage_cost_micro; the room itself
     * (headroom_milli, -1 when no window was lifted) lets a settle after a
     * restart price the final charge. */
    int64_t overage_milli;
    int64_t overage_price_micro;
    int64_t overage_cost_micro;
    int64_t headroom_milli;
    /* Why the charge differs from what was reported (schema 3), "" when
     * it does not: e.g. the proxy charged max_tokens because the upstream
     * reported more output than the request allowed (docs/proxy.md).
     * Written by the settle. */
    char detail[160];
    /* The decision was made locally while the shared store was down
     * (schema 4; PRODUCT.md 5.1 point 4): 1 on the check's row. */
    int fallback;
    int settle_only;           /* when a row with this request_id exists,
                                  update only status, estimated, tokens,
                                  weight_milli, settled_ms, overage_milli,
                                  overage_cost_micro and detail (a settle);
                                  otherwise insert the row whole */
} qg_ledger_row;

typedef enum qg_ledger_sync {
    QG_LEDGER_DURABLE = 0,     /* settle acked after fsync'd commit */
    QG_LEDGER_ASYNC = 1        /* acked at once; commits every flush_ms */
} qg_ledger_sync;

typedef struct qg_ledger_opts {
    qg_ledger_sync sync;
    int flush_ms;              /* ASYNC: loss bound (default 100 ms) */
    int max_queue;             /* rows queued before submit refuses
                                  (default 65536) */
    int max_batch;             /* rows per transaction (default 4096) */
    int busy_timeout_ms;       /* wait for another process's write lock
                                  (default 5000) */
    /* Where the ledger reports what an operator must see (a file others
     * may read, failed and recovered writes, rows it refused), one line
     * per call without a trailing newline; called from the opening thread
     * or the writer thread.  NULL: nothing is reported. */
    void (*log)(void *log_ud, const char *line);
    void *log_ud;
    int id_filter;             /* keep a filter of the ledger's request ids
                                  so that qg__ledger_get of an absent id
                                  answers from memory (the server asks for
                                  every new id); reads every id at open */
    const char *spool_dir;     /* a shared ledger (PostgreSQL): where its
                                  rows wait while the database cannot be
                                  reached (ledger_spool.c); NULL: none,
                                  such rows are retried in memory */
    int subject_index_rows;    /* SQLite: a subject's rows are indexed
                                  (subject_rows) once this many rows wait
                                  (default 8192) ... */
    int subject_index_ms;      /* ... or this long after the oldest of
                                  them (default 250 ms); whichever comes
                                  first (ledger_sqlite_subject_rows.c) */
    int cache_kb;              /* SQLite: the most the writer's page cache
                                  grows to, in KiB; 0: 64 MiB
                                  (ledger_sqlite_pcache.c) */
} qg_ledger_opts;

/* Once, at process start, before any thread uses SQLite: turns off
 * SQLite's memory statistics, which quotagate never reads and which take
 * a process-wide mutex around every allocation and free the ledger's
 * writer makes (~10 per row; docs/benchmarks.md, "HTTP", the eighth
 * session's steps), and puts the layer of ledger_sqlite_pcache.c over
 * SQLite's page cache, which lets the writer's cache be large.
 * Optional: without it every ledger works the same, a little slower (a
 * writer's cache that has grown is walked whole at each commit). */
void qg__ledger_process_init(void);

/* 1 when url names a PostgreSQL ledger ("postgresql://", "postgres://"),
 * else 0 (SQLite: "sqlite:PATH" or a plain path). */
int qg__ledger_url_is_pg(const char *url);

/* Open (creating and migrating the schema) and start the writer thread.
 * url: "sqlite:PATH", a plain path, or "postgresql://USER@HOST:PORT/DB"
 * (libpq's URI; "postgres://" too).  opts may be NULL.  Returns NULL
 * with a message in err. */
qg_ledger *qg__ledger_open(const char *url, const qg_ledger_opts *opts,
                          char *err, size_t errcap);
/* Drain the queue, commit, stop the writer, close. */
void qg__ledger_close(qg_ledger *l);

typedef void (*qg_ledger_done)(void *arg, int rc);

/* Queue `row` for its request_id.  A whole row (settle_only 0) is
 * inserted, or replaces a refused request's row of the same subject; a
 * settle-only row updates the settle's columns of its admitted, unsettled
 * row (of its subject, when it names one), or is inserted when there is
 * none.  Nothing else overwrites a row (ledger_sqlite_writer.c, the
 * guards).
 * Copies the row.  done (may be NULL) is called on the writer thread once
 * the row is durable (rc 0), failed (rc < 0), or was not written because
 * the ledger holds its id for another request (QG_ESTATE); in ASYNC mode
 * done is called right after queueing.  Returns 0, or QG_EFULL when the
 * queue is full (the caller answers 503). */
int qg__ledger_submit(qg_ledger *l, const qg_ledger_row *row,
                     qg_ledger_done done, void *arg);

/* Call fn for every row with created_ms >= since_ms and decision allow,
 * in created_ms order, from the caller's thread (a separate connection;
 * safe while the writer runs).  The row holds at least what a replay of
 * it reads (request_id, subject, model, decision, status, reserved_milli,
 * weight_milli, created_ms, settled_ms, overage_price_micro,
 * overage_cost_micro, headroom_milli); a backend may leave the other
 * columns empty (SQLite does: the rebuild reads every row in reach).  fn
 * returns 0 to go on; a nonzero value stops the scan and is returned.
 * Returns 0 or an error.  fn must not call qg__ledger_scan itself (the
 * scan connection is held). */
int qg__ledger_scan(qg_ledger *l, int64_t since_ms,
                   int (*fn)(const qg_ledger_row *row, void *ud), void *ud);

/* qg__ledger_scan with the rows read on a thread of its own and fn
 * called from the caller's thread, in the same order, while the next rows
 * are read (ledger_scan_piped.c): the restart's rebuild.  Same results;
 * without memory or a thread for the reader, the plain scan. */
int qg__ledger_scan_piped(qg_ledger *l, int64_t since_ms,
                          int (*fn)(const qg_ledger_row *row, void *ud),
                          void *ud);

/* The admitted rows (decision allow) decided in [since_ms, until_ms] whose
 * subject is `subject` or whose org is `org` ("" or NULL: none), in
 * created_ms order (ties in the order they were written): what one
 * subject's windows and its org's held at an instant (explain).  Read
 * through the subject's rows by time (SQLite: subject_rows, schema 10,
 * and the rows the writer has not put there yet) and the org index, so
 * its cost follows that subject's and org's rows in the span, not the
 * ledger's size.  fn as in qg__ledger_scan, under the same connection. */
int qg__ledger_scan_entity(qg_ledger *l, const char *subject, const char *org,
                           int64_t since_ms, int64_t until_ms,
                           int (*fn)(const qg_ledger_row *row, void *ud),
                           void *ud);

/* One row by request id.  Returns 0, QG_ENOTFOUND, or an error. */
int qg__ledger_get(qg_ledger *l, const char *request_id, qg_ledger_row *out);

/* --------------------------------------------------- subjects and keys */

/* Subjects created or updated through the admin API (durable on return).
 * get_subject: 0 or QG_ENOTFOUND (plan and org copied, truncated to their
 * caps).  scan_subjects_since: those updated at or after since_ms. */
int qg__ledger_put_subject(qg_ledger *l, const char *subject, const char *plan,
                          const char *org, int64_t billing_anchor_ms,
                          int64_t now_ms);
int qg__ledger_scan_subjects(qg_ledger *l,
                            int (*fn)(const char *subject, const char *plan,
                                      const char *org, int64_t anchor_ms,
                                      void *ud),
                            void *ud);
int qg__ledger_scan_subjects_since(qg_ledger *l, int64_t since_ms,
                                  int (*fn)(const char *subject,
                                            const char *plan,
                                            const char *org,
                                            int64_t anchor_ms, void *ud),
                                  void *ud);
int qg__ledger_get_subject(qg_ledger *l, const char *subject, char *plan,
                           size_t plancap, char *org, size_t orgcap,
                           int64_t *anchor_ms);

typedef struct qg_key_rec {
    char id[32];               /* public part, shown by `keys list` */
    char subject[256];         /* subject, or "" for admin/service keys */
    char role[16];             /* "subject", "admin", "service" */
    unsigned char hash[32];    /* SHA-256 of the whole key */
    int64_t created_ms;
    int64_t revoked_ms;        /* 0 = active */
} qg_key_rec;

/* Keys (keys.h makes them).  put_key is durable on return; QG_ESTATE
 * when the id exists.  get_key: 0 or QG_ENOTFOUND.  list_keys: in created
 * order; fn as in qg__ledger_scan.  revoke_key: 0 (also when already
 * revoked: the first revocation time stays) or QG_ENOTFOUND.  Callbacks of
 * scan_subjects and list_keys run with the admin connection held: they
 * must not call the ledger's subject, key or get functions. */
int qg__ledger_put_key(qg_ledger *l, const qg_key_rec *k);   /* durable */
int qg__ledger_get_key(qg_ledger *l, const char *id, qg_key_rec *out);
int qg__ledger_list_keys(qg_ledger *l,
                        int (*fn)(const qg_key_rec *k, void *ud), void *ud);
int qg__ledger_revoke_key(qg_ledger *l, const char *id, int64_t now_ms);

/* Writer statistics for /metrics. */
typedef struct qg_ledger_stats {
    uint64_t queued;            /* rows waiting now */
    uint64_t rows_written;
    uint64_t commits;
    uint64_t commit_us_sum;     /* total commit latency */
    uint64_t commit_us_max;
    uint64_t commit_le_us[8];   /* histogram: <=100us,1ms,5ms,10ms,50ms,
                                   100ms,1s,+Inf (cumulative) */
    uint64_t errors;            /* transactions that failed */
    uint64_t rows_failed;       /* rows whose `done` got an error (their
                                   settles were answered 503) */
    uint64_t rows_retried;      /* rows put back to be written again after
                                   a failed transaction */
    uint64_t rows_lost;         /* rows given up: still failing when the
                                   ledger closed, or no memory to keep them */
    uint64_t rows_refused;      /* rows not written because the ledger
                                   holds their request id for another
                                   request (a settle among them got
                                   QG_ESTATE) */
    int spooling;               /* rows wait in the spool (state
                                   "spooling"): the database could not be
                                   reached */
    uint64_t spool_rows;        /* rows in the spool now */
    uint64_t rows_spooled;      /* rows written to the spool */
    uint64_t rows_replayed;     /* spooled rows written to the database */
    int refusing;               /* neither the database nor the spool takes
                                   rows: checks answer 503 */
    int failing;                /* the last transaction failed (state
                                   "errors"); 0 again after one succeeds */
    char last_error[512];       /* why the last failed one failed */
    char last_read_error[256];  /* why the last failed read (scan, get,
                                   subjects, keys) failed: SQLite's
                                   message and code */
    uint64_t id_filter_ids;     /* request ids in the id filter: the
                                   file's at open, the new ones since */
    int id_filter_levels;       /* its levels (idfilter.h), 0: none */
    uint64_t id_filter_bytes;   /* their memory */
    uint64_t id_reads;          /* lookups by request id (qg__ledger_get)
                                   the filter sent to the database */
    int64_t cache_bytes;        /* SQLite: the writer's page cache now
                                   (it grows: ledger_sqlite_pcache.c);
                                   -1: none */
    const char *backend;        /* "sqlite", "postgresql" (static) */
} qg_ledger_stats;
void qg__ledger_stats_get(qg_ledger *l, qg_ledger_stats *out);

/* Rows queued or being written now (stats' `queued`), read without a
 * lock: cheap enough for every request's back-pressure check; may lag a
 * concurrent submit or commit by a moment. */
size_t qg__ledger_queued(qg_ledger *l);

/* 1 when neither the database nor the spool takes rows now (the last
 * attempt failed for both): a new decision would go unmetered, so the
 * server refuses it (503 ledger_unavailable). */
int qg__ledger_refusing(qg_ledger *l);

/* Wait (at most max_ms) until every row queued at the call is written,
 * spooled or given up, so that a scan that follows reads them: QG_OK, or
 * QG_EIO when the writer is still behind. */
int qg__ledger_catch_up(qg_ledger *l, int max_ms);

/* 1 when other processes write to the same ledger at the same time
 * (PostgreSQL): subjects and keys may change under this process. */
int qg__ledger_shared(qg_ledger *l);

/* 1 when the writer is so far behind that a new decision should wait: its
 * backlog is within a sixty-fourth of opts.max_queue (1,024 rows of the
 * default 65,536) of the bound, which is kept for the rows of decisions
 * already admitted (their settles must still find room). */
int qg__ledger_behind(qg_ledger *l);

/* ------------------------------------------------- the webhook outbox */

/* Notifications (PRODUCT.md 7) wait in the ledger's database until a
 * webhook took them (ledger_outbox.c; docs/operations.md "Webhooks").
 * Two tables: notify_marks, one row per subject x window x threshold
 * that says whether it may fire again, and webhook_outbox, one row per
 * event x webhook URL.  An event is created only by qg__outbox_fire,
 * which changes its mark and inserts its rows in ONE transaction, so
 * that of several callers (threads, processes, instances on one
 * PostgreSQL) exactly one creates it, and it is durable before anyone
 * sends it. */
typedef struct qg_outbox qg_outbox;

#define QG_OUTBOX_ID_MAX 40        /* "msg_" + 32 hex digits, with NUL */
#define QG_OUTBOX_BODY_MAX 2048

typedef struct qg_outbox_event {
    char id[QG_OUTBOX_ID_MAX];     /* the webhook-id: set by fire, stable */
    char url[512];                 /* claim: the webhook it goes to */
    char type[32];                 /* "quota.threshold", "quota.forecast" */
    char subject[300];             /* the mark's owner: a member, or
                                      "org:NAME" for an org's window */
    char window[64];
    int64_t threshold_milli;       /* 0 for quota.forecast */
    int64_t period_key;            /* > 0: the calendar period (its end,
                                      ms): fires once per period; 0: fires
                                      again only once re-armed */
    int64_t created_ms;
    int64_t next_ms;               /* when the next attempt is due */
    int attempts;                  /* attempts made so far */
    char body[QG_OUTBOX_BODY_MAX]; /* the JSON body, sent as is */
} qg_outbox_event;

/* A handle on the outbox of ledger l (its own connection to the
 * database; l must outlive it).  Each handle is meant for one thread
 * (calls on one handle are serialised).  NULL with err. */
qg_outbox *qg__outbox_open(qg_ledger *l, char *err, size_t errcap);
void qg__outbox_close(qg_outbox *o);

/* Fire ev (type, subject, window, threshold_milli, period_key,
 * created_ms, body) to each of urls[0..nurls): in one durable
 * transaction, when its mark allows it (none yet; re-armed; or a later
 * calendar period than the one it last fired in), the mark is taken and
 * one pending row per URL is inserted, all with the same id (written
 * into ev->id, derived from the mark and how often it fired: the same in
 * every process).  *fired: 1 when this call created the event, 0 when
 * the mark held it back.  QG_OK or an error with why. */
int qg__outbox_fire(qg_outbox *o, qg_outbox_event *ev,
                    const char *const *urls, int nurls, int *fired,
                    char *why, size_t whycap);
/* Re-arm the mark of subject x window x threshold (usage fell below it):
 * its next crossing fires again.  QG_OK or an error. */
int qg__outbox_rearm(qg_outbox *o, const char *subject, const char *window,
                     int64_t threshold_milli, char *why, size_t whycap);
/* Claim up to max pending rows due at now_ms that nobody holds, for
 * owner, until now_ms + lease_ms (FOR UPDATE SKIP LOCKED on PostgreSQL:
 * instances never claim the same row); *n rows into out (url, id, body,
 * created_ms, attempts).  release: drop owner's leases (at start: a
 * process that was killed held them).  QG_OK or an error. */
int qg__outbox_claim(qg_outbox *o, const char *owner, int64_t now_ms,
                     int64_t lease_ms, qg_outbox_event *out, int max,
                     int *n, char *why, size_t whycap);
int qg__outbox_release(qg_outbox *o, const char *owner, char *why,
                       size_t whycap);
/* The outcome of an attempt at row (id, url): delivered (state 1);
 * retry at next_ms with attempts and the reason, lease dropped; or given
 * up (state 2: past the retry horizon). */
int qg__outbox_delivered(qg_outbox *o, const char *id, const char *url,
                         int64_t now_ms, char *why, size_t whycap);
int qg__outbox_retry(qg_outbox *o, const char *id, const char *url,
                     int64_t next_ms, int attempts, const char *error,
                     char *why, size_t whycap);
int qg__outbox_give_up(qg_outbox *o, const char *id, const char *url,
                       int64_t now_ms, const char *error, char *why,
                       size_t whycap);
/* Pending rows and the creation time of the oldest (0 when none). */
int qg__outbox_backlog(qg_outbox *o, int64_t *pending, int64_t *oldest_ms,
                       char *why, size_t whycap);
/* ------------------------------------------- history (schema 6) */

/* The ledger keeps, beside its rows, a rollup of every subject's usage
 * per quarter of an hour and model (the table usage_slots), kept by the
 * database itself (triggers on the rows: an insert adds a row's counts,
 * a settle or a re-decided refusal moves them), so that a subject's
 * history and pace are read from a few thousand rollup rows however many
 * rows it has.  A quarter of an hour, because every time zone in use is
 * a whole number of quarters of an hour from UTC: the hours and days of
 * any window's zone are unions of slots. */
#define QG_LEDGER_SLOT_MS INT64_C(900000)

typedef struct qg_usage_slot {
    int64_t start_ms;          /* a multiple of QG_LEDGER_SLOT_MS */
    char model[64];            /* the rows' model, "" weight-only */
    int64_t weight_milli;      /* sum of weight_milli of admitted rows */
    int64_t admitted;          /* admitted rows (decision allow) */
    int64_t requests;          /* every row (every decision) */
    int64_t refused;           /* refused rows (decision reject, never) */
} qg_usage_slot;

/* The subject's slots with from_ms <= start_ms < to_ms, by start then
 * model, to fn (0 goes on; a nonzero value stops and is returned).
 * Returns 0 or an error.  Any thread (the history connection, under its
 * own lock: it never waits for the writer or for qg__ledger_get). */
int qg__ledger_slots(qg_ledger *l, const char *subject, int64_t from_ms,
                     int64_t to_ms,
                     int (*fn)(const qg_usage_slot *s, void *ud), void *ud);

/* The start of the subject's first slot with an admitted row: 0, or
 * QG_ENOTFOUND when it has none. */
int qg__ledger_first_usage(qg_ledger *l, const char *subject,
                           int64_t *start_ms);

/* The subject's rows with created_ms < before_ms, newest first (ties: the
 * row written last first), at most limit of them, to fn as in
 * qg__ledger_slots. */
int qg__ledger_latest(qg_ledger *l, const char *subject, int64_t before_ms,
                      int limit,
                      int (*fn)(const qg_ledger_row *row, void *ud),
                      void *ud);

#endif
