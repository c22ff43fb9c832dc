/* gate.c - see gate.h: admission and settlement, once for every route.
 *
 * Back-pressure is the ledger's own bound (qg__ledger_behind): a decision
 * is refused with 503 overloaded while the writer's backlog is at it, so
 * that the rows of what was admitted always find room.  A settle's row is
 * written by the ledger's writer thread; when the caller waits for it,
 * the answer comes back to the caller's worker through qg__http_post, so
 * that every callback of this file runs on the thread that holds the
 * request.  Decisions and settles reach the store through the worker's
 * lane: with a remote store they are in flight while the worker serves
 * others, and the gate's callbacks run when the answer comes.  The gate
 * keeps its own copies of a request's strings, so a route may release
 * its request body as soon as it has asked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gate.h"
#include "keeper.h"
#include "metrics.h"
#include "notify.h"
#include "rules.h"
#include "weights.h"

static const char behind[] = "the ledger is behind; retry shortly";
static const char unmetered[] = "the ledger's database cannot be reached "
                                "and its spool cannot be written: nothing "
                                "is admitted unmetered; retry shortly";

/* ---------------------------------------------------------------- lanes */

qg_store_lane *qg__gate_lane(qg_server *s, int worker,
                             struct event_base *base)
{
    char err[256];
    if (!s->lanes || worker < 0 || worker >= s->nlanes)
        return NULL;
    if (!s->lanes[worker] && !s->lane_failed[worker]) {
        /* on the worker's own thread: nobody else touches this slot */
        s->lanes[worker] = qg_store_lane_new(s->store, base, err, sizeof err);
        if (!s->lanes[worker]) {
            s->lane_failed[worker] = 1;      /* a store without lanes */
            if (err[0])
                fprintf(stderr, "quotagate: store: worker %d: %s\n", worker,
                        err);
        }
    }
    return s->lanes[worker];
}

/* ----------------------------------------------------------- admission */

static void copy_str(char *dst, size_t cap, const char **field)
{
    if (*field) {
        qg__row_copy(dst, cap, *field);
        *field = dst;
    }
}

/* Decide locally: the shared store is down or rebuilding (keeper.c). */
static int decide_local(qg_server *s, qg__admit *a)
{
    const qg_rules *rules = qg_engine_rules(s->engine);
    int rc;
    if (rules->store.down == QG_DOWN_CLOSED) {
        snprintf(a->err, sizeof a->err, "the counters' store (%s) does not "
                 "answer, and the rules say store.down: closed",
                 qg_store_name(s->store));
        return QG_ESTORE;
    }
    a->now_ms = qg__server_now(s);
    rc = qg_engine_check_local(s->engine, &a->req, a->now_ms,
                               rules->store.share_milli, &a->d, a->err,
                               sizeof a->err);
    if (rc == QG_ESTATE)
        return rc;           /* the outage ended meanwhile: ask the store */
    a->fallback = 1;
    atomic_fetch_add(&s->fallback_decisions, 1);
    return rc;
}

static int local_now(qg_server *s)
{
    return s->keeper &&
           (atomic_load(&s->store_down) || atomic_load(&s->store_lost));
}

