/* server.c - the HTTP server's life cycle: listening sockets, worker
 * threads and their event loops, qg__http_post, stopping, counters.
 *
 * Each worker owns an event_base, a SO_REUSEPORT listening socket bound
 * to the same address (the kernel spreads new connections over them) and
 * an eventfd.  The eventfd is the only way other threads reach a worker:
 * qg__http_post queues under a mutex and writes it, qg__http_server_stop
 * sets a flag and writes it (async-signal-safe: no malloc, no lock).  So
 * no libevent call ever crosses threads and the bases run with
 * EVENT_BASE_FLAG_NOLOCK.  Connection handling lives in conn.c, the
 * limits on connections in limits.c. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/thread.h>

#include "http_internal.h"

enum { STOP_GRACE_MS = 2000, ACCEPT_RETRY_MS = 100 };

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static void evthread_init(void) { evthread_use_pthreads(); }

uint64_t qg__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *qg__date(qg__worker *w)
{
    static const char days[7][4] = { "Sun", "Mon", "Tue", "Wed", "Thu",
                                     "Fri", "Sat" };
    static const char mons[12][4] = { "Jan", "Feb", "Mar", "Apr", "May",
                                      "Jun", "Jul", "Aug", "Sep", "Oct",
                                      "Nov", "Dec" };
    time_t now = time(NULL);
    if (now != w->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        /* Names from tables: strftime's %a/%b follow the locale. */
        snprintf(w->date, sizeof w->date, "%s, %02d %s %04d %02d:%02d:%02d GMT",
                 days[tm.tm_wday % 7], tm.tm_mday, mons[tm.tm_mon % 12],
                 tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        w->date_sec = now;
    }
    return w->date;
}

/* ---- listening sockets ---------------------------------------------- */

/* A socket of our SO_REUSEPORT group on host:port; bound_port (first
 * worker) gets the port chosen for port 0.  The first bind of a fixed
 * port first probes without SO_REUSEPORT: otherwise a second quotagate
 * (same user) would silently join the group and share the traffic. */
static int listen_on(const char *host, int port, int *bound_port,
                     char *err, size_t errcap)
{
    struct addrinfo hints = { 0 }, *ai = NULL;
    char portstr[16];
    int fd = -1, one = 1, rc;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(portstr, sizeof portstr, "%d", port);
    rc = getaddrinfo(host, portstr, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errcap, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    if (bound_port && port != 0) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 ||
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
            bind(fd, ai->ai_addr, ai->ai_addrlen) < 0)
            goto fail;
        close(fd);
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto fail;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0)
        goto fail;
    if (bound_port) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
            goto fail;
        *bound_port = ss.ss_family == AF_INET6
            ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    freeaddrinfo(ai);
    return fd;
fail:
    snprintf(err, errcap, "cannot listen on %s:%d: %s", host, port,
             strerror(errno));
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return -1;
}

/* ---- worker event callbacks ----------------------------------------- */

void qg__worker_check_exit(qg__worker *w)
{
    if (w->stopping && !w->exited && !w->in_begin_stop &&
        qg__conns_draining(w) == 0)
        event_base_loopbreak(w->base);
}

static void accept_off(qg__worker *w)
{
    if (w->accept_on) {
        event_del(&w->accept_ev);
        w->accept_on = 0;
    }
}

static void begin_stop(qg__worker *w)
{
    struct timeval tv = { STOP_GRACE_MS / 1000, (STOP_GRACE_MS % 1000) * 1000 };
    w->stopping = 1;
    accept_off(w);
    event_del(&w->retry_ev);
    if (w->lfd >= 0) {
        close(w->lfd);
        w->lfd = -1;
    }
    w->in_begin_stop = 1;
    qg__conns_begin_stop(w);
    w->in_begin_stop = 0;
    evtimer_add(&w->grace_ev, &tv);
    qg__worker_check_exit(w);
}

/* Swap the queue out under the lock and run it without. */
static void run_posts(qg__worker *w, int close_queue)
{
    qg__post *items;
    size_t n, cap;
    pthread_mutex_lock(&w->mu);
    if (close_queue)
        w->q_closed = 1;
    items = w->q;
    n = w->qlen;
    cap = w->qcap;
    w->q = w->runq;
    w->qcap = w->runcap;
    w->qlen = 0;
    w->runq = items;
    w->runcap = cap;
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < n; i++)
        items[i].fn(items[i].arg);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    qg__worker *w = arg;
    uint64_t v;
    (void)what;
    /* Read first, then drain: a post racing with us re-arms the fd. */
    if (read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
        return;
    if (atomic_load(&w->srv->stopping) && !w->stopping)
        begin_stop(w);
    run_posts(w, 0);
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    qg__conns_sweep(arg);
}

