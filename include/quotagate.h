/* quotagate.h - the public interface of the quotagate library.
 *
 * quotagate decides whether a request to an AI service fits every quota
 * window of its subject (member) and of the subject's organisation, charges
 * it atomically when it does, and explains every refusal: which window
 * binds, the exact instant the same request would fit, and how each window
 * recovers.  See docs/architecture.md for the layering.
 *
 * Conventions:
 *  - functions return 0 (QG_OK) or a negative qg_err; qg_strerror() names it;
 *  - times are int64 milliseconds since the Unix epoch (UTC), passed in by
 *    the caller: the library never reads a clock;
 *  - quantities are int64 milli-units: 1 weight point = 1000, 1 request =
 *    1000;
 *  - handles are opaque, created by _new and released by _free; a function
 *    that takes ownership of an argument says so.
 *  - the engine and stores are thread-safe; rules are immutable. */
#ifndef QUOTAGATE_H
#define QUOTAGATE_H

#include <stddef.h>
#include <stdint.h>

#define QG_VERSION "0.1.0"

typedef enum qg_err {
    QG_OK = 0,
    QG_ENOMEM = -1,      /* out of memory */
    QG_EINVAL = -2,      /* invalid argument or request */
    QG_ERULES = -3,      /* rules file unusable */
    QG_ENOSUBJECT = -4,  /* unknown subject and no default plan */
    QG_ENOTFOUND = -5,   /* e.g. settle of an unknown request id */
    QG_EFULL = -6,       /* a bounded table is full of live entries */
    QG_EIO = -7,         /* file or network I/O failed */
    QG_ESTATE = -8,      /* operation not valid in this state */
    QG_ERANGE = -9,      /* a number out of range (overflow) */
    QG_EMODEL = -10,     /* unknown model */
    QG_ESTORE = -11,     /* the counters' store cannot be reached (in
                            time): answered 503 store_unavailable */
    QG_ELEDGER = -12     /* the ledger's database cannot be reached (a
                            shared ledger: its rows go to the spool) */
} qg_err;

/* Not an error: an asynchronous call will complete later, through its
 * callback (qg_engine_check_async and its kin). */
#define QG_PENDING 1

/* Static message for an error code. */
const char *qg_strerror(int rc);

typedef struct qg_rules qg_rules;
typedef struct qg_store qg_store;
typedef struct qg_store_lane qg_store_lane;
typedef struct qg_engine qg_engine;

/* --------------------------------------------------------------- bounds */

/* Every quantity that enters the arithmetic is bounded, so that no sum or
 * product the library forms can overflow int64 (docs/decisions.md,
 * "Bounds"):
 *  - a token count of one request (input, output, max output):
 *    QG_TOKENS_MAX (10^12 tokens);
 *  - one request's weight, any window limit or burst, and every sum a
 *    window, a reservation or a rebuild can reach: QG_AMOUNT_MAX_MILLI
 *    (10^15 points).  Inputs beyond it are refused (QG_ERANGE); sums
 *    saturate at it, and a window whose usage reached it refuses every
 *    request of positive weight until that usage expires or resets;
 *  - a price, a spending cap and a spent amount: QG_MONEY_MAX_MICRO
 *    (10^12 USD), spent amounts saturating likewise;
 *  - an instant: 0 (1970) to QG_TIME_MAX_MS (9999-12-31T23:59:59.999Z);
 *    a duration in the rules: at most QG_DURATION_MAX_MS (36500 days).
 * Any two bounded amounts sum to less than 2^62, so one addition followed
 * by a clamp can never wrap; products are formed in 128 bits. */
#define QG_TOKENS_MAX INT64_C(1000000000000)
#define QG_AMOUNT_MAX_MILLI INT64_C(1000000000000000000)
#define QG_MONEY_MAX_MICRO INT64_C(1000000000000000000)
#define QG_TIME_MAX_MS INT64_C(253402300799999)
#define QG_DURATION_MAX_MS (INT64_C(36500) * 86400000)

/* ---------------------------------------------------------------- names */

#define QG_NAME_MAX 64          /* plan, window, model, org names (bytes,
                                   with the terminating NUL) */
#define QG_MAX_MODELS 64        /* models of a rules file */
#define QG_MAX_PLAN_WINDOWS 16  /* windows per plan or org, incl.
                                   concurrency */

