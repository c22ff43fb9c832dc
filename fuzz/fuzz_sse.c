/* fuzz_sse.c - the SSE splitter and parser of the proxy's streams
 * (sse.c, qg__sse_split_next in proxy.c) and the usage read from each
 * event (usage.c), as h_proxy.c uses them, against references.
 *
 * Input: byte 0 chooses the event cap (from 1 byte to the proxy's 1 MiB),
 * the API shape and whether the proxy filters (splits the stream into
 * events before parsing, to drop the usage-only chunk); byte 1 seeds the
 * cuts of the stream into upstream reads; the rest is the stream.
 *
 * Checked:
 *  - the parser fed the whole stream, and fed it cut into reads, gives
 *    exactly the events, feed result and finish result of a plain
 *    whole-buffer reading of the WHATWG rules with sse.h's caps
 *    (ref_parse below);
 *  - in filter mode (h_proxy.c's px_stream_bytes, repeated here), each
 *    piece the splitter cuts ends where a blank line of the stream ends
 *    and makes the parser dispatch at most one event, so a dropped piece
 *    never takes another event's bytes with it;
 *  - each event's usage, read as the proxy reads it (counts carried
 *    from event to event), equals the jansson reference's
 *    (tests/support/respref.c).
 * A disagreement aborts. */
#include <string.h>

#include "fuzz.h"
#include "jref.h"
#include "proxy.h"
#include "quotagate.h"
#include "sse.h"
#include "usage.h"

#define MAX_EVENTS 32768

static const size_t CAPS[8] = {1, 2, 8, 16, 64, 300, 4096, 1u << 20};

/* ---- events as seen */

typedef struct ev {
    size_t eoff, elen, doff, dlen;  /* into the record's bytes */
} ev;

typedef struct rec {
    ev e[MAX_EVENTS];
    int n;
    char *b;                        /* event types and data, appended */
    size_t len, cap;
    int piece_events;               /* events of the current feed */
    int shape;
    qg_usage_counts u, ru;          /* usage as the proxy reads it, and
                                       as the reference does */
    const uint8_t *data;
    size_t size;
} rec;

static void rec_put(rec *r, const char *s, size_t n)
{
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->len + n + 1)
            cap *= 2;
        r->b = realloc(r->b, cap);
        if (!r->b)
            abort();
        r->cap = cap;
    }
    if (n)
        memcpy(r->b + r->len, s, n);
    r->len += n;
}

static void rec_event(rec *r, const char *t, size_t tl, const char *d,
                      size_t dl)
{
    if (r->n == MAX_EVENTS)
        return;                     /* the stream is cut at 64 KiB anyway */
    r->e[r->n] = (ev){r->len, tl, r->len + tl, dl};
    rec_put(r, t, tl);
    rec_put(r, d, dl);
    r->n++;
}

static int same_events(const rec *a, const rec *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++) {
        const ev *x = &a->e[i], *y = &b->e[i];
        if (x->elen != y->elen || x->dlen != y->dlen ||
            memcmp(a->b + x->eoff, b->b + y->eoff, x->elen) != 0 ||
            memcmp(a->b + x->doff, b->b + y->doff, x->dlen) != 0)
            return 0;
    }
    return 1;
}

/* The usage of one event, as h_proxy.c's on_event reads it, against the
 * reference. */
static void usage_of(rec *r, const char *t, size_t tl, const char *d,
                     size_t dl)
{
    int64_t ca = -5, cb = -5;
    int ra, rb;
    if (r->shape == QG_SHAPE_OPENAI) {
        int oa = 9, ob = 9;
        if (dl == 6 && memcmp(d, "[DONE]", 6) == 0)
            return;
        ra = qg__usage_openai_chunk_bytes(d, dl, &r->u, &oa, &ca);
        rb = tst_ref_openai_chunk_bytes(d, dl, &r->ru, &ob, &cb);
        if (ra != rb || oa != ob || ca != cb)
            fuzz_fail("an OpenAI event's usage differs from the reference",
                      r->data, r->size);
    } else {
        ra = qg__usage_anthropic_event_bytes(t, tl, d, dl, &r->u, &ca);
        rb = tst_ref_anthropic_event_bytes(t, tl, d, dl, &r->ru, &cb);
        if (ra != rb || ca != cb)
            fuzz_fail("an Anthropic event's usage differs from the "
                      "reference", r->data, r->size);
    }
    if (!tst_same_counts(&r->u, &r->ru))
        fuzz_fail("usage counts differ from the reference", r->data,
                  r->size);
}

