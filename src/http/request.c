/* request.c - from bytes to a qg_http_req: libhttp-parser's callbacks and
 * the request handed to the handler.  No I/O here except the interim
 * "100 Continue" (through conn.c's flush).
 *
 * The callbacks copy the URL and headers into the connection's arena as
 * they come (a read may end in the middle of a name or value, so a field
 * callback after a field continues it, after a value starts a new header),
 * count header bytes against max_header_bytes (431), and copy the body
 * (Content-Length or decoded chunks) into the body buffer, against
 * max_body_bytes (413: at once when a Content-Length or a chunk size line
 * announces more, before those bytes are read).  The head's deadline is
 * set at the request's first byte (for a connection's first request it
 * stays the one set at accept), the body's at the end of the head and at
 * each chunk size, from the declared size (http.h).  on_message_complete
 * pauses the parser so that a
 * pipelined next request stays unparsed until this one is answered.  Only
 * when the message is complete are the arena's offsets turned into
 * pointers (the arena may move while it grows). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http_internal.h"

int qg__reserve(char **buf, size_t *cap, size_t need, size_t hard)
{
    size_t ncap;
    char *nb;
    if (need <= *cap)
        return 0;
    if (need > hard)
        return -1;
    ncap = *cap ? *cap : 256;
    while (ncap < need)
        ncap *= 2;
    if (ncap > hard)
        ncap = hard;
    nb = realloc(*buf, ncap);
    if (!nb)
        return -1;
    *buf = nb;
    *cap = ncap;
    return 0;
}

/* ---- parser callbacks ------------------------------------------------ */

static int ar_put(qg__conn *c, const char *p, size_t n)
{
    /* Bounded by max_header_bytes (hdr_bytes) plus the NULs we add. */
    size_t hard = qg__opts(c)->max_header_bytes * 2 + 256;
    if (qg__reserve(&c->ar, &c->ar_cap, c->ar_len + n, hard) < 0) {
        c->err_status = 431;
        return -1;
    }
    memcpy(c->ar + c->ar_len, p, n);
    c->ar_len += n;
    return 0;
}

static int hdr_count(qg__conn *c, size_t n)
{
    c->hdr_bytes += n;
    if (c->hdr_bytes > qg__opts(c)->max_header_bytes) {
        c->err_status = 431;
        return -1;
    }
    return 0;
}

static int end_url(qg__conn *c)
{
    if (c->url_done)
        return 0;
    c->url_done = 1;
    return ar_put(c, "", 1);
}

static int cb_message_begin(http_parser *p)
{
    qg__conn *c = p->data;
    c->ar_len = c->hdr_bytes = c->body_len = 0;
    c->nh = c->hkind = c->err_status = 0;
    c->url_done = c->head = 0;
    c->hdr_bytes = 16;                 /* method, version, CRLFs */
    if (c->phase != PH_FIRST)          /* the first: counted from accept */
        qg__set_deadline(c, qg__opts(c)->header_timeout_ms);
    c->phase = PH_HEADERS;
    qg__conn_enqueue(c, Q_READ);       /* the first request stays in place */
    return 0;
}

static int cb_url(http_parser *p, const char *at, size_t n)
{
    qg__conn *c = p->data;
    return hdr_count(c, n) || ar_put(c, at, n) ? -1 : 0;
}

/* Field and value callbacks may come in pieces (data split over reads):
 * a field callback after a value starts a new header, one after a field
 * continues it. */
static int cb_header_field(http_parser *p, const char *at, size_t n)
{
    qg__conn *c = p->data;
    if (c->phase != PH_HEADERS)
        return 0;                      /* chunked trailers: ignored */
    if (end_url(c) < 0)
        return -1;
    if (c->hkind != 1) {
        if (c->hkind == 2 && ar_put(c, "", 1) < 0)
            return -1;
        if (c->nh == c->ho_cap) {
            int cap = c->ho_cap ? c->ho_cap * 2 : 16;
            qg__hoff *ho = realloc(c->ho, (size_t)cap * sizeof *ho);
            if (!ho) {
                c->err_status = 500;
                return -1;
            }
            c->ho = ho;
            c->ho_cap = cap;
        }
        c->ho[c->nh++] = (qg__hoff){ c->ar_len, 0, 0, 0 };
        c->hkind = 1;
        if (hdr_count(c, 4) < 0)       /* ": " and CRLF */
            return -1;
    }
    if (hdr_count(c, n) < 0 || ar_put(c, at, n) < 0)
        return -1;
    c->ho[c->nh - 1].name_len += n;
    return 0;
}

