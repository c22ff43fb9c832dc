/* test_ledger_pg.c - the PostgreSQL ledger backend, called through its
 * method table (ledger_backend.h) against a real PostgreSQL 15 that the
 * group starts (tests/support/pgproc.h), each test in a fresh database:
 * every column round-trips (int64 extremes, 255-byte ids); the guards give
 * what the SQLite backend's tests assert (test_ledger.c: test_guards,
 * test_upsert), row by row and with a whole scenario in one batch, in
 * every way of sending a batch; a row the database cannot store (not
 * UTF-8) kept out alone; the spool mark is written with its batch or not
 * at all; schema versions (a newer one refused, two opens of a
 * fresh database at once migrate it once); an unreachable server at open,
 * a stopped or killed one later (QG_ELEDGER with a message) and the
 * reconnection after it returns; subjects, keys; scan order, the since
 * filter, scan_ids; two instances' writers that would have deadlocked on
 * the rollup's slots take turns, and a batch the server rolls back for a
 * deadlock is written again.  Without PostgreSQL's binaries every test
 * is skipped with a message saying so (make test installs them). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"
#include "pgproc.h"
#include "ports.h"

#define BASE_MS 1780000000000LL

static pgproc srv;
static int have_pg;
static const qg__ledger_backend *be = &qg__ledger_postgresql;

/* ------------------------------------------------------------ helpers */

#define NEED_PG()                                                         \
    do {                                                                  \
        if (!have_pg) {                                                   \
            print_message("PostgreSQL binaries not found (QG_PG_BIN or "  \
                          "/usr/lib/postgresql/15/bin): skipped\n");      \
            skip();                                                       \
        }                                                                 \
    } while (0)

static const qg_ledger_opts default_opts = {
    .sync = QG_LEDGER_DURABLE, .flush_ms = 100, .max_queue = 65536,
    .max_batch = 4096, .busy_timeout_ms = 5000};

/* A fresh database: its name and URL. */
typedef struct db {
    char name[64];
    char url[256];
} db;

static void fresh_db(db *d)
{
    if (pgproc_createdb(&srv, d->name, sizeof d->name) != 0)
        fail_msg("createdb: %s", srv.why);
    pgproc_url(&srv, d->name, d->url, sizeof d->url);
}

static void *open_ok(const char *url)
{
    char err[512];
    void *b = be->open(url, &default_opts, err, sizeof err);
    if (!b)
        fail_msg("open %s: %s", url, err);
    return b;
}

static void sql(const db *d, const char *q, char *out, size_t cap)
{
    if (pgproc_sql(&srv, d->name, q, out, cap) != 0)
        fail_msg("%s: %s", q, srv.why);
}

static long sql_long(const db *d, const char *q)
{
    char out[64];
    sql(d, q, out, sizeof out);
    return atol(out);
}

/* Write rows[0..n) as one batch; their refused flags into refused[]. */
static int write_rows(void *b, const qg_ledger_row *rows, size_t n,
                      const qg__spool_mark *mark, int *refused, char *why,
                      size_t cap)
{
    qg__ledger_item *it = calloc(n ? n : 1, sizeof *it);
    int rc;
    assert_non_null(it);
    for (size_t i = 0; i < n; i++)
        it[i].row = rows[i];
    why[0] = '\0';
    rc = be->rows->write_batch(b, it, n, mark, why, cap);
    for (size_t i = 0; i < n && refused; i++)
        refused[i] = it[i].refused;
    free(it);
    return rc;
}

static void write_ok(void *b, const qg_ledger_row *rows, size_t n)
{
    char why[512];
    int rc = write_rows(b, rows, n, NULL, NULL, why, sizeof why);
    if (rc != QG_OK)
        fail_msg("write_batch: %d %s", rc, why);
}

static void fill(char *dst, size_t cap, char c)
{
    memset(dst, c, cap - 1);
    dst[cap - 1] = '\0';
}

/* Row i of a generated set: created instants a permutation of i, with
 * ties (every value twice), so a scan's order is not the write order. */
#define NROWS 3000
static void make_row(int i, qg_ledger_row *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->request_id, sizeof r->request_id, "req-%06d", i);
    snprintf(r->subject, sizeof r->subject, "user%d", i % 37);
    if (i % 2)
        strcpy(r->org, "acme");
    strcpy(r->plan, i % 3 ? "free" : "max20");
    strcpy(r->rules_version, "2026-11-01");
    strcpy(r->weights_version, "w1");
    if (i % 4)
        strcpy(r->model, "standard");
    r->decision = i % 10 == 0 ? 2 : i % 97 == 0 ? 3 : 1;
    if (r->decision != 1)
        strcpy(r->window, "burst_5h");
    r->status = r->decision == 1 ? 1 + i % 4 : QG_ROW_REJECTED;
    r->estimated = i % 5 == 0;
    r->input_tokens = 1000 + i;
    r->output_tokens = 2 * i;
    r->reserved_milli = 5000 + i;
    r->weight_milli = 4000 + i;
    r->created_ms = BASE_MS + (int64_t)(((i * 7919) % NROWS) / 2) * 3;
    r->settled_ms = r->status >= 2 ? r->created_ms + 1500 : 0;
    r->headroom_milli = i % 7 == 0 ? 1000 + i : -1;
    if (r->headroom_milli >= 0) {
        r->overage_milli = 3000;
        r->overage_price_micro = 10000;
        r->overage_cost_micro = 30000 + i;
    }
    if (i % 11 == 0)
        strcpy(r->detail, "charged max_tokens");
    r->fallback = i % 13 == 0;
}

static void assert_row_eq(const qg_ledger_row *a, const qg_ledger_row *b)
{
    assert_string_equal(a->request_id, b->request_id);
    assert_string_equal(a->subject, b->subject);
    assert_string_equal(a->org, b->org);
    assert_string_equal(a->plan, b->plan);
    assert_string_equal(a->rules_version, b->rules_version);
    assert_string_equal(a->weights_version, b->weights_version);
    assert_string_equal(a->model, b->model);
    assert_string_equal(a->window, b->window);
    assert_int_equal(a->decision, b->decision);
    assert_int_equal(a->status, b->status);
    assert_int_equal(a->estimated, b->estimated);
    assert_true(a->input_tokens == b->input_tokens);
    assert_true(a->output_tokens == b->output_tokens);
    assert_true(a->reserved_milli == b->reserved_milli);
    assert_true(a->weight_milli == b->weight_milli);
    assert_true(a->created_ms == b->created_ms);
    assert_true(a->settled_ms == b->settled_ms);
    assert_true(a->overage_milli == b->overage_milli);
    assert_true(a->overage_price_micro == b->overage_price_micro);
    assert_true(a->overage_cost_micro == b->overage_cost_micro);
    assert_true(a->headroom_milli == b->headroom_milli);
    assert_string_equal(a->detail, b->detail);
    assert_int_equal(a->fallback, b->fallback);
}

