/* ledger_writer.c - the ledger's group commit, the same for every
 * backend: submit queues a row, the writer thread takes everything queued
 * and hands it to the backend in transactions of at most max_batch rows
 * (ledger_backend.h, write_batch), then calls each row's done.
 *
 * The queue: submit copies the row into `q` (a growable array, capped by
 * max_queue counting the rows the writer holds too).  The writer swaps `q`
 * with its own empty array under the mutex (O(1), whatever the queue
 * length), folds each settle into its check's row of the same batch
 * (coalesce), writes, and only after the commit calls each row's `done`.
 * Everything that arrived while a commit was syncing goes into the next
 * one, so the commit rate adapts to the load.  In ASYNC mode `done` is
 * called by submit; the writer gathers rows for up to flush_ms (or until
 * max_batch are waiting).
 *
 * A failed transaction: the rows somebody waits for get their `done` with
 * the error, the others go back to the head of the queue in order and are
 * written again after a pause (10 ms doubling to 1 s).  A shared ledger
 * whose database cannot be reached (QG_ELEDGER) with a spool: the rows go
 * to the spool instead (ledger_spool.c), are acknowledged from there, and
 * every later row follows them into the spool until it has been replayed,
 * so the database receives them in order. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_front.h"

/* ------------------------------------------------------------- writer */

static const int64_t hist_le_us[8] = { 100, 1000, 5000, 10000, 50000,
                                       100000, 1000000, INT64_MAX };

/* A settle-only row whose request's whole row is earlier in the same
 * batch (a short call: its check row lingered, DURABLE_LINGER_US, until
 * the settle came) is folded into that row, so the batch writes one row
 * per request instead of an insert and an update: the same end state (a
 * settle changes only its own columns), half the statements.  The map
 * is an open-addressed table of row indices + 1 by request id hash. */
void qg__lf_coalesce(qg_ledger *s, qg__ledger_item *it, size_t n)
{
    size_t cap = 16, mask, i;
    while (cap < 2 * n)
        cap *= 2;
    if (cap > s->cmap_cap) {
        uint32_t *m = realloc(s->cmap, cap * sizeof *m);
        if (!m)
            return;              /* not merging is always correct */
        s->cmap = m;
        s->cmap_cap = cap;
    }
    memset(s->cmap, 0, cap * sizeof *s->cmap);
    mask = cap - 1;
    for (i = 0; i < n; i++) {
        qg_ledger_row *r = &it[i].row;
        size_t len = strnlen(r->request_id, sizeof r->request_id);
        size_t h = (size_t)XXH3_64bits(r->request_id, len) & mask;
        it[i].merged = 0;
        for (;; h = (h + 1) & mask) {
            uint32_t j = s->cmap[h];
            qg_ledger_row *e;
            if (j == 0) {
                if (!r->settle_only)
                    s->cmap[h] = (uint32_t)i + 1;
                break;
            }
            e = &it[j - 1].row;
            if (strncmp(e->request_id, r->request_id, sizeof r->request_id))
                continue;
            if (!r->settle_only) {
                s->cmap[h] = (uint32_t)i + 1;    /* the latest whole row */
            } else {
                e->status = r->status;
                e->estimated = r->estimated;
                e->input_tokens = r->input_tokens;
                e->output_tokens = r->output_tokens;
                e->weight_milli = r->weight_milli;
                e->settled_ms = r->settled_ms;
                e->overage_milli = r->overage_milli;
                e->overage_cost_micro = r->overage_cost_micro;
                memcpy(e->detail, r->detail, sizeof e->detail);
                it[i].merged = (size_t)j;
            }
            break;
        }
    }
}

/* Write it[0..n) through the backend, or into the spool while the
 * database cannot be reached (or while the spool still holds rows that
 * must reach it first).  Returns 0 or a QG error with s->werr; *spooled is
 * set when the rows went to the spool. */
