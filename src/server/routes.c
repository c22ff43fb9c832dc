/* routes.c - the route table of `quotagate serve` and its one dispatcher.
 *
 * Routes are data: method, path (exact, or a prefix for /v1/usage/{subject}),
 * the roles allowed, and the handler.  The dispatcher authenticates the
 * caller (Authorization: Bearer KEY, or x-api-key: KEY), checks the role,
 * and calls the handler, which must respond exactly once. */
#include <string.h>
#include "auth.h"
#include "metrics.h"
#include "routes.h"
#include "server.h"

typedef void (*handler_fn)(qg_server *, qg_http_req *, const char *);

typedef struct route {
    int method;
    const char *path;
    int prefix;                   /* path ends with '/': match a prefix */
    int roles;                    /* 0 = anyone */
    handler_fn fn;
    int group;                    /* routes.h: what the metrics count */
} route;

#define ANY 0
#define QG_ANY_METHOD 0          /* a route for every method */
#define SERVICE QG_ROLE_SERVICE
#define ADMIN QG_ROLE_ADMIN
#define SUBJECT QG_ROLE_SUBJECT

static const route routes[] = {
    {QG_HTTP_POST, "/v1/check", 0, SERVICE | ADMIN, qg__h_check,
     QG_ROUTE_CHECK},
    {QG_HTTP_POST, "/v1/settle", 0, SERVICE | ADMIN, qg__h_settle,
     QG_ROUTE_SETTLE},
    {QG_HTTP_GET, "/v1/usage", 0, SUBJECT, qg__h_usage, QG_ROUTE_USAGE},
    /* before the prefix below: the subject's own history (h_history.c;
     * the admin's is /v1/usage/{subject}/history, through qg__h_usage) */
    {QG_HTTP_GET, "/v1/usage/history", 0, ADMIN | SUBJECT, qg__h_history,
     QG_ROUTE_USAGE},
    {QG_HTTP_GET, "/v1/usage/requests", 0, ADMIN | SUBJECT, qg__h_requests,
     QG_ROUTE_USAGE},
    {QG_HTTP_GET, "/v1/usage/", 1, ADMIN | SUBJECT, qg__h_usage,
     QG_ROUTE_USAGE},
    {QG_HTTP_GET, "/v1/orgs/", 1, ADMIN, qg__h_org_usage, QG_ROUTE_USAGE},
    {QG_HTTP_GET, "/v1/whoami", 0, ADMIN | SUBJECT, qg__h_whoami,
     QG_ROUTE_CONSOLE},
    {QG_HTTP_GET, "/v1/plans", 0, ANY, qg__h_plans, QG_ROUTE_PLANS},
    {QG_HTTP_GET, "/v1/weights", 0, ANY, qg__h_weights, QG_ROUTE_WEIGHTS},
    /* any method: Envoy's ext_authz asks with the client's own method;
     * its own authentication (h_authz.c) */
    {QG_ANY_METHOD, "/v1/authz", 0, ANY, qg__h_authz, QG_ROUTE_AUTHZ},
    {QG_HTTP_POST, "/v1/chat/completions", 0, SUBJECT, qg__h_proxy_openai,
     QG_ROUTE_CHAT},
    {QG_HTTP_POST, "/v1/messages", 0, SUBJECT, qg__h_proxy_anthropic,
     QG_ROUTE_MESSAGES},
    {QG_HTTP_GET, "/healthz", 0, ANY, qg__h_healthz, QG_ROUTE_HEALTHZ},
    {QG_HTTP_GET, "/metrics", 0, ANY, qg__h_metrics, QG_ROUTE_METRICS},
    /* the usage console: the page asks for a key itself (h_console.c) */
    {QG_HTTP_GET, "/console", 0, ANY, qg__h_console, QG_ROUTE_CONSOLE},
    {QG_HTTP_GET, "/console/", 0, ANY, qg__h_console, QG_ROUTE_CONSOLE},
    {QG_HTTP_GET, "/console/", 1, ANY, qg__h_console, QG_ROUTE_CONSOLE},
    {QG_HTTP_POST, "/v1/admin/subjects", 0, ADMIN, qg__h_admin_subjects,
     QG_ROUTE_ADMIN},
    {QG_HTTP_POST, "/v1/admin/keys", 0, ADMIN, qg__h_admin_keys,
     QG_ROUTE_ADMIN},
    {QG_HTTP_POST, "/v1/admin/reload", 0, ADMIN, qg__h_admin_reload,
     QG_ROUTE_ADMIN},
    {QG_HTTP_POST, "/v1/admin/reconcile", 0, ADMIN, qg__h_admin_reconcile,
     QG_ROUTE_ADMIN},
    {QG_HTTP_GET, "/v1/admin/requests/", 1, ADMIN, qg__h_admin_request,
     QG_ROUTE_ADMIN},
};

