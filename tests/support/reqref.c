/* reqref.c - the jansson request reader that reqscan.c's one yajl pass
 * replaced (qg__request_fields), kept as the reference of test_reqscan.c
 * and of the fuzz harness fuzz_reqscan.c (declared in jref.h).  It
 * parses with JSON_REJECT_DUPLICATES and JSON_ALLOW_NUL, and refuses a
 * NUL byte outside strings (tst_jref_load). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "quotagate.h"
#include "usage.h"
#include "jref.h"


static int64_t content_bytes(const json_t *c, int depth)
{
    int64_t n = 0;
    size_t i;
    json_t *part;
    if (json_is_string(c))
        return (int64_t)json_string_length(c);
    if (!json_is_array(c))
        return 0;
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        if (json_is_string(text))
            n += (int64_t)json_string_length(text);
        else if (depth == 0)
            n += content_bytes(json_object_get(part, "content"), 1);
    }
    return n;
}

int tst_ref_request_fields(const char *body, size_t len, int shape,
                           qg_request_info *out)
{
    int rc = QG_EINVAL;
    memset(out, 0, sizeof *out);
    out->max_output_tokens = -1;
    json_t *root = tst_jref_load(body, len, JSON_REJECT_DUPLICATES |
                                            JSON_ALLOW_NUL);
    if (!json_is_object(root) ||
        (shape != QG_SHAPE_OPENAI && shape != QG_SHAPE_ANTHROPIC))
        goto done;
    json_t *model = json_object_get(root, "model");
    size_t mlen = json_string_length(model);
    if (!json_is_string(model) || mlen >= sizeof out->model ||
        strlen(json_string_value(model)) != mlen)
        goto done;
    memcpy(out->model, json_string_value(model), mlen + 1);
    json_t *stream = json_object_get(root, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        goto done;
    out->stream = json_is_true(stream);
    json_t *so = json_object_get(root, "stream_options");
    if (shape == QG_SHAPE_OPENAI && so && !json_is_object(so) &&
        !json_is_null(so))
        goto done;
    int have;
    if (shape == QG_SHAPE_OPENAI)
        have = tst_jref_count2(root, "max_completion_tokens", "max_tokens",
                          &out->max_output_tokens);
    else
        have = tst_jref_count(root, "max_tokens", &out->max_output_tokens);
    if (have < 0 || (have == 0 && shape == QG_SHAPE_ANTHROPIC))
        goto done;
    if (have == 0)
        out->max_output_tokens = -1;
    json_t *msgs = json_object_get(root, "messages"), *m;
    size_t i;
    if (msgs && !json_is_array(msgs) && !json_is_null(msgs))
        goto done;
    json_array_foreach(msgs, i, m)
        out->input_bytes += content_bytes(json_object_get(m, "content"), 0);
    out->input_bytes += content_bytes(json_object_get(root, "system"), 0);
    out->input_tokens_estimate = (out->input_bytes + 3) / 4;
    rc = 0;
done:
    json_decref(root);
    if (rc)
        out->model[0] = '\0';
    return rc;
}

/* ------------------------------------------------------ comparisons */

static void show(int shape, const char *s, size_t n, int ra, int rb)
{
    fprintf(stderr, "shape %d: %d vs reference %d on %zu bytes: \"", shape,
            ra, rb, n);
    for (size_t i = 0; i < n && i < 400; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\')
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\"\n");
}

int tst_req_agree(const char *s, size_t n)
{
    for (int shape = 0; shape <= QG_SHAPE_ANTHROPIC; shape++) {
        qg_request_info a, b;
        /* a heap copy of exactly n bytes, so ASan sees any overread */
        char *p = s ? malloc(n ? n : 1) : NULL;
        if (s && !p)
            abort();
        if (n)
            memcpy(p, s, n);
        memset(&a, 0x5A, sizeof a);
        int ra = qg__request_fields(p, n, shape, &a);
        int rb = tst_ref_request_fields(p, n, shape, &b);
        free(p);
        int same = ra == rb &&
                   (ra != 0 ? a.model[0] == '\0'
                    : strcmp(a.model, b.model) == 0 &&
                      a.stream == b.stream &&
                      a.max_output_tokens == b.max_output_tokens &&
                      a.input_bytes == b.input_bytes &&
                      a.input_tokens_estimate == b.input_tokens_estimate);
        if (!same) {
            show(shape, s, n, ra, rb);
            return 0;
        }
    }
    return 1;
}
