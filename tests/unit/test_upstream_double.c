/* test_upstream_double.c - the proxy tests' fake provider, checked on
 * its own: both API shapes, plain and streaming, and every misbehaviour
 * X-Double-Mode offers (see tests/upstream/upstream_double.c).
 *
 * The double is $QG_UPSTREAM_BIN, started once for the group with fork
 * and exec on port 0; its port comes from the listening line.  Plain
 * answers go through tests/support/httpc; streams are read off a raw
 * socket so the test sees the bytes themselves: the chunked framing, one
 * SSE event per chunk, when each chunk arrived, and how the connection
 * ended.  The last test stops the double with SIGTERM and expects a
 * clean exit (under ASan that includes no leaks). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "httpc.h"

#define LISTEN_PREFIX "upstream_double: listening on http://127.0.0.1:"
#define OPENAI "/v1/chat/completions"
#define ANTHROPIC "/v1/messages"
#define MAX_CHUNKS 256

static pid_t dbl_pid;
static int dbl_port;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------- the process */

static int group_setup(void **state)
{
    const char *bin = getenv("QG_UPSTREAM_BIN");
    int fds[2];
    char line[256];
    size_t len = 0;
    (void)state;
    if (!bin || access(bin, X_OK)) {
        fprintf(stderr, "QG_UPSTREAM_BIN not set or not executable\n");
        return -1;
    }
    if (pipe(fds))
        return -1;
    dbl_pid = fork();
    if (dbl_pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(bin, bin, "--listen", "127.0.0.1:0", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    /* Read up to the first newline, for at most 10 s. */
    long long deadline = now_ms() + 10000;
    while (len + 1 < sizeof line && !memchr(line, '\n', len)) {
        struct pollfd pfd = { fds[0], POLLIN, 0 };
        int left = (int)(deadline - now_ms());
        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            break;
        ssize_t n = read(fds[0], line + len, sizeof line - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fds[0]);
    line[len] = '\0';
    if (strncmp(line, LISTEN_PREFIX, strlen(LISTEN_PREFIX)) ||
        (dbl_port = atoi(line + strlen(LISTEN_PREFIX))) <= 0) {
        fprintf(stderr, "no listening line from the double: '%s'\n", line);
        kill(dbl_pid, SIGKILL);
        waitpid(dbl_pid, NULL, 0);
        dbl_pid = 0;
        return -1;
    }
    return 0;
}

/* SIGTERM and wait up to 5 s.  Returns the exit status, or -1 (killed). */
static int stop_double(void)
{
    int st;
    if (dbl_pid <= 0)
        return -1;
    kill(dbl_pid, SIGTERM);
    for (int i = 0; i < 500; i++) {
        if (waitpid(dbl_pid, &st, WNOHANG) == dbl_pid) {
            dbl_pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(10000);
    }
    kill(dbl_pid, SIGKILL);
    waitpid(dbl_pid, &st, 0);
    dbl_pid = 0;
    return -1;
}

static int group_teardown(void **state)
{
    (void)state;
    if (dbl_pid > 0)
        stop_double();
    return 0;
}

/* --------------------------------------------------- plain requests */

/* POST body to path with an optional X-Double-Mode; the JSON answer in
 * *out (NULL when not JSON).  Returns the status. */
static int post(const char *path, const char *mode, const char *body,
                http_resp *r, json_t **out)
{
    httpc c;
    char mh[256];
    const char *hdrs[3] = { "Content-Type: application/json", NULL, NULL };
    if (mode) {
        snprintf(mh, sizeof mh, "X-Double-Mode: %s", mode);
        hdrs[1] = mh;
    }
    httpc_init(&c, dbl_port);
    int rc = httpc_request(&c, "POST", path, hdrs, body, strlen(body), r);
    httpc_close(&c);
    assert_int_equal(rc, 0);
    if (out)
        *out = json_loads(r->body, 0, NULL);
    return r->status;
}

static json_t *get_json(const char *path)
{
    httpc c;
    http_resp r;
    httpc_init(&c, dbl_port);
    assert_int_equal(httpc_request(&c, "GET", path, NULL, NULL, 0, &r), 0);
    httpc_close(&c);
    assert_int_equal(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    http_resp_free(&r);
    assert_non_null(j);
    return j;
}

static json_int_t jint(json_t *j, const char *path)
{
    /* path: dot-separated object keys, e.g. "usage.prompt_tokens" */
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save))
        j = json_object_get(j, k);
    assert_true(json_is_integer(j));
    return json_integer_value(j);
}

/* The string at a dot-separated path, or NULL. */
static const char *jstr(json_t *j, const char *path)
{
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save))
        j = json_object_get(j, k);
    return json_string_value(j);
}

/* "tok0 tok1 ... tok{n-1}" */
static char *expected_words(int n)
{
    char *s = calloc((size_t)n * 12 + 1, 1);
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)sprintf(s + len, i ? " tok%d" : "tok%d", i);
    return s;
}

