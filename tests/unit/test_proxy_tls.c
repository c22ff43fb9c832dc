/* test_proxy_tls.c - the metering proxy to an https:// upstream.
 *
 * A real nginx (/usr/sbin/nginx) terminates TLS in front of the upstream
 * double, with a certificate made here by the openssl command for the
 * name "localhost" only (no IP address).  Two gateways:
 *   - --upstream https://localhost:PORT with QUOTAGATE_UPSTREAM_CA = that
 *     certificate: plain and streaming calls succeed over TLS, several in
 *     a row (the keep-alive pool), charged with the double's exact counts;
 *   - --upstream https://127.0.0.1:PORT, same CA: the certificate does not
 *     name 127.0.0.1, so the host check fails: 502, upstream never called;
 *   - --upstream https://localhost:PORT without the CA (system trust
 *     store): the self-signed certificate is refused: 502.
 * Skipped with a message when nginx or openssl is not installed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dblproc.h"
#include "httpc.h"
#include "ports.h"
#include "qgproc.h"

#define ADMIN QGPROC_ADMIN_KEY
#define UPKEY "tls-upstream-secret"
#define NGINX_BIN "/usr/sbin/nginx"
#define OPENSSL_BIN "/usr/bin/openssl"
#define BODY(stream, n) \
    "{\"model\":\"light\"," stream "\"messages\":[{\"role\":\"user\"," \
    "\"content\":\"hello there friend\"}],\"max_tokens\":" #n "}"

static qgproc P;               /* trusts the CA, https://localhost */
static char dir[512];
static pid_t dbl_pid, nginx_pid;
static int dbl_port, tls_port;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Run argv, wait; 0 when it exited 0. */
static int run(char *const argv[])
{
    int st;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* The double through dblproc (tests/support), its pid and port kept in
 * this file's globals. */
static int double_start(const char *bin)
{
    dblproc d = {0, 0};
    if (dblproc_start(&d, bin) != 0)
        return -1;
    dbl_pid = d.pid;
    dbl_port = d.port;
    return 0;
}

static void child_stop(pid_t *pid)
{
    int st;
    if (*pid <= 0)
        return;
    kill(*pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(*pid, &st, WNOHANG) == *pid) {
            *pid = 0;
            return;
        }
        sleep_ms(50);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, &st, 0);
    *pid = 0;
}

