/* serve.c - the life of `quotagate serve`: start, rebuild, serve, reload,
 * shut down.
 *
 * Start: rules, ledger (creating ./var), keys, store, engine; subjects
 * created through the admin API come back from the ledger; then every
 * window is rebuilt from the ledger rows inside the rules' reach (counters
 * are a cache of the ledger), and only then does the HTTP server accept.
 * Signals are taken by one thread with sigwait (SIGTERM/SIGINT: stop,
 * SIGHUP: reload), so no work happens in a signal handler.  The soft
 * file-descriptor limit is raised to the hard one first: the number of
 * client connections the server holds is derived from it (http.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <openssl/crypto.h>
#include "auth.h"
#include "json_out.h"
#include "metrics.h"
#include "notify.h"
#include "routes.h"
#include "keeper.h"
#include "proxy.h"
#include "pace.h"
#include "server.h"

void qg__server_gauges(qg_server *s, const qg_store_stats *st,
                      const qg_ledger_stats *ls, const qg_http_stats *hs,
                      qg_metrics_gauges *g)
{
    memset(g, 0, sizeof *g);
    g->http = hs;
    g->ledger_queue_depth = ls->queued;
    g->ledger_commits = ls->commits;
    g->ledger_rows = ls->rows_written;
    g->ledger_commit_us_sum = ls->commit_us_sum;
    g->ledger_write_errors = ls->errors;
    g->ledger_rows_retried = ls->rows_retried;
    g->ledger_rows_lost = ls->rows_lost;
    g->ledger_rows_refused = ls->rows_refused;
    g->ledger_up = !ls->failing && !ls->spooling;
    g->ledger_spool_rows = ls->spool_rows;
    g->ledger_rows_spooled = ls->rows_spooled;
    g->ledger_rows_replayed = ls->rows_replayed;
    g->ledger_id_filter_ids = ls->id_filter_ids;
    g->ledger_id_filter_levels = (uint64_t)ls->id_filter_levels;
    g->ledger_id_filter_bytes = ls->id_filter_bytes;
    g->ledger_id_reads = ls->id_reads;
    g->ledger_cache_bytes = ls->cache_bytes;
    memcpy(g->ledger_commit_le, ls->commit_le_us, sizeof g->ledger_commit_le);
    g->rebuild_ms = s->rebuild_ms;
    g->rebuild_rows = s->rebuild_rows;
    g->rebuild_clamped = s->rebuild_clamped;
    g->rebuild_skipped = s->rebuild_skipped;
    g->store_subjects = st->subjects;
    g->store_up = !(atomic_load(&s->store_down) || atomic_load(&s->store_lost));
    g->fallback_decisions = atomic_load(&s->fallback_decisions);
    g->fallback_pending = qg_engine_local_pending(s->engine);
    g->reconcile_runs = atomic_load(&s->reconcile_runs);
    g->reconcile_drifted = atomic_load(&s->reconcile_drifted);
    g->reconcile_max_drift_milli = atomic_load(&s->reconcile_max_drift);
    g->store_bytes = st->bytes;
    if (strncmp(qg_store_name(s->store), "redis", 5) == 0) {
        g->store_remote = 1;
        qg_store_redis_counters(s->store, &g->redis);
    }
}

/* The ledger's reports (ledger.h, opts.log): one line on stderr each. */
static void ledger_log(void *ud, const char *line)
{
    (void)ud;
    fprintf(stderr, "quotagate: %s\n", line);
}

/* ------------------------------------------------------------- rebuild */

static int put_subject(const char *subject, const char *plan,
                       const char *org, int64_t anchor_ms, void *ud)
{
    qg_server *s = ud;
    char err[256];
    if (qg_engine_set_subject(s->engine, subject, plan, *org ? org : NULL,
                              anchor_ms, err, sizeof err) != QG_OK)
        fprintf(stderr, "quotagate: subject %s: %s (skipped)\n", subject, err);
    return 0;
}

static int restore_row(const qg_ledger_row *row, void *ud)
{
    qg_server *s = ud;
    char err[256], why[256];
    qg_restore_req rr;
    int b;
    qg__row_restore_req(row, &rr);
    if ((b = qg__row_in_bounds(&rr, why, sizeof why)) < 0) {
        fprintf(stderr, "quotagate: rebuild: request %s (subject %s): %s: "
                "skipped\n", row->request_id, row->subject, why);
        s->rebuild_skipped++;
        return 0;
    }
    if (b > 0) {
        fprintf(stderr, "quotagate: rebuild: request %s (subject %s): "
                "amounts beyond the bounds (%s): clamped to them\n",
                row->request_id, row->subject, why);
        s->rebuild_clamped++;
    }
    if (qg_engine_restore(s->engine, &rr, err, sizeof err) != QG_OK) {
        fprintf(stderr, "quotagate: rebuild: request %s: %s\n",
                row->request_id, err);
        s->rebuild_skipped++;
    }
    s->rebuild_rows++;
    return 0;
}

