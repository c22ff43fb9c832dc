/* replay.c - make test's side of fuzzing: run one harness (linked in) on
 * every file of its corpus, deterministically, as one cmocka test.
 *
 * The binary is tests/test_fuzz_NAME; NAME (from argv[0]) picks the
 * corpus fuzz/corpus/NAME/, relative to the working directory (the
 * repository root, as tests/run.sh runs it) or under $QG_FUZZ_CORPUS.
 * Files are run in name order, each once; a harness that finds a problem
 * aborts (a sanitizer report, or fuzz_fail on a disagreement), which
 * fails the test.  The file about to run is printed first, so the log of
 * a failure names it.  An empty or missing corpus fails too: a replay
 * that runs nothing would prove nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#pragma weak LLVMFuzzerInitialize

enum { REPLAY_MAX_FILE = 1 << 20 };

static char corpus_dir[4096];

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int not_hidden(const struct dirent *d)
{
    return d->d_name[0] != '.';
}

/* Read path into a heap buffer of exactly its size (so that ASan sees
 * any read past the end, as under libFuzzer). */
static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL, *exact = NULL;
    size_t n = 0;
    if (!f)
        return NULL;
    buf = malloc(REPLAY_MAX_FILE + 1);
    if (buf)
        n = fread(buf, 1, REPLAY_MAX_FILE + 1, f);
    if (buf && !ferror(f) && n <= REPLAY_MAX_FILE &&
        (exact = malloc(n ? n : 1)) != NULL)
        memcpy(exact, buf, n);
    free(buf);
    fclose(f);
    *len = n;
    return exact;
}

static void test_replay(void **state)
{
    struct dirent **ents = NULL;
    int n = scandir(corpus_dir, &ents, not_hidden, by_name), ran = 0;
    (void)state;
    if (n < 0)
        fprintf(stderr, "replay: %s: %s\n", corpus_dir, strerror(errno));
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        char path[8192];
        size_t len = 0;
        uint8_t *data;
        snprintf(path, sizeof path, "%s/%s", corpus_dir, ents[i]->d_name);
        printf("replay %s\n", path);
        fflush(stdout);
        data = slurp(path, &len);
        assert_non_null(data);
        LLVMFuzzerTestOneInput(data, len);
        free(data);
        free(ents[i]);
        ran++;
    }
    free(ents);
    printf("replay: %d inputs from %s\n", ran, corpus_dir);
}

int main(int argc, char **argv)
{
    const char *base = strrchr(argv[0], '/'), *root = getenv("QG_FUZZ_CORPUS");
    base = base ? base + 1 : argv[0];
    if (strncmp(base, "test_fuzz_", 10) != 0) {
        fprintf(stderr, "replay: run me as test_fuzz_NAME\n");
        return 2;
    }
    snprintf(corpus_dir, sizeof corpus_dir, "%s/%s",
             root && *root ? root : "fuzz/corpus", base + 10);
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay),
    };
    return cmocka_run_group_tests_name(base, tests, NULL, NULL);
}
