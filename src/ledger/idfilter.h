/* idfilter.h - a Bloom filter of the request ids in the ledger, private to
 * the SQLite backend (src/ledger).
 *
 * The server asks the ledger about every request id its counters do not
 * remember, which is every new id (src/server/reqid.c).  Answering "not
 * there" from SQLite costs a read transaction (6-12 us, most of it POSIX
 * locking); the filter answers it from memory for nearly all of them.  It
 * holds every id of the file (read once at open) and every id submitted
 * since, before its row can be written, so "absent" is always true: only
 * "maybe present" (true, or a false positive at ~1% while the ledger is
 * within the filter's capacity, more beyond it) goes on to SQLite.
 *
 * Bits are set and read with atomic operations: adds (submit, any thread)
 * and tests (lookups, any thread) need no lock. */
#ifndef QG_IDFILTER_H
#define QG_IDFILTER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct qg__idf {
    _Atomic uint64_t *words;    /* NULL: no filter (every test is "maybe") */
    uint64_t mask;              /* bit count - 1 (a power of two) */
    atomic_int ready;           /* the file's ids are all in */
} qg__idf;

/* Size for `expected` ids (10 bits each, at least 2^24 bits = 2 MiB, at
 * most 2^30 bits = 128 MiB).  Returns 0, or -1 out of memory (the filter
 * then stays empty and never ready). */
int qg__idf_init(qg__idf *f, uint64_t expected);
void qg__idf_free(qg__idf *f);
void qg__idf_add(qg__idf *f, const char *id, size_t len);
/* 0 when id is certainly not in the ledger; 1 when it may be (or the
 * filter is not ready). */
int qg__idf_maybe(qg__idf *f, const char *id, size_t len);

#endif
