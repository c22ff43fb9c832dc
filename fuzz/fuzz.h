/* fuzz.h - what every harness in fuzz/ shares (docs/fuzzing.md).
 *
 * A harness is fuzz/fuzz_NAME.c: it defines libFuzzer's entry point
 * LLVMFuzzerTestOneInput (and, when it needs one-time setup,
 * LLVMFuzzerInitialize), feeds the bytes to one parser of the project and
 * checks what it can: a differential harness compares with a reference
 * reader and calls fuzz_fail on any disagreement.  The same object is
 * linked either with libFuzzer (clang, make fuzz) or with fuzz/replay.c
 * (gcc, make test), which runs it on every file of fuzz/corpus/NAME.
 * A harness must be deterministic: the same input, the same path. */
#ifndef QG_FUZZ_H
#define QG_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Report a disagreement (what, with the input shown escaped, at most 512
 * bytes) and abort: libFuzzer saves the input as a crash. */
static inline void fuzz_fail(const char *what, const void *data, size_t n)
{
    const unsigned char *s = data;
    fprintf(stderr, "fuzz: %s on %zu bytes: \"", what, n);
    for (size_t i = 0; i < n && i < 512; i++) {
        if (s[i] >= 0x20 && s[i] < 0x7F && s[i] != '\\')
            fputc(s[i], stderr);
        else
            fprintf(stderr, "\\x%02x", s[i]);
    }
    fprintf(stderr, "\"\n");
    abort();
}

#endif
