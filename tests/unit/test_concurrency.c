/* test_concurrency.c - the engine under many threads at once.
 *
 * Admission and the charge to every counter are one atomic step (PRODUCT.md
 * section 3), so however threads interleave:
 *  - the admitted weight never exceeds any window's limit, and when demand
 *    exceeds supply it reaches the limit exactly (1-point requests against
 *    1000-point windows: exactly 1000 admitted, for one subject and for an
 *    org shared by many members);
 *  - a concurrency window never has more than N requests in flight (counted
 *    here with an atomic between admission and settle);
 *  - one request id sent by many threads at once is admitted once, every
 *    other answer is a replay.
 * Time is a fixed instant or a shared virtual clock advanced with an atomic
 * counter (threads may present it slightly out of order; the engine clamps
 * it).  Nothing here depends on wall-clock time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <cmocka.h>
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"

#define NTHREADS 8
#define PER_THREAD 500
#define NMEMBERS 64
#define T0_MS 1772445600000LL          /* 2026-03-02T10:00:00Z */

static const char rules_text[] =
    "version: \"c1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0, output_per_1k: 0 }\n"
    "plans:\n"
    "  solo:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 1000 }\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 1000 }\n"
    "      - { name: hourly_rate, type: rate, per: 1h, limit: 1000 }\n"
    "      - { name: sess, type: session, length: 5h, limit: 1000 }\n"
    "  member:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 5h, limit: 100 }\n"
    "  slots:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 1000000 }\n"
    "    concurrency: 4\n"
    "    lease_ttl: 10m\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 2h, limit: 5000 }\n"
    "  big:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 2h, limit: 1000 }\n"
    "      - { name: org_monthly, type: calendar, every: month, at: \"1 00:00\", tz: \"UTC\", limit: 100000 }\n"
    "  pool:\n"
    "    windows:\n"
    "      - { name: org_burst, type: rolling, length: 2h, limit: 1000000 }\n"
    "    concurrency: 6\n"
    "subjects:\n"
    "  solo1: { plan: solo, org: acme }\n"
    "  worker: { plan: slots, org: pool }\n"
    "default_plan: member\n";

typedef struct shared {
    qg_engine *eng;
    const char *subject;      /* NULL: a member chosen per request */
    int clock_step;           /* 0: fixed now; else ms per request */
    int settle;               /* settle every admitted request */
    int same_ids;             /* every thread uses the same request ids */
    atomic_long clock;
    atomic_long admitted_milli, allowed, replayed, errors, refused;
    char first_refusal[160];
    atomic_int in_flight, max_in_flight;
} shared;

typedef struct worker_arg {
    shared *sh;
    int id;
} worker_arg;

static qg_engine *new_engine(qg_store **store)
{
    qg_rules *rules = NULL;
    qg_diag diag;
    char err[300];
    if (qg__rules_parse(rules_text, strlen(rules_text), "test",
                       qg__tz_load_system, NULL, &rules, &diag) != 0) {
        qg__diag_format(&diag, err, sizeof err);
        fail_msg("rules: %s", err);
    }
    *store = qg_store_memory_new(NULL);
    assert_non_null(*store);
    qg_engine *e = qg_engine_new(rules, *store);
    assert_non_null(e);
    for (int i = 0; i < NMEMBERS; i++) {
        char name[32];
        snprintf(name, sizeof name, "member%d", i);
        assert_int_equal(qg_engine_set_subject(e, name, "member", "big", 0,
                                               err, sizeof err), 0);
    }
    return e;
}

