/* reply.c - what every handler answers with, and the server's clock:
 * JSON bodies and typed errors, counted in the metrics under the route
 * group the dispatcher noted on the request (routes.c sets r->tag), and
 * now as a monotonic-anchored wall time. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "json_out.h"
#include "metrics.h"
#include "server.h"

int64_t qg__clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t qg__server_now(const qg_server *s)
{
    return s->wall0_ms + (qg__clock_ms(CLOCK_MONOTONIC) - s->mono0_ms);
}

/* ------------------------------------------------------------- replies */

void qg__reply_json(qg_server *s, qg_http_req *r, int status, char *json,
                   const qg_http_out_header *h, int nh)
{
    if (!json) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    qg__metrics_http(s->metrics, r->tag, status);
    qg__http_respond(r, status, h, nh, "application/json", json, strlen(json));
    free(json);
}

void qg__reply_error(qg_server *s, qg_http_req *r, int status,
                    const char *type, const char *message)
{
    char *body = qg__json_error(type, message);
    qg__metrics_http(s->metrics, r->tag, status);
    if (!body)
        qg__http_respond(r, 500, NULL, 0, "application/json", "{}", 2);
    else
        qg__http_respond(r, status, NULL, 0, "application/json", body,
                        strlen(body));
    free(body);
}

