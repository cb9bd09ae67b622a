/* Growable arrays, the u64 hash map and the augmented treap used by the policies. All of them are
 * plain arrays (indices, no pointers), so a replay state is cloned with memcpy at a fork. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lab.h"

void lab_fatal(const char *what) {
    fprintf(stderr, "heapcast lab: %s\n", what);
    abort();
}

u64 lab_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (u64)t.tv_sec * 1000000000ULL + (u64)t.tv_nsec;
}

u64 lab_thread_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (u64)t.tv_sec * 1000000000ULL + (u64)t.tv_nsec;
}

void *lab_grow(void *p, size_t *cap, size_t need, size_t elsize) {
    if (need <= *cap)
        return p;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(p, c * elsize);
    if (!q)
        lab_fatal("out of memory");
    memset((char *)q + *cap * elsize, 0, (c - *cap) * elsize);
    *cap = c;
    return q;
}

void *lab_dup(const void *p, size_t bytes) {
    if (!p || !bytes)
        return NULL;
    void *q = malloc(bytes);
    if (!q)
        lab_fatal("out of memory");
    return memcpy(q, p, bytes);
}

/* ---- hash map: keys and values side by side (one cache line per probe) ---- */

#define HM_EMPTY (~0ULL)

static hm_entry *hm_alloc(size_t cap) {
    hm_entry *e = malloc(cap * sizeof(hm_entry));
    if (!e)
        lab_fatal("out of memory");
    for (size_t i = 0; i < cap; i++)
        e[i].key = HM_EMPTY;
    return e;
}

void hm_init(hmap *m) {
    m->cap = 64;
    m->len = 0;
    m->e = hm_alloc(m->cap);
}

void hm_free(hmap *m) {
    free(m->e);
    m->e = NULL;
}

void hm_clone(hmap *dst, const hmap *src) {
    *dst = *src;
    dst->e = lab_dup(src->e, src->cap * sizeof(hm_entry));
}

static void hm_rehash(hmap *m, size_t cap) {
    hm_entry *old = m->e;
    size_t ocap = m->cap;
    m->cap = cap;
    m->e = hm_alloc(cap);
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].key == HM_EMPTY)
            continue;
        size_t j = hm_slot(old[i].key, cap);
        while (m->e[j].key != HM_EMPTY)
            j = (j + 1) & (cap - 1);
        m->e[j] = old[i];
    }
    free(old);
}

int hm_get(const hmap *m, u64 key, u64 *val) {
    size_t j = hm_slot(key, m->cap);
    for (;;) {
        u64 k = m->e[j].key;
        if (k == key) {
            *val = m->e[j].val;
            return 1;
        }
        if (k == HM_EMPTY)
            return 0;
        j = (j + 1) & (m->cap - 1);
    }
}

void hm_put(hmap *m, u64 key, u64 val) {
    if (key == HM_EMPTY)
        lab_fatal("hash map key ~0 is reserved");
    if (2 * (m->len + 1) > m->cap)
        hm_rehash(m, m->cap * 2);
    size_t j = hm_slot(key, m->cap);
    while (m->e[j].key != HM_EMPTY && m->e[j].key != key)
        j = (j + 1) & (m->cap - 1);
    if (m->e[j].key == HM_EMPTY)
        m->len++;
    m->e[j].key = key;
    m->e[j].val = val;
}

int hm_del(hmap *m, u64 key, u64 *val) {
    size_t mask = m->cap - 1, j = hm_slot(key, m->cap);
    while (m->e[j].key != key) {
        if (m->e[j].key == HM_EMPTY)
            return 0;
        j = (j + 1) & mask;
    }
    if (val)
        *val = m->e[j].val;
    /* Backward-shift deletion: no tombstones, probe chains stay short. */
    size_t hole = j;
    for (size_t i = (j + 1) & mask; m->e[i].key != HM_EMPTY; i = (i + 1) & mask) {
        size_t home = hm_slot(m->e[i].key, m->cap);
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->e[hole] = m->e[i];
            hole = i;
        }
    }
    m->e[hole].key = HM_EMPTY;
    m->len--;
    return 1;
}