/* --------------------------------------------------- raw streaming */

typedef struct chunk {
    char *data;                /* the chunk's payload, NUL-terminated */
    size_t len;
    long long at_ms;           /* when its last byte arrived */
} chunk;

typedef struct stream {
    int status;
    char head[2048];           /* status line and headers */
    chunk chunks[MAX_CHUNKS];
    int nchunks;
    int complete;              /* the terminating 0-size chunk came */
    int reset;                 /* the read ended with ECONNRESET */
    int framing_ok;            /* every chunk was well formed */
} stream;

/* Send a streaming request on a fresh socket and read the raw answer to
 * its end (terminal chunk, close or reset), at most 15 s.  Bytes are
 * time-stamped as they arrive, so the chunks' arrival gaps are known. */
static void stream_request(const char *path, const char *mode,
                           const char *body, stream *s)
{
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons((uint16_t)dbl_port) };
    char *req = NULL, *buf = NULL;
    long long *at = NULL;
    size_t len = 0, cap = 0;
    memset(s, 0, sizeof *s);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    int n = asprintf(&req, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\n%s%s%s"
                     "Content-Length: %zu\r\n\r\n%s", path,
                     mode ? "X-Double-Mode: " : "", mode ? mode : "",
                     mode ? "\r\n" : "", strlen(body), body);
    assert_int_equal(write(fd, req, (size_t)n), n);
    free(req);

    size_t hdr_end = 0, pos = 0;
    long long deadline = now_ms() + 15000;
    s->framing_ok = 1;
    for (;;) {
        /* parse what we have */
        if (!hdr_end && buf) {
            char *e = memmem(buf, len, "\r\n\r\n", 4);
            if (e) {
                hdr_end = (size_t)(e - buf) + 4;
                pos = hdr_end;
                snprintf(s->head, sizeof s->head, "%.*s", (int)hdr_end, buf);
                s->status = atoi(buf + 9);
            }
        }
        while (hdr_end && !s->complete) {
            char *crlf = memmem(buf + pos, len - pos, "\r\n", 2);
            if (!crlf)
                break;
            char *end;
            unsigned long size = strtoul(buf + pos, &end, 16);
            if (end != crlf)
                s->framing_ok = 0;
            size_t data = (size_t)(crlf - buf) + 2;
            if (len < data + size + 2)
                break;
            if (memcmp(buf + data + size, "\r\n", 2))
                s->framing_ok = 0;
            if (size == 0) {
                s->complete = 1;
            } else {
                assert_true(s->nchunks < MAX_CHUNKS);
                chunk *c = &s->chunks[s->nchunks++];
                c->data = strndup(buf + data, size);
                c->len = size;
                c->at_ms = at[data + size - 1];
            }
            pos = data + size + 2;
        }
        if (s->complete)
            break;
        /* read more */
        struct pollfd pfd = { fd, POLLIN, 0 };
        int left = (int)(deadline - now_ms());
        assert_true(left > 0);
        if (poll(&pfd, 1, left) <= 0)
            continue;
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 65536;
            buf = realloc(buf, cap);
            at = realloc(at, cap * sizeof *at);
        }
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && errno == ECONNRESET)
            s->reset = 1;
        if (got <= 0)
            break;
        long long t = now_ms();
        for (ssize_t i = 0; i < got; i++)
            at[len + (size_t)i] = t;
        len += (size_t)got;
    }
    close(fd);
    free(buf);
    free(at);
}

static void stream_free(stream *s)
{
    for (int i = 0; i < s->nchunks; i++)
        free(s->chunks[i].data);
}

/* Chunk i as one SSE event: its "event:" name (or "" when none) in
 * name, its data parsed in *data (NULL for "[DONE]"); fails unless the
 * chunk holds exactly one event ending in a blank line. */
