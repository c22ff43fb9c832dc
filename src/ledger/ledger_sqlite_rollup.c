/* ledger_sqlite_rollup.c - the history's rollup (usage_slots: a
 * subject's counts per quarter hour and model, ledger.h "history") kept
 * by the writer instead of by triggers (schema 8), its recent slots in a
 * table of their own (schema 11).
 *
 * A trigger ran one upsert of usage_slots per row written, inside the
 * row's statement: it halved the writer's rows per second (45,276 ->
 * 20,545 durable rows/s pipelined, bench_ledger, docs/benchmarks.md).
 * Here each row's change is summed in memory per (subject, slot, model)
 * while the batch is written, and the sums are added to the rollup once
 * per slot, in the batch's own transaction, before its COMMIT: a batch
 * that fails leaves neither its rows nor their counts.
 *
 * Recent and older slots (schema 11).  usage_slots is stored in key
 * order, each subject's slots together, as its readers ask for them.
 * Once it holds some days of slots, each subject's current slot sits on
 * a page of its own, and a batch over 400 subjects wrote 400 pages to
 * the WAL (an aged ledger under checks over 1,000 subjects: the writer's
 * CPU per check doubled; docs/benchmarks.md, "An aged ledger").  So a
 * slot within a quarter hour of the newest row written lives in
 * usage_slots_recent, a small table that stays in the page cache, and
 * moves to usage_slots when the newest row is a quarter hour past it
 * (rollup_move, once per quarter hour: one page per subject then).  A
 * sum goes to the slot's row in the recent table, else in the older one
 * (a late settle), else a new row in the recent table: a slot is in one
 * of the two.  The readers take both (ledger_sqlite_history.c).
 *
 * What a row counts is what the trigger counted: weight_milli when
 * admitted (decision 1), admitted, requests (1), refused.  A statement
 * that replaces a row (a refusal decided again, a settle) takes the old
 * row's counts out and puts the new one's in; the old row is read by
 * request id just before the statement (qg__sq_rollup_before), in the same
 * transaction, so a row written earlier in the batch is seen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_sqlite.h"

#define START_CAP 1024u             /* slots of the sum table, a power of 2 */
#define MAX_CAP (1u << 16)          /* beyond this, sums go out early */

static const char sql_prior[] =
    "SELECT subject, decision, weight_milli, created_ms, coalesce(model, '')"
    " FROM requests WHERE request_id = ?1";

/* A slot's sums go out as an UPDATE of its row in the recent table,
 * else of its row in the older one, and only when neither has it (its
 * subject's first row in that quarter hour and model) as an INSERT in the
 * recent table: the UPDATE finds the row with one seek where an upsert
 * first tries the insert, meets the key and seeks again for its DO
 * UPDATE (docs/benchmarks.md, "HTTP", the ninth session's steps). */
#define SQL_BUMP(table) \
    "UPDATE " table " SET weight_milli = weight_milli + ?4," \
    " admitted = admitted + ?5, requests = requests + ?6," \
    " refused = refused + ?7" \
    " WHERE subject = ?1 AND slot_ms = ?2 AND model = ?3"

static const char sql_bump[] = SQL_BUMP("usage_slots_recent");
static const char sql_bump_old[] = SQL_BUMP("usage_slots");
static const char sql_add[] =
    "INSERT INTO usage_slots_recent VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/* The recent slots before ?1 into the older table (the upsert adds, for
 * a file another program wrote both into), then out of the recent. */
static const char sql_move[] =
    "INSERT INTO usage_slots SELECT subject, slot_ms, model, weight_milli,"
    " admitted, requests, refused FROM usage_slots_recent WHERE slot_ms < ?1"
    " ORDER BY subject, slot_ms, model"
    " ON CONFLICT (subject, slot_ms, model) DO UPDATE SET"
    " weight_milli = weight_milli + excluded.weight_milli,"
    " admitted = admitted + excluded.admitted,"
    " requests = requests + excluded.requests,"
    " refused = refused + excluded.refused";
static const char sql_unrecent[] =
    "DELETE FROM usage_slots_recent WHERE slot_ms < ?1";

struct qg__sq_sum {
    uint64_t hash;                 /* 0: empty */
    int64_t slot_ms, weight_milli, admitted, requests, refused;
    char subject[sizeof ((qg_ledger_row *)0)->subject];
    char model[sizeof ((qg_ledger_row *)0)->model];
};

