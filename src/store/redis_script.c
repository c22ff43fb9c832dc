/* redis_script.c - the script of one rules version, and the exactness
 * domain the scripts need (redis_script.h).
 *
 * The script is the generated preamble followed by the embedded library
 * (the Lua files in src/store/redis/, in build/gen/redis_lua_lib.c):
 *
 *   local function BODY()      -- closed at the end of ops.lua
 *   local AMAX = <QG_REDIS_AMOUNT_MAX>
 *   local MMAX = <QG_REDIS_MONEY_MAX>
 *   local function LIST(i)
 *     if i == 1 then return {id = '<16 hex>', n = .., fmt = .., nv = ..,
 *                            size = .., wids = .., w = {{wid = ..,
 *                            type = .., o = .., limit = .., ...}, ...}} end
 *     ...
 *   end
 *   local function LIST_INDEX(id) if id == '<16 hex>' then return 1 end
 *     ... return nil end
 *
 * One LIST entry per distinct window list of the rules (a plan's
 * windows, an org's windows), deduplicated by content.  Redis runs the
 * whole script body at every EVALSHA, so the lists are branches of one
 * function rather than a table of them: a call builds only the one or two
 * lists it uses, and no closure per list (a closure or a table costs a
 * script in Redis more than most of a decision's arithmetic).  Each list
 * carries the struct format of an entity's state that follows it (fmt:
 * header, then every window's state; nv values, size bytes with the
 * trailer of window ids, common.lua) and each window the offset o of its
 * state among the unpacked values.  A list's id is a
 * hash of its whole content (every field of every window, the calendar
 * spec included), the same at every instance with the same rules: an
 * entity in Redis records the id of the list its state follows, and a
 * list with another id makes the script carry the state over window by
 * window (same type and name), as store_memory.c does on a rules change.
 * A window's id (wid, its field in the entity's hash) is 8 hex digits of
 * its name's hash and its type digit.
 *
 * A version built after others also carries their lists (after its own):
 * an entity is read through the list its state follows until a check
 * moves it to the current one, so a replay or a settle after a reload
 * still finds its windows (at this instance; see docs/redis-store.md on
 * instances with different rules).
 *
 * The SHA1 of the text names the rules version (EVALSHA); a Redis that
 * lost its script cache answers NOSCRIPT and redis_ops.c loads the text
 * again.  The same body is also a Redis Function library, fn_text:
 *
 *   #!lua name=qg_<sha>
 *   local KEYS, ARGV
 *   local FNAME = 'qg_<sha>'
 *   local LOADED = 'loaded_ms=<13 digits>'
 *   <the preamble and library as above>
 *
 * loaded once per node (FUNCTION LOAD REPLACE) and called with FCALL
 * qg_<sha>: its body (BODY) runs once, at the first call after the load,
 * not at every call; ops.lua's entry registers the function under FNAME.  The EVAL text starts with
 * "local KEYS, ARGV = KEYS, ARGV" and FNAME nil instead, so both run the
 * same code.  The library's name carries the EVAL text's SHA1: every
 * rules version is its own library, and the names agree at every
 * instance with the same rules.  LOADED, the function's description,
 * is the instant of the FUNCTION LOAD that put the library there
 * (written into a copy of fn_text at each load, fn_stamp): FUNCTION LIST
 * shows it, and redis_ops.c deletes the libraries of other versions that
 * nobody loaded for a day (docs/redis-store.md, "Old libraries"). */
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "civil.h"
#include "error.h"
#include "redis_script.h"

extern const char qg__redis_lua_lib[];
extern const size_t qg__redis_lua_lib_len;
extern const char qg__redis_lua_claim[];
extern const size_t qg__redis_lua_claim_len;

const char *qg__rs_claim_text(size_t *len)
{
    *len = qg__redis_lua_claim_len;
    return qg__redis_lua_claim;
}