/* ---- treap ---- */

void tr_init(treap *t) {
    memset(t, 0, sizeof(*t));
    t->n = lab_grow(NULL, &t->cap, 64, sizeof(tnode));
    t->used = 1;   /* node 0: null, maxlen 0 */
    t->rng = 0x2545F491u;
}

void tr_free(treap *t) {
    free(t->n);
    t->n = NULL;
}

void tr_clone(treap *dst, const treap *src) {
    *dst = *src;
    dst->n = lab_dup(src->n, src->cap * sizeof(tnode));
}

static inline int key_lt(u64 a1, u64 a2, u64 b1, u64 b2) { return a1 < b1 || (a1 == b1 && a2 < b2); }

static inline void pull(tnode *n, u32 x) {
    u64 m = n[x].len, a = n[n[x].l].maxlen, b = n[n[x].r].maxlen;
    n[x].maxlen = m > a ? (m > b ? m : b) : (a > b ? a : b);
}

/* Splits x into keys < (k1, k2) and keys >= (k1, k2). */
static void split(tnode *n, u32 x, u64 k1, u64 k2, u32 *lo, u32 *hi) {
    if (!x) {
        *lo = *hi = 0;
        return;
    }
    if (key_lt(n[x].k1, n[x].k2, k1, k2)) {
        split(n, n[x].r, k1, k2, &n[x].r, hi);
        *lo = x;
    } else {
        split(n, n[x].l, k1, k2, lo, &n[x].l);
        *hi = x;
    }
    pull(n, x);
}

static u32 merge(tnode *n, u32 a, u32 b) {
    if (!a || !b)
        return a ? a : b;
    if (n[a].prio > n[b].prio) {
        n[a].r = merge(n, n[a].r, b);
        pull(n, a);
        return a;
    }
    n[b].l = merge(n, a, n[b].l);
    pull(n, b);
    return b;
}

static u32 insert_at(tnode *n, u32 x, u32 k) {
    if (!x)
        return k;
    if (n[k].prio > n[x].prio) {
        split(n, x, n[k].k1, n[k].k2, &n[k].l, &n[k].r);
        pull(n, k);
        return k;
    }
    if (key_lt(n[k].k1, n[k].k2, n[x].k1, n[x].k2))
        n[x].l = insert_at(n, n[x].l, k);
    else
        n[x].r = insert_at(n, n[x].r, k);
    pull(n, x);
    return x;
}

void tr_insert(treap *t, u64 k1, u64 k2, u64 len) {
    u32 k;
    if (t->freelist) {
        k = t->freelist;
        t->freelist = t->n[k].l;
    } else {
        t->n = lab_grow(t->n, &t->cap, t->used + 1, sizeof(tnode));
        k = (u32)t->used++;
    }
    t->rng ^= t->rng << 13;
    t->rng ^= t->rng >> 17;
    t->rng ^= t->rng << 5;
    t->n[k] = (tnode){k1, k2, len, len, 0, 0, t->rng, 0};
    t->root = insert_at(t->n, t->root, k);
    t->count++;
}

static u32 erase_at(tnode *n, u32 x, u64 k1, u64 k2, u32 *gone) {
    if (!x)
        return 0;
    if (n[x].k1 == k1 && n[x].k2 == k2) {
        *gone = x;
        return merge(n, n[x].l, n[x].r);
    }
    if (key_lt(k1, k2, n[x].k1, n[x].k2))
        n[x].l = erase_at(n, n[x].l, k1, k2, gone);
    else
        n[x].r = erase_at(n, n[x].r, k1, k2, gone);
    pull(n, x);
    return x;
}

int tr_erase(treap *t, u64 k1, u64 k2) {
    u32 gone = 0;
    t->root = erase_at(t->n, t->root, k1, k2, &gone);
    if (!gone)
        return 0;
    t->n[gone].l = t->freelist;
    t->freelist = gone;
    t->count--;
    return 1;
}

/* Gives the node keyed (k1, k2) the key (nk1, nk2) and length len, in place: the new key must
 * sort where the old one did (between the node's neighbours in key order). One descent, no
 * rotations, where an erase and an insert rotate twice (fitheap's splits and merges: most of
 * first-fit's time on py_dicts). Returns 0 if there is no such node. */