static void on_grace(evutil_socket_t fd, short what, void *arg)
{
    qg__worker *w = arg;
    (void)fd;
    (void)what;
    event_base_loopbreak(w->base);
}

/* accept() ran out of descriptors: listen again a little later rather
 * than spin on a socket that stays readable. */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    qg__worker *w = arg;
    (void)fd;
    (void)what;
    if (!w->stopping && !w->accept_on && w->lfd >= 0 &&
        event_add(&w->accept_ev, NULL) == 0)
        w->accept_on = 1;
}

void qg__accept_pause(qg__worker *w)
{
    struct timeval tv = { 0, ACCEPT_RETRY_MS * 1000 };
    accept_off(w);
    evtimer_add(&w->retry_ev, &tv);
}

static void *worker_main(void *arg)
{
    qg__worker *w = arg;
    char name[16];
    snprintf(name, sizeof name, "qg-http-%d", w->idx);
    pthread_setname_np(pthread_self(), name);
    event_base_dispatch(w->base);
    /* The loop is over: close every socket, run what was posted before
     * the stop (responses to gone connections are discarded), refuse the
     * rest. */
    w->exited = 1;
    qg__conns_release(w, 0);
    run_posts(w, 1);
    event_del(&w->wake_ev);
    event_del(&w->sweep_ev);
    event_del(&w->grace_ev);
    event_del(&w->retry_ev);
    accept_off(w);
    return NULL;
}

/* ---- public API ------------------------------------------------------ */

static int worker_init(qg_http_server *s, qg__worker *w, char *err,
                       size_t errcap)
{
    struct event_config *cfg;
    int ms = s->o.header_timeout_ms < s->o.idle_timeout_ms
        ? s->o.header_timeout_ms : s->o.idle_timeout_ms;
    struct timeval sweep;

    /* Timeouts are checked by a sweep a few times per timeout period
     * instead of a timer per connection re-armed on every request. */
    ms /= 4;
    if (ms < 5)
        ms = 5;
    if (ms > 1000)
        ms = 1000;
    sweep.tv_sec = ms / 1000;
    sweep.tv_usec = (ms % 1000) * 1000;

    if (qg__limits_init(w) < 0) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        snprintf(err, errcap, "eventfd: %s", strerror(errno));
        return -1;
    }
    cfg = event_config_new();
    if (!cfg)
        goto oom;
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK |
                               EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    w->base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (!w->base)
        goto oom;
    event_assign(&w->accept_ev, w->base, w->lfd, EV_READ | EV_PERSIST,
                 qg__on_accept, w);
    event_assign(&w->wake_ev, w->base, w->efd, EV_READ | EV_PERSIST,
                 on_wake, w);
    event_assign(&w->sweep_ev, w->base, -1, EV_PERSIST, on_sweep, w);
    evtimer_assign(&w->grace_ev, w->base, on_grace, w);
    evtimer_assign(&w->retry_ev, w->base, on_retry, w);
    if (event_add(&w->accept_ev, NULL) < 0 || event_add(&w->wake_ev, NULL) < 0
        || event_add(&w->sweep_ev, &sweep) < 0)
        goto oom;
    w->accept_on = 1;
    return 0;
oom:
    snprintf(err, errcap, "cannot create the event loop");
    return -1;
}

qg_http_server *qg__http_server_new(const qg_http_opts *opts,
                                   qg_http_handler handler, void *ud,
                                   char *err, size_t errcap)
{
    qg_http_server *s;
    char dummy[1];
    if (!err || errcap == 0) {
        err = dummy;
        errcap = sizeof dummy;
    }
    if (!handler) {
        snprintf(err, errcap, "no handler");
        return NULL;
    }
    pthread_once(&evthread_once, evthread_init);
    s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    if (opts)
        s->o = *opts;
    snprintf(s->host, sizeof s->host, "%s",
             s->o.host && *s->o.host ? s->o.host : "127.0.0.1");
    s->o.host = s->host;
    if (s->o.workers <= 0)
        s->o.workers = 2;
    if (s->o.max_header_bytes == 0)
        s->o.max_header_bytes = 16 * 1024;
    if (s->o.max_body_bytes == 0)
        s->o.max_body_bytes = 1024 * 1024;
    if (s->o.header_timeout_ms <= 0)
        s->o.header_timeout_ms = 10000;
    if (s->o.idle_timeout_ms <= 0)
        s->o.idle_timeout_ms = 60000;
    if (s->o.min_body_rate <= 0)
        s->o.min_body_rate = 8192;
    if (s->o.max_connections <= 0)
        s->o.max_connections = qg__http_default_max_connections(s->o.workers);
    if (s->o.max_conns_per_client == 0)
        s->o.max_conns_per_client = s->o.max_connections / 2 > 0
            ? s->o.max_connections / 2 : 1;
    if (s->o.stream_high_water == 0)
        s->o.stream_high_water = 256 * 1024;
    if (s->o.port < 0 || s->o.port > 65535) {
        snprintf(err, errcap, "bad port %d", s->o.port);
        free(s);
        return NULL;
    }
    s->handler = handler;
    s->ud = ud;
    s->workers = calloc((size_t)s->o.workers, sizeof *s->workers);
    if (!s->workers) {
        snprintf(err, errcap, "out of memory");
        free(s);
        return NULL;
    }
    for (int i = 0; i < s->o.workers; i++) {
        qg__worker *w = &s->workers[i];
        w->srv = s;
        w->idx = i;
        w->lfd = w->efd = -1;
        pthread_mutex_init(&w->mu, NULL);
        s->nworkers = i + 1;
        /* Port 0: the first bind picks the port, the others share it. */
        w->lfd = listen_on(s->host, i == 0 ? s->o.port : s->port,
                           i == 0 ? &s->port : NULL, err, errcap);
        if (w->lfd < 0 || worker_init(s, w, err, errcap) < 0)
            goto fail;
    }
    return s;
fail:
    qg__http_server_free(s);
    return NULL;
}

