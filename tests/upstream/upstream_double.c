/* upstream_double.c - a fake model provider for the proxy's tests.
 *
 *   upstream_double --listen 127.0.0.1:PORT     (PORT 0 picks a free one)
 *
 * prints "upstream_double: listening on http://127.0.0.1:PORT" (flushed)
 * and serves, on libevent's evhttp (good enough for a test double):
 *
 *   POST /v1/chat/completions   OpenAI chat completions shape
 *   POST /v1/messages           Anthropic messages shape
 *   GET  /_double/last          the last API request received, as JSON:
 *                               {"method","path","headers":{lowercased
 *                               name: value, repeats joined by ", "},
 *                               "body": raw text, "body_json": parsed or
 *                               null, "peer_port": the client's port, which
 *                               names its connection}; 404 before the
 *                               first one
 *   GET  /_double/count         {"count": API requests received}
 *   GET  /_double/stats         {"flood_bytes": body bytes of flood
 *                               streams handed to the socket so far (at
 *                               most DBL_FLOOD_BATCH more than the kernel
 *                               took), "floods": flood streams started,
 *                               "floods_done": those sent to the end}
 *
 * Answers are deterministic:
 *   prompt tokens     = ceil(B / 4), B = bytes of every text in
 *                       "messages" (string content, or the "text" of each
 *                       content part) plus Anthropic's "system";
 *   completion tokens = N = "max_completion_tokens", else "max_tokens",
 *                       clamped to 1..4096, default 20;
 *   content           = the N words "tok0 tok1 ... tok{N-1}";
 *   finish            = "stop" / "end_turn"; created = 1700000000.
 *
 * "stream": true answers text/event-stream as HTTP chunks, one SSE event
 * per chunk, a delay between chunks (the first goes at once).  OpenAI: a
 * role chunk, one content chunk per token, a finish chunk, then - only
 * when stream_options.include_usage is true - a chunk with "choices": []
 * and the usage (the other chunks then carry "usage": null, as OpenAI
 * does), then "data: [DONE]".  Anthropic: message_start (usage
 * input_tokens P, output_tokens 1), content_block_start, ping, one
 * content_block_delta per token, content_block_stop, message_delta
 * (usage output_tokens N: cumulative, it includes message_start's 1),
 * message_stop.
 *
 * Misbehaviour per request, header X-Double-Mode, comma-separated:
 *   slow=MS          delay between stream chunks (default 5, max 60000)
 *   reset-after=N    send N stream events, then reset the TCP connection
 *                    (an RST: the peer's read fails with ECONNRESET)
 *   close-after=N    send N stream events, then close the connection
 *                    cleanly (FIN) without the terminating chunk
 *   no-usage         no usage anywhere (JSON body, stream events)
 *   usage-in=N       report N input (prompt) tokens wherever usage is
 *                    reported, whatever was sent (0..INT64_MAX)
 *   usage-out=N      report N output (completion) tokens likewise (the
 *                    content is still the max_tokens words; Anthropic's
 *                    message_start keeps its output count of 1)
 *   status=CODE      answer CODE (400..599) with the API's error body;
 *                    429 also carries Retry-After: 2
 *   hang             never answer
 *   flood=N          (an OpenAI stream) N content events of
 *                    DBL_FLOOD_TEXT bytes of text each, "tok<i>" then
 *                    dots, instead of max_tokens words; completion
 *                    tokens N.  Sent as fast as the socket takes them: a
 *                    batch is added only when less than DBL_FLOOD_BATCH
 *                    bytes wait in the double's own output buffer, so a
 *                    reader that stops makes the double stop too, and
 *                    /_double/stats says how far it got (backpressure
 *                    tests); the connection's send buffer is pinned to
 *                    DBL_FLOOD_SNDBUF (the kernel doubles it) instead of
 *                    growing to net.ipv4.tcp_wmem's maximum, so that what
 *                    was written is close to what the reader's side took
 *   big=MIB          (not streamed) the answer's text is MIB MiB of 'x'
 *                    (1..1024), with Content-Length; the body is made as
 *                    it goes, a batch whenever less than DBL_FLOOD_BATCH
 *                    bytes wait in the double's output buffer, never held
 *                    whole (the proxy's bound on a buffered answer)
 *   big-chunked=MIB  the same in chunked transfer coding
 *   close            answer with Connection: close (the connection ends
 *                    after the answer: the proxy cannot pool it)
 *   twice            (not streamed) the answer, then at once a second
 *                    complete response nobody asked for (200, Content-Length,
 *                    its text "stale second response", usage 999 and 999),
 *                    both in one write: the answer's Content-Length is its
 *                    own, and the second rides as the bytes after it.  The
 *                    connection then serves the next request normally
 * An unknown mode is a 400, so a typo in a test fails loudly.
 *
 * SIGTERM/SIGINT stop the loop; everything is freed and the exit is 0.
 * One thread, one event loop; the state lives in one struct dbl. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define DBL_MAX_BODY      (1 << 20)
#define DBL_MAX_TOKENS    4096
#define DBL_DEFAULT_TOKENS 20
#define DBL_DEFAULT_SLOW_MS 5
#define DBL_MAX_SLOW_MS   60000
#define DBL_CREATED       1700000000
#define DBL_MAX_FLOOD     1000000
#define DBL_FLOOD_TEXT    1024
#define DBL_FLOOD_BATCH   (64 * 1024)
#define DBL_FLOOD_SNDBUF  (64 * 1024)
#define DBL_MAX_BIG_MIB   1024
#define DBL_BIG_MARK      "@@big@@"

enum api { API_OPENAI, API_ANTHROPIC };

/* What X-Double-Mode asked for. */
typedef struct mode {
    int slow_ms;
    int reset_after;           /* -1: never */
    int reset_rst;             /* reset-after (1) or close-after (0) */
    int no_usage;
    int status;                /* 0: answer normally */
    int hang;
    int flood;                 /* content events of a flood, 0: none */
    long long usage_in;        /* reported counts: -1 = the real ones */
    long long usage_out;
    int big_mib;               /* big / big-chunked: MiB of text, 0: none */
    int big_chunked;
    int twice;                 /* a second response after the answer */
    int close;                 /* Connection: close */
} mode;

