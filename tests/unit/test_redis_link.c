/* test_redis_link.c - the asynchronous Redis link (src/store/redis_link.c,
 * redis_node.c, redis_slots.c) and the Cluster routing data
 * (redis_cluster.c), against real redis-server processes started by the
 * test (tests/support/redisproc.c).
 *
 *  - pure: CRC16 and key slots against Redis's own CLUSTER KEYSLOT for
 *    random binary keys with and without tags (empty, nested, several),
 *    the tags of every slot, CLUSTER SLOTS replies (hand-made and a real
 *    one), MOVED/ASK and the transient errors, URLs;
 *  - one node: 20,000 commands pipelined (each cb once, in order, the
 *    right values), a server killed mid-pipeline (every pending cb gets
 *    QG_EIO, fail-fast while down, back when the server is), a stopped
 *    server (SIGSTOP: each command fails at its timeout, the silent
 *    connection is dropped, back after SIGCONT), AUTH (right, wrong,
 *    missing), SELECT, error replies, binary and large arguments, the
 *    pending cap, qg__rlink_free outside and inside a cb, on_node (and a
 *    free from inside it);
 *  - Cluster (3 masters): routing checked on the owning node, per-master
 *    commands, ASK during a hand-made migration, MOVED after it,
 *    TRYAGAIN retried until a migration ends, a resharding with redis-cli
 *    under load (nothing lost or answered twice), a master killed (its slots fail within the timeout, the
 *    others keep working, back after its restart), a failover with
 *    replicas (commands resume after the promotion), seeds down.
 *
 * QG_RLINK_BENCH=1 adds the throughput figures of docs/redis-cluster.md
 * (one link, pipelined EVALSHA of a trivial script, one node and a
 * Cluster).  Skipped, with a message, when no redis-server is found. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <cmocka.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include "quotagate.h"
#include "redis_cluster.h"
#include "redis_link.h"
#include "redis_link_int.h"
#include "redisproc.h"
#include "ports.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 3                 /* ASan: time margins */
#else
#define SLOW 1
#endif

static struct event_base *base;
static struct event *tick;
static int have_server;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* Run the loop until done(arg) or max_ms. */
static void run_until(int (*done)(void *), void *arg, int max_ms)
{
    int64_t t0 = mono_ms();
    while ((!done || !done(arg)) && mono_ms() - t0 < max_ms)
        event_base_loop(base, EVLOOP_ONCE);
}

static void run_for(int ms)
{
    run_until(NULL, NULL, ms);
}

#define NEED_SERVER()                                                         \
    do {                                                                      \
        if (!have_server) {                                                   \
            print_message("SKIPPED: no redis-server found\n");                \
            skip();                                                           \
        }                                                                     \
    } while (0)

/* ------------------------------------------------------------- tallies */

/* What came back for commands 0..n-1 (ud is the index). */
typedef struct tally {
    int n;
    int *calls, *rc, *rtype;
    long long *ival;
    char **str;                /* string / status / error replies */
    char **node;               /* qg__rlink_reply_node in the cb */
    int64_t *sent_ms, *at_ms;
    int done, ok, eio, estate, errreply, other;
    int out_of_order, next;
    qg__rlink *l;              /* for hooks and reply_node */
    void (*hook)(struct tally *t, int i);
    int hook_arg;
} tally;

static tally *T;

static tally *tally_new(int n, qg__rlink *l)
{
    tally *t = calloc(1, sizeof *t);
    t->n = n;
    t->l = l;
    t->calls = calloc((size_t)n, sizeof *t->calls);
    t->rc = calloc((size_t)n, sizeof *t->rc);
    t->rtype = calloc((size_t)n, sizeof *t->rtype);
    t->ival = calloc((size_t)n, sizeof *t->ival);
    t->str = calloc((size_t)n, sizeof *t->str);
    t->node = calloc((size_t)n, sizeof *t->node);
    t->sent_ms = calloc((size_t)n, sizeof *t->sent_ms);
    t->at_ms = calloc((size_t)n, sizeof *t->at_ms);
    T = t;
    return t;
}

static void tally_free(tally *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++) {
        free(t->str[i]);
        free(t->node[i]);
    }
    free(t->calls);
    free(t->rc);
    free(t->rtype);
    free(t->ival);
    free(t->str);
    free(t->node);
    free(t->sent_ms);
    free(t->at_ms);
    if (T == t)
        T = NULL;
    free(t);
}

static void tally_cb(void *ud, const redisReply *r, int rc)
{
    int i = (int)(intptr_t)ud;
    tally *t = T;
    const char *node;
    t->calls[i]++;
    t->rc[i] = rc;
    t->at_ms[i] = mono_ms();
    t->done++;
    if (i != t->next)
        t->out_of_order++;
    t->next = i + 1;
    if ((node = qg__rlink_reply_node(t->l)) && !t->node[i])
        t->node[i] = strdup(node);
    if (rc == 0) {
        assert_non_null(r);
        t->rtype[i] = r->type;
        if (r->type == REDIS_REPLY_INTEGER)
            t->ival[i] = r->integer;
        if ((r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
             r->type == REDIS_REPLY_ERROR) && !t->str[i])
            t->str[i] = strndup(r->str, r->len);
        if (r->type == REDIS_REPLY_ERROR)
            t->errreply++;
        else
            t->ok++;
    } else {
        assert_null(r);
        if (rc == QG_EIO)
            t->eio++;
        else if (rc == QG_ESTATE)
            t->estate++;
        else
            t->other++;
    }
    if (t->hook)
        t->hook(t, i);
}

static int all_done(void *arg)
{
    tally *t = arg;
    return t->done >= t->n;
}

static void each_once(const tally *t)
{
    for (int i = 0; i < t->n; i++)
        if (t->calls[i] != 1)
            fail_msg("command %d: %d callbacks", i, t->calls[i]);
}

/* Send command i of a tally: argv of n words. */
static int send_cmd(qg__rlink *l, tally *t, int i, const char *key, int n, ...)
{
    const char *argv[8];
    va_list ap;
    va_start(ap, n);
    for (int k = 0; k < n; k++)
        argv[k] = va_arg(ap, const char *);
    va_end(ap);
    t->sent_ms[i] = mono_ms();
    return qg__rlink_command(l, key, key ? strlen(key) : 0, n, argv, NULL,
                             tally_cb, (void *)(intptr_t)i);
}

/* One PING through the link, waiting up to ms: 0 when it answered. */
static int ping_ok(qg__rlink *l, int ms)
{
    tally *prev = T, *t = tally_new(1, l);
    int ok;
    if (send_cmd(l, t, 0, NULL, 1, "PING") != 0) {
        tally_free(t);
        T = prev;
        return -1;
    }
    run_until(all_done, t, ms);
    ok = t->done == 1 && t->rc[0] == 0 ? 0 : -1;
    if (t->done == 0)          /* still pending: keep the tally alive */
        return -2;
    tally_free(t);
    T = prev;
    return ok;
}

/* Keep pinging every 20 ms until one answers (max_ms). */
static int wait_ping(qg__rlink *l, int max_ms)
{
    int64_t t0 = mono_ms();
    while (mono_ms() - t0 < max_ms) {
        int rc = ping_ok(l, 500 * SLOW);
        if (rc == 0)
            return 0;
        assert_int_not_equal(rc, -2);
        run_for(20);
    }
    return -1;
}

static qg__rlink *open_link(const char *url, const char *pw, int timeout_ms)
{
    char err[256] = "";
    qg__rlink *l = qg__rlink_new(base, url, pw, timeout_ms, err, sizeof err);
    if (!l)
        fail_msg("qg__rlink_new(%s): %s", url, err);
    return l;
}

static qg__rlink_counters counters(const qg__rlink *l)
{
    qg__rlink_counters c;
    qg__rlink_counters_get(l, &c);
    return c;
}

/* A synchronous command on a port with binary arguments; the reply. */
static redisReply *sync_cmd(int port, int argc, const char **argv, const size_t *len)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = NULL;
    if (c && !c->err) {
        redisSetTimeout(c, tv);
        r = redisCommandArgv(c, argc, argv, len);
    }
    if (c)
        redisFree(c);
    return r;
}

/* ---------------------------------------------------------------- pure */

static void test_crc16_vectors(void **state)
{
    (void)state;
    assert_int_equal(qg__rc_crc16("123456789", 9), 0x31c3);   /* XMODEM check */
    assert_int_equal(qg__rc_slot("foo", 3), 12182);            /* a real MOVED */
    assert_int_equal(qg__rc_slot("", 0), 0);
    assert_int_equal(qg__rc_slot("{user1000}.following", 20), qg__rc_slot("user1000", 8));
    assert_int_equal(qg__rc_slot("{}", 2), qg__rc_crc16("{}", 2) & 16383);
    assert_int_equal(qg__rc_slot("{}x{a}", 6), qg__rc_crc16("{}x{a}", 6) & 16383);
    assert_int_equal(qg__rc_slot("{{a}}", 5), qg__rc_slot("{a", 2) );
    assert_int_equal(qg__rc_slot("a{b}{c}", 7), qg__rc_slot("b", 1));
    assert_int_equal(qg__rc_slot("x{", 2), qg__rc_crc16("x{", 2) & 16383);
    assert_int_equal(qg__rc_slot("x}{y", 4), qg__rc_crc16("x}{y", 4) & 16383);
}

/* Every slot has a tag of at most 3 characters, and the tag found hashes
 * there. */
