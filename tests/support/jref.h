/* jref.h - pieces of the jansson reference readers that the scanner
 * tests (test_reqscan.c, test_respscan.c) compare the yajl readers with:
 * the token-count rules the old jansson readers applied. */
#ifndef TST_JREF_H
#define TST_JREF_H

#include <stdint.h>
#include <jansson.h>

/* A token count member of obj: 1 and *v when present, 0 when absent or
 * null, -1 when it is not a non-negative integer. */
int tst_jref_count(const json_t *obj, const char *key, int64_t *v);
/* The first of two alternative count members that is present. */
int tst_jref_count2(const json_t *obj, const char *k1, const char *k2,
                    int64_t *v);

#endif