/* A stream in progress: its events, rendered up front, go out one per
 * timer tick.  Listed in dbl so shutdown can free it. */
typedef struct stream {
    struct dbl *d;
    struct evhttp_request *req;
    struct event *timer;
    char **events;
    int nevents, next;
    mode m;
    int flood_i;               /* flood content events sent */
    int include_usage;         /* flood: chunks carry "usage": null */
    char id[64], model[128];   /* flood: of every chunk */
    char *big_head, *big_tail; /* big: the JSON around the text */
    long long big_left;        /* big: bytes of text still to send */
    int big_phase;             /* big: 0 head, 1 text, 2 tail, 3 done */
    struct stream *prev, *nxt;
} stream;

/* A request held forever by `hang`. */
typedef struct held {
    struct evhttp_request *req;
    struct held *nxt;
} held;

typedef struct dbl {
    struct event_base *base;
    struct evhttp *http;
    json_t *last;              /* the last API request, or NULL */
    long count;                /* API requests received */
    stream *streams;
    held *held;
    long long flood_bytes;     /* /_double/stats */
    long floods, floods_done;
} dbl;

/* ------------------------------------------------------------ replies */

static void send_json(struct evhttp_request *req, int code, json_t *body)
{
    struct evbuffer *b = evbuffer_new();
    char *text = json_dumps(body, JSON_COMPACT);
    if (b && text)
        evbuffer_add(b, text, strlen(text));
    evhttp_add_header(evhttp_request_get_output_headers(req),
                      "Content-Type", "application/json");
    evhttp_send_reply(req, code, NULL, b);  /* NULL: the standard phrase */
    free(text);
    if (b)
        evbuffer_free(b);
    json_decref(body);
}

/* An error in the API's own shape.  Anthropic:
 * {"type":"error","error":{"type","message"}}; OpenAI:
 * {"error":{"message","type","param","code"}}. */
static void send_api_error(struct evhttp_request *req, enum api api,
                           int code, const char *msg)
{
    const char *atype = code == 429 ? "rate_limit_error"
                        : code == 529 ? "overloaded_error"
                        : code == 401 ? "authentication_error"
                        : code < 500 ? "invalid_request_error" : "api_error";
    const char *otype = code == 429 ? "requests"
                        : code < 500 ? "invalid_request_error" : "server_error";
    json_t *body;
    if (api == API_ANTHROPIC)
        body = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error",
                         "type", atype, "message", msg);
    else
        body = json_pack("{s:{s:s, s:s, s:n, s:s?}}", "error", "message", msg,
                         "type", otype, "param", "code",
                         code == 429 ? "rate_limit_exceeded" : NULL);
    if (code == 429)
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "Retry-After", "2");
    send_json(req, code, body);
}

/* ------------------------------------------------------------ request */