typedef enum qg_win_type {
    QG_WIN_ROLLING = 1,
    QG_WIN_CALENDAR,
    QG_WIN_SESSION,
    QG_WIN_RATE,
    QG_WIN_CONCURRENCY
} qg_win_type;

/* What a window counts: weight points, or requests (1000 milli each). */
typedef enum qg_unit { QG_UNIT_WEIGHT = 0, QG_UNIT_REQUESTS = 1 } qg_unit;

/* ---------------------------------------------------------------- views */

#define QG_MAX_VIEWS 32     /* member + org windows of one decision */
#define QG_MAX_RECOVERY 4   /* recovery steps reported per window */

/* What a client sees of one window at one instant. */
typedef struct qg_window_view {
    const char *name;         /* window name, owned by the rules */
    qg_win_type type;
    qg_unit unit;
    int org;                  /* 1 when the window is the organisation's */
    int64_t limit_milli;
    int64_t used_milli;
    int64_t remaining_milli;  /* max(0, limit - used) */
    int64_t reset_at_ms;      /* when used next falls: calendar period end,
                                 rolling oldest expiry, session end, rate
                                 bucket full, earliest lease expiry; 0 when
                                 nothing is used */
    int64_t period_ms;        /* calendar: the current period's length (it
                                 ends at reset_at_ms); 0 when not known
                                 (other types; a store that does not say) */
} qg_window_view;

/* At at_ms, the window's remaining allowance becomes remaining_milli. */
typedef struct qg_recovery_point {
    int64_t at_ms;
    int64_t remaining_milli;
} qg_recovery_point;

/* ---------------------------------------------------------------- rules */

/* Read and validate a rules file, resolving time zones from the system's
 * zoneinfo.  On success returns 0 and *out (caller frees it with
 * qg_rules_free, unless it is handed to qg_engine_new).  On failure returns
 * QG_ERULES or QG_EIO and writes "path:line:column: what was expected" to
 * err. */
int qg_rules_load(const char *path, qg_rules **out, char *err, size_t errcap);
void qg_rules_free(qg_rules *r);
const char *qg_rules_version(const qg_rules *r);
/* Versions over time (PRODUCT.md 8): a rules file of several documents
 * loads as a chain of versions in the order they take effect, the handle
 * being the first.  qg_rules_at: the version in force at t_ms (the last
 * whose effective instant is <= t_ms), NULL when none is yet; the result
 * is owned by the chain.  qg_rules_next: the version after r, NULL for the
 * last.  qg_rules_effective_ms: when r takes effect (0: from the
 * beginning). */
const qg_rules *qg_rules_at(const qg_rules *r, int64_t t_ms);
const qg_rules *qg_rules_next(const qg_rules *r);
int64_t qg_rules_effective_ms(const qg_rules *r);
/* The file the rules came from, and the name of their weight unit
 * ("weight points"): both owned by the rules. */
const char *qg_rules_path(const qg_rules *r);
const char *qg_rules_unit(const qg_rules *r);
/* Index of a model or a subject listed in the rules; -1 when absent. */
int qg_rules_find_model(const qg_rules *r, const char *name);
int qg_rules_find_subject(const qg_rules *r, const char *name);
/* 1 when a check for this subject would be decided with these rules: it is
 * listed, or the rules have a default plan. */
int qg_rules_admits_subject(const qg_rules *r, const char *name);

/* ------------------------------------------------------ numbers and times */

/* Decimal text ("12", "0.25"; no exponent) with at most scale_digits
 * fractional digits into an integer scaled by 10^scale_digits: 0, -1 bad
 * syntax, -2 too many fractional digits, -3 overflow.  A leading '-' is
 * accepted (callers refuse negatives). */
int qg_fixed_parse(const char *s, size_t len, int scale_digits, int64_t *out);
/* A scaled integer as decimal text without trailing zeros ("2.5", "3");
 * at most cap bytes with the NUL; returns the length written. */
size_t qg_fixed_format(int64_t v, int scale_digits, char *buf, size_t cap);
/* Durations as the rules write them ("90s", "30m", "5h", "7d", "250ms"):
 * parse returns 0, -1 on bad syntax or -3 on overflow (zero is accepted);
 * format writes the shortest exact form ("1h30m") and returns its
 * length. */
int qg_duration_parse(const char *s, size_t len, int64_t *out_ms);
size_t qg_duration_format(int64_t ms, char *buf, size_t cap);
/* ISO 8601 instants: parse "2026-01-31T09:00:00Z", "...+02:00" or
 * "2026-01-31" (midnight UTC), fractions of a second accepted, returning 0
 * or -1; format "2026-01-31T09:00:00Z" (".250Z" when ms != 0). */
