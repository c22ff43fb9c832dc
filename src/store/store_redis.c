/* store_redis.c - counters in Redis (or Valkey), one node or a Redis
 * Cluster: the store object, its rules versions and epochs, the method
 * table (store.h), and the synchronous calls.
 *
 * Every decision is one execution of the rules version's script
 * (redis_script.c, the Lua files in src/store/redis/) on the node of one
 * hash slot, the operations are redis_ops.c's, and the transport is the
 * asynchronous link (redis_link.h: pipelined, routed by slot, following
 * MOVED/ASK).  The HTTP workers call on lanes, their own links on their
 * own event loops; the synchronous methods run the same operation on the
 * store's lane and loop, one caller at a time (redis_store.h).
 *
 * Time: with opts->server_time the scripts read Redis's TIME (one clock
 * for all instances, PRODUCT.md 5.1.2) and now_ms is only the estimate
 * calendar periods are computed for; without (tests), now_ms is used.
 *
 * Data loss: every node's data set carries an epoch, a random id created
 * with it (qg:epoch on one node; qg:epoch:{TAG} per master of a Cluster,
 * redis_ops.c's probe).  One that is gone or changed marks the store
 * lost: checks answer QG_ESTATE until qg_store_redis_accept_loss (after
 * the counters were rebuilt from the ledger).  On one node every check
 * reads the epoch with its script (the check that noticed is voided); in
 * a Cluster the probe notices (the keeper's, every 200 ms).
 *
 * Errors: a Redis error, a lost connection or a timeout is QG_ESTORE,
 * the reason in qg_store_redis_error(). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <event2/event.h>
#include "redis_store.h"

static const qg_store_methods redis_methods, cluster_methods;

static redis_store *rs_of(qg_store *s)
{
    return s && (s->m == &redis_methods || s->m == &cluster_methods)
               ? (redis_store *)s : NULL;
}

void qg__rs_set_err(redis_store *s, const char *fmt, const char *a)
{
    snprintf(s->err, sizeof s->err, fmt, a ? a : "");
}

/* ------------------------------------------------------------ versions */

int qg__rs_version_of(redis_store *s, const qg_rules *r, qg__rs_version **out)
{
    qg__rs_version *v;
    int rc;
    if (!r) {
        qg__rs_set_err(s, "%s", "the Redis store needs the rules of each call");
        return QG_EINVAL;
    }
    for (v = s->versions; v; v = v->next)
        if (v->rules == r)
            break;
    if (!v) {
        if (!(v = qg__rs_version_new(r, s->versions, &rc, s->err,
                                     sizeof s->err)))
            return rc;
        v->next = s->versions;
        s->versions = v;
    }
    s->cur = v;
    *out = v;
    return QG_OK;
}

int64_t qg__rs_rid_ttl(const redis_store *s, const qg__rs_version *v)
{
    return s->rid_ttl_opt > 0 ? s->rid_ttl_opt : v->rid_ttl_ms;
}

/* -------------------------------------------------------------- epochs */

int qg__rs_epoch_note(redis_store *s, const char *key, const char *val)
{
    int lost = 0;
    pthread_mutex_lock(&s->mu);
    if (!key) {
        lost = s->have_epoch && strcmp(s->epoch, val) != 0;
        snprintf(s->epoch, sizeof s->epoch, "%s", val);
        s->have_epoch = 1;
    } else {
        int i;
        for (i = 0; i < s->nepochs; i++)
            if (strcmp(s->epochs[i].key, key) == 0)
                break;
        if (i < s->nepochs) {
            lost = strcmp(s->epochs[i].val, val) != 0;
        } else if (s->nepochs < s->capepochs ||
                   (s->epochs = realloc(s->epochs, (size_t)(s->capepochs =
                        s->capepochs ? 2 * s->capepochs : 8) *
                        sizeof *s->epochs))) {
            snprintf(s->epochs[i].key, sizeof s->epochs[i].key, "%s", key);
            s->nepochs++;
        } else {
            s->capepochs = s->nepochs = 0;  /* out of memory: forget */
            i = -1;
        }
        if (i >= 0)
            snprintf(s->epochs[i].val, sizeof s->epochs[i].val, "%s", val);
    }
    if (lost)
        __atomic_store_n(&s->lost, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->mu);
    return lost;
}

/* --------------------------------------------------- synchronous calls */

typedef struct sync_wait {
    int fin, rc;
} sync_wait;

static void sync_done(void *ud, int rc)
{
    sync_wait *w = ud;
    w->fin = 1;
    w->rc = rc;
}

/* Drive the store's loop until the operation that answered rc is done,
 * then once more without waiting (what it sent without waiting leaves). */
static int sync_finish(redis_store *s, int rc, sync_wait *w)
{
    if (rc == QG_PENDING) {
        while (!w->fin)
            if (event_base_loop(s->sync_base, EVLOOP_ONCE) < 0)
                break;
        rc = w->fin ? w->rc : QG_ESTORE;
    }
    event_base_loop(s->sync_base, EVLOOP_NONBLOCK);
    pthread_mutex_unlock(&s->sync_mu);
    return rc;
}

