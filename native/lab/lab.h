/* The allocator lab's replay kernels: shared types and the internal interfaces between the
 * driver (events -> ops), the data structures and the policies. docs/policies.md describes the
 * policies; src/heapcast/lab/native.py mirrors the exported structs (keep them in sync). */
#ifndef HEAPCAST_LAB_H
#define HEAPCAST_LAB_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t u64;
typedef uint32_t u32;
typedef uint16_t u16;
typedef uint8_t u8;

#define LAB_API __attribute__((visibility("default")))
#define LAB_MAX_CLASSES 16
#define LAB_NO_CLASS 255

/* ---- the trace's event record (heapcast.EVENT_DTYPE, 64 bytes) ---- */
typedef struct {
    u64 seq, ts, addr, old_addr, size, arg;
    u32 loc, tid, free_lag;
    u16 proc;
    u8 op, flags;
} lab_event;
_Static_assert(sizeof(lab_event) == 64, "EVENT_DTYPE is 64 bytes");

enum { EV_MALLOC, EV_CALLOC, EV_REALLOC, EV_REALLOCARRAY, EV_POSIX_MEMALIGN, EV_ALIGNED_ALLOC,
       EV_MEMALIGN, EV_VALLOC, EV_PVALLOC, EV_FREE };

/* ---- what a policy replays: one op per acquisition, release or realloc ---- */
enum { OP_ALLOC = 1, OP_FREE = 2, OP_REALLOC = 3 };

typedef struct {
    u64 size;       /* requested bytes (ALLOC, REALLOC) */
    u64 clock;      /* lifetime clock (events since the process began) at this op */
    u64 ts;         /* ns */
    u32 id;         /* block id produced (ALLOC, REALLOC) or released (FREE) */
    u32 old;        /* REALLOC: the block it replaces */
    u8 kind;
    u8 align_log2;  /* 0: default alignment (16) */
    u8 cls_oracle;  /* true lifetime class of the block produced */
    u8 cls_pred;    /* predicted lifetime class (call-site predictor or model) */
    u32 pad;
} lab_op;

/* ---- growable arrays ---- */
void *lab_grow(void *p, size_t *cap, size_t need, size_t elsize);
void *lab_dup(const void *p, size_t bytes);
void lab_fatal(const char *what);
u64 lab_now_ns(void);
u64 lab_thread_ns(void);   /* CPU time of the calling thread: a policy's own cost, whatever
                              runs beside it (policies run side by side, driver.c) */

/* ---- hash map u64 -> u64 (open addressing; key ~0 is reserved) ---- */
typedef struct {
    u64 key, val;
} hm_entry;
typedef struct {
    hm_entry *e;
    size_t cap, len;    /* cap: power of two */
} hmap;
void hm_init(hmap *m);
void hm_free(hmap *m);
void hm_clone(hmap *dst, const hmap *src);
int hm_get(const hmap *m, u64 key, u64 *val);
void hm_put(hmap *m, u64 key, u64 val);
int hm_del(hmap *m, u64 key, u64 *val);
/* The slot where key's probe starts. */
static inline size_t hm_slot(u64 key, size_t cap) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}
/* Asks for the line where key's probe starts, ahead of a get, put or del of it: a large map's
 * probes miss the cache, and an op known a few ops early hides that wait. */
static inline void hm_prefetch(const hmap *m, u64 key) {
    __builtin_prefetch(&m->e[hm_slot(key, m->cap)], 1);
}

/* ---- treap keyed by (k1, k2), each node carrying a length, with subtree max length ---- */
typedef struct {
    u64 k1, k2, len, maxlen;
    u32 l, r, prio, pad;
} tnode;
typedef struct {
    tnode *n;           /* n[0] is the null node */
    size_t cap, used;
    u32 root, freelist, rng, count;
} treap;
void tr_init(treap *t);
void tr_free(treap *t);
void tr_clone(treap *dst, const treap *src);
void tr_insert(treap *t, u64 k1, u64 k2, u64 len);
int tr_erase(treap *t, u64 k1, u64 k2);
int tr_set(treap *t, u64 k1, u64 k2, u64 nk1, u64 nk2, u64 len);   /* same place in key order */
u32 tr_first_fit(const treap *t, u64 need);            /* lowest key with len >= need */
u32 tr_next_fit(const treap *t, u64 from, u64 need);   /* lowest key >= (from, 0) with len >= need */
u32 tr_lower_bound(const treap *t, u64 k1, u64 k2);    /* lowest key >= (k1, k2) */
u32 tr_floor(const treap *t, u64 k1, u64 k2);          /* highest key <= (k1, k2) */
u32 tr_min(const treap *t);
int tr_check(const treap *t);   /* 1 if keys are in order, maxlens right and the count too */

