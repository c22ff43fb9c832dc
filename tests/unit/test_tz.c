/* test_tz.c - TZif parsing, POSIX footers, offsets and local times (tz.c,
 * tzfile.c), on real zones from the system tzdata and on built buffers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "civil.h"
#include "tz.h"
#include "tzfile.h"

#define H 3600

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

static void expect_off(const qg_tz *tz, const char *iso, int32_t want)
{
    int32_t got = qg__tz_offset_at(tz, T(iso));
    if (got != want)
        fail_msg("%s at %s: offset %d, want %d", qg__tz_name(tz), iso, got,
                 want);
}

/* local_ms from "YYYY-MM-DDTHH:MM:SSZ" read as a wall clock */
static void expect_l2u(const qg_tz *tz, const char *local, const char *want)
{
    int64_t got = qg__tz_local_to_utc(tz, T(local));
    if (got != T(want)) {
        char buf[40];
        qg_iso8601_format(got, buf, sizeof buf);
        fail_msg("%s local %s -> %s, want %s", qg__tz_name(tz), local, buf,
                 want);
    }
}

static void test_new_york_2026(void **state)
{
    qg_tz *ny = load("America/New_York");
    (void)state;
    assert_string_equal(qg__tz_name(ny), "America/New_York");
    expect_off(ny, "2026-01-15T12:00:00Z", -5 * H);
    expect_off(ny, "2026-03-08T06:59:59.999Z", -5 * H);
    expect_off(ny, "2026-03-08T07:00:00Z", -4 * H);
    expect_off(ny, "2026-07-01T00:00:00Z", -4 * H);
    expect_off(ny, "2026-11-01T05:59:59Z", -4 * H);
    expect_off(ny, "2026-11-01T06:00:00Z", -5 * H);
    /* old history from the transitions table */
    expect_off(ny, "1990-07-01T00:00:00Z", -4 * H);
    expect_off(ny, "1990-12-01T00:00:00Z", -5 * H);
    /* before any transition: local mean time -4:56:02 */
    expect_off(ny, "1800-01-01T00:00:00Z", -(4 * H + 56 * 60 + 2));
    assert_int_equal(qg__tz_utc_to_local(ny, T("2026-07-01T12:00:00Z")),
                     T("2026-07-01T08:00:00Z"));
    qg__tz_free(ny);
}

static void test_berlin_2026(void **state)
{
    qg_tz *be = load("Europe/Berlin");
    (void)state;
    expect_off(be, "2026-01-01T00:00:00Z", 1 * H);
    expect_off(be, "2026-03-29T00:59:59Z", 1 * H);
    expect_off(be, "2026-03-29T01:00:00Z", 2 * H);
    expect_off(be, "2026-10-25T00:59:59Z", 2 * H);
    expect_off(be, "2026-10-25T01:00:00Z", 1 * H);
    qg__tz_free(be);
}

static void test_far_future_footer(void **state)
{
    qg_tz *ny = load("America/New_York");
    qg_tz *be = load("Europe/Berlin");
    (void)state;
    /* 2040: 2nd Sunday of March is the 11th, 1st Sunday of November the
     * 4th; EU: last Sundays are Mar 25 and Oct 28. */
    expect_off(ny, "2040-03-11T06:59:59Z", -5 * H);
    expect_off(ny, "2040-03-11T07:00:00Z", -4 * H);
    expect_off(ny, "2040-11-04T05:59:59Z", -4 * H);
    expect_off(ny, "2040-11-04T06:00:00Z", -5 * H);
    expect_off(be, "2040-03-25T00:59:59Z", 1 * H);
    expect_off(be, "2040-03-25T01:00:00Z", 2 * H);
    expect_off(be, "2040-10-28T00:59:59Z", 2 * H);
    expect_off(be, "2040-10-28T01:00:00Z", 1 * H);
    expect_off(ny, "2399-12-31T23:00:00Z", -5 * H);
    expect_off(be, "2399-07-01T00:00:00Z", 2 * H);
    expect_l2u(ny, "2040-03-11T02:30:00Z", "2040-03-11T07:00:00Z");
    expect_l2u(ny, "2040-11-04T01:30:00Z", "2040-11-04T05:30:00Z");
    qg__tz_free(ny);
    qg__tz_free(be);
}

