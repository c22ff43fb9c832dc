/* test_reqjson.c - the strict reading of the decision API's bodies
 * (src/server/reqjson.c): decimal weights into milli-units exactly, with
 * at most 3 decimals at every magnitude (fuzz_reqjson compares the same
 * getters with a reference on arbitrary bodies). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>
#include "reqjson.h"

static const char *const keys[] = {"weight", NULL};

/* qg__reqjson_milli on {"weight": <num>}: 1 with *v, or -1. */
static int milli_of(const char *num, int64_t *v)
{
    char body[128], err[256];
    int n = snprintf(body, sizeof body, "{\"weight\":%s}", num), rc;
    json_t *o = qg__reqjson_parse(body, (size_t)n, keys, err, sizeof err);
    assert_non_null(o);
    *v = -7;
    rc = qg__reqjson_milli(o, "weight", 1, v, err, sizeof err);
    json_decref(o);
    return rc;
}

static void test_milli_exact(void **state)
{
    static const struct { const char *num; int64_t milli; } ok[] = {
        {"0", 0}, {"-0", 0}, {"-0.0", 0}, {"1", 1000}, {"2.5", 2500},
        {"0.001", 1}, {"1.25", 1250}, {"1e3", 1000000}, {"25e-1", 2500},
        {"0.1", 100}, {"0.3", 300}, {"0.00001e2", 1}, {"1234.567", 1234567},
        {"999999999.999", 999999999999}, {"5000.000", 5000000},
        {"999999999999.999", INT64_C(999999999999999)},
        {"1000000000000.0", INT64_C(1000000000000000)},
    };
    int64_t v;
    (void)state;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(milli_of(ok[i].num, &v), 1);
        assert_int_equal(v, ok[i].milli);
    }
}

/* A fourth decimal is refused at every magnitude: it was accepted and
 * rounded away from 1000 points up (the check was relative to the
 * value), e.g. 2305843009.1472 (found by fuzz_reqjson). */
static void test_milli_too_many_decimals(void **state)
{
    static const char *const bad[] = {
        "0.0001", "0.0005", "1.0001", "999.9999", "1000.0001", "5000.0004",
        "2305843009.1472", "123456789.0004", "999999999999.9991",
        "0.00001e1", "1e-4", "-1", "-0.001",
    };
    int64_t v;
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (milli_of(bad[i], &v) != -1)
            fail_msg("weight %s was taken as %lld milli", bad[i],
                     (long long)v);
    }
    /* beyond 10^12 with a fraction: out of range (-2), before the
     * decimals are looked at (docs/decisions.md "Bounds") */
    if (milli_of("1000000000000.001", &v) != -2)
        fail_msg("weight 1000000000000.001 was not out of range");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_milli_exact),
        cmocka_unit_test(test_milli_too_many_decimals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
