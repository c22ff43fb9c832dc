/* tz.c - IANA time zones built from TZif bytes (RFC 8536), no I/O.
 *
 * A zone is a sorted list of transitions (UTC seconds) each naming a local
 * time type (UTC offset, DST flag), plus the POSIX TZ string of the v2+
 * footer ("CET-1CEST,M3.5.0,M10.5.0/3") that says what happens after the
 * last transition, which is how a file covers years past 2037.  Offsets are
 * looked up by binary search; everything is read-only once built, so a zone
 * can be shared by threads.  All arithmetic is integer; times are handled
 * in whole seconds internally (TZif has no finer resolution). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "civil.h"
#include "tz.h"

#define SECS_PER_DAY 86400

/* One of the two date rules of a POSIX TZ string. */
typedef struct tz_rule {
    char kind;    /* 'J': Julian 1..365 without Feb 29; 'N': 0..365 with it;
                     'M': month.week.weekday */
    int a, b, c;  /* J/N: a = day; M: a = month, b = week 1..5, c = wday
                     0 = Sunday */
    int32_t time; /* local seconds after midnight, -167h..167h */
} tz_rule;

typedef struct tz_posix {
    int present;
    int has_dst;
    int32_t std_off, dst_off; /* seconds east of UTC */
    tz_rule start, end;       /* DST starts (in standard time), ends (in DST) */
} tz_posix;

struct qg_tz {
    char *name;
    size_t ntrans;
    int64_t *trans;           /* UTC seconds, strictly ascending */
    unsigned char *tidx;      /* type of each transition */
    int ntypes;
    int32_t *utoff;
    unsigned char *isdst;
    int init_type;            /* type before the first transition */
    tz_posix rule;            /* after the last transition */
};


static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0)
        q--;
    return q;
}

/* ---- POSIX TZ strings -------------------------------------------------- */

typedef struct cursor {
    const char *p, *end;
} cursor;

static int peek(const cursor *c)
{
    return c->p < c->end ? (unsigned char)*c->p : 0;
}

static int is_alpha(int ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z');
}

static int is_digit(int ch)
{
    return ch >= '0' && ch <= '9';
}

/* An abbreviation: "EST" or a quoted "<+03>". */
static int parse_abbr(cursor *c)
{
    int n = 0;
    if (peek(c) == '<') {
        c->p++;
        while (peek(c) && peek(c) != '>') {
            int ch = peek(c);
            if (!is_alpha(ch) && !is_digit(ch) && ch != '+' && ch != '-')
                return -1;
            c->p++;
            n++;
        }
        if (peek(c) != '>' || n == 0)
            return -1;
        c->p++;
        return 0;
    }
    while (is_alpha(peek(c))) {
        c->p++;
        n++;
    }
    return n >= 1 ? 0 : -1;
}

/* Unsigned decimal of 1..maxd digits, at most maxv. */
static int parse_num(cursor *c, int maxd, int maxv, int *out)
{
    int v = 0, n = 0;
    while (is_digit(peek(c)) && n < maxd) {
        v = v * 10 + (peek(c) - '0');
        c->p++;
        n++;
    }
    if (n == 0 || v > maxv)
        return -1;
    *out = v;
    return 0;
}

/* [+-]hh[:mm[:ss]] with hh <= maxh, into signed seconds. */
static int parse_hms(cursor *c, int maxh, int32_t *out)
{
    int sign = 1, h, m = 0, s = 0;
    if (peek(c) == '+' || peek(c) == '-') {
        sign = peek(c) == '-' ? -1 : 1;
        c->p++;
    }
    if (parse_num(c, 3, maxh, &h) < 0)
        return -1;
    if (peek(c) == ':') {
        c->p++;
        if (parse_num(c, 2, 59, &m) < 0)
            return -1;
        if (peek(c) == ':') {
            c->p++;
            if (parse_num(c, 2, 59, &s) < 0)
                return -1;
        }
    }
    *out = sign * (h * 3600 + m * 60 + s);
    return 0;
}

