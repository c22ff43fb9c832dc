/* store_redis.c - counters in Redis (or Valkey): the store method table
 * (store.h) on one synchronous hiredis connection.
 *
 * Every decision is one execution of the rules version's script
 * (redis_script.c, the Lua files in src/store/redis/) on one Redis node, over keys of
 * one hash slot; this file only moves its arguments and replies, and is
 * the whole transport: the asynchronous pipelined one (hiredis's libevent
 * adapter) and Cluster routing replace this file and keep redis_script.h.
 *
 * Round trips (docs/redis-store.md):
 *  - check: one.  Pipelined in one write: GET qg:epoch, the request id's
 *    claim SET qg:rid:{RID} <tag+member> NX GET PX 30s, and EVALSHA.  The
 *    claim's old value says whether the id already belongs to another
 *    tag (another org's member): then, rarely, a lookup in that tag
 *    answers (a replay, or QG_EINVAL for another subject's id) and an
 *    admission the script made meanwhile is voided exactly (its undo log
 *    came back in the reply).  After an admission the claim is extended
 *    to the request-id TTL by a command whose reply is read with the next
 *    operation's (no wait).
 *  - settle: one when it names its subject (the engine passes the
 *    subject's org, so the tag is known), else two (GET the index, then
 *    EVALSHA).
 *  - usage: one.  restore: two (the index, then EVALSHA with the index
 *    write pipelined).  known: two.
 * NOSCRIPT (a restart, SCRIPT FLUSH, a failover) costs one SCRIPT LOAD and
 * the EVALSHA again; a calendar period the script did not get (a reset
 * between C's instant and Redis's) costs one more EVALSHA.
 *
 * Time: with opts->server_time the scripts read Redis's TIME (one clock
 * for all instances, PRODUCT.md 5.1.2) and now_ms is only the estimate
 * calendar periods are computed for; without (tests), now_ms is used.
 *
 * Data loss: qg:epoch holds a random id created with the data set (SET
 * NX at connect).  A check that finds it gone or changed, or a reconnect
 * that does, marks the store lost: checks answer QG_ESTATE until
 * qg_store_redis_accept_loss (after the counters were rebuilt from the
 * ledger); the check that noticed it is voided.
 *
 * Errors: a Redis error or a lost connection is QG_ESTORE with the reason in
 * qg_store_redis_error(); the next call reconnects.  Thread-safe (one
 * mutex: this prototype serialises its callers). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include "calendar.h"
#include "redis_script.h"
#include "store.h"

#define DEFAULT_TIMEOUT_MS 1000
#define MAX_ATTEMPTS 8
#define MAX_PIPE 4

typedef struct redis_store {
    qg_store base;
    pthread_mutex_t mu;
    char host[256];
    int port, db;
    char *password;
    int timeout_ms, server_time;
    int64_t rid_ttl_opt;
    redisContext *c;
    int pending;                 /* deferred replies not read yet */
    qg__rs_version *versions, *cur;
    char claim_sha[41];
    char epoch[33];
    int have_epoch, lost;
    qg_tz *utc;
    char err[256];
    qg_redis_counters cnt;
} redis_store;

static const qg_store_methods redis_methods;

static redis_store *rs_of(qg_store *s)
{
    return s && s->m == &redis_methods ? (redis_store *)s : NULL;
}

static void set_err(redis_store *s, const char *fmt, const char *a)
{
    snprintf(s->err, sizeof s->err, fmt, a ? a : "");
}

/* --------------------------------------------------------- connection */

static void drop_conn(redis_store *s)
{
    if (s->c)
        redisFree(s->c);
    s->c = NULL;
    s->pending = 0;
}

/* One command, synchronously (connection set-up only). */
static redisReply *cmd1(redis_store *s, int argc, const char **argv)
{
    redisReply *r = redisCommandArgv(s->c, argc, argv, NULL);
    s->cnt.round_trips++;
    s->cnt.commands++;
    return r;
}

static void random_hex(char out[33])
{
    unsigned char b[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC), ok = 0;
    if (fd >= 0) {
        ok = read(fd, b, sizeof b) == (ssize_t)sizeof b;
        close(fd);
    }
    if (!ok) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        for (int i = 0; i < 16; i++)
            b[i] = (unsigned char)((tv.tv_usec >> (i % 4 * 8)) ^ (getpid() >> i) ^
                                   (tv.tv_sec >> (i % 8)));
    }
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Read (creating it when the data set has none) the epoch; a value
 * other than the one known means the data set was lost. */
static int epoch_sync(redis_store *s)
{
    char fresh[33];
    const char *set[] = {"SET", QG__RS_KEY_EPOCH, fresh, "NX"};
    const char *get[] = {"GET", QG__RS_KEY_EPOCH};
    redisReply *r;
    random_hex(fresh);
    if (!(r = cmd1(s, 4, set)))
        return QG_ESTORE;
    freeReplyObject(r);
    if (!(r = cmd1(s, 2, get)))
        return QG_ESTORE;
    if (r->type != REDIS_REPLY_STRING || r->len >= sizeof s->epoch) {
        freeReplyObject(r);
        set_err(s, "%s", "unexpected reply reading qg:epoch");
        return QG_ESTORE;
    }
    if (s->have_epoch && strcmp(s->epoch, r->str) != 0)
        s->lost = 1;
    memcpy(s->epoch, r->str, r->len + 1);
    s->have_epoch = 1;
    freeReplyObject(r);
    return QG_OK;
}

