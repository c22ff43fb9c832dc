/* reconcile_run.c - reconciliation's I/O (docs/reconcile.md): the ledger
 * and the engines that src/core/reconcile.c compares, for a running
 * gateway (qg__server_reconcile: its own engine and ledger, any store)
 * and for `quotagate reconcile` (qg_reconcile: a shared store and a
 * ledger opened from outside); and the report's JSON, the same for the
 * CLI and POST /v1/admin/reconcile.
 *
 * The fresh engines the ledger's rows are replayed into are built here:
 * the rules file read again (refused when its version is not the one the
 * live engine enforces: a replay under other rules would be another
 * semantics), an empty memory store, and the subjects created through the
 * admin API, read from the ledger as `serve` reads them at start. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "json_out.h"
#include "reconcile.h"
#include "rules.h"
#include "server.h"

#define CATCH_UP_MAX_MS 10000        /* the writer's backlog, at most */
#define OUTSIDE_PAUSE_MS 300         /* from outside: the second look */
#define IN_FLIGHT_MS 1000            /* see margin_of */

typedef struct src_ctx {
    qg_engine *live;
    qg_ledger *ledger;
    const char *rules_path;
    int outside;                     /* the CLI: another process writes */
    int catch_ups;
    int64_t margin_ms;               /* margin_of the rules */
    const qg_server *s;              /* the gateway's clock, or NULL */
    struct {                         /* the fresh engines and their stores */
        qg_engine *e;
        qg_store *st;
    } fresh[8];
} src_ctx;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t src_now(void *ud)
{
    src_ctx *c = ud;
    return c->s ? qg__server_now(c->s) : wall_ms();
}

typedef struct scan_ctx {
    qg_recon_row_fn fn;
    void *arg;
} scan_ctx;

static int scan_row(const qg_ledger_row *row, void *ud)
{
    scan_ctx *sc = ud;
    qg_recon_row r;
    char why[256];
    qg__row_restore_req(row, &r.rr);
    if (qg__row_in_bounds(&r.rr, why, sizeof why) < 0)
        return 0;                    /* the rebuild skips it too */
    r.settled_ms = row->status == QG_ROW_RESERVED ? 0 : row->settled_ms;
    return sc->fn(&r, sc->arg);
}

static int src_scan(void *ud, int64_t since_ms, qg_recon_row_fn fn, void *arg)
{
    src_ctx *c = ud;
    scan_ctx sc = {fn, arg};
    return qg__ledger_scan(c->ledger, since_ms, scan_row, &sc);
}

/* Every decision and settle sent to the store before now answered to its
 * caller, whose row is then queued (on a lane: a shared store's reply may
 * still be on its way after the store's view was read); at most the
 * margin, a call's longest way (margin_of), then the margin's counting
 * both ways stands in for what is still on its way. */
static void await_calls(src_ctx *c)
{
    unsigned mark = qg_engine_calls_mark(c->live);
    int64_t until = qg__clock_ms(CLOCK_MONOTONIC) + c->margin_ms;
    while (qg_engine_calls_left(c->live, mark) > 0 &&
           qg__clock_ms(CLOCK_MONOTONIC) < until)
        sleep_ms(1);
}

/* Every row queued before now written: the writer takes its queue in
 * order, so once it has processed as many rows as it had processed and
 * queued at the call, they are all in.  From outside (the CLI) another
 * process's queue cannot be seen: the second look waits a moment. */
static int src_catch_up(void *ud, char *err, size_t errcap)
{
    src_ctx *c = ud;
    qg_ledger_stats st;
    if (c->outside) {
        if (c->catch_ups++ > 0)
            sleep_ms(OUTSIDE_PAUSE_MS);
        return QG_OK;
    }
    await_calls(c);
    if (qg__ledger_catch_up(c->ledger, CATCH_UP_MAX_MS) == QG_OK)
        return QG_OK;
    qg__ledger_stats_get(c->ledger, &st);
    snprintf(err, errcap, "the ledger's writer is more than %d s "
             "behind (%llu rows queued%s%s): the rows of what the "
             "counters hold cannot all be read yet",
             CATCH_UP_MAX_MS / 1000, (unsigned long long)st.queued,
             st.failing ? "; writes fail: " : "",
             st.failing ? st.last_error : "");
    return QG_EIO;
}

static int put_subject(const char *subject, const char *plan,
                       const char *org, int64_t anchor_ms, void *ud)
{
    char err[256];
    qg_engine_set_subject(ud, subject, plan, *org ? org : NULL, anchor_ms,
                          err, sizeof err);
    return 0;                        /* as at start: skipped when unusable */
}

