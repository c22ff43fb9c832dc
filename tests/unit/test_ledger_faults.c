/* test_ledger_faults.c - the SQLite ledger under injected faults, SQLite's
 * own way: fail the Nth call for N = 1, 2, ... until a run completes
 * without reaching N.
 *
 * Two hooks, set up before SQLite initialises:
 *  - a VFS registered as the default over the real one ("unix"), whose
 *    files fail the Nth xOpen, xDelete, xAccess, xRead, xWrite (as an
 *    I/O error, or as a full disk for odd N), xTruncate, xSync, xFileSize,
 *    xLock, xShmMap, xShmLock or xFetch (used only if something turns
 *    memory-mapped I/O on) with the matching SQLITE_IOERR_* code;
 *  - SQLITE_CONFIG_MALLOC with an allocator whose Nth xMalloc or xRealloc
 *    returns NULL.
 * Calls are counted across every connection and thread of the ledger.
 * Each kind runs once failing only the Nth call (a transient fault) and
 * once failing every call from the Nth on (a disk or memory that stays
 * gone).
 *
 * The ledger is opened as the server opens it (with the request id
 * filter, whose filling at open is one more read path).
 *
 * The write path: open a ledger (durable mode), write check rows and
 * settles as the server does (check rows without a callback, settles
 * waiting for theirs, failed settles retried as a client would, a whole
 * "recovered" row), read one back, close; then, without faults, reopen
 * and check that every acknowledged settle's row is there and intact,
 * that the file passes PRAGMA integrity_check, and that a new write
 * succeeds.  The rebuild path: from the image of a ledger killed with
 * rows in its WAL, open and scan (the start's rebuild) and look rows up:
 * a scan either returns every row or an error with SQLite's reason, never
 * fewer rows as a success, and a lookup never says "not found" for a row
 * that is there.  Nothing may crash (ASan runs this too).
 *
 * Every N is run, except allocation failures while the ledger opens
 * (SQLite allocates some 4,500 times to open the ledger's four
 * connections and its schema): there every 16th N, unless QG_FAULTS_FULL=1
 * asks for all of them (minutes instead of seconds).  Databases live in
 * /dev/shm when it exists (fsync is free there; the injected faults are
 * the point, not the disk).  Each loop prints how many injection points it
 * covered. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "quotagate.h"
#include "ledger.h"

#define BASE_MS 1780000000000LL
#define NREQ 6                  /* requests per write run */
#define NSCAN 400               /* rows of the rebuild image */
#define MAX_N 200000            /* a loop that never ends is a failure */

/* ------------------------------------------------------------ faults */

enum { K_NONE, K_IO, K_MEM };

static struct {
    atomic_int kind;            /* which calls count (K_NONE: none) */
    atomic_long calls;          /* counted since armed */
    long fail_at;               /* N */
    int persist;                /* fail every call from N on */
} fi;

static void arm(int kind, long n, int persist)
{
    atomic_store(&fi.calls, 0);
    fi.fail_at = n;
    fi.persist = persist;
    atomic_store(&fi.kind, kind);
}

/* Stop injecting; returns whether the Nth call was reached. */
static int disarm(void)
{
    atomic_store(&fi.kind, K_NONE);
    return atomic_load(&fi.calls) >= fi.fail_at;
}

static int fault(int kind)
{
    long n;
    if (atomic_load_explicit(&fi.kind, memory_order_relaxed) != kind)
        return 0;
    n = atomic_fetch_add(&fi.calls, 1) + 1;
    return n == fi.fail_at || (fi.persist && n > fi.fail_at);
}

/* --- the VFS shim: our file header, then the real VFS's file */

typedef struct sfile {
    sqlite3_file base;
    sqlite3_file *real;
} sfile;

static sqlite3_vfs *real_vfs;
static sqlite3_vfs shim_vfs;
static const sqlite3_io_methods shim_io;

#define REAL(f) (((sfile *)(f))->real)
#define RM(f) (REAL(f)->pMethods)

