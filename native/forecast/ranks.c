/* Counting for the forecasting features (heapcast.forecast.features.free_ranks): a freed block's
 * recency rank among the live blocks of its group (all, its call site, or its size class).
 *
 * One pass over a process's events in order, a Fenwick tree per group: O(n log n). It replaced
 * a count of dominance between the releases and the acquisitions (for all blocks) and, within
 * groups, numpy's sorts of every item by group; the O(n log^2 n) numpy version before those
 * took 11 s of `heapcast train`'s 28 s of feature extraction on a Python program's 13.6M
 * events. */
#include <stdint.h>
#include <stdlib.h>

#define HC_API __attribute__((visibility("default")))

enum { OK = 0, ERR_NOMEM = -1, ERR_RANGE = -3 };

/* ---- recency ranks within groups, in one pass over the events
 *
 * A freed block's rank among the live blocks of its group (call site, size class, or one group
 * for all) is the number of that group's live blocks acquired after it. Each group numbers its
 * acquisitions in event order and keeps a Fenwick tree over those numbers (1: live); a release
 * asks its tree how many live blocks come after its own. numpy had sorted every acquisition and
 * release by group (two stable argsorts of twice the events), then counted dominance over the
 * sorted items: 2.8 s a grouping on a Python program's 13.6M events. */

/* Dense ids of the group keys (open addressing; keys are any 64-bit values). */
typedef struct { uint64_t key; uint32_t id, used; } gslot;

static uint32_t group_id(gslot *t, uint64_t mask, uint64_t key, uint32_t *ngroups) {
    uint64_t h = (key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull;
    for (h >>= 20;; h++) {
        gslot *s = &t[h & mask];
        if (!s->used) {
            s->used = 1;
            s->key = key;
            s->id = (*ngroups)++;
            return s->id;
        }
        if (s->key == key) return s->id;
    }
}

/* How many acquisitions group g has: its tree's size. */
static inline uint64_t group_size(const uint64_t *base, uint32_t g, uint32_t ngroups,
                                  uint64_t nacq) {
    return (g + 1 < ngroups ? base[g + 1] : nacq) - base[g];
}

/* Events 0..n-1 in order: where rel[i] and alloc_of[i] >= 0, event i releases the block that
 * event alloc_of[i] acquired (an earlier event whose acq is set), which leaves its group's live
 * blocks; then, where acq[i], event i acquires a block of group key[i]. For each event with
 * want[i] that releases a block: rank[i] = the live blocks of its group acquired after it and
 * live[i] = its group's live blocks, the freed one included, just before the release (other
 * events' entries are left as they are). Returns OK, ERR_RANGE where a release names no earlier
 * acquisition (nothing written then), or ERR_NOMEM. */
HC_API int hc_group_ranks(const uint8_t *acq, const uint8_t *rel, const int64_t *alloc_of,
                          const int64_t *key, const uint8_t *want, uint64_t n, int32_t *rank,
                          int32_t *live) {
    if (n >= INT32_MAX) return ERR_RANGE;
    for (uint64_t i = 0; i < n; i++)
        if (rel[i] && alloc_of[i] >= 0 && ((uint64_t)alloc_of[i] >= i || !acq[alloc_of[i]]))
            return ERR_RANGE;
    uint64_t nacq = 0;
    for (uint64_t i = 0; i < n; i++) nacq += acq[i] != 0;
    uint64_t cap = 16;
    while (cap < 2 * nacq) cap *= 2;
    gslot *table = calloc(cap, sizeof *table);
    uint32_t *gid = malloc((n ? n : 1) * sizeof *gid);   /* of acquisitions: group, number */
    uint32_t *num = malloc((n ? n : 1) * sizeof *num);
    uint32_t *count = calloc(nacq + 1, sizeof *count);   /* per group (at most one a block) */
    uint64_t *base = malloc((nacq + 1) * sizeof *base);
    int32_t *tree = calloc(nacq + 1, sizeof *tree);
    int rc = ERR_NOMEM;
    if (!table || !gid || !num || !count || !base || !tree) goto out;
    uint32_t ngroups = 0;
    for (uint64_t i = 0; i < n; i++)
        if (acq[i]) {
            uint32_t g = group_id(table, cap - 1, key ? (uint64_t)key[i] : 0, &ngroups);
            gid[i] = g;
            num[i] = ++count[g];   /* 1-based: its position in the group's tree */
        }
    /* group g's tree: positions 1..count[g] at tree[base[g] + k] */
    for (uint64_t g = 0, at = 0; g < ngroups; at += count[g], g++) base[g] = at;
    for (uint32_t g = 0; g < ngroups; g++) count[g] = 0;   /* now: its live blocks */
    for (uint64_t i = 0; i < n; i++) {
        if (rel[i] && alloc_of[i] >= 0) {
            uint64_t a = (uint64_t)alloc_of[i];
            uint32_t g = gid[a];
            int32_t *t = tree + base[g];
            if (want[i]) {
                int64_t upto = 0;   /* live blocks of the group numbered <= the freed one's */
                for (uint64_t k = num[a]; k; k -= k & -k) upto += t[k];
                rank[i] = (int32_t)(count[g] - upto);
                live[i] = (int32_t)count[g];
            }
            for (uint64_t k = num[a], size = group_size(base, g, ngroups, nacq); k <= size;
                 k += k & -k)
                t[k]--;
            count[g]--;
        }
        if (acq[i]) {
            uint32_t g = gid[i];
            int32_t *t = tree + base[g];
            for (uint64_t k = num[i], size = group_size(base, g, ngroups, nacq); k <= size;
                 k += k & -k)
                t[k]++;
            count[g]++;
        }
    }
    rc = OK;
out:
    free(table); free(gid); free(num); free(count); free(base); free(tree);
    return rc;
}