static int rebuild(qg_server *s)
{
    int64_t t0 = qg__clock_ms(CLOCK_MONOTONIC);
    int64_t since = qg__server_now(s) - qg_engine_reach_ms(s->engine);
    int rc = qg__ledger_scan_piped(s->ledger, since, restore_row, s);
    s->rebuild_ms = qg__clock_ms(CLOCK_MONOTONIC) - t0;
    return rc;
}

/* ------------------------------------------------------------- signals */

typedef struct sigctx {
    qg_server *s;
    sigset_t set;
} sigctx;

static void *signal_thread(void *arg)
{
    sigctx *c = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&c->set, &sig) != 0)
            continue;
        if (sig == SIGHUP) {            /* loaded and logged there */
            qg__reloader_request(c->s->reloader, NULL);
            continue;
        }
        if (sig == SIGUSR2)      /* our own wake-up at shutdown */
            return NULL;
        fprintf(stderr, "quotagate: %s: shutting down\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        qg__http_server_stop(c->s->http);
    }
}

/* --------------------------------------------------------------- serve */

static int parse_listen(const char *l, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(l, ':');
    char *end;
    long p;
    if (!colon)
        return -1;
    p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || (size_t)(colon - l) >= cap)
        return -1;
    if (colon == l)
        snprintf(host, cap, "127.0.0.1");
    else
        snprintf(host, cap, "%.*s", (int)(colon - l), l);
    *port = (int)p;
    return 0;
}

/* The soft RLIMIT_NOFILE up to the hard one; the limit now in force. */
static long raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        rl.rlim_cur = want;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || getrlimit(RLIMIT_NOFILE,
                                                            &rl) != 0)
            return -1;
    }
    return rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
}

static int mkdir_p(const char *dir)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* Options and limits, before anything is opened: 0, or the exit status
 * (2) with a message.  *rules (owned from here) is loaded if not given. */
static int is_redis_url(const char *url)
{
    return strncmp(url, "redis://", 8) == 0 ||
           strncmp(url, "redis-cluster://", 16) == 0;
}

static int serve_check(qg_server *s, qg_rules **rules, char *host,
                       size_t hostcap, int *port, long *nofile)
{
    char err[1024];
    int workers = s->opts.workers > 0 ? s->opts.workers : 2;
    if (parse_listen(s->opts.listen, host, hostcap, port) != 0) {
        fprintf(stderr, "quotagate: --listen %s: expected HOST:PORT\n",
                s->opts.listen);
        return 2;
    }
    if (s->opts.store_url && strcmp(s->opts.store_url, "memory") != 0 &&
        !is_redis_url(s->opts.store_url)) {
        fprintf(stderr, "quotagate: --store %s: expected memory, "
                "redis://HOST:PORT[/DB] or redis-cluster://HOST:PORT[,HOST:PORT...]\n",
                s->opts.store_url);
        return 2;
    }
    if (s->opts.ledger_cache_mb && s->opts.ledger_url &&
        qg__ledger_url_is_pg(s->opts.ledger_url)) {
        fprintf(stderr, "quotagate: --ledger-cache sizes the SQLite "
                "ledger's page cache; a PostgreSQL ledger has none here\n");
        return 2;
    }
    if (!*rules &&
        qg_rules_load(s->opts.rules_path, rules, err, sizeof err) != QG_OK) {
        fprintf(stderr, "quotagate: %s\n", err);
        return 2;
    }
    if (!qg_rules_at(*rules, qg__clock_ms(CLOCK_REALTIME))) {
        /* a version is never enforced early: nothing could decide */
        char when[40];
        qg_iso8601_format(qg_rules_effective_ms(*rules), when, sizeof when);
        fprintf(stderr, "quotagate: %s: no rules version is in force now: "
                "the first, \"%s\", takes effect at %s (keep the version in "
                "force as the file's first document)\n", s->opts.rules_path,
                qg_rules_version(*rules), when);
        return 2;
    }
    *nofile = raise_nofile();
    if (s->opts.max_connections > qg__http_fd_budget(workers)) {
        fprintf(stderr, "quotagate: --max-connections %d: only %d file "
                "descriptors are left for connections (ulimit -n %ld, less "
                "64 + 4 per worker for the ledger, logs and event loops); "
                "raise the hard limit (ulimit -Hn, LimitNOFILE=)\n",
                s->opts.max_connections, qg__http_fd_budget(workers),
                *nofile);
        return 2;
    }
    return 0;
}

