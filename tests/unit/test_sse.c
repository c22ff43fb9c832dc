/* test_sse.c - the Server-Sent Events parser fed from buffers: a mixed
 * stream split at every byte position (and every pair of positions, and
 * byte by byte) gives exactly the events of a whole feed; CR, LF and CRLF
 * line ends, including a CRLF split between feeds; comments; multi-line
 * data; the BOM, whole, split and only half present; the hard cap; no
 * dispatch at end of stream without a blank line; a callback that stops. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quotagate.h"
#include "sse.h"

/* Events recorded as "type=data" joined by '|', data escaped so that
 * "\n" reads as "\\n". */
typedef struct rec {
    char s[8192];
    size_t len;
    int n;
    int stop_at;   /* return 7 from the stop_at-th event, 0 = never */
} rec;

static void rec_put(rec *r, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_true(r->len + 3 < sizeof r->s);
        if (p[i] == '\n') {
            r->s[r->len++] = '\\';
            r->s[r->len++] = 'n';
        } else {
            r->s[r->len++] = p[i];
        }
    }
    r->s[r->len] = '\0';
}

static int on_event(const char *ev, size_t elen, const char *data,
                    size_t dlen, void *ud)
{
    rec *r = ud;
    assert_int_equal(ev[elen], '\0');
    assert_int_equal(data[dlen], '\0');
    if (r->n++)
        rec_put(r, "|", 1);
    rec_put(r, ev, elen);
    rec_put(r, "=", 1);
    rec_put(r, data, dlen);
    return r->stop_at && r->n == r->stop_at ? 7 : 0;
}

/* Parse s (n bytes) as the pieces cut at cuts[0..ncuts), then finish. */
static int parse_cut(const char *s, size_t n, const size_t *cuts, int ncuts,
                     size_t cap, rec *r, int *finish_rc)
{
    qg_sse *p = qg__sse_new(cap);
    assert_non_null(p);
    memset(r, 0, sizeof *r);
    size_t at = 0;
    int rc = 0;
    for (int i = 0; i <= ncuts && rc == 0; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        rc = qg__sse_feed(p, s + at, end - at, on_event, r);
        at = end;
    }
    int frc = qg__sse_finish(p);
    if (finish_rc)
        *finish_rc = frc;
    qg__sse_free(p);
    return rc;
}

static int parse_whole(const char *s, size_t cap, rec *r)
{
    return parse_cut(s, strlen(s), NULL, 0, cap, r, NULL);
}

/* A stream exercising every rule at once. */
static const char MIXED[] =
    "\xEF\xBB\xBF"
    ": a comment first\n"
    "data: one\n"
    "\n"
    "event: update\r\n"
    "data:  two spaces\r\n"
    "data:nospace\r\n"
    "id: 42\r\n"
    "retry: 1500\r\n"
    "\r\n"
    "event: ignored-no-data\r"
    "\r"
    "data\n"
    ": between\n"
    "data: after empty\n"
    "unknown: field\n"
    "\n"
    "event: last\r\n"
    "data: {\"a\":1}\r\n"
    "\r\n";
static const char MIXED_EVENTS[] =
    "message=one|update= two spaces\\nnospace|message=\\nafter empty"
    "|last={\"a\":1}";

static void test_mixed_whole(void **state)
{
    (void)state;
    rec r;
    int frc;
    assert_int_equal(parse_cut(MIXED, strlen(MIXED), NULL, 0, 1024, &r, &frc),
                     0);
    assert_string_equal(r.s, MIXED_EVENTS);
    assert_int_equal(r.n, 4);
    assert_int_equal(frc, 0);
}

static void test_split_every_position(void **state)
{
    (void)state;
    size_t n = strlen(MIXED);
    rec r;
    int frc;
    for (size_t k = 0; k <= n; k++) {
        assert_int_equal(parse_cut(MIXED, n, &k, 1, 1024, &r, &frc), 0);
        assert_string_equal(r.s, MIXED_EVENTS);
        assert_int_equal(frc, 0);
    }
}

static void test_split_every_pair(void **state)
{
    (void)state;
    size_t n = strlen(MIXED);
    rec r;
    for (size_t i = 0; i <= n; i++) {
        for (size_t j = i; j <= n; j++) {
            size_t cuts[2] = {i, j};
            assert_int_equal(parse_cut(MIXED, n, cuts, 2, 1024, &r, NULL), 0);
            if (strcmp(r.s, MIXED_EVENTS) != 0)
                fail_msg("cuts %zu %zu: %s", i, j, r.s);
        }
    }
}

static void test_byte_by_byte(void **state)
{
    (void)state;
    size_t n = strlen(MIXED);
    size_t cuts[sizeof MIXED];
    for (size_t i = 0; i < n; i++)
        cuts[i] = i + 1;
    rec r;
    int frc;
    assert_int_equal(parse_cut(MIXED, n, cuts, (int)n, 1024, &r, &frc), 0);
    assert_string_equal(r.s, MIXED_EVENTS);
    assert_int_equal(frc, 0);
}