static int path_matches(const route *rt, const char *path)
{
    size_t n = strlen(rt->path);
    if (!rt->prefix)
        return strcmp(rt->path, path) == 0;
    return strncmp(rt->path, path, n) == 0 && path[n] != '\0';
}

/* The presented key: "Authorization: Bearer KEY" or "x-api-key: KEY". */
static const char *presented_key(const qg_http_req *r, size_t *len)
{
    size_t n;
    const char *v = qg__http_header_get(r, "authorization", &n);
    if (v && n > 7 && strncasecmp(v, "Bearer ", 7) == 0) {
        v += 7;
        n -= 7;
        while (n && *v == ' ') {
            v++;
            n--;
        }
        *len = n;
        return v;
    }
    v = qg__http_header_get(r, "x-api-key", &n);
    *len = v ? n : 0;
    return v;
}

void qg__server_handle(qg_http_req *r, void *ud)
{
    qg_server *s = ud;
    const route *found = NULL;
    int path_known = 0, role = QG_ROLE_NONE;
    char subject[256] = "";

    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (!path_matches(&routes[i], r->path))
            continue;
        path_known = 1;
        if (routes[i].method == QG_ANY_METHOD ||
            routes[i].method == r->method ||
            (r->method == QG_HTTP_HEAD && routes[i].method == QG_HTTP_GET)) {
            found = &routes[i];
            break;
        }
    }
    r->tag = found ? found->group : qg__server_route(r->path);
    if (!found) {
        if (path_known)
            qg__reply_error(s, r, 405, "method_not_allowed",
                           "this method is not allowed on this path");
        else
            qg__reply_error(s, r, 404, "not_found", "no such endpoint");
        return;
    }
    if (found->roles) {
        size_t klen = 0;
        const char *key = presented_key(r, &klen);
        if (!key || klen == 0) {
            qg__reply_error(s, r, 401, "unauthorized",
                           "an API key is required: Authorization: Bearer "
                           "KEY or x-api-key: KEY");
            return;
        }
        role = qg__auth_identify(s->auth, key, klen, qg__server_now(s),
                                subject, sizeof subject);
        if (role == QG_ROLE_NONE) {
            qg__reply_error(s, r, 401, "unauthorized",
                           "the API key is not valid (unknown or revoked)");
            return;
        }
        if (!(role & found->roles)) {
            qg__reply_error(s, r, 403, "forbidden",
                           "this key may not use this endpoint");
            return;
        }
    }
    found->fn(s, r, role == QG_ROLE_SUBJECT ? subject : NULL);
}

int qg__server_route(const char *path)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (path_matches(&routes[i], path))
            return routes[i].group;
    return QG_ROUTE_OTHER;
}

const char *qg__route_label(int group)
{
#define QG__ROUTE_LABEL(id, label) label,
    static const char *const labels[QG_ROUTE_COUNT] = {
        QG_ROUTE_GROUPS(QG__ROUTE_LABEL)};
#undef QG__ROUTE_LABEL
    return group >= 0 && group < QG_ROUTE_COUNT ? labels[group]
                                                : labels[QG_ROUTE_OTHER];
}
