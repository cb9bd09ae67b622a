/* segregated: size classes in slabs, as jemalloc 5 does on 4 KiB pages. Requests up to 14 KiB are
 * rounded to one of 36 classes (8, 16, 32, 48, ... four per doubling) and served from slabs: runs of
 * pages, the least common multiple of page and class size, holding regions of one class only, with
 * no header. A request takes the lowest free region of the lowest-addressed slab of its class that
 * has one; an empty slab goes back to the page allocator at once. Larger requests are rounded to
 * the large classes (four per doubling, whole pages) and get their own run of pages. The page
 * allocator is best-fit over page runs (lowest address among equals), coalescing, growing at top. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define PAGE 4096
#define NCLASSES 36
#define SMALL_MAX 14336
#define LARGE (~0U)

typedef struct {
    u64 start;
    u32 cls, nfree;
    u64 bits[8];   /* 1 = free region; at most 512 regions (class 8 in one page) */
} slab;

typedef struct {
    fitheap pages;
    u32 reg[NCLASSES], nregs[NCLASSES];
    u64 slabsize[NCLASSES];
    u8 class_of[SMALL_MAX / 8 + 1];   /* by (size + 7) / 8 */
    treap nonfull[NCLASSES];          /* slabs with a free region, by (start, slab id) */
    slab *slabs;
    size_t slab_cap, slab_used;
    u32 *free_ids;
    size_t free_cap, free_n;
} seg;

static seg *S(policy *p) { return p->state; }

