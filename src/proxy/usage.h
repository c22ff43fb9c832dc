/* usage.h - what the metering proxy reads from and writes into the JSON of
 * OpenAI- and Anthropic-shaped traffic, without any I/O.
 *
 * Responses: the real token usage of a non-streaming body, of each SSE
 * payload of an OpenAI chat.completion.chunk stream, and of each event of
 * an Anthropic messages stream.  Requests: the fields admission needs
 * (model, stream, the output cap, an input size estimate) and the rewrite
 * the proxy sends upstream (ask for the usage chunk, downgrade the model).
 *
 * Return conventions.  The usage extractors are tri-state, as their callers
 * branch on them: 1 usage found, 0 none here, -1 malformed (not JSON, not
 * an object, or a usage member of the wrong type or negative); the
 * streaming ones add 2 (end of stream) and -2 (an error event).  The
 * request functions follow the library's qg_err convention: 0, QG_EINVAL
 * for a body that is not JSON or not a valid request, QG_ENOMEM.
 *
 * All functions are reentrant and thread-safe (jansson and yajl are, per
 * call). */
#ifndef QG_USAGE_H
#define QG_USAGE_H

#include <stddef.h>
#include <stdint.h>

/* Token counts read from a response.  Zero it before a stream; the
 * streaming functions update it event by event. */
typedef struct qg_usage_counts {
    int64_t input_tokens;   /* for Anthropic, cache creation and cache read
                               input tokens are included */
    int64_t output_tokens;
    int have_input, have_output;
    char error[64];         /* an upstream error type, "" when none */
} qg_usage_counts;

/* ------------------------------------------------------------ responses */

/* A non-streaming OpenAI body: usage.prompt_tokens and
 * usage.completion_tokens (chat completions), or usage.input_tokens and
 * usage.output_tokens (the Responses shape).  *out is reset first.
 * Returns 1 when either count is present, 0 when the body has no usage (an
 * error body's error.type, or error.code, is then copied to out->error),
 * -1 when malformed. */
int qg__usage_openai_json(const char *body, size_t len, qg_usage_counts *out);

/* One "data:" payload of an OpenAI chat.completion.chunk stream.
 * Returns 2 for "[DONE]"; 1 when the chunk carries a non-null "usage"
 * object (its counts are written to *out); 0 for an ordinary chunk; -2 for
 * an {"error": {...}} chunk (its type copied to out->error); -1 when
 * malformed.  *is_usage_only (may be NULL) is set to 1 only when the chunk
 * carries usage and an empty "choices" array: the extra chunk the upstream
 * sends for stream_options.include_usage, which the proxy drops when the
 * caller did not ask for it; 0 otherwise. */
int qg__usage_openai_chunk(const char *data, size_t len, qg_usage_counts *out,
                          int *is_usage_only);

/* A non-streaming Anthropic message: usage.input_tokens (plus
 * cache_creation_input_tokens and cache_read_input_tokens) and
 * usage.output_tokens.  *out is reset first.  Returns 1, 0 (no usage; an
 * {"type":"error"} body's error.type is copied to out->error) or -1. */
int qg__usage_anthropic_json(const char *body, size_t len,
                            qg_usage_counts *out);

/* One event of an Anthropic messages stream: its SSE type (event, elen;
 * the payload's own "type" wins when present) and payload.  Updates *acc:
 *  - message_start: message.usage input (with cache tokens) and, when
 *    present, output_tokens; returns 1;
 *  - message_delta: usage.output_tokens, which is CUMULATIVE: it replaces
 *    the count, never adds to it (input_tokens likewise when present);
 *    returns 1 when usage was present;
 *  - message_stop: returns 2;
 *  - error: copies error.type (truncated to 63 bytes; "error" when absent)
 *    to acc->error and returns -2;
 *  - anything else (ping, content_block_*): 0.
 * Every payload is parsed: -1 when malformed, acc then unchanged. */
int qg__usage_anthropic_event(const char *event, size_t elen, const char *data,
                             size_t dlen, qg_usage_counts *acc);

/* The two stream readers above, also giving *content_bytes (the event's
 * bytes of generated text, as qg__content_bytes_openai_chunk and
 * qg__content_bytes_anthropic_event count them; 0 when not parsed) from
 * the same single parse: the proxy reads every stream event this way. */
