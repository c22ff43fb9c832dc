/* test_server_load.c - `quotagate serve` under concurrent load and crashes.
 *
 * (a) 64 connections (one thread each) charge ONE subject whose plan
 *     allows 500 points in its 5-hour window (800 a week), 20 checks of 1
 *     point each (1280 demanded), each admitted check settled: the
 *     admitted weight, counted from the 200s and read back from
 *     GET /v1/usage/{subject}, is exactly 500; no response ever shows a
 *     window above its limit; every refusal is quota_exceeded on burst_5h.
 * (b) A few threads check (3 points) and mostly settle (2 points) on four
 *     subjects while the server is killed with SIGKILL at random moments,
 *     five times, restarting on the same --data.  The contract: a settle
 *     is acknowledged only once its row is durable; a check's row is
 *     written asynchronously (its settle carries the final charge).  So
 *     after the last restart, every request is replayed twice:
 *     - every settle answered 200 repeats as "replayed" with charged 2,
 *       and its check is "replayed" (zero tolerance);
 *     - a check answered 200 and not settled either survived (replayed,
 *       charges nothing) or was lost (decided afresh, charging 3 once);
 *       the rebuilt usage must lie between the acknowledged charges of
 *       the survivors and that plus what unanswered requests may have
 *       added; the first replay adds exactly 3 per lost check; the
 *       second replay of every acknowledged id is "replayed" and charges
 *       nothing;
 *     - the writer commits rows in order, so a lost check must have been
 *       answered after the last settle acknowledged in its cycle was sent
 *       (only checks from the last moments before a kill are lost), and
 *       lost checks stay under 5% of the open ones.
 * (c) After a kill -9, a settle naming subject and weight for a request id
 *     the server never saw is answered 200 "recovered" and counted, and
 *     survives a further kill -9.
 * Loops are bounded in count and time; loopback only.  The seed of the
 * kill instants is printed (QG_SEED=N reruns one). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "httpc.h"
#include "qgproc.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void start_server(qgproc *p, const char *rules_rel)
{
    const char *td = getenv("QG_TESTDATA");
    char src[1024], w[600];
    if (!td)
        fail_msg("QG_TESTDATA is not set (run through tests/run.sh)");
    if (qgproc_init(p) < 0)
        fail_msg("qgproc_init: %s", p->why);
    snprintf(src, sizeof src, "%s/%s", td, rules_rel);
    if (qgproc_copy_file(src, qgproc_path(p, "rules.yaml")) < 0) {
        qgproc_cleanup(p);
        fail_msg("cannot copy %s", src);
    }
    if (qgproc_start(p, qgproc_path(p, "rules.yaml"), NULL, NULL) < 0) {
        snprintf(w, sizeof w, "%s", p->why);
        qgproc_cleanup(p);
        fail_msg("serve did not start: %s", w);
    }
}

/* GET /v1/usage/{subject}: used of a window, or -1 with why in err. */
static double usage_used(httpc *c, const char *subject, const char *window,
                         char *err, size_t errcap)
{
    char path[300];
    http_resp r;
    json_t *j, *ws, *w;
    size_t i;
    double used = -1;
    snprintf(path, sizeof path, "/v1/usage/%s", subject);
    if (httpc_call(c, "GET", path, "bearer", ADMIN, NULL, &r) < 0) {
        snprintf(err, errcap, "GET %.120s: %.200s", path, c->err);
        return -1;
    }
    if (r.status != 200) {
        snprintf(err, errcap, "GET %.120s: HTTP %d %.200s", path, r.status,
                 r.body);
        http_resp_free(&r);
        return -1;
    }
    j = json_loadb(r.body, r.body_len, 0, NULL);
    ws = json_object_get(j, "windows");
    json_array_foreach(ws, i, w)
        if (json_is_string(json_object_get(w, "name")) &&
            !strcmp(json_string_value(json_object_get(w, "name")), window) &&
            json_is_number(json_object_get(w, "used")))
            used = json_number_value(json_object_get(w, "used"));
    if (used < 0)
        snprintf(err, errcap, "GET %.120s: no window %.40s with used: %.200s", path,
                 window, r.body);
    json_decref(j);
    http_resp_free(&r);
    return used;
}

/* ================================================= (a) one hot subject */

#define HOT_THREADS 64
#define HOT_PER_THREAD 20
#define HOT_LIMIT 500

typedef struct hot_shared {
    int port;
    pthread_barrier_t go;
    atomic_long allowed, refused, settled;
    atomic_int bad;
    pthread_mutex_t mu;
    char first_bad[1024];
} hot_shared;

typedef struct hot_arg {
    hot_shared *sh;
    int id;
} hot_arg;

static void hot_bad(hot_shared *sh, const char *fmt_, ...)
    __attribute__((format(printf, 2, 3)));
