/* store.c - what every store shares: the public calls that forward to
 * its method table (store.h). */
#include "store.h"

void qg_store_free(qg_store *s)
{
    if (s)
        s->m->free(s);
}

void qg_store_stats_get(qg_store *s, qg_store_stats *out)
{
    s->m->stats(s, out);
}

unsigned qg_store_flags(const qg_store *s)
{
    return s->m->flags & (QG_STORE_SHARED | QG_STORE_PERSISTENT);
}

const char *qg_store_name(const qg_store *s)
{
    return s->m->name;
}

qg_store_lane *qg_store_lane_new(qg_store *s, void *loop, char *err,
                                 size_t errcap)
{
    if (errcap)
        err[0] = '\0';
    if (!s->m->lane_new)
        return NULL;
    return s->m->lane_new(s, loop, err, errcap);
}

void qg_store_lane_free(qg_store *s, qg_store_lane *l)
{
    if (l && s->m->lane_free)
        s->m->lane_free(s, l);
}

int qg_store_probe(qg_store *s)
{
    return s->m->probe ? s->m->probe(s) : QG_OK;
}
