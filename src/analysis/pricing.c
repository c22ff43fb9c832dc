/* pricing.c - the public limits table and its verifiable statements
 * (PRODUCT.md 8 "Pricing"; docs/cli.md "pricing"), from the rules that
 * enforce them.
 *
 * Every figure comes from qg__analyze (the analytic part: the same
 * redeemable allowances, binding windows and effective multipliers that
 * `quotagate analyze` prints) and every sentence from the phrase builder
 * (src/core/phrase.c), which /v1/plans and the refusal messages use too.
 * A plan's statements are its claims, each next to its window and unit
 * (kind "window"), always followed by the effective figure over the
 * period (kind "effective"); a plan without claims still gets its
 * effective figure against the baseline.  The JSON is the one model; the
 * Markdown and HTML pages are written from it, so the three formats
 * cannot say different things.  No printing, no clock (the instant is a
 * parameter). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "analysis.h"
#include "fixed.h"
#include "phrase.h"
#include "pricing.h"
#include "rules.h"

#define TEXT_MAX 512

static json_t *milli_json(int64_t v)
{
    if (v % 1000 == 0)
        return json_integer(v / 1000);
    return json_real((double)v / 1000.0);
}

static json_t *scaled_json(int64_t v, int64_t scale)
{
    if (v % scale == 0)
        return json_integer(v / scale);
    return json_real((double)v / (double)scale);
}

static const char *type_name(qg_win_type t)
{
    static const char *const n[] = {"?", "rolling", "calendar", "session",
                                    "rate", "concurrency"};
    return t >= QG_WIN_ROLLING && t <= QG_WIN_CONCURRENCY ? n[t] : "?";
}

json_t *qg__pricing_statements(const qg_rules *r, const qg_analysis *a,
                               int plan)
{
    const qg_plan *p = &r->plans[plan];
    const qg_an_plan *ap = &a->plans[plan];
    const qg_an_plan *bp = &a->plans[a->baseline];
    json_t *st = json_array();
    char text[TEXT_MAX];
    for (int k = 0; k < p->nclaims; k++) {
        const qg_claim *c = &p->claims[k];
        const qg_plan *vs = &r->plans[c->vs_plan];
        if (qg__phrase_claim(r, c->multiplier_milli, vs->name,
                             qg__plan_find_window(p, c->window),
                             qg__plan_find_window(vs, c->window), text,
                             sizeof text) < 0)
            continue;                /* lint reports it (claim-unprintable) */
        json_array_append_new(st, json_pack(
            "{s:s, s:o, s:s, s:s, s:s}", "kind", "window", "multiplier",
            milli_json(c->multiplier_milli), "window", c->window, "vs",
            vs->name, "text", text));
    }
    if (plan != a->baseline && ap->effective_milli >= 0 &&
        qg__phrase_effective(r, ap->effective_milli, bp->name, a->period_ms,
                             ap->redeemable_milli, bp->redeemable_milli, text,
                             sizeof text) >= 0)
        json_array_append_new(st, json_pack(
            "{s:s, s:o, s:s?, s:s, s:s}", "kind", "effective", "multiplier",
            milli_json(ap->effective_milli), "window",
            ap->binding >= 0 ? ap->windows[ap->binding].name : NULL, "vs",
            bp->name, "text", text));
    return st;
}

json_t *qg__pricing_window_texts(const qg_rules *r, const qg_window_spec *w,
                                 int n)
{
    json_t *wins = json_array();
    char text[TEXT_MAX];
    for (int i = 0; i < n; i++) {
        if (qg__phrase_window(r, &w[i], text, sizeof text) < 0)
            text[0] = '\0';
        json_array_append_new(wins, json_pack(
            "{s:s, s:s, s:o, s:s}", "name", w[i].name, "type",
            type_name(w[i].type), "limit",
            w[i].type == QG_WIN_CONCURRENCY
                ? json_integer(w[i].limit_milli / 1000)
                : milli_json(w[i].limit_milli), "text", text));
    }
    return wins;
}