static void hot_bad(hot_shared *sh, const char *fmt_, ...)
{
    va_list ap;
    pthread_mutex_lock(&sh->mu);
    if (atomic_fetch_add(&sh->bad, 1) == 0) {
        va_start(ap, fmt_);
        vsnprintf(sh->first_bad, sizeof sh->first_bad, fmt_, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&sh->mu);
}

/* Every window of a decision body within its limit; returns 0 or -1. */
static int windows_within(json_t *body, char *why, size_t cap)
{
    json_t *w;
    size_t i;
    json_t *ws = json_object_get(body, "windows");
    if (!json_is_array(ws)) {
        snprintf(why, cap, "no windows array");
        return -1;
    }
    json_array_foreach(ws, i, w) {
        double used = json_number_value(json_object_get(w, "used"));
        double limit = json_number_value(json_object_get(w, "limit"));
        if (!json_is_number(json_object_get(w, "used")) ||
            !json_is_number(json_object_get(w, "limit"))) {
            snprintf(why, cap, "window without used/limit");
            return -1;
        }
        if (used > limit + 1e-9) {
            snprintf(why, cap, "window %s used %g > limit %g",
                     json_string_value(json_object_get(w, "name")), used,
                     limit);
            return -1;
        }
    }
    return 0;
}

static void *hot_main(void *v)
{
    hot_arg *a = v;
    hot_shared *sh = a->sh;
    httpc c;
    char body[256], why[256];
    httpc_init(&c, sh->port);
    pthread_barrier_wait(&sh->go);
    for (int i = 0; i < HOT_PER_THREAD; i++) {
        http_resp r;
        json_t *j;
        char rid[64];
        snprintf(rid, sizeof rid, "hot-%d-%d-%d", (int)getpid(), a->id, i);
        snprintf(body, sizeof body,
                 "{\"subject\":\"hot\",\"request_id\":\"%s\",\"weight\":1}",
                 rid);
        if (httpc_post_json(&c, "/v1/check", SERVICE, body, &r) < 0) {
            hot_bad(sh, "thread %d check %d: %s", a->id, i, c.err);
            break;
        }
        j = json_loadb(r.body, r.body_len, 0, NULL);
        if (!j) {
            hot_bad(sh, "check answered HTTP %d with non-JSON: %.200s",
                    r.status, r.body);
        } else if (r.status == 200) {
            const char *d = json_string_value(json_object_get(j, "decision"));
            if (!d || strcmp(d, "allow") != 0)
                hot_bad(sh, "200 with decision %s", d ? d : "(none)");
            else if (windows_within(j, why, sizeof why) < 0)
                hot_bad(sh, "allow of %s shows %s", rid, why);
            else
                atomic_fetch_add(&sh->allowed, 1);
        } else if (r.status == 429) {
            json_t *e = json_object_get(j, "error");
            const char *t = json_string_value(json_object_get(e, "type"));
            const char *w = json_string_value(json_object_get(e, "window"));
            if (!t || strcmp(t, "quota_exceeded") || !w ||
                strcmp(w, "burst_5h"))
                hot_bad(sh, "refusal %s on %s, expected quota_exceeded on "
                        "burst_5h", t ? t : "?", w ? w : "?");
            else if (windows_within(j, why, sizeof why) < 0)
                hot_bad(sh, "refusal of %s shows %s", rid, why);
            atomic_fetch_add(&sh->refused, 1);
        } else {
            hot_bad(sh, "check answered HTTP %d: %.200s", r.status, r.body);
        }
        if (r.status == 200) {
            http_resp s;
            snprintf(body, sizeof body,
                     "{\"request_id\":\"%s\",\"weight\":1,\"status\":"
                     "\"completed\"}", rid);
            if (httpc_post_json(&c, "/v1/settle", SERVICE, body, &s) < 0) {
                hot_bad(sh, "settle of %s: %s", rid, c.err);
            } else {
                if (s.status == 200)
                    atomic_fetch_add(&sh->settled, 1);
                else
                    hot_bad(sh, "settle of %s: HTTP %d %.200s", rid,
                            s.status, s.body);
                http_resp_free(&s);
            }
        }
        json_decref(j);
        http_resp_free(&r);
    }
    httpc_close(&c);
    return NULL;
}

static void test_hot_subject(void **state)
{
    qgproc p;
    hot_shared sh;
    hot_arg args[HOT_THREADS];
    pthread_t th[HOT_THREADS];
    httpc c;
    char err[512];
    double burst, weekly;
    (void)state;
    start_server(&p, "server/load.yaml");
    memset(&sh, 0, sizeof sh);
    sh.port = qgproc_port(&p);
    pthread_mutex_init(&sh.mu, NULL);
    pthread_barrier_init(&sh.go, NULL, HOT_THREADS);
    for (int i = 0; i < HOT_THREADS; i++) {
        args[i].sh = &sh;
        args[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, hot_main, &args[i]), 0);
    }
    for (int i = 0; i < HOT_THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&sh.go);
    pthread_mutex_destroy(&sh.mu);
    httpc_init(&c, qgproc_port(&p));
    burst = usage_used(&c, "hot", "burst_5h", err, sizeof err);
    weekly = usage_used(&c, "hot", "weekly", err, sizeof err);
    httpc_close(&c);
    {
        int rc = qgproc_stop(&p, 20000);
        if (rc != 0 || atomic_load(&sh.bad))
            qgproc_dump_stderr(&p);
        qgproc_cleanup(&p);
        print_message("hot subject: %ld allowed, %ld refused, %ld settled; "
                      "usage burst_5h %g weekly %g\n",
                      atomic_load(&sh.allowed), atomic_load(&sh.refused),
                      atomic_load(&sh.settled), burst, weekly);
        if (atomic_load(&sh.bad))
            fail_msg("%d bad responses; first: %s", atomic_load(&sh.bad),
                     sh.first_bad);
        if (burst < 0 || weekly < 0)
            fail_msg("%s", err);
        if (atomic_load(&sh.allowed) != HOT_LIMIT)
            fail_msg("%d checks of 1 point against a 500-point window, %ld "
                     "admitted (expected exactly 500: demand exceeds supply)",
                     HOT_THREADS * HOT_PER_THREAD, atomic_load(&sh.allowed));
        if (atomic_load(&sh.allowed) + atomic_load(&sh.refused) !=
            HOT_THREADS * HOT_PER_THREAD)
            fail_msg("answers lost: %ld + %ld of %d",
                     atomic_load(&sh.allowed), atomic_load(&sh.refused),
                     HOT_THREADS * HOT_PER_THREAD);
        if (fabs(burst - HOT_LIMIT) > 1e-9 || fabs(weekly - HOT_LIMIT) > 1e-9)
            fail_msg("usage after 500 admitted and settled: burst_5h %g, "
                     "weekly %g (expected 500 each)", burst, weekly);
        assert_int_equal(rc, 0);
    }
}

