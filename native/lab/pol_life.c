/* oracle-lifetime and learned-lifetime: placement by lifetime class, LLAMA-style. Blocks of the
 * short-lived classes (below main_class: lifetimes under 4096 events by default) get spans of
 * their own class (64 KiB chunks of the main heap); inside the spans of its class a block is
 * placed best-fit, with dlmalloc chunks (so that the only difference from best-fit is the
 * segregation by lifetime). A block that finds no room in its class's spans may use those of
 * longer-lived span classes (it leaves before its neighbours) before a new span is opened; a span
 * whose blocks are all dead goes back to the main heap. Longer-lived blocks, and blocks above a
 * quarter span, go to the main heap: best-fit, dlmalloc chunks, a wilderness at its top.
 * The oracle is told each block's true class; the learned policy gets a predicted one.
 * The same segregation is layered over first-fit and next-fit too (the _FIRST and _NEXT kinds:
 * main heap and spans use that fit); `heapcast simulate` reports the best of these and of the
 * classic policies as the clairvoyant result (src/heapcast/lab/replay.py, clairvoyant()).
 * Mispredictions: each span has a deadline, the latest time by which its blocks should be dead
 * if their classes were right. A span past its deadline (found when a block is about to be placed
 * in it, or by a sweep every 4096 allocations) moves to the next longer class, its free space
 * then serving that class, as LLAMA does with huge pages; past the span classes, it dissolves
 * into the main heap. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define PAGE 4096
#define LARGE (~0U)
#define SWEEP_EVERY 4096

typedef struct {
    u64 start, len, deadline;
    u32 cls, live;
    u32 dissolved, pad;   /* its blocks outlived the span classes: the span is main heap now */
} span;

typedef struct {
    int k;                         /* number of classes */
    u64 bound[LAB_MAX_CLASSES];    /* class c holds lifetimes < bound[c]; the last is unbounded */
    u64 span_len, small_max;
    int main_class;                /* classes from this one on live in the main heap */
    fitheap pages;                 /* the main heap: spans, large and long-lived blocks */
    fitheap heap[LAB_MAX_CLASSES]; /* free space in each class's spans */
    u64 allocs;                    /* a sweep of expired spans every SWEEP_EVERY allocations */
    span *spans;
    size_t span_cap, span_used;
    u32 *free_ids;
    size_t free_cap, free_n;
    hmap span_of_page;             /* page number -> span id */
} life;

static life *L(policy *p) { return p->state; }

void *life_new(policy *p, const u64 *params) {
    life *l = calloc(1, sizeof(*l));
    if (!l)
        lab_fatal("out of memory");
    l->k = params[PARAM_NCLASSES] ? (int)params[PARAM_NCLASSES] : 1;
    if (l->k > LAB_MAX_CLASSES)
        l->k = LAB_MAX_CLASSES;
    for (int c = 0; c < l->k; c++)
        l->bound[c] = c + 1 < l->k && params[PARAM_BOUND0 + c] ? params[PARAM_BOUND0 + c] : ~0ULL;
    l->span_len = params[PARAM_SPAN] ? align_up(params[PARAM_SPAN], PAGE) : 64 * 1024;
    l->small_max = params[PARAM_SMALL_MAX] ? params[PARAM_SMALL_MAX] : l->span_len / 4;
    if (l->small_max + 64 > l->span_len)
        l->small_max = l->span_len - 64;
    /* the fit of the classic policy this segregation is layered over (POL_* kinds in lab.h) */
    int fit = p->kind == POL_ORACLE_FIRST || p->kind == POL_LEARNED_FIRST ? FIT_FIRST
            : p->kind == POL_ORACLE_NEXT || p->kind == POL_LEARNED_NEXT ? FIT_NEXT : FIT_BEST;
    fh_init(&l->pages, fit, 8, 16, 32);
    p->base = p->m.arena_top = 8;
    l->main_class = params[PARAM_MAIN_CLASS] ? (int)params[PARAM_MAIN_CLASS] : l->k;
    for (int c = 0; c < l->k; c++) {
        fh_init(&l->heap[c], fit, 0, 16, 32);
        l->heap[c].unbounded = 0;
    }
    hm_init(&l->span_of_page);
    return l;
}

static u64 deadline_of(const life *l, int c, u64 clock) {
    return l->bound[c] == ~0ULL || clock > ~0ULL - l->bound[c] ? ~0ULL : clock + l->bound[c];
}

/* A span is a chunk of the main heap whose payload (start + 8) is page-aligned; its own chunks
 * fill [start + 16, end - 16), so that chunk + 8 stays 16-aligned, the free ranges of two spans
 * never touch (they never coalesce across spans), and the pages holding them belong to the span
 * alone (span_of_page). */
static u64 inner_lo(const span *s) { return s->start + 16; }
static u64 inner_hi(const span *s) { return s->start + s->len - 16; }

