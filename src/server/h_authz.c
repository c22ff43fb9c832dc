/* h_authz.c - GET /v1/authz: forward-auth for gateways that already exist
 * (nginx auth_request, Envoy ext_authz in HTTP mode, Traefik ForwardAuth).
 * docs/forward-auth.md has the configurations.
 *
 * Who:
 *  - the service key comes in `X-Quotagate-Key: KEY` (set by the proxy in
 *    front; the client's own Authorization header is passed through
 *    untouched by these gateways and identifies the subject).  When the
 *    subject is named explicitly (X-Quotagate-Subject) and there is no
 *    X-Quotagate-Key, the service key may come in `Authorization: Bearer`
 *    or `x-api-key` instead.  The admin key is accepted wherever the
 *    service key is (as on /v1/check).
 *  - the subject: `X-Quotagate-Subject` if present, else the client's
 *    subject key in `Authorization: Bearer KEY` / `x-api-key: KEY`.
 *  - the request id: `X-Request-Id` (nginx's $request_id), else one is
 *    generated ("authz-<ms>-<counter>").  A repeated request id is
 *    answered with the original decision and charged nothing again.
 *  - the weight: `X-Quotagate-Weight` (decimal, at most 3 decimals), or
 *    `X-Quotagate-Model` with `X-Quotagate-Input-Tokens` and
 *    `X-Quotagate-Max-Output-Tokens` (as /v1/check); default 1 point.
 *
 * A forward-auth call cannot be settled (the gateway never says when the
 * request ends), so it is a one-phase charge: decided with
 * qg_engine_check and, when admitted, settled at once at its reserved
 * weight (status completed), so no concurrency lease is held.  Both ledger
 * rows are queued as /v1/check's are (the check row, then a settle-only
 * row) and the answer does not wait for durability: forward-auth charges
 * are durable within the ledger's batching window, like checks.
 *
 * Answers:
 *  - allowed: 200, the RateLimit / x-ratelimit headers, X-Quotagate-Subject,
 *    X-Quotagate-Weight and X-Quotagate-Request-Id (for the gateway to copy
 *    upstream), and /v1/check's JSON body;
 *  - refused: 429 with /v1/check's JSON body, Retry-After and the
 *    rate-limit headers (Envoy and Traefik pass this answer through);
 *  - `?mode=nginx`: nginx turns any auth subrequest status other than 2xx,
 *    401 and 403 into a 500, so every answer that is not 2xx or 401 is
 *    sent as 403 with the same headers and body plus
 *    `X-Quotagate-Status: <real status>` and `X-Quotagate-Body: <the JSON
 *    body>` (ASCII-only), which the documented nginx configuration maps
 *    back to a real 429 (or 400/404/503) with its body;
 *  - unknown subject: 404 unknown_subject (403 in nginx mode);
 *    missing or invalid service key, missing or invalid client key: 401
 *    unauthorized; malformed weight headers: 400 invalid_request; a weight
 *    or token count beyond its bound (quotagate.h): 400 out_of_range. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "auth.h"
#include "fixed.h"
#include "headers.h"
#include "json_out.h"
#include "metrics.h"
#include "rules.h"
#include "gate.h"

#define ERRCAP 320
#define NEXTRA 6

static _Atomic uint64_t authz_counter;


/* Header `name` trimmed of blanks into buf (cap bytes).  Returns 1 when
 * present and non-empty, 0 when absent or empty, -1 when too long. */
