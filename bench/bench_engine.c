/* bench_engine.c - decision throughput and memory of the engine, measured
 * side by side with the naive reference model in the same run (`make
 * bench`).
 *
 * Workloads (virtual clocks; every operation is one qg_engine_check on a
 * random subject with a unique request id, followed in "pairs" mode by
 * its qg_engine_settle):
 *  1. scale: 1,000,000 subjects registered with qg_engine_set_subject in
 *     many orgs; plan = rolling 5h + calendar weekly + rate + concurrency,
 *     org = calendar monthly.  1 and 2 threads; checks/s and
 *     check+settle pairs/s; store bytes per subject.  QG_BENCH_RUNS
 *     rounds (3; at most 16) of the four phases, the first round and
 *     every other one starting with one thread, the rest with two; the
 *     median, range and rounds meeting issue 14's targets are printed.
 *     Each round ends with one thread's checks through
 *     qg_engine_check_many in batches of QG_CHECK_MANY_MAX (the same
 *     decisions, their memory loaded a batch at a time), printed apart.
 *  2. the same workload at a smaller scale, engine vs the reference
 *     (tests/support/refmodel.c, which scans its whole log per decision).
 *  3. heavy subjects: 100 subjects with thousands of charges each inside
 *     their rolling window; engine vs reference decisions/s, in
 *     QG_BENCH_HEAVY_RUNS rounds (3; engine then reference in each), the
 *     ratio's median and spread printed (issue 14: >= 50x in every round).
 * Rates are computed with doubles for printing only.  Wall time comes from
 * clock_gettime(CLOCK_MONOTONIC); decisions themselves use virtual time.
 * Environment: QG_BENCH_SUBJECTS, QG_BENCH_ORGS, QG_BENCH_OPS override the
 * scale workload's sizes; QG_BENCH_ENGINE_ONLY stops after it (profiling);
 * QG_BENCH_BATCH=N (1..16) runs every scale phase in batches of N. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"
#include "weights.h"
#include "refmodel.h"
#include "bench_util.h"

#define T0_MS 1772445600000LL          /* 2026-03-02T10:00:00Z */
#define HEAVY_SUBJECTS 100
#define HEAVY_CHARGES 6000

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* "p<hex>" into buf (request ids: cheaper than snprintf on the hot path). */
static void make_id(char *buf, char prefix, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    *buf++ = prefix;
    while (n)
        *buf++ = tmp[--n];
    *buf = 0;
}

/* ---------------------------------------------------------------- rules */

static char *rules_text(long norgs)
{
    static const char head[] =
        "version: \"bench\"\n"
        "unit: \"weight points\"\n"
        "weights:\n"
        "  version: \"w1\"\n"
        "  calibrated: \"2026-01-01\"\n"
        "  models:\n"
        "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
        "plans:\n"
        "  pro:\n"
        "    windows:\n"
        "      - { name: burst_5h, type: rolling, length: 5h, limit: 200 }\n"
        "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 2000 }\n"
        "      - { name: rpm, type: rate, per: 1m, limit: 60, unit: requests }\n"
        "    concurrency: 4\n"
        "  heavy:\n"
        "    windows:\n"
        "      - { name: burst_5h, type: rolling, length: 5h, limit: 1000000, max_entries: 65536 }\n"
        "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 1000000 }\n"
        "orgs:\n";
    static const char org[] =
        "  o%ld: { windows: [ { name: monthly, type: calendar, every: month, "
        "at: \"1 00:00\", tz: \"UTC\", limit: 100000000 } ] }\n";
    size_t cap = sizeof head + (size_t)norgs * (sizeof org + 16) + 64;
    char *t = malloc(cap);
    size_t n = 0;
    if (!t)
        abort();
    n += (size_t)snprintf(t + n, cap - n, "%s", head);
    for (long i = 0; i < norgs; i++)
        n += (size_t)snprintf(t + n, cap - n, org, i);
    snprintf(t + n, cap - n, "default_plan: pro\n");
    return t;
}

