/* test_webhooks.c - threshold and forecast notifications end to end
 * (PRODUCT.md 7): real `quotagate serve` processes (tests/support/qgproc)
 * sending to a real HTTP receiver, a thread of this test that checks
 * every request's Standard Webhooks signature with its own computation
 * (OpenSSL's HMAC-SHA256 and base64 over "id.timestamp.body", keyed with
 * the decoded secret), itself checked first against the specification's
 * test vector.
 *
 *  - the signature verifies; one event per threshold per period even
 *    when 64 callers cross the thresholds at once;
 *  - a calendar window fires once per period, a rolling one again after
 *    its usage fell below the threshold (a new id each time);
 *  - a receiver that answers 500, then is down, then comes back gets the
 *    event with the same webhook-id on every attempt;
 *  - kill -9 of the gateway with events pending, restart: every pending
 *    event delivered, none invented;
 *  - bad rules and a missing secret are refused with clear messages;
 *  - two gateways on one PostgreSQL (tests/support/pgproc): once only
 *    across them, each delivery made by one of them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include "httpc.h"
#include "notify.h"
#include "pgproc.h"
#include "ports.h"
#include "qgproc.h"
#include "runcli.h"

#define SERVICE QGPROC_SERVICE_KEY
#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define MAX_RX 1024

/* ------------------------------------------------ the signature oracle */

/* The Standard Webhooks signature, computed here: base64 of the HMAC of
 * "id.ts.body" keyed with the bytes the secret's base64 part decodes to. */
static void sw_sign(const char *secret, const char *id, const char *ts,
                    const char *body, size_t blen, char *out, size_t cap)
{
    unsigned char key[128], md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    const char *b64 = secret + strlen("whsec_");
    size_t l = strlen(b64);
    int klen = EVP_DecodeBlock(key, (const unsigned char *)b64, (int)l);
    char *msg = malloc(strlen(id) + strlen(ts) + blen + 3);
    klen -= (l > 0 && b64[l - 1] == '=') + (l > 1 && b64[l - 2] == '=');
    size_t n = (size_t)sprintf(msg, "%s.%s.", id, ts);
    memcpy(msg + n, body, blen);
    HMAC(EVP_sha256(), key, klen, (unsigned char *)msg, n + blen, md,
         &mdlen);
    free(msg);
    assert_true(cap > 4 * ((mdlen + 2) / 3) + 3);
    memcpy(out, "v1,", 3);
    EVP_EncodeBlock((unsigned char *)out + 3, md, (int)mdlen);
}

/* --------------------------------------------------------- the receiver */

typedef struct rx_event {
    char id[64], ts[32], sig[160];
    char *body;
    int verified;
    int answered;                /* the status it was answered with */
} rx_event;

typedef struct receiver {
    int port;
    int lfd;
    pthread_t th;
    _Atomic int stop;
    _Atomic int want_up;         /* listen (1) or refuse connections (0) */
    _Atomic int is_up;
    _Atomic int fail_next;       /* answer 500 to this many requests */
    pthread_mutex_t mu;
    rx_event ev[MAX_RX];
    int n;
} receiver;

static receiver RX;

static int rx_listen(receiver *r)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)r->port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(fd, 128) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static const char *hdr(const char *head, const char *name, char *out,
                       size_t cap)
{
    size_t nl = strlen(name);
    out[0] = '\0';
    for (const char *p = strstr(head, "\r\n"); p && p[2];
         p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2, *end = strstr(line, "\r\n");
        if (!end)
            break;
        if ((size_t)(end - line) > nl + 1 && strncasecmp(line, name, nl) == 0
            && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)(end - v), v);
            return out;
        }
    }
    return NULL;
}