static int header_str(const qg_http_req *r, const char *name, char *buf,
                      size_t cap)
{
    size_t n;
    const char *v = qg__http_header_get(r, name, &n);
    if (!v)
        return 0;
    while (n && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    if (n == 0)
        return 0;
    if (n >= cap)
        return -1;
    memcpy(buf, v, n);
    buf[n] = '\0';
    return 1;
}

/* The client's key: "Authorization: Bearer KEY" or "x-api-key: KEY". */
static int client_key(const qg_http_req *r, char *buf, size_t cap)
{
    char a[1024];
    int rc = header_str(r, "authorization", a, sizeof a);
    if (rc > 0 && strncasecmp(a, "Bearer ", 7) == 0) {
        const char *k = a + 7;
        while (*k == ' ')
            k++;
        if (!*k)
            return 0;
        if (strlen(k) >= cap)
            return -1;
        qg__row_copy(buf, cap, k);
        return 1;
    }
    return header_str(r, "x-api-key", buf, cap);
}

/* "12", "0.5", "1.125" (at most 3 decimals) into milli-units.  Returns
 * 0, -1 malformed, -2 beyond QG_AMOUNT_MAX_MILLI. */
static int parse_milli(const char *s, int64_t *out)
{
    int rc;
    if (*s == '-' || *s == '.')
        return -1;
    rc = qg_fixed_parse(s, strlen(s), 3, out);
    if (rc == -3 || (rc == 0 && *out > QG_AMOUNT_MAX_MILLI))
        return -2;
    return rc == 0 ? 0 : -1;
}

/* Digits into [0, max].  Returns 0, -1 malformed, -2 beyond max. */
static int parse_int(const char *s, int64_t max, int64_t *out)
{
    int64_t v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        if (v > (max - (*s - '0')) / 10)
            v = max + 1;            /* beyond: keep scanning the syntax */
        else
            v = v * 10 + (*s - '0');
    }
    if (v > max)
        return -2;
    *out = v;
    return 0;
}

/* "NAME must be at most MAX (the bound on WHAT)" into buf. */
static const char *bound_msg(char *buf, size_t cap, const char *name,
                             int64_t max, const char *what)
{
    snprintf(buf, cap, "%s must be at most %lld (the bound on %s)", name,
             (long long)max, what);
    return buf;
}

/* ?mode=nginx.  Returns 1 nginx, 0 default, -1 unknown mode. */
static int parse_mode(const char *q)
{
    int mode = 0;
    while (q && *q) {
        const char *amp = strchr(q, '&');
        size_t n = amp ? (size_t)(amp - q) : strlen(q);
        if (n >= 5 && strncmp(q, "mode=", 5) == 0) {
            const char *v = q + 5;
            size_t vn = n - 5;
            if (vn == 5 && strncmp(v, "nginx", 5) == 0)
                mode = 1;
            else if (vn == 0 || (vn == 7 && !strncmp(v, "default", 7)) ||
                     (vn == 5 && !strncmp(v, "envoy", 5)) ||
                     (vn == 7 && !strncmp(v, "traefik", 7)))
                mode = 0;
            else
                return -1;
        }
        q = amp ? amp + 1 : NULL;
    }
    return mode;
}

/* Respond with status (or, in nginx mode, 403 + X-Quotagate-Status and
 * X-Quotagate-Body for anything not 2xx/401), adding h (nh headers). */
static void answer(qg_server *s, qg_http_req *r, int nginx, int status,
                   char *json, const qg_http_out_header *h, int nh)
{
    qg_http_out_header all[QG_HDR_MAX + NEXTRA + 2];
    char st[16];
    char *ascii = NULL;
    int n = 0;

    for (int i = 0; i < nh && n < QG_HDR_MAX + NEXTRA; i++)
        all[n++] = h[i];
    if (nginx && json && !(status >= 200 && status < 300) && status != 401) {
        json_t *j = json_loads(json, 0, NULL);
        snprintf(st, sizeof st, "%d", status);
        all[n++] = (qg_http_out_header){"X-Quotagate-Status", st};
        if (j) {
            ascii = json_dumps(j, QG_JSON_DUMP_FLAGS | JSON_ENSURE_ASCII);
            json_decref(j);
        }
        if (ascii)
            all[n++] = (qg_http_out_header){"X-Quotagate-Body", ascii};
        status = 403;
    }
    qg__reply_json(s, r, status, json, all, n);
    free(ascii);
}

static void fail(qg_server *s, qg_http_req *r, int nginx, int status,
                 const char *type, const char *message)
{
    answer(s, r, nginx, status, qg__json_error(type, message), NULL, 0);
}