int qg__usage_openai_chunk_bytes(const char *data, size_t len,
                                qg_usage_counts *out, int *is_usage_only,
                                int64_t *content_bytes);
int qg__usage_anthropic_event_bytes(const char *event, size_t elen,
                                   const char *data, size_t dlen,
                                   qg_usage_counts *acc,
                                   int64_t *content_bytes);

/* ------------------------------------------------------------- requests */

enum { QG_SHAPE_OPENAI = 1, QG_SHAPE_ANTHROPIC = 2 };

#define QG_REQUEST_MODEL_MAX 256

/* What admission needs to know about a request body. */
typedef struct qg_request_info {
    char model[QG_REQUEST_MODEL_MAX]; /* NUL-terminated */
    int stream;                /* "stream": true */
    int stream_options;        /* a top-level "stream_options" member
                                  (any value, null included) */
    int64_t max_output_tokens; /* OpenAI: max_completion_tokens, else
                                  max_tokens; Anthropic: max_tokens;
                                  -1 when absent (OpenAI only) */
    int64_t input_bytes;       /* bytes of text in the prompt, see below */
    int64_t input_tokens_estimate; /* ceil(input_bytes / 4) */
} qg_request_info;

/* Read a request body of the given shape into *out.
 *
 * The input estimate counts the UTF-8 bytes of the prompt's text: every
 * message's "content" when it is a string, the "text" of each content part
 * when it is an array (and, one level down, the content of Anthropic
 * tool_result parts), plus "system" (Anthropic: a string or an array of
 * text blocks; OpenAI: system messages are ordinary messages).  Images,
 * audio, tool definitions and message framing are not counted.  English
 * text averages about 4 bytes per token, so input_tokens_estimate =
 * ceil(bytes / 4); it reserves roughly the right amount at admission, and
 * the settle replaces it with the upstream's real count.
 *
 * Returns 0; QG_EINVAL when the body is not a JSON object, "model" is
 * missing, not a string or longer than QG_REQUEST_MODEL_MAX - 1 bytes,
 * "stream" is not a boolean or null, a token cap is not a non-negative
 * integer, "messages" is present but not an array, (OpenAI)
 * "stream_options" is present but neither an object nor null (the rewrite
 * below could not ask for the usage chunk), or (Anthropic) max_tokens is
 * absent; QG_ENOMEM.  So the rewrites below, run on a body accepted
 * here, fail only for lack of memory. */
int qg__request_fields(const char *body, size_t len, int shape,
                      qg_request_info *out);

/* Rewrite an OpenAI chat completions request for the upstream.  When
 * "stream" is true and stream_options.include_usage is not true, sets
 * stream_options.include_usage = true (other stream_options keys are kept)
 * and *added_include_usage = 1 (else 0).  When new_model is non-NULL,
 * "model" becomes new_model (a downgrade).  Every other member is kept in
 * its order; numbers are re-printed by jansson (reals exactly, with up to
 * 17 significant digits).  On success *out is a malloc'd compact JSON text
 * of *outlen bytes plus a NUL, freed by the caller.
 * Returns 0; QG_EINVAL (not a JSON object, "stream" neither boolean nor
 * null, stream_options neither object nor null); QG_ENOMEM. */
int qg__request_rewrite_openai(const char *body, size_t len, char **out,
                              size_t *outlen, int *added_include_usage,
                              const char *new_model);

/* The common case of the rewrite above, without parsing the body again:
 * body, accepted by qg__request_fields as an OpenAI request with
 * "stream": true and no "stream_options" member, with
 * "stream_options":{"include_usage":true} added as its first member;
 * every byte of the body is kept as the caller sent it.  Ownership as
 * qg__request_rewrite_openai.  Returns 0; QG_EINVAL (the text does not
 * start, after JSON whitespace, with "{"); QG_ENOMEM. */
int qg__request_add_include_usage(const char *body, size_t len, char **out,
                                  size_t *outlen);

/* Replace "model" of a request body of either shape (the Anthropic
 * downgrade).  Ownership and returns as qg__request_rewrite_openai. */
int qg__request_replace_model(const char *body, size_t len,
                             const char *new_model, char **out,
                             size_t *outlen);

/* ------------------------------------------------- generated content */

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

#endif
