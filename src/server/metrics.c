/* metrics.c - counters for /metrics and their Prometheus text rendering.
 *
 * Two layers.  Series are the counters themselves: one struct per
 * (plan name, window name) holding the three outcome counts, allocated
 * once and never moved or freed before the registry, grouped in blocks
 * by plan name.  Tables are the index the hot path uses: built from one
 * rules version, they map (plan index, window id) to a series pointer in
 * one array lookup.  A reload builds a new table over the same series
 * (found by name), publishes it with an atomic store and retires the old
 * one (kept until qg__metrics_free, so a concurrent reader is never left
 * with freed memory).  See metrics.h for the exported families. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fixed.h"
#include "metrics.h"

#define NOUT 3

typedef struct series {
    _Atomic uint64_t n[NOUT];      /* by QG_M_* outcome */
    char *window;                  /* window name, or "none" */
    unsigned char base;            /* outcome bit set: shown even at 0 */
} series;

typedef struct block {
    char *plan;
    series **s;
    int n, cap;
} block;

typedef struct table {
    int nplans, norgs, nids;       /* window ids 0..nids-1; nids = none */
    series **cell;                 /* [plan * (nids + 1) + id] */
    int *plan_first, *plan_n;      /* plan p's window k: ids[plan_first+k] */
    int *org_first, *org_n;
    int *ids;
    const char **plan_ptr;         /* the rules' name pointers (compared, */
    const char **org_ptr;          /* never dereferenced) */
    char **plan_name;              /* our copies */
    char **org_name;
    char *rules_version, *weights_version;
    struct table *retired;         /* the table this one replaced */
} table;

static const int codes[] = {200, 201, 204, 304, 400, 401, 403, 404, 405,
                            408, 409, 413, 415, 422, 429, 431, 499, 500,
                            502, 503, 504};
#define NCODES ((int)(sizeof codes / sizeof codes[0]))

static const char *const outcome_names[NOUT] = {"allow", "reject",
                                                "reject_never"};

struct qg_metrics {
    _Atomic(table *) cur;
    pthread_mutex_t lock;          /* rules swaps, renders, blocks */
    block **blocks;
    int nblocks, capblocks;
    _Atomic uint64_t settles[4];   /* by qg_settle_status */
    _Atomic uint64_t mismatch[2];  /* over, under */
    _Atomic uint64_t anomaly[QG_ANOMALY_COUNT];
    _Atomic uint64_t mismatch_milli[2];
    _Atomic uint64_t overage_milli;   /* payg, final at settle */
    _Atomic uint64_t overage_micro;
    _Atomic uint64_t http[QG_ROUTE_COUNT][NCODES + 1]; /* last: other */
};

/* -------------------------------------------------------------- series */

/* Room for one more pointer in a growable array (*items of *cap, n
 * used).  0, or -1 out of memory. */
static int ptr_room(void *items, int n, int *cap)
{
    void ***a = items;
    if (n == *cap) {
        int nc = *cap ? 2 * *cap : 8;
        void **na = realloc(*a, (size_t)nc * sizeof *na);
        if (!na)
            return -1;
        *a = na;
        *cap = nc;
    }
    return 0;
}

static block *find_block(qg_metrics *m, const char *plan)
{
    block *b;
    for (int i = 0; i < m->nblocks; i++)
        if (strcmp(m->blocks[i]->plan, plan) == 0)
            return m->blocks[i];
    if (ptr_room(&m->blocks, m->nblocks, &m->capblocks) < 0 ||
        !(b = calloc(1, sizeof *b)))
        return NULL;
    if (!(b->plan = strdup(plan))) {
        free(b);
        return NULL;
    }
    m->blocks[m->nblocks++] = b;
    return b;
}

