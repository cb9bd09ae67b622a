/* heapcast's packing allocator (HEAPCAST_ALLOC_BACKEND=pack; `heapcast run --backend pack`).
 *
 * Why: on the corpus neither glibc nor mimalloc is best everywhere. mimalloc's size classes are
 * 12.5% apart and it keeps per-page free lists and resident pages, so it holds 8-19% more than
 * glibc on sqlite3 and jq; glibc fragments (only the top of its heap is trimmed, a 32-byte
 * minimum chunk) and loses on make and python. This packer takes glibc's fine granularity and
 * mimalloc's segregation, and gives free pages back page by page:
 *
 * - Size classes: every multiple of 16 up to 8 KiB (a 0..16-byte request takes 16: every block
 *   is 16-byte aligned, glibc's guarantee), then 32 classes per power of two (<= 3.1% apart) up
 *   to PACK_MAX (256 KiB). No per-block header: a block's size is its span's class. Measured:
 *   classes every 16 bytes only to 1 KiB and 8 per doubling above cost sqlite3 4.5 MiB (its
 *   1032- and 4368-byte blocks took 1152 and 4608) and tclsh 0.7 MiB.
 * - One region, reserved once (mmap MAP_NORESERVE, 32 GiB of address space, nothing committed:
 *   pages become resident when first written), cut into units of 2^HEAPCAST_PACK_SPAN bytes
 *   (default 64 KiB; 32 and 128 KiB measured within 0.5% on every program). "Is this pointer
 *   mine" is a range check; a unit's metadata lives in side tables indexed by (p - base) >> shift
 *   (also NORESERVE, touched only for units in use). The region is mapped read-write rather than
 *   PROT_NONE + mprotect per span: the kernel commits nothing until a page is written either
 *   way, and mprotect would split the mapping into one VMA per span.
 * - A span is 1 unit for small classes, more (a power of two) so that it holds >= 8 blocks of
 *   larger ones. Spans belong to one (lifetime group, class): blocks of different groups never
 *   share a span. Free blocks: a bitmap per span (1 = free, sized to the span's blocks),
 *   allocation takes the lowest free block, so the low pages of a span fill first, its high
 *   pages drain, and pages never reached are never resident.
 * - Which span: spans of a class are kept in PACK_NB lists by fullness (live / blocks in eighths);
 *   allocation takes a span from the fullest non-full list, so allocations pack into few spans
 *   and the emptier ones drain.
 * - Pages back to the kernel: when a free leaves every block overlapping a page free, the page
 *   becomes "dirty" (free but resident), queued per class, oldest first. When the dirty pages of
 *   all classes exceed HEAPCAST_PACK_DIRTY bytes (default 256 KiB), a sweep gives the oldest
 *   back (madvise MADV_DONTNEED), sparing pages dirtied since the previous sweep (see sweep()).
 *   The budget is what this costs at the peak: 1 MiB held jq 0.8 MiB higher; 0 (every page at
 *   once) took make 1.6x glibc's time. A span that becomes empty stays with its class while the
 *   class has at most HEAPCAST_PACK_EMPTY (default 1) empty spans; beyond that it is given back
 *   whole (one madvise) to a region pool of clean spans any class can take.
 * - Blocks over PACK_MAX: a mapping each (mremap on realloc). Left to mimalloc, its freed large
 *   pages stayed resident: python peaked 5.7 MiB higher. At free a few are kept for the next big
 *   request, and given back as soon as the heap grows (see "blocks over PACK_MAX").
 * - Threads: a per-thread cache of free small blocks (see "the thread cache"), one mutex per
 *   (group, class) and one for the region; a free takes the lock of the block's class (found
 *   from the span), so cross-thread frees need nothing more. fork: the prepare handler takes
 *   every lock, parent and child release them.
 * - Never calls malloc: metadata is mmap'd.
 *
 * bench/alloc_pack.py measures it; docs/allocator.md ("The packing backend") has the figures. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "alloc.h"
#include "pack.h"
#include "pack_params.h"

_Static_assert(PACK_GROUPS == HA_HEAPS, "one packer group per heap index");
_Static_assert(PACK_MAX == (size_t)1 << PACK_MAX_LOG, "pack.h and pack_params.h disagree");

#define PAGE_SHIFT 12
#define PAGE ((size_t)1 << PAGE_SHIFT)
#define REGION ((size_t)32 << 30)
#define MIN_BLOCK 16                     /* every block is 16-byte aligned (glibc's guarantee) */
#define NCLASSES ((1 << (PACK_FINE_LOG - 3)) + ((PACK_MAX_LOG - 8) << PACK_STEPS_LOG))
#define L_EMPTY PACK_NB                       /* the list of empty spans */
#define L_FULL (PACK_NB + 1)                  /* full spans are in no list */

typedef struct {              /* per unit */
    uint32_t head;            /* the unit index of its span's first unit */
    uint16_t cls;             /* its span's class and group, as in span_meta: free() reads */
    uint8_t group;            /* them here, a dependent load fewer than through the span */
    uint32_t dnext, dprev;    /* the class's dirty-unit queue (unit index + 1; 0: none) */
    uint32_t epoch;           /* the sweep count when its first dirty page came */
    uint64_t dirty;           /* its pages that are free and resident, one bit per page */
} unit_meta;

typedef struct {              /* per span, at its first unit's index */
    uint32_t size, nblocks, live, hint;   /* hint: no free block below word `hint` */
    uint32_t next, prev;                  /* its class list (unit index + 1; 0: none) */
    uint16_t cls;
    uint8_t group, nlog;                  /* nlog: log2 of its units */
    uint8_t list;                         /* 0..PACK_NB-1, L_EMPTY or L_FULL */
    uint8_t bmk;                          /* its bitmap's chunks */
    uint32_t bm;                          /* its bitmap's first chunk + 1 */
} span_meta;

typedef struct {              /* zero-initialized: glibc's PTHREAD_MUTEX_INITIALIZER is zeros */
    pthread_mutex_t lock;
    uint32_t list[PACK_NB + 1];    /* heads (unit index + 1): fullness lists, then empty spans */
    uint32_t nempty;
    uint32_t dhead, dtail;    /* units with dirty pages, oldest first */
    size_t dirty;             /* bytes of dirty pages */
} __attribute__((aligned(64))) pack_class;

uintptr_t pack_lo, pack_hi;

