/* test_ledger_server.c - the ledger as the running server keeps it, end
 * to end: who may read its files, what a write failure shows (the log,
 * /metrics, /healthz, and its recovery), what a damaged file says at
 * start, and that an acknowledged row is never changed by another
 * request: not by a settle naming another subject, not by a request id
 * reused after a restart or after the counters forgot it.
 *
 * Each test starts its own `quotagate serve` (tests/support/qgproc) on a
 * copy of tests/data/ledger/rules.yaml, whose only window is a 2-second
 * rolling one (a restart rebuilds only the last 2 s, so an older request
 * is known to the ledger alone), or of rules_long.yaml (5 hours).  Ledger
 * rows are read with SQLite (or SQL on PostgreSQL) from the test, as an
 * operator would.  The tests of idempotency and crash recovery run twice:
 * on the SQLite ledger under --data, then on a PostgreSQL ledger
 * (--ledger postgresql://..., a real server started by the test,
 * tests/support/pgproc). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "httpc.h"
#include "pgproc.h"
#include "qgproc.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY

/* The test's server and connection (static: a failing test longjmps out;
 * the teardown stops and removes them). */
static qgproc P;
static httpc C;
static int p_used;

static int teardown(void **state)
{
    (void)state;
    httpc_close(&C);
    if (p_used)
        qgproc_cleanup(&P);
    p_used = 0;
    tst_gc_free_all();
    return 0;
}

static const char *td(const char *rel)
{
    const char *d = getenv("QG_TESTDATA");
    if (!d)
        fail_msg("QG_TESTDATA is not set (run through tests/run.sh)");
    return tst_fmt("%s/%s", d, rel);
}

/* The PostgreSQL group's server, and the test's database on it (on_pg:
 * the test runs on PostgreSQL). */
static pgproc PG;
static int on_pg;
static char pg_db[64], pg_url[256];

/* Start the test's server on a copy of tests/data/ledger/RULES (on
 * PostgreSQL: a fresh database, given with --ledger). */
static void start(const char *rules, const char *const *args)
{
    const char *all[16];
    int n = 0;
    if (qgproc_init(&P) < 0)
        fail_msg("qgproc_init: %s", P.why);
    p_used = 1;
    if (on_pg) {
        if (pgproc_createdb(&PG, pg_db, sizeof pg_db) < 0)
            fail_msg("createdb: %s", PG.why);
        pgproc_url(&PG, pg_db, pg_url, sizeof pg_url);
        all[n++] = "--ledger";
        all[n++] = pg_url;
    }
    while (args && *args && n < 15)
        all[n++] = *args++;
    all[n] = NULL;
    if (qgproc_start_copy(&P, td(tst_fmt("ledger/%s", rules)), all,
                          NULL) < 0) {
        p_used = 0;
        fail_msg("serve did not start");
    }
    httpc_init(&C, qgproc_port(&P));
}

static void restart_after_kill9(void)
{
    if (qgproc_kill9(&P) < 0)
        fail_msg("kill -9: the server was not running");
    if (qgproc_restart(&P) < 0)
        fail_msg("restart after kill -9 failed: %s", P.why);
    httpc_set_port(&C, qgproc_port(&P));
}

static http_resp *req(const char *method, const char *path, const char *key,
                      const char *body)
{
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    if (httpc_call(&C, method, path, "bearer", key, body, r) < 0)
        fail_msg("%s %s: no response: %s", method, path, C.err);
    return r;
}

static http_resp *check_w(const char *subject, const char *rid, int w)
{
    return req("POST", "/v1/check", SERVICE,
               tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                       "\"weight\":%d}", subject, rid, w));
}

/* subject may be NULL (the settle does not name it). */
static http_resp *settle_w(const char *rid, int w, const char *subject)
{
    return req("POST", "/v1/settle", SERVICE,
               subject ? tst_fmt("{\"request_id\":\"%s\",\"weight\":%d,"
                                 "\"status\":\"completed\",\"subject\":"
                                 "\"%s\"}", rid, w, subject)
                       : tst_fmt("{\"request_id\":\"%s\",\"weight\":%d,"
                                 "\"status\":\"completed\"}", rid, w));
}

