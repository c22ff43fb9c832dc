/* cmd_analyze.c - `quotagate analyze`: render a qg_analysis.
 *
 * The figures come from src/analysis/analyze.c (window ratios, redeemable
 * allowance, binding window, the engine-driven simulation, claims); this
 * file only prints them: a block per plan for people, or the JSON of
 * PRODUCT.md section 6 with --json.  Numbers stay integers in milli until
 * they are printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "analysis.h"
#include "cli.h"

static const char *const type_names[] = {
    [QG_WIN_ROLLING] = "rolling",   [QG_WIN_CALENDAR] = "calendar",
    [QG_WIN_SESSION] = "session",   [QG_WIN_RATE] = "rate",
    [QG_WIN_CONCURRENCY] = "concurrency",
};

static const char *type_name(int t)
{
    return t > 0 && (size_t)t < sizeof type_names / sizeof type_names[0] &&
                   type_names[t] ? type_names[t] : "?";
}

/* "3.5x", or "-" when unknown. */
static const char *fx(int64_t milli, char *buf, size_t cap)
{
    size_t n;
    if (milli < 0)
        return "-";
    n = qg_fixed_format(milli, 3, buf, cap);
    if (n + 2 <= cap) {
        buf[n] = 'x';
        buf[n + 1] = '\0';
    }
    return buf;
}

static const char *num(int64_t milli, char *buf, size_t cap)
{
    if (milli < 0)
        return "unbounded";
    qg_fixed_format(milli, 3, buf, cap);
    return buf;
}

static const char *win_unit(const qg_rules *r, const qg_an_window *w)
{
    if (w->type == QG_WIN_CONCURRENCY)
        return "slots";
    return w->unit == QG_UNIT_REQUESTS ? "requests" : qg_rules_unit(r);
}

static void print_plan(const qg_rules *r, const qg_an_plan *p,
                       const char *per)
{
    char b1[48], b2[48], b3[48], lim[96];
    int j;

    if (p->price_micro >= 0)
        printf("\nplan %s ($%s/month)\n", p->name,
               num(p->price_micro / 1000, b1, sizeof b1));
    else
        printf("\nplan %s (no price)\n", p->name);
    printf("  %-14s %-12s %-22s %-7s %s\n", "window", "type", "limit",
           "ratio", "cap over period");
    for (j = 0; j < p->nwindows; j++) {
        const qg_an_window *w = &p->windows[j];
        snprintf(lim, sizeof lim, "%s %s", num(w->limit_milli, b1, sizeof b1),
                 win_unit(r, w));
        printf("  %-14s %-12s %-22s %-7s %s%s\n", w->name, type_name(w->type),
               lim, fx(w->ratio_milli, b2, sizeof b2),
               w->applies ? num(w->cap_milli, b3, sizeof b3)
                          : "(does not apply)",
               j == p->binding ? "  <- binding" : "");
    }
    printf("  min window ratio: %s\n", fx(p->min_ratio_milli, b1, sizeof b1));
    printf("  redeemable over %s: %s %s (binding: %s)\n", per,
           num(p->redeemable_milli, b1, sizeof b1), qg_rules_unit(r),
           p->binding >= 0 ? p->windows[p->binding].name : "none");
    printf("  effective multiplier: %s analytic", fx(p->effective_milli, b1,
                                                     sizeof b1));
    if (p->simulated)
        printf(", %s simulated (%s %s in %lld engine decisions)",
               fx(p->sim_effective_milli, b2, sizeof b2),
               num(p->sim_redeemable_milli, b3, sizeof b3), qg_rules_unit(r),
               (long long)p->sim_decisions);
    printf("\n");
    if (p->min_ratio_milli >= 0 && p->effective_milli >= 0 &&
        p->min_ratio_milli != p->effective_milli)
        printf("  note: min of window ratios (%s) differs from the "
               "redeemable ratio (%s)\n", fx(p->min_ratio_milli, b1, sizeof b1),
               fx(p->effective_milli, b2, sizeof b2));
    if (p->simulated && !p->agree)
        printf("  MISMATCH: analytic %s, simulated %s %s over %s\n",
               num(p->redeemable_milli, b1, sizeof b1),
               num(p->sim_redeemable_milli, b2, sizeof b2), qg_rules_unit(r), per);
    for (j = 0; j < p->nclaims; j++) {
        const qg_an_claim *c = &p->claims[j];
        printf("  claim %s vs %s on %s: %s: %s\n",
               fx(c->multiplier_milli, b1, sizeof b1), c->vs, c->window,
               !c->ok ? "NOT REDEEMABLE"
               : c->needs_disclosure ? "ok, NEEDS DISCLOSURE" : "ok",
               c->message);
    }
}

