/* ledger_sqlite_schema.c - the SQLite ledger's schema: the migrations
 * (PRAGMA user_version is the schema version; migrations[i] brings
 * version i to i + 1, all pending ones in one transaction at open; a file
 * newer than this build is refused) and the messages of a database that
 * cannot be used. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "quotagate.h"
#include "ledger.h"

#include "ledger_sqlite.h"

/* One row's counts into its slot (ROW: NEW or OLD; SIGN: "" or "-"). */
#define QG__SQ_SLOT_ADD(ROW, SIGN)                                          \
    "INSERT INTO usage_slots VALUES (" ROW ".subject, " ROW ".created_ms"    \
    " - " ROW ".created_ms % 900000, coalesce(" ROW ".model, ''),"           \
    " " SIGN "(CASE WHEN " ROW ".decision = 1 THEN " ROW ".weight_milli"     \
    " ELSE 0 END), " SIGN "(" ROW ".decision = 1), " SIGN "1,"              \
    " " SIGN "(" ROW ".decision <> 1)) ON CONFLICT (subject, slot_ms, model)" \
    " DO UPDATE SET weight_milli = weight_milli + excluded.weight_milli,"    \
    " admitted = admitted + excluded.admitted,"                            \
    " requests = requests + excluded.requests,"                            \
    " refused = refused + excluded.refused"

