/* h_info.c - the read-only routes: /v1/usage, /v1/usage/{subject},
 * /v1/plans, /v1/weights, /healthz, /metrics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "json_out.h"
#include "metrics.h"
#include "notify.h"
#include "forecast.h"
#include "gate.h"
#include "rules.h"
#include "server.h"

/* A usage read while the store answers. */
typedef struct usage_call {
    qg_server *s;
    qg_http_req *r;
    int64_t now;
    char subject[256];
    qg_decision d;
} usage_call;

static void usage_answer(void *ud, int rc)
{
    usage_call *u = ud;
    qg_server *s = u->s;
    char msg[320];
    if (rc == QG_ENOSUBJECT) {
        char hint[1024];
        snprintf(msg, sizeof msg, "unknown subject \"%s\"", u->subject);
        qg__reply_error(s, u->r, 404, "unknown_subject",
                        qg__engine_error_hint(s, QG_ENOSUBJECT, msg, hint,
                                              sizeof hint));
    } else if (rc != QG_OK) {
        qg__reply_engine_error(s, u->r, rc, qg_strerror(rc));
    } else {
        /* the version in force now decides the unit and the windows */
        const qg_rules *rules = qg_engine_rules_at(s->engine, u->now);
        qg_forecast fc[QG_MAX_VIEWS];
        qg__usage_forecasts(s, rules, &u->d, u->subject, u->now, fc);
        qg__reply_json(s, u->r, 200,
                       qg__json_usage_upcoming(
                           qg__json_usage_forecast(&u->d, u->subject, u->now,
                                                   rules->unit, fc),
                           qg_engine_rules(s->engine), u->now, u->d.plan,
                           u->d.org),
                       NULL, 0);
    }
    free(u);
}

void qg__h_usage(qg_server *s, qg_http_req *r, const char *caller)
{
    const char *subject = caller;
    usage_call *u;
    int rc;

    if (strncmp(r->path, "/v1/usage/", 10) == 0) {
        const char *slash = strchr(r->path + 10, '/');
        char named[256];
        subject = r->path + 10;
        if (slash) {
            /* /v1/usage/{subject}/history and /requests (h_history.c) */
            size_t n = (size_t)(slash - subject);
            int requests = strcmp(slash, "/requests") == 0;
            if ((!requests && strcmp(slash, "/history") != 0) || n == 0 ||
                n >= sizeof named) {
                qg__reply_error(s, r, 404, "not_found", "no such endpoint");
                return;
            }
            memcpy(named, subject, n);
            named[n] = '\0';
            if (caller && strcmp(caller, named) != 0) {
                qg__reply_error(s, r, 403, "forbidden",
                               "a subject key reads only its own usage");
                return;
            }
            qg__h_usage_history(s, r, named, requests);
            return;
        }
        /* a subject key reads only its own usage */
        if (caller && strcmp(caller, subject) != 0) {
            qg__reply_error(s, r, 403, "forbidden",
                           "a subject key reads only its own usage");
            return;
        }
    }
    if (!subject || !*subject || strlen(subject) > 255) {
        qg__reply_error(s, r, 400, "invalid_request", "no subject");
        return;
    }
    if (!(u = malloc(sizeof *u))) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    u->s = s;
    u->r = r;
    u->now = qg__server_now(s);
    qg__row_copy(u->subject, sizeof u->subject, subject);
    rc = qg_engine_usage_async(s->engine,
                               qg__gate_lane(s, r->worker,
                                             qg__http_req_base(r)),
                               u->subject, u->now, &u->d, usage_answer, u);
    if (rc != QG_PENDING)
        usage_answer(u, rc);
}

void qg__h_plans(qg_server *s, qg_http_req *r, const char *caller)
{
    (void)caller;
    qg__reply_json(s, r, 200, qg__json_plans(qg_engine_rules(s->engine),
                                             qg__server_now(s)),
                  NULL, 0);
}

void qg__h_weights(qg_server *s, qg_http_req *r, const char *caller)
{
    (void)caller;
    qg__reply_json(s, r, 200,
                   qg__json_weights(qg_engine_rules_at(s->engine,
                                                       qg__server_now(s))),
                  NULL, 0);
}

/* PRODUCT.md section 4: 200 while serving; "degraded" while the ledger's
 * writes fail ("ledger_state": "errors", back to "ok" after the next
 * write that succeeds).  The memory store is never down and has no
 * fallback.  Before issue 8 "ledger" carried the state ("ok"|"errors");
 * it now names the backend, as the contract says (docs/api.md). */
void qg__h_healthz(qg_server *s, qg_http_req *r, const char *caller)
{
    qg_store_stats st;
    qg_ledger_stats ls;
    json_t *j;

    (void)caller;
    int down = atomic_load(&s->store_down) || atomic_load(&s->store_lost);
    const char *fallback = !down ? "none"
                           : qg_engine_rules(s->engine)->store.down ==
                                     QG_DOWN_CLOSED
                               ? "closed"
                               : "local";
    qg_store_stats_get(s->store, &st);
    qg__ledger_stats_get(s->ledger, &ls);
    j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I,"
                  " s:I}",
                  "status", ls.failing || ls.spooling || down ? "degraded"
                                                               : "ok",
                  "store", qg_store_name(s->store),
                  "store_state", down ? "down" : "ok",
                  "fallback", fallback,
                  "ledger", ls.backend ? ls.backend : "sqlite",
                  "ledger_state", ls.spooling  ? "spooling"
                                  : ls.failing ? "errors"
                                               : "ok",
                  "rules_version", qg_rules_version(qg_engine_rules_at(
                                       s->engine, qg__server_now(s))),
                  "ledger_queue", (json_int_t)ls.queued,
                  "ledger_errors", (json_int_t)ls.errors,
                  "subjects", (json_int_t)st.subjects,
                  "reservations_live", (json_int_t)st.reservations_live,
                  "rebuild_ms", (json_int_t)s->rebuild_ms);
    if (j && (ls.failing || ls.spooling))
        json_object_set_new(j, "ledger_error", json_string(ls.last_error));
    if (j && qg__ledger_shared(s->ledger))
        json_object_set_new(j, "ledger_spool_rows",
                            json_integer((json_int_t)ls.spool_rows));
    if (j && s->keeper) {
        json_object_set_new(j, "fallback_decisions",
                            json_integer((json_int_t)atomic_load(
                                &s->fallback_decisions)));
        json_object_set_new(j, "fallback_pending",
                            json_integer((json_int_t)qg_engine_local_pending(
                                s->engine)));
    }
    qg__reply_json(s, r, 200, qg__json_dump_steal(j), NULL, 0);
}

void qg__h_metrics(qg_server *s, qg_http_req *r, const char *caller)
{
    qg_metrics_gauges g;
    qg_store_stats st;
    qg_ledger_stats ls;
    qg_http_stats hs;
    qg__notify_stats ns;
    char *text;

    (void)caller;
    qg_store_stats_get(s->store, &st);
    qg__ledger_stats_get(s->ledger, &ls);
    qg__http_server_stats(s->http, &hs);
    qg__server_gauges(s, &st, &ls, &hs, &g);
    qg__notify_stats_get(s->notify, &ns);
    g.notify = s->notify ? &ns : NULL;
    g.now_ms = qg__server_now(s);
    text = qg__metrics_render(s->metrics, &g);
    if (!text) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    qg__http_respond(r, 200, NULL, 0, "text/plain; version=0.0.4", text,
                    strlen(text));
    free(text);
}
