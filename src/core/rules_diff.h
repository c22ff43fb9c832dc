/* rules_diff.h - the changes from one rules version to the next
 * (rules_diff.c): what lint's change-without-notice checks and what
 * /v1/plans and /v1/usage list as upcoming.  Not part of the public API. */
#ifndef QG_RULES_DIFF_H
#define QG_RULES_DIFF_H

#include "rules.h"

#define QG_RULES_CHANGES_MAX 4096  /* changes listed between two versions */

/* One change.  kind: "limit", "rate", "burst", "concurrency" (a window's
 * amount), "length", "period" (how long a window spreads its limit),
 * "type", "window-added", "window-removed" (a plan's or org's windows),
 * "plan-added", "plan-removed", "weight", "model-added", "model-removed".
 * plan (or org) names the owner, empty for a model's change; item names
 * the window or model; from and to say the values in words ("none" for
 * what is absent). */
typedef struct qg_rules_change {
    const char *kind;          /* static */
    int less;                  /* gives a subject less */
    char plan[QG_NAME_MAX];
    char org[QG_NAME_MAX];
    char item[QG_NAME_MAX];
    char from[128], to[128];
} qg_rules_change;

/* The changes from `was` to `now` (one version each): plans in now's
 * order, then removed plans, then orgs, then models.  Returns QG_OK with
 * *out (caller frees; NULL when there are none) of *nout, or QG_ENOMEM. */
int qg__rules_diff(const qg_rules *was, const qg_rules *now,
                   qg_rules_change **out, int *nout);

/* Does change c touch a member of plan `plan` in org `org` (NULL: none)?
 * A model's change touches every plan. */
int qg__rules_change_touches(const qg_rules_change *c, const char *plan,
                             const char *org);

/* Was version r announced at least its notice before it takes effect? */
int qg__rules_notice_ok(const qg_rules *r);

#endif
