/* srvtest.c - shared helpers of the server integration tests (srvtest.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <sqlite3.h>
#include "srvtest.h"

#define GC_MAX 8192
static struct {
    int kind;
    void *p;
} gc[GC_MAX];
static int ngc;
static int counter;

void *tst_gc_add(int kind, void *p)
{
    if (ngc == GC_MAX)
        fail_msg("test garbage list full");
    gc[ngc].kind = kind;
    gc[ngc].p = p;
    ngc++;
    return p;
}

void tst_gc_free_all(void)
{
    for (int i = ngc - 1; i >= 0; i--) {
        if (gc[i].kind == GC_JSON)
            json_decref(gc[i].p);
        else if (gc[i].kind == GC_RESP) {
            http_resp_free(gc[i].p);
            free(gc[i].p);
        } else
            free(gc[i].p);
    }
    ngc = 0;
}

char *tst_fmt(const char *f, ...)
{
    va_list ap;
    char *s;
    va_start(ap, f);
    if (vasprintf(&s, f, ap) < 0)
        s = NULL;
    va_end(ap);
    assert_non_null(s);
    return tst_gc_add(GC_MEM, s);
}

const char *tst_uid(const char *prefix)
{
    return tst_fmt("%s-%d-%d", prefix, (int)getpid(), ++counter);
}

char *tst_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t cap = 1 << 20, n;
    char *buf = tst_gc_add(GC_MEM, malloc(cap + 1));
    assert_non_null(buf);
    if (!f)
        fail_msg("cannot read %s: %s", path, strerror(errno));
    n = fread(buf, 1, cap, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

void tst_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

const char *tst_excerpt(const http_resp *r)
{
    return tst_fmt("%.600s", r->body ? r->body : "");
}

void tst_want_status(const http_resp *r, int status, const char *what,
                     int line)
{
    if (r->status != status)
        fail_msg("line %d: %s: expected HTTP %d, got %d; body: %s", line,
                 what, status, r->status, tst_excerpt(r));
}

json_t *tst_jparse_text(const char *text, size_t len, const char *what)
{
    json_error_t e;
    json_t *j = json_loadb(text ? text : "", text ? len : 0, 0, &e);
    if (!j)
        fail_msg("%s: not JSON (%s): %.600s", what, e.text,
                 text ? text : "");
    return tst_gc_add(GC_JSON, j);
}

json_t *tst_jparse(const http_resp *r, const char *what)
{
    json_error_t e;
    json_t *j = json_loadb(r->body ? r->body : "", r->body ? r->body_len : 0,
                           0, &e);
    if (!j)
        fail_msg("%s: HTTP %d body is not JSON (%s): %s", what, r->status,
                 e.text, tst_excerpt(r));
    return tst_gc_add(GC_JSON, j);
}

const char *tst_dump(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (!s)
        return "(null)";
    tst_gc_add(GC_MEM, s);
    return tst_fmt("%.400s", s);
}

const char *tst_jstr(json_t *o, const char *key, const char *what)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        fail_msg("%s: \"%s\" missing or not a string in %s", what, key,
                 tst_dump(o));
    return json_string_value(v);
}

double tst_jnum(json_t *o, const char *key, const char *what)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        fail_msg("%s: \"%s\" missing or not a number in %s", what, key,
                 tst_dump(o));
    return json_number_value(v);
}

int tst_jbool(json_t *o, const char *key, const char *what)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_boolean(v))
        fail_msg("%s: \"%s\" missing or not a boolean in %s", what, key,
                 tst_dump(o));
    return json_is_true(v);
}

const char *tst_error_type(const http_resp *r, const char *what)
{
    json_t *e = json_object_get(tst_jparse(r, what), "error");
    if (!json_is_object(e))
        fail_msg("%s: no \"error\" object: %s", what, tst_excerpt(r));
    return tst_jstr(e, "type", what);
}

const char **tst_ledger_cols(const char *data_dir, const char *rid,
                             const char *columns, int n, int settled)
{
    const char *db = tst_fmt("%s/ledger.db", data_dir);
    const char *sql = tst_fmt("SELECT %s FROM requests WHERE request_id = ?1"
                              "%s", columns,
                              settled ? " AND settled_ms > 0" : "");
    const char **out = tst_gc_add(GC_MEM, calloc((size_t)n, sizeof *out));
    assert_non_null(out);
    for (int tries = 0; tries < 500; tries++) {
        sqlite3 *h = NULL;
        sqlite3_stmt *st = NULL;
        int found = 0;
        if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
            sqlite3_busy_timeout(h, 2000) == SQLITE_OK &&
            sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_column_count(st) == n &&
            sqlite3_bind_text(st, 1, rid, -1, SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW) {
            for (int i = 0; i < n; i++) {
                const unsigned char *t = sqlite3_column_text(st, i);
                out[i] = tst_fmt("%s", t ? (const char *)t : "");
            }
            found = 1;
        }
        sqlite3_finalize(st);
        sqlite3_close(h);
        if (found)
            return out;
        tst_sleep_ms(20);
    }
    fail_msg("ledger %s: no %srow for %s (%s)", db, settled ? "settled " : "",
             rid, columns);
    return NULL;
}

int tst_ledger_ints(const char *data_dir, const char *rid, const char *columns,
                    long long *out, int n)
{
    const char **v = tst_ledger_cols(data_dir, rid, columns, n, 1);
    for (int i = 0; i < n; i++)
        out[i] = atoll(v[i]);
    return 0;
}