/* ---- free ranges of an address space, with a wilderness [top, inf) (fitheap.c) ---- */
enum { FIT_FIRST, FIT_NEXT, FIT_BEST };
typedef struct {
    int mode;
    u64 gran, minchunk;   /* chunk granularity and minimum free-range size */
    u64 nocross;          /* if not 0: free ranges never cross a multiple of it */
    u64 top;              /* start of the wilderness */
    int unbounded;        /* 0: no wilderness (alloc fails when nothing fits) */
    u64 rover;            /* next-fit: where the last search ended */
    u64 free_bytes;
    treap addr, size;
    hmap by_start, by_end;
} fitheap;
void fh_init(fitheap *h, int mode, u64 base, u64 gran, u64 minchunk);
void fh_free_all(fitheap *h);
void fh_clone(fitheap *dst, const fitheap *src);
/* Carves a chunk of `len` bytes whose address + hdr is a multiple of align; returns its start and
 * sets *got to its length (len, or more when the rest was too small to stay free), or returns
 * ~0 if nothing fits and the heap has no wilderness. */
u64 fh_alloc(fitheap *h, u64 len, u64 align, u64 hdr, u64 *got);
/* Carves from free ranges only (never the wilderness); ~0 if nothing fits. */
u64 fh_alloc_nowild(fitheap *h, u64 len, u64 align, u64 hdr, u64 *got);
u64 fh_alloc_top(fitheap *h, u64 len, u64 align, u64 hdr, u64 *got);
/* Returns [start, start+len) to the free ranges, coalescing; returns the start of the merged
 * range and sets *merged_len (0 if it was absorbed into the wilderness). */
u64 fh_release(fitheap *h, u64 start, u64 len, u64 *merged_len);
/* Adds a range that was never handed out (a new span) without touching `top`. */
void fh_add_range(fitheap *h, u64 start, u64 len);
/* Removes exactly the free range [start, start+len) (it must be one). */
void fh_take_range(fitheap *h, u64 start, u64 len);
/* Grows the chunk [start, start+len) in place to newlen by taking the free space right after it
 * (or the wilderness when allow_top); returns 1 on success (then *got is the new length). */
int fh_extend(fitheap *h, u64 start, u64 len, u64 newlen, int allow_top, u64 *got);
const char *fh_check(const fitheap *h);   /* NULL if consistent */

/* ---- resident pages that hold a live byte (pages.c) ---- */
typedef struct {
    u32 *cnt4k, *cnt2m;      /* live chunks touching each partially covered page */
    size_t cap4k, cap2m;
    u64 exclusive4k, exclusive2m;   /* pages wholly covered by one live chunk */
    u64 shared4k, shared2m;         /* partially covered pages with a live chunk */
} pages;
void pg_init(pages *p);
void pg_free(pages *p);
void pg_clone(pages *dst, const pages *src);
void pg_add(pages *p, u64 start, u64 len, int sign);
static inline u64 pg_4k(const pages *p) { return p->exclusive4k + p->shared4k; }
static inline u64 pg_2m(const pages *p) { return p->exclusive2m + p->shared2m; }

/* ---- the call-site lifetime predictor (predictor.c) ---- */
typedef struct {
    u32 id, gen;
    u64 clock0;
} pr_entry;
typedef struct {
    pr_entry *e;
    size_t cap, head, len;
} pr_queue;
typedef struct {
    u32 gen, row_site, row_size;
    u8 lower, pad[3];      /* live past bound[lower - 1]: its class is >= lower (0: not yet) */
} pr_block;
typedef struct {
    int k, nq;             /* classes; finite bounds (timer queues) */
    u64 quantile;          /* per mille */
    u64 bound[LAB_MAX_CLASSES];
    hmap row_of;           /* (loc << 7 | size class, or 127 for any size) -> row */
    u32 *rows;             /* see predictor.c */
    size_t rows_cap, nrows;
    pr_queue q[LAB_MAX_CLASSES];
    pr_block *blk;         /* by block id */
    size_t blk_cap;
} predictor;
void pr_init(predictor *pr, int k, const u64 *bound, u64 quantile);
void pr_free(predictor *pr);
void pr_clone(predictor *dst, const predictor *src);
void pr_prior(predictor *pr, u32 loc, int sc, int c, u32 n);
u8 pr_predict(predictor *pr, u32 loc, int sc);
void pr_born(predictor *pr, u32 id, u32 loc, int sc, u64 clock);
void pr_died(predictor *pr, u32 id, int c);
void pr_advance(predictor *pr, u64 clock);

/* ---- policies ---- */
/* POL_ORACLE and POL_LEARNED place by lifetime over best-fit; the _FIRST and _NEXT kinds layer
 * the same segregation over first-fit and next-fit. */
enum { POL_FIRST, POL_NEXT, POL_BEST, POL_BUDDY, POL_SEG, POL_GLIBC, POL_ORACLE, POL_LEARNED,
       POL_ORACLE_FIRST, POL_ORACLE_NEXT, POL_LEARNED_FIRST, POL_LEARNED_NEXT,
       POL_PACK, POL_PACK_ORACLE, POL_PACK_LEARNED, POL_COUNT };

/* Where a block lives in the simulated address space. */
enum { REG_ARENA = 0, REG_MMAP = 1 };

typedef struct {
    u64 addr, len;    /* the chunk: header, payload and rounding */
    u64 req;          /* requested bytes */
    u32 aux;          /* policy-specific: slab/span id, order, ... */
    u32 hdr;          /* the payload starts at addr + hdr */
    u8 region, live, pad[6];
} pblock;

