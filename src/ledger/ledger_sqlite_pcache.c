/* ledger_sqlite_pcache.c - the ledger writer's page cache: how large it
 * grows, and a layer over SQLite's own cache that lets it be large
 * (ledger_sqlite.h).
 *
 * How large.  The writer's connection starts at 2 MiB (about SQLite's
 * default) and doubles its cache, up to the options' bound (64 MiB by
 * default), while more than a quarter of its rows read a page from the
 * file: rows that land at random places of an index larger than the
 * cache (request ids such as UUIDv4s; many subjects; an aged ledger)
 * read a page each, and a page read costs a system call and a 4 KB
 * copy.  Rows whose ids grow read almost nothing and keep the small
 * cache, which costs them less (measured: docs/benchmarks.md, "A larger
 * writer cache"; the cause inferred: a large one recycles pages long
 * gone from the processor's caches).  So it also shrinks, though a
 * large cache misses little because it is large: after QUIET looks in
 * a row in which almost no row read a page it tries half its size, and
 * keeps it unless the next look finds it missing as it grew for, in
 * which case it doubles back and waits twice as many quiet looks before
 * the next try (at most QUIET_MAX), so that a load whose pages fit the
 * large size but not half pays for one look at half in QUIET_MAX + 1.
 *
 * The layer.  When SQLite splits a B-tree page it puts the new pages in
 * page-number order by swapping two of them through a temporary number,
 * the page of the file's lock byte (262,145 with 4 KB pages, never a
 * real page).  The default cache (pcache1) remembers the largest number
 * it has held since its last truncation, and every commit truncates the
 * cache to the file's size: when that largest number lies a hash table's
 * length or more beyond the size, as 262,145 does, the truncation walks
 * every hash bucket and every page of the cache.  With 2 MiB that walk
 * is short; with 32 MiB it took a tenth of the writer's CPU under inserts of
 * growing ids, whose splits swap pages in nearly every commit (perf and
 * gdb on the writer).  Here the swap's temporary number is replaced by
 * one just above the largest number this cache holds, which no page has,
 * so the truncation after it has a few buckets to look at.  Everything
 * else is passed to the default cache unchanged. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <sqlite3.h>

#include "ledger_sqlite.h"

#define LOCK_BYTE 0x40000000u   /* SQLite's PENDING_BYTE */

typedef struct cache {
    sqlite3_pcache *in;         /* the default cache's */
    unsigned lock_page;         /* the swap's temporary number */
    unsigned top;               /* >= every page number held */
    unsigned stand_in;          /* lock_page's number while swapping */
    int swapping;
} cache;

static sqlite3_pcache_methods2 base;    /* the default cache's methods */
static atomic_ulong swaps;              /* swaps given a stand-in */
static int installed;

static cache *of(sqlite3_pcache *p)
{
    return (cache *)p;
}

static int c_init(void *arg)
{
    (void)arg;
    return base.xInit(base.pArg);
}

static void c_shutdown(void *arg)
{
    (void)arg;
    if (base.xShutdown)
        base.xShutdown(base.pArg);
}

static sqlite3_pcache *c_create(int page_size, int extra, int purgeable)
{
    cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (!(c->in = base.xCreate(page_size, extra, purgeable))) {
        free(c);
        return NULL;
    }
    c->lock_page = LOCK_BYTE / (unsigned)page_size + 1;
    return (sqlite3_pcache *)c;
}

static void c_cachesize(sqlite3_pcache *p, int n)
{
    base.xCachesize(of(p)->in, n);
}

static int c_pagecount(sqlite3_pcache *p)
{
    return base.xPagecount(of(p)->in);
}

/* The number the default cache knows page `key` by. */
static unsigned key_in(const cache *c, unsigned key)
{
    return c->swapping && key == c->lock_page ? c->stand_in : key;
}

static sqlite3_pcache_page *c_fetch(sqlite3_pcache *p, unsigned key,
                                    int create)
{
    cache *c = of(p);
    unsigned k = key_in(c, key);
    sqlite3_pcache_page *pg = base.xFetch(c->in, k, create);
    if (pg && create && k > c->top)
        c->top = k;
    return pg;
}

static void c_unpin(sqlite3_pcache *p, sqlite3_pcache_page *pg, int discard)
{
    base.xUnpin(of(p)->in, pg, discard);
}

/* The swap (btree.c, balance_nonroot): A -> lock page, B -> A's number,
 * lock page -> B's number.  The first step takes a stand-in above every
 * page held; the last gives it up, and the top falls back, so that the
 * stand-in of every swap in a transaction is the same number. */
static void c_rekey(sqlite3_pcache *p, sqlite3_pcache_page *pg,
                    unsigned old_key, unsigned new_key)
{
    cache *c = of(p);
    unsigned o = key_in(c, old_key), n = new_key;
    int done = 0;
    if (new_key == c->lock_page && !c->swapping) {
        c->stand_in = n = c->top + 1;
        c->swapping = 1;
        atomic_fetch_add_explicit(&swaps, 1, memory_order_relaxed);
    } else if (old_key == c->lock_page && c->swapping) {
        c->swapping = 0;
        done = 1;
    }
    base.xRekey(c->in, pg, o, n);
    if (n > c->top)
        c->top = n;
    else if (done && c->top == c->stand_in)
        c->top = c->stand_in - 1;   /* the stand-in is free again */
}

