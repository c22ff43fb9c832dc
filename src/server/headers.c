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

/* Go's Duration.String() restricted to whole milliseconds: below one
 * second "<n>ms"; otherwise [<h>h][<m>m]<s>[.<frac>]s where the minutes
 * appear whenever hours do ("1h0m0s") and the fraction loses trailing
 * zeros ("1.5s"). */
size_t qg_go_duration(int64_t ms, char *buf, size_t cap)
{
    char tmp[48], frac[8] = "";
    uint64_t u = ms < 0 ? (uint64_t)0 - (uint64_t)ms : (uint64_t)ms;
    const char *sign = ms < 0 ? "-" : "";
    int n;

    if (u == 0) {
        n = snprintf(tmp, sizeof tmp, "0s");
    } else if (u < 1000) {
        n = snprintf(tmp, sizeof tmp, "%s%llums", sign, (unsigned long long)u);
    } else {
        uint64_t h = u / 3600000, m = u / 60000 % 60, s = u / 1000 % 60;
        unsigned f = (unsigned)(u % 1000);
        if (f) {
            snprintf(frac, sizeof frac, ".%03u", f);
            for (size_t k = strlen(frac); frac[k - 1] == '0'; k--)
                frac[k - 1] = '\0';
        }
        if (h)
            n = snprintf(tmp, sizeof tmp, "%s%lluh%llum%llu%ss", sign,
                         (unsigned long long)h, (unsigned long long)m,
                         (unsigned long long)s, frac);
        else if (m)
            n = snprintf(tmp, sizeof tmp, "%s%llum%llu%ss", sign,
                         (unsigned long long)m, (unsigned long long)s, frac);
        else
            n = snprintf(tmp, sizeof tmp, "%s%llu%ss", sign,
                         (unsigned long long)s, frac);
    }
    if (cap > 0) {
        size_t k = (size_t)n < cap ? (size_t)n : cap - 1;
        memcpy(buf, tmp, k);
        buf[k] = '\0';
    }
    return (size_t)n;
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

static void w_printf(writer *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void w_printf(writer *w, const char *fmt, ...)
{
    qg_hdr_buf *b = w->b;
    size_t room = QG_HDR_TEXT - b->used;
    va_list ap;
    int n;

    if (w->overflow || room == 0) {
        w->overflow = 1;
        return;
    }
    va_start(ap, fmt);
    n = vsnprintf(b->text + b->used, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= room)
        w->overflow = 1;
    else
        b->used += (size_t)n;
}

/* A window name as a structured-field string: quotes and backslashes
 * escaped, anything outside printable ASCII replaced by '?' (header
 * values may carry nothing else). */
static void w_sf_string(writer *w, const char *s)
{
    w_printf(w, "\"");
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            w_printf(w, "\\%c", c);
        else if (c < 0x20 || c > 0x7e)
            w_printf(w, "?");
        else
            w_printf(w, "%c", c);
    }
    w_printf(w, "\"");
}

/* The policy name of a view: the window's name, prefixed "org." for the
 * organisation's windows so that a member's and its org's same-named
 * windows (both may have "concurrency") stay distinct. */
static void w_policy_name(writer *w, const qg_window_view *v)
{
    char buf[QG_NAME_MAX + 8];
    snprintf(buf, sizeof buf, "%s%s", v->org ? "org." : "",
             v->name ? v->name : "");
    w_sf_string(w, buf);
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

static void header(writer *w, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void header(writer *w, const char *name, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    w_begin(w);
    w_printf(w, "%s", tmp);
    w_end(w, name);
}

/* ------------------------------------------------------------- windows */

/* The spec of view v: member windows in d's plan, org windows in d's org,
 * both by name.  NULL when absent. */
static const qg_window_spec *spec_of(const qg_rules *r, const qg_decision *d,
                                     const qg_window_view *v)
{
    if (!r || !v->name)
        return NULL;
    if (v->org) {
        int o = d->org ? qg_rules_find_org(r, d->org) : -1;
        if (o < 0)
            return NULL;
        for (int i = 0; i < r->orgs[o].nwindows; i++)
            if (strcmp(r->orgs[o].windows[i].name, v->name) == 0)
                return &r->orgs[o].windows[i];
        return NULL;
    }
    int p = d->plan ? qg_rules_find_plan(r, d->plan) : -1;
    return p < 0 ? NULL : qg_plan_find_window(&r->plans[p], v->name);
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
        return s->length_ms > 0 ? qg_ceil_div(s->length_ms, 1000) : -1;
    case QG_WIN_CALENDAR:
        /* The current period's real length: 23 or 25 hours on DST days,
         * 28 to 31 days for months (billing anchors are the member's). */
        at = v->reset_at_ms > 0 ? v->reset_at_ms - 1 : now_ms;
        if (qg_calendar_period(&s->cal, v->org ? 0 : d->anchor_ms, at, &start,
                               &end) != 0)
            return -1;
        return qg_ceil_div(end - start, 1000);
    default:
        return -1;
    }
}

/* Whole seconds from now until at, rounded up; 0 when at is 0 or past. */
static int64_t secs_until(int64_t at_ms, int64_t now_ms)
{
    if (at_ms <= 0 || at_ms <= now_ms)
        return 0;
    return qg_ceil_div(at_ms - now_ms, 1000);
}

/* Index of the view with the least remaining among those of the wanted
 * unit (concurrency excluded), or -1. */
static int least_remaining(const qg_decision *d, int unit)
{
    int best = -1;
    for (int i = 0; i < d->nviews; i++) {
        const qg_window_view *v = &d->views[i];
        if (v->type == QG_WIN_CONCURRENCY || v->unit != unit)
            continue;
        if (best < 0 || v->remaining_milli < d->views[best].remaining_milli)
            best = i;
    }
    return best;
}

static void openai_family(writer *w, const qg_decision *d, int64_t now_ms,
                          int unit, const char *const names[3])
{
    int i = least_remaining(d, unit);
    char dur[48];

    if (i < 0)
        return;
    const qg_window_view *v = &d->views[i];
    int64_t until = v->reset_at_ms > now_ms ? v->reset_at_ms - now_ms : 0;
    qg_go_duration(until, dur, sizeof dur);
    header(w, names[0], "%lld", (long long)(v->limit_milli / 1000));
    header(w, names[1], "%lld", (long long)(v->remaining_milli / 1000));
    header(w, names[2], "%s", dur);
}

static const char *const requests_names[3] = {
    "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests"};
static const char *const tokens_names[3] = {
    "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens"};

int qg_headers_for_decision(const qg_decision *d, const qg_rules *r,
                            int64_t now_ms, qg_hdr_buf *out)
{
    writer w = {out, 0, 0};

    out->n = 0;
    out->used = 0;
    if (d->nviews > 0) {
        w_begin(&w);
        for (int i = 0; i < d->nviews; i++) {
            const qg_window_view *v = &d->views[i];
            int64_t secs = window_seconds(d, v, spec_of(r, d, v), now_ms);
            if (i)
                w_printf(&w, ", ");
            w_policy_name(&w, v);
            w_printf(&w, ";q=%lld", (long long)(v->limit_milli / 1000));
            if (secs >= 0)
                w_printf(&w, ";w=%lld", (long long)secs);
            if (v->type == QG_WIN_CONCURRENCY)
                w_printf(&w, ";qu=\"concurrent-requests\"");
            else if (v->unit == QG_UNIT_REQUESTS)
                w_printf(&w, ";qu=\"requests\"");
        }
        w_end(&w, "RateLimit-Policy");

        w_begin(&w);
        for (int i = 0; i < d->nviews; i++) {
            const qg_window_view *v = &d->views[i];
            if (i)
                w_printf(&w, ", ");
            w_policy_name(&w, v);
            w_printf(&w, ";r=%lld;t=%lld",
                     (long long)(v->remaining_milli / 1000),
                     (long long)secs_until(v->reset_at_ms, now_ms));
        }
        w_end(&w, "RateLimit");
    }
    openai_family(&w, d, now_ms, QG_UNIT_REQUESTS, requests_names);
    openai_family(&w, d, now_ms, QG_UNIT_WEIGHT, tokens_names);

    if (d->outcome == QG_REJECT) {
        int64_t ra = d->retry_after_ms > 0 ? d->retry_after_ms : 0;
        header(&w, "Retry-After", "%lld", (long long)qg_ceil_div(ra, 1000));
        header(&w, "retry-after-ms", "%lld", (long long)ra);
        header(&w, "x-should-retry", "%s", ra <= 60000 ? "true" : "false");
    } else if (d->outcome == QG_REJECT_NEVER) {
        header(&w, "x-should-retry", "%s", "false");
    }
    if (w.overflow) {
        out->n = 0;
        out->used = 0;
        return -1;
    }
    return out->n;
}
