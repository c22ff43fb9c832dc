/* test_reqjson.c - the strict reading of the decision API's bodies
 * (src/server/reqjson.c): decimal weights into milli-units exactly, with
 * at most 3 decimals at every magnitude (fuzz_reqjson compares the same
 * getters with a reference on arbitrary bodies); and the one-pass reading
 * against jansson's tree, on samples and every truncation, deletion and
 * one-byte replacement of them (tests/support/reqjsonref.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>
#include "mutate.h"
#include "reqjson.h"
#include "reqjsonref.h"

static const char *const keys[] = {"weight", NULL};

/* qg__reqjson_milli on {"weight": <num>}: 1 with *v, or -1. */
static int milli_of(const char *num, int64_t *v)
{
    char body[128], err[256];
    int n = snprintf(body, sizeof body, "{\"weight\":%s}", num), rc;
    qg__reqjson o;
    assert_int_equal(qg__reqjson_parse(&o, body, (size_t)n, keys, err,
                                       sizeof err), 0);
    *v = -7;
    rc = qg__reqjson_milli(&o, "weight", 1, v, err, sizeof err);
    qg__reqjson_free(&o);
    assert_true(tst_reqjson_agree(body, (size_t)n));
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

/* Bodies as clients send them, and the edges of the one pass: escapes,
 * NULs, duplicates, nesting, numbers at their limits, long strings. */
static const char *const SAMPLES[] = {
    "{\"subject\":\"u-1\",\"request_id\":\"r-1\",\"weight\":2}",
    "{\"subject\":\"u-1\",\"request_id\":\"r-1\",\"model\":\"large\","
    "\"input_tokens\":1200,\"max_output_tokens\":800}",
    "{\"request_id\":\"r-1\",\"weight\":1,\"status\":\"completed\"}",
    "{\"request_id\":\"r-1\",\"status\":\"failed\",\"input_tokens\":0,"
    "\"output_tokens\":17,\"subject\":\"u\",\"model\":\"m\"}",
    "{\"subject\":\"u\",\"plan\":\"pro\",\"org\":null,"
    "\"billing_anchor\":\"2026-01-31T09:00:00Z\"}",
    "{\"subject\":\"u\",\"repair\":true}",
    " {\"weight\" : 2.5 , \"subject\":\"\xc3\xa9\xe2\x82\xac\"}\r\n",
    "{\"weight\":1e3,\"input_tokens\":-0,\"max_output_tokens\":1E2}",
};

static const char *const EDGES[] = {
    "", " ", "{}", "[]", "null", "\"x\"", "42", "{", "{\"subject\":}",
    "{\"subject\":\"a\",}", "{\"subject\":\"a\"}x", "{\"subject\":\"a\"}{}",
    "{\"subject\":\"a\"}\"", "{\"subject\":\"a\"}\v",
    "{\"subject\":\"a\",\"subject\":\"b\"}",
    "{\"subject\":\"a\",\"su\\u0062ject\":\"b\"}",
    "{\"subjects\":\"a\"}", "{\"subject\":\"a\",\"extra\":1}",
    "{\"subject\":{\"a\":1}}", "{\"subject\":[1,2]}", "{\"weight\":{}}",
    "{\"subject\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":"
    "{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":1"
    "}}}}}}}}}}}}}}}}}",
    "{\"subject\":\"a\\u0000b\"}", "{\"subject\":\"\\u0000\"}",
    "{\"subject\":\"\\ud800\"}", "{\"subject\":\"\\ud834\\udd1e\"}",
    "{\"subject\":\"a\\\"b\\\\c\\/d\\n\"}", "{\"subject\":\"\xff\"}",
    "{\"subject\":\"\xed\xa0\x80\"}", "{\"subject\":\"\"}",
    "{\"subject\":true,\"request_id\":false,\"weight\":null}",
    "{\"repair\":null}", "{\"repair\":1}", "{\"repair\":\"true\"}",
    "{\"input_tokens\":9223372036854775807}",
    "{\"input_tokens\":9223372036854775808}",
    "{\"input_tokens\":-9223372036854775808}",
    "{\"input_tokens\":1000000000000}", "{\"input_tokens\":1000000000001}",
    "{\"input_tokens\":1.0}", "{\"input_tokens\":-1}",
    "{\"weight\":1e400}", "{\"weight\":-1e400}", "{\"weight\":1e-400}",
    "{\"weight\":0.0001}", "{\"weight\":999999999999.999}",
    "{\"weight\":1000000000000.001}", "{\"weight\":-0.0}",
    "{\"weight\":01}", "{\"weight\":1.}", "{\"weight\":.5}", "{\"weight\":+1}",
    "{\"weight\":1e}", "{\"weight\":-}", "{\"weight\":NaN}",
    "{\"weight\":1}\0", "{'subject':\"a\"}", "{\"subject\":\"a\"}/**/",
};

static void test_readings_agree(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof SAMPLES / sizeof SAMPLES[0]; i++)
        assert_true(tst_reqjson_agree(SAMPLES[i], strlen(SAMPLES[i])));
    for (size_t i = 0; i < sizeof EDGES / sizeof EDGES[0]; i++)
        assert_true(tst_reqjson_agree(EDGES[i], strlen(EDGES[i])));
    /* NUL bytes in the text itself */
    assert_true(tst_reqjson_agree("{\"weight\":1}\0", 13));
    assert_true(tst_reqjson_agree("{\"subject\":\"a\0b\"}", 17));
    assert_true(tst_reqjson_agree("{\"weight\":1\0}", 13));
}

