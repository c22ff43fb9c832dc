/* gate.h - admission and settlement: the one sequence that every route
 * that decides runs (/v1/check and /v1/settle in h_decide.c, /v1/authz in
 * h_authz.c, the metering proxy in h_proxy.c).
 *
 * Admission is two steps so that a route may decide more than once before
 * anything is recorded (the proxy's downgrade and queue policies):
 *   qg__gate_decide  back-pressure (the ledger's own bound), then the
 *                    engine's decision, with the ledger answering for
 *                    request ids the counters forgot (reqid.c);
 *   qg__gate_record  the decision counted in the metrics and its ledger
 *                    row queued (nobody waits for a check row).
 * Settlement is one step, qg__gate_settle: the engine's settle, the
 * ledger's answer for ids the counters forgot, the recovery of a
 * reservation lost in a crash when the settle names its subject, the
 * metrics, and the settle's row, which the caller may wait for.
 *
 * Decisions and settles may be a round trip to a remote store: they go
 * out on the worker's lane (qg_store_lane, made on first use on each
 * worker) and their callbacks run on that worker, from its event loop.
 * With the memory store they complete at once, and the callbacks run
 * before the call returns.  Every function runs on the worker thread
 * that holds the request. */
#ifndef QG_GATE_H
#define QG_GATE_H

#include "headers.h"
#include "ledger.h"
#include "server.h"

#define QG_GATE_ERRCAP 320

typedef struct qg__admit qg__admit;
/* The decision is made (a->rc says whether a->d is one). */
typedef void (*qg__admit_done)(qg__admit *a, void *ud);

/* One admission: the request, and what was decided. */
struct qg__admit {
    /* in */
    qg_check_req req;            /* its strings are copied by decide */
    int64_t row_output_tokens;   /* the row's output tokens (the estimate
                                    the reservation was made for) */
    int estimated;               /* the row's token counts are estimates */
    /* out */
    int rc;                      /* QG_OK, or an engine error for
                                    qg__reply_engine_error (err says) */
    char err[QG_GATE_ERRCAP];
    int64_t now_ms;              /* the instant it was decided at */
    qg_decision d;
    qg_ledger_row prior;         /* a replay answered from the ledger:
                                    d's names point into it */
    int fallback;                /* decided locally: the store was down */
    /* private: the copies req points to, the callback */
    char subject[256], request_id[QG_REQUEST_ID_MAX + 1];
    char model[QG_NAME_MAX];
    qg_server *s;
    int worker;
    struct event_base *base;
    int retried;                 /* the store call was sent again once */
    qg__admit_done done;
    void *ud;
};

/* Decide a->req on r's worker: then done(a, ud), at once (before this
 * returns) or later from the worker's loop.  a must live until done;
 * done may free it.  a->rc QG_EFULL "the ledger is behind" when the
 * writer's backlog is at its bound, QG_EIO when the store cannot be
 * reached. */
void qg__gate_decide(qg_server *s, qg_http_req *r, qg__admit *a,
                     qg__admit_done done, void *ud);
/* The same from a worker's own thread without a request (the proxy's
 * held calls): worker's lane on base. */
void qg__gate_decide_on(qg_server *s, int worker, struct event_base *base,
                        qg__admit *a, qg__admit_done done, void *ud);

/* Count the decision and queue its ledger row (not for a replay, which
 * was recorded when first decided).  window, when non-NULL, replaces the
 * row's binding window (the proxy's "downgraded:NAME"). */
void qg__gate_record(qg_server *s, const qg__admit *a, const char *window);

/* The rate-limit headers of the decision (hb->n 0 when they cannot be
 * written). */
void qg__gate_headers(qg_server *s, const qg__admit *a, qg_hdr_buf *hb);

/* The status words of a settle and their ledger row status: one table
 * for every route.  parse: -1 for an unknown word. */
int qg__settle_status_parse(const char *word);
int qg__row_status_of(qg_settle_status st);

/* One settlement, as the gate keeps it (its own copy of the strings). */
typedef struct qg__settle {
    /* in */
    qg_settle_req req;           /* request_id, status, tokens, weight,
                                    no_charge, subject */
    const char *model;           /* a lost reservation's model, or NULL */
    int recover;                 /* may record a lost reservation (needs
                                    req.subject; /v1/settle) */
    int estimated;               /* the row's token counts are estimates */
    const char *detail;          /* the row's detail, or NULL */
    const char *row_subject;     /* the subject the row names when the
                                    settle does not (the proxy's) */
    /* out, in done */
    int rc;                      /* QG_OK, an engine error, or after the
                                    row: QG_EIO (not durable), QG_ESTATE
                                    (the ledger's guard refused it) */
    char err[QG_GATE_ERRCAP];
    int64_t now_ms;
    qg_settle_result res;
    int recovered;               /* the reservation was lost: recorded */
    int answered;                /* settled before: res is the original
                                    answer, nothing was written */
    int stopping;                /* the server is stopping: done runs on
                                    the ledger's thread and may only
                                    release what it holds */
    qg_ledger_row row;
    /* private */
    char rid_buf[QG_REQUEST_ID_MAX + 1], subject_buf[256];
    char model_buf[QG_NAME_MAX], row_subject_buf[256], detail_buf[160];
    qg_server *s;
    int worker;
    void (*done)(struct qg__settle *st, void *ud);
    void *ud;
} qg__settle;

/* Called once with the gate's copy st (freed after it returns): st->rc
 * says how it ended.  Runs on `worker`, except with st->stopping. */
typedef void (*qg__settle_done)(qg__settle *st, void *ud);

/* Settle proto->req (copied; proto may go at once).  With done NULL
 * nobody waits: the row is queued once the settle is applied (the proxy,
 * forward-auth), and a failure is logged.  With done: done runs once the
 * row is durable, or with the error that stopped it (an engine error, a
 * ledger behind: QG_EFULL, which a waiting caller is refused with while
 * the ledger is at its bound).  Returns 0, or QG_ENOMEM (done is then not
 * called). */
int qg__gate_settle(qg_server *s, const qg__settle *proto, int worker,
                    struct event_base *base, qg__settle_done done, void *ud);

/* The worker's lane of the store (NULL for a store that needs none),
 * made on first use; base is the worker's event base. */
qg_store_lane *qg__gate_lane(qg_server *s, int worker,
                             struct event_base *base);

#endif
