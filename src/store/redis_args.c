/* redis_args.c - key names and the command arguments of every script
 * operation (redis_script.h), built from the store.h inputs alone.
 *
 * The argument order of each operation is the one its entry point in
 * src/store/redis/ops.lua reads, field by field; keep the two together.
 * Every call is ARGV[1] the operation, ARGV[2] its numbers packed as
 * big-endian doubles (qg__rs_addnums: one struct.unpack in the script),
 * then its strings; keys and request ids are hex.  Calendar periods: for each calendar window of the member's
 * plan, then of the org, the period [start, end) containing pnow, as
 * qg__calendar_period computes it (the member's billing anchor for plan
 * windows, none for org windows, as store_memory.c's gather passes), or
 * "-1 -1" when it has none. */
#include <stdlib.h>
#include <string.h>
#include "calendar.h"
#include "fixed.h"
#include "redis_script.h"

#define DEFAULT_LEASE_MS (15 * 60 * 1000LL)

void qg__rs_args_init(qg__rs_args *a)
{
    memset(a, 0, sizeof *a);
}

void qg__rs_args_reset(qg__rs_args *a)
{
    a->argc = 0;
    a->used = 0;
    a->failed = 0;
}

void qg__rs_args_free(qg__rs_args *a)
{
    free(a->argv);
    free(a->len);
    free(a->buf);
    memset(a, 0, sizeof *a);
}

/* Room for n more bytes in the arena; the arguments' pointers follow it
 * when it moves.  0, or -1 (failed set). */
static int reserve(qg__rs_args *a, size_t n)
{
    size_t nc;
    char *nb;
    if (a->used + n <= a->bufcap)
        return 0;
    for (nc = a->bufcap ? a->bufcap : 1024; nc < a->used + n; nc *= 2)
        ;
    /* a new block, not realloc: the pointers are moved while the old
     * block still exists */
    if (!(nb = malloc(nc))) {
        a->failed = 1;
        return -1;
    }
    if (a->used)
        memcpy(nb, a->buf, a->used);
    for (int i = 0; i < a->argc; i++)
        a->argv[i] = nb + (a->argv[i] - a->buf);
    free(a->buf);
    a->buf = nb;
    a->bufcap = nc;
    return 0;
}

/* Append n bytes and a NUL to the arena; their start, or NULL. */
static char *put(qg__rs_args *a, const char *s, size_t n)
{
    char *c;
    if (reserve(a, n + 1) != 0)
        return NULL;
    c = a->buf + a->used;
    memcpy(c, s, n);
    c[n] = 0;
    a->used += n + 1;
    return c;
}

void qg__rs_add(qg__rs_args *a, const char *s, size_t n)
{
    char *c;
    if (a->failed)
        return;
    if (a->argc == a->cap) {
        int nc = a->cap ? a->cap * 2 : 64;
        char **nv;
        size_t *nl;
        if (nc > QG__RS_MAX_ARGS) {
            a->failed = 1;
            return;
        }
        if (!(nv = realloc(a->argv, (size_t)nc * sizeof *nv))) {
            a->failed = 1;
            return;
        }
        a->argv = nv;
        if (!(nl = realloc(a->len, (size_t)nc * sizeof *nl))) {
            a->failed = 1;
            return;
        }
        a->len = nl;
        a->cap = nc;
    }
    if (!(c = put(a, s, n)))
        return;
    a->argv[a->argc] = c;
    a->len[a->argc] = n;
    a->argc++;
}

/* Replace argument i (present) by s (appended; the old bytes stay unused
 * in the arena until the next reset). */
static void set_arg(qg__rs_args *a, int i, const char *s)
{
    size_t n = strlen(s);
    char *c;
    if (a->failed || i >= a->argc)
        return;
    if (!(c = put(a, s, n)))
        return;
    a->argv[i] = c;
    a->len[i] = n;
}

void qg__rs_args_to_evalsha(qg__rs_args *a, const qg__rs_version *v)
{
    set_arg(a, 0, "EVALSHA");
    set_arg(a, 1, v->sha);
}

void qg__rs_adds(qg__rs_args *a, const char *s)
{
    qg__rs_add(a, s, strlen(s));
}

void qg__rs_addi(qg__rs_args *a, int64_t v)
{
    char b[24];
    qg__rs_add(a, b, qg__rs_dec(b, v));
}