int qg__rs_sha1(const char *text, size_t len, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(text, len, md, &mdlen, EVP_sha1(), NULL) || mdlen != 20)
        return -1;
    for (unsigned i = 0; i < 20; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* ------------------------------------------------------------ domain */

#define LUA_INT_MAX INT64_C(9007199254740991)   /* 2^53 - 1 */

static int too_big(int64_t v, int64_t bound) { return v < 0 || v > bound; }

static int check_overage(const qg_overage *o, const char *what,
                         const char *name, const char *win, char *err,
                         size_t errcap)
{
    if (o->policy != QG_POLICY_PAYG)
        return QG_OK;
    if (too_big(o->price_per_unit_micro, QG_REDIS_MONEY_MAX) ||
        too_big(o->spending_cap_micro, QG_REDIS_MONEY_MAX)) {
        qg__errf(err, errcap, "%s \"%s\"%s%s%s: a payg price or spending cap "
                 "above %lld USD is beyond what the Redis store computes "
                 "exactly", what, name, win ? ", window \"" : "",
                 win ? win : "", win ? "\"" : "",
                 (long long)(QG_REDIS_MONEY_MAX / 1000000));
        return QG_ERANGE;
    }
    return QG_OK;
}

static int check_windows(const qg_window_spec *w, int n, const char *what,
                         const char *name, char *err, size_t errcap)
{
    for (int i = 0; i < n; i++) {
        const qg_window_spec *s = &w[i];
        int64_t burst = s->burst_milli > 0 ? s->burst_milli : s->limit_milli;
        int rc;
        if (too_big(s->limit_milli, QG_REDIS_AMOUNT_MAX) ||
            too_big(s->burst_milli, QG_REDIS_AMOUNT_MAX)) {
            qg__errf(err, errcap, "%s \"%s\", window \"%s\": a limit or burst "
                     "above %lld points is beyond what the Redis store "
                     "counts exactly", what, name, s->name,
                     (long long)(QG_REDIS_AMOUNT_MAX / 1000));
            return QG_ERANGE;
        }
        /* a full bucket must drain before the end of time (win_rate.lua) */
        if (s->type == QG_WIN_RATE && s->limit_milli > 0 &&
            (__int128)burst * s->length_ms >
                (__int128)QG_TIME_MAX_MS * s->limit_milli) {
            qg__errf(err, errcap, "%s \"%s\", window \"%s\": a full bucket "
                     "would take longer than until 9999-12-31 to drain, "
                     "beyond what the Redis store computes exactly", what,
                     name, s->name);
            return QG_ERANGE;
        }
        if ((rc = check_overage(&s->overage, what, name, s->name, err,
                                errcap)) != QG_OK)
            return rc;
    }
    return QG_OK;
}

int qg_redis_rules_check(const qg_rules *r, char *err, size_t errcap)
{
    int rc;
    for (int i = 0; i < r->nplans; i++) {
        const qg_plan *p = &r->plans[i];
        if ((rc = check_windows(p->windows, p->nwindows, "plan", p->name, err,
                                errcap)) != QG_OK ||
            (rc = check_overage(&p->overage, "plan", p->name, NULL, err,
                                errcap)) != QG_OK)
            return rc;
    }
    for (int i = 0; i < r->norgs; i++) {
        const qg_org_spec *o = &r->orgs[i];
        if ((rc = check_windows(o->windows, o->nwindows, "org", o->name, err,
                                errcap)) != QG_OK)
            return rc;
    }
    for (int i = 0; i < r->nmodels; i++) {
        const qg_model *m = &r->models[i];
        if (too_big(m->per_request_milli, QG_REDIS_AMOUNT_MAX) ||
            too_big(m->input_per_1k_micro, LUA_INT_MAX) ||
            too_big(m->output_per_1k_micro, LUA_INT_MAX)) {
            qg__errf(err, errcap, "model \"%s\": a weight coefficient beyond "
                     "what the Redis store computes exactly (per_request at "
                     "most %lld points, per 1k tokens below 2^53 "
                     "micro-points)", m->name,
                     (long long)(QG_REDIS_AMOUNT_MAX / 1000));
            return QG_ERANGE;
        }
    }
    return QG_OK;
}

/* ------------------------------------------------------------- text */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        char *np;
        while (b->len + n + 1 > nc)
            nc *= 2;
        if (!(np = realloc(b->p, nc))) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->failed = 1;
        return;
    }
    sb_add(b, tmp, (size_t)n);
}

