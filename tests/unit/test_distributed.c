/* test_distributed.c - several `quotagate serve` instances on one Redis
 * behave as one gateway (PRODUCT.md 5.1 point 1; issue 10):
 *  - 64 concurrent clients spread over three instances: a subject with a
 *    limit of 100 gets exactly 100 admitted, an org pool over two members
 *    likewise;
 *  - a request id replayed at another instance gets the original answer
 *    and no second charge;
 *  - a reservation made at one instance is settled at another;
 *  - Redis stopped (SIGSTOP) under load: the instances decide locally
 *    within a third each of what was left, /healthz and /metrics say so,
 *    and once Redis answers again what they admitted is charged into it
 *    exactly once (the subject ends at exactly its limit);
 *  - FLUSHALL under load: the counters are rebuilt from the ledgers, and
 *    the subject is never admitted beyond its limit;
 *  - faults during a race through one instance: SCRIPT FLUSH and
 *    FUNCTION FLUSH (reloaded, exactly 100, nothing local), every connection reset mid-pipeline
 *    (CLIENT KILL) and Redis answering errors (OOM writes): never beyond
 *    100, exactly 100 once back, the log naming Redis's error;
 *  - a check Redis runs after the instance refused it locally (writes
 *    held by CLIENT PAUSE) is taken back: exactly 100;
 *  - SIGTERM while checks wait on a silent Redis: a clean exit, and the
 *    instance serves again once restarted.
 * A real redis-server (redisproc) and three real servers (qgproc) on free
 * ports, each with its own SQLite ledger. */
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
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "httpc.h"
#include "qgproc.h"
#include "redisproc.h"
#include "srvtest.h"

#define SERVICE QGPROC_SERVICE_KEY
#define NINST 3
#define NCLIENTS 64

static redisproc R;
static qgproc P[NINST];
static int have_redis;

static const char *td(const char *name)
{
    const char *d = getenv("QG_TESTDATA");
    return tst_fmt("%s/%s", d ? d : "tests/data", name);
}

/* The three instances on the store at url, with the rules at path. */
static int start_instances(const char *url, const char *rules)
{
    const char *args[3] = {"--store", url, NULL};
    for (int i = 0; i < NINST; i++) {
        if (qgproc_init(&P[i]) < 0 ||
            qgproc_start_copy(&P[i], rules, args, NULL) < 0)
            return -1;
    }
    return 0;
}

static int finish_instances(void)
{
    int rc = 0;
    for (int i = 0; i < NINST; i++)
        if (P[i].pid && qgproc_finish(&P[i]) < 0)
            rc = -1;
    return rc;
}

static int setup(void **state)
{
    char url[128];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!redisproc_binary()) {
        fprintf(stderr, "test_distributed: SKIPPED: no redis-server (make "
                "test installs it)\n");
        return 0;
    }
    if (redisproc_start(&R, NULL) < 0) {
        fprintf(stderr, "redis: %s\n", R.why);
        return -1;
    }
    have_redis = 1;
    snprintf(url, sizeof url, "%s", redisproc_url(&R));
    return start_instances(url, td("redis/rules.yaml"));
}

static int teardown(void **state)
{
    int rc;
    (void)state;
    rc = finish_instances();
    redisproc_stop(&R);
    have_redis = 0;
    return rc;
}

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

/* ----------------------------------------------------- the race to 100 */

typedef struct race {
    const char *subjects[2];   /* alternated */
    const char *tag;
    _Atomic long allowed, refused, errors, next;
    _Atomic long allowed_weight;
    int only;                  /* > 0: every client on instance only - 1 */
} race;

static void *client(void *arg)
{
    race *rc = arg;
    long me = atomic_fetch_add(&rc->next, 1);
    httpc c;
    int misses = 0;
    httpc_init(&c, qgproc_port(&P[rc->only > 0 ? rc->only - 1 : me % NINST]));
    /* until this client has seen three refusals in a row: the allowance
     * is then spent (100 points in a rolling day: nothing comes back) */
    for (long k = 0; misses < 3 && k < 200; k++) {
        http_resp r;
        char body[256];
        snprintf(body, sizeof body, "{\"subject\":\"%s\",\"request_id\":"
                 "\"%s-%ld-%ld\",\"weight\":1}", rc->subjects[k % 2],
                 rc->tag, me, k);
        memset(&r, 0, sizeof r);
        if (httpc_post_json(&c, "/v1/check", SERVICE, body, &r) < 0) {
            atomic_fetch_add(&rc->errors, 1);
            misses++;
            continue;
        }
        if (r.status == 200) {
            atomic_fetch_add(&rc->allowed, 1);
            misses = 0;
        } else if (r.status == 429) {
            atomic_fetch_add(&rc->refused, 1);
            misses++;
        } else {
            atomic_fetch_add(&rc->errors, 1);
            fprintf(stderr, "client %ld: HTTP %d %s\n", me, r.status,
                    tst_excerpt(&r));
            misses++;
        }
        http_resp_free(&r);
    }
    httpc_close(&c);
    return NULL;
}

