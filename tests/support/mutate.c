/* mutate.c - see mutate.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "mutate.h"

void tst_mutations_agree(const char *const *samples, size_t nsamples,
                         const char *bytes, size_t nbytes,
                         int (*agree)(const char *s, size_t n))
{
    char buf[1024];
    for (size_t i = 0; i < nsamples; i++) {
        const char *s = samples[i];
        size_t n = strlen(s);
        assert_true(n < sizeof buf);
        for (size_t k = 0; k < n; k++) {
            assert_true(agree(s, k));                   /* truncated */
            memcpy(buf, s, k);                          /* one deleted */
            memcpy(buf + k, s + k + 1, n - k - 1);
            assert_true(agree(buf, n - 1));
            memcpy(buf, s, n);
            for (size_t b = 0; b < nbytes; b++) {       /* one replaced */
                if (s[k] == bytes[b])
                    continue;
                buf[k] = bytes[b];
                assert_true(agree(buf, n));
            }
            buf[k] = s[k];
        }
    }
}
