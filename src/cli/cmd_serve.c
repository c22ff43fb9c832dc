/* cmd_serve.c - `quotagate serve`: flags into qg_serve_opts, then the
 * gateway (src/server/serve.c) runs until SIGTERM or SIGINT. */
#include <stdio.h>
#include <stdlib.h>
#include "cli.h"

static int parse_int(const char *flag, const char *v, long min, long max,
                     long *out)
{
    char *end;
    long n;
    if (!v)
        return 0;
    n = strtol(v, &end, 10);
    if (*end || n < min || n > max) {
        fprintf(stderr, "quotagate serve: %s must be a number from %ld to "
                "%ld\n", flag, min, max);
        return -1;
    }
    *out = n;
    return 0;
}

int qg__cmd_serve(const qg_cli_args *a, qg_rules *rules)
{
    qg_serve_opts o = {0};
    long workers = 2, header_timeout = 10000, rate = 0, maxc = 0, per = -1,
         request_ids = 0, cache_mb = 0;

    if (parse_int("--workers", a->workers, 1, 64, &workers) != 0 ||
        parse_int("--header-timeout", a->header_timeout, 10, 3600000,
                  &header_timeout) != 0 ||
        parse_int("--min-body-rate", a->min_body_rate, 1, 1L << 30,
                  &rate) != 0 ||
        parse_int("--max-connections", a->max_connections, 1, 10000000,
                  &maxc) != 0 ||
        parse_int("--max-connections-per-client", a->max_conns_per_client,
                  0, 10000000, &per) != 0 ||
        parse_int("--request-ids", a->request_ids, 1, 1L << 30,
                  &request_ids) != 0 ||
        parse_int("--ledger-cache", a->ledger_cache, 1, 1L << 20,
                  &cache_mb) != 0) {
        qg_rules_free(rules);
        return QG_EXIT_USAGE;
    }
    o.rules_path = a->config;
    o.rules = rules;
    o.listen = a->listen;
    o.data_dir = a->data;
    o.ledger_url = a->ledger;
    o.store_url = a->store;
    o.upstream = a->upstream;
    o.workers = (int)workers;
    o.header_timeout_ms = (int)header_timeout;
    o.min_body_rate = (int)rate;                /* 0: the default */
    o.max_connections = (int)maxc;              /* 0: from ulimit -n */
    o.max_conns_per_client = per < 0 ? 0 : per == 0 ? -1 : (int)per;
    o.ledger_async = a->ledger_async;
    o.request_ids = (uint32_t)request_ids;
    o.ledger_cache_mb = (int)cache_mb;
    return qg_serve(&o);
}
