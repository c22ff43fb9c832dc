/* test_engine_restore.c - the engine's rebuild and reload paths:
 * qg_engine_restore re-applies ledger charges so that a restarted engine
 * decides exactly as the one that crashed; qg_engine_reload swaps rules
 * atomically, keeps subjects' plans by name, keeps usage in same-named
 * windows, and refuses rules that drop a plan in use. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"

#define MIN_MS 60000LL
#define T_MS 1772445600000LL            /* 2026-03-02T10:00:00Z */

static const char base_rules[] =
    "version: \"r1\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 1, output_per_1k: 2 }\n"
    "plans:\n"
    "  basic:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
    "      - { name: daily, type: calendar, every: day, tz: \"UTC\", limit: 50 }\n"
    "    concurrency: 4\n"
    "    lease_ttl: 10m\n"
    "  other:\n"
    "    windows:\n"
    "      - { name: burst, type: rolling, length: 1h, limit: 100 }\n"
    "subjects:\n"
    "  alice: { plan: basic }\n";

static qg_rules *parse(const char *text)
{
    qg_rules *r = NULL;
    qg_diag d;
    assert_int_equal(qg__rules_parse(text, strlen(text), "t", qg__tz_load_system,
                                    NULL, &r, &d), QG_OK);
    return r;
}

static int check(qg_engine *e, const char *subject, const char *rid,
                 int64_t weight_milli, int64_t now, qg_decision *d)
{
    qg_check_req q = {.subject = subject, .request_id = rid,
                      .weight_milli = weight_milli};
    assert_int_equal(qg_engine_check(e, &q, now, d, NULL, 0), QG_OK);
    return d->outcome;
}

static int64_t used(qg_engine *e, const char *subject, const char *window,
                    int64_t now)
{
    static qg_decision d;
    assert_int_equal(qg_engine_usage(e, subject, now, &d), QG_OK);
    for (int i = 0; i < d.nviews; i++)
        if (strcmp(d.views[i].name, window) == 0)
            return d.views[i].used_milli;
    fail_msg("no window %s", window);
    return -1;
}

/* A restarted engine fed the ledger's rows decides like the first one. */
static void test_restore_matches_original(void **state)
{
    static qg_decision d1, d2;
    qg_store *s1 = qg_store_memory_new(NULL), *s2 = qg_store_memory_new(NULL);
    qg_engine *e1 = qg_engine_new(parse(base_rules), s1);
    qg_engine *e2 = qg_engine_new(parse(base_rules), s2);
    qg_settle_result res;
    char rid[16];
    (void)state;

    /* e1: four requests, three settled (one lower, one higher), one not */
    for (int i = 0; i < 4; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        assert_int_equal(check(e1, "alice", rid, 2000, T_MS + i * MIN_MS,
                               &d1), QG_ALLOW);
    }
    qg_settle_req s = {.request_id = "r0", .status = QG_SETTLE_COMPLETED,
                       .weight_milli = 1000};
    assert_int_equal(qg_engine_settle(e1, &s, T_MS + 5 * MIN_MS, &res, NULL,
                                      0), QG_OK);
    s.request_id = "r1";
    s.weight_milli = 3500;
    assert_int_equal(qg_engine_settle(e1, &s, T_MS + 5 * MIN_MS, &res, NULL,
                                      0), QG_OK);
    s.request_id = "r2";
    s.weight_milli = 2000;
    assert_int_equal(qg_engine_settle(e1, &s, T_MS + 5 * MIN_MS, &res, NULL,
                                      0), QG_OK);

    /* e2: what the ledger holds, in decision order */
    const struct { const char *rid; int64_t at, reserved, charged; int settled; }
        rows[] = {
            {"r0", T_MS, 2000, 1000, 1},
            {"r1", T_MS + MIN_MS, 2000, 3500, 1},
            {"r2", T_MS + 2 * MIN_MS, 2000, 2000, 1},
            {"r3", T_MS + 3 * MIN_MS, 2000, 2000, 0},
        };
    for (size_t i = 0; i < 4; i++) {
        qg_restore_req rr = {.subject = "alice", .request_id = rows[i].rid,
                             .headroom_milli = -1,
                             .decided_at_ms = rows[i].at,
                             .reserved_milli = rows[i].reserved,
                             .charged_milli = rows[i].charged,
                             .settled = rows[i].settled,
                             .status = QG_SETTLE_COMPLETED};
        assert_int_equal(qg_engine_restore(e2, &rr, NULL, 0), QG_OK);
    }
    int64_t now = T_MS + 6 * MIN_MS;
    assert_int_equal(used(e1, "alice", "burst", now),
                     used(e2, "alice", "burst", now));
    assert_int_equal(used(e2, "alice", "burst", now), 8500);
    assert_int_equal(used(e1, "alice", "daily", now),
                     used(e2, "alice", "daily", now));
    /* the unsettled reservation still holds its concurrency slot */
    assert_int_equal(used(e2, "alice", "concurrency", now), 1000);

    /* the same next request gets the same answer, to the millisecond */
    assert_int_equal(check(e1, "alice", "n1", 2000, now, &d1),
                     check(e2, "alice", "n1", 2000, now, &d2));
    assert_int_equal(d1.outcome, QG_REJECT);
    assert_int_equal(d1.retry_after_ms, d2.retry_after_ms);

    /* replays of restored ids: allowed, replayed, nothing charged */
    assert_int_equal(check(e2, "alice", "r3", 2000, now, &d2), QG_ALLOW);
    assert_true(d2.replayed);
    assert_int_equal(d2.decided_at_ms, T_MS + 3 * MIN_MS);
    assert_int_equal(used(e2, "alice", "burst", now), 8500);
    /* a restored settled id settles as a replay */
    s.request_id = "r0";
    assert_int_equal(qg_engine_settle(e2, &s, now, &res, NULL, 0), QG_OK);
    assert_true(res.replayed);
    /* the unsettled one can still be settled after the restart */
    s.request_id = "r3";
    s.weight_milli = 500;
    assert_int_equal(qg_engine_settle(e2, &s, now, &res, NULL, 0), QG_OK);
    assert_false(res.replayed);
    assert_int_equal(used(e2, "alice", "burst", now), 7000);

    qg_engine_free(e1);
    qg_engine_free(e2);
    qg_store_free(s1);
    qg_store_free(s2);
}

