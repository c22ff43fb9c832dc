/* test_pg_gateway.c - gateways on a PostgreSQL ledger, end to end: real
 * `quotagate serve` processes (tests/support/qgproc) with
 * --ledger postgresql://..., a real PostgreSQL 15 started by the test
 * (tests/support/pgproc), rows read back with SQL as an operator would.
 *
 *  - subjects and keys created through one instance work at another one
 *    within a second; a key revoked with the CLI stops working there
 *    within a second;
 *  - two gateways on one database under load over the same subjects:
 *    no batch rolled back (their writers deadlocked on the rollup), no
 *    call failed, every acknowledged settle in PostgreSQL;
 *  - kill -9 of a gateway under load, five times: every acknowledged
 *    settle is in PostgreSQL exactly once, and the usage after the last
 *    restart (rebuilt from PostgreSQL) equals the ledger's;
 *  - PostgreSQL stopped for 10 s under load and started again: /healthz
 *    says "spooling" meanwhile, every acknowledged row arrives exactly
 *    once, and the spool empties;
 *  - when the spool cannot be written either (a file size limit set on
 *    the running gateway with prlimit), checks are refused with 503
 *    ledger_unavailable, and serving resumes once it can. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "httpc.h"
#include "pgproc.h"
#include "qgproc.h"
#include "runcli.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY
#define NCLIENTS 8

static pgproc PG;
static int pg_started;
static char DB[64], URL[256];
static qgproc A, B;
static int a_used, b_used;

static const char rules_text[] =
    "version: \"pg-1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-10-15\"\n"
    "  models:\n"
    "    standard: { per_request: 1, input_per_1k: 1, output_per_1k: 5 }\n"
    "plans:\n"
    "  short:\n"
    "    price: { usd_month: 10 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 1000000 }\n"
    "    overage: { policy: reject }\n"
    "  other:\n"
    "    price: { usd_month: 20 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 2000000 }\n"
    "    overage: { policy: reject }\n"
    "subjects:\n"
    "  load: { plan: short }\n"
    "  l0: { plan: short }\n"
    "  l1: { plan: short }\n"
    "  l2: { plan: short }\n"
    "  l3: { plan: short }\n"
    "  l4: { plan: short }\n"
    "  l5: { plan: short }\n";

static int group_setup(void **state)
{
    (void)state;
    if (!pgproc_bindir()) {
        fprintf(stderr, "test_pg_gateway: no PostgreSQL binaries "
                "(make test installs Debian's postgresql)\n");
        return -1;
    }
    if (pgproc_start(&PG) < 0) {
        fprintf(stderr, "test_pg_gateway: PostgreSQL: %s\n", PG.why);
        return -1;
    }
    pg_started = 1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (pg_started)
        pgproc_destroy(&PG);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    if (PG.pid == 0 && pgproc_restart(&PG) < 0)
        return -1;
    if (pgproc_createdb(&PG, DB, sizeof DB) < 0) {
        fprintf(stderr, "createdb: %s\n", PG.why);
        return -1;
    }
    pgproc_url(&PG, DB, URL, sizeof URL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (a_used)
        qgproc_cleanup(&A);
    if (b_used)
        qgproc_cleanup(&B);
    a_used = b_used = 0;
    tst_gc_free_all();
    return 0;
}

static void start_gw(qgproc *p, int *used)
{
    const char *args[] = {"--ledger", URL, NULL};
    if (qgproc_init(p) < 0)
        fail_msg("qgproc_init: %s", p->why);
    *used = 1;
    if (qgproc_write_file(qgproc_path(p, "rules.yaml"), rules_text) < 0 ||
        qgproc_start(p, qgproc_path(p, "rules.yaml"), args, NULL) < 0) {
        fail_msg("serve on %s did not start: %s", URL, p->why);
    }
}

static http_resp *call(qgproc *p, const char *method, const char *path,
                       const char *key, const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    httpc c;
    assert_non_null(r);
    httpc_init(&c, qgproc_port(p));
    if (httpc_call(&c, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, c.err);
    httpc_close(&c);
    return r;
}

/* One SQL value from the test's database. */
static const char *sql(const char *q)
{
    char out[4096];
    if (pgproc_sql(&PG, DB, q, out, sizeof out) < 0)
        fail_msg("SQL %s: %s", q, PG.why);
    return tst_fmt("%s", out);
}

