/* keys.c - API key generation and verification (see keys.h).
 *
 * The id is random rather than derived from the secret so that it reveals
 * nothing; the hash covers the whole key, id included, so that a record
 * cannot be made to verify a key with another id.  Comparison of hashes
 * is constant time (CRYPTO_memcmp) so that response timing tells an
 * attacker nothing about how much of a guess was right. */
#include <pthread.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "quotagate.h"
#include "keys.h"

#define SECRET_BYTES 32

int qg__key_role_valid(const char *role)
{
    return role && (strcmp(role, "subject") == 0 ||
                    strcmp(role, "admin") == 0 ||
                    strcmp(role, "service") == 0);
}

/* SHA-256 fetched once: EVP_sha256() on every call makes OpenSSL 3 look
 * the algorithm up each time (about 4% of a /v1/check, measured). */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

void qg__key_hash(const char *key, size_t len,
                 unsigned char out[QG_KEY_HASH_LEN])
{
    unsigned int n = 0;
    pthread_once(&sha256_once, sha256_fetch);
    if (!EVP_Digest(key, len, out, &n,
                    sha256_md ? sha256_md : EVP_sha256(), NULL) ||
        n != QG_KEY_HASH_LEN)
        /* Cannot happen with the built-in SHA-256; never leave a hash
         * that could match by accident. */
        RAND_bytes(out, QG_KEY_HASH_LEN);
}

int qg__key_hash_equal(const unsigned char a[QG_KEY_HASH_LEN],
                      const unsigned char b[QG_KEY_HASH_LEN])
{
    return CRYPTO_memcmp(a, b, QG_KEY_HASH_LEN) == 0;
}

int qg__key_generate(const char *role, const char *subject, int64_t now_ms,
                    char *key_out, size_t cap, qg_key_rec *rec)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char idb[QG_KEY_ID_LEN / 2], secret[SECRET_BYTES];
    unsigned char b64[4 * ((SECRET_BYTES + 2) / 3) + 1];
    int rc = QG_OK, n, i;
    size_t len = 0;

    if (!key_out || cap <= QG_KEY_LEN || !rec || !qg__key_role_valid(role))
        return QG_EINVAL;
    if (strcmp(role, "subject") == 0
            ? !subject || !subject[0] || strlen(subject) >= sizeof rec->subject
            : subject && subject[0])
        return QG_EINVAL;
    if (RAND_bytes(idb, sizeof idb) != 1 ||
        RAND_bytes(secret, sizeof secret) != 1) {
        rc = QG_EIO;
        goto out;
    }
    n = EVP_EncodeBlock(b64, secret, sizeof secret);
    /* base64 -> base64url, unpadded */
    while (n > 0 && b64[n - 1] == '=')
        n--;
    if (n != QG_KEY_SECRET_LEN) {
        rc = QG_EIO;
        goto out;
    }
    for (i = 0; i < n; i++)
        b64[i] = b64[i] == '+' ? '-' : b64[i] == '/' ? '_' : b64[i];

    memcpy(key_out, QG_KEY_PREFIX, 4);
    len = 4;
    for (i = 0; i < (int)sizeof idb; i++) {
        key_out[len++] = hex[idb[i] >> 4];
        key_out[len++] = hex[idb[i] & 15];
    }
    key_out[len++] = '_';
    memcpy(key_out + len, b64, (size_t)n);
    len += (size_t)n;
    key_out[len] = '\0';

    memset(rec, 0, sizeof *rec);
    memcpy(rec->id, key_out + 4, QG_KEY_ID_LEN);
    rec->id[QG_KEY_ID_LEN] = '\0';
    strcpy(rec->role, role);
    if (subject)
        strcpy(rec->subject, subject);
    qg__key_hash(key_out, len, rec->hash);
    rec->created_ms = now_ms;
    rec->revoked_ms = 0;
out:
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(b64, sizeof b64);
    if (rc != QG_OK)
        OPENSSL_cleanse(key_out, cap);
    return rc;
}

static int is_b64url(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int qg__key_parse_id(const char *key, char *id_out, size_t cap)
{
    size_t i;
    if (id_out && cap)
        id_out[0] = '\0';
    if (!key || !id_out || cap <= QG_KEY_ID_LEN)
        return QG_EINVAL;
    if (strncmp(key, QG_KEY_PREFIX, 4) != 0 || strlen(key) != QG_KEY_LEN ||
        key[4 + QG_KEY_ID_LEN] != '_')
        return QG_EINVAL;
    for (i = 4; i < 4 + QG_KEY_ID_LEN; i++)
        if (!((key[i] >= '0' && key[i] <= '9') ||
              (key[i] >= 'a' && key[i] <= 'f')))
            return QG_EINVAL;
    for (i = 5 + QG_KEY_ID_LEN; i < QG_KEY_LEN; i++)
        if (!is_b64url(key[i]))
            return QG_EINVAL;
    memcpy(id_out, key + 4, QG_KEY_ID_LEN);
    id_out[QG_KEY_ID_LEN] = '\0';
    return QG_OK;
}

int qg__key_verify(const char *key, const qg_key_rec *rec)
{
    unsigned char h[QG_KEY_HASH_LEN];
    int ok;
    if (!key || !rec)
        return 0;
    qg__key_hash(key, strlen(key), h);
    ok = qg__key_hash_equal(h, rec->hash);
    return ok && rec->revoked_ms == 0;
}
