/* test_server_versions.c - a real `quotagate serve` crossing the effective
 * instant of a rules version while requests flow (PRODUCT.md 8), and
 * `quotagate simulate` across the same instant.
 *
 * The test writes a rules file of two versions: v1 (burst 10 per hour)
 * and v2 (burst 4), v2 taking effect a few seconds after the test starts.
 * Checks of weight 1 flow while the server's own clock crosses the
 * instant; nothing reloads.  What is asserted is order and rows, never a
 * duration: the versions of the answers never go back from v2 to v1;
 * every row decided before the instant says v1 and every row at or after
 * it says v2 (the ledger's created_ms against the instant); each answer
 * is the one its version's limit gives for the usage before it (the same
 * window by name, its usage kept); /v1/plans shows v2 upcoming, then in
 * force; /v1/usage lists it in upcoming_changes until then. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "httpc.h"
#include "qgproc.h"
#include "quotagate.h"
#include "redisproc.h"
#include "runcli.h"
#include "srvtest.h"

#define SERVICE QGPROC_SERVICE_KEY
#define ADMIN QGPROC_ADMIN_KEY
#define MAX_STEPS 400

static qgproc P;

/* The two versions, v2 effective at `eff` (ISO 8601). */
static const char *rules_text(const char *eff)
{
    return tst_fmt(
        "version: \"v1\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    light: { per_request: 1 }\n"
        "plans:\n  basic:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 1h, limit: 10 }\n"
        "default_plan: basic\n"
        "---\n"
        "version: \"v2\"\n"
        "effective: \"%s\"\n"
        "announced: \"2026-01-01T00:00:00Z\"\n"
        "notice: 1d\n"
        "changes: \"basic: burst lowered from 10 to 4\"\n"
        "weights:\n  version: \"w1\"\n  calibrated: \"2026-01-01\"\n"
        "  models:\n    light: { per_request: 1 }\n"
        "plans:\n  basic:\n    windows:\n"
        "      - { name: burst, type: rolling, length: 1h, limit: 4 }\n"
        "default_plan: basic\n", eff);
}

static json_t *get_json(const char *path, const char *key)
{
    httpc c;
    http_resp r;
    json_t *j;
    httpc_init(&c, qgproc_port(&P));
    memset(&r, 0, sizeof r);
    if (httpc_get(&c, path, key, &r) < 0)
        fail_msg("GET %s: %s", path, c.err);
    tst_want_status(&r, 200, path, __LINE__);
    j = tst_jparse(&r, path);
    http_resp_free(&r);
    httpc_close(&c);
    return j;
}

/* One check of weight 1; returns the HTTP status. */
static int check1(const char *subject, const char *rid)
{
    httpc c;
    http_resp r;
    int status;
    httpc_init(&c, qgproc_port(&P));
    memset(&r, 0, sizeof r);
    if (httpc_post_json(&c, "/v1/check", SERVICE,
                        tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                                "\"weight\":1}", subject, rid), &r) < 0)
        fail_msg("POST /v1/check: %s", c.err);
    status = r.status;
    if (status != 200 && status != 429)
        fail_msg("check %s answered %d: %s", rid, status, tst_excerpt(&r));
    http_resp_free(&r);
    httpc_close(&c);
    return status;
}

/* The limit of window burst in a /v1/usage body. */
static double burst_limit(json_t *u)
{
    json_t *w = json_object_get(u, "windows");
    for (size_t i = 0; i < json_array_size(w); i++) {
        json_t *e = json_array_get(w, i);
        if (strcmp(tst_jstr(e, "name", "usage window"), "burst") == 0)
            return tst_jnum(e, "limit", "usage burst");
    }
    fail_msg("no burst window in %s", tst_dump(u));
    return -1;
}

