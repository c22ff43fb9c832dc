/* h_explain.c - GET /v1/admin/requests/{request_id} (admin key): the
 * explain JSON of one request (explain.c; docs/api.md).  The id is the
 * rest of the path, percent-decoded; 404 not_found when the ledger has no
 * such request.  The answer is built on the worker: one indexed read of
 * the row and one of its subject's and org's rows within the rules'
 * reach (docs/benchmarks.md, "explain"), after the rows queued at the
 * call are written (an explain right after a check finds its row). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "json_out.h"
#include "server.h"

#define PREFIX "/v1/admin/requests/"

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Percent-decode src into dst (cap bytes with the NUL): 0, or -1 for a
 * malformed escape, a NUL byte or an id longer than the cap allows. */
static int decode_id(const char *src, char *dst, size_t cap)
{
    size_t n = 0;
    for (; *src; src++) {
        int c = (unsigned char)*src;
        if (c == '%') {
            int h = hexval(src[1]), l = h < 0 ? -1 : hexval(src[2]);
            if (l < 0 || (c = h * 16 + l) == 0)
                return -1;
            src += 2;
        }
        if (n + 1 >= cap)
            return -1;
        dst[n++] = (char)c;
    }
    dst[n] = '\0';
    return n ? 0 : -1;
}

/* A request decided a moment ago may still wait in the writer's queue:
 * wait (at most CATCH_UP_MS) until every row queued at the call is
 * written, as reconciliation does (reconcile_run.c). */
#define CATCH_UP_MS 2000

static void catch_up(qg_ledger *l)
{
    qg_ledger_stats st;
    struct timespec ts = {0, 2000000L};
    uint64_t target;
    qg__ledger_stats_get(l, &st);
    target = st.rows_written + st.rows_lost + st.rows_failed + st.queued;
    for (int waited = 0; waited < CATCH_UP_MS; waited += 2) {
        qg__ledger_stats_get(l, &st);
        if (st.rows_written + st.rows_lost + st.rows_failed >= target)
            return;
        nanosleep(&ts, NULL);
    }
}

void qg__h_admin_request(qg_server *s, qg_http_req *r, const char *caller)
{
    char id[QG_REQUEST_ID_MAX + 1], err[1024];
    json_t *j = NULL;
    int rc;

    (void)caller;
    if (decode_id(r->path + strlen(PREFIX), id, sizeof id) < 0) {
        qg__reply_error(s, r, 400, "invalid_request",
                        "the request id must be 1 to 255 bytes, "
                        "percent-encoded in the path");
        return;
    }
    catch_up(s->ledger);
    rc = qg__explain(s->ledger, qg_rules_path(qg_engine_rules(s->engine)), id,
                     &j, err, sizeof err);
    if (rc == QG_ENOTFOUND)
        qg__reply_error(s, r, 404, "not_found", err);
    else if (rc != QG_OK)
        qg__reply_error(s, r, 500, "internal_error", err);
    else
        qg__reply_json(s, r, 200, qg__json_dump_steal(j), NULL, 0);
}
