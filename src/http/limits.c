/* limits.c - how many connections the server holds, and whom it lets go
 * when a new one needs the room (the policy is stated in http.h).
 *
 * Capacity comes from the file-descriptor limit: qg__http_fd_budget is
 * what is left of RLIMIT_NOFILE after the process's own descriptors,
 * and max_connections defaults to three quarters of it (the rest is for
 * upstream sockets).  Each worker holds ceil(max / workers).
 *
 * Per-address counts: each worker keeps an open-addressing table (linear
 * probing, deletion by shifting back, so no tombstones) from a client
 * address to its open connections on that worker.  Its size is a power
 * of two at least twice the worker's capacity: every entry has at least
 * one open connection, so the table is never more than half full.  The
 * hash is XXH3 with a seed drawn at start, so an attacker choosing its
 * addresses (an IPv6 /48 holds 65536 of our /64 keys) cannot aim at one
 * probe chain.  Counts change at accept and close only, never per request.
 *
 * Shed queues: a connection that may be shed waits in one of two lists
 * of its worker, in the order it entered: Q_IDLE (between keep-alive
 * requests, or lingering after its last response) and Q_READ (its
 * request not yet complete: entered at accept for the first request, at
 * the first byte for later ones).  Taking a connection out or putting it
 * at a tail is a few pointer writes, done at the phase changes of a
 * request, so the oldest idle and the oldest unfinished read are always
 * at the heads.  Connections whose request the handler holds, or whose
 * response is still being written, are in no queue. */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <time.h>
#include <xxhash.h>

#include "http_internal.h"

/* How far a per-address pick looks into each queue before giving up. */
enum { SCAN_MAX = 4096, DEFAULT_CAP_MAX = 65536 };

const qg_http_drop_name qg_http_drop_names[QG_HTTP_DROP_COUNT] = {
    [QG_HTTP_SHED_IDLE] = { "shed", "idle" },
    [QG_HTTP_SHED_SLOW] = { "shed", "slow" },
    [QG_HTTP_REFUSED_CAPACITY] = { "refused", "capacity" },
    [QG_HTTP_REFUSED_PER_CLIENT] = { "refused", "per_client" },
    [QG_HTTP_TIMEOUT_HEAD] = { "timed_out", "head" },
    [QG_HTTP_TIMEOUT_BODY] = { "timed_out", "body" },
    [QG_HTTP_TIMEOUT_IDLE] = { "timed_out", "idle" },
    [QG_HTTP_TIMEOUT_WRITE] = { "timed_out", "write" },
};

/* ---- capacity ----------------------------------------------------------- */

int qg__http_fd_budget(int workers)
{
    struct rlimit rl;
    uint64_t cur = 1024, reserve;
    if (workers < 1)
        workers = 1;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        cur = rl.rlim_cur == RLIM_INFINITY ? (uint64_t)1 << 30 : rl.rlim_cur;
    reserve = 64 + 4 * (uint64_t)workers;
    if (cur > (uint64_t)1 << 30)
        cur = (uint64_t)1 << 30;
    return cur > reserve ? (int)(cur - reserve) : 1;
}

int qg__http_default_max_connections(int workers)
{
    int n = qg__http_fd_budget(workers) / 4 * 3;
    if (n > DEFAULT_CAP_MAX)
        n = DEFAULT_CAP_MAX;
    return n > 0 ? n : 1;
}

int qg__limits_init(qg__worker *w)
{
    const qg_http_opts *o = &w->srv->o;
    int nw = w->srv->o.workers;
    size_t slots = 16;
    w->cap = o->max_connections / nw + (o->max_connections % nw != 0);
    w->per_client = o->max_conns_per_client <= 0 ? 0
        : o->max_conns_per_client / nw + (o->max_conns_per_client % nw != 0);
    if (w->per_client == 0)
        return 0;
    while (slots < 2 * (size_t)w->cap)
        slots *= 2;
    w->addrs = calloc(slots, sizeof *w->addrs);
    if (!w->addrs)
        return -1;
    w->addr_mask = slots - 1;
    if (getrandom(&w->addr_seed, sizeof w->addr_seed, GRND_NONBLOCK) !=
        (ssize_t)sizeof w->addr_seed)
        w->addr_seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)w;
    return 0;
}