static int parse_rule(cursor *c, tz_rule *r)
{
    int ch = peek(c);
    r->time = 2 * 3600;                       /* default 02:00:00 */
    r->b = r->c = 0;
    if (ch == 'J') {
        c->p++;
        r->kind = 'J';
        if (parse_num(c, 3, 365, &r->a) < 0 || r->a < 1)
            return -1;
    } else if (is_digit(ch)) {
        r->kind = 'N';
        if (parse_num(c, 3, 365, &r->a) < 0)
            return -1;
    } else if (ch == 'M') {
        c->p++;
        r->kind = 'M';
        if (parse_num(c, 2, 12, &r->a) < 0 || r->a < 1 || peek(c) != '.')
            return -1;
        c->p++;
        if (parse_num(c, 1, 5, &r->b) < 0 || r->b < 1 || peek(c) != '.')
            return -1;
        c->p++;
        if (parse_num(c, 1, 6, &r->c) < 0)
            return -1;
    } else {
        return -1;
    }
    if (peek(c) == '/') {
        c->p++;
        if (parse_hms(c, 167, &r->time) < 0)
            return -1;
    }
    return 0;
}

/* Parse a TZ string of `n` bytes.  An empty string means "no rule". */
static int parse_posix(const char *s, size_t n, tz_posix *out)
{
    cursor c = {s, s + n};
    int32_t v;

    memset(out, 0, sizeof *out);
    if (n == 0)
        return 0;
    if (parse_abbr(&c) < 0 || parse_hms(&c, 24, &v) < 0)
        return -1;
    out->std_off = -v;                        /* POSIX counts west positive */
    out->present = 1;
    if (c.p == c.end)
        return 0;
    if (parse_abbr(&c) < 0)
        return -1;
    out->has_dst = 1;
    out->dst_off = out->std_off + 3600;
    if (peek(&c) && peek(&c) != ',') {
        if (parse_hms(&c, 24, &v) < 0)
            return -1;
        out->dst_off = -v;
    }
    if (peek(&c) == ',') {
        c.p++;
        if (parse_rule(&c, &out->start) < 0 || peek(&c) != ',')
            return -1;
        c.p++;
        if (parse_rule(&c, &out->end) < 0)
            return -1;
    } else {
        /* No rules given: the traditional US default M3.2.0,M11.1.0. */
        out->start = (tz_rule){'M', 3, 2, 0, 7200};
        out->end = (tz_rule){'M', 11, 1, 0, 7200};
    }
    return c.p == c.end ? 0 : -1;
}

/* Day number (days since 1970-01-01) on which rule r falls in year y. */
static int64_t rule_day(const tz_rule *r, int y)
{
    int64_t jan1 = qg__days_from_civil(y, 1, 1);
    if (r->kind == 'J')          /* Feb 29 is never counted: day 60 = Mar 1 */
        return jan1 + r->a - 1 + (qg__is_leap(y) && r->a >= 60);
    if (r->kind == 'N')
        return jan1 + r->a;
    /* Mm.w.d: the w-th weekday d of month m, w = 5 meaning the last one.
     * POSIX d counts from Sunday = 0; our weekdays from Monday = 0. */
    int64_t first = qg__days_from_civil(y, r->a, 1);
    int want = (r->c + 6) % 7;
    int64_t day = first + (want - qg__weekday_from_days(first) + 7) % 7;
    day += (int64_t)(r->b - 1) * 7;
    while (day - first >= qg__days_in_month(y, r->a))
        day -= 7;
    return day;
}

/* Offset from the POSIX rule at UTC second s.  The latest DST start or end
 * at or before s decides; looking at the neighbouring years too makes this
 * correct near new year and for southern zones whose DST spans it. */
