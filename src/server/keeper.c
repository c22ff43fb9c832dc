/* keeper.c - the shared store's keeper: a thread of its own that watches
 * the counters' store while the workers decide (PRODUCT.md 5.1 points 4
 * and 5; docs/deploy.md).
 *
 * A worker that meets a store that does not answer in time (QG_ESTORE) or
 * that lost its data (QG_ESTATE) reports it here (qg__keeper_report) and
 * goes on deciding locally (the engine's fallback, `down: local`) or
 * refusing (`down: closed`).  The keeper then probes the store every
 * PROBE_MS:
 *  - down: once the store answers, everything admitted locally meanwhile
 *    is charged into it (qg_engine_local_drain: restores by request id,
 *    so a retry never charges twice), the settles that could not reach it
 *    are applied, and only then do the workers go back to it;
 *  - lost: the counters are rebuilt from this instance's ledger (every
 *    row inside the rules' reach, restored by request id) and the loss
 *    accepted; until then decisions are local, so nobody gains allowance
 *    from the loss.
 * The store's own calls here are synchronous (this thread may wait). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gate.h"
#include "keeper.h"
#include "metrics.h"

#define PROBE_MS 200
#define MAX_SETTLES 65536            /* settles waiting for the store */

typedef struct held_settle {
    qg__settle st;                   /* the gate's copy, strings inside */
    int unknown;                     /* qg__keeper_hold_void's */
    struct held_settle *next;
} held_settle;

