/* runcli.c - run the quotagate CLI ($QG_BIN) with arguments and capture its
 * exit status, stdout and stderr.  See runcli.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runcli.h"

char *tst_slurp_fd(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    assert_non_null(buf);
    lseek(fd, 0, SEEK_SET);
    while ((n = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[len] = '\0';
    return buf;
}

tst_cli_result tst_cli_run(const char *arg0, ...)
{
    const char *argv[32], *bin = getenv("QG_BIN");
    char outp[] = "/tmp/qgcli.out.XXXXXX", errp[] = "/tmp/qgcli.err.XXXXXX";
    int n = 0, ofd, efd, st;
    va_list ap;
    pid_t pid;
    tst_cli_result r;

    if (!bin)
        fail_msg("QG_BIN is not set (run through tests/run.sh)");
    ofd = mkstemp(outp);
    efd = mkstemp(errp);
    assert_true(ofd >= 0 && efd >= 0);
    unlink(outp);
    unlink(errp);
    argv[n++] = bin;
    va_start(ap, arg0);
    for (const char *a = arg0; a && n < 31; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(ofd, 1);
        dup2(efd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    r.out = tst_slurp_fd(ofd);
    r.err = tst_slurp_fd(efd);
    close(ofd);
    close(efd);
    return r;
}

void tst_cli_done(tst_cli_result *r)
{
    free(r->out);
    free(r->err);
}
