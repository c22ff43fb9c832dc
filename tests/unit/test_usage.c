/* test_usage.c - token usage read from OpenAI and Anthropic responses
 * (whole bodies, and real-looking SSE streams run through the SSE parser:
 * the include_usage chunk, a stream without usage, Anthropic's cumulative
 * message_delta, an overloaded_error event), the admission fields of
 * requests (model, stream, output cap, the input byte estimate), the
 * upstream rewrite (include_usage only when needed, other fields and their
 * order kept, model downgrade), and malformed input everywhere: every
 * truncated prefix of every sample is refused and never crashes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "quotagate.h"
#include "sse.h"
#include "usage.h"

/* ----------------------------------------------------------- samples */

static const char OA_BODY[] =
    "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion\",\"created\":"
    "1741569952,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"index\":0,"
    "\"message\":{\"role\":\"assistant\",\"content\":\"Hello! How can I "
    "help?\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}"
    "],\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":10,"
    "\"total_tokens\":29,\"prompt_tokens_details\":{\"cached_tokens\":0},"
    "\"completion_tokens_details\":{\"reasoning_tokens\":0}},"
    "\"system_fingerprint\":\"fp_1\"}";

static const char OA_RESPONSES_BODY[] =
    "{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[],\"usage\":{"
    "\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},"
    "\"output_tokens\":87,\"total_tokens\":123}}";

static const char OA_ERROR_BODY[] =
    "{\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\","
    "\"param\":null,\"code\":\"rate_limit_exceeded\"}}";

#define OA_CHUNK(delta, finish)                                              \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","     \
    "\"created\":1,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp\"," \
    "\"choices\":[{\"index\":0,\"delta\":" delta ",\"logprobs\":null,"       \
    "\"finish_reason\":" finish "}],\"usage\":null}\n\n"

static const char OA_STREAM[] =
    OA_CHUNK("{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}",
             "null")
    OA_CHUNK("{\"content\":\"Hello\"}", "null")
    OA_CHUNK("{\"content\":\" there, \\\"usage\\\": {}\"}", "null")
    OA_CHUNK("{}", "\"stop\"")
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
    "\"created\":1,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp\","
    "\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,"
    "\"total_tokens\":15}}\n\n"
    "data: [DONE]\n\n";

static const char OA_STREAM_NO_USAGE[] =
    OA_CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null")
    OA_CHUNK("{\"content\":\"Hi\"}", "null")
    OA_CHUNK("{}", "\"stop\"")
    "data: [DONE]\n\n";

static const char AN_BODY[] =
    "{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\","
    "\"model\":\"claude-sonnet-4-5\",\"content\":[{\"type\":\"text\","
    "\"text\":\"Hi!\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,"
    "\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":100,"
    "\"cache_read_input_tokens\":50,\"output_tokens\":12}}";

static const char AN_ERROR_BODY[] =
    "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
    "\"message\":\"Overloaded\"}}";

