/* server.h - the gateway process: shared state of `quotagate serve` and
 * the handlers of its routes (one file per route group: h_decide.c,
 * h_info.c, h_admin.c).  Internal to src/server. */
#ifndef QG_SERVER_H
#define QG_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "http.h"
#include "ledger.h"
#include "quotagate.h"
#include <jansson.h>

typedef struct qg_metrics qg_metrics;
typedef struct qg_auth qg_auth;
typedef struct qg__proxy qg__proxy; /* src/proxy/proxy.h */
typedef struct qg_reloader qg_reloader;   /* reload.c */
typedef struct qg__keeper qg__keeper;     /* keeper.c */
typedef struct qg_watcher qg_watcher;     /* watch.c */

/* qg_serve_opts and qg_serve are public (quotagate.h). */

typedef struct qg_server {
    qg_serve_opts opts;
    qg_engine *engine;
    qg_store *store;
    qg_ledger *ledger;
    qg_http_server *http;
    qg_metrics *metrics;
    qg_auth *auth;
    qg__proxy *proxy;            /* the metering proxy (always set up:
                                    models may name their own upstream) */
    char *upstream_key;          /* $QUOTAGATE_UPSTREAM_KEY at start, or
                                    NULL: the proxy's credential */
    qg_reloader *reloader;       /* loads rules off the workers */
    qg__keeper *keeper;          /* a shared store's keeper, or NULL */
    qg_watcher *watcher;         /* a shared ledger's subjects, or NULL */
    _Atomic int store_down;      /* the shared store did not answer:
                                    decisions are local (keeper.c) */
    _Atomic unsigned store_reports;  /* failed store calls reported */
    _Atomic int store_lost;      /* it lost its data: rebuilt first */
    _Atomic uint64_t fallback_decisions;
    qg_store_lane **lanes;       /* per worker: the store's lane (gate.c) */
    unsigned char *lane_failed;  /* per worker: the store made none */
    int nlanes;
    pthread_mutex_t reload_mu;   /* one reload at a time */
    int64_t wall0_ms;            /* CLOCK_REALTIME at start */
    int64_t mono0_ms;            /* CLOCK_MONOTONIC at start */
    int64_t rebuild_ms;          /* how long the rebuild took */
    uint64_t rebuild_rows;
    uint64_t rebuild_clamped;    /* rows with amounts beyond the bounds */
    uint64_t rebuild_skipped;    /* rows that could not be replayed */
    _Atomic uint64_t reloads, reload_failures;
    struct qg__reconciler *reconciler;  /* reconciler.c */
    pthread_mutex_t reconcile_mu;       /* one reconciliation at a time */
    _Atomic uint64_t reconcile_runs;
    _Atomic uint64_t reconcile_drifted; /* windows drifted, last run */
    _Atomic int64_t reconcile_max_drift;/* milli, last run */
    struct qg__notify *notify;          /* notifications (notify.h) */
    struct qg__pace *pace;       /* subjects' recent usage (pace.h) */
} qg_server;
/* Reconcile the gateway's counters against its ledger (reconcile_run.c,
 * docs/reconcile.md): blocks for the run (never call it on a worker);
 * counts it in the metrics and logs a warning per drifted window.
 * Returns as qg__reconcile (src/core/reconcile.h). */
/* One request's charge from the ledger, the explain JSON (explain.c,
 * PRODUCT.md 8): the rules read again from rules_path, the subject's and
 * its org's rows before it replayed into a fresh engine.  0 with *out
 * (caller owns it), QG_ENOTFOUND (no such request), QG_ERULES, QG_EINVAL
 * (the row's plan or org is not in the rules), QG_EIO, QG_ENOMEM; err
 * says why.  Blocks for the ledger reads. */
int qg__explain(qg_ledger *l, const char *rules_path, const char *request_id,
                json_t **out, char *err, size_t errcap);
void qg__h_admin_request(qg_server *s, qg_http_req *r, const char *subject);

int qg__server_reconcile(qg_server *s, const char *subject, int repair,
                         qg_reconcile_report **out, char *err, size_t errcap);
/* The reconciler (reconciler.c): a thread of its own that runs the rules'
 * periodic reconciliation (reconcile.every) and the admin route's, and
 * answers the latter on its worker.  new: NULL when out of memory;
 * request: r held until answered, 0 or QG_ENOMEM (answer r then); free:
 * after the HTTP server stopped. */