static json_t *healthz(qgproc *p)
{
    return tst_jparse(call(p, "GET", "/healthz", NULL, NULL), "/healthz");
}

/* A metric's value from /metrics (-1 when absent). */
static double metric(qgproc *p, const char *name)
{
    http_resp *r = call(p, "GET", "/metrics", NULL, NULL);
    const char *b = r->body;
    size_t n = strlen(name);
    while (b && (b = strstr(b, name))) {
        if ((b == r->body || b[-1] == '\n') && b[n] == ' ')
            return atof(b + n + 1);
        b += n;
    }
    return -1;
}

/* Wait until the gateway's ledger queue is empty (every row committed),
 * up to 30 s. */
static void drained(qgproc *p)
{
    for (int i = 0; i < 600; i++) {
        if (metric(p, "quotagate_ledger_queue_depth") == 0 &&
            metric(p, "quotagate_ledger_spool_rows") <= 0)
            return;
        tst_sleep_ms(50);
    }
    fail_msg("the ledger queue did not drain in 30 s");
}

/* ------------------------------------------------- load: check + settle */

typedef struct load {
    qgproc *p;
    const char *tag;
    int nsubjects;             /* > 0: l0 .. l<n-1> in turn, else "load" */
    _Atomic int stop;
    _Atomic long next, checks, settles, refused_503, errors;
    pthread_mutex_t mu;
    char (*acked)[48];         /* settles answered 200 */
    size_t nacked, cap;
} load;

static void *client(void *arg)
{
    load *ld = arg;
    long me = atomic_fetch_add(&ld->next, 1);
    for (long k = 0; !atomic_load(&ld->stop); k++) {
        char rid[48], body[256];
        http_resp r;
        httpc c;
        int st;
        char who[16] = "load";
        snprintf(rid, sizeof rid, "%s-%ld-%ld", ld->tag, me, k);
        if (ld->nsubjects > 0)
            snprintf(who, sizeof who, "l%ld", (me * 3 + k) % ld->nsubjects);
        httpc_init(&c, qgproc_port(ld->p));
        snprintf(body, sizeof body, "{\"subject\":\"%s\",\"request_id\":"
                 "\"%s\",\"weight\":1}", who, rid);
        memset(&r, 0, sizeof r);
        st = httpc_post_json(&c, "/v1/check", SERVICE, body, &r) < 0
                 ? -1
                 : r.status;
        http_resp_free(&r);
        if (st == 200) {
            atomic_fetch_add(&ld->checks, 1);
            snprintf(body, sizeof body, "{\"request_id\":\"%s\",\"weight\":"
                     "2,\"status\":\"completed\",\"subject\":\"%s\"}",
                     rid, who);
            memset(&r, 0, sizeof r);
            st = httpc_post_json(&c, "/v1/settle", SERVICE, body, &r) < 0
                     ? -1
                     : r.status;
            http_resp_free(&r);
            if (st == 200) {
                atomic_fetch_add(&ld->settles, 1);
                pthread_mutex_lock(&ld->mu);
                if (ld->nacked == ld->cap) {
                    size_t cap = ld->cap ? ld->cap * 2 : 1024;
                    void *a = realloc(ld->acked, cap * sizeof *ld->acked);
                    if (a) {
                        ld->acked = a;
                        ld->cap = cap;
                    }
                }
                if (ld->nacked < ld->cap)
                    memcpy(ld->acked[ld->nacked++], rid, sizeof rid);
                pthread_mutex_unlock(&ld->mu);
            }
        }
        if (st == 503)
            atomic_fetch_add(&ld->refused_503, 1);
        else if (st != 200)
            atomic_fetch_add(&ld->errors, 1);
        httpc_close(&c);
        if (st != 200)
            tst_sleep_ms(5);     /* killed or refusing: not a busy loop */
    }
    return NULL;
}