static void admit_done(void *arg, int rc)
{
    qg__admit *a = arg;
    qg_server *s = a->s;
    if (rc == QG_ESTORE && s->keeper && !a->retried && !local_now(s)) {
        /* once more before deciding locally: a connection reset loses
         * the replies of a whole pipeline, and the link reconnects at
         * once.  Safe by request id: a check the store applied the first
         * time is answered from its record, without a second charge */
        static _Atomic int64_t logged_ms;
        int64_t now = qg__server_now(s), last = atomic_load(&logged_ms);
        if (now - last >= 1000 &&
            atomic_compare_exchange_strong(&logged_ms, &last, now))
            fprintf(stderr, "quotagate: store: a call failed (%s); sent "
                    "again once before deciding locally\n",
                    qg_store_redis_error(s->store));
        a->retried = 1;
        a->err[0] = '\0';
        rc = qg__server_check_async(s, qg__gate_lane(s, a->worker, a->base),
                                    &a->req, a->now_ms, &a->d, &a->prior,
                                    a->err, sizeof a->err, admit_done, a);
        if (rc == QG_PENDING)
            return;
    }
    if (rc == QG_OK && a->retried && a->d.replayed)
        a->d.replayed = 0;       /* the first attempt's own answer */
    if ((rc == QG_ESTORE || rc == QG_ESTATE) && s->keeper) {
        int sent = rc == QG_ESTORE;
        qg__keeper_report(s->keeper, rc);
        /* open the journal for this outage; the keeper may be closing
         * the last one's just now (it sees this report and goes on) */
        for (int tries = 0; tries < 3; tries++) {
            qg_engine_local_open(s->engine);
            if ((rc = decide_local(s, a)) != QG_ESTATE)
                break;
        }
        if (rc == QG_ESTATE) {
            /* handed back to the store as it failed again: 503 */
            snprintf(a->err, sizeof a->err, "the counters' store (%s) did "
                     "not answer", qg_store_name(s->store));
            rc = QG_ESTORE;
        }
        /* the store may have applied the check it did not answer: unless
         * the caller is told "admitted" (then the charge-back by request
         * id counts it once), what it charged is taken back later */
        if (sent && (rc != QG_OK || a->d.outcome != QG_ALLOW) &&
            qg__keeper_hold_void(s->keeper, a->request_id, a->subject,
                                 a->now_ms) != QG_OK)
            fprintf(stderr, "quotagate: store: request %s may stay charged "
                    "in the store (too many waiting)\n", a->request_id);
    }
    a->rc = rc;
    a->done(a, a->ud);
}

void qg__gate_decide_on(qg_server *s, int worker, struct event_base *base,
                        qg__admit *a, qg__admit_done done, void *ud)
{
    int rc;
    a->s = s;
    a->worker = worker;
    a->base = base;
    a->retried = 0;
    a->done = done;
    a->ud = ud;
    a->err[0] = '\0';
    a->fallback = 0;
    copy_str(a->subject, sizeof a->subject, &a->req.subject);
    copy_str(a->request_id, sizeof a->request_id, &a->req.request_id);
    copy_str(a->model, sizeof a->model, &a->req.model);
    a->now_ms = qg__server_now(s);
    if (qg__ledger_behind(s->ledger)) {
        a->rc = QG_EFULL;
        snprintf(a->err, sizeof a->err, "%s", behind);
        done(a, ud);
        return;
    }
    if (qg__ledger_refusing(s->ledger)) {
        a->rc = QG_ELEDGER;
        snprintf(a->err, sizeof a->err, "%s", unmetered);
        done(a, ud);
        return;
    }
    if (local_now(s)) {
        a->rc = decide_local(s, a);
        if (a->rc != QG_ESTATE) {
            done(a, ud);
            return;
        }
        /* the keeper handed decisions back to the store as we looked */
        a->err[0] = '\0';
    }
    rc = qg__server_check_async(s, qg__gate_lane(s, worker, base), &a->req,
                                a->now_ms, &a->d, &a->prior, a->err,
                                sizeof a->err, admit_done, a);
    if (rc != QG_PENDING)
        admit_done(a, rc);
}

void qg__gate_decide(qg_server *s, qg_http_req *r, qg__admit *a,
                     qg__admit_done done, void *ud)
{
    qg__gate_decide_on(s, r->worker, qg__http_req_base(r), a, done, ud);
}

void qg__gate_record(qg_server *s, const qg__admit *a, const char *window)
{
    qg_ledger_row row;
    qg__metrics_record(s->metrics, &a->d);
    if (a->d.replayed)               /* recorded when first decided */
        return;
    qg__row_of_decision(&row, &a->d, a->req.request_id, a->req.subject,
                        a->req.input_tokens, a->row_output_tokens);
    row.estimated = a->estimated;
    row.fallback = a->fallback;
    if (window)
        qg__row_copy(row.window, sizeof row.window, window);
    if (qg__ledger_submit(s->ledger, &row, NULL, NULL) != QG_OK)
        fprintf(stderr, "quotagate: ledger queue full: the row of request "
                "%s was not queued\n", a->req.request_id);
    qg__notify_decision(s->notify,
                        qg_engine_rules_at(s->engine, a->now_ms), &a->d,
                        a->req.subject, a->now_ms);
}