/* Parse X-Double-Mode into *m.  Returns 0, or -1 with msg filled. */
static int parse_mode(const char *hdr, mode *m, char *msg, size_t cap)
{
    m->slow_ms = DBL_DEFAULT_SLOW_MS;
    m->reset_after = -1;
    m->no_usage = m->status = m->hang = m->flood = 0;
    m->usage_in = m->usage_out = -1;
    m->big_mib = m->big_chunked = m->twice = m->close = 0;
    if (!hdr)
        return 0;
    char *copy = strdup(hdr), *save = NULL, *tok;
    int rc = 0;
    for (tok = strtok_r(copy, ",", &save); tok && rc == 0;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        char *end = tok + strlen(tok);
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        char *eq = strchr(tok, '=');
        long v = 0;
        if (eq) {
            char *vend;
            *eq = '\0';
            errno = 0;
            v = strtol(eq + 1, &vend, 10);
            if (errno || vend == eq + 1 || *vend || v < 0)
                rc = -1;
        }
        if (rc)
            ;
        else if (!strcmp(tok, "slow") && eq && v <= DBL_MAX_SLOW_MS)
            m->slow_ms = (int)v;
        else if ((!strcmp(tok, "reset-after") || !strcmp(tok, "close-after"))
                 && eq && v < 1000000) {
            m->reset_after = (int)v;
            m->reset_rst = tok[0] == 'r';
        }
        else if (!strcmp(tok, "status") && eq && v >= 400 && v <= 599)
            m->status = (int)v;
        else if (!strcmp(tok, "no-usage") && !eq)
            m->no_usage = 1;
        else if (!strcmp(tok, "hang") && !eq)
            m->hang = 1;
        else if (!strcmp(tok, "twice") && !eq)
            m->twice = 1;
        else if (!strcmp(tok, "close") && !eq)
            m->close = 1;
        else if (!strcmp(tok, "flood") && eq && v >= 1 && v <= DBL_MAX_FLOOD)
            m->flood = (int)v;
        else if (!strcmp(tok, "usage-in") && eq)
            m->usage_in = v;
        else if (!strcmp(tok, "usage-out") && eq)
            m->usage_out = v;
        else if ((!strcmp(tok, "big") || !strcmp(tok, "big-chunked")) && eq &&
                 v >= 1 && v <= DBL_MAX_BIG_MIB) {
            m->big_mib = (int)v;
            m->big_chunked = tok[3] == '-';
        }
        else if (*tok || eq)
            rc = -1;
        if (rc)
            snprintf(msg, cap, "X-Double-Mode: bad mode '%s'", tok);
    }
    free(copy);
    return rc;
}

/* Bytes of text in a content value: a string, or an array of parts
 * whose "text" members count. */
static size_t content_bytes(json_t *c)
{
    size_t n = 0, i;
    json_t *part;
    if (json_is_string(c))
        return json_string_length(c);
    if (json_is_array(c))
        json_array_foreach(c, i, part) {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t))
                n += json_string_length(t);
        }
    return n;
}

static int prompt_tokens(json_t *body)
{
    size_t bytes = content_bytes(json_object_get(body, "system")), i;
    json_t *msg;
    json_array_foreach(json_object_get(body, "messages"), i, msg)
        bytes += content_bytes(json_object_get(msg, "content"));
    return (int)((bytes + 3) / 4);
}

static int completion_tokens(json_t *body)
{
    json_t *v = json_object_get(body, "max_completion_tokens");
    if (!json_is_integer(v))
        v = json_object_get(body, "max_tokens");
    if (!json_is_integer(v))
        return DBL_DEFAULT_TOKENS;
    json_int_t n = json_integer_value(v);
    return n < 1 ? 1 : n > DBL_MAX_TOKENS ? DBL_MAX_TOKENS : (int)n;
}

/* Remember the request for /_double/last. */
static void record(dbl *d, struct evhttp_request *req, const char *body,
                   size_t len)
{
    json_t *h = json_object();
    struct evkeyval *kv;
    for (kv = evhttp_request_get_input_headers(req)->tqh_first; kv;
         kv = kv->next.tqe_next) {
        char name[256];
        size_t i;
        for (i = 0; kv->key[i] && i + 1 < sizeof name; i++)
            name[i] = (char)(kv->key[i] >= 'A' && kv->key[i] <= 'Z'
                             ? kv->key[i] + 32 : kv->key[i]);
        name[i] = '\0';
        json_t *old = json_object_get(h, name);
        if (old) {
            char *j = NULL;
            if (asprintf(&j, "%s, %s", json_string_value(old), kv->value) >= 0)
                json_object_set_new(h, name, json_string(j));
            free(j);
        } else {
            json_object_set_new(h, name, json_string(kv->value));
        }
    }
    json_t *parsed = json_loadb(body, len, 0, NULL);
    json_decref(d->last);
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    char *peer = NULL;
    ev_uint16_t peer_port = 0;
    if (evcon)
        evhttp_connection_get_peer(evcon, &peer, &peer_port);
    d->last = json_pack("{s:s, s:s, s:o, s:s%, s:o, s:i}", "method", "POST",
                        "path", evhttp_request_get_uri(req), "headers", h,
                        "body", body, len,
                        "body_json", parsed ? parsed : json_null(),
                        "peer_port", (int)peer_port);
    d->count++;
}

/* ------------------------------------------------------------ content */

static json_t *words(int n)
{
    size_t cap = (size_t)n * 12 + 1, len = 0;
    char *s = malloc(cap);
    s[0] = '\0';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, i ? " tok%d" : "tok%d", i);
    json_t *j = json_stringn(s, len);
    free(s);
    return j;
}

