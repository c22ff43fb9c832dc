/* ledgerdb.c - fresh ledgers for the tests that run on both backends
 * (ledgerdb.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ledgerdb.h"

void ledgerdb_make(ledgerdb *t, pgproc *pg, const char *tag)
{
    if (pg) {
        char db[64];
        if (pgproc_createdb(pg, db, sizeof db) < 0)
            fail_msg("createdb: %s", pg->why);
        t->dir[0] = '\0';
        pgproc_url(pg, db, t->path, sizeof t->path);
        return;
    }
    snprintf(t->dir, sizeof t->dir, "/tmp/%.40s.XXXXXX", tag);
    assert_non_null(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/ledger.db", t->dir);
}

void ledgerdb_remove(ledgerdb *t)
{
    static const char *const sfx[] = {"", "-wal", "-shm"};
    char p[160];
    if (!t->dir[0])
        return;
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s%s", t->path, sfx[i]);
        unlink(p);
    }
    rmdir(t->dir);
}