#define SYNC(s, w) \
    sync_wait w = {0, 0};                                                   \
    pthread_mutex_lock(&(s)->sync_mu)

static int r_check(qg_store *st, const qg_store_check *in, qg_decision *out)
{
    redis_store *s = (redis_store *)st;
    SYNC(s, w);
    return sync_finish(s, qg__rs_op_check(s->sync_lane, in, out, sync_done,
                                          &w), &w);
}

static int r_settle(qg_store *st, const qg_store_settle *in,
                    qg_settle_result *out)
{
    redis_store *s = (redis_store *)st;
    SYNC(s, w);
    return sync_finish(s, qg__rs_op_settle(s->sync_lane, in, out, sync_done,
                                           &w), &w);
}

static int r_usage(qg_store *st, const qg_store_usage *in, qg_decision *out)
{
    redis_store *s = (redis_store *)st;
    SYNC(s, w);
    return sync_finish(s, qg__rs_op_usage(s->sync_lane, in, out, sync_done,
                                          &w), &w);
}

static int r_restore(qg_store *st, const qg_store_restore *in)
{
    redis_store *s = (redis_store *)st;
    SYNC(s, w);
    return sync_finish(s, qg__rs_op_restore(s->sync_lane, in, sync_done, &w),
                       &w);
}

static int r_known(qg_store *st, qg_key rid)
{
    redis_store *s = (redis_store *)st;
    int found = 0;
    SYNC(s, w);
    sync_finish(s, qg__rs_op_known(s->sync_lane, rid, &found, sync_done, &w),
                &w);
    return found;
}

/* Reach the data set (connecting when needed) and read its epochs: 0,
 * QG_ESTORE, or QG_ESTATE when it was lost. */
static int probe(redis_store *s, int fresh)
{
    SYNC(s, w);
    return sync_finish(s, qg__rs_op_probe(s->sync_lane, fresh, sync_done, &w),
                       &w);
}

static int r_probe(qg_store *st)
{
    return probe((redis_store *)st, 0);
}

/* ------------------------------------------------- asynchronous calls */

static qg_store_lane *r_lane_new(qg_store *st, void *loop, char *err,
                                 size_t errcap)
{
    return qg__rs_lane_open((redis_store *)st, loop, err, errcap);
}

static void r_lane_free(qg_store *st, qg_store_lane *l)
{
    (void)st;
    qg__rs_lane_close(l);
}

static int r_check_async(qg_store *st, qg_store_lane *l,
                         const qg_store_check *in, qg_decision *out,
                         qg_store_done done, void *ud)
{
    (void)st;
    return qg__rs_op_check(l, in, out, done, ud);
}

static int r_settle_async(qg_store *st, qg_store_lane *l,
                          const qg_store_settle *in, qg_settle_result *out,
                          qg_store_done done, void *ud)
{
    (void)st;
    return qg__rs_op_settle(l, in, out, done, ud);
}

static int r_usage_async(qg_store *st, qg_store_lane *l,
                         const qg_store_usage *in, qg_decision *out,
                         qg_store_done done, void *ud)
{
    (void)st;
    return qg__rs_op_usage(l, in, out, done, ud);
}

/* ------------------------------------------------------------ the rest */

static void r_stats(qg_store *st, qg_store_stats *out)
{
    memset(out, 0, sizeof *out);
    out->backend = st->m->name;
}

static void r_free(qg_store *st)
{
    redis_store *s = (redis_store *)st;
    if (!s)
        return;
    if (s->sync_lane) {
        event_base_loop(s->sync_base, EVLOOP_NONBLOCK);
        qg__rs_lane_close(s->sync_lane);
    }
    if (s->sync_base)
        event_base_free(s->sync_base);
    while (s->versions) {
        qg__rs_version *v = s->versions;
        s->versions = v->next;
        qg__rs_version_free(v);
    }
    qg__tz_free(s->utc);
    free(s->epochs);
    free(s->url);
    free(s->password);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->sync_mu);
    pthread_mutex_destroy(&s->placed_mu);
    free(s->placed);
    free(s);
}

#define METHODS(NAME)                                                       \
    {                                                                       \
        .api = QG_STORE_API,                                                \
        .name = NAME,                                                       \
        .flags = QG_STORE_SHARED | QG_STORE_PERSISTENT |                    \
                 QG_STORE_SETTLE_ORG,                                       \
        .check = r_check,                                                   \
        .settle = r_settle,                                                 \
        .usage = r_usage,                                                   \
        .restore = r_restore,                                               \
        .known = r_known,                                                   \
        .stats = r_stats,                                                   \
        .free = r_free,                                                     \
        .probe = r_probe,                                                   \
        .lane_new = r_lane_new,                                             \
        .lane_free = r_lane_free,                                           \
        .check_async = r_check_async,                                       \
        .settle_async = r_settle_async,                                     \
        .usage_async = r_usage_async,                                       \
    }

