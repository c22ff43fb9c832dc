/* rules.c - lifetime and lookups of a compiled rule set.
 *
 * The parser (rules_yaml.c) fills a qg_rules; this file releases it, finds
 * plans, models, orgs, subjects and windows by name, and formats the
 * diagnostic of a rules file that could not be used.  Lookups are linear:
 * rule sets hold tens of names and are searched on load and on admin calls,
 * never per request in a loop that matters. */
#include "quotagate.h"
#include "rules.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_windows(qg_window_spec *w, int n)
{
    int i;
    if (!w)
        return;
    for (i = 0; i < n; i++)
        free(w[i].name);
    free(w);
}

/* One version, not the ones after it. */
static void free_version(qg_rules *r)
{
    int i, j;
    for (i = 0; r->plans && i < r->nplans; i++) {
        qg_plan *p = &r->plans[i];
        free(p->name);
        free_windows(p->windows, p->nwindows);
        for (j = 0; p->claims && j < p->nclaims; j++) {
            free(p->claims[j].window);
            free(p->claims[j].unit);
        }
        free(p->claims);
    }
    free(r->plans);
    for (i = 0; r->orgs && i < r->norgs; i++) {
        free(r->orgs[i].name);
        free_windows(r->orgs[i].windows, r->orgs[i].nwindows);
    }
    free(r->orgs);
    free(r->org_by_name);
    free(r->subject_by_name);
    for (i = 0; r->models && i < r->nmodels; i++) {
        free(r->models[i].name);
        free(r->models[i].upstream);
    }
    free(r->models);
    for (i = 0; r->subjects && i < r->nsubjects; i++)
        free(r->subjects[i].name);
    free(r->subjects);
    for (i = 0; r->zones && i < r->nzones; i++)
        qg__tz_free(r->zones[i]);
    free(r->zones);
    qg__rules_notify_free(&r->notify);
    free(r->path);
    free(r->version);
    free(r->unit);
    free(r->weights_version);
    free(r->changes);
    free(r);
}

void qg_rules_free(qg_rules *r)
{
    while (r) {
        qg_rules *next = r->next;
        free_version(r);
        r = next;
    }
}

const qg_rules *qg_rules_at(const qg_rules *r, int64_t t_ms)
{
    const qg_rules *in_force = NULL;
    for (; r && r->effective_ms <= t_ms; r = r->next)
        in_force = r;
    return in_force;
}

qg_rules *qg__rules_take_version(qg_rules *head, const char *version)
{
    qg_rules *found = NULL, **link = &head;
    while (*link && !found) {
        if (strcmp((*link)->version, version) == 0) {
            found = *link;
            *link = found->next;
            found->next = NULL;
        } else {
            link = &(*link)->next;
        }
    }
    qg_rules_free(head);
    return found;
}

const qg_rules *qg_rules_next(const qg_rules *r)
{
    return r ? r->next : NULL;
}

int64_t qg_rules_effective_ms(const qg_rules *r)
{
    return r->effective_ms;
}

void qg__diag_format(const qg_diag *d, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    if (!d) {
        buf[0] = '\0';
        return;
    }
    if (d->line > 0)
        snprintf(buf, cap, "%s:%d:%d: %s", d->path, d->line,
                 d->column > 0 ? d->column : 1, d->message);
    else
        snprintf(buf, cap, "%s: %s", d->path, d->message);
}

/* Each array holds structs whose first field is not always the name, so
 * one small loop per kind keeps the types honest. */
int qg__rules_find_plan(const qg_rules *r, const char *name)
{
    int i;
    for (i = 0; r && name && i < r->nplans; i++)
        if (r->plans[i].name && strcmp(r->plans[i].name, name) == 0)
            return i;
    return -1;
}

int qg_rules_find_model(const qg_rules *r, const char *name)
{
    int i;
    for (i = 0; r && name && i < r->nmodels; i++)
        if (r->models[i].name && strcmp(r->models[i].name, name) == 0)
            return i;
    return -1;
}

/* An index of n items sorted by name (item i's name pointer at base +
 * i * stride + off), and its binary search. */
typedef struct name_ix {
    const char *base;
    size_t stride, off;
} name_ix;

static const char *ix_name(const name_ix *x, int i)
{
    const char *at = x->base + (size_t)i * x->stride + x->off;
    const char *name;
    memcpy(&name, at, sizeof name);
    return name;
}

static int ix_cmp(const void *a, const void *b, void *ud)
{
    return strcmp(ix_name(ud, *(const int *)a), ix_name(ud, *(const int *)b));
}

static int ix_build(int **out, const void *base, size_t stride, size_t off,
                    int n)
{
    name_ix x = {base, stride, off};
    free(*out);
    *out = NULL;
    if (n <= 0)
        return QG_OK;
    for (int i = 0; i < n; i++)
        if (!ix_name(&x, i))
            return QG_OK;        /* incomplete: lookups scan */
    if (!(*out = malloc((size_t)n * sizeof **out)))
        return QG_ENOMEM;
    for (int i = 0; i < n; i++)
        (*out)[i] = i;
    qsort_r(*out, (size_t)n, sizeof **out, ix_cmp, &x);
    return QG_OK;
}

/* -1 when absent; -2 when there is no index (the caller scans). */
static int ix_find(const int *ix, const void *base, size_t stride,
                   size_t off, int n, const char *name)
{
    name_ix x = {base, stride, off};
    int lo = 0, hi = n - 1;
    if (!ix)
        return -2;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(ix_name(&x, ix[mid]), name);
        if (c == 0)
            return ix[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int qg__rules_index_orgs(qg_rules *r)
{
    return ix_build(&r->org_by_name, r->orgs, sizeof *r->orgs,
                    offsetof(qg_org_spec, name), r->norgs);
}

int qg__rules_index_subjects(qg_rules *r)
{
    return ix_build(&r->subject_by_name, r->subjects, sizeof *r->subjects,
                    offsetof(qg_subject_spec, name), r->nsubjects);
}

int qg__rules_find_org(const qg_rules *r, const char *name)
{
    int i;
    if (r && name &&
        (i = ix_find(r->org_by_name, r->orgs, sizeof *r->orgs,
                     offsetof(qg_org_spec, name), r->norgs, name)) != -2)
        return i;
    for (i = 0; r && name && i < r->norgs; i++)
        if (r->orgs[i].name && strcmp(r->orgs[i].name, name) == 0)
            return i;
    return -1;
}

int qg_rules_find_subject(const qg_rules *r, const char *name)
{
    int i;
    if (r && name &&
        (i = ix_find(r->subject_by_name, r->subjects, sizeof *r->subjects,
                     offsetof(qg_subject_spec, name), r->nsubjects,
                     name)) != -2)
        return i;
    for (i = 0; r && name && i < r->nsubjects; i++)
        if (r->subjects[i].name && strcmp(r->subjects[i].name, name) == 0)
            return i;
    return -1;
}

int qg_rules_admits_subject(const qg_rules *r, const char *name)
{
    return r->default_plan >= 0 || qg_rules_find_subject(r, name) >= 0;
}

const char *qg_rules_version(const qg_rules *r)
{
    return r->version;
}

const char *qg_rules_path(const qg_rules *r)
{
    return r->path;
}

const char *qg_rules_unit(const qg_rules *r)
{
    return r->unit;
}

const qg_window_spec *qg__plan_find_window(const qg_plan *p, const char *name)
{
    int i;
    for (i = 0; p && name && i < p->nwindows; i++)
        if (p->windows[i].name && strcmp(p->windows[i].name, name) == 0)
            return &p->windows[i];
    return NULL;
}