static void rx_conn(receiver *r, int fd)
{
    struct timeval tv = {2, 0};
    char buf[16384], cl[32], sig[160];
    size_t len = 0;
    char *eoh = NULL;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (len < sizeof buf - 1) {
        ssize_t k = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (k <= 0)
            return;
        len += (size_t)k;
        buf[len] = '\0';
        if ((eoh = strstr(buf, "\r\n\r\n"))) {
            size_t want = (size_t)(eoh + 4 - buf) +
                          (hdr(buf, "Content-Length", cl, sizeof cl)
                               ? (size_t)atol(cl) : 0);
            if (len >= want)
                break;
        }
    }
    if (!eoh)
        return;
    eoh[2] = '\0';                      /* the head keeps its last CRLF */
    rx_event e;
    memset(&e, 0, sizeof e);
    hdr(buf, "webhook-id", e.id, sizeof e.id);
    hdr(buf, "webhook-timestamp", e.ts, sizeof e.ts);
    hdr(buf, "webhook-signature", e.sig, sizeof e.sig);
    size_t blen = strlen(eoh + 4);
    e.body = strdup(eoh + 4);
    sw_sign(SECRET, e.id, e.ts, e.body, blen, sig, sizeof sig);
    e.verified = strcmp(sig, e.sig) == 0;
    if (!e.verified)
        fprintf(stderr, "receiver: bad signature on %s (%s): got %s, "
                "expected %s\n", e.id, e.ts, e.sig, sig);
    int fail = atomic_load(&r->fail_next) > 0;
    if (fail)
        atomic_fetch_sub(&r->fail_next, 1);
    e.answered = fail ? 500 : 204;
    pthread_mutex_lock(&r->mu);
    if (r->n < MAX_RX)
        r->ev[r->n++] = e;
    else
        free(e.body);
    pthread_mutex_unlock(&r->mu);
    const char *ans = fail ? "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n"
                             "Connection: close\r\n\r\n"
                           : "HTTP/1.1 204 No Content\r\n"
                             "Connection: close\r\n\r\n";
    if (send(fd, ans, strlen(ans), MSG_NOSIGNAL) < 0)
        return;
}

static void *rx_main(void *arg)
{
    receiver *r = arg;
    while (!atomic_load(&r->stop)) {
        if (atomic_load(&r->want_up) && r->lfd < 0)
            r->lfd = rx_listen(r);
        if (!atomic_load(&r->want_up) && r->lfd >= 0) {
            close(r->lfd);
            r->lfd = -1;
        }
        atomic_store(&r->is_up, r->lfd >= 0);
        if (r->lfd < 0) {
            usleep(20000);
            continue;
        }
        struct pollfd p = {r->lfd, POLLIN, 0};
        if (poll(&p, 1, 50) == 1) {
            int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                rx_conn(r, fd);
                close(fd);
            }
        }
    }
    if (r->lfd >= 0)
        close(r->lfd);
    return NULL;
}

static void rx_set_up(int up)
{
    atomic_store(&RX.want_up, up);
    for (int i = 0; i < 200 && atomic_load(&RX.is_up) != up; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&RX.is_up), up);
}

static void rx_clear(void)
{
    pthread_mutex_lock(&RX.mu);
    for (int i = 0; i < RX.n; i++)
        free(RX.ev[i].body);
    RX.n = 0;
    pthread_mutex_unlock(&RX.mu);
    atomic_store(&RX.fail_next, 0);
}

static int rx_count(void)
{
    pthread_mutex_lock(&RX.mu);
    int n = RX.n;
    pthread_mutex_unlock(&RX.mu);
    return n;
}

/* Requests answered 2xx, i.e. deliveries. */
static int rx_delivered(void)
{
    int n = 0;
    pthread_mutex_lock(&RX.mu);
    for (int i = 0; i < RX.n; i++)
        n += RX.ev[i].answered / 100 == 2;
    pthread_mutex_unlock(&RX.mu);
    return n;
}

static int wait_delivered(int n, int ms)
{
    for (long long end = qg_now_ms() + ms; qg_now_ms() < end;
         usleep(20000))
        if (rx_delivered() >= n)
            return 0;
    return -1;
}

/* The data of delivery i: its type, window and threshold (x1000; 0 for
 * null). */
static void rx_data(int i, char *type, char *window, int *thr_milli)
{
    json_error_t je;
    pthread_mutex_lock(&RX.mu);
    json_t *j = json_loads(RX.ev[i].body, 0, &je);
    pthread_mutex_unlock(&RX.mu);
    assert_non_null(j);
    json_t *d = json_object_get(j, "data");
    snprintf(type, 32, "%s", json_string_value(json_object_get(j, "type")));
    snprintf(window, 64, "%s",
             json_string_value(json_object_get(d, "window")));
    json_t *t = json_object_get(d, "threshold");
    *thr_milli = json_is_number(t) ? (int)(json_number_value(t) * 1000 + 0.5)
                                   : 0;
    assert_non_null(json_object_get(d, "used"));
    assert_non_null(json_object_get(d, "reset_at"));
    json_decref(j);
}