static json_t *word(int i)
{
    char s[24];
    snprintf(s, sizeof s, i ? " tok%d" : "tok%d", i);
    return json_string(s);
}

/* The counts to report (usage-in / usage-out), and their sum saturated. */
static json_int_t rep_in(const mode *m, int p)
{
    return m->usage_in >= 0 ? (json_int_t)m->usage_in : p;
}

static json_int_t rep_out(const mode *m, int n)
{
    return m->usage_out >= 0 ? (json_int_t)m->usage_out : n;
}

static json_int_t rep_total(const mode *m, int p, int n)
{
    json_int_t a = rep_in(m, p), b = rep_out(m, n);
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static json_t *openai_body(dbl *d, const char *model, int p, int n,
                           const mode *m)
{
    char id[64];
    snprintf(id, sizeof id, "chatcmpl-double-%ld", d->count);
    json_t *b = json_pack(
        "{s:s, s:s, s:i, s:s, s:[{s:i, s:{s:s, s:o}, s:n, s:s}]}", "id", id,
        "object", "chat.completion", "created", DBL_CREATED, "model", model,
        "choices", "index", 0, "message", "role", "assistant", "content",
        words(n), "logprobs", "finish_reason", "stop");
    if (!m->no_usage)
        json_object_set_new(b, "usage",
                            json_pack("{s:I, s:I, s:I}", "prompt_tokens",
                                      rep_in(m, p), "completion_tokens",
                                      rep_out(m, n), "total_tokens",
                                      rep_total(m, p, n)));
    return b;
}

static json_t *anthropic_body(dbl *d, const char *model, int p, int n,
                              const mode *m)
{
    char id[64];
    snprintf(id, sizeof id, "msg_double_%ld", d->count);
    json_t *b = json_pack(
        "{s:s, s:s, s:s, s:s, s:[{s:s, s:o}], s:s, s:n}", "id", id, "type",
        "message", "role", "assistant", "model", model, "content", "type",
        "text", "text", words(n), "stop_reason", "end_turn",
        "stop_sequence");
    if (!m->no_usage)
        json_object_set_new(b, "usage", json_pack("{s:I, s:I}", "input_tokens",
                                                  rep_in(m, p), "output_tokens",
                                                  rep_out(m, n)));
    return b;
}

/* --------------------------------------------------------------- SSE */

/* Append one SSE event (event line when name is non-NULL; data is the
 * compact JSON of j, stolen, or the literal raw when j is NULL). */
static void add_event(stream *s, const char *name, json_t *j, const char *raw)
{
    char *data = j ? json_dumps(j, JSON_COMPACT) : strdup(raw), *ev = NULL;
    json_decref(j);
    if (name)
        (void)!asprintf(&ev, "event: %s\ndata: %s\n\n", name, data);
    else
        (void)!asprintf(&ev, "data: %s\n\n", data);
    free(data);
    s->events[s->nevents++] = ev;
}

static json_t *chunk(const char *id, const char *model, json_t *choices,
                     const mode *m, int include_usage)
{
    json_t *c = json_pack("{s:s, s:s, s:i, s:s, s:o}", "id", id, "object",
                          "chat.completion.chunk", "created", DBL_CREATED,
                          "model", model, "choices", choices);
    if (include_usage && !m->no_usage)
        json_object_set_new(c, "usage", json_null());
    return c;
}

static void openai_events(dbl *d, stream *s, const char *model, int p, int n,
                          int include_usage)
{
    char id[64];
    const mode *m = &s->m;
    snprintf(id, sizeof id, "chatcmpl-double-%ld", d->count);
    add_event(s, NULL, chunk(id, model, json_pack(
        "[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", 0, "delta", "role",
        "assistant", "content", "", "logprobs", "finish_reason"), m,
        include_usage), NULL);
    /* a flood's content events are made as they go (flood_tick) */
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->model, sizeof s->model, "%s", model);
    s->include_usage = include_usage;
    for (int i = 0; i < (m->flood ? 0 : n); i++)
        add_event(s, NULL, chunk(id, model, json_pack(
            "[{s:i, s:{s:o}, s:n, s:n}]", "index", 0, "delta", "content",
            word(i), "logprobs", "finish_reason"), m, include_usage), NULL);
    add_event(s, NULL, chunk(id, model, json_pack(
        "[{s:i, s:{}, s:n, s:s}]", "index", 0, "delta", "logprobs",
        "finish_reason", "stop"), m, include_usage), NULL);
    if (include_usage && !m->no_usage) {
        json_t *c = chunk(id, model, json_array(), m, 0);
        json_object_set_new(c, "usage", json_pack(
            "{s:I, s:I, s:I}", "prompt_tokens", rep_in(m, p),
            "completion_tokens", rep_out(m, n), "total_tokens",
            rep_total(m, p, n)));
        add_event(s, NULL, c, NULL);
    }
    add_event(s, NULL, NULL, "[DONE]");
}

