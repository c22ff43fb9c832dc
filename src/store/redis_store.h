/* redis_store.h - what the Redis store's two files share: store_redis.c
 * (the store object, its rules versions and epochs, the method table, the
 * synchronous calls) and redis_ops.c (every operation as a small state
 * machine over the asynchronous link, redis_link.h).  Internal to them.
 *
 * One transport.  Every operation runs on a lane: a link (one node or a
 * Cluster) on one thread's event loop.  The HTTP workers each own a lane
 * and have many operations in flight on it; the synchronous methods
 * (the keeper's probe and charge-back, a rebuild, the tests) run the same
 * operation on the store's own lane and event loop, one caller at a time,
 * looping until it is done.  So a check is the same commands whichever
 * way it is called, and a Cluster works for every operation.
 *
 * Threads.  A lane is used by one thread at a time.  What lanes share
 * (the rules versions, the data set's epochs, the loss flag, the last
 * error) is under the store's mutex; the counters are atomic. */
#ifndef QG_REDIS_STORE_H
#define QG_REDIS_STORE_H

#include <pthread.h>
#include <stdint.h>
#include "calendar.h"
#include "redis_link.h"
#include "redis_script.h"
#include "store.h"

#define QG__RS_DEFAULT_TIMEOUT_MS 1000
#define QG__RS_ATTEMPTS 8            /* script re-runs of one operation
                                      * (periods, moves) */
#define QG__RS_SLOTS 4               /* replies one step waits for */

/* Where this process's recent admissions live, by request id: a settle
 * that names no subject finds its reservation's place here and needs one
 * round trip instead of two (GET the index first).  Direct-mapped, a
 * newer id overwrites; a stale or wrong place only costs the lookup it
 * would have cost anyway (the script answers "not found" there). */
#define QG__RS_PLACES 8192           /* a power of two */
typedef struct qg__rs_placed {
    qg_key rid;
    int used;
    qg__rs_place p;
} qg__rs_placed;

/* A per-node epoch key seen in a Cluster ("qg:epoch:{TAG}") and its value. */
typedef struct qg__rs_epoch {
    char key[32];
    char val[33];
} qg__rs_epoch;

typedef struct redis_store {
    qg_store base;
    pthread_mutex_t mu;          /* the fields down to err */
    qg__rs_version *versions, *cur;
    char epoch[33];              /* one node: qg:epoch's value */
    int have_epoch;
    qg__rs_epoch *epochs;        /* a Cluster: every node's seen */
    int nepochs, capepochs;
    int lost;                    /* the data set changed: QG_ESTATE */
    char err[256];               /* the last failure, for a log line */

    char *url, *password;
    int cluster;                 /* redis-cluster:// */
    int timeout_ms, server_time;
    int64_t rid_ttl_opt;
    int64_t lib_keep_ms;         /* other versions' libraries kept this
                                    long after their last load; < 0:
                                    forever (redis_ops.c, prune) */
    char claim_sha[41];
    int no_fcall;                /* atomic: the server has no FCALL (or
                                    may not use it): EVALSHA instead */
    qg_tz *utc;
    qg_redis_counters cnt;       /* atomic */

    pthread_mutex_t placed_mu;   /* placed */
    qg__rs_placed *placed;       /* QG__RS_PLACES entries */

    pthread_mutex_t sync_mu;     /* the synchronous calls' lane */
    struct event_base *sync_base;
    qg_store_lane *sync_lane;
} redis_store;

/* A script or Function library this lane asked a node to load: while the
 * load is in flight (pending), a NOSCRIPT or "Function not found" from
 * that node is answered by sending the command again behind it on the
 * same connection, not by another load: a burst of decisions after a
 * restart, SCRIPT FLUSH or FUNCTION FLUSH costs one load per node. */
#define QG__RS_LOADS 16
#define QG__RS_LIB_KEEP_MS (24 * 3600 * 1000LL)
#define QG__RS_NAME_MAX 48       /* a SHA1 (EVALSHA), "qg_" SHA1 (FCALL) */
typedef struct qg__rs_load {
    char node[QG__RLINK_ADDR_MAX];
    char sha[QG__RS_NAME_MAX];   /* the name the command calls */
    int pending;                 /* 1 in flight, 0 done, -1 unused */
} qg__rs_load;

struct qg_store_lane {
    redis_store *s;
    qg__rlink *link;
    struct event_base *base;
    uint64_t ops;                /* operations in flight */
    qg__rs_load loads[QG__RS_LOADS];
    int next_load;               /* the entry a new load replaces */
};

/* Counters (qg_redis_counters fields). */
#define QG__RS_COUNT(s, field, n) \
    __atomic_fetch_add(&(s)->cnt.field, (uint64_t)(n), __ATOMIC_RELAXED)

/* Under the store's mutex: the last error, and the version of rules r
 * (scripted at first use).  version_of returns 0 or QG_EINVAL (no rules)
 * / QG_ERANGE / QG_ENOMEM with the reason in s->err. */
void qg__rs_set_err(redis_store *s, const char *fmt, const char *a);
int qg__rs_version_of(redis_store *s, const qg_rules *r, qg__rs_version **out);
int64_t qg__rs_rid_ttl(const redis_store *s, const qg__rs_version *v);

/* The epochs.  Returns 1 when val differs from what was seen for key
 * (the data set was lost), else records it and returns 0.  key NULL: the
 * single node's qg:epoch. */
int qg__rs_epoch_note(redis_store *s, const char *key, const char *val);

/* Open a lane (a link on base). */
qg_store_lane *qg__rs_lane_open(redis_store *s, struct event_base *base,
                                char *err, size_t errcap);
void qg__rs_lane_close(qg_store_lane *l);

/* The operations (redis_ops.c): each returns QG_PENDING and calls
 * done(ud, rc) once from the lane's loop, or fails at once (done not
 * called).  in is copied; out must live until done. */
int qg__rs_op_check(qg_store_lane *l, const qg_store_check *in,
                    qg_decision *out, qg_store_done done, void *ud);
int qg__rs_op_settle(qg_store_lane *l, const qg_store_settle *in,
                     qg_settle_result *out, qg_store_done done, void *ud);
int qg__rs_op_usage(qg_store_lane *l, const qg_store_usage *in,
                    qg_decision *out, qg_store_done done, void *ud);
int qg__rs_op_restore(qg_store_lane *l, const qg_store_restore *in,
                      qg_store_done done, void *ud);
/* *found: 1 when the request id is remembered. */
int qg__rs_op_known(qg_store_lane *l, qg_key rid, int *found,
                    qg_store_done done, void *ud);
/* Read (creating where absent) the data set's epoch(s): 0, QG_ESTORE, or
 * QG_ESTATE when one changed.  fresh: forget what was seen first (a loss
 * accepted). */
int qg__rs_op_probe(qg_store_lane *l, int fresh, qg_store_done done, void *ud);

#endif