/* max_entries as win_rolling.c normalises it. */
static uint32_t max_entries(const qg_window_spec *s)
{
    uint32_t m = s->max_entries ? s->max_entries : 1024u;
    if (m < 16u)
        m = 16u;
    if (m > (1u << 20))
        m = 1u << 20;
    return m;
}

static void wid_of(const qg_window_spec *s, char out[10])
{
    snprintf(out, 10, "%08x%d",
             (unsigned)(XXH3_64bits(s->name, strlen(s->name)) & 0xffffffffu),
             (int)s->type);
}

/* The canonical content of a window list: what its id hashes. */
static void list_content(sbuf *b, const qg_window_spec *w, int n)
{
    for (int i = 0; i < n; i++) {
        const qg_window_spec *s = &w[i];
        sb_printf(b, "%s|%d|%d|%lld|%lld|%lld|%lld|%u|%lld|%llx|",
                  s->name, (int)s->type, (int)s->unit,
                  (long long)s->limit_milli, (long long)s->length_ms,
                  (long long)s->burst_milli, (long long)s->precision_ms,
                  max_entries(s), (long long)s->lease_ttl_ms,
                  (unsigned long long)s->model_mask);
        if (s->type == QG_WIN_CALENDAR)
            sb_printf(b, "%d|%d|%d|%d|%d|%s|", (int)s->cal.every,
                      s->cal.weekday, s->cal.mday, s->cal.minute_of_day,
                      s->cal.anchor_billing,
                      s->cal.tz ? qg__tz_name(s->cal.tz) : "");
        sb_str(b, "\n");
    }
}

/* A window type's state in an entity's packed blob (common.lua): its
 * struct format, number of values and bytes. */
static const struct {
    const char *fmt;
    int nv, size;
} state_fmt[] = {
    [QG_WIN_ROLLING] = {"Bdddddd", 7, 49},
    [QG_WIN_CALENDAR] = {"ddd", 3, 24},
    [QG_WIN_SESSION] = {"ddd", 3, 24},
    [QG_WIN_RATE] = {"dddBd", 5, 33},
    [QG_WIN_CONCURRENCY] = {"Bdddd", 5, 33},
};
#define STATE_HEADER_FMT "c16BdddddB"   /* common.lua, HFMT */
#define STATE_HEADER_NV 8
#define STATE_HEADER_SIZE 58

/* The table constructor of a window list: its id, window count, the
 * struct format and size of an entity's state blob that follows it, the
 * window ids (the blob's trailer), and each window (its state's offset o
 * in the unpacked blob, then its parameters). */