static const qg_store_methods redis_methods = METHODS("redis");
static const qg_store_methods cluster_methods = METHODS("redis-cluster");

/* ---------------------------------------------------------- public API */

/* Reach the data set at start: a few tries (a Cluster's first map). */
static int first_probe(redis_store *s)
{
    int rc = QG_ESTORE;
    for (int i = 0; i < 3 && rc == QG_ESTORE; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        if (i)
            nanosleep(&ts, NULL);
        rc = probe(s, 0);
    }
    return rc;
}

qg_store *qg_store_redis_new(const char *url, const qg_redis_opts *opts,
                             char *err, size_t errcap)
{
    redis_store *s = calloc(1, sizeof *s);
    const char *pw = getenv("QUOTAGATE_REDIS_PASSWORD");
    size_t len;
    char tmp[256];

    if (!err || !errcap) {
        err = tmp;
        errcap = sizeof tmp;
    }
    err[0] = 0;
    if (!s) {
        snprintf(err, errcap, "%s", "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->sync_mu, NULL);
    pthread_mutex_init(&s->placed_mu, NULL);
    if (!(s->placed = calloc(QG__RS_PLACES, sizeof *s->placed))) {
        snprintf(err, errcap, "%s", "out of memory");
        goto fail;
    }
    if (!url || (strncmp(url, "redis://", 8) != 0 &&
                 strncmp(url, "redis-cluster://", 16) != 0)) {
        snprintf(err, errcap, "%s", "a Redis store URL is redis://HOST:PORT[/DB] "
                 "or redis-cluster://HOST:PORT[,HOST:PORT...]");
        goto fail;
    }
    s->cluster = strncmp(url, "redis-cluster://", 16) == 0;
    s->base.m = s->cluster ? &cluster_methods : &redis_methods;
    s->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms
                                                 : QG__RS_DEFAULT_TIMEOUT_MS;
    s->server_time = opts ? opts->server_time != 0 : 1;
    s->rid_ttl_opt = opts ? opts->request_id_ttl_ms : 0;
    s->lib_keep_ms = opts && opts->library_keep_ms ? opts->library_keep_ms
                                                   : QG__RS_LIB_KEEP_MS;
    if (!(s->url = strdup(url)) || (pw && *pw && !(s->password = strdup(pw))) ||
        !(s->utc = qg__tz_utc()) || !(s->sync_base = event_base_new())) {
        snprintf(err, errcap, "%s", "out of memory");
        goto fail;
    }
    {
        const char *text = qg__rs_claim_text(&len);
        if (qg__rs_sha1(text, len, s->claim_sha) != 0) {
            snprintf(err, errcap, "%s", "cannot hash the Redis claim script");
            goto fail;
        }
    }
    if (opts && opts->rules) {
        qg__rs_version *v;
        if (qg__rs_version_of(s, opts->rules, &v) != QG_OK) {
            snprintf(err, errcap, "%s", s->err);
            goto fail;
        }
    }
    if (!(s->sync_lane = qg__rs_lane_open(s, s->sync_base, err, errcap)))
        goto fail;
    if (first_probe(s) == QG_ESTORE) {
        snprintf(err, errcap, "cannot connect to Redis: %s",
                 s->err[0] ? s->err : "no answer");
        goto fail;
    }
    return &s->base;
fail:
    r_free(&s->base);
    return NULL;
}

const char *qg_store_redis_error(qg_store *st)
{
    redis_store *s = rs_of(st);
    return s ? s->err : "not a Redis store";
}

int qg_store_redis_data_lost(qg_store *st)
{
    redis_store *s = rs_of(st);
    return s ? __atomic_load_n(&s->lost, __ATOMIC_ACQUIRE) : 0;
}

int qg_store_redis_accept_loss(qg_store *st)
{
    redis_store *s = rs_of(st);
    int rc;
    if (!s)
        return QG_EINVAL;
    __atomic_store_n(&s->lost, 0, __ATOMIC_RELEASE);
    if ((rc = probe(s, 1)) == QG_ESTATE)
        rc = QG_ESTORE;        /* cannot be: the epochs were forgotten */
    return rc;
}

void qg_store_redis_counters(qg_store *st, qg_redis_counters *out)
{
    redis_store *s = rs_of(st);
    memset(out, 0, sizeof *out);
    if (!s)
        return;
#define LOAD(f) out->f = __atomic_load_n(&s->cnt.f, __ATOMIC_RELAXED)
    LOAD(round_trips);
    LOAD(commands);
    LOAD(script_loads);
    LOAD(voids);
    LOAD(void_rollbacks);
    LOAD(lookups);
    LOAD(period_retries);
    LOAD(libraries_deleted);
#undef LOAD
}
