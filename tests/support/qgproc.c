/* qgproc.c - run `quotagate serve` as a child process (see qgproc.h). */
#include "qgproc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define LISTEN_PREFIX "quotagate: listening on http://127.0.0.1:"
#define START_TIMEOUT_MS 20000

long long qg_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void why(qgproc *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void why(qgproc *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
}

int qgproc_init(qgproc *p)
{
    memset(p, 0, sizeof *p);
    p->out_fd = -1;
    snprintf(p->base, sizeof p->base, "/tmp/qgproc.XXXXXX");
    if (!mkdtemp(p->base)) {
        why(p, "mkdtemp: %s", strerror(errno));
        p->base[0] = '\0';
        return -1;
    }
    snprintf(p->data, sizeof p->data, "%s/data", p->base);
    if (mkdir(p->data, 0700) < 0) {
        why(p, "mkdir %s: %s", p->data, strerror(errno));
        return -1;
    }
    return 0;
}

const char *qgproc_path(const qgproc *p, const char *name)
{
    static char bufs[8][1400];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", p->base, name);
    return b;
}

int qgproc_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    size_t n = strlen(text);
    int rc = 0;
    if (!f)
        return -1;
    if (fwrite(text, 1, n, f) != n)
        rc = -1;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

int qgproc_copy_file(const char *src, const char *dst)
{
    char buf[8192];
    size_t n;
    int rc = 0;
    FILE *in = fopen(src, "r"), *out;
    if (!in)
        return -1;
    if (!(out = fopen(dst, "w"))) {
        fclose(in);
        return -1;
    }
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            rc = -1;
    if (ferror(in))
        rc = -1;
    fclose(in);
    if (fclose(out) != 0)
        rc = -1;
    return rc;
}

void qgproc_dump_stderr(const qgproc *p)
{
    char buf[4096];
    size_t n;
    FILE *f;
    if (!p->base[0] || !(f = fopen(qgproc_path(p, "stderr.log"), "r")))
        return;
    fprintf(stderr, "---- quotagate serve stderr (%s) ----\n",
            qgproc_path(p, "stderr.log"));
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end of stderr ----\n");
    fclose(f);
}

/* Copies the child's stdout to BASE/stdout.log until EOF (the child's
 * death closes the pipe). */
typedef struct drain_arg {
    int fd, out;
} drain_arg;

static void *drain_main(void *v)
{
    drain_arg *a = v;
    char buf[4096];
    ssize_t n;
    for (;;) {
        n = read(a->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (a->out >= 0 && write(a->out, buf, (size_t)n) < 0) {
            /* best effort */
        }
    }
    if (a->out >= 0)
        close(a->out);
    close(a->fd);
    free(a);
    return NULL;
}

static char **build_env(const qgproc *p)
{
    size_t n = 0, k = 0;
    char **envp;
    while (environ && environ[n])
        n++;
    envp = calloc(n + (size_t)p->nenv + 3, sizeof *envp);
    if (!envp)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (!strncmp(environ[i], "QUOTAGATE_ADMIN_KEY=", 20) ||
            !strncmp(environ[i], "QUOTAGATE_SERVICE_KEY=", 22))
            continue;
        envp[k++] = environ[i];
    }
    envp[k++] = (char *)"QUOTAGATE_ADMIN_KEY=" QGPROC_ADMIN_KEY;
    envp[k++] = (char *)"QUOTAGATE_SERVICE_KEY=" QGPROC_SERVICE_KEY;
    for (int i = 0; i < p->nenv; i++)
        envp[k++] = p->env[i];
    envp[k] = NULL;
    return envp;
}

static void describe_status(char *buf, size_t cap, int st)
{
    if (WIFEXITED(st))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, cap, "killed by signal %d", WTERMSIG(st));
    else
        snprintf(buf, cap, "wait status 0x%x", st);
}