static void c_truncate(sqlite3_pcache *p, unsigned limit)
{
    cache *c = of(p);
    base.xTruncate(c->in, limit);
    if (limit == 0)
        c->top = 0;
    else if (c->top >= limit)
        c->top = limit - 1;
}

static void c_destroy(sqlite3_pcache *p)
{
    base.xDestroy(of(p)->in);
    free(p);
}

static void c_shrink(sqlite3_pcache *p)
{
    base.xShrink(of(p)->in);
}

int qg__sq_pcache_install(void)
{
    static sqlite3_pcache_methods2 m = {
        1, NULL, c_init, c_shutdown, c_create, c_cachesize, c_pagecount,
        c_fetch, c_unpin, c_rekey, c_truncate, c_destroy, c_shrink,
    };
    int rc;
    if (installed)
        return SQLITE_OK;
    rc = sqlite3_config(SQLITE_CONFIG_GETPCACHE2, &base);
    if (rc == SQLITE_OK)
        rc = sqlite3_config(SQLITE_CONFIG_PCACHE2, &m);
    installed = rc == SQLITE_OK;
    return rc;
}

int qg__sq_pcache_installed(void)
{
    return installed;
}

unsigned long qg__sq_pcache_swaps(void)
{
    return atomic_load_explicit(&swaps, memory_order_relaxed);
}

/* ------------------------------------------------ the writer's size */

#define START_KB 2048
#define WINDOW_ROWS 16384       /* rows between two looks at the misses */
#define QUIET 4                 /* quiet looks before half is tried */
#define QUIET_MAX 64            /* ... after tries that failed, at most */

static int cache_set(sqlite3 *db, int kb)
{
    char sql[48];
    snprintf(sql, sizeof sql, "PRAGMA cache_size=-%d", kb);
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

int qg__sq_cache_open(qg__sq_cache *c, sqlite3 *db, int max_kb)
{
    int cur = 0, hi = 0;
    int kb;
    c->max_kb = max_kb > 0 ? max_kb : QG_SQ_CACHE_MAX_KB;
    kb = c->max_kb < START_KB ? c->max_kb : START_KB;
    atomic_store_explicit(&c->kb, kb, memory_order_relaxed);
    c->min_kb = kb;
    c->rows = 0;
    c->quiet = 0;
    c->quiet_need = QUIET;
    c->trying = 0;
    /* from here on: the misses of the rows written */
    (void)sqlite3_db_status(db, SQLITE_DBSTATUS_CACHE_MISS, &cur, &hi, 1);
    return cache_set(db, kb);
}

/* Grow when more than a quarter of the rows read a page; a look in which
 * at most one row in 64 did is quiet. */
int qg__sq_cache_next(qg__sq_cache *c, uint64_t rows, uint64_t misses)
{
    int kb = atomic_load_explicit(&c->kb, memory_order_relaxed);
    if (misses * 4 > rows) {
        if (c->trying)           /* half was too small: wait longer */
            c->quiet_need = c->quiet_need * 2 > QUIET_MAX
                                ? QUIET_MAX : c->quiet_need * 2;
        c->trying = 0;
        c->quiet = 0;
        return kb > c->max_kb / 2 ? c->max_kb : kb * 2;
    }
    if (c->trying) {             /* half held */
        c->trying = 0;
        c->quiet_need = QUIET;
    }
    if (misses * 64 > rows) {
        c->quiet = 0;
        return kb;
    }
    if (++c->quiet < c->quiet_need || kb <= c->min_kb)
        return kb;
    c->quiet = 0;
    c->trying = 1;
    return kb / 2 < c->min_kb ? c->min_kb : kb / 2;
}

int qg__sq_cache_count(qg__sq_cache *c, sqlite3 *db, size_t n,
                       uint64_t *rows, uint64_t *misses)
{
    int cur = 0, hi = 0, kb = atomic_load_explicit(&c->kb,
                                                   memory_order_relaxed);
    int next;
    c->rows += n;
    if (c->rows < WINDOW_ROWS)
        return 0;
    if (sqlite3_db_status(db, SQLITE_DBSTATUS_CACHE_MISS, &cur, &hi, 1) !=
        SQLITE_OK)
        return 0;
    *rows = c->rows;
    *misses = (uint64_t)cur;
    c->rows = 0;
    if ((next = qg__sq_cache_next(c, *rows, *misses)) == kb)
        return 0;
    if (cache_set(db, next) != SQLITE_OK) {
        c->trying = 0;
        return 0;
    }
    atomic_store_explicit(&c->kb, next, memory_order_relaxed);
    return next;
}
