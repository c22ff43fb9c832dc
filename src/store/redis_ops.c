/* redis_ops.c - the Redis store's operations (check, settle, usage,
 * restore, known, probe), each a small state machine over the
 * asynchronous link of one lane (redis_store.h).
 *
 * An operation sends a step's commands at once (to one node, or to the
 * nodes of their keys' slots in a Cluster), waits for all their replies,
 * then takes the next step or ends: its done runs once, from the lane's
 * event loop.  Replies are copied (the link lends them only for the
 * callback).  A script call is an FCALL of the rules version's Function
 * library, or an EVALSHA of its script on a server without Functions.
 * "Function not found" or NOSCRIPT (a restart, FUNCTION FLUSH or SCRIPT
 * FLUSH, a failover to a node that never saw it) is answered here, under
 * the step: FUNCTION LOAD REPLACE or SCRIPT LOAD on the node that said
 * it, then the same call again.  An FCALL or FUNCTION LOAD the server
 * does not know or refuses (Redis < 7, a managed service's ACL) turns
 * the store to EVALSHA for good, and the call is sent again as one.
 *
 * Round trips (docs/redis-store.md), the same as the synchronous design:
 *  - check: one step.  GET qg:epoch (one node; a Cluster's epochs are the
 *    probe's), the request id's claim SET qg:rid:{RID} <tag+member> NX
 *    GET PX 30s, and EVALSHA, all at once.  The claim's old value says
 *    whether the id already belongs to another tag (another org's
 *    member): then, rarely, a lookup in that tag answers (a replay, or
 *    QG_EINVAL for another subject's id) and the admission the script
 *    made meanwhile is voided exactly (its undo log came back in the
 *    reply).  After an admission the claim is extended to the request-id
 *    TTL by a command nobody waits for.
 *  - settle: one when it names its subject, else two (GET the index,
 *    then EVALSHA).  usage: one.  restore: two.  known: one or two.
 * A calendar period the script did not get (a reset between C's instant
 * and Redis's) costs one more EVALSHA.
 *
 * Failures: a command the link could not get answered (refused, lost,
 * timed out) ends the operation with QG_ESTORE; whether a check that
 * timed out was applied is then unknown, which is why the keeper's
 * charge-back goes by request id (restore leaves a known id alone). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <event2/event.h>
#include "redis_cluster.h"
#include "redis_store.h"

/* ------------------------------------------------------------ replies */

/* An owned copy of one reply. */
typedef struct rep {
    int type;                  /* REDIS_REPLY_*; 0 none yet */
    long long integer;
    char *str;                 /* string, status, error (NUL-terminated) */
    size_t len;
    qg__rs_item *it;           /* a flat array: items, their strings in */
    int n;                     /* the same block */
    int bad;                   /* an array of another shape */
} rep;

static void rep_clear(rep *d)
{
    free(d->str);
    free(d->it);
    memset(d, 0, sizeof *d);
}

static int rep_take(rep *d, const redisReply *r)
{
    rep_clear(d);
    d->type = r->type;
    switch (r->type) {
    case REDIS_REPLY_INTEGER:
        d->integer = r->integer;
        return 0;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        if (!(d->str = malloc(r->len + 1)))
            return -1;
        memcpy(d->str, r->str, r->len);
        d->str[r->len] = 0;
        d->len = r->len;
        return 0;
    case REDIS_REPLY_ARRAY: {
        size_t bytes = 0;
        char *p;
        for (size_t i = 0; i < r->elements; i++) {
            const redisReply *e = r->element[i];
            if (e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS)
                bytes += e->len + 1;
            else if (e->type != REDIS_REPLY_INTEGER)
                d->bad = 1;
        }
        if (d->bad || r->elements == 0)
            return 0;
        if (!(d->it = calloc(1, r->elements * sizeof *d->it + bytes)))
            return -1;
        p = (char *)(d->it + r->elements);
        for (size_t i = 0; i < r->elements; i++) {
            const redisReply *e = r->element[i];
            if (e->type == REDIS_REPLY_INTEGER) {
                d->it[i].i = e->integer;
                continue;
            }
            memcpy(p, e->str, e->len);
            p[e->len] = 0;
            d->it[i].is_str = 1;
            d->it[i].s = p;
            d->it[i].len = e->len;
            p += e->len + 1;
        }
        d->n = (int)r->elements;
        return 0;
    }
    default:
        return 0;
    }
}

/* ---------------------------------------------------------- operations */

typedef struct op op;

/* One awaited command of a step. */
typedef struct wait {
    op *o;
    int slot;
    qg__rs_args *cmd;          /* sent again after a load */
    const char *text;          /* the script it runs (NULL: not a script) */
    size_t len;
    const qg__rs_version *v;   /* a rules version's call (FCALL or
                                  EVALSHA), else NULL */
    int loads;
} wait;

/* A step: QG_PENDING (it sent commands and waits), or the final code. */
typedef int (*step_fn)(op *o);

struct op {
    qg_store_lane *l;
    redis_store *s;
    step_fn step;
    void (*fini)(op *o);       /* frees the kind's own */
    qg_store_done done;
    void *ud;
    int waiting;               /* replies outstanding */
    int failed;                /* an awaited command was not answered */
    int stage, attempt;
    rep *r;                    /* per slot */
    wait *w;
    int nslot;
    rep r_in[QG__RS_SLOTS];
    wait w_in[QG__RS_SLOTS];
    char err[256];
};

static void op_err(op *o, const char *fmt, const char *a)
{
    if (!o->err[0])
        snprintf(o->err, sizeof o->err, fmt, a ? a : "");
}

static void op_init(op *o, qg_store_lane *l, step_fn step,
                    void (*fini)(op *), qg_store_done done, void *ud)
{
    o->l = l;
    o->s = l->s;
    o->step = step;
    o->fini = fini;
    o->done = done;
    o->ud = ud;
    o->r = o->r_in;
    o->w = o->w_in;
    o->nslot = QG__RS_SLOTS;
}

static void op_free(op *o)
{
    for (int i = 0; i < o->nslot; i++)
        rep_clear(&o->r[i]);
    if (o->r != o->r_in) {
        free(o->r);
        free(o->w);
    }
    if (o->fini)
        o->fini(o);
    free(o);
}

static void op_finish(op *o, int rc)
{
    qg_store_done done = o->done;
    void *ud = o->ud;
    if (rc != QG_OK && o->err[0]) {
        pthread_mutex_lock(&o->s->mu);
        snprintf(o->s->err, sizeof o->s->err, "%s", o->err);
        pthread_mutex_unlock(&o->s->mu);
    }
    o->l->ops--;
    op_free(o);
    done(ud, rc);
}

/* Start an operation: its first step, which either sends (QG_PENDING)
 * or ends at once (the op is freed, done not called). */
static int op_start(op *o)
{
    int rc = o->step(o);
    if (rc == QG_PENDING) {
        o->l->ops++;
        return QG_PENDING;
    }
    if (rc != QG_OK && o->err[0])
        qg__rs_set_err(o->s, "%s", o->err);
    op_free(o);
    return rc;
}

/* Every reply of the step is in: the next step, or the end. */
static void op_advance(op *o)
{
    int rc = o->step(o);
    if (rc != QG_PENDING)
        op_finish(o, rc);
}

static int is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->len >= 8 &&
           strncmp(r->str, "NOSCRIPT", 8) == 0;
}

