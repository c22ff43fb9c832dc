/* redis_link_open.c - a link's opening and closing (redis_link.h): its
 * URL, its defaults, qg__rlink_new and qg__rlink_free, and the queries
 * (nodes, counters, the last error).
 *
 * The defaults, from the command timeout T (100 ms unless given): a
 * connection attempt (TCP and the handshake) gets max(T, 1 s); a
 * CLUSTER SLOTS gets max(T, 250 ms); a connection whose commands got no
 * reply for max(4 T, 500 ms) is dropped and made again (redis_link.c).
 *
 * Freeing: every command still pending ends with QG_ESTATE, every
 * connection is freed, then the memory.  hiredis frees a connection
 * inside its own callback only after that callback: its commands are
 * then orphaned (redis_link_int.h) and free themselves. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quotagate.h"
#include "redis_link_int.h"

#define MAX_SEEDS 64

int qg__rlink_nodes(qg__rlink *l, qg__rlink_node *out, int cap)
{
    int count = 0;
    if (!l)
        return 0;
    for (int i = 0; i < l->nnodes; i++) {
        const rl_node *n = l->node[i];
        qg__rlink_node e;
        int at;
        if (!qg__rl_is_master(l, n))
            continue;
        snprintf(e.addr, sizeof e.addr, "%s", n->addr);
        e.first_slot = l->cluster ? n->first_slot : 0;
        e.nslots = l->cluster ? n->nslots : QG__RC_SLOTS;
        e.up = n->state == RL_READY;
        /* in slot order, for a stable listing */
        for (at = count < cap ? count : cap; at > 0 && out[at - 1].first_slot > e.first_slot; at--)
            if (at < cap)
                out[at] = out[at - 1];
        if (at < cap)
            out[at] = e;
        count++;
    }
    return count;
}

const char *qg__rlink_reply_node(const qg__rlink *l)
{
    return l && l->cur ? l->cur->addr : NULL;
}

void qg__rlink_on_node(qg__rlink *l, void (*fn)(void *ud, const char *addr, int up),
                       void *ud)
{
    if (!l)
        return;
    l->on_node = fn;
    l->on_node_ud = ud;
}

void qg__rlink_counters_get(const qg__rlink *l, qg__rlink_counters *out)
{
    if (l)
        *out = l->cnt;
    else
        memset(out, 0, sizeof *out);
}

const char *qg__rlink_last_error(const qg__rlink *l)
{
    return l ? l->err : "";
}

/* ------------------------------------------------------ opening, closing */

/* "host[:port]" of s[0..len): host a name (letters, digits, '.', '-',
 * '_') or [IPv6]. */