/* Notifications (notify.h): the webhooks' secrets from the environment
 * (a missing one fails the start), then the recorder and the sender.
 * The sender's leases are named after this host and --data, the same
 * across restarts, so that a restart after kill -9 takes back at once
 * what the killed process held.  0, or -1 with a message. */
static int serve_notify(qg_server *s)
{
    char err[1024], host[256] = "", dir[4096], owner[1300];
    qg__notify_cfg cfg;
    int rc = 0;
    if (qg__notify_cfg_load(qg_engine_rules(s->engine), &cfg, err,
                            sizeof err) != 0) {
        fprintf(stderr, "quotagate: notifications: %s\n", err);
        return -1;
    }
    gethostname(host, sizeof host - 1);
    if (!realpath(s->opts.data_dir, dir))
        snprintf(dir, sizeof dir, "%s", s->opts.data_dir);
    snprintf(owner, sizeof owner, "%.255s:%.1000s", host, dir);
    if (!(s->notify = qg__notify_new(s, &cfg, owner, err, sizeof err))) {
        fprintf(stderr, "quotagate: notifications: %s\n", err);
        rc = -1;
    }
    OPENSSL_cleanse(&cfg, sizeof cfg);
    return rc;
}

/* The ledger, the keys, the store, the engine (which takes *rules), the
 * metrics, the proxy and notifications.  0, or -1 with a message. */
static int serve_open(qg_server *s, qg_rules **rules, char *url,
                      size_t urlcap)
{
    char err[1024];
    qg_ledger_opts lo;
    qg_memory_opts mo = {.max_reservations = s->opts.request_ids,
                         .prefault = 1};
    const char *t = getenv("QUOTAGATE_UPSTREAM_TIMEOUT_MS"), *k;

    char spool[1100];

    /* --data holds the SQLite ledger, or a shared ledger's spool */
    if (mkdir_p(s->opts.data_dir) != 0) {
        fprintf(stderr, "quotagate: cannot create %s: %s\n",
                s->opts.data_dir, strerror(errno));
        return -1;
    }
    if (!s->opts.ledger_url) {
        snprintf(url, urlcap, "sqlite:%s/ledger.db", s->opts.data_dir);
        s->opts.ledger_url = url;
    }
    snprintf(spool, sizeof spool, "%s/spool", s->opts.data_dir);
    memset(&lo, 0, sizeof lo);
    lo.spool_dir = spool;
    lo.sync = s->opts.ledger_async ? QG_LEDGER_ASYNC : QG_LEDGER_DURABLE;
    lo.flush_ms = s->opts.ledger_flush_ms;
    lo.log = ledger_log;
    lo.id_filter = 1;            /* every new request id is looked up */
    lo.cache_kb = s->opts.ledger_cache_mb * 1024;
    qg__ledger_process_init();   /* no thread has used SQLite yet */
    if (!(s->ledger = qg__ledger_open(s->opts.ledger_url, &lo, err,
                                      sizeof err))) {
        fprintf(stderr, "quotagate: ledger: %s\n", err);
        return -1;
    }
    if (!(s->pace = qg__pace_new())) {
        fprintf(stderr, "quotagate: out of memory\n");
        return -1;
    }
    if (!(s->auth = qg__auth_new(s->ledger, getenv("QUOTAGATE_ADMIN_KEY"),
                                 getenv("QUOTAGATE_SERVICE_KEY"))) ||
        qg__auth_bootstrap(s->auth, qg__server_now(s), stdout) != QG_OK) {
        fprintf(stderr, "quotagate: cannot set up the API keys\n");
        return -1;
    }
    if (s->opts.store_url && is_redis_url(s->opts.store_url)) {
        /* the password from the environment, never argv */
        qg_redis_opts ro = {.rules = *rules, .server_time = 1,
                            .timeout_ms = (int)(*rules)->store.timeout_ms};
        if (!(s->store = qg_store_redis_new(s->opts.store_url, &ro, err,
                                            sizeof err))) {
            fprintf(stderr, "quotagate: --store %s: %s\n", s->opts.store_url,
                    err);
            return -1;
        }
    } else if (!(s->store = qg_store_memory_new(&mo))) {
        fprintf(stderr, "quotagate: out of memory\n");
        return -1;
    }
    if (!(s->engine = qg_engine_new(*rules, s->store)) ||
        !(s->metrics = qg__metrics_new(*rules))) {
        fprintf(stderr, "quotagate: out of memory\n");
        return -1;
    }
    *rules = NULL;               /* the engine owns them */
    if ((qg_store_flags(s->store) & QG_STORE_SHARED) &&
        (qg_engine_fallback_enable(s->engine, 0) != QG_OK ||
         !(s->keeper = qg__keeper_new(s)))) {
        fprintf(stderr, "quotagate: cannot start the store's keeper\n");
        return -1;
    }
    s->nlanes = s->opts.workers > 0 ? s->opts.workers : 2;
    if (!(s->lanes = calloc((size_t)s->nlanes, sizeof *s->lanes)) ||
        !(s->lane_failed = calloc((size_t)s->nlanes, 1))) {
        fprintf(stderr, "quotagate: out of memory\n");
        return -1;
    }
    if ((k = getenv("QUOTAGATE_UPSTREAM_KEY")) && !(s->upstream_key =
                                                        strdup(k))) {
        fprintf(stderr, "quotagate: out of memory\n");
        return -1;
    }
    if (!(s->proxy = qg__proxy_new(s->opts.workers > 0 ? s->opts.workers : 2,
                                   s->opts.upstream, t ? atoi(t) : 0,
                                   getenv("QUOTAGATE_UPSTREAM_CA"), err,
                                   sizeof err))) {
        fprintf(stderr, "quotagate: --upstream: %s\n", err);
        return -1;
    }
    return serve_notify(s);
}

