/* notify.c - see notify.h: the decision path's half of notifications
 * and the recorder thread that makes events durable.
 *
 * The decision path must not slow down: per view of a decision it
 * compares used with the thresholds (integers) and, only when a
 * threshold is reached (or a rolling or session window may have fallen
 * below one, or forecasts are on), reads one slot of `seen`, a table of
 * 65,536 atomic words that remembers per subject x window x period the
 * highest level this instance already recorded.  A crossing it does not
 * know yet is copied into a bounded queue for the recorder; when the
 * queue is full it is dropped and counted (the next decision of that
 * subject queues it again, the level being still reached).  A slot is a
 * hint, never the authority: two keys sharing a slot only cost extra
 * queueing, and the outbox's marks in the database decide what fires.
 *
 * The recorder thread takes the queue, checks each crossing against the
 * slot once more (64 callers crossing at once queue it 64 times), writes
 * the events through qg__outbox_fire (one transaction each; the mark's
 * key keeps it once across threads, restarts and instances), re-arms
 * the marks of rolling and session windows whose usage fell below them,
 * updates the slot and wakes the sender.
 *
 * A slot: tag (32 bits of the key's hash) | level (8) | forecast sent
 * (1) | the minute the forecast was last judged (23). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include "crossing.h"
#include "phrase.h"
#include "json_text.h"
#include "ledger.h"
#include "notify.h"
#include "headers.h"
#include "server.h"

#define SEEN_SLOTS 65536u
#define QUEUE_MAX 4096

/* One crossing as the decision path saw it. */
typedef struct crossing {
    uint64_t hash;               /* of owner, window, period */
    char owner[300];             /* subject, or "org:NAME" */
    char subject[256], org[64], plan[64], window[64], unit[64];
    int64_t used_milli, limit_milli, remaining_milli, reset_at_ms, now_ms;
    int64_t period_key;
    int rearms;                  /* rolling, session */
    int level;                   /* thresholds reached now */
    int rearm_from;              /* > level: usage fell below thresholds
                                    level..rearm_from-1 (re-arm them) */
    int64_t thr_milli[QG_NOTIFY_MAX_THRESHOLDS];
    int nthr;
    int forecast;                /* the forecast says: runs out first */
    int forecast_judged;         /* a forecast was computed */
    int64_t exhausted_at_ms;
} crossing;

struct qg__notify {
    qg_server *s;
    _Atomic uint64_t *seen;
    pthread_mutex_t mu;          /* guards the queue, cfg, stopping */
    pthread_cond_t cv;
    crossing *q;
    int qlen;
    int stopping;
    qg__notify_cfg cfg;
    pthread_t thread;
    int started;
    qg_outbox *ob;               /* the recorder's handle */
    qg__sender *sender;
    int64_t logged_ms;           /* recorder: last failure logged */
    _Atomic uint64_t n_delivered, n_rejected, n_unreachable, n_expired;
    _Atomic uint64_t n_events, n_dropped;
    _Atomic int64_t backlog, oldest_ms;
};

/* ------------------------------------------------------------ secrets */

int qg__notify_secret(const char *text, unsigned char *key, size_t *keylen,
                      char *why, size_t whycap)
{
    unsigned char buf[QG_NOTIFY_KEY_MAX + 4];
    size_t len, pad = 0;
    int n;
    if (strncmp(text, "whsec_", 6) != 0) {
        snprintf(why, whycap, "expected \"whsec_\" followed by base64");
        return -1;
    }
    text += 6;
    len = strlen(text);
    if (len == 0 || len % 4 != 0 || len / 4 * 3 > sizeof buf) {
        snprintf(why, whycap, "the part after \"whsec_\" is not base64 of "
                 "1 to %d bytes", QG_NOTIFY_KEY_MAX);
        return -1;
    }
    while (pad < 2 && text[len - 1 - pad] == '=')
        pad++;
    n = EVP_DecodeBlock(buf, (const unsigned char *)text, (int)len);
    if (n < 0 || (size_t)n < pad || (size_t)n - pad == 0 ||
        (size_t)n - pad > QG_NOTIFY_KEY_MAX) {
        snprintf(why, whycap, "the part after \"whsec_\" is not valid "
                 "base64");
        return -1;
    }
    *keylen = (size_t)n - pad;
    memcpy(key, buf, *keylen);
    OPENSSL_cleanse(buf, sizeof buf);
    return 0;
}

