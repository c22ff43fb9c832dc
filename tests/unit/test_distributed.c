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
 *    the subject is never admitted beyond its limit.
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

static int setup(void **state)
{
    char url[128];
    const char *args[3];
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
    args[0] = "--store";
    args[1] = url;
    args[2] = NULL;
    for (int i = 0; i < NINST; i++) {
        if (qgproc_init(&P[i]) < 0 ||
            qgproc_start_copy(&P[i], td("redis/rules.yaml"), args, NULL) < 0)
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    int rc = 0;
    (void)state;
    for (int i = 0; i < NINST; i++)
        if (P[i].pid && qgproc_finish(&P[i]) < 0)
            rc = -1;
    redisproc_stop(&R);
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
} race;

static void *client(void *arg)
{
    race *rc = arg;
    long me = atomic_fetch_add(&rc->next, 1);
    httpc c;
    int misses = 0;
    httpc_init(&c, qgproc_port(&P[me % NINST]));
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
    static race rc = {{"solo", "solo"}, "solo", 0, 0, 0, 0, 0};
    (void)state;
    if (!have_redis)
        skip();
    run_race(&rc);
    assert_int_equal(rc.errors, 0);
    assert_int_equal(rc.allowed, 100);
}

static void test_org_pool_exactly_100(void **state)
{
    static race rc = {{"m1", "m2"}, "pool", 0, 0, 0, 0, 0};
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