static void join_drain(qgproc *p)
{
    if (p->draining) {
        pthread_join(p->drain, NULL);
        p->draining = 0;
    }
    if (p->out_fd >= 0) {
        close(p->out_fd);
        p->out_fd = -1;
    }
}

static int spawn(qgproc *p)
{
    const char *bin = getenv("QG_BIN");
    char listen_arg[] = "127.0.0.1:0";
    char *argv[QGPROC_MAX_ARGS + 16];
    char **envp;
    int pfd[2], efd, argc = 0;
    char line[2048];
    size_t have = 0;
    long long deadline;
    pid_t pid;

    if (!bin || !*bin) {
        why(p, "QG_BIN is not set (run through tests/run.sh)");
        fprintf(stderr, "qgproc: %s\n", p->why);
        return -1;
    }
    argv[argc++] = (char *)bin;
    argv[argc++] = (char *)"serve";
    argv[argc++] = (char *)"-c";
    argv[argc++] = p->rules;
    argv[argc++] = (char *)"--listen";
    argv[argc++] = listen_arg;
    argv[argc++] = (char *)"--data";
    argv[argc++] = p->data;
    for (int i = 0; i < p->nargs; i++)
        argv[argc++] = p->args[i];
    argv[argc] = NULL;

    efd = open(qgproc_path(p, "stderr.log"),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (efd < 0) {
        why(p, "open stderr.log: %s", strerror(errno));
        return -1;
    }
    {
        char hdr[256];
        int n = snprintf(hdr, sizeof hdr, "==== qgproc start #%d ====\n",
                         p->starts + 1);
        if (write(efd, hdr, (size_t)n) < 0) {
            /* best effort */
        }
    }
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        why(p, "pipe: %s", strerror(errno));
        close(efd);
        return -1;
    }
    if (!(envp = build_env(p))) {
        why(p, "out of memory");
        close(efd);
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        why(p, "fork: %s", strerror(errno));
        free(envp);
        close(efd);
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(pfd[1], 1);
        dup2(efd, 2);
        signal(SIGPIPE, SIG_DFL);
        execve(bin, argv, envp);
        dprintf(2, "qgproc: execve %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    free(envp);
    close(pfd[1]);
    close(efd);
    p->pid = pid;
    p->out_fd = pfd[0];
    p->starts++;

    /* Read stdout until the listening line. */
    deadline = qg_now_ms() + START_TIMEOUT_MS;
    for (;;) {
        struct pollfd pf = { p->out_fd, POLLIN, 0 };
        long long left = deadline - qg_now_ms();
        char *nl;
        ssize_t n;
        int st;

        /* complete lines first */
        while ((nl = memchr(line, '\n', have))) {
            *nl = '\0';
            if (!strncmp(line, LISTEN_PREFIX, strlen(LISTEN_PREFIX))) {
                int port = atoi(line + strlen(LISTEN_PREFIX));
                size_t rest = have - (size_t)(nl + 1 - line);
                int out = open(qgproc_path(p, "stdout.log"),
                               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                               0600);
                drain_arg *a;
                if (port <= 0 || port > 65535) {
                    why(p, "bad listening line: %s", line);
                    if (out >= 0)
                        close(out);
                    goto fail;
                }
                if (out >= 0 && rest && write(out, nl + 1, rest) < 0) {
                    /* best effort */
                }
                a = malloc(sizeof *a);
                if (!a) {
                    why(p, "out of memory");
                    if (out >= 0)
                        close(out);
                    goto fail;
                }
                a->fd = p->out_fd;
                a->out = out;
                if (pthread_create(&p->drain, NULL, drain_main, a) != 0) {
                    free(a);
                    if (out >= 0)
                        close(out);
                    why(p, "pthread_create failed");
                    goto fail;
                }
                p->out_fd = -1; /* the drain thread owns it now */
                p->draining = 1;
                atomic_store(&p->port, port);
                return 0;
            }
            /* some other line (e.g. a banner): skip it */
            have -= (size_t)(nl + 1 - line);
            memmove(line, nl + 1, have);
        }
        if (have == sizeof line - 1) /* an over-long line: drop it */
            have = 0;
        if (left <= 0) {
            why(p, "no listening line within %d ms", START_TIMEOUT_MS);
            goto fail;
        }
        if (poll(&pf, 1, (int)(left > 200 ? 200 : left)) < 0 &&
            errno != EINTR) {
            why(p, "poll: %s", strerror(errno));
            goto fail;
        }
        if (pf.revents) {
            n = read(p->out_fd, line + have, sizeof line - 1 - have);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                /* EOF: the child closed stdout, most likely it exited */
                int waited = 0;
                while (waited < 2000 && waitpid(pid, &st, WNOHANG) == 0) {
                    sleep_ms(10);
                    waited += 10;
                }
                if (waited < 2000) {
                    char d[64];
                    describe_status(d, sizeof d, st);
                    why(p, "serve %s before listening", d);
                    p->pid = 0;
                } else {
                    why(p, "serve closed stdout before listening");
                }
                goto fail;
            }
            have += (size_t)n;
            line[have] = '\0';
        } else if (waitpid(pid, &st, WNOHANG) == pid) {
            char d[64];
            describe_status(d, sizeof d, st);
            why(p, "serve %s before listening", d);
            p->pid = 0;
            goto fail;
        }
    }
fail:
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
    join_drain(p);
    atomic_store(&p->port, 0);
    fprintf(stderr, "qgproc: starting `%s serve -c %s ...` failed: %s\n",
            bin, p->rules, p->why);
    qgproc_dump_stderr(p);
    return -1;
}

int qgproc_start(qgproc *p, const char *rules, const char *const *args,
                 const char *const *env)
{
    if (p->pid > 0) {
        why(p, "already running");
        return -1;
    }
    snprintf(p->rules, sizeof p->rules, "%s", rules);
    for (int i = 0; i < p->nargs; i++)
        free(p->args[i]);
    for (int i = 0; i < p->nenv; i++)
        free(p->env[i]);
    p->nargs = p->nenv = 0;
    for (int i = 0; args && args[i] && p->nargs < QGPROC_MAX_ARGS; i++)
        p->args[p->nargs++] = strdup(args[i]);
    for (int i = 0; env && env[i] && p->nenv < QGPROC_MAX_ARGS; i++)
        p->env[p->nenv++] = strdup(env[i]);
    return spawn(p);
}

int qgproc_restart(qgproc *p)
{
    if (p->pid > 0) {
        why(p, "still running");
        return -1;
    }
    return spawn(p);
}

int qgproc_alive(qgproc *p, int *status)
{
    int st;
    if (p->pid <= 0)
        return 0;
    if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
        p->pid = 0;
        atomic_store(&p->port, 0);
        if (status)
            *status = st;
        join_drain(p);
        return 0;
    }
    return 1;
}

