/* upstream.c - see upstream.h. */
#include <arpa/inet.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "upstream.h"
#include "url.h"

typedef struct pooled {
    struct evhttp_connection *c;
    int inflight;
    int dead;                  /* TLS: closed; replace before reuse */
} pooled;

typedef struct pool {
    pooled conns[QG_UPSTREAM_MAX_CONNS];
    int n;
} pool;

struct qg_upstream {
    char host[QG_URL_HOST_MAX]; /* without brackets or port */
    int port;
    char host_hdr[300];
    char prefix[QG_URL_PREFIX_MAX];
    int timeout_ms;
    int tls;
    int host_is_ip;
    SSL_CTX *ssl;              /* https: verify peer + host name */
    int nworkers;
    pool *pools;               /* one per worker */
    _Atomic size_t open;
};

qg_upstream *qg_upstream_new(const char *url, int workers, int timeout_ms,
                             const char *ca_file, char *err, size_t errcap)
{
    qg_upstream *u;
    qg_url pu;
    char why[128];

    if (!url || !*url) {
        snprintf(err, errcap, "no upstream URL");
        return NULL;
    }
    if (qg_url_parse(url, strlen(url), &pu, why, sizeof why) < 0) {
        snprintf(err, errcap, "upstream \"%s\": expected "
                 "http[s]://HOST[:PORT][/PREFIX]: %s", url, why);
        return NULL;
    }
    if (!(u = calloc(1, sizeof *u)) ||
        !(u->pools = calloc((size_t)(workers > 0 ? workers : 1),
                            sizeof *u->pools))) {
        free(u);
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    snprintf(u->host, sizeof u->host, "%s", pu.host);
    u->tls = pu.tls;
    u->port = pu.port;
    if (pu.port_given && pu.port != (u->tls ? 443 : 80))
        snprintf(u->host_hdr, sizeof u->host_hdr,
                 strchr(pu.host, ':') ? "[%s]:%d" : "%s:%d", pu.host,
                 pu.port);
    else
        snprintf(u->host_hdr, sizeof u->host_hdr,
                 strchr(pu.host, ':') ? "[%s]" : "%s", pu.host);
    snprintf(u->prefix, sizeof u->prefix, "%s", pu.prefix);
    u->timeout_ms = timeout_ms > 0 ? timeout_ms : 120000;
    u->nworkers = workers > 0 ? workers : 1;
    if (u->tls) {
        unsigned char ip[16];
        u->host_is_ip = inet_pton(AF_INET, u->host, ip) == 1 ||
                        inet_pton(AF_INET6, u->host, ip) == 1;
        if (!(u->ssl = SSL_CTX_new(TLS_client_method())) ||
            SSL_CTX_set_min_proto_version(u->ssl, TLS1_2_VERSION) != 1 ||
            (ca_file && *ca_file
                 ? SSL_CTX_load_verify_locations(u->ssl, ca_file, NULL)
                 : SSL_CTX_set_default_verify_paths(u->ssl)) != 1) {
            snprintf(err, errcap, "upstream \"%s\": cannot set up TLS%s%s",
                     url, ca_file && *ca_file ? ": cannot load CA file " : "",
                     ca_file && *ca_file ? ca_file : "");
            qg_upstream_free(u);
            return NULL;
        }
        SSL_CTX_set_verify(u->ssl, SSL_VERIFY_PEER, NULL);
    }
    return u;
}

void qg_upstream_free(qg_upstream *u)
{
    if (!u)
        return;
    for (int w = 0; w < u->nworkers; w++)
        for (int i = 0; i < u->pools[w].n; i++)
            evhttp_connection_free(u->pools[w].conns[i].c);
    free(u->pools);
    if (u->ssl)
        SSL_CTX_free(u->ssl);
    free(u);
}

const char *qg_upstream_host(const qg_upstream *u) { return u->host_hdr; }
const char *qg_upstream_prefix(const qg_upstream *u) { return u->prefix; }

/* libevent 2.1 reconnects a closed connection on its old bufferevent,
 * which for TLS still holds the finished SSL session: a closed TLS
 * connection is marked dead and replaced before its next use. */
static void conn_closed(struct evhttp_connection *c, void *arg)
{
    pooled *pc = arg;
    (void)c;
    pc->dead = 1;
}

static struct evhttp_connection *conn_new(qg_upstream *u,
                                          struct event_base *base,
                                          pooled *slot)
{
    struct evhttp_connection *c;
    struct timeval tv = {u->timeout_ms / 1000,
                         (u->timeout_ms % 1000) * 1000};
    if (u->tls) {
        SSL *ssl = SSL_new(u->ssl);
        struct bufferevent *bev;
        if (!ssl)
            return NULL;
        if (u->host_is_ip) {
            if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl),
                                              u->host) != 1) {
                SSL_free(ssl);
                return NULL;
            }
        } else if (SSL_set_tlsext_host_name(ssl, u->host) != 1 ||
                   SSL_set1_host(ssl, u->host) != 1) {
            SSL_free(ssl);
            return NULL;
        }
        bev = bufferevent_openssl_socket_new(
            base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
            BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (!bev) {
            SSL_free(ssl);
            return NULL;
        }
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
        c = evhttp_connection_base_bufferevent_new(base, NULL, bev, u->host,
                                                   (unsigned short)u->port);
        if (!c) {
            bufferevent_free(bev);
            return NULL;
        }
        evhttp_connection_set_closecb(c, conn_closed, slot);
    } else {
        c = evhttp_connection_base_new(base, NULL, u->host,
                                       (unsigned short)u->port);
        if (!c)
            return NULL;
    }
    evhttp_connection_set_timeout_tv(c, &tv);
    evhttp_connection_set_retries(c, 0);
    return c;
}