int qg__sq_rollup_prepare(qg__sq *s)
{
    qg__sq_rollup *r = &s->rollup;
    if (sqlite3_prepare_v3(s->wdb, sql_prior, -1, SQLITE_PREPARE_PERSISTENT,
                           &r->prior, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_add, -1, SQLITE_PREPARE_PERSISTENT,
                           &r->add, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_bump, -1, SQLITE_PREPARE_PERSISTENT,
                           &r->bump, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_bump_old, -1,
                           SQLITE_PREPARE_PERSISTENT, &r->bump_old,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_move, -1, SQLITE_PREPARE_PERSISTENT,
                           &r->move, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(s->wdb, sql_unrecent, -1,
                           SQLITE_PREPARE_PERSISTENT, &r->unrecent,
                           NULL) != SQLITE_OK)
        return QG_EIO;
    r->sums = calloc(START_CAP, sizeof *r->sums);
    r->used = malloc(START_CAP * sizeof *r->used);
    if (!r->sums || !r->used)
        return QG_ENOMEM;
    r->cap = START_CAP;
    r->n = 0;
    return QG_OK;
}

void qg__sq_rollup_finalize(qg__sq *s)
{
    qg__sq_rollup *r = &s->rollup;
    sqlite3_finalize(r->prior);
    sqlite3_finalize(r->add);
    sqlite3_finalize(r->bump);
    sqlite3_finalize(r->bump_old);
    sqlite3_finalize(r->move);
    sqlite3_finalize(r->unrecent);
    free(r->sums);
    free(r->used);
    memset(r, 0, sizeof *r);
}

void qg__sq_rollup_clear(qg__sq *s)
{
    qg__sq_rollup *r = &s->rollup;
    for (size_t i = 0; i < r->n; i++)
        r->sums[r->used[i]].hash = 0;
    r->n = 0;
}

static uint64_t key_hash(const char *subject, int64_t slot_ms,
                         const char *model)
{
    char k[sizeof ((struct qg__sq_sum *)0)->subject + sizeof slot_ms +
           sizeof ((struct qg__sq_sum *)0)->model];
    size_t ns = strnlen(subject, sizeof ((struct qg__sq_sum *)0)->subject - 1);
    size_t nm = strnlen(model, sizeof ((struct qg__sq_sum *)0)->model - 1);
    uint64_t h;
    memcpy(k, subject, ns);
    k[ns] = '\0';
    memcpy(k + ns + 1, &slot_ms, sizeof slot_ms);
    memcpy(k + ns + 1 + sizeof slot_ms, model, nm);
    h = XXH3_64bits(k, ns + 1 + sizeof slot_ms + nm);
    return h ? h : 1;
}

/* Move the table to twice its capacity (the sums stay). */
static int grow(qg__sq_rollup *r)
{
    uint32_t cap = r->cap * 2, mask = cap - 1;
    struct qg__sq_sum *ns = calloc(cap, sizeof *ns);
    uint32_t *nu = malloc(cap * sizeof *nu);
    if (!ns || !nu) {
        free(ns);
        free(nu);
        return QG_ENOMEM;
    }
    for (size_t i = 0; i < r->n; i++) {
        struct qg__sq_sum *e = &r->sums[r->used[i]];
        uint32_t j = (uint32_t)e->hash & mask;
        while (ns[j].hash)
            j = (j + 1) & mask;
        ns[j] = *e;
        nu[i] = j;
    }
    free(r->sums);
    free(r->used);
    r->sums = ns;
    r->used = nu;
    r->cap = cap;
    return QG_OK;
}

/* Run st (sql_bump or sql_add) on sum e: SQLite's code. */
static int put_sum(sqlite3_stmt *st, const struct qg__sq_sum *e)
{
    int rc = BIND_STR(st, 1, e->subject);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, e->slot_ms);
    if (rc == SQLITE_OK) rc = BIND_STR(st, 3, e->model);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 4, e->weight_milli);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 5, e->admitted);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 6, e->requests);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 7, e->refused);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_DONE)
        rc = SQLITE_OK;
    sqlite3_reset(st);
    return rc;
}

/* The recent slots a quarter hour or more before the newest row's slot
 * into the older table, when that boundary moved since the last time
 * (in the open transaction; SQLite's code). */
static int rollup_move(qg__sq *s)
{
    qg__sq_rollup *r = &s->rollup;
    int64_t before = r->newest_ms - r->newest_ms % QG_LEDGER_SLOT_MS -
                     QG_LEDGER_SLOT_MS;
    int rc;
    if (before <= r->moved_before)
        return SQLITE_OK;
    sqlite3_bind_int64(r->move, 1, before);
    sqlite3_bind_int64(r->unrecent, 1, before);
    rc = sqlite3_step(r->move);
    sqlite3_reset(r->move);
    if (rc == SQLITE_DONE) {
        rc = sqlite3_step(r->unrecent);
        sqlite3_reset(r->unrecent);
    }
    if (rc != SQLITE_DONE)
        return rc;
    r->moving = before;     /* moved_before once the batch commits */
    return SQLITE_OK;
}

