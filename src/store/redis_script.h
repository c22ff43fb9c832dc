/* redis_script.h - the Redis store's server-side script as data: the text
 * of the script for one rules version, the command arguments of every
 * operation, and the decoding of the script's replies.
 *
 * Pure: no I/O.  store_redis.c does the talking (today on a synchronous
 * hiredis connection; the asynchronous transport and Cluster routing
 * replace only that file), so everything here can be tested without a
 * Redis server.  The script itself lives in the Lua files in src/store/redis/ and is
 * embedded at build time (build/gen/redis_lua_*.c, Makefile).
 *
 * Rules reach Redis once per rules version: the script text is a
 * generated preamble (AMAX, MMAX and every distinct window list of the
 * rules, deduplicated by content, built on use) followed by the static
 * library, so its SHA1 names the rules version; calls carry only keys,
 * amounts, times, the indexes of the member's and the org's window lists,
 * and calendar periods (Lua cannot compute time zones).
 *
 * Key layout (docs/redis-store.md), every key of one decision in the hash
 * slot of its tag (the org's key when the member has one, else the
 * member's; 32 hex digits):
 *   qg:{TAG}:e:<ENT>   an entity's window states (one packed string)
 *   qg:{TAG}:l:<ENT>   its rolling logs and leases (sorted set)
 *   qg:{TAG}:q:<RID>   a request id's record (string, with a TTL)
 *   qg:rid:{<RID>}     which tag and member hold a request id (string)
 *   qg:epoch           the data set's identity (data-loss detection)
 *
 * The exactness domain: Lua numbers are doubles, so the Redis store keeps
 * every amount (weights, limits, bursts, window sums) within
 * QG_REDIS_AMOUNT_MAX and every sum of money within QG_REDIS_MONEY_MAX,
 * far below 2^53 (two bounded values sum exactly); wider products are
 * formed in bignums (redis/bignum.lua).  Rules outside the domain are
 * refused (qg_redis_rules_check). */
#ifndef QG_REDIS_SCRIPT_H
#define QG_REDIS_SCRIPT_H

#include <stddef.h>
#include <stdint.h>
#include "quotagate.h"
#include "rules.h"
#include "store.h"

#define QG_REDIS_AMOUNT_MAX INT64_C(1000000000000000) /* 10^12 points */
#define QG_REDIS_MONEY_MAX INT64_C(1000000000000000)  /* 10^9 USD */
#define QG__RS_MAX_ARGS (1 << 20)      /* hard cap on one command's size */
#define QG__RS_CLAIM_TTL_MS 30000      /* an id's claim before admission */
#define QG__RS_STAMP_PREFIX "loaded_ms=" /* a library's description */

/* ------------------------------------------------------------- rules */

/* Is every limit, burst, weight coefficient, price and cap of the rules
 * exactly representable by the scripts (the domain above, and a rate
 * window's full bucket drains before QG_TIME_MAX_MS)?  0, or QG_ERANGE
 * with a message naming the plan or org, the window and the bound. */
int qg_redis_rules_check(const qg_rules *r, char *err, size_t errcap);

/* One rules version's script. */
typedef struct qg__rs_version {
    const qg_rules *rules;     /* not owned */
    char *text;                /* preamble + library, NUL-terminated */
    size_t len;
    char sha[41];              /* SHA1 of text, lowercase hex */
    char *fn_text;             /* the same as a Function library */
    size_t fn_len;
    size_t fn_stamp;           /* the offset in fn_text of the 13 digits
                                  of its load instant (the function's
                                  description, "loaded_ms=..."), written
                                  into a copy at every FUNCTION LOAD */
    char fn_name[44];          /* its library's and function's name:
                                  "qg_" and sha */
    int *plan_list;            /* per plan index: its 1-based list */
    int *org_list;             /* per org index */
    int nlists;                /* the rules' own distinct lists */
    int nall;                  /* lists in the preamble: own, then earlier
                                  versions' (redis_script.c) */
    char **list_lua;
    char (*list_id)[17];
    const qg_window_spec **list_w; /* each list's windows (in the rules of
                                      its version, which the engine keeps
                                      alive), for naming views */
    int *list_n;
    int64_t rid_ttl_ms;        /* default request-id memory (see .c) */
    struct qg__rs_version *next;
} qg__rs_version;