static int is_nofunction(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR &&
           strstr(r->str, "Function not found") != NULL;
}

/* An error saying the server has no such command, or this client may
 * not run it. */
static int is_unsupported(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR &&
           (strncmp(r->str, "ERR unknown command", 19) == 0 ||
            strncmp(r->str, "ERR unknown subcommand", 22) == 0 ||
            strncmp(r->str, "NOPERM", 6) == 0);
}

static int is_fcall(const qg__rs_args *a)
{
    return a->argc > 1 && a->len[0] == 5 && memcmp(a->argv[0], "FCALL", 5) == 0;
}

/* The key a command is routed by: a script call's first key, else
 * argv[1]. */
static void route_key(const qg__rs_args *a, const char **key, size_t *len)
{
    int i = a->argc >= 4 && ((a->len[0] == 7 &&
                              memcmp(a->argv[0], "EVALSHA", 7) == 0) ||
                             is_fcall(a)) ? 3 : 1;
    *key = a->argc > i ? a->argv[i] : NULL;
    *len = a->argc > i ? a->len[i] : 0;
}

static void on_reply(void *ud, const redisReply *reply, int rc);
static void ignored(void *ud, const redisReply *reply, int rc);

static int resend(op *o, wait *w)
{
    const char *key;
    size_t klen;
    route_key(w->cmd, &key, &klen);
    return qg__rlink_command(o->l->link, key, klen, w->cmd->argc,
                             (const char **)w->cmd->argv, w->cmd->len,
                             on_reply, w);
}

static void slot_failed(op *o, const char *why)
{
    o->failed = 1;
    op_err(o, "Redis: %s", why && *why ? why : "no answer");
}

/* The store has no Functions: w's call, an FCALL, becomes an EVALSHA of
 * the same script and arguments, sent again (its NOSCRIPT then loads the
 * script).  0, or -1 when it could not be sent. */
static int to_evalsha(op *o, wait *w)
{
    __atomic_store_n(&o->s->no_fcall, 1, __ATOMIC_RELEASE);
    qg__rs_args_to_evalsha(w->cmd, w->v);
    if (w->cmd->failed || resend(o, w) != 0)
        return -1;
    w->loads++;
    QG__RS_COUNT(o->s, commands, 1);
    return 0;
}

/* The lane's entry for (node, sha), or NULL. */
static qg__rs_load *load_find(qg_store_lane *l, const char *node,
                              const char *sha)
{
    for (int i = 0; i < QG__RS_LOADS; i++)
        if (l->loads[i].pending >= 0 && strcmp(l->loads[i].sha, sha) == 0 &&
            strcmp(l->loads[i].node, node) == 0)
            return &l->loads[i];
    return NULL;
}

static qg__rs_load *load_note(qg_store_lane *l, const char *node,
                              const char *sha)
{
    qg__rs_load *e = load_find(l, node, sha);
    if (!e) {
        e = &l->loads[l->next_load];
        l->next_load = (l->next_load + 1) % QG__RS_LOADS;
        snprintf(e->node, sizeof e->node, "%s", node);
        snprintf(e->sha, sizeof e->sha, "%s", sha);
    }
    e->pending = 1;
    return e;
}

/* The name a script call calls (its argv[1]: a SHA1, or an FCALL's
 * function), NUL-terminated into out. */
static void sha_of(const qg__rs_args *a, char out[QG__RS_NAME_MAX])
{
    size_t n = a->argc > 1 && a->len[1] < QG__RS_NAME_MAX ? a->len[1] : 0;
    memcpy(out, n ? a->argv[1] : "", n);
    out[n] = 0;
}

/* The wall clock in ms: the instant a library load records, compared
 * with other instances' (a day of slack makes their skew irrelevant). */
static int64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* v's Function library with now written in as its load instant: a copy
 * (fn_len bytes) the caller frees, or NULL. */
static char *stamped(const qg__rs_version *v, int64_t now)
{
    char digits[32], *t = malloc(v->fn_len ? v->fn_len : 1);
    if (!t)
        return NULL;
    memcpy(t, v->fn_text, v->fn_len);
    snprintf(digits, sizeof digits, "%013lld", (long long)now);
    if (strlen(digits) == 13 && v->fn_stamp + 13 <= v->fn_len)
        memcpy(t + v->fn_stamp, digits, 13);
    return t;
}

/* -------------------------------------------------- old libraries
 *
 * Every rules version is a library of its own (redis_script.c), so a
 * deployment that reloads its rules would pile them up on every node.
 * After a library is loaded at a node, that node's list of libraries is
 * read (FUNCTION LIST LIBRARYNAME qg_*) and every other one of ours
 * (qg_ and 40 hex digits) whose load instant is older than the store's
 * lib_keep_ms, or that records none (an older quotagate's), is deleted.
 * Deleting a library an instance still runs is safe: its next call gets
 * "Function not found" and loads it again (with a fresh instant), so
 * the ones in use stay, at the cost of one load a day. */
typedef struct prune_job {
    qg_store_lane *l;
    char node[QG__RLINK_ADDR_MAX];
    char keep[QG__RS_NAME_MAX];  /* the library just loaded */
    int64_t now;
} prune_job;

static int is_ours(const char *name, size_t len)
{
    if (len != 43 || memcmp(name, "qg_", 3) != 0)
        return 0;
    for (size_t i = 3; i < len; i++)
        if (!((name[i] >= '0' && name[i] <= '9') ||
              (name[i] >= 'a' && name[i] <= 'f')))
            return 0;
    return 1;
}

/* The value after key in a flat key/value array, or NULL. */
static const redisReply *field(const redisReply *a, const char *key)
{
    if (!a || a->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < a->elements; i += 2) {
        const redisReply *k = a->element[i];
        if ((k->type == REDIS_REPLY_STRING || k->type == REDIS_REPLY_STATUS) &&
            strcmp(k->str, key) == 0)
            return a->element[i + 1];
    }
    return NULL;
}

/* A library's load instant from its functions' description; -1 none. */
static int64_t loaded_at(const redisReply *lib)
{
    const redisReply *fns = field(lib, "functions");
    size_t plen = strlen(QG__RS_STAMP_PREFIX);
    if (!fns || fns->type != REDIS_REPLY_ARRAY)
        return -1;
    for (size_t i = 0; i < fns->elements; i++) {
        const redisReply *d = field(fns->element[i], "description");
        char *end;
        long long t;
        if (!d || d->type != REDIS_REPLY_STRING || d->len != plen + 13 ||
            memcmp(d->str, QG__RS_STAMP_PREFIX, plen) != 0)
            continue;
        t = strtoll(d->str + plen, &end, 10);
        if (*end == 0 && t >= 0)
            return t;
    }
    return -1;
}

static void on_listed(void *ud, const redisReply *reply, int rc)
{
    prune_job *j = ud;
    if (rc == 0 && reply->type == REDIS_REPLY_ARRAY) {
        redis_store *s = j->l->s;
        for (size_t i = 0; i < reply->elements; i++) {
            const redisReply *lib = reply->element[i];
            const redisReply *name = field(lib, "library_name");
            const char *argv[3] = {"FUNCTION", "DELETE", NULL};
            size_t lens[3] = {8, 6, 0};
            int64_t t;
            if (!name || name->type != REDIS_REPLY_STRING ||
                !is_ours(name->str, name->len) ||
                strcmp(name->str, j->keep) == 0)
                continue;
            t = loaded_at(lib);
            if (t >= 0 && t > j->now - s->lib_keep_ms)
                continue;
            argv[2] = name->str;
            lens[2] = name->len;
            if (qg__rlink_command_at(j->l->link, j->node, 3, argv, lens,
                                     ignored, NULL) == 0) {
                QG__RS_COUNT(s, commands, 1);
                QG__RS_COUNT(s, libraries_deleted, 1);
            }
        }
    }
    free(j);
}