static unsigned ushift;            /* unit = 1 << ushift bytes */
static unsigned upages_shift;      /* ushift - PAGE_SHIFT */
static unsigned bwords;            /* the most bitmap words a span needs: (unit / 16) bits */
static uint32_t nunits;
static unit_meta *units;
static span_meta *spans;
/* Span bitmaps, in chunks of BM_CHUNK words (512 blocks): a span takes as many as its blocks
 * need (a unit of 16-byte blocks 8, of blocks >= 128 bytes 1) rather than a fixed slot per unit,
 * which held 512 bytes per 64 KiB unit (0.8% of the heap) whatever the class. */
#define BM_CHUNK 8
static uint64_t *bitmaps;
static uint32_t bm_top, bm_limit;           /* chunks handed out, chunks reserved */
static uint32_t bm_free[65];                /* freed runs by length (first chunk + 1) */
static size_t dirty_budget = PACK_DIRTY_BUDGET;
static _Atomic size_t dirty_total;          /* bytes of dirty pages, every class */
static _Atomic int sweeping;
static size_t n_release_calls, n_retire_calls;   /* HEAPCAST_PACK_DEBUG (racy) */
static _Atomic uint64_t returned[PACK_GROUPS];   /* pages given back, per group (--log) */
static _Atomic uint32_t sweep_epoch;        /* sweeps so far */
static _Atomic size_t sweep_at;             /* the next sweep: dirty_total above this */
static uint32_t keep_empty = PACK_KEEP_EMPTY;
static unsigned fine_log = PACK_FINE_LOG;   /* classes every 16 bytes up to 2^fine_log (8 KiB) */
/* HEAPCAST_PACK_GRAIN=8 (`heapcast run --align 8`): fine classes every 8 bytes, so that a block
 * whose size is not a multiple of 16 is only 8-byte aligned, as mimalloc's 24-, 40- and 56-byte
 * blocks are: not glibc's guarantee (16 for every block), opt-in. Requests for an alignment
 * still get it (pack_alloc skips to a class that gives it). */
static unsigned grain_log = 4;
static size_t min_block = MIN_BLOCK;    /* 8 with GRAIN=8: requests of <= 8 bytes take 8 */
static unsigned nfine;             /* their number */
static unsigned steps_log = PACK_STEPS_LOG;   /* 2^steps_log classes per doubling above (32: <= 3.1% apart) */
static unsigned nclasses;
static uint32_t class_size[NCLASSES];
static uint8_t class_nlog[NCLASSES];
static pack_class classes[PACK_GROUPS][NCLASSES];

/* Which classes hold dirty pages (bit g * NCLASSES + class): sweeps visit those only. */
#define NCLASS_WORDS ((PACK_GROUPS * NCLASSES + 63) / 64)
static _Atomic uint64_t dirty_classes[NCLASS_WORDS];

static inline unsigned class_index(const pack_class *c) {
    return (unsigned)(c - (const pack_class *)classes);
}

static pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t region_top;                 /* units handed out so far */
static uint32_t pool[PACK_MAX_NLOG + 1];         /* clean free spans by nlog (unit index + 1) */

/* ---- size classes ---- */

static inline unsigned class_of(size_t size) {
    if (size <= ((size_t)1 << fine_log))
        return (unsigned)(((size < min_block ? min_block : size) + ((size_t)1 << grain_log) - 1)
                          >> grain_log) - 1;
    unsigned e = 63 - (unsigned)__builtin_clzll(size - 1);      /* 2^e < size <= 2^(e+1) */
    unsigned sh = e - steps_log;                                 /* step = 2^sh */
    unsigned k = (unsigned)((size - ((size_t)1 << e) + ((size_t)1 << sh) - 1) >> sh);
    return nfine + ((e - fine_log) << steps_log) + k - 1;        /* k: 1..2^steps_log */
}

static void init_classes(void) {
    nfine = 1u << (fine_log - grain_log);
    nclasses = nfine + ((PACK_MAX_LOG - fine_log) << steps_log);
    for (unsigned c = 0; c < nclasses; c++) {
        size_t size;
        if (c < nfine) {
            size = (size_t)(c + 1) << grain_log;
        } else {
            unsigned e = fine_log + ((c - nfine) >> steps_log);
            unsigned k = ((c - nfine) & ((1u << steps_log) - 1)) + 1;
            size = ((size_t)1 << e) + ((size_t)k << (e - steps_log));
        }
        class_size[c] = (uint32_t)size;
        unsigned nlog = 0;
        while (nlog < PACK_MAX_NLOG && (((size_t)1 << (ushift + nlog)) / size) < PACK_MIN_SPAN_BLOCKS)
            nlog++;
        class_nlog[c] = (uint8_t)nlog;
    }
}

/* ---- span lists (indices + 1, 0 = none) ---- */

static inline span_meta *S(uint32_t h1) { return &spans[h1 - 1]; }

static void list_push(pack_class *c, unsigned l, uint32_t h1) {
    span_meta *s = S(h1);
    s->list = (uint8_t)l;
    if (l == L_FULL)
        return;
    s->prev = 0;
    s->next = c->list[l];
    if (s->next)
        S(s->next)->prev = h1;
    c->list[l] = h1;
}

static void list_remove(pack_class *c, uint32_t h1) {
    span_meta *s = S(h1);
    if (s->list == L_FULL)
        return;
    if (s->prev)
        S(s->prev)->next = s->next;
    else
        c->list[s->list] = s->next;
    if (s->next)
        S(s->next)->prev = s->prev;
}

static inline unsigned list_for(const span_meta *s) {
    if (s->live == 0)
        return L_EMPTY;
    if (s->live == s->nblocks)
        return L_FULL;
    return (unsigned)((uint64_t)s->live * PACK_NB / s->nblocks);
}

static inline void relist(pack_class *c, uint32_t h1) {
    unsigned l = list_for(S(h1));
    if (l != S(h1)->list) {
        list_remove(c, h1);
        list_push(c, l, h1);
    }
}

/* ---- dirty pages ---- */

static void dirty_link(pack_class *c, uint32_t u) {
    unit_meta *m = &units[u];
    m->epoch = atomic_load_explicit(&sweep_epoch, memory_order_relaxed);
    m->dnext = 0;
    m->dprev = c->dtail;
    if (c->dtail) {
        units[c->dtail - 1].dnext = u + 1;
    } else {
        c->dhead = u + 1;
        unsigned i = class_index(c);
        atomic_fetch_or_explicit(&dirty_classes[i >> 6], (uint64_t)1 << (i & 63),
                                 memory_order_relaxed);
    }
    c->dtail = u + 1;
}

