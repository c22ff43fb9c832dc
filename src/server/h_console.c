/* h_console.c - GET /console and GET /console/NAME: the usage console
 * (PRODUCT.md section 7), a single-page app served from the binary.
 *
 * The files come from the table that scripts/embed_assets.sh generated at
 * build time (console_assets.h); nothing is read from disk and nothing
 * points outside this server, so the console works offline.  Every answer
 * carries a Content-Security-Policy that allows only this origin's own
 * scripts, styles and API (no inline script, no eval), and an ETag;
 * index.html is revalidated on every load (no-cache) while every other
 * file is named with its content's hash by console/build.mjs and may be
 * cached for good (immutable).  A matching If-None-Match is answered 304
 * without a body.
 *
 * GET /v1/whoami is the one call the console adds for itself: which kind
 * of key signed in (a subject's, or the admin's), so that the page can
 * show a subject's usage or the admin's choice of subject and org
 * without trying a call that the key may not make. */
#include <string.h>
#include "console_assets.h"
#include "json_text.h"
#include "metrics.h"
#include "server.h"

#define CONSOLE_INDEX "index.html"

/* The Content-Type of a file, by its name's ending. */
static const struct {
    const char *suffix;
    const char *type;
} content_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
};

/* The console's policy: its own origin only; styles set from script
 * through the CSSOM (element.style, as the chart library does) are not
 * inline styles and need no 'unsafe-inline'. */
static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'";

static const char *content_type_of(const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof content_types / sizeof content_types[0];
         i++) {
        size_t k = strlen(content_types[i].suffix);
        if (n > k && strcmp(name + n - k, content_types[i].suffix) == 0)
            return content_types[i].type;
    }
    return "application/octet-stream";
}

static const qg_console_asset *asset_named(const char *name)
{
    for (int i = 0; i < qg__console_nassets; i++)
        if (strcmp(qg__console_assets[i].name, name) == 0)
            return &qg__console_assets[i];
    return NULL;
}

/* 1 when the request's If-None-Match lists this ETag (or is "*"). */
static int not_modified(const qg_http_req *r, const char *etag)
{
    size_t n;
    const char *v = qg__http_header_get(r, "if-none-match", &n);
    if (!v)
        return 0;
    if (n == 1 && v[0] == '*')
        return 1;
    return memmem(v, n, etag, strlen(etag)) != NULL;
}

void qg__h_console(qg_server *s, qg_http_req *r, const char *caller)
{
    const char *name = CONSOLE_INDEX;
    const qg_console_asset *a;
    int index;

    (void)caller;
    if (strncmp(r->path, "/console/", 9) == 0 && r->path[9] != '\0')
        name = r->path + 9;
    if (!(a = asset_named(name))) {
        qg__reply_error(s, r, 404, "not_found", "no such console file");
        return;
    }
    index = strcmp(a->name, CONSOLE_INDEX) == 0;
    qg_http_out_header h[] = {
        {"Cache-Control", index ? "no-cache"
                                : "public, max-age=31536000, immutable"},
        {"ETag", a->etag},
        {"Content-Security-Policy", csp},
        {"X-Content-Type-Options", "nosniff"},
        {"Referrer-Policy", "no-referrer"},
    };
    int nh = (int)(sizeof h / sizeof h[0]);
    if (not_modified(r, a->etag)) {
        qg__metrics_http(s->metrics, r->tag, 304);
        qg__http_respond(r, 304, h, nh, content_type_of(a->name), NULL, 0);
        return;
    }
    qg__metrics_http(s->metrics, r->tag, 200);
    qg__http_respond(r, 200, h, nh, content_type_of(a->name),
                     (const char *)a->data, a->len);
}

/* {"role": "subject", "subject": NAME} or {"role": "admin"}: the route
 * admits only those two roles, and only a subject key has a subject. */
void qg__h_whoami(qg_server *s, qg_http_req *r, const char *caller)
{
    qg__jb b;
    if (qg__jb_init(&b, 64 + (caller ? strlen(caller) * 6 : 0)) < 0) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    if (caller) {
        QG__JB_LIT(&b, "{\"role\":\"subject\",\"subject\":");
        qg__jb_str(&b, caller);
        QG__JB_LIT(&b, "}");
    } else {
        QG__JB_LIT(&b, "{\"role\":\"admin\"}");
    }
    qg__reply_json(s, r, 200, qg__jb_finish(&b), NULL, 0);
}