static void test_tag_for_slot(void **state)
{
    static const char alpha[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    unsigned char *hit = calloc(QG__RC_SLOTS, 1);
    unsigned covered = 0;
    char t[4], tag[8];
    (void)state;
    for (int n = 1; n <= 3; n++)
        for (int i = 0; i < (n == 1 ? 62 : n == 2 ? 62 * 62 : 62 * 62 * 62); i++) {
            int v = i;
            for (int k = 0; k < n; k++, v /= 62)
                t[k] = alpha[v % 62];
            hit[qg__rc_crc16(t, (size_t)n) & 16383] = 1;
        }
    for (unsigned s = 0; s < QG__RC_SLOTS; s++)
        covered += hit[s];
    assert_int_equal(covered, QG__RC_SLOTS);
    free(hit);
    for (unsigned s = 0; s < QG__RC_SLOTS; s += 97) {
        char key[32];
        int n = qg__rc_tag_for_slot(s, tag, sizeof tag);
        assert_true(n >= 1 && n <= 3);
        snprintf(key, sizeof key, "qg:epoch:{%s}", tag);
        assert_int_equal(qg__rc_slot(key, strlen(key)), s);
    }
    assert_int_equal(qg__rc_tag_for_slot(16384, tag, sizeof tag), -1);
    assert_int_equal(qg__rc_tag_for_slot(1, tag, 3), -1);
}

static redisReply *resp(const char *s)
{
    redisReader *rd = redisReaderCreate();
    void *rep = NULL;
    assert_int_equal(redisReaderFeed(rd, s, strlen(s)), REDIS_OK);
    assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_OK);
    assert_non_null(rep);
    redisReaderFree(rd);
    return rep;
}

#define NODE(h, p) "*3\r\n$" #h "\r\n" p "\r\n:" "\r\n"

static void test_parse_slots(void **state)
{
    qg__rc_map m;
    char err[160];
    redisReply *r;
    (void)state;

    /* two masters, the second's host empty (where the reply came from),
     * a replica after the first; a Redis 7 metadata element */
    r = resp("*3\r\n"
             "*4\r\n:0\r\n:5460\r\n"
             "*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*0\r\n"
             "*3\r\n$9\r\n127.0.0.1\r\n:7003\r\n$2\r\nir\r\n"
             "*3\r\n:5461\r\n:10922\r\n"
             "*3\r\n$0\r\n\r\n:7001\r\n$2\r\nie\r\n"
             "*3\r\n:10923\r\n:16383\r\n"
             "*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n");
    assert_int_equal(qg__rc_parse_slots(r, "10.0.0.9", &m, err, sizeof err), 0);
    assert_int_equal(m.nnodes, 2);
    assert_int_equal(m.covered, 16384);
    assert_string_equal(m.node[0].host, "127.0.0.1");
    assert_int_equal(m.node[0].port, 7000);
    assert_int_equal(m.node[0].nslots, 5461 + 5461);
    assert_int_equal(m.node[0].first_slot, 0);
    assert_string_equal(m.node[1].host, "10.0.0.9");
    assert_int_equal(m.node[1].port, 7001);
    assert_int_equal(m.node[1].first_slot, 5461);
    assert_int_equal(m.slot[0], 0);
    assert_int_equal(m.slot[5461], 1);
    assert_int_equal(m.slot[10922], 1);
    assert_int_equal(m.slot[16383], 0);
    qg__rc_map_free(&m);
    freeReplyObject(r);

    /* "?": no usable endpoint, its range unserved */
    r = resp("*2\r\n*3\r\n:0\r\n:99\r\n*2\r\n$1\r\n?\r\n:7000\r\n"
             "*3\r\n:100\r\n:16383\r\n*2\r\n$1\r\nh\r\n:7001\r\n");
    assert_int_equal(qg__rc_parse_slots(r, "x", &m, err, sizeof err), 0);
    assert_int_equal(m.covered, 16384 - 100);
    assert_int_equal(m.slot[5], QG__RC_NONE);
    assert_int_equal(m.nnodes, 1);
    qg__rc_map_free(&m);
    freeReplyObject(r);

    /* an empty array: nothing served (a node outside any cluster) */
    r = resp("*0\r\n");
    assert_int_equal(qg__rc_parse_slots(r, "x", &m, err, sizeof err), 0);
    assert_int_equal(m.covered, 0);
    qg__rc_map_free(&m);
    freeReplyObject(r);

    static const char *bad[] = {
        "-ERR This instance has cluster support disabled\r\n",
        ":1\r\n",
        "*1\r\n:0\r\n",                                              /* range not array */
        "*1\r\n*2\r\n:0\r\n:1\r\n",                                  /* no master */
        "*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n",           /* start > end */
        "*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:1\r\n",       /* slot range */
        "*1\r\n*3\r\n:-1\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:4\r\n*2\r\n$1\r\nh\r\n:0\r\n",           /* port 0 */
        "*1\r\n*3\r\n:0\r\n:4\r\n*2\r\n$1\r\nh\r\n:65536\r\n",
        "*1\r\n*3\r\n:0\r\n:4\r\n*2\r\n:7\r\n:1\r\n",                /* host int */
        "*1\r\n*3\r\n:0\r\n:4\r\n*1\r\n$1\r\nh\r\n",                 /* no port */
        "*1\r\n*3\r\n$1\r\n0\r\n:4\r\n*2\r\n$1\r\nh\r\n:1\r\n",      /* start str */
        "*2\r\n*3\r\n:0\r\n:9\r\n*2\r\n$1\r\nh\r\n:1\r\n"            /* overlap */
        "*3\r\n:9\r\n:20\r\n*2\r\n$1\r\ng\r\n:1\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = resp(bad[i]);
        err[0] = 0;
        if (qg__rc_parse_slots(r, "x", &m, err, sizeof err) != QG_EINVAL)
            fail_msg("bad reply %zu parsed", i);
        assert_true(err[0] != 0);
        assert_int_equal(m.nnodes, 0);
        qg__rc_map_free(&m);
        freeReplyObject(r);
    }
    assert_int_equal(qg__rc_parse_slots(NULL, "x", &m, err, sizeof err), QG_EINVAL);
}

static void test_parse_redirect(void **state)
{
    qg__rc_redirect rd;
    (void)state;
#define RD(s) qg__rc_parse_redirect(s, strlen(s), &rd)
    assert_int_equal(RD("MOVED 3999 127.0.0.1:6381"), 0);
    assert_int_equal(rd.kind, QG__RC_MOVED);
    assert_int_equal(rd.slot, 3999);
    assert_string_equal(rd.host, "127.0.0.1");
    assert_int_equal(rd.port, 6381);
    assert_int_equal(RD("ASK 0 h:1"), 0);
    assert_int_equal(rd.kind, QG__RC_ASK);
    assert_int_equal(rd.slot, 0);
    assert_string_equal(rd.host, "h");
    assert_int_equal(RD("MOVED 16383 ::1:7000"), 0);
    assert_string_equal(rd.host, "::1");
    assert_int_equal(rd.port, 7000);
    assert_int_equal(RD("MOVED 16383 [::1]:7000"), 0);
    assert_string_equal(rd.host, "::1");
    assert_int_equal(RD("MOVED 12 :7000"), 0);
    assert_string_equal(rd.host, "");
    static const char *bad[] = {
        "MOVED 16384 h:1", "MOVED x h:1", "MOVED 1 h", "MOVED 1 h:", "MOVED 1 h:0",
        "MOVED 1 h:65536", "MOVEDX 1 h:1", "MOVED  1 h:1", "MOVED 1 h:1 x",
        "MOVED 1 a b:1", "MOVED 1", "MOVED", "ASK", "ERR MOVED 1 h:1", "moved 1 h:1",
        "MOVED 1234567 h:1", "MOVED 1 h:1234567", "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (RD(bad[i]) == 0)
            fail_msg("\"%s\" parsed as a redirection", bad[i]);
#undef RD
#define KIND(s) qg__rc_error_kind(s, strlen(s))
    assert_int_equal(KIND("TRYAGAIN Multiple keys request during rehashing of slot"),
                     QG__RC_TRYAGAIN);
    assert_int_equal(KIND("CLUSTERDOWN The cluster is down"), QG__RC_CLUSTERDOWN);
    assert_int_equal(KIND("CLUSTERDOWN Hash slot not served"), QG__RC_CLUSTERDOWN);
    assert_int_equal(KIND("LOADING Redis is loading the dataset in memory"),
                     QG__RC_LOADING);
    assert_int_equal(KIND("ASK 1 h:1"), QG__RC_ASK);
    assert_int_equal(KIND("NOSCRIPT No matching script"), QG__RC_ERROR);
    assert_int_equal(KIND("ERR unknown command"), QG__RC_ERROR);
    assert_int_equal(KIND("LOADINGX"), QG__RC_ERROR);
    assert_int_equal(qg__rc_error_kind(NULL, 0), QG__RC_ERROR);
#undef KIND
}

static void test_urls(void **state)
{
    static const char *bad[] = {
        NULL, "", "http://h:1", "redis://", "redis://:1", "redis://h:0",
        "redis://h:65536", "redis://h:x", "redis://h/x", "redis://h:1/1x",
        "redis://:pw@h:1", "redis://u:pw@h", "rediss://h:1", "redis-cluster://",
        "redis-cluster://h:1/0", "redis-cluster://h:1,", "redis-cluster://h:1,,h:2",
        "redis://[::1", "redis://[zz]:1", "redis://h h:1", "redis://h:123456",
    };
    static const char *good[] = {
        "redis://127.0.0.1:1", "redis://localhost", "redis://h-1.example_x:1/3",
        "redis://[::1]:1/0", "redis://h:1/", "redis-cluster://127.0.0.1:1",
        "redis-cluster://127.0.0.1:1,127.0.0.1:2,[::1]:3,h",
    };
    char err[256];
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        qg__rlink *l = qg__rlink_new(base, bad[i], "pw-secret", 50, err, sizeof err);
        if (l) {
            qg__rlink_free(l);
            fail_msg("\"%s\" was taken", bad[i] ? bad[i] : "(null)");
        }
        assert_true(err[0] != 0);
        assert_null(strstr(err, "pw-secret"));
    }
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        qg__rlink *l = qg__rlink_new(base, good[i], NULL, 50, err, sizeof err);
        if (!l)
            fail_msg("\"%s\": %s", good[i], err);
        run_for(5);
        qg__rlink_free(l);
    }
    assert_null(qg__rlink_new(NULL, "redis://h:1", NULL, 0, err, sizeof err));
}