static int ensure_conn(redis_store *s)
{
    struct timeval tv = {s->timeout_ms / 1000, (s->timeout_ms % 1000) * 1000};
    redisReply *r;
    if (s->c && !s->c->err)
        return QG_OK;
    drop_conn(s);
    s->c = redisConnectWithTimeout(s->host, s->port, tv);
    if (!s->c || s->c->err) {
        set_err(s, "cannot connect to Redis: %s",
                s->c ? s->c->errstr : "out of memory");
        drop_conn(s);
        return QG_ESTORE;
    }
    redisSetTimeout(s->c, tv);
    if (s->password) {
        const char *a[] = {"AUTH", s->password};
        r = cmd1(s, 2, a);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            set_err(s, "Redis AUTH failed: %s", r ? r->str : s->c->errstr);
            if (r)
                freeReplyObject(r);
            drop_conn(s);
            return QG_ESTORE;
        }
        freeReplyObject(r);
    }
    if (s->db) {
        char db[16];
        const char *a[] = {"SELECT", db};
        snprintf(db, sizeof db, "%d", s->db);
        r = cmd1(s, 2, a);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            set_err(s, "Redis SELECT failed: %s", r ? r->str : s->c->errstr);
            if (r)
                freeReplyObject(r);
            drop_conn(s);
            return QG_ESTORE;
        }
        freeReplyObject(r);
    }
    if (epoch_sync(s) != QG_OK) {
        if (!s->err[0])
            set_err(s, "Redis: %s", s->c ? s->c->errstr : "");
        drop_conn(s);
        return QG_ESTORE;
    }
    return QG_OK;
}

/* The connection failed: remember why and reconnect next time. */
static int io_fail(redis_store *s)
{
    set_err(s, "Redis connection lost: %s", s->c ? s->c->errstr : "");
    drop_conn(s);
    return QG_ESTORE;
}

/* Send n commands in one write and read their replies (after those of
 * deferred commands): one round trip. */
static int pipe_run(redis_store *s, qg__rs_args **cmds, int n,
                    redisReply **replies)
{
    for (int i = 0; i < n; i++) {
        replies[i] = NULL;
        if (cmds[i]->failed) {
            set_err(s, "%s", "a Redis command too large to build");
            return QG_ENOMEM;
        }
        if (redisAppendCommandArgv(s->c, cmds[i]->argc,
                                   (const char **)cmds[i]->argv,
                                   cmds[i]->len) != REDIS_OK)
            return io_fail(s);
        s->cnt.commands++;
    }
    s->cnt.round_trips++;
    while (s->pending > 0) {
        void *r;
        if (redisGetReply(s->c, &r) != REDIS_OK)
            return io_fail(s);
        freeReplyObject(r);
        s->pending--;
    }
    for (int i = 0; i < n; i++) {
        void *r;
        if (redisGetReply(s->c, &r) != REDIS_OK) {
            for (int j = 0; j < i; j++)
                freeReplyObject(replies[j]);
            return io_fail(s);
        }
        replies[i] = r;
    }
    return QG_OK;
}

/* Send a command whose reply nobody waits for (read with the next
 * pipeline's). */
static void defer(redis_store *s, qg__rs_args *a)
{
    int done = 0;
    if (a->failed || redisAppendCommandArgv(s->c, a->argc,
                                            (const char **)a->argv,
                                            a->len) != REDIS_OK)
        return;
    s->cnt.commands++;
    s->pending++;
    while (!done)
        if (redisBufferWrite(s->c, &done) != REDIS_OK)
            return;
}

static int is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR &&
           strncmp(r->str, "NOSCRIPT", 8) == 0;
}

static int load_script(redis_store *s, const char *text, size_t len)
{
    qg__rs_args a, *p = &a;
    redisReply *r;
    int rc;
    qg__rs_args_init(&a);
    qg__rs_adds(&a, "SCRIPT");
    qg__rs_adds(&a, "LOAD");
    qg__rs_add(&a, text, len);
    rc = pipe_run(s, &p, 1, &r);
    qg__rs_args_free(&a);
    if (rc != QG_OK)
        return rc;
    s->cnt.script_loads++;
    if (r->type == REDIS_REPLY_ERROR) {
        set_err(s, "Redis refused the script: %s", r->str);
        freeReplyObject(r);
        return QG_ESTORE;
    }
    freeReplyObject(r);
    return QG_OK;
}

/* Run the pipeline whose last command is an EVALSHA of `text`; on
 * NOSCRIPT load the script and run that EVALSHA alone again. */