static const char *const migrations[] = {
    /* 0 -> 1 */
    "CREATE TABLE requests ("
    " request_id TEXT PRIMARY KEY, subject TEXT NOT NULL, org TEXT,"
    " plan TEXT, rules_version TEXT, weights_version TEXT, model TEXT,"
    " \"window\" TEXT, decision INTEGER NOT NULL, status INTEGER NOT NULL,"
    " estimated INTEGER NOT NULL DEFAULT 0,"
    " input_tokens INTEGER NOT NULL DEFAULT 0,"
    " output_tokens INTEGER NOT NULL DEFAULT 0,"
    " reserved_milli INTEGER NOT NULL DEFAULT 0,"
    " weight_milli INTEGER NOT NULL DEFAULT 0,"
    " created_ms INTEGER NOT NULL, settled_ms INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX requests_created ON requests(created_ms);"
    "CREATE TABLE subjects ("
    " subject TEXT PRIMARY KEY, plan TEXT NOT NULL, org TEXT,"
    " billing_anchor_ms INTEGER NOT NULL DEFAULT 0,"
    " updated_ms INTEGER NOT NULL);"
    "CREATE TABLE keys ("
    " id TEXT PRIMARY KEY, subject TEXT, role TEXT NOT NULL,"
    " hash BLOB NOT NULL, created_ms INTEGER NOT NULL,"
    " revoked_ms INTEGER NOT NULL DEFAULT 0);",
    /* 1 -> 2: pay-as-you-go overage (ledger.h) */
    "ALTER TABLE requests ADD COLUMN overage_milli INTEGER NOT NULL"
    " DEFAULT 0;"
    "ALTER TABLE requests ADD COLUMN overage_price_micro INTEGER NOT NULL"
    " DEFAULT 0;"
    "ALTER TABLE requests ADD COLUMN overage_cost_micro INTEGER NOT NULL"
    " DEFAULT 0;"
    "ALTER TABLE requests ADD COLUMN headroom_milli INTEGER NOT NULL"
    " DEFAULT -1;",
    /* 2 -> 3: why a charge differs from the usage reported (ledger.h) */
    "ALTER TABLE requests ADD COLUMN detail TEXT NOT NULL DEFAULT '';",
    /* 3 -> 4: decided locally while the shared store was down */
    "ALTER TABLE requests ADD COLUMN fallback INTEGER NOT NULL DEFAULT 0;",
    /* 4 -> 5: the webhook outbox (ledger.h; ledger_sqlite_outbox.c) */
    "CREATE TABLE notify_marks ("
    " subject TEXT NOT NULL, \"window\" TEXT NOT NULL,"
    " threshold_milli INTEGER NOT NULL, period_key INTEGER NOT NULL,"
    " armed INTEGER NOT NULL, episode INTEGER NOT NULL,"
    " fired_ms INTEGER NOT NULL,"
    " PRIMARY KEY (subject, \"window\", threshold_milli));"
    "CREATE TABLE webhook_outbox ("
    " id TEXT NOT NULL, url TEXT NOT NULL, type TEXT NOT NULL,"
    " subject TEXT NOT NULL, \"window\" TEXT NOT NULL,"
    " threshold_milli INTEGER NOT NULL, period_key INTEGER NOT NULL,"
    " body TEXT NOT NULL, created_ms INTEGER NOT NULL,"
    " state INTEGER NOT NULL DEFAULT 0, next_ms INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " lease_owner TEXT NOT NULL DEFAULT '',"
    " lease_until INTEGER NOT NULL DEFAULT 0,"
    " last_error TEXT NOT NULL DEFAULT '',"
    " done_ms INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (id, url));"
    "CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_ms);",
    /* 5 -> 6: the history (ledger.h "history"): a subject's rows by time,
     * and the rollup per quarter hour and model, filled from the rows
     * already there and kept by triggers in every later transaction (an
     * insert adds its row; an update, a settle or a refusal decided again,
     * takes the old row's counts out and puts the new one's in) */
    "CREATE INDEX requests_subject ON requests(subject, created_ms);"
    "CREATE TABLE usage_slots ("
    " subject TEXT NOT NULL, slot_ms INTEGER NOT NULL, model TEXT NOT NULL,"
    " weight_milli INTEGER NOT NULL DEFAULT 0,"
    " admitted INTEGER NOT NULL DEFAULT 0,"
    " requests INTEGER NOT NULL DEFAULT 0,"
    " refused INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (subject, slot_ms, model)) WITHOUT ROWID;"
    "INSERT INTO usage_slots SELECT subject, created_ms - created_ms % 900000,"
    " coalesce(model, ''),"
    " sum(CASE WHEN decision = 1 THEN weight_milli ELSE 0 END),"
    " sum(decision = 1), count(*), sum(decision <> 1)"
    " FROM requests GROUP BY 1, 2, 3;"
    "CREATE TRIGGER requests_slots_insert AFTER INSERT ON requests BEGIN"
    " " QG__SQ_SLOT_ADD("NEW", "") "; END;"
    "CREATE TRIGGER requests_slots_update AFTER UPDATE OF subject, model,"
    " decision, weight_milli, created_ms ON requests BEGIN"
    " " QG__SQ_SLOT_ADD("OLD", "-") ";"
    " " QG__SQ_SLOT_ADD("NEW", "") "; END;",
    /* 6 -> 7: one org's rows by time (explain; one subject's came with
     * the history's index) */
    "CREATE INDEX IF NOT EXISTS requests_org ON requests (org, created_ms);",
    /* 7 -> 8: the rollup is kept by the writer, summed per batch
     * (ledger_sqlite_rollup.c), no longer by a trigger per row */
    /* one string in two (parenthesised: clang's -Wstring-concatenation
     * takes an array element made of two literals for a missing comma) */
    ("DROP TRIGGER IF EXISTS requests_slots_insert;"
     " DROP TRIGGER IF EXISTS requests_slots_update;"),
    /* 8 -> 9: the org index holds only rows that have an org ('' is
     * none; a query by org names org <> '' to use it): a member without
     * an org costs one index insert less per row (docs/benchmarks.md,
     * "HTTP", the eighth session's steps) */
    ("DROP INDEX IF EXISTS requests_org;"
     " CREATE INDEX requests_org ON requests (org, created_ms)"
     " WHERE org <> '';"),
    /* 9 -> 10: a subject's rows by time in a table the writer fills in
     * subject order once per interval (ledger_sqlite_subject_rows.c), instead
     * of the index requests_subject, which every row entered at its
     * subject's place: at 1,000 subjects that index was a third of the
     * gateway's CPU per check (docs/benchmarks.md, "Ledger").  mark holds
     * the last rowid the table covers; an update that moves an indexed
     * row in time (a refusal decided again) moves its entry. */
    ("CREATE TABLE subject_rows (subject TEXT NOT NULL,"
     " created_ms INTEGER NOT NULL, seq INTEGER NOT NULL,"
     " PRIMARY KEY (subject, created_ms, seq)) WITHOUT ROWID;"
     " INSERT INTO subject_rows SELECT subject, created_ms, rowid"
     " FROM requests ORDER BY subject, created_ms, rowid;"
     " CREATE TABLE subject_rows_mark (seq INTEGER NOT NULL);"
     " INSERT INTO subject_rows_mark SELECT coalesce(max(rowid), 0)"
     " FROM requests;"
     " DROP INDEX IF EXISTS requests_subject;"
     " CREATE TRIGGER requests_subject_rows AFTER UPDATE OF created_ms"
     " ON requests WHEN OLD.created_ms IS NOT NEW.created_ms"
     " AND OLD.rowid <= (SELECT seq FROM subject_rows_mark) BEGIN"
     " DELETE FROM subject_rows WHERE subject = OLD.subject"
     " AND created_ms = OLD.created_ms AND seq = OLD.rowid;"
     " INSERT OR IGNORE INTO subject_rows"
     " VALUES (NEW.subject, NEW.created_ms, NEW.rowid); END;"),
    /* 10 -> 11: the rollup's recent slots in a small table of their own,
     * moved to usage_slots a quarter hour on (ledger_sqlite_rollup.c):
     * in usage_slots' key order each subject's current slot sat on a
     * page of its own once the ledger held some days of slots, and a
     * batch wrote one page per subject it held (docs/benchmarks.md, "An
     * aged ledger").  A slot is in one of the two; the readers take
     * both. */
    ("CREATE TABLE usage_slots_recent (subject TEXT NOT NULL,"
     " slot_ms INTEGER NOT NULL, model TEXT NOT NULL,"
     " weight_milli INTEGER NOT NULL DEFAULT 0,"
     " admitted INTEGER NOT NULL DEFAULT 0,"
     " requests INTEGER NOT NULL DEFAULT 0,"
     " refused INTEGER NOT NULL DEFAULT 0,"
     " PRIMARY KEY (subject, slot_ms, model)) WITHOUT ROWID;"),
    /* 11 -> 12: subject_rows filled in slices of subjects by name, each
     * with its mark, over consecutive batches (ledger_sqlite_subject_rows.c):
     * a fill over 1,000 subjects of an aged ledger wrote 1,000 pages in
     * one batch, whose settles waited for it (docs/benchmarks.md, "An aged
     * ledger").  The mark that was is the one slice, from "". */
    ("ALTER TABLE subject_rows_mark ADD COLUMN lo TEXT NOT NULL DEFAULT '';"
     " DROP TRIGGER IF EXISTS requests_subject_rows;"
     " CREATE TRIGGER requests_subject_rows AFTER UPDATE OF created_ms"
     " ON requests WHEN OLD.created_ms IS NOT NEW.created_ms"
     " AND OLD.rowid <= (SELECT seq FROM subject_rows_mark"
     " WHERE lo <= OLD.subject ORDER BY lo DESC LIMIT 1) BEGIN"
     " DELETE FROM subject_rows WHERE subject = OLD.subject"
     " AND created_ms = OLD.created_ms AND seq = OLD.rowid;"
     " INSERT OR IGNORE INTO subject_rows"
     " VALUES (NEW.subject, NEW.created_ms, NEW.rowid); END;"),
};

