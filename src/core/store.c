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