static void test_sydney(void **state)
{
    qg_tz *sy = load("Australia/Sydney");
    (void)state;
    /* DST spans new year: +11 in January, +10 in July. 2026: ends Sun Apr 5
     * 03:00 AEDT (Apr 4 16:00Z), starts Sun Oct 4 02:00 AEST (Oct 3 16:00Z). */
    expect_off(sy, "2026-01-01T00:00:00Z", 11 * H);
    expect_off(sy, "2026-04-04T15:59:59Z", 11 * H);
    expect_off(sy, "2026-04-04T16:00:00Z", 10 * H);
    expect_off(sy, "2026-07-01T00:00:00Z", 10 * H);
    expect_off(sy, "2026-10-03T15:59:59Z", 10 * H);
    expect_off(sy, "2026-10-03T16:00:00Z", 11 * H);
    expect_off(sy, "2026-12-31T23:59:59Z", 11 * H);
    /* 2050: Apr 3 and Oct 2 are the first Sundays */
    expect_off(sy, "2050-01-15T00:00:00Z", 11 * H);
    expect_off(sy, "2050-04-02T15:59:59Z", 11 * H);
    expect_off(sy, "2050-04-02T16:00:00Z", 10 * H);
    expect_off(sy, "2050-10-01T15:59:59Z", 10 * H);
    expect_off(sy, "2050-10-01T16:00:00Z", 11 * H);
    qg__tz_free(sy);
}

static void test_gap_and_overlap(void **state)
{
    qg_tz *ny = load("America/New_York");
    qg_tz *be = load("Europe/Berlin");
    qg_tz *sy = load("Australia/Sydney");
    (void)state;
    /* ordinary times */
    expect_l2u(ny, "2026-01-31T09:00:00Z", "2026-01-31T14:00:00Z");
    expect_l2u(ny, "2026-07-04T12:00:00Z", "2026-07-04T16:00:00Z");
    /* gap: 02:00-03:00 does not exist; every time in it -> 03:00 EDT */
    expect_l2u(ny, "2026-03-08T01:59:59Z", "2026-03-08T06:59:59Z");
    expect_l2u(ny, "2026-03-08T02:00:00Z", "2026-03-08T07:00:00Z");
    expect_l2u(ny, "2026-03-08T02:30:00Z", "2026-03-08T07:00:00Z");
    expect_l2u(ny, "2026-03-08T02:59:59Z", "2026-03-08T07:00:00Z");
    expect_l2u(ny, "2026-03-08T03:00:00Z", "2026-03-08T07:00:00Z");
    expect_l2u(ny, "2026-03-08T03:30:00Z", "2026-03-08T07:30:00Z");
    /* overlap: 01:00-02:00 happens twice; the first (EDT) one wins */
    expect_l2u(ny, "2026-11-01T00:59:59Z", "2026-11-01T04:59:59Z");
    expect_l2u(ny, "2026-11-01T01:00:00Z", "2026-11-01T05:00:00Z");
    expect_l2u(ny, "2026-11-01T01:30:00Z", "2026-11-01T05:30:00Z");
    expect_l2u(ny, "2026-11-01T02:00:00Z", "2026-11-01T07:00:00Z");
    /* Berlin */
    expect_l2u(be, "2026-03-29T02:30:00Z", "2026-03-29T01:00:00Z");
    expect_l2u(be, "2026-10-25T02:30:00Z", "2026-10-25T00:30:00Z");
    expect_l2u(be, "2026-10-25T03:00:00Z", "2026-10-25T02:00:00Z");
    /* Sydney: gap Oct 4 02:00-03:00, overlap Apr 5 02:00-03:00 */
    expect_l2u(sy, "2026-10-04T02:30:00Z", "2026-10-03T16:00:00Z");
    expect_l2u(sy, "2026-04-05T02:30:00Z", "2026-04-04T15:30:00Z");

    /* utc_to_local(local_to_utc(x)) == x outside gaps, over a year */
    int64_t t0 = T("2026-01-01T00:00:00Z");
    for (int64_t l = t0; l < t0 + 366 * QG_MS_PER_DAY; l += 17 * 60000 + 7) {
        const qg_tz *zs[3] = {ny, be, sy};
        for (int z = 0; z < 3; z++) {
            int64_t u = qg__tz_local_to_utc(zs[z], l);
            int64_t back = qg__tz_utc_to_local(zs[z], u);
            /* in a gap the answer lies after l, never before it */
            assert_true(back >= l);
            assert_true(back - l <= 3600000);
        }
    }
    qg__tz_free(ny);
    qg__tz_free(be);
    qg__tz_free(sy);
}

