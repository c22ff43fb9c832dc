/* rules_notify.c - the rules' `notifications:` block (PRODUCT.md 7):
 *
 *   notifications:
 *     thresholds: [0.8, 0.95, 1.0]    # fractions of a window's limit
 *     forecast: true                  # quota.forecast too (default false)
 *     webhooks:
 *       - url: https://hooks.example.com/quota
 *         secret_env: QUOTAGATE_WEBHOOK_SECRET
 *
 * Thresholds are decimals in (0, 1] with at most three places, kept in
 * milli (0.8 -> 800), strictly ascending (so also unique); at least one
 * threshold or forecast: true, and at least one webhook.  A URL has the
 * shape of url.h (http or https, no query); secret_env is the name of an
 * environment variable, never the secret: the gateway reads and decodes
 * it at start and on reload (src/server/notify.c), so the rules file can
 * be shared and committed.  No I/O here. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixed.h"
#include "rules_compile.h"
#include "url.h"

static const qg__ykey notify_keys[] = {
    { "thresholds", QG_Y_ALL }, { "forecast", QG_Y_ALL },
    { "webhooks", QG_Y_ALL },
};

static const qg__ykey webhook_keys[] = {
    { "url", QG_Y_ALL }, { "secret_env", QG_Y_ALL },
};

void qg__rules_notify_free(qg_notify_spec *n)
{
    for (int i = 0; n->webhooks && i < n->nwebhooks; i++) {
        free(n->webhooks[i].url);
        free(n->webhooks[i].secret_env);
    }
    free(n->webhooks);
    n->webhooks = NULL;
    n->nwebhooks = 0;
}

static int is_env_name(const char *s)
{
    if (!*s || !(isalpha((unsigned char)*s) || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_'))
            return 0;
    return 1;
}

static int c_thresholds(qg__rctx *c, yaml_node_t *n, const char *path)
{
    qg_notify_spec *ns = &c->r->notify;
    char sub[QG_Y_PATHCAP], g[80], a[32], b[32];
    yaml_node_item_t *it;

    if (n->type != YAML_SEQUENCE_NODE)
        return qg__y_fail(&c->y, n, path, "expected a list of fractions of "
                          "a window's limit, e.g. [0.8, 0.95, 1.0], got %s",
                          qg__y_got(n, g, sizeof g));
    if (n->data.sequence.items.top - n->data.sequence.items.start >
        QG_NOTIFY_MAX_THRESHOLDS)
        return qg__y_fail(&c->y, n, path, "at most %d thresholds",
                          QG_NOTIFY_MAX_THRESHOLDS);
    for (it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *v = qg__y_node(&c->y, *it);
        int64_t t;
        qg__y_path_idx(sub, path, it - n->data.sequence.items.start);
        if (qg__y_decimal(&c->y, v, sub, 3, QG_Y_POSITIVE, &t) < 0)
            return -1;
        if (t > QG_MILLI)
            return qg__y_fail(&c->y, v, sub, "expected a fraction of the "
                              "limit in (0, 1], got %s",
                              qg__y_got(v, g, sizeof g));
        if (ns->nthresholds > 0 &&
            t <= ns->thresholds_milli[ns->nthresholds - 1]) {
            qg_fixed_format(ns->thresholds_milli[ns->nthresholds - 1], 3, a,
                            sizeof a);
            qg_fixed_format(t, 3, b, sizeof b);
            return qg__y_fail(&c->y, v, sub, "thresholds must be ascending "
                              "and unique: %s comes after %s", b, a);
        }
        ns->thresholds_milli[ns->nthresholds++] = t;
    }
    return 0;
}

static int c_webhook(qg__rctx *c, yaml_node_t *m, const char *path,
                     qg_webhook_spec *w)
{
    char sub[QG_Y_PATHCAP], why[128];
    yaml_node_t *v;
    qg_url u;

    w->line = (int)m->start_mark.line + 1;
    if (qg__y_check_map(&c->y, m, path, webhook_keys,
                        QG_Y_NKEYS(webhook_keys), QG_Y_ALL, "") < 0 ||
        qg__y_need_key(&c->y, m, path, "url", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "url");
    if (qg__y_string(&c->y, v, sub, &w->url) < 0)
        return -1;
    if (strlen(w->url) >= QG_NOTIFY_URL_MAX)
        return qg__y_fail(&c->y, v, sub, "a URL of at most %d bytes",
                          QG_NOTIFY_URL_MAX - 1);
    if (qg__url_parse(w->url, strlen(w->url), &u, why, sizeof why) < 0)
        return qg__y_fail(&c->y, v, sub, "expected "
                          "http[s]://HOST[:PORT][/PATH]: %s", why);
    if (qg__y_need_key(&c->y, m, path, "secret_env", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "secret_env");
    if (qg__y_string(&c->y, v, sub, &w->secret_env) < 0)
        return -1;
    if (strlen(w->secret_env) >= QG_NOTIFY_ENV_MAX ||
        !is_env_name(w->secret_env))
        return qg__y_fail(&c->y, v, sub, "expected the name of an "
                          "environment variable (letters, digits and _, "
                          "not starting with a digit) that holds the "
                          "secret, not the secret itself");
    return 0;
}

static int c_webhooks(qg__rctx *c, yaml_node_t *n, const char *path)
{
    qg_notify_spec *ns = &c->r->notify;
    char sub[QG_Y_PATHCAP], g[80];
    long cnt;

    if (n->type != YAML_SEQUENCE_NODE ||
        (cnt = n->data.sequence.items.top - n->data.sequence.items.start) ==
            0)
        return qg__y_fail(&c->y, n, path, "expected a non-empty list of "
                          "{url, secret_env}, got %s",
                          qg__y_got(n, g, sizeof g));
    if (cnt > QG_NOTIFY_MAX_WEBHOOKS)
        return qg__y_fail(&c->y, n, path, "at most %d webhooks",
                          QG_NOTIFY_MAX_WEBHOOKS);
    if (!(ns->webhooks = calloc((size_t)cnt, sizeof *ns->webhooks)))
        return qg__y_oom(&c->y, n);
    for (long i = 0; i < cnt; i++) {
        yaml_node_t *m = qg__y_node(&c->y, n->data.sequence.items.start[i]);
        qg__y_path_idx(sub, path, i);
        ns->nwebhooks = (int)i + 1;       /* freed with the rules */
        if (c_webhook(c, m, sub, &ns->webhooks[i]) < 0)
            return -1;
        for (long j = 0; j < i; j++)
            if (strcmp(ns->webhooks[j].url, ns->webhooks[i].url) == 0)
                return qg__y_fail(&c->y, m, sub, "the URL %s is listed "
                                  "twice (each event goes to every "
                                  "webhook once)", ns->webhooks[i].url);
    }
    return 0;
}