static void want_error(const http_resp *r, int status, const char *type,
                       const char *what)
{
    WANT(r, status, what);
    if (strcmp(tst_error_type(r, what), type) != 0)
        fail_msg("%s: error type %s, expected %s: %s", what,
                 tst_error_type(r, what), type, tst_excerpt(r));
}

/* "subject|status|weight_milli|reserved_milli" of rid's row, "" when
 * there is none (read at once, no polling). */
static const char *row_of(const char *rid)
{
    if (on_pg) {
        char out[512];
        if (pgproc_sql(&PG, pg_db, tst_fmt("SELECT subject || '|' || status"
                       " || '|' || weight_milli || '|' || reserved_milli"
                       " FROM requests WHERE request_id = '%s'", rid), out,
                       sizeof out) < 0)
            fail_msg("SQL on %s: %s", pg_url, PG.why);
        return tst_fmt("%s", out);
    }
    {
    const char *db = tst_fmt("%s/ledger.db", P.data);
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    const char *out = "";
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(h, 5000) != SQLITE_OK ||
        sqlite3_prepare_v2(h, "SELECT subject || '|' || status || '|' ||"
                           " weight_milli || '|' || reserved_milli"
                           " FROM requests WHERE request_id = ?1", -1, &st,
                           NULL) != SQLITE_OK) {
        const char *e = tst_fmt("%s", sqlite3_errmsg(h));
        sqlite3_finalize(st);
        sqlite3_close(h);
        fail_msg("ledger %s: %s", db, e);
    }
    sqlite3_bind_text(st, 1, rid, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW)
        out = tst_fmt("%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(h);
    return out;
    }
}

/* Poll until rid's row reads `want` (the writer commits in the
 * background), up to 10 s. */
static void want_row(const char *rid, const char *want, const char *what)
{
    const char *got = "";
    for (int i = 0; i < 500; i++) {
        if (!strcmp(got = row_of(rid), want))
            return;
        tst_sleep_ms(20);
    }
    fail_msg("%s: ledger row of %s is \"%s\", expected \"%s\"", what, rid,
             got, want);
}

static double used_of(const char *subject)
{
    http_resp *r = req("GET", tst_fmt("/v1/usage/%s", subject), ADMIN, NULL);
    json_t *w;
    WANT(r, 200, "usage");
    w = json_array_get(json_object_get(tst_jparse(r, "usage"), "windows"), 0);
    if (!w)
        fail_msg("usage of %s: no window: %s", subject, tst_excerpt(r));
    return tst_jnum(w, "used", "usage");
}

static unsigned mode_of(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        fail_msg("stat %s: %s", path, strerror(errno));
    return (unsigned)(sb.st_mode & 07777);
}

/* ============================================================== tests */

/* The ledger holds every subject's usage and the key hashes: only the
 * server's user may read it, whatever the umask; the data directory the
 * server creates is private too. */
static void test_file_modes(void **state)
{
    const char *dir;
    mode_t old = umask(022);
    (void)state;
    assert_int_equal(qgproc_init(&P), 0);
    p_used = 1;
    dir = tst_fmt("%s/fresh/data", P.base);
    {
        const char *args[] = {"--data", dir, NULL};
        if (qgproc_copy_file(td("ledger/rules.yaml"),
                             qgproc_path(&P, "rules.yaml")) < 0 ||
            qgproc_start(&P, qgproc_path(&P, "rules.yaml"), args, NULL) < 0) {
            umask(old);
            fail_msg("serve did not start: %s", P.why);
        }
    }
    umask(old);
    httpc_init(&C, qgproc_port(&P));
    WANT(check_w("fm", tst_uid("fm"), 1), 200, "check");
    WANT(settle_w(tst_uid("fm-none"), 1, NULL), 404, "settle of nothing");
    if (mode_of(dir) != 0700)
        fail_msg("--data %s created with mode %o, expected 700", dir,
                 mode_of(dir));
    for (const char *f = "ledger.db\0ledger.db-wal\0ledger.db-shm\0"; *f;
         f += strlen(f) + 1) {
        const char *path = tst_fmt("%s/%s", dir, f);
        if (mode_of(path) != 0600)
            fail_msg("%s has mode %o, expected 600", path, mode_of(path));
    }
    assert_int_equal(qgproc_stop(&P, 20000), 0);
}

