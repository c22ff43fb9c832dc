/* sse.c - the Server-Sent Events parser (see sse.h for the contract).
 *
 * The parser is a small state machine over lines, whose ends it finds
 * with memchr (eol_from), and the bytes at their starts.  A line that
 * arrives whole inside one feed is interpreted straight from the caller's
 * buffer; only a line split across feeds is copied into the line buffer.
 * Comment lines are recognised by their first byte and then skipped as
 * they stream, so a keep-alive comment of any length costs nothing.  A CR
 * at the end of a feed leaves "skip_lf" set, so a CRLF split between two
 * feeds is one line end, not two.  The BOM is matched byte by byte for the same reason:
 * if the first bytes only begin like a BOM, they are replayed as text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "quotagate.h"
#include "sse.h"

#define SSE_LINE_SLACK 64  /* room for a field name beyond the event cap */

static const unsigned char BOM[3] = {0xEF, 0xBB, 0xBF};

/* A growable byte buffer, always NUL-terminated once allocated. */
typedef struct sse_buf {
    char *p;
    size_t len, cap;
} sse_buf;

struct qg_sse {
    size_t max_event;   /* cap on type + data bytes of one event */
    size_t max_line;    /* cap on one line */
    sse_buf line;       /* the current line, when split across feeds */
    sse_buf data;       /* data lines joined with "\n" */
    sse_buf type;       /* the event type */
    int have_data;      /* a "data" field was seen in this event */
    int in_comment;     /* discarding the rest of a comment line */
    int skip_lf;        /* the last line ended with CR: drop one LF */
    int bom_done;       /* past the point where a BOM may appear */
    int bom_pos;        /* BOM bytes matched so far */
    int failed;         /* sticky result of a failed feed, 0 = none */
};

/* Append n bytes to b unless the result would exceed limit bytes.
 * Returns 0, QG_ERANGE or QG_ENOMEM. */
