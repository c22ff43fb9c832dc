/* stream.c - see stream.h: the pass-through of a streamed answer and its
 * event callback.  Each event's data goes to usage.c's readers (one yajl
 * pass per event, respscan.c); event boundaries are found by sse.c's
 * splitter in filter mode.  Every allocation asks fault.h first (a test
 * fails each in turn, docs/fault-injection.md). */
#include <stdlib.h>
#include <string.h>
#include "fault.h"
#include "quotagate.h"
#include "sse.h"
#include "stream.h"

struct qg__stream {
    int shape;
    int filter;                    /* event by event, usage chunk dropped */
    qg_sse *sse;
    qg_sse_split split;
    struct evbuffer *pend;         /* filter mode: the current event */
    struct evbuffer *out;          /* for the caller, until drained */
    int drop;                      /* set by on_event: drop this event */
    qg_usage_counts u;
    int final_usage;
    int64_t content_bytes;
};

static struct evbuffer *new_buffer(const char *site)
{
    return qg__alloc_fails(site) ? NULL : evbuffer_new();
}

/* evbuffer_add: 0, or -1 out of memory. */
static int add(struct evbuffer *b, const void *data, size_t len,
               const char *site)
{
    return qg__alloc_fails(site) || evbuffer_add(b, data, len) != 0 ? -1 : 0;
}

qg__stream *qg__stream_new(int shape, int filter, size_t max_event)
{
    qg__stream *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->shape = shape;
    st->filter = filter;
    if (!(st->pend = new_buffer("event buffer")) ||
        !(st->out = new_buffer("output buffer")) ||
        !(st->sse = qg__sse_new(max_event))) {
        qg__stream_free(st);
        return NULL;
    }
    return st;
}

void qg__stream_free(qg__stream *st)
{
    if (!st)
        return;
    if (st->pend)
        evbuffer_free(st->pend);
    if (st->out)
        evbuffer_free(st->out);
    qg__sse_free(st->sse);
    free(st);
}

struct evbuffer *qg__stream_output(qg__stream *st)
{
    return st->out;
}

const qg_usage_counts *qg__stream_usage(const qg__stream *st, int *final,
                                        int64_t *content_bytes)
{
    if (final)
        *final = st->final_usage;
    if (content_bytes)
        *content_bytes = st->content_bytes;
    return &st->u;
}

/* One event of the stream (sse.h's callback): its usage and content. */
static int on_event(const char *event, size_t elen, const char *data,
                    size_t dlen, void *ud)
{
    qg__stream *st = ud;
    int64_t cb;
    if (st->shape == QG_SHAPE_OPENAI) {
        int only = 0, rc;
        if (dlen == 6 && memcmp(data, "[DONE]", 6) == 0)
            return 0;
        rc = qg__usage_openai_chunk_bytes(data, dlen, &st->u, &only, &cb);
        if (rc == 1) {
            st->final_usage = 1;
            if (only && st->filter)
                st->drop = 1;
        }
        if (rc >= 0)
            st->content_bytes += cb;
    } else {
        int rc = qg__usage_anthropic_event_bytes(event, elen, data, dlen,
                                                 &st->u, &cb);
        if (rc == 1 && !memmem(data, dlen, "\"message_start\"", 15))
            st->final_usage = 1;          /* a message_delta's usage */
        if (rc == 0)
            st->content_bytes += cb;
    }
    return 0;
}

int qg__stream_feed(qg__stream *st, const char *data, size_t n, int pass)
{
    if (!st->filter) {
        if (qg__sse_feed(st->sse, data, n, on_event, st) == QG_ENOMEM)
            return QG_ENOMEM;           /* its usage can no longer be read */
        if (pass && n && add(st->out, data, n, "stream output") != 0)
            return QG_ENOMEM;
        return QG_OK;
    }
    while (n > 0 && pass) {
        size_t k = qg__sse_split_next(&st->split, data, n), elen;
        const char *ev;
        if (add(st->pend, data, k ? k : n, "stream event") != 0)
            return QG_ENOMEM;
        if (k == 0)
            return QG_OK;               /* the event goes on */
        data += k;
        n -= k;
        elen = evbuffer_get_length(st->pend);
        if (qg__alloc_fails("stream event pullup") ||
            !(ev = (const char *)evbuffer_pullup(st->pend, -1)))
            return QG_ENOMEM;
        st->drop = 0;
        if (qg__sse_feed(st->sse, ev, elen, on_event, st) == QG_ENOMEM)
            return QG_ENOMEM;           /* the usage chunk is not known */
        if (!st->drop && add(st->out, ev, elen, "stream output") != 0)
            return QG_ENOMEM;
        evbuffer_drain(st->pend, elen);
    }
    return QG_OK;
}

int qg__stream_end(qg__stream *st, int pass)
{
    size_t n = evbuffer_get_length(st->pend);
    int rc = QG_OK;
    if (st->filter && n) {
        const char *ev = qg__alloc_fails("stream event pullup")
                             ? NULL
                             : (const char *)evbuffer_pullup(st->pend, -1);
        if (!ev)
            rc = QG_ENOMEM;             /* cut, not passed on short */
        else if (pass && add(st->out, ev, n, "stream output") != 0)
            rc = QG_ENOMEM;
        evbuffer_drain(st->pend, n);
    }
    qg__sse_finish(st->sse);
    return rc;
}
