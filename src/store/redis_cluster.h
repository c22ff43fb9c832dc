/* redis_cluster.h - Redis Cluster's routing as data: the hash slot of a
 * key, the slot map a CLUSTER SLOTS reply describes, and the redirections
 * (MOVED, ASK) and transient errors a node answers with.
 *
 * Pure: no I/O, no clock, no allocation but the map's own node list, so
 * every part is tested alone (tests/unit/test_redis_link.c compares the
 * slots with a real node's CLUSTER KEYSLOT).  The link (redis_link.c)
 * does the talking and keeps its own copy of the map.
 *
 * A reply is hiredis's redisReply (a parsed RESP value, no connection). */
#ifndef QG_REDIS_CLUSTER_H
#define QG_REDIS_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#define QG__RC_SLOTS 16384           /* hash slots of a Redis Cluster */
#define QG__RC_HOST_MAX 256          /* bytes of a node's host, with NUL */
#define QG__RC_NODES_MAX 1000        /* masters in one map: Redis's own
                                      * recommended ceiling */
#define QG__RC_NONE 0xffffu          /* a slot no master serves */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no reflection,
 * no final xor), the checksum Redis Cluster hashes keys with;
 * qg__rc_crc16("123456789", 9) == 0x31c3. */
unsigned qg__rc_crc16(const void *buf, size_t len);

/* The hash slot (0..16383) of key[0..len), as Redis computes it: when the
 * key holds a '{' followed later by a '}' with at least one byte between
 * the first '{' and the first '}' after it, only those bytes are hashed
 * (the hash tag); otherwise the whole key.  "{}x" hashes whole, "{{a}}"
 * hashes "{a", "a{b}{c}" hashes "b". */
unsigned qg__rc_slot(const char *key, size_t len);

/* A short hash tag whose slot is `slot`: the first string of 1 to 3
 * letters and digits (in a fixed order) that hashes there, written
 * NUL-terminated into out (cap >= 4).  A key "x{TAG}y" then lives in that
 * slot, e.g. a per-node key in a slot that node serves.  Returns its
 * length, or -1 when slot is out of range or cap too small. */
int qg__rc_tag_for_slot(unsigned slot, char *out, size_t cap);

/* One master of a map. */
typedef struct qg__rc_node {
    char host[QG__RC_HOST_MAX];
    int port;
    unsigned first_slot;       /* the lowest slot it serves */
    unsigned nslots;           /* how many it serves */
} qg__rc_node;

/* A slot map: which master serves each slot. */
typedef struct qg__rc_map {
    qg__rc_node *node;         /* nnodes masters, owned (qg__rc_map_free) */
    int nnodes;
    unsigned covered;          /* slots with a master */
    uint16_t slot[QG__RC_SLOTS]; /* index into node[], or QG__RC_NONE */
} qg__rc_map;

/* An empty map (every slot QG__RC_NONE, no node). */
void qg__rc_map_init(qg__rc_map *m);
/* Frees the node list; the map is empty again. */
void qg__rc_map_free(qg__rc_map *m);

/* Read a CLUSTER SLOTS reply into *out (initialised by the call; free it
 * with qg__rc_map_free, also after a failure).  The reply is an array of
 * ranges [start, end, master, replica...], each node [host, port, id,
 * metadata...]; only masters are kept, each once however many ranges it
 * serves.  A master whose host is empty or nil is reachable where the
 * reply came from: asked_host is used (Redis's rule for an unknown
 * endpoint); a host of "?" (no usable endpoint) leaves its ranges
 * unserved.  Ranges must lie within 0..16383, start <= end, and not
 * overlap.  Returns 0, QG_EINVAL with the reason in err (a phrase) for a
 * malformed reply, or QG_ENOMEM. */
int qg__rc_parse_slots(const redisReply *r, const char *asked_host,
                       qg__rc_map *out, char *err, size_t errcap);

/* What an error reply asks of a cluster client. */
typedef enum qg__rc_kind {
    QG__RC_ERROR = 0,          /* a real error: the caller's answer */
    QG__RC_MOVED,              /* "MOVED slot host:port": the slot's new home */
    QG__RC_ASK,                /* "ASK slot host:port": this once, there */
    QG__RC_TRYAGAIN,           /* multi-key command during a migration */
    QG__RC_CLUSTERDOWN,        /* the cluster (or this slot) is down for now */
    QG__RC_LOADING             /* the node is loading its data set */
} qg__rc_kind;

/* A redirection read from an error reply. */
typedef struct qg__rc_redirect {
    qg__rc_kind kind;          /* QG__RC_MOVED or QG__RC_ASK */
    unsigned slot;
    char host[QG__RC_HOST_MAX]; /* "" when the node gave no endpoint: the
                                 * host of the node that answered */
    int port;
} qg__rc_redirect;

/* The kind of the error text s[0..len) (a REDIS_REPLY_ERROR's str). */
qg__rc_kind qg__rc_error_kind(const char *s, size_t len);

/* Parse "MOVED <slot> <host>:<port>" or "ASK ..." (an IPv6 host is split
 * at its last ':').  Returns 0 and fills *out, or -1 when s is not a
 * well-formed redirection (then it is a real error). */
int qg__rc_parse_redirect(const char *s, size_t len, qg__rc_redirect *out);

#endif
