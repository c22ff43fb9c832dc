/* notify_send.c - the sender of notifications (notify.h): a thread with
 * an event loop of its own that claims due rows of the outbox, POSTs
 * each to its webhook as a Standard Webhook, and records the outcome.
 *
 * Every 100 ms (at once after the recorder created events) it claims up
 * to MAX_INFLIGHT - in flight due rows for this instance with a lease of
 * LEASE_MS, longer than an attempt can take, so that no other instance
 * takes them meanwhile; it polls the database at least once a second
 * for rows other instances created or retries that fell due.  A row is
 * sent with the project's own HTTP client (upstream.h: verified TLS for
 * https, a keep-alive pool) and three headers:
 *   webhook-id         the event's id, the same on every attempt
 *   webhook-timestamp  the attempt's time, seconds since the epoch
 *   webhook-signature  "v1," + base64(HMAC-SHA256(key, id.timestamp.body))
 * with OpenSSL's HMAC and base64.  Any 2xx is delivered; another status,
 * no answer, or silence past the timeout (QUOTAGATE_WEBHOOK_TIMEOUT_MS,
 * default 10 s) is retried after 2 s, 4 s, 8 s ... (at most an hour
 * apart) until 24 hours after the event was created; the last attempt
 * is made at that horizon, then the row is given up (state 2).
 *
 * A row whose URL the current rules no longer list waits (an hour, then
 * again) until the horizon: a reload may bring the webhook back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "ledger.h"
#include "notify.h"
#include "server.h"
#include "upstream.h"

#define MAX_INFLIGHT 16
#define MAX_UPSTREAMS 32
#define LEASE_MS 60000
#define FIRST_RETRY_MS 2000
#define MAX_BACKOFF_MS 3600000
#define HORIZON_MS QG_NOTIFY_HORIZON_MS

typedef struct call call;

struct qg__sender {
    qg_server *s;
    qg__notify *n;
    char owner[300];
    qg_outbox *ob;
    struct event_base *base;
    struct event *tick;
    pthread_t thread;
    int started;
    _Atomic int stop;
    _Atomic uint64_t hint;       /* bumped by qg__sender_wake */
    uint64_t hint_seen;
    int64_t next_poll_ms, next_backlog_ms, logged_ms;
    int timeout_ms;
    struct {
        char url[QG_NOTIFY_URL_MAX];
        qg_upstream *u;
    } ups[MAX_UPSTREAMS];
    int nups;
    call *inflight[MAX_INFLIGHT];
    int ninflight;
};

struct call {
    qg__sender *sd;
    qg_outbox_event ev;
    qg_upcall *c;
    int status;
    int slot;
};

static void sd_log(qg__sender *sd, const char *fmt, const char *a,
                   const char *b)
{
    int64_t now = qg__clock_ms(CLOCK_MONOTONIC);
    if (now - sd->logged_ms < 10000)
        return;
    sd->logged_ms = now;
    fprintf(stderr, "quotagate: notifications: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
}

/* base64(HMAC-SHA256(key, id "." ts "." body)) into sig. */
static int sign(const qg__webhook *w, const char *id, long long ts,
                const char *body, char *sig, size_t cap)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    size_t blen = strlen(body), n;
    char *msg = malloc(blen + 64 + strlen(id));
    if (!msg)
        return -1;
    n = (size_t)sprintf(msg, "%s.%lld.", id, ts);
    memcpy(msg + n, body, blen);
    if (!HMAC(EVP_sha256(), w->key, (int)w->keylen,
              (const unsigned char *)msg, n + blen, md, &mdlen) ||
        cap < 4 * ((mdlen + 2) / 3) + 1) {
        free(msg);
        return -1;
    }
    free(msg);
    EVP_EncodeBlock((unsigned char *)sig, md, (int)mdlen);
    return 0;
}

static qg_upstream *upstream_of(qg__sender *sd, const char *url, char *err,
                                size_t errcap)
{
    for (int i = 0; i < sd->nups; i++)
        if (strcmp(sd->ups[i].url, url) == 0)
            return sd->ups[i].u;
    if (sd->nups == MAX_UPSTREAMS) {       /* the oldest makes room */
        qg__upstream_free(sd->ups[0].u);
        memmove(&sd->ups[0], &sd->ups[1], (MAX_UPSTREAMS - 1) *
                sizeof sd->ups[0]);
        sd->nups--;
    }
    qg_upstream *u = qg__upstream_new(url, 1, sd->timeout_ms,
                                      getenv("QUOTAGATE_WEBHOOK_CA"), err,
                                      errcap);
    if (!u)
        return NULL;
    snprintf(sd->ups[sd->nups].url, sizeof sd->ups[0].url, "%s", url);
    sd->ups[sd->nups++].u = u;
    return u;
}

