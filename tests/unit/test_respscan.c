/* test_respscan.c - the streaming response readers (respscan.c, through
 * usage.h and proxy.h) against the jansson readers they replaced, kept
 * here as the reference: the same answers (return value, counts, error
 * type, usage-only flag, content bytes) on real-looking samples, on
 * edge cases of JSON itself, and on every truncation and many one-byte
 * mutations of each sample, so that what counts as malformed is
 * unchanged.  The reference parses with JSON_ALLOW_NUL, as the proxy's
 * readers did. */
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

#include "proxy.h"
#include "usage.h"
#include "jref.h"

/* The reference readers and the comparison live in tests/support
 * (jref.h), shared with the fuzz harnesses; here under short names. */
static int agree(const char *s, size_t n)
{
    return tst_resp_agree(s, n);
}

static inline int same_counts(const qg_usage_counts *a,
                              const qg_usage_counts *b)
{
    return tst_same_counts(a, b);
}

static inline void show(const char *what, const char *s, size_t n)
{
    tst_show(what, s, n);
}

/* ---------------------------------------------------------- samples */

static const char *const SAMPLES[] = {
    /* OpenAI bodies */
    "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion\",\"created\":"
    "1741569952,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"message\":"
    "{\"role\":\"assistant\",\"content\":\"Hello! How can I help?\","
    "\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
    "\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":10,"
    "\"total_tokens\":29,\"prompt_tokens_details\":{\"cached_tokens\":0}},"
    "\"system_fingerprint\":\"fp_1\"}",
    "{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[],\"usage\":{"
    "\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},"
    "\"output_tokens\":87,\"total_tokens\":123}}",
    "{\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\","
    "\"param\":null,\"code\":\"rate_limit_exceeded\"}}",
    "{\"error\":{\"message\":\"x\",\"type\":\"\",\"code\":\"c1\"}}",
    "{\"error\":{\"type\":7,\"code\":null}}",
    /* OpenAI chunks */
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,"
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" th\\u00e9re \\\""
    "usage\\\": {}\\n\"},\"logprobs\":null,\"finish_reason\":null}],"
    "\"usage\":null}",
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,"
    "\"total_tokens\":15}}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
    "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},"
    "{\"function\":{\"arguments\":\"xy\"}},{\"function\":null},7]}},"
    "{\"index\":1,\"delta\":{\"content\":\"\\ud83d\\ude00\\u0000!\"}}]}",
    /* Anthropic */
    "{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\","
    "\"content\":[{\"type\":\"text\",\"text\":\"Hi!\"}],\"usage\":{"
    "\"input_tokens\":25,\"cache_creation_input_tokens\":100,"
    "\"cache_read_input_tokens\":50,\"output_tokens\":12}}",
    "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
    "\"message\":\"Overloaded\"}}",
    "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":"
    "\"message\",\"content\":[],\"usage\":{\"input_tokens\":25,"
    "\"cache_read_input_tokens\":3,\"output_tokens\":1}}}",
    "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"text_delta\",\"text\":\"Hello \\u2603\"}}",
    "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"input_json_delta\",\"partial_json\":\"{\\\"k\\\": 1\"}}",
    "{\"type\":\"content_block_delta\",\"delta\":{\"type\":"
    "\"thinking_delta\",\"thinking\":\"hm\"}}",
    "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
    "\"stop_sequence\":null},\"usage\":{\"output_tokens\":40}}",
    "{\"type\":\"message_stop\"}",
};

