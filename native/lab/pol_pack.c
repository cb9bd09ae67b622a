/* heapcast: the lab's model of heapcast's own packing allocator (native/alloc/pack.c), so that the
 * placement a compiled policy carries is judged on the allocator `heapcast run` will use.
 *
 * What it keeps of the packer: its size classes (every 16 bytes up to 8 KiB, or every 8 with
 * PARAM_PACK_GRAIN 8, then 32 per power of two up to 256 KiB); spans of 64 KiB units (more, a
 * power of two, so that a span holds >= 8 blocks) that belong to one (lifetime group, class); a
 * block takes the lowest free block of a span from the fullest non-full fullness list (eighths);
 * a class keeps one empty span, further empty spans go back to a pool any class can take; blocks
 * over 256 KiB (or asking for more than page alignment) get mappings of their own, page-rounded,
 * and at free up to four of them (16 MiB) are kept for the next big request that they fit (at
 * most a quarter larger), all given back whenever a span is taken, and those smaller than a big
 * request that none fits when it gets a new mapping.
 * Its footprint is what the packer keeps resident, not an extent: the pages that hold a byte of a
 * live block, plus the kept mappings, plus its budget of free-but-resident pages
 * (HEAPCAST_PACK_DIRTY, 256 KiB), which the packer reaches between sweeps. What it leaves out:
 * the per-thread caches (at most 8 KiB of free blocks per class and thread) and the side tables
 * (32 bytes per 64 KiB unit).
 *
 * Kinds: POL_PACK puts every block in one group (`--policy none`, and a policy without lifetime
 * groups); POL_PACK_ORACLE and POL_PACK_LEARNED put a block in the group of its true or predicted
 * lifetime class, as the allocator's default heap map does (classes 0-1, 2-3, the rest). */
#include <stdlib.h>
#include <string.h>

#include "lab.h"
#include "../alloc/pack_params.h"   /* the packer's constants: the model keeps in step */

/* The allocator's default heap map (alloc.c, ha_heap_of): class -> group. */
static const u8 group_of_class[] = PACK_HEAP_MAP;

#define PAGE 4096
#define UNIT ((u64)1 << PACK_UNIT_LOG)
#define PACK_MAX ((u64)1 << PACK_MAX_LOG)
#define MAX_CLASSES ((1 << (PACK_FINE_LOG - 3)) + ((PACK_MAX_LOG - PACK_FINE_LOG) << PACK_STEPS_LOG))
#define GROUPS 3
#define L_EMPTY PACK_NB
#define L_FULL (PACK_NB + 1)
#define BWORDS (UNIT / 16 / 64)   /* bitmap words of a span: at most 4096 blocks */
#define BIG (~0U)


typedef struct {              /* per unit; meaningful at a span's first unit */
    u32 next, prev;           /* its list (unit index + 1; 0: none) */
    u32 nblocks, live;
    u16 cls;
    u8 group, nlog, list, pad[3];
} pspan;

typedef struct {
    u32 list[PACK_NB + 1];         /* heads: fullness lists, then empty spans */
    u32 nempty;
} pclass;

typedef struct {
    unsigned grain_log, nfine, nclasses, grouped;
    u32 size[MAX_CLASSES];
    u8 nlog[MAX_CLASSES];
    pclass cls[GROUPS][MAX_CLASSES];
    pspan *spans;             /* by unit index */
    u64 *bits;                /* BWORDS per unit index, 1 = free */
    size_t cap;               /* units allocated in spans[] and bits[] */
    u32 top;                  /* units handed out so far */
    u32 pool[PACK_MAX_NLOG + 1];   /* free spans by nlog (unit index + 1) */
    u64 next_map, mapped;     /* big blocks: the next mapping's address, bytes mapped */
    u64 kept[PACK_BIG_CACHE];      /* freed big mappings kept (lengths), oldest first */
    unsigned nkept;
    u64 kept_bytes;
} pack;

