/* redis_node.c - one Redis node's connection inside a link
 * (redis_link_int.h): a hiredis asynchronous context on the link's
 * event_base, its handshake, its backoff, and the writing of commands.
 *
 * A connection is ready after its handshake: AUTH (when the link has a
 * password), SELECT (a database other than 0), or else PING, so that
 * "ready" always means the server answered, not only that the kernel
 * accepted the TCP connection (a stopped server's kernel still does).
 * Commands taken meanwhile wait on the node's waitq and are written, in
 * order, when it is ready; an attempt that takes longer than connect_ms
 * is abandoned.
 *
 * Backoff: a ready connection that is lost is retried at once (a restart,
 * an idle timeout); an attempt that fails is retried after 10 ms, then
 * 20, 40, ... up to 1 s.  Between attempts the node is DOWN and commands
 * for it fail at once (redis_link.h: a caller falls back without waiting
 * for its timeout).  In a Cluster only nodes of the current map (and those
 * commands wait for) are reconnected; others go IDLE after their backoff.
 *
 * hiredis 0.14 calls, for one connection: on_connect once (failure: then
 * every pending callback with NULL and nothing more), the reply callbacks
 * in order, and on a loss every pending callback with NULL followed by
 * on_disconnect.  It does not mark on_connect as a callback, so nothing
 * here frees a connection or runs user code inside on_connect. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "redis_link_int.h"

#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 1000

static const char ASKING[] = "*1\r\n$6\r\nASKING\r\n";

static int wanted(const rl_node *n)
{
    return !n->l->cluster || n->in_map || n->refs || n->waitq.n;
}

static void arm(rl_node *n, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(&n->timer, &tv);
}

static unsigned backoff_ms(unsigned fails)
{
    unsigned ms = BACKOFF_MIN_MS;
    for (unsigned i = 1; i < fails && ms < BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS;
}

redisAsyncContext *qg__rl_node_disown(rl_node *n)
{
    redisAsyncContext *ac = n->ac;
    if (ac)
        ac->data = NULL;
    n->ac = NULL;
    n->connected = 0;
    n->hs_pending = 0;
    return ac;
}

/* The connection is gone (already disowned): count it, plan the next
 * attempt, and send the commands that waited for it elsewhere. */
static void node_down(rl_node *n, int was_ready)
{
    qg__rlink *l = n->l;
    unsigned delay = was_ready ? 0 : backoff_ms(n->fails + 1);
    rl_cmd *c;

    evtimer_del(&n->timer);
    n->fails++;
    if (was_ready)
        l->cnt.reconnects++;
    else
        l->cnt.connect_errors++;
    if (l->closing) {
        n->state = RL_IDLE;
        return;                /* qg__rlink_free fails what is left */
    }
    if (!delay && !wanted(n)) {
        n->state = RL_IDLE;
    } else {
        n->state = delay ? RL_DOWN : RL_CONNECTING;
        arm(n, (int)delay);
    }
    if (n->state != RL_CONNECTING)
        while ((c = rl_pop(&n->waitq)))
            qg__rl_unreachable(l, c);
    if (l->cluster)
        qg__rl_refresh_request(l);
    if (was_ready && l->on_node)
        l->on_node(l->on_node_ud, n->addr, 0);
}

static void node_write(rl_node *n, rl_cmd *c)
{
    qg__rlink *l = n->l;
    if (c->asking) {
        if (redisAsyncFormattedCommand(n->ac, NULL, NULL, ASKING,
                                       sizeof ASKING - 1) != REDIS_OK)
            goto refused;
        l->cnt.sent++;
        c->asking = 0;
    }
    if (redisAsyncFormattedCommand(n->ac, qg__rl_reply_cb, c, c->buf, c->len) !=
        REDIS_OK)
        goto refused;
    l->cnt.sent++;
    if (!n->wire.n)
        n->quiet_since_ms = rl_now_ms();
    c->node = n;
    rl_push(&n->wire, c, RL_WIRE);
    return;
refused:
    /* hiredis takes no command on a connection it is closing: its loss
     * is being reported; this command goes the unreachable way */
    qg__rl_seterr(l, "%s: the connection is closing", n->addr);
    qg__rl_unreachable(l, c);
}

