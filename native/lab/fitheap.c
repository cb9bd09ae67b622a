/* Free ranges of a simulated address space: first-fit (address-ordered), next-fit and best-fit
 * search, splitting, coalescing, and a wilderness [top, inf) that grows the space (sbrk). Used at
 * 16-byte granularity by the fit policies, glibc and the lifetime classes' spans, and at page
 * granularity as the page allocator of the segregated and lifetime policies. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

void fh_init(fitheap *h, int mode, u64 base, u64 gran, u64 minchunk) {
    memset(h, 0, sizeof(*h));
    h->mode = mode;
    h->gran = gran;
    h->minchunk = minchunk;
    h->top = base;
    h->rover = base;
    h->unbounded = 1;
    tr_init(&h->addr);
    tr_init(&h->size);
    hm_init(&h->by_start);
    hm_init(&h->by_end);
}

void fh_free_all(fitheap *h) {
    tr_free(&h->addr);
    tr_free(&h->size);
    hm_free(&h->by_start);
    hm_free(&h->by_end);
}

void fh_clone(fitheap *dst, const fitheap *src) {
    *dst = *src;
    tr_clone(&dst->addr, &src->addr);
    tr_clone(&dst->size, &src->size);
    hm_clone(&dst->by_start, &src->by_start);
    hm_clone(&dst->by_end, &src->by_end);
}

/* The address-ordered tree serves first-fit and next-fit; best-fit searches by size. */
static inline int uses_addr(const fitheap *h) { return h->mode != FIT_BEST; }

static void ins_range(fitheap *h, u64 s, u64 len) {
    hm_put(&h->by_start, s, len);
    hm_put(&h->by_end, s + len, s);
    if (uses_addr(h))
        tr_insert(&h->addr, s, 0, len);
    if (h->mode == FIT_BEST)
        tr_insert(&h->size, len, s, len);
    h->free_bytes += len;
}

static void del_range(fitheap *h, u64 s, u64 len) {
    hm_del(&h->by_start, s, NULL);
    hm_del(&h->by_end, s + len, NULL);
    if (uses_addr(h))
        tr_erase(&h->addr, s, 0);
    if (h->mode == FIT_BEST)
        tr_erase(&h->size, len, s);
    h->free_bytes -= len;
}

/* The free range [s, s + len) loses its first `cut` bytes (its end stays where it is). */
static void shrink_front(fitheap *h, u64 s, u64 len, u64 cut) {
    hm_del(&h->by_start, s, NULL);
    hm_put(&h->by_start, s + cut, len - cut);
    hm_put(&h->by_end, s + len, s + cut);
    if (uses_addr(h))   /* (its place in address order stays: its end does) */
        tr_set(&h->addr, s, 0, s + cut, 0, len - cut);
    if (h->mode == FIT_BEST) {
        tr_erase(&h->size, len, s);
        tr_insert(&h->size, len - cut, s + cut, len - cut);
    }
    h->free_bytes -= cut;
}

/* The free range [s, s + len) grows to newlen (its start stays where it is). */
static void grow_range(fitheap *h, u64 s, u64 len, u64 newlen) {
    hm_put(&h->by_start, s, newlen);
    hm_del(&h->by_end, s + len, NULL);
    hm_put(&h->by_end, s + newlen, s);
    if (uses_addr(h))
        tr_set(&h->addr, s, 0, s, 0, newlen);
    if (h->mode == FIT_BEST) {
        tr_erase(&h->size, len, s);
        tr_insert(&h->size, newlen, s, newlen);
    }
    h->free_bytes += newlen - len;
}

/* Where an aligned chunk starts inside a range beginning at f: its payload (start + hdr) is a
 * multiple of align, and the part left in front is either nothing or a valid free range. */
static u64 aligned_start(const fitheap *h, u64 f, u64 align, u64 hdr) {
    if (align <= h->gran)
        return f;
    u64 s = align_up(f + hdr, align) - hdr;
    if (s > f && s - f < h->minchunk)
        s += align;
    return s;
}

static u64 search_need(const fitheap *h, u64 len, u64 align) {
    return align <= h->gran ? len : len + align + h->minchunk;
}

u64 fh_alloc_nowild(fitheap *h, u64 len, u64 align, u64 hdr, u64 *got) {
    u64 need = search_need(h, len, align);
    u32 x;
    const tnode *n;
    if (h->mode == FIT_BEST) {
        x = tr_lower_bound(&h->size, need, 0);
        n = h->size.n;
        if (!x)
            return NONE;
    } else {
        x = h->mode == FIT_NEXT ? tr_next_fit(&h->addr, h->rover, need) : 0;
        if (!x)
            x = tr_first_fit(&h->addr, need);
        n = h->addr.n;
        if (!x)
            return NONE;
    }
    u64 f = h->mode == FIT_BEST ? n[x].k2 : n[x].k1, flen = n[x].len;
    u64 s = aligned_start(h, f, align, hdr);
    u64 tail = f + flen - (s + len);
    if (s == f && tail >= h->minchunk) {
        shrink_front(h, f, flen, len);   /* the common case: split off the front */
    } else {
        del_range(h, f, flen);
        if (s > f)
            ins_range(h, f, s - f);
        if (tail >= h->minchunk)
            ins_range(h, s + len, tail);
        else
            len += tail;
    }
    h->rover = s + len;
    *got = len;
    return s;
}

