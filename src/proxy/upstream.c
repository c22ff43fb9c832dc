/* upstream.c - see upstream.h: an upstream (its URL, its TLS context
 * with peer and host-name verification, its keep-alive pool per worker)
 * and the set of upstreams by URL that the proxy keeps until shutdown.
 * The connections and the calls they carry are upcall.c's. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "upstream_internal.h"

qg_upstream *qg__upstream_new(const char *url, int workers, int timeout_ms,
                             const char *ca_file, char *err, size_t errcap)
{
    qg_upstream *u;
    qg_url pu;
    char why[128];

    if (!url || !*url) {
        snprintf(err, errcap, "no upstream URL");
        return NULL;
    }
    if (qg__url_parse(url, strlen(url), &pu, why, sizeof why) < 0) {
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
            qg__upstream_free(u);
            return NULL;
        }
        SSL_CTX_set_verify(u->ssl, SSL_VERIFY_PEER, NULL);
    }
    return u;
}

void qg__upstream_free(qg_upstream *u)
{
    if (!u)
        return;
    for (int w = 0; w < u->nworkers; w++)
        while (u->pools[w].idle)
            qg__upcall_close(u->pools[w].idle);
    free(u->pools);
    if (u->ssl)
        SSL_CTX_free(u->ssl);
    free(u);
}

const char *qg__upstream_host(const qg_upstream *u) { return u->host_hdr; }
const char *qg__upstream_prefix(const qg_upstream *u) { return u->prefix; }

size_t qg__upstream_connections(qg_upstream *u)
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

qg_upstream_set *qg__upstream_set_new(int workers, int timeout_ms,
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

qg_upstream *qg__upstream_set_get(qg_upstream_set *set, const char *url,
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
    if (!(e->up = qg__upstream_new(url, set->workers, set->timeout_ms,
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

void qg__upstream_set_free(qg_upstream_set *set)
{
    if (!set)
        return;
    while (set->head) {
        set_entry *e = set->head;
        set->head = e->next;
        qg__upstream_free(e->up);
        free(e->url);
        free(e);
    }
    pthread_mutex_destroy(&set->mu);
    free(set->ca_file);
    free(set);
}