/* Random binary keys against CLUSTER KEYSLOT of a real node. */
static void test_slots_vs_redis(void **state)
{
    rediscluster *cl = *state;
    unsigned seed = 12345;
    char key[40];
    (void)state;
    NEED_SERVER();
    for (int i = 0; i < 600; i++) {
        size_t len = 0, n;
        redisReply *r;
        const char *argv[3] = {"CLUSTER", "KEYSLOT", key};
        size_t lens[3] = {7, 7, 0};
        seed = seed * 1103515245u + 12345u;
        n = (seed >> 16) % 24;
        for (size_t k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            switch ((seed >> 16) % 6) {
            case 0: key[len++] = '{'; break;
            case 1: key[len++] = '}'; break;
            case 2: key[len++] = (char)((seed >> 8) & 0xff); break;   /* any byte */
            default: key[len++] = (char)('a' + (seed >> 20) % 26); break;
            }
        }
        if (i % 10 == 0 && len + 2 < sizeof key) {    /* an empty tag */
            memmove(key + 2, key, len);
            key[0] = '{';
            key[1] = '}';
            len += 2;
        }
        lens[2] = len;
        r = sync_cmd(cl->node[0].port, 3, argv, lens);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        if ((unsigned)r->integer != qg__rc_slot(key, len))
            fail_msg("key %d (%zu bytes): Redis says %lld, we %u", i, len, r->integer,
                     qg__rc_slot(key, len));
        freeReplyObject(r);
    }
    /* and a real CLUSTER SLOTS reply */
    {
        const char *argv[2] = {"CLUSTER", "SLOTS"};
        redisReply *r = sync_cmd(cl->node[1].port, 2, argv, NULL);
        qg__rc_map m;
        char err[160];
        assert_non_null(r);
        assert_int_equal(qg__rc_parse_slots(r, "127.0.0.1", &m, err, sizeof err), 0);
        assert_int_equal(m.covered, 16384);
        assert_int_equal(m.nnodes, 3);
        qg__rc_map_free(&m);
        freeReplyObject(r);
    }
}

/* ------------------------------------------------------------ one node */

static void test_single_pipeline(void **state)
{
    enum { N = 20000 };
    redisproc srv;
    qg__rlink *l;
    tally *t;
    qg__rlink_counters c;
    (void)state;
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, NULL), 0);
    l = open_link(redisproc_url(&srv), NULL, 2000);
    t = tally_new(N, l);
    for (int i = 0; i < N; i++)      /* all taken before the loop runs */
        assert_int_equal(send_cmd(l, t, i, "ctr", 2, "INCR", "ctr"), 0);
    c = counters(l);
    assert_int_equal(c.pending, N);
    assert_int_equal(t->done, 0);    /* never inside the call */
    run_until(all_done, t, 20000 * SLOW);
    each_once(t);
    assert_int_equal(t->ok, N);
    assert_int_equal(t->out_of_order, 0);
    for (int i = 0; i < N; i++)
        if (t->ival[i] != i + 1)
            fail_msg("INCR %d answered %lld", i, t->ival[i]);
    assert_string_equal(t->node[0], redisproc_url(&srv) + 8);
    c = counters(l);
    assert_int_equal(c.commands, N);
    assert_int_equal(c.pending, 0);
    assert_int_equal(c.errors, 0);
    assert_int_equal(c.connects, 1);
    assert_true(c.sent >= N + 1 && c.replies >= N + 1);   /* + the PING */
    tally_free(t);

    /* an error reply is a reply; key NULL goes to the node too */
    t = tally_new(3, l);
    send_cmd(l, t, 0, "ctr", 3, "HSET", "ctr", "x");
    send_cmd(l, t, 1, NULL, 1, "NOSUCHCOMMAND");
    send_cmd(l, t, 2, NULL, 2, "GET", "ctr");
    run_until(all_done, t, 2000 * SLOW);
    assert_int_equal(t->rc[0], 0);
    assert_int_equal(t->rtype[0], REDIS_REPLY_ERROR);
    assert_int_equal(t->rtype[1], REDIS_REPLY_ERROR);
    assert_string_equal(t->str[2], "20000");
    tally_free(t);

    /* argvlen: binary arguments */
    {
        const char *argv[3] = {"SET", "bin\0key", "v\0\r\n"};
        size_t len[3] = {3, 7, 4};
        redisReply *r;
        const char *get[2] = {"STRLEN", "bin\0key"};
        size_t glen[2] = {6, 7};
        t = tally_new(1, l);
        assert_int_equal(qg__rlink_command(l, "bin\0key", 7, 3, argv, len, tally_cb, 0), 0);
        run_until(all_done, t, 2000);
        assert_int_equal(t->ok, 1);
        r = sync_cmd(srv.port, 2, get, glen);
        assert_non_null(r);
        assert_int_equal(r->integer, 4);
        freeReplyObject(r);
        tally_free(t);
    }
    /* a large argument (a script's text is tens of kB): 4 MB each way */
    {
        size_t big = 4u << 20;
        char *v = malloc(big);
        const char *argv[3] = {"SET", "big", v};
        size_t len[3] = {3, 3, big};
        memset(v, 'x', big);
        v[big - 1] = 'y';
        t = tally_new(2, l);
        assert_int_equal(qg__rlink_command(l, "big", 3, 3, argv, len, tally_cb, 0), 0);
        free(v);               /* copied */
        send_cmd(l, t, 1, "big", 2, "GET", "big");
        run_until(all_done, t, 5000 * SLOW);
        assert_int_equal(t->ok, 2);
        assert_int_equal(strlen(t->str[1]), big);
        assert_int_equal(t->str[1][big - 1], 'y');
        tally_free(t);
    }
    assert_int_equal(qg__rlink_command(l, NULL, 0, 0, NULL, NULL, tally_cb, NULL), QG_EINVAL);
    assert_int_equal(qg__rlink_command(l, NULL, 0, 1, (const char *[]){"PING"}, NULL, NULL,
                                       NULL), QG_EINVAL);
    qg__rlink_free(l);
    redisproc_stop(&srv);
}

/* Kill the server when 1,000 replies are in: every other command fails. */
static redisproc *kill_me;
static void kill_at_1000(tally *t, int i)
{
    (void)i;
    if (t->ok == 1000 && kill_me && kill_me->pid)
        redisproc_kill(kill_me);
}

static void test_single_killed(void **state)
{
    enum { N = 50000 };
    redisproc srv;
    qg__rlink *l;
    tally *t;
    qg__rlink_counters c;
    int64_t t0;
    (void)state;
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, NULL), 0);
    l = open_link(redisproc_url(&srv), NULL, 5000);
    assert_int_equal(wait_ping(l, 3000), 0);
    t = tally_new(N, l);
    kill_me = &srv;
    t->hook = kill_at_1000;
    for (int i = 0; i < N; i++)
        assert_int_equal(send_cmd(l, t, i, "k", 2, "INCR", "k"), 0);
    run_until(all_done, t, 20000 * SLOW);
    each_once(t);
    assert_int_equal(srv.pid, 0);
    assert_true(t->ok >= 1000);
    assert_true(t->eio > 0);
    assert_int_equal(t->ok + t->eio, N);
    for (int i = 0; i < N; i++)      /* the answered ones first, in order */
        if (t->rc[i] == 0 && t->ival[i] != i + 1)
            fail_msg("INCR %d answered %lld", i, t->ival[i]);
    print_message("killed after %d replies: %d commands failed with QG_EIO (%s)\n",
                  t->ok, t->eio, qg__rlink_last_error(l));
    tally_free(t);
    c = counters(l);
    assert_int_equal(c.reconnects, 1);

    /* while it is down, commands fail at once, not at their 5 s timeout */
    run_for(50);
    t = tally_new(20, l);
    t0 = mono_ms();
    for (int i = 0; i < 20; i++)
        send_cmd(l, t, i, "k", 2, "GET", "k");
    run_until(all_done, t, 6000);
    assert_int_equal(t->eio, 20);
    assert_true(mono_ms() - t0 < 1000);
    tally_free(t);
    c = counters(l);
    assert_true(c.connect_errors >= 1);

    /* back on the same port: the link reconnects by itself */
    assert_int_equal(redisproc_restart(&srv), 0);
    assert_int_equal(wait_ping(l, 5000), 0);
    c = counters(l);
    assert_int_equal(c.connects, 2);
    assert_int_equal(c.pending, 0);
    qg__rlink_free(l);
    redisproc_stop(&srv);
}