/* every way of sending a batch: AUTO (rows one by one below
 * QG_PG_ARRAY_MIN, arrays from it), always arrays, always row by row */
#define NMODES 3
static const qg__pg_write_mode modes[NMODES] = {
    QG_PG_WRITE_AUTO, QG_PG_WRITE_ARRAYS, QG_PG_WRITE_PIPELINE};

/* ---------------------------------------------------- every column */

/* Rows at the edges: int64 extremes in every 64-bit field, int extremes
 * in the int ones, every text field full (255-byte ids and subjects). */
static void edge_row(int k, char tag, qg_ledger_row *r)
{
    const int64_t e[4] = {INT64_MIN, INT64_MAX, -1, 0};
    const int ie[4] = {INT_MIN, INT_MAX, -1, 0};
    memset(r, 0, sizeof *r);
    fill(r->request_id, sizeof r->request_id, 'a' + (char)k);
    r->request_id[0] = tag;
    fill(r->subject, sizeof r->subject, 's');
    fill(r->org, sizeof r->org, 'o');
    fill(r->plan, sizeof r->plan, 'p');
    fill(r->rules_version, sizeof r->rules_version, 'v');
    fill(r->weights_version, sizeof r->weights_version, 'w');
    fill(r->model, sizeof r->model, 'm');
    fill(r->window, sizeof r->window, 'x');
    fill(r->detail, sizeof r->detail, 'd');
    /* quotes, backslashes, braces, commas, UTF-8: nothing is escaped */
    {
        static const char odd[] = "\"{a,b}\\ \xc3\xa9";
        memcpy(r->detail, odd, sizeof odd - 1);
    }
    r->decision = ie[k];
    r->status = ie[(k + 1) % 4];
    r->estimated = ie[(k + 2) % 4];
    r->fallback = ie[(k + 3) % 4];
    r->input_tokens = e[k];
    r->output_tokens = e[(k + 1) % 4];
    r->reserved_milli = e[(k + 2) % 4];
    r->weight_milli = e[(k + 3) % 4];
    r->created_ms = e[k];
    r->settled_ms = e[(k + 1) % 4];
    r->overage_milli = e[(k + 2) % 4];
    r->overage_price_micro = e[(k + 3) % 4];
    r->overage_cost_micro = e[k];
    r->headroom_milli = e[(k + 1) % 4];
}

static void test_columns(void **state)
{
    qg_ledger_row rows[4], got;
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    for (int m = 0; m < NMODES; m++) {
        qg__pg_set_write_mode(b, modes[m]);
        for (int k = 0; k < 4; k++)
            edge_row(k, (char)('A' + m), &rows[k]);
        write_ok(b, rows, 4);
        for (int k = 0; k < 4; k++) {
            assert_int_equal(strlen(rows[k].request_id), 255);
            assert_int_equal(be->rows->get(b, rows[k].request_id, &got), 0);
            assert_row_eq(&got, &rows[k]);
        }
    }
    assert_int_equal(be->rows->get(b, "nope", &got), QG_ENOTFOUND);
    /* a generated set, every way */
    for (int m = 0; m < NMODES; m++) {
        qg_ledger_row *many = calloc(500, sizeof *many);
        assert_non_null(many);
        qg__pg_set_write_mode(b, modes[m]);
        for (int i = 0; i < 500; i++) {
            make_row(i, &many[i]);
            many[i].request_id[0] = (char)('A' + m);
        }
        write_ok(b, many, 500);
        for (int i = 0; i < 500; i += 7) {
            assert_int_equal(be->rows->get(b, many[i].request_id, &got), 0);
            assert_row_eq(&got, &many[i]);
        }
        free(many);
    }
    be->close(b);
}

/* ------------------------------------------------------------ guards */

/* One step of a scenario: a row written, and whether a guard refuses it
 * (test_ledger.c's assertions: QG_ESTATE there is `refused` here). */
typedef struct step {
    const char *id;            /* suffix of the request id */
    int settle;                /* a settle-only row */
    const char *subject;
    int decision, status;      /* whole rows */
    int64_t weight, settled;   /* weight_milli, settled_ms */
    int64_t overage, cost;     /* overage_milli, overage_cost_micro */
    int refused;
} step;

/* What a request id holds at the end. */
typedef struct want_t {
    const char *id;
    const char *subject;
    int decision, status;
    int64_t weight, reserved, settled;
    int64_t overage, price, cost, headroom;
    const char *plan;
} want_t;

typedef struct scenario {
    const char *name;
    step steps[10];
    want_t wants[4];
} scenario;

#define W(id_, subj_, dec_, st_, w_) \
    {id_, 0, subj_, dec_, st_, w_, 0, 0, 0, 0}
#define S(id_, subj_, w_, at_, refused_) \
    {id_, 1, subj_, 0, QG_ROW_COMPLETED, w_, at_, 0, 0, refused_}

