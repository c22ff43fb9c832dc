/* json_out.h - the JSON bodies of the HTTP API (PRODUCT.md section 4).
 *
 * One function per body, each returning a NUL-terminated compact JSON text
 * the caller releases with free(); NULL means out of memory.  The json_t
 * builders (qg__json_window, qg__json_milli) return a new reference the caller
 * owns (json_decref).  No function keeps a pointer to its arguments.
 *
 * Numbers: quantities are int64 milli-units everywhere inside quotagate;
 * they become JSON numbers only here.  A whole value is written as an
 * integer ("400"), any other as a decimal with exactly its digits ("16.5",
 * "0.000125"): reals are dumped with 15 significant digits
 * (QG_JSON_DUMP_FLAGS), which round-trips every decimal of up to 15
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
 *    "windows":[window + "recovers":[{"at","in_s","remaining"}]],
 *    "forecast":[{"name","full_at","next_recovery"}]}
 *    The forecast says what happens if nothing more is charged (quotagate
 *    keeps no usage history to extrapolate a rate from): full_at is when
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
#include "rules.h"

#define QG_JSON_DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

/* v / 10^scale as a JSON number: an integer when whole, else a real whose
 * 15-digit dump is exactly the decimal.  New reference, NULL on ENOMEM. */
json_t *qg__json_scaled(int64_t v, int scale_digits);
/* qg__json_scaled(v, 3): milli-units as units. */
json_t *qg__json_milli(int64_t v);
/* ISO 8601 string of ms, or JSON null when ms is 0. */
json_t *qg__json_time(int64_t ms);

/* One window object (see above).  unit_name is the rules' unit, NULL for
 * "weight points".  New reference, NULL on ENOMEM. */
json_t *qg__json_window(const qg_window_view *v, const char *unit_name);

/* Dump j with QG_JSON_DUMP_FLAGS and release it (steals the reference;
 * j may be NULL).  Returns malloc'd text or NULL. */
char *qg__json_dump_steal(json_t *j);

/* /v1/check body for d, allowed or refused; request_id as sent. */
char *qg__json_check(const qg_decision *d, const char *request_id,
                    const char *unit_name);
/* /v1/settle body. */
char *qg__json_settle(const qg_settle_result *s, const char *request_id);
/* /v1/usage body of subject, from qg_engine_usage() at now_ms. */
char *qg__json_usage(const qg_decision *d, const char *subject,
                    int64_t now_ms, const char *unit_name);
/* /v1/plans and /v1/weights from the rules. */
char *qg__json_plans(const qg_rules *r);
char *qg__json_weights(const qg_rules *r);
/* {"error":{"type","message"}}. */
char *qg__json_error(const char *type, const char *message);

/* Static names used in bodies: "rolling".., "member"/"org",
 * "completed".., "reject".. ("?" when unknown). */
const char *qg__json_win_type_name(int type);
const char *qg__json_settle_status_name(int status);
const char *qg__json_policy_name(int policy);

#endif
