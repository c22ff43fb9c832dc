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
 * Every function runs on the worker thread that holds the request; when
 * decisions become asynchronous (a remote store), this file is where the
 * round trip goes, and the callbacks below are where its answer lands. */
#ifndef QG_GATE_H
#define QG_GATE_H

#include "headers.h"
#include "ledger.h"
#include "server.h"

#define QG_GATE_ERRCAP 320

/* One admission: the request, and what was decided. */
typedef struct qg__admit {
    /* in */
    qg_check_req req;
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
} qg__admit;

/* Decide a->req now (fills a's outputs; a->rc says whether *a->d is a
 * decision).  QG_EFULL "the ledger is behind" when the writer's backlog
 * is at its bound. */
void qg__gate_decide(qg_server *s, qg__admit *a);

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

typedef struct qg__settle qg__settle;
/* Called on the worker that settled, once the row is durable (rc QG_OK),
 * could not be written (QG_EIO), or was refused by the ledger's guard
 * (QG_ESTATE: another request's row holds the id). */
typedef void (*qg__settle_done)(qg__settle *st, int rc, void *ud);

struct qg__settle {
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
    /* out */
    int rc;                      /* QG_OK, or an engine error */
    char err[QG_GATE_ERRCAP];
    int64_t now_ms;
    qg_settle_result res;
    int recovered;               /* the reservation was lost: recorded */
    int answered;                /* settled before: res is the original
                                    answer, nothing was written */
    int stopping;                /* in done: the server is stopping, done
                                    runs on the ledger's thread and may
                                    only release what it holds */
    qg_ledger_row row;
    /* private */
    qg_server *s;
    int worker;
    qg__settle_done done;
    void *ud;
};

/* Settle st->req now (a caller who waits is refused with QG_EFULL while
 * the ledger is behind; a settle nobody waits for never is).  On QG_OK
 * the row is queued: with done NULL nobody
 * waits for it (the proxy and forward-auth; st may be freed at once),
 * else done(st, rc, ud) runs on `worker` once it is durable, and st must
 * live until then (/v1/settle answers only then).  done is never called
 * when this returns an error or st->answered is set. */
int qg__gate_settle(qg_server *s, qg__settle *st, int worker,
                    qg__settle_done done, void *ud);

#endif
