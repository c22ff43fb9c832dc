/* test_fallback.c - local decisions while the shared store is down
 * (PRODUCT.md 5.1 point 4, src/core/fallback.c) through the public engine
 * API, with the memory store standing in for the one that went away.
 *
 * Covers: a window's local budget is share x what the last view left (the
 * whole limit for a subject never seen), refusals say when to ask again;
 * concurrency at share x its slots, at least one; a local settle gives
 * back what a request did not use; the journal is handed over oldest
 * first, stops at the first error and resumes there, each request once;
 * an outage's spending carries over: when the store answers and goes
 * again before a fresh view, the same allowance is not granted twice; a
 * fresh view from the store sets the budget again; the store's answers
 * handled out of order (two connections) never loosen a view, and one
 * that arrives in an outage lowers its budgets. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "fallback.h"
#include "quotagate.h"
#include "rules.h"
#include "ruletest.h"
#include "srvtest.h"

#define T_MS 1772409600000LL          /* 2026-03-02T00:00:00Z */
#define SHARE 500                     /* a half, in milli */

static const char rules_text[] =
    "version: \"f1\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1 }\n"
    "plans:\n"
    "  hundred:\n"
    "    windows:\n"
    "      - { name: day, type: rolling, length: 1d, limit: 100 }\n"
    "    concurrency: 1000\n"
    "  five:\n"
    "    windows:\n"
    "      - { name: day, type: rolling, length: 1d, limit: 100 }\n"
    "    concurrency: 5\n"
    "  single:\n"
    "    windows:\n"
    "      - { name: day, type: rolling, length: 1d, limit: 100 }\n"
    "    concurrency: 1\n"
    "subjects:\n"
    "  seen: { plan: hundred }\n"
    "  unseen: { plan: hundred }\n"
    "  flap: { plan: hundred }\n"
    "  one: { plan: single }\n"
    "  five: { plan: five }\n";

typedef struct fx {
    qg_store *store;
    qg_engine *e;
} fx;

static int setup(void **state)
{
    static fx f;
    f.store = qg_store_memory_new(NULL);
    f.e = qg_engine_new(tst_rules_parse(rules_text), f.store);
    if (!f.e || qg_engine_fallback_enable(f.e, 0) != QG_OK)
        return -1;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    qg_engine_free(f->e);
    qg_store_free(f->store);
    return 0;
}

static int check_store(fx *f, const char *subject, const char *rid,
                       int64_t w, int64_t now)
{
    qg_check_req q = {.subject = subject, .request_id = rid,
                      .weight_milli = w * 1000};
    qg_decision d;
    char err[256];
    assert_int_equal(qg_engine_check(f->e, &q, now, &d, err, sizeof err), 0);
    return d.outcome;
}

static int check_local(fx *f, const char *subject, const char *rid,
                       int64_t w, int64_t now, qg_decision *d)
{
    qg_check_req q = {.subject = subject, .request_id = rid,
                      .weight_milli = w * 1000};
    char err[256];
    int rc = qg_engine_check_local(f->e, &q, now, SHARE, d, err, sizeof err);
    if (rc != QG_OK)
        fail_msg("check_local %s: %s", rid, err);
    return d->outcome;
}

/* Admit weight-1 requests locally until one is refused: how many. */
static int admit_local(fx *f, const char *subject, const char *tag, int64_t now)
{
    qg_decision d;
    int n = 0;
    while (n < 1000 &&
           check_local(f, subject, tst_fmt("%s-%d", tag, n), 1, now, &d) ==
               QG_ALLOW)
        n++;
    assert_int_not_equal(d.outcome, QG_ALLOW);
    assert_true(d.retry_after_ms > 0);     /* ask again soon */
    return n;
}

typedef struct drained {
    fx *f;
    int n, fail_at;
    char rids[64][64];
} drained;

/* Hand each journalled request to the store, as the keeper does. */
static int to_store(const qg_restore_req *rr, void *ud)
{
    drained *d = ud;
    char err[256];
    if (d->n == d->fail_at)
        return QG_ESTORE;
    if (d->n < 64)
        snprintf(d->rids[d->n], sizeof d->rids[d->n], "%s", rr->request_id);
    d->n++;
    return qg_engine_restore(d->f->e, rr, err, sizeof err);
}

static double used_in_store(fx *f, const char *subject, int64_t now)
{
    qg_decision d;
    assert_int_equal(qg_engine_usage(f->e, subject, now, &d), 0);
    return (double)d.views[0].used_milli / 1000;
}

