/* test_json_out.c - the API's JSON bodies (src/server/json_out.c).
 *
 * Each body is parsed back with jansson and checked field by field
 * against PRODUCT.md section 4; numbers are also checked in the text, as
 * the exact decimals of their milli or micro values ("16.5", "0.000125"),
 * since a client reads the text, not our doubles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>
#include "json_out.h"
#include "json_text.h"
#include "quotagate.h"
#include "rules.h"
#include "ruletest.h"

#define NOW_MS 1772445600000LL /* 2026-03-02T10:00:00Z, a Monday */
#define NEXT_MONDAY_MS 1773014400000LL /* 2026-03-09T00:00:00Z */

static const char rules_text[] =
    "version: \"j1\"\n"
    "unit: \"weight points\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    light: { per_request: 1, input_per_1k: 0.25, output_per_1k: 1 }\n"
    "    tiny: { per_request: 0.5, input_per_1k: 0.000125, output_per_1k: 5 }\n"
    "plans:\n"
    "  free:\n"
    "    price: { usd_month: 20 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 50 }\n"
    "      - { name: weekly, type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 400 }\n"
    "      - { name: rpm, type: rate, per: 1m, limit: 20, unit: requests }\n"
    "      - { name: tiny_daily, type: calendar, every: day, at: \"06:30\", tz: \"UTC\", limit: 2.5, models: [tiny] }\n"
    "    concurrency: 2\n"
    "    overage: { policy: reject }\n"
    "  pro:\n"
    "    price: { usd_month: 19.99 }\n"
    "    windows:\n"
    "      - { name: burst_5h, type: rolling, length: 5h, limit: 100 }\n"
    "    overage: { policy: downgrade, to_model: light }\n"
    "orgs:\n"
    "  acme: { windows: [ { name: monthly, type: calendar, every: month, anchor: billing, limit: 100000 } ] }\n"
    "default_plan: free\n";

static void sample(qg_decision *d)
{
    memset(d, 0, sizeof *d);
    d->outcome = QG_ALLOW;
    d->weight_milli = 16500;
    d->decided_at_ms = NOW_MS;
    d->binding = -1;
    d->headroom_milli = -1;
    d->plan = "free";
    d->org = "acme";
    d->model = "light";
    d->rules_version = "j1";
    d->weights_version = "w1";
    tst_decision_view(d, "burst_5h", QG_WIN_ROLLING, 0, 0, 50000, 7000,
                      NOW_MS + 1233500);
    tst_decision_view(d, "weekly", QG_WIN_CALENDAR, 0, 0, 400000, 383500,
                      NEXT_MONDAY_MS);
    tst_decision_view(d, "rpm", QG_WIN_RATE, 1, 0, 20000, 1000, NOW_MS + 3000);
    tst_decision_view(d, "monthly", QG_WIN_CALENDAR, 0, 1, 100000000, 0, 0);
}

/* Parse text (and free it), failing the test when it is not JSON. */
static json_t *parse(char *text)
{
    json_error_t e;
    assert_non_null(text);
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("not JSON (%s): %s", e.text, text);
    free(text);
    return j;
}

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        fail_msg("\"%s\" is not a string", key);
    return json_string_value(v);
}

/* A number member as milli-units: integers and reals alike, exactly. */
static int64_t milli(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        return json_integer_value(v) * 1000;
    if (!json_is_real(v))
        fail_msg("\"%s\" is not a number", key);
    double x = json_real_value(v) * 1000.0;
    return (int64_t)(x < 0 ? x - 0.5 : x + 0.5);
}

static void check_window(json_t *w, const char *name, const char *scope,
                         const char *type, const char *unit, int64_t limit,
                         int64_t used, int64_t remaining, const char *reset)
{
    assert_int_equal(json_object_size(w), 8);
    assert_string_equal(str(w, "name"), name);
    assert_string_equal(str(w, "scope"), scope);
    assert_string_equal(str(w, "type"), type);
    assert_string_equal(str(w, "unit"), unit);
    assert_true(milli(w, "limit") == limit);
    assert_true(milli(w, "used") == used);
    assert_true(milli(w, "remaining") == remaining);
    if (reset)
        assert_string_equal(str(w, "reset_at"), reset);
    else
        assert_true(json_is_null(json_object_get(w, "reset_at")));
}