static void anthropic_events(dbl *d, stream *s, const char *model, int p,
                             int n)
{
    char id[64];
    const mode *m = &s->m;
    snprintf(id, sizeof id, "msg_double_%ld", d->count);
    json_t *msg = json_pack(
        "{s:s, s:s, s:s, s:s, s:[], s:n, s:n}", "id", id, "type", "message",
        "role", "assistant", "model", model, "content", "stop_reason",
        "stop_sequence");
    if (!m->no_usage)
        json_object_set_new(msg, "usage", json_pack(
            "{s:I, s:i}", "input_tokens", rep_in(m, p), "output_tokens", 1));
    add_event(s, "message_start", json_pack("{s:s, s:o}", "type",
              "message_start", "message", msg), NULL);
    add_event(s, "content_block_start", json_pack(
        "{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", 0,
        "content_block", "type", "text", "text", ""), NULL);
    add_event(s, "ping", json_pack("{s:s}", "type", "ping"), NULL);
    for (int i = 0; i < n; i++)
        add_event(s, "content_block_delta", json_pack(
            "{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta",
            "index", 0, "delta", "type", "text_delta", "text", word(i)), NULL);
    add_event(s, "content_block_stop", json_pack(
        "{s:s, s:i}", "type", "content_block_stop", "index", 0), NULL);
    json_t *md = json_pack("{s:s, s:{s:s, s:n}}", "type", "message_delta",
                           "delta", "stop_reason", "end_turn",
                           "stop_sequence");
    if (!m->no_usage)
        json_object_set_new(md, "usage", json_pack("{s:I}", "output_tokens",
                                                   rep_out(m, n)));
    add_event(s, "message_delta", md, NULL);
    add_event(s, "message_stop", json_pack("{s:s}", "type", "message_stop"),
              NULL);
}

static void stream_free(stream *s)
{
    if (s->prev)
        s->prev->nxt = s->nxt;
    else
        s->d->streams = s->nxt;
    if (s->nxt)
        s->nxt->prev = s->prev;
    event_free(s->timer);
    for (int i = 0; i < s->nevents; i++)
        free(s->events[i]);
    free(s->events);
    free(s->big_head);
    free(s->big_tail);
    free(s);
}

/* End the connection mid-stream.  rst: an abortive close, the peer sees
 * ECONNRESET (connect(AF_UNSPEC) disconnects a Linux TCP socket with an
 * RST at once; the SHUT_WR that evhttp_connection_free does afterwards
 * finds nothing left to close).  Otherwise a plain FIN without the
 * terminating chunk: a truncated stream. */
static void cut_connection(struct evhttp_connection *evcon, int rst)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (rst && fd >= 0) {
        struct linger lg = { 1, 0 };
        struct sockaddr unspec = { .sa_family = AF_UNSPEC };
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        (void)connect(fd, &unspec, sizeof unspec);
    }
    evhttp_connection_free(evcon);   /* frees the request too */
}

/* The next batch of a flood's content events (between the role chunk,
 * events[0], and the finish chunk, events[1]): added only while less than
 * DBL_FLOOD_BATCH bytes wait in the double's output buffer, else looked
 * at again in 1 ms. */
static void flood_tick(stream *s, struct evhttp_connection *evcon)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    struct timeval later = { 0, 1000 }, now = { 0, 0 };
    size_t added = 0;
    char text[DBL_FLOOD_TEXT + 1];
    if (bev && evbuffer_get_length(bufferevent_get_output(bev)) >=
        DBL_FLOOD_BATCH) {
        evtimer_add(s->timer, &later);
        return;
    }
    memset(text, '.', DBL_FLOOD_TEXT);
    text[DBL_FLOOD_TEXT] = '\0';
    while (added < DBL_FLOOD_BATCH && s->flood_i < s->m.flood) {
        int k = snprintf(text, sizeof text, "tok%d", s->flood_i);
        json_t *c;
        char *data, *ev = NULL;
        text[k] = '.';
        c = chunk(s->id, s->model, json_pack(
            "[{s:i, s:{s:s}, s:n, s:n}]", "index", 0, "delta", "content",
            text, "logprobs", "finish_reason"), &s->m, s->include_usage);
        data = json_dumps(c, JSON_COMPACT);
        json_decref(c);
        int len = data ? asprintf(&ev, "data: %s\n\n", data) : -1;
        free(data);
        if (len < 0)
            break;
        struct evbuffer *b = evbuffer_new();
        evbuffer_add(b, ev, (size_t)len);
        evhttp_send_reply_chunk(s->req, b);
        evbuffer_free(b);
        free(ev);
        added += (size_t)len;
        s->flood_i++;
    }
    s->d->flood_bytes += (long long)added;
    evtimer_add(s->timer, &now);
}

/* The next piece of a big answer (the JSON before the text, the text a
 * batch at a time, the JSON after it), added only while less than
 * DBL_FLOOD_BATCH bytes wait in the double's output buffer, else looked
 * at again in 1 ms; the reply ends after the last piece. */