static int print_human(const qg_rules *r, const qg_analysis *a)
{
    char per[32], w[48], dur[32];
    int i;
    qg_duration_format(a->period_ms, per, sizeof per);
    qg_duration_format(a->hold_ms, dur, sizeof dur);
    printf("analyze %s (rules version %s): baseline %s, period %s, "
           "reference request %s %s held %s\n", qg_rules_path(r),
           qg_rules_version(r), a->plans[a->baseline].name, per,
           num(a->weight_milli, w, sizeof w), qg_rules_unit(r), dur);
    for (i = 0; i < a->nplans; i++)
        print_plan(r, &a->plans[i], per);
    return 0;
}

static json_t *milli_or_null(int64_t v)
{
    return v >= 0 ? qg__cli_json_milli(v) : json_null();
}

static json_t *plan_json(const qg_an_plan *p)
{
    json_t *wins = json_array(), *other = json_array(), *claims = json_array();
    int j;

    for (j = 0; j < p->nwindows; j++) {
        const qg_an_window *w = &p->windows[j];
        json_t *o = json_pack("{s:s, s:o, s:o, s:o}", "name", w->name,
                              "limit", qg__cli_json_milli(w->limit_milli), "cap",
                              milli_or_null(w->cap_milli), "ratio",
                              milli_or_null(w->ratio_milli));
        if (w->ratio_milli < 0)
            json_object_del(o, "ratio");
        json_array_append_new(w->ratio_milli >= 0 ? wins : other, o);
    }
    for (j = 0; j < p->nclaims; j++) {
        const qg_an_claim *c = &p->claims[j];
        json_array_append_new(
            claims,
            json_pack("{s:o, s:s, s:s, s:s?, s:b, s:b, s:o, s:s}",
                      "multiplier", qg__cli_json_milli(c->multiplier_milli),
                      "window", c->window, "vs", c->vs, "unit", c->unit,
                      "ok", c->ok, "needs_disclosure", c->needs_disclosure,
                      "effective_multiplier", milli_or_null(c->effective_milli),
                      "message", c->message));
    }
    return json_pack(
        "{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:s?, s:o, s:o, s:b, s:o}",
        "plan", p->name, "windows", wins, "other_windows", other,
        "min_ratio", milli_or_null(p->min_ratio_milli), "redeemable",
        milli_or_null(p->redeemable_milli), "effective_multiplier",
        milli_or_null(p->effective_milli), "simulated_redeemable",
        p->simulated ? qg__cli_json_milli(p->sim_redeemable_milli) : json_null(),
        "binding_window", p->binding >= 0 ? p->windows[p->binding].name : NULL,
        "simulated_multiplier",
        p->simulated ? milli_or_null(p->sim_effective_milli) : json_null(),
        "simulated_decisions", json_integer(p->sim_decisions),
        "analytic_simulated_agree", p->simulated && p->agree, "claims",
        claims);
}

static int print_json(const qg_rules *r, const qg_analysis *a)
{
    json_t *plans = json_array(), *root;
    int i;
    for (i = 0; i < a->nplans; i++)
        json_array_append_new(plans, plan_json(&a->plans[i]));
    root = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "rules_version",
                     qg_rules_version(r), "baseline",
                     a->plans[a->baseline].name, "period_s",
                     (json_int_t)(a->period_ms / 1000), "unit", qg_rules_unit(r),
                     "reference_weight", qg__cli_json_milli(a->weight_milli),
                     "plans", plans);
    return qg__json_emit(root, 1);
}

int qg__cmd_analyze(const qg_cli_args *args, qg_rules *chain)
{
    qg_analyze_opts o = { args->baseline, 0, 1, NULL, NULL };
    qg_analysis *a = NULL;
    const qg_rules *r;
    char err[1024], when[40];
    int64_t at;
    int rc = QG_EXIT_USAGE;

    /* the version in force at --at (default now) is the one analysed */
    if (args->at ? qg_iso8601_parse(args->at, &at) < 0
                 : (at = (int64_t)time(NULL) * 1000) < 0) {
        fprintf(stderr, "quotagate analyze: --at: expected an ISO 8601 time "
                "such as 2027-01-15T00:00:00Z, got \"%s\"\n", args->at);
        goto done;
    }
    if (!(r = qg_rules_at(chain, at))) {
        qg_iso8601_format(at, when, sizeof when);
        fprintf(stderr, "quotagate analyze: no rules version of %s is in "
                "force at %s (the first, \"%s\", takes effect later)\n",
                qg_rules_path(chain), when, qg_rules_version(chain));
        goto done;
    }

    if (args->period &&
        (qg_duration_parse(args->period, strlen(args->period), &o.period_ms) <
             0 || o.period_ms <= 0 || o.period_ms > QG_DURATION_MAX_MS)) {
        fprintf(stderr, "quotagate analyze: --period: expected a duration "
                "such as 7d or 30d, at most 36500d, got \"%s\"\n",
                args->period);
        goto done;
    }
    if (qg__analyze(r, &o, &a, err, sizeof err) != QG_OK) {
        fprintf(stderr, "quotagate analyze: %s\n", err);
        goto done;
    }
    if ((args->json ? print_json(r, a) : print_human(r, a)) == 0)
        rc = QG_EXIT_OK;
done:
    qg__analysis_free(a);
    qg_rules_free(chain);
    return rc;
}