static int parse_addr(const char *s, size_t len, char *host, size_t hcap,
                      int *port)
{
    size_t hl, i = 0;
    const char *h = s;
    if (len && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return -1;
        h = s + 1;
        hl = (size_t)(close - h);
        for (size_t k = 0; k < hl; k++)
            if (!strchr("0123456789abcdefABCDEF:.", h[k]))
                return -1;
        i = hl + 2;
    } else {
        while (i < len && s[i] != ':' &&
               (strchr(".-_", s[i]) || (s[i] >= '0' && s[i] <= '9') ||
                ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
            i++;
        hl = i;
    }
    if (!hl || hl >= hcap)
        return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = 6379;
    if (i < len) {
        long p = 0;
        if (s[i] != ':' || i + 1 == len || len - i - 1 > 5)
            return -1;
        for (i++; i < len; i++) {
            if (s[i] < '0' || s[i] > '9')
                return -1;
            p = p * 10 + (s[i] - '0');
        }
        if (p < 1 || p > 65535)
            return -1;
        *port = (int)p;
    }
    return 0;
}

static int add_seed(qg__rlink *l, const char *s, size_t len, char *err,
                    size_t errcap)
{
    char host[QG__RC_HOST_MAX];
    int port;
    rl_node *n;
    if (parse_addr(s, len, host, sizeof host, &port) != 0) {
        snprintf(err, errcap, "a Redis address is HOST[:PORT] (a name, an "
                 "IPv4 address or [IPv6]), port 1..65535");
        return QG_EINVAL;
    }
    if (!(n = qg__rl_node_get(l, host, port))) {
        snprintf(err, errcap, "out of memory");
        return QG_ENOMEM;
    }
    n->seed = 1;
    return 0;
}

static int parse_url(qg__rlink *l, const char *url, char *err, size_t errcap)
{
    static const char single[] = "redis://", cluster[] = "redis-cluster://";
    const char *p, *end;
    int rc;

    if (!url)
        url = "";
    if (strpbrk(url, "@")) {
        snprintf(err, errcap, "the Redis URL holds no credentials: the "
                 "password is passed apart (QUOTAGATE_REDIS_PASSWORD)");
        return QG_EINVAL;
    }
    if (strncmp(url, single, sizeof single - 1) == 0) {
        const char *slash;
        p = url + sizeof single - 1;
        end = p + strlen(p);
        slash = memchr(p, '/', (size_t)(end - p));
        if ((rc = add_seed(l, p, (size_t)((slash ? slash : end) - p), err, errcap)))
            return rc;
        if (slash && slash[1]) {
            long db = 0;
            for (const char *d = slash + 1; *d; d++) {
                if (*d < '0' || *d > '9' || db > 99999) {
                    snprintf(err, errcap, "the Redis database is a number (redis://HOST:PORT/DB)");
                    return QG_EINVAL;
                }
                db = db * 10 + (*d - '0');
            }
            l->db = (int)db;
        }
        return 0;
    }
    if (strncmp(url, cluster, sizeof cluster - 1) == 0) {
        l->cluster = 1;
        p = url + sizeof cluster - 1;
        end = p + strlen(p);
        if (p == end || memchr(p, '/', (size_t)(end - p))) {
            snprintf(err, errcap, "a Redis Cluster URL is redis-cluster://HOST:PORT[,HOST:PORT...] "
                     "(no database: a Cluster has only 0)");
            return QG_EINVAL;
        }
        while (p < end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *stop = comma ? comma : end;
            if (l->nnodes >= MAX_SEEDS) {
                snprintf(err, errcap, "more than %d seeds", MAX_SEEDS);
                return QG_EINVAL;
            }
            if ((rc = add_seed(l, p, (size_t)(stop - p), err, errcap)))
                return rc;
            if (comma && comma + 1 == end)
                return add_seed(l, end, 0, err, errcap);   /* "h:1," */
            p = comma ? comma + 1 : end;
        }
        return 0;
    }
    snprintf(err, errcap, "%s", strncmp(url, "rediss://", 9) == 0
             ? "TLS (rediss://) is not supported: hiredis 0.14 has no TLS"
             : "a Redis URL is redis://HOST[:PORT][/DB] or "
               "redis-cluster://HOST[:PORT][,HOST[:PORT]...]");
    return QG_EINVAL;
}

qg__rlink *qg__rlink_new(struct event_base *base, const char *url,
                         const char *password, int timeout_ms, char *err,
                         size_t errcap)
{
    char why[256] = "";
    qg__rlink *l;

    if (!base) {
        snprintf(err, errcap, "no event base");
        return NULL;
    }
    if (!(l = calloc(1, sizeof *l)))
        goto nomem;
    l->base = base;
    l->timeout_ms = timeout_ms > 0 ? timeout_ms : QG__RLINK_TIMEOUT_MS;
    l->stall_ms = l->timeout_ms * 4 > 500 ? l->timeout_ms * 4 : 500;
    l->connect_ms = l->timeout_ms > 1000 ? l->timeout_ms : 1000;
    l->refresh_ms = l->timeout_ms > 250 ? l->timeout_ms : 250;
    qg__rl_cmds_init(l);
    qg__rl_slots_init(l);
    if (password && *password && !(l->password = strdup(password)))
        goto nomem;
    if (parse_url(l, url, why, sizeof why) != 0) {
        snprintf(err, errcap, "%s", why);
        qg__rlink_free(l);
        return NULL;
    }
    if (l->cluster) {
        if (!(l->slot = calloc(QG__RC_SLOTS, sizeof *l->slot)))
            goto nomem;
        qg__rl_refresh_request(l);     /* connects a seed */
    } else {
        qg__rl_node_connect(l->node[0]);
    }
    return l;
nomem:
    snprintf(err, errcap, "out of memory");
    qg__rlink_free(l);
    return NULL;
}

void qg__rlink_free(qg__rlink *l)
{
    if (!l || l->closing)
        return;
    l->closing = 1;
    if (!l->depth)
        qg__rl_real_free(l);
}

/* Every command fails (QG_ESTATE), every connection closes, then the
 * memory goes.  A connection inside its own callback is freed by hiredis
 * after it: its commands are orphaned, and free themselves. */
void qg__rl_real_free(qg__rlink *l)
{
    rl_cmd *c;
    l->depth = 1;              /* what this causes must not free again */
    qg__rl_cmds_stop(l);
    qg__rl_slots_stop(l);
    for (int i = 0; i < l->nnodes; i++) {
        rl_node *n = l->node[i];
        redisAsyncContext *ac;
        evtimer_del(&n->timer);
        n->state = RL_IDLE;
        if ((ac = qg__rl_node_disown(n)))
            redisAsyncFree(ac);   /* now, unless inside its callback */
    }
    /* cbs cannot add commands now (closing): one pass empties all */
    for (int i = 0; i < l->nnodes; i++) {
        rl_node *n = l->node[i];
        rl_cmd *next;
        while ((c = n->waitq.head))
            qg__rl_finish(l, c, NULL, NULL, QG_ESTATE);
        for (c = n->wire.head; c; c = next) {
            next = c->next;    /* a wire changes only in hiredis's calls */
            qg__rl_finish(l, c, n, NULL, QG_ESTATE);
        }
    }
    while ((c = l->unrouted.head) || (c = l->retryq.head) || (c = l->doneq.head))
        qg__rl_finish(l, c, NULL, NULL, QG_ESTATE);
    for (int i = 0; i < l->nnodes; i++) {
        rl_node *n = l->node[i];
        for (c = n->wire.head; c; c = c->next)
            c->l = NULL;       /* hiredis frees them */
        n->wire.head = n->wire.tail = NULL;
        n->wire.n = 0;
        qg__rl_node_free(n);
    }
    free(l->node);
    free(l->slot);
    if (l->password) {
        explicit_bzero(l->password, strlen(l->password));
        free(l->password);
    }
    free(l);
}