void qg__limits_free(qg__worker *w)
{
    free(w->addrs);
    w->addrs = NULL;
}

/* ---- per-address counts --------------------------------------------------- */

void qg__akey_of(const struct sockaddr *sa, qg__akey *k)
{
    memset(k, 0, sizeof *k);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        k->b[10] = k->b[11] = 0xff;
        memcpy(k->b + 12, &a->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        memcpy(k->b, &a->sin6_addr, 16);
        /* An IPv4-mapped address is one IPv4 host: keep it whole. */
        if (!IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
            memset(k->b + 8, 0, 8);
    }
}

static uint32_t akey_hash(const qg__worker *w, const qg__akey *k)
{
    return (uint32_t)XXH3_64bits_withSeed(k->b, sizeof k->b, w->addr_seed);
}

/* The slot of k, or the free slot where it would go. */
static size_t addr_find(const qg__worker *w, const qg__akey *k, uint32_t h)
{
    size_t i = h & w->addr_mask;
    while (w->addrs[i].n != 0 &&
           (w->addrs[i].hash != h || memcmp(&w->addrs[i].key, k, sizeof *k)))
        i = (i + 1) & w->addr_mask;
    return i;
}

uint32_t qg__addr_count(const qg__worker *w, const qg__akey *k)
{
    if (!w->addrs)
        return 0;
    return w->addrs[addr_find(w, k, akey_hash(w, k))].n;
}

void qg__addr_add(qg__conn *c)
{
    qg__worker *w = c->w;
    uint32_t h;
    size_t i;
    if (!w->addrs || c->counted)
        return;
    h = akey_hash(w, &c->key);
    i = addr_find(w, &c->key, h);
    if (w->addrs[i].n == 0) {
        w->addrs[i].key = c->key;
        w->addrs[i].hash = h;
    }
    w->addrs[i].n++;
    c->counted = 1;
}

void qg__addr_remove(qg__conn *c)
{
    qg__worker *w = c->w;
    size_t i, j, home;
    if (!w->addrs || !c->counted)
        return;
    c->counted = 0;
    i = addr_find(w, &c->key, akey_hash(w, &c->key));
    if (w->addrs[i].n == 0 || --w->addrs[i].n > 0)
        return;
    /* Emptied: shift back the entries of the chain behind it that may
     * live here (their home slot is not cyclically within (i, j]). */
    for (j = i;;) {
        j = (j + 1) & w->addr_mask;
        if (w->addrs[j].n == 0)
            break;
        home = w->addrs[j].hash & w->addr_mask;
        if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
            w->addrs[i] = w->addrs[j];
            w->addrs[j].n = 0;
            i = j;
        }
    }
}

/* ---- shed queues ------------------------------------------------------------ */

void qg__conn_enqueue(qg__conn *c, int q)
{
    qg__worker *w = c->w;
    if (c->q == q)
        return;
    if (c->q != Q_NONE) {
        if (c->qprev)
            c->qprev->qnext = c->qnext;
        else
            w->qhead[c->q] = c->qnext;
        if (c->qnext)
            c->qnext->qprev = c->qprev;
        else
            w->qtail[c->q] = c->qprev;
        c->qprev = c->qnext = NULL;
    }
    c->q = q;
    if (q == Q_NONE)
        return;
    c->qprev = w->qtail[q];
    if (w->qtail[q])
        w->qtail[q]->qnext = c;
    else
        w->qhead[q] = c;
    w->qtail[q] = c;
}

qg__conn *qg__shed_pick(qg__worker *w, const qg__akey *k)
{
    static const int order[2] = { Q_IDLE, Q_READ };
    for (int i = 0; i < 2; i++) {
        int n = 0;
        for (qg__conn *c = w->qhead[order[i]]; c && n < SCAN_MAX;
             c = c->qnext, n++)
            if (!k || !memcmp(&c->key, k, sizeof *k))
                return c;
    }
    return NULL;
}
