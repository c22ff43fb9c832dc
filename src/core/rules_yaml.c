/* rules_yaml.c - compile the YAML text of a rules file into a qg_rules.
 *
 * This file holds the top level of the schema of PRODUCT.md section 2:
 * weights and models, plans and their claims, orgs, subjects, the analysis
 * defaults, and qg__rules_parse, which loads the document and walks it.
 * Windows, calendar periods and overage policies are in rules_windows.c;
 * reading the document itself (syntax pass, key tables, scalar readers,
 * error positions) is in yaml_doc.c.  Every mapping's accepted keys are
 * declared once, as a table, which drives both validation and the
 * "expected one of ..." text.  Every error names the dotted path, the
 * 1-based line and column of the offending node and what was expected.
 * No I/O happens here except through the caller's time-zone resolver. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "civil.h"
#include "fixed.h"
#include "forecast.h"
#include "payg.h"
#include "quotagate.h"
#include "rules_compile.h"
#include "url.h"

/* ------------------------------------------------------- references */

static int p_plan_ref(qg__rctx *c, yaml_node_t *n, const char *path, int *out)
{
    char list[QG_Y_LISTCAP];
    if (qg__y_need_scalar(&c->y, n, path, "a plan name") < 0)
        return -1;
    *out = qg__rules_find_plan(c->r, qg__y_str(n));
    if (*out >= 0)
        return 0;
    qg__y_join_names(list, sizeof list, c->r->plans, sizeof(qg_plan),
                     offsetof(qg_plan, name), c->r->nplans);
    return qg__y_fail(&c->y, n, path, "unknown plan \"%s\" (plans are: %s)",
                      qg__y_str(n), list);
}

static int p_org_ref(qg__rctx *c, yaml_node_t *n, const char *path, int *out)
{
    char list[QG_Y_LISTCAP];
    if (qg__y_need_scalar(&c->y, n, path, "an org name") < 0)
        return -1;
    *out = qg__rules_find_org(c->r, qg__y_str(n));
    if (*out >= 0)
        return 0;
    if (c->r->norgs == 0)
        return qg__y_fail(&c->y, n, path,
                          "unknown org \"%s\" (no orgs are defined)",
                          qg__y_str(n));
    qg__y_join_names(list, sizeof list, c->r->orgs, sizeof(qg_org_spec),
                     offsetof(qg_org_spec, name), c->r->norgs);
    return qg__y_fail(&c->y, n, path, "unknown org \"%s\" (orgs are: %s)",
                      qg__y_str(n), list);
}

/* ------------------------------------------------------------- plans */

/* concurrency and lease_ttl of a plan or org mapping. */
static int c_concurrency(qg__rctx *c, yaml_node_t *m, const char *path,
                         int64_t *conc, int64_t *ttl)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;
    *conc = 0;
    *ttl = 15 * 60000LL;
    if ((v = qg__y_get(&c->y, m, "concurrency"))) {
        qg__y_path_key(sub, path, "concurrency");
        if (qg__y_int(&c->y, v, sub, 1, QG_AMOUNT_MAX_MILLI / QG_MILLI,
                      conc) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, m, "lease_ttl"))) {
        qg__y_path_key(sub, path, "lease_ttl");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, ttl) < 0)
            return -1;
    }
    return 0;
}

static const qg__ykey plan_keys[] = {
    { "price", QG_Y_ALL },       { "windows", QG_Y_ALL },
    { "concurrency", QG_Y_ALL }, { "lease_ttl", QG_Y_ALL },
    { "overage", QG_Y_ALL },     { "claims", QG_Y_ALL },
};

static const qg__ykey claim_keys[] = {
    { "multiplier", QG_Y_ALL }, { "vs", QG_Y_ALL },
    { "window", QG_Y_ALL },     { "unit", QG_Y_ALL },
    { "disclose_effective", QG_Y_ALL },
};

