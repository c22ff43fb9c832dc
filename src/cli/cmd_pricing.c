/* cmd_pricing.c - `quotagate pricing -c RULES [--format md|html|json]
 * [--baseline PLAN] [--at TIME]`: the public limits table and the
 * verifiable multiplier statements (PRODUCT.md 8, docs/cli.md "pricing"),
 * written by src/analysis/pricing.c from the same analysis `analyze`
 * runs and in the words of the one phrase builder.  Markdown by default.
 * Exit 0, or 2 for unusable input (flags, rules, an unknown baseline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "pricing.h"

int qg__cmd_pricing(const qg_cli_args *a, qg_rules *rules)
{
    int format = QG_PRICING_MD, rc = QG_EXIT_USAGE;
    int64_t at_ms;
    json_t *j = NULL;
    char err[1024], *page;

    if (a->format) {
        if (!strcmp(a->format, "md"))
            format = QG_PRICING_MD;
        else if (!strcmp(a->format, "html"))
            format = QG_PRICING_HTML;
        else if (!strcmp(a->format, "json"))
            format = QG_PRICING_JSON;
        else {
            fprintf(stderr, "quotagate pricing: --format: expected md, html "
                    "or json, got \"%s\"\n", a->format);
            goto done;
        }
    }
    if (a->json)
        format = QG_PRICING_JSON;
    if (a->at) {
        if (qg_iso8601_parse(a->at, &at_ms) != 0) {
            fprintf(stderr, "quotagate pricing: --at: expected an ISO 8601 "
                    "instant such as 2026-12-01T00:00:00Z, got \"%s\"\n",
                    a->at);
            goto done;
        }
    } else {
        at_ms = (int64_t)time(NULL) * 1000;   /* the CLI's clock */
    }
    if (qg__pricing(rules, a->baseline, at_ms, &j, err, sizeof err) !=
        QG_OK) {
        fprintf(stderr, "quotagate pricing: %s\n", err);
        goto done;
    }
    if (format == QG_PRICING_JSON) {
        rc = qg__json_emit(j, 1) == 0 ? QG_EXIT_OK : QG_EXIT_USAGE;
        j = NULL;
        goto done;
    }
    if (!(page = qg__pricing_render(j, format))) {
        fprintf(stderr, "quotagate pricing: out of memory\n");
        goto done;
    }
    fputs(page, stdout);
    free(page);
    rc = QG_EXIT_OK;
done:
    json_decref(j);
    qg_rules_free(rules);
    return rc;
}
