/* pace.c - the subjects' recent usage for forecasts (pace.h): a table of
 * QG_PACE_SLOTS entries, placed by a hash of the subject (a newer subject
 * takes the place of an older one), under one mutex held only to copy an
 * entry in or out; the ledger is read outside it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "forecast.h"
#include "pace.h"

typedef struct entry {
    char subject[256];
    qg_pace_sample s;
} entry;

struct qg__pace {
    pthread_mutex_t mu;
    entry *e;                        /* QG_PACE_SLOTS */
};

qg__pace *qg__pace_new(void)
{
    qg__pace *p = calloc(1, sizeof *p);
    if (!p || !(p->e = calloc(QG_PACE_SLOTS, sizeof *p->e))) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

void qg__pace_free(qg__pace *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->mu);
    free(p->e);
    free(p);
}

static int add_slot(const qg_usage_slot *sl, void *ud)
{
    qg_pace_sample *s = ud;
    int i;
    for (i = 0; i < s->n; i++)
        if (strcmp(s->m[i].model, sl->model) == 0)
            break;
    if (i == s->n) {
        if (s->n < QG_PACE_MODELS) {
            strcpy(s->m[s->n].model, sl->model);
            s->m[s->n].weight_milli = s->m[s->n].admitted = 0;
            s->n++;
        } else {
            i = QG_PACE_MODELS - 1;
        }
    }
    s->m[i].weight_milli += sl->weight_milli;
    s->m[i].admitted += sl->admitted;
    return 0;
}

int qg__pace_get(qg__pace *p, qg_ledger *l, const char *subject,
                 int64_t basis_cfg_ms, int64_t now_ms, qg_pace_sample *out)
{
    size_t len = strlen(subject);
    entry *e = &p->e[XXH3_64bits(subject, len) % QG_PACE_SLOTS];
    int64_t first = -1, basis;
    int rc;

    pthread_mutex_lock(&p->mu);
    if (strcmp(e->subject, subject) == 0 && e->s.at_ms <= now_ms &&
        now_ms - e->s.at_ms < QG_PACE_TTL_MS) {
        *out = e->s;
        pthread_mutex_unlock(&p->mu);
        return QG_OK;
    }
    pthread_mutex_unlock(&p->mu);

    memset(out, 0, sizeof *out);
    out->at_ms = now_ms;
    out->first_ms = -1;
    rc = qg__ledger_first_usage(l, subject, &first);
    if (rc != QG_OK && rc != QG_ENOTFOUND)
        return rc;
    out->first_ms = rc == QG_OK ? first : -1;
    /* from the slot holding the basis's start, so that the pace counts
     * whole slots over the span it names (basis_s = now - from) */
    basis = qg__forecast_basis(basis_cfg_ms, out->first_ms, now_ms);
    out->from_ms = now_ms - basis;
    out->from_ms -= ((out->from_ms % QG_LEDGER_SLOT_MS) + QG_LEDGER_SLOT_MS) %
                    QG_LEDGER_SLOT_MS;
    if (out->from_ms < 0)
        out->from_ms = 0;
    if ((rc = qg__ledger_slots(l, subject, out->from_ms, now_ms + 1,
                               add_slot, out)) != QG_OK) {
        out->n = 0;
        return rc;
    }
    if (len < sizeof e->subject) {
        pthread_mutex_lock(&p->mu);
        memcpy(e->subject, subject, len + 1);
        e->s = *out;
        pthread_mutex_unlock(&p->mu);
    }
    return QG_OK;
}

int64_t qg__pace_counted(const qg_pace_sample *s, const qg_rules *r,
                         const qg_window_spec *w)
{
    int requests = w->unit == QG_UNIT_REQUESTS ||
                   w->type == QG_WIN_CONCURRENCY;
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++) {
        int m = s->m[i].model[0] ? qg_rules_find_model(r, s->m[i].model) : -1;
        if (!qg__window_applies(w, m))
            continue;
        sum += requests ? s->m[i].admitted * 1000 : s->m[i].weight_milli;
    }
    return sum;
}
