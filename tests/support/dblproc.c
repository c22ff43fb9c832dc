/* dblproc.c - the upstream double as a child process (dblproc.h). */
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dblproc.h"
#include "qgproc.h"

int dblproc_start(dblproc *d, const char *bin)
{
    int out[2];
    char line[256];
    size_t n = 0;
    long long t0;
    const char *c;

    d->pid = 0;
    d->port = 0;
    if (!bin || pipe(out) < 0)
        return -1;
    if ((d->pid = fork()) < 0) {
        d->pid = 0;
        close(out[0]);
        close(out[1]);
        return -1;
    }
    if (d->pid == 0) {
        char *argv[] = {(char *)bin, "--listen", "127.0.0.1:0", NULL};
        prctl(PR_SET_PDEATHSIG, SIGTERM);   /* a test that crashed */
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execv(bin, argv);
        _exit(127);
    }
    close(out[1]);
    t0 = qg_now_ms();
    while (n < sizeof line - 1 && qg_now_ms() - t0 < 10000) {
        struct pollfd pf = {out[0], POLLIN, 0};
        ssize_t k;
        if (poll(&pf, 1, 100) <= 0)
            continue;
        if ((k = read(out[0], line + n, 1)) <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    close(out[0]);
    c = strrchr(line, ':');
    d->port = c && strstr(line, "listening") ? atoi(c + 1) : 0;
    if (d->port > 0)
        return 0;
    dblproc_stop(d);
    return -1;
}

void dblproc_stop(dblproc *d)
{
    int st;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, &st, 0);
    }
    d->pid = 0;
    d->port = 0;
}