int64_t qg__notify_backoff_ms(int attempts)
{
    int64_t delay = FIRST_RETRY_MS;
    for (int i = 1; i < attempts && delay < MAX_BACKOFF_MS; i++)
        delay *= 2;
    return delay > MAX_BACKOFF_MS ? MAX_BACKOFF_MS : delay;
}

/* The attempt failed: again after the backoff, or given up. */
static void failed(qg__sender *sd, const qg_outbox_event *ev, int outcome,
                   const char *error)
{
    int64_t now = qg__server_now(sd->s);
    int attempts = ev->attempts + 1;
    int64_t delay = qg__notify_backoff_ms(attempts);
    char why[512];
    qg__notify_count(sd->n, outcome);
    if (now >= ev->created_ms + HORIZON_MS) {
        qg__notify_count(sd->n, QG_NOTIFY_EXPIRED);
        if (qg__outbox_give_up(sd->ob, ev->id, ev->url, now, error, why,
                               sizeof why) != QG_OK)
            sd_log(sd, "%s: %s", ev->id, why);
        fprintf(stderr, "quotagate: notifications: event %s to %s given up "
                "after 24 hours: %s\n", ev->id, ev->url, error);
        return;
    }
    if (now + delay > ev->created_ms + HORIZON_MS)
        delay = ev->created_ms + HORIZON_MS - now;
    if (qg__outbox_retry(sd->ob, ev->id, ev->url, now + delay, attempts,
                         error, why, sizeof why) != QG_OK)
        sd_log(sd, "%s: %s", ev->id, why);
    /* poll again when it falls due, not only at the next second */
    if (sd->next_poll_ms > now + delay)
        sd->next_poll_ms = now + delay;
}

static void call_end(call *k)
{
    qg__sender *sd = k->sd;
    sd->inflight[k->slot] = NULL;
    sd->ninflight--;
    free(k);
}

static void on_head(void *ud, const qg_upresp *r)
{
    ((call *)ud)->status = r->status;
}

static void on_body(void *ud, const char *data, size_t len)
{
    (void)ud;
    (void)data;
    (void)len;
}

static void on_done(void *ud, int err)
{
    call *k = ud;
    qg__sender *sd = k->sd;
    char why[512], msg[96];
    if (k->status >= 200 && k->status < 300) {
        qg__notify_count(sd->n, QG_NOTIFY_DELIVERED);
        if (qg__outbox_delivered(sd->ob, k->ev.id, k->ev.url,
                                 qg__server_now(sd->s), why,
                                 sizeof why) != QG_OK)
            sd_log(sd, "%s: %s", k->ev.id, why);
    } else if (k->status > 0) {
        snprintf(msg, sizeof msg, "answered %d", k->status);
        failed(sd, &k->ev, QG_NOTIFY_REJECTED, msg);
    } else {
        failed(sd, &k->ev, QG_NOTIFY_UNREACHABLE,
               err == QG_UP_ETIMEOUT ? "no answer within the timeout"
               : err == QG_UP_EPROTO ? "not an HTTP/1.1 answer"
                                     : "cannot connect, or closed early");
    }
    call_end(k);
}

static const qg_upcall_cbs cbs = {on_head, on_body, on_done, NULL};

static void send_one(qg__sender *sd, const qg_outbox_event *ev)
{
    qg__webhook w;
    qg_upstream *u;
    char err[256], sig[128], *head;
    long long ts = qg__server_now(sd->s) / 1000;
    size_t blen = strlen(ev->body);
    call *k;
    int slot = 0;

    if (qg__notify_webhook(sd->n, ev->url, &w) < 0) {
        failed(sd, ev, QG_NOTIFY_UNREACHABLE, "the webhook is no longer in "
               "the rules");
        return;
    }
    if (!(u = upstream_of(sd, ev->url, err, sizeof err))) {
        failed(sd, ev, QG_NOTIFY_UNREACHABLE, err);
        return;
    }
    if (sign(&w, ev->id, ts, ev->body, sig, sizeof sig) < 0 ||
        !(k = calloc(1, sizeof *k)) ||
        !(head = malloc(2048 + QG_NOTIFY_URL_MAX))) {
        OPENSSL_cleanse(&w, sizeof w);
        failed(sd, ev, QG_NOTIFY_UNREACHABLE, "out of memory");
        return;
    }
    OPENSSL_cleanse(&w, sizeof w);
    while (sd->inflight[slot])
        slot++;
    k->sd = sd;
    k->ev = *ev;
    k->slot = slot;
    int hl = snprintf(head, 2048 + QG_NOTIFY_URL_MAX,
                      "POST %s HTTP/1.1\r\nHost: %s\r\n"
                      "Content-Type: application/json\r\n"
                      "Content-Length: %zu\r\nUser-Agent: quotagate\r\n"
                      "webhook-id: %s\r\nwebhook-timestamp: %lld\r\n"
                      "webhook-signature: v1,%s\r\n\r\n",
                      qg__upstream_prefix(u)[0] ? qg__upstream_prefix(u)
                                                : "/",
                      qg__upstream_host(u), blen, ev->id, ts, sig);
    sd->inflight[slot] = k;
    sd->ninflight++;
    k->c = qg__upstream_send(u, 0, sd->base, head, (size_t)hl, ev->body,
                             blen, &cbs, k);
    free(head);
    if (!k->c) {
        failed(sd, ev, QG_NOTIFY_UNREACHABLE, "out of memory");
        call_end(k);
    }
}

