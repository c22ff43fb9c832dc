/* test_forecast.c - forecasts (src/core/forecast.c) per window type on a
 * virtual clock, the real engine and memory store as the oracle: a
 * subject charges at a steady pace (one charge of weight W every step),
 * the forecast is taken from /v1/usage's views at t0 with that pace, and
 * then the same charges go on until the engine first refuses one.  The
 * forecast must say when that happens: exhausted_at no later than the
 * first refusal and no earlier than one step before it (the forecast's
 * pace is continuous, the charges are steps), before_reset as the
 * simulation finds it (the refusal comes before the window's reset or
 * full recovery), and none when the simulation runs three periods without
 * a refusal.  Plus: the basis rule, a window already empty, concurrency,
 * the rules' `forecast: { basis }` and its errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quotagate.h"
#include "forecast.h"
#include "rules.h"
#include "ruletest.h"

#define MIN INT64_C(60000)
#define HOUR (60 * MIN)
#define DAY (24 * HOUR)
#define T0 INT64_C(1772323200000)       /* 2026-03-01T00:00:00Z, a Sunday */

static const char *rules_fmt =
    "version: \"fc\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-01-01\"\n"
    "  models:\n"
    "    m: { per_request: 1 }\n"
    "plans:\n"
    "  p:\n"
    "    windows:\n"
    "      - %s\n"
    "%s"
    "default_plan: p\n";

typedef struct sim {
    qg_store *store;
    qg_engine *eng;
    qg_rules *rules;             /* the engine's */
    int n;                       /* request ids made */
} sim;

static void sim_open(sim *s, const char *window, const char *extra)
{
    char text[1024];
    snprintf(text, sizeof text, rules_fmt, window, extra ? extra : "");
    qg_rules *r = tst_rules_parse(text);
    s->store = qg_store_memory_new(NULL);
    assert_non_null(s->store);
    s->eng = qg_engine_new(r, s->store);
    assert_non_null(s->eng);
    s->rules = r;
    s->n = 0;
}

static void sim_close(sim *s)
{
    qg_engine_free(s->eng);
    qg_store_free(s->store);
}

/* One weight-only charge at t; 1 when admitted. */
static int charge(sim *s, int64_t w, int64_t t)
{
    char rid[32];
    qg_decision d;
    snprintf(rid, sizeof rid, "r%d", s->n++);
    qg_check_req req = {.subject = "u", .request_id = rid,
                        .weight_milli = w};
    assert_int_equal(qg_engine_check(s->eng, &req, t, &d, NULL, 0), 0);
    return d.outcome == QG_ALLOW;
}

/* The forecast of the plan's first window at t with a pace of w per
 * step. */
static void forecast_at(sim *s, int64_t t, int64_t w, int64_t step,
                        qg_forecast *f, qg_decision *d)
{
    const qg_window_spec *spec = &s->rules->plans[0].windows[0];
    assert_int_equal(qg_engine_usage(s->eng, "u", t, d), 0);
    int n = d->nrecovery[0] > QG_MAX_RECOVERY ? QG_MAX_RECOVERY
                                              : d->nrecovery[0];
    /* the pace as a basis of 24 steps and what they charged: the window's
     * unit (request-unit windows count 1000 per charge) */
    int64_t per = spec->unit == QG_UNIT_REQUESTS ? 1000 : w;
    qg__forecast(spec, &d->views[0], d->recovery[0], n, 0, 24 * per,
                 24 * step, t, f);
}

/* Go on charging w every step from t0 (the first at t0 + step) until a
 * refusal or until `until`; the instant of the refusal, or 0. */
static int64_t first_refusal(sim *s, int64_t t0, int64_t w, int64_t step,
                             int64_t until)
{
    for (int64_t t = t0 + step; t <= until; t += step)
        if (!charge(s, w, t))
            return t;
    return 0;
}

/* Charge the pace from `from` up to t0 (the history), then check the
 * forecast at t0 against the simulation; returns the forecast. */
