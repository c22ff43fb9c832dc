/* test_ledger_history.c - the ledger's history reads on SQLite and on a
 * real PostgreSQL (tests/support/pgproc): the rollup usage_slots (kept by
 * the SQLite writer's sums per batch, by PostgreSQL's triggers) is
 * checked against an aggregation the test makes of the rows the ledger
 * holds (every row read back), after
 * inserts, settles that change the weight, refusals decided again
 * (another instant, another model, allowed) and rows spread over many
 * slots and subjects; the first usage; the latest rows: newest first,
 * limit, before, ties; a ledger of schema 4 migrated with rows in it
 * (SQLite: the rollup filled from them); SQLite's recent slots kept
 * apart from the older ones (schema 11) as quarter hours pass; and
 * SQLite's subject_rows filled in slices of subjects (schema 12), read
 * the same in the middle of a round, across a reopen. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledgerdb.h"
#include "pgproc.h"

#define BASE_MS INT64_C(1767225600000)     /* 2026-01-01T00:00:00Z */
#define SLOT QG_LEDGER_SLOT_MS

static pgproc PG;
static int on_pg;

typedef ledgerdb tmpdb;

static void tmpdb_make(tmpdb *t)
{
    ledgerdb_make(t, on_pg ? &PG : NULL, "qghist");
}

static void tmpdb_remove(tmpdb *t)
{
    ledgerdb_remove(t);
}

/* What the ledger reports goes to the test's log. */
static void log_line(void *ud, const char *line)
{
    (void)ud;
    fprintf(stderr, "ledger: %s\n", line);
}

static qg_ledger *open_ok(const char *url)
{
    char err[512];
    qg_ledger_opts o = {0};
    o.sync = QG_LEDGER_DURABLE;
    o.log = log_line;
    qg_ledger *l = qg__ledger_open(url, &o, err, sizeof err);
    if (!l)
        fail_msg("open %s: %s", url, err);
    return l;
}

typedef struct counter {
    atomic_int n;
} counter;

static void count_done(void *arg, int rc)
{
    counter *c = arg;
    if (rc != 0)
        fprintf(stderr, "a row failed: %s\n", qg_strerror(rc));
    else
        atomic_fetch_add(&c->n, 1);
}

static void wait_done(counter *c, int n)
{
    struct timespec ts = {0, 1000000L};
    for (int i = 0; i < 30000 && atomic_load(&c->n) < n; i++)
        nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&c->n), n);
}

static void submit_all(qg_ledger *l, qg_ledger_row *rows, int n)
{
    counter c = {0};
    for (int i = 0; i < n; i++)
        assert_int_equal(qg__ledger_submit(l, &rows[i], count_done, &c), 0);
    wait_done(&c, n);
}

/* A small deterministic generator (the test's rows differ per seed). */
static uint64_t rng = 88172645463325252ULL;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const char *const MODELS[] = {"", "light", "standard"};

static void make_row(qg_ledger_row *r, int i, const char *subject)
{
    memset(r, 0, sizeof *r);
    snprintf(r->request_id, sizeof r->request_id, "h-%s-%06d", subject, i);
    snprintf(r->subject, sizeof r->subject, "%s", subject);
    strcpy(r->plan, "free");
    strcpy(r->rules_version, "v1");
    strcpy(r->weights_version, "w1");
    strcpy(r->model, MODELS[next_rand() % 3]);
    r->decision = next_rand() % 5 == 0 ? 2 : 1;
    if (r->decision != 1)
        strcpy(r->window, "burst");
    r->status = r->decision == 1 ? QG_ROW_RESERVED : QG_ROW_REJECTED;
    r->input_tokens = (int64_t)(next_rand() % 5000);
    r->output_tokens = (int64_t)(next_rand() % 900);
    r->reserved_milli = 1000 + (int64_t)(next_rand() % 20000);
    r->weight_milli = r->decision == 1 ? r->reserved_milli : 0;
    /* spread over three days, some on slot boundaries */
    r->created_ms = BASE_MS + (int64_t)(next_rand() % (3 * 96)) * SLOT +
                    (next_rand() % 4 == 0 ? 0 : (int64_t)(next_rand() % SLOT));
    r->headroom_milli = -1;
}

/* ------------------------------------------------ the test's oracle */

#define MAXSLOTS 4096
typedef struct agg {
    qg_usage_slot s[MAXSLOTS];
    int n;
} agg;

