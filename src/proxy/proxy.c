/* proxy.c - see proxy.h: the proxy's upstreams, queues and calls, and
 * the request head that goes upstream. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "fault.h"
#include "fixed.h"
#include "proxy.h"
#include "quotagate.h"
#include "usage.h"

typedef struct qslot {
    char plan[128];
    int n;                     /* requests held for this plan */
} qslot;

/* Per worker: the upstream of each model of one rules generation (the
 * rules' address is the key: generations are retired, never freed, while
 * the server runs), so a request finds its upstream without a lock. */
typedef struct upcache {
    const qg_rules *rules;
    qg_upstream *m[QG_MAX_MODELS];
} upcache;

struct qg__proxy {
    qg_upstream *up;           /* the default, or NULL */
    qg_upstream_set *set;      /* every upstream, by URL, until the end */
    upcache *cache;            /* per worker */
    int nworkers;
    qg__proxy_call **live;     /* per worker: calls in flight or held */
    pthread_mutex_t qlock;     /* the overage queues, shared by workers */
    qslot *qs;
    int nqs, capqs;
};

qg__proxy *qg__proxy_new(int nworkers, const char *default_url,
                         int timeout_ms, const char *ca_file, char *err,
                         size_t errcap)
{
    qg__proxy *pr = calloc(1, sizeof *pr);
    if (!pr || !(pr->live = calloc((size_t)nworkers, sizeof *pr->live)) ||
        !(pr->cache = calloc((size_t)nworkers, sizeof *pr->cache)) ||
        !(pr->set = qg__upstream_set_new(nworkers, timeout_ms, ca_file))) {
        if (pr) {
            free(pr->live);
            free(pr->cache);
        }
        free(pr);
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    pr->nworkers = nworkers;
    pthread_mutex_init(&pr->qlock, NULL);
    if (default_url && *default_url &&
        !(pr->up = qg__upstream_set_get(pr->set, default_url, err,
                                        errcap))) {
        qg__upstream_set_free(pr->set);
        pthread_mutex_destroy(&pr->qlock);
        free(pr->cache);
        free(pr->live);
        free(pr);
        return NULL;
    }
    return pr;
}

void qg__proxy_free(qg__proxy *pr)
{
    if (!pr)
        return;
    for (int w = 0; w < pr->nworkers; w++)
        while (pr->live[w]) {
            qg__proxy_call *c = pr->live[w];
            c->stop(c);
            if (pr->live[w] == c)       /* a stop that did not unlink */
                qg__proxy_unlink(pr, w, c);
        }
    qg__upstream_set_free(pr->set);
    pthread_mutex_destroy(&pr->qlock);
    free(pr->cache);
    free(pr->qs);
    free(pr->live);
    free(pr);
}

qg_upstream *qg__proxy_upstream(qg__proxy *pr, int worker,
                                const qg_rules *rules, int m, char *err,
                                size_t errcap)
{
    const char *url;
    upcache *c;
    err[0] = '\0';
    if (m < 0 || m >= rules->nmodels || !(url = rules->models[m].upstream))
        return pr->up;
    c = &pr->cache[worker];
    if (c->rules != rules) {
        memset(c, 0, sizeof *c);
        c->rules = rules;
    }
    if (!c->m[m])
        c->m[m] = qg__upstream_set_get(pr->set, url, err, errcap);
    return c->m[m];
}

int qg__proxy_queue_take(qg__proxy *pr, const char *plan, int cap)
{
    int rc = -1, i;
    pthread_mutex_lock(&pr->qlock);
    for (i = 0; i < pr->nqs; i++)
        if (!strcmp(pr->qs[i].plan, plan))
            break;
    if (i == pr->nqs) {
        if (pr->nqs == pr->capqs) {
            int nc = pr->capqs ? pr->capqs * 2 : 8;
            qslot *q = realloc(pr->qs, (size_t)nc * sizeof *q);
            if (!q)
                goto out;
            pr->qs = q;
            pr->capqs = nc;
        }
        memset(&pr->qs[i], 0, sizeof pr->qs[i]);
        snprintf(pr->qs[i].plan, sizeof pr->qs[i].plan, "%s", plan);
        pr->nqs++;
    }
    if (pr->qs[i].n < cap) {
        pr->qs[i].n++;
        rc = 0;
    }
out:
    pthread_mutex_unlock(&pr->qlock);
    return rc;
}

void qg__proxy_queue_give(qg__proxy *pr, const char *plan)
{
    pthread_mutex_lock(&pr->qlock);
    for (int i = 0; i < pr->nqs; i++)
        if (!strcmp(pr->qs[i].plan, plan) && pr->qs[i].n > 0) {
            pr->qs[i].n--;
            break;
        }
    pthread_mutex_unlock(&pr->qlock);
}

void qg__proxy_link(qg__proxy *pr, int worker, qg__proxy_call *c)
{
    if (c->linked)
        return;
    c->linked = 1;
    c->prev = NULL;
    c->next = pr->live[worker];
    if (c->next)
        c->next->prev = c;
    pr->live[worker] = c;
}

void qg__proxy_unlink(qg__proxy *pr, int worker, qg__proxy_call *c)
{
    if (!c->linked)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else if (pr->live[worker] == c)
        pr->live[worker] = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->linked = 0;
    c->prev = c->next = NULL;
}

int qg__proxy_forward_header(const char *name, size_t len)
{
    static const char *const drop[] = {
        "authorization", "x-api-key", "connection", "keep-alive", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
        "accept-encoding", "x-request-id", "expect", NULL};
    for (int i = 0; drop[i]; i++)
        if (strlen(drop[i]) == len && strncasecmp(drop[i], name, len) == 0)
            return 0;
    if (len >= 6 && strncasecmp(name, "proxy-", 6) == 0)
        return 0;
    if (len >= 11 && strncasecmp(name, "x-quotagate", 11) == 0)
        return 0;
    return 1;
}

/* 1 when s[0..n) holds a CR or LF (it would end the header early). */
static int has_eol(const char *s, size_t n)
{
    return memchr(s, '\r', n) != NULL || memchr(s, '\n', n) != NULL;
}

static int add(struct evbuffer *b, const void *data, size_t len)
{
    return qg__alloc_fails("request head") || evbuffer_add(b, data, len) != 0;
}

#define ADD_LIT(b, lit) add((b), (lit), sizeof(lit) - 1)

static int add_str(struct evbuffer *b, const char *s)
{
    return add(b, s, strlen(s));
}

/* Pieces and the length by qg__dec_u64, not evbuffer_add_printf: its
 * format parsing was ~4k instructions of every proxied call (callgrind,
 * docs/benchmarks.md, "Proxy overhead"). */
int qg__proxy_request_head(struct evbuffer *out, const qg_upstream *up,
                           const char *path, const qg_http_header *hdrs,
                           int nhdrs, size_t body_len, const char *rid,
                           int shape, const char *key)
{
    char num[QG_DEC_MAX];
    int have_ctype = 0, rc = 0;

    rc |= ADD_LIT(out, "POST ");
    rc |= add_str(out, qg__upstream_prefix(up));
    rc |= add_str(out, path);
    rc |= ADD_LIT(out, " HTTP/1.1\r\nHost: ");
    rc |= add_str(out, qg__upstream_host(up));
    rc |= ADD_LIT(out, "\r\n");
    for (int i = 0; i < nhdrs; i++) {
        const qg_http_header *h = &hdrs[i];
        if (!qg__proxy_forward_header(h->name, h->name_len) ||
            h->name_len >= 256 || h->value_len >= 8192)
            continue;
        if (has_eol(h->name, h->name_len) || has_eol(h->value, h->value_len))
            return QG_EINVAL;
        if (h->name_len == 12 && strncasecmp(h->name, "content-type", 12) == 0)
            have_ctype = 1;
        rc |= add(out, h->name, h->name_len);
        rc |= ADD_LIT(out, ": ");
        rc |= add(out, h->value, h->value_len);
        rc |= ADD_LIT(out, "\r\n");
    }
    rc |= ADD_LIT(out, "Content-Length: ");
    rc |= add(out, num, qg__dec_u64(num, body_len));
    rc |= ADD_LIT(out, "\r\nX-Request-Id: ");
    rc |= add_str(out, rid);
    rc |= ADD_LIT(out, "\r\n");
    if (!have_ctype)
        rc |= ADD_LIT(out, "Content-Type: application/json\r\n");
    if (key && *key) {
        if (has_eol(key, strlen(key)))
            return QG_EINVAL;
        rc |= add_str(out, shape == QG_SHAPE_OPENAI ? "Authorization: Bearer "
                                                    : "x-api-key: ");
        rc |= add_str(out, key);
        rc |= ADD_LIT(out, "\r\n");
    }
    rc |= ADD_LIT(out, "\r\n");
    return rc ? QG_ENOMEM : QG_OK;
}