static qg_forecast run_case(const char *window, int64_t from, int64_t t0,
                            int64_t w, int64_t step, int64_t horizon,
                            int64_t reset_hint)
{
    sim s;
    qg_forecast f;
    qg_decision d;
    sim_open(&s, window, NULL);
    for (int64_t t = from; t <= t0; t += step)
        assert_true(charge(&s, w, t));
    forecast_at(&s, t0, w, step, &f, &d);
    int64_t reset = reset_hint ? reset_hint : d.views[0].reset_at_ms;
    int64_t refused = first_refusal(&s, t0, w, step, t0 + horizon);
    if (!refused) {
        if (f.exhausted_at_ms != 0)
            fail_msg("%s: no refusal in the horizon, exhausted_at %lld "
                     "(t0 + %lld min)", window,
                     (long long)f.exhausted_at_ms,
                     (long long)((f.exhausted_at_ms - t0) / MIN));
    } else {
        if (f.exhausted_at_ms == 0)
            fail_msg("%s: refused at t0 + %lld min, forecast none", window,
                     (long long)((refused - t0) / MIN));
        /* remaining reaches 0 at exhausted_at; the charge that no longer
         * fits is the next one */
        if (f.exhausted_at_ms > refused || f.exhausted_at_ms < refused - step)
            fail_msg("%s: refused at t0 + %lld s, exhausted_at t0 + %lld s",
                     window, (long long)((refused - t0) / 1000),
                     (long long)((f.exhausted_at_ms - t0) / 1000));
        if (reset > 0)
            assert_int_equal(f.before_reset, refused < reset);
    }
    sim_close(&s);
    return f;
}

/* ------------------------------------------------------------- tests */

static void test_basis(void **state)
{
    (void)state;
    int64_t now = T0 + 30 * DAY;
    /* default: 7 days; a shorter history: since its first usage; at
     * least an hour; no usage: the configured basis */
    assert_int_equal(qg__forecast_basis(0, T0, now),
                     QG_FORECAST_DEFAULT_BASIS_MS);
    assert_int_equal(qg__forecast_basis(7 * DAY, now - 2 * DAY, now),
                     2 * DAY);
    assert_int_equal(qg__forecast_basis(7 * DAY, now - 5 * MIN, now), HOUR);
    assert_int_equal(qg__forecast_basis(3 * DAY, -1, now), 3 * DAY);
    assert_int_equal(qg__forecast_basis(2 * HOUR, now - DAY, now), 2 * HOUR);
}

static void test_rolling(void **state)
{
    (void)state;
    const char *w = "{ name: b, type: rolling, length: 5h, limit: 100 }";
    /* 30 an hour for 3 hours: 90 used, 10 left, nothing expires before
     * it runs out */
    qg_forecast f = run_case(w, T0, T0 + 3 * HOUR - 2 * MIN, 1000, 2 * MIN,
                             10 * HOUR, 0);
    assert_true(f.exhausted_at_ms > 0);
    assert_int_equal(f.per_hour_milli, 30000);
    assert_int_equal(f.before_reset, 1);
    /* 10 an hour: the window never holds more than 50 */
    f = run_case(w, T0, T0 + 3 * HOUR, 1000, 6 * MIN, 15 * HOUR, 0);
    assert_int_equal(f.exhausted_at_ms, 0);
    /* 25 an hour after an early burst: the burst's expiry gives room back
     * before the pace alone fills the window (the schedule counts) */
    {
        sim s;
        qg_forecast g;
        qg_decision d;
        sim_open(&s, w, NULL);
        assert_true(charge(&s, 60000, T0));
        for (int64_t t = T0 + HOUR; t <= T0 + 2 * HOUR; t += 12 * MIN / 5)
            assert_true(charge(&s, 1000, t));
        forecast_at(&s, T0 + 2 * HOUR, 1000, 12 * MIN / 5, &g, &d);
        int64_t refused = first_refusal(&s, T0 + 2 * HOUR, 1000,
                                        12 * MIN / 5, T0 + 20 * HOUR);
        assert_true(refused > 0 && g.exhausted_at_ms > 0);
        assert_true(g.exhausted_at_ms <= refused &&
                    g.exhausted_at_ms >= refused - 12 * MIN / 5);
        sim_close(&s);
    }
}

