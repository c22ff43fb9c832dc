/* redis_reply.c - decoding the script's replies (redis_script.h).
 *
 * A reply is one flat array whose first element names its kind ("ok",
 * "period", "einval", ...); the rest is integers in the order ops.lua's
 * put_decision, settle_reply and usage write them.  Views come back as
 * numbers only (limit, used, remaining, reset, then the recovery points);
 * their names, types, units and org flags are the windows' own, in the
 * member-then-org order of the decision, as store_memory.c's gather
 * lists them, of the lists the reply names.  Any reply of another shape decodes as QG__RS_BAD (the
 * store answers QG_EIO): a script never crashes its caller. */
#include <string.h>
#include "redis_script.h"

typedef struct rd {
    const qg__rs_item *it;
    int n, i, bad;
} rd;

static int64_t geti(rd *r)
{
    if (r->i >= r->n || r->it[r->i].is_str) {
        r->bad = 1;
        return 0;
    }
    return r->it[r->i++].i;
}

static int is_kind(const qg__rs_item *it, int n, const char *k)
{
    size_t l = strlen(k);
    return n > 0 && it[0].is_str && it[0].len == l &&
           memcmp(it[0].s, k, l) == 0;
}

/* The common kinds; 1 when it was one of them. */
static int common_kind(const qg__rs_item *it, int n, qg__rs_result *res)
{
    rd r = {it, n, 1, 0};
    memset(res, 0, sizeof *res);
    if (is_kind(it, n, "period")) {
        res->kind = QG__RS_PERIOD;
        res->raw_now = geti(&r);
        res->need_now = geti(&r);
    } else if (is_kind(it, n, "einval")) {
        res->kind = QG__RS_EINVAL;
    } else if (is_kind(it, n, "err")) {
        res->kind = QG__RS_ERR;
        res->rc = (int)geti(&r);
    } else if (is_kind(it, n, "notfound")) {
        res->kind = QG__RS_NOTFOUND;
    } else if (is_kind(it, n, "absent")) {
        res->kind = QG__RS_ABSENT;
    } else if (is_kind(it, n, "layout")) {
        res->kind = QG__RS_LAYOUT;
    } else if (is_kind(it, n, "ok")) {
        res->kind = QG__RS_OK;
        return 0;
    } else {
        res->kind = QG__RS_BAD;
    }
    if (r.bad)
        res->kind = QG__RS_BAD;
    return 1;
}

/* The views: the lists the member's and the org's state follow (1-based
 * in the script's LIST, 0 none), then per window its numbers; names,
 * types, units and org flags come from those lists' windows. */
static int read_views(rd *r, const qg__rs_version *v, qg_decision *out)
{
    int lm = (int)geti(r), lo = (int)geti(r), n = (int)geti(r);
    const qg_window_spec *wm = NULL, *wo = NULL;
    int nm = 0, no = 0;
    if (r->bad || lm < 0 || lm > v->nall || lo < 0 || lo > v->nall)
        return -1;
    if (lm > 0) {
        wm = v->list_w[lm - 1];
        nm = v->list_n[lm - 1];
    }
    if (lo > 0) {
        wo = v->list_w[lo - 1];
        no = v->list_n[lo - 1];
    }
    if (n != nm + no || n > QG_MAX_VIEWS)
        return -1;
    out->nviews = n;
    for (int i = 0; i < n; i++) {
        const qg_window_spec *s = i < nm ? &wm[i] : &wo[i - nm];
        qg_window_view *view = &out->views[i];
        int k;
        view->name = s->name;
        view->type = (int)s->type;
        view->unit = s->type == QG_WIN_CONCURRENCY ? (int)QG_UNIT_REQUESTS
                                                   : (int)s->unit;
        view->org = i >= nm;
        view->limit_milli = geti(r);
        view->used_milli = geti(r);
        view->remaining_milli = geti(r);
        view->reset_at_ms = geti(r);
        view->period_ms = 0;     /* the script does not say: computed */
        k = (int)geti(r);
        if (r->bad || k < 0 || k > QG_MAX_RECOVERY)
            return -1;
        out->nrecovery[i] = k;
        for (int j = 0; j < k; j++) {
            out->recovery[i][j].at_ms = geti(r);
            out->recovery[i][j].remaining_milli = geti(r);
        }
    }
    return r->bad ? -1 : 0;
}

