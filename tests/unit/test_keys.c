/* test_keys.c - API keys: generation (shape, record, hash), verification
 * (tampered and revoked keys fail), id parsing edge cases, hashes of
 * environment-provided keys, uniqueness; roles of presented keys
 * (qg__auth_identify: environment keys byte for byte, padded, and their
 * near misses; stored keys; a stored key's read from a slow PostgreSQL
 * ledger holds up no other key); and `quotagate keys` end to end
 * through $QG_BIN: create prints the key alone on its last line, list shows
 * its id and never the key, revoke, unknown ids and bad usage. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "quotagate.h"
#include "auth.h"
#include "keys.h"
#include "ledger.h"
#include "pgproc.h"
#include "runcli.h"

#define NOW_MS 1780000000000LL

static void test_generate_verify(void **state)
{
    char key[QG_KEY_LEN + 1], id[32];
    qg_key_rec rec;
    unsigned char h[32];
    unsigned int hn = 0;
    size_t i;
    (void)state;

    assert_int_equal(qg__key_generate("subject", "alice", NOW_MS, key,
                                     sizeof key, &rec), 0);
    assert_int_equal(strlen(key), QG_KEY_LEN);
    assert_memory_equal(key, "qgk_", 4);
    assert_int_equal(key[16], '_');
    for (i = 17; i < QG_KEY_LEN; i++)
        assert_null(strchr("+/=", key[i]));
    assert_int_equal(strlen(rec.id), 12);
    assert_memory_equal(rec.id, key + 4, 12);
    assert_string_equal(rec.role, "subject");
    assert_string_equal(rec.subject, "alice");
    assert_int_equal(rec.created_ms, NOW_MS);
    assert_int_equal(rec.revoked_ms, 0);
    /* the hash is SHA-256 of the whole key */
    assert_int_equal(EVP_Digest(key, strlen(key), h, &hn, EVP_sha256(),
                                NULL), 1);
    assert_memory_equal(h, rec.hash, 32);
    assert_int_equal(qg__key_parse_id(key, id, sizeof id), 0);
    assert_string_equal(id, rec.id);
    assert_int_equal(qg__key_verify(key, &rec), 1);

    /* admin and service keys have no subject */
    assert_int_equal(qg__key_generate("admin", NULL, NOW_MS, key, sizeof key,
                                     &rec), 0);
    assert_string_equal(rec.subject, "");
    assert_int_equal(qg__key_generate("service", "", NOW_MS, key, sizeof key,
                                     &rec), 0);
    assert_int_equal(qg__key_verify(key, &rec), 1);
}

static void test_bad_generate(void **state)
{
    char key[QG_KEY_LEN + 1], big[300];
    qg_key_rec rec;
    (void)state;
    assert_int_equal(qg__key_generate("root", "a", 0, key, sizeof key, &rec),
                     QG_EINVAL);
    assert_int_equal(qg__key_generate(NULL, "a", 0, key, sizeof key, &rec),
                     QG_EINVAL);
    assert_int_equal(qg__key_generate("subject", NULL, 0, key, sizeof key,
                                     &rec), QG_EINVAL);
    assert_int_equal(qg__key_generate("subject", "", 0, key, sizeof key,
                                     &rec), QG_EINVAL);
    assert_int_equal(qg__key_generate("admin", "alice", 0, key, sizeof key,
                                     &rec), QG_EINVAL);
    assert_int_equal(qg__key_generate("subject", "a", 0, key, QG_KEY_LEN,
                                     &rec), QG_EINVAL);
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(qg__key_generate("subject", big, 0, key, sizeof key,
                                     &rec), QG_EINVAL);
}

static void test_tampered_and_revoked(void **state)
{
    char key[QG_KEY_LEN + 1], other[QG_KEY_LEN + 1];
    qg_key_rec rec, rec2;
    size_t i;
    (void)state;

    assert_int_equal(qg__key_generate("subject", "bob", NOW_MS, key,
                                     sizeof key, &rec), 0);
    /* every single-character change fails */
    for (i = 0; i < QG_KEY_LEN; i++) {
        char t[QG_KEY_LEN + 1];
        memcpy(t, key, sizeof t);
        t[i] = t[i] == 'A' ? 'B' : 'A';
        assert_int_equal(qg__key_verify(t, &rec), 0);
    }
    key[QG_KEY_LEN - 1] = '\0';             /* truncated */
    assert_int_equal(qg__key_verify(key, &rec), 0);
    assert_int_equal(qg__key_verify("", &rec), 0);
    assert_int_equal(qg__key_verify(NULL, &rec), 0);

    assert_int_equal(qg__key_generate("subject", "bob", NOW_MS, other,
                                     sizeof other, &rec2), 0);
    assert_int_equal(qg__key_verify(other, &rec), 0);   /* another key */
    assert_int_equal(qg__key_verify(other, &rec2), 1);
    rec2.revoked_ms = NOW_MS + 1;
    assert_int_equal(qg__key_verify(other, &rec2), 0);
}

