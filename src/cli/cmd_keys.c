/* cmd_keys.c - `quotagate keys create SUBJECT | list | revoke KEY_ID`.
 *
 * API keys live in the ledger database, as SHA-256 hashes only (the
 * keyring of quotagate.h).
 * `create` shows the new key exactly once, alone on the last line of its
 * output so that scripts can take it with `tail -1`; `list` shows ids,
 * roles, subjects and times, never a key or a hash.  The ledger is
 * --ledger URL, else DIR/ledger.db under --data DIR (default ./var,
 * created when missing).  The file may be in use by a running server at
 * the same time: SQLite's WAL mode and busy timeout take care of that.
 * Exit codes: 0 done, 1 unknown key id, 2 bad usage or unusable ledger. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* mkdir -p, private to the user (the directory holds key hashes). */
static int make_dirs(const char *dir)
{
    char p[4096];
    size_t i, n = strlen(dir);
    if (n == 0 || n >= sizeof p)
        return -1;
    memcpy(p, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        p[i] = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return -1;
        p[i] = i < n ? '/' : '\0';
    }
    return 0;
}

static int usage(const qg_cli_args *a, const char *why)
{
    fprintf(stderr, "quotagate %s: %s\nusage: quotagate keys create SUBJECT "
            "[--role subject|admin|service] | list [--json] | revoke KEY_ID"
            "  [--data DIR | --ledger URL]\n", a->cmd, why);
    return QG_EXIT_USAGE;
}

/* The ledger's warnings (a file others may read) go to stderr. */
static void ledger_log(void *ud, const char *line)
{
    (void)ud;
    fprintf(stderr, "quotagate keys: %s\n", line);
}

static qg_keyring *open_keyring(const qg_cli_args *a)
{
    char url[4200], err[1024];
    const char *dir = a->data ? a->data : "./var";
    qg_keyring *k;
    if (a->ledger) {
        snprintf(url, sizeof url, "%s", a->ledger);
    } else {
        if (make_dirs(dir) != 0) {
            fprintf(stderr, "quotagate keys: cannot create %s: %s\n", dir,
                    strerror(errno));
            return NULL;
        }
        if ((size_t)snprintf(url, sizeof url, "sqlite:%s/ledger.db", dir) >=
            sizeof url) {
            fprintf(stderr, "quotagate keys: --data path too long\n");
            return NULL;
        }
    }
    if (!(k = qg_keyring_open(url, ledger_log, NULL, err, sizeof err)))
        fprintf(stderr, "quotagate keys: %s\n", err);
    return k;
}

static int do_create(const qg_cli_args *a, qg_keyring *kr,
                     const char *subject)
{
    const char *role = a->role ? a->role : "subject";
    char key[QG_API_KEY_MAX];
    qg_key_info rec;
    int rc = qg_keyring_create(kr, role, subject, wall_ms(), key, sizeof key,
                               &rec);
    if (rc != QG_OK) {
        fprintf(stderr, "quotagate keys: cannot create the key: %s\n",
                qg_strerror(rc));
        memset(key, 0, sizeof key);
        return QG_EXIT_USAGE;
    }
    if (rec.subject[0])
        printf("created %s key %s for subject %s\n", rec.role, rec.id,
               rec.subject);
    else
        printf("created %s key %s\n", rec.role, rec.id);
    printf("the key is shown only now and stored only as a hash; "
           "keep it:\n%s\n", key);
    memset(key, 0, sizeof key);
    return QG_EXIT_OK;
}

typedef struct list_ctx {
    int json;
    json_t *arr;
    int n;
} list_ctx;

static int list_one(const qg_key_info *k, void *ud)
{
    list_ctx *c = ud;
    char created[40], revoked[40];
    qg_iso8601_format(k->created_ms, created, sizeof created);
    if (k->revoked_ms)
        qg_iso8601_format(k->revoked_ms, revoked, sizeof revoked);
    else
        strcpy(revoked, "-");
    c->n++;
    if (c->json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s?}", "id", k->id,
                              "role", k->role, "subject", k->subject,
                              "created", created, "revoked",
                              k->revoked_ms ? revoked : NULL);
        if (!o || json_array_append_new(c->arr, o) != 0)
            return QG_ENOMEM;
        return 0;
    }
    if (c->n == 1)
        printf("%-12s  %-7s  %-20s  %-24s  %s\n", "ID", "ROLE", "SUBJECT",
               "CREATED", "REVOKED");
    printf("%-12s  %-7s  %-20s  %-24s  %s\n", k->id, k->role,
           k->subject[0] ? k->subject : "-", created, revoked);
    return 0;
}

