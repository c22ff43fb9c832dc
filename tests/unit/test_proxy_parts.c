/* test_proxy_parts.c - the I/O-free parts of the proxy (src/proxy/proxy.h):
 * SSE event boundaries over arbitrary splits and line ends, generated
 * text byte counts (decoded UTF-8, exact paths, duplicate keys), which
 * caller headers go upstream, and the request head sent upstream, byte
 * for byte. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <event2/buffer.h>
#include "proxy.h"
#include "upstream.h"
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

/* The splitter's model: the state machine over one byte at a time (an
 * event ends at the second line end in a row; a CRLF is one line end,
 * kept whole when it ends the event). */
static size_t model_split(qg_sse_split *s, const char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == '\n' && s->cr) {
            s->cr = 0;
            continue;
        }
        if (c == '\r' || c == '\n') {
            s->cr = c == '\r';
            if (s->at_eol) {
                s->at_eol = 0;
                if (c == '\r' && i + 1 < len && buf[i + 1] == '\n') {
                    s->cr = 0;
                    return i + 2;
                }
                return i + 1;
            }
            s->at_eol = 1;
        } else {
            s->at_eol = s->cr = 0;
        }
    }
    return 0;
}

/* The splitter (which looks for line ends with memchr) against the model
 * on random text of line ends, colons and letters, fed in random pieces:
 * the same event ends and the same state after every piece. */
static void test_split_model(void **state)
{
    static const char alphabet[] = "a:\r\n\n\r";
    unsigned seed = 12345;
    (void)state;
    for (int round = 0; round < 20000; round++) {
        char text[96];
        size_t len, off = 0;
        qg_sse_split got = {0, 0}, want = {0, 0};
        seed = seed * 1103515245u + 12345u;
        len = (seed >> 16) % sizeof text;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            text[i] = alphabet[(seed >> 16) % (sizeof alphabet - 1)];
        }
        while (off < len) {
            size_t piece, a, b;
            seed = seed * 1103515245u + 12345u;
            piece = 1 + (seed >> 16) % (len - off);
            a = qg__sse_split_next(&got, text + off, piece);
            b = model_split(&want, text + off, piece);
            assert_int_equal(a, b);
            assert_int_equal(got.at_eol, want.at_eol);
            assert_int_equal(got.cr, want.cr);
            off += a ? a : piece;
        }
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

/* The head as the upstream receives it: the request line with the
 * upstream's prefix, Host, the forwarded headers in order, the length,
 * the id, a Content-Type only when the caller gave none, the gateway's
 * credential in the shape's header; a CR or LF in a header refuses. */
static char *head_text(const qg_upstream *up, const qg_http_header *h,
                       int nh, size_t blen, int shape, const char *key,
                       int *rc)
{
    struct evbuffer *b = evbuffer_new();
    size_t n;
    char *t;
    assert_non_null(b);
    *rc = qg__proxy_request_head(b, up, "/v1/chat/completions", h, nh, blen,
                                 "rid-7", shape, key);
    n = evbuffer_get_length(b);
    t = malloc(n + 1);
    assert_non_null(t);
    evbuffer_remove(b, t, n);
    t[n] = '\0';
    evbuffer_free(b);
    return t;
}

static void test_request_head(void **state)
{
    char err[256], *t;
    int rc;
    qg_upstream *up = qg__upstream_new("http://127.0.0.1:8123/api", 1, 1000,
                                       NULL, err, sizeof err);
    qg_http_header h[] = {
        {"User-Agent", 10, "t/1", 3},
        {"Authorization", 13, "Bearer client", 13},
        {"content-type", 12, "application/json; charset=utf-8", 31},
        {"X-Double-Mode", 13, "slow=0", 6},
    };
    (void)state;
    assert_non_null(up);
    t = head_text(up, h, 4, 1234567, QG_SHAPE_OPENAI, "sk-up", &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(t,
        "POST /api/v1/chat/completions HTTP/1.1\r\n"
        "Host: 127.0.0.1:8123\r\n"
        "User-Agent: t/1\r\n"
        "content-type: application/json; charset=utf-8\r\n"
        "X-Double-Mode: slow=0\r\n"
        "Content-Length: 1234567\r\n"
        "X-Request-Id: rid-7\r\n"
        "Authorization: Bearer sk-up\r\n\r\n");
    free(t);
    /* no Content-Type from the caller, the other shape, an empty body */
    t = head_text(up, h, 2, 0, QG_SHAPE_ANTHROPIC, "ak", &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(t,
        "POST /api/v1/chat/completions HTTP/1.1\r\n"
        "Host: 127.0.0.1:8123\r\n"
        "User-Agent: t/1\r\n"
        "Content-Length: 0\r\n"
        "X-Request-Id: rid-7\r\n"
        "Content-Type: application/json\r\n"
        "x-api-key: ak\r\n\r\n");
    free(t);
    /* no gateway key: none sent */
    t = head_text(up, h, 0, 5, QG_SHAPE_OPENAI, "", &rc);
    assert_int_equal(rc, 0);
    assert_null(strstr(t, "Authorization"));
    free(t);
    /* a line break in a forwarded header or in the key: refused */
    h[0].value = "t\r\nX-Evil: 1";
    h[0].value_len = strlen(h[0].value);
    free(head_text(up, h, 1, 5, QG_SHAPE_OPENAI, "k", &rc));
    assert_int_equal(rc, QG_EINVAL);
    free(head_text(up, h + 1, 0, 5, QG_SHAPE_OPENAI, "k\nX: y", &rc));
    assert_int_equal(rc, QG_EINVAL);
    qg__upstream_free(up);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_split_model),
        cmocka_unit_test(test_content_bytes),
        cmocka_unit_test(test_content_bytes_edges),
        cmocka_unit_test(test_forward_header),
        cmocka_unit_test(test_request_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
