/* h_history.c - GET /v1/usage/history and /v1/usage/requests (the
 * subject's key) and /v1/usage/{subject}/history, /requests (the admin
 * key): a subject's usage per bucket and its latest ledger rows
 * (PRODUCT.md section 7, docs/api.md "History").
 *
 * History: the subject is resolved as for /v1/usage (its plan and org
 * now, through the engine) to find the named window, whose models and
 * time zone say what counts and where the buckets start; the ledger's
 * rollup (usage_slots: quarter hours by model) is read for the range and
 * added into hours or days of that zone.  Requests: the subject's rows,
 * newest first, straight from the ledger.
 *
 * Both read the ledger synchronously on the worker's thread, on the
 * history connection of their own (the decision path's lookups use
 * another): a read costs the worker the milliseconds docs/benchmarks.md
 * measures, and the range (at most 744 hourly or 400 daily buckets) and
 * the limit (at most 500 rows) bound it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "calendar.h"
#include "fixed.h"
#include "gate.h"
#include "json_out.h"
#include "query.h"
#include "rules.h"
#include "server.h"
#include "tz.h"

#define HOUR_MS INT64_C(3600000)
#define DAY_MS (24 * HOUR_MS)
#define MAX_HOURLY 744          /* 31 days of hours */
#define MAX_DAILY 400           /* 13 months of days */
#define REQUESTS_DEFAULT 50
#define REQUESTS_MAX 500

enum { KIND_HISTORY = 1, KIND_REQUESTS };

/* ------------------------------------------------------------ buckets */

static qg_tz *utc_zone;
static pthread_once_t utc_once = PTHREAD_ONCE_INIT;
static void utc_init(void) { utc_zone = qg__tz_utc(); }

/* The zone a window's buckets are counted in: a calendar window's own,
 * every other window's UTC. */
static const qg_tz *window_zone(const qg_window_spec *w)
{
    pthread_once(&utc_once, utc_init);
    if (w->type == QG_WIN_CALENDAR && w->cal.tz)
        return w->cal.tz;
    return utc_zone;
}

/* The start of the hour (local, in tz) holding t: the wall clock read to
 * the hour, back to UTC by the offset in force at t (so both hours of a
 * fall-back night are buckets of their own). */
static int64_t hour_floor(const qg_tz *tz, int64_t t)
{
    int64_t local = t + (int64_t)qg__tz_offset_at(tz, t) * 1000;
    int64_t r = ((local % HOUR_MS) + HOUR_MS) % HOUR_MS;
    return t - r;
}

/* The start of the local day holding t, and the next day's start: a daily
 * calendar period at 00:00 (calendar.c: DST-correct, 23- and 25-hour
 * days). */
static int day_bounds(const qg_tz *tz, int64_t t, int64_t *start,
                      int64_t *end)
{
    qg_calendar_spec c;
    memset(&c, 0, sizeof c);
    c.every = QG_EVERY_DAY;
    c.tz = tz;
    return qg__calendar_period(&c, 0, t, start, end);
}

typedef struct buckets {
    int n;
    int64_t start[MAX_DAILY > MAX_HOURLY ? MAX_DAILY + 1 : MAX_HOURLY + 1];
    int64_t weight_milli[MAX_HOURLY > MAX_DAILY ? MAX_HOURLY : MAX_DAILY];
    int64_t requests[MAX_HOURLY > MAX_DAILY ? MAX_HOURLY : MAX_DAILY];
    int64_t refused[MAX_HOURLY > MAX_DAILY ? MAX_HOURLY : MAX_DAILY];
    /* what is counted */
    const qg_rules *rules;
    const qg_window_spec *w;
    int count_requests;         /* a request-unit window: admitted rows */
} buckets;

/* Bucket starts from the one holding from_ms to the one holding to_ms - 1;
 * start[n] is the end of the last.  0, or -1 when there would be more
 * than max. */