int qg_iso8601_parse(const char *s, int64_t *out_ms);
void qg_iso8601_format(int64_t ms, char *buf, int cap);

/* ---------------------------------------------------------------- store */

typedef struct qg_memory_opts {
    int shards;                /* power of two; 0 = 256, halved while
                                  a shard would keep < 1024 ids */
    uint32_t max_reservations; /* idempotency memory: request ids kept;
                                  0 = 524288 */
    int prefault;              /* nonzero: make that memory resident now
                                  (76 MiB at the default), so that its page
                                  faults, and the kernel's huge-page
                                  compaction, happen here and not under the
                                  first decisions' locks; serve sets it */
} qg_memory_opts;

/* The in-process store: sharded counters, thread-safe.  opts may be NULL. */
qg_store *qg_store_memory_new(const qg_memory_opts *opts);
void qg_store_free(qg_store *s);

/* Counters in Redis or Valkey (docs/redis-store.md): every decision is
 * one server-side script execution on one node, so any number of
 * gateways on the same Redis behave as one.  url is
 * "redis://HOST[:PORT][/DB]"; the password, when one is needed, comes
 * from the environment (QUOTAGATE_REDIS_PASSWORD).  Returns NULL with
 * the reason in err (unreachable server, malformed URL, rules outside the
 * store's exact range).  Store I/O failures are QG_ESTORE, data loss
 * QG_ESTATE (see qg_store_redis_data_lost); details in
 * qg_store_redis_error. */
typedef struct qg_redis_opts {
    const qg_rules *rules;     /* rules to check and script at once (the
                                  engine's); NULL: at first use */
    int server_time;           /* 1: decide at Redis's clock (TIME), now_ms
                                  is only the estimate; 0: at now_ms */
    int64_t request_id_ttl_ms; /* how long request ids are remembered;
                                  0: the rules' reach (at least every
                                  lease) plus an hour */
    int timeout_ms;            /* connect and reply timeout; 0: 1000 */
    int64_t library_keep_ms;   /* a Function library of other rules
                                  (another version's) is deleted from a
                                  node once nobody loaded it there for
                                  this long (an instance still running it
                                  loads it again); 0: 24 hours, < 0:
                                  never */
} qg_redis_opts;

/* opts may be NULL (server time, defaults). */
qg_store *qg_store_redis_new(const char *url, const qg_redis_opts *opts,
                             char *err, size_t errcap);
/* The last error's message (owned by the store; "" when none). */
const char *qg_store_redis_error(qg_store *s);
/* 1 when the data set behind the store is not the one its counters were
 * built on (qg:epoch changed: a flush, a restart without persistence):
 * checks answer QG_ESTATE until the counters are rebuilt from the ledger
 * (qg_engine_restore) and the loss accepted. */
int qg_store_redis_data_lost(qg_store *s);
int qg_store_redis_accept_loss(qg_store *s);

typedef struct qg_redis_counters {
    uint64_t round_trips;      /* times the store waited for replies */
    uint64_t commands;         /* commands sent */
    uint64_t script_loads;     /* SCRIPT LOAD after NOSCRIPT */
    uint64_t voids;            /* admissions taken back (an id of another
                                  tag, or a loss noticed) */
    uint64_t void_rollbacks;   /* of those, taken back by a rollback (the
                                  entities changed meanwhile), not exactly */
    uint64_t lookups;          /* ids answered from another tag */
    uint64_t period_retries;   /* calendar periods recomputed */
    uint64_t libraries_deleted;/* old rules versions' Function libraries
                                  deleted (library_keep_ms) */
} qg_redis_counters;
void qg_store_redis_counters(qg_store *s, qg_redis_counters *out);

typedef struct qg_store_stats {
    const char *backend;
    uint64_t subjects;         /* members and orgs with state */
    uint64_t reservations;     /* request ids remembered */
    uint64_t reservations_live;/* reserved and not yet settled */
    uint64_t bytes;            /* heap bytes held for counters and ids */
} qg_store_stats;
void qg_store_stats_get(qg_store *s, qg_store_stats *out);

#define QG_STORE_SHARED 1u     /* other processes decide on the same
                                  counters: never replay the ledger into
                                  them at start */
