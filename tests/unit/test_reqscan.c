/* test_reqscan.c - qg__request_fields (now one yajl pass, reqscan.c)
 * against the jansson reader it replaced, kept here as the reference: the
 * same return and, on success, the same fields, on real-looking request
 * bodies of both shapes, on edge cases (paths, duplicate keys, escapes,
 * caps, nesting, many keys) and on every truncation and many one-byte
 * mutations of each sample. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "mutate.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "quotagate.h"
#include "usage.h"
#include "jref.h"

/* The reference reader and the comparison live in tests/support
 * (jref.h), shared with the fuzz harness; here under a short name. */
static int agree(const char *s, size_t n)
{
    return tst_req_agree(s, n);
}

/* ---------------------------------------------------------- samples */

static const char *const SAMPLES[] = {
    /* OpenAI, about 200 bytes */
    "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"system\","
    "\"content\":\"You are a helpful assistant.\"},{\"role\":\"user\","
    "\"content\":\"Summarise the plot of Hamlet in two sentences.\"}],"
    "\"max_tokens\":128,\"temperature\":0.7,\"stream\":false}",
    "{\"model\":\"gpt-4o\",\"stream\":true,\"stream_options\":{"
    "\"include_usage\":true},\"max_completion_tokens\":50,\"messages\":["
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
    "\"Describe this\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
    "\"data:image/png;base64,AAAA\"}}]},{\"role\":\"assistant\","
    "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":"
    "\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42 \\u00e9\\n\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]}",
    /* Anthropic, about 300 bytes */
    "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":1024,\"system\":"
    "\"You are terse.\",\"messages\":[{\"role\":\"user\",\"content\":"
    "\"Hello, Claude\"},{\"role\":\"assistant\",\"content\":[{\"type\":"
    "\"tool_use\",\"id\":\"t1\",\"name\":\"calc\",\"input\":{\"x\":6}}]},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
    "\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"text\",\"text\":"
    "\"42\"}]},{\"type\":\"text\",\"text\":\"ok\"}]}],\"stream\":true}",
    "{\"model\":\"claude-haiku\",\"max_tokens\":5,\"system\":[{\"type\":"
    "\"text\",\"text\":\"Be brief.\",\"cache_control\":{\"type\":"
    "\"ephemeral\"}},{\"type\":\"text\",\"text\":\"\xc3\xa9t\xc3\xa9\"}],"
    "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
    "\"source\":{\"type\":\"base64\",\"data\":\"QUJD\"}},{\"type\":"
    "\"tool_result\",\"content\":\"done\"},{\"type\":\"text\",\"text\":"
    "\"\\ud83d\\ude00\"}]}],\"stream\":null,\"metadata\":{\"user_id\":"
    "\"u\"}}",
};

