/* pgproc.c - PostgreSQL servers for tests (pgproc.h).
 *
 * Every child (initdb, the postmaster) is forked here, drops to the
 * server's user when we are root, asks to be killed when the test dies,
 * closes the test's descriptors, sends its output to a log in the folder
 * and execs the binary.  Readiness is asked with PQping, so "up" means
 * "accepts connections", not merely "listens". */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "pgproc.h"
#include "ports.h"

#define INITDB_WAIT_MS 120000      /* initdb on a busy, shared machine */
#define READY_WAIT_MS 60000        /* start (or crash recovery) to ready */
#define STOP_WAIT_MS 60000         /* fast shutdown before SIGKILL */

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int has_binaries(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/initdb", dir);
    if (access(p, X_OK) != 0)
        return 0;
    snprintf(p, sizeof p, "%s/postgres", dir);
    return access(p, X_OK) == 0;
}

const char *pgproc_bindir(void)
{
    const char *env = getenv("QG_PG_BIN");
    if (env && *env)
        return has_binaries(env) ? env : NULL;
    return has_binaries("/usr/lib/postgresql/15/bin")
               ? "/usr/lib/postgresql/15/bin"
               : NULL;
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Fork and exec bindir/prog with argv (argv[0] is set here) as the
 * server's user, output appended to dir/log.  Returns the child's pid, or
 * -1 with why. */
static pid_t spawn(pgproc *p, const char *prog, char **argv, const char *log)
{
    char bin[600], logpath[400];
    const char *bindir = pgproc_bindir();
    pid_t parent = getpid(), pid;
    if (!bindir) {
        snprintf(p->why, sizeof p->why, "PostgreSQL binaries not found "
                 "(QG_PG_BIN or /usr/lib/postgresql/15/bin)");
        return -1;
    }
    snprintf(bin, sizeof bin, "%s/%s", bindir, prog);
    snprintf(logpath, sizeof logpath, "%s/%s", p->dir, log);
    argv[0] = bin;
    if ((pid = fork()) < 0) {
        snprintf(p->why, sizeof p->why, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int fd;
        if (getuid() == 0 && p->uid != 0 &&
            (setgroups(0, NULL) != 0 || setgid(p->gid) != 0 ||
             setuid(p->uid) != 0))
            _exit(126);
        /* after setuid: a change of credentials clears the setting */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(125);
        fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        fd = open("/dev/null", O_RDONLY);
        if (fd >= 0)
            dup2(fd, 0);
        close_range(3, ~0U, 0);
        execv(bin, argv);
        _exit(127);
    }
    return pid;
}

/* The last lines of a log of the folder, for a message. */
static void log_tail(const pgproc *p, const char *log, char *out, size_t cap)
{
    char path[400];
    FILE *f;
    long size;
    size_t n;
    out[0] = '\0';
    snprintf(path, sizeof path, "%s/%s", p->dir, log);
    if (!(f = fopen(path, "r")))
        return;
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, size > (long)cap - 1 ? size - (long)cap + 1 : 0, SEEK_SET);
    n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    for (char *c = out; *c; c++)
        if (*c == '\n')
            *c = ' ';
}

static void conninfo(const pgproc *p, const char *db, char *out, size_t cap)
{
    snprintf(out, cap, "host=127.0.0.1 port=%d user=" PGPROC_USER
             " dbname=%s connect_timeout=5", p->port, db);
}

/* Start the postmaster and wait until it accepts connections.  After a
 * kill, the dead postmaster's backends may still hold its shared memory
 * for a moment ("pre-existing shared memory block is still in use"): a
 * start that exits early is tried again until the deadline. */
static int start_server(pgproc *p)
{
    char port[16], sock[300], data[300], ci[256];
    char *argv[] = {NULL, "-D", data, "-p", port, "-c",
                    "listen_addresses=127.0.0.1", "-c", sock, NULL};
    long long t0 = mono_ms();
    snprintf(port, sizeof port, "%d", p->port);
    snprintf(sock, sizeof sock, "unix_socket_directories=%s", p->dir);
    snprintf(data, sizeof data, "%s/data", p->dir);
    conninfo(p, "postgres", ci, sizeof ci);
    while (mono_ms() - t0 < READY_WAIT_MS) {
        int st;
        if ((p->pid = spawn(p, "postgres", argv, "postgres.log")) < 0) {
            p->pid = 0;
            return -1;
        }
        while (mono_ms() - t0 < READY_WAIT_MS) {
            if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
                p->pid = 0;
                break;
            }
            if (PQping(ci) == PQPING_OK)
                return 0;
            sleep_ms(50);
        }
        if (p->pid)
            break;               /* running, never ready */
        sleep_ms(200);           /* exited: try again */
    }
    {
        char tail[300];
        log_tail(p, "postgres.log", tail, sizeof tail);
        snprintf(p->why, sizeof p->why, "postgres on port %d %s: %s",
                 p->port, p->pid ? "never accepted connections" : "exited",
                 tail);
    }
    if (p->pid) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
    return -1;
}