static qg_usage_slot *agg_at(agg *a, int64_t start, const char *model)
{
    for (int i = 0; i < a->n; i++)
        if (a->s[i].start_ms == start && strcmp(a->s[i].model, model) == 0)
            return &a->s[i];
    assert_true(a->n < MAXSLOTS);
    memset(&a->s[a->n], 0, sizeof a->s[0]);
    a->s[a->n].start_ms = start;
    snprintf(a->s[a->n].model, sizeof a->s[0].model, "%s", model);
    return &a->s[a->n++];
}

static int add_row(const qg_ledger_row *r, void *ud)
{
    qg_usage_slot *s = agg_at(ud, r->created_ms - r->created_ms % SLOT,
                              r->model);
    s->requests++;
    if (r->decision == 1) {
        s->admitted++;
        s->weight_milli += r->weight_milli;
    } else {
        s->refused++;
    }
    return 0;
}

static int add_slot(const qg_usage_slot *sl, void *ud)
{
    agg *a = ud;
    /* ascending start, then model */
    if (a->n > 0) {
        const qg_usage_slot *p = &a->s[a->n - 1];
        assert_true(p->start_ms < sl->start_ms ||
                    (p->start_ms == sl->start_ms &&
                     strcmp(p->model, sl->model) < 0));
    }
    assert_true(a->n < MAXSLOTS);
    a->s[a->n++] = *sl;
    return 0;
}

/* The ledger's rollup of subject in [from, to) equals the aggregation of
 * its rows (slots whose counts went back to zero are left out). */
static void check_rollup(qg_ledger *l, const char *subject, int64_t from,
                         int64_t to, int64_t *nrows)
{
    static agg want, got;
    want.n = got.n = 0;
    /* every row, read back from the ledger itself */
    assert_int_equal(qg__ledger_latest(l, subject, INT64_MAX, 1000000,
                                       add_row, &want), 0);
    assert_int_equal(qg__ledger_slots(l, subject, from, to, add_slot, &got),
                     0);
    int64_t rows = 0, m = 0;
    for (int i = 0; i < want.n; i++) {
        const qg_usage_slot *w = &want.s[i];
        if (w->start_ms < from || w->start_ms >= to)
            continue;
        rows += w->requests;
        const qg_usage_slot *g = NULL;
        for (int k = 0; k < got.n; k++)
            if (got.s[k].start_ms == w->start_ms &&
                strcmp(got.s[k].model, w->model) == 0)
                g = &got.s[k];
        if (!g)
            fail_msg("slot %lld/%s missing", (long long)w->start_ms,
                     w->model);
        assert_int_equal(g->weight_milli, w->weight_milli);
        assert_int_equal(g->admitted, w->admitted);
        assert_int_equal(g->requests, w->requests);
        assert_int_equal(g->refused, w->refused);
        m++;
    }
    for (int k = 0; k < got.n; k++)
        if (got.s[k].requests != 0)
            m--;
    assert_int_equal(m, 0);     /* no slot the rows do not explain */
    if (nrows)
        *nrows = rows;
}

/* ------------------------------------------------------------ tests */

#define N 1500

