/* notify.h - threshold and forecast notifications (PRODUCT.md 7): what
 * the decision path notices, the thread that turns it into durable
 * events, and the thread that delivers them as Standard Webhooks.
 *
 *   decision path (a worker)     qg__notify_decision: the decision's
 *                                views against the rules' thresholds; a
 *                                crossing not yet seen goes into a
 *                                bounded queue (no database, no lock but
 *                                the queue's, one atomic read per view)
 *   the recorder (notify.c)      takes the queue: builds each event's
 *                                body and fires it in the ledger's outbox
 *                                (qg__outbox_fire: once per subject x
 *                                window x threshold x period, decided by
 *                                the database), re-arms rolling and
 *                                session marks when usage fell below
 *   the sender (notify_send.c)   claims due rows (a lease), signs and
 *                                POSTs them, records the outcome, retries
 *                                with exponential backoff for 24 hours
 *
 * Secrets: each webhook's secret_env is read at start and on every reload
 * ("whsec_" + base64; the decoded bytes are the HMAC key).  A missing or
 * malformed secret fails the start, or the reload (the old rules and
 * secrets stay).  Internal to src/server. */
#ifndef QG_NOTIFY_H
#define QG_NOTIFY_H

#include <stdint.h>

#include "quotagate.h"
#include "rules.h"

typedef struct qg__notify qg__notify;
struct qg_server;

#define QG_NOTIFY_KEY_MAX 256        /* decoded secret bytes */

/* One webhook with its decoded secret. */
typedef struct qg__webhook {
    char url[QG_NOTIFY_URL_MAX];
    unsigned char key[QG_NOTIFY_KEY_MAX];
    size_t keylen;
} qg__webhook;

/* The webhooks of one rules generation. */
typedef struct qg__notify_cfg {
    qg__webhook wh[QG_NOTIFY_MAX_WEBHOOKS];
    int n;
} qg__notify_cfg;

/* What /metrics shows (docs/operations.md, "Webhooks"). */
typedef struct qg__notify_stats {
    uint64_t delivered;          /* attempts answered 2xx */
    uint64_t rejected;           /* answered, not 2xx: retried */
    uint64_t unreachable;        /* no answer (refused, reset, timeout) */
    uint64_t expired;            /* given up after 24 hours */
    uint64_t events;             /* events this instance created */
    uint64_t dropped;            /* crossings not queued (queue full) */
    int64_t backlog;             /* rows pending in the outbox (every
                                    instance's, on a shared ledger) */
    int64_t oldest_ms;           /* created_ms of the oldest, 0: none */
} qg__notify_stats;

/* "whsec_" + base64 -> key bytes.  0, or -1 with why. */
int qg__notify_secret(const char *text, unsigned char *key, size_t *keylen,
                      char *why, size_t whycap);
/* The webhooks of rules r with their secrets from the environment.  0,
 * or -1 with a message naming the webhook and the variable. */
int qg__notify_cfg_load(const qg_rules *r, qg__notify_cfg *cfg, char *err,
                        size_t errcap);

/* Start the recorder and the sender on s's ledger with cfg (copied).
 * owner: this instance's stable name (its leases).  NULL with err. */
qg__notify *qg__notify_new(struct qg_server *s, const qg__notify_cfg *cfg,
                           const char *owner, char *err, size_t errcap);
/* Replace the webhooks (a reload that succeeded).  Thread-safe. */
void qg__notify_set_cfg(qg__notify *n, const qg__notify_cfg *cfg);
/* Process what is queued, stop both threads (calls in flight are
 * abandoned: their rows stay pending and are sent again), free. */
void qg__notify_free(qg__notify *n);
void qg__notify_stats_get(qg__notify *n, qg__notify_stats *out);

/* The decision path: decision d of `subject` at now_ms, made or settled
 * (d's views after the charge), against rules r (the engine's current
 * ones, valid during the call).  Never blocks on I/O. */
void qg__notify_decision(qg__notify *n, const qg_rules *r,
                         const qg_decision *d, const char *subject,
                         int64_t now_ms);

/* ------------------------------------------- shared with notify_send.c */

typedef struct qg__sender qg__sender;
qg__sender *qg__sender_new(struct qg_server *s, qg__notify *n,
                           const char *owner, char *err, size_t errcap);
void qg__sender_free(qg__sender *sd);
/* Events were created: claim now rather than at the next poll. */
void qg__sender_wake(qg__sender *sd);
/* A copy of webhook url's entry (key included); 0, or -1 when the
 * current rules no longer list it. */
int qg__notify_webhook(qg__notify *n, const char *url, qg__webhook *out);
/* The sender's counts into n's statistics. */
void qg__notify_count(qg__notify *n, int outcome);
void qg__notify_backlog(qg__notify *n, int64_t pending, int64_t oldest_ms);
/* The pause after the attempts-th failed attempt (1, 2, ...): 2 s, 4 s,
 * 8 s ..., at most an hour; the sender also stops at 24 hours after the
 * event was created (QG_NOTIFY_HORIZON_MS), the last attempt at it. */
#define QG_NOTIFY_HORIZON_MS (24 * 3600000LL)
int64_t qg__notify_backoff_ms(int attempts);
enum { QG_NOTIFY_DELIVERED, QG_NOTIFY_REJECTED, QG_NOTIFY_UNREACHABLE,
       QG_NOTIFY_EXPIRED };

#endif