/* ============================================== (b) kill -9 under load */

#define CR_THREADS 4
#define CR_SUBJECTS 4
#define CR_KILLS 5
#define CR_MAX_RECS 60000       /* per thread, all cycles */
#define CR_RESERVE 3
#define CR_ACTUAL 2
#define CR_REPLAYERS 8          /* connections replaying after the kills */

enum { ST_CHECK_UNK = 1,        /* check sent, no 200: 0 or 3 */
       ST_CHECKED,              /* check 200, left open: 3, or lost */
       ST_SETTLE_UNK,           /* check 200, settle sent, no 200: 2/3/lost */
       ST_SETTLED };            /* settle 200: exactly 2 */

typedef struct cr_rec {
    int subj, state, cycle, seq;
    int64_t ack_us;             /* check answered 200 (read after the answer) */
    int64_t settle_us;          /* settle sent (read before sending it) */
    int replayed[2];            /* check replay of pass 1, 2: 1 replayed,
                                   0 decided afresh, -1 not done or failed */
} cr_rec;

typedef struct cr_thread {
    pthread_t th;
    int id, port, cycle;
    unsigned seed;
    atomic_int *stop;
    cr_rec *recs;
    int nrecs;
    int unexpected;
    char first_unexpected[512];
} cr_thread;

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void cr_rid(char *buf, size_t cap, int thread, int seq)
{
    snprintf(buf, cap, "crash-%d-%d-%d", (int)getpid(), thread, seq);
}

static void *cr_main(void *v)
{
    cr_thread *t = v;
    httpc c;
    char body[256], rid[64];
    httpc_init(&c, t->port);
    c.timeout_ms = 15000;
    while (!atomic_load(t->stop) && t->nrecs < CR_MAX_RECS) {
        cr_rec *rec = &t->recs[t->nrecs];
        http_resp r;
        int seq = t->nrecs;
        rec->seq = seq;
        rec->subj = (int)(rand_r(&t->seed) % CR_SUBJECTS);
        rec->cycle = t->cycle;
        rec->state = ST_CHECK_UNK;
        rec->replayed[0] = rec->replayed[1] = -1;
        t->nrecs++;
        cr_rid(rid, sizeof rid, t->id, seq);
        snprintf(body, sizeof body,
                 "{\"subject\":\"c%d\",\"request_id\":\"%s\",\"weight\":%d}",
                 rec->subj, rid, CR_RESERVE);
        if (httpc_post_json(&c, "/v1/check", SERVICE, body, &r) < 0)
            break; /* the server is gone: stays unknown */
        if (r.status != 200 || !strstr(r.body, "\"allow\"")) {
            if (!t->unexpected++)
                snprintf(t->first_unexpected, sizeof t->first_unexpected,
                         "check %s: HTTP %d %.300s", rid, r.status, r.body);
            /* a 503 (say) is not an acknowledged charge, nor surely none */
            http_resp_free(&r);
            continue;
        }
        http_resp_free(&r);
        rec->ack_us = mono_us();
        rec->state = ST_CHECKED;
        if (rand_r(&t->seed) % 3 == 0)
            continue; /* leave the reservation open */
        rec->state = ST_SETTLE_UNK;
        snprintf(body, sizeof body,
                 "{\"request_id\":\"%s\",\"weight\":%d,\"status\":"
                 "\"completed\"}", rid, CR_ACTUAL);
        rec->settle_us = mono_us();
        if (httpc_post_json(&c, "/v1/settle", SERVICE, body, &r) < 0)
            break;
        if (r.status == 200)
            rec->state = ST_SETTLED;
        else if (!t->unexpected++)
            snprintf(t->first_unexpected, sizeof t->first_unexpected,
                     "settle %s: HTTP %d %.300s", rid, r.status, r.body);
        http_resp_free(&r);
    }
    httpc_close(&c);
    return NULL;
}

/* ---- replaying every acknowledged request after the last restart ---- */

typedef struct rp_item {
    int tid;
    cr_rec *r;
} rp_item;

typedef struct rp_shared {
    int port, pass;             /* pass 0: first replay, 1: second */
    const rp_item *items;
    size_t n;
    atomic_size_t next;
    atomic_int errors, settles, checks;
    pthread_mutex_t mu;
    char first[768];
} rp_shared;

