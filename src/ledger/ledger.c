/* ledger.c - the ledger's front: picks a backend by the URL's scheme and
 * forwards every call through its method table (ledger.h).
 *
 * "sqlite:PATH" or a plain path selects the embedded SQLite backend;
 * "postgresql://" (and "postgres://") are recognised but not built yet, so
 * they fail with a message that says so rather than creating a file with
 * that name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quotagate.h"
#include "ledger.h"

struct qg_ledger {
    const qg__ledger_backend *be;
    void *b;
    size_t max_queue;          /* opts.max_queue: submit refuses beyond */
};

qg_ledger *qg__ledger_open(const char *url, const qg_ledger_opts *opts,
                          char *err, size_t errcap)
{
    qg_ledger_opts o = { QG_LEDGER_DURABLE, 100, 65536, 4096, 5000, NULL,
                         NULL, 0 };
    const qg__ledger_backend *be = &qg__ledger_sqlite;
    const char *target = url;
    qg_ledger *l;

    if (err && errcap)
        err[0] = '\0';
    if (!url || !url[0]) {
        snprintf(err, errcap, "ledger: empty URL");
        return NULL;
    }
    if (strncmp(url, "postgresql://", 13) == 0 ||
        strncmp(url, "postgres://", 11) == 0) {
        snprintf(err, errcap, "ledger %s: PostgreSQL is not supported in "
                 "this build (use sqlite:PATH)", url);
        return NULL;
    }
    if (strncmp(url, "sqlite:", 7) == 0) {
        target = url + 7;
        if (strncmp(target, "//", 2) == 0)    /* sqlite:///abs/path */
            target += 2;
    } else if (strstr(url, "://")) {
        snprintf(err, errcap, "ledger %s: unknown scheme (use sqlite:PATH "
                 "or a path)", url);
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
    }
    if (o.sync != QG_LEDGER_DURABLE && o.sync != QG_LEDGER_ASYNC) {
        snprintf(err, errcap, "ledger: unknown sync mode %d", (int)o.sync);
        return NULL;
    }
    if (!(l = calloc(1, sizeof *l))) {
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    l->be = be;
    l->max_queue = (size_t)o.max_queue;
    if (!(l->b = be->open(target, &o, err, errcap))) {
        free(l);
        return NULL;
    }
    return l;
}

void qg__ledger_close(qg_ledger *l)
{
    if (!l)
        return;
    l->be->close(l->b);
    free(l);
}

int qg__ledger_submit(qg_ledger *l, const qg_ledger_row *row,
                     qg_ledger_done done, void *arg)
{
    if (!l || !row)
        return QG_EINVAL;
    return l->be->submit(l->b, row, done, arg);
}

int qg__ledger_scan(qg_ledger *l, int64_t since_ms,
                   int (*fn)(const qg_ledger_row *row, void *ud), void *ud)
{
    if (!l || !fn)
        return QG_EINVAL;
    return l->be->scan(l->b, since_ms, fn, ud);
}

int qg__ledger_get(qg_ledger *l, const char *request_id, qg_ledger_row *out)
{
    if (!l || !request_id || !out)
        return QG_EINVAL;
    return l->be->get(l->b, request_id, out);
}

int qg__ledger_put_subject(qg_ledger *l, const char *subject, const char *plan,
                          const char *org, int64_t billing_anchor_ms,
                          int64_t now_ms)
{
    if (!l || !subject || !subject[0] || !plan)
        return QG_EINVAL;
    return l->be->put_subject(l->b, subject, plan, org ? org : "",
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
    return l->be->scan_subjects(l->b, fn, ud);
}

int qg__ledger_put_key(qg_ledger *l, const qg_key_rec *k)
{
    if (!l || !k || !k->id[0])
        return QG_EINVAL;
    return l->be->put_key(l->b, k);
}

int qg__ledger_get_key(qg_ledger *l, const char *id, qg_key_rec *out)
{
    if (!l || !id || !out)
        return QG_EINVAL;
    return l->be->get_key(l->b, id, out);
}

int qg__ledger_list_keys(qg_ledger *l,
                        int (*fn)(const qg_key_rec *k, void *ud), void *ud)
{
    if (!l || !fn)
        return QG_EINVAL;
    return l->be->list_keys(l->b, fn, ud);
}

int qg__ledger_revoke_key(qg_ledger *l, const char *id, int64_t now_ms)
{
    if (!l || !id)
        return QG_EINVAL;
    return l->be->revoke_key(l->b, id, now_ms);
}

void qg__ledger_stats_get(qg_ledger *l, qg_ledger_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (l) {
        l->be->stats_get(l->b, out);
        out->backend = l->be->name;
    }
}

int qg__ledger_behind(qg_ledger *l)
{
    size_t headroom = l ? l->max_queue / 64 : 0;
    return l && qg__ledger_queued(l) + headroom >= l->max_queue;
}

size_t qg__ledger_queued(qg_ledger *l)
{
    return l ? l->be->queued(l->b) : 0;
}
