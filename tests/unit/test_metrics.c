/* test_metrics.c - the /metrics registry (src/server/metrics.c).
 *
 * Counts decisions, settles and HTTP responses, renders, and checks the
 * exact sample lines; the whole text is also given to `promtool check
 * metrics` when promtool is installed (it must print nothing and exit 0).
 * A rules swap that renames, adds and drops plans and windows must keep
 * every count: counters never go backwards.  Threads count concurrently
 * while a swap happens, and no increment may be lost. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "metrics.h"
#include "routes.h"
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"

static const char rules_a[] =
    "version: \"m1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "plans:\n"
    "  free:\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 50 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 400 }\n"
    "    concurrency: 2\n"
    "  pro:\n"
    "    windows:\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 900 }\n"
    "orgs:\n"
    "  acme: { windows: [ { name: monthly, type: calendar, every: month, anchor: billing, limit: 100000 } ] }\n"
    "default_plan: free\n";

/* Reordered plans and windows, one plan gone, one new, a new window. */
static const char rules_b[] =
    "version: \"m2 \\\"quoted\\\"\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w2\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "plans:\n"
    "  team:\n"
    "    windows:\n"
    "      - { name: daily, type: calendar, every: day, at: \"00:00\", tz: \"UTC\", limit: 10 }\n"
    "  free:\n"
    "    windows:\n"
    "      - { name: hourly, type: rolling, length: 1h, limit: 5 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 400 }\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 50 }\n"
    "orgs:\n"
    "  acme: { windows: [ { name: monthly, type: calendar, every: month, anchor: billing, limit: 100000 } ] }\n"
    "default_plan: free\n";

static qg_rules *load(const char *text)
{
    qg_rules *r = NULL;
    qg_diag diag;
    char err[300];
    if (qg__rules_parse(text, strlen(text), "test", qg__tz_load_system, NULL,
                       &r, &diag) != 0) {
        qg__diag_format(&diag, err, sizeof err);
        fail_msg("rules: %s", err);
    }
    return r;
}

/* The value of the sample line that starts with `series ` (-1: absent). */
static long long sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return atoll(p + n + 1);
    return -1;
}

static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

/* Run promtool over text when it is installed: no output, exit 0. */
static void promtool_check(const char *text)
{
    char path[] = "/tmp/qg_metrics_XXXXXX", cmd[256], out[4096] = "";
    if (access("/usr/bin/promtool", X_OK) != 0) {
        fprintf(stderr, "promtool not installed: skipped\n");
        return;
    }
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < %s 2>&1",
             path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    unlink(path);
    if (rc != 0 || n != 0)
        fail_msg("promtool (rc %d): %s\n%s", rc, out, text);
}

static qg_metrics_gauges gauges(void)
{
    qg_metrics_gauges g;
    memset(&g, 0, sizeof g);
    g.ledger_queue_depth = 3;
    g.ledger_commits = 40;
    g.ledger_rows = 1200;
    g.ledger_commit_us_sum = 123456;
    const uint64_t le[8] = {5, 20, 35, 38, 40, 40, 40, 40};
    memcpy(g.ledger_commit_le, le, sizeof le);
    g.rebuild_ms = 1250;
    g.rebuild_rows = 1000;
    g.store_subjects = 7;
    g.store_bytes = 65536;
    return g;
}