static void test_utc_and_loader_errors(void **state)
{
    char err[256];
    qg_tz *u = qg__tz_utc(), *z;
    (void)state;
    assert_string_equal(qg__tz_name(u), "UTC");
    assert_int_equal(qg__tz_offset_at(u, T("2026-07-01T00:00:00Z")), 0);
    assert_int_equal(qg__tz_local_to_utc(u, 12345), 12345);
    qg__tz_free(u);

    /* UTC works without any zoneinfo directory */
    err[0] = '\0';
    z = qg__tz_load_system("UTC", (void *)"/nonexistent/zoneinfo", err,
                          sizeof err);
    assert_non_null(z);
    assert_int_equal(qg__tz_offset_at(z, 0), 0);
    qg__tz_free(z);
    z = qg__tz_load_system("Etc/UTC", (void *)"/nonexistent/zoneinfo", err,
                          sizeof err);
    assert_non_null(z);
    assert_string_equal(qg__tz_name(z), "Etc/UTC");
    qg__tz_free(z);

    z = qg__tz_load_system("Mars/Base", (void *)"/usr/share/zoneinfo", err,
                          sizeof err);
    assert_null(z);
    assert_string_equal(
        err, "unknown time zone \"Mars/Base\": no such zone in /usr/share/zoneinfo");

    static const char *const bad[] = {
        "", "/etc/passwd", "../etc/passwd", "Europe/../../etc/passwd",
        "Europe/Berlin\n", "Europe Berlin", "Europe//Berlin", "Europe/",
        "a;b", "Europe/Berlin.bak",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        z = qg__tz_load_system(bad[i], NULL, err, sizeof err);
        if (z)
            fail_msg("name \"%s\" should be rejected", bad[i]);
        assert_non_null(strstr(err, "invalid time zone name"));
    }
    /* a directory and a non-TZif file are not zones */
    z = qg__tz_load_system("Europe", (void *)"/usr/share/zoneinfo", err,
                          sizeof err);
    assert_null(z);
    assert_null(qg__tz_load_system(NULL, NULL, err, sizeof err));
}

/* ---- built TZif buffers ------------------------------------------------ */

typedef struct tzb {
    unsigned char b[4096];
    size_t n;
} tzb;

static void put(tzb *t, const void *p, size_t n)
{
    assert_true(t->n + n <= sizeof t->b);
    if (n)
        memcpy(t->b + t->n, p, n);
    t->n += n;
}

static void put32(tzb *t, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    put(t, x, 4);
}

static void put64(tzb *t, int64_t v)
{
    put32(t, (uint32_t)((uint64_t)v >> 32));
    put32(t, (uint32_t)v);
}