static int s_close(sqlite3_file *f)
{
    return RM(f)->xClose(REAL(f));
}

static int s_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off)
{
    return fault(K_IO) ? SQLITE_IOERR_READ
                       : RM(f)->xRead(REAL(f), b, n, off);
}

static int s_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off)
{
    if (fault(K_IO))
        return fi.fail_at % 2 ? SQLITE_FULL : SQLITE_IOERR_WRITE;
    return RM(f)->xWrite(REAL(f), b, n, off);
}

static int s_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    return fault(K_IO) ? SQLITE_IOERR_TRUNCATE
                       : RM(f)->xTruncate(REAL(f), size);
}

static int s_sync(sqlite3_file *f, int flags)
{
    return fault(K_IO) ? SQLITE_IOERR_FSYNC : RM(f)->xSync(REAL(f), flags);
}

static int s_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return fault(K_IO) ? SQLITE_IOERR_FSTAT : RM(f)->xFileSize(REAL(f), size);
}

static int s_lock(sqlite3_file *f, int lock)
{
    return fault(K_IO) ? SQLITE_IOERR_LOCK : RM(f)->xLock(REAL(f), lock);
}

static int s_unlock(sqlite3_file *f, int lock)
{
    return RM(f)->xUnlock(REAL(f), lock);
}

static int s_reserved(sqlite3_file *f, int *out)
{
    return RM(f)->xCheckReservedLock(REAL(f), out);
}

static int s_fcntl(sqlite3_file *f, int op, void *arg)
{
    return RM(f)->xFileControl(REAL(f), op, arg);
}

static int s_sector(sqlite3_file *f)
{
    return RM(f)->xSectorSize(REAL(f));
}

static int s_devchar(sqlite3_file *f)
{
    return RM(f)->xDeviceCharacteristics(REAL(f));
}

static int s_shmmap(sqlite3_file *f, int pg, int pgsz, int extend,
                    void volatile **pp)
{
    if (fault(K_IO)) {
        *pp = NULL;
        return SQLITE_IOERR_SHMMAP;
    }
    return RM(f)->xShmMap(REAL(f), pg, pgsz, extend, pp);
}

static int s_shmlock(sqlite3_file *f, int off, int n, int flags)
{
    /* only taking a lock can fail: a failed release would leave the
     * real lock held, which no file system does */
    if ((flags & SQLITE_SHM_LOCK) && fault(K_IO))
        return SQLITE_IOERR_SHMLOCK;
    return RM(f)->xShmLock(REAL(f), off, n, flags);
}

static void s_shmbarrier(sqlite3_file *f)
{
    RM(f)->xShmBarrier(REAL(f));
}

static int s_shmunmap(sqlite3_file *f, int del)
{
    return RM(f)->xShmUnmap(REAL(f), del);
}

static int s_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp)
{
    if (fault(K_IO)) {
        *pp = NULL;
        return SQLITE_IOERR_MMAP;
    }
    return RM(f)->xFetch(REAL(f), off, n, pp);
}

static int s_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return RM(f)->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods shim_io = {
    3, s_close, s_read, s_write, s_truncate, s_sync, s_size, s_lock,
    s_unlock, s_reserved, s_fcntl, s_sector, s_devchar, s_shmmap,
    s_shmlock, s_shmbarrier, s_shmunmap, s_fetch, s_unfetch,
};

static int v_open(sqlite3_vfs *v, const char *name, sqlite3_file *f,
                  int flags, int *out)
{
    sfile *sf = (sfile *)f;
    int rc;
    (void)v;
    sf->base.pMethods = NULL;
    sf->real = (sqlite3_file *)(sf + 1);
    sf->real->pMethods = NULL;
    if (fault(K_IO))
        return SQLITE_CANTOPEN;
    rc = real_vfs->xOpen(real_vfs, name, sf->real, flags, out);
    if (sf->real->pMethods)
        sf->base.pMethods = &shim_io;
    return rc;
}