static void fail_engine(qg_server *s, qg_http_req *r, int nginx, int rc,
                        const char *msg)
{
    char hint[1024];
    msg = qg__engine_error_hint(s, rc, msg, hint, sizeof hint);
    switch (rc) {
    case QG_ENOSUBJECT:
        fail(s, r, nginx, 404, "unknown_subject", msg);
        break;
    case QG_EMODEL:
        fail(s, r, nginx, 400, "unknown_model", msg);
        break;
    case QG_EFULL:
        fail(s, r, nginx, 503, "overloaded", msg);
        break;
    case QG_EINVAL:
        fail(s, r, nginx, 400, "invalid_request", msg);
        break;
    case QG_EIO:                 /* the ledger could not be read */
        fail(s, r, nginx, 503, "ledger_unavailable", msg);
        break;
    case QG_ERANGE:
        fail(s, r, nginx, 400, "out_of_range", msg);
        break;
    default:
        fail(s, r, nginx, 500, "internal_error", msg);
    }
}

static int is_service(int role)
{
    return role == QG_ROLE_SERVICE || role == QG_ROLE_ADMIN;
}

/* After the immediate settle: the subject's views as they now stand (no
 * lease held), when they line up with the decision's. */
static void refresh_views(qg_server *s, const char *subject, int64_t now,
                          qg_decision *d)
{
    qg_decision *u = malloc(sizeof *u);
    int same;
    if (!u)
        return;
    if (qg_engine_usage(s->engine, subject, now, u) == QG_OK &&
        u->nviews == d->nviews) {
        same = 1;
        for (int i = 0; i < d->nviews && same; i++)
            same = strcmp(u->views[i].name, d->views[i].name) == 0 &&
                   u->views[i].org == d->views[i].org;
        if (same)
            memcpy(d->views, u->views, sizeof d->views[0] * (size_t)d->nviews);
    }
    free(u);
}

/* What a forward-auth call asks for, from its headers. */
typedef struct authz_req {
    char subject[256], rid[256], model[QG_NAME_MAX];
    int has_model;
    int64_t in_tokens, max_out, weight;
} authz_req;

/* Why it cannot be decided: the answer to send instead. */
typedef struct authz_fail {
    int status;
    const char *type;
    char msg[ERRCAP];
} authz_fail;

static int refuse(authz_fail *f, int status, const char *type,
                  const char *msg)
{
    f->status = status;
    f->type = type;
    snprintf(f->msg, sizeof f->msg, "%s", msg);
    return -1;
}

/* The caller (the service key) and the subject (named, or the client's
 * own key).  0, or -1 with *f filled. */
static int authz_who(qg_server *s, qg_http_req *r, int64_t now,
                     authz_req *q, authz_fail *f)
{
    char svc[1024], ckey[1024], who[256] = "";
    int has_subject, has_svc, role;

    has_subject = header_str(r, "x-quotagate-subject", q->subject,
                             sizeof q->subject);
    if (has_subject < 0)
        return refuse(f, 400, "invalid_request",
                      "X-Quotagate-Subject is longer than 255 bytes");
    has_svc = header_str(r, "x-quotagate-key", svc, sizeof svc);
    if (has_svc <= 0 && has_subject > 0)
        has_svc = client_key(r, svc, sizeof svc);
    if (has_svc <= 0)
        return refuse(f, 401, "unauthorized",
                      "the service key is required: X-Quotagate-Key: KEY");
    role = qg__auth_identify(s->auth, svc, strlen(svc), now, NULL, 0);
    if (!is_service(role))
        return refuse(f, 401, "unauthorized",
                      "the service key is not valid (X-Quotagate-Key)");
    if (has_subject > 0)
        return 0;
    if (client_key(r, ckey, sizeof ckey) <= 0)
        return refuse(f, 401, "unauthorized",
                      "no subject: the client's API key is required "
                      "(Authorization: Bearer KEY or x-api-key: KEY), or "
                      "X-Quotagate-Subject");
    role = qg__auth_identify(s->auth, ckey, strlen(ckey), now, who,
                             sizeof who);
    if (role != QG_ROLE_SUBJECT || !who[0])
        return refuse(f, 401, "unauthorized",
                      role == QG_ROLE_NONE
                          ? "the client's API key is not valid (unknown or "
                            "revoked)"
                          : "the client's API key is not a subject key");
    qg__row_copy(q->subject, sizeof q->subject, who);
    return 0;
}

