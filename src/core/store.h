/* store.h - where counters live: the store method table.
 *
 * The engine resolves a request (subject -> plan, org, weight) and hands
 * the store one self-contained instruction; the store applies it to every
 * window of the member and of its org atomically and answers.  Each call is
 * designed to be one round trip to a remote store: a Redis server-side
 * script receives the keys (member, org and request id, in one hash slot by
 * the org's tag) and the window parameters and runs the same arithmetic as
 * src/core/win_*.c.  The in-memory store (store_memory.c) calls those
 * functions directly under a shard lock, and is also the tests' store.
 *
 * Identity is by 128-bit hashes: subjects and orgs by the hash of their
 * name, requests by the hash of their request id. */
#ifndef QG_STORE_H
#define QG_STORE_H

#include <stdint.h>
#include "quotagate.h"
#include "rules.h"

typedef struct qg_key {
    uint64_t hi, lo;
} qg_key;

/* Window state memory lent by a store.  A store may place a rolling ring
 * or a lease array inside its own block (window.h's state then points into
 * it) and mark the capacity with this bit: the window code uses the memory
 * but never frees or reallocates it, and moves to the heap when it needs
 * more.  One block then holds all of an entity's state (one prefetch). */
#define QG_WIN_BORROWED 0x80000000u

/* One decision, fully resolved by the engine. */
typedef struct qg_store_check {
    const qg_rules *rules;      /* the generation plan and orgspec belong
                                   to (a remote store scripts each rules
                                   version once, redis_script.h) */
    qg_key rid;                 /* request id */
    qg_key member;              /* subject */
    qg_key org;                 /* zero when has_org is 0 */
    int has_org;
    const qg_plan *plan;        /* member windows */
    const qg_org_spec *orgspec; /* org windows, NULL when none */
    int model;                  /* model index, -1 weight-only */
    const qg_model *model_spec; /* its weights (settle), NULL weight-only;
                                   rules generations outlive the store's
                                   use of them (engine.c) */
    int64_t weight_milli;
    int64_t anchor_ms;          /* billing anchor (calendar windows) */
    int64_t now_ms;
    /* payg (decide.h): windows lifted, bit i = the decision's window i
     * (member windows, then org windows); 0 = none, the rest unused.  The
     * member's spent amount belongs to the cap period starting at
     * cap_start_ms; a store holding another period's amount resets it. */
    uint32_t payg_mask;
    int64_t price_micro, cap_micro;
    int64_t cap_start_ms, cap_end_ms;
    void **hint;                /* in/out, may be NULL: an opaque pointer the
                                   store may leave for the next check of the
                                   same member (the memory store: its entity)
                                   and verifies before use */
    void **org_hint;            /* the same for the member's org (the
                                   engine caches it per org of a rules
                                   version); NULL: none */
} qg_store_check;

/* One settle: the store finds the reservation by rid. */
typedef struct qg_store_settle {
    qg_key rid;
    int64_t now_ms;
    qg_settle_status status;
    int64_t input_tokens, output_tokens;
    int64_t weight_milli;       /* >= 0 for weight-only reservations */
    int no_charge;              /* actual = 0 whatever the model */
    int has_member;             /* the settle names a subject: it must be */
    qg_key member;              /* the reservation's (else QG_EINVAL) */
    int has_org;                /* has_member: the subject's org now (a */
    qg_key org;                 /* hint: a remote store finds the keys of
                                   the reservation without a lookup) */
} qg_store_settle;

/* Rebuild: re-apply a charge the ledger recorded, without deciding. */
typedef struct qg_store_restore {
    const qg_rules *rules;      /* as in qg_store_check */
    qg_key rid, member, org;
    int has_org;
    const qg_plan *plan;
    const qg_org_spec *orgspec;
    int model;
    const qg_model *model_spec;
    int64_t anchor_ms;
    int64_t at_ms;              /* the original decision's instant */
    int64_t reserved_milli;
    int64_t charged_milli;      /* what counts: actual if settled */
    int settled;                /* 0: still a reservation (holds a lease) */
    int status;                 /* qg_settle_status when settled */
    int64_t headroom_milli;     /* payg: -1 none */
    int64_t price_micro;
    int64_t cost_micro;         /* added to the spent amount of the cap
                                   period starting at cap_start_ms */
    int64_t cap_start_ms;
    int charge_only;            /* charge; the id is not remembered */
} qg_store_restore;

/* The view of one subject. */
typedef struct qg_store_usage {
    const qg_rules *rules;      /* as in qg_store_check */
    qg_key member, org;
    int has_org;
    const qg_plan *plan;
    const qg_org_spec *orgspec;
    int64_t anchor_ms;
    int64_t now_ms;
    int64_t cap_start_ms;       /* payg: report the spent amount of this
                                   cap period; -1 none */
} qg_store_usage;