static void dirty_unlink(pack_class *c, uint32_t u) {
    unit_meta *m = &units[u];
    if (m->dprev)
        units[m->dprev - 1].dnext = m->dnext;
    else
        c->dhead = m->dnext;
    if (m->dnext)
        units[m->dnext - 1].dprev = m->dprev;
    else
        c->dtail = m->dprev;
    if (!c->dhead) {
        unsigned i = class_index(c);
        atomic_fetch_and_explicit(&dirty_classes[i >> 6], ~((uint64_t)1 << (i & 63)),
                                  memory_order_relaxed);
    }
}

static inline void dirty_sub(pack_class *c, size_t bytes) {
    c->dirty -= bytes;
    atomic_fetch_sub_explicit(&dirty_total, bytes, memory_order_relaxed);
}

static inline uintptr_t unit_addr(uint32_t u) { return pack_lo + ((uintptr_t)u << ushift); }

/* Pages [first, last] of unit u (page numbers within the unit) as a mask. */
static inline uint64_t page_mask(unsigned first, unsigned last) {
    uint64_t hi = last >= 63 ? ~(uint64_t)0 : (((uint64_t)1 << (last + 1)) - 1);
    return hi & ~(((uint64_t)1 << first) - 1);
}

/* The pages of [a, a + len) are in use again: no longer dirty. */
static void undirty(pack_class *c, uintptr_t a, size_t len) {
    size_t pg = (a - pack_lo) >> PAGE_SHIFT, last = (a + len - 1 - pack_lo) >> PAGE_SHIFT;
    while (pg <= last) {
        uint32_t u = (uint32_t)(pg >> upages_shift);
        size_t unit_last = (((size_t)u + 1) << upages_shift) - 1;
        size_t end = last < unit_last ? last : unit_last;
        unit_meta *m = &units[u];
        if (m->dirty) {
            size_t first_pg = (size_t)u << upages_shift;
            uint64_t hit = m->dirty & page_mask((unsigned)(pg - first_pg), (unsigned)(end - first_pg));
            if (hit) {
                m->dirty &= ~hit;
                dirty_sub(c, (size_t)__builtin_popcountll(hit) * PAGE);
                if (!m->dirty)
                    dirty_unlink(c, u);
            }
        }
        pg = end + 1;
    }
}

static void mark_dirty(pack_class *c, size_t pg) {
    uint32_t u = (uint32_t)(pg >> upages_shift);
    uint64_t bit = (uint64_t)1 << (pg & (((size_t)1 << upages_shift) - 1));
    unit_meta *m = &units[u];
    if (m->dirty & bit)
        return;
    if (!m->dirty)
        dirty_link(c, u);
    m->dirty |= bit;
    c->dirty += PAGE;
    atomic_fetch_add_explicit(&dirty_total, PAGE, memory_order_relaxed);
}

/* madvise(DONTNEED) the dirty pages of unit u, in runs. */
static void release_unit(pack_class *c, uint32_t u) {
    unit_meta *m = &units[u];
    uint64_t d = m->dirty;
    dirty_sub(c, (size_t)__builtin_popcountll(d) * PAGE);
    atomic_fetch_add_explicit(&returned[class_index(c) / NCLASSES],
                              (uint64_t)__builtin_popcountll(d), memory_order_relaxed);
    m->dirty = 0;
    dirty_unlink(c, u);
    while (d) {
        unsigned first = (unsigned)__builtin_ctzll(d);
        uint64_t rest = ~(d >> first);
        unsigned n = rest ? (unsigned)__builtin_ctzll(rest) : 64 - first;
        madvise((void *)(unit_addr(u) + ((uintptr_t)first << PAGE_SHIFT)), (size_t)n << PAGE_SHIFT,
                MADV_DONTNEED);
        n_release_calls++;
        d &= n + first >= 64 ? 0 : ~(uint64_t)0 << (first + n);
    }
}

/* More than dirty_budget bytes of dirty pages in all: classes give their oldest dirty pages
 * back, class after class from where the last sweep stopped, until half the budget is left;
 * pages that became dirty since the previous sweep are spared unless the dirty pages exceed
 * twice the budget (a page freed and reused between two sweeps is never given back).
 * Called with no lock held; a class whose lock is busy is skipped (trylock: no lock order to
 * keep), and one thread sweeps at a time. Giving back every dirty page at each sweep cost gcc
 * 10,700 madvise calls and 1.13x glibc's time (its 64 KiB blocks churn). */
static unsigned sweep_cursor;

static void sweep_pass(size_t target, uint32_t before) {
    for (unsigned n = 0; n <= NCLASS_WORDS && atomic_load(&dirty_total) > target; n++) {
        unsigned w = sweep_cursor++ % NCLASS_WORDS;
        uint64_t bits = atomic_load_explicit(&dirty_classes[w], memory_order_relaxed);
        while (bits && atomic_load(&dirty_total) > target) {
            pack_class *c = (pack_class *)classes + w * 64 + (unsigned)__builtin_ctzll(bits);
            bits &= bits - 1;
            if (pthread_mutex_trylock(&c->lock) != 0)
                continue;
            while (c->dhead && (int32_t)(units[c->dhead - 1].epoch - before) < 0 &&
                   atomic_load(&dirty_total) > target)
                release_unit(c, c->dhead - 1);
            pthread_mutex_unlock(&c->lock);
        }
    }
}

static void sweep(void) {
    if (atomic_exchange(&sweeping, 1))
        return;
    uint32_t now = atomic_fetch_add(&sweep_epoch, 1);
    sweep_pass(dirty_budget / 2, now);                 /* dirty before the previous sweep */
    if (atomic_load(&dirty_total) > 2 * dirty_budget)
        sweep_pass(dirty_budget, now + 1);             /* any */
    /* the next one when another half budget has become dirty */
    size_t next = atomic_load(&dirty_total) + dirty_budget / 2;
    atomic_store(&sweep_at, next > dirty_budget ? next : dirty_budget);
    atomic_store(&sweeping, 0);
}

/* ---- bitmaps ---- */