static void event_of(const stream *s, int i, char *name, size_t cap,
                     json_t **data)
{
    const char *p = s->chunks[i].data;
    size_t len = s->chunks[i].len;
    assert_true(len > 2);
    assert_memory_equal(p + len - 2, "\n\n", 2);
    assert_ptr_equal(strstr(p, "\n\n"), p + len - 2);
    name[0] = '\0';
    if (!strncmp(p, "event: ", 7)) {
        const char *nl = strchr(p, '\n');
        snprintf(name, cap, "%.*s", (int)(nl - p - 7), p + 7);
        p = nl + 1;
    }
    assert_int_equal(strncmp(p, "data: ", 6), 0);
    p += 6;
    if (!strcmp(p, "[DONE]\n\n")) {
        *data = NULL;
        return;
    }
    *data = json_loads(p, JSON_DISABLE_EOF_CHECK, NULL);
    assert_non_null(*data);
}

static void assert_stream_head(const stream *s)
{
    assert_int_equal(s->status, 200);
    assert_true(s->framing_ok);
    assert_non_null(strcasestr(s->head, "Transfer-Encoding: chunked"));
    assert_non_null(strcasestr(s->head, "Content-Type: text/event-stream"));
}

/* ---------------------------------------------------------- plain */

static void test_openai_plain(void **state)
{
    http_resp r;
    json_t *j;
    (void)state;
    /* 12 + 5 bytes of text -> ceil(17 / 4) = 5 prompt tokens;
     * max_completion_tokens wins over max_tokens */
    assert_int_equal(post(OPENAI, NULL,
        "{\"model\":\"gpt-x\",\"max_tokens\":3,\"max_completion_tokens\":7,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hello world!\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"abcde\"}]}]}",
        &r, &j), 200);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")),
                        "chat.completion");
    assert_string_equal(jstr(j, "model"), "gpt-x");
    assert_int_equal(jint(j, "usage.prompt_tokens"), 5);
    assert_int_equal(jint(j, "usage.completion_tokens"), 7);
    assert_int_equal(jint(j, "usage.total_tokens"), 12);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    char *w = expected_words(7);
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(ch, "message"), "content")), w);
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(ch, "message"), "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")),
                        "stop");
    free(w);
    json_decref(j);
    http_resp_free(&r);
}

static void test_anthropic_plain(void **state)
{
    http_resp r;
    json_t *j;
    (void)state;
    /* system 4 + "hello" 5 = 9 bytes -> 3 input tokens */
    assert_int_equal(post(ANTHROPIC, NULL,
        "{\"model\":\"claude-x\",\"max_tokens\":4,\"system\":\"abcd\","
        "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"hello\"}]}]}", &r, &j), 200);
    assert_non_null(j);
    assert_string_equal(jstr(j, "type"), "message");
    assert_string_equal(json_string_value(json_object_get(j, "stop_reason")),
                        "end_turn");
    assert_int_equal(jint(j, "usage.input_tokens"), 3);
    assert_int_equal(jint(j, "usage.output_tokens"), 4);
    json_t *block = json_array_get(json_object_get(j, "content"), 0);
    assert_string_equal(jstr(block, "type"), "text");
    assert_string_equal(json_string_value(json_object_get(block, "text")),
                        "tok0 tok1 tok2 tok3");
    json_decref(j);
    http_resp_free(&r);
}

static void test_default_and_cap(void **state)
{
    http_resp r;
    json_t *j;
    (void)state;
    post(OPENAI, NULL, "{\"messages\":[]}", &r, &j);
    assert_int_equal(jint(j, "usage.completion_tokens"), 20);
    assert_int_equal(jint(j, "usage.prompt_tokens"), 0);
    json_decref(j);
    http_resp_free(&r);
    post(ANTHROPIC, NULL, "{\"max_tokens\":999999,\"messages\":[]}", &r, &j);
    assert_int_equal(jint(j, "usage.output_tokens"), 4096);
    json_decref(j);
    http_resp_free(&r);
}

/* ------------------------------------------------------ streaming */

/* Check an OpenAI stream of n tokens; returns the usage chunk's JSON
 * (a new reference) or NULL when there was none. */
