/* refmodel.c - the plain reference model (refmodel.h).
 *
 * Deliberately naive: every window of every subject and org keeps a
 * growable array of every charge ever made to it, in time order, and every
 * question (is there room at T? how much is used?) is answered by scanning
 * that whole array.  Nothing is cached between calls, nothing is pruned.
 * Integer arithmetic only (rate levels in __int128).
 *
 * Searches: each window's "fits at T" is monotone in T when nothing else
 * is charged (usage only drains, leases only expire, periods and sessions
 * only close), so the smallest admitting candidate is found by bisection
 * over the sorted candidate list.  The tests check the result independently
 * (admitted at the instant found, refused one millisecond earlier). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "refmodel.h"

#define REF_DEFAULT_TTL_MS (15LL * 60 * 1000) /* lease / reservation TTL */
#define REF_NEVER INT64_MAX

typedef __int128 i128;

typedef struct ref_charge {
    int64_t t;
    int64_t amount;       /* rate logs also hold settle deltas (signed) */
    int32_t resv;         /* reservation index, -1 none */
    int32_t opener;       /* an admitted charge (any amount >= 0): opens sessions */
} ref_charge;

typedef struct ref_log {
    ref_charge *v;
    size_t n, cap;
} ref_log;

typedef struct ref_subj {
    char *name;
    int plan, org;
    int64_t anchor;
    ref_log *logs;        /* one per window of the plan */
} ref_subj;

typedef struct ref_resv {
    char *rid;
    int subj, org, model;
    int64_t t0, expires;
    int64_t reserved, actual, charged;
    int settled, late;
} ref_resv;

/* String -> index table, open addressing; slots hold index + 1. */
typedef struct strtab {
    int32_t *slot;
    uint64_t *hash;
    uint32_t cap, count;
} strtab;

struct ref_model {
    const qg_rules *rules;
    ref_subj *subj;
    int nsubj, capsubj;
    ref_log **orglogs;    /* per org index, one log per org window */
    ref_resv *resv;
    int nresv, capresv;
    strtab subj_idx, resv_idx;
    int64_t *cand;        /* scratch: candidate instants */
    size_t ncand, capcand;
    int errors;
    char message[256];
};

/* A window as one decision sees it. */
typedef struct wref {
    const qg_window_spec *s;
    ref_log *log;
    int64_t anchor;
    int org;
} wref;

/* ------------------------------------------------------------ helpers */

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "refmodel: out of memory\n");
        abort();
    }
    return q;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xrealloc(NULL, n);
    memcpy(d, s, n);
    return d;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

typedef const char *(*key_fn)(const ref_model *, int);

static const char *subj_key(const ref_model *m, int i) { return m->subj[i].name; }
static const char *resv_key(const ref_model *m, int i) { return m->resv[i].rid; }

static int tab_find(const ref_model *m, const strtab *t, key_fn key,
                    const char *s)
{
    if (!t->cap)
        return -1;
    uint64_t h = fnv1a(s);
    for (uint32_t j = (uint32_t)h & (t->cap - 1); t->slot[j];
         j = (j + 1) & (t->cap - 1))
        if (t->hash[j] == h && strcmp(key(m, t->slot[j] - 1), s) == 0)
            return t->slot[j] - 1;
    return -1;
}

static void tab_put_raw(strtab *t, uint64_t h, int idx)
{
    uint32_t j;
    for (j = (uint32_t)h & (t->cap - 1); t->slot[j]; j = (j + 1) & (t->cap - 1))
        ;
    t->slot[j] = idx + 1;
    t->hash[j] = h;
    t->count++;
}

static void tab_put(strtab *t, const char *s, int idx)
{
    if ((t->count + 1) * 2 > t->cap) {
        strtab n = { 0 };
        n.cap = t->cap ? t->cap * 2 : 64;
        n.slot = calloc(n.cap, sizeof *n.slot);
        n.hash = calloc(n.cap, sizeof *n.hash);
        if (!n.slot || !n.hash) {
            fprintf(stderr, "refmodel: out of memory\n");
            abort();
        }
        for (uint32_t i = 0; i < t->cap; i++)
            if (t->slot[i])
                tab_put_raw(&n, t->hash[i], t->slot[i] - 1);
        free(t->slot);
        free(t->hash);
        *t = n;
    }
    tab_put_raw(t, fnv1a(s), idx);
}

