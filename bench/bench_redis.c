/* bench_redis.c - what the Redis store's script costs Redis, per operation
 * and per decision shape (docs/redis-store.md, "Cost per decision").
 *
 * Starts its own redis-server (tests/support/redisproc.c: no persistence,
 * a free port), drives the store through the engine with virtual time
 * (server_time off, so every run decides the same), and reads Redis's own
 * account of each phase: `INFO commandstats`, reset before the phase, its
 * EVALSHA usec_per_call (CPU inside the script, no network) and the
 * usec of every command per operation.  Wall time is not measured: on a
 * shared machine it says more about the neighbours than about the script.
 *
 * The plan is examples/rules.yaml's max20 shape (rolling 5h, two weekly
 * calendars one of them model-scoped, a rate window, concurrency) with an
 * org like acme (a monthly calendar, concurrency), limits raised so that
 * the admitted phases admit.  Shapes:
 *   small   500 members in 50 orgs, 4 requests each: a few log entries
 *           and leases per entity;
 *   large   40 members in 2 orgs whose rolling log holds 400 entries each
 *           (built first by check+settle pairs ten seconds apart, not
 *           measured).
 * Phases per shape: admitted checks, replays of them, refused checks
 * (a weight beyond the rolling window's room: every window has usage, so
 * every recovery schedule is computed), settles naming the subject (the
 * server's path), usage.  Each phase checks the outcomes it expects.
 *
 * Usage: build/bench_redis [ROUNDS]  (default 3; the per-phase figure is
 * the median of the rounds).  "EVALSHA" stands for the script call,
 * FCALL (the store's Function library) or EVALSHA (a server without
 * Functions): the figures add both commands' counts.  QG_BENCH_REDIS_SMALL, _LARGE_MEMBERS and
 * _LARGE_ENTRIES override the sizes.
 *
 * Times on a shared virtual machine wander by a factor of two from one
 * minute to the next.  QG_BENCH_REDIS_CALLGRIND=1 runs redis-server under
 * valgrind's callgrind instead (slow: use ROUNDS 1) and reports the
 * instructions Redis executes per EVALSHA (the inclusive cost of
 * evalShaCommand, so parsing, the script and its reply) and per operation
 * (every command): the same figures at every run, on any machine load.
 * QG_BENCH_REDIS_KEEP=1 keeps callgrind's dumps (one per phase, in order:
 * callgrind_annotate shows where a phase's instructions go).
 * QG_BENCH_REDIS_LOG=FILE keeps the server's log (a script's redis.log
 * lines: how the figures were split while the scripts were tuned). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "quotagate.h"
#include "redisproc.h"
#include "rules.h"
#include "tzfile.h"
#include "bench_util.h"

#define T0_MS 1772445600000LL          /* 2026-03-02T10:00:00Z, a Monday */
#define MAX_ROUNDS 15
#define NPHASES 10

static const char rules_text[] =
    "version: \"bench-redis\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    standard: { per_request: 1, input_per_1k: 1, output_per_1k: 5 }\n"
    "    large:    { per_request: 2, input_per_1k: 3, output_per_1k: 15 }\n"
    "plans:\n"
    "  max20:\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 2000 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", "
    "tz: \"UTC\", limit: 10000000 }\n"
    "      - { name: weekly_large, type: calendar, every: week, at: \"MON "
    "00:00\", tz: \"UTC\", limit: 600000, models: [large] }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 120, unit: requests }\n"
    "    concurrency: 8\n"
    "orgs:\n"
    "%s"
    "default_plan: max20\n";

static const char org_text[] =
    "  o%d: { windows: [ { name: monthly, type: calendar, every: month, "
    "anchor: billing, tz: \"UTC\", limit: 100000000 } ], concurrency: 256 }\n";

static redisproc srv;
static char cg_dir[64];          /* QG_BENCH_REDIS_CALLGRIND: its files */
static int cg_dumps;

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_redis: %s: %s\n", what, why ? why : "");
    redisproc_stop(&srv);
    exit(1);
}

static void cmd(const char *a, const char *b)
{
    char out[64];
    if (redisproc_cmd(&srv, out, sizeof out, a, b, NULL) != 0)
        die("redis", a);
}

/* Redis's figures since the last reset: EVALSHA calls and usec, and the
 * usec of every command. */
typedef struct stats {
    double evalsha_calls, evalsha_usec, all_usec;
    double evalsha_ir, all_ir;    /* callgrind: instructions */
} stats;

/* callgrind: zero the counters (before a phase). */
static void cg_zero(void)
{
    char c[128];
    if (!cg_dir[0])
        return;
    snprintf(c, sizeof c, "callgrind_control -z %d >/dev/null 2>&1", (int)srv.pid);
    if (system(c) != 0)
        die("callgrind_control", "-z");
}