static void load_start_on(load *ld, pthread_t *th, qgproc *p,
                          const char *tag, int nsubjects)
{
    memset(ld, 0, sizeof *ld);
    ld->p = p;
    ld->tag = tag;
    ld->nsubjects = nsubjects;
    pthread_mutex_init(&ld->mu, NULL);
    for (int i = 0; i < NCLIENTS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client, ld), 0);
}

static void load_start(load *ld, pthread_t *th, qgproc *p, const char *tag)
{
    load_start_on(ld, th, p, tag, 0);
}

static void load_stop(load *ld, pthread_t *th)
{
    atomic_store(&ld->stop, 1);
    for (int i = 0; i < NCLIENTS; i++)
        pthread_join(th[i], NULL);
}

static void load_free(load *ld)
{
    free(ld->acked);
    pthread_mutex_destroy(&ld->mu);
}

/* Every acknowledged settle is in the ledger exactly once, settled at
 * its weight (2 points). */
static void verify_rows(load *ld, const char *what)
{
    size_t i, len = 64 + ld->nacked * 52;
    char *ids = malloc(len), *w = ids;
    long got;
    assert_non_null(ids);
    assert_true(ld->nacked > 0);
    for (i = 0; i < ld->nacked; i++)
        w += sprintf(w, "%s'%s'", i ? "," : "", ld->acked[i]);
    got = atol(sql(tst_fmt("SELECT count(*) FROM requests WHERE status = 2 "
                           "AND weight_milli = 2000 AND request_id IN (%s)",
                           ids)));
    if (got != (long)ld->nacked) {
        /* say which: acknowledged ids whose row is missing or not settled
         * at 2 points, and what PostgreSQL holds for the first */
        const char *bad = sql(tst_fmt(
            "SELECT string_agg(a, ' ') FROM (SELECT a FROM unnest(ARRAY[%s]) "
            "a WHERE NOT EXISTS (SELECT 1 FROM requests WHERE request_id = a "
            "AND status = 2 AND weight_milli = 2000) LIMIT 5) y", ids));
        char *first = tst_fmt("%s", bad), *sp = strchr(first, ' ');
        if (sp)
            *sp = '\0';
        fprintf(stderr, "%s: not settled at 2 points: %s; row (seq decision "
                "status reserved weight created settled): %s\n", what, bad,
                sql(tst_fmt("SELECT concat_ws(' ', seq, decision, status, "
                            "reserved_milli, weight_milli, created_ms, "
                            "settled_ms) FROM requests WHERE request_id = "
                            "'%s'", first)));
        free(ids);
        free(ld->acked);
        ld->acked = NULL;
        fail_msg("%s: %zu settles acknowledged, %ld of them in PostgreSQL "
                 "settled at 2 points", what, ld->nacked, got);
    }
    free(ids);
}

/* verify_rows, and the gateway's usage equals the ledger's. */
static void verify(load *ld, qgproc *p, const char *what)
{
    long used_ledger;
    double used_gw;
    verify_rows(ld, what);
    /* request ids are the primary key: no id has two rows; the charge:
     * the gateway's counters (after the last restart: rebuilt from
     * PostgreSQL) against the ledger's rows */
    drained(p);
    used_ledger = atol(sql("SELECT coalesce(sum(weight_milli), 0) FROM "
                           "requests WHERE subject = 'load' AND "
                           "decision = 1"));
    used_gw = 0;
    {
        json_t *j = tst_jparse(call(p, "GET", "/v1/usage/load", ADMIN, NULL),
                               "usage");
        json_t *win = json_array_get(json_object_get(j, "windows"), 0);
        used_gw = tst_jnum(win, "used", "usage window");
    }
    if ((long)(used_gw * 1000 + 0.5) != used_ledger)
        fail_msg("%s: the gateway counts %.3f points used, the ledger's "
                 "admitted rows %ld milli-points", what, used_gw,
                 used_ledger);
}

/* --------------------------------------------------------------- tests */

