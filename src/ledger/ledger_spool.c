/* ledger_spool.c - where a shared ledger's rows wait while its database
 * cannot be reached (PRODUCT.md 5.1 point 6): one append-only file under
 * --data, replayed in order and exactly once when the database answers.
 *
 * The writer (ledger_writer.c) appends a batch the database could not
 * take, fsyncs it, and only then acknowledges the rows (a settle is
 * answered from the spool as it would be from a commit); every later
 * batch follows into the spool until the spool is empty again, so the
 * database receives rows in the order they were decided.  Replay writes
 * the spool's rows in batches through the backend's write_batch with a
 * mark (this spool's id, the batch's last sequence number) recorded in the
 * same transaction: a replay cut anywhere (the database lost again, the
 * process killed) resumes after the last committed batch, and no row is
 * written twice.  The file is reset once everything in it is in the
 * database.
 *
 * File: a header (magic, the row layout's size, this spool's id: random,
 * made when the file is), then records [magic, length, seq, row, XXH64 of
 * seq and row].  A record cut short or failing its checksum at the end of
 * the file was never acknowledged (its fsync had not returned): it is cut
 * off at open.  The row is stored as this build lays it out; a spool left
 * by a build whose row differs is refused at open with a message (replay
 * it with that build first). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "quotagate.h"
#include "ledger.h"
#include "ledger_front.h"

#define SPOOL_MAGIC "QGSPOOL1"
#define REC_MAGIC 0x52534751u   /* "QGSR" */
#define HDR_SIZE 64

typedef struct spool_hdr {
    char magic[8];
    uint32_t row_size;
    uint32_t reserved;
    char id[33];               /* 32 hex digits and NUL */
    char pad[HDR_SIZE - 8 - 8 - 33];
} spool_hdr;
_Static_assert(sizeof(spool_hdr) == HDR_SIZE, "spool header size");

typedef struct rec_head {
    uint32_t magic;
    uint32_t len;
    int64_t seq;
} rec_head;

#define REC_SIZE (sizeof(rec_head) + sizeof(qg_ledger_row) + 8)

struct qg__spool {
    qg_ledger *l;
    int fd;
    char path[1100];
    char id[33];
    off_t head;                /* first record not in the database */
    off_t end;                 /* end of the last whole record */
    int64_t next_seq;
    _Atomic uint64_t pending;  /* records in [head, end) */
    qg__ledger_item *items;    /* replay's batch (max_batch items) */
    unsigned char *buf;        /* append's and replay's records */
    size_t bufcap;
};

static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;
    if (fd < 0)
        return -1;
    rc = fsync(fd);
    close(fd);
    return rc;
}

static int write_all(int fd, const void *p, size_t n, off_t at)
{
    const unsigned char *c = p;
    while (n > 0) {
        ssize_t w = pwrite(fd, c, n, at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
        at += w;
    }
    return 0;
}

static int new_file(qg__spool *sp, char *err, size_t errcap)
{
    spool_hdr h;
    unsigned char rnd[16];
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SPOOL_MAGIC, 8);
    h.row_size = (uint32_t)sizeof(qg_ledger_row);
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        snprintf(err, errcap, "spool %s: no random bytes for its id: %s",
                 sp->path, strerror(errno));
        return QG_EIO;
    }
    for (int i = 0; i < 16; i++)
        snprintf(h.id + 2 * i, 3, "%02x", rnd[i]);
    if (write_all(sp->fd, &h, sizeof h, 0) != 0 || fsync(sp->fd) != 0) {
        snprintf(err, errcap, "spool %s: cannot write: %s", sp->path,
                 strerror(errno));
        return QG_EIO;
    }
    memcpy(sp->id, h.id, sizeof sp->id);
    sp->head = sp->end = HDR_SIZE;
    return QG_OK;
}

/* Read the record at `at` into *row: 1 whole, 0 cut short or damaged. */
static int read_rec(qg__spool *sp, off_t at, int64_t *seq,
                    qg_ledger_row *row)
{
    unsigned char b[REC_SIZE];
    rec_head h;
    uint64_t sum;
    ssize_t r = pread(sp->fd, b, REC_SIZE, at);
    if (r != (ssize_t)REC_SIZE)
        return 0;
    memcpy(&h, b, sizeof h);
    if (h.magic != REC_MAGIC || h.len != sizeof(qg_ledger_row))
        return 0;
    memcpy(&sum, b + sizeof h + sizeof *row, 8);
    if (XXH64(b + 8, 8 + sizeof *row, 0) != sum)
        return 0;
    *seq = h.seq;
    memcpy(row, b + sizeof h, sizeof *row);
    return 1;
}