static int nginx_start(void)
{
    char conf[600], text[8192];
    snprintf(conf, sizeof conf, "%s/nginx.conf", dir);
    snprintf(text, sizeof text,
             "daemon off;\nmaster_process off;\nworker_processes 1;\n"
             "pid %s/nginx.pid;\nerror_log %s/error.log info;\n"
             "events { worker_connections 64; }\n"
             "http {\n"
             "  access_log off;\n"
             "  client_body_temp_path %s/client_body;\n"
             "  proxy_temp_path %s/proxy;\n"
             "  fastcgi_temp_path %s/fastcgi;\n"
             "  uwsgi_temp_path %s/uwsgi;\n"
             "  scgi_temp_path %s/scgi;\n"
             "  server {\n"
             "    listen 127.0.0.1:%d ssl;\n"
             "    server_name localhost;\n"
             "    ssl_certificate %s/cert.pem;\n"
             "    ssl_certificate_key %s/key.pem;\n"
             "    location / {\n"
             "      proxy_pass http://127.0.0.1:%d;\n"
             "      proxy_http_version 1.1;\n"
             "      proxy_set_header Connection \"\";\n"
             "      proxy_buffering off;\n"
             "    }\n"
             "  }\n"
             "}\n",
             dir, dir, dir, dir, dir, dir, dir, tls_port, dir, dir,
             dbl_port);
    if (qgproc_write_file(conf, text) < 0)
        return -1;
    if ((nginx_pid = fork()) < 0)
        return -1;
    if (nginx_pid == 0) {
        char err[600];
        int fd = open("/dev/null", O_WRONLY);
        snprintf(err, sizeof err, "%s/error.log", dir);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(NGINX_BIN, "nginx", "-p", dir, "-c", conf, "-e", err,
              (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        int st;
        if (waitpid(nginx_pid, &st, WNOHANG) == nginx_pid) {
            nginx_pid = 0;
            return -1;
        }
        if (tst_port_open(tls_port))
            return 0;
        sleep_ms(50);
    }
    return -1;
}

/* ------------------------------------------------------------ helpers */

static int new_key(httpc *c, const char *subject, char *key, size_t cap)
{
    http_resp r;
    char body[256];
    json_t *j;
    int ok = -1;
    snprintf(body, sizeof body, "{\"subject\":\"%s\",\"plan\":\"roomy\"}",
             subject);
    if (httpc_call(c, "POST", "/v1/admin/subjects", "bearer", ADMIN, body,
                   &r) < 0)
        return -1;
    http_resp_free(&r);
    snprintf(body, sizeof body, "{\"subject\":\"%s\"}", subject);
    if (httpc_call(c, "POST", "/v1/admin/keys", "bearer", ADMIN, body, &r) <
        0)
        return -1;
    if ((j = json_loadb(r.body, r.body_len, 0, NULL)) &&
        json_is_string(json_object_get(j, "key"))) {
        snprintf(key, cap, "%s", json_string_value(json_object_get(j, "key")));
        ok = 0;
    }
    json_decref(j);
    http_resp_free(&r);
    return ok;
}

static long double_count(void)
{
    httpc d;
    http_resp r;
    long n = -1;
    json_t *j;
    httpc_init(&d, dbl_port);
    if (httpc_get(&d, "/_double/count", NULL, &r) == 0) {
        if ((j = json_loadb(r.body, r.body_len, 0, NULL)))
            n = (long)json_integer_value(json_object_get(j, "count"));
        json_decref(j);
        http_resp_free(&r);
    }
    httpc_close(&d);
    return n;
}

/* Start a second gateway on the upstream URL (env may hold the CA) and
 * check that a call through it fails with 502 without reaching the
 * upstream. */
static void expect_refused(const char *url, const char *ca_env)
{
    qgproc q;
    httpc c;
    http_resp r;
    char key[256];
    const char *args[] = {"--upstream", url, NULL};
    const char *env[] = {"QUOTAGATE_UPSTREAM_KEY=" UPKEY, ca_env, NULL};
    long before = double_count();
    assert_int_equal(qgproc_init(&q), 0);
    if (qgproc_start(&q, P.rules, args, env) < 0)
        fail_msg("second gateway: %s", q.why);
    httpc_init(&c, qgproc_port(&q));
    assert_int_equal(new_key(&c, "tls-bad", key, sizeof key), 0);
    assert_int_equal(httpc_post_json(&c, "/v1/chat/completions", key,
                                     BODY("", 3), &r), 0);
    if (r.status != 502)
        fail_msg("%s: expected 502, got %d %s", url, r.status, r.body);
    assert_non_null(strstr(r.body, "upstream_unavailable"));
    http_resp_free(&r);
    httpc_close(&c);
    assert_int_equal(double_count(), before);
    assert_int_equal(qgproc_stop(&q, 20000), 0);
    qgproc_cleanup(&q);
}

/* ----------------------------------------------------------- fixtures */

static int skipped;

static int group_setup(void **state)
{
    const char *src = getenv("QG_TESTDATA"), *ub = getenv("QG_UPSTREAM_BIN");
    char path[1024], url[128], ca[700], cert[600], key[600];
    const char *args[3], *env[3];
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (access(NGINX_BIN, X_OK) != 0 || access(OPENSSL_BIN, X_OK) != 0) {
        fprintf(stderr, "test_proxy_tls: SKIPPED: needs %s and %s\n",
                NGINX_BIN, OPENSSL_BIN);
        skipped = 1;
        return 0;
    }
    if (!src || !ub || qgproc_init(&P) < 0)
        return -1;
    snprintf(dir, sizeof dir, "%s", qgproc_path(&P, "nginx"));
    if (mkdir(dir, 0700) < 0)
        return -1;
    snprintf(cert, sizeof cert, "%s/cert.pem", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    {
        char *argv[] = {OPENSSL_BIN, "req", "-x509", "-newkey", "rsa:2048",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost", NULL};
        if (run(argv) < 0) {
            fprintf(stderr, "openssl req failed\n");
            return -1;
        }
    }
    if (double_start(ub) < 0 || (tls_port = tst_free_port()) <= 0 ||
        nginx_start() < 0) {
        fprintf(stderr, "cannot start the double or nginx (%s/error.log)\n",
                dir);
        child_stop(&nginx_pid);
        child_stop(&dbl_pid);
        return -1;
    }
    snprintf(path, sizeof path, "%s/proxy/rules.yaml", src);
    snprintf(url, sizeof url, "https://localhost:%d", tls_port);
    snprintf(ca, sizeof ca, "QUOTAGATE_UPSTREAM_CA=%s", cert);
    args[0] = "--upstream";
    args[1] = url;
    args[2] = NULL;
    env[0] = "QUOTAGATE_UPSTREAM_KEY=" UPKEY;
    env[1] = ca;
    env[2] = NULL;
    if (qgproc_start_copy(&P, path, args, env) < 0) {
        child_stop(&nginx_pid);
        child_stop(&dbl_pid);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    int rc = 0;
    (void)state;
    if (skipped)
        return 0;
    rc = qgproc_finish(&P);
    child_stop(&nginx_pid);
    child_stop(&dbl_pid);
    return rc;
}

/* ============================================================== tests */

static void test_tls_calls(void **state)
{
    httpc c;
    http_resp r;
    char key[256];
    double used;
    (void)state;
    if (skipped)
        skip();
    httpc_init(&c, qgproc_port(&P));
    assert_int_equal(new_key(&c, "tls-ok", key, sizeof key), 0);
    /* several in a row: the pooled TLS connection is reused, or replaced
     * when nginx closed it */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(httpc_post_json(&c, "/v1/chat/completions", key,
                                         BODY("", 7), &r), 0);
        if (r.status != 200)
            fail_msg("TLS call %d: %d %s", i, r.status, r.body);
        assert_non_null(strstr(r.body, "\"completion_tokens\":7"));
        http_resp_free(&r);
        assert_int_equal(httpc_post_json(&c, "/v1/chat/completions", key,
                                         BODY("\"stream\":true,", 3), &r),
                         0);
        if (r.status != 200)
            fail_msg("TLS stream %d: %d %s", i, r.status, r.body);
        assert_non_null(strstr(r.body, "data: [DONE]"));
        assert_null(strstr(r.body, "\"choices\":[]"));
        http_resp_free(&r);
    }
    /* 4 x (1 + 12/1000) + 4 x (1 + 8/1000) */
    assert_int_equal(httpc_get(&c, "/v1/usage/tls-ok", ADMIN, &r), 0);
    {
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL), *w;
        size_t i;
        used = -1;
        json_array_foreach(json_object_get(j, "windows"), i, w)
            if (!strcmp(json_string_value(json_object_get(w, "name")),
                        "burst_5h"))
                used = json_number_value(json_object_get(w, "used"));
        json_decref(j);
    }
    http_resp_free(&r);
    assert_true(used > 8.0799 && used < 8.0801);
    httpc_close(&c);
}

static void test_tls_host_mismatch(void **state)
{
    char url[128], ca[700];
    (void)state;
    if (skipped)
        skip();
    snprintf(url, sizeof url, "https://127.0.0.1:%d", tls_port);
    snprintf(ca, sizeof ca, "QUOTAGATE_UPSTREAM_CA=%s/cert.pem", dir);
    expect_refused(url, ca);
}

static void test_tls_untrusted(void **state)
{
    char url[128];
    (void)state;
    if (skipped)
        skip();
    snprintf(url, sizeof url, "https://localhost:%d", tls_port);
    expect_refused(url, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls_calls),
        cmocka_unit_test(test_tls_host_mismatch),
        cmocka_unit_test(test_tls_untrusted),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
