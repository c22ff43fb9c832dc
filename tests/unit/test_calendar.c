/* test_calendar.c - periods of daily, weekly and monthly calendar windows
 * (calendar.c) in UTC and in real zones across DST changes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "calendar.h"
#include "civil.h"
#include "tz.h"
#include "tzfile.h"

#define HOUR_MS 3600000LL

static int64_t T(const char *iso)
{
    int64_t ms = 0;
    if (qg_iso8601_parse(iso, &ms) != 0)
        fail_msg("bad test time %s", iso);
    return ms;
}

static qg_tz *load(const char *name)
{
    char err[256] = "";
    qg_tz *tz = qg__tz_load_system(name, NULL, err, sizeof err);
    if (!tz)
        fail_msg("load %s: %s", name, err);
    return tz;
}

static qg_calendar_spec daily(const qg_tz *tz, int minute)
{
    qg_calendar_spec c = {QG_EVERY_DAY, 0, 0, minute, 0, tz};
    return c;
}

static qg_calendar_spec weekly(const qg_tz *tz, int wd, int minute)
{
    qg_calendar_spec c = {QG_EVERY_WEEK, wd, 0, minute, 0, tz};
    return c;
}

static qg_calendar_spec monthly(const qg_tz *tz, int mday, int minute)
{
    qg_calendar_spec c = {QG_EVERY_MONTH, 0, mday, minute, 0, tz};
    return c;
}

static void expect(const qg_calendar_spec *c, int64_t anchor, const char *now,
                   const char *start, const char *end)
{
    int64_t s = 0, e = 0;
    char bs[40], be[40];
    if (qg__calendar_period(c, anchor, T(now), &s, &e) != 0)
        fail_msg("period at %s failed", now);
    if (s != T(start) || e != T(end)) {
        qg_iso8601_format(s, bs, sizeof bs);
        qg_iso8601_format(e, be, sizeof be);
        fail_msg("at %s: [%s, %s), want [%s, %s)", now, bs, be, start, end);
    }
}

static int64_t length_at(const qg_calendar_spec *c, const char *now)
{
    int64_t s, e;
    assert_int_equal(qg__calendar_period(c, 0, T(now), &s, &e), 0);
    return e - s;
}

static void test_daily_utc_boundary(void **state)
{
    qg_tz *utc = qg__tz_utc();
    qg_calendar_spec c = daily(utc, 0);
    (void)state;
    /* now exactly at the reset starts the new period */
    expect(&c, 0, "2026-01-31T00:00:00Z", "2026-01-31T00:00:00Z",
           "2026-02-01T00:00:00Z");
    expect(&c, 0, "2026-01-30T23:59:59.999Z", "2026-01-30T00:00:00Z",
           "2026-01-31T00:00:00Z");
    expect(&c, 0, "2026-01-31T12:00:00Z", "2026-01-31T00:00:00Z",
           "2026-02-01T00:00:00Z");
    /* 09:30 resets */
    c = daily(utc, 9 * 60 + 30);
    expect(&c, 0, "2026-01-31T09:29:59.999Z", "2026-01-30T09:30:00Z",
           "2026-01-31T09:30:00Z");
    expect(&c, 0, "2026-01-31T09:30:00Z", "2026-01-31T09:30:00Z",
           "2026-02-01T09:30:00Z");
    /* before the epoch */
    expect(&c, 0, "1969-12-31T09:00:00Z", "1969-12-30T09:30:00Z",
           "1969-12-31T09:30:00Z");
    qg__tz_free(utc);
}

static void test_daily_new_york_dst(void **state)
{
    qg_tz *ny = load("America/New_York");
    qg_calendar_spec c = daily(ny, 0);
    (void)state;
    expect(&c, 0, "2026-01-15T12:00:00Z", "2026-01-15T05:00:00Z",
           "2026-01-16T05:00:00Z");
    expect(&c, 0, "2026-07-15T12:00:00Z", "2026-07-15T04:00:00Z",
           "2026-07-16T04:00:00Z");
    /* spring forward: Mar 8 is 23h long */
    expect(&c, 0, "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z",
           "2026-03-09T04:00:00Z");
    assert_int_equal(length_at(&c, "2026-03-08T12:00:00Z"), 23 * HOUR_MS);
    /* fall back: Nov 1 is 25h long */
    expect(&c, 0, "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z",
           "2026-11-02T05:00:00Z");
    assert_int_equal(length_at(&c, "2026-11-01T12:00:00Z"), 25 * HOUR_MS);
    /* boundary instants in local midnight terms */
    expect(&c, 0, "2026-03-09T04:00:00Z", "2026-03-09T04:00:00Z",
           "2026-03-10T04:00:00Z");
    expect(&c, 0, "2026-03-09T03:59:59.999Z", "2026-03-08T05:00:00Z",
           "2026-03-09T04:00:00Z");

    /* a 02:30 reset on the spring-forward day happens at 03:00 EDT */
    c = daily(ny, 2 * 60 + 30);
    expect(&c, 0, "2026-03-08T06:59:59Z", "2026-03-07T07:30:00Z",
           "2026-03-08T07:00:00Z");
    expect(&c, 0, "2026-03-08T07:00:00Z", "2026-03-08T07:00:00Z",
           "2026-03-09T06:30:00Z");
    /* a 01:30 reset on the fall-back day happens at the first 01:30 */
    c = daily(ny, 60 + 30);
    expect(&c, 0, "2026-11-01T06:00:00Z", "2026-11-01T05:30:00Z",
           "2026-11-02T06:30:00Z");
    expect(&c, 0, "2026-11-01T05:29:00Z", "2026-10-31T05:30:00Z",
           "2026-11-01T05:30:00Z");
    qg__tz_free(ny);
}