void qg__rs_num(qg__rs_nums *ns, int64_t v)
{
    union {
        double d;
        uint64_t u;
    } x;
    if (ns->n >= QG__RS_MAX_NUMS) {
        ns->failed = 1;
        return;
    }
    x.d = (double)v;
    for (int i = 0; i < 8; i++)
        ns->b[8 * ns->n + i] = (unsigned char)(x.u >> (56 - 8 * i));
    ns->n++;
}

void qg__rs_addnums(qg__rs_args *a, const qg__rs_nums *ns)
{
    if (ns->failed) {
        a->failed = 1;
        return;
    }
    qg__rs_add(a, (const char *)ns->b, 8 * (size_t)ns->n);
}

/* Hex and decimal by hand: these run for every argument of every call,
 * and printf's format parsing cost a call more than its Redis round trip
 * spends in this process (callgrind, docs/benchmarks.md). */
static void hex16(char *out, uint64_t v)
{
    for (int i = 15; i >= 0; i--, v >>= 4)
        out[i] = "0123456789abcdef"[v & 15];
}

size_t qg__rs_dec(char *out, int64_t v)
{
    size_t k = qg__dec_i64(out, v);
    out[k] = 0;
    return k;
}

void qg__rs_hex(qg_key k, char out[33])
{
    hex16(out, k.hi);
    hex16(out + 16, k.lo);
    out[32] = 0;
}

void qg__rs_hex_lo(qg_key k, char out[17])
{
    hex16(out, k.lo);
    out[16] = 0;
}

/* a b c d into out, cut at QG__RS_KEY_MAX - 1 bytes (as snprintf was). */
static void key_join(char *out, const char *a, const char *b, const char *c,
                     const char *d)
{
    const char *parts[4] = {a, b, c, d};
    size_t k = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = strlen(parts[i]);
        if (n > QG__RS_KEY_MAX - 1 - k)
            n = QG__RS_KEY_MAX - 1 - k;
        memcpy(out + k, parts[i], n);
        k += n;
    }
    out[k] = 0;
}

void qg__rs_key_state(const char *tag, const char *ent, char *out)
{
    key_join(out, "qg:{", tag, "}:e:", ent);
}

void qg__rs_key_log(const char *tag, const char *ent, char *out)
{
    key_join(out, "qg:{", tag, "}:l:", ent);
}

void qg__rs_key_rec(const char *tag, const char *rid, char *out)
{
    key_join(out, "qg:{", tag, "}:q:", rid);
}

void qg__rs_key_index(const char *rid, char *out)
{
    key_join(out, "qg:rid:{", rid, "}", "");
}

void qg__rs_place_of(qg_key member, int has_org, qg_key org,
                     qg__rs_place *out)
{
    qg__rs_hex(member, out->member);
    if (has_org) {
        qg__rs_hex(org, out->org);
        memcpy(out->tag, out->org, sizeof out->tag);
    } else {
        memcpy(out->org, "-", 2);
        memcpy(out->tag, out->member, sizeof out->tag);
    }
}

