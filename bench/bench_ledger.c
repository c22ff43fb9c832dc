/* bench_ledger.c - the SQLite ledger's throughput (`make bench`).
 *
 *  1. durable, 64 threads, each submitting one row and waiting for its
 *     `done` before the next (a settle acked only after fsync): rows/s,
 *     commits/s and rows per commit - what group commit buys;
 *  2. durable, one thread submitting 200k rows with callbacks, pipelined
 *     (submit refuses with QG_EFULL when the queue is full: it waits);
 *  3. the same in ASYNC mode;
 *  4. scan of 1M rows (the restart path that rebuilds counters): rows/s;
 *  5. on the same rows, qg__ledger_get of request ids the ledger does not
 *     hold (what every check of a new id costs: the server looks an id
 *     the counters do not remember up, src/server/reqid.c), with the
 *     writer idle and with one row submitted per 8 lookups: us/lookup;
 *     without the id filter, then with it (opts.id_filter, as serve
 *     opens the ledger), and how long the open reading every id took.
 * The database lives in a fresh directory under $QG_BENCH_DIR (default
 * /var/tmp: a real disk, not tmpfs, so fsync costs what it costs).
 * Environment: QG_BENCH_THREADS (64), QG_BENCH_WAIT_ROWS (50000 rows for
 * workload 1), QG_BENCH_PIPE_ROWS (200000), QG_BENCH_SCAN_ROWS (1000000).
 * Times from clock_gettime(CLOCK_MONOTONIC); rates are doubles for
 * printing only. */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "quotagate.h"
#include "ledger.h"
#include "bench_util.h"

/* NAME as a number (0 included) when set, else dflt. */
static long env_long_any(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

static char g_dir[256];

static void db_path(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s.db", g_dir, name);
}

static void db_remove(const char *path)
{
    char p[512];
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
}

static qg_ledger *open_or_die(const char *path, const qg_ledger_opts *o)
{
    char err[512];
    qg_ledger *l = qg__ledger_open(path, o, err, sizeof err);
    if (!l) {
        fprintf(stderr, "bench_ledger: %s\n", err);
        exit(1);
    }
    return l;
}

static void fill_row(qg_ledger_row *r, long i, int64_t base_ms)
{
    memset(r, 0, sizeof *r);
    snprintf(r->request_id, sizeof r->request_id,
             "0f3c9a1e-7b2d-4c55-9e1a-%012ld", i);
    snprintf(r->subject, sizeof r->subject, "user-%ld", i % 100000);
    snprintf(r->org, sizeof r->org, "org-%ld", i % 1000);
    strcpy(r->plan, "max20");
    strcpy(r->rules_version, "2026-11-01");
    strcpy(r->weights_version, "w1");
    strcpy(r->model, "standard");
    r->decision = i % 20 == 0 ? 2 : 1;
    r->status = 2;
    r->input_tokens = 1200 + i % 4000;
    r->output_tokens = 300 + i % 900;
    r->reserved_milli = 9000 + i % 5000;
    r->weight_milli = 8000 + i % 5000;
    r->created_ms = base_ms + i;
    r->settled_ms = base_ms + i + 2000;
}

static void print_stats(const char *what, long rows, double secs,
                        qg_ledger_stats *st)
{
    printf("%-34s %9.0f rows/s  %7.0f commits/s  %6.1f rows/commit  "
           "commit avg %.2f ms max %.2f ms  errors %llu\n",
           what, (double)rows / secs, (double)st->commits / secs,
           st->commits ? (double)st->rows_written / (double)st->commits : 0,
           st->commits ? (double)st->commit_us_sum / (double)st->commits /
                             1000.0 : 0,
           (double)st->commit_us_max / 1000.0,
           (unsigned long long)st->errors);
}

/* ------------------------------------------- 1. threads waiting on done */

typedef struct waiter {
    qg_ledger *l;
    sem_t sem;
    long first, n;
    int rc;
} waiter;

static void post_done(void *arg, int rc)
{
    waiter *w = arg;
    if (rc != 0)
        w->rc = rc;
    sem_post(&w->sem);
}

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    qg_ledger_row r;
    long i;
    for (i = 0; i < w->n; i++) {
        fill_row(&r, w->first + i, 1780000000000LL);
        while (qg__ledger_submit(w->l, &r, post_done, w) == QG_EFULL)
            usleep(100);
        while (sem_wait(&w->sem) != 0)
            ;
    }
    return NULL;
}

