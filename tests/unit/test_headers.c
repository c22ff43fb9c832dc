/* test_headers.c - rate-limit response headers (src/server/headers.c).
 *
 * Decisions are built by hand over rules parsed from a string, and the
 * header values compared as exact strings: they are a contract clients
 * parse (IETF RateLimit-Policy / RateLimit, OpenAI x-ratelimit-*,
 * Retry-After).  Go duration strings are checked against what Go's
 * time.Duration.String() prints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "headers.h"
#include "quotagate.h"
#include "rules.h"
#include "ruletest.h"

#define NOW_MS 1772445600000LL /* 2026-03-02T10:00:00Z, a Monday */

static const char rules_text[] =
    "version: \"h1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "plans:\n"
    "  free:\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 50 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 400 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 20, unit: requests }\n"
    "    concurrency: 2\n"
    "orgs:\n"
    "  acme: { windows: [ { name: monthly, type: calendar, every: month, anchor: billing, limit: 100000 } ] }\n"
    "default_plan: free\n";

/* The sample allow: some of every window used. */
static void sample(qg_decision *d)
{
    memset(d, 0, sizeof *d);
    d->outcome = QG_ALLOW;
    d->weight_milli = 1500;
    d->decided_at_ms = NOW_MS;
    d->binding = -1;
    d->plan = "free";
    d->rules_version = "h1";
    d->weights_version = "w1";
    tst_decision_view(d, "burst_5h", QG_WIN_ROLLING, 0, 0, 50000, 7000,
         NOW_MS + 1233500);
    tst_decision_view(d, "weekly", QG_WIN_CALENDAR, 0, 0, 400000, 16500,
         NOW_MS + 6 * 86400000LL + 14 * 3600000LL);
    tst_decision_view(d, "rpm", QG_WIN_RATE, 1, 0, 20000, 1000, NOW_MS + 3000);
    tst_decision_view(d, "concurrency", QG_WIN_CONCURRENCY, 1, 0, 2000, 1000,
         NOW_MS + 600000);
}

static const char *get(const qg_hdr_buf *b, const char *name)
{
    for (int i = 0; i < b->n; i++)
        if (strcmp(b->h[i].name, name) == 0)
            return b->h[i].value;
    return NULL;
}

static void test_go_duration(void **state)
{
    static const struct { int64_t ms; const char *s; } cases[] = {
        {0, "0s"},          {20, "20ms"},         {999, "999ms"},
        {1000, "1s"},       {1500, "1.5s"},       {59765, "59.765s"},
        {60000, "1m0s"},    {61000, "1m1s"},      {360000, "6m0s"},
        {3600000, "1h0m0s"}, {3601500, "1h0m1.5s"}, {90061001, "25h1m1.001s"},
        {1010, "1.01s"},    {-1500, "-1.5s"},     {-20, "-20ms"},
        {604800000, "168h0m0s"},
    };
    char buf[64];
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = qg__go_duration(cases[i].ms, buf, sizeof buf);
        assert_string_equal(buf, cases[i].s);
        assert_int_equal(n, strlen(cases[i].s));
    }
    /* truncation reports the full length, as snprintf does */
    assert_int_equal(qg__go_duration(90061001, buf, 4), 11);
    assert_string_equal(buf, "25h");
    assert_int_equal(qg__go_duration(INT64_MIN, buf, sizeof buf) > 0, 1);
    assert_int_equal(buf[0], '-');
}

static void test_allow_headers(void **state)
{
    qg_rules *r = tst_rules_parse(rules_text);
    qg_decision d;
    qg_hdr_buf b;
    (void)state;

    sample(&d);
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 8);
    assert_int_equal(b.n, 8);
    assert_string_equal(get(&b, "RateLimit-Policy"),
                        "\"burst_5h\";q=50;w=18000, \"weekly\";q=400;w=604800, "
                        "\"rpm\";q=20;w=60;qu=\"requests\", "
                        "\"concurrency\";q=2;qu=\"concurrent-requests\"");
    assert_string_equal(get(&b, "RateLimit"),
                        "\"burst_5h\";r=43;t=1234, \"weekly\";r=383;t=568800, "
                        "\"rpm\";r=19;t=3, \"concurrency\";r=1;t=600");
    assert_string_equal(get(&b, "x-ratelimit-limit-requests"), "20");
    assert_string_equal(get(&b, "x-ratelimit-remaining-requests"), "19");
    assert_string_equal(get(&b, "x-ratelimit-reset-requests"), "3s");
    assert_string_equal(get(&b, "x-ratelimit-limit-tokens"), "50");
    assert_string_equal(get(&b, "x-ratelimit-remaining-tokens"), "43");
    assert_string_equal(get(&b, "x-ratelimit-reset-tokens"), "20m33.5s");
    assert_null(get(&b, "Retry-After"));
    assert_null(get(&b, "x-should-retry"));
    /* the order is fixed: policy, state, requests, tokens */
    assert_string_equal(b.h[0].name, "RateLimit-Policy");
    assert_string_equal(b.h[1].name, "RateLimit");
    assert_string_equal(b.h[2].name, "x-ratelimit-limit-requests");
    /* a calendar view that carries its period's length (the engine's
     * views do): w= is that length, not one computed again from the
     * rules; the same week computed or carried reads the same */
    d.views[1].period_ms = 604800000;
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 8);
    assert_non_null(strstr(get(&b, "RateLimit-Policy"),
                           "\"weekly\";q=400;w=604800,"));
    d.views[1].period_ms = 90000001;     /* 25 h and a millisecond */
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 8);
    assert_non_null(strstr(get(&b, "RateLimit-Policy"),
                           "\"weekly\";q=400;w=90001,"));
    qg_rules_free(r);
}

