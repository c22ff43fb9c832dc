/* redis_link.h - an asynchronous, pipelined link to Redis on one libevent
 * event_base: one node (redis://) or a Redis Cluster (redis-cluster://).
 *
 * A link belongs to one event_base and is used only from that base's
 * thread (each HTTP worker owns one).  Commands are routed by a key (the
 * hash slot of its tag, as Redis computes it), written at once to the
 * connection of the node that serves the slot, and many are in flight on
 * each connection; a reply comes back as a callback on the base.  The
 * Redis store's scripts are not this layer's business: it moves commands
 * and replies, follows Cluster redirections, reconnects, and times out.
 * docs/redis-cluster.md describes the routing and every failure.
 *
 * Callbacks, the rule (libuv's): a callback is never called when the call
 * that took it returned an error, and never inside the call that took it.
 * A command's cb runs exactly once, on the base's thread, either
 *  - from the event loop (event_base_loop / _dispatch of the link's base):
 *    its reply, a failure, a timeout; or
 *  - inside qg__rlink_free (rc QG_ESTATE), when qg__rlink_free is called
 *    outside any callback of the link; called inside one, the link is
 *    freed when that callback returns, and the pending cbs run then.
 * Inside a cb the caller may send commands (qg__rlink_command*) and may
 * call qg__rlink_free.  Replies of one connection arrive in the order the
 * commands were written; a redirected or retried command is written again
 * later, so it may overtake or be overtaken by others.
 *
 * Errors: qg_err codes of quotagate.h.  A Redis error reply that is a real
 * error (a script error, WRONGTYPE, NOSCRIPT, NOAUTH...) is a reply (rc 0,
 * type REDIS_REPLY_ERROR): the caller's to read.  MOVED and ASK are
 * followed, TRYAGAIN, CLUSTERDOWN and LOADING retried every few ms until
 * the command's deadline.  A command that cannot be answered gets rc
 * QG_EIO (connection refused or lost, a node down, no map, too many
 * redirections, the timeout) with reply NULL; qg__rlink_last_error() says
 * why, for a log line. */
#ifndef QG_REDIS_LINK_H
#define QG_REDIS_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

struct event_base;
typedef struct qg__rlink qg__rlink;

#define QG__RLINK_TIMEOUT_MS 100       /* default command timeout
                                        * (PRODUCT.md 5.1.4: store.timeout) */
#define QG__RLINK_MAX_PENDING 131072   /* commands a link holds: taken and
                                        * not yet answered, or timed out and
                                        * awaiting their late reply (cap) */
#define QG__RLINK_MAX_ATTEMPTS 5       /* redirections and re-routings of one
                                        * command before QG_EIO */
#define QG__RLINK_ADDR_MAX 272         /* "host:port" with its NUL */

/* A command's end: reply is valid only during the call (do not free or
 * keep it); rc is 0 with a reply, or negative with reply NULL:
 * QG_EIO (not answered: refused, lost, down, timeout, see above),
 * QG_ESTATE (the link was freed first). */
typedef void (*qg__rlink_cb)(void *ud, const redisReply *reply, int rc);

/* Open a link on base.  url is "redis://HOST[:PORT][/DB]" (one node, port
 * 6379 by default) or "redis-cluster://HOST[:PORT][,HOST[:PORT]...]" (up
 * to 64 seeds: any reachable one gives the slot map); an IPv6 host is in
 * brackets.  password, when not NULL or empty, is sent with AUTH on every
 * connection before anything else (copied; never logged, never in an
 * error message).  timeout_ms is every command's deadline, counted from
 * qg__rlink_command; <= 0 means QG__RLINK_TIMEOUT_MS.
 *
 * Returns the link (free it with qg__rlink_free), connecting in the
 * background: no Redis needs to be up; commands taken before the first
 * connection (or map) wait for it within their deadline.  NULL on a
 * malformed URL or out of memory, with the reason in err.  Blocking only
 * for name resolution (getaddrinfo) of the seeds; IP addresses do not
 * block.  No callback runs inside. */
qg__rlink *qg__rlink_new(struct event_base *base, const char *url,
                         const char *password, int timeout_ms,
                         char *err, size_t errcap);

/* Fail every pending command (cb with QG_ESTATE), close every connection,
 * free the link.  Outside a callback of the link the cbs run inside this
 * call; inside one, after that callback returns (the link takes no
 * command meanwhile: QG_ESTATE).  NULL is a no-op. */
void qg__rlink_free(qg__rlink *l);