/* Cases for the edges of JSON and of the paths read. */
static const char *const EDGES[] = {
    /* keys at the wrong depth, or only inside strings */
    "{\"choices\":[{\"usage\":{\"prompt_tokens\":5},\"delta\":{\"usage\":1}}]}",
    "{\"x\":{\"usage\":{\"prompt_tokens\":5}},\"y\":\"\\\"usage\\\":{}\"}",
    "{\"message\":{\"content\":[{\"usage\":{\"input_tokens\":3}}]},"
    "\"type\":\"message_start\"}",
    "{\"delta\":{\"delta\":{\"text\":\"no\"},\"text\":\"yes\"},\"choices\":"
    "[{\"content\":\"no\",\"delta\":{\"delta\":{\"content\":\"no\"}}}]}",
    "{\"choices\":{\"0\":{\"delta\":{\"content\":\"no\"}}},\"usage\":{"
    "\"prompt_tokens\":1}}",
    "{\"choices\":[[{\"delta\":{\"content\":\"no\"}}]]}",
    "{\"choices\":[{\"delta\":[{\"content\":\"no\"}]}]}",
    "{\"usage\":{\"x\":{\"prompt_tokens\":-1},\"prompt_tokens\":2}}",
    /* duplicate keys: the last wins */
    "{\"usage\":{\"prompt_tokens\":1},\"usage\":{\"completion_tokens\":2}}",
    "{\"usage\":{\"prompt_tokens\":-1,\"prompt_tokens\":3}}",
    "{\"usage\":{\"prompt_tokens\":3,\"prompt_tokens\":-1}}",
    "{\"usage\":{\"prompt_tokens\":3},\"usage\":null}",
    "{\"usage\":null,\"usage\":{\"prompt_tokens\":3}}",
    "{\"choices\":[{\"delta\":{\"content\":\"ab\"}}],\"choices\":[],"
    "\"usage\":{\"completion_tokens\":1}}",
    "{\"choices\":[],\"choices\":[{\"delta\":{\"content\":\"ab\"}}],"
    "\"usage\":{\"completion_tokens\":1}}",
    "{\"choices\":[{\"delta\":{\"content\":\"ab\",\"content\":\"c\"},"
    "\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"d\","
    "\"arguments\":\"ef\"},\"function\":{\"arguments\":\"g\"}}],"
    "\"tool_calls\":[{\"function\":{\"arguments\":\"hij\"}}]}}]}",
    "{\"error\":{\"type\":\"a\"},\"error\":5}",
    "{\"error\":{\"type\":\"a\"},\"error\":{\"code\":\"b\"}}",
    "{\"type\":\"error\",\"type\":\"message_delta\",\"usage\":{"
    "\"output_tokens\":4}}",
    "{\"delta\":{\"text\":\"abc\"},\"delta\":{\"thinking\":\"d\"}}",
    "{\"message\":{\"usage\":{\"input_tokens\":1}},\"message\":{},"
    "\"type\":\"message_start\"}",
    "{\"message\":null,\"type\":\"message_start\"}",
    "{\"message\":[],\"type\":\"message_delta\",\"usage\":{"
    "\"output_tokens\":2}}",
    /* escapes and NULs */
    "{\"type\":\"error\\u0000x\",\"error\":{\"type\":\"\\u0000t\","
    "\"code\":\"c\\u0000d\"}}",
    "{\"type\":\"message_stop\\u0000\"}",
    "{\"a\\u0000\":1}",
    "{\"usag\\u0065\":{\"prompt_tokens\":4}}",
    "{\"delta\":{\"text\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20ac"
    "\\uD834\\uDD1E\"}}",
    "{\"delta\":{\"text\":\"\\ud800\"}}",
    "{\"delta\":{\"text\":\"\\udc00\"}}",
    "{\"delta\":{\"text\":\"\\ud800\\u0041\"}}",
    "{\"delta\":{\"text\":\"\\ud800\\\\u0041\"}}",
    "{\"delta\":{\"text\":\"\\\\ud800\"}}",
    "{\"delta\":{\"text\":\"\\u12\"}}",
    "{\"delta\":{\"text\":\"\\x\"}}",
    "{\"delta\":{\"text\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}}",
    "{\"delta\":{\"text\":\"\xc0\x80\"}}",
    "{\"delta\":{\"text\":\"\xed\xa0\x80\"}}",
    "{\"delta\":{\"text\":\"\xf4\x90\x80\x80\"}}",
    "{\"delta\":{\"text\":\"\xf5\x80\x80\x80\"}}",
    "{\"delta\":{\"text\":\"\xe2\x82\"}}",
    "{\"delta\":{\"text\":\"\x7f\"}}",
    "{\"delta\":{\"text\":\"a\tb\"}}",
    /* numbers */
    "{\"usage\":{\"prompt_tokens\":-0,\"completion_tokens\":0}}",
    "{\"usage\":{\"prompt_tokens\":1.0}}",
    "{\"usage\":{\"prompt_tokens\":1e2}}",
    "{\"usage\":{\"prompt_tokens\":-3}}",
    "{\"usage\":{\"prompt_tokens\":9223372036854775807}}",
    "{\"usage\":{\"prompt_tokens\":9223372036854775808}}",
    "{\"usage\":{\"prompt_tokens\":-9223372036854775808}}",
    "{\"usage\":{\"prompt_tokens\":-9223372036854775809}}",
    "{\"usage\":{\"prompt_tokens\":99999999999999999999999}}",
    "{\"x\":99999999999999999999999,\"usage\":{\"prompt_tokens\":1}}",
    "{\"x\":1e400,\"usage\":{\"prompt_tokens\":1}}",
    "{\"x\":-1e400,\"usage\":{\"prompt_tokens\":1}}",
    "{\"x\":1e-400,\"usage\":{\"prompt_tokens\":1}}",
    "{\"x\":1.7976931348623157e308,\"usage\":{\"prompt_tokens\":1}}",
    "{\"x\":1.7976931348623159e308,\"usage\":{\"prompt_tokens\":1}}",
    "{\"x\":17976931348623157e292,\"y\":0.00001e313,\"z\":1E+308}",
    "{\"x\":123456789012345678901234567890.5e290}",
    "{\"x\":0.5e309}",
    "{\"x\":01}",
    "{\"x\":-}",
    "{\"x\":1.}",
    "{\"x\":.5}",
    "{\"x\":+1}",
    "{\"x\":1e}",
    "{\"x\":0x10}",
    "{\"x\":NaN}",
    "{\"x\":Infinity}",
    /* not JSON, or not an object */
    "", " ", "[]", "[{\"usage\":{\"prompt_tokens\":1}}]", "\"x\"", "42",
    "null", "true", "{", "}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}",
    "{\"a\":[1,]}", "{'a':1}", "{\"a\":1}x", "{\"a\":1}{}", "{\"a\":1} ",
    "\t\r\n {\"a\":1}\r\n", "{\"a\":1}\v", "\f{\"a\":1}", "{\"a\":\v1}",
    "{\"a\":1}/*c*/", "{\"a\":1}//c", "{/*c*/\"a\":1}", "{\"a\":tru}",
    "{\"a\":nul}", "{\"a\":\"\x01\"}", "{\"a\":\"x}",
    /* an unterminated string after the object (found by fuzz_respscan:
     * yajl's end-of-text flush takes it for a string still coming) */
    "{\"usage\":{\"prompt_tokens\":1}}\"", "{\"a\":1}\"x}", "{\"a\":1} \"\\\"",
    "{\"a\":1}\r\n\"", "[1]\"",
};