static void test_rollup_follows_rows(void **state)
{
    (void)state;
    tmpdb t;
    tmpdb_make(&t);
    qg_ledger *l = open_ok(t.path);
    qg_ledger_row *rows = calloc(N, sizeof *rows);
    int64_t counted = 0, first = 0;
    uint64_t seed = rng;        /* stage 3 makes the same rows again */
    assert_non_null(rows);

    assert_int_equal(qg__ledger_first_usage(l, "alice", &first),
                     QG_ENOTFOUND);
    for (int i = 0; i < N; i++)
        make_row(&rows[i], i, i % 3 ? "alice" : "bob");
    submit_all(l, rows, N);
    check_rollup(l, "alice", 0, INT64_MAX, &counted);
    assert_true(counted > 900);
    check_rollup(l, "bob", 0, INT64_MAX, NULL);

    /* settles: the weight of admitted rows changes (up and down) */
    int nset = 0;
    for (int i = 0; i < N; i++) {
        if (rows[i].decision != 1 || i % 2)
            continue;
        qg_ledger_row s = rows[i];
        s.settle_only = 1;
        s.status = QG_ROW_COMPLETED;
        s.weight_milli = i % 4 ? 0 : rows[i].reserved_milli * 3;
        s.settled_ms = s.created_ms + 1000;
        rows[nset++] = s;
    }
    submit_all(l, rows, nset);

    /* refusals decided again: allowed, later, with another model */
    qg_ledger_row *again = calloc(N, sizeof *again);
    int nagain = 0;
    assert_non_null(again);
    rng = seed;
    for (int i = 0; i < N; i++) {
        qg_ledger_row r;
        make_row(&r, i, i % 3 ? "alice" : "bob");
        if (r.decision == 1 || i % 2)
            continue;
        r.decision = 1;
        r.window[0] = '\0';
        r.status = QG_ROW_RESERVED;
        r.weight_milli = r.reserved_milli;
        r.created_ms += 5 * SLOT;
        strcpy(r.model, "standard");
        again[nagain++] = r;
    }
    assert_true(nagain > 10);
    submit_all(l, again, nagain);

    int64_t after = 0;
    check_rollup(l, "alice", 0, INT64_MAX, &after);
    check_rollup(l, "bob", 0, INT64_MAX, NULL);
    /* a range: only the slots inside it */
    check_rollup(l, "alice", BASE_MS + 10 * SLOT, BASE_MS + 100 * SLOT, NULL);
    assert_int_equal(qg__ledger_first_usage(l, "alice", &first), 0);
    assert_true(first >= BASE_MS && first < BASE_MS + 4 * SLOT);
    assert_int_equal(first % SLOT, 0);
    assert_int_equal(qg__ledger_first_usage(l, "nobody", &first),
                     QG_ENOTFOUND);

    /* the same figures after a reopen (the rollup is in the database) */
    qg__ledger_close(l);
    l = open_ok(t.path);
    check_rollup(l, "alice", 0, INT64_MAX, &counted);
    assert_int_equal(counted, after);
    qg__ledger_close(l);
    free(rows);
    free(again);
    tmpdb_remove(&t);
}

typedef struct listing {
    qg_ledger_row rows[64];
    int n;
} listing;

static int keep_row(const qg_ledger_row *r, void *ud)
{
    listing *ls = ud;
    assert_true(ls->n < 64);
    ls->rows[ls->n++] = *r;
    return 0;
}

static void test_latest(void **state)
{
    (void)state;
    tmpdb t;
    tmpdb_make(&t);
    qg_ledger *l = open_ok(t.path);
    qg_ledger_row rows[40];
    static listing ls;

    /* 40 rows of carol, two per instant (ties), submitted out of order,
     * and rows of dave around them */
    for (int i = 0; i < 40; i++) {
        make_row(&rows[i], i, i % 5 == 4 ? "dave" : "carol");
        rows[i].created_ms = BASE_MS + (int64_t)((i * 7) % 40 / 2) * 1000;
    }
    submit_all(l, rows, 40);

    ls.n = 0;
    assert_int_equal(qg__ledger_latest(l, "carol", INT64_MAX, 10, keep_row,
                                       &ls), 0);
    assert_int_equal(ls.n, 10);
    for (int i = 1; i < ls.n; i++)
        assert_true(ls.rows[i - 1].created_ms >= ls.rows[i].created_ms);
    /* the newest carol row of all is first */
    int64_t newest = 0;
    for (int i = 0; i < 40; i++)
        if (strcmp(rows[i].subject, "carol") == 0 &&
            rows[i].created_ms > newest)
            newest = rows[i].created_ms;
    assert_int_equal(ls.rows[0].created_ms, newest);
    for (int i = 0; i < ls.n; i++)
        assert_string_equal(ls.rows[i].subject, "carol");

    /* before: strictly earlier rows only, still newest first */
    int64_t before = BASE_MS + 10 * 1000;
    ls.n = 0;
    assert_int_equal(qg__ledger_latest(l, "carol", before, 64, keep_row,
                                       &ls), 0);
    int want = 0;
    for (int i = 0; i < 40; i++)
        if (strcmp(rows[i].subject, "carol") == 0 &&
            rows[i].created_ms < before)
            want++;
    assert_int_equal(ls.n, want);
    for (int i = 0; i < ls.n; i++)
        assert_true(ls.rows[i].created_ms < before);
    /* the fields come back whole */
    for (int i = 0; i < 40; i++)
        if (strcmp(rows[i].request_id, ls.rows[0].request_id) == 0) {
            assert_string_equal(rows[i].model, ls.rows[0].model);
            assert_int_equal(rows[i].weight_milli, ls.rows[0].weight_milli);
            assert_int_equal(rows[i].decision, ls.rows[0].decision);
            assert_int_equal(rows[i].input_tokens, ls.rows[0].input_tokens);
        }
    ls.n = 0;
    assert_int_equal(qg__ledger_latest(l, "carol", BASE_MS, 64, keep_row,
                                       &ls), 0);
    assert_int_equal(ls.n, 0);
    assert_int_equal(qg__ledger_latest(l, "carol", INT64_MAX, 0, keep_row,
                                       &ls), 0);
    assert_int_equal(ls.n, 0);
    assert_int_equal(qg__ledger_latest(l, "carol", INT64_MAX, -1, keep_row,
                                       &ls), QG_EINVAL);
    qg__ledger_close(l);
    tmpdb_remove(&t);
}

