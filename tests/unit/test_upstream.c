/* test_upstream.c - the upstream client's response reader
 * (src/proxy/upstream.c) on a real loopback connection, in this thread:
 * a listening socket stands for the upstream, an event base is pumped
 * here (as fuzz/fuzz_upstream_response.c does), and each test writes an
 * answer byte for byte as given, then checks what the caller was handed
 * (on_head, on_body, on_done) and whether the connection went back to the
 * pool (counted inside on_done, when the client has just decided).
 *
 * The cases are the reader's rules (upstream.h, docs/proxy.md): interim
 * responses are skipped, a 101 is refused, the parser stops at the end of
 * the answer, and bytes after it close the connection. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "upstream.h"

#define PUMP_LIMIT 100000

static const char REQ[] = "POST /v1/chat/completions HTTP/1.1\r\n"
                          "Host: upstream\r\nContent-Length: 2\r\n\r\n{}";

static struct event_base *base;
static qg_upstream *up;
static int lfd = -1;

typedef struct seen {
    int heads, dones, err;
    qg_upresp head;
    char body[65536];
    size_t blen;
    size_t conns_at_done;       /* open connections when on_done came */
} seen;

static seen S;

static void s_head(void *ud, const qg_upresp *r)
{
    (void)ud;
    if (S.heads++ == 0)
        S.head = *r;
}

static void s_body(void *ud, const char *data, size_t len)
{
    (void)ud;
    assert_true(S.blen + len <= sizeof S.body);
    memcpy(S.body + S.blen, data, len);
    S.blen += len;
}

static void s_done(void *ud, int err)
{
    (void)ud;
    if (S.dones++ == 0) {
        S.err = err;
        S.conns_at_done = qg__upstream_connections(up);
    }
}

static const qg_upcall_cbs cbs = {s_head, s_body, s_done, NULL};

static void pump(void)
{
    for (int i = 0; i < 2; i++)
        event_base_loop(base, EVLOOP_NONBLOCK);
}

/* One call answered with text (sent in one write); then the upstream's
 * half-close, and every connection gone before returning. */
static void answer(const char *text, size_t len)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    char buf[4096];
    size_t req = 0, off = 0;
    int fd = -1, turns = 0;
    memset(&S, 0, sizeof S);
    assert_non_null(qg__upstream_send(up, 0, base, REQ, sizeof REQ - 3,
                                     REQ + sizeof REQ - 3, 2, &cbs, NULL));
    while (fd < 0 || req < sizeof REQ - 1) {
        ssize_t k;
        pump();
        if (fd < 0)
            fd = accept4(lfd, (struct sockaddr *)&a, &alen, SOCK_NONBLOCK);
        if (fd >= 0 && (k = recv(fd, buf, sizeof buf, 0)) > 0)
            req += (size_t)k;
        assert_true(++turns < PUMP_LIMIT);
    }
    while (off < len) {
        ssize_t k = send(fd, text + off, len - off, MSG_NOSIGNAL);
        if (k < 0 && errno != EAGAIN)
            break;                  /* the client closed: it said why */
        if (k > 0)
            off += (size_t)k;
        pump();
    }
    pump();
    shutdown(fd, SHUT_WR);
    for (turns = 0; !S.dones || qg__upstream_connections(up) > 0; turns++) {
        pump();
        assert_true(turns < PUMP_LIMIT);
    }
    close(fd);
    assert_int_equal(S.dones, 1);
}

#define ANSWER(lit) answer((lit), sizeof (lit) - 1)

static int group_setup(void **state)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof a;
    char url[64], err[256];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!base || lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) ||
        listen(lfd, 16) || getsockname(lfd, (struct sockaddr *)&a, &len))
        return -1;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
    up = qg__upstream_new(url, 1, 600000, NULL, err, sizeof err);
    return up ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    qg__upstream_free(up);
    close(lfd);
    event_base_free(base);
    return 0;
}

/* ============================================================== tests */

/* A plain keep-alive answer: handed over whole, the connection pooled. */
static void test_plain(void **state)
{
    (void)state;
    ANSWER("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
           "Content-Length: 2\r\n\r\n{}");
    assert_int_equal(S.err, QG_UP_OK);
    assert_int_equal(S.heads, 1);
    assert_int_equal(S.head.status, 200);
    assert_string_equal(S.head.ctype, "application/json");
    assert_int_equal(S.blen, 2);
    assert_memory_equal(S.body, "{}", 2);
    assert_int_equal(S.conns_at_done, 1);
}

