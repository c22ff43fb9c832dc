/* pricing.h - the pricing page's model and its renderings (pricing.c):
 * `quotagate pricing` and the statements of /v1/plans.  The JSON is
 * PRODUCT.md 8's: {"baseline", "unit", "plans": [{"plan",
 * "price_usd_month", "windows": [{"name", "type", "limit", "text"}],
 * "statements": [{"kind", "multiplier", "window", "text"}]}], "weights",
 * "changes"} (plus "rule_version", "period_s", a plan's "redeemable", a
 * statement's "vs"). */
#ifndef QG_PRICING_H
#define QG_PRICING_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "quotagate.h"

typedef struct qg_analysis qg_analysis;
typedef struct qg_window_spec qg_window_spec;

enum { QG_PRICING_JSON = 0, QG_PRICING_MD = 1, QG_PRICING_HTML = 2 };

/* The whole model for rules r against baseline (NULL: the cheapest), the
 * changes not yet in force at at_ms.  0 with *out (caller owns it), or an
 * error with err (an unknown baseline: QG_EINVAL). */
int qg__pricing(const qg_rules *r, const char *baseline, int64_t at_ms,
                json_t **out, char *err, size_t errcap);

/* One plan's statements (a new array) from an analysis of r (analytic
 * part enough: simulate 0). */
json_t *qg__pricing_statements(const qg_rules *r, const qg_analysis *a,
                               int plan);

/* The windows w[0..n) as [{"name", "type", "limit", "text"}] (new). */
json_t *qg__pricing_window_texts(const qg_rules *r, const qg_window_spec *w,
                                 int n);

/* The model written as a Markdown or HTML page (malloc'd, caller frees;
 * NULL on out of memory). */
char *qg__pricing_render(json_t *model, int format);

#endif
