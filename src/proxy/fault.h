/* fault.h - allocation fault injection on the upstream call path
 * (docs/fault-injection.md), in SQLite's and curl's way: a test fails
 * the Nth allocation and proves that every call still ends in one answer
 * and one settle, without a crash or a leak.
 *
 * Each allocation the proxy makes for one call (src/server/h_proxy.c:
 * the px struct, its evbuffers, the SSE parser, the abort timer, the
 * request head, the rewritten body, pieces of the answer) and each one
 * the upstream client makes (src/proxy/upstream.c: the request bytes,
 * the connection, its events; sse.c's buffers) first asks
 * qg__alloc_fails(site) and, when told so, behaves as if the allocation
 * had returned NULL (or the libevent call that allocates had failed).
 * site names the point, for the test's report.
 *
 * Inert unless a test installs a hook (tests/unit/test_proxy_faults.c,
 * which runs the server in its own process): the cost in production is
 * one relaxed atomic load of a NULL pointer per allocation, and no
 * environment variable or option reaches it.  The hook may be called
 * from any worker thread. */
#ifndef QG_FAULT_H
#define QG_FAULT_H

#include <stdatomic.h>
#include <stddef.h>

/* Returns nonzero to fail the allocation at site (a string literal). */
typedef int (*qg__alloc_hook)(const char *site);

/* NULL (the default): nothing fails. */
extern _Atomic(qg__alloc_hook) qg__alloc_fail_hook;

static inline int qg__alloc_fails(const char *site)
{
    qg__alloc_hook h = atomic_load_explicit(&qg__alloc_fail_hook,
                                            memory_order_relaxed);
    return h != NULL && h(site);
}

#endif
