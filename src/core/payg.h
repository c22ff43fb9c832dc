/* payg.h - pay as you go (PRODUCT.md section 3, docs/decisions.md
 * "Overage: payg"): which windows the policy lifts, what the overage of a
 * charge is and costs, the spending cap's period, and the spent amount a
 * store keeps per member.  The decision itself (lifted windows never
 * refuse; the cap does) is a branch of decide.c's one pass.  No I/O. */
#ifndef QG_PAYG_H
#define QG_PAYG_H

#include <stdint.h>
#include "quotagate.h"
#include "rules.h"
#include "store.h"

/* Derive the payg masks of every plan and org (the parser calls it):
 * only windows that total weight are lifted (rolling, calendar, session
 * in weight units), never rate, request-count or concurrency windows. */
void qg__rules_payg(qg_rules *r);

/* The windows of this member and org the policy lifts (bit i = the
 * decision's window i: member windows, then org windows) and the policy
 * whose price and cap apply (*ov).  0 when none. */
uint32_t qg__payg_mask(const qg_plan *p, const qg_org_spec *o,
                       const qg_overage **ov);

/* The spending cap's period containing at_ms: the member's billing month
 * (its anchor's day and time of day, UTC, clamped to short months), or the
 * calendar month in UTC without an anchor.  utc is the UTC zone. */
void qg__payg_cap_period(const qg_tz *utc, int64_t anchor_ms, int64_t at_ms,
                         int64_t *start, int64_t *end);

/* Fill a store check's payg fields (mask, price, cap, cap period) from
 * its plan and org at in->now_ms. */
void qg__payg_fill(const qg_tz *utc, qg_store_check *in);

/* Price of overage_milli points at price_micro per point, rounded up,
 * within QG_MONEY_MAX_MICRO. */
int64_t qg__overage_cost(int64_t overage_milli, int64_t price_micro);

/* Overage of a charge given the room its lifted windows had: max(0,
 * charged - headroom); 0 when headroom < 0 (nothing lifted). */
int64_t qg__overage_of(int64_t charged_milli, int64_t headroom_milli);

/* A member's spent amount, of the cap period that starts at start_ms. */
typedef struct qg__payg_spent {
    int64_t micro;
    int64_t start_ms;             /* 0: none yet */
} qg__payg_spent;

/* The amount of the cap period starting at start_ms (an amount of an
 * earlier period is dropped first). */
int64_t *qg__payg_spent_in(qg__payg_spent *s, int64_t start_ms);

/* Settle or restore: move the amount by delta (within
 * +-QG_MONEY_MAX_MICRO) when it is still the period the charge was made
 * in.  It saturates at the bound and then stays there against refunds. */
void qg__payg_spent_adjust(qg__payg_spent *s, int64_t start_ms,
                           int64_t delta);

#endif
