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
 * with freed memory).  See metrics.h for the exported families; their
 * text is metrics_render.c's. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fixed.h"
#include "metrics_internal.h"

const int qg__metrics_codes[NCODES] = {200, 201, 204, 304, 400, 401, 403, 404, 405,
                            408, 409, 413, 415, 422, 429, 431, 499, 500,
                            502, 503, 504};

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
        if (qg__metrics_codes[i] == code) {
            c = i;
            break;
        }
    atomic_fetch_add_explicit(&m->http[route][c], 1, memory_order_relaxed);
}