#define QG_STORE_PERSISTENT 2u /* the counters outlive this process */
unsigned qg_store_flags(const qg_store *s);
/* The store's name ("memory", "redis", "redis-cluster"). */
const char *qg_store_name(const qg_store *s);
/* Is the store there?  0, QG_ESTORE (not reached in time), QG_ESTATE (it
 * lost its data).  A store in this process always is. */
int qg_store_probe(qg_store *s);

/* A lane: one thread's context for the asynchronous calls below, the
 * store's connections on that thread's event loop (loop: a libevent
 * struct event_base *).  Returns NULL and leaves err empty when the store
 * needs none (its calls complete at once; pass NULL as the lane), NULL
 * with a message in err when it cannot be made.  Free it on its thread,
 * before the loop (pending calls complete with an error first). */
qg_store_lane *qg_store_lane_new(qg_store *s, void *loop, char *err,
                                 size_t errcap);
void qg_store_lane_free(qg_store *s, qg_store_lane *l);

/* --------------------------------------------------------------- engine */

/* An engine decides with `rules` (ownership passes to the engine) against
 * `store` (borrowed; must outlive the engine).  Subjects listed in the
 * rules are registered.  Returns NULL on out of memory, or for a store
 * built against another version of the store contract. */
qg_engine *qg_engine_new(qg_rules *rules, qg_store *store);
void qg_engine_free(qg_engine *e);
const qg_rules *qg_engine_rules(const qg_engine *e);
/* The version of the engine's rules in force at t_ms (the first when none
 * is yet: what names and settings a caller shows); owned by the engine,
 * valid as long as it lives. */
const qg_rules *qg_engine_rules_at(const qg_engine *e, int64_t t_ms);

/* 1 when checks for this subject would be decided: it is registered, or
 * the rules have a default plan; 0 otherwise. */
int qg_engine_knows_subject(qg_engine *e, const char *subject);

/* Create or update a subject.  org may be NULL; billing_anchor_ms 0 = none.
 * Returns QG_EINVAL with a message in err for an unknown plan or org. */
int qg_engine_set_subject(qg_engine *e, const char *subject, const char *plan,
                          const char *org, int64_t billing_anchor_ms,
                          char *err, size_t errcap);

/* The registered members of organisation `org` (static subjects and
 * those set since), in no particular order: *names gets a malloc'ed
 * array of *n malloc'ed names, at most `cap` of them (free both with
 * qg_engine_names_free), and *total (may be NULL) how many there are in
 * all.  Thread-safe (each registry shard is read under its lock).
 * Returns 0, QG_ENOTFOUND when the rules have no such org (nothing
 * allocated), or QG_ENOMEM. */
int qg_engine_org_members(qg_engine *e, const char *org, size_t cap,
                          char ***names, size_t *n, size_t *total);
void qg_engine_names_free(char **names, size_t n);

#define QG_DEFAULT_OUTPUT_ESTIMATE 1024 /* when max_output_tokens is absent */
#define QG_REQUEST_ID_MAX 255

typedef struct qg_check_req {
    const char *subject;        /* required */
    const char *request_id;     /* required, globally unique, <= 255 bytes */
    const char *model;          /* NULL: a weight-only check */
    int64_t input_tokens;       /* model checks: >= 0 */
    int64_t max_output_tokens;  /* model checks: -1 = the estimate above */
    int64_t weight_milli;       /* weight-only checks: >= 0 */
} qg_check_req;

typedef enum qg_outcome {
    QG_NONE = 0,                /* usage views only */
    QG_ALLOW = 1,
    QG_REJECT = 2,              /* retryable after retry_after_ms */
    QG_REJECT_NEVER = 3         /* no window could ever admit it */
} qg_outcome;

