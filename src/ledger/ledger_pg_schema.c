/* ledger_pg_schema.c - the PostgreSQL ledger's schema and its migrations.
 *
 * The table quotagate_schema holds one row per schema version applied
 * (the version in force is the largest); migrations[i] brings version i
 * to i + 1.  At open, a database at this build's version is left alone
 * (nothing is written: a read-only server can still be opened); one that
 * is behind is migrated in ONE transaction under a transaction-level
 * advisory lock, the version read again under the lock, so that several
 * instances opening a fresh database at once migrate it once (the others
 * wait for the lock, then find it done).  A database newer than this
 * build is refused before anything is changed.
 *
 * The tables: requests (the columns of SQLite's requests table, BIGINT
 * for the 64-bit fields, plus seq: the order rows were first written,
 * which breaks ties of created_ms in a scan, as SQLite's rowid does),
 * subjects, keys (hashes only), and spool_marks (where each instance's
 * spool replay stands, written with the rows it replays); since version
 * 2 notify_marks and webhook_outbox (ledger.h, the outbox).  Identifiers
 * compare byte-wise (COLLATE "C"): an id is bytes, not words of a
 * language, and the index is faster so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "quotagate.h"
#include "ledger_pg.h"

/* pg_advisory_xact_lock's key: "qgledger" as a big-endian integer. */
#define SCHEMA_LOCK "8171619231619048818"

/* The rollup's counts of the rows of T, by subject, slot and model. */
#define SLOT_SUMS(T)                                                       \
    "SELECT subject, created_ms - created_ms % 900000, model,"            \
    " coalesce(sum(weight_milli) FILTER (WHERE decision = 1), 0)::bigint," \
    " count(*) FILTER (WHERE decision = 1), count(*),"                    \
    " count(*) FILTER (WHERE decision <> 1) FROM " T " GROUP BY 1, 2, 3"
/* The rows of T as signed counts (SIGN "-": taken out). */
#define SLOT_SIGNED(T, SIGN)                                               \
    "SELECT subject, created_ms - created_ms % 900000 AS slot_ms, model,"  \
    " " SIGN "(CASE WHEN decision = 1 THEN weight_milli ELSE 0 END) AS w,"  \
    " " SIGN "(CASE WHEN decision = 1 THEN 1 ELSE 0 END) AS a,"             \
    " " SIGN "1 AS n, " SIGN "(CASE WHEN decision <> 1 THEN 1 ELSE 0 END)"  \
    " AS x FROM " T
#define SLOT_UPSERT                                                        \
    "ON CONFLICT (subject, slot_ms, model) DO UPDATE SET"                  \
    " weight_milli = u.weight_milli + EXCLUDED.weight_milli,"              \
    " admitted = u.admitted + EXCLUDED.admitted,"                          \
    " requests = u.requests + EXCLUDED.requests,"                          \
    " refused = u.refused + EXCLUDED.refused"