static int c_plan(qg__rctx *c, yaml_node_t *m, const char *path, qg_plan *p)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;
    int64_t ttl;

    if (qg__y_check_map(&c->y, m, path, plan_keys, QG_Y_NKEYS(plan_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    p->price_micro = -1;
    p->overage.policy = QG_POLICY_REJECT;
    p->overage.to_model = -1;
    p->overage.queue_size = 64;
    if ((v = qg__y_get(&c->y, m, "price"))) {
        qg__y_path_key(sub, path, "price");
        if (qg__rc_usd_month(c, v, sub, &p->price_micro) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, m, "overage"))) {
        qg__y_path_key(sub, path, "overage");
        if (qg__rc_overage(c, v, sub, &p->overage) < 0)
            return -1;
    }
    if (c_concurrency(c, m, path, &p->concurrency, &ttl) < 0)
        return -1;
    p->lease_ttl_ms = ttl;
    qg__y_path_key(sub, path, "windows");
    return qg__rc_windows(c, m, qg__y_get(&c->y, m, "windows"), sub,
                          p->concurrency, ttl, &p->windows, &p->nwindows);
}

static int c_claim(qg__rctx *c, yaml_node_t *m, const char *path, qg_plan *p,
                   qg_claim *cl)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;
    int b;
    const qg_plan *vs;

    if (qg__y_check_map(&c->y, m, path, claim_keys, QG_Y_NKEYS(claim_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    cl->line = (int)m->start_mark.line + 1;
    if (qg__y_need_key(&c->y, m, path, "multiplier", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "multiplier");
    if (qg__y_decimal(&c->y, v, sub, 3, QG_Y_POSITIVE,
                      &cl->multiplier_milli) < 0)
        return -1;
    if (qg__y_need_key(&c->y, m, path, "vs", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "vs");
    if (p_plan_ref(c, v, sub, &cl->vs_plan) < 0)
        return -1;
    vs = &c->r->plans[cl->vs_plan];
    if (qg__y_need_key(&c->y, m, path, "window", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "window");
    if (qg__y_name(&c->y, v, sub, &cl->window) < 0)
        return -1;
    if (!qg__plan_find_window(p, cl->window))
        return qg__y_fail(&c->y, v, sub, "plan %s has no window \"%s\"",
                          p->name, cl->window);
    if (!qg__plan_find_window(vs, cl->window))
        return qg__y_fail(&c->y, v, sub, "plan %s has no window \"%s\"",
                          vs->name, cl->window);
    if ((v = qg__y_get(&c->y, m, "unit"))) {
        qg__y_path_key(sub, path, "unit");
        if (qg__y_string(&c->y, v, sub, &cl->unit) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, m, "disclose_effective"))) {
        qg__y_path_key(sub, path, "disclose_effective");
        if (qg__y_bool(&c->y, v, sub, &b) < 0)
            return -1;
        cl->disclose_effective = b;
    }
    return 0;
}

static int c_claims(qg__rctx *c, yaml_node_t *n, const char *path, qg_plan *p)
{
    char sub[QG_Y_PATHCAP], g[80];
    int i, cnt;

    if (n->type != YAML_SEQUENCE_NODE)
        return qg__y_fail(&c->y, n, path, "expected a list of claims, got %s",
                          qg__y_got(n, g, sizeof g));
    cnt = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt == 0)
        return 0;
    p->claims = calloc((size_t)cnt, sizeof *p->claims);
    if (!p->claims)
        return qg__y_oom(&c->y, n);
    p->nclaims = cnt;
    for (i = 0; i < cnt; i++) {
        qg__y_path_idx(sub, path, i);
        if (c_claim(c, qg__y_node(&c->y, n->data.sequence.items.start[i]), sub,
                    p, &p->claims[i]) < 0)
            return -1;
    }
    return 0;
}

/* Names first (claims may name later plans), then bodies, then claims. */
static int c_plans(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP], sub2[QG_Y_PATHCAP];
    int cnt, i;
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    yaml_node_t *v;

    cnt = qg__y_check_names(&c->y, n, path, 1, 1 << 16);
    if (cnt < 0)
        return -1;
    c->r->plans = calloc((size_t)cnt, sizeof *c->r->plans);
    if (!c->r->plans)
        return qg__y_oom(&c->y, n);
    c->r->nplans = cnt;
    for (i = 0; i < cnt; i++) {
        yaml_node_t *k = qg__y_node(&c->y, pairs[i].key);
        c->r->plans[i].index = i;
        c->r->plans[i].line = (int)k->start_mark.line + 1;
        if (!(c->r->plans[i].name = strdup(qg__y_str(k))))
            return qg__y_oom(&c->y, k);
    }
    for (i = 0; i < cnt; i++) {
        qg__y_path_key(sub, path, c->r->plans[i].name);
        if (c_plan(c, qg__y_node(&c->y, pairs[i].value), sub,
                   &c->r->plans[i]) < 0)
            return -1;
    }
    for (i = 0; i < cnt; i++) {
        qg__y_path_key(sub, path, c->r->plans[i].name);
        if ((v = qg__y_get(&c->y, qg__y_node(&c->y, pairs[i].value),
                           "claims"))) {
            qg__y_path_key(sub2, sub, "claims");
            if (c_claims(c, v, sub2, &c->r->plans[i]) < 0)
                return -1;
        }
    }
    return 0;
}

/* -------------------------------------------------------------- orgs */

static const qg__ykey org_keys[] = {
    { "windows", QG_Y_ALL }, { "concurrency", QG_Y_ALL },
    { "lease_ttl", QG_Y_ALL },
};

static int c_orgs(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP], sub2[QG_Y_PATHCAP];
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    int cnt, i;
    int64_t conc, ttl;

    cnt = qg__y_check_names(&c->y, n, path, 0, 1 << 16);
    if (cnt <= 0)
        return cnt;
    c->r->orgs = calloc((size_t)cnt, sizeof *c->r->orgs);
    if (!c->r->orgs)
        return qg__y_oom(&c->y, n);
    c->r->norgs = cnt;
    for (i = 0; i < cnt; i++) {
        yaml_node_t *k = qg__y_node(&c->y, pairs[i].key),
                    *m = qg__y_node(&c->y, pairs[i].value);
        qg_org_spec *o = &c->r->orgs[i];
        o->index = i;
        o->line = (int)k->start_mark.line + 1;
        if (!(o->name = strdup(qg__y_str(k))))
            return qg__y_oom(&c->y, k);
        qg__y_path_key(sub, path, o->name);
        if (qg__y_check_map(&c->y, m, sub, org_keys, QG_Y_NKEYS(org_keys),
                            QG_Y_ALL, "") < 0 ||
            c_concurrency(c, m, sub, &conc, &ttl) < 0)
            return -1;
        qg__y_path_key(sub2, sub, "windows");
        if (qg__rc_windows(c, m, qg__y_get(&c->y, m, "windows"), sub2, conc,
                           ttl, &o->windows, &o->nwindows) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ weights */

static const qg__ykey weights_keys[] = {
    { "version", QG_Y_ALL }, { "calibrated", QG_Y_ALL },
    { "models", QG_Y_ALL },
};

static const qg__ykey model_keys[] = {
    { "per_request", QG_Y_ALL },   { "input_per_1k", QG_Y_ALL },
    { "output_per_1k", QG_Y_ALL }, { "changed", QG_Y_ALL },
    { "upstream", QG_Y_ALL },
};

/* A model's coefficients: key, scale, bound, and where it goes.  The
 * per-token coefficients need no bound of their own (weights.c forms the
 * products in 128 bits and checks the weight). */
static const struct coef {
    const char *key;
    int scale;
    int64_t max;
    size_t offset;
} coefs[] = {
    { "per_request", 3, QG_AMOUNT_MAX_MILLI,
      offsetof(qg_model, per_request_milli) },
    { "input_per_1k", 6, INT64_MAX, offsetof(qg_model, input_per_1k_micro) },
    { "output_per_1k", 6, INT64_MAX,
      offsetof(qg_model, output_per_1k_micro) },
};

static int c_model(qg__rctx *c, yaml_node_t *m, const char *path, qg_model *md)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;
    size_t i;

    if (qg__y_check_map(&c->y, m, path, model_keys, QG_Y_NKEYS(model_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    for (i = 0; i < QG_Y_NKEYS(coefs); i++) {
        if (!(v = qg__y_get(&c->y, m, coefs[i].key)))
            continue;
        qg__y_path_key(sub, path, coefs[i].key);
        if (qg__y_decimal_max(&c->y, v, sub, coefs[i].scale, QG_Y_NONNEG,
                              coefs[i].max,
                              (int64_t *)((char *)md + coefs[i].offset)) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, m, "changed"))) {
        qg__y_path_key(sub, path, "changed");
        if (qg__y_date(&c->y, v, sub, &md->changed_ms) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, m, "upstream"))) {
        qg_url url;
        char why[128];
        qg__y_path_key(sub, path, "upstream");
        if (qg__y_need_scalar(&c->y, v, sub,
                              "an upstream URL http[s]://HOST[:PORT][/PREFIX]")
                < 0)
            return -1;
        /* the shape only: the proxy connects (url.h; no I/O here) */
        if (qg__url_parse(qg__y_str(v), v->data.scalar.length, &url, why,
                         sizeof why) < 0)
            return qg__y_fail(&c->y, v, sub,
                              "expected an upstream URL "
                              "http[s]://HOST[:PORT][/PREFIX]: %s", why);
        if (qg__y_string(&c->y, v, sub, &md->upstream) < 0)
            return -1;
    }
    return 0;
}

static int c_weights(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP], sub2[QG_Y_PATHCAP];
    yaml_node_pair_t *pairs;
    yaml_node_t *v;
    int cnt, i;

    if (qg__y_check_map(&c->y, n, path, weights_keys, QG_Y_NKEYS(weights_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    if (qg__y_need_key(&c->y, n, path, "version", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "version");
    if (qg__y_string(&c->y, v, sub, &c->r->weights_version) < 0)
        return -1;
    /* optional: a minimal file may leave it out, lint says so
     * (weights-uncalibrated) */
    if ((v = qg__y_get(&c->y, n, "calibrated"))) {
        qg__y_path_key(sub, path, "calibrated");
        if (qg__y_date(&c->y, v, sub, &c->r->calibrated_ms) < 0)
            return -1;
    }
    if (qg__y_need_key(&c->y, n, path, "models", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "models");
    cnt = qg__y_check_names(&c->y, v, sub, 1, QG_MAX_MODELS);
    if (cnt < 0)
        return -1;
    c->r->models = calloc((size_t)cnt, sizeof *c->r->models);
    if (!c->r->models)
        return qg__y_oom(&c->y, v);
    c->r->nmodels = cnt;
    pairs = v->data.mapping.pairs.start;
    for (i = 0; i < cnt; i++) {
        yaml_node_t *k = qg__y_node(&c->y, pairs[i].key);
        qg_model *md = &c->r->models[i];
        md->index = i;
        md->line = (int)k->start_mark.line + 1;
        if (!(md->name = strdup(qg__y_str(k))))
            return qg__y_oom(&c->y, k);
        qg__y_path_key(sub2, sub, md->name);
        if (c_model(c, qg__y_node(&c->y, pairs[i].value), sub2, md) < 0)
            return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- subjects */

static const qg__ykey subject_keys[] = {
    { "plan", QG_Y_ALL }, { "org", QG_Y_ALL },
    { "billing_anchor", QG_Y_ALL },
};

static int c_subjects(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP], sub2[QG_Y_PATHCAP];
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    int cnt, i;
    yaml_node_t *v;

    cnt = qg__y_check_names(&c->y, n, path, 0, 1 << 20);
    if (cnt <= 0)
        return cnt;
    c->r->subjects = calloc((size_t)cnt, sizeof *c->r->subjects);
    if (!c->r->subjects)
        return qg__y_oom(&c->y, n);
    c->r->nsubjects = cnt;
    for (i = 0; i < cnt; i++) {
        yaml_node_t *k = qg__y_node(&c->y, pairs[i].key),
                    *m = qg__y_node(&c->y, pairs[i].value);
        qg_subject_spec *s = &c->r->subjects[i];
        s->org = -1;
        if (!(s->name = strdup(qg__y_str(k))))
            return qg__y_oom(&c->y, k);
        qg__y_path_key(sub, path, s->name);
        if (qg__y_check_map(&c->y, m, sub, subject_keys,
                            QG_Y_NKEYS(subject_keys), QG_Y_ALL, "") < 0 ||
            qg__y_need_key(&c->y, m, sub, "plan", &v) < 0)
            return -1;
        qg__y_path_key(sub2, sub, "plan");
        if (p_plan_ref(c, v, sub2, &s->plan) < 0)
            return -1;
        if ((v = qg__y_get(&c->y, m, "org"))) {
            qg__y_path_key(sub2, sub, "org");
            if (p_org_ref(c, v, sub2, &s->org) < 0)
                return -1;
        }
        if ((v = qg__y_get(&c->y, m, "billing_anchor"))) {
            qg__y_path_key(sub2, sub, "billing_anchor");
            if (qg__y_date(&c->y, v, sub2, &s->billing_anchor_ms) < 0)
                return -1;
        }
    }
    return 0;
}

/* ----------------------------------------------------------- analysis */

static const qg__ykey analysis_keys[] = {
    { "request", QG_Y_ALL }, { "duration", QG_Y_ALL },
    { "period", QG_Y_ALL },
};

#define REQ_MODEL QG_Y_BIT(1)
#define REQ_WEIGHT QG_Y_BIT(2)

static const qg__ykey request_keys[] = {
    { "model", REQ_MODEL },         { "input_tokens", REQ_MODEL },
    { "output_tokens", REQ_MODEL }, { "weight", REQ_WEIGHT },
};

static int c_request(qg__rctx *c, yaml_node_t *n, const char *path,
                     qg_analysis_spec *a)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;

    if (qg__y_check_map(&c->y, n, path, request_keys, QG_Y_NKEYS(request_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "weight"))) {
        if (qg__y_check_map(&c->y, n, path, request_keys,
                            QG_Y_NKEYS(request_keys), REQ_WEIGHT,
                            "a request given by weight") < 0)
            return -1;
        qg__y_path_key(sub, path, "weight");
        return qg__y_decimal_max(&c->y, v, sub, 3, QG_Y_POSITIVE,
                                 QG_AMOUNT_MAX_MILLI, &a->weight_milli);
    }
    if (qg__y_need_key(&c->y, n, path, "model", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "model");
    if (qg__rc_model_ref(c, v, sub, &a->model) < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "input_tokens"))) {
        qg__y_path_key(sub, path, "input_tokens");
        if (qg__y_int(&c->y, v, sub, 0, QG_TOKENS_MAX, &a->input_tokens) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, n, "output_tokens"))) {
        qg__y_path_key(sub, path, "output_tokens");
        if (qg__y_int(&c->y, v, sub, 0, QG_TOKENS_MAX, &a->output_tokens) < 0)
            return -1;
    }
    return 0;
}

static int c_analysis(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP];
    qg_analysis_spec *a = &c->r->analysis;
    yaml_node_t *v;

    if (qg__y_check_map(&c->y, n, path, analysis_keys,
                        QG_Y_NKEYS(analysis_keys), QG_Y_ALL, "") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "request"))) {
        qg__y_path_key(sub, path, "request");
        if (c_request(c, v, sub, a) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, n, "duration"))) {
        qg__y_path_key(sub, path, "duration");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, &a->duration_ms) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, n, "period"))) {
        qg__y_path_key(sub, path, "period");
        if (qg__y_duration(&c->y, v, sub, QG_Y_NONNEG, &a->period_ms) < 0)
            return -1;
    }
    return 0;
}