void qg__gate_headers(qg_server *s, const qg__admit *a, qg_hdr_buf *hb)
{
    if (qg__headers_for_decision(&a->d,
                                 qg_engine_rules_at(s->engine, a->now_ms),
                                 a->now_ms, hb) < 0)
        hb->n = 0;
}

/* ---------------------------------------------------------- settlement */

static const struct {
    const char *word;
    qg_settle_status status;
    int row_status;
} statuses[] = {
    {"completed", QG_SETTLE_COMPLETED, QG_ROW_COMPLETED},
    {"cancelled", QG_SETTLE_CANCELLED, QG_ROW_CANCELLED},
    {"failed", QG_SETTLE_FAILED, QG_ROW_FAILED},
};
#define NSTATUSES (sizeof statuses / sizeof statuses[0])

int qg__settle_status_parse(const char *word)
{
    for (size_t i = 0; word && i < NSTATUSES; i++)
        if (strcmp(statuses[i].word, word) == 0)
            return (int)statuses[i].status;
    return -1;
}

int qg__row_status_of(qg_settle_status st)
{
    for (size_t i = 0; i < NSTATUSES; i++)
        if (statuses[i].status == st)
            return statuses[i].row_status;
    return QG_ROW_FAILED;
}

/* A settle whose reservation nobody knows (lost in a crash before its row
 * was durable): record the charge from the settle itself, which names the
 * subject (and the model, for token counts). */
static int recover(qg_server *s, qg__settle *st)
{
    const qg_rules *rules = qg_engine_rules_at(s->engine, st->now_ms);
    const qg_settle_req *q = &st->req;
    qg_ledger_row *row = &st->row;
    qg_restore_req rr;
    qg_decision *u;
    int64_t w = q->weight_milli;
    int rc;

    if (st->model) {
        int mi = qg_rules_find_model(rules, st->model);
        if (mi < 0) {
            snprintf(st->err, sizeof st->err, "unknown model \"%s\"",
                     st->model);
            return QG_EMODEL;
        }
        /* tokens within the bound (parsed so); a weight over the bound is
         * charged at the bound, as every settle is (engine.c) */
        w = qg__weight_milli(&rules->models[mi], q->input_tokens,
                             q->output_tokens);
        if (w > QG_AMOUNT_MAX_MILLI)
            w = QG_AMOUNT_MAX_MILLI;
    } else if (w < 0) {
        snprintf(st->err, sizeof st->err, "no reservation for request_id "
                 "\"%s\": a settle that records a lost reservation needs "
                 "model and tokens, or weight", q->request_id);
        return QG_ENOTFOUND;
    }
    rr = (qg_restore_req){.subject = q->subject, .request_id = q->request_id,
                          .model = st->model, .decided_at_ms = st->now_ms,
                          .reserved_milli = w, .charged_milli = w,
                          .settled = 1, .status = q->status,
                          .headroom_milli = -1};
    if ((rc = qg_engine_restore(s->engine, &rr, st->err, sizeof st->err)) !=
        QG_OK)
        return rc;
    if (!(u = malloc(sizeof *u)))
        return QG_ENOMEM;
    rc = qg_engine_usage(s->engine, q->subject, st->now_ms, u);
    memset(&st->res, 0, sizeof st->res);
    st->res.reserved_milli = st->res.actual_milli = st->res.charged_milli = w;
    st->res.decided_at_ms = st->now_ms;
    st->res.status = q->status;
    qg__row_copy(row->subject, sizeof row->subject, q->subject);
    if (rc == QG_OK) {
        qg__row_copy(row->org, sizeof row->org, u->org);
        qg__row_copy(row->plan, sizeof row->plan, u->plan);
        qg__row_copy(row->rules_version, sizeof row->rules_version,
                     u->rules_version);
        qg__row_copy(row->weights_version, sizeof row->weights_version,
                     u->weights_version);
    }
    free(u);
    qg__row_copy(row->model, sizeof row->model, st->model);
    row->decision = QG_ALLOW;
    row->created_ms = st->now_ms;
    row->reserved_milli = w;
    return QG_OK;
}