/* Write every sum into the rollup (in the open transaction), then move
 * what is no longer recent. */
int qg__sq_rollup_flush(qg__sq *s)
{
    qg__sq_rollup *r = &s->rollup;
    int rc = SQLITE_OK;
    for (size_t i = 0; i < r->n && rc == SQLITE_OK; i++) {
        const struct qg__sq_sum *e = &r->sums[r->used[i]];
        if (!e->weight_milli && !e->admitted && !e->requests && !e->refused)
            continue;
        rc = put_sum(r->bump, e);
        if (rc == SQLITE_OK && sqlite3_changes(s->wdb) == 0)
            rc = put_sum(r->bump_old, e);
        if (rc == SQLITE_OK && sqlite3_changes(s->wdb) == 0)
            rc = put_sum(r->add, e);
    }
    sqlite3_clear_bindings(r->bump);
    sqlite3_clear_bindings(r->bump_old);
    sqlite3_clear_bindings(r->add);
    qg__sq_rollup_clear(s);
    return rc == SQLITE_OK ? rollup_move(s) : rc;
}

void qg__sq_rollup_done(qg__sq *s, int ok)
{
    qg__sq_rollup *r = &s->rollup;
    if (ok && r->moving > r->moved_before)
        r->moved_before = r->moving;
    r->moving = 0;
}

/* Add one row's counts, times sign (+1 or -1), to its slot's sum. */
static int add(qg__sq *s, const char *subject, int64_t created_ms,
               const char *model, int decision, int64_t weight_milli,
               int sign)
{
    qg__sq_rollup *r = &s->rollup;
    int64_t slot = created_ms - created_ms % QG_LEDGER_SLOT_MS;
    uint64_t h = key_hash(subject, slot, model);
    uint32_t mask = r->cap - 1, j = (uint32_t)h & mask;
    struct qg__sq_sum *e;
    if (sign > 0 && created_ms > r->newest_ms)
        r->newest_ms = created_ms;
    for (;; j = (j + 1) & mask) {
        e = &r->sums[j];
        if (!e->hash)
            break;
        if (e->hash == h && e->slot_ms == slot &&
            strcmp(e->subject, subject) == 0 && strcmp(e->model, model) == 0)
            goto found;
    }
    if ((r->n + 1) * 4 > (size_t)r->cap * 3) {
        /* full: a larger table, else what is summed so far goes out now */
        if ((r->cap >= MAX_CAP || grow(r) != QG_OK) &&
            qg__sq_rollup_flush(s) != SQLITE_OK)
            return QG_EIO;
        return add(s, subject, created_ms, model, decision, weight_milli,
                   sign);
    }
    e->hash = h;
    e->slot_ms = slot;
    e->weight_milli = e->admitted = e->requests = e->refused = 0;
    snprintf(e->subject, sizeof e->subject, "%s", subject);
    snprintf(e->model, sizeof e->model, "%s", model);
    r->used[r->n++] = j;
found:
    if (decision == 1) {
        e->weight_milli += sign * weight_milli;
        e->admitted += sign;
    } else {
        e->refused += sign;
    }
    e->requests += sign;
    return QG_OK;
}

int qg__sq_rollup_before(qg__sq *s, const qg_ledger_row *row,
                         qg__sq_prior *p)
{
    sqlite3_stmt *st = s->rollup.prior;
    int rc = BIND_STR(st, 1, row->request_id);
    p->found = 0;
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        p->found = 1;
        COL_STR(st, 0, p->subject);
        p->decision = sqlite3_column_int(st, 1);
        p->weight_milli = sqlite3_column_int64(st, 2);
        p->created_ms = sqlite3_column_int64(st, 3);
        COL_STR(st, 4, p->model);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    sqlite3_reset(st);
    return rc;
}

int qg__sq_rollup_after(qg__sq *s, const qg_ledger_row *row,
                        const qg__sq_prior *p)
{
    int rc = QG_OK;
    if (p->found) {
        rc = add(s, p->subject, p->created_ms, p->model, p->decision,
                 p->weight_milli, -1);
        /* a settle changes only the weight of the row it finds */
        if (rc == QG_OK && row->settle_only)
            return add(s, p->subject, p->created_ms, p->model, p->decision,
                       row->weight_milli, 1);
    }
    if (rc == QG_OK)
        rc = add(s, row->subject, row->created_ms, row->model,
                 row->decision, row->weight_milli, 1);
    return rc;
}
