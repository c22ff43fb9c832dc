/* redisproc.c - redis-server processes for tests (redisproc.h). */
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <hiredis/hiredis.h>
#include "redisproc.h"

#define MAX_ARGS 48

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int executable(const char *p) { return access(p, X_OK) == 0; }

const char *redisproc_binary(void)
{
    static char found[512];
    const char *env = getenv("QG_REDIS_SERVER"), *path = getenv("PATH");
    if (env && *env)
        return executable(env) ? env : NULL;
    while (path && *path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        if (n && n < sizeof found - 16) {
            snprintf(found, sizeof found, "%.*s/redis-server", (int)n, path);
            if (executable(found))
                return found;
        }
        path = c ? c + 1 : NULL;
    }
    snprintf(found, sizeof found, "/usr/bin/redis-server");
    return executable(found) ? found : NULL;
}

/* redis-cli next to redis-server. */
static const char *cli_binary(void)
{
    static char cli[512];
    const char *srv = redisproc_binary();
    const char *slash = srv ? strrchr(srv, '/') : NULL;
    if (!slash)
        return NULL;
    snprintf(cli, sizeof cli, "%.*s/redis-cli", (int)(slash - srv), srv);
    return executable(cli) ? cli : NULL;
}

static int port_free(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    if (fd < 0)
        return 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((unsigned short)port);
    ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A free port; with bus, one below 55536 whose port + 10000 is free. */
static int pick_port(int bus)
{
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)now_ms();
    for (int i = 0; i < 2000; i++) {
        int p;
        seed = seed * 1103515245u + 12345u;
        p = 20000 + (int)((seed >> 8) % 35000);
        if (port_free(p) && (!bus || port_free(p + 10000)))
            return p;
    }
    return -1;
}

static int rm_entry(const char *p, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static redisContext *connect_to(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c)
        redisSetTimeout(c, tv);
    return c;
}

static int ping(int port)
{
    redisContext *c = connect_to(port);
    redisReply *r;
    int ok = 0;
    if (!c)
        return 0;
    if ((r = redisCommand(c, "PING"))) {
        /* a server with --requirepass answers too, with NOAUTH */
        ok = (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0) ||
             (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0);
        freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

/* Start redis-server on r->port in r->dir with r's extra arguments and
 * wait for PING; -1 with r->why (the caller cleans up). */
static int spawn(redisproc *r)
{
    const char *bin = redisproc_binary();
    char port[16], log[300];
    char *argv[MAX_ARGS];
    int n = 0;
    long long t0;

    if (!bin) {
        snprintf(r->why, sizeof r->why, "redis-server not found");
        return -1;
    }
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(log, sizeof log, "%s/redis.log", r->dir);
    argv[n++] = (char *)bin;
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--dir";
    argv[n++] = r->dir;
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    for (int i = 0; i < r->nextra && n < MAX_ARGS - 1; i++)
        argv[n++] = r->extra[i];
    argv[n] = NULL;
    if ((r->pid = fork()) < 0) {
        r->pid = 0;
        snprintf(r->why, sizeof r->why, "fork: %s", strerror(errno));
        return -1;
    }
    if (r->pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(bin, argv);
        _exit(127);
    }
    t0 = now_ms();
    while (now_ms() - t0 < 10000) {
        int st;
        if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
            r->pid = 0;
            snprintf(r->why, sizeof r->why, "redis-server exited (see %.200s)", log);
            return -1;
        }
        if (ping(r->port))
            return 0;
        sleep_ms(20);
    }
    snprintf(r->why, sizeof r->why, "redis-server did not answer PING");
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
    return -1;
}

static int start_args(redisproc *r, int bus, char **extra, int nextra)
{
    memset(r, 0, sizeof *r);
    r->bus = bus;
    if (!redisproc_binary()) {
        snprintf(r->why, sizeof r->why, "redis-server not found");
        return -1;
    }
    for (int i = 0; i < nextra && i < REDISPROC_EXTRA; i++) {
        if (strlen(extra[i]) >= sizeof r->extra[0]) {
            snprintf(r->why, sizeof r->why, "argument too long: %.60s", extra[i]);
            return -1;
        }
        snprintf(r->extra[i], sizeof r->extra[i], "%s", extra[i]);
        r->nextra = i + 1;
    }
    snprintf(r->dir, sizeof r->dir, "/tmp/qgredis.XXXXXX");
    if (!mkdtemp(r->dir)) {
        snprintf(r->why, sizeof r->why, "mkdtemp: %s", strerror(errno));
        r->dir[0] = 0;
        return -1;
    }
    if ((r->port = pick_port(bus)) < 0) {
        snprintf(r->why, sizeof r->why, "no free port");
        redisproc_stop(r);
        return -1;
    }
    if (spawn(r) != 0) {
        char why[256];
        memcpy(why, r->why, sizeof why);
        redisproc_stop(r);
        memcpy(r->why, why, sizeof why);
        return -1;
    }
    return 0;
}

void redisproc_kill(redisproc *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
    }
    r->pid = 0;
}