static void test_render(void **state)
{
    qg_rules *r = load(rules_a);
    qg_metrics *m = qg__metrics_new(r);
    qg_metrics_gauges g = gauges();
    (void)state;
    assert_non_null(m);

    /* plan free = 0: views burst_5h, weekly, concurrency, then acme's */
    int weekly = qg__metrics_view_window(m, 0, 0, 1);
    int monthly = qg__metrics_view_window(m, 0, 0, 3);
    assert_true(weekly >= 0 && monthly >= 0 && weekly != monthly);
    assert_int_equal(qg__metrics_view_window(m, 0, -1, 3), -1);
    assert_int_equal(qg__metrics_view_window(m, 0, 0, 4), -1);
    assert_int_equal(qg__metrics_view_window(m, 9, 0, 0), -1);
    /* the same name in another plan has the same id */
    assert_int_equal(qg__metrics_view_window(m, 1, -1, 0), weekly);

    for (int i = 0; i < 5; i++)
        qg__metrics_decision(m, 0, -1, QG_M_ALLOW);
    qg__metrics_decision(m, 0, weekly, QG_M_REJECT);
    qg__metrics_decision(m, 0, monthly, QG_M_REJECT);
    qg__metrics_decision(m, 0, 0, QG_M_REJECT_NEVER);
    qg__metrics_decision(m, 7, 0, QG_M_ALLOW);   /* ignored */
    qg__metrics_decision(m, 0, 99, QG_M_ALLOW);  /* ignored */

    qg_decision d;
    memset(&d, 0, sizeof d);
    d.outcome = QG_REJECT;
    d.plan = r->plans[1].name;
    d.binding = 0;
    qg__metrics_record(m, &d);
    d.outcome = QG_ALLOW;
    d.plan = "pro"; /* another pointer: found by name */
    qg__metrics_record(m, &d);
    d.plan = "nosuch";
    qg__metrics_record(m, &d);

    qg_settle_result s = {0, 0, 16500, 2250, 2250, 0, QG_SETTLE_COMPLETED,
                          0, 0};
    qg__metrics_settle(m, &s);
    s.actual_milli = 20000;
    s.status = QG_SETTLE_FAILED;
    qg__metrics_settle(m, &s);
    s.actual_milli = 16500;
    qg__metrics_settle(m, &s);
    s.replayed = 1;
    qg__metrics_settle(m, &s);

    qg__metrics_http(m, QG_ROUTE_CHECK, 200);
    qg__metrics_http(m, QG_ROUTE_CHECK, 200);
    qg__metrics_http(m, QG_ROUTE_CHECK, 429);
    qg__metrics_http(m, QG_ROUTE_USAGE, 418);
    qg__metrics_http(m, 99, 404);

    /* connections: every reason of the HTTP layer's table, in its family */
    qg_http_stats hs;
    memset(&hs, 0, sizeof hs);
    hs.connections_open = 12;
    hs.connections_total = 345;
    hs.max_connections = 1000;
    hs.max_conns_per_client = 500;
    for (int i = 0; i < QG_HTTP_DROP_COUNT; i++)
        hs.drops[i] = (uint64_t)(i + 1) * 10;
    g.http = &hs;

    char *t = qg__metrics_render(m, &g);
    assert_non_null(t);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"none\",outcome=\"allow\"}"), 5);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"weekly\",outcome=\"reject\"}"), 1);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"monthly\",outcome=\"reject\"}"), 1);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"burst_5h\",outcome=\"reject_never\"}"), 1);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"concurrency\",outcome=\"reject\"}"), 0);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"pro\",window=\"weekly\",outcome=\"reject\"}"), 1);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"pro\",window=\"none\",outcome=\"allow\"}"), 1);
    /* a zero series outside the plan's own windows is not shown */
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"pro\",window=\"burst_5h\",outcome=\"reject\"}"), -1);
    assert_true(has_line(t, "quotagate_settles_total{status=\"completed\"} 1"));
    assert_true(has_line(t, "quotagate_settles_total{status=\"failed\"} 2"));
    assert_true(has_line(t, "quotagate_settles_total{status=\"cancelled\"} 0"));
    assert_true(has_line(t, "quotagate_settle_mismatch_total{direction=\"over\"} 1"));
    assert_true(has_line(t, "quotagate_settle_mismatch_total{direction=\"under\"} 1"));
    assert_true(has_line(t, "quotagate_settle_mismatch_weight_total{direction=\"over\"} 3.5"));
    assert_true(has_line(t, "quotagate_settle_mismatch_weight_total{direction=\"under\"} 14.25"));
    assert_true(has_line(t, "quotagate_http_requests_total{route=\"check\",code=\"200\"} 2"));
    assert_true(has_line(t, "quotagate_http_requests_total{route=\"check\",code=\"429\"} 1"));
    assert_true(has_line(t, "quotagate_http_requests_total{route=\"usage\",code=\"other\"} 1"));
    assert_true(has_line(t, "quotagate_http_requests_total{route=\"other\",code=\"404\"} 1"));
    assert_true(has_line(t, "quotagate_ledger_queue_depth 3"));
    assert_true(has_line(t, "quotagate_ledger_commits_total 40"));
    assert_true(has_line(t, "quotagate_ledger_rows_total 1200"));
    assert_true(has_line(t, "quotagate_ledger_commit_seconds_bucket{le=\"0.0001\"} 5"));
    assert_true(has_line(t, "quotagate_ledger_commit_seconds_bucket{le=\"0.005\"} 35"));
    assert_true(has_line(t, "quotagate_ledger_commit_seconds_bucket{le=\"1\"} 40"));
    assert_true(has_line(t, "quotagate_ledger_commit_seconds_bucket{le=\"+Inf\"} 40"));
    assert_true(has_line(t, "quotagate_ledger_commit_seconds_sum 0.123456"));
    assert_true(has_line(t, "quotagate_ledger_commit_seconds_count 40"));
    assert_true(has_line(t, "quotagate_rebuild_seconds 1.25"));
    assert_true(has_line(t, "quotagate_rebuild_rows 1000"));
    assert_true(has_line(t, "quotagate_store_subjects 7"));
    assert_true(has_line(t, "quotagate_store_bytes 65536"));
    assert_true(has_line(t, "quotagate_up 1"));
    assert_true(has_line(t, "quotagate_rules_info{rules_version=\"m1\",weights_version=\"w1\"} 1"));
    /* 4 refusals of 10 decisions */
    assert_true(has_line(t, "quotagate_refusal_ratio 0.4"));
    assert_true(has_line(t, "# TYPE quotagate_ledger_commit_seconds histogram"));
    assert_true(has_line(t, "# TYPE quotagate_decisions_total counter"));
    assert_true(has_line(t, "quotagate_http_connections_open 12"));
    assert_true(has_line(t, "quotagate_http_connections_max 1000"));
    assert_true(has_line(t, "quotagate_http_connections_per_client_max 500"));
    assert_true(has_line(t, "quotagate_http_connections_accepted_total 345"));
    assert_true(has_line(t, "quotagate_http_connections_shed_total{reason=\"idle\"} 10"));
    assert_true(has_line(t, "quotagate_http_connections_shed_total{reason=\"slow\"} 20"));
    assert_true(has_line(t, "quotagate_http_connections_refused_total{reason=\"capacity\"} 30"));
    assert_true(has_line(t, "quotagate_http_connections_refused_total{reason=\"per_client\"} 40"));
    assert_true(has_line(t, "quotagate_http_connections_timed_out_total{reason=\"head\"} 50"));
    assert_true(has_line(t, "quotagate_http_connections_timed_out_total{reason=\"body\"} 60"));
    assert_true(has_line(t, "quotagate_http_connections_timed_out_total{reason=\"idle\"} 70"));
    assert_true(has_line(t, "quotagate_http_connections_timed_out_total{reason=\"write\"} 80"));
    for (int i = 0; i < QG_HTTP_DROP_COUNT; i++) {
        char line[160];
        snprintf(line, sizeof line, "quotagate_http_connections_%s_total{"
                 "reason=\"%s\"} %d", qg_http_drop_names[i].kind,
                 qg_http_drop_names[i].reason, (i + 1) * 10);
        assert_true(has_line(t, line));
    }
    promtool_check(t);
    free(t);

    /* without gauges: the counters, up, the rules info and the ratio */
    t = qg__metrics_render(m, NULL);
    assert_non_null(t);
    assert_null(strstr(t, "quotagate_ledger"));
    assert_true(has_line(t, "quotagate_up 1"));
    promtool_check(t);
    free(t);
    qg__metrics_free(m);
    qg_rules_free(r);
}

