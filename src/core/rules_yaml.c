/* rules_yaml.c - compile the YAML text of a rules file into a qg_rules.
 *
 * Two passes over the text.  The first is libyaml's event parser alone, so
 * that a plain syntax error is reported with libyaml's own wording and
 * position, and anchors/aliases (which would let one node appear under
 * several paths) are refused.  The second loads the document tree and walks
 * it against the schema of PRODUCT.md section 2.  Every mapping's accepted
 * keys are declared once, as a table, which drives both validation and the
 * "expected one of ..." text.  Every error names the dotted path, the
 * 1-based line and column of the offending node and what was expected.
 * No I/O happens here except through the caller's time-zone resolver. */
#include "rules.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "civil.h"
#include "duration.h"
#include "fixed.h"
#include "quotagate.h"

#define PATHCAP 256
#define LISTCAP 320

/* ------------------------------------------------------------ context */

typedef struct pctx {
    yaml_document_t *doc;
    qg_diag *diag;
    qg_rules *r;
    qg_tz_resolver tzr;
    void *tzud;
    char **zone_names;      /* names as written, parallel to r->zones */
    int nzone_names;
    int oom;
} pctx;

typedef yaml_node_t node_t;

/* A key a mapping accepts; `mask` says for which variants (window types,
 * overage policies) it is meaningful.  ALL = every variant. */
typedef struct keydef {
    const char *name;
    unsigned mask;
} keydef;

#define ALL 0xffffffffu
#define BIT(x) (1u << (x))
#define NKEYS(t) (sizeof(t) / sizeof((t)[0]))

/* A scalar spelling and the value it stands for. */
typedef struct enumdef {
    const char *name;
    int value;
} enumdef;

static void vset_diag(pctx *c, const node_t *n, const char *path,
                      const char *fmt, va_list ap)
{
    char *msg = c->diag->message;
    size_t cap = sizeof c->diag->message, off = 0;
    c->diag->line = n ? (int)n->start_mark.line + 1 : 1;
    c->diag->column = n ? (int)n->start_mark.column + 1 : 1;
    if (path && *path) {
        size_t plen = strlen(path);
        if (plen > cap / 2)
            plen = cap / 2;
        memcpy(msg, path, plen);
        memcpy(msg + plen, ": ", 2);
        off = plen + 2;
    }
    vsnprintf(msg + off, cap - off, fmt, ap);
}

/* Record an error at node n and return -1. */
static int fail(pctx *c, const node_t *n, const char *path, const char *fmt,
                ...) __attribute__((format(printf, 4, 5)));
static int fail(pctx *c, const node_t *n, const char *path, const char *fmt,
                ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset_diag(c, n, path, fmt, ap);
    va_end(ap);
    return -1;
}

static int oom(pctx *c, const node_t *n)
{
    c->oom = 1;
    return fail(c, n, "", "out of memory");
}

/* path + "." + key (or just key at the top) */
static void path_key(char *out, const char *base, const char *key)
{
    int k = snprintf(out, PATHCAP, "%s%s%s", base, *base ? "." : "", key);
    if (k < 0 || k >= PATHCAP)
        out[PATHCAP - 1] = '\0';
}

static void path_idx(char *out, const char *base, long i)
{
    int k = snprintf(out, PATHCAP, "%s[%ld]", base, i);
    if (k < 0 || k >= PATHCAP)
        out[PATHCAP - 1] = '\0';
}

/* ------------------------------------------------------------- nodes */

static node_t *node_at(pctx *c, int idx)
{
    return yaml_document_get_node(c->doc, idx);
}

static const char *sval(const node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static int is_null(const node_t *n)
{
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length == 0 &&
           n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* What a node is, for "got ..." in messages. */
static const char *got(const node_t *n, char *buf, size_t cap)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (is_null(n))
        return "nothing";
    if (n->data.scalar.length > 60)
        snprintf(buf, cap, "\"%.57s...\"", sval(n));
    else
        snprintf(buf, cap, "\"%s\"", sval(n));
    return buf;
}

static int need_scalar(pctx *c, const node_t *n, const char *path,
                       const char *what)
{
    char g[80];
    if (n->type == YAML_SCALAR_NODE && !is_null(n) &&
        strlen(sval(n)) == n->data.scalar.length)
        return 0;
    return fail(c, n, path, "expected %s, got %s", what, got(n, g, sizeof g));
}

/* Value of `key` in mapping m, or NULL. */
static node_t *get(pctx *c, node_t *m, const char *key)
{
    yaml_node_pair_t *p;
    for (p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        node_t *k = node_at(c, p->key);
        if (k && k->type == YAML_SCALAR_NODE && strcmp(sval(k), key) == 0)
            return node_at(c, p->value);
    }
    return NULL;
}

static int need_key(pctx *c, node_t *m, const char *path, const char *key,
                    node_t **out)
{
    *out = get(c, m, key);
    if (*out)
        return 0;
    return fail(c, m, path, "missing required key \"%s\"", key);
}

static void join_keys(char *buf, size_t cap, const keydef *keys, size_t n)
{
    size_t i, off = 0;
    buf[0] = '\0';
    for (i = 0; i < n && off < cap; i++) {
        int k = snprintf(buf + off, cap - off, "%s%s", i ? ", " : "",
                         keys[i].name);
        if (k < 0)
            break;
        off += (size_t)k;
    }
}

static void join_enum(char *buf, size_t cap, const enumdef *e, size_t n)
{
    size_t i, off = 0;
    buf[0] = '\0';
    for (i = 0; i < n && off < cap; i++) {
        int k = snprintf(buf + off, cap - off, "%s%s", i ? ", " : "",
                         e[i].name);
        if (k < 0)
            break;
        off += (size_t)k;
    }
}

/* Names of n structs of `stride` bytes whose char* name is at `offset`. */
static void join_names(char *buf, size_t cap, const void *base, size_t stride,
                       size_t offset, int n)
{
    size_t off = 0;
    int i;
    buf[0] = '\0';
    for (i = 0; i < n && off < cap; i++) {
        const char *nm =
            *(char *const *)((const char *)base + (size_t)i * stride + offset);
        int k = snprintf(buf + off, cap - off, "%s%s", i ? ", " : "",
                         nm ? nm : "?");
        if (k < 0)
            break;
        off += (size_t)k;
    }
}

/* Check that n is a mapping whose keys are scalars from `keys`, each at
 * most once, and meaningful for variant `sel` (described by `variant`,
 * e.g. "calendar windows"). */
static int check_map(pctx *c, node_t *n, const char *path,
                     const keydef *keys, size_t nkeys, unsigned sel,
                     const char *variant)
{
    yaml_node_pair_t *p, *q;
    char g[80], list[LISTCAP];
    size_t i;

    if (n->type != YAML_MAPPING_NODE)
        return fail(c, n, path, "expected a mapping, got %s",
                    got(n, g, sizeof g));
    for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        node_t *k = node_at(c, p->key);
        if (k->type != YAML_SCALAR_NODE)
            return fail(c, k, path, "expected a key name, got %s",
                        got(k, g, sizeof g));
        for (i = 0; i < nkeys; i++)
            if (strcmp(keys[i].name, sval(k)) == 0)
                break;
        if (i == nkeys) {
            join_keys(list, sizeof list, keys, nkeys);
            return fail(c, k, path, "unknown key \"%s\" (expected one of: %s)",
                        sval(k), list);
        }
        if (!(keys[i].mask & sel))
            return fail(c, k, path, "%s is not used by %s", keys[i].name,
                        variant);
        for (q = n->data.mapping.pairs.start; q < p; q++)
            if (strcmp(sval(node_at(c, q->key)), sval(k)) == 0)
                return fail(c, k, path, "duplicate key \"%s\"", sval(k));
    }
    return 0;
}

