/* h_admin.c - the admin routes: subjects, keys, rules reload. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "civil.h"
#include "json_out.h"
#include "keys.h"
#include "reqjson.h"
#include "server.h"

const char *const qg__subject_keys[] = {"subject", "plan", "org",
                                        "billing_anchor", NULL};

void qg__h_admin_subjects(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[320];
    const char *subject = NULL, *plan = NULL, *org = NULL, *anchor = NULL;
    int64_t anchor_ms = 0;
    qg__reqjson o;
    int rc;

    (void)caller;
    if (qg__reqjson_parse(&o, r->body, r->body_len, qg__subject_keys, err,
                          sizeof err) != 0 ||
        qg__reqjson_str(&o, "subject", 1, 255, &subject, err,
                        sizeof err) < 0 ||
        qg__reqjson_str(&o, "plan", 1, 63, &plan, err, sizeof err) < 0 ||
        qg__reqjson_str(&o, "org", 0, 63, &org, err, sizeof err) < 0 ||
        qg__reqjson_str(&o, "billing_anchor", 0, 64, &anchor, err,
                        sizeof err) < 0)
        goto bad;
    if (anchor && qg_iso8601_parse(anchor, &anchor_ms) != 0) {
        snprintf(err, sizeof err, "billing_anchor must be an ISO 8601 "
                 "instant such as 2026-01-31T09:00:00Z");
        goto bad;
    }
    /* Durable first: a subject acknowledged is a subject after a crash. */
    rc = qg_engine_set_subject(s->engine, subject, plan, org, anchor_ms, err,
                               sizeof err);
    if (rc == QG_EINVAL)
        goto bad;
    if (rc != QG_OK ||
        (rc = qg__ledger_put_subject(s->ledger, subject, plan, org ? org : "",
                                    anchor_ms, qg__server_now(s))) != QG_OK) {
        qg__reply_error(s, r, 500, "internal_error", qg_strerror(rc));
        goto out;
    }
    {
        json_t *j = json_pack("{s:s, s:s, s:o, s:o}", "subject", subject,
                              "plan", plan,
                              "org", org ? json_string(org) : json_null(),
                              "billing_anchor",
                              anchor_ms ? qg__json_time(anchor_ms)
                                        : json_null());
        qg__reply_json(s, r, 200, qg__json_dump_steal(j), NULL, 0);
    }
    goto out;
bad:
    qg__reply_error(s, r, 400, "invalid_request", err);
out:
    qg__reqjson_free(&o);
}

const char *const qg__key_keys[] = {"subject", NULL};

void qg__h_admin_keys(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[320], key[QG_KEY_LEN + 1];
    const char *subject = NULL;
    qg_key_rec rec;
    qg__reqjson o;
    json_t *j;
    int rc;

    (void)caller;
    if (qg__reqjson_parse(&o, r->body, r->body_len, qg__key_keys, err,
                          sizeof err) != 0 ||
        qg__reqjson_str(&o, "subject", 1, 255, &subject, err,
                        sizeof err) < 0) {
        qg__reply_error(s, r, 400, "invalid_request", err);
        qg__reqjson_free(&o);
        return;
    }
    if (!qg_engine_knows_subject(s->engine, subject)) {
        snprintf(err, sizeof err, "unknown subject \"%s\": create it with "
                 "POST /v1/admin/subjects first", subject);
        qg__reply_error(s, r, 404, "unknown_subject", err);
        qg__reqjson_free(&o);
        return;
    }
    if ((rc = qg__key_generate("subject", subject, qg__server_now(s), key,
                              sizeof key, &rec)) != QG_OK ||
        (rc = qg__ledger_put_key(s->ledger, &rec)) != QG_OK) {
        qg__reply_error(s, r, 500, "internal_error", qg_strerror(rc));
        qg__reqjson_free(&o);
        return;
    }
    j = json_pack("{s:s, s:s, s:s, s:s}", "key", key, "id", rec.id,
                  "subject", subject, "note",
                  "shown once: quotagate keeps only its hash");
    memset(key, 0, sizeof key);
    qg__reply_json(s, r, 200, qg__json_dump_steal(j), NULL, 0);
    qg__reqjson_free(&o);
}

/* Answered by the reloader (reload.c) on this worker once the file is
 * loaded: this thread goes on serving meanwhile. */
void qg__h_admin_reload(qg_server *s, qg_http_req *r, const char *caller)
{
    (void)caller;
    if (qg__reloader_request(s->reloader, r) != QG_OK)
        qg__reply_error(s, r, 503, "overloaded",
                       "out of memory: the reload was not started");
}

const char *const qg__reconcile_keys[] = {"subject", "repair", NULL};

/* POST /v1/admin/reconcile {"subject"?, "repair"?}: run by the reconciler
 * (reconciler.c) off this worker, answered here when done. */
void qg__h_admin_reconcile(qg_server *s, qg_http_req *r, const char *caller)
{
    char err[320];
    const char *subject = NULL;
    qg__reqjson o = {.tree = NULL, .n = 0};
    int repair = 0;

    (void)caller;
    if (r->body_len > 0 &&
        (qg__reqjson_parse(&o, r->body, r->body_len, qg__reconcile_keys, err,
                           sizeof err) != 0 ||
         qg__reqjson_str(&o, "subject", 0, 255, &subject, err, sizeof err) <
             0 ||
         qg__reqjson_bool(&o, "repair", &repair, err, sizeof err) < 0))
        goto bad;
    if (subject && !*subject) {
        snprintf(err, sizeof err, "subject must be 1 to 255 bytes");
        goto bad;
    }
    if (qg__reconciler_request(s->reconciler, r, subject, repair) != QG_OK)
        qg__reply_error(s, r, 503, "overloaded",
                        "out of memory: the reconciliation was not started");
    qg__reqjson_free(&o);
    return;
bad:
    qg__reply_error(s, r, 400, "invalid_request", err);
    qg__reqjson_free(&o);
}