/* The crossing on the store of args (NULL: memory). */
static void serve_crossing(const char *const *args)
{
    const char *subject = tst_uid("alice");
    char eff[40];
    long long eff_ms;
    int64_t now_ms;
    json_t *plans, *up, *u;
    int status[MAX_STEPS], n = 0, used = 0, seen_v2 = 0;

    /* the instant: 4 whole seconds ahead of the wall clock */
    now_ms = (int64_t)time(NULL) * 1000;
    eff_ms = now_ms + 4000;
    qg_iso8601_format(eff_ms, eff, sizeof eff);
    assert_int_equal(qgproc_init(&P), 0);
    assert_int_equal(qgproc_write_file(qgproc_path(&P, "rules.yaml"),
                                       rules_text(eff)), 0);
    if (qgproc_start(&P, qgproc_path(&P, "rules.yaml"), args, NULL) < 0)
        fail_msg("serve: %s", P.why);

    /* before: v1 in force, v2 upcoming with its computed difference */
    plans = get_json("/v1/plans", NULL);
    up = json_object_get(plans, "upcoming");
    if (strcmp(tst_jstr(plans, "rules_version", "plans"), "v1") == 0) {
        json_t *v2 = json_array_get(up, 0), *d;
        assert_int_equal(json_array_size(up), 1);
        assert_string_equal(tst_jstr(v2, "version", "upcoming"), "v2");
        assert_string_equal(tst_jstr(v2, "effective", "upcoming"), eff);
        assert_string_equal(tst_jstr(v2, "changes", "upcoming"),
                            "basic: burst lowered from 10 to 4");
        d = json_array_get(json_object_get(v2, "differences"), 0);
        assert_non_null(d);
        assert_string_equal(tst_jstr(d, "plan", "difference"), "basic");
        assert_string_equal(tst_jstr(d, "window", "difference"), "burst");
        assert_string_equal(tst_jstr(d, "kind", "difference"), "limit");
        assert_string_equal(tst_jstr(d, "from", "difference"),
                            "10 weight points");
        assert_string_equal(tst_jstr(d, "to", "difference"),
                            "4 weight points");
        assert_true(tst_jbool(d, "less", "difference"));
    }

    /* Requests flow across the instant: a check while the usage is below
     * 6 (so that v1 would admit and v2 refuse what follows), else a usage
     * read; until an answer says v2 and one more check was made. */
    while (n < MAX_STEPS) {
        const char *ver;
        u = get_json(tst_fmt("/v1/usage/%s", subject), ADMIN);
        ver = tst_jstr(u, "rules_version", "usage");
        if (strcmp(ver, "v1") == 0) {
            if (seen_v2)
                fail_msg("v1 answered after v2 had: %s", tst_dump(u));
            assert_true(burst_limit(u) == 10);
            /* the upcoming change touches this member's plan */
            assert_string_equal(
                tst_jstr(json_array_get(json_object_get(u,
                                                        "upcoming_changes"),
                                        0),
                         "version", "upcoming_changes"),
                "v2");
        } else {
            assert_string_equal(ver, "v2");
            assert_true(burst_limit(u) == 4);
            assert_null(json_object_get(u, "upcoming_changes"));
            seen_v2 = 1;
        }
        if (used < 6 || seen_v2) {
            status[n] = check1(subject, tst_fmt("%s-%d", subject, n));
            used += status[n] == 200;
            n++;
            if (seen_v2)
                break;
        } else {
            tst_sleep_ms(100);
        }
    }
    if (!seen_v2)
        fail_msg("the server never decided under v2 in %d steps", MAX_STEPS);

    /* The rows: each names the version in force at its own instant, and
     * its answer is the one that version's limit gives for the usage
     * before it (the same window, by name, across the versions). */
    {
        int v1_rows = 0, v2_rows = 0, before = 0;
        for (int i = 0; i < n; i++) {
            const char **c = tst_ledger_cols(P.data,
                                             tst_fmt("%s-%d", subject, i),
                                             "rules_version,created_ms", 2,
                                             0);
            long long at = atoll(c[1]);
            int v2 = strcmp(c[0], "v2") == 0;
            if (!v2 && strcmp(c[0], "v1") != 0)
                fail_msg("row %d: rules_version %s", i, c[0]);
            if (v2 != (at >= eff_ms))
                fail_msg("row %d decided at %lld says %s; v2 takes effect at "
                         "%lld", i, at, c[0], eff_ms);
            if (status[i] != ((before < (v2 ? 4 : 10)) ? 200 : 429))
                fail_msg("row %d (%s, %d used before) answered %d", i, c[0],
                         before, status[i]);
            before += status[i] == 200;
            v1_rows += !v2;
            v2_rows += v2;
        }
        assert_true(v1_rows + v2_rows == n);
        assert_true(v2_rows >= 1);
    }
    /* after: v2 in force, nothing upcoming */
    plans = get_json("/v1/plans", NULL);
    assert_string_equal(tst_jstr(plans, "rules_version", "plans"), "v2");
    assert_string_equal(tst_jstr(plans, "effective", "plans"), eff);
    assert_int_equal(json_array_size(json_object_get(plans, "upcoming")), 0);
    assert_int_equal(qgproc_finish(&P), 0);
}

