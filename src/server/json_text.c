/* json_text.c - see json_text.h: JSON atoms and the direct text
 * builder.  The only floating point in quotagate lives here (qg__json_scaled,
 * qg__jb_real), at the output boundary, where an exact integer-scaled
 * value becomes a JSON number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "civil.h"
#include "fixed.h"
#include "json_text.h"
#include "rules.h"

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

const char *qg__json_unit_of(const qg_window_view *v, const char *unit_name)
{
    if (v->unit == QG_UNIT_REQUESTS)
        return "requests";
    return unit_name ? unit_name : "weight points";
}



int qg__jb_init(qg__jb *b, size_t cap)
{
    b->len = 0;
    b->err = 0;
    b->cap = cap;
    b->p = malloc(cap);
    if (!b->p)
        b->err = 1;
    return b->p ? 0 : -1;
}

int qg__jb_grow(qg__jb *b, size_t more)
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




void qg__jb_i64(qg__jb *b, int64_t v)
{
    if (qg__jb_room(b, QG_DEC_MAX + 1) < 0)
        return;
    b->len += qg__dec_i64(b->p + b->len, v);
}

/* jansson's jsonp_dtostr with precision 15. */
void qg__jb_real(qg__jb *b, double v)
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
    qg__jb_raw(b, buf, length);
}

/* As qg__json_scaled dumps. */
void qg__jb_scaled(qg__jb *b, int64_t v, int scale_digits)
{
    int64_t p = 1;
    for (int i = 0; i < scale_digits; i++)
        p *= 10;
    if (v % p == 0)
        qg__jb_i64(b, v / p);
    else
        qg__jb_real(b, (double)v / (double)p);
}

void qg__jb_milli(qg__jb *b, int64_t v)
{
    qg__jb_scaled(b, v, 3);
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

/* Whether any of the eight bytes in w needs more than a copy into a JSON
 * string: a control byte (< 0x20), a byte of a multi-byte sequence (>=
 * 0x80, validated byte by byte), '"' or '\\'.  The word tests of "Bit
 * Twiddling Hacks" (a byte below n; a zero byte, after an XOR with the
 * byte looked for) flag the high bit of each such byte.  A borrow may
 * also flag bytes above a match, never below one, so the lowest flag is
 * the first byte to look at. */
static inline uint64_t special8(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, high = ones << 7;
    uint64_t q = w ^ (ones * '"'), bs = w ^ (ones * '\\');
    uint64_t ctl = (w - ones * 0x20) & ~w;
    uint64_t zq = (q - ones) & ~q, zb = (bs - ones) & ~bs;
    return (w | ctl | zq | zb) & high;
}

/* A JSON string as jansson dumps it; NULL writes null (str_or_null). */
void qg__jb_str(qg__jb *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *u = (const unsigned char *)s;
    size_t n, i = 0;
    if (!s) {
        QG__JB_LIT(b, "null");
        return;
    }
    n = strlen(s);
    /* worst case: every byte a \u00XX escape; 8 more for whole words */
    if (qg__jb_room(b, n * 6 + 2 + 8) < 0)
        return;
    char *o = b->p + b->len;
    *o++ = '"';
    while (i < n) {
        unsigned c;
        /* up to eight bytes at a time (the last few padded with 'a'),
         * copied whole; the first that needs a look stops the run */
        size_t left = n - i, k = 8;
        uint64_t w = 0x6161616161616161ULL, m;
        memcpy(&w, u + i, left < 8 ? left : 8);
        if ((m = special8(w)) != 0) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            k = (size_t)__builtin_ctzll(m) >> 3;
#else
            k = 0;
#endif
        }
        if (k > left)
            k = left;
        memcpy(o, &w, 8); /* room: 8 spare bytes reserved */
        o += k;
        i += k;
        if (k == 8 || i == n)
            continue;
        c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c >= 0x80) {
            size_t seq = utf8_seq(u + i, n - i);
            if (!seq) {
                b->err = 1;
                return;
            }
            memcpy(o, u + i, seq);
            o += seq;
            i += seq;
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

void qg__jb_bool(qg__jb *b, int v)
{
    if (v)
        QG__JB_LIT(b, "true");
    else
        QG__JB_LIT(b, "false");
}

static char *two(char *o, int v)
{
    o[0] = (char)('0' + v / 10);
    o[1] = (char)('0' + v % 10);
    return o + 2;
}

/* qg__json_time: the ISO 8601 string of ms, or null when ms is 0. */
void qg__jb_time(qg__jb *b, int64_t ms)
{
    qg_civil c;
    char buf[40], *o = buf;
    if (ms == 0) {
        QG__JB_LIT(b, "null");
        return;
    }
    qg__ms_to_civil(ms, &c);
    if (c.year < 0 || c.year > 9999) {
        qg_iso8601_format(ms, buf, (int)sizeof buf);
        qg__jb_str(b, buf);
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
    qg__jb_raw(b, buf, (size_t)(o - buf));
}

/* The text, or NULL (released) when anything failed. */
char *qg__jb_finish(qg__jb *b)
{
    if (b->err || qg__jb_room(b, 0) < 0) {
        free(b->p);
        return NULL;
    }
    b->p[b->len] = '\0';
    return b->p;
}

