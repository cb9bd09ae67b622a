/* glibc: a model of glibc's ptmalloc2 main arena (malloc/malloc.c, 2.3x defaults).
 * - chunks: 8-byte header, 16-byte granules, 32 bytes at least (request2size);
 * - tcache: 64 bins of exact chunk sizes 32..1040, 7 chunks each, LIFO, never coalesced;
 * - fastbins: chunks up to 128 bytes once their tcache bin is full, LIFO, coalesced only by
 *   malloc_consolidate (a large-bin request, a failed search before growing, or a free that
 *   coalesces into a chunk of 64 KiB or more);
 * - other free chunks coalesce at once and are searched best-fit (lowest address among equals;
 *   glibc's unsorted bin and last-remainder heuristics are not modelled);
 * - the top chunk serves what no free chunk can; it grows by sbrk (request + 128 KiB top pad,
 *   page-rounded) and is trimmed when it exceeds the trim threshold;
 * - requests >= the mmap threshold (128 KiB, raised dynamically up to 32 MiB when an mmapped chunk
 *   is freed, trim threshold = 2x) that the top cannot serve get their own mapping (page-rounded,
 *   counted in the footprint while mapped). Only the main arena: threads share it. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define ARENA_BASE 8
#define MINSIZE 32
#define TCACHE_BINS 64
#define TCACHE_COUNT 7
#define MAX_FAST 128
#define NFAST (MAX_FAST / 16 - 1)
#define MIN_LARGE 1024
#define CONSOLIDATE_AT 65536
#define TOP_PAD (128 * 1024)
#define MMAP_MAX_THRESHOLD (32ULL << 20)
#define PAGE 4096

typedef struct {
    fitheap h;           /* free chunks (best-fit) and the top chunk [h.top, brk) */
    u64 brk;
    u64 mmap_threshold, trim_threshold;
    u64 next_mmap, mmapped;
    u64 tcache[TCACHE_BINS][TCACHE_COUNT];
    u8 tcount[TCACHE_BINS];
    u64 *fast[NFAST];
    size_t fast_cap[NFAST], fast_n[NFAST];
    u64 have_fast;
} glibc;

static glibc *G(policy *p) { return p->state; }

void *glibc_new(policy *p, const u64 *params) {
    (void)params;
    glibc *g = calloc(1, sizeof(*g));
    if (!g)
        lab_fatal("out of memory");
    fh_init(&g->h, FIT_BEST, ARENA_BASE, 16, MINSIZE);
    g->brk = p->base = ARENA_BASE;
    g->mmap_threshold = 128 * 1024;
    g->trim_threshold = 128 * 1024;
    g->next_mmap = pol_mmap_base();
    p->m.arena_top = g->brk;
    return g;
}

static void consolidate(glibc *g) {
    u64 merged;
    for (int i = 0; i < NFAST; i++) {
        for (size_t j = 0; j < g->fast_n[i]; j++)
            fh_release(&g->h, g->fast[i][j], (u64)(i + 2) * 16, &merged);
        g->fast_n[i] = 0;
    }
    g->have_fast = 0;
}

static void systrim(policy *p, glibc *g) {
    u64 top_size = g->brk - g->h.top;
    if (top_size <= TOP_PAD + MINSIZE + 1)
        return;
    u64 extra = align_down(top_size - TOP_PAD - MINSIZE - 1, PAGE);
    if (extra) {
        g->brk -= extra;
        pol_set_top(p, g->brk);
    }
}

/* _int_free for an arena chunk: tcache, fastbin, or coalesce (and maybe consolidate and trim). */
static void free_chunk(policy *p, u64 addr, u64 len) {
    glibc *g = G(p);
    u64 tc = (len - MINSIZE) / 16, merged;
    if (tc < TCACHE_BINS && g->tcount[tc] < TCACHE_COUNT) {
        g->tcache[tc][g->tcount[tc]++] = addr;
        return;
    }
    if (len <= MAX_FAST) {
        int f = (int)(len / 16 - 2);
        g->fast[f] = lab_grow(g->fast[f], &g->fast_cap[f], g->fast_n[f] + 1, sizeof(u64));
        g->fast[f][g->fast_n[f]++] = addr;
        g->have_fast++;
        return;
    }
    fh_release(&g->h, addr, len, &merged);
    u64 size = merged ? merged : g->brk - g->h.top;
    if (size >= CONSOLIDATE_AT) {
        if (g->have_fast)
            consolidate(g);
        if (g->brk - g->h.top >= g->trim_threshold)
            systrim(p, g);
    }
}

