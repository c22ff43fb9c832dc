/* test_sqlite_vfs.c - the ledger writer's layers over SQLite on a real
 * file: its VFS (ledger_sqlite_vfs.c), which gathers a transaction's WAL
 * writes into one write, and its page cache (ledger_sqlite_pcache.c),
 * installed here before SQLite initializes, as serve does, so that every
 * test runs over it.  Under the VFS a counting VFS registered as the
 * default (before the gathering one, which takes the default as its
 * base), so that the test sees what reaches the file system.
 *
 * - Gathering: a commit that dirties many pages reaches the WAL file as
 *   one write per 124 KB of frames (and a new WAL's header once), where
 *   the default VFS makes two per page; a second connection on the default
 *   VFS sees every committed row after each COMMIT (the frames are in the
 *   file before the commit is published).
 * - A transaction larger than the page cache spills frames before its
 *   COMMIT and writes pages again: the reader sees exactly the committed
 *   rows, and the file passes integrity_check.
 * - A failed write (as a full disk): the COMMIT reports it (the gathered
 *   bytes go out inside the WAL's sync), nothing of the transaction is
 *   visible, the file passes integrity_check, and the next transaction
 *   commits.
 * - The page cache: with a 32 MB cache, as the ledger's writer has,
 *   B-tree splits swap pages through the lock page's number, which the
 *   layer renumbers; over commits, rollbacks and deletes the file holds
 *   exactly the committed rows, for a second connection and after a
 *   reopen, and passes integrity_check.
 * The ledger's own kill -9 test (test_ledger.c, test_kill9_durability)
 * runs its durable writer through this VFS. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "ledger_sqlite.h"

/* --- the counting VFS: WAL writes seen, and an injectable failure */

typedef struct cfile {
    sqlite3_file base;
    sqlite3_file *real;
    int wal;
} cfile;

static sqlite3_vfs *real_vfs;
static sqlite3_vfs count_vfs;
static atomic_long wal_writes, wal_bytes;
static atomic_long fail_writes;   /* > 0: the WAL's next writes fail */

#define REAL(f) (((cfile *)(f))->real)
#define RM(f) (REAL(f)->pMethods)

static int c_close(sqlite3_file *f) { return RM(f)->xClose(REAL(f)); }
static int c_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o)
{
    return RM(f)->xRead(REAL(f), b, n, o);
}
static int c_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
    if (((cfile *)f)->wal) {
        atomic_fetch_add(&wal_writes, 1);
        atomic_fetch_add(&wal_bytes, n);
        if (atomic_load(&fail_writes) > 0) {
            atomic_fetch_sub(&fail_writes, 1);
            return SQLITE_FULL;
        }
    }
    return RM(f)->xWrite(REAL(f), b, n, o);
}
static int c_truncate(sqlite3_file *f, sqlite3_int64 s)
{
    return RM(f)->xTruncate(REAL(f), s);
}
static int c_sync(sqlite3_file *f, int fl) { return RM(f)->xSync(REAL(f), fl); }
static int c_size(sqlite3_file *f, sqlite3_int64 *s)
{
    return RM(f)->xFileSize(REAL(f), s);
}
static int c_lock(sqlite3_file *f, int l) { return RM(f)->xLock(REAL(f), l); }
static int c_unlock(sqlite3_file *f, int l) { return RM(f)->xUnlock(REAL(f), l); }
static int c_reserved(sqlite3_file *f, int *o)
{
    return RM(f)->xCheckReservedLock(REAL(f), o);
}
static int c_fcntl(sqlite3_file *f, int op, void *a)
{
    return RM(f)->xFileControl(REAL(f), op, a);
}
static int c_sector(sqlite3_file *f) { return RM(f)->xSectorSize(REAL(f)); }
static int c_devchar(sqlite3_file *f)
{
    return RM(f)->xDeviceCharacteristics(REAL(f));
}
static int c_shmmap(sqlite3_file *f, int p, int s, int e, void volatile **pp)
{
    return RM(f)->xShmMap(REAL(f), p, s, e, pp);
}
static int c_shmlock(sqlite3_file *f, int o, int n, int fl)
{
    return RM(f)->xShmLock(REAL(f), o, n, fl);
}
static void c_shmbarrier(sqlite3_file *f) { RM(f)->xShmBarrier(REAL(f)); }
static int c_shmunmap(sqlite3_file *f, int d)
{
    return RM(f)->xShmUnmap(REAL(f), d);
}
static int c_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp)
{
    return RM(f)->xFetch(REAL(f), o, n, pp);
}
static int c_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p)
{
    return RM(f)->xUnfetch(REAL(f), o, p);
}

static const sqlite3_io_methods count_io = {
    3, c_close, c_read, c_write, c_truncate, c_sync, c_size, c_lock,
    c_unlock, c_reserved, c_fcntl, c_sector, c_devchar, c_shmmap,
    c_shmlock, c_shmbarrier, c_shmunmap, c_fetch, c_unfetch,
};