static void *worker(void *p)
{
    worker_arg *a = p;
    shared *sh = a->sh;
    static __thread qg_decision d;
    uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(a->id + 1);

    for (int i = 0; i < PER_THREAD; i++) {
        char rid[48], subject[32];
        int64_t now = T0_MS;
        if (sh->clock_step)
            now += atomic_fetch_add(&sh->clock, 1) * sh->clock_step;
        if (sh->same_ids)
            snprintf(rid, sizeof rid, "same-%d", i);
        else
            snprintf(rid, sizeof rid, "t%d-%d", a->id, i);
        if (sh->subject) {
            snprintf(subject, sizeof subject, "%s", sh->subject);
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            snprintf(subject, sizeof subject, "member%d",
                     (int)(x % NMEMBERS));
        }
        qg_check_req req = { .subject = subject, .request_id = rid,
                             .weight_milli = 1000 };
        if (qg_engine_check(sh->eng, &req, now, &d, NULL, 0) != 0) {
            atomic_fetch_add(&sh->errors, 1);
            continue;
        }
        if (d.outcome != QG_ALLOW) {
            if (atomic_fetch_add(&sh->refused, 1) == 0 && d.binding >= 0)
                snprintf(sh->first_refusal, sizeof sh->first_refusal,
                         "%s %s at %lld: outcome %d window %s retry %lld "
                         "used %lld of %lld",
                         subject, rid, (long long)now, d.outcome,
                         d.views[d.binding].name, (long long)d.retry_after_ms,
                         (long long)d.views[d.binding].used_milli,
                         (long long)d.views[d.binding].limit_milli);
            continue;
        }
        if (d.replayed) {
            atomic_fetch_add(&sh->replayed, 1);
            continue;
        }
        atomic_fetch_add(&sh->allowed, 1);
        atomic_fetch_add(&sh->admitted_milli, d.weight_milli);
        /* In flight from admission until just before the settle. */
        int f = atomic_fetch_add(&sh->in_flight, 1) + 1;
        int m = atomic_load(&sh->max_in_flight);
        while (f > m && !atomic_compare_exchange_weak(&sh->max_in_flight, &m, f))
            ;
        for (volatile int spin = 0; spin < 200; spin++)
            ;
        atomic_fetch_sub(&sh->in_flight, 1);
        if (sh->settle) {
            qg_settle_req sr = { .request_id = rid,
                                 .status = QG_SETTLE_COMPLETED,
                                 .weight_milli = -1 };
            qg_settle_result res;
            if (qg_engine_settle(sh->eng, &sr, now, &res, NULL, 0) != 0)
                atomic_fetch_add(&sh->errors, 1);
        }
    }
    return NULL;
}