static json_t *check_openai_stream(stream *s, int n, int usage_nulls)
{
    char name[64];
    json_t *d, *usage = NULL;
    assert_stream_head(s);
    assert_true(s->complete);
    size_t textlen = 0;
    char text[8192] = "";
    int i = 0, finish = 0;
    for (; i < s->nchunks; i++) {
        event_of(s, i, name, sizeof name, &d);
        assert_string_equal(name, "");
        if (!d)
            break;                     /* [DONE] */
        assert_string_equal(json_string_value(json_object_get(d, "object")),
                            "chat.completion.chunk");
        json_t *choices = json_object_get(d, "choices");
        json_t *u = json_object_get(d, "usage");
        if (json_array_size(choices) == 0) {
            assert_true(finish);       /* the usage chunk comes last */
            assert_null(usage);
            assert_true(json_is_object(u));
            usage = json_incref(u);
        } else {
            assert_null(usage);
            assert_true(usage_nulls ? json_is_null(u) : u == NULL);
            json_t *c0 = json_array_get(choices, 0);
            json_t *delta = json_object_get(c0, "delta");
            const char *fr = jstr(c0, "finish_reason");
            if (i == 0)
                assert_string_equal(json_string_value(json_object_get(delta,
                                    "role")), "assistant");
            if (fr) {
                assert_string_equal(fr, "stop");
                finish = 1;
            } else if (i > 0) {
                const char *t = json_string_value(json_object_get(delta,
                                                                  "content"));
                assert_non_null(t);
                textlen += (size_t)snprintf(text + textlen,
                                            sizeof text - textlen, "%s", t);
            }
        }
        json_decref(d);
    }
    assert_int_equal(i, s->nchunks - 1);   /* [DONE] is the last chunk */
    assert_true(finish);
    char *w = expected_words(n);
    assert_string_equal(text, w);
    free(w);
    /* role + n deltas + finish (+ usage) + [DONE] */
    assert_int_equal(s->nchunks, n + 3 + (usage != NULL));
    return usage;
}

static void test_openai_stream(void **state)
{
    stream s;
    (void)state;
    stream_request(OPENAI, NULL,
        "{\"stream\":true,\"max_tokens\":4,\"messages\":"
        "[{\"role\":\"user\",\"content\":\"12345678\"}]}", &s);
    assert_null(check_openai_stream(&s, 4, 0));
    stream_free(&s);
}

static void test_openai_stream_include_usage(void **state)
{
    stream s;
    (void)state;
    stream_request(OPENAI, NULL,
        "{\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"12345678\"}]}", &s);
    json_t *u = check_openai_stream(&s, 4, 1);
    assert_non_null(u);
    assert_int_equal(jint(u, "prompt_tokens"), 2);
    assert_int_equal(jint(u, "completion_tokens"), 4);
    assert_int_equal(jint(u, "total_tokens"), 6);
    json_decref(u);
    stream_free(&s);
}

static const char *const anthropic_order[] = {
    "message_start", "content_block_start", "ping", "content_block_delta",
    "content_block_stop", "message_delta", "message_stop",
};

/* Check an Anthropic stream of n tokens; usage numbers in *in, *out
 * (-1 when absent). */
static void check_anthropic_stream(stream *s, int n, json_int_t *in,
                                   json_int_t *out)
{
    char name[64], text[8192] = "";
    size_t textlen = 0;
    json_t *d;
    int stage = 0, deltas = 0;
    assert_stream_head(s);
    assert_true(s->complete);
    *in = *out = -1;
    for (int i = 0; i < s->nchunks; i++) {
        event_of(s, i, name, sizeof name, &d);
        assert_non_null(d);
        assert_string_equal(jstr(d, "type"), name);
        /* events come in anthropic_order; content_block_delta repeats */
        while (stage < 7 && strcmp(anthropic_order[stage], name))
            stage++;
        assert_true(stage < 7);
        if (!strcmp(name, "message_start")) {
            json_t *u = json_object_get(json_object_get(d, "message"), "usage");
            if (u) {
                *in = jint(u, "input_tokens");
                assert_int_equal(jint(u, "output_tokens"), 1);
            }
        } else if (!strcmp(name, "content_block_delta")) {
            json_t *delta = json_object_get(d, "delta");
            assert_string_equal(jstr(delta, "type"), "text_delta");
            textlen += (size_t)snprintf(text + textlen, sizeof text - textlen,
                "%s", json_string_value(json_object_get(delta, "text")));
            deltas++;
        } else if (!strcmp(name, "message_delta")) {
            assert_string_equal(json_string_value(json_object_get(
                json_object_get(d, "delta"), "stop_reason")), "end_turn");
            json_t *u = json_object_get(d, "usage");
            if (u)
                *out = jint(u, "output_tokens");
        }
        json_decref(d);
        if (stage != 3)
            stage++;                   /* each other event comes once */
    }
    assert_int_equal(stage, 7);
    assert_int_equal(deltas, n);
    char *w = expected_words(n);
    assert_string_equal(text, w);
    free(w);
}

