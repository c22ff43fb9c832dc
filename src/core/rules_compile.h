/* rules_compile.h - what the two files of the rules compiler share:
 * rules_yaml.c (the top-level schema: weights, plans, claims, orgs,
 * subjects, analysis, qg__rules_parse) and rules_windows.c (windows,
 * calendar periods, overage policies, model masks).  Both read the
 * document through yaml_doc.h.  Not part of the public API. */
#ifndef QG_RULES_COMPILE_H
#define QG_RULES_COMPILE_H

#include <stdint.h>

#include "rules.h"
#include "yaml_doc.h"

/* One compilation.  `y` comes first so &c->y is the document reader. */
typedef struct qg__rctx {
    qg__ydoc y;
    qg_rules *r;             /* being built; owned by qg__rules_parse */
    const qg_rules *prev;    /* the version before it in the file, NULL
                                for the first document */
    qg_tz_resolver tzr;
    void *tzud;
    char **zone_names;       /* names as written, parallel to r->zones */
    int nzone_names;
} qg__rctx;

/* rules_yaml.c: a model name defined under weights.models -> its index. */
int qg__rc_model_ref(qg__rctx *c, yaml_node_t *n, const char *path, int *out);

/* rules_notify.c: the notifications block. */
int qg__rc_notify(qg__rctx *c, yaml_node_t *n, const char *path);

/* rules_windows.c */

/* {usd_month: decimal} -> micro-dollars (plan price, spending cap). */
int qg__rc_usd_month(qg__rctx *c, yaml_node_t *n, const char *path,
                     int64_t *out);
/* An overage mapping into *o (policy and its own keys). */
int qg__rc_overage(qg__rctx *c, yaml_node_t *n, const char *path,
                   qg_overage *o);
/* The windows list n (NULL when absent) of a plan or org mapping `owner`,
 * plus a concurrency window when concurrency > 0.  On success *out (owned
 * by the rules, NULL when there are none) holds *nout windows. */
int qg__rc_windows(qg__rctx *c, yaml_node_t *owner, yaml_node_t *n,
                   const char *path, int64_t concurrency,
                   int64_t lease_ttl_ms, qg_window_spec **out, int *nout);

#endif
