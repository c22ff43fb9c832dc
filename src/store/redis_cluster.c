/* redis_cluster.c - Redis Cluster's routing as data (redis_cluster.h):
 * key slots, CLUSTER SLOTS maps, redirections.  No I/O.
 *
 * A key's slot is CRC16(k) mod 16384 where k is the key's hash tag when it
 * has one.  Redis takes the tag from the FIRST '{' to the first '}' after
 * it, and only when at least one byte lies between them; so "{}x" has no
 * tag (the whole key is hashed) and "{{a}}" has the tag "{a".  The Redis
 * store puts every key of one decision under one tag (docs/redis-store.md),
 * which is why a decision is one script execution on one node.
 *
 * The CRC is computed bit by bit: keys are tens of bytes, and a table would
 * buy nothing measurable next to a network round trip. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quotagate.h"
#include "redis_cluster.h"

unsigned qg__rc_crc16(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    unsigned crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)p[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000u ? (crc << 1) ^ 0x1021u : crc << 1;
        crc &= 0xffffu;
    }
    return crc;
}

unsigned qg__rc_slot(const char *key, size_t len)
{
    const char *open = len ? memchr(key, '{', len) : NULL;
    if (open) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(key + from, '}', len - from);
        if (close && close > key + from)
            return qg__rc_crc16(key + from, (size_t)(close - key) - from) &
                   (QG__RC_SLOTS - 1);
    }
    return qg__rc_crc16(key, len) & (QG__RC_SLOTS - 1);
}

int qg__rc_tag_for_slot(unsigned slot, char *out, size_t cap)
{
    static const char alpha[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    const unsigned na = (unsigned)sizeof alpha - 1;
    char t[4];
    if (slot >= QG__RC_SLOTS || cap < 4)
        return -1;
    /* 62 + 62^2 + 62^3 = 242,235 candidates for 16,384 slots: every slot
     * is reached (checked for all of them by the test) */
    for (unsigned n = 1; n <= 3; n++) {
        unsigned total = n == 1 ? na : n == 2 ? na * na : na * na * na;
        for (unsigned i = 0; i < total; i++) {
            unsigned v = i;
            for (unsigned k = 0; k < n; k++, v /= na)
                t[k] = alpha[v % na];
            if (qg__rc_crc16(t, n) % QG__RC_SLOTS == slot) {
                memcpy(out, t, n);
                out[n] = 0;
                return (int)n;
            }
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- map */

void qg__rc_map_init(qg__rc_map *m)
{
    m->node = NULL;
    m->nnodes = 0;
    m->covered = 0;
    for (unsigned s = 0; s < QG__RC_SLOTS; s++)
        m->slot[s] = QG__RC_NONE;
}

void qg__rc_map_free(qg__rc_map *m)
{
    free(m->node);
    qg__rc_map_init(m);
}

static int is_int(const redisReply *r, long long lo, long long hi)
{
    return r && r->type == REDIS_REPLY_INTEGER && r->integer >= lo &&
           r->integer <= hi;
}

/* The index of host:port in the map, added when new; -1 when full,
 * -2 out of memory. */
static int map_node(qg__rc_map *m, const char *host, size_t hlen, int port)
{
    qg__rc_node *n;
    for (int i = 0; i < m->nnodes; i++)
        if (m->node[i].port == port && strlen(m->node[i].host) == hlen &&
            memcmp(m->node[i].host, host, hlen) == 0)
            return i;
    if (m->nnodes >= QG__RC_NODES_MAX)
        return -1;
    if (!(n = realloc(m->node, (size_t)(m->nnodes + 1) * sizeof *n)))
        return -2;
    m->node = n;
    n += m->nnodes;
    memcpy(n->host, host, hlen);
    n->host[hlen] = 0;
    n->port = port;
    n->first_slot = QG__RC_SLOTS;
    n->nslots = 0;
    return m->nnodes++;
}

int qg__rc_parse_slots(const redisReply *r, const char *asked_host,
                       qg__rc_map *out, char *err, size_t errcap)
{
    const char *why = NULL;
    int rc = QG_EINVAL;

    qg__rc_map_init(out);
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        why = r && r->type == REDIS_REPLY_ERROR ? "CLUSTER SLOTS answered an error"
                                                : "CLUSTER SLOTS is not an array";
        goto fail;
    }
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i], *m, *h;
        const char *host;
        size_t hlen;
        unsigned lo, hi;
        int idx;

        if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3) {
            why = "a range is not [start, end, master...]";
            goto fail;
        }
        if (!is_int(e->element[0], 0, QG__RC_SLOTS - 1) ||
            !is_int(e->element[1], 0, QG__RC_SLOTS - 1) ||
            e->element[0]->integer > e->element[1]->integer) {
            why = "a range's slots are not 0 <= start <= end <= 16383";
            goto fail;
        }
        lo = (unsigned)e->element[0]->integer;
        hi = (unsigned)e->element[1]->integer;
        m = e->element[2];
        if (!m || m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            !is_int(m->element[1], 1, 65535)) {
            why = "a range's master is not [host, port, ...]";
            goto fail;
        }
        h = m->element[0];
        if (h->type == REDIS_REPLY_NIL || (h->type == REDIS_REPLY_STRING && !h->len)) {
            host = asked_host ? asked_host : "";
            hlen = strlen(host);
        } else if (h->type == REDIS_REPLY_STRING) {
            host = h->str;
            hlen = h->len;
        } else {
            why = "a master's host is not a string";
            goto fail;
        }
        if (!hlen || hlen >= QG__RC_HOST_MAX || memchr(host, 0, hlen)) {
            why = "a master's host is empty or too long";
            goto fail;
        }
        for (unsigned s = lo; s <= hi; s++)
            if (out->slot[s] != QG__RC_NONE) {
                why = "two ranges overlap";
                goto fail;
            }
        if (hlen == 1 && host[0] == '?')
            continue;          /* no usable endpoint: unserved */
        if ((idx = map_node(out, host, hlen, (int)m->element[1]->integer)) < 0) {
            if (idx == -2) {
                rc = QG_ENOMEM;
                why = "out of memory";
            } else {
                why = "more masters than a cluster may have";
            }
            goto fail;
        }
        for (unsigned s = lo; s <= hi; s++)
            out->slot[s] = (uint16_t)idx;
        out->covered += hi - lo + 1;
        out->node[idx].nslots += hi - lo + 1;
        if (lo < out->node[idx].first_slot)
            out->node[idx].first_slot = lo;
    }
    return 0;