static int cb_header_value(http_parser *p, const char *at, size_t n)
{
    qg__conn *c = p->data;
    if (c->phase != PH_HEADERS || c->nh == 0)
        return 0;
    if (c->hkind == 1) {
        if (ar_put(c, "", 1) < 0)
            return -1;
        c->ho[c->nh - 1].value_off = c->ar_len;
        c->hkind = 2;
    }
    if (hdr_count(c, n) < 0 || ar_put(c, at, n) < 0)
        return -1;
    c->ho[c->nh - 1].value_len += n;
    return 0;
}

/* NUL-terminate the last name/value (a name without value gets ""). */
static int end_headers(qg__conn *c)
{
    if (end_url(c) < 0)
        return -1;
    if (c->hkind == 1) {
        if (ar_put(c, "", 1) < 0)
            return -1;
        c->ho[c->nh - 1].value_off = c->ar_len;
    }
    if (c->hkind && ar_put(c, "", 1) < 0)
        return -1;
    c->hkind = 0;
    return 0;
}

static void trim_value(qg__conn *c, qg__hoff *h)
{
    while (h->value_len > 0 && (c->ar[h->value_off + h->value_len - 1] == ' ' ||
                                c->ar[h->value_off + h->value_len - 1] == '\t'))
        c->ar[h->value_off + --h->value_len] = '\0';
}

static int expects_continue(qg__conn *c)
{
    for (int i = 0; i < c->nh; i++) {
        qg__hoff *h = &c->ho[i];
        if (h->name_len == 6 && !strncasecmp(c->ar + h->name_off, "expect", 6)) {
            trim_value(c, h);
            return h->value_len == 12 &&
                   !strncasecmp(c->ar + h->value_off, "100-continue", 12);
        }
    }
    return 0;
}

/* The body's deadline: from the end of the head, header_timeout_ms plus
 * the declared bytes at min_body_rate (bytes per second).  Whole seconds
 * and the remainder apart, so nothing overflows (d % rate < 2^31); a
 * declared size of years saturates. */
static void body_deadline(qg__conn *c)
{
    const qg_http_opts *o = qg__opts(c);
    uint64_t rate = (uint64_t)o->min_body_rate, d = c->body_declared;
    uint64_t ms = d / rate > ((uint64_t)1 << 40)
                  ? (uint64_t)1 << 50 : d / rate * 1000 + d % rate * 1000 / rate;
    c->deadline_ms = c->body_t0_ms + (uint64_t)o->header_timeout_ms + ms;
}

static int cb_headers_complete(http_parser *p)
{
    qg__conn *c = p->data;
    const qg_http_opts *o = qg__opts(c);
    int chunked = (p->flags & F_CHUNKED) != 0;
    int has_len = !chunked && p->content_length != ULLONG_MAX &&
                  p->content_length > 0;
    if (end_headers(c) < 0)
        return -1;
    c->phase = PH_BODY;
    if (has_len && p->content_length > o->max_body_bytes) {
        c->err_status = 413;
        return -1;
    }
    c->body_t0_ms = qg__now_ms();
    c->body_declared = has_len ? p->content_length : 0;
    body_deadline(c);
    /* The size is known: one allocation (or none, reusing the buffer). */
    if (has_len && qg__reserve(&c->body, &c->body_cap, p->content_length + 1,
                           o->max_body_bytes + 1) < 0) {
        c->err_status = 500;
        return -1;
    }
    /* HTTP/1.0 gets Connection: close even when it asked for keep-alive. */
    c->keepalive = http_should_keep_alive(p) && p->http_major == 1 &&
                   p->http_minor >= 1 && !p->upgrade;
    c->head = p->method == HTTP_HEAD;
    if ((chunked || has_len) && p->http_major == 1 && p->http_minor >= 1 &&
        expects_continue(c) && c->out_len == 0) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (qg__reserve(&c->out, &c->out_cap, sizeof cont - 1, SIZE_MAX / 2) < 0) {
            c->err_status = 500;
            return -1;
        }
        memcpy(c->out, cont, sizeof cont - 1);
        c->out_off = 0;
        c->out_len = sizeof cont - 1;
        if (qg__conn_flush(c) < 0)
            return -1;
    }
    return 0;
}