static void node_ready(rl_node *n)
{
    qg__rlink *l = n->l;
    rl_cmd *c;
    evtimer_del(&n->timer);
    n->state = RL_READY;
    n->fails = 0;
    l->cnt.connects++;
    while (n->state == RL_READY && (c = rl_pop(&n->waitq)))
        node_write(n, c);
    if (l->on_node && n->state == RL_READY)
        l->on_node(l->on_node_ud, n->addr, 1);
}

/* AUTH, SELECT and PING replies; privdata names the command. */
static void on_handshake(redisAsyncContext *ac, void *reply, void *privdata)
{
    rl_node *n = ac->data;
    const redisReply *r = reply;
    qg__rlink *l;
    if (!n || !r)
        return;                /* let go of, or lost: on_disconnect says */
    l = n->l;
    qg__rl_enter(l);
    l->cnt.replies++;
    if (r->type == REDIS_REPLY_ERROR) {
        /* Redis's own text ("WRONGPASS invalid username-password pair")
         * never repeats the password */
        qg__rl_seterr(l, "%s: %s failed: %.*s", n->addr, (const char *)privdata,
                      (int)(r->len < 200 ? r->len : 200), r->str);
        qg__rl_node_disown(n);
        redisAsyncFree(ac);    /* in its callback: freed when it returns */
        node_down(n, 0);
    } else if (--n->hs_pending == 0 && n->connected) {
        node_ready(n);
    }
    qg__rl_leave(l);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    rl_node *n = ac->data;
    qg__rlink *l;
    if (!n)
        return;
    l = n->l;
    qg__rl_enter(l);
    if (status != REDIS_OK) {
        qg__rl_seterr(l, "connect %s: %s", n->addr,
                      ac->errstr && *ac->errstr ? ac->errstr : "failed");
        qg__rl_node_disown(n);   /* hiredis frees it when this returns */
        node_down(n, 0);
    } else {
        n->connected = 1;      /* ready on the handshake's last reply */
    }
    qg__rl_leave(l);
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    rl_node *n = ac->data;
    qg__rlink *l;
    int was_ready;
    (void)status;
    if (!n)
        return;
    l = n->l;
    qg__rl_enter(l);
    was_ready = n->state == RL_READY;
    qg__rl_seterr(l, "%s: connection lost%s%s", n->addr,
                  ac->errstr && *ac->errstr ? ": " : "",
                  ac->errstr && *ac->errstr ? ac->errstr : "");
    qg__rl_node_disown(n);
    node_down(n, was_ready);
    qg__rl_leave(l);
}

/* The backoff elapsed (connect again, or rest when nobody wants the node),
 * or an attempt outlived connect_ms. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    rl_node *n = arg;
    qg__rlink *l = n->l;
    (void)fd;
    (void)what;
    qg__rl_enter(l);
    if (n->ac) {
        redisAsyncContext *ac;
        qg__rl_seterr(l, "%s: no answer within %d ms", n->addr, l->connect_ms);
        ac = qg__rl_node_disown(n);
        node_down(n, 0);
        redisAsyncFree(ac);    /* its callbacks see data NULL */
    } else if (wanted(n)) {
        qg__rl_node_connect(n);
    } else {
        n->state = RL_IDLE;
    }
    qg__rl_leave(l);
}