static void rp_error(rp_shared *sh, const char *fmt_, ...)
    __attribute__((format(printf, 2, 3)));
static void rp_error(rp_shared *sh, const char *fmt_, ...)
{
    va_list ap;
    pthread_mutex_lock(&sh->mu);
    if (atomic_fetch_add(&sh->errors, 1) == 0) {
        va_start(ap, fmt_);
        vsnprintf(sh->first, sizeof sh->first, fmt_, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&sh->mu);
}

static const char *st_name(int st)
{
    switch (st) {
    case ST_CHECKED: return "open";
    case ST_SETTLE_UNK: return "settle unanswered";
    case ST_SETTLED: return "settled";
    default: return "?";
    }
}

/* One replay connection: every acknowledged settle is repeated (it must
 * answer "replayed" with its charge), then every acknowledged check (its
 * "replayed" is recorded; pass 2 and settled ones must be replayed). */
static void *rp_main(void *v)
{
    rp_shared *sh = v;
    httpc c;
    char rid[64], body[256];
    httpc_init(&c, sh->port);
    c.timeout_ms = 15000;
    for (;;) {
        size_t i = atomic_fetch_add(&sh->next, 1);
        cr_rec *r;
        http_resp resp;
        json_t *j, *rp;
        if (i >= sh->n)
            break;
        r = sh->items[i].r;
        cr_rid(rid, sizeof rid, sh->items[i].tid, r->seq);
        if (r->state == ST_SETTLED) {
            snprintf(body, sizeof body,
                     "{\"request_id\":\"%s\",\"weight\":%d,\"status\":"
                     "\"completed\"}", rid, CR_ACTUAL);
            if (httpc_post_json(&c, "/v1/settle", SERVICE, body, &resp) < 0) {
                rp_error(sh, "replay %d of the settle of %s: %s",
                         sh->pass + 1, rid, c.err);
                continue;
            }
            atomic_fetch_add(&sh->settles, 1);
            j = json_loadb(resp.body, resp.body_len, 0, NULL);
            if (resp.status != 200 || !j ||
                !json_is_true(json_object_get(j, "replayed")) ||
                !json_is_number(json_object_get(j, "charged")) ||
                fabs(json_number_value(json_object_get(j, "charged")) -
                     CR_ACTUAL) > 1e-9)
                rp_error(sh, "replay %d of the settle of %s (answered 200 in "
                         "cycle %d; expected replayed with charged %d): "
                         "HTTP %d %.300s", sh->pass + 1, rid, r->cycle + 1,
                         CR_ACTUAL, resp.status, resp.body);
            json_decref(j);
            http_resp_free(&resp);
        }
        snprintf(body, sizeof body,
                 "{\"subject\":\"c%d\",\"request_id\":\"%s\",\"weight\":%d}",
                 r->subj, rid, CR_RESERVE);
        if (httpc_post_json(&c, "/v1/check", SERVICE, body, &resp) < 0) {
            rp_error(sh, "replay %d of the check of %s: %s", sh->pass + 1,
                     rid, c.err);
            continue;
        }
        atomic_fetch_add(&sh->checks, 1);
        j = json_loadb(resp.body, resp.body_len, 0, NULL);
        rp = json_object_get(j, "replayed");
        if (resp.status != 200 || !j || !json_is_boolean(rp) ||
            !json_is_string(json_object_get(j, "decision")) ||
            strcmp(json_string_value(json_object_get(j, "decision")),
                   "allow") != 0) {
            rp_error(sh, "replay %d of the check of %s (%s, acknowledged in "
                     "cycle %d): HTTP %d %.300s", sh->pass + 1, rid,
                     st_name(r->state), r->cycle + 1, resp.status, resp.body);
        } else {
            r->replayed[sh->pass] = json_is_true(rp);
            if (!json_is_true(rp) && (sh->pass > 0 || r->state == ST_SETTLED))
                rp_error(sh, "replay %d of the check of %s (%s, acknowledged "
                         "in cycle %d) was decided afresh: %.300s",
                         sh->pass + 1, rid, st_name(r->state), r->cycle + 1,
                         resp.body);
        }
        json_decref(j);
        http_resp_free(&resp);
    }
    httpc_close(&c);
    return NULL;
}

static void cr_replay(rp_shared *sh, int port, int pass, const rp_item *items,
                      size_t n)
{
    pthread_t th[CR_REPLAYERS];
    memset(sh, 0, sizeof *sh);
    sh->port = port;
    sh->pass = pass;
    sh->items = items;
    sh->n = n;
    pthread_mutex_init(&sh->mu, NULL);
    for (int i = 0; i < CR_REPLAYERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, rp_main, sh), 0);
    for (int i = 0; i < CR_REPLAYERS; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&sh->mu);
}

/* burst_5h and weekly used of every crash subject; 0 or -1 (err). */
static int cr_usage(httpc *c, double *burst, double *weekly, char *err,
                    size_t errcap)
{
    for (int s = 0; s < CR_SUBJECTS; s++) {
        char subj[16];
        snprintf(subj, sizeof subj, "c%d", s);
        if ((burst[s] = usage_used(c, subj, "burst_5h", err, errcap)) < 0 ||
            (weekly[s] = usage_used(c, subj, "weekly", err, errcap)) < 0)
            return -1;
    }
    return 0;
}