static const char *const migrations[] = {
    /* 0 -> 1 */
    "CREATE TABLE requests ("
    " request_id TEXT COLLATE \"C\" PRIMARY KEY,"
    " subject TEXT COLLATE \"C\" NOT NULL,"
    " org TEXT NOT NULL DEFAULT '', plan TEXT NOT NULL DEFAULT '',"
    " rules_version TEXT NOT NULL DEFAULT '',"
    " weights_version TEXT NOT NULL DEFAULT '',"
    " model TEXT NOT NULL DEFAULT '', \"window\" TEXT NOT NULL DEFAULT '',"
    " decision INTEGER NOT NULL, status INTEGER NOT NULL,"
    " estimated INTEGER NOT NULL DEFAULT 0,"
    " input_tokens BIGINT NOT NULL DEFAULT 0,"
    " output_tokens BIGINT NOT NULL DEFAULT 0,"
    " reserved_milli BIGINT NOT NULL DEFAULT 0,"
    " weight_milli BIGINT NOT NULL DEFAULT 0,"
    " created_ms BIGINT NOT NULL, settled_ms BIGINT NOT NULL DEFAULT 0,"
    " overage_milli BIGINT NOT NULL DEFAULT 0,"
    " overage_price_micro BIGINT NOT NULL DEFAULT 0,"
    " overage_cost_micro BIGINT NOT NULL DEFAULT 0,"
    " headroom_milli BIGINT NOT NULL DEFAULT -1,"
    " detail TEXT NOT NULL DEFAULT '',"
    " fallback INTEGER NOT NULL DEFAULT 0,"
    " seq BIGINT GENERATED ALWAYS AS IDENTITY);"
    "CREATE INDEX requests_created ON requests (created_ms, seq);"
    "CREATE TABLE subjects ("
    " subject TEXT COLLATE \"C\" PRIMARY KEY, plan TEXT NOT NULL,"
    " org TEXT NOT NULL DEFAULT '',"
    " billing_anchor_ms BIGINT NOT NULL DEFAULT 0,"
    " updated_ms BIGINT NOT NULL);"
    "CREATE INDEX subjects_updated ON subjects (updated_ms);"
    "CREATE TABLE keys ("
    " id TEXT COLLATE \"C\" PRIMARY KEY, subject TEXT NOT NULL DEFAULT '',"
    " role TEXT NOT NULL, hash BYTEA NOT NULL, created_ms BIGINT NOT NULL,"
    " revoked_ms BIGINT NOT NULL DEFAULT 0);"
    "CREATE TABLE spool_marks ("
    " spool_id TEXT COLLATE \"C\" PRIMARY KEY, seq BIGINT NOT NULL);",
    /* 1 -> 2: the webhook outbox (ledger.h; ledger_pg_outbox.c) */
    "CREATE TABLE notify_marks ("
    " subject TEXT COLLATE \"C\" NOT NULL,"
    " \"window\" TEXT COLLATE \"C\" NOT NULL,"
    " threshold_milli BIGINT NOT NULL, period_key BIGINT NOT NULL,"
    " armed INTEGER NOT NULL, episode BIGINT NOT NULL,"
    " fired_ms BIGINT NOT NULL,"
    " PRIMARY KEY (subject, \"window\", threshold_milli));"
    "CREATE TABLE webhook_outbox ("
    " id TEXT COLLATE \"C\" NOT NULL, url TEXT COLLATE \"C\" NOT NULL,"
    " type TEXT NOT NULL, subject TEXT COLLATE \"C\" NOT NULL,"
    " \"window\" TEXT COLLATE \"C\" NOT NULL,"
    " threshold_milli BIGINT NOT NULL, period_key BIGINT NOT NULL,"
    " body TEXT NOT NULL, created_ms BIGINT NOT NULL,"
    " state INTEGER NOT NULL DEFAULT 0, next_ms BIGINT NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0,"
    " lease_owner TEXT NOT NULL DEFAULT '',"
    " lease_until BIGINT NOT NULL DEFAULT 0,"
    " last_error TEXT NOT NULL DEFAULT '',"
    " done_ms BIGINT NOT NULL DEFAULT 0,"
    " PRIMARY KEY (id, url));"
    "CREATE INDEX webhook_outbox_due ON webhook_outbox (next_ms)"
    " WHERE state = 0;",
    /* 2 -> 3: the history (ledger.h "history"), as SQLite's version 6: a
     * subject's rows by time, and the rollup per quarter hour and model,
     * filled from the rows already there and kept by statement-level
     * triggers (one upsert per batch and kind of row, its groups in key
     * order, so that two instances' batches lock slots in one order) */
    "CREATE INDEX requests_subject ON requests (subject, created_ms, seq);"
    "CREATE TABLE usage_slots ("
    " subject TEXT COLLATE \"C\" NOT NULL, slot_ms BIGINT NOT NULL,"
    " model TEXT COLLATE \"C\" NOT NULL,"
    " weight_milli BIGINT NOT NULL DEFAULT 0,"
    " admitted BIGINT NOT NULL DEFAULT 0,"
    " requests BIGINT NOT NULL DEFAULT 0,"
    " refused BIGINT NOT NULL DEFAULT 0,"
    " PRIMARY KEY (subject, slot_ms, model));"
    "INSERT INTO usage_slots " SLOT_SUMS("requests") ";"
    "CREATE FUNCTION qg_slots_insert() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN INSERT INTO usage_slots AS u " SLOT_SUMS("qg_new")
    " ORDER BY 1, 2, 3 " SLOT_UPSERT "; RETURN NULL; END $$;"
    "CREATE FUNCTION qg_slots_update() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN INSERT INTO usage_slots AS u SELECT subject, slot_ms, model,"
    " sum(w)::bigint, sum(a)::bigint, sum(n)::bigint, sum(x)::bigint FROM ("
    " " SLOT_SIGNED("qg_old", "-") " UNION ALL " SLOT_SIGNED("qg_new", "")
    " ) d GROUP BY 1, 2, 3"
    " HAVING sum(w) <> 0 OR sum(a) <> 0 OR sum(n) <> 0 OR sum(x) <> 0"
    " ORDER BY 1, 2, 3 " SLOT_UPSERT "; RETURN NULL; END $$;"
    "CREATE TRIGGER requests_slots_insert AFTER INSERT ON requests"
    " REFERENCING NEW TABLE AS qg_new FOR EACH STATEMENT"
    " EXECUTE FUNCTION qg_slots_insert();"
    "CREATE TRIGGER requests_slots_update AFTER UPDATE ON requests"
    " REFERENCING OLD TABLE AS qg_old NEW TABLE AS qg_new FOR EACH STATEMENT"
    " EXECUTE FUNCTION qg_slots_update();",
    /* 3 -> 4: one org's rows by time (explain; one subject's came with
     * the history's index) */
    /* one string in two (parenthesised: clang's -Wstring-concatenation
     * takes an array element made of two literals for a missing comma) */
    ("CREATE INDEX IF NOT EXISTS requests_org ON requests (org, created_ms, seq)"
     " WHERE org <> '';"),
};

