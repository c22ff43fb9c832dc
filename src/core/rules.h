/* rules.h - the compiled, immutable rule set (PRODUCT.md sections 2, 8).
 *
 * A qg_rules is produced by qg__rules_parse() from the YAML text of a rules
 * file (rules_yaml.c) and never changes afterwards; the engine holds it by
 * pointer and a reload swaps in a new one.  A file of several documents
 * is a chain of versions in the order they take effect: the head (the
 * first document) owns the rest through `next`, and qg_rules_at() picks
 * the version in force at an instant.  Every quantity is an integer:
 * limits and weights in milli-units (1 point or 1 request = 1000), weight
 * coefficients in micro-points per 1000 tokens, times in ms, prices in
 * micro-dollars.  All strings and arrays are owned by the qg_rules. */
#ifndef QG_RULES_H
#define QG_RULES_H

#include <stddef.h>
#include <stdint.h>
#include "calendar.h"
#include "quotagate.h"
#include "tz.h"

/* QG_MAX_MODELS (models are a bit mask in window scopes),
 * QG_MAX_PLAN_WINDOWS, QG_NAME_MAX, qg_win_type and qg_unit are public
 * (quotagate.h). */

typedef enum qg_policy {
    QG_POLICY_NONE = 0,     /* window without its own policy: the plan's */
    QG_POLICY_REJECT,
    QG_POLICY_QUEUE,
    QG_POLICY_DOWNGRADE,
    QG_POLICY_PAYG
} qg_policy;

typedef struct qg_overage {
    qg_policy policy;
    int64_t max_wait_ms;          /* queue */
    int32_t queue_size;           /* queue: bound on held requests */
    int to_model;                 /* downgrade: model index, -1 unset */
    int64_t price_per_unit_micro; /* payg: micro-USD per unit (point) */
    int64_t spending_cap_micro;   /* payg: micro-USD per month, 0 = none */
} qg_overage;

typedef struct qg_window_spec {
    char *name;
    qg_win_type type;
    qg_unit unit;
    int64_t limit_milli;      /* > 0; concurrency: slots * 1000 */
    int64_t length_ms;        /* rolling, session: L; rate: per */
    int64_t burst_milli;      /* rate: bucket capacity (default = limit) */
    int64_t precision_ms;     /* rolling: 0 = exact, else slice length */
    uint32_t max_entries;     /* rolling exact: log cap before coalescing */
    int64_t lease_ttl_ms;     /* concurrency */
    qg_calendar_spec cal;     /* calendar */
    uint64_t model_mask;      /* 0 = every model; else bit i = model i */
    qg_overage overage;       /* policy NONE unless the window sets one */
    int line;                 /* where it was defined, for messages */
} qg_window_spec;

typedef struct qg_claim {
    int64_t multiplier_milli; /* 20 -> 20000 */
    int vs_plan;              /* plan index */
    char *window;             /* window name (in both plans) */
    char *unit;               /* unit named by the claim, or NULL */
    int disclose_effective;   /* published together with the effective figure */
    int line;
} qg_claim;

typedef struct qg_plan {
    char *name;
    int index;
    int64_t price_micro;      /* USD per month, micro-dollars; -1 unset */
    qg_window_spec *windows;  /* includes the concurrency window, if any */
    int nwindows;
    int64_t concurrency;      /* slots, 0 = unset */
    int64_t lease_ttl_ms;     /* how long an unsettled reservation lives
                                 (its concurrency lease too) */
    qg_overage overage;
    qg_claim *claims;
    int nclaims;
    /* payg, derived at compile (qg__rules_payg): windows the policy lifts,
     * bit i = windows[i]; the policy whose price and cap apply (the
     * plan's, else its first window with its own payg), NULL none. */
    uint32_t payg_mask;
    const qg_overage *payg;
    int line;
} qg_plan;

