/* usage.c - token usage out of response JSON, admission fields out of
 * request JSON, and the upstream rewrite of a request (see usage.h).
 *
 * Responses and the admission fields of requests are read in one
 * streaming pass with libyajl (respscan.c, reqscan.c), as the proxy reads
 * every body and every stream event and only needs a few values; the
 * rewrites of a request, which re-serialise it, use a jansson tree.
 * Everything is read from caller buffers; nothing here does I/O or keeps
 * state between calls, so each function can be unit-tested and fuzzed
 * alone.  Responses come from the trusted upstream and are read leniently
 * (unknown members ignored; a duplicate key: the last one wins).
 * Requests come from callers and are read strictly where metering
 * depends on them: a body with duplicate keys is refused, since the
 * gateway and the upstream might otherwise disagree on which "model" was
 * asked for and charge one model while serving another. */
#include <string.h>

#include <jansson.h>

#include "quotagate.h"
#include "reqscan.h"
#include "respscan.h"
#include "usage.h"

/* --------------------------------------------------------------- helpers */

static json_t *load(const char *s, size_t len, size_t flags)
{
    json_error_t je;
    if (!s)
        return NULL;
    return json_loadb(s, len, flags | JSON_ALLOW_NUL, &je);
}

/* ------------------------------------------------------------ responses */

/* The responses are read in one streaming pass (respscan.h), no tree. */

/* A count member of a scanned usage object: 1 and *v when present, 0
 * when absent or null, -1 when it is not a non-negative integer. */
static int count(const qg__usage *u, int which, int64_t *v)
{
    const qg__count *c = &u->c[which];
    if (c->state == 1)
        *v = c->v;
    return c->state;
}

/* The first of two alternative count members that is present. */
static int count2(const qg__usage *u, int w1, int w2, int64_t *v)
{
    int rc = count(u, w1, v);
    return rc ? rc : count(u, w2, v);
}

/* Copy the error object's "type" (else "code", else "error") into dst:
 * the scan kept each when a non-empty string, cut at 63 bytes. */
static void copy_error(char dst[64], const qg__resp *r)
{
    const char *t = r->error_type[0] ? r->error_type
                    : r->error_code[0] ? r->error_code : "error";
    size_t n = strlen(t);
    memcpy(dst, t, n + 1);
}

/* Anthropic input: input_tokens plus both cache counts.  1 when
 * input_tokens is present, 0 when absent, -1 on a bad value or overflow. */
static int anthropic_input(const qg__usage *u, int64_t *in)
{
    int64_t base = 0, cc = 0, cr = 0;
    int rc = count(u, QG__UC_INPUT, &base);
    if (rc <= 0)
        return rc;
    if (count(u, QG__UC_CACHE_CREATION, &cc) < 0 ||
        count(u, QG__UC_CACHE_READ, &cr) < 0)
        return -1;
    if (__builtin_add_overflow(base, cc, in) ||
        __builtin_add_overflow(*in, cr, in))
        return -1;
    return 1;
}

int qg__usage_openai_json(const char *body, size_t len, qg_usage_counts *out)
{
    qg__resp r;
    memset(out, 0, sizeof *out);
    if (qg__resp_scan(body, len, &r) != 0)
        return -1;
    if (r.usage.state == 0) {
        if (r.error)
            copy_error(out->error, &r);
        return 0;
    }
    if (r.usage.state < 0)
        return -1;
    int hi = count2(&r.usage, QG__UC_PROMPT, QG__UC_INPUT,
                    &out->input_tokens);
    int ho = count2(&r.usage, QG__UC_COMPLETION, QG__UC_OUTPUT,
                    &out->output_tokens);
    if (hi < 0 || ho < 0) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->have_input = hi;
    out->have_output = ho;
    return hi || ho;
}

int qg__usage_openai_chunk(const char *data, size_t len, qg_usage_counts *out,
                          int *is_usage_only)
{
    return qg__usage_openai_chunk_bytes(data, len, out, is_usage_only, NULL);
}

int qg__usage_openai_chunk_bytes(const char *data, size_t len,
                                qg_usage_counts *out, int *is_usage_only,
                                int64_t *content_bytes)
{
    qg__resp r;
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
    if (qg__resp_scan(data, len, &r) != 0)
        return -1;
    if (content_bytes)
        *content_bytes = r.openai_chunk_bytes;
    if (r.error) {
        copy_error(out->error, &r);
        return -2;
    }
    if (r.usage.state == 0)
        return 0;
    if (r.usage.state < 0)
        return -1;
    int64_t in = 0, outt = 0;
    int hi = count2(&r.usage, QG__UC_PROMPT, QG__UC_INPUT, &in);
    int ho = count2(&r.usage, QG__UC_COMPLETION, QG__UC_OUTPUT, &outt);
    if (hi < 0 || ho < 0)
        return -1;
    if (hi) {
        out->input_tokens = in;
        out->have_input = 1;
    }
    if (ho) {
        out->output_tokens = outt;
        out->have_output = 1;
    }
    if (is_usage_only)
        *is_usage_only = r.choices_array && r.choices_n == 0;
    return 1;
}