static const scenario scenarios[] = {
    /* test_guards: the victim's request, admitted then settled at 7000;
     * the attacker's check row for the same id, a whole row of the same
     * subject over an admitted row, a settle naming another subject: kept
     * out; a repeated settle: not refused */
    {"admitted row",
     {W("v", "victim", 1, QG_ROW_RESERVED, 1000),
      S("v", "", 7000, 5, 0),
      {"v", 0, "attacker", 1, QG_ROW_RESERVED, 1000000, 0, 0, 0, 1},
      {"v", 0, "victim", 1, QG_ROW_COMPLETED, 1, 5, 0, 0, 1},
      S("v", "attacker", 0, 5, 1),
      S("v", "", 0, 5, 0),
      {NULL, 0, NULL, 0, 0, 0, 0, 0, 0, 0}},
     {{"v", "victim", 1, QG_ROW_COMPLETED, 7000, 1000, 5, 0, 0, 0, -1,
       "free"},
      {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}}},
    /* test_guards: a refused request decided again by its subject
     * (replaced), never by another */
    {"refused row",
     {W("r", "victim", 2, QG_ROW_REJECTED, 1000),
      {"r", 0, "attacker", 1, QG_ROW_RESERVED, 1000, 0, 0, 0, 1},
      W("r", "victim", 1, QG_ROW_RESERVED, 3000),
      {NULL, 0, NULL, 0, 0, 0, 0, 0, 0, 0}},
     {{"r", "victim", 1, QG_ROW_RESERVED, 3000, 1000, 0, 0, 0, 0, -1,
       "free"},
      {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}}},
    /* test_upsert: check then settle of the same subject; a settle whose
     * check row never reached the ledger (inserted whole); a settle's
     * overage columns written, the check's price and headroom kept */
    {"upsert",
     {W("c", "alice", 1, QG_ROW_RESERVED, 1000),
      S("c", "alice", 1234, 2500, 0),
      S("lone", "bob", 55, 10, 0),
      W("o", "carol", 1, QG_ROW_RESERVED, 1000),
      {"o", 1, "", 0, QG_ROW_COMPLETED, 9999, 5, 1234, 12340, 0},
      {NULL, 0, NULL, 0, 0, 0, 0, 0, 0, 0}},
     {{"c", "alice", 1, QG_ROW_COMPLETED, 1234, 1000, 2500, 0, 0, 0, -1,
       "free"},
      {"lone", "bob", 1, QG_ROW_COMPLETED, 55, 1000, 10, 0, 0, 0, -1,
       "free"},
      {"o", "carol", 1, QG_ROW_COMPLETED, 9999, 1000, 5, 1234, 777, 12340,
       500, "free"},
      {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}}},
    /* the settle's other guards (ledger_backend.h): a refused row is not
     * settled; a repeated settle of the same subject is not refused; a
     * settle of another subject over an unsettled row is */
    {"settle guards",
     {W("x", "dave", 2, QG_ROW_REJECTED, 1000),
      S("x", "dave", 5, 9, 1),
      W("y", "erin", 1, QG_ROW_RESERVED, 1000),
      S("y", "mallory", 5, 9, 1),
      S("y", "erin", 6, 9, 0),
      S("y", "erin", 7, 11, 0),
      {NULL, 0, NULL, 0, 0, 0, 0, 0, 0, 0}},
     {{"x", "dave", 2, QG_ROW_REJECTED, 1000, 1000, 0, 0, 0, 0, -1,
       "free"},
      {"y", "erin", 1, QG_ROW_COMPLETED, 6, 1000, 9, 0, 0, 0, -1, "free"},
      {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}}},
};

static void step_row(const char *prefix, const step *s, qg_ledger_row *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->request_id, sizeof r->request_id, "%s-%s", prefix, s->id);
    snprintf(r->subject, sizeof r->subject, "%s", s->subject);
    r->settle_only = s->settle;
    r->status = s->status;
    r->weight_milli = s->weight;
    r->settled_ms = s->settled;
    r->overage_milli = s->overage;
    r->overage_cost_micro = s->cost;
    r->headroom_milli = -1;
    if (!s->settle || strcmp(s->id, "lone") == 0) {
        strcpy(r->plan, "free");
        r->decision = s->settle ? 1 : s->decision;   /* lone: admitted */
        r->reserved_milli = 1000;
        r->created_ms = BASE_MS;
    }
    if (!s->settle && strcmp(s->id, "o") == 0) {
        /* the check of "o" prices overage */
        r->overage_price_micro = 777;
        r->headroom_milli = 500;
    }
}

static void check_want(void *b, const char *prefix, const want_t *w)
{
    qg_ledger_row got;
    char id[64];
    snprintf(id, sizeof id, "%s-%s", prefix, w->id);
    assert_int_equal(be->rows->get(b, id, &got), 0);
    assert_string_equal(got.subject, w->subject);
    assert_int_equal(got.decision, w->decision);
    assert_int_equal(got.status, w->status);
    assert_true(got.weight_milli == w->weight);
    assert_true(got.reserved_milli == w->reserved);
    assert_true(got.settled_ms == w->settled);
    assert_true(got.overage_milli == w->overage);
    assert_true(got.overage_price_micro == w->price);
    assert_true(got.overage_cost_micro == w->cost);
    assert_true(got.headroom_milli == w->headroom);
    assert_string_equal(got.plan, w->plan);
}

/* Every scenario six ways: each row its own batch or the whole scenario
 * one batch (rounds of unique ids), each way of sending (modes). */
static void test_guards(void **state)
{
    char why[512];
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    for (size_t sc = 0; sc < sizeof scenarios / sizeof scenarios[0]; sc++) {
        const scenario *s = &scenarios[sc];
        for (int way = 0; way < 2 * NMODES; way++) {
            qg_ledger_row rows[10];
            int refused[10], n = 0;
            char prefix[32];
            snprintf(prefix, sizeof prefix, "s%zu-w%d", sc, way);
            qg__pg_set_write_mode(b, modes[way % NMODES]);
            while (s->steps[n].id)
                n++;
            for (int i = 0; i < n; i++)
                step_row(prefix, &s->steps[i], &rows[i]);
            if (way < NMODES) {
                for (int i = 0; i < n; i++) {
                    assert_int_equal(write_rows(b, &rows[i], 1, NULL,
                                                &refused[i], why,
                                                sizeof why), 0);
                }
            } else {
                assert_int_equal(write_rows(b, rows, (size_t)n, NULL,
                                            refused, why, sizeof why), 0);
            }
            for (int i = 0; i < n; i++)
                if (refused[i] != s->steps[i].refused)
                    fail_msg("%s, way %d, step %d: refused %d, want %d",
                             s->name, way, i, refused[i],
                             s->steps[i].refused);
            for (int i = 0; s->wants[i].id; i++)
                check_want(b, prefix, &s->wants[i]);
        }
    }
    /* a batch of many rows, some stopped: RETURNING names the others
     * (arrays) or their command tags do (rows) */
    for (int m = 0; m < NMODES; m++) {
        qg_ledger_row rows[64];
        int refused[64];
        qg__pg_set_write_mode(b, modes[m]);
        for (int i = 0; i < 64; i++) {
            make_row(i + 1, &rows[i]);
            snprintf(rows[i].request_id, sizeof rows[i].request_id,
                     "many-%d-%d", m, i);
            strcpy(rows[i].subject, "owner");
            rows[i].decision = i % 2 ? 1 : 2;
        }
        assert_int_equal(write_rows(b, rows, 64, NULL, refused, why,
                                    sizeof why), 0);
        for (int i = 0; i < 64; i++) {
            assert_int_equal(refused[i], 0);
            rows[i].decision = 1;
            if (i % 4 == 2)
                strcpy(rows[i].subject, "other");
        }
        assert_int_equal(write_rows(b, rows, 64, NULL, refused, why,
                                    sizeof why), 0);
        for (int i = 0; i < 64; i++)
            if (refused[i] != (i % 4 != 0))
                fail_msg("mode %d, row %d: refused %d", m, i, refused[i]);
    }
    be->close(b);
}