static void run_race(race *rc)
{
    pthread_t th[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client, rc), 0);
    for (int i = 0; i < NCLIENTS; i++)
        pthread_join(th[i], NULL);
    printf("race %s: %ld admitted, %ld refused, %ld errors over %d "
           "instances and %d clients\n", rc->tag, (long)rc->allowed,
           (long)rc->refused, (long)rc->errors, NINST, NCLIENTS);
}

static void test_subject_exactly_100(void **state)
{
    static race rc = {{"solo", "solo"}, "solo", 0, 0, 0, 0, 0, 0};
    (void)state;
    if (!have_redis)
        skip();
    run_race(&rc);
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed, 100);
}

static void test_org_pool_exactly_100(void **state)
{
    static race rc = {{"m1", "m2"}, "pool", 0, 0, 0, 0, 0, 0};
    (void)state;
    if (!have_redis)
        skip();
    run_race(&rc);
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed, 100);
}

/* ------------------------------------------------- one request, two doors */

static json_t *call(int inst, const char *path, const char *body, int want)
{
    httpc c;
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    json_t *j;
    httpc_init(&c, qgproc_port(&P[inst]));
    if (httpc_post_json(&c, path, SERVICE, body, r) < 0)
        fail_msg("instance %d %s: %s", inst, path, c.err);
    httpc_close(&c);
    if (r->status != want)
        fail_msg("instance %d %s: HTTP %d, want %d: %s", inst, path,
                 r->status, want, tst_excerpt(r));
    j = tst_jparse(r, path);
    return j;
}

static double used_of(int inst, const char *subject)
{
    httpc c;
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    json_t *j, *w;
    httpc_init(&c, qgproc_port(&P[inst]));
    if (httpc_get(&c, tst_fmt("/v1/usage/%s", subject), QGPROC_ADMIN_KEY,
                  r) < 0)
        fail_msg("usage: %s", c.err);
    httpc_close(&c);
    j = tst_jparse(r, "usage");
    w = json_array_get(json_object_get(j, "windows"), 0);
    return tst_jnum(w, "used", "usage window");
}

static void test_replay_at_another_instance(void **state)
{
    json_t *a, *b;
    double before, after;
    (void)state;
    if (!have_redis)
        skip();
    a = call(0, "/v1/check", "{\"subject\":\"free1\",\"request_id\":"
             "\"twice-1\",\"weight\":7}", 200);
    before = used_of(1, "free1");
    b = call(1, "/v1/check", "{\"subject\":\"free1\",\"request_id\":"
             "\"twice-1\",\"weight\":7}", 200);
    after = used_of(2, "free1");
    if (!json_is_true(json_object_get(b, "replayed")))
        fail_msg("the replay at another instance is not marked replayed: %s",
                 tst_dump(b));
    assert_true(tst_jnum(a, "weight", "a") == tst_jnum(b, "weight", "b"));
    if (after != before)
        fail_msg("the replay charged again: used %g before, %g after", before,
                 after);
    /* another subject reusing it is refused, at any instance */
    call(2, "/v1/check", "{\"subject\":\"solo\",\"request_id\":\"twice-1\","
         "\"weight\":1}", 400);
}

static void test_settle_at_another_instance(void **state)
{
    json_t *s;
    double used;
    (void)state;
    if (!have_redis)
        skip();
    /* light: 1 + 1/1k input + 2/1k output; reserved at 1000 in, 1000 out:
     * 4 points; settled at 1000 in, 0 out: 2 points */
    call(0, "/v1/check", "{\"subject\":\"free1\",\"request_id\":\"far-1\","
         "\"model\":\"light\",\"input_tokens\":1000,"
         "\"max_output_tokens\":1000}", 200);
    used = used_of(0, "free1");
    s = call(2, "/v1/settle", "{\"request_id\":\"far-1\",\"status\":"
             "\"completed\",\"input_tokens\":1000,\"output_tokens\":0}", 200);
    assert_true(tst_jnum(s, "reserved", "settle") == 4);
    assert_true(tst_jnum(s, "charged", "settle") == 2);
    if (used_of(1, "free1") != used - 2)
        fail_msg("the settle at instance 2 did not reach the counters: used "
                 "%g, want %g", used_of(1, "free1"), used - 2);
    /* settling again, at the first instance: the original answer */
    s = call(0, "/v1/settle", "{\"request_id\":\"far-1\",\"status\":"
             "\"completed\",\"input_tokens\":1000,\"output_tokens\":0}", 200);
    if (!json_is_true(json_object_get(s, "replayed")))
        fail_msg("a second settle elsewhere is not a replay: %s",
                 tst_dump(s));
}