static void test_budget_from_the_last_view(void **state)
{
    fx *f = *state;
    drained dr = {f, 0, -1, {{0}}};
    for (int i = 0; i < 40; i++)
        assert_int_equal(check_store(f, "seen", tst_fmt("s%d", i), 1, T_MS + i),
                         QG_ALLOW);
    /* 60 left in the last view: half of it locally */
    assert_int_equal(admit_local(f, "seen", "seen-l", T_MS + 100), 30);
    /* a subject never seen: half its whole limit */
    assert_int_equal(admit_local(f, "unseen", "unseen-l", T_MS + 100), 50);
    assert_int_equal(qg_engine_local_pending(f->e), 80);
    assert_int_equal(qg_engine_local_drain(f->e, to_store, &dr), 0);
    assert_int_equal(dr.n, 80);
    assert_string_equal(dr.rids[0], "seen-l-0");    /* oldest first */
    assert_int_equal(qg_engine_local_pending(f->e), 0);
    assert_true(used_in_store(f, "seen", T_MS + 200) == 70);
    assert_true(used_in_store(f, "unseen", T_MS + 200) == 50);
}

static void test_concurrency_share(void **state)
{
    fx *f = *state;
    qg_decision d;
    qg_check_req q = {.subject = "one", .request_id = "c0", .weight_milli = 1000};
    char err[256];
    /* 5 slots at a half: 2; 1 slot at a half: still 1 */
    assert_int_equal(check_local(f, "five", "five-0", 1, T_MS, &d), QG_ALLOW);
    assert_int_equal(check_local(f, "five", "five-1", 1, T_MS, &d), QG_ALLOW);
    assert_int_not_equal(check_local(f, "five", "five-2", 1, T_MS, &d),
                         QG_ALLOW);
    assert_int_equal(check_local(f, "one", "one-0", 1, T_MS, &d), QG_ALLOW);
    assert_int_not_equal(check_local(f, "one", "one-1", 1, T_MS, &d), QG_ALLOW);
    {
        qg_settle_req s = {.request_id = "one-0", .status = QG_SETTLE_COMPLETED,
                           .weight_milli = 1000};
        qg_settle_result r;
        assert_int_equal(qg_engine_settle_local(f->e, &s, T_MS + 1, &r, err,
                                                sizeof err), 0);
    }
    assert_int_equal(check_local(f, "one", "one-2", 1, T_MS + 2, &d), QG_ALLOW);
    (void)q;
}

static void test_settle_gives_back(void **state)
{
    fx *f = *state;
    qg_decision d;
    qg_settle_req s = {.request_id = "big", .status = QG_SETTLE_COMPLETED,
                       .weight_milli = 10000};
    qg_settle_result r;
    char err[256];
    /* unseen: 50 locally; reserve 40, use 10: 40 more fit */
    assert_int_equal(check_local(f, "unseen", "big", 40, T_MS, &d), QG_ALLOW);
    assert_int_equal(qg_engine_settle_local(f->e, &s, T_MS + 1, &r, err,
                                            sizeof err), 0);
    assert_true(r.charged_milli == 10000);
    assert_int_equal(admit_local(f, "unseen", "after", T_MS + 2), 40);
    /* another request's settle is not the fallback's */
    s.request_id = "never-local";
    assert_int_equal(qg_engine_settle_local(f->e, &s, T_MS + 3, &r, err,
                                            sizeof err), QG_ENOTFOUND);
}

static void test_drain_resumes(void **state)
{
    fx *f = *state;
    drained dr = {f, 0, 3, {{0}}};
    assert_int_equal(admit_local(f, "unseen", "dr", T_MS), 50);
    /* the store fails at the fourth: three handed over, the rest kept */
    assert_int_equal(qg_engine_local_drain(f->e, to_store, &dr), QG_ESTORE);
    assert_int_equal(qg_engine_local_pending(f->e), 47);
    dr.fail_at = -1;
    dr.n = 0;
    assert_int_equal(qg_engine_local_drain(f->e, to_store, &dr), 0);
    assert_int_equal(dr.n, 47);
    assert_string_equal(dr.rids[0], "dr-3");
    assert_true(used_in_store(f, "unseen", T_MS + 10) == 50);
    /* handed over twice would be a second charge: restore leaves a known
     * id alone, and the journal is empty */
    assert_int_equal(qg_engine_local_pending(f->e), 0);
}

/* The store answers (the journal is charged) and goes again before this
 * instance decides anything through it: the second outage starts from
 * what the first left, counted for every instance (30 used at a half
 * is 60 of the 60 the view had left): nothing more. */
static void test_flapping_grants_once(void **state)
{
    fx *f = *state;
    drained dr = {f, 0, -1, {{0}}};
    for (int i = 0; i < 40; i++)
        check_store(f, "flap", tst_fmt("fs%d", i), 1, T_MS + i);
    assert_int_equal(admit_local(f, "flap", "out1", T_MS + 100), 30);
    assert_int_equal(qg_engine_local_drain(f->e, to_store, &dr), 0);
    assert_int_equal(admit_local(f, "flap", "out2", T_MS + 200), 0);
    /* a fresh view from the store: 100 - 40 - 30 - 1 = 29 left, 14 locally */
    assert_int_equal(check_store(f, "flap", "fresh", 1, T_MS + 300), QG_ALLOW);
    dr.n = 0;
    assert_int_equal(qg_engine_local_drain(f->e, to_store, &dr), 0);
    assert_int_equal(admit_local(f, "flap", "out3", T_MS + 400), 14);
}


