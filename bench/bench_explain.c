/* bench_explain.c - `quotagate explain` on a large SQLite ledger
 * (docs/benchmarks.md, "explain on 10 million rows").
 *
 * Builds a ledger of QG_BENCH_EXPLAIN_ROWS rows (default 10,000,000) over
 * 30 days under examples/rules.yaml: 100,000 subjects on the default plan
 * (100 rows each), of which the first 100 belong to org acme (its
 * monthly window reaches back over the whole span: 10,000 org rows to
 * replay).  The schema is made by the ledger itself (qg__ledger_open:
 * migrations and indexes), the rows inserted in bulk through SQLite in
 * one transaction.  Then qg_explain (what the CLI runs: open, read the
 * row, scan the subject's and org's rows within the rules' reach through
 * their indexes, replay, JSON) of QG_BENCH_EXPLAIN_N random requests of
 * solo subjects and of org members: median and max ms.  Side by side, the
 * peer: one qg__ledger_scan of the same reach (every subject's rows, the
 * rebuild's read, what a replay without the per-subject indexes would
 * read), and the ratio.  Times from CLOCK_MONOTONIC. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "bench_util.h"

#define SUBJECTS 100000
#define ORG_MEMBERS 100
#define SPAN_MS (30LL * 86400000)
#define T0_MS 1793491200000LL       /* 2026-11-01T00:00:00Z */

static uint64_t rng = 88172645463325252ULL;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int fill(const char *path, long rows)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    double t = now_s();
    if (sqlite3_open(path, &db) != SQLITE_OK)
        return -1;
    sqlite3_exec(db, "PRAGMA synchronous=OFF; BEGIN", NULL, NULL, NULL);
    if (sqlite3_prepare_v2(db,
            "INSERT INTO requests (request_id, subject, org, plan,"
            " rules_version, weights_version, model, \"window\", decision,"
            " status, input_tokens, output_tokens, reserved_milli,"
            " weight_milli, created_ms, settled_ms, headroom_milli)"
            " VALUES (?1, ?2, ?3, 'pro', '2026-11-01', 'w1', 'standard', '',"
            " 1, 2, 400, 100, 2000, 1900, ?4, ?4 + 800, -1)", -1, &st,
            NULL) != SQLITE_OK) {
        fprintf(stderr, "prepare: %s\n", sqlite3_errmsg(db));
        return -1;
    }
    /* row i: subject i % SUBJECTS, instants increasing with i */
    for (long i = 0; i < rows; i++) {
        char rid[32], subj[32];
        long s = i % SUBJECTS;
        snprintf(rid, sizeof rid, "r%ld", i);
        snprintf(subj, sizeof subj, "s%ld", s);
        sqlite3_bind_text(st, 1, rid, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, subj, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 3, s < ORG_MEMBERS ? "acme" : "", -1,
                          SQLITE_STATIC);
        sqlite3_bind_int64(st, 4, T0_MS + (int64_t)(SPAN_MS * (i / (double)rows)));
        if (sqlite3_step(st) != SQLITE_DONE) {
            fprintf(stderr, "insert: %s\n", sqlite3_errmsg(db));
            return -1;
        }
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(db);
    printf("ledger of %ld rows written in %.1f s\n", rows, now_s() - t);
    return 0;
}

static int count_row(const qg_ledger_row *row, void *ud)
{
    (void)row;
    (*(long *)ud)++;
    return 0;
}

/* n explains of random rows of the last week whose subject is < ORG_MEMBERS
 * (org) or not: median and max ms into *med, *max. */
static int run(const char *url, const char *rules, long rows, int n, int org,
               double *med, double *max)
{
    double *ms = calloc((size_t)n, sizeof *ms);
    char err[1024];
    for (int k = 0; k < n; k++) {
        long i = rows - 1 - (long)(next_rand() % (uint64_t)(rows / 4));
        char rid[32], *out = NULL;
        double t;
        i -= i % SUBJECTS;              /* subject 0 of that round ... */
        i += org ? (long)(next_rand() % ORG_MEMBERS)
                 : ORG_MEMBERS + (long)(next_rand() % (SUBJECTS - ORG_MEMBERS));
        if (i >= rows)
            i -= SUBJECTS;
        snprintf(rid, sizeof rid, "r%ld", i);
        t = now_s();
        if (qg_explain(url, rules, rid, &out, err, sizeof err) != QG_OK) {
            fprintf(stderr, "explain %s: %s\n", rid, err);
            free(ms);
            return -1;
        }
        ms[k] = (now_s() - t) * 1000;
        free(out);
    }
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    *med = ms[n / 2];
    *max = ms[n - 1];
    free(ms);
    return 0;
}

int main(void)
{
    const char *env_rows = getenv("QG_BENCH_EXPLAIN_ROWS");
    const char *env_n = getenv("QG_BENCH_EXPLAIN_N");
    const char *dir_env = getenv("QG_BENCH_DIR");
    long rows = env_rows ? atol(env_rows) : 10000000L;
    int n = env_n ? atoi(env_n) : 50;
    char dir[512], path[600], url[700], err[1024];
    double med_s, max_s, med_o, max_o, t;
    qg_ledger *l;
    long seen = 0;

    if (rows < SUBJECTS * 2L || n < 1) {
        fprintf(stderr, "QG_BENCH_EXPLAIN_ROWS must be >= %d\n",
                SUBJECTS * 2);
        return 2;
    }
    snprintf(dir, sizeof dir, "%s/qg-bench-explain-XXXXXX",
             dir_env ? dir_env : "/var/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    snprintf(path, sizeof path, "%s/ledger.db", dir);
    snprintf(url, sizeof url, "sqlite:%s", path);
    if (!(l = qg__ledger_open(url, NULL, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    qg__ledger_close(l);                 /* the schema, by the ledger */
    if (fill(path, rows) < 0)
        return 2;
    /* the rows went in as another program's: the first open puts them
     * in subject_rows (a subject's rows by time, schema 10), once */
    t = now_s();
    if (!(l = qg__ledger_open(url, NULL, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    qg__ledger_close(l);
    printf("first open after the bulk insert (subject_rows filled): "
           "%.1f s\n", now_s() - t);
    if (run(url, "examples/rules.yaml", rows, n, 0, &med_s, &max_s) < 0 ||
        run(url, "examples/rules.yaml", rows, n, 1, &med_o, &max_o) < 0)
        return 1;
    printf("explain (qg_explain, open to JSON), %d requests each:\n"
           "  a solo subject:  median %.2f ms, max %.2f ms\n"
           "  an org member:   median %.2f ms, max %.2f ms (org rows "
           "replayed too)\n", n, med_s, max_s, med_o, max_o);
    /* the peer: every row within the same reach (31 days covers the
     * org's monthly window: the whole ledger here) */
    if (!(l = qg__ledger_open(url, NULL, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    t = now_s();
    qg__ledger_scan(l, T0_MS, count_row, &seen);
    t = now_s() - t;
    qg__ledger_close(l);
    printf("peer: qg__ledger_scan of the reach, %ld rows: %.0f ms "
           "(%.0fx a solo explain's median)\n", seen, t * 1000,
           t * 1000 / med_s);
    unlink(path);
    snprintf(path, sizeof path, "%s/ledger.db-wal", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ledger.db-shm", dir);
    unlink(path);
    rmdir(dir);
    return 0;
}