/* SIGSTOP: nothing answers; each command fails at its own deadline. */
static void test_single_stopped(void **state)
{
    enum { N = 10 };
    redisproc srv;
    qg__rlink *l;
    tally *t;
    qg__rlink_counters c;
    int64_t t0;
    (void)state;
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, NULL), 0);
    l = open_link(redisproc_url(&srv), NULL, 100);
    assert_int_equal(wait_ping(l, 3000), 0);
    kill(srv.pid, SIGSTOP);
    t = tally_new(N, l);
    for (int i = 0; i < N; i++)
        send_cmd(l, t, i, "k", 2, "INCR", "k");
    run_until(all_done, t, 3000);
    each_once(t);
    assert_int_equal(t->eio, N);
    for (int i = 0; i < N; i++) {
        int64_t took = t->at_ms[i] - t->sent_ms[i];
        if (took < 95 || took > 100 + 150 * SLOW)
            fail_msg("command %d failed after %lld ms", i, (long long)took);
    }
    print_message("stopped server: QG_EIO after %lld ms (timeout 100): %s\n",
                  (long long)(t->at_ms[0] - t->sent_ms[0]), qg__rlink_last_error(l));
    tally_free(t);

    /* for 1.2 s, one command every 50 ms: all fail, the silent connection
     * is dropped after the stall time (500 ms) and retried */
    t = tally_new(24, l);
    t0 = mono_ms();
    for (int i = 0; i < 24; i++) {
        send_cmd(l, t, i, "k", 2, "INCR", "k");
        run_for(50);
    }
    run_until(all_done, t, 2000);
    each_once(t);
    assert_int_equal(t->eio, 24);
    for (int i = 0; i < 24; i++)
        assert_true(t->at_ms[i] - t->sent_ms[i] <= 100 + 150 * SLOW);
    tally_free(t);
    c = counters(l);
    assert_true(c.reconnects >= 1);
    assert_true(c.timeouts >= N);
    assert_true(mono_ms() - t0 >= 1200);

    kill(srv.pid, SIGCONT);
    assert_int_equal(wait_ping(l, 5000), 0);
    assert_int_equal(counters(l).pending, 0);
    qg__rlink_free(l);
    redisproc_stop(&srv);
}

static void test_single_auth_db(void **state)
{
    redisproc srv;
    qg__rlink *l;
    tally *t;
    char out[512];
    (void)state;
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, "--requirepass", "s3cret-pw", NULL), 0);

    /* the right password, database 5 */
    snprintf(out, sizeof out, "%s/5", redisproc_url(&srv));
    l = open_link(out, "s3cret-pw", 1000);
    t = tally_new(2, l);
    send_cmd(l, t, 0, "a", 3, "SET", "a", "1");
    send_cmd(l, t, 1, NULL, 2, "INFO", "keyspace");
    run_until(all_done, t, 3000 * SLOW);
    assert_int_equal(t->ok, 2);
    assert_non_null(strstr(t->str[1], "db5:keys=1"));
    tally_free(t);
    qg__rlink_free(l);

    /* a wrong one: every command fails, the error says AUTH, not the word */
    l = open_link(redisproc_url(&srv), "wrong-pw", 1000);
    t = tally_new(3, l);
    for (int i = 0; i < 3; i++)
        send_cmd(l, t, i, "a", 2, "GET", "a");
    run_until(all_done, t, 3000 * SLOW);
    each_once(t);
    assert_int_equal(t->eio, 3);
    assert_non_null(strstr(qg__rlink_last_error(l), "AUTH failed"));
    assert_null(strstr(qg__rlink_last_error(l), "wrong-pw"));
    assert_true(counters(l).connect_errors >= 1);
    assert_int_equal(counters(l).connects, 0);
    tally_free(t);
    qg__rlink_free(l);

    /* none: the handshake's PING meets NOAUTH; no connection is ready */
    l = open_link(redisproc_url(&srv), "", 1000);
    t = tally_new(1, l);
    send_cmd(l, t, 0, "a", 2, "GET", "a");
    run_until(all_done, t, 3000 * SLOW);
    assert_int_equal(t->rc[0], QG_EIO);
    assert_non_null(strstr(qg__rlink_last_error(l), "PING failed: NOAUTH"));
    tally_free(t);
    qg__rlink_free(l);
    redisproc_stop(&srv);
}

/* Nothing listens: commands fail fast; the pending cap holds. */
static void test_single_refused(void **state)
{
    char url[64];
    qg__rlink *l;
    tally *t;
    int64_t t0;
    int n = 0, rc;
    (void)state;
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", tst_free_port());
    l = open_link(url, NULL, 2000);
    t = tally_new(QG__RLINK_MAX_PENDING + 1, l);   /* + the one refused */
    t0 = mono_ms();
    while ((rc = send_cmd(l, t, n, "k", 2, "GET", "k")) == 0)
        n++;
    assert_int_equal(rc, QG_EFULL);
    assert_int_equal(n, QG__RLINK_MAX_PENDING);
    t->n = n;
    assert_int_equal(t->done, 0);
    run_until(all_done, t, 10000 * SLOW);
    each_once(t);
    assert_int_equal(t->eio, n);
    print_message("refused: %d commands failed in %lld ms (timeout 2000)\n", n,
                  (long long)(mono_ms() - t0));
    assert_true(mono_ms() - t0 < 2000);      /* not at the 2 s timeout */
    assert_non_null(strstr(qg__rlink_last_error(l), "refused"));
    tally_free(t);
    qg__rlink_free(l);
}

/* qg__rlink_free outside callbacks, and inside one. */
static void free_at_10(tally *t, int i)
{
    (void)i;
    if (t->done == 10) {
        qg__rlink_free(t->l);
        assert_int_equal(qg__rlink_command(t->l, NULL, 0, 1, (const char *[]){"PING"},
                                           NULL, tally_cb, NULL), QG_ESTATE);
        qg__rlink_free(t->l);      /* again: nothing */
    }
}

static void test_free_pending(void **state)
{
    enum { N = 5000 };
    redisproc srv;
    qg__rlink *l;
    tally *t;
    (void)state;
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, NULL), 0);

    /* before anything ran: every cb inside qg__rlink_free */
    l = open_link(redisproc_url(&srv), NULL, 1000);
    t = tally_new(N, l);
    for (int i = 0; i < N; i++)
        send_cmd(l, t, i, "k", 2, "INCR", "k");
    qg__rlink_free(l);
    each_once(t);
    assert_int_equal(t->estate, N);
    tally_free(t);
    run_for(50);

    /* commands on the wire, freed from the 10th cb */
    l = open_link(redisproc_url(&srv), NULL, 1000);
    assert_int_equal(wait_ping(l, 3000), 0);
    t = tally_new(N, l);
    t->hook = free_at_10;
    for (int i = 0; i < N; i++)
        send_cmd(l, t, i, "k", 2, "INCR", "k");
    run_until(all_done, t, 5000 * SLOW);
    each_once(t);
    assert_int_equal(t->ok, 10);
    assert_int_equal(t->estate, N - 10);
    run_for(100);              /* late replies go nowhere */
    each_once(t);
    tally_free(t);
    qg__rlink_free(NULL);
    redisproc_stop(&srv);
}

/* on_node: up when a connection is ready, down when a ready one is lost;
 * the link freed from inside the down notification. */
typedef struct node_events {
    int up, down, free_on_down;
    char addr[QG__RLINK_ADDR_MAX];
    qg__rlink *l;
} node_events;

static void on_node_cb(void *ud, const char *addr, int up)
{
    node_events *e = ud;
    snprintf(e->addr, sizeof e->addr, "%s", addr);
    if (up)
        e->up++;
    else
        e->down++;
    if (!up && e->free_on_down)
        qg__rlink_free(e->l);
}

static void test_on_node(void **state)
{
    enum { N = 50000 };
    redisproc srv;
    node_events ev;
    qg__rlink *l;
    tally *t;
    (void)state;
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, NULL), 0);
    memset(&ev, 0, sizeof ev);
    l = open_link(redisproc_url(&srv), NULL, 1000);
    qg__rlink_on_node(l, on_node_cb, &ev);
    assert_int_equal(wait_ping(l, 3000), 0);
    assert_int_equal(ev.up, 1);
    assert_string_equal(ev.addr, redisproc_url(&srv) + 8);
    redisproc_kill(&srv);
    assert_int_not_equal(wait_ping(l, 300), 0);
    assert_int_equal(ev.down, 1);
    assert_int_equal(redisproc_restart(&srv), 0);
    assert_int_equal(wait_ping(l, 5000), 0);
    assert_int_equal(ev.up, 2);

    /* freed inside the notification, with commands on the wire */
    ev.free_on_down = 1;
    ev.l = l;
    t = tally_new(N, l);
    for (int i = 0; i < N; i++)
        send_cmd(l, t, i, "k", 2, "INCR", "k");
    t->hook = kill_at_1000;
    kill_me = &srv;
    run_until(all_done, t, 10000 * SLOW);
    each_once(t);
    assert_int_equal(ev.down, 2);
    assert_true(t->estate > 0);    /* those after the free */
    assert_int_equal(t->ok + t->eio + t->estate, N);
    run_for(50);
    each_once(t);
    tally_free(t);
    redisproc_stop(&srv);
}

/* ------------------------------------------------------------- Cluster */

