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
 *     five times, restarting on the same --data.  After the last restart
 *     each subject's usage equals the acknowledged charges: a settle
 *     answered 200 counts its actual weight, a check answered 200 and not
 *     settled its reservation; requests whose answer was lost in the crash
 *     may count either way, so the expectation is a range exactly as wide
 *     as those.  Every acknowledged request_id, checked again, is
 *     "replayed" and charges nothing; every acknowledged settle repeated
 *     is "replayed" with its original charge.
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

enum { ST_CHECK_UNK = 1,        /* check sent, no answer: 0 or 3 */
       ST_CHECKED,              /* check 200: 3 (never settled) */
       ST_SETTLE_UNK,           /* check 200, settle sent, no answer: 2/3 */
       ST_SETTLED };            /* settle 200: 2 */

typedef struct cr_rec {
    int subj, state, cycle, last; /* last: the thread's last in its cycle */
    int seq;
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
        rec->state = ST_CHECKED;
        if (rand_r(&t->seed) % 3 == 0)
            continue; /* leave the reservation open */
        rec->state = ST_SETTLE_UNK;
        snprintf(body, sizeof body,
                 "{\"request_id\":\"%s\",\"weight\":%d,\"status\":"
                 "\"completed\"}", rid, CR_ACTUAL);
        if (httpc_post_json(&c, "/v1/settle", SERVICE, body, &r) < 0)
            break;
        if (r.status == 200)
            rec->state = ST_SETTLED;
        else if (!t->unexpected++)
            snprintf(t->first_unexpected, sizeof t->first_unexpected,
                     "settle %s: HTTP %d %.300s", rid, r.status, r.body);
        http_resp_free(&r);
    }
    if (t->nrecs)
        t->recs[t->nrecs - 1].last = 1;
    httpc_close(&c);
    return NULL;
}

static long long week_index(void)
{
    /* Monday-based weeks since the epoch (1970-01-01 was a Thursday) */
    return ((long long)time(NULL) / 86400 + 3) / 7;
}

