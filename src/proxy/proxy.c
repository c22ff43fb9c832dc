/* proxy.c - see proxy.h.  Stream events are read by respscan.c's one
 * streaming pass; whole bodies by jansson. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "proxy.h"
#include "respscan.h"
#include "usage.h"

size_t qg__sse_split_next(qg_sse_split *s, const char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == '\n' && s->cr) {       /* the LF of a CRLF */
            s->cr = 0;
            continue;
        }
        if (c == '\r' || c == '\n') {
            s->cr = c == '\r';
            if (s->at_eol) {
                s->at_eol = 0;
                if (c == '\r' && i + 1 < len && buf[i + 1] == '\n') {
                    s->cr = 0;          /* keep the CRLF whole */
                    return i + 2;
                }
                return i + 1;
            }
            s->at_eol = 1;
        } else {
            s->at_eol = 0;
            s->cr = 0;
        }
    }
    return 0;
}

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

int qg__proxy_forward_header(const char *name, size_t len)
{
    static const char *const drop[] = {
        "authorization", "x-api-key", "connection", "keep-alive", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "x-request-id", "expect", NULL};
    for (int i = 0; drop[i]; i++)
        if (strlen(drop[i]) == len && strncasecmp(drop[i], name, len) == 0)
            return 0;
    if (len >= 6 && strncasecmp(name, "proxy-", 6) == 0)
        return 0;
    if (len >= 11 && strncasecmp(name, "x-quotagate", 11) == 0)
        return 0;
    return 1;
}