static void block(tzb *t, int version, int tsize, int n, const int64_t *times,
                  const unsigned char *idx, int ntypes, const int32_t *utoff,
                  const unsigned char *dst)
{
    unsigned char v = version == 1 ? 0 : (unsigned char)('0' + version);
    unsigned char zero[15] = {0};
    put(t, "TZif", 4);
    put(t, &v, 1);
    put(t, zero, 15);
    put32(t, 0);               /* isutcnt */
    put32(t, 0);               /* isstdcnt */
    put32(t, 0);               /* leapcnt */
    put32(t, (uint32_t)n);     /* timecnt */
    put32(t, (uint32_t)ntypes);
    put32(t, 4);               /* charcnt */
    for (int i = 0; i < n; i++) {
        if (tsize == 8)
            put64(t, times[i]);
        else
            put32(t, (uint32_t)(int32_t)times[i]);
    }
    put(t, idx, (size_t)n);
    for (int i = 0; i < ntypes; i++) {
        unsigned char rest[2] = {dst[i], 0};
        put32(t, (uint32_t)utoff[i]);
        put(t, rest, 2);
    }
    put(t, "ABC", 4);
}

/* A zone with the given transitions; footer NULL gives a v1 file. */
static void build(tzb *t, int n, const int64_t *times, const unsigned char *idx,
                  int ntypes, const int32_t *utoff, const unsigned char *dst,
                  const char *footer)
{
    t->n = 0;
    if (!footer) {
        block(t, 1, 4, n, times, idx, ntypes, utoff, dst);
        return;
    }
    block(t, 2, 4, n, times, idx, ntypes, utoff, dst);
    block(t, 2, 8, n, times, idx, ntypes, utoff, dst);
    put(t, "\n", 1);
    put(t, footer, strlen(footer));
    put(t, "\n", 1);
}

static qg_tz *from_footer(const char *footer)
{
    tzb t;
    int32_t off = 0;
    unsigned char dst = 0;
    char err[128];
    build(&t, 0, NULL, NULL, 1, &off, &dst, footer);
    return qg__tz_from_tzif("test", t.b, t.n, err, sizeof err);
}

static void test_built_v1(void **state)
{
    /* v1: types 0 = +1h std, 1 = +2h dst; transitions 1e9 and 1.1e9 s */
    int64_t times[2] = {1000000000, 1100000000};
    unsigned char idx[2] = {1, 0};
    int32_t offs[2] = {3600, 7200};
    unsigned char dst[2] = {0, 1};
    char err[128];
    tzb t;
    (void)state;
    build(&t, 2, times, idx, 2, offs, dst, NULL);
    qg_tz *tz = qg__tz_from_tzif("v1", t.b, t.n, err, sizeof err);
    assert_non_null(tz);
    assert_int_equal(qg__tz_offset_at(tz, 999999999999LL), 3600);
    assert_int_equal(qg__tz_offset_at(tz, 1000000000000LL), 7200);
    assert_int_equal(qg__tz_offset_at(tz, 1099999999999LL), 7200);
    assert_int_equal(qg__tz_offset_at(tz, 1100000000000LL), 3600);
    assert_int_equal(qg__tz_offset_at(tz, 4000000000000LL), 3600);
    qg__tz_free(tz);

    /* before the first transition the first non-DST type applies even if
     * type 0 is a DST type */
    int32_t offs2[2] = {7200, 3600};
    unsigned char dst2[2] = {1, 0};
    unsigned char idx2[2] = {0, 1};
    build(&t, 2, times, idx2, 2, offs2, dst2, "");
    tz = qg__tz_from_tzif("v2", t.b, t.n, err, sizeof err);
    assert_non_null(tz);
    assert_int_equal(qg__tz_offset_at(tz, 0), 3600);
    assert_int_equal(qg__tz_offset_at(tz, 1000000000000LL), 7200);
    /* empty footer: the last type stays */
    assert_int_equal(qg__tz_offset_at(tz, 9000000000000LL), 3600);
    qg__tz_free(tz);
}