static void log_append(ref_log *l, int64_t t, int64_t amount, int resv,
                       int opener)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->v = xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n].t = t;
    l->v[l->n].amount = amount;
    l->v[l->n].resv = resv;
    l->v[l->n].opener = opener;
    l->n++;
}

static void fail(ref_model *m, const char *what, int64_t a, int64_t b)
{
    m->errors++;
    if (m->errors == 1)
        snprintf(m->message, sizeof m->message, "%s (%lld vs %lld)", what,
                 (long long)a, (long long)b);
}

static int64_t ceil_div_i128(i128 n, i128 d)
{
    i128 q = n / d;
    if (n % d != 0 && n > 0)
        q++;
    return q > INT64_MAX ? INT64_MAX : (int64_t)q;
}

/* --------------------------------------------------- per-window scans */

static int64_t amount_of(const qg_window_spec *s, int64_t weight)
{
    if (s->type == QG_WIN_CONCURRENCY || s->unit == QG_UNIT_REQUESTS)
        return 1000;
    return weight;
}

static int64_t ttl_of(const qg_window_spec *s)
{
    return s->lease_ttl_ms > 0 ? s->lease_ttl_ms : REF_DEFAULT_TTL_MS;
}

static int64_t burst_of(const qg_window_spec *s)
{
    return s->burst_milli > 0 ? s->burst_milli : s->limit_milli;
}

/* Sums are exact in 128 bits, whatever was charged (the engine's bounds,
 * quotagate.h, are not the reference's: it answers what the unbounded
 * arithmetic would); only a view is clamped to the bound, as the
 * engine's. */
static i128 rolling_used(const wref *w, int64_t T)
{
    i128 used = 0;
    for (size_t i = 0; i < w->log->n; i++)
        if (w->log->v[i].t > T - w->s->length_ms)
            used += w->log->v[i].amount;
    return used;
}

/* -1 when the period cannot be computed (the window then never admits). */
static int calendar_used(const wref *w, int64_t T, i128 *used,
                         int64_t *end)
{
    int64_t start, e;
    if (qg__calendar_period(&w->s->cal, w->anchor, T, &start, &e) != 0 ||
        start > T || e <= T)
        return -1;
    *used = 0;
    for (size_t i = 0; i < w->log->n; i++)
        if (w->log->v[i].t >= start && w->log->v[i].t < e)
            *used += w->log->v[i].amount;
    if (end)
        *end = e;
    return 0;
}

/* Walk the log for the last session; *open_end = its end when T is inside
 * it (0 otherwise); returns the usage of the open session. */
static i128 session_used(const wref *w, int64_t T, int64_t *open_end)
{
    int64_t start = 0;
    i128 used = 0;
    int have = 0;
    for (size_t i = 0; i < w->log->n; i++) {
        const ref_charge *c = &w->log->v[i];
        if (c->opener && (!have || c->t >= start + w->s->length_ms)) {
            start = c->t;
            have = 1;
        }
    }
    *open_end = 0;
    if (!have || T >= start + w->s->length_ms)
        return 0;
    for (size_t i = 0; i < w->log->n; i++)
        if (w->log->v[i].t >= start)
            used += w->log->v[i].amount;
    *open_end = start + w->s->length_ms;
    return used;
}

/* Bucket level at T in scaled units (1 milli-unit = per ms-units), by
 * replaying every charge and settle delta in order: the level drains by
 * limit_milli per ms and never goes below empty. */