/* Build the script of rules r (checked with qg_redis_rules_check first),
 * carrying the window lists of the versions chained from prev (may be
 * NULL).  Returns a version the caller frees with qg__rs_version_free, or
 * NULL with QG_ERANGE / QG_ENOMEM in *rc and a message in err. */
qg__rs_version *qg__rs_version_new(const qg_rules *r,
                                   const qg__rs_version *prev, int *rc,
                                   char *err, size_t errcap);
void qg__rs_version_free(qg__rs_version *v);

/* The small compare-and-set script for a request id's index key. */
const char *qg__rs_claim_text(size_t *len);

/* SHA1 of text as 40 lowercase hex digits (what EVALSHA names a script
 * by).  0, or -1 when the digest failed. */
int qg__rs_sha1(const char *text, size_t len, char out[41]);

/* ------------------------------------------------------- arguments */

/* A command's arguments, copied (hiredis's redisAppendCommandArgv). */
typedef struct qg__rs_args {
    int argc, cap;
    char **argv;               /* each NUL-terminated, inside buf */
    size_t *len;
    char *buf;                 /* every argument's bytes, one allocation
                                  kept across resets (a call builds its
                                  arguments with no malloc of its own) */
    size_t used, bufcap;
    int failed;                /* out of memory or past QG__RS_MAX_ARGS */
} qg__rs_args;

void qg__rs_args_init(qg__rs_args *a);
void qg__rs_args_reset(qg__rs_args *a);
void qg__rs_args_free(qg__rs_args *a);
void qg__rs_add(qg__rs_args *a, const char *s, size_t n);
void qg__rs_adds(qg__rs_args *a, const char *s);
void qg__rs_addi(qg__rs_args *a, int64_t v);
/* v in decimal into out (at least 21 bytes), NUL-terminated; its length. */
size_t qg__rs_dec(char *out, int64_t v);

/* The numbers of one script call, sent as ONE argument: big-endian IEEE
 * doubles, 8 bytes each, that the script reads with a single
 * struct.unpack (a decimal argument costs the script a tonumber each,
 * more than the arithmetic it feeds).  A double holds every integer below
 * 2^53 exactly, and rounds larger ones (INT64_MAX, a period's end when
 * there is none) to the nearest double, exactly as tonumber of their
 * decimal text did.  At most QG__RS_MAX_NUMS numbers; more set failed. */
#define QG__RS_MAX_NUMS 128
typedef struct qg__rs_nums {
    int n, failed;
    unsigned char b[8 * QG__RS_MAX_NUMS];
} qg__rs_nums;
void qg__rs_num(qg__rs_nums *ns, int64_t v);
/* Append the numbers as one argument. */
void qg__rs_addnums(qg__rs_args *a, const qg__rs_nums *ns);

/* Hex of a key: 32 digits (hi then lo), or 16 of its low half. */
void qg__rs_hex(qg_key k, char out[33]);
void qg__rs_hex_lo(qg_key k, char out[17]);

/* Key names (NUL-terminated, at most QG__RS_KEY_MAX bytes). */
#define QG__RS_KEY_MAX 96
void qg__rs_key_state(const char *tag, const char *ent, char *out);
void qg__rs_key_log(const char *tag, const char *ent, char *out);
void qg__rs_key_rec(const char *tag, const char *rid, char *out);
void qg__rs_key_index(const char *rid, char *out);
#define QG__RS_KEY_EPOCH "qg:epoch"

/* Where a request lives: its tag, member and org (hex; org "-" none). */
typedef struct qg__rs_place {
    char tag[33], member[33], org[33];
} qg__rs_place;

void qg__rs_place_of(qg_key member, int has_org, qg_key org,
                     qg__rs_place *out);
/* The value of an index key (tag then member, 64 hex digits) and back.
 * Parsing returns 0, or -1 for a value of another shape. */
void qg__rs_index_value(const qg__rs_place *p, char out[65]);
int qg__rs_index_parse(const char *v, size_t len, qg__rs_place *out);