static pack *P(policy *p) { return p->state; }

static unsigned class_of(const pack *k, u64 size) {
    if (size <= (1ULL << PACK_FINE_LOG)) {
        u64 min_block = 1ULL << k->grain_log;
        return (unsigned)(((size < min_block ? min_block : size) + min_block - 1) >> k->grain_log) - 1;
    }
    unsigned e = 63 - (unsigned)__builtin_clzll(size - 1), sh = e - PACK_STEPS_LOG;
    unsigned q = (unsigned)((size - (1ULL << e) + (1ULL << sh) - 1) >> sh);
    return k->nfine + ((e - PACK_FINE_LOG) << PACK_STEPS_LOG) + q - 1;
}

void *pack_new(policy *p, const u64 *params) {
    pack *k = calloc(1, sizeof(*k));
    if (!k)
        lab_fatal("out of memory");
    k->grain_log = params[PARAM_PACK_GRAIN] == 8 ? 3 : 4;
    if (k->grain_log == 3)
        p->default_align = 8;   /* a 24-byte block is 8-byte aligned, as mimalloc's are */
    k->grouped = p->kind != POL_PACK;
    k->nfine = 1u << (PACK_FINE_LOG - k->grain_log);
    k->nclasses = k->nfine + ((PACK_MAX_LOG - PACK_FINE_LOG) << PACK_STEPS_LOG);
    for (unsigned c = 0; c < k->nclasses; c++) {
        u64 size;
        if (c < k->nfine) {
            size = (u64)(c + 1) << k->grain_log;
        } else {
            unsigned e = PACK_FINE_LOG + ((c - k->nfine) >> PACK_STEPS_LOG);
            unsigned q = ((c - k->nfine) & ((1u << PACK_STEPS_LOG) - 1)) + 1;
            size = (1ULL << e) + ((u64)q << (e - PACK_STEPS_LOG));
        }
        k->size[c] = (u32)size;
        unsigned nlog = 0;
        while (nlog < PACK_MAX_NLOG && ((UNIT << nlog) / size) < PACK_MIN_SPAN_BLOCKS)
            nlog++;
        k->nlog[c] = (u8)nlog;
    }
    k->next_map = pol_mmap_base();
    p->footprint_resident = PACK_DIRTY_BUDGET;
    return k;
}

static pspan *SP(pack *k, u32 h1) { return &k->spans[h1 - 1]; }

/* The kept mappings count as resident (the footprint's extra bytes beside the live pages). */
static void set_kept(policy *p, pack *k, u64 bytes) {
    k->kept_bytes = bytes;
    p->footprint_resident = PACK_DIRTY_BUDGET + bytes;
}

static void kept_drop(pack *k, unsigned i) {
    memmove(&k->kept[i], &k->kept[i + 1], (k->nkept - i - 1) * sizeof k->kept[0]);
    k->nkept--;
}

static void list_push(pclass *c, pack *k, unsigned l, u32 h1) {
    pspan *s = SP(k, h1);
    s->list = (u8)l;
    if (l == L_FULL)
        return;
    s->prev = 0;
    s->next = c->list[l];
    if (s->next)
        SP(k, s->next)->prev = h1;
    c->list[l] = h1;
}

static void list_remove(pclass *c, pack *k, u32 h1) {
    pspan *s = SP(k, h1);
    if (s->list == L_FULL)
        return;
    if (s->prev)
        SP(k, s->prev)->next = s->next;
    else
        c->list[s->list] = s->next;
    if (s->next)
        SP(k, s->next)->prev = s->prev;
}

static void relist(pclass *c, pack *k, u32 h1) {
    pspan *s = SP(k, h1);
    unsigned l = s->live == 0 ? L_EMPTY : s->live == s->nblocks ? L_FULL
                 : (unsigned)((u64)s->live * PACK_NB / s->nblocks);
    if (l != s->list) {
        list_remove(c, k, h1);
        list_push(c, k, l, h1);
    }
}