/* A row whose text is not valid UTF-8 cannot be stored (the server
 * would refuse the statement, and the batch with it, each time it is
 * tried): it alone is not written, refused and logged. */
static char logged[2048];
static void log_line(void *ud, const char *line)
{
    (void)ud;
    snprintf(logged + strlen(logged), sizeof logged - strlen(logged),
             "%s\n", line);
}

static void test_not_utf8(void **state)
{
    qg_ledger_opts o = default_opts;
    qg_ledger_row rows[20], got;
    int refused[20];
    char why[512], err[512];
    db d;
    void *b;
    (void)state;
    NEED_PG();
    assert_true(qg__pg_utf8_ok("caf\xc3\xa9 \xf0\x9f\x98\x80", 10));
    assert_false(qg__pg_utf8_ok("\xff", 1));
    assert_false(qg__pg_utf8_ok("\xc0\xaf", 2));          /* overlong */
    assert_false(qg__pg_utf8_ok("\xed\xa0\x80", 3));      /* surrogate */
    assert_false(qg__pg_utf8_ok("\xf4\x90\x80\x80", 4));  /* > 10FFFF */
    assert_false(qg__pg_utf8_ok("\xe2\x82", 2));          /* cut short */
    fresh_db(&d);
    o.log = log_line;
    logged[0] = '\0';
    b = be->open(d.url, &o, err, sizeof err);
    if (!b)
        fail_msg("open: %s", err);
    for (int m = 0; m < NMODES; m++) {
        qg__pg_set_write_mode(b, modes[m]);
        for (int i = 0; i < 20; i++) {
            make_row(i + 1, &rows[i]);
            snprintf(rows[i].request_id, sizeof rows[i].request_id,
                     "u%d-%d", m, i);
        }
        rows[3].request_id[0] = (char)0xff;
        strcpy(rows[7].subject, "bad\xc3");
        assert_int_equal(write_rows(b, rows, 20, NULL, refused, why,
                                    sizeof why), 0);
        for (int i = 0; i < 20; i++) {
            assert_int_equal(refused[i], i == 3 || i == 7);
            assert_int_equal(be->rows->get(b, rows[i].request_id, &got),
                             i == 3 || i == 7 ? QG_ENOTFOUND : 0);
        }
    }
    if (!strstr(logged, "request_id is not valid UTF-8") ||
        !strstr(logged, "subject is not valid UTF-8"))
        fail_msg("not logged: \"%s\"", logged);
    be->close(b);
}

/* An item folded into another by the front (merged) is skipped and
 * shares its row's fate. */
static void test_merged(void **state)
{
    qg__ledger_item it[3];
    qg_ledger_row got;
    char why[512];
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    memset(it, 0, sizeof it);
    make_row(1, &it[0].row);
    it[1].row = it[0].row;           /* would be refused if written */
    strcpy(it[1].row.subject, "someone else");
    it[1].merged = 1;
    make_row(2, &it[2].row);
    assert_int_equal(be->rows->write_batch(b, it, 3, NULL, why, sizeof why),
                     0);
    assert_int_equal(it[1].refused, 0);
    assert_int_equal(be->rows->get(b, it[0].row.request_id, &got), 0);
    assert_row_eq(&got, &it[0].row);
    be->close(b);
}

/* ----------------------------------------------------------- the mark */

static void test_mark_atomic(void **state)
{
    qg__spool_mark mark = {"spool-a", 5};
    qg_ledger_row rows[3], got;
    char why[512];
    int64_t seq = -1;
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    /* a row the server refuses: model "boom" (a trigger of this test) */
    sql(&d, "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN IF NEW.model = 'boom' THEN"
            " RAISE EXCEPTION 'boom refused'; END IF; RETURN NEW; END $$",
        NULL, 0);
    sql(&d, "CREATE TRIGGER boom BEFORE INSERT OR UPDATE ON requests"
            " FOR EACH ROW EXECUTE FUNCTION boom()", NULL, 0);
    assert_int_equal(be->rows->spool_applied(b, "spool-a", &seq), 0);
    assert_true(seq == 0);
    for (int m = 0; m < NMODES; m++) {
        qg__pg_set_write_mode(b, modes[m]);
        for (int i = 0; i < 3; i++) {
            make_row(10 * m + i, &rows[i]);
        }
        mark.seq = 5 + 10 * m;
        assert_int_equal(write_rows(b, rows, 2, &mark, NULL, why,
                                    sizeof why), 0);
        assert_int_equal(be->rows->spool_applied(b, "spool-a", &seq), 0);
        assert_true(seq == mark.seq);
        /* a batch that fails (the server refuses a row) writes neither
         * its rows nor its mark */
        strcpy(rows[2].model, "boom");
        mark.seq = 9 + 10 * m;
        assert_int_equal(write_rows(b, rows + 2, 1, &mark, NULL, why,
                                    sizeof why), QG_EIO);
        assert_non_null(strstr(why, "boom refused"));
        assert_int_equal(be->rows->spool_applied(b, "spool-a", &seq), 0);
        assert_true(seq == 5 + 10 * m);
        assert_int_equal(be->rows->get(b, rows[2].request_id, &got),
                         QG_ENOTFOUND);
        /* and the connection is fine for the next batch */
        strcpy(rows[2].model, "standard");
        assert_int_equal(write_rows(b, rows + 2, 1, &mark, NULL, why,
                                    sizeof why), 0);
        assert_int_equal(be->rows->spool_applied(b, "spool-a", &seq), 0);
        assert_true(seq == 9 + 10 * m);
    }
    /* a mark with nothing else to write, and another spool's */
    mark.spool_id = "spool-b";
    mark.seq = INT64_MAX;
    assert_int_equal(write_rows(b, NULL, 0, &mark, NULL, why, sizeof why), 0);
    assert_int_equal(be->rows->spool_applied(b, "spool-b", &seq), 0);
    assert_true(seq == INT64_MAX);
    assert_int_equal(be->rows->spool_applied(b, "spool-a", &seq), 0);
    assert_true(seq == 9 + 10 * (NMODES - 1));
    be->close(b);
}

/* ------------------------------------------------------------ schema */

typedef struct opener {
    const char *url;
    pthread_barrier_t *go;
    void *b;
    char err[512];
} opener;

