/* keyring.c - the public handle on the API keys a ledger keeps
 * (quotagate.h, "API keys"): what `quotagate keys` uses, so that the CLI
 * needs neither the ledger's nor the key format's internal headers.
 *
 * A keyring is a ledger opened for its key store only (no writer queue is
 * used); keys.c makes and hashes keys, the ledger stores their records.
 * Descriptions handed out never carry the hash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "keys.h"
#include "ledger.h"
#include "quotagate.h"

_Static_assert(QG_API_KEY_MAX > QG_KEY_LEN, "QG_API_KEY_MAX holds a key");
_Static_assert(sizeof(((qg_key_info *)0)->id) >= sizeof(((qg_key_rec *)0)->id),
               "ids fit");

struct qg_keyring {
    qg_ledger *ledger;
};

static void describe(const qg_key_rec *rec, qg_key_info *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->id, rec->id, sizeof out->id);
    memcpy(out->role, rec->role, sizeof out->role);
    memcpy(out->subject, rec->subject, sizeof out->subject);
    out->id[sizeof out->id - 1] = '\0';
    out->role[sizeof out->role - 1] = '\0';
    out->subject[sizeof out->subject - 1] = '\0';
    out->created_ms = rec->created_ms;
    out->revoked_ms = rec->revoked_ms;
}

qg_keyring *qg_keyring_open(const char *ledger_url,
                            void (*log)(void *ud, const char *line),
                            void *log_ud, char *err, size_t errcap)
{
    qg_ledger_opts lo;
    qg_keyring *k = calloc(1, sizeof *k);
    if (!k) {
        if (errcap)
            snprintf(err, errcap, "out of memory");
        return NULL;
    }
    memset(&lo, 0, sizeof lo);
    lo.log = log;
    lo.log_ud = log_ud;
    if (!(k->ledger = qg__ledger_open(ledger_url, &lo, err, errcap))) {
        free(k);
        return NULL;
    }
    return k;
}

void qg_keyring_close(qg_keyring *k)
{
    if (!k)
        return;
    qg__ledger_close(k->ledger);
    free(k);
}

int qg_keyring_role_valid(const char *role)
{
    return qg__key_role_valid(role);
}

int qg_keyring_create(qg_keyring *k, const char *role, const char *subject,
                      int64_t now_ms, char *key_out, size_t cap,
                      qg_key_info *info)
{
    qg_key_rec rec;
    int rc;
    if (cap < QG_API_KEY_MAX)
        return QG_EINVAL;
    if ((rc = qg__key_generate(role, subject, now_ms, key_out, cap, &rec)) !=
        QG_OK)
        return rc;
    if ((rc = qg__ledger_put_key(k->ledger, &rec)) != QG_OK) {
        memset(key_out, 0, cap);
        return rc;
    }
    if (info)
        describe(&rec, info);
    return QG_OK;
}

typedef struct list_ctx {
    int (*fn)(const qg_key_info *, void *);
    void *ud;
} list_ctx;

static int list_one(const qg_key_rec *rec, void *ud)
{
    list_ctx *c = ud;
    qg_key_info info;
    describe(rec, &info);
    return c->fn(&info, c->ud);
}

int qg_keyring_list(qg_keyring *k,
                    int (*fn)(const qg_key_info *key, void *ud), void *ud)
{
    list_ctx c = {fn, ud};
    return qg__ledger_list_keys(k->ledger, list_one, &c);
}

int qg_keyring_revoke(qg_keyring *k, const char *id, int64_t now_ms,
                      qg_key_info *info)
{
    qg_key_rec rec;
    int rc = qg__ledger_revoke_key(k->ledger, id, now_ms);
    if (rc == QG_OK && info) {
        if ((rc = qg__ledger_get_key(k->ledger, id, &rec)) == QG_OK)
            describe(&rec, info);
    }
    return rc;
}
