/* test_server_reload.c - a reload never stalls the serving threads
 * (issue 8: a 12.6 MB rules file reloaded through the admin API stalled
 * its worker's clients for 10 s).
 *
 * One server of its own with a single worker (`--workers 1`), so a load
 * on a worker would stall every client.  The rules file is replaced by a
 * FIFO: a load then blocks in open() until the test writes the rules,
 * which makes "a load in progress" a state the test holds for as long as
 * it likes, with no timing involved.  While the admin API's reload waits
 * on the FIFO, the same worker must answer /healthz and /v1/check; a
 * second reload that arrives meanwhile is answered by the next load (it
 * sees the file as written after its request), and a SIGHUP likewise. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "httpc.h"
#include "qgproc.h"
#include "srvtest.h"

#define ADMIN QGPROC_ADMIN_KEY
#define SERVICE QGPROC_SERVICE_KEY

static qgproc P;
static char *Rules_text;           /* tests/data/server/rules.yaml */

static const char *td(const char *name)
{
    const char *d = getenv("QG_TESTDATA");
    return tst_fmt("%s/%s", d ? d : "tests/data", name);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The test rules with their version id replaced. */
static const char *rules_version(const char *version)
{
    const char *v = strstr(Rules_text, "version: \"srv-1\"");
    assert_non_null(v);
    return tst_fmt("%.*sversion: \"%s\"%s", (int)(v - Rules_text), Rules_text,
                   version, v + strlen("version: \"srv-1\""));
}

/* Open the FIFO for writing once a reader (a load) has it open: a
 * non-blocking open fails with ENXIO until then.  Waits up to 20 s. */
static int fifo_writer(const char *path)
{
    long long t0 = qg_now_ms();
    for (;;) {
        int fd = open(path, O_WRONLY | O_NONBLOCK);
        if (fd >= 0) {
            fcntl(fd, F_SETFL, 0);
            return fd;
        }
        if (errno != ENXIO || qg_now_ms() - t0 > 20000)
            return -1;
        tst_sleep_ms(10);
    }
}

/* Write the rules into the FIFO the load waits on. */
static void feed(const char *fifo, const char *version)
{
    const char *text = rules_version(version);
    size_t len = strlen(text), off = 0;
    int fd = fifo_writer(fifo);
    if (fd < 0)
        fail_msg("no load opened the rules FIFO within 20 s");
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);
        if (n <= 0)
            fail_msg("writing the rules into the FIFO: %s", strerror(errno));
        off += (size_t)n;
    }
    close(fd);
}

/* Send POST /v1/admin/reload on c without reading the answer. */
static void send_reload(httpc *c)
{
    const char *raw = "POST /v1/admin/reload HTTP/1.1\r\nHost: t\r\n"
                      "Authorization: Bearer " ADMIN "\r\n"
                      "Content-Length: 0\r\n\r\n";
    if (httpc_connect(c) < 0 || httpc_send_raw(c, raw, strlen(raw)) < 0)
        fail_msg("sending a reload: %s", c->err);
}

static void want_reloaded(httpc *c, const char *version, const char *what)
{
    http_resp r;
    json_t *j;
    memset(&r, 0, sizeof r);
    if (httpc_read_response(c, 0, &r) < 0)
        fail_msg("%s: no answer: %s", what, c->err);
    tst_want_status(&r, 200, what, __LINE__);
    j = tst_jparse(&r, what);
    if (strcmp(tst_jstr(j, "rules_version", what), version) != 0)
        fail_msg("%s: rules_version %s, want %s", what,
                 tst_jstr(j, "rules_version", what), version);
    http_resp_free(&r);
}

/* The worker still serves: /healthz and a check, on new connections. */
static void want_serving(const char *what)
{
    httpc c;
    http_resp r;
    httpc_init(&c, qgproc_port(&P));
    c.timeout_ms = 15000;
    memset(&r, 0, sizeof r);
    if (httpc_get(&c, "/healthz", NULL, &r) < 0)
        fail_msg("%s: GET /healthz got no answer while a reload is in "
                 "progress (the worker is stalled): %s", what, c.err);
    tst_want_status(&r, 200, what, __LINE__);
    http_resp_free(&r);
    memset(&r, 0, sizeof r);
    if (httpc_post_json(&c, "/v1/check", SERVICE,
                        tst_fmt("{\"subject\":\"%s\",\"request_id\":\"%s\","
                                "\"weight\":1}", tst_uid("s"), tst_uid("r")),
                        &r) < 0)
        fail_msg("%s: POST /v1/check got no answer while a reload is in "
                 "progress: %s", what, c.err);
    if (r.status != 200 && r.status != 404)   /* no default plan */
        fail_msg("%s: check answered %d", what, r.status);
    http_resp_free(&r);
    httpc_close(&c);
}

static const char *plans_version(void)
{
    httpc c;
    http_resp r;
    json_t *j;
    const char *v;
    httpc_init(&c, qgproc_port(&P));
    memset(&r, 0, sizeof r);
    if (httpc_get(&c, "/v1/plans", NULL, &r) < 0)
        fail_msg("GET /v1/plans: %s", c.err);
    j = tst_jparse(&r, "plans");
    v = tst_fmt("%s", tst_jstr(j, "rules_version", "plans"));
    http_resp_free(&r);
    httpc_close(&c);
    return v;
}