static void test_anthropic_stream(void **state)
{
    stream s;
    json_int_t in, out;
    (void)state;
    stream_request(ANTHROPIC, NULL,
        "{\"stream\":true,\"max_tokens\":5,\"system\":[{\"type\":\"text\","
        "\"text\":\"abc\"}],\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hello\"}]}", &s);
    check_anthropic_stream(&s, 5, &in, &out);
    assert_int_equal(in, 2);           /* ceil(8 / 4) */
    /* cumulative: the total, not the increment over message_start's 1 */
    assert_int_equal(out, 5);
    assert_int_equal(s.nchunks, 5 + 6);
    stream_free(&s);
}

static void test_slow(void **state)
{
    stream s;
    json_int_t in, out;
    (void)state;
    long long t0 = now_ms();
    stream_request(ANTHROPIC, "slow=60",
                   "{\"stream\":true,\"max_tokens\":2,\"messages\":[]}", &s);
    check_anthropic_stream(&s, 2, &in, &out);
    assert_int_equal(s.nchunks, 8);
    /* 7 gaps of 60 ms; allow timer slack below, none needed above */
    for (int i = 1; i < s.nchunks; i++)
        assert_true(s.chunks[i].at_ms - s.chunks[i - 1].at_ms >= 50);
    assert_true(now_ms() - t0 >= 7 * 60 - 10);
    stream_free(&s);

    /* default: 5 ms apart, so 8 events well under 60 ms each */
    stream_request(ANTHROPIC, NULL,
                   "{\"stream\":true,\"max_tokens\":2,\"messages\":[]}", &s);
    assert_true(s.chunks[s.nchunks - 1].at_ms - s.chunks[0].at_ms < 7 * 50);
    stream_free(&s);
}

static void test_reset_after(void **state)
{
    stream s;
    char name[64];
    json_t *d;
    (void)state;
    stream_request(ANTHROPIC, "reset-after=4",
                   "{\"stream\":true,\"max_tokens\":5,\"messages\":[]}", &s);
    assert_stream_head(&s);
    assert_false(s.complete);          /* no terminal chunk */
    assert_true(s.reset);              /* RST, not a clean close */
    assert_int_equal(s.nchunks, 4);    /* exactly the first four events */
    event_of(&s, 3, name, sizeof name, &d);
    assert_string_equal(name, "content_block_delta");
    json_decref(d);
    stream_free(&s);

    stream_request(OPENAI, "reset-after=0",
                   "{\"stream\":true,\"messages\":[]}", &s);
    assert_int_equal(s.status, 200);
    assert_false(s.complete);
    assert_int_equal(s.nchunks, 0);
    stream_free(&s);

    /* close-after: a FIN, not an RST, and still no terminal chunk */
    stream_request(OPENAI, "close-after=2",
                   "{\"stream\":true,\"messages\":[]}", &s);
    assert_int_equal(s.status, 200);
    assert_false(s.complete);
    assert_false(s.reset);
    assert_int_equal(s.nchunks, 2);
    stream_free(&s);

    /* the double lives on */
    json_t *c = get_json("/_double/count");
    assert_true(jint(c, "count") > 0);
    json_decref(c);
}

static void test_no_usage(void **state)
{
    http_resp r;
    json_t *j, *u;
    stream s;
    json_int_t in, out;
    (void)state;
    post(OPENAI, "no-usage", "{\"messages\":[]}", &r, &j);
    assert_int_equal(r.status, 200);
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    http_resp_free(&r);
    post(ANTHROPIC, "no-usage", "{\"messages\":[]}", &r, &j);
    assert_int_equal(r.status, 200);
    assert_null(json_object_get(j, "usage"));
    json_decref(j);
    http_resp_free(&r);

    /* asked for, but none comes: no usage chunk, no usage: null */
    stream_request(OPENAI, "no-usage",
        "{\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"max_tokens\":3,\"messages\":[]}", &s);
    u = check_openai_stream(&s, 3, 0);
    assert_null(u);
    stream_free(&s);

    stream_request(ANTHROPIC, "slow=0, no-usage",
                   "{\"stream\":true,\"max_tokens\":3,\"messages\":[]}", &s);
    check_anthropic_stream(&s, 3, &in, &out);
    assert_int_equal(in, -1);
    assert_int_equal(out, -1);
    stream_free(&s);
}