static series *find_series(block *b, const char *window)
{
    series *s;
    for (int i = 0; i < b->n; i++)
        if (strcmp(b->s[i]->window, window) == 0)
            return b->s[i];
    if (ptr_room(&b->s, b->n, &b->cap) < 0 || !(s = calloc(1, sizeof *s)))
        return NULL;
    if (!(s->window = strdup(window))) {
        free(s);
        return NULL;
    }
    b->s[b->n++] = s;
    return s;
}

/* --------------------------------------------------------------- tables */

static void table_free(table *t)
{
    if (!t)
        return;
    for (int i = 0; t->plan_name && i < t->nplans; i++)
        free(t->plan_name[i]);
    for (int i = 0; t->org_name && i < t->norgs; i++)
        free(t->org_name[i]);
    free(t->plan_name);
    free(t->org_name);
    free(t->plan_ptr);
    free(t->org_ptr);
    free(t->cell);
    free(t->plan_first);
    free(t->plan_n);
    free(t->org_first);
    free(t->org_n);
    free(t->ids);
    free(t->rules_version);
    free(t->weights_version);
    free(t);
}

/* Id of window name w among names[0..*n), appended when new. */
static int name_id(const char **names, int *n, const char *w)
{
    for (int i = 0; i < *n; i++)
        if (strcmp(names[i], w) == 0)
            return i;
    names[*n] = w;
    return (*n)++;
}

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

/* Build the table of rules r over m's series (m->lock held). */
static table *table_build(qg_metrics *m, const qg_rules *r)
{
    int total = 0, k = 0;
    const char **names = NULL;
    table *t = calloc(1, sizeof *t);

    if (!t)
        return NULL;
    for (int p = 0; p < r->nplans; p++)
        total += r->plans[p].nwindows;
    for (int o = 0; o < r->norgs; o++)
        total += r->orgs[o].nwindows;
    t->nplans = r->nplans;
    t->norgs = r->norgs;
    names = calloc((size_t)total + 1, sizeof *names);
    t->ids = calloc((size_t)total + 1, sizeof *t->ids);
    t->plan_first = calloc((size_t)r->nplans + 1, sizeof(int));
    t->plan_n = calloc((size_t)r->nplans + 1, sizeof(int));
    t->org_first = calloc((size_t)r->norgs + 1, sizeof(int));
    t->org_n = calloc((size_t)r->norgs + 1, sizeof(int));
    t->plan_ptr = calloc((size_t)r->nplans + 1, sizeof(char *));
    t->org_ptr = calloc((size_t)r->norgs + 1, sizeof(char *));
    t->plan_name = calloc((size_t)r->nplans + 1, sizeof(char *));
    t->org_name = calloc((size_t)r->norgs + 1, sizeof(char *));
    t->rules_version = dup_or_empty(r->version);
    t->weights_version = dup_or_empty(r->weights_version);
    if (!names || !t->ids || !t->plan_first || !t->plan_n || !t->org_first ||
        !t->org_n || !t->plan_ptr || !t->org_ptr || !t->plan_name ||
        !t->org_name || !t->rules_version || !t->weights_version)
        goto fail;

    /* Window ids: distinct names, plans' then orgs', in order. */
    for (int p = 0; p < r->nplans; p++) {
        t->plan_first[p] = k;
        t->plan_n[p] = r->plans[p].nwindows;
        t->plan_ptr[p] = r->plans[p].name;
        if (!(t->plan_name[p] = strdup(r->plans[p].name)))
            goto fail;
        for (int w = 0; w < r->plans[p].nwindows; w++)
            t->ids[k++] = name_id(names, &t->nids, r->plans[p].windows[w].name);
    }
    for (int o = 0; o < r->norgs; o++) {
        t->org_first[o] = k;
        t->org_n[o] = r->orgs[o].nwindows;
        t->org_ptr[o] = r->orgs[o].name;
        if (!(t->org_name[o] = strdup(r->orgs[o].name)))
            goto fail;
        for (int w = 0; w < r->orgs[o].nwindows; w++)
            t->ids[k++] = name_id(names, &t->nids, r->orgs[o].windows[w].name);
    }

    /* Cells: every (plan, window id or none) to its series. */
    t->cell = calloc((size_t)r->nplans * (size_t)(t->nids + 1) + 1,
                     sizeof *t->cell);
    if (!t->cell)
        goto fail;
    for (int p = 0; p < r->nplans; p++) {
        block *b = find_block(m, r->plans[p].name);
        if (!b)
            goto fail;
        for (int id = 0; id <= t->nids; id++) {
            series *s = find_series(b, id < t->nids ? names[id] : "none");
            if (!s)
                goto fail;
            t->cell[p * (t->nids + 1) + id] = s;
        }
    }
    free(names);
    return t;
fail:
    free(names);
    table_free(t);
    return NULL;
}

