/* test_proxy_parts.c - the I/O-free parts of the proxy (src/proxy/proxy.h):
 * SSE event boundaries over arbitrary splits and line ends, generated
 * text byte counts, and which caller headers go upstream. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include "proxy.h"
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
            size_t k = qg_sse_split_next(&s, text + off + done,
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
    assert_int_equal(qg_content_bytes_openai_chunk(oc, strlen(oc)), 7);
    assert_int_equal(qg_content_bytes_openai_chunk("[DONE]", 6), 0);
    assert_int_equal(qg_content_bytes_anthropic_event(ae, strlen(ae)), 3);
    assert_int_equal(qg_content_bytes_json(oj, strlen(oj), QG_SHAPE_OPENAI),
                     9);
    assert_int_equal(qg_content_bytes_json(aj, strlen(aj),
                                           QG_SHAPE_ANTHROPIC), 4);
    assert_int_equal(qg_content_bytes_json("nope", 4, QG_SHAPE_OPENAI), 0);
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
        assert_int_equal(qg_proxy_forward_header(drop[i], strlen(drop[i])),
                         0);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        assert_int_equal(qg_proxy_forward_header(keep[i], strlen(keep[i])),
                         1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_content_bytes),
        cmocka_unit_test(test_forward_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