static void test_calendar(void **state)
{
    (void)state;
    const char *w = "{ name: d, type: calendar, every: day, at: \"00:00\", "
                    "tz: \"UTC\", limit: 100 }";
    /* 30 an hour from midnight: out at 03:20 the same day */
    qg_forecast f = run_case(w, T0, T0 + HOUR, 1000, 2 * MIN, 2 * DAY,
                             T0 + DAY);
    assert_int_equal(f.before_reset, 1);
    /* 5 an hour, from noon: 80 left at 16:00 lasts past midnight; the next
     * day, whole, runs out at 20:00 */
    f = run_case(w, T0 + 12 * HOUR, T0 + 16 * HOUR, 1000, 12 * MIN, 3 * DAY,
                 T0 + DAY);
    assert_true(f.exhausted_at_ms > T0 + DAY);
    assert_int_equal(f.before_reset, 0);
    /* 3 an hour: 72 a day, never */
    f = run_case(w, T0, T0 + 4 * HOUR, 1000, 20 * MIN, 3 * DAY, T0 + DAY);
    assert_int_equal(f.exhausted_at_ms, 0);
}

static void test_session(void **state)
{
    (void)state;
    const char *w = "{ name: s, type: session, length: 5h, limit: 100 }";
    /* 30 an hour: out 3h20 into the session that the first charge opened */
    qg_forecast f = run_case(w, T0, T0 + HOUR, 1000, 2 * MIN, 12 * HOUR,
                             T0 + 5 * HOUR);
    assert_int_equal(f.before_reset, 1);
    /* 10 an hour: 50 a session, never */
    f = run_case(w, T0, T0 + HOUR, 1000, 6 * MIN, 16 * HOUR, 0);
    assert_int_equal(f.exhausted_at_ms, 0);
    /* a session opened at T0 by one charge, then 25 an hour from its
     * fifth hour: this session closes first, the next one (opened by the
     * next charge) runs out 4 hours into it */
    {
        sim s;
        qg_decision d;
        int64_t step = 12 * MIN / 5, t1 = T0 + 4 * HOUR + 30 * MIN;
        sim_open(&s, w, NULL);
        assert_true(charge(&s, 1000, T0));
        for (int64_t t = T0 + 4 * HOUR; t <= t1; t += step)
            assert_true(charge(&s, 1000, t));
        forecast_at(&s, t1, 1000, step, &f, &d);
        int64_t refused = first_refusal(&s, t1, 1000, step, t1 + 12 * HOUR);
        assert_true(refused > T0 + 5 * HOUR && f.exhausted_at_ms > 0);
        assert_true(f.exhausted_at_ms <= refused &&
                    f.exhausted_at_ms >= refused - step);
        assert_int_equal(f.before_reset, 0);
        sim_close(&s);
    }
}

static void test_rate(void **state)
{
    (void)state;
    const char *w = "{ name: r, type: rate, per: 1m, limit: 10, "
                    "unit: requests }";
    sim s;
    qg_forecast f;
    qg_decision d;
    /* 12 a minute against a refill of 10: the burst of 10 drains at 2 a
     * minute.  What is left reaches 0 at exhausted_at; a whole request
     * stops fitting when less than one is left: up to one request's
     * drain (30 s here) earlier, and a step */
    sim_open(&s, w, NULL);
    forecast_at(&s, T0, 1000, 5000, &f, &d);
    int64_t refused = first_refusal(&s, T0, 1000, 5000, T0 + HOUR);
    assert_true(refused > 0 && f.exhausted_at_ms > 0);
    if (f.exhausted_at_ms < refused - 5000 ||
        f.exhausted_at_ms > refused + 30000)
        fail_msg("rate: refused at t0 + %lld s, exhausted_at t0 + %lld s",
                 (long long)((refused - T0) / 1000),
                 (long long)((f.exhausted_at_ms - T0) / 1000));
    assert_int_equal(f.before_reset, 1);
    sim_close(&s);
    /* 8 a minute: the refill keeps up, never */
    sim_open(&s, w, NULL);
    forecast_at(&s, T0, 1000, 7500, &f, &d);
    assert_int_equal(f.exhausted_at_ms, 0);
    assert_int_equal(first_refusal(&s, T0, 1000, 7500, T0 + HOUR), 0);
    sim_close(&s);
}