/* -------------------------------------------------------------- store */

static const qg__ykey store_keys[] = {
    { "timeout", QG_Y_ALL }, { "down", QG_Y_ALL }, { "share", QG_Y_ALL },
};

static const qg__yenum down_names[] = {
    { "local", QG_DOWN_LOCAL }, { "closed", QG_DOWN_CLOSED },
};

static int c_store(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP];
    qg_store_spec *st = &c->r->store;
    yaml_node_t *v;
    int down;

    if (qg__y_check_map(&c->y, n, path, store_keys, QG_Y_NKEYS(store_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "timeout"))) {
        qg__y_path_key(sub, path, "timeout");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, &st->timeout_ms) < 0)
            return -1;
        if (st->timeout_ms > 60000)
            return qg__y_fail(&c->y, v, sub, "a store timeout of at most 60s "
                              "(a decision waits this long before it falls "
                              "back)");
    }
    if ((v = qg__y_get(&c->y, n, "down"))) {
        qg__y_path_key(sub, path, "down");
        if (qg__y_enum(&c->y, v, sub, "store.down", down_names,
                       sizeof down_names / sizeof down_names[0], &down) < 0)
            return -1;
        st->down = (qg_store_down)down;
    }
    if ((v = qg__y_get(&c->y, n, "share"))) {
        qg__y_path_key(sub, path, "share");
        if (qg__y_decimal_max(&c->y, v, sub, 3, QG_Y_POSITIVE, QG_MILLI,
                              &st->share_milli) < 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------- reconcile */

static const qg__ykey reconcile_keys[] = {
    { "every", QG_Y_ALL }, { "tolerance", QG_Y_ALL }, { "repair", QG_Y_ALL },
};

/* reconcile: { every: 5m, tolerance: 0, repair: false }; present without
 * every: every 5 minutes. */
static int c_reconcile(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP];
    qg_reconcile_spec *rc = &c->r->reconcile;
    yaml_node_t *v;

    if (qg__y_check_map(&c->y, n, path, reconcile_keys,
                        QG_Y_NKEYS(reconcile_keys), QG_Y_ALL, "") < 0)
        return -1;
    rc->every_ms = 5 * 60000;
    if ((v = qg__y_get(&c->y, n, "every"))) {
        qg__y_path_key(sub, path, "every");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, &rc->every_ms) < 0)
            return -1;
        if (rc->every_ms < 1000)
            return qg__y_fail(&c->y, v, sub, "a reconciliation period of at "
                              "least 1s (each run reads the ledger's reach "
                              "and every subject's counters)");
    }
    if ((v = qg__y_get(&c->y, n, "tolerance"))) {
        qg__y_path_key(sub, path, "tolerance");
        if (qg__y_decimal_max(&c->y, v, sub, 3, QG_Y_NONNEG,
                              QG_AMOUNT_MAX_MILLI, &rc->tolerance_milli) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, n, "repair"))) {
        qg__y_path_key(sub, path, "repair");
        if (qg__y_bool(&c->y, v, sub, &rc->repair) < 0)
            return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- forecast */

static const qg__ykey forecast_keys[] = {
    { "basis", QG_Y_ALL },
};

/* forecast: { basis: 7d }: the span /v1/usage measures a subject's pace
 * over (forecast.h bounds it). */
static int c_forecast(qg__rctx *c, yaml_node_t *n, const char *path)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;

    if (qg__y_check_map(&c->y, n, path, forecast_keys,
                        QG_Y_NKEYS(forecast_keys), QG_Y_ALL, "") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "basis"))) {
        qg__y_path_key(sub, path, "basis");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE,
                           &c->r->forecast_basis_ms) < 0)
            return -1;
        if (c->r->forecast_basis_ms < QG_FORECAST_MIN_BASIS_MS ||
            c->r->forecast_basis_ms > QG_FORECAST_MAX_BASIS_MS)
            return qg__y_fail(&c->y, v, sub, "a forecast basis from 1h to "
                              "90d (the pace is measured over it)");
    }
    return 0;
}

