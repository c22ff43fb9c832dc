/* yaml_doc.c - reading a YAML document with positions, for the rules
 * compiler; the schema itself lives in rules_yaml.c and rules_windows.c.
 *
 * Two passes over the text.  The first is libyaml's event parser alone, so
 * that a plain syntax error is reported with libyaml's own wording and
 * position, and anchors/aliases (which would let one node appear under
 * several paths) are refused.  The second loads the document tree, which
 * the compiler then walks with the helpers below: node access, key tables
 * (one per mapping, driving both validation and the "expected one of ..."
 * text) and typed scalar readers.  Every error names the dotted path, the
 * 1-based line and column of the offending node and what was expected.
 * No I/O. */
#include "yaml_doc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "civil.h"
#include "duration.h"
#include "fixed.h"
#include "quotagate.h"

/* ------------------------------------------------------- diagnostics */

static void vset_diag(qg__ydoc *y, const yaml_node_t *n, const char *path,
                      const char *fmt, va_list ap)
{
    char *msg = y->diag->message;
    size_t cap = sizeof y->diag->message, off = 0;
    y->diag->line = n ? (int)n->start_mark.line + 1 : 1;
    y->diag->column = n ? (int)n->start_mark.column + 1 : 1;
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
int qg__y_fail(qg__ydoc *y, const yaml_node_t *n, const char *path,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset_diag(y, n, path, fmt, ap);
    va_end(ap);
    return -1;
}

int qg__y_oom(qg__ydoc *y, const yaml_node_t *n)
{
    y->oom = 1;
    return qg__y_fail(y, n, "", "out of memory");
}

/* path + "." + key (or just key at the top) */
void qg__y_path_key(char *out, const char *base, const char *key)
{
    int k = snprintf(out, QG_Y_PATHCAP, "%s%s%s", base, *base ? "." : "", key);
    if (k < 0 || k >= QG_Y_PATHCAP)
        out[QG_Y_PATHCAP - 1] = '\0';
}

void qg__y_path_idx(char *out, const char *base, long i)
{
    int k = snprintf(out, QG_Y_PATHCAP, "%s[%ld]", base, i);
    if (k < 0 || k >= QG_Y_PATHCAP)
        out[QG_Y_PATHCAP - 1] = '\0';
}

/* ------------------------------------------------------------- nodes */

yaml_node_t *qg__y_node(qg__ydoc *y, int idx)
{
    return yaml_document_get_node(y->doc, idx);
}

const char *qg__y_str(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

int qg__y_is_null(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length == 0 &&
           n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* What a node is, for "got ..." in messages. */
const char *qg__y_got(const yaml_node_t *n, char *buf, size_t cap)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (qg__y_is_null(n))
        return "nothing";
    if (n->data.scalar.length > 60)
        snprintf(buf, cap, "\"%.57s...\"", qg__y_str(n));
    else
        snprintf(buf, cap, "\"%s\"", qg__y_str(n));
    return buf;
}

int qg__y_need_scalar(qg__ydoc *y, const yaml_node_t *n, const char *path,
                      const char *what)
{
    char g[80];
    if (n->type == YAML_SCALAR_NODE && !qg__y_is_null(n) &&
        strlen(qg__y_str(n)) == n->data.scalar.length)
        return 0;
    return qg__y_fail(y, n, path, "expected %s, got %s", what,
                      qg__y_got(n, g, sizeof g));
}

/* Value of `key` in mapping m, or NULL. */
yaml_node_t *qg__y_get(qg__ydoc *y, yaml_node_t *m, const char *key)
{
    yaml_node_pair_t *p;
    for (p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = qg__y_node(y, p->key);
        if (k && k->type == YAML_SCALAR_NODE && strcmp(qg__y_str(k), key) == 0)
            return qg__y_node(y, p->value);
    }
    return NULL;
}

int qg__y_need_key(qg__ydoc *y, yaml_node_t *m, const char *path,
                   const char *key, yaml_node_t **out)
{
    *out = qg__y_get(y, m, key);
    if (*out)
        return 0;
    return qg__y_fail(y, m, path, "missing required key \"%s\"", key);
}

static void join_keys(char *buf, size_t cap, const qg__ykey *keys, size_t n)
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

static void join_enum(char *buf, size_t cap, const qg__yenum *e, size_t n)
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
void qg__y_join_names(char *buf, size_t cap, const void *base, size_t stride,
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
int qg__y_check_map(qg__ydoc *y, yaml_node_t *n, const char *path,
                    const qg__ykey *keys, size_t nkeys, unsigned sel,
                    const char *variant)
{
    yaml_node_pair_t *p, *q;
    char g[80], list[QG_Y_LISTCAP];
    size_t i;

    if (n->type != YAML_MAPPING_NODE)
        return qg__y_fail(y, n, path, "expected a mapping, got %s",
                          qg__y_got(n, g, sizeof g));
    for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = qg__y_node(y, p->key);
        if (k->type != YAML_SCALAR_NODE)
            return qg__y_fail(y, k, path, "expected a key name, got %s",
                              qg__y_got(k, g, sizeof g));
        for (i = 0; i < nkeys; i++)
            if (strcmp(keys[i].name, qg__y_str(k)) == 0)
                break;
        if (i == nkeys) {
            join_keys(list, sizeof list, keys, nkeys);
            return qg__y_fail(y, k, path,
                              "unknown key \"%s\" (expected one of: %s)",
                              qg__y_str(k), list);
        }
        if (!(keys[i].mask & sel))
            return qg__y_fail(y, k, path, "%s is not used by %s", keys[i].name,
                              variant);
        for (q = n->data.mapping.pairs.start; q < p; q++)
            if (strcmp(qg__y_str(qg__y_node(y, q->key)), qg__y_str(k)) == 0)
                return qg__y_fail(y, k, path, "duplicate key \"%s\"",
                                  qg__y_str(k));
    }
    return 0;
}

/* One key of a names mapping, for the duplicate search. */
typedef struct name_at {
    const char *name;
    size_t at;                   /* position in the mapping */
} name_at;

static int name_at_cmp(const void *a, const void *b)
{
    const name_at *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* The position of the first key (in document order) that repeats an
 * earlier key among the first n pairs, or n when none does.  Sorting
 * makes this O(n log n): mappings of tens of thousands of orgs or
 * subjects were quadratic (seconds to minutes).  Out of memory: the
 * quadratic search. */
static size_t first_duplicate(qg__ydoc *y, yaml_node_pair_t *pairs, size_t n)
{
    name_at *v = n > 1 ? malloc(n * sizeof *v) : NULL;
    size_t first = n, i;
    if (!v) {
        for (i = 1; i < n && first == n; i++)
            for (size_t q = 0; q < i; q++)
                if (strcmp(qg__y_str(qg__y_node(y, pairs[q].key)),
                           qg__y_str(qg__y_node(y, pairs[i].key))) == 0) {
                    first = i;
                    break;
                }
        return first;
    }
    for (i = 0; i < n; i++) {
        v[i].name = qg__y_str(qg__y_node(y, pairs[i].key));
        v[i].at = i;
    }
    qsort(v, n, sizeof *v, name_at_cmp);
    /* in a run of equal names, sorted by position, the second one is the
     * first repeat of that name */
    for (i = 1; i < n; i++)
        if (strcmp(v[i].name, v[i - 1].name) == 0 &&
            (i < 2 || strcmp(v[i - 1].name, v[i - 2].name) != 0) &&
            v[i].at < first)
            first = v[i].at;
    free(v);
    return first;
}

/* A mapping from names to entries: keys are unique names that fit
 * QG_NAME_MAX.  Returns the number of pairs, or -1.  The first offending
 * pair in document order is reported, as a single pass would. */
int qg__y_check_names(qg__ydoc *y, yaml_node_t *n, const char *path,
                      int nonempty, int max)
{
    yaml_node_pair_t *pairs;
    char g[80];
    size_t npairs, bad, dup;
    int too_many = 0;

    if (n->type != YAML_MAPPING_NODE)
        return qg__y_fail(y, n, path, "expected a mapping of names, got %s",
                          qg__y_got(n, g, sizeof g));
    pairs = n->data.mapping.pairs.start;
    npairs = (size_t)(n->data.mapping.pairs.top - pairs);
    /* the first pair that is not a short scalar name, or past max (a
     * pair's name is checked before its repeat, its repeat before the
     * count) */
    for (bad = 0; bad < npairs; bad++) {
        yaml_node_t *k = qg__y_node(y, pairs[bad].key);
        if (k->type != YAML_SCALAR_NODE || k->data.scalar.length >= QG_NAME_MAX)
            break;
        if (bad >= (size_t)max) {
            too_many = 1;
            break;
        }
    }
    dup = first_duplicate(y, pairs, bad + (bad < npairs && too_many));
    if (dup < bad + (size_t)too_many) {
        yaml_node_t *k = qg__y_node(y, pairs[dup].key);
        return qg__y_fail(y, k, path, "duplicate name \"%s\"",
                          qg__y_str(k));
    }
    if (bad < npairs) {
        yaml_node_t *k = qg__y_node(y, pairs[bad].key);
        if (too_many)
            return qg__y_fail(y, k, path, "too many entries (at most %d)",
                              max);
        if (qg__y_need_scalar(y, k, path, "a name") < 0)
            return -1;
        return qg__y_fail(y, k, path,
                          "name \"%.20s...\" is too long (at most %d "
                          "characters)",
                          qg__y_str(k), QG_NAME_MAX - 1);
    }
    if (nonempty && npairs == 0)
        return qg__y_fail(y, n, path, "expected at least one entry");
    return (int)npairs;
}


/* ------------------------------------------------------------ scalars */

int qg__y_string(qg__ydoc *y, yaml_node_t *n, const char *path, char **out)
{
    if (qg__y_need_scalar(y, n, path, "a string") < 0)
        return -1;
    free(*out);
    *out = strdup(qg__y_str(n));
    return *out ? 0 : qg__y_oom(y, n);
}

int qg__y_name(qg__ydoc *y, yaml_node_t *n, const char *path, char **out)
{
    if (qg__y_need_scalar(y, n, path, "a name") < 0)
        return -1;
    if (n->data.scalar.length >= QG_NAME_MAX)
        return qg__y_fail(y, n, path,
                          "name is too long (at most %d characters)",
                          QG_NAME_MAX - 1);
    return qg__y_string(y, n, path, out);
}

/* Decimal with at most `scale` fractional digits, scaled by 10^scale. */
int qg__y_decimal(qg__ydoc *y, yaml_node_t *n, const char *path, int scale,
                  int sign, int64_t *out)
{
    const char *what =
        sign == QG_Y_POSITIVE ? "a positive number" : "a number >= 0";
    char g[80];
    int rc;

    if (qg__y_need_scalar(y, n, path, what) < 0)
        return -1;
    rc = qg_fixed_parse(qg__y_str(n), n->data.scalar.length, scale, out);
    if (rc == -2)
        return qg__y_fail(y, n, path,
                          "expected %s with at most %d decimal places, "
                          "got %s",
                          what, scale, qg__y_got(n, g, sizeof g));
    if (rc == -3)
        return qg__y_fail(y, n, path, "number out of range, got %s",
                          qg__y_got(n, g, sizeof g));
    if (rc < 0 || *out < 0 || (sign == QG_Y_POSITIVE && *out == 0))
        return qg__y_fail(y, n, path, "expected %s, got %s", what,
                          qg__y_got(n, g, sizeof g));
    return 0;
}

int qg__y_decimal_max(qg__ydoc *y, yaml_node_t *n, const char *path,
                      int scale, int sign, int64_t max, int64_t *out)
{
    char g[80], m[32];
    if (qg__y_decimal(y, n, path, scale, sign, out) < 0)
        return -1;
    if (*out <= max)
        return 0;
    qg_fixed_format(max, scale, m, sizeof m);
    return qg__y_fail(y, n, path, "number out of range (at most %s), got %s",
                      m, qg__y_got(n, g, sizeof g));
}

/* Integer in [min, max]. */
int qg__y_int(qg__ydoc *y, yaml_node_t *n, const char *path, int64_t min,
              int64_t max, int64_t *out)
{
    char g[80];
    int rc;

    if (qg__y_need_scalar(y, n, path, "an integer") < 0)
        return -1;
    rc = qg_fixed_parse(qg__y_str(n), n->data.scalar.length, 0, out);
    if (rc == -3 || (rc == 0 && *out > max))
        return qg__y_fail(y, n, path,
                          "number out of range (at most %lld), got %s",
                          (long long)max, qg__y_got(n, g, sizeof g));
    if (rc < 0 || *out < min)
        return qg__y_fail(y, n, path, "expected an integer >= %lld, got %s",
                          (long long)min, qg__y_got(n, g, sizeof g));
    return 0;
}

int qg__y_duration(qg__ydoc *y, yaml_node_t *n, const char *path, int sign,
                   int64_t *out)
{
    char g[80];
    int rc;

    if (qg__y_need_scalar(y, n, path,
                          "a duration such as 90s, 30m, 5h, 7d") < 0)
        return -1;
    rc = qg_duration_parse(qg__y_str(n), n->data.scalar.length, out);
    if (rc == -3 || (rc == 0 && *out > QG_DURATION_MAX_MS))
        return qg__y_fail(y, n, path, "duration out of range (at most "
                          "36500d), got %s", qg__y_got(n, g, sizeof g));
    if (rc < 0)
        return qg__y_fail(y, n, path,
                          "expected a duration such as 90s, 30m, 5h, "
                          "7d, got %s",
                          qg__y_got(n, g, sizeof g));
    if (sign == QG_Y_POSITIVE && *out == 0)
        return qg__y_fail(y, n, path, "expected a duration > 0, got %s",
                          qg__y_got(n, g, sizeof g));
    return 0;
}

int qg__y_date(qg__ydoc *y, yaml_node_t *n, const char *path, int64_t *out)
{
    static const char what[] =
        "a date such as \"2026-10-15\" or an instant such as "
        "\"2026-01-31T09:00:00Z\"";
    char g[80];
    if (qg__y_need_scalar(y, n, path, what) < 0)
        return -1;
    if (qg_iso8601_parse(qg__y_str(n), out) < 0)
        return qg__y_fail(y, n, path, "expected %s, got %s", what,
                          qg__y_got(n, g, sizeof g));
    return 0;
}

/* One of the spellings in table e; `what` names the kind in messages. */
int qg__y_enum(qg__ydoc *y, yaml_node_t *n, const char *path, const char *what,
               const qg__yenum *e, size_t ne, int *out)
{
    char list[QG_Y_LISTCAP], g[80];
    size_t i;

    join_enum(list, sizeof list, e, ne);
    if (n->type != YAML_SCALAR_NODE || qg__y_is_null(n))
        return qg__y_fail(y, n, path, "expected one of: %s, got %s", list,
                          qg__y_got(n, g, sizeof g));
    for (i = 0; i < ne; i++)
        if (strcmp(e[i].name, qg__y_str(n)) == 0) {
            *out = e[i].value;
            return 0;
        }
    return qg__y_fail(y, n, path, "unknown %s %s (expected one of: %s)", what,
                      qg__y_got(n, g, sizeof g), list);
}

static const qg__yenum bools[] = {
    { "true", 1 }, { "false", 0 }, { "yes", 1 }, { "no", 0 },
};

int qg__y_bool(qg__ydoc *y, yaml_node_t *n, const char *path, int *out)
{
    return qg__y_enum(y, n, path, "boolean", bools, QG_Y_NKEYS(bools), out);
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

/* Events only: syntax, at most QG_Y_MAXDOCS documents, no anchors or
 * aliases. */
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
            if (++docs > QG_Y_MAXDOCS)
                rc = set_at(d, &ev.start_mark, "too many YAML documents "
                            "(rules versions): at most "
                            QG_Y_STR(QG_Y_MAXDOCS), "");
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

int qg__y_load(const char *text, size_t len, yaml_document_t *docs,
               int *ndocs, qg_diag *d)
{
    yaml_parser_t parser;
    int n = 0, rc = QG_OK;

    *ndocs = 0;
    if (syntax_pass(text, len, d) < 0)
        return QG_ERULES;
    if (!yaml_parser_initialize(&parser)) {
        snprintf(d->message, sizeof d->message, "out of memory");
        return QG_ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    /* libyaml's marks count lines from the start of the stream, so every
     * document's nodes carry the file's own line numbers. */
    while (n < QG_Y_MAXDOCS) {
        if (!yaml_parser_load(&parser, &docs[n])) {
            syntax_diag(d, &parser, text, len);
            rc = QG_ERULES;
            break;
        }
        if (!yaml_document_get_root_node(&docs[n])) {
            /* the stream's end: an empty document after the last */
            yaml_document_delete(&docs[n]);
            break;
        }
        n++;
    }
    yaml_parser_delete(&parser);
    if (rc != QG_OK) {
        while (n > 0)
            yaml_document_delete(&docs[--n]);
        return rc;
    }
    *ndocs = n;
    return QG_OK;
}
