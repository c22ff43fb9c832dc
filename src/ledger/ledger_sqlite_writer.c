/* ledger_sqlite_writer.c - the SQLite ledger's group commit: submit
 * queues a row, the writer thread takes everything queued and writes it in
 * transactions of at most max_batch rows, then calls each row's done
 * (ledger_sqlite.c's opening comment tells the whole design: the queue,
 * coalescing of a settle with its check row, the durable and async modes,
 * the guard that keeps an acknowledged row from being overwritten). */
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

/* ------------------------------------------------------------- writer */

static const int64_t hist_le_us[8] = { 100, 1000, 5000, 10000, 50000,
                                       100000, 1000000, INT64_MAX };

/* A settle-only row whose request's whole row is earlier in the same
 * batch (a short call: its check row lingered, DURABLE_LINGER_US, until
 * the settle came) is folded into that row, so the batch writes one row
 * per request instead of an insert and an update: the same end state (a
 * settle changes only its own columns), half the statements.  The map
 * is an open-addressed table of row indices + 1 by request id hash. */
static void coalesce(qg__sq *s, qg__sq_item *it, size_t n)
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

/* The statement of `it` changed nothing: a guard kept the row the ledger
 * holds for its request id.  That is expected for a settle repeated
 * after its row was settled (the same subject, or none named); anything
 * else is another request's row: `it` is marked refused.  Returns an
 * SQLite code (a failed read fails the transaction). */
static int guard_refused(qg__sq *s, qg__sq_item *it)
{
    const qg_ledger_row *r = &it->row;
    int rc;
    BIND_STR(s->owner, 1, r->request_id);
    rc = sqlite3_step(s->owner);
    if (rc == SQLITE_ROW) {
        const char *owner = (const char *)sqlite3_column_text(s->owner, 0);
        int same = owner && strncmp(owner, r->subject, sizeof r->subject) == 0;
        int decision = sqlite3_column_int(s->owner, 1);
        if (r->settle_only)
            it->refused = decision != 1 || (r->subject[0] && !same);
        else
            it->refused = 1;
        if (it->refused)
            snprintf(s->wconflict, sizeof s->wconflict, "request id %.80s "
                     "is held by a %s row of subject %.80s: the %s of "
                     "subject %.80s was not written",
                     r->request_id, decision == 1 ? "admitted" : "refused",
                     owner ? owner : "", r->settle_only ? "settle" : "row",
                     r->subject[0] ? r->subject : "(not named)");
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;          /* cannot happen: an insert would have */
    }
    sqlite3_reset(s->owner);
    return rc;
}

/* Step a transaction-control statement (prepared once at open, so that
 * running it needs no parsing and little memory).  An SQLite code. */
static int run_ctl(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int batch_failed(qg__sq *s, int rc)
{
    snprintf(s->werr, sizeof s->werr, "%s (SQLite error %d)",
             sqlite3_errmsg(s->wdb), sqlite3_extended_errcode(s->wdb));
    return qg__sq_map_rc(rc) == QG_OK ? QG_EIO : qg__sq_map_rc(rc);
}

/* Write n rows in one transaction.  Returns 0 or a QG error. */
static int write_batch(qg__sq *s, qg__sq_item *it, size_t n)
{
    size_t i;
    int rc;
    coalesce(s, it, n);
    /* A ROLLBACK that failed (out of memory, I/O error) leaves the
     * transaction open, and every later BEGIN would fail: end it first. */
    if (!sqlite3_get_autocommit(s->wdb) &&
        (rc = run_ctl(s->rollback_st)) != SQLITE_OK &&
        !sqlite3_get_autocommit(s->wdb))
        return batch_failed(s, rc);
    if ((rc = run_ctl(s->begin_st)) != SQLITE_OK)
        return batch_failed(s, rc);
    for (i = 0; i < n; i++) {
        sqlite3_stmt *st = it[i].row.settle_only ? s->settle : s->upsert;
        it[i].refused = 0;
        if (it[i].merged)        /* shares the fate of the row it joined */
            continue;
        rc = qg__sq_bind_row(st, &it[i].row);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE && rc != SQLITE_OK)
            goto fail;
        if (sqlite3_changes(s->wdb) == 0 &&
            (rc = guard_refused(s, &it[i])) != SQLITE_OK)
            goto fail;
    }
    for (i = 0; i < n; i++)
        if (it[i].merged)
            it[i].refused = it[it[i].merged - 1].refused;
    sqlite3_clear_bindings(s->upsert);
    sqlite3_clear_bindings(s->settle);
    if ((rc = run_ctl(s->commit_st)) != SQLITE_OK)
        goto fail;
    return QG_OK;
fail:
    rc = batch_failed(s, rc);
    sqlite3_clear_bindings(s->upsert);
    sqlite3_clear_bindings(s->settle);
    if (!sqlite3_get_autocommit(s->wdb))
        run_ctl(s->rollback_st);   /* if this fails too: the next batch */
    return rc;
}