static void *open_thread(void *arg)
{
    opener *o = arg;
    pthread_barrier_wait(o->go);
    o->b = be->open(o->url, &default_opts, o->err, sizeof o->err);
    return NULL;
}

static void test_schema(void **state)
{
    char err[512], url[300];
    pthread_barrier_t go;
    pthread_t th[4];
    opener op[4];
    db d;
    void *b;
    (void)state;
    NEED_PG();
    assert_string_equal(be->name, "postgresql");
    assert_int_equal(be->version, QG_LEDGER_BACKEND_VERSION);
    assert_int_equal(be->shared, 1);

    /* several opens of a fresh database at once: all succeed, one
     * migrates */
    fresh_db(&d);
    pthread_barrier_init(&go, NULL, 4);
    for (int i = 0; i < 4; i++) {
        op[i].url = d.url;
        op[i].go = &go;
        op[i].b = NULL;
        assert_int_equal(pthread_create(&th[i], NULL, open_thread, &op[i]),
                         0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        if (!op[i].b)
            fail_msg("concurrent open %d: %s", i, op[i].err);
    }
    pthread_barrier_destroy(&go);
    for (int i = 0; i < 4; i++)
        be->close(op[i].b);
    assert_int_equal(sql_long(&d, "SELECT count(*) FROM quotagate_schema"),
                     QG_PG_SCHEMA_VERSION);
    assert_int_equal(sql_long(&d, "SELECT max(version) FROM"
                                  " quotagate_schema"),
                     QG_PG_SCHEMA_VERSION);
    /* opened again: nothing to do */
    b = open_ok(d.url);
    be->close(b);
    assert_int_equal(sql_long(&d, "SELECT count(*) FROM quotagate_schema"),
                     QG_PG_SCHEMA_VERSION);

    /* a database from a newer quotagate */
    sql(&d, "INSERT INTO quotagate_schema (version) VALUES (999)", NULL, 0);
    assert_null(be->open(d.url, &default_opts, err, sizeof err));
    if (!strstr(err, "999") || !strstr(err, "newer") ||
        !strstr(err, d.url))
        fail_msg("newer schema: \"%s\"", err);

    /* nothing listens: the URL (without its password) and libpq's
     * reason */
    snprintf(url, sizeof url, "postgresql://" PGPROC_USER
             ":sekrit@127.0.0.1:%d/nowhere?password=sekrit2&sslmode=disable",
             tst_free_port());
    assert_null(be->open(url, &default_opts, err, sizeof err));
    if (strstr(err, "sekrit") || !strstr(err, "postgresql://" PGPROC_USER
                                               "@127.0.0.1:") ||
        !strstr(err, "sslmode=disable") || !strstr(err, "refused"))
        fail_msg("unreachable: \"%s\"", err);
    /* a database that does not exist */
    snprintf(url, sizeof url, "postgresql://" PGPROC_USER
             "@127.0.0.1:%d/no_such_db", srv.port);
    assert_null(be->open(url, &default_opts, err, sizeof err));
    if (!strstr(err, "no_such_db") || !strstr(err, "does not exist"))
        fail_msg("no database: \"%s\"", err);
}

/* --------------------------------------------------- losing the server */

static void lose_and_return(void *b, int kill9, int base)
{
    qg_ledger_row r, got;
    qg_key_rec key;
    char why[512], err[512];
    int64_t seq;
    make_row(base, &r);
    write_ok(b, &r, 1);
    if (kill9)
        pgproc_kill(&srv);
    else
        pgproc_stop(&srv);
    make_row(base + 1, &r);
    assert_int_equal(write_rows(b, &r, 1, NULL, NULL, why, sizeof why),
                     QG_ELEDGER);
    if (!why[0])
        fail_msg("no message with QG_ELEDGER");
    print_message("server %s: write_batch: %s\n", kill9 ? "killed" : "stopped",
                  why);
    /* reads too, with their reason kept */
    assert_int_equal(be->rows->get(b, r.request_id, &got), QG_ELEDGER);
    be->rows->last_read_error(b, err, sizeof err);
    assert_true(err[0] != '\0');
    assert_int_equal(be->rows->spool_applied(b, "s", &seq), QG_ELEDGER);
    assert_int_equal(be->keys->get(b, "k", &key), QG_ELEDGER);
    if (pgproc_restart(&srv) != 0)
        fail_msg("restart: %s", srv.why);
    /* the next calls reconnect */
    write_ok(b, &r, 1);
    assert_int_equal(be->rows->get(b, r.request_id, &got), 0);
    assert_row_eq(&got, &r);
    make_row(base, &r);
    assert_int_equal(be->rows->get(b, r.request_id, &got), 0);
    assert_row_eq(&got, &r);
    assert_int_equal(be->keys->get(b, "k", &key),
                     QG_ENOTFOUND);
}

static int count_row(const qg_ledger_row *r, void *ud)
{
    (void)r;
    ++*(int *)ud;
    return 0;
}

static int count_id(const char *id, size_t len, void *ud)
{
    (void)id;
    (void)len;
    ++*(int *)ud;
    return 0;
}

static void test_reconnect(void **state)
{
    qg_ledger_row r, got;
    qg_key_rec key;
    int n = 0;
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    /* every connection in use before the server goes */
    make_row(100, &r);
    write_ok(b, &r, 1);
    assert_int_equal(be->rows->get(b, r.request_id, &got), 0);
    assert_int_equal(be->rows->scan(b, 0, count_row, &n), 0);
    assert_int_equal(be->keys->get(b, "k", &key),
                     QG_ENOTFOUND);
    lose_and_return(b, 0, 200);
    lose_and_return(b, 1, 300);
    /* a restart between two calls is not even seen: the old connections
     * die, the next calls make new ones */
    pgproc_stop(&srv);
    if (pgproc_restart(&srv) != 0)
        fail_msg("restart: %s", srv.why);
    make_row(400, &r);
    write_ok(b, &r, 1);
    n = 0;
    assert_int_equal(be->rows->scan_ids(b, count_id, &n), 0);
    assert_int_equal(n, 6);      /* 100, 200, 201, 300, 301, 400 */
    be->close(b);
}

/* ------------------------------------------------ subjects and keys */

typedef struct subj_ck {
    int n;
    char names[4][32], plans[4][32], orgs[4][32];
    int64_t anchors[4];
} subj_ck;

static int collect_subject(const char *subject, const char *plan,
                           const char *org, int64_t anchor_ms, void *ud)
{
    subj_ck *c = ud;
    assert_true(c->n < 4);
    snprintf(c->names[c->n], 32, "%s", subject);
    snprintf(c->plans[c->n], 32, "%s", plan);
    snprintf(c->orgs[c->n], 32, "%s", org);
    c->anchors[c->n++] = anchor_ms;
    return 0;
}

static void test_subjects(void **state)
{
    const qg__ledger_subjects_ops *s = be->subjects;
    char plan[64], org[64];
    int64_t anchor = 0;
    subj_ck c;
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    assert_int_equal(s->put(b, "bob", "free", "", 0, BASE_MS), 0);
    assert_int_equal(s->put(b, "alice", "free", "acme", BASE_MS - 5,
                            BASE_MS), 0);
    assert_int_equal(s->put(b, "alice", "max20", "acme", BASE_MS - 7,
                            BASE_MS + 10), 0);
    assert_int_equal(s->get(b, "alice", plan, sizeof plan, org, sizeof org,
                            &anchor), 0);
    assert_string_equal(plan, "max20");
    assert_string_equal(org, "acme");
    assert_true(anchor == BASE_MS - 7);
    assert_int_equal(s->get(b, "carol", plan, sizeof plan, org, sizeof org,
                            &anchor), QG_ENOTFOUND);
    be->close(b);

    /* another instance sees them */
    b = open_ok(d.url);
    memset(&c, 0, sizeof c);
    assert_int_equal(s->scan_since(b, 0, collect_subject, &c), 0);
    assert_int_equal(c.n, 2);
    assert_string_equal(c.names[0], "alice");
    assert_string_equal(c.plans[0], "max20");
    assert_string_equal(c.orgs[0], "acme");
    assert_true(c.anchors[0] == BASE_MS - 7);
    assert_string_equal(c.names[1], "bob");
    assert_string_equal(c.orgs[1], "");
    assert_true(c.anchors[1] == 0);
    /* since: only what changed at or after it */
    memset(&c, 0, sizeof c);
    assert_int_equal(s->scan_since(b, BASE_MS + 10, collect_subject, &c), 0);
    assert_int_equal(c.n, 1);
    assert_string_equal(c.names[0], "alice");
    memset(&c, 0, sizeof c);
    assert_int_equal(s->scan_since(b, BASE_MS + 11, collect_subject, &c), 0);
    assert_int_equal(c.n, 0);
    be->close(b);
}

static int collect_key(const qg_key_rec *k, void *ud)
{
    qg_key_rec *out = ud;
    int i;
    for (i = 0; out[i].id[0]; i++)
        ;
    assert_true(i < 3);
    out[i] = *k;
    return 0;
}

static void test_keys(void **state)
{
    const qg__ledger_keys_ops *ko = be->keys;
    qg_key_rec k, got, list[4];
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    memset(&k, 0, sizeof k);
    strcpy(k.id, "ba9876543210");       /* created later, listed second */
    strcpy(k.role, "admin");
    k.created_ms = BASE_MS + 1;
    assert_int_equal(ko->put(b, &k), 0);
    memset(&k, 0, sizeof k);
    strcpy(k.id, "0123456789ab");
    strcpy(k.subject, "alice");
    strcpy(k.role, "subject");
    for (int i = 0; i < 32; i++)
        k.hash[i] = (unsigned char)(i * 7);   /* zero bytes, high bytes */
    k.created_ms = BASE_MS;
    assert_int_equal(ko->put(b, &k), 0);
    assert_int_equal(ko->put(b, &k), QG_ESTATE);

    assert_int_equal(ko->get(b, "0123456789ab", &got), 0);
    assert_string_equal(got.subject, "alice");
    assert_string_equal(got.role, "subject");
    assert_memory_equal(got.hash, k.hash, 32);
    assert_true(got.created_ms == BASE_MS);
    assert_true(got.revoked_ms == 0);
    assert_int_equal(ko->get(b, "ffffffffffff", &got), QG_ENOTFOUND);

    assert_int_equal(ko->revoke(b, "0123456789ab", BASE_MS + 10), 0);
    assert_int_equal(ko->revoke(b, "0123456789ab", BASE_MS + 20), 0);
    assert_int_equal(ko->revoke(b, "ffffffffffff", BASE_MS), QG_ENOTFOUND);
    be->close(b);

    b = open_ok(d.url);
    memset(list, 0, sizeof list);
    assert_int_equal(ko->list(b, collect_key, list), 0);
    assert_string_equal(list[0].id, "0123456789ab");
    assert_true(list[0].revoked_ms == BASE_MS + 10);
    assert_memory_equal(list[0].hash, k.hash, 32);
    assert_string_equal(list[1].id, "ba9876543210");
    assert_string_equal(list[1].role, "admin");
    assert_string_equal(list[1].subject, "");
    assert_true(list[1].revoked_ms == 0);
    assert_string_equal(list[2].id, "");
    be->close(b);
}

/* -------------------------------------------------------------- scans */

typedef struct scan_ck {
    int n;
    int64_t last_ms;
    int last_i;
    unsigned char *seen;
} scan_ck;

static int check_scanned(const qg_ledger_row *r, void *ud)
{
    scan_ck *c = ud;
    qg_ledger_row want;
    int i;
    assert_int_equal(sscanf(r->request_id, "req-%d", &i), 1);
    assert_true(i >= 0 && i < NROWS);
    make_row(i, &want);
    assert_row_eq(r, &want);
    assert_int_equal(r->decision, 1);
    /* created order; a tie in the order the rows were written */
    assert_true(r->created_ms > c->last_ms ||
                (r->created_ms == c->last_ms && i > c->last_i));
    assert_false(c->seen[i]);
    c->seen[i] = 1;
    c->last_ms = r->created_ms;
    c->last_i = i;
    c->n++;
    return 0;
}

static int stop_after_3(const qg_ledger_row *r, void *ud)
{
    (void)r;
    return ++*(int *)ud == 3 ? 42 : 0;
}

static int seen_id(const char *id, size_t len, void *ud)
{
    scan_ck *c = ud;
    char buf[32];
    int i;
    assert_true(len < sizeof buf);
    memcpy(buf, id, len);
    buf[len] = '\0';
    assert_int_equal(sscanf(buf, "req-%d", &i), 1);
    assert_true(i >= 0 && i < NROWS);
    assert_false(c->seen[i]);
    c->seen[i] = 1;
    c->n++;
    return 0;
}

static void test_scan(void **state)
{
    qg_ledger_row *rows = calloc(NROWS, sizeof *rows);
    scan_ck ck = {0, 0, -1, calloc(NROWS, 1)};
    int allowed = 0, since_count = 0, n = 0;
    int64_t since = BASE_MS + (int64_t)(NROWS / 4) * 3;
    db d;
    void *b;
    (void)state;
    NEED_PG();
    assert_non_null(rows);
    assert_non_null(ck.seen);
    fresh_db(&d);
    b = open_ok(d.url);
    /* in batches of every size, each sent another way */
    for (int i = 0, k = 1, m = 0; i < NROWS;
         i += k, k = k * 4 % 1023, m = (m + 1) % NMODES) {
        int cnt = i + k > NROWS ? NROWS - i : k;
        for (int j = 0; j < cnt; j++) {
            make_row(i + j, &rows[i + j]);
            allowed += rows[i + j].decision == 1;
            since_count += rows[i + j].decision == 1 &&
                           rows[i + j].created_ms >= since;
        }
        qg__pg_set_write_mode(b, modes[m]);
        write_ok(b, rows + i, (size_t)cnt);
    }
    assert_int_equal(be->rows->scan(b, 0, check_scanned, &ck), 0);
    assert_int_equal(ck.n, allowed);
    memset(ck.seen, 0, NROWS);
    ck.n = 0;
    ck.last_ms = 0;
    ck.last_i = -1;
    assert_int_equal(be->rows->scan(b, since, check_scanned, &ck), 0);
    assert_int_equal(ck.n, since_count);
    assert_int_equal(be->rows->scan(b, 0, stop_after_3, &n), 42);
    assert_int_equal(n, 3);
    n = 0;
    assert_int_equal(be->rows->scan(b, INT64_MAX, stop_after_3, &n), 0);
    assert_int_equal(n, 0);
    /* after a stopped scan the connection scans again */
    n = 0;
    assert_int_equal(be->rows->scan(b, since, count_row, &n), 0);
    assert_int_equal(n, since_count);
    /* every id, refused rows too */
    memset(ck.seen, 0, NROWS);
    ck.n = 0;
    assert_int_equal(be->rows->scan_ids(b, seen_id, &ck), 0);
    assert_int_equal(ck.n, NROWS);
    be->close(b);
    free(ck.seen);
    free(rows);
}

/* ------------------------------------------------------------- group */

/* A database written by the first schema (version 1: rows, subjects,
 * keys, spool marks) is migrated at open to this build's version with its
 * rows kept: the webhook outbox's tables appear, and the history's
 * rollup is filled from the rows already there. */
static void test_migrate_from_1(void **state)
{
    qg_ledger_row rows[200];
    db d;
    void *b;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    b = open_ok(d.url);
    for (int i = 0; i < 200; i++)
        make_row(i, &rows[i]);
    write_ok(b, rows, 200);
    be->close(b);
    /* back to version 1: what versions 2 and 3 added, dropped */
    sql(&d, "DROP TRIGGER requests_slots_insert ON requests;"
            "DROP TRIGGER requests_slots_update ON requests;"
            "DROP FUNCTION qg_slots_insert(); DROP FUNCTION qg_slots_update();"
            "DROP TABLE usage_slots; DROP INDEX requests_subject;"
            "DROP TABLE webhook_outbox; DROP TABLE notify_marks;"
            "DELETE FROM quotagate_schema WHERE version > 1", NULL, 0);
    assert_int_equal(sql_long(&d, "SELECT max(version) FROM "
                                  "quotagate_schema"), 1);
    b = open_ok(d.url);
    be->close(b);
    assert_int_equal(sql_long(&d, "SELECT max(version) FROM "
                                  "quotagate_schema"), QG_PG_SCHEMA_VERSION);
    assert_int_equal(sql_long(&d, "SELECT count(*) FROM requests"), 200);
    assert_int_equal(sql_long(&d, "SELECT count(*) FROM notify_marks"), 0);
    /* the rollup holds what the rows hold */
    assert_int_equal(sql_long(&d, "SELECT coalesce(sum(requests), 0) FROM "
                                  "usage_slots"), 200);
    assert_int_equal(sql_long(&d, "SELECT coalesce(sum(weight_milli), 0) "
                                  "FROM usage_slots"),
                     sql_long(&d, "SELECT coalesce(sum(weight_milli), 0) "
                                  "FROM requests WHERE decision = 1"));
}

/* Rows of usage_slots that differ from the rollup recomputed from the
 * rows (either side missing counts). */
static long slots_off(const db *d)
{
    return sql_long(d,
        "SELECT count(*) FROM (SELECT subject,"
        " created_ms - created_ms % 900000 AS slot_ms, model,"
        " coalesce(sum(weight_milli) FILTER (WHERE decision = 1), 0) AS w,"
        " count(*) FILTER (WHERE decision = 1) AS a, count(*) AS n,"
        " count(*) FILTER (WHERE decision <> 1) AS x FROM requests"
        " GROUP BY 1, 2, 3) r FULL JOIN usage_slots u"
        " USING (subject, slot_ms, model)"
        " WHERE r.w IS DISTINCT FROM u.weight_milli"
        " OR r.a IS DISTINCT FROM u.admitted"
        " OR r.n IS DISTINCT FROM u.requests"
        " OR r.x IS DISTINCT FROM u.refused");
}

/* Lines logged by writers on several threads. */
static pthread_mutex_t logged_mu = PTHREAD_MUTEX_INITIALIZER;
static void log_line_locked(void *ud, const char *line)
{
    pthread_mutex_lock(&logged_mu);
    log_line(ud, line);
    pthread_mutex_unlock(&logged_mu);
}

/* A backend on d whose lines go to `logged` (emptied first). */
static void *open_logging(const db *d)
{
    qg_ledger_opts o = default_opts;
    char err[512];
    void *b;
    o.log = log_line_locked;
    logged[0] = '\0';
    if (!(b = be->open(d->url, &o, err, sizeof err)))
        fail_msg("open: %s", err);
    return b;
}

/* A row of subject s<subj> in quarter hour `slot`, model "standard". */
static void slot_row(const char *id, int subj, int slot, qg_ledger_row *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->request_id, sizeof r->request_id, "%s", id);
    snprintf(r->subject, sizeof r->subject, "s%d", subj);
    strcpy(r->plan, "pro");
    strcpy(r->model, "standard");
    r->decision = 1;
    r->status = 1;
    r->reserved_milli = 2000;
    r->weight_milli = 2000;
    r->headroom_milli = -1;
    r->created_ms = BASE_MS + (int64_t)slot * 900000;
}

