/* console_assets.h - the usage console's files, embedded at build time.
 *
 * console/build.mjs bundles console/src into build/console (index.html,
 * and every other file named with its content's hash), and
 * scripts/embed_assets.sh turns that folder into build/gen/console_assets.c,
 * which defines the table below.  h_console.c serves it. */
#ifndef QG_CONSOLE_ASSETS_H
#define QG_CONSOLE_ASSETS_H

#include <stddef.h>

typedef struct qg_console_asset {
    const char *name;           /* file name: "index.html", "app-HASH.js" */
    const unsigned char *data;  /* its bytes (NUL-terminated, not counted) */
    size_t len;
    const char *etag;           /* "\"<16 hex digits of its SHA-256>\"" */
} qg_console_asset;

extern const qg_console_asset qg__console_assets[];
extern const int qg__console_nassets;

#endif
