/* json_out.c - building the API's JSON bodies with jansson.
 *
 * Each body is assembled as a json_t tree and dumped compact.  Builders
 * take new references and hand them to their parent with the *_new
 * setters, so one json_decref of the root releases everything; a failed
 * allocation anywhere yields NULL at the root (jansson's setters accept a
 * NULL value and fail, and every body checks its final tree).  The only
 * floating point in quotagate lives in qg__json_scaled, at the output
 * boundary, where an exact integer-scaled value becomes a JSON number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "civil.h"
#include "fixed.h"
#include "json_out.h"
#include "tz.h"

/* --------------------------------------------------------------- atoms */

json_t *qg__json_scaled(int64_t v, int scale_digits)
{
    int64_t p = 1;
    for (int i = 0; i < scale_digits; i++)
        p *= 10;
    if (v % p == 0)
        return json_integer(v / p);
    /* v / p is correctly rounded; %.15g prints it back as the decimal. */
    return json_real((double)v / (double)p);
}

json_t *qg__json_milli(int64_t v)
{
    return qg__json_scaled(v, 3);
}

json_t *qg__json_time(int64_t ms)
{
    char buf[40];
    if (ms == 0)
        return json_null();
    qg_iso8601_format(ms, buf, (int)sizeof buf);
    return json_string(buf);
}

/* A string member, or null when s is NULL. */
static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

char *qg__json_dump_steal(json_t *j)
{
    char *s;
    if (!j)
        return NULL;
    s = json_dumps(j, QG_JSON_DUMP_FLAGS);
    json_decref(j);
    return s;
}

const char *qg__json_win_type_name(int type)
{
    static const char *const names[] = {"?", "rolling", "calendar", "session",
                                        "rate", "concurrency"};
    return type >= 1 && type <= QG_WIN_CONCURRENCY ? names[type] : "?";
}

const char *qg__json_settle_status_name(int status)
{
    static const char *const names[] = {"?", "completed", "cancelled",
                                        "failed"};
    return status >= 1 && status <= QG_SETTLE_FAILED ? names[status] : "?";
}

const char *qg__json_policy_name(int policy)
{
    /* A plan without an explicit policy rejects. */
    static const char *const names[] = {"reject", "reject", "queue",
                                        "downgrade", "payg"};
    return policy >= 0 && policy <= QG_POLICY_PAYG ? names[policy] : "?";
}

static const char *unit_of(const qg_window_view *v, const char *unit_name)
{
    if (v->unit == QG_UNIT_REQUESTS)
        return "requests";
    return unit_name ? unit_name : "weight points";
}

/* ------------------------------------------------- direct text builder
 *
 * The bodies answered on every request (check, settle, error) are written
 * straight into one growing buffer instead of a json_t tree dumped by
 * jansson (a tree costs a malloc per member and the dump a printf per
 * atom).  The text is byte for byte what jansson writes with
 * QG_JSON_DUMP_FLAGS: members in insertion order, compact separators,
 * strings escaped as jansson does ('"', '\\', control characters; UTF-8
 * passed through), integers as %lld, reals through jansson's own dtostr
 * rules (%.15g, ".0" added to an integral-looking real, exponent without
 * '+' or leading zeros).  A string that is not valid UTF-8 fails the
 * body (NULL), as json_string() would. */

typedef struct jb {
    char *p;
    size_t len, cap;
    int err;
} jb;

static int jb_init(jb *b, size_t cap)
{
    b->len = 0;
    b->err = 0;
    b->cap = cap;
    b->p = malloc(cap);
    if (!b->p)
        b->err = 1;
    return b->p ? 0 : -1;
}