static void test_empty(void **state)
{
    qg_rules *r = load(rules_a);
    qg_metrics *m = qg__metrics_new(r);
    qg_metrics_gauges g = gauges();
    (void)state;
    char *t = qg__metrics_render(m, &g);
    assert_true(has_line(t, "quotagate_refusal_ratio 0"));
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"none\",outcome=\"allow\"}"), 0);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"weekly\",outcome=\"reject_never\"}"), 0);
    promtool_check(t);
    free(t);
    qg__metrics_free(m);
    qg_rules_free(r);
}

static void test_rules_swap(void **state)
{
    qg_rules *a = load(rules_a), *b = load(rules_b);
    qg_metrics *m = qg__metrics_new(a);
    (void)state;

    int weekly_a = qg__metrics_view_window(m, 0, -1, 1);
    qg__metrics_decision(m, 0, weekly_a, QG_M_REJECT);
    qg__metrics_decision(m, 0, weekly_a, QG_M_REJECT);
    qg__metrics_decision(m, 0, -1, QG_M_ALLOW);
    qg__metrics_decision(m, 1, -1, QG_M_ALLOW); /* pro, gone in b */

    assert_int_equal(qg__metrics_rules(m, b), 0);
    qg_rules_free(a); /* the registry keeps nothing of the old rules */

    /* free is plan 1 in b, weekly its view 1 */
    int weekly_b = qg__metrics_view_window(m, 1, -1, 1);
    int hourly = qg__metrics_view_window(m, 1, -1, 0);
    assert_true(weekly_b >= 0 && hourly >= 0);
    qg__metrics_decision(m, 1, weekly_b, QG_M_REJECT);
    qg__metrics_decision(m, 1, hourly, QG_M_REJECT);
    qg__metrics_decision(m, 0, -1, QG_M_ALLOW);  /* team */

    char *t = qg__metrics_render(m, NULL);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"weekly\",outcome=\"reject\"}"), 3);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"hourly\",outcome=\"reject\"}"), 1);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"none\",outcome=\"allow\"}"), 1);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"team\",window=\"none\",outcome=\"allow\"}"), 1);
    /* the plan that disappeared keeps its count */
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"pro\",window=\"none\",outcome=\"allow\"}"), 1);
    assert_true(has_line(t, "quotagate_rules_info{rules_version=\"m2 \\\"quoted\\\"\",weights_version=\"w2\"} 1"));
    promtool_check(t);
    free(t);

    /* and back again: still nothing lost */
    a = load(rules_a);
    assert_int_equal(qg__metrics_rules(m, a), 0);
    qg__metrics_decision(m, 0, qg__metrics_view_window(m, 0, -1, 1),
                        QG_M_REJECT);
    t = qg__metrics_render(m, NULL);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"weekly\",outcome=\"reject\"}"), 4);
    assert_int_equal(sample(t, "quotagate_decisions_total{plan=\"free\",window=\"hourly\",outcome=\"reject\"}"), 1);
    free(t);
    qg__metrics_free(m);
    qg_rules_free(a);
    qg_rules_free(b);
}