static void test_crash_under_load(void **state)
{
    qgproc p;
    cr_thread ts[CR_THREADS];
    atomic_int stop;
    unsigned seed;
    const char *env_seed = getenv("QG_SEED");
    long long week0 = week_index();
    double lo[CR_SUBJECTS] = { 0 }, hi[CR_SUBJECTS] = { 0 };
    double used_b[CR_SUBJECTS], used_w[CR_SUBJECTS];
    int counts[5] = { 0 }, unexpected = 0;
    char first_unexpected[512] = "", err[512];
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
        int wait = 200 + (int)(rand_r(&seed) % 1000);
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
        sleep_ms(wait);
        qgproc_kill9(&p);
        atomic_store(&stop, 1);
        for (int i = 0; i < CR_THREADS; i++)
            pthread_join(ts[i].th, NULL);
        print_message("cycle %d: killed after %d ms\n", cycle + 1, wait);
    }
    if (qgproc_restart(&p) < 0) {
        char w[600];
        snprintf(w, sizeof w, "%s", p.why);
        qgproc_cleanup(&p);
        fail_msg("final restart after kill -9 failed: %s", w);
    }

    /* expected ranges */
    for (int i = 0; i < CR_THREADS; i++) {
        if (ts[i].unexpected && !unexpected)
            snprintf(first_unexpected, sizeof first_unexpected, "%s",
                     ts[i].first_unexpected);
        unexpected += ts[i].unexpected;
        for (int k = 0; k < ts[i].nrecs; k++) {
            cr_rec *r = &ts[i].recs[k];
            counts[r->state]++;
            switch (r->state) {
            case ST_CHECK_UNK: hi[r->subj] += CR_RESERVE; break;
            case ST_CHECKED: lo[r->subj] += CR_RESERVE;
                             hi[r->subj] += CR_RESERVE; break;
            case ST_SETTLE_UNK: lo[r->subj] += CR_ACTUAL;
                                hi[r->subj] += CR_RESERVE; break;
            case ST_SETTLED: lo[r->subj] += CR_ACTUAL;
                             hi[r->subj] += CR_ACTUAL; break;
            default: break;
            }
        }
    }
    print_message("requests: %d checked and open, %d settled, %d check "
                  "unanswered, %d settle unanswered; %d unexpected answers\n",
                  counts[ST_CHECKED], counts[ST_SETTLED], counts[ST_CHECK_UNK],
                  counts[ST_SETTLE_UNK], unexpected);

    httpc_init(&c, qgproc_port(&p));
    c.timeout_ms = 15000;
    for (int s = 0; s < CR_SUBJECTS; s++) {
        char subj[16];
        snprintf(subj, sizeof subj, "c%d", s);
        used_b[s] = usage_used(&c, subj, "burst_5h", err, sizeof err);
        if (used_b[s] < 0)
            break;
        used_w[s] = usage_used(&c, subj, "weekly", err, sizeof err);
        if (used_w[s] < 0)
            break;
    }
    char report[2048] = "";
    int bad = 0;
    {
        size_t n = 0;
        for (int s = 0; s < CR_SUBJECTS; s++) {
            int ok = used_b[s] >= lo[s] - 1e-9 && used_b[s] <= hi[s] + 1e-9;
            if (week_index() == week0)
                ok = ok && fabs(used_w[s] - used_b[s]) < 1e-9;
            n += (size_t)snprintf(report + n, sizeof report - n,
                                  "  c%d: burst_5h used %g, weekly %g; "
                                  "acknowledged %g..%g%s\n", s, used_b[s],
                                  used_w[s], lo[s], hi[s], ok ? "" : "  <-- BAD");
            bad += !ok;
        }
        print_message("usage after %d kills:\n%s", CR_KILLS, report);
        if (used_b[CR_SUBJECTS - 1] < 0 || used_w[CR_SUBJECTS - 1] < 0) {
            httpc_close(&c);
            qgproc_cleanup(&p);
            fail_msg("%s", err);
        }
    }

    /* replays: every acknowledged check answers "replayed"; every
     * acknowledged settle too, with its charge; nothing is charged. */
    {
        int checked = 0, not_replayed = 0, settles = 0, settle_bad = 0;
        char first[512] = "";
        for (int i = 0; i < CR_THREADS; i++)
            for (int k = 0; k < ts[i].nrecs; k++) {
                cr_rec *r = &ts[i].recs[k];
                char rid[64], body[256];
                http_resp resp;
                if (r->state != ST_CHECKED && r->state != ST_SETTLE_UNK &&
                    r->state != ST_SETTLED)
                    continue;
                /* all near the kills, a sample of the rest (bounded) */
                if (!r->last && k + 8 < ts[i].nrecs && ts[i].recs[k + 8].cycle == r->cycle &&
                    rand_r(&seed) % 4 != 0)
                    continue;
                if (checked >= 4000)
                    break;
                cr_rid(rid, sizeof rid, i, r->seq);
                snprintf(body, sizeof body,
                         "{\"subject\":\"c%d\",\"request_id\":\"%s\","
                         "\"weight\":%d}", r->subj, rid, CR_RESERVE);
                if (httpc_post_json(&c, "/v1/check", SERVICE, body, &resp) < 0)
                    fail_msg("replay check: %s", c.err);
                checked++;
                if (resp.status != 200 || !strstr(resp.body, "\"allow\"") ||
                    !strstr(resp.body, "\"replayed\":true")) {
                    if (!not_replayed++)
                        snprintf(first, sizeof first,
                                 "check %s (acknowledged in cycle %d, %s): "
                                 "HTTP %d %.250s", rid, r->cycle + 1,
                                 r->state == ST_CHECKED ? "open"
                                                        : "settle sent",
                                 resp.status, resp.body);
                }
                http_resp_free(&resp);
                if (r->state != ST_SETTLED)
                    continue;
                snprintf(body, sizeof body,
                         "{\"request_id\":\"%s\",\"weight\":%d,\"status\":"
                         "\"completed\"}", rid, CR_ACTUAL);
                if (httpc_post_json(&c, "/v1/settle", SERVICE, body, &resp) < 0)
                    fail_msg("replay settle: %s", c.err);
                settles++;
                {
                    json_t *j = json_loadb(resp.body, resp.body_len, 0, NULL);
                    if (resp.status != 200 || !j ||
                        !json_is_true(json_object_get(j, "replayed")) ||
                        fabs(json_number_value(json_object_get(j, "charged")) -
                             CR_ACTUAL) > 1e-9) {
                        if (!settle_bad++ && !first[0])
                            snprintf(first, sizeof first,
                                     "settle %s (acknowledged in cycle %d): "
                                     "HTTP %d %.250s", rid, r->cycle + 1,
                                     resp.status, resp.body);
                    }
                    json_decref(j);
                }
                http_resp_free(&resp);
            }
        print_message("replayed %d acknowledged checks (%d not replayed) and "
                      "%d acknowledged settles (%d wrong)\n", checked,
                      not_replayed, settles, settle_bad);
        /* the replays charged nothing */
        for (int s = 0; s < CR_SUBJECTS && !not_replayed && !bad; s++) {
            char subj[16];
            double u;
            snprintf(subj, sizeof subj, "c%d", s);
            u = usage_used(&c, subj, "burst_5h", err, sizeof err);
            if (fabs(u - used_b[s]) > 1e-9) {
                httpc_close(&c);
                qgproc_cleanup(&p);
                fail_msg("replays charged %s: burst_5h %g -> %g", subj,
                         used_b[s], u);
            }
        }
        httpc_close(&c);
        {
            int rc = qgproc_stop(&p, 20000);
            if (bad || not_replayed || settle_bad || rc != 0)
                qgproc_dump_stderr(&p);
            qgproc_cleanup(&p);
            for (int i = 0; i < CR_THREADS; i++)
                free(ts[i].recs);
            if (bad || not_replayed || settle_bad)
                fail_msg("after kill -9:\n%s%s"
                         "%d of %d acknowledged checks not replayed, %d of %d "
                         "acknowledged settles wrong; first: %s",
                         bad ? "usage differs from the acknowledged charges "
                               "(below: acknowledged usage lost; above: "
                               "charged twice or unacknowledged):\n" : "",
                         bad ? report : "", not_replayed, checked, settle_bad,
                         settles, first[0] ? first : "-");
            if (unexpected)
                fail_msg("%d unexpected answers under load; first: %s",
                         unexpected, first_unexpected);
            assert_int_equal(rc, 0);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hot_subject),
        cmocka_unit_test(test_crash_under_load),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("server_load", tests, NULL, NULL);
}