int qg__rc_notify(qg__rctx *c, yaml_node_t *n, const char *path)
{
    qg_notify_spec *ns = &c->r->notify;
    char sub[QG_Y_PATHCAP];
    yaml_node_t *v;

    if (qg__y_check_map(&c->y, n, path, notify_keys, QG_Y_NKEYS(notify_keys),
                        QG_Y_ALL, "") < 0)
        return -1;
    if ((v = qg__y_get(&c->y, n, "thresholds"))) {
        qg__y_path_key(sub, path, "thresholds");
        if (c_thresholds(c, v, sub) < 0)
            return -1;
    }
    if ((v = qg__y_get(&c->y, n, "forecast"))) {
        qg__y_path_key(sub, path, "forecast");
        if (qg__y_bool(&c->y, v, sub, &ns->forecast) < 0)
            return -1;
    }
    if (qg__y_need_key(&c->y, n, path, "webhooks", &v) < 0)
        return -1;
    qg__y_path_key(sub, path, "webhooks");
    if (c_webhooks(c, v, sub) < 0)
        return -1;
    if (ns->nthresholds == 0 && !ns->forecast)
        return qg__y_fail(&c->y, n, path, "nothing to notify: give "
                          "thresholds (e.g. [0.8, 1.0]) or forecast: true");
    return 0;
}