/* Interim responses (RFC 9110 15.2) come before the answer and are
 * skipped, their headers too (found by fuzz_upstream_response: a 199
 * head was taken for the answer, and the call ended QG_UP_OK with it). */
static void test_interim_skipped(void **state)
{
    (void)state;
    ANSWER("HTTP/1.1 100 Continue\r\n\r\n"
           "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n"
           "Content-Type: text/html\r\nRetry-After: 7\r\n\r\n"
           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
           "Content-Length: 2\r\n\r\n{}");
    assert_int_equal(S.err, QG_UP_OK);
    assert_int_equal(S.heads, 1);
    assert_int_equal(S.head.status, 200);
    assert_string_equal(S.head.ctype, "application/json");
    assert_string_equal(S.head.retry_after, "");
    assert_int_equal(S.blen, 2);
    assert_int_equal(S.conns_at_done, 1);
    /* the finding's reproducer: an interim head, then no answer */
    ANSWER("HTTP/1.1 199 Oent-Type: application/json\r\n"
           "CConnection: close\r\n\n{}");
    assert_int_equal(S.heads, 0);
    assert_int_equal(S.err, QG_UP_EPROTO);
    /* an interim response and then the close: no answer came */
    ANSWER("HTTP/1.1 100 Continue\r\n\r\n");
    assert_int_equal(S.heads, 0);
    assert_int_equal(S.err, QG_UP_ECONN);
}

/* 101 Switching Protocols was never asked for: refused, nothing handed
 * over, with or without the upgrade headers. */
static void test_switching_protocols_refused(void **state)
{
    (void)state;
    ANSWER("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
           "Connection: upgrade\r\n\r\nHTTP/1.1 200 OK\r\n"
           "Content-Length: 2\r\n\r\n{}");
    assert_int_equal(S.heads, 0);
    assert_int_equal(S.err, QG_UP_EPROTO);
    ANSWER("HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\n"
           "Content-Length: 2\r\n\r\n{}");
    assert_int_equal(S.heads, 0);
    assert_int_equal(S.err, QG_UP_EPROTO);
}

/* Two responses in one write: only the first reaches the caller, and the
 * connection is closed (issue 8). */
static void test_two_in_one_write(void **state)
{
    (void)state;
    ANSWER("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
           "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
    assert_int_equal(S.err, QG_UP_OK);
    assert_int_equal(S.heads, 1);
    assert_int_equal(S.blen, 5);
    assert_memory_equal(S.body, "first", 5);
    assert_int_equal(S.conns_at_done, 0);
    /* chunked, with a stray byte after the last chunk */
    ANSWER("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nfirst\r\n0\r\n\r\nx");
    assert_int_equal(S.err, QG_UP_OK);
    assert_int_equal(S.blen, 5);
    assert_int_equal(S.conns_at_done, 0);
}

/* An answer that fills the client's read buffer exactly (16384 bytes)
 * with a byte waiting behind it: the connection is not pooled. */
static void test_bytes_behind_a_full_read(void **state)
{
    static char text[16384 + 1];
    const char *head = "HTTP/1.1 200 OK\r\nContent-Length: ";
    char h[128];
    size_t body;
    int n;
    (void)state;
    /* the head's length depends on the digits of the body's */
    body = 16384 - strlen(head) - 9;            /* 5 digits + 2 CRLFs */
    n = snprintf(h, sizeof h, "%s%zu\r\n\r\n", head, body);
    assert_int_equal((size_t)n + body, 16384);
    memcpy(text, h, (size_t)n);
    memset(text + n, 'b', body);
    text[16384] = 'x';
    answer(text, sizeof text);
    assert_int_equal(S.err, QG_UP_OK);
    assert_int_equal(S.blen, body);
    assert_int_equal(S.conns_at_done, 0);
    /* the same answer alone is pooled */
    answer(text, 16384);
    assert_int_equal(S.err, QG_UP_OK);
    assert_int_equal(S.conns_at_done, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_interim_skipped),
        cmocka_unit_test(test_switching_protocols_refused),
        cmocka_unit_test(test_two_in_one_write),
        cmocka_unit_test(test_bytes_behind_a_full_read),
    };
    return cmocka_run_group_tests_name("upstream", tests, group_setup,
                                       group_teardown);
}