static int write_batch(qg_ledger *s, qg__ledger_item *it, size_t n,
                       size_t *spooled)
{
    char why[512];
    size_t i;
    int rc;
    *spooled = 0;
    qg__lf_coalesce(s, it, n);
    for (i = 0; i < n; i++)
        it[i].refused = 0;
    if (s->spool && qg__spool_pending(s->spool) > 0) {
        rc = QG_ELEDGER;       /* behind the spooled rows, in order */
        snprintf(s->werr, sizeof s->werr, "rows are waiting in the spool");
    } else {
        why[0] = '\0';
        rc = s->be->rows->write_batch(s->b, it, n, NULL, why, sizeof why);
        if (rc == QG_OK) {
            if (why[0])
                snprintf(s->wconflict, sizeof s->wconflict, "%s", why);
        } else {
            snprintf(s->werr, sizeof s->werr, "%s",
                     why[0] ? why : qg_strerror(rc));
        }
    }
    if (rc == QG_ELEDGER && s->spool) {
        int src = qg__spool_append(s->spool, it, n, spooled, why,
                                   sizeof why);
        if (src == QG_OK) {
            atomic_store(&s->refusing, 0);
            return QG_OK;
        }
        snprintf(s->werr + strlen(s->werr), sizeof s->werr - strlen(s->werr),
                 "; the spool cannot take the rows either: %s", why);
        atomic_store(&s->refusing, 1);
        return src;
    }
    if (rc == QG_OK) {
        atomic_store(&s->refusing, 0);
        for (i = 0; i < n; i++)
            if (it[i].merged)
                it[i].refused = it[it[i].merged - 1].refused;
    }
    return rc;
}

static void record_commit(qg_ledger *s, size_t n, int rc, int64_t us,
                          char *line, size_t cap)
{
    int64_t now = qg__lf_mono_us();
    int i;
    line[0] = '\0';
    if (rc != QG_OK) {
        s->st.errors++;
        s->fail_txns++;
        snprintf(s->st.last_error, sizeof s->st.last_error, "%s", s->werr);
        if (!s->st.failing || now - s->fail_log_us >= 10000000) {
            snprintf(line, cap, "ledger %s: %s %zu rows: %s", s->name,
                     s->st.failing ? "still failing to commit"
                                   : "cannot commit",
                     n, s->werr);
            s->fail_log_us = now;
        }
        s->st.failing = 1;
        return;
    }
    if (s->st.failing)
        snprintf(line, cap, "ledger %s: writes succeed again (after %llu "
                 "failed transactions)", s->name,
                 (unsigned long long)s->fail_txns);
    s->st.failing = 0;
    s->fail_txns = 0;
    s->st.rows_written += n;
    s->st.commits++;
    s->st.commit_us_sum += (uint64_t)us;
    if ((uint64_t)us > s->st.commit_us_max)
        s->st.commit_us_max = (uint64_t)us;
    for (i = 0; i < 8; i++)
        if (us <= hist_le_us[i])
            s->st.commit_le_us[i]++;
}

/* DURABLE mode: how long rows nobody waits for (a check's reservation
 * row, the proxy's settle) may gather before they are committed (10 ms:
 * most proxied calls end within it, so their two rows fold into one,
 * coalesce(); on the proxy load, 2 -> 10 ms took quotagate from 0.72x to
 * 0.80x of nginx proxy_pass and the writer thread from ~23% to ~12% of
 * the process), unless a full batch is
 * waiting or a row somebody waits for (a settle) arrives, which is
 * committed at once with everything queued before it.  Larger batches
 * cost less CPU per row (one BEGIN/COMMIT, WAL frames and fsync for
 * more rows); a check row was never durable on its answer anyway. */
#define DURABLE_LINGER_US 10000

/* Sleep on the writer's condition (mu held) until due_us (monotonic),
 * or until a submit or close wakes it. */
static void wait_until(qg_ledger *s, int64_t due_us)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(due_us / 1000000);
    ts.tv_nsec = (long)(due_us % 1000000) * 1000;
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

