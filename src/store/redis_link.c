/* redis_link.c - the link (redis_link.h): commands and their deadlines,
 * routing by slot, redirections, retries.  Opening and closing a link
 * and its queries are redis_link_open.c's; one node's connection is
 * redis_node.c's; the link's nodes and the Cluster's slot map (asking
 * CLUSTER SLOTS, applying it) are redis_slots.c's; the pure routing data
 * (slots, parsing) is redis_cluster.c's.
 *
 * A command's life: taken (copied as RESP into one allocation with its
 * deadline timer, a libevent common timeout so thousands cost O(1) each),
 * routed (a one-shot redirection target, else its pinned node, else the
 * one node, else the master of its slot), then written to that node's
 * connection or queued while it connects.  It ends exactly once, through
 * qg__rl_finish: its reply, a failure, or its deadline.  Failures found
 * while routing are never delivered inside the user's call: they go to
 * the doneq, whose event runs on the next loop turn.
 *
 * Error replies: MOVED updates the slot's master (and schedules a full
 * refresh) and resends there; ASK resends there after ASKING, once, the
 * map unchanged; TRYAGAIN, CLUSTERDOWN (Cluster) and LOADING are retried
 * every RETRY_MS until the deadline.  Every other error is the caller's
 * reply.  A command is redirected or re-routed at most
 * QG__RLINK_MAX_ATTEMPTS times. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fixed.h"
#include "quotagate.h"
#include "redis_link_int.h"

#define RETRY_MS 5
#define MAX_COMMAND_BYTES (64u << 20)   /* one command, in RESP */

static void route(qg__rlink *l, rl_cmd *c);

/* --------------------------------------------------------- re-entrancy */

void qg__rl_enter(qg__rlink *l)
{
    l->depth++;
}

void qg__rl_leave(qg__rlink *l)
{
    if (--l->depth == 0 && l->closing)
        qg__rl_real_free(l);
}

