/* redis_link_int.h - what the link's files share: redis_link.c
 * (commands, their deadlines, routing, redirections), redis_link_open.c
 * (opening, closing, queries), redis_slots.c (the nodes and the slot map),
 * redis_node.c (one node's connection: connect, AUTH/SELECT, backoff,
 * writing), redis_events.c (its events on the loop) and redis_reply_mem.c
 * (where a reply's objects live).  Internal to them; everyone else uses redis_link.h.
 *
 * Ownership.  The link owns its nodes and its commands.  A command is on
 * at most one list at a time (c->where says which): a node's waitq (its
 * node is connecting) or wire (written, hiredis holds its callback), or
 * the link's unrouted (waiting for a slot map), retryq (TRYAGAIN and
 * friends) or doneq (failed, its cb due on the next loop turn).  Its cb
 * has run once c->done is set; a command still on a wire then only waits
 * for hiredis to hand it back (the late reply, or NULL when the
 * connection goes) and is freed there.  When the link is freed while
 * hiredis still holds commands (a connection freed from inside its own
 * callback is freed by hiredis afterwards), those commands are orphaned
 * (c->l NULL) and their hiredis callback frees them.  A connection the
 * node has let go of has ac->data NULL: its late callbacks are ignored.
 *
 * Re-entrancy.  Every entry from libevent or hiredis brackets its work in
 * qg__rl_enter / qg__rl_leave; qg__rlink_free inside a callback only
 * marks the link closing, and the outermost leave frees it.  The user's
 * callbacks run only from such entries (never inside a call the user
 * made, but qg__rlink_free). */
#ifndef QG_REDIS_LINK_INT_H
#define QG_REDIS_LINK_INT_H

#include <stdint.h>
#include <time.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <hiredis/async.h>
#include "redis_cluster.h"
#include "redis_link.h"

/* hiredis reader functions that build each reply in one block
 * (redis_reply_mem.c); set on every connection the link opens. */
extern redisReplyObjectFunctions qg__rl_reply_fns;

/* Attach a new connection's events to base (redis_events.c: commands
 * written later in the same loop turn, not through a write event).
 * 0, or -1 (out of memory, or already attached). */
int qg__rl_attach(redisAsyncContext *ac, struct event_base *base);

typedef struct rl_cmd rl_cmd;
typedef struct rl_node rl_node;

typedef struct rl_list {
    rl_cmd *head, *tail;
    size_t n;
} rl_list;

enum rl_where { RL_NOWHERE, RL_WAITQ, RL_WIRE, RL_UNROUTED, RL_RETRYQ, RL_DONEQ };

/* A node's connection: IDLE (none, none wanted), CONNECTING (an attempt
 * in progress, or due at once after a loss: commands wait), READY, DOWN
 * (an attempt failed; the next is due when the backoff timer fires:
 * commands fail at once). */
enum rl_state { RL_IDLE, RL_CONNECTING, RL_READY, RL_DOWN };

struct rl_cmd {
    rl_cmd *prev, *next;
    enum rl_where where;
    qg__rlink *l;              /* NULL once orphaned */
    rl_node *node;             /* its node while where is RL_WAITQ/RL_WIRE */
    rl_node *pin;              /* a fixed target (counted in pin->refs) */
    rl_node *hop;              /* the next send's target (a redirection),
                                * consumed by the routing at once */
    int asking;                /* write ASKING before it (an ASK) */
    int slot;                  /* its key's slot, -1 for any node */
    int attempts;              /* redirections and re-routings so far */
    int done;                  /* its cb has run */
    int soon_rc;               /* on the doneq: the rc its cb gets */
    int internal;              /* the link's own (CLUSTER SLOTS) */
    qg__rlink_cb cb;
    void *ud;
    void (*icb)(qg__rlink *l, rl_cmd *c, const redisReply *r, int rc);
    struct event tmo;          /* its deadline */
    size_t len;                /* bytes of buf: the command in RESP */
    char buf[];
};

struct rl_node {
    qg__rlink *l;
    char host[QG__RC_HOST_MAX];
    int port;
    char addr[QG__RLINK_ADDR_MAX];   /* "host:port", "[v6]:port" */
    redisAsyncContext *ac;     /* the connection, NULL when none */
    enum rl_state state;
    int seed;                  /* from the URL: kept for map refreshes */
    int in_map;                /* serves slots in the current map */
    int connected;             /* TCP connected, handshake under way */
    int hs_pending;            /* handshake replies awaited */
    unsigned fails;            /* attempts failed in a row (backoff) */
    unsigned refs;             /* commands pinned to it */
    struct event timer;        /* backoff, or the attempt's deadline */
    rl_list waitq, wire;
    int64_t quiet_since_ms;    /* the wire's last reply, or its first
                                * write after it was empty */
    unsigned first_slot, nslots;
};