static int jb_grow(jb *b, size_t more)
{
    size_t cap = b->cap ? b->cap : 256;
    char *np;
    if (b->err)
        return -1;
    while (cap - b->len < more + 1) {
        if (cap > SIZE_MAX / 4) {
            b->err = 1;
            return -1;
        }
        cap *= 2;
    }
    if (!(np = realloc(b->p, cap))) {
        b->err = 1;
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static inline int jb_room(jb *b, size_t more)
{
    if (b->err)
        return -1;
    return b->cap - b->len >= more + 1 ? 0 : jb_grow(b, more);
}

static void jb_raw(jb *b, const char *s, size_t n)
{
    if (jb_room(b, n) < 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

#define JB_LIT(b, lit) jb_raw((b), (lit), sizeof(lit) - 1)

static void jb_i64(jb *b, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (jb_room(b, 21) < 0)
        return;
    do
        tmp[n++] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        b->p[b->len++] = '-';
    while (n > 0)
        b->p[b->len++] = tmp[--n];
}

/* jansson's jsonp_dtostr with precision 15. */
static void jb_real(jb *b, double v)
{
    char buf[64], *start, *end;
    int ret = snprintf(buf, sizeof buf, "%.15g", v);
    size_t length;
    if (ret < 0 || (size_t)ret >= sizeof buf - 3 || v != v ||
        v - v != 0) {  /* jansson refuses nan and inf */
        b->err = 1;
        return;
    }
    length = (size_t)ret;
    if (!strchr(buf, '.') && !strchr(buf, 'e')) {
        buf[length++] = '.';
        buf[length++] = '0';
        buf[length] = '\0';
    }
    if ((start = strchr(buf, 'e'))) {
        start++;
        end = start + 1;
        if (*start == '-')
            start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, length - (size_t)(end - buf));
            length -= (size_t)(end - start);
        }
    }
    jb_raw(b, buf, length);
}

/* As qg__json_scaled dumps. */
static void jb_scaled(jb *b, int64_t v, int scale_digits)
{
    int64_t p = 1;
    for (int i = 0; i < scale_digits; i++)
        p *= 10;
    if (v % p == 0)
        jb_i64(b, v / p);
    else
        jb_real(b, (double)v / (double)p);
}

static void jb_milli(jb *b, int64_t v)
{
    jb_scaled(b, v, 3);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid:
 * jansson's utf8_check_first / utf8_check_full. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t size, i;
    uint32_t v;
    if (c < 0x80)
        return 1;
    if (c < 0xC2 || c > 0xF4)
        return 0;
    if (c < 0xE0) {
        size = 2;
        v = c & 0x1F;
    } else if (c < 0xF0) {
        size = 3;
        v = c & 0x0F;
    } else {
        size = 4;
        v = c & 0x07;
    }
    if (size > n)
        return 0;
    for (i = 1; i < size; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) ||
        (size == 3 && v < 0x800) || (size == 4 && v < 0x10000))
        return 0;
    return size;
}

/* A JSON string as jansson dumps it; NULL writes null (str_or_null). */
static void jb_str(jb *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *u = (const unsigned char *)s;
    size_t n, i = 0;
    if (!s) {
        JB_LIT(b, "null");
        return;
    }
    n = strlen(s);
    /* worst case: every byte a \u00XX escape */
    if (jb_room(b, n * 6 + 2) < 0)
        return;
    char *o = b->p + b->len;
    *o++ = '"';
    while (i < n) {
        unsigned c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c >= 0x80) {
            size_t k = utf8_seq(u + i, n - i);
            if (!k) {
                b->err = 1;
                return;
            }
            memcpy(o, u + i, k);
            o += k;
            i += k;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
        i++;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
}

static void jb_bool(jb *b, int v)
{
    if (v)
        JB_LIT(b, "true");
    else
        JB_LIT(b, "false");
}

static char *two(char *o, int v)
{
    o[0] = (char)('0' + v / 10);
    o[1] = (char)('0' + v % 10);
    return o + 2;
}

/* qg__json_time: the ISO 8601 string of ms, or null when ms is 0. */
static void jb_time(jb *b, int64_t ms)
{
    qg_civil c;
    char buf[40], *o = buf;
    if (ms == 0) {
        JB_LIT(b, "null");
        return;
    }
    qg__ms_to_civil(ms, &c);
    if (c.year < 0 || c.year > 9999) {
        qg_iso8601_format(ms, buf, (int)sizeof buf);
        jb_str(b, buf);
        return;
    }
    *o++ = '"';
    o = two(o, c.year / 100);
    o = two(o, c.year % 100);
    *o++ = '-';
    o = two(o, c.month);
    *o++ = '-';
    o = two(o, c.day);
    *o++ = 'T';
    o = two(o, c.hour);
    *o++ = ':';
    o = two(o, c.minute);
    *o++ = ':';
    o = two(o, c.second);
    if (c.ms != 0) {
        *o++ = '.';
        *o++ = (char)('0' + c.ms / 100);
        o = two(o, c.ms % 100);
    }
    *o++ = 'Z';
    *o++ = '"';
    jb_raw(b, buf, (size_t)(o - buf));
}

/* The text, or NULL (released) when anything failed. */
static char *jb_finish(jb *b)
{
    if (b->err || jb_room(b, 0) < 0) {
        free(b->p);
        return NULL;
    }
    b->p[b->len] = '\0';
    return b->p;
}

/* ------------------------------------------------------------- windows */

json_t *qg__json_window(const qg_window_view *v, const char *unit_name)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (json_object_set_new(o, "name", str_or_null(v->name)) ||
        json_object_set_new(o, "scope",
                            json_string(v->org ? "org" : "member")) ||
        json_object_set_new(o, "type",
                            json_string(qg__json_win_type_name(v->type))) ||
        json_object_set_new(o, "unit", json_string(unit_of(v, unit_name))) ||
        json_object_set_new(o, "limit", qg__json_milli(v->limit_milli)) ||
        json_object_set_new(o, "used", qg__json_milli(v->used_milli)) ||
        json_object_set_new(o, "remaining",
                            qg__json_milli(v->remaining_milli)) ||
        json_object_set_new(o, "reset_at", qg__json_time(v->reset_at_ms))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* One recovery step; window name included when name is non-NULL. */
static json_t *recovery_point(const char *name, const qg_recovery_point *p,
                              int64_t now_ms)
{
    json_t *o = json_object();
    int64_t in = p->at_ms > now_ms ? p->at_ms - now_ms : 0;
    if (!o)
        return NULL;
    if ((name && json_object_set_new(o, "window", json_string(name))) ||
        json_object_set_new(o, "at", qg__json_time(p->at_ms)) ||
        json_object_set_new(o, "in_s", qg__json_milli(in)) ||
        json_object_set_new(o, "remaining",
                            qg__json_milli(p->remaining_milli))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Recovery steps of view i (all views when i < 0, each named). */
static json_t *recovers_array(const qg_decision *d, int only, int64_t now_ms)
{
    json_t *a = json_array();
    for (int i = 0; a && i < d->nviews; i++) {
        if (only >= 0 && i != only)
            continue;
        int n = d->nrecovery[i];
        if (n > QG_MAX_RECOVERY)
            n = QG_MAX_RECOVERY;
        for (int k = 0; k < n; k++)
            if (json_array_append_new(
                    a, recovery_point(only >= 0 ? NULL : d->views[i].name,
                                      &d->recovery[i][k], now_ms))) {
                json_decref(a);
                return NULL;
            }
    }
    return a;
}

/* --------------------------------------------------------------- check */

/* The window a refusal names: the binding one, or for a request no window
 * can hold, the first whose limit is below the weight. */
static int refusing_view(const qg_decision *d)
{
    if (d->binding >= 0 && d->binding < d->nviews)
        return d->binding;
    for (int i = 0; i < d->nviews; i++)
        if (d->outcome == QG_REJECT_NEVER
                ? d->views[i].limit_milli < d->weight_milli
                : d->views[i].remaining_milli < d->weight_milli)
            return i;
    return -1;
}

/* The refusal's plain sentence, in the words pricing and the console use. */
static void refusal_message(const qg_decision *d, int b, const char *unit,
                            char *buf, size_t cap)
{
    char used[32], limit[32], weight[32], at[40];
    qg_fixed_format(d->weight_milli, 3, weight, sizeof weight);
    if (b < 0) {
        snprintf(buf, cap, "request refused: this request (%s) does not fit",
                 weight);
        return;
    }
    const qg_window_view *v = &d->views[b];
    const char *u = unit_of(v, unit);
    qg_fixed_format(v->used_milli, 3, used, sizeof used);
    qg_fixed_format(v->limit_milli, 3, limit, sizeof limit);
    if (d->outcome == QG_REJECT_NEVER) {
        snprintf(buf, cap,
                 "this request (%s %s) exceeds the %s limit of %s %s on "
                 "plan %s: it can never be admitted",
                 weight, unit ? unit : "weight points", v->name, limit, u,
                 d->plan ? d->plan : "?");
        return;
    }
    qg_iso8601_format(d->decided_at_ms + d->retry_after_ms, at,
                      (int)sizeof at);
    /* A request-unit window counts this request as one request: its
     * weight would be a number in another unit, so it is left out. */
    if (v->unit == QG_UNIT_REQUESTS)
        snprintf(buf, cap,
                 "%s limit reached: %s of %s %s %s; this request fits "
                 "again at %s",
                 v->name, used, limit, u,
                 v->type == QG_WIN_CONCURRENCY ? "in flight" : "used", at);
    else
        snprintf(buf, cap,
                 "%s limit reached: %s of %s %s used; this request (%s) "
                 "fits again at %s",
                 v->name, used, limit, u, weight, at);
}

/* The spending-cap refusal's sentence. */
static void cap_message(const qg_decision *d, int b, const char *unit,
                        char *buf, size_t cap)
{
    char spent[32], capv[32], cost[32], over[32], at[40];
    qg_fixed_format(d->spent_micro, 6, spent, sizeof spent);
    qg_fixed_format(d->spending_cap_micro, 6, capv, sizeof capv);
    qg_fixed_format(d->overage_cost_micro, 6, cost, sizeof cost);
    qg_fixed_format(d->overage_milli, 3, over, sizeof over);
    if (d->outcome == QG_REJECT_NEVER) {
        snprintf(buf, cap, "spending cap reached: this request's overage "
                 "(%s %s beyond %s) would cost $%s, more than the whole "
                 "spending cap of $%s: it can never be admitted", over,
                 unit ? unit : "weight points",
                 b >= 0 ? d->views[b].name : "the limit", cost, capv);
        return;
    }
    qg_iso8601_format(d->decided_at_ms + d->retry_after_ms, at,
                      (int)sizeof at);
    snprintf(buf, cap, "spending cap reached: $%s of $%s spent this period; "
             "this request's overage (%s %s beyond %s) would cost $%s; it "
             "fits again at %s", spent, capv, over,
             unit ? unit : "weight points",
             b >= 0 ? d->views[b].name : "the limit", cost, at);
}

/* The payg object of a decision (docs/api.md). */
static void jb_overage(jb *b, const qg_decision *d)
{
    JB_LIT(b, ",\"overage\":{\"policy\":\"payg\",\"units\":");
    jb_milli(b, d->overage_milli);
    JB_LIT(b, ",\"price_per_unit_usd\":");
    jb_scaled(b, d->overage_price_micro, 6);
    JB_LIT(b, ",\"cost_usd\":");
    jb_scaled(b, d->overage_cost_micro, 6);
    JB_LIT(b, ",\"spent_usd\":");
    jb_scaled(b, d->spent_micro, 6);
    JB_LIT(b, ",\"spending_cap_usd\":");
    if (d->spending_cap_micro > 0)
        jb_scaled(b, d->spending_cap_micro, 6);
    else
        JB_LIT(b, "null");
    JB_LIT(b, ",\"cap_resets_at\":");
    jb_time(b, d->cap_period_end_ms);
    JB_LIT(b, "}");
}

/* qg__json_window's object. */
static void jb_window(jb *b, const qg_window_view *v, const char *unit_name)
{
    JB_LIT(b, "{\"name\":");
    jb_str(b, v->name);
    if (v->org)
        JB_LIT(b, ",\"scope\":\"org\",\"type\":");
    else
        JB_LIT(b, ",\"scope\":\"member\",\"type\":");
    jb_str(b, qg__json_win_type_name(v->type));
    JB_LIT(b, ",\"unit\":");
    jb_str(b, unit_of(v, unit_name));
    JB_LIT(b, ",\"limit\":");
    jb_milli(b, v->limit_milli);
    JB_LIT(b, ",\"used\":");
    jb_milli(b, v->used_milli);
    JB_LIT(b, ",\"remaining\":");
    jb_milli(b, v->remaining_milli);
    JB_LIT(b, ",\"reset_at\":");
    jb_time(b, v->reset_at_ms);
    JB_LIT(b, "}");
}

/* recovers_array(d, -1, now_ms): every view's steps, each named. */
static void jb_recovers(jb *b, const qg_decision *d, int64_t now_ms)
{
    int first = 1;
    JB_LIT(b, "[");
    for (int i = 0; i < d->nviews; i++) {
        int n = d->nrecovery[i];
        if (n > QG_MAX_RECOVERY)
            n = QG_MAX_RECOVERY;
        for (int k = 0; k < n; k++) {
            const qg_recovery_point *p = &d->recovery[i][k];
            int64_t in = p->at_ms > now_ms ? p->at_ms - now_ms : 0;
            if (!first)
                JB_LIT(b, ",");
            first = 0;
            if (d->views[i].name) {
                JB_LIT(b, "{\"window\":");
                jb_str(b, d->views[i].name);
                JB_LIT(b, ",\"at\":");
            } else {
                JB_LIT(b, "{\"at\":");
            }
            jb_time(b, p->at_ms);
            JB_LIT(b, ",\"in_s\":");
            jb_milli(b, in);
            JB_LIT(b, ",\"remaining\":");
            jb_milli(b, p->remaining_milli);
            JB_LIT(b, "}");
        }
    }
    JB_LIT(b, "]");
}

char *qg__json_check(const qg_decision *d, const char *request_id,
                    const char *unit_name)
{
    int refused = d->outcome == QG_REJECT || d->outcome == QG_REJECT_NEVER;
    char msg[512];
    jb b;

    if (jb_init(&b, 256 + 256 * (size_t)(d->nviews > 0 ? d->nviews : 1)) < 0)
        return NULL;
    if (refused)
        JB_LIT(&b, "{\"decision\":\"reject\",\"request_id\":");
    else
        JB_LIT(&b, "{\"decision\":\"allow\",\"request_id\":");
    jb_str(&b, request_id);
    JB_LIT(&b, ",\"weight\":");
    jb_milli(&b, d->weight_milli);
    JB_LIT(&b, ",\"plan\":");
    jb_str(&b, d->plan);
    if (d->org) {
        JB_LIT(&b, ",\"org\":");
        jb_str(&b, d->org);
    }
    if (d->model) {
        JB_LIT(&b, ",\"model\":");
        jb_str(&b, d->model);
    }
    JB_LIT(&b, ",\"rules_version\":");
    jb_str(&b, d->rules_version);
    JB_LIT(&b, ",\"weights_version\":");
    jb_str(&b, d->weights_version);
    if (!refused) {
        JB_LIT(&b, ",\"replayed\":");
        jb_bool(&b, d->replayed);
        if (d->headroom_milli >= 0)
            jb_overage(&b, d);
    } else {
        int v = refusing_view(d);
        int never = d->outcome == QG_REJECT_NEVER;
        if (d->cap_reached)
            cap_message(d, v, unit_name, msg, sizeof msg);
        else
            refusal_message(d, v, unit_name, msg, sizeof msg);
        if (d->cap_reached)
            JB_LIT(&b, ",\"error\":{\"type\":\"spending_cap_reached\""
                       ",\"window\":");
        else if (never)
            JB_LIT(&b, ",\"error\":{\"type\":\"request_too_large_for_plan\""
                       ",\"window\":");
        else
            JB_LIT(&b, ",\"error\":{\"type\":\"quota_exceeded\",\"window\":");
        jb_str(&b, v >= 0 ? d->views[v].name : NULL);
        JB_LIT(&b, ",\"message\":");
        jb_str(&b, msg);
        JB_LIT(&b, "},\"retryable\":");
        jb_bool(&b, !never);
        if (!never) {
            JB_LIT(&b, ",\"retry_after_s\":");
            jb_milli(&b, d->retry_after_ms > 0 ? d->retry_after_ms : 0);
        }
        if (d->cap_reached)
            jb_overage(&b, d);
        JB_LIT(&b, ",\"recovers\":");
        jb_recovers(&b, d, d->decided_at_ms);
    }
    JB_LIT(&b, ",\"windows\":[");
    for (int i = 0; i < d->nviews; i++) {
        if (i)
            JB_LIT(&b, ",");
        jb_window(&b, &d->views[i], unit_name);
    }
    JB_LIT(&b, "]}");
    return jb_finish(&b);
}

/* -------------------------------------------------------------- settle */

char *qg__json_settle(const qg_settle_result *s, const char *request_id)
{
    jb b;
    if (jb_init(&b, 256) < 0)
        return NULL;
    JB_LIT(&b, "{\"request_id\":");
    jb_str(&b, request_id);
    JB_LIT(&b, ",\"status\":");
    jb_str(&b, qg__json_settle_status_name(s->status));
    JB_LIT(&b, ",\"reserved\":");
    jb_milli(&b, s->reserved_milli);
    JB_LIT(&b, ",\"actual\":");
    jb_milli(&b, s->actual_milli);
    JB_LIT(&b, ",\"charged\":");
    jb_milli(&b, s->charged_milli);
    JB_LIT(&b, ",\"late\":");
    jb_bool(&b, s->late);
    JB_LIT(&b, ",\"replayed\":");
    jb_bool(&b, s->replayed);
    if (s->overage_milli > 0 || s->overage_cost_micro > 0) {
        JB_LIT(&b, ",\"overage_units\":");
        jb_milli(&b, s->overage_milli);
        JB_LIT(&b, ",\"overage_cost_usd\":");
        jb_scaled(&b, s->overage_cost_micro, 6);
    }
    JB_LIT(&b, "}");
    return jb_finish(&b);
}

/* --------------------------------------------------------------- usage */

static json_t *forecast_of(const qg_decision *d, int i)
{
    const qg_window_view *v = &d->views[i];
    int n = d->nrecovery[i] > QG_MAX_RECOVERY ? QG_MAX_RECOVERY
                                              : d->nrecovery[i];
    json_t *next = json_null();
    int64_t full_at = 0;

    /* The schedule's last step is the full recovery when it reaches the
     * limit (rolling schedules keep it even when truncated). */
    if (v->used_milli > 0 && n > 0 &&
        d->recovery[i][n - 1].remaining_milli >= v->limit_milli)
        full_at = d->recovery[i][n - 1].at_ms;
    if (n > 0) {
        json_decref(next);
        next = json_pack("{s:o,s:o}", "at",
                         qg__json_time(d->recovery[i][0].at_ms), "remaining",
                         qg__json_milli(d->recovery[i][0].remaining_milli));
    }
    /* json_pack steals the "o" references, also when it fails. */
    return json_pack("{s:o,s:o,s:o}", "name", str_or_null(v->name),
                     "full_at", qg__json_time(full_at), "next_recovery", next);
}

char *qg__json_usage(const qg_decision *d, const char *subject,
                    int64_t now_ms, const char *unit_name)
{
    json_t *o = json_object(), *wins = json_array(), *fc = json_array();

    if (json_object_set_new(o, "subject", str_or_null(subject)) ||
        json_object_set_new(o, "plan", str_or_null(d->plan)) ||
        json_object_set_new(o, "org", str_or_null(d->org)) ||
        json_object_set_new(o, "rules_version",
                            str_or_null(d->rules_version)) ||
        json_object_set_new(o, "unit",
                            json_string(unit_name ? unit_name
                                                  : "weight points")) ||
        json_object_set_new(o, "windows", json_incref(wins)) ||
        json_object_set_new(o, "forecast", json_incref(fc)))
        goto fail;
    for (int i = 0; i < d->nviews; i++) {
        json_t *w = qg__json_window(&d->views[i], unit_name);
        if (json_array_append_new(wins, w) ||
            json_object_set_new(w, "recovers", recovers_array(d, i, now_ms)) ||
            json_array_append_new(fc, forecast_of(d, i)))
            goto fail;
    }
    if (d->cap_period_end_ms > 0) {
        /* payg: the money side (docs/api.md) */
        json_t *p = json_object();
        if (json_object_set_new(o, "overage", p ? p : json_null()) || !p ||
            json_object_set_new(p, "policy", json_string("payg")) ||
            json_object_set_new(p, "price_per_unit_usd",
                                qg__json_scaled(d->overage_price_micro, 6)) ||
            json_object_set_new(p, "spent_usd",
                                qg__json_scaled(d->spent_micro, 6)) ||
            json_object_set_new(p, "spending_cap_usd",
                                d->spending_cap_micro > 0
                                    ? qg__json_scaled(d->spending_cap_micro, 6)
                                    : json_null()) ||
            json_object_set_new(p, "cap_resets_at",
                                qg__json_time(d->cap_period_end_ms)))
            goto fail;
    }
    json_decref(wins);
    json_decref(fc);
    return qg__json_dump_steal(o);
fail:
    json_decref(wins);
    json_decref(fc);
    json_decref(o);
    return NULL;
}

/* --------------------------------------------------------------- plans */

static json_t *overage_of(const qg_rules *r, const qg_overage *ov)
{
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "policy",
                                  json_string(qg__json_policy_name(
                                      ov->policy))))
        goto fail;
    switch (ov->policy) {
    case QG_POLICY_QUEUE:
        if (json_object_set_new(o, "max_wait_s",
                                qg__json_milli(ov->max_wait_ms)) ||
            json_object_set_new(o, "queue_size",
                                json_integer(ov->queue_size)))
            goto fail;
        break;
    case QG_POLICY_DOWNGRADE:
        if (json_object_set_new(
                o, "to_model",
                str_or_null(ov->to_model >= 0 && ov->to_model < r->nmodels
                                ? r->models[ov->to_model].name
                                : NULL)))
            goto fail;
        break;
    case QG_POLICY_PAYG:
        if (json_object_set_new(o, "price_per_unit_usd",
                                qg__json_scaled(ov->price_per_unit_micro, 6)) ||
            json_object_set_new(o, "spending_cap_usd_month",
                                ov->spending_cap_micro > 0
                                    ? qg__json_scaled(ov->spending_cap_micro, 6)
                                    : json_null()))
            goto fail;
        break;
    default:
        break;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

/* The calendar's "at" as written in rules: "00:00", "MON 00:00", "1 00:00". */
static void calendar_at(const qg_calendar_spec *c, char *buf, size_t cap)
{
    static const char *const wd[] = {"MON", "TUE", "WED", "THU",
                                     "FRI", "SAT", "SUN"};
    int hh = c->minute_of_day / 60, mm = c->minute_of_day % 60;
    if (c->every == QG_EVERY_WEEK && c->weekday >= 0 && c->weekday < 7)
        snprintf(buf, cap, "%s %02d:%02d", wd[c->weekday], hh, mm);
    else if (c->every == QG_EVERY_MONTH)
        snprintf(buf, cap, "%d %02d:%02d", c->mday, hh, mm);
    else
        snprintf(buf, cap, "%02d:%02d", hh, mm);
}

static json_t *window_spec(const qg_rules *r, const qg_window_spec *w)
{
    static const char *const every[] = {"?", "day", "week", "month"};
    json_t *o = json_object();
    char at[32];
    int rc = 0;

    if (!o)
        return NULL;
    rc |= json_object_set_new(o, "name", json_string(w->name));
    rc |= json_object_set_new(o, "type",
                              json_string(qg__json_win_type_name(w->type)));
    rc |= json_object_set_new(o, "limit", qg__json_milli(w->limit_milli));
    rc |= json_object_set_new(o, "unit",
                              json_string(w->unit == QG_UNIT_REQUESTS
                                              ? "requests"
                                              : r->unit ? r->unit
                                                        : "weight points"));
    switch (w->type) {
    case QG_WIN_ROLLING:
    case QG_WIN_SESSION:
        rc |= json_object_set_new(o, "length_s", qg__json_milli(w->length_ms));
        break;
    case QG_WIN_CALENDAR:
        rc |= json_object_set_new(
            o, "every",
            json_string(w->cal.every >= 1 && w->cal.every <= 3
                            ? every[w->cal.every]
                            : "?"));
        if (w->cal.every == QG_EVERY_MONTH && w->cal.anchor_billing) {
            rc |= json_object_set_new(o, "anchor", json_string("billing"));
        } else {
            calendar_at(&w->cal, at, sizeof at);
            rc |= json_object_set_new(o, "at", json_string(at));
        }
        rc |= json_object_set_new(
            o, "tz", str_or_null(w->cal.tz ? qg__tz_name(w->cal.tz) : NULL));
        break;
    case QG_WIN_RATE:
        rc |= json_object_set_new(o, "per_s", qg__json_milli(w->length_ms));
        rc |= json_object_set_new(o, "burst", qg__json_milli(w->burst_milli));
        break;
    case QG_WIN_CONCURRENCY:
        rc |= json_object_set_new(o, "lease_ttl_s",
                                  qg__json_milli(w->lease_ttl_ms));
        break;
    }
    if (w->model_mask) {
        json_t *m = json_array();
        rc |= json_object_set_new(o, "models", m);
        for (int i = 0; m && i < r->nmodels && i < QG_MAX_MODELS; i++)
            if ((w->model_mask >> i) & 1)
                rc |= json_array_append_new(m,
                                            json_string(r->models[i].name));
    }
    if (w->overage.policy != QG_POLICY_NONE)
        rc |= json_object_set_new(o, "overage", overage_of(r, &w->overage));
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The windows of a plan or org except concurrency (given on its own). */
static json_t *specs_array(const qg_rules *r, const qg_window_spec *w, int n,
                           int64_t *concurrency)
{
    json_t *a = json_array();
    *concurrency = 0;
    for (int i = 0; a && i < n; i++) {
        if (w[i].type == QG_WIN_CONCURRENCY) {
            *concurrency = w[i].limit_milli / QG_MILLI;
            continue;
        }
        if (json_array_append_new(a, window_spec(r, &w[i]))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *plan_obj(const qg_rules *r, const qg_plan *p)
{
    json_t *o = json_object();
    int64_t conc = 0;
    int rc = 0;

    if (!o)
        return NULL;
    rc |= json_object_set_new(o, "name", json_string(p->name));
    rc |= json_object_set_new(o, "price_usd_month",
                              p->price_micro >= 0
                                  ? qg__json_scaled(p->price_micro, 6)
                                  : json_null());
    rc |= json_object_set_new(o, "windows",
                              specs_array(r, p->windows, p->nwindows, &conc));
    rc |= json_object_set_new(o, "concurrency",
                              conc > 0 ? json_integer(conc) : json_null());
    rc |= json_object_set_new(o, "overage", overage_of(r, &p->overage));
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *org_obj(const qg_rules *r, const qg_org_spec *g)
{
    json_t *o = json_object();
    int64_t conc = 0;
    int rc = 0;

    if (!o)
        return NULL;
    rc |= json_object_set_new(o, "name", json_string(g->name));
    rc |= json_object_set_new(o, "windows",
                              specs_array(r, g->windows, g->nwindows, &conc));
    rc |= json_object_set_new(o, "concurrency",
                              conc > 0 ? json_integer(conc) : json_null());
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *qg__json_plans(const qg_rules *r)
{
    json_t *o = json_object(), *plans = json_array(), *orgs = json_array();
    int rc = 0;

    rc |= json_object_set_new(o, "rules_version", str_or_null(r->version));
    rc |= json_object_set_new(o, "weights_version",
                              str_or_null(r->weights_version));
    rc |= json_object_set_new(o, "unit",
                              json_string(r->unit ? r->unit : "weight points"));
    rc |= json_object_set_new(o, "plans", plans);
    rc |= json_object_set_new(o, "orgs", orgs);
    for (int i = 0; !rc && i < r->nplans; i++)
        rc |= json_array_append_new(plans, plan_obj(r, &r->plans[i]));
    for (int i = 0; !rc && i < r->norgs; i++)
        rc |= json_array_append_new(orgs, org_obj(r, &r->orgs[i]));
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return qg__json_dump_steal(o);
}

/* A calibration instant: its date when at midnight UTC, as rules write
 * it, else the full ISO 8601 time. */
static json_t *date_of(int64_t ms)
{
    char buf[40];
    if (ms == 0)
        return json_null();
    qg_iso8601_format(ms, buf, (int)sizeof buf);
    if (ms % QG_MS_PER_DAY == 0)
        buf[10] = '\0';
    return json_string(buf);
}

char *qg__json_weights(const qg_rules *r)
{
    json_t *o = json_object(), *models = json_array();
    int rc = 0;

    rc |= json_object_set_new(o, "version", str_or_null(r->weights_version));
    rc |= json_object_set_new(o, "calibrated", date_of(r->calibrated_ms));
    rc |= json_object_set_new(o, "unit",
                              json_string(r->unit ? r->unit : "weight points"));
    rc |= json_object_set_new(o, "models", models);
    for (int i = 0; !rc && i < r->nmodels; i++) {
        const qg_model *m = &r->models[i];
        json_t *e = json_object();
        rc |= json_array_append_new(models, e);
        if (rc)
            break;
        rc |= json_object_set_new(e, "name", json_string(m->name));
        rc |= json_object_set_new(e, "per_request",
                                  qg__json_milli(m->per_request_milli));
        rc |= json_object_set_new(e, "input_per_1k",
                                  qg__json_scaled(m->input_per_1k_micro, 6));
        rc |= json_object_set_new(e, "output_per_1k",
                                  qg__json_scaled(m->output_per_1k_micro, 6));
    }
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return qg__json_dump_steal(o);
}

char *qg__json_error(const char *type, const char *message)
{
    jb b;
    if (jb_init(&b, 128 + (message ? strlen(message) : 0)) < 0)
        return NULL;
    JB_LIT(&b, "{\"error\":{\"type\":");
    jb_str(&b, type);
    JB_LIT(&b, ",\"message\":");
    jb_str(&b, message);
    JB_LIT(&b, "}}");
    return jb_finish(&b);
}