static int run_initdb(pgproc *p)
{
    char data[300];
    char *argv[] = {NULL, "-D", data, "-U", PGPROC_USER, "-A", "trust",
                    "-E", "UTF8", "--locale=C", "--no-sync",
                    "--no-instructions", NULL};
    long long t0 = mono_ms();
    pid_t pid;
    int st;
    snprintf(data, sizeof data, "%s/data", p->dir);
    if ((pid = spawn(p, "initdb", argv, "initdb.log")) < 0)
        return -1;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (mono_ms() - t0 > INITDB_WAIT_MS) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            snprintf(p->why, sizeof p->why, "initdb took over %d s",
                     INITDB_WAIT_MS / 1000);
            return -1;
        }
        sleep_ms(20);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char tail[400];
        log_tail(p, "initdb.log", tail, sizeof tail);
        snprintf(p->why, sizeof p->why, "initdb failed (status %d): %s",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, tail);
        return -1;
    }
    return 0;
}

int pgproc_start(pgproc *p)
{
    memset(p, 0, sizeof *p);
    if (!pgproc_bindir()) {
        snprintf(p->why, sizeof p->why, "PostgreSQL binaries not found "
                 "(QG_PG_BIN or /usr/lib/postgresql/15/bin)");
        return -1;
    }
    p->uid = getuid();
    p->gid = getgid();
    if (p->uid == 0) {
        struct passwd *pw = getpwnam("postgres");
        if (!pw) {
            snprintf(p->why, sizeof p->why, "running as root and there is "
                     "no postgres user to run the server as");
            return -1;
        }
        p->uid = pw->pw_uid;
        p->gid = pw->pw_gid;
    }
    snprintf(p->dir, sizeof p->dir, "/tmp/qgpg.XXXXXX");
    if (!mkdtemp(p->dir)) {
        snprintf(p->why, sizeof p->why, "mkdtemp: %s", strerror(errno));
        p->dir[0] = '\0';
        return -1;
    }
    if (chown(p->dir, p->uid, p->gid) != 0) {
        snprintf(p->why, sizeof p->why, "chown %s: %s", p->dir,
                 strerror(errno));
        goto fail;
    }
    if ((p->port = tst_free_port()) < 0) {
        snprintf(p->why, sizeof p->why, "no free port");
        goto fail;
    }
    if (run_initdb(p) != 0 || start_server(p) != 0)
        goto fail;
    return 0;
fail: {
        char why[sizeof p->why];
        memcpy(why, p->why, sizeof why);
        pgproc_destroy(p);
        memcpy(p->why, why, sizeof why);
        return -1;
    }
}

void pgproc_stop(pgproc *p)
{
    long long t0 = mono_ms();
    int st;
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGINT);            /* fast shutdown */
    while (waitpid(p->pid, &st, WNOHANG) == 0) {
        if (mono_ms() - t0 > STOP_WAIT_MS) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            break;
        }
        sleep_ms(10);
    }
    p->pid = 0;
}

