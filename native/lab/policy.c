/* What every policy shares: the per-block table, page and footprint accounting, peaks, the
 * footprint series, the checked mode (no two live chunks overlap, every chunk lies inside the
 * footprint) and the op loop. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define MMAP_BASE (1ULL << 46)   /* mmapped chunks live above the arena (policy-specific) */

policy *pol_new(int kind, int checked, const u64 *params) {
    policy *p = calloc(1, sizeof(*p));
    if (!p)
        lab_fatal("out of memory");
    p->kind = kind;
    p->checked = checked;
    p->default_align = 16;
    pg_init(&p->pg);
    tr_init(&p->live);
    switch (kind) {
    case POL_FIRST: case POL_NEXT: case POL_BEST:
        p->ops = &fit_ops;
        p->state = fit_new(p, params);
        break;
    case POL_BUDDY:
        p->ops = &buddy_ops;
        p->state = buddy_new(p, params);
        break;
    case POL_SEG:
        p->ops = &seg_ops;
        p->state = seg_new(p, params);
        break;
    case POL_GLIBC:
        p->ops = &glibc_ops;
        p->state = glibc_new(p, params);
        break;
    case POL_ORACLE: case POL_LEARNED: case POL_ORACLE_FIRST: case POL_ORACLE_NEXT:
    case POL_LEARNED_FIRST: case POL_LEARNED_NEXT:
        p->use_oracle = kind == POL_ORACLE || kind == POL_ORACLE_FIRST || kind == POL_ORACLE_NEXT;
        p->ops = &life_ops;
        p->state = life_new(p, params);
        break;
    case POL_PACK: case POL_PACK_ORACLE: case POL_PACK_LEARNED:
        p->use_oracle = kind == POL_PACK_ORACLE;
        p->ops = &pack_ops;
        p->state = pack_new(p, params);
        break;
    default:
        free(p);
        return NULL;
    }
    return p;
}

policy *pol_clone(const policy *src) {
    policy *p = malloc(sizeof(*p));
    if (!p)
        lab_fatal("out of memory");
    *p = *src;
    p->blk = lab_dup(src->blk, src->blk_cap * sizeof(pblock));
    pg_clone(&p->pg, &src->pg);
    tr_clone(&p->live, &src->live);
    p->s.extent = lab_dup(src->s.extent, src->s.cap * sizeof(u64));
    p->s.pages4k = lab_dup(src->s.pages4k, src->s.cap * sizeof(u64));
    src->ops->clone_state(p, src);
    return p;
}

void pol_free(policy *p) {
    if (!p)
        return;
    p->ops->free_state(p);
    free(p->blk);
    pg_free(&p->pg);
    tr_free(&p->live);
    free(p->s.extent);
    free(p->s.pages4k);
    free(p);
}

void pol_fail(policy *p, const char *what) {
    if (!p->m.check_failures++)
        p->failure = what;
}

pblock *pol_block(policy *p, u32 id) {
    if (id >= p->blk_cap)
        p->blk = lab_grow(p->blk, &p->blk_cap, (size_t)id + 1, sizeof(pblock));
    return &p->blk[id];
}

void pol_set_top(policy *p, u64 top) {
    if (p->checked && top < p->m.arena_top && p->live.root) {
        u32 x = p->live.root;
        while (p->live.n[x].r)
            x = p->live.n[x].r;
        if (p->live.n[x].k1 + p->live.n[x].len > top)
            pol_fail(p, "the footprint shrank below a live chunk");
    }
    p->m.arena_top = top;
}

void pol_set_mmapped(policy *p, u64 mmapped) { p->m.mmapped = mmapped; }

static void mmap_pages(policy *p, u64 len, int sign) {
    u64 n4 = (len + 4095) >> 12, n2 = (len + (1 << 21) - 1) >> 21;
    p->pg.exclusive4k += sign > 0 ? n4 : (u64)0 - n4;
    p->pg.exclusive2m += sign > 0 ? n2 : (u64)0 - n2;
}

