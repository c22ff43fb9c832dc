/* main.c - build/quotagate: the command table, flag parsing and dispatch.
 *
 * Every subcommand is one row of `commands` (name, handler, summary,
 * usage, the flags it takes and those it requires); every flag is one row
 * of `flags`.  `quotagate --help` and `quotagate CMD --help` are generated
 * from these tables, and getopt_long's option list is built from them, so
 * a command cannot accept a flag its help does not show.  Bad flags and
 * unknown commands exit 2 with a message on stderr. */
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum flag_id { F_CONFIG, F_JSON, F_BASELINE, F_PERIOD, F_TRACE, F_START,
               F_PREVIOUS, F_DATA, F_LEDGER, F_ROLE, F_LISTEN, F_STORE,
               F_UPSTREAM, F_WORKERS, F_HEADER_TIMEOUT, F_MIN_BODY_RATE,
               F_MAX_CONNECTIONS, F_MAX_CONNS_PER_CLIENT, F_LEDGER_ASYNC,
               F_REQUEST_IDS, F_LEDGER_CACHE, F_SUBJECT, F_REPAIR, F_FORMAT,
               F_AT, F_HELP, NFLAGS };

#define FL(id) (1u << (id))

/* One flag: long name, short letter (0 none), argument name (NULL for a
 * switch), where it lands in qg_cli_args, and its help line. */
static const struct flag {
    const char *name;
    int letter;
    const char *arg;
    size_t offset;
    const char *help;
} flags[NFLAGS] = {
    [F_CONFIG] = { "config", 'c', "RULES", offsetof(qg_cli_args, config),
                   "rules file (YAML)" },
    [F_JSON] = { "json", 0, NULL, offsetof(qg_cli_args, json),
                 "machine-readable output" },
    [F_BASELINE] = { "baseline", 0, "PLAN", offsetof(qg_cli_args, baseline),
                     "plan to compare with (default: the cheapest)" },
    [F_PERIOD] = { "period", 0, "DUR", offsetof(qg_cli_args, period),
                   "period such as 7d, 30d (default: analysis.period, else "
                   "the longest window)" },
    [F_TRACE] = { "trace", 0, "FILE.csv", offsetof(qg_cli_args, trace),
                  "usage trace: t,subject,weight or "
                  "t,subject,model,input_tokens,output_tokens[,request_id]" },
    [F_AT] = { "at", 0, "TIME", offsetof(qg_cli_args, at),
               "ISO 8601 instant whose rules version is analysed or priced "
               "(default: now)" },
    [F_START] = { "start", 0, "TIME", offsetof(qg_cli_args, start),
                  "ISO 8601 origin of the virtual clock (default: now)" },
    [F_PREVIOUS] = { "previous", 0, "OLD_RULES",
                     offsetof(qg_cli_args, previous),
                     "rules in force now, to check notice of lowered limits" },
    [F_DATA] = { "data", 0, "DIR", offsetof(qg_cli_args, data),
                 "data directory: the ledger is DIR/ledger.db "
                 "(default ./var)" },
    [F_LEDGER] = { "ledger", 0, "URL", offsetof(qg_cli_args, ledger),
                   "ledger URL: sqlite:PATH (default: under --data)" },
    [F_ROLE] = { "role", 0, "ROLE", offsetof(qg_cli_args, role),
                 "key role: subject (default), admin or service" },
    [F_LISTEN] = { "listen", 0, "HOST:PORT", offsetof(qg_cli_args, listen),
                   "address to serve on (default 127.0.0.1:8080; port 0 "
                   "picks a free one)" },
    [F_STORE] = { "store", 0, "URL", offsetof(qg_cli_args, store),
                  "where counters live: memory (serve's default), "
                  "redis://HOST:PORT[/DB], redis-cluster://HOST:PORT[,...]" },
    [F_UPSTREAM] = { "upstream", 0, "URL", offsetof(qg_cli_args, upstream),
                     "model API the proxy forwards to (models with "
                     "their own upstream: in the rules go there)" },
    [F_WORKERS] = { "workers", 0, "N", offsetof(qg_cli_args, workers),
                    "HTTP worker threads (default 2)" },
    [F_HEADER_TIMEOUT] = { "header-timeout", 0, "MS",
                           offsetof(qg_cli_args, header_timeout),
                           "answer 408 and close a client whose request head "
                           "takes more than MS milliseconds in all, from its "
                           "first byte (from accept for a new connection); "
                           "also the base of the body's deadline (default "
                           "10000)" },
    [F_MIN_BODY_RATE] = { "min-body-rate", 0, "BYTES",
                          offsetof(qg_cli_args, min_body_rate),
                          "bytes per second: a request body must arrive "
                          "within the header timeout plus its declared size "
                          "at this rate, else 408 (default 8192)" },
    [F_MAX_CONNECTIONS] = { "max-connections", 0, "N",
                            offsetof(qg_cli_args, max_connections),
                            "open client connections in all (default: 3/4 "
                            "of the file descriptors left by ulimit -n after "
                            "64 + 4 per worker, at most 65536); when full, "
                            "the oldest idle, then the slowest unfinished "
                            "connection is closed for a new one" },
    [F_MAX_CONNS_PER_CLIENT] = { "max-connections-per-client", 0, "N",
                                 offsetof(qg_cli_args, max_conns_per_client),
                                 "open connections per client address (IPv6: "
                                 "per /64); 0 = no limit, e.g. behind a load "
                                 "balancer (default: half of "
                                 "--max-connections)" },
    [F_LEDGER_ASYNC] = { "ledger-async", 0, NULL,
                         offsetof(qg_cli_args, ledger_async),
                         "acknowledge settles before they are durable: up "
                         "to 100 ms of settles can be lost in a crash" },
    [F_REQUEST_IDS] = { "request-ids", 0, "N",
                        offsetof(qg_cli_args, request_ids),
                        "request ids the counters remember for "
                        "idempotency (default 524288)" },
    [F_LEDGER_CACHE] = { "ledger-cache", 0, "MB",
                         offsetof(qg_cli_args, ledger_cache),
                         "the most the SQLite ledger writer's page cache "
                         "grows to, in MiB (default 64; it starts at 2 "
                         "and doubles while rows read pages from the "
                         "file)" },
    [F_SUBJECT] = { "subject", 0, "NAME", offsetof(qg_cli_args, subject),
                    "only this subject (and its org)" },
    [F_REPAIR] = { "repair", 0, NULL, offsetof(qg_cli_args, repair),
                   "set the store to the ledger's figures where it lacks "
                   "what the ledger holds (live reservations stay)" },
    [F_FORMAT] = { "format", 0, "md|html|json",
                   offsetof(qg_cli_args, format),
                   "page format (default md)" },
    [F_HELP] = { "help", 'h', NULL, 0, "this help" },
};

