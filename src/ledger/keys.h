/* keys.h - API keys: generation, parsing and constant-time verification.
 *
 * A key is "qgk_<id>_<secret>": id is 12 lowercase hex characters (6
 * random bytes), public, shown by `keys list` and used to find the key's
 * record; secret is 32 random bytes in base64url without padding.  Only
 * the SHA-256 of the whole key is ever stored (qg_key_rec.hash); the key
 * itself is shown once, at creation, and never logged.
 *
 * The admin and service keys may instead come from the environment
 * (QUOTAGATE_ADMIN_KEY, QUOTAGATE_SERVICE_KEY) as arbitrary strings: the
 * server compares presented keys with them in constant time (auth.c).
 *
 * All functions are thread-safe (OpenSSL's RAND_bytes and EVP_Digest are).
 * Randomness comes from OpenSSL's CSPRNG; time is the caller's now_ms. */
#ifndef QG_KEYS_H
#define QG_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "ledger.h"

#define QG_KEY_PREFIX "qgk_"
#define QG_KEY_ID_LEN 12          /* hex characters */
#define QG_KEY_SECRET_LEN 43      /* base64url of 32 bytes, unpadded */
/* "qgk_" + id + "_" + secret, without the terminating NUL (60). */
#define QG_KEY_LEN (4 + QG_KEY_ID_LEN + 1 + QG_KEY_SECRET_LEN)
#define QG_KEY_HASH_LEN 32

/* Generate a new key for `role` ("subject", "admin" or "service") and
 * `subject` (required for role "subject", must be NULL or "" for the
 * others).  Writes the key, NUL-terminated, to key_out (cap must be more
 * than QG_KEY_LEN) and its record (id, role, subject, hash, created_ms =
 * now_ms, revoked_ms = 0) to rec.  Returns 0, QG_EINVAL (bad role,
 * subject or cap) or QG_EIO (the random generator or digest failed). */
int qg__key_generate(const char *role, const char *subject, int64_t now_ms,
                    char *key_out, size_t cap, qg_key_rec *rec);

/* Extract the id of a key of the shape "qgk_<12 hex>_<43 base64url>"
 * into id_out (cap > QG_KEY_ID_LEN).  Returns 0, or QG_EINVAL when the key
 * does not have that shape (id_out is then ""). */
int qg__key_parse_id(const char *key, char *id_out, size_t cap);

/* SHA-256 of len bytes of key into out. */
void qg__key_hash(const char *key, size_t len,
                 unsigned char out[QG_KEY_HASH_LEN]);

/* Constant-time comparison of two hashes: 1 equal, 0 different. */
int qg__key_hash_equal(const unsigned char a[QG_KEY_HASH_LEN],
                      const unsigned char b[QG_KEY_HASH_LEN]);

/* Whether the presented key matches rec (SHA-256 compared in constant
 * time) and rec is not revoked.  Returns 1 valid, 0 invalid. */
int qg__key_verify(const char *key, const qg_key_rec *rec);

/* Whether role is one of "subject", "admin", "service". */
int qg__key_role_valid(const char *role);

#endif