static void test_weekly_berlin_dst(void **state)
{
    qg_tz *be = load("Europe/Berlin");
    qg_calendar_spec c = weekly(be, 0, 0); /* Monday 00:00 */
    (void)state;
    /* the week holding Sun Mar 29 2026 (DST starts) is 167h */
    expect(&c, 0, "2026-03-29T12:00:00Z", "2026-03-22T23:00:00Z",
           "2026-03-29T22:00:00Z");
    assert_int_equal(length_at(&c, "2026-03-25T00:00:00Z"), 167 * HOUR_MS);
    /* the week holding Sun Oct 25 2026 (DST ends) is 169h */
    expect(&c, 0, "2026-10-25T12:00:00Z", "2026-10-18T22:00:00Z",
           "2026-10-25T23:00:00Z");
    assert_int_equal(length_at(&c, "2026-10-20T00:00:00Z"), 169 * HOUR_MS);
    /* an ordinary week, and its boundary exactly */
    expect(&c, 0, "2026-06-10T00:00:00Z", "2026-06-07T22:00:00Z",
           "2026-06-14T22:00:00Z");
    expect(&c, 0, "2026-06-14T22:00:00Z", "2026-06-14T22:00:00Z",
           "2026-06-21T22:00:00Z");
    /* Sunday 18:00 in UTC */
    qg_tz *utc = qg__tz_utc();
    c = weekly(utc, 6, 18 * 60);
    expect(&c, 0, "2026-01-31T09:00:00Z", "2026-01-25T18:00:00Z",
           "2026-02-01T18:00:00Z");
    expect(&c, 0, "2026-02-01T18:00:00Z", "2026-02-01T18:00:00Z",
           "2026-02-08T18:00:00Z");
    qg__tz_free(utc);
    qg__tz_free(be);
}

static void test_monthly_mday(void **state)
{
    qg_tz *utc = qg__tz_utc();
    qg_calendar_spec c = monthly(utc, 31, 0);
    (void)state;
    expect(&c, 0, "2026-02-15T00:00:00Z", "2026-01-31T00:00:00Z",
           "2026-02-28T00:00:00Z");
    expect(&c, 0, "2026-02-28T00:00:00Z", "2026-02-28T00:00:00Z",
           "2026-03-31T00:00:00Z");
    expect(&c, 0, "2026-04-15T00:00:00Z", "2026-03-31T00:00:00Z",
           "2026-04-30T00:00:00Z");
    expect(&c, 0, "2028-02-15T00:00:00Z", "2028-01-31T00:00:00Z",
           "2028-02-29T00:00:00Z");
    expect(&c, 0, "2026-12-31T00:00:00Z", "2026-12-31T00:00:00Z",
           "2027-01-31T00:00:00Z");
    c = monthly(utc, 1, 0);
    expect(&c, 0, "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z",
           "2026-02-01T00:00:00Z");
    expect(&c, 0, "2025-12-31T23:59:59Z", "2025-12-01T00:00:00Z",
           "2026-01-01T00:00:00Z");
    /* in New York: the 1st at 00:00 local */
    qg_tz *ny = load("America/New_York");
    c = monthly(ny, 1, 0);
    expect(&c, 0, "2026-03-15T00:00:00Z", "2026-03-01T05:00:00Z",
           "2026-04-01T04:00:00Z");
    expect(&c, 0, "2026-03-01T04:59:59Z", "2026-02-01T05:00:00Z",
           "2026-03-01T05:00:00Z");
    qg__tz_free(ny);
    qg__tz_free(utc);
}