static u32 span_new(policy *p, pclass *c, unsigned cls, unsigned group) {
    pack *k = P(p);
    unsigned nlog = k->nlog[cls];
    u32 h1 = k->pool[nlog];
    if (h1) {
        k->pool[nlog] = SP(k, h1)->next;
    } else {
        h1 = k->top + 1;
        k->top += 1u << nlog;
        if (k->top > k->cap) {
            size_t old = k->cap;
            k->spans = lab_grow(k->spans, &k->cap, k->top, sizeof(pspan));
            k->bits = realloc(k->bits, k->cap * BWORDS * sizeof(u64));
            if (!k->bits)
                lab_fatal("out of memory");
            memset(k->spans + old, 0, (k->cap - old) * sizeof(pspan));
        }
        pol_set_top(p, (u64)k->top << PACK_UNIT_LOG);
    }
    if (k->nkept) {   /* the packer takes memory: the kept mappings go back */
        k->nkept = 0;
        set_kept(p, k, 0);
    }
    pspan *s = SP(k, h1);
    u64 n = ((UNIT << nlog) / k->size[cls]);
    s->nblocks = (u32)(n < BWORDS * 64 ? n : BWORDS * 64);
    s->live = 0;
    s->cls = (u16)cls;
    s->group = (u8)group;
    s->nlog = (u8)nlog;
    u64 *bm = &k->bits[(size_t)(h1 - 1) * BWORDS];
    memset(bm, 0, BWORDS * sizeof(u64));
    for (u32 w = 0; w < s->nblocks / 64; w++)
        bm[w] = ~0ULL;
    if (s->nblocks % 64)
        bm[s->nblocks / 64] = (1ULL << (s->nblocks % 64)) - 1;
    list_push(c, k, L_EMPTY, h1);
    c->nempty++;
    return h1;
}

static void big_alloc(policy *p, u32 id, u64 size, u64 align) {
    pack *k = P(p);
    u64 len = align_up(max_u64(size, 1), PAGE);
    if (align <= PAGE) {   /* the smallest kept mapping that fits, at most a quarter larger */
        unsigned best = PACK_BIG_CACHE;
        for (unsigned i = 0; i < k->nkept; i++)
            if (k->kept[i] >= len && k->kept[i] - len <= len / 4 &&
                (best == PACK_BIG_CACHE || k->kept[i] < k->kept[best]))
                best = i;
        if (best != PACK_BIG_CACHE) {
            len = k->kept[best];
            set_kept(p, k, k->kept_bytes - len);
            kept_drop(k, best);
        } else {   /* a new mapping: the kept ones too small for it go back */
            u64 kept = k->kept_bytes;
            for (unsigned i = k->nkept; i-- > 0;)
                if (k->kept[i] < len) {
                    kept -= k->kept[i];
                    kept_drop(k, i);
                }
            set_kept(p, k, kept);
        }
    }
    u64 a = align_up(k->next_map, max_u64(align, PAGE));
    k->next_map = a + len + PAGE;   /* a guard gap: mappings never touch */
    k->mapped += len;
    pol_set_mmapped(p, k->mapped);
    pol_place(p, id, a, len, size, REG_MMAP, BIG, 0);
}

