/* fuzz_reqscan.c - the request JSON scanner (reqscan.c, one yajl pass
 * under qg__request_fields) differentially against the jansson reader it
 * replaced (tests/support/reqref.c): for both API shapes the same return
 * and, when accepted, the same model, stream flag, output cap and input
 * size; a disagreement aborts.
 *
 * Then the proxy's rewrites (usage.c, jansson) of an accepted body: the
 * proxy runs them only on a body qg__request_fields accepted and treats a
 * failure as out of memory, so they must succeed, and their output read
 * back must give the same fields (with the new model when one was set,
 * and stream_options.include_usage true when the rewrite says it added
 * it). */
#include <string.h>

#include <jansson.h>

#include "fuzz.h"
#include "jref.h"
#include "quotagate.h"
#include "usage.h"

static const char NEW_MODEL[] = "fuzz-downgraded";

static void same_fields(const qg_request_info *a, const qg_request_info *b,
                        const char *model, const uint8_t *data, size_t size)
{
    if (strcmp(b->model, model ? model : a->model) != 0 ||
        a->stream != b->stream || a->max_output_tokens != b->max_output_tokens ||
        a->input_bytes != b->input_bytes ||
        a->input_tokens_estimate != b->input_tokens_estimate)
        fuzz_fail("a rewritten body reads differently", data, size);
}

/* Read back a rewrite's output (shape, expected model). */
static void check_rewrite(int rc, char *out, size_t outlen, int shape,
                          const qg_request_info *in, const char *model,
                          const uint8_t *data, size_t size)
{
    qg_request_info back;
    if (rc == QG_ENOMEM)
        return;
    if (rc != QG_OK || !out)
        fuzz_fail("an accepted body could not be rewritten", data, size);
    if (out[outlen] != '\0')
        fuzz_fail("a rewrite's output is not NUL-terminated", data, size);
    if (qg__request_fields(out, outlen, shape, &back) != QG_OK)
        fuzz_fail("a rewritten body is refused", data, size);
    same_fields(in, &back, model, data, size);
    free(out);
}

static void check_openai_rewrite(const char *s, size_t n,
                                 const qg_request_info *in,
                                 const char *model, const uint8_t *data,
                                 size_t size)
{
    char *out = NULL;
    size_t outlen = 0;
    int added = -1;
    int rc = qg__request_rewrite_openai(s, n, &out, &outlen, &added, model);
    if (rc == QG_OK) {
        json_error_t je;
        json_t *j = json_loadb(out, outlen, JSON_ALLOW_NUL, &je), *so;
        so = json_object_get(j, "stream_options");
        if (added != 0 && added != 1)
            fuzz_fail("added_include_usage not set", data, size);
        if (added && !in->stream)
            fuzz_fail("include_usage added to a request without stream",
                      data, size);
        if (in->stream &&
            !json_is_true(json_object_get(so, "include_usage")))
            fuzz_fail("a stream request without include_usage after the "
                      "rewrite", data, size);
        json_decref(j);
    }
    check_rewrite(rc, out, outlen, QG_SHAPE_OPENAI, in, model, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    qg_request_info info;
    if (!tst_req_agree(s, size))
        fuzz_fail("reqscan differs from the jansson reference", data, size);
    for (int shape = QG_SHAPE_OPENAI; shape <= QG_SHAPE_ANTHROPIC; shape++) {
        char *out = NULL;
        size_t outlen = 0;
        if (qg__request_fields(s, size, shape, &info) != QG_OK)
            continue;
        if (shape == QG_SHAPE_OPENAI) {
            check_openai_rewrite(s, size, &info, NULL, data, size);
            check_openai_rewrite(s, size, &info, NEW_MODEL, data, size);
        }
        int rc = qg__request_replace_model(s, size, NEW_MODEL, &out, &outlen);
        check_rewrite(rc, out, outlen, shape, &info, NEW_MODEL, data, size);
    }
    return 0;
}
