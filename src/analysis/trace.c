/* trace.c - usage traces for `quotagate simulate`, parsed from CSV text.
 *
 * A trace is a header row naming the columns (in any order) and one row per
 * request: t (seconds from the trace's start, fractions allowed, never
 * decreasing), subject, then either weight or model, input_tokens and
 * output_tokens, and optionally request_id.  Fields may be quoted with
 * "..." ("" inside for a quote).  Numbers are read as fixed point, never
 * as floating point, and bounded (quotagate.h): t at most QG_TIME_MAX_MS,
 * a weight at most QG_AMOUNT_MAX_MILLI, token counts at most QG_TOKENS_MAX.
 * No I/O: the caller reads the file; every error names the line and the
 * column and what was expected. */
#include "analysis.h"
#include "rules.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixed.h"

#define MAXCOLS 16
#define FIELDCAP 512

enum col { COL_T, COL_SUBJECT, COL_WEIGHT, COL_MODEL, COL_INPUT, COL_OUTPUT,
           COL_REQUEST_ID, NCOLS };

/* Known columns, indexed by enum col. */
static const char *const col_names[NCOLS] = {
    [COL_T] = "t",
    [COL_SUBJECT] = "subject",
    [COL_WEIGHT] = "weight",
    [COL_MODEL] = "model",
    [COL_INPUT] = "input_tokens",
    [COL_OUTPUT] = "output_tokens",
    [COL_REQUEST_ID] = "request_id",
};

typedef struct cursor {
    const char *p, *end;
    int line;                 /* line of the next character */
    const char *name;
    char *err;
    size_t errcap;
} cursor;

typedef struct record {
    int line;                 /* where it started */
    int n;
    char f[MAXCOLS][FIELDCAP];
} record;