/* One batch written on its own thread. */
typedef struct one_write {
    void *b;
    qg_ledger_row rows[3];
    size_t n;
    int rc;
    char why[512];
} one_write;

static void *write_one(void *arg)
{
    one_write *w = arg;
    w->rc = write_rows(w->b, w->rows, w->n, NULL, NULL, w->why,
                       sizeof w->why);
    return NULL;
}

static void exec_ok(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", q, PQerrorMessage(c));
    PQclear(r);
}

/* Another session on d, in a transaction begun with `first`, then
 * `lock` run in it. */
static PGconn *outside_session(const db *d, const char *first,
                               const char *lock)
{
    PGconn *x = PQconnectdb(d->url);
    assert_int_equal(PQstatus(x), CONNECTION_OK);
    exec_ok(x, "BEGIN");
    if (first)
        exec_ok(x, first);
    exec_ok(x, lock);
    return x;
}

/* Wait (bounded) until `want` sessions of d's database wait for a lock
 * (a row's, or a subject's). */
static void await_lock_waits(const db *d, long want)
{
    for (int i = 0; i < 1000; i++) {
        if (sql_long(d, "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()") >= want)
            return;
        usleep(10000);
    }
    fail_msg("%ld writers did not come to wait for a lock", want);
}

/* Two instances' writers on one database, one statement per row, each
 * row moving its subject's slot: A writes rows of subjects s1, s3, s2, B
 * of s2, s1.  Another session holds s3's slot: A took s1's and waits; B
 * took s2's and waits for A's s1.  When s3 is let go, A asks for s2's:
 * each waited for the other, PostgreSQL found the deadlock after
 * deadlock_timeout and rolled one batch back (pg_bench's two instances on
 * one database lost a second to each).  Now each writer locks its batch's
 * subjects first, in one order: B waits for A's commit, no batch is
 * rolled back (the writer logs each one it writes again), both are
 * acknowledged, and the rollup matches the rows. */
