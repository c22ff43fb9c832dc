/* query.c - query strings of GET requests (query.h): split on '&', each
 * part "key=value" (a part without '=' is a key with an empty value),
 * percent-decoding both, bounded sizes, strict keys. */
#include <stdio.h>
#include <string.h>
#include "query.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode [p, end) into dst (cap bytes with its NUL).  0, or -1 when it
 * does not fit, a '%' is not followed by two hex digits, or it decodes
 * to a NUL. */
static int decode(const char *p, const char *end, char *dst, size_t cap)
{
    size_t n = 0;
    while (p < end) {
        int c = (unsigned char)*p++;
        if (c == '+') {
            c = ' ';
        } else if (c == '%') {
            int hi, lo;
            if (end - p < 2 || (hi = hexval(p[0])) < 0 ||
                (lo = hexval(p[1])) < 0)
                return -1;
            c = hi << 4 | lo;
            p += 2;
            if (c == 0)
                return -1;
        }
        if (n + 1 >= cap)
            return -1;
        dst[n++] = (char)c;
    }
    dst[n] = '\0';
    return 0;
}

int qg__query_parse(const char *q, const char *const *allowed, int n,
                    qg_query *out, char *msg, size_t msgcap)
{
    const char *p = q ? q : "";
    out->n = 0;
    while (*p) {
        const char *amp = strchr(p, '&'), *end = amp ? amp : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        char key[32];
        int known = 0;
        if (end == p) {             /* "a=1&&b=2": an empty part */
            p = end + 1;
            continue;
        }
        if (decode(p, eq ? eq : end, key, sizeof key) < 0) {
            snprintf(msg, msgcap, "a query parameter's name is too long or "
                     "badly percent-encoded");
            return -1;
        }
        for (int i = 0; i < n; i++)
            known |= strcmp(key, allowed[i]) == 0;
        if (!known) {
            size_t len = 0;
            char list[160] = "";
            for (int i = 0; i < n; i++)
                len += (size_t)snprintf(list + len, sizeof list - len,
                                        "%s%s", i ? ", " : "", allowed[i]);
            snprintf(msg, msgcap, "unknown query parameter \"%s\" (this "
                     "endpoint takes: %s)", key, list);
            return -1;
        }
        if (qg__query_get(out, key)) {
            snprintf(msg, msgcap, "query parameter \"%s\" is given twice",
                     key);
            return -1;
        }
        if (out->n >= QG_QUERY_MAX_PARAMS) {
            snprintf(msg, msgcap, "too many query parameters");
            return -1;
        }
        if (decode(eq ? eq + 1 : end, end, out->value[out->n],
                   sizeof out->value[0]) < 0) {
            snprintf(msg, msgcap, "query parameter \"%s\": the value is too "
                     "long or badly percent-encoded", key);
            return -1;
        }
        strcpy(out->key[out->n], key);
        out->n++;
        p = amp ? amp + 1 : end;
    }
    return 0;
}

const char *qg__query_get(const qg_query *q, const char *key)
{
    for (int i = 0; i < q->n; i++)
        if (strcmp(q->key[i], key) == 0)
            return q->value[i];
    return NULL;
}