static json_t *healthz(void)
{
    http_resp *r = req("GET", "/healthz", NULL, NULL);
    WANT(r, 200, "healthz");
    return tst_jparse(r, "healthz");
}

/* /healthz as PRODUCT.md section 4 has it, for a server whose ledger is in
 * `state` (status degraded unless ok). */
static void want_health(const char *state)
{
    json_t *j = healthz();
    const char *want_status = strcmp(state, "ok") ? "degraded" : "ok";
    if (strcmp(tst_jstr(j, "ledger", "healthz"), "sqlite") ||
        strcmp(tst_jstr(j, "ledger_state", "healthz"), state) ||
        strcmp(tst_jstr(j, "status", "healthz"), want_status) ||
        strcmp(tst_jstr(j, "store", "healthz"), "memory") ||
        strcmp(tst_jstr(j, "store_state", "healthz"), "ok") ||
        strcmp(tst_jstr(j, "fallback", "healthz"), "none"))
        fail_msg("/healthz: %s, expected ledger sqlite, ledger_state %s, "
                 "status %s", tst_dump(j), state, want_status);
}

/* The value of an unlabelled series in /metrics, -1 when absent. */
static double metric(const char *name)
{
    http_resp *r = req("GET", "/metrics", NULL, NULL);
    const char *p = r->body;
    size_t n = strlen(name);
    WANT(r, 200, "metrics");
    while ((p = strstr(p, name)) != NULL) {
        if ((p == r->body || p[-1] == '\n') && p[n] == ' ')
            return atof(p + n + 1);
        p += n;
    }
    return -1;
}

/* A commit that fails (here: another process holds the write lock past
 * the busy timeout) is logged with the file and SQLite's reason, counted
 * in /metrics, shown in /healthz; once a later write succeeds /healthz
 * says ok again, and the retried settle is recorded. */