static void test_parse_id(void **state)
{
    char key[QG_KEY_LEN + 1], id[32], t[128];
    qg_key_rec rec;
    (void)state;

    assert_int_equal(qg__key_generate("subject", "c", 0, key, sizeof key,
                                     &rec), 0);
    assert_int_equal(qg__key_parse_id(key, id, 13), 0);
    assert_string_equal(id, rec.id);
    assert_int_equal(qg__key_parse_id(key, id, 12), QG_EINVAL); /* cap */
    assert_int_equal(qg__key_parse_id(NULL, id, sizeof id), QG_EINVAL);
    assert_int_equal(qg__key_parse_id("", id, sizeof id), QG_EINVAL);
    assert_string_equal(id, "");
    assert_int_equal(qg__key_parse_id("qgk_", id, sizeof id), QG_EINVAL);
    assert_int_equal(qg__key_parse_id("qgk__", id, sizeof id), QG_EINVAL);
    /* wrong prefix */
    snprintf(t, sizeof t, "qgx_%s", key + 4);
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    /* uppercase hex in the id */
    snprintf(t, sizeof t, "%s", key);
    t[4] = 'A';
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    /* id one character short / separator moved */
    snprintf(t, sizeof t, "qgk_%.11s_%s", key + 4, key + 17);
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    snprintf(t, sizeof t, "%s", key);
    t[16] = 'a';
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    /* padding or standard base64 in the secret */
    snprintf(t, sizeof t, "%s", key);
    t[QG_KEY_LEN - 1] = '=';
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    t[QG_KEY_LEN - 1] = '+';
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    /* trailing garbage */
    snprintf(t, sizeof t, "%sx", key);
    assert_int_equal(qg__key_parse_id(t, id, sizeof id), QG_EINVAL);
    /* a well-formed key that was never issued still parses */
    assert_int_equal(qg__key_parse_id(
        "qgk_0123456789ab_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", id,
        sizeof id), 0);
    assert_string_equal(id, "0123456789ab");
}

static void test_env_key_hash(void **state)
{
    unsigned char a[32], b[32], c[32];
    static const unsigned char sha_abc[32] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
        0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
        0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad };
    (void)state;

    qg__key_hash("abc", 3, a);
    assert_memory_equal(a, sha_abc, 32);
    qg__key_hash("my admin secret", 15, a);
    qg__key_hash("my admin secret", 15, b);
    qg__key_hash("my admin secreT", 15, c);
    assert_int_equal(qg__key_hash_equal(a, b), 1);
    assert_int_equal(qg__key_hash_equal(a, c), 0);
    /* the length is what is hashed, not up to a NUL */
    qg__key_hash("my admin secret", 14, c);
    assert_int_equal(qg__key_hash_equal(a, c), 0);
}

static void test_keys_differ(void **state)
{
    char k1[QG_KEY_LEN + 1], k2[QG_KEY_LEN + 1];
    qg_key_rec r1, r2;
    int i;
    (void)state;
    for (i = 0; i < 100; i++) {
        assert_int_equal(qg__key_generate("subject", "d", 0, k1, sizeof k1,
                                         &r1), 0);
        assert_int_equal(qg__key_generate("subject", "d", 0, k2, sizeof k2,
                                         &r2), 0);
        assert_string_not_equal(k1, k2);
        assert_string_not_equal(r1.id, r2.id);
        assert_memory_not_equal(r1.hash, r2.hash, 32);
        assert_string_not_equal(k1 + 17, k2 + 17);
    }
}

/* Roles of presented keys: environment keys compared as they are (zero
 * padded to 64 bytes, the length compared too), longer ones by hash;
 * stored keys through the ledger. */