/* A token count header into *out (absent: left as it is).  0 or -1. */
static int token_header(qg_http_req *r, const char *name, const char *label,
                        int64_t *out, authz_fail *f)
{
    char num[64], msg[ERRCAP];
    int rc = header_str(r, name, num, sizeof num);
    if (rc > 0)
        rc = parse_int(num, QG_TOKENS_MAX, out);
    if (rc == -2)
        return refuse(f, 400, "out_of_range",
                      bound_msg(msg, sizeof msg, label, QG_TOKENS_MAX,
                                "a token count"));
    if (rc < 0) {
        snprintf(msg, sizeof msg, "%s must be an integer >= 0", label);
        return refuse(f, 400, "invalid_request", msg);
    }
    return 0;
}

/* The request id and what it weighs (a weight, or a model with token
 * counts; 1 point by default).  0, or -1 with *f filled. */
static int authz_what(qg_http_req *r, int64_t now, authz_req *q,
                      authz_fail *f)
{
    char num[64], msg[ERRCAP];
    int rc = header_str(r, "x-request-id", q->rid, sizeof q->rid);
    int has_weight;
    if (rc < 0)
        return refuse(f, 400, "invalid_request",
                      "X-Request-Id is longer than 255 bytes");
    if (rc == 0)
        snprintf(q->rid, sizeof q->rid, "authz-%lld-%llu", (long long)now,
                 (unsigned long long)atomic_fetch_add(&authz_counter, 1) + 1);
    has_weight = header_str(r, "x-quotagate-weight", num, sizeof num);
    if (has_weight > 0 && (rc = parse_milli(num, &q->weight)) == -2)
        return refuse(f, 400, "out_of_range",
                      bound_msg(msg, sizeof msg, "X-Quotagate-Weight",
                                QG_AMOUNT_MAX_MILLI / QG_MILLI,
                                "one request's weight"));
    if (has_weight < 0 || (has_weight > 0 && rc < 0))
        return refuse(f, 400, "invalid_request",
                      "X-Quotagate-Weight must be a number >= 0 with at "
                      "most 3 decimals");
    q->has_model = header_str(r, "x-quotagate-model", q->model,
                              sizeof q->model);
    if (q->has_model < 0)
        return refuse(f, 400, "invalid_request",
                      "X-Quotagate-Model is too long");
    if (q->has_model > 0 && has_weight > 0)
        return refuse(f, 400, "invalid_request",
                      "give either X-Quotagate-Model (with "
                      "X-Quotagate-Input-Tokens and "
                      "X-Quotagate-Max-Output-Tokens) or "
                      "X-Quotagate-Weight");
    if (q->has_model > 0 &&
        (token_header(r, "x-quotagate-input-tokens",
                      "X-Quotagate-Input-Tokens", &q->in_tokens, f) < 0 ||
         token_header(r, "x-quotagate-max-output-tokens",
                      "X-Quotagate-Max-Output-Tokens", &q->max_out, f) < 0))
        return -1;
    return 0;
}

/* One forward-auth call while it is decided (the store may answer
 * later): the admission, the request, the answer's mode. */
typedef struct authz_call {
    qg__admit a;
    authz_req q;
    int nginx;
    qg_http_req *r;
} authz_call;

static void authz_answer(qg_server *s, authz_call *c);

/* The immediate settle gave the concurrency slot back: the answer's views
 * as they now stand.  A store that answers at once is asked again (exact);
 * with a remote one the settle is still on its way, so the one lease of
 * this request is taken off the concurrency views instead. */
static void release_lease(qg_server *s, authz_call *c, qg_decision *d)
{
    if (!qg__gate_lane(s, c->r->worker, qg__http_req_base(c->r))) {
        refresh_views(s, c->q.subject, c->a.now_ms, d);
        return;
    }
    for (int i = 0; i < d->nviews; i++) {
        qg_window_view *v = &d->views[i];
        if (v->type != QG_WIN_CONCURRENCY || v->used_milli < QG_MILLI)
            continue;
        v->used_milli -= QG_MILLI;
        v->remaining_milli = v->limit_milli > v->used_milli
                                 ? v->limit_milli - v->used_milli : 0;
    }
}

/* Decided (gate.c): when admitted, settle at once at the reserved weight
 * (one phase: nobody will settle it), then answer. */
