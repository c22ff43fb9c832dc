/* headers.c - RateLimit-Policy / RateLimit (IETF draft), the OpenAI
 * x-ratelimit-* family and Retry-After for one decision, written into a
 * fixed caller buffer without allocating.  The contract is in headers.h;
 * the arithmetic here is all integer: whole points are floors of milli
 * values, seconds until a reset are rounded up so that a client waiting
 * that long never retries early. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "calendar.h"
#include "fixed.h"
#include "headers.h"
#include "phrase.h"

/* Go's Duration.String() restricted to whole milliseconds: below one
 * second "<n>ms"; otherwise [<h>h][<m>m]<s>[.<frac>]s where the minutes
 * appear whenever hours do ("1h0m0s") and the fraction loses trailing
 * zeros ("1.5s"). */
static char *put_u64(char *o, uint64_t v)
{
    return o + qg__dec_u64(o, v);
}

size_t qg__go_duration(int64_t ms, char *buf, size_t cap)
{
    char tmp[48], *o = tmp;
    uint64_t u = ms < 0 ? (uint64_t)0 - (uint64_t)ms : (uint64_t)ms;
    size_t n;

    if (ms < 0 && u != 0)
        *o++ = '-';
    if (u == 0) {
        *o++ = '0';
        *o++ = 's';
    } else if (u < 1000) {
        o = put_u64(o, u);
        *o++ = 'm';
        *o++ = 's';
    } else {
        uint64_t h = u / 3600000, m = u / 60000 % 60, s = u / 1000 % 60;
        unsigned f = (unsigned)(u % 1000);
        if (h) {
            o = put_u64(o, h);
            *o++ = 'h';
        }
        if (h || m) {
            o = put_u64(o, m);
            *o++ = 'm';
        }
        o = put_u64(o, s);
        if (f) {               /* ".%03u" without its trailing zeros */
            *o++ = '.';
            *o++ = (char)('0' + f / 100);
            if (f % 100) {
                *o++ = (char)('0' + f / 10 % 10);
                if (f % 10)
                    *o++ = (char)('0' + f % 10);
            }
        }
        *o++ = 's';
    }
    n = (size_t)(o - tmp);
    if (cap > 0) {
        size_t k = n < cap ? n : cap - 1;
        memcpy(buf, tmp, k);
        buf[k] = '\0';
    }
    return n;
}

/* ------------------------------------------------------------ the buffer */

typedef struct writer {
    qg_hdr_buf *b;
    size_t start;      /* where the value being written begins */
    int overflow;
} writer;

static void w_begin(writer *w)
{
    w->start = w->b->used;
    if (w->b->used < QG_HDR_TEXT)
        w->b->text[w->b->used] = '\0';
}

/* Append n bytes (w_printf's rules: the text must leave room for the
 * NUL, else the writer overflows). */
static void w_raw(writer *w, const char *s, size_t n)
{
    qg_hdr_buf *b = w->b;
    size_t room = QG_HDR_TEXT - b->used;
    if (w->overflow || room == 0 || n >= room) {
        w->overflow = 1;
        return;
    }
    memcpy(b->text + b->used, s, n);
    b->used += n;
    b->text[b->used] = '\0';
}

#define W_LIT(w, lit) w_raw((w), (lit), sizeof(lit) - 1)

/* %lld */
static void w_i64(writer *w, int64_t v)
{
    char tmp[QG_DEC_MAX + 1];
    w_raw(w, tmp, qg__dec_i64(tmp, v));
}

/* A window name as a structured-field string: quotes and backslashes
 * escaped, anything outside printable ASCII replaced by '?' (header
 * values may carry nothing else).  s has at most n bytes. */
