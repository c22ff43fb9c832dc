/* test_phrase.c - the one phrase builder (src/core/phrase.c): the words
 * of every window type, amounts, claims and effective figures as the
 * contract writes them (PRODUCT.md 8: "250 weight points per rolling 5
 * hours"; "1,400 weight points per calendar week, resetting Monday 00:00
 * UTC"; "up to 20x Pro within each 5-hour window"), a sentence that does
 * not fit refused whole, and lint's claim-unprintable when a claim's
 * statement could not be printed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "analysis.h"
#include "phrase.h"
#include "ruletest.h"

static const char RULES[] =
    "version: \"p-1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  models:\n"
    "    std: { per_request: 1, input_per_1k: 1, output_per_1k: 5 }\n"
    "    big: { per_request: 2, input_per_1k: 3, output_per_1k: 15 }\n"
    "plans:\n"
    "  pro:\n"
    "    price: { usd_month: 20 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 250 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\","
    " tz: \"UTC\", limit: 1400 }\n"
    "      - { name: daily_big, type: calendar, every: day, at: \"06:30\","
    " tz: \"Europe/Paris\", limit: 2.5, models: [big] }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 20, unit: requests }\n"
    "      - { name: s5, type: session, length: 5h, limit: 100 }\n"
    "    concurrency: 2\n"
    "  max:\n"
    "    price: { usd_month: 200 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 5000 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\","
    " tz: \"UTC\", limit: 8400 }\n"
    "    concurrency: 8\n"
    "    claims:\n"
    "      - { multiplier: 20, vs: pro, window: burst_5h, unit: \"weight "
    "points\", disclose_effective: true }\n"
    "default_plan: pro\n";

static void want_window(const qg_rules *r, const char *name, const char *s)
{
    char buf[512];
    const qg_window_spec *w = qg__plan_find_window(&r->plans[0], name);
    assert_non_null(w);
    assert_true(qg__phrase_window(r, w, buf, sizeof buf) > 0);
    assert_string_equal(buf, s);
}

static void test_windows(void **state)
{
    qg_rules *r = tst_rules_parse(RULES);
    char buf[64];
    (void)state;
    want_window(r, "burst_5h", "250 weight points per rolling 5 hours");
    want_window(r, "weekly", "1,400 weight points per calendar week, "
                "resetting Monday 00:00 UTC");
    want_window(r, "daily_big", "2.5 weight points per calendar day, "
                "resetting 06:30 Europe/Paris (big only)");
    want_window(r, "rpm", "20 requests per minute");
    want_window(r, "s5", "100 weight points per 5-hour session, from the "
                "first request");
    want_window(r, "concurrency", "2 requests in flight");
    assert_true(qg__phrase_amount(1234567890, buf, sizeof buf) > 0);
    assert_string_equal(buf, "1,234,567.89");
    assert_true(qg__phrase_window_name("pool", 1, buf, sizeof buf) > 0);
    assert_string_equal(buf, "org.pool");
    /* the name as snprintf made it: the length, or -1 and the text cut */
    assert_int_equal(qg__phrase_window_name("rpm", 0, buf, sizeof buf), 3);
    assert_string_equal(buf, "rpm");
    assert_int_equal(qg__phrase_window_name(NULL, 1, buf, sizeof buf), 4);
    assert_string_equal(buf, "org.");
    assert_int_equal(qg__phrase_window_name("pool", 1, buf, 9), 8);
    assert_int_equal(qg__phrase_window_name("pool", 1, buf, 8), -1);
    assert_string_equal(buf, "org.poo");
    assert_int_equal(qg__phrase_window_name("pool", 1, buf, 3), -1);
    assert_string_equal(buf, "or");
    assert_int_equal(qg__phrase_window_name("pool", 1, buf, 0), -1);
    /* too small a buffer: refused, not cut */
    assert_int_equal(qg__phrase_window(r, &r->plans[0].windows[0], buf, 10),
                     -1);
    qg_rules_free(r);
}

static void test_claim_and_effective(void **state)
{
    qg_rules *r = tst_rules_parse(RULES);
    char buf[512];
    (void)state;
    assert_true(qg__phrase_claim(r, 20000, "pro",
                                 qg__plan_find_window(&r->plans[1], "burst_5h"),
                                 qg__plan_find_window(&r->plans[0], "burst_5h"),
                                 buf, sizeof buf) > 0);
    assert_string_equal(buf, "up to 20\xc3\x97 Pro within each 5-hour window "
                        "(5,000 vs 250 weight points)");
    assert_true(qg__phrase_effective(r, 6000, "pro", 7 * 86400000LL, 8400000,
                                     1400000, buf, sizeof buf) > 0);
    assert_string_equal(buf, "6\xc3\x97 Pro per week: 8,400 vs 1,400 weight "
                        "points");
    /* rounded down to a tenth, and said to be rounded */
    assert_true(qg__phrase_effective(r, 5714, "pro", 7 * 86400000LL, 8000000,
                                     1400000, buf, sizeof buf) > 0);
    assert_string_equal(buf, "about 5.7\xc3\x97 Pro per week: 8,000 vs 1,400 "
                        "weight points");
    assert_int_equal(qg__phrase_claim(r, 20000, "pro", NULL, NULL, buf,
                                      sizeof buf), -1);
    qg_rules_free(r);
}

/* A claim whose window went missing (rules built by other means than the
 * parser, which refuses it): lint says its statement would not print. */
static void test_lint_claim_unprintable(void **state)
{
    qg_rules *r = tst_rules_parse(RULES);
    qg_lint_result res;
    char err[256];
    int found = 0;
    (void)state;
    assert_int_equal(qg__lint(r, NULL, &res, err, sizeof err), QG_OK);
    for (int i = 0; i < res.nfindings; i++)
        found |= !strcmp(res.findings[i].code, "claim-unprintable");
    assert_false(found);
    qg__lint_free(&res);
    free(r->plans[1].claims[0].window);
    r->plans[1].claims[0].window = strdup("gone");
    assert_int_equal(qg__lint(r, NULL, &res, err, sizeof err), QG_OK);
    for (int i = 0; i < res.nfindings; i++)
        found |= !strcmp(res.findings[i].code, "claim-unprintable");
    assert_true(found);
    qg__lint_free(&res);
    qg_rules_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows),
        cmocka_unit_test(test_claim_and_effective),
        cmocka_unit_test(test_lint_claim_unprintable),
    };
    return cmocka_run_group_tests_name("phrase", tests, NULL, NULL);
}
