/* test_fixes.c - what a new user tripped on (issue 13, item 4), each
 * through the real binary:
 *  - x-ratelimit-*-tokens come from the windows that apply to the
 *    request's model: a std call never shows the big-only window;
 *  - an org's window has one name, "org.NAME": in error.window, the
 *    message, the windows list, the RateLimit headers and the ledger row;
 *  - unknown_model lists the models, unknown_subject says how subjects
 *    are created;
 *  - a minimal rules file without weights.calibrated loads (lint: exit 1
 *    weights-uncalibrated, not 2);
 *  - an unknown zone is "unknown time zone" once in the message;
 *  - the README links only to files inside the repository.
 * One server on tests/data/fixes/rules.yaml (qgproc). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "httpc.h"
#include "qgproc.h"
#include "runcli.h"
#include "srvtest.h"

#define SERVICE QGPROC_SERVICE_KEY

static qgproc P;
static httpc C;
static char td[1024];

static http_resp *check(const char *subject, const char *rid,
                        const char *model, int in, int out)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, "POST", "/v1/check", "bearer", SERVICE, tst_fmt(
            "{\"subject\":\"%s\",\"request_id\":\"%s\",\"model\":\"%s\","
            "\"input_tokens\":%d,\"max_output_tokens\":%d}", subject, rid,
            model, in, out), r) < 0)
        fail_msg("check: no response: %s", C.err);
    return r;
}

static int setup(void **state)
{
    const char *t = getenv("QG_TESTDATA");
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!t) {
        fprintf(stderr, "QG_TESTDATA is not set (run through tests/run.sh)\n");
        return -1;
    }
    snprintf(td, sizeof td, "%s/fixes", t);
    if (qgproc_init(&P) < 0 ||
        qgproc_start_copy(&P, tst_fmt("%s/rules.yaml", td), NULL, NULL) < 0)
        return -1;
    httpc_init(&C, qgproc_port(&P));
    return 0;
}

static int teardown(void **state)
{
    int rc;
    (void)state;
    httpc_close(&C);
    rc = qgproc_finish(&P);
    tst_gc_free_all();
    return rc;
}

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

/* The weight window with the least remaining among those whose name is
 * not `skip`: what x-ratelimit-*-tokens must report. */
static json_t *least_weight_window(json_t *j, const char *skip)
{
    size_t i;
    json_t *w, *best = NULL;
    json_array_foreach(json_object_get(j, "windows"), i, w) {
        if (strcmp(tst_jstr(w, "unit", "unit"), "weight points") ||
            !strcmp(tst_jstr(w, "name", "name"), skip))
            continue;
        if (!best || tst_jnum(w, "remaining", "r") <
                         tst_jnum(best, "remaining", "r"))
            best = w;
    }
    return best;
}

static void test_tokens_headers_model_scoped(void **state)
{
    http_resp *r;
    json_t *j, *w;
    (void)state;
    /* a std call: weekly_big (30, big only) does not apply */
    r = check("solo", tst_uid("t"), "std", 1000, 1000);
    WANT(r, 200, "std check");
    j = tst_jparse(r, "std");
    w = least_weight_window(j, "weekly_big");
    assert_non_null(http_resp_header(r, "x-ratelimit-limit-tokens"));
    assert_int_equal(atoll(http_resp_header(r, "x-ratelimit-limit-tokens")),
                     llround(tst_jnum(w, "limit", "limit")));
    assert_int_equal(atoll(http_resp_header(r,
                                            "x-ratelimit-remaining-tokens")),
                     (long long)floor(tst_jnum(w, "remaining", "remaining")));
    if (atoll(http_resp_header(r, "x-ratelimit-limit-tokens")) == 30)
        fail_msg("a std call shows the big-only window's limit");
    /* a big call: weekly_big applies and has the least left */
    r = check("solo", tst_uid("t"), "big", 1000, 1000);
    WANT(r, 200, "big check");
    j = tst_jparse(r, "big");
    w = least_weight_window(j, "");
    assert_string_equal(tst_jstr(w, "name", "w"), "weekly_big");
    assert_int_equal(atoll(http_resp_header(r, "x-ratelimit-limit-tokens")),
                     30);
}