/* _int_malloc (+ tcache when from_tcache): places block `id`. */
static void alloc_chunk(policy *p, u32 id, u64 size, u64 align, int from_tcache) {
    glibc *g = G(p);
    u64 nb = dl_chunk(size), got, a;
    u64 need = align > 16 ? nb + align + MINSIZE : nb;
    if (align <= 16) {
        u64 tc = (nb - MINSIZE) / 16;
        if (from_tcache && tc < TCACHE_BINS && g->tcount[tc]) {
            pol_place(p, id, g->tcache[tc][--g->tcount[tc]], nb, size, REG_ARENA, 0, DL_HDR);
            return;
        }
        if (nb <= MAX_FAST && g->fast_n[nb / 16 - 2]) {
            int f = (int)(nb / 16 - 2);
            g->have_fast--;
            pol_place(p, id, g->fast[f][--g->fast_n[f]], nb, size, REG_ARENA, 0, DL_HDR);
            return;
        }
        if (nb >= MIN_LARGE && g->have_fast)
            consolidate(g);
    }
    for (;;) {
        a = fh_alloc_nowild(&g->h, nb, align, DL_HDR, &got);
        if (a != NONE) {
            pol_place(p, id, a, got, size, REG_ARENA, 0, DL_HDR);
            return;
        }
        if (g->brk - g->h.top >= need + MINSIZE)
            break;
        if (!g->have_fast)
            break;
        consolidate(g);
    }
    if (g->brk - g->h.top < need + MINSIZE) {
        if (nb >= g->mmap_threshold) {
            /* Page-aligned mapping; the payload follows the 16-byte mmapped-chunk header
             * (memalign: the first aligned address after it). */
            u64 hdr = align > 16 ? align : 16, len = align_up(nb + hdr, PAGE);
            a = align_up(g->next_mmap, align > PAGE ? align : PAGE);
            g->next_mmap = a + len;
            g->mmapped += len;
            pol_set_mmapped(p, g->mmapped);
            pol_place(p, id, a, len, size, REG_MMAP, 0, hdr);
            return;
        }
        g->brk += align_up(need + TOP_PAD + MINSIZE - (g->brk - g->h.top), PAGE);
        pol_set_top(p, g->brk);
    }
    a = fh_alloc_top(&g->h, nb, align, DL_HDR, &got);
    pol_place(p, id, a, got, size, REG_ARENA, 0, DL_HDR);
}

static void glibc_alloc(policy *p, u32 id, u64 size, u64 align, u8 cls, u64 clock) {
    (void)cls, (void)clock;
    alloc_chunk(p, id, size, align, 1);
}

static void glibc_release(policy *p, u32 id) {
    glibc *g = G(p);
    pblock b = p->blk[id];
    pol_unplace(p, id);
    if (b.region == REG_MMAP) {
        g->mmapped -= b.len;
        pol_set_mmapped(p, g->mmapped);
        if (b.len > g->mmap_threshold && b.len <= MMAP_MAX_THRESHOLD) {
            g->mmap_threshold = b.len;
            g->trim_threshold = 2 * b.len;
        }
        return;
    }
    free_chunk(p, b.addr, b.len);
}

static void glibc_realloc(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    (void)cls, (void)clock;
    glibc *g = G(p);
    pblock b = p->blk[old];
    u64 nb = dl_chunk(size), got = b.len;
    if (b.region == REG_MMAP) {   /* mremap */
        u64 len = align_up(nb + b.hdr, PAGE);
        pol_unplace(p, old);
        g->mmapped += len - b.len;
        pol_set_mmapped(p, g->mmapped);
        p->m.inplace++;
        pol_place(p, id, b.addr, len, size, REG_MMAP, 0, b.hdr);
        return;
    }
    if (nb <= b.len) {
        pol_unplace(p, old);
        if (b.len - nb >= MINSIZE) {
            free_chunk(p, b.addr + nb, b.len - nb);
            got = nb;
        }
    } else if (b.addr + b.len == g->h.top) {
        if (g->brk - g->h.top + b.len < nb + MINSIZE) {
            p->m.moves++;
            alloc_chunk(p, id, size, 16, 0);
            glibc_release(p, old);
            return;
        }
        pol_unplace(p, old);
        fh_extend(&g->h, b.addr, b.len, nb, 1, &got);
    } else if (fh_extend(&g->h, b.addr, b.len, nb, 0, &got)) {
        pol_unplace(p, old);
    } else {
        p->m.moves++;
        alloc_chunk(p, id, size, 16, 0);
        glibc_release(p, old);
        return;
    }
    p->m.inplace++;
    pol_place(p, id, b.addr, got, size, REG_ARENA, 0, DL_HDR);
}

static void glibc_clone(policy *dst, const policy *src) {
    const glibc *s = src->state;
    glibc *g = malloc(sizeof(*g));
    if (!g)
        lab_fatal("out of memory");
    *g = *s;
    fh_clone(&g->h, &s->h);
    for (int i = 0; i < NFAST; i++)
        g->fast[i] = lab_dup(s->fast[i], s->fast_cap[i] * sizeof(u64));
    dst->state = g;
}

static void glibc_free(policy *p) {
    glibc *g = G(p);
    fh_free_all(&g->h);
    for (int i = 0; i < NFAST; i++)
        free(g->fast[i]);
    free(g);
}

static void glibc_check(policy *p) {
    glibc *g = G(p);
    const char *e = fh_check(&g->h);
    if (e)
        pol_fail(p, e);
    if (g->h.top > g->brk)
        pol_fail(p, "glibc: the top chunk starts beyond the break");
}

const policy_ops glibc_ops = {glibc_alloc, glibc_release, glibc_realloc, glibc_clone, glibc_free,
                              glibc_check};
