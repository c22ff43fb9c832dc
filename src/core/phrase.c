/* phrase.c - the one phrase builder (phrase.h): the words of windows,
 * claims and effective figures that pricing, /v1/plans, the console and
 * the refusal messages share.
 *
 * Durations are said in the largest unit that divides them ("5 hours",
 * "90 seconds", "1 week" as "week"); calendar windows by their period and
 * reset ("per calendar week, resetting Monday 00:00 UTC"); amounts with
 * thousands grouped and the exact decimals of the fixed-point value.  An
 * effective multiplier is rounded to one decimal, down, so that a page
 * never claims more than the rules redeem; "about" marks the rounding. */
#include <stdio.h>
#include <string.h>
#include "fixed.h"
#include "phrase.h"
#include "tz.h"

/* snprintf that says -1 when the text did not fit. */
static int put_n(size_t cap, int n)
{
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int qg__phrase_amount(int64_t milli, char *buf, size_t cap)
{
    char digits[32], out[48];
    int64_t whole = milli / QG_MILLI, frac = milli % QG_MILLI;
    size_t n, o = 0;
    if (milli < 0)
        return put_n(cap, snprintf(buf, cap, "-"));
    n = (size_t)snprintf(digits, sizeof digits, "%lld", (long long)whole);
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
    if (frac) {
        char f[8];
        int k = snprintf(f, sizeof f, "%03lld", (long long)frac);
        while (k > 0 && f[k - 1] == '0')
            f[--k] = '\0';
        return put_n(cap, snprintf(buf, cap, "%s.%s", out, f));
    }
    return put_n(cap, snprintf(buf, cap, "%s", out));
}

int qg__phrase_plan(const char *name, char *buf, size_t cap)
{
    int n;
    if (!name || !*name)
        return -1;
    n = put_n(cap, snprintf(buf, cap, "%s", name));
    if (n > 0 && buf[0] >= 'a' && buf[0] <= 'z')
        buf[0] = (char)(buf[0] - 'a' + 'A');
    return n;
}

/* On every decision's headers, body and ledger row (several times each):
 * copied by hand, as snprintf would cut it, without its format parsing. */
int qg__phrase_window_name(const char *name, int org, char *buf, size_t cap)
{
    const char *pre = org ? "org." : "";
    size_t p = org ? 4 : 0, n = name ? strlen(name) : 0, k, m;
    if (!cap)
        return -1;
    k = p < cap - 1 ? p : cap - 1;
    memcpy(buf, pre, k);
    m = n < cap - 1 - k ? n : cap - 1 - k;
    if (m)
        memcpy(buf + k, name, m);
    buf[k + m] = 0;
    return p + n >= cap ? -1 : (int)(p + n);
}

/* "5 hours", "minute" (count 1 and bare), "90 seconds". */
static int duration_words(int64_t ms, int bare_one, char *buf, size_t cap)
{
    static const struct { int64_t ms; const char *one, *many; } u[] = {
        {7 * 86400000LL, "week", "weeks"}, {86400000LL, "day", "days"},
        {3600000LL, "hour", "hours"},      {60000LL, "minute", "minutes"},
        {1000LL, "second", "seconds"},     {1LL, "millisecond", "milliseconds"},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        if (ms <= 0 || ms % u[i].ms)
            continue;
        if (ms == u[i].ms)
            return put_n(cap, snprintf(buf, cap, "%s%s",
                                          bare_one ? "" : "1 ", u[i].one));
        return put_n(cap, snprintf(buf, cap, "%lld %s",
                                      (long long)(ms / u[i].ms), u[i].many));
    }
    return -1;
}

/* "5-hour", "1-minute": a length as an adjective. */
static int duration_adjective(int64_t ms, char *buf, size_t cap)
{
    char w[48], *sp;
    if (duration_words(ms, 0, w, sizeof w) < 0)
        return -1;
    if ((sp = strchr(w, ' ')))
        *sp = '-';
    if (w[strlen(w) - 1] == 's')
        w[strlen(w) - 1] = '\0';
    return put_n(cap, snprintf(buf, cap, "%s", w));
}

static const char *unit_of(const qg_rules *r, const qg_window_spec *w)
{
    if (w->unit == QG_UNIT_REQUESTS || w->type == QG_WIN_CONCURRENCY)
        return "requests";
    return r && r->unit ? r->unit : "weight points";
}

/* " (large only)", " (large and huge only)" or "". */
static void scope_words(const qg_rules *r, const qg_window_spec *w, char *buf,
                        size_t cap)
{
    size_t o = 0;
    int n = 0, k = 0;
    buf[0] = '\0';
    if (!w->model_mask || !r)
        return;
    for (int i = 0; i < r->nmodels && i < QG_MAX_MODELS; i++)
        n += (int)((w->model_mask >> i) & 1);
    o += (size_t)snprintf(buf, cap, " (");
    for (int i = 0; i < r->nmodels && i < QG_MAX_MODELS && o < cap; i++) {
        if (!((w->model_mask >> i) & 1))
            continue;
        o += (size_t)snprintf(buf + o, cap - o, "%s%s",
                              k == 0 ? "" : k == n - 1 ? " and " : ", ",
                              r->models[i].name);
        k++;
    }
    if (o < cap)
        snprintf(buf + o, cap - o, " only)");
}

static const char *const weekdays[] = {"Monday", "Tuesday", "Wednesday",
                                       "Thursday", "Friday", "Saturday",
                                       "Sunday"};

/* ", resetting Monday 00:00 UTC" and the like. */
static int calendar_reset(const qg_calendar_spec *c, char *buf, size_t cap)
{
    int hh = c->minute_of_day / 60, mm = c->minute_of_day % 60;
    const char *tz = c->tz ? qg__tz_name(c->tz) : "UTC";
    if (c->every == QG_EVERY_MONTH && c->anchor_billing)
        return put_n(cap, snprintf(buf, cap, ", resetting on each "
                                      "subject's billing day (%s)", tz));
    if (c->every == QG_EVERY_WEEK && c->weekday >= 0 && c->weekday < 7)
        return put_n(cap, snprintf(buf, cap, ", resetting %s %02d:%02d %s",
                                      weekdays[c->weekday], hh, mm, tz));
    if (c->every == QG_EVERY_MONTH)
        return put_n(cap, snprintf(buf, cap, ", resetting on day %d at "
                                      "%02d:%02d %s", c->mday, hh, mm, tz));
    return put_n(cap, snprintf(buf, cap, ", resetting %02d:%02d %s", hh,
                                  mm, tz));
}

int qg__phrase_window(const qg_rules *r, const qg_window_spec *w, char *buf,
                      size_t cap)
{
    static const char *const every[] = {"?", "day", "week", "month"};
    char amount[48], len[48], reset[160], scope[256];
    if (!w || qg__phrase_amount(w->limit_milli, amount, sizeof amount) < 0)
        return -1;
    scope_words(r, w, scope, sizeof scope);
    switch (w->type) {
    case QG_WIN_ROLLING:
        if (duration_words(w->length_ms, 1, len, sizeof len) < 0)
            return -1;
        return put_n(cap, snprintf(buf, cap, "%s %s per rolling %s%s",
                                      amount, unit_of(r, w), len, scope));
    case QG_WIN_SESSION:
        if (duration_adjective(w->length_ms, len, sizeof len) < 0)
            return -1;
        return put_n(cap, snprintf(buf, cap, "%s %s per %s session, from "
                                      "the first request%s", amount,
                                      unit_of(r, w), len, scope));
    case QG_WIN_CALENDAR:
        if (calendar_reset(&w->cal, reset, sizeof reset) < 0 ||
            w->cal.every < QG_EVERY_DAY || w->cal.every > QG_EVERY_MONTH)
            return -1;
        return put_n(cap, snprintf(buf, cap, "%s %s per calendar %s%s%s",
                                      amount, unit_of(r, w),
                                      every[w->cal.every], reset, scope));
    case QG_WIN_RATE:
        if (duration_words(w->length_ms, 1, len, sizeof len) < 0)
            return -1;
        return put_n(cap, snprintf(buf, cap, "%s %s per %s%s", amount,
                                      unit_of(r, w), len, scope));
    case QG_WIN_CONCURRENCY:
        return put_n(cap, snprintf(buf, cap, "%s requests in flight",
                                      amount));
    }
    return -1;
}

/* "within each 5-hour window", "per calendar week", "per minute". */
static int window_span(const qg_window_spec *w, char *buf, size_t cap)
{
    static const char *const every[] = {"?", "day", "week", "month"};
    char len[48];
    switch (w->type) {
    case QG_WIN_ROLLING:
        if (duration_adjective(w->length_ms, len, sizeof len) < 0)
            return -1;
        return put_n(cap, snprintf(buf, cap, "within each %s window", len));
    case QG_WIN_SESSION:
        if (duration_adjective(w->length_ms, len, sizeof len) < 0)
            return -1;
        return put_n(cap, snprintf(buf, cap, "within each %s session",
                                      len));
    case QG_WIN_CALENDAR:
        if (w->cal.every < QG_EVERY_DAY || w->cal.every > QG_EVERY_MONTH)
            return -1;
        return put_n(cap, snprintf(buf, cap, "per calendar %s",
                                      every[w->cal.every]));
    case QG_WIN_RATE:
        if (duration_words(w->length_ms, 1, len, sizeof len) < 0)
            return -1;
        return put_n(cap, snprintf(buf, cap, "per %s", len));
    case QG_WIN_CONCURRENCY:
        return put_n(cap, snprintf(buf, cap, "in flight at once"));
    }
    return -1;
}

/* A multiplier in milli: exact ("20", "3.5", "1.666"). */
static void multiplier_text(int64_t m, char *buf, size_t cap)
{
    qg_fixed_format(m, 3, buf, cap);
}

int qg__phrase_claim(const qg_rules *r, int64_t multiplier_milli,
                     const char *vs_plan, const qg_window_spec *w,
                     const qg_window_spec *base, char *buf, size_t cap)
{
    char m[32], vs[QG_NAME_MAX], span[64], a[48], b[48];
    if (!w || !base || multiplier_milli <= 0 ||
        qg__phrase_plan(vs_plan, vs, sizeof vs) < 0 ||
        window_span(w, span, sizeof span) < 0 ||
        qg__phrase_amount(w->limit_milli, a, sizeof a) < 0 ||
        qg__phrase_amount(base->limit_milli, b, sizeof b) < 0)
        return -1;
    multiplier_text(multiplier_milli, m, sizeof m);
    return put_n(cap, snprintf(buf, cap, "up to %s\xc3\x97 %s %s (%s vs %s "
                                  "%s)", m, vs, span, a, b, unit_of(r, w)));
}

int qg__phrase_period(int64_t period_ms, char *buf, size_t cap)
{
    char w[48];
    if (period_ms == 30 * 86400000LL)
        return put_n(cap, snprintf(buf, cap, "per 30 days"));
    if (duration_words(period_ms, 1, w, sizeof w) < 0)
        return -1;
    return put_n(cap, snprintf(buf, cap, "per %s", w));
}

int qg__phrase_effective(const qg_rules *r, int64_t effective_milli,
                         const char *vs_plan, int64_t period_ms,
                         int64_t redeemable_milli, int64_t base_milli,
                         char *buf, size_t cap)
{
    char m[32], vs[QG_NAME_MAX], per[48], a[48], b[48];
    int64_t tenths = effective_milli / 100;     /* rounded down */
    const char *unit = r && r->unit ? r->unit : "weight points";
    if (effective_milli < 0 || redeemable_milli < 0 || base_milli <= 0 ||
        qg__phrase_plan(vs_plan, vs, sizeof vs) < 0 ||
        qg__phrase_period(period_ms, per, sizeof per) < 0 ||
        qg__phrase_amount(redeemable_milli, a, sizeof a) < 0 ||
        qg__phrase_amount(base_milli, b, sizeof b) < 0)
        return -1;
    qg_fixed_format(tenths, 1, m, sizeof m);
    return put_n(cap, snprintf(buf, cap, "%s%s\xc3\x97 %s %s: %s vs %s %s",
                                  tenths * 100 == effective_milli ? ""
                                                                  : "about ",
                                  m, vs, per, a, b, unit));
}