/* "redis-cluster://127.0.0.1:P" of the first n nodes of c */
static const char *cluster_url(const rediscluster *c, int n)
{
    static char url[256];
    size_t len = (size_t)snprintf(url, sizeof url, "redis-cluster://");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(url + len, sizeof url - len, "%s127.0.0.1:%d",
                                i ? "," : "", c->node[i].port);
    return url;
}

typedef struct map_wait {
    qg__rlink *l;
    int n;
} map_wait;

static int map_ready(void *arg)
{
    map_wait *w = arg;
    qg__rlink_node nodes[8];
    int n = qg__rlink_nodes(w->l, nodes, 8);
    if (n != w->n)
        return 0;
    for (int i = 0; i < n; i++)
        if (!nodes[i].up)
            return 0;
    return 1;
}

/* Wait for a map of n masters, all connected; their list, by slot. */
static void wait_map(qg__rlink *l, int n, qg__rlink_node *out)
{
    map_wait w = {l, n};
    run_until(map_ready, &w, 10000 * SLOW);
    if (!map_ready(&w))
        fail_msg("no map of %d masters: %s", n, qg__rlink_last_error(l));
    assert_int_equal(qg__rlink_nodes(l, out, n), n);
}

static int port_of(const char *addr)
{
    const char *c = strrchr(addr, ':');
    return c ? atoi(c + 1) : -1;
}

static const redisproc *by_port(const rediscluster *c, int port)
{
    for (int i = 0; i < REDISCLUSTER_MAX; i++)
        if (c->node[i].port == port)
            return &c->node[i];
    return NULL;
}

/* The port of the master of slot, as the node at port says. */
static int owner_port(int port, unsigned slot)
{
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    redisReply *r = sync_cmd(port, 2, argv, NULL);
    qg__rc_map m;
    char err[160];
    int owner = -1;
    if (r && qg__rc_parse_slots(r, "127.0.0.1", &m, err, sizeof err) == 0) {
        if (m.slot[slot] != QG__RC_NONE)
            owner = m.node[m.slot[slot]].port;
        qg__rc_map_free(&m);
    }
    if (r)
        freeReplyObject(r);
    return owner;
}

static void node_id(int port, char *out, size_t cap)
{
    redisproc tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.port = port;
    assert_int_equal(redisproc_cmd(&tmp, out, cap, "CLUSTER", "MYID", NULL), 0);
}

static void tag_key(char *out, size_t cap, const char *prefix, unsigned slot)
{
    char tag[8];
    assert_true(qg__rc_tag_for_slot(slot, tag, sizeof tag) > 0);
    snprintf(out, cap, "%s{%s}", prefix, tag);
}

static void test_cluster_routing(void **state)
{
    enum { N = 3000 };
    rediscluster *cl = *state;
    qg__rlink_node nodes[3];
    qg__rlink *l;
    tally *t;
    char (*keys)[32] = calloc(N, sizeof *keys), val[16];
    qg__rlink_counters c;
    unsigned total = 0;
    NEED_SERVER();
    l = open_link(cluster_url(cl, 1), NULL, 2000);
    wait_map(l, 3, nodes);
    for (int i = 0; i < 3; i++) {
        total += nodes[i].nslots;
        assert_non_null(by_port(cl, port_of(nodes[i].addr)));
        if (i)
            assert_true(nodes[i].first_slot > nodes[i - 1].first_slot);
    }
    assert_int_equal(total, 16384);

    t = tally_new(N, l);
    for (int i = 0; i < N; i++) {
        const char *argv[3] = {"SET", keys[i], val};
        snprintf(keys[i], sizeof keys[i], "route:{%d}:x", i);
        snprintf(val, sizeof val, "%d", i);
        t->sent_ms[i] = mono_ms();
        assert_int_equal(qg__rlink_command(l, keys[i], strlen(keys[i]), 3, argv, NULL,
                                           tally_cb, (void *)(intptr_t)i), 0);
    }
    run_until(all_done, t, 20000 * SLOW);
    each_once(t);
    assert_int_equal(t->ok, N);
    /* each was answered by the master of its slot, and is stored there */
    for (int i = 0; i < N; i += 7) {
        unsigned slot = qg__rc_slot(keys[i], strlen(keys[i]));
        int owner = owner_port(cl->node[0].port, slot);
        char out[64];
        redisproc tmp;
        assert_int_equal(port_of(t->node[i]), owner);
        memset(&tmp, 0, sizeof tmp);
        tmp.port = owner;
        assert_int_equal(redisproc_cmd(&tmp, out, sizeof out, "GET", keys[i], NULL), 0);
        snprintf(val, sizeof val, "%d", i);
        assert_string_equal(out, val);
    }
    c = counters(l);
    assert_int_equal(c.moved, 0);
    assert_int_equal(c.ask, 0);
    assert_int_equal(c.errors, 0);
    assert_int_equal(c.connects, 3);      /* one connection per master */
    tally_free(t);

    /* every master, and one by name */
    t = tally_new(4, l);
    assert_int_equal(qg__rlink_command_all(l, 1, (const char *[]){"PING"}, NULL, tally_cb,
                                           0), 3);
    run_until(all_done, t, 3000);       /* 3 cbs, all with ud 0 */
    assert_int_equal(t->calls[0], 3);
    t->done = 0;
    t->next = 0;
    free(t->node[0]);
    t->node[0] = NULL;
    assert_int_equal(qg__rlink_command_at(l, nodes[1].addr, 1, (const char *[]){"DBSIZE"},
                                          NULL, tally_cb, 0), 0);
    run_until(all_done, t, 3000);
    assert_int_equal(t->rtype[0], REDIS_REPLY_INTEGER);
    assert_string_equal(t->node[0], nodes[1].addr);
    assert_int_equal(qg__rlink_command_at(l, "10.9.9.9:1", 1, (const char *[]){"PING"},
                                          NULL, tally_cb, 0), QG_ENOTFOUND);
    tally_free(t);
    free(keys);
    qg__rlink_free(l);
}

/* One slot migrated by hand: ASK while it moves, MOVED after. */
static void test_cluster_ask_moved(void **state)
{
    rediscluster *cl = *state;
    qg__rlink_node nodes[3];
    qg__rlink *l;
    tally *t;
    char k[32], k2[32], ida[64], idb[64], out[256], bport[16];
    unsigned slot;
    redisproc a, b;
    qg__rlink_counters c0, c;
    NEED_SERVER();
    l = open_link(cluster_url(cl, 3), NULL, 2000);
    wait_map(l, 3, nodes);
    slot = nodes[0].first_slot + 7;
    tag_key(k, sizeof k, "ask:", slot);
    tag_key(k2, sizeof k2, "ask2:", slot);
    a = *by_port(cl, port_of(nodes[0].addr));
    b = *by_port(cl, port_of(nodes[1].addr));
    node_id(a.port, ida, sizeof ida);
    node_id(b.port, idb, sizeof idb);
    snprintf(bport, sizeof bport, "%d", b.port);

    t = tally_new(1, l);
    send_cmd(l, t, 0, k, 3, "SET", k, "v1");
    run_until(all_done, t, 3000);
    assert_int_equal(t->ok, 1);
    assert_string_equal(t->node[0], nodes[0].addr);
    tally_free(t);

    {
        char s[8];
        snprintf(s, sizeof s, "%u", slot);
        assert_int_equal(redisproc_cmd(&b, out, sizeof out, "CLUSTER", "SETSLOT", s,
                                       "IMPORTING", ida, NULL), 0);
        assert_string_equal(out, "OK");
        assert_int_equal(redisproc_cmd(&a, out, sizeof out, "CLUSTER", "SETSLOT", s,
                                       "MIGRATING", idb, NULL), 0);
        assert_string_equal(out, "OK");
        assert_int_equal(redisproc_cmd(&a, out, sizeof out, "MIGRATE", "127.0.0.1",
                                       bport, k, "0", "5000", NULL), 0);
        assert_string_equal(out, "OK");

        /* k is on b now, the slot still a's: ASK, twice (no map change) */
        c0 = counters(l);
        t = tally_new(3, l);
        send_cmd(l, t, 0, k, 2, "GET", k);
        send_cmd(l, t, 1, k2, 3, "SET", k2, "v2");    /* new: created on b */
        send_cmd(l, t, 2, k, 2, "GET", k);
        run_until(all_done, t, 3000);
        each_once(t);
        assert_int_equal(t->ok, 3);
        assert_string_equal(t->str[0], "v1");
        assert_string_equal(t->str[2], "v1");
        assert_string_equal(t->node[0], nodes[1].addr);
        c = counters(l);
        assert_int_equal(c.ask - c0.ask, 3);
        assert_int_equal(c.moved - c0.moved, 0);
        tally_free(t);

        /* the migration ends: b first, then a and the third */
        assert_int_equal(redisproc_cmd(&b, out, sizeof out, "CLUSTER", "SETSLOT", s,
                                       "NODE", idb, NULL), 0);
        assert_int_equal(redisproc_cmd(&a, out, sizeof out, "CLUSTER", "SETSLOT", s,
                                       "NODE", idb, NULL), 0);
        assert_int_equal(redisproc_cmd(by_port(cl, port_of(nodes[2].addr)), out,
                                       sizeof out, "CLUSTER", "SETSLOT", s, "NODE", idb,
                                       NULL), 0);
    }
    c0 = counters(l);
    t = tally_new(2, l);
    send_cmd(l, t, 0, k, 2, "GET", k);
    run_until(all_done, t, 3000);
    assert_string_equal(t->str[0], "v1");
    assert_string_equal(t->node[0], nodes[1].addr);
    c = counters(l);
    assert_int_equal(c.moved - c0.moved, 1);
    run_for(150);              /* the refresh the MOVED asked for */
    send_cmd(l, t, 1, k2, 2, "GET", k2);
    run_until(all_done, t, 3000);
    assert_string_equal(t->str[1], "v2");
    c = counters(l);
    assert_int_equal(c.moved - c0.moved, 1);  /* the map knows now */
    assert_true(c.refreshes > c0.refreshes);
    tally_free(t);
    qg__rlink_free(l);
}

