/* buddy: the binary buddy system. A chunk is the power of two >= request + 16-byte header (32
 * bytes at least), aligned to its size; a free chunk merges with its buddy (address ^ size) when
 * both are free. Allocation takes the lowest-addressed chunk of the smallest free order that fits,
 * splitting it, so the heap stays compact; the footprint is the highest address ever used. */
#include <stdlib.h>

#include "lab.h"

#define MIN_ORDER 5
#define MAX_ORDER 46
#define BUDDY_HDR 16

typedef struct {
    treap free[MAX_ORDER + 1];   /* free chunks of each order, by address */
    hmap order_of;               /* free chunk address -> order */
    u64 high;                    /* highest address ever used */
} buddy;

static buddy *B(policy *p) { return p->state; }

static int order_for(u64 len) {
    int k = MIN_ORDER;
    while (k < MAX_ORDER && (1ULL << k) < len)
        k++;
    return k;
}

static void put_free(buddy *b, u64 a, int k) {
    tr_insert(&b->free[k], a, 0, 1);
    hm_put(&b->order_of, a, (u64)k);
}

void *buddy_new(policy *p, const u64 *params) {
    (void)p, (void)params;
    buddy *b = calloc(1, sizeof(*b));
    if (!b)
        lab_fatal("out of memory");
    for (int k = 0; k <= MAX_ORDER; k++)
        tr_init(&b->free[k]);
    hm_init(&b->order_of);
    put_free(b, 0, MAX_ORDER);
    return b;
}

static void buddy_alloc(policy *p, u32 id, u64 size, u64 align, u8 cls, u64 clock) {
    (void)cls, (void)clock;
    buddy *b = B(p);
    int k = order_for(size + (align > BUDDY_HDR ? align : BUDDY_HDR)), j = k;
    while (j <= MAX_ORDER && !b->free[j].count)
        j++;
    if (j > MAX_ORDER) {
        pol_fail(p, "buddy: address space exhausted");
        return;
    }
    u64 a = b->free[j].n[tr_min(&b->free[j])].k1;
    tr_erase(&b->free[j], a, 0);
    hm_del(&b->order_of, a, NULL);
    while (j > k) {
        j--;
        put_free(b, a + (1ULL << j), j);
    }
    if (a + (1ULL << k) > b->high)
        b->high = a + (1ULL << k);
    pol_set_top(p, b->high);
    pol_place(p, id, a, 1ULL << k, size, REG_ARENA, (u32)k, align > BUDDY_HDR ? align : BUDDY_HDR);
}

static void buddy_release(policy *p, u32 id) {
    buddy *b = B(p);
    u64 a = p->blk[id].addr, k = p->blk[id].aux, o;
    pol_unplace(p, id);
    while (k < MAX_ORDER) {
        u64 mate = a ^ (1ULL << k);
        if (!hm_get(&b->order_of, mate, &o) || o != k)
            break;
        tr_erase(&b->free[k], mate, 0);
        hm_del(&b->order_of, mate, NULL);
        a &= ~(1ULL << k);
        k++;
    }
    put_free(b, a, (int)k);
}

static void buddy_realloc(policy *p, u32 old, u32 id, u64 size, u8 cls, u64 clock) {
    pblock ob = p->blk[old];
    if (order_for(size + BUDDY_HDR) != (int)ob.aux) {
        pol_realloc_by_move(p, old, id, size, cls, clock);
        return;
    }
    p->m.inplace++;
    pol_unplace(p, old);
    pol_place(p, id, ob.addr, ob.len, size, REG_ARENA, ob.aux, ob.hdr);
}

static void buddy_clone(policy *dst, const policy *src) {
    buddy *b = malloc(sizeof(*b));
    const buddy *s = src->state;
    if (!b)
        lab_fatal("out of memory");
    *b = *s;
    for (int k = 0; k <= MAX_ORDER; k++)
        tr_clone(&b->free[k], &s->free[k]);
    hm_clone(&b->order_of, &s->order_of);
    dst->state = b;
}

static void buddy_free(policy *p) {
    buddy *b = B(p);
    for (int k = 0; k <= MAX_ORDER; k++)
        tr_free(&b->free[k]);
    hm_free(&b->order_of);
    free(b);
}

static void buddy_check(policy *p) {
    buddy *b = B(p);
    u64 n = 0;
    for (int k = 0; k <= MAX_ORDER; k++)
        n += b->free[k].count;
    if (n != b->order_of.len)
        pol_fail(p, "buddy: free lists and the order map disagree");
}

const policy_ops buddy_ops = {buddy_alloc, buddy_release, buddy_realloc, buddy_clone, buddy_free,
                              buddy_check};