static inline uint64_t *bits_of(uint32_t h) {
    return bitmaps + (size_t)(spans[h].bm - 1) * BM_CHUNK;
}

/* Are blocks [a, b] of bitmap bm all free? */
static int all_free(const uint64_t *bm, uint32_t a, uint32_t b) {
    uint32_t wa = a >> 6, wb = b >> 6;
    for (uint32_t w = wa; w <= wb; w++) {
        uint64_t mask = ~(uint64_t)0;
        if (w == wa)
            mask &= ~(uint64_t)0 << (a & 63);
        if (w == wb && (b & 63) != 63)
            mask &= ((uint64_t)1 << ((b & 63) + 1)) - 1;
        if ((bm[w] & mask) != mask)
            return 0;
    }
    return 1;
}

/* Page `q` of span h (page index from the span's start): are all blocks overlapping it free? */
static int page_free(const span_meta *s, uint32_t h, size_t q) {
    uint32_t a = (uint32_t)((q << PAGE_SHIFT) / s->size);
    size_t end = ((q + 1) << PAGE_SHIFT) - 1;
    uint32_t b = (uint32_t)(end / s->size);
    if (b >= s->nblocks)
        b = s->nblocks - 1;
    return a > b || all_free(bits_of(h), a, b);
}

/* ---- the region ---- */

/* k chunks of bitmap (region_lock held): first chunk + 1, or 0. */
static uint32_t bm_take(unsigned k) {
    uint32_t c1 = bm_free[k];
    if (c1) {
        bm_free[k] = (uint32_t)bitmaps[(size_t)(c1 - 1) * BM_CHUNK];
        return c1;
    }
    if (bm_top + k > bm_limit)
        return 0;
    c1 = bm_top + 1;
    bm_top += k;
    return c1;
}

static void bm_give(uint32_t c1, unsigned k) {
    bitmaps[(size_t)(c1 - 1) * BM_CHUNK] = bm_free[k];
    bm_free[k] = c1;
}

static void big_cache_flush(void);

/* A span of 2^nlog units with a bitmap of k chunks: its first unit + 1, or 0. A span taken here
 * is memory the program did not hold: the freed big mappings kept for reuse go back first, so
 * that a heap growing towards its peak never carries them (keeping 16 MiB of them at all times
 * cost sqlite3 3.9 MiB of peak RSS). */
static uint32_t span_take(unsigned nlog, unsigned k) {
    uint32_t h1 = 0;
    pthread_mutex_lock(&region_lock);
    uint32_t bm = bm_take(k);
    if (bm && pool[nlog]) {
        h1 = pool[nlog];
        pool[nlog] = S(h1)->next;
    } else if (bm && region_top + (1u << nlog) <= nunits) {
        h1 = region_top + 1;
        region_top += 1u << nlog;
    } else if (bm) {
        bm_give(bm, k);
    }
    if (h1) {
        S(h1)->bm = bm;
        S(h1)->bmk = (uint8_t)k;
    }
    pthread_mutex_unlock(&region_lock);
    if (h1)
        big_cache_flush();
    return h1;
}

static void span_give(uint32_t h1) {
    pthread_mutex_lock(&region_lock);
    bm_give(S(h1)->bm, S(h1)->bmk);
    S(h1)->next = pool[S(h1)->nlog];
    pool[S(h1)->nlog] = h1;
    pthread_mutex_unlock(&region_lock);
}

static uint32_t span_new(pack_class *c, unsigned cls, unsigned group) {
    unsigned nlog = class_nlog[cls];
    uint32_t n = 1u << nlog;
    uint32_t nblocks = (uint32_t)((((size_t)n) << ushift) / class_size[cls]);
    if (nblocks > bwords * 64)
        nblocks = bwords * 64;
    unsigned k = (nblocks + 64 * BM_CHUNK - 1) / (64 * BM_CHUNK);
    uint32_t h1 = span_take(nlog, k);
    if (!h1)
        return 0;
    uint32_t h = h1 - 1;
    for (uint32_t i = 0; i < n; i++) {
        units[h + i].head = h;
        units[h + i].cls = (uint16_t)cls;
        units[h + i].group = (uint8_t)group;
    }
    span_meta *s = S(h1);
    s->size = class_size[cls];
    s->nblocks = nblocks;
    s->live = 0;
    s->hint = 0;
    s->cls = (uint16_t)cls;
    s->group = (uint8_t)group;
    s->nlog = (uint8_t)nlog;
    uint64_t *bm = bits_of(h);
    uint32_t full = s->nblocks >> 6;
    memset(bm, 0xff, (size_t)full * 8);
    memset(bm + full, 0, (size_t)(k * BM_CHUNK - full) * 8);
    if (s->nblocks & 63)
        bm[full] = ((uint64_t)1 << (s->nblocks & 63)) - 1;
    list_push(c, L_EMPTY, h1);
    c->nempty++;
    return h1;
}

/* An empty span beyond the class's keep: every resident page of it is dirty (the last free of
 * each page marked it), so one madvise of the whole span cleans it for the pool. */
static void span_retire(pack_class *c, uint32_t h1) {
    span_meta *s = S(h1);
    uint32_t h = h1 - 1, n = 1u << s->nlog;
    list_remove(c, h1);
    c->nempty--;
    for (uint32_t i = 0; i < n; i++)
        if (units[h + i].dirty) {
            atomic_fetch_add_explicit(&returned[class_index(c) / NCLASSES],
                                      (uint64_t)__builtin_popcountll(units[h + i].dirty),
                                      memory_order_relaxed);
            dirty_sub(c, (size_t)__builtin_popcountll(units[h + i].dirty) * PAGE);
            units[h + i].dirty = 0;
            dirty_unlink(c, h + i);
        }
    madvise((void *)unit_addr(h), (size_t)n << ushift, MADV_DONTNEED);
    n_retire_calls++;
    span_give(h1);
}

/* ---- allocation ---- */

static uint32_t span_for_alloc(pack_class *c, unsigned cls, unsigned group) {
    for (int l = PACK_NB - 1; l >= 0; l--)
        if (c->list[l])
            return c->list[l];
    if (c->list[L_EMPTY])
        return c->list[L_EMPTY];
    return span_new(c, cls, group);
}