static void w_sf_string(writer *w, const char *s, size_t n)
{
    char tmp[2 * (QG_NAME_MAX + 8) + 2], *o = tmp;
    size_t i;
    *o++ = '"';
    for (i = 0; s && i < n && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20 || c > 0x7e) {
            *o++ = '?';
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    w_raw(w, tmp, (size_t)(o - tmp));
}

/* The policy name of a view: the window's name, prefixed "org." for the
 * organisation's windows so that a member's and its org's same-named
 * windows (both may have "concurrency") stay distinct (at most
 * QG_NAME_MAX + 7 bytes in all, the rest cut). */
static void w_policy_name(writer *w, const qg_window_view *v)
{
    char buf[QG_NAME_MAX + 8];
    int n = qg__phrase_window_name(v->name, v->org, buf, sizeof buf);
    w_sf_string(w, buf, n < 0 ? 0 : (size_t)n);
}

/* Close the value begun by w_begin as header `name`. */
static void w_end(writer *w, const char *name)
{
    qg_hdr_buf *b = w->b;
    if (w->overflow || b->n >= QG_HDR_MAX || b->used >= QG_HDR_TEXT) {
        w->overflow = 1;
        return;
    }
    b->text[b->used++] = '\0';
    b->h[b->n].name = name;
    b->h[b->n].value = b->text + w->start;
    b->n++;
}

/* A header whose value is text (at most 127 bytes are kept, as the
 * formatted headers always were). */
static void header_str(writer *w, const char *name, const char *v)
{
    size_t n = strlen(v);
    w_begin(w);
    w_raw(w, v, n < 127 ? n : 127);
    w_end(w, name);
}

/* A header whose value is an integer. */
static void header_i64(writer *w, const char *name, int64_t v)
{
    w_begin(w);
    w_i64(w, v);
    w_end(w, name);
}

/* ------------------------------------------------------------- windows */

/* The spec of view v (headers.h). */
const qg_window_spec *qg__view_spec(const qg_rules *r, const qg_decision *d,
                                    const qg_window_view *v)
{
    if (!r || !v->name)
        return NULL;
    if (v->org) {
        int o = d->org ? qg__rules_find_org(r, d->org) : -1;
        if (o < 0)
            return NULL;
        for (int i = 0; i < r->orgs[o].nwindows; i++)
            if (strcmp(r->orgs[o].windows[i].name, v->name) == 0)
                return &r->orgs[o].windows[i];
        return NULL;
    }
    int p = d->plan ? qg__rules_find_plan(r, d->plan) : -1;
    return p < 0 ? NULL : qg__plan_find_window(&r->plans[p], v->name);
}

/* The policy's w= in seconds, or -1 to omit it: rolling and session
 * windows their length, rate windows their period (both rounded up to a
 * whole second), calendar windows their nominal period (a day, a week;
 * months vary, so none), concurrency none. */
static int64_t window_seconds(const qg_decision *d, const qg_window_view *v,
                              const qg_window_spec *s, int64_t now_ms)
{
    int64_t start, end, at;
    if (!s)
        return -1;
    switch (v->type) {
    case QG_WIN_ROLLING:
    case QG_WIN_SESSION:
    case QG_WIN_RATE:
        return s->length_ms > 0 ? qg__ceil_div(s->length_ms, 1000) : -1;
    case QG_WIN_CALENDAR:
        /* The current period's real length: 23 or 25 hours on DST days,
         * 28 to 31 days for months (billing anchors are the member's):
         * the engine's, when its view carries it (the period it enforces;
         * computing it again was ~800 instructions of every answer). */
        if (v->period_ms > 0)
            return qg__ceil_div(v->period_ms, 1000);
        at = v->reset_at_ms > 0 ? v->reset_at_ms - 1 : now_ms;
        if (qg__calendar_period(&s->cal, v->org ? 0 : d->anchor_ms, at, &start,
                               &end) != 0)
            return -1;
        return qg__ceil_div(end - start, 1000);
    default:
        return -1;
    }
}

/* Whole seconds from now until at, rounded up; 0 when at is 0 or past. */
static int64_t secs_until(int64_t at_ms, int64_t now_ms)
{
    if (at_ms <= 0 || at_ms <= now_ms)
        return 0;
    return qg__ceil_div(at_ms - now_ms, 1000);
}

/* Index of the view with the least remaining among those of the wanted
 * unit that apply to the request's model (concurrency excluded; a window
 * scoped to other models says nothing of this request), or -1.  spec[i]
 * is view i's spec (qg__view_spec, looked up once per decision). */
static int least_remaining(const qg_decision *d, const qg_rules *r,
                           const qg_window_spec *const *spec, qg_unit unit)
{
    int best = -1;
    int model = r && d->model ? qg_rules_find_model(r, d->model) : -1;
    for (int i = 0; i < d->nviews; i++) {
        const qg_window_view *v = &d->views[i];
        if (v->type == QG_WIN_CONCURRENCY || v->unit != unit)
            continue;
        if (spec[i] && !qg__window_applies(spec[i], model))
            continue;
        if (best < 0 || v->remaining_milli < d->views[best].remaining_milli)
            best = i;
    }
    return best;
}

static void openai_family(writer *w, const qg_decision *d,
                          const qg_rules *r,
                          const qg_window_spec *const *spec, int64_t now_ms,
                          int unit, const char *const names[3])
{
    int i = least_remaining(d, r, spec, unit);
    char dur[48];

    if (i < 0)
        return;
    const qg_window_view *v = &d->views[i];
    int64_t until = v->reset_at_ms > now_ms ? v->reset_at_ms - now_ms : 0;
    qg__go_duration(until, dur, sizeof dur);
    header_i64(w, names[0], v->limit_milli / 1000);
    header_i64(w, names[1], v->remaining_milli / 1000);
    header_str(w, names[2], dur);
}

static const char *const requests_names[3] = {
    "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests"};
static const char *const tokens_names[3] = {
    "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens"};

int qg__headers_for_decision(const qg_decision *d, const qg_rules *r,
                            int64_t now_ms, qg_hdr_buf *out)
{
    writer w = {out, 0, 0};
    const qg_window_spec *spec[QG_MAX_VIEWS];

    out->n = 0;
    out->used = 0;
    for (int i = 0; i < d->nviews && i < QG_MAX_VIEWS; i++)
        spec[i] = qg__view_spec(r, d, &d->views[i]);
    if (d->nviews > 0) {
        w_begin(&w);
        for (int i = 0; i < d->nviews; i++) {
            const qg_window_view *v = &d->views[i];
            int64_t secs = window_seconds(d, v, spec[i], now_ms);
            if (i)
                W_LIT(&w, ", ");
            w_policy_name(&w, v);
            W_LIT(&w, ";q=");
            w_i64(&w, v->limit_milli / 1000);
            if (secs >= 0) {
                W_LIT(&w, ";w=");
                w_i64(&w, secs);
            }
            if (v->type == QG_WIN_CONCURRENCY)
                W_LIT(&w, ";qu=\"concurrent-requests\"");
            else if (v->unit == QG_UNIT_REQUESTS)
                W_LIT(&w, ";qu=\"requests\"");
        }
        w_end(&w, "RateLimit-Policy");

        w_begin(&w);
        for (int i = 0; i < d->nviews; i++) {
            const qg_window_view *v = &d->views[i];
            if (i)
                W_LIT(&w, ", ");
            w_policy_name(&w, v);
            W_LIT(&w, ";r=");
            w_i64(&w, v->remaining_milli / 1000);
            W_LIT(&w, ";t=");
            w_i64(&w, secs_until(v->reset_at_ms, now_ms));
        }
        w_end(&w, "RateLimit");
    }
    openai_family(&w, d, r, spec, now_ms, QG_UNIT_REQUESTS, requests_names);
    openai_family(&w, d, r, spec, now_ms, QG_UNIT_WEIGHT, tokens_names);

    if (d->outcome == QG_REJECT) {
        int64_t ra = d->retry_after_ms > 0 ? d->retry_after_ms : 0;
        header_i64(&w, "Retry-After", qg__ceil_div(ra, 1000));
        header_i64(&w, "retry-after-ms", ra);
        header_str(&w, "x-should-retry", ra <= 60000 ? "true" : "false");
    } else if (d->outcome == QG_REJECT_NEVER) {
        header_str(&w, "x-should-retry", "false");
    }
    /* payg: what the admitted request costs beyond the plan (docs/api.md) */
    if (d->outcome == QG_ALLOW && d->overage_milli > 0) {
        char num[40];
        qg_fixed_format(d->overage_milli, 3, num, sizeof num);
        header_str(&w, "x-quotagate-overage-units", num);
        qg_fixed_format(d->overage_cost_micro, 6, num, sizeof num);
        header_str(&w, "x-quotagate-overage-cost-usd", num);
    }
    if (w.overflow) {
        out->n = 0;
        out->used = 0;
        return -1;
    }
    return out->n;
}