int qg__http_server_port(const qg_http_server *s)
{
    return s->port;
}

int qg__http_server_run(qg_http_server *s)
{
    int rc = 0;
    if (atomic_exchange(&s->running, 1))
        return -1;
    for (int i = 0; i < s->nworkers; i++) {
        qg__worker *w = &s->workers[i];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            qg__http_server_stop(s);
            rc = -1;
            break;
        }
        w->thread_started = 1;
    }
    for (int i = 0; i < s->nworkers; i++)
        if (s->workers[i].thread_started) {
            pthread_join(s->workers[i].thread, NULL);
            s->workers[i].thread_started = 0;
        }
    return rc;
}

void qg__http_server_stop(qg_http_server *s)
{
    int saved = errno;          /* a signal handler must not clobber it */
    uint64_t one = 1;
    atomic_store(&s->stopping, 1);
    for (int i = 0; i < s->nworkers; i++)
        if (s->workers[i].efd >= 0) {
            ssize_t r = write(s->workers[i].efd, &one, sizeof one);
            (void)r;
        }
    errno = saved;
}

int qg__http_post(qg_http_server *s, int worker, void (*fn)(void *), void *arg)
{
    qg__worker *w;
    int wake;
    if (!s || !fn || worker < 0 || worker >= s->nworkers ||
        atomic_load(&s->stopping))
        return -1;
    w = &s->workers[worker];
    pthread_mutex_lock(&w->mu);
    if (w->q_closed) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    if (w->qlen == w->qcap) {
        size_t cap = w->qcap ? w->qcap * 2 : 64;
        qg__post *q = realloc(w->q, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&w->mu);
            return -1;
        }
        w->q = q;
        w->qcap = cap;
    }
    /* Only the post that makes the queue non-empty wakes the worker. */
    wake = w->qlen == 0;
    w->q[w->qlen].fn = fn;
    w->q[w->qlen].arg = arg;
    w->qlen++;
    pthread_mutex_unlock(&w->mu);
    if (wake) {
        uint64_t one = 1;
        ssize_t r = write(w->efd, &one, sizeof one);
        (void)r;
    }
    return 0;
}

void qg__http_server_free(qg_http_server *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nworkers; i++) {
        qg__worker *w = &s->workers[i];
        if (w->base) {
            qg__conns_release(w, 1);
            event_del(&w->accept_ev);
            event_del(&w->wake_ev);
            event_del(&w->sweep_ev);
            event_del(&w->grace_ev);
            event_del(&w->retry_ev);
            event_base_free(w->base);
        }
        if (w->lfd >= 0)
            close(w->lfd);
        if (w->efd >= 0)
            close(w->efd);
        pthread_mutex_destroy(&w->mu);
        free(w->q);
        free(w->runq);
        qg__limits_free(w);
    }
    free(s->workers);
    free(s);
}

void qg__http_server_stats(qg_http_server *s, qg_http_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < s->nworkers; i++) {
        qg__worker *w = &s->workers[i];
        out->connections_open += atomic_load_explicit(&w->st_open,
                                                      memory_order_relaxed);
        out->connections_total += atomic_load_explicit(&w->st_total,
                                                       memory_order_relaxed);
        out->requests_total += atomic_load_explicit(&w->st_requests,
                                                    memory_order_relaxed);
        out->errors_total += atomic_load_explicit(&w->st_errors,
                                                  memory_order_relaxed);
        for (int d = 0; d < QG_HTTP_DROP_COUNT; d++)
            out->drops[d] += atomic_load_explicit(&w->st_drops[d],
                                                  memory_order_relaxed);
        out->max_connections += (uint64_t)w->cap;
        out->max_conns_per_client += (uint64_t)w->per_client;
    }
}
