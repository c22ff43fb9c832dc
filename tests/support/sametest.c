/* sametest.c - field-by-field comparison of two decisions (sametest.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "sametest.h"

static int str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

static void same_view(const char *what, const char *la, const char *lb,
                      const qg_decision *a, const qg_decision *b, int i)
{
    const qg_window_view *x = &a->views[i], *y = &b->views[i];
    if (!str_eq(x->name, y->name) || x->type != y->type ||
        x->unit != y->unit || x->org != y->org ||
        x->limit_milli != y->limit_milli || x->used_milli != y->used_milli ||
        x->remaining_milli != y->remaining_milli ||
        x->reset_at_ms != y->reset_at_ms)
        fail_msg("%s: window %s: %s limit %lld used %lld remaining %lld "
                 "reset %lld; %s %s limit %lld used %lld remaining %lld "
                 "reset %lld", what, x->name, la, (long long)x->limit_milli,
                 (long long)x->used_milli, (long long)x->remaining_milli,
                 (long long)x->reset_at_ms, lb, y->name,
                 (long long)y->limit_milli, (long long)y->used_milli,
                 (long long)y->remaining_milli, (long long)y->reset_at_ms);
    if (a->nrecovery[i] != b->nrecovery[i])
        fail_msg("%s: window %s: %d recovery points in %s, %d in %s", what,
                 x->name, a->nrecovery[i], la, b->nrecovery[i], lb);
    for (int k = 0; k < a->nrecovery[i]; k++)
        if (a->recovery[i][k].at_ms != b->recovery[i][k].at_ms ||
            a->recovery[i][k].remaining_milli !=
                b->recovery[i][k].remaining_milli)
            fail_msg("%s: window %s recovery %d: %s %lld/%lld, %s "
                     "%lld/%lld", what, x->name, k, la,
                     (long long)a->recovery[i][k].at_ms,
                     (long long)a->recovery[i][k].remaining_milli, lb,
                     (long long)b->recovery[i][k].at_ms,
                     (long long)b->recovery[i][k].remaining_milli);
}

void tst_same_decision(const char *what, const char *la, const char *lb,
                       const qg_decision *a, const qg_decision *b)
{
#define SAME(f) do { if (a->f != b->f) fail_msg("%s: " #f " %s %lld, " \
    "%s %lld", what, la, (long long)a->f, lb, (long long)b->f); } while (0)
    SAME(outcome);
    SAME(replayed);
    SAME(weight_milli);
    SAME(decided_at_ms);
    SAME(retry_after_ms);
    SAME(binding);
    SAME(headroom_milli);
    SAME(overage_milli);
    SAME(overage_cost_micro);
    SAME(overage_price_micro);
    SAME(cap_reached);
    SAME(spent_micro);
    SAME(spending_cap_micro);
    SAME(cap_period_end_ms);
    SAME(anchor_ms);
    SAME(nviews);
#undef SAME
    if (!str_eq(a->plan, b->plan) || !str_eq(a->org, b->org) ||
        !str_eq(a->model, b->model) ||
        !str_eq(a->rules_version, b->rules_version))
        fail_msg("%s: names differ: %s plan %s org %s model %s rules %s; "
                 "%s plan %s org %s model %s rules %s", what, la,
                 a->plan ? a->plan : "-", a->org ? a->org : "-",
                 a->model ? a->model : "-",
                 a->rules_version ? a->rules_version : "-", lb,
                 b->plan ? b->plan : "-", b->org ? b->org : "-",
                 b->model ? b->model : "-",
                 b->rules_version ? b->rules_version : "-");
    for (int i = 0; i < a->nviews; i++)
        same_view(what, la, lb, a, b, i);
}
