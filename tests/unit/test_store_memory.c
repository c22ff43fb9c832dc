/* test_store_memory.c - the memory store's check called directly
 * (store.h), for what the engine's calls never show: the member and org
 * hints it is handed are only hints.  A hint that points at another
 * member's or another org's entity, or at the member's entity where the
 * org's is asked for, is checked and passed over, and every count lands
 * on the right entity; a right hint is used and handed back.  And its
 * request-id table (mem_reservations.c) in both index widths, against a
 * plain list of the ids it should hold. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <cmocka.h>
#include "mem_tables.h"
#include "quotagate.h"
#include "rules.h"
#include "store.h"
#include "ruletest.h"

#define T_MS 1772445600000LL    /* 2026-03-02T10:00:00Z */

static const char rules_text[] =
    "version: \"h1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "plans:\n"
    "  team:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 50 }\n"
    "orgs:\n"
    "  acme:\n"
    "    windows:\n"
    "      - { name: pool, type: rolling, length: 1h, limit: 100 }\n"
    "  beta:\n"
    "    windows:\n"
    "      - { name: pool, type: rolling, length: 1h, limit: 100 }\n"
    "default_plan: team\n";

typedef struct world {
    qg_rules *r;
    qg_store *st;
    int seq;
} world;

/* One check of 1 point for member (key m) of org (key o, org index oi)
 * with the hints given (in/out); returns the decision's views: the
 * member's window, then the org's. */
static void check(world *w, uint64_t m, uint64_t o, int oi, void **hint,
                  void **org_hint, qg_decision *d)
{
    qg_store_check in;
    memset(&in, 0, sizeof in);
    memset(d, 0, sizeof *d);
    in.rules = w->r;
    in.rid = (qg_key){99, (uint64_t)++w->seq};
    in.member = (qg_key){m, m};
    in.has_org = 1;
    in.org = (qg_key){o, o};
    in.plan = &w->r->plans[0];
    in.orgspec = &w->r->orgs[oi];
    in.model = -1;
    in.weight_milli = 1000;
    in.now_ms = T_MS + w->seq;
    in.hint = hint;
    in.org_hint = org_hint;
    assert_int_equal(w->st->m->check(w->st, &in, d), QG_OK);
    assert_int_equal(d->outcome, QG_ALLOW);
    assert_int_equal(d->nviews, 2);
}

/* What the decision's views say the member and the org have used. */
static void used_is(const qg_decision *d, int64_t member, int64_t org)
{
    assert_int_equal(d->views[0].used_milli, member);
    assert_int_equal(d->views[1].used_milli, org);
}

static void test_hints_are_checked(void **state)
{
    world w = {0};
    qg_decision d;
    void *ha = NULL, *oa = NULL, *h, *o;
    (void)state;
    w.r = tst_rules_parse(rules_text);
    w.st = qg_store_memory_new(NULL);
    assert_non_null(w.st);
    assert_int_equal(qg__rules_find_org(w.r, "acme"), 0);
    assert_int_equal(qg__rules_find_org(w.r, "beta"), 1);

    /* member 1 of acme: no hints yet; the store hands both back */
    check(&w, 1, 1000, 0, &ha, &oa, &d);
    assert_non_null(ha);
    assert_non_null(oa);
    assert_ptr_not_equal(ha, oa);
    used_is(&d, 1000, 1000);

    /* the right hints: used, and handed back unchanged */
    h = ha, o = oa;
    check(&w, 1, 1000, 0, &h, &o, &d);
    assert_ptr_equal(h, ha);
    assert_ptr_equal(o, oa);
    used_is(&d, 2000, 2000);

    /* member 2 of acme handed member 1's entity: passed over, member 2
     * gets its own, the org's count goes on */
    h = ha, o = oa;
    check(&w, 2, 1000, 0, &h, &o, &d);
    assert_ptr_not_equal(h, ha);
    assert_ptr_equal(o, oa);
    used_is(&d, 1000, 3000);

    /* member 1's entity handed as acme's: passed over */
    h = ha, o = ha;
    check(&w, 1, 1000, 0, &h, &o, &d);
    assert_ptr_equal(h, ha);
    assert_ptr_equal(o, oa);
    used_is(&d, 3000, 4000);

    /* member 3 of beta handed acme's entity: beta gets its own */
    h = NULL, o = oa;
    check(&w, 3, 2000, 1, &h, &o, &d);
    assert_ptr_not_equal(o, oa);
    used_is(&d, 1000, 1000);

    /* acme untouched by it */
    h = ha, o = oa;
    check(&w, 1, 1000, 0, &h, &o, &d);
    used_is(&d, 4000, 5000);

    qg_store_free(w.st);
    qg_rules_free(w.r);
}

