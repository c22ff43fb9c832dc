/* test_duration.c - durations as written in rules files (duration.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "duration.h"

static int parse(const char *s, int64_t *ms)
{
    return qg_duration_parse(s, strlen(s), ms);
}

static void test_parse_units(void **state)
{
    static const struct { const char *s; int64_t ms; } ok[] = {
        { "500ms", 500 },        { "90s", 90000 },
        { "30m", 1800000 },      { "5h", 18000000 },
        { "7d", 604800000 },     { "1w", 604800000 },
        { "1h30m", 5400000 },    { "1d2h3m4s5ms", 93784005 },
        { "0s", 0 },             { "2w1d", 15 * 86400000LL },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t ms = -1;
        assert_int_equal(parse(ok[i].s, &ms), 0);
        assert_true(ms == ok[i].ms);
    }
}

static void test_parse_errors(void **state)
{
    static const struct { const char *s; int rc; } bad[] = {
        { "", -1 },     { "5", -1 },      { "5x", -1 },   { "h", -1 },
        { "-5s", -1 },  { "1.5h", -1 },   { "30m1h", -1 }, { "1m1m", -1 },
        { "5 h", -1 },  { "5hh", -1 },
        { "99999999999999999999s", -3 },
        { "9223372036854775807w", -3 },
        { "9223372036854775807ms1w", -1 },
        { "106751991167d8h", -3 },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t ms = 0;
        assert_int_equal(parse(bad[i].s, &ms), bad[i].rc);
    }
}

static void test_format(void **state)
{
    static const struct { int64_t ms; const char *s; } cases[] = {
        { 0, "0s" },          { 250, "250ms" },     { 90000, "90s" },
        { 1800000, "30m" },   { 18000000, "5h" },   { 604800000, "7d" },
        { 5400000, "90m" },   { 86401000, "1d1s" }, { 3601000, "1h1s" }, { 7200000, "2h" },
        { 90061001, "90061001ms" }, { 90061000, "90061s" }, { -60000, "-1m" },
    };
    char buf[64];
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = qg_duration_format(cases[i].ms, buf, sizeof buf);
        assert_string_equal(buf, cases[i].s);
        assert_int_equal(n, strlen(cases[i].s));
    }
}

static void test_roundtrip(void **state)
{
    char buf[64];
    int64_t ms, back;
    (void)state;
    for (ms = 0; ms < 400000000; ms += 7777777) {
        qg_duration_format(ms, buf, sizeof buf);
        assert_int_equal(parse(buf, &back), 0);
        assert_true(back == ms);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_units),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
