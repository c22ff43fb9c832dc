/* test_cli.c - the quotagate binary end to end: help and flag errors,
 * analyze (JSON and human) on the examples, simulate on the example trace
 * with exact retry instants, lint clean and with findings, and unusable
 * rules and traces (exit 2 naming file and line).  The binary is $QG_BIN;
 * data come from $QG_EXAMPLES and $QG_TESTDATA (tests/run.sh sets them). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixed.h"
#include "runcli.h"

static const char *env(const char *name)
{
    const char *v = getenv(name);
    if (!v)
        fail_msg("%s is not set (run through tests/run.sh)", name);
    return v;
}

static char *path_in(const char *envname, const char *rel)
{
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", env(envname), rel);
    return b;
}

#define EX(rel) path_in("QG_EXAMPLES", rel)
#define TD(rel) path_in("QG_TESTDATA", rel)

/* A JSON number printed as text ("3.5", "6"), to compare without floats. */
static void assert_num(json_t *v, const char *want)
{
    char *s;
    assert_non_null(v);
    assert_true(json_is_number(v));
    s = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    assert_non_null(s);
    if (strcmp(s, want) != 0)
        fail_msg("number %s, expected %s", s, want);
    free(s);
}

/* A JSON number as milli, exactly. */
static int64_t num_milli(json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    int64_t m = 0;
    assert_non_null(s);
    assert_int_equal(qg_fixed_parse(s, strlen(s), 3, &m), 0);
    free(s);
    return m;
}

static void assert_matches(const char *text, const char *pattern)
{
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NEWLINE), 0);
    if (regexec(&re, text, 0, NULL, 0) != 0)
        fail_msg("\"%s\" does not match /%s/", text, pattern);
    regfree(&re);
}

/* ------------------------------------------------------------ help */