static int32_t posix_offset(const tz_posix *p, int64_t s)
{
    int y0, m, d, is_dst = 0;
    int64_t best = INT64_MIN;
    if (!p->has_dst)
        return p->std_off;
    qg__civil_from_days(floor_div(s + p->std_off, SECS_PER_DAY), &y0, &m, &d);
    for (int y = y0 - 1; y <= y0 + 1; y++) {
        /* The start is given in standard local time, the end in DST. */
        int64_t st = rule_day(&p->start, y) * SECS_PER_DAY + p->start.time -
                     p->std_off;
        int64_t en = rule_day(&p->end, y) * SECS_PER_DAY + p->end.time -
                     p->dst_off;
        if (en <= s && en > best) {
            best = en;
            is_dst = 0;
        }
        /* On a tie the start wins: that is how "all year DST" is spelt. */
        if (st <= s && st >= best) {
            best = st;
            is_dst = 1;
        }
    }
    return is_dst ? p->dst_off : p->std_off;
}

/* ---- TZif -------------------------------------------------------------- */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
           (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int64_t be64(const unsigned char *p)
{
    uint64_t v = (uint64_t)be32(p) << 32 | be32(p + 4);
    return (int64_t)v;
}

typedef struct tzif_hdr {
    int version;                /* 1, 2, 3, 4 ... */
    uint32_t isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt;
    uint64_t datalen;           /* bytes of the data block after the header */
} tzif_hdr;

#define TZIF_HDR 44

static int read_hdr(const unsigned char *buf, size_t len, size_t off,
                    int tsize, tzif_hdr *h, char *err, size_t errcap)
{
    const unsigned char *p = buf + off;
    if (len - off < TZIF_HDR) {
        qg__errf(err, errcap, "truncated TZif header");
        return -1;
    }
    if (memcmp(p, "TZif", 4) != 0) {
        qg__errf(err, errcap, "bad TZif magic");
        return -1;
    }
    if (p[4] == 0)
        h->version = 1;
    else if (p[4] >= '2' && p[4] <= '9')
        h->version = p[4] - '0';
    else {
        qg__errf(err, errcap, "unknown TZif version 0x%02x", p[4]);
        return -1;
    }
    h->isutcnt = be32(p + 20);
    h->isstdcnt = be32(p + 24);
    h->leapcnt = be32(p + 28);
    h->timecnt = be32(p + 32);
    h->typecnt = be32(p + 36);
    h->charcnt = be32(p + 40);
    if (h->typecnt == 0 || h->typecnt > 256) {
        qg__errf(err, errcap, "bad TZif type count %u", h->typecnt);
        return -1;
    }
    if ((h->isutcnt != 0 && h->isutcnt != h->typecnt) ||
        (h->isstdcnt != 0 && h->isstdcnt != h->typecnt)) {
        qg__errf(err, errcap, "bad TZif indicator counts");
        return -1;
    }
    /* Counts are 32-bit, so this 64-bit sum cannot overflow. */
    h->datalen = (uint64_t)h->timecnt * (uint64_t)(tsize + 1) +
                 (uint64_t)h->typecnt * 6 + h->charcnt +
                 (uint64_t)h->leapcnt * (uint64_t)(tsize + 4) + h->isstdcnt +
                 h->isutcnt;
    if (h->datalen > len - off - TZIF_HDR) {
        qg__errf(err, errcap, "truncated TZif data (%llu bytes needed)",
               (unsigned long long)h->datalen);
        return -1;
    }
    return 0;
}

void qg__tz_free(qg_tz *tz)
{
    if (!tz)
        return;
    free(tz->name);
    free(tz->trans);
    free(tz->tidx);
    free(tz->utoff);
    free(tz->isdst);
    free(tz);
}

static qg_tz *tz_alloc(const char *name, size_t ntrans, int ntypes)
{
    qg_tz *tz = calloc(1, sizeof *tz);
    if (!tz)
        return NULL;
    tz->name = strdup(name ? name : "");
    tz->ntrans = ntrans;
    tz->ntypes = ntypes;
    if (ntrans) {
        tz->trans = malloc(ntrans * sizeof *tz->trans);
        tz->tidx = malloc(ntrans);
    }
    tz->utoff = malloc((size_t)ntypes * sizeof *tz->utoff);
    tz->isdst = malloc((size_t)ntypes);
    if (!tz->name || !tz->utoff || !tz->isdst ||
        (ntrans && (!tz->trans || !tz->tidx))) {
        qg__tz_free(tz);
        return NULL;
    }
    return tz;
}

qg_tz *qg__tz_from_tzif(const char *name, const unsigned char *buf, size_t len,
                       char *err, size_t errcap)
{
    tzif_hdr h;
    size_t off = 0;
    int tsize = 4;
    const unsigned char *p, *footer = NULL;
    size_t footer_len = 0;
    tz_posix rule;
    qg_tz *tz;

    if (!buf) {
        qg__errf(err, errcap, "no TZif data");
        return NULL;
    }
    if (read_hdr(buf, len, 0, 4, &h, err, errcap) < 0)
        return NULL;
    if (h.version >= 2) {
        /* Skip the 32-bit block; the 64-bit one follows with its own
         * header and then the newline-enclosed footer. */
        off = TZIF_HDR + (size_t)h.datalen;
        tsize = 8;
        if (read_hdr(buf, len, off, 8, &h, err, errcap) < 0)
            return NULL;
        size_t foot = off + TZIF_HDR + (size_t)h.datalen;
        if (foot < len) {
            const unsigned char *nl;
            if (buf[foot] != '\n') {
                qg__errf(err, errcap, "bad TZif footer");
                return NULL;
            }
            footer = buf + foot + 1;
            nl = memchr(footer, '\n', len - foot - 1);
            if (!nl) {
                qg__errf(err, errcap, "unterminated TZif footer");
                return NULL;
            }
            footer_len = (size_t)(nl - footer);
        }
    }
    if (parse_posix((const char *)footer, footer_len, &rule) < 0) {
        qg__errf(err, errcap, "bad TZ string in TZif footer: \"%.*s\"",
               (int)(footer_len > 64 ? 64 : footer_len),
               footer ? (const char *)footer : "");
        return NULL;
    }

    p = buf + off + TZIF_HDR;
    const unsigned char *times = p;
    const unsigned char *idx = times + (size_t)h.timecnt * (size_t)tsize;
    const unsigned char *types = idx + h.timecnt;

    tz = tz_alloc(name, h.timecnt, (int)h.typecnt);
    if (!tz) {
        qg__errf(err, errcap, "out of memory");
        return NULL;
    }
    for (uint32_t i = 0; i < h.typecnt; i++) {
        const unsigned char *t = types + (size_t)i * 6;
        int32_t u = (int32_t)be32(t);
        if (u < -26 * 3600 || u > 26 * 3600 || t[4] > 1) {
            qg__errf(err, errcap, "bad TZif local time type %u", i);
            qg__tz_free(tz);
            return NULL;
        }
        tz->utoff[i] = u;
        tz->isdst[i] = t[4];
    }
    for (uint32_t i = 0; i < h.timecnt; i++) {
        int64_t t = tsize == 8 ? be64(times + (size_t)i * 8)
                               : (int64_t)(int32_t)be32(times + (size_t)i * 4);
        if (i > 0 && t <= tz->trans[i - 1]) {
            qg__errf(err, errcap, "TZif transitions not ascending");
            qg__tz_free(tz);
            return NULL;
        }
        if (idx[i] >= h.typecnt) {
            qg__errf(err, errcap, "bad TZif type index");
            qg__tz_free(tz);
            return NULL;
        }
        tz->trans[i] = t;
        tz->tidx[i] = idx[i];
    }
    tz->init_type = 0;
    for (int i = 0; i < tz->ntypes; i++)
        if (!tz->isdst[i]) {
            tz->init_type = i;
            break;
        }
    tz->rule = rule;
    return tz;
}

qg_tz *qg__tz_fixed(const char *name, int32_t utoff)
{
    qg_tz *tz = tz_alloc(name, 0, 1);
    if (!tz)
        return NULL;
    tz->utoff[0] = utoff;
    tz->isdst[0] = 0;
    return tz;
}

qg_tz *qg__tz_utc(void)
{
    return qg__tz_fixed("UTC", 0);
}

const char *qg__tz_name(const qg_tz *tz)
{
    return tz ? tz->name : "";
}

/* ---- lookups ----------------------------------------------------------- */

static int32_t offset_at_sec(const qg_tz *tz, int64_t s)
{
    size_t lo, hi;
    if (tz->ntrans == 0)
        return tz->rule.present ? posix_offset(&tz->rule, s)
                                : tz->utoff[tz->init_type];
    if (s < tz->trans[0])
        return tz->utoff[tz->init_type];
    if (s >= tz->trans[tz->ntrans - 1] && tz->rule.present)
        return posix_offset(&tz->rule, s);
    /* Largest i with trans[i] <= s: invariant trans[lo] <= s < trans[hi]
     * (hi == ntrans standing for +infinity). */
    lo = 0;
    hi = tz->ntrans;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (tz->trans[mid] <= s)
            lo = mid;
        else
            hi = mid;
    }
    return tz->utoff[tz->tidx[lo]];
}