static long long week_index(void)
{
    /* Monday-based weeks since the epoch (1970-01-01 was a Thursday) */
    return ((long long)time(NULL) / 86400 + 3) / 7;
}

#define CR_BAD(...)                                                        \
    do {                                                                   \
        if (nbad++ == 0)                                                   \
            snprintf(first_bad, sizeof first_bad, __VA_ARGS__);            \
    } while (0)

static void test_crash_under_load(void **state)
{
    qgproc p;
    cr_thread ts[CR_THREADS];
    atomic_int stop;
    unsigned seed;
    const char *env_seed = getenv("QG_SEED");
    long long week0 = week_index();
    int64_t t_start = mono_us(), kill_us[CR_KILLS], t_rp;
    int wait_ms[CR_KILLS];
    /* per subject */
    double u0b[CR_SUBJECTS] = { 0 }, u0w[CR_SUBJECTS] = { 0 },
        u1b[CR_SUBJECTS] = { 0 }, u1w[CR_SUBJECTS] = { 0 },
        u2b[CR_SUBJECTS] = { 0 }, u2w[CR_SUBJECTS] = { 0 };
    int have_usage = 0;
    long n_settled[CR_SUBJECTS] = { 0 }, n_open_surv[CR_SUBJECTS] = { 0 },
         n_open_lost[CR_SUBJECTS] = { 0 }, n_su_surv[CR_SUBJECTS] = { 0 },
         n_su_lost[CR_SUBJECTS] = { 0 }, n_check_unk[CR_SUBJECTS] = { 0 };
    /* per cycle */
    long c_open[CR_KILLS] = { 0 }, c_open_lost[CR_KILLS] = { 0 },
         c_su_lost[CR_KILLS] = { 0 }, c_settled[CR_KILLS] = { 0 };
    int64_t c_last_settle_sent[CR_KILLS], c_first_lost_ack[CR_KILLS];
    int counts[5] = { 0 }, unexpected = 0, nbad = 0, order_bad = 0;
    long open_total = 0, open_lost_total = 0;
    char first_unexpected[512] = "", err[512], first_bad[1024] = "";
    char report[4096] = "";
    size_t rn = 0, nitems = 0;
    rp_item *items;
    rp_shared rps[2];
    httpc c;
    (void)state;

    seed = env_seed ? (unsigned)strtoul(env_seed, NULL, 10)
                    : (unsigned)time(NULL) ^ (unsigned)getpid();
    print_message("crash test seed %u (QG_SEED=%u reruns it)\n", seed, seed);
    memset(ts, 0, sizeof ts);
    for (int i = 0; i < CR_THREADS; i++) {
        ts[i].recs = calloc(CR_MAX_RECS, sizeof(cr_rec));
        assert_non_null(ts[i].recs);
        ts[i].id = i;
        ts[i].seed = seed + 7919u * (unsigned)i;
        ts[i].stop = &stop;
    }
    start_server(&p, "server/load.yaml");
    for (int cycle = 0; cycle < CR_KILLS; cycle++) {
        wait_ms[cycle] = 200 + (int)(rand_r(&seed) % 1000);
        if (cycle > 0 && qgproc_restart(&p) < 0) {
            char w[600];
            snprintf(w, sizeof w, "%s", p.why);
            qgproc_cleanup(&p);
            fail_msg("restart #%d after kill -9 failed: %s", cycle, w);
        }
        atomic_store(&stop, 0);
        for (int i = 0; i < CR_THREADS; i++) {
            ts[i].port = qgproc_port(&p);
            ts[i].cycle = cycle;
            assert_int_equal(pthread_create(&ts[i].th, NULL, cr_main, &ts[i]),
                             0);
        }
        sleep_ms(wait_ms[cycle]);
        kill_us[cycle] = mono_us();
        qgproc_kill9(&p);
        atomic_store(&stop, 1);
        for (int i = 0; i < CR_THREADS; i++)
            pthread_join(ts[i].th, NULL);
        print_message("cycle %d: killed after %d ms\n", cycle + 1,
                      wait_ms[cycle]);
    }
    if (qgproc_restart(&p) < 0) {
        char w[600];
        snprintf(w, sizeof w, "%s", p.why);
        qgproc_cleanup(&p);
        fail_msg("final restart after kill -9 failed: %s", w);
    }

    /* usage as rebuilt from the ledger, before any replay */
    httpc_init(&c, qgproc_port(&p));
    c.timeout_ms = 15000;
    if (cr_usage(&c, u0b, u0w, err, sizeof err) < 0) {
        httpc_close(&c);
        qgproc_dump_stderr(&p);
        qgproc_cleanup(&p);
        fail_msg("after the last restart: %s", err);
    }

    /* replay every acknowledged request twice */
    for (int i = 0; i < CR_THREADS; i++) {
        if (ts[i].unexpected && !unexpected)
            snprintf(first_unexpected, sizeof first_unexpected, "%s",
                     ts[i].first_unexpected);
        unexpected += ts[i].unexpected;
        nitems += (size_t)ts[i].nrecs;
    }
    items = calloc(nitems + 1, sizeof *items);
    assert_non_null(items);
    nitems = 0;
    for (int i = 0; i < CR_THREADS; i++)
        for (int k = 0; k < ts[i].nrecs; k++) {
            cr_rec *r = &ts[i].recs[k];
            counts[r->state]++;
            if (r->state == ST_CHECKED || r->state == ST_SETTLE_UNK ||
                r->state == ST_SETTLED)
                items[nitems++] = (rp_item){ .tid = i, .r = r };
        }
    print_message("requests: %d checked and open, %d settled, %d check "
                  "unanswered, %d settle unanswered; %d unexpected answers\n",
                  counts[ST_CHECKED], counts[ST_SETTLED], counts[ST_CHECK_UNK],
                  counts[ST_SETTLE_UNK], unexpected);
    t_rp = mono_us();
    cr_replay(&rps[0], qgproc_port(&p), 0, items, nitems);
    if (cr_usage(&c, u1b, u1w, err, sizeof err) == 0) {
        cr_replay(&rps[1], qgproc_port(&p), 1, items, nitems);
        if (cr_usage(&c, u2b, u2w, err, sizeof err) < 0)
            CR_BAD("after the second replay: %s", err);
        else
            have_usage = 1;
    } else {
        memset(&rps[1], 0, sizeof rps[1]);
        CR_BAD("after the first replay: %s", err);
    }
    httpc_close(&c);
    print_message("replay 1: %d checks, %d settles, %d wrong; replay 2: %d "
                  "checks, %d settles, %d wrong (%.1f s)\n",
                  atomic_load(&rps[0].checks), atomic_load(&rps[0].settles),
                  atomic_load(&rps[0].errors), atomic_load(&rps[1].checks),
                  atomic_load(&rps[1].settles), atomic_load(&rps[1].errors),
                  (double)(mono_us() - t_rp) / 1e6);
    /* (1) every acknowledged settle replayed with its charge, every
     * settled check replayed, every check replayed the second time */
    for (int pass = 0; pass < 2; pass++)
        if (atomic_load(&rps[pass].errors))
            CR_BAD("replay %d: %d wrong answers; first: %s", pass + 1,
                   atomic_load(&rps[pass].errors), rps[pass].first);

    /* tallies: survivors and lost ones, per subject and per cycle */
    for (int y = 0; y < CR_KILLS; y++) {
        c_last_settle_sent[y] = INT64_MIN;
        c_first_lost_ack[y] = INT64_MAX;
    }
    for (size_t i = 0; i < nitems; i++)
        if (items[i].r->state == ST_SETTLED &&
            items[i].r->settle_us > c_last_settle_sent[items[i].r->cycle])
            c_last_settle_sent[items[i].r->cycle] = items[i].r->settle_us;
    for (int i = 0; i < CR_THREADS; i++)
        for (int k = 0; k < ts[i].nrecs; k++) {
            cr_rec *r = &ts[i].recs[k];
            int s = r->subj, y = r->cycle, lost = r->replayed[0] == 0;
            char rid[64];
            switch (r->state) {
            case ST_CHECK_UNK: n_check_unk[s]++; continue;
            case ST_SETTLED: n_settled[s]++; c_settled[y]++; continue;
            case ST_CHECKED:
                c_open[y]++;
                open_total++;
                if (lost) {
                    n_open_lost[s]++;
                    c_open_lost[y]++;
                    open_lost_total++;
                } else {
                    n_open_surv[s]++;
                }
                break;
            case ST_SETTLE_UNK:
                if (lost) {
                    n_su_lost[s]++;
                    c_su_lost[y]++;
                } else {
                    n_su_surv[s]++;
                }
                break;
            default: continue;
            }
            if (!lost)
                continue;
            if (r->ack_us < c_first_lost_ack[y])
                c_first_lost_ack[y] = r->ack_us;
            /* (3) the writer commits in submission order, so a settle sent
             * after this check was answered, once acknowledged, proves the
             * check's row durable: a lost check must have been answered
             * after the last acknowledged settle of its cycle was sent. */
            if (r->ack_us < c_last_settle_sent[y]) {
                cr_rid(rid, sizeof rid, i, r->seq);
                if (!order_bad++)
                    CR_BAD("check %s (%s) answered in cycle %d was lost, yet "
                           "a settle sent %.1f ms after that answer was "
                           "acknowledged (durable) in the same cycle", rid,
                           st_name(r->state), y + 1,
                           (double)(c_last_settle_sent[y] - r->ack_us) / 1e3);
            }
        }
    for (int y = 0; y < CR_KILLS; y++) {
        char lastw[96] = "";
        if (c_first_lost_ack[y] != INT64_MAX)
            snprintf(lastw, sizeof lastw, "; the earliest lost one answered "
                     "%lld us before the kill was sent",
                     (long long)(kill_us[y] - c_first_lost_ack[y]));
        print_message("cycle %d (killed after %d ms): %ld open checks "
                      "acknowledged, %ld lost (+%ld lost with their settle "
                      "unanswered), %ld settles acknowledged%s\n", y + 1,
                      wait_ms[y], c_open[y], c_open_lost[y], c_su_lost[y],
                      c_settled[y], lastw);
    }
    if (order_bad > 1)
        CR_BAD("%d lost checks were answered before a settle later "
               "acknowledged in their cycle", order_bad);
    if (open_total > 0 && open_lost_total * 20 >= open_total)
        CR_BAD("%ld of %ld acknowledged open checks lost (5%% or more)",
               open_lost_total, open_total);

    /* (2) usage: before the replays, settled ones count 2, surviving open
     * checks 3, surviving settle-unanswered 2 or 3, lost ones 0, checks
     * without answer 0 or 3.  The first replay re-admits exactly the lost
     * ones (3 each); the second charges nothing. */
    for (int s = 0; s < CR_SUBJECTS && have_usage; s++) {
        double base = (double)(CR_ACTUAL * n_settled[s] +
                               CR_RESERVE * n_open_surv[s] +
                               CR_ACTUAL * n_su_surv[s]);
        double slack = (double)((CR_RESERVE - CR_ACTUAL) * n_su_surv[s] +
                                CR_RESERVE * n_check_unk[s]);
        double fresh = (double)(CR_RESERVE * (n_open_lost[s] + n_su_lost[s]));
        int ok0 = u0b[s] >= base - 1e-9 && u0b[s] <= base + slack + 1e-9;
        int ok1 = fabs(u1b[s] - (u0b[s] + fresh)) < 1e-9;
        int ok2 = fabs(u2b[s] - u1b[s]) < 1e-9;
        int okw = week_index() != week0 ||
                  (fabs(u0w[s] - u0b[s]) < 1e-9 &&
                   fabs(u1w[s] - u1b[s]) < 1e-9 &&
                   fabs(u2w[s] - u2b[s]) < 1e-9);
        rn += (size_t)snprintf(
            report + rn, sizeof report - rn,
            "  c%d: rebuilt %g (expected %g..%g: %ld settled, %ld open + %ld "
            "settle-unanswered survived, %ld checks unanswered); after "
            "replay 1 %g (expected +%g for %ld + %ld lost), replay 2 %g; "
            "weekly %g/%g/%g%s\n", s, u0b[s], base, base + slack,
            n_settled[s], n_open_surv[s], n_su_surv[s], n_check_unk[s],
            u1b[s], fresh, n_open_lost[s], n_su_lost[s], u2b[s],
            u0w[s], u1w[s], u2w[s], ok0 && ok1 && ok2 && okw ? "" : "  <-- BAD");
        if (!ok0)
            CR_BAD("c%d rebuilt with %g, outside the acknowledged %g..%g "
                   "(below: acknowledged usage lost; above: charged twice or "
                   "unacknowledged)", s, u0b[s], base, base + slack);
        if (!ok1)
            CR_BAD("c%d: the first replay moved usage %g -> %g; the %ld lost "
                   "checks re-admitted should add exactly %g", s, u0b[s],
                   u1b[s], n_open_lost[s] + n_su_lost[s], fresh);
        if (!ok2)
            CR_BAD("c%d: the second replay charged: %g -> %g", s, u1b[s],
                   u2b[s]);
        if (!okw)
            CR_BAD("c%d: weekly %g/%g/%g differs from burst_5h %g/%g/%g", s,
                   u0w[s], u1w[s], u2w[s], u0b[s], u1b[s], u2b[s]);
    }
    print_message("usage after %d kills:\n%s", CR_KILLS, report);
    print_message("lost open checks: %ld of %ld acknowledged (per cycle:",
                  open_lost_total, open_total);
    for (int y = 0; y < CR_KILLS; y++)
        print_message(" %ld", c_open_lost[y]);
    print_message("); %.1f s in all\n", (double)(mono_us() - t_start) / 1e6);

    {
        int rc = qgproc_stop(&p, 20000);
        if (nbad || rc != 0)
            qgproc_dump_stderr(&p);
        qgproc_cleanup(&p);
        free(items);
        for (int i = 0; i < CR_THREADS; i++)
            free(ts[i].recs);
        if (nbad)
            fail_msg("after kill -9: %d problems (usage above); first: %s",
                     nbad, first_bad);
        if (unexpected)
            fail_msg("%d unexpected answers under load; first: %s",
                     unexpected, first_unexpected);
        assert_int_equal(rc, 0);
    }
}

