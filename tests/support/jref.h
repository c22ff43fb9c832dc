/* jref.h - the jansson reference readers that the yajl scanners
 * (respscan.c, reqscan.c) replaced, kept as the oracle of their
 * differential tests (test_respscan.c, test_reqscan.c) and fuzz harnesses
 * (fuzz/fuzz_respscan.c, fuzz_reqscan.c, fuzz_sse.c): the token-count
 * rules the old jansson readers applied (jref.c), the response readers
 * (respref.c) and the request reader (reqref.c).  No cmocka here, so the
 * fuzz harnesses can link them. */
#ifndef TST_JREF_H
#define TST_JREF_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "usage.h"

/* A token count member of obj: 1 and *v when present, 0 when absent or
 * null, -1 when it is not a non-negative integer. */
int tst_jref_count(const json_t *obj, const char *key, int64_t *v);
/* The first of two alternative count members that is present. */
int tst_jref_count2(const json_t *obj, const char *k1, const char *k2,
                    int64_t *v);

/* json_loadb(s, len, flags), except that a raw NUL byte outside strings
 * refuses the text: jansson 2.14 skips one right after a number or a
 * literal ({"a":1<NUL>}), and our scanners refuse it on purpose
 * (respscan.h).  NULL for s NULL or refused text. */
json_t *tst_jref_load(const char *s, size_t len, size_t flags);

/* ---- responses (respref.c) */

/* The jansson versions of qg__usage_openai_chunk_bytes and
 * qg__usage_anthropic_event_bytes (usage.h), same contract. */
int tst_ref_openai_chunk_bytes(const char *data, size_t len,
                               qg_usage_counts *out, int *is_usage_only,
                               int64_t *content_bytes);
int tst_ref_anthropic_event_bytes(const char *event, size_t elen,
                                  const char *data, size_t dlen,
                                  qg_usage_counts *acc,
                                  int64_t *content_bytes);
/* Print "what differs on n bytes: <s escaped, at most 400 bytes>". */
void tst_show(const char *what, const char *s, size_t n);
/* Counts, flags and error type equal. */
int tst_same_counts(const qg_usage_counts *a, const qg_usage_counts *b);
/* Every response reader of usage.h and proxy.h on s[0..n) against its
 * reference (return value, counts, error type, usage-only flag, content
 * bytes): 1 when all agree, else 0 after printing the first difference
 * and the text to stderr. */
int tst_resp_agree(const char *s, size_t n);

/* ---- requests (reqref.c) */

/* The jansson version of qg__request_fields, same contract. */
int tst_ref_request_fields(const char *body, size_t len, int shape,
                           qg_request_info *out);
/* qg__request_fields on s[0..n) (s may be NULL with n 0), both shapes
 * and an invalid one, against the reference (on a refusal only the
 * return and the emptied model are compared): 1 when they agree, else 0
 * after printing the difference to stderr. */
int tst_req_agree(const char *s, size_t n);

#endif