static void test_auth_identify(void **state)
{
    char dir[] = "/tmp/qgauth.XXXXXX", db[96], err[256], who[64];
    char svc[] = "svc-secret-22", adm[] = "adm-secret-1";
    char k64[65], k65[66], near[300], key[QG_KEY_LEN + 1];
    qg_key_rec rec;
    qg_ledger *l;
    qg_auth *a;
    (void)state;

    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/ledger.db", dir);
    assert_non_null(l = qg__ledger_open(db, NULL, err, sizeof err));
    assert_non_null(a = qg__auth_new(l, adm, svc));
#define ROLE(k, n) qg__auth_identify(a, k, n, NOW_MS, NULL, 0)
    assert_int_equal(ROLE(svc, strlen(svc)), QG_ROLE_SERVICE);
    assert_int_equal(ROLE(adm, strlen(adm)), QG_ROLE_ADMIN);
    /* near misses: a prefix, one byte more, the last byte changed, the
     * key with a NUL after it (equal once both are padded with zeros:
     * the length tells them apart), nothing */
    assert_int_equal(ROLE(svc, strlen(svc) - 1), QG_ROLE_NONE);
    snprintf(near, sizeof near, "%sx", svc);
    assert_int_equal(ROLE(near, strlen(near)), QG_ROLE_NONE);
    snprintf(near, sizeof near, "%s", svc);
    near[strlen(near) - 1] = '3';
    assert_int_equal(ROLE(near, strlen(near)), QG_ROLE_NONE);
    memcpy(near, svc, sizeof svc);              /* its NUL included */
    assert_int_equal(ROLE(near, sizeof svc), QG_ROLE_NONE);
    assert_int_equal(ROLE(svc, 0), QG_ROLE_NONE);
    assert_int_equal(ROLE(NULL, 3), QG_ROLE_NONE);
    memset(near, 's', sizeof near);
    assert_int_equal(ROLE(near, sizeof near), QG_ROLE_NONE);
    qg__auth_free(a);

    /* 64 bytes: compared padded; 65: by hash; each with a near miss */
    memset(k64, 'a', 64);
    k64[64] = '\0';
    memset(k65, 'b', 65);
    k65[65] = '\0';
    assert_non_null(a = qg__auth_new(l, k65, k64));
    assert_int_equal(ROLE(k64, 64), QG_ROLE_SERVICE);
    assert_int_equal(ROLE(k65, 65), QG_ROLE_ADMIN);
    assert_int_equal(ROLE(k64, 63), QG_ROLE_NONE);
    assert_int_equal(ROLE(k65, 64), QG_ROLE_NONE);
    k64[63] = 'b';
    k65[64] = 'a';
    assert_int_equal(ROLE(k64, 64), QG_ROLE_NONE);
    assert_int_equal(ROLE(k65, 65), QG_ROLE_NONE);
    qg__auth_free(a);

    /* no environment keys: a stored subject key names its subject; the
     * same key with its last character changed is nobody */
    assert_non_null(a = qg__auth_new(l, NULL, ""));
    assert_int_equal(qg__key_generate("subject", "alice", NOW_MS, key,
                                     sizeof key, &rec), 0);
    assert_int_equal(qg__ledger_put_key(l, &rec), 0);
    who[0] = '\0';
    assert_int_equal(qg__auth_identify(a, key, strlen(key), NOW_MS, who,
                                      sizeof who), QG_ROLE_SUBJECT);
    assert_string_equal(who, "alice");
    key[QG_KEY_LEN - 1] = key[QG_KEY_LEN - 1] == 'A' ? 'B' : 'A';
    assert_int_equal(ROLE(key, strlen(key)), QG_ROLE_NONE);
    assert_int_equal(ROLE(svc, strlen(svc)), QG_ROLE_NONE);
#undef ROLE
    qg__auth_free(a);
    qg__ledger_close(l);
    snprintf(err, sizeof err, "rm -rf %s", dir);
    assert_int_equal(system(err), 0);
}

/* A stored key's ledger read does not hold up another key's check: with
 * the keys table locked in PostgreSQL (the shared ledger slow or away), a
 * key not cached waits in its read on one thread while a key cached a
 * moment ago answers on another.  The key cache's lock was held across
 * the read: every key waited for that one.  Skipped without
 * PostgreSQL's binaries (make test installs them). */