static void list_lua(sbuf *b, const char *id, const qg_window_spec *w, int n)
{
    int nv = STATE_HEADER_NV, size = STATE_HEADER_SIZE + 9 * n;
    sb_printf(b, "{id = '%s', n = %d, fmt = '>" STATE_HEADER_FMT, id, n);
    for (int i = 0; i < n; i++) {
        sb_str(b, state_fmt[w[i].type].fmt);
        nv += state_fmt[w[i].type].nv;
        size += state_fmt[w[i].type].size;
    }
    sb_printf(b, "', nv = %d, size = %d, wids = '", nv, size);
    for (int i = 0; i < n; i++) {
        char wid[10];
        wid_of(&w[i], wid);
        sb_str(b, wid);
    }
    sb_str(b, "', w = {\n");
    nv = STATE_HEADER_NV;
    for (int i = 0; i < n; i++) {
        const qg_window_spec *s = &w[i];
        /* only what the window's type reads: every field is a hash slot
         * of a table each call builds */
        sb_printf(b, " {type = %d, o = %d, limit = %lld", (int)s->type, nv,
                  (long long)s->limit_milli);
        nv += state_fmt[s->type].nv;
        if (s->unit == QG_UNIT_REQUESTS)
            sb_str(b, ", unit = 1");
        switch (s->type) {
        case QG_WIN_ROLLING:
            sb_printf(b, ", length = %lld, prec = %lld, maxe = %u",
                      (long long)s->length_ms, (long long)s->precision_ms,
                      max_entries(s));
            break;
        case QG_WIN_SESSION:
            sb_printf(b, ", length = %lld", (long long)s->length_ms);
            break;
        case QG_WIN_RATE:
            sb_printf(b, ", length = %lld, burst = %lld",
                      (long long)s->length_ms, (long long)s->burst_milli);
            break;
        case QG_WIN_CONCURRENCY:
            sb_printf(b, ", lease = %lld", (long long)s->lease_ttl_ms);
            break;
        default:
            break;
        }
        if (s->model_mask) {
            sb_str(b, ", mask = {");
            for (int m = 0; m < 64; m++)
                if ((s->model_mask >> m) & 1)
                    sb_printf(b, "[%d] = true, ", m);
            sb_str(b, "}");
        }
        sb_str(b, "},\n");
    }
    sb_str(b, "}}");
}

/* Distinct lists seen so far while building. */
typedef struct list_ent {
    char id[17];
    const qg_window_spec *w;
    int n;
} list_ent;

/* Index (1-based) of the list w[0..n) among ents, adding it when new. */
static int list_index(list_ent *ents, int *nents, const qg_window_spec *w,
                      int n, int *failed)
{
    sbuf c = {0};
    char id[17];
    list_content(&c, w, n);
    if (c.failed) {
        free(c.p);
        *failed = 1;
        return 0;
    }
    snprintf(id, sizeof id, "%016llx",
             (unsigned long long)XXH3_64bits(c.p ? c.p : "", c.len));
    free(c.p);
    for (int i = 0; i < *nents; i++)
        if (strcmp(ents[i].id, id) == 0)
            return i + 1;
    memcpy(ents[*nents].id, id, sizeof id);
    ents[*nents].w = w;
    ents[*nents].n = n;
    return ++*nents;
}

/* Within one list, every window needs its own field name. */
static int wids_distinct(const qg_window_spec *w, int n, const char *what,
                         const char *name, char *err, size_t errcap)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            char a[10], b[10];
            wid_of(&w[i], a);
            wid_of(&w[j], b);
            if (strcmp(a, b) == 0) {
                qg__errf(err, errcap, "%s \"%s\": windows \"%s\" and \"%s\" "
                         "share a state id in the Redis store; rename one",
                         what, name, w[i].name, w[j].name);
                return QG_ERANGE;
            }
        }
    return QG_OK;
}

/* How long the store remembers a request id by default: the longest a
 * charge can matter to any window of the rules (as the engine's rebuild
 * reach) and at least every plan's lease, plus an hour. */