/* ------------------------------------------------------ notifications */

typedef struct settled_usage {
    qg_server *s;
    char subject[256];
    int64_t now_ms;
    qg_decision d;
} settled_usage;

static void settled_views(void *ud, int rc)
{
    settled_usage *u = ud;
    if (rc == QG_OK)
        qg__notify_decision(u->s->notify, qg_engine_rules(u->s->engine),
                            &u->d, u->subject, u->now_ms);
    free(u);
}

/* The subject's views after a settle, through the worker's lane (no
 * wait with the memory store; one call in flight with a remote one),
 * handed to the notifications. */
static void notify_settled(qg_server *s, int worker, const char *subject,
                           int64_t now_ms)
{
    const qg_rules *r = qg_engine_rules_at(s->engine, now_ms);
    settled_usage *u;
    int rc;
    if (!s->notify || r->notify.nwebhooks == 0 || !subject || !subject[0] ||
        !(u = malloc(sizeof *u)))
        return;
    u->s = s;
    qg__row_copy(u->subject, sizeof u->subject, subject);
    u->now_ms = now_ms;
    rc = qg_engine_usage_async(s->engine, s->lanes && worker >= 0 &&
                               worker < s->nlanes ? s->lanes[worker] : NULL,
                               u->subject, now_ms, &u->d, settled_views, u);
    if (rc != QG_PENDING)
        settled_views(u, rc);
}

/* On the settling worker: the row is durable (or failed). */
static void settle_answer(void *arg)
{
    qg__settle *st = arg;
    st->done(st, st->ud);
    free(st);
}

/* The ledger's writer thread: hand the outcome to the worker. */
static void settle_durable(void *arg, int rc)
{
    qg__settle *st = arg;
    st->rc = rc == QG_OK || rc == QG_ESTATE ? rc : QG_EIO;
    if (qg__http_post(st->s->http, st->worker, settle_answer, st) != 0) {
        /* the server is stopping: the connection goes with it; done is
         * told so (it may only release what it holds) */
        st->rc = QG_ESTATE;
        st->stopping = 1;
        st->done(st, st->ud);
        free(st);
    }
}

/* The end of a settle that stops before its row: tell a waiting caller
 * (or log), release st. */
static void settle_end(qg__settle *st)
{
    if (st->done)
        st->done(st, st->ud);
    else if (st->rc != QG_OK)
        fprintf(stderr, "quotagate: settle of %s: %s\n", st->req.request_id,
                st->err[0] ? st->err : qg_strerror(st->rc));
    free(st);
}

/* The store has applied the settle (or not): the ledger's answer for an
 * id the counters forgot, recovery, then the row. */