static void test_reload(void **state)
{
    static qg_decision d;
    qg_store *st = qg_store_memory_new(NULL);
    qg_engine *e = qg_engine_new(parse(base_rules), st);
    char err[256], text[2048];
    qg_rules *nr;
    (void)state;

    assert_int_equal(check(e, "alice", "a1", 6000, T_MS, &d), QG_ALLOW);
    assert_int_equal(qg_engine_reach_ms(e), 86400000LL * 2);

    /* new rules: burst limit raised to 20, version r2 */
    snprintf(text, sizeof text, "%s", base_rules);
    memcpy(strstr(text, "\"r1\""), "\"r2\"", 4);
    memcpy(strstr(text, "limit: 10 }"), "limit: 20 }", 11);
    nr = parse(text);
    assert_int_equal(qg_engine_reload(e, nr, err, sizeof err), QG_OK);
    assert_string_equal(qg_rules_version(qg_engine_rules(e)), "r2");
    /* usage carried over by window name; the new limit applies */
    assert_int_equal(used(e, "alice", "burst", T_MS + 1), 6000);
    assert_int_equal(check(e, "alice", "a2", 9000, T_MS + 2, &d), QG_ALLOW);
    assert_string_equal(d.rules_version, "r2");

    /* rules that drop plan basic, which alice uses, are refused */
    snprintf(text, sizeof text, "%s", base_rules);
    {
        char *p = strstr(text, "  basic:");
        char *q = strstr(text, "  other:");
        memmove(p, q, strlen(q) + 1);
        p = strstr(text, "subjects:");
        *p = '\0';
    }
    nr = parse(text);
    assert_int_equal(qg_engine_reload(e, nr, err, sizeof err), QG_EINVAL);
    assert_non_null(strstr(err, "basic"));
    qg_rules_free(nr);
    assert_string_equal(qg_rules_version(qg_engine_rules(e)), "r2");
    assert_int_equal(check(e, "alice", "a3", 1000, T_MS + 3, &d), QG_ALLOW);

    qg_engine_free(e);
    qg_store_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restore_matches_original),
        cmocka_unit_test(test_reload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