/* Which zero-valued samples the table's rules show: allow/none for every
 * plan, and both refusals for each of the plan's own windows
 * (m->lock held). */
static void mark_base(qg_metrics *m, const table *t)
{
    for (int i = 0; i < m->nblocks; i++)
        for (int j = 0; j < m->blocks[i]->n; j++)
            m->blocks[i]->s[j]->base = 0;
    for (int p = 0; p < t->nplans; p++) {
        series **row = &t->cell[p * (t->nids + 1)];
        row[t->nids]->base |= 1u << QG_M_ALLOW;
        for (int k = 0; k < t->plan_n[p]; k++)
            row[t->ids[t->plan_first[p] + k]]->base |=
                (1u << QG_M_REJECT) | (1u << QG_M_REJECT_NEVER);
    }
}

qg_metrics *qg__metrics_new(const qg_rules *r)
{
    qg_metrics *m = calloc(1, sizeof *m);
    table *t;

    if (!m)
        return NULL;
    pthread_mutex_init(&m->lock, NULL);
    if (!(t = table_build(m, r))) {
        qg__metrics_free(m);
        return NULL;
    }
    mark_base(m, t);
    atomic_store_explicit(&m->cur, t, memory_order_release);
    return m;
}

void qg__metrics_free(qg_metrics *m)
{
    if (!m)
        return;
    table *t = atomic_load_explicit(&m->cur, memory_order_acquire);
    while (t) {
        table *prev = t->retired;
        table_free(t);
        t = prev;
    }
    for (int i = 0; i < m->nblocks; i++) {
        for (int j = 0; j < m->blocks[i]->n; j++) {
            free(m->blocks[i]->s[j]->window);
            free(m->blocks[i]->s[j]);
        }
        free(m->blocks[i]->s);
        free(m->blocks[i]->plan);
        free(m->blocks[i]);
    }
    free(m->blocks);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

int qg__metrics_rules(qg_metrics *m, const qg_rules *r)
{
    table *t;

    pthread_mutex_lock(&m->lock);
    if (!(t = table_build(m, r))) {
        pthread_mutex_unlock(&m->lock);
        return QG_ENOMEM;
    }
    t->retired = atomic_load_explicit(&m->cur, memory_order_relaxed);
    mark_base(m, t);
    atomic_store_explicit(&m->cur, t, memory_order_release);
    pthread_mutex_unlock(&m->lock);
    return QG_OK;
}

/* ------------------------------------------------------------ counting */

int qg__metrics_view_window(const qg_metrics *m, int plan_index, int org_index,
                           int view)
{
    const table *t = atomic_load_explicit(
        &((qg_metrics *)m)->cur, memory_order_acquire);

    if (plan_index < 0 || plan_index >= t->nplans || view < 0)
        return -1;
    if (view < t->plan_n[plan_index])
        return t->ids[t->plan_first[plan_index] + view];
    view -= t->plan_n[plan_index];
    if (org_index < 0 || org_index >= t->norgs || view >= t->org_n[org_index])
        return -1;
    return t->ids[t->org_first[org_index] + view];
}

void qg__metrics_decision(qg_metrics *m, int plan_index, int window_id,
                         int outcome)
{
    const table *t = atomic_load_explicit(&m->cur, memory_order_acquire);

    if (plan_index < 0 || plan_index >= t->nplans || outcome < 0 ||
        outcome >= NOUT || window_id >= t->nids)
        return;
    if (window_id < 0)
        window_id = t->nids;
    atomic_fetch_add_explicit(
        &t->cell[plan_index * (t->nids + 1) + window_id]->n[outcome], 1,
        memory_order_relaxed);
}

/* Index of name in the table's names: by pointer first (the usual case,
 * the decision made with the same rules), confirmed by strcmp. */
static int find_name(const char *const *ptr, char *const *copy, int n,
                     const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < n; i++)
        if (ptr[i] == name && strcmp(copy[i], name) == 0)
            return i;
    for (int i = 0; i < n; i++)
        if (strcmp(copy[i], name) == 0)
            return i;
    return -1;
}