void qg__rs_index_value(const qg__rs_place *p, char out[65])
{
    size_t t = strnlen(p->tag, 32), m = strnlen(p->member, 32);
    memcpy(out, p->tag, t);
    memcpy(out + t, p->member, m);
    out[t + m] = 0;
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

int qg__rs_index_parse(const char *v, size_t len, qg__rs_place *out)
{
    if (len != 64 || !is_hex(v, 64))
        return -1;
    memcpy(out->tag, v, 32);
    out->tag[32] = 0;
    memcpy(out->member, v + 32, 32);
    out->member[32] = 0;
    /* a member without an org is its own tag */
    if (strcmp(out->tag, out->member) == 0)
        memcpy(out->org, "-", 2);
    else
        memcpy(out->org, out->tag, sizeof out->org);
    return 0;
}

void qg__rs_eval_head(qg__rs_args *a, const qg__rs_version *v, int fcall,
                      const qg__rs_place *p, const char *rid)
{
    char k[QG__RS_KEY_MAX];
    int has_org = strcmp(p->org, "-") != 0;
    qg__rs_adds(a, fcall ? "FCALL" : "EVALSHA");
    qg__rs_adds(a, fcall ? v->fn_name : v->sha);
    qg__rs_addi(a, has_org ? 5 : 3);
    qg__rs_key_rec(p->tag, rid, k);
    qg__rs_adds(a, k);
    qg__rs_key_state(p->tag, p->member, k);
    qg__rs_adds(a, k);
    qg__rs_key_log(p->tag, p->member, k);
    qg__rs_adds(a, k);
    if (has_org) {
        qg__rs_key_state(p->tag, p->org, k);
        qg__rs_adds(a, k);
        qg__rs_key_log(p->tag, p->org, k);
        qg__rs_adds(a, k);
    }
}

int64_t qg__rs_lease_ttl(const qg_plan *p)
{
    for (int i = 0; i < p->nwindows; i++)
        if (p->windows[i].type == QG_WIN_CONCURRENCY &&
            p->windows[i].lease_ttl_ms > 0)
            return p->windows[i].lease_ttl_ms;
    return p->lease_ttl_ms > 0 ? p->lease_ttl_ms : DEFAULT_LEASE_MS;
}

static int count_cal(const qg_window_spec *w, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += w[i].type == QG_WIN_CALENDAR;
    return c;
}

static void add_cal(qg__rs_nums *a, const qg_window_spec *w, int n,
                    int64_t anchor, int64_t pnow)
{
    for (int i = 0; i < n; i++) {
        int64_t s, e;
        if (w[i].type != QG_WIN_CALENDAR)
            continue;
        if (qg__calendar_period(&w[i].cal, anchor, pnow, &s, &e) != 0 ||
            !(s <= pnow && pnow < e)) {
            s = -1;
            e = -1;
        }
        qg__rs_num(a, s);
        qg__rs_num(a, e);
    }
}

/* pnow, the number of calendar windows, their periods. */
static void add_periods(qg__rs_nums *a, const qg_plan *plan,
                        const qg_org_spec *os, int64_t anchor, int64_t pnow)
{
    int n = count_cal(plan->windows, plan->nwindows) +
            (os ? count_cal(os->windows, os->nwindows) : 0);
    qg__rs_num(a, pnow);
    qg__rs_num(a, n);
    add_cal(a, plan->windows, plan->nwindows, anchor, pnow);
    if (os)
        add_cal(a, os->windows, os->nwindows, 0, pnow);
}

static void add_model(qg__rs_nums *a, const qg_model *m)
{
    qg__rs_num(a, m ? m->per_request_milli : -1);
    qg__rs_num(a, m ? m->input_per_1k_micro : 0);
    qg__rs_num(a, m ? m->output_per_1k_micro : 0);
}

void qg__rs_args_check(qg__rs_args *a, const qg__rs_check_args *c)
{
    const qg_store_check *in = c->in;
    const qg_org_spec *os = in->has_org ? in->orgspec : NULL;
    qg__rs_place p;
    qg__rs_nums ns = {0};
    char rid[17];
    qg__rs_place_of(in->member, in->has_org && os, in->org, &p);
    qg__rs_hex_lo(in->rid, rid);
    qg__rs_adds(a, "check");
    qg__rs_num(&ns, c->now_arg);
    qg__rs_num(&ns, in->weight_milli);
    qg__rs_num(&ns, in->model);
    qg__rs_num(&ns, c->ver->plan_list[in->plan->index]);
    qg__rs_num(&ns, os ? c->ver->org_list[os->index] : 0);
    qg__rs_num(&ns, in->anchor_ms);
    qg__rs_num(&ns, qg__rs_lease_ttl(in->plan));
    qg__rs_num(&ns, c->rid_ttl_ms);
    qg__rs_num(&ns, in->payg_mask);
    qg__rs_num(&ns, in->payg_mask ? in->price_micro : 0);
    qg__rs_num(&ns, in->payg_mask ? in->cap_micro : 0);
    qg__rs_num(&ns, in->payg_mask ? c->cap_start : 0);
    qg__rs_num(&ns, in->payg_mask ? c->cap_end : 0);
    add_model(&ns, in->model_spec);
    qg__rs_num(&ns, c->check_cap);
    add_periods(&ns, in->plan, os, in->anchor_ms, c->pnow);
    qg__rs_addnums(a, &ns);
    qg__rs_adds(a, rid);
    qg__rs_adds(a, p.member);
    qg__rs_adds(a, p.org);
}

void qg__rs_args_settle(qg__rs_args *a, const qg_store_settle *in,
                        int64_t now_arg, const qg__rs_place *keys)
{
    char member[33], rid[17];
    qg__rs_nums ns = {0};
    qg__rs_hex(in->member, member);
    qg__rs_hex_lo(in->rid, rid);
    qg__rs_adds(a, "settle");
    qg__rs_num(&ns, now_arg);
    qg__rs_num(&ns, (int64_t)in->status);
    qg__rs_num(&ns, in->input_tokens);
    qg__rs_num(&ns, in->output_tokens);
    qg__rs_num(&ns, in->weight_milli);
    qg__rs_num(&ns, in->no_charge != 0);
    qg__rs_num(&ns, in->has_member != 0);
    qg__rs_addnums(a, &ns);
    qg__rs_adds(a, in->has_member ? member : "-");
    qg__rs_adds(a, keys->member);
    qg__rs_adds(a, keys->org);
    qg__rs_adds(a, rid);
}

void qg__rs_args_usage(qg__rs_args *a, const qg_store_usage *in,
                       const qg__rs_version *ver, int64_t now_arg,
                       int64_t pnow)
{
    const qg_org_spec *os = in->has_org ? in->orgspec : NULL;
    qg__rs_nums ns = {0};
    qg__rs_adds(a, "usage");
    qg__rs_num(&ns, now_arg);
    qg__rs_num(&ns, ver->plan_list[in->plan->index]);
    qg__rs_num(&ns, os ? ver->org_list[os->index] : 0);
    qg__rs_num(&ns, in->anchor_ms);
    qg__rs_num(&ns, in->cap_start_ms);
    add_periods(&ns, in->plan, os, in->anchor_ms, pnow);
    qg__rs_addnums(a, &ns);
}

void qg__rs_args_restore(qg__rs_args *a, const qg_store_restore *in,
                         const qg__rs_version *ver, int64_t pnow,
                         int64_t rid_ttl_ms)
{
    const qg_org_spec *os = in->has_org ? in->orgspec : NULL;
    qg__rs_place p;
    qg__rs_nums ns = {0};
    char rid[17];
    qg__rs_place_of(in->member, in->has_org && os, in->org, &p);
    qg__rs_hex_lo(in->rid, rid);
    qg__rs_adds(a, "restore");
    qg__rs_num(&ns, in->at_ms);
    qg__rs_num(&ns, in->charged_milli);
    qg__rs_num(&ns, in->reserved_milli);
    qg__rs_num(&ns, in->model);
    qg__rs_num(&ns, ver->plan_list[in->plan->index]);
    qg__rs_num(&ns, os ? ver->org_list[os->index] : 0);
    qg__rs_num(&ns, in->anchor_ms);
    qg__rs_num(&ns, in->settled != 0);
    qg__rs_num(&ns, in->status);
    qg__rs_num(&ns, in->headroom_milli);
    qg__rs_num(&ns, in->price_micro);
    qg__rs_num(&ns, in->cost_micro);
    qg__rs_num(&ns, in->cap_start_ms);
    qg__rs_num(&ns, in->charge_only != 0);
    qg__rs_num(&ns, qg__rs_lease_ttl(in->plan));
    qg__rs_num(&ns, rid_ttl_ms);
    add_model(&ns, in->model_spec);
    add_periods(&ns, in->plan, os, in->anchor_ms, pnow);
    qg__rs_addnums(a, &ns);
    qg__rs_adds(a, rid);
    qg__rs_adds(a, p.member);
    qg__rs_adds(a, p.org);
}

void qg__rs_args_lookup(qg__rs_args *a, int64_t now_arg, const char *member)
{
    qg__rs_nums ns = {0};
    qg__rs_adds(a, "lookup");
    qg__rs_num(&ns, now_arg);
    qg__rs_addnums(a, &ns);
    qg__rs_adds(a, member);
}

/* The undo log's entries follow as arguments of their own (op and key
 * index as decimal text, the two operands as they came back). */
void qg__rs_args_void(qg__rs_args *a, const qg__rs_result *res,
                      const char *rid_lo)
{
    qg__rs_nums ns = {0};
    qg__rs_adds(a, "void");
    qg__rs_num(&ns, res->mv);
    qg__rs_num(&ns, res->ov);
    qg__rs_num(&ns, res->nundo);
    qg__rs_addnums(a, &ns);
    qg__rs_adds(a, rid_lo);
    for (int i = 0; i < 4 * res->nundo; i++) {
        if (res->undo[i].is_str)
            qg__rs_add(a, res->undo[i].s, res->undo[i].len);
        else
            qg__rs_addi(a, res->undo[i].i);
    }
}
