/* sse.h - a Server-Sent Events parser that does no I/O.
 *
 * Feed it the bytes of a text/event-stream as they arrive, split anywhere
 * (inside a line, inside the UTF-8 BOM, between a CR and its LF); it calls
 * back once per dispatched event.  It follows the WHATWG HTML "event stream
 * interpretation": lines end with LF, CR or CRLF; a leading BOM is skipped;
 * "data" lines join with "\n"; one space after the colon is stripped;
 * comment lines (":...") are ignored; "event" sets the type ("message" when
 * none was given); "id" and "retry" are parsed and ignored; a blank line
 * dispatches, unless the event has no "data" field at all.
 *
 * Every buffer has a hard cap: an event whose type plus data exceed
 * max_event_bytes, or a single line longer than max_event_bytes + 64, makes
 * the parser fail with QG_ERANGE.  Comment lines are discarded as they
 * stream and are never buffered, so they have no cap.
 *
 * A handle is not thread-safe; use one per stream.
 *
 * The splitter (qg__sse_split_next) finds where one event ends in a byte
 * stream without parsing it, so that a stream can be passed on event by
 * event (stream.c's filter mode). */
#ifndef QG_SSE_H
#define QG_SSE_H

#include <stddef.h>

typedef struct qg_sse qg_sse;

/* Called once per dispatched event.  event (elen bytes) and data (dlen
 * bytes) are NUL-terminated for convenience, may contain NUL bytes
 * themselves, are owned by the parser and valid only during the call.
 * Return 0 to continue; any other value stops the parse and becomes the
 * result of qg__sse_feed. */
typedef int (*qg_sse_event_cb)(const char *event, size_t elen,
                               const char *data, size_t dlen, void *ud);

/* A new parser whose events (type plus data) may hold at most
 * max_event_bytes (0 is taken as 1).  Returns NULL on out of memory;
 * release with qg__sse_free. */
qg_sse *qg__sse_new(size_t max_event_bytes);

/* Parse len more bytes of the stream, calling on_event for each event they
 * complete.  Returns 0, QG_ERANGE (an event or line over the cap),
 * QG_ENOMEM, or the non-zero value a callback returned.  A failure is
 * sticky: later feeds return the same value without parsing, until
 * qg__sse_finish resets the handle.  on_event may be NULL to parse and
 * drop. */
int qg__sse_feed(qg_sse *p, const char *buf, size_t len,
                qg_sse_event_cb on_event, void *ud);

/* End of stream.  Per the spec an event not followed by a blank line is
 * discarded, never dispatched.  Returns 0 when the stream ended cleanly on
 * an event boundary, 1 when a partial line or an undispatched event was
 * discarded (a truncated stream), or the sticky failure of an earlier
 * feed.  The handle is reset and may parse a new stream. */
int qg__sse_finish(qg_sse *p);

/* Release the parser; NULL is ignored. */
void qg__sse_free(qg_sse *p);

/* Event boundaries of a text/event-stream: an event ends with a blank
 * line (two line ends in a row; a line ends with CR, LF or CRLF).  Zero
 * the state before a stream. */
typedef struct qg_sse_split {
    int at_eol;                /* the last byte ended a line */
    int cr;                    /* the last byte was CR */
} qg_sse_split;

/* Scan buf[0..len): returns the offset just past the first event
 * boundary in it (1..len), or 0 when it holds none (the state then
 * covers all len bytes).  Call again on the rest after a boundary.  A
 * boundary that ends with a CR whose LF is in the next piece leaves that
 * LF to the next event (an empty line there, which dispatches nothing). */
size_t qg__sse_split_next(qg_sse_split *s, const char *buf, size_t len);

#endif