static void big_tick(stream *s, struct evhttp_connection *evcon)
{
    static char text[DBL_FLOOD_BATCH];
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    struct timeval later = { 0, 1000 }, now = { 0, 0 };
    struct evbuffer *b;
    if (bev && evbuffer_get_length(bufferevent_get_output(bev)) >=
        DBL_FLOOD_BATCH) {
        evtimer_add(s->timer, &later);
        return;
    }
    if (s->big_phase == 3) {
        evhttp_send_reply_end(s->req);
        stream_free(s);
        return;
    }
    if (text[0] != 'x')
        memset(text, 'x', sizeof text);
    b = evbuffer_new();
    if (s->big_phase == 0) {
        evbuffer_add(b, s->big_head, strlen(s->big_head));
        s->big_phase = s->big_left ? 1 : 2;
    } else if (s->big_phase == 1) {
        size_t k = s->big_left < (long long)sizeof text
                       ? (size_t)s->big_left : sizeof text;
        evbuffer_add(b, text, k);
        s->big_left -= (long long)k;
        if (s->big_left == 0)
            s->big_phase = 2;
    } else {
        evbuffer_add(b, s->big_tail, strlen(s->big_tail));
        s->big_phase = 3;
    }
    evhttp_send_reply_chunk(s->req, b);
    evbuffer_free(b);
    evtimer_add(s->timer, &now);
}

static void stream_tick(evutil_socket_t fd, short what, void *arg)
{
    stream *s = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(s->req);
    (void)fd;
    (void)what;
    if (!evcon) {                    /* the client went away */
        evhttp_send_reply_end(s->req);   /* frees a detached request */
        stream_free(s);
        return;
    }
    if (s->m.big_mib) {
        big_tick(s, evcon);
        return;
    }
    if (s->m.reset_after >= 0 && s->next >= s->m.reset_after) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
        if (bev && evbuffer_get_length(bufferevent_get_output(bev))) {
            struct timeval tv = { 0, 1000 };  /* let the events go first */
            evtimer_add(s->timer, &tv);
            return;
        }
        int rst = s->m.reset_rst;
        stream_free(s);
        cut_connection(evcon, rst);
        return;
    }
    if (s->m.flood && s->next == 1 && s->flood_i < s->m.flood) {
        flood_tick(s, evcon);
        return;
    }
    if (s->next == s->nevents) {
        if (s->m.flood)
            s->d->floods_done++;
        evhttp_send_reply_end(s->req);
        stream_free(s);
        return;
    }
    if (s->m.flood)
        s->d->flood_bytes += (long long)strlen(s->events[s->next]);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, s->events[s->next], strlen(s->events[s->next]));
    evhttp_send_reply_chunk(s->req, b);
    evbuffer_free(b);
    s->next++;
    struct timeval tv = { s->m.slow_ms / 1000, (s->m.slow_ms % 1000) * 1000 };
    if ((s->next == s->nevents && s->m.reset_after < 0) || s->m.flood)
        tv.tv_sec = tv.tv_usec = 0;  /* end the reply at once */
    evtimer_add(s->timer, &tv);
}

/* ------------------------------------------------------------ routes */

/* twice: the answer with its own Content-Length, and after it, in the
 * same buffer (evhttp writes head and body in one go), a second complete
 * response: the one write a broken keep-alive upstream makes. */
static void send_twice(struct evhttp_request *req, json_t *body, enum api api)
{
    json_t *stale = json_deep_copy(body);
    json_t *holder = api == API_OPENAI
        ? json_object_get(json_array_get(json_object_get(stale, "choices"), 0),
                          "message")
        : json_array_get(json_object_get(stale, "content"), 0);
    json_t *u = json_object_get(stale, "usage");
    char *a = json_dumps(body, JSON_COMPACT), *b, cl[32];
    struct evbuffer *out = evbuffer_new();
    struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
    json_object_set_new(holder, api == API_OPENAI ? "content" : "text",
                        json_string("stale second response"));
    if (u) {
        json_object_set_new(u, api == API_OPENAI ? "prompt_tokens"
                                                 : "input_tokens",
                            json_integer(999));
        json_object_set_new(u, api == API_OPENAI ? "completion_tokens"
                                                 : "output_tokens",
                            json_integer(999));
    }
    b = json_dumps(stale, JSON_COMPACT);
    evbuffer_add(out, a, strlen(a));
    evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\nContent-Type: "
                        "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                        strlen(b), b);
    snprintf(cl, sizeof cl, "%zu", strlen(a));
    evhttp_add_header(oh, "Content-Type", "application/json");
    evhttp_add_header(oh, "Content-Length", cl);
    evhttp_send_reply(req, 200, NULL, out);
    evbuffer_free(out);
    free(a);
    free(b);
    json_decref(stale);
    json_decref(body);
}

