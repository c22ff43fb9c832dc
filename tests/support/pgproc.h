/* pgproc.h - a real PostgreSQL 15 server for tests, started and stopped
 * by the test itself: `initdb` into a temporary folder, the postmaster on
 * a free port of 127.0.0.1 with its unix socket inside that folder, trust
 * authentication for the test user PGPROC_USER, fsync and
 * synchronous_commit left at their defaults (on).  Each test makes its
 * own database (pgproc_createdb) on the one server of its group.
 *
 * Tests run as root and PostgreSQL refuses to run as root: initdb and the
 * postmaster then run as the `postgres` user Debian's package creates
 * (fork, setgid, setuid, exec), and the folder belongs to it.  A test run
 * by another user runs them as itself.  The binaries are found in
 * $QG_PG_BIN, else /usr/lib/postgresql/15/bin.  The postmaster dies with
 * the test (PR_SET_PDEATHSIG), and every wait is bounded. */
#ifndef QG_TEST_PGPROC_H
#define QG_TEST_PGPROC_H

#include <stddef.h>
#include <sys/types.h>

#define PGPROC_USER "qg"           /* the superuser initdb makes */

typedef struct pgproc {
    pid_t pid;                 /* the postmaster, 0 when not running */
    int port;                  /* its port (kept across stop and kill) */
    char dir[256];             /* its folder: data/, the socket, logs */
    char why[512];             /* what failed */
    uid_t uid;                 /* whom the server runs as */
    gid_t gid;
    unsigned ndb;              /* databases made, for their names */
} pgproc;

/* The folder of initdb and postgres, or NULL when they are absent. */
const char *pgproc_bindir(void);

/* initdb, start, and wait until the server accepts connections (bounded).
 * Returns 0, or -1 with the reason in p->why (nothing left running, the
 * folder removed). */
int pgproc_start(pgproc *p);
/* Fast shutdown (SIGINT), reaped; port and folder kept for
 * pgproc_restart.  No-op when not running. */
void pgproc_stop(pgproc *p);
/* SIGKILL the postmaster and its backends, and wait until they are gone
 * (a crash of the server's machine: no connection is served a moment
 * longer); port and folder kept for pgproc_restart. */
void pgproc_kill(pgproc *p);
/* Start again on the same port and folder after stop or kill (crash
 * recovery after a kill), and wait until it accepts connections.  0 or
 * -1 with p->why. */
int pgproc_restart(pgproc *p);
/* Stop (fast) and remove the folder (kept when $QG_KEEP_TMP is set). */
void pgproc_destroy(pgproc *p);

/* CREATE DATABASE of a new name, written into name.  0 or -1 (why). */
int pgproc_createdb(pgproc *p, char *name, size_t cap);
/* "postgresql://USER@127.0.0.1:PORT/DB" into out; returns out. */
const char *pgproc_url(const pgproc *p, const char *db, char *out,
                       size_t cap);
/* Run one SQL statement in database db and copy its first value as text
 * into out ("" when it returns no row; NULL prints as ""), with libpq.
 * Returns 0, or -1 with the server's message in p->why. */
int pgproc_sql(pgproc *p, const char *db, const char *sql, char *out,
               size_t cap);

#endif