/* ------------------------------------------------------ the store down */

static int check_at(int inst, const char *subject, const char *rid)
{
    httpc c;
    http_resp r;
    int st;
    httpc_init(&c, qgproc_port(&P[inst]));
    memset(&r, 0, sizeof r);
    if (httpc_post_json(&c, "/v1/check", SERVICE,
                        tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                                "\"weight\":1}", subject, rid), &r) < 0)
        fail_msg("instance %d: check: %s", inst, c.err);
    st = r.status;
    http_resp_free(&r);
    httpc_close(&c);
    return st;
}

static json_t *healthz(int inst)
{
    httpc c;
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    httpc_init(&c, qgproc_port(&P[inst]));
    if (httpc_get(&c, "/healthz", NULL, r) < 0)
        fail_msg("healthz: %s", c.err);
    httpc_close(&c);
    return tst_jparse(r, "healthz");
}

/* Wait until every instance's /healthz says store_state `want`. */
static void wait_state(const char *want)
{
    long long t0 = qg_now_ms();
    for (;;) {
        int ok = 1;
        for (int i = 0; i < NINST; i++)
            ok &= strcmp(tst_jstr(healthz(i), "store_state", "healthz"),
                         want) == 0;
        if (ok)
            return;
        if (qg_now_ms() - t0 > 20000)
            fail_msg("the instances did not all reach store_state %s", want);
        tst_sleep_ms(100);
    }
}

/* Round robin over the instances until `n` more are admitted or a round
 * admits none; returns how many were admitted. */
static int admit_round_robin(const char *subject, const char *tag, int n,
                             int *seq)
{
    int got = 0, idle = 0;
    while (got < n && idle < NINST * 2) {
        int st = check_at(*seq % NINST, subject,
                          tst_fmt("%s-%d", tag, *seq));
        (*seq)++;
        if (st == 200) {
            got++;
            idle = 0;
        } else {
            if (st != 429)
                fail_msg("check %s-%d: HTTP %d", tag, *seq - 1, st);
            idle++;
        }
    }
    return got;
}

static void test_redis_stopped(void **state)
{
    int seq = 0, before, during, after;
    json_t *h;
    (void)state;
    if (!have_redis)
        skip();
    before = admit_round_robin("fb", "stop", 30, &seq);
    assert_int_equal(before, 30);
    kill(R.pid, SIGSTOP);
    /* everything the instances can admit locally: a third each of the 70
     * their last views left (23 each at most, 69 in all) */
    during = admit_round_robin("fb", "stop", 1000, &seq);
    h = healthz(0);
    if (strcmp(tst_jstr(h, "store_state", "healthz"), "down") != 0 ||
        strcmp(tst_jstr(h, "fallback", "healthz"), "local") != 0)
        fail_msg("while Redis is stopped /healthz says %s", tst_dump(h));
    kill(R.pid, SIGCONT);
    printf("redis stopped: %d admitted before, %d locally\n", before,
           during);
    if (during <= 0 || before + during > 100)
        fail_msg("%d admitted locally after %d: beyond the limit of 100 or "
                 "none at all", during, before);
    wait_state("ok");
    /* charged back exactly once: the rest of the limit, no more */
    after = admit_round_robin("fb", "stop", 1000, &seq);
    printf("redis back: %d more admitted (limit 100)\n", after);
    assert_int_equal(before + during + after, 100);
}

static void test_flushall(void **state)
{
    int seq = 0, before, after;
    char out[64];
    (void)state;
    if (!have_redis)
        skip();
    before = admit_round_robin("fl", "flush", 60, &seq);
    assert_int_equal(before, 60);
    tst_sleep_ms(300);                  /* the check rows are committed */
    assert_int_equal(redisproc_cmd(&R, out, sizeof out, "FLUSHALL", NULL), 0);
    after = admit_round_robin("fl", "flush", 1000, &seq);
    wait_state("ok");
    after += admit_round_robin("fl", "flush", 1000, &seq);
    printf("flushall: %d admitted before, %d after (limit 100)\n", before,
           after);
    if (before + after > 100)
        fail_msg("after FLUSHALL %d more were admitted over the 60 before: "
                 "beyond the limit of 100", after);
}

