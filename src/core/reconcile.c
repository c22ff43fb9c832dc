/* reconcile.c - counters against the ledger (PRODUCT.md 5.2,
 * docs/reconcile.md), with no I/O of its own: the ledger's rows, the
 * wait for its writer, fresh engines and the clock come from the caller
 * (reconcile.h).
 *
 * One pass:
 *  1. measure: the live engine's views of every subject compared (one
 *     store call each); the instant of each view is that subject's cut,
 *     and an org's cut is the instant of the member view it was read from;
 *  2. catch up: wait until every row submitted before now is readable
 *     (a gateway under load admits requests whose rows are still queued);
 *  3. replay: every admitted row decided at or before its entity's cut,
 *     as it stood at the cut (settled later: still a reservation), into a
 *     fresh engine with qg_engine_restore, the rebuild's call; member
 *     windows from one fresh engine (rows cut at their subject's cut), org
 *     windows from another (rows cut at their org's cut), so that every
 *     entity is compared at its own instant;
 *  4. compare: the fresh engine's views at the same instants, window by
 *     window: drift = store - ledger.
 * A window beyond the tolerance after the first pass is measured again
 * by a second pass over the drifted entities only, which also asks the
 * store, row by row, which request ids it does not know: a transient
 * difference (a decision between a subject's view and its row, both real)
 * does not survive it, a real one does, and only those are reported.
 * A repair restores the rows the store does not know into it (again by
 * qg_engine_restore: a known id is left alone) and a third pass says
 * whether the drifted windows now hold the ledger's figures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "error.h"
#include "reconcile.h"
#include "rules.h"
#include "window.h"

#define MAX_ENTITIES (1u << 22)  /* subjects and orgs in one run */

enum { EXACT, LOW, HIGH };

int qg__recon_row_at(const qg_recon_row *row, int64_t cut_ms,
                     qg_restore_req *out)
{
    if (row->rr.decided_at_ms > cut_ms)
        return 0;
    *out = row->rr;
    if (out->settled && row->settled_ms > cut_ms) {
        out->settled = 0;            /* a reservation at the cut */
        out->charged_milli = out->reserved_milli;
    }
    return 1;
}

int qg__recon_exceeds(int64_t drift_milli, int64_t tolerance_milli)
{
    return drift_milli > tolerance_milli || drift_milli < -tolerance_milli;
}

int qg__recon_compare(const qg_window_view *store, int nstore,
                      const qg_decision *ledger, int side,
                      void (*fn)(int i, int64_t ledger_milli, void *arg),
                      void *arg)
{
    for (int i = 0; i < nstore; i++) {
        int64_t used = 0;
        for (int j = 0; j < ledger->nviews; j++)
            if ((ledger->views[j].org != 0) == (side != 0) &&
                strcmp(ledger->views[j].name, store[i].name) == 0) {
                used = ledger->views[j].used_milli;
                break;
            }
        fn(i, used, arg);
    }
    return nstore;
}

/* ---------------------------------------------------------- entities */

/* A ledger row the store does not know, kept for the report and repair. */
typedef struct lost_row {
    char *rid, *subject, *model;
    qg_restore_req rr;           /* as the ledger holds it now */
} lost_row;

typedef struct sview {
    qg_window_view v;            /* the store's (names owned by the rules) */
    const qg_window_spec *spec;  /* NULL when not found */
} sview;

typedef struct ent {
    char *name;
    int is_org;
    int org;                     /* member: its org's entity, -1 none */
    int rep;                     /* org: the member its views come from */
    int want;                    /* compared in this pass */
    int measured;                /* views and cut of this pass */
    int drifted;
    int64_t cut_ms;
    sview *views;
    int nviews;
    lost_row *lost;
    int nlost, caplost;
} ent;

typedef struct ctx {
    qg_engine *live;
    const qg_recon_src *src;
    const qg_recon_opts *o;
    ent *e;
    uint32_t n, cap;
    uint32_t *idx;               /* open addressing: entity + 1, 0 free */
    uint32_t idxcap;
    int64_t since_ms;
    /* fresh engines: [side][BOUND]: member side, org side; the exact
     * figure at the cut, and the least and most the store can hold with
     * the rows in flight around it (reconcile.h, margin_ms) */
    qg_engine *f[2][3];
    int collect;                 /* this pass lists unknown request ids */
    int rc;
    char *err;
    size_t errcap;
    /* what a pass found */
    qg_reconcile_drift *d;
    int nd, capd;
    uint64_t checked;
    int64_t max_drift;
} ctx;

