/* ledger_outbox.c - the front of the webhook outbox (ledger.h, "the
 * webhook outbox"): a handle per thread on the backend's outbox methods
 * (ledger_backend.h), the arguments checked once here, and the one
 * derivation of an event's id.
 *
 * The id is the webhook-id every attempt carries, so it must be the same
 * whoever creates the event and however often it is sent: it is derived
 * from what makes the event unique, never drawn at random.  SHA-256 over
 * type, subject, window, threshold, period and the mark's episode (how
 * many times the mark fired), the first 16 bytes in hex after "msg_". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_front.h"

struct qg_outbox {
    const qg__ledger_outbox_ops *ops;
    void *ob;
};

static void outbox_id(const qg_outbox_event *ev, int64_t episode, char *id)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char key[1024];
    int n = snprintf(key, sizeof key, "%s%c%s%c%s%c%lld%c%lld%c%lld",
                     ev->type, 0, ev->subject, 0, ev->window, 0,
                     (long long)ev->threshold_milli, 0,
                     (long long)ev->period_key, 0, (long long)episode);
    if (n < 0 || (size_t)n >= sizeof key)
        n = (int)sizeof key - 1;
    EVP_Digest(key, (size_t)n, md, &mdlen, EVP_sha256(), NULL);
    memcpy(id, "msg_", 4);
    for (int i = 0; i < 16; i++) {
        id[4 + 2 * i] = hex[md[i] >> 4];
        id[5 + 2 * i] = hex[md[i] & 15];
    }
    id[36] = '\0';
}

qg_outbox *qg__outbox_open(qg_ledger *l, char *err, size_t errcap)
{
    qg_outbox *o;
    if (!l || !l->be->outbox) {
        snprintf(err, errcap, "ledger: this backend keeps no outbox");
        return NULL;
    }
    if (!(o = calloc(1, sizeof *o))) {
        snprintf(err, errcap, "ledger: out of memory");
        return NULL;
    }
    o->ops = l->be->outbox;
    if (!(o->ob = o->ops->open(l->b, err, errcap))) {
        free(o);
        return NULL;
    }
    return o;
}

void qg__outbox_close(qg_outbox *o)
{
    if (!o)
        return;
    o->ops->close(o->ob);
    free(o);
}

int qg__outbox_fire(qg_outbox *o, qg_outbox_event *ev,
                    const char *const *urls, int nurls, int *fired,
                    char *why, size_t whycap)
{
    why[0] = '\0';
    *fired = 0;
    if (!o || !ev || !urls || nurls <= 0 || !ev->subject[0] ||
        !ev->window[0] || !ev->type[0])
        return QG_EINVAL;
    return o->ops->fire(o->ob, ev, urls, nurls, fired, outbox_id, why,
                        whycap);
}

int qg__outbox_rearm(qg_outbox *o, const char *subject, const char *window,
                     int64_t threshold_milli, char *why, size_t whycap)
{
    why[0] = '\0';
    if (!o || !subject || !window)
        return QG_EINVAL;
    return o->ops->rearm(o->ob, subject, window, threshold_milli, why,
                         whycap);
}

int qg__outbox_claim(qg_outbox *o, const char *owner, int64_t now_ms,
                     int64_t lease_ms, qg_outbox_event *out, int max,
                     int *n, char *why, size_t whycap)
{
    why[0] = '\0';
    *n = 0;
    if (!o || !owner || !out || max <= 0 || lease_ms <= 0)
        return QG_EINVAL;
    return o->ops->claim(o->ob, owner, now_ms, lease_ms, out, max, n, why,
                         whycap);
}

int qg__outbox_release(qg_outbox *o, const char *owner, char *why,
                       size_t whycap)
{
    why[0] = '\0';
    if (!o || !owner)
        return QG_EINVAL;
    return o->ops->release(o->ob, owner, why, whycap);
}

int qg__outbox_delivered(qg_outbox *o, const char *id, const char *url,
                         int64_t now_ms, char *why, size_t whycap)
{
    why[0] = '\0';
    if (!o || !id || !url)
        return QG_EINVAL;
    return o->ops->finish(o->ob, id, url, 1, now_ms, NULL, why, whycap);
}

int qg__outbox_retry(qg_outbox *o, const char *id, const char *url,
                     int64_t next_ms, int attempts, const char *error,
                     char *why, size_t whycap)
{
    why[0] = '\0';
    if (!o || !id || !url)
        return QG_EINVAL;
    return o->ops->retry(o->ob, id, url, next_ms, attempts,
                         error ? error : "", why, whycap);
}

int qg__outbox_give_up(qg_outbox *o, const char *id, const char *url,
                       int64_t now_ms, const char *error, char *why,
                       size_t whycap)
{
    why[0] = '\0';
    if (!o || !id || !url)
        return QG_EINVAL;
    return o->ops->finish(o->ob, id, url, 2, now_ms, error ? error : "",
                          why, whycap);
}

int qg__outbox_backlog(qg_outbox *o, int64_t *pending, int64_t *oldest_ms,
                       char *why, size_t whycap)
{
    why[0] = '\0';
    *pending = *oldest_ms = 0;
    if (!o)
        return QG_EINVAL;
    return o->ops->backlog(o->ob, pending, oldest_ms, why, whycap);
}