/* ------------------------------------------------ faults under load */

/* What a fault does while 64 clients race one instance for a subject's
 * 100: a thread injects it once the race has admitted 30. */
typedef struct fault {
    const char *what;          /* "flush", "kill", "oom" */
    race *rc;
    int done;
    long at;                   /* admitted when it was injected */
} fault;

static int log_lines(const char *needle);

static void *inject(void *arg)
{
    fault *f = arg;
    char out[256];
    long long t0 = qg_now_ms();
    while (atomic_load(&f->rc->allowed) < 30 && qg_now_ms() - t0 < 10000)
        usleep(200);
    f->at = atomic_load(&f->rc->allowed);
    if (strcmp(f->what, "flush") == 0) {
        /* every script gone: NOSCRIPT, loaded again, nothing local */
        f->done = redisproc_cmd(&R, out, sizeof out, "SCRIPT", "FLUSH",
                                NULL) == 0;
    } else if (strcmp(f->what, "fflush") == 0) {
        /* every Function library gone: "Function not found", loaded
         * again, nothing local */
        f->done = redisproc_cmd(&R, out, sizeof out, "FUNCTION", "FLUSH",
                                NULL) == 0;
    } else if (strcmp(f->what, "kill") == 0) {
        /* every client connection reset in the middle of its pipeline,
         * once.  Writes are held first for 20 ms (CLIENT PAUSE WRITE: the
         * checks sent meanwhile wait in Redis, unapplied), so that the
         * kill meets checks in flight however soon the race would end
         * (a CI run under ASan saw it end before the third of a series
         * of unheld resets); the replies of checks Redis applied just
         * before are lost with them.  Each is sent again once on the new
         * connection.  Only once: a second reset can meet the checks sent
         * again, which then go local, under an outage's limits
         * (docs/redis-store.md, "Known limits": a loop of resets here
         * admitted 106 of 100 in a CI run) */
        f->done = redisproc_cmd(&R, out, sizeof out, "CLIENT", "PAUSE",
                                "2000", "WRITE", NULL) == 0;
        tst_sleep_ms(20);
        f->done &= redisproc_cmd(&R, out, sizeof out, "CLIENT", "KILL",
                                 "TYPE", "normal", NULL) == 0;
        f->done &= redisproc_cmd(&R, out, sizeof out, "CLIENT", "UNPAUSE",
                                 NULL) == 0;
    } else {
        /* Redis answers errors: writes refused (OOM) for 400 ms */
        f->done = redisproc_cmd(&R, out, sizeof out, "CONFIG", "SET",
                                "maxmemory", "1", NULL) == 0;
        tst_sleep_ms(400);
        f->done &= redisproc_cmd(&R, out, sizeof out, "CONFIG", "SET",
                                 "maxmemory", "0", NULL) == 0;
    }
    return NULL;
}

/* A counter of instance 0's /metrics (0 when absent). */
static double metric0(const char *name)
{
    httpc c;
    http_resp r;
    double v = 0;
    size_t n = strlen(name);
    memset(&r, 0, sizeof r);
    httpc_init(&c, qgproc_port(&P[0]));
    if (httpc_get(&c, "/metrics", QGPROC_ADMIN_KEY, &r) < 0)
        fail_msg("metrics: %s", c.err);
    for (const char *l = r.body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, name, n) == 0 && l[n] == ' ')
            v = strtod(l + n + 1, NULL);
    http_resp_free(&r);
    httpc_close(&c);
    return v;
}

/* The number of lines of instance 0's stderr containing needle. */
static int log_lines(const char *needle)
{
    FILE *fp = fopen(qgproc_path(&P[0], "stderr.log"), "r");
    char line[2048];
    int n = 0;
    if (!fp)
        return 0;
    while (fgets(line, sizeof line, fp))
        if (strstr(line, needle))
            n++;
    fclose(fp);
    return n;
}

/* One fault during a race on subject through instance 0 alone; then the
 * rest of the limit through all three once the store is back.  Returns
 * what the race admitted. */