static u64 gcd(u64 a, u64 b) {
    while (b) {
        u64 t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int lg_floor(u64 x) { return 63 - __builtin_clzll(x); }

/* jemalloc's size class of a request: 8, 16, then multiples of 16 up to 128, then four classes per
 * doubling (each group's spacing is a quarter of its base). */
static u64 size_class(u64 size) {
    if (size <= 8)
        return 8;
    if (size <= 128)
        return align_up(size, 16);
    return align_up(size, 1ULL << (lg_floor(size - 1) - 2));
}

void *seg_new(policy *p, const u64 *params) {
    (void)p, (void)params;
    seg *s = calloc(1, sizeof(*s));
    if (!s)
        lab_fatal("out of memory");
    fh_init(&s->pages, FIT_BEST, 0, PAGE, PAGE);
    int c = 0;
    for (u64 r = 8; r <= SMALL_MAX; r = size_class(r + 1)) {
        s->reg[c] = (u32)r;
        s->slabsize[c] = r / gcd(r, PAGE) * PAGE;
        s->nregs[c] = (u32)(s->slabsize[c] / r);
        tr_init(&s->nonfull[c]);
        c++;
    }
    if (c != NCLASSES)
        lab_fatal("segregated: wrong number of size classes");
    for (u64 i = 0, k = 0; i <= SMALL_MAX / 8; i++) {
        while (s->reg[k] < i * 8)
            k++;
        s->class_of[i] = (u8)k;
    }
    return s;
}

static u32 new_slab(policy *p, int c) {
    seg *s = S(p);
    u32 id;
    if (s->free_n)
        id = s->free_ids[--s->free_n];
    else {
        s->slabs = lab_grow(s->slabs, &s->slab_cap, s->slab_used + 1, sizeof(slab));
        id = (u32)s->slab_used++;
    }
    u64 got, start = fh_alloc(&s->pages, s->slabsize[c], PAGE, 0, &got);
    pol_set_top(p, s->pages.top);
    slab *sl = &s->slabs[id];
    memset(sl, 0, sizeof(*sl));
    sl->start = start;
    sl->cls = (u32)c;
    sl->nfree = s->nregs[c];
    for (u32 i = 0; i < sl->nfree; i++)
        sl->bits[i / 64] |= 1ULL << (i % 64);
    tr_insert(&s->nonfull[c], start, id, 0);
    return id;
}

static void large_alloc(policy *p, u32 id, u64 size, u64 align) {
    seg *s = S(p);
    u64 got, len = size_class(max_u64(size, SMALL_MAX + 1));
    u64 a = fh_alloc(&s->pages, len, max_u64(align, PAGE), 0, &got);
    pol_set_top(p, s->pages.top);
    pol_place(p, id, a, got, size, REG_ARENA, LARGE, 0);
}

static void seg_alloc(policy *p, u32 id, u64 size, u64 align, u8 cls, u64 clock) {
    (void)cls, (void)clock;
    seg *s = S(p);
    u64 want = align > 16 ? align_up(max_u64(size, 1), align) : size;
    if (want > SMALL_MAX || align > PAGE) {
        large_alloc(p, id, size, align);
        return;
    }
    int c = s->class_of[(want + 7) / 8];
    u32 x = tr_min(&s->nonfull[c]);
    u32 sid = x ? (u32)s->nonfull[c].n[x].k2 : new_slab(p, c);
    slab *sl = &s->slabs[sid];
    u32 w = 0;
    while (!sl->bits[w])
        w++;
    u32 i = w * 64 + (u32)__builtin_ctzll(sl->bits[w]);
    sl->bits[w] &= sl->bits[w] - 1;
    if (--sl->nfree == 0)
        tr_erase(&s->nonfull[c], sl->start, sid);
    pol_place(p, id, sl->start + (u64)i * s->reg[c], s->reg[c], size, REG_ARENA, sid, 0);
}

static void seg_release(policy *p, u32 id) {
    seg *s = S(p);
    pblock b = p->blk[id];
    u64 merged;
    pol_unplace(p, id);
    if (b.aux == LARGE) {
        fh_release(&s->pages, b.addr, b.len, &merged);
        pol_set_top(p, s->pages.top);
        return;
    }
    slab *sl = &s->slabs[b.aux];
    int c = (int)sl->cls;
    u64 i = (b.addr - sl->start) / s->reg[c];
    sl->bits[i / 64] |= 1ULL << (i % 64);
    if (++sl->nfree == 1)
        tr_insert(&s->nonfull[c], sl->start, b.aux, 0);
    if (sl->nfree == s->nregs[c]) {
        tr_erase(&s->nonfull[c], sl->start, b.aux);
        fh_release(&s->pages, sl->start, s->slabsize[c], &merged);
        pol_set_top(p, s->pages.top);
        s->free_ids = lab_grow(s->free_ids, &s->free_cap, s->free_n + 1, sizeof(u32));
        s->free_ids[s->free_n++] = b.aux;
    }
}

static void seg_realloc(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    seg *s = S(p);
    pblock b = p->blk[old];
    u64 got = b.len, merged;
    if (b.aux != LARGE) {
        if (size > SMALL_MAX || s->reg[s->class_of[(size + 7) / 8]] != b.len) {
            pol_realloc_by_move(p, old, id, size, cls, clock);
            return;
        }
        pol_unplace(p, old);
    } else {
        u64 len = size_class(max_u64(size, SMALL_MAX + 1));
        if (size <= SMALL_MAX) {
            pol_realloc_by_move(p, old, id, size, cls, clock);
            return;
        }
        if (len <= b.len) {
            pol_unplace(p, old);
            if (len < b.len) {
                fh_release(&s->pages, b.addr + len, b.len - len, &merged);
                got = len;
            }
        } else if (fh_extend(&s->pages, b.addr, b.len, len, 1, &got)) {
            pol_unplace(p, old);
        } else {
            pol_realloc_by_move(p, old, id, size, cls, clock);
            return;
        }
        pol_set_top(p, s->pages.top);
    }
    p->m.inplace++;
    pol_place(p, id, b.addr, got, size, REG_ARENA, b.aux, 0);
}

static void seg_clone(policy *dst, const policy *src) {
    const seg *s = src->state;
    seg *d = malloc(sizeof(*d));
    if (!d)
        lab_fatal("out of memory");
    *d = *s;
    fh_clone(&d->pages, &s->pages);
    for (int c = 0; c < NCLASSES; c++)
        tr_clone(&d->nonfull[c], &s->nonfull[c]);
    d->slabs = lab_dup(s->slabs, s->slab_cap * sizeof(slab));
    d->free_ids = lab_dup(s->free_ids, s->free_cap * sizeof(u32));
    dst->state = d;
}

static void seg_free(policy *p) {
    seg *s = S(p);
    fh_free_all(&s->pages);
    for (int c = 0; c < NCLASSES; c++)
        tr_free(&s->nonfull[c]);
    free(s->slabs);
    free(s->free_ids);
    free(s);
}

static void seg_check(policy *p) {
    const char *e = fh_check(&S(p)->pages);
    if (e)
        pol_fail(p, e);
}

const policy_ops seg_ops = {seg_alloc, seg_release, seg_realloc, seg_clone, seg_free, seg_check};
