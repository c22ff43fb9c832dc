/* reload.c - reloading the rules of a running gateway, off the serving
 * threads.
 *
 * A reload reads and compiles the whole rules file (a large file takes
 * seconds) and then swaps the engine's generation atomically
 * (qg_engine_reload).  Done on a worker thread, that worker's clients would
 * wait for it; so neither `POST /v1/admin/reload` nor SIGHUP loads
 * anything themselves: they hand the job to the reloader, one thread of
 * its own.  The admin request is held meanwhile (its worker serves other
 * connections) and answered on its worker (qg__http_post) with the outcome
 * of a load that began after the request arrived.  Requests that arrive
 * while a load runs are answered together by the next load, which reads
 * the file as it is then: each sees the file as it was at or after its
 * request, and a burst of reloads costs two loads, not one each. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>
#include "json_out.h"
#include "metrics.h"
#include "notify.h"
#include "rules.h"
#include "server.h"

/* One held admin request and, once loaded, the outcome it answers
 * (allocated when the request arrives, so that nothing needs memory
 * after the load). */
typedef struct waiter {
    qg_server *s;
    qg_http_req *r;
    int rc;
    const char *version;       /* the rules in force (generations live
                                  as long as the server) */
    char err[1024];
    struct waiter *next;
} waiter;

struct qg_reloader {
    qg_server *s;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    waiter *waiting;           /* admin requests for the next load */
    int hup;                   /* a SIGHUP asks for the next load */
    int stop;
};

int qg__server_reload(qg_server *s, char *err, size_t errcap)
{
    qg_rules *nr = NULL;
    qg__notify_cfg cfg;
    int rc;

    pthread_mutex_lock(&s->reload_mu);
    rc = qg_rules_load(s->opts.rules_path, &nr, err, errcap);
    /* the webhooks' secrets are read again: a missing one refuses it */
    if (rc == QG_OK && qg__notify_cfg_load(nr, &cfg, err, errcap) != 0) {
        qg_rules_free(nr);
        rc = QG_ERULES;
    }
    if (rc == QG_OK) {
        rc = qg_engine_reload(s->engine, nr, err, errcap);
        if (rc != QG_OK) {
            qg_rules_free(nr);
        } else {
            qg__metrics_rules(s->metrics, qg_engine_rules(s->engine));
            qg__notify_set_cfg(s->notify, &cfg);
        }
    }
    OPENSSL_cleanse(&cfg, sizeof cfg);
    pthread_mutex_unlock(&s->reload_mu);
    if (rc == QG_OK)
        atomic_fetch_add(&s->reloads, 1);
    else
        atomic_fetch_add(&s->reload_failures, 1);
    return rc;
}

/* On the request's worker. */
static void answer(void *arg)
{
    waiter *a = arg;
    if (a->rc == QG_OK)
        qg__reply_json(a->s, a->r, 200,
                      qg__json_dump_steal(json_pack(
                          "{s:s, s:s}", "status", "reloaded",
                          "rules_version", a->version)),
                      NULL, 0);
    else if (a->rc == QG_ENOMEM)
        qg__reply_error(a->s, a->r, 503, "overloaded",
                       "out of memory while reloading the rules");
    else
        qg__reply_error(a->s, a->r, 400, "invalid_rules", a->err);
    free(a);
}

static void *reloader_main(void *arg)
{
    qg_reloader *rl = arg;
    qg_server *s = rl->s;
    for (;;) {
        waiter *w;
        int hup, rc;
        char err[1024];
        const char *version;

        pthread_mutex_lock(&rl->mu);
        while (!rl->stop && !rl->waiting && !rl->hup)
            pthread_cond_wait(&rl->cv, &rl->mu);
        if (rl->stop) {
            pthread_mutex_unlock(&rl->mu);
            return NULL;
        }
        w = rl->waiting;
        hup = rl->hup;
        rl->waiting = NULL;
        rl->hup = 0;
        pthread_mutex_unlock(&rl->mu);

        err[0] = '\0';
        rc = qg__server_reload(s, err, sizeof err);
        version = qg_rules_version(qg_engine_rules(s->engine));
        if (rc == QG_OK)
            fprintf(stderr, "quotagate: rules reloaded (version %s, %s)\n",
                    version, !w ? "SIGHUP" : hup ? "SIGHUP and admin API"
                                                 : "admin API");
        else
            fprintf(stderr, "quotagate: reload refused, old rules keep "
                    "serving: %s\n", err[0] ? err : qg_strerror(rc));
        while (w) {
            waiter *next = w->next;
            w->rc = rc;
            w->version = version;
            memcpy(w->err, err, sizeof w->err);
            /* A refused post means the server is stopping: the held
             * request is then released by qg__http_server_free. */
            if (qg__http_post(s->http, w->r->worker, answer, w) != 0)
                free(w);
            w = next;
        }
    }
}

qg_reloader *qg__reloader_new(qg_server *s)
{
    qg_reloader *rl = calloc(1, sizeof *rl);
    if (!rl)
        return NULL;
    rl->s = s;
    pthread_mutex_init(&rl->mu, NULL);
    pthread_cond_init(&rl->cv, NULL);
    if (pthread_create(&rl->th, NULL, reloader_main, rl) != 0) {
        pthread_cond_destroy(&rl->cv);
        pthread_mutex_destroy(&rl->mu);
        free(rl);
        return NULL;
    }
    return rl;
}

int qg__reloader_request(qg_reloader *rl, qg_http_req *r)
{
    waiter *w = NULL;
    if (r && !(w = calloc(1, sizeof *w)))
        return QG_ENOMEM;
    pthread_mutex_lock(&rl->mu);
    if (w) {
        w->s = rl->s;
        w->r = r;
        w->next = rl->waiting;
        rl->waiting = w;
    } else {
        rl->hup = 1;
    }
    pthread_cond_signal(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
    return QG_OK;
}

void qg__reloader_free(qg_reloader *rl)
{
    waiter *w;
    if (!rl)
        return;
    pthread_mutex_lock(&rl->mu);
    rl->stop = 1;
    pthread_cond_signal(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
    pthread_join(rl->th, NULL);
    /* requests never loaded for: the HTTP server releases them */
    while ((w = rl->waiting)) {
        rl->waiting = w->next;
        free(w);
    }
    pthread_cond_destroy(&rl->cv);
    pthread_mutex_destroy(&rl->mu);
    free(rl);
}