/* ==================== (c) a settle records a reservation lost in a crash */

static void rec_fail(qgproc *p, httpc *c, const char *fmt_, ...)
    __attribute__((format(printf, 3, 4)));
static void rec_fail(qgproc *p, httpc *c, const char *fmt_, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(msg, sizeof msg, fmt_, ap);
    va_end(ap);
    httpc_close(c);
    if (p->pid)
        qgproc_kill9(p);
    qgproc_dump_stderr(p);
    qgproc_cleanup(p);
    fail_msg("%s", msg);
}

/* POST, the answer parsed (NULL when not JSON); fails the test when the
 * request gets no answer. */
static json_t *rec_post(qgproc *p, httpc *c, const char *path,
                        const char *body, int *status)
{
    http_resp r;
    json_t *j;
    if (httpc_post_json(c, path, SERVICE, body, &r) < 0)
        rec_fail(p, c, "POST %s %s: %s", path, body, c->err);
    *status = r.status;
    j = json_loadb(r.body, r.body_len, 0, NULL);
    http_resp_free(&r);
    return j;
}

/* The answer as text into buf (for a message), and release it. */
static void rec_dump(json_t *j, char *buf, size_t cap)
{
    char *d = j ? json_dumps(j, 0) : NULL;
    snprintf(buf, cap, "%s", d ? d : "(not JSON)");
    free(d);
    json_decref(j);
}