static void test_footers(void **state)
{
    qg_tz *tz;
    (void)state;

    tz = from_footer("<+03>-3");
    assert_non_null(tz);
    expect_off(tz, "2026-06-01T00:00:00Z", 3 * H);
    expect_off(tz, "1900-06-01T00:00:00Z", 3 * H);
    qg__tz_free(tz);

    tz = from_footer("<-0330>3:30");
    assert_non_null(tz);
    expect_off(tz, "2026-06-01T00:00:00Z", -(3 * H + 1800));
    qg__tz_free(tz);

    tz = from_footer("EST5EDT,M3.2.0,M11.1.0");
    assert_non_null(tz);
    expect_off(tz, "2026-03-08T06:59:59Z", -5 * H);
    expect_off(tz, "2026-03-08T07:00:00Z", -4 * H);
    expect_off(tz, "2026-11-01T05:59:59Z", -4 * H);
    expect_off(tz, "2026-11-01T06:00:00Z", -5 * H);
    qg__tz_free(tz);

    tz = from_footer("CET-1CEST,M3.5.0,M10.5.0/3");
    assert_non_null(tz);
    expect_off(tz, "2026-03-29T00:59:59Z", 1 * H);
    expect_off(tz, "2026-03-29T01:00:00Z", 2 * H);
    expect_off(tz, "2026-10-25T00:59:59Z", 2 * H);
    expect_off(tz, "2026-10-25T01:00:00Z", 1 * H);
    qg__tz_free(tz);

    tz = from_footer("AEST-10AEDT,M10.1.0,M4.1.0/3");
    assert_non_null(tz);
    expect_off(tz, "2026-01-01T00:00:00Z", 11 * H);
    expect_off(tz, "2026-04-04T15:59:59Z", 11 * H);
    expect_off(tz, "2026-04-04T16:00:00Z", 10 * H);
    expect_off(tz, "2026-10-03T15:59:59Z", 10 * H);
    expect_off(tz, "2026-10-03T16:00:00Z", 11 * H);
    expect_off(tz, "2026-12-31T23:00:00Z", 11 * H);
    qg__tz_free(tz);

    /* Jn never counts Feb 29: J60 is March 1 in every year */
    tz = from_footer("AAA0BBB,J60/2,J300");
    assert_non_null(tz);
    expect_off(tz, "2028-03-01T01:59:59Z", 0);
    expect_off(tz, "2028-03-01T02:00:00Z", H);
    expect_off(tz, "2026-03-01T02:00:00Z", H);
    qg__tz_free(tz);

    /* n is zero-based and counts Feb 29: 59 is Feb 29 in 2028 */
    tz = from_footer("AAA0BBB,59/2,300");
    assert_non_null(tz);
    expect_off(tz, "2028-02-29T01:59:59Z", 0);
    expect_off(tz, "2028-02-29T02:00:00Z", H);
    expect_off(tz, "2026-03-01T01:59:59Z", 0);
    expect_off(tz, "2026-03-01T02:00:00Z", H);
    qg__tz_free(tz);

    /* signed and long times: last Sunday of March at -1:00 (Saturday
     * 23:00 local) and last Sunday of October + 167h */
    tz = from_footer("AAA0BBB-1,M3.5.0/-1,M10.5.0/167");
    assert_non_null(tz);
    expect_off(tz, "2026-03-28T22:59:59Z", 0);
    expect_off(tz, "2026-03-28T23:00:00Z", H);
    /* Oct 25 + 167h = Oct 31 23:00 local DST = 22:00Z */
    expect_off(tz, "2026-10-31T21:59:59Z", H);
    expect_off(tz, "2026-10-31T22:00:00Z", 0);
    qg__tz_free(tz);

    /* explicit DST offset and a fixed time with minutes */
    tz = from_footer("<+1030>-10:30<+11>-11,M10.1.0,M4.1.0");
    assert_non_null(tz);
    expect_off(tz, "2026-07-01T00:00:00Z", 10 * H + 1800);
    expect_off(tz, "2026-01-01T00:00:00Z", 11 * H);
    qg__tz_free(tz);

    static const char *const bad[] = {
        "EST", "5", "EST5EDT,M13.1.0,M11.1.0", "EST5EDT,M3.2.0",
        "EST5EDT,M3.6.0,M11.1.0", "EST5EDT,M3.2.7,M11.1.0", "EST5EDT,J0,J10",
        "EST5EDT,J366,J10", "EST5EDT,366,10", "EST5EDT,M3.2.0/168,M11.1.0",
        "<+03-3", "<>-3", "EST25", "EST5EDT,M3.2.0,M11.1.0x", "EST5:60",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tz = from_footer(bad[i]);
        if (tz) {
            qg__tz_free(tz);
            fail_msg("footer \"%s\" should be rejected", bad[i]);
        }
    }
}