static long race_with_fault(race *rc, const char *what, int *after)
{
    pthread_t th;
    fault f = {what, rc, 0, 0};
    int seq = 0;
    assert_int_equal(pthread_create(&th, NULL, inject, &f), 0);
    run_race(rc);
    pthread_join(th, NULL);
    assert_true(f.done);
    if (f.at >= 100)
        fail_msg("the fault came after the race (%ld admitted)", f.at);
    wait_state("ok");
    *after = admit_round_robin(rc->subjects[0], tst_fmt("%s-after", rc->tag),
                               1000, &seq);
    printf("fault %s after %ld admitted: %ld admitted during the race (%ld "
           "refused, %ld errors), %d after: %ld of 100\n", what, f.at,
           (long)rc->allowed, (long)rc->refused, (long)rc->errors, *after,
           (long)rc->allowed + *after);
    return rc->allowed;
}

static void test_script_flushed_under_load(void **state)
{
    static race rc = {{"sf", "sf"}, "sf", 0, 0, 0, 0, 0, 1};
    int after;
    double loads0, local0;
    (void)state;
    if (!have_redis)
        skip();
    loads0 = metric0("quotagate_store_script_loads_total");
    local0 = metric0("quotagate_fallback_decisions_total");
    race_with_fault(&rc, "flush", &after);
    /* decisions are FCALLs of the Function library: the flushed cache
     * holds only the claims' compare-and-set, loaded again when one is
     * needed; no error, no local decision */
    (void)loads0;
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed, 100);
    assert_int_equal(after, 0);
    assert_true(metric0("quotagate_fallback_decisions_total") == local0);
}

static void test_functions_flushed_under_load(void **state)
{
    static race rc = {{"ff", "ff"}, "ff", 0, 0, 0, 0, 0, 1};
    int after;
    double loads0, local0;
    (void)state;
    if (!have_redis)
        skip();
    loads0 = metric0("quotagate_store_script_loads_total");
    local0 = metric0("quotagate_fallback_decisions_total");
    race_with_fault(&rc, "fflush", &after);
    /* loaded again inside the operations: no error, no local decision */
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed, 100);
    assert_int_equal(after, 0);
    if (metric0("quotagate_store_script_loads_total") <= loads0)
        fail_msg("no FUNCTION LOAD after the flush");
    assert_true(metric0("quotagate_fallback_decisions_total") == local0);
}

/* A fault that the instance meets as the store failing: the log names
 * Redis's reason, the race never passes 100, and once the store is back
 * the subject ends at exactly 100. */
static void fault_down(race *rc, const char *what, const char *reason)
{
    int after, lines0 = log_lines("does not answer");
    double local0 = metric0("quotagate_fallback_decisions_total");
    race_with_fault(rc, what, &after);
    printf("fault %s: %.0f decided locally\n", what,
           metric0("quotagate_fallback_decisions_total") - local0);
    assert_int_equal(rc->errors, 0);
    if (rc->allowed > 100)
        fail_msg("%ld admitted during the race: beyond 100",
                 (long)rc->allowed);
    assert_int_equal(rc->allowed + after, 100);
    if (log_lines("does not answer") <= lines0 || log_lines(reason) == 0)
        fail_msg("instance 0's log has no line naming the store's failure "
                 "(%s)", reason);
}

static void test_connections_reset_under_load(void **state)
{
    static race rc = {{"ck", "ck"}, "ck", 0, 0, 0, 0, 0, 1};
    int after, lines0 = log_lines("sent again once");
    double local0;
    (void)state;
    if (!have_redis)
        skip();
    local0 = metric0("quotagate_fallback_decisions_total");
    race_with_fault(&rc, "kill", &after);
    printf("fault kill: %.0f decided locally\n",
           metric0("quotagate_fallback_decisions_total") - local0);
    /* the replies of the whole pipeline lost: each check is sent again
     * once on the new connection (by request id: one the store applied
     * is answered from its record), so exactly 100 */
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed + after, 100);
    if (log_lines("sent again once") <= lines0 ||
        log_lines("connection lost") == 0)
        fail_msg("instance 0's log has no line naming the reset");
}

static void test_redis_answers_errors(void **state)
{
    static race rc = {{"oe", "oe"}, "oe", 0, 0, 0, 0, 0, 1};
    (void)state;
    if (!have_redis)
        skip();
    fault_down(&rc, "oom", "OOM");
}

/* A check Redis applies after this instance gave up on it and refused it
 * locally is taken back: 98 of 100 spent, then Redis holds every write
 * for 3 s (CLIENT PAUSE WRITE).  The check's call times out twice (1 s,
 * sent again once), the instance decides locally and refuses (a third of
 * the 2 left is less than one request), and then Redis runs the held
 * script and admits it.  Once Redis answers, the keeper takes that charge
 * back, so exactly 2 more are admitted: 100 in all (without the take-back,
 * 99: the refused request would keep one of them). */