/* A schema-4 SQLite file with rows: migration 5 fills the rollup from
 * them, and the writer keeps it from then on (schema 8). */
static void test_sqlite_migration_fills_rollup(void **state)
{
    (void)state;
    tmpdb t;
    tmpdb_make(&t);
    qg_ledger *l = open_ok(t.path);
    qg_ledger_row rows[300];
    for (int i = 0; i < 300; i++)
        make_row(&rows[i], i, "erin");
    submit_all(l, rows, 300);
    qg__ledger_close(l);

    /* take the file back to version 5 (the outbox, before the history):
     * no rollup, no triggers */
    sqlite3 *db;
    assert_int_equal(sqlite3_open(t.path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
        "DROP TRIGGER IF EXISTS requests_slots_insert;"
        "DROP TRIGGER IF EXISTS requests_slots_update;"
        "DROP TABLE usage_slots; DROP INDEX IF EXISTS requests_subject;"
        "DROP TABLE IF EXISTS usage_slots_recent;"
        "DROP TRIGGER IF EXISTS requests_subject_rows;"
        "DROP TABLE IF EXISTS subject_rows;"
        "DROP TABLE IF EXISTS subject_rows_mark;"
        "PRAGMA user_version=5;", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    l = open_ok(t.path);
    check_rollup(l, "erin", 0, INT64_MAX, NULL);
    qg_ledger_row more[50];
    for (int i = 0; i < 50; i++)
        make_row(&more[i], 1000 + i, "erin");
    submit_all(l, more, 50);
    check_rollup(l, "erin", 0, INT64_MAX, NULL);
    qg__ledger_close(l);
    tmpdb_remove(&t);
}

/* The slots each table of SQLite's rollup holds (schema 11): in the
 * recent one, how many lie before `recent_from`; in the older one, how
 * many lie at or after it. */
static void recent_split(const char *path, int64_t recent_from,
                         int64_t *old_in_recent, int64_t *recent_in_old,
                         int64_t *in_old)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db,
        "SELECT (SELECT count(*) FROM usage_slots_recent WHERE slot_ms < ?1),"
        " (SELECT count(*) FROM usage_slots WHERE slot_ms >= ?1),"
        " (SELECT count(*) FROM usage_slots),"
        " (SELECT count(*) FROM usage_slots u JOIN usage_slots_recent r"
        "  USING (subject, slot_ms, model))", -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_int64(st, 1, recent_from);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    *old_in_recent = sqlite3_column_int64(st, 0);
    *recent_in_old = sqlite3_column_int64(st, 1);
    *in_old = sqlite3_column_int64(st, 2);
    assert_int_equal(sqlite3_column_int64(st, 3), 0);  /* one table each */
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static void quarter_rows(qg_ledger_row *rows, int n, int q, int base)
{
    static const char *const who[] = {"ida", "jon", "kim"};
    for (int i = 0; i < n; i++) {
        make_row(&rows[i], base + i, who[i % 3]);
        rows[i].created_ms = BASE_MS + q * SLOT + 1000 * (i + 1);
    }
}

static void check_three(qg_ledger *l)
{
    check_rollup(l, "ida", 0, INT64_MAX, NULL);
    check_rollup(l, "jon", 0, INT64_MAX, NULL);
    check_rollup(l, "kim", 0, INT64_MAX, NULL);
}

/* SQLite keeps the slots within a quarter hour of the newest row in
 * usage_slots_recent and moves the older ones to usage_slots: after each
 * quarter hour's batch the split is right and a slot is in one table;
 * a late settle of a moved slot, a refusal decided again into a quarter
 * hour long past, and a reopen keep the rollup equal to the rows. */
static void test_sqlite_recent_slots(void **state)
{
    (void)state;
    tmpdb t;
    static qg_ledger_row made[6][30];
    qg_ledger_row rows[30];
    int64_t old_in_recent, recent_in_old, in_old;
    tmpdb_make(&t);
    qg_ledger *l = open_ok(t.path);
    for (int q = 0; q < 6; q++) {
        quarter_rows(made[q], 30, q, q * 100);
        submit_all(l, made[q], 30);
        recent_split(t.path, BASE_MS + (q - 1) * SLOT, &old_in_recent,
                     &recent_in_old, &in_old);
        assert_int_equal(old_in_recent, 0);
        assert_int_equal(recent_in_old, 0);
        assert_true(q < 2 ? in_old == 0 : in_old > 0);
        check_three(l);
    }
    /* settles of admitted rows of quarter hour 0, whose slots were moved */
    int nset = 0;
    for (int i = 0; i < 30; i++) {
        if (made[0][i].decision != 1)
            continue;
        rows[nset] = made[0][i];
        rows[nset].settle_only = 1;
        rows[nset].status = QG_ROW_COMPLETED;
        rows[nset].weight_milli = made[0][i].reserved_milli * 2;
        rows[nset].settled_ms = made[0][i].created_ms + 1000;
        nset++;
    }
    assert_true(nset > 10);
    submit_all(l, rows, nset);
    check_three(l);
    /* a refusal of quarter hour 5 decided again, allowed, in quarter
     * hour 1 under a model no row there had: a new slot, long past */
    int again = -1;
    for (int i = 0; i < 30 && again < 0; i++)
        if (made[5][i].decision != 1)
            again = i;
    assert_true(again >= 0);
    rows[0] = made[5][again];
    rows[0].decision = 1;
    rows[0].window[0] = '\0';
    rows[0].status = QG_ROW_RESERVED;
    rows[0].weight_milli = rows[0].reserved_milli;
    rows[0].created_ms = BASE_MS + SLOT + 7;
    strcpy(rows[0].model, "large");
    submit_all(l, rows, 1);
    check_three(l);
    recent_split(t.path, BASE_MS + 4 * SLOT, &old_in_recent, &recent_in_old,
                 &in_old);
    assert_int_equal(old_in_recent, 1);       /* that slot, until moved */
    /* a reopen, then the next quarter hour moves that slot too */
    qg__ledger_close(l);
    l = open_ok(t.path);
    check_three(l);
    quarter_rows(rows, 30, 7, 700);
    submit_all(l, rows, 30);
    recent_split(t.path, BASE_MS + 6 * SLOT, &old_in_recent, &recent_in_old,
                 &in_old);
    assert_int_equal(old_in_recent, 0);
    assert_int_equal(recent_in_old, 0);
    check_three(l);
    qg__ledger_close(l);
    tmpdb_remove(&t);
}

/* ----------------------------------------- subject_rows (schema 10) */

/* One number read straight from the file: the first column of sql's
 * first row, ?1 bound to text (when not NULL), ?2 and ?3 to a and b. */
static int64_t file_int(const char *path, const char *sql, const char *text,
                        int64_t a, int64_t b)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    int64_t v;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    if (text)
        sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, a);
    sqlite3_bind_int64(st, 3, b);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* What the rows say, read straight from the file: subject's rows newest
 * first (ties: the later written first), as qg__ledger_latest promises. */
static int file_latest(const char *path, const char *subject, int64_t before,
                       char ids[][256], int max)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    int n = 0;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db,
        "SELECT request_id FROM requests NOT INDEXED WHERE subject = ?1"
        " AND created_ms < ?2 ORDER BY created_ms DESC, rowid DESC LIMIT ?3",
        -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_text(st, 1, subject, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, before);
    sqlite3_bind_int(st, 3, max);
    while (sqlite3_step(st) == SQLITE_ROW)
        snprintf(ids[n++], 256, "%s",
                 (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* The file's subject_rows agree with its rows: every row up to the mark
 * of its subject's slice has its entry at its subject and instant, no
 * row above it has one, no entry names anything else.  Returns the least
 * mark. */
#define MARK_OF(subj) "(SELECT seq FROM subject_rows_mark WHERE lo <= " \
    subj " ORDER BY lo DESC LIMIT 1)"
static int64_t file_index_agrees(const char *path)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    int64_t mark, missing, wrong, early;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db,
        "SELECT (SELECT min(seq) FROM subject_rows_mark),"
        " (SELECT count(*) FROM requests r WHERE r.rowid <= "
        MARK_OF("r.subject") " AND NOT EXISTS (SELECT 1"
        "   FROM subject_rows s WHERE s.subject = r.subject"
        "   AND s.created_ms = r.created_ms AND s.seq = r.rowid)),"
        " (SELECT count(*) FROM subject_rows s WHERE NOT EXISTS (SELECT 1"
        "   FROM requests r WHERE r.rowid = s.seq AND r.subject = s.subject"
        "   AND r.created_ms = s.created_ms)),"
        " (SELECT count(*) FROM subject_rows s WHERE s.seq > "
        MARK_OF("s.subject") ")", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    mark = sqlite3_column_int64(st, 0);
    missing = sqlite3_column_int64(st, 1);
    wrong = sqlite3_column_int64(st, 2);
    early = sqlite3_column_int64(st, 3);
    sqlite3_finalize(st);
    sqlite3_close(db);
    assert_int_equal(missing, 0);
    assert_int_equal(wrong, 0);
    assert_int_equal(early, 0);
    return mark;
}

#define LATEST_MAX 2000
typedef struct idlist {
    char ids[LATEST_MAX][256];
    int n;
} idlist;

static int keep_id(const qg_ledger_row *r, void *ud)
{
    idlist *ls = ud;
    assert_true(ls->n < LATEST_MAX);
    snprintf(ls->ids[ls->n++], 256, "%s", r->request_id);
    return 0;
}

static int keep_entity(const qg_ledger_row *r, void *ud)
{
    int64_t *prev = ud;
    assert_true(r->decision == 1);
    assert_true(r->created_ms >= *prev);     /* created_ms order */
    *prev = r->created_ms;
    prev[1]++;
    return 0;
}

/* latest and scan_entity read the same rows of subject whether they sit
 * in subject_rows, above its mark, or were moved in time after they were
 * indexed; checked against the rows themselves.  Returns the number of
 * the subject's admitted rows the scan read. */
static int64_t check_subject(qg_ledger *l, const char *path, const char *who)
{
    static idlist got;
    static char want[LATEST_MAX][256];
    const int64_t befores[] = {INT64_MAX, BASE_MS + 40 * SLOT,
                               BASE_MS + 200 * SLOT};
    const int limits[] = {LATEST_MAX, 7};
    int64_t acc[2] = {0, 0}, n;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 2; k++) {
            int nw = file_latest(path, who, befores[b], want, limits[k]);
            got.n = 0;
            assert_int_equal(qg__ledger_latest(l, who, befores[b],
                                               limits[k], keep_id, &got),
                             0);
            assert_int_equal(got.n, nw);
            for (int i = 0; i < nw; i++)
                assert_string_equal(got.ids[i], want[i]);
        }
    assert_int_equal(qg__ledger_scan_entity(l, who, "", BASE_MS + 20 * SLOT,
                                            BASE_MS + 250 * SLOT,
                                            keep_entity, acc), 0);
    n = file_int(path, "SELECT count(*) FROM requests NOT INDEXED"
                 " WHERE subject = ?1 AND decision = 1 AND created_ms >= ?2"
                 " AND created_ms <= ?3", who, BASE_MS + 20 * SLOT,
                 BASE_MS + 250 * SLOT);
    assert_int_equal(acc[1], n);
    return n;
}

/* check_subject for the three subjects of subject_rows_run, with the
 * table filled at every batch, never, and on the default schedule. */
static void check_reads(qg_ledger *l, const char *path)
{
    static const char *const who[] = {"ann", "ben", "cy"};
    for (int w = 0; w < 3; w++)
        assert_true(check_subject(l, path, who[w]) > 0);
}

static void subject_rows_run(int every_rows, int every_ms, int expect_filled)
{
    tmpdb t;
    char err[512];
    qg_ledger_opts o = {0};
    qg_ledger_row rows[600];
    int64_t mark;
    tmpdb_make(&t);
    o.sync = QG_LEDGER_DURABLE;
    o.log = log_line;
    o.subject_index_rows = every_rows;
    o.subject_index_ms = every_ms;
    qg_ledger *l = qg__ledger_open(t.path, &o, err, sizeof err);
    if (!l)
        fail_msg("open: %s", err);
    static const char *const who[] = {"ann", "ben", "cy"};
    uint64_t seed = rng;        /* the refusals below are made again */
    /* three batches of rows over three subjects */
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < 200; i++)
            make_row(&rows[i], b * 200 + i, who[(i + b) % 3]);
        submit_all(l, rows, 200);
        check_reads(l, t.path);
    }
    mark = file_index_agrees(t.path);
    if (expect_filled > 0 && 8 * every_rows < 200) {
        /* a step of at most 8 x every_rows per batch, at least one
         * batch per stage (a slow build makes more of them) */
        assert_true(mark >= 3 * 8 * every_rows);
    } else if (expect_filled > 0) {
        assert_true(mark >= 400);
    } else if (expect_filled == 0) {
        assert_int_equal(mark, 0);
    }
    /* refusals decided again, later: rows that were indexed move */
    int nagain = 0;
    rng = seed;
    for (int i = 0; i < 600; i++) {
        qg_ledger_row r;
        make_row(&r, i, who[(i % 200 + i / 200) % 3]);
        if (r.decision == 1)
            continue;
        r.decision = 1;
        r.window[0] = '\0';
        r.status = QG_ROW_RESERVED;
        r.weight_milli = r.reserved_milli;
        r.created_ms += 7 * SLOT + 1;
        rows[nagain++] = r;
    }
    assert_true(nagain > 20);
    submit_all(l, rows, nagain);
    check_reads(l, t.path);
    file_index_agrees(t.path);
    /* the same after a reopen (the mark is in the file), with rows
     * another program wrote meanwhile: the reopen puts them in
     * subject_rows, in steps of at most 8 x every_rows */
    qg__ledger_close(l);
    {
        sqlite3 *db;
        assert_int_equal(sqlite3_open(t.path, &db), SQLITE_OK);
        assert_int_equal(sqlite3_exec(db,
            "WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1"
            " FROM n WHERE v < 300)"
            " INSERT INTO requests (request_id, subject, plan, decision,"
            " status, reserved_milli, weight_milli, created_ms)"
            " SELECT 'ext-' || v, CASE v % 3 WHEN 0 THEN 'ann'"
            " WHEN 1 THEN 'ben' ELSE 'cy' END, 'free', 1, 2, 1000, 1000, "
            "1767225600000 + v * 997 FROM n",
            NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
    }
    l = qg__ledger_open(t.path, &o, err, sizeof err);
    if (!l)
        fail_msg("reopen: %s", err);
    {
        sqlite3 *db;
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_open(t.path, &db), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, "SELECT max(rowid) FROM"
                                            " requests", -1, &st, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        /* every row is in subject_rows after the open */
        assert_int_equal(file_index_agrees(t.path),
                         sqlite3_column_int64(st, 0));
        sqlite3_finalize(st);
        sqlite3_close(db);
    }
    check_reads(l, t.path);
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < 30; i++)
            make_row(&rows[i], 5000 + k * 30 + i, who[i % 3]);
        submit_all(l, rows, 30);
        check_reads(l, t.path);
        file_index_agrees(t.path);
    }
    qg__ledger_close(l);
    tmpdb_remove(&t);
}