static i128 rate_level(const wref *w, int64_t T)
{
    const qg_window_spec *s = w->s;
    i128 level = 0;
    int64_t last = 0;
    int have = 0;
    for (size_t i = 0; i < w->log->n; i++) {
        const ref_charge *c = &w->log->v[i];
        if (have && c->t > last) {
            level -= (i128)(c->t - last) * s->limit_milli;
            if (level < 0)
                level = 0;
        }
        if (!have || c->t > last)
            last = c->t;
        have = 1;
        level += (i128)c->amount * s->length_ms;
        if (level < 0)
            level = 0;
    }
    if (have && T > last) {
        level -= (i128)(T - last) * s->limit_milli;
        if (level < 0)
            level = 0;
    }
    return level;
}

static int lease_live(const ref_model *m, const wref *w, const ref_charge *c,
                      int64_t T)
{
    return c->resv >= 0 && !m->resv[c->resv].settled &&
           c->t + ttl_of(w->s) > T;
}

static int64_t conc_count(const ref_model *m, const wref *w, int64_t T)
{
    int64_t n = 0;
    for (size_t i = 0; i < w->log->n; i++)
        if (lease_live(m, w, &w->log->v[i], T))
            n++;
    return n;
}

/* Does amount a fit window w at T (nothing else charged meanwhile)? */
static int fits(const ref_model *m, const wref *w, int64_t a, int64_t T)
{
    const qg_window_spec *s = w->s;
    int64_t end;
    i128 used;

    if (s->type == QG_WIN_CONCURRENCY)
        return conc_count(m, w, T) < s->limit_milli / 1000;
    if (a <= 0)
        return 1;
    switch (s->type) {
    case QG_WIN_ROLLING:
        return rolling_used(w, T) + a <= s->limit_milli;
    case QG_WIN_CALENDAR:
        if (calendar_used(w, T, &used, NULL) != 0)
            return 0;
        return used + a <= s->limit_milli;
    case QG_WIN_SESSION:
        return session_used(w, T, &end) + a <= s->limit_milli;
    case QG_WIN_RATE:
        if (s->limit_milli <= 0 || s->length_ms <= 0)
            return 0;
        return rate_level(w, T) + (i128)a * s->length_ms <=
               (i128)burst_of(s) * s->length_ms;
    default:
        return 0;
    }
}

static int64_t view_clamp(i128 v)
{
    return v > QG_AMOUNT_MAX_MILLI ? QG_AMOUNT_MAX_MILLI : (int64_t)v;
}

/* Used amount as the engine's view reports it (at most the bound). */
static int64_t used_view(const ref_model *m, const wref *w, int64_t T)
{
    int64_t end;
    i128 used = 0;
    switch (w->s->type) {
    case QG_WIN_ROLLING:
        return view_clamp(rolling_used(w, T));
    case QG_WIN_CALENDAR:
        return calendar_used(w, T, &used, NULL) == 0 ? view_clamp(used) : 0;
    case QG_WIN_SESSION:
        return view_clamp(session_used(w, T, &end));
    case QG_WIN_RATE:
        if (w->s->limit_milli <= 0 || w->s->length_ms <= 0)
            return 0;
        return view_clamp(ceil_div_i128(rate_level(w, T), w->s->length_ms));
    case QG_WIN_CONCURRENCY:
        return conc_count(m, w, T) * 1000;
    default:
        return 0;
    }
}

/* ----------------------------------------------------------- candidates */

static void cand_push(ref_model *m, int64_t t)
{
    if (m->ncand == m->capcand) {
        m->capcand = m->capcand ? m->capcand * 2 : 256;
        m->cand = xrealloc(m->cand, m->capcand * sizeof *m->cand);
    }
    m->cand[m->ncand++] = t;
}