/* --------------------------------------------- concurrent counting */

#define THREADS 4
#define PER_THREAD 20000

static void *counter_thread(void *arg)
{
    qg_metrics *m = arg;
    for (int i = 0; i < PER_THREAD; i++)
        qg__metrics_decision(m, 0, -1, QG_M_ALLOW);
    return NULL;
}

/* Plan 0 is "free" in rules_a and "team" in rules_b: during a swap an
 * increment may land on either, but none is lost. */
static void test_concurrent_swap(void **state)
{
    qg_rules *a = load(rules_a), *b = load(rules_b);
    qg_metrics *m = qg__metrics_new(a);
    pthread_t th[THREADS];
    (void)state;

    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, counter_thread, m), 0);
    for (int k = 0; k < 50; k++)
        assert_int_equal(qg__metrics_rules(m, (k & 1) ? a : b), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    char *t = qg__metrics_render(m, NULL);
    long long f = sample(t, "quotagate_decisions_total{plan=\"free\",window=\"none\",outcome=\"allow\"}");
    long long tm = sample(t, "quotagate_decisions_total{plan=\"team\",window=\"none\",outcome=\"allow\"}");
    /* a zero series of a plan absent from the final rules is not shown */
    assert_true(f >= 0);
    assert_int_equal(f + (tm > 0 ? tm : 0), THREADS * PER_THREAD);
    assert_true(has_line(t, "quotagate_refusal_ratio 0"));
    free(t);
    qg__metrics_free(m);
    qg_rules_free(a);
    qg_rules_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_rules_swap),
        cmocka_unit_test(test_concurrent_swap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