/* ------------------------------------------------------------ helpers */

static const char rules_head[] =
    "version: \"wh-1\"\n"
    "weights:\n"
    "  version: \"w1\"\n"
    "  calibrated: \"2026-10-15\"\n"
    "  models:\n"
    "    m: { per_request: 1, input_per_1k: 0, output_per_1k: 0 }\n"
    "default_plan: basic\n";

static void write_rules(qgproc *p, const char *windows, const char *notify)
{
    char text[4096];
    snprintf(text, sizeof text, "%splans:\n  basic:\n    windows:\n%s"
             "notifications:\n%s", rules_head, windows, notify);
    assert_int_equal(qgproc_write_file(qgproc_path(p, "rules.yaml"), text),
                     0);
}

static void notify_block(char *out, size_t cap, const char *thresholds)
{
    snprintf(out, cap, "  thresholds: %s\n  webhooks:\n"
             "    - url: http://127.0.0.1:%d/hooks/quota\n"
             "      secret_env: QG_TEST_WEBHOOK_SECRET\n", thresholds,
             RX.port);
}

static const char *const env[] = {"QG_TEST_WEBHOOK_SECRET=" SECRET,
                                  "QUOTAGATE_WEBHOOK_TIMEOUT_MS=2000", NULL};

static void start(qgproc *p, const char *windows, const char *thresholds,
                  const char *const *args)
{
    char nb[512];
    assert_int_equal(qgproc_init(p), 0);
    notify_block(nb, sizeof nb, thresholds);
    write_rules(p, windows, nb);
    if (qgproc_start(p, qgproc_path(p, "rules.yaml"), args, env) != 0)
        fail_msg("serve: %s", p->why);
}

static int check(httpc *c, const char *subject, const char *rid, int weight)
{
    char body[256];
    http_resp r;
    snprintf(body, sizeof body, "{\"subject\":\"%s\",\"request_id\":\"%s\","
             "\"weight\":%d}", subject, rid, weight);
    if (httpc_post_json(c, "/v1/check", SERVICE, body, &r) != 0)
        return -1;
    int st = r.status;
    http_resp_free(&r);
    return st;
}

/* One value of the SQLite ledger of p (an integer query). */
static long long sq_value(qgproc *p, const char *sql)
{
    char path[512];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    long long v = -1;
    snprintf(path, sizeof path, "%s/ledger.db", p->data);
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_busy_timeout(db, 5000) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* A sample of /metrics ("name{labels}" exactly), or -1. */
static long long metric(int port, const char *series)
{
    httpc c;
    http_resp r;
    long long v = -1;
    httpc_init(&c, port);
    if (httpc_get(&c, "/metrics", NULL, &r) == 0) {
        size_t n = strlen(series);
        for (char *l = r.body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n')
                                                            + 1 : NULL)
            if (strncmp(l, series, n) == 0 && l[n] == ' ') {
                v = atoll(l + n + 1);
                break;
            }
        http_resp_free(&r);
    }
    httpc_close(&c);
    return v;
}

/* ----------------------------------------------------- 64 callers */

typedef struct caller {
    int port, idx, rounds;
    pthread_barrier_t *go;
    int ok;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    httpc h;
    char rid[64];
    httpc_init(&h, c->port);
    pthread_barrier_wait(c->go);
    for (int i = 0; i < c->rounds; i++) {
        snprintf(rid, sizeof rid, "c%d-%d-%d", c->port, c->idx, i);
        int st = check(&h, "alice", rid, 1);
        c->ok += st == 200 || st == 429;
    }
    httpc_close(&h);
    return NULL;
}

/* ncallers at once, split over the ports, rounds checks each. */
static void crowd(const int *ports, int nports, int ncallers, int rounds)
{
    pthread_t th[64];
    caller cs[64];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)ncallers);
    for (int i = 0; i < ncallers; i++) {
        cs[i] = (caller){ports[i % nports], i, rounds, &go, 0};
        pthread_create(&th[i], NULL, caller_main, &cs[i]);
    }
    for (int i = 0; i < ncallers; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(cs[i].ok, rounds);
    }
    pthread_barrier_destroy(&go);
}