typedef struct qg_decision {
    qg_outcome outcome;
    int replayed;               /* answered from idempotency memory */
    int64_t weight_milli;       /* the request's weight (reserved if allowed) */
    int64_t decided_at_ms;      /* when it was decided (original, on replay) */
    int64_t retry_after_ms;     /* QG_REJECT: from now until it would fit */
    int binding;                /* index in views of the binding window, -1 */
    const char *plan;           /* names owned by the engine's rules */
    const char *org;            /* NULL when the subject has none */
    const char *model;          /* NULL for weight-only checks */
    const char *rules_version;
    const char *weights_version;
    int64_t anchor_ms;          /* the member's billing anchor, 0 = none */
    /* Pay as you go (overage policy payg, docs/decisions.md): admitted
     * beyond the limits of the windows the policy lifts. */
    int64_t overage_milli;      /* weight beyond the lifted windows' room */
    int64_t overage_cost_micro; /* its price, micro-USD (rounded up) */
    int64_t overage_price_micro;/* micro-USD per unit (point) */
    int64_t headroom_milli;     /* room left in the lifted windows when
                                   admitted; -1 when no window was lifted */
    int cap_reached;            /* refused: the spending cap would be passed */
    int64_t spent_micro;        /* payg: spent in the current cap period */
    int64_t spending_cap_micro; /* payg: the cap, 0 = none */
    int64_t cap_period_end_ms;  /* payg: when the spent amount resets */
    int nviews;
    qg_window_view views[QG_MAX_VIEWS];
    int nrecovery[QG_MAX_VIEWS]; /* filled on refusals */
    qg_recovery_point recovery[QG_MAX_VIEWS][QG_MAX_RECOVERY];
} qg_decision;

/* Decide and, when allowed, reserve.  A known request_id returns the
 * original decision (replayed = 1) and charges nothing.  Refusals are not
 * remembered: they charge nothing, so a retry is decided afresh.
 * Returns 0 with *out filled (whatever the outcome), or an error
 * (QG_EINVAL bad request, QG_ENOSUBJECT, QG_EMODEL, QG_EFULL too many
 * unsettled reservations), with a message in err when err is non-NULL. */
int qg_engine_check(qg_engine *e, const qg_check_req *req, int64_t now_ms,
                    qg_decision *out, char *err, size_t errcap);

/* n checks at one instant, each decided exactly as qg_engine_check
 * decides it, in order: reqs[i]'s answer in outs[i], its return code in
 * rcs[i] (no messages: call qg_engine_check for one).  The memory of
 * the next few requests (4) is loaded together before the first of them
 * is decided, so that one request's cache misses overlap another's: for
 * a caller holding several requests at once (docs/architecture.md).  n
 * may be any size; QG_CHECK_MANY_MAX is the batch the benchmark and the
 * tests hand over.  Returns how many rcs are not 0. */
#define QG_CHECK_MANY_MAX 16
int qg_engine_check_many(qg_engine *e, size_t n, const qg_check_req *reqs,
                         int64_t now_ms, qg_decision *outs, int *rcs);

typedef enum qg_settle_status {
    QG_SETTLE_COMPLETED = 1,
    QG_SETTLE_CANCELLED = 2,    /* partial usage still counts */
    QG_SETTLE_FAILED = 3        /* charged per the tokens given (base only
                                   when they are 0) */
} qg_settle_status;

typedef struct qg_settle_req {
    const char *request_id;
    qg_settle_status status;
    int64_t input_tokens;       /* model checks */
    int64_t output_tokens;
    int64_t weight_milli;       /* weight-only checks: actual weight; -1 =
                                   keep the reserved weight */
    int no_charge;              /* nothing counts (actual 0, not even the
                                   per-request base): e.g. the upstream
                                   refused the call with 429 */
    const char *subject;        /* NULL, or the subject the settle names:
                                   it must be the reservation's (QG_EINVAL
                                   otherwise, nothing changes) */
} qg_settle_req;

typedef struct qg_settle_result {
    int replayed;               /* already settled: the original result */
    int late;                   /* the lease had expired: the reservation was
                                   final, only a larger charge is applied */
    int64_t reserved_milli;
    int64_t actual_milli;       /* weight of the reported usage */
    int64_t charged_milli;      /* what finally counts */
    int64_t decided_at_ms;
    qg_settle_status status;
    int64_t overage_milli;      /* payg: of charged_milli, beyond the room */
    int64_t overage_cost_micro; /* its price */
} qg_settle_result;

/* Replace a reservation with the actual usage.  QG_ENOTFOUND for a
 * request id that was never admitted or has been forgotten; QG_EINVAL
 * when req->subject names another subject than the reservation's. */
int qg_engine_settle(qg_engine *e, const qg_settle_req *req, int64_t now_ms,
                     qg_settle_result *out, char *err, size_t errcap);

/* Swap in new rules (ownership passes to the engine on success; on
 * failure the caller keeps them).  Registered subjects keep their plan and
 * org by name; rules that drop a plan or org in use are refused with
 * QG_EINVAL and a message.  Decisions in flight finish on the old rules. */