static qg_rules *parse_rules(const char *text)
{
    qg_rules *r = NULL;
    qg_diag diag;
    char err[400];
    if (qg__rules_parse(text, strlen(text), "bench", qg__tz_load_system, NULL,
                       &r, &diag) != 0) {
        qg__diag_format(&diag, err, sizeof err);
        fprintf(stderr, "bench: rules: %s\n", err);
        exit(1);
    }
    return r;
}

/* ------------------------------------------------------------- workload */

typedef struct world {
    qg_engine *eng;
    qg_store *store;
    char (*names)[12];        /* subject names */
    long nsubj;
} world;

static void subject_name(char *buf, long i) { make_id(buf, 'u', (uint64_t)i); }

static void world_init(world *w, const char *text, long nsubj, long norgs)
{
    char err[200], org[24];
    w->store = qg_store_memory_new(NULL);
    w->eng = qg_engine_new(parse_rules(text), w->store);
    w->nsubj = nsubj;
    w->names = malloc((size_t)nsubj * sizeof *w->names);
    if (!w->store || !w->eng || !w->names)
        abort();
    for (long i = 0; i < nsubj; i++) {
        subject_name(w->names[i], i);
        snprintf(org, sizeof org, "o%ld", i % norgs);
        if (qg_engine_set_subject(w->eng, w->names[i], "pro", org, 0, err,
                                  sizeof err) != 0) {
            fprintf(stderr, "bench: set_subject: %s\n", err);
            exit(1);
        }
    }
}

static void world_free(world *w)
{
    qg_engine_free(w->eng);
    qg_store_free(w->store);
    free(w->names);
}

/* One per thread, each on cache lines of its own: a thread's counters
 * next to another's arguments made the two cores trade the line on every
 * operation (false sharing, measured: docs/benchmarks.md). */
typedef struct run_arg {
    _Alignas(64) world *w;
    int thread;
    long ops;
    int settle;
    int batch;                /* > 1: qg_engine_check_many, this many */
    int64_t step_ms;          /* virtual ms per operation */
    uint64_t seed;
    int64_t end_ms;            /* virtual clock at the end */
    long allowed, errors;
} run_arg;

static _Atomic int64_t g_vclock;

/* Operation i of a thread: its request id and subject (r: its random
 * draw) into rid and subject, which req points at. */
static void make_req(const run_arg *a, long i, uint64_t r, char rid[24],
                     char subject[12], qg_check_req *req)
{
    make_id(rid, (char)('a' + a->thread), (a->seed << 36) + (uint64_t)i);
    /* The subject's name formatted here, as the request id is: a
     * server finds it in the request it has just read, in cache.
     * Picking it from w->names cost a cache miss per check at 1M
     * subjects (a 12 MB array read at random: 11% of the loop's
     * samples, perf), which the engine was charged with. */
    subject_name(subject, (long)(r % (uint64_t)a->w->nsubj));
    *req = (qg_check_req){ .subject = subject,
                           .request_id = rid, .model = "light",
                           .input_tokens = (int64_t)(r >> 40 & 1023),
                           .max_output_tokens = 512 };
}

/* The settle of an admitted req ("pairs"): 1 when it failed. */
static int settle_req(world *w, const qg_check_req *req, uint64_t r,
                      int64_t now)
{
    qg_settle_req sr = { .request_id = req->request_id,
                         .status = QG_SETTLE_COMPLETED,
                         .input_tokens = req->input_tokens,
                         .output_tokens = (int64_t)(r >> 20 & 1023),
                         .weight_milli = -1 };
    qg_settle_result res;
    return qg_engine_settle(w->eng, &sr, now, &res, NULL, 0) != 0;
}