/* Append window w's candidate instants (> now) to m->cand. */
static void candidates(ref_model *m, const wref *w, int64_t a, int64_t now)
{
    const qg_window_spec *s = w->s;
    int64_t end;
    i128 used;
    switch (s->type) {
    case QG_WIN_ROLLING:
        for (size_t i = 0; i < w->log->n; i++)
            if (w->log->v[i].t + s->length_ms > now)
                cand_push(m, w->log->v[i].t + s->length_ms);
        break;
    case QG_WIN_CALENDAR:
        if (calendar_used(w, now, &used, &end) == 0)
            cand_push(m, end);
        break;
    case QG_WIN_SESSION:
        session_used(w, now, &end);
        if (end > now)
            cand_push(m, end);
        break;
    case QG_WIN_RATE: {
        if (s->limit_milli <= 0 || s->length_ms <= 0)
            break;
        i128 level = rate_level(w, now);
        i128 need = level + (i128)a * s->length_ms -
                    (i128)burst_of(s) * s->length_ms;
        if (level > 0)   /* the bucket is empty again */
            cand_push(m, now + ceil_div_i128(level, s->limit_milli));
        if (need > 0)    /* just enough has drained for a */
            cand_push(m, now + ceil_div_i128(need, s->limit_milli));
        break;
    }
    case QG_WIN_CONCURRENCY:
        for (size_t i = 0; i < w->log->n; i++)
            if (lease_live(m, w, &w->log->v[i], now))
                cand_push(m, w->log->v[i].t + ttl_of(s));
        break;
    default:
        break;
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sort and deduplicate m->cand[from..], dropping instants < now; returns
 * the number kept (they stay at m->cand + from). */
static size_t cand_sort(ref_model *m, size_t from, int64_t now)
{
    size_t k = from;
    qsort(m->cand + from, m->ncand - from, sizeof *m->cand, cmp_i64);
    for (size_t i = from; i < m->ncand; i++) {
        if (m->cand[i] < now)
            continue;
        if (k > from && m->cand[k - 1] == m->cand[i])
            continue;
        m->cand[k++] = m->cand[i];
    }
    m->ncand = k;
    return k - from;
}

/* Window w's own earliest admitting instant, or REF_NEVER. */
static int64_t window_earliest(ref_model *m, const wref *w, int64_t a,
                               int64_t now)
{
    if (fits(m, w, a, now))
        return now;
    size_t from = m->ncand;
    cand_push(m, now);
    candidates(m, w, a, now);
    size_t n = cand_sort(m, from, now);
    const int64_t *c = m->cand + from;
    int64_t at = REF_NEVER;
    if (fits(m, w, a, c[n - 1])) {
        size_t lo = 0, hi = n - 1;     /* c[hi] fits, c[0] = now does not */
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (fits(m, w, a, c[mid]))
                hi = mid;
            else
                lo = mid;
        }
        at = c[hi];
    }
    m->ncand = from;
    return at;
}

/* --------------------------------------------------------------- model */

ref_model *ref_new(const qg_rules *rules)
{
    ref_model *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->rules = rules;
    m->orglogs = calloc((size_t)rules->norgs + 1, sizeof *m->orglogs);
    for (int i = 0; i < rules->norgs; i++)
        m->orglogs[i] = calloc((size_t)rules->orgs[i].nwindows + 1,
                               sizeof(ref_log));
    for (int i = 0; i < rules->nsubjects; i++)
        ref_set_subject(m, rules->subjects[i].name, rules->subjects[i].plan,
                        rules->subjects[i].org,
                        rules->subjects[i].billing_anchor_ms);
    return m;
}

static void log_free(ref_log *l, int n)
{
    for (int i = 0; i < n; i++)
        free(l[i].v);
    free(l);
}

void ref_free(ref_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nsubj; i++) {
        free(m->subj[i].name);
        log_free(m->subj[i].logs, m->rules->plans[m->subj[i].plan].nwindows);
    }
    for (int i = 0; i < m->rules->norgs; i++)
        log_free(m->orglogs[i], m->rules->orgs[i].nwindows);
    for (int i = 0; i < m->nresv; i++)
        free(m->resv[i].rid);
    free(m->orglogs);
    free(m->subj);
    free(m->resv);
    free(m->subj_idx.slot);
    free(m->subj_idx.hash);
    free(m->resv_idx.slot);
    free(m->resv_idx.hash);
    free(m->cand);
    free(m);
}

