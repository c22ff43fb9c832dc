/* httpc.c - a small blocking HTTP/1.1 client for tests (see httpc.h). */
#include "httpc.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void seterr(httpc *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void seterr(httpc *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void httpc_init(httpc *c, int port)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->port = port;
    c->timeout_ms = 10000;
}

static void drop(httpc *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->len = 0;
}

void httpc_close(httpc *c)
{
    drop(c);
    free(c->buf);
    c->buf = NULL;
    c->cap = 0;
}

void httpc_set_port(httpc *c, int port)
{
    drop(c);
    c->port = port;
}

int httpc_connect(httpc *c)
{
    struct sockaddr_in sa;
    int one = 1, fd;
    if (c->fd >= 0)
        return 0;
    c->len = 0;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        seterr(c, "socket: %s", strerror(errno));
        return -1;
    }
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)c->port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        seterr(c, "connect 127.0.0.1:%d: %s", c->port, strerror(errno));
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->connects++;
    return 0;
}

int httpc_wait_readable(httpc *c, int ms)
{
    struct pollfd pf;
    int n;
    if (c->fd < 0)
        return -1;
    if (c->len)
        return 1;
    pf.fd = c->fd;
    pf.events = POLLIN;
    pf.revents = 0;
    do
        n = poll(&pf, 1, ms);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    return n > 0;
}

long httpc_send_raw(httpc *c, const void *data, size_t len)
{
    const char *p = data;
    size_t sent = 0;
    long long deadline = mono_ms() + c->timeout_ms;
    if (httpc_connect(c) < 0)
        return -1;
    while (sent < len) {
        ssize_t n = send(c->fd, p + sent, len - sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = { c->fd, POLLOUT, 0 };
            long long left = deadline - mono_ms();
            if (left <= 0) {
                seterr(c, "send timed out");
                return (long)sent;
            }
            poll(&pf, 1, (int)left);
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            seterr(c, "send: %s", strerror(errno));
            return (long)sent;
        }
        seterr(c, "send: %s", strerror(errno));
        return -1;
    }
    return (long)sent;
}

/* Read more bytes into the buffer, waiting until deadline.  Returns bytes
 * read, 0 at EOF, -1 on error or timeout. */
static long fill(httpc *c, long long deadline)
{
    struct pollfd pf;
    ssize_t n;
    if (c->fd < 0) {
        seterr(c, "not connected");
        return -1;
    }
    if (c->cap - c->len < 4096) {
        size_t nc = c->cap ? c->cap * 2 : 16384;
        char *nb = realloc(c->buf, nc);
        if (!nb) {
            seterr(c, "out of memory");
            return -1;
        }
        c->buf = nb;
        c->cap = nc;
    }
    for (;;) {
        long long left = deadline - mono_ms();
        if (left <= 0) {
            seterr(c, "timed out after %d ms waiting for the response",
                   c->timeout_ms);
            return -1;
        }
        pf.fd = c->fd;
        pf.events = POLLIN;
        pf.revents = 0;
        n = poll(&pf, 1, (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            seterr(c, "poll: %s", strerror(errno));
            return -1;
        }
        if (n == 0)
            continue;
        n = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            seterr(c, "recv: %s", strerror(errno));
            return -1;
        }
        c->len += (size_t)n;
        c->buf[c->len] = '\0';
        return (long)n;
    }
}

/* Drop n bytes from the front, keeping the NUL fill() put after them. */
static void consume(httpc *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n + 1);
    c->len -= n;
}

static char *dupn(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static char *find_crlf(const char *s, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '\r' && s[i + 1] == '\n')
            return (char *)s + i;
    return NULL;
}

static int append_body(http_resp *out, const char *p, size_t n)
{
    char *nb = realloc(out->body, out->body_len + n + 1);
    if (!nb)
        return -1;
    memcpy(nb + out->body_len, p, n);
    out->body = nb;
    out->body_len += n;
    out->body[out->body_len] = '\0';
    return 0;
}

/* Returns 0, -1 on error (c->err); *got_any tells whether any byte of a
 * response was received. */