static void *run_ops(void *p)
{
    run_arg *a = p;
    world *w = a->w;
    static __thread qg_decision d;
    char rid[24], subject[12];
    uint64_t s = (a->seed + 1) * 0x9e3779b97f4a7c15ULL | 1;
    int64_t now = 0;
    long allowed = 0, errors = 0, ops = a->ops;

    for (long i = 0; i < ops; i++) {
        uint64_t r = xorshift(&s);
        qg_check_req req;
        make_req(a, i, r, rid, subject, &req);
        /* One virtual clock for all threads: a block of 64 steps at a time
         * is taken from the shared counter (one atomic per 64 operations). */
        if ((i & 63) == 0)
            now = atomic_fetch_add(&g_vclock, 64 * a->step_ms);
        now += a->step_ms;
        if (qg_engine_check(w->eng, &req, now, &d, NULL, 0) != 0) {
            errors++;
            continue;
        }
        if (d.outcome != QG_ALLOW || d.replayed)
            continue;
        allowed++;
        if (a->settle)
            errors += settle_req(w, &req, r, now);
    }
    a->allowed = allowed;
    a->errors = errors;
    a->end_ms = now;
    return NULL;
}

/* run_ops in batches of a->batch checks (qg_engine_check_many), each
 * batch at one instant; the settles of a batch's admissions follow it
 * one by one. */
static void *run_ops_many(void *p)
{
    run_arg *a = p;
    world *w = a->w;
    static __thread qg_decision d[QG_CHECK_MANY_MAX];
    char rid[QG_CHECK_MANY_MAX][24], subject[QG_CHECK_MANY_MAX][12];
    qg_check_req req[QG_CHECK_MANY_MAX];
    uint64_t r[QG_CHECK_MANY_MAX];
    int rcs[QG_CHECK_MANY_MAX];
    uint64_t s = (a->seed + 1) * 0x9e3779b97f4a7c15ULL | 1;
    int64_t now = 0;
    long allowed = 0, errors = 0, ops = a->ops;
    int b = a->batch;

    for (long i = 0; i < ops; i += b) {
        int m = ops - i < b ? (int)(ops - i) : b;
        for (int j = 0; j < m; j++) {
            r[j] = xorshift(&s);
            make_req(a, i + j, r[j], rid[j], subject[j], &req[j]);
        }
        if (i % 64 < b)          /* 64 steps at a time, as run_ops */
            now = atomic_fetch_add(&g_vclock, 64 * a->step_ms);
        now += a->step_ms * m;
        qg_engine_check_many(w->eng, (size_t)m, req, now, d, rcs);
        for (int j = 0; j < m; j++) {
            if (rcs[j] != 0) {
                errors++;
                continue;
            }
            if (d[j].outcome != QG_ALLOW || d[j].replayed)
                continue;
            allowed++;
            if (a->settle)
                errors += settle_req(w, &req[j], r[j], now);
        }
    }
    a->allowed = allowed;
    a->errors = errors;
    a->end_ms = now;
    return NULL;
}

/* The virtual clock carries on across phases (an hour apart, so that the
 * leases of unsettled reservations of a previous phase have expired). */
static int64_t g_clock = T0_MS;

/* QG_BENCH_BATCH: every scale phase in batches of this many (0: one by
 * one, qg_engine_check) */
static int g_batch;

/* Run `threads` threads of `ops` operations each, in batches of `batch`
 * checks when it is over 1; returns wall seconds. */