static void test_subject_rows(void **state)
{
    (void)state;
    subject_rows_run(16, 0, 1);      /* each batch, in steps of 128 */
    subject_rows_run(100, 0, 1);     /* each batch, whole */
    subject_rows_run(1000000, 3600 * 1000, 0);   /* never (all the tail) */
    subject_rows_run(0, 0, -1);                  /* the defaults */
}

/* The file's slices (subject_rows_mark's rows) and how many different
 * marks they hold. */
static void file_slices(const char *path, int *n, int *marks)
{
    *n = (int)file_int(path, "SELECT count(*) FROM subject_rows_mark",
                       NULL, 0, 0);
    *marks = (int)file_int(path, "SELECT count(DISTINCT seq)"
                           " FROM subject_rows_mark", NULL, 0, 0);
}

static int64_t file_top(const char *path)
{
    return file_int(path, "SELECT max(rowid) FROM requests", NULL, 0, 0);
}

/* subject_rows in slices (schema 12): over 300 subjects a round is cut
 * by name into slices that consecutive batches fill, each with its mark.
 * After every batch, in the middle of a round too, the file agrees with
 * the marks of its subjects' slices and the reads of a subject are its
 * rows; refusals decided again move in time; a close in the middle of a
 * round and a reopen fill the rest and make the slices one. */