static void test_two_writers(void **state)
{
    qg_ledger_row seed[3];
    one_write w[2];
    pthread_t th[2];
    PGconn *x;
    db d;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].b = open_logging(&d);
        qg__pg_set_write_mode(w[i].b, QG_PG_WRITE_PIPELINE);
    }
    for (int i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "seed-%d", i + 1);
        slot_row(id, i + 1, 0, &seed[i]);
    }
    write_ok(w[0].b, seed, 3);
    slot_row("a-1", 1, 0, &w[0].rows[0]);
    slot_row("a-3", 3, 0, &w[0].rows[1]);
    slot_row("a-2", 2, 0, &w[0].rows[2]);
    slot_row("b-2", 2, 0, &w[1].rows[0]);
    slot_row("b-1", 1, 0, &w[1].rows[1]);
    w[0].n = 3;
    w[1].n = 2;
    /* another session holds s3's slot until both writers wait */
    x = outside_session(&d, NULL, "SELECT 1 FROM usage_slots"
                                  " WHERE subject = 's3' FOR UPDATE");
    assert_int_equal(pthread_create(&th[0], NULL, write_one, &w[0]), 0);
    await_lock_waits(&d, 1);
    assert_int_equal(pthread_create(&th[1], NULL, write_one, &w[1]), 0);
    await_lock_waits(&d, 2);
    exec_ok(x, "COMMIT");
    PQfinish(x);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        if (w[i].rc != QG_OK)
            fail_msg("writer %d: %s", i, w[i].why);
        be->close(w[i].b);
    }
    if (strstr(logged, "rolled back"))
        fail_msg("a batch was rolled back: %s", logged);
    assert_int_equal(sql_long(&d, "SELECT count(*) FROM requests"), 8);
    assert_int_equal(slots_off(&d), 0);
}