static const char AN_STREAM[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":"
    "\"message\",\"role\":\"assistant\",\"content\":[],\"model\":"
    "\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,"
    "\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
    "{\"type\":\"text\",\"text\":\"\"}}\n\n"
    "event: ping\n"
    "data: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"text_delta\",\"text\":\"Hello\"}}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},"
    "\"usage\":{\"output_tokens\":15}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"text_delta\",\"text\":\" world\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
    "\"stop_sequence\":null},\"usage\":{\"output_tokens\":40}}\n\n"
    "event: message_stop\n"
    "data: {\"type\":\"message_stop\"}\n\n";

static const char AN_STREAM_ERROR[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"usage\":"
    "{\"input_tokens\":7,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}"
    "\n\n"
    "event: error\n"
    "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
    "\"message\":\"Overloaded\"}}\n\n";

static const char OA_REQ[] =
    "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"system\",\"content\":"
    "\"Be brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
    "\"text\":\"Describe this\"},{\"type\":\"image_url\",\"image_url\":{"
    "\"url\":\"https://x/y.png\"}}]}],\"temperature\":0.7,\"stream\":true,"
    "\"max_tokens\":100,\"max_completion_tokens\":50,\"user\":\"u1\"}";

static const char AN_REQ[] =
    "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":1024,\"system\":["
    "{\"type\":\"text\",\"text\":\"You are terse.\"}],\"messages\":["
    "{\"role\":\"user\",\"content\":\"Hello, Claude\"},{\"role\":"
    "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\","
    "\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{"
    "\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":"
    "\"text\",\"text\":\"42\"}]},{\"type\":\"tool_result\",\"tool_use_id\":"
    "\"t2\",\"content\":\"ok\"}]}],\"stream\":true}";

/* ------------------------------------------------- stream harnesses */

typedef struct oa_run {
    qg_usage_counts u;
    int chunks, usage_hits, usage_only, done, malformed, errors;
    int after_done;    /* events seen after [DONE] */
} oa_run;

static int oa_event(const char *ev, size_t elen, const char *data,
                    size_t dlen, void *ud)
{
    oa_run *r = ud;
    int only = -1;
    (void)ev;
    (void)elen;
    if (r->done)
        r->after_done++;
    int rc = qg__usage_openai_chunk(data, dlen, &r->u, &only);
    assert_true(only == 0 || only == 1);
    r->chunks++;
    switch (rc) {
    case 2: r->done++; break;
    case 1: r->usage_hits++; r->usage_only += only; break;
    case 0: assert_int_equal(only, 0); break;
    case -1: r->malformed++; break;
    case -2: r->errors++; break;
    default: fail_msg("unexpected %d", rc);
    }
    return 0;
}

/* Run an OpenAI stream through the SSE parser, cut at `cut`. */
static int run_oa(const char *s, size_t n, size_t cut, oa_run *r)
{
    memset(r, 0, sizeof *r);
    qg_sse *p = qg__sse_new(1 << 16);
    assert_non_null(p);
    int rc = qg__sse_feed(p, s, cut, oa_event, r);
    if (rc == 0)
        rc = qg__sse_feed(p, s + cut, n - cut, oa_event, r);
    int frc = qg__sse_finish(p);
    qg__sse_free(p);
    return rc ? rc : frc;
}

typedef struct an_run {
    qg_usage_counts u;
    int events, usage_hits, stop, error, malformed;
} an_run;

static int an_event(const char *ev, size_t elen, const char *data,
                    size_t dlen, void *ud)
{
    an_run *r = ud;
    r->events++;
    switch (qg__usage_anthropic_event(ev, elen, data, dlen, &r->u)) {
    case 2: r->stop++; break;
    case 1: r->usage_hits++; break;
    case 0: break;
    case -1: r->malformed++; break;
    case -2: r->error++; break;
    default: fail_msg("unexpected");
    }
    return 0;
}

static int run_an(const char *s, size_t n, size_t cut, an_run *r)
{
    memset(r, 0, sizeof *r);
    qg_sse *p = qg__sse_new(1 << 16);
    assert_non_null(p);
    int rc = qg__sse_feed(p, s, cut, an_event, r);
    if (rc == 0)
        rc = qg__sse_feed(p, s + cut, n - cut, an_event, r);
    int frc = qg__sse_finish(p);
    qg__sse_free(p);
    return rc ? rc : frc;
}

/* ------------------------------------------------------ OpenAI */

static void test_openai_body(void **state)
{
    (void)state;
    qg_usage_counts u;
    assert_int_equal(qg__usage_openai_json(OA_BODY, strlen(OA_BODY), &u), 1);
    assert_int_equal(u.input_tokens, 19);
    assert_int_equal(u.output_tokens, 10);
    assert_true(u.have_input && u.have_output);
    assert_string_equal(u.error, "");

    assert_int_equal(qg__usage_openai_json(OA_RESPONSES_BODY,
                                          strlen(OA_RESPONSES_BODY), &u), 1);
    assert_int_equal(u.input_tokens, 36);
    assert_int_equal(u.output_tokens, 87);

    assert_int_equal(qg__usage_openai_json(OA_ERROR_BODY,
                                          strlen(OA_ERROR_BODY), &u), 0);
    assert_string_equal(u.error, "requests");
    assert_false(u.have_input || u.have_output);

    const char *s = "{\"choices\":[],\"usage\":null}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 0);
    s = "{\"usage\":{\"total_tokens\":5}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 0);
    s = "{\"usage\":{\"prompt_tokens\":5}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);
    assert_true(u.have_input && !u.have_output);
    /* wrong shapes are malformed */
    const char *bad[] = {"", "[]", "42", "null", "{\"usage\":[]}",
                         "{\"usage\":{\"prompt_tokens\":-1}}",
                         "{\"usage\":{\"prompt_tokens\":\"5\"}}",
                         "{\"usage\":{\"completion_tokens\":1.5}}",
                         "{\"usage\":{}}x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(qg__usage_openai_json(bad[i], strlen(bad[i]), &u), -1);
        assert_false(u.have_input || u.have_output);
    }
    assert_int_equal(qg__usage_openai_json(NULL, 0, &u), -1);
}

static void test_openai_stream(void **state)
{
    (void)state;
    oa_run r;
    size_t n = strlen(OA_STREAM);
    assert_int_equal(run_oa(OA_STREAM, n, 0, &r), 0);
    assert_int_equal(r.chunks, 6);
    assert_int_equal(r.usage_hits, 1);
    assert_int_equal(r.usage_only, 1);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.after_done, 0);
    assert_int_equal(r.malformed + r.errors, 0);
    assert_int_equal(r.u.input_tokens, 12);
    assert_int_equal(r.u.output_tokens, 3);
    /* the same wherever the bytes are cut */
    for (size_t k = 0; k <= n; k++) {
        assert_int_equal(run_oa(OA_STREAM, n, k, &r), 0);
        assert_int_equal(r.usage_hits, 1);
        assert_int_equal(r.u.output_tokens, 3);
        assert_int_equal(r.done, 1);
    }
}

static void test_openai_stream_no_usage(void **state)
{
    (void)state;
    oa_run r;
    assert_int_equal(
        run_oa(OA_STREAM_NO_USAGE, strlen(OA_STREAM_NO_USAGE), 0, &r), 0);
    assert_int_equal(r.chunks, 4);
    assert_int_equal(r.usage_hits, 0);
    assert_int_equal(r.done, 1);
    assert_false(r.u.have_input || r.u.have_output);
}

static void test_openai_chunk_cases(void **state)
{
    (void)state;
    qg_usage_counts u;
    int only = 5;
    memset(&u, 0, sizeof u);
    assert_int_equal(qg__usage_openai_chunk(" [DONE] \r\n", 10, &u, &only), 2);
    assert_int_equal(only, 0);
    /* usage on a chunk that still has choices: counted, not usage-only */
    const char *s = "{\"choices\":[{\"index\":0,\"delta\":{}}],\"usage\":"
                    "{\"prompt_tokens\":4,\"completion_tokens\":2}}";
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, &only), 1);
    assert_int_equal(only, 0);
    assert_int_equal(u.output_tokens, 2);
    /* no choices member at all: not the include_usage chunk either */
    s = "{\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}";
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, NULL), 1);
    assert_int_equal(u.output_tokens, 3);
    /* an error chunk mid-stream */
    s = "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}";
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, &only), -2);
    assert_string_equal(u.error, "server_error");
    /* malformed leaves the counts alone */
    s = "{\"choices\":[],\"usage\":{\"prompt_tokens\":-4}}";
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, &only), -1);
    assert_int_equal(u.input_tokens, 4);
    assert_int_equal(qg__usage_openai_chunk("[DONE", 5, &u, &only), -1);
    assert_int_equal(qg__usage_openai_chunk("", 0, &u, &only), -1);
    assert_int_equal(qg__usage_openai_chunk("{\"usage\":3}", 11, &u, &only), -1);
}