int ref_set_subject(ref_model *m, const char *name, int plan, int org,
                    int64_t anchor_ms)
{
    const qg_rules *r = m->rules;
    if (plan < 0 || plan >= r->nplans || org >= r->norgs)
        return QG_EINVAL;
    int i = tab_find(m, &m->subj_idx, subj_key, name);
    const qg_plan *np = &r->plans[plan];
    if (i < 0) {
        if (m->nsubj == m->capsubj) {
            m->capsubj = m->capsubj ? m->capsubj * 2 : 16;
            m->subj = xrealloc(m->subj, (size_t)m->capsubj * sizeof *m->subj);
        }
        i = m->nsubj++;
        m->subj[i].name = xstrdup(name);
        m->subj[i].logs = calloc((size_t)np->nwindows + 1, sizeof(ref_log));
        tab_put(&m->subj_idx, name, i);
    } else if (m->subj[i].plan != plan) {
        /* A new plan: each window keeps the log of the same-named window of
         * the same type, as the engine carries state over. */
        const qg_plan *op = &r->plans[m->subj[i].plan];
        ref_log *nl = calloc((size_t)np->nwindows + 1, sizeof(ref_log));
        for (int a = 0; a < np->nwindows; a++)
            for (int b = 0; b < op->nwindows; b++)
                if (np->windows[a].type == op->windows[b].type &&
                    strcmp(np->windows[a].name, op->windows[b].name) == 0) {
                    nl[a] = m->subj[i].logs[b];
                    memset(&m->subj[i].logs[b], 0, sizeof(ref_log));
                    break;
                }
        log_free(m->subj[i].logs, op->nwindows);
        m->subj[i].logs = nl;
    }
    m->subj[i].plan = plan;
    m->subj[i].org = org;
    m->subj[i].anchor = anchor_ms;
    return QG_OK;
}

/* The subject's index, creating it on the default plan when unknown. */
static int find_subject(ref_model *m, const char *name)
{
    int i = tab_find(m, &m->subj_idx, subj_key, name);
    if (i >= 0 || m->rules->default_plan < 0)
        return i;
    ref_set_subject(m, name, m->rules->default_plan, -1, 0);
    return tab_find(m, &m->subj_idx, subj_key, name);
}

/* Member windows, then the org's (org index given: a reservation keeps the
 * org it was charged to). */
static int gather(ref_model *m, int si, int org, wref *w)
{
    const qg_plan *p = &m->rules->plans[m->subj[si].plan];
    int n = 0;
    for (int i = 0; i < p->nwindows && n < QG_MAX_VIEWS; i++, n++) {
        w[n].s = &p->windows[i];
        w[n].log = &m->subj[si].logs[i];
        w[n].anchor = m->subj[si].anchor;
        w[n].org = 0;
    }
    if (org >= 0) {
        const qg_org_spec *o = &m->rules->orgs[org];
        for (int i = 0; i < o->nwindows && n < QG_MAX_VIEWS; i++, n++) {
            w[n].s = &o->windows[i];
            w[n].log = &m->orglogs[org][i];
            w[n].anchor = 0;
            w[n].org = 1;
        }
    }
    return n;
}

static int all_fit(ref_model *m, const wref *w, int n, int model,
                   int64_t weight, int64_t T)
{
    for (int i = 0; i < n; i++)
        if (qg__window_applies(w[i].s, model) &&
            !fits(m, &w[i], amount_of(w[i].s, weight), T))
            return 0;
    return 1;
}