int qg__usage_anthropic_json(const char *body, size_t len,
                            qg_usage_counts *out)
{
    qg__resp r;
    memset(out, 0, sizeof *out);
    if (qg__resp_scan(body, len, &r) != 0)
        return -1;
    if (r.type == QG__T_ERROR) {
        copy_error(out->error, &r);
        return 0;
    }
    if (r.usage.state == 0)
        return 0;
    if (r.usage.state < 0)
        return -1;
    int hi = anthropic_input(&r.usage, &out->input_tokens);
    int ho = count(&r.usage, QG__UC_OUTPUT, &out->output_tokens);
    if (hi < 0 || ho < 0) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->have_input = hi;
    out->have_output = ho;
    return hi || ho;
}

/* Read one Anthropic usage object into acc.  Its counts are totals so
 * far (message_delta's are cumulative), so they replace acc's.  Returns
 * 1 when a count was present, 0 when none, -1 when malformed. */
static int anthropic_usage_into(const qg__usage *u, qg_usage_counts *acc)
{
    int64_t in = 0, outt = 0;
    if (u->state == 0)
        return 0;
    if (u->state < 0)
        return -1;
    int hi = anthropic_input(u, &in);
    int ho = count(u, QG__UC_OUTPUT, &outt);
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

int qg__usage_anthropic_event(const char *event, size_t elen, const char *data,
                             size_t dlen, qg_usage_counts *acc)
{
    return qg__usage_anthropic_event_bytes(event, elen, data, dlen, acc,
                                          NULL);
}

int qg__usage_anthropic_event_bytes(const char *event, size_t elen,
                                   const char *data, size_t dlen,
                                   qg_usage_counts *acc,
                                   int64_t *content_bytes)
{
    qg__resp r;
    int t;
    if (content_bytes)
        *content_bytes = 0;
    if (qg__resp_scan(data, dlen, &r) != 0)
        return -1;
    if (content_bytes)
        *content_bytes = r.anthropic_event_bytes;
    /* the payload's "type" is authoritative; the SSE type (when shorter
     * than 32 bytes) is the fallback */
    t = r.type != QG__T_NONE ? r.type
        : event && elen < 32 ? qg__resp_type(event, elen) : QG__T_OTHER;
    switch (t) {
    case QG__T_MESSAGE_START:
        if (r.message < 0)
            return -1;
        return anthropic_usage_into(&r.msg_usage, acc);
    case QG__T_MESSAGE_DELTA:
        return anthropic_usage_into(&r.usage, acc);
    case QG__T_MESSAGE_STOP:
        return 2;
    case QG__T_ERROR:
        copy_error(acc->error, &r);
        return -2;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------- requests */

/* Requests are read in one streaming pass too (reqscan.h), which refuses
 * duplicate keys as JSON_REJECT_DUPLICATES does; only the rewrites below
 * build a jansson tree. */

/* A scanned token cap: 1 and *v when present, 0 when absent or null, -1
 * when it is not a non-negative integer (jansson's json_is_integer). */
static int req_count(const qg__count *c, int64_t *v)
{
    if (c->state == 1)
        *v = c->v;
    return c->state;
}

int qg__request_fields(const char *body, size_t len, int shape,
                      qg_request_info *out)
{
    qg__req r;
    int have, sc;
    memset(out, 0, sizeof *out);
    out->max_output_tokens = -1;
    if (shape != QG_SHAPE_OPENAI && shape != QG_SHAPE_ANTHROPIC)
        return QG_EINVAL;
    if ((sc = qg__req_scan(body, len, &r)) != 0)
        return sc == -2 ? QG_ENOMEM : QG_EINVAL;
    if (r.model != 1 || r.model_len >= sizeof out->model || r.model_nul)
        return QG_EINVAL;
    if (r.stream >= 0 && r.stream != QG__V_BOOL && r.stream != QG__V_NULL)
        return QG_EINVAL;
    /* what qg__request_rewrite_openai needs to add include_usage */
    if (shape == QG_SHAPE_OPENAI && r.stream_options >= 0 &&
        r.stream_options != QG__V_MAP && r.stream_options != QG__V_NULL)
        return QG_EINVAL;
    if (r.messages < 0)
        return QG_EINVAL;
    if (shape == QG_SHAPE_OPENAI) {
        have = req_count(&r.max_completion_tokens, &out->max_output_tokens);
        if (have == 0)
            have = req_count(&r.max_tokens, &out->max_output_tokens);
    } else {
        have = req_count(&r.max_tokens, &out->max_output_tokens);
    }
    if (have < 0 || (have == 0 && shape == QG_SHAPE_ANTHROPIC)) {
        out->max_output_tokens = -1;
        return QG_EINVAL;
    }
    memcpy(out->model, r.model_s, r.model_len + 1);
    out->stream = r.stream_true;
    out->stream_options = r.stream_options >= 0;
    out->input_bytes = r.input_bytes;
    out->input_tokens_estimate = (out->input_bytes + 3) / 4;
    return 0;
}

/* Dump root compactly into a malloc'd text. */
static int dump(json_t *root, char **out, size_t *outlen)
{
    char *s = json_dumps(root, JSON_COMPACT);
    if (!s)
        return QG_ENOMEM;
    *out = s;
    *outlen = strlen(s);  /* NULs inside strings are escaped as \u0000 */
    return 0;
}

/* Set root's "model" to new_model: QG_EINVAL when it is not UTF-8. */
static int set_model(json_t *root, const char *new_model)
{
    json_t *m = json_string(new_model);
    if (!m)
        return QG_EINVAL;
    return json_object_set_new(root, "model", m) ? QG_ENOMEM : 0;
}

int qg__request_rewrite_openai(const char *body, size_t len, char **out,
                              size_t *outlen, int *added_include_usage,
                              const char *new_model)
{
    int rc = QG_EINVAL;
    *out = NULL;
    *outlen = 0;
    if (added_include_usage)
        *added_include_usage = 0;
    json_t *root = load(body, len, JSON_REJECT_DUPLICATES);
    if (!json_is_object(root))
        goto done;
    json_t *stream = json_object_get(root, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        goto done;
    if (json_is_true(stream)) {
        json_t *so = json_object_get(root, "stream_options");
        int added = 0;
        if (!so || json_is_null(so)) {
            so = json_pack("{s:b}", "include_usage", 1);
            if (!so || json_object_set_new(root, "stream_options", so)) {
                rc = QG_ENOMEM;
                goto done;
            }
            added = 1;
        } else if (!json_is_object(so)) {
            goto done;
        } else if (!json_is_true(json_object_get(so, "include_usage"))) {
            if (json_object_set_new(so, "include_usage", json_true())) {
                rc = QG_ENOMEM;
                goto done;
            }
            added = 1;
        }
        if (added_include_usage)
            *added_include_usage = added;
    }
    if (new_model && (rc = set_model(root, new_model)) != 0)
        goto done;
    rc = dump(root, out, outlen);
done:
    json_decref(root);
    if (rc && added_include_usage)
        *added_include_usage = 0;
    return rc;
}

int qg__request_add_include_usage(const char *body, size_t len, char **out,
                                  size_t *outlen)
{
    static const char member[] =
        "\"stream_options\":{\"include_usage\":true},";
    size_t k = 0, n;
    char *t;
    *out = NULL;
    *outlen = 0;
    while (k < len && (body[k] == ' ' || body[k] == '\t' ||
                       body[k] == '\n' || body[k] == '\r'))
        k++;
    if (k == len || body[k] != '{')
        return QG_EINVAL;
    k++;                           /* the object's first member goes here */
    n = len + sizeof member - 1;
    if (!(t = malloc(n + 1)))
        return QG_ENOMEM;
    memcpy(t, body, k);
    memcpy(t + k, member, sizeof member - 1);
    memcpy(t + k + sizeof member - 1, body + k, len - k);
    t[n] = '\0';
    *out = t;
    *outlen = n;
    return 0;
}

int qg__request_replace_model(const char *body, size_t len,
                             const char *new_model, char **out,
                             size_t *outlen)
{
    int rc = QG_EINVAL;
    *out = NULL;
    *outlen = 0;
    json_t *root = load(body, len, JSON_REJECT_DUPLICATES);
    if (!json_is_object(root) || !new_model)
        goto done;
    if ((rc = set_model(root, new_model)) == 0)
        rc = dump(root, out, outlen);
done:
    json_decref(root);
    return rc;
}

/* --------------------------------------------------- generated content */

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

int64_t qg__content_bytes_openai_chunk(const char *data, size_t len)
{
    qg__resp r;
    return qg__resp_scan(data, len, &r) == 0 ? r.openai_chunk_bytes : 0;
}

int64_t qg__content_bytes_anthropic_event(const char *data, size_t len)
{
    qg__resp r;
    return qg__resp_scan(data, len, &r) == 0 ? r.anthropic_event_bytes : 0;
}

/* A whole body stays on jansson: Anthropic's tool_use input is counted as
 * its compact JSON text, which needs the tree (and this runs only when
 * the upstream reported no output count). */
int64_t qg__content_bytes_json(const char *body, size_t len, int shape)
{
    json_t *j = json_loadb(body, len, 0, NULL), *x;
    size_t i;
    int64_t n = 0;
    if (!j)
        return 0;
    if (shape == QG_SHAPE_OPENAI) {
        json_array_foreach(json_object_get(j, "choices"), i, x) {
            json_t *m = json_object_get(x, "message");
            n += str_len(json_object_get(m, "content"));
            n += tool_call_bytes(json_object_get(m, "tool_calls"));
        }
    } else {
        json_array_foreach(json_object_get(j, "content"), i, x) {
            json_t *in = json_object_get(x, "input");
            n += str_len(json_object_get(x, "text")) +
                 str_len(json_object_get(x, "thinking"));
            if (in) {
                char *t = json_dumps(in, JSON_COMPACT);
                if (t)
                    n += (int64_t)strlen(t);
                free(t);
            }
        }
    }
    json_decref(j);
    return n;
}