static void run_threads(shared *sh)
{
    pthread_t th[NTHREADS];
    worker_arg args[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i].sh = sh;
        args[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
}

static int64_t used_of(qg_engine *e, const char *subject, const char *window,
                       int64_t now, int *found)
{
    static qg_decision d;
    assert_int_equal(qg_engine_usage(e, subject, now, &d), 0);
    for (int i = 0; i < d.nviews; i++)
        if (strcmp(d.views[i].name, window) == 0) {
            *found = 1;
            return d.views[i].used_milli;
        }
    *found = 0;
    return 0;
}

/* One subject, every window at 1000 points, 4000 one-point requests. */
static void test_one_subject_exact_limit(void **state)
{
    (void)state;
    qg_store *store;
    static shared sh;
    int found;

    memset(&sh, 0, sizeof sh);
    sh.eng = new_engine(&store);
    sh.subject = "solo1";
    sh.settle = 1;
    run_threads(&sh);
    assert_int_equal(atomic_load(&sh.errors), 0);
    assert_int_equal(atomic_load(&sh.admitted_milli), 1000 * 1000);
    assert_int_equal(atomic_load(&sh.allowed), 1000);
    const char *wins[] = { "burst", "daily", "hourly_rate", "sess",
                           "org_burst" };
    for (size_t i = 0; i < sizeof wins / sizeof *wins; i++) {
        int64_t u = used_of(sh.eng, "solo1", wins[i], T0_MS, &found);
        assert_true(found);
        assert_int_equal(u, 1000 * 1000);
    }
    qg_engine_free(sh.eng);
    qg_store_free(store);
}

/* The same on a virtual clock that moves 1 ms per request (4 s in all):
 * the rate window refills about one point meanwhile, but the rolling,
 * daily and session windows hold the total at exactly 1000. */
static void test_one_subject_virtual_clock(void **state)
{
    (void)state;
    qg_store *store;
    static shared sh;
    int found;

    memset(&sh, 0, sizeof sh);
    sh.eng = new_engine(&store);
    sh.subject = "solo1";
    sh.clock_step = 1;
    run_threads(&sh);
    assert_int_equal(atomic_load(&sh.errors), 0);
    assert_int_equal(atomic_load(&sh.admitted_milli), 1000 * 1000);
    int64_t end = T0_MS + NTHREADS * PER_THREAD;
    assert_int_equal(used_of(sh.eng, "solo1", "burst", end, &found),
                     1000 * 1000);
    assert_int_equal(used_of(sh.eng, "solo1", "daily", end, &found),
                     1000 * 1000);
    qg_engine_free(sh.eng);
    qg_store_free(store);
}

/* 64 members of one org (each allowed 100 points) against the org's 1000:
 * the org admits exactly 1000 and no member more than its own 100. */
static void test_org_many_members(void **state)
{
    (void)state;
    qg_store *store;
    static shared sh;
    int found;

    memset(&sh, 0, sizeof sh);
    sh.eng = new_engine(&store);
    sh.subject = NULL;
    sh.clock_step = 1;
    sh.settle = 1;
    run_threads(&sh);
    assert_int_equal(atomic_load(&sh.errors), 0);
    assert_int_equal(atomic_load(&sh.admitted_milli), 1000 * 1000);
    int64_t end = T0_MS + NTHREADS * PER_THREAD, sum = 0;
    for (int i = 0; i < NMEMBERS; i++) {
        char name[32];
        snprintf(name, sizeof name, "member%d", i);
        int64_t u = used_of(sh.eng, name, "burst", end, &found);
        assert_true(found);
        assert_true(u <= 100 * 1000);
        sum += u;
    }
    assert_int_equal(sum, 1000 * 1000);
    assert_int_equal(used_of(sh.eng, "member0", "org_burst", end, &found),
                     1000 * 1000);
    assert_true(found);
    qg_engine_free(sh.eng);
    qg_store_free(store);
}

/* concurrency: 4 (member) inside an org with concurrency: 6: never more
 * than 4 in flight, and every slot is given back by the settles. */
static void test_concurrency_slots(void **state)
{
    (void)state;
    qg_store *store;
    static shared sh;
    int found;

    memset(&sh, 0, sizeof sh);
    sh.eng = new_engine(&store);
    sh.subject = "worker";
    sh.settle = 1;
    run_threads(&sh);
    assert_int_equal(atomic_load(&sh.errors), 0);
    assert_true(atomic_load(&sh.max_in_flight) <= 4);
    assert_true(atomic_load(&sh.max_in_flight) >= 1);
    assert_true(atomic_load(&sh.allowed) > 0);
    assert_int_equal(used_of(sh.eng, "worker", "concurrency", T0_MS, &found),
                     0);
    assert_true(found);
    assert_int_equal(used_of(sh.eng, "worker", "burst", T0_MS, &found),
                     atomic_load(&sh.admitted_milli));
    qg_store_stats st;
    qg_store_stats_get(store, &st);
    assert_int_equal(st.reservations_live, 0);
    qg_engine_free(sh.eng);
    qg_store_free(store);
}

/* Without settles the slots stay taken: exactly 4 admitted. */
static void test_concurrency_no_settle(void **state)
{
    (void)state;
    qg_store *store;
    static shared sh;
    int found;

    memset(&sh, 0, sizeof sh);
    sh.eng = new_engine(&store);
    sh.subject = "worker";
    run_threads(&sh);
    assert_int_equal(atomic_load(&sh.errors), 0);
    assert_int_equal(atomic_load(&sh.allowed), 4);
    assert_int_equal(used_of(sh.eng, "worker", "concurrency", T0_MS, &found),
                     4000);
    qg_engine_free(sh.eng);
    qg_store_free(store);
}

/* Every thread sends the same 500 request ids: each is admitted once. */
static void test_same_ids_race(void **state)
{
    (void)state;
    qg_store *store;
    static shared sh;
    int found;

    memset(&sh, 0, sizeof sh);
    sh.eng = new_engine(&store);
    sh.subject = "solo1";
    sh.same_ids = 1;
    sh.clock_step = 1;
    run_threads(&sh);
    assert_int_equal(atomic_load(&sh.errors), 0);
    if (atomic_load(&sh.refused))
        fail_msg("%ld refusals; first: %s", atomic_load(&sh.refused),
                 sh.first_refusal);
    assert_int_equal(atomic_load(&sh.allowed), PER_THREAD);
    assert_int_equal(atomic_load(&sh.replayed),
                     (NTHREADS - 1) * PER_THREAD);
    assert_int_equal(used_of(sh.eng, "solo1", "burst",
                             T0_MS + NTHREADS * PER_THREAD, &found),
                     PER_THREAD * 1000);
    qg_engine_free(sh.eng);
    qg_store_free(store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_subject_exact_limit),
        cmocka_unit_test(test_one_subject_virtual_clock),
        cmocka_unit_test(test_org_many_members),
        cmocka_unit_test(test_concurrency_slots),
        cmocka_unit_test(test_concurrency_no_settle),
        cmocka_unit_test(test_same_ids_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