static uint32_t name_hash(const char *s, int is_org)
{
    uint32_t h = 2166136261u ^ (uint32_t)is_org;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static int ent_find(const ctx *c, const char *name, int is_org)
{
    if (!c->idxcap)
        return -1;
    for (uint32_t j = name_hash(name, is_org) & (c->idxcap - 1); c->idx[j];
         j = (j + 1) & (c->idxcap - 1)) {
        const ent *x = &c->e[c->idx[j] - 1];
        if (x->is_org == is_org && strcmp(x->name, name) == 0)
            return (int)(c->idx[j] - 1);
    }
    return -1;
}

static int idx_put(uint32_t *idx, uint32_t cap, const ent *e, uint32_t i)
{
    uint32_t j = name_hash(e[i].name, e[i].is_org) & (cap - 1);
    while (idx[j])
        j = (j + 1) & (cap - 1);
    idx[j] = i + 1;
    return 0;
}

/* The entity of name, added when absent: its index, or -1 (no memory or
 * too many; c->rc says which). */
static int ent_get(ctx *c, const char *name, int is_org)
{
    int i = ent_find(c, name, is_org);
    ent *x;
    if (i >= 0)
        return i;
    if (c->n >= MAX_ENTITIES) {
        qg__errf(c->err, c->errcap, "more than %u subjects and orgs in the "
                 "ledger's reach: reconcile them with --subject",
                 MAX_ENTITIES);
        c->rc = QG_EFULL;
        return -1;
    }
    if (c->n == c->cap) {
        uint32_t ncap = c->cap ? c->cap * 2 : 256;
        ent *ne = realloc(c->e, ncap * sizeof *ne);
        if (!ne)
            goto nomem;
        c->e = ne;
        c->cap = ncap;
    }
    if ((c->n + 1) * 2 > c->idxcap) {
        uint32_t ncap = c->idxcap ? c->idxcap * 2 : 512;
        uint32_t *ni = calloc(ncap, sizeof *ni);
        if (!ni)
            goto nomem;
        for (uint32_t k = 0; k < c->n; k++)
            idx_put(ni, ncap, c->e, k);
        free(c->idx);
        c->idx = ni;
        c->idxcap = ncap;
    }
    x = &c->e[c->n];
    memset(x, 0, sizeof *x);
    if (!(x->name = strdup(name)))
        goto nomem;
    x->is_org = is_org;
    x->org = -1;
    x->rep = -1;
    idx_put(c->idx, c->idxcap, c->e, c->n);
    return (int)c->n++;
nomem:
    qg__errf(c->err, c->errcap, "%s", "out of memory");
    c->rc = QG_ENOMEM;
    return -1;
}

/* A subject's entity with its org's (as the fresh engine's registry says:
 * the live one has the same subjects).  -1 on failure; -2 when the rules
 * decide nothing for it. */
static int subject_get(ctx *c, const char *name)
{
    int i = ent_find(c, name, 0), o;
    qg_decision d;
    if (i >= 0)
        return i;
    if (qg_engine_usage(c->f[0][EXACT], name, 0, &d) != QG_OK)
        return -2;
    if ((i = ent_get(c, name, 0)) < 0)
        return -1;
    if (d.org) {
        if ((o = ent_get(c, d.org, 1)) < 0)
            return -1;
        c->e[i].org = o;
    }
    return i;
}

static void ents_free(ctx *c)
{
    for (uint32_t i = 0; i < c->n; i++) {
        ent *x = &c->e[i];
        for (int k = 0; k < x->nlost; k++) {
            free(x->lost[k].rid);
            free(x->lost[k].subject);
            free(x->lost[k].model);
        }
        free(x->lost);
        free(x->views);
        free(x->name);
    }
    free(c->e);
    free(c->idx);
}

/* --------------------------------------------------------- measuring */

static const qg_window_spec *spec_of(const qg_rules *r, const qg_decision *d,
                                     const qg_window_view *v)
{
    const qg_window_spec *w = NULL;
    int n = 0, k;
    if (v->org) {
        if (d->org && (k = qg__rules_find_org(r, d->org)) >= 0) {
            w = r->orgs[k].windows;
            n = r->orgs[k].nwindows;
        }
    } else if (d->plan && (k = qg__rules_find_plan(r, d->plan)) >= 0) {
        w = r->plans[k].windows;
        n = r->plans[k].nwindows;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(w[i].name, v->name) == 0)
            return &w[i];
    return NULL;
}

/* Keep the views of one side of d in x (cut at_ms). */
static int keep_views(ctx *c, ent *x, const qg_decision *d, int side,
                      int64_t at_ms)
{
    const qg_rules *r = qg_engine_rules(c->live);
    int n = 0;
    free(x->views);
    if (!(x->views = calloc(QG_MAX_VIEWS, sizeof *x->views))) {
        qg__errf(c->err, c->errcap, "%s", "out of memory");
        return c->rc = QG_ENOMEM;
    }
    for (int i = 0; i < d->nviews; i++)
        if ((d->views[i].org != 0) == (side != 0)) {
            x->views[n].v = d->views[i];
            x->views[n++].spec = spec_of(r, d, &d->views[i]);
        }
    x->nviews = n;
    x->cut_ms = at_ms;
    x->measured = 1;
    return QG_OK;
}

/* The store's views of member i (and of its org when the org is compared
 * and this member speaks for it). */
static int measure(ctx *c, uint32_t i)
{
    ent *x = &c->e[i];
    qg_decision d;
    int64_t now = 0;
    int rc = QG_ESTORE;
    /* a remote store's call may time out on a busy moment: a run of many
     * thousand subjects tries each one three times before it gives up */
    for (int attempt = 0; attempt < 3 && rc == QG_ESTORE; attempt++) {
        now = c->src->now(c->src->ud);
        rc = qg_engine_usage(c->live, x->name, now, &d);
    }
    if (rc != QG_OK) {
        qg__errf(c->err, c->errcap, "the store's counters of subject \"%s\" "
                 "could not be read: %s", x->name, qg_strerror(rc));
        return c->rc = rc;
    }
    if (d.decided_at_ms > 0)
        now = d.decided_at_ms;       /* the store's own instant (Redis) */
    if (x->want && keep_views(c, x, &d, 0, now) != QG_OK)
        return c->rc;
    if (x->org >= 0) {
        ent *o = &c->e[x->org];
        if (o->want && !o->measured && (o->rep < 0 || o->rep == (int)i)) {
            o->rep = (int)i;
            if (keep_views(c, o, &d, 1, now) != QG_OK)
                return c->rc;
        }
    }
    return QG_OK;
}

/* ---------------------------------------------------------- replaying */

static int lose(ctx *c, ent *x, const qg_restore_req *rr)
{
    lost_row *l;
    if (x->nlost >= QG_RECONCILE_IDS_MAX * 4)
        return QG_OK;                /* enough to explain and repair */
    if (x->nlost == x->caplost) {
        int ncap = x->caplost ? x->caplost * 2 : 16;
        lost_row *nl = realloc(x->lost, (size_t)ncap * sizeof *nl);
        if (!nl)
            goto nomem;
        x->lost = nl;
        x->caplost = ncap;
    }
    l = &x->lost[x->nlost];
    l->rr = *rr;
    l->rid = strdup(rr->request_id);
    l->subject = strdup(rr->subject);
    l->model = strdup(rr->model ? rr->model : "");
    if (!l->rid || !l->subject || !l->model) {
        free(l->rid);
        free(l->subject);
        free(l->model);
        goto nomem;
    }
    l->rr.request_id = l->rid;
    l->rr.subject = l->subject;
    l->rr.model = l->model;
    x->nlost++;
    return QG_OK;
nomem:
    qg__errf(c->err, c->errcap, "%s", "out of memory");
    return c->rc = QG_ENOMEM;
}

/* The row into side's three engines at cut (margin m): EXACT as it stood
 * at the cut; LOW without what was decided within m of it, settled at the
 * smaller amount when the settle is within m; HIGH with what was decided
 * up to m after it (as at the cut), a settle within m still a reservation
 * of the larger amount (its lease held).  Returns 1 when the row counts at
 * the cut. */
static int replay_side(ctx *c, int side, const qg_recon_row *row,
                       int64_t cut, int64_t m)
{
    qg_restore_req rr;
    char err[256];
    int64_t lo = row->rr.reserved_milli < row->rr.charged_milli
                     ? row->rr.reserved_milli : row->rr.charged_milli;
    int64_t hi = row->rr.reserved_milli > row->rr.charged_milli
                     ? row->rr.reserved_milli : row->rr.charged_milli;
    int settled_near = row->rr.settled && row->settled_ms > cut - m &&
                       row->settled_ms <= cut + m;
    int counts = qg__recon_row_at(row, cut, &rr);
    if (counts)
        qg_engine_restore(c->f[side][EXACT], &rr, err, sizeof err);
    if (m <= 0) {
        if (counts) {
            qg_engine_restore(c->f[side][LOW], &rr, err, sizeof err);
            qg_engine_restore(c->f[side][HIGH], &rr, err, sizeof err);
        }
        return counts;
    }
    if (qg__recon_row_at(row, cut - m, &rr)) {
        if (settled_near) {
            rr.settled = 1;
            rr.charged_milli = lo;
        }
        qg_engine_restore(c->f[side][LOW], &rr, err, sizeof err);
    }
    if (qg__recon_row_at(row, cut + m, &rr)) {
        if (settled_near) {
            rr.settled = 0;
            rr.reserved_milli = rr.charged_milli = hi;
        }
        /* the most: a row decided after the cut counts as at the cut.  At
         * its own instant it would move the entity's clock past the cut,
         * and a rate window viewed there has drained below what the store
         * holds at the cut with a decision still on its way. */
        if (rr.decided_at_ms > cut)
            rr.decided_at_ms = cut;
        qg_engine_restore(c->f[side][HIGH], &rr, err, sizeof err);
    }
    return counts;
}

static int replay_row(const qg_recon_row *row, void *arg)
{
    ctx *c = arg;
    ent *x, *o = NULL;
    int i = ent_find(c, row->rr.subject, 0), counted = 0;
    int64_t m = c->o->margin_ms;

    if (i < 0)
        return 0;                    /* first seen after the measures */
    x = &c->e[i];
    if (x->org >= 0)
        o = &c->e[x->org];
    if (x->want && x->measured && replay_side(c, 0, row, x->cut_ms, m) &&
        row->rr.decided_at_ms <= x->cut_ms - m)
        counted |= 1;
    if (o && o->want && o->measured && replay_side(c, 1, row, o->cut_ms, m) &&
        row->rr.decided_at_ms <= o->cut_ms - m)
        counted |= 2;
    /* what the store does not know (and is not in flight) explains what
     * it lacks */
    if (c->collect && counted &&
        !qg_engine_remembers(c->live, row->rr.request_id)) {
        if ((counted & 1) && lose(c, x, &row->rr) != QG_OK)
            return c->rc;
        if ((counted & 2) && lose(c, o, &row->rr) != QG_OK)
            return c->rc;
    }
    return 0;
}

/* ---------------------------------------------------------- comparing */

typedef struct cmp {
    ctx *c;
    ent *x;
    ent *member;                 /* x, or the org's representative */
    qg_decision low, high;       /* the bounds' views */
} cmp;

static int add_ids(ctx *c, qg_reconcile_drift *d, const ent *x,
                   const sview *w)
{
    int64_t reach = w->spec ? qg__window_reach(w->spec, 1) : INT64_MAX;
    int n = 0;
    if (!x->nlost || d->drift_milli >= 0)
        return QG_OK;                /* the store lacks nothing */
    if (!(d->request_ids = calloc((size_t)(x->nlost < QG_RECONCILE_IDS_MAX
                                           ? x->nlost : QG_RECONCILE_IDS_MAX),
                                  sizeof *d->request_ids)))
        goto nomem;
    for (int k = 0; k < x->nlost && n < QG_RECONCILE_IDS_MAX; k++) {
        const lost_row *l = &x->lost[k];
        if (reach != INT64_MAX && l->rr.decided_at_ms <= x->cut_ms - reach)
            continue;                /* outside the window's span */
        if (!(d->request_ids[n] = strdup(l->rid)))
            goto nomem;
        d->nrequest_ids = ++n;
    }
    return QG_OK;
nomem:
    qg__errf(c->err, c->errcap, "%s", "out of memory");
    return c->rc = QG_ENOMEM;
}

/* The used figure of window name (side) in d, 0 when absent. */
static int64_t used_in(const qg_decision *d, int side, const char *name)
{
    for (int j = 0; j < d->nviews; j++)
        if ((d->views[j].org != 0) == (side != 0) &&
            strcmp(d->views[j].name, name) == 0)
            return d->views[j].used_milli;
    return 0;
}

static void on_window(int i, int64_t ledger_milli, void *arg)
{
    cmp *m = arg;
    ctx *c = m->c;
    ent *x = m->x;
    const sview *w = &x->views[i];
    int64_t drift = w->v.used_milli - ledger_milli, tol = c->o->tolerance_milli;
    int64_t lo = used_in(&m->low, x->is_org, w->v.name);
    int64_t hi = used_in(&m->high, x->is_org, w->v.name);
    qg_reconcile_drift *d;

    c->checked++;
    /* within what the rows in flight allow, or the tolerance: no drift */
    if (c->rc || !qg__recon_exceeds(drift, tol) ||
        (w->v.used_milli >= lo - tol && w->v.used_milli <= hi + tol))
        return;
    x->drifted = 1;
    if (c->nd == c->capd) {
        int ncap = c->capd ? c->capd * 2 : 16;
        qg_reconcile_drift *nd = realloc(c->d, (size_t)ncap * sizeof *nd);
        if (!nd) {
            qg__errf(c->err, c->errcap, "%s", "out of memory");
            c->rc = QG_ENOMEM;
            return;
        }
        c->d = nd;
        c->capd = ncap;
    }
    d = &c->d[c->nd++];
    memset(d, 0, sizeof *d);
    if (!x->is_org) {
        snprintf(d->subject, sizeof d->subject, "%s", x->name);
        if (x->org >= 0)
            snprintf(d->org, sizeof d->org, "%s", c->e[x->org].name);
    } else {
        snprintf(d->org, sizeof d->org, "%s", x->name);
    }
    snprintf(d->window, sizeof d->window, "%s", w->v.name);
    d->unit = w->v.unit;
    d->ledger_milli = ledger_milli;
    d->store_milli = w->v.used_milli;
    d->drift_milli = drift;
    if (drift > c->max_drift || -drift > c->max_drift)
        c->max_drift = drift < 0 ? -drift : drift;
    if (c->collect)
        add_ids(c, d, x, w);
}

static int compare_all(ctx *c)
{
    static const qg_decision none;
    qg_decision *d = malloc(sizeof *d);
    cmp *m = malloc(sizeof *m);
    if (!d || !m) {
        free(d);
        free(m);
        qg__errf(c->err, c->errcap, "%s", "out of memory");
        return c->rc = QG_ENOMEM;
    }
    for (uint32_t i = 0; i < c->n && !c->rc; i++) {
        ent *x = &c->e[i];
        const ent *who = x;
        int side = x->is_org;
        qg_window_view v[QG_MAX_VIEWS];
        if (!x->want || !x->measured)
            continue;
        if (x->is_org) {
            if (x->rep < 0)
                continue;
            who = &c->e[x->rep];
        }
        m->c = c;
        m->x = x;
        x->drifted = 0;
        /* nothing decided for it: nothing used */
        if (qg_engine_usage(c->f[side][EXACT], who->name, x->cut_ms, d) !=
            QG_OK)
            *d = none;
        if (qg_engine_usage(c->f[side][LOW], who->name, x->cut_ms,
                            &m->low) != QG_OK)
            m->low = none;
        if (qg_engine_usage(c->f[side][HIGH], who->name, x->cut_ms,
                            &m->high) != QG_OK)
            m->high = none;
        for (int k = 0; k < x->nviews; k++)
            v[k] = x->views[k].v;
        qg__recon_compare(v, x->nviews, d, side, on_window, m);
    }
    free(d);
    free(m);
    return c->rc;
}

/* ------------------------------------------------------------- passes */

static void drifts_free(qg_reconcile_drift *d, int n)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < d[i].nrequest_ids; k++)
            free(d[i].request_ids[k]);
        free(d[i].request_ids);
    }
    free(d);
}