/* ---------------------------------------------------- Anthropic */

static void test_anthropic_body(void **state)
{
    (void)state;
    qg_usage_counts u;
    assert_int_equal(qg__usage_anthropic_json(AN_BODY, strlen(AN_BODY), &u), 1);
    assert_int_equal(u.input_tokens, 175);
    assert_int_equal(u.output_tokens, 12);
    assert_int_equal(qg__usage_anthropic_json(AN_ERROR_BODY,
                                             strlen(AN_ERROR_BODY), &u), 0);
    assert_string_equal(u.error, "overloaded_error");
    const char *s = "{\"usage\":{\"input_tokens\":9223372036854775807,"
                    "\"cache_read_input_tokens\":1,\"output_tokens\":1}}";
    assert_int_equal(qg__usage_anthropic_json(s, strlen(s), &u), -1);
    s = "{\"type\":\"message\"}";
    assert_int_equal(qg__usage_anthropic_json(s, strlen(s), &u), 0);
}

static void test_anthropic_stream(void **state)
{
    (void)state;
    an_run r;
    size_t n = strlen(AN_STREAM);
    for (size_t k = 0; k <= n; k++) {
        assert_int_equal(run_an(AN_STREAM, n, k, &r), 0);
        assert_int_equal(r.events, 9);
        assert_int_equal(r.usage_hits, 3);
        assert_int_equal(r.stop, 1);
        assert_int_equal(r.error + r.malformed, 0);
        assert_int_equal(r.u.input_tokens, 25);
        assert_int_equal(r.u.output_tokens, 40);   /* last, not 1+15+40 */
        assert_true(r.u.have_input && r.u.have_output);
    }
}