static int grow_buf(qg__spool *sp, size_t need)
{
    unsigned char *b;
    if (need <= sp->bufcap)
        return 0;
    if (!(b = realloc(sp->buf, need)))
        return -1;
    sp->buf = b;
    sp->bufcap = need;
    return 0;
}

qg__spool *qg__spool_open(qg_ledger *l, const char *dir, char *err,
                          size_t errcap)
{
    qg__spool *sp = calloc(1, sizeof *sp);
    struct stat sb;
    int64_t applied = 0, seq = 0;
    uint64_t n = 0;
    qg_ledger_row row;
    off_t at;
    char why[512];
    int rc;

    if (!sp || !(sp->items = calloc((size_t)l->o.max_batch,
                                    sizeof *sp->items))) {
        snprintf(err, errcap, "spool: out of memory");
        goto fail;
    }
    sp->l = l;
    sp->fd = -1;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errcap, "spool %s: cannot create the folder: %s", dir,
                 strerror(errno));
        goto fail;
    }
    snprintf(sp->path, sizeof sp->path, "%s/ledger-spool", dir);
    if ((sp->fd = open(sp->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0 ||
        fstat(sp->fd, &sb) != 0) {
        snprintf(err, errcap, "spool %s: cannot open: %s", sp->path,
                 strerror(errno));
        goto fail;
    }
    if (sb.st_size < HDR_SIZE) {
        if (new_file(sp, err, errcap) != QG_OK || sync_dir(dir) != 0) {
            if (!err[0])
                snprintf(err, errcap, "spool %s: cannot sync its folder: %s",
                         sp->path, strerror(errno));
            goto fail;
        }
    } else {
        spool_hdr h;
        if (pread(sp->fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
            memcmp(h.magic, SPOOL_MAGIC, 8) != 0 || h.id[32] != '\0') {
            snprintf(err, errcap, "spool %s: not a quotagate spool (move it "
                     "away to start without it)", sp->path);
            goto fail;
        }
        if (h.row_size != sizeof(qg_ledger_row)) {
            snprintf(err, errcap, "spool %s: written by a build whose rows "
                     "are %u bytes (this one: %zu): let that build replay it "
                     "first", sp->path, h.row_size, sizeof(qg_ledger_row));
            goto fail;
        }
        memcpy(sp->id, h.id, sizeof sp->id);
        sp->head = HDR_SIZE;
        if ((rc = l->be->rows->spool_applied(l->b, sp->id, &applied)) !=
            QG_OK) {
            l->be->rows->last_read_error(l->b, why, sizeof why);
            snprintf(err, errcap, "spool %s: cannot read how far it was "
                     "replayed: %s", sp->path, why[0] ? why : qg_strerror(rc));
            goto fail;
        }
        /* find the end of the whole records, and the first unapplied */
        for (at = HDR_SIZE; read_rec(sp, at, &seq, &row); at += REC_SIZE) {
            if (seq <= applied)
                sp->head = at + (off_t)REC_SIZE;
            else
                n++;
        }
        sp->end = at;
        if (at < sb.st_size) {
            qg__lf_log(l, "spool %s: %lld bytes after the last whole record "
                       "cut off (a write that was never acknowledged)",
                       sp->path, (long long)(sb.st_size - at));
            if (ftruncate(sp->fd, at) != 0 || fsync(sp->fd) != 0) {
                snprintf(err, errcap, "spool %s: cannot cut off a torn "
                         "record: %s", sp->path, strerror(errno));
                goto fail;
            }
        }
    }
    sp->next_seq = (seq > applied ? seq : applied) + 1;
    atomic_store(&sp->pending, n);
    if (n > 0) {
        qg__lf_log(l, "spool %s: %llu rows of an earlier run wait; writing "
                   "them to the database before anything else", sp->path,
                   (unsigned long long)n);
        uint64_t done = 0;
        if ((rc = qg__spool_replay(sp, &done, why, sizeof why)) != QG_OK) {
            snprintf(err, errcap, "spool %s: %llu rows of an earlier run "
                     "cannot be written to the database (the counters "
                     "would miss them): %s", sp->path,
                     (unsigned long long)n, why);
            goto fail;
        }
    }
    return sp;
fail:
    qg__spool_close(sp);
    return NULL;
}

void qg__spool_close(qg__spool *sp)
{
    if (!sp)
        return;
    if (sp->fd >= 0)
        close(sp->fd);
    free(sp->items);
    free(sp->buf);
    free(sp);
}

uint64_t qg__spool_pending(const qg__spool *sp)
{
    return sp ? atomic_load_explicit(&((qg__spool *)sp)->pending,
                                     memory_order_relaxed)
              : 0;
}

int qg__spool_append(qg__spool *sp, qg__ledger_item *it, size_t n,
                     size_t *written, char *why, size_t whycap)
{
    size_t i, k = 0;
    unsigned char *p;
    if (grow_buf(sp, n * REC_SIZE) != 0) {
        snprintf(why, whycap, "spool %s: out of memory", sp->path);
        return QG_ENOMEM;
    }
    p = sp->buf;
    for (i = 0; i < n; i++) {
        rec_head h = { REC_MAGIC, (uint32_t)sizeof(qg_ledger_row), 0 };
        uint64_t sum;
        if (it[i].merged)        /* its settle is in the row it joined */
            continue;
        h.seq = sp->next_seq + (int64_t)k;
        memcpy(p, &h, sizeof h);
        memcpy(p + sizeof h, &it[i].row, sizeof it[i].row);
        sum = XXH64(p + 8, 8 + sizeof it[i].row, 0);
        memcpy(p + sizeof h + sizeof it[i].row, &sum, 8);
        it[i].seq = h.seq;
        p += REC_SIZE;
        k++;
    }
    if (write_all(sp->fd, sp->buf, k * REC_SIZE, sp->end) != 0 ||
        fdatasync(sp->fd) != 0) {
        int e = errno;
        if (ftruncate(sp->fd, sp->end) != 0) {
            /* what was written past end stays unacknowledged: cut at open */
        }
        snprintf(why, whycap, "spool %s: cannot write: %s", sp->path,
                 strerror(e));
        return QG_EIO;
    }
    sp->end += (off_t)(k * REC_SIZE);
    sp->next_seq += (int64_t)k;
    atomic_fetch_add(&sp->pending, (uint64_t)k);
    *written = k;
    return QG_OK;
}

int qg__spool_replay(qg__spool *sp, uint64_t *written, char *why,
                     size_t whycap)
{
    qg_ledger *l = sp->l;
    size_t max = (size_t)l->o.max_batch, refused = 0;
    while (sp->head < sp->end) {
        qg__spool_mark mark;
        size_t k = 0, i;
        off_t at = sp->head;
        int64_t seq = 0;
        int rc;
        while (k < max && at < sp->end) {
            qg__ledger_item *it = &sp->items[k];
            memset(it, 0, sizeof *it);
            if (!read_rec(sp, at, &seq, &it->row)) {
                snprintf(why, whycap, "spool %s: the record at byte %lld "
                         "cannot be read back", sp->path, (long long)at);
                return QG_EIO;
            }
            it->seq = seq;
            at += (off_t)REC_SIZE;
            k++;
        }
        qg__lf_coalesce(l, sp->items, k);
        mark.spool_id = sp->id;
        mark.seq = seq;
        why[0] = '\0';
        rc = l->be->rows->write_batch(l->b, sp->items, k, &mark, why,
                                      whycap);
        if (rc != QG_OK)
            return rc;
        for (i = 0; i < k; i++)
            refused += sp->items[i].refused != 0;
        sp->head = at;
        atomic_fetch_sub(&sp->pending, (uint64_t)k);
        *written += k;
    }
    if (refused)
        qg__lf_log(l, "spool %s: %zu replayed rows were already in the "
                   "database or their request id is another request's (a "
                   "commit whose answer was lost before the spool took its "
                   "rows); nothing was written twice", sp->path, refused);
    /* everything is in the database: start the file again */
    if (ftruncate(sp->fd, HDR_SIZE) != 0 || fsync(sp->fd) != 0) {
        snprintf(why, whycap, "spool %s: cannot reset: %s", sp->path,
                 strerror(errno));
        return QG_EIO;
    }
    sp->head = sp->end = HDR_SIZE;
    return QG_OK;
}