int qg_engine_reload(qg_engine *e, qg_rules *rules, char *err, size_t errcap);

/* How far back (ms) a charge can still count in some window of the current
 * rules: a rebuild reads the ledger from now minus this. */
int64_t qg_engine_reach_ms(const qg_engine *e);

/* Rebuild after a restart: re-apply a charge recorded in the ledger
 * (unconditionally, at its original instant) and remember its request id.
 * Call in the order of decided_at_ms, before serving. */
typedef struct qg_restore_req {
    const char *subject;
    const char *request_id;
    const char *model;          /* NULL or "" for weight-only */
    int64_t decided_at_ms;
    int64_t reserved_milli;
    int64_t charged_milli;      /* the settled weight, or the reserved one */
    int settled;                /* 0: unsettled reservation, holds a lease */
    qg_settle_status status;    /* when settled */
    int64_t headroom_milli;     /* payg (the row's overage columns): -1 none */
    int64_t overage_price_micro;
    int64_t overage_cost_micro; /* counted in the spent amount of its period */
    int charge_only;            /* only charge (e.g. what a late settle adds
                                   to a reservation the counters no longer
                                   hold): the id is neither looked up nor
                                   remembered */
} qg_restore_req;
int qg_engine_restore(qg_engine *e, const qg_restore_req *req, char *err,
                      size_t errcap);

/* 1 when the counters remember request_id (a check of it is a replay or
 * another subject's error, a settle finds it), 0 when they do not: never
 * seen, refused (refusals are not remembered), or forgotten (the memory
 * is bounded, and a restart rebuilds only the rules' reach).  What the
 * counters forgot, the ledger still knows: the server asks it then. */
int qg_engine_remembers(qg_engine *e, const char *request_id);

/* Current views of a subject's windows (outcome QG_NONE, with recovery
 * schedules).  QG_ENOSUBJECT for an unknown subject. */
int qg_engine_usage(qg_engine *e, const char *subject, int64_t now_ms,
                    qg_decision *out);

/* The same three on a lane (qg_store_lane_new), for a store across a
 * network: many decisions in flight on one thread.  Each returns
 * QG_PENDING when done(ud, rc) will run later, on the lane's thread from
 * its event loop, with out filled and err written then; or completes at
 * once with 0 or an error, and done is not called (the libuv rule: a
 * callback is never called when its call returned an error).  req's
 * strings need not outlive the call; out and err must live until done.
 * A lane of NULL (or a store without asynchronous calls) always
 * completes at once. */
typedef void (*qg_engine_done)(void *ud, int rc);
int qg_engine_check_async(qg_engine *e, qg_store_lane *lane,
                          const qg_check_req *req, int64_t now_ms,
                          qg_decision *out, char *err, size_t errcap,
                          qg_engine_done done, void *ud);
int qg_engine_settle_async(qg_engine *e, qg_store_lane *lane,
                           const qg_settle_req *req, int64_t now_ms,
                           qg_settle_result *out, char *err, size_t errcap,
                           qg_engine_done done, void *ud);
int qg_engine_usage_async(qg_engine *e, qg_store_lane *lane,
                          const char *subject, int64_t now_ms,
                          qg_decision *out, qg_engine_done done, void *ud);

/* Checks and settles sent on lanes whose callers have not yet been told
 * (their done not yet returned): qg_engine_calls_mark starts a new
 * generation and returns the one before it; qg_engine_calls_left how
 * many calls of a generation are still in flight.  Once none is left,
 * every call sent before the mark has been answered to its caller (a
 * reconciliation waits so for the rows of decisions on their way:
 * docs/reconcile.md).  One marker at a time. */
unsigned qg_engine_calls_mark(qg_engine *e);
long qg_engine_calls_left(const qg_engine *e, unsigned mark);

/* -------------------------------------------------- the store down */

/* While a shared store does not answer (PRODUCT.md 5.1 point 4, `down:
 * local`), decisions are made locally with conservative limits: per
 * window share (milli, 1..1000) x what it had left in the last view this
 * engine saw of the subject (its whole limit when it saw none), no
 * recovery during the outage; rates at share x their rate, concurrency at
 * share x its slots (at least 1).  Enable the notes of the last views
 * once (max_subjects members and orgs; 0: 262144); then check_local and
 * settle_local decide and settle without the store, every admission is
 * journalled, and local_drain hands the journal to fn (oldest first) as
 * restores of the store once it answers again (fn returns 0 to go on);
 * an emptied journal ends the outage's local state.  settle_local is
 * QG_ENOTFOUND for a request not admitted locally. */
