/* fuzz_rules.c - the rules loader (qg__rules_parse, rules_yaml.c and
 * rules_windows.c over libyaml) on arbitrary bytes.
 *
 * The bytes are the whole rules file, passed as the exact buffer (no NUL
 * after it, so a read past len is a sanitizer report).  Time zones come
 * from the system's zoneinfo, as `serve` loads them.  Checked beyond "no
 * crash, no leak, no undefined behaviour": the result is OK with a rule
 * set or a rules error with a message, never both, never neither; an
 * accepted set answers lookups of its own names. */
#include <string.h>

#include "fuzz.h"
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qg_rules *r = NULL;
    qg_diag d;
    char msg[1024];
    int rc = qg__rules_parse((const char *)data, size, "fuzz.yaml",
                            qg__tz_load_system, NULL, &r, &d);
    if (rc == QG_OK) {
        if (!r || !qg_rules_version(r))
            fuzz_fail("accepted without a rule set", data, size);
        for (int i = 0; i < r->nplans; i++)
            if (qg__rules_find_plan(r, r->plans[i].name) != i)
                fuzz_fail("a plan not found by its name", data, size);
        for (int i = 0; i < r->nmodels; i++)
            if (qg_rules_find_model(r, r->models[i].name) != i)
                fuzz_fail("a model not found by its name", data, size);
        for (int i = 0; i < r->nsubjects; i++)
            if (qg_rules_find_subject(r, r->subjects[i].name) != i)
                fuzz_fail("a subject not found by its name", data, size);
        for (int i = 0; i < r->norgs; i++)
            if (qg__rules_find_org(r, r->orgs[i].name) != i)
                fuzz_fail("an org not found by its name", data, size);
        qg_rules_free(r);
        return 0;
    }
    if (r)
        fuzz_fail("refused with a rule set", data, size);
    if (rc != QG_ERULES && rc != QG_ENOMEM)
        fuzz_fail("an unexpected return code", data, size);
    qg__diag_format(&d, msg, sizeof msg);
    if (!d.message[0])
        fuzz_fail("refused without a message", data, size);
    return 0;
}