static void test_write_failure_recovers(void **state)
{
    const char *rid = tst_uid("wf"), *db, *log;
    sqlite3 *h = NULL;
    http_resp *r;
    (void)state;
    start("rules_long.yaml", NULL);
    want_health("ok");
    WANT(check_w("wf", rid, 1), 200, "check");
    want_row(rid, "wf|1|1000|1000", "the check's row");
    db = tst_fmt("%s/ledger.db", P.data);
    if (sqlite3_open(db, &h) != SQLITE_OK ||
        sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        fail_msg("cannot take the write lock of %s: %s", db,
                 sqlite3_errmsg(h));
    r = settle_w(rid, 3, NULL);   /* waits out the busy timeout (5 s) */
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    want_error(r, 503, "ledger_unavailable", "settle while locked out");
    want_health("errors");
    if (!strstr(tst_jstr(healthz(), "ledger_error", "healthz"), "locked"))
        fail_msg("/healthz: no ledger_error saying why: %s",
                 tst_dump(healthz()));
    assert_true(metric("quotagate_ledger_up") == 0);
    if (metric("quotagate_ledger_write_errors_total") < 1)
        fail_msg("quotagate_ledger_write_errors_total: %g, expected >= 1",
                 metric("quotagate_ledger_write_errors_total"));
    log = tst_slurp(qgproc_path(&P, "stderr.log"));
    if (!strstr(log, db) || !strstr(log, "database is locked"))
        fail_msg("the failed commit is not logged with the file and "
                 "SQLite's reason; stderr:\n%s", log);
    /* the lock is gone: the retried settle is recorded, state ok */
    r = settle_w(rid, 3, NULL);
    WANT(r, 200, "the retried settle");
    want_row(rid, "wf|2|3000|1000", "the retried settle");
    want_health("ok");
    assert_true(metric("quotagate_ledger_up") == 1);
    log = tst_slurp(qgproc_path(&P, "stderr.log"));
    if (!strstr(log, "writes succeed again"))
        fail_msg("the recovery is not logged; stderr:\n%s", log);
    assert_int_equal(qgproc_stop(&P, 20000), 0);
}

/* A damaged page stops the start with the file and SQLite's reason. */
static void test_damaged_ledger_message(void **state)
{
    const char *db, *log, *sub;
    long long last_leaf = 0;
    char page[4096];
    struct stat sb;
    int fd, i;
    (void)state;
    start("rules_long.yaml", NULL);
    sub = tst_fmt("%0200d", 7);
    for (i = 0; i < 200; i++)
        WANT(check_w(sub, tst_uid("dmg"), 0), 200, "check");
    assert_int_equal(qgproc_stop(&P, 20000), 0);  /* checkpointed */
    db = tst_fmt("%s/ledger.db", P.data);
    /* the last leaf page of the requests table (its indexes have pages of
     * their own, which a start does not read), found with dbstat */
    {
        sqlite3 *h;
        sqlite3_stmt *st;
        if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
            sqlite3_prepare_v2(h, "SELECT max(pageno) FROM dbstat WHERE "
                               "name = 'requests' AND pagetype = 'leaf'", -1,
                               &st, NULL) != SQLITE_OK ||
            sqlite3_step(st) != SQLITE_ROW)
            fail_msg("cannot find the rows' pages of %s: %s", db,
                     sqlite3_errmsg(h));
        last_leaf = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        sqlite3_close(h);
    }
    memset(page, 0x5a, sizeof page);
    if ((fd = open(db, O_WRONLY)) < 0 || fstat(fd, &sb) != 0 ||
        sb.st_size < 8 * 4096 || last_leaf < 2 ||
        pwrite(fd, page, sizeof page, (last_leaf - 1) * 4096) != sizeof page)
        fail_msg("cannot damage %s: %s", db, strerror(errno));
    close(fd);
    if (qgproc_restart(&P) == 0)
        fail_msg("the server started on a damaged ledger");
    log = tst_slurp(qgproc_path(&P, "stderr.log"));
    if (!strstr(log, db) || !strstr(log, "malformed"))
        fail_msg("the start on a damaged ledger does not name the file and "
                 "SQLite's reason; stderr:\n%s", log);
}

/* A settle must be charged to the subject that reserved, and only by a
 * settle that agrees on who that is. */
static void test_settle_other_subject(void **state)
{
    const char *rid = tst_uid("so");
    (void)state;
    start("rules_long.yaml", NULL);
    WANT(check_w("so-owner", rid, 2), 200, "check");
    want_error(settle_w(rid, 5, "so-other"), 400, "invalid_request",
               "settle naming another subject");
    want_row(rid, "so-owner|1|2000|2000", "after the refused settle");
    assert_true(used_of("so-other") == 0);
    WANT(settle_w(rid, 5, "so-owner"), 200, "settle naming its subject");
    want_row(rid, "so-owner|2|5000|2000", "after its own settle");
    assert_true(used_of("so-owner") == 5);
    /* a repeat by another subject is refused as well */
    want_error(settle_w(rid, 1, "so-other"), 400, "invalid_request",
               "repeat of the settle naming another subject");
    want_row(rid, "so-owner|2|5000|2000", "after the refused repeat");
    assert_int_equal(qgproc_stop(&P, 20000), 0);
}

/* The victim's settled row, and what another subject's reuse of its id
 * may (not) do to it, then what the victim's own retries get. */