static int make_buckets(buckets *b, const qg_tz *tz, int daily,
                        int64_t from_ms, int64_t to_ms, int max)
{
    int64_t t, end;
    b->n = 0;
    if (daily) {
        if (day_bounds(tz, from_ms, &t, &end) < 0)
            return -1;
    } else {
        t = hour_floor(tz, from_ms);
    }
    while (t < to_ms) {
        if (b->n >= max)
            return -1;
        b->start[b->n] = t;
        b->weight_milli[b->n] = b->requests[b->n] = b->refused[b->n] = 0;
        b->n++;
        if (daily) {
            if (day_bounds(tz, t, &t, &end) < 0)
                return -1;
            t = end;
        } else {
            /* the next local hour: an hour later, to the hour again when
             * the offset changed by a part of an hour meanwhile */
            int64_t next = hour_floor(tz, t + HOUR_MS);
            t = next > t ? next : t + HOUR_MS;
        }
    }
    b->start[b->n] = t;
    return 0;
}

/* One rollup slot into its bucket, when the window counts its model. */
static int add_slot(const qg_usage_slot *sl, void *ud)
{
    buckets *b = ud;
    int lo = 0, hi = b->n - 1;
    int model = sl->model[0] ? qg_rules_find_model(b->rules, sl->model) : -1;
    if (!qg__window_applies(b->w, model))
        return 0;
    if (b->n == 0 || sl->start_ms < b->start[0] ||
        sl->start_ms >= b->start[b->n])
        return 0;
    while (lo < hi) {               /* the last bucket starting <= slot */
        int mid = (lo + hi + 1) / 2;
        if (b->start[mid] <= sl->start_ms)
            lo = mid;
        else
            hi = mid - 1;
    }
    b->weight_milli[lo] += b->count_requests ? sl->admitted * 1000
                                             : sl->weight_milli;
    b->requests[lo] += sl->requests;
    b->refused[lo] += sl->refused;
    return 0;
}

/* ------------------------------------------------------------- a call */

/* One history or requests read while the subject is resolved. */
typedef struct hist_call {
    qg_server *s;
    qg_http_req *r;
    int kind;
    int64_t now;
    char subject[256];
    qg_query q;
    qg_decision d;
} hist_call;

static const char *const history_params[] = {"window", "bucket", "from",
                                             "to"};
static const char *const requests_params[] = {"limit", "before"};

/* An instant parameter: 0 with *out, 1 when absent, -1 with msg. */
static int time_param(const qg_query *q, const char *key, int64_t *out,
                      char *msg, size_t cap)
{
    const char *v = qg__query_get(q, key);
    if (!v)
        return 1;
    if (qg_iso8601_parse(v, out) < 0 || *out < 0 || *out > QG_TIME_MAX_MS) {
        snprintf(msg, cap, "%s: \"%.64s\" is not an ISO 8601 instant (e.g. "
                 "2026-03-01T00:00:00Z; write a '+' of an offset as %%2B)",
                 key, v);
        return -1;
    }
    return 0;
}

/* The window named `name` among the subject's (its plan's, then its
 * org's: "org.NAME", as every answer names an org's window; a bare NAME
 * that no plan window has is looked up in the org too), or NULL. */
static const qg_window_spec *find_window(const qg_rules *r,
                                         const qg_decision *d,
                                         const char *name)
{
    int p = d->plan ? qg__rules_find_plan(r, d->plan) : -1;
    int o = d->org ? qg__rules_find_org(r, d->org) : -1;
    if (strncmp(name, "org.", 4) == 0) {
        p = -1;
        name += 4;
    }
    if (p >= 0)
        for (int i = 0; i < r->plans[p].nwindows; i++)
            if (strcmp(r->plans[p].windows[i].name, name) == 0)
                return &r->plans[p].windows[i];
    if (o >= 0)
        for (int i = 0; i < r->orgs[o].nwindows; i++)
            if (strcmp(r->orgs[o].windows[i].name, name) == 0)
                return &r->orgs[o].windows[i];
    return NULL;
}

static void window_names(const qg_decision *d, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->nviews && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                              d->views[i].name);
}

