/* cmd_reconcile.c - `quotagate reconcile -c RULES --store URL --ledger URL
 * [--subject NAME] [--repair] [--json]`: a shared store's counters
 * against the ledger, from outside the gateways (PRODUCT.md 5.2,
 * docs/reconcile.md).  Prints each window whose drift passes the rules'
 * tolerance; exit 0 no drift, 1 drift found (also when repaired), 2 could
 * not run (a memory store, which lives inside one gateway; an unreachable
 * store or ledger; an unknown subject). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_amount(const char *label, int64_t milli)
{
    char buf[40];
    qg_fixed_format(milli, 3, buf, sizeof buf);
    printf("%s %s", label, buf);
}

static void print_text(const qg_reconcile_report *r)
{
    char at[40];
    qg_iso8601_format(r->at_ms, at, sizeof at);
    for (int i = 0; i < r->ndrifted; i++) {
        const qg_reconcile_drift *d = &r->drifted[i];
        if (d->subject[0])
            printf("subject %s%s%s", d->subject, d->org[0] ? " (org " : "",
                   d->org[0] ? d->org : "");
        else
            printf("org %s", d->org);
        printf("%s window %s: ", d->subject[0] && d->org[0] ? ")" : "",
               d->window);
        print_amount("ledger", d->ledger_milli);
        print_amount(", store", d->store_milli);
        print_amount(", drift", d->drift_milli);
        if (d->nrequest_ids) {
            printf("; request ids the store does not know:");
            for (int k = 0; k < d->nrequest_ids; k++)
                printf(" %s", d->request_ids[k]);
        }
        putchar('\n');
    }
    printf("reconcile at %s: %llu windows of %llu subjects and %llu orgs "
           "checked, %d drifted%s\n", at, (unsigned long long)r->checked,
           (unsigned long long)r->subjects, (unsigned long long)r->orgs,
           r->ndrifted,
           !r->repair || !r->ndrifted ? ""
           : r->repaired ? "; repaired: the store holds the ledger's figures"
                         : "; not all repaired (docs/reconcile.md, \"Repair\")");
}

int qg__cmd_reconcile(const qg_cli_args *a, qg_rules *rules)
{
    qg_reconcile_opts o;
    qg_reconcile_report *r = NULL;
    char err[1024];
    int rc;

    memset(&o, 0, sizeof o);
    o.rules = rules;                 /* qg_reconcile's from here */
    o.store_url = a->store;
    o.ledger_url = a->ledger;
    o.subject = a->subject;
    o.repair = a->repair;
    if ((rc = qg_reconcile(&o, &r, err, sizeof err)) != QG_OK) {
        fprintf(stderr, "quotagate reconcile: %s\n", err);
        return QG_EXIT_USAGE;
    }
    if (a->json) {
        char *j = qg_reconcile_json(r);
        if (!j) {
            fprintf(stderr, "quotagate reconcile: out of memory\n");
            qg_reconcile_report_free(r);
            return QG_EXIT_USAGE;
        }
        puts(j);
        free(j);
    } else {
        print_text(r);
    }
    rc = r->ndrifted ? QG_EXIT_FINDINGS : QG_EXIT_OK;
    qg_reconcile_report_free(r);
    return rc;
}