static void reuse_attempts(const char *rid)
{
    http_resp *r;
    want_error(check_w("attacker", rid, 1000), 400, "invalid_request",
               "check reusing another subject's request id");
    want_error(settle_w(rid, 0, "attacker"), 400, "invalid_request",
               "settle reusing another subject's request id");
    tst_sleep_ms(100);            /* anything queued would be written */
    want_row(rid, "victim|2|7000|1000", "after the reuse attempts");
    assert_true(used_of("attacker") == 0);
    /* the victim's own retries: the original answers, no new charge */
    r = check_w("victim", rid, 1);
    WANT(r, 200, "the victim's repeated check");
    if (!tst_jbool(tst_jparse(r, "replay"), "replayed", "replay"))
        fail_msg("the victim's repeated check was not a replay: %s",
                 tst_excerpt(r));
    r = settle_w(rid, 7, "victim");
    WANT(r, 200, "the victim's repeated settle");
    if (!tst_jbool(tst_jparse(r, "replay"), "replayed", "replay") ||
        tst_jnum(tst_jparse(r, "replay"), "charged", "replay") != 7)
        fail_msg("the victim's repeated settle: %s", tst_excerpt(r));
    r = settle_w(rid, 7, NULL);
    WANT(r, 200, "the victim's repeated settle without subject");
    tst_sleep_ms(100);
    want_row(rid, "victim|2|7000|1000", "after the victim's retries");
}

/* GET /v1/authz (forward-auth) with a request id, as a service. */
static http_resp *authz(const char *subject, const char *rid)
{
    const char *h[4];
    http_resp *r = tst_gc_add(GC_RESP, calloc(1, sizeof *r));
    assert_non_null(r);
    h[0] = "X-Quotagate-Key: " SERVICE;
    h[1] = tst_fmt("X-Quotagate-Subject: %s", subject);
    h[2] = tst_fmt("X-Request-Id: %s", rid);
    h[3] = NULL;
    if (httpc_request(&C, "GET", "/v1/authz", h, NULL, 0, r) < 0)
        fail_msg("GET /v1/authz: no response: %s", C.err);
    return r;
}

/* Failure 3 of issue 8, after a restart: the victim's request is older
 * than the rebuild's reach, so only the ledger knows its id. */
static void test_reuse_after_restart(void **state)
{
    const char *rid = tst_uid("rr");
    (void)state;
    start("rules.yaml", NULL);
    WANT(check_w("victim", rid, 1), 200, "victim's check");
    WANT(settle_w(rid, 7, NULL), 200, "victim's settle");
    want_row(rid, "victim|2|7000|1000", "the victim's settle");
    tst_sleep_ms(2300);           /* past the 2 s window: not rebuilt */
    restart_after_kill9();
    reuse_attempts(rid);
    want_error(authz("attacker", rid), 400, "invalid_request",
               "forward-auth reusing another subject's request id");
    want_row(rid, "victim|2|7000|1000", "after the forward-auth attempt");
    assert_true(used_of("victim") == 0);   /* nothing charged again */
    assert_int_equal(qgproc_stop(&P, 20000), 0);
}

/* The same after the counters forgot the id among many others (the
 * remembered-ids bound is 64 here: one shard, which forgets its oldest
 * settled id for each new one past 64). */
static void test_reuse_after_forgotten(void **state)
{
    const char *args[] = {"--request-ids", "64", NULL};
    const char *rid = tst_uid("rf");
    int i;
    (void)state;
    start("rules_long.yaml", args);
    WANT(check_w("victim", rid, 1), 200, "victim's check");
    WANT(settle_w(rid, 7, NULL), 200, "victim's settle");
    /* 1000 newer ids, all settled: the victim's is forgotten after 64 */
    for (i = 0; i < 1000; i++) {
        const char *id = tst_uid("rf-other");
        WANT(check_w("crowd", id, 0), 200, "crowd check");
        WANT(settle_w(id, 0, NULL), 200, "crowd settle");
    }
    assert_true(used_of("victim") == 7);
    reuse_attempts(rid);
    assert_true(used_of("victim") == 7);   /* its settle, once */
    assert_int_equal(qgproc_stop(&P, 20000), 0);
}

/* --ledger-cache bounds the SQLite writer's page cache, which starts at
 * 2 MiB or the bound when smaller, and /metrics shows its size
 * (quotagate_ledger_page_cache_bytes; how it grows: test_ledger.c,
 * test_writer_cache_grows). */