static int setup(void **state)
{
    const char *args[] = {"--workers", "1", NULL};
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!(Rules_text = slurp(td("server/rules.yaml"))) || qgproc_init(&P) < 0)
        return -1;
    return qgproc_start_copy(&P, td("server/rules.yaml"), args, NULL);
}

static int teardown(void **state)
{
    const char *rules = qgproc_path(&P, "rules.yaml");
    struct stat st;
    (void)state;
    /* a failed test may leave a load blocked on the FIFO: feed it (a stop
     * waits for a load in progress) */
    for (int i = 0; i < 3 && stat(rules, &st) == 0 && S_ISFIFO(st.st_mode);
         i++) {
        int fd = open(rules, O_WRONLY | O_NONBLOCK);
        if (fd >= 0) {
            ssize_t n = write(fd, Rules_text, strlen(Rules_text));
            (void)n;
            close(fd);
        }
        tst_sleep_ms(100);
    }
    unlink(rules);                      /* a plain file again */
    qgproc_write_file(rules, Rules_text);
    free(Rules_text);
    return qgproc_finish(&P);
}

static int gc_teardown(void **state)
{
    (void)state;
    tst_gc_free_all();
    return 0;
}

static void test_admin_reload_off_worker(void **state)
{
    const char *fifo = tst_fmt("%s", qgproc_path(&P, "rules.yaml"));
    httpc a, b;
    (void)state;
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    httpc_init(&a, qgproc_port(&P));
    httpc_init(&b, qgproc_port(&P));
    a.timeout_ms = b.timeout_ms = 20000;

    send_reload(&a);
    /* the load is now blocked on the FIFO (a reader holds it open) */
    {
        int fd = fifo_writer(fifo);
        if (fd < 0)
            fail_msg("the admin reload never opened the rules file");
        close(fd);                      /* EOF: that load reads nothing */
    }
    /* that load failed on an empty file: its answer is a 400 */
    {
        http_resp r;
        memset(&r, 0, sizeof r);
        if (httpc_read_response(&a, 0, &r) < 0)
            fail_msg("reload of an empty file: no answer: %s", a.err);
        tst_want_status(&r, 400, "reload of an empty rules file",
                        __LINE__);
        http_resp_free(&r);
    }

    send_reload(&a);
    {
        /* wait until that load has opened the FIFO, without feeding it:
         * a second non-blocking writer is how we see the reader */
        long long t0 = qg_now_ms();
        int fd;
        while ((fd = open(fifo, O_WRONLY | O_NONBLOCK)) < 0 &&
               errno == ENXIO && qg_now_ms() - t0 < 20000)
            tst_sleep_ms(10);
        if (fd < 0)
            fail_msg("the second reload never opened the rules file");
        /* the load in progress is blocked on this FIFO until we write and
         * close it: serve meanwhile, on the only worker */
        want_serving("admin reload in progress");
        /* a reload arriving now waits for the next load */
        send_reload(&b);
        want_serving("two reloads waiting");
        {
            const char *text = rules_version("srv-r2");
            size_t len = strlen(text), off = 0;
            fcntl(fd, F_SETFL, 0);
            while (off < len) {
                ssize_t n = write(fd, text + off, len - off);
                if (n <= 0)
                    fail_msg("write: %s", strerror(errno));
                off += (size_t)n;
            }
            close(fd);
        }
    }
    want_reloaded(&a, "srv-r2", "the reload that was in progress");
    /* b's request came during that load: the next load answers it */
    want_serving("the next load waiting");
    feed(fifo, "srv-r3");
    want_reloaded(&b, "srv-r3", "the reload that arrived during a load");
    if (strcmp(plans_version(), "srv-r3") != 0)
        fail_msg("after the reloads /v1/plans says version %s, want srv-r3",
                 plans_version());

    /* SIGHUP: the same thread loads; the worker serves meanwhile */
    assert_int_equal(qgproc_signal(&P, SIGHUP), 0);
    {
        long long t0 = qg_now_ms();
        int fd;
        while ((fd = open(fifo, O_WRONLY | O_NONBLOCK)) < 0 &&
               errno == ENXIO && qg_now_ms() - t0 < 20000)
            tst_sleep_ms(10);
        if (fd < 0)
            fail_msg("SIGHUP never opened the rules file");
        want_serving("SIGHUP reload in progress");
        close(fd);                      /* an empty file: refused */
    }
    {
        long long t0 = qg_now_ms();
        const char *log;
        while (!((log = slurp(qgproc_path(&P, "stderr.log"))) &&
                 strstr(log, "reload refused")) &&
               qg_now_ms() - t0 < 20000) {
            free((char *)log);
            tst_sleep_ms(20);
        }
        if (!log || !strstr(log, "reload refused"))
            fail_msg("the SIGHUP reload of an empty file was not logged as "
                     "refused");
        free((char *)log);
    }
    if (strcmp(plans_version(), "srv-r3") != 0)
        fail_msg("a refused SIGHUP reload changed the rules: version %s",
                 plans_version());
    httpc_close(&a);
    httpc_close(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_admin_reload_off_worker, gc_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
