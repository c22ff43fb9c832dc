/* ledger_sqlite_checkpoint.c - the WAL's checkpoints on a thread of
 * their own, off the writer's (ledger_sqlite.h).
 *
 * SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL
 * past 1,000 pages: the committing thread copies the pages into the
 * database file and fsyncs it before the COMMIT returns.  On the writer's
 * connection that COMMIT is a batch whose settles are waiting for it, so
 * every few hundred batches a batch took a checkpoint's time more (the
 * check+settle p99 of bench/http_bench.sh went from 10 ms to 45-85 ms in
 * some runs).  Here the writer's connection has its own WAL hook instead:
 * every CKPT_FRAMES new frames it wakes the checkpointer, whose
 * connection runs a PASSIVE checkpoint (it copies what readers allow,
 * never waits for the writer, and the writer never waits for it).  At
 * HARD_FRAMES the writer checkpoints in its COMMIT (on_wal), so the WAL
 * stays bounded.  The checkpointer also runs once a second. */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

#define CKPT_FRAMES 1000          /* SQLite's own default threshold */
#define HARD_FRAMES 8000          /* ~32 MB of 4 KB pages */

/* After each of the writer's commits, on its thread: frames is the WAL's
 * length.  The WAL starts over from its beginning only at a write that
 * finds every frame copied, which a checkpoint running beside a busy
 * writer rarely leaves; so at HARD_FRAMES the writer checkpoints itself
 * (what is left to copy is what arrived since the checkpointer's last
 * run) and the WAL starts over at its next write. */
static int on_wal(void *ud, sqlite3 *db, const char *name, int frames)
{
    qg__sq_ckpt *c = ud;
    if (frames < c->woken_at)
        c->woken_at = 0;                 /* the WAL started over */
    if (frames >= HARD_FRAMES) {
        (void)sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE,
                                        NULL, NULL);
        c->woken_at = 0;
        return SQLITE_OK;
    }
    if (frames - c->woken_at >= CKPT_FRAMES) {
        c->woken_at = frames;
        pthread_mutex_lock(&c->mu);
        if (!c->pending) {
            c->pending = 1;
            pthread_cond_signal(&c->cv);
        }
        pthread_mutex_unlock(&c->mu);
    }
    return SQLITE_OK;
}

static void *ckpt_main(void *arg)
{
    qg__sq_ckpt *c = arg;
    pthread_setname_np(pthread_self(), "qg-checkpoint");
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (!c->pending) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT &&
                !c->stop)
                c->pending = 1;          /* once a second in any case */
            continue;
        }
        c->pending = 0;
        pthread_mutex_unlock(&c->mu);
        (void)sqlite3_wal_checkpoint_v2(c->db, NULL,
                                        SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int qg__sq_ckpt_start(qg__sq_ckpt *c, sqlite3 *writer, sqlite3 *own)
{
    c->db = own;
    c->pending = c->stop = c->woken_at = 0;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->ready = 1;
    if (pthread_create(&c->th, NULL, ckpt_main, c) != 0)
        return QG_ENOMEM;      /* the writer keeps SQLite's own checkpoints */
    c->started = 1;
    sqlite3_wal_hook(writer, on_wal, c);
    return QG_OK;
}

void qg__sq_ckpt_stop(qg__sq_ckpt *c, sqlite3 *writer)
{
    if (!c->ready)
        return;
    if (c->started) {
        if (writer)
            sqlite3_wal_autocheckpoint(writer, CKPT_FRAMES);  /* SQLite's own */
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
        c->started = 0;
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    c->ready = 0;
}
