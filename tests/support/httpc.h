/* httpc.h - a small blocking HTTP/1.1 client for end-to-end tests.
 *
 * One httpc is one TCP connection to 127.0.0.1:port, reused across
 * requests (keep-alive) until either side closes it.  A request on a
 * reused connection that the server had closed meanwhile (nothing at all
 * received back) is retried once on a fresh connection.  Every wait is
 * bounded by poll with the client's timeout.  Responses: status, headers
 * (case-insensitive lookup) and the body (Content-Length, chunked, or up
 * to the close).  Not thread-safe: one httpc per thread. */
#ifndef QG_TEST_HTTPC_H
#define QG_TEST_HTTPC_H

#include <stddef.h>

#define HTTPC_MAX_HEADERS 64

typedef struct httpc_header {
    char *name, *value;
} httpc_header;

typedef struct http_resp {
    int status;                /* 0 when no response was received */
    char *reason;
    httpc_header headers[HTTPC_MAX_HEADERS];
    int nheaders;
    char *body;                /* NUL-terminated */
    size_t body_len;
    int closed;                /* the server closed the connection after */
} http_resp;

typedef struct httpc {
    int fd;                    /* -1 when not connected */
    int port;
    int timeout_ms;            /* per wait; default 10000 */
    char *buf;                 /* bytes received, not yet consumed */
    size_t len, cap;
    int connects;              /* connections opened so far */
    char err[256];             /* why the last call failed */
} httpc;

void httpc_init(httpc *c, int port);
/* Close the connection and free buffers (the httpc may be reused). */
void httpc_close(httpc *c);
/* Point at another port (closes the current connection). */
void httpc_set_port(httpc *c, int port);

/* Send a request and read its response.  headers: NULL-terminated list
 * of "Name: value" strings (may be NULL).  Host, Content-Length (when
 * body is non-NULL) are added.  Returns 0 with *out filled (free it with
 * http_resp_free), or -1 on a connection error or timeout (c->err). */
int httpc_request(httpc *c, const char *method, const char *path,
                  const char *const *headers, const char *body,
                  size_t body_len, http_resp *out);

/* Value of header `name` (case-insensitive), or NULL. */
const char *http_resp_header(const http_resp *r, const char *name);
/* How many times header `name` occurs. */
int http_resp_header_count(const http_resp *r, const char *name);
void http_resp_free(http_resp *r);

/* Low level, for malformed or slow requests: connect (if needed), send
 * raw bytes; read one response (head: 1 for a HEAD request).  send_raw
 * ignores EPIPE/ECONNRESET (the server may refuse early) and returns the
 * bytes sent or -1. */
int httpc_connect(httpc *c);
long httpc_send_raw(httpc *c, const void *data, size_t len);
int httpc_read_response(httpc *c, int head, http_resp *out);
/* Wait up to ms for the connection to become readable (or closed).
 * Returns 1 readable, 0 timeout, -1 error. */
int httpc_wait_readable(httpc *c, int ms);

/* ------------------------------------------------------------ helpers */

/* A request with a key: auth is "bearer" (Authorization: Bearer KEY) or
 * "x-api-key"; key may be NULL (no auth header).  body may be NULL. */
int httpc_call(httpc *c, const char *method, const char *path,
               const char *auth, const char *key, const char *json_body,
               http_resp *out);
/* POST json_body with Content-Type: application/json and Bearer key. */
int httpc_post_json(httpc *c, const char *path, const char *key,
                    const char *json_body, http_resp *out);
/* GET with Bearer key (key may be NULL). */
int httpc_get(httpc *c, const char *path, const char *key, http_resp *out);

#endif
