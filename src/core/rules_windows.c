/* rules_windows.c - the window part of the rules schema (PRODUCT.md
 * section 2): a plan's or org's windows list, each window's type-specific
 * keys, calendar periods and their `at` spellings ("09:00", "MON 00:00",
 * "1 00:00"), overage policies and model masks, plus the concurrency
 * window implied by `concurrency: N`.  Split from rules_yaml.c because
 * windows are the largest and most varied part of the schema; the
 * document helpers are in yaml_doc.c.  No I/O except through the
 * caller's time-zone resolver. */
#include "rules_compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "duration.h"
#include "fixed.h"
#include "quotagate.h"

/* --------------------------------------------------------- time zones */

/* Resolve a zone name once per rule set; the rules own the zone. */
/* A model named in the rules (an overage's to_model, a window's models,
 * the analysis' reference request), as its index. */
int qg__rc_model_ref(qg__rctx *c, yaml_node_t *n, const char *path, int *out)
{
    char list[QG_Y_LISTCAP];
    if (qg__y_need_scalar(&c->y, n, path, "a model name") < 0)
        return -1;
    *out = qg_rules_find_model(c->r, qg__y_str(n));
    if (*out >= 0)
        return 0;
    qg__y_join_names(list, sizeof list, c->r->models, sizeof(qg_model),
                     offsetof(qg_model, name), c->r->nmodels);
    return qg__y_fail(&c->y, n, path, "unknown model \"%s\" (models are: %s)",
                      qg__y_str(n), list);
}

static int resolve_tz(qg__rctx *c, yaml_node_t *n, const char *path,
                      const char *name, const qg_tz **out)
{
    char err[200] = "";
    qg_tz *z, **zones;
    char **names, *copy;
    int i;

    for (i = 0; i < c->r->nzones; i++)
        if (strcmp(c->zone_names[i], name) == 0) {
            *out = c->r->zones[i];
            return 0;
        }
    if (c->tzr)
        z = c->tzr(name, c->tzud, err, sizeof err);
    else
        z = strcmp(name, "UTC") == 0 ? qg__tz_utc() : NULL;
    if (!z && strncmp(err, "unknown time zone", 17) == 0)
        return qg__y_fail(&c->y, n, path, "%s", err);   /* it names it */
    if (!z)
        return qg__y_fail(&c->y, n, path, "unknown time zone \"%s\"%s%s", name,
                          err[0] ? ": " : "", err);
    copy = strdup(name);
    zones = realloc(c->r->zones, sizeof *zones * (size_t)(c->r->nzones + 1));
    if (zones)
        c->r->zones = zones;
    names = realloc(c->zone_names, sizeof *names * (size_t)(c->r->nzones + 1));
    if (names)
        c->zone_names = names;
    if (!copy || !zones || !names) {
        free(copy);
        qg__tz_free(z);
        return qg__y_oom(&c->y, n);
    }
    c->r->zones[c->r->nzones] = z;
    c->zone_names[c->r->nzones] = copy;
    c->r->nzones++;
    c->nzone_names = c->r->nzones;
    *out = z;
    return 0;
}

/* ------------------------------------------------------------ overage */

static const qg__yenum policies[] = {
    { "reject", QG_POLICY_REJECT },
    { "queue", QG_POLICY_QUEUE },
    { "downgrade", QG_POLICY_DOWNGRADE },
    { "payg", QG_POLICY_PAYG },
};

static const qg__ykey overage_keys[] = {
    { "policy", QG_Y_ALL },
    { "max_wait", QG_Y_BIT(QG_POLICY_QUEUE) },
    { "queue_size", QG_Y_BIT(QG_POLICY_QUEUE) },
    { "to_model", QG_Y_BIT(QG_POLICY_DOWNGRADE) },
    { "price_per_unit", QG_Y_BIT(QG_POLICY_PAYG) },
    { "spending_cap", QG_Y_BIT(QG_POLICY_PAYG) },
};

static const qg__ykey usd_keys[] = { { "usd_month", QG_Y_ALL } };