static int on_event(const char *t, size_t tl, const char *d, size_t dl,
                    void *ud)
{
    rec *r = ud;
    if (t[tl] != '\0' || d[dl] != '\0')
        fuzz_fail("an event not NUL-terminated", r->data, r->size);
    rec_event(r, t, tl, d, dl);
    r->piece_events++;
    usage_of(r, t, tl, d, dl);
    return 0;
}

/* ---- the reference: the whole stream at once */

typedef struct refres {
    int feed_rc;                    /* 0 or QG_ERANGE */
    int finish_rc;                  /* 0, 1, or QG_ERANGE */
    /* ends of blank lines: a piece may end there (both ends of a CRLF) */
    unsigned char *blank_end;       /* size + 1 flags */
} refres;

/* Where blank lines end, caps aside. */
static void mark_blank_ends(const char *s, size_t n, unsigned char *end)
{
    size_t i = n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    while (i < n) {
        size_t j = i, next;
        while (j < n && s[j] != '\n' && s[j] != '\r')
            j++;
        if (j == n)
            break;
        next = s[j] == '\r' && j + 1 < n && s[j + 1] == '\n' ? j + 2 : j + 1;
        if (j == i)
            end[j + 1] = end[next] = 1;
        i = next;
    }
}

static void ref_parse(const char *s, size_t n, size_t cap, rec *r,
                      refres *res)
{
    size_t max_line = cap + 64, i = 0;
    char *data = malloc(n + 1), *type = malloc(n + 1);
    size_t dlen = 0, tlen = 0;
    int have_data = 0;
    if (!data || !type)
        abort();
    res->feed_rc = 0;
    res->finish_rc = 0;
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        i = 3;
    while (i < n) {
        size_t j = i, next;
        while (j < n && s[j] != '\n' && s[j] != '\r')
            j++;
        const char *line = s + i;
        size_t len = j - i;
        int comment = len > 0 && line[0] == ':';
        if (!comment && len > max_line) {
            res->feed_rc = QG_ERANGE;
            break;
        }
        if (j == n) {                   /* an unfinished last line */
            if (len > 0)
                res->finish_rc = 1;
            break;
        }
        next = j + 1;
        if (s[j] == '\r' && j + 1 < n && s[j + 1] == '\n')
            next = j + 2;
        if (comment)
            ;
        else if (len == 0) {
            if (have_data)
                rec_event(r, tlen ? type : "message", tlen ? tlen : 7, data,
                          dlen);
            have_data = 0;
            dlen = tlen = 0;
        } else {
            const char *colon = memchr(line, ':', len);
            size_t flen = colon ? (size_t)(colon - line) : len;
            const char *v = colon ? colon + 1 : line + len;
            size_t vlen = (size_t)(line + len - v);
            if (vlen && v[0] == ' ') {
                v++;
                vlen--;
            }
            if (flen == 4 && memcmp(line, "data", 4) == 0) {
                /* type plus data (joined by LF) at most cap bytes */
                if (tlen + dlen + (size_t)have_data + vlen > cap) {
                    res->feed_rc = QG_ERANGE;
                    break;
                }
                if (have_data)
                    data[dlen++] = '\n';
                memcpy(data + dlen, v, vlen);
                dlen += vlen;
                have_data = 1;
            } else if (flen == 5 && memcmp(line, "event", 5) == 0) {
                if (dlen + vlen > cap) {
                    res->feed_rc = QG_ERANGE;
                    break;
                }
                memcpy(type, v, vlen);
                tlen = vlen;
            }
        }
        i = next;
    }
    if (res->feed_rc)
        res->finish_rc = res->feed_rc;
    else if (have_data || tlen ||
             (n < 3 && n > 0 && memcmp(s, "\xEF\xBB\xBF", n) == 0))
        res->finish_rc = 1;         /* an event or a BOM cut short */
    free(data);
    free(type);
}

/* ---- the parser as the proxy runs it */

/* The stream cut into reads: sizes from a small generator seeded by the
 * input (1 to 64 bytes, sometimes a whole kilobyte). */