static int c_open(sqlite3_vfs *v, const char *name, sqlite3_file *f,
                  int flags, int *out)
{
    cfile *cf = (cfile *)f;
    int rc;
    (void)v;
    cf->base.pMethods = NULL;
    cf->real = (sqlite3_file *)(cf + 1);
    cf->real->pMethods = NULL;
    cf->wal = (flags & SQLITE_OPEN_WAL) != 0;
    rc = real_vfs->xOpen(real_vfs, name, cf->real, flags, out);
    if (cf->real->pMethods)
        cf->base.pMethods = &count_io;
    return rc;
}

static int setup_vfs(void **state)
{
    (void)state;
    if (qg__sq_pcache_install() != SQLITE_OK ||
        sqlite3_initialize() != SQLITE_OK ||
        !(real_vfs = sqlite3_vfs_find(NULL)))
        return -1;
    count_vfs = *real_vfs;
    count_vfs.pNext = NULL;
    count_vfs.zName = "counting";
    count_vfs.szOsFile = (int)sizeof(cfile) + real_vfs->szOsFile;
    count_vfs.xOpen = c_open;
    if (sqlite3_vfs_register(&count_vfs, 1) != SQLITE_OK)
        return -1;
    return qg__sq_vfs_register() == SQLITE_OK ? 0 : -1;
}

/* --- helpers */

typedef struct db2 {
    char dir[64], path[96];
    sqlite3 *w, *r;               /* writer (vfs under test), reader */
} db2;

static void exec_ok(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        fail_msg("%s: %s", sql, msg ? msg : sqlite3_errstr(rc));
}

static sqlite3 *open_db(const char *path, const char *vfs)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db,
                                     SQLITE_OPEN_READWRITE |
                                         SQLITE_OPEN_CREATE,
                                     vfs),
                     SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    exec_ok(db, "PRAGMA journal_mode=WAL");
    exec_ok(db, "PRAGMA synchronous=FULL");
    return db;
}

/* writer through vfs (NULL: the default, here the counting VFS alone) */
static void db2_open(db2 *d, const char *vfs)
{
    snprintf(d->dir, sizeof d->dir, "/tmp/qg-vfs.XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->path, sizeof d->path, "%s/t.db", d->dir);
    d->w = open_db(d->path, vfs);
    exec_ok(d->w, "PRAGMA wal_autocheckpoint=0");
    exec_ok(d->w, "CREATE TABLE t (k INTEGER PRIMARY KEY, tag TEXT, "
                  "pad BLOB)");
    exec_ok(d->w, "CREATE INDEX t_tag ON t(tag)");
    d->r = open_db(d->path, NULL);
}

static void db2_close(db2 *d)
{
    char cmd[128];
    sqlite3_close(d->r);
    sqlite3_close(d->w);
    snprintf(cmd, sizeof cmd, "rm -rf %s", d->dir);
    assert_int_equal(system(cmd), 0);
}

static int64_t count_rows(sqlite3 *db)
{
    sqlite3_stmt *st;
    int64_t n = -1;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*), "
                                            "coalesce(sum(length(pad)), 0) "
                                            "FROM t",
                                        -1, &st, NULL),
                     SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

static void integrity_ok(sqlite3 *db)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1,
                                        &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
}

/* n rows with random tags (index pages all over), in the open
 * transaction */