static void test_anthropic_error_event(void **state)
{
    (void)state;
    an_run r;
    assert_int_equal(
        run_an(AN_STREAM_ERROR, strlen(AN_STREAM_ERROR), 0, &r), 0);
    assert_int_equal(r.error, 1);
    assert_int_equal(r.stop, 0);
    assert_string_equal(r.u.error, "overloaded_error");
    assert_int_equal(r.u.input_tokens, 10);
    assert_int_equal(r.u.output_tokens, 1);
    /* a long error type is truncated, a missing one reads "error" */
    qg_usage_counts u;
    memset(&u, 0, sizeof u);
    char big[200];
    int n = snprintf(big, sizeof big, "{\"type\":\"error\",\"error\":{\"type\":"
                     "\"%0100d\"}}", 0);
    assert_int_equal(qg__usage_anthropic_event("error", 5, big, (size_t)n, &u),
                     -2);
    assert_int_equal(strlen(u.error), 63);
    const char *s = "{\"type\":\"error\"}";
    assert_int_equal(qg__usage_anthropic_event("error", 5, s, strlen(s), &u),
                     -2);
    assert_string_equal(u.error, "error");
    /* the SSE type is the fallback when the payload has none */
    memset(&u, 0, sizeof u);
    s = "{\"usage\":{\"output_tokens\":9}}";
    assert_int_equal(
        qg__usage_anthropic_event("message_delta", 13, s, strlen(s), &u), 1);
    assert_int_equal(u.output_tokens, 9);
    assert_int_equal(qg__usage_anthropic_event("message_stop", 12, "{}", 2, &u),
                     2);
    /* a message_delta that also reports input (cumulative) replaces it */
    s = "{\"type\":\"message_delta\",\"usage\":{\"input_tokens\":30,"
        "\"cache_read_input_tokens\":5,\"output_tokens\":11}}";
    assert_int_equal(qg__usage_anthropic_event("message_delta", 13, s,
                                              strlen(s), &u), 1);
    assert_int_equal(u.input_tokens, 35);
    assert_int_equal(u.output_tokens, 11);
    /* malformed: -1 and acc unchanged */
    s = "{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":\"x\"}}";
    assert_int_equal(qg__usage_anthropic_event("message_delta", 13, s,
                                              strlen(s), &u), -1);
    assert_int_equal(u.output_tokens, 11);
    s = "{\"type\":\"message_start\",\"message\":[]}";
    assert_int_equal(qg__usage_anthropic_event(NULL, 0, s, strlen(s), &u), -1);
}

/* ------------------------------------------- responses: the edges */

/* What a streaming reader could get wrong: keys at the wrong depth or in
 * strings, duplicate keys (the last wins, as jansson's json_loadb without
 * JSON_REJECT_DUPLICATES), counts that are not non-negative 64-bit
 * integers, broken JSON, deep nesting.  tests/unit/test_respscan.c
 * compares all of it with the jansson readers these replaced. */