void qg__metrics_record(qg_metrics *m, const qg_decision *d)
{
    const table *t = atomic_load_explicit(&m->cur, memory_order_acquire);
    int p, o, wid = -1, outcome;

    switch (d->outcome) {
    case QG_ALLOW: outcome = QG_M_ALLOW; break;
    case QG_REJECT: outcome = QG_M_REJECT; break;
    case QG_REJECT_NEVER: outcome = QG_M_REJECT_NEVER; break;
    default: return;
    }
    p = find_name(t->plan_ptr, t->plan_name, t->nplans, d->plan);
    if (p < 0)
        return;
    o = find_name(t->org_ptr, t->org_name, t->norgs, d->org);
    if (outcome != QG_M_ALLOW && d->binding >= 0)
        wid = qg__metrics_view_window(m, p, o, d->binding);
    qg__metrics_decision(m, p, wid, outcome);
}

/* *c += v, saturated at UINT64_MAX (weights are bounded, their sums over
 * a process's life are not). */
static void add_sat(_Atomic uint64_t *c, uint64_t v)
{
    uint64_t old = atomic_load_explicit(c, memory_order_relaxed), n;
    do {
        n = old > UINT64_MAX - v ? UINT64_MAX : old + v;
    } while (!atomic_compare_exchange_weak_explicit(
        c, &old, n, memory_order_relaxed, memory_order_relaxed));
}

void qg__metrics_usage_anomaly(qg_metrics *m, qg__anomaly kind)
{
    if ((unsigned)kind < QG_ANOMALY_COUNT)
        atomic_fetch_add_explicit(&m->anomaly[kind], 1, memory_order_relaxed);
}

void qg__metrics_settle(qg_metrics *m, const qg_settle_result *s)
{
    if (s->replayed)
        return;
    if (s->status >= 1 && s->status <= 3)
        atomic_fetch_add_explicit(&m->settles[s->status], 1,
                                  memory_order_relaxed);
    if (s->actual_milli != s->reserved_milli) {
        int under = s->actual_milli < s->reserved_milli;
        uint64_t gap = under
                           ? (uint64_t)s->reserved_milli - (uint64_t)s->actual_milli
                           : (uint64_t)s->actual_milli - (uint64_t)s->reserved_milli;
        atomic_fetch_add_explicit(&m->mismatch[under], 1,
                                  memory_order_relaxed);
        add_sat(&m->mismatch_milli[under], gap);
    }
    if (s->overage_milli > 0) {
        add_sat(&m->overage_milli, (uint64_t)s->overage_milli);
        add_sat(&m->overage_micro, (uint64_t)s->overage_cost_micro);
    }
}

void qg__metrics_http(qg_metrics *m, int route, int code)
{
    int c = NCODES;

    if (route < 0 || route >= QG_ROUTE_COUNT)
        route = QG_ROUTE_OTHER;
    for (int i = 0; i < NCODES; i++)
        if (codes[i] == code) {
            c = i;
            break;
        }
    atomic_fetch_add_explicit(&m->http[route][c], 1, memory_order_relaxed);
}

