/* phrase.h - the words quotagate uses for its limits, written in one
 * place (PRODUCT.md 6 and 8: "the console and error messages use the same
 * words").  `quotagate pricing`, the statements of /v1/plans (which the
 * console shows), the 429 messages and lint all build their sentences
 * from these functions, so the wording cannot drift apart.
 *
 * Each writes a NUL-terminated sentence into buf (cap bytes) and returns
 * its length, or -1 when it does not fit or its parts are unusable (a
 * claim whose window is missing): lint reports those, nothing prints them
 * half.  Numbers are the rules' fixed-point integers, printed exactly
 * ("1,400", "2.5"); no floating point. */
#ifndef QG_PHRASE_H
#define QG_PHRASE_H

#include <stddef.h>
#include <stdint.h>
#include "rules.h"

/* 1400000 -> "1,400"; 2500 -> "2.5" (milli, thousands grouped). */
int qg__phrase_amount(int64_t milli, char *buf, size_t cap);

/* A plan's name as a page shows it: "pro" -> "Pro", "max20" -> "Max20". */
int qg__phrase_plan(const char *name, char *buf, size_t cap);

/* A window's qualified name: "NAME", or "org.NAME" for an org's window;
 * the one name of a window in error.window, the headers, the ledger's
 * window column, explain and the windows lists (docs/api.md, "Window
 * names"). */
int qg__phrase_window_name(const char *name, int org, char *buf, size_t cap);

/* A window in words: "250 weight points per rolling 5 hours", "1,400
 * weight points per calendar week, resetting Monday 00:00 UTC", "20
 * requests per minute", "100 weight points per 5-hour session, from the
 * first request", "2 requests in flight"; a model scope adds " (large
 * only)". */
int qg__phrase_window(const qg_rules *r, const qg_window_spec *w, char *buf,
                      size_t cap);

/* A claim next to its window and unit: "up to 20x Pro within each 5-hour
 * window (1,000 vs 50 weight points)".  w and base are the claim's window
 * in the plan and in the plan it is compared with; -1 when either is
 * NULL. */
int qg__phrase_claim(const qg_rules *r, int64_t multiplier_milli,
                     const char *vs_plan, const qg_window_spec *w,
                     const qg_window_spec *base, char *buf, size_t cap);

/* The effective figure over the period: "about 6x Pro per week: 2,400 vs
 * 400 weight points" (the multiplier to one decimal, "about" unless it is
 * exact; the redeemable allowances of the plan and of the baseline). */
int qg__phrase_effective(const qg_rules *r, int64_t effective_milli,
                         const char *vs_plan, int64_t period_ms,
                         int64_t redeemable_milli, int64_t base_milli,
                         char *buf, size_t cap);

/* The period in words: "per week" (7d), "per day", "per 30 days",
 * "per 5 hours". */
int qg__phrase_period(int64_t period_ms, char *buf, size_t cap);

#endif