struct qg__rlink {
    struct event_base *base;
    int cluster, db;
    char *password;            /* NULL when none */
    int timeout_ms;            /* every command's deadline */
    int stall_ms;              /* a wire quiet this long: connection dropped */
    int connect_ms;            /* an attempt (TCP + handshake) at most */
    int refresh_ms;            /* one CLUSTER SLOTS at most */
    const struct timeval *tmo_tv; /* libevent common timeout of timeout_ms */
    struct timeval tmo_plain;  /* the same, should the base refuse one */
    rl_node **node;            /* every node known: seeds, masters, targets */
    int nnodes, capnodes;
    rl_node **slot;            /* [QG__RC_SLOTS], Cluster only */
    int have_map, refreshing;
    int refresh_tried;         /* nodes asked in the current round */
    unsigned refresh_fails;    /* rounds failed in a row (backoff) */
    int64_t next_refresh_ms;   /* no new refresh before this instant */
    unsigned rr;               /* rotates the node a refresh asks */
    rl_list unrouted, retryq, doneq;
    struct event done_ev, retry_ev, refresh_ev;
    int done_armed, retry_armed, refresh_armed;
    int depth, closing;
    size_t live;               /* user commands allocated */
    const rl_node *cur;        /* whose reply a cb is delivering */
    void (*on_node)(void *ud, const char *addr, int up);
    void *on_node_ud;
    qg__rlink_counters cnt;
    char err[512];
};

/* ---------------------------------------------------------------- lists */

static inline void rl_push(rl_list *q, rl_cmd *c, enum rl_where w)
{
    c->next = NULL;
    c->prev = q->tail;
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    q->n++;
    c->where = w;
}

static inline void rl_unlink(rl_list *q, rl_cmd *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        q->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        q->tail = c->prev;
    q->n--;
    c->prev = c->next = NULL;
    c->where = RL_NOWHERE;
}

static inline rl_cmd *rl_pop(rl_list *q)
{
    rl_cmd *c = q->head;
    if (c)
        rl_unlink(q, c);
    return c;
}

static inline int64_t rl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------- redis_link.c for nodes */

/* The link's command events (deadlines, the doneq, the retryq), set up
 * from timeout_ms, and stopped for good. */
void qg__rl_cmds_init(qg__rlink *l);
void qg__rl_cmds_stop(qg__rlink *l);
void qg__rl_enter(qg__rlink *l);
void qg__rl_leave(qg__rlink *l);   /* may free l: the entry's last act */
/* The end of c: its cb (or the link's own icb) with r or rc, once.  from:
 * the node answering, if any.  c is freed unless hiredis still holds it. */
void qg__rl_finish(qg__rlink *l, rl_cmd *c, const rl_node *from,
                   const redisReply *r, int rc);
/* The node of c cannot be reached: re-route after a map refresh (Cluster,
 * a routed command, attempts left) or fail it with QG_EIO. */
void qg__rl_unreachable(qg__rlink *l, rl_cmd *c);
/* Ask for a slot map refresh; 1 when one is in flight afterwards. */
int qg__rl_refresh_request(qg__rlink *l);
/* Route again every command that waited for the map. */
void qg__rl_reroute_unrouted(qg__rlink *l);
/* A command of argv (copied, as RESP), not yet taken anywhere; NULL with
 * *rc QG_EINVAL (too large) or QG_ENOMEM. */
rl_cmd *qg__rl_cmd_new(qg__rlink *l, int argc, const char **argv,
                       const size_t *argvlen, int *rc);
/* hiredis's callback of every command the link writes (privdata c). */
void qg__rl_reply_cb(redisAsyncContext *ac, void *reply, void *privdata);
void qg__rl_seterr(qg__rlink *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------- redis_link_open.c */

/* Fail what is left, close, free (qg__rlink_free, or the last leave). */
void qg__rl_real_free(qg__rlink *l);

/* A master of the current map (one node: that node). */
static inline int qg__rl_is_master(const qg__rlink *l, const rl_node *n)
{
    return l->cluster ? n->in_map : n == l->node[0];
}

/* ------------------------------------------------ redis_slots.c for the link */

void qg__rl_slots_init(qg__rlink *l);   /* before any other call */
void qg__rl_slots_stop(qg__rlink *l);   /* no refresh any more */
/* The node host:port, added (unconnected, not a seed, in no map) when the
 * link does not know it; NULL when out of memory or too many nodes. */
rl_node *qg__rl_node_get(qg__rlink *l, const char *host, int port);

/* ------------------------------------------------- redis_node.c for the link */

rl_node *qg__rl_node_new(qg__rlink *l, const char *host, int port);
/* Closes its connection (if any) and frees it; its lists must be empty. */
void qg__rl_node_free(rl_node *n);
/* Start an attempt now (no-op when it has a connection). */
void qg__rl_node_connect(rl_node *n);
/* Write c now (READY), queue it (CONNECTING, or IDLE: connects), or
 * declare it unreachable (DOWN). */
void qg__rl_node_submit(rl_node *n, rl_cmd *c);
/* Give up the connection (a stalled wire): its commands fail, a new
 * attempt follows.  May run callbacks. */
void qg__rl_node_drop(rl_node *n, const char *why);
/* hiredis is closing the connection (a NULL reply): let go of it and plan
 * the next attempt.  May run the on_node callback. */
void qg__rl_node_lost(rl_node *n);
/* Let go of the connection without any callback: for qg__rlink_free. */
redisAsyncContext *qg__rl_node_disown(rl_node *n);

#endif