static void test_status_429(void **state)
{
    http_resp r;
    json_t *j;
    (void)state;
    /* even a streaming request gets a plain JSON error */
    assert_int_equal(post(OPENAI, "status=429",
                          "{\"stream\":true,\"messages\":[]}", &r, &j), 429);
    assert_string_equal(http_resp_header(&r, "Retry-After"), "2");
    assert_non_null(strstr(http_resp_header(&r, "Content-Type"), "json"));
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")),
                        "rate_limit_exceeded");
    assert_non_null(json_string_value(json_object_get(e, "message")));
    json_decref(j);
    http_resp_free(&r);

    assert_int_equal(post(ANTHROPIC, "status=429", "{\"messages\":[]}", &r,
                          &j), 429);
    assert_string_equal(http_resp_header(&r, "Retry-After"), "2");
    assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(j, "error"), "type")), "rate_limit_error");
    json_decref(j);
    http_resp_free(&r);
}

static void test_status_500(void **state)
{
    http_resp r;
    json_t *j;
    (void)state;
    assert_int_equal(post(OPENAI, "status=500", "{\"messages\":[]}", &r, &j),
                     500);
    assert_null(http_resp_header(&r, "Retry-After"));
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(j, "error"), "type")), "server_error");
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post(ANTHROPIC, "status=500", "{\"messages\":[]}", &r,
                          &j), 500);
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(j, "error"), "type")), "api_error");
    json_decref(j);
    http_resp_free(&r);
}

static void test_hang(void **state)
{
    httpc c;
    http_resp r;
    const char *hdrs[] = { "X-Double-Mode: hang", NULL };
    (void)state;
    httpc_init(&c, dbl_port);
    c.timeout_ms = 300;
    long long t0 = now_ms();
    /* no answer: the client's wait times out */
    assert_int_equal(httpc_request(&c, "POST", ANTHROPIC, hdrs, "{}", 2, &r),
                     -1);
    assert_true(now_ms() - t0 >= 250);
    httpc_close(&c);
}

static void test_last_and_count(void **state)
{
    httpc c;
    http_resp r;
    const char *hdrs[] = { "Authorization: Bearer sk-upstream-credential",
                           "X-Probe: one", "X-Probe: two", NULL };
    const char *body = "{\"model\":\"m\",\"messages\":[]}";
    (void)state;
    json_t *before = get_json("/_double/count");
    httpc_init(&c, dbl_port);
    assert_int_equal(httpc_request(&c, "POST", OPENAI, hdrs, body,
                                   strlen(body), &r), 0);
    assert_int_equal(r.status, 200);
    http_resp_free(&r);
    httpc_close(&c);

    json_t *last = get_json("/_double/last");
    assert_string_equal(json_string_value(json_object_get(last, "method")),
                        "POST");
    assert_string_equal(json_string_value(json_object_get(last, "path")),
                        OPENAI);
    json_t *h = json_object_get(last, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "authorization")),
                        "Bearer sk-upstream-credential");
    assert_string_equal(json_string_value(json_object_get(h, "x-probe")),
                        "one, two");
    assert_null(json_object_get(h, "x-api-key"));
    assert_string_equal(json_string_value(json_object_get(last, "body")), body);
    assert_string_equal(json_string_value(json_object_get(json_object_get(
        last, "body_json"), "model")), "m");
    json_decref(last);

    json_t *after = get_json("/_double/count");
    assert_int_equal(jint(after, "count"), jint(before, "count") + 1);
    json_decref(before);
    json_decref(after);
}

static void test_bad_mode_and_route(void **state)
{
    http_resp r;
    json_t *j;
    (void)state;
    assert_int_equal(post(OPENAI, "slow=fast", "{}", &r, &j), 400);
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post(ANTHROPIC, "explode", "{}", &r, &j), 400);
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post(OPENAI, NULL, "not json", &r, &j), 400);
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post("/v1/nothing", NULL, "{}", &r, &j), 404);
    json_decref(j);
    http_resp_free(&r);
}