static int fresh_engines(ctx *c)
{
    const qg_rules *r = qg_engine_rules(c->live);
    for (int side = 0; side < 2; side++)
        for (int b = 0; b < 3; b++) {
            if (side == 1 && r->norgs == 0)
                continue;
            if (!(c->f[side][b] = c->src->fresh(c->src->ud, c->err,
                                                c->errcap)))
                return c->rc = QG_ENOMEM;
        }
    if (!c->f[1][EXACT])             /* no orgs: never used, never null */
        for (int b = 0; b < 3; b++)
            c->f[1][b] = c->f[0][b];
    return QG_OK;
}

static void fresh_free(ctx *c)
{
    for (int side = 1; side >= 0; side--)
        for (int b = 0; b < 3; b++) {
            if (c->f[side][b] && (side == 0 || c->f[1][b] != c->f[0][b]))
                c->src->fresh_free(c->src->ud, c->f[side][b]);
        }
    memset(c->f, 0, sizeof c->f);
}

/* Measure, catch up, replay, compare the wanted entities; the drifted
 * windows in c->d.  The fresh engines must exist (they are freed). */
static int run_pass(ctx *c, int collect)
{
    int rc;
    drifts_free(c->d, c->nd);
    c->d = NULL;
    c->nd = c->capd = 0;
    c->checked = 0;
    c->max_drift = 0;
    c->collect = collect;
    for (uint32_t i = 0; i < c->n; i++) {
        ent *x = &c->e[i];
        x->measured = 0;
        for (int k = 0; k < x->nlost; k++) {
            free(x->lost[k].rid);
            free(x->lost[k].subject);
            free(x->lost[k].model);
        }
        x->nlost = 0;
    }
    for (uint32_t i = 0; i < c->n; i++) {
        ent *x = &c->e[i];
        int speaks = !x->is_org && x->org >= 0 && c->e[x->org].want &&
                     (c->e[x->org].rep < 0 || c->e[x->org].rep == (int)i);
        if (!x->is_org && (x->want || speaks) && measure(c, i) != QG_OK)
            goto out;
    }
    if ((rc = c->src->catch_up(c->src->ud, c->err, c->errcap)) != QG_OK) {
        c->rc = rc;
        goto out;
    }
    if ((rc = c->src->scan(c->src->ud, c->since_ms, replay_row, c)) != QG_OK) {
        if (!c->rc) {
            c->rc = rc;
            qg__errf(c->err, c->errcap, "the ledger could not be read: %s",
                     qg_strerror(rc));
        }
        goto out;
    }
    compare_all(c);
out:
    fresh_free(c);
    return c->rc;
}