_Static_assert(sizeof migrations / sizeof migrations[0] ==
                   QG_LEDGER_SCHEMA_VERSION,
               "one migration per schema version");

int qg__sq_fail_db(sqlite3 *db, const char *path, const char *what,
                   char *err, size_t errcap)
{
    snprintf(err, errcap, "ledger %s: %s: %s", path, what,
             db ? sqlite3_errmsg(db) : "out of memory");
    return QG_EIO;
}

int qg__sq_user_version(sqlite3 *db, int *out)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        *out = sqlite3_column_int(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

int qg__sq_too_new(int v, const char *path, char *err, size_t errcap)
{
    snprintf(err, errcap, "ledger %s: schema version %d is newer than this "
             "build of quotagate knows (%d); use a newer quotagate",
             path, v, QG_LEDGER_SCHEMA_VERSION);
    return QG_ESTATE;
}

/* Apply the pending migrations in one write transaction (another process
 * may be migrating the same file: the version is read again under the
 * lock). */
int qg__sq_migrate(sqlite3 *db, const char *path, char *err, size_t errcap)
{
    char sql[64];
    int v = 0, rc;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return qg__sq_fail_db(db, path, "cannot lock for migration", err, errcap);
    if ((rc = qg__sq_user_version(db, &v)) != SQLITE_OK) {
        rc = qg__sq_fail_db(db, path, "cannot read the schema version", err,
                     errcap);
        goto fail;
    }
    if (v > QG_LEDGER_SCHEMA_VERSION) {
        rc = qg__sq_too_new(v, path, err, errcap);
        goto fail;
    }
    if (v < 0) {
        snprintf(err, errcap, "ledger %s: invalid schema version %d", path,
                 v);
        rc = QG_ESTATE;
        goto fail;
    }
    if (v == QG_LEDGER_SCHEMA_VERSION) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return QG_OK;
    }
    for (; v < QG_LEDGER_SCHEMA_VERSION; v++)
        if (sqlite3_exec(db, migrations[v], NULL, NULL, NULL) != SQLITE_OK) {
            char what[64];
            snprintf(what, sizeof what, "migration to schema version %d",
                     v + 1);
            rc = qg__sq_fail_db(db, path, what, err, errcap);
            goto fail;
        }
    snprintf(sql, sizeof sql, "PRAGMA user_version=%d",
             QG_LEDGER_SCHEMA_VERSION);
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        rc = qg__sq_fail_db(db, path, "cannot commit the migration", err, errcap);
        goto fail;
    }
    return QG_OK;
fail:
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