/* Start a big answer (big / big-chunked): the API's usual body, its text
 * replaced by MIB MiB of 'x' sent as it is made (big_tick). */
static void big_start(dbl *d, struct evhttp_request *req, enum api api,
                      json_t *body, const mode *m)
{
    json_t *holder = api == API_OPENAI
        ? json_object_get(json_array_get(json_object_get(body, "choices"), 0),
                          "message")
        : json_array_get(json_object_get(body, "content"), 0);
    char *text, *mark;
    stream *s = calloc(1, sizeof *s);
    struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
    struct timeval now = { 0, 0 };
    json_object_set_new(holder, api == API_OPENAI ? "content" : "text",
                        json_string(DBL_BIG_MARK));
    text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    mark = strstr(text, DBL_BIG_MARK);
    *mark = '\0';
    s->d = d;
    s->req = req;
    s->m = *m;
    s->big_head = strdup(text);
    s->big_tail = strdup(mark + strlen(DBL_BIG_MARK));
    s->big_left = (long long)m->big_mib << 20;
    free(text);
    s->timer = evtimer_new(d->base, stream_tick, s);
    s->nxt = d->streams;
    if (d->streams)
        d->streams->prev = s;
    d->streams = s;
    evhttp_add_header(oh, "Content-Type", "application/json");
    if (!m->big_chunked) {
        char cl[32];
        snprintf(cl, sizeof cl, "%lld", (long long)strlen(s->big_head) +
                 (long long)strlen(s->big_tail) + s->big_left);
        evhttp_add_header(oh, "Content-Length", cl);
    }
    evhttp_send_reply_start(req, 200, "OK");
    evtimer_add(s->timer, &now);
}

static void handle_api(dbl *d, struct evhttp_request *req, enum api api)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char *body = malloc(len + 1), msg[256];
    mode m;
    evbuffer_copyout(in, body, len);
    body[len] = '\0';
    record(d, req, body, len);
    json_t *j = json_loadb(body, len, 0, NULL);
    free(body);
    int bad = parse_mode(evhttp_find_header(
        evhttp_request_get_input_headers(req), "X-Double-Mode"), &m, msg,
        sizeof msg);
    if (!bad && m.close)
        evhttp_add_header(evhttp_request_get_output_headers(req),
                          "Connection", "close");
    if (bad) {
        send_api_error(req, api, 400, msg);
    } else if (m.hang) {
        held *h = calloc(1, sizeof *h);
        h->req = req;
        h->nxt = d->held;
        d->held = h;
    } else if (m.status) {
        send_api_error(req, api, m.status, m.status == 429
                       ? "upstream double: rate limited (X-Double-Mode)"
                       : "upstream double: failure (X-Double-Mode)");
    } else if (!json_is_object(j)) {
        send_api_error(req, api, 400, "body is not a JSON object");
    } else if (m.flood && (api != API_OPENAI ||
                           !json_is_true(json_object_get(j, "stream")))) {
        send_api_error(req, api, 400, "X-Double-Mode: flood needs an "
                       "OpenAI stream");
    } else if ((m.big_mib || m.twice) &&
               json_is_true(json_object_get(j, "stream"))) {
        send_api_error(req, api, 400, "X-Double-Mode: big and twice are "
                       "not for streams");
    } else {
        const char *model = json_string_value(json_object_get(j, "model"));
        int p = prompt_tokens(j),
            n = m.flood ? m.flood : completion_tokens(j);
        if (!model)
            model = "double";
        if (m.big_mib && !json_is_true(json_object_get(j, "stream"))) {
            big_start(d, req, api, api == API_OPENAI
                      ? openai_body(d, model, p, n, &m)
                      : anthropic_body(d, model, p, n, &m), &m);
        } else if (m.twice && !json_is_true(json_object_get(j, "stream"))) {
            send_twice(req, api == API_OPENAI
                       ? openai_body(d, model, p, n, &m)
                       : anthropic_body(d, model, p, n, &m), api);
        } else if (!json_is_true(json_object_get(j, "stream"))) {
            send_json(req, 200, api == API_OPENAI
                      ? openai_body(d, model, p, n, &m)
                      : anthropic_body(d, model, p, n, &m));
        } else {
            stream *s = calloc(1, sizeof *s);
            s->d = d;
            s->req = req;
            s->m = m;
            s->events = calloc((size_t)(m.flood ? 0 : n) + 8,
                               sizeof *s->events);
            d->floods += m.flood > 0;
            if (m.flood) {
                struct evhttp_connection *c = evhttp_request_get_connection(req);
                struct bufferevent *bev =
                    c ? evhttp_connection_get_bufferevent(c) : NULL;
                int sz = DBL_FLOOD_SNDBUF;
                if (bev && bufferevent_getfd(bev) >= 0)
                    setsockopt(bufferevent_getfd(bev), SOL_SOCKET, SO_SNDBUF,
                               &sz, sizeof sz);
            }
            s->timer = evtimer_new(d->base, stream_tick, s);
            if (api == API_OPENAI)
                openai_events(d, s, model, p, n, json_is_true(
                    json_object_get(json_object_get(j, "stream_options"),
                                    "include_usage")));
            else
                anthropic_events(d, s, model, p, n);
            s->nxt = d->streams;
            if (d->streams)
                d->streams->prev = s;
            d->streams = s;
            struct evkeyvalq *oh = evhttp_request_get_output_headers(req);
            evhttp_add_header(oh, "Content-Type", "text/event-stream");
            evhttp_add_header(oh, "Cache-Control", "no-cache");
            evhttp_send_reply_start(req, 200, "OK");
            struct timeval now = { 0, 0 };
            evtimer_add(s->timer, &now);
        }
    }
    json_decref(j);
}