/* The decision at now, without side effects. */
static void decide(ref_model *m, const wref *w, int n, int model,
                   int64_t weight, int64_t now, ref_decision *out)
{
    int64_t inst[QG_MAX_VIEWS], latest = now;
    int binding = -1, never = -1;

    for (int i = 0; i < n; i++) {
        inst[i] = now;
        if (!qg__window_applies(w[i].s, model))
            continue;
        inst[i] = window_earliest(m, &w[i], amount_of(w[i].s, weight), now);
        if (inst[i] == REF_NEVER) {
            if (never < 0)
                never = i;
        } else if (inst[i] > latest) {
            latest = inst[i];
            binding = i;
        }
    }
    out->outcome = QG_ALLOW;
    out->retry_after_ms = 0;
    out->binding = -1;
    if (never >= 0) {
        out->outcome = QG_REJECT_NEVER;
        out->binding = never;
    } else if (binding >= 0) {
        /* The combined answer: among the candidates of every window, the
         * smallest at which a fresh evaluation of every window admits.  By
         * monotonicity it is `latest` exactly when every window admits at
         * latest and some window refuses at the candidate before it; both
         * are checked with full evaluations. */
        size_t from = m->ncand;
        cand_push(m, now);
        for (int i = 0; i < n; i++)
            if (qg__window_applies(w[i].s, model))
                candidates(m, &w[i], amount_of(w[i].s, weight), now);
        size_t k = cand_sort(m, from, now), j = 0;
        const int64_t *c = m->cand + from;
        while (j < k && c[j] < latest)
            j++;
        if (j == k || c[j] != latest)
            fail(m, "latest window instant is not a candidate", latest, now);
        else if (!all_fit(m, w, n, model, weight, latest))
            fail(m, "not admitted at the latest window instant", latest, now);
        else if (j == 0 || all_fit(m, w, n, model, weight, c[j - 1]))
            fail(m, "admitted before the latest window instant",
                 j ? c[j - 1] : now, latest);
        m->ncand = from;
        out->outcome = QG_REJECT;
        out->binding = binding;
        out->retry_after_ms = latest - now;
    } else if (!all_fit(m, w, n, model, weight, now)) {
        fail(m, "every window admits alone but not together", now, now);
    }
    out->binding_name = out->binding >= 0 ? w[out->binding].s->name : NULL;
    out->binding_org = out->binding >= 0 ? w[out->binding].org : 0;
}

int ref_check_ex(ref_model *m, const char *subject, const char *rid,
                 int model, int64_t weight_milli, int64_t now_ms, int commit,
                 ref_decision *out)
{
    wref w[QG_MAX_VIEWS];
    int si, ri, n;

    memset(out, 0, sizeof *out);
    out->binding = -1;
    if ((si = find_subject(m, subject)) < 0)
        return out->rc = QG_ENOSUBJECT;
    if ((ri = tab_find(m, &m->resv_idx, resv_key, rid)) >= 0) {
        if (m->resv[ri].subj != si)
            return out->rc = QG_EINVAL;
        out->outcome = QG_ALLOW;
        out->replayed = 1;
        out->weight_milli = m->resv[ri].reserved;
        return out->rc = QG_OK;
    }
    out->weight_milli = weight_milli;
    n = gather(m, si, m->subj[si].org, w);
    decide(m, w, n, model, weight_milli, now_ms, out);
    if (out->outcome != QG_ALLOW || !commit)
        return out->rc = QG_OK;

    /* Remember the reservation and log the charge in every window. */
    if (m->nresv == m->capresv) {
        m->capresv = m->capresv ? m->capresv * 2 : 64;
        m->resv = xrealloc(m->resv, (size_t)m->capresv * sizeof *m->resv);
    }
    ri = m->nresv++;
    ref_resv *r = &m->resv[ri];
    const qg_plan *p = &m->rules->plans[m->subj[si].plan];
    int64_t ttl = REF_DEFAULT_TTL_MS;
    for (int i = 0; i < p->nwindows; i++)
        if (p->windows[i].type == QG_WIN_CONCURRENCY &&
            p->windows[i].lease_ttl_ms > 0) {
            ttl = p->windows[i].lease_ttl_ms;
            break;
        }
    memset(r, 0, sizeof *r);
    r->rid = xstrdup(rid);
    r->subj = si;
    r->org = m->subj[si].org;
    r->model = model;
    r->t0 = now_ms;
    r->expires = now_ms + ttl;
    r->reserved = r->charged = weight_milli;
    tab_put(&m->resv_idx, rid, ri);
    for (int i = 0; i < n; i++) {
        if (!qg__window_applies(w[i].s, model))
            continue;
        int64_t a = amount_of(w[i].s, weight_milli);
        log_append(w[i].log, now_ms, a, ri, a >= 0);
    }
    return out->rc = QG_OK;
}