static int64_t rid_ttl_of(const qg_rules *r)
{
    int64_t t = 15 * 60 * 1000LL;
    for (int i = 0; i < r->nplans + r->norgs; i++) {
        const qg_window_spec *w = i < r->nplans ? r->plans[i].windows
                                                : r->orgs[i - r->nplans].windows;
        int n = i < r->nplans ? r->plans[i].nwindows
                              : r->orgs[i - r->nplans].nwindows;
        int payg = i < r->nplans ? r->plans[i].payg != NULL
                                 : r->orgs[i - r->nplans].payg != NULL;
        if (i < r->nplans && qg__rs_lease_ttl(&r->plans[i]) > t)
            t = qg__rs_lease_ttl(&r->plans[i]);
        if (payg && t < 32 * QG_MS_PER_DAY)
            t = 32 * QG_MS_PER_DAY;
        for (int k = 0; k < n; k++) {
            int64_t x = 0;
            switch (w[k].type) {
            case QG_WIN_ROLLING:
            case QG_WIN_SESSION:
                x = w[k].length_ms;
                break;
            case QG_WIN_CALENDAR:
                x = (w[k].cal.every == QG_EVERY_DAY ? 2 :
                     w[k].cal.every == QG_EVERY_WEEK ? 8 : 32) * QG_MS_PER_DAY;
                break;
            case QG_WIN_RATE: {
                int64_t b = w[k].burst_milli > 0 ? w[k].burst_milli
                                                 : w[k].limit_milli;
                __int128 d = w[k].limit_milli > 0
                    ? (__int128)w[k].length_ms * b / w[k].limit_milli : 0;
                x = d > QG_DURATION_MAX_MS ? QG_DURATION_MAX_MS : (int64_t)d;
                break;
            }
            case QG_WIN_CONCURRENCY:
                x = w[k].lease_ttl_ms;
                break;
            }
            if (x > t)
                t = x;
        }
    }
    return t + 3600000;
}

/* Keep list `id` (its Lua text lua, copied) in v's preamble, unless it
 * is there already. */
static int keep_list(qg__rs_version *v, const char *id, const char *lua,
                     size_t len, const qg_window_spec *w, int n)
{
    char **nl;
    char (*ni)[17];
    const qg_window_spec **nw;
    int *nn;
    size_t k = (size_t)v->nall + 1;
    for (int i = 0; i < v->nall; i++)
        if (strcmp(v->list_id[i], id) == 0)
            return 0;
    if (!(nl = realloc(v->list_lua, k * sizeof *nl)))
        return -1;
    v->list_lua = nl;
    if (!(ni = realloc(v->list_id, k * sizeof *ni)))
        return -1;
    v->list_id = ni;
    if (!(nw = realloc(v->list_w, k * sizeof *nw)))
        return -1;
    v->list_w = nw;
    if (!(nn = realloc(v->list_n, k * sizeof *nn)))
        return -1;
    v->list_n = nn;
    if (!(v->list_lua[v->nall] = malloc(len + 1)))
        return -1;
    memcpy(v->list_lua[v->nall], lua, len);
    v->list_lua[v->nall][len] = 0;
    memcpy(v->list_id[v->nall], id, 17);
    v->list_w[v->nall] = w;
    v->list_n[v->nall] = n;
    v->nall++;
    return 0;
}

