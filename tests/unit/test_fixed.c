/* test_fixed.c - exact decimal parsing and formatting (fixed.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "fixed.h"

static int parse(const char *s, int scale, int64_t *v)
{
    return qg_fixed_parse(s, strlen(s), scale, v);
}

static void test_parse_ok(void **state)
{
    /* text, scale, expected */
    static const struct { const char *s; int scale; int64_t v; } ok[] = {
        { "12", 3, 12000 },        { "0.25", 3, 250 },
        { "0.000125", 6, 125 },    { "1.5", 1, 15 },
        { "-5", 3, -5000 },        { "0", 6, 0 },
        { "007", 0, 7 },           { "9223372036854775807", 0, INT64_MAX },
        { "-9223372036854775808", 0, INT64_MIN },
        { "9223372036854775.807", 3, INT64_MAX },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = 0;
        assert_int_equal(parse(ok[i].s, ok[i].scale, &v), 0);
        assert_true(v == ok[i].v);
    }
}

static void test_parse_errors(void **state)
{
    static const struct { const char *s; int scale; int rc; } bad[] = {
        { "", 3, -1 },      { "abc", 3, -1 },   { "1e3", 3, -1 },
        { "+1", 3, -1 },    { ".5", 3, -1 },    { "5.", 3, -1 },
        { "1.2.3", 3, -1 }, { "-", 3, -1 },     { "1 ", 3, -1 },
        { "0.0001", 3, -2 }, { "1.5", 0, -2 },
        { "9223372036854775808", 0, -3 },
        { "9223372036854776", 3, -3 },
        { "99999999999999999999", 6, -3 },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 0;
        assert_int_equal(parse(bad[i].s, bad[i].scale, &v), bad[i].rc);
    }
}

static void test_format(void **state)
{
    static const struct { int64_t v; int scale; const char *s; } cases[] = {
        { 2500, 3, "2.5" },   { 3000, 3, "3" },     { 0, 3, "0" },
        { 125, 6, "0.000125" }, { -1500, 3, "-1.5" }, { 7, 0, "7" },
        { INT64_MIN, 3, "-9223372036854775.808" },
    };
    char buf[64];
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = qg_fixed_format(cases[i].v, cases[i].scale, buf, sizeof buf);
        assert_string_equal(buf, cases[i].s);
        assert_int_equal(n, strlen(cases[i].s));
    }
    /* truncation keeps a NUL */
    assert_int_equal(qg_fixed_format(123456, 3, buf, 4), 3);
    assert_string_equal(buf, "123");
}

static void test_roundtrip(void **state)
{
    char buf[64];
    int64_t v, back;
    (void)state;
    for (v = -100000; v <= 100000; v += 137) {
        qg_fixed_format(v, 3, buf, sizeof buf);
        assert_int_equal(parse(buf, 3, &back), 0);
        assert_true(back == v);
    }
}

/* qg__dec_u64 / qg__dec_i64 against printf: every power of ten and its
 * neighbours, the extremes, and a million values of every magnitude. */
static void dec_check_u(uint64_t v)
{
    char got[QG_DEC_MAX + 2], want[32];
    size_t n;
    memset(got, 'x', sizeof got);
    n = qg__dec_u64(got, v);
    snprintf(want, sizeof want, "%llu", (unsigned long long)v);
    if (n != strlen(want) || memcmp(got, want, n) != 0 || got[n] != 'x' ||
        qg__dec_len(v) != n)
        fail_msg("qg__dec_u64(%s) gave %.*s (%zu)", want, (int)n, got, n);
}

static void dec_check_i(int64_t v)
{
    char got[QG_DEC_MAX + 2], want[32];
    size_t n;
    memset(got, 'x', sizeof got);
    n = qg__dec_i64(got, v);
    snprintf(want, sizeof want, "%lld", (long long)v);
    if (n != strlen(want) || memcmp(got, want, n) != 0 || got[n] != 'x')
        fail_msg("qg__dec_i64(%s) gave %.*s (%zu)", want, (int)n, got, n);
}

static void test_dec(void **state)
{
    uint64_t p = 1, x = 0x9e3779b97f4a7c15ULL;
    (void)state;
    for (int i = 0; i < 20; i++, p *= 10) {
        dec_check_u(p);
        dec_check_u(p - 1);
        dec_check_u(p + 1);
        if (p <= (uint64_t)INT64_MAX) {
            dec_check_i((int64_t)p);
            dec_check_i(-(int64_t)p);
            dec_check_i(1 - (int64_t)p);
        }
    }
    dec_check_u(0);
    dec_check_u(UINT64_MAX);
    dec_check_i(0);
    dec_check_i(INT64_MAX);
    dec_check_i(INT64_MIN);
    dec_check_i(-1);
    for (int i = 0; i < 1000000; i++) {
        uint64_t v;
        x ^= x << 13;                       /* xorshift64 */
        x ^= x >> 7;
        x ^= x << 17;
        v = x >> (x % 64);                  /* every magnitude */
        dec_check_u(v);
        dec_check_i((int64_t)v);
    }
}

static void test_ceil_div(void **state)
{
    (void)state;
    assert_true(qg__ceil_div(0, 5) == 0);
    assert_true(qg__ceil_div(1, 5) == 1);
    assert_true(qg__ceil_div(10, 5) == 2);
    assert_true(qg__ceil_div(11, 5) == 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_ceil_div),
        cmocka_unit_test(test_dec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