/* Metrics, as exported (native.py: Metrics). */
typedef struct {
    u64 ops, events;
    u64 live_bytes, chunk_bytes;   /* now: requested, and whole chunks */
    u64 arena_top, mmapped;        /* now */
    u64 peak_footprint, peak_live_at_footprint, internal_at_peak;
    u64 peak_pages4k, peak_pages2m, peak_chunk_bytes;
    u64 peak_mmapped;
    u64 ns;                        /* time spent replaying */
    u64 moves, inplace, reclassified;
    u64 check_failures;
    u64 sum_footprint16, sum_pages4k;   /* over ops (footprint in 16-byte units): time averages */
} lab_metrics;

typedef struct policy policy;
typedef struct {
    void (*alloc)(policy *, u32 id, u64 size, u64 align, u8 cls, u64 clock);
    void (*release)(policy *, u32 id);
    void (*realloc)(policy *, u32 old, u32 id, u64 size, u8 cls, u64 clock);
    void (*clone_state)(policy *dst, const policy *src);
    void (*free_state)(policy *);
    void (*check)(policy *);
} policy_ops;

typedef struct {
    u64 every;            /* ops per sample (0: no series) */
    u64 n, cap;
    u64 *extent, *pages4k; /* max within each interval */
    u64 countdown, max_extent, max_pages;
} series;

struct policy {
    const policy_ops *ops;
    int kind;
    int checked;
    int use_oracle;       /* lifetime policies: class source */
    u64 base;             /* where the arena starts: the footprint is counted from there */
    u64 align_now;        /* alignment the op being replayed asks for (checked mode) */
    u64 default_align;    /* what a request without one gets: 16, or 8 (the packer's grain 8) */
    u64 footprint_resident; /* 0: the footprint is the extent (arena and mappings); else it is
                               the pages holding live bytes plus this many bytes (pol_pack.c) */
    pblock *blk;
    size_t blk_cap;
    pages pg;
    lab_metrics m;
    series s;
    treap live;           /* checked mode: live chunks by address */
    const char *failure;  /* the first invariant that failed (checked mode) */
    void *state;
};

policy *pol_new(int kind, int checked, const u64 *params);
policy *pol_clone(const policy *src);
void pol_free(policy *p);
void pol_run(policy *p, const lab_op *ops, size_t n);
u64 pol_footprint(const policy *p);   /* now: the extent, or the resident pages (pol_pack.c) */

/* Helpers for policies (policy.c). */
pblock *pol_block(policy *p, u32 id);
void pol_place(policy *p, u32 id, u64 addr, u64 len, u64 req, int region, u32 aux, u64 hdr);
void pol_unplace(policy *p, u32 id);
void pol_set_top(policy *p, u64 top);
void pol_set_mmapped(policy *p, u64 mmapped);
void pol_fail(policy *p, const char *what);
u64 pol_mmap_base(void);
void pol_realloc_by_move(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock);

extern const policy_ops fit_ops, buddy_ops, seg_ops, glibc_ops, life_ops, pack_ops;
void *fit_new(policy *p, const u64 *params);
void *buddy_new(policy *p, const u64 *params);
void *seg_new(policy *p, const u64 *params);
void *glibc_new(policy *p, const u64 *params);
void *life_new(policy *p, const u64 *params);
void *pack_new(policy *p, const u64 *params);

/* Parameters (params[] indices, all u64; 0 means the default). */
enum { PARAM_NCLASSES,   /* lifetime classes (the last one: everything longer, and never freed) */
       PARAM_SPAN,       /* lifetime policies: span bytes (64 KiB) */
       PARAM_SMALL_MAX,  /* lifetime policies: largest chunk placed in spans (span / 4) */
       PARAM_CLOCK,      /* lifetime clock: 0 events, 1 nanoseconds */
       PARAM_QUANTILE,   /* call-site predictor: quantile of observed classes, per mille (900) */
       PARAM_MAIN_CLASS, /* lifetime policies: classes from this one on share the main heap */
       PARAM_PACK_GRAIN, /* heapcast's packer: 8 or 16 (the default), its fine classes' step */
       PARAM_BOUND0      /* .. + LAB_MAX_CLASSES - 1: class c holds lifetimes < bound[c] */ };
#define LAB_NPARAMS (PARAM_BOUND0 + LAB_MAX_CLASSES)

static inline u64 align_up(u64 x, u64 a) { return (x + a - 1) & ~(a - 1); }
static inline u64 align_down(u64 x, u64 a) { return x & ~(a - 1); }
static inline u64 max_u64(u64 a, u64 b) { return a > b ? a : b; }
static inline u64 min_u64(u64 a, u64 b) { return a < b ? a : b; }
/* The dlmalloc/glibc chunk of a request: 8-byte header, 16-byte granules, 32 bytes at least. */
static inline u64 dl_chunk(u64 size) {
    return size > (~0ULL >> 2) ? (~0ULL >> 2) : max_u64(32, align_up(size + 8, 16));
}
#define DL_HDR 8
#define NONE (~0ULL)

#endif