static void test_shared_subjects_and_keys(void **state)
{
    json_t *j;
    const char *key, *id;
    tst_cli_result cr;
    (void)state;
    start_gw(&A, &a_used);
    start_gw(&B, &b_used);
    /* a subject created at A: unknown at B before, known within 1 s */
    WANT(call(&B, "GET", "/v1/usage/fresh", ADMIN, NULL), 404,
         "a subject nobody created");
    WANT(call(&A, "POST", "/v1/admin/subjects", ADMIN,
              "{\"subject\":\"fresh\",\"plan\":\"other\"}"),
         200, "create at A");
    tst_sleep_ms(1000);
    j = tst_jparse(call(&B, "GET", "/v1/usage/fresh", ADMIN, NULL),
                   "usage at B");
    if (strcmp(tst_jstr(j, "plan", "usage at B"), "other") != 0)
        fail_msg("B sees subject fresh with plan %s, expected other",
                 tst_jstr(j, "plan", "usage at B"));
    WANT(call(&B, "POST", "/v1/check", SERVICE,
              "{\"subject\":\"fresh\",\"request_id\":\"f-1\",\"weight\":1}"),
         200, "check at B of a subject created at A");
    /* a key made at A works at B within a second */
    j = tst_jparse(call(&A, "POST", "/v1/admin/keys", ADMIN,
                        "{\"subject\":\"fresh\"}"), "key at A");
    key = tst_fmt("%s", tst_jstr(j, "key", "key at A"));
    id = tst_fmt("%s", tst_jstr(j, "id", "key at A"));
    tst_sleep_ms(1000);
    WANT(call(&B, "GET", "/v1/usage", key, NULL), 200,
         "the key made at A, at B");
    /* revoked with the CLI on the same database: refused at B within 1 s */
    cr = tst_cli_run("keys", "revoke", id, "--ledger", URL, NULL);
    if (cr.rc != 0)
        fail_msg("keys revoke --ledger: exit %d: %s", cr.rc, cr.err);
    tst_cli_done(&cr);
    tst_sleep_ms(1000);
    WANT(call(&B, "GET", "/v1/usage", key, NULL), 401,
         "the key revoked a second ago, at B");
    WANT(call(&A, "GET", "/v1/usage", key, NULL), 401,
         "the key revoked a second ago, at A");
    /* a key made with the CLI on the database works at both */
    cr = tst_cli_run("keys", "create", "fresh", "--ledger", URL, NULL);
    if (cr.rc != 0)
        fail_msg("keys create --ledger: exit %d: %s", cr.rc, cr.err);
    {
        char *last = strrchr(cr.out, '\n'), *nl;
        while (last && last > cr.out && last[1] == '\0') {
            *last = '\0';
            last = strrchr(cr.out, '\n');
        }
        key = tst_fmt("%s", last ? last + 1 : cr.out);
        if ((nl = strchr((char *)key, '\n')))
            *nl = '\0';
    }
    tst_cli_done(&cr);
    tst_sleep_ms(1000);
    WANT(call(&A, "GET", "/v1/usage", key, NULL), 200,
         "the key made with the CLI, at A");
    WANT(call(&B, "GET", "/v1/usage", key, NULL), 200,
         "the key made with the CLI, at B");
    cr = tst_cli_run("keys", "list", "--ledger", URL, NULL);
    if (cr.rc != 0 || !strstr(cr.out, id))
        fail_msg("keys list --ledger does not show %s: %s", id, cr.out);
    tst_cli_done(&cr);
}

/* Two gateways on one database under check+settle load over the same
 * few subjects, each settle answered once committed.  Their writers used
 * to deadlock on the history's rollup (usage_slots): PostgreSQL rolled one
 * batch back after a second and its settles were answered 503
 * (bench/pg_bench.sh's two instances).  Now no call fails, no batch is
 * rolled back or fails, every acknowledged settle is in PostgreSQL, and
 * the rollup holds what the rows hold. */