static void test_subject_rows_slices(void **state)
{
    (void)state;
    tmpdb t;
    char err[512];
    qg_ledger_opts o = {0};
    static qg_ledger_row rows[100];
    static char names[300][16];
    int sliced = 0, midround = 0, reopened = 0, n, marks;
    tmpdb_make(&t);
    o.sync = QG_LEDGER_DURABLE;
    o.log = log_line;
    o.subject_index_rows = 256;
    o.subject_index_ms = 3600 * 1000;
    qg_ledger *l = qg__ledger_open(t.path, &o, err, sizeof err);
    if (!l)
        fail_msg("open: %s", err);
    for (int k = 0; k < 300; k++)
        snprintf(names[k], sizeof names[k], "s%03d", k);
    for (int b = 0; b < 40; b++) {
        for (int i = 0; i < 100; i++)
            make_row(&rows[i], b * 100 + i, names[next_rand() % 300]);
        submit_all(l, rows, 100);
        file_index_agrees(t.path);
        check_subject(l, t.path, names[(b * 37) % 300]);
        check_subject(l, t.path, rows[99].subject);
        file_slices(t.path, &n, &marks);
        assert_true(n >= 1 && n <= 8);
        sliced |= n > 1;
        midround |= marks > 1;
        if (marks > 1 && b >= 20 && !reopened) {
            /* a round half done: the reopen fills the rest */
            qg__ledger_close(l);
            l = qg__ledger_open(t.path, &o, err, sizeof err);
            if (!l)
                fail_msg("reopen: %s", err);
            file_slices(t.path, &n, &marks);
            assert_int_equal(n, 1);
            assert_int_equal(file_index_agrees(t.path), file_top(t.path));
            check_subject(l, t.path, rows[0].subject);
            reopened = 1;
        }
    }
    assert_true(sliced);
    assert_true(midround);
    assert_true(reopened);
    /* refusals decided again, later, while the slices fill */
    int nagain = 0;
    {
        sqlite3 *db;
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_open(t.path, &db), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db,
            "SELECT request_id, subject, created_ms, reserved_milli"
            " FROM requests WHERE decision <> 1 ORDER BY rowid DESC"
            " LIMIT 100", -1, &st, NULL), SQLITE_OK);
        while (sqlite3_step(st) == SQLITE_ROW) {
            qg_ledger_row *r = &rows[nagain++];
            memset(r, 0, sizeof *r);
            snprintf(r->request_id, sizeof r->request_id, "%s",
                     (const char *)sqlite3_column_text(st, 0));
            snprintf(r->subject, sizeof r->subject, "%s",
                     (const char *)sqlite3_column_text(st, 1));
            strcpy(r->plan, "free");
            r->decision = 1;
            r->status = QG_ROW_RESERVED;
            r->reserved_milli = sqlite3_column_int64(st, 3);
            r->weight_milli = r->reserved_milli;
            r->created_ms = sqlite3_column_int64(st, 2) + 7 * SLOT + 1;
            r->headroom_milli = -1;
        }
        sqlite3_finalize(st);
        sqlite3_close(db);
    }
    assert_true(nagain > 20);
    submit_all(l, rows, nagain);
    file_index_agrees(t.path);
    for (int i = 0; i < nagain; i += 10)
        check_subject(l, t.path, rows[i].subject);
    qg__ledger_close(l);
    tmpdb_remove(&t);
}

