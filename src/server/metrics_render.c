/* metrics_render.c - the Prometheus text of /metrics (metrics.h lists the
 * families): the counters of metrics.c and the gauges read at scrape time
 * from the store, the ledger, the HTTP server and the last rebuild. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fixed.h"
#include "metrics_internal.h"
#include "notify.h"

static const char *const outcome_names[NOUT] = {"allow", "reject",
                                                "reject_never"};

/* ----------------------------------------------------------- rendering */

static uint64_t load(_Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* A label value with \, " and newline escaped. */
static void put_label(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '"')
            fputs("\\\"", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

static void family(FILE *f, const char *name, const char *type,
                   const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* An unsigned value scaled by 10^digits, printed exactly. */
static void put_scaled(FILE *f, uint64_t v, int digits)
{
    char buf[48];
    if (v > (uint64_t)INT64_MAX)
        v = (uint64_t)INT64_MAX;
    qg_fixed_format((int64_t)v, digits, buf, sizeof buf);
    fputs(buf, f);
}

static void render_decisions(qg_metrics *m, FILE *f, uint64_t *total,
                             uint64_t *refused)
{
    family(f, "quotagate_decisions_total", "counter",
           "Decisions by plan, binding window (none for allows) and outcome.");
    for (int i = 0; i < m->nblocks; i++) {
        block *b = m->blocks[i];
        for (int j = 0; j < b->n; j++)
            for (int o = 0; o < NOUT; o++) {
                uint64_t v = load(&b->s[j]->n[o]);
                *total += v;
                if (o != QG_M_ALLOW)
                    *refused += v;
                if (v == 0 && !(b->s[j]->base & (1u << o)))
                    continue;
                fputs("quotagate_decisions_total{plan=\"", f);
                put_label(f, b->plan);
                fputs("\",window=\"", f);
                put_label(f, b->s[j]->window);
                fprintf(f, "\",outcome=\"%s\"} %llu\n", outcome_names[o],
                        (unsigned long long)v);
            }
    }
}

static const char *const anomaly_kind[QG_ANOMALY_COUNT] = {
    "output_over_max_tokens", "output_over_bound", "input_over_bound",
    "response_too_large"};

static void render_settles(qg_metrics *m, FILE *f)
{
    static const char *const st[4] = {"", "completed", "cancelled", "failed"};
    static const char *const dir[2] = {"over", "under"};

    family(f, "quotagate_settles_total", "counter",
           "Settles by status (replays not counted).");
    for (int i = 1; i < 4; i++)
        fprintf(f, "quotagate_settles_total{status=\"%s\"} %llu\n", st[i],
                (unsigned long long)load(&m->settles[i]));
    family(f, "quotagate_settle_mismatch_total", "counter",
           "Settles whose actual weight was above (over) or below (under) "
           "the reservation.");
    for (int i = 0; i < 2; i++)
        fprintf(f, "quotagate_settle_mismatch_total{direction=\"%s\"} %llu\n",
                dir[i], (unsigned long long)load(&m->mismatch[i]));
    family(f, "quotagate_settle_mismatch_weight_total", "counter",
           "Weight points between reservations and actual usage, by "
           "direction.");
    for (int i = 0; i < 2; i++) {
        fprintf(f, "quotagate_settle_mismatch_weight_total{direction=\"%s\"} ",
                dir[i]);
        put_scaled(f, load(&m->mismatch_milli[i]), 3);
        fputc('\n', f);
    }
    family(f, "quotagate_proxy_usage_anomalies_total", "counter",
           "Proxied calls charged other than the upstream reported: output "
           "above max_tokens, or a count above the bound.");
    for (int i = 0; i < QG_ANOMALY_COUNT; i++)
        fprintf(f, "quotagate_proxy_usage_anomalies_total{kind=\"%s\"} "
                "%llu\n", anomaly_kind[i],
                (unsigned long long)load(&m->anomaly[i]));
    family(f, "quotagate_overage_weight_total", "counter",
           "Weight points admitted beyond the limits under payg, as "
           "settled.");
    fputs("quotagate_overage_weight_total ", f);
    put_scaled(f, load(&m->overage_milli), 3);
    fputc('\n', f);
    family(f, "quotagate_overage_cost_usd_total", "counter",
           "What that overage costs, in US dollars, as settled.");
    fputs("quotagate_overage_cost_usd_total ", f);
    put_scaled(f, load(&m->overage_micro), 6);
    fputc('\n', f);
}

static void render_http(qg_metrics *m, FILE *f)
{
    family(f, "quotagate_http_requests_total", "counter",
           "HTTP responses by route and status code.");
    for (int r = 0; r < QG_ROUTE_COUNT; r++)
        for (int c = 0; c <= NCODES; c++) {
            uint64_t v = load(&m->http[r][c]);
            if (!v)
                continue;
            fprintf(f, "quotagate_http_requests_total{route=\"%s\",code=\"",
                    qg__route_label(r));
            if (c < NCODES)
                fprintf(f, "%d", qg__metrics_codes[c]);
            else
                fputs("other", f);
            fprintf(f, "\"} %llu\n", (unsigned long long)v);
        }
}

static void gauge_u(FILE *f, const char *name, const char *type,
                    const char *help, uint64_t v)
{
    family(f, name, type, help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void render_gauges(FILE *f, const qg_metrics_gauges *g)
{
    /* le bounds in microseconds, printed in seconds */
    static const uint64_t le_us[7] = {100,    1000,   5000,  10000,
                                      50000, 100000, 1000000};

    gauge_u(f, "quotagate_ledger_queue_depth", "gauge",
            "Ledger rows waiting to be committed.", g->ledger_queue_depth);
    gauge_u(f, "quotagate_ledger_commits_total", "counter",
            "Ledger transactions committed.", g->ledger_commits);
    gauge_u(f, "quotagate_ledger_rows_total", "counter",
            "Ledger rows written.", g->ledger_rows);
    gauge_u(f, "quotagate_ledger_write_errors_total", "counter",
            "Ledger transactions that failed (their settles answered 503).",
            g->ledger_write_errors);
    gauge_u(f, "quotagate_ledger_rows_retried_total", "counter",
            "Ledger rows put back to be written again after a failed "
            "transaction.", g->ledger_rows_retried);
    gauge_u(f, "quotagate_ledger_rows_lost_total", "counter",
            "Ledger rows given up (still failing at shutdown, or no memory "
            "to keep them).", g->ledger_rows_lost);
    gauge_u(f, "quotagate_ledger_rows_refused_total", "counter",
            "Ledger rows not written because their request id holds "
            "another request's row.", g->ledger_rows_refused);
    gauge_u(f, "quotagate_ledger_id_filter_ids", "gauge",
            "Request ids in the ledger's id filter (new ids it answers "
            "without a read).", g->ledger_id_filter_ids);
    gauge_u(f, "quotagate_ledger_id_filter_levels", "gauge",
            "Levels of the id filter: it grows with the ledger.",
            g->ledger_id_filter_levels);
    gauge_u(f, "quotagate_ledger_id_filter_bytes", "gauge",
            "Memory of the id filter.", g->ledger_id_filter_bytes);
    if (g->ledger_cache_bytes >= 0)
        gauge_u(f, "quotagate_ledger_page_cache_bytes", "gauge",
                "The most the SQLite ledger writer's page cache holds now "
                "(it grows while rows read pages from the file, up to "
                "--ledger-cache, and shrinks when they read almost "
                "none).", (uint64_t)g->ledger_cache_bytes);
    gauge_u(f, "quotagate_ledger_id_reads_total", "counter",
            "Lookups by request id the id filter could not answer (read "
            "from the ledger's database).", g->ledger_id_reads);
    gauge_u(f, "quotagate_ledger_up", "gauge",
            "1 when the last ledger transaction succeeded, 0 while they "
            "fail.", (uint64_t)g->ledger_up);
    gauge_u(f, "quotagate_ledger_spool_rows", "gauge",
            "Ledger rows waiting in the spool for the database.",
            g->ledger_spool_rows);
    gauge_u(f, "quotagate_ledger_rows_spooled_total", "counter",
            "Ledger rows written to the spool while the database could not "
            "be reached.", g->ledger_rows_spooled);
    gauge_u(f, "quotagate_ledger_rows_replayed_total", "counter",
            "Spooled ledger rows written to the database.",
            g->ledger_rows_replayed);
    family(f, "quotagate_ledger_commit_seconds", "histogram",
           "Ledger commit latency.");
    for (int i = 0; i < 7; i++) {
        fputs("quotagate_ledger_commit_seconds_bucket{le=\"", f);
        put_scaled(f, le_us[i], 6);
        fprintf(f, "\"} %llu\n", (unsigned long long)g->ledger_commit_le[i]);
    }
    fprintf(f, "quotagate_ledger_commit_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)g->ledger_commit_le[7]);
    fputs("quotagate_ledger_commit_seconds_sum ", f);
    put_scaled(f, g->ledger_commit_us_sum, 6);
    fprintf(f, "\nquotagate_ledger_commit_seconds_count %llu\n",
            (unsigned long long)g->ledger_commit_le[7]);
    family(f, "quotagate_rebuild_seconds", "gauge",
           "How long the last rebuild of the counters from the ledger took.");
    fputs("quotagate_rebuild_seconds ", f);
    put_scaled(f, g->rebuild_ms > 0 ? (uint64_t)g->rebuild_ms : 0, 3);
    fputc('\n', f);
    gauge_u(f, "quotagate_rebuild_rows", "gauge",
            "Ledger rows replayed by the last rebuild.", g->rebuild_rows);
    family(f, "quotagate_rebuild_rows_out_of_bounds", "gauge",
           "Rows of the last rebuild with amounts beyond the bounds: "
           "clamped to them, or skipped.");
    fprintf(f, "quotagate_rebuild_rows_out_of_bounds{action=\"clamped\"} "
            "%llu\n", (unsigned long long)g->rebuild_clamped);
    fprintf(f, "quotagate_rebuild_rows_out_of_bounds{action=\"skipped\"} "
            "%llu\n", (unsigned long long)g->rebuild_skipped);
    gauge_u(f, "quotagate_store_subjects", "gauge",
            "Members and organisations with counter state.",
            g->store_subjects);
    gauge_u(f, "quotagate_store_bytes", "gauge",
            "Heap bytes held by the counter store.", g->store_bytes);
    gauge_u(f, "quotagate_store_up", "gauge",
            "1 while the counters' store answers; 0 while decisions are "
            "local (store.down: local) or refused (closed).",
            (uint64_t)g->store_up);
    gauge_u(f, "quotagate_fallback_decisions_total", "counter",
            "Decisions made locally while the counters' store was down.",
            g->fallback_decisions);
    gauge_u(f, "quotagate_fallback_pending", "gauge",
            "Requests admitted locally and not yet charged into the store.",
            g->fallback_pending);
    gauge_u(f, "quotagate_reconcile_runs_total", "counter",
            "Reconciliations of the counters against the ledger run "
            "(periodic and admin API).", g->reconcile_runs);
    gauge_u(f, "quotagate_reconcile_drifted_windows", "gauge",
            "Windows whose drift passed the tolerance at the last "
            "reconciliation.", g->reconcile_drifted);
    family(f, "quotagate_reconcile_max_drift", "gauge",
           "The largest |store - ledger| of a drifted window at the last "
           "reconciliation, in its unit.");
    fputs("quotagate_reconcile_max_drift ", f);
    put_scaled(f, g->reconcile_max_drift_milli > 0
                      ? (uint64_t)g->reconcile_max_drift_milli : 0, 3);
    fputc('\n', f);
    if (!g->store_remote)
        return;
    gauge_u(f, "quotagate_store_round_trips_total", "counter",
            "Times the Redis store waited for replies (one per decision "
            "when nothing is retried).", g->redis.round_trips);
    gauge_u(f, "quotagate_store_commands_total", "counter",
            "Commands sent to Redis.", g->redis.commands);
    gauge_u(f, "quotagate_store_script_loads_total", "counter",
            "SCRIPT LOAD sent after Redis answered NOSCRIPT.",
            g->redis.script_loads);
    gauge_u(f, "quotagate_store_libraries_deleted_total", "counter",
            "Function libraries of other rules versions deleted from Redis "
            "nodes, none loaded there within the keep (a day by default).",
            g->redis.libraries_deleted);
    gauge_u(f, "quotagate_store_voids_total", "counter",
            "Admissions taken back (a request id already answered under "
            "another tag, or a loss of the store's data noticed).",
            g->redis.voids);
    gauge_u(f, "quotagate_store_lookups_total", "counter",
            "Request ids answered from another hash tag.", g->redis.lookups);
    gauge_u(f, "quotagate_store_period_retries_total", "counter",
            "Calls sent again with a calendar period recomputed.",
            g->redis.period_retries);
}

/* The HTTP layer's connection counts.  Families and reason labels come
 * from qg_http_drop_names (the reasons of one family are adjacent). */
static void render_connections(FILE *f, const qg_http_stats *h)
{
    static const struct { const char *kind, *help; } fam[] = {
        { "shed", "Connections closed to make room for a new one: idle "
                  "(between keep-alive requests) or slow (an unfinished "
                  "request, the oldest first)." },
        { "refused", "New connections closed at once with nothing to shed: "
                     "the server full (capacity) or the client address at "
                     "its limit (per_client)." },
        { "timed_out", "Connections closed at a deadline: head and body "
                       "(answered 408), idle keep-alive, write (the client "
                       "did not read)." },
    };
    char name[96];
    gauge_u(f, "quotagate_http_connections_open", "gauge",
            "Client connections open.", h->connections_open);
    gauge_u(f, "quotagate_http_connections_max", "gauge",
            "Client connections the server holds at most.",
            h->max_connections);
    gauge_u(f, "quotagate_http_connections_per_client_max", "gauge",
            "Connections one client address may hold (0: no limit).",
            h->max_conns_per_client);
    gauge_u(f, "quotagate_http_connections_accepted_total", "counter",
            "Client connections accepted.", h->connections_total);
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        snprintf(name, sizeof name, "quotagate_http_connections_%s_total",
                 fam[k].kind);
        family(f, name, "counter", fam[k].help);
        for (int d = 0; d < QG_HTTP_DROP_COUNT; d++)
            if (strcmp(qg_http_drop_names[d].kind, fam[k].kind) == 0)
                fprintf(f, "%s{reason=\"%s\"} %llu\n", name,
                        qg_http_drop_names[d].reason,
                        (unsigned long long)h->drops[d]);
    }
}

/* Notifications (notify.h; docs/operations.md, "Webhooks"). */
static void render_notify(FILE *f, const qg__notify_stats *n, int64_t now_ms)
{
    static const char *const outcomes[] = {"delivered", "rejected",
                                           "unreachable", "expired"};
    const uint64_t counts[] = {n->delivered, n->rejected, n->unreachable,
                               n->expired};
    family(f, "quotagate_webhook_deliveries_total", "counter",
           "Webhook attempts by outcome: delivered (2xx), rejected (another "
           "status), unreachable (no answer in time), expired (given up "
           "after 24 hours).");
    for (size_t i = 0; i < sizeof outcomes / sizeof outcomes[0]; i++)
        fprintf(f, "quotagate_webhook_deliveries_total{outcome=\"%s\"} "
                "%llu\n", outcomes[i], (unsigned long long)counts[i]);
    gauge_u(f, "quotagate_webhook_events_total", "counter",
            "Notification events this instance created in the outbox.",
            n->events);
    gauge_u(f, "quotagate_webhook_dropped_total", "counter",
            "Crossings not queued because the notifications' queue was "
            "full (queued again at the subject's next decision).",
            n->dropped);
    gauge_u(f, "quotagate_webhook_backlog", "gauge",
            "Webhook deliveries pending in the outbox.",
            n->backlog > 0 ? (uint64_t)n->backlog : 0);
    family(f, "quotagate_webhook_oldest_pending_seconds", "gauge",
           "Age of the oldest pending webhook delivery (0: none).");
    fputs("quotagate_webhook_oldest_pending_seconds ", f);
    put_scaled(f, n->oldest_ms > 0 && now_ms > n->oldest_ms
                      ? (uint64_t)(now_ms - n->oldest_ms) : 0, 3);
    fputc('\n', f);
}

char *qg__metrics_render(qg_metrics *m, const qg_metrics_gauges *g)
{
    char *text = NULL;
    size_t len = 0;
    uint64_t total = 0, refused = 0;
    FILE *f = open_memstream(&text, &len);

    if (!f)
        return NULL;
    pthread_mutex_lock(&m->lock);
    const table *t = atomic_load_explicit(&m->cur, memory_order_acquire);
    render_decisions(m, f, &total, &refused);
    render_settles(m, f);
    render_http(m, f);
    if (g)
        render_gauges(f, g);
    if (g && g->http)
        render_connections(f, g->http);
    if (g && g->notify)
        render_notify(f, g->notify, g->now_ms);
    gauge_u(f, "quotagate_up", "gauge", "1 while the gateway serves.", 1);
    family(f, "quotagate_rules_info", "gauge",
           "The rules and weights versions in force.");
    fputs("quotagate_rules_info{rules_version=\"", f);
    put_label(f, g && g->rules_version ? g->rules_version : t->rules_version);
    fputs("\",weights_version=\"", f);
    put_label(f, g && g->weights_version ? g->weights_version
                                         : t->weights_version);
    fputs("\"} 1\n", f);
    pthread_mutex_unlock(&m->lock);

    /* refusals / decisions, six exact decimals */
    family(f, "quotagate_refusal_ratio", "gauge",
           "Refused decisions over all decisions since start.");
    fputs("quotagate_refusal_ratio ", f);
    put_scaled(f, total ? (uint64_t)((unsigned __int128)refused * 1000000u /
                                     total)
                        : 0,
               6);
    fputc('\n', f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