/* A chunk size line: 413 now if the body would pass the limit, else the
 * deadline grows by this chunk. */
static int cb_chunk_header(http_parser *p)
{
    qg__conn *c = p->data;
    uint64_t max = qg__opts(c)->max_body_bytes;
    if (p->content_length > max - c->body_declared) {
        c->err_status = 413;
        return -1;
    }
    c->body_declared += p->content_length;
    body_deadline(c);
    return 0;
}

static int cb_body(http_parser *p, const char *at, size_t n)
{
    qg__conn *c = p->data;
    size_t max = qg__opts(c)->max_body_bytes;
    if (c->body_len + n > max) {
        c->err_status = 413;
        return -1;
    }
    if (qg__reserve(&c->body, &c->body_cap, c->body_len + n + 1, max + 1) < 0) {
        c->err_status = 500;
        return -1;
    }
    memcpy(c->body + c->body_len, at, n);
    c->body_len += n;
    return 0;
}

static int cb_message_complete(http_parser *p)
{
    qg__conn *c = p->data;
    c->msg_done = 1;
    c->phase = PH_HANDLER;
    c->deadline_ms = 0;
    qg__conn_enqueue(c, Q_NONE);       /* held: never shed */
    http_parser_pause(p, 1);           /* execute returns right after it */
    return 0;
}

const http_parser_settings qg__parser_settings = {
    .on_message_begin = cb_message_begin,
    .on_url = cb_url,
    .on_header_field = cb_header_field,
    .on_header_value = cb_header_value,
    .on_headers_complete = cb_headers_complete,
    .on_chunk_header = cb_chunk_header,
    .on_body = cb_body,
    .on_message_complete = cb_message_complete,
};

/* ---- requests --------------------------------------------------------- */

static int method_of(unsigned m)
{
    switch (m) {
    case HTTP_GET: return QG_HTTP_GET;
    case HTTP_POST: return QG_HTTP_POST;
    case HTTP_PUT: return QG_HTTP_PUT;
    case HTTP_DELETE: return QG_HTTP_DELETE;
    case HTTP_HEAD: return QG_HTTP_HEAD;
    default: return QG_HTTP_OTHER;
    }
}

/* The arena is final now: turn offsets into the request's pointers. */
void qg__conn_dispatch(qg__conn *c)
{
    qg__worker *w = c->w;
    qg_http_req *r = &c->req;
    char *url = c->ar, *q;
    const char *path;
    if (c->nh > c->hdrs_cap) {
        qg_http_header *h = realloc(c->hdrs, (size_t)c->nh * sizeof *h);
        if (!h) {
            c->want_close = 1;
            return;
        }
        c->hdrs = h;
        c->hdrs_cap = c->nh;
    }
    for (int i = 0; i < c->nh; i++) {
        qg__hoff *h = &c->ho[i];
        trim_value(c, h);
        c->hdrs[i] = (qg_http_header){ c->ar + h->name_off, h->name_len,
                                       c->ar + h->value_off, h->value_len };
    }
    /* Absolute form (http://host/p?q): keep the path. */
    if (!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8)) {
        url = strstr(url, "://") + 3;
        url += strcspn(url, "/?");
    }
    q = strchr(url, '?');
    if (q)
        *q++ = '\0';
    else
        q = url + strlen(url);
    path = *url ? url : "/";
    memset(r, 0, sizeof *r);
    r->method = method_of(c->hp.method);
    r->path = path;
    r->query = q;
    r->headers = c->hdrs;
    r->nheaders = c->nh;
    if (c->body) {
        c->body[c->body_len] = '\0';
        r->body = c->body;
    } else {
        r->body = "";
    }
    r->body_len = c->body_len;
    r->worker = w->idx;
    r->tag = 0;
    r->priv = c;
    c->busy = 1;
    qg__stat_add(&w->st_requests, 1);
    w->srv->handler(r, w->srv->ud);
}

const char *qg__http_header_get(const qg_http_req *r, const char *name,
                               size_t *len)
{
    size_t n = strlen(name);
    for (int i = 0; i < r->nheaders; i++) {
        const qg_http_header *h = &r->headers[i];
        if (h->name_len == n && !strncasecmp(h->name, name, n)) {
            if (len)
                *len = h->value_len;
            return h->value;
        }
    }
    return NULL;
}

