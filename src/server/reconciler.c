/* reconciler.c - the gateway's reconciliations, off the serving threads
 * (PRODUCT.md 5.2, docs/reconcile.md).
 *
 * One thread of its own runs them: every `reconcile.every` of the rules in
 * force (none when the rules have no reconcile: block), repairing when
 * `reconcile.repair` says so, and each POST /v1/admin/reconcile, whose
 * request is held meanwhile (its worker serves other connections) and
 * answered on its worker (qg__http_post), as the reloader does.  A run
 * reads the store synchronously (for Redis on the store's own lane), so
 * no worker's event loop waits for it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "json_out.h"
#include "rules.h"
#include "server.h"

typedef struct job {
    qg_server *s;
    qg_http_req *r;
    char subject[256];
    int has_subject, repair;
    int rc;
    char err[1024];
    char *json;                      /* the answer */
    struct job *next;
} job;

struct qg__reconciler {
    qg_server *s;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *jobs, **tail;
    int stop;
};

/* On the request's worker. */
static void answer(void *arg)
{
    job *j = arg;
    if (j->rc == QG_OK && j->json) {
        qg__reply_json(j->s, j->r, 200, j->json, NULL, 0);
        j->json = NULL;
    } else if (j->rc == QG_OK || j->rc == QG_ENOMEM) {
        qg__reply_error(j->s, j->r, 503, "overloaded",
                        "out of memory while reconciling");
    } else if (j->rc == QG_ENOSUBJECT) {
        qg__reply_error(j->s, j->r, 404, "unknown_subject", j->err);
    } else if (j->rc == QG_ESTORE || j->rc == QG_ESTATE) {
        qg__reply_error(j->s, j->r, 503, "store_unavailable", j->err);
    } else {
        qg__reply_error(j->s, j->r, 503, "reconcile_failed", j->err);
    }
    free(j->json);
    free(j);
}

static void run_job(qg_server *s, job *j)
{
    qg_reconcile_report *rep = NULL;
    j->rc = qg__server_reconcile(s, j->has_subject ? j->subject : NULL,
                                 j->repair, &rep, j->err, sizeof j->err);
    if (j->rc == QG_OK)
        j->json = qg_reconcile_json(rep);
    qg_reconcile_report_free(rep);
}

static void run_periodic(qg_server *s, int repair)
{
    qg_reconcile_report *rep = NULL;
    char err[1024];
    int rc = qg__server_reconcile(s, NULL, repair, &rep, err, sizeof err);
    if (rc != QG_OK)
        fprintf(stderr, "quotagate: reconcile: could not run: %s\n", err);
    else
        fprintf(stderr, "quotagate: reconcile: %llu windows of %llu "
                "subjects and %llu orgs checked in %lld ms, %d drifted\n",
                (unsigned long long)rep->checked,
                (unsigned long long)rep->subjects,
                (unsigned long long)rep->orgs, (long long)rep->duration_ms,
                rep->ndrifted);
    qg_reconcile_report_free(rep);
}

static void deadline_in(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void *reconciler_main(void *arg)
{
    struct qg__reconciler *rc = arg;
    qg_server *s = rc->s;
    struct timespec next;
    int64_t every = qg_engine_rules(s->engine)->reconcile.every_ms;
    int timed = every > 0;

    if (timed)
        deadline_in(&next, every);
    pthread_mutex_lock(&rc->mu);
    for (;;) {
        job *j;
        int due = 0;
        while (!rc->stop && !rc->jobs && !due) {
            if (!timed) {
                pthread_cond_wait(&rc->cv, &rc->mu);
            } else if (pthread_cond_timedwait(&rc->cv, &rc->mu, &next) != 0) {
                due = 1;
            }
        }
        if (rc->stop)
            break;
        if ((j = rc->jobs)) {
            rc->jobs = j->next;
            if (!rc->jobs)
                rc->tail = &rc->jobs;
        }
        pthread_mutex_unlock(&rc->mu);
        if (j) {
            run_job(s, j);
            if (qg__http_post(s->http, j->r->worker, answer, j) != 0) {
                free(j->json);       /* stopping: the server releases r */
                free(j);
            }
        } else {
            const qg_reconcile_spec *sp =
                &qg_engine_rules(s->engine)->reconcile;
            run_periodic(s, sp->repair);
        }
        /* the period of the rules in force now (a reload may change it) */
        every = qg_engine_rules(s->engine)->reconcile.every_ms;
        if (due || (every > 0 && !timed))
            deadline_in(&next, every);
        timed = every > 0;
        pthread_mutex_lock(&rc->mu);
    }
    pthread_mutex_unlock(&rc->mu);
    return NULL;
}

struct qg__reconciler *qg__reconciler_new(qg_server *s)
{
    struct qg__reconciler *rc = calloc(1, sizeof *rc);
    pthread_condattr_t ca;
    if (!rc)
        return NULL;
    rc->s = s;
    rc->tail = &rc->jobs;
    pthread_mutex_init(&rc->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rc->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&rc->th, NULL, reconciler_main, rc) != 0) {
        pthread_cond_destroy(&rc->cv);
        pthread_mutex_destroy(&rc->mu);
        free(rc);
        return NULL;
    }
    return rc;
}

int qg__reconciler_request(struct qg__reconciler *rc, qg_http_req *r,
                           const char *subject, int repair)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return QG_ENOMEM;
    j->s = rc->s;
    j->r = r;
    j->repair = repair;
    if (subject) {
        j->has_subject = 1;
        snprintf(j->subject, sizeof j->subject, "%s", subject);
    }
    pthread_mutex_lock(&rc->mu);
    *rc->tail = j;
    rc->tail = &j->next;
    pthread_cond_signal(&rc->cv);
    pthread_mutex_unlock(&rc->mu);
    return QG_OK;
}

void qg__reconciler_free(struct qg__reconciler *rc)
{
    job *j;
    if (!rc)
        return;
    pthread_mutex_lock(&rc->mu);
    rc->stop = 1;
    pthread_cond_signal(&rc->cv);
    pthread_mutex_unlock(&rc->mu);
    pthread_join(rc->th, NULL);
    while ((j = rc->jobs)) {         /* the HTTP server releases them */
        rc->jobs = j->next;
        free(j);
    }
    pthread_cond_destroy(&rc->cv);
    pthread_mutex_destroy(&rc->mu);
    free(rc);
}