/* callgrind: dump, and read the phase's total and evalShaCommand's
 * inclusive instruction counts. */
static void cg_read(stats *s)
{
    char c[512], line[512];
    FILE *f;
    if (!cg_dir[0])
        return;
    snprintf(c, sizeof c, "callgrind_control -d %d >/dev/null 2>&1", (int)srv.pid);
    if (system(c) != 0)
        die("callgrind_control", "-d");
    cg_dumps++;
    /* the dump is written after callgrind_control returns: wait for its
     * last line */
    snprintf(c, sizeof c, "for i in $(seq 600); do tail -1 %s/cg.out.%d "
             "2>/dev/null | grep -q '^totals:' && exit 0; sleep 0.1; done; "
             "exit 1", cg_dir, cg_dumps);
    if (system(c) != 0)
        die("callgrind", "no dump");
    snprintf(c, sizeof c, "callgrind_annotate --inclusive=yes --threshold=100 "
             "--auto=no %s/cg.out.%d 2>/dev/null", cg_dir, cg_dumps);
    if (!(f = popen(c, "r")))
        die("callgrind_annotate", "");
    while (fgets(line, sizeof line, f)) {
        char num[64];
        size_t k = 0;
        for (const char *p = line; *p && k + 1 < sizeof num; p++)
            if (*p >= '0' && *p <= '9')
                num[k++] = *p;
            else if (*p != ',' && *p != ' ')
                break;
        num[k] = 0;
        if (strstr(line, "PROGRAM TOTALS"))
            s->all_ir = strtod(num, NULL);
        else if (strstr(line, ":evalShaCommand ") ||
                 strstr(line, ":fcallCommand "))
            s->evalsha_ir += strtod(num, NULL);
    }
    pclose(f);
}

/* callgrind: a wrapper that runs redis-server under it, as
 * QG_REDIS_SERVER (tests/support/redisproc.c starts what it names). */
static void cg_setup(void)
{
    char path[128];
    FILE *f;
    const char *real = redisproc_binary();
    snprintf(cg_dir, sizeof cg_dir, "/tmp/bench_redis_cg.XXXXXX");
    if (!real || !mkdtemp(cg_dir))
        die("callgrind", "no redis-server or no temporary folder");
    snprintf(path, sizeof path, "%s/redis-server", cg_dir);
    if (!(f = fopen(path, "w")))
        die("callgrind", path);
    fprintf(f, "#!/bin/sh\nexec valgrind --tool=callgrind --dump-instr=no "
            "--callgrind-out-file=%s/cg.out %s \"$@\"\n", cg_dir, real);
    fclose(f);
    chmod(path, 0755);
    setenv("QG_REDIS_SERVER", path, 1);
}

static void read_stats(stats *s)
{
    static char buf[65536];
    const char *p;
    memset(s, 0, sizeof *s);
    if (redisproc_cmd(&srv, buf, sizeof buf, "INFO", "commandstats", NULL))
        die("redis", "INFO");
    for (p = buf; (p = strstr(p, "cmdstat_")) != NULL; p++) {
        double calls = 0, usec = 0;
        const char *c = strstr(p, "calls="), *u = strstr(p, ",usec=");
        const char *eol = strpbrk(p, "\r\n");
        if (!c || !u || (eol && u > eol))
            continue;
        calls = strtod(c + 6, NULL);
        usec = strtod(u + 6, NULL);
        /* the reading itself (INFO) and the resets are not the store's */
        if (strncmp(p, "cmdstat_info:", 13) == 0 ||
            strncmp(p, "cmdstat_config", 14) == 0)
            continue;
        s->all_usec += usec;
        if (strncmp(p, "cmdstat_evalsha:", 16) == 0 ||
            strncmp(p, "cmdstat_fcall:", 14) == 0) {
            s->evalsha_calls += calls;
            s->evalsha_usec += usec;
        }
    }
}

static qg_rules *parse_rules(int norgs)
{
    qg_rules *r = NULL;
    qg_diag diag;
    char err[400], *orgs = malloc((size_t)norgs * sizeof org_text + 1), *text;
    size_t n = 0;
    if (!orgs)
        abort();
    orgs[0] = 0;
    for (int i = 0; i < norgs; i++)
        n += (size_t)sprintf(orgs + n, org_text, i);
    if (!(text = malloc(sizeof rules_text + n + 1)))
        abort();
    sprintf(text, rules_text, orgs);
    if (qg__rules_parse(text, strlen(text), "bench", qg__tz_load_system, NULL,
                        &r, &diag) != 0) {
        qg__diag_format(&diag, err, sizeof err);
        die("rules", err);
    }
    free(orgs);
    free(text);
    return r;
}

