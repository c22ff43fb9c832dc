/* routes.h - the route groups of `quotagate serve`: what the metrics count
 * requests by (quotagate_http_requests_total{route}).  One list, from
 * which the enum and the label names derive; routes.c's route table maps
 * every path to its group, and the metrics route of a path is found in
 * that same table, so a new route cannot be left out of either. */
#ifndef QG_ROUTES_H
#define QG_ROUTES_H

#define QG_ROUTE_GROUPS(X)                                                 \
    X(CHECK, "check")                                                       \
    X(SETTLE, "settle")                                                     \
    X(USAGE, "usage")                                                       \
    X(PLANS, "plans")                                                       \
    X(WEIGHTS, "weights")                                                   \
    X(AUTHZ, "authz")                                                       \
    X(CHAT, "chat_completions")                                             \
    X(MESSAGES, "messages")                                                 \
    X(ADMIN, "admin")                                                       \
    X(METRICS, "metrics")                                                   \
    X(HEALTHZ, "healthz")                                                   \
    X(CONSOLE, "console")                                                   \
    X(OTHER, "other")              /* paths no route serves */

#define QG__ROUTE_ENUM(id, label) QG_ROUTE_##id,
typedef enum qg__route {
    QG_ROUTE_GROUPS(QG__ROUTE_ENUM)
    QG_ROUTE_COUNT
} qg__route;
#undef QG__ROUTE_ENUM

/* The label of a group ("check"), "other" out of range. */
const char *qg__route_label(int group);

/* The group of a path (the route table's, whatever the method). */
int qg__server_route(const char *path);

#endif