u64 fh_alloc_top(fitheap *h, u64 len, u64 align, u64 hdr, u64 *got) {
    u64 s = aligned_start(h, h->top, align, hdr);
    if (s > h->top)
        ins_range(h, h->top, s - h->top);
    h->top = s + len;
    h->rover = h->top;
    *got = len;
    return s;
}

u64 fh_alloc(fitheap *h, u64 len, u64 align, u64 hdr, u64 *got) {
    u64 s = fh_alloc_nowild(h, len, align, hdr, got);
    if (s != NONE || !h->unbounded)
        return s;
    return fh_alloc_top(h, len, align, hdr, got);
}

static inline int may_join(const fitheap *h, u64 at) { return !h->nocross || at % h->nocross; }

u64 fh_release(fitheap *h, u64 s, u64 len, u64 *merged_len) {
    u64 v, start = s, e = s + len;
    int joined = may_join(h, s) && hm_get(&h->by_end, s, &start);   /* a free range before */
    if (h->unbounded && e == h->top) {
        if (joined)
            del_range(h, start, s - start);
        h->top = start;
        if (h->rover > start)
            h->rover = start;
        *merged_len = 0;
        return start;
    }
    u64 total = e - start;
    if (may_join(h, e) && hm_get(&h->by_start, e, &v)) {   /* and one after */
        del_range(h, e, v);
        total += v;
    }
    if (joined)
        grow_range(h, start, s - start, total);   /* the one before, grown in place */
    else
        ins_range(h, s, total);
    *merged_len = total;
    return start;
}

void fh_add_range(fitheap *h, u64 start, u64 len) {
    u64 m;
    fh_release(h, start, len, &m);
}

void fh_take_range(fitheap *h, u64 start, u64 len) { del_range(h, start, len); }

int fh_extend(fitheap *h, u64 start, u64 len, u64 newlen, int allow_top, u64 *got) {
    u64 e = start + len, extra = newlen - len, v;
    if (h->unbounded && e == h->top) {
        if (!allow_top)
            return 0;
        h->top = start + newlen;
        *got = newlen;
        return 1;
    }
    if (!may_join(h, e) || !hm_get(&h->by_start, e, &v) || v < extra)
        return 0;
    if (v - extra >= h->minchunk) {
        shrink_front(h, e, v, extra);
        *got = newlen;
    } else {
        del_range(h, e, v);
        *got = len + v;
    }
    return 1;
}

/* Whether every node of the subtree at x is a free range of the maps: keyed (start, 0) in the
 * address tree, (length, start) in the size tree. */
static int tree_matches(const fitheap *h, const tnode *n, u32 x, int by_size) {
    if (!x)
        return 1;
    u64 start = by_size ? n[x].k2 : n[x].k1, len;
    return hm_get(&h->by_start, start, &len) && len == n[x].len && (!by_size || n[x].k1 == len) &&
           tree_matches(h, n, n[x].l, by_size) && tree_matches(h, n, n[x].r, by_size);
}

const char *fh_check(const fitheap *h) {
    u64 total = 0, count = 0;
    for (size_t i = 0; i < h->by_start.cap; i++) {
        u64 s = h->by_start.e[i].key, len = h->by_start.e[i].val, v;
        if (s == ~0ULL)
            continue;
        count++;
        total += len;
        if (!len || !hm_get(&h->by_end, s + len, &v) || v != s)
            return "fitheap: free range maps disagree";
        if (h->unbounded && s + len > h->top)
            return "fitheap: free range beyond the wilderness";
        if (h->unbounded && s + len == h->top)
            return "fitheap: free range not merged into the wilderness";
        if (may_join(h, s + len) && hm_get(&h->by_start, s + len, &v))
            return "fitheap: adjacent free ranges not coalesced";
    }
    if (total != h->free_bytes || h->by_end.len != count)
        return "fitheap: free byte count wrong";
    if ((uses_addr(h) && h->addr.count != count) || (h->mode == FIT_BEST && h->size.count != count))
        return "fitheap: tree sizes wrong";
    if ((uses_addr(h) && !tr_check(&h->addr)) || (h->mode == FIT_BEST && !tr_check(&h->size)))
        return "fitheap: tree order or subtree lengths wrong";
    if ((uses_addr(h) && !tree_matches(h, h->addr.n, h->addr.root, 0)) ||
        (h->mode == FIT_BEST && !tree_matches(h, h->size.n, h->size.root, 1)))
        return "fitheap: a tree's range is not the maps' range";
    return NULL;
}