static void test_refused_locally_applied_later(void **state)
{
    int seq = 0, before, after, st, lines0 = log_lines("taken back");
    char out[64];
    (void)state;
    if (!have_redis)
        skip();
    before = admit_round_robin("vd", "vd", 98, &seq);
    assert_int_equal(before, 98);
    assert_int_equal(redisproc_cmd(&R, out, sizeof out, "CLIENT", "PAUSE",
                                   "3000", "WRITE", NULL), 0);
    st = check_at(0, "vd", "vd-held");
    assert_int_equal(st, 429);
    wait_state("ok");
    after = admit_round_robin("vd", "vd-after", 1000, &seq);
    printf("held write: %d admitted before, the held check refused "
           "locally, %d after (limit 100)\n", before, after);
    assert_int_equal(before + after, 100);
    if (log_lines("taken back") <= lines0)
        fail_msg("instance 0's log does not say the charge was taken back");
}

/* SIGTERM while decisions wait on a Redis that does not answer
 * (SIGSTOP): the calls still in flight end as the instance closes its
 * store lanes, each completing its decision (or its connection closing)
 * while the ledger, the request-id table and the keeper are still there.
 * The instance exits 0, and once restarted it answers again. */
static void test_sigterm_while_redis_silent(void **state)
{
    static race rc = {{"free1", "free1"}, "term", 0, 0, 0, 0, 0, 1};
    pthread_t th[16];
    long long t0;
    int stopped;
    (void)state;
    if (!have_redis)
        skip();
    for (int i = 0; i < 16; i++)
        assert_int_equal(pthread_create(&th[i], NULL, client, &rc), 0);
    t0 = qg_now_ms();
    while (atomic_load(&rc.allowed) < 50 && qg_now_ms() - t0 < 10000)
        tst_sleep_ms(5);
    kill(R.pid, SIGSTOP);
    tst_sleep_ms(300);            /* checks now wait on Redis (timeout 1s) */
    stopped = qgproc_stop(&P[0], 20000);
    kill(R.pid, SIGCONT);
    for (int i = 0; i < 16; i++)
        pthread_join(th[i], NULL);
    printf("sigterm: %ld admitted before and while Redis was silent\n",
           (long)atomic_load(&rc.allowed));
    if (stopped != 0) {
        qgproc_dump_stderr(&P[0]);
        fail_msg("instance 0 did not stop cleanly on SIGTERM with calls "
                 "waiting on Redis: %s", P[0].why);
    }
    assert_int_equal(qgproc_restart(&P[0]), 0);
    wait_state("ok");
    assert_int_equal(check_at(0, "free1", "term-after"), 200);
}

/* ==================================================== a Redis Cluster */

/* Three masters with a replica each (2 s node timeout; the others keep
 * serving while one is down), three gateways on redis-cluster://.  With
 * the rules' store.timeout of 1s a check waits out a slot's migration
 * (TRYAGAIN) instead of being decided locally; a master that is gone
 * still fails at once (its connection is refused). */
static rediscluster C;
static int csetup(void **state)
{
    char url[128];
    (void)state;
    if (!redisproc_binary())
        return 0;
    if (rediscluster_start_opts(&C, 3, 1, 2000, 1) < 0) {
        fprintf(stderr, "cluster: %s\n", C.why);
        return -1;
    }
    have_redis = 1;
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d",
             C.node[0].port, C.node[1].port);
    return start_instances(url, td("redis/rules.yaml"));
}

static int cteardown(void **state)
{
    int rc;
    (void)state;
    rc = finish_instances();
    rediscluster_stop(&C);
    have_redis = 0;
    return rc;
}

static int is_master(const redisproc *n)
{
    char out[256];
    return n->pid && redisproc_cmd(n, out, sizeof out, "ROLE", NULL) == 0 &&
           strncmp(out, "master", 6) == 0;
}

/* Every tag with an entity's state on a master, "TAG@node" per line. */
static void tags_now(char *out, size_t cap)
{
    static char keys[1 << 16];
    out[0] = 0;
    for (int i = 0; i < C.n; i++) {
        if (!is_master(&C.node[i]))
            continue;
        assert_int_equal(redisproc_cmd(&C.node[i], keys, sizeof keys, "KEYS",
                                       "qg:{*}:e:*", NULL), 0);
        for (char *k = strtok(keys, "\n"); k; k = strtok(NULL, "\n")) {
            const char *b = strchr(k, '{'), *e = b ? strchr(b, '}') : NULL;
            if (b && e)
                snprintf(out + strlen(out), cap - strlen(out), "%.*s@%d\n",
                         (int)(e - b - 1), b + 1, i);
        }
    }
}