/* ---------------------------------------------------------- top level */

static const qg__ykey top_keys[] = {
    { "version", QG_Y_ALL },   { "unit", QG_Y_ALL },
    { "effective", QG_Y_ALL }, { "announced", QG_Y_ALL },
    { "notice", QG_Y_ALL },    { "weights", QG_Y_ALL },
    { "plans", QG_Y_ALL },     { "orgs", QG_Y_ALL },
    { "subjects", QG_Y_ALL },  { "default_plan", QG_Y_ALL },
    { "analysis", QG_Y_ALL },  { "store", QG_Y_ALL },
    { "reconcile", QG_Y_ALL }, { "notifications", QG_Y_ALL },
    { "forecast", QG_Y_ALL },
    { "changes", QG_Y_ALL },
};

/* Optional top-level dates and durations: key, parser kind, field. */
static const struct top_time {
    const char *key;
    int is_date;
    size_t offset;
} top_times[] = {
    { "effective", 1, offsetof(qg_rules, effective_ms) },
    { "announced", 1, offsetof(qg_rules, announced_ms) },
    { "notice", 0, offsetof(qg_rules, notice_ms) },
};

static int compile(qg__rctx *c, yaml_node_t *root)
{
    qg_rules *r = c->r;
    yaml_node_t *v;
    size_t i;

    if (qg__y_check_map(&c->y, root, "", top_keys, QG_Y_NKEYS(top_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    if (qg__y_need_key(&c->y, root, "", "version", &v) < 0 ||
        qg__y_string(&c->y, v, "version", &r->version) < 0)
        return -1;
    if ((v = qg__y_get(&c->y, root, "unit")) &&
        qg__y_string(&c->y, v, "unit", &r->unit) < 0)
        return -1;
    if (!r->unit && !(r->unit = strdup("weight points")))
        return qg__y_oom(&c->y, root);
    if ((v = qg__y_get(&c->y, root, "changes")) &&
        qg__y_string(&c->y, v, "changes", &r->changes) < 0)
        return -1;
    /* a later version without notice keeps the earlier one's */
    r->notice_ms = c->prev ? c->prev->notice_ms : 30 * QG_MS_PER_DAY;
    for (i = 0; i < QG_Y_NKEYS(top_times); i++) {
        int64_t *dst = (int64_t *)((char *)r + top_times[i].offset);
        if (!(v = qg__y_get(&c->y, root, top_times[i].key)))
            continue;
        if (top_times[i].is_date
                ? qg__y_date(&c->y, v, top_times[i].key, dst)
                : qg__y_duration(&c->y, v, top_times[i].key, QG_Y_NONNEG, dst))
            return -1;
    }
    if (qg__y_need_key(&c->y, root, "", "weights", &v) < 0 ||
        c_weights(c, v, "weights") < 0)
        return -1;
    if (qg__y_need_key(&c->y, root, "", "plans", &v) < 0 ||
        c_plans(c, v, "plans") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, root, "orgs")) && c_orgs(c, v, "orgs") < 0)
        return -1;
    if (qg__rules_index_orgs(r) != QG_OK)
        return qg__y_oom(&c->y, root);
    if ((v = qg__y_get(&c->y, root, "subjects")) &&
        c_subjects(c, v, "subjects") < 0)
        return -1;
    if (qg__rules_index_subjects(r) != QG_OK)
        return qg__y_oom(&c->y, root);
    r->default_plan = -1;
    if ((v = qg__y_get(&c->y, root, "default_plan")) &&
        p_plan_ref(c, v, "default_plan", &r->default_plan) < 0)
        return -1;
    r->analysis.model = -1;
    r->analysis.weight_milli = QG_MILLI;
    r->analysis.duration_ms = 60000;
    r->store.timeout_ms = 100;
    r->store.down = QG_DOWN_LOCAL;
    r->store.share_milli = 500;
    if ((v = qg__y_get(&c->y, root, "store")) && c_store(c, v, "store") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, root, "reconcile")) &&
        c_reconcile(c, v, "reconcile") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, root, "analysis")) &&
        c_analysis(c, v, "analysis") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, root, "notifications")) &&
        qg__rc_notify(c, v, "notifications") < 0)
        return -1;
    r->forecast_basis_ms = QG_FORECAST_DEFAULT_BASIS_MS;
    if ((v = qg__y_get(&c->y, root, "forecast")) &&
        c_forecast(c, v, "forecast") < 0)
        return -1;
    qg__rules_payg(r);
    return 0;
}