static double run_threads(world *w, int threads, long ops, int settle,
                          int batch, uint64_t seed, long *allowed,
                          long *errors)
{
    pthread_t th[8];
    run_arg args[8];
    double t0 = now_s();
    *allowed = *errors = 0;
    atomic_store(&g_vclock, g_clock);
    for (int i = 0; i < threads; i++) {
        /* seed: distinct per phase and thread; request ids derive from it */
        args[i] = (run_arg){ .w = w, .thread = i, .ops = ops,
                             .settle = settle, .batch = batch,
                             /* unsettled leases must expire so that the
                                reservation table keeps room */
                             .step_ms = settle ? 1 : 100,
                             .seed = seed * 16 + (uint64_t)i };
        pthread_create(&th[i], NULL, batch > 1 ? run_ops_many : run_ops,
                       &args[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        *allowed += args[i].allowed;
        *errors += args[i].errors;
        if (args[i].end_ms > g_clock)
            g_clock = args[i].end_ms;
    }
    g_clock += 3600000;
    return now_s() - t0;
}

/* The same workload on the reference, single-threaded: `ops` operations. */
static double run_ref(ref_model *m, const qg_rules *r, char (*names)[12],
                      long nsubj, long ops, uint64_t seed, long *allowed)
{
    const qg_model *light = &r->models[qg_rules_find_model(r, "light")];
    int mi = (int)(light - r->models);
    ref_decision d;
    ref_settle_result sr;
    char rid[24];
    uint64_t s = seed * 1000003u | 1;
    int64_t now = T0_MS;
    double t0 = now_s();
    *allowed = 0;
    for (long i = 0; i < ops; i++) {
        uint64_t x = xorshift(&s);
        int64_t in = (int64_t)(x >> 40 & 1023), out = (int64_t)(x >> 20 & 1023);
        make_id(rid, 'a', (uint64_t)i * 64);
        now += 1;
        ref_check(m, names[x % (uint64_t)nsubj], rid, mi,
                  qg__weight_milli(light, in, 512), now, &d);
        if (d.outcome != QG_ALLOW)
            continue;
        (*allowed)++;
        ref_settle(m, rid, qg__weight_milli(light, in, out), now, &sr);
    }
    return now_s() - t0;
}

static void row(const char *what, int threads, long ops, double secs,
                const char *unit)
{
    printf("  %-44s %2d %10ld %8.2f %12.0f %s\n", what, threads, ops, secs,
           (double)ops / secs, unit);
}

static void admitted(long allowed, long ops, long errors)
{
    printf("  %-44s    (%.1f%% admitted, %ld errors)\n", "",
           100.0 * (double)allowed / (double)ops, errors);
}

/* --------------------------------------------------------------- heavy */

/* "heavy<i>", formatted once: the timed loops measure the engine and the
 * reference, not snprintf (which cost the engine's loop ~700 of its ~3,800
 * instructions per pair, callgrind). */
static const char *heavy_name(int i)
{
    static char names[HEAVY_SUBJECTS][16];
    if (!names[i][0])
        snprintf(names[i], sizeof names[i], "heavy%d", i);
    return names[i];
}

/* Prefill every heavy subject with HEAVY_CHARGES charges inside its rolling
 * window (one per virtual ms), in the engine and/or the reference, then
 * time `ops` further decisions (check, settle) on random heavy subjects. */
static double heavy_engine(const char *text, long ops, long *allowed)
{
    qg_store *st = qg_store_memory_new(NULL);
    qg_engine *e = qg_engine_new(parse_rules(text), st);
    static qg_decision d;
    qg_settle_result res;
    const char *name;
    char rid[24], err[200];
    int64_t now = T0_MS;
    uint64_t s = 12345;
    long k = 0;

    for (int i = 0; i < HEAVY_SUBJECTS; i++) {
        name = heavy_name(i);
        qg_engine_set_subject(e, name, "heavy", NULL, 0, err, sizeof err);
    }
    for (int c = 0; c < HEAVY_CHARGES; c++)
        for (int i = 0; i < HEAVY_SUBJECTS; i++) {
            name = heavy_name(i);
            make_id(rid, 'h', (uint64_t)k++);
            qg_check_req req = { .subject = name, .request_id = rid,
                                 .weight_milli = 1000 };
            qg_settle_req sr = { .request_id = rid,
                                 .status = QG_SETTLE_COMPLETED,
                                 .weight_milli = -1 };
            now++;
            if (qg_engine_check(e, &req, now, &d, NULL, 0) == 0 &&
                d.outcome == QG_ALLOW)
                qg_engine_settle(e, &sr, now, &res, NULL, 0);
        }
    *allowed = 0;
    double t0 = now_s();
    for (long i = 0; i < ops; i++) {
        uint64_t x = xorshift(&s);
        name = heavy_name((int)(x % HEAVY_SUBJECTS));
        make_id(rid, 'q', (uint64_t)i);
        qg_check_req req = { .subject = name, .request_id = rid,
                             .weight_milli = 1000 };
        qg_settle_req sr = { .request_id = rid, .status = QG_SETTLE_COMPLETED,
                             .weight_milli = 500 };
        now++;
        if (qg_engine_check(e, &req, now, &d, NULL, 0) == 0 &&
            d.outcome == QG_ALLOW) {
            (*allowed)++;
            qg_engine_settle(e, &sr, now, &res, NULL, 0);
        }
    }
    double secs = now_s() - t0;
    qg_engine_free(e);
    qg_store_free(st);
    return secs;
}

static double heavy_ref(const char *text, long ops, long *allowed,
                        size_t *entries)
{
    qg_rules *r = parse_rules(text);
    ref_model *m = ref_new(r);
    ref_decision d;
    ref_settle_result sr;
    const char *name;
    char rid[24];
    int64_t now = T0_MS;
    uint64_t s = 12345;
    long k = 0;
    int plan = qg__rules_find_plan(r, "heavy");

    for (int i = 0; i < HEAVY_SUBJECTS; i++) {
        name = heavy_name(i);
        ref_set_subject(m, name, plan, -1, 0);
    }
    /* Prefill: each check scans the log, so this costs as much as the
     * charges it creates; it is not timed. */
    for (int c = 0; c < HEAVY_CHARGES; c++)
        for (int i = 0; i < HEAVY_SUBJECTS; i++) {
            name = heavy_name(i);
            make_id(rid, 'h', (uint64_t)k++);
            now++;
            if (ref_check(m, name, rid, -1, 1000, now, &d) == 0 &&
                d.outcome == QG_ALLOW)
                ref_settle(m, rid, -1, now, &sr);
        }
    *allowed = 0;
    double t0 = now_s();
    for (long i = 0; i < ops; i++) {
        uint64_t x = xorshift(&s);
        name = heavy_name((int)(x % HEAVY_SUBJECTS));
        make_id(rid, 'q', (uint64_t)i);
        now++;
        if (ref_check(m, name, rid, -1, 1000, now, &d) == 0 &&
            d.outcome == QG_ALLOW) {
            (*allowed)++;
            ref_settle(m, rid, 500, now, &sr);
        }
    }
    double secs = now_s() - t0;
    *entries = ref_log_entries(m);
    ref_free(m);
    qg_rules_free(r);
    return secs;
}

/* ---------------------------------------------------------------- main */

/* Heavy subjects: QG_BENCH_HEAVY_RUNS rounds (3; at most 16), engine
 * then reference in each, so that both see the machine in the same
 * state; prints each round's rows.  Fills ratio[] with the rounds'
 * engine/reference ratios, sorted, and returns their count; with
 * engine_only (profiling the engine) runs no reference and returns 0. */
static int heavy_rounds(const char *text, int engine_only, double ratio[16])
{
    long eops = 400000, rops = 20000, ea = 0, ra = 0;
    size_t entries = 0;
    int runs = (int)env_long("QG_BENCH_HEAVY_RUNS", 3);
    if (runs > 16)
        runs = 16;
    printf("\n");
    for (int k = 0; k < runs; k++) {
        double te = heavy_engine(text, eops, &ea), tr;
        row("engine, 100 heavy subjects (6000+ in window)", 1, eops, te,
            "pairs");
        if (engine_only)
            continue;
        tr = heavy_ref(text, rops, &ra, &entries);
        ratio[k] = ((double)eops / te) / ((double)rops / tr);
        row("reference, 100 heavy subjects", 1, rops, tr, "pairs");
    }
    if (engine_only)
        return 0;
    printf("  %-44s    (admitted: engine %ld, reference %ld; reference "
           "log entries %zu)\n", "", ea, ra, entries);
    qsort(ratio, (size_t)runs, sizeof ratio[0], cmp_double);
    return runs;
}

/* what: the median of v[0..runs) (sorted here), times scale, its range,
 * and in how many rounds it reached target (when target > 0). */
static void spread_line(const char *what, double *v, int runs,
                        double scale, const char *unit, double target)
{
    int met = 0;
    qsort(v, (size_t)runs, sizeof v[0], cmp_double);
    for (int k = 0; k < runs; k++)
        met += v[k] >= target;
    printf("  %-38s %8.2f%s  median of %d rounds, %.2f-%.2f%s", what,
           v[runs / 2] * scale, unit, runs, v[0] * scale,
           v[runs - 1] * scale, unit);
    if (target > 0)
        printf(" (target >= %g%s: met in %d of %d rounds)", target * scale,
               unit, met, runs);
    printf("\n");
}

static void heavy_ratio_line(const double *ratio, int runs)
{
    int met = 0;
    for (int k = 0; k < runs; k++)
        met += ratio[k] >= 50;
    printf("  engine / reference, heavy subjects:    %8.1fx  median of %d "
           "rounds, %.1f-%.1fx (target >= 50x in every round: %s, %d of "
           "%d)\n", ratio[runs / 2], runs, ratio[0], ratio[runs - 1],
           met == runs ? "met" : "NOT met", met, runs);
}

int main(void)
{
    long nsubj = env_long("QG_BENCH_SUBJECTS", 1000000);
    long norgs = env_long("QG_BENCH_ORGS", 1000);
    long ops = env_long("QG_BENCH_OPS", 2000000);
    long allowed, errors;
    int runs = (int)env_long("QG_BENCH_RUNS", 3), seed = 1;
    double many1[16], mratio[16];

    g_batch = (int)env_long("QG_BENCH_BATCH", 0);
    if (g_batch > QG_CHECK_MANY_MAX)
        g_batch = QG_CHECK_MANY_MAX;
    double t, checks1[16], pairs1[16], checks2[16], pairs2[16];
    double cratio[16], pratio[16];
    world w;
    char *text = rules_text(norgs);

    if (runs > 16)
        runs = 16;

    printf("quotagate engine benchmark (virtual clock; one decision = one "
           "qg_engine_check)\n");
    /* for profiling: QG_BENCH_HEAVY_ONLY=1 runs only the heavy rounds,
     * =engine only their engine half */
    const char *only = getenv("QG_BENCH_HEAVY_ONLY");
    if (only) {
        double hratio[16];
        int hruns = heavy_rounds(text, strcmp(only, "engine") == 0, hratio);
        if (hruns > 0)
            heavy_ratio_line(hratio, hruns);
        free(text);
        return 0;
    }
    double t0 = now_s();
    struct mallinfo2 mi0 = mallinfo2();
    world_init(&w, text, nsubj, norgs);
    double reg_s = now_s() - t0;
    /* Touch every subject once so that every member and org has state. */
    for (long i = 0; i < nsubj; i++) {
        static qg_decision d;
        char rid[24];
        make_id(rid, 'z', (uint64_t)i);
        qg_check_req req = { .subject = w.names[i], .request_id = rid,
                             .weight_milli = 1000 };
        qg_settle_req sr = { .request_id = rid, .status = QG_SETTLE_COMPLETED,
                             .weight_milli = -1 };
        qg_settle_result res;
        if (qg_engine_check(w.eng, &req, T0_MS, &d, NULL, 0) == 0 &&
            d.outcome == QG_ALLOW)
            qg_engine_settle(w.eng, &sr, T0_MS, &res, NULL, 0);
    }
    struct mallinfo2 mi1 = mallinfo2();
    qg_store_stats st;
    qg_store_stats_get(w.store, &st);
    printf("setup: %ld subjects in %ld orgs: rules parsed and subjects "
           "registered in %.2f s, every subject touched in %.2f s\n",
           nsubj, norgs, reg_s, now_s() - t0 - reg_s);
    printf("memory: store %llu bytes for %llu members+orgs with state = "
           "%.0f bytes/entity, %.0f bytes/subject; process heap grew "
           "%.0f bytes/subject (registry, store, names)\n",
           (unsigned long long)st.bytes, (unsigned long long)st.subjects,
           (double)st.bytes / (double)st.subjects,
           (double)st.bytes / (double)nsubj,
           (double)(mi1.uordblks - mi0.uordblks) / (double)nsubj);

    printf("\n  %-44s %2s %10s %8s %12s\n", "workload", "th", "ops", "secs",
           "per second");
    for (int k = 0; k < runs; k++) {
        /* rounds 2, 4, .. (k odd) start with two threads: neither
         * always meets the machine after the other */
        for (int step = 0; step < 2; step++) {
            int th = (step ^ (k & 1)) ? 2 : 1;
            long n = th * ops;
            t = run_threads(&w, th, ops, 0, g_batch, (uint64_t)seed++,
                            &allowed, &errors);
            (th == 1 ? checks1 : checks2)[k] = (double)n / t;
            row("engine, 1M subjects: check", th, n, t, "checks");
            admitted(allowed, n, errors);
            t = run_threads(&w, th, ops, 1, g_batch, (uint64_t)seed++,
                            &allowed, &errors);
            (th == 1 ? pairs1 : pairs2)[k] = (double)n / t;
            row("engine, 1M subjects: check + settle", th, n, t, "pairs");
            admitted(allowed, n, errors);
        }
        /* the same checks, one thread, a batch at a time */
        t = run_threads(&w, 1, ops, 0, QG_CHECK_MANY_MAX, (uint64_t)seed++,
                        &allowed, &errors);
        many1[k] = (double)ops / t;
        row("engine, 1M subjects: check, batches of 16", 1, ops, t,
            "checks");
        admitted(allowed, ops, errors);
        mratio[k] = many1[k] / checks1[k];
        cratio[k] = checks2[k] / checks1[k];
        pratio[k] = pairs2[k] / pairs1[k];
        /* rolling rings and leases that outgrew the entity's block moved
         * to the heap: later rounds decide over more of them */
        qg_store_stats_get(w.store, &st);
        printf("  %-44s    (store: %.0f bytes/entity after round %d)\n", "",
               (double)st.bytes / (double)st.subjects, k + 1);
    }
    world_free(&w);
    if (getenv("QG_BENCH_ENGINE_ONLY")) {   /* for profiling */
        free(text);
        return 0;
    }

    /* Engine vs reference on the same workload, smaller scale. */
    long small_subj = 10000, small_ops = 400000;
    world ws;
    world_init(&ws, text, small_subj, norgs < 1000 ? norgs : 1000);
    double te = run_threads(&ws, 1, small_ops, 1, 0, 5, &allowed, &errors);
    qg_rules *rr = parse_rules(text);
    ref_model *ref = ref_new(rr);
    for (long i = 0; i < small_subj; i++) {
        char org[24];
        snprintf(org, sizeof org, "o%ld", i % (norgs < 1000 ? norgs : 1000));
        ref_set_subject(ref, ws.names[i], qg__rules_find_plan(rr, "pro"),
                        qg__rules_find_org(rr, org), 0);
    }
    long rallowed;
    double tr = run_ref(ref, rr, ws.names, small_subj, small_ops, 5,
                        &rallowed);
    printf("\n");
    row("engine, 10k subjects: check + settle", 1, small_ops, te, "pairs");
    row("reference, 10k subjects: check + settle", 1, small_ops, tr, "pairs");
    printf("  %-44s    (reference holds %zu log entries at the end)\n", "",
           ref_log_entries(ref));
    ref_free(ref);
    qg_rules_free(rr);
    world_free(&ws);

    double hratio[16];
    int hruns = heavy_rounds(text, 0, hratio);

    double small_ratio = tr / te;
    printf("\nratios\n");
    printf("  engine / reference, 10k subjects:      %8.1fx\n", small_ratio);
    heavy_ratio_line(hratio, hruns);
    spread_line("checks/s per core at 1M subjects:", checks1, runs, 1e-6,
                "M", 1.5e6);
    spread_line("  the same in batches of 16:", many1, runs, 1e-6, "M",
                1.5e6);
    spread_line("  batches / one by one:", mratio, runs, 1, "x", 0);
    spread_line("2 threads / 1 thread, checks:", cratio, runs, 1, "x", 1.8);
    spread_line("2 threads / 1 thread, check + settle:", pratio, runs, 1,
                "x", 0);
    free(text);
    return 0;
}
