/* ledger.c - the ledger's front: picks a backend by the URL's scheme,
 * owns what every backend shares (the queue and writer thread of
 * ledger_writer.c, the request-id filter, the spool of ledger_spool.c,
 * statistics) and forwards reads through the backend's method tables
 * (ledger_backend.h).
 *
 * "sqlite:PATH" or a plain path selects the embedded SQLite backend,
 * "postgresql://" and "postgres://" the PostgreSQL one (libpq's URI as
 * given; its password, if any, is left out of every message). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_front.h"

int64_t qg__lf_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void qg__lf_log(const qg_ledger *l, const char *fmt, ...)
{
    char line[1536];
    va_list ap;
    if (!l->o.log)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    l->o.log(l->o.log_ud, line);
}

/* The URL for messages: "user:secret@" becomes "user@". */
static void display_name(const char *url, char *out, size_t cap)
{
    const char *scheme = strstr(url, "://"), *at, *colon;
    snprintf(out, cap, "%s", url);
    if (!scheme)
        return;
    at = strchr(scheme + 3, '@');
    colon = strchr(scheme + 3, ':');
    if (at && colon && colon < at)
        snprintf(out, cap, "%.*s%s", (int)(colon - url), url, at);
}

static int add_id(const char *id, size_t len, void *ud)
{
    qg__idf_add(ud, id, len);
    (void)qg__idf_count(ud, 1);
    return 0;
}

/* Fill the id filter from the backend (before the writer runs).  A
 * failure leaves it not ready: lookups then all go to the database,
 * which is slower, never wrong. */
static void fill_id_filter(qg_ledger *l)
{
    int64_t rows = l->be->rows->estimate(l->b);
    int rc;
    if (qg__idf_init(&l->idf, (uint64_t)(rows > (1 << 20) ? 2 * rows
                                                          : 1 << 21)) != 0) {
        qg__lf_log(l, "ledger %s: no memory for the request id filter: every "
                   "new id is looked up in the database", l->name);
        return;
    }
    if ((rc = l->be->rows->scan_ids(l->b, add_id, &l->idf)) == QG_OK) {
        atomic_store_explicit(&l->idf.ready, 1, memory_order_release);
    } else {
        char why[256];
        l->be->rows->last_read_error(l->b, why, sizeof why);
        qg__lf_log(l, "ledger %s: cannot read the request ids for the "
                   "filter (%s): every new id is looked up in the database",
                   l->name, why[0] ? why : qg_strerror(rc));
    }
}

static void front_close(qg_ledger *l)
{
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    qg__spool_close(l->spool);
    if (l->b)
        l->be->close(l->b);
    qg__idf_free(&l->idf);
    if (l->ready) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    free(l->q);
    free(l->w);
    free(l->cmap);
    free(l);
}

int qg__ledger_url_is_pg(const char *url)
{
    return strncmp(url, "postgresql://", 13) == 0 ||
           strncmp(url, "postgres://", 11) == 0;
}

