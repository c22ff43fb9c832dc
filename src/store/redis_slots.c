/* redis_slots.c - a link's nodes and, in a Cluster, its slot map: when
 * to ask CLUSTER SLOTS, whom, and what a new map changes
 * (redis_link_int.h).
 *
 * Refresh.  At most one CLUSTER SLOTS is in flight, and none starts
 * sooner than REFRESH_GAP_MS after the last map was applied: a MOVED
 * storm during a resharding costs one refresh per gap (each MOVED already
 * fixed its own slot).  A refresh asks a ready node, rotating through
 * them, else one that can be connected (seeds included); one that fails
 * (no reply within refresh_ms, an error, a map that does not parse or
 * serves no slot) is asked of the next node.  When every node was asked,
 * or none can be, the round fails: the next may start after 10 ms, then
 * 20, 40, ... up to 1 s, and the commands that waited are routed by the
 * map there is (or fail with QG_EIO when there is none).  While the link
 * has no map at all, failed rounds are retried on that schedule by
 * themselves, so a link opened before its Cluster was up finds it.
 *
 * A new map.  Every master in it gets a connection at once (one per
 * master, on the link's base); a node no longer in it is closed when
 * idle and forgotten unless it is a seed, so the node list follows
 * failovers and reshardings without growing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quotagate.h"
#include "redis_link_int.h"

#define REFRESH_GAP_MS 100
#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 1000
#define MAX_NODES (QG__RC_NODES_MAX + 64)

static void refresh_start(qg__rlink *l);

/* --------------------------------------------------------------- nodes */

rl_node *qg__rl_node_get(qg__rlink *l, const char *host, int port)
{
    rl_node *n;
    for (int i = 0; i < l->nnodes; i++)
        if (l->node[i]->port == port && strcmp(l->node[i]->host, host) == 0)
            return l->node[i];
    if (l->nnodes >= MAX_NODES)
        return NULL;
    if (l->nnodes == l->capnodes) {
        int cap = l->capnodes ? l->capnodes * 2 : 8;
        rl_node **a = realloc(l->node, (size_t)cap * sizeof *a);
        if (!a)
            return NULL;
        l->node = a;
        l->capnodes = cap;
    }
    if (!(n = qg__rl_node_new(l, host, port)))
        return NULL;
    l->node[l->nnodes++] = n;
    return n;
}

static void forget(qg__rlink *l, int i)
{
    rl_node *n = l->node[i];
    l->node[i] = l->node[--l->nnodes];
    qg__rl_node_free(n);
}

/* ------------------------------------------------------------- refresh */