typedef struct world {
    qg_store *store;
    qg_engine *eng;
    int nmemb;
    int64_t now;
} world;

static void world_open(world *w, int nmemb, int norgs)
{
    qg_rules *r = parse_rules(norgs);
    qg_redis_opts o = {.rules = r, .server_time = 0, .timeout_ms = 60000};
    char err[300];
    cmd("FLUSHALL", NULL);
    memset(w, 0, sizeof *w);
    if (!(w->store = qg_store_redis_new(redisproc_url(&srv), &o, err,
                                        sizeof err)))
        die("qg_store_redis_new", err);
    if (!(w->eng = qg_engine_new(r, w->store)))
        die("qg_engine_new", "");
    w->nmemb = nmemb;
    w->now = T0_MS;
    for (int i = 0; i < nmemb; i++) {
        char m[16], org[16];
        snprintf(m, sizeof m, "m%d", i);
        snprintf(org, sizeof org, "o%d", i % norgs);
        if (qg_engine_set_subject(w->eng, m, "max20", org, T0_MS - 86400000LL,
                                  err, sizeof err) != 0)
            die("set_subject", err);
    }
}

static void world_close(world *w)
{
    qg_engine_free(w->eng);
    qg_store_free(w->store);
}

static int check(world *w, int m, const char *rid, int64_t in, int64_t out_tk,
                 qg_decision *d)
{
    char subj[16], err[256];
    qg_check_req q = {.subject = subj, .request_id = rid, .model = "standard",
                      .input_tokens = in, .max_output_tokens = out_tk};
    snprintf(subj, sizeof subj, "m%d", m);
    if (qg_engine_check(w->eng, &q, w->now, d, err, sizeof err) != 0)
        die("check", qg_store_redis_error(w->store));
    return d->outcome;
}

static void settle(world *w, int m, const char *rid)
{
    char subj[16], err[256];
    qg_settle_req q = {.request_id = rid, .status = QG_SETTLE_COMPLETED,
                       .input_tokens = 800, .output_tokens = 300,
                       .subject = subj};
    qg_settle_result r;
    snprintf(subj, sizeof subj, "m%d", m);
    if (qg_engine_settle(w->eng, &q, w->now, &r, err, sizeof err) != 0)
        die("settle", qg_store_redis_error(w->store));
}

static void usage(world *w, int m)
{
    char subj[16];
    qg_decision d;
    snprintf(subj, sizeof subj, "m%d", m);
    if (qg_engine_usage(w->eng, subj, w->now, &d) != 0)
        die("usage", qg_store_redis_error(w->store));
}

static const char *phase_names[NPHASES] = {
    "small: admitted check", "small: replay", "small: refused check",
    "small: settle", "small: usage",
    "large: admitted check", "large: replay", "large: refused check",
    "large: settle", "large: usage"};

typedef struct fig { double evalsha, all_per_op, ir_evalsha, ir_per_op; } fig;

/* One phase: reset, run fn over ops, and read the figures. */
#define PHASE(res, nops, body) do {                                       \
        stats st_;                                                        \
        cmd("CONFIG", "RESETSTAT");                                       \
        cg_zero();                                                        \
        body;                                                             \
        read_stats(&st_);                                                 \
        cg_read(&st_);                                                    \
        (res).evalsha = st_.evalsha_calls > 0                             \
            ? st_.evalsha_usec / st_.evalsha_calls : 0;                   \
        (res).all_per_op = st_.all_usec / (double)(nops);                 \
        (res).ir_evalsha = st_.evalsha_calls > 0                          \
            ? st_.evalsha_ir / st_.evalsha_calls : 0;                     \
        (res).ir_per_op = st_.all_ir / (double)(nops);                    \
    } while (0)

static void expect(int got, int want, const char *what)
{
    if (got != want) {
        char why[64];
        snprintf(why, sizeof why, "outcome %d, expected %d", got, want);
        die(what, why);
    }
}

/* The phases on w, whose members have `base` settled requests already;
 * per member `per` requests are measured.  Figures into f[0..5). */