static void test_numbers(void **state)
{
    static const struct { int64_t v; int scale; const char *s; } cases[] = {
        {0, 3, "0"},        {16500, 3, "16.5"},    {1425, 3, "1.425"},
        {400000, 3, "400"}, {-2500, 3, "-2.5"},    {1, 3, "0.001"},
        {125, 6, "0.000125"}, {19990000, 6, "19.99"},
        {123456789012345LL, 3, "123456789012.345"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = qg__json_dump_steal(
            json_pack("[o]", qg__json_scaled(cases[i].v, cases[i].scale)));
        char want[64];
        snprintf(want, sizeof want, "[%s]", cases[i].s);
        assert_string_equal(s, want);
        free(s);
    }
}

/* qg__jb_str, which copies plain runs eight bytes at a time, against
 * jansson's own dump of the same string, on 20,000 random strings mixing
 * plain text with every byte that needs a look (controls, '"', '\\',
 * 0x7f, valid UTF-8 of 2-4 bytes, and stray or truncated high bytes, which
 * jansson refuses and the builder must flag as an error), at every
 * alignment of the special byte within an eight-byte word. */
static void test_strings(void **state)
{
    static const char *const pieces[] = {
        "a", "Z", "0", " ", "~", "/", "\"", "\\", "\n", "\t", "\b",
        "\f", "\r", "\x01", "\x1f", "\x7f", "\xc3\xa9", "\xe2\x82\xac",
        "\xf0\x9f\x98\x80", "\xed\x9f\xbf", "\xc3", "\x80", "\xff",
        "\xe2\x82", "\xed\xa0\x80", "plain text ", "window burst_5h",
    };
    const size_t npieces = sizeof pieces / sizeof pieces[0];
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    (void)state;
    for (int t = 0; t < 20000; t++) {
        char in[256];
        size_t len = 0;
        int parts;
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        parts = (int)(x % 24);
        for (int k = 0; k < parts; k++) {
            const char *p;
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            /* mostly plain, so that long runs reach the word loop */
            p = pieces[x % 4 == 0 ? (x >> 8) % npieces : (x >> 8) % 4];
            if (len + strlen(p) >= sizeof in)
                break;
            memcpy(in + len, p, strlen(p));
            len += strlen(p);
        }
        in[len] = 0;
        json_t *js = json_string(in);
        char *want = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        qg__jb b;
        assert_int_equal(qg__jb_init(&b, 16), 0);
        qg__jb_str(&b, in);
        char *got = qg__jb_finish(&b);
        if (!js) {
            if (got)
                fail_msg("invalid UTF-8 accepted: %s", got);
        } else if (!got || strcmp(got, want) != 0) {
            fail_msg("qg__jb_str gave %s, jansson %s", got ? got : "(error)",
                     want);
        }
        free(got);
        free(want);
        json_decref(js);
    }
}

static void test_check_allow(void **state)
{
    qg_decision d;
    (void)state;
    sample(&d);
    d.replayed = 1;
    char *text = qg__json_check(&d, "req-1", NULL);
    assert_non_null(strstr(text, "\"weight\":16.5,"));
    json_t *j = parse(text);
    assert_string_equal(str(j, "decision"), "allow");
    assert_string_equal(str(j, "request_id"), "req-1");
    assert_true(milli(j, "weight") == 16500);
    assert_string_equal(str(j, "plan"), "free");
    assert_string_equal(str(j, "org"), "acme");
    assert_string_equal(str(j, "model"), "light");
    assert_string_equal(str(j, "rules_version"), "j1");
    assert_string_equal(str(j, "weights_version"), "w1");
    assert_true(json_is_true(json_object_get(j, "replayed")));
    assert_null(json_object_get(j, "error"));
    assert_null(json_object_get(j, "retry_after_s"));
    json_t *w = json_object_get(j, "windows");
    assert_int_equal(json_array_size(w), 4);
    check_window(json_array_get(w, 0), "burst_5h", "member", "rolling",
                 "weight points", 50000, 7000, 43000,
                 "2026-03-02T10:20:33.500Z");
    check_window(json_array_get(w, 1), "weekly", "member", "calendar",
                 "weight points", 400000, 383500, 16500,
                 "2026-03-09T00:00:00Z");
    check_window(json_array_get(w, 2), "rpm", "member", "rate", "requests",
                 20000, 1000, 19000, "2026-03-02T10:00:03Z");
    /* an org's window has one name: "org.NAME" (docs/api.md) */
    check_window(json_array_get(w, 3), "org.monthly", "org", "calendar",
                 "weight points", 100000000, 0, 100000000, NULL);
    json_decref(j);

    /* no org, no model: the members are absent */
    d.org = NULL;
    d.model = NULL;
    d.replayed = 0;
    j = parse(qg__json_check(&d, "req-2", NULL));
    assert_null(json_object_get(j, "org"));
    assert_null(json_object_get(j, "model"));
    assert_true(json_is_false(json_object_get(j, "replayed")));
    json_decref(j);
}

static void test_check_reject(void **state)
{
    qg_decision d;
    (void)state;
    sample(&d);
    d.outcome = QG_REJECT;
    d.binding = 1;
    d.views[1].used_milli = 400000;
    d.views[1].remaining_milli = 0;
    d.retry_after_ms = NEXT_MONDAY_MS - NOW_MS;
    d.nrecovery[0] = 1;
    d.recovery[0][0] = (qg_recovery_point){NOW_MS + 1233500, 50000};
    d.nrecovery[1] = 1;
    d.recovery[1][0] = (qg_recovery_point){NEXT_MONDAY_MS, 400000};

    char *text = qg__json_check(&d, "req-3", NULL);
    assert_non_null(strstr(text, "\"retry_after_s\":568800,"));
    json_t *j = parse(text);
    assert_string_equal(str(j, "decision"), "reject");
    assert_string_equal(str(j, "request_id"), "req-3");
    assert_true(milli(j, "weight") == 16500);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(str(e, "type"), "quota_exceeded");
    assert_string_equal(str(e, "window"), "weekly");
    assert_string_equal(str(e, "message"),
                        "weekly limit reached: 400 of 400 weight points used; "
                        "this request (16.5) fits again at "
                        "2026-03-09T00:00:00Z");
    assert_true(json_is_true(json_object_get(j, "retryable")));
    assert_true(milli(j, "retry_after_s") == 568800000);
    json_t *rec = json_object_get(j, "recovers");
    assert_int_equal(json_array_size(rec), 2);
    json_t *r0 = json_array_get(rec, 0), *r1 = json_array_get(rec, 1);
    assert_string_equal(str(r0, "window"), "burst_5h");
    assert_string_equal(str(r0, "at"), "2026-03-02T10:20:33.500Z");
    assert_true(milli(r0, "in_s") == 1233500);
    assert_true(milli(r0, "remaining") == 50000);
    assert_string_equal(str(r1, "window"), "weekly");
    assert_true(milli(r1, "in_s") == 568800000);
    assert_int_equal(json_array_size(json_object_get(j, "windows")), 4);
    json_decref(j);

    /* a request-unit binding window does not quote the weight */
    d.binding = 2;
    d.views[2].used_milli = 20000;
    d.retry_after_ms = 3000;
    j = parse(qg__json_check(&d, "req-3", NULL));
    assert_string_equal(str(json_object_get(j, "error"), "message"),
                        "rpm limit reached: 20 of 20 requests used; this "
                        "request fits again at 2026-03-02T10:00:03Z");
    json_decref(j);
    d.binding = 1;

    /* a retry_after with milliseconds keeps them */
    d.retry_after_ms = 59765;
    text = qg__json_check(&d, "req-3", NULL);
    assert_non_null(strstr(text, "\"retry_after_s\":59.765,"));
    free(text);
}

static void test_check_payg(void **state)
{
    qg_decision d;
    (void)state;
    sample(&d);
    /* admitted with 2.5 points beyond the room, at $0.01 */
    d.headroom_milli = 14000;
    d.overage_milli = 2500;
    d.overage_price_micro = 10000;
    d.overage_cost_micro = 25000;
    d.spent_micro = 125000;
    d.spending_cap_micro = 0;
    d.cap_period_end_ms = NEXT_MONDAY_MS;
    json_t *j = parse(qg__json_check(&d, "p-1", NULL));
    json_t *o = json_object_get(j, "overage");
    assert_non_null(o);
    assert_string_equal(str(o, "policy"), "payg");
    assert_true(milli(o, "units") == 2500);
    assert_true(json_real_value(json_object_get(o, "cost_usd")) == 0.025);
    assert_true(json_real_value(json_object_get(o, "price_per_unit_usd")) ==
                0.01);
    assert_true(json_real_value(json_object_get(o, "spent_usd")) == 0.125);
    assert_true(json_is_null(json_object_get(o, "spending_cap_usd")));
    assert_string_equal(str(o, "cap_resets_at"), "2026-03-09T00:00:00Z");
    json_decref(j);

    /* no window lifted: no overage object */
    d.headroom_milli = -1;
    j = parse(qg__json_check(&d, "p-2", NULL));
    assert_null(json_object_get(j, "overage"));
    json_decref(j);

    /* refused by the spending cap */
    d.outcome = QG_REJECT;
    d.cap_reached = 1;
    d.binding = 0;
    d.headroom_milli = 0;
    d.spent_micro = 4990000;
    d.spending_cap_micro = 5000000;
    d.retry_after_ms = 1233500;
    j = parse(qg__json_check(&d, "p-3", NULL));
    json_t *e = json_object_get(j, "error");
    assert_string_equal(str(e, "type"), "spending_cap_reached");
    assert_string_equal(str(e, "window"), "burst_5h");
    assert_string_equal(str(e, "message"),
                        "spending cap reached: $4.99 of $5 spent this period; "
                        "this request's overage (2.5 weight points beyond "
                        "burst_5h) would cost $0.025; it fits again at "
                        "2026-03-02T10:20:33.500Z");
    assert_true(json_is_true(json_object_get(j, "retryable")));
    o = json_object_get(j, "overage");
    assert_true(json_number_value(json_object_get(o, "spending_cap_usd")) == 5);
    json_decref(j);
}

static void test_check_never(void **state)
{
    qg_decision d;
    (void)state;
    sample(&d);
    d.outcome = QG_REJECT_NEVER;
    d.weight_milli = 60000;
    d.binding = 0;
    json_t *j = parse(qg__json_check(&d, "big", NULL));
    json_t *e = json_object_get(j, "error");
    assert_string_equal(str(j, "decision"), "reject");
    assert_string_equal(str(e, "type"), "request_too_large_for_plan");
    assert_string_equal(str(e, "window"), "burst_5h");
    assert_string_equal(str(e, "message"),
                        "this request (60 weight points) exceeds the burst_5h "
                        "limit of 50 weight points on plan free: it can never "
                        "be admitted");
    assert_true(json_is_false(json_object_get(j, "retryable")));
    assert_null(json_object_get(j, "retry_after_s"));
    json_decref(j);

    /* without a binding index, the window under the weight is named */
    d.binding = -1;
    j = parse(qg__json_check(&d, "big", NULL));
    assert_string_equal(str(json_object_get(j, "error"), "window"),
                        "burst_5h");
    json_decref(j);
}

static void test_settle(void **state)
{
    qg_settle_result s = {0, 1, 16500, 2250, 16500, NOW_MS,
                          QG_SETTLE_CANCELLED, 0, 0};
    (void)state;
    char *text = qg__json_settle(&s, "req-1");
    assert_string_equal(text, "{\"request_id\":\"req-1\",\"status\":"
                              "\"cancelled\",\"reserved\":16.5,\"actual\":"
                              "2.25,\"charged\":16.5,\"late\":true,"
                              "\"replayed\":false}");
    free(text);
    /* payg: the settle's overage */
    s.overage_milli = 1500;
    s.overage_cost_micro = 15000;
    text = qg__json_settle(&s, "req-1");
    assert_non_null(strstr(text, ",\"overage_units\":1.5,"
                                 "\"overage_cost_usd\":0.015}"));
    free(text);
}

static void test_usage(void **state)
{
    qg_decision d;
    (void)state;
    sample(&d);
    d.outcome = QG_NONE;
    d.nrecovery[0] = 2;
    d.recovery[0][0] = (qg_recovery_point){NOW_MS + 1233500, 45000};
    d.recovery[0][1] = (qg_recovery_point){NOW_MS + 3600000, 50000};
    d.nrecovery[1] = 1;
    d.recovery[1][0] = (qg_recovery_point){NEXT_MONDAY_MS, 400000};
    d.nrecovery[2] = 1; /* a partial schedule: not back to full */
    d.recovery[2][0] = (qg_recovery_point){NOW_MS + 1000, 19500};

    json_t *j = parse(qg__json_usage(&d, "alice", NOW_MS, "weight points"));
    assert_string_equal(str(j, "subject"), "alice");
    assert_string_equal(str(j, "plan"), "free");
    assert_string_equal(str(j, "org"), "acme");
    assert_string_equal(str(j, "rules_version"), "j1");
    json_t *w = json_object_get(j, "windows");
    assert_int_equal(json_array_size(w), 4);
    json_t *w0 = json_array_get(w, 0);
    assert_string_equal(str(w0, "name"), "burst_5h");
    json_t *rec = json_object_get(w0, "recovers");
    assert_int_equal(json_array_size(rec), 2);
    assert_null(json_object_get(json_array_get(rec, 0), "window"));
    assert_string_equal(str(json_array_get(rec, 1), "at"),
                        "2026-03-02T11:00:00Z");
    assert_true(milli(json_array_get(rec, 1), "in_s") == 3600000);
    assert_true(milli(json_array_get(rec, 0), "remaining") == 45000);
    assert_int_equal(json_array_size(json_object_get(json_array_get(w, 3),
                                                     "recovers")), 0);

    json_t *fc = json_object_get(j, "forecast");
    assert_int_equal(json_array_size(fc), 4);
    json_t *f0 = json_array_get(fc, 0);
    assert_string_equal(str(f0, "name"), "burst_5h");
    assert_string_equal(str(f0, "full_at"), "2026-03-02T11:00:00Z");
    json_t *nr = json_object_get(f0, "next_recovery");
    assert_string_equal(str(nr, "at"), "2026-03-02T10:20:33.500Z");
    assert_true(milli(nr, "remaining") == 45000);
    assert_string_equal(str(json_array_get(fc, 1), "full_at"),
                        "2026-03-09T00:00:00Z");
    assert_true(json_is_null(json_object_get(json_array_get(fc, 2),
                                             "full_at")));
    json_t *f3 = json_array_get(fc, 3);
    assert_true(json_is_null(json_object_get(f3, "full_at")));
    assert_true(json_is_null(json_object_get(f3, "next_recovery")));
    json_decref(j);

    d.org = NULL;
    j = parse(qg__json_usage(&d, "bob", NOW_MS, NULL));
    assert_true(json_is_null(json_object_get(j, "org")));
    json_decref(j);
}

static json_t *find(json_t *arr, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
        if (strcmp(str(v, "name"), name) == 0)
            return v;
    fail_msg("no \"%s\"", name);
    return NULL;
}

static void test_plans(void **state)
{
    qg_rules *r = tst_rules_parse(rules_text);
    (void)state;
    char *text = qg__json_plans(r, INT64_C(1780000000000));
    assert_non_null(strstr(text, "\"price_usd_month\":19.99,"));
    assert_non_null(strstr(text, "\"limit\":2.5,"));
    json_t *j = parse(text);
    assert_string_equal(str(j, "rules_version"), "j1");
    assert_string_equal(str(j, "weights_version"), "w1");
    assert_string_equal(str(j, "unit"), "weight points");
    json_t *plans = json_object_get(j, "plans");
    assert_int_equal(json_array_size(plans), 2);
    json_t *free_ = find(plans, "free");
    assert_true(milli(free_, "price_usd_month") == 20000);
    assert_int_equal(json_integer_value(json_object_get(free_, "concurrency")),
                     2);
    assert_string_equal(str(json_object_get(free_, "overage"), "policy"),
                        "reject");
    json_t *ws = json_object_get(free_, "windows");
    assert_int_equal(json_array_size(ws), 4); /* concurrency given apart */
    json_t *b = find(ws, "burst_5h");
    assert_string_equal(str(b, "type"), "rolling");
    assert_string_equal(str(b, "unit"), "weight points");
    assert_true(milli(b, "limit") == 50000);
    assert_true(milli(b, "length_s") == 18000000);
    json_t *wk = find(ws, "weekly");
    assert_string_equal(str(wk, "every"), "week");
    assert_string_equal(str(wk, "at"), "MON 00:00");
    assert_string_equal(str(wk, "tz"), "UTC");
    json_t *rpm = find(ws, "rpm");
    assert_string_equal(str(rpm, "unit"), "requests");
    assert_true(milli(rpm, "per_s") == 60000);
    assert_true(milli(rpm, "burst") == 20000);
    json_t *td = find(ws, "tiny_daily");
    assert_string_equal(str(td, "at"), "06:30");
    assert_string_equal(json_string_value(json_array_get(
                            json_object_get(td, "models"), 0)),
                        "tiny");
    assert_null(json_object_get(b, "models"));

    json_t *pro = find(plans, "pro");
    assert_true(json_is_null(json_object_get(pro, "concurrency")));
    json_t *ov = json_object_get(pro, "overage");
    assert_string_equal(str(ov, "policy"), "downgrade");
    assert_string_equal(str(ov, "to_model"), "light");

    json_t *orgs = json_object_get(j, "orgs");
    assert_int_equal(json_array_size(orgs), 1);
    json_t *m = find(json_object_get(find(orgs, "acme"), "windows"),
                     "monthly");
    assert_string_equal(str(m, "every"), "month");
    assert_string_equal(str(m, "anchor"), "billing");
    json_decref(j);
    qg_rules_free(r);
}

static void test_weights(void **state)
{
    qg_rules *r = tst_rules_parse(rules_text);
    (void)state;
    char *text = qg__json_weights(r);
    assert_string_equal(
        text, "{\"version\":\"w1\",\"calibrated\":\"2026-01-01\",\"unit\":"
              "\"weight points\",\"models\":[{\"name\":\"light\","
              "\"per_request\":1,\"input_per_1k\":0.25,\"output_per_1k\":1},"
              "{\"name\":\"tiny\",\"per_request\":0.5,\"input_per_1k\":"
              "0.000125,\"output_per_1k\":5}]}");
    json_decref(parse(text));
    qg_rules_free(r);
}

static void test_error(void **state)
{
    (void)state;
    char *text = qg__json_error("invalid_request", "subject is \"required\"");
    assert_string_equal(text, "{\"error\":{\"type\":\"invalid_request\","
                              "\"message\":\"subject is \\\"required\\\"\"}}");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_check_allow),
        cmocka_unit_test(test_check_reject),
        cmocka_unit_test(test_check_never),
        cmocka_unit_test(test_check_payg),
        cmocka_unit_test(test_settle),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