static void test_response_edges(void **state)
{
    (void)state;
    qg_usage_counts u;
    int only;
    /* "usage" only at the top, never inside a choice or a string */
    const char *s = "{\"choices\":[{\"usage\":{\"prompt_tokens\":5}}],"
                    "\"x\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":6}\"}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 0);
    s = "{\"choices\":[],\"meta\":{\"usage\":{\"prompt_tokens\":5}}}";
    memset(&u, 0, sizeof u);
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, &only), 0);
    assert_false(u.have_input);
    /* only usage's own members: a nested prompt_tokens is not one */
    s = "{\"usage\":{\"details\":{\"prompt_tokens\":-1},\"prompt_tokens\":2}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);
    assert_int_equal(u.input_tokens, 2);
    /* Anthropic message_start reads message.usage, not a top usage */
    s = "{\"type\":\"message_start\",\"usage\":{\"input_tokens\":99},"
        "\"message\":{\"usage\":{\"input_tokens\":3}}}";
    memset(&u, 0, sizeof u);
    assert_int_equal(qg__usage_anthropic_event(NULL, 0, s, strlen(s), &u), 1);
    assert_int_equal(u.input_tokens, 3);
    /* an escaped key is the key it spells */
    s = "{\"usag\\u0065\":{\"prompt_tokens\":4}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);
    assert_int_equal(u.input_tokens, 4);

    /* duplicate keys: the last one wins, whole */
    s = "{\"usage\":{\"prompt_tokens\":1},\"usage\":{\"completion_tokens\":2}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);
    assert_false(u.have_input);
    assert_int_equal(u.output_tokens, 2);
    s = "{\"usage\":{\"prompt_tokens\":-1,\"prompt_tokens\":3}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);
    assert_int_equal(u.input_tokens, 3);
    s = "{\"usage\":{\"prompt_tokens\":3,\"prompt_tokens\":1.5}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), -1);
    s = "{\"usage\":{\"prompt_tokens\":3},\"usage\":null}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 0);
    s = "{\"choices\":[],\"usage\":{\"prompt_tokens\":1},\"choices\":[{}]}";
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, &only), 1);
    assert_int_equal(only, 0);
    s = "{\"choices\":[{}],\"usage\":{\"prompt_tokens\":1},\"choices\":[]}";
    assert_int_equal(qg__usage_openai_chunk(s, strlen(s), &u, &only), 1);
    assert_int_equal(only, 1);
    s = "{\"type\":\"error\",\"type\":\"message_delta\",\"usage\":{"
        "\"output_tokens\":4}}";
    assert_int_equal(qg__usage_anthropic_event(NULL, 0, s, strlen(s), &u), 1);
    assert_int_equal(u.output_tokens, 4);

    /* error types: cut at a NUL (as a C string), empty falls to code */
    s = "{\"error\":{\"type\":\"\",\"code\":\"rate\\u0000x\"}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 0);
    assert_string_equal(u.error, "rate");
    s = "{\"error\":{\"type\":5,\"code\":7}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 0);
    assert_string_equal(u.error, "error");

    /* counts: negative, fractional, exponent, string, too big: -1 */
    static const char *const bad[] = {
        "{\"usage\":{\"prompt_tokens\":-1}}",
        "{\"usage\":{\"prompt_tokens\":2.5}}",
        "{\"usage\":{\"prompt_tokens\":2.0}}",
        "{\"usage\":{\"prompt_tokens\":2e1}}",
        "{\"usage\":{\"prompt_tokens\":\"2\"}}",
        "{\"usage\":{\"prompt_tokens\":true}}",
        "{\"usage\":{\"prompt_tokens\":[2]}}",
        "{\"usage\":{\"prompt_tokens\":9223372036854775808}}",
        "{\"usage\":{\"prompt_tokens\":-9223372036854775808}}",
        /* too big anywhere: not JSON jansson would read */
        "{\"n\":99999999999999999999,\"usage\":{\"prompt_tokens\":1}}",
        "{\"n\":1e999,\"usage\":{\"prompt_tokens\":1}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(qg__usage_openai_json(bad[i], strlen(bad[i]), &u),
                         -1);
        /* the same with Anthropic's name for the count */
        char an[128];
        const char *k = strstr(bad[i], "prompt_tokens");
        assert_non_null(k);
        int n = snprintf(an, sizeof an, "%.*sinput_tokens%s",
                         (int)(k - bad[i]), bad[i], k + 13);
        assert_int_equal(qg__usage_anthropic_json(an, (size_t)n, &u), -1);
    }
    s = "{\"usage\":{\"prompt_tokens\":9223372036854775807,"
        "\"completion_tokens\":-0}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);
    assert_int_equal(u.input_tokens, INT64_MAX);
    assert_int_equal(u.output_tokens, 0);
    s = "{\"n\":1e-999,\"m\":-0.0,\"usage\":{\"prompt_tokens\":1}}";
    assert_int_equal(qg__usage_openai_json(s, strlen(s), &u), 1);

    /* not JSON: -1 */
    static const char *const broken[] = {
        "{\"usage\":{\"prompt_tokens\":1}", "{\"usage\":{\"prompt_tokens\":1,}}",
        "{\"usage\":{\"prompt_tokens\":01}}", "{\"usage\":{}}\v",
        "{\"usage\":{}}/**/", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00x\"}",
        "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\\u0000\":1}",
        "{\"a\":NaN}",
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        memset(&u, 0, sizeof u);
        assert_int_equal(qg__usage_openai_json(broken[i], strlen(broken[i]),
                                              &u), -1);
        assert_int_equal(qg__usage_openai_chunk(broken[i], strlen(broken[i]),
                                               &u, &only), -1);
        assert_int_equal(qg__usage_anthropic_event("message_delta", 13,
                                                  broken[i], strlen(broken[i]),
                                                  &u), -1);
    }
}

/* Deep nesting: values at most 2048 deep (jansson's limit, a scalar
 * counting as a level); deeper is malformed, never a crash. */
static void test_response_depth(void **state)
{
    (void)state;
    static const int depths[] = {2047, 2048, 100000};
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
        int k = depths[d];
        size_t n = 0, cap = (size_t)k * 2 + 64;
        char *s = malloc(cap);
        qg_usage_counts u;
        assert_non_null(s);
        n += (size_t)sprintf(s, "{\"usage\":{\"prompt_tokens\":1},\"x\":");
        for (int i = 2; i <= k; i++)    /* the top object is level 1 */
            s[n++] = '[';
        for (int i = 2; i <= k; i++)
            s[n++] = ']';
        s[n++] = '}';
        assert_int_equal(qg__usage_openai_json(s, n, &u), k <= 2048 ? 1 : -1);
        free(s);
    }
}

/* ------------------------------------------------------ requests */

