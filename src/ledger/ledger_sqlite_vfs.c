/* ledger_sqlite_vfs.c - a VFS over SQLite's default one that gathers a
 * transaction's WAL writes into one write (ledger_sqlite.h).
 *
 * SQLite appends each frame of a commit to the WAL with two writes, its
 * 24-byte header and its page, so a batch that dirties 17 pages costs 34
 * pwrite calls.  On this project's machines a system call costs ~1.9 us
 * of CPU whatever it carries (measured by a C loop on the same disk: 17
 * frames as 34 writes 64.6 us, the same 70 KB as one write 7.3 us), and
 * the ledger writer shares the cores with the HTTP workers.  Here the
 * WAL file's writes that continue one another wait in memory, and go out
 * as one write before anything that can observe the file: its sync, a
 * read, its size, a truncate, a lock, a file control, its close, and the
 * main file's shared-memory barrier and locks (through which a commit becomes visible to other
 * connections).  A commit with synchronous=FULL syncs the WAL before it
 * publishes its frames, so the gathered write, its errors included,
 * happens inside the sync that the COMMIT waits for: durability and
 * error reporting are those of the default VFS.  The ledger opens only
 * its writer's connection through this VFS, and only in durable mode
 * (synchronous=FULL); with synchronous=NORMAL nothing would flush before
 * the barrier, whose failure SQLite cannot be told about.
 *
 * Everything but the WAL's writes goes straight to the default VFS. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "ledger_sqlite.h"

/* Flush before the buffer passes this.  The buffer keeps its largest size
 * (a commit of ~540 rows under /v1/check load: 44 frames, ~181 KB) for the
 * connection's life. */
#define GATHER_MAX (8u << 20)
/* The default VFS writes at most 128 KB - 1 in one call (its
 * seekAndWriteFd masks the length with 0x1ffff), so a flush goes out in
 * pieces of 31 pages. */
#define WRITE_MAX 0x1f000

typedef struct vfile vfile;
struct vfile {
    sqlite3_file pub;             /* first: SQLite sees this */
    sqlite3_file *real;           /* the default VFS's file, after us */
    vfile *wal;                   /* main file: its WAL, while open */
    vfile *main;                  /* WAL file: its main file */
    char *buf;                    /* WAL file: the gathered bytes */
    size_t len, cap;
    sqlite3_int64 off;            /* file offset of buf[0] */
    int err;                      /* a flush failed where SQLite could not
                                   * be told (the barrier): the WAL's next
                                   * operation reports it */
};

static sqlite3_vfs vfs;
static sqlite3_vfs *base;
static sqlite3_io_methods methods;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int registered_rc = SQLITE_ERROR;

/* Write what is gathered.  A failure is returned once, as the default
 * VFS returns a failed write: SQLite rolls the transaction back, and its
 * frames are written again by a later one. */
static int flush(vfile *f)
{
    int rc = SQLITE_OK;
    size_t done = 0;
    if (f->err) {
        rc = f->err;
        f->err = SQLITE_OK;
        return rc;
    }
    while (done < f->len && rc == SQLITE_OK) {
        size_t n = f->len - done < WRITE_MAX ? f->len - done : WRITE_MAX;
        rc = f->real->pMethods->xWrite(f->real, f->buf + done, (int)n,
                                       f->off + (sqlite3_int64)done);
        done += n;
    }
    f->len = 0;
    return rc;
}

/* The main file's WAL, flushed (for the main file's barrier and locks). */
static int flush_wal_of(vfile *m)
{
    return m->wal ? flush(m->wal) : SQLITE_OK;
}

/* ------------------------------------------------------------- methods */

static int v_close(sqlite3_file *pf)
{
    vfile *f = (vfile *)pf;
    int frc = flush(f), rc;
    if (f->main && f->main->wal == f)
        f->main->wal = NULL;
    if (f->wal)
        f->wal->main = NULL;
    rc = f->real->pMethods->xClose(f->real);
    free(f->buf);
    f->buf = NULL;
    return frc != SQLITE_OK ? frc : rc;
}

static int v_read(sqlite3_file *pf, void *p, int n, sqlite3_int64 off)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xRead(f->real, p, n, off);
}