int qgproc_stop(qgproc *p, int timeout_ms)
{
    long long deadline = qg_now_ms() + timeout_ms;
    int st = 0, rc;
    if (p->pid <= 0) {
        why(p, "not running");
        return -1;
    }
    kill(p->pid, SIGTERM);
    for (;;) {
        pid_t w = waitpid(p->pid, &st, WNOHANG);
        if (w == p->pid)
            break;
        if (w < 0 && errno != EINTR) {
            why(p, "waitpid: %s", strerror(errno));
            p->pid = 0;
            atomic_store(&p->port, 0);
            join_drain(p);
            return -1;
        }
        if (qg_now_ms() >= deadline) {
            why(p, "serve did not exit within %d ms of SIGTERM; killed",
                timeout_ms);
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            p->pid = 0;
            atomic_store(&p->port, 0);
            join_drain(p);
            return -1;
        }
        sleep_ms(5);
    }
    p->pid = 0;
    atomic_store(&p->port, 0);
    join_drain(p);
    if (WIFEXITED(st))
        rc = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
        rc = 128 + WTERMSIG(st);
    else
        rc = -1;
    if (rc != 0) {
        char d[64];
        describe_status(d, sizeof d, st);
        why(p, "serve %s after SIGTERM", d);
    }
    return rc;
}