qg_ledger *qg__ledger_open(const char *url, const qg_ledger_opts *opts,
                          char *err, size_t errcap)
{
    qg_ledger_opts o = { .sync = QG_LEDGER_DURABLE, .flush_ms = 100,
                         .max_queue = 65536, .max_batch = 4096,
                         .busy_timeout_ms = 5000 };
    const qg__ledger_backend *be = &qg__ledger_sqlite;
    const char *target = url;
    pthread_condattr_t ca;
    qg_ledger *l;

    if (err && errcap)
        err[0] = '\0';
    if (!url || !url[0]) {
        snprintf(err, errcap, "ledger: empty URL");
        return NULL;
    }
    if (qg__ledger_url_is_pg(url)) {
        be = &qg__ledger_postgresql;
    } else if (strncmp(url, "sqlite:", 7) == 0) {
        target = url + 7;
        if (strncmp(target, "//", 2) == 0)    /* sqlite:///abs/path */
            target += 2;
    } else if (strstr(url, "://")) {
        snprintf(err, errcap, "ledger %s: unknown scheme (use sqlite:PATH, "
                 "a path, or postgresql://USER@HOST:PORT/DB)", url);
        return NULL;
    }
    if (!target[0]) {
        snprintf(err, errcap, "ledger %s: no path", url);
        return NULL;
    }
    if (opts) {
        o.sync = opts->sync;
        if (opts->flush_ms > 0)
            o.flush_ms = opts->flush_ms;
        if (opts->max_queue > 0)
            o.max_queue = opts->max_queue;
        if (opts->max_batch > 0)
            o.max_batch = opts->max_batch;
        if (opts->busy_timeout_ms > 0)
            o.busy_timeout_ms = opts->busy_timeout_ms;
        o.log = opts->log;
        o.log_ud = opts->log_ud;
        o.id_filter = opts->id_filter;
        o.subject_index_rows = opts->subject_index_rows;
        o.subject_index_ms = opts->subject_index_ms;
        o.cache_kb = opts->cache_kb;
        o.spool_dir = opts->spool_dir;
    }
    if (o.sync != QG_LEDGER_DURABLE && o.sync != QG_LEDGER_ASYNC) {
        snprintf(err, errcap, "ledger: unknown sync mode %d", (int)o.sync);
        return NULL;
    }
    if (!(l = calloc(1, sizeof *l)) || pthread_condattr_init(&ca) != 0) {
        free(l);
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    l->be = be;
    l->o = o;
    display_name(target, l->name, sizeof l->name);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->ready = 1;
    if (!(l->b = be->open(target, &l->o, err, errcap)))
        goto fail;
    if (be->shared && o.spool_dir &&
        !(l->spool = qg__spool_open(l, o.spool_dir, err, errcap)))
        goto fail;
    if (o.id_filter)
        fill_id_filter(l);
    if (pthread_create(&l->thread, NULL, qg__lf_writer_main, l) != 0) {
        snprintf(err, errcap, "ledger %s: cannot start the writer thread",
                 l->name);
        goto fail;
    }
    l->thread_started = 1;
    return l;
fail:
    front_close(l);
    return NULL;
}

void qg__ledger_close(qg_ledger *l)
{
    if (l)
        front_close(l);
}

int qg__ledger_submit(qg_ledger *l, const qg_ledger_row *row,
                     qg_ledger_done done, void *arg)
{
    if (!l || !row)
        return QG_EINVAL;
    return qg__lf_submit(l, row, done, arg);
}

int qg__ledger_scan(qg_ledger *l, int64_t since_ms,
                   int (*fn)(const qg_ledger_row *row, void *ud), void *ud)
{
    if (!l || !fn)
        return QG_EINVAL;
    return l->be->rows->scan(l->b, since_ms, fn, ud);
}

int qg__ledger_scan_entity(qg_ledger *l, const char *subject, const char *org,
                           int64_t since_ms, int64_t until_ms,
                           int (*fn)(const qg_ledger_row *row, void *ud),
                           void *ud)
{
    if (!l || !subject || !fn)
        return QG_EINVAL;
    return l->be->rows->scan_entity(l->b, subject, org ? org : "", since_ms,
                                    until_ms, fn, ud);
}

int qg__ledger_get(qg_ledger *l, const char *request_id, qg_ledger_row *out)
{
    if (!l || !request_id || !out)
        return QG_EINVAL;
    /* certainly absent: no read needed (ids of other processes sharing
     * the ledger are not in the filter: docs/ledger-postgresql.md) */
    if (!qg__idf_maybe(&l->idf, request_id, strlen(request_id)))
        return QG_ENOTFOUND;
    atomic_fetch_add_explicit(&l->id_reads, 1, memory_order_relaxed);
    return l->be->rows->get(l->b, request_id, out);
}

int qg__ledger_put_subject(qg_ledger *l, const char *subject, const char *plan,
                          const char *org, int64_t billing_anchor_ms,
                          int64_t now_ms)
{
    if (!l || !subject || !subject[0] || !plan)
        return QG_EINVAL;
    return l->be->subjects->put(l->b, subject, plan, org ? org : "",
                              billing_anchor_ms, now_ms);
}

int qg__ledger_scan_subjects(qg_ledger *l,
                            int (*fn)(const char *subject, const char *plan,
                                      const char *org, int64_t anchor_ms,
                                      void *ud),
                            void *ud)
{
    if (!l || !fn)
        return QG_EINVAL;
    return l->be->subjects->scan_since(l->b, 0, fn, ud);
}

int qg__ledger_put_key(qg_ledger *l, const qg_key_rec *k)
{
    if (!l || !k || !k->id[0])
        return QG_EINVAL;
    return l->be->keys->put(l->b, k);
}

int qg__ledger_get_key(qg_ledger *l, const char *id, qg_key_rec *out)
{
    if (!l || !id || !out)
        return QG_EINVAL;
    return l->be->keys->get(l->b, id, out);
}

int qg__ledger_list_keys(qg_ledger *l,
                        int (*fn)(const qg_key_rec *k, void *ud), void *ud)
{
    if (!l || !fn)
        return QG_EINVAL;
    return l->be->keys->list(l->b, fn, ud);
}

int qg__ledger_revoke_key(qg_ledger *l, const char *id, int64_t now_ms)
{
    if (!l || !id)
        return QG_EINVAL;
    return l->be->keys->revoke(l->b, id, now_ms);
}

int qg__ledger_scan_subjects_since(qg_ledger *l, int64_t since_ms,
                                  int (*fn)(const char *subject,
                                            const char *plan,
                                            const char *org,
                                            int64_t anchor_ms, void *ud),
                                  void *ud)
{
    if (!l || !fn)
        return QG_EINVAL;
    return l->be->subjects->scan_since(l->b, since_ms, fn, ud);
}

int qg__ledger_get_subject(qg_ledger *l, const char *subject, char *plan,
                           size_t plancap, char *org, size_t orgcap,
                           int64_t *anchor_ms)
{
    if (!l || !subject || !plan || !org || !anchor_ms || !plancap || !orgcap)
        return QG_EINVAL;
    return l->be->subjects->get(l->b, subject, plan, plancap, org, orgcap,
                                anchor_ms);
}

void qg__ledger_stats_get(qg_ledger *l, qg_ledger_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    *out = l->st;
    out->queued = l->qlen + l->inflight;
    /* the filter's counts change under l->mu (the writer's count_ids) */
    out->id_filter_ids = l->idf.ids;
    out->id_filter_levels = atomic_load(&l->idf.nlevels);
    out->id_filter_bytes = l->idf.bytes;
    pthread_mutex_unlock(&l->mu);
    out->spool_rows = l->spool ? qg__spool_pending(l->spool) : 0;
    out->refusing = atomic_load(&l->refusing);
    out->id_reads = atomic_load_explicit(&l->id_reads, memory_order_relaxed);
    out->cache_bytes = l->be->rows->cache_bytes
                           ? l->be->rows->cache_bytes(l->b) : -1;
    l->be->rows->last_read_error(l->b, out->last_read_error,
                                 sizeof out->last_read_error);
    out->backend = l->be->name;
}

int qg__ledger_catch_up(qg_ledger *l, int max_ms)
{
    uint64_t target;
    if (!l)
        return QG_EINVAL;
    pthread_mutex_lock(&l->mu);
    target = l->st.rows_written + l->st.rows_lost + l->st.rows_failed +
             l->st.rows_spooled + l->qlen + l->inflight;
    pthread_mutex_unlock(&l->mu);
    for (int waited = 0;; waited += 2) {
        struct timespec ts = {0, 2000000};
        uint64_t done;
        pthread_mutex_lock(&l->mu);
        done = l->st.rows_written + l->st.rows_lost + l->st.rows_failed +
               l->st.rows_spooled;
        pthread_mutex_unlock(&l->mu);
        if (done >= target)
            return QG_OK;
        if (waited >= max_ms)
            return QG_EIO;
        nanosleep(&ts, NULL);
    }
}

int qg__ledger_refusing(qg_ledger *l)
{
    return l && atomic_load_explicit(&l->refusing, memory_order_relaxed);
}

int qg__ledger_shared(qg_ledger *l)
{
    return l && l->be->shared;
}

int qg__ledger_behind(qg_ledger *l)
{
    size_t headroom = l ? (size_t)l->o.max_queue / 64 : 0;
    return l && qg__ledger_queued(l) + headroom >= (size_t)l->o.max_queue;
}

size_t qg__ledger_queued(qg_ledger *l)
{
    return l ? atomic_load_explicit(&l->depth, memory_order_relaxed) : 0;
}

/* ------------------------------------------------------------ history */

int qg__ledger_slots(qg_ledger *l, const char *subject, int64_t from_ms,
                     int64_t to_ms,
                     int (*fn)(const qg_usage_slot *s, void *ud), void *ud)
{
    if (!l || !subject || !fn || from_ms > to_ms)
        return QG_EINVAL;
    return l->be->history->slots(l->b, subject, from_ms, to_ms, fn, ud);
}

int qg__ledger_first_usage(qg_ledger *l, const char *subject,
                           int64_t *start_ms)
{
    if (!l || !subject || !start_ms)
        return QG_EINVAL;
    return l->be->history->first_usage(l->b, subject, start_ms);
}

int qg__ledger_latest(qg_ledger *l, const char *subject, int64_t before_ms,
                      int limit,
                      int (*fn)(const qg_ledger_row *row, void *ud),
                      void *ud)
{
    if (!l || !subject || !fn || limit < 0)
        return QG_EINVAL;
    if (limit == 0)
        return QG_OK;
    return l->be->history->latest(l->b, subject, before_ms, limit, fn, ud);
}