/* One block of class c (its lock held); NULL when the region is exhausted. */
static void *alloc_locked(pack_class *c, unsigned group, unsigned cls) {
    uint32_t h1 = span_for_alloc(c, cls, group);
    if (!h1)
        return NULL;
    span_meta *s = S(h1);
    uint64_t *bm = bits_of(h1 - 1);
    uint32_t w = s->hint;
    while (!bm[w])
        w++;
    unsigned bit = (unsigned)__builtin_ctzll(bm[w]);
    bm[w] &= bm[w] - 1;
    s->hint = w;
    if (s->live++ == 0)
        c->nempty--;
    relist(c, h1);
    uintptr_t p = unit_addr(h1 - 1) + ((uintptr_t)w * 64 + bit) * s->size;
    undirty(c, p, s->size);
    return (void *)p;
}

static void corrupt(pack_class *c, const char *what, const void *p) {
    pthread_mutex_unlock(&c->lock);
    ha_message("heapcast alloc (pack): %s: %p\n", what, p);
    abort();
}

/* Frees block p of span h (class c, its lock held). */
static void free_locked(pack_class *c, uint32_t h, uintptr_t p) {
    span_meta *s = &spans[h];
    size_t off = p - unit_addr(h);
    uint32_t i = (uint32_t)(off / s->size);
    if (HA_UNLIKELY(off != (size_t)i * s->size || i >= s->nblocks))
        corrupt(c, "free(): invalid pointer", (void *)p);
    uint64_t *bm = bits_of(h);
    if (HA_UNLIKELY(bm[i >> 6] & ((uint64_t)1 << (i & 63))))
        corrupt(c, "free(): double free detected", (void *)p);
    bm[i >> 6] |= (uint64_t)1 << (i & 63);
    if ((i >> 6) < s->hint)
        s->hint = i >> 6;
    s->live--;
    /* the pages of this block whose every block is now free */
    size_t fp = off >> PAGE_SHIFT, lp = (off + s->size - 1) >> PAGE_SHIFT;
    size_t base_pg = ((size_t)h << upages_shift);
    for (size_t q = fp; q <= lp; q++)
        if ((q != fp && q != lp) || page_free(s, h, q))
            mark_dirty(c, base_pg + q);
    relist(c, h + 1);
    if (s->live == 0) {
        c->nempty++;
        if (c->nempty > keep_empty)
            span_retire(c, h + 1);
    }
}

static inline uint32_t span_of(uintptr_t p) { return units[(p - pack_lo) >> ushift].head; }

static inline void maybe_sweep(void) {
    if (atomic_load_explicit(&dirty_total, memory_order_relaxed) >
        atomic_load_explicit(&sweep_at, memory_order_relaxed))
        sweep();
}

/* ---- the thread cache ----
 * Each thread keeps free blocks per (group, class) for classes up to TC_CLASSES (1 KiB), in an
 * array, oldest first: malloc and free of small blocks take no lock while the thread's bin has
 * a block or room. An allocation takes the block freed last (still in the cache's lines); an
 * empty bin takes a batch under one lock, a full one gives its oldest batch back. A bin holds up
 * to TC_BYTES of blocks (TC_MIN blocks at least): 512 blocks of 16 bytes, 128 of 64, 16 of 512
 * bytes and up; a batch is half of that. Cached blocks are in use as far as their spans know
 * (they keep their pages), which bounds what the cache can hold back: about 650 KiB per group
 * for a thread that uses every small class. A free from another thread goes to the freeing
 * thread's bin. At thread exit a thread-specific-data destructor gives the bins back and turns
 * the cache off for that thread. Without the cache, every malloc/free pair took the class lock
 * twice: make ran 1.2x glibc's time. With 16 blocks a bin in a list, batches of 8 and the blocks
 * freed last given back (until stop 40), CPython allocating every object through malloc
 * (py_dicts with PYTHONMALLOC=malloc) ran 1.5x glibc's time, most of it its cyclic collector
 * walking objects scattered over their spans; now 0.9x (docs/allocator.md). */
#define TC_CLASSES 64
#define TC_BYTES 8192
#define TC_MIN 16
#define TC_LIMIT 512

static uint16_t tc_max[TC_CLASSES], tc_batch[TC_CLASSES];   /* per class, from its size */
static uint32_t tc_first[TC_CLASSES], tc_slots;   /* a class's first slot in a group's array */

static void init_tc_limits(void) {
    tc_slots = 0;
    for (unsigned c = 0; c < TC_CLASSES; c++) {
        size_t n = c < nclasses ? TC_BYTES / class_size[c] : TC_MIN;
        n = n < TC_MIN ? TC_MIN : n > TC_LIMIT ? TC_LIMIT : n;
        tc_max[c] = (uint16_t)n;
        tc_batch[c] = (uint16_t)(n / 2);
        tc_first[c] = tc_slots;
        tc_slots += (uint32_t)n;
    }
}

typedef struct {
    void **slot;              /* its blocks, oldest first: the next allocation takes the last */
    uint32_t n;
} tc_bin;

/* The bins and their slots live in a mapping of their own per thread (about 20 KiB a group,
 * pages touched as classes are used), so that the library's static TLS stays a few words (it
 * must fit the surplus glibc keeps for libraries loaded late). */
typedef tc_bin tc_bins[PACK_GROUPS][TC_CLASSES];
enum { TC_NEW = 0, TC_REGISTERING, TC_ON, TC_OFF };
static __thread tc_bins *tc __attribute__((tls_model("initial-exec")));
static __thread int tc_state __attribute__((tls_model("initial-exec")));
static pthread_key_t tc_key;
static int tc_key_ok;

static size_t tc_map_bytes(void) {
    return sizeof(tc_bins) + (size_t)PACK_GROUPS * tc_slots * sizeof(void *);
}