/* {usd_month: decimal} -> micro-dollars */
int qg__rc_usd_month(qg__rctx *c, yaml_node_t *n, const char *path,
                     int64_t *out)
{
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;
    if (qg__y_check_map(&c->y, n, path, usd_keys, QG_Y_NKEYS(usd_keys),
                        QG_Y_ALL, "") < 0 ||
        qg__y_need_key(&c->y, n, path, "usd_month", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "usd_month");
    return qg__y_decimal_max(&c->y, v, sub, 6, QG_Y_NONNEG,
                             QG_MONEY_MAX_MICRO, out);
}

int qg__rc_overage(qg__rctx *c, yaml_node_t *n, const char *path,
                   qg_overage *o)
{
    char sub[QG_Y_PATHCAP], variant[48];
    yaml_node_t *v;
    int pol;
    int64_t x;

    if (qg__y_check_map(&c->y, n, path, overage_keys, QG_Y_NKEYS(overage_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    if (qg__y_need_key(&c->y, n, path, "policy", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "policy");
    if (qg__y_enum(&c->y, v, sub, "overage policy", policies,
                   QG_Y_NKEYS(policies), &pol) < 0)
        return -1;
    snprintf(variant, sizeof variant, "the %s policy", qg__y_str(v));
    if (qg__y_check_map(&c->y, n, path, overage_keys, QG_Y_NKEYS(overage_keys),
                        QG_Y_BIT(pol), variant) < 0)
        return -1;
    o->policy = (qg_policy)pol;
    o->queue_size = 64;
    o->to_model = -1;
    if (pol == QG_POLICY_QUEUE) {
        if (qg__y_need_key(&c->y, n, path, "max_wait", &v) < 0)
            return -1;
        qg__y_path_key(sub, path, "max_wait");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, &o->max_wait_ms) < 0)
            return -1;
        if ((v = qg__y_get(&c->y, n, "queue_size"))) {
            qg__y_path_key(sub, path, "queue_size");
            if (qg__y_int(&c->y, v, sub, 1, INT32_MAX, &x) < 0)
                return -1;
            o->queue_size = (int32_t)x;
        }
    } else if (pol == QG_POLICY_DOWNGRADE) {
        if (qg__y_need_key(&c->y, n, path, "to_model", &v) < 0)
            return -1;
        qg__y_path_key(sub, path, "to_model");
        if (qg__rc_model_ref(c, v, sub, &o->to_model) < 0)
            return -1;
    } else if (pol == QG_POLICY_PAYG) {
        if (qg__y_need_key(&c->y, n, path, "price_per_unit", &v) < 0)
            return -1;
        qg__y_path_key(sub, path, "price_per_unit");
        if (qg__y_decimal_max(&c->y, v, sub, 6, QG_Y_NONNEG,
                              QG_MONEY_MAX_MICRO, &o->price_per_unit_micro) <
            0)
            return -1;
        if ((v = qg__y_get(&c->y, n, "spending_cap"))) {
            qg__y_path_key(sub, path, "spending_cap");
            if (qg__rc_usd_month(c, v, sub, &o->spending_cap_micro) < 0)
                return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ windows */

static const qg__yenum win_types[] = {
    { "rolling", QG_WIN_ROLLING },
    { "calendar", QG_WIN_CALENDAR },
    { "session", QG_WIN_SESSION },
    { "rate", QG_WIN_RATE },
};

static const qg__yenum units[] = {
    { "weight", QG_UNIT_WEIGHT },
    { "requests", QG_UNIT_REQUESTS },
};

#define W_ROLL QG_Y_BIT(QG_WIN_ROLLING)
#define W_CAL QG_Y_BIT(QG_WIN_CALENDAR)
#define W_SESS QG_Y_BIT(QG_WIN_SESSION)
#define W_RATE QG_Y_BIT(QG_WIN_RATE)

static const qg__ykey window_keys[] = {
    { "name", QG_Y_ALL },     { "type", QG_Y_ALL },
    { "limit", QG_Y_ALL },    { "unit", QG_Y_ALL },
    { "length", W_ROLL | W_SESS },
    { "precision", W_ROLL },  { "max_entries", W_ROLL },
    { "per", W_RATE },        { "burst", W_RATE },
    { "every", W_CAL },       { "at", W_CAL },
    { "anchor", W_CAL },      { "tz", W_CAL },
    { "models", QG_Y_ALL },   { "overage", QG_Y_ALL },
};

static const qg__yenum everies[] = {
    { "day", QG_EVERY_DAY },
    { "week", QG_EVERY_WEEK },
    { "month", QG_EVERY_MONTH },
};

static const qg__yenum weekdays[] = {
    { "MON", 0 }, { "TUE", 1 }, { "WED", 2 }, { "THU", 3 },
    { "FRI", 4 }, { "SAT", 5 }, { "SUN", 6 },
};

/* How `at` reads for each `every`, and its default. */
static const struct at_form {
    qg_every every;
    const char *deflt;
    const char *expected;
} at_forms[] = {
    { QG_EVERY_DAY, "00:00", "\"HH:MM\"" },
    { QG_EVERY_WEEK, "MON 00:00",
      "\"DAY HH:MM\" with DAY one of MON, TUE, WED, THU, FRI, SAT, SUN" },
    { QG_EVERY_MONTH, "1 00:00", "\"D HH:MM\" with D in 1..31" },
};

static int parse_hhmm(const char *s, int *minute)
{
    int h, m, n = 0;
    if (sscanf(s, "%2d:%2d%n", &h, &m, &n) != 2 || s[n] != '\0' ||
        s[0] < '0' || s[0] > '9' || h < 0 || h > 23 || m < 0 || m > 59 ||
        n < 4 || s[n - 3] != ':')
        return -1;
    *minute = h * 60 + m;
    return 0;
}

/* Parse an `at` value for cal->every; -1 if malformed. */
static int parse_at(const char *s, qg_calendar_spec *cal)
{
    const char *sp = strchr(s, ' ');
    size_t i;

    if (cal->every == QG_EVERY_DAY)
        return parse_hhmm(s, &cal->minute_of_day);
    if (!sp)
        return -1;
    if (cal->every == QG_EVERY_WEEK) {
        for (i = 0; i < QG_Y_NKEYS(weekdays); i++)
            if ((size_t)(sp - s) == strlen(weekdays[i].name) &&
                strncasecmp(s, weekdays[i].name, (size_t)(sp - s)) == 0)
                break;
        if (i == QG_Y_NKEYS(weekdays))
            return -1;
        cal->weekday = weekdays[i].value;
    } else {
        int d = 0;
        const char *p;
        for (p = s; p < sp; p++) {
            if (*p < '0' || *p > '9' || p - s >= 2)
                return -1;
            d = d * 10 + (*p - '0');
        }
        if (p == s || d < 1 || d > 31)
            return -1;
        cal->mday = d;
    }
    return parse_hhmm(sp + 1, &cal->minute_of_day);
}

static int c_calendar(qg__rctx *c, yaml_node_t *n, const char *path,
                      qg_window_spec *w)
{
    char sub[QG_Y_PATHCAP], g[80];
    const struct at_form *form = NULL;
    yaml_node_t *v;
    int every;
    size_t i;

    if (qg__y_need_key(&c->y, n, path, "every", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "every");
    if (qg__y_enum(&c->y, v, sub, "calendar period", everies,
                   QG_Y_NKEYS(everies), &every) < 0)
        return -1;
    w->cal.every = (qg_every)every;
    w->cal.mday = 1;
    for (i = 0; i < QG_Y_NKEYS(at_forms); i++)
        if (at_forms[i].every == w->cal.every)
            form = &at_forms[i];
    if (!form || parse_at(form->deflt, &w->cal) < 0)
        return qg__y_fail(&c->y, v, sub,
                          "internal: no default for this period");
    if ((v = qg__y_get(&c->y, n, "at"))) {
        qg__y_path_key(sub, path, "at");
        if (qg__y_need_scalar(&c->y, v, sub, form->expected) < 0)
            return -1;
        if (parse_at(qg__y_str(v), &w->cal) < 0)
            return qg__y_fail(&c->y, v, sub, "expected %s, got %s",
                              form->expected, qg__y_got(v, g, sizeof g));
    }
    if ((v = qg__y_get(&c->y, n, "anchor"))) {
        qg__y_path_key(sub, path, "anchor");
        if (v->type != YAML_SCALAR_NODE ||
            strcmp(qg__y_str(v), "billing") != 0)
            return qg__y_fail(&c->y, v, sub, "expected \"billing\", got %s",
                              qg__y_got(v, g, sizeof g));
        if (w->cal.every != QG_EVERY_MONTH)
            return qg__y_fail(&c->y, v, sub,
                              "anchor: billing needs every: month");
        w->cal.anchor_billing = 1;
    }
    if ((v = qg__y_get(&c->y, n, "tz"))) {
        qg__y_path_key(sub, path, "tz");
        if (qg__y_need_scalar(&c->y, v, sub, "an IANA time zone name") < 0)
            return -1;
        return resolve_tz(c, v, sub, qg__y_str(v), &w->cal.tz);
    }
    return resolve_tz(c, n, path, "UTC", &w->cal.tz);
}

static int c_models_mask(qg__rctx *c, yaml_node_t *n, const char *path,
                         uint64_t *mask)
{
    char sub[QG_Y_PATHCAP], g[80];
    yaml_node_item_t *it;
    int m;

    if (n->type != YAML_SEQUENCE_NODE ||
        n->data.sequence.items.start == n->data.sequence.items.top)
        return qg__y_fail(&c->y, n, path,
                          "expected a non-empty list of model names, "
                          "got %s",
                          qg__y_got(n, g, sizeof g));
    for (it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        qg__y_path_idx(sub, path, it - n->data.sequence.items.start);
        if (qg__rc_model_ref(c, qg__y_node(&c->y, *it), sub, &m) < 0)
            return -1;
        *mask |= (uint64_t)1 << m;
    }
    return 0;
}

/* The type-specific part of a window. */
static int c_window_type(qg__rctx *c, yaml_node_t *n, const char *path,
                         qg_window_spec *w)
{
    char sub[QG_Y_PATHCAP], g[80];
    yaml_node_t *v;
    int64_t x;

    switch (w->type) {
    case QG_WIN_ROLLING:
    case QG_WIN_SESSION:
        if (qg__y_need_key(&c->y, n, path, "length", &v) < 0)
            return -1;
        qg__y_path_key(sub, path, "length");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, &w->length_ms) < 0)
            return -1;
        if (w->type == QG_WIN_SESSION)
            return 0;
        w->max_entries = 1024;
        if ((v = qg__y_get(&c->y, n, "precision"))) {
            qg__y_path_key(sub, path, "precision");
            if (v->type == YAML_SCALAR_NODE &&
                strcmp(qg__y_str(v), "exact") == 0)
                w->precision_ms = 0;
            else if (v->type != YAML_SCALAR_NODE ||
                     qg_duration_parse(qg__y_str(v), v->data.scalar.length,
                                       &w->precision_ms) < 0 ||
                     w->precision_ms <= 0 || w->precision_ms > w->length_ms)
                return qg__y_fail(&c->y, v, sub,
                                  "expected \"exact\" or a duration > 0 "
                                  "and at most the window length, got %s",
                                  qg__y_got(v, g, sizeof g));
        }
        if ((v = qg__y_get(&c->y, n, "max_entries"))) {
            qg__y_path_key(sub, path, "max_entries");
            if (qg__y_int(&c->y, v, sub, 16, UINT32_MAX, &x) < 0)
                return -1;
            w->max_entries = (uint32_t)x;
        }
        return 0;
    case QG_WIN_RATE:
        if (qg__y_need_key(&c->y, n, path, "per", &v) < 0)
            return -1;
        qg__y_path_key(sub, path, "per");
        if (qg__y_duration(&c->y, v, sub, QG_Y_POSITIVE, &w->length_ms) < 0)
            return -1;
        w->burst_milli = w->limit_milli;
        if ((v = qg__y_get(&c->y, n, "burst"))) {
            qg__y_path_key(sub, path, "burst");
            if (qg__y_decimal_max(&c->y, v, sub, 3, QG_Y_POSITIVE,
                                  QG_AMOUNT_MAX_MILLI, &w->burst_milli) < 0)
                return -1;
        }
        return 0;
    case QG_WIN_CALENDAR:
        return c_calendar(c, n, path, w);
    default:
        return qg__y_fail(&c->y, n, path, "internal: window type %d",
                          (int)w->type);
    }
}

static int c_window(qg__rctx *c, yaml_node_t *n, const char *path,
                    qg_window_spec *ws, int idx)
{
    qg_window_spec *w = &ws[idx];
    char sub[QG_Y_PATHCAP], variant[48];
    yaml_node_t *v;
    int t, i;

    if (qg__y_check_map(&c->y, n, path, window_keys, QG_Y_NKEYS(window_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    w->line = (int)n->start_mark.line + 1;
    if (qg__y_need_key(&c->y, n, path, "name", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "name");
    if (qg__y_name(&c->y, v, sub, &w->name) < 0)
        return -1;
    if (strcmp(w->name, "concurrency") == 0)
        return qg__y_fail(&c->y, v, sub,
                          "window name \"concurrency\" is reserved "
                          "(use concurrency: N on the plan or org)");
    for (i = 0; i < idx; i++)
        if (strcmp(ws[i].name, w->name) == 0)
            return qg__y_fail(&c->y, v, sub,
                              "duplicate window name \"%s\" (first "
                              "defined at line %d)",
                              w->name, ws[i].line);
    if (qg__y_need_key(&c->y, n, path, "type", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "type");
    if (qg__y_enum(&c->y, v, sub, "window type", win_types,
                   QG_Y_NKEYS(win_types), &t) < 0)
        return -1;
    w->type = (qg_win_type)t;
    snprintf(variant, sizeof variant, "%s windows", qg__y_str(v));
    if (qg__y_check_map(&c->y, n, path, window_keys, QG_Y_NKEYS(window_keys),
                        QG_Y_BIT(t), variant) < 0)
        return -1;
    if (qg__y_need_key(&c->y, n, path, "limit", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "limit");
    if (qg__y_decimal_max(&c->y, v, sub, 3, QG_Y_POSITIVE,
                          QG_AMOUNT_MAX_MILLI, &w->limit_milli) < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "unit"))) {
        qg__y_path_key(sub, path, "unit");
        if (qg__y_enum(&c->y, v, sub, "unit", units, QG_Y_NKEYS(units),
                       &t) < 0)
            return -1;
        w->unit = (qg_unit)t;
    }
    if ((v = qg__y_get(&c->y, n, "models"))) {
        qg__y_path_key(sub, path, "models");
        if (c_models_mask(c, v, sub, &w->model_mask) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, n, "overage"))) {
        qg__y_path_key(sub, path, "overage");
        if (qg__rc_overage(c, v, sub, &w->overage) < 0)
            return -1;
    }
    return c_window_type(c, n, path, w);
}

/* The windows list of a plan or org, plus the concurrency window when
 * concurrency > 0.  `owner` is the mapping, for errors without a list. */
int qg__rc_windows(qg__rctx *c, yaml_node_t *owner, yaml_node_t *n,
                   const char *path, int64_t concurrency, int64_t lease_ttl_ms,
                   qg_window_spec **out, int *nout)
{
    char sub[QG_Y_PATHCAP], g[80];
    int nuser = 0, total, i;

    if (n) {
        if (n->type != YAML_SEQUENCE_NODE)
            return qg__y_fail(&c->y, n, path,
                              "expected a list of windows, got %s",
                              qg__y_got(n, g, sizeof g));
        nuser = (int)(n->data.sequence.items.top -
                      n->data.sequence.items.start);
    }
    total = nuser + (concurrency > 0);
    if (total > QG_MAX_PLAN_WINDOWS)
        return qg__y_fail(&c->y, n ? n : owner, path,
                          "too many windows (at most %d, "
                          "counting the concurrency window)",
                          QG_MAX_PLAN_WINDOWS);
    if (total == 0)
        return 0;
    *out = calloc((size_t)total, sizeof **out);
    if (!*out)
        return qg__y_oom(&c->y, owner);
    *nout = total;
    for (i = 0; i < nuser; i++) {
        qg__y_path_idx(sub, path, i);
        if (c_window(c, qg__y_node(&c->y, n->data.sequence.items.start[i]),
                     sub, *out, i) < 0)
            return -1;
    }
    if (concurrency > 0) {
        qg_window_spec *w = &(*out)[nuser];
        w->name = strdup("concurrency");
        if (!w->name)
            return qg__y_oom(&c->y, owner);
        w->type = QG_WIN_CONCURRENCY;
        w->unit = QG_UNIT_REQUESTS;
        w->limit_milli = concurrency * QG_MILLI;
        w->lease_ttl_ms = lease_ttl_ms;
        w->line = (int)owner->start_mark.line + 1;
    }
    return 0;
}