/* A mapping from names to entries: keys are unique names that fit
 * QG_NAME_MAX.  Returns the number of pairs, or -1. */
static int check_names(pctx *c, node_t *n, const char *path, int nonempty,
                       int max)
{
    yaml_node_pair_t *p, *q;
    char g[80];
    int count = 0;

    if (n->type != YAML_MAPPING_NODE)
        return fail(c, n, path, "expected a mapping of names, got %s",
                    got(n, g, sizeof g));
    for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        node_t *k = node_at(c, p->key);
        if (need_scalar(c, k, path, "a name") < 0)
            return -1;
        if (k->data.scalar.length >= QG_NAME_MAX)
            return fail(c, k, path, "name \"%.20s...\" is too long (at most %d "
                        "characters)", sval(k), QG_NAME_MAX - 1);
        for (q = n->data.mapping.pairs.start; q < p; q++)
            if (strcmp(sval(node_at(c, q->key)), sval(k)) == 0)
                return fail(c, k, path, "duplicate name \"%s\"", sval(k));
        if (++count > max)
            return fail(c, k, path, "too many entries (at most %d)", max);
    }
    if (nonempty && count == 0)
        return fail(c, n, path, "expected at least one entry");
    return count;
}

/* ------------------------------------------------------------ scalars */

static int p_string(pctx *c, node_t *n, const char *path, char **out)
{
    if (need_scalar(c, n, path, "a string") < 0)
        return -1;
    free(*out);
    *out = strdup(sval(n));
    return *out ? 0 : oom(c, n);
}

static int p_name(pctx *c, node_t *n, const char *path, char **out)
{
    if (need_scalar(c, n, path, "a name") < 0)
        return -1;
    if (n->data.scalar.length >= QG_NAME_MAX)
        return fail(c, n, path, "name is too long (at most %d characters)",
                    QG_NAME_MAX - 1);
    return p_string(c, n, path, out);
}

enum { NONNEG, POSITIVE };

/* Decimal with at most `scale` fractional digits, scaled by 10^scale. */
static int p_decimal(pctx *c, node_t *n, const char *path, int scale,
                     int sign, int64_t *out)
{
    const char *what = sign == POSITIVE ? "a positive number" : "a number >= 0";
    char g[80];
    int rc;

    if (need_scalar(c, n, path, what) < 0)
        return -1;
    rc = qg_fixed_parse(sval(n), n->data.scalar.length, scale, out);
    if (rc == -2)
        return fail(c, n, path, "expected %s with at most %d decimal places, "
                    "got %s", what, scale, got(n, g, sizeof g));
    if (rc == -3)
        return fail(c, n, path, "number out of range, got %s",
                    got(n, g, sizeof g));
    if (rc < 0 || *out < 0 || (sign == POSITIVE && *out == 0))
        return fail(c, n, path, "expected %s, got %s", what,
                    got(n, g, sizeof g));
    return 0;
}

/* Integer in [min, max]. */
static int p_int(pctx *c, node_t *n, const char *path, int64_t min,
                 int64_t max, int64_t *out)
{
    char g[80];
    int rc;

    if (need_scalar(c, n, path, "an integer") < 0)
        return -1;
    rc = qg_fixed_parse(sval(n), n->data.scalar.length, 0, out);
    if (rc == -3 || (rc == 0 && *out > max))
        return fail(c, n, path, "number out of range (at most %lld), got %s",
                    (long long)max, got(n, g, sizeof g));
    if (rc < 0 || *out < min)
        return fail(c, n, path, "expected an integer >= %lld, got %s",
                    (long long)min, got(n, g, sizeof g));
    return 0;
}

static int p_duration(pctx *c, node_t *n, const char *path, int sign,
                      int64_t *out)
{
    char g[80];
    int rc;

    if (need_scalar(c, n, path, "a duration such as 90s, 30m, 5h, 7d") < 0)
        return -1;
    rc = qg_duration_parse(sval(n), n->data.scalar.length, out);
    if (rc == -3)
        return fail(c, n, path, "duration out of range, got %s",
                    got(n, g, sizeof g));
    if (rc < 0)
        return fail(c, n, path, "expected a duration such as 90s, 30m, 5h, "
                    "7d, got %s", got(n, g, sizeof g));
    if (sign == POSITIVE && *out == 0)
        return fail(c, n, path, "expected a duration > 0, got %s",
                    got(n, g, sizeof g));
    return 0;
}

static int p_date(pctx *c, node_t *n, const char *path, int64_t *out)
{
    static const char what[] =
        "a date such as \"2026-10-15\" or an instant such as "
        "\"2026-01-31T09:00:00Z\"";
    char g[80];
    if (need_scalar(c, n, path, what) < 0)
        return -1;
    if (qg_iso8601_parse(sval(n), out) < 0)
        return fail(c, n, path, "expected %s, got %s", what,
                    got(n, g, sizeof g));
    return 0;
}

/* One of the spellings in table e; `what` names the kind in messages. */
static int p_enum(pctx *c, node_t *n, const char *path, const char *what,
                  const enumdef *e, size_t ne, int *out)
{
    char list[LISTCAP], g[80];
    size_t i;

    join_enum(list, sizeof list, e, ne);
    if (n->type != YAML_SCALAR_NODE || is_null(n))
        return fail(c, n, path, "expected one of: %s, got %s", list,
                    got(n, g, sizeof g));
    for (i = 0; i < ne; i++)
        if (strcmp(e[i].name, sval(n)) == 0) {
            *out = e[i].value;
            return 0;
        }
    return fail(c, n, path, "unknown %s %s (expected one of: %s)", what,
                got(n, g, sizeof g), list);
}

