/* auth.h - who is calling: API keys to roles and subjects.
 *
 * Three roles: the service key (POST /v1/check, /v1/settle), the admin key
 * (admin endpoints, anyone's usage) and subject keys (their own usage, the
 * proxy).  Admin and service keys come from QUOTAGATE_ADMIN_KEY and
 * QUOTAGATE_SERVICE_KEY, or are generated on first start, printed once
 * and kept only as hashes in the ledger database.  Every comparison runs
 * in constant time: an environment key byte for byte, zero padded to 64
 * bytes so that its length is hidden too (a longer one by SHA-256 hash),
 * a stored key by its SHA-256 hash.  Subject keys are looked up by their
 * public id in a small cache in front of the ledger (entries live 500 ms,
 * so a `keys revoke` from the command line takes effect within a
 * second). */
#ifndef QG_AUTH_H
#define QG_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "ledger.h"

typedef struct qg_auth qg_auth;

enum { QG_ROLE_NONE = 0, QG_ROLE_SUBJECT = 1, QG_ROLE_SERVICE = 2,
       QG_ROLE_ADMIN = 4 };

/* env_admin / env_service may be NULL (then stored or generated keys). */
qg_auth *qg__auth_new(qg_ledger *l, const char *env_admin,
                     const char *env_service);
void qg__auth_free(qg_auth *a);

/* Generate and store admin and service keys that have neither an
 * environment value nor a stored key, printing each once to out. */
int qg__auth_bootstrap(qg_auth *a, int64_t now_ms, FILE *out);

/* The role of a presented key (QG_ROLE_NONE when unknown or revoked);
 * subject keys copy their subject into subject (cap bytes). */
int qg__auth_identify(qg_auth *a, const char *key, size_t len, int64_t now_ms,
                     char *subject, size_t cap);

#endif
