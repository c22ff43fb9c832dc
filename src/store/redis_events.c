/* redis_events.c - hiredis's event hooks on the link's libevent loop
 * (redis_link_int.h, qg__rl_attach), in place of hiredis's own libevent
 * adapter.
 *
 * The adapter writes through a one-shot write event on the socket: each
 * batch of commands costs an epoll_ctl to ask for writability, a turn of
 * the loop to learn it, the write, and another epoll_ctl to stop asking
 * (strace counted ~0.3 epoll_ctl per decision on Redis, none on the
 * memory store).  Here a batch is written by a user event (no system
 * call to schedule) that runs later in the same turn of the loop, after
 * the other callbacks the turn had ready, so their commands go in the
 * same write; the socket's write event is asked for only while hiredis
 * connects or when the socket is full.  Reads use a persistent event.
 *
 * hiredis may free the context inside any of its calls (a failed write
 * disconnects); it then calls cleanup, which frees these events unless
 * the flush is still on the stack, which frees them when it returns. */
#include <stdlib.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include "redis_link_int.h"

typedef struct rl_ev {
    redisAsyncContext *ac;
    struct event rev, wev, flush;
    int flush_queued;          /* flush is active, not yet run */
    int in_flush;              /* inside the flush's write */
    int dead;                  /* cleaned up while in_flush */
} rl_ev;

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    rl_ev *e = arg;
    (void)fd;
    (void)what;
    redisAsyncHandleRead(e->ac);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    rl_ev *e = arg;
    (void)fd;
    (void)what;
    redisAsyncHandleWrite(e->ac);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    rl_ev *e = arg;
    (void)fd;
    (void)what;
    e->flush_queued = 0;
    if (!(e->ac->c.flags & REDIS_CONNECTED)) {
        event_add(&e->wev, NULL);   /* the socket says when it connects */
        return;
    }
    e->in_flush = 1;
    redisAsyncHandleWrite(e->ac);
    e->in_flush = 0;
    if (e->dead)
        free(e);
}

static void add_read(void *p)
{
    rl_ev *e = p;
    if (!event_pending(&e->rev, EV_READ, NULL))
        event_add(&e->rev, NULL);
}

static void del_read(void *p)
{
    rl_ev *e = p;
    event_del(&e->rev);
}

static void add_write(void *p)
{
    rl_ev *e = p;
    if (e->in_flush || !(e->ac->c.flags & REDIS_CONNECTED)) {
        /* the socket is full, or still connecting: wait for it */
        event_add(&e->wev, NULL);
    } else if (!e->flush_queued) {
        e->flush_queued = 1;
        event_active(&e->flush, EV_WRITE, 0);
    }
}

static void del_write(void *p)
{
    rl_ev *e = p;
    event_del(&e->wev);
}

static void cleanup(void *p)
{
    rl_ev *e = p;
    event_del(&e->rev);
    event_del(&e->wev);
    event_del(&e->flush);
    if (e->in_flush)
        e->dead = 1;
    else
        free(e);
}

int qg__rl_attach(redisAsyncContext *ac, struct event_base *base)
{
    rl_ev *e;
    if (ac->ev.data || !(e = calloc(1, sizeof *e)))
        return -1;
    e->ac = ac;
    if (event_assign(&e->rev, base, ac->c.fd, EV_READ | EV_PERSIST, on_read,
                     e) != 0 ||
        event_assign(&e->wev, base, ac->c.fd, EV_WRITE, on_write, e) != 0 ||
        event_assign(&e->flush, base, -1, 0, on_flush, e) != 0) {
        free(e);
        return -1;
    }
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    ac->ev.data = e;
    /* as hiredis's adapter: both, so that the connection's completion
     * (writable) and a refusal (readable) are seen */
    event_add(&e->rev, NULL);
    event_add(&e->wev, NULL);
    return 0;
}
