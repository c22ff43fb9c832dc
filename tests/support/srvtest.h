/* srvtest.h - what the integration tests of the running server share
 * (test_server.c, test_authz.c, test_proxy.c): a list of things to free at
 * teardown, formatted strings that live until then, unique ids, and JSON
 * and status checks that fail the test with the response's body. */
#ifndef TST_SRVTEST_H
#define TST_SRVTEST_H

#include <jansson.h>
#include <math.h>
#include "httpc.h"

enum { GC_MEM, GC_JSON, GC_RESP };

/* Remember p (of kind GC_*) to free at tst_gc_free_all; returns p. */
void *tst_gc_add(int kind, void *p);
void tst_gc_free_all(void);

/* printf into a string freed at teardown. */
char *tst_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
/* "prefix-PID-N", unique within the process. */
const char *tst_uid(const char *prefix);
void tst_sleep_ms(int ms);
/* A file's first MiB, NUL-terminated, freed at teardown (a server's
 * stderr.log, say); fails the test when it cannot be read. */
char *tst_slurp(const char *path);

/* The first 600 bytes of a response body, for messages. */
const char *tst_excerpt(const http_resp *r);
void tst_want_status(const http_resp *r, int status, const char *what,
                     int line);
#define WANT(r, st, what) tst_want_status((r), (st), (what), __LINE__)

json_t *tst_jparse_text(const char *text, size_t len, const char *what);
json_t *tst_jparse(const http_resp *r, const char *what);
const char *tst_dump(json_t *o);
const char *tst_jstr(json_t *o, const char *key, const char *what);
double tst_jnum(json_t *o, const char *key, const char *what);
int tst_jbool(json_t *o, const char *key, const char *what);
/* error.type of an error body. */
const char *tst_error_type(const http_resp *r, const char *what);

/* The n columns (comma-separated SQL names) of rid's ledger row in
 * DATA_DIR/ledger.db as text ("" for NULL; strings freed at teardown),
 * polled up to 10 s until the row exists (and, with settled, is settled);
 * fails the test when it never does. */
const char **tst_ledger_cols(const char *data_dir, const char *rid,
                             const char *columns, int n, int settled);
/* The same for integer columns of a settled row. */
int tst_ledger_ints(const char *data_dir, const char *rid, const char *columns,
                    long long *out, int n);

#define NEAR(a, b) (fabs((a) - (b)) < 1e-6)

#endif