static void map_pages(life *l, const span *s, u32 id, int add) {
    for (u64 pg = inner_lo(s) / PAGE; pg <= (inner_hi(s) - 1) / PAGE; pg++) {
        if (add)
            hm_put(&l->span_of_page, pg, id);
        else
            hm_del(&l->span_of_page, pg, NULL);
    }
}

static void new_span(policy *p, int c, u64 clock) {
    life *l = L(p);
    u32 id;
    if (l->free_n)
        id = l->free_ids[--l->free_n];
    else {
        l->spans = lab_grow(l->spans, &l->span_cap, l->span_used + 1, sizeof(span));
        id = (u32)l->span_used++;
    }
    u64 got, start = fh_alloc(&l->pages, l->span_len, PAGE, DL_HDR, &got);
    pol_set_top(p, l->pages.top);
    span *s = &l->spans[id];
    *s = (span){start, got, deadline_of(l, c, clock), (u32)c, 0, 0, 0};
    map_pages(l, s, id, 1);
    fh_add_range(&l->heap[c], inner_lo(s), inner_hi(s) - inner_lo(s));
}

static void drop_span(policy *p, u32 id) {
    life *l = L(p);
    span *s = &l->spans[id];
    u64 merged;
    fh_take_range(&l->heap[s->cls], inner_lo(s), inner_hi(s) - inner_lo(s));
    map_pages(l, s, id, 0);
    fh_release(&l->pages, s->start, s->len, &merged);
    pol_set_top(p, l->pages.top);
    l->free_ids = lab_grow(l->free_ids, &l->free_cap, l->free_n + 1, sizeof(u32));
    l->free_ids[l->free_n++] = id;
}

/* Moves a span's free ranges to the next longer class. Chunks start 8 bytes past a multiple
 * of 16, so probing every such address of the span finds them all (rare: no index kept). */
static void reclassify(policy *p, u32 id, u64 clock) {
    life *l = L(p);
    span *s = &l->spans[id];
    fitheap *from = &l->heap[s->cls], *to = &l->heap[s->cls + 1];
    u64 a = inner_lo(s), end = inner_hi(s), v;
    while (a < end) {
        if (hm_get(&from->by_start, a, &v)) {
            fh_take_range(from, a, v);
            fh_add_range(to, a, v);
            a += v;
        } else {
            a += 16;
        }
    }
    s->cls++;
    s->deadline = deadline_of(l, (int)s->cls, clock);
    p->m.reclassified++;
}

/* A span whose blocks outlived the span classes dissolves into the main heap: its free ranges
 * (and its 16-byte ends) become the main heap's; its live blocks are freed there later. */
static void dissolve(policy *p, u32 id) {
    life *l = L(p);
    span *s = &l->spans[id];
    fitheap *from = &l->heap[s->cls];
    u64 a = inner_lo(s), end = inner_hi(s), v, merged;
    while (a < end) {
        if (hm_get(&from->by_start, a, &v)) {
            fh_take_range(from, a, v);
            fh_release(&l->pages, a, v, &merged);
            a += v;
        } else {
            a += 16;
        }
    }
    fh_release(&l->pages, s->start, 16, &merged);
    fh_release(&l->pages, end, 16, &merged);
    map_pages(l, s, id, 0);
    s->dissolved = 1;
    pol_set_top(p, l->pages.top);
    p->m.reclassified++;
}

/* A span past its deadline moves to the next longer class, or into the main heap. */
static void promote(policy *p, u32 id, u64 clock) {
    life *l = L(p);
    if ((int)l->spans[id].cls + 1 >= l->main_class)
        dissolve(p, id);
    else
        reclassify(p, id, clock);
}

static int expired(const life *l, const span *s, u64 clock) {
    return s->live && !s->dissolved && s->deadline < clock && (int)s->cls + 1 < l->k;
}

static void sweep(policy *p, u64 clock) {
    life *l = L(p);
    for (u32 id = 0; id < l->span_used; id++)
        while (expired(l, &l->spans[id], clock))
            promote(p, id, clock);
}

static int small_fits(const life *l, u64 len, u64 align) {
    return len + (align > 16 ? align + 32 : 0) <= l->small_max;
}