static void test_ledger_cache_flag(void **state)
{
    const char *args[] = {"--ledger-cache", "1", NULL};
    (void)state;
    start("rules.yaml", NULL);
    assert_true(metric("quotagate_ledger_page_cache_bytes") == 2097152);
    assert_int_equal(qgproc_stop(&P, 20000), 0);
    teardown(NULL);
    start("rules.yaml", args);
    assert_true(metric("quotagate_ledger_page_cache_bytes") == 1048576);
    WANT(check_w("cache", tst_uid("cf"), 1), 200, "a check");
    assert_int_equal(qgproc_stop(&P, 20000), 0);
}

/* A reservation never settled, beyond the rebuild's reach after a
 * restart: its settle is recorded from the ledger, late (final at the
 * reservation: the charge can grow, never shrink), then replayed. */
static void test_late_settle_from_ledger(void **state)
{
    const char *grow = tst_uid("ls"), *shrink = tst_uid("ls");
    http_resp *r;
    json_t *j;
    (void)state;
    start("rules.yaml", NULL);
    WANT(check_w("late", grow, 2), 200, "check");
    WANT(check_w("late", shrink, 2), 200, "check");
    want_row(grow, "late|1|2000|2000", "the reservation");
    want_row(shrink, "late|1|2000|2000", "the reservation");
    tst_sleep_ms(2300);           /* past the 2 s window: not rebuilt */
    restart_after_kill9();
    want_error(settle_w(grow, 5, "attacker"), 400, "invalid_request",
               "settle naming another subject");
    r = settle_w(grow, 5, NULL);
    WANT(r, 200, "late settle of a reservation only the ledger holds");
    j = tst_jparse(r, "late settle");
    if (!tst_jbool(j, "late", "late") || tst_jbool(j, "replayed", "late") ||
        tst_jnum(j, "charged", "late") != 5)
        fail_msg("late settle: %s", tst_excerpt(r));
    want_row(grow, "late|2|5000|2000", "the late settle");
    r = settle_w(shrink, 1, "late");
    WANT(r, 200, "late settle below the reservation");
    if (tst_jnum(tst_jparse(r, "late"), "charged", "late") != 2)
        fail_msg("a final reservation was refunded: %s", tst_excerpt(r));
    want_row(shrink, "late|2|2000|2000", "the late settle below");
    r = settle_w(grow, 9, NULL);
    WANT(r, 200, "repeat of the late settle");
    j = tst_jparse(r, "repeat");
    if (!tst_jbool(j, "replayed", "repeat") ||
        tst_jnum(j, "charged", "repeat") != 5)
        fail_msg("repeat of the late settle: %s", tst_excerpt(r));
    want_row(grow, "late|2|5000|2000", "after the repeat");
    assert_int_equal(qgproc_stop(&P, 20000), 0);
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

#define PG_TEST(f) { "postgresql: " #f, f, NULL, teardown, NULL }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_file_modes, teardown),
        cmocka_unit_test_teardown(test_settle_other_subject, teardown),
        cmocka_unit_test_teardown(test_write_failure_recovers, teardown),
        cmocka_unit_test_teardown(test_damaged_ledger_message, teardown),
        cmocka_unit_test_teardown(test_reuse_after_restart, teardown),
        cmocka_unit_test_teardown(test_reuse_after_forgotten, teardown),
        cmocka_unit_test_teardown(test_late_settle_from_ledger, teardown),
        cmocka_unit_test_teardown(test_ledger_cache_flag, teardown),
    };
    /* idempotency and crash recovery, the same on PostgreSQL */
    const struct CMUnitTest pg_tests[] = {
        PG_TEST(test_settle_other_subject),
        PG_TEST(test_reuse_after_restart),
        PG_TEST(test_reuse_after_forgotten),
        PG_TEST(test_late_settle_from_ledger),
    };
    int failed;
    signal(SIGPIPE, SIG_IGN);
    failed = cmocka_run_group_tests_name("ledger_server", tests, NULL, NULL);
    if (!pgproc_bindir()) {
        fprintf(stderr, "no PostgreSQL binaries: make test installs "
                "Debian's postgresql\n");
        return 1;
    }
    return failed + cmocka_run_group_tests_name("ledger_server_postgresql",
                                                pg_tests, pg_setup,
                                                pg_teardown);
}
