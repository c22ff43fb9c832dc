/* respref.c - the jansson response readers that respscan.c's one yajl
 * pass replaced, kept as the reference of test_respscan.c and of the
 * fuzz harnesses fuzz_respscan.c and fuzz_sse.c (declared in jref.h).
 * The reference parses with JSON_ALLOW_NUL, as the proxy's readers did,
 * and refuses a NUL byte outside strings (tst_jref_load). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proxy.h"
#include "usage.h"
#include "jref.h"


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
    return tst_jref_load(s, len, flags | JSON_ALLOW_NUL);
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

int tst_ref_openai_chunk_bytes(const char *data, size_t len,
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

int tst_ref_anthropic_event_bytes(const char *event, size_t elen,
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

void tst_show(const char *what, const char *s, size_t n)
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

int tst_same_counts(const qg_usage_counts *a, const qg_usage_counts *b)
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

int tst_resp_agree(const char *s, size_t n)
{
    qg_usage_counts a, b;
    int ra, rb, oa = 9, ob = 9;
    int64_t ca = -5, cb = -5;

    ra = qg__usage_openai_json(s, n, &a);
    rb = ref_openai_json(s, n, &b);
    if (ra != rb || !tst_same_counts(&a, &b)) {
        tst_show("qg__usage_openai_json", s, n);
        return 0;
    }
    ra = qg__usage_anthropic_json(s, n, &a);
    rb = ref_anthropic_json(s, n, &b);
    if (ra != rb || !tst_same_counts(&a, &b)) {
        tst_show("qg__usage_anthropic_json", s, n);
        return 0;
    }
    earlier(&a);
    earlier(&b);
    ra = qg__usage_openai_chunk_bytes(s, n, &a, &oa, &ca);
    rb = tst_ref_openai_chunk_bytes(s, n, &b, &ob, &cb);
    if (ra != rb || oa != ob || ca != cb || !tst_same_counts(&a, &b)) {
        tst_show("qg__usage_openai_chunk_bytes", s, n);
        return 0;
    }
    for (size_t e = 0; e < sizeof EVENTS / sizeof EVENTS[0]; e++) {
        const char *ev = EVENTS[e];
        size_t elen = ev ? strlen(ev) : 0;
        earlier(&a);
        earlier(&b);
        ra = qg__usage_anthropic_event_bytes(ev, elen, s, n, &a, &ca);
        rb = tst_ref_anthropic_event_bytes(ev, elen, s, n, &b, &cb);
        if (ra != rb || ca != cb || !tst_same_counts(&a, &b)) {
            tst_show(ev ? ev : "qg__usage_anthropic_event_bytes", s, n);
            return 0;
        }
    }
    if (qg__content_bytes_openai_chunk(s, n) != ref_bytes(s, n, 0) ||
        qg__content_bytes_anthropic_event(s, n) != ref_bytes(s, n, 1)) {
        tst_show("qg_content_bytes_*", s, n);
        return 0;
    }
    return 1;
}
