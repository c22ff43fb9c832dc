/* bench_history.c - the history reads of a subject with millions of
 * ledger rows (docs/benchmarks.md "History"), on SQLite and on a
 * PostgreSQL 15 the bench starts (tests/support/pgproc): the rows of one
 * subject (QG_BENCH_HISTORY_ROWS, default 5,000,000) spread evenly over
 * the 90 days before a fixed instant, three models, one in ten refused,
 * written through the ledger's own writer (ASYNC, batches of 4096: the
 * rollup's triggers run as in production), plus one other subject; then,
 * QG_BENCH_ROUNDS (20) times each, the reads the routes make:
 *   - the slots of the last 30 days and of the last 90 (what 30 and 90
 *     daily buckets read), added up as the route does;
 *   - the latest 50 rows, and 50 rows before an instant in the middle;
 *   - the first usage (the forecast's basis).
 * Printed: the write rate, and per read the median time in ms (min-max).
 * QG_BENCH_BACKEND=sqlite|postgresql|both (both).  With
 * QG_BENCH_WRITE_ROWS=N instead: what the history costs the writer, N
 * rows of 1000 subjects with schema 5 as it is, without the rollup's
 * triggers, and without them and the subject index, alternated over
 * QG_BENCH_WRITE_ROUNDS (3) rounds.  Times from
 * clock_gettime(CLOCK_MONOTONIC); doubles for printing only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "pgproc.h"
#include "bench_util.h"

#define END_MS INT64_C(1772323200000)      /* 2026-03-01T00:00:00Z */
#define DAY_MS INT64_C(86400000)
#define MAX_ROUNDS 101

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : def;
}

typedef struct sums {
    int64_t weight_milli, requests, slots;
} sums;

static int add_slot(const qg_usage_slot *s, void *ud)
{
    sums *u = ud;
    u->weight_milli += s->weight_milli;
    u->requests += s->requests;
    u->slots++;
    return 0;
}

static int count_row(const qg_ledger_row *r, void *ud)
{
    (void)r;
    (*(int *)ud)++;
    return 0;
}

static void fill(qg_ledger *l, int64_t n)
{
    static const char *const models[] = {"light", "standard", ""};
    qg_ledger_row r;
    double t0 = now_s();
    int64_t span = 90 * DAY_MS;
    memset(&r, 0, sizeof r);
    strcpy(r.plan, "p");
    strcpy(r.rules_version, "bench");
    strcpy(r.weights_version, "w1");
    r.status = QG_ROW_COMPLETED;
    r.headroom_milli = -1;
    for (int64_t i = 0; i < n + n / 100; i++) {
        int other = i >= n;
        snprintf(r.request_id, sizeof r.request_id, "b%012lld",
                 (long long)i);
        strcpy(r.subject, other ? "someone-else" : "heavy");
        strcpy(r.model, models[i % 3]);
        r.decision = i % 10 == 9 ? 2 : 1;
        r.weight_milli = r.decision == 1 ? 1000 + i % 7000 : 0;
        r.reserved_milli = r.weight_milli;
        r.created_ms = END_MS - span + (i % n) * span / n;
        while (qg__ledger_submit(l, &r, NULL, NULL) == QG_EFULL)
            usleep(1000);
    }
    while (qg__ledger_queued(l) > 0)
        usleep(10000);
    printf("  wrote %lld rows in %.1f s (%.0f rows/s, with the rollup's "
           "triggers)\n", (long long)(n + n / 100), now_s() - t0,
           (double)(n + n / 100) / (now_s() - t0));
}

static void report(const char *what, double *ms, int rounds)
{
    qsort(ms, (size_t)rounds, sizeof ms[0], cmp_double);
    printf("  %-44s %8.2f ms (%.2f-%.2f)\n", what, ms[rounds / 2], ms[0],
           ms[rounds - 1]);
}