typedef struct qg_org_spec {
    char *name;
    int index;
    qg_window_spec *windows;
    int nwindows;
    /* payg lifts org window i when it has its own payg (own_mask) or has
     * no policy and the member's plan's is payg (inherit_mask); payg is
     * the first own payg policy, NULL none. */
    uint32_t payg_own_mask, payg_inherit_mask;
    const qg_overage *payg;
    int line;
} qg_org_spec;

typedef struct qg_model {
    char *name;
    int index;
    int64_t per_request_milli;  /* points * 1000 */
    int64_t input_per_1k_micro; /* points per 1000 input tokens * 1e6 */
    int64_t output_per_1k_micro;
    int64_t changed_ms;         /* when the model was last changed, 0 unset */
    char *upstream;             /* "http[s]://HOST[:PORT][/PREFIX]" its
                                   requests go to, NULL: --upstream (only
                                   the shape is checked here, url.h) */
    int line;
} qg_model;

typedef struct qg_subject_spec {
    char *name;
    int plan;                /* plan index */
    int org;                 /* org index, -1 none */
    int64_t billing_anchor_ms; /* 0 = none */
} qg_subject_spec;

typedef struct qg_analysis_spec {
    int model;               /* reference request: model index, -1 = weight */
    int64_t input_tokens, output_tokens;
    int64_t weight_milli;    /* used when model == -1 */
    int64_t duration_ms;     /* how long one request holds a slot */
    int64_t period_ms;       /* 0 = the longest window */
} qg_analysis_spec;

/* The counters' store as the rules want it run (PRODUCT.md 5.1 point 4):
 * how long a call may take before the store counts as down, and what a
 * gateway does then. */
typedef enum qg_store_down {
    QG_DOWN_LOCAL = 0,       /* conservative local limits (the default) */
    QG_DOWN_CLOSED           /* refuse: 503 store_unavailable */
} qg_store_down;

typedef struct qg_store_spec {
    int64_t timeout_ms;      /* default 100 */
    qg_store_down down;
    int64_t share_milli;     /* local: this instance's fraction of what
                                each window has left, 1..1000 (default 500) */
} qg_store_spec;

/* The gateway's own reconciliation (PRODUCT.md 5.2, docs/reconcile.md):
 * `reconcile: { every: 5m, tolerance: 0, repair: false }`. */
typedef struct qg_reconcile_spec {
    int64_t every_ms;        /* 0: no periodic run (the block is absent) */
    int64_t tolerance_milli; /* |drift| up to this is not reported */
    int repair;              /* repair what a periodic run finds */
} qg_reconcile_spec;

/* Notifications (PRODUCT.md 7, docs/rules.md "notifications"): the
 * fractions of a window's limit that send quota.threshold, whether
 * quota.forecast is sent, and where events go.  A webhook's secret is not
 * part of the rules: secret_env names the environment variable the
 * gateway reads it from at start and on every reload (notify.c). */
#define QG_NOTIFY_MAX_THRESHOLDS 8
#define QG_NOTIFY_MAX_WEBHOOKS 8
#define QG_NOTIFY_URL_MAX 512     /* bytes of a webhook URL, with its NUL */
#define QG_NOTIFY_ENV_MAX 128     /* bytes of secret_env, with its NUL */

typedef struct qg_webhook_spec {
    char *url;               /* "http[s]://HOST[:PORT][/PATH]" (url.h) */
    char *secret_env;        /* [A-Za-z_][A-Za-z0-9_]* */
    int line;
} qg_webhook_spec;

typedef struct qg_notify_spec {
    int64_t thresholds_milli[QG_NOTIFY_MAX_THRESHOLDS]; /* ascending,
                                unique, in (0, 1000] */
    int nthresholds;
    int forecast;            /* quota.forecast events (default 0) */
    qg_webhook_spec *webhooks;
    int nwebhooks;           /* 0: the block is absent (nothing is sent) */
} qg_notify_spec;

