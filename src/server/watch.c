/* watch.c - subjects that other instances create or change in a shared
 * ledger (PostgreSQL), brought into this instance's engine.
 *
 * With several gateways on one ledger, a subject created through the
 * admin API of one of them must work at all of them within a second
 * (PRODUCT.md 5.1 point 6).  The watcher is one thread of its own that
 * asks the ledger every 250 ms for the subjects updated since its last
 * look (a few seconds earlier, so that instances whose clocks disagree
 * by that much still see each other's changes; applying a subject twice
 * changes nothing) and sets them in the engine, off the serving threads.
 * Keys need no watcher: each lookup is cached for less than a second
 * (auth.c), so a key created or revoked anywhere is seen everywhere
 * within a second.  A ledger that cannot be read is asked again on the
 * next round; the last failure is logged once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server.h"

#define WATCH_EVERY_MS 250
#define WATCH_SLACK_MS 5000     /* clocks of instances may disagree */

struct qg_watcher {
    qg_server *s;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int failing;
    int64_t since_ms;           /* the next look's start */
    int64_t newest_ms;          /* the newest update seen */
};

static int apply(const char *subject, const char *plan, const char *org,
                 int64_t anchor_ms, void *ud)
{
    struct qg_watcher *w = ud;
    char err[256];
    if (qg_engine_set_subject(w->s->engine, subject, plan,
                              *org ? org : NULL, anchor_ms, err,
                              sizeof err) != QG_OK)
        fprintf(stderr, "quotagate: subject %s from the shared ledger: %s "
                "(skipped)\n", subject, err);
    return 0;
}

static void *watch_main(void *arg)
{
    struct qg_watcher *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        int64_t start = qg__server_now(w->s);
        int rc;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += WATCH_EVERY_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!w->stop &&
               pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0) {
        }
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->mu);
        rc = qg__ledger_scan_subjects_since(w->s->ledger, w->since_ms, apply,
                                            w);
        if (rc == QG_OK) {
            if (w->failing)
                fprintf(stderr, "quotagate: subjects of the shared ledger "
                        "are read again\n");
            w->failing = 0;
            w->since_ms = start - WATCH_SLACK_MS;
        } else if (!w->failing) {
            qg_ledger_stats ls;
            qg__ledger_stats_get(w->s->ledger, &ls);
            fprintf(stderr, "quotagate: cannot read the subjects of the "
                    "shared ledger (asked again every %d ms): %s\n",
                    WATCH_EVERY_MS, ls.last_read_error[0]
                                        ? ls.last_read_error
                                        : qg_strerror(rc));
            w->failing = 1;
        }
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

qg_watcher *qg__watcher_new(qg_server *s)
{
    struct qg_watcher *w = calloc(1, sizeof *w);
    pthread_condattr_t ca;
    if (!w || pthread_condattr_init(&ca) != 0) {
        free(w);
        return NULL;
    }
    w->s = s;
    w->since_ms = qg__server_now(s) - WATCH_SLACK_MS;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->th, NULL, watch_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return NULL;
    }
    return w;
}

void qg__watcher_free(qg_watcher *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}