/* The slot width a shard of max ids gets (cap: its index's slots). */
static void test_resv_slot_sizes(void **state)
{
    (void)state;
    assert_int_equal(qg__mem_resv_slot_size(1, 4), 4);
    assert_int_equal(qg__mem_resv_slot_size(2048, 4096), 4);   /* default */
    assert_int_equal(qg__mem_resv_slot_size(4096, 8192), 4);
    assert_int_equal(qg__mem_resv_slot_size(4097, 16384), 8);
    assert_int_equal(qg__mem_resv_slot_size(1u << 30, 1u << 31), 8);
}

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* One shard of max ids under churn: new ids (every third one sharing the
 * 32 hash bits the index keeps with an earlier id, only hi differing, so
 * that slots match whose entries do not), lookups of recent and of
 * forgotten ids, and forgotten ids remembered again.  Each entry is
 * settled at once, so the oldest is forgotten first: the table must hold
 * exactly the newest max ids, found by their whole key. */
static void churn(uint32_t max, int want_wide, int steps)
{
    uint32_t cap;
    resv_shard sh;
    resv *ring;
    void *index;
    qg_key *ids = calloc((size_t)steps, sizeof *ids);
    int *fifo = calloc(max, sizeof *fifo), head = 0, n = 0, made = 0;
    char *held = calloc((size_t)steps, 1);
    uint64_t x = 0x9e3779b97f4a7c15ull;

    for (cap = 4; cap < 2 * max; cap <<= 1)
        ;
    ring = calloc(max, sizeof *ring);
    index = calloc(cap, 8);
    assert_true(ids && fifo && held && ring && index);
    memset(&sh, 0, sizeof sh);
    qg__mem_resv_init(&sh, ring, index, max, cap);
    assert_int_equal(sh.wide, want_wide);
    for (int step = 0; step < steps; step++) {
        uint64_t r = next_rand(&x);
        int k;
        resv *e;
        if (made < 8 || r % 4 != 0) {            /* a new id */
            k = made++;
            ids[k] = (qg_key){r | 1, next_rand(&x)};
            if (k % 3 == 2)                       /* the index's bits of */
                ids[k].lo = ids[k - 1].lo;        /* another, hi apart */
        } else {                                  /* one of the last 3*max */
            uint32_t back = (uint32_t)(r >> 8) % (3 * max);
            k = made - 1 - (int)(back < (uint32_t)made ? back : 0);
        }
        e = qg__mem_resv_find(&sh, ids[k]);
        if ((e != NULL) != held[k])
            fail_msg("max %u step %d id %d: found %d, held %d", max, step,
                     k, e != NULL, held[k]);
        if (e) {
            assert_true(key_eq(e->rid, ids[k]));
            continue;
        }
        assert_int_equal(qg__mem_resv_make_room(&sh, 0), QG_OK);
        if (n == (int)max) {                      /* the oldest goes */
            held[fifo[head]] = 0;
            head = (head + 1) % (int)max;
            n--;
        }
        e = qg__mem_resv_insert(&sh, ids[k]);
        e->state = R_SETTLED;
        sh.live--;
        fifo[(head + n++) % (int)max] = k;
        held[k] = 1;
        assert_int_equal(sh.count, (uint32_t)n);
    }
    free(ids);
    free(fifo);
    free(held);
    free(ring);
    free(index);
}

/* Both widths, each wrapped around its ring many times: 4-byte slots at
 * 64 ids and at the most they take (4,096), 8-byte ones past that. */
static void test_resv_churn_both_widths(void **state)
{
    (void)state;
    churn(64, 0, 20000);
    churn(4096, 0, 60000);
    churn(4097, 1, 60000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hints_are_checked),
        cmocka_unit_test(test_resv_slot_sizes),
        cmocka_unit_test(test_resv_churn_both_widths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