struct qg__keeper {
    qg_server *s;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    held_settle *settles, **tail;
    int nsettles;
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A request admitted locally, charged into the store. */
static int charge_back(const qg_restore_req *rr, void *ud)
{
    qg_server *s = ud;
    char err[320];
    int rc = qg_engine_restore(s->engine, rr, err, sizeof err);
    if (rc == QG_ESTORE || rc == QG_ESTATE)
        return rc;                   /* try again at the next probe */
    if (rc != QG_OK)                 /* the rules changed meanwhile... */
        fprintf(stderr, "quotagate: store: request %s admitted in fallback "
                "could not be charged: %s\n", rr->request_id, err);
    return QG_OK;
}

/* The settles that waited for the store, applied in order. */
static int apply_settles(qg__keeper *k)
{
    qg_server *s = k->s;
    for (;;) {
        held_settle *h;
        qg_settle_result res;
        char err[320];
        int rc;
        pthread_mutex_lock(&k->mu);
        h = k->settles;
        pthread_mutex_unlock(&k->mu);
        if (!h)
            return QG_OK;
        rc = qg_engine_settle(s->engine, &h->st.req, h->st.now_ms, &res,
                              err, sizeof err);
        if (rc == QG_ESTORE || rc == QG_ESTATE)
            return rc;
        if (h->unknown) {
            /* not found: the store never applied it */
            if (rc == QG_OK)
                fprintf(stderr, "quotagate: store: request %s, refused "
                        "while the store did not answer, had been applied "
                        "there: taken back\n", h->st.req.request_id);
        } else if (rc == QG_OK) {
            qg_ledger_row row;
            memset(&row, 0, sizeof row);
            row.settle_only = 1;
            row.headroom_milli = -1;
            qg__row_copy(row.subject, sizeof row.subject,
                         h->st.req.subject ? h->st.req.subject
                                           : h->st.row_subject);
            qg__row_fill_settle(&row, h->st.req.request_id,
                                qg__row_status_of(h->st.req.status),
                                h->st.req.input_tokens,
                                h->st.req.output_tokens, &res, h->st.now_ms);
            row.estimated = h->st.estimated;
            if (h->st.detail)
                qg__row_copy(row.detail, sizeof row.detail, h->st.detail);
            qg__metrics_settle(s->metrics, &res);
            if (qg__ledger_submit(s->ledger, &row, NULL, NULL) != QG_OK)
                fprintf(stderr, "quotagate: ledger queue full: the settle "
                        "of request %s was not queued\n",
                        h->st.req.request_id);
        } else {
            fprintf(stderr, "quotagate: store: a settle of %s that waited "
                    "for the store: %s\n", h->st.req.request_id, err);
        }
        pthread_mutex_lock(&k->mu);
        k->settles = h->next;
        if (!k->settles)
            k->tail = &k->settles;
        k->nsettles--;
        pthread_mutex_unlock(&k->mu);
        free(h);
    }
}

/* A row of the ledger, restored into a store that lost its data. */
static int restore_row(const qg_ledger_row *row, void *ud)
{
    qg_server *s = ud;
    char err[320];
    qg_restore_req rr;
    int rc;
    qg__row_restore_req(row, &rr);
    rc = qg_engine_restore(s->engine, &rr, err, sizeof err);
    if (rc == QG_ESTORE)
        return rc;                   /* stops the scan: try again later */
    return QG_OK;                    /* a row the rules no longer know */
}

/* The store lost its data: rebuild it from this instance's ledger. */
static int rebuild(qg__keeper *k)
{
    qg_server *s = k->s;
    int64_t since = qg__server_now(s) - qg_engine_reach_ms(s->engine);
    int rc;
    fprintf(stderr, "quotagate: store: the data set was lost (qg:epoch "
            "changed): rebuilding the counters from the ledger; decisions "
            "are local meanwhile\n");
    /* rows admitted a moment ago may still wait in the writer's queue:
     * the store must get them too, or it would hold less than was
     * admitted (PRODUCT.md 5.1 point 5) */
    if (qg__ledger_catch_up(s->ledger, 5000) != QG_OK)
        fprintf(stderr, "quotagate: store: the ledger's writer is more than "
                "5 s behind: the rebuild reads what is written\n");
    if ((rc = qg__ledger_scan(s->ledger, since, restore_row, s)) != QG_OK)
        return rc;
    if ((rc = qg_store_redis_accept_loss(s->store)) != QG_OK)
        return rc;
    fprintf(stderr, "quotagate: store: counters rebuilt from the ledger\n");
    return QG_OK;
}

static void *keeper_main(void *arg)
{
    qg__keeper *k = arg;
    qg_server *s = k->s;
    for (;;) {
        int down, lost, rc;
        unsigned reports;
        pthread_mutex_lock(&k->mu);
        while (!k->stop && !atomic_load(&s->store_down) &&
               !atomic_load(&s->store_lost) && !k->settles)
            pthread_cond_wait(&k->cv, &k->mu);
        if (k->stop) {
            pthread_mutex_unlock(&k->mu);
            return NULL;
        }
        pthread_mutex_unlock(&k->mu);
        reports = atomic_load(&s->store_reports);
        down = atomic_load(&s->store_down);
        lost = atomic_load(&s->store_lost);
        rc = qg_store_probe(s->store);
        if (rc == QG_ESTATE && !lost) {
            atomic_store(&s->store_lost, 1);
            lost = 1;
        }
        if (rc == QG_ESTORE) {
            sleep_ms(PROBE_MS);
            continue;
        }
        if (lost && rebuild(k) != QG_OK) {
            sleep_ms(PROBE_MS);
            continue;
        }
        if (qg_engine_local_drain(s->engine, charge_back, s) != QG_OK ||
            apply_settles(k) != QG_OK) {
            sleep_ms(PROBE_MS);
            continue;
        }
        /* no local decision from here on (atomic with the journal: one
         * that got in before is drained first), then the store again */
        if (!qg_engine_local_close(s->engine))
            continue;
        if (atomic_load(&s->store_reports) != reports) {
            /* a call failed meanwhile: a new outage, probe again */
            sleep_ms(PROBE_MS);
            continue;
        }
        if (lost)
            atomic_store(&s->store_lost, 0);
        if (down) {
            atomic_store(&s->store_down, 0);
            fprintf(stderr, "quotagate: store: reached again; what was "
                    "admitted in fallback is charged\n");
        }
    }
}

qg__keeper *qg__keeper_new(qg_server *s)
{
    qg__keeper *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->s = s;
    k->tail = &k->settles;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (pthread_create(&k->th, NULL, keeper_main, k) != 0) {
        pthread_cond_destroy(&k->cv);
        pthread_mutex_destroy(&k->mu);
        free(k);
        return NULL;
    }
    return k;
}

void qg__keeper_report(qg__keeper *k, int rc)
{
    qg_server *s = k->s;
    atomic_fetch_add(&s->store_reports, 1);
    if (rc == QG_ESTATE) {
        if (!atomic_exchange(&s->store_lost, 1))
            fprintf(stderr, "quotagate: store: it lost its data\n");
    } else if (!atomic_exchange(&s->store_down, 1)) {
        fprintf(stderr, "quotagate: store: %s does not answer (%s): %s\n",
                qg_store_name(s->store), qg_store_redis_error(s->store),
                qg_engine_rules(s->engine)->store.down == QG_DOWN_CLOSED
                    ? "refusing (store.down: closed)"
                    : "deciding locally with conservative limits");
    }
    pthread_mutex_lock(&k->mu);
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

int qg__keeper_hold_settle(qg__keeper *k, const qg__settle *st)
{
    held_settle *h;
    pthread_mutex_lock(&k->mu);
    if (k->nsettles >= MAX_SETTLES || !(h = malloc(sizeof *h))) {
        pthread_mutex_unlock(&k->mu);
        return QG_EFULL;
    }
    h->st = *st;
    h->unknown = 0;
    /* the copy's strings point into its own buffers */
    h->st.req.request_id = h->st.rid_buf;
    if (st->req.subject)
        h->st.req.subject = h->st.subject_buf;
    if (st->row_subject)
        h->st.row_subject = h->st.row_subject_buf;
    if (st->detail)
        h->st.detail = h->st.detail_buf;
    if (st->model)
        h->st.model = h->st.model_buf;
    h->next = NULL;
    *k->tail = h;
    k->tail = &h->next;
    k->nsettles++;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    return QG_OK;
}

int qg__keeper_hold_void(qg__keeper *k, const char *request_id,
                         const char *subject, int64_t now_ms)
{
    held_settle *h;
    if (!request_id || !*request_id)
        return QG_OK;                /* no id: nothing to find */
    pthread_mutex_lock(&k->mu);
    if (k->nsettles >= MAX_SETTLES || !(h = calloc(1, sizeof *h))) {
        pthread_mutex_unlock(&k->mu);
        return QG_EFULL;
    }
    h->unknown = 1;
    snprintf(h->st.rid_buf, sizeof h->st.rid_buf, "%s", request_id);
    h->st.req.request_id = h->st.rid_buf;
    if (subject && *subject) {
        snprintf(h->st.subject_buf, sizeof h->st.subject_buf, "%s", subject);
        h->st.req.subject = h->st.subject_buf;
    }
    h->st.req.status = QG_SETTLE_CANCELLED;
    h->st.req.no_charge = 1;
    h->st.now_ms = now_ms;
    *k->tail = h;
    k->tail = &h->next;
    k->nsettles++;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    return QG_OK;
}

void qg__keeper_free(qg__keeper *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->th, NULL);
    while (k->settles) {
        held_settle *h = k->settles;
        k->settles = h->next;
        fprintf(stderr, "quotagate: store: at stop, the settle of %s had not "
                "reached the store (its reservation stands until its lease "
                "ends)\n", h->st.req.request_id);
        free(h);
    }
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mu);
    free(k);
}