qg__rs_version *qg__rs_version_new(const qg_rules *r,
                                   const qg__rs_version *prev, int *rc,
                                   char *err, size_t errcap)
{
    qg__rs_version *v = NULL;
    list_ent *ents = NULL;
    int nents = 0, failed = 0;
    sbuf b = {0}, t = {0}, f = {0};

    if ((*rc = qg_redis_rules_check(r, err, errcap)) != QG_OK)
        return NULL;
    for (int i = 0; i < r->nplans; i++)
        if ((*rc = wids_distinct(r->plans[i].windows, r->plans[i].nwindows,
                                 "plan", r->plans[i].name, err, errcap)))
            return NULL;
    for (int i = 0; i < r->norgs; i++)
        if ((*rc = wids_distinct(r->orgs[i].windows, r->orgs[i].nwindows,
                                 "org", r->orgs[i].name, err, errcap)))
            return NULL;
    *rc = QG_ENOMEM;
    if (!(v = calloc(1, sizeof *v)) ||
        !(v->plan_list = calloc((size_t)r->nplans + 1, sizeof *v->plan_list)) ||
        !(v->org_list = calloc((size_t)r->norgs + 1, sizeof *v->org_list)) ||
        !(ents = calloc((size_t)(r->nplans + r->norgs) + 1, sizeof *ents)))
        goto fail;
    v->rules = r;
    for (int i = 0; i < r->nplans; i++)
        v->plan_list[i] = list_index(ents, &nents, r->plans[i].windows,
                                     r->plans[i].nwindows, &failed);
    for (int i = 0; i < r->norgs; i++)
        v->org_list[i] = list_index(ents, &nents, r->orgs[i].windows,
                                    r->orgs[i].nwindows, &failed);
    v->nlists = nents;
    v->rid_ttl_ms = rid_ttl_of(r);
    /* the rules' own lists first (their indexes are plan_list's and
     * org_list's), then those of earlier versions: entities still on an
     * earlier list are read through it (a replay or a settle after a
     * reload, as store_memory.c reads an entity through its own layout) */
    for (int i = 0; i < nents && !failed; i++) {
        sbuf l = {0};
        list_lua(&l, ents[i].id, ents[i].w, ents[i].n);
        failed = l.failed ||
                 keep_list(v, ents[i].id, l.p, l.len, ents[i].w, ents[i].n) != 0;
        free(l.p);
    }
    for (const qg__rs_version *p = prev; p && !failed; p = p->next)
        for (int i = 0; i < p->nall && !failed; i++)
            failed = keep_list(v, p->list_id[i], p->list_lua[i],
                               strlen(p->list_lua[i]), p->list_w[i],
                               p->list_n[i]) != 0;
    sb_printf(&b, "-- quotagate rules version %s\n"
              "-- the library's body, run once per load (ops.lua's entry)\n"
              "local function BODY()\nlocal AMAX = %lld\n"
              "local MMAX = %lld\n"
              "-- window list i, built on use (a call builds one or two)\n"
              "local function LIST(i)\n",
              r->version ? r->version : "", (long long)QG_REDIS_AMOUNT_MAX,
              (long long)QG_REDIS_MONEY_MAX);
    for (int i = 0; i < v->nall; i++) {
        sb_printf(&b, "if i == %d then return ", i + 1);
        sb_str(&b, v->list_lua[i]);
        sb_str(&b, " end\n");
    }
    sb_str(&b, "end\n-- the index of the list with this id, or nil\n"
           "local function LIST_INDEX(id)\n");
    for (int i = 0; i < v->nall; i++)
        sb_printf(&b, "if id == '%s' then return %d end\n", v->list_id[i],
                  i + 1);
    sb_str(&b, "return nil\nend\n");
    sb_add(&b, qg__redis_lua_lib, qg__redis_lua_lib_len);
    if (failed || b.failed)
        goto fail;
    /* the EVAL text reads the call's KEYS and ARGV (globals there); the
     * Function library declares them, and its entry sets them per call */
    sb_str(&t, "local KEYS, ARGV = KEYS, ARGV\nlocal FNAME, LOADED = nil, nil\n");
    sb_add(&t, b.p, b.len);
    if (t.failed || qg__rs_sha1(t.p, t.len, v->sha) != 0)
        goto fail;
    snprintf(v->fn_name, sizeof v->fn_name, "qg_%s", v->sha);
    sb_printf(&f, "#!lua name=%s\nlocal KEYS, ARGV\nlocal FNAME = '%s'\n"
              "local LOADED = '" QG__RS_STAMP_PREFIX, v->fn_name, v->fn_name);
    v->fn_stamp = f.len;
    sb_str(&f, "0000000000000'\n");
    sb_add(&f, b.p, b.len);
    if (f.failed)
        goto fail;
    v->text = t.p;
    v->len = t.len;
    v->fn_text = f.p;
    v->fn_len = f.len;
    free(b.p);
    free(ents);
    *rc = QG_OK;
    return v;
fail:
    qg__errf(err, errcap, "%s", "out of memory building the Redis script");
    free(b.p);
    free(t.p);
    free(f.p);
    free(ents);
    qg__rs_version_free(v);
    return NULL;
}

void qg__rs_version_free(qg__rs_version *v)
{
    if (!v)
        return;
    free(v->text);
    free(v->fn_text);
    free(v->plan_list);
    free(v->org_list);
    for (int i = 0; i < v->nall; i++)
        free(v->list_lua[i]);
    free(v->list_lua);
    free(v->list_id);
    free(v->list_w);
    free(v->list_n);
    free(v);
}
