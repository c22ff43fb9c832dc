/* json_out.h - the JSON bodies of the HTTP API (PRODUCT.md section 4).
 *
 * One function per body, each returning a NUL-terminated compact JSON text
 * the caller releases with free(); NULL means out of memory.  No function
 * keeps a pointer to its arguments.
 *
 * Numbers: quantities are int64 milli-units everywhere inside quotagate;
 * they become JSON numbers only here.  A whole value is written as an
 * integer ("400"), any other as a decimal with exactly its digits ("16.5",
 * "0.000125"): reals are dumped with 15 significant digits
 * (QG_JSON_DUMP_FLAGS, json_text.h), which round-trips every decimal of up to 15
 * digits, so what is printed is the exact milli (or micro) value.
 *
 * Bodies:
 *  check, allowed (200): {"decision":"allow","request_id","weight","plan",
 *    "org"?, "model"?, "rules_version","weights_version","replayed",
 *    "windows":[window]}
 *  check, refused (429): {"decision":"reject","request_id","weight","plan",
 *    "org"?,"model"?,"rules_version","weights_version",
 *    "error":{"type":"quota_exceeded","window","message"},"retryable":true,
 *    "retry_after_s","recovers":[{"window","at","in_s","remaining"}],
 *    "windows":[window]}
 *    a request no window could ever hold: error.type
 *    "request_too_large_for_plan", "retryable":false, no retry_after_s.
 *  window: {"name","scope":"member"|"org","type","unit","limit","used",
 *    "remaining","reset_at": ISO 8601 or null}; unit is the rules' unit
 *    ("weight points") or "requests".
 *  settle: {"request_id","status","reserved","actual","charged","late",
 *    "replayed"}
 *  usage: {"subject","plan","org"(or null),"rules_version",
 *    "windows":[window + "recovers":[{"at","in_s","remaining"}] +
 *    "forecast":{"basis_s","weight_per_hour","exhausted_at",
 *    "before_reset"}], "forecast":[{"name","full_at","next_recovery"}]}
 *    A window's forecast is at the subject's pace (docs/forecast.md).
 *    The top-level "forecast" array, older, says what happens if nothing
 *    more is charged (kept for the clients that read it): full_at is when
 *    the window is back to its whole limit (null when nothing is used, or
 *    when the schedule does not reach it), next_recovery the first step
 *    {"at","remaining"} (null when nothing will come back).
 *  plans: {"rules_version","weights_version","unit","plans":[{"name",
 *    "price_usd_month"(or null),"windows":[spec],"concurrency"(or null),
 *    "overage":{"policy",...}}],"orgs":[{"name","windows","concurrency"}]}
 *    spec: {"name","type","limit","unit", rolling/session "length_s",
 *    calendar "every","at"|"anchor":"billing","tz", rate "per_s","burst",
 *    "models":[...] when scoped, "overage" when the window has its own}
 *  weights: {"version","calibrated","unit","models":[{"name","per_request",
 *    "input_per_1k","output_per_1k"}]}
 *  error: {"error":{"type","message"}}
 *
 * Thread-safe: no shared state. */
#ifndef QG_JSON_OUT_H
#define QG_JSON_OUT_H

#include <stdint.h>
#include <jansson.h>
#include "quotagate.h"
#include "forecast.h"
#include "rules.h"

/* The bodies (each a malloc'ed text): decisions and errors in
 * json_decision.c, the rules' descriptions in json_rules.c.  The atoms
 * and the writer they share are json_text.h's. */
#include "json_text.h"

char *qg__json_check(const qg_decision *d, const char *request_id,
                    const qg_rules *r);
/* /v1/settle body. */
char *qg__json_settle(const qg_settle_result *s, const char *request_id);
/* /v1/usage body of subject, from qg_engine_usage() at now_ms; with
 * fc (one per view, may be NULL: none) every window also carries
 * "forecast":{"basis_s","weight_per_hour","exhausted_at","before_reset"}
 * (PRODUCT.md section 7, docs/forecast.md). */
char *qg__json_usage(const qg_decision *d, const char *subject,
                    int64_t now_ms, const char *unit_name);
char *qg__json_usage_forecast(const qg_decision *d, const char *subject,
                              int64_t now_ms, const char *unit_name,
                              const qg_forecast *fc);
/* One member of an org's usage (h_org.c): its usage read's result and,
 * when rc is 0, its views. */
typedef struct qg_org_member {
    const char *subject;
    int rc;
    const qg_decision *d;
} qg_org_member;
/* /v1/orgs/{org}/usage body: the org's windows (its scope's views, read
 * through the first member whose read succeeded), then every member's
 * own windows; total is how many members the org has in all. */
char *qg__json_org_usage(const char *org, const qg_org_member *m, int n,
                         size_t total, int64_t now_ms, const char *unit_name);
/* /v1/plans and /v1/weights from the rules. */
/* /v1/plans: the version of `chain` in force at now (its plans, orgs,
 * effective, announced, changes) and "upcoming": the later versions, each
 * with its differences from the one before. */
char *qg__json_plans(const qg_rules *chain, int64_t now);
/* /v1/usage with "upcoming_changes": the later versions whose differences
 * touch the member's plan (and org), added to the usage body (taken and
 * freed; returned as it is when nothing is upcoming).  NULL: no memory. */
char *qg__json_usage_upcoming(char *body, const qg_rules *chain, int64_t now,
                              const char *plan, const char *org);
char *qg__json_weights(const qg_rules *r);
/* {"error":{"type","message"}}. */
char *qg__json_error(const char *type, const char *message);

#endif