int qg__notify_cfg_load(const qg_rules *r, qg__notify_cfg *cfg, char *err,
                        size_t errcap)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < r->notify.nwebhooks; i++) {
        const qg_webhook_spec *w = &r->notify.webhooks[i];
        const char *v = getenv(w->secret_env);
        char why[128];
        if (!v || !*v) {
            snprintf(err, errcap, "%s:%d: notifications.webhooks[%d] (%s): "
                     "the environment variable %s that holds its secret "
                     "is not set", qg_rules_path(r), w->line, i, w->url,
                     w->secret_env);
            return -1;
        }
        if (qg__notify_secret(v, cfg->wh[i].key, &cfg->wh[i].keylen, why,
                              sizeof why) < 0) {
            snprintf(err, errcap, "%s:%d: notifications.webhooks[%d] (%s): "
                     "the secret in %s: %s", qg_rules_path(r), w->line, i,
                     w->url, w->secret_env, why);
            return -1;
        }
        snprintf(cfg->wh[i].url, sizeof cfg->wh[i].url, "%s", w->url);
        cfg->n = i + 1;
    }
    return 0;
}

/* ------------------------------------------------------ decision path */

static uint64_t slot_make(uint64_t hash, int level, int fc, int64_t minute)
{
    return (hash >> 32) << 32 | (uint64_t)(level & 0xff) << 24 |
           (uint64_t)(fc & 1) << 23 | ((uint64_t)minute & 0x7fffff);
}
#define SLOT_TAG(v) ((v) >> 32)
#define SLOT_LEVEL(v) ((int)(((v) >> 24) & 0xff))
#define SLOT_FC(v) ((int)(((v) >> 23) & 1))
#define SLOT_MINUTE(v) ((int64_t)((v) & 0x7fffff))

static uint64_t key_hash(const char *owner_prefix, const char *owner,
                         const char *window, int64_t period)
{
    char key[512];
    int n = snprintf(key, sizeof key, "%s%s%c%s%c%lld", owner_prefix, owner,
                     0, window, 0, (long long)period);
    return XXH3_64bits(key, n > 0 && (size_t)n < sizeof key ? (size_t)n
                                                            : sizeof key);
}

