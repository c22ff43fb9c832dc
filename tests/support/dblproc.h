/* dblproc.h - run the upstream double ($QG_UPSTREAM_BIN,
 * tests/upstream/upstream_double.c) as a child process on a free port of
 * 127.0.0.1, for tests that put the proxy in front of it.  Only fork,
 * execv, a pipe and waitpid; every wait is bounded. */
#ifndef QG_TEST_DBLPROC_H
#define QG_TEST_DBLPROC_H

#include <sys/types.h>

typedef struct dblproc {
    pid_t pid;                 /* 0 when not running */
    int port;                  /* its port, 0 when not running */
} dblproc;

/* Start bin --listen 127.0.0.1:0 and read its listening line (10 s at
 * most).  Returns 0, or -1 (the child, if any, is stopped). */
int dblproc_start(dblproc *d, const char *bin);
/* SIGTERM and reap (no-op when not running). */
void dblproc_stop(dblproc *d);

#endif
