/* idfilter.h - a Bloom filter of the request ids in the ledger, private to
 * the ledger's front (src/ledger).
 *
 * The server asks the ledger about every request id its counters do not
 * remember, which is every new id (src/server/reqid.c).  Answering "not
 * there" from SQLite costs a read transaction (6-12 us, most of it POSIX
 * locking), from PostgreSQL a round trip; the filter answers it from
 * memory for nearly all of them.  It holds every id of the file (read
 * once at open) and every id submitted since, before its row can be
 * written, so "absent" is always true: only "maybe present" (true, or a
 * false positive) goes on to the database.
 *
 * It grows with the ledger: a filter of fixed size passed its capacity
 * after a few million new ids and then sent a growing share of them to
 * the database (9.3M ids into an empty ledger's: a third;
 * docs/benchmarks.md, "HTTP").  So it is a list of levels: the ledger's
 * writer counts the ids it writes (qg__idf_count) and, once the newest
 * level holds its capacity, opens one twice as large with more bits per
 * id; adds go to the newest, a test asks every level.  Their false
 * positives add up (10, 12, 14, then 16 bits per id: computed, about 1%,
 * 0.45%, 0.2%, 0.1% each): 1.3-1.4% measured with 3 levels, under 3%
 * computed with all 12.  A level has at most 2^30 bits, so 12 levels
 * hold about 530M ids from an empty ledger, in about 1.1 GB (computed
 * from the sizes, not measured).
 *
 * Bits are set and read with atomic operations and a level is published
 * whole before it is counted in nlevels: adds (submit, any thread) and
 * tests (lookups, any thread) need no lock.  Only qg__idf_count, on one
 * thread at a time, opens levels. */
#ifndef QG_IDFILTER_H
#define QG_IDFILTER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define QG_IDF_LEVELS 12

typedef struct qg__idf_level {
    _Atomic uint64_t *words;
    uint64_t blocks;            /* of 512 bits */
    uint64_t capacity;          /* ids it takes at its bits per id */
} qg__idf_level;

typedef struct qg__idf {
    qg__idf_level lv[QG_IDF_LEVELS];
    atomic_int nlevels;         /* 0: no filter (every test is "maybe") */
    atomic_int ready;           /* the file's ids are all in */
    uint64_t held;              /* ids counted into the newest level */
    uint64_t ids;               /* ids counted in all */
    uint64_t bytes;             /* of every level */
} qg__idf;

/* The first level, for `expected` ids (10 bits each, at least 2^24 bits
 * = 2 MiB; a level has at most 2^30 bits = 128 MiB).  Returns 0, or -1
 * out of memory (the filter then stays empty and never ready). */
int qg__idf_init(qg__idf *f, uint64_t expected);
void qg__idf_free(qg__idf *f);
void qg__idf_add(qg__idf *f, const char *id, size_t len);
/* 0 when id is certainly not in the ledger; 1 when it may be (or the
 * filter is not ready). */
int qg__idf_maybe(qg__idf *f, const char *id, size_t len);
/* Count n more ids added; once the newest level holds its capacity, open
 * the next.  One thread at a time (the filler at open, then the ledger's
 * writer).  Returns 1 when a level was opened, 0 when none was needed, -1
 * when one was needed and could not be (no memory, or QG_IDF_LEVELS
 * reached: the newest level takes the ids, with more false positives;
 * tried again once it has taken another capacity's worth). */
int qg__idf_count(qg__idf *f, uint64_t n);

#endif