struct evhttp_connection *qg_upstream_acquire(qg_upstream *u, int worker,
                                              struct event_base *base)
{
    pool *p;
    int best = -1;

    if (worker < 0 || worker >= u->nworkers)
        return NULL;
    p = &u->pools[worker];
    for (int i = 0; i < p->n; i++) {
        pooled *pc = &p->conns[i];
        if (pc->dead && pc->inflight == 0) {
            struct evhttp_connection *c = conn_new(u, base, pc);
            if (!c)
                continue;
            evhttp_connection_free(pc->c);
            pc->c = c;
            pc->dead = 0;
        }
        if (pc->dead)
            continue;
        if (pc->inflight == 0) {
            best = i;
            break;
        }
        if (best < 0 || pc->inflight < p->conns[best].inflight)
            best = i;
    }
    if ((best < 0 || p->conns[best].inflight > 0) &&
        p->n < QG_UPSTREAM_MAX_CONNS) {
        pooled *slot = &p->conns[p->n];
        struct evhttp_connection *c = conn_new(u, base, slot);
        if (c) {
            best = p->n++;
            slot->c = c;
            slot->inflight = 0;
            slot->dead = 0;
            atomic_fetch_add(&u->open, 1);
        }
    }
    if (best < 0)
        return NULL;
    p->conns[best].inflight++;
    return p->conns[best].c;
}

void qg_upstream_release(qg_upstream *u, int worker,
                         struct evhttp_connection *c)
{
    pool *p;
    if (!c || worker < 0 || worker >= u->nworkers)
        return;
    p = &u->pools[worker];
    for (int i = 0; i < p->n; i++)
        if (p->conns[i].c == c) {
            if (p->conns[i].inflight > 0)
                p->conns[i].inflight--;
            return;
        }
}

size_t qg_upstream_connections(qg_upstream *u)
{
    return atomic_load(&u->open);
}

/* ----------------------------------------------------- the set by URL */

typedef struct set_entry {
    char *url;
    qg_upstream *up;
    struct set_entry *next;
} set_entry;

struct qg_upstream_set {
    pthread_mutex_t mu;
    set_entry *head;
    int workers, timeout_ms;
    char *ca_file;
};

qg_upstream_set *qg_upstream_set_new(int workers, int timeout_ms,
                                     const char *ca_file)
{
    qg_upstream_set *set = calloc(1, sizeof *set);
    if (!set)
        return NULL;
    if (ca_file && *ca_file && !(set->ca_file = strdup(ca_file))) {
        free(set);
        return NULL;
    }
    pthread_mutex_init(&set->mu, NULL);
    set->workers = workers;
    set->timeout_ms = timeout_ms;
    return set;
}

qg_upstream *qg_upstream_set_get(qg_upstream_set *set, const char *url,
                                 char *err, size_t errcap)
{
    set_entry *e;
    qg_upstream *u = NULL;

    pthread_mutex_lock(&set->mu);
    for (e = set->head; e; e = e->next)
        if (strcmp(e->url, url) == 0) {
            u = e->up;
            goto out;
        }
    if (!(e = calloc(1, sizeof *e)) || !(e->url = strdup(url))) {
        free(e);
        snprintf(err, errcap, "out of memory");
        goto out;
    }
    if (!(e->up = qg_upstream_new(url, set->workers, set->timeout_ms,
                                  set->ca_file, err, errcap))) {
        free(e->url);
        free(e);
        goto out;
    }
    e->next = set->head;
    set->head = e;
    u = e->up;
out:
    pthread_mutex_unlock(&set->mu);
    return u;
}

void qg_upstream_set_free(qg_upstream_set *set)
{
    if (!set)
        return;
    while (set->head) {
        set_entry *e = set->head;
        set->head = e->next;
        qg_upstream_free(e->up);
        free(e->url);
        free(e);
    }
    pthread_mutex_destroy(&set->mu);
    free(set->ca_file);
    free(set);
}