/* Send one command: argv[0..argc) with lengths argvlen (NULL: strlen of
 * each), routed by key[0..keylen) (the slot of its hash tag; key NULL:
 * any node).  The command is copied: argv may go once this returns.
 * cb(ud, ...) is called exactly once later, from the event loop (or
 * qg__rlink_free).  Returns 0, or without calling cb: QG_EINVAL (argc < 1,
 * cb NULL), QG_EFULL (QG__RLINK_MAX_PENDING commands pending), QG_ESTATE
 * (the link is being freed), QG_ENOMEM.
 *
 * While a node is connecting, its commands wait (within their deadline);
 * while it is known down (a connection attempt failed and the next one is
 * not due yet) they fail at once with QG_EIO, on the next loop turn, so a
 * caller falls back without waiting for the timeout.  In a Cluster a down
 * node first costs a map refresh, in case its slots moved (failover). */
int qg__rlink_command(qg__rlink *l, const char *key, size_t keylen,
                      int argc, const char **argv, const size_t *argvlen,
                      qg__rlink_cb cb, void *ud);

/* One master the link routes to. */
typedef struct qg__rlink_node {
    char addr[QG__RLINK_ADDR_MAX];   /* "host:port", its identity here */
    unsigned first_slot;             /* the lowest slot it serves (single
                                      * node: 0) */
    unsigned nslots;                 /* slots it serves (single: 16384) */
    int up;                          /* its connection is ready now */
} qg__rlink_node;

/* The masters of the current map (one node: that node), up to cap of them
 * into out (may be NULL with cap 0).  Returns how many there are (0 while
 * a Cluster's first map has not arrived).  A key in a slot a node serves
 * ("qg:epoch:{TAG}" with qg__rc_tag_for_slot(first_slot)) lives there. */
int qg__rlink_nodes(qg__rlink *l, qg__rlink_node *out, int cap);

/* As qg__rlink_command, to the node addr ("host:port" as qg__rlink_nodes
 * names it), not routed: a redirection it answers is its reply.  Also
 * QG_ENOTFOUND, without cb, when the link knows no such node. */
int qg__rlink_command_at(qg__rlink *l, const char *addr, int argc,
                         const char **argv, const size_t *argvlen,
                         qg__rlink_cb cb, void *ud);

/* The command to every master of the current map (SCRIPT LOAD after
 * NOSCRIPT, per-node keys): cb runs once per master, and
 * qg__rlink_reply_node() inside it names the master.  Returns how many
 * commands were taken (0: no map yet), or a negative error as
 * qg__rlink_command when the first could not be; when a later one fails,
 * the count of those taken (their cbs will run). */
int qg__rlink_command_all(qg__rlink *l, int argc, const char **argv,
                          const size_t *argvlen, qg__rlink_cb cb, void *ud);

/* Inside a command's cb: "host:port" of the node whose reply (or
 * connection) it is; NULL when it was answered by no node (a timeout
 * while waiting, no map) and outside callbacks. */
const char *qg__rlink_reply_node(const qg__rlink *l);

/* Called with up = 1 each time a node's connection becomes ready (after
 * AUTH and SELECT), up = 0 when a ready connection is lost: where the
 * store checks its epoch or loads its scripts.  From the event loop; it
 * may send commands.  fn NULL to stop. */
void qg__rlink_on_node(qg__rlink *l, void (*fn)(void *ud, const char *addr, int up),
                       void *ud);

/* Counters since the link was opened (tests, /metrics). */
typedef struct qg__rlink_counters {
    uint64_t commands;      /* taken by qg__rlink_command* */
    uint64_t sent;          /* writes to a connection: commands, their
                             * resends after a redirection or retry, the
                             * link's own (AUTH, SELECT, CLUSTER SLOTS) */
    uint64_t replies;       /* replies read, of every kind */
    uint64_t moved, ask;    /* redirections followed */
    uint64_t retries;       /* TRYAGAIN / CLUSTERDOWN / LOADING retried */
    uint64_t refreshes;     /* slot maps read and applied */
    uint64_t refresh_errors; /* CLUSTER SLOTS that failed or did not parse */
    uint64_t connects;      /* connections that became ready */
    uint64_t reconnects;    /* ready connections lost (each is followed by
                             * new attempts) */
    uint64_t connect_errors; /* attempts that failed (refused, AUTH, timeout) */
    uint64_t errors;        /* commands ended with rc < 0 */
    uint64_t timeouts;      /* of which by their deadline */
    uint64_t pending;       /* now: taken, cb not yet called */
} qg__rlink_counters;

void qg__rlink_counters_get(const qg__rlink *l, qg__rlink_counters *out);

/* The last failure the link met ("connect 127.0.0.1:6379: Connection
 * refused", "AUTH failed: WRONGPASS ..."), "" if none; valid until the
 * next event of the link.  Never holds the password. */
const char *qg__rlink_last_error(const qg__rlink *l);

#endif