/* Every delivery's signature verified, ids unique among deliveries, and
 * thresholds expect[0..n) each delivered once (window given). */
static void assert_once(const char *window, const int *expect, int n)
{
    int seen[8] = {0}, total = 0;
    char type[32], win[64];
    pthread_mutex_lock(&RX.mu);
    int cnt = RX.n;
    pthread_mutex_unlock(&RX.mu);
    for (int i = 0; i < cnt; i++) {
        int thr;
        assert_true(RX.ev[i].verified);
        if (RX.ev[i].answered / 100 != 2)
            continue;
        for (int j = 0; j < i; j++)
            if (RX.ev[j].answered / 100 == 2)
                assert_string_not_equal(RX.ev[i].id, RX.ev[j].id);
        rx_data(i, type, win, &thr);
        if (strcmp(win, window) != 0)
            continue;
        assert_string_equal(type, "quota.threshold");
        total++;
        for (int k = 0; k < n; k++)
            seen[k] += thr == expect[k];
    }
    for (int k = 0; k < n; k++)
        assert_int_equal(seen[k], 1);
    assert_int_equal(total, n);
}

/* ------------------------------------------------------------- tests */

static void test_oracle_vector(void **state)
{
    char sig[160];
    const char body[] = "{\"test\": 2432232314}";
    (void)state;
    /* the Standard Webhooks specification's own example */
    sw_sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body,
            strlen(body), sig, sizeof sig);
    assert_string_equal(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

static void test_backoff_schedule(void **state)
{
    int64_t total = 0;
    int attempts = 0;
    (void)state;
    assert_true(qg__notify_backoff_ms(1) <= 5000);     /* first retry */
    for (int a = 1; a < 100; a++) {
        int64_t d = qg__notify_backoff_ms(a);
        assert_true(d > 0 && d <= 3600000);
        if (a > 1)
            assert_true(d >= qg__notify_backoff_ms(a - 1));
        if (total < QG_NOTIFY_HORIZON_MS) {
            total += d;
            attempts++;
        }
    }
    /* retries reach the 24-hour horizon in a bounded number of attempts */
    assert_true(total >= QG_NOTIFY_HORIZON_MS);
    assert_true(attempts < 60);
}

static void test_once_under_64_callers(void **state)
{
    qgproc p;
    static const int thr[3] = {500, 800, 1000};
    (void)state;
    rx_clear();
    start(&p, "      - { name: month, type: calendar, every: month,"
              " at: \"1 00:00\", tz: \"UTC\", limit: 64 }\n",
          "[0.5, 0.8, 1.0]", NULL);
    int port = qgproc_port(&p);
    crowd(&port, 1, 64, 2);          /* 128 checks, 64 admitted */
    assert_int_equal(wait_delivered(3, 20000), 0);
    /* everything the 128 decisions queued has been recorded by now */
    for (int i = 0; i < 100 && metric(port, "quotagate_webhook_backlog"); i++)
        usleep(20000);
    usleep(300000);
    assert_once("month", thr, 3);
    assert_int_equal(sq_value(&p, "SELECT count(*) FROM webhook_outbox"), 3);
    assert_int_equal(sq_value(&p, "SELECT count(*) FROM webhook_outbox"
                                  " WHERE state = 1"), 3);
    assert_int_equal(metric(port, "quotagate_webhook_deliveries_total"
                                  "{outcome=\"delivered\"}"), 3);
    assert_int_equal(metric(port, "quotagate_webhook_events_total"), 3);
    assert_int_equal(qgproc_finish(&p), 0);
}

/* Wait until window `name` of alice shows used == 0 (bounded). */
static void wait_empty(int port, const char *name)
{
    for (long long end = qg_now_ms() + 10000; qg_now_ms() < end;
         usleep(100000)) {
        httpc c;
        http_resp r;
        int empty = 0;
        httpc_init(&c, port);
        if (httpc_get(&c, "/v1/usage/alice", QGPROC_ADMIN_KEY, &r) == 0) {
            json_t *j = json_loads(r.body, 0, NULL);
            json_t *w;
            size_t i;
            json_array_foreach(json_object_get(j, "windows"), i, w)
                if (strcmp(json_string_value(json_object_get(w, "name")),
                           name) == 0)
                    empty = json_number_value(json_object_get(w, "used")) ==
                            0;
            json_decref(j);
            http_resp_free(&r);
        }
        httpc_close(&c);
        if (empty)
            return;
    }
    fail_msg("window %s did not empty", name);
}

static void test_calendar_vs_rolling(void **state)
{
    qgproc p;
    httpc c;
    char rid[32];
    int n = 0;
    (void)state;
    rx_clear();
    start(&p, "      - { name: roll, type: rolling, length: 2s, limit: 10 }\n"
              "      - { name: month, type: calendar, every: month,"
              " at: \"1 00:00\", tz: \"UTC\", limit: 20 }\n",
          "[0.5]", NULL);
    httpc_init(&c, qgproc_port(&p));
    for (int phase = 0; phase < 3; phase++) {
        for (int i = 0; i < 5; i++) {
            snprintf(rid, sizeof rid, "p%d-%d", phase, i);
            assert_int_equal(check(&c, "alice", rid, 1), 200);
        }
        /* roll fires every phase, month once (at 10 of 20, phase 2) */
        n += 1 + (phase == 1);
        assert_int_equal(wait_delivered(n, 15000), 0);
        wait_empty(qgproc_port(&p), "roll");
    }
    usleep(300000);
    assert_int_equal(rx_delivered(), 4);
    int rolls = 0, months = 0;
    for (int i = 0; i < rx_count(); i++) {
        char type[32], win[64];
        int thr;
        assert_true(RX.ev[i].verified);
        rx_data(i, type, win, &thr);
        assert_int_equal(thr, 500);
        rolls += strcmp(win, "roll") == 0;
        months += strcmp(win, "month") == 0;
        for (int j = 0; j < i; j++)
            assert_string_not_equal(RX.ev[i].id, RX.ev[j].id);
    }
    assert_int_equal(rolls, 3);
    assert_int_equal(months, 1);
    httpc_close(&c);
    assert_int_equal(qgproc_finish(&p), 0);
}

static void test_receiver_fails_then_down_then_back(void **state)
{
    qgproc p;
    httpc c;
    char id[64];
    (void)state;
    rx_clear();
    start(&p, "      - { name: month, type: calendar, every: month,"
              " at: \"1 00:00\", tz: \"UTC\", limit: 10 }\n",
          "[0.5, 1.0]", NULL);
    httpc_init(&c, qgproc_port(&p));
    /* answered 500 twice, then 204: three attempts, one id */
    atomic_store(&RX.fail_next, 2);
    for (int i = 0; i < 5; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "a%d", i);
        assert_int_equal(check(&c, "alice", rid, 1), 200);
    }
    assert_int_equal(wait_delivered(1, 30000), 0);
    assert_int_equal(rx_count(), 3);
    for (int i = 0; i < 3; i++) {
        assert_true(RX.ev[i].verified);
        assert_string_equal(RX.ev[i].id, RX.ev[0].id);
    }
    assert_int_equal(RX.ev[0].answered, 500);
    assert_int_equal(RX.ev[2].answered, 204);
    /* down: connections refused until it comes back */
    rx_set_up(0);
    for (int i = 5; i < 10; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "a%d", i);
        assert_int_equal(check(&c, "alice", rid, 1), 200);
    }
    for (int i = 0; i < 300 && sq_value(&p, "SELECT coalesce(max(attempts),"
                                           " 0) FROM webhook_outbox WHERE"
                                           " state = 0") < 1; i++)
        usleep(50000);
    assert_true(sq_value(&p, "SELECT max(attempts) FROM webhook_outbox"
                             " WHERE state = 0") >= 1);
    assert_true(metric(qgproc_port(&p), "quotagate_webhook_deliveries_total"
                                        "{outcome=\"unreachable\"}") >= 1);
    assert_int_equal(metric(qgproc_port(&p), "quotagate_webhook_backlog"), 1);
    rx_set_up(1);
    assert_int_equal(wait_delivered(2, 30000), 0);
    pthread_mutex_lock(&RX.mu);
    snprintf(id, sizeof id, "%s", RX.ev[RX.n - 1].id);
    pthread_mutex_unlock(&RX.mu);
    assert_string_not_equal(id, RX.ev[0].id);
    /* the id the outbox held while the receiver was down */
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT attempts FROM webhook_outbox WHERE"
             " id = '%s' AND state = 1", id);
    /* the receiver has it; the sender marks it delivered right after
     * (its own transaction): wait for that, bounded */
    for (int i = 0; i < 200 && sq_value(&p, sql) < 1; i++)
        usleep(50000);
    assert_true(sq_value(&p, sql) >= 1);
    assert_int_equal(metric(qgproc_port(&p), "quotagate_webhook_deliveries_"
                                             "total{outcome=\"rejected\"}"),
                     2);
    httpc_close(&c);
    assert_int_equal(qgproc_finish(&p), 0);
}

