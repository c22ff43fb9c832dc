/* stream.h - a streamed answer passed through on its way to the caller:
 * the bytes go on as they arrive while its SSE events are read for usage
 * (docs/proxy.md, "Streams").  In filter mode the stream is passed on
 * event by event, so that the usage-only chunk the gateway asked for on
 * the caller's behalf (stream_options.include_usage) is dropped whole.
 * No socket I/O: what the caller gets gathers in an output buffer that
 * the route writes out after each upstream read. */
#ifndef QG_STREAM_H
#define QG_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <event2/buffer.h>
#include "usage.h"

typedef struct qg__stream qg__stream;

/* A pass-through for an answer of API shape `shape` (QG_SHAPE_*), in
 * filter mode when filter is set.  max_event caps one SSE event's size
 * (sse.h).  NULL when out of memory. */
qg__stream *qg__stream_new(int shape, int filter, size_t max_event);
void qg__stream_free(qg__stream *st);

/* A piece of the upstream's (de-chunked) body.  With pass 0 (the caller
 * is gone) nothing more goes to the output: a plain stream is still read
 * for usage, a filtered one is not split any further.  Returns 0, or
 * QG_ENOMEM: the stream must be cut (like a caller who left), never an
 * event lost or two joined in a stream that goes on. */
int qg__stream_feed(qg__stream *st, const char *data, size_t n, int pass);

/* The body ended: a last partial event (filter mode) goes to the output,
 * and the parser is told.  0 or QG_ENOMEM (cut it). */
int qg__stream_end(qg__stream *st, int pass);

/* What the caller gets, gathered since the last drain (the route writes
 * and drains it). */
struct evbuffer *qg__stream_output(qg__stream *st);

/* The usage read so far: counts, whether the final usage arrived (the
 * last usage event: OpenAI's usage chunk, Anthropic's message_delta) and
 * the bytes of generated text seen. */
const qg_usage_counts *qg__stream_usage(const qg__stream *st, int *final,
                                        int64_t *content_bytes);

#endif