static void measure(qg_ledger *l, int rounds)
{
    double a[MAX_ROUNDS], b[MAX_ROUNDS], c[MAX_ROUNDS], d[MAX_ROUNDS],
        e[MAX_ROUNDS];
    sums s30 = {0, 0, 0}, s90 = {0, 0, 0};
    for (int k = 0; k < rounds; k++) {
        double t;
        int n = 0;
        int64_t first = 0;
        sums u = {0, 0, 0};
        t = now_s();
        qg__ledger_slots(l, "heavy", END_MS - 30 * DAY_MS, END_MS, add_slot,
                         &u);
        a[k] = (now_s() - t) * 1e3;
        s30 = u;
        memset(&u, 0, sizeof u);
        t = now_s();
        qg__ledger_slots(l, "heavy", END_MS - 90 * DAY_MS, END_MS, add_slot,
                         &u);
        b[k] = (now_s() - t) * 1e3;
        s90 = u;
        t = now_s();
        qg__ledger_latest(l, "heavy", INT64_MAX, 50, count_row, &n);
        c[k] = (now_s() - t) * 1e3;
        if (n != 50)
            fprintf(stderr, "latest: %d rows\n", n);
        n = 0;
        t = now_s();
        qg__ledger_latest(l, "heavy", END_MS - 45 * DAY_MS, 50, count_row,
                          &n);
        d[k] = (now_s() - t) * 1e3;
        t = now_s();
        qg__ledger_first_usage(l, "heavy", &first);
        e[k] = (now_s() - t) * 1e3;
    }
    printf("  (30 days: %lld slots, %lld requests; 90 days: %lld slots, "
           "%lld requests)\n", (long long)s30.slots, (long long)s30.requests,
           (long long)s90.slots, (long long)s90.requests);
    report("slots of 30 days (30 daily buckets)", a, rounds);
    report("slots of 90 days (90 daily buckets)", b, rounds);
    report("latest 50 rows", c, rounds);
    report("50 rows before the middle (before=...)", d, rounds);
    report("first usage", e, rounds);
}