static void life_alloc(policy *p, u32 id, u64 size, u64 align, u8 cls, u64 clock) {
    life *l = L(p);
    int c = cls < l->k ? cls : l->k - 1;
    u64 len = dl_chunk(size), got, a, sid;
    if (++l->allocs % SWEEP_EVERY == 0)
        sweep(p, clock);
    if (!small_fits(l, len, align) || c >= l->main_class) {
        a = fh_alloc(&l->pages, len, align, DL_HDR, &got);
        pol_set_top(p, l->pages.top);
        pol_place(p, id, a, got, size, REG_ARENA, LARGE, DL_HDR);
        return;
    }
    for (;;) {
        /* Its own class first, then the free space of longer-lived classes (a shorter-lived
         * block there leaves before its neighbours: no hole outlives them); a new span last. */
        int in = c;
        a = NONE;
        while (in < l->main_class && (a = fh_alloc_nowild(&l->heap[in], len, align, DL_HDR, &got)) == NONE)
            in++;
        if (a == NONE) {
            new_span(p, c, clock);
            continue;
        }
        hm_get(&l->span_of_page, a / PAGE, &sid);
        span *s = &l->spans[sid];
        if (expired(l, s, clock)) {
            u64 merged;
            fh_release(&l->heap[in], a, got, &merged);
            promote(p, (u32)sid, clock);
            continue;
        }
        s->live++;
        u64 d = deadline_of(l, c, clock);
        if (d > s->deadline)
            s->deadline = d;
        pol_place(p, id, a, got, size, REG_ARENA, (u32)sid, DL_HDR);
        return;
    }
}

static void life_release(policy *p, u32 id) {
    life *l = L(p);
    pblock b = p->blk[id];
    u64 merged;
    pol_unplace(p, id);
    if (b.aux == LARGE) {
        fh_release(&l->pages, b.addr, b.len, &merged);
        pol_set_top(p, l->pages.top);
        return;
    }
    span *s = &l->spans[b.aux];
    if (s->dissolved) {
        fh_release(&l->pages, b.addr, b.len, &merged);
        pol_set_top(p, l->pages.top);
        if (--s->live == 0) {
            l->free_ids = lab_grow(l->free_ids, &l->free_cap, l->free_n + 1, sizeof(u32));
            l->free_ids[l->free_n++] = b.aux;
        }
        return;
    }
    fh_release(&l->heap[s->cls], b.addr, b.len, &merged);
    if (--s->live == 0)
        drop_span(p, b.aux);
}

static void life_realloc(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    life *l = L(p);
    pblock b = p->blk[old];
    u64 len = dl_chunk(size), got = b.len, merged;
    int small = small_fits(l, len, 16);
    if (b.aux != LARGE && small) {
        int dissolved = (int)l->spans[b.aux].dissolved;
        fitheap *h = dissolved ? &l->pages : &l->heap[l->spans[b.aux].cls];
        if (len <= b.len) {
            pol_unplace(p, old);
            if (b.len - len >= 32) {
                fh_release(h, b.addr + len, b.len - len, &merged);
                got = len;
            }
        } else if (fh_extend(h, b.addr, b.len, len, dissolved, &got)) {
            pol_unplace(p, old);
        } else {
            pol_realloc_by_move(p, old, id, size, cls, clock);
            return;
        }
        pol_set_top(p, l->pages.top);
    } else if (b.aux == LARGE) {
        if (len <= b.len) {
            pol_unplace(p, old);
            if (b.len - len >= 32) {
                fh_release(&l->pages, b.addr + len, b.len - len, &merged);
                got = len;
            }
        } else if (fh_extend(&l->pages, b.addr, b.len, len, 1, &got)) {
            pol_unplace(p, old);
        } else {
            pol_realloc_by_move(p, old, id, size, cls, clock);
            return;
        }
        pol_set_top(p, l->pages.top);
    } else {
        pol_realloc_by_move(p, old, id, size, cls, clock);
        return;
    }
    p->m.inplace++;
    if (b.aux != LARGE && !l->spans[b.aux].dissolved) {   /* its class extends the deadline */
        span *s = &l->spans[b.aux];
        u64 d = deadline_of(l, cls < l->k ? cls : l->k - 1, clock);
        if (d > s->deadline)
            s->deadline = d;
    }
    pol_place(p, id, b.addr, got, size, REG_ARENA, b.aux, b.hdr);
}

static void life_clone(policy *dst, const policy *src) {
    const life *s = src->state;
    life *l = malloc(sizeof(*l));
    if (!l)
        lab_fatal("out of memory");
    *l = *s;
    fh_clone(&l->pages, &s->pages);
    for (int c = 0; c < s->k; c++)
        fh_clone(&l->heap[c], &s->heap[c]);
    l->spans = lab_dup(s->spans, s->span_cap * sizeof(span));
    l->free_ids = lab_dup(s->free_ids, s->free_cap * sizeof(u32));
    hm_clone(&l->span_of_page, &s->span_of_page);
    dst->state = l;
}

static void life_free(policy *p) {
    life *l = L(p);
    fh_free_all(&l->pages);
    for (int c = 0; c < l->k; c++)
        fh_free_all(&l->heap[c]);
    free(l->spans);
    free(l->free_ids);
    hm_free(&l->span_of_page);
    free(l);
}

static void life_check(policy *p) {
    life *l = L(p);
    const char *e = fh_check(&l->pages);
    for (int c = 0; c < l->k && !e; c++)
        e = fh_check(&l->heap[c]);
    if (e)
        pol_fail(p, e);
}

const policy_ops life_ops = {life_alloc, life_release, life_realloc, life_clone, life_free,
                             life_check};