int32_t qg__tz_offset_at(const qg_tz *tz, int64_t ms)
{
    if (!tz)
        return 0;
    return offset_at_sec(tz, floor_div(ms, 1000));
}

int64_t qg__tz_utc_to_local(const qg_tz *tz, int64_t ms)
{
    return ms + (int64_t)qg__tz_offset_at(tz, ms) * 1000;
}

/* A local time L is the instant t with t + off(t) = L.  Offsets stay within
 * +-26h, so every candidate t lies within a day of L; a = offset a day
 * before, b = a day after are the offsets in play (zones do not change
 * twice within two days).  Each gives the candidate L - a or L - b, valid
 * when the zone really has that offset then:
 *  - both valid and different: an overlap; the earlier is the first
 *    occurrence;
 *  - one valid: the ordinary case;
 *  - none valid: a gap; the answer is the transition instant itself, found
 *    by bisection between L - b (still offset a) and L - a (already b). */
int64_t qg__tz_local_to_utc(const qg_tz *tz, int64_t local_ms)
{
    const int64_t limit = INT64_MAX / 4;
    int32_t a, b;
    int64_t ta, tb;
    int va, vb;

    if (!tz || local_ms > limit || local_ms < -limit)
        return local_ms;
    a = qg__tz_offset_at(tz, local_ms - QG_MS_PER_DAY);
    b = qg__tz_offset_at(tz, local_ms + QG_MS_PER_DAY);
    ta = local_ms - (int64_t)a * 1000;
    tb = local_ms - (int64_t)b * 1000;
    va = qg__tz_offset_at(tz, ta) == a;
    vb = qg__tz_offset_at(tz, tb) == b;
    if (va && vb)
        return ta < tb ? ta : tb;
    if (va)
        return ta;
    if (vb)
        return tb;
    if (a < b) {
        int64_t lo = tb, hi = ta;             /* off(lo) == a, off(hi) != a */
        if (qg__tz_offset_at(tz, lo) == a) {
            while (hi - lo > 1) {
                int64_t mid = lo + (hi - lo) / 2;
                if (qg__tz_offset_at(tz, mid) == a)
                    lo = mid;
                else
                    hi = mid;
            }
            return hi;
        }
    }
    /* Several transitions close together: settle for a fixed point try. */
    return local_ms - (int64_t)qg__tz_offset_at(tz, ta) * 1000;
}