static const enumdef bools[] = {
    { "true", 1 }, { "false", 0 }, { "yes", 1 }, { "no", 0 },
};

/* ------------------------------------------------------- references */

static int p_model_ref(pctx *c, node_t *n, const char *path, int *out)
{
    char list[LISTCAP];
    if (need_scalar(c, n, path, "a model name") < 0)
        return -1;
    *out = qg_rules_find_model(c->r, sval(n));
    if (*out >= 0)
        return 0;
    join_names(list, sizeof list, c->r->models, sizeof(qg_model),
               offsetof(qg_model, name), c->r->nmodels);
    return fail(c, n, path, "unknown model \"%s\" (models are: %s)", sval(n),
                list);
}

static int p_plan_ref(pctx *c, node_t *n, const char *path, int *out)
{
    char list[LISTCAP];
    if (need_scalar(c, n, path, "a plan name") < 0)
        return -1;
    *out = qg_rules_find_plan(c->r, sval(n));
    if (*out >= 0)
        return 0;
    join_names(list, sizeof list, c->r->plans, sizeof(qg_plan),
               offsetof(qg_plan, name), c->r->nplans);
    return fail(c, n, path, "unknown plan \"%s\" (plans are: %s)", sval(n),
                list);
}

static int p_org_ref(pctx *c, node_t *n, const char *path, int *out)
{
    char list[LISTCAP];
    if (need_scalar(c, n, path, "an org name") < 0)
        return -1;
    *out = qg_rules_find_org(c->r, sval(n));
    if (*out >= 0)
        return 0;
    if (c->r->norgs == 0)
        return fail(c, n, path, "unknown org \"%s\" (no orgs are defined)",
                    sval(n));
    join_names(list, sizeof list, c->r->orgs, sizeof(qg_org_spec),
               offsetof(qg_org_spec, name), c->r->norgs);
    return fail(c, n, path, "unknown org \"%s\" (orgs are: %s)", sval(n),
                list);
}

/* Resolve a zone name once per rule set; the rules own the zone. */
static int resolve_tz(pctx *c, node_t *n, const char *path, const char *name,
                      const qg_tz **out)
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
        z = strcmp(name, "UTC") == 0 ? qg_tz_utc() : NULL;
    if (!z)
        return fail(c, n, path, "unknown time zone \"%s\"%s%s", name,
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
        qg_tz_free(z);
        return oom(c, n);
    }
    c->r->zones[c->r->nzones] = z;
    c->zone_names[c->r->nzones] = copy;
    c->r->nzones++;
    c->nzone_names = c->r->nzones;
    *out = z;
    return 0;
}

/* ------------------------------------------------------------ overage */

static const enumdef policies[] = {
    { "reject", QG_POLICY_REJECT },
    { "queue", QG_POLICY_QUEUE },
    { "downgrade", QG_POLICY_DOWNGRADE },
    { "payg", QG_POLICY_PAYG },
};

static const keydef overage_keys[] = {
    { "policy", ALL },
    { "max_wait", BIT(QG_POLICY_QUEUE) },
    { "queue_size", BIT(QG_POLICY_QUEUE) },
    { "to_model", BIT(QG_POLICY_DOWNGRADE) },
    { "price_per_unit", BIT(QG_POLICY_PAYG) },
    { "spending_cap", BIT(QG_POLICY_PAYG) },
};

static const keydef usd_keys[] = { { "usd_month", ALL } };

/* {usd_month: decimal} -> micro-dollars */
static int p_usd_month(pctx *c, node_t *n, const char *path, int64_t *out)
{
    char sub[PATHCAP];
    node_t *v;
    if (check_map(c, n, path, usd_keys, NKEYS(usd_keys), ALL, "") < 0 ||
        need_key(c, n, path, "usd_month", &v) < 0)
        return -1;
    path_key(sub, path, "usd_month");
    return p_decimal(c, v, sub, 6, NONNEG, out);
}