static void test_request_fields(void **state)
{
    (void)state;
    qg_request_info ri;
    assert_int_equal(qg__request_fields(OA_REQ, strlen(OA_REQ),
                                       QG_SHAPE_OPENAI, &ri), 0);
    assert_string_equal(ri.model, "gpt-4o");
    assert_int_equal(ri.stream, 1);
    assert_int_equal(ri.max_output_tokens, 50);   /* max_completion_tokens */
    /* "Be brief." and "Describe this" */
    assert_int_equal(ri.input_bytes, 9 + 13);
    assert_int_equal(ri.input_tokens_estimate, 6); /* ceil(22 / 4) */

    const char *s = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                    "\"content\":\"abcd\"}],\"max_tokens\":7,\"stream\":null}";
    assert_int_equal(qg__request_fields(s, strlen(s), QG_SHAPE_OPENAI, &ri), 0);
    assert_int_equal(ri.max_output_tokens, 7);
    assert_int_equal(ri.stream, 0);
    assert_int_equal(ri.input_tokens_estimate, 1);
    s = "{\"model\":\"m\",\"messages\":[]}";
    assert_int_equal(qg__request_fields(s, strlen(s), QG_SHAPE_OPENAI, &ri), 0);
    assert_int_equal(ri.max_output_tokens, -1);
    assert_int_equal(ri.input_bytes, 0);
    /* the same body is not a valid Anthropic request: max_tokens required */
    assert_int_equal(qg__request_fields(s, strlen(s), QG_SHAPE_ANTHROPIC, &ri),
                     QG_EINVAL);

    assert_int_equal(qg__request_fields(AN_REQ, strlen(AN_REQ),
                                       QG_SHAPE_ANTHROPIC, &ri), 0);
    assert_string_equal(ri.model, "claude-sonnet-4-5");
    assert_int_equal(ri.stream, 1);
    assert_int_equal(ri.max_output_tokens, 1024);
    /* "Hello, Claude" 13 + "42" 2 + "ok" 2 + system "You are terse." 14 */
    assert_int_equal(ri.input_bytes, 31);
    assert_int_equal(ri.input_tokens_estimate, 8);

    const char *bad[] = {
        "", "[]", "{\"messages\":[]}", "{\"model\":3}",
        "{\"model\":\"m\",\"stream\":\"yes\"}",
        "{\"model\":\"m\",\"max_tokens\":-1}",
        "{\"model\":\"m\",\"max_completion_tokens\":1.5}",
        "{\"model\":\"m\",\"messages\":{}}",
        "{\"model\":\"m\",\"model\":\"n\"}",          /* duplicate keys */
        "{\"model\":\"a\\u0000b\"}",
        /* stream_options neither an object nor null: the rewrite could
         * not add include_usage (found by fuzz_reqscan: admitted, then a
         * downgrade answered 500) */
        "{\"model\":\"m\",\"stream\":true,\"stream_options\":50}",
        "{\"model\":\"m\",\"stream_options\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(qg__request_fields(bad[i], strlen(bad[i]),
                                           QG_SHAPE_OPENAI, &ri), QG_EINVAL);
        assert_string_equal(ri.model, "");
    }
    /* not a member of the Anthropic shape: ignored there */
    s = "{\"model\":\"m\",\"max_tokens\":1,\"stream_options\":50}";
    assert_int_equal(qg__request_fields(s, strlen(s), QG_SHAPE_ANTHROPIC, &ri),
                     0);
    char big[400];
    int n = snprintf(big, sizeof big, "{\"model\":\"%0300d\"}", 0);
    assert_int_equal(qg__request_fields(big, (size_t)n, QG_SHAPE_OPENAI, &ri),
                     QG_EINVAL);
    assert_int_equal(qg__request_fields(OA_REQ, strlen(OA_REQ), 0, &ri),
                     QG_EINVAL);
}

/* Parse a rewrite's output back and compare it with `expect`. */
static void assert_json_equal(const char *got, size_t len, const char *expect)
{
    json_error_t je;
    json_t *a = json_loadb(got, len, 0, &je);
    json_t *b = json_loads(expect, 0, &je);
    assert_non_null(a);
    assert_non_null(b);
    if (!json_equal(a, b))
        fail_msg("got %.*s", (int)len, got);
    json_decref(a);
    json_decref(b);
}

/* A stream without stream_options gets the member added to its own text
 * (qg__request_add_include_usage): the result is the same JSON object as
 * the body plus stream_options.include_usage = true, the body's bytes
 * follow the member unchanged, and the fields admission reads are the
 * same. */
