/* ledgerdb.h - a fresh ledger for a test that runs on SQLite and on a real
 * PostgreSQL (pgproc.h): on PostgreSQL a new database whose URL is path,
 * on SQLite a new folder under /tmp whose ledger.db is path. */
#ifndef QG_TEST_LEDGERDB_H
#define QG_TEST_LEDGERDB_H

#include "pgproc.h"

typedef struct ledgerdb {
    char dir[64];                /* SQLite: the folder; "" on PostgreSQL */
    char path[128];              /* the ledger's path or URL */
} ledgerdb;

/* pg NULL: SQLite, in a folder named /tmp/TAG.XXXXXX.  Fails the running
 * cmocka test when it cannot. */
void ledgerdb_make(ledgerdb *t, pgproc *pg, const char *tag);

/* SQLite: the file, its -wal and -shm, and the folder.  PostgreSQL:
 * nothing (the server's folder goes with it at the end). */
void ledgerdb_remove(ledgerdb *t);

#endif