int qg_engine_fallback_enable(qg_engine *e, uint32_t max_subjects);
int qg_engine_check_local(qg_engine *e, const qg_check_req *req,
                          int64_t now_ms, int64_t share_milli,
                          qg_decision *out, char *err, size_t errcap);
int qg_engine_settle_local(qg_engine *e, const qg_settle_req *req,
                           int64_t now_ms, qg_settle_result *out, char *err,
                           size_t errcap);
int qg_engine_local_knows(qg_engine *e, const char *request_id);
int qg_engine_local_drain(qg_engine *e,
                          int (*fn)(const qg_restore_req *rr, void *ud),
                          void *ud);
uint64_t qg_engine_local_pending(qg_engine *e);
uint64_t qg_engine_local_decisions(qg_engine *e);
/* The hand-over back to the store, atomic with the journal: close
 * returns 1 and ends local decisions when the journal is empty (then
 * check_local is QG_ESTATE: ask the store), else 0 (drain again); open
 * starts a new outage's (a store call just failed). */
int qg_engine_local_close(qg_engine *e);
void qg_engine_local_open(qg_engine *e);

/* ------------------------------------------------------------- API keys */

/* API keys ("qgk_<id>_<secret>") are kept in the ledger's database as
 * SHA-256 hashes only: a new key is shown once, by qg_keyring_create, and
 * never again.  A keyring is the ledger's key store opened on its own
 * (the CLI's `quotagate keys`); a running server may use the same
 * database at the same time.  Not thread-safe: one thread per keyring. */
typedef struct qg_keyring qg_keyring;

#define QG_API_KEY_MAX 64       /* a key's length, with the NUL */

typedef struct qg_key_info {
    char id[32];                /* public part, e.g. "3f09a1c2b4d5" */
    char role[16];              /* "subject", "admin" or "service" */
    char subject[256];          /* "" for admin and service keys */
    int64_t created_ms;
    int64_t revoked_ms;         /* 0 while the key is valid */
} qg_key_info;

/* Open the key store of the ledger at url ("sqlite:PATH", or a path).
 * log (may be NULL) receives the ledger's warnings, one line each.
 * Returns NULL with the reason in err. */
qg_keyring *qg_keyring_open(const char *ledger_url,
                            void (*log)(void *ud, const char *line),
                            void *log_ud, char *err, size_t errcap);
void qg_keyring_close(qg_keyring *k);
/* 1 when role is "subject", "admin" or "service". */
int qg_keyring_role_valid(const char *role);
/* Create a key for role and subject (required for "subject", NULL or ""
 * for the others), durable on return; the key goes to key_out (cap at
 * least QG_API_KEY_MAX), its description to *info.  Returns 0, QG_EINVAL
 * (role, subject or cap), QG_EIO. */
int qg_keyring_create(qg_keyring *k, const char *role, const char *subject,
                      int64_t now_ms, char *key_out, size_t cap,
                      qg_key_info *info);
/* Every key in creation order; fn's non-zero return stops the listing and
 * is returned. */
int qg_keyring_list(qg_keyring *k,
                    int (*fn)(const qg_key_info *key, void *ud), void *ud);
/* Revoke the key with this id (the first revocation time stays); *info
 * (may be NULL) describes it afterwards.  0 or QG_ENOTFOUND. */
int qg_keyring_revoke(qg_keyring *k, const char *id, int64_t now_ms,
                      qg_key_info *info);

/* --------------------------------------------------------- reconcile */

/* Counters against the ledger (PRODUCT.md 5.2, docs/reconcile.md): at one
 * instant, every window of every subject and org with ledger rows inside
 * the rules' reach, the usage the ledger implies (its admitted rows
 * replayed into a fresh in-process store, as a rebuild replays them)
 * against the store's counter.  drift = store - ledger. */
#define QG_RECONCILE_IDS_MAX 1000   /* request ids listed per window */

typedef struct qg_reconcile_drift {
    char subject[256];          /* "" for an org's window */
    char org[64];               /* the org, or the subject's; "" none */
    char window[64];
    qg_unit unit;
    int64_t ledger_milli;       /* what the ledger's rows imply */
    int64_t store_milli;        /* what the store's counter holds */
    int64_t drift_milli;        /* store - ledger */
    int nrequest_ids;           /* ledger rows the store does not know */
    char **request_ids;         /* (owned by the report) */
} qg_reconcile_drift;