static int tc_register(void) {
    if (tc_state != TC_NEW || !tc_key_ok)
        return 0;
    tc_state = TC_REGISTERING;          /* pthread_setspecific may allocate: not from the cache */
    void *bins = mmap(NULL, tc_map_bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    int ok = bins != MAP_FAILED && pthread_setspecific(tc_key, (void *)1) == 0;
    if (ok) {
        tc_bins *t = bins;
        void **slots = (void **)((char *)bins + sizeof(tc_bins));
        for (unsigned g = 0; g < PACK_GROUPS; g++)
            for (unsigned k = 0; k < TC_CLASSES; k++)
                (*t)[g][k].slot = slots + (size_t)g * tc_slots + tc_first[k];
        tc = t;
    } else if (bins != MAP_FAILED) {
        munmap(bins, tc_map_bytes());
    }
    tc_state = ok ? TC_ON : TC_OFF;
    return ok;
}

static inline int tc_on(void) {
    return HA_LIKELY(tc_state == TC_ON) || tc_register();
}

/* Gives the n oldest blocks of bin b (class cls of group g) back to their spans: the ones
 * freed last, still in the cache's lines, stay for the next allocations. */
static void tc_drain(tc_bin *b, unsigned g, unsigned cls, uint32_t n) {
    pack_class *c = &classes[g][cls];
    if (n > b->n)
        n = b->n;
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < n; i++)
        free_locked(c, span_of((uintptr_t)b->slot[i]), (uintptr_t)b->slot[i]);
    pthread_mutex_unlock(&c->lock);
    b->n -= n;
    memmove(b->slot, b->slot + n, (size_t)b->n * sizeof(void *));
}

static void tc_exit(void *unused) {
    tc_bins *bins = tc;
    tc_state = TC_OFF;
    tc = NULL;
    if (!bins)
        return;
    for (unsigned g = 0; g < PACK_GROUPS; g++)
        for (unsigned k = 0; k < TC_CLASSES; k++)
            if ((*bins)[g][k].n)
                tc_drain(&(*bins)[g][k], g, k, (*bins)[g][k].n);
    munmap(bins, tc_map_bytes());
    maybe_sweep();
}

/* An empty bin: a batch of blocks under one lock, one of them returned. */
static void *tc_refill(tc_bin *b, unsigned g, unsigned cls) {
    pack_class *c = &classes[g][cls];
    pthread_mutex_lock(&c->lock);
    void *first = alloc_locked(c, g, cls);
    uint32_t n = 0;
    while (first && n + 1 < tc_batch[cls]) {
        void *p = alloc_locked(c, g, cls);
        if (!p)
            break;
        b->slot[n++] = p;
    }
    pthread_mutex_unlock(&c->lock);
    for (uint32_t i = 0, j = n; i + 1 < j; i++, j--) {   /* the lowest address is taken next */
        void *t = b->slot[i];
        b->slot[i] = b->slot[j - 1];
        b->slot[j - 1] = t;
    }
    b->n = n;
    return first;
}

/* ---- allocation entry points ---- */

static void *alloc_slow(int group, size_t size, size_t align);

void *pack_alloc(int group, size_t size, size_t align) {
    /* The common case inline, saving no registers: a small block, no alignment asked, from a
     * bin of this thread's cache that holds one. */
    if (HA_LIKELY(size <= ((size_t)1 << fine_log) && align == 0 && tc_state == TC_ON &&
                  (unsigned)group < PACK_GROUPS)) {
        unsigned cls = class_of(size);
        if (HA_LIKELY(cls < TC_CLASSES)) {
            tc_bin *b = &(*tc)[group][cls];
            uint32_t n = b->n;
            if (HA_LIKELY(n)) {
                b->n = n - 1;
                return b->slot[n - 1];
            }
        }
    }
    return alloc_slow(group, size, align);
}

static __attribute__((noinline)) void *alloc_slow(int group, size_t size, size_t align) {
    if (size > PACK_MAX || align > PAGE || (unsigned)group >= PACK_GROUPS)
        return NULL;
    unsigned cls = class_of(size);
    /* Blocks sit at multiples of their size from a unit boundary, so a class's blocks are
     * aligned to the lowest set bit of its size: 16 or more, but 8 for the classes of
     * HEAPCAST_PACK_GRAIN=8 that are odd multiples of 8 (an aligned request skips them). */
    if (align > (class_size[cls] & -class_size[cls])) {
        while (cls < nclasses && class_size[cls] % align)
            cls++;
        if (cls == nclasses)
            return NULL;
    } else if (cls < TC_CLASSES && tc_on()) {
        tc_bin *b = &(*tc)[group][cls];
        if (HA_LIKELY(b->n))
            return b->slot[--b->n];
        return tc_refill(b, (unsigned)group, cls);
    }
    pack_class *c = &classes[group][cls];
    pthread_mutex_lock(&c->lock);
    void *p = alloc_locked(c, (unsigned)group, cls);
    pthread_mutex_unlock(&c->lock);
    return p;
}

/* pack_free's other cases, out of line so that its common one saves no registers: a full bin,
 * a thread whose cache is not on yet, a class above the cache's. */
static __attribute__((noinline)) void free_slow(void *ptr, const unit_meta *u) {
    unsigned g = u->group, cls = u->cls;
    if (cls < TC_CLASSES && tc_on()) {
        tc_bin *b = &(*tc)[g][cls];
        if (b->n >= tc_max[cls]) {
            tc_drain(b, g, cls, tc_batch[cls]);
            maybe_sweep();
        }
        b->slot[b->n++] = ptr;
        return;
    }
    pack_class *c = &classes[g][cls];
    pthread_mutex_lock(&c->lock);
    free_locked(c, u->head, (uintptr_t)ptr);
    pthread_mutex_unlock(&c->lock);
    maybe_sweep();
}

void pack_free(void *ptr) {
    const unit_meta *u = &units[((uintptr_t)ptr - pack_lo) >> ushift];
    unsigned cls = u->cls;
    if (HA_LIKELY(cls < TC_CLASSES && tc_state == TC_ON)) {   /* into this thread's bin */
        tc_bin *b = &(*tc)[u->group][cls];
        uint32_t n = b->n;
        if (HA_LIKELY(n < tc_max[cls])) {
            b->slot[n] = ptr;
            b->n = n + 1;
            return;
        }
    }
    free_slow(ptr, u);
}

size_t pack_usable_size(const void *p) {
    return class_size[units[((uintptr_t)p - pack_lo) >> ushift].cls];
}

/* ---- blocks over PACK_MAX: a mapping each ----
 * mmap'd (page-aligned), grown and shrunk with mremap (no copy); at free kept in a small cache
 * for the next big block or munmap'd (their pages go back at once). A hash table (open addressing, mmap'd)
 * maps a block's address to its length; only page-aligned pointers outside the region are
 * looked up, so the fallback allocator's blocks rarely pay for it. */

typedef struct {
    uintptr_t addr;           /* 0: empty, 1: deleted */
    size_t len;
} big_slot;

static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static big_slot *big_table;
static size_t big_cap, big_used;      /* slots; slots not empty (live or deleted) */