/* Small SSE chunks must leave at once, as a real provider's do: without
 * TCP_NODELAY, Nagle holds each one until the reader's delayed ACK
 * (~40 ms), which would dominate every streaming measurement. */
static void no_delay(struct evhttp_request *req)
{
    struct evhttp_connection *c = evhttp_request_get_connection(req);
    struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
    int one = 1;
    if (bev && bufferevent_getfd(bev) >= 0)
        setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one,
                   sizeof one);
}

static void route(struct evhttp_request *req, void *arg)
{
    dbl *d = arg;
    const char *uri = evhttp_request_get_uri(req);
    no_delay(req);
    int post = evhttp_request_get_command(req) == EVHTTP_REQ_POST;
    int get = evhttp_request_get_command(req) == EVHTTP_REQ_GET;
    if (!strcmp(uri, "/v1/chat/completions") && post) {
        handle_api(d, req, API_OPENAI);
    } else if (!strcmp(uri, "/v1/messages") && post) {
        handle_api(d, req, API_ANTHROPIC);
    } else if (!strcmp(uri, "/_double/last") && get) {
        if (d->last)
            send_json(req, 200, json_incref(d->last));
        else
            send_json(req, 404, json_pack("{s:s}", "error", "no request yet"));
    } else if (!strcmp(uri, "/_double/count") && get) {
        send_json(req, 200, json_pack("{s:I}", "count", (json_int_t)d->count));
    } else if (!strcmp(uri, "/_double/stats") && get) {
        send_json(req, 200, json_pack("{s:I, s:I, s:I}", "flood_bytes",
                                      (json_int_t)d->flood_bytes, "floods",
                                      (json_int_t)d->floods, "floods_done",
                                      (json_int_t)d->floods_done));
    } else {
        send_json(req, 404, json_pack("{s:s}", "error", "no such route"));
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    event_base_loopbreak(arg);
}

/* -------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    dbl d = { 0 };
    struct event *sigterm = NULL, *sigint = NULL;
    struct evhttp_bound_socket *sock;
    struct sockaddr_in sa;
    socklen_t salen = sizeof sa;
    char host[64];
    int port, rc = 1;

    if (argc != 3 || strcmp(argv[1], "--listen") ||
        sscanf(argv[2], "%63[^:]:%d", host, &port) != 2) {
        fprintf(stderr, "usage: upstream_double --listen HOST:PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    d.base = event_base_new();
    d.http = d.base ? evhttp_new(d.base) : NULL;
    if (!d.http)
        goto fail;
    evhttp_set_max_body_size(d.http, DBL_MAX_BODY);
    evhttp_set_gencb(d.http, route, &d);
    sock = evhttp_bind_socket_with_handle(d.http, host, (ev_uint16_t)port);
    if (!sock || getsockname(evhttp_bound_socket_get_fd(sock),
                             (struct sockaddr *)&sa, &salen)) {
        fprintf(stderr, "upstream_double: cannot listen on %s\n", argv[2]);
        goto fail;
    }
    sigterm = evsignal_new(d.base, SIGTERM, on_signal, d.base);
    sigint = evsignal_new(d.base, SIGINT, on_signal, d.base);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);
    printf("upstream_double: listening on http://%s:%d\n", host,
           ntohs(sa.sin_port));
    fflush(stdout);
    event_base_dispatch(d.base);
    rc = 0;
fail:
    /* Requests still attached to a connection die with evhttp_free;
     * detached ones (their client left) are ours to free. */
    while (d.streams) {
        stream *s = d.streams;
        if (!evhttp_request_get_connection(s->req))
            evhttp_request_free(s->req);
        stream_free(s);
    }
    while (d.held) {
        held *h = d.held;
        d.held = h->nxt;
        if (!evhttp_request_get_connection(h->req))
            evhttp_request_free(h->req);
        free(h);
    }
    if (sigterm)
        event_free(sigterm);
    if (sigint)
        event_free(sigint);
    if (d.http)
        evhttp_free(d.http);
    if (d.base)
        event_base_free(d.base);
    json_decref(d.last);
    return rc;
}