typedef struct waiting_key {
    qg_auth *a;
    const char *key;
    _Atomic int role;            /* -1 until identified */
} waiting_key;

static void *identify_waiting(void *arg)
{
    waiting_key *w = arg;
    atomic_store(&w->role, qg__auth_identify(w->a, w->key, strlen(w->key),
                                             NOW_MS + 100, NULL, 0));
    return NULL;
}

static void test_auth_read_outside_lock(void **state)
{
    char name[64], url[256], err[256], k1[QG_KEY_LEN + 1],
        k2[QG_KEY_LEN + 1], who[64];
    qg_key_rec r1, r2;
    waiting_key w;
    pthread_t th;
    qg_ledger *l;
    qg_auth *a;
    PGconn *x;
    pgproc pg;
    int waits = 0;
    (void)state;
    if (!pgproc_bindir()) {
        print_message("PostgreSQL binaries not found: skipped\n");
        skip();
    }
    memset(&pg, 0, sizeof pg);
    if (pgproc_start(&pg) != 0)
        fail_msg("PostgreSQL: %s", pg.why);
    if (pgproc_createdb(&pg, name, sizeof name) != 0)
        fail_msg("createdb: %s", pg.why);
    pgproc_url(&pg, name, url, sizeof url);
    assert_non_null(l = qg__ledger_open(url, NULL, err, sizeof err));
    assert_non_null(a = qg__auth_new(l, NULL, ""));
    assert_int_equal(qg__key_generate("subject", "alice", NOW_MS, k1,
                                     sizeof k1, &r1), 0);
    assert_int_equal(qg__key_generate("subject", "bob", NOW_MS, k2,
                                     sizeof k2, &r2), 0);
    assert_int_equal(qg__ledger_put_key(l, &r1), 0);
    assert_int_equal(qg__ledger_put_key(l, &r2), 0);
    /* bob's key cached now */
    assert_int_equal(qg__auth_identify(a, k2, strlen(k2), NOW_MS, NULL, 0),
                     QG_ROLE_SUBJECT);
    x = PQconnectdb(url);
    assert_int_equal(PQstatus(x), CONNECTION_OK);
    /* a bound, should alice's read hold bob's up: the lock ends after
     * 10 s, the test then fails instead of waiting for ever */
    PQclear(PQexec(x, "SET idle_in_transaction_session_timeout = '10s'"));
    PQclear(PQexec(x, "BEGIN"));
    PQclear(PQexec(x, "LOCK TABLE keys IN ACCESS EXCLUSIVE MODE"));
    /* alice's key, never read: its read waits for the lock */
    w.a = a;
    w.key = k1;
    atomic_store(&w.role, -1);
    assert_int_equal(pthread_create(&th, NULL, identify_waiting, &w), 0);
    for (int i = 0; i < 1000 && !waits; i++) {
        char out[32];
        if (pgproc_sql(&pg, name, "SELECT count(*) FROM pg_stat_activity "
                       "WHERE wait_event_type = 'Lock' AND datname = "
                       "current_database()", out, sizeof out) != 0)
            fail_msg("%s", pg.why);
        waits = atoi(out) > 0;
        if (!waits)
            usleep(10000);
    }
    assert_true(waits);
    /* bob's, cached 100 ms ago (the instant is the caller's): answered
     * while alice's read still waits */
    who[0] = '\0';
    assert_int_equal(qg__auth_identify(a, k2, strlen(k2), NOW_MS + 100, who,
                                      sizeof who), QG_ROLE_SUBJECT);
    assert_string_equal(who, "bob");
    assert_int_equal(atomic_load(&w.role), -1);
    PQclear(PQexec(x, "ROLLBACK"));
    PQfinish(x);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&w.role), QG_ROLE_SUBJECT);
    qg__auth_free(a);
    qg__ledger_close(l);
    pgproc_destroy(&pg);
}

/* ------------------------------------------------------------ the CLI */

/* The last line of text, without its newline. */
static void last_line(const char *text, char *out, size_t cap)
{
    size_t n = strlen(text);
    const char *s;
    while (n > 0 && text[n - 1] == '\n')
        n--;
    s = text + n;
    while (s > text && s[-1] != '\n')
        s--;
    snprintf(out, cap, "%.*s", (int)(text + n - s), s);
}

