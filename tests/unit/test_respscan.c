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

/* ------------------------------------------- the reference (jansson) */

static int64_t str_len(json_t *v)
{
    return json_is_string(v) ? (int64_t)json_string_length(v) : 0;
}

static int64_t tool_call_bytes(json_t *calls)
{
    size_t i;
    json_t *c;
    int64_t n = 0;
    json_array_foreach(calls, i, c)
        n += str_len(json_object_get(json_object_get(c, "function"),
                                     "arguments"));
    return n;
}

static int64_t ref_cb_openai(json_t *j)
{
    json_t *ch;
    size_t i;
    int64_t n = 0;
    json_array_foreach(json_object_get(j, "choices"), i, ch) {
        json_t *d = json_object_get(ch, "delta");
        n += str_len(json_object_get(d, "content"));
        n += tool_call_bytes(json_object_get(d, "tool_calls"));
    }
    return n;
}

static int64_t ref_cb_anthropic(json_t *j)
{
    json_t *d = json_object_get(j, "delta");
    if (!json_is_object(d))
        return 0;
    return str_len(json_object_get(d, "text")) +
           str_len(json_object_get(d, "partial_json")) +
           str_len(json_object_get(d, "thinking"));
}


static json_t *load(const char *s, size_t len, size_t flags)
{
    json_error_t je;
    if (!s)
        return NULL;
    return json_loadb(s, len, flags | JSON_ALLOW_NUL, &je);
}

/* Copy an error object's "type" (else "code", else "error") into dst. */
static void copy_error(char dst[64], const json_t *err)
{
    const char *t = json_string_value(json_object_get(err, "type"));
    if (!t || !*t)
        t = json_string_value(json_object_get(err, "code"));
    if (!t || !*t)
        t = "error";
    size_t n = strlen(t);
    if (n > 63)
        n = 63;
    memcpy(dst, t, n);
    dst[n] = '\0';
}

/* Anthropic input: input_tokens plus both cache counts.  1 when
 * input_tokens is present, 0 when absent, -1 on a bad value or overflow. */
static int anthropic_input(const json_t *usage, int64_t *in)
{
    int64_t base = 0, cc = 0, cr = 0;
    int rc = tst_jref_count(usage, "input_tokens", &base);
    if (rc <= 0)
        return rc;
    if (tst_jref_count(usage, "cache_creation_input_tokens", &cc) < 0 ||
        tst_jref_count(usage, "cache_read_input_tokens", &cr) < 0)
        return -1;
    if (__builtin_add_overflow(base, cc, in) ||
        __builtin_add_overflow(*in, cr, in))
        return -1;
    return 1;
}

/* ------------------------------------------------------------ responses */

static int ref_openai_json(const char *body, size_t len, qg_usage_counts *out)
{
    int rc = -1;
    memset(out, 0, sizeof *out);
    json_t *root = load(body, len, 0);
    if (!json_is_object(root))
        goto done;
    json_t *usage = json_object_get(root, "usage");
    if (!usage || json_is_null(usage)) {
        json_t *err = json_object_get(root, "error");
        if (json_is_object(err))
            copy_error(out->error, err);
        rc = 0;
        goto done;
    }
    if (!json_is_object(usage))
        goto done;
    int hi = tst_jref_count2(usage, "prompt_tokens", "input_tokens",
                        &out->input_tokens);
    int ho = tst_jref_count2(usage, "completion_tokens", "output_tokens",
                        &out->output_tokens);
    if (hi < 0 || ho < 0) {
        memset(out, 0, sizeof *out);
        goto done;
    }
    out->have_input = hi;
    out->have_output = ho;
    rc = hi || ho;
done:
    json_decref(root);
    return rc;
}

