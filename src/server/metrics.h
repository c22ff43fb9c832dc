/* metrics.h - the /metrics registry, rendered in Prometheus text format.
 *
 * Counters the server bumps on its hot paths, plus gauges it reads from
 * the ledger and the store at scrape time and passes in:
 *
 *   quotagate_decisions_total{plan,window,outcome}  outcome allow | reject |
 *       reject_never; window = the binding window's name, "none" on allows
 *   quotagate_settles_total{status}
 *   quotagate_settle_mismatch_total{direction="over"|"under"}  settles whose
 *       actual weight was above / below the reservation
 *   quotagate_settle_mismatch_weight_total{direction}  points of those gaps
 *   quotagate_proxy_usage_anomalies_total{kind}  proxied calls charged
 *       other than the upstream reported (docs/proxy.md): kind
 *       output_over_max_tokens | output_over_bound | input_over_bound |
 *       response_too_large (usage unread: charged the reservation)
 *   quotagate_http_requests_total{route,code}
 *   quotagate_refusal_ratio  refusals / decisions since start
 *   quotagate_ledger_queue_depth, quotagate_ledger_commits_total,
 *   quotagate_ledger_rows_total, quotagate_ledger_commit_seconds (histogram),
 *   quotagate_ledger_write_errors_total (failed transactions),
 *   quotagate_ledger_rows_retried_total, quotagate_ledger_rows_lost_total,
 *   quotagate_ledger_rows_refused_total (a reused request id),
 *   quotagate_ledger_up (0 while writes fail),
 *   quotagate_ledger_spool_rows, quotagate_ledger_rows_spooled_total,
 *   quotagate_ledger_rows_replayed_total (a shared ledger's spool),
 *   quotagate_ledger_id_filter_ids, quotagate_ledger_id_filter_levels,
 *   quotagate_ledger_id_filter_bytes (the request id filter, idfilter.h),
 *   quotagate_ledger_page_cache_bytes (SQLite: the writer's page cache,
 *   which grows; not printed for PostgreSQL),
 *   quotagate_ledger_id_reads_total (lookups it could not answer),
 *   quotagate_rebuild_seconds, quotagate_rebuild_rows,
 *   quotagate_rebuild_rows_out_of_bounds{action="clamped"|"skipped"},
 *   quotagate_store_subjects, quotagate_store_bytes, quotagate_store_up,
 *   quotagate_fallback_decisions_total, quotagate_fallback_pending,
 *   quotagate_reconcile_runs_total, quotagate_reconcile_drifted_windows,
 *   quotagate_reconcile_max_drift (the last run's, docs/reconcile.md),
 *   on a Redis store only: quotagate_store_round_trips_total (waits for
 *       replies), quotagate_store_commands_total (commands sent),
 *       quotagate_store_script_loads_total (after NOSCRIPT),
 *       quotagate_store_voids_total, quotagate_store_lookups_total,
 *       quotagate_store_period_retries_total (qg_redis_counters),
 *   quotagate_up,
 *   quotagate_rules_info{rules_version,weights_version}
 *   quotagate_http_connections_open, quotagate_http_connections_max,
 *   quotagate_http_connections_per_client_max (0: no limit),
 *   quotagate_http_connections_accepted_total,
 *   quotagate_http_connections_{shed,refused,timed_out}_total{reason}:
 *       families and reasons from the HTTP layer's qg_http_drop_names
 *
 * The decision counter is on every request's path, so it is an array of
 * relaxed atomics indexed by small integers: plan index and window id,
 * where window ids number the distinct window names of the rules (member
 * and org windows alike), assigned when the rules are loaded.  Use
 * qg__metrics_view_window() to turn a decision's binding view into its id
 * (an array lookup), or qg__metrics_record() which does it all from a
 * qg_decision (pointer comparisons of names owned by the rules, falling
 * back to strcmp when the decision was made with other rules).
 *
 * Reloads: qg__metrics_rules() builds new index tables that point at the
 * same counters for the same (plan, window) names, so counters never go
 * backwards and series of plans or windows that disappeared keep their
 * values.  The new table is published with one atomic store; replaced
 * tables stay allocated until qg__metrics_free (a reload is rare, a table
 * small), so a thread still counting through the old one is safe.  An
 * index taken from the old rules and used after the swap is bounds-checked
 * and may count under the new rules' name at that index: the price of a
 * lock-free hot path during the instant of a reload.
 *
 * Thread-safety: qg__metrics_decision / _settle / _http / _record are safe
 * from any thread at any time; qg__metrics_rules and qg__metrics_render
 * serialise on an internal mutex. */
#ifndef QG_METRICS_H
#define QG_METRICS_H

#include <stdint.h>
#include "http.h"
#include "charge.h"
#include "quotagate.h"
#include "routes.h"
#include "rules.h"

typedef struct qg_metrics qg_metrics;

enum { QG_M_ALLOW = 0, QG_M_REJECT = 1, QG_M_REJECT_NEVER = 2 };