static void test_add_include_usage(void **state)
{
    static const char *const bodies[] = {
        OA_REQ,
        " \r\n\t{ \"stream\" : true ,\"model\":\"m\",\"messages\":"
        "[{\"role\":\"user\",\"content\":\"h\\u00e9 \\\"x\\\"\"}],"
        "\"max_tokens\":12, \"temperature\":1.0000000000000002e0}",
        "{\"messages\":[],\"model\":\"m\",\"stream\":true,\"n\":{\"a\":[{}]}}",
    };
    static const char member[] = "\"stream_options\":{\"include_usage\":true},";
    (void)state;
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        const char *b = bodies[i];
        qg_request_info before, after;
        json_error_t je;
        json_t *orig, *got;
        char *out;
        size_t outlen, k = strcspn(b, "{") + 1;
        assert_int_equal(qg__request_fields(b, strlen(b), QG_SHAPE_OPENAI,
                                            &before), 0);
        assert_int_equal(before.stream, 1);
        assert_int_equal(before.stream_options, 0);
        assert_int_equal(qg__request_add_include_usage(b, strlen(b), &out,
                                                       &outlen), 0);
        assert_int_equal(outlen, strlen(out));
        assert_int_equal(outlen, strlen(b) + strlen(member));
        assert_memory_equal(out, b, k);
        assert_memory_equal(out + k, member, strlen(member));
        assert_string_equal(out + k + strlen(member), b + k);
        assert_non_null(orig = json_loads(b, 0, &je));
        assert_non_null(got = json_loads(out, JSON_REJECT_DUPLICATES, &je));
        assert_true(json_is_true(json_object_get(
            json_object_get(got, "stream_options"), "include_usage")));
        assert_int_equal(json_object_size(json_object_get(got,
                                                          "stream_options")),
                         1);
        assert_int_equal(json_object_del(got, "stream_options"), 0);
        assert_true(json_equal(got, orig));
        assert_int_equal(qg__request_fields(out, outlen, QG_SHAPE_OPENAI,
                                            &after), 0);
        assert_int_equal(after.stream_options, 1);
        assert_string_equal(after.model, before.model);
        assert_int_equal(after.stream, before.stream);
        assert_int_equal(after.max_output_tokens, before.max_output_tokens);
        assert_int_equal(after.input_bytes, before.input_bytes);
        json_decref(orig);
        json_decref(got);
        free(out);
    }
    {
        /* a body that has stream_options is told apart (the proxy takes
         * the jansson rewrite for it) */
        const char *s = "{\"model\":\"m\",\"messages\":[],\"stream\":true,"
                        "\"stream_options\":null}";
        qg_request_info ri;
        assert_int_equal(qg__request_fields(s, strlen(s), QG_SHAPE_OPENAI,
                                            &ri), 0);
        assert_int_equal(ri.stream_options, 1);
    }
    {
        char *out = (char *)1;
        size_t outlen = 1;
        assert_int_equal(qg__request_add_include_usage("[1]", 3, &out,
                                                       &outlen), QG_EINVAL);
        assert_null(out);
        assert_int_equal(outlen, 0);
        assert_int_equal(qg__request_add_include_usage("  ", 2, &out,
                                                       &outlen), QG_EINVAL);
    }
}

