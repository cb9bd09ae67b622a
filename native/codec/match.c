/* Block matching (heapcast/trace/blocks.py, docs/trace-format.md "How a heap is replayed"): which
 * acquisition produced the block that each release gives back. Python sorts the rows that the
 * first pass here makes (np.lexsort by address, position, kind); the second pass walks them in
 * that order. The numpy passes this replaced, a dozen gathers and scatters over every row, took
 * 4-5 s of a Python program's 13.6M events; these take a fraction of a second.
 * (native/stats/livemap.c matches a stream chunk by chunk in bounded memory, but pairs a late
 * realloc release with a shadowed block only within GHOST_SPAN seqs and counts double acquires
 * net of those: this is the exact whole-process matching it is checked against.) */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HC_API __attribute__((visibility("default")))

/* EVENT_DTYPE (heapcast/trace/format.py): the fields read here, by byte offset in a row. */
enum { SEQ = 0, ADDR = 16, OLD_ADDR = 24, SIZE = 32, FREE_LAG = 56, OP = 62 };
/* What an op is, in the caller's table of 256 (from heapcast.trace.format's op lists). */
enum { ALLOC = 1, REALLOC = 2, FREE = 4 };
enum { UNKNOWN = -1, NEVER = -1, INHERITED = -2 };

static inline uint64_t u64_at(const uint8_t *row, int off) {
    uint64_t v;
    memcpy(&v, row + off, 8);
    return v;
}

static inline uint32_t u32_at(const uint8_t *row, int off) {
    uint32_t v;
    memcpy(&v, row + off, 4);
    return v;
}

/* Pass 1. acquires/releases (n bytes each): whether each event acquires or releases a block
 * (`ops`: what each op code is, ALLOC | REALLOC | FREE). Rows (k inherited blocks, then the acquisitions, then the
 * releases, each in event order): address, position (inherited -1; acquisition its seq; a
 * release its seq, or for a realloc that moved, seq - free_lag), kind (1 acquires, 0 releases:
 * a release sorts first at one position), event (inherited: INHERITED - j). Returns the rows. */
HC_API uint64_t hc_match_rows(const uint8_t *ev, uint64_t n, uint64_t stride,
                              const uint8_t *ops, uint64_t k, const uint64_t *inherited,
                              uint8_t *acquires, uint8_t *releases, uint64_t *addr,
                              int64_t *pos, int8_t *kind, int64_t *event) {
    uint64_t nacq = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *r = ev + i * stride;
        unsigned what = ops[r[OP]];
        uint64_t a = u64_at(r, ADDR), old = u64_at(r, OLD_ADDR);
        acquires[i] = (what & ALLOC) && a != 0;
        releases[i] = old != 0 && ((what & FREE) ||
                                   ((what & REALLOC) && (a != 0 || u64_at(r, SIZE) == 0)));
        nacq += acquires[i];
    }
    for (uint64_t j = 0; j < k; j++) {
        addr[j] = inherited[j];
        pos[j] = -1;
        kind[j] = 1;
        event[j] = INHERITED - (int64_t)j;
    }
    uint64_t ia = k, ir = k + nacq;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *r = ev + i * stride;
        int64_t seq = (int64_t)u64_at(r, SEQ);
        if (acquires[i]) {
            addr[ia] = u64_at(r, ADDR);
            pos[ia] = seq;
            kind[ia] = 1;
            event[ia++] = (int64_t)i;
        }
        if (releases[i]) {
            uint64_t old = u64_at(r, OLD_ADDR);
            int moved = u64_at(r, ADDR) != old && !(ops[r[OP]] & FREE);
            addr[ir] = old;
            pos[ir] = seq - (moved ? (int64_t)u32_at(r, FREE_LAG) : 0);
            kind[ir] = 0;
            event[ir++] = (int64_t)i;
        }
    }
    return ir;
}

/* Pass 2, over the rows in `order` (sorted by address, position, kind): a release matches the
 * row before it when that row acquired the same address; an acquisition right after one of the
 * same address is a double acquisition. Fills alloc_of (UNKNOWN where unmatched, INHERITED for an
 * inherited block), release_of (NEVER where never released), released_size (the block's size:
 * its acquisition's `size`, or inherited_sizes[j], or 0) and inherited_release_of, all
 * pre-filled by the caller; counts[0] the unmatched releases, counts[1] the double acquisitions.
 * Returns 0, or -1 for an event or row index out of range (a caller's bug). */
HC_API int hc_match_pass(const uint64_t *addr, const int8_t *kind, const int64_t *event,
                         const int64_t *order, uint64_t m, const uint8_t *ev, uint64_t n,
                         uint64_t stride, uint64_t k, const uint64_t *inherited_sizes,
                         int64_t *alloc_of, int64_t *release_of, uint64_t *released_size,
                         int64_t *inherited_release_of, int64_t *counts) {
    int64_t unknown = 0, doubles = 0;
    for (uint64_t i = 0; i < m; i++) {
        uint64_t r = (uint64_t)order[i];
        if (r >= m) return -1;
        int64_t e = event[r];
        int prev_acq = 0;
        int64_t p = UNKNOWN;
        if (i) {
            uint64_t q = (uint64_t)order[i - 1];
            prev_acq = addr[q] == addr[r] && kind[q] == 1;
            p = event[q];
        }
        if (kind[r] == 1) {
            doubles += prev_acq;
            continue;
        }
        if ((uint64_t)e >= n) return -1;
        if (!prev_acq) {
            unknown++;
        } else if (p >= 0) {
            if ((uint64_t)p >= n) return -1;
            alloc_of[e] = p;
            release_of[p] = e;
            released_size[e] = u64_at(ev + (uint64_t)p * stride, SIZE);
        } else {
            uint64_t j = (uint64_t)(INHERITED - p);
            if (j >= k) return -1;
            alloc_of[e] = INHERITED;
            inherited_release_of[j] = e;
            if (inherited_sizes) released_size[e] = inherited_sizes[j];
        }
    }
    counts[0] = unknown;
    counts[1] = doubles;
    return 0;
}