static void test_org_window_one_name(void **state)
{
    const char *rid;
    http_resp *r;
    json_t *j, *e;
    const char **cols;
    size_t i;
    json_t *w;
    int listed = 0;
    (void)state;
    /* m1 fills the org pool (20): 1 + 5 * 3 = 16, then 16 more refused */
    WANT(check("m1", tst_uid("o"), "std", 0, 3000), 200, "first");
    rid = tst_uid("o");
    r = check("m1", rid, "std", 0, 3000);
    WANT(r, 429, "pool full");
    j = tst_jparse(r, "429");
    e = json_object_get(j, "error");
    assert_string_equal(tst_jstr(e, "window", "e"), "org.pool");
    assert_non_null(strstr(tst_jstr(e, "message", "e"), "org.pool limit"));
    json_array_foreach(json_object_get(j, "windows"), i, w)
        if (!strcmp(tst_jstr(w, "scope", "scope"), "org")) {
            assert_string_equal(tst_jstr(w, "name", "w"), "org.pool");
            listed = 1;
        }
    assert_true(listed);
    assert_non_null(strstr(http_resp_header(r, "ratelimit-policy"),
                           "\"org.pool\""));
    assert_non_null(strstr(http_resp_header(r, "ratelimit"), "\"org.pool\""));
    cols = tst_ledger_cols(P.data, rid, "\"window\"", 1, 0);
    assert_string_equal(cols[0], "org.pool");
}

static void test_unknown_model_and_subject(void **state)
{
    http_resp *r;
    const char *m;
    (void)state;
    r = check("solo", tst_uid("u"), "nope", 1, 1);
    WANT(r, 400, "unknown model");
    assert_string_equal(tst_error_type(r, "model"), "unknown_model");
    m = tst_jstr(json_object_get(tst_jparse(r, "m"), "error"), "message", "m");
    if (!strstr(m, "std") || !strstr(m, "big"))
        fail_msg("unknown_model does not list the models: %s", m);
    r = check("ghost", tst_uid("u"), "std", 1, 1);
    WANT(r, 404, "unknown subject");
    assert_string_equal(tst_error_type(r, "subject"), "unknown_subject");
    m = tst_jstr(json_object_get(tst_jparse(r, "s"), "error"), "message", "s");
    if (!strstr(m, "POST /v1/admin/subjects"))
        fail_msg("unknown_subject does not say how subjects are created: %s",
                 m);
}

static void test_rules_messages(void **state)
{
    tst_cli_result r;
    const char *first;
    (void)state;
    r = tst_cli_run("lint", "-c", tst_fmt("%s/minimal.yaml", td), NULL);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.out, "weights-uncalibrated"));
    tst_cli_done(&r);
    r = tst_cli_run("analyze", "-c", tst_fmt("%s/minimal.yaml", td), NULL);
    assert_int_equal(r.rc, 0);
    tst_cli_done(&r);
    r = tst_cli_run("lint", "-c", tst_fmt("%s/badzone.yaml", td), NULL);
    assert_int_equal(r.rc, 2);
    first = strstr(r.err, "unknown time zone");
    assert_non_null(first);
    if (strstr(first + 1, "unknown time zone"))
        fail_msg("the message repeats itself: %s", r.err);
    assert_non_null(strstr(r.err, "Mars/Base"));
    tst_cli_done(&r);
}

/* Every Markdown link of README.md: relative, inside the repository, to
 * a file that exists. */
static void test_readme_links_inside(void **state)
{
    const char *ex = getenv("QG_EXAMPLES");
    char root[1024], *text, *p;
    FILE *f;
    long n;
    int links = 0;
    (void)state;
    assert_non_null(ex);
    snprintf(root, sizeof root, "%s/..", ex);
    f = fopen(tst_fmt("%s/README.md", root), "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    text = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    for (p = text; (p = strstr(p, "](")); p += 2) {
        char target[512];
        size_t k = 0;
        const char *q = p + 2;
        while (*q && *q != ')' && *q != '#' && k + 1 < sizeof target)
            target[k++] = *q++;
        target[k] = '\0';
        links++;
        if (strstr(target, "://") || target[0] == '/' || strstr(target, ".."))
            fail_msg("README.md links outside the repository: %s", target);
        if (access(tst_fmt("%s/%s", root, target), F_OK) != 0)
            fail_msg("README.md links to a missing file: %s", target);
    }
    assert_true(links > 0);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_tokens_headers_model_scoped,
                                  gc_teardown),
        cmocka_unit_test_teardown(test_org_window_one_name, gc_teardown),
        cmocka_unit_test_teardown(test_unknown_model_and_subject, gc_teardown),
        cmocka_unit_test_teardown(test_rules_messages, gc_teardown),
        cmocka_unit_test_teardown(test_readme_links_inside, gc_teardown),
    };
    return cmocka_run_group_tests_name("fixes", tests, setup, teardown);
}
