/* yaml_doc.h - reading a YAML document with positions: the internal
 * toolkit under the rules compiler (rules_yaml.c, rules_windows.c).
 *
 * Nothing here knows quotagate's schema.  It loads the documents of a
 * stream (refusing anchors, aliases and more than QG_Y_MAXDOCS documents, and keeping libyaml's own wording
 * for syntax errors), walks nodes, checks a mapping's keys against a table,
 * reads typed scalars, and writes every error as "path: what was expected"
 * at the 1-based line and column of the node at fault.  Not part of the
 * public API: only the rules compiler includes it.
 *
 * Conventions: functions returning int give 0 on success and -1 after
 * writing the diagnostic (qg__y_check_names returns a count instead); an
 * allocation failure also sets y->oom.  Paths are built in caller buffers
 * of QG_Y_PATHCAP bytes. */
#ifndef QG_YAML_DOC_H
#define QG_YAML_DOC_H

#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "rules.h"

#define QG_Y_PATHCAP 256     /* dotted paths: "plans.pro.windows[0].limit" */
#define QG_Y_LISTCAP 320     /* "expected one of: ..." lists */

/* The document being read and where its errors go. */
typedef struct qg__ydoc {
    yaml_document_t *doc;
    qg_diag *diag;
    int oom;                 /* set when the failure was out of memory */
} qg__ydoc;

/* A key a mapping accepts; `mask` says for which variants (window types,
 * overage policies) it is meaningful.  QG_Y_ALL = every variant. */
typedef struct qg__ykey {
    const char *name;
    unsigned mask;
} qg__ykey;

#define QG_Y_ALL 0xffffffffu
#define QG_Y_BIT(x) (1u << (x))
#define QG_Y_NKEYS(t) (sizeof(t) / sizeof((t)[0]))

/* A scalar spelling and the value it stands for. */
typedef struct qg__yenum {
    const char *name;
    int value;
} qg__yenum;

/* Sign constraint of qg__y_decimal and qg__y_duration. */
enum { QG_Y_NONNEG, QG_Y_POSITIVE };

/* --- loading */

#define QG_Y_MAXDOCS 64     /* documents (rules versions) in one stream */
#define QG_Y_STR_(x) #x
#define QG_Y_STR(x) QG_Y_STR_(x)

/* Syntax pass (events only: at most QG_Y_MAXDOCS documents, no anchors or
 * aliases), then load text into docs[0..*ndocs) (docs holds QG_Y_MAXDOCS;
 * an empty stream gives *ndocs = 0).  Returns QG_OK (caller deletes each
 * document), QG_ERULES with d's line, column and message set, or
 * QG_ENOMEM (nothing to delete on failure). */
int qg__y_load(const char *text, size_t len, yaml_document_t *docs,
               int *ndocs, qg_diag *d);

/* --- diagnostics */

/* Record an error at node n (line 1 column 1 when NULL) under `path`
 * ("" for none) and return -1. */
int qg__y_fail(qg__ydoc *y, const yaml_node_t *n, const char *path,
               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* "out of memory" at n; sets y->oom; returns -1. */
int qg__y_oom(qg__ydoc *y, const yaml_node_t *n);
/* out = base + "." + key (just key when base is ""), or base + "[i]";
 * out holds QG_Y_PATHCAP bytes and is truncated to fit. */
void qg__y_path_key(char *out, const char *base, const char *key);
void qg__y_path_idx(char *out, const char *base, long i);
/* "a, b, c" from the char * name at `offset` in n structs of `stride`
 * bytes starting at base. */
void qg__y_join_names(char *buf, size_t cap, const void *base, size_t stride,
                      size_t offset, int n);

/* --- nodes */

yaml_node_t *qg__y_node(qg__ydoc *y, int idx);
/* A scalar's text (NUL-terminated by libyaml). */
const char *qg__y_str(const yaml_node_t *n);
/* A plain empty scalar: "key:" with nothing after it. */
int qg__y_is_null(const yaml_node_t *n);
/* What a node is, for "got ..." in messages; may use buf. */
const char *qg__y_got(const yaml_node_t *n, char *buf, size_t cap);
/* n is a non-empty scalar without NULs, else "expected <what>, got ...". */
int qg__y_need_scalar(qg__ydoc *y, const yaml_node_t *n, const char *path,
                      const char *what);
/* Value of `key` in mapping m, or NULL. */
yaml_node_t *qg__y_get(qg__ydoc *y, yaml_node_t *m, const char *key);
/* Like qg__y_get, but a missing key is an error at m. */
int qg__y_need_key(qg__ydoc *y, yaml_node_t *m, const char *path,
                   const char *key, yaml_node_t **out);

/* --- mappings */

/* n is a mapping whose keys are scalars from `keys`, each at most once,
 * and meaningful for variant `sel` (named by `variant` in the message,
 * e.g. "calendar windows"). */
int qg__y_check_map(qg__ydoc *y, yaml_node_t *n, const char *path,
                    const qg__ykey *keys, size_t nkeys, unsigned sel,
                    const char *variant);
/* n is a mapping from unique names shorter than QG_NAME_MAX, at most max
 * of them (and at least one if nonempty).  Returns the count, or -1. */
int qg__y_check_names(qg__ydoc *y, yaml_node_t *n, const char *path,
                      int nonempty, int max);

/* --- scalars */

/* A string (replacing and freeing *out), or a name that also fits
 * QG_NAME_MAX. */
int qg__y_string(qg__ydoc *y, yaml_node_t *n, const char *path, char **out);
int qg__y_name(qg__ydoc *y, yaml_node_t *n, const char *path, char **out);
/* Decimal with at most `scale` fractional digits, scaled by 10^scale. */
int qg__y_decimal(qg__ydoc *y, yaml_node_t *n, const char *path, int scale,
                  int sign, int64_t *out);
/* The same, at most max (scaled): a number beyond it is "out of range",
 * naming the bound (the bounds of quotagate.h). */
int qg__y_decimal_max(qg__ydoc *y, yaml_node_t *n, const char *path,
                      int scale, int sign, int64_t max, int64_t *out);
/* Integer in [min, max]. */
int qg__y_int(qg__ydoc *y, yaml_node_t *n, const char *path, int64_t min,
              int64_t max, int64_t *out);
/* Duration ("90s", "1h30m") in ms, at most QG_DURATION_MAX_MS. */
int qg__y_duration(qg__ydoc *y, yaml_node_t *n, const char *path, int sign,
                   int64_t *out);
/* ISO 8601 date or instant, in ms since the epoch. */
int qg__y_date(qg__ydoc *y, yaml_node_t *n, const char *path, int64_t *out);
/* One of the spellings in table e; `what` names the kind in messages. */
int qg__y_enum(qg__ydoc *y, yaml_node_t *n, const char *path,
               const char *what, const qg__yenum *e, size_t ne, int *out);
/* true/false/yes/no as 1 or 0. */
int qg__y_bool(qg__ydoc *y, yaml_node_t *n, const char *path, int *out);

#endif