static void settle_applied(void *arg, int rc)
{
    qg__settle *st = arg;
    qg_server *s = st->s;
    const qg_settle_req *q = &st->req;
    int from_ledger = 0, qrc;

    if ((rc == QG_ESTORE || rc == QG_ESTATE) && s->keeper) {
        /* the store is not there: nobody waits, so the keeper applies it
         * once it is; a caller who waits is told to retry */
        qg__keeper_report(s->keeper, rc);
        if (!st->done && qg__keeper_hold_settle(s->keeper, st) == QG_OK) {
            free(st);
            return;
        }
    }
    if (rc == QG_ENOTFOUND) {
        /* the counters do not know it: the ledger may (reqid.c) */
        char lerr[QG_GATE_ERRCAP];
        int lrc = qg__server_settle_prior(s, q, st->now_ms, &st->res,
                                          &st->row, lerr, sizeof lerr);
        if (lrc != QG_ENOTFOUND) {
            rc = lrc;
            from_ledger = rc == QG_OK;
            memcpy(st->err, lerr, sizeof st->err);
        }
    }
    if (rc == QG_ENOTFOUND && st->recover && q->subject) {
        rc = recover(s, st);
        st->recovered = rc == QG_OK;
    }
    if ((st->rc = rc) != QG_OK) {
        settle_end(st);
        return;
    }
    if (from_ledger && st->res.replayed) {
        /* settled long ago: its original answer, durable already */
        st->answered = 1;
        settle_end(st);
        return;
    }
    qg__metrics_settle(s->metrics, &st->res);
    /* a recovered settle's row is whole (recover), else only the settle's
     * columns change, of the row of the subject the settle named (the
     * engine checked it) or that the ledger holds */
    st->row.settle_only = !st->recovered;
    if (!st->recovered && !from_ledger)
        qg__row_copy(st->row.subject, sizeof st->row.subject,
                     q->subject ? q->subject : st->row_subject);
    qg__row_fill_settle(&st->row, q->request_id, qg__row_status_of(q->status),
                        q->input_tokens, q->output_tokens, &st->res,
                        st->now_ms);
    st->row.estimated = st->estimated;
    /* a settle that charged more than was reserved may cross a threshold
     * the check did not reach (notify.h) */
    if (st->res.charged_milli > st->res.reserved_milli && !st->res.replayed)
        notify_settled(s, st->worker, st->row.subject, st->now_ms);
    if (st->detail)
        qg__row_copy(st->row.detail, sizeof st->row.detail, st->detail);
    qrc = qg__ledger_submit(s->ledger, &st->row,
                            st->done ? settle_durable : NULL,
                            st->done ? st : NULL);
    if (qrc == QG_OK && st->done)
        return;                       /* answered by settle_durable */
    if (qrc != QG_OK) {
        fprintf(stderr, "quotagate: ledger queue full: the settle of "
                "request %s was not queued\n", q->request_id);
        snprintf(st->err, sizeof st->err, "%s", behind);
        st->rc = QG_EFULL;
    }
    settle_end(st);
}

int qg__gate_settle(qg_server *s, const qg__settle *proto, int worker,
                    struct event_base *base, qg__settle_done done, void *ud)
{
    qg__settle *st = malloc(sizeof *st);
    int rc;
    if (!st)
        return QG_ENOMEM;
    *st = *proto;
    st->s = s;
    st->worker = worker;
    st->done = done;
    st->ud = ud;
    st->recovered = st->answered = st->stopping = 0;
    st->err[0] = '\0';
    copy_str(st->rid_buf, sizeof st->rid_buf, &st->req.request_id);
    copy_str(st->subject_buf, sizeof st->subject_buf, &st->req.subject);
    copy_str(st->model_buf, sizeof st->model_buf, &st->model);
    copy_str(st->row_subject_buf, sizeof st->row_subject_buf,
             &st->row_subject);
    copy_str(st->detail_buf, sizeof st->detail_buf, &st->detail);
    st->now_ms = qg__server_now(s);
    memset(&st->row, 0, sizeof st->row);
    st->row.headroom_milli = -1;
    /* back-pressure only for a caller who waits and can retry: a settle
     * nobody waits for (a proxied call that ended) is always applied, its
     * row queued in the room the bound keeps for exactly these */
    if (done && qg__ledger_behind(s->ledger)) {
        snprintf(st->err, sizeof st->err, "%s", behind);
        st->rc = QG_EFULL;
        settle_end(st);
        return QG_OK;
    }
    if (s->keeper && qg_engine_local_knows(s->engine, st->req.request_id)) {
        /* admitted locally while the store was down */
        rc = qg_engine_settle_local(s->engine, &st->req, st->now_ms,
                                    &st->res, st->err, sizeof st->err);
        settle_applied(st, rc);
        return QG_OK;
    }
    if (local_now(s)) {
        settle_applied(st, QG_ESTORE);
        return QG_OK;
    }
    rc = qg_engine_settle_async(s->engine, qg__gate_lane(s, worker, base),
                                &st->req, st->now_ms, &st->res, st->err,
                                sizeof st->err, settle_applied, st);
    if (rc != QG_PENDING)
        settle_applied(st, rc);
    return QG_OK;
}