static void test_two_gateways_one_database(void **state)
{
    pthread_t ta[NCLIENTS], tb[NCLIENTS];
    load la, lb;
    const char *log;
    (void)state;
    start_gw(&A, &a_used);
    start_gw(&B, &b_used);
    load_start_on(&la, ta, &A, "ga", 6);
    load_start_on(&lb, tb, &B, "gb", 6);
    tst_sleep_ms(4000);
    load_stop(&la, ta);
    load_stop(&lb, tb);
    fprintf(stderr, "two gateways: %ld + %ld settles acknowledged, %ld + %ld "
            "answered 503, %ld + %ld other failures\n",
            atomic_load(&la.settles), atomic_load(&lb.settles),
            atomic_load(&la.refused_503), atomic_load(&lb.refused_503),
            atomic_load(&la.errors), atomic_load(&lb.errors));
    for (int i = 0; i < 2; i++) {
        qgproc *p = i ? &B : &A;
        drained(p);
        log = tst_slurp(qgproc_path(p, "stderr.log"));
        if (strstr(log, "rolled back") || strstr(log, "cannot commit"))
            fail_msg("gateway %c's log: %s", "AB"[i], log);
    }
    assert_int_equal(atomic_load(&la.refused_503) + atomic_load(&la.errors) +
                         atomic_load(&lb.refused_503) +
                         atomic_load(&lb.errors),
                     0);
    verify_rows(&la, "gateway A");
    verify_rows(&lb, "gateway B");
    assert_string_equal(
        sql("SELECT coalesce(sum(weight_milli), 0) FROM usage_slots"),
        sql("SELECT coalesce(sum(weight_milli), 0) FROM requests"
            " WHERE decision = 1"));
    load_free(&la);
    load_free(&lb);
}

static void test_kill9_five_times(void **state)
{
    pthread_t th[NCLIENTS];
    load ld;
    (void)state;
    start_gw(&A, &a_used);
    load_start(&ld, th, &A, "k9");
    for (int round = 0; round < 5; round++) {
        tst_sleep_ms(400 + 150 * round);
        if (qgproc_kill9(&A) < 0)
            fail_msg("kill -9: the gateway was not running");
        if (qgproc_restart(&A) < 0)
            fail_msg("restart %d after kill -9: %s", round + 1, A.why);
    }
    tst_sleep_ms(300);
    load_stop(&ld, th);
    fprintf(stderr, "kill -9 x5: %ld checks and %ld settles acknowledged, "
            "%ld calls failed (killed mid-call)\n", atomic_load(&ld.checks),
            atomic_load(&ld.settles), atomic_load(&ld.errors));
    /* the counters after one more restart come from PostgreSQL alone */
    if (qgproc_kill9(&A) < 0 || qgproc_restart(&A) < 0)
        fail_msg("last restart: %s", A.why);
    verify(&ld, &A, "after five kills");
    load_free(&ld);
}

static void test_pg_stopped_10s(void **state)
{
    pthread_t th[NCLIENTS];
    load ld;
    int spooling_seen = 0, ok = 0;
    double spooled, replayed;
    (void)state;
    start_gw(&A, &a_used);
    load_start(&ld, th, &A, "st");
    tst_sleep_ms(500);
    pgproc_stop(&PG);
    for (int i = 0; i < 20; i++) {       /* 10 s without PostgreSQL */
        json_t *j = healthz(&A);
        spooling_seen |= strcmp(tst_jstr(j, "ledger_state", "healthz"),
                                "spooling") == 0;
        tst_sleep_ms(500);
    }
    if (pgproc_restart(&PG) < 0)
        fail_msg("PostgreSQL did not start again: %s", PG.why);
    for (int i = 0; i < 300 && !ok; i++) {
        json_t *j = healthz(&A);
        ok = strcmp(tst_jstr(j, "ledger_state", "healthz"), "ok") == 0;
        if (!ok)
            tst_sleep_ms(100);
    }
    tst_sleep_ms(300);
    load_stop(&ld, th);
    if (!spooling_seen)
        fail_msg("/healthz never said ledger_state \"spooling\" while "
                 "PostgreSQL was stopped");
    if (!ok)
        fail_msg("/healthz did not say ledger_state \"ok\" within 30 s of "
                 "PostgreSQL's start");
    spooled = metric(&A, "quotagate_ledger_rows_spooled_total");
    replayed = metric(&A, "quotagate_ledger_rows_replayed_total");
    fprintf(stderr, "PostgreSQL stopped 10 s: %ld settles acknowledged, "
            "%.0f rows spooled, %.0f replayed, %ld calls refused 503\n",
            atomic_load(&ld.settles), spooled, replayed,
            atomic_load(&ld.refused_503));
    if (spooled <= 0 || replayed != spooled)
        fail_msg("spooled %.0f rows, replayed %.0f", spooled, replayed);
    verify(&ld, &A, "after PostgreSQL's 10 s away");
    /* in order: each client's requests (one after the other: check k,
     * its settle, then check k + 1) were inserted in that order, spooled
     * or not (seq: the insertion order PostgreSQL numbers) */
    {
        long late = atol(sql("SELECT count(*) FROM (SELECT seq, lag(seq) "
                             "OVER (PARTITION BY split_part(request_id, "
                             "'-', 2) ORDER BY split_part(request_id, '-', "
                             "3)::int) AS prev FROM requests WHERE "
                             "request_id LIKE 'st-%') x WHERE prev IS NOT "
                             "NULL AND seq < prev"));
        if (late != 0)
            fail_msg("%ld requests reached PostgreSQL before an earlier "
                     "request of the same client", late);
    }
    load_free(&ld);
}