static void answer_history(hist_call *c)
{
    qg_server *s = c->s;
    /* the windows of the version in force now */
    const qg_rules *rules = qg_engine_rules_at(s->engine, c->now);
    const char *name = qg__query_get(&c->q, "window");
    const char *bucket = qg__query_get(&c->q, "bucket");
    const qg_window_spec *w;
    char msg[512], names[256];
    int64_t from = 0, to = c->now;
    int daily, rc, tr;
    buckets *b;
    qg__jb j;

    window_names(&c->d, names, sizeof names);
    if (!name || !*name) {
        snprintf(msg, sizeof msg, "window is required: one of %s", names);
        qg__reply_error(s, c->r, 400, "invalid_request", msg);
        return;
    }
    if (!(w = find_window(rules, &c->d, name))) {
        snprintf(msg, sizeof msg, "no window \"%.64s\" for this subject "
                 "(its windows: %s)", name, names);
        qg__reply_error(s, c->r, 404, "unknown_window", msg);
        return;
    }
    if (!bucket || strcmp(bucket, "1h") == 0) {
        daily = 0;
    } else if (strcmp(bucket, "1d") == 0) {
        daily = 1;
    } else {
        qg__reply_error(s, c->r, 400, "invalid_request",
                        "bucket must be 1h or 1d");
        return;
    }
    if ((tr = time_param(&c->q, "to", &to, msg, sizeof msg)) < 0 ||
        (rc = time_param(&c->q, "from", &from, msg, sizeof msg)) < 0) {
        qg__reply_error(s, c->r, 400, "invalid_request", msg);
        return;
    }
    if (rc == 1)                    /* from absent: a day of hours, or a
                                       month of days, before `to` */
        from = to - (daily ? 30 * DAY_MS : DAY_MS);
    if (from < 0)
        from = 0;
    if (from >= to) {
        qg__reply_error(s, c->r, 400, "invalid_request",
                        "from must be before to");
        return;
    }
    if (!(b = malloc(sizeof *b))) {
        qg__reply_error(s, c->r, 500, "internal_error", "out of memory");
        return;
    }
    b->rules = rules;
    b->w = w;
    b->count_requests = w->unit == QG_UNIT_REQUESTS ||
                        w->type == QG_WIN_CONCURRENCY;
    if (make_buckets(b, window_zone(w), daily, from, to,
                     daily ? MAX_DAILY : MAX_HOURLY) < 0) {
        snprintf(msg, sizeof msg, "the range from %s to %s is too long: at "
                 "most %d %s buckets", qg__query_get(&c->q, "from")
                 ? qg__query_get(&c->q, "from") : "(default)",
                 tr == 0 ? qg__query_get(&c->q, "to") : "now",
                 daily ? MAX_DAILY : MAX_HOURLY, daily ? "daily" : "hourly");
        qg__reply_error(s, c->r, 400, "invalid_request", msg);
        free(b);
        return;
    }
    rc = qg__ledger_slots(s->ledger, c->subject, b->start[0],
                          b->start[b->n], add_slot, b);
    if (rc != QG_OK) {
        qg_ledger_stats ls;
        qg__ledger_stats_get(s->ledger, &ls);
        snprintf(msg, sizeof msg, "the ledger cannot be read: %s",
                 ls.last_read_error[0] ? ls.last_read_error
                                       : qg_strerror(rc));
        qg__reply_error(s, c->r, 503, "ledger_unavailable", msg);
        free(b);
        return;
    }
    if (qg__jb_init(&j, 256 + 96 * (size_t)b->n) < 0) {
        qg__reply_error(s, c->r, 500, "internal_error", "out of memory");
        free(b);
        return;
    }
    QG__JB_LIT(&j, "{\"subject\":");
    qg__jb_str(&j, c->subject);
    QG__JB_LIT(&j, ",\"window\":");
    qg__jb_str(&j, w->name);
    QG__JB_LIT(&j, ",\"unit\":");
    qg__jb_str(&j, b->count_requests ? "requests" : rules->unit);
    QG__JB_LIT(&j, ",\"bucket_s\":");
    qg__jb_i64(&j, daily ? 86400 : 3600);
    QG__JB_LIT(&j, ",\"tz\":");
    qg__jb_str(&j, qg__tz_name(window_zone(w)));
    QG__JB_LIT(&j, ",\"limit\":");
    qg__jb_milli(&j, w->limit_milli);
    QG__JB_LIT(&j, ",\"from\":");
    qg__jb_time(&j, b->start[0]);
    QG__JB_LIT(&j, ",\"to\":");
    qg__jb_time(&j, b->start[b->n]);
    QG__JB_LIT(&j, ",\"buckets\":[");
    for (int i = 0; i < b->n; i++) {
        if (i)
            QG__JB_LIT(&j, ",");
        QG__JB_LIT(&j, "{\"start\":");
        qg__jb_time(&j, b->start[i]);
        QG__JB_LIT(&j, ",\"weight\":");
        qg__jb_milli(&j, b->weight_milli[i]);
        QG__JB_LIT(&j, ",\"requests\":");
        qg__jb_i64(&j, b->requests[i]);
        QG__JB_LIT(&j, ",\"refused\":");
        qg__jb_i64(&j, b->refused[i]);
        QG__JB_LIT(&j, "}");
    }
    QG__JB_LIT(&j, "]}");
    free(b);
    qg__reply_json(s, c->r, 200, qg__jb_finish(&j), NULL, 0);
}

