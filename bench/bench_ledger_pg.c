/* bench_ledger_pg.c - the PostgreSQL ledger's write_batch, the ways of
 * sending a batch side by side (docs/ledger-postgresql.md): one
 * statement of arrays per kind of row (unnest), one prepared statement
 * per row in libpq's pipeline mode, and the default that picks between
 * them by the number of rows, for batches of 1, 16, 256 and 4096 rows,
 * on a PostgreSQL 15 the bench starts on the loopback
 * (tests/support/pgproc.h: fsync and synchronous_commit on, so each
 * batch's commit waits for its WAL flush, as in production).
 *
 * Two tables: durable (each commit waits for its WAL flush), then the
 * statements' own cost (ASYNC mode: the writer's session runs at
 * synchronous_commit off, so the flush's noise on a shared disk is out).
 * For each batch size, in a fresh database, every round measures every
 * way (the order alternating from round to round, so neither always
 * runs on the warmer table): first N new rows as whole rows (inserts:
 * every check's row), then the same N as settles (updates of their
 * columns).  Printed: rows/s, median of the rounds (min-max).
 * Environment: QG_BENCH_ROUNDS (3), QG_BENCH_PG_SCALE (100: percent of
 * the default row counts, 1,000 / 8,000 / 65,536 / 204,800).  Times from
 * clock_gettime(CLOCK_MONOTONIC); rates are doubles for printing only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quotagate.h"
#include "ledger_pg.h"
#include "pgproc.h"
#include "bench_util.h"

#define MAX_ROUNDS 15
#define NWAYS 3

static void row(int round, int mode, long i, int settle, qg_ledger_row *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->request_id, sizeof r->request_id, "r%d-m%d-%08ld", round,
             mode, i);
    snprintf(r->subject, sizeof r->subject, "user%ld", i % 1000);
    if (settle) {
        r->settle_only = 1;
        r->status = QG_ROW_COMPLETED;
        r->input_tokens = 1200;
        r->output_tokens = 350;
        r->weight_milli = 2750;
        r->settled_ms = 1780000000000LL + i + 900;
        r->headroom_milli = -1;
        return;
    }
    strcpy(r->org, "acme");
    strcpy(r->plan, "max20");
    strcpy(r->rules_version, "2026-11-01");
    strcpy(r->weights_version, "w1");
    strcpy(r->model, "standard");
    r->decision = 1;
    r->status = QG_ROW_RESERVED;
    r->estimated = 1;
    r->input_tokens = 1200;
    r->output_tokens = 4096;
    r->reserved_milli = 22000;
    r->weight_milli = 22000;
    r->created_ms = 1780000000000LL + i;
    r->headroom_milli = -1;
}

/* Write n rows in batches of `batch`; rows/s, or -1 on a failure. */
static double run(void *b, qg__ledger_item *it, int round, int mode,
                  long n, int batch, int settle)
{
    char why[512];
    double t0 = now_s();
    for (long done = 0; done < n;) {
        int k = n - done < batch ? (int)(n - done) : batch;
        for (int j = 0; j < k; j++) {
            memset(&it[j], 0, sizeof it[j]);
            row(round, mode, done + j, settle, &it[j].row);
        }
        if (qg__ledger_postgresql.rows->write_batch(b, it, (size_t)k, NULL,
                                                   why, sizeof why)) {
            fprintf(stderr, "write_batch: %s\n", why);
            return -1;
        }
        for (int j = 0; j < k; j++)
            if (it[j].refused) {
                fprintf(stderr, "a row was refused\n");
                return -1;
            }
        done += k;
    }
    return (double)n / (now_s() - t0);
}