/* A window of INCRs kept in flight while redis-cli reshards. */
typedef struct churn {
    int running, sent, window;
    int nkeys;
    char (*keys)[32];
} churn;
static churn CH;

static void churn_send(tally *t)
{
    int i = CH.sent;
    const char *key = CH.keys[i % CH.nkeys];
    if (i >= t->n)
        return;
    CH.sent++;
    assert_int_equal(send_cmd(t->l, t, i, key, 2, "INCR", key), 0);
}

static void churn_hook(tally *t, int i)
{
    (void)i;
    if (CH.running)
        churn_send(t);
}

static void test_cluster_reshard(void **state)
{
    enum { CAP = 300000, KEYS = 64, MOVE = 100 };
    rediscluster *cl = *state;
    qg__rlink_node nodes[3];
    qg__rlink *l;
    tally *t;
    qg__rlink_counters c;
    char ids[64], idd[64], from[32], nmove[8];
    const char *cli;
    pid_t pid;
    int st = -1, moved_keys = 0;
    long long sum = 0;
    int64_t t0;
    NEED_SERVER();
    l = open_link(cluster_url(cl, 2), NULL, 2000);
    wait_map(l, 3, nodes);
    node_id(port_of(nodes[0].addr), ids, sizeof ids);
    node_id(port_of(nodes[2].addr), idd, sizeof idd);
    memset(&CH, 0, sizeof CH);
    CH.nkeys = KEYS;
    CH.keys = calloc(KEYS, sizeof *CH.keys);
    for (int j = 0; j < KEYS; j++)    /* in the source's first slots */
        tag_key(CH.keys[j], sizeof CH.keys[j], "rs:", nodes[0].first_slot + (unsigned)j);
    t = tally_new(CAP, l);
    t->hook = churn_hook;
    CH.running = 1;
    for (int i = 0; i < 64; i++)
        churn_send(t);
    run_for(100);

    cli = redisproc_binary();
    assert_non_null(cli);
    snprintf(from, sizeof from, "127.0.0.1:%d", port_of(nodes[0].addr));
    snprintf(nmove, sizeof nmove, "%d", MOVE);
    if ((pid = fork()) == 0) {
        char path[512];
        const char *slash = strrchr(cli, '/');
        int fd = open("/dev/null", 1);
        snprintf(path, sizeof path, "%.*s/redis-cli", (int)(slash - cli), cli);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(path, path, "--cluster", "reshard", from, "--cluster-from", ids,
              "--cluster-to", idd, "--cluster-slots", nmove, "--cluster-yes",
              (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    t0 = mono_ms();
    while (mono_ms() - t0 < 60000 && waitpid(pid, &st, WNOHANG) == 0)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    print_message("resharding %d slots took %lld ms under load\n", MOVE,
                  (long long)(mono_ms() - t0));
    run_for(300);
    CH.running = 0;
    run_until(all_done, t, 0);
    {
        int sent = CH.sent;
        int64_t t1 = mono_ms();
        while (t->done < sent && mono_ms() - t1 < 5000 * SLOW)
            event_base_loop(base, EVLOOP_ONCE);
        assert_int_equal(t->done, sent);
        for (int i = 0; i < sent; i++)
            if (t->calls[i] != 1)
                fail_msg("command %d: %d callbacks", i, t->calls[i]);
        assert_int_equal(t->eio + t->errreply + t->estate + t->other, 0);
        assert_int_equal(t->ok, sent);
        c = counters(l);
        print_message("%d INCRs during the resharding: %llu MOVED, %llu ASK, "
                      "%llu refreshes, %llu retries\n", sent,
                      (unsigned long long)c.moved, (unsigned long long)c.ask,
                      (unsigned long long)c.refreshes, (unsigned long long)c.retries);
        assert_true(c.moved > 0);
        tally_free(t);
        /* nothing lost, nothing counted twice */
        t = tally_new(KEYS, l);
        for (int j = 0; j < KEYS; j++)
            send_cmd(l, t, j, CH.keys[j], 2, "GET", CH.keys[j]);
        run_until(all_done, t, 5000);
        for (int j = 0; j < KEYS; j++) {
            assert_non_null(t->str[j]);
            sum += atoll(t->str[j]);
            if (owner_port(cl->node[0].port,
                           qg__rc_slot(CH.keys[j], strlen(CH.keys[j]))) ==
                port_of(nodes[2].addr))
                moved_keys++;
        }
        assert_int_equal(sum, sent);
        assert_true(moved_keys > KEYS / 2);
    }
    tally_free(t);
    free(CH.keys);
    qg__rlink_free(l);
}

/* A master killed (no replica): its slots fail within the timeout, the
 * other masters keep answering; back after a restart. */
static void test_cluster_master_killed(void **state)
{
    rediscluster c;
    qg__rlink_node nodes[3];
    qg__rlink *l;
    tally *t;
    char keys[3][32];
    redisproc *victim;
    int n = 0, worst = 0, back = 0;
    int64_t t0;
    (void)state;
    NEED_SERVER();
    if (rediscluster_start_opts(&c, 3, 0, 1000, 1) != 0)
        fail_msg("cluster: %s", c.why);
    l = open_link(cluster_url(&c, 3), NULL, 100);
    wait_map(l, 3, nodes);
    for (int j = 0; j < 3; j++)
        tag_key(keys[j], sizeof keys[j], "mk:", nodes[j].first_slot);
    victim = (redisproc *)by_port(&c, port_of(nodes[2].addr));
    redisproc_kill(victim);

    /* 2.5 s: past the node timeout, when the others mark it failed */
    t = tally_new(3 * 130, l);
    t0 = mono_ms();
    while (mono_ms() - t0 < 2500 && n + 3 <= t->n) {
        for (int j = 0; j < 3; j++, n++)
            send_cmd(l, t, n, keys[j], 2, "GET", keys[j]);
        run_for(20);
    }
    t->n = n;
    run_until(all_done, t, 3000);
    each_once(t);
    for (int i = 0; i < n; i++) {
        int took = (int)(t->at_ms[i] - t->sent_ms[i]);
        if (i % 3 == 2) {
            if (t->rc[i] != QG_EIO)
                fail_msg("a command for the dead master's slot: rc %d", t->rc[i]);
            if (took > worst)
                worst = took;
        } else if (t->rc[i] != 0 || t->rtype[i] == REDIS_REPLY_ERROR) {
            fail_msg("a command for a live master: rc %d %s", t->rc[i],
                     t->str[i] ? t->str[i] : "");
        }
    }
    print_message("dead master: %d commands, all QG_EIO, the slowest after %d ms "
                  "(timeout 100); the others all answered (%s)\n", n / 3, worst,
                  qg__rlink_last_error(l));
    assert_true(worst <= 100 + 150 * SLOW);
    tally_free(t);

    assert_int_equal(redisproc_restart(victim), 0);
    t = tally_new(1000, l);
    t0 = mono_ms();
    for (n = 0; n < t->n && !back && mono_ms() - t0 < 15000; n++) {
        send_cmd(l, t, n, keys[2], 2, "GET", keys[2]);
        while (t->done <= n)
            event_base_loop(base, EVLOOP_ONCE);
        back = t->rc[n] == 0 && t->rtype[n] != REDIS_REPLY_ERROR;
        if (!back)
            run_for(20);
    }
    assert_true(back);
    print_message("restarted master answers again %lld ms after its restart\n",
                  (long long)(mono_ms() - t0));
    t->n = n;
    tally_free(t);
    qg__rlink_free(l);
    rediscluster_stop(&c);
}

/* 3 masters and 3 replicas: a master killed, its replica promoted, the
 * link follows after a refresh. */
static void test_cluster_failover(void **state)
{
    rediscluster c;
    qg__rlink_node nodes[3], after[3];
    qg__rlink *l;
    tally *t;
    char keys[2][32], out[512];
    redisproc *victim;
    int replica_port = 0, n = 0, resumed = -1, other_bad = 0;
    int64_t t0;
    qg__rlink_counters c0;
    (void)state;
    NEED_SERVER();
    if (rediscluster_start_opts(&c, 3, 1, 1000, 1) != 0)
        fail_msg("cluster: %s", c.why);
    l = open_link(cluster_url(&c, 1), NULL, 100);
    wait_map(l, 3, nodes);
    tag_key(keys[0], sizeof keys[0], "fo:", nodes[0].first_slot);
    tag_key(keys[1], sizeof keys[1], "fo:", nodes[1].first_slot);
    victim = (redisproc *)by_port(&c, port_of(nodes[0].addr));
    for (int i = 3; i < 6; i++) {    /* the victim's replica */
        assert_int_equal(redisproc_cmd(&c.node[i], out, sizeof out, "ROLE", NULL), 0);
        if (atoi(strchr(out, '\n') + 1 + strcspn(strchr(out, '\n') + 1, "\n") + 1) ==
            victim->port)
            replica_port = c.node[i].port;
    }
    assert_true(replica_port > 0);
    t = tally_new(1, l);
    send_cmd(l, t, 0, keys[0], 3, "SET", keys[0], "before");
    run_until(all_done, t, 2000);
    assert_int_equal(t->ok, 1);
    tally_free(t);
    run_for(200);              /* replicated */
    c0 = counters(l);

    redisproc_kill(victim);
    t = tally_new(2 * 1000, l);
    t0 = mono_ms();
    while (mono_ms() - t0 < 20000 && n + 2 <= t->n) {
        send_cmd(l, t, n, keys[0], 2, "GET", keys[0]);
        send_cmd(l, t, n + 1, keys[1], 2, "GET", keys[1]);
        n += 2;
        run_for(20);
        if (t->calls[n - 2] && t->rc[n - 2] == 0 && t->str[n - 2] &&
            strcmp(t->str[n - 2], "before") == 0) {
            resumed = (int)(t->at_ms[n - 2] - t0);
            break;
        }
    }
    t->n = n;
    run_until(all_done, t, 2000);
    each_once(t);
    for (int i = 1; i < n; i += 2)
        other_bad += t->rc[i] != 0 || t->rtype[i] == REDIS_REPLY_ERROR;
    if (resumed < 0)
        fail_msg("no answer after the failover: %s", qg__rlink_last_error(l));
    assert_int_equal(port_of(t->node[n - 2]), replica_port);
    print_message("failover: the killed master's slots answered again after %d ms "
                  "(node timeout 1000), by the promoted replica; %d commands for "
                  "another master failed meanwhile\n", resumed, other_bad);
    assert_int_equal(other_bad, 0);
    tally_free(t);
    assert_true(counters(l).refreshes > c0.refreshes);
    wait_map(l, 3, after);
    {
        int found = 0;
        for (int i = 0; i < 3; i++) {
            found += port_of(after[i].addr) == replica_port;
            assert_int_not_equal(port_of(after[i].addr), victim->port);
        }
        assert_int_equal(found, 1);
    }
    qg__rlink_free(l);
    rediscluster_stop(&c);
}

/* A multi-key command in a slot half migrated gets TRYAGAIN: retried
 * until the migration ends, then MOVED to the new master. */
typedef struct finish_mig {
    const redisproc *a, *b, *c;
    char slot[8], idb[64], bport[16], key[32];
} finish_mig;

static void finish_migration(evutil_socket_t fd, short what, void *arg)
{
    finish_mig *m = arg;
    char out[128];
    (void)fd;
    (void)what;
    redisproc_cmd(m->a, out, sizeof out, "MIGRATE", "127.0.0.1", m->bport, m->key,
                  "0", "5000", NULL);
    redisproc_cmd(m->b, out, sizeof out, "CLUSTER", "SETSLOT", m->slot, "NODE", m->idb,
                  NULL);
    redisproc_cmd(m->a, out, sizeof out, "CLUSTER", "SETSLOT", m->slot, "NODE", m->idb,
                  NULL);
    redisproc_cmd(m->c, out, sizeof out, "CLUSTER", "SETSLOT", m->slot, "NODE", m->idb,
                  NULL);
}

static void test_cluster_tryagain(void **state)
{
    rediscluster *cl = *state;
    qg__rlink_node nodes[3];
    qg__rlink *l;
    tally *t;
    finish_mig m;
    char ka[32], kb[32], ida[64], out[128];
    unsigned slot;
    qg__rlink_counters c0, c;
    struct event *ev;
    struct timeval tv = {0, 100000};
    redisReply *r;
    NEED_SERVER();
    l = open_link(cluster_url(cl, 3), NULL, 2000);
    wait_map(l, 3, nodes);
    slot = nodes[0].first_slot + 11;
    tag_key(ka, sizeof ka, "ta:", slot);
    tag_key(kb, sizeof kb, "tb:", slot);
    memset(&m, 0, sizeof m);
    m.a = by_port(cl, port_of(nodes[0].addr));
    m.b = by_port(cl, port_of(nodes[1].addr));
    m.c = by_port(cl, port_of(nodes[2].addr));
    node_id(m.a->port, ida, sizeof ida);
    node_id(m.b->port, m.idb, sizeof m.idb);
    snprintf(m.slot, sizeof m.slot, "%u", slot);
    snprintf(m.bport, sizeof m.bport, "%d", m.b->port);
    snprintf(m.key, sizeof m.key, "%s", kb);

    t = tally_new(3, l);
    send_cmd(l, t, 0, ka, 3, "SET", ka, "va");
    send_cmd(l, t, 1, kb, 3, "SET", kb, "vb");
    run_until(all_done, t, 3000);
    assert_int_equal(t->ok, 2);
    t->n = 3;
    assert_int_equal(redisproc_cmd(m.b, out, sizeof out, "CLUSTER", "SETSLOT", m.slot,
                                   "IMPORTING", ida, NULL), 0);
    assert_int_equal(redisproc_cmd(m.a, out, sizeof out, "CLUSTER", "SETSLOT", m.slot,
                                   "MIGRATING", m.idb, NULL), 0);
    assert_int_equal(redisproc_cmd(m.a, out, sizeof out, "MIGRATE", "127.0.0.1",
                                   m.bport, ka, "0", "5000", NULL), 0);
    assert_string_equal(out, "OK");
    {   /* what Redis answers now, to be sure of the case */
        const char *argv[3] = {"MGET", ka, kb};
        r = sync_cmd(m.a->port, 3, argv, NULL);
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_ERROR);
        assert_int_equal(qg__rc_error_kind(r->str, r->len), QG__RC_TRYAGAIN);
        freeReplyObject(r);
    }
    ev = evtimer_new(base, finish_migration, &m);
    evtimer_add(ev, &tv);
    c0 = counters(l);
    t->done = t->next = 2;
    send_cmd(l, t, 2, ka, 3, "MGET", ka, kb);
    run_until(all_done, t, 5000);
    event_free(ev);
    assert_int_equal(t->rc[2], 0);
    assert_int_equal(t->rtype[2], REDIS_REPLY_ARRAY);
    c = counters(l);
    print_message("MGET in a half-migrated slot: %llu TRYAGAIN retried, then %llu MOVED, "
                  "answered after %lld ms\n",
                  (unsigned long long)(c.retries - c0.retries),
                  (unsigned long long)(c.moved - c0.moved),
                  (long long)(t->at_ms[2] - t->sent_ms[2]));
    assert_true(c.retries - c0.retries >= 5);
    assert_true(c.moved - c0.moved >= 1);
    assert_int_equal(port_of(t->node[2]), m.b->port);
    tally_free(t);
    qg__rlink_free(l);
}

/* A dead seed before a live one; only dead seeds; a seed that is no
 * Cluster node. */
static void test_cluster_seeds(void **state)
{
    rediscluster *cl = *state;
    qg__rlink_node nodes[3];
    char url[256];
    qg__rlink *l;
    tally *t;
    redisproc single;
    int64_t t0;
    NEED_SERVER();
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d",
             tst_free_port(), cl->node[1].port);
    l = open_link(url, NULL, 1000);
    wait_map(l, 3, nodes);
    assert_int_equal(wait_ping(l, 2000), 0);
    qg__rlink_free(l);

    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d",
             tst_free_port(), tst_free_port() + 1);
    l = open_link(url, NULL, 1000);
    run_for(30);
    t = tally_new(5, l);
    t0 = mono_ms();
    for (int i = 0; i < 5; i++)
        send_cmd(l, t, i, "k", 2, "GET", "k");
    run_until(all_done, t, 3000);
    each_once(t);
    assert_int_equal(t->eio, 5);
    assert_true(mono_ms() - t0 < 900);
    assert_int_equal(qg__rlink_nodes(l, NULL, 0), 0);
    assert_int_equal(qg__rlink_command_all(l, 1, (const char *[]){"PING"}, NULL,
                                           tally_cb, 0), 0);
    tally_free(t);
    qg__rlink_free(l);

    assert_int_equal(redisproc_start(&single, NULL), 0);
    snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d", single.port);
    l = open_link(url, NULL, 300);
    t = tally_new(1, l);
    send_cmd(l, t, 0, "k", 2, "GET", "k");
    run_until(all_done, t, 3000);
    assert_int_equal(t->eio, 1);
    assert_non_null(strstr(qg__rlink_last_error(l), "cluster support disabled"));
    assert_true(counters(l).refresh_errors >= 1);
    tally_free(t);
    qg__rlink_free(l);
    redisproc_stop(&single);
}

