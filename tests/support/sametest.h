/* sametest.h - field-by-field comparison of two decisions, shared by the
 * tests that run one stream of requests two ways and want the same
 * answers: the memory store against Redis (test_store_redis.c), checks
 * in batches against one by one (test_engine.c). */
#ifndef QG_TEST_SAMETEST_H
#define QG_TEST_SAMETEST_H

#include "quotagate.h"

/* Fail the running test (cmocka's fail_msg) at the first field in which
 * a and b differ, naming the request (what) and the two ways (la, lb):
 * outcome, replay, weights, instants, binding, overage and spending,
 * names, and every window's view and recovery points. */
void tst_same_decision(const char *what, const char *la, const char *lb,
                       const qg_decision *a, const qg_decision *b);

#endif