/* Cases for the edges of JSON and of the paths read. */
static const char *const EDGES[] = {
    /* keys at the wrong depth, or only inside strings */
    "{\"x\":{\"model\":\"m\"},\"max_tokens\":1}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"stream\":\"no\","
    "\"max_tokens\":-1,\"messages\":5}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"x\":{\"content\":"
    "\"no\"},\"content\":\"yes\"}],\"x\":{\"system\":\"no\"}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[[{\"content\":\"no\"}],"
    "\"str\",5,null,{\"content\":{\"text\":\"no\"}},{\"content\":[\"no\","
    "[{\"text\":\"no\"}],{\"x\":{\"text\":\"no\"}}]}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":[{\"content\":"
    "[{\"text\":\"a\",\"content\":\"no\"},{\"content\":[{\"text\":\"no\"}]},"
    "\"no\",[{\"text\":\"no\"}]]}]}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":[{\"text\":"
    "\"ab\",\"content\":\"no\"},{\"content\":\"cd\",\"text\":\"e\"},"
    "{\"text\":7,\"content\":\"fg\"},{\"text\":null,\"content\":[{\"text\":"
    "\"hi\"},{\"text\":1}]},{\"content\":\"jk\",\"text\":[]}]}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"content\":[{\"text\":"
    "\"a\"}]},{\"text\":\"b\"},\"c\"],\"messages\":null}",
    "{\"model\":\"m\",\"max_tokens\":1,\"system\":{\"text\":\"no\"}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"system\":5}",
    "{\"model\":\"m\",\"max_tokens\":1,\"y\":\"\\\"model\\\":\\\"n\\\"\"}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":{}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":\"x\"}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":0}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}",
    /* duplicate keys, at any depth: refused */
    "{\"model\":\"m\",\"model\":\"m\",\"max_tokens\":1}",
    "{\"model\":\"m\",\"max_tokens\":1,\"max_tokens\":2}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"a\":1,\"b\":{},\"a\":2}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":[{\"a\":1},{\"a\":2}],"
    "\"y\":{\"a\":{\"a\":{\"a\":3}}}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":[[[{\"k\":1,\"k\":1}]]]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"\\u006dodel\":\"n\"}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"\":1,\"\":2}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"\":1,\"a\":2}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"\xc3\xa9\":1,"
    "\"\\u00e9\":2}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"\xc3\xa9\":1,"
    "\"\\u00e8\":2}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":\"a\","
    "\"content\":\"b\"}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"a\":{},\"b\":{},\"a\":{}}",
    /* the model */
    "{\"model\":\"\",\"max_tokens\":1}",
    "{\"model\":null,\"max_tokens\":1}",
    "{\"model\":[\"m\"],\"max_tokens\":1}",
    "{\"model\":\"a\\u0000b\",\"max_tokens\":1}",
    "{\"model\":\"\\u0000\",\"max_tokens\":1}",
    "{\"model\":\"ab\\u0000\",\"max_tokens\":1}",
    "{\"model\":\"\\u00e9\\ud83d\\ude00\\n\\\"\\\\\\/\",\"max_tokens\":1}",
    "{\"model\":\"\\ud800\",\"max_tokens\":1}",
    "{\"model\":\"\\udc00\",\"max_tokens\":1}",
    "{\"model\":\"\\ud800\\u0041\",\"max_tokens\":1}",
    "{\"model\":\"\\u12\",\"max_tokens\":1}",
    "{\"model\":\"\xc0\x80\",\"max_tokens\":1}",
    "{\"model\":\"\xed\xa0\x80\",\"max_tokens\":1}",
    "{\"model\":\"\xf4\x90\x80\x80\",\"max_tokens\":1}",
    "{\"model\":\"a\tb\",\"max_tokens\":1}",
    /* stream */
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":true}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":false}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":null}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":1}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":\"true\"}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":{}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":[]}",
    /* caps */
    "{\"model\":\"m\"}",
    "{\"model\":\"m\",\"max_tokens\":null}",
    "{\"model\":\"m\",\"max_tokens\":0}",
    "{\"model\":\"m\",\"max_tokens\":-0}",
    "{\"model\":\"m\",\"max_tokens\":-1}",
    "{\"model\":\"m\",\"max_tokens\":1.5}",
    "{\"model\":\"m\",\"max_tokens\":1.0}",
    "{\"model\":\"m\",\"max_tokens\":1e2}",
    "{\"model\":\"m\",\"max_tokens\":1E+2}",
    "{\"model\":\"m\",\"max_tokens\":\"5\"}",
    "{\"model\":\"m\",\"max_tokens\":true}",
    "{\"model\":\"m\",\"max_tokens\":[1]}",
    "{\"model\":\"m\",\"max_tokens\":9223372036854775807}",
    "{\"model\":\"m\",\"max_tokens\":9223372036854775808}",
    "{\"model\":\"m\",\"max_tokens\":-9223372036854775808}",
    "{\"model\":\"m\",\"max_tokens\":-9223372036854775809}",
    "{\"model\":\"m\",\"max_tokens\":99999999999999999999999}",
    "{\"model\":\"m\",\"max_tokens\":1e400}",
    "{\"model\":\"m\",\"max_tokens\":1e-400}",
    "{\"model\":\"m\",\"max_completion_tokens\":3,\"max_tokens\":-1}",
    "{\"model\":\"m\",\"max_completion_tokens\":null,\"max_tokens\":4}",
    "{\"model\":\"m\",\"max_completion_tokens\":-1,\"max_tokens\":4}",
    "{\"model\":\"m\",\"max_completion_tokens\":2.5}",
    "{\"model\":\"m\",\"max_completion_tokens\":7}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":1e400}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":-1e400}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":99999999999999999999999}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":1.7976931348623159e308}",
    "{\"model\":\"m\",\"max_tokens\":01}",
    "{\"model\":\"m\",\"max_tokens\":+1}",
    "{\"model\":\"m\",\"max_tokens\":1.}",
    "{\"model\":\"m\",\"max_tokens\":NaN}",
    /* counted text with escapes and NULs */
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":"
    "\"\\u0000\\ud834\\udd1e\\u20ac\\t\"}],\"system\":\"\\\\u0041\"}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":"
    "\"\\ud800\\\\u0041\"}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":"
    "\"\xe2\x82\"}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"content\":"
    "\"\x7f\"}]}",
    "{\"model\":\"m\",\"max_tokens\":1,\"a\\u0000\":1}",
    /* not JSON, or not an object */
    "", " ", "[]", "[{\"model\":\"m\",\"max_tokens\":1}]", "\"x\"", "42",
    "null", "{", "}", "{\"model\":\"m\",\"max_tokens\":1,}",
    "{\"model\":\"m\",\"max_tokens\":1}x",
    "{\"model\":\"m\",\"max_tokens\":1}{}",
    "\t\r\n {\"model\":\"m\",\"max_tokens\":1}\r\n",
    "{\"model\":\"m\",\"max_tokens\":1}\v",
    "{\"model\":\"m\",\"max_tokens\":1}/**/",
    "{'model':\"m\",\"max_tokens\":1}",
    /* stream_options: an object or null for OpenAI, anything for
     * Anthropic */
    "{\"model\":\"m\",\"max_tokens\":1,\"stream\":true,\"stream_options\":50}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream_options\":\"x\"}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream_options\":null}",
    "{\"model\":\"m\",\"max_tokens\":1,\"stream_options\":{\"a\":[]}}",
    "{\"model\":\"m\",\"max_tokens\":1,\"x\":{\"stream_options\":1}}",
    /* an unterminated string after the object (found by fuzz_reqscan) */
    "{\"model\":\"m\",\"max_tokens\":1}\"",
    "{\"model\":\"m\",\"max_tokens\":1}\":1E+2}",
};

static void test_samples_agree(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof SAMPLES / sizeof SAMPLES[0]; i++)
        assert_true(agree(SAMPLES[i], strlen(SAMPLES[i])));
    for (size_t i = 0; i < sizeof EDGES / sizeof EDGES[0]; i++)
        assert_true(agree(EDGES[i], strlen(EDGES[i])));
    /* a NUL byte in the text itself */
    assert_true(agree("{\"model\":\"\0\",\"max_tokens\":1}", 28));
    assert_true(agree(NULL, 0));
}

/* Pinned answers, so that the reference itself is checked. */
static void test_pinned(void **state)
{
    qg_request_info ri;
    (void)state;
#define FIELDS(s, shape) qg__request_fields(s, strlen(s), shape, &ri)
    /* only top-level keys count */
    assert_int_equal(FIELDS(EDGES[1], QG_SHAPE_ANTHROPIC), 0);
    assert_int_equal(ri.max_output_tokens, 1);
    assert_int_equal(ri.stream, 0);
    assert_int_equal(FIELDS(EDGES[2], QG_SHAPE_OPENAI), 0);
    assert_int_equal(ri.input_bytes, 3);
    assert_int_equal(FIELDS(EDGES[4], QG_SHAPE_OPENAI), 0);
    assert_int_equal(ri.input_bytes, 1);    /* "a", one level down only */
    /* text wins over content; content counts when text is no string */
    assert_int_equal(FIELDS(EDGES[5], QG_SHAPE_OPENAI), 0);
    assert_int_equal(ri.input_bytes, 2 + 1 + 2 + 2 + 2);
    /* duplicates anywhere, however spelt */
    for (size_t i = 14; i <= 25; i++) {
        int want = i == 17 || i == 21 || i == 23 ? 0 : QG_EINVAL;
        assert_int_equal(FIELDS(EDGES[i], QG_SHAPE_OPENAI), want);
    }
    /* decoded bytes: a \u0000 counts 1, a surrogate pair 4 */
    const char *s = "{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{"
                    "\"content\":\"\\u0000\\ud834\\udd1e\\u20ac\\t\"}],"
                    "\"system\":\"\\\\u0041\"}";
    assert_int_equal(FIELDS(s, QG_SHAPE_ANTHROPIC), 0);
    assert_int_equal(ri.input_bytes, 1 + 4 + 3 + 1 + 6);
    assert_int_equal(ri.input_tokens_estimate, 4);
    /* caps */
    s = "{\"model\":\"m\",\"max_tokens\":9223372036854775807}";
    assert_int_equal(FIELDS(s, QG_SHAPE_ANTHROPIC), 0);
    assert_true(ri.max_output_tokens == INT64_MAX);
    s = "{\"model\":\"m\",\"max_tokens\":-0}";
    assert_int_equal(FIELDS(s, QG_SHAPE_ANTHROPIC), 0);
    assert_int_equal(ri.max_output_tokens, 0);
    const char *badcaps[] = {"9223372036854775808", "-1", "1.0", "1e2",
                             "\"5\"", "true", "1e400", "-9223372036854775808"};
    for (size_t i = 0; i < sizeof badcaps / sizeof badcaps[0]; i++) {
        char b[128];
        snprintf(b, sizeof b, "{\"model\":\"m\",\"max_tokens\":%s}",
                 badcaps[i]);
        assert_int_equal(FIELDS(b, QG_SHAPE_ANTHROPIC), QG_EINVAL);
        assert_int_equal(FIELDS(b, QG_SHAPE_OPENAI), QG_EINVAL);
        snprintf(b, sizeof b, "{\"model\":\"m\",\"max_completion_tokens\":3,"
                 "\"max_tokens\":%s}", badcaps[i]);
        /* max_tokens is not read then, but out-of-range numbers are
         * not JSON here (jansson's ranges) */
        if (i == 0 || strcmp(badcaps[i], "1e400") == 0) {
            assert_int_equal(FIELDS(b, QG_SHAPE_OPENAI), QG_EINVAL);
            continue;
        }
        assert_int_equal(FIELDS(b, QG_SHAPE_OPENAI), 0);
        assert_int_equal(ri.max_output_tokens, 3);
    }
    /* the model's length limit: 255 bytes taken, 256 refused */
    for (int n = 254; n <= 257; n++) {
        char b[400];
        snprintf(b, sizeof b, "{\"model\":\"%0*d\",\"max_tokens\":1}", n, 0);
        assert_int_equal(FIELDS(b, QG_SHAPE_OPENAI),
                         n < QG_REQUEST_MODEL_MAX ? 0 : QG_EINVAL);
        assert_true(agree(b, strlen(b)));
    }
    /* 255 bytes once decoded, more as written */
    char b[2000];
    size_t n = (size_t)sprintf(b, "{\"model\":\"");
    for (int i = 0; i < 255; i++)
        n += (size_t)sprintf(b + n, "\\u0041");
    n += (size_t)sprintf(b + n, "\",\"max_tokens\":1}");
    assert_int_equal(qg__request_fields(b, n, QG_SHAPE_OPENAI, &ri), 0);
    assert_int_equal(strlen(ri.model), 255);
#undef FIELDS
}

/* Nesting: values 2048 deep at most, as jansson. */
static void test_depth_agrees(void **state)
{
    static const int depths[] = {6, 7, 8, 9, 100, 2046, 2047, 2048, 2049,
                                 5000};
    (void)state;
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
        int k = depths[d];
        size_t n = 0;
        char *s = malloc((size_t)k * 16 + 128);
        assert_non_null(s);
        /* below .messages, alternately arrays and {"content": ...} */
        n += (size_t)sprintf(s, "{\"model\":\"m\",\"max_tokens\":1,"
                                "\"messages\":");
        for (int i = 1; i < k; i++)
            n += (size_t)sprintf(s + n, i % 2 ? "[" : "{\"content\":");
        n += (size_t)sprintf(s + n, "\"abc\"");
        for (int i = k - 1; i >= 1; i--)
            n += (size_t)sprintf(s + n, i % 2 ? "]" : "}");
        n += (size_t)sprintf(s + n, "}");
        assert_true(agree(s, n));
        free(s);
    }
}

/* Many keys and long keys: the key set outgrows the stack. */
static void test_many_keys_agree(void **state)
{
    static const int counts[] = {10, 33, 64, 65, 1000, 20000};
    (void)state;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (int dup = 0; dup <= 2; dup++) {
            int k = counts[c];
            size_t n = 0;
            char *s = malloc((size_t)k * 80 + 256);
            assert_non_null(s);
            n += (size_t)sprintf(s, "{\"model\":\"m\",\"max_tokens\":1,"
                                    "\"x\":{");
            for (int i = 0; i < k; i++)
                n += (size_t)sprintf(s + n, "%s\"k%d%s\":{\"k%d\":%d}",
                                     i ? "," : "", i,
                                     i % 7 ? "" : "-a-longer-key-to-fill-"
                                                  "the-byte-store-faster",
                                     i, i);
            if (dup == 1)       /* a duplicate of an early key, at the end */
                n += (size_t)sprintf(s + n, ",\"k1\":0");
            if (dup == 2)       /* the same key in another object: fine */
                n += (size_t)sprintf(s + n, ",\"k\":{\"k1\":0}");
            n += (size_t)sprintf(s + n, "}}");
            assert_true(agree(s, n));
            qg_request_info ri;
            assert_int_equal(qg__request_fields(s, n, QG_SHAPE_OPENAI, &ri),
                             dup == 1 ? QG_EINVAL : 0);
            free(s);
        }
    }
}

/* Every truncation, deletion and many one-byte replacements of every
 * sample: the reader refuses exactly what the reference refuses. */
static void test_mutations_agree(void **state)
{
    static const char bytes[] = {
        '"', '\\', '{', '}', '[', ']', ',', ':', '0', '-', '.', 'e', ' ',
        'u', '\0', 0x0B, (char)0x80, (char)0xC3, (char)0xED, 'x', 't'};
    (void)state;
    tst_mutations_agree(SAMPLES, sizeof SAMPLES / sizeof SAMPLES[0], bytes,
                        sizeof bytes, agree);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples_agree),
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_depth_agrees),
        cmocka_unit_test(test_many_keys_agree),
        cmocka_unit_test(test_mutations_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
