/* livemap: block matching for `heapcast stats` and `heapcast report`, one chunk of events at a
 * time, with memory bounded by the live blocks (heapcast.stats.matching).
 *
 * The live map is an open-addressing hash table keyed by address (linear probing, backward-shift
 * deletion, grown at half load). Events are matched in seq order, each release before the
 * acquisition of the same event, giving exactly heap.match's pairing (a release pairs with the
 * block last acquired at its address; a second acquisition of a live address, a double acquire,
 * shadows the first, which is never released). A moved realloc's release is positioned at
 * seq - free_lag: if its address was acquired again since then, it pairs with the block that
 * acquisition shadowed (a "ghost", kept GHOST_SPAN seqs), as heap.match's sort orders it.
 * Plain C11, no allocation but the table's and the ghosts' arrays; loaded with ctypes. */
#define _DEFAULT_SOURCE   /* MAP_ANONYMOUS, madvise */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define EXPORT __attribute__((visibility("default")))
#define GHOST_SPAN (1 << 16)

enum { OP_MALLOC, OP_CALLOC, OP_REALLOC, OP_REALLOCARRAY, OP_POSIX_MEMALIGN, OP_ALIGNED_ALLOC,
       OP_MEMALIGN, OP_VALLOC, OP_PVALLOC, OP_FREE };

/* One event as numpy's heapcast.EVENT_DTYPE lays it out (64 bytes). */
typedef struct {
    uint64_t seq, ts, addr, old_addr, size, arg;
    uint32_t loc, tid, free_lag;
    uint16_t proc;
    uint8_t op, flags;
} event_t;
_Static_assert(sizeof(event_t) == 64, "EVENT_DTYPE is 64 bytes");

/* A block: heapcast.stats.matching.BLOCK_DTYPE (64 bytes). loc -1: inherited at a fork. */
typedef struct {
    uint64_t addr;
    int64_t pos;       /* acquisition seq (-1: inherited) */
    uint64_t size, ts;
    int64_t index;     /* event index in its process */
    int64_t ordinal;   /* acquisition ordinal in its process */
    int64_t loc;
    int64_t limit;     /* ghosts: seq of the acquisition that shadowed it */
} block_t;
_Static_assert(sizeof(block_t) == 64, "BLOCK_DTYPE is 64 bytes");

typedef struct {
    block_t *slots;     /* addr 0: empty */
    size_t cap, count;  /* cap: a power of two */
    block_t *ghosts;
    size_t nghosts, ghost_cap;
} livemap_t;

/* Per-chunk results, arrays sized by the caller (n events). */
typedef struct {
    uint64_t *released_size;   /* [n] bytes each event released (0: none) */
    int64_t *src;              /* [n] per event: index into `matched` of the block it released, else -1 */
    block_t *matched;          /* [n] blocks released, in event order */
    block_t *shadowed;         /* [n] blocks shadowed by a double acquire (never released) */
    block_t *revived;          /* [n] ghosts released after all (their double acquire undone) */
    int64_t nmatched, nshadowed, nrevived, unknown, doubles;
} result_t;

static uint64_t hash(uint64_t a) {
    a ^= a >> 33; a *= 0xff51afd7ed558ccdULL; a ^= a >> 33;
    return a;
}

/* Zeroed room for cap slots, on huge pages where the kernel gives them: a program's live blocks
 * fill hundreds of MB, looked up at random, and with 4 KiB pages nearly every lookup also missed
 * the TLB (matching the main job's trace 1.9-2.2 -> 1.4-2.0 s). The mapping also puts each slot
 * on a cache line of its own, which alone measured no gain. (encode.c's map_huge does the same
 * for the codec's table, rounded to whole huge pages.) */
static block_t *slots_new(size_t cap) {
    size_t bytes = cap * sizeof(block_t);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);   /* (a hint) */
#endif
    return p;
}

static void slots_free(block_t *slots, size_t cap) {
    if (slots) munmap(slots, cap * sizeof *slots);
}

static int grow(livemap_t *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    block_t *slots = slots_new(cap);
    if (!slots) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].addr) continue;
        size_t j = hash(m->slots[i].addr) & (cap - 1);
        while (slots[j].addr) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    slots_free(m->slots, m->cap);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

static block_t *find(livemap_t *m, uint64_t addr) {
    if (!m->cap) return NULL;
    for (size_t j = hash(addr) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        if (m->slots[j].addr == addr) return &m->slots[j];
        if (!m->slots[j].addr) return NULL;
    }
}

static int insert(livemap_t *m, const block_t *b) {   /* addr must not be in the map */
    if ((m->count + 1) * 2 > m->cap && grow(m)) return -1;
    size_t j = hash(b->addr) & (m->cap - 1);
    while (m->slots[j].addr) j = (j + 1) & (m->cap - 1);
    m->slots[j] = *b;
    m->count++;
    return 0;
}