typedef struct qg_reconcile_report {
    int64_t at_ms;              /* the instant compared (the first cut) */
    uint64_t checked;           /* windows compared */
    uint64_t subjects, orgs;    /* entities compared */
    int ndrifted;               /* windows beyond the tolerance */
    qg_reconcile_drift *drifted;
    int repair;                 /* a repair was asked for */
    int repaired;               /* ... and afterwards every drifted
                                   window held the ledger's figure */
    int64_t max_drift_milli;    /* the largest |drift| found, 0 none */
    int64_t duration_ms;        /* how long the run took */
} qg_reconcile_report;

void qg_reconcile_report_free(qg_reconcile_report *r);

/* The report as the JSON of PRODUCT.md 5.2: {"at", "checked", "drifted":
 * [{"subject", "org", "window", "ledger", "store", "drift",
 * "request_ids"}], "repaired"}.  A malloc'd string (caller frees), NULL on
 * out of memory. */
char *qg_reconcile_json(const qg_reconcile_report *r);

/* `quotagate reconcile`: a shared store (redis:// or redis-cluster://)
 * against a ledger, from outside the gateways. */
typedef struct qg_reconcile_opts {
    qg_rules *rules;            /* loaded; owned by qg_reconcile from the
                                   call, whatever it returns */
    const char *store_url;
    const char *ledger_url;
    const char *subject;        /* NULL: every subject */
    int repair;
} qg_reconcile_opts;

/* Run it.  Returns 0 with *out (free it with qg_reconcile_report_free),
 * or an error with the reason in err: QG_EINVAL (a store this cannot
 * reach from outside, e.g. memory), QG_ENOSUBJECT (--subject unknown to
 * the rules and the ledger), QG_ESTORE (the store cannot be reached),
 * QG_EIO (the ledger cannot be read), QG_ENOMEM. */
int qg_reconcile(const qg_reconcile_opts *opts, qg_reconcile_report **out,
                 char *err, size_t errcap);

/* -------------------------------------------------------------- explain */

/* `quotagate explain`: one request's charge reconstructed from the ledger
 * at ledger_url ("sqlite:PATH" or a PostgreSQL URL) under the rules file
 * at rules_path: the JSON of PRODUCT.md 8 (docs/cli.md "explain").
 * Returns 0 with *json_out (a malloc'd string, caller frees), or
 * QG_ENOTFOUND (no such request id), QG_EIO (the ledger cannot be opened
 * or read), QG_ERULES, QG_EINVAL (the row's plan or org is not in the
 * rules), QG_ENOMEM, with the reason in err. */
int qg_explain(const char *ledger_url, const char *rules_path,
               const char *request_id, char **json_out, char *err,
               size_t errcap);

/* -------------------------------------------------------------- serve */

/* `quotagate serve`: the gateway process (docs/operations.md). */
typedef struct qg_serve_opts {
    const char *rules_path;
    qg_rules *rules;             /* already loaded from rules_path (owned
                                    by qg_serve from the call), or NULL */
    const char *listen;          /* HOST:PORT, default 127.0.0.1:8080 */
    const char *data_dir;        /* default ./var */
    const char *ledger_url;      /* default sqlite:DATA/ledger.db */
    const char *store_url;       /* "memory" (default) */
    const char *upstream;        /* the proxy's upstream URL, or NULL */
    int workers;                 /* HTTP worker threads, default 2 */
    int header_timeout_ms;
    int idle_timeout_ms;
    int min_body_rate;           /* bytes/s, 0: the HTTP layer's default */
    int max_connections;         /* 0: from the file-descriptor limit */
    int max_conns_per_client;    /* 0: half of max_connections, -1: none */
    size_t max_body_bytes;
    int ledger_async;            /* opt into asynchronous settles */
    int ledger_flush_ms;
    uint32_t request_ids;        /* ids the memory store remembers; 0 =
                                    its default (store's max_reservations) */
    int ledger_cache_mb;         /* the most the SQLite ledger writer's
                                    page cache grows to; 0: 64 MiB */
} qg_serve_opts;

/* Run the gateway until SIGTERM/SIGINT (blocks).  Returns the process's
 * exit status: 0 after a clean stop, 1 on a failure while serving, 2 for
 * unusable options (with a message on stderr). */
int qg_serve(const qg_serve_opts *opts);

#endif