void qg__rl_seterr(qg__rlink *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, sizeof l->err, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------ commands */

static void on_timeout(evutil_socket_t fd, short what, void *arg);

/* A RESP header, kind and n then CRLF, at out; its length (1 + digits of n
 * + 2).  By hand: sprintf's format parsing was most of a command's cost
 * here (callgrind, docs/benchmarks.md). */
static size_t head(char *out, char kind, size_t n)
{
    size_t d = qg__dec_u64(out + 1, n);
    out[0] = kind;
    out[d + 1] = '\r';
    out[d + 2] = '\n';
    out[d + 3] = 0;
    return d + 3;
}

/* The command in RESP, in one allocation with its bookkeeping. */
rl_cmd *qg__rl_cmd_new(qg__rlink *l, int argc, const char **argv,
                       const size_t *argvlen, int *rc)
{
    size_t len = 1 + qg__dec_len((size_t)argc) + 2, off;
    rl_cmd *c;

    for (int i = 0; i < argc; i++) {
        size_t al = argvlen ? argvlen[i] : strlen(argv[i]);
        if (al > MAX_COMMAND_BYTES || len > MAX_COMMAND_BYTES) {
            *rc = QG_EINVAL;
            return NULL;
        }
        len += 1 + qg__dec_len(al) + 2 + al + 2;
    }
    if (len > MAX_COMMAND_BYTES) {
        *rc = QG_EINVAL;
        return NULL;
    }
    if (!(c = malloc(sizeof *c + len + 1))) {   /* + a NUL, as before */
        *rc = QG_ENOMEM;
        return NULL;
    }
    memset(c, 0, sizeof *c);
    c->l = l;
    c->slot = -1;
    c->len = len;
    off = head(c->buf, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        size_t al = argvlen ? argvlen[i] : strlen(argv[i]);
        off += head(c->buf + off, '$', al);
        memcpy(c->buf + off, argv[i], al);
        off += al;
        c->buf[off++] = '\r';
        c->buf[off++] = '\n';
    }
    event_assign(&c->tmo, l->base, -1, 0, on_timeout, c);
    return c;
}

static void cmd_free(qg__rlink *l, rl_cmd *c)
{
    event_del(&c->tmo);
    if (c->pin)
        c->pin->refs--;
    if (!c->internal)
        l->live--;
    free(c);
}

void qg__rl_finish(qg__rlink *l, rl_cmd *c, const rl_node *from,
                   const redisReply *r, int rc)
{
    const rl_node *prev = l->cur;
    if (c->done)
        return;
    c->done = 1;
    event_del(&c->tmo);
    switch (c->where) {
    case RL_WAITQ:
        rl_unlink(&c->node->waitq, c);
        break;
    case RL_UNROUTED:
        rl_unlink(&l->unrouted, c);
        break;
    case RL_RETRYQ:
        rl_unlink(&l->retryq, c);
        break;
    case RL_DONEQ:
        rl_unlink(&l->doneq, c);
        break;
    case RL_WIRE:      /* stays until hiredis hands it back */
    case RL_NOWHERE:
        break;
    }
    if (!c->internal) {
        l->cnt.pending--;
        if (rc < 0)
            l->cnt.errors++;
    }
    l->cur = from;
    if (c->internal)
        c->icb(l, c, r, rc);
    else
        c->cb(c->ud, r, rc);
    l->cur = prev;
    if (c->where != RL_WIRE)
        cmd_free(l, c);
}

static const char *waiting_for(const rl_cmd *c)
{
    switch (c->where) {
    case RL_WAITQ:
        return "while its node connected";
    case RL_UNROUTED:
        return "while waiting for the slot map";
    case RL_RETRYQ:
        return "while retrying (TRYAGAIN, CLUSTERDOWN or LOADING)";
    default:
        return "";
    }
}

/* A deadline.  A command on a wire whose connection has been silent for
 * stall_ms takes the connection with it: the server is stopped or the
 * path is gone, and a new connection is the way to know. */
static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    rl_cmd *c = arg;
    qg__rlink *l = c->l;
    rl_node *n = c->where == RL_WIRE ? c->node : NULL;
    (void)fd;
    (void)what;
    qg__rl_enter(l);
    if (c->where == RL_DONEQ)
        ;                      /* failing already, for a better reason */
    else if (n)
        qg__rl_seterr(l, "%s: no reply within %d ms", n->addr,
                      c->internal ? l->refresh_ms : l->timeout_ms);
    else
        qg__rl_seterr(l, "no reply within %d ms (%s)",
                      c->internal ? l->refresh_ms : l->timeout_ms, waiting_for(c));
    if (!c->internal && c->where != RL_DONEQ)
        l->cnt.timeouts++;
    qg__rl_finish(l, c, n, NULL, QG_EIO);
    if (n && n->ac && n->wire.n && !l->closing &&
        rl_now_ms() - n->quiet_since_ms >= l->stall_ms)
        qg__rl_node_drop(n, "no reply for the stall time: connection dropped");
    qg__rl_leave(l);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    qg__rlink *l = arg;
    (void)fd;
    (void)what;
    qg__rl_enter(l);
    l->done_armed = 0;
    /* only those queued before: a cb that fails again goes next turn */
    for (size_t n = l->doneq.n; n && l->doneq.head; n--) {
        rl_cmd *c = l->doneq.head;
        qg__rl_finish(l, c, NULL, NULL, c->soon_rc);
    }
    qg__rl_leave(l);
}

static void fail_soon(qg__rlink *l, rl_cmd *c, int rc)
{
    c->soon_rc = rc;
    rl_push(&l->doneq, c, RL_DONEQ);
    if (!l->done_armed) {
        l->done_armed = 1;
        event_active(&l->done_ev, EV_TIMEOUT, 1);
    }
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    qg__rlink *l = arg;
    rl_cmd *c;
    (void)fd;
    (void)what;
    qg__rl_enter(l);
    l->retry_armed = 0;
    for (size_t n = l->retryq.n; n && (c = rl_pop(&l->retryq)); n--)
        route(l, c);
    qg__rl_leave(l);
}

static void retry_later(qg__rlink *l, rl_cmd *c)
{
    struct timeval tv = {0, RETRY_MS * 1000};
    c->hop = NULL;
    c->asking = 0;
    rl_push(&l->retryq, c, RL_RETRYQ);
    if (!l->retry_armed) {
        l->retry_armed = 1;
        evtimer_add(&l->retry_ev, &tv);
    }
}