static int eval_pipe(redis_store *s, qg__rs_args **cmds, int n,
                     redisReply **replies, const char *text, size_t len)
{
    int rc = pipe_run(s, cmds, n, replies);
    if (rc != QG_OK || !is_noscript(replies[n - 1]))
        return rc;
    freeReplyObject(replies[n - 1]);
    replies[n - 1] = NULL;
    if ((rc = load_script(s, text, len)) != QG_OK ||
        (rc = pipe_run(s, &cmds[n - 1], 1, &replies[n - 1])) != QG_OK) {
        for (int i = 0; i < n - 1; i++) {
            freeReplyObject(replies[i]);
            replies[i] = NULL;
        }
        return rc;
    }
    return QG_OK;
}

/* A script reply as items (pointing into r); NULL for an error reply. */
static qg__rs_item *items_of(redis_store *s, const redisReply *r, int *n)
{
    qg__rs_item *it;
    if (r->type == REDIS_REPLY_ERROR) {
        set_err(s, "Redis script error: %s", r->str);
        return NULL;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        set_err(s, "%s", "unexpected reply from the Redis script");
        return NULL;
    }
    if (!(it = calloc(r->elements, sizeof *it))) {
        set_err(s, "%s", "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_INTEGER) {
            it[i].i = e->integer;
        } else if (e->type == REDIS_REPLY_STRING ||
                   e->type == REDIS_REPLY_STATUS) {
            it[i].is_str = 1;
            it[i].s = e->str;
            it[i].len = e->len;
        } else {
            free(it);
            set_err(s, "%s", "unexpected element in a Redis script reply");
            return NULL;
        }
    }
    *n = (int)r->elements;
    return it;
}

/* ------------------------------------------------------------ versions */