struct qg__reconciler *qg__reconciler_new(qg_server *s);
int qg__reconciler_request(struct qg__reconciler *rc, qg_http_req *r,
                           const char *subject, int repair);
void qg__reconciler_free(struct qg__reconciler *rc);


/* Now, in ms since the epoch: the start's wall time advanced by the
 * monotonic clock (never jumps with wall-clock adjustments). */
int64_t qg__server_now(const qg_server *s);
/* A clock in ms (CLOCK_REALTIME, CLOCK_MONOTONIC). */
int64_t qg__clock_ms(clockid_t id);

/* Reload the rules file; on failure the old rules keep serving and err
 * says why (file:line:column).  Returns 0 or an error.  Blocks for as
 * long as the load takes: the serving threads use the reloader. */
int qg__server_reload(qg_server *s, char *err, size_t errcap);
/* The same, writing into warn ("" none) what the reload changed in the
 * version in force without notice (applied, but warned about). */
int qg__server_reload_warn(qg_server *s, char *err, size_t errcap,
                           char *warn, size_t warncap);

/* The reloader (reload.c): a thread that runs qg__server_reload for the
 * admin route and SIGHUP.  qg__reloader_new starts it (NULL: out of
 * memory or no thread).  qg__reloader_request asks for a load: r, an admin
 * request held until then, is answered on its worker with the outcome of
 * a load that began after the call (200, 400 invalid_rules); r NULL (a
 * SIGHUP) only logs it.  Returns 0, or QG_ENOMEM (r is not taken; answer
 * it).  Thread-safe.  qg__reloader_free waits for a load in progress and
 * stops the thread; call it after qg__http_server_run returned and before
 * the engine goes.  Requests it never loaded for stay held (the HTTP
 * server releases them). */
/* The watcher (watch.c): with a shared ledger, a thread that sets the
 * subjects other instances created or changed in the engine, every 250 ms.
 * new: NULL when out of memory or no thread; free: stops and joins it
 * (before the engine goes). */
qg_watcher *qg__watcher_new(qg_server *s);
void qg__watcher_free(qg_watcher *w);

qg_reloader *qg__reloader_new(qg_server *s);
int qg__reloader_request(qg_reloader *rl, qg_http_req *r);
void qg__reloader_free(qg_reloader *rl);

/* The one dispatcher given to the HTTP layer (routes.c), and the metrics
 * route of a path. */
void qg__server_handle(qg_http_req *r, void *ud);

/* Scrape-time gauges from the parts' statistics (serve.c). */
struct qg_metrics_gauges;
void qg__server_gauges(qg_server *s, const qg_store_stats *st,
                      const qg_ledger_stats *ls, const qg_http_stats *hs,
                      struct qg_metrics_gauges *g);

/* Respond with a typed JSON error {"error": {"type", "message"}}. */
void qg__reply_error(qg_server *s, qg_http_req *r, int status,
                    const char *type, const char *message);
/* Respond 200 (or status) with a malloc'd JSON text, which is freed. */
void qg__reply_json(qg_server *s, qg_http_req *r, int status, char *json,
                   const qg_http_out_header *h, int nh);

/* rows.c: the ledger row of a decision (check rows: status reserved or
 * rejected, reserved = weight when admitted); strnlen-bounded copies; the
 * one mapping of engine errors (QG_E*) to typed HTTP errors. */
void qg__row_copy(char *dst, size_t cap, const char *src);
void qg__row_of_decision(qg_ledger_row *row, const qg_decision *d,
                        const char *rid, const char *subject,
                        int64_t input_tokens, int64_t output_tokens);
/* The settle's columns of row (status qg_row_status, tokens, final charge
 * and overage, settled_ms), plus what the reservation was (admitted at
 * res->decided_at_ms for res->reserved_milli: an insert when its check
 * row never reached the ledger is then still counted), the rest left
 * alone; qg__row_of_settle: a settle-only row of just those, for subject
 * (NULL or "" when the settle does not know it). */
void qg__row_fill_settle(qg_ledger_row *row, const char *rid, int row_status,
                        int64_t input_tokens, int64_t output_tokens,
                        const qg_settle_result *res, int64_t now_ms);
