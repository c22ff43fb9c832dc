/* ruletest.c - parse rules text for a test and build decision views by
 * hand.  See ruletest.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "ruletest.h"
#include "tzfile.h"

qg_rules *tst_rules_parse(const char *text)
{
    qg_rules *r = NULL;
    qg_diag diag;
    char err[300];
    if (qg__rules_parse(text, strlen(text), "test",
                       qg__tz_load_system, NULL, &r, &diag) != 0) {
        qg__diag_format(&diag, err, sizeof err);
        fail_msg("rules: %s", err);
    }
    return r;
}

void tst_decision_view(qg_decision *d, const char *name, int type, int unit,
                       int org, int64_t limit, int64_t used,
                       int64_t reset_at)
{
    qg_window_view *v = &d->views[d->nviews++];
    v->name = name;
    v->type = type;
    v->unit = unit;
    v->org = org;
    v->limit_milli = limit;
    v->used_milli = used;
    v->remaining_milli = limit > used ? limit - used : 0;
    v->reset_at_ms = reset_at;
}