typedef struct qg_rules {
    char *path;              /* file it came from, for messages */
    char *version;           /* rule version id */
    char *unit;              /* "weight points" */
    char *weights_version;
    int64_t calibrated_ms;
    int64_t effective_ms;    /* 0 unset: in force from the beginning
                                (only the first version may omit it) */
    int64_t announced_ms;    /* 0 unset */
    int64_t notice_ms;       /* required notice for a change that gives
                                less (default 30d, else the previous
                                version's) */
    char *changes;           /* what this version changes, in words; NULL */
    int line;                /* where its document starts in the file */
    struct qg_rules *next;   /* the version after this one, NULL last;
                                owned (qg_rules_free frees the chain) */
    qg_model *models;
    int nmodels;
    qg_plan *plans;
    int nplans;
    qg_org_spec *orgs;
    int norgs;
    int *org_by_name;        /* org indices sorted by name (lookups of
                                tens of thousands of orgs), NULL = scan */
    qg_subject_spec *subjects;
    int nsubjects;
    int *subject_by_name;    /* likewise for subjects */
    int default_plan;        /* -1 none: unknown subjects are refused */
    qg_analysis_spec analysis;
    qg_store_spec store;
    qg_reconcile_spec reconcile;
    qg_notify_spec notify;   /* notifications: (rules_notify.c) */
    qg_tz **zones;           /* owned zones referenced by calendar specs */
    int nzones;
    int64_t forecast_basis_ms; /* `forecast: { basis: 7d }` (default 7
                                  days; docs/forecast.md) */
} qg_rules;

/* Where and why a rules file is unusable. */
typedef struct qg_diag {
    char path[256];
    int line, column;        /* 1-based; 0 when not tied to a place */
    char message[512];
} qg_diag;

/* Supplies a time zone by IANA name.  Returns a new zone the rules will own,
 * or NULL writing why into err. */
typedef qg_tz *(*qg_tz_resolver)(const char *name, void *ud, char *err,
                                 size_t errcap);

/* Parse and validate YAML rules from a buffer.  On success returns 0 and
 * *out (caller frees with qg_rules_free).  On failure returns QG_ERULES and
 * fills diag (path:line:column and what was expected).  `path` is used only
 * in messages.  No I/O happens here except through tzr. */
int qg__rules_parse(const char *text, size_t len, const char *path,
                   qg_tz_resolver tzr, void *tzud, qg_rules **out,
                   qg_diag *diag);
void qg_rules_free(qg_rules *r);

/* Sort the org (subject) index by name: the parser calls them once orgs
 * (subjects) are read; without them, lookups scan.  0 or QG_ENOMEM. */
int qg__rules_index_orgs(qg_rules *r);
int qg__rules_index_subjects(qg_rules *r);

/* qg__rules_payg: payg.h. */

/* rules_notify.c: the `notifications:` mapping n into r->notify (the
 * compiler's context is rules_compile.h's); freeing it. */
void qg__rules_notify_free(qg_notify_spec *n);

/* Detach the version named `version` from the chain `head` (owned: the
 * rest is freed) and return it alone, or NULL when no version has that
 * name.  For analyses of one version in isolation. */
qg_rules *qg__rules_take_version(qg_rules *head, const char *version);

/* Formats "path:line:col: message" into buf. */
void qg__diag_format(const qg_diag *d, char *buf, size_t cap);

/* Lookups by name; -1 when absent. */
int qg__rules_find_plan(const qg_rules *r, const char *name);
int qg__rules_find_org(const qg_rules *r, const char *name);
/* qg_rules_find_model and qg_rules_find_subject are public. */
const qg_window_spec *qg__plan_find_window(const qg_plan *p, const char *name);

/* Does window w apply to a charge for model index m (-1 = no model)? */
static inline int qg__window_applies(const qg_window_spec *w, int model)
{
    if (w->model_mask == 0)
        return 1;
    return model >= 0 && (w->model_mask >> model) & 1;
}

#endif
