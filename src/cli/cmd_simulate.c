/* cmd_simulate.c - `quotagate simulate`: replay a usage trace.
 *
 * Each trace row becomes one qg_engine_check at now = start + t on a fresh
 * in-memory store, exactly as the gateway would decide it; an admitted
 * request is settled at once with its actual tokens (the check reserved
 * input + output tokens as max_output_tokens), which frees its concurrency
 * slot.  Output is one JSON object per decision and a summary line.  The
 * default start is the wall clock, read here and nowhere in the library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "analysis.h"
#include "cli.h"

#define TRACE_MAX_BYTES (256u << 20)

/* Per-subject totals; indexes are kept in a JSON object by subject name. */
typedef struct tally {
    char *name;
    int64_t admitted, refused, weight_milli;
} tally;

typedef struct run {
    const char *path;
    qg_engine *e;
    json_t *index;            /* subject -> position in tallies */
    tally *tallies;
    size_t ntallies, cap;
    int64_t admitted, refused;
} run;

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (!f)
        return NULL;
    if ((buf = malloc(TRACE_MAX_BYTES + 1))) {
        *len = fread(buf, 1, TRACE_MAX_BYTES + 1, f);
        if (ferror(f) || *len > TRACE_MAX_BYTES) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

static tally *tally_of(run *rn, const char *subject)
{
    json_t *at = json_object_get(rn->index, subject);
    if (at)
        return &rn->tallies[json_integer_value(at)];
    if (rn->ntallies == rn->cap) {
        size_t ncap = rn->cap ? rn->cap * 2 : 16;
        tally *nt = realloc(rn->tallies, ncap * sizeof *nt);
        if (!nt)
            return NULL;
        rn->tallies = nt;
        rn->cap = ncap;
    }
    memset(&rn->tallies[rn->ntallies], 0, sizeof *rn->tallies);
    if (!(rn->tallies[rn->ntallies].name = strdup(subject)) ||
        json_object_set_new(rn->index, subject,
                            json_integer((json_int_t)rn->ntallies)) != 0)
        return NULL;
    return &rn->tallies[rn->ntallies++];
}

/* One row: check, settle when admitted, print the line.  Returns 0 or -1
 * after printing why to stderr. */
static int replay_row(run *rn, const qg_trace_row *row, int64_t start)
{
    char rid[32], err[512], at[48];
    qg_check_req req;
    qg_settle_req sreq;
    qg_settle_result sres;
    qg_decision d;
    json_t *line;
    tally *ty;
    int64_t now;

    if (__builtin_add_overflow(start, row->t_ms, &now) || now < 0 ||
        now > QG_TIME_MAX_MS) {
        fprintf(stderr, "%s:%d: t: the instant --start + t is out of range "
                "(at most 9999-12-31T23:59:59.999Z)\n", rn->path, row->line);
        return -1;
    }
    snprintf(rid, sizeof rid, "trace-%d", row->line);
    memset(&req, 0, sizeof req);
    req.subject = row->subject;
    req.request_id = row->request_id ? row->request_id : rid;
    req.model = row->model;
    req.input_tokens = row->input_tokens;
    req.max_output_tokens = row->output_tokens;
    req.weight_milli = row->weight_milli;
    if (qg_engine_check(rn->e, &req, now, &d, err, sizeof err) != QG_OK) {
        fprintf(stderr, "%s:%d: %s\n", rn->path, row->line, err);
        return -1;
    }
    if (!(ty = tally_of(rn, row->subject))) {
        fprintf(stderr, "quotagate simulate: out of memory\n");
        return -1;
    }
    qg_iso8601_format(now, at, sizeof at);
    line = json_pack("{s:o, s:s, s:s, s:s, s:s}", "t",
                     qg__cli_json_milli(row->t_ms), "subject", row->subject,
                     "request_id", req.request_id, "decision",
                     d.outcome == QG_ALLOW ? "allow" : "reject",
                     "rules_version", d.rules_version);
    if (d.outcome == QG_ALLOW) {
        memset(&sreq, 0, sizeof sreq);
        sreq.request_id = req.request_id;
        sreq.status = QG_SETTLE_COMPLETED;
        sreq.input_tokens = row->input_tokens;
        sreq.output_tokens = row->output_tokens;
        sreq.weight_milli = row->model ? -1 : row->weight_milli;
        memset(&sres, 0, sizeof sres);
        if (!d.replayed &&
            qg_engine_settle(rn->e, &sreq, now, &sres, err, sizeof err) !=
                QG_OK) {
            fprintf(stderr, "%s:%d: settle: %s\n", rn->path, row->line, err);
            json_decref(line);
            return -1;
        }
        json_object_set_new(line, "weight", qg__cli_json_milli(sres.charged_milli));
        /* sums of bounded weights, saturated at the bound (a summary) */
        ty->weight_milli =
            ty->weight_milli > QG_AMOUNT_MAX_MILLI - sres.charged_milli
                ? QG_AMOUNT_MAX_MILLI
                : ty->weight_milli + sres.charged_milli;
        ty->admitted++;
        rn->admitted++;
    } else {
        if (d.binding >= 0)
            json_object_set_new(line, "window", json_sprintf(
                "%s%s", d.views[d.binding].org ? "org." : "",
                d.views[d.binding].name));   /* docs/api.md "Window names" */
        if (d.outcome == QG_REJECT)
            json_object_set_new(line, "retry_after_s",
                                qg__cli_json_milli(d.retry_after_ms));
        else
            json_object_set_new(line, "retryable", json_false());
        json_object_set_new(line, "weight", qg__cli_json_milli(d.weight_milli));
        ty->refused++;
        rn->refused++;
    }
    json_object_set_new(line, "at", json_string(at));
    if (d.replayed)
        json_object_set_new(line, "replayed", json_true());
    return qg__json_emit(line, 0);
}

static int print_summary(run *rn)
{
    json_t *subjects = json_object();
    size_t i;
    for (i = 0; i < rn->ntallies; i++)
        json_object_set_new(
            subjects, rn->tallies[i].name,
            json_pack("{s:I, s:I, s:o}", "admitted",
                      (json_int_t)rn->tallies[i].admitted, "refused",
                      (json_int_t)rn->tallies[i].refused, "weight",
                      qg__cli_json_milli(rn->tallies[i].weight_milli)));
    return qg__json_emit(
        json_pack("{s:{s:I, s:I, s:o}}", "summary", "admitted",
                  (json_int_t)rn->admitted, "refused",
                  (json_int_t)rn->refused, "subjects", subjects),
        0);
}

/* Names no rules version knows, found before any decision is printed
 * (a name only some versions know is the engine's to refuse, at the
 * row's instant). */
static int check_names(const char *path, const qg_rules *chain,
                       const qg_trace *t)
{
    int k;
    for (k = 0; k < t->nrows; k++) {
        const qg_trace_row *row = &t->rows[k];
        const qg_rules *r;
        int model_ok = !row->model, subject_ok = 0;
        for (r = chain; r; r = qg_rules_next(r)) {
            model_ok |= row->model && qg_rules_find_model(r, row->model) >= 0;
            subject_ok |= qg_rules_admits_subject(r, row->subject);
        }
        if (!model_ok) {
            fprintf(stderr, "%s:%d: model: unknown model \"%s\"\n", path,
                    row->line, row->model);
            return -1;
        }
        if (!subject_ok) {
            fprintf(stderr, "%s:%d: subject: unknown subject \"%s\" (the "
                    "rules have no default_plan)\n", path, row->line,
                    row->subject);
            return -1;
        }
    }
    return 0;
}

static int64_t wall_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int qg__cmd_simulate(const qg_cli_args *args, qg_rules *rules)
{
    run rn;
    qg_store *store = NULL;
    qg_trace *t = NULL;
    char *buf = NULL, err[1024];
    size_t len = 0, i;
    int64_t start;
    int rc = QG_EXIT_USAGE, k;

    memset(&rn, 0, sizeof rn);
    rn.path = args->trace;
    if (args->start ? qg_iso8601_parse(args->start, &start) < 0
                    : (start = wall_clock_ms()) < 0) {
        fprintf(stderr, "quotagate simulate: --start: expected an ISO 8601 "
                "time such as 2026-03-08T12:00:00Z, got \"%s\"\n",
                args->start);
        goto done;
    }
    if (!(buf = read_file(args->trace, &len))) {
        fprintf(stderr, "%s: cannot read the trace (missing, unreadable or "
                "larger than %u bytes)\n", args->trace, TRACE_MAX_BYTES);
        goto done;
    }
    if (qg__trace_parse(buf, len, args->trace, &t, err, sizeof err) != QG_OK) {
        fprintf(stderr, "%s\n", err);
        goto done;
    }
    if (check_names(args->trace, rules, t) < 0)
        goto done;
    if (!(rn.index = json_object()) || !(store = qg_store_memory_new(NULL)) ||
        !(rn.e = qg_engine_new(rules, store))) {
        fprintf(stderr, "quotagate simulate: out of memory\n");
        goto done;
    }
    rules = NULL;               /* the engine owns them now */
    for (k = 0; k < t->nrows; k++)
        if (replay_row(&rn, &t->rows[k], start) < 0)
            goto done;
    if (print_summary(&rn) == 0)
        rc = QG_EXIT_OK;
done:
    for (i = 0; i < rn.ntallies; i++)
        free(rn.tallies[i].name);
    free(rn.tallies);
    json_decref(rn.index);
    qg_engine_free(rn.e);
    qg_store_free(store);
    qg_rules_free(rules);
    qg__trace_free(t);
    free(buf);
    return rc;
}