/* Subjects created through the admin API, then every window rebuilt from
 * the ledger rows inside the rules' reach.  0, or -1 with a message. */
static int serve_rebuild(qg_server *s)
{
    const char *what = "the subjects created through the admin API";
    int lrc = qg__ledger_scan_subjects(s->ledger, put_subject, s);
    /* a shared store holds the counters of every instance: replaying this
     * instance's ledger into it would charge everything twice */
    if (lrc == QG_OK && !(qg_store_flags(s->store) & QG_STORE_SHARED)) {
        what = "the request rows to rebuild the counters";
        lrc = rebuild(s);
    }
    if (lrc != QG_OK) {
        qg_ledger_stats ls;
        qg__ledger_stats_get(s->ledger, &ls);
        fprintf(stderr, "quotagate: ledger %s: cannot read %s: %s; "
                "nothing is served on a ledger that cannot be read "
                "(docs/operations.md, \"A damaged ledger\")\n",
                s->opts.ledger_url, what,
                ls.last_read_error[0] ? ls.last_read_error
                                      : qg_strerror(lrc));
        return -1;
    }
    fprintf(stdout, "quotagate: rebuilt counters from %llu ledger rows in "
            "%lld ms\n", (unsigned long long)s->rebuild_rows,
            (long long)s->rebuild_ms);
    return 0;
}

/* Bind the HTTP server and start the reloader.  0, or -1 with a message. */
static int serve_listen(qg_server *s, const char *host, int port)
{
    char err[1024];
    qg_http_opts ho;
    memset(&ho, 0, sizeof ho);
    ho.host = host;
    ho.port = port;
    ho.workers = s->opts.workers;
    ho.header_timeout_ms = s->opts.header_timeout_ms;
    ho.idle_timeout_ms = s->opts.idle_timeout_ms;
    ho.min_body_rate = s->opts.min_body_rate;
    ho.max_connections = s->opts.max_connections;
    ho.max_conns_per_client = s->opts.max_conns_per_client;
    ho.max_body_bytes = s->opts.max_body_bytes;
    if (!(s->http = qg__http_server_new(&ho, qg__server_handle, s, err,
                                        sizeof err))) {
        fprintf(stderr, "quotagate: listen %s: %s\n", s->opts.listen, err);
        return -1;
    }
    if (!(s->reloader = qg__reloader_new(s))) {
        fprintf(stderr, "quotagate: cannot start the reloader thread\n");
        return -1;
    }
    if (qg__ledger_shared(s->ledger) && !(s->watcher = qg__watcher_new(s))) {
        fprintf(stderr, "quotagate: cannot start the subjects' watcher\n");
        return -1;
    }
    if (!(s->reconciler = qg__reconciler_new(s))) {
        fprintf(stderr, "quotagate: cannot start the reconciler thread\n");
        return -1;
    }
    return 0;
}