/* flood=N: N content events of 1024 bytes of text ("tok<i>" then dots),
 * one per chunk, then the finish and usage chunks (completion tokens N);
 * /_double/stats counts the stream's body bytes and its end.  Without a
 * stream (or for the Anthropic shape) flood is a 400. */
static void test_flood(void **state)
{
    stream s;
    json_t *st0 = get_json("/_double/stats"), *st1, *j;
    char name[64], want[32];
    size_t body = 0;
    http_resp r;
    (void)state;
    stream_request(OPENAI, "flood=3",
        "{\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"12345678\"}]}", &s);
    assert_stream_head(&s);
    assert_true(s.complete);
    assert_int_equal(s.nchunks, 7);    /* role, 3 content, finish, usage, DONE */
    for (int i = 0; i < s.nchunks; i++)
        body += s.chunks[i].len;
    for (int i = 1; i <= 3; i++) {
        event_of(&s, i, name, sizeof name, &j);
        const char *t = jstr(json_array_get(json_object_get(j, "choices"),
                                            0), "delta.content");
        assert_non_null(t);
        assert_int_equal(strlen(t), 1024);
        snprintf(want, sizeof want, "tok%d.", i - 1);
        assert_int_equal(strncmp(t, want, strlen(want)), 0);
        assert_int_equal(strspn(t + strlen(want) - 1, "."),
                         1024 - strlen(want) + 1);
        json_decref(j);
    }
    event_of(&s, 5, name, sizeof name, &j);
    assert_int_equal(jint(j, "usage.completion_tokens"), 3);
    assert_int_equal(jint(j, "usage.prompt_tokens"), 2);
    json_decref(j);
    stream_free(&s);
    st1 = get_json("/_double/stats");
    assert_int_equal(jint(st1, "flood_bytes") - jint(st0, "flood_bytes"),
                     (json_int_t)body);
    assert_int_equal(jint(st1, "floods") - jint(st0, "floods"), 1);
    assert_int_equal(jint(st1, "floods_done") - jint(st0, "floods_done"), 1);
    json_decref(st0);
    json_decref(st1);
    assert_int_equal(post(OPENAI, "flood=3", "{\"max_tokens\":2}", &r, &j),
                     400);
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post(ANTHROPIC, "flood=3", "{\"stream\":true}", &r, &j),
                     400);
    json_decref(j);
    http_resp_free(&r);
}

/* big=MIB: the text is MIB MiB of 'x' with Content-Length (big-chunked:
 * chunked), the rest of the body as usual; a client that leaves in the
 * middle of one does not upset the double.  With a stream, a 400. */
static void test_big(void **state)
{
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons((uint16_t)dbl_port) };
    const char *req = "POST " OPENAI " HTTP/1.1\r\nHost: x\r\n"
                      "X-Double-Mode: big=64\r\nContent-Length: 2\r\n\r\n{}";
    char buf[4096];
    http_resp r;
    json_t *j, *c;
    const char *t;
    (void)state;
    assert_int_equal(post(OPENAI, "big=1", "{\"max_tokens\":3}", &r, &j),
                     200);
    assert_int_equal(atol(http_resp_header(&r, "Content-Length")),
                     (long)r.body_len);
    t = jstr(json_array_get(json_object_get(j, "choices"), 0),
             "message.content");
    assert_non_null(t);
    assert_int_equal(strlen(t), 1u << 20);
    assert_int_equal(strspn(t, "x"), 1u << 20);
    assert_int_equal(jint(j, "usage.completion_tokens"), 3);
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post(ANTHROPIC, "big-chunked=2", "{}", &r, &j), 200);
    assert_null(http_resp_header(&r, "Content-Length"));
    assert_non_null(strcasestr(http_resp_header(&r, "Transfer-Encoding"),
                               "chunked"));
    t = json_string_value(json_object_get(json_array_get(
        json_object_get(j, "content"), 0), "text"));
    assert_non_null(t);
    assert_int_equal(strlen(t), 2u << 20);
    json_decref(j);
    http_resp_free(&r);
    assert_int_equal(post(OPENAI, "big=1", "{\"stream\":true}", &r, &j), 400);
    json_decref(j);
    http_resp_free(&r);
    /* read a little of 64 MiB, then leave */
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(read(fd, buf, sizeof buf) > 0);
    close(fd);
    usleep(100000);
    c = get_json("/_double/count");
    json_decref(c);
}