/* After library keep was loaded at node: delete the stale others. */
static void prune_libraries(qg_store_lane *l, const char *node,
                            const char *keep)
{
    const char *argv[4] = {"FUNCTION", "LIST", "LIBRARYNAME", "qg_*"};
    prune_job *j;
    if (l->s->lib_keep_ms < 0 || !(j = calloc(1, sizeof *j)))
        return;
    j->l = l;
    j->now = wall_ms();
    snprintf(j->node, sizeof j->node, "%s", node);
    snprintf(j->keep, sizeof j->keep, "%s", keep);
    if (qg__rlink_command_at(l->link, node, 4, argv, NULL, on_listed, j) != 0)
        free(j);
    else
        QG__RS_COUNT(l->s, commands, 1);
}

static void on_loaded(void *ud, const redisReply *reply, int rc)
{
    wait *w = ud;
    op *o = w->o;
    const char *node = qg__rlink_reply_node(o->l->link);
    char sha[QG__RS_NAME_MAX];
    qg__rs_load *e;
    sha_of(w->cmd, sha);
    if (node && (e = load_find(o->l, node, sha)))
        e->pending = rc < 0 || reply->type == REDIS_REPLY_ERROR ? -1 : 0;
    if (rc == 0 && node && w->v && is_fcall(w->cmd) &&
        reply->type != REDIS_REPLY_ERROR)
        prune_libraries(o->l, node, sha);
    if (rc == 0 && w->v && is_fcall(w->cmd) && is_unsupported(reply)) {
        /* FUNCTION LOAD unknown or not allowed: EVALSHA from now on */
        if (to_evalsha(o, w) == 0)
            return;
        slot_failed(o, "cannot send the command again");
    } else if (rc < 0) {
        slot_failed(o, qg__rlink_last_error(o->l->link));
    } else if (reply->type == REDIS_REPLY_ERROR) {
        o->failed = 1;
        op_err(o, "Redis refused the script: %s", reply->str);
    } else if (resend(o, w) == 0) {
        QG__RS_COUNT(o->s, commands, 1);
        return;                /* its reply comes to on_reply */
    } else {
        slot_failed(o, "cannot send the command again");
    }
    if (--o->waiting == 0)
        op_advance(o);
}

static void on_reply(void *ud, const redisReply *reply, int rc)
{
    wait *w = ud;
    op *o = w->o;
    int fn = w->v && is_fcall(w->cmd);
    if (rc == 0 && fn && is_unsupported(reply) && w->loads < 3) {
        /* no FCALL here (Redis < 7), or not for this client */
        if (to_evalsha(o, w) == 0)
            return;
    }
    if (rc == 0 && w->text && (fn ? is_nofunction(reply) : is_noscript(reply)) &&
        w->loads < 3) {
        /* the node does not have the library or the script: load it
         * there (unless this lane's load is already on its way), then the
         * command again */
        const char *node = qg__rlink_reply_node(o->l->link);
        const char *sargv[3] = {"SCRIPT", "LOAD", w->text};
        size_t slens[3] = {6, 4, w->len};
        const char *fargv[4] = {"FUNCTION", "LOAD", "REPLACE", ""};
        size_t flens[4] = {8, 4, 7, fn ? w->v->fn_len : 0};
        char *text = NULL;
        qg__rs_load *e;
        char sha[QG__RS_NAME_MAX];
        int sent;
        sha_of(w->cmd, sha);
        if (node && (e = load_find(o->l, node, sha)) && e->pending == 1 &&
            resend(o, w) == 0) {
            w->loads++;
            QG__RS_COUNT(o->s, commands, 1);
            return;
        }
        if (fn && node && (text = stamped(w->v, wall_ms())) != NULL)
            fargv[3] = text;   /* the link copies the command */
        sent = node && (!fn || text) &&
               qg__rlink_command_at(o->l->link, node, fn ? 4 : 3,
                                    fn ? fargv : sargv, fn ? flens : slens,
                                    on_loaded, w) == 0;
        free(text);
        if (sent) {
            load_note(o->l, node, sha);
            w->loads++;
            QG__RS_COUNT(o->s, script_loads, 1);
            QG__RS_COUNT(o->s, commands, 1);
            return;
        }
    }
    if (rc < 0)
        slot_failed(o, qg__rlink_last_error(o->l->link));
    else if (rep_take(&o->r[w->slot], reply) != 0)
        slot_failed(o, "out of memory");
    if (--o->waiting == 0)
        op_advance(o);
}

/* Send a command of the step into slot (its reply lands in o->r[slot]);
 * text: the script an EVALSHA runs; v: the rules version a script call
 * (FCALL or EVALSHA) is of.  A command that cannot be sent marks the step
 * failed. */
static void op_send_v(op *o, int slot, qg__rs_args *a, const char *text,
                      size_t len, const qg__rs_version *v)
{
    wait *w = &o->w[slot];
    const char *key;
    size_t klen;
    int rc;
    rep_clear(&o->r[slot]);
    if (a->failed) {
        o->failed = 1;
        op_err(o, "%s", "a Redis command too large to build");
        return;
    }
    w->o = o;
    w->slot = slot;
    w->cmd = a;
    w->text = text;
    w->len = len;
    w->v = v;
    w->loads = 0;
    route_key(a, &key, &klen);
    rc = qg__rlink_command(o->l->link, key, klen, a->argc,
                           (const char **)a->argv, a->len, on_reply, w);
    if (rc != 0) {
        o->failed = 1;
        op_err(o, "%s", rc == QG_EFULL ? "too many Redis commands in flight"
                                       : "cannot send a Redis command");
        return;
    }
    o->waiting++;
    QG__RS_COUNT(o->s, commands, 1);
}

static void op_send(op *o, int slot, qg__rs_args *a, const char *text,
                    size_t len)
{
    op_send_v(o, slot, a, text, len, NULL);
}

/* A call of rules version v's script (its head by eval_args). */
static void op_send_script(op *o, int slot, qg__rs_args *a,
                           const qg__rs_version *v)
{
    op_send_v(o, slot, a, v->text, v->len, v);
}

/* After a step's sends: wait for them (one round trip), or fail now. */
static int op_wait(op *o)
{
    if (o->waiting == 0)
        return QG_ESTORE;
    QG__RS_COUNT(o->s, round_trips, 1);
    return QG_PENDING;
}

static void ignored(void *ud, const redisReply *reply, int rc)
{
    (void)ud;
    (void)reply;
    (void)rc;
}

/* A command nobody waits for (written with the step's, read later). */
static void op_fire(op *o, const qg__rs_args *a)
{
    const char *key;
    size_t klen;
    route_key(a, &key, &klen);
    if (!a->failed &&
        qg__rlink_command(o->l->link, key, klen, a->argc,
                          (const char **)a->argv, a->len, ignored, NULL) == 0)
        QG__RS_COUNT(o->s, commands, 1);
}