/* Discovery: every subject with an admitted row in the rules' reach. */
static int discover_row(const qg_recon_row *row, void *arg)
{
    ctx *c = arg;
    int i = subject_get(c, row->rr.subject);
    return i == -1 ? c->rc : 0;      /* -2: rules decide nothing for it */
}

/* Want the drifted entities only (and nothing when none drifted). */
static int want_drifted(ctx *c)
{
    int any = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        c->e[i].want = c->e[i].drifted;
        any |= c->e[i].drifted;
    }
    return any;
}

static int repair(ctx *c)
{
    char err[320];
    for (uint32_t i = 0; i < c->n; i++) {
        ent *x = &c->e[i];
        if (!x->want)
            continue;
        for (int k = 0; k < x->nlost; k++) {
            int rc = qg_engine_restore(c->live, &x->lost[k].rr, err,
                                       sizeof err);
            if (rc == QG_ESTORE) {
                qg__errf(c->err, c->errcap, "repair: %s", err);
                return c->rc = rc;
            }
        }
    }
    return QG_OK;
}

/* After a repair, the windows still drifted (after, n): repaired when
 * none lacks what the ledger holds.  A window of an entity that lacked
 * rows may hold more than the ledger afterwards: the store charges a
 * restored row at the newest instant its entity has seen (never back in
 * time), so a rate or rolling window counts it a little later and longer
 * than the ledger does (docs/reconcile.md, "Repair").  An entity that
 * lacked nothing and holds more is not repaired (it is never lowered). */