static void authz_decided(qg__admit *a, void *ud)
{
    authz_call *c = ud;
    qg_server *s = a->s;
    qg_decision *d = &a->d;
    if (a->rc != QG_OK) {
        fail_engine(s, c->r, c->nginx, a->rc, a->err);
        free(c);
        return;
    }
    qg__gate_record(s, a, NULL);
    if (!d->replayed && d->outcome == QG_ALLOW) {
        qg__settle st;
        memset(&st, 0, sizeof st);
        st.req = (qg_settle_req){.request_id = c->q.rid,
                                 .status = QG_SETTLE_COMPLETED,
                                 .input_tokens = c->q.in_tokens,
                                 .output_tokens = a->row_output_tokens,
                                 .weight_milli = -1};
        st.row_subject = c->q.subject;
        st.estimated = c->q.has_model > 0;
        if (qg__gate_settle(s, &st, c->r->worker, qg__http_req_base(c->r),
                            NULL, NULL) != QG_OK)
            fprintf(stderr, "quotagate: authz: settle of %s: out of "
                    "memory\n", c->q.rid);
        release_lease(s, c, d);
    }
    authz_answer(s, c);
}

/* A weight in points as text without trailing zeros ("1.5"). */
static void weight_text(int64_t w, char *buf, size_t cap)
{
    int len;
    if (w % 1000 == 0) {
        snprintf(buf, cap, "%lld", (long long)(w / 1000));
        return;
    }
    len = snprintf(buf, cap, "%lld.%03lld", (long long)(w / 1000),
                   (long long)(w % 1000));
    while (len > 0 && buf[len - 1] == '0')
        buf[--len] = '\0';
}

static void authz_answer(qg_server *s, authz_call *c)
{
    char wtext[64];
    qg_hdr_buf hb;
    qg_http_out_header extra[QG_HDR_MAX + NEXTRA];
    int n = 0;
    qg__gate_headers(s, &c->a, &hb);
    for (int i = 0; i < hb.n; i++)
        extra[n++] = hb.h[i];
    weight_text(c->a.d.weight_milli, wtext, sizeof wtext);
    extra[n++] = (qg_http_out_header){"X-Quotagate-Subject", c->q.subject};
    extra[n++] = (qg_http_out_header){"X-Quotagate-Weight", wtext};
    extra[n++] = (qg_http_out_header){"X-Quotagate-Request-Id", c->q.rid};
    answer(s, c->r, c->nginx, c->a.d.outcome == QG_ALLOW ? 200 : 429,
           qg__json_check(&c->a.d, c->q.rid,
                          qg_engine_rules(s->engine)),
           extra, n);
    free(c);
}

void qg__h_authz(qg_server *s, qg_http_req *r, const char *caller)
{
    authz_fail f;
    authz_call *c;
    int nginx;
    int64_t now = qg__server_now(s);

    (void)caller;
    if ((nginx = parse_mode(r->query)) < 0) {
        fail(s, r, 0, 400, "invalid_request",
             "mode must be nginx (or absent)");
        return;
    }
    if (!(c = calloc(1, sizeof *c))) {
        fail(s, r, nginx, 503, "overloaded", "out of memory");
        return;
    }
    c->q.max_out = -1;
    c->q.weight = 1000;
    c->nginx = nginx;
    c->r = r;
    if (authz_who(s, r, now, &c->q, &f) < 0 ||
        authz_what(r, now, &c->q, &f) < 0) {
        fail(s, r, nginx, f.status, f.type, f.msg);
        free(c);
        return;
    }
    c->a.req = (qg_check_req){
        .subject = c->q.subject, .request_id = c->q.rid,
        .model = c->q.has_model > 0 ? c->q.model : NULL,
        .input_tokens = c->q.in_tokens, .max_output_tokens = c->q.max_out,
        .weight_milli = c->q.has_model > 0 ? 0 : c->q.weight};
    c->a.row_output_tokens = c->q.has_model > 0
                                 ? (c->q.max_out < 0
                                        ? QG_DEFAULT_OUTPUT_ESTIMATE
                                        : c->q.max_out)
                                 : 0;
    c->a.estimated = 0;
    qg__gate_decide(s, r, &c->a, authz_decided, c);
}