int tr_set(treap *t, u64 k1, u64 k2, u64 nk1, u64 nk2, u64 len) {
    tnode *n = t->n;
    u32 path[96];
    int d = 0;
    u32 x = t->root;
    while (x && !(n[x].k1 == k1 && n[x].k2 == k2)) {
        if (d == (int)(sizeof path / sizeof path[0])) {   /* deeper than a treap gets: slow way */
            if (!tr_erase(t, k1, k2))
                return 0;
            tr_insert(t, nk1, nk2, len);
            return 1;
        }
        path[d++] = x;
        x = key_lt(k1, k2, n[x].k1, n[x].k2) ? n[x].l : n[x].r;
    }
    if (!x)
        return 0;
    n[x].k1 = nk1;
    n[x].k2 = nk2;
    n[x].len = len;
    u64 before = n[x].maxlen;
    pull(n, x);
    /* An ancestor's maxlen can only change while its child's did. */
    while (d-- > 0 && n[x].maxlen != before) {
        x = path[d];
        before = n[x].maxlen;
        pull(n, x);
    }
    return 1;
}

/* Whether the subtree at x is in key order within (lo, hi) bounds and every maxlen is right;
 * counts its nodes into *count. */
static int check_at(const tnode *n, u32 x, const tnode *lo, const tnode *hi, u32 *count) {
    if (!x)
        return 1;
    if ((lo && !key_lt(lo->k1, lo->k2, n[x].k1, n[x].k2)) ||
        (hi && !key_lt(n[x].k1, n[x].k2, hi->k1, hi->k2)))
        return 0;
    u64 m = max_u64(n[x].len, max_u64(n[n[x].l].maxlen, n[n[x].r].maxlen));
    ++*count;
    return n[x].maxlen == m && check_at(n, n[x].l, lo, &n[x], count) &&
           check_at(n, n[x].r, &n[x], hi, count);
}

int tr_check(const treap *t) {
    u32 count = 0;
    return check_at(t->n, t->root, NULL, NULL, &count) && count == t->count;
}

/* The lowest-addressed node of the subtree at x with len >= need, or 0. */
static u32 first_fit_below(const tnode *n, u32 x, u64 need) {
    if (n[x].maxlen < need)
        return 0;
    for (;;) {
        if (n[n[x].l].maxlen >= need)
            x = n[x].l;
        else if (n[x].len >= need)
            return x;
        else
            x = n[x].r;
    }
}

u32 tr_first_fit(const treap *t, u64 need) { return first_fit_below(t->n, t->root, need); }

static u32 next_fit_at(const tnode *n, u32 x, u64 from, u64 need) {
    while (x && n[x].maxlen >= need) {
        if (n[x].k1 < from) {
            x = n[x].r;
            continue;
        }
        u32 y = next_fit_at(n, n[x].l, from, need);
        if (y)
            return y;
        if (n[x].len >= need)
            return x;
        /* Everything in the right subtree is >= from: plain first fit there. */
        return first_fit_below(n, n[x].r, need);
    }
    return 0;
}

u32 tr_next_fit(const treap *t, u64 from, u64 need) { return next_fit_at(t->n, t->root, from, need); }

u32 tr_lower_bound(const treap *t, u64 k1, u64 k2) {
    const tnode *n = t->n;
    u32 x = t->root, best = 0;
    while (x) {
        if (key_lt(n[x].k1, n[x].k2, k1, k2))
            x = n[x].r;
        else {
            best = x;
            x = n[x].l;
        }
    }
    return best;
}

u32 tr_floor(const treap *t, u64 k1, u64 k2) {
    const tnode *n = t->n;
    u32 x = t->root, best = 0;
    while (x) {
        if (key_lt(k1, k2, n[x].k1, n[x].k2))
            x = n[x].l;
        else {
            best = x;
            x = n[x].r;
        }
    }
    return best;
}

u32 tr_min(const treap *t) {
    u32 x = t->root;
    while (x && t->n[x].l)
        x = t->n[x].l;
    return x;
}