static int c_overage(pctx *c, node_t *n, const char *path, qg_overage *o)
{
    char sub[PATHCAP], variant[48];
    node_t *v;
    int pol;
    int64_t x;

    if (check_map(c, n, path, overage_keys, NKEYS(overage_keys), ALL, "") < 0)
        return -1;
    if (need_key(c, n, path, "policy", &v) < 0)
        return -1;
    path_key(sub, path, "policy");
    if (p_enum(c, v, sub, "overage policy", policies, NKEYS(policies),
               &pol) < 0)
        return -1;
    snprintf(variant, sizeof variant, "the %s policy", sval(v));
    if (check_map(c, n, path, overage_keys, NKEYS(overage_keys), BIT(pol),
                  variant) < 0)
        return -1;
    o->policy = (qg_policy)pol;
    o->queue_size = 64;
    o->to_model = -1;
    if (pol == QG_POLICY_QUEUE) {
        if (need_key(c, n, path, "max_wait", &v) < 0)
            return -1;
        path_key(sub, path, "max_wait");
        if (p_duration(c, v, sub, POSITIVE, &o->max_wait_ms) < 0)
            return -1;
        if ((v = get(c, n, "queue_size"))) {
            path_key(sub, path, "queue_size");
            if (p_int(c, v, sub, 1, INT32_MAX, &x) < 0)
                return -1;
            o->queue_size = (int32_t)x;
        }
    } else if (pol == QG_POLICY_DOWNGRADE) {
        if (need_key(c, n, path, "to_model", &v) < 0)
            return -1;
        path_key(sub, path, "to_model");
        if (p_model_ref(c, v, sub, &o->to_model) < 0)
            return -1;
    } else if (pol == QG_POLICY_PAYG) {
        if (need_key(c, n, path, "price_per_unit", &v) < 0)
            return -1;
        path_key(sub, path, "price_per_unit");
        if (p_decimal(c, v, sub, 6, NONNEG, &o->price_per_unit_micro) < 0)
            return -1;
        if ((v = get(c, n, "spending_cap"))) {
            path_key(sub, path, "spending_cap");
            if (p_usd_month(c, v, sub, &o->spending_cap_micro) < 0)
                return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ windows */

static const enumdef win_types[] = {
    { "rolling", QG_WIN_ROLLING },
    { "calendar", QG_WIN_CALENDAR },
    { "session", QG_WIN_SESSION },
    { "rate", QG_WIN_RATE },
};

static const enumdef units[] = {
    { "weight", QG_UNIT_WEIGHT },
    { "requests", QG_UNIT_REQUESTS },
};

#define W_ROLL BIT(QG_WIN_ROLLING)
#define W_CAL BIT(QG_WIN_CALENDAR)
#define W_SESS BIT(QG_WIN_SESSION)
#define W_RATE BIT(QG_WIN_RATE)

static const keydef window_keys[] = {
    { "name", ALL },          { "type", ALL },
    { "limit", ALL },         { "unit", ALL },
    { "length", W_ROLL | W_SESS },
    { "precision", W_ROLL },  { "max_entries", W_ROLL },
    { "per", W_RATE },        { "burst", W_RATE },
    { "every", W_CAL },       { "at", W_CAL },
    { "anchor", W_CAL },      { "tz", W_CAL },
    { "models", ALL },        { "overage", ALL },
};

static const enumdef everies[] = {
    { "day", QG_EVERY_DAY },
    { "week", QG_EVERY_WEEK },
    { "month", QG_EVERY_MONTH },
};

static const enumdef weekdays[] = {
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
        for (i = 0; i < NKEYS(weekdays); i++)
            if ((size_t)(sp - s) == strlen(weekdays[i].name) &&
                strncasecmp(s, weekdays[i].name, (size_t)(sp - s)) == 0)
                break;
        if (i == NKEYS(weekdays))
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

static int c_calendar(pctx *c, node_t *n, const char *path, qg_window_spec *w)
{
    char sub[PATHCAP], g[80];
    const struct at_form *form = NULL;
    node_t *v;
    int every;
    size_t i;

    if (need_key(c, n, path, "every", &v) < 0)
        return -1;
    path_key(sub, path, "every");
    if (p_enum(c, v, sub, "calendar period", everies, NKEYS(everies),
               &every) < 0)
        return -1;
    w->cal.every = (qg_every)every;
    w->cal.mday = 1;
    for (i = 0; i < NKEYS(at_forms); i++)
        if (at_forms[i].every == w->cal.every)
            form = &at_forms[i];
    if (!form || parse_at(form->deflt, &w->cal) < 0)
        return fail(c, v, sub, "internal: no default for this period");
    if ((v = get(c, n, "at"))) {
        path_key(sub, path, "at");
        if (need_scalar(c, v, sub, form->expected) < 0)
            return -1;
        if (parse_at(sval(v), &w->cal) < 0)
            return fail(c, v, sub, "expected %s, got %s", form->expected,
                        got(v, g, sizeof g));
    }
    if ((v = get(c, n, "anchor"))) {
        path_key(sub, path, "anchor");
        if (v->type != YAML_SCALAR_NODE || strcmp(sval(v), "billing") != 0)
            return fail(c, v, sub, "expected \"billing\", got %s",
                        got(v, g, sizeof g));
        if (w->cal.every != QG_EVERY_MONTH)
            return fail(c, v, sub, "anchor: billing needs every: month");
        w->cal.anchor_billing = 1;
    }
    if ((v = get(c, n, "tz"))) {
        path_key(sub, path, "tz");
        if (need_scalar(c, v, sub, "an IANA time zone name") < 0)
            return -1;
        return resolve_tz(c, v, sub, sval(v), &w->cal.tz);
    }
    return resolve_tz(c, n, path, "UTC", &w->cal.tz);
}

static int c_models_mask(pctx *c, node_t *n, const char *path, uint64_t *mask)
{
    char sub[PATHCAP], g[80];
    yaml_node_item_t *it;
    int m;

    if (n->type != YAML_SEQUENCE_NODE ||
        n->data.sequence.items.start == n->data.sequence.items.top)
        return fail(c, n, path, "expected a non-empty list of model names, "
                    "got %s", got(n, g, sizeof g));
    for (it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        path_idx(sub, path, it - n->data.sequence.items.start);
        if (p_model_ref(c, node_at(c, *it), sub, &m) < 0)
            return -1;
        *mask |= (uint64_t)1 << m;
    }
    return 0;
}

/* The type-specific part of a window. */
static int c_window_type(pctx *c, node_t *n, const char *path,
                         qg_window_spec *w)
{
    char sub[PATHCAP], g[80];
    node_t *v;
    int64_t x;

    switch (w->type) {
    case QG_WIN_ROLLING:
    case QG_WIN_SESSION:
        if (need_key(c, n, path, "length", &v) < 0)
            return -1;
        path_key(sub, path, "length");
        if (p_duration(c, v, sub, POSITIVE, &w->length_ms) < 0)
            return -1;
        if (w->type == QG_WIN_SESSION)
            return 0;
        w->max_entries = 1024;
        if ((v = get(c, n, "precision"))) {
            path_key(sub, path, "precision");
            if (v->type == YAML_SCALAR_NODE && strcmp(sval(v), "exact") == 0)
                w->precision_ms = 0;
            else if (v->type != YAML_SCALAR_NODE ||
                     qg_duration_parse(sval(v), v->data.scalar.length,
                                       &w->precision_ms) < 0 ||
                     w->precision_ms <= 0 || w->precision_ms > w->length_ms)
                return fail(c, v, sub, "expected \"exact\" or a duration > 0 "
                            "and at most the window length, got %s",
                            got(v, g, sizeof g));
        }
        if ((v = get(c, n, "max_entries"))) {
            path_key(sub, path, "max_entries");
            if (p_int(c, v, sub, 16, UINT32_MAX, &x) < 0)
                return -1;
            w->max_entries = (uint32_t)x;
        }
        return 0;
    case QG_WIN_RATE:
        if (need_key(c, n, path, "per", &v) < 0)
            return -1;
        path_key(sub, path, "per");
        if (p_duration(c, v, sub, POSITIVE, &w->length_ms) < 0)
            return -1;
        w->burst_milli = w->limit_milli;
        if ((v = get(c, n, "burst"))) {
            path_key(sub, path, "burst");
            if (p_decimal(c, v, sub, 3, POSITIVE, &w->burst_milli) < 0)
                return -1;
        }
        return 0;
    case QG_WIN_CALENDAR:
        return c_calendar(c, n, path, w);
    default:
        return fail(c, n, path, "internal: window type %d", (int)w->type);
    }
}

static int c_window(pctx *c, node_t *n, const char *path, qg_window_spec *ws,
                    int idx)
{
    qg_window_spec *w = &ws[idx];
    char sub[PATHCAP], variant[48];
    node_t *v;
    int t, i;

    if (check_map(c, n, path, window_keys, NKEYS(window_keys), ALL, "") < 0)
        return -1;
    w->line = (int)n->start_mark.line + 1;
    if (need_key(c, n, path, "name", &v) < 0)
        return -1;
    path_key(sub, path, "name");
    if (p_name(c, v, sub, &w->name) < 0)
        return -1;
    if (strcmp(w->name, "concurrency") == 0)
        return fail(c, v, sub, "window name \"concurrency\" is reserved "
                    "(use concurrency: N on the plan or org)");
    for (i = 0; i < idx; i++)
        if (strcmp(ws[i].name, w->name) == 0)
            return fail(c, v, sub, "duplicate window name \"%s\" (first "
                        "defined at line %d)", w->name, ws[i].line);
    if (need_key(c, n, path, "type", &v) < 0)
        return -1;
    path_key(sub, path, "type");
    if (p_enum(c, v, sub, "window type", win_types, NKEYS(win_types), &t) < 0)
        return -1;
    w->type = (qg_win_type)t;
    snprintf(variant, sizeof variant, "%s windows", sval(v));
    if (check_map(c, n, path, window_keys, NKEYS(window_keys), BIT(t),
                  variant) < 0)
        return -1;
    if (need_key(c, n, path, "limit", &v) < 0)
        return -1;
    path_key(sub, path, "limit");
    if (p_decimal(c, v, sub, 3, POSITIVE, &w->limit_milli) < 0)
        return -1;
    if ((v = get(c, n, "unit"))) {
        path_key(sub, path, "unit");
        if (p_enum(c, v, sub, "unit", units, NKEYS(units), &t) < 0)
            return -1;
        w->unit = (qg_unit)t;
    }
    if ((v = get(c, n, "models"))) {
        path_key(sub, path, "models");
        if (c_models_mask(c, v, sub, &w->model_mask) < 0)
            return -1;
    }
    if ((v = get(c, n, "overage"))) {
        path_key(sub, path, "overage");
        if (c_overage(c, v, sub, &w->overage) < 0)
            return -1;
    }
    return c_window_type(c, n, path, w);
}

/* The windows list of a plan or org, plus the concurrency window when
 * concurrency > 0.  `owner` is the mapping, for errors without a list. */
static int c_windows(pctx *c, node_t *owner, node_t *n, const char *path,
                     int64_t concurrency, int64_t lease_ttl_ms,
                     qg_window_spec **out, int *nout)
{
    char sub[PATHCAP], g[80];
    int nuser = 0, total, i;

    if (n) {
        if (n->type != YAML_SEQUENCE_NODE)
            return fail(c, n, path, "expected a list of windows, got %s",
                        got(n, g, sizeof g));
        nuser = (int)(n->data.sequence.items.top -
                      n->data.sequence.items.start);
    }
    total = nuser + (concurrency > 0);
    if (total > QG_MAX_PLAN_WINDOWS)
        return fail(c, n ? n : owner, path, "too many windows (at most %d, "
                    "counting the concurrency window)", QG_MAX_PLAN_WINDOWS);
    if (total == 0)
        return 0;
    *out = calloc((size_t)total, sizeof **out);
    if (!*out)
        return oom(c, owner);
    *nout = total;
    for (i = 0; i < nuser; i++) {
        path_idx(sub, path, i);
        if (c_window(c, node_at(c, n->data.sequence.items.start[i]), sub,
                     *out, i) < 0)
            return -1;
    }
    if (concurrency > 0) {
        qg_window_spec *w = &(*out)[nuser];
        w->name = strdup("concurrency");
        if (!w->name)
            return oom(c, owner);
        w->type = QG_WIN_CONCURRENCY;
        w->unit = QG_UNIT_REQUESTS;
        w->limit_milli = concurrency * QG_MILLI;
        w->lease_ttl_ms = lease_ttl_ms;
        w->line = (int)owner->start_mark.line + 1;
    }
    return 0;
}

/* concurrency and lease_ttl of a plan or org mapping. */
static int c_concurrency(pctx *c, node_t *m, const char *path, int64_t *conc,
                         int64_t *ttl)
{
    char sub[PATHCAP];
    node_t *v;
    *conc = 0;
    *ttl = 15 * 60000LL;
    if ((v = get(c, m, "concurrency"))) {
        path_key(sub, path, "concurrency");
        if (p_int(c, v, sub, 1, INT64_MAX / QG_MILLI, conc) < 0)
            return -1;
    }
    if ((v = get(c, m, "lease_ttl"))) {
        path_key(sub, path, "lease_ttl");
        if (p_duration(c, v, sub, POSITIVE, ttl) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- plans */

static const keydef plan_keys[] = {
    { "price", ALL },       { "windows", ALL },  { "concurrency", ALL },
    { "lease_ttl", ALL },   { "overage", ALL },  { "claims", ALL },
};

static const keydef claim_keys[] = {
    { "multiplier", ALL }, { "vs", ALL }, { "window", ALL },
    { "unit", ALL },       { "disclose_effective", ALL },
};

static int c_plan(pctx *c, node_t *m, const char *path, qg_plan *p)
{
    char sub[PATHCAP];
    node_t *v;
    int64_t ttl;

    if (check_map(c, m, path, plan_keys, NKEYS(plan_keys), ALL, "") < 0)
        return -1;
    p->price_micro = -1;
    p->overage.policy = QG_POLICY_REJECT;
    p->overage.to_model = -1;
    p->overage.queue_size = 64;
    if ((v = get(c, m, "price"))) {
        path_key(sub, path, "price");
        if (p_usd_month(c, v, sub, &p->price_micro) < 0)
            return -1;
    }
    if ((v = get(c, m, "overage"))) {
        path_key(sub, path, "overage");
        if (c_overage(c, v, sub, &p->overage) < 0)
            return -1;
    }
    if (c_concurrency(c, m, path, &p->concurrency, &ttl) < 0)
        return -1;
    p->lease_ttl_ms = ttl;
    path_key(sub, path, "windows");
    return c_windows(c, m, get(c, m, "windows"), sub, p->concurrency, ttl,
                     &p->windows, &p->nwindows);
}

static int c_claim(pctx *c, node_t *m, const char *path, qg_plan *p,
                   qg_claim *cl)
{
    char sub[PATHCAP];
    node_t *v;
    int b;
    const qg_plan *vs;

    if (check_map(c, m, path, claim_keys, NKEYS(claim_keys), ALL, "") < 0)
        return -1;
    cl->line = (int)m->start_mark.line + 1;
    if (need_key(c, m, path, "multiplier", &v) < 0)
        return -1;
    path_key(sub, path, "multiplier");
    if (p_decimal(c, v, sub, 3, POSITIVE, &cl->multiplier_milli) < 0)
        return -1;
    if (need_key(c, m, path, "vs", &v) < 0)
        return -1;
    path_key(sub, path, "vs");
    if (p_plan_ref(c, v, sub, &cl->vs_plan) < 0)
        return -1;
    vs = &c->r->plans[cl->vs_plan];
    if (need_key(c, m, path, "window", &v) < 0)
        return -1;
    path_key(sub, path, "window");
    if (p_name(c, v, sub, &cl->window) < 0)
        return -1;
    if (!qg_plan_find_window(p, cl->window))
        return fail(c, v, sub, "plan %s has no window \"%s\"", p->name,
                    cl->window);
    if (!qg_plan_find_window(vs, cl->window))
        return fail(c, v, sub, "plan %s has no window \"%s\"", vs->name,
                    cl->window);
    if ((v = get(c, m, "unit"))) {
        path_key(sub, path, "unit");
        if (p_string(c, v, sub, &cl->unit) < 0)
            return -1;
    }
    if ((v = get(c, m, "disclose_effective"))) {
        path_key(sub, path, "disclose_effective");
        if (p_enum(c, v, sub, "boolean", bools, NKEYS(bools), &b) < 0)
            return -1;
        cl->disclose_effective = b;
    }
    return 0;
}

static int c_claims(pctx *c, node_t *n, const char *path, qg_plan *p)
{
    char sub[PATHCAP], g[80];
    int i, cnt;

    if (n->type != YAML_SEQUENCE_NODE)
        return fail(c, n, path, "expected a list of claims, got %s",
                    got(n, g, sizeof g));
    cnt = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt == 0)
        return 0;
    p->claims = calloc((size_t)cnt, sizeof *p->claims);
    if (!p->claims)
        return oom(c, n);
    p->nclaims = cnt;
    for (i = 0; i < cnt; i++) {
        path_idx(sub, path, i);
        if (c_claim(c, node_at(c, n->data.sequence.items.start[i]), sub, p,
                    &p->claims[i]) < 0)
            return -1;
    }
    return 0;
}

/* Names first (claims may name later plans), then bodies, then claims. */
static int c_plans(pctx *c, node_t *n, const char *path)
{
    char sub[PATHCAP], sub2[PATHCAP];
    int cnt, i;
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    node_t *v;

    cnt = check_names(c, n, path, 1, 1 << 16);
    if (cnt < 0)
        return -1;
    c->r->plans = calloc((size_t)cnt, sizeof *c->r->plans);
    if (!c->r->plans)
        return oom(c, n);
    c->r->nplans = cnt;
    for (i = 0; i < cnt; i++) {
        node_t *k = node_at(c, pairs[i].key);
        c->r->plans[i].index = i;
        c->r->plans[i].line = (int)k->start_mark.line + 1;
        if (!(c->r->plans[i].name = strdup(sval(k))))
            return oom(c, k);
    }
    for (i = 0; i < cnt; i++) {
        path_key(sub, path, c->r->plans[i].name);
        if (c_plan(c, node_at(c, pairs[i].value), sub, &c->r->plans[i]) < 0)
            return -1;
    }
    for (i = 0; i < cnt; i++) {
        path_key(sub, path, c->r->plans[i].name);
        if ((v = get(c, node_at(c, pairs[i].value), "claims"))) {
            path_key(sub2, sub, "claims");
            if (c_claims(c, v, sub2, &c->r->plans[i]) < 0)
                return -1;
        }
    }
    return 0;
}

/* -------------------------------------------------------------- orgs */

static const keydef org_keys[] = {
    { "windows", ALL }, { "concurrency", ALL }, { "lease_ttl", ALL },
};

static int c_orgs(pctx *c, node_t *n, const char *path)
{
    char sub[PATHCAP], sub2[PATHCAP];
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    int cnt, i;
    int64_t conc, ttl;

    cnt = check_names(c, n, path, 0, 1 << 16);
    if (cnt <= 0)
        return cnt;
    c->r->orgs = calloc((size_t)cnt, sizeof *c->r->orgs);
    if (!c->r->orgs)
        return oom(c, n);
    c->r->norgs = cnt;
    for (i = 0; i < cnt; i++) {
        node_t *k = node_at(c, pairs[i].key), *m = node_at(c, pairs[i].value);
        qg_org_spec *o = &c->r->orgs[i];
        o->index = i;
        o->line = (int)k->start_mark.line + 1;
        if (!(o->name = strdup(sval(k))))
            return oom(c, k);
        path_key(sub, path, o->name);
        if (check_map(c, m, sub, org_keys, NKEYS(org_keys), ALL, "") < 0 ||
            c_concurrency(c, m, sub, &conc, &ttl) < 0)
            return -1;
        path_key(sub2, sub, "windows");
        if (c_windows(c, m, get(c, m, "windows"), sub2, conc, ttl,
                      &o->windows, &o->nwindows) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ weights */

static const keydef weights_keys[] = {
    { "version", ALL }, { "calibrated", ALL }, { "models", ALL },
};

static const keydef model_keys[] = {
    { "per_request", ALL },  { "input_per_1k", ALL },
    { "output_per_1k", ALL }, { "changed", ALL },
};

/* A model's coefficients: key, scale, and where it goes. */
static const struct coef {
    const char *key;
    int scale;
    size_t offset;
} coefs[] = {
    { "per_request", 3, offsetof(qg_model, per_request_milli) },
    { "input_per_1k", 6, offsetof(qg_model, input_per_1k_micro) },
    { "output_per_1k", 6, offsetof(qg_model, output_per_1k_micro) },
};

static int c_model(pctx *c, node_t *m, const char *path, qg_model *md)
{
    char sub[PATHCAP];
    node_t *v;
    size_t i;

    if (check_map(c, m, path, model_keys, NKEYS(model_keys), ALL, "") < 0)
        return -1;
    for (i = 0; i < NKEYS(coefs); i++) {
        if (!(v = get(c, m, coefs[i].key)))
            continue;
        path_key(sub, path, coefs[i].key);
        if (p_decimal(c, v, sub, coefs[i].scale, NONNEG,
                      (int64_t *)((char *)md + coefs[i].offset)) < 0)
            return -1;
    }
    if ((v = get(c, m, "changed"))) {
        path_key(sub, path, "changed");
        if (p_date(c, v, sub, &md->changed_ms) < 0)
            return -1;
    }
    return 0;
}

static int c_weights(pctx *c, node_t *n, const char *path)
{
    char sub[PATHCAP], sub2[PATHCAP];
    yaml_node_pair_t *pairs;
    node_t *v;
    int cnt, i;

    if (check_map(c, n, path, weights_keys, NKEYS(weights_keys), ALL, "") < 0)
        return -1;
    if (need_key(c, n, path, "version", &v) < 0)
        return -1;
    path_key(sub, path, "version");
    if (p_string(c, v, sub, &c->r->weights_version) < 0)
        return -1;
    if (need_key(c, n, path, "calibrated", &v) < 0)
        return -1;
    path_key(sub, path, "calibrated");
    if (p_date(c, v, sub, &c->r->calibrated_ms) < 0)
        return -1;
    if (need_key(c, n, path, "models", &v) < 0)
        return -1;
    path_key(sub, path, "models");
    cnt = check_names(c, v, sub, 1, QG_MAX_MODELS);
    if (cnt < 0)
        return -1;
    c->r->models = calloc((size_t)cnt, sizeof *c->r->models);
    if (!c->r->models)
        return oom(c, v);
    c->r->nmodels = cnt;
    pairs = v->data.mapping.pairs.start;
    for (i = 0; i < cnt; i++) {
        node_t *k = node_at(c, pairs[i].key);
        qg_model *md = &c->r->models[i];
        md->index = i;
        md->line = (int)k->start_mark.line + 1;
        if (!(md->name = strdup(sval(k))))
            return oom(c, k);
        path_key(sub2, sub, md->name);
        if (c_model(c, node_at(c, pairs[i].value), sub2, md) < 0)
            return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- subjects */

static const keydef subject_keys[] = {
    { "plan", ALL }, { "org", ALL }, { "billing_anchor", ALL },
};

static int c_subjects(pctx *c, node_t *n, const char *path)
{
    char sub[PATHCAP], sub2[PATHCAP];
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    int cnt, i;
    node_t *v;

    cnt = check_names(c, n, path, 0, 1 << 20);
    if (cnt <= 0)
        return cnt;
    c->r->subjects = calloc((size_t)cnt, sizeof *c->r->subjects);
    if (!c->r->subjects)
        return oom(c, n);
    c->r->nsubjects = cnt;
    for (i = 0; i < cnt; i++) {
        node_t *k = node_at(c, pairs[i].key), *m = node_at(c, pairs[i].value);
        qg_subject_spec *s = &c->r->subjects[i];
        s->org = -1;
        if (!(s->name = strdup(sval(k))))
            return oom(c, k);
        path_key(sub, path, s->name);
        if (check_map(c, m, sub, subject_keys, NKEYS(subject_keys), ALL,
                      "") < 0 ||
            need_key(c, m, sub, "plan", &v) < 0)
            return -1;
        path_key(sub2, sub, "plan");
        if (p_plan_ref(c, v, sub2, &s->plan) < 0)
            return -1;
        if ((v = get(c, m, "org"))) {
            path_key(sub2, sub, "org");
            if (p_org_ref(c, v, sub2, &s->org) < 0)
                return -1;
        }
        if ((v = get(c, m, "billing_anchor"))) {
            path_key(sub2, sub, "billing_anchor");
            if (p_date(c, v, sub2, &s->billing_anchor_ms) < 0)
                return -1;
        }
    }
    return 0;
}

/* ----------------------------------------------------------- analysis */

static const keydef analysis_keys[] = {
    { "request", ALL }, { "duration", ALL }, { "period", ALL },
};

#define REQ_MODEL BIT(1)
#define REQ_WEIGHT BIT(2)

static const keydef request_keys[] = {
    { "model", REQ_MODEL },         { "input_tokens", REQ_MODEL },
    { "output_tokens", REQ_MODEL }, { "weight", REQ_WEIGHT },
};

static int c_request(pctx *c, node_t *n, const char *path,
                     qg_analysis_spec *a)
{
    char sub[PATHCAP];
    node_t *v;

    if (check_map(c, n, path, request_keys, NKEYS(request_keys), ALL, "") < 0)
        return -1;
    if ((v = get(c, n, "weight"))) {
        if (check_map(c, n, path, request_keys, NKEYS(request_keys),
                      REQ_WEIGHT, "a request given by weight") < 0)
            return -1;
        path_key(sub, path, "weight");
        return p_decimal(c, v, sub, 3, POSITIVE, &a->weight_milli);
    }
    if (need_key(c, n, path, "model", &v) < 0)
        return -1;
    path_key(sub, path, "model");
    if (p_model_ref(c, v, sub, &a->model) < 0)
        return -1;
    if ((v = get(c, n, "input_tokens"))) {
        path_key(sub, path, "input_tokens");
        if (p_int(c, v, sub, 0, INT64_MAX / 2, &a->input_tokens) < 0)
            return -1;
    }
    if ((v = get(c, n, "output_tokens"))) {
        path_key(sub, path, "output_tokens");
        if (p_int(c, v, sub, 0, INT64_MAX / 2, &a->output_tokens) < 0)
            return -1;
    }
    return 0;
}

static int c_analysis(pctx *c, node_t *n, const char *path)
{
    char sub[PATHCAP];
    qg_analysis_spec *a = &c->r->analysis;
    node_t *v;

    if (check_map(c, n, path, analysis_keys, NKEYS(analysis_keys), ALL,
                  "") < 0)
        return -1;
    if ((v = get(c, n, "request"))) {
        path_key(sub, path, "request");
        if (c_request(c, v, sub, a) < 0)
            return -1;
    }
    if ((v = get(c, n, "duration"))) {
        path_key(sub, path, "duration");
        if (p_duration(c, v, sub, POSITIVE, &a->duration_ms) < 0)
            return -1;
    }
    if ((v = get(c, n, "period"))) {
        path_key(sub, path, "period");
        if (p_duration(c, v, sub, NONNEG, &a->period_ms) < 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------- top level */

static const keydef top_keys[] = {
    { "version", ALL },   { "unit", ALL },     { "effective", ALL },
    { "announced", ALL }, { "notice", ALL },   { "weights", ALL },
    { "plans", ALL },     { "orgs", ALL },     { "subjects", ALL },
    { "default_plan", ALL }, { "analysis", ALL },
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

static int compile(pctx *c, node_t *root)
{
    qg_rules *r = c->r;
    node_t *v;
    size_t i;

    if (check_map(c, root, "", top_keys, NKEYS(top_keys), ALL, "") < 0)
        return -1;
    if (need_key(c, root, "", "version", &v) < 0 ||
        p_string(c, v, "version", &r->version) < 0)
        return -1;
    if ((v = get(c, root, "unit")) && p_string(c, v, "unit", &r->unit) < 0)
        return -1;
    if (!r->unit && !(r->unit = strdup("weight points")))
        return oom(c, root);
    r->notice_ms = 30 * QG_MS_PER_DAY;
    for (i = 0; i < NKEYS(top_times); i++) {
        int64_t *dst = (int64_t *)((char *)r + top_times[i].offset);
        if (!(v = get(c, root, top_times[i].key)))
            continue;
        if (top_times[i].is_date ? p_date(c, v, top_times[i].key, dst)
                                 : p_duration(c, v, top_times[i].key, NONNEG,
                                              dst))
            return -1;
    }
    if (need_key(c, root, "", "weights", &v) < 0 ||
        c_weights(c, v, "weights") < 0)
        return -1;
    if (need_key(c, root, "", "plans", &v) < 0 || c_plans(c, v, "plans") < 0)
        return -1;
    if ((v = get(c, root, "orgs")) && c_orgs(c, v, "orgs") < 0)
        return -1;
    if ((v = get(c, root, "subjects")) && c_subjects(c, v, "subjects") < 0)
        return -1;
    r->default_plan = -1;
    if ((v = get(c, root, "default_plan")) &&
        p_plan_ref(c, v, "default_plan", &r->default_plan) < 0)
        return -1;
    r->analysis.model = -1;
    r->analysis.weight_milli = QG_MILLI;
    r->analysis.duration_ms = 60000;
    if ((v = get(c, root, "analysis")) && c_analysis(c, v, "analysis") < 0)
        return -1;
    return 0;
}

/* ------------------------------------------------------- syntax pass */

/* libyaml's own problem text and position; reader errors (bad UTF-8)
 * carry only a byte offset, turned into line:column here. */
static void syntax_diag(qg_diag *d, const yaml_parser_t *p, const char *text,
                        size_t len)
{
    size_t line = p->problem_mark.line, col = p->problem_mark.column;
    if (p->error == YAML_READER_ERROR) {
        size_t i;
        line = col = 0;
        for (i = 0; i < p->problem_offset && i < len; i++) {
            if (text[i] == '\n') {
                line++;
                col = 0;
            } else {
                col++;
            }
        }
    }
    d->line = (int)line + 1;
    d->column = (int)col + 1;
    if (p->context)
        snprintf(d->message, sizeof d->message,
                 "YAML syntax error: %s (%s at line %d column %d)",
                 p->problem ? p->problem : "unknown problem", p->context,
                 (int)p->context_mark.line + 1,
                 (int)p->context_mark.column + 1);
    else
        snprintf(d->message, sizeof d->message, "YAML syntax error: %s",
                 p->problem ? p->problem : "unknown problem");
}

static int set_at(qg_diag *d, const yaml_mark_t *m, const char *msg,
                  const char *detail)
{
    d->line = (int)m->line + 1;
    d->column = (int)m->column + 1;
    snprintf(d->message, sizeof d->message, "%s%s", msg, detail);
    return -1;
}

/* Events only: syntax, one document, no anchors or aliases. */
static int syntax_pass(const char *text, size_t len, qg_diag *d)
{
    yaml_parser_t p;
    yaml_event_t ev;
    int rc = 0, docs = 0, done = 0;

    if (!yaml_parser_initialize(&p)) {
        snprintf(d->message, sizeof d->message, "out of memory");
        return -1;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    while (!done && rc == 0) {
        const yaml_char_t *anchor = NULL;
        if (!yaml_parser_parse(&p, &ev)) {
            syntax_diag(d, &p, text, len);
            rc = -1;
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1)
                rc = set_at(d, &ev.start_mark, "expected a single YAML "
                            "document, found a second one", "");
            break;
        case YAML_ALIAS_EVENT:
            rc = set_at(d, &ev.start_mark, "YAML aliases are not supported; "
                        "write the value out", "");
            break;
        case YAML_SCALAR_EVENT:
            anchor = ev.data.scalar.anchor;
            break;
        case YAML_SEQUENCE_START_EVENT:
            anchor = ev.data.sequence_start.anchor;
            break;
        case YAML_MAPPING_START_EVENT:
            anchor = ev.data.mapping_start.anchor;
            break;
        default:
            break;
        }
        if (anchor && rc == 0)
            rc = set_at(d, &ev.start_mark, "YAML anchors are not supported: &",
                        (const char *)anchor);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

int qg_rules_parse(const char *text, size_t len, const char *path,
                   qg_tz_resolver tzr, void *tzud, qg_rules **out,
                   qg_diag *diag)
{
    qg_diag scratch;
    yaml_parser_t parser;
    yaml_document_t doc;
    int parser_ok = 0, have_doc = 0, rc = QG_ERULES, i;
    pctx c;
    node_t *root;

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
    if (syntax_pass(text, len, diag) < 0)
        goto fail;
    if (!yaml_parser_initialize(&parser))
        goto nomem;
    parser_ok = 1;
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        syntax_diag(diag, &parser, text, len);
        goto fail;
    }
    have_doc = 1;
    root = yaml_document_get_root_node(&doc);
    if (!root || is_null(root)) {
        diag->line = diag->column = 1;
        snprintf(diag->message, sizeof diag->message,
                 "empty rules file: expected a mapping with version, weights "
                 "and plans");
        goto fail;
    }
    c.doc = &doc;
    c.diag = diag;
    c.tzr = tzr;
    c.tzud = tzud;
    c.r = calloc(1, sizeof *c.r);
    if (!c.r || !(c.r->path = strdup(diag->path)))
        goto nomem;
    if (compile(&c, root) < 0) {
        if (c.oom)
            rc = QG_ENOMEM;
        goto fail;
    }
    *out = c.r;
    c.r = NULL;
    rc = QG_OK;
    goto done;
nomem:
    rc = QG_ENOMEM;
    snprintf(diag->message, sizeof diag->message, "out of memory");
fail:
done:
    for (i = 0; i < c.nzone_names; i++)
        free(c.zone_names[i]);
    free(c.zone_names);
    qg_rules_free(c.r);
    if (have_doc)
        yaml_document_delete(&doc);
    if (parser_ok)
        yaml_parser_delete(&parser);
    return rc;
}
