/* fallback.c - see fallback.h: local decisions while the store is down.
 *
 * Three tables under one mutex: the last views (what each window of a
 * member or org had left, by entity key, open addressing with a bounded
 * probe: a full neighbourhood overwrites its oldest note), the frozen
 * entities of the outage (budgets, local rate buckets, lease counts), and
 * the journal of what was admitted.  Nothing here reads a clock or does
 * I/O: instants come in the store check, as everywhere in the core. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "fallback.h"
#include "fixed.h"
#include "window.h"

#define DEFAULT_SUBJECTS (1u << 18)
#define PROBE 8                       /* slots a view may land in */
#define JOURNAL_MAX (1u << 18)        /* requests admitted per outage */
#define RETRY_MS 1000                 /* a local refusal: ask again soon */

typedef struct view {
    qg_key key;                       /* {0,0}: empty */
    const qg_window_spec *specs;      /* the windows it was seen with */
    uint32_t n;
    int64_t at_ms;                    /* noted (this instance's clock) */
    int64_t stamp;                    /* decided (the store's clock) */
    int64_t left[QG_MAX_PLAN_WINDOWS];
} view;

typedef struct ent {
    qg_key key;
    const qg_window_spec *specs;
    uint32_t n;
    int64_t budget[QG_MAX_PLAN_WINDOWS];  /* weight, request windows */
    int64_t used[QG_MAX_PLAN_WINDOWS];
    qg_window_spec rate_spec[QG_MAX_PLAN_WINDOWS]; /* scaled rates */
    qg_win_state rate[QG_MAX_PLAN_WINDOWS];
    int64_t slots[QG_MAX_PLAN_WINDOWS];   /* concurrency */
    int64_t leases[QG_MAX_PLAN_WINDOWS];
    int64_t share;                        /* milli, as decided with */
} ent;

typedef struct entry {
    qg_key rid, member, org;
    int has_org, settled, status, model;
    int64_t at_ms, reserved_milli, charged_milli;
    char subject[256], request_id[QG_REQUEST_ID_MAX + 1];
    char model_name[QG_NAME_MAX];
    ent *em, *eo;                     /* for the settle's release */
    int live;                         /* 0: handed over */
} entry;

struct qg__fallback {
    pthread_mutex_t mu;
    view *views;
    uint32_t vcap;                    /* power of two */
    ent **ents;                       /* open addressing by key, cap a power
                                         of two, at most half full */
    uint32_t nents, capents;
    entry *journal;
    uint32_t njournal, capjournal, head;
    uint64_t decisions;
    int closed;                       /* the outage ended (qg__fallback_close):
                                         no local decision until reopened */
};

static int key_eq(qg_key a, qg_key b) { return a.hi == b.hi && a.lo == b.lo; }

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