/* ------------------------------------- answers handled out of order */

/* The store's answer for a check of "hundred" decided at stamp (the
 * store's clock) with left weight points left, noted as the engine does;
 * then requests admitted locally until one is refused. */
typedef struct notes {
    qg_rules *r;
    qg__fallback *fb;
    qg_store_check in;
    int seq;
} notes;

static void notes_init(notes *n)
{
    int p;
    memset(n, 0, sizeof *n);
    n->r = tst_rules_parse(rules_text);
    n->fb = qg__fallback_new(64);
    assert_non_null(n->r);
    assert_non_null(n->fb);
    p = qg__rules_find_plan(n->r, "hundred");
    assert_true(p >= 0);
    n->in.rules = n->r;
    n->in.member = (qg_key){7, 7};
    n->in.plan = &n->r->plans[p];
    n->in.model = -1;
    n->in.weight_milli = 1000;
    n->in.now_ms = T_MS;
}

static void note(notes *n, int64_t stamp, int64_t left)
{
    qg_decision d;
    memset(&d, 0, sizeof d);
    d.nviews = n->in.plan->nwindows;     /* the day, then concurrency */
    for (int i = 0; i < d.nviews; i++)
        d.views[i].remaining_milli =
            n->in.plan->windows[i].type == QG_WIN_CONCURRENCY
                ? n->in.plan->windows[i].limit_milli
                : left * 1000;
    d.decided_at_ms = stamp;
    qg__fallback_note(n->fb, &n->in, &d);
}

static int local_admits(notes *n, int max)
{
    int k = 0;
    for (; k < max; k++) {
        qg_decision d;
        n->in.rid = (qg_key){1, (uint64_t)++n->seq};
        assert_int_equal(qg__fallback_check(n->fb, &n->in, SHARE, "s",
                                            tst_fmt("r%d", n->seq), "",
                                            &d), QG_OK);
        if (d.outcome != QG_ALLOW)
            break;
    }
    return k;
}

static void notes_free(notes *n)
{
    qg__fallback_free(n->fb);
    qg_rules_free(n->r);
}

/* Two workers' connections: the answer decided at 11 (40 left) is handled
 * before the one decided at 10 (60 left).  The older answer must not make
 * the view looser: the budget is a half of 40, not of 60.  Then one of
 * the same millisecond with less left tightens it; a later one replaces
 * it even when it has more left (weight came back). */
static void test_older_answer_keeps_the_view(void **state)
{
    notes n;
    (void)state;
    notes_init(&n);
    note(&n, T_MS + 11, 40);
    note(&n, T_MS + 10, 60);
    assert_int_equal(local_admits(&n, 1000), 20);
    notes_free(&n);

    notes_init(&n);
    note(&n, T_MS + 11, 40);
    note(&n, T_MS + 11, 30);
    note(&n, T_MS + 11, 50);
    assert_int_equal(local_admits(&n, 1000), 15);
    notes_free(&n);

    notes_init(&n);
    note(&n, T_MS + 11, 40);
    note(&n, T_MS + 12, 80);
    assert_int_equal(local_admits(&n, 1000), 40);
    notes_free(&n);
}

/* An outage begins with 60 left in the view (a budget of 30); 10 are
 * admitted locally; then the answers of checks that were in flight at
 * the outage's start arrive: the store applied them, 20 are left there.
 * The budget drops to a half of 20: nothing more is admitted (10 of 10
 * spent).  A later answer with more left does not raise it again. */
static void test_answer_in_outage_lowers_budget(void **state)
{
    notes n;
    (void)state;
    notes_init(&n);
    note(&n, T_MS + 10, 60);
    assert_int_equal(local_admits(&n, 10), 10);
    note(&n, T_MS + 12, 20);
    assert_int_equal(local_admits(&n, 1000), 0);
    note(&n, T_MS + 13, 50);
    assert_int_equal(local_admits(&n, 1000), 0);
    notes_free(&n);

    /* in flight answers before the outage's first local decision: the
     * budget starts from the freshest view */
    notes_init(&n);
    note(&n, T_MS + 10, 60);
    note(&n, T_MS + 12, 20);
    assert_int_equal(local_admits(&n, 1000), 10);
    notes_free(&n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_budget_from_the_last_view, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_concurrency_share, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_settle_gives_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_drain_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flapping_grants_once, setup,
                                        teardown),
        cmocka_unit_test(test_older_answer_keeps_the_view),
        cmocka_unit_test(test_answer_in_outage_lowers_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
