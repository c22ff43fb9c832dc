/* cmd_lint.c - `quotagate lint`: print the pre-release checklist findings.
 *
 * The rules were loaded (and so validated) by main.c; src/analysis/lint.c
 * produces the findings; this file prints one line per finding and a
 * count, or {"findings": [...], "ok": bool} with --json.  Exit 0 when
 * clean, 1 with findings, 2 when a rules file is unusable. */
#include <stdio.h>

#include "analysis.h"
#include "cli.h"

static void print_human(const qg_lint_result *res, int versions)
{
    int i;
    for (i = 0; i < res->nfindings; i++) {
        const qg_finding *f = &res->findings[i];
        printf("lint: %s%s%s%s%s%s%s [%s]\n", versions ? "version " : "",
               versions ? f->version : "", versions ? ": " : "",
               f->plan[0] ? "plan " : "", f->plan, f->plan[0] ? ": " : "",
               f->message, f->code);
    }
    printf("%d finding%s\n", res->nfindings, res->nfindings == 1 ? "" : "s");
}

static int print_json(const qg_lint_result *res)
{
    json_t *arr = json_array();
    int i;
    for (i = 0; i < res->nfindings; i++) {
        const qg_finding *f = &res->findings[i];
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:s?, s:s?, s:s}", "code", f->code,
                           "version", f->version, "plan",
                           f->plan[0] ? f->plan : NULL, "window",
                           f->window[0] ? f->window : NULL, "message",
                           f->message));
    }
    return qg__json_emit(json_pack("{s:o, s:b}", "findings", arr, "ok",
                                   res->nfindings == 0),
                         1);
}

int qg__cmd_lint(const qg_cli_args *args, qg_rules *r)
{
    qg_rules *prev = NULL;
    const qg_rules *was = NULL;
    qg_lint_result res = { 0, NULL };
    char err[512];
    int rc = QG_EXIT_USAGE;

    if (args->previous && !(prev = qg__cli_load_rules(args->previous)))
        goto done;
    /* the old file's last version: what its rules lead to */
    for (was = prev; was && qg_rules_next(was); was = qg_rules_next(was))
        ;
    if (qg__lint(r, was, &res, err, sizeof err) != QG_OK) {
        fprintf(stderr, "quotagate lint: %s\n", err);
        goto done;
    }
    if (args->json ? print_json(&res)
                   : (print_human(&res, qg_rules_next(r) != NULL), 0))
        goto done;
    rc = res.nfindings ? QG_EXIT_FINDINGS : QG_EXIT_OK;
done:
    qg__lint_free(&res);
    qg_rules_free(prev);
    qg_rules_free(r);
    return rc;
}
