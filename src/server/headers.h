/* headers.h - the rate-limit headers of a decision (PRODUCT.md section 4).
 *
 * Every /v1/check answer and every proxied response carries the same
 * headers, so that clients written for the IETF draft or for OpenAI's API
 * back off correctly without knowing quotagate:
 *
 *   RateLimit-Policy  "burst_5h";q=50;w=18000, "rpm";q=20;w=60;qu="requests",
 *                     "concurrency";q=2;qu="concurrent-requests"
 *   RateLimit         "burst_5h";r=43;t=1234, ...
 *                     (org windows are named "org.NAME", so a member's and
 *                     its org's "concurrency" stay distinct)
 *   x-ratelimit-{limit,remaining,reset}-requests   request-unit window with
 *                     the least remaining (rate/rolling/calendar/session,
 *                     never concurrency); absent when the plan has none
 *   x-ratelimit-{limit,remaining,reset}-tokens     weight-unit window with
 *                     the least remaining; absent when there is none
 *   Retry-After, retry-after-ms, x-should-retry    refusals only
 *
 * Numbers are whole points (floor of the milli-unit values).  Resets in the
 * OpenAI family are Go time.Duration strings ("6m0s", "59.765s"), as
 * OpenAI writes them.  Weight-unit policies carry no qu parameter (the
 * window's unit is the rules' unit, published at /v1/plans); request-unit
 * ones say qu="requests", concurrency qu="concurrent-requests".
 *
 * The window lengths (w=) are not in qg_window_view: they are looked up by
 * window name in the rules the decision was made with: member windows in
 * the plan named d->plan, org windows in the org named d->org.  A window
 * not found there (rules swapped meanwhile) gets a policy without w.
 *
 * No allocation: names are static strings, values are written into the
 * caller's qg_hdr_buf.  Thread-safe (no shared state). */
#ifndef QG_HEADERS_H
#define QG_HEADERS_H

#include <stddef.h>
#include <stdint.h>
#include "http.h"
#include "quotagate.h"
#include "rules.h"

#define QG_HDR_MAX 16          /* headers of one decision */
#define QG_HDR_TEXT 4096       /* bytes of header values */

/* Headers built for one response.  h[i].name is a static string and
 * h[i].value points into text; valid as long as the buffer is. */
typedef struct qg_hdr_buf {
    qg_http_out_header h[QG_HDR_MAX];
    int n;
    size_t used;               /* bytes of text in use */
    char text[QG_HDR_TEXT];
} qg_hdr_buf;

/* Fill out with the headers of decision d (allowed or refused) as seen at
 * now_ms.  r is the rules d was decided with (for window lengths; may be
 * NULL, then no w= is written).  Returns the number of headers, or -1 when
 * they would not fit in out (out->n is then 0). */
int qg__headers_for_decision(const qg_decision *d, const qg_rules *r,
                            int64_t now_ms, qg_hdr_buf *out);

/* Format ms as Go's time.Duration.String() does: "0s", "20ms", "1.5s",
 * "6m0s", "1h0m0s", "25h1m1.001s"; negative values get a leading '-'.
 * Writes at most cap bytes including the NUL (truncating); returns the
 * length of the full string, as snprintf does. */
size_t qg__go_duration(int64_t ms, char *buf, size_t cap);

/* The spec of view v of decision d: member windows in d's plan, org
 * windows in d's org, both by name.  NULL when absent (or r NULL). */
const qg_window_spec *qg__view_spec(const qg_rules *r, const qg_decision *d,
                                    const qg_window_view *v);

#endif