static int pg_setup(void **state)
{
    (void)state;
    if (pgproc_start(&PG) < 0) {
        fprintf(stderr, "PostgreSQL: %s\n", PG.why);
        return -1;
    }
    on_pg = 1;
    return 0;
}

static int pg_teardown(void **state)
{
    (void)state;
    pgproc_destroy(&PG);
    on_pg = 0;
    return 0;
}

#define PG_TEST(f) {"postgresql: " #f, f, NULL, NULL, NULL}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rollup_follows_rows),
        cmocka_unit_test(test_latest),
        cmocka_unit_test(test_sqlite_migration_fills_rollup),
        cmocka_unit_test(test_sqlite_recent_slots),
        cmocka_unit_test(test_subject_rows),
        cmocka_unit_test(test_subject_rows_slices),
    };
    const struct CMUnitTest pg_tests[] = {
        PG_TEST(test_rollup_follows_rows),
        PG_TEST(test_latest),
    };
    int failed = cmocka_run_group_tests_name("sqlite", tests, NULL, NULL);
    if (!pgproc_bindir()) {
        fprintf(stderr, "no PostgreSQL binaries: make test installs "
                "Debian's postgresql\n");
        return 1;
    }
    return failed + cmocka_run_group_tests_name("postgresql", pg_tests,
                                                pg_setup, pg_teardown);
}