/* Long strings: a member at its bound and past it, and bodies whose
 * strings outgrow the one pass's buffer (jansson reads those). */
static void test_long_strings_agree(void **state)
{
    static const int lens[] = {15, 16, 17, 63, 64, 65, 254, 255, 256, 700,
                               1023, 1024, 5000};
    (void)state;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        static char b[40000];
        int n = snprintf(b, sizeof b, "{\"subject\":\"%0*d\","
                         "\"request_id\":\"%0*d\",\"status\":\"%0*d\"}",
                         lens[i], 0, lens[i] / 2 + 1, 0, lens[i], 0);
        assert_true(tst_reqjson_agree(b, (size_t)n));
        /* written with escapes: longer as text than decoded */
        n = snprintf(b, sizeof b, "{\"subject\":\"");
        for (int k = 0; k < lens[i]; k++)
            n += snprintf(b + n, sizeof b - (size_t)n, "\\u0041");
        n += snprintf(b + n, sizeof b - (size_t)n, "\"}");
        assert_true(tst_reqjson_agree(b, (size_t)n));
    }
}

/* Which reading takes which body: the pass for flat bodies of allowed
 * keys, jansson for what it must word or what the pass does not hold. */
static void test_pass_taken(void **state)
{
    static const struct { const char *body; int pass; } cases[] = {
        {"{\"subject\":\"u-1\",\"request_id\":\"r-1\",\"weight\":2}", 1},
        {"{\"subject\":\"u\",\"request_id\":\"r\",\"model\":\"m\","
         "\"input_tokens\":1,\"max_output_tokens\":2,\"weight\":null}", 1},
        {"{\"subject\":\"a\\u00e9\",\"weight\":2.5}", 1},  /* escapes */
        {"{}", 1},
        {"{\"subject\":\"a\\u0000\"}", 0},           /* jansson refuses */
        {"{\"subject\":\"a\",\"subject\":\"a\"}", 0},      /* duplicate */
        {"{\"subject\":\"a\",\"plan\":\"p\"}", 0},         /* not check's */
        {"{\"subject\":{}}", 0},                           /* nested */
        {"{\"subject\":\"a\"", 0},                         /* malformed */
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_true(tst_reqjson_agree(cases[i].body, strlen(cases[i].body)));
        if (tst_reqjson_last_pass() != cases[i].pass)
            fail_msg("%s: read %s", cases[i].body,
                     tst_reqjson_last_pass() ? "in one pass" : "by jansson");
    }
}

/* Pinned answers, so that the reference itself is checked. */
static void test_pinned(void **state)
{
    static const char *const ck[] = {"subject", "request_id", "weight",
                                     NULL};
    char err[320];
    const char *s = NULL;
    int64_t v = 0;
    qg__reqjson o;
    (void)state;
    assert_int_equal(qg__reqjson_parse(&o, "{\"subject\":\"a\\u00e9\","
                                       "\"weight\":2.5}", 34, ck, err,
                                       sizeof err), 0);
    assert_int_equal(qg__reqjson_str(&o, "subject", 1, 255, &s, err,
                                     sizeof err), 1);
    assert_string_equal(s, "a\xc3\xa9");
    assert_int_equal(qg__reqjson_milli(&o, "weight", 1, &v, err,
                                       sizeof err), 1);
    assert_int_equal(v, 2500);
    assert_int_equal(qg__reqjson_str(&o, "request_id", 1, 255, &s, err,
                                     sizeof err), -1);
    assert_string_equal(err, "request_id is required");
    qg__reqjson_free(&o);
    assert_int_equal(qg__reqjson_parse(&o, "{\"subject\":1,\"x\":2}", 19, ck,
                                       err, sizeof err), -1);
    assert_string_equal(err, "unknown field \"x\"");
    qg__reqjson_free(&o);
    assert_int_equal(qg__reqjson_parse(&o, "{\"weight\":1,\"weight\":2}", 23,
                                       ck, err, sizeof err), -1);
    assert_non_null(strstr(err, "malformed JSON at line 1"));
    assert_non_null(strstr(err, "duplicate object key"));
    qg__reqjson_free(&o);
}

static void test_mutations_agree(void **state)
{
    static const char bytes[] = {
        '"', '\\', '{', '}', '[', ']', ',', ':', '0', '9', '-', '.', 'e',
        ' ', 'u', '\0', 0x0B, (char)0x80, (char)0xC3, (char)0xED, 'x', 't',
        'n'};
    (void)state;
    tst_mutations_agree(SAMPLES, sizeof SAMPLES / sizeof SAMPLES[0], bytes,
                        sizeof bytes, tst_reqjson_agree);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_milli_exact),
        cmocka_unit_test(test_milli_too_many_decimals),
        cmocka_unit_test(test_readings_agree),
        cmocka_unit_test(test_long_strings_agree),
        cmocka_unit_test(test_pass_taken),
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_mutations_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