static int run(const char *name, const char *url, int64_t rows, int rounds)
{
    char err[512];
    qg_ledger_opts o = {0};
    qg_ledger *l;
    o.sync = QG_LEDGER_ASYNC;
    o.max_batch = 4096;
    o.max_queue = 65536 * 4;
    printf("%s:\n", name);
    if (!(l = qg__ledger_open(url, &o, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    fill(l, rows);
    measure(l, rounds);
    qg__ledger_close(l);
    return 0;
}

/* ------------------------------------------------- the write cost */

/* Rows/s of n rows of 1000 subjects written through the ledger (ASYNC),
 * after `drop` (SQL run on the new database first: what is taken away
 * from schema 5 to measure its cost; "" nothing). */
static double write_rate(const char *url, int64_t n, pgproc *pg,
                         const char *db, const char *path, const char *drop)
{
    char err[512];
    qg_ledger_opts o = {0};
    qg_ledger *l;
    qg_ledger_row r;
    double t0;
    o.sync = QG_LEDGER_ASYNC;
    if (!(l = qg__ledger_open(url, &o, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 0;
    }
    if (*drop) {
        char out[64];
        if (pg) {
            if (pgproc_sql(pg, db, drop, out, sizeof out) < 0)
                fprintf(stderr, "%s\n", pg->why);
        } else {
            sqlite3 *sq = NULL;
            if (sqlite3_open(path, &sq) != SQLITE_OK ||
                sqlite3_exec(sq, drop, NULL, NULL, NULL) != SQLITE_OK)
                fprintf(stderr, "%s: %s\n", drop, sqlite3_errmsg(sq));
            sqlite3_close(sq);
        }
    }
    memset(&r, 0, sizeof r);
    strcpy(r.plan, "p");
    strcpy(r.model, "standard");
    r.decision = 1;
    r.status = QG_ROW_RESERVED;
    r.headroom_milli = -1;
    t0 = now_s();
    for (int64_t i = 0; i < n; i++) {
        snprintf(r.request_id, sizeof r.request_id, "w%012lld",
                 (long long)i);
        snprintf(r.subject, sizeof r.subject, "s%lld",
                 (long long)(i % 1000));
        r.weight_milli = r.reserved_milli = 1000 + i % 5000;
        r.created_ms = END_MS - n + i;
        while (qg__ledger_submit(l, &r, NULL, NULL) == QG_EFULL)
            usleep(200);
    }
    while (qg__ledger_queued(l) > 0)
        usleep(1000);
    t0 = now_s() - t0;
    qg__ledger_close(l);
    return (double)n / t0;
}

/* Schema 5 against itself without the rollup's triggers, and without
 * them and the subject index (schema 4's work), alternated. */
static void write_cost(int pgside, int64_t n, int rounds)
{
    static const char *const names[3] = {
        "schema 5 (rollup triggers + subject index)",
        "without the triggers",
        "without the triggers and the index (schema 4)"};
    const char *drops_sq[3] = {
        "",
        "DROP TRIGGER requests_slots_insert;"
        " DROP TRIGGER requests_slots_update;",
        "DROP TRIGGER requests_slots_insert;"
        " DROP TRIGGER requests_slots_update; DROP INDEX requests_subject;"};
    const char *drops_pg[3] = {
        "",
        "DROP TRIGGER requests_slots_insert ON requests;"
        " DROP TRIGGER requests_slots_update ON requests",
        "DROP TRIGGER requests_slots_insert ON requests;"
        " DROP TRIGGER requests_slots_update ON requests;"
        " DROP INDEX requests_subject"};
    double rate[3][MAX_ROUNDS];
    pgproc pg;
    memset(&pg, 0, sizeof pg);
    if (pgside && (pgproc_start(&pg) < 0)) {
        fprintf(stderr, "PostgreSQL: %s\n", pg.why);
        return;
    }
    printf("%s: rows written/s, %lld rows of 1000 subjects, ASYNC, %d "
           "rounds alternated: median (min-max)\n",
           pgside ? "PostgreSQL 15" : "SQLite", (long long)n, rounds);
    for (int k = 0; k < rounds; k++)
        for (int v0 = 0; v0 < 3; v0++) {
            int v = (v0 + k) % 3;
            char url[600], dir[] = "/tmp/qgbhw.XXXXXX", path[300], db[64];
            if (pgside) {
                pgproc_createdb(&pg, db, sizeof db);
                pgproc_url(&pg, db, url, sizeof url);
                rate[v][k] = write_rate(url, n, &pg, db, "", drops_pg[v]);
            } else {
                if (!mkdtemp(dir))
                    return;
                snprintf(path, sizeof path, "%s/ledger.db", dir);
                snprintf(url, sizeof url, "sqlite:%s", path);
                rate[v][k] = write_rate(url, n, NULL, "", path, drops_sq[v]);
                snprintf(url, sizeof url, "rm -rf %s", dir);
                if (system(url) != 0)
                    fprintf(stderr, "could not remove %s\n", dir);
            }
        }
    for (int v = 0; v < 3; v++) {
        qsort(rate[v], (size_t)rounds, sizeof rate[v][0], cmp_double);
        printf("  %-48s %9.0f (%.0f-%.0f)\n", names[v],
               rate[v][rounds / 2], rate[v][0], rate[v][rounds - 1]);
    }
    if (pgside)
        pgproc_destroy(&pg);
}

int main(void)
{
    int64_t rows = env_int("QG_BENCH_HISTORY_ROWS", 5000000);
    int rounds = env_int("QG_BENCH_ROUNDS", 20);
    const char *which = getenv("QG_BENCH_BACKEND");
    char dir[] = "/tmp/qgbhist.XXXXXX", url[600];
    int rc = 0;
    if (rounds > MAX_ROUNDS)
        rounds = MAX_ROUNDS;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("QG_BENCH_WRITE_ROWS")) {
        /* only the write cost of the history (docs/benchmarks.md) */
        int64_t n = env_int("QG_BENCH_WRITE_ROWS", 200000);
        int wr = env_int("QG_BENCH_WRITE_ROUNDS", 3);
        if (wr > MAX_ROUNDS)
            wr = MAX_ROUNDS;
        if (!which || strcmp(which, "postgresql") != 0)
            write_cost(0, n, wr);
        if (!which || strcmp(which, "sqlite") != 0)
            write_cost(1, n, wr);
        return 0;
    }
    printf("history reads, one subject with %lld rows over 90 days, %d "
           "rounds: median (min-max)\n", (long long)rows, rounds);
    if (!which || strcmp(which, "postgresql") != 0) {
        if (!mkdtemp(dir))
            return 1;
        snprintf(url, sizeof url, "sqlite:%s/ledger.db", dir);
        rc |= run("SQLite", url, rows, rounds);
        snprintf(url, sizeof url, "rm -rf %s", dir);
        if (system(url) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
    }
    if (!which || strcmp(which, "sqlite") != 0) {
        pgproc pg;
        char db[64];
        memset(&pg, 0, sizeof pg);
        if (!pgproc_bindir() || pgproc_start(&pg) < 0 ||
            pgproc_createdb(&pg, db, sizeof db) < 0) {
            fprintf(stderr, "PostgreSQL: %s\n", pg.why);
            return 1;
        }
        pgproc_url(&pg, db, url, sizeof url);
        rc |= run("PostgreSQL 15", url, rows, rounds);
        pgproc_destroy(&pg);
    }
    return rc;
}