static void push(qg__notify *n, const crossing *c)
{
    pthread_mutex_lock(&n->mu);
    if (n->qlen < QUEUE_MAX && !n->stopping) {
        n->q[n->qlen++] = *c;
        pthread_cond_signal(&n->cv);
    } else {
        atomic_fetch_add_explicit(&n->n_dropped, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&n->mu);
}

static void copy(char *dst, size_t cap, const char *src)
{
    qg__row_copy(dst, cap, src ? src : "");
}

void qg__notify_decision(qg__notify *n, const qg_rules *r,
                         const qg_decision *d, const char *subject,
                         int64_t now_ms)
{
    const qg_notify_spec *ns = &r->notify;
    int64_t minute = now_ms / 60000;
    if (!n || ns->nwebhooks == 0 || !subject || d->replayed ||
        (d->outcome != QG_ALLOW && d->outcome != QG_NONE))
        return;
    for (int i = 0; i < d->nviews && i < QG_MAX_VIEWS; i++) {
        const qg_window_view *v = &d->views[i];
        int level, rearms = qg__crossing_rearms(v->type), judge = 0;
        int64_t period;
        uint64_t h, cur;
        crossing c;
        qg_pace pace;

        if (!qg__crossing_applies(v->type) || v->limit_milli <= 0)
            continue;
        level = qg__crossing_level(ns->thresholds_milli, ns->nthresholds,
                                   v->used_milli, v->limit_milli);
        if (level == 0 && !rearms && !ns->forecast)
            continue;               /* the common case: nothing to see */
        period = qg__crossing_period(v);
        h = key_hash(v->org ? "org:" : "", v->org ? d->org : subject,
                     v->name, period);
        cur = atomic_load_explicit(&n->seen[h % SEEN_SLOTS],
                                   memory_order_relaxed);
        memset(&c, 0, sizeof c);
        if (SLOT_TAG(cur) == h >> 32) {
            int sl = SLOT_LEVEL(cur);
            judge = ns->forecast && !SLOT_FC(cur) &&
                    SLOT_MINUTE(cur) != (minute & 0x7fffff);
            if (level < sl && rearms) {
                /* fell below: lowered here at once, so that the next
                 * crossing is queued even before the recorder re-arms
                 * (it does so first: the queue is in order) */
                uint64_t nv = slot_make(h, level, level ? SLOT_FC(cur) : 0,
                                        SLOT_MINUTE(cur));
                if (!atomic_compare_exchange_strong(
                        &n->seen[h % SEEN_SLOTS], &cur, nv))
                    continue;           /* another worker saw it first */
                c.rearm_from = sl;
            } else if (level == sl && !judge) {
                continue;
            } else if (level < sl && !judge) {
                continue;
            }
        } else {
            judge = ns->forecast;
            if (level == 0 && !judge)
                continue;
        }
        if (judge && v->used_milli > 0) {
            const qg_window_spec *w = qg__view_spec(r, d, v);
            int64_t start = w ? qg__crossing_start(w, d->anchor_ms, now_ms,
                                                   v->reset_at_ms) : -1;
            if (start >= 0) {
                c.forecast_judged = 1;
                c.forecast = qg__forecast_pace(v->used_milli,
                                               v->limit_milli, start, now_ms,
                                               v->reset_at_ms, &pace);
                c.exhausted_at_ms = pace.exhausted_at_ms;
            }
        }
        if (judge && !c.forecast && !c.rearm_from) {
            /* judged: not again this minute (unless a level changes) */
            int sl = SLOT_TAG(cur) == h >> 32 ? SLOT_LEVEL(cur) : 0;
            uint64_t nv = slot_make(h, sl, 0, minute);
            atomic_compare_exchange_strong(&n->seen[h % SEEN_SLOTS], &cur,
                                           nv);
            if (level == sl)
                continue;
        }
        c.hash = h;
        snprintf(c.owner, sizeof c.owner, "%s%.*s", v->org ? "org:" : "",
                 (int)sizeof c.org - 1, v->org ? d->org : subject);
        copy(c.subject, sizeof c.subject, subject);
        copy(c.org, sizeof c.org, d->org);
        copy(c.plan, sizeof c.plan, d->plan);
        /* the window's one name (phrase.c): "org.NAME" for an org's */
        qg__phrase_window_name(v->name, v->org, c.window, sizeof c.window);
        copy(c.unit, sizeof c.unit, qg__json_unit_of(v, r->unit));
        c.used_milli = v->used_milli;
        c.limit_milli = v->limit_milli;
        c.remaining_milli = v->remaining_milli;
        c.reset_at_ms = v->reset_at_ms;
        c.now_ms = now_ms;
        c.period_key = period;
        c.rearms = rearms;
        c.level = level;
        c.nthr = ns->nthresholds;
        memcpy(c.thr_milli, ns->thresholds_milli, sizeof c.thr_milli);
        push(n, &c);
    }
}

/* ---------------------------------------------------------- recorder */

static void rec_log(qg__notify *n, const char *what, const char *why)
{
    int64_t now = qg__clock_ms(CLOCK_MONOTONIC);
    if (now - n->logged_ms < 10000)
        return;
    n->logged_ms = now;
    fprintf(stderr, "quotagate: notifications: %s: %s (retried at the "
            "next decision that reaches it)\n", what, why);
}

/* The JSON body of c's event (threshold_milli 0: quota.forecast). */
static int body_of(const crossing *c, int64_t threshold_milli,
                   qg_outbox_event *ev)
{
    json_t *data = json_object(), *root = json_object();
    char *text;
    int rc = -1;
    if (!data || !root)
        goto out;
    json_object_set_new(data, "subject", json_string(c->subject));
    json_object_set_new(data, "org", c->org[0] ? json_string(c->org)
                                               : json_null());
    json_object_set_new(data, "plan", json_string(c->plan));
    json_object_set_new(data, "window", json_string(c->window));
    json_object_set_new(data, "threshold", threshold_milli > 0
                        ? qg__json_scaled(threshold_milli, 3) : json_null());
    json_object_set_new(data, "used", qg__json_milli(c->used_milli));
    json_object_set_new(data, "limit", qg__json_milli(c->limit_milli));
    json_object_set_new(data, "remaining", qg__json_milli(c->remaining_milli));
    json_object_set_new(data, "unit", json_string(c->unit));
    json_object_set_new(data, "reset_at", qg__json_time(c->reset_at_ms));
    json_object_set_new(data, "exhausted_at",
                        c->forecast_judged || c->forecast
                            ? qg__json_time(c->exhausted_at_ms)
                            : json_null());
    json_object_set_new(root, "type", json_string(ev->type));
    json_object_set_new(root, "timestamp", qg__json_time(c->now_ms));
    json_object_set_new(root, "data", data);
    data = NULL;
    if ((text = qg__json_dump_steal(root)) &&
        strlen(text) < sizeof ev->body) {
        snprintf(ev->body, sizeof ev->body, "%s", text);
        rc = 0;
    }
    root = NULL;
    free(text);
out:
    json_decref(data);
    json_decref(root);
    return rc;
}

/* Fire one event of c; 0, or -1 (logged). */
static int fire(qg__notify *n, const crossing *c, const char *type,
                int64_t threshold_milli, int64_t period_key,
                const char *const *urls, int nurls)
{
    qg_outbox_event ev;
    char why[512];
    int fired = 0;
    memset(&ev, 0, sizeof ev);
    snprintf(ev.type, sizeof ev.type, "%s", type);
    snprintf(ev.subject, sizeof ev.subject, "%s", c->owner);
    snprintf(ev.window, sizeof ev.window, "%s", c->window);
    ev.threshold_milli = threshold_milli;
    ev.period_key = period_key;
    ev.created_ms = c->now_ms;
    if (body_of(c, threshold_milli, &ev) < 0) {
        rec_log(n, "an event's body", "out of memory or too long");
        return -1;
    }
    if (qg__outbox_fire(n->ob, &ev, urls, nurls, &fired, why, sizeof why) !=
        QG_OK) {
        rec_log(n, "cannot write an event to the outbox", why);
        return -1;
    }
    if (fired)
        atomic_fetch_add(&n->n_events, 1);
    return 0;
}

static void record(qg__notify *n, const crossing *c, const char *const *urls,
                   int nurls)
{
    _Atomic uint64_t *slot = &n->seen[c->hash % SEEN_SLOTS];
    uint64_t cur = atomic_load(slot);
    int match = SLOT_TAG(cur) == c->hash >> 32;
    int from = match ? SLOT_LEVEL(cur) : 0, fc = match && SLOT_FC(cur);
    int ok = 0;
    char why[512];

    if (c->rearm_from > c->level) {
        /* fell below (rolling, session): the next crossing fires again;
         * the decision path lowered the slot already */
        for (int i = c->level; i < c->rearm_from && i < c->nthr; i++)
            if (qg__outbox_rearm(n->ob, c->owner, c->window,
                                 c->thr_milli[i], why, sizeof why) != QG_OK)
                rec_log(n, "cannot re-arm a threshold", why);
        return;
    }
    if (c->level <= from && (!c->forecast || fc))
        return;                         /* recorded meanwhile */
    for (int i = from; i < c->level && i < c->nthr; i++)
        if (fire(n, c, "quota.threshold", c->thr_milli[i], c->period_key,
                 urls, nurls) < 0)
            ok = -1;
    if (c->forecast && !fc) {
        /* once per period: a calendar period, a session (its end) */
        if (fire(n, c, "quota.forecast", 0, c->reset_at_ms, urls, nurls) < 0)
            ok = -1;
        else
            fc = 1;
    }
    if (c->rearms && c->level == 0)
        fc = c->forecast;               /* a new session starts afresh */
    if (ok == 0)                        /* a calendar level never falls */
        atomic_store(slot, slot_make(c->hash, c->rearms || c->level > from
                                                  ? c->level : from,
                                     fc, c->now_ms / 60000));
}

static void *recorder_main(void *arg)
{
    qg__notify *n = arg;
    crossing *batch = malloc(QUEUE_MAX * sizeof *batch);
    for (;;) {
        qg__notify_cfg cfg;
        const char *urls[QG_NOTIFY_MAX_WEBHOOKS];
        int len, stop;
        pthread_mutex_lock(&n->mu);
        while (n->qlen == 0 && !n->stopping)
            pthread_cond_wait(&n->cv, &n->mu);
        len = n->qlen;
        if (batch)
            memcpy(batch, n->q, (size_t)len * sizeof *batch);
        n->qlen = 0;
        stop = n->stopping;
        cfg = n->cfg;
        pthread_mutex_unlock(&n->mu);
        for (int i = 0; i < cfg.n; i++)
            urls[i] = cfg.wh[i].url;
        for (int i = 0; batch && cfg.n > 0 && i < len; i++)
            record(n, &batch[i], urls, cfg.n);
        if (len > 0)
            qg__sender_wake(n->sender);
        if (stop)
            break;
    }
    free(batch);
    return NULL;
}

/* ------------------------------------------------------------- life */

qg__notify *qg__notify_new(qg_server *s, const qg__notify_cfg *cfg,
                           const char *owner, char *err, size_t errcap)
{
    qg__notify *n = calloc(1, sizeof *n);
    if (!n || !(n->seen = calloc(SEEN_SLOTS, sizeof *n->seen)) ||
        !(n->q = malloc(QUEUE_MAX * sizeof *n->q))) {
        if (n)
            free((void *)n->seen);
        free(n);
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    n->s = s;
    n->cfg = *cfg;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    if (!(n->ob = qg__outbox_open(s->ledger, err, errcap)) ||
        !(n->sender = qg__sender_new(s, n, owner, err, errcap)))
        goto fail;
    if (pthread_create(&n->thread, NULL, recorder_main, n) != 0) {
        snprintf(err, errcap, "cannot start the notifications' thread");
        goto fail;
    }
    n->started = 1;
    return n;
fail:
    qg__notify_free(n);
    return NULL;
}

void qg__notify_set_cfg(qg__notify *n, const qg__notify_cfg *cfg)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    n->cfg = *cfg;
    pthread_mutex_unlock(&n->mu);
}

int qg__notify_webhook(qg__notify *n, const char *url, qg__webhook *out)
{
    int rc = -1;
    pthread_mutex_lock(&n->mu);
    for (int i = 0; i < n->cfg.n; i++)
        if (strcmp(n->cfg.wh[i].url, url) == 0) {
            *out = n->cfg.wh[i];
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&n->mu);
    return rc;
}

void qg__notify_free(qg__notify *n)
{
    if (!n)
        return;
    if (n->started) {
        pthread_mutex_lock(&n->mu);
        n->stopping = 1;
        pthread_cond_signal(&n->cv);
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->thread, NULL);
    }
    qg__sender_free(n->sender);
    qg__outbox_close(n->ob);
    OPENSSL_cleanse(&n->cfg, sizeof n->cfg);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n->q);
    free((void *)n->seen);
    free(n);
}

void qg__notify_count(qg__notify *n, int outcome)
{
    _Atomic uint64_t *c[] = {&n->n_delivered, &n->n_rejected,
                             &n->n_unreachable, &n->n_expired};
    if (outcome >= 0 && outcome <= QG_NOTIFY_EXPIRED)
        atomic_fetch_add_explicit(c[outcome], 1, memory_order_relaxed);
}

void qg__notify_backlog(qg__notify *n, int64_t pending, int64_t oldest_ms)
{
    atomic_store(&n->backlog, pending);
    atomic_store(&n->oldest_ms, oldest_ms);
}

void qg__notify_stats_get(qg__notify *n, qg__notify_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!n)
        return;
    out->delivered = atomic_load(&n->n_delivered);
    out->rejected = atomic_load(&n->n_rejected);
    out->unreachable = atomic_load(&n->n_unreachable);
    out->expired = atomic_load(&n->n_expired);
    out->events = atomic_load(&n->n_events);
    out->dropped = atomic_load(&n->n_dropped);
    out->backlog = atomic_load(&n->backlog);
    out->oldest_ms = atomic_load(&n->oldest_ms);
}
