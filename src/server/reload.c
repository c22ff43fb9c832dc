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
 * request, and a burst of reloads costs two loads, not one each.
 *
 * Versions (docs/rules.md "Versions over time"): a file with no version in
 * force now is refused.  A reload that changes the version in force so
 * that it gives a subject less (rules_diff.c) without the notice the
 * rules require (a version edited in place never has it) is applied, as
 * the operator asked, but warned about: one stderr line per change, and
 * "warnings" in the admin API's answer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>
#include "json_out.h"
#include "metrics.h"
#include "notify.h"
#include "rules.h"
#include "rules_diff.h"
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
    char warn[1024];           /* changes without notice, "" none */
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

/* The version in force now under the new rules `nr` against the one in
 * force under the engine's: QG_ERULES when none is in force; else 0,
 * writing into warn ("" when none) the changes that give less without
 * notice, "; "-separated, each also logged. */
static int reload_versions(qg_server *s, const qg_rules *nr, char *err,
                           size_t errcap, char *warn, size_t warncap)
{
    int64_t now = qg__server_now(s);
    const qg_rules *was = qg_engine_rules_at(s->engine, now);
    const qg_rules *v = qg_rules_at(nr, now);
    qg_rules_change *ch = NULL;
    char when[40];
    size_t off = 0;
    int n = 0, same;

    warn[0] = '\0';
    if (!v) {
        qg_iso8601_format(qg_rules_effective_ms(nr), when, sizeof when);
        snprintf(err, errcap, "%s: no rules version is in force now: the "
                 "first, \"%s\", takes effect at %s (keep the version in "
                 "force as the file's first document)",
                 qg_rules_path(nr), qg_rules_version(nr), when);
        return QG_ERULES;
    }
    same = strcmp(qg_rules_version(was), qg_rules_version(v)) == 0;
    if ((!same && qg__rules_notice_ok(v)) ||
        qg__rules_diff(was, v, &ch, &n) != QG_OK)
        return QG_OK;            /* announced in time (or no memory to say) */
    for (int i = 0; i < n; i++) {
        const qg_rules_change *c = &ch[i];
        char line[1024];
        if (!c->less)
            continue;
        snprintf(line, sizeof line, "version %s%s%s in force now: %s%s%s "
                 "%s%s%s: %s -> %s gives less without notice",
                 qg_rules_version(v), same ? " edited in place" : " replaces ",
                 same ? "" : qg_rules_version(was), c->plan[0] ? "plan " : "",
                 c->plan[0] ? c->plan : c->org[0] ? "org " : "",
                 c->org[0] ? c->org : "", c->kind, c->item[0] ? " " : "",
                 c->item, c->from, c->to);
        fprintf(stderr, "quotagate: reload warning: %s\n", line);
        if (off < warncap)
            off += (size_t)snprintf(warn + off, warncap - off, "%s%s",
                                    off ? "; " : "", line);
    }
    free(ch);
    return QG_OK;
}

int qg__server_reload(qg_server *s, char *err, size_t errcap)
{
    char warn[1024];
    return qg__server_reload_warn(s, err, errcap, warn, sizeof warn);
}

int qg__server_reload_warn(qg_server *s, char *err, size_t errcap,
                           char *warn, size_t warncap)
{
    qg_rules *nr = NULL;
    qg__notify_cfg cfg;
    int rc;

    warn[0] = '\0';
    pthread_mutex_lock(&s->reload_mu);
    rc = qg_rules_load(s->opts.rules_path, &nr, err, errcap);
    if (rc == QG_OK &&
        (rc = reload_versions(s, nr, err, errcap, warn, warncap)) != QG_OK) {
        qg_rules_free(nr);
        nr = NULL;
    }
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
    if (a->rc == QG_OK && a->warn[0])
        qg__reply_json(a->s, a->r, 200,
                      qg__json_dump_steal(json_pack(
                          "{s:s, s:s, s:[s]}", "status", "reloaded",
                          "rules_version", a->version, "warnings",
                          a->warn)),
                      NULL, 0);
    else if (a->rc == QG_OK)
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
        char err[1024], warn[1024];
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
        rc = qg__server_reload_warn(s, err, sizeof err, warn, sizeof warn);
        version = qg_rules_version(qg_engine_rules_at(s->engine,
                                                      qg__server_now(s)));
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
            memcpy(w->warn, warn, sizeof w->warn);
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