static void rec_restart_after_kill(qgproc *p, httpc *c)
{
    qgproc_kill9(p);
    if (qgproc_restart(p) < 0)
        rec_fail(p, c, "restart after kill -9: %s", p->why);
    httpc_set_port(c, qgproc_port(p));
}

static void rec_expect_usage(qgproc *p, httpc *c, double want,
                             const char *when)
{
    char err[512];
    double b = usage_used(c, "c0", "burst_5h", err, sizeof err);
    double w = usage_used(c, "c0", "weekly", err, sizeof err);
    if (b < 0 || w < 0)
        rec_fail(p, c, "%s: %s", when, err);
    if (fabs(b - want) > 1e-9 || fabs(w - want) > 1e-9)
        rec_fail(p, c, "%s: c0 used burst_5h %g, weekly %g (expected %g)",
                 when, b, w, want);
}

static void test_settle_recovers_lost_reservation(void **state)
{
    qgproc p;
    httpc c;
    json_t *j;
    int st, rc;
    char body[256], known[64], lost[64], other[64];
    (void)state;
    snprintf(known, sizeof known, "rec-known-%d", (int)getpid());
    snprintf(lost, sizeof lost, "rec-never-seen-%d", (int)getpid());
    snprintf(other, sizeof other, "rec-never-seen-2-%d", (int)getpid());
    start_server(&p, "server/load.yaml");
    httpc_init(&c, qgproc_port(&p));
    c.timeout_ms = 15000;

    /* an ordinary check and settle: acknowledged, so durable */
    snprintf(body, sizeof body, "{\"subject\":\"c0\",\"request_id\":\"%s\","
             "\"weight\":3}", known);
    j = rec_post(&p, &c, "/v1/check", body, &st);
    json_decref(j);
    if (st != 200)
        rec_fail(&p, &c, "check %s: HTTP %d", known, st);
    snprintf(body, sizeof body, "{\"request_id\":\"%s\",\"weight\":2,"
             "\"status\":\"completed\"}", known);
    j = rec_post(&p, &c, "/v1/settle", body, &st);
    json_decref(j);
    if (st != 200)
        rec_fail(&p, &c, "settle %s: HTTP %d", known, st);

    rec_restart_after_kill(&p, &c);
    rec_expect_usage(&p, &c, 2, "after kill -9");

    /* a settle for an id this server never saw, naming subject and
     * weight: recorded whole, and said so */
    snprintf(body, sizeof body, "{\"request_id\":\"%s\",\"subject\":\"c0\","
             "\"weight\":5,\"status\":\"completed\"}", lost);
    j = rec_post(&p, &c, "/v1/settle", body, &st);
    if (st != 200 || !j || !json_is_true(json_object_get(j, "recovered")) ||
        json_is_true(json_object_get(j, "replayed")) ||
        fabs(json_number_value(json_object_get(j, "charged")) - 5) > 1e-9) {
        char d[512];
        rec_dump(j, d, sizeof d);
        rec_fail(&p, &c, "settle of unknown %s with subject and weight: "
                 "HTTP %d %s (expected 200, recovered, charged 5)", lost, st,
                 d);
    }
    json_decref(j);
    rec_expect_usage(&p, &c, 7, "after the recovered settle");

    /* repeated: replayed with the same charge, nothing more */
    j = rec_post(&p, &c, "/v1/settle", body, &st);
    if (st != 200 || !j || !json_is_true(json_object_get(j, "replayed")) ||
        json_is_true(json_object_get(j, "recovered")) ||
        fabs(json_number_value(json_object_get(j, "charged")) - 5) > 1e-9) {
        char d[512];
        rec_dump(j, d, sizeof d);
        rec_fail(&p, &c, "recovered settle repeated: HTTP %d %s (expected "
                 "200, replayed, charged 5)", st, d);
    }
    json_decref(j);
    /* its id checked: replayed, charges nothing */
    snprintf(body, sizeof body, "{\"subject\":\"c0\",\"request_id\":\"%s\","
             "\"weight\":3}", lost);
    j = rec_post(&p, &c, "/v1/check", body, &st);
    if (st != 200 || !j || !json_is_true(json_object_get(j, "replayed"))) {
        json_decref(j);
        rec_fail(&p, &c, "check of the recovered %s: HTTP %d, not replayed",
                 lost, st);
    }
    json_decref(j);
    /* without subject an unknown id cannot be recorded */
    snprintf(body, sizeof body, "{\"request_id\":\"%s\",\"weight\":5,"
             "\"status\":\"completed\"}", other);
    j = rec_post(&p, &c, "/v1/settle", body, &st);
    json_decref(j);
    if (st != 404)
        rec_fail(&p, &c, "settle of unknown %s without subject: HTTP %d "
                 "(expected 404)", other, st);
    rec_expect_usage(&p, &c, 7, "after the replays");

    /* the recovered settle was acknowledged: it survives a kill -9 */
    rec_restart_after_kill(&p, &c);
    rec_expect_usage(&p, &c, 7, "after a second kill -9");
    httpc_close(&c);
    rc = qgproc_stop(&p, 20000);
    if (rc != 0)
        qgproc_dump_stderr(&p);
    qgproc_cleanup(&p);
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hot_subject),
        cmocka_unit_test(test_crash_under_load),
        cmocka_unit_test(test_settle_recovers_lost_reservation),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("server_load", tests, NULL, NULL);
}