/* ----------------------------------------------------------- requests */

static const char *const status_names[] = {
    "", "reserved", "completed", "cancelled", "failed", "rejected",
    "expired"};

typedef struct rows_out {
    qg__jb *j;
    int n;
    int64_t oldest_ms;
} rows_out;

static int row_text(const qg_ledger_row *r, void *ud)
{
    rows_out *o = ud;
    qg__jb *j = o->j;
    if (o->n)
        QG__JB_LIT(j, ",");
    QG__JB_LIT(j, "{\"time\":");
    qg__jb_time(j, r->created_ms);
    QG__JB_LIT(j, ",\"request_id\":");
    qg__jb_str(j, r->request_id);
    QG__JB_LIT(j, ",\"model\":");
    qg__jb_str(j, r->model[0] ? r->model : NULL);
    QG__JB_LIT(j, ",\"input_tokens\":");
    qg__jb_i64(j, r->input_tokens);
    QG__JB_LIT(j, ",\"output_tokens\":");
    qg__jb_i64(j, r->output_tokens);
    QG__JB_LIT(j, ",\"estimated\":");
    qg__jb_bool(j, r->estimated);
    QG__JB_LIT(j, ",\"weight\":");
    qg__jb_milli(j, r->weight_milli);
    QG__JB_LIT(j, ",\"reserved\":");
    qg__jb_milli(j, r->reserved_milli);
    QG__JB_LIT(j, ",\"decision\":");
    qg__jb_str(j, r->decision == 1 ? "allow" : "reject");
    QG__JB_LIT(j, ",\"retryable\":");
    qg__jb_bool(j, r->decision != 3);
    QG__JB_LIT(j, ",\"window\":");
    qg__jb_str(j, r->window[0] ? r->window : NULL);
    QG__JB_LIT(j, ",\"status\":");
    qg__jb_str(j, r->status >= 1 && r->status <= 6 ? status_names[r->status]
                                                   : "unknown");
    QG__JB_LIT(j, ",\"settled_at\":");
    qg__jb_time(j, r->settled_ms);
    QG__JB_LIT(j, ",\"plan\":");
    qg__jb_str(j, r->plan);
    QG__JB_LIT(j, ",\"rules_version\":");
    qg__jb_str(j, r->rules_version);
    if (r->overage_milli > 0) {
        QG__JB_LIT(j, ",\"overage_units\":");
        qg__jb_milli(j, r->overage_milli);
        QG__JB_LIT(j, ",\"overage_cost_usd\":");
        qg__jb_scaled(j, r->overage_cost_micro, 6);
    }
    QG__JB_LIT(j, "}");
    o->n++;
    o->oldest_ms = r->created_ms;
    return 0;
}

