/* mutate.h - differential tests of a JSON reader against a reference
 * (test_respscan.c, test_reqscan.c): every truncation, every one-byte
 * deletion and one-byte replacements of each sample must get the same
 * answer from both, as the caller's agree() decides. */
#ifndef TST_MUTATE_H
#define TST_MUTATE_H

#include <stddef.h>

/* For each sample (NUL-terminated, under 1024 bytes): agree() on every
 * prefix, on the sample with each byte deleted, and with each byte
 * replaced by each of bytes[0..nbytes) (skipping a replacement by the
 * same byte).
 * Fails the test at the first disagreement. */
void tst_mutations_agree(const char *const *samples, size_t nsamples,
                         const char *bytes, size_t nbytes,
                         int (*agree)(const char *s, size_t n));

#endif