int redisproc_restart(redisproc *r)
{
    if (r->pid > 0 || !r->port || !r->dir[0]) {
        snprintf(r->why, sizeof r->why, "not a killed server");
        return -1;
    }
    return spawn(r);
}

int redisproc_start(redisproc *r, ...)
{
    char *extra[REDISPROC_EXTRA];
    int n = 0;
    va_list ap;
    va_start(ap, r);
    for (char *a; (a = va_arg(ap, char *)) != NULL && n < REDISPROC_EXTRA;)
        extra[n++] = a;
    va_end(ap);
    return start_args(r, 0, extra, n);
}

void redisproc_stop(redisproc *r)
{
    if (r->pid > 0) {
        int st;
        long long t0 = now_ms();
        kill(r->pid, SIGTERM);
        while (waitpid(r->pid, &st, WNOHANG) == 0) {
            if (now_ms() - t0 > 5000) {
                kill(r->pid, SIGKILL);
                waitpid(r->pid, &st, 0);
                break;
            }
            sleep_ms(10);
        }
    }
    r->pid = 0;
    r->port = 0;
    if (r->dir[0] && !getenv("QG_KEEP_TMP"))
        nftw(r->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    r->dir[0] = 0;
}

const char *redisproc_url(const redisproc *r)
{
    static char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", r->port);
    return url;
}

static void reply_text(const redisReply *r, char *out, size_t cap)
{
    size_t len = strlen(out);
    if (len >= cap - 1)
        return;
    switch (r->type) {
    case REDIS_REPLY_INTEGER:
        snprintf(out + len, cap - len, "%lld", r->integer);
        break;
    case REDIS_REPLY_NIL:
        snprintf(out + len, cap - len, "(nil)");
        break;
    case REDIS_REPLY_ARRAY:
        for (size_t i = 0; i < r->elements; i++) {
            if (i)
                snprintf(out + strlen(out), cap - strlen(out), "\n");
            reply_text(r->element[i], out, cap);
        }
        break;
    default:
        snprintf(out + len, cap - len, "%.*s", (int)r->len, r->str);
        break;
    }
}

int redisproc_cmd(const redisproc *r, char *out, size_t cap, ...)
{
    const char *argv[MAX_ARGS];
    int n = 0;
    va_list ap;
    redisContext *c;
    redisReply *rep;
    va_start(ap, cap);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && n < MAX_ARGS;)
        argv[n++] = a;
    va_end(ap);
    if (out && cap)
        out[0] = 0;
    if (!(c = connect_to(r->port)))
        return -1;
    rep = redisCommandArgv(c, n, argv, NULL);
    redisFree(c);
    if (!rep)
        return -1;
    if (out && cap)
        reply_text(rep, out, cap);
    freeReplyObject(rep);
    return 0;
}

/* ------------------------------------------------------------ cluster */

static int cluster_ok(int port)
{
    char buf[2048];
    redisproc tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.port = port;
    return redisproc_cmd(&tmp, buf, sizeof buf, "CLUSTER", "INFO", NULL) == 0 &&
           strstr(buf, "cluster_state:ok") != NULL;
}

/* ROLE's first word on a node: "master", "slave", or "" */
static void role_of(int port, char *out, size_t cap)
{
    redisproc tmp;
    char buf[1024];
    memset(&tmp, 0, sizeof tmp);
    tmp.port = port;
    out[0] = 0;
    if (redisproc_cmd(&tmp, buf, sizeof buf, "ROLE", NULL) == 0)
        snprintf(out, cap, "%.*s", (int)strcspn(buf, "\n"), buf);
}