/* ----------------------------------------------------------- rendering */

static uint64_t load(_Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* A label value with \, " and newline escaped. */
static void put_label(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '"')
            fputs("\\\"", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

static void family(FILE *f, const char *name, const char *type,
                   const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* An unsigned value scaled by 10^digits, printed exactly. */
static void put_scaled(FILE *f, uint64_t v, int digits)
{
    char buf[48];
    if (v > (uint64_t)INT64_MAX)
        v = (uint64_t)INT64_MAX;
    qg_fixed_format((int64_t)v, digits, buf, sizeof buf);
    fputs(buf, f);
}

static void render_decisions(qg_metrics *m, FILE *f, uint64_t *total,
                             uint64_t *refused)
{
    family(f, "quotagate_decisions_total", "counter",
           "Decisions by plan, binding window (none for allows) and outcome.");
    for (int i = 0; i < m->nblocks; i++) {
        block *b = m->blocks[i];
        for (int j = 0; j < b->n; j++)
            for (int o = 0; o < NOUT; o++) {
                uint64_t v = load(&b->s[j]->n[o]);
                *total += v;
                if (o != QG_M_ALLOW)
                    *refused += v;
                if (v == 0 && !(b->s[j]->base & (1u << o)))
                    continue;
                fputs("quotagate_decisions_total{plan=\"", f);
                put_label(f, b->plan);
                fputs("\",window=\"", f);
                put_label(f, b->s[j]->window);
                fprintf(f, "\",outcome=\"%s\"} %llu\n", outcome_names[o],
                        (unsigned long long)v);
            }
    }
}

static const char *const anomaly_kind[QG_ANOMALY_COUNT] = {
    "output_over_max_tokens", "output_over_bound", "input_over_bound",
    "response_too_large"};

static void render_settles(qg_metrics *m, FILE *f)
{
    static const char *const st[4] = {"", "completed", "cancelled", "failed"};
    static const char *const dir[2] = {"over", "under"};

    family(f, "quotagate_settles_total", "counter",
           "Settles by status (replays not counted).");
    for (int i = 1; i < 4; i++)
        fprintf(f, "quotagate_settles_total{status=\"%s\"} %llu\n", st[i],
                (unsigned long long)load(&m->settles[i]));
    family(f, "quotagate_settle_mismatch_total", "counter",
           "Settles whose actual weight was above (over) or below (under) "
           "the reservation.");
    for (int i = 0; i < 2; i++)
        fprintf(f, "quotagate_settle_mismatch_total{direction=\"%s\"} %llu\n",
                dir[i], (unsigned long long)load(&m->mismatch[i]));
    family(f, "quotagate_settle_mismatch_weight_total", "counter",
           "Weight points between reservations and actual usage, by "
           "direction.");
    for (int i = 0; i < 2; i++) {
        fprintf(f, "quotagate_settle_mismatch_weight_total{direction=\"%s\"} ",
                dir[i]);
        put_scaled(f, load(&m->mismatch_milli[i]), 3);
        fputc('\n', f);
    }
    family(f, "quotagate_proxy_usage_anomalies_total", "counter",
           "Proxied calls charged other than the upstream reported: output "
           "above max_tokens, or a count above the bound.");
    for (int i = 0; i < QG_ANOMALY_COUNT; i++)
        fprintf(f, "quotagate_proxy_usage_anomalies_total{kind=\"%s\"} "
                "%llu\n", anomaly_kind[i],
                (unsigned long long)load(&m->anomaly[i]));
    family(f, "quotagate_overage_weight_total", "counter",
           "Weight points admitted beyond the limits under payg, as "
           "settled.");
    fputs("quotagate_overage_weight_total ", f);
    put_scaled(f, load(&m->overage_milli), 3);
    fputc('\n', f);
    family(f, "quotagate_overage_cost_usd_total", "counter",
           "What that overage costs, in US dollars, as settled.");
    fputs("quotagate_overage_cost_usd_total ", f);
    put_scaled(f, load(&m->overage_micro), 6);
    fputc('\n', f);
}

static void render_http(qg_metrics *m, FILE *f)
{
    family(f, "quotagate_http_requests_total", "counter",
           "HTTP responses by route and status code.");
    for (int r = 0; r < QG_ROUTE_COUNT; r++)
        for (int c = 0; c <= NCODES; c++) {
            uint64_t v = load(&m->http[r][c]);
            if (!v)
                continue;
            fprintf(f, "quotagate_http_requests_total{route=\"%s\",code=\"",
                    qg__route_label(r));
            if (c < NCODES)
                fprintf(f, "%d", codes[c]);
            else
                fputs("other", f);
            fprintf(f, "\"} %llu\n", (unsigned long long)v);
        }
}

static void gauge_u(FILE *f, const char *name, const char *type,
                    const char *help, uint64_t v)
{
    family(f, name, type, help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void render_gauges(FILE *f, const qg_metrics_gauges *g)
{
    /* le bounds in microseconds, printed in seconds */
    static const uint64_t le_us[7] = {100,    1000,   5000,  10000,
                                      50000, 100000, 1000000};

    gauge_u(f, "quotagate_ledger_queue_depth", "gauge",
            "Ledger rows waiting to be committed.", g->ledger_queue_depth);
    gauge_u(f, "quotagate_ledger_commits_total", "counter",
            "Ledger transactions committed.", g->ledger_commits);
    gauge_u(f, "quotagate_ledger_rows_total", "counter",
            "Ledger rows written.", g->ledger_rows);
    gauge_u(f, "quotagate_ledger_write_errors_total", "counter",
            "Ledger transactions that failed (their settles answered 503).",
            g->ledger_write_errors);
    gauge_u(f, "quotagate_ledger_rows_retried_total", "counter",
            "Ledger rows put back to be written again after a failed "
            "transaction.", g->ledger_rows_retried);
    gauge_u(f, "quotagate_ledger_rows_lost_total", "counter",
            "Ledger rows given up (still failing at shutdown, or no memory "
            "to keep them).", g->ledger_rows_lost);
    gauge_u(f, "quotagate_ledger_rows_refused_total", "counter",
            "Ledger rows not written because their request id holds "
            "another request's row.", g->ledger_rows_refused);
    gauge_u(f, "quotagate_ledger_up", "gauge",
            "1 when the last ledger transaction succeeded, 0 while they "
            "fail.", (uint64_t)g->ledger_up);
    family(f, "quotagate_ledger_commit_seconds", "histogram",
           "Ledger commit latency.");
    for (int i = 0; i < 7; i++) {
        fputs("quotagate_ledger_commit_seconds_bucket{le=\"", f);
        put_scaled(f, le_us[i], 6);
        fprintf(f, "\"} %llu\n", (unsigned long long)g->ledger_commit_le[i]);
    }
    fprintf(f, "quotagate_ledger_commit_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)g->ledger_commit_le[7]);
    fputs("quotagate_ledger_commit_seconds_sum ", f);
    put_scaled(f, g->ledger_commit_us_sum, 6);
    fprintf(f, "\nquotagate_ledger_commit_seconds_count %llu\n",
            (unsigned long long)g->ledger_commit_le[7]);
    family(f, "quotagate_rebuild_seconds", "gauge",
           "How long the last rebuild of the counters from the ledger took.");
    fputs("quotagate_rebuild_seconds ", f);
    put_scaled(f, g->rebuild_ms > 0 ? (uint64_t)g->rebuild_ms : 0, 3);
    fputc('\n', f);
    gauge_u(f, "quotagate_rebuild_rows", "gauge",
            "Ledger rows replayed by the last rebuild.", g->rebuild_rows);
    family(f, "quotagate_rebuild_rows_out_of_bounds", "gauge",
           "Rows of the last rebuild with amounts beyond the bounds: "
           "clamped to them, or skipped.");
    fprintf(f, "quotagate_rebuild_rows_out_of_bounds{action=\"clamped\"} "
            "%llu\n", (unsigned long long)g->rebuild_clamped);
    fprintf(f, "quotagate_rebuild_rows_out_of_bounds{action=\"skipped\"} "
            "%llu\n", (unsigned long long)g->rebuild_skipped);
    gauge_u(f, "quotagate_store_subjects", "gauge",
            "Members and organisations with counter state.",
            g->store_subjects);
    gauge_u(f, "quotagate_store_bytes", "gauge",
            "Heap bytes held by the counter store.", g->store_bytes);
}

/* The HTTP layer's connection counts.  Families and reason labels come
 * from qg_http_drop_names (the reasons of one family are adjacent). */
static void render_connections(FILE *f, const qg_http_stats *h)
{
    static const struct { const char *kind, *help; } fam[] = {
        { "shed", "Connections closed to make room for a new one: idle "
                  "(between keep-alive requests) or slow (an unfinished "
                  "request, the oldest first)." },
        { "refused", "New connections closed at once with nothing to shed: "
                     "the server full (capacity) or the client address at "
                     "its limit (per_client)." },
        { "timed_out", "Connections closed at a deadline: head and body "
                       "(answered 408), idle keep-alive, write (the client "
                       "did not read)." },
    };
    char name[96];
    gauge_u(f, "quotagate_http_connections_open", "gauge",
            "Client connections open.", h->connections_open);
    gauge_u(f, "quotagate_http_connections_max", "gauge",
            "Client connections the server holds at most.",
            h->max_connections);
    gauge_u(f, "quotagate_http_connections_per_client_max", "gauge",
            "Connections one client address may hold (0: no limit).",
            h->max_conns_per_client);
    gauge_u(f, "quotagate_http_connections_accepted_total", "counter",
            "Client connections accepted.", h->connections_total);
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        snprintf(name, sizeof name, "quotagate_http_connections_%s_total",
                 fam[k].kind);
        family(f, name, "counter", fam[k].help);
        for (int d = 0; d < QG_HTTP_DROP_COUNT; d++)
            if (strcmp(qg_http_drop_names[d].kind, fam[k].kind) == 0)
                fprintf(f, "%s{reason=\"%s\"} %llu\n", name,
                        qg_http_drop_names[d].reason,
                        (unsigned long long)h->drops[d]);
    }
}

char *qg__metrics_render(qg_metrics *m, const qg_metrics_gauges *g)
{
    char *text = NULL;
    size_t len = 0;
    uint64_t total = 0, refused = 0;
    FILE *f = open_memstream(&text, &len);

    if (!f)
        return NULL;
    pthread_mutex_lock(&m->lock);
    const table *t = atomic_load_explicit(&m->cur, memory_order_acquire);
    render_decisions(m, f, &total, &refused);
    render_settles(m, f);
    render_http(m, f);
    if (g)
        render_gauges(f, g);
    if (g && g->http)
        render_connections(f, g->http);
    gauge_u(f, "quotagate_up", "gauge", "1 while the gateway serves.", 1);
    family(f, "quotagate_rules_info", "gauge",
           "The rules and weights versions in force.");
    fputs("quotagate_rules_info{rules_version=\"", f);
    put_label(f, g && g->rules_version ? g->rules_version : t->rules_version);
    fputs("\",weights_version=\"", f);
    put_label(f, g && g->weights_version ? g->weights_version
                                         : t->weights_version);
    fputs("\"} 1\n", f);
    pthread_mutex_unlock(&m->lock);

    /* refusals / decisions, six exact decimals */
    family(f, "quotagate_refusal_ratio", "gauge",
           "Refused decisions over all decisions since start.");
    fputs("quotagate_refusal_ratio ", f);
    put_scaled(f, total ? (uint64_t)((unsigned __int128)refused * 1000000u /
                                     total)
                        : 0,
               6);
    fputc('\n', f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
