/* window.c - the qg_win_* dispatchers over the per-type window code.
 *
 * Every public window operation looks up spec->type in one static table of
 * function pointers and forwards to win_rolling.c, win_calendar.c,
 * win_session.c, win_rate.c or win_concurrency.c.  Keeping the switch in one
 * place means a store (or the engine) never needs to know the types, and a
 * spec with an unknown type fails the same way everywhere: it never admits,
 * never charges, and views as empty. */
#include <stdlib.h>
#include <string.h>
#include "store.h"   /* QG_WIN_BORROWED */
#include "window.h"

typedef struct win_ops {
    int64_t (*admit_at)(const qg_window_spec *, qg_win_state *,
                        const qg_win_ctx *, int64_t);
    int (*charge)(const qg_window_spec *, qg_win_state *, const qg_win_ctx *,
                  int64_t);
    void (*adjust)(const qg_window_spec *, qg_win_state *, const qg_win_ctx *,
                   int64_t, int64_t);
    void (*view)(const qg_window_spec *, qg_win_state *, const qg_win_ctx *,
                 qg_window_view *);
    int (*recovery)(const qg_window_spec *, qg_win_state *,
                    const qg_win_ctx *, qg_recovery_point *, int);
    int (*release)(const qg_window_spec *, qg_win_state *,
                   const qg_win_ctx *);
    size_t (*bytes)(const qg_window_spec *, const qg_win_state *);
    void (*free_state)(qg_win_state *);
} win_ops;

#define OPS(T) .admit_at = qg__##T##_admit_at, .charge = qg__##T##_charge,   \
               .adjust = qg__##T##_adjust, .view = qg__##T##_view,           \
               .recovery = qg__##T##_recovery

static const win_ops ops_table[] = {
    [QG_WIN_ROLLING] = { OPS(rolling), .bytes = qg__rolling_bytes,
                         .free_state = qg__rolling_free },
    [QG_WIN_CALENDAR] = { OPS(calendar) },
    [QG_WIN_SESSION] = { OPS(session) },
    [QG_WIN_RATE] = { OPS(rate) },
    [QG_WIN_CONCURRENCY] = { OPS(concurrency),
                             .release = qg__concurrency_release,
                             .bytes = qg__concurrency_bytes,
                             .free_state = qg__concurrency_free },
};
#undef OPS

static const win_ops *ops_of(const qg_window_spec *s)
{
    if (!s || (unsigned)s->type >= sizeof ops_table / sizeof ops_table[0] ||
        !ops_table[s->type].admit_at)
        return NULL;
    return &ops_table[s->type];
}

int64_t qg__win_admit_at(const qg_window_spec *s, qg_win_state *st,
                        const qg_win_ctx *ctx, int64_t amount_milli)
{
    const win_ops *o = ops_of(s);
    if (!o)
        return QG_NEVER;
    /* Each type handles amount <= 0 itself, answering its own clamped now. */
    return o->admit_at(s, st, ctx, amount_milli);
}

int qg__win_charge(const qg_window_spec *s, qg_win_state *st,
                  const qg_win_ctx *ctx, int64_t amount_milli)
{
    const win_ops *o = ops_of(s);
    return o ? o->charge(s, st, ctx, amount_milli) : QG_EINVAL;
}

void qg__win_adjust(const qg_window_spec *s, qg_win_state *st,
                   const qg_win_ctx *ctx, int64_t t0_ms, int64_t delta_milli)
{
    const win_ops *o = ops_of(s);
    if (o && delta_milli != 0)
        o->adjust(s, st, ctx, t0_ms, delta_milli);
}

int qg__win_release(const qg_window_spec *s, qg_win_state *st,
                   const qg_win_ctx *ctx)
{
    const win_ops *o = ops_of(s);
    return o && o->release ? o->release(s, st, ctx) : 0;
}

void qg__win_view(const qg_window_spec *s, qg_win_state *st,
                 const qg_win_ctx *ctx, qg_window_view *out)
{
    const win_ops *o = ops_of(s);
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    out->name = s->name;
    out->type = (int)s->type;
    /* A concurrency window counts requests in flight whatever its unit. */
    out->unit = s->type == QG_WIN_CONCURRENCY ? (int)QG_UNIT_REQUESTS
                                              : (int)s->unit;
    out->org = 0;
    if (o)
        o->view(s, st, ctx, out);
}

int qg__win_recovery(const qg_window_spec *s, qg_win_state *st,
                    const qg_win_ctx *ctx, qg_recovery_point *pts, int max)
{
    const win_ops *o = ops_of(s);
    if (!o || !pts || max <= 0)
        return 0;
    return o->recovery(s, st, ctx, pts, max);
}

static const win_ops *ops_of_type(qg_win_type t)
{
    if ((unsigned)t >= sizeof ops_table / sizeof ops_table[0] ||
        !ops_table[t].admit_at)
        return NULL;
    return &ops_table[t];
}

size_t qg__win_bytes_type(qg_win_type t, const qg_win_state *st)
{
    const win_ops *o = ops_of_type(t);
    return o && o->bytes ? o->bytes(NULL, st) : 0;
}

void qg__win_free_type(qg_win_type t, qg_win_state *st)
{
    const win_ops *o = ops_of_type(t);
    if (o && o->free_state)
        o->free_state(st);
    memset(st, 0, sizeof *st);
}

size_t qg__win_bytes(const qg_window_spec *s, const qg_win_state *st)
{
    return s ? qg__win_bytes_type(s->type, st) : 0;
}

void qg__win_free(const qg_window_spec *s, qg_win_state *st)
{
    if (s)
        qg__win_free_type(s->type, st);
    else
        memset(st, 0, sizeof *st);
}

size_t qg__lent_bytes(uint32_t cap, size_t elem)
{
    if (cap & QG_WIN_BORROWED)
        return 0;
    return (size_t)cap * elem;
}

void qg__lent_free(void *p, uint32_t cap)
{
    if (!(cap & QG_WIN_BORROWED))
        free(p);
}