static void test_refusal_headers(void **state)
{
    qg_rules *r = tst_rules_parse(rules_text);
    qg_decision d;
    qg_hdr_buf b;
    (void)state;

    sample(&d);
    d.outcome = QG_REJECT;
    d.weight_milli = 16500;
    d.binding = 1;
    d.views[1].used_milli = 400000;
    d.views[1].remaining_milli = 0;
    d.retry_after_ms = 59765;
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 11);
    assert_string_equal(get(&b, "RateLimit"),
                        "\"burst_5h\";r=43;t=1234, \"weekly\";r=0;t=568800, "
                        "\"rpm\";r=19;t=3, \"concurrency\";r=1;t=600");
    assert_string_equal(get(&b, "x-ratelimit-remaining-tokens"), "0");
    assert_string_equal(get(&b, "x-ratelimit-limit-tokens"), "400");
    assert_string_equal(get(&b, "x-ratelimit-reset-tokens"), "158h0m0s");
    assert_string_equal(get(&b, "Retry-After"), "60");
    assert_string_equal(get(&b, "retry-after-ms"), "59765");
    assert_string_equal(get(&b, "x-should-retry"), "true");

    /* exactly 60 s still retries; a millisecond more does not */
    d.retry_after_ms = 60000;
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 11);
    assert_string_equal(get(&b, "Retry-After"), "60");
    assert_string_equal(get(&b, "x-should-retry"), "true");
    d.retry_after_ms = 60001;
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 11);
    assert_string_equal(get(&b, "Retry-After"), "61");
    assert_string_equal(get(&b, "retry-after-ms"), "60001");
    assert_string_equal(get(&b, "x-should-retry"), "false");

    /* never admissible: no Retry-After at all */
    d.outcome = QG_REJECT_NEVER;
    d.retry_after_ms = 0;
    d.weight_milli = 60000;
    d.binding = 0;
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 9);
    assert_null(get(&b, "Retry-After"));
    assert_null(get(&b, "retry-after-ms"));
    assert_string_equal(get(&b, "x-should-retry"), "false");
    qg_rules_free(r);
}

/* Org windows take their lengths from the org; months have no w; unknown
 * windows and NULL rules still give q, r and t; nothing used gives t=0. */
static void test_org_and_lookup(void **state)
{
    qg_rules *r = tst_rules_parse(rules_text);
    qg_decision d;
    qg_hdr_buf b;
    (void)state;

    memset(&d, 0, sizeof d);
    d.outcome = QG_ALLOW;
    d.binding = -1;
    d.plan = "free";
    d.org = "acme";
    tst_decision_view(&d, "burst_5h", QG_WIN_ROLLING, 0, 0, 50000, 0, 0);
    tst_decision_view(&d, "monthly", QG_WIN_CALENDAR, 0, 1, 100000000, 2500,
         NOW_MS - 1);
    tst_decision_view(&d, "gone", QG_WIN_ROLLING, 0, 0, 10500, 0, 0);
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 5);
    assert_string_equal(get(&b, "RateLimit-Policy"),
                        "\"burst_5h\";q=50;w=18000, \"org.monthly\";q=100000;w=2678400, "
                        "\"gone\";q=10");
    assert_string_equal(get(&b, "RateLimit"),
                        "\"burst_5h\";r=50;t=0, \"org.monthly\";r=99997;t=0, "
                        "\"gone\";r=10;t=0");
    /* no request-unit window: no -requests family */
    assert_null(get(&b, "x-ratelimit-limit-requests"));
    assert_string_equal(get(&b, "x-ratelimit-limit-tokens"), "10");
    assert_string_equal(get(&b, "x-ratelimit-reset-tokens"), "0s");

    assert_int_equal(qg__headers_for_decision(&d, NULL, NOW_MS, &b), 5);
    assert_string_equal(get(&b, "RateLimit-Policy"),
                        "\"burst_5h\";q=50, \"org.monthly\";q=100000, "
                        "\"gone\";q=10");

    /* a name that must be escaped in a structured-field string */
    d.nviews = 1;
    d.views[0].name = "a\"b\\c";
    assert_int_equal(qg__headers_for_decision(&d, r, NOW_MS, &b), 5);
    assert_string_equal(get(&b, "RateLimit"), "\"a\\\"b\\\\c\";r=50;t=0");
    qg_rules_free(r);
}

static void test_overflow(void **state)
{
    static char names[QG_MAX_VIEWS][70];
    qg_decision d;
    qg_hdr_buf b;
    (void)state;

    memset(&d, 0, sizeof d);
    d.outcome = QG_ALLOW;
    d.binding = -1;
    d.plan = "free";
    for (int i = 0; i < QG_MAX_VIEWS; i++) {
        memset(names[i], 'x', 69);
        names[i][69] = '\0';
        tst_decision_view(&d, names[i], QG_WIN_ROLLING, 0, 0, 1000000000000LL,
                          0, 0);
    }
    assert_int_equal(qg__headers_for_decision(&d, NULL, NOW_MS, &b), -1);
    assert_int_equal(b.n, 0);
    /* ten such names fit */
    d.nviews = 10;
    assert_int_equal(qg__headers_for_decision(&d, NULL, NOW_MS, &b), 5);
    /* nothing at all: no views, an allow has no headers */
    d.nviews = 0;
    assert_int_equal(qg__headers_for_decision(&d, NULL, NOW_MS, &b), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_go_duration),
        cmocka_unit_test(test_allow_headers),
        cmocka_unit_test(test_refusal_headers),
        cmocka_unit_test(test_org_and_lookup),
        cmocka_unit_test(test_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
