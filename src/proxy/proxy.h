/* proxy.h - the I/O-free parts of the metering proxy (h_proxy.c does the
 * I/O): where one SSE event ends in a byte stream (so a stream can be
 * passed on event by event when one event must be dropped), how many
 * bytes of generated content a response or stream event carries (the
 * output estimate when the upstream reports no usage: ceil(bytes / 4),
 * the same 4 bytes per token as the input estimate of usage.h), and which
 * of the caller's request headers go upstream. */
#ifndef QG_PROXY_H
#define QG_PROXY_H

#include <stddef.h>
#include <stdint.h>

/* Event boundaries of a text/event-stream: an event ends with a blank
 * line (two line ends in a row; a line ends with CR, LF or CRLF).  Zero
 * the state before a stream. */
typedef struct qg_sse_split {
    int at_eol;                /* the last byte ended a line */
    int cr;                    /* the last byte was CR */
} qg_sse_split;

/* Scan buf[0..len): returns the offset just past the first event
 * boundary in it (1..len), or 0 when it holds none (the state then
 * covers all len bytes).  Call again on the rest after a boundary.  A
 * boundary that ends with a CR whose LF is in the next piece leaves that
 * LF to the next event (an empty line there, which dispatches nothing). */
size_t qg__sse_split_next(qg_sse_split *s, const char *buf, size_t len);

/* Bytes of generated text: an OpenAI chat.completion.chunk payload
 * (choices[].delta.content and tool call arguments), an Anthropic stream
 * event's payload (content_block_delta: delta.text, partial_json,
 * thinking), a whole non-streaming body of either shape (OpenAI:
 * choices[].message.content and tool call arguments; Anthropic:
 * content[].text / thinking, tool_use input as JSON).  Bytes of the
 * decoded UTF-8 text (an escape counts as the bytes it stands for; a
 * \u0000 counts 1 in a stream event).  0 when there is none or the text
 * is not JSON. */
int64_t qg__content_bytes_openai_chunk(const char *data, size_t len);
int64_t qg__content_bytes_anthropic_event(const char *data, size_t len);
int64_t qg__content_bytes_json(const char *body, size_t len, int shape);

/* 1 when the caller's request header `name` is passed upstream: every
 * header except the caller's credentials (Authorization, x-api-key,
 * anything X-Quotagate-*), hop-by-hop ones (Connection, Keep-Alive, TE,
 * Transfer-Encoding, Upgrade, Proxy-*), Host and Content-Length (set by
 * the proxy), Accept-Encoding (usage is read from the response, so it
 * must not be compressed) and X-Request-Id (set by the proxy). */
int qg__proxy_forward_header(const char *name, size_t len);

#endif