static unsigned char *read_zone(const char *name, size_t *len)
{
    char path[256];
    const char *dir = getenv("TZDIR");
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "/usr/share/zoneinfo",
             name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static void test_malformed(void **state)
{
    char err[128];
    size_t len;
    unsigned char *buf = read_zone("America/New_York", &len);
    qg_tz *tz;
    (void)state;

    tz = qg__tz_from_tzif("ny", buf, len, err, sizeof err);
    assert_non_null(tz);
    qg__tz_free(tz);

    /* every truncation fails cleanly (a cut exactly at the end of the data,
     * before the footer, is a valid footer-less file) */
    for (size_t n = 0; n < len; n++) {
        unsigned char *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        err[0] = '\0';
        tz = qg__tz_from_tzif("ny", copy, n, err, sizeof err);
        if (tz)
            qg__tz_free(tz);
        else
            assert_true(err[0] != '\0');
        free(copy);
    }
    tz = qg__tz_from_tzif("ny", buf, 30, err, sizeof err);
    assert_null(tz);
    tz = qg__tz_from_tzif("ny", buf, len - 1, err, sizeof err);
    assert_null(tz);                                 /* footer cut */

    /* bad magic */
    unsigned char *copy = malloc(len);
    memcpy(copy, buf, len);
    copy[0] = 'X';
    tz = qg__tz_from_tzif("ny", copy, len, err, sizeof err);
    assert_null(tz);
    assert_string_equal(err, "bad TZif magic");

    /* flipping any single byte never crashes */
    for (size_t i = 0; i < len; i++) {
        memcpy(copy, buf, len);
        copy[i] ^= 0xA5;
        tz = qg__tz_from_tzif("ny", copy, len, err, sizeof err);
        if (tz) {
            (void)qg__tz_offset_at(tz, T("2026-03-08T07:00:00Z"));
            (void)qg__tz_local_to_utc(tz, T("2026-03-08T02:30:00Z"));
            qg__tz_free(tz);
        }
    }
    /* huge counts in the header */
    memcpy(copy, buf, len);
    memset(copy + 32, 0xff, 4);
    assert_null(qg__tz_from_tzif("ny", copy, len, err, sizeof err));
    free(copy);
    free(buf);
    assert_null(qg__tz_from_tzif("x", NULL, 0, err, sizeof err));
    assert_null(qg__tz_from_tzif("x", (const unsigned char *)"TZif", 4, err,
                                sizeof err));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_york_2026),
        cmocka_unit_test(test_berlin_2026),
        cmocka_unit_test(test_far_future_footer),
        cmocka_unit_test(test_sydney),
        cmocka_unit_test(test_gap_and_overlap),
        cmocka_unit_test(test_utc_and_loader_errors),
        cmocka_unit_test(test_built_v1),
        cmocka_unit_test(test_footers),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
