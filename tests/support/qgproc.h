/* qgproc.h - run `quotagate serve` as a child process for end-to-end tests.
 *
 * A qgproc owns a fresh temporary directory (mkdtemp under /tmp):
 *   BASE/data        the server's --data directory (kept across restarts)
 *   BASE/stderr.log  the server's stderr, appended across restarts
 *   BASE/stdout.log  the server's stdout after the listening line
 * Files the test wants next to it (rules copies, ...) go in BASE too
 * (qgproc_path).
 *
 * qgproc_start runs `$QG_BIN serve -c RULES --listen 127.0.0.1:0 --data
 * BASE/data [extra args...]` with QUOTAGATE_ADMIN_KEY and
 * QUOTAGATE_SERVICE_KEY set (plus any extra environment), reads its stdout
 * until the line "quotagate: listening on http://127.0.0.1:PORT" (at most
 * 20 s) and records PORT.  On failure (the process exits, or the timeout
 * passes) the process is killed, its stderr is dumped to our stderr, and
 * -1 is returned with the reason in p->why.  Only fork, execve, pipes and
 * waitpid are used (no shell).
 *
 * Not thread-safe: one thread drives a qgproc (other threads may read
 * qgproc_port()). */
#ifndef QG_TEST_QGPROC_H
#define QG_TEST_QGPROC_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#define QGPROC_ADMIN_KEY   "qg-test-admin-key-0123456789"
#define QGPROC_SERVICE_KEY "qg-test-service-key-0123456789"
#define QGPROC_MAX_ARGS 32

typedef struct qgproc {
    char base[256];            /* the temporary directory */
    char data[300];            /* BASE/data */
    char rules[1024];          /* path given with -c */
    char *args[QGPROC_MAX_ARGS]; /* extra serve arguments (copies) */
    int nargs;
    char *env[QGPROC_MAX_ARGS];  /* extra "NAME=value" (copies) */
    int nenv;
    pid_t pid;                 /* 0 when not running */
    _Atomic int port;          /* bound port, 0 when not running */
    int out_fd;                /* read end of the stdout pipe */
    pthread_t drain;           /* copies stdout to BASE/stdout.log */
    int draining;
    int starts;                /* how many times it was started */
    char why[512];             /* why the last operation failed */
} qgproc;

/* Create the temporary directory and BASE/data.  Returns 0 or -1. */
int qgproc_init(qgproc *p);
/* BASE/name in a static rotating buffer (8 slots). */
const char *qgproc_path(const qgproc *p, const char *name);
/* Copy file src to dst.  Returns 0 or -1. */
int qgproc_copy_file(const char *src, const char *dst);
/* Write text to path (replacing it).  Returns 0 or -1. */
int qgproc_write_file(const char *path, const char *text);

/* Start the server on the rules file with the NULL-terminated extra
 * arguments (may be NULL) and extra environment "NAME=value" (may be
 * NULL).  Both are remembered for qgproc_restart.  Returns 0 when it is
 * listening, else -1 (stderr dumped, process reaped). */
int qgproc_start(qgproc *p, const char *rules, const char *const *args,
                 const char *const *env);
/* Start again with the same rules, arguments and data directory (on a
 * new port).  The server must not be running. */
int qgproc_restart(qgproc *p);

/* SIGTERM, then wait up to timeout_ms (SIGKILL after that).  Returns the
 * exit status (0..255), 128+signal when killed by a signal, or -1 when
 * it had to be killed after the timeout or was not running. */
int qgproc_stop(qgproc *p, int timeout_ms);
/* Send sig (e.g. SIGHUP) without waiting.  Returns 0 or -1. */
int qgproc_signal(qgproc *p, int sig);
/* kill -9 and reap.  Returns 0 or -1 when not running. */
int qgproc_kill9(qgproc *p);
/* Nonzero while the child is alive (reaps it if it has exited; then
 * *status, when non-NULL, gets its wait status). */
int qgproc_alive(qgproc *p, int *status);
int qgproc_port(const qgproc *p);

/* The test groups' start and stop: copy rules_src to BASE/rules.yaml and
 * start on it (p initialised); on failure print why, clean p up and
 * return -1.  finish: SIGTERM (20 s), the server's stderr printed when it
 * did not stop cleanly, then cleanup; returns 0 or -1. */
int qgproc_start_copy(qgproc *p, const char *rules_src,
                      const char *const *args, const char *const *env);
int qgproc_finish(qgproc *p);

/* Kill the server if it still runs and remove BASE recursively. */
void qgproc_cleanup(qgproc *p);
/* Print BASE/stderr.log to our stderr (for diagnosis). */
void qgproc_dump_stderr(const qgproc *p);

/* Run $QG_BIN with the NULL-terminated argv (argv[0] is the first
 * argument after the program, e.g. "keys"), wait up to timeout_ms.
 * *out and *err (each may be NULL) receive malloc'ed stdout and stderr.
 * Returns the exit status, 128+signal, or -1 (spawn failed / timeout). */
int qg_run_cli(const char *const *argv, int timeout_ms, char **out,
               char **err);

/* Milliseconds on the monotonic clock. */
long long qg_now_ms(void);

#endif