static void claim(qg__sender *sd, int64_t now)
{
    qg_outbox_event *evs;
    char why[512];
    int want = MAX_INFLIGHT - sd->ninflight, n = 0;
    if (want <= 0 || !(evs = malloc((size_t)want * sizeof *evs)))
        return;
    if (qg__outbox_claim(sd->ob, sd->owner, now, LEASE_MS, evs, want, &n,
                         why, sizeof why) != QG_OK)
        sd_log(sd, "cannot claim events: %s%s", why, "");
    for (int i = 0; i < n; i++)
        send_one(sd, &evs[i]);
    free(evs);
    /* a full claim may have left more: again at the next tick */
    sd->next_poll_ms = n == want ? now : now + 1000;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    qg__sender *sd = arg;
    int64_t now = qg__server_now(sd->s);
    uint64_t hint = atomic_load(&sd->hint);
    (void)fd;
    (void)what;
    if (atomic_load(&sd->stop)) {
        for (int i = 0; i < MAX_INFLIGHT; i++)
            if (sd->inflight[i]) {
                qg__upcall_cancel(sd->inflight[i]->c);
                call_end(sd->inflight[i]);
            }
        event_base_loopbreak(sd->base);
        return;
    }
    if (now >= sd->next_backlog_ms) {
        int64_t pending = 0, oldest = 0;
        char why[512];
        if (qg__outbox_backlog(sd->ob, &pending, &oldest, why,
                               sizeof why) == QG_OK)
            qg__notify_backlog(sd->n, pending, oldest);
        sd->next_backlog_ms = now + 1000;
    }
    if (hint != sd->hint_seen || now >= sd->next_poll_ms) {
        sd->hint_seen = hint;
        claim(sd, now);
    }
}

static void *sender_main(void *arg)
{
    qg__sender *sd = arg;
    event_base_dispatch(sd->base);
    return NULL;
}

void qg__sender_wake(qg__sender *sd)
{
    if (sd)
        atomic_fetch_add(&sd->hint, 1);
}

qg__sender *qg__sender_new(qg_server *s, qg__notify *n, const char *owner,
                           char *err, size_t errcap)
{
    const char *t = getenv("QUOTAGATE_WEBHOOK_TIMEOUT_MS");
    struct timeval tv = {0, 100000};
    char why[512];
    qg__sender *sd = calloc(1, sizeof *sd);
    if (!sd) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    sd->s = s;
    sd->n = n;
    snprintf(sd->owner, sizeof sd->owner, "%s", owner);
    sd->timeout_ms = t && atoi(t) > 0 ? atoi(t) : 10000;
    if (!(sd->ob = qg__outbox_open(s->ledger, err, errcap)))
        goto fail;
    /* rows this instance held when it was killed are free again */
    if (qg__outbox_release(sd->ob, sd->owner, why, sizeof why) != QG_OK) {
        snprintf(err, errcap, "%s", why);
        goto fail;
    }
    if (!(sd->base = event_base_new()) ||
        !(sd->tick = event_new(sd->base, -1, EV_PERSIST, on_tick, sd)) ||
        event_add(sd->tick, &tv) != 0) {
        snprintf(err, errcap, "cannot set up the webhook sender's loop");
        goto fail;
    }
    if (pthread_create(&sd->thread, NULL, sender_main, sd) != 0) {
        snprintf(err, errcap, "cannot start the webhook sender's thread");
        goto fail;
    }
    sd->started = 1;
    return sd;
fail:
    qg__sender_free(sd);
    return NULL;
}

void qg__sender_free(qg__sender *sd)
{
    if (!sd)
        return;
    if (sd->started) {
        atomic_store(&sd->stop, 1);
        pthread_join(sd->thread, NULL);
    }
    for (int i = 0; i < sd->nups; i++)
        qg__upstream_free(sd->ups[i].u);
    if (sd->tick)
        event_free(sd->tick);
    if (sd->base)
        event_base_free(sd->base);
    qg__outbox_close(sd->ob);
    free(sd);
}