void qg__rl_cmds_init(qg__rlink *l)
{
    struct timeval tv = {l->timeout_ms / 1000, (l->timeout_ms % 1000) * 1000};
    l->tmo_plain = tv;
    l->tmo_tv = event_base_init_common_timeout(l->base, &tv);
    if (!l->tmo_tv)
        l->tmo_tv = &l->tmo_plain;
    event_assign(&l->done_ev, l->base, -1, 0, on_done, l);
    evtimer_assign(&l->retry_ev, l->base, on_retry, l);
}

void qg__rl_cmds_stop(qg__rlink *l)
{
    event_del(&l->done_ev);
    event_del(&l->retry_ev);
    l->done_armed = l->retry_armed = 0;
}

/* ------------------------------------------------------------- routing */

/* A ready master for a command without key (round robin), else any. */
static rl_node *any_master(qg__rlink *l)
{
    rl_node *any = NULL;
    for (int i = 0; i < l->nnodes; i++) {
        rl_node *n = l->node[(l->rr + (unsigned)i) % (unsigned)l->nnodes];
        if (!n->in_map)
            continue;
        if (n->state == RL_READY) {
            l->rr = (l->rr + (unsigned)i + 1) % (unsigned)l->nnodes;
            return n;
        }
        if (!any)
            any = n;
    }
    return any;
}

/* No master for c's slot: wait for the map if one is coming. */
static void unmapped(qg__rlink *l, rl_cmd *c)
{
    if (++c->attempts <= QG__RLINK_MAX_ATTEMPTS && qg__rl_refresh_request(l)) {
        rl_push(&l->unrouted, c, RL_UNROUTED);
        return;
    }
    if (l->have_map)
        qg__rl_seterr(l, "slot %d is served by no master", c->slot);
    fail_soon(l, c, l->closing ? QG_ESTATE : QG_EIO);
}

static void route(qg__rlink *l, rl_cmd *c)
{
    rl_node *n;
    if (c->hop) {
        n = c->hop;
        c->hop = NULL;
    } else if (c->pin) {
        n = c->pin;
    } else if (!l->cluster) {
        n = l->node[0];
    } else {
        n = c->slot >= 0 ? l->slot[c->slot] : any_master(l);
        if (!n) {
            unmapped(l, c);
            return;
        }
    }
    qg__rl_node_submit(n, c);
}

void qg__rl_reroute_unrouted(qg__rlink *l)
{
    rl_cmd *c;
    for (size_t n = l->unrouted.n; n && (c = rl_pop(&l->unrouted)); n--)
        route(l, c);
}

void qg__rl_unreachable(qg__rlink *l, rl_cmd *c)
{
    c->hop = NULL;
    c->asking = 0;
    if (l->cluster && !c->pin && !l->closing &&
        ++c->attempts <= QG__RLINK_MAX_ATTEMPTS && qg__rl_refresh_request(l)) {
        rl_push(&l->unrouted, c, RL_UNROUTED);   /* its slot may have moved */
        return;
    }
    fail_soon(l, c, l->closing ? QG_ESTATE : QG_EIO);
}

/* An error reply that asks something of a cluster client: 1 when c was
 * sent on (or ended), 0 when it is the caller's reply. */
static int redirected(qg__rlink *l, rl_cmd *c, rl_node *n, const redisReply *r)
{
    qg__rc_kind kind = qg__rc_error_kind(r->str, r->len);
    qg__rc_redirect rd;
    rl_node *t;

    if ((kind == QG__RC_MOVED || kind == QG__RC_ASK) && l->cluster && !c->pin) {
        if (qg__rc_parse_redirect(r->str, r->len, &rd) != 0)
            return 0;          /* not well formed: an error like others */
        t = qg__rl_node_get(l, rd.host[0] ? rd.host : n->host, rd.port);
        if (kind == QG__RC_MOVED) {
            l->cnt.moved++;
            if (t) {
                l->slot[rd.slot] = t;
                t->in_map = 1;
            }
            qg__rl_refresh_request(l);   /* others of its slots moved too */
        } else {
            l->cnt.ask++;
        }
        if (!t || ++c->attempts > QG__RLINK_MAX_ATTEMPTS) {
            qg__rl_seterr(l, "%s: %s", n->addr, t ? "too many redirections"
                                                   : "out of memory");
            qg__rl_finish(l, c, n, NULL, QG_EIO);
            return 1;
        }
        c->hop = t;
        c->asking = kind == QG__RC_ASK;
        route(l, c);
        return 1;
    }
    if (((kind == QG__RC_TRYAGAIN || kind == QG__RC_CLUSTERDOWN) && l->cluster) ||
        kind == QG__RC_LOADING) {
        l->cnt.retries++;
        qg__rl_seterr(l, "%s: %.*s", n->addr, (int)(r->len < 200 ? r->len : 200),
                      r->str);
        if (kind == QG__RC_CLUSTERDOWN)
            qg__rl_refresh_request(l);
        retry_later(l, c);
        return 1;
    }
    return 0;
}

