/* test_civil.c - Gregorian day arithmetic and ISO 8601 text (civil.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "civil.h"

/* A tiny deterministic generator, local to each test. */
static uint64_t next_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 11;
}

static void test_leap_years(void **state)
{
    (void)state;
    assert_false(qg__is_leap(1900));
    assert_true(qg__is_leap(2000));
    assert_true(qg__is_leap(2024));
    assert_true(qg__is_leap(2028));
    assert_false(qg__is_leap(2026));
    assert_false(qg__is_leap(2100));
    assert_true(qg__is_leap(1600));
    assert_true(qg__is_leap(-4));
    assert_int_equal(qg__days_in_month(2026, 2), 28);
    assert_int_equal(qg__days_in_month(2028, 2), 29);
    assert_int_equal(qg__days_in_month(1900, 2), 28);
    assert_int_equal(qg__days_in_month(2000, 2), 29);
    assert_int_equal(qg__days_in_month(2026, 4), 30);
    assert_int_equal(qg__days_in_month(2026, 12), 31);
    assert_int_equal(qg__days_in_month(2026, 13), 0);
}

static void test_known_days(void **state)
{
    int y, m, d;
    (void)state;
    assert_int_equal(qg__days_from_civil(1970, 1, 1), 0);
    assert_int_equal(qg__days_from_civil(1969, 12, 31), -1);
    assert_int_equal(qg__days_from_civil(2000, 3, 1), 11017);
    assert_int_equal(qg__days_from_civil(2026, 1, 31), 20484);
    assert_int_equal(qg__days_from_civil(0, 3, 1), -719468);
    assert_int_equal(qg__days_from_civil(1900, 1, 1), -25567);
    qg__civil_from_days(-1, &y, &m, &d);
    assert_int_equal(y, 1969);
    assert_int_equal(m, 12);
    assert_int_equal(d, 31);
    qg__civil_from_days(-719468, &y, &m, &d);
    assert_int_equal(y, 0);
    assert_int_equal(m, 3);
    assert_int_equal(d, 1);
    /* weekdays: 0 = Monday */
    assert_int_equal(qg__weekday_from_days(0), 3);                 /* Thu */
    assert_int_equal(qg__weekday_from_days(-1), 2);                /* Wed */
    assert_int_equal(qg__weekday_from_days(qg__days_from_civil(2026, 1, 31)),
                     5);                                          /* Sat */
    assert_int_equal(qg__weekday_from_days(qg__days_from_civil(2026, 3, 8)),
                     6);                                          /* Sun */
    assert_int_equal(qg__weekday_from_days(qg__days_from_civil(1900, 1, 1)),
                     0);                                          /* Mon */
}

/* Walk day by day from 1 March -1200 to the year 2800 with a naive
 * y/m/d counter and compare against the closed forms. */
static void test_walker(void **state)
{
    int y = -1200, m = 3, d = 1;
    int64_t n = qg__days_from_civil(y, m, d);
    int wd = qg__weekday_from_days(n);
    (void)state;
    while (y < 2800) {
        int yy, mm, dd;
        assert_int_equal(qg__days_from_civil(y, m, d), n);
        qg__civil_from_days(n, &yy, &mm, &dd);
        if (yy != y || mm != m || dd != d)
            fail_msg("day %lld: got %d-%d-%d want %d-%d-%d", (long long)n, yy,
                     mm, dd, y, m, d);
        assert_int_equal(qg__weekday_from_days(n), wd);
        n++;
        wd = (wd + 1) % 7;
        if (++d > qg__days_in_month(y, m)) {
            d = 1;
            if (++m > 12) {
                m = 1;
                y++;
            }
        }
    }
}

static void test_random_round_trips(void **state)
{
    uint64_t s = 12345;
    (void)state;
    for (int i = 0; i < 200000; i++) {
        /* days within about +-270000 years */
        int64_t n = (int64_t)(next_rand(&s) % 200000001ULL) - 100000000;
        int y, m, d;
        qg__civil_from_days(n, &y, &m, &d);
        assert_true(m >= 1 && m <= 12);
        assert_true(d >= 1 && d <= qg__days_in_month(y, m));
        assert_int_equal(qg__days_from_civil(y, m, d), n);

        /* milliseconds within +-3000 years of the epoch */
        int64_t ms = (int64_t)(next_rand(&s) % 190000000000000ULL) -
                     95000000000000LL;
        qg_civil c;
        qg__ms_to_civil(ms, &c);
        assert_true(c.hour >= 0 && c.hour < 24);
        assert_true(c.minute >= 0 && c.minute < 60);
        assert_true(c.second >= 0 && c.second < 60);
        assert_true(c.ms >= 0 && c.ms < 1000);
        assert_int_equal(qg__civil_to_ms(&c), ms);
    }
}

static void test_negative_ms(void **state)
{
    qg_civil c;
    (void)state;
    qg__ms_to_civil(-1, &c);
    assert_int_equal(c.year, 1969);
    assert_int_equal(c.month, 12);
    assert_int_equal(c.day, 31);
    assert_int_equal(c.hour, 23);
    assert_int_equal(c.minute, 59);
    assert_int_equal(c.second, 59);
    assert_int_equal(c.ms, 999);
    qg__ms_to_civil(-QG_MS_PER_DAY, &c);
    assert_int_equal(c.day, 31);
    assert_int_equal(c.hour, 0);
    assert_int_equal(c.ms, 0);
}