int qgproc_signal(qgproc *p, int sig)
{
    if (p->pid <= 0)
        return -1;
    return kill(p->pid, sig);
}

int qgproc_kill9(qgproc *p)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGKILL);
    while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    p->pid = 0;
    atomic_store(&p->port, 0);
    join_drain(p);
    return 0;
}

int qgproc_port(const qgproc *p)
{
    return atomic_load(&((qgproc *)p)->port);
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

int qgproc_start_copy(qgproc *p, const char *rules_src,
                      const char *const *args, const char *const *env)
{
    if (qgproc_copy_file(rules_src, qgproc_path(p, "rules.yaml")) < 0 ||
        qgproc_start(p, qgproc_path(p, "rules.yaml"), args, env) < 0) {
        fprintf(stderr, "cannot start the server on %s: %s\n", rules_src,
                p->why);
        qgproc_cleanup(p);
        return -1;
    }
    return 0;
}

int qgproc_finish(qgproc *p)
{
    int rc = 0;
    if (p->pid > 0 && qgproc_stop(p, 20000) != 0) {
        fprintf(stderr, "server: SIGTERM failed (%s)\n", p->why);
        qgproc_dump_stderr(p);
        rc = -1;
    }
    qgproc_cleanup(p);
    return rc;
}

void qgproc_cleanup(qgproc *p)
{
    if (p->pid > 0)
        qgproc_kill9(p);
    join_drain(p);
    for (int i = 0; i < p->nargs; i++)
        free(p->args[i]);
    for (int i = 0; i < p->nenv; i++)
        free(p->env[i]);
    p->nargs = p->nenv = 0;
    if (p->base[0] && getenv("QG_KEEP_TMP") == NULL)
        nftw(p->base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    p->base[0] = '\0';
}

/* ------------------------------------------------------------- the CLI */

static char *slurp(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    if (!buf)
        return NULL;
    lseek(fd, 0, SEEK_SET);
    while ((n = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
    }
    buf[len] = '\0';
    return buf;
}

int qg_run_cli(const char *const *args, int timeout_ms, char **out,
               char **err)
{
    const char *bin = getenv("QG_BIN");
    char op[] = "/tmp/qgcli.out.XXXXXX", ep[] = "/tmp/qgcli.err.XXXXXX";
    char *argv[64];
    int argc = 0, ofd, efd, st = 0, rc;
    long long deadline = qg_now_ms() + timeout_ms;
    pid_t pid;

    if (out)
        *out = NULL;
    if (err)
        *err = NULL;
    if (!bin)
        return -1;
    argv[argc++] = (char *)bin;
    for (int i = 0; args[i] && argc < 63; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    ofd = mkostemp(op, O_CLOEXEC);
    efd = mkostemp(ep, O_CLOEXEC);
    if (ofd < 0 || efd < 0) {
        if (ofd >= 0)
            close(ofd);
        if (efd >= 0)
            close(efd);
        return -1;
    }
    unlink(op);
    unlink(ep);
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        close(ofd);
        close(efd);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(ofd, 1);
        dup2(efd, 2);
        execv(bin, argv);
        _exit(127);
    }
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (qg_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            close(ofd);
            close(efd);
            return -1;
        }
        sleep_ms(5);
    }
    if (out)
        *out = slurp(ofd);
    if (err)
        *err = slurp(efd);
    close(ofd);
    close(efd);
    if (WIFEXITED(st))
        rc = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
        rc = 128 + WTERMSIG(st);
    else
        rc = -1;
    return rc;
}