static inline size_t big_hash(uintptr_t a) {
    return (size_t)(((a >> PAGE_SHIFT) * 0x9E3779B97F4A7C15ull) >> 20);
}

static big_slot *big_find(uintptr_t a) {
    if (!big_cap)
        return NULL;
    for (size_t i = big_hash(a) & (big_cap - 1);; i = (i + 1) & (big_cap - 1)) {
        if (big_table[i].addr == a)
            return &big_table[i];
        if (big_table[i].addr == 0)
            return NULL;
    }
}

static int big_insert(uintptr_t a, size_t len);

static int big_grow(void) {
    size_t cap = big_cap ? big_cap * 2 : 1024;
    big_slot *old = big_table, *t = mmap(NULL, cap * sizeof *t, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t == MAP_FAILED)
        return -1;
    size_t old_cap = big_cap;
    big_table = t;
    big_cap = cap;
    big_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].addr > 1)
            big_insert(old[i].addr, old[i].len);
    if (old)
        munmap(old, old_cap * sizeof *old);
    return 0;
}

static int big_insert(uintptr_t a, size_t len) {
    if ((big_used + 1) * 2 > big_cap && big_grow() != 0)
        return -1;
    size_t i = big_hash(a) & (big_cap - 1);
    while (big_table[i].addr > 1)
        i = (i + 1) & (big_cap - 1);
    if (big_table[i].addr == 0)
        big_used++;
    big_table[i].addr = a;
    big_table[i].len = len;
    return 0;
}

static inline size_t page_round(size_t n) { return (n + PAGE - 1) & ~(PAGE - 1); }

/* Freed mappings kept for the next big block (a program that allocates and frees a 1 MiB
 * buffer in a loop otherwise pays an mmap, a munmap and a page fault per page every time: 60x
 * mimalloc's time), at most PACK_BIG_CACHE of them and big_cache_max bytes (HEAPCAST_PACK_BIG_CACHE),
 * the oldest given back first, and all of them whenever the packer takes a span of memory it did
 * not hold (span_take): their pages stay resident only while the heap is not growing. Under
 * big_lock. */
typedef struct { uintptr_t addr; size_t len; } big_mapping;
static big_mapping big_cache[PACK_BIG_CACHE];   /* oldest first */
static unsigned big_ncached;
static size_t big_cached, big_cache_max = PACK_BIG_CACHE_MAX;

/* Takes kept mapping i out of the cache (its pages are the caller's: reused or given back). */
static big_mapping big_cache_remove(unsigned i) {
    big_mapping m = big_cache[i];
    big_cached -= m.len;
    memmove(&big_cache[i], &big_cache[i + 1], (big_ncached - i - 1) * sizeof big_cache[0]);
    big_ncached--;
    return m;
}

/* A cached mapping for `len` bytes (at most a quarter more, kept whole: *len becomes its
 * length, so that the next larger request of a program whose sizes vary still fits); 0 if
 * none. */
static uintptr_t big_cache_take(size_t *len) {
    unsigned best = PACK_BIG_CACHE;
    for (unsigned i = 0; i < big_ncached; i++)
        if (big_cache[i].len >= *len && big_cache[i].len - *len <= *len / 4 &&
            (best == PACK_BIG_CACHE || big_cache[i].len < big_cache[best].len))
            best = i;
    if (best == PACK_BIG_CACHE)
        return 0;
    big_mapping m = big_cache_remove(best);
    *len = m.len;
    return m.addr;
}

/* Gives back every kept mapping (see span_take). */
static void big_cache_flush(void) {
    if (!__atomic_load_n(&big_ncached, __ATOMIC_RELAXED))
        return;
    big_mapping gone[PACK_BIG_CACHE];
    pthread_mutex_lock(&big_lock);
    unsigned n = big_ncached;
    memcpy(gone, big_cache, n * sizeof gone[0]);
    big_ncached = 0;
    big_cached = 0;
    pthread_mutex_unlock(&big_lock);
    for (unsigned i = 0; i < n; i++)
        munmap((void *)gone[i].addr, gone[i].len);
}