static int buf_put(sse_buf *b, const char *src, size_t n, size_t limit)
{
    if (n > limit || b->len > limit - n)
        return QG_ERANGE;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (cap > limit + 1)
            cap = limit + 1;
        char *np = qg__alloc_fails("sse buffer") ? NULL : realloc(b->p, cap);
        if (!np)
            return QG_ENOMEM;
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

qg_sse *qg__sse_new(size_t max_event_bytes)
{
    qg_sse *p = qg__alloc_fails("sse parser") ? NULL : calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->max_event = max_event_bytes ? max_event_bytes : 1;
    p->max_line = p->max_event > SIZE_MAX - SSE_LINE_SLACK
                      ? SIZE_MAX - 1
                      : p->max_event + SSE_LINE_SLACK;
    return p;
}

void qg__sse_free(qg_sse *p)
{
    if (!p)
        return;
    free(p->line.p);
    free(p->data.p);
    free(p->type.p);
    free(p);
}

/* A blank line: hand the event over when it has data, then start afresh. */
static int dispatch(qg_sse *p, qg_sse_event_cb cb, void *ud)
{
    int rc = 0;
    if (p->have_data && cb) {
        const char *ev = p->type.len ? p->type.p : "message";
        size_t elen = p->type.len ? p->type.len : 7;
        rc = cb(ev, elen, p->data.len ? p->data.p : "", p->data.len, ud);
    }
    p->have_data = 0;
    p->data.len = 0;
    p->type.len = 0;
    return rc;
}

/* Interpret one complete line (without its terminator). */
static int process_line(qg_sse *p, const char *s, size_t n, qg_sse_event_cb cb,
                        void *ud)
{
    if (n == 0)
        return dispatch(p, cb, ud);
    if (s[0] == ':')
        return 0;
    const char *colon = memchr(s, ':', n);
    size_t flen = colon ? (size_t)(colon - s) : n;
    const char *v = colon ? colon + 1 : s + n;
    size_t vlen = (size_t)(s + n - v);
    if (vlen && v[0] == ' ') {
        v++;
        vlen--;
    }
    if (flen == 4 && memcmp(s, "data", 4) == 0) {
        /* the cap counts the type, the data so far and the joining LF */
        size_t used = p->type.len + p->data.len + (p->have_data ? 1u : 0u);
        if (used > p->max_event || vlen > p->max_event - used)
            return QG_ERANGE;
        int rc = p->have_data ? buf_put(&p->data, "\n", 1, p->max_event) : 0;
        if (rc == 0)
            rc = buf_put(&p->data, v, vlen, p->max_event);
        p->have_data = 1;
        return rc;
    }
    if (flen == 5 && memcmp(s, "event", 5) == 0) {
        if (vlen > p->max_event - p->data.len)  /* data.len <= max_event */
            return QG_ERANGE;
        p->type.len = 0;
        return buf_put(&p->type, v, vlen, p->max_event - p->data.len);
    }
    /* "id" (last event id) and "retry" (reconnection time) matter only to a
     * reconnecting client; the proxy never reconnects, so both are parsed
     * as fields and dropped, as is any unknown field. */
    return 0;
}

/* The first CR or LF in buf[i, len), or len.  *nl caches where the next
 * LF at or after i is (len: none; SIZE_MAX: not looked for yet), so that
 * the CRs before one LF do not each search for it again: a caller walking
 * one buffer with growing i scans each byte at most twice, with memchr,
 * not byte by byte (this parser and the splitter read every streamed
 * answer; docs/benchmarks.md, "Proxy"). */
static size_t eol_from(const char *buf, size_t i, size_t len, size_t *nl)
{
    const char *cr;
    if (*nl == SIZE_MAX || *nl < i) {
        const char *lf = memchr(buf + i, '\n', len - i);
        *nl = lf ? (size_t)(lf - buf) : len;
    }
    cr = memchr(buf + i, '\r', *nl - i);
    return cr ? (size_t)(cr - buf) : *nl;
}

/* The byte stream after the BOM stage. */
static int feed_lines(qg_sse *p, const char *buf, size_t len,
                      qg_sse_event_cb cb, void *ud)
{
    size_t i = 0, nl = SIZE_MAX;
    while (i < len) {
        if (p->skip_lf) {
            p->skip_lf = 0;
            if (buf[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t j = eol_from(buf, i, len, &nl);
        const char *seg = buf + i;
        size_t n = j - i;
        int rc = 0;
        if (!p->in_comment && p->line.len == 0 && n > 0 && seg[0] == ':')
            p->in_comment = 1;
        if (j == len) {                 /* the line continues later */
            if (!p->in_comment && n)
                rc = buf_put(&p->line, seg, n, p->max_line);
            return rc;
        }
        if (buf[j] == '\r')
            p->skip_lf = 1;
        if (p->in_comment) {
            p->in_comment = 0;
        } else if (p->line.len) {
            rc = buf_put(&p->line, seg, n, p->max_line);
            if (rc == 0)
                rc = process_line(p, p->line.p, p->line.len, cb, ud);
            p->line.len = 0;
        } else {
            rc = n > p->max_line ? QG_ERANGE : process_line(p, seg, n, cb, ud);
        }
        if (rc)
            return rc;
        i = j + 1;
    }
    return 0;
}

int qg__sse_feed(qg_sse *p, const char *buf, size_t len,
                qg_sse_event_cb on_event, void *ud)
{
    int rc = 0;
    if (p->failed)
        return p->failed;
    /* Skip a BOM at the very start, however the first bytes are split. */
    while (!p->bom_done && len > 0) {
        if ((unsigned char)buf[0] == BOM[p->bom_pos]) {
            buf++;
            len--;
            if (++p->bom_pos == 3)
                p->bom_done = 1;
        } else {
            p->bom_done = 1;
            if (p->bom_pos > 0)     /* only looked like a BOM: replay */
                rc = feed_lines(p, (const char *)BOM, (size_t)p->bom_pos,
                                on_event, ud);
        }
    }
    if (rc == 0 && len > 0)
        rc = feed_lines(p, buf, len, on_event, ud);
    if (rc)
        p->failed = rc;
    return rc;
}

int qg__sse_finish(qg_sse *p)
{
    int rc = p->failed;
    if (rc == 0 && (p->line.len || p->in_comment || p->have_data ||
                    p->type.len || (!p->bom_done && p->bom_pos > 0)))
        rc = 1;
    p->line.len = p->data.len = p->type.len = 0;
    p->have_data = p->in_comment = p->skip_lf = 0;
    p->bom_done = p->bom_pos = 0;
    p->failed = 0;
    return rc;
}

/* ------------------------------------------------------------ splitter */

/* From one line end to the next: the bytes between are text (they end a
 * pending line end: at_eol and cr fall), then the CR or LF is looked at. */
size_t qg__sse_split_next(qg_sse_split *s, const char *buf, size_t len)
{
    size_t i = 0, nl = SIZE_MAX;
    while (i < len) {
        size_t e = eol_from(buf, i, len, &nl);
        char c;
        if (e > i)
            s->at_eol = s->cr = 0;
        if (e == len)
            break;
        c = buf[e];
        i = e + 1;
        if (c == '\n' && s->cr) {       /* the LF of a CRLF */
            s->cr = 0;
            continue;
        }
        s->cr = c == '\r';
        if (s->at_eol) {
            s->at_eol = 0;
            if (c == '\r' && i < len && buf[i] == '\n') {
                s->cr = 0;              /* keep the CRLF whole */
                return i + 1;
            }
            return i;
        }
        s->at_eol = 1;
    }
    return 0;
}
