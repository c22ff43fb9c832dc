/* url.h - the shape of an upstream URL, "http[s]://HOST[:PORT][/PREFIX]",
 * split into its parts without any I/O (no name resolution).
 *
 * One parser for both places that read such URLs: the rules compiler
 * (a model's `upstream:` key, checked at load so a typo is a rules error
 * with its line and column) and the proxy's upstream client (--upstream
 * and the models' URLs, at first use). */
#ifndef QG_URL_H
#define QG_URL_H

#include <stddef.h>

#define QG_URL_HOST_MAX 256    /* bytes of HOST, with its NUL */
#define QG_URL_PREFIX_MAX 512  /* bytes of PREFIX, with its NUL */

typedef struct qg_url {
    int tls;                       /* https */
    char host[QG_URL_HOST_MAX];    /* without brackets for IPv6 */
    int port;                      /* given, else 80 / 443 */
    int port_given;
    char prefix[QG_URL_PREFIX_MAX]; /* "" or "/a/b": no trailing slash */
} qg_url;

/* Parse s[0..len) ("http" or "https", any case; HOST a name of letters,
 * digits, '-', '.', '_', '~', or an IPv4 address, or [IPv6]; PORT 1..65535;
 * PREFIX a path of printable characters without '?', '#', '%' or spaces).
 * Returns 0 and fills *out, or -1 writing what is wrong into why (a
 * phrase, no URL quoted). */
int qg__url_parse(const char *s, size_t len, qg_url *out, char *why,
                 size_t whycap);

#endif