/* Admit one request for subject and find the master its keys are on:
 * the one tag that appears.  Returns that node's index, the tag in tag. */
static int owner_of(const char *subject, char tag[40])
{
    static char before[1 << 16], after[1 << 16];
    tags_now(before, sizeof before);
    assert_int_equal(check_at(0, subject, tst_fmt("%s-first", subject)), 200);
    tags_now(after, sizeof after);
    for (char *l = strtok(after, "\n"); l; l = strtok(NULL, "\n")) {
        char *at = strchr(l, '@');
        if (!at || strstr(before, l))
            continue;
        snprintf(tag, 40, "%.*s", (int)(at - l), l);
        return atoi(at + 1);
    }
    fail_msg("no new tag on any master after a check of %s", subject);
    return -1;
}

static void node_id(const redisproc *n, char *id, size_t cap)
{
    assert_int_equal(redisproc_cmd(n, id, cap, "CLUSTER", "MYID", NULL), 0);
}

/* Move every key of slot from src to the node on port, in one MIGRATE
 * (as a resharding does, a pipeline of keys at a time): how many. */
static int migrate_keys(const redisproc *src, int port, const char *slot)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", src->port, tv);
    redisReply *k, *m;
    const char **argv;
    char ports[16];
    int n;
    assert_non_null(c);
    assert_false(c->err);
    k = redisCommand(c, "CLUSTER GETKEYSINSLOT %s 100000", slot);
    assert_non_null(k);
    assert_int_equal(k->type, REDIS_REPLY_ARRAY);
    n = (int)k->elements;
    argv = calloc((size_t)n + 8, sizeof *argv);
    snprintf(ports, sizeof ports, "%d", port);
    argv[0] = "MIGRATE";
    argv[1] = "127.0.0.1";
    argv[2] = ports;
    argv[3] = "";
    argv[4] = "0";
    argv[5] = "5000";
    argv[6] = "KEYS";
    for (int i = 0; i < n; i++)
        argv[7 + i] = k->element[i]->str;
    if (n > 0) {
        m = redisCommandArgv(c, n + 7, argv, NULL);
        assert_non_null(m);
        if (m->type == REDIS_REPLY_ERROR)
            fail_msg("MIGRATE: %s", m->str);
        freeReplyObject(m);
    }
    free(argv);
    freeReplyObject(k);
    redisFree(c);
    return n;
}

static void *race_thread(void *arg)
{
    run_race(arg);
    return NULL;
}

static long fallback_decisions(void)
{
    long n = 0;
    for (int i = 0; i < NINST; i++)
        n += (long)tst_jnum(healthz(i), "fallback_decisions", "healthz");
    return n;
}

static void test_cluster_exactly_100(void **state)
{
    static race solo = {{"solo", "solo"}, "cluster solo", 0, 0, 0, 0, 0, 0};
    static race pool = {{"m1", "m2"}, "cluster pool", 0, 0, 0, 0, 0, 0};
    (void)state;
    if (!have_redis)
        skip();
    run_race(&solo);
    run_race(&pool);
    assert_int_equal(solo.errors, 0);
    assert_int_equal(solo.allowed, 100);
    assert_int_equal(pool.errors, 0);
    assert_int_equal(pool.allowed, 100);
}

/* The slot of a subject's keys moves to another master (IMPORTING,
 * MIGRATING, MIGRATE key by key, SETSLOT NODE) while 64 clients race for
 * what is left of its 100: ASK and MOVED followed, exactly 100 in all. */