static void answer_requests(hist_call *c)
{
    qg_server *s = c->s;
    const char *lim = qg__query_get(&c->q, "limit");
    int64_t before = INT64_MAX;
    int limit = REQUESTS_DEFAULT, rc;
    char msg[320];
    rows_out o = {NULL, 0, 0};
    qg__jb j;

    if (lim) {
        char *end;
        long v = strtol(lim, &end, 10);
        if (!*lim || *end || v < 1 || v > REQUESTS_MAX) {
            snprintf(msg, sizeof msg, "limit must be a whole number from 1 "
                     "to %d", REQUESTS_MAX);
            qg__reply_error(s, c->r, 400, "invalid_request", msg);
            return;
        }
        limit = (int)v;
    }
    if (time_param(&c->q, "before", &before, msg, sizeof msg) < 0) {
        qg__reply_error(s, c->r, 400, "invalid_request", msg);
        return;
    }
    if (qg__jb_init(&j, 256 + 400 * (size_t)limit) < 0) {
        qg__reply_error(s, c->r, 500, "internal_error", "out of memory");
        return;
    }
    o.j = &j;
    QG__JB_LIT(&j, "{\"subject\":");
    qg__jb_str(&j, c->subject);
    QG__JB_LIT(&j, ",\"requests\":[");
    rc = qg__ledger_latest(s->ledger, c->subject, before, limit, row_text,
                           &o);
    if (rc != QG_OK) {
        qg_ledger_stats ls;
        free(qg__jb_finish(&j));
        qg__ledger_stats_get(s->ledger, &ls);
        snprintf(msg, sizeof msg, "the ledger cannot be read: %s",
                 ls.last_read_error[0] ? ls.last_read_error
                                       : qg_strerror(rc));
        qg__reply_error(s, c->r, 503, "ledger_unavailable", msg);
        return;
    }
    /* the next page: before the oldest row listed (null: no more) */
    QG__JB_LIT(&j, "],\"next_before\":");
    qg__jb_time(&j, o.n == limit ? o.oldest_ms : 0);
    QG__JB_LIT(&j, "}");
    qg__reply_json(s, c->r, 200, qg__jb_finish(&j), NULL, 0);
}

/* The subject resolved (history needs its windows). */
static void resolved(void *ud, int rc)
{
    hist_call *c = ud;
    char msg[320];
    if (rc == QG_ENOSUBJECT) {
        snprintf(msg, sizeof msg, "unknown subject \"%s\"", c->subject);
        qg__reply_error(c->s, c->r, 404, "unknown_subject", msg);
    } else if (rc != QG_OK) {
        qg__reply_engine_error(c->s, c->r, rc, qg_strerror(rc));
    } else {
        answer_history(c);
    }
    free(c);
}

void qg__h_usage_history(qg_server *s, qg_http_req *r, const char *subject,
                         int requests)
{
    hist_call *c;
    char msg[320];
    int rc;

    if (!(c = malloc(sizeof *c))) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    c->s = s;
    c->r = r;
    c->kind = requests ? KIND_REQUESTS : KIND_HISTORY;
    c->now = qg__server_now(s);
    qg__row_copy(c->subject, sizeof c->subject, subject);
    if (qg__query_parse(r->query, requests ? requests_params : history_params,
                        requests ? 2 : 4, &c->q, msg, sizeof msg) < 0) {
        qg__reply_error(s, r, 400, "invalid_request", msg);
        free(c);
        return;
    }
    if (requests) {
        answer_requests(c);
        free(c);
        return;
    }
    rc = qg_engine_usage_async(s->engine,
                               qg__gate_lane(s, r->worker,
                                             qg__http_req_base(r)),
                               c->subject, c->now, &c->d, resolved, c);
    if (rc != QG_PENDING)
        resolved(c, rc);
}

void qg__h_history(qg_server *s, qg_http_req *r, const char *caller)
{
    if (!caller) {
        qg__reply_error(s, r, 400, "invalid_request",
                        "the admin key names the subject: "
                        "/v1/usage/{subject}/history");
        return;
    }
    qg__h_usage_history(s, r, caller, 0);
}

void qg__h_requests(qg_server *s, qg_http_req *r, const char *caller)
{
    if (!caller) {
        qg__reply_error(s, r, 400, "invalid_request",
                        "the admin key names the subject: "
                        "/v1/usage/{subject}/requests");
        return;
    }
    qg__h_usage_history(s, r, caller, 1);
}