static void test_cli_keys(void **state)
{
    char dir[] = "/tmp/qgkeyscli.XXXXXX", data[96], db[128], key[128],
         id[32], key2[128], id2[32];
    tst_cli_result r;
    (void)state;

    assert_non_null(mkdtemp(dir));
    snprintf(data, sizeof data, "%s/var/x", dir);   /* created */
    r = tst_cli_run("keys", "create", "alice", "--data", data, NULL);
    assert_int_equal(r.rc, 0);
    last_line(r.out, key, sizeof key);
    assert_int_equal(strlen(key), QG_KEY_LEN);
    assert_int_equal(qg__key_parse_id(key, id, sizeof id), 0);
    assert_non_null(strstr(r.out, "alice"));
    tst_cli_done(&r);

    r = tst_cli_run("keys", "create", "--role", "service", "--data", data,
                    NULL);
    assert_int_equal(r.rc, 0);
    last_line(r.out, key2, sizeof key2);
    assert_int_equal(qg__key_parse_id(key2, id2, sizeof id2), 0);
    tst_cli_done(&r);

    r = tst_cli_run("keys", "list", "--data", data, NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, id));
    assert_non_null(strstr(r.out, id2));
    assert_non_null(strstr(r.out, "alice"));
    assert_non_null(strstr(r.out, "service"));
    assert_null(strstr(r.out, key));
    assert_null(strstr(r.out, key + 17));   /* not even the secret */
    assert_null(strstr(r.out, key2 + 17));
    tst_cli_done(&r);

    /* the stored record verifies the printed key */
    snprintf(db, sizeof db, "sqlite:%s/ledger.db", data);
    {
        char err[256];
        qg_key_rec rec;
        qg_ledger *l = qg__ledger_open(db, NULL, err, sizeof err);
        assert_non_null(l);
        assert_int_equal(qg__ledger_get_key(l, id, &rec), 0);
        assert_int_equal(qg__key_verify(key, &rec), 1);
        assert_int_equal(qg__key_verify(key2, &rec), 0);
        qg__ledger_close(l);
    }

    r = tst_cli_run("keys", "revoke", id, "--ledger", db, NULL);
    assert_int_equal(r.rc, 0);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "list", "--json", "--data", data, NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "\"revoked\": \"20"));   /* alice's */
    assert_non_null(strstr(r.out, "\"revoked\": null"));   /* service */
    assert_null(strstr(r.out, key + 17));
    tst_cli_done(&r);
    {
        char err[256];
        qg_key_rec rec;
        qg_ledger *l = qg__ledger_open(db, NULL, err, sizeof err);
        assert_non_null(l);
        assert_int_equal(qg__ledger_get_key(l, id, &rec), 0);
        assert_true(rec.revoked_ms > 0);
        assert_int_equal(qg__key_verify(key, &rec), 0);
        qg__ledger_close(l);
    }

    r = tst_cli_run("keys", "revoke", "ffffffffffff", "--data", data, NULL);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "ffffffffffff"));
    tst_cli_done(&r);

    /* bad usage: exit 2 */
    r = tst_cli_run("keys", "--data", data, NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "create", "--data", data, NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "create", "bob", "--role", "root", "--data", data,
                    NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "revoke", "--data", data, NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "drop", "--data", data, NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "list", "extra", "more", "--data", data, NULL);
    assert_int_equal(r.rc, 2);
    tst_cli_done(&r);
    /* a PostgreSQL ledger that cannot be reached: exit 2, naming it */
    r = tst_cli_run("keys", "list", "--ledger",
                    "postgresql://qg@127.0.0.1:1/db", NULL);
    assert_int_equal(r.rc, 2);
    if (!strstr(r.err, "127.0.0.1:1") || !strstr(r.err, "cannot connect"))
        fail_msg("keys list on an unreachable PostgreSQL: %s", r.err);
    tst_cli_done(&r);
    r = tst_cli_run("keys", "--help", NULL);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "--role"));
    tst_cli_done(&r);

    {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_verify),
        cmocka_unit_test(test_bad_generate),
        cmocka_unit_test(test_tampered_and_revoked),
        cmocka_unit_test(test_parse_id),
        cmocka_unit_test(test_env_key_hash),
        cmocka_unit_test(test_keys_differ),
        cmocka_unit_test(test_auth_identify),
        cmocka_unit_test(test_auth_read_outside_lock),
        cmocka_unit_test(test_cli_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
