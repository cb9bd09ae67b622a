/* first-fit (address-ordered), next-fit and best-fit: the classic sequential-fit policies over
 * one heap with dlmalloc chunks (8-byte header, 16-byte granules, 32 bytes at least), immediate
 * coalescing, and a wilderness (top) that is used only when no free chunk fits. */
#include <stdlib.h>

#include "lab.h"

#define ARENA_BASE 8   /* chunk start + 8 (the payload) is 16-aligned */

static fitheap *H(policy *p) { return p->state; }

void *fit_new(policy *p, const u64 *params) {
    (void)params;
    fitheap *h = malloc(sizeof(*h));
    if (!h)
        lab_fatal("out of memory");
    int mode = p->kind == POL_FIRST ? FIT_FIRST : p->kind == POL_NEXT ? FIT_NEXT : FIT_BEST;
    fh_init(h, mode, ARENA_BASE, 16, 32);
    p->base = p->m.arena_top = ARENA_BASE;
    return h;
}

static void fit_alloc(policy *p, u32 id, u64 size, u64 align, u8 cls, u64 clock) {
    (void)cls, (void)clock;
    u64 got, s = fh_alloc(H(p), dl_chunk(size), align, DL_HDR, &got);
    pol_set_top(p, H(p)->top);
    pol_place(p, id, s, got, size, REG_ARENA, 0, DL_HDR);
}

static void fit_release(policy *p, u32 id) {
    pblock b = p->blk[id];
    u64 merged;
    pol_unplace(p, id);
    fh_release(H(p), b.addr, b.len, &merged);
    pol_set_top(p, H(p)->top);
}

static void fit_realloc(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    pblock b = p->blk[old];
    u64 len = dl_chunk(size), got = b.len, merged;
    if (len <= b.len) {
        pol_unplace(p, old);
        if (b.len - len >= 32) {   /* give the tail back */
            fh_release(H(p), b.addr + len, b.len - len, &merged);
            got = len;
        }
    } else if (fh_extend(H(p), b.addr, b.len, len, 1, &got)) {
        pol_unplace(p, old);
    } else {
        pol_realloc_by_move(p, old, id, size, cls, clock);
        return;
    }
    p->m.inplace++;
    pol_set_top(p, H(p)->top);
    pol_place(p, id, b.addr, got, size, REG_ARENA, 0, DL_HDR);
}

static void fit_clone(policy *dst, const policy *src) {
    fitheap *h = malloc(sizeof(*h));
    if (!h)
        lab_fatal("out of memory");
    fh_clone(h, src->state);
    dst->state = h;
}

static void fit_free(policy *p) {
    fh_free_all(H(p));
    free(p->state);
}

static void fit_check(policy *p) {
    const char *e = fh_check(H(p));
    if (e)
        pol_fail(p, e);
}

const policy_ops fit_ops = {fit_alloc, fit_release, fit_realloc, fit_clone, fit_free, fit_check};