static int read_resp(httpc *c, int head, http_resp *out, int *got_any)
{
    long long deadline = mono_ms() + c->timeout_ms;
    char *end = NULL, *p, *line;
    size_t hlen;
    long n;
    const char *te, *cl, *conn;
    int ver_minor = 1;

    memset(out, 0, sizeof *out);
    *got_any = c->len > 0;
    for (;;) {
        if (c->len && (end = strstr(c->buf, "\r\n\r\n")))
            break;
        n = fill(c, deadline);
        if (n < 0)
            return -1;
        if (n == 0) {
            seterr(c, c->len ? "connection closed inside the response head"
                             : "connection closed before any response");
            drop(c);
            return -1;
        }
        *got_any = 1;
    }
    hlen = (size_t)(end - c->buf) + 4;
    /* status line */
    line = c->buf;
    p = find_crlf(line, hlen);
    if (sscanf(line, "HTTP/1.%d %d", &ver_minor, &out->status) != 2) {
        seterr(c, "bad status line");
        drop(c);
        return -1;
    }
    {
        char *sp = memchr(line, ' ', (size_t)(p - line));
        sp = sp ? memchr(sp + 1, ' ', (size_t)(p - sp - 1)) : NULL;
        out->reason = sp ? dupn(sp + 1, (size_t)(p - sp - 1)) : dupn("", 0);
    }
    /* headers */
    line = p + 2;
    while (line < c->buf + hlen - 2) {
        char *colon, *v, *e = find_crlf(line, (size_t)(c->buf + hlen - line));
        if (!e)
            break;
        colon = memchr(line, ':', (size_t)(e - line));
        if (colon && out->nheaders < HTTPC_MAX_HEADERS) {
            v = colon + 1;
            while (v < e && (*v == ' ' || *v == '\t'))
                v++;
            size_t vl = (size_t)(e - v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                vl--;
            out->headers[out->nheaders].name =
                dupn(line, (size_t)(colon - line));
            out->headers[out->nheaders].value = dupn(v, vl);
            out->nheaders++;
        }
        line = e + 2;
    }
    consume(c, hlen);
    out->body = dupn("", 0);
    conn = http_resp_header(out, "Connection");
    if ((conn && strcasestr(conn, "close")) ||
        (ver_minor == 0 && !(conn && strcasestr(conn, "keep-alive"))))
        out->closed = 1;
    te = http_resp_header(out, "Transfer-Encoding");
    cl = http_resp_header(out, "Content-Length");
    if (head || out->status == 204 || out->status == 304 ||
        out->status / 100 == 1) {
        /* no body */
    } else if (te && strcasestr(te, "chunked")) {
        for (;;) {
            char *e;
            unsigned long long sz;
            while (!(e = find_crlf(c->buf, c->len))) {
                if ((n = fill(c, deadline)) <= 0) {
                    if (n == 0)
                        seterr(c, "closed inside a chunked body");
                    drop(c);
                    return -1;
                }
            }
            sz = strtoull(c->buf, NULL, 16);
            consume(c, (size_t)(e - c->buf) + 2);
            if (sz == 0) {
                /* trailers until an empty line */
                for (;;) {
                    while (!(e = find_crlf(c->buf, c->len))) {
                        if ((n = fill(c, deadline)) <= 0) {
                            if (n == 0)
                                seterr(c, "closed inside chunk trailers");
                            drop(c);
                            return -1;
                        }
                    }
                    if (e == c->buf) {
                        consume(c, 2);
                        break;
                    }
                    consume(c, (size_t)(e - c->buf) + 2);
                }
                break;
            }
            while (c->len < sz + 2) {
                if ((n = fill(c, deadline)) <= 0) {
                    if (n == 0)
                        seterr(c, "closed inside a chunk");
                    drop(c);
                    return -1;
                }
            }
            if (append_body(out, c->buf, (size_t)sz) < 0) {
                seterr(c, "out of memory");
                return -1;
            }
            consume(c, (size_t)sz + 2);
        }
    } else if (cl) {
        char *ep;
        unsigned long long want = strtoull(cl, &ep, 10);
        if (ep == cl) {
            seterr(c, "bad Content-Length: %s", cl);
            drop(c);
            return -1;
        }
        while (c->len < want) {
            if ((n = fill(c, deadline)) <= 0) {
                if (n == 0)
                    seterr(c, "closed after %zu of %llu body bytes", c->len,
                           want);
                drop(c);
                return -1;
            }
        }
        if (append_body(out, c->buf, (size_t)want) < 0) {
            seterr(c, "out of memory");
            return -1;
        }
        consume(c, (size_t)want);
    } else {
        /* body up to the close */
        for (;;) {
            n = fill(c, deadline);
            if (n < 0) {
                drop(c);
                return -1;
            }
            if (n == 0)
                break;
        }
        append_body(out, c->buf, c->len);
        c->len = 0;
        out->closed = 1;
    }
    if (out->closed)
        drop(c);
    return 0;
}

int httpc_read_response(httpc *c, int head, http_resp *out)
{
    int got_any;
    if (c->fd < 0 && c->len == 0) {
        memset(out, 0, sizeof *out);
        seterr(c, "not connected");
        return -1;
    }
    return read_resp(c, head, out, &got_any);
}

int httpc_request(httpc *c, const char *method, const char *path,
                  const char *const *headers, const char *body,
                  size_t body_len, http_resp *out)
{
    char *req;
    size_t cap = 1024 + body_len, len = 0;
    int head = !strcmp(method, "HEAD");

    memset(out, 0, sizeof *out);
    for (int i = 0; headers && headers[i]; i++)
        cap += strlen(headers[i]) + 2;
    if (!(req = malloc(cap))) {
        seterr(c, "out of memory");
        return -1;
    }
    len += (size_t)snprintf(req + len, cap - len,
                            "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n",
                            method, path, c->port);
    for (int i = 0; headers && headers[i]; i++)
        len += (size_t)snprintf(req + len, cap - len, "%s\r\n", headers[i]);
    if (body)
        len += (size_t)snprintf(req + len, cap - len,
                                "Content-Length: %zu\r\n", body_len);
    len += (size_t)snprintf(req + len, cap - len, "\r\n");
    if (body) {
        memcpy(req + len, body, body_len);
        len += body_len;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        int reused = c->fd >= 0, got_any = 0;
        long sent;
        if (httpc_connect(c) < 0)
            break;
        sent = httpc_send_raw(c, req, len);
        if (sent == (long)len || (sent >= 0 && !reused)) {
            if (read_resp(c, head, out, &got_any) == 0) {
                free(req);
                return 0;
            }
        }
        /* A kept-alive connection the server closed meanwhile: retry once
         * on a new one, but only when nothing came back at all. */
        if (!reused || got_any)
            break;
        drop(c);
        http_resp_free(out);
    }
    free(req);
    drop(c);
    return -1;
}

const char *http_resp_header(const http_resp *r, const char *name)
{
    for (int i = 0; i < r->nheaders; i++)
        if (!strcasecmp(r->headers[i].name, name))
            return r->headers[i].value;
    return NULL;
}

int http_resp_header_count(const http_resp *r, const char *name)
{
    int n = 0;
    for (int i = 0; i < r->nheaders; i++)
        if (!strcasecmp(r->headers[i].name, name))
            n++;
    return n;
}

void http_resp_free(http_resp *r)
{
    for (int i = 0; i < r->nheaders; i++) {
        free(r->headers[i].name);
        free(r->headers[i].value);
    }
    free(r->reason);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int httpc_call(httpc *c, const char *method, const char *path,
               const char *auth, const char *key, const char *json_body,
               http_resp *out)
{
    char authh[1024];
    const char *h[4];
    int n = 0;
    if (key) {
        if (auth && !strcasecmp(auth, "x-api-key"))
            snprintf(authh, sizeof authh, "x-api-key: %s", key);
        else
            snprintf(authh, sizeof authh, "Authorization: Bearer %s", key);
        h[n++] = authh;
    }
    if (json_body)
        h[n++] = "Content-Type: application/json";
    h[n] = NULL;
    return httpc_request(c, method, path, h, json_body,
                         json_body ? strlen(json_body) : 0, out);
}

int httpc_post_json(httpc *c, const char *path, const char *key,
                    const char *json_body, http_resp *out)
{
    return httpc_call(c, "POST", path, "bearer", key, json_body, out);
}

int httpc_get(httpc *c, const char *path, const char *key, http_resp *out)
{
    return httpc_call(c, "GET", path, "bearer", key, NULL, out);
}
