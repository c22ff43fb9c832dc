/* ledger_scan_piped.c - qg__ledger_scan with the reading on a thread of
 * its own (ledger.h, qg__ledger_scan_piped): what a restart's rebuild
 * uses, so that decoding the rows (the backend's scan) and applying them
 * (the caller's fn) run on two cores at once instead of one after the
 * other.  The rows keep their order: the reader fills batches of BATCH
 * rows into a ring of NBUF buffers, the caller's thread empties them in
 * the order they were filled, and the reader waits while every buffer is
 * full.  When fn stops the scan (a nonzero value) the reader is told, and
 * its next batch ends its scan. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quotagate.h"
#include "ledger.h"

#define BATCH 1024
#define NBUF 4

typedef struct piped {
    qg_ledger *l;
    int64_t since_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qg_ledger_row *buf[NBUF];
    size_t fill[NBUF];
    uint64_t produced, consumed;   /* batches; produced - consumed <= NBUF */
    size_t n;                      /* rows in the batch being filled */
    int done, stop, scan_rc;
} piped;

/* Hand the batch being filled over; wait for a free buffer.  1 when the
 * caller stopped the scan. */
static int publish(piped *p)
{
    int stop;
    pthread_mutex_lock(&p->mu);
    p->fill[p->produced % NBUF] = p->n;
    p->produced++;
    pthread_cond_broadcast(&p->cv);
    while (p->produced - p->consumed == NBUF && !p->stop)
        pthread_cond_wait(&p->cv, &p->mu);
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    p->n = 0;
    return stop;
}

static int take_row(const qg_ledger_row *row, void *ud)
{
    piped *p = ud;
    p->buf[p->produced % NBUF][p->n++] = *row;
    return p->n == BATCH ? publish(p) : 0;
}

static void *reader_main(void *arg)
{
    piped *p = arg;
    int rc = qg__ledger_scan(p->l, p->since_ms, take_row, p);
    if (p->n > 0)
        publish(p);
    pthread_mutex_lock(&p->mu);
    p->scan_rc = rc;
    p->done = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int qg__ledger_scan_piped(qg_ledger *l, int64_t since_ms,
                          int (*fn)(const qg_ledger_row *row, void *ud),
                          void *ud)
{
    piped p;
    pthread_t th;
    int out = 0, i;
    if (!l || !fn)
        return QG_EINVAL;
    memset(&p, 0, sizeof p);
    p.l = l;
    p.since_ms = since_ms;
    for (i = 0; i < NBUF; i++)
        if (!(p.buf[i] = malloc(BATCH * sizeof *p.buf[i])))
            goto plain;
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    if (pthread_create(&th, NULL, reader_main, &p) != 0) {
        pthread_cond_destroy(&p.cv);
        pthread_mutex_destroy(&p.mu);
        goto plain;
    }
    for (;;) {
        const qg_ledger_row *b;
        size_t n;
        pthread_mutex_lock(&p.mu);
        while (p.consumed == p.produced && !p.done)
            pthread_cond_wait(&p.cv, &p.mu);
        if (p.consumed == p.produced) {     /* done, every batch taken */
            pthread_mutex_unlock(&p.mu);
            break;
        }
        b = p.buf[p.consumed % NBUF];
        n = p.fill[p.consumed % NBUF];
        pthread_mutex_unlock(&p.mu);
        for (size_t k = 0; k < n && !out; k++)
            out = fn(&b[k], ud);
        pthread_mutex_lock(&p.mu);
        p.consumed++;
        if (out)
            p.stop = 1;
        pthread_cond_broadcast(&p.cv);
        pthread_mutex_unlock(&p.mu);
        if (out)
            break;
    }
    pthread_join(th, NULL);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
    for (i = 0; i < NBUF; i++)
        free(p.buf[i]);
    return out ? out : p.scan_rc;
plain:
    /* no memory or no thread for the reader: the same scan, unpiped */
    for (i = 0; i < NBUF; i++)
        free(p.buf[i]);
    return qg__ledger_scan(l, since_ms, fn, ud);
}
