/* redisproc.h - real redis-server processes for tests: one server on a
 * free port of 127.0.0.1 in a temporary folder, without persistence
 * (--save '' --appendonly no), started and stopped by the test itself;
 * and a local Redis Cluster of three masters made with
 * `redis-cli --cluster create`, for the Cluster routing tests.
 *
 * The server is found as $QG_REDIS_SERVER, else redis-server on PATH or in
 * /usr/bin (Debian's redis-server package; make test installs it).  A
 * child dies with the test (PR_SET_PDEATHSIG), and every wait is bounded. */
#ifndef QG_TEST_REDISPROC_H
#define QG_TEST_REDISPROC_H

#include <sys/types.h>

#define REDISPROC_EXTRA 16
typedef struct redisproc {
    pid_t pid;                 /* 0 when not running */
    int port;                  /* its port, 0 when not running */
    char dir[256];             /* its folder (removed by stop) */
    char why[256];             /* what failed */
    int bus;                   /* a Cluster node (port + 10000 too) */
    int nextra;                /* its extra arguments, for a restart */
    char extra[REDISPROC_EXTRA][64];
} redisproc;

/* The redis-server binary, or NULL when there is none. */
const char *redisproc_binary(void);

/* Start a server (with extra "--name value" arguments, NULL-terminated,
 * may be none) and wait until it answers PING (10 s at most).  Returns
 * 0, or -1 with the reason in r->why (nothing left running). */
int redisproc_start(redisproc *r, ...);
/* SIGTERM, reap, remove the folder (no-op when not running). */
void redisproc_stop(redisproc *r);
/* SIGKILL and reap, keeping its port and folder for redisproc_restart
 * (a crash: nothing is saved). */
void redisproc_kill(redisproc *r);
/* Start it again on the same port, folder and arguments after
 * redisproc_kill (a Cluster node finds its nodes.conf there).  0 or -1. */
int redisproc_restart(redisproc *r);
/* "redis://127.0.0.1:PORT" in a static buffer. */
const char *redisproc_url(const redisproc *r);
/* Run one command (argv-style, NULL-terminated) on the server and copy
 * its reply as text into out (integers in decimal, arrays joined with
 * newlines).  Returns 0, or -1 when the server could not be reached. */
int redisproc_cmd(const redisproc *r, char *out, size_t cap, ...);

#define REDISCLUSTER_NODES 3          /* masters of rediscluster_start */
#define REDISCLUSTER_MAX 6            /* nodes of any cluster here */
typedef struct rediscluster {
    redisproc node[REDISCLUSTER_MAX]; /* masters first, then replicas */
    int n;                            /* nodes started */
    char why[256];
} rediscluster;

/* Three masters on free ports P with P + 10000 free too (the bus),
 * joined with redis-cli --cluster create and ready (cluster_state:ok on
 * every node, 20 s at most).  Returns 0 or -1 with c->why. */
int rediscluster_start(rediscluster *c);
/* The same with `replicas` replicas per master (masters * (1 + replicas)
 * <= REDISCLUSTER_MAX), --cluster-node-timeout node_timeout_ms, and
 * --cluster-require-full-coverage no when partial (the other masters
 * keep serving while one is down).  Ready when every node says
 * cluster_state:ok and every replica has its master. */
int rediscluster_start_opts(rediscluster *c, int masters, int replicas,
                            int node_timeout_ms, int partial);
void rediscluster_stop(rediscluster *c);

#endif