static void pack_alloc(policy *p, u32 id, u64 size, u64 align, u8 cls, u64 clock) {
    (void)clock;
    pack *k = P(p);
    if (size > PACK_MAX || align > PAGE) {
        big_alloc(p, id, size, align);
        return;
    }
    unsigned c = class_of(k, max_u64(size, 1));
    /* a class's blocks are aligned to the lowest set bit of its size */
    if (align > (k->size[c] & -k->size[c])) {
        while (c < k->nclasses && k->size[c] % align)
            c++;
        if (c == k->nclasses) {
            big_alloc(p, id, size, align);
            return;
        }
    }
    unsigned g = k->grouped && cls < sizeof group_of_class ? group_of_class[cls] : 0;
    pclass *pc = &k->cls[g][c];
    u32 h1 = 0;
    for (int l = PACK_NB - 1; l >= 0 && !h1; l--)
        h1 = pc->list[l];
    if (!h1)
        h1 = pc->list[L_EMPTY] ? pc->list[L_EMPTY] : span_new(p, pc, c, g);
    pspan *s = SP(k, h1);
    u64 *bm = &k->bits[(size_t)(h1 - 1) * BWORDS];
    u32 w = 0;
    while (!bm[w])
        w++;
    u32 i = w * 64 + (u32)__builtin_ctzll(bm[w]);
    bm[w] &= bm[w] - 1;
    if (s->live++ == 0)
        pc->nempty--;
    relist(pc, k, h1);
    pol_place(p, id, ((u64)(h1 - 1) << PACK_UNIT_LOG) + (u64)i * k->size[c], k->size[c], size,
              REG_ARENA, h1, 0);
}

static void pack_release(policy *p, u32 id) {
    pack *k = P(p);
    pblock b = p->blk[id];
    pol_unplace(p, id);
    if (b.aux == BIG) {
        k->mapped -= b.len;
        pol_set_mmapped(p, k->mapped);
        if (b.len <= PACK_BIG_CACHE_MAX) {   /* kept; the oldest go while over the bounds */
            u64 kept = k->kept_bytes;
            while (k->nkept && (k->nkept == PACK_BIG_CACHE || kept + b.len > PACK_BIG_CACHE_MAX)) {
                kept -= k->kept[0];
                kept_drop(k, 0);
            }
            k->kept[k->nkept++] = b.len;
            set_kept(p, k, kept + b.len);
        }
        return;
    }
    u32 h1 = b.aux;
    pspan *s = SP(k, h1);
    pclass *pc = &k->cls[s->group][s->cls];
    u64 i = (b.addr - ((u64)(h1 - 1) << PACK_UNIT_LOG)) / k->size[s->cls];
    k->bits[(size_t)(h1 - 1) * BWORDS + i / 64] |= 1ULL << (i % 64);
    s->live--;
    relist(pc, k, h1);
    if (s->live == 0 && ++pc->nempty > 1) {   /* beyond the class's one empty span: the pool */
        list_remove(pc, k, h1);
        pc->nempty--;
        s->next = k->pool[s->nlog];
        k->pool[s->nlog] = h1;
    }
}

static void pack_realloc(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    pack *k = P(p);
    pblock b = p->blk[old];
    if (b.aux == BIG && size > PACK_MAX) {   /* mremap: the mapping grows or shrinks */
        u64 len = align_up(size, PAGE);
        pol_unplace(p, old);
        k->mapped = k->mapped - b.len + len;
        pol_set_mmapped(p, k->mapped);
        p->m.inplace++;
        pol_place(p, id, b.addr, len, size, REG_MMAP, BIG, 0);
        return;
    }
    if (b.aux != BIG && size <= PACK_MAX && k->size[class_of(k, max_u64(size, 1))] == b.len) {
        pol_unplace(p, old);
        p->m.inplace++;
        pol_place(p, id, b.addr, b.len, size, REG_ARENA, b.aux, 0);
        return;
    }
    pol_realloc_by_move(p, old, id, size, cls, clock);
}

static void pack_clone(policy *dst, const policy *src) {
    const pack *k = src->state;
    pack *d = malloc(sizeof(*d));
    if (!d)
        lab_fatal("out of memory");
    *d = *k;
    d->spans = lab_dup(k->spans, k->cap * sizeof(pspan));
    d->bits = lab_dup(k->bits, k->cap * BWORDS * sizeof(u64));
    dst->state = d;
}

static void pack_free(policy *p) {
    pack *k = P(p);
    free(k->spans);
    free(k->bits);
    free(k);
}

const policy_ops pack_ops = {pack_alloc, pack_release, pack_realloc, pack_clone, pack_free, NULL};