/* The live engine's rules again, an empty memory store, the subjects. */
static qg_engine *make_engine(const char *rules_path, const char *version,
                              qg_ledger *ledger, qg_store *store, char *err,
                              size_t errcap)
{
    qg_rules *r = NULL;
    qg_engine *e;
    char lerr[1024];
    if (qg_rules_load(rules_path, &r, lerr, sizeof lerr) != QG_OK) {
        snprintf(err, errcap, "the rules could not be read again: %s", lerr);
        return NULL;
    }
    if (version && strcmp(qg_rules_version(r), version) != 0) {
        snprintf(err, errcap, "the rules file %s now holds version %s, the "
                 "counters follow version %s: reload the gateway first",
                 rules_path, qg_rules_version(r), version);
        qg_rules_free(r);
        return NULL;
    }
    if (!(e = qg_engine_new(r, store))) {
        qg_rules_free(r);
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    if (qg__ledger_scan_subjects(ledger, put_subject, e) != QG_OK) {
        snprintf(err, errcap, "the ledger's subjects could not be read");
        qg_engine_free(e);
        return NULL;
    }
    return e;
}

static qg_engine *src_fresh(void *ud, char *err, size_t errcap)
{
    src_ctx *c = ud;
    qg_memory_opts mo;
    qg_store *st;
    qg_engine *e;
    memset(&mo, 0, sizeof mo);
    if (!(st = qg_store_memory_new(&mo))) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    for (int i = 0; i < 8; i++)
        if (!c->fresh[i].e) {
            if (!(e = make_engine(c->rules_path,
                                  qg_rules_version(qg_engine_rules(c->live)),
                                  c->ledger, st, err, errcap)))
                break;
            c->fresh[i].e = e;
            c->fresh[i].st = st;
            return e;
        }
    qg_store_free(st);
    return NULL;
}

/* An engine does not own its store: this one was made for it. */
static void src_fresh_free(void *ud, qg_engine *e)
{
    src_ctx *c = ud;
    for (int i = 0; e && i < 8; i++)
        if (c->fresh[i].e == e) {
            qg_engine_free(e);
            qg_store_free(c->fresh[i].st);
            c->fresh[i].e = NULL;
            c->fresh[i].st = NULL;
        }
}

static void src_init(src_ctx *c, qg_recon_src *src)
{
    src->scan = src_scan;
    src->catch_up = src_catch_up;
    src->fresh = src_fresh;
    src->fresh_free = src_fresh_free;
    src->now = src_now;
    src->ud = c;
}

/* How long a decision or settle may be on its way between the store and
 * the ledger: a store call fails after store.timeout, and the instants
 * on either side (the gateway's clock, Redis's) are taken within a
 * second of each other (reconcile.h, docs/reconcile.md "The instant"). */
static int64_t margin_of(const qg_rules *r)
{
    return IN_FLIGHT_MS + r->store.timeout_ms;
}

/* ------------------------------------------------------- in the gateway */

int qg__server_reconcile(qg_server *s, const char *subject, int repair,
                         qg_reconcile_report **out, char *err, size_t errcap)
{
    const qg_rules *r = qg_engine_rules(s->engine);
    qg_recon_opts o = {subject, repair, r->reconcile.tolerance_milli,
                       margin_of(r)};
    src_ctx c;
    qg_recon_src src;
    int rc;

    memset(&c, 0, sizeof c);
    c.live = s->engine;
    c.ledger = s->ledger;
    c.rules_path = s->opts.rules_path;
    c.s = s;
    c.margin_ms = o.margin_ms;
    src_init(&c, &src);
    /* one at a time: a repair must not race another run's repair */
    pthread_mutex_lock(&s->reconcile_mu);
    rc = qg__reconcile(s->engine, &src, &o, out, err, errcap);
    pthread_mutex_unlock(&s->reconcile_mu);
    if (rc != QG_OK)
        return rc;
    atomic_fetch_add(&s->reconcile_runs, 1);
    atomic_store(&s->reconcile_drifted, (uint64_t)(*out)->ndrifted);
    atomic_store(&s->reconcile_max_drift, (*out)->max_drift_milli);
    for (int i = 0; i < (*out)->ndrifted; i++) {
        const qg_reconcile_drift *d = &(*out)->drifted[i];
        char l[32], st[32], dr[32];
        qg_fixed_format(d->ledger_milli, 3, l, sizeof l);
        qg_fixed_format(d->store_milli, 3, st, sizeof st);
        qg_fixed_format(d->drift_milli, 3, dr, sizeof dr);
        fprintf(stderr, "quotagate: warning: reconcile: %s %s window %s: "
                "ledger %s, store %s, drift %s (%d request id%s the store "
                "does not know)%s\n", d->subject[0] ? "subject" : "org",
                d->subject[0] ? d->subject : d->org, d->window, l, st, dr,
                d->nrequest_ids, d->nrequest_ids == 1 ? "" : "s",
                (*out)->repair ? ((*out)->repaired ? "; repaired"
                                                   : "; not repaired")
                               : "");
    }
    return QG_OK;
}

/* ----------------------------------------------------- from outside */

static void cli_log(void *ud, const char *line)
{
    (void)ud;
    fprintf(stderr, "quotagate reconcile: %s\n", line);
}

int qg_reconcile(const qg_reconcile_opts *opts, qg_reconcile_report **out,
                 char *err, size_t errcap)
{
    const char *url = opts->store_url;
    qg_recon_opts o = {opts->subject, opts->repair,
                       opts->rules->reconcile.tolerance_milli,
                       margin_of(opts->rules)};
    qg_ledger_opts lo;
    qg_ledger *ledger = NULL;
    qg_store *store = NULL;
    qg_engine *live = NULL;
    qg_recon_src src;
    src_ctx c;
    char lerr[1024];
    qg_rules *rules = opts->rules;
    int rc;

    *out = NULL;
    if (!url || (strncmp(url, "redis://", 8) != 0 &&
                 strncmp(url, "redis-cluster://", 16) != 0)) {
        snprintf(err, errcap, "--store %s: reconcile from outside needs a "
                 "shared store (redis://HOST:PORT[/DB] or "
                 "redis-cluster://HOST:PORT[,...]); the memory store lives "
                 "inside one gateway: ask that gateway instead "
                 "(POST /v1/admin/reconcile)", url ? url : "");
        qg_rules_free(rules);
        return QG_EINVAL;
    }
    memset(&lo, 0, sizeof lo);
    lo.log = cli_log;
    if (!(ledger = qg__ledger_open(opts->ledger_url, &lo, lerr,
                                   sizeof lerr))) {
        snprintf(err, errcap, "--ledger %s: %s", opts->ledger_url, lerr);
        qg_rules_free(rules);
        return QG_EIO;
    }
    {
        qg_redis_opts ro = {.rules = opts->rules, .server_time = 1,
                            .timeout_ms = (int)opts->rules->store.timeout_ms};
        if (!(store = qg_store_redis_new(url, &ro, lerr, sizeof lerr))) {
            snprintf(err, errcap, "--store %s: %s", url, lerr);
            rc = QG_ESTORE;
            goto out;
        }
    }
    if ((rc = qg_store_probe(store)) == QG_ESTORE) {
        snprintf(err, errcap, "--store %s: %s", url,
                 qg_store_redis_error(store));
        goto out;
    }
    if (!(live = qg_engine_new(opts->rules, store))) {
        snprintf(err, errcap, "out of memory");
        rc = QG_ENOMEM;
        goto out;
    }
    rules = NULL;                    /* the engine's now */
    if (qg__ledger_scan_subjects(ledger, put_subject, live) != QG_OK) {
        snprintf(err, errcap, "--ledger %s: the subjects could not be read",
                 opts->ledger_url);
        rc = QG_EIO;
        goto out;
    }
    memset(&c, 0, sizeof c);
    c.live = live;
    c.ledger = ledger;
    c.rules_path = qg_rules_path(qg_engine_rules(live));
    c.outside = 1;
    src_init(&c, &src);
    rc = qg__reconcile(live, &src, &o, out, err, errcap);
out:
    qg_engine_free(live);
    qg_rules_free(rules);
    qg_store_free(store);
    qg__ledger_close(ledger);
    return rc;
}

/* ----------------------------------------------------------- the JSON */

char *qg_reconcile_json(const qg_reconcile_report *r)
{
    json_t *j = json_object(), *arr = json_array();
    if (!j || !arr)
        goto fail;
    json_object_set_new(j, "at", qg__json_time(r->at_ms));
    json_object_set_new(j, "checked", json_integer((json_int_t)r->checked));
    for (int i = 0; i < r->ndrifted; i++) {
        const qg_reconcile_drift *d = &r->drifted[i];
        json_t *ids = json_array();
        for (int k = 0; ids && k < d->nrequest_ids; k++)
            json_array_append_new(ids, json_string(d->request_ids[k]));
        json_array_append_new(arr, json_pack(
            "{s:o, s:o, s:s, s:o, s:o, s:o, s:o}",
            "subject", d->subject[0] ? json_string(d->subject) : json_null(),
            "org", d->org[0] ? json_string(d->org) : json_null(),
            "window", d->window,
            "ledger", qg__json_milli(d->ledger_milli),
            "store", qg__json_milli(d->store_milli),
            "drift", qg__json_milli(d->drift_milli),
            "request_ids", ids ? ids : json_array()));
    }
    json_object_set_new(j, "drifted", arr);
    json_object_set_new(j, "repaired", json_boolean(r->repaired));
    return qg__json_dump_steal(j);
fail:
    json_decref(j);
    json_decref(arr);
    return NULL;
}