void *pack_big_alloc(size_t size, int zero) {
    size_t len = page_round(size);
    if (len < size)
        return NULL;
    big_mapping gone[PACK_BIG_CACHE];
    unsigned ngone = 0;
    pthread_mutex_lock(&big_lock);
    void *p = (void *)big_cache_take(&len);
    if (!p)   /* a new mapping: the kept ones too small for it go back (a growing buffer's
               * old sizes are not asked for again; gcc peaked 0.8 MiB higher with them) */
        for (unsigned i = big_ncached; i-- > 0;)
            if (big_cache[i].len < len)
                gone[ngone++] = big_cache_remove(i);
    pthread_mutex_unlock(&big_lock);
    for (unsigned i = 0; i < ngone; i++)
        munmap((void *)gone[i].addr, gone[i].len);
    if (p) {
        if (zero)   /* a fresh mapping reads zero; a reused one has the old contents */
            memset(p, 0, size);
    } else {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
    }
    pthread_mutex_lock(&big_lock);
    int failed = big_insert((uintptr_t)p, len);
    pthread_mutex_unlock(&big_lock);
    if (failed) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

size_t pack_big_len(const void *p) {
    if ((uintptr_t)p & (PAGE - 1))
        return 0;
    pthread_mutex_lock(&big_lock);
    big_slot *e = big_find((uintptr_t)p);
    size_t len = e ? e->len : 0;
    pthread_mutex_unlock(&big_lock);
    return len;
}

int pack_big_free(void *p) {
    if ((uintptr_t)p & (PAGE - 1))
        return 0;
    big_mapping gone[PACK_BIG_CACHE + 1];
    unsigned ngone = 0;
    pthread_mutex_lock(&big_lock);
    big_slot *e = big_find((uintptr_t)p);
    size_t len = e ? e->len : 0;
    if (e) {
        e->addr = 1;
        if (len <= big_cache_max) {   /* kept; the oldest go back while over the bounds */
            while (big_ncached && (big_ncached == PACK_BIG_CACHE || big_cached + len > big_cache_max))
                gone[ngone++] = big_cache_remove(0);
            big_cache[big_ncached].addr = (uintptr_t)p;
            big_cache[big_ncached++].len = len;
            big_cached += len;
        } else {
            gone[ngone++] = (big_mapping){(uintptr_t)p, len};
        }
    }
    pthread_mutex_unlock(&big_lock);
    for (unsigned i = 0; i < ngone; i++)
        munmap((void *)gone[i].addr, gone[i].len);
    return len != 0;
}

void *pack_big_realloc(void *p, size_t size) {
    size_t len = page_round(size);
    if (len < size)
        return NULL;
    pthread_mutex_lock(&big_lock);
    void *q = MAP_FAILED;
    if ((big_used + 1) * 2 <= big_cap || big_grow() == 0) {   /* room for the new address */
        big_slot *e = big_find((uintptr_t)p);
        q = mremap(p, e->len, len, MREMAP_MAYMOVE);
        if (q == p) {
            e->len = len;
        } else if (q != MAP_FAILED) {
            e->addr = 1;
            big_insert((uintptr_t)q, len);
        }
    }
    pthread_mutex_unlock(&big_lock);
    return q == MAP_FAILED ? NULL : q;
}

size_t pack_class_bytes(size_t size) {
    return class_size[class_of(size)];
}

/* HEAPCAST_PACK_DEBUG=1: at exit, what each class holds (stderr). */
void pack_dump(void) {
    size_t tot_cap = 0, tot_live = 0, tot_dirty = 0;
    for (int g = 0; g < PACK_GROUPS; g++)
        for (unsigned c = 0; c < nclasses; c++) {
            pack_class *k = &classes[g][c];
            size_t nspans = 0, cap = 0, live = 0;
            for (unsigned l = 0; l <= PACK_NB; l++)
                for (uint32_t h1 = k->list[l]; h1; h1 = S(h1)->next) {
                    nspans++;
                    cap += S(h1)->nblocks;
                    live += S(h1)->live;
                }
            if (!nspans)
                continue;
            ha_message("pack g%d size %6u: %5zu partial/empty spans, %8zu blocks %8zu live, "
                       "%6zu KiB dirty\n", g, class_size[c], nspans, cap, live, k->dirty >> 10);
            tot_cap += cap * class_size[c];
            tot_live += live * class_size[c];
            tot_dirty += k->dirty;
        }
    ha_message("pack: %zu sweeps, %zu madvise of dirty pages, %zu of empty spans\n", (size_t)sweep_epoch,
               n_release_calls, n_retire_calls);
    ha_message("pack: units used %u (%zu MiB), partial spans %zu MiB capacity %zu MiB live, "
               "%zu KiB dirty\n", region_top, ((size_t)region_top << ushift) >> 20, tot_cap >> 20,
               tot_live >> 20, tot_dirty >> 10);
}

/* ---- setup ---- */

static void lock_all(void) {
    for (int g = 0; g < PACK_GROUPS; g++)
        for (int c = 0; c < (int)nclasses; c++)
            pthread_mutex_lock(&classes[g][c].lock);
    pthread_mutex_lock(&region_lock);
    pthread_mutex_lock(&big_lock);
}

static void unlock_all(void) {
    pthread_mutex_unlock(&big_lock);
    pthread_mutex_unlock(&region_lock);
    for (int g = PACK_GROUPS - 1; g >= 0; g--)
        for (int c = (int)nclasses - 1; c >= 0; c--)
            pthread_mutex_unlock(&classes[g][c].lock);
}

/* The child also forgets a sweep another thread was in the middle of (it has no such thread). */
static void unlock_all_in_child(void) {
    atomic_store(&sweeping, 0);
    for (int g = 0; g < PACK_GROUPS; g++)   /* the child counts its own (as stats.c does) */
        atomic_store(&returned[g], 0);
    unlock_all();
}

static size_t env_size(const char *name, size_t dflt, size_t lo, size_t hi) {
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x < lo || x > hi) {
        ha_message("heapcast alloc: %s=%s: expected a number %zu-%zu; using %zu\n", name, v, lo,
                   hi, dflt);
        return dflt;
    }
    return (size_t)x;
}

static void *reserve(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, len, MADV_NOHUGEPAGE);     /* pages are given back one by one */
    return p;
}

int pack_init(void) {
    ushift = (unsigned)env_size("HEAPCAST_PACK_SPAN", PACK_UNIT_LOG, 14, 18);   /* log2 bytes */
    steps_log = (unsigned)env_size("HEAPCAST_PACK_STEPS", steps_log, 2, PACK_STEPS_LOG);
    fine_log = (unsigned)env_size("HEAPCAST_PACK_FINE", fine_log, 8, PACK_FINE_LOG);
    grain_log = env_size("HEAPCAST_PACK_GRAIN", 16, 8, 16) == 8 ? 3 : 4;
    dirty_budget = env_size("HEAPCAST_PACK_DIRTY", dirty_budget, 0, (size_t)1 << 40);
    keep_empty = (uint32_t)env_size("HEAPCAST_PACK_EMPTY", keep_empty, 0, 1u << 20);
    big_cache_max = env_size("HEAPCAST_PACK_BIG_CACHE", big_cache_max, 0, (size_t)1 << 40);
    sweep_at = dirty_budget;
    upages_shift = ushift - PAGE_SHIFT;
    min_block = (size_t)1 << grain_log;
    bwords = (unsigned)(((size_t)1 << ushift) / min_block / 64);
    nunits = (uint32_t)(REGION >> ushift);
    init_classes();
    init_tc_limits();
    size_t unit = (size_t)1 << ushift;
    char *region = reserve(REGION + unit);
    units = reserve((size_t)nunits * sizeof(unit_meta));
    spans = reserve((size_t)nunits * sizeof(span_meta));
    bm_limit = (uint32_t)((size_t)nunits * bwords / BM_CHUNK);
    bitmaps = reserve((size_t)bm_limit * BM_CHUNK * 8);
    if (!region || !units || !spans || !bitmaps)
        return -1;
    uintptr_t lo = ((uintptr_t)region + unit - 1) & ~(uintptr_t)(unit - 1);
    if (pthread_atfork(lock_all, unlock_all, unlock_all_in_child) != 0)
        return -1;
    tc_key_ok = pthread_key_create(&tc_key, tc_exit) == 0;
    pack_lo = lo;
    pack_hi = lo + REGION;
    return 0;
}

uint64_t pack_pages_returned(int group) {
    return (unsigned)group < PACK_GROUPS ? atomic_load(&returned[group]) : 0;
}