static void test_concurrency_and_empty(void **state)
{
    (void)state;
    sim s;
    qg_forecast f;
    qg_decision d;
    sim_open(&s, "{ name: b, type: rolling, length: 5h, limit: 3 }",
             "    concurrency: 2\n");
    const qg_plan *p = &s.rules->plans[0];
    assert_int_equal(p->nwindows, 2);
    const qg_window_spec *conc = &p->windows[1];
    assert_int_equal(conc->type, QG_WIN_CONCURRENCY);
    /* one lease of two: a pace of requests says nothing about overlap */
    assert_true(charge(&s, 1000, T0));
    assert_int_equal(qg_engine_usage(s.eng, "u", T0 + 1, &d), 0);
    qg__forecast(conc, &d.views[1], d.recovery[1], 0, 0, 1000000, HOUR,
                 T0 + 1, &f);
    assert_int_equal(f.exhausted_at_ms, 0);
    /* both slots held: exhausted now, until a lease ends */
    assert_true(charge(&s, 1000, T0 + 2));
    assert_int_equal(qg_engine_usage(s.eng, "u", T0 + 3, &d), 0);
    qg__forecast(conc, &d.views[1], d.recovery[1], 0, 0, 0, HOUR, T0 + 3,
                 &f);
    assert_int_equal(f.exhausted_at_ms, T0 + 3);
    assert_int_equal(f.before_reset, 1);
    /* a rolling window with nothing left is exhausted now, whatever the
     * pace */
    assert_true(charge(&s, 1000, T0 + 4) == 0);  /* concurrency refuses */
    sim_close(&s);
    sim_open(&s, "{ name: b, type: rolling, length: 5h, limit: 3 }", NULL);
    assert_true(charge(&s, 3000, T0));
    assert_int_equal(qg_engine_usage(s.eng, "u", T0 + MIN, &d), 0);
    qg__forecast(&s.rules->plans[0].windows[0], &d.views[0], d.recovery[0],
                 d.nrecovery[0], 0, 0, HOUR, T0 + MIN, &f);
    assert_int_equal(f.exhausted_at_ms, T0 + MIN);
    assert_int_equal(f.before_reset, 1);
    assert_int_equal(f.per_hour_milli, 0);
    sim_close(&s);
}

static void test_rules_basis(void **state)
{
    (void)state;
    char text[1024], err[512];
    qg_rules *r;
    qg_diag dg;
    snprintf(text, sizeof text, rules_fmt,
             "{ name: b, type: rolling, length: 5h, limit: 3 }",
             "forecast: { basis: 3d }\n");
    r = tst_rules_parse(text);
    assert_int_equal(r->forecast_basis_ms, 3 * DAY);
    qg_rules_free(r);
    snprintf(text, sizeof text, rules_fmt,
             "{ name: b, type: rolling, length: 5h, limit: 3 }", "");
    r = tst_rules_parse(text);
    assert_int_equal(r->forecast_basis_ms, QG_FORECAST_DEFAULT_BASIS_MS);
    qg_rules_free(r);
    /* errors name the place: an unknown key, a basis out of range */
    static const struct {
        const char *extra, *want;
    } bad[] = {
        {"forecast: { basis: 7d, window: 5h }\n", "window"},
        {"forecast: { basis: 10m }\n", "1h to 90d"},
        {"forecast: { basis: 200d }\n", "1h to 90d"},
        {"forecast: { basis: soon }\n", "basis"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, rules_fmt,
                 "{ name: b, type: rolling, length: 5h, limit: 3 }",
                 bad[i].extra);
        r = NULL;
        assert_int_equal(qg__rules_parse(text, strlen(text), "t.yaml", NULL,
                                         NULL, &r, &dg), QG_ERULES);
        qg__diag_format(&dg, err, sizeof err);
        if (!strstr(err, bad[i].want) || !strstr(err, "t.yaml:11:"))
            fail_msg("%s -> %s", bad[i].extra, err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basis),
        cmocka_unit_test(test_rolling),
        cmocka_unit_test(test_calendar),
        cmocka_unit_test(test_session),
        cmocka_unit_test(test_rate),
        cmocka_unit_test(test_concurrency_and_empty),
        cmocka_unit_test(test_rules_basis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