fail:
    if (err && errcap)
        snprintf(err, errcap, "%s", why);
    qg__rc_map_free(out);
    return rc;
}

/* -------------------------------------------------------- redirections */

/* Does s[0..len) start with the word w (followed by a space or its end)? */
static int word(const char *s, size_t len, const char *w)
{
    size_t n = strlen(w);
    return len >= n && memcmp(s, w, n) == 0 && (len == n || s[n] == ' ');
}

qg__rc_kind qg__rc_error_kind(const char *s, size_t len)
{
    if (!s)
        return QG__RC_ERROR;
    if (word(s, len, "MOVED"))
        return QG__RC_MOVED;
    if (word(s, len, "ASK"))
        return QG__RC_ASK;
    if (word(s, len, "TRYAGAIN"))
        return QG__RC_TRYAGAIN;
    if (word(s, len, "CLUSTERDOWN"))
        return QG__RC_CLUSTERDOWN;
    if (word(s, len, "LOADING"))
        return QG__RC_LOADING;
    return QG__RC_ERROR;
}

/* A decimal number of 1..digits digits at s[*i..len), up to max. */
static int number(const char *s, size_t len, size_t *i, long max, long *out)
{
    long v = 0;
    size_t start = *i;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9' && *i - start < 6)
        v = v * 10 + (s[(*i)++] - '0');
    if (*i == start || v > max)
        return -1;
    *out = v;
    return 0;
}

int qg__rc_parse_redirect(const char *s, size_t len, qg__rc_redirect *out)
{
    qg__rc_kind k = qg__rc_error_kind(s, len);
    size_t i, colon, hlen;
    long slot, port;

    if (k != QG__RC_MOVED && k != QG__RC_ASK)
        return -1;
    i = k == QG__RC_MOVED ? 6 : 4;
    if (number(s, len, &i, QG__RC_SLOTS - 1, &slot) != 0 || i >= len || s[i] != ' ')
        return -1;
    i++;
    /* host:port up to the end; the port after the last ':' */
    for (colon = len; colon > i && s[colon - 1] != ':'; colon--)
        ;
    if (colon == i)
        return -1;             /* no ':' */
    hlen = colon - 1 - i;
    if (hlen >= QG__RC_HOST_MAX || memchr(s + i, ' ', hlen) ||
        memchr(s + i, 0, hlen))
        return -1;
    {
        size_t j = colon;
        if (number(s, len, &j, 65535, &port) != 0 || j != len || port < 1)
            return -1;
    }
    out->kind = k;
    out->slot = (unsigned)slot;
    memcpy(out->host, s + i, hlen);
    out->host[hlen] = 0;
    /* "[::1]" in brackets, should a server ever send it so */
    if (hlen >= 2 && out->host[0] == '[' && out->host[hlen - 1] == ']') {
        memmove(out->host, out->host + 1, hlen - 2);
        out->host[hlen - 2] = 0;
    }
    out->port = (int)port;
    return 0;
}
