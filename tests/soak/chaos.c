/* chaos.c - the soak test's misbehaving clients (make soak, tests/soak/soak.sh).
 *
 *   chaos PORT SECONDS THREADS SERVICE_KEY SUBJECT_KEY [SEED]
 *
 * THREADS threads, each looping for SECONDS over randomly chosen ways of
 * treating a gateway badly: connecting and leaving at once, sending half a
 * request head, closing a streamed proxy call after its first bytes (FIN or
 * a reset), asking for upstream failures (reset, close, 500, hang), sending
 * malformed JSON, settling unknown ids, leaving before the answer to a
 * check arrives, and a plain healthy check that must answer.  What comes
 * back is tallied by kind; the only failures it reports are answers a
 * working gateway never gives (a healthy request refused, a connection
 * refused, a malformed request not answered 4xx).  At the end one line:
 *
 *   chaos: N actions, H healthy ok, F failures, <counts per action>
 *
 * and the exit status is 1 when F > 0.  Plain sockets and pthreads: the
 * point is to behave like a careless client, which an HTTP library would
 * not let us do.  Each thread has its own xorshift state (SEED + thread). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { A_CONNECT_CLOSE, A_HALF_HEAD, A_STREAM_FIN, A_STREAM_RST,
       A_UPSTREAM_FAULT, A_BAD_JSON, A_SETTLE_UNKNOWN, A_CHECK_LEAVE,
       A_PIPELINE_LEAVE, A_HEALTHY, A_COUNT };

static const char *const action_name[A_COUNT] = {
    "connect_close", "half_head", "stream_fin", "stream_rst",
    "upstream_fault", "bad_json", "settle_unknown", "check_leave",
    "pipeline_leave", "healthy",
};

static int port;
static const char *service_key, *subject_key;
static time_t end_at;
static atomic_long counts[A_COUNT], healthy_ok, failures;

static void failure(const char *what, const char *detail)
{
    long n = atomic_fetch_add(&failures, 1);
    if (n < 20)                 /* the first few, then only the count */
        fprintf(stderr, "chaos: %s: %.200s\n", what, detail);
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* A connected socket, or -1 (reported as a failure: the gateway must
 * always accept). */