static void phases(world *w, int per, const char *tag, fig *f)
{
    qg_decision d;
    char rid[48];
    int n = w->nmemb * per;
    PHASE(f[0], n, {
        for (int k = 0; k < per; k++)
            for (int m = 0; m < w->nmemb; m++) {
                w->now += 50;
                snprintf(rid, sizeof rid, "%s-%d-%d", tag, m, k);
                expect(check(w, m, rid, 800, 400, &d), QG_ALLOW, "admit");
            }
    });
    PHASE(f[1], n, {
        for (int k = 0; k < per; k++)
            for (int m = 0; m < w->nmemb; m++) {
                snprintf(rid, sizeof rid, "%s-%d-%d", tag, m, k);
                check(w, m, rid, 800, 400, &d);
                expect(d.replayed, 1, "replay");
            }
    });
    PHASE(f[2], n, {
        for (int k = 0; k < per; k++)
            for (int m = 0; m < w->nmemb; m++) {
                w->now += 50;
                snprintf(rid, sizeof rid, "%s-r-%d-%d", tag, m, k);
                /* 1 + 5 * 399.6 points: beyond burst_5h's room */
                expect(check(w, m, rid, 0, 399600, &d), QG_REJECT,
                       "refuse");
            }
    });
    PHASE(f[3], n, {
        for (int k = 0; k < per; k++)
            for (int m = 0; m < w->nmemb; m++) {
                w->now += 50;
                snprintf(rid, sizeof rid, "%s-%d-%d", tag, m, k);
                settle(w, m, rid);
            }
    });
    PHASE(f[4], w->nmemb, {
        for (int m = 0; m < w->nmemb; m++)
            usage(w, m);
    });
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    int nsmall = (int)env_long("QG_BENCH_REDIS_SMALL", 500);
    int nlog = (int)env_long("QG_BENCH_REDIS_LARGE_ENTRIES", 400);
    int nlarge = (int)env_long("QG_BENCH_REDIS_LARGE_MEMBERS", 40);
    static fig f[MAX_ROUNDS][NPHASES];
    if (rounds < 1 || rounds > MAX_ROUNDS)
        rounds = 3;
    if (!redisproc_binary())
        die("redis-server", "not found (set QG_REDIS_SERVER)");
    if (getenv("QG_BENCH_REDIS_CALLGRIND"))
        cg_setup();
    if (redisproc_start(&srv, NULL) != 0)
        die("redis-server", srv.why);
    for (int r = 0; r < rounds; r++) {
        world w;
        qg_decision d;
        char rid[48];
        /* small state: 4 requests per member, admitted a few at a time */
        world_open(&w, nsmall, 50);
        phases(&w, 4, "s", &f[r][0]);
        world_close(&w);
        /* large rolling logs: nlog settled requests per member first */
        world_open(&w, nlarge, 2);
        for (int k = 0; k < nlog; k++)
            for (int m = 0; m < w.nmemb; m++) {
                w.now += 500;
                snprintf(rid, sizeof rid, "b-%d-%d", m, k);
                expect(check(&w, m, rid, 800, 400, &d), QG_ALLOW, "build");
                settle(&w, m, rid);
            }
        phases(&w, 6, "l", &f[r][5]);
        world_close(&w);
    }
    printf("Redis CPU per operation, median of %d rounds (INFO commandstats;"
           " small: %d members, large: %d-entry rolling logs)\n", rounds,
           nsmall, nlog);
    printf("%-24s %14s %16s%s\n", "phase", "EVALSHA us", "all cmds us/op",
           cg_dir[0] ? "   EVALSHA instr  all instr/op" : "");
    for (int p = 0; p < NPHASES; p++) {
        double e[MAX_ROUNDS], a[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) {
            e[r] = f[r][p].evalsha;
            a[r] = f[r][p].all_per_op;
        }
        qsort(e, (size_t)rounds, sizeof *e, cmp_double);
        qsort(a, (size_t)rounds, sizeof *a, cmp_double);
        printf("%-24s %14.1f %16.1f", phase_names[p], e[rounds / 2],
               a[rounds / 2]);
        if (cg_dir[0])
            printf("  %14.0f %13.0f", f[0][p].ir_evalsha, f[0][p].ir_per_op);
        printf("\n");
    }
    if (getenv("QG_BENCH_REDIS_LOG")) {
        /* the server's log (what a script wrote with redis.log) */
        char c[400];
        snprintf(c, sizeof c, "cp %s/redis.log %s", srv.dir,
                 getenv("QG_BENCH_REDIS_LOG"));
        if (system(c) != 0)
            fprintf(stderr, "bench_redis: could not copy the log\n");
    }
    redisproc_stop(&srv);
    if (cg_dir[0] && getenv("QG_BENCH_REDIS_KEEP")) {
        fprintf(stderr, "bench_redis: callgrind dumps kept in %s (one per "
                "phase, in order)\n", cg_dir);
    } else if (cg_dir[0]) {
        char c[128];
        snprintf(c, sizeof c, "rm -rf %s", cg_dir);
        if (system(c) != 0)
            fprintf(stderr, "bench_redis: could not remove %s\n", cg_dir);
    }
    return 0;
}
