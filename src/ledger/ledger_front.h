/* ledger_front.h - the ledger's front, private to src/ledger: the handle
 * behind qg_ledger, shared by ledger.c (opening, the backend by URL,
 * reads, the id filter), ledger_writer.c (the queue, the writer thread,
 * group commit, retries) and ledger_spool.c (a shared ledger's rows while
 * its database cannot be reached).  Every backend (ledger_backend.h) gets
 * the same tested commit path. */
#ifndef QG_LEDGER_FRONT_H
#define QG_LEDGER_FRONT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "idfilter.h"
#include "ledger.h"
#include "ledger_backend.h"

typedef struct qg__spool qg__spool;

struct qg_ledger {
    const qg__ledger_backend *be;
    void *b;
    qg_ledger_opts o;
    char name[512];             /* for messages: the path, or the URL
                                   without its password */

    qg__idf idf;                /* ids in the ledger (opts.id_filter) */
    int idf_full_logged;        /* the writer said it cannot grow */
    _Atomic uint64_t id_reads;  /* qg__ledger_get calls the filter could
                                   not answer: read from the database */
    qg__spool *spool;           /* shared backends with opts.spool_dir */

    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t cv;
    qg__ledger_item *q;         /* queued rows */
    size_t qlen, qcap;
    int64_t q_since_us;         /* monotonic time q became non-empty */
    qg__ledger_item *w;         /* the writer's rows (writer thread only) */
    size_t wcap;
    uint32_t *cmap;             /* writer: request id -> row, per batch */
    size_t cmap_cap;
    size_t inflight;            /* rows taken by the writer, not done */
    _Atomic size_t depth;       /* qlen + inflight, for lock-free reads */
    _Atomic int refusing;       /* neither the database nor the spool
                                   takes rows: checks answer 503 */
    size_t q_urgent;            /* rows in q with a done callback (DURABLE:
                                   someone waits for them) */
    int stop;
    qg_ledger_stats st;
    char werr[512];             /* writer only: the backend's reason */
    char wconflict[512];        /* writer only: the last refused row */
    int64_t retry_at_us;        /* after a failure: no write before this */
    int64_t backoff_us;         /* the pause before the next retry */
    int64_t fail_log_us;        /* when a failure was last logged */
    int64_t replay_at_us;       /* spooled rows: the next replay */
    int64_t replay_backoff_us;
    uint64_t fail_txns;         /* failed transactions in this failure */

    pthread_t thread;
    int thread_started;
    int ready;                  /* mutexes initialised */
};

int64_t qg__lf_mono_us(void);
/* Say something to the operator (opts.log), printf-style. */
void qg__lf_log(const qg_ledger *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ledger_writer.c: the writer thread (started by open, joined by close)
 * and submit. */
void *qg__lf_writer_main(void *arg);
int qg__lf_submit(qg_ledger *l, const qg_ledger_row *row,
                  qg_ledger_done done, void *arg);
/* Fold each settle-only row into its request's whole row earlier in
 * it[0..n) (the writer thread only: it uses l->cmap). */
void qg__lf_coalesce(qg_ledger *l, qg__ledger_item *it, size_t n);

/* ledger_spool.c.  open: the spool of this instance under dir (created,
 * 0700), replaying into the database whatever an earlier run left there
 * (before the ledger is used: the rebuild must read it).  Returns NULL
 * with err when the folder or its file cannot be used.  The writer calls
 * the rest, on its thread only. */
qg__spool *qg__spool_open(qg_ledger *l, const char *dir, char *err,
                          size_t errcap);
void qg__spool_close(qg__spool *sp);
/* Rows waiting in the spool (0: the database has them all). */
uint64_t qg__spool_pending(const qg__spool *sp);
/* Append the n rows but merged ones (fsync'd before return; *written:
 * how many): QG_OK, or an error with why. */
int qg__spool_append(qg__spool *sp, qg__ledger_item *it, size_t n,
                     size_t *written, char *why, size_t whycap);
/* Write what waits in the spool into the database, in order, in batches
 * that record the spool's mark (*written grows by the rows written).
 * QG_OK when it is empty (the file is reset), else the database's error
 * with why. */
int qg__spool_replay(qg__spool *sp, uint64_t *written, char *why,
                     size_t whycap);

#endif