/* A new decision's (or a window error's) versions and undo log. */
static void read_undo(rd *r, qg__rs_result *res)
{
    res->mv = geti(r);
    res->ov = geti(r);
    res->nundo = (int)geti(r);
    res->has_undo = 1;
    /* entries of four: op, key index (integers), two operands */
    if (r->bad || res->nundo < 0 || res->nundo > r->n ||
        r->i + 4 * res->nundo > r->n) {
        res->kind = QG__RS_BAD;
        return;
    }
    res->undo = &r->it[r->i];
    for (int i = 0; i < res->nundo; i++)
        if (r->it[r->i + 4 * i].is_str || r->it[r->i + 4 * i + 1].is_str) {
            res->kind = QG__RS_BAD;
            return;
        }
}

void qg__rs_decode_check(const qg__rs_item *it, int n,
                         const qg__rs_version *v, qg_decision *out,
                         qg__rs_result *res)
{
    rd r = {it, n, 1, 0};
    if (common_kind(it, n, res)) {
        if (res->kind == QG__RS_ERR) {
            r.i = 2;
            read_undo(&r, res);
        }
        return;
    }
    out->outcome = (qg_outcome)geti(&r);
    out->replayed = (int)geti(&r);
    out->weight_milli = geti(&r);
    out->decided_at_ms = geti(&r);
    out->retry_after_ms = geti(&r);
    out->binding = (int)geti(&r);
    out->headroom_milli = geti(&r);
    out->overage_milli = geti(&r);
    out->overage_cost_micro = geti(&r);
    out->overage_price_micro = geti(&r);
    out->cap_reached = (int)geti(&r);
    out->spent_micro = geti(&r);
    if (r.bad || read_views(&r, v, out) != 0 ||
        out->outcome < QG_ALLOW || out->outcome > QG_REJECT_NEVER ||
        out->binding < -1 || out->binding >= out->nviews) {
        res->kind = QG__RS_BAD;
        return;
    }
    if (!out->replayed)
        read_undo(&r, res);
}

void qg__rs_decode_settle(const qg__rs_item *it, int n,
                          qg_settle_result *out, qg__rs_result *res)
{
    rd r = {it, n, 1, 0};
    if (is_kind(it, n, "moved")) {
        memset(res, 0, sizeof *res);
        res->kind = QG__RS_MOVED;
        if (n != 3 || !it[1].is_str || !it[2].is_str ||
            it[1].len != 32 || (it[2].len != 32 && it[2].len != 1)) {
            res->kind = QG__RS_BAD;
            return;
        }
        memcpy(res->moved.member, it[1].s, 32);
        res->moved.member[32] = 0;
        memcpy(res->moved.org, it[2].s, it[2].len);
        res->moved.org[it[2].len] = 0;
        memcpy(res->moved.tag, it[2].len == 32 ? it[2].s : it[1].s, 32);
        res->moved.tag[32] = 0;
        return;
    }
    if (common_kind(it, n, res))
        return;
    out->replayed = (int)geti(&r);
    out->late = (int)geti(&r);
    out->reserved_milli = geti(&r);
    out->actual_milli = geti(&r);
    out->charged_milli = geti(&r);
    out->decided_at_ms = geti(&r);
    out->status = (qg_settle_status)geti(&r);
    out->overage_milli = geti(&r);
    out->overage_cost_micro = geti(&r);
    if (r.bad)
        res->kind = QG__RS_BAD;
}

void qg__rs_decode_usage(const qg__rs_item *it, int n,
                         const qg__rs_version *v, qg_decision *out,
                         qg__rs_result *res)
{
    rd r = {it, n, 1, 0};
    if (common_kind(it, n, res))
        return;
    out->spent_micro = geti(&r);
    if (r.bad || read_views(&r, v, out) != 0)
        res->kind = QG__RS_BAD;
}

void qg__rs_decode_restore(const qg__rs_item *it, int n, qg__rs_result *res)
{
    rd r = {it, n, 1, 0};
    if (common_kind(it, n, res))
        return;
    res->rc = (int)geti(&r);
    if (r.bad)
        res->kind = QG__RS_BAD;
}