static int v_write(sqlite3_file *pf, const void *p, int n,
                   sqlite3_int64 off)
{
    vfile *f = (vfile *)pf;
    size_t need;
    int rc;
    if (!f->main || n >= WRITE_MAX)   /* not a WAL file, or big enough */
        goto direct;
    if (f->err)
        return flush(f);
    /* anything but the next bytes (a new WAL's header, a frame of this
     * transaction written again) first sends what is gathered */
    if (f->len > 0 && off != f->off + (sqlite3_int64)f->len &&
        (rc = flush(f)) != SQLITE_OK)
        return rc;
    if (f->len + (size_t)n > GATHER_MAX && (rc = flush(f)) != SQLITE_OK)
        return rc;
    need = f->len + (size_t)n;
    if (need > f->cap) {
        size_t cap = f->cap ? f->cap : 64u << 10;
        char *nb;
        while (cap < need)
            cap *= 2;
        if (!(nb = realloc(f->buf, cap)))
            goto direct;         /* no room to gather: as the default VFS */
        f->buf = nb;
        f->cap = cap;
    }
    if (f->len == 0)
        f->off = off;
    memcpy(f->buf + f->len, p, (size_t)n);
    f->len += (size_t)n;
    return SQLITE_OK;
direct:
    if ((rc = flush(f)) != SQLITE_OK)
        return rc;
    return f->real->pMethods->xWrite(f->real, p, n, off);
}

static int v_truncate(sqlite3_file *pf, sqlite3_int64 size)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xTruncate(f->real, size);
}

static int v_sync(sqlite3_file *pf, int flags)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    if (rc == SQLITE_OK)
        rc = flush_wal_of(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xSync(f->real, flags);
}

static int v_size(sqlite3_file *pf, sqlite3_int64 *size)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xFileSize(f->real, size);
}

static int v_lock(sqlite3_file *pf, int lock)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xLock(f->real, lock);
}

static int v_unlock(sqlite3_file *pf, int lock)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xUnlock(f->real, lock);
}

static int v_reserved(sqlite3_file *pf, int *out)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc
                           : f->real->pMethods->xCheckReservedLock(f->real,
                                                                   out);
}

static int v_fcntl(sqlite3_file *pf, int op, void *arg)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    if (rc == SQLITE_OK)
        rc = flush_wal_of(f);
    return rc != SQLITE_OK ? rc
                           : f->real->pMethods->xFileControl(f->real, op,
                                                             arg);
}

static int v_sector(sqlite3_file *pf)
{
    vfile *f = (vfile *)pf;
    return f->real->pMethods->xSectorSize(f->real);
}

static int v_devchar(sqlite3_file *pf)
{
    vfile *f = (vfile *)pf;
    return f->real->pMethods->xDeviceCharacteristics(f->real);
}

static int v_shm_map(sqlite3_file *pf, int pg, int pgsz, int extend,
                     void volatile **pp)
{
    vfile *f = (vfile *)pf;
    return f->real->pMethods->xShmMap(f->real, pg, pgsz, extend, pp);
}

static int v_shm_lock(sqlite3_file *pf, int offset, int n, int flags)
{
    vfile *f = (vfile *)pf;
    int rc = flush_wal_of(f);
    return rc != SQLITE_OK ? rc
                           : f->real->pMethods->xShmLock(f->real, offset, n,
                                                         flags);
}

/* A commit publishes its frames in shared memory between two barriers:
 * the frames must be in the file by then.  With synchronous=FULL the
 * WAL's sync has already flushed them; a failure here (nothing to tell
 * SQLite through a void call) stays sticky and fails the WAL's next
 * operation. */
static void barrier_flush(vfile *m)
{
    int rc;
    if (m->wal && m->wal->len > 0 && (rc = flush(m->wal)) != SQLITE_OK)
        m->wal->err = rc;
}

static void v_shm_barrier(sqlite3_file *pf)
{
    vfile *f = (vfile *)pf;
    barrier_flush(f);
    f->real->pMethods->xShmBarrier(f->real);
}

static int v_shm_unmap(sqlite3_file *pf, int del)
{
    vfile *f = (vfile *)pf;
    barrier_flush(f);
    return f->real->pMethods->xShmUnmap(f->real, del);
}

static int v_fetch(sqlite3_file *pf, sqlite3_int64 off, int n, void **pp)
{
    vfile *f = (vfile *)pf;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc
                           : f->real->pMethods->xFetch(f->real, off, n, pp);
}

static int v_unfetch(sqlite3_file *pf, sqlite3_int64 off, void *p)
{
    vfile *f = (vfile *)pf;
    return f->real->pMethods->xUnfetch(f->real, off, p);
}