static int replica_synced(int port)
{
    char buf[4096];
    redisproc tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.port = port;
    return redisproc_cmd(&tmp, buf, sizeof buf, "INFO", "replication", NULL) == 0 &&
           strstr(buf, "master_link_status:up") != NULL;
}

int rediscluster_start_opts(rediscluster *c, int masters, int replicas,
                            int node_timeout_ms, int partial)
{
    const char *cli = cli_binary();
    char addr[REDISCLUSTER_MAX][32], timeout[16], nrep[16];
    char *extra[] = {"--cluster-enabled", "yes", "--cluster-config-file",
                     "nodes.conf", "--cluster-node-timeout", timeout,
                     "--cluster-require-full-coverage", "no"};
    int total = masters * (1 + replicas);
    pid_t pid;
    int st;
    long long t0;

    memset(c, 0, sizeof *c);
    if (masters < 3 || replicas < 0 || total > REDISCLUSTER_MAX) {
        snprintf(c->why, sizeof c->why, "3 to %d nodes, at least 3 masters",
                 REDISCLUSTER_MAX);
        return -1;
    }
    if (!cli) {
        snprintf(c->why, sizeof c->why, "redis-cli not found");
        return -1;
    }
    snprintf(timeout, sizeof timeout, "%d", node_timeout_ms);
    snprintf(nrep, sizeof nrep, "%d", replicas);
    for (int i = 0; i < total; i++) {
        if (start_args(&c->node[i], 1, extra, partial ? 8 : 6) != 0) {
            snprintf(c->why, sizeof c->why, "node %d: %s", i, c->node[i].why);
            rediscluster_stop(c);
            return -1;
        }
        c->n = i + 1;
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", c->node[i].port);
    }
    if ((pid = fork()) < 0) {
        snprintf(c->why, sizeof c->why, "fork: %s", strerror(errno));
        rediscluster_stop(c);
        return -1;
    }
    if (pid == 0) {
        char *argv[REDISCLUSTER_MAX + 8];
        int n = 0, fd = open("/dev/null", O_WRONLY);
        argv[n++] = (char *)cli;
        argv[n++] = "--cluster";
        argv[n++] = "create";
        for (int i = 0; i < total; i++)
            argv[n++] = addr[i];
        argv[n++] = "--cluster-replicas";
        argv[n++] = nrep;
        argv[n++] = "--cluster-yes";
        argv[n] = NULL;
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(cli, argv);
        _exit(127);
    }
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
        snprintf(c->why, sizeof c->why, "redis-cli --cluster create failed");
        rediscluster_stop(c);
        return -1;
    }
    t0 = now_ms();
    while (now_ms() - t0 < 30000) {
        int ok = 1;
        for (int i = 0; i < total && ok; i++)
            ok = cluster_ok(c->node[i].port);
        for (int i = 0; i < total && ok; i++) {
            char role[32];
            role_of(c->node[i].port, role, sizeof role);
            ok = strcmp(role, "master") == 0 ||
                 (strcmp(role, "slave") == 0 && replica_synced(c->node[i].port));
        }
        if (ok) {
            /* masters first: redis-cli chose which are which */
            for (int i = 0, m = 0; i < total; i++) {
                char role[32];
                role_of(c->node[i].port, role, sizeof role);
                if (strcmp(role, "master") == 0) {
                    redisproc t = c->node[m];
                    c->node[m] = c->node[i];
                    c->node[i] = t;
                    m++;
                }
            }
            return 0;
        }
        sleep_ms(50);
    }
    snprintf(c->why, sizeof c->why, "the cluster did not reach cluster_state:ok");
    rediscluster_stop(c);
    return -1;
}

int rediscluster_start(rediscluster *c)
{
    return rediscluster_start_opts(c, REDISCLUSTER_NODES, 0, 2000, 0);
}

void rediscluster_stop(rediscluster *c)
{
    for (int i = 0; i < REDISCLUSTER_MAX; i++)
        redisproc_stop(&c->node[i]);
    c->n = 0;
}