static void bench_waiters(int nthreads, long rows)
{
    char path[300];
    qg_ledger *l;
    qg_ledger_stats st;
    waiter *w = calloc((size_t)nthreads, sizeof *w);
    pthread_t *t = calloc((size_t)nthreads, sizeof *t);
    double t0, secs;
    char what[64];
    int i;

    db_path("waiters", path, sizeof path);
    l = open_or_die(path, NULL);
    t0 = now_s();
    for (i = 0; i < nthreads; i++) {
        w[i].l = l;
        w[i].first = (long)i * (rows / nthreads);
        w[i].n = rows / nthreads;
        sem_init(&w[i].sem, 0, 0);
        pthread_create(&t[i], NULL, waiter_main, &w[i]);
    }
    for (i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    secs = now_s() - t0;
    qg__ledger_stats_get(l, &st);
    snprintf(what, sizeof what, "durable, %d threads wait each", nthreads);
    print_stats(what, (rows / nthreads) * nthreads, secs, &st);
    qg__ledger_close(l);
    for (i = 0; i < nthreads; i++)
        sem_destroy(&w[i].sem);
    free(w);
    free(t);
    db_remove(path);
}

/* --------------------------------------------- 2, 3. pipelined submits */

static atomic_long g_done;

static void count_done(void *arg, int rc)
{
    (void)arg;
    (void)rc;
    atomic_fetch_add(&g_done, 1);
}

static void bench_pipelined(qg_ledger_sync sync, long rows, const char *name,
                            int keep)
{
    char path[300], what[64];
    qg_ledger_opts o = { .sync = sync, .flush_ms = 100 };
    qg_ledger *l;
    qg_ledger_stats st;
    qg_ledger_row r;
    double t0, secs;
    long i;

    db_path(name, path, sizeof path);
    db_remove(path);
    l = open_or_die(path, &o);
    atomic_store(&g_done, 0);
    t0 = now_s();
    for (i = 0; i < rows; i++) {
        fill_row(&r, i, 1780000000000LL);
        while (qg__ledger_submit(l, &r, count_done, NULL) == QG_EFULL)
            usleep(200);
    }
    while (atomic_load(&g_done) < rows)
        usleep(200);
    if (sync == QG_LEDGER_ASYNC) {   /* wait for the rows to be written */
        do {
            qg__ledger_stats_get(l, &st);
            if (st.rows_written < (uint64_t)rows)
                usleep(200);
        } while (st.rows_written < (uint64_t)rows);
    }
    secs = now_s() - t0;
    qg__ledger_stats_get(l, &st);
    snprintf(what, sizeof what, "%s, 1 thread pipelined",
             sync == QG_LEDGER_DURABLE ? "durable" : "async");
    print_stats(what, rows, secs, &st);
    qg__ledger_close(l);
    if (!keep)
        db_remove(path);
}

/* ----------------------------------------------------------- 4. scan */

typedef struct scan_acc {
    long n;
    int64_t weight;
} scan_acc;

static int scan_fn(const qg_ledger_row *r, void *ud)
{
    scan_acc *a = ud;
    a->n++;
    a->weight += r->weight_milli;
    return 0;
}

static void bench_scan(long rows)
{
    char path[300];
    qg_ledger *l;
    scan_acc a;
    double t0, secs;
    int rep;

    printf("filling %ld rows for the scan...\n", rows);
    bench_pipelined(QG_LEDGER_ASYNC, rows, "scan", 1);
    db_path("scan", path, sizeof path);
    l = open_or_die(path, NULL);
    for (rep = 0; rep < 3; rep++) {
        memset(&a, 0, sizeof a);
        t0 = now_s();
        if (qg__ledger_scan(l, 0, scan_fn, &a) != 0) {
            fprintf(stderr, "bench_ledger: scan failed\n");
            exit(1);
        }
        secs = now_s() - t0;
        printf("scan of %ld rows (%ld allowed), pass %d: %.3f s, "
               "%.0f rows/s\n", rows, a.n, rep + 1, secs,
               (double)a.n / secs);
    }
    memset(&a, 0, sizeof a);
    t0 = now_s();
    qg__ledger_scan(l, 1780000000000LL + rows / 2, scan_fn, &a);
    secs = now_s() - t0;
    printf("scan of the newer half: %ld rows, %.3f s, %.0f rows/s\n", a.n,
           secs, (double)a.n / secs);
    for (rep = 0; rep < 4; rep++) {
        const long k = 200000;
        qg_ledger_row got, w;
        char id[64];
        if (rep == 2) {          /* again, with the id filter */
            qg_ledger_opts fo = { .id_filter = 1 };
            qg__ledger_close(l);
            t0 = now_s();
            l = open_or_die(path, &fo);
            printf("open reading %ld request ids into the filter: %.3f s\n",
                   rows + k / 8, now_s() - t0);
        }
        t0 = now_s();
        for (long i = 0; i < k; i++) {
            if (rep % 2 == 1 && i % 8 == 0) {
                fill_row(&w, rows + (rep / 2) * k + i, 1780000000000LL);
                qg__ledger_submit(l, &w, NULL, NULL);
            }
            snprintf(id, sizeof id, "absent-%d-%ld", rep, i);
            if (qg__ledger_get(l, id, &got) != QG_ENOTFOUND) {
                fprintf(stderr, "bench_ledger: lookup failed\n");
                exit(1);
            }
        }
        secs = now_s() - t0;
        printf("lookup of an absent request id among %ld rows, %s, %s: "
               "%.2f us\n", rows, rep >= 2 ? "id filter" : "no filter",
               rep % 2 ? "1 row written per 8 lookups" : "writer idle",
               secs / k * 1e6);
    }
    qg__ledger_close(l);
    db_remove(path);
}

int main(void)
{
    const char *base = getenv("QG_BENCH_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/qgbench.XXXXXX",
             base && *base ? base : "/var/tmp");
    if (!mkdtemp(g_dir)) {
        perror("bench_ledger: mkdtemp");
        return 1;
    }
    printf("bench_ledger: SQLite %s, databases in %s\n", "WAL", g_dir);
    bench_waiters((int)env_long_any("QG_BENCH_THREADS", 64),
                  env_long_any("QG_BENCH_WAIT_ROWS", 50000));
    bench_pipelined(QG_LEDGER_DURABLE, env_long_any("QG_BENCH_PIPE_ROWS", 200000),
                    "pipe", 0);
    bench_pipelined(QG_LEDGER_ASYNC, env_long_any("QG_BENCH_PIPE_ROWS", 200000),
                    "async", 0);
    bench_scan(env_long_any("QG_BENCH_SCAN_ROWS", 1000000));
    rmdir(g_dir);
    return 0;
}