int ref_check(ref_model *m, const char *subject, const char *rid, int model,
              int64_t weight_milli, int64_t now_ms, ref_decision *out)
{
    return ref_check_ex(m, subject, rid, model, weight_milli, now_ms, 1, out);
}

/* The entry of reservation ri in a log, by its instant t0. */
static ref_charge *find_charge(ref_log *l, int ri, int64_t t0)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->v[mid].t < t0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < l->n && l->v[lo].t == t0; lo++)
        if (l->v[lo].resv == ri)
            return &l->v[lo];
    return NULL;
}

int ref_settle(ref_model *m, const char *rid, int64_t actual_milli,
               int64_t now_ms, ref_settle_result *out)
{
    wref w[QG_MAX_VIEWS];
    int ri, n;

    memset(out, 0, sizeof *out);
    if ((ri = tab_find(m, &m->resv_idx, resv_key, rid)) < 0)
        return out->rc = QG_ENOTFOUND;
    ref_resv *r = &m->resv[ri];
    if (!r->settled) {
        int64_t actual = actual_milli >= 0 ? actual_milli : r->reserved;
        int64_t delta = actual - r->reserved;
        r->late = now_ms >= r->expires;
        if (r->late && delta < 0)
            delta = 0;    /* an expired reservation is final */
        n = gather(m, r->subj, r->org, w);
        for (int i = 0; i < n; i++) {
            const qg_window_spec *s = w[i].s;
            if (!qg__window_applies(s, r->model) || s->unit != QG_UNIT_WEIGHT ||
                s->type == QG_WIN_CONCURRENCY || delta == 0)
                continue;
            if (s->type == QG_WIN_RATE) {
                log_append(w[i].log, now_ms, delta, ri, 0);
            } else {
                ref_charge *c = find_charge(w[i].log, ri, r->t0);
                if (!c) {
                    fail(m, "settle: charge not found in a log", r->t0, 0);
                    continue;
                }
                c->amount += delta;
                if (c->amount < 0)
                    c->amount = 0;
            }
        }
        r->actual = actual;
        r->charged = r->reserved + delta;
        r->settled = 1;   /* frees its leases */
        out->replayed = 0;
    } else {
        out->replayed = 1;
    }
    out->late = r->late;
    out->reserved_milli = r->reserved;
    out->actual_milli = r->actual;
    out->charged_milli = r->charged;
    return out->rc = QG_OK;
}

int ref_admits_at(ref_model *m, const char *subject, int model,
                  int64_t weight_milli, int64_t t_ms)
{
    wref w[QG_MAX_VIEWS];
    int si = find_subject(m, subject);
    if (si < 0)
        return -1;
    int n = gather(m, si, m->subj[si].org, w);
    return all_fit(m, w, n, model, weight_milli, t_ms);
}

int ref_used(ref_model *m, const char *subject, int64_t now_ms,
             int64_t *used_milli, int max)
{
    wref w[QG_MAX_VIEWS];
    int si = find_subject(m, subject);
    if (si < 0)
        return -1;
    int n = gather(m, si, m->subj[si].org, w);
    if (n > max)
        n = max;
    for (int i = 0; i < n; i++)
        used_milli[i] = used_view(m, &w[i], now_ms);
    return n;
}

size_t ref_log_entries(const ref_model *m)
{
    size_t total = 0;
    for (int i = 0; i < m->nsubj; i++)
        for (int j = 0; j < m->rules->plans[m->subj[i].plan].nwindows; j++)
            total += m->subj[i].logs[j].n;
    for (int i = 0; i < m->rules->norgs; i++)
        for (int j = 0; j < m->rules->orgs[i].nwindows; j++)
            total += m->orglogs[i][j].n;
    return total;
}

int ref_internal_errors(const ref_model *m, const char **message)
{
    if (message)
        *message = m->message;
    return m->errors;
}