static int version_of(redis_store *s, const qg_rules *r, qg__rs_version **out)
{
    qg__rs_version *v;
    int rc;
    if (!r) {
        set_err(s, "%s", "the Redis store needs the rules of each call");
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

static int64_t rid_ttl(const redis_store *s, const qg__rs_version *v)
{
    return s->rid_ttl_opt > 0 ? s->rid_ttl_opt : v->rid_ttl_ms;
}

/* The spending cap's period containing at (engine.c, cap_period). */
static void cap_period(const redis_store *s, int64_t anchor, int64_t at,
                       int64_t *start, int64_t *end)
{
    qg_calendar_spec c = {QG_EVERY_MONTH, 0, 1, 0, 1, s->utc};
    if (qg__calendar_period(&c, anchor, at, start, end) != 0) {
        *start = 0;
        *end = INT64_MAX;
    }
}

/* -------------------------------------------------------------- check */

typedef struct reply_buf {
    redisReply *r;
    qg__rs_item *it;
    int n;
} reply_buf;

static void reply_free(reply_buf *b)
{
    free(b->it);
    if (b->r)
        freeReplyObject(b->r);
    memset(b, 0, sizeof *b);
}

/* Take reply r (owned) as script items. */
static int reply_take(redis_store *s, redisReply *r, reply_buf *b)
{
    b->r = r;
    if (!(b->it = items_of(s, r, &b->n))) {
        reply_free(b);
        return QG_ESTORE;
    }
    return QG_OK;
}

/* Take back an admission (its undo log is in res, pointing into the
 * reply that is still alive). */
static int void_check(redis_store *s, const qg__rs_version *v,
                      const qg__rs_place *p, const char *rid,
                      const qg__rs_result *res)
{
    qg__rs_args a, *ap = &a;
    redisReply *r;
    int rc;
    qg__rs_args_init(&a);
    qg__rs_eval_head(&a, v->sha, p, rid);
    qg__rs_args_void(&a, res, rid);
    rc = eval_pipe(s, &ap, 1, &r, v->text, v->len);
    qg__rs_args_free(&a);
    if (rc != QG_OK)
        return rc;
    s->cnt.voids++;
    if (r->type == REDIS_REPLY_ERROR) {
        set_err(s, "Redis void failed: %s", r->str);
        rc = QG_ESTORE;
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
               r->element[1]->type == REDIS_REPLY_INTEGER &&
               r->element[1]->integer == 2) {
        s->cnt.void_rollbacks++;
    }
    freeReplyObject(r);
    return rc;
}

/* The id is claimed by another place q: what does its record say? */
static int lookup_foreign(redis_store *s, const qg__rs_version *v,
                          const qg__rs_place *p,
                          const qg__rs_place *q, const char *rid,
                          int64_t now_arg, qg_decision *out, int *kind)
{
    qg__rs_args a, *ap = &a;
    redisReply *r;
    reply_buf b = {0};
    qg__rs_result res;
    int rc;
    qg__rs_args_init(&a);
    qg__rs_eval_head(&a, v->sha, q, rid);
    qg__rs_args_lookup(&a, now_arg, p->member);
    rc = eval_pipe(s, &ap, 1, &r, v->text, v->len);
    qg__rs_args_free(&a);
    if (rc != QG_OK || (rc = reply_take(s, r, &b)) != QG_OK)
        return rc;
    s->cnt.lookups++;
    qg__rs_decode_check(b.it, b.n, v, out, &res);
    reply_free(&b);
    *kind = res.kind;
    if (res.kind == QG__RS_BAD) {
        set_err(s, "%s", "a request id recorded under another org could not "
                "be replayed");
        return QG_ESTORE;
    }
    return QG_OK;
}

static void claim_cas(redis_store *s, const char *idx, const char *old,
                      const char *val, int64_t ttl)
{
    size_t len;
    const char *text = qg__rs_claim_text(&len);
    qg__rs_args a, *ap = &a;
    redisReply *r;
    qg__rs_args_init(&a);
    qg__rs_adds(&a, "EVALSHA");
    qg__rs_adds(&a, s->claim_sha);
    qg__rs_addi(&a, 1);
    qg__rs_adds(&a, idx);
    qg__rs_adds(&a, old);
    qg__rs_adds(&a, val);
    qg__rs_addi(&a, ttl);
    if (eval_pipe(s, &ap, 1, &r, text, len) == QG_OK)
        freeReplyObject(r);
    qg__rs_args_free(&a);
}

/* Extend the index key to the request-id TTL, or (val) rewrite it, with
 * a command nobody waits for. */
static void index_keep(redis_store *s, const char *idx, const char *val,
                       int64_t ttl)
{
    qg__rs_args a;
    qg__rs_args_init(&a);
    qg__rs_adds(&a, val ? "SET" : "PEXPIRE");
    qg__rs_adds(&a, idx);
    if (val) {
        qg__rs_adds(&a, val);
        qg__rs_adds(&a, "PX");
    }
    qg__rs_addi(&a, ttl);
    defer(s, &a);
    qg__rs_args_free(&a);
}

/* What the id's claim said (old: its previous value, NULL none) means for
 * a check whose script answered rc (res, out; admitted: a new admission
 * here).  Returns the check's final code. */
static int resolve_claim(redis_store *s, const qg__rs_version *v,
                         const qg__rs_place *p, const char *rid,
                         const char *old, const char *val, int64_t now_arg,
                         int rc, int admitted, const qg__rs_result *res,
                         qg_decision *out)
{
    char idx[QG__RS_KEY_MAX];
    qg__rs_place q;
    qg__rs_key_index(rid, idx);
    if (old && qg__rs_index_parse(old, 64, &q) == 0) {
        if (strcmp(q.tag, p->tag) != 0 && res->has_undo) {
            /* the id was claimed under another tag: its record decides,
             * and what this check changed here is taken back (the memory
             * store would not have looked at these entities at all) */
            qg_decision other;
            int kind = QG__RS_BAD, lrc;
            lrc = lookup_foreign(s, v, p, &q, rid, now_arg, &other, &kind);
            if (lrc != QG_OK) {
                void_check(s, v, p, rid, res);
                return lrc;
            }
            if (kind != QG__RS_ABSENT) {
                if ((lrc = void_check(s, v, p, rid, res)) != QG_OK)
                    return lrc;
                if (kind == QG__RS_EINVAL)
                    return QG_EINVAL;
                *out = other;
                return QG_OK;
            }
            /* a stale claim (a refusal's, or an expired record's) */
            claim_cas(s, idx, old, val,
                      admitted ? rid_ttl(s, v) : QG__RS_CLAIM_TTL_MS);
            return rc;
        }
        if (admitted && strcmp(q.member, p->member) != 0) {
            /* another member's stale claim in this tag: the id is ours */
            index_keep(s, idx, val, rid_ttl(s, v));
            return rc;
        }
    }
    if (admitted)
        index_keep(s, idx, NULL, rid_ttl(s, v));
    return rc;
}

static int r_check(qg_store *st, const qg_store_check *in, qg_decision *out)
{
    redis_store *s = (redis_store *)st;
    qg__rs_version *v;
    qg__rs_check_args ca;
    qg__rs_args get, claim, ev, *cmds[3];
    redisReply *rep[3] = {NULL, NULL, NULL};
    reply_buf b = {0};
    qg__rs_result res;
    qg__rs_place p;
    char rid[17], idx[QG__RS_KEY_MAX], val[65], old[65] = "", ttl[24];
    int rc, have_old = 0, admitted = 0, lost = 0;

    qg__rs_args_init(&get);
    qg__rs_args_init(&claim);
    qg__rs_args_init(&ev);
    pthread_mutex_lock(&s->mu);
    s->err[0] = 0;
    if ((rc = version_of(s, in->rules, &v)) != QG_OK)
        goto out;
    if (in->weight_milli > QG_REDIS_AMOUNT_MAX) {
        rc = QG_ERANGE;
        set_err(s, "%s", "a weight above 10^12 points is beyond what the "
                "Redis store counts exactly");
        goto out;
    }
    if ((rc = ensure_conn(s)) != QG_OK)
        goto out;
    if (s->lost) {
        rc = QG_ESTATE;
        set_err(s, "%s", "the Redis store lost its data (qg:epoch changed): "
                "rebuild the counters, then accept the loss");
        goto out;
    }
    qg__rs_place_of(in->member, in->has_org && in->orgspec, in->org, &p);
    qg__rs_hex_lo(in->rid, rid);
    qg__rs_key_index(rid, idx);
    qg__rs_index_value(&p, val);
    snprintf(ttl, sizeof ttl, "%d", QG__RS_CLAIM_TTL_MS);
    memset(&ca, 0, sizeof ca);
    ca.in = in;
    ca.ver = v;
    ca.now_arg = s->server_time ? 0 : in->now_ms;
    ca.pnow = in->now_ms;
    ca.cap_start = in->payg_mask ? in->cap_start_ms : 0;
    ca.cap_end = in->payg_mask ? in->cap_end_ms : 0;
    ca.check_cap = s->server_time;
    ca.rid_ttl_ms = rid_ttl(s, v);
    qg__rs_adds(&get, "GET");
    qg__rs_adds(&get, QG__RS_KEY_EPOCH);
    qg__rs_adds(&claim, "SET");
    qg__rs_adds(&claim, idx);
    qg__rs_adds(&claim, val);
    qg__rs_adds(&claim, "NX");
    qg__rs_adds(&claim, "GET");
    qg__rs_adds(&claim, "PX");
    qg__rs_adds(&claim, ttl);
    for (int attempt = 0;; attempt++) {
        int first = attempt == 0;
        qg__rs_args_reset(&ev);
        qg__rs_eval_head(&ev, v->sha, &p, rid);
        qg__rs_args_check(&ev, &ca);
        cmds[0] = &get;
        cmds[1] = &claim;
        cmds[2] = &ev;
        if (first)
            rc = eval_pipe(s, cmds, 3, rep, v->text, v->len);
        else
            rc = eval_pipe(s, &cmds[2], 1, &rep[2], v->text, v->len);
        if (rc != QG_OK)
            goto out;
        if (first) {
            lost = rep[0]->type != REDIS_REPLY_STRING ||
                   strcmp(rep[0]->str, s->epoch) != 0;
            if (rep[1]->type == REDIS_REPLY_STRING && rep[1]->len == 64) {
                memcpy(old, rep[1]->str, 65);
                have_old = 1;
            }
            freeReplyObject(rep[0]);
            freeReplyObject(rep[1]);
            rep[0] = rep[1] = NULL;
        }
        reply_free(&b);
        rc = reply_take(s, rep[2], &b);
        rep[2] = NULL;
        if (rc != QG_OK)
            goto out;
        qg__rs_decode_check(b.it, b.n, v, out, &res);
        if (res.kind != QG__RS_PERIOD)
            break;
        /* a reset between C's instant and the script's: periods for the
         * script's instant, decided at it */
        s->cnt.period_retries++;
        if (attempt + 1 >= MAX_ATTEMPTS) {
            rc = QG_ESTORE;
            set_err(s, "%s", "calendar periods did not settle");
            goto out;
        }
        ca.now_arg = res.raw_now;
        ca.pnow = res.need_now;
        ca.check_cap = 0;
        if (in->payg_mask)
            cap_period(s, in->anchor_ms, res.raw_now, &ca.cap_start,
                       &ca.cap_end);
    }
    switch (res.kind) {
    case QG__RS_OK:
        rc = QG_OK;
        admitted = out->outcome == QG_ALLOW && !out->replayed;
        break;
    case QG__RS_EINVAL:
        rc = QG_EINVAL;
        break;
    case QG__RS_ERR:
        rc = res.rc;
        break;
    default:
        rc = QG_ESTORE;
        set_err(s, "%s", "unexpected reply from the Redis check script");
        goto out;
    }
    if (lost) {
        /* the data set is not the one the counters were built on */
        s->lost = 1;
        if (admitted)
            void_check(s, v, &p, rid, &res);
        rc = QG_ESTATE;
        set_err(s, "%s", "the Redis store lost its data (qg:epoch changed): "
                "rebuild the counters, then accept the loss");
        goto out;
    }
    rc = resolve_claim(s, v, &p, rid, have_old ? old : NULL, val, ca.now_arg,
                       rc, admitted, &res, out);
out:
    reply_free(&b);
    for (int i = 0; i < 3; i++)
        if (rep[i])
            freeReplyObject(rep[i]);
    qg__rs_args_free(&get);
    qg__rs_args_free(&claim);
    qg__rs_args_free(&ev);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ------------------------------------------------------------- settle */

/* GET the index of rid into *q: 1 found, 0 none, or a negative error. */
static int index_get(redis_store *s, const char *rid, qg__rs_place *q)
{
    char idx[QG__RS_KEY_MAX];
    qg__rs_args a, *ap = &a;
    redisReply *r;
    int rc;
    qg__rs_key_index(rid, idx);
    qg__rs_args_init(&a);
    qg__rs_adds(&a, "GET");
    qg__rs_adds(&a, idx);
    rc = pipe_run(s, &ap, 1, &r);
    qg__rs_args_free(&a);
    if (rc != QG_OK)
        return rc;
    rc = r->type == REDIS_REPLY_STRING && qg__rs_index_parse(r->str, r->len, q) == 0;
    freeReplyObject(r);
    return rc;
}

static int r_settle(qg_store *st, const qg_store_settle *in,
                    qg_settle_result *out)
{
    redis_store *s = (redis_store *)st;
    qg__rs_version *v;
    qg__rs_place p;
    qg__rs_args a, *ap = &a;
    char rid[17];
    int rc, tried_index = 0;

    qg__rs_args_init(&a);
    pthread_mutex_lock(&s->mu);
    s->err[0] = 0;
    if (!(v = s->cur)) {
        rc = QG_ESTATE;
        set_err(s, "%s", "the Redis store has no rules version yet");
        goto out;
    }
    if (in->weight_milli > QG_REDIS_AMOUNT_MAX) {
        rc = QG_ERANGE;
        set_err(s, "%s", "a weight above 10^12 points is beyond what the "
                "Redis store counts exactly");
        goto out;
    }
    if ((rc = ensure_conn(s)) != QG_OK)
        goto out;
    qg__rs_hex_lo(in->rid, rid);
    if (in->has_member) {
        /* the subject's place now: its org's tag (one round trip) */
        qg__rs_place_of(in->member, in->has_org, in->org, &p);
    } else {
        tried_index = 1;
        if ((rc = index_get(s, rid, &p)) <= 0) {
            rc = rc == 0 ? QG_ENOTFOUND : rc;
            goto out;
        }
    }
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        redisReply *r;
        reply_buf b = {0};
        qg__rs_result res;
        qg__rs_args_reset(&a);
        qg__rs_eval_head(&a, v->sha, &p, rid);
        qg__rs_args_settle(&a, in, s->server_time ? 0 : in->now_ms, &p);
        if ((rc = eval_pipe(s, &ap, 1, &r, v->text, v->len)) != QG_OK ||
            (rc = reply_take(s, r, &b)) != QG_OK)
            goto out;
        qg__rs_decode_settle(b.it, b.n, out, &res);
        reply_free(&b);
        switch (res.kind) {
        case QG__RS_OK:
            rc = QG_OK;
            goto out;
        case QG__RS_EINVAL:
            rc = QG_EINVAL;
            goto out;
        case QG__RS_MOVED:
            p = res.moved;
            continue;
        case QG__RS_NOTFOUND: {
            qg__rs_place q;
            if (tried_index) {
                rc = QG_ENOTFOUND;
                goto out;
            }
            tried_index = 1;
            if ((rc = index_get(s, rid, &q)) <= 0) {
                rc = rc == 0 ? QG_ENOTFOUND : rc;
                goto out;
            }
            if (strcmp(q.tag, p.tag) == 0 && strcmp(q.member, p.member) == 0) {
                rc = QG_ENOTFOUND;
                goto out;
            }
            p = q;
            continue;
        }
        case QG__RS_LAYOUT:
            rc = QG_ESTATE;
            set_err(s, "%s", "the reservation's windows follow rules this "
                    "instance does not have");
            goto out;
        default:
            rc = QG_ESTORE;
            set_err(s, "%s", "unexpected reply from the Redis settle script");
            goto out;
        }
    }
    rc = QG_ESTORE;
    set_err(s, "%s", "the reservation kept moving");
out:
    qg__rs_args_free(&a);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* -------------------------------------------------------------- usage */

static int r_usage(qg_store *st, const qg_store_usage *in, qg_decision *out)
{
    redis_store *s = (redis_store *)st;
    qg__rs_version *v;
    qg__rs_place p;
    qg__rs_args a, *ap = &a;
    int64_t now_arg, pnow = in->now_ms;
    int rc;

    qg__rs_args_init(&a);
    pthread_mutex_lock(&s->mu);
    s->err[0] = 0;
    if ((rc = version_of(s, in->rules, &v)) != QG_OK ||
        (rc = ensure_conn(s)) != QG_OK)
        goto out;
    qg__rs_place_of(in->member, in->has_org && in->orgspec, in->org, &p);
    now_arg = s->server_time ? 0 : in->now_ms;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        redisReply *r;
        reply_buf b = {0};
        qg__rs_result res;
        qg__rs_args_reset(&a);
        qg__rs_eval_head(&a, v->sha, &p, "-");
        qg__rs_args_usage(&a, in, v, now_arg, pnow);
        if ((rc = eval_pipe(s, &ap, 1, &r, v->text, v->len)) != QG_OK ||
            (rc = reply_take(s, r, &b)) != QG_OK)
            goto out;
        qg__rs_decode_usage(b.it, b.n, v, out, &res);
        reply_free(&b);
        if (res.kind == QG__RS_OK)
            goto ok;
        if (res.kind != QG__RS_PERIOD) {
            rc = QG_ESTORE;
            set_err(s, "%s", "unexpected reply from the Redis usage script");
            goto out;
        }
        s->cnt.period_retries++;
        now_arg = res.raw_now;
        pnow = res.need_now;
    }
    rc = QG_ESTORE;
    set_err(s, "%s", "calendar periods did not settle");
    goto out;
ok:
    out->outcome = QG_NONE;
    out->binding = -1;
    rc = QG_OK;
out:
    qg__rs_args_free(&a);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ------------------------------------------------------------ restore */

static int r_restore(qg_store *st, const qg_store_restore *in)
{
    redis_store *s = (redis_store *)st;
    qg__rs_version *v;
    qg__rs_place p;
    qg__rs_args a, ix, *cmds[2];
    redisReply *rep[2] = {NULL, NULL};
    char rid[17], idx[QG__RS_KEY_MAX], val[65];
    int64_t pnow = in->at_ms;
    int rc;

    qg__rs_args_init(&a);
    qg__rs_args_init(&ix);
    pthread_mutex_lock(&s->mu);
    s->err[0] = 0;
    if ((rc = version_of(s, in->rules, &v)) != QG_OK)
        goto out;
    if (in->reserved_milli > QG_REDIS_AMOUNT_MAX ||
        in->charged_milli > QG_REDIS_AMOUNT_MAX ||
        in->headroom_milli > QG_REDIS_AMOUNT_MAX ||
        in->price_micro > QG_REDIS_MONEY_MAX ||
        in->cost_micro > QG_REDIS_MONEY_MAX) {
        rc = QG_ERANGE;
        set_err(s, "%s", "a restored amount beyond what the Redis store "
                "counts exactly");
        goto out;
    }
    if ((rc = ensure_conn(s)) != QG_OK)
        goto out;
    qg__rs_place_of(in->member, in->has_org && in->orgspec, in->org, &p);
    qg__rs_hex_lo(in->rid, rid);
    qg__rs_key_index(rid, idx);
    qg__rs_index_value(&p, val);
    if (!in->charge_only) {
        /* remembered under another tag: already restored */
        qg__rs_place q;
        rc = index_get(s, rid, &q);
        if (rc < 0)
            goto out;
        if (rc == 1 && strcmp(q.tag, p.tag) != 0) {
            char rk[QG__RS_KEY_MAX];
            qg__rs_args e, *ep = &e;
            redisReply *r;
            qg__rs_key_rec(q.tag, rid, rk);
            qg__rs_args_init(&e);
            qg__rs_adds(&e, "EXISTS");
            qg__rs_adds(&e, rk);
            rc = pipe_run(s, &ep, 1, &r);
            qg__rs_args_free(&e);
            if (rc != QG_OK)
                goto out;
            rc = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
            freeReplyObject(r);
            if (rc) {
                rc = QG_OK;
                goto out;
            }
        }
        qg__rs_adds(&ix, "SET");
        qg__rs_adds(&ix, idx);
        qg__rs_adds(&ix, val);
        qg__rs_adds(&ix, "PX");
        qg__rs_addi(&ix, rid_ttl(s, v));
    }
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        reply_buf b = {0};
        qg__rs_result res;
        int n = 1;
        qg__rs_args_reset(&a);
        qg__rs_eval_head(&a, v->sha, &p, rid);
        qg__rs_args_restore(&a, in, v, pnow, rid_ttl(s, v));
        cmds[0] = &a;
        if (!in->charge_only && attempt == 0) {
            cmds[1] = &a;
            cmds[0] = &ix;
            n = 2;
        }
        if ((rc = eval_pipe(s, cmds, n, rep, v->text, v->len)) != QG_OK)
            goto out;
        if (n == 2) {
            freeReplyObject(rep[0]);
            rep[0] = rep[1];
            rep[1] = NULL;
        }
        rc = reply_take(s, rep[0], &b);
        rep[0] = NULL;
        if (rc != QG_OK)
            goto out;
        qg__rs_decode_restore(b.it, b.n, &res);
        reply_free(&b);
        if (res.kind == QG__RS_OK) {
            rc = res.rc;
            goto out;
        }
        if (res.kind != QG__RS_PERIOD) {
            rc = QG_ESTORE;
            set_err(s, "%s", "unexpected reply from the Redis restore script");
            goto out;
        }
        s->cnt.period_retries++;
        pnow = res.need_now;
    }
    rc = QG_ESTORE;
    set_err(s, "%s", "calendar periods did not settle");
out:
    for (int i = 0; i < 2; i++)
        if (rep[i])
            freeReplyObject(rep[i]);
    qg__rs_args_free(&a);
    qg__rs_args_free(&ix);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* --------------------------------------------------------------- known */

static int r_known(qg_store *st, qg_key rid_key)
{
    redis_store *s = (redis_store *)st;
    qg__rs_place q;
    char rid[17], rk[QG__RS_KEY_MAX];
    int found = 0;

    pthread_mutex_lock(&s->mu);
    qg__rs_hex_lo(rid_key, rid);
    if (ensure_conn(s) == QG_OK && index_get(s, rid, &q) == 1) {
        qg__rs_args e, *ep = &e;
        redisReply *r;
        qg__rs_key_rec(q.tag, rid, rk);
        qg__rs_args_init(&e);
        qg__rs_adds(&e, "EXISTS");
        qg__rs_adds(&e, rk);
        if (pipe_run(s, &ep, 1, &r) == QG_OK) {
            found = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
            freeReplyObject(r);
        }
        qg__rs_args_free(&e);
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

static void r_stats(qg_store *st, qg_store_stats *out)
{
    (void)st;
    memset(out, 0, sizeof *out);
    out->backend = "redis";
}

static void r_free(qg_store *st)
{
    redis_store *s = (redis_store *)st;
    if (!s)
        return;
    if (s->c && !s->c->err)
        while (s->pending > 0) {
            void *r;
            if (redisGetReply(s->c, &r) != REDIS_OK)
                break;
            freeReplyObject(r);
            s->pending--;
        }
    drop_conn(s);
    while (s->versions) {
        qg__rs_version *v = s->versions;
        s->versions = v->next;
        qg__rs_version_free(v);
    }
    qg__tz_free(s->utc);
    free(s->password);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Reach the server (connecting when needed) and read its epoch: 0,
 * QG_ESTORE, or QG_ESTATE when the data set was lost. */
static int r_probe(qg_store *st)
{
    redis_store *s = (redis_store *)st;
    int rc;
    pthread_mutex_lock(&s->mu);
    if ((rc = ensure_conn(s)) == QG_OK && (rc = epoch_sync(s)) != QG_OK)
        drop_conn(s);
    if (rc == QG_OK && s->lost)
        rc = QG_ESTATE;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static const qg_store_methods redis_methods = {
    .api = QG_STORE_API,
    .name = "redis",
    .flags = QG_STORE_SHARED | QG_STORE_PERSISTENT,
    .check = r_check,
    .settle = r_settle,
    .usage = r_usage,
    .restore = r_restore,
    .known = r_known,
    .stats = r_stats,
    .free = r_free,
    .probe = r_probe,
};

/* ---------------------------------------------------------- public API */

/* "redis://HOST[:PORT][/DB]" */
static int parse_url(const char *url, redis_store *s, char *err, size_t cap)
{
    const char *p, *h, *colon, *slash;
    size_t hl;
    if (!url || strncmp(url, "redis://", 8) != 0) {
        snprintf(err, cap, "%s", "a Redis store URL is redis://HOST:PORT[/DB]");
        return -1;
    }
    h = url + 8;
    slash = strchr(h, '/');
    colon = memchr(h, ':', slash ? (size_t)(slash - h) : strlen(h));
    hl = colon ? (size_t)(colon - h) : slash ? (size_t)(slash - h) : strlen(h);
    if (hl == 0 || hl >= sizeof s->host) {
        snprintf(err, cap, "%s", "the Redis URL has no host (redis://HOST:PORT[/DB])");
        return -1;
    }
    memcpy(s->host, h, hl);
    s->host[hl] = 0;
    s->port = 6379;
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || port < 1 || port > 65535 ||
            (*end && *end != '/')) {
            snprintf(err, cap, "%s", "the Redis URL's port must be 1 to 65535");
            return -1;
        }
        s->port = (int)port;
    }
    if (slash) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (slash[1] == 0) {
            db = 0;
        } else if (end == slash + 1 || *end || db < 0 || db > 65535) {
            snprintf(err, cap, "%s", "the Redis URL's database must be a number");
            return -1;
        }
        s->db = (int)db;
    }
    for (p = s->host; *p; p++)
        if (*p == '@' || *p == ' ') {
            snprintf(err, cap, "%s", "the Redis URL takes no user or password "
                     "(QUOTAGATE_REDIS_PASSWORD)");
            return -1;
        }
    return 0;
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
    s->base.m = &redis_methods;
    pthread_mutex_init(&s->mu, NULL);
    if (parse_url(url, s, err, errcap) != 0)
        goto fail;
    s->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms
                                                 : DEFAULT_TIMEOUT_MS;
    s->server_time = opts ? opts->server_time != 0 : 1;
    s->rid_ttl_opt = opts ? opts->request_id_ttl_ms : 0;
    if ((pw && *pw && !(s->password = strdup(pw))) || !(s->utc = qg__tz_utc())) {
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
        if (version_of(s, opts->rules, &v) != QG_OK) {
            snprintf(err, errcap, "%s", s->err);
            goto fail;
        }
    }
    if (ensure_conn(s) != QG_OK) {
        snprintf(err, errcap, "%s", s->err);
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
    int lost;
    if (!s)
        return 0;
    pthread_mutex_lock(&s->mu);
    lost = s->lost;
    pthread_mutex_unlock(&s->mu);
    return lost;
}

int qg_store_redis_accept_loss(qg_store *st)
{
    redis_store *s = rs_of(st);
    int rc;
    if (!s)
        return QG_EINVAL;
    pthread_mutex_lock(&s->mu);
    rc = ensure_conn(s);
    if (rc == QG_OK) {
        s->have_epoch = 0;
        rc = epoch_sync(s) == QG_OK ? QG_OK : io_fail(s);
        if (rc == QG_OK)
            s->lost = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void qg_store_redis_counters(qg_store *st, qg_redis_counters *out)
{
    redis_store *s = rs_of(st);
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    *out = s->cnt;
    pthread_mutex_unlock(&s->mu);
}