qg__fallback *qg__fallback_new(uint32_t max_subjects)
{
    qg__fallback *f = calloc(1, sizeof *f);
    uint32_t cap = 16;
    if (!f)
        return NULL;
    if (!max_subjects)
        max_subjects = DEFAULT_SUBJECTS;
    while (cap < max_subjects && cap < (1u << 30))
        cap <<= 1;
    if (!(f->views = calloc(cap, sizeof *f->views))) {
        free(f);
        return NULL;
    }
    f->vcap = cap;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

static view *view_find(qg__fallback *f, qg_key k);
static view *view_slot(qg__fallback *f, qg_key k);

/* What an outage spent stays spent: the entity's view (made when it had
 * none) loses what was admitted locally, counted as if every instance
 * admitted as much (used / share).  A store that comes back and goes
 * again before this instance sees a fresh view of the subject then never
 * grants the same allowance twice. */
static void carry_over(qg__fallback *f, const ent *e)
{
    view *v = view_find(f, e->key);
    if (!v || v->specs != e->specs) {
        v = view_slot(f, e->key);
        v->key = e->key;
        v->specs = e->specs;
        v->n = e->n;
        v->at_ms = 0;
        v->stamp = 0;
        for (uint32_t i = 0; i < e->n; i++)
            v->left[i] = e->specs[i].limit_milli;
    }
    for (uint32_t i = 0; i < e->n; i++) {
        int t = e->specs[i].type;
        __int128 spent;
        if (t == QG_WIN_RATE || t == QG_WIN_CONCURRENCY || e->used[i] <= 0)
            continue;
        spent = (__int128)e->used[i] * QG_MILLI / (e->share > 0 ? e->share : 1);
        v->left[i] = spent >= v->left[i] ? 0 : v->left[i] - (int64_t)spent;
    }
}

static void drop_ents(qg__fallback *f)
{
    for (uint32_t i = 0; i < f->capents; i++) {
        ent *e = f->ents[i];
        if (!e)
            continue;
        carry_over(f, e);
        for (uint32_t w = 0; w < e->n; w++)
            if (e->specs[w].type == QG_WIN_RATE)
                qg__win_free(&e->rate_spec[w], &e->rate[w]);
        free(e);
        f->ents[i] = NULL;
    }
    f->nents = 0;
}

/* The slot of (k, specs) in the entity table: its entity or NULL. */
static ent **ent_slot(qg__fallback *f, qg_key k, const qg_window_spec *specs)
{
    uint32_t m = f->capents - 1;
    for (uint32_t h = (uint32_t)k.lo & m;; h = (h + 1) & m) {
        ent *e = f->ents[h];
        if (!e || (key_eq(e->key, k) && e->specs == specs))
            return &f->ents[h];
    }
}

static int ents_grow(qg__fallback *f)
{
    uint32_t oc = f->capents, nc = oc ? oc * 2 : 256;
    ent **old = f->ents, **ne = calloc(nc, sizeof *ne);
    if (!ne)
        return QG_ENOMEM;
    f->ents = ne;
    f->capents = nc;
    for (uint32_t i = 0; i < oc; i++)
        if (old[i])
            *ent_slot(f, old[i]->key, old[i]->specs) = old[i];
    free(old);
    return QG_OK;
}

void qg__fallback_free(qg__fallback *f)
{
    if (!f)
        return;
    drop_ents(f);
    free(f->ents);
    free(f->journal);
    free(f->views);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* ---------------------------------------------------------- the views */

static view *view_find(qg__fallback *f, qg_key k)
{
    uint32_t m = f->vcap - 1, h = (uint32_t)k.lo & m;
    for (uint32_t i = 0; i < PROBE; i++) {
        view *v = &f->views[(h + i) & m];
        if (key_eq(v->key, k))
            return v;
    }
    return NULL;
}

static view *view_slot(qg__fallback *f, qg_key k)
{
    uint32_t m = f->vcap - 1, h = (uint32_t)k.lo & m;
    view *oldest = NULL;
    for (uint32_t i = 0; i < PROBE; i++) {
        view *v = &f->views[(h + i) & m];
        if (key_eq(v->key, k) || (v->key.hi == 0 && v->key.lo == 0))
            return v;
        if (!oldest || v->at_ms < oldest->at_ms)
            oldest = v;
    }
    return oldest;
}

static int64_t scaled(int64_t v, int64_t share)
{
    __int128 x = (__int128)v * share / QG_MILLI;
    return (int64_t)x;
}

/* Note what a decision the store made at stamp (its own clock) says is
 * left.  Answers of different connections are handled in any order, so
 * an answer may be older than the view it lands on: only one decided
 * later than the view replaces it; one of the same millisecond or older
 * keeps, per window, the smaller of the two (tighter, never looser).  An
 * entity in an outage lowers its budgets to share x what the store says
 * is left: checks in flight when the outage began that the store then
 * applied are not granted a second time locally. */
static void note_one(qg__fallback *f, qg_key k, const qg_window_spec *specs,
                     uint32_t n, const qg_window_view *vs, int64_t at,
                     int64_t stamp)
{
    view *v = view_slot(f, k);
    int merge = key_eq(v->key, k) && v->specs == specs && v->n == n &&
                stamp <= v->stamp;
    if (n > QG_MAX_PLAN_WINDOWS)
        n = QG_MAX_PLAN_WINDOWS;
    v->key = k;
    v->specs = specs;
    v->n = n;
    v->at_ms = at;
    if (!merge)
        v->stamp = stamp;
    for (uint32_t i = 0; i < n; i++)
        if (!merge || vs[i].remaining_milli < v->left[i])
            v->left[i] = vs[i].remaining_milli;
    if (f->nents) {
        ent *e = *ent_slot(f, k, specs);
        for (uint32_t i = 0; e && i < e->n && i < n; i++) {
            int t = specs[i].type;
            int64_t left = v->left[i] < 0 ? 0 : v->left[i], b;
            if (t == QG_WIN_RATE || t == QG_WIN_CONCURRENCY)
                continue;
            if (left > specs[i].limit_milli)
                left = specs[i].limit_milli;
            if ((b = scaled(left, e->share)) < e->budget[i])
                e->budget[i] = b;
        }
    }
}

void qg__fallback_note(qg__fallback *f, const qg_store_check *in,
                       const qg_decision *d)
{
    uint32_t nm = (uint32_t)in->plan->nwindows;
    if (!f || d->nviews < (int)nm)
        return;
    pthread_mutex_lock(&f->mu);
    note_one(f, in->member, in->plan->windows, nm, d->views, in->now_ms,
             d->decided_at_ms);
    if (in->has_org && in->orgspec &&
        d->nviews >= (int)nm + in->orgspec->nwindows)
        note_one(f, in->org, in->orgspec->windows,
                 (uint32_t)in->orgspec->nwindows, d->views + nm, in->now_ms,
                 d->decided_at_ms);
    pthread_mutex_unlock(&f->mu);
}

/* ------------------------------------------------------- the outage */

/* The entity's frozen state, made at its first local decision. */
static ent *ent_get(qg__fallback *f, qg_key k, const qg_window_spec *specs,
                    uint32_t n, int64_t share, int64_t now)
{
    const view *v;
    ent *e, **slot;
    if ((f->nents + 1) * 2 > f->capents && ents_grow(f) != QG_OK)
        return NULL;
    slot = ent_slot(f, k, specs);
    if (*slot)
        return *slot;
    if (!(e = calloc(1, sizeof *e)))
        return NULL;
    e->key = k;
    e->specs = specs;
    e->n = n;
    e->share = share;
    v = view_find(f, k);
    if (v && v->specs != specs)
        v = NULL;                     /* seen under other rules */
    for (uint32_t i = 0; i < n; i++) {
        const qg_window_spec *w = &specs[i];
        int64_t left = v ? v->left[i] : w->limit_milli;
        if (left > w->limit_milli)
            left = w->limit_milli;
        if (left < 0)
            left = 0;
        switch (w->type) {
        case QG_WIN_RATE: {
            /* share x the rate and the burst; the bucket starts at share x
             * what was left of it */
            qg_win_ctx ctx = {now, 0, 0};
            int64_t burst = w->burst_milli > 0 ? w->burst_milli
                                               : w->limit_milli;
            int64_t take;
            e->rate_spec[i] = *w;
            e->rate_spec[i].limit_milli = scaled(w->limit_milli, share);
            e->rate_spec[i].burst_milli = scaled(burst, share);
            if (e->rate_spec[i].limit_milli < 1)
                e->rate_spec[i].limit_milli = 1;
            if (e->rate_spec[i].burst_milli < 1)
                e->rate_spec[i].burst_milli = 1;
            take = e->rate_spec[i].burst_milli - scaled(left, share);
            if (take > 0)
                qg__win_charge(&e->rate_spec[i], &e->rate[i], &ctx, take);
            break;
        }
        case QG_WIN_CONCURRENCY:
            e->slots[i] = scaled(w->limit_milli / QG_MILLI, share);
            if (e->slots[i] < 1)
                e->slots[i] = 1;
            break;
        default:
            e->budget[i] = scaled(left, share);
            break;
        }
    }
    *slot = e;
    f->nents++;
    return e;
}

/* Window i of e admits amount a now?  Returns now, a later instant (a
 * rate bucket refilling), or QG_NEVER (a budget spent: not before the
 * store is back). */
static int64_t local_admit_at(ent *e, uint32_t i, int64_t a, int64_t now)
{
    const qg_window_spec *w = &e->specs[i];
    qg_win_ctx ctx = {now, 0, 0};
    switch (w->type) {
    case QG_WIN_RATE:
        return qg__win_admit_at(&e->rate_spec[i], &e->rate[i], &ctx, a);
    case QG_WIN_CONCURRENCY:
        return e->leases[i] < e->slots[i] ? now : QG_NEVER;
    default:
        return a <= e->budget[i] - e->used[i] ? now : QG_NEVER;
    }
}

static void local_charge(ent *e, uint32_t i, int64_t a, int64_t now)
{
    const qg_window_spec *w = &e->specs[i];
    qg_win_ctx ctx = {now, 0, 0};
    if (w->type == QG_WIN_RATE)
        qg__win_charge(&e->rate_spec[i], &e->rate[i], &ctx, a);
    else if (w->type == QG_WIN_CONCURRENCY)
        e->leases[i]++;
    else
        e->used[i] = qg__amount_add(e->used[i], a);
}

static void local_view(ent *e, uint32_t i, int org, int64_t now,
                       qg_window_view *out)
{
    const qg_window_spec *w = &e->specs[i];
    qg_win_ctx ctx = {now, 0, 0};
    memset(out, 0, sizeof *out);
    if (w->type == QG_WIN_RATE) {
        qg__win_view(&e->rate_spec[i], &e->rate[i], &ctx, out);
    } else if (w->type == QG_WIN_CONCURRENCY) {
        out->limit_milli = e->slots[i] * QG_MILLI;
        out->used_milli = e->leases[i] * QG_MILLI;
        out->remaining_milli = (e->slots[i] - e->leases[i]) * QG_MILLI;
    } else {
        out->limit_milli = e->budget[i];
        out->used_milli = e->used[i];
        out->remaining_milli = e->budget[i] > e->used[i]
                                   ? e->budget[i] - e->used[i] : 0;
    }
    out->name = w->name;
    out->type = w->type;
    out->unit = w->type == QG_WIN_CONCURRENCY ? QG_UNIT_REQUESTS : w->unit;
    out->org = org;
}

int qg__fallback_check(qg__fallback *f, const qg_store_check *in,
                       int64_t share_milli, const char *subject,
                       const char *request_id, const char *model,
                       qg_decision *out)
{
    int64_t now = in->now_ms, latest = now;
    ent *ents[2] = {NULL, NULL};
    uint32_t base[2] = {0, 0};
    int binding = -1, never = -1, nv = 0, rc = QG_OK;
    entry *j;

    if (share_milli < 1 || share_milli > QG_MILLI)
        share_milli = 500;
    pthread_mutex_lock(&f->mu);
    if (f->closed) {
        rc = QG_ESTATE;
        goto out;
    }
    ents[0] = ent_get(f, in->member, in->plan->windows,
                      (uint32_t)in->plan->nwindows, share_milli, now);
    if (ents[0] && in->has_org && in->orgspec)
        ents[1] = ent_get(f, in->org, in->orgspec->windows,
                          (uint32_t)in->orgspec->nwindows, share_milli, now);
    if (!ents[0] || (in->has_org && in->orgspec && !ents[1])) {
        rc = QG_ENOMEM;
        goto out;
    }
    base[1] = ents[0]->n;
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; ents[k] && i < ents[k]->n; i++) {
            const qg_window_spec *w = &ents[k]->specs[i];
            int64_t at;
            if (!qg__window_applies(w, in->model))
                continue;
            at = local_admit_at(ents[k], i,
                                qg__win_amount(w, in->weight_milli), now);
            if (at == QG_NEVER) {
                if (never < 0)
                    never = (int)(base[k] + i);
            } else if (at > latest) {
                latest = at;
                binding = (int)(base[k] + i);
            }
        }
    memset(out, 0, sizeof *out);
    out->weight_milli = in->weight_milli;
    out->decided_at_ms = now;
    out->headroom_milli = -1;
    if (never >= 0 || binding >= 0) {
        /* retryable: a budget comes back with the store, a bucket refills */
        out->outcome = QG_REJECT;
        out->binding = never >= 0 ? never : binding;
        out->retry_after_ms = never >= 0 ? RETRY_MS : latest - now;
    } else if (f->njournal >= JOURNAL_MAX) {
        rc = QG_EFULL;                /* never admit unjournalled */
        goto out;
    } else {
        if (f->njournal == f->capjournal) {
            uint32_t nc = f->capjournal ? f->capjournal * 2 : 256;
            entry *nj = realloc(f->journal, nc * sizeof *nj);
            if (!nj) {
                rc = QG_ENOMEM;
                goto out;
            }
            f->journal = nj;
            f->capjournal = nc;
        }
        for (int k = 0; k < 2; k++)
            for (uint32_t i = 0; ents[k] && i < ents[k]->n; i++) {
                const qg_window_spec *w = &ents[k]->specs[i];
                if (qg__window_applies(w, in->model))
                    local_charge(ents[k], i,
                                 qg__win_amount(w, in->weight_milli), now);
            }
        j = &f->journal[f->njournal++];
        memset(j, 0, sizeof *j);
        j->rid = in->rid;
        j->member = in->member;
        j->org = in->org;
        j->has_org = in->has_org;
        j->model = in->model;
        j->at_ms = now;
        j->reserved_milli = j->charged_milli = in->weight_milli;
        j->em = ents[0];
        j->eo = ents[1];
        j->live = 1;
        copy_str(j->subject, sizeof j->subject, subject);
        copy_str(j->request_id, sizeof j->request_id, request_id);
        copy_str(j->model_name, sizeof j->model_name, model);
        out->outcome = QG_ALLOW;
        out->binding = -1;
    }
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; ents[k] && i < ents[k]->n; i++)
            local_view(ents[k], i, k, now, &out->views[nv++]);
    out->nviews = nv;
    f->decisions++;
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static entry *journal_find(qg__fallback *f, qg_key rid)
{
    for (uint32_t i = f->njournal; i-- > f->head;)
        if (f->journal[i].live && key_eq(f->journal[i].rid, rid))
            return &f->journal[i];
    return NULL;
}

int qg__fallback_knows(qg__fallback *f, qg_key rid)
{
    int found;
    pthread_mutex_lock(&f->mu);
    found = journal_find(f, rid) != NULL;
    pthread_mutex_unlock(&f->mu);
    return found;
}

int qg__fallback_model(qg__fallback *f, qg_key rid, char *model, size_t cap)
{
    entry *j;
    int rc = QG_ENOTFOUND;
    pthread_mutex_lock(&f->mu);
    if ((j = journal_find(f, rid))) {
        copy_str(model, cap, j->model_name);
        rc = QG_OK;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* Give back (delta < 0) or take more (delta > 0) of e's budgets, and
 * free the lease. */
static void local_adjust(ent *e, int model, int64_t delta, int release)
{
    if (!e)
        return;
    for (uint32_t i = 0; i < e->n; i++) {
        const qg_window_spec *w = &e->specs[i];
        if (!qg__window_applies(w, model))
            continue;
        if (w->type == QG_WIN_CONCURRENCY) {
            if (release && e->leases[i] > 0)
                e->leases[i]--;
        } else if (w->type != QG_WIN_RATE && w->unit == QG_UNIT_WEIGHT) {
            e->used[i] = delta > 0 ? qg__amount_add(e->used[i], delta)
                                   : e->used[i] + delta;
            if (e->used[i] < 0)
                e->used[i] = 0;
        }
    }
}

int qg__fallback_settle(qg__fallback *f, const qg_store_settle *in,
                        int64_t actual_milli, qg_settle_result *out)
{
    entry *j;
    int rc = QG_OK;
    pthread_mutex_lock(&f->mu);
    if (!(j = journal_find(f, in->rid))) {
        rc = QG_ENOTFOUND;
        goto out;
    }
    if (in->has_member && !key_eq(j->member, in->member)) {
        rc = QG_EINVAL;
        goto out;
    }
    memset(out, 0, sizeof *out);
    out->reserved_milli = j->reserved_milli;
    out->decided_at_ms = j->at_ms;
    if (j->settled) {
        out->replayed = 1;
        out->actual_milli = out->charged_milli = j->charged_milli;
        out->status = (qg_settle_status)j->status;
        goto out;
    }
    if (in->no_charge)
        actual_milli = 0;
    local_adjust(j->em, j->model, actual_milli - j->reserved_milli, 1);
    local_adjust(j->eo, j->model, actual_milli - j->reserved_milli, 1);
    j->settled = 1;
    j->status = in->status;
    j->charged_milli = actual_milli;
    out->actual_milli = out->charged_milli = actual_milli;
    out->status = in->status;
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int qg__fallback_drain(qg__fallback *f,
                       int (*fn)(const qg_restore_req *rr, void *ud),
                       void *ud)
{
    int rc = QG_OK;
    pthread_mutex_lock(&f->mu);
    while (f->head < f->njournal) {
        entry *j = &f->journal[f->head];
        qg_restore_req rr;
        if (!j->live) {
            f->head++;
            continue;
        }
        memset(&rr, 0, sizeof rr);
        rr.subject = j->subject;
        rr.request_id = j->request_id;
        rr.model = j->model_name[0] ? j->model_name : NULL;
        rr.decided_at_ms = j->at_ms;
        rr.reserved_milli = j->reserved_milli;
        rr.charged_milli = j->charged_milli;
        rr.settled = j->settled;
        rr.status = j->settled ? (qg_settle_status)j->status
                               : QG_SETTLE_COMPLETED;
        rr.headroom_milli = -1;
        /* the store is called without our lock held: a decision in
         * fallback meanwhile appends behind the head */
        pthread_mutex_unlock(&f->mu);
        rc = fn(&rr, ud);
        pthread_mutex_lock(&f->mu);
        if (rc != QG_OK)
            break;
        j = &f->journal[f->head];     /* the array may have moved */
        j->live = 0;
        f->head++;
    }
    if (rc == QG_OK && f->head == f->njournal) {
        f->head = f->njournal = 0;
        drop_ents(f);                 /* the next outage starts from the
                                         views, less what this one spent */
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int qg__fallback_close(qg__fallback *f)
{
    int closed;
    pthread_mutex_lock(&f->mu);
    closed = f->head == f->njournal;
    if (closed)
        f->closed = 1;
    pthread_mutex_unlock(&f->mu);
    return closed;
}

void qg__fallback_open(qg__fallback *f)
{
    pthread_mutex_lock(&f->mu);
    f->closed = 0;
    pthread_mutex_unlock(&f->mu);
}

uint64_t qg__fallback_pending(qg__fallback *f)
{
    uint64_t n;
    pthread_mutex_lock(&f->mu);
    n = f->njournal - f->head;
    pthread_mutex_unlock(&f->mu);
    return n;
}

uint64_t qg__fallback_decisions(qg__fallback *f)
{
    uint64_t n;
    pthread_mutex_lock(&f->mu);
    n = f->decisions;
    pthread_mutex_unlock(&f->mu);
    return n;
}
