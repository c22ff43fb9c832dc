/* ruletest.h - helpers for tests that work on rules given as YAML text and
 * on hand-built decisions (test_headers.c, test_json_out.c,
 * test_engine.c): parse rules text, failing the test on error, and append
 * a window view to a qg_decision. */
#ifndef QG_TEST_RULETEST_H
#define QG_TEST_RULETEST_H

#include <stdint.h>
#include "quotagate.h"
#include "rules.h"

/* Parse text (source name "test", time zones from the system); fails the
 * test with the formatted diagnostic when it does not parse. */
qg_rules *tst_rules_parse(const char *text);

/* Append a view to d->views (remaining = limit - used, floored at 0). */
void tst_decision_view(qg_decision *d, const char *name, int type, int unit,
                       int org, int64_t limit, int64_t used,
                       int64_t reset_at);

#endif