/* "what one unit buys of each model" */
static json_t *weights_json(const qg_rules *r)
{
    json_t *ws = json_array();
    const char *unit = qg_rules_unit(r);
    for (int i = 0; i < r->nmodels; i++) {
        const qg_model *m = &r->models[i];
        char pr[48], in[48], out[48], bin[48], bout[48], text[TEXT_MAX];
        /* tokens one point buys: 1000 tokens cost per_1k points, so one
         * point buys 1000 / per_1k tokens (rounded down) */
        int64_t tin = m->input_per_1k_micro > 0
                          ? (int64_t)(1000 * 1000000LL * 1000 /
                                      m->input_per_1k_micro)
                          : -1;
        int64_t tout = m->output_per_1k_micro > 0
                           ? (int64_t)(1000 * 1000000LL * 1000 /
                                       m->output_per_1k_micro)
                           : -1;
        qg__phrase_amount(m->per_request_milli, pr, sizeof pr);
        qg_fixed_format(m->input_per_1k_micro, 6, in, sizeof in);
        qg_fixed_format(m->output_per_1k_micro, 6, out, sizeof out);
        if (tin >= 0)
            qg__phrase_amount(tin - tin % 1000, bin, sizeof bin);
        else
            snprintf(bin, sizeof bin, "any number of");
        if (tout >= 0)
            qg__phrase_amount(tout - tout % 1000, bout, sizeof bout);
        else
            snprintf(bout, sizeof bout, "any number of");
        snprintf(text, sizeof text, "%s: %s per request, %s per 1,000 input "
                 "tokens, %s per 1,000 output tokens; beyond the per-request "
                 "charge, the %s buy %s input or %s output tokens each",
                 m->name, pr, in, out, unit, bin, bout);
        json_array_append_new(ws, json_pack(
            "{s:s, s:o, s:o, s:o, s:s}", "model", m->name, "per_request",
            milli_json(m->per_request_milli), "input_per_1k",
            scaled_json(m->input_per_1k_micro, 1000000), "output_per_1k",
            scaled_json(m->output_per_1k_micro, 1000000), "text", text));
    }
    return ws;
}

/* The upcoming changes the rules carry: every version of the chain whose
 * effective instant comes after at_ms (PRODUCT.md 8, "Versions over
 * time"), in order, with its announcement and its `changes` text. */
static json_t *changes_json(const qg_rules *chain, int64_t at_ms)
{
    json_t *ch = json_array();
    char eff[40], ann[40];
    for (const qg_rules *v = chain; v; v = qg_rules_next(v)) {
        if (v->effective_ms <= at_ms)
            continue;
        qg_iso8601_format(v->effective_ms, eff, sizeof eff);
        qg_iso8601_format(v->announced_ms, ann, sizeof ann);
        json_array_append_new(ch, json_pack(
            "{s:s, s:s, s:o, s:o}", "version", v->version, "effective", eff,
            "announced", v->announced_ms ? json_string(ann) : json_null(),
            "changes", v->changes ? json_string(v->changes) : json_null()));
    }
    return ch;
}

int qg__pricing(const qg_rules *chain, const char *baseline, int64_t at_ms,
                json_t **out, char *err, size_t errcap)
{
    /* the page of the version in force at at_ms (before the first
     * version's instant: the first, which is what comes) */
    const qg_rules *r = qg_rules_at(chain, at_ms) ? qg_rules_at(chain, at_ms)
                                                  : chain;
    qg_analyze_opts o = {baseline, 0, 0, NULL, NULL};
    qg_analysis *a = NULL;
    json_t *plans, *root;
    int rc;
    *out = NULL;
    if ((rc = qg__analyze(r, &o, &a, err, errcap)) != QG_OK)
        return rc;
    plans = json_array();
    for (int i = 0; i < r->nplans; i++) {
        const qg_plan *p = &r->plans[i];
        json_array_append_new(plans, json_pack(
            "{s:s, s:o, s:o, s:o, s:o}", "plan", p->name, "price_usd_month",
            p->price_micro >= 0 ? scaled_json(p->price_micro, 1000000)
                                : json_null(),
            "windows", qg__pricing_window_texts(r, p->windows, p->nwindows),
            "statements", qg__pricing_statements(r, a, i),
            "redeemable", a->plans[i].redeemable_milli >= 0
                              ? milli_json(a->plans[i].redeemable_milli)
                              : json_null()));
    }
    root = json_pack("{s:s, s:s, s:s, s:I, s:o, s:o, s:o}", "baseline",
                     r->plans[a->baseline].name, "unit", qg_rules_unit(r),
                     "rule_version", qg_rules_version(r), "period_s",
                     (json_int_t)(a->period_ms / 1000), "plans", plans,
                     "weights", weights_json(r), "changes",
                     changes_json(chain, at_ms));
    qg__analysis_free(a);
    if (!root) {
        snprintf(err, errcap, "out of memory");
        return QG_ENOMEM;
    }
    *out = root;
    return QG_OK;
}

/* ------------------------------------------------------------ pages */

typedef struct page {
    char *p;
    size_t len, cap;
    int err;
} page;

static void add(page *g, const char *s)
{
    size_t n = strlen(s);
    if (g->err)
        return;
    if (g->len + n + 1 > g->cap) {
        size_t c = g->cap ? g->cap * 2 : 4096;
        char *q;
        while (c < g->len + n + 1)
            c *= 2;
        if (c > (1u << 24) || !(q = realloc(g->p, c))) {
            g->err = 1;
            return;
        }
        g->p = q;
        g->cap = c;
    }
    memcpy(g->p + g->len, s, n + 1);
    g->len += n;
}

/* Text escaped for HTML (&, <, >, "), or as is for Markdown (the texts
 * are ours: a plan or model name with | is written as \|). */