static void test_kill9_with_pending(void **state)
{
    qgproc p;
    httpc c;
    char ids[8][64];
    int nids = 0;
    (void)state;
    rx_clear();
    rx_set_up(0);
    start(&p, "      - { name: month, type: calendar, every: month,"
              " at: \"1 00:00\", tz: \"UTC\", limit: 10 }\n"
              "      - { name: roll, type: rolling, length: 1h, limit: 20 }\n",
          "[0.2, 0.5, 1.0]", NULL);
    httpc_init(&c, qgproc_port(&p));
    for (int i = 0; i < 10; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "k%d", i);
        assert_int_equal(check(&c, "alice", rid, 1), 200);
    }
    httpc_close(&c);
    /* month: 0.2, 0.5, 1.0; roll (10 of 20): 0.2, 0.5 */
    for (int i = 0; i < 200 && sq_value(&p, "SELECT count(*) FROM"
                                           " webhook_outbox") < 5; i++)
        usleep(50000);
    assert_int_equal(sq_value(&p, "SELECT count(*) FROM webhook_outbox"
                                  " WHERE state = 0"), 5);
    assert_int_equal(qgproc_kill9(&p), 0);
    {
        char path[512];
        sqlite3 *db;
        sqlite3_stmt *st;
        snprintf(path, sizeof path, "%s/ledger.db", p.data);
        assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY,
                                         NULL), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, "SELECT id FROM"
                                            " webhook_outbox", -1, &st,
                                            NULL), SQLITE_OK);
        while (sqlite3_step(st) == SQLITE_ROW && nids < 8)
            snprintf(ids[nids++], 64, "%s", sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
        sqlite3_close(db);
    }
    assert_int_equal(nids, 5);
    rx_set_up(1);
    assert_int_equal(qgproc_restart(&p), 0);
    assert_int_equal(wait_delivered(5, 30000), 0);
    usleep(300000);
    /* every pending event, each id at least once, no other id */
    for (int k = 0; k < nids; k++) {
        int got = 0;
        for (int i = 0; i < rx_count(); i++)
            got += RX.ev[i].answered == 204 &&
                   strcmp(RX.ev[i].id, ids[k]) == 0;
        assert_true(got >= 1);
    }
    for (int i = 0; i < rx_count(); i++) {
        int known = 0;
        assert_true(RX.ev[i].verified);
        for (int k = 0; k < nids; k++)
            known |= strcmp(RX.ev[i].id, ids[k]) == 0;
        assert_true(known);
    }
    assert_int_equal(sq_value(&p, "SELECT count(*) FROM webhook_outbox"
                                  " WHERE state = 1"), 5);
    assert_int_equal(qgproc_finish(&p), 0);
}