static void test_cluster_slot_migration(void **state)
{
    static race rc = {{"mig", "mig"}, "migration", 0, 0, 0, 0, 0, 0};
    char tag[40], out[256], ida[64], idb[64], slot[16];
    int a, b, moved;
    long fb0;
    pthread_t th;
    (void)state;
    if (!have_redis)
        skip();
    a = owner_of("mig", tag);
    for (b = 0; b < C.n && (b == a || !is_master(&C.node[b])); b++)
        ;
    assert_true(b < C.n);
    assert_int_equal(redisproc_cmd(&C.node[a], slot, sizeof slot, "CLUSTER",
                                   "KEYSLOT", tst_fmt("{%s}", tag), NULL), 0);
    node_id(&C.node[a], ida, sizeof ida);
    node_id(&C.node[b], idb, sizeof idb);
    fb0 = fallback_decisions();
    assert_int_equal(pthread_create(&th, NULL, race_thread, &rc), 0);
    tst_sleep_ms(20);
    assert_int_equal(redisproc_cmd(&C.node[b], out, sizeof out, "CLUSTER",
                                   "SETSLOT", slot, "IMPORTING", ida, NULL), 0);
    assert_string_equal(out, "OK");
    assert_int_equal(redisproc_cmd(&C.node[a], out, sizeof out, "CLUSTER",
                                   "SETSLOT", slot, "MIGRATING", idb, NULL), 0);
    assert_string_equal(out, "OK");
    moved = migrate_keys(&C.node[a], C.node[b].port, slot);
    assert_int_equal(redisproc_cmd(&C.node[b], out, sizeof out, "CLUSTER",
                                   "SETSLOT", slot, "NODE", idb, NULL), 0);
    for (int i = 0; i < C.n; i++)
        if (i != b && is_master(&C.node[i]))
            redisproc_cmd(&C.node[i], out, sizeof out, "CLUSTER", "SETSLOT",
                          slot, "NODE", idb, NULL);
    pthread_join(th, NULL);
    printf("slot %s moved from node %d to node %d under load: %d keys "
           "migrated, %ld local decisions\n", slot, a, b, moved,
           fallback_decisions() - fb0);
    assert_true(moved > 0);
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed, 99);        /* and owner_of's one */
    /* and the counters live on at the new master */
    assert_int_equal(check_at(1, "mig", "mig-after"), 429);
}

/* The master of a subject's keys killed (kill -9) after its replica has
 * every write: the gateways decide locally while it is gone, the replica
 * takes over, and what was admitted locally is charged into it: exactly
 * 100 in all. */
static void test_cluster_failover(void **state)
{
    char tag[40], out[64];
    int a, seq = 0, before, during, after;
    (void)state;
    if (!have_redis)
        skip();
    a = owner_of("fo", tag);
    before = 1 + admit_round_robin("fo", "fo", 29, &seq);
    assert_int_equal(before, 30);
    assert_int_equal(redisproc_cmd(&C.node[a], out, sizeof out, "WAIT", "1",
                                   "2000", NULL), 0);
    assert_string_equal(out, "1");
    redisproc_kill(&C.node[a]);
    during = admit_round_robin("fo", "fo", 1000, &seq);
    printf("failover: %d admitted before, %d while the master was gone\n",
           before, during);
    if (before + during > 100)
        fail_msg("%d admitted locally after %d: beyond the limit", during,
                 before);
    wait_state("ok");
    after = admit_round_robin("fo", "fo", 1000, &seq);
    printf("failover: %d more once the replica took over (limit 100)\n",
           after);
    assert_int_equal(before + during + after, 100);
    assert_int_equal(redisproc_restart(&C.node[a]), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_subject_exactly_100, gc_teardown),
        cmocka_unit_test_teardown(test_org_pool_exactly_100, gc_teardown),
        cmocka_unit_test_teardown(test_replay_at_another_instance,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_settle_at_another_instance,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_redis_stopped, gc_teardown),
        cmocka_unit_test_teardown(test_flushall, gc_teardown),
        cmocka_unit_test_teardown(test_script_flushed_under_load, gc_teardown),
        cmocka_unit_test_teardown(test_functions_flushed_under_load, gc_teardown),
        cmocka_unit_test_teardown(test_connections_reset_under_load,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_redis_answers_errors, gc_teardown),
        cmocka_unit_test_teardown(test_refused_locally_applied_later,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_sigterm_while_redis_silent,
                                  gc_teardown),
    };
    const struct CMUnitTest cluster[] = {
        cmocka_unit_test_teardown(test_cluster_exactly_100, gc_teardown),
        cmocka_unit_test_teardown(test_cluster_slot_migration, gc_teardown),
        cmocka_unit_test_teardown(test_cluster_failover, gc_teardown),
    };
    int failed;
    if (getenv("QG_TEST_FILTER"))      /* e.g. test_redis_answers_errors */
        cmocka_set_test_filter(getenv("QG_TEST_FILTER"));
    failed = cmocka_run_group_tests_name("one Redis", tests, setup,
                                             teardown);
    return failed + cmocka_run_group_tests_name("a Redis Cluster", cluster,
                                                csetup, cteardown);
}
