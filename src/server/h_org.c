/* h_org.c - GET /v1/orgs/{org}/usage (admin key): an organisation's own
 * windows and every member's usage, for the console's org view
 * (PRODUCT.md section 7, "an org shows its members' usage").
 *
 * The members are the engine's registered subjects whose org it is
 * (qg_engine_org_members), sorted by name, at most ORG_MEMBERS_MAX of
 * them in one answer ("truncated" says when there are more).  Each
 * member's usage is read like GET /v1/usage/{subject} reads it, all on
 * the request's worker lane at the same instant: a store across a network
 * answers them asynchronously, and the answer goes out when the last one
 * is back.  The org's windows are its scope's views as read through its
 * first member (they are one set of counters whichever member reads
 * them); an org without members has none to show. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gate.h"
#include "json_out.h"
#include "rules.h"
#include "server.h"

#define ORG_MEMBERS_MAX 256
#define ORG_PATH_PREFIX "/v1/orgs/"
#define ORG_PATH_SUFFIX "/usage"

typedef struct org_call org_call;

typedef struct org_slot {
    org_call *call;
    int rc;
    qg_decision d;
} org_slot;

struct org_call {
    qg_server *s;
    qg_http_req *r;
    int64_t now;
    char org[256];
    char **names;
    size_t n, total;
    size_t pending;              /* reads not back yet */
    int issuing;                 /* still inside the loop that starts them */
    org_slot *slots;
};

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void org_call_free(org_call *c)
{
    qg_engine_names_free(c->names, c->n);
    free(c->slots);
    free(c);
}

static void org_answer(org_call *c)
{
    qg_org_member *m = calloc(c->n ? c->n : 1, sizeof *m);
    if (!m) {
        qg__reply_error(c->s, c->r, 500, "internal_error", "out of memory");
        org_call_free(c);
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        m[i].subject = c->names[i];
        m[i].rc = c->slots[i].rc;
        m[i].d = &c->slots[i].d;
    }
    qg__reply_json(c->s, c->r, 200,
                   qg__json_org_usage(c->org, m, (int)c->n, c->total, c->now,
                                      qg_engine_rules(c->s->engine)->unit),
                   NULL, 0);
    free(m);
    org_call_free(c);
}

static void member_done(void *ud, int rc)
{
    org_slot *slot = ud;
    org_call *c = slot->call;
    slot->rc = rc;
    if (--c->pending == 0 && !c->issuing)
        org_answer(c);
}

/* The org of "/v1/orgs/NAME/usage" into buf; 0, or -1 for another path. */
static int org_of_path(const char *path, char *buf, size_t cap)
{
    size_t np = strlen(ORG_PATH_PREFIX), ns = strlen(ORG_PATH_SUFFIX);
    size_t n = strlen(path);
    if (n <= np + ns || strncmp(path, ORG_PATH_PREFIX, np) != 0 ||
        strcmp(path + n - ns, ORG_PATH_SUFFIX) != 0)
        return -1;
    n -= np + ns;
    if (n >= cap || memchr(path + np, '/', n))
        return -1;
    memcpy(buf, path + np, n);
    buf[n] = '\0';
    return 0;
}

void qg__h_org_usage(qg_server *s, qg_http_req *r, const char *caller)
{
    org_call *c;
    char msg[320];
    int rc;

    (void)caller;
    if (!(c = calloc(1, sizeof *c))) {
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    c->s = s;
    c->r = r;
    c->now = qg__server_now(s);
    if (org_of_path(r->path, c->org, sizeof c->org) < 0) {
        free(c);
        qg__reply_error(s, r, 404, "not_found", "no such endpoint");
        return;
    }
    rc = qg_engine_org_members(s->engine, c->org, ORG_MEMBERS_MAX, &c->names,
                               &c->n, &c->total);
    if (rc == QG_ENOTFOUND) {
        snprintf(msg, sizeof msg, "unknown org \"%s\"", c->org);
        free(c);
        qg__reply_error(s, r, 404, "unknown_org", msg);
        return;
    }
    if (rc != QG_OK || (c->n && !(c->slots = calloc(c->n, sizeof *c->slots)))) {
        org_call_free(c);
        qg__reply_error(s, r, 500, "internal_error", "out of memory");
        return;
    }
    qsort(c->names, c->n, sizeof *c->names, by_name);
    c->issuing = 1;
    for (size_t i = 0; i < c->n; i++) {
        org_slot *slot = &c->slots[i];
        slot->call = c;
        c->pending++;
        rc = qg_engine_usage_async(
            s->engine, qg__gate_lane(s, r->worker, qg__http_req_base(r)),
            c->names[i], c->now, &slot->d, member_done, slot);
        if (rc != QG_PENDING) {
            /* done at once: the callback is not called */
            slot->rc = rc;
            c->pending--;
        }
    }
    c->issuing = 0;
    if (c->pending == 0)
        org_answer(c);
}