static size_t next_cut(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 16) % 16 == 0 ? 1024 : 1 + (*seed >> 16) % 64;
}

static int run_plain(const char *s, size_t n, size_t cap, unsigned seed,
                     int cut, rec *r, int *finish_rc)
{
    qg_sse *p = qg__sse_new(cap);
    size_t at = 0;
    int rc = 0;
    if (!p)
        abort();
    while (at < n) {
        size_t k = cut ? next_cut(&seed) : n;
        if (k > n - at)
            k = n - at;
        int frc = qg__sse_feed(p, s + at, k, on_event, r);
        if (frc && !rc)
            rc = frc;
        at += k;
    }
    *finish_rc = qg__sse_finish(p);
    qg__sse_free(p);
    return rc;
}

/* h_proxy.c's filter mode: reads split into whole events (pend holds an
 * event's start until its end arrives), each event parsed alone. */
static int run_filter(const char *s, size_t n, size_t cap, unsigned seed,
                      rec *r, const refres *ref, int *finish_rc)
{
    qg_sse *p = qg__sse_new(cap);
    qg_sse_split split = {0, 0};
    size_t at = 0, pend_start = 0;
    int rc = 0;
    if (!p)
        abort();
    while (at < n) {
        size_t k = next_cut(&seed);
        if (k > n - at)
            k = n - at;
        const char *d = s + at;
        size_t left = k;
        while (left > 0) {
            size_t b = qg__sse_split_next(&split, d, left);
            if (b == 0)
                break;              /* the rest waits in pend */
            d += b;
            left -= b;
            size_t end = (size_t)(d - s);
            if (!ref->blank_end[end])
                fuzz_fail("the splitter cut where no blank line ends",
                          r->data, r->size);
            r->piece_events = 0;
            int frc = qg__sse_feed(p, s + pend_start, end - pend_start,
                                  on_event, r);
            if (frc && !rc)
                rc = frc;
            if (r->piece_events > 1)
                fuzz_fail("one piece of the splitter held two events",
                          r->data, r->size);
            pend_start = end;
        }
        at += k;
    }
    if (pend_start < n) {           /* the stream ended inside an event */
        int frc = qg__sse_feed(p, s + pend_start, n - pend_start, on_event,
                              r);
        if (frc && !rc)
            rc = frc;
    }
    *finish_rc = qg__sse_finish(p);
    qg__sse_free(p);
    return rc;
}

static void rec_reset(rec *r, int shape, const uint8_t *data, size_t size)
{
    r->n = 0;
    r->len = 0;
    r->shape = shape;
    r->data = data;
    r->size = size;
    memset(&r->u, 0, sizeof r->u);
    memset(&r->ru, 0, sizeof r->ru);
}

static rec A, B;                    /* big: static, reused */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    refres ref;
    int frc_a, frc_b, rc;
    if (size < 2 || size > 65536)
        return 0;
    size_t cap = CAPS[data[0] & 7];
    int shape = data[0] & 8 ? QG_SHAPE_ANTHROPIC : QG_SHAPE_OPENAI;
    int filter = (data[0] & 16) != 0;
    unsigned seed = data[1];
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    ref.blank_end = calloc(n + 1, 1);
    if (!ref.blank_end)
        abort();
    mark_blank_ends(s, n, ref.blank_end);
    rec_reset(&A, shape, data, size);
    ref_parse(s, n, cap, &A, &ref);

    /* whole */
    rec_reset(&B, shape, data, size);
    rc = run_plain(s, n, cap, seed, 0, &B, &frc_b);
    if (rc != ref.feed_rc || frc_b != ref.finish_rc || !same_events(&A, &B))
        fuzz_fail("the parser fed whole differs from the reference", data,
                  size);
    /* cut into reads, as the proxy passes a stream through */
    rec_reset(&B, shape, data, size);
    rc = filter ? run_filter(s, n, cap, seed, &B, &ref, &frc_a)
                : run_plain(s, n, cap, seed, 1, &B, &frc_a);
    if (rc != ref.feed_rc || frc_a != ref.finish_rc || !same_events(&A, &B))
        fuzz_fail(filter ? "the parser fed by the splitter differs from "
                           "the reference"
                         : "the parser fed in cuts differs from the "
                           "reference", data, size);
    free(ref.blank_end);
    return 0;
}