static int do_list(const qg_cli_args *a, qg_keyring *kr)
{
    list_ctx c = { a->json, NULL, 0 };
    int rc;
    if (c.json && !(c.arr = json_array()))
        return QG_EXIT_USAGE;
    rc = qg_keyring_list(kr, list_one, &c);
    if (rc != QG_OK) {
        fprintf(stderr, "quotagate keys: cannot list keys: %s\n",
                qg_strerror(rc));
        json_decref(c.arr);
        return QG_EXIT_USAGE;
    }
    if (c.json)
        return qg__json_emit(c.arr, 1) == 0 ? QG_EXIT_OK : QG_EXIT_USAGE;
    if (c.n == 0)
        printf("no keys\n");
    return QG_EXIT_OK;
}

static int do_revoke(qg_keyring *kr, const char *id)
{
    qg_key_info k;
    char when[40];
    int rc = qg_keyring_revoke(kr, id, wall_ms(), &k);
    if (rc == QG_ENOTFOUND) {
        fprintf(stderr, "quotagate keys: no key with id \"%s\" (see "
                "quotagate keys list)\n", id);
        return QG_EXIT_FINDINGS;
    }
    if (rc != QG_OK) {
        fprintf(stderr, "quotagate keys: cannot revoke %s: %s\n", id,
                qg_strerror(rc));
        return QG_EXIT_USAGE;
    }
    qg_iso8601_format(k.revoked_ms, when, sizeof when);
    printf("key %s (%s%s%s) revoked at %s\n", k.id, k.role,
           k.subject[0] ? " " : "", k.subject, when);
    return QG_EXIT_OK;
}

int qg__cmd_keys(const qg_cli_args *a, qg_rules *rules)
{
    const char *sub = a->nargs > 0 ? a->args[0] : NULL;
    qg_keyring *kr;
    int rc;
    (void)rules;

    if (!sub)
        return usage(a, "missing subcommand (create, list or revoke)");
    if (a->data && a->ledger)
        return usage(a, "give --data or --ledger, not both");
    if (strcmp(sub, "create") == 0) {
        const char *role = a->role ? a->role : "subject";
        int wants_subject = strcmp(role, "subject") == 0;
        if (!qg_keyring_role_valid(role))
            return usage(a, "--role must be subject, admin or service");
        if (wants_subject && a->nargs != 2)
            return usage(a, "create needs the SUBJECT the key acts as");
        if (!wants_subject && a->nargs != 1)
            return usage(a, "admin and service keys have no SUBJECT");
        if (wants_subject && strlen(a->args[1]) >= sizeof(
                                     ((qg_key_info *)0)->subject))
            return usage(a, "SUBJECT is too long");
        if (a->json)
            return usage(a, "--json is for list");
    } else if (strcmp(sub, "list") == 0) {
        if (a->nargs != 1)
            return usage(a, "list takes no argument");
        if (a->role)
            return usage(a, "--role is for create");
    } else if (strcmp(sub, "revoke") == 0) {
        if (a->nargs != 2)
            return usage(a, "revoke needs the KEY_ID (see keys list)");
        if (a->role || a->json)
            return usage(a, "revoke takes only KEY_ID");
    } else {
        char why[128];
        snprintf(why, sizeof why, "unknown subcommand \"%.60s\"", sub);
        return usage(a, why);
    }

    if (!(kr = open_keyring(a)))
        return QG_EXIT_USAGE;
    if (strcmp(sub, "create") == 0)
        rc = do_create(a, kr, a->nargs == 2 ? a->args[1] : NULL);
    else if (strcmp(sub, "list") == 0)
        rc = do_list(a, kr);
    else
        rc = do_revoke(kr, a->args[1]);
    qg_keyring_close(kr);
    return rc;
}