/* One table: every batch size, every way, `rounds` rounds.  0 or -1. */
static int table(pgproc *srv, const qg_ledger_opts *o, const char *title,
                 int rounds, long scale, qg__ledger_item *it)
{
    static const int batches[4] = {1, 16, 256, 4096};
    static const long rows[4] = {1000, 8000, 65536, 204800};
    static const char *const names[NWAYS] = {
        "auto (the default)", "arrays (unnest)", "pipeline (row by row)"};
    static const qg__pg_write_mode ways[NWAYS] = {
        QG_PG_WRITE_AUTO, QG_PG_WRITE_ARRAYS, QG_PG_WRITE_PIPELINE};
    printf("\n%s: rows/s, median of %d rounds (min-max)\n", title, rounds);
    printf("%6s %-22s %8s %26s %26s\n", "batch", "way", "rows",
           "whole rows (insert)", "settles (update)");
    for (int bi = 0; bi < 4; bi++) {
        double r[NWAYS][2][MAX_ROUNDS];
        long n = rows[bi] * scale / 100;
        char dbname[64], url[256], err[512];
        void *b;
        if (n < batches[bi])
            n = batches[bi];
        if (pgproc_createdb(srv, dbname, sizeof dbname) != 0) {
            fprintf(stderr, "createdb: %s\n", srv->why);
            return -1;
        }
        pgproc_url(srv, dbname, url, sizeof url);
        if (!(b = qg__ledger_postgresql.open(url, o, err, sizeof err))) {
            fprintf(stderr, "%s\n", err);
            return -1;
        }
        for (int round = 0; round < rounds; round++)
            for (int k = 0; k < NWAYS; k++) {
                int m = (round + k) % NWAYS;
                qg__pg_set_write_mode(b, ways[m]);
                r[m][0][round] = run(b, it, round, m, n, batches[bi], 0);
                r[m][1][round] = run(b, it, round, m, n, batches[bi], 1);
                if (r[m][0][round] < 0 || r[m][1][round] < 0) {
                    qg__ledger_postgresql.close(b);
                    return -1;
                }
            }
        qg__ledger_postgresql.close(b);
        for (int m = 0; m < NWAYS; m++) {
            char cell[2][64];
            for (int kind = 0; kind < 2; kind++) {
                qsort(r[m][kind], (size_t)rounds, sizeof(double),
                      cmp_double);
                snprintf(cell[kind], sizeof cell[kind], "%.0f (%.0f-%.0f)",
                         r[m][kind][rounds / 2], r[m][kind][0],
                         r[m][kind][rounds - 1]);
            }
            printf("%6d %-22s %8ld %26s %26s\n", batches[bi], names[m], n,
                   cell[0], cell[1]);
        }
        fflush(stdout);
    }
    return 0;
}

int main(void)
{
    const qg_ledger_opts durable = {.sync = QG_LEDGER_DURABLE,
                                    .flush_ms = 100, .max_queue = 65536,
                                    .max_batch = 4096,
                                    .busy_timeout_ms = 5000};
    const qg_ledger_opts async = {.sync = QG_LEDGER_ASYNC, .flush_ms = 100,
                                  .max_queue = 65536, .max_batch = 4096,
                                  .busy_timeout_ms = 5000};
    const char *e = getenv("QG_BENCH_ROUNDS");
    int rounds = e ? atoi(e) : 3, rc;
    long scale = getenv("QG_BENCH_PG_SCALE")
                     ? atol(getenv("QG_BENCH_PG_SCALE"))
                     : 100;
    qg__ledger_item *it = calloc(4096, sizeof *it);
    pgproc srv;
    if (rounds < 1 || rounds > MAX_ROUNDS || scale < 1 || !it) {
        fprintf(stderr, "QG_BENCH_ROUNDS 1..%d, QG_BENCH_PG_SCALE >= 1\n",
                MAX_ROUNDS);
        free(it);
        return 2;
    }
    if (!pgproc_bindir()) {
        fprintf(stderr, "bench_ledger_pg: PostgreSQL binaries not found "
                "(QG_PG_BIN or /usr/lib/postgresql/15/bin)\n");
        free(it);
        return 2;
    }
    if (pgproc_start(&srv) != 0) {
        fprintf(stderr, "bench_ledger_pg: %s\n", srv.why);
        free(it);
        return 2;
    }
    printf("PostgreSQL ledger write_batch (server: fsync on, "
           "synchronous_commit on)\n");
    rc = table(&srv, &durable, "durable: each commit waits for its WAL "
               "flush (as a settle does)", rounds, scale, it);
    if (rc == 0)
        rc = table(&srv, &async, "statement cost: ASYNC mode, the writer's "
                   "session at synchronous_commit off (no flush wait)",
                   rounds, scale, it);
    pgproc_destroy(&srv);
    free(it);
    return rc ? 1 : 0;
}