/* twice: the answer, its own Content-Length, then a second complete
 * response in the same write; the connection then serves normally.
 * close: Connection: close, and the double closes.  /_double/last names
 * the client's port. */
static void test_twice_close_peer(void **state)
{
    const char *req = "POST " OPENAI " HTTP/1.1\r\nHost: x\r\n"
                      "X-Double-Mode: twice\r\nContent-Length: 16\r\n\r\n"
                      "{\"max_tokens\":2}";
    const char *plain = "POST " OPENAI " HTTP/1.1\r\nHost: x\r\n"
                        "Content-Length: 16\r\n\r\n{\"max_tokens\":2}";
    char buf[8192] = "";
    const char *second;
    size_t got = 0;
    httpc c;
    http_resp r;
    json_t *j, *last;
    (void)state;
    httpc_init(&c, dbl_port);
    assert_int_equal(httpc_connect(&c), 0);
    assert_int_equal(httpc_send_raw(&c, req, strlen(req)),
                     (long)strlen(req));
    /* both responses: read until the second one's body has ended */
    while (!((second = strstr(buf, "}}HTTP/1.1 200 OK\r\n")) &&
             strstr(second, "stale second response") &&
             strstr(second, "\"total_tokens\"") &&
             buf[got - 1] == '}')) {
        assert_true(got < sizeof buf - 1);
        assert_int_equal(httpc_wait_readable(&c, 5000), 1);
        ssize_t k = recv(c.fd, buf + got, sizeof buf - 1 - got, 0);
        assert_true(k > 0);
        got += (size_t)k;
        buf[got] = '\0';
    }
    assert_non_null(strstr(buf, "\"tok0 tok1\""));
    assert_null(strstr(second, "tok0"));
    /* the first's Content-Length is its own body's */
    assert_int_equal(atol(strcasestr(buf, "Content-Length: ") + 16),
                     (long)(second + 2 - (strstr(buf, "\r\n\r\n") + 4)));
    /* the same connection answers the next request normally */
    assert_int_equal(httpc_send_raw(&c, plain, strlen(plain)),
                     (long)strlen(plain));
    assert_int_equal(httpc_read_response(&c, 0, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"tok0 tok1\""));
    assert_null(strstr(r.body, "stale"));
    http_resp_free(&r);
    httpc_close(&c);
    assert_int_equal(post(OPENAI, "close", "{\"max_tokens\":2}", &r, &j), 200);
    assert_string_equal(http_resp_header(&r, "Connection"), "close");
    assert_true(r.closed);
    json_decref(j);
    http_resp_free(&r);
    last = get_json("/_double/last");
    assert_true(jint(last, "peer_port") > 0);
    json_decref(last);
}

/* A client that leaves mid-stream must not upset the double. */
static void test_client_leaves(void **state)
{
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons((uint16_t)dbl_port) };
    const char *req = "POST " OPENAI " HTTP/1.1\r\nHost: x\r\n"
                      "X-Double-Mode: slow=20\r\nContent-Length: 17\r\n\r\n"
                      "{\"stream\":true}  ";
    char buf[512];
    (void)state;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(read(fd, buf, sizeof buf) > 0);
    close(fd);
    usleep(100000);                    /* a few ticks into the void */
    json_t *c = get_json("/_double/count");
    json_decref(c);
}

static void test_shutdown(void **state)
{
    (void)state;
    assert_int_equal(stop_double(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_plain),
        cmocka_unit_test(test_anthropic_plain),
        cmocka_unit_test(test_default_and_cap),
        cmocka_unit_test(test_openai_stream),
        cmocka_unit_test(test_openai_stream_include_usage),
        cmocka_unit_test(test_anthropic_stream),
        cmocka_unit_test(test_slow),
        cmocka_unit_test(test_reset_after),
        cmocka_unit_test(test_no_usage),
        cmocka_unit_test(test_status_429),
        cmocka_unit_test(test_status_500),
        cmocka_unit_test(test_hang),
        cmocka_unit_test(test_last_and_count),
        cmocka_unit_test(test_bad_mode_and_route),
        cmocka_unit_test(test_flood),
        cmocka_unit_test(test_client_leaves),
        cmocka_unit_test(test_big),
        cmocka_unit_test(test_twice_close_peer),
        cmocka_unit_test(test_shutdown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