/* ---------------------------------------------------------- bad rules */

static void expect_lint_error(qgproc *p, const char *notify,
                              const char *needle)
{
    char *out = NULL, *err = NULL;
    write_rules(p, "      - { name: month, type: calendar, every: month,"
                   " at: \"1 00:00\", tz: \"UTC\", limit: 10 }\n", notify);
    const char *argv[] = {"lint", "-c", qgproc_path(p, "rules.yaml"), NULL};
    int rc = qg_run_cli(argv, 20000, &out, &err);
    if (rc != 2 || !err || !strstr(err, needle))
        fail_msg("lint exit %d, stderr \"%s\": expected \"%s\"", rc,
                 err ? err : "", needle);
    free(out);
    free(err);
}

static void test_bad_rules(void **state)
{
    qgproc p;
    (void)state;
    assert_int_equal(qgproc_init(&p), 0);
    static const struct { const char *block, *needle; } cases[] = {
        {"  thresholds: [0.8, 0.5]\n  webhooks:\n"
         "    - { url: \"http://h/x\", secret_env: S }\n",
         "rules.yaml:13:21: notifications.thresholds[1]: thresholds must be "
         "ascending and unique: 0.5 comes after 0.8"},
        {"  thresholds: [0.5, 0.5]\n  webhooks:\n"
         "    - { url: \"http://h/x\", secret_env: S }\n", "ascending and "
         "unique"},
        {"  thresholds: [1.5]\n  webhooks:\n"
         "    - { url: \"http://h/x\", secret_env: S }\n",
         "notifications.thresholds[0]: expected a fraction of the limit in "
         "(0, 1], got \"1.5\""},
        {"  thresholds: [0]\n  webhooks:\n"
         "    - { url: \"http://h/x\", secret_env: S }\n",
         "notifications.thresholds[0]: expected a positive number"},
        {"  thresholds: [0.5]\n  webhooks:\n"
         "    - { url: \"ftp://h/x\", secret_env: S }\n",
         "notifications.webhooks[0].url: expected http[s]://HOST[:PORT]"},
        {"  thresholds: [0.5]\n  webhooks:\n"
         "    - { url: \"https://h/x\", secret_env: \"whsec_abc=\" }\n",
         "notifications.webhooks[0].secret_env: expected the name of an "
         "environment variable"},
        {"  thresholds: [0.5]\n", "notifications: missing required key "
         "\"webhooks\""},
        {"  forecast: false\n  webhooks:\n"
         "    - { url: \"https://h/x\", secret_env: S }\n",
         "nothing to notify"},
        {"  thresholds: [0.5]\n  limits: 3\n  webhooks:\n"
         "    - { url: \"https://h/x\", secret_env: S }\n",
         "notifications: unknown key \"limits\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_lint_error(&p, cases[i].block, cases[i].needle);

    /* rules that load, with lint's findings: plain http, a plan that can
     * never be notified */
    {
        char text[2048], *out = NULL, *err = NULL;
        snprintf(text, sizeof text, "%splans:\n  basic:\n    windows:\n"
                 "      - { name: rpm, type: rate, per: 1m, limit: 5 }\n"
                 "notifications:\n  thresholds: [0.5]\n  webhooks:\n"
                 "    - { url: \"http://h/x\", secret_env: S }\n",
                 rules_head);
        assert_int_equal(qgproc_write_file(qgproc_path(&p, "rules.yaml"),
                                           text), 0);
        const char *argv[] = {"lint", "-c", qgproc_path(&p, "rules.yaml"),
                              NULL};
        assert_int_equal(qg_run_cli(argv, 20000, &out, &err), 1);
        assert_non_null(strstr(out, "webhook http://h/x is plain http"));
        assert_non_null(strstr(out, "[notify-plain-http]"));
        assert_non_null(strstr(out, "plan basic: notifications are on, but "
                                    "the plan has no calendar, rolling or "
                                    "session window"));
        assert_non_null(strstr(out, "[notify-no-window]"));
        free(out);
        free(err);
    }

    /* a secret that is missing or not whsec_ base64: serve refuses */
    char nb[512];
    notify_block(nb, sizeof nb, "[0.5]");
    write_rules(&p, "      - { name: month, type: calendar, every: month,"
                    " at: \"1 00:00\", tz: \"UTC\", limit: 10 }\n", nb);
    static const char *const bad_env[][3] = {
        {"QUOTAGATE_WEBHOOK_TIMEOUT_MS=2000", NULL, "the environment "
         "variable QG_TEST_WEBHOOK_SECRET that holds its secret is not set"},
        {"QG_TEST_WEBHOOK_SECRET=hunter2", NULL, "the secret in "
         "QG_TEST_WEBHOOK_SECRET: expected \"whsec_\" followed by base64"},
        {"QG_TEST_WEBHOOK_SECRET=whsec_%%%%", NULL, "not valid base64"},
    };
    for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; i++) {
        const char *e[2] = {bad_env[i][0], NULL};
        assert_int_not_equal(qgproc_start(&p, qgproc_path(&p, "rules.yaml"),
                                          NULL, e), 0);
        char *log = NULL;
        FILE *f = fopen(qgproc_path(&p, "stderr.log"), "r");
        assert_non_null(f);
        size_t cap = 0;
        ssize_t n = getdelim(&log, &cap, '\0', f);
        fclose(f);
        assert_true(n > 0);
        if (!strstr(log, bad_env[i][2]))
            fail_msg("stderr \"%s\": expected \"%s\"", log, bad_env[i][2]);
        assert_non_null(strstr(log, "rules.yaml:15: notifications."
                                    "webhooks[0]"));
        free(log);
        int tr = truncate(qgproc_path(&p, "stderr.log"), 0);
        assert_int_equal(tr, 0);
    }
    qgproc_cleanup(&p);
}

/* ---------------------------------------------- PostgreSQL, 2 instances */

static void test_pg_two_instances(void **state)
{
    pgproc pg;
    qgproc a, b;
    char db[64], url[256], out[64];
    static const int thr[3] = {500, 800, 1000};
    (void)state;
    memset(&pg, 0, sizeof pg);
    if (!pgproc_bindir()) {
        skip();
        return;
    }
    if (pgproc_start(&pg) != 0)
        fail_msg("PostgreSQL: %s", pg.why);
    assert_int_equal(pgproc_createdb(&pg, db, sizeof db), 0);
    pgproc_url(&pg, db, url, sizeof url);
    const char *args[] = {"--ledger", url, NULL};
    rx_clear();
    /* each instance counts its own callers (memory stores): both reach
     * every threshold, and only one event per threshold may exist */
    start(&a, "      - { name: month, type: calendar, every: month,"
              " at: \"1 00:00\", tz: \"UTC\", limit: 32 }\n",
          "[0.5, 0.8, 1.0]", args);
    start(&b, "      - { name: month, type: calendar, every: month,"
              " at: \"1 00:00\", tz: \"UTC\", limit: 32 }\n",
          "[0.5, 0.8, 1.0]", args);
    int ports[2] = {qgproc_port(&a), qgproc_port(&b)};
    crowd(ports, 2, 64, 1);          /* 32 at each: all thresholds, twice */
    assert_int_equal(wait_delivered(3, 20000), 0);
    for (int i = 0; i < 100 && (metric(ports[0], "quotagate_webhook_backlog")
                                || metric(ports[1],
                                          "quotagate_webhook_backlog"));
         i++)
        usleep(50000);
    usleep(500000);
    assert_once("month", thr, 3);
    assert_int_equal(pgproc_sql(&pg, db, "SELECT count(*) FROM"
                                " webhook_outbox WHERE state = 1", out,
                                sizeof out), 0);
    assert_string_equal(out, "3");
    assert_int_equal(pgproc_sql(&pg, db, "SELECT count(*) FROM notify_marks",
                                out, sizeof out), 0);
    assert_string_equal(out, "3");
    long long made = metric(ports[0], "quotagate_webhook_events_total") +
                     metric(ports[1], "quotagate_webhook_events_total");
    long long sent = metric(ports[0], "quotagate_webhook_deliveries_total"
                                      "{outcome=\"delivered\"}") +
                     metric(ports[1], "quotagate_webhook_deliveries_total"
                                      "{outcome=\"delivered\"}");
    assert_int_equal(made, 3);
    assert_int_equal(sent, 3);
    assert_int_equal(qgproc_finish(&a), 0);
    assert_int_equal(qgproc_finish(&b), 0);
    pgproc_destroy(&pg);
}

static int group_setup(void **state)
{
    (void)state;
    pthread_mutex_init(&RX.mu, NULL);
    RX.lfd = -1;
    if ((RX.port = tst_free_port()) < 0)
        return -1;
    atomic_store(&RX.want_up, 1);
    if (pthread_create(&RX.th, NULL, rx_main, &RX) != 0)
        return -1;
    return tst_wait_port(RX.port, 5000);
}

static int group_teardown(void **state)
{
    (void)state;
    atomic_store(&RX.stop, 1);
    pthread_join(RX.th, NULL);
    rx_clear();
    return 0;
}

static int setup(void **state)
{
    (void)state;
    atomic_store(&RX.want_up, 1);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_vector),
        cmocka_unit_test(test_backoff_schedule),
        cmocka_unit_test_setup(test_once_under_64_callers, setup),
        cmocka_unit_test_setup(test_calendar_vs_rolling, setup),
        cmocka_unit_test_setup(test_receiver_fails_then_down_then_back,
                               setup),
        cmocka_unit_test_setup(test_kill9_with_pending, setup),
        cmocka_unit_test(test_bad_rules),
        cmocka_unit_test_setup(test_pg_two_instances, setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