/* Where key `key` of document root `root` sits (root itself when absent). */
static yaml_node_t *at_key(qg__rctx *c, yaml_node_t *root, const char *key)
{
    yaml_node_t *v = qg__y_get(&c->y, root, key);
    return v ? v : root;
}

/* A later document against the versions before it (`head` .. `prev`):
 * it must take effect strictly after prev, under a version name of its
 * own.  The file's order is the order of time: nothing is sorted. */
static int check_sequence(qg__rctx *c, yaml_node_t *root,
                          const qg_rules *head, const qg_rules *prev)
{
    const qg_rules *r = c->r, *o;
    char when[40];

    if (!qg__y_get(&c->y, root, "effective"))
        return qg__y_fail(&c->y, root, "effective", "expected an effective "
                          "instant: "
                          "every rules version after the first says when "
                          "it takes effect");
    for (o = head; o; o = o->next)
        if (strcmp(o->version, r->version) == 0)
            return qg__y_fail(&c->y, at_key(c, root, "version"), "version",
                              "expected a version name of its own: \"%s\" is also "
                              "the version of the document at line %d",
                              r->version, o->line);
    if (r->effective_ms <= prev->effective_ms) {
        qg_iso8601_format(prev->effective_ms, when, sizeof when);
        return qg__y_fail(&c->y, at_key(c, root, "effective"), "effective",
                          "expected an instant after %s, when version \"%s\" (line "
                          "%d) takes effect: versions are listed in the "
                          "order they take effect, each strictly later",
                          prev->effective_ms > 0 ? when : "the beginning",
                          prev->version, prev->line);
    }
    return 0;
}