static int fail(cursor *c, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(cursor *c, int line, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(c->err, c->errcap, "%s:%d: ", c->name, line);
    if (k >= 0 && (size_t)k < c->errcap) {
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->errcap - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Append ch to field i of rec. */
static int put(cursor *c, record *rec, char ch, size_t *len)
{
    if (*len + 1 >= FIELDCAP)
        return fail(c, rec->line, "field %d is longer than %d bytes",
                    rec->n + 1, FIELDCAP - 1);
    rec->f[rec->n][(*len)++] = ch;
    return 0;
}

/* One field at c->p; stops before ',' or the end of line. */
static int read_field(cursor *c, record *rec)
{
    size_t len = 0;
    if (c->p < c->end && *c->p == '"') {
        c->p++;
        for (;;) {
            if (c->p >= c->end)
                return fail(c, rec->line, "unterminated quoted field");
            if (*c->p == '"') {
                if (c->p + 1 < c->end && c->p[1] == '"') {
                    if (put(c, rec, '"', &len) < 0)
                        return -1;
                    c->p += 2;
                    continue;
                }
                c->p++;
                break;
            }
            if (*c->p == '\n')
                c->line++;
            if (put(c, rec, *c->p++, &len) < 0)
                return -1;
        }
        if (c->p < c->end && *c->p != ',' && *c->p != '\n' && *c->p != '\r')
            return fail(c, rec->line, "unexpected text after a quoted field");
    } else {
        while (c->p < c->end && *c->p != ',' && *c->p != '\n' &&
               *c->p != '\r') {
            if (*c->p == '"')
                return fail(c, rec->line, "a quote inside an unquoted field");
            if (put(c, rec, *c->p++, &len) < 0)
                return -1;
        }
    }
    rec->f[rec->n][len] = '\0';
    return 0;
}

/* Next non-blank record: 1 when read, 0 at the end, -1 on error. */
static int read_record(cursor *c, record *rec)
{
    for (;;) {
        if (c->p >= c->end)
            return 0;
        if (*c->p == '\r' || *c->p == '\n') {   /* blank line */
            if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n')
                c->p++;
            c->p++;
            c->line++;
            continue;
        }
        break;
    }
    rec->line = c->line;
    rec->n = 0;
    for (;;) {
        if (rec->n == MAXCOLS)
            return fail(c, rec->line, "more than %d fields", MAXCOLS);
        if (read_field(c, rec) < 0)
            return -1;
        rec->n++;
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        break;
    }
    if (c->p < c->end && *c->p == '\r')
        c->p++;
    if (c->p < c->end && *c->p == '\n')
        c->p++;
    c->line++;
    return 1;
}

/* Map header fields to columns: pos[col] = field index, -1 absent. */
static int read_header(cursor *c, const record *h, int pos[NCOLS])
{
    int i, k;
    for (k = 0; k < NCOLS; k++)
        pos[k] = -1;
    for (i = 0; i < h->n; i++) {
        for (k = 0; k < NCOLS && strcmp(h->f[i], col_names[k]) != 0; k++)
            ;
        if (k == NCOLS)
            return fail(c, h->line, "header: unknown column \"%s\" (expected "
                        "t, subject, weight or model, input_tokens, "
                        "output_tokens, and optionally request_id)", h->f[i]);
        if (pos[k] >= 0)
            return fail(c, h->line, "header: column \"%s\" appears twice",
                        h->f[i]);
        pos[k] = i;
    }
    for (k = 0; k <= COL_SUBJECT; k++)
        if (pos[k] < 0)
            return fail(c, h->line, "header: missing column \"%s\"",
                        col_names[k]);
    if (pos[COL_WEIGHT] >= 0 && pos[COL_MODEL] >= 0)
        return fail(c, h->line, "header: expected either weight or model, "
                    "input_tokens, output_tokens, not both");
    if (pos[COL_WEIGHT] < 0 &&
        (pos[COL_MODEL] < 0 || pos[COL_INPUT] < 0 || pos[COL_OUTPUT] < 0))
        return fail(c, h->line, "header: expected a weight column or the "
                    "columns model, input_tokens and output_tokens");
    if (pos[COL_WEIGHT] >= 0 && (pos[COL_INPUT] >= 0 || pos[COL_OUTPUT] >= 0))
        return fail(c, h->line, "header: token columns need a model column");
    return 0;
}

/* A fixed-point number >= 0 with `scale` fractional digits, at most max
 * (scaled; the bounds of quotagate.h). */
static int num_field(cursor *c, const record *rec, const char *col,
                     const char *s, int scale, const char *what, int64_t max,
                     int64_t *out)
{
    int rc = qg_fixed_parse(s, strlen(s), scale, out);
    if (rc == -3 || (rc == 0 && *out > max)) {
        char m[32];
        qg_fixed_format(max, scale, m, sizeof m);
        return fail(c, rec->line, "%s: \"%s\" is out of range (at most %s)",
                    col, s, m);
    }
    if (rc != 0 || *out < 0)
        return fail(c, rec->line, "%s: expected %s, got \"%s\"", col, what, s);
    return 0;
}

static int text_field(cursor *c, const record *rec, const char *col,
                      const char *s, int required, char **out)
{
    *out = NULL;
    if (!*s) {
        if (required)
            return fail(c, rec->line, "%s: expected a value, got nothing", col);
        return 0;
    }
    if (strlen(s) > QG_REQUEST_ID_MAX)
        return fail(c, rec->line, "%s: longer than %d bytes", col,
                    QG_REQUEST_ID_MAX);
    if (!(*out = strdup(s)))
        return fail(c, rec->line, "out of memory");
    return 0;
}

static int read_row(cursor *c, const record *rec, const int pos[NCOLS],
                    int ncols, int64_t prev_t, qg_trace_row *row)
{
    const char *const *name = col_names;
    char a[32], b[32];

    row->line = rec->line;
    if (rec->n != ncols)
        return fail(c, rec->line, "expected %d fields as in the header, got %d",
                    ncols, rec->n);
    if (num_field(c, rec, name[COL_T], rec->f[pos[COL_T]], 3,
                  "seconds", QG_TIME_MAX_MS, &row->t_ms) < 0)
        return -1;
    if (row->t_ms < prev_t) {
        qg_fixed_format(row->t_ms, 3, a, sizeof a);
        qg_fixed_format(prev_t, 3, b, sizeof b);
        return fail(c, rec->line, "t: %s is before the previous row's %s "
                    "(rows must be in time order)", a, b);
    }
    if (text_field(c, rec, name[COL_SUBJECT], rec->f[pos[COL_SUBJECT]], 1,
                   &row->subject) < 0)
        return -1;
    if (pos[COL_REQUEST_ID] >= 0 &&
        text_field(c, rec, name[COL_REQUEST_ID], rec->f[pos[COL_REQUEST_ID]],
                   0, &row->request_id) < 0)
        return -1;
    if (pos[COL_WEIGHT] >= 0)
        return num_field(c, rec, name[COL_WEIGHT], rec->f[pos[COL_WEIGHT]], 3,
                         "a weight >= 0 (at most 3 decimals)",
                         QG_AMOUNT_MAX_MILLI, &row->weight_milli);
    if (text_field(c, rec, name[COL_MODEL], rec->f[pos[COL_MODEL]], 1,
                   &row->model) < 0 ||
        num_field(c, rec, name[COL_INPUT], rec->f[pos[COL_INPUT]], 0,
                  "a whole number of tokens >= 0", QG_TOKENS_MAX,
                  &row->input_tokens) < 0 ||
        num_field(c, rec, name[COL_OUTPUT], rec->f[pos[COL_OUTPUT]], 0,
                  "a whole number of tokens >= 0", QG_TOKENS_MAX,
                  &row->output_tokens) < 0)
        return -1;
    return 0;
}

int qg__trace_parse(const char *buf, size_t len, const char *name,
                   qg_trace **out, char *err, size_t errcap)
{
    cursor c = { buf, buf + len, 1, name ? name : "trace", err, errcap };
    record *rec = NULL;
    qg_trace *t = NULL;
    int pos[NCOLS], ncols, got, rc = QG_EINVAL, cap = 0;
    int64_t prev = 0;

    *out = NULL;
    if (!(rec = malloc(sizeof *rec)) || !(t = calloc(1, sizeof *t))) {
        rc = QG_ENOMEM;
        snprintf(err, errcap, "out of memory");
        goto done;
    }
    if ((got = read_record(&c, rec)) <= 0) {
        if (got == 0)
            fail(&c, 1, "header: expected a header row (t, subject, ...), "
                 "got an empty file");
        goto done;
    }
    if (read_header(&c, rec, pos) < 0)
        goto done;
    ncols = rec->n;
    while ((got = read_record(&c, rec)) > 0) {
        if (t->nrows == cap) {
            int ncap = cap ? cap * 2 : 64;
            qg_trace_row *nr = realloc(t->rows, (size_t)ncap * sizeof *nr);
            if (!nr) {
                rc = QG_ENOMEM;
                snprintf(err, errcap, "out of memory");
                goto done;
            }
            t->rows = nr;
            cap = ncap;
        }
        memset(&t->rows[t->nrows], 0, sizeof t->rows[0]);
        t->nrows++;
        if (read_row(&c, rec, pos, ncols, prev, &t->rows[t->nrows - 1]) < 0)
            goto done;
        prev = t->rows[t->nrows - 1].t_ms;
    }
    if (got == 0) {
        rc = QG_OK;
        *out = t;
        t = NULL;
    }
done:
    qg__trace_free(t);
    free(rec);
    return rc;
}

void qg__trace_free(qg_trace *t)
{
    int i;
    if (!t)
        return;
    for (i = 0; i < t->nrows; i++) {
        free(t->rows[i].subject);
        free(t->rows[i].request_id);
        free(t->rows[i].model);
    }
    free(t->rows);
    free(t);
}