static const struct command {
    const char *name;
    int (*run)(const qg_cli_args *, qg_rules *);
    const char *summary;
    const char *usage;
    unsigned takes, requires;
    int maxargs;                /* positional arguments accepted */
} commands[] = {
    { "serve", qg__cmd_serve,
      "the gateway: decision API, usage ledger, metrics",
      "quotagate serve -c RULES [--listen HOST:PORT] [--data DIR] "
      "[--ledger URL] [--store memory|redis://...|redis-cluster://...] [--workers N] [--max-connections N]",
      FL(F_CONFIG) | FL(F_LISTEN) | FL(F_DATA) | FL(F_LEDGER) | FL(F_STORE) |
          FL(F_UPSTREAM) | FL(F_WORKERS) | FL(F_HEADER_TIMEOUT) |
          FL(F_MIN_BODY_RATE) | FL(F_MAX_CONNECTIONS) |
          FL(F_MAX_CONNS_PER_CLIENT) | FL(F_LEDGER_ASYNC) |
          FL(F_REQUEST_IDS) | FL(F_LEDGER_CACHE),
      FL(F_CONFIG), 0 },
    { "analyze", qg__cmd_analyze,
      "window ratios, effective multipliers, binding window, claims check",
      "quotagate analyze -c RULES [--baseline PLAN] [--period DUR] "
      "[--at TIME] [--json]",
      FL(F_CONFIG) | FL(F_JSON) | FL(F_BASELINE) | FL(F_PERIOD) | FL(F_AT),
      FL(F_CONFIG), 0 },
    { "simulate", qg__cmd_simulate,
      "replay a usage trace through the real engine on a virtual clock",
      "quotagate simulate -c RULES --trace FILE.csv [--start TIME]",
      FL(F_CONFIG) | FL(F_JSON) | FL(F_TRACE) | FL(F_START),
      FL(F_CONFIG) | FL(F_TRACE), 0 },
    { "lint", qg__cmd_lint,
      "validate rules and run the pre-release checklist (exit 0 clean, "
      "1 findings, 2 unusable file)",
      "quotagate lint -c RULES [--previous OLD_RULES] [--json]",
      FL(F_CONFIG) | FL(F_JSON) | FL(F_PREVIOUS), FL(F_CONFIG), 0 },
    { "reconcile", qg__cmd_reconcile,
      "counters against the ledger: drift per subject and window (exit 0 "
      "none, 1 drift, 2 could not run)",
      "quotagate reconcile -c RULES --store redis://...|redis-cluster://... "
      "--ledger URL [--subject NAME] [--repair] [--json]",
      FL(F_CONFIG) | FL(F_STORE) | FL(F_LEDGER) | FL(F_SUBJECT) |
          FL(F_REPAIR) | FL(F_JSON),
      FL(F_CONFIG) | FL(F_STORE) | FL(F_LEDGER), 0 },
    { "pricing", qg__cmd_pricing,
      "the public limits table and verifiable multiplier statements",
      "quotagate pricing -c RULES [--format md|html|json] [--baseline PLAN] "
      "[--at TIME]",
      FL(F_CONFIG) | FL(F_FORMAT) | FL(F_BASELINE) | FL(F_AT) | FL(F_JSON),
      FL(F_CONFIG), 0 },
    { "explain", qg__cmd_explain,
      "one request's charge from the ledger: rule version, weight "
      "arithmetic, windows at that moment (exit 0, 1 not found, 2 "
      "unusable input)",
      "quotagate explain REQUEST_ID (--data DIR | --ledger URL) -c RULES "
      "[--json]",
      FL(F_CONFIG) | FL(F_DATA) | FL(F_LEDGER) | FL(F_JSON),
      FL(F_CONFIG), 1 },
    { "keys", qg__cmd_keys,
      "API keys, stored only as hashes: create (prints the key last), "
      "list, revoke",
      "quotagate keys create SUBJECT [--role subject|admin|service] | "
      "list [--json] | revoke KEY_ID  [--data DIR | --ledger URL]",
      FL(F_DATA) | FL(F_LEDGER) | FL(F_ROLE) | FL(F_JSON), 0, 2 },
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void main_help(FILE *out)
{
    size_t i;
    fprintf(out, "quotagate %s - quota and metering gateway\n\n"
            "usage: quotagate COMMAND [OPTIONS]\n"
            "       quotagate --help | --version\n\ncommands:\n", QG_VERSION);
    for (i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nRun 'quotagate COMMAND --help' for its options.\n");
}

static void command_help(const struct command *c, FILE *out)
{
    char left[64];
    int i;
    fprintf(out, "usage: %s\n\n%s\n\noptions:\n", c->usage, c->summary);
    for (i = 0; i < NFLAGS; i++) {
        if (!((c->takes | FL(F_HELP)) & FL(i)))
            continue;
        snprintf(left, sizeof left, "%c%c%s--%s%s%s",
                 flags[i].letter ? '-' : ' ',
                 flags[i].letter ? flags[i].letter : ' ',
                 flags[i].letter ? ", " : "  ", flags[i].name,
                 flags[i].arg ? " " : "", flags[i].arg ? flags[i].arg : "");
        if (strlen(left) > 26)          /* a long one: help below it */
            fprintf(out, "  %s\n  %-26s %s%s\n", left, "", flags[i].help,
                    c->requires & FL(i) ? " (required)" : "");
        else
            fprintf(out, "  %-26s %s%s\n", left, flags[i].help,
                    c->requires & FL(i) ? " (required)" : "");
    }
}

qg_rules *qg__cli_load_rules(const char *path)
{
    char err[1024];
    qg_rules *r = NULL;
    if (qg_rules_load(path, &r, err, sizeof err) != QG_OK) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    return r;
}

json_t *qg__cli_json_milli(int64_t v)
{
    if (v % 1000 == 0)
        return json_integer(v / 1000);
    return json_real((double)v / 1000.0);
}

int qg__json_emit(json_t *v, int pretty)
{
    char *s = v ? json_dumps(v, (pretty ? JSON_INDENT(2) : JSON_COMPACT) |
                                    JSON_PRESERVE_ORDER |
                                    JSON_REAL_PRECISION(15))
                : NULL;
    int rc = 0;
    if (!s) {
        fprintf(stderr, "quotagate: could not encode JSON output\n");
        rc = -1;
    } else {
        fputs(s, stdout);
        fputc('\n', stdout);
    }
    free(s);
    json_decref(v);
    return rc;
}

/* Parse argv (argv[0] is the command name) into a; 0 ok, 1 help shown,
 * -1 bad flags (message printed). */
static int parse_flags(const struct command *c, int argc, char **argv,
                       qg_cli_args *a)
{
    struct option lopts[NFLAGS + 1];
    char sopts[2 * NFLAGS + 2];
    int n = 0, s = 0, i, ch, idx;
    unsigned seen = 0;

    sopts[s++] = ':';
    for (i = 0; i < NFLAGS; i++) {
        if (!((c->takes | FL(F_HELP)) & FL(i)))
            continue;
        lopts[n].name = flags[i].name;
        lopts[n].has_arg = flags[i].arg ? required_argument : no_argument;
        lopts[n].flag = NULL;
        lopts[n++].val = 1000 + i;
        if (flags[i].letter) {
            sopts[s++] = (char)flags[i].letter;
            if (flags[i].arg)
                sopts[s++] = ':';
        }
    }
    memset(&lopts[n], 0, sizeof lopts[n]);
    sopts[s] = '\0';
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, sopts, lopts, &idx)) != -1) {
        if (ch == '?' || ch == ':') {
            const char *bad = argv[optind - 1];
            fprintf(stderr, ch == ':' ? "quotagate %s: option %s needs a "
                    "value\n" : "quotagate %s: unknown option %s\n", c->name,
                    bad);
            fprintf(stderr, "usage: %s\n", c->usage);
            return -1;
        }
        for (i = 0; i < NFLAGS; i++)
            if (ch == 1000 + i || (flags[i].letter && ch == flags[i].letter))
                break;
        if (i == F_HELP) {
            command_help(c, stdout);
            return 1;
        }
        seen |= FL(i);
        if (flags[i].arg)
            *(const char **)((char *)a + flags[i].offset) = optarg;
        else
            *(int *)((char *)a + flags[i].offset) = 1;
    }
    if (optind < argc && argc - optind <= c->maxargs) {
        a->nargs = argc - optind;
        a->args = argv + optind;
    } else if (optind < argc) {
        fprintf(stderr, "quotagate %s: unexpected argument \"%s\"\nusage: %s\n",
                c->name, argv[optind], c->usage);
        return -1;
    }
    for (i = 0; i < NFLAGS; i++)
        if ((c->requires & FL(i)) && !(seen & FL(i))) {
            fprintf(stderr, "quotagate %s: missing --%s %s\nusage: %s\n",
                    c->name, flags[i].name, flags[i].arg ? flags[i].arg : "",
                    c->usage);
            return -1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    const struct command *c = NULL;
    qg_cli_args a;
    qg_rules *rules;
    size_t i;
    int rc;

    if (argc < 2) {
        main_help(stderr);
        return QG_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        main_help(stdout);
        return QG_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("quotagate %s\n", QG_VERSION);
        return QG_EXIT_OK;
    }
    for (i = 0; i < NCOMMANDS && !c; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            c = &commands[i];
    if (!c) {
        fprintf(stderr, "quotagate: unknown command \"%s\" (commands:",
                argv[1]);
        for (i = 0; i < NCOMMANDS; i++)
            fprintf(stderr, " %s", commands[i].name);
        fprintf(stderr, "; see quotagate --help)\n");
        return QG_EXIT_USAGE;
    }
    memset(&a, 0, sizeof a);
    a.cmd = c->name;
    rc = parse_flags(c, argc - 1, argv + 1, &a);
    if (rc != 0)
        return rc > 0 ? QG_EXIT_OK : QG_EXIT_USAGE;
    rules = NULL;
    if ((c->takes & FL(F_CONFIG)) &&
        !(rules = qg__cli_load_rules(a.config)))
        return QG_EXIT_USAGE;
    return c->run(&a, rules);
}