static void test_line_ends(void **state)
{
    (void)state;
    rec r;
    assert_int_equal(parse_whole("data: lf\n\n", 64, &r), 0);
    assert_string_equal(r.s, "message=lf");
    assert_int_equal(parse_whole("data: cr\r\r", 64, &r), 0);
    assert_string_equal(r.s, "message=cr");
    assert_int_equal(parse_whole("data: crlf\r\n\r\n", 64, &r), 0);
    assert_string_equal(r.s, "message=crlf");
    /* CR then CRLF: two line ends, the second blank */
    assert_int_equal(parse_whole("data: a\r\r\ndata: b\n\n", 64, &r), 0);
    assert_string_equal(r.s, "message=a|message=b");
    /* LF CR: also two line ends (an LF is never swallowed after an LF) */
    assert_int_equal(parse_whole("data: a\n\rdata: b\n\n", 64, &r), 0);
    assert_string_equal(r.s, "message=a|message=b");
    /* CRLF split exactly between the CR and the LF is one line end */
    const char *s = "data: a\r\ndata: b\r\n\r\n";
    size_t cut = 8;
    assert_int_equal(parse_cut(s, strlen(s), &cut, 1, 64, &r, NULL), 0);
    assert_string_equal(r.s, "message=a\\nb");
}

static void test_comments(void **state)
{
    (void)state;
    rec r;
    char big[5000];
    memset(big, 'x', sizeof big);
    big[0] = ':';
    big[sizeof big - 1] = '\0';
    char s[6000];
    snprintf(s, sizeof s, ": ping\n%s\ndata: a\n: mid-event\ndata: b\n:\n\n",
             big);
    /* a comment far over the cap is skipped, not buffered */
    assert_int_equal(parse_whole(s, 64, &r), 0);
    assert_string_equal(r.s, "message=a\\nb");
    /* a comment alone dispatches nothing */
    assert_int_equal(parse_whole(": only\n\n", 64, &r), 0);
    assert_int_equal(r.n, 0);
    /* the colon of a split line is a separator, not a comment */
    const char *t = "data:x\n\n";
    size_t cut = 4;
    assert_int_equal(parse_cut(t, strlen(t), &cut, 1, 64, &r, NULL), 0);
    assert_string_equal(r.s, "message=x");
}

static void test_multiline_data(void **state)
{
    (void)state;
    rec r;
    assert_int_equal(
        parse_whole("data: a\ndata:\ndata: b\ndata:  c\n\n", 64, &r), 0);
    assert_string_equal(r.s, "message=a\\n\\nb\\n c");
    /* the event type resets after each dispatch */
    assert_int_equal(
        parse_whole("event: x\ndata: 1\n\ndata: 2\n\n", 64, &r), 0);
    assert_string_equal(r.s, "x=1|message=2");
    /* an event with no data field is not dispatched; "data" alone is */
    assert_int_equal(parse_whole("event: e\n\ndata\n\n", 64, &r), 0);
    assert_string_equal(r.s, "message=");
    assert_int_equal(r.n, 1);
    /* fields are case-sensitive */
    assert_int_equal(parse_whole("Data: no\nDATA: no\n\n", 64, &r), 0);
    assert_int_equal(r.n, 0);
}

static void test_bom(void **state)
{
    (void)state;
    rec r;
    const char *s = "\xEF\xBB\xBF" "data: x\n\n";
    assert_int_equal(parse_whole(s, 64, &r), 0);
    assert_string_equal(r.s, "message=x");
    for (size_t k = 0; k <= 4; k++) {
        assert_int_equal(parse_cut(s, strlen(s), &k, 1, 64, &r, NULL), 0);
        assert_string_equal(r.s, "message=x");
    }
    /* only one BOM is skipped: a second one makes an unknown field */
    assert_int_equal(
        parse_whole("\xEF\xBB\xBF\xEF\xBB\xBF" "data: x\n\ndata: y\n\n", 64,
                    &r), 0);
    assert_string_equal(r.s, "message=y");
    /* bytes that only begin like a BOM are text (here: a field name) */
    const char *h = "\xEF\xBB" "data: x\n\ndata: y\n\n";
    for (size_t k = 0; k <= 3; k++) {
        assert_int_equal(parse_cut(h, strlen(h), &k, 1, 64, &r, NULL), 0);
        assert_string_equal(r.s, "message=y");
    }
    /* a BOM-like prefix in the data of a later line is kept */
    assert_int_equal(parse_whole("data: \xEF\xBB\xBF!\n\n", 64, &r), 0);
    assert_string_equal(r.s, "message=\xEF\xBB\xBF!");
}