static int64_t parse_ok(const char *s)
{
    int64_t ms = 0;
    if (qg_iso8601_parse(s, &ms) != 0)
        fail_msg("\"%s\" should parse", s);
    return ms;
}

static void test_iso_parse(void **state)
{
    (void)state;
    int64_t base = qg__days_from_civil(2026, 1, 31) * QG_MS_PER_DAY;
    assert_int_equal(parse_ok("2026-01-31T09:00:00Z"), base + 9 * 3600000LL);
    assert_int_equal(parse_ok("2026-01-31T09:00:00.250Z"),
                     base + 9 * 3600000LL + 250);
    assert_int_equal(parse_ok("2026-01-31T09:00:00.2Z"),
                     base + 9 * 3600000LL + 200);
    assert_int_equal(parse_ok("2026-01-31T09:00:00.123456Z"),
                     base + 9 * 3600000LL + 123);
    assert_int_equal(parse_ok("2026-01-31T09:00:00+02:00"),
                     base + 7 * 3600000LL);
    assert_int_equal(parse_ok("2026-01-31T09:00:00-05:30"),
                     base + 14 * 3600000LL + 30 * 60000LL);
    assert_int_equal(parse_ok("2026-01-31T09:00Z"), base + 9 * 3600000LL);
    assert_int_equal(parse_ok("2026-01-31"), base);
    assert_int_equal(parse_ok("1970-01-01T00:00:00Z"), 0);
    assert_int_equal(parse_ok("1969-12-31T23:59:59.999Z"), -1);
    assert_int_equal(parse_ok("2028-02-29T12:00:00Z"),
                     qg__days_from_civil(2028, 2, 29) * QG_MS_PER_DAY +
                         12 * 3600000LL);
    assert_int_equal(parse_ok("2026-01-01T00:30:00+01:00"),
                     qg__days_from_civil(2025, 12, 31) * QG_MS_PER_DAY +
                         23 * 3600000LL + 30 * 60000LL);
}

static void test_iso_parse_errors(void **state)
{
    static const char *const bad[] = {
        "", "2026", "2026-01", "2026-13-01", "2026-00-10", "2026-02-30",
        "2026-02-29", "2026-04-31", "2026-01-00", "2026-01-32",
        "2026-01-31T", "2026-01-31T09", "2026-01-31T09:00",
        "2026-01-31T24:00:00Z", "2026-01-31T09:60:00Z", "2026-01-31T09:00:60Z",
        "2026-01-31T09:00:00", "2026-01-31T09:00:00Zx", "2026-01-31x",
        "2026-01-31T09:00:00.Z", "2026-01-31T09:00:00+2:00",
        "2026-01-31T09:00:00+24:00", "2026-01-31T09:00:00+02:60",
        "2026-1-31", "26-01-31", "2026/01/31", " 2026-01-31",
        "2026-01-31 ", "2026-01-31T09:00:00ZZ", "2026-01-31T9:00:00Z",
        "abcd-ef-ghT09:00:00Z",
    };
    int64_t ms = 42;
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (qg_iso8601_parse(bad[i], &ms) != -1)
            fail_msg("\"%s\" should be rejected", bad[i]);
    assert_int_equal(qg_iso8601_parse(NULL, &ms), -1);
}

static void test_iso_format(void **state)
{
    char buf[64];
    (void)state;
    qg_iso8601_format(parse_ok("2026-01-31T09:00:00Z"), buf, sizeof buf);
    assert_string_equal(buf, "2026-01-31T09:00:00Z");
    qg_iso8601_format(parse_ok("2026-01-31T09:00:00.250Z"), buf, sizeof buf);
    assert_string_equal(buf, "2026-01-31T09:00:00.250Z");
    qg_iso8601_format(-1, buf, sizeof buf);
    assert_string_equal(buf, "1969-12-31T23:59:59.999Z");
    qg_iso8601_format(0, buf, sizeof buf);
    assert_string_equal(buf, "1970-01-01T00:00:00Z");
    qg_iso8601_format(parse_ok("2026-01-31T09:00:00+02:00"), buf, sizeof buf);
    assert_string_equal(buf, "2026-01-31T07:00:00Z");
    /* a small buffer is truncated, never overrun */
    memset(buf, 'x', sizeof buf);
    qg_iso8601_format(0, buf, 5);
    assert_string_equal(buf, "1970");
    /* format -> parse round trip */
    uint64_t s = 99;
    for (int i = 0; i < 20000; i++) {
        int64_t ms = (int64_t)(next_rand(&s) % 250000000000000ULL) -
                     62000000000000LL;
        int64_t back;
        qg_iso8601_format(ms, buf, sizeof buf);
        assert_int_equal(qg_iso8601_parse(buf, &back), 0);
        assert_int_equal(back, ms);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leap_years),
        cmocka_unit_test(test_known_days),
        cmocka_unit_test(test_walker),
        cmocka_unit_test(test_random_round_trips),
        cmocka_unit_test(test_negative_ms),
        cmocka_unit_test(test_iso_parse),
        cmocka_unit_test(test_iso_parse_errors),
        cmocka_unit_test(test_iso_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