static int repaired(const qg_reconcile_report *before,
                    const qg_reconcile_drift *after, int n)
{
    for (int i = 0; i < n; i++) {
        int lacked = 0;
        if (after[i].drift_milli < 0)
            return 0;
        for (int k = 0; k < before->ndrifted; k++)
            if (strcmp(before->drifted[k].subject, after[i].subject) == 0 &&
                strcmp(before->drifted[k].org, after[i].org) == 0 &&
                before->drifted[k].drift_milli < 0)
                lacked = 1;
        if (!lacked)
            return 0;
    }
    return 1;
}

int qg__reconcile(qg_engine *live, const qg_recon_src *src,
                  const qg_recon_opts *o, qg_reconcile_report **out,
                  char *err, size_t errcap)
{
    ctx c;
    qg_reconcile_report *rep = NULL;
    int64_t t0;
    int rc;

    memset(&c, 0, sizeof c);
    c.live = live;
    c.src = src;
    c.o = o;
    c.err = err;
    c.errcap = errcap;
    *out = NULL;
    t0 = src->now(src->ud);
    c.since_ms = t0 - qg_engine_reach_ms(live);
    if (!(rep = calloc(1, sizeof *rep))) {
        qg__errf(err, errcap, "%s", "out of memory");
        return QG_ENOMEM;
    }
    rep->at_ms = t0;
    rep->repair = o->repair;
    if (fresh_engines(&c) != QG_OK)
        goto fail;
    if ((rc = src->scan(src->ud, c.since_ms, discover_row, &c)) != QG_OK) {
        if (!c.rc) {
            c.rc = rc;
            qg__errf(err, errcap, "the ledger could not be read: %s",
                     qg_strerror(rc));
        }
        goto fail;
    }
    if (o->subject) {
        int i = subject_get(&c, o->subject);
        if (i == -1)
            goto fail;
        if (i == -2) {
            qg__errf(err, errcap, "unknown subject \"%s\": neither in the "
                     "rules nor created through the admin API, and the "
                     "rules have no default plan", o->subject);
            c.rc = QG_ENOSUBJECT;
            goto fail;
        }
        c.e[i].want = 1;
        if (c.e[i].org >= 0)
            c.e[c.e[i].org].want = 1;
    } else {
        for (uint32_t i = 0; i < c.n; i++)
            c.e[i].want = 1;
    }
    for (uint32_t i = 0; i < c.n; i++) {
        rep->subjects += c.e[i].want && !c.e[i].is_org;
        rep->orgs += c.e[i].want && c.e[i].is_org;
    }
    if (run_pass(&c, 0) != QG_OK)
        goto fail;
    rep->checked = c.checked;
    if (want_drifted(&c)) {
        /* again, the drifted only: what is real survives a second look */
        if (fresh_engines(&c) != QG_OK || run_pass(&c, 1) != QG_OK)
            goto fail;
    } else {
        drifts_free(c.d, c.nd);
        c.d = NULL;
        c.nd = 0;
        c.max_drift = 0;
    }
    rep->drifted = c.d;
    rep->ndrifted = c.nd;
    rep->max_drift_milli = c.max_drift;
    c.d = NULL;
    c.nd = c.capd = 0;
    if (o->repair && rep->ndrifted > 0) {
        if (repair(&c) != QG_OK)
            goto fail;
        want_drifted(&c);
        if (fresh_engines(&c) != QG_OK || run_pass(&c, 0) != QG_OK)
            goto fail;
        rep->repaired = repaired(rep, c.d, c.nd);
        drifts_free(c.d, c.nd);
        c.d = NULL;
    }
    rep->duration_ms = src->now(src->ud) - t0;
    ents_free(&c);
    *out = rep;
    return QG_OK;
fail:
    rc = c.rc ? c.rc : QG_ENOMEM;
    fresh_free(&c);
    drifts_free(c.d, c.nd);
    ents_free(&c);
    qg_reconcile_report_free(rep);
    return rc;
}

void qg_reconcile_report_free(qg_reconcile_report *r)
{
    if (!r)
        return;
    drifts_free(r->drifted, r->ndrifted);
    free(r);
}