/* ---------------------------------------------------------------- VFS */

static int v_open(sqlite3_vfs *v, const char *name, sqlite3_file *pf,
                  int flags, int *out_flags)
{
    vfile *f = (vfile *)pf;
    int rc;
    (void)v;
    memset(f, 0, sizeof *f);
    f->real = (sqlite3_file *)(f + 1);
    rc = base->xOpen(base, name, f->real, flags, out_flags);
    if (rc != SQLITE_OK || !f->real->pMethods) {
        if (f->real->pMethods)
            f->real->pMethods->xClose(f->real);
        f->pub.pMethods = NULL;  /* SQLite calls no xClose then */
        return rc != SQLITE_OK ? rc : SQLITE_CANTOPEN;
    }
    if (f->real->pMethods->iVersion < 3) {
        f->real->pMethods->xClose(f->real);
        f->pub.pMethods = NULL;
        return SQLITE_CANTOPEN;
    }
    f->pub.pMethods = &methods;
    if ((flags & SQLITE_OPEN_WAL) && name) {
        vfile *m = (vfile *)sqlite3_database_file_object(name);
        if (m && m->pub.pMethods == &methods) {
            f->main = m;
            m->wal = f;
        }
    }
    return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *v, const char *name, int sync)
{
    (void)v;
    return base->xDelete(base, name, sync);
}

static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
    (void)v;
    return base->xAccess(base, name, flags, out);
}

static int v_fullpath(sqlite3_vfs *v, const char *name, int n, char *out)
{
    (void)v;
    return base->xFullPathname(base, name, n, out);
}

static void *v_dlopen(sqlite3_vfs *v, const char *p)
{
    (void)v;
    return base->xDlOpen(base, p);
}

static void v_dlerror(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    base->xDlError(base, n, out);
}

static void (*v_dlsym(sqlite3_vfs *v, void *h, const char *s))(void)
{
    (void)v;
    return base->xDlSym(base, h, s);
}

static void v_dlclose(sqlite3_vfs *v, void *h)
{
    (void)v;
    base->xDlClose(base, h);
}

static int v_random(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return base->xRandomness(base, n, out);
}

static int v_sleep(sqlite3_vfs *v, int us)
{
    (void)v;
    return base->xSleep(base, us);
}

static int v_time(sqlite3_vfs *v, double *out)
{
    (void)v;
    return base->xCurrentTime(base, out);
}

static int v_lasterr(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return base->xGetLastError ? base->xGetLastError(base, n, out) : 0;
}

static int v_time64(sqlite3_vfs *v, sqlite3_int64 *out)
{
    (void)v;
    return base->xCurrentTimeInt64(base, out);
}

static void do_register(void)
{
    base = sqlite3_vfs_find(NULL);
    if (!base || base->iVersion < 2 || !base->xCurrentTimeInt64)
        return;
    methods = (sqlite3_io_methods){
        .iVersion = 3,
        .xClose = v_close,
        .xRead = v_read,
        .xWrite = v_write,
        .xTruncate = v_truncate,
        .xSync = v_sync,
        .xFileSize = v_size,
        .xLock = v_lock,
        .xUnlock = v_unlock,
        .xCheckReservedLock = v_reserved,
        .xFileControl = v_fcntl,
        .xSectorSize = v_sector,
        .xDeviceCharacteristics = v_devchar,
        .xShmMap = v_shm_map,
        .xShmLock = v_shm_lock,
        .xShmBarrier = v_shm_barrier,
        .xShmUnmap = v_shm_unmap,
        .xFetch = v_fetch,
        .xUnfetch = v_unfetch,
    };
    vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)sizeof(vfile) + base->szOsFile,
        .mxPathname = base->mxPathname,
        .zName = QG_SQ_VFS,
        .xOpen = v_open,
        .xDelete = v_delete,
        .xAccess = v_access,
        .xFullPathname = v_fullpath,
        .xDlOpen = v_dlopen,
        .xDlError = v_dlerror,
        .xDlSym = v_dlsym,
        .xDlClose = v_dlclose,
        .xRandomness = v_random,
        .xSleep = v_sleep,
        .xCurrentTime = v_time,
        .xGetLastError = v_lasterr,
        .xCurrentTimeInt64 = v_time64,
    };
    registered_rc = sqlite3_vfs_register(&vfs, 0);
}

int qg__sq_vfs_register(void)
{
    pthread_once(&once, do_register);
    return registered_rc;
}
