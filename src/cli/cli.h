/* cli.h - what the subcommands of build/quotagate share: the parsed
 * command line, the handlers named in main.c's command table, and the
 * output helpers.  Handlers return the process exit code (0 ok, 1 lint
 * findings, 2 unusable input or bad flags). */
#ifndef QG_CLI_H
#define QG_CLI_H

#include <stdint.h>
#include <jansson.h>
#include "quotagate.h"

#define QG_EXIT_OK 0
#define QG_EXIT_FINDINGS 1
#define QG_EXIT_USAGE 2

/* Flags of every command; a command reads only those it declares. */
typedef struct qg_cli_args {
    const char *cmd;          /* command name, for messages */
    const char *config;       /* -c, --config */
    int json;                 /* --json */
    const char *baseline;     /* --baseline PLAN */
    const char *period;       /* --period DUR */
    const char *trace;        /* --trace FILE.csv */
    const char *start;        /* --start ISO8601 */
    const char *at;           /* --at ISO8601: the rules version in force
                                 then */
    const char *previous;     /* --previous OLD_RULES */
    const char *data;         /* --data DIR */
    const char *ledger;       /* --ledger URL */
    const char *role;         /* --role ROLE */
    const char *listen;       /* serve: --listen HOST:PORT */
    const char *store;        /* serve: --store URL */
    const char *upstream;     /* serve: --upstream URL */
    const char *workers;      /* serve: --workers N */
    const char *header_timeout; /* serve: --header-timeout MS */
    const char *min_body_rate;  /* serve: --min-body-rate BYTES (per s) */
    const char *max_connections;      /* serve: --max-connections N */
    const char *max_conns_per_client; /* serve: --max-connections-per-client */
    int ledger_async;         /* serve: --ledger-async */
    const char *request_ids;  /* serve: --request-ids N */
    const char *ledger_cache; /* serve: --ledger-cache MB */
    const char *subject;      /* reconcile: --subject NAME */
    int repair;               /* reconcile: --repair */
    const char *format;       /* pricing: --format md|html|json */
    int nargs;                /* positional arguments after the command, */
    char **args;              /* for commands whose table row allows them */
} qg_cli_args;

/* Handlers: `rules` (loaded from --config) passes to the handler. */
int qg__cmd_analyze(const qg_cli_args *a, qg_rules *rules);
int qg__cmd_simulate(const qg_cli_args *a, qg_rules *rules);
int qg__cmd_lint(const qg_cli_args *a, qg_rules *rules);
int qg__cmd_reconcile(const qg_cli_args *a, qg_rules *rules);
int qg__cmd_explain(const qg_cli_args *a, qg_rules *rules);
int qg__cmd_pricing(const qg_cli_args *a, qg_rules *rules);
/* keys takes no rules file: rules is NULL. */
int qg__cmd_serve(const qg_cli_args *a, qg_rules *rules);
int qg__cmd_keys(const qg_cli_args *a, qg_rules *rules);

/* Load a rules file; on failure print "path:line:col: ..." to stderr and
 * return NULL. */
qg_rules *qg__cli_load_rules(const char *path);

/* A milli quantity as a JSON number: an integer when whole, else a real
 * (the only place a binary fraction appears, at the output boundary). */
json_t *qg__cli_json_milli(int64_t v);

/* Print a JSON value and a newline on stdout, then release it.  Returns 0,
 * or -1 (with a message on stderr) when it could not be encoded. */
int qg__json_emit(json_t *v, int pretty);

#endif