/* ---------------------------------------------------------------- bench */

typedef struct load {
    qg__rlink *l;
    int running;
    long sent, ok, bad;
    char sha[48];
    int nkeys;
    char (*keys)[32];
} load;

static void load_send(load *ld);
static void load_cb(void *ud, const redisReply *r, int rc)
{
    load *ld = ud;
    if (rc == 0 && r->type == REDIS_REPLY_INTEGER)
        ld->ok++;
    else
        ld->bad++;
    if (ld->running)
        load_send(ld);
}

static void load_send(load *ld)
{
    const char *key = ld->keys[ld->sent % ld->nkeys];
    const char *argv[4] = {"EVALSHA", ld->sha, "1", key};
    ld->sent++;
    if (qg__rlink_command(ld->l, key, strlen(key), 4, argv, NULL, load_cb, ld) != 0)
        ld->bad++;
}

static void sha_cb(void *ud, const redisReply *r, int rc)
{
    load *ld = ud;
    if (rc == 0 && r->type == REDIS_REPLY_STRING)
        snprintf(ld->sha, sizeof ld->sha, "%s", r->str);
    ld->ok++;
}

static double cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* Commands per second through one link with `window` EVALSHA in flight;
 * the client's CPU time per command in *us. */
static double measure(qg__rlink *l, int nkeys, int window, int ms, double *us)
{
    double cpu0;
    load ld;
    int nodes = qg__rlink_nodes(l, NULL, 0);
    int64_t t0;
    long ok0;
    memset(&ld, 0, sizeof ld);
    ld.l = l;
    ld.nkeys = nkeys;
    ld.keys = calloc((size_t)nkeys, sizeof *ld.keys);
    for (int i = 0; i < nkeys; i++)
        snprintf(ld.keys[i], sizeof ld.keys[i], "bench:{%d}", i);
    assert_int_equal(qg__rlink_command_all(l, 3, (const char *[]){"SCRIPT", "LOAD",
                                           "return 1"}, NULL, sha_cb, &ld), nodes);
    while (ld.ok < nodes)
        event_base_loop(base, EVLOOP_ONCE);
    ld.ok = 0;
    ld.running = 1;
    for (int i = 0; i < window; i++)
        load_send(&ld);
    run_for(300);              /* warm up */
    t0 = mono_ms();
    ok0 = ld.ok;
    cpu0 = cpu_us();
    run_for(ms);
    {
        double rate = (double)(ld.ok - ok0) * 1000.0 / (double)(mono_ms() - t0);
        *us = (cpu_us() - cpu0) / (double)(ld.ok - ok0);
        ld.running = 0;
        while (ld.ok + ld.bad < ld.sent)
            event_base_loop(base, EVLOOP_ONCE);
        assert_int_equal(ld.bad, 0);
        free(ld.keys);
        return rate;
    }
}

