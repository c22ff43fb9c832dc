/* auth.h - who is calling: API keys to roles and subjects.
 *
 * Three roles: the service key (POST /v1/check, /v1/settle), the admin key
 * (admin endpoints, anyone's usage) and subject keys (their own usage, the
 * proxy).  Admin and service keys come from QUOTAGATE_ADMIN_KEY and
 * QUOTAGATE_SERVICE_KEY, or are generated on first start, printed once
 * and kept only as hashes in the ledger database.  Every comparison is of
 * SHA-256 hashes in constant time.  Subject keys are looked up by their
 * public id in a small cache in front of the ledger (entries live 2 s, so
 * a `keys revoke` from the command line takes effect within 2 s). */
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