static void test_oversize(void **state)
{
    (void)state;
    rec r;
    /* exactly at the cap: 16 data bytes */
    assert_int_equal(parse_whole("data: 0123456789abcdef\n\n", 16, &r), 0);
    assert_string_equal(r.s, "message=0123456789abcdef");
    assert_int_equal(parse_whole("data: 0123456789abcdefX\n\n", 16, &r),
                     QG_ERANGE);
    assert_int_equal(r.n, 0);
    /* joined lines: 8 + LF + 8 = 17 */
    assert_int_equal(
        parse_whole("data: 01234567\ndata: 89abcdef\n\n", 16, &r), QG_ERANGE);
    /* the type counts too */
    assert_int_equal(parse_whole("event: abcdefghij\ndata: 0123456\n\n", 16,
                                 &r), QG_ERANGE);
    assert_int_equal(parse_whole("event: abcdefghi\ndata: 0123456\n\n", 16,
                                 &r), 0);
    assert_string_equal(r.s, "abcdefghi=0123456");
    /* a line split across feeds over the line cap */
    char big[300];
    memset(big, 'z', sizeof big);
    memcpy(big, "data: ", 6);
    size_t cuts[2] = {100, 200};
    assert_int_equal(parse_cut(big, sizeof big, cuts, 2, 16, &r, NULL),
                     QG_ERANGE);
    /* the failure is sticky until finish, which reports it and resets */
    qg_sse *p = qg__sse_new(16);
    assert_non_null(p);
    memset(&r, 0, sizeof r);
    assert_int_equal(qg__sse_feed(p, big, sizeof big, on_event, &r), QG_ERANGE);
    assert_int_equal(qg__sse_feed(p, "data: ok\n\n", 10, on_event, &r),
                     QG_ERANGE);
    assert_int_equal(qg__sse_finish(p), QG_ERANGE);
    assert_int_equal(qg__sse_feed(p, "data: ok\n\n", 10, on_event, &r), 0);
    assert_string_equal(r.s, "message=ok");
    qg__sse_free(p);
}

static void test_finish(void **state)
{
    (void)state;
    rec r;
    int frc;
    const char *s = "data: a\n\ndata: pending\n";
    assert_int_equal(parse_cut(s, strlen(s), NULL, 0, 64, &r, &frc), 0);
    assert_string_equal(r.s, "message=a");
    assert_int_equal(frc, 1);
    s = "data: a\n\ndata: partial";
    assert_int_equal(parse_cut(s, strlen(s), NULL, 0, 64, &r, &frc), 0);
    assert_string_equal(r.s, "message=a");
    assert_int_equal(frc, 1);
    s = "data: a\n\n";
    assert_int_equal(parse_cut(s, strlen(s), NULL, 0, 64, &r, &frc), 0);
    assert_int_equal(frc, 0);
    s = "";
    assert_int_equal(parse_cut(s, 0, NULL, 0, 64, &r, &frc), 0);
    assert_int_equal(frc, 0);
    assert_int_equal(r.n, 0);
    /* after finish the handle parses a new stream from scratch */
    qg_sse *p = qg__sse_new(64);
    assert_non_null(p);
    memset(&r, 0, sizeof r);
    assert_int_equal(qg__sse_feed(p, "event: t\ndata: x", 16, on_event, &r), 0);
    assert_int_equal(qg__sse_finish(p), 1);
    assert_int_equal(qg__sse_feed(p, "\xEF\xBB\xBF" "data: y\n\n", 12, on_event,
                                 &r), 0);
    assert_string_equal(r.s, "message=y");
    assert_int_equal(qg__sse_finish(p), 0);
    qg__sse_free(p);
    qg__sse_free(NULL);
}

static void test_callback_stops(void **state)
{
    (void)state;
    qg_sse *p = qg__sse_new(64);
    assert_non_null(p);
    rec r;
    memset(&r, 0, sizeof r);
    r.stop_at = 2;
    const char *s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    assert_int_equal(qg__sse_feed(p, s, strlen(s), on_event, &r), 7);
    assert_string_equal(r.s, "message=1|message=2");
    assert_int_equal(qg__sse_feed(p, "data: 4\n\n", 9, on_event, &r), 7);
    assert_int_equal(r.n, 2);
    qg__sse_free(p);
    /* a NULL callback parses and drops */
    p = qg__sse_new(64);
    assert_non_null(p);
    assert_int_equal(qg__sse_feed(p, s, strlen(s), NULL, NULL), 0);
    assert_int_equal(qg__sse_finish(p), 0);
    qg__sse_free(p);
}

/* Data with NUL bytes and arbitrary bytes round-trips by length. */
static void test_binary_data(void **state)
{
    (void)state;
    rec r;
    const char s[] = "data: a\0b\n\n";
    assert_int_equal(parse_cut(s, sizeof s - 1, NULL, 0, 64, &r, NULL), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.len, strlen("message=a") + 2);
    assert_memory_equal(r.s, "message=a\0b", r.len);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_whole),
        cmocka_unit_test(test_split_every_position),
        cmocka_unit_test(test_split_every_pair),
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_line_ends),
        cmocka_unit_test(test_comments),
        cmocka_unit_test(test_multiline_data),
        cmocka_unit_test(test_bom),
        cmocka_unit_test(test_oversize),
        cmocka_unit_test(test_finish),
        cmocka_unit_test(test_callback_stops),
        cmocka_unit_test(test_binary_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