static void add_text(page *g, const char *s, int html)
{
    char c[2] = {0, 0};
    for (; *s; s++) {
        if (html && *s == '&')
            add(g, "&amp;");
        else if (html && *s == '<')
            add(g, "&lt;");
        else if (html && *s == '>')
            add(g, "&gt;");
        else if (html && *s == '"')
            add(g, "&quot;");
        else if (!html && *s == '|')
            add(g, "\\|");
        else {
            c[0] = *s;
            add(g, c);
        }
    }
}

static void add_num(page *g, json_t *v)
{
    char b[48];
    if (json_is_integer(v))
        snprintf(b, sizeof b, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(b, sizeof b, "%.15g", json_real_value(v));
    else
        snprintf(b, sizeof b, "-");
    add(g, b);
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

char *qg__pricing_render(json_t *j, int format)
{
    page g = {NULL, 0, 0, 0};
    int html = format == QG_PRICING_HTML;
    json_t *p, *w, *s;
    size_t i, k;
    char plan[QG_NAME_MAX];

    if (html)
        add(&g, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta "
                "charset=\"utf-8\"><title>Plans and limits</title></head>"
                "<body>\n<h1>Plans and limits</h1>\n");
    else
        add(&g, "# Plans and limits\n");
    add(&g, html ? "<p>Rule version " : "\nRule version ");
    add_text(&g, jstr(j, "rule_version"), html);
    add(&g, "; usage is counted in ");
    add_text(&g, jstr(j, "unit"), html);
    add(&g, "; multipliers are against ");
    qg__phrase_plan(jstr(j, "baseline"), plan, sizeof plan);
    add_text(&g, plan, html);
    add(&g, html ? ".</p>\n" : ".\n");
    json_array_foreach(json_object_get(j, "plans"), i, p) {
        qg__phrase_plan(jstr(p, "plan"), plan, sizeof plan);
        add(&g, html ? "<section data-plan=\"" : "\n## ");
        if (html) {
            add_text(&g, jstr(p, "plan"), 1);
            add(&g, "\"><h2>");
        }
        add_text(&g, plan, html);
        if (json_is_number(json_object_get(p, "price_usd_month"))) {
            add(&g, " ($");
            add_num(&g, json_object_get(p, "price_usd_month"));
            add(&g, " a month)");
        }
        add(&g, html ? "</h2>\n<table><tr><th>window</th><th>limit</th>"
                       "</tr>\n"
                     : "\n\n| window | limit |\n|---|---|\n");
        json_array_foreach(json_object_get(p, "windows"), k, w) {
            add(&g, html ? "<tr><td>" : "| ");
            add_text(&g, jstr(w, "name"), html);
            add(&g, html ? "</td><td>" : " | ");
            add_text(&g, jstr(w, "text"), html);
            add(&g, html ? "</td></tr>\n" : " |\n");
        }
        add(&g, html ? "</table>\n" : "");
        if (json_array_size(json_object_get(p, "statements")))
            add(&g, html ? "<ul>\n" : "\n");
        json_array_foreach(json_object_get(p, "statements"), k, s) {
            add(&g, html ? "<li data-kind=\"" : "- ");
            if (html) {
                add(&g, jstr(s, "kind"));
                add(&g, "\">");
            }
            add_text(&g, jstr(s, "text"), html);
            add(&g, html ? "</li>\n" : "\n");
        }
        if (json_array_size(json_object_get(p, "statements")))
            add(&g, html ? "</ul>\n" : "");
        add(&g, html ? "</section>\n" : "");
    }
    add(&g, html ? "<h2>Weights</h2>\n<ul>\n" : "\n## Weights\n\n");
    json_array_foreach(json_object_get(j, "weights"), i, w) {
        add(&g, html ? "<li>" : "- ");
        add_text(&g, jstr(w, "text"), html);
        add(&g, html ? "</li>\n" : "\n");
    }
    add(&g, html ? "</ul>\n<h2>Upcoming changes</h2>\n"
                 : "\n## Upcoming changes\n\n");
    if (!json_array_size(json_object_get(j, "changes")))
        add(&g, html ? "<p>None announced.</p>\n" : "None announced.\n");
    json_array_foreach(json_object_get(j, "changes"), i, s) {
        add(&g, html ? "<p>Version " : "- Version ");
        add_text(&g, jstr(s, "version"), html);
        add(&g, " takes effect ");
        add_text(&g, jstr(s, "effective"), html);
        if (json_is_string(json_object_get(s, "announced"))) {
            add(&g, " (announced ");
            add_text(&g, jstr(s, "announced"), html);
            add(&g, ")");
        }
        if (json_is_string(json_object_get(s, "changes"))) {
            add(&g, ": ");
            add_text(&g, jstr(s, "changes"), html);
        }
        add(&g, html ? ".</p>\n" : ".\n");
    }
    if (html)
        add(&g, "</body></html>\n");
    if (g.err) {
        free(g.p);
        return NULL;
    }
    return g.p;
}