static int v_delete(sqlite3_vfs *v, const char *name, int sync)
{
    (void)v;
    return fault(K_IO) ? SQLITE_IOERR_DELETE
                       : real_vfs->xDelete(real_vfs, name, sync);
}

static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
    (void)v;
    return fault(K_IO) ? SQLITE_IOERR_ACCESS
                       : real_vfs->xAccess(real_vfs, name, flags, out);
}

/* --- the failing allocator */

static sqlite3_mem_methods real_mem, shim_mem;

static void *m_malloc(int n)
{
    return fault(K_MEM) ? NULL : real_mem.xMalloc(n);
}

static void *m_realloc(void *p, int n)
{
    return fault(K_MEM) ? NULL : real_mem.xRealloc(p, n);
}

/* Install both hooks: before SQLite initialises (SQLITE_CONFIG_MALLOC
 * requires it). */
static int install_hooks(void)
{
    sqlite3_shutdown();
    if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &real_mem) != SQLITE_OK)
        return -1;
    shim_mem = real_mem;
    shim_mem.xMalloc = m_malloc;
    shim_mem.xRealloc = m_realloc;
    if (sqlite3_config(SQLITE_CONFIG_MALLOC, &shim_mem) != SQLITE_OK ||
        sqlite3_initialize() != SQLITE_OK ||
        !(real_vfs = sqlite3_vfs_find(NULL)))
        return -1;
    shim_vfs = *real_vfs;
    shim_vfs.pNext = NULL;
    shim_vfs.zName = "faultshim";
    shim_vfs.szOsFile = (int)sizeof(sfile) + real_vfs->szOsFile;
    shim_vfs.xOpen = v_open;
    shim_vfs.xDelete = v_delete;
    shim_vfs.xAccess = v_access;
    return sqlite3_vfs_register(&shim_vfs, 1) == SQLITE_OK ? 0 : -1;
}

/* ------------------------------------------------------------ helpers */

static char root[128];          /* this process's directory */

