/* charge.c - see charge.h: from a response's report to the tokens
 * charged. */
#include <stdio.h>
#include <string.h>
#include "charge.h"
#include "quotagate.h"

void qg__charge_note(qg__charge *c, qg__anomaly kind, const char *what)
{
    size_t n = strlen(c->detail);
    if (n + 2 < sizeof c->detail)
        snprintf(c->detail + n, sizeof c->detail - n, "%s%s", n ? "; " : "",
                 what);
    if (kind != QG_ANOMALY_COUNT &&
        c->nanomalies < (int)(sizeof c->anomaly / sizeof c->anomaly[0]))
        c->anomaly[c->nanomalies++] = kind;
}

void qg__charge_tokens(const qg__charge_in *in, qg__charge *c)
{
    const qg_usage_counts *u = &in->u;
    int64_t by_bytes = (in->content_bytes + 3) / 4;
    int64_t cap = in->max_output;           /* -1: none asked */
    char what[128];

    memset(c, 0, sizeof *c);
    if (u->have_input && u->input_tokens <= QG_TOKENS_MAX) {
        c->in = u->input_tokens;
    } else {
        c->in = in->input_estimate;
        c->est = 1;
        if (u->have_input) {
            snprintf(what, sizeof what, "input_tokens %lld reported, above "
                     "the bound: charged the estimate %lld",
                     (long long)u->input_tokens, (long long)c->in);
            qg__charge_note(c, QG_ANOMALY_INPUT_OVER_BOUND, what);
        }
    }
    if (in->final_usage && u->have_output &&
        (u->output_tokens <= QG_TOKENS_MAX || cap >= 0)) {
        c->out = u->output_tokens;
        if (cap >= 0 && c->out > cap) {
            c->out = cap;
            snprintf(what, sizeof what, "output_tokens %lld reported, above "
                     "max_tokens: charged max_tokens %lld",
                     (long long)u->output_tokens, (long long)cap);
            qg__charge_note(c, QG_ANOMALY_OUTPUT_OVER_CAP, what);
        }
        return;
    }
    {
        int64_t seen = u->have_output ? u->output_tokens : 0;
        if (seen > QG_TOKENS_MAX) {
            snprintf(what, sizeof what, "output_tokens %lld reported, above "
                     "the bound: charged the estimate %lld",
                     (long long)seen,
                     (long long)(cap >= 0 && by_bytes > cap ? cap : by_bytes));
            qg__charge_note(c, QG_ANOMALY_OUTPUT_OVER_BOUND, what);
            seen = 0;
        }
        c->out = seen > by_bytes ? seen : by_bytes;
        if (cap >= 0 && c->out > cap)
            c->out = cap;      /* an estimate never passes the cap either */
        if (c->out > QG_TOKENS_MAX)
            c->out = QG_TOKENS_MAX;
        c->est = 1;
    }
}