static void test_rewrite(void **state)
{
    (void)state;
    char *out;
    size_t outlen;
    int added = -1;

    /* streaming without stream_options: added, everything else in order */
    const char *s = "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\","
                    "\"content\":\"hi\"}],\"stream\":true}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, NULL), 0);
    assert_int_equal(added, 1);
    assert_string_equal(out, "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":"
                        "\"user\",\"content\":\"hi\"}],\"stream\":true,"
                        "\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(outlen, strlen(out));
    free(out);

    /* the full request: every field kept, reals exactly */
    assert_int_equal(qg__request_rewrite_openai(OA_REQ, strlen(OA_REQ), &out,
                                               &outlen, &added, NULL), 0);
    assert_int_equal(added, 1);
    json_error_t je;
    json_t *want = json_loads(OA_REQ, 0, &je);
    assert_non_null(want);
    json_object_set_new(want, "stream_options",
                        json_pack("{s:b}", "include_usage", 1));
    char *wants = json_dumps(want, JSON_COMPACT);
    assert_json_equal(out, outlen, wants);
    free(wants);
    json_decref(want);
    json_t *o = json_loads(out, 0, &je);
    assert_true(json_real_value(json_object_get(o, "temperature")) == 0.7);
    json_decref(o);
    free(out);

    /* include_usage false: set true, other stream_options keys kept */
    s = "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\""
        ":false,\"include_obfuscation\":false}}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, NULL), 0);
    assert_int_equal(added, 1);
    assert_string_equal(out, "{\"model\":\"m\",\"stream\":true,"
                        "\"stream_options\":{\"include_usage\":true,"
                        "\"include_obfuscation\":false}}");
    free(out);

    /* already asked for: unchanged, not added */
    s = "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\""
        ":true}}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, NULL), 0);
    assert_int_equal(added, 0);
    assert_string_equal(out, s);
    free(out);

    /* stream_options null counts as absent */
    s = "{\"model\":\"m\",\"stream_options\":null,\"stream\":true}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, NULL), 0);
    assert_int_equal(added, 1);
    assert_string_equal(out, "{\"model\":\"m\",\"stream_options\":{"
                        "\"include_usage\":true},\"stream\":true}");
    free(out);

    /* not streaming: nothing added, even with no stream_options */
    s = "{\"model\":\"m\",\"stream\":false,\"n\":2}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, NULL), 0);
    assert_int_equal(added, 0);
    assert_string_equal(out, s);
    free(out);

    /* downgrade: the model replaced in place */
    s = "{\"model\":\"gpt-4o\",\"messages\":[],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, "gpt-4o-mini"), 0);
    assert_int_equal(added, 0);
    assert_string_equal(out, "{\"model\":\"gpt-4o-mini\",\"messages\":[],"
                        "\"stream\":true,\"stream_options\":{"
                        "\"include_usage\":true}}");
    free(out);

    /* the shape-agnostic replacement (Anthropic downgrade) */
    assert_int_equal(qg__request_replace_model(AN_REQ, strlen(AN_REQ),
                                              "claude-haiku-4-5", &out,
                                              &outlen), 0);
    qg_request_info ri;
    assert_int_equal(qg__request_fields(out, outlen, QG_SHAPE_ANTHROPIC, &ri),
                     0);
    assert_string_equal(ri.model, "claude-haiku-4-5");
    assert_int_equal(ri.input_bytes, 31);
    free(out);

    /* refusals */
    const char *bad[] = {"", "[1]", "{\"stream\":1}",
                         "{\"stream\":true,\"stream_options\":true}",
                         "{\"a\":1,\"a\":2}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = (char *)"sentinel";
        assert_int_equal(qg__request_rewrite_openai(bad[i], strlen(bad[i]),
                                                   &out, &outlen, &added,
                                                   NULL), QG_EINVAL);
        assert_null(out);
        assert_int_equal(added, 0);
    }
    s = "{\"model\":\"m\"}";
    assert_int_equal(qg__request_rewrite_openai(s, strlen(s), &out, &outlen,
                                               &added, "bad\xff"), QG_EINVAL);
    assert_null(out);
    assert_int_equal(qg__request_replace_model(s, strlen(s), NULL, &out,
                                              &outlen), QG_EINVAL);
}

/* ------------------------------------------------------ malformed */

/* Every strict prefix of every sample is refused by every reader, and the
 * streams cut short never crash and never report an end they did not see. */
static void test_truncated_prefixes(void **state)
{
    (void)state;
    const char *bodies[] = {OA_BODY, OA_RESPONSES_BODY, OA_ERROR_BODY, AN_BODY,
                            AN_ERROR_BODY, OA_REQ, AN_REQ};
    qg_usage_counts u;
    qg_request_info ri;
    char *out;
    size_t outlen;
    int added;
    for (size_t b = 0; b < sizeof bodies / sizeof bodies[0]; b++) {
        size_t n = strlen(bodies[b]);
        for (size_t k = 0; k < n; k++) {
            /* a heap copy of exactly k bytes, so ASan sees any overread */
            char *p = malloc(k ? k : 1);
            assert_non_null(p);
            memcpy(p, bodies[b], k);
            assert_int_equal(qg__usage_openai_json(p, k, &u), -1);
            assert_int_equal(qg__usage_anthropic_json(p, k, &u), -1);
            memset(&u, 0, sizeof u);
            assert_int_equal(qg__usage_openai_chunk(p, k, &u, &added), -1);
            assert_int_equal(qg__usage_anthropic_event("message_start", 13, p,
                                                      k, &u), -1);
            assert_int_equal(qg__request_fields(p, k, QG_SHAPE_OPENAI, &ri),
                             QG_EINVAL);
            assert_int_equal(qg__request_fields(p, k, QG_SHAPE_ANTHROPIC, &ri),
                             QG_EINVAL);
            assert_int_equal(qg__request_rewrite_openai(p, k, &out, &outlen,
                                                       &added, "x"),
                             QG_EINVAL);
            assert_int_equal(qg__request_replace_model(p, k, "x", &out,
                                                      &outlen), QG_EINVAL);
            free(p);
        }
    }
    /* streams cut short: whatever arrived is read, the end is not invented */
    size_t n = strlen(OA_STREAM);
    for (size_t k = 0; k < n; k++) {
        oa_run r;
        int rc = run_oa(OA_STREAM, k, k / 2, &r);
        assert_true(rc == 0 || rc == 1);
        assert_int_equal(r.done, 0);
        assert_int_equal(r.malformed, 0);  /* SSE never dispatches a part */
    }
    n = strlen(AN_STREAM);
    for (size_t k = 0; k < n; k++) {
        an_run r;
        int rc = run_an(AN_STREAM, k, k / 3, &r);
        assert_true(rc == 0 || rc == 1);
        assert_int_equal(r.stop, 0);
        assert_int_equal(r.malformed, 0);
        assert_true(r.u.output_tokens <= 40);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_body),
        cmocka_unit_test(test_openai_stream),
        cmocka_unit_test(test_openai_stream_no_usage),
        cmocka_unit_test(test_openai_chunk_cases),
        cmocka_unit_test(test_anthropic_body),
        cmocka_unit_test(test_anthropic_stream),
        cmocka_unit_test(test_anthropic_error_event),
        cmocka_unit_test(test_response_edges),
        cmocka_unit_test(test_response_depth),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_add_include_usage),
        cmocka_unit_test(test_rewrite),
        cmocka_unit_test(test_truncated_prefixes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