static int dial(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((unsigned short)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        failure("connect", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Read until the peer closes, `want` bytes arrived, or timeout_ms passed
 * without progress.  Returns the bytes read (NUL-terminated in buf). */
static size_t read_some(int fd, char *buf, size_t cap, size_t want,
                        int timeout_ms)
{
    size_t got = 0;
    while (got + 1 < cap && got < want) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t r;
        if (poll(&p, 1, timeout_ms) <= 0)
            break;
        r = recv(fd, buf + got, cap - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    buf[got] = '\0';
    return got;
}

/* Close with a reset instead of a FIN. */
static void close_rst(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

static int request(char *out, size_t cap, const char *path, const char *key,
                   const char *extra, const char *body)
{
    return snprintf(out, cap,
                    "POST %s HTTP/1.1\r\nHost: soak\r\n"
                    "Authorization: Bearer %s\r\n"
                    "Content-Type: application/json\r\n%s"
                    "Content-Length: %zu\r\n\r\n%s",
                    path, key, extra ? extra : "", strlen(body), body);
}

static const char *chat_body(int stream)
{
    return stream
        ? "{\"model\":\"light\",\"stream\":true,\"messages\":[{\"role\":"
          "\"user\",\"content\":\"soak\"}],\"max_tokens\":40}"
        : "{\"model\":\"light\",\"messages\":[{\"role\":\"user\","
          "\"content\":\"soak\"}],\"max_tokens\":8}";
}

static int status_of(const char *resp)
{
    int st = 0;
    if (sscanf(resp, "HTTP/1.%*d %d", &st) != 1)
        return 0;
    return st;
}

static void act(int a, uint64_t *rs, long seq, int tid)
{
    char req[2048], resp[8192], id[96], body[256];
    int fd = dial(), st;
    if (fd < 0)
        return;
    snprintf(id, sizeof id, "chaos-%d-%ld-%llx", tid, seq,
             (unsigned long long)(next_rand(rs) & 0xffffff));
    switch (a) {
    case A_CONNECT_CLOSE:
        break;
    case A_HALF_HEAD: {
        int n = request(req, sizeof req, "/v1/check", service_key, NULL,
                        "{}");
        send_all(fd, req, (size_t)(n / 2));
        break;
    }
    case A_STREAM_FIN:
    case A_STREAM_RST: {
        int n = request(req, sizeof req, "/v1/chat/completions", subject_key,
                        "Accept: text/event-stream\r\nX-Double-Mode: slow=20\r\n",
                        chat_body(1));
        send_all(fd, req, (size_t)n);
        read_some(fd, resp, sizeof resp, 200 + next_rand(rs) % 1500, 5000);
        if (a == A_STREAM_RST) {
            close_rst(fd);
            fd = -1;
        }
        break;
    }
    case A_UPSTREAM_FAULT: {
        static const char *const modes[] = {
            "reset-after=2", "close-after=3", "status=500", "status=429",
            "no-usage", "hang",
        };
        const char *m = modes[next_rand(rs) % 6];
        int stream = (int)(next_rand(rs) & 1);
        char extra[128];
        snprintf(extra, sizeof extra, "X-Double-Mode: %s%s\r\n", m,
                 stream ? ",slow=5" : "");
        int n = request(req, sizeof req, "/v1/chat/completions", subject_key,
                        extra, chat_body(stream));
        send_all(fd, req, (size_t)n);
        /* a hang is left by us after a while (the gateway's upstream
         * timeout may or may not have fired: both are fine) */
        read_some(fd, resp, sizeof resp, sizeof resp, 3000);
        break;
    }
    case A_BAD_JSON: {
        static const char *const bad[] = {
            "{", "{\"subject\":", "[1,2", "{\"subject\":\"s\",\"weight\":-1,"
            "\"request_id\":\"x\"}", "\"\\ud800\"", "{\"a\":1,\"a\":2}",
        };
        int n = request(req, sizeof req, "/v1/check", service_key,
                        "Connection: close\r\n", bad[next_rand(rs) % 6]);
        send_all(fd, req, (size_t)n);
        read_some(fd, resp, sizeof resp, sizeof resp, 5000);
        st = status_of(resp);
        if (st < 400 || st >= 500)
            failure("malformed JSON not answered 4xx", resp);
        break;
    }
    case A_SETTLE_UNKNOWN: {
        snprintf(body, sizeof body, "{\"request_id\":\"%s-never\",\"weight\":1,"
                 "\"status\":\"completed\"}", id);
        int n = request(req, sizeof req, "/v1/settle", service_key,
                        "Connection: close\r\n", body);
        send_all(fd, req, (size_t)n);
        read_some(fd, resp, sizeof resp, sizeof resp, 5000);
        st = status_of(resp);
        if (st < 400 || st >= 500)
            failure("settle of an unknown id not answered 4xx", resp);
        break;
    }
    case A_CHECK_LEAVE: {
        snprintf(body, sizeof body, "{\"subject\":\"soak\",\"request_id\":"
                 "\"%s\",\"weight\":1}", id);
        int n = request(req, sizeof req, "/v1/check", service_key, NULL, body);
        send_all(fd, req, (size_t)n);
        break;
    }
    case A_PIPELINE_LEAVE: {
        char two[4096];
        int n;
        snprintf(body, sizeof body, "{\"subject\":\"soak\",\"request_id\":"
                 "\"%s\",\"weight\":2}", id);
        n = request(two, sizeof two, "/v1/check", service_key, NULL, body);
        snprintf(body, sizeof body, "{\"request_id\":\"%s\",\"weight\":1,"
                 "\"status\":\"completed\"}", id);
        n += request(two + n, sizeof two - (size_t)n, "/v1/settle",
                     service_key, NULL, body);
        send_all(fd, two, (size_t)n);
        if (next_rand(rs) & 1)
            read_some(fd, resp, sizeof resp, 100, 2000);
        close_rst(fd);
        fd = -1;
        break;
    }
    case A_HEALTHY: {
        snprintf(body, sizeof body, "{\"subject\":\"soak\",\"request_id\":"
                 "\"%s\",\"weight\":1}", id);
        int n = request(req, sizeof req, "/v1/check", service_key,
                        "Connection: close\r\n", body);
        send_all(fd, req, (size_t)n);
        read_some(fd, resp, sizeof resp, sizeof resp, 10000);
        st = status_of(resp);
        if (st == 200)
            atomic_fetch_add(&healthy_ok, 1);
        else
            failure("a healthy check was not admitted", resp);
        break;
    }
    }
    if (fd >= 0)
        close(fd);
}

static void *run(void *arg)
{
    int tid = (int)(intptr_t)arg;
    uint64_t rs = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)tid * 0x100000001b3ULL);
    long seq = 0;
    const char *seed = getenv("CHAOS_SEED");
    if (seed)
        rs ^= strtoull(seed, NULL, 10);
    if (!rs)
        rs = 1;
    while (time(NULL) < end_at) {
        int a = (int)(next_rand(&rs) % A_COUNT);
        act(a, &rs, seq++, tid);
        atomic_fetch_add(&counts[a], 1);
        /* a careless client, not a flood: a few hundred actions a second
         * over all threads */
        usleep(2000 + (useconds_t)(next_rand(&rs) % 8000));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t th[64];
    int n, i;
    long total = 0;
    if (argc < 6) {
        fprintf(stderr, "usage: chaos PORT SECONDS THREADS SERVICE_KEY "
                "SUBJECT_KEY\n");
        return 2;
    }
    port = atoi(argv[1]);
    end_at = time(NULL) + atol(argv[2]);
    n = atoi(argv[3]);
    if (n < 1 || n > 64 || port <= 0) {
        fprintf(stderr, "chaos: bad PORT or THREADS (1..64)\n");
        return 2;
    }
    service_key = argv[4];
    subject_key = argv[5];
    for (i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, run, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "chaos: pthread_create failed\n");
            return 2;
        }
    for (i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (i = 0; i < A_COUNT; i++)
        total += atomic_load(&counts[i]);
    printf("chaos: %ld actions, %ld healthy ok, %ld failures,", total,
           atomic_load(&healthy_ok), atomic_load(&failures));
    for (i = 0; i < A_COUNT; i++)
        printf(" %s=%ld", action_name[i], atomic_load(&counts[i]));
    printf("\n");
    return atomic_load(&failures) > 0;
}
