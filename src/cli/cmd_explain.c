/* cmd_explain.c - `quotagate explain REQUEST_ID (--data DIR | --ledger URL)
 * -c RULES [--json]`: one request's charge reconstructed from the ledger
 * (PRODUCT.md 8, docs/cli.md "explain").  The figures come from
 * qg_explain (src/server/explain.c), the same JSON that GET
 * /v1/admin/requests/{id} answers; this file prints it as it is (--json)
 * or in words.  Exit 0 shown, 1 no such request, 2 unusable input (flags,
 * rules, a ledger that cannot be read). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const char *str(json_t *o, const char *k)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : "-";
}

/* A JSON number as the decimal it stands for ("3.75", "12"). */
static void num(json_t *v, char *buf, size_t cap)
{
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, cap, "%.15g", json_real_value(v));
    else
        snprintf(buf, cap, "-");
}

static void print_text(json_t *j)
{
    json_t *w = json_object_get(j, "weight"), *v, *ov, *rp;
    char a[48], b[48], c[48], d[48];
    size_t i;
    printf("request %s\n", str(j, "request_id"));
    printf("  subject %s, org %s, plan %s\n", str(j, "subject"),
           str(j, "org"), str(j, "plan"));
    printf("  rule version %s, weight version %s, model %s\n",
           str(j, "rule_version"), str(j, "weight_version"), str(j, "model"));
    printf("  decided at %s: %s", str(j, "decided_at"), str(j, "decision"));
    if (json_is_string(json_object_get(j, "window")))
        printf(" by window %s", str(j, "window"));
    if (json_is_number(v = json_object_get(j, "retry_after_s"))) {
        num(v, a, sizeof a);
        printf(", retry after %s s", a);
    }
    putchar('\n');
    num(json_object_get(w, "reserved"), a, sizeof a);
    num(json_object_get(w, "charged"), b, sizeof b);
    printf("  weight: %s\n  reserved %s, charged %s\n", str(w, "formula"), a,
           b);
    if (json_is_string(json_object_get(w, "detail")))
        printf("  note: %s\n", str(w, "detail"));
    printf("  status %s", str(j, "status"));
    if (json_is_string(json_object_get(j, "settled_at")))
        printf(", settled at %s", str(j, "settled_at"));
    putchar('\n');
    printf("  %-24s %12s %12s %12s %12s\n", "window", "limit", "used before",
           "charged", "used after");
    json_array_foreach(json_object_get(j, "windows"), i, v) {
        num(json_object_get(v, "limit"), a, sizeof a);
        num(json_object_get(v, "used_before"), b, sizeof b);
        num(json_object_get(v, "charged"), c, sizeof c);
        num(json_object_get(v, "used_after"), d, sizeof d);
        printf("  %-24s %12s %12s %12s %12s\n", str(v, "name"), a, b, c, d);
    }
    if (json_is_object(ov = json_object_get(j, "overage"))) {
        num(json_object_get(ov, "weight"), a, sizeof a);
        num(json_object_get(ov, "price_usd_per_unit"), b, sizeof b);
        num(json_object_get(ov, "cost_usd"), c, sizeof c);
        printf("  overage (payg): %s beyond the limits at %s USD each: "
               "%s USD\n", a, b, c);
    }
    if (json_is_true(json_object_get(j, "fallback")))
        printf("  decided locally while the shared store was down "
               "(fallback)\n");
    rp = json_object_get(j, "replay");
    printf("  replayed %lld earlier rows under rule version %s\n",
           (long long)json_integer_value(json_object_get(rp, "rows")),
           str(rp, "rules_loaded"));
    if (json_is_string(json_object_get(j, "warning")))
        printf("  warning: %s\n", str(j, "warning"));
}

int qg__cmd_explain(const qg_cli_args *a, qg_rules *rules)
{
    char url[4200], err[1024];
    char *out = NULL;
    const char *path;
    json_error_t je;
    json_t *j;
    int rc;

    if (a->nargs != 1) {
        fprintf(stderr, "quotagate explain: give one REQUEST_ID\n");
        qg_rules_free(rules);
        return QG_EXIT_USAGE;
    }
    if (a->data && a->ledger) {
        fprintf(stderr, "quotagate explain: give --data or --ledger, not "
                "both\n");
        qg_rules_free(rules);
        return QG_EXIT_USAGE;
    }
    if (a->ledger) {
        snprintf(url, sizeof url, "%s", a->ledger);
    } else {
        struct stat sb;
        snprintf(url, sizeof url, "sqlite:%s/ledger.db",
                 a->data ? a->data : "./var");
        if (stat(url + 7, &sb) != 0) {   /* explain never creates one */
            fprintf(stderr, "quotagate explain: no ledger at %s\n", url + 7);
            qg_rules_free(rules);
            return QG_EXIT_USAGE;
        }
    }
    path = qg_rules_path(rules);
    rc = qg_explain(url, path, a->args[0], &out, err, sizeof err);
    qg_rules_free(rules);
    if (rc != QG_OK) {
        fprintf(stderr, "quotagate explain: %s\n", err);
        return rc == QG_ENOTFOUND ? QG_EXIT_FINDINGS : QG_EXIT_USAGE;
    }
    if (a->json) {
        puts(out);
        free(out);
        return QG_EXIT_OK;
    }
    j = json_loads(out, 0, &je);
    free(out);
    if (!j) {
        fprintf(stderr, "quotagate explain: %s\n", je.text);
        return QG_EXIT_USAGE;
    }
    print_text(j);
    json_decref(j);
    return QG_EXIT_OK;
}