void qg__rl_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
    rl_cmd *c = privdata;
    const redisReply *r = reply;
    qg__rlink *l = c->l;
    rl_node *n;

    if (!l) {                  /* orphaned: the link is gone */
        free(c);
        return;
    }
    n = c->node;
    rl_unlink(&n->wire, c);
    qg__rl_enter(l);
    if (!r) {                  /* the connection is going */
        if (n->ac == ac) {
            qg__rl_seterr(l, "%s: connection lost%s%s", n->addr,
                          ac->errstr && *ac->errstr ? ": " : "",
                          ac->errstr && *ac->errstr ? ac->errstr : "");
            qg__rl_node_lost(n);
        }
        if (c->done)
            cmd_free(l, c);
        else
            qg__rl_finish(l, c, n, NULL, l->closing ? QG_ESTATE : QG_EIO);
        qg__rl_leave(l);
        return;
    }
    l->cnt.replies++;
    n->quiet_since_ms = rl_now_ms();
    if (c->done)               /* the late reply of a command timed out */
        cmd_free(l, c);
    else if (r->type != REDIS_REPLY_ERROR || l->closing || !redirected(l, c, n, r))
        qg__rl_finish(l, c, n, r, 0);
    qg__rl_leave(l);
}

/* ------------------------------------------------------------ the API */

static int take(qg__rlink *l, int slot, rl_node *pin, int argc,
                const char **argv, const size_t *argvlen, qg__rlink_cb cb,
                void *ud)
{
    rl_cmd *c;
    int rc = 0;
    if (!l || argc < 1 || !argv || !cb)
        return QG_EINVAL;
    if (l->closing)
        return QG_ESTATE;
    if (l->live >= QG__RLINK_MAX_PENDING)
        return QG_EFULL;
    if (!(c = qg__rl_cmd_new(l, argc, argv, argvlen, &rc)))
        return rc;
    c->cb = cb;
    c->ud = ud;
    c->slot = slot;
    if ((c->pin = pin))
        pin->refs++;
    l->live++;
    l->cnt.commands++;
    l->cnt.pending++;
    event_add(&c->tmo, l->tmo_tv);
    route(l, c);
    return 0;
}

int qg__rlink_command(qg__rlink *l, const char *key, size_t keylen, int argc,
                      const char **argv, const size_t *argvlen,
                      qg__rlink_cb cb, void *ud)
{
    int slot = l && l->cluster && key ? (int)qg__rc_slot(key, keylen) : -1;
    return take(l, slot, NULL, argc, argv, argvlen, cb, ud);
}

int qg__rlink_command_at(qg__rlink *l, const char *addr, int argc,
                         const char **argv, const size_t *argvlen,
                         qg__rlink_cb cb, void *ud)
{
    if (!l || !addr)
        return QG_EINVAL;
    for (int i = 0; i < l->nnodes; i++)
        if (strcmp(l->node[i]->addr, addr) == 0)
            return take(l, -1, l->node[i], argc, argv, argvlen, cb, ud);
    return QG_ENOTFOUND;
}

int qg__rlink_command_all(qg__rlink *l, int argc, const char **argv,
                          const size_t *argvlen, qg__rlink_cb cb, void *ud)
{
    int taken = 0, rc;
    if (!l)
        return QG_EINVAL;
    for (int i = 0; i < l->nnodes; i++) {
        if (!qg__rl_is_master(l, l->node[i]))
            continue;
        if ((rc = take(l, -1, l->node[i], argc, argv, argvlen, cb, ud)) != 0)
            return taken ? taken : rc;
        taken++;
    }
    return taken;
}