void qg__row_of_settle(qg_ledger_row *row, const char *rid,
                      const char *subject, int row_status,
                      int64_t input_tokens, int64_t output_tokens,
                      const qg_settle_result *res, int64_t now_ms);
/* The restore request that replays row (strings borrowed from it), the
 * one used by the start's rebuild, the keeper's rebuild after a loss and
 * reconciliation. */
void qg__row_restore_req(const qg_ledger_row *row, qg_restore_req *rr);
/* A restore request against the bounds: 0 as is, 1 clamped, -1 skip; why
 * says what (rows.c). */
int qg__row_in_bounds(qg_restore_req *rr, char *why, size_t cap);
/* msg with what helps next: an unknown subject says how subjects are
 * created, an unknown model lists the models (buf, or msg itself). */
const char *qg__engine_error_hint(qg_server *s, int rc, const char *msg,
                                  char *buf, size_t cap);
void qg__reply_engine_error(qg_server *s, qg_http_req *r, int rc,
                           const char *msg);

/* reqid.c: request ids the counters do not remember, answered from the
 * ledger (docs/decisions.md, "Idempotency").
 *
 * qg__server_check: qg_engine_check, but for an id the counters do not
 * remember the ledger's row decides first: another subject's is
 * QG_EINVAL; an admitted request of the same subject is a replay filled
 * from the row (whose names *d then points into: `prior` is the caller's
 * buffer and must outlive *d); otherwise the engine decides.  Returns as
 * qg_engine_check, or QG_EIO when the ledger cannot be read (err).
 *
 * qg__server_settle_prior: for a settle the engine did not find
 * (QG_ENOTFOUND): QG_ENOTFOUND again when the ledger has no admitted row
 * either; QG_EINVAL for another subject's id; QG_OK with *res filled: a
 * replay (res->replayed: answer it, nothing to write) or a late settle
 * of a reservation the counters no longer hold (charged to them when
 * inside the reach; *row is its settle-only row, to be completed with
 * qg__row_fill_settle and written); QG_EIO when the ledger cannot be
 * read. */
int qg__server_check(qg_server *s, const qg_check_req *req, int64_t now_ms,
                    qg_decision *d, qg_ledger_row *prior, char *err,
                    size_t errcap);
/* The same on a lane (qg_engine_check_async's rules: QG_PENDING, then
 * done(ud, rc) on the lane's thread; else complete at once). */
int qg__server_check_async(qg_server *s, qg_store_lane *lane,
                           const qg_check_req *req, int64_t now_ms,
                           qg_decision *d, qg_ledger_row *prior, char *err,
                           size_t errcap, qg_engine_done done, void *ud);
int qg__server_settle_prior(qg_server *s, const qg_settle_req *req,
                           int64_t now_ms, qg_settle_result *res,
                           qg_ledger_row *row, char *err, size_t errcap);

/* Route handlers.  `subject` is the caller's subject for subject keys. */
void qg__h_check(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_settle(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_usage(qg_server *s, qg_http_req *r, const char *subject);
/* h_history.c: /v1/usage/history and /v1/usage/requests (the caller's
 * subject), and either for a named subject (requests 0: history). */
void qg__h_history(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_requests(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_usage_history(qg_server *s, qg_http_req *r, const char *subject,
                         int requests);
/* h_forecast.c: the forecast of each of d's views at the subject's pace
 * (fc[0..d->nviews)); a pace the ledger cannot give is none. */
struct qg_forecast;
void qg__usage_forecasts(qg_server *s, const qg_rules *rules,
                         const qg_decision *d, const char *subject,
                         int64_t now_ms, struct qg_forecast *fc);
void qg__h_plans(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_weights(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_healthz(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_metrics(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_console(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_whoami(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_org_usage(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_admin_subjects(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_admin_keys(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_admin_reload(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_admin_reconcile(qg_server *s, qg_http_req *r, const char *subject);
/* GET /v1/authz (forward-auth): authenticates its own caller from
 * X-Quotagate-Key, so its route is open (h_authz.c). */
void qg__h_authz(qg_server *s, qg_http_req *r, const char *subject);
/* The metering proxy (h_proxy.c, docs/proxy.md): POST /v1/chat/completions
 * and POST /v1/messages with a subject key. */
void qg__h_proxy_openai(qg_server *s, qg_http_req *r, const char *subject);
void qg__h_proxy_anthropic(qg_server *s, qg_http_req *r, const char *subject);

#endif
