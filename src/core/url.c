/* url.c - see url.h.  A hand-written split of the one URL shape the
 * proxy accepts; anything outside it (user info, query, fragment, an
 * empty host, a port out of range) is refused with a reason. */
#include "url.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static int fail(char *why, size_t cap, const char *msg)
{
    if (why && cap)
        snprintf(why, cap, "%s", msg);
    return -1;
}

static int host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
           c == '~';
}

int qg__url_parse(const char *s, size_t len, qg_url *out, char *why,
                 size_t whycap)
{
    size_t i, h0, h1, n;

    memset(out, 0, sizeof *out);
    if (len >= 8 && strncasecmp(s, "https://", 8) == 0) {
        out->tls = 1;
        i = 8;
    } else if (len >= 7 && strncasecmp(s, "http://", 7) == 0) {
        i = 7;
    } else {
        return fail(why, whycap, "the scheme must be http:// or https://");
    }
    /* HOST: [v6] or a name / IPv4 address */
    if (i < len && s[i] == '[') {
        h0 = ++i;
        while (i < len && (s[i] == ':' || s[i] == '.' ||
                           (s[i] >= '0' && s[i] <= '9') ||
                           (s[i] >= 'a' && s[i] <= 'f') ||
                           (s[i] >= 'A' && s[i] <= 'F')))
            i++;
        if (i >= len || s[i] != ']' || i == h0)
            return fail(why, whycap, "an IPv6 host is written [ADDRESS]");
        h1 = i++;
    } else {
        h0 = i;
        while (i < len && host_char(s[i]))
            i++;
        h1 = i;
        if (h1 == h0)
            return fail(why, whycap, "the host is missing");
    }
    if (h1 - h0 >= sizeof out->host)
        return fail(why, whycap, "the host is longer than 255 bytes");
    memcpy(out->host, s + h0, h1 - h0);
    out->host[h1 - h0] = '\0';
    /* :PORT */
    if (i < len && s[i] == ':') {
        long port = 0;
        size_t p0 = ++i;
        while (i < len && s[i] >= '0' && s[i] <= '9' && i - p0 < 6)
            port = port * 10 + (s[i++] - '0');
        if (i == p0 || port < 1 || port > 65535 ||
            (i < len && s[i] >= '0' && s[i] <= '9'))
            return fail(why, whycap, "the port must be a number 1..65535");
        out->port = (int)port;
        out->port_given = 1;
    } else {
        out->port = out->tls ? 443 : 80;
    }
    /* /PREFIX */
    if (i < len && s[i] != '/') {
        if (s[i] == '@')
            return fail(why, whycap, "user info (user@) is not allowed");
        return fail(why, whycap, "after the host, expected :PORT or /PREFIX");
    }
    n = 0;
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '?' || c == '#')
            return fail(why, whycap, "a query or fragment is not allowed");
        if (c <= ' ' || c >= 0x7f || c == '%')
            return fail(why, whycap, "the prefix holds a space, a control "
                                     "character, '%' or a non-ASCII byte");
        if (n + 1 >= sizeof out->prefix)
            return fail(why, whycap, "the prefix is longer than 511 bytes");
        out->prefix[n++] = (char)c;
    }
    while (n > 0 && out->prefix[n - 1] == '/')
        n--;
    out->prefix[n] = '\0';
    return 0;
}