static void erase(livemap_t *m, block_t *b) {          /* backward-shift deletion */
    size_t mask = m->cap - 1, i = (size_t)(b - m->slots), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->slots[j].addr) break;
        size_t home = hash(m->slots[j].addr) & mask;
        /* Move slot j into the hole at i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].addr = 0;
    m->count--;
}

static int add_ghost(livemap_t *m, const block_t *b) {
    if (m->nghosts == m->ghost_cap) {
        size_t cap = m->ghost_cap ? m->ghost_cap * 2 : 64;
        block_t *g = realloc(m->ghosts, cap * sizeof *g);
        if (!g) return -1;
        m->ghosts = g;
        m->ghost_cap = cap;
    }
    m->ghosts[m->nghosts++] = *b;
    return 0;
}

EXPORT livemap_t *hc_livemap_new(const block_t *blocks, int64_t n) {
    livemap_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (!blocks[i].addr || find(m, blocks[i].addr)) continue;
        if (insert(m, &blocks[i])) { slots_free(m->slots, m->cap); free(m); return NULL; }
    }
    return m;
}

EXPORT void hc_livemap_free(livemap_t *m) {
    if (!m) return;
    slots_free(m->slots, m->cap);
    free(m->ghosts);
    free(m);
}

EXPORT int64_t hc_livemap_count(const livemap_t *m) { return (int64_t)m->count; }
EXPORT int64_t hc_livemap_ghosts(const livemap_t *m) { return (int64_t)m->nghosts; }

/* Copies the live blocks into out[count] (any order). */
EXPORT void hc_livemap_export(const livemap_t *m, block_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].addr) out[k++] = m->slots[i];
}

static int is_acquire(const event_t *e) {
    return e->op <= OP_PVALLOC && e->addr != 0;
}

static int is_release(const event_t *e) {
    if (e->op == OP_FREE) return e->old_addr != 0;
    if (e->op == OP_REALLOC || e->op == OP_REALLOCARRAY)
        return e->old_addr != 0 && (e->addr != 0 || e->size == 0);
    return 0;
}

/* The slot where the address that event e releases or acquires would be found, fetched into
 * the cache ahead of its turn: a table of a program's live blocks (64 bytes each, at most half
 * full) is far larger than the caches, and each event's lookup was a miss waited for. */
#define PREFETCH_AHEAD 16
static inline void prefetch_event(const livemap_t *m, const event_t *e) {
    if (!m->cap) return;
    const uint64_t a = e->op == OP_FREE ? e->old_addr : e->addr;
    __builtin_prefetch(&m->slots[hash(a) & (m->cap - 1)]);
}

/* Matches n events (seq order): event i has index first_index + i in its process; the chunk's
 * first acquisition has ordinal first_ordinal. Returns 0, or -1 when out of memory. */
EXPORT int hc_livemap_match(livemap_t *m, const event_t *ev, int64_t n, int64_t first_index,
                            int64_t first_ordinal, result_t *r) {
    int64_t ordinal = first_ordinal;
    r->nmatched = r->nshadowed = r->nrevived = r->unknown = r->doubles = 0;
    for (int64_t i = 0; i < n; i++) {
        const event_t *e = &ev[i];
        if (i + PREFETCH_AHEAD < n) prefetch_event(m, &ev[i + PREFETCH_AHEAD]);
        r->released_size[i] = 0;
        r->src[i] = -1;
        if (is_release(e)) {
            int moved = e->addr != e->old_addr && e->op != OP_FREE;
            int64_t pos = (int64_t)e->seq - (moved ? (int64_t)e->free_lag : 0);
            block_t *b = find(m, e->old_addr);
            if (b && b->pos < pos) {
                r->matched[r->nmatched] = *b;
                r->released_size[i] = b->size;
                r->src[i] = r->nmatched++;
                erase(m, b);
            } else {
                /* Released before its address was acquired again: the block that acquisition
                 * shadowed, if it was acquired before this release's position. */
                size_t g = m->nghosts;
                if (pos < (int64_t)e->seq)
                    for (size_t k = 0; k < m->nghosts; k++)
                        if (m->ghosts[k].addr == e->old_addr && m->ghosts[k].pos < pos
                            && pos < m->ghosts[k].limit && (g == m->nghosts
                                                            || m->ghosts[k].pos > m->ghosts[g].pos))
                            g = k;
                if (g < m->nghosts) {
                    r->matched[r->nmatched] = m->ghosts[g];
                    r->revived[r->nrevived++] = m->ghosts[g];
                    r->released_size[i] = m->ghosts[g].size;
                    r->src[i] = r->nmatched++;
                    r->doubles--;
                    m->ghosts[g] = m->ghosts[--m->nghosts];
                } else {
                    r->unknown++;
                }
            }
        }
        if (is_acquire(e)) {
            block_t nb = {e->addr, (int64_t)e->seq, e->size, e->ts, first_index + i, ordinal++,
                          (int64_t)e->loc, 0};
            block_t *old = find(m, e->addr);
            if (old) {
                old->limit = (int64_t)e->seq;
                r->shadowed[r->nshadowed++] = *old;
                r->doubles++;
                if (add_ghost(m, old)) return -1;
                *old = nb;       /* same address, same slot */
            } else if (insert(m, &nb)) {
                return -1;
            }
        }
    }
    /* Ghosts expire GHOST_SPAN seqs after the acquisition that shadowed them. */
    if (n && m->nghosts) {
        int64_t horizon = (int64_t)ev[n - 1].seq - GHOST_SPAN;
        size_t k = 0;
        for (size_t j = 0; j < m->nghosts; j++)
            if (m->ghosts[j].limit >= horizon) m->ghosts[k++] = m->ghosts[j];
        m->nghosts = k;
    }
    return 0;
}