static void test_help_and_flags(void **state)
{
    static const char *const cmds[] = { "analyze", "simulate", "lint" };
    tst_cli_result r;
    size_t i;
    (void)state;

    r = tst_cli_run("--help", NULL);
    assert_int_equal(r.rc, 0);
    for (i = 0; i < 3; i++)
        assert_non_null(strstr(r.out, cmds[i]));
    tst_cli_done(&r);
    r = tst_cli_run("--version", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "quotagate "));
    tst_cli_done(&r);
    for (i = 0; i < 3; i++) {
        r = tst_cli_run(cmds[i], "--help", NULL);
        assert_int_equal(r.rc, 0);
        assert_non_null(strstr(r.out, "usage: quotagate"));
        assert_non_null(strstr(r.out, "--config"));
        tst_cli_done(&r);
    }
    r = tst_cli_run(NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("serve-nothing", NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "unknown command"));
    tst_cli_done(&r);
    r = tst_cli_run("analyze", "-c", EX("rules.yaml"), "--bogus", NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--bogus"));
    tst_cli_done(&r);
    r = tst_cli_run("analyze", NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--config"));
    tst_cli_done(&r);
    r = tst_cli_run("analyze", "-c", EX("rules.yaml"), "--period", "soon",
                    NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("analyze", "-c", EX("rules.yaml"), "--baseline", "nope",
                    NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("simulate", "-c", EX("rules.yaml"), NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--trace"));
    tst_cli_done(&r);
    r = tst_cli_run("simulate", "-c", EX("rules.yaml"), "--trace",
                    EX("trace.csv"), "--start", "yesterday", NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("lint", "-c", EX("rules.yaml"), "extra", NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    /* serve refuses a bad flag before it opens anything */
    r = tst_cli_run("serve", "-c", EX("rules.yaml"), "--ledger-cache", "0",
                    NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--ledger-cache must be a number from 1"));
    tst_cli_done(&r);
    r = tst_cli_run("serve", "-c", EX("rules.yaml"), "--ledger-cache",
                    "64MB", NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("serve", "-c", EX("rules.yaml"), "--ledger-cache", "8",
                    "--ledger", "postgresql://qg@127.0.0.1:1/qg", NULL);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "a PostgreSQL ledger has none"));
    tst_cli_done(&r);
    r = tst_cli_run("serve", "--help", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "--ledger-cache MB"));
    tst_cli_done(&r);
}

/* --------------------------------------------------------- analyze */

static json_t *find_plan(json_t *root, const char *name)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(root, "plans"), i, p)
        if (strcmp(json_string_value(json_object_get(p, "plan")), name) == 0)
            return p;
    fail_msg("plan %s not in the output", name);
    return NULL;
}

static void test_analyze_json(void **state)
{
    static const struct { const char *plan, *eff; } want[] = {
        { "pro", "1" }, { "max5", "3.5" }, { "max20", "6" },
    };
    tst_cli_result r = tst_cli_run("analyze", "-c", EX("rules.yaml"), "--json",
                                   NULL);
    json_error_t je;
    json_t *root, *p, *c;
    size_t i, j;
    (void)state;

    assert_int_equal(r.rc, 0);
    root = json_loads(r.out, 0, &je);
    if (!root)
        fail_msg("analyze --json: %s", je.text);
    assert_string_equal(json_string_value(json_object_get(root, "baseline")),
                        "pro");
    assert_num(json_object_get(root, "period_s"), "604800");
    for (i = 0; i < 3; i++) {
        p = find_plan(root, want[i].plan);
        assert_num(json_object_get(p, "effective_multiplier"), want[i].eff);
        assert_num(json_object_get(p, "simulated_multiplier"), want[i].eff);
        assert_string_equal(
            json_string_value(json_object_get(p, "binding_window")), "weekly");
        assert_true(json_is_true(json_object_get(p, "analytic_simulated_agree")));
        assert_true(json_is_array(json_object_get(p, "windows")));
        json_array_foreach(json_object_get(p, "claims"), j, c) {
            assert_true(json_is_true(json_object_get(c, "ok")));
            assert_non_null(json_string_value(json_object_get(c, "message")));
        }
    }
    p = find_plan(root, "max20");
    assert_num(json_object_get(p, "redeemable"), "2400");
    c = json_array_get(json_object_get(p, "claims"), 0);
    assert_num(json_object_get(c, "multiplier"), "20");
    assert_string_equal(json_string_value(json_object_get(c, "window")),
                        "burst_5h");
    assert_non_null(strstr(json_string_value(json_object_get(c, "message")),
                           "effective over 7d is 6x (binding: weekly)"));
    /* the window ratios of max5: burst 5x, weekly 3.5x */
    p = find_plan(root, "max5");
    json_array_foreach(json_object_get(p, "windows"), j, c) {
        const char *n = json_string_value(json_object_get(c, "name"));
        if (strcmp(n, "burst_5h") == 0)
            assert_num(json_object_get(c, "ratio"), "5");
        if (strcmp(n, "weekly") == 0)
            assert_num(json_object_get(c, "ratio"), "3.5");
    }
    json_decref(root);
    tst_cli_done(&r);
}

static void test_analyze_human(void **state)
{
    tst_cli_result r = tst_cli_run("analyze", "-c", EX("rules.yaml"), NULL);
    const char *max5;
    (void)state;
    assert_int_equal(r.rc, 0);
    max5 = strstr(r.out, "plan max5");
    assert_non_null(max5);
    assert_non_null(strstr(max5, "note: min of window ratios (2x) differs "
                                 "from the redeemable ratio (3.5x)"));
    assert_null(strstr(r.out, "MISMATCH"));
    assert_non_null(strstr(r.out, "binding: weekly"));
    tst_cli_done(&r);
}

/* -------------------------------------------------------- simulate */

/* Output lines of a simulate run as JSON values (NULL-terminated). */
static json_t **lines_of(const char *out, int *n)
{
    json_t **v = calloc(256, sizeof *v);
    const char *p = out;
    *n = 0;
    assert_non_null(v);
    while (*p && *n < 255) {
        const char *e = strchr(p, '\n');
        json_error_t je;
        size_t len = e ? (size_t)(e - p) : strlen(p);
        v[*n] = json_loadb(p, len, 0, &je);
        if (!v[*n])
            fail_msg("bad JSON line: %.*s (%s)", (int)len, p, je.text);
        (*n)++;
        p += len + (e ? 1 : 0);
    }
    return v;
}

static void free_lines(json_t **v, int n)
{
    for (int i = 0; i < n; i++)
        json_decref(v[i]);
    free(v);
}

static const char *sget(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static void test_simulate_trace(void **state)
{
    /* bob (pro, burst_5h 50): r1 7 + r2 8.5 + r4 1.425 + r5 16.5 + r6 16.5
     * = 49.925; r7 (16.5) fits once r1, r2 and r4 have left the 5h window:
     * at 5h + 3.25s, i.e. 17973.25s after t = 30. */
    static const struct { const char *rid, *decision; } want[] = {
        { "r1", "allow" },  { "r2", "allow" },  { "r3", "allow" },
        { "r4", "allow" },  { "r5", "allow" },  { "r6", "allow" },
        { "r7", "reject" }, { "r8", "reject" }, { "r9", "reject" },
        { "r10", "allow" }, { "r11", "reject" }, { "r12", "allow" },
    };
    tst_cli_result r = tst_cli_run("simulate", "-c", EX("rules.yaml"),
                                   "--trace", EX("trace.csv"), "--start",
                                   "2026-11-02T00:00:00Z", NULL);
    json_t **v, *sum, *bob;
    int n, i;
    (void)state;

    assert_int_equal(r.rc, 0);
    v = lines_of(r.out, &n);
    assert_int_equal(n, 13);
    for (i = 0; i < 12; i++) {
        assert_string_equal(sget(v[i], "request_id"), want[i].rid);
        assert_string_equal(sget(v[i], "decision"), want[i].decision);
        assert_non_null(sget(v[i], "subject"));
        assert_non_null(json_object_get(v[i], "t"));
        if (strcmp(want[i].decision, "reject") == 0) {
            assert_string_equal(sget(v[i], "window"), "burst_5h");
            assert_non_null(json_object_get(v[i], "retry_after_s"));
        } else {
            assert_null(json_object_get(v[i], "window"));
            assert_null(json_object_get(v[i], "retry_after_s"));
        }
    }
    assert_num(json_object_get(v[6], "retry_after_s"), "17973.25");
    assert_num(json_object_get(v[7], "retry_after_s"), "17963.25");
    sum = json_object_get(v[12], "summary");
    assert_non_null(sum);
    assert_num(json_object_get(sum, "admitted"), "8");
    assert_num(json_object_get(sum, "refused"), "4");
    bob = json_object_get(json_object_get(sum, "subjects"), "bob");
    assert_num(json_object_get(bob, "admitted"), "6");
    assert_num(json_object_get(bob, "refused"), "4");
    assert_num(json_object_get(bob, "weight"), "53.925");
    assert_num(json_object_get(
                   json_object_get(json_object_get(sum, "subjects"), "alice"),
                   "weight"),
               "48.5");
    free_lines(v, n);
    tst_cli_done(&r);
}

/* The refused r7 retried exactly retry_after_s later is admitted; one
 * millisecond earlier it is still refused. */
static void test_simulate_retry_exact(void **state)
{
    tst_cli_result r = tst_cli_run("simulate", "-c", EX("rules.yaml"),
                                   "--trace", EX("trace.csv"), "--start",
                                   "2026-11-02T00:00:00Z", NULL);
    char path[] = "/tmp/qgcli.trace.XXXXXX", t_at[32], t_before[32];
    json_t **v;
    int n, fd;
    int64_t at;
    FILE *f;
    (void)state;

    assert_int_equal(r.rc, 0);
    v = lines_of(r.out, &n);
    assert_string_equal(sget(v[6], "request_id"), "r7");
    at = num_milli(json_object_get(v[6], "t")) +
         num_milli(json_object_get(v[6], "retry_after_s"));
    free_lines(v, n);
    tst_cli_done(&r);
    qg_fixed_format(at, 3, t_at, sizeof t_at);
    qg_fixed_format(at - 1, 3, t_before, sizeof t_before);

    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "t,subject,model,input_tokens,output_tokens,request_id\n"
            "0,bob,standard,2000,800,r1\n1.5,bob,standard,1500,1200,r2\n"
            "3.25,bob,light,500,300,r4\n10,bob,standard,3000,2500,r5\n"
            "20,bob,standard,3000,2500,r6\n"
            "%s,bob,standard,3000,2500,r7-early\n"
            "%s,bob,standard,3000,2500,r7\n", t_before, t_at);
    fclose(f);
    r = tst_cli_run("simulate", "-c", EX("rules.yaml"), "--trace", path,
                    "--start", "2026-11-02T00:00:00Z", NULL);
    unlink(path);
    assert_int_equal(r.rc, 0);
    v = lines_of(r.out, &n);
    assert_int_equal(n, 8);
    assert_string_equal(sget(v[5], "request_id"), "r7-early");
    assert_string_equal(sget(v[5], "decision"), "reject");
    assert_num(json_object_get(v[5], "retry_after_s"), "0.001");
    assert_string_equal(sget(v[6], "request_id"), "r7");
    assert_string_equal(sget(v[6], "decision"), "allow");
    free_lines(v, n);
    tst_cli_done(&r);
}

static void test_simulate_weights_and_quoting(void **state)
{
    tst_cli_result r = tst_cli_run("simulate", "-c", EX("rules.yaml"),
                                   "--trace", TD("cli/trace_weights.csv"),
                                   "--start", "2026-11-02T00:00:00Z", NULL);
    json_t **v;
    int n;
    (void)state;
    assert_int_equal(r.rc, 0);
    v = lines_of(r.out, &n);
    assert_int_equal(n, 4);
    assert_string_equal(sget(v[1], "request_id"), "q,2");
    assert_num(json_object_get(v[1], "t"), "0.5");
    assert_string_equal(sget(v[2], "request_id"), "trace-4");
    assert_num(json_object_get(
                   json_object_get(json_object_get(json_object_get(
                                       v[3], "summary"), "subjects"), "bob"),
                   "weight"),
               "3.5");
    free_lines(v, n);
    tst_cli_done(&r);
}

static void test_simulate_bad_traces(void **state)
{
    static const struct { const char *file, *want; } bad[] = {
        { "cli/trace_bad_t.csv", "trace_bad_t.csv:3: t: expected seconds, "
                                 "got \"abc\"" },
        { "cli/trace_decreasing.csv", "trace_decreasing.csv:3: t:" },
        { "cli/trace_no_subject.csv", "trace_no_subject.csv:1: header:" },
        { "cli/trace_bad_tokens.csv", "trace_bad_tokens.csv:3: input_tokens:" },
        { "cli/trace_unknown_model.csv",
          "trace_unknown_model.csv:3: model: unknown model" },
        { "cli/no_such_trace.csv", "no_such_trace.csv" },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tst_cli_result r = tst_cli_run("simulate", "-c", EX("rules.yaml"),
                                       "--trace", TD(bad[i].file), NULL);
        assert_int_equal(r.rc, 2);
        if (!strstr(r.err, bad[i].want))
            fail_msg("%s: stderr \"%s\" lacks \"%s\"", bad[i].file, r.err,
                     bad[i].want);
        assert_string_equal(r.out, "");
        tst_cli_done(&r);
    }
}

/* ------------------------------------------------------------ lint */

static void test_lint_examples_clean(void **state)
{
    tst_cli_result r = tst_cli_run("lint", "-c", EX("rules.yaml"), NULL);
    (void)state;
    if (r.rc != 0)
        fail_msg("lint on examples: %s", r.out);
    assert_non_null(strstr(r.out, "0 findings"));
    tst_cli_done(&r);
    r = tst_cli_run("lint", "-c", EX("rules.yaml"), "--json", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "\"ok\": true"));
    tst_cli_done(&r);
}

static void test_lint_findings(void **state)
{
    static const struct {
        const char *file, *previous;
        const char *codes[5];
    } cases[] = {
        { "lint/dims.yaml", NULL,
          { "missing-period-total", "missing-concurrency",
            "missing-short-window", "multiplier-not-derivable" } },
        { "lint/claims.yaml", NULL,
          { "claim-no-unit", "claim-unit-mismatch", "claim-not-redeemable",
            "claim-needs-disclosure" } },
        { "lint/stale_weights.yaml", NULL, { "weights-stale" } },
        { "lint/payg.yaml", NULL,
          { "payg-without-cap", "payg-lifts-nothing" } },
        { "lint/lowered_new.yaml", "lint/lowered_old.yaml",
          { "change-without-notice" } },
    };
    size_t i, j, k;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t je;
        json_t *root, *f;
        int count = 0;
        tst_cli_result r = cases[i].previous
            ? tst_cli_run("lint", "-c", TD(cases[i].file), "--previous",
                          TD(cases[i].previous), "--json", NULL)
            : tst_cli_run("lint", "-c", TD(cases[i].file), "--json", NULL);
        assert_int_equal(r.rc, 1);
        root = json_loads(r.out, 0, &je);
        assert_non_null(root);
        assert_true(json_is_false(json_object_get(root, "ok")));
        for (j = 0; j < 5 && cases[i].codes[j]; j++) {
            int found = 0;
            json_array_foreach(json_object_get(root, "findings"), k, f)
                found |= strcmp(sget(f, "code"), cases[i].codes[j]) == 0;
            if (!found)
                fail_msg("%s: no %s finding in %s", cases[i].file,
                         cases[i].codes[j], r.out);
            count++;
        }
        assert_int_equal(json_array_size(json_object_get(root, "findings")),
                         cases[i].previous ? 2 : (size_t)count);
        json_decref(root);
        tst_cli_done(&r);
        /* human output: one "lint:" line per finding and the count */
        r = cases[i].previous
            ? tst_cli_run("lint", "-c", TD(cases[i].file), "--previous",
                          TD(cases[i].previous), NULL)
            : tst_cli_run("lint", "-c", TD(cases[i].file), NULL);
        assert_int_equal(r.rc, 1);
        assert_matches(r.out, "^lint: ");
        assert_matches(r.out, "^[0-9]+ findings?$");
        tst_cli_done(&r);
    }
}

/* ------------------------------------------------- unusable rules */

static void check_bad_rules(const char *path)
{
    static const char *const cmds[] = { "lint", "analyze" };
    size_t i;
    for (i = 0; i < 2; i++) {
        tst_cli_result r = tst_cli_run(cmds[i], "-c", path, NULL);
        if (r.rc != 2)
            fail_msg("%s %s: exit %d, expected 2", cmds[i], path, r.rc);
        assert_non_null(strstr(r.err, strrchr(path, '/') + 1));
        assert_matches(r.err, "\\.yaml:[0-9]+:[0-9]+: ");
        tst_cli_done(&r);
    }
}

static void test_bad_rules(void **state)
{
    static const char *const dirs[] = { "rules", "cli" };
    size_t i;
    int seen = 0;
    (void)state;
    for (i = 0; i < 2; i++) {
        DIR *d = opendir(TD(dirs[i]));
        struct dirent *de;
        if (!d)
            continue;
        while ((de = readdir(d))) {
            char rel[512];
            size_t len = strlen(de->d_name);
            if (strncmp(de->d_name, "bad_", 4) != 0 || len < 5 ||
                strcmp(de->d_name + len - 5, ".yaml") != 0)
                continue;
            snprintf(rel, sizeof rel, "%s/%s", dirs[i], de->d_name);
            check_bad_rules(TD(rel));
            seen++;
        }
        closedir(d);
    }
    assert_true(seen >= 1);
    {
        tst_cli_result r = tst_cli_run("lint", "-c",
                                       TD("cli/no_such_rules.yaml"), NULL);
        assert_int_equal(r.rc, 2);
        assert_non_null(strstr(r.err, "no_such_rules.yaml"));
        tst_cli_done(&r);
        r = tst_cli_run("lint", "-c", EX("rules.yaml"), "--previous",
                        TD("cli/bad_window_type.yaml"), NULL);
        assert_int_equal(r.rc, 2);
        assert_matches(r.err, "bad_window_type\\.yaml:8:[0-9]+: ");
        tst_cli_done(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_and_flags),
        cmocka_unit_test(test_analyze_json),
        cmocka_unit_test(test_analyze_human),
        cmocka_unit_test(test_simulate_trace),
        cmocka_unit_test(test_simulate_retry_exact),
        cmocka_unit_test(test_simulate_weights_and_quoting),
        cmocka_unit_test(test_simulate_bad_traces),
        cmocka_unit_test(test_lint_examples_clean),
        cmocka_unit_test(test_lint_findings),
        cmocka_unit_test(test_bad_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