static int prlimit_fsize(pid_t pid, const char *value)
{
    char pidarg[32], fs[64];
    pid_t c;
    int st = 0;
    snprintf(pidarg, sizeof pidarg, "%d", (int)pid);
    snprintf(fs, sizeof fs, "--fsize=%s", value);
    if ((c = fork()) == 0) {
        execlp("prlimit", "prlimit", "--pid", pidarg, fs, (char *)NULL);
        _exit(127);
    }
    if (c < 0 || waitpid(c, &st, 0) != c)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void test_spool_unwritable_refuses(void **state)
{
    http_resp *r = NULL;
    int refused = 0, back = 0;
    (void)state;
    start_gw(&A, &a_used);
    WANT(call(&A, "POST", "/v1/check", SERVICE,
              "{\"subject\":\"load\",\"request_id\":\"u-0\",\"weight\":1}"),
         200, "check with PostgreSQL up");
    /* no file of the gateway may grow past 1 byte: the spool's header
     * exists already, its first record cannot be written */
    if (prlimit_fsize(A.pid, "1:unlimited") < 0)
        fail_msg("prlimit --fsize on the gateway failed");
    pgproc_stop(&PG);
    for (int i = 1; i <= 200 && !refused; i++) {
        r = call(&A, "POST", "/v1/check", SERVICE,
                 tst_fmt("{\"subject\":\"load\",\"request_id\":\"u-%d\","
                         "\"weight\":1}", i));
        if (r->status == 503 &&
            strcmp(tst_error_type(r, "check"), "ledger_unavailable") == 0)
            refused = 1;
        else
            tst_sleep_ms(20);
    }
    if (!refused)
        fail_msg("with neither PostgreSQL nor the spool writable, checks "
                 "were still admitted: %s", tst_excerpt(r));
    WANT(call(&A, "GET", "/healthz", NULL, NULL), 200,
         "/healthz while refusing");
    /* the spool can grow again and PostgreSQL is back: serving resumes */
    if (prlimit_fsize(A.pid, "unlimited:unlimited") < 0)
        fail_msg("prlimit --fsize=unlimited failed");
    if (pgproc_restart(&PG) < 0)
        fail_msg("PostgreSQL did not start again: %s", PG.why);
    for (int i = 0; i < 300 && !back; i++) {
        r = call(&A, "POST", "/v1/check", SERVICE,
                 tst_fmt("{\"subject\":\"load\",\"request_id\":\"v-%d\","
                         "\"weight\":1}", i));
        back = r->status == 200;
        if (!back)
            tst_sleep_ms(100);
    }
    if (!back)
        fail_msg("checks were not admitted again within 30 s: %s",
                 tst_excerpt(r));
    drained(&A);
    /* what was admitted before the refusals is in the ledger */
    if (atol(sql("SELECT count(*) FROM requests WHERE request_id = 'u-0' "
                 "AND decision = 1")) != 1)
        fail_msg("the check admitted before the outage is not in the "
                 "ledger");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shared_subjects_and_keys, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_two_gateways_one_database,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill9_five_times, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pg_stopped_10s, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_spool_unwritable_refuses, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