_Static_assert(sizeof migrations / sizeof migrations[0] ==
                   QG_PG_SCHEMA_VERSION,
               "one migration per schema version");

static int fail(PGconn *c, PGresult *r, const char *shown, const char *what,
                char *err, size_t errcap)
{
    char why[512];
    int rc = qg__pg_fail(c, r, why, sizeof why);
    snprintf(err, errcap, "ledger %s: %s: %s", shown, what, why);
    PQclear(r);
    return rc;
}

/* The schema version of the database (0: none yet).  QG_OK or an error
 * with err. */
static int read_version(PGconn *c, const char *shown, int *v, char *err,
                        size_t errcap)
{
    PGresult *r = PQexec(c, "SELECT to_regclass('quotagate_schema')"
                            " IS NOT NULL");
    *v = 0;
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        return fail(c, r, shown, "cannot read the schema version", err,
                    errcap);
    if (strcmp(PQgetvalue(r, 0, 0), "t") != 0) {
        PQclear(r);
        return QG_OK;
    }
    PQclear(r);
    r = PQexec(c, "SELECT coalesce(max(version), 0) FROM quotagate_schema");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        return fail(c, r, shown, "cannot read the schema version", err,
                    errcap);
    *v = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return QG_OK;
}

static int too_new(int v, const char *shown, char *err, size_t errcap)
{
    snprintf(err, errcap, "ledger %s: schema version %d is newer than this "
             "build of quotagate knows (%d); use a newer quotagate",
             shown, v, QG_PG_SCHEMA_VERSION);
    return QG_ESTATE;
}

static int exec_ok(PGconn *c, const char *sql, const char *shown,
                   const char *what, char *err, size_t errcap)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK &&
        PQresultStatus(r) != PGRES_TUPLES_OK)
        return fail(c, r, shown, what, err, errcap);
    PQclear(r);
    return QG_OK;
}

int qg__pg_migrate(PGconn *c, const char *shown, char *err, size_t errcap)
{
    char sql[128], what[64];
    int v = 0, rc;
    if ((rc = read_version(c, shown, &v, err, errcap)) != QG_OK)
        return rc;
    if (v > QG_PG_SCHEMA_VERSION)
        return too_new(v, shown, err, errcap);
    if (v == QG_PG_SCHEMA_VERSION)
        return QG_OK;
    if ((rc = exec_ok(c, "BEGIN", shown, "cannot begin the migration", err,
                      errcap)) != QG_OK)
        return rc;
    if ((rc = exec_ok(c, "SELECT pg_advisory_xact_lock(" SCHEMA_LOCK ")",
                      shown, "cannot lock for the migration", err,
                      errcap)) != QG_OK ||
        (rc = exec_ok(c, "CREATE TABLE IF NOT EXISTS quotagate_schema ("
                         " version INTEGER PRIMARY KEY,"
                         " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                      shown, "cannot create the schema table", err,
                      errcap)) != QG_OK ||
        /* again under the lock: another instance may have done it */
        (rc = read_version(c, shown, &v, err, errcap)) != QG_OK)
        goto fail;
    if (v > QG_PG_SCHEMA_VERSION) {
        rc = too_new(v, shown, err, errcap);
        goto fail;
    }
    for (; v < QG_PG_SCHEMA_VERSION; v++) {
        snprintf(what, sizeof what, "migration to schema version %d", v + 1);
        snprintf(sql, sizeof sql, "INSERT INTO quotagate_schema (version)"
                 " VALUES (%d)", v + 1);
        if ((rc = exec_ok(c, migrations[v], shown, what, err, errcap)) !=
                QG_OK ||
            (rc = exec_ok(c, sql, shown, what, err, errcap)) != QG_OK)
            goto fail;
    }
    if ((rc = exec_ok(c, "COMMIT", shown, "cannot commit the migration",
                      err, errcap)) != QG_OK)
        goto fail;
    return QG_OK;
fail:
    PQclear(PQexec(c, "ROLLBACK"));
    return rc;
}
