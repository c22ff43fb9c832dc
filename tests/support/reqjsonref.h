/* reqjsonref.h - the two readings of a decision API body compared
 * (src/server/reqjson.c): the one yajl pass against jansson's tree, which
 * is the reference (it is what the routes read before the pass, and it
 * still words every refusal).  Shared by tests/unit/test_reqjson.c and
 * fuzz/fuzz_reqjson.c. */
#ifndef QG_TEST_REQJSONREF_H
#define QG_TEST_REQJSONREF_H

#include <stddef.h>

/* 1 when both readings of s[0..n) agree for every route's allowed keys:
 * the parse's result and message, then every getter of every key (each
 * string bound the routes use, required or not, the integer bounds, the
 * milli-units, the boolean): result, value and message.  0 with what
 * differed on stderr. */
int tst_reqjson_agree(const char *s, size_t n);

/* How the last agreeing call read s with check's keys: 1 in one pass, 0
 * through jansson (a refusal included). */
int tst_reqjson_last_pass(void);

#endif
