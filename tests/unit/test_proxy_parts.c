/* test_proxy_parts.c - the I/O-free parts of the proxy (src/proxy/proxy.h):
 * SSE event boundaries over arbitrary splits and line ends, generated
 * text byte counts (decoded UTF-8, exact paths, duplicate keys), and
 * which caller headers go upstream. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include "proxy.h"
#include "sse.h"
#include "usage.h"

/* Feed text in pieces of `step` bytes; record each event's end offset. */
static int split_all(const char *text, size_t step, size_t *ends, int max)
{
    qg_sse_split s = {0, 0};
    size_t len = strlen(text), off = 0;
    int n = 0;
    while (off < len) {
        size_t piece = len - off < step ? len - off : step, done = 0;
        while (done < piece) {
            size_t k = qg__sse_split_next(&s, text + off + done,
                                         piece - done);
            if (k == 0)
                break;
            done += k;
            if (n < max)
                ends[n++] = off + done;
        }
        off += piece;
    }
    return n;
}

static void test_split(void **state)
{
    static const struct {
        const char *text;
        int n;
        size_t first, second;
    } cases[] = {
        {"data: a\n\ndata: b\n\n", 2, 9, 18},
        {"data: a\r\n\r\ndata: b\r\n\r\n", 2, 11, 22},
        {"data: a\r\rdata: b\r\r", 2, 9, 18},
        {"event: x\ndata: a\ndata: b\n\n", 1, 26, 0},
        {"data: a\n", 0, 0, 0},
        {": comment\n\ndata: a\n\n", 2, 11, 20},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t step = 1; step <= 32; step++) {
            size_t ends[8] = {0};
            int n = split_all(cases[i].text, step, ends, 8);
            assert_int_equal(n, cases[i].n);
            /* a CRLF split between its CR and LF: the LF goes with the
             * next event */
            if (n > 0 && ends[0] != cases[i].first)
                assert_true(cases[i].text[cases[i].first - 1] == '\n' &&
                            ends[0] == cases[i].first - 1 &&
                            (cases[i].first - 1) % step == 0);
            if (n > 1 && ends[1] != cases[i].second)
                assert_true(cases[i].text[cases[i].second - 1] == '\n' &&
                            ends[1] == cases[i].second - 1 &&
                            (cases[i].second - 1) % step == 0);
        }
}

static void test_content_bytes(void **state)
{
    const char *oc = "{\"choices\":[{\"delta\":{\"content\":\"hello\","
                     "\"tool_calls\":[{\"function\":{\"arguments\":"
                     "\"{}\"}}]}}]}";
    const char *ae = "{\"type\":\"content_block_delta\",\"delta\":"
                     "{\"type\":\"text_delta\",\"text\":\"abc\"}}";
    const char *oj = "{\"choices\":[{\"message\":{\"content\":\"tok0 "
                     "tok1\"}}]}";
    const char *aj = "{\"content\":[{\"type\":\"text\",\"text\":\"abcd\"}]}";
    (void)state;
    assert_int_equal(qg__content_bytes_openai_chunk(oc, strlen(oc)), 7);
    assert_int_equal(qg__content_bytes_openai_chunk("[DONE]", 6), 0);
    assert_int_equal(qg__content_bytes_anthropic_event(ae, strlen(ae)), 3);
    assert_int_equal(qg__content_bytes_json(oj, strlen(oj), QG_SHAPE_OPENAI),
                     9);
    assert_int_equal(qg__content_bytes_json(aj, strlen(aj),
                                           QG_SHAPE_ANTHROPIC), 4);
    assert_int_equal(qg__content_bytes_json("nope", 4, QG_SHAPE_OPENAI), 0);
}

/* Stream events count the bytes of the decoded UTF-8 text, at the exact
 * paths only, the last of duplicate keys. */
