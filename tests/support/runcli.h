/* runcli.h - run the quotagate CLI ($QG_BIN) as a child process with the
 * given arguments and capture its exit status, stdout and stderr (shared
 * by test_cli.c and test_keys.c).  Uses cmocka assertions: a failure to
 * fork or create temporary files fails the test. */
#ifndef QG_TEST_RUNCLI_H
#define QG_TEST_RUNCLI_H

typedef struct tst_cli_result {
    int rc;            /* exit status, 128 when killed by a signal */
    char *out, *err;   /* captured stdout and stderr (malloc'd) */
} tst_cli_result;

/* Whole contents of fd from offset 0, NUL-terminated (malloc'd). */
char *tst_slurp_fd(int fd);
/* Run $QG_BIN with the NULL-terminated arguments (at most 30 used). */
tst_cli_result tst_cli_run(const char *arg0, ...);
/* Free the captured output of r. */
void tst_cli_done(tst_cli_result *r);

#endif