/* A batch the server rolls back for a deadlock with another session (one
 * that does not lock subjects first: here a session holding a slot and
 * then asking for the subject's lock the writer holds) is written again
 * and acknowledged, and the writer logs it. */
static void test_rolled_back_written_again(void **state)
{
    qg_ledger_row first, got;
    one_write w;
    pthread_t th;
    PGconn *x;
    db d;
    (void)state;
    NEED_PG();
    fresh_db(&d);
    memset(&w, 0, sizeof w);
    w.b = open_logging(&d);
    slot_row("first", 1, 0, &first);
    write_ok(w.b, &first, 1);
    slot_row("second", 1, 0, &w.rows[0]);
    w.n = 1;
    /* the other session holds the slot the writer's row moves, and will
     * not be the one PostgreSQL picks to roll back */
    x = outside_session(&d, "SET LOCAL deadlock_timeout = '60s'",
                        "SELECT 1 FROM usage_slots FOR UPDATE");
    assert_int_equal(pthread_create(&th, NULL, write_one, &w), 0);
    /* the writer waits for the slot, holding its subject's lock */
    await_lock_waits(&d, 1);
    /* the cycle: PostgreSQL rolls the writer's batch back; then this
     * session has the lock, and lets go of everything */
    exec_ok(x, "SELECT pg_advisory_xact_lock(" QG_PG_SUBJECT_LOCKS
               ", hashtext('s1'))");
    exec_ok(x, "ROLLBACK");
    PQfinish(x);
    pthread_join(th, NULL);
    if (w.rc != QG_OK)
        fail_msg("the batch failed: %s", w.why);
    if (!strstr(logged, "rolled back a batch of 1 rows for a deadlock "
                        "(SQLSTATE 40P01); writing it again (try 2)"))
        fail_msg("not logged: \"%s\"", logged);
    assert_int_equal(be->rows->get(w.b, "second", &got), QG_OK);
    be->close(w.b);
    assert_int_equal(slots_off(&d), 0);
}

static int group_setup(void **state)
{
    (void)state;
    if (!pgproc_bindir()) {
        fprintf(stderr, "test_ledger_pg: PostgreSQL binaries not found "
                "(QG_PG_BIN or /usr/lib/postgresql/15/bin): every test is "
                "skipped (make test installs Debian's postgresql)\n");
        return 0;
    }
    if (pgproc_start(&srv) != 0) {
        fprintf(stderr, "test_ledger_pg: PostgreSQL would not start: %s\n",
                srv.why);
        return -1;
    }
    have_pg = 1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pgproc_destroy(&srv);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_columns),
        cmocka_unit_test(test_guards),
        cmocka_unit_test(test_merged),
        cmocka_unit_test(test_not_utf8),
        cmocka_unit_test(test_mark_atomic),
        cmocka_unit_test(test_schema),
        cmocka_unit_test(test_migrate_from_1),
        cmocka_unit_test(test_subjects),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_reconnect),
        cmocka_unit_test(test_two_writers),
        cmocka_unit_test(test_rolled_back_written_again),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