/* Routes: the groups of routes.h. */

/* Values read at scrape time from the ledger, the store and the last
 * rebuild.  Histogram buckets are cumulative counts of commits that took
 * at most 100us, 1ms, 5ms, 10ms, 50ms, 100ms, 1s, +Inf (the last is the
 * count), as qg_ledger_stats keeps them. */
typedef struct qg_metrics_gauges {
    uint64_t ledger_queue_depth;
    uint64_t ledger_commits;
    uint64_t ledger_rows;
    uint64_t ledger_commit_us_sum;
    uint64_t ledger_commit_le[8];
    uint64_t ledger_write_errors;   /* failed transactions */
    uint64_t ledger_rows_retried;   /* rows put back after one */
    uint64_t ledger_rows_lost;      /* rows given up */
    uint64_t ledger_rows_refused;   /* rows kept out by the ledger's guards */
    int ledger_up;                  /* the last transaction succeeded */
    uint64_t ledger_spool_rows;     /* rows waiting in the spool */
    uint64_t ledger_rows_spooled;   /* rows written to the spool */
    uint64_t ledger_rows_replayed;  /* spooled rows written to the database */
    uint64_t ledger_id_filter_ids;  /* request ids in the id filter */
    uint64_t ledger_id_filter_levels;
    uint64_t ledger_id_filter_bytes;
    uint64_t ledger_id_reads;       /* lookups by id sent to the database */
    int64_t ledger_cache_bytes;     /* SQLite writer's page cache; -1 none */
    int64_t rebuild_ms;             /* how long the last rebuild took */
    uint64_t rebuild_rows;          /* rows it replayed */
    uint64_t rebuild_clamped;       /* rows with amounts over the bounds */
    uint64_t rebuild_skipped;       /* rows it could not use */
    uint64_t store_subjects;
    uint64_t store_bytes;
    int store_up;                   /* the store answers (1 for memory) */
    uint64_t fallback_decisions;    /* decided locally, store down */
    uint64_t fallback_pending;      /* admitted locally, not charged back */
    uint64_t reconcile_runs;        /* reconciliations run (reconcile.md) */
    uint64_t reconcile_drifted;     /* windows drifted at the last run */
    int64_t reconcile_max_drift_milli; /* its largest |drift| */
    int store_remote;               /* a Redis store: redis below is shown */
    qg_redis_counters redis;
    const qg_http_stats *http;      /* connections; NULL: not shown */
    const char *rules_version;      /* NULL: taken from the current rules */
    const char *weights_version;
    /* notifications (notify.h): quotagate_webhook_deliveries_total
     * {outcome}, quotagate_webhook_events_total,
     * quotagate_webhook_dropped_total, quotagate_webhook_backlog,
     * quotagate_webhook_oldest_pending_seconds; NULL: not shown */
    const struct qg__notify_stats *notify;
    int64_t now_ms;                 /* for the oldest pending's age */
} qg_metrics_gauges;

/* A registry sized for rules r (borrowed only during the call).  Returns
 * NULL on out of memory.  Free with qg__metrics_free. */
qg_metrics *qg__metrics_new(const qg_rules *r);
void qg__metrics_free(qg_metrics *m);

/* Switch to new rules (borrowed during the call), keeping every count.
 * Returns 0 or QG_ENOMEM (the old tables stay in use). */
int qg__metrics_rules(qg_metrics *m, const qg_rules *r);

/* Window id of view `view` of a decision for plan_index / org_index (-1
 * none): views are the plan's windows in order, then the org's.  -1 when
 * out of range.  O(1). */
int qg__metrics_view_window(const qg_metrics *m, int plan_index, int org_index,
                           int view);

/* Count one decision: outcome QG_M_*, window_id from the function above
 * or -1 ("none").  Out-of-range arguments are ignored.  Lock-free. */
void qg__metrics_decision(qg_metrics *m, int plan_index, int window_id,
                         int outcome);

/* Count decision d (plan and org found by their names' pointers, the
 * binding view turned into its window id).  QG_NONE is ignored. */
void qg__metrics_record(qg_metrics *m, const qg_decision *d);

/* Count a settle: its status and any gap between reserved and actual.
 * Replayed settles are not counted again. */
void qg__metrics_settle(qg_metrics *m, const qg_settle_result *s);

/* The proxy charged other than the upstream reported (docs/proxy.md,
 * "Usage beyond what was allowed"). */
/* the kinds are the proxy's (charge.h) */
void qg__metrics_usage_anomaly(qg_metrics *m, qg__anomaly kind);

/* Count an HTTP response on route (qg_metrics_route) with status code. */
void qg__metrics_http(qg_metrics *m, int route, int code);

/* The exposition text (# HELP / # TYPE and samples), malloc'd; the caller
 * frees it.  g may be NULL (gauges then absent, except up and the
 * rules info).  NULL on out of memory. */
char *qg__metrics_render(qg_metrics *m, const qg_metrics_gauges *g);

#endif