/* What was started, on stdout; the last line says where it listens. */
static void serve_banner(qg_server *s, const char *host, long nofile)
{
    qg_http_stats hs;
    char per[32];
    int port = qg__http_server_port(s->http);
    qg__http_server_stats(s->http, &hs);
    if (hs.max_conns_per_client)
        snprintf(per, sizeof per, "%llu",
                 (unsigned long long)hs.max_conns_per_client);
    else
        snprintf(per, sizeof per, "no limit");
    fprintf(stdout, "quotagate: connections: at most %llu, %s per client "
            "address (ulimit -n %ld)\n",
            (unsigned long long)hs.max_connections, per, nofile);
    fprintf(stdout,
            "quotagate: rules %s (version %s), ledger %s, store %s\n"
            "quotagate: try: curl -s -X POST http://%s:%d/v1/check "
            "-H \"Authorization: Bearer $QUOTAGATE_SERVICE_KEY\" "
            "-d '{\"subject\":\"bob\",\"request_id\":\"r1\",\"weight\":1}'\n"
            "quotagate: listening on http://%s:%d\n",
            s->opts.rules_path,
            qg_rules_version(qg_engine_rules_at(s->engine, qg__server_now(s))),
            s->opts.ledger_url,
            s->opts.store_url ? s->opts.store_url : "memory", host, port,
            host, port);
    fflush(stdout);
}

/* Everything serve_open and serve_listen made, in reverse order, after
 * the HTTP server stopped (or never ran). */
static void serve_close(qg_server *s)
{
    qg__reloader_free(s->reloader);     /* after run: no request comes */
    qg__watcher_free(s->watcher);
    /* The lanes next (and before the loops they were made on go): a
     * decision still waiting on the store ends as the lane closes, and its
     * completion admits or refuses through the keeper, the proxy, the
     * request-id table and the ledger, which must all still be there. */
    for (int i = 0; s->lanes && i < s->nlanes; i++)
        qg_store_lane_free(s->store, s->lanes[i]);
    free(s->lanes);
    free(s->lane_failed);
    qg__reconciler_free(s->reconciler); /* before the engine and ledger */
    qg__keeper_free(s->keeper);
    /* Drain the ledger next: settles still in its queue are answered (or
     * dropped with their connections) before the HTTP server goes. */
    qg__proxy_free(s->proxy);           /* ends calls in flight (settled) */
    free(s->upstream_key);
    qg__notify_free(s->notify);         /* before the ledger it writes */
    qg__ledger_close(s->ledger);
    qg__http_server_free(s->http);
    qg__metrics_free(s->metrics);
    qg_engine_free(s->engine);
    qg_store_free(s->store);
    qg__auth_free(s->auth);
    qg__pace_free(s->pace);
}

int qg_serve(const qg_serve_opts *opts)
{
    qg_server s;
    qg_rules *rules = opts->rules;
    char host[256], url[1100];
    sigctx sc;
    pthread_t sigth;
    long nofile = -1;
    int port, rc;

    memset(&s, 0, sizeof s);
    s.opts = *opts;
    s.wall0_ms = qg__clock_ms(CLOCK_REALTIME);
    s.mono0_ms = qg__clock_ms(CLOCK_MONOTONIC);
    if (!s.opts.listen)
        s.opts.listen = "127.0.0.1:8080";
    if (!s.opts.data_dir)
        s.opts.data_dir = "./var";
    if ((rc = serve_check(&s, &rules, host, sizeof host, &port, &nofile))) {
        qg_rules_free(rules);
        return rc;
    }
    pthread_mutex_init(&s.reload_mu, NULL);
    pthread_mutex_init(&s.reconcile_mu, NULL);
    /* Signals go to the signal thread only: block them before any thread
     * starts (threads inherit the mask). */
    sigemptyset(&sc.set);
    sigaddset(&sc.set, SIGTERM);
    sigaddset(&sc.set, SIGINT);
    sigaddset(&sc.set, SIGHUP);
    sigaddset(&sc.set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sc.set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* a file size limit (ulimit -f) reached is an error to report (the
     * spool that cannot grow: 503 ledger_unavailable), not a death */
    signal(SIGXFSZ, SIG_IGN);
    sc.s = &s;
    rc = 1;
    if (serve_open(&s, &rules, url, sizeof url) == 0 &&
        serve_rebuild(&s) == 0 && serve_listen(&s, host, port) == 0 &&
        pthread_create(&sigth, NULL, signal_thread, &sc) == 0) {
        serve_banner(&s, host, nofile);
        rc = qg__http_server_run(s.http) == 0 ? 0 : 1;
        pthread_kill(sigth, SIGUSR2);
        pthread_join(sigth, NULL);
    }
    serve_close(&s);
    qg_rules_free(rules);
    pthread_mutex_destroy(&s.reload_mu);
    pthread_mutex_destroy(&s.reconcile_mu);
    if (rc == 0)
        fprintf(stderr, "quotagate: stopped cleanly\n");
    return rc;
}