static void test_serve_crossing(void **state)
{
    (void)state;
    serve_crossing(NULL);
}

/* The same on a real Redis: the window's usage is kept across the
 * versions by name in the store's entity, under each version's script
 * parameters, and Redis's clock (the same host's) decides the instant. */
static void test_serve_crossing_redis(void **state)
{
    redisproc rp;
    const char *args[3];
    (void)state;
    memset(&rp, 0, sizeof rp);
    if (redisproc_start(&rp, NULL) < 0)
        fail_msg("redis-server: %s", rp.why);
    args[0] = "--store";
    args[1] = tst_fmt("%s", redisproc_url(&rp));
    args[2] = NULL;
    serve_crossing(args);
    redisproc_stop(&rp);
}

/* simulate: the same file, a trace crossing the same instant on the
 * virtual clock (--start 2 s before it). */
static void test_simulate_crossing(void **state)
{
    static const struct { const char *version, *decision; } want[] = {
        { "v1", "allow" }, { "v1", "allow" }, { "v1", "allow" },
        { "v1", "allow" }, { "v1", "allow" },  /* 5 of v1's 10 */
        { "v2", "reject" }, { "v2", "reject" }, /* 5 used >= v2's 4 */
    };
    const char *eff = "2027-01-15T00:00:00Z";
    const char *rules;
    const char *trace;
    char *line, *save = NULL;
    size_t i = 0;
    tst_cli_result r;
    (void)state;

    assert_int_equal(qgproc_init(&P), 0);
    rules = qgproc_path(&P, "versions.yaml");
    assert_int_equal(qgproc_write_file(rules, rules_text(eff)), 0);
    trace = tst_fmt("%s", qgproc_path(&P, "trace.csv"));
    /* t = 1.999 is a millisecond before the instant, t = 2 is at it */
    assert_int_equal(qgproc_write_file(trace,
                                       "t,subject,weight,request_id\n"
                                       "0,ann,1,s0\n0.5,ann,1,s1\n"
                                       "1,ann,1,s2\n1.5,ann,1,s3\n"
                                       "1.999,ann,1,s4\n2,ann,1,s5\n"
                                       "3,ann,1,s6\n"), 0);
    r = tst_cli_run("simulate", "-c", rules, "--trace", trace, "--start",
                    "2027-01-14T23:59:58Z", NULL);
    if (r.rc != 0)
        fail_msg("simulate: rc %d: %s", r.rc, r.err);
    for (line = strtok_r(r.out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        json_t *j = tst_jparse_text(line, strlen(line), "simulate line");
        if (json_object_get(j, "summary"))
            break;
        assert_true(i < sizeof want / sizeof want[0]);
        assert_string_equal(tst_jstr(j, "rules_version", "simulate"),
                            want[i].version);
        assert_string_equal(tst_jstr(j, "decision", "simulate"),
                            want[i].decision);
        i++;
    }
    assert_int_equal(i, sizeof want / sizeof want[0]);
    tst_cli_done(&r);
    /* analyze --at: the version in force then, a second either side */
    r = tst_cli_run("analyze", "-c", rules, "--json", "--at",
                    "2027-01-14T23:59:59Z", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "\"rules_version\": \"v1\""));
    tst_cli_done(&r);
    r = tst_cli_run("analyze", "-c", rules, "--json", "--at", eff, NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "\"rules_version\": \"v2\""));
    tst_cli_done(&r);
    r = tst_cli_run("analyze", "-c", rules, "--at", "tomorrow", NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--at: expected an ISO 8601 time"));
    tst_cli_done(&r);
    qgproc_cleanup(&P);
}

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_serve_crossing, gc_teardown),
        cmocka_unit_test_teardown(test_serve_crossing_redis, gc_teardown),
        cmocka_unit_test_teardown(test_simulate_crossing, gc_teardown),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