/* EVALSHA sha numkeys KEYS..., or FCALL name numkeys KEYS... with fcall:
 * the keys of place p (record of rid, the member's two keys, the org's
 * two when there is one). */
void qg__rs_eval_head(qg__rs_args *a, const qg__rs_version *v, int fcall,
                      const qg__rs_place *p, const char *rid);
/* Make the script call a (an FCALL's head) an EVALSHA of version v. */
void qg__rs_args_to_evalsha(qg__rs_args *a, const qg__rs_version *v);

/* The arguments of each operation after the head.  pnow is the instant
 * C computes calendar periods for (and, payg, the cap period it was
 * given); now_arg 0 makes the script read Redis's TIME. */
typedef struct qg__rs_check_args {
    const qg_store_check *in;
    const qg__rs_version *ver;
    int64_t now_arg, pnow;
    int64_t cap_start, cap_end;   /* payg: for the instant used */
    int check_cap;                /* the script verifies the cap period */
    int64_t rid_ttl_ms;
} qg__rs_check_args;
void qg__rs_args_check(qg__rs_args *a, const qg__rs_check_args *c);

void qg__rs_args_settle(qg__rs_args *a, const qg_store_settle *in,
                        int64_t now_arg, const qg__rs_place *keys);

void qg__rs_args_usage(qg__rs_args *a, const qg_store_usage *in,
                       const qg__rs_version *ver, int64_t now_arg,
                       int64_t pnow);

void qg__rs_args_restore(qg__rs_args *a, const qg_store_restore *in,
                         const qg__rs_version *ver, int64_t pnow,
                         int64_t rid_ttl_ms);

void qg__rs_args_lookup(qg__rs_args *a, int64_t now_arg,
                        const char *member);

/* How long a reservation of this plan lives unsettled (store_memory.c). */
int64_t qg__rs_lease_ttl(const qg_plan *p);

/* ----------------------------------------------------------- replies */

/* One element of a script's (flat) reply. */
typedef struct qg__rs_item {
    int is_str;
    int64_t i;
    const char *s;
    size_t len;
} qg__rs_item;

/* What a reply says. */
typedef enum qg__rs_kind {
    QG__RS_OK = 0,
    QG__RS_PERIOD,     /* retry with periods for need_now */
    QG__RS_EINVAL,     /* the id belongs to another subject */
    QG__RS_ERR,        /* a window's error: rc */
    QG__RS_NOTFOUND,   /* settle: no such record */
    QG__RS_MOVED,      /* settle: the record is another place's */
    QG__RS_ABSENT,     /* lookup: no record */
    QG__RS_LAYOUT,     /* settle: the entity follows unknown rules */
    QG__RS_BAD         /* malformed reply */
} qg__rs_kind;

typedef struct qg__rs_result {
    qg__rs_kind kind;
    int rc;                        /* QG__RS_ERR, restore */
    int64_t raw_now, need_now;     /* QG__RS_PERIOD */
    qg__rs_place moved;            /* QG__RS_MOVED */
    /* a new decision: what a void needs */
    int has_undo;
    int64_t mv, ov;
    int nundo;
    const qg__rs_item *undo;       /* points into the items */
} qg__rs_result;

/* Decode a check, replay or lookup reply of version v's script into out
 * (views named after the windows of the lists the reply says the
 * member's and the org's state follow).  Returns the kind in res. */
void qg__rs_decode_check(const qg__rs_item *it, int n,
                         const qg__rs_version *v, qg_decision *out,
                         qg__rs_result *res);
void qg__rs_decode_settle(const qg__rs_item *it, int n,
                          qg_settle_result *out, qg__rs_result *res);
void qg__rs_decode_usage(const qg__rs_item *it, int n,
                         const qg__rs_version *v, qg_decision *out,
                         qg__rs_result *res);
void qg__rs_decode_restore(const qg__rs_item *it, int n, qg__rs_result *res);

/* The void of an admitted check: head (qg__rs_eval_head) then these. */
void qg__rs_args_void(qg__rs_args *a, const qg__rs_result *res,
                      const char *rid_lo);

#endif