static void test_content_bytes_edges(void **state)
{
    static const struct {
        const char *text;
        int64_t openai, anthropic;
    } cases[] = {
        /* \n \" \\ \/ \t: 1 byte each; é 2; € 3; U+1D11E (a surrogate
         * pair) 4; \u0000 1; raw UTF-8 as is */
        {"{\"choices\":[{\"delta\":{\"content\":\"a\\n\\\"\\\\\\/\\t\"}}]}",
         6, 0},
        {"{\"choices\":[{\"delta\":{\"content\":\"\\u00e9\\u20ac"
         "\\ud834\\udd1e\\u0000\"}}]}", 2 + 3 + 4 + 1, 0},
        {"{\"delta\":{\"text\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}}", 0, 10},
        {"{\"delta\":{\"text\":\"\\uD83D\\uDE00\",\"partial_json\":\"{}\","
         "\"thinking\":\"\\u00e9\"}}", 0, 4 + 2 + 2},
        /* several choices and tool calls add up */
        {"{\"choices\":[{\"delta\":{\"content\":\"ab\",\"tool_calls\":["
         "{\"function\":{\"arguments\":\"cd\"}},{\"function\":{"
         "\"arguments\":\"e\"}}]}},{\"delta\":{\"content\":\"fgh\"}}]}",
         8, 0},
        /* wrong depth or type: not content */
        {"{\"content\":\"no\",\"delta\":{\"content\":\"no\"},\"choices\":[{"
         "\"content\":\"no\",\"message\":{\"content\":\"no\"},\"delta\":{"
         "\"text\":\"no\",\"x\":{\"content\":\"no\"}}}]}", 0, 0},
        {"{\"choices\":{\"a\":{\"delta\":{\"content\":\"no\"}}}}", 0, 0},
        {"{\"choices\":[{\"delta\":{\"content\":5,\"tool_calls\":{"
         "\"function\":{\"arguments\":\"no\"}}}}]}", 0, 0},
        {"{\"x\":{\"delta\":{\"text\":\"no\"}},\"delta\":{\"y\":{"
         "\"text\":\"no\"}}}", 0, 0},
        {"{\"s\":\"\\\"delta\\\":{\\\"text\\\":\\\"no\\\"}\"}", 0, 0},
        /* duplicates: the last wins */
        {"{\"choices\":[{\"delta\":{\"content\":\"abc\",\"content\":\"d\"}}]}",
         1, 0},
        {"{\"choices\":[{\"delta\":{\"content\":\"abc\"}}],\"choices\":[]}",
         0, 0},
        {"{\"delta\":{\"text\":\"abc\"},\"delta\":{\"text\":\"de\"}}", 0, 2},
        {"{\"delta\":{\"text\":\"abc\"},\"delta\":null}", 0, 0},
        /* not JSON: 0 */
        {"{\"delta\":{\"text\":\"abc\"}", 0, 0},
        {"{\"delta\":{\"text\":\"\\ud800\"}}", 0, 0},
        {"{\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}x", 0, 0},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *t = cases[i].text;
        assert_int_equal(qg__content_bytes_openai_chunk(t, strlen(t)),
                         cases[i].openai);
        assert_int_equal(qg__content_bytes_anthropic_event(t, strlen(t)),
                         cases[i].anthropic);
    }
}

static void test_forward_header(void **state)
{
    static const char *const drop[] = {
        "Authorization", "x-api-key", "X-API-KEY", "Host", "Content-Length",
        "Connection", "Transfer-Encoding", "Accept-Encoding", "X-Request-Id",
        "Proxy-Authorization", "X-Quotagate-Key", "x-quotagate-subject",
        "TE", "Upgrade", "Keep-Alive", "Expect"};
    static const char *const keep[] = {
        "anthropic-version", "anthropic-beta", "Content-Type",
        "X-Double-Mode", "OpenAI-Organization", "User-Agent", "Accept"};
    (void)state;
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        assert_int_equal(qg__proxy_forward_header(drop[i], strlen(drop[i])),
                         0);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        assert_int_equal(qg__proxy_forward_header(keep[i], strlen(keep[i])),
                         1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_content_bytes),
        cmocka_unit_test(test_content_bytes_edges),
        cmocka_unit_test(test_forward_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