static void insert_open(sqlite3 *db, int64_t first, int n)
{
    sqlite3_stmt *st;
    char tag[32];
    assert_int_equal(sqlite3_prepare_v2(db, "INSERT INTO t VALUES (?1, ?2, "
                                            "zeroblob(300))",
                                        -1, &st, NULL),
                     SQLITE_OK);
    for (int i = 0; i < n; i++) {
        snprintf(tag, sizeof tag, "%08x", (unsigned)rand());
        sqlite3_bind_int64(st, 1, first + i);
        sqlite3_bind_text(st, 2, tag, -1, SQLITE_TRANSIENT);
        assert_int_equal(sqlite3_step(st), SQLITE_DONE);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
}

/* one transaction of n such rows */
static int insert_rows(sqlite3 *db, int64_t first, int n)
{
    int rc;
    exec_ok(db, "BEGIN IMMEDIATE");
    insert_open(db, first, n);
    rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        (void)sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

/* WAL writes of `commits` transactions of 200 rows through vfs; *bytes
 * their bytes */
static long writes_per_commits(const char *vfs, int commits, long *bytes)
{
    db2 d;
    long before, b0;
    int64_t total = 0;
    db2_open(&d, vfs);
    before = atomic_load(&wal_writes);
    b0 = atomic_load(&wal_bytes);
    for (int c = 0; c < commits; c++) {
        assert_int_equal(insert_rows(d.w, total, 200), SQLITE_OK);
        total += 200;
        /* published: the reader sees the whole commit at once */
        assert_int_equal(count_rows(d.r), total);
    }
    before = atomic_load(&wal_writes) - before;
    *bytes = atomic_load(&wal_bytes) - b0;
    integrity_ok(d.r);
    db2_close(&d);
    return before;
}

/* --- tests */

static void test_commit_is_one_write(void **state)
{
    long plain, gathered, pbytes, gbytes;
    (void)state;
    srand(7);
    plain = writes_per_commits(NULL, 20, &pbytes);
    srand(7);
    gathered = writes_per_commits(QG_SQ_VFS, 20, &gbytes);
    print_message("WAL writes for 20 commits of 200 rows: %ld by the "
                  "default VFS (%ld bytes), %ld gathered (%ld bytes)\n",
                  plain, pbytes, gathered, gbytes);
    /* the same bytes reach the file */
    assert_int_equal(pbytes, gbytes);
    /* 200 rows of ~330 bytes are ~17 table pages plus index pages: the
     * default VFS writes each frame as a header and a page */
    assert_true(plain >= 20 * 2 * 17);
    /* gathered: the WAL's header, then per commit one write of at most
     * 128 KB (the default VFS's limit on one write) */
    assert_true(gathered <= 1 + 20 + gbytes / 100000);
}

static void test_spilled_transaction(void **state)
{
    db2 d;
    (void)state;
    srand(11);
    db2_open(&d, QG_SQ_VFS);
    /* a cache of 10 pages: the transaction spills frames and writes
     * some of its pages more than once before it commits */
    exec_ok(d.w, "PRAGMA cache_size=10");
    assert_int_equal(insert_rows(d.w, 0, 3000), SQLITE_OK);
    assert_int_equal(count_rows(d.r), 3000);
    exec_ok(d.w, "BEGIN IMMEDIATE; UPDATE t SET tag = tag || 'x' "
                 "WHERE k % 3 = 0; COMMIT");
    {
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(d.r, "SELECT count(*) FROM t "
                                                 "WHERE tag LIKE '%x'",
                                            -1, &st, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int64(st, 0), 1000);
        sqlite3_finalize(st);
    }
    integrity_ok(d.r);
    integrity_ok(d.w);
    db2_close(&d);
}

static void test_failed_write_fails_commit(void **state)
{
    db2 d;
    (void)state;
    srand(13);
    db2_open(&d, QG_SQ_VFS);
    assert_int_equal(insert_rows(d.w, 0, 200), SQLITE_OK);
    atomic_store(&fail_writes, 1);
    /* the gathered frames fail as one write, inside COMMIT's sync */
    assert_int_not_equal(insert_rows(d.w, 200, 200), SQLITE_OK);
    assert_int_equal(atomic_load(&fail_writes), 0);
    assert_int_equal(count_rows(d.r), 200);
    assert_int_equal(count_rows(d.w), 200);
    /* the connection goes on: the next transaction commits */
    assert_int_equal(insert_rows(d.w, 200, 200), SQLITE_OK);
    assert_int_equal(count_rows(d.r), 400);
    integrity_ok(d.r);
    /* and the file, reopened, holds exactly the committed rows */
    sqlite3_close(d.w);
    d.w = open_db(d.path, QG_SQ_VFS);
    assert_int_equal(count_rows(d.w), 400);
    integrity_ok(d.w);
    db2_close(&d);
}

static void test_pcache_swaps(void **state)
{
    db2 d;
    unsigned long swaps = qg__sq_pcache_swaps();
    int64_t next = 0, rows = 0;
    (void)state;
    /* installed by setup, before SQLite initialized; again: a no-op */
    assert_true(qg__sq_pcache_installed());
    assert_int_equal(qg__sq_pcache_install(), SQLITE_OK);
    srand(17);
    db2_open(&d, QG_SQ_VFS);
    exec_ok(d.w, "PRAGMA cache_size=-32768");
    for (int c = 0; c < 60; c++) {
        if (c % 6 == 5) {
            /* rolled back: the pages it made leave the cache */
            exec_ok(d.w, "BEGIN IMMEDIATE");
            insert_open(d.w, next, 1500);
            exec_ok(d.w, "ROLLBACK");
        } else {
            assert_int_equal(insert_rows(d.w, next, 1000), SQLITE_OK);
            rows += 1000;
        }
        next += 1500;
        if (c % 10 == 9) {
            /* pages emptied and freed, then reused by later splits */
            exec_ok(d.w, "DELETE FROM t WHERE k % 7 = 0");
            rows -= sqlite3_changes(d.w);
        }
        assert_int_equal(count_rows(d.r), rows);
    }
    print_message("%lu page swaps renumbered\n",
                  qg__sq_pcache_swaps() - swaps);
    assert_true(qg__sq_pcache_swaps() > swaps);
    assert_int_equal(count_rows(d.w), rows);
    integrity_ok(d.w);
    integrity_ok(d.r);
    sqlite3_close(d.w);
    d.w = open_db(d.path, NULL);
    assert_int_equal(count_rows(d.w), rows);
    integrity_ok(d.w);
    db2_close(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_is_one_write),
        cmocka_unit_test(test_spilled_transaction),
        cmocka_unit_test(test_failed_write_fails_commit),
        cmocka_unit_test(test_pcache_swaps),
    };
    return cmocka_run_group_tests(tests, setup_vfs, NULL);
}