static void test_monthly_billing_anchor(void **state)
{
    qg_tz *utc = qg__tz_utc();
    qg_calendar_spec c = monthly(utc, 1, 0);
    int64_t a = T("2026-01-31T09:00:00Z");
    (void)state;
    c.anchor_billing = 1;
    expect(&c, a, "2026-01-31T09:00:00Z", "2026-01-31T09:00:00Z",
           "2026-02-28T09:00:00Z");
    expect(&c, a, "2026-02-10T00:00:00Z", "2026-01-31T09:00:00Z",
           "2026-02-28T09:00:00Z");
    expect(&c, a, "2026-03-05T00:00:00Z", "2026-02-28T09:00:00Z",
           "2026-03-31T09:00:00Z");
    expect(&c, a, "2026-04-15T00:00:00Z", "2026-03-31T09:00:00Z",
           "2026-04-30T09:00:00Z");
    expect(&c, a, "2026-05-01T00:00:00Z", "2026-04-30T09:00:00Z",
           "2026-05-31T09:00:00Z");
    expect(&c, a, "2028-02-15T00:00:00Z", "2028-01-31T09:00:00Z",
           "2028-02-29T09:00:00Z");
    expect(&c, a, "2026-02-28T08:59:59.999Z", "2026-01-31T09:00:00Z",
           "2026-02-28T09:00:00Z");

    /* leap-day anchor: the 29th from March on, Feb 28 in common years */
    a = T("2028-02-29T12:00:00Z");
    expect(&c, a, "2028-03-10T00:00:00Z", "2028-02-29T12:00:00Z",
           "2028-03-29T12:00:00Z");
    expect(&c, a, "2029-02-10T00:00:00Z", "2029-01-29T12:00:00Z",
           "2029-02-28T12:00:00Z");
    expect(&c, a, "2029-03-01T00:00:00Z", "2029-02-28T12:00:00Z",
           "2029-03-29T12:00:00Z");

    /* the anchor's day and time are read in the window's zone: 09:00Z on
     * Jan 31 is 04:00 EST, so resets are on the 31st (clamped) 04:00 */
    qg_tz *ny = load("America/New_York");
    c.tz = ny;
    a = T("2026-01-31T09:00:00Z");
    expect(&c, a, "2026-03-15T00:00:00Z", "2026-02-28T09:00:00Z",
           "2026-03-31T08:00:00Z");
    /* anchor 0 falls back to mday/minute_of_day */
    c.mday = 15;
    c.minute_of_day = 0;
    expect(&c, 0, "2026-03-20T00:00:00Z", "2026-03-15T04:00:00Z",
           "2026-04-15T04:00:00Z");
    qg__tz_free(ny);
    qg__tz_free(utc);
}

static void test_bad_specs(void **state)
{
    qg_tz *utc = qg__tz_utc();
    int64_t s, e;
    qg_calendar_spec c;
    (void)state;
    c = daily(utc, 1440);
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = daily(utc, -1);
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = weekly(utc, 7, 0);
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = monthly(utc, 0, 0);
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = monthly(utc, 32, 0);
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = daily(NULL, 0);
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = daily(utc, 0);
    c.every = (qg_every)0;
    assert_int_equal(qg__calendar_period(&c, 0, 0, &s, &e), -1);
    c = daily(utc, 0);
    assert_int_equal(qg__calendar_period(NULL, 0, 0, &s, &e), -1);
    assert_int_equal(qg__calendar_period(&c, 0, INT64_MAX, &s, &e), -1);
    assert_int_equal(qg__calendar_period(&c, 0, INT64_MIN, &s, &e), -1);
    qg__tz_free(utc);
}

/* Over random instants: start <= now < end, and periods tile time. */
static void test_random_tiling(void **state)
{
    const char *names[3] = {"America/New_York", "Europe/Berlin",
                            "Australia/Sydney"};
    uint64_t r = 7;
    (void)state;
    for (int z = 0; z < 3; z++) {
        qg_tz *tz = load(names[z]);
        qg_calendar_spec specs[5] = {
            daily(tz, 0), daily(tz, 150), weekly(tz, 6, 2 * 60 + 30),
            monthly(tz, 31, 90), monthly(tz, 29, 0),
        };
        for (int i = 0; i < 3000; i++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            /* 2000 .. ~2060 */
            int64_t now = 946684800000LL +
                          (int64_t)((r >> 11) % 1900000000000ULL);
            for (int k = 0; k < 5; k++) {
                int64_t s, e, s2, e2;
                assert_int_equal(
                    qg__calendar_period(&specs[k], 0, now, &s, &e), 0);
                assert_true(s <= now && now < e);
                assert_int_equal(qg__calendar_period(&specs[k], 0, s, &s2, &e2),
                                 0);
                assert_true(s2 == s && e2 == e);
                assert_int_equal(
                    qg__calendar_period(&specs[k], 0, s - 1, &s2, &e2), 0);
                assert_true(e2 == s);
            }
        }
        qg__tz_free(tz);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daily_utc_boundary),
        cmocka_unit_test(test_daily_new_york_dst),
        cmocka_unit_test(test_weekly_berlin_dst),
        cmocka_unit_test(test_monthly_mday),
        cmocka_unit_test(test_monthly_billing_anchor),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_random_tiling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