/* The slot's reply as script items; NULL (the reason in o->err) for an
 * error reply or another shape. */
static const qg__rs_item *items(op *o, int slot, int *n)
{
    const rep *r = &o->r[slot];
    if (r->type == REDIS_REPLY_ERROR) {
        op_err(o, "Redis script error: %s", r->str);
        return NULL;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->bad || !r->it) {
        op_err(o, "%s", "unexpected reply from the Redis script");
        return NULL;
    }
    *n = r->n;
    return r->it;
}

/* A script call's head: FCALL of v's library unless the store found it
 * has no Functions, then EVALSHA. */
static void eval_args(redis_store *s, qg__rs_args *a, const qg__rs_version *v,
                      const qg__rs_place *p, const char *rid)
{
    qg__rs_args_reset(a);
    qg__rs_eval_head(a, v, !__atomic_load_n(&s->no_fcall, __ATOMIC_ACQUIRE),
                     p, rid);
}

/* The current rules version (settle: the latest used). */
static int version(op *o, const qg_rules *rules, qg__rs_version **v)
{
    redis_store *s = o->s;
    int rc = QG_OK;
    pthread_mutex_lock(&s->mu);
    if (rules)
        rc = qg__rs_version_of(s, rules, v);
    else if (!(*v = s->cur)) {
        rc = QG_ESTATE;
        qg__rs_set_err(s, "%s", "the Redis store has no rules version yet");
    }
    if (rc != QG_OK)
        snprintf(o->err, sizeof o->err, "%s", s->err);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int is_lost(redis_store *s)
{
    return __atomic_load_n(&s->lost, __ATOMIC_ACQUIRE);
}

static const char lost_msg[] = "the Redis store lost its data (qg:epoch "
                               "changed): rebuild the counters, then accept "
                               "the loss";

/* -------------------------------------------------------------- check */

enum { CK_FIRST, CK_EVAL, CK_LOOKUP, CK_VOID, CK_CAS, CK_LOSTVOID };
enum { SL_EVAL, SL_CLAIM, SL_EPOCH, SL_AUX };

typedef struct check_op {
    op o;
    qg_store_check in;
    qg_decision *out;
    qg__rs_version *v;
    qg__rs_check_args ca;
    qg__rs_place p, q;
    qg__rs_result res;
    qg__rs_args get, claim, ev, aux;
    char rid[17], idx[QG__RS_KEY_MAX], val[65], old[65];
    int have_old, claim_failed, admitted, rc;
    qg_decision *other;        /* the lookup's answer (a rare path: 4 KB
                                  not zeroed at every check) */
    int kind;
} check_op;

static void check_fini(op *o)
{
    check_op *c = (check_op *)o;
    qg__rs_args_free(&c->get);
    qg__rs_args_free(&c->claim);
    qg__rs_args_free(&c->ev);
    qg__rs_args_free(&c->aux);
    free(c->other);
}

/* Extend the index key to the request-id TTL, or (val) write it. */
/* The places of recent admissions (redis_store.h, QG__RS_PLACES). */
static qg__rs_placed *placed_slot(redis_store *s, qg_key rid)
{
    return &s->placed[(rid.lo ^ rid.hi) & (QG__RS_PLACES - 1)];
}

static void placed_put(redis_store *s, qg_key rid, const qg__rs_place *p)
{
    qg__rs_placed *e = placed_slot(s, rid);
    pthread_mutex_lock(&s->placed_mu);
    e->rid = rid;
    e->p = *p;
    e->used = 1;
    pthread_mutex_unlock(&s->placed_mu);
}

/* 1 and *p when rid's place is remembered (the entry is forgotten). */
static int placed_take(redis_store *s, qg_key rid, qg__rs_place *p)
{
    qg__rs_placed *e = placed_slot(s, rid);
    int found;
    pthread_mutex_lock(&s->placed_mu);
    found = e->used && e->rid.lo == rid.lo && e->rid.hi == rid.hi;
    if (found) {
        *p = e->p;
        e->used = 0;
    }
    pthread_mutex_unlock(&s->placed_mu);
    return found;
}

static void index_keep(check_op *c, const char *val)
{
    placed_put(c->o.s, c->in.rid, &c->p);
    qg__rs_args a;
    qg__rs_args_init(&a);
    qg__rs_adds(&a, val ? "SET" : "PEXPIRE");
    qg__rs_adds(&a, c->idx);
    if (val) {
        qg__rs_adds(&a, val);
        qg__rs_adds(&a, "PX");
    }
    qg__rs_addi(&a, qg__rs_rid_ttl(c->o.s, c->v));
    op_fire(&c->o, &a);
    qg__rs_args_free(&a);
}

static void send_eval(check_op *c)
{
    eval_args(c->o.s, &c->ev, c->v, &c->p, c->rid);
    qg__rs_args_check(&c->ev, &c->ca);
    op_send_script(&c->o, SL_EVAL, &c->ev, c->v);
}

/* Take back the admission (its undo log points into the eval's reply). */
static int send_void(check_op *c, int stage)
{
    eval_args(c->o.s, &c->aux, c->v, &c->p, c->rid);
    qg__rs_args_void(&c->aux, &c->res, c->rid);
    c->o.stage = stage;
    op_send_script(&c->o, SL_AUX, &c->aux, c->v);
    return op_wait(&c->o);
}

static int check_first(check_op *c)
{
    op *o = &c->o;
    redis_store *s = o->s;
    if (o->r[SL_EVAL].type == 0)
        return QG_ESTORE;      /* not answered: nothing is known */
    if (!s->cluster && o->r[SL_EPOCH].type != 0) {
        const rep *e = &o->r[SL_EPOCH];
        int lost;
        pthread_mutex_lock(&s->mu);
        lost = !s->have_epoch || e->type != REDIS_REPLY_STRING ||
               strcmp(e->str, s->epoch) != 0;
        if (lost)
            __atomic_store_n(&s->lost, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&s->mu);
    }
    if (o->r[SL_CLAIM].type == REDIS_REPLY_STRING &&
        o->r[SL_CLAIM].len == 64) {
        memcpy(c->old, o->r[SL_CLAIM].str, 65);
        c->have_old = 1;
    } else if (o->r[SL_CLAIM].type == 0 ||
               o->r[SL_CLAIM].type == REDIS_REPLY_ERROR) {
        c->claim_failed = 1;   /* the index is written after admission */
    }
    o->failed = 0;
    return QG_OK;
}

/* What the claim said means for an answered check (CK_EVAL's end). */
static int check_resolve(check_op *c)
{
    if (is_lost(c->o.s)) {
        op_err(&c->o, "%s", lost_msg);
        if (c->admitted)
            return send_void(c, CK_LOSTVOID);
        return QG_ESTATE;
    }
    if (c->have_old && qg__rs_index_parse(c->old, 64, &c->q) == 0) {
        if (strcmp(c->q.tag, c->p.tag) != 0 && c->res.has_undo) {
            /* the id was claimed under another tag: its record decides,
             * and what this check changed here is taken back (the memory
             * store would not have looked at these entities at all) */
            eval_args(c->o.s, &c->aux, c->v, &c->q, c->rid);
            qg__rs_args_lookup(&c->aux, c->ca.now_arg, c->p.member);
            c->o.stage = CK_LOOKUP;
            op_send_script(&c->o, SL_AUX, &c->aux, c->v);
            return op_wait(&c->o);
        }
        if (c->admitted && strcmp(c->q.member, c->p.member) != 0) {
            /* another member's stale claim in this tag: the id is ours */
            index_keep(c, c->val);
            return c->rc;
        }
    }
    if (c->admitted)
        index_keep(c, c->claim_failed ? c->val : NULL);
    return c->rc;
}

static int check_eval(check_op *c)
{
    op *o = &c->o;
    const qg__rs_item *it;
    int n;
    if (o->failed)
        return QG_ESTORE;
    if (!(it = items(o, SL_EVAL, &n)))
        return QG_ESTORE;
    qg__rs_decode_check(it, n, c->v, c->out, &c->res);
    if (c->res.kind == QG__RS_PERIOD) {
        /* a reset between C's instant and the script's: periods for the
         * script's instant, decided at it */
        QG__RS_COUNT(o->s, period_retries, 1);
        if (++o->attempt >= QG__RS_ATTEMPTS) {
            op_err(o, "%s", "calendar periods did not settle");
            return QG_ESTORE;
        }
        c->ca.now_arg = c->res.raw_now;
        c->ca.pnow = c->res.need_now;
        c->ca.check_cap = 0;
        if (c->in.payg_mask) {
            qg_calendar_spec cs = {QG_EVERY_MONTH, 0, 1, 0, 1, o->s->utc};
            if (qg__calendar_period(&cs, c->in.anchor_ms, c->res.raw_now,
                                    &c->ca.cap_start, &c->ca.cap_end) != 0) {
                c->ca.cap_start = 0;
                c->ca.cap_end = INT64_MAX;
            }
        }
        o->stage = CK_EVAL;
        send_eval(c);
        return op_wait(o);
    }
    switch (c->res.kind) {
    case QG__RS_OK:
        c->rc = QG_OK;
        c->admitted = c->out->outcome == QG_ALLOW && !c->out->replayed;
        break;
    case QG__RS_EINVAL:
        c->rc = QG_EINVAL;
        break;
    case QG__RS_ERR:
        c->rc = c->res.rc;
        break;
    default:
        op_err(o, "%s", "unexpected reply from the Redis check script");
        return QG_ESTORE;
    }
    return check_resolve(c);
}

static int check_lookup(check_op *c)
{
    op *o = &c->o;
    const qg__rs_item *it;
    qg__rs_result res;
    int n;
    if (o->failed || !(it = items(o, SL_AUX, &n))) {
        o->failed = 0;
        c->rc = QG_ESTORE;
        return send_void(c, CK_VOID);
    }
    QG__RS_COUNT(o->s, lookups, 1);
    if (!c->other && !(c->other = malloc(sizeof *c->other))) {
        c->rc = QG_ENOMEM;
        return send_void(c, CK_VOID);
    }
    memset(c->other, 0, sizeof *c->other);
    qg__rs_decode_check(it, n, c->v, c->other, &res);
    c->kind = res.kind;
    if (res.kind == QG__RS_BAD) {
        op_err(o, "%s", "a request id recorded under another org could not "
               "be replayed");
        c->rc = QG_ESTORE;
        return send_void(c, CK_VOID);
    }
    if (res.kind != QG__RS_ABSENT) {
        c->rc = res.kind == QG__RS_EINVAL ? QG_EINVAL : QG_OK;
        return send_void(c, CK_VOID);
    }
    {
        /* a stale claim (a refusal's, or an expired record's) */
        size_t len;
        const char *text = qg__rs_claim_text(&len);
        qg__rs_args_reset(&c->aux);
        qg__rs_adds(&c->aux, "EVALSHA");
        qg__rs_adds(&c->aux, o->s->claim_sha);
        qg__rs_addi(&c->aux, 1);
        qg__rs_adds(&c->aux, c->idx);
        qg__rs_adds(&c->aux, c->old);
        qg__rs_adds(&c->aux, c->val);
        qg__rs_addi(&c->aux, c->admitted ? qg__rs_rid_ttl(o->s, c->v)
                                         : QG__RS_CLAIM_TTL_MS);
        o->stage = CK_CAS;
        op_send(o, SL_AUX, &c->aux, text, len);
        return op_wait(o) == QG_PENDING ? QG_PENDING : c->rc;
    }
}

static int check_voided(check_op *c)
{
    op *o = &c->o;
    const rep *r = &o->r[SL_AUX];
    if (o->failed || r->type == REDIS_REPLY_ERROR) {
        op_err(o, "Redis void failed: %s", r->str ? r->str : "no answer");
        return c->o.stage == CK_LOSTVOID ? QG_ESTATE : QG_ESTORE;
    }
    QG__RS_COUNT(o->s, voids, 1);
    if (r->it && r->n == 2 && !r->it[1].is_str && r->it[1].i == 2)
        QG__RS_COUNT(o->s, void_rollbacks, 1);
    if (o->stage == CK_LOSTVOID)
        return QG_ESTATE;
    if (c->rc == QG_OK && c->kind != QG__RS_ABSENT)
        *c->out = *c->other;
    return c->rc;
}

static int check_step(op *o)
{
    check_op *c = (check_op *)o;
    switch (o->stage) {
    case CK_FIRST:
        check_first(c);
        return check_eval(c);
    case CK_EVAL:
        return check_eval(c);
    case CK_LOOKUP:
        return check_lookup(c);
    case CK_VOID:
    case CK_LOSTVOID:
        return check_voided(c);
    case CK_CAS:
    default:
        return c->rc;
    }
}

/* The first step: epoch, claim and script at once. */
static int check_begin(op *o)
{
    check_op *c = (check_op *)o;
    redis_store *s = o->s;
    char ttl[24];
    int rc;
    o->step = check_step;
    if ((rc = version(o, c->in.rules, &c->v)) != QG_OK)
        return rc;
    if (c->in.weight_milli > QG_REDIS_AMOUNT_MAX) {
        op_err(o, "%s", "a weight above 10^12 points is beyond what the "
               "Redis store counts exactly");
        return QG_ERANGE;
    }
    if (is_lost(s)) {
        op_err(o, "%s", lost_msg);
        return QG_ESTATE;
    }
    qg__rs_place_of(c->in.member, c->in.has_org && c->in.orgspec, c->in.org,
                    &c->p);
    qg__rs_hex_lo(c->in.rid, c->rid);
    qg__rs_key_index(c->rid, c->idx);
    qg__rs_index_value(&c->p, c->val);
    c->ca.in = &c->in;
    c->ca.ver = c->v;
    c->ca.now_arg = s->server_time ? 0 : c->in.now_ms;
    c->ca.pnow = c->in.now_ms;
    c->ca.cap_start = c->in.payg_mask ? c->in.cap_start_ms : 0;
    c->ca.cap_end = c->in.payg_mask ? c->in.cap_end_ms : 0;
    c->ca.check_cap = s->server_time;
    c->ca.rid_ttl_ms = qg__rs_rid_ttl(s, c->v);
    snprintf(ttl, sizeof ttl, "%d", QG__RS_CLAIM_TTL_MS);
    if (!s->cluster) {
        qg__rs_adds(&c->get, "GET");
        qg__rs_adds(&c->get, QG__RS_KEY_EPOCH);
        op_send(o, SL_EPOCH, &c->get, NULL, 0);
    }
    qg__rs_adds(&c->claim, "SET");
    qg__rs_adds(&c->claim, c->idx);
    qg__rs_adds(&c->claim, c->val);
    qg__rs_adds(&c->claim, "NX");
    qg__rs_adds(&c->claim, "GET");
    qg__rs_adds(&c->claim, "PX");
    qg__rs_adds(&c->claim, ttl);
    op_send(o, SL_CLAIM, &c->claim, NULL, 0);
    send_eval(c);              /* one unsent: the others' replies end it */
    o->stage = CK_FIRST;
    return op_wait(o);
}

int qg__rs_op_check(qg_store_lane *l, const qg_store_check *in,
                    qg_decision *out, qg_store_done done, void *ud)
{
    check_op *c = calloc(1, sizeof *c);
    if (!c)
        return QG_ENOMEM;
    op_init(&c->o, l, check_begin, check_fini, done, ud);
    c->in = *in;
    c->in.hint = NULL;
    c->in.org_hint = NULL;
    c->out = out;
    qg__rs_args_init(&c->get);
    qg__rs_args_init(&c->claim);
    qg__rs_args_init(&c->ev);
    qg__rs_args_init(&c->aux);
    return op_start(&c->o);
}

/* ------------------------------------------------------------- settle */

enum { ST_INDEX, ST_EVAL };

typedef struct settle_op {
    op o;
    qg_store_settle in;
    qg_settle_result *out;
    qg__rs_version *v;
    qg__rs_place p;
    qg__rs_args a, g;
    char rid[17];
    int tried_index, after_notfound;
} settle_op;

static void settle_fini(op *o)
{
    settle_op *t = (settle_op *)o;
    qg__rs_args_free(&t->a);
    qg__rs_args_free(&t->g);
}

static int settle_send_index(settle_op *t)
{
    char idx[QG__RS_KEY_MAX];
    qg__rs_key_index(t->rid, idx);
    t->tried_index = 1;
    qg__rs_args_reset(&t->g);
    qg__rs_adds(&t->g, "GET");
    qg__rs_adds(&t->g, idx);
    t->o.stage = ST_INDEX;
    op_send(&t->o, 1, &t->g, NULL, 0);
    return op_wait(&t->o);
}

static int settle_send_eval(settle_op *t)
{
    eval_args(t->o.s, &t->a, t->v, &t->p, t->rid);
    qg__rs_args_settle(&t->a, &t->in, t->o.s->server_time ? 0 : t->in.now_ms,
                       &t->p);
    t->o.stage = ST_EVAL;
    op_send_script(&t->o, 0, &t->a, t->v);
    return op_wait(&t->o);
}

static int settle_step(op *o)
{
    settle_op *t = (settle_op *)o;
    const qg__rs_item *it;
    qg__rs_result res;
    int n;
    if (o->failed)
        return QG_ESTORE;
    if (o->stage == ST_INDEX) {
        const rep *r = &o->r[1];
        qg__rs_place q;
        if (r->type != REDIS_REPLY_STRING ||
            qg__rs_index_parse(r->str, r->len, &q) != 0)
            return QG_ENOTFOUND;
        if (t->after_notfound && strcmp(q.tag, t->p.tag) == 0 &&
            strcmp(q.member, t->p.member) == 0)
            return QG_ENOTFOUND;
        t->p = q;
        return settle_send_eval(t);
    }
    if (!(it = items(o, 0, &n)))
        return QG_ESTORE;
    qg__rs_decode_settle(it, n, t->out, &res);
    switch (res.kind) {
    case QG__RS_OK:
        return QG_OK;
    case QG__RS_EINVAL:
        return QG_EINVAL;
    case QG__RS_MOVED:
        if (++o->attempt >= QG__RS_ATTEMPTS) {
            op_err(o, "%s", "the reservation kept moving");
            return QG_ESTORE;
        }
        t->p = res.moved;
        return settle_send_eval(t);
    case QG__RS_NOTFOUND:
        if (t->tried_index)
            return QG_ENOTFOUND;
        t->after_notfound = 1;
        return settle_send_index(t);
    case QG__RS_LAYOUT:
        op_err(o, "%s", "the reservation's windows follow rules this "
               "instance does not have");
        return QG_ESTATE;
    default:
        op_err(o, "%s", "unexpected reply from the Redis settle script");
        return QG_ESTORE;
    }
}

static int settle_begin(op *o)
{
    settle_op *t = (settle_op *)o;
    int rc;
    o->step = settle_step;
    if ((rc = version(o, NULL, &t->v)) != QG_OK)
        return rc;
    if (t->in.weight_milli > QG_REDIS_AMOUNT_MAX) {
        op_err(o, "%s", "a weight above 10^12 points is beyond what the "
               "Redis store counts exactly");
        return QG_ERANGE;
    }
    qg__rs_hex_lo(t->in.rid, t->rid);
    if (!t->in.has_member) {
        /* admitted here: the place is known; else GET the index */
        if (!placed_take(o->s, t->in.rid, &t->p))
            return settle_send_index(t);
        return settle_send_eval(t);
    }
    /* the subject's place now: its org's tag (one round trip) */
    qg__rs_place_of(t->in.member, t->in.has_org, t->in.org, &t->p);
    return settle_send_eval(t);
}

int qg__rs_op_settle(qg_store_lane *l, const qg_store_settle *in,
                     qg_settle_result *out, qg_store_done done, void *ud)
{
    settle_op *t = calloc(1, sizeof *t);
    if (!t)
        return QG_ENOMEM;
    op_init(&t->o, l, settle_begin, settle_fini, done, ud);
    t->in = *in;
    t->out = out;
    qg__rs_args_init(&t->a);
    qg__rs_args_init(&t->g);
    return op_start(&t->o);
}

/* -------------------------------------------------------------- usage */

typedef struct usage_op {
    op o;
    qg_store_usage in;
    qg_decision *out;
    qg__rs_version *v;
    qg__rs_place p;
    qg__rs_args a;
    int64_t now_arg, pnow;
} usage_op;

static void usage_fini(op *o)
{
    qg__rs_args_free(&((usage_op *)o)->a);
}

static int usage_send(usage_op *u)
{
    eval_args(u->o.s, &u->a, u->v, &u->p, "-");
    qg__rs_args_usage(&u->a, &u->in, u->v, u->now_arg, u->pnow);
    op_send_script(&u->o, 0, &u->a, u->v);
    return op_wait(&u->o);
}

static int usage_step(op *o)
{
    usage_op *u = (usage_op *)o;
    const qg__rs_item *it;
    qg__rs_result res;
    int n;
    if (o->failed || !(it = items(o, 0, &n)))
        return QG_ESTORE;
    qg__rs_decode_usage(it, n, u->v, u->out, &res);
    if (res.kind == QG__RS_OK) {
        u->out->outcome = QG_NONE;
        u->out->binding = -1;
        return QG_OK;
    }
    if (res.kind != QG__RS_PERIOD) {
        op_err(o, "%s", "unexpected reply from the Redis usage script");
        return QG_ESTORE;
    }
    QG__RS_COUNT(o->s, period_retries, 1);
    if (++o->attempt >= QG__RS_ATTEMPTS) {
        op_err(o, "%s", "calendar periods did not settle");
        return QG_ESTORE;
    }
    u->now_arg = res.raw_now;
    u->pnow = res.need_now;
    return usage_send(u);
}

static int usage_begin(op *o)
{
    usage_op *u = (usage_op *)o;
    int rc;
    o->step = usage_step;
    if ((rc = version(o, u->in.rules, &u->v)) != QG_OK)
        return rc;
    qg__rs_place_of(u->in.member, u->in.has_org && u->in.orgspec, u->in.org,
                    &u->p);
    u->now_arg = o->s->server_time ? 0 : u->in.now_ms;
    u->pnow = u->in.now_ms;
    return usage_send(u);
}

int qg__rs_op_usage(qg_store_lane *l, const qg_store_usage *in,
                    qg_decision *out, qg_store_done done, void *ud)
{
    usage_op *u = calloc(1, sizeof *u);
    if (!u)
        return QG_ENOMEM;
    op_init(&u->o, l, usage_begin, usage_fini, done, ud);
    u->in = *in;
    u->out = out;
    qg__rs_args_init(&u->a);
    return op_start(&u->o);
}

/* ------------------------------------------------------------ restore */

enum { RS_INDEX, RS_EXISTS, RS_EVAL };

typedef struct restore_op {
    op o;
    qg_store_restore in;
    qg__rs_version *v;
    qg__rs_place p, q;
    qg__rs_args a, ix, g;
    char rid[17], idx[QG__RS_KEY_MAX], val[65];
    int64_t pnow;
} restore_op;

static void restore_fini(op *o)
{
    restore_op *t = (restore_op *)o;
    qg__rs_args_free(&t->a);
    qg__rs_args_free(&t->ix);
    qg__rs_args_free(&t->g);
}

/* The script (and, the first time, the index write with it). */
static int restore_send(restore_op *t, int with_index)
{
    eval_args(t->o.s, &t->a, t->v, &t->p, t->rid);
    qg__rs_args_restore(&t->a, &t->in, t->v, t->pnow,
                        qg__rs_rid_ttl(t->o.s, t->v));
    if (with_index) {
        qg__rs_args_reset(&t->ix);
        qg__rs_adds(&t->ix, "SET");
        qg__rs_adds(&t->ix, t->idx);
        qg__rs_adds(&t->ix, t->val);
        qg__rs_adds(&t->ix, "PX");
        qg__rs_addi(&t->ix, qg__rs_rid_ttl(t->o.s, t->v));
        op_send(&t->o, 1, &t->ix, NULL, 0);
    }
    t->o.stage = RS_EVAL;
    op_send_script(&t->o, 0, &t->a, t->v);
    return op_wait(&t->o);
}

static int restore_step(op *o)
{
    restore_op *t = (restore_op *)o;
    const qg__rs_item *it;
    qg__rs_result res;
    int n;
    if (o->failed)
        return QG_ESTORE;
    switch (o->stage) {
    case RS_INDEX: {
        const rep *r = &o->r[1];
        if (r->type == REDIS_REPLY_STRING &&
            qg__rs_index_parse(r->str, r->len, &t->q) == 0 &&
            strcmp(t->q.tag, t->p.tag) != 0) {
            /* remembered under another tag: restored there already? */
            char rk[QG__RS_KEY_MAX];
            qg__rs_key_rec(t->q.tag, t->rid, rk);
            qg__rs_args_reset(&t->g);
            qg__rs_adds(&t->g, "EXISTS");
            qg__rs_adds(&t->g, rk);
            o->stage = RS_EXISTS;
            op_send(o, 2, &t->g, NULL, 0);
            return op_wait(o);
        }
        return restore_send(t, 1);
    }
    case RS_EXISTS:
        if (o->r[2].type == REDIS_REPLY_INTEGER && o->r[2].integer == 1)
            return QG_OK;
        return restore_send(t, 1);
    default:
        break;
    }
    if (!(it = items(o, 0, &n)))
        return QG_ESTORE;
    qg__rs_decode_restore(it, n, &res);
    if (res.kind == QG__RS_OK)
        return res.rc;
    if (res.kind != QG__RS_PERIOD) {
        op_err(o, "%s", "unexpected reply from the Redis restore script");
        return QG_ESTORE;
    }
    QG__RS_COUNT(o->s, period_retries, 1);
    if (++o->attempt >= QG__RS_ATTEMPTS) {
        op_err(o, "%s", "calendar periods did not settle");
        return QG_ESTORE;
    }
    t->pnow = res.need_now;
    return restore_send(t, 0);
}

static int restore_begin(op *o)
{
    restore_op *t = (restore_op *)o;
    const qg_store_restore *in = &t->in;
    int rc;
    o->step = restore_step;
    if ((rc = version(o, in->rules, &t->v)) != QG_OK)
        return rc;
    if (in->reserved_milli > QG_REDIS_AMOUNT_MAX ||
        in->charged_milli > QG_REDIS_AMOUNT_MAX ||
        in->headroom_milli > QG_REDIS_AMOUNT_MAX ||
        in->price_micro > QG_REDIS_MONEY_MAX ||
        in->cost_micro > QG_REDIS_MONEY_MAX) {
        op_err(o, "%s", "a restored amount beyond what the Redis store "
               "counts exactly");
        return QG_ERANGE;
    }
    qg__rs_place_of(in->member, in->has_org && in->orgspec, in->org, &t->p);
    qg__rs_hex_lo(in->rid, t->rid);
    qg__rs_key_index(t->rid, t->idx);
    qg__rs_index_value(&t->p, t->val);
    t->pnow = in->at_ms;
    if (in->charge_only)
        return restore_send(t, 0);
    qg__rs_adds(&t->g, "GET");
    qg__rs_adds(&t->g, t->idx);
    o->stage = RS_INDEX;
    op_send(o, 1, &t->g, NULL, 0);
    return op_wait(o);
}

int qg__rs_op_restore(qg_store_lane *l, const qg_store_restore *in,
                      qg_store_done done, void *ud)
{
    restore_op *t = calloc(1, sizeof *t);
    if (!t)
        return QG_ENOMEM;
    op_init(&t->o, l, restore_begin, restore_fini, done, ud);
    t->in = *in;
    qg__rs_args_init(&t->a);
    qg__rs_args_init(&t->ix);
    qg__rs_args_init(&t->g);
    return op_start(&t->o);
}

/* --------------------------------------------------------------- known */

typedef struct known_op {
    op o;
    qg_key rid_key;
    int *found;
    qg__rs_args g;
} known_op;

static void known_fini(op *o)
{
    qg__rs_args_free(&((known_op *)o)->g);
}

static int known_step(op *o)
{
    known_op *k = (known_op *)o;
    const rep *r = &o->r[0];
    qg__rs_place q;
    char rid[17], rk[QG__RS_KEY_MAX];
    if (o->failed)
        return QG_ESTORE;
    if (o->stage == 1) {
        *k->found = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        return QG_OK;
    }
    if (r->type != REDIS_REPLY_STRING ||
        qg__rs_index_parse(r->str, r->len, &q) != 0)
        return QG_OK;
    qg__rs_hex_lo(k->rid_key, rid);
    qg__rs_key_rec(q.tag, rid, rk);
    qg__rs_args_reset(&k->g);
    qg__rs_adds(&k->g, "EXISTS");
    qg__rs_adds(&k->g, rk);
    o->stage = 1;
    op_send(o, 0, &k->g, NULL, 0);
    return op_wait(o);
}

static int known_begin(op *o)
{
    known_op *k = (known_op *)o;
    char rid[17], idx[QG__RS_KEY_MAX];
    o->step = known_step;
    *k->found = 0;
    qg__rs_hex_lo(k->rid_key, rid);
    qg__rs_key_index(rid, idx);
    qg__rs_adds(&k->g, "GET");
    qg__rs_adds(&k->g, idx);
    op_send(o, 0, &k->g, NULL, 0);
    return op_wait(o);
}

int qg__rs_op_known(qg_store_lane *l, qg_key rid, int *found,
                    qg_store_done done, void *ud)
{
    known_op *k = calloc(1, sizeof *k);
    if (!k)
        return QG_ENOMEM;
    op_init(&k->o, l, known_begin, known_fini, done, ud);
    k->rid_key = rid;
    k->found = found;
    qg__rs_args_init(&k->g);
    return op_start(&k->o);
}

/* --------------------------------------------------------------- probe */

/* Each node's epoch key is read with SET key <fresh> NX GET: its value,
 * or nil when this probe created it.  One node: qg:epoch; a Cluster:
 * qg:epoch:{TAG} with TAG in the first slot of each master (the key
 * moves with its slot in a resharding, and a replica that takes over has
 * it), so a master that comes back empty, or a FLUSHALL on one, is a
 * changed value. */
typedef struct probe_op {
    op o;
    int fresh;
    int nkeys;
    char (*key)[32];
    char val[33];
    qg__rs_args *cmd;
    qg__rs_args first;
} probe_op;

static void probe_fini(op *o)
{
    probe_op *p = (probe_op *)o;
    for (int i = 0; p->cmd && i < p->nkeys; i++)
        qg__rs_args_free(&p->cmd[i]);
    free(p->cmd);
    free(p->key);
    qg__rs_args_free(&p->first);
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
            b[i] = (unsigned char)((tv.tv_usec >> (i % 4 * 8)) ^
                                   (getpid() >> i) ^ (tv.tv_sec >> (i % 8)));
    }
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int probe_slots(op *o, int n)
{
    if (n <= o->nslot)
        return 0;
    for (int i = 0; i < QG__RS_SLOTS; i++)
        rep_clear(&o->r_in[i]);
    if (!(o->r = calloc((size_t)n, sizeof *o->r)) ||
        !(o->w = calloc((size_t)n, sizeof *o->w))) {
        free(o->r);
        o->r = o->r_in;
        o->w = o->w_in;
        return -1;
    }
    o->nslot = n;
    return 0;
}

static void epoch_cmd(qg__rs_args *a, const char *key, const char *val)
{
    qg__rs_adds(a, "SET");
    qg__rs_adds(a, key);
    qg__rs_adds(a, val);
    qg__rs_adds(a, "NX");
    qg__rs_adds(a, "GET");
}

/* Send one SET NX GET per master of the map. */
static int probe_nodes(probe_op *p)
{
    op *o = &p->o;
    qg__rlink_node *nodes;
    int n = qg__rlink_nodes(o->l->link, NULL, 0);
    if (n <= 0) {
        op_err(o, "Redis Cluster: %s", "no slot map");
        return QG_ESTORE;
    }
    if (!(nodes = calloc((size_t)n, sizeof *nodes)) ||
        !(p->key = calloc((size_t)n, sizeof *p->key)) ||
        !(p->cmd = calloc((size_t)n, sizeof *p->cmd)) || probe_slots(o, n)) {
        free(nodes);
        return QG_ENOMEM;
    }
    n = qg__rlink_nodes(o->l->link, nodes, n);
    p->nkeys = n;
    for (int i = 0; i < n; i++) {
        char tag[8];
        if (qg__rc_tag_for_slot(nodes[i].first_slot, tag, sizeof tag) < 0)
            snprintf(tag, sizeof tag, "%s", "0");
        snprintf(p->key[i], sizeof p->key[i], QG__RS_KEY_EPOCH ":{%s}", tag);
        qg__rs_args_init(&p->cmd[i]);
        epoch_cmd(&p->cmd[i], p->key[i], p->val);
        op_send(o, i, &p->cmd[i], NULL, 0);
    }
    free(nodes);
    o->stage = 2;
    return op_wait(o);
}

static int probe_step(op *o)
{
    probe_op *p = (probe_op *)o;
    redis_store *s = o->s;
    int lost = 0;
    if (o->failed)
        return QG_ESTORE;
    if (o->stage == 1)         /* the map has come: every master */
        return probe_nodes(p);
    for (int i = 0; i < (s->cluster ? p->nkeys : 1); i++) {
        const rep *r = &o->r[i];
        const char *v;
        if (r->type == REDIS_REPLY_ERROR) {
            op_err(o, "Redis: %s", r->str);
            return QG_ESTORE;
        }
        v = r->type == REDIS_REPLY_STRING ? r->str : p->val;
        if (strlen(v) >= 33) {
            op_err(o, "%s", "unexpected value in qg:epoch");
            return QG_ESTORE;
        }
        lost |= qg__rs_epoch_note(s, s->cluster ? p->key[i] : NULL, v);
    }
    if (lost || is_lost(s)) {
        op_err(o, "%s", lost_msg);
        return QG_ESTATE;
    }
    return QG_OK;
}

static int probe_begin(op *o)
{
    probe_op *p = (probe_op *)o;
    redis_store *s = o->s;
    o->step = probe_step;
    random_hex(p->val);
    if (p->fresh) {
        pthread_mutex_lock(&s->mu);
        s->have_epoch = 0;
        s->nepochs = 0;
        pthread_mutex_unlock(&s->mu);
    }
    if (!s->cluster) {
        epoch_cmd(&p->first, QG__RS_KEY_EPOCH, p->val);
        o->stage = 2;
        op_send(o, 0, &p->first, NULL, 0);
        return op_wait(o);
    }
    if (qg__rlink_nodes(o->l->link, NULL, 0) > 0)
        return probe_nodes(p);
    /* no map yet: a routed command waits for it (within its deadline) */
    qg__rs_adds(&p->first, "EXISTS");
    qg__rs_adds(&p->first, QG__RS_KEY_EPOCH);
    o->stage = 1;
    op_send(o, 0, &p->first, NULL, 0);
    return op_wait(o);
}

int qg__rs_op_probe(qg_store_lane *l, int fresh, qg_store_done done, void *ud)
{
    probe_op *p = calloc(1, sizeof *p);
    if (!p)
        return QG_ENOMEM;
    op_init(&p->o, l, probe_begin, probe_fini, done, ud);
    p->fresh = fresh;
    qg__rs_args_init(&p->first);
    return op_start(&p->o);
}

/* ---------------------------------------------------------------- lanes */

qg_store_lane *qg__rs_lane_open(redis_store *s, struct event_base *base,
                                char *err, size_t errcap)
{
    qg_store_lane *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, errcap, "%s", "out of memory");
        return NULL;
    }
    l->s = s;
    l->base = base;
    for (int i = 0; i < QG__RS_LOADS; i++)
        l->loads[i].pending = -1;
    if (!(l->link = qg__rlink_new(base, s->url, s->password, s->timeout_ms,
                                  err, errcap))) {
        free(l);
        return NULL;
    }
    return l;
}

/* The calls in flight end with QG_ESTORE (the link fails them). */
void qg__rs_lane_close(qg_store_lane *l)
{
    if (!l)
        return;
    qg__rlink_free(l->link);
    free(l);
}