void pol_place(policy *p, u32 id, u64 addr, u64 len, u64 req, int region, u32 aux, u64 hdr) {
    pblock *b = pol_block(p, id);
    if (p->checked) {
        if (b->live)
            pol_fail(p, "a block id was placed twice");
        if (hdr >= len || req > len - hdr)
            pol_fail(p, "a chunk is smaller than its header and request");
        /* The default alignment is 16, or 8 for requests of 8 bytes or less (what malloc
         * promises: enough for any object that fits). */
        u64 want = p->align_now == 16 && req <= 8 ? 8 : p->align_now;
        if ((addr + hdr) % want)
            pol_fail(p, "a block is not aligned as asked");
        if (region == REG_ARENA) {
            if (addr + len > p->m.arena_top)
                pol_fail(p, "a chunk lies outside the footprint");
            u32 f = tr_floor(&p->live, addr, ~0ULL), g = tr_lower_bound(&p->live, addr, 0);
            if ((f && p->live.n[f].k1 + p->live.n[f].len > addr) || (g && p->live.n[g].k1 < addr + len))
                pol_fail(p, "two live chunks overlap");
            tr_insert(&p->live, addr, 0, len);
        }
    }
    *b = (pblock){addr, len, req, aux, (u32)hdr, (u8)region, 1, {0}};
    p->m.live_bytes += req;
    p->m.chunk_bytes += len;
    if (region == REG_MMAP)
        mmap_pages(p, len, 1);
    else
        pg_add(&p->pg, addr, len, 1);
}

void pol_unplace(policy *p, u32 id) {
    pblock *b = &p->blk[id];
    if (p->checked) {
        if (!b->live)
            pol_fail(p, "a dead block was released");
        if (b->region == REG_ARENA && !tr_erase(&p->live, b->addr, 0))
            pol_fail(p, "a released chunk was not live");
    }
    b->live = 0;
    p->m.live_bytes -= b->req;
    p->m.chunk_bytes -= b->len;
    if (b->region == REG_MMAP)
        mmap_pages(p, b->len, -1);
    else
        pg_add(&p->pg, b->addr, b->len, -1);
}

void pol_realloc_by_move(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    p->m.moves++;
    p->ops->alloc(p, id, size, p->default_align, cls, clock);
    p->ops->release(p, old);
}

u64 pol_footprint(const policy *p) {
    if (!p->footprint_resident)
        return p->m.arena_top - p->base + p->m.mmapped;
    u64 p4 = pg_4k(&p->pg);
    return p4 ? (p4 << 12) + p->footprint_resident : 0;
}

static void note_peaks(policy *p) {
    lab_metrics *m = &p->m;
    u64 fp = pol_footprint(p), p4 = pg_4k(&p->pg);
    if (fp > m->peak_footprint) {
        m->peak_footprint = fp;
        m->peak_live_at_footprint = m->live_bytes;
        m->internal_at_peak = m->chunk_bytes - m->live_bytes;
    }
    if (p4 > m->peak_pages4k)
        m->peak_pages4k = p4;
    if (pg_2m(&p->pg) > m->peak_pages2m)
        m->peak_pages2m = pg_2m(&p->pg);
    if (m->chunk_bytes > m->peak_chunk_bytes)
        m->peak_chunk_bytes = m->chunk_bytes;
    if (m->mmapped > m->peak_mmapped)
        m->peak_mmapped = m->mmapped;
    m->sum_footprint16 += fp >> 4;
    m->sum_pages4k += p4;
    series *s = &p->s;
    if (s->every) {
        if (fp > s->max_extent)
            s->max_extent = fp;
        if (p4 > s->max_pages)
            s->max_pages = p4;
        if (--s->countdown == 0) {
            if (s->n == s->cap) {
                s->cap = s->cap ? 2 * s->cap : 256;
                s->extent = realloc(s->extent, s->cap * sizeof(u64));
                s->pages4k = realloc(s->pages4k, s->cap * sizeof(u64));
                if (!s->extent || !s->pages4k)
                    lab_fatal("out of memory");
            }
            s->extent[s->n] = s->max_extent;
            s->pages4k[s->n] = s->max_pages;
            s->n++;
            s->countdown = s->every;
            s->max_extent = s->max_pages = 0;
        }
    }
}

void pol_run(policy *p, const lab_op *ops, size_t n) {
    u64 t0 = lab_thread_ns();
    for (size_t i = 0; i < n; i++) {
        const lab_op *o = &ops[i];
        u8 cls = p->use_oracle ? o->cls_oracle : o->cls_pred;
        u64 align = o->align_log2 ? 1ULL << o->align_log2 : p->default_align;
        p->align_now = o->kind == OP_ALLOC ? align : p->default_align;
        switch (o->kind) {
        case OP_ALLOC:
            p->ops->alloc(p, o->id, o->size, align, cls, o->clock);
            break;
        case OP_FREE:
            p->ops->release(p, o->id);
            break;
        case OP_REALLOC:
            p->ops->realloc(p, o->old, o->id, o->size, cls, o->clock);
            break;
        }
        note_peaks(p);
    }
    p->m.ops += n;
    if (p->checked && p->ops->check)
        p->ops->check(p);
    p->m.ns += lab_thread_ns() - t0;
}

u64 pol_mmap_base(void) { return MMAP_BASE; }