static void rm_db(const char *dir)
{
    static const char *const sfx[] = { "", "-wal", "-shm", "-journal" };
    char p[300];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/ledger.db%s", dir, sfx[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void copy_file(const char *from, const char *to)
{
    char buf[65536];
    ssize_t n;
    int in = open(from, O_RDONLY), out;
    if (in < 0)
        return;                 /* e.g. no -wal: nothing to copy */
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(out >= 0);
    while ((n = read(in, buf, sizeof buf)) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
}

/* opts.log: every line has text (what it says is the writer's own
 * business, tested in test_ledger). */
static void log_line(void *ud, const char *line)
{
    (void)ud;
    assert_non_null(line);
    assert_true(line[0] != '\0');
}

/* A callback's slot: posted once, waited for without polling. */
typedef struct slot {
    sem_t sem;
    int rc;
} slot;

static void slot_done(void *arg, int rc)
{
    slot *s = arg;
    s->rc = rc;
    sem_post(&s->sem);
}

static int wait_slot(slot *s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    while (sem_timedwait(&s->sem, &ts) != 0)
        if (errno != EINTR)
            fail_msg("a ledger callback never came (N=%ld)", fi.fail_at);
    sem_destroy(&s->sem);
    return s->rc;
}

/* Submit r (a row somebody waits for) and wait.  Returns the callback's
 * code, or submit's refusal. */
static int submit_wait(qg_ledger *l, const qg_ledger_row *r)
{
    slot s;
    int rc;
    sem_init(&s.sem, 0, 0);
    if ((rc = qg__ledger_submit(l, r, slot_done, &s)) != QG_OK) {
        sem_destroy(&s.sem);
        return rc;
    }
    return wait_slot(&s);
}

static void assert_row_eq(const qg_ledger_row *a, const qg_ledger_row *b)
{
    if (strcmp(a->request_id, b->request_id) || strcmp(a->subject, b->subject)
        || strcmp(a->plan, b->plan) || strcmp(a->model, b->model) ||
        a->decision != b->decision || a->status != b->status ||
        a->input_tokens != b->input_tokens ||
        a->output_tokens != b->output_tokens ||
        a->reserved_milli != b->reserved_milli ||
        a->weight_milli != b->weight_milli ||
        a->created_ms != b->created_ms || a->settled_ms != b->settled_ms ||
        a->headroom_milli != b->headroom_milli)
        fail_msg("row %s damaged (N=%ld): subject %s/%s status %d/%d "
                 "weight %lld/%lld settled %lld/%lld", b->request_id,
                 fi.fail_at, a->subject, b->subject, a->status, b->status,
                 (long long)a->weight_milli, (long long)b->weight_milli,
                 (long long)a->settled_ms, (long long)b->settled_ms);
}

/* The file as another process sees it, without faults: sound
 * (integrity_check), and the row of rid as "subject|status|weight|
 * reserved|created|settled" ("" when there is none, or no database). */
static void file_check(const char *path, long n)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    if (access(path, F_OK) != 0)
        return;                 /* nothing was created */
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) !=
            SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW ||
        strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0)
        fail_msg("after N=%ld the file is not sound: %s", n,
                 st && sqlite3_column_text(st, 0)
                     ? (const char *)sqlite3_column_text(st, 0)
                     : sqlite3_errmsg(db));
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static const char *raw_row(const char *path, const char *rid)
{
    static char out[512];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    out[0] = '\0';
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    assert_int_equal(sqlite3_prepare_v2(db,
        "SELECT subject || '|' || status || '|' || weight_milli || '|' ||"
        " reserved_milli || '|' || created_ms || '|' || settled_ms"
        " FROM requests WHERE request_id = ?1", -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_text(st, 1, rid, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW)
        snprintf(out, sizeof out, "%s", sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

static const char *row_text(const qg_ledger_row *r)
{
    static char out[512];
    snprintf(out, sizeof out, "%s|%d|%lld|%lld|%lld|%lld", r->subject,
             r->status, (long long)r->weight_milli,
             (long long)r->reserved_milli, (long long)r->created_ms,
             (long long)r->settled_ms);
    return out;
}

/* Request i of run n: its check row, and its settle as the server writes
 * it (the settle's columns plus the reservation's decision, instant and
 * weight, and its subject). */
static void request_rows(long n, int i, qg_ledger_row *check,
                         qg_ledger_row *settle)
{
    memset(check, 0, sizeof *check);
    snprintf(check->request_id, sizeof check->request_id, "w%ld-%d", n, i);
    snprintf(check->subject, sizeof check->subject, "subject-%d", i);
    strcpy(check->plan, "pro");
    strcpy(check->rules_version, "v1");
    strcpy(check->weights_version, "w1");
    if (i % 2)
        strcpy(check->model, "standard");
    check->decision = 1;
    check->status = QG_ROW_RESERVED;
    check->input_tokens = 100 + i;
    check->output_tokens = 1000;
    check->reserved_milli = check->weight_milli = 1000 * (i + 1);
    check->created_ms = BASE_MS + n * 100 + i;
    check->headroom_milli = -1;
    *settle = *check;
    settle->settle_only = 1;
    settle->status = QG_ROW_COMPLETED;
    settle->output_tokens = 10 * i;
    settle->weight_milli = 500 * (i + 1) + 7;
    settle->settled_ms = check->created_ms + 1000;
}

/* How a loop walks N: every point, except allocation failures while the
 * ledger opens (SQLite allocates a few thousand times to open its four
 * connections), where it takes every `open_stride`-th point unless
 * QG_FAULTS_FULL is set.  open_calls: the calls a clean open makes. */
typedef struct walk {
    long open_calls, open_stride;
    long runs, hits, open_failed, failures, acked;
} walk;

static long next_n(const walk *w, long n)
{
    if (n < w->open_calls && w->open_stride > 1 &&
        n + w->open_stride <= w->open_calls)
        return n + w->open_stride;
    return n + 1;
}

/* Calls a clean open (and close) of a fresh ledger makes of `kind`. */
static long count_open_calls(int kind, const char *image_dir)
{
    char dir[200], path[260], from[260], err[512];
    qg_ledger_opts o = { .sync = QG_LEDGER_DURABLE, .id_filter = 1 };
    qg_ledger *l;
    long n;
    snprintf(dir, sizeof dir, "%s/count", root);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/ledger.db", dir);
    if (image_dir) {
        snprintf(from, sizeof from, "%s/keep.db", image_dir);
        copy_file(from, path);
        snprintf(from, sizeof from, "%s/keep.db-wal", image_dir);
        snprintf(path, sizeof path, "%s/ledger.db-wal", dir);
        copy_file(from, path);
        snprintf(path, sizeof path, "%s/ledger.db", dir);
    }
    arm(kind, LONG_MAX, 0);
    assert_non_null(l = qg__ledger_open(path, &o, err, sizeof err));
    n = atomic_load(&fi.calls);
    disarm();
    qg__ledger_close(l);
    rm_db(dir);
    return n;
}

static void walk_init(walk *w, int kind, const char *image_dir)
{
    memset(w, 0, sizeof *w);
    w->open_calls = count_open_calls(kind, image_dir);
    w->open_stride = kind == K_MEM && !getenv("QG_FAULTS_FULL") ? 16 : 1;
}

static void walk_report(const walk *w, const char *path, int kind,
                        int persist, long n, const char *what)
{
    print_message("%s path, %s, %s: %ld injection points hit in %ld runs "
                  "(a clean run at N=%ld; while opening, %ld calls, every "
                  "%ld%s); opens failed %ld, %s %ld; %s\n", path,
                  kind == K_IO ? "I/O errors" : "allocation failures",
                  persist ? "from the Nth call on" : "the Nth call only",
                  w->hits, w->runs, n, w->open_calls, w->open_stride,
                  w->open_stride == 1 ? "" : "th (QG_FAULTS_FULL=1: all)",
                  w->open_failed, what, w->failures,
                  w->acked ? "every acknowledged row intact" :
                  "every row intact");
    if (w->acked)
        print_message("  (%ld acknowledged rows checked)\n", w->acked);
    assert_true(w->hits > 0);
}

/* ------------------------------------------------------- write path */

/* One run with the Nth call failing.  Returns 1 when the Nth call was
 * reached (go on with the next N). */
static int write_run(int kind, long n, int persist, walk *w)
{
    char dir[200], path[260], err[512];
    qg_ledger_opts o = { .sync = QG_LEDGER_DURABLE, .busy_timeout_ms = 20,
                         .log = log_line, .id_filter = 1 };
    qg_ledger_row check[NREQ + 1], settle[NREQ + 1], got, fresh, dummy;
    int acked[NREQ + 1] = { 0 }, hit;
    qg_ledger *l;

    snprintf(dir, sizeof dir, "%s/w%d%d-%ld", root, kind, persist, n);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/ledger.db", dir);
    for (int i = 0; i <= NREQ; i++)
        request_rows(n, i, &check[i], &settle[i]);
    /* request NREQ: a settle recorded whole (its reservation was lost) */
    settle[NREQ].settle_only = 0;

    arm(kind, n, persist);
    err[0] = '\0';
    l = qg__ledger_open(path, &o, err, sizeof err);
    if (!l) {
        hit = disarm();
        if (!err[0])
            fail_msg("open failed without a message (N=%ld)", n);
        w->open_failed++;
        file_check(path, n);
        goto done;
    }
    /* two rounds: check rows queued, then their settles, waited for; in
     * the transient mode a failed settle is retried as a client would */
    for (int round = 0; round < 2; round++) {
        int lo = round ? NREQ / 2 : 0, hi = round ? NREQ + 1 : NREQ / 2;
        slot s[NREQ + 1];
        for (int i = lo; i < hi && i < NREQ; i++)
            if (qg__ledger_submit(l, &check[i], NULL, NULL) != QG_OK)
                fail_msg("submit refused a check row (N=%ld)", n);
        for (int i = lo; i < hi; i++) {
            sem_init(&s[i].sem, 0, 0);
            if (qg__ledger_submit(l, &settle[i], slot_done, &s[i]) != QG_OK)
                fail_msg("submit refused a settle (N=%ld)", n);
        }
        for (int i = lo; i < hi; i++) {
            int rc = wait_slot(&s[i]);
            for (int k = 0; rc != QG_OK && rc != QG_ESTATE && !persist &&
                            k < 2; k++) {
                w->failures++;
                rc = submit_wait(l, &settle[i]);
            }
            if (rc == QG_ESTATE)
                fail_msg("settle %d taken for another request's (N=%ld)", i,
                         n);
            acked[i] = rc == QG_OK;
            w->failures += rc != QG_OK;
        }
    }
    /* a lookup under faults: the row, or an error; never "none" */
    for (int i = 0; i <= NREQ; i++) {
        int rc;
        if (!acked[i])
            continue;
        rc = qg__ledger_get(l, settle[i].request_id, &got);
        if (rc == QG_ENOTFOUND)
            fail_msg("lookup of acknowledged %s said not found (N=%ld)",
                     settle[i].request_id, n);
        if (rc == QG_OK) {
            qg_ledger_row want = settle[i];
            want.settle_only = 0;
            assert_row_eq(&got, &want);
        }
    }
    hit = disarm();
    /* the fault is gone: the same ledger writes again, at once */
    request_rows(n + MAX_N, 0, &fresh, &dummy);
    fresh.status = QG_ROW_COMPLETED;
    {
        int frc = submit_wait(l, &fresh);
        if (frc != QG_OK) {
            qg_ledger_stats st;
            qg__ledger_stats_get(l, &st);
            fail_msg("no write succeeds once the faults stop (N=%ld): %s: %s",
                     n, qg_strerror(frc), st.last_error);
        }
    }
    qg__ledger_close(l);
    /* reopened by another process, without faults: every acknowledged
     * row is there and intact, and the file is sound */
    file_check(path, n);
    for (int i = 0; i <= NREQ; i++) {
        qg_ledger_row want = settle[i];
        const char *have;
        if (!acked[i])
            continue;
        w->acked++;
        want.settle_only = 0;
        if (strcmp(have = raw_row(path, want.request_id), row_text(&want)))
            fail_msg("acknowledged settle %s is \"%s\" after N=%ld, "
                     "expected \"%s\"", want.request_id, have, n,
                     row_text(&want));
    }
    if (!raw_row(path, fresh.request_id)[0])
        fail_msg("the write after the faults is lost (N=%ld)", n);
done:
    rm_db(dir);
    w->runs++;
    w->hits += hit;
    return hit;
}

static void write_loop(int kind, int persist)
{
    walk w;
    long n;
    walk_init(&w, kind, NULL);
    for (n = 1; n < MAX_N; n = next_n(&w, n))
        if (!write_run(kind, n, persist, &w))
            break;
    if (n >= MAX_N)
        fail_msg("the write loop did not end by N=%d", MAX_N);
    walk_report(&w, "write", kind, persist, n, "settles answered with an "
                "error");
}

static void test_write_io(void **state)
{
    (void)state;
    write_loop(K_IO, 0);
}

static void test_write_io_persistent(void **state)
{
    (void)state;
    write_loop(K_IO, 1);
}

static void test_write_nomem(void **state)
{
    (void)state;
    write_loop(K_MEM, 0);
}

static void test_write_nomem_persistent(void **state)
{
    (void)state;
    write_loop(K_MEM, 1);
}

/* ----------------------------------------------------- rebuild path */

static char image[160];         /* ledger.db and -wal of a killed ledger */
static int64_t image_weight;

typedef struct scan_acc {
    long n;
    int64_t weight;
    int64_t last_ms;
} scan_acc;

static int scan_fn(const qg_ledger_row *r, void *ud)
{
    scan_acc *a = ud;
    if (r->created_ms < a->last_ms)
        fail_msg("scan out of order (N=%ld)", fi.fail_at);
    a->last_ms = r->created_ms;
    a->n++;
    a->weight += r->weight_milli;
    return 0;
}

static qg_ledger_row scan_row(int i)
{
    qg_ledger_row r;
    memset(&r, 0, sizeof r);
    snprintf(r.request_id, sizeof r.request_id, "scan-%04d", i);
    snprintf(r.subject, sizeof r.subject, "subject-%d-%0120d", i % 17, i);
    strcpy(r.plan, "pro");
    r.decision = 1;
    r.status = QG_ROW_COMPLETED;
    r.reserved_milli = 1000;
    r.weight_milli = 1000 + i;
    r.created_ms = BASE_MS + i;
    r.settled_ms = r.created_ms + 5;
    r.headroom_milli = -1;
    return r;
}

/* The image: NSCAN rows, the first half checkpointed into ledger.db, the
 * rest only in the WAL, copied while the ledger is open (as after a
 * kill -9: the next open recovers the WAL). */
static void make_image(void)
{
    char path[260], err[512], to[260];
    qg_ledger_opts o = { .sync = QG_LEDGER_DURABLE };
    qg_ledger *l;
    snprintf(image, sizeof image, "%s/image", root);
    assert_int_equal(mkdir(image, 0700), 0);
    snprintf(path, sizeof path, "%s/ledger.db", image);
    for (int half = 0; half < 2; half++) {
        assert_non_null(l = qg__ledger_open(path, &o, err, sizeof err));
        /* queued together: a few transactions, a short WAL */
        for (int i = half * NSCAN / 2; i < (half + 1) * NSCAN / 2; i++) {
            qg_ledger_row r = scan_row(i);
            if (i + 1 < (half + 1) * NSCAN / 2)
                assert_int_equal(qg__ledger_submit(l, &r, NULL, NULL), QG_OK);
            else
                assert_int_equal(submit_wait(l, &r), QG_OK);
            image_weight += r.weight_milli;
        }
        if (half) {
            snprintf(to, sizeof to, "%s/keep.db", image);
            copy_file(path, to);
            snprintf(path, sizeof path, "%s/ledger.db-wal", image);
            snprintf(to, sizeof to, "%s/keep.db-wal", image);
            copy_file(path, to);
            snprintf(path, sizeof path, "%s/ledger.db", image);
        }
        qg__ledger_close(l);     /* the first close checkpoints */
    }
}

static void scan_all(qg_ledger *l, long n, int must, walk *w)
{
    qg_ledger_stats st;
    scan_acc a;
    int rc;
    memset(&a, 0, sizeof a);
    rc = qg__ledger_scan(l, 0, scan_fn, &a);
    if (rc == QG_OK) {
        if (a.n != NSCAN || a.weight != image_weight)
            fail_msg("a scan returned %ld of %d rows as a success (N=%ld)",
                     a.n, NSCAN, n);
        return;
    }
    if (must)
        fail_msg("a scan without faults failed (N=%ld): %s", n,
                 qg_strerror(rc));
    qg__ledger_stats_get(l, &st);
    if (!st.last_read_error[0])
        fail_msg("a failed scan without SQLite's reason (N=%ld)", n);
    w->failures++;
}

/* One rebuild with the Nth call failing.  Returns 1 when it was reached. */
static int rebuild_run(int kind, long n, int persist, walk *w)
{
    char dir[200], path[260], from[260], err[512];
    qg_ledger_opts o = { .sync = QG_LEDGER_DURABLE, .busy_timeout_ms = 20,
                         .log = log_line, .id_filter = 1 };
    qg_ledger_row got;
    qg_ledger *l;
    int hit, rc;
    sqlite3 *db;
    sqlite3_stmt *st;

    snprintf(dir, sizeof dir, "%s/r%d%d-%ld", root, kind, persist, n);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/ledger.db", dir);
    snprintf(from, sizeof from, "%s/keep.db", image);
    copy_file(from, path);
    snprintf(from, sizeof from, "%s/keep.db-wal", image);
    snprintf(path, sizeof path, "%s/ledger.db-wal", dir);
    copy_file(from, path);
    snprintf(path, sizeof path, "%s/ledger.db", dir);

    arm(kind, n, persist);
    err[0] = '\0';
    l = qg__ledger_open(path, &o, err, sizeof err);
    if (!l) {
        hit = disarm();
        if (!err[0])
            fail_msg("open failed without a message (N=%ld)", n);
        w->open_failed++;
    } else {
        scan_all(l, n, 0, w);
        for (int i = 0; i < NSCAN; i += NSCAN / 4 - 1) {
            qg_ledger_row want = scan_row(i);
            rc = qg__ledger_get(l, want.request_id, &got);
            if (rc == QG_ENOTFOUND)
                fail_msg("lookup of %s said not found (N=%ld)",
                         want.request_id, n);
            if (rc == QG_OK)
                assert_row_eq(&got, &want);
        }
        hit = disarm();
        scan_all(l, n, 1, w);   /* the fault is gone: a full scan again */
        qg__ledger_close(l);
    }
    /* another process, without faults: every row is there */
    file_check(path, n);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*),"
                                        " sum(weight_milli) FROM requests",
                                        -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    if (sqlite3_column_int64(st, 0) != NSCAN ||
        sqlite3_column_int64(st, 1) != image_weight)
        fail_msg("after N=%ld the ledger holds %lld of %d rows", n,
                 (long long)sqlite3_column_int64(st, 0), NSCAN);
    sqlite3_finalize(st);
    sqlite3_close(db);
    rm_db(dir);
    w->runs++;
    w->hits += hit;
    return hit;
}

static void rebuild_loop(int kind, int persist)
{
    walk w;
    long n;
    if (!image[0])
        make_image();
    walk_init(&w, kind, image);
    for (n = 1; n < MAX_N; n = next_n(&w, n))
        if (!rebuild_run(kind, n, persist, &w))
            break;
    if (n >= MAX_N)
        fail_msg("the rebuild loop did not end by N=%d", MAX_N);
    walk_report(&w, "rebuild", kind, persist, n, "scans failed with "
                "SQLite's reason");
}

static void test_rebuild_io(void **state)
{
    (void)state;
    rebuild_loop(K_IO, 0);
}

static void test_rebuild_io_persistent(void **state)
{
    (void)state;
    rebuild_loop(K_IO, 1);
}

static void test_rebuild_nomem(void **state)
{
    (void)state;
    rebuild_loop(K_MEM, 0);
}

static void test_rebuild_nomem_persistent(void **state)
{
    (void)state;
    rebuild_loop(K_MEM, 1);
}

/* -------------------------------------------------------------- main */

static int rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[400];
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL) {
        struct stat sb;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    return rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_io),
        cmocka_unit_test(test_write_io_persistent),
        cmocka_unit_test(test_write_nomem),
        cmocka_unit_test(test_write_nomem_persistent),
        cmocka_unit_test(test_rebuild_io),
        cmocka_unit_test(test_rebuild_io_persistent),
        cmocka_unit_test(test_rebuild_nomem),
        cmocka_unit_test(test_rebuild_nomem_persistent),
    };
    struct stat sb;
    int rc;
    if (install_hooks() != 0) {
        fprintf(stderr, "cannot install the SQLite fault hooks\n");
        return 1;
    }
    snprintf(root, sizeof root, "%s/qgfaults.XXXXXX",
             stat("/dev/shm", &sb) == 0 && access("/dev/shm", W_OK) == 0
                 ? "/dev/shm"
                 : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    if (getenv("QG_TEST_FILTER"))           /* e.g. "*nomem*" */
        cmocka_set_test_filter(getenv("QG_TEST_FILTER"));
    rc = cmocka_run_group_tests_name("ledger_faults", tests, NULL, NULL);
    rm_tree(root);
    return rc;
}