/* The state letter of /proc/PID/stat ('Z' a zombie), or 0 when there is
 * no such process; its parent into *ppid. */
static char proc_state(pid_t pid, pid_t *ppid)
{
    char path[64], buf[512], *close_paren;
    FILE *f;
    size_t n;
    int parent = 0;
    char st = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) S ppid ...": comm may hold spaces and parentheses */
    if (!(close_paren = strrchr(buf, ')')) ||
        sscanf(close_paren + 1, " %c %d", &st, &parent) != 2)
        return 0;
    if (ppid)
        *ppid = (pid_t)parent;
    return st;
}

#define MAX_BACKENDS 256

void pgproc_kill(pgproc *p)
{
    pid_t kids[MAX_BACKENDS];
    int nkids = 0;
    DIR *d;
    struct dirent *e;
    long long t0;
    if (p->pid <= 0) {
        p->pid = 0;
        return;
    }
    /* The whole server dies at once, as in a crash of its machine: with
     * the postmaster stopped (it forks no more), its backends are found
     * and killed with it.  Killed alone, its backends would serve their
     * connections a moment longer, until they notice. */
    kill(p->pid, SIGSTOP);
    if ((d = opendir("/proc"))) {
        while ((e = readdir(d)) && nkids < MAX_BACKENDS) {
            pid_t pid = (pid_t)atoi(e->d_name), parent = 0;
            if (pid > 0 && proc_state(pid, &parent) && parent == p->pid)
                kids[nkids++] = pid;
        }
        closedir(d);
    }
    kill(p->pid, SIGKILL);
    for (int i = 0; i < nkids; i++)
        kill(kids[i], SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
    /* gone, or zombies waiting for whoever adopted them */
    t0 = mono_ms();
    for (int i = 0; i < nkids && mono_ms() - t0 < STOP_WAIT_MS; i++) {
        char st;
        while ((st = proc_state(kids[i], NULL)) != 0 && st != 'Z' &&
               st != 'X' && mono_ms() - t0 < STOP_WAIT_MS)
            sleep_ms(5);
    }
}

int pgproc_restart(pgproc *p)
{
    if (p->pid > 0 || !p->port || !p->dir[0]) {
        snprintf(p->why, sizeof p->why, "not a stopped server");
        return -1;
    }
    return start_server(p);
}

void pgproc_destroy(pgproc *p)
{
    pgproc_stop(p);
    if (p->dir[0] && !getenv("QG_KEEP_TMP"))
        nftw(p->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    p->dir[0] = '\0';
    p->port = 0;
}

const char *pgproc_url(const pgproc *p, const char *db, char *out,
                       size_t cap)
{
    snprintf(out, cap, "postgresql://" PGPROC_USER "@127.0.0.1:%d/%s",
             p->port, db);
    return out;
}

int pgproc_sql(pgproc *p, const char *db, const char *sql, char *out,
               size_t cap)
{
    char ci[512];
    PGconn *c;
    PGresult *r;
    int rc = -1;
    if (out && cap)
        out[0] = '\0';
    conninfo(p, db, ci, sizeof ci);
    c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK) {
        snprintf(p->why, sizeof p->why, "connect: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    r = PQexec(c, sql);
    switch (PQresultStatus(r)) {
    case PGRES_TUPLES_OK:
        if (out && cap && PQntuples(r) > 0 && PQnfields(r) > 0)
            snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
        rc = 0;
        break;
    case PGRES_COMMAND_OK:
        rc = 0;
        break;
    default:
        snprintf(p->why, sizeof p->why, "%s", PQresultErrorMessage(r));
        break;
    }
    PQclear(r);
    PQfinish(c);
    return rc;
}

int pgproc_createdb(pgproc *p, char *name, size_t cap)
{
    char sql[128];
    snprintf(name, cap, "qg_%u_%u", (unsigned)getpid(), ++p->ndb);
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
    return pgproc_sql(p, "postgres", sql, NULL, 0);
}