/* The method table's version: a store built against another contract is
 * refused by qg_engine_new. */
#define QG_STORE_API 4      /* 4: prefetch in steps, prefetch_member */

/* What qg_store_methods.flags may say (also quotagate.h's qg_store_flags):
 *   QG_STORE_SHARED      other processes decide on the same counters: a
 *                        start must not replay the ledger into it (that
 *                        would charge everything twice);
 *   QG_STORE_PERSISTENT  the counters outlive this process;
 *   QG_STORE_SETTLE_ORG  the store's settle reads qg_store_settle.org (a
 *                        remote store: where the reservation's keys
 *                        live), so the engine looks the subject up for
 *                        it; without it a settle leaves the registry
 *                        alone (internal: not in quotagate.h). */
#define QG_STORE_SETTLE_ORG 0x100u

/* The completion of an asynchronous call: exactly once, on the thread of
 * the lane it was made on, from its event loop (never inside the call
 * that took it), with 0 or an error (QG_EIO: the store could not be
 * reached in time). */
typedef void (*qg_store_done)(void *ud, int rc);

#define QG_PREFETCH_ALL (-1)    /* qg_store_methods.prefetch's step */

typedef struct qg_store_methods {
    int api;                    /* QG_STORE_API */
    const char *name;
    unsigned flags;
    /* Decide, charge when allowed, remember the request id.  Fills out's
     * outcome, weight, decided_at, retry_after, binding, views and (on
     * refusal) recovery.  Returns 0 or QG_EFULL / QG_ENOMEM / QG_EINVAL
     * (request id reused by another subject). */
    int (*check)(qg_store *s, const qg_store_check *in, qg_decision *out);
    int (*settle)(qg_store *s, const qg_store_settle *in,
                  qg_settle_result *out);
    int (*usage)(qg_store *s, const qg_store_usage *in, qg_decision *out);
    /* Charge every applicable window at in->at_ms unconditionally and
     * remember the request id (replays after a restart).  A request id
     * already known is left alone.  With in->charge_only: charge, neither
     * look at nor remember the id. */
    int (*restore)(qg_store *s, const qg_store_restore *in);
    /* 1 when the request id is remembered (a replay or a settle would
     * find it), 0 when it is not (never seen, or forgotten). */
    int (*known)(qg_store *s, qg_key rid);
    void (*stats)(qg_store *s, qg_store_stats *out);
    void (*free)(qg_store *s);
    /* Is the store there?  0, or QG_ESTORE (not reached in time) or
     * QG_ESTATE (it lost its data).  NULL: always there. */
    int (*probe)(qg_store *s);
    /* A check or settle of request id rid comes next: start loading the
     * memory it will touch, so that the engine's own work on the request
     * (the subject's lookup) overlaps the cache misses.  In steps: 0, then
     * 1 (what depends on step 0's memory), or QG_PREFETCH_ALL (both at
     * once).  Only a hint: nothing changes.  NULL: nothing to load (a
     * remote store). */
    void (*prefetch)(qg_store *s, qg_key rid, int step);
    /* The same for the state of the member whose hint (qg_store_check.hint)
     * the engine holds, in steps: 0 the state itself, then 1 (once step 0
     * had time to land) what it points at.  hint may be NULL (nothing to
     * load).  NULL: none. */
    void (*prefetch_member)(qg_store *s, const void *hint, int step);

    /* Asynchronous calls, for a store across a network (NULL when the
     * store has none: the engine then calls the synchronous ones).  A lane
     * is one thread's context: the store's connections on that thread's
     * event loop (loop is a libevent struct event_base *), on which many
     * calls are in flight at once.  An asynchronous call returns
     * QG_PENDING (done runs later; in and its pointers need not outlive
     * the call, out must live until done), or completes at once with 0 or
     * an error (done is then not called). */
    qg_store_lane *(*lane_new)(qg_store *s, void *loop, char *err,
                               size_t errcap);
    void (*lane_free)(qg_store *s, qg_store_lane *l);
    int (*check_async)(qg_store *s, qg_store_lane *l,
                       const qg_store_check *in, qg_decision *out,
                       qg_store_done done, void *ud);
    int (*settle_async)(qg_store *s, qg_store_lane *l,
                        const qg_store_settle *in, qg_settle_result *out,
                        qg_store_done done, void *ud);
    int (*usage_async)(qg_store *s, qg_store_lane *l,
                       const qg_store_usage *in, qg_decision *out,
                       qg_store_done done, void *ud);
} qg_store_methods;

/* Every store begins with this. */
struct qg_store {
    const qg_store_methods *m;
};

#endif