static int ref_openai_chunk_bytes(const char *data, size_t len,
                                qg_usage_counts *out, int *is_usage_only,
                                int64_t *content_bytes)
{
    int rc = -1;
    json_t *root = NULL;
    if (is_usage_only)
        *is_usage_only = 0;
    if (content_bytes)
        *content_bytes = 0;
    while (len && (data[0] == ' ' || data[0] == '\t' || data[0] == '\n' ||
                   data[0] == '\r')) {
        data++;
        len--;
    }
    while (len && (data[len - 1] == ' ' || data[len - 1] == '\t' ||
                   data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0)
        return 2;
    root = load(data, len, 0);
    if (!json_is_object(root))
        goto done;
    if (content_bytes)
        *content_bytes = ref_cb_openai(root);
    json_t *err = json_object_get(root, "error");
    if (json_is_object(err)) {
        copy_error(out->error, err);
        rc = -2;
        goto done;
    }
    json_t *usage = json_object_get(root, "usage");
    if (!usage || json_is_null(usage)) {
        rc = 0;
        goto done;
    }
    if (!json_is_object(usage))
        goto done;
    int64_t in = 0, outt = 0;
    int hi = tst_jref_count2(usage, "prompt_tokens", "input_tokens", &in);
    int ho = tst_jref_count2(usage, "completion_tokens", "output_tokens", &outt);
    if (hi < 0 || ho < 0)
        goto done;
    if (hi) {
        out->input_tokens = in;
        out->have_input = 1;
    }
    if (ho) {
        out->output_tokens = outt;
        out->have_output = 1;
    }
    json_t *choices = json_object_get(root, "choices");
    if (is_usage_only)
        *is_usage_only =
            json_is_array(choices) && json_array_size(choices) == 0;
    rc = 1;
done:
    json_decref(root);
    return rc;
}

static int ref_anthropic_json(const char *body, size_t len,
                            qg_usage_counts *out)
{
    int rc = -1;
    memset(out, 0, sizeof *out);
    json_t *root = load(body, len, 0);
    if (!json_is_object(root))
        goto done;
    const char *type = json_string_value(json_object_get(root, "type"));
    if (type && strcmp(type, "error") == 0) {
        copy_error(out->error, json_object_get(root, "error"));
        rc = 0;
        goto done;
    }
    json_t *usage = json_object_get(root, "usage");
    if (!usage || json_is_null(usage)) {
        rc = 0;
        goto done;
    }
    if (!json_is_object(usage))
        goto done;
    int hi = anthropic_input(usage, &out->input_tokens);
    int ho = tst_jref_count(usage, "output_tokens", &out->output_tokens);
    if (hi < 0 || ho < 0) {
        memset(out, 0, sizeof *out);
        goto done;
    }
    out->have_input = hi;
    out->have_output = ho;
    rc = hi || ho;
done:
    json_decref(root);
    return rc;
}

/* Read one Anthropic usage object into acc.  Its counts are totals so
 * far (message_delta's are cumulative), so they replace acc's.  Returns
 * 1 when a count was present, 0 when none, -1 when malformed. */
static int anthropic_usage_into(const json_t *usage, qg_usage_counts *acc)
{
    int64_t in = 0, outt = 0;
    if (!usage || json_is_null(usage))
        return 0;
    if (!json_is_object(usage))
        return -1;
    int hi = anthropic_input(usage, &in);
    int ho = tst_jref_count(usage, "output_tokens", &outt);
    if (hi < 0 || ho < 0)
        return -1;
    if (hi) {
        acc->input_tokens = in;
        acc->have_input = 1;
    }
    if (ho) {   /* cumulative: the last value wins, never a sum */
        acc->output_tokens = outt;
        acc->have_output = 1;
    }
    return hi || ho;
}

static int ref_anthropic_event_bytes(const char *event, size_t elen,
                                   const char *data, size_t dlen,
                                   qg_usage_counts *acc,
                                   int64_t *content_bytes)
{
    int rc = -1;
    char name[32];
    json_t *root = load(data, dlen, 0);
    if (content_bytes)
        *content_bytes = 0;
    if (!json_is_object(root))
        goto done;
    if (content_bytes)
        *content_bytes = ref_cb_anthropic(root);
    /* the payload's "type" is authoritative; the SSE type is the fallback */
    const char *t = json_string_value(json_object_get(root, "type"));
    if (!t) {
        size_t n = event && elen < sizeof name ? elen : 0;
        if (n)
            memcpy(name, event, n);
        name[n] = '\0';
        t = name;
    }
    if (strcmp(t, "message_start") == 0) {
        json_t *msg = json_object_get(root, "message");
        if (msg && !json_is_object(msg))
            goto done;
        rc = anthropic_usage_into(json_object_get(msg, "usage"), acc);
    } else if (strcmp(t, "message_delta") == 0) {
        rc = anthropic_usage_into(json_object_get(root, "usage"), acc);
    } else if (strcmp(t, "message_stop") == 0) {
        rc = 2;
    } else if (strcmp(t, "error") == 0) {
        copy_error(acc->error, json_object_get(root, "error"));
        rc = -2;
    } else {
        rc = 0;
    }
done:
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------ comparisons */

static void show(const char *what, const char *s, size_t n)
{
    fprintf(stderr, "%s differs on %zu bytes: \"", what, n);
    for (size_t i = 0; i < n && i < 400; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\')
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\"\n");
}

static int same_counts(const qg_usage_counts *a, const qg_usage_counts *b)
{
    return a->input_tokens == b->input_tokens &&
           a->output_tokens == b->output_tokens &&
           a->have_input == b->have_input &&
           a->have_output == b->have_output &&
           strcmp(a->error, b->error) == 0;
}

/* Counts from an earlier event, so that "left unchanged" shows. */
static void earlier(qg_usage_counts *u)
{
    memset(u, 0, sizeof *u);
    u->input_tokens = 7;
    u->output_tokens = 8;
    u->have_input = u->have_output = 1;
    strcpy(u->error, "before");
}

static int64_t ref_bytes(const char *s, size_t n, int anthropic)
{
    json_t *j = load(s, n, 0);
    int64_t b = j ? (anthropic ? ref_cb_anthropic(j) : ref_cb_openai(j)) : 0;
    json_decref(j);
    return b;
}

static const char *const EVENTS[] = {
    NULL, "message_start", "message_delta", "message_stop", "error", "ping",
};

/* Every reader on s[0..n): 1 when all agree with the reference. */
static int agree(const char *s, size_t n)
{
    qg_usage_counts a, b;
    int ra, rb, oa = 9, ob = 9;
    int64_t ca = -5, cb = -5;

    ra = qg_usage_openai_json(s, n, &a);
    rb = ref_openai_json(s, n, &b);
    if (ra != rb || !same_counts(&a, &b)) {
        show("qg_usage_openai_json", s, n);
        return 0;
    }
    ra = qg_usage_anthropic_json(s, n, &a);
    rb = ref_anthropic_json(s, n, &b);
    if (ra != rb || !same_counts(&a, &b)) {
        show("qg_usage_anthropic_json", s, n);
        return 0;
    }
    earlier(&a);
    earlier(&b);
    ra = qg_usage_openai_chunk_bytes(s, n, &a, &oa, &ca);
    rb = ref_openai_chunk_bytes(s, n, &b, &ob, &cb);
    if (ra != rb || oa != ob || ca != cb || !same_counts(&a, &b)) {
        show("qg_usage_openai_chunk_bytes", s, n);
        return 0;
    }
    for (size_t e = 0; e < sizeof EVENTS / sizeof EVENTS[0]; e++) {
        const char *ev = EVENTS[e];
        size_t elen = ev ? strlen(ev) : 0;
        earlier(&a);
        earlier(&b);
        ra = qg_usage_anthropic_event_bytes(ev, elen, s, n, &a, &ca);
        rb = ref_anthropic_event_bytes(ev, elen, s, n, &b, &cb);
        if (ra != rb || ca != cb || !same_counts(&a, &b)) {
            show(ev ? ev : "qg_usage_anthropic_event_bytes", s, n);
            return 0;
        }
    }
    if (qg_content_bytes_openai_chunk(s, n) != ref_bytes(s, n, 0) ||
        qg_content_bytes_anthropic_event(s, n) != ref_bytes(s, n, 1)) {
        show("qg_content_bytes_*", s, n);
        return 0;
    }
    return 1;
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
        assert_int_equal(qg_usage_openai_json(s, n, &u), k < 2048 ? 1 : -1);
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
        assert_int_equal(qg_content_bytes_openai_chunk(s, n),
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