/* Wait (mu held) for work; in ASYNC mode also for flush_ms to pass since
 * the oldest queued row, unless a full batch is waiting or we stop; in
 * DURABLE mode for DURABLE_LINGER_US while no queued row is waited for. */
static void wait_for_rows(qg_ledger *s)
{
    int async = s->o.sync == QG_LEDGER_ASYNC;
    int64_t linger = async ? (int64_t)s->o.flush_ms * 1000 : DURABLE_LINGER_US;
    while (s->qlen == 0 && !s->stop) {
        if (!s->spool || qg__spool_pending(s->spool) == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        /* rows wait in the spool: wake for the next replay */
        if (qg__lf_mono_us() >= s->replay_at_us)
            return;
        wait_until(s, s->replay_at_us);
    }
    /* after a failed transaction: pause before trying again */
    while (!s->stop && qg__lf_mono_us() < s->retry_at_us)
        wait_until(s, s->retry_at_us);
    while (!s->stop && s->qlen > 0 && s->qlen < (size_t)s->o.max_batch &&
           (async || s->q_urgent == 0)) {
        int64_t due = s->q_since_us + linger;
        if (qg__lf_mono_us() >= due)
            break;
        wait_until(s, due);
    }
}

/* After a failed transaction of w[off, off + k) out of the n rows taken
 * (mu held): put back at the head of the queue, in order, the rows of the
 * failed part that nobody waits for (ASYNC: all of them, acknowledged
 * already) and every row after it (not tried yet).  The rows of the failed
 * part that somebody waits for are the caller's to fail.  Returns the
 * number put back, or -1 when there was no memory for them (nothing put
 * back). */
static long requeue(qg_ledger *s, size_t off, size_t k, size_t n)
{
    int async = s->o.sync == QG_LEDGER_ASYNC;
    size_t cnt = n - (off + k), i, j;
    for (i = off; i < off + k; i++)
        cnt += async || !s->w[i].done;
    if (s->qlen + cnt > s->qcap) {
        size_t cap = s->qlen + cnt;
        qg__ledger_item *q = realloc(s->q, cap * sizeof *q);
        if (!q)
            return -1;
        s->q = q;
        s->qcap = cap;
    }
    memmove(s->q + cnt, s->q, s->qlen * sizeof *s->q);
    for (i = off, j = 0; i < n; i++) {
        if (i < off + k && !async && s->w[i].done)
            continue;
        s->q[j] = s->w[i];
        s->q_urgent += !async && s->q[j].done;
        j++;
    }
    if (s->qlen == 0)
        s->q_since_us = qg__lf_mono_us();
    s->qlen += cnt;
    return (long)cnt;
}

/* Rows wait in the spool and the pause since the last attempt is over
 * (mu held, released meanwhile): replay them into the database.  The
 * pause grows from 100 ms to 1 s while the database stays away. */
static void replay_spool(qg_ledger *s)
{
    char why[512];
    uint64_t written = 0;
    int rc;
    if (!s->spool || qg__spool_pending(s->spool) == 0 ||
        qg__lf_mono_us() < s->replay_at_us)
        return;
    pthread_mutex_unlock(&s->mu);
    why[0] = '\0';
    rc = qg__spool_replay(s->spool, &written, why, sizeof why);
    pthread_mutex_lock(&s->mu);
    s->st.rows_replayed += written;
    if (rc == QG_OK) {
        s->replay_backoff_us = 0;
        s->replay_at_us = 0;
        s->st.spooling = 0;
        pthread_mutex_unlock(&s->mu);
        qg__lf_log(s, "ledger %s: the database answers again: the spooled "
                   "rows are written, in order (%llu since the start); the "
                   "spool is empty", s->name,
                   (unsigned long long)s->st.rows_replayed);
        pthread_mutex_lock(&s->mu);
        return;
    }
    s->replay_backoff_us = s->replay_backoff_us ? s->replay_backoff_us * 2
                                                : 100000;
    if (s->replay_backoff_us > 1000000)
        s->replay_backoff_us = 1000000;
    s->replay_at_us = qg__lf_mono_us() + s->replay_backoff_us;
    snprintf(s->st.last_error, sizeof s->st.last_error, "%s", why);
}

/* The id filter grows with the ledger (idfilter.h): count the new ids of
 * a batch (a settle's id came with its check), under s->mu (the stats
 * read the counts); what to log, if anything, goes to line. */
static void count_ids(qg_ledger *s, const qg__ledger_item *it, size_t n,
                      char *line, size_t cap)
{
    uint64_t ids = 0;
    int rc, levels;
    for (size_t i = 0; i < n; i++)
        ids += !it[i].row.settle_only;
    rc = qg__idf_count(&s->idf, ids);
    levels = atomic_load(&s->idf.nlevels);
    if (rc > 0)
        snprintf(line, cap, "ledger %s: the request id filter grew to %d "
                 "levels (%llu MiB) for %llu ids", s->name, levels,
                 (unsigned long long)(s->idf.bytes >> 20),
                 (unsigned long long)s->idf.ids);
    else if (rc < 0 && !s->idf_full_logged) {
        s->idf_full_logged = 1;
        snprintf(line, cap, "ledger %s: the request id filter cannot grow "
                 "(%s): more new ids will be looked up in the database",
                 s->name, levels >= QG_IDF_LEVELS ? "it has all its levels"
                                                  : "no memory");
    }
}

void *qg__lf_writer_main(void *arg)
{
    qg_ledger *s = arg;
    char line[1536], lost[1536];
    pthread_setname_np(pthread_self(), "qg-ledger");   /* top -H, perf */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        qg__ledger_item *tmp;
        size_t n, off, cap;
        wait_for_rows(s);
        replay_spool(s);
        if (s->qlen == 0 && s->stop)
            break;
        if (s->qlen == 0)
            continue;
        /* take everything queued: swap the arrays */
        tmp = s->w;
        cap = s->wcap;
        s->w = s->q;
        s->wcap = s->qcap;
        n = s->qlen;
        s->q = tmp;
        s->qcap = cap;
        s->qlen = 0;
        s->q_urgent = 0;
        s->inflight = n;
        line[0] = '\0';
        count_ids(s, s->w, n, line, sizeof line);
        pthread_mutex_unlock(&s->mu);
        if (line[0])
            qg__lf_log(s, "%s", line);

        for (off = 0; off < n;) {
            size_t k = n - off, i, end;
            int64_t t0;
            long back = 0;
            size_t spooled;
            int rc;
            if (k > (size_t)s->o.max_batch)
                k = (size_t)s->o.max_batch;
            end = off + k;
            t0 = qg__lf_mono_us();
            rc = write_batch(s, s->w + off, k, &spooled);
            pthread_mutex_lock(&s->mu);
            lost[0] = '\0';
            line[0] = '\0';
            if (spooled) {
                if (!s->st.spooling)
                    snprintf(line, sizeof line, "ledger %s: the database "
                             "cannot be reached (%s): rows go to the spool "
                             "until it answers", s->name, s->werr);
                s->st.spooling = 1;
                s->st.rows_spooled += spooled;
                if (s->replay_at_us == 0)
                    s->replay_at_us = qg__lf_mono_us() + 100000;
            } else {
                record_commit(s, k, rc, qg__lf_mono_us() - t0, line,
                              sizeof line);
            }
            if (rc == QG_OK) {
                size_t refused = 0;
                for (i = off; i < off + k; i++)
                    refused += s->w[i].refused != 0;
                s->st.rows_refused += refused;
                if (refused)
                    snprintf(lost, sizeof lost, "ledger %s: %zu row%s not "
                             "written (the request id is another "
                             "request's); the last: %s", s->name, refused,
                             refused == 1 ? "" : "s", s->wconflict);
                s->backoff_us = 0;
                s->retry_at_us = 0;
                s->inflight -= k;
            } else if (!s->stop && (back = requeue(s, off, k, n)) >= 0) {
                s->st.rows_retried += (uint64_t)back;
                s->backoff_us = s->backoff_us ? s->backoff_us * 2 : 10000;
                if (s->backoff_us > 1000000)
                    s->backoff_us = 1000000;
                s->retry_at_us = qg__lf_mono_us() + s->backoff_us;
                s->inflight -= n - off;
                end = n;         /* the rest went back to the queue */
            } else {
                /* closing, or no memory to keep them: the rows nobody
                 * waits for are given up */
                size_t gone = 0;
                for (i = off; i < off + k; i++)
                    gone += s->o.sync == QG_LEDGER_ASYNC || !s->w[i].done;
                s->st.rows_lost += gone;
                s->inflight -= k;
                if (gone)
                    snprintf(lost, sizeof lost, "ledger %s: %zu rows could "
                             "not be written and are lost: %s", s->name,
                             gone, s->werr);
            }
            if (rc != QG_OK && s->o.sync == QG_LEDGER_DURABLE)
                for (i = off; i < off + k; i++)
                    s->st.rows_failed += s->w[i].done != NULL;
            atomic_store_explicit(&s->depth, s->qlen + s->inflight,
                                  memory_order_relaxed);
            pthread_mutex_unlock(&s->mu);
            if (line[0])
                qg__lf_log(s, "%s", line);
            if (lost[0])
                qg__lf_log(s, "%s", lost);
            /* answer the rows of this transaction that are waited for
             * (those of a failed one with its error) */
            if (s->o.sync == QG_LEDGER_DURABLE)
                for (i = off; i < off + k; i++)
                    if (s->w[i].done)
                        s->w[i].done(s->w[i].arg,
                                     rc == QG_OK && s->w[i].refused
                                         ? QG_ESTATE
                                         : rc);
            off = end;
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int qg__lf_submit(qg_ledger *s, const qg_ledger_row *row,
                  qg_ledger_done done, void *arg)
{
    qg__ledger_item *it;
    if (!row->request_id[0])
        return QG_EINVAL;
    /* in the filter before the row can be in the file */
    qg__idf_add(&s->idf, row->request_id,
                strnlen(row->request_id, sizeof row->request_id));
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return QG_ESTATE;
    }
    if (s->qlen + s->inflight >= (size_t)s->o.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return QG_EFULL;
    }
    if (s->qlen == s->qcap) {
        size_t cap = s->qcap ? s->qcap * 2 : 256;
        if (cap > (size_t)s->o.max_queue)
            cap = (size_t)s->o.max_queue;
        it = realloc(s->q, cap * sizeof *it);
        if (!it) {
            pthread_mutex_unlock(&s->mu);
            return QG_ENOMEM;
        }
        s->q = it;
        s->qcap = cap;
    }
    it = &s->q[s->qlen++];
    it->row = *row;
    it->done = done;
    it->arg = arg;
    atomic_store_explicit(&s->depth, s->qlen + s->inflight,
                          memory_order_relaxed);
    /* Wake the writer only when it has something new to decide: the
     * queue became non-empty (it starts its linger), the first row that
     * somebody waits for arrived (commit now), or a batch is full. */
    if (done && s->o.sync == QG_LEDGER_DURABLE && s->q_urgent++ == 0 &&
        s->qlen > 1) {
        pthread_cond_signal(&s->cv);
    }
    if (s->qlen == 1) {
        s->q_since_us = qg__lf_mono_us();
        pthread_cond_signal(&s->cv);
    } else if (s->qlen == (size_t)s->o.max_batch) {
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (s->o.sync == QG_LEDGER_ASYNC && done)
        done(arg, QG_OK);
    return QG_OK;
}