static unsigned backoff_ms(unsigned fails)
{
    unsigned ms = BACKOFF_MIN_MS;
    for (unsigned i = 1; i < fails && ms < BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS;
}

static void arm(qg__rlink *l, int64_t ms)
{
    struct timeval tv;
    if (l->refresh_armed)
        return;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    l->refresh_armed = 1;
    evtimer_add(&l->refresh_ev, &tv);
}

static void on_refresh_timer(evutil_socket_t fd, short what, void *arg)
{
    qg__rlink *l = arg;
    (void)fd;
    (void)what;
    qg__rl_enter(l);
    l->refresh_armed = 0;
    if (!l->refreshing && !l->closing) {
        int64_t left = l->next_refresh_ms - rl_now_ms();
        if (left > 1)
            arm(l, left);
        else
            refresh_start(l);
    }
    qg__rl_leave(l);
}

void qg__rl_slots_init(qg__rlink *l)
{
    evtimer_assign(&l->refresh_ev, l->base, on_refresh_timer, l);
}

void qg__rl_slots_stop(qg__rlink *l)
{
    evtimer_del(&l->refresh_ev);
    l->refresh_armed = 0;
}

int qg__rl_refresh_request(qg__rlink *l)
{
    int64_t now;
    if (!l->cluster || l->closing)
        return 0;
    if (l->refreshing)
        return 1;
    now = rl_now_ms();
    if (now < l->next_refresh_ms) {
        arm(l, l->next_refresh_ms - now);
        return 0;
    }
    refresh_start(l);
    return l->refreshing;
}

static void round_failed(qg__rlink *l)
{
    unsigned ms = backoff_ms(++l->refresh_fails);
    l->refresh_tried = 0;
    l->next_refresh_ms = rl_now_ms() + ms;
    if (!l->have_map)
        arm(l, ms);
    qg__rl_reroute_unrouted(l);
}

/* What a new map changes: the slots, the masters' connections, the nodes
 * forgotten.  -1 when out of memory (nothing changed). */
static int apply(qg__rlink *l, const qg__rc_map *m)
{
    rl_node **idx = calloc((size_t)m->nnodes, sizeof *idx);
    if (!idx)
        return -1;
    for (int i = 0; i < m->nnodes; i++)
        if (!(idx[i] = qg__rl_node_get(l, m->node[i].host, m->node[i].port))) {
            free(idx);
            return -1;
        }
    for (int i = 0; i < l->nnodes; i++) {
        l->node[i]->in_map = 0;
        l->node[i]->first_slot = l->node[i]->nslots = 0;
    }
    for (int i = 0; i < m->nnodes; i++) {
        idx[i]->in_map = 1;
        idx[i]->first_slot = m->node[i].first_slot;
        idx[i]->nslots = m->node[i].nslots;
    }
    for (unsigned s = 0; s < QG__RC_SLOTS; s++)
        l->slot[s] = m->slot[s] == QG__RC_NONE ? NULL : idx[m->slot[s]];
    free(idx);
    l->have_map = 1;
    l->refresh_tried = 0;
    l->refresh_fails = 0;
    l->next_refresh_ms = rl_now_ms() + REFRESH_GAP_MS;
    for (int i = 0; i < l->nnodes;) {
        rl_node *n = l->node[i];
        if (n->in_map) {
            if (n->state == RL_IDLE)
                qg__rl_node_connect(n);
        } else if (!n->refs && !n->wire.n && !n->waitq.n) {
            if (!n->seed) {
                forget(l, i);
                continue;      /* another node is at i now */
            }
            if (n->ac) {       /* an idle seed: no connection kept */
                redisAsyncContext *ac = qg__rl_node_disown(n);
                evtimer_del(&n->timer);
                n->state = RL_IDLE;
                redisAsyncFree(ac);
            }
        }
        i++;
    }
    return 0;
}

static void on_slots(qg__rlink *l, rl_cmd *c, const redisReply *r, int rc)
{
    rl_node *from = c->pin;    /* alive: c pins it */
    qg__rc_map map;
    char why[160];

    l->refreshing = 0;
    if (l->closing)
        return;
    if (rc == 0) {
        if (qg__rc_parse_slots(r, from->host, &map, why, sizeof why) == 0) {
            if (map.covered && apply(l, &map) == 0) {
                qg__rc_map_free(&map);
                l->cnt.refreshes++;
                qg__rl_reroute_unrouted(l);
                return;
            }
            snprintf(why, sizeof why, "%s", map.covered ? "out of memory"
                                                        : "no slot is served");
        }
        qg__rc_map_free(&map);
        if (r && r->type == REDIS_REPLY_ERROR)
            snprintf(why, sizeof why, "%.*s", (int)(r->len < 150 ? r->len : 150),
                     r->str);
        qg__rl_seterr(l, "CLUSTER SLOTS from %s: %s", from->addr, why);
    }                          /* else l->err says why it had no reply */
    l->cnt.refresh_errors++;
    refresh_start(l);          /* the next node, or the round fails */
}

/* Ask a ready node (rotating), else one that can be connected. */
static void refresh_start(qg__rlink *l)
{
    static const char *argv[2] = {"CLUSTER", "SLOTS"};
    struct timeval tv = {l->refresh_ms / 1000, (l->refresh_ms % 1000) * 1000};
    rl_node *pick = NULL;
    rl_cmd *c = NULL;
    int rc;

    for (int pass = 0; pass < 2 && !pick && l->refresh_tried < l->nnodes; pass++)
        for (int i = 0; i < l->nnodes; i++) {
            unsigned at = (l->rr + (unsigned)i) % (unsigned)l->nnodes;
            rl_node *n = l->node[at];
            if (pass == 0 ? n->state == RL_READY
                          : n->state == RL_IDLE || n->state == RL_CONNECTING) {
                pick = n;
                l->rr = (at + 1) % (unsigned)l->nnodes;
                break;
            }
        }
    if (!pick || !(c = qg__rl_cmd_new(l, 2, argv, NULL, &rc))) {
        if (pick)
            qg__rl_seterr(l, "CLUSTER SLOTS: out of memory");
        else if (!l->err[0])
            qg__rl_seterr(l, "no Cluster node can be reached");
        round_failed(l);
        return;
    }
    c->internal = 1;
    c->icb = on_slots;
    c->pin = pick;
    pick->refs++;
    evtimer_add(&c->tmo, &tv);
    l->refreshing = 1;
    l->refresh_tried++;
    qg__rl_node_submit(pick, c);
}
