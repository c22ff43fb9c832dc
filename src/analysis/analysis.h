/* analysis.h - what the rules promise, computed and proven (PRODUCT.md 6).
 *
 * Library code behind `quotagate analyze`, `lint` and `simulate`: no
 * printing and no clock.  qg__analyze() derives, for every plan against a
 * baseline plan over a period T, the per-window quota ratios, the
 * allowance a saturating client can redeem (bounded by every window at
 * once), the binding window and the effective multiplier; it then drives
 * the real engine on a virtual clock to measure the same figure, and
 * checks every claim.  qg__lint() turns the pre-release checklist into
 * findings.  qg__trace_parse() reads a usage trace (CSV) from a buffer.
 * Every number is an integer: quantities and ratios in milli. */
#ifndef QG_ANALYSIS_H
#define QG_ANALYSIS_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"

/* Fixed origin of simulations: 2026-01-05T00:00:00Z, a Monday 00:00 UTC. */
#define QG_SIM_ORIGIN_MS 1767571200000LL

/* ------------------------------------------------------------ analyze */

/* Supplies a fresh copy of the rules for one simulation (the engine takes
 * ownership of it).  Returns NULL writing why into err. */
typedef qg_rules *(*qg_rules_loader)(void *ud, char *err, size_t errcap);

typedef struct qg_analyze_opts {
    const char *baseline;     /* plan name; NULL = the cheapest plan */
    int64_t period_ms;        /* 0 = rules' analysis.period, else longest */
    int simulate;             /* also drive the engine */
    qg_rules_loader load;     /* NULL = qg_rules_load(rules->path) */
    void *load_ud;
} qg_analyze_opts;

typedef struct qg_an_window {
    const char *name;         /* owned by the rules */
    qg_win_type type;
    qg_unit unit;
    int64_t limit_milli;
    int64_t base_limit_milli; /* same-named baseline window; -1 none */
    int64_t ratio_milli;      /* limit / base limit; -1 when no ratio */
    int applies;              /* counts the reference request */
    int64_t cap_milli;        /* weight it lets through over T; -1 = n/a */
} qg_an_window;

typedef struct qg_an_claim {
    int64_t multiplier_milli;
    const char *window;       /* owned by the rules */
    const char *unit;         /* NULL when the claim names none */
    const char *vs;           /* plan the claim compares with */
    int ok;                   /* the window ratio redeems the claim */
    int needs_disclosure;     /* above the effective figure, undisclosed */
    int64_t effective_milli;  /* effective multiplier vs `vs`; -1 unknown */
    char message[320];
} qg_an_claim;

typedef struct qg_an_plan {
    const char *name;         /* owned by the rules */
    int index;
    int64_t price_micro;      /* -1 unset */
    int nwindows;
    qg_an_window windows[QG_MAX_PLAN_WINDOWS];
    int64_t min_ratio_milli;  /* -1 when no window shares a name */
    int64_t redeemable_milli; /* -1 = unbounded */
    int binding;              /* index in windows, -1 */
    int64_t effective_milli;  /* redeemable / baseline's; -1 unknown */
    int64_t t0_ms;            /* where the period starts (a reset) */
    int simulated;            /* the simulation ran */
    int64_t sim_redeemable_milli;
    int64_t sim_effective_milli; /* -1 unknown */
    int64_t sim_decisions;    /* checks made */
    int agree;                /* analytic == simulated redeemable */
    int nclaims;
    qg_an_claim *claims;
} qg_an_plan;

typedef struct qg_analysis {
    int baseline;             /* plan index */
    int64_t period_ms;
    int64_t weight_milli;     /* the reference request's weight */
    int model;                /* its model index, -1 weight-only */
    int64_t hold_ms;          /* how long it holds a concurrency slot */
    int nplans;
    qg_an_plan *plans;
} qg_analysis;

/* Analyse every plan.  Returns 0 and *out (free with qg__analysis_free), or
 * an error with a message in err (unknown baseline, simulation failure).
 * The analysis borrows names from `r`: it must not outlive the rules. */
int qg__analyze(const qg_rules *r, const qg_analyze_opts *opts,
               qg_analysis **out, char *err, size_t errcap);
void qg__analysis_free(qg_analysis *a);

/* The period used when neither the caller nor the rules set one: the
 * longest window of any plan (calendar day 1d, week 7d, month 30d). */
int64_t qg__analysis_default_period(const qg_rules *r);

/* The saturating-client simulation of one plan alone: admitted weight over
 * [t0, t0 + period) when driving an engine built on `rules` (ownership
 * passes).  Returns 0 or an error with a message in err. */
int qg__simulate_plan(qg_rules *rules, const char *plan, int64_t t0_ms,
                     int64_t period_ms, int64_t *admitted_milli,
                     int64_t *decisions, char *err, size_t errcap);

/* ratio in milli of a / b (b > 0), rounded down, saturating. */
int64_t qg__ratio_milli(int64_t a, int64_t b);

/* --------------------------------------------------------------- lint */

typedef struct qg_finding {
    const char *code;         /* static, e.g. "claim-needs-disclosure" */
    char plan[QG_NAME_MAX];   /* "" when not about a plan */
    char window[QG_NAME_MAX]; /* "" when not about a window (or the model
                                 of a change-without-notice) */
    char version[QG_NAME_MAX]; /* the rules version it is about */
    char message[384];
} qg_finding;

typedef struct qg_lint_result {
    int nfindings;
    qg_finding *findings;
} qg_lint_result;

/* Run the pre-release checklist on every version of `r` (each finding
 * names its version); `previous` (one version, may be NULL) is the rule
 * set currently in force, to which the first version is compared for
 * change-without-notice as each later version is to the one before it.
 * Returns 0 with *out filled (free with qg__lint_free), or an error. */
int qg__lint(const qg_rules *r, const qg_rules *previous, qg_lint_result *out,
            char *err, size_t errcap);
void qg__lint_free(qg_lint_result *res);

/* -------------------------------------------------------------- trace */

typedef struct qg_trace_row {
    int line;                 /* 1-based line in the file */
    int64_t t_ms;             /* from the trace's start */
    char *subject;
    char *request_id;         /* NULL when absent or empty */
    char *model;              /* NULL: a weight row */
    int64_t input_tokens, output_tokens;
    int64_t weight_milli;
} qg_trace_row;

typedef struct qg_trace {
    int nrows;
    qg_trace_row *rows;
} qg_trace;

/* Parse CSV text (header row first).  `name` is used in messages, which
 * read "name:line: column: what was expected".  Returns 0 and *out (free
 * with qg__trace_free), QG_EINVAL on malformed input, QG_ENOMEM. */
int qg__trace_parse(const char *buf, size_t len, const char *name,
                   qg_trace **out, char *err, size_t errcap);
void qg__trace_free(qg_trace *t);

#endif