static int handshake(rl_node *n, redisAsyncContext *ac)
{
    qg__rlink *l = n->l;
    char db[16];
    if (l->password) {
        const char *argv[2] = {"AUTH", l->password};
        if (redisAsyncCommandArgv(ac, on_handshake, "AUTH", 2, argv, NULL) != REDIS_OK)
            return -1;
        n->hs_pending++;
        l->cnt.sent++;
    }
    if (l->db) {
        const char *argv[2] = {"SELECT", db};
        snprintf(db, sizeof db, "%d", l->db);
        if (redisAsyncCommandArgv(ac, on_handshake, "SELECT", 2, argv, NULL) != REDIS_OK)
            return -1;
        n->hs_pending++;
        l->cnt.sent++;
    }
    if (!n->hs_pending) {
        const char *argv[1] = {"PING"};
        if (redisAsyncCommandArgv(ac, on_handshake, "PING", 1, argv, NULL) != REDIS_OK)
            return -1;
        n->hs_pending++;
        l->cnt.sent++;
    }
    return 0;
}

void qg__rl_node_connect(rl_node *n)
{
    qg__rlink *l = n->l;
    redisAsyncContext *ac;

    if (n->ac || l->closing)
        return;
    evtimer_del(&n->timer);
    ac = redisAsyncConnect(n->host, n->port);
    if (!ac || ac->err) {
        qg__rl_seterr(l, "connect %s: %s", n->addr,
                      ac && ac->errstr ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        node_down(n, 0);
        return;
    }
    ac->data = n;
    /* replies built in one block each (redis_reply_mem.c) */
    ac->c.reader->fn = &qg__rl_reply_fns;
    n->ac = ac;
    n->connected = 0;
    n->hs_pending = 0;
    if (qg__rl_attach(ac, l->base) != 0 ||
        redisAsyncSetConnectCallback(ac, on_connect) != REDIS_OK ||
        redisAsyncSetDisconnectCallback(ac, on_disconnect) != REDIS_OK ||
        handshake(n, ac) != 0) {
        qg__rl_seterr(l, "connect %s: out of memory", n->addr);
        qg__rl_node_disown(n);
        redisAsyncFree(ac);
        node_down(n, 0);
        return;
    }
    n->state = RL_CONNECTING;
    arm(n, l->connect_ms);
}

void qg__rl_node_submit(rl_node *n, rl_cmd *c)
{
    switch (n->state) {
    case RL_IDLE:
        rl_push(&n->waitq, c, RL_WAITQ);   /* wanted now: a failure sends it on */
        c->node = n;
        qg__rl_node_connect(n);
        return;
    case RL_CONNECTING:
        c->node = n;
        rl_push(&n->waitq, c, RL_WAITQ);
        return;
    case RL_READY:
        node_write(n, c);
        return;
    case RL_DOWN:
        break;
    }
    qg__rl_unreachable(n->l, c);   /* its last failure is in l->err */
}

void qg__rl_node_lost(rl_node *n)
{
    int was_ready = n->state == RL_READY;
    qg__rl_node_disown(n);
    node_down(n, was_ready);
}

void qg__rl_node_drop(rl_node *n, const char *why)
{
    qg__rlink *l = n->l;
    int was_ready = n->state == RL_READY;
    redisAsyncContext *ac = qg__rl_node_disown(n);
    if (!ac)
        return;
    qg__rl_seterr(l, "%s: %s", n->addr, why);
    node_down(n, was_ready);
    redisAsyncFree(ac);        /* the wire's callbacks run now, with NULL */
}

rl_node *qg__rl_node_new(qg__rlink *l, const char *host, int port)
{
    rl_node *n = calloc(1, sizeof *n);
    size_t hl = strlen(host);
    if (!n || hl >= sizeof n->host) {
        free(n);
        return NULL;
    }
    n->l = l;
    memcpy(n->host, host, hl + 1);
    n->port = port;
    snprintf(n->addr, sizeof n->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d",
             host, port);
    n->state = RL_IDLE;
    evtimer_assign(&n->timer, l->base, on_timer, n);
    return n;
}

void qg__rl_node_free(rl_node *n)
{
    redisAsyncContext *ac;
    if (!n)
        return;
    evtimer_del(&n->timer);
    if ((ac = qg__rl_node_disown(n)))
        redisAsyncFree(ac);
    free(n);
}