static void test_samples_agree(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof SAMPLES / sizeof SAMPLES[0]; i++)
        assert_true(agree(SAMPLES[i], strlen(SAMPLES[i])));
    for (size_t i = 0; i < sizeof EDGES / sizeof EDGES[0]; i++)
        assert_true(agree(EDGES[i], strlen(EDGES[i])));
    /* a NUL byte in the text itself */
    assert_true(agree("{\"a\":\"\0\"}", 8));
    assert_true(agree("{\"a\":1}\0", 8));
}

/* Nesting: jansson allows values 2048 deep, scalars included. */
static void test_depth_agrees(void **state)
{
    static const int depths[] = {6, 7, 8, 100, 2046, 2047, 2048, 2049, 5000};
    (void)state;
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
        int k = depths[d];
        size_t n = 0;
        char *s = malloc((size_t)k * 8 + 64);
        assert_non_null(s);
        /* usage at the top, then k - 1 more levels below "x" */
        n += (size_t)sprintf(s + n, "{\"usage\":{\"prompt_tokens\":1},\"x\":");
        for (int i = 1; i < k; i++)
            n += (size_t)sprintf(s + n, i % 2 ? "[" : "{\"y\":");
        n += (size_t)sprintf(s + n, "1");
        for (int i = k - 1; i >= 1; i--)
            n += (size_t)sprintf(s + n, i % 2 ? "]" : "}");
        n += (size_t)sprintf(s + n, "}");
        assert_true(agree(s, n));
        qg_usage_counts u;
        /* the innermost 1 is k + 1 deep */
        assert_int_equal(qg__usage_openai_json(s, n, &u), k < 2048 ? 1 : -1);
        free(s);
    }
}

/* Long texts with escapes: the parser's buffers outgrow the small
 * on-stack arena and move to malloc. */
static void test_long_text_agrees(void **state)
{
    static const size_t sizes[] = {100, 3000, 70000};
    (void)state;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t reps = sizes[k], n = 0;
        char *s = malloc(reps * 12 + 64);
        assert_non_null(s);
        n += (size_t)sprintf(s, "{\"choices\":[{\"delta\":{\"content\":\"");
        for (size_t i = 0; i < reps; i++) {
            memcpy(s + n, "\\n\xc3\xa9\\u20ac", 10);  /* 1 + 2 + 3 */
            n += 10;
        }
        n += (size_t)sprintf(s + n, "\"}}]}");
        assert_true(agree(s, n));
        assert_int_equal(qg__content_bytes_openai_chunk(s, n),
                         (int64_t)reps * 6);
        free(s);
    }
}

/* Every truncation, deletion and many one-byte replacements of every
 * sample: the readers refuse exactly what the reference refuses. */
static void test_mutations_agree(void **state)
{
    static const char bytes[] = {
        '"', '\\', '{', '}', '[', ']', ',', ':', '0', '-', '.', 'e', ' ',
        'u', '\0', 0x0B, (char)0x80, (char)0xC3, (char)0xED, 'x'};
    (void)state;
    tst_mutations_agree(SAMPLES, sizeof SAMPLES / sizeof SAMPLES[0], bytes,
                        sizeof bytes, agree);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples_agree),
        cmocka_unit_test(test_depth_agrees),
        cmocka_unit_test(test_long_text_agrees),
        cmocka_unit_test(test_mutations_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