static void test_bench(void **state)
{
    static const int windows[] = {1, 16, 64, 256, 1024};
    const char *env = getenv("QG_RLINK_BENCH");
    redisproc srv;
    rediscluster c;
    qg__rlink *l;
    qg__rlink_node nodes[3];
    int ms = env && atoi(env) > 1 ? atoi(env) * 1000 : 3000;
    (void)state;
    if (!env || !*env) {
        print_message("SKIPPED: QG_RLINK_BENCH=SECONDS measures throughput\n");
        skip();
    }
    NEED_SERVER();
    assert_int_equal(redisproc_start(&srv, NULL), 0);
    l = open_link(redisproc_url(&srv), NULL, 2000);
    assert_int_equal(wait_ping(l, 3000), 0);
    for (size_t i = 0; i < sizeof windows / sizeof *windows; i++) {
        double us, rate = measure(l, 1000, windows[i], ms, &us);
        print_message("one node, one link, %4d in flight: %.0f EVALSHA/s, "
                      "client CPU %.2f us each\n", windows[i], rate, us);
    }
    qg__rlink_free(l);
    redisproc_stop(&srv);

    assert_int_equal(rediscluster_start(&c), 0);
    l = open_link(cluster_url(&c, 1), NULL, 2000);
    wait_map(l, 3, nodes);
    for (size_t i = 0; i < sizeof windows / sizeof *windows; i++) {
        double us, rate = measure(l, 1000, windows[i], ms, &us);
        print_message("cluster (3 masters), one link, %4d in flight: %.0f EVALSHA/s, "
                      "client CPU %.2f us each\n", windows[i], rate, us);
    }
    qg__rlink_free(l);
    rediscluster_stop(&c);
}

/* ---------------------------------------------------------------- main */

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    {
        struct timeval tv = {0, 5000};
        event_add(tick, &tv);
    }
    have_server = redisproc_binary() != NULL;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    event_free(tick);
    event_base_free(base);
    return 0;
}

static int cluster_setup(void **state)
{
    static rediscluster cl;
    *state = &cl;
    if (have_server && rediscluster_start(&cl) != 0) {
        print_message("cluster: %s\n", cl.why);
        return -1;
    }
    return 0;
}

static int cluster_teardown(void **state)
{
    rediscluster_stop(*state);
    return 0;
}

/* ------------------------------------------------------ reply objects */

/* Two replies' trees are the same: types, integers, strings, elements. */
static void same_tree(const redisReply *a, const redisReply *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->integer, b->integer);
    assert_int_equal(a->len, b->len);
    if (a->str || b->str) {
        assert_non_null(a->str);
        assert_non_null(b->str);
        assert_memory_equal(a->str, b->str, a->len);
        assert_int_equal(a->str[a->len], 0);
    }
    assert_int_equal(a->elements, b->elements);
    for (size_t i = 0; i < a->elements; i++)
        same_tree(a->element[i], b->element[i]);
}

/* Every reply of text, the reader fed `step` bytes at a time and
 * drained after each; their count, or -1 when the reader fails. */
static int read_all(redisReader *rd, const char *text, size_t step,
                    void **out, int max)
{
    size_t len = strlen(text);
    int n = 0;
    for (size_t fed = 0; fed < len;) {
        size_t k = len - fed < step ? len - fed : step;
        void *reply;
        assert_int_equal(redisReaderFeed(rd, text + fed, k), REDIS_OK);
        fed += k;
        do {
            reply = NULL;
            if (redisReaderGetReply(rd, &reply) != REDIS_OK)
                return -1;
            if (reply) {
                assert_true(n < max);
                out[n++] = reply;
            }
        } while (reply);
    }
    return n;
}

/* redis_reply_mem.c builds the same trees as hiredis's own functions, for
 * every kind of reply, whole or fed a byte at a time; a reader failing or
 * freed mid-reply frees what it built (ASan would name a leak). */
static void test_reply_blocks(void **state)
{
    char big[3000], text[8000];
    static const size_t steps[] = {1, 7, 100000};
    (void)state;
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    snprintf(text, sizeof text,
             "+OK\r\n-ERR wrong\r\n:42\r\n:-7\r\n$-1\r\n*-1\r\n*0\r\n"
             "$0\r\n\r\n$5\r\nhello\r\n"
             "*4\r\n$2\r\nok\r\n:1\r\n:2\r\n$-1\r\n"
             "*3\r\n*2\r\n:1\r\n$3\r\nabc\r\n*0\r\n*1\r\n*1\r\n:9\r\n"
             "*2\r\n$%zu\r\n%s\r\n+done\r\n$%zu\r\n%s\r\n",
             strlen(big), big, strlen(big), big);
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        redisReader *mine = redisReaderCreateWithFunctions(&qg__rl_reply_fns);
        redisReader *theirs = redisReaderCreate();
        void *a[32], *b[32];
        int na = read_all(mine, text, steps[s], a, 32);
        int nb = read_all(theirs, text, steps[s], b, 32);
        assert_int_equal(na, 13);
        assert_int_equal(nb, 13);
        for (int i = 0; i < na; i++) {
            same_tree(a[i], b[i]);
            qg__rl_reply_fns.freeObject(a[i]);
            freeReplyObject(b[i]);
        }
        redisReaderFree(mine);
        redisReaderFree(theirs);
    }
    /* a half-read array, then the reader freed; then a protocol error in
     * the middle of an array */
    {
        redisReader *rd = redisReaderCreateWithFunctions(&qg__rl_reply_fns);
        void *reply = NULL;
        const char *half = "*3\r\n$3\r\nabc\r\n:5\r\n";
        assert_int_equal(redisReaderFeed(rd, half, strlen(half)), REDIS_OK);
        assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_OK);
        assert_null(reply);
        redisReaderFree(rd);
        rd = redisReaderCreateWithFunctions(&qg__rl_reply_fns);
        half = "*3\r\n$3\r\nabc\r\n?bad\r\n";
        assert_int_equal(redisReaderFeed(rd, half, strlen(half)), REDIS_OK);
        assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_ERR);
        redisReaderFree(rd);
    }
}

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_crc16_vectors),
        cmocka_unit_test(test_tag_for_slot),
        cmocka_unit_test(test_parse_slots),
        cmocka_unit_test(test_parse_redirect),
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_reply_blocks),
        cmocka_unit_test(test_single_refused),
        cmocka_unit_test(test_single_pipeline),
        cmocka_unit_test(test_single_killed),
        cmocka_unit_test(test_single_stopped),
        cmocka_unit_test(test_single_auth_db),
        cmocka_unit_test(test_free_pending),
        cmocka_unit_test(test_on_node),
        cmocka_unit_test(test_cluster_master_killed),
        cmocka_unit_test(test_cluster_failover),
        cmocka_unit_test(test_bench),
    };
    const struct CMUnitTest shared[] = {
        cmocka_unit_test(test_slots_vs_redis),
        cmocka_unit_test(test_cluster_routing),
        cmocka_unit_test(test_cluster_ask_moved),
        cmocka_unit_test(test_cluster_reshard),
        cmocka_unit_test(test_cluster_tryagain),
        cmocka_unit_test(test_cluster_seeds),
    };
    int rc = 0;
    group_setup(NULL);
    rc |= _cmocka_run_group_tests("redis_link", pure, sizeof pure / sizeof *pure,
                                  NULL, NULL);
    rc |= _cmocka_run_group_tests("redis_link_cluster", shared,
                                  sizeof shared / sizeof *shared, cluster_setup,
                                  cluster_teardown);
    group_teardown(NULL);
    return rc;
}