int qg__rules_parse(const char *text, size_t len, const char *path,
                   qg_tz_resolver tzr, void *tzud, qg_rules **out,
                   qg_diag *diag)
{
    qg_diag scratch;
    yaml_document_t *docs = NULL;
    int ndocs = 0, rc, i, d;
    qg_rules *head = NULL, *last = NULL;
    qg__rctx c;
    yaml_node_t *root;

    if (!diag)
        diag = &scratch;
    memset(diag, 0, sizeof *diag);
    memset(&c, 0, sizeof c);
    snprintf(diag->path, sizeof diag->path, "%s", path ? path : "<rules>");
    if (!out || (!text && len)) {
        snprintf(diag->message, sizeof diag->message, "invalid argument");
        return QG_EINVAL;
    }
    *out = NULL;
    if (!text)
        text = "";
    if (!(docs = calloc(QG_Y_MAXDOCS, sizeof *docs))) {
        snprintf(diag->message, sizeof diag->message, "out of memory");
        return QG_ENOMEM;
    }
    rc = qg__y_load(text, len, docs, &ndocs, diag);
    if (rc != QG_OK)
        goto done;
    rc = QG_ERULES;
    root = ndocs ? yaml_document_get_root_node(&docs[0]) : NULL;
    if (!root || qg__y_is_null(root)) {
        diag->line = diag->column = 1;
        snprintf(diag->message, sizeof diag->message,
                 "empty rules file: expected a mapping with version, weights "
                 "and plans");
        goto done;
    }
    /* One compilation per document, each a complete rules version. */
    for (d = 0; d < ndocs; d++) {
        memset(&c, 0, sizeof c);
        root = yaml_document_get_root_node(&docs[d]);
        c.y.doc = &docs[d];
        c.y.diag = diag;
        c.tzr = tzr;
        c.tzud = tzud;
        c.prev = last;
        if (qg__y_is_null(root)) {
            qg__y_fail(&c.y, root, "", "expected a rules version (a mapping with "
                       "version, effective, weights and plans) in document "
                       "%d, found an empty one", d + 1);
            goto done;
        }
        c.r = calloc(1, sizeof *c.r);
        if (!c.r || !(c.r->path = strdup(diag->path)))
            goto nomem;
        c.r->line = (int)root->start_mark.line + 1;
        if (compile(&c, root) < 0 ||
            (last && check_sequence(&c, root, head, last) < 0)) {
            if (c.y.oom)
                rc = QG_ENOMEM;
            goto done;
        }
        if (last)
            last->next = c.r;
        else
            head = c.r;
        last = c.r;
        c.r = NULL;
        for (i = 0; i < c.nzone_names; i++)
            free(c.zone_names[i]);
        free(c.zone_names);
        c.zone_names = NULL;
        c.nzone_names = 0;
    }
    *out = head;
    head = NULL;
    rc = QG_OK;
    goto done;
nomem:
    rc = QG_ENOMEM;
    snprintf(diag->message, sizeof diag->message, "out of memory");
done:
    for (i = 0; i < c.nzone_names; i++)
        free(c.zone_names[i]);
    free(c.zone_names);
    qg_rules_free(c.r);
    qg_rules_free(head);
    for (d = 0; d < ndocs; d++)
        yaml_document_delete(&docs[d]);
    free(docs);
    return rc;
}