static void record_commit(qg__sq *s, size_t n, int rc, int64_t us,
                          char *line, size_t cap)
{
    int64_t now = qg__sq_mono_us();
    int i;
    line[0] = '\0';
    if (rc != QG_OK) {
        s->st.errors++;
        s->fail_txns++;
        snprintf(s->st.last_error, sizeof s->st.last_error, "%s", s->werr);
        if (!s->st.failing || now - s->fail_log_us >= 10000000) {
            snprintf(line, cap, "ledger %s: %s %zu rows: %s", s->path,
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
                 "failed transactions)", s->path,
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

/* Wait (mu held) for work; in ASYNC mode also for flush_ms to pass since
 * the oldest queued row, unless a full batch is waiting or we stop; in
 * DURABLE mode for DURABLE_LINGER_US while no queued row is waited for. */
static void wait_for_rows(qg__sq *s)
{
    int async = s->o.sync == QG_LEDGER_ASYNC;
    int64_t linger = async ? (int64_t)s->o.flush_ms * 1000 : DURABLE_LINGER_US;
    while (s->qlen == 0 && !s->stop)
        pthread_cond_wait(&s->cv, &s->mu);
    /* after a failed transaction: pause before trying again */
    while (!s->stop && qg__sq_mono_us() < s->retry_at_us) {
        struct timespec ts;
        ts.tv_sec = (time_t)(s->retry_at_us / 1000000);
        ts.tv_nsec = (long)(s->retry_at_us % 1000000) * 1000;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    while (!s->stop && s->qlen > 0 && s->qlen < (size_t)s->o.max_batch &&
           (async || s->q_urgent == 0)) {
        int64_t due = s->q_since_us + linger;
        struct timespec ts;
        if (qg__sq_mono_us() >= due)
            break;
        ts.tv_sec = (time_t)(due / 1000000);
        ts.tv_nsec = (long)(due % 1000000) * 1000;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
}

/* After a failed transaction of w[off, off + k) out of the n rows taken
 * (mu held): put back at the head of the queue, in order, the rows of the
 * failed part that nobody waits for (ASYNC: all of them, acknowledged
 * already) and every row after it (not tried yet).  The rows of the failed
 * part that somebody waits for are the caller's to fail.  Returns the
 * number put back, or -1 when there was no memory for them (nothing put
 * back). */
static long requeue(qg__sq *s, size_t off, size_t k, size_t n)
{
    int async = s->o.sync == QG_LEDGER_ASYNC;
    size_t cnt = n - (off + k), i, j;
    for (i = off; i < off + k; i++)
        cnt += async || !s->w[i].done;
    if (s->qlen + cnt > s->qcap) {
        size_t cap = s->qlen + cnt;
        qg__sq_item *q = realloc(s->q, cap * sizeof *q);
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
        s->q_since_us = qg__sq_mono_us();
    s->qlen += cnt;
    return (long)cnt;
}

void *qg__sq_writer_main(void *arg)
{
    qg__sq *s = arg;
    char line[1536], lost[1536];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        qg__sq_item *tmp;
        size_t n, off, cap;
        wait_for_rows(s);
        if (s->qlen == 0 && s->stop)
            break;
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
        pthread_mutex_unlock(&s->mu);

        for (off = 0; off < n;) {
            size_t k = n - off, i, end;
            int64_t t0;
            long back = 0;
            int rc;
            if (k > (size_t)s->o.max_batch)
                k = (size_t)s->o.max_batch;
            end = off + k;
            t0 = qg__sq_mono_us();
            rc = write_batch(s, s->w + off, k);
            pthread_mutex_lock(&s->mu);
            lost[0] = '\0';
            record_commit(s, k, rc, qg__sq_mono_us() - t0, line, sizeof line);
            if (rc == QG_OK) {
                size_t refused = 0;
                for (i = off; i < off + k; i++)
                    refused += s->w[i].refused != 0;
                s->st.rows_refused += refused;
                if (refused)
                    snprintf(lost, sizeof lost, "ledger %s: %zu row%s not "
                             "written (the request id is another "
                             "request's); the last: %s", s->path, refused,
                             refused == 1 ? "" : "s", s->wconflict);
                s->backoff_us = 0;
                s->retry_at_us = 0;
                s->inflight -= k;
            } else if (!s->stop && (back = requeue(s, off, k, n)) >= 0) {
                s->st.rows_retried += (uint64_t)back;
                s->backoff_us = s->backoff_us ? s->backoff_us * 2 : 10000;
                if (s->backoff_us > 1000000)
                    s->backoff_us = 1000000;
                s->retry_at_us = qg__sq_mono_us() + s->backoff_us;
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
                             "not be written and are lost: %s", s->path,
                             gone, s->werr);
            }
            if (rc != QG_OK && s->o.sync == QG_LEDGER_DURABLE)
                for (i = off; i < off + k; i++)
                    s->st.rows_failed += s->w[i].done != NULL;
            atomic_store_explicit(&s->depth, s->qlen + s->inflight,
                                  memory_order_relaxed);
            pthread_mutex_unlock(&s->mu);
            if (line[0])
                qg__sq_log(s, "%s", line);
            if (lost[0])
                qg__sq_log(s, "%s", lost);
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

int qg__sq_submit(void *b, const qg_ledger_row *row, qg_ledger_done done,
                     void *arg)
{
    qg__sq *s = b;
    qg__sq_item *it;
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
        s->q_since_us = qg__sq_mono_us();
        pthread_cond_signal(&s->cv);
    } else if (s->qlen == (size_t)s->o.max_batch) {
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (s->o.sync == QG_LEDGER_ASYNC && done)
        done(arg, QG_OK);
    return QG_OK;
}

