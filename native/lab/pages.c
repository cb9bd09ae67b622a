/* Resident pages: the 4 KiB and 2 MiB pages of the simulated address space that hold a byte of a
 * live chunk. A page wholly inside one chunk belongs to that chunk alone, so it is counted without
 * touching any array; only the (at most two) partially covered pages at a chunk's ends keep a
 * per-page count of the live chunks that touch them. O(1) per chunk, whatever its size. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

void pg_init(pages *p) { memset(p, 0, sizeof(*p)); }

void pg_free(pages *p) {
    free(p->cnt4k);
    free(p->cnt2m);
    p->cnt4k = p->cnt2m = NULL;
}

void pg_clone(pages *dst, const pages *src) {
    *dst = *src;
    dst->cnt4k = lab_dup(src->cnt4k, src->cap4k * sizeof(u32));
    dst->cnt2m = lab_dup(src->cnt2m, src->cap2m * sizeof(u32));
}

static void edge(u32 **cnt, size_t *cap, u64 page, int sign, u64 *shared) {
    if (page >= *cap)
        *cnt = lab_grow(*cnt, cap, page + 1, sizeof(u32));
    u32 *c = &(*cnt)[page];
    if (sign > 0) {
        if ((*c)++ == 0)
            (*shared)++;
    } else if (--(*c) == 0) {
        (*shared)--;
    }
}

static void add(u32 **cnt, size_t *cap, u64 *exclusive, u64 *shared, int shift, u64 start, u64 len,
                int sign) {
    u64 size = 1ULL << shift, end = start + len;
    u64 first = start >> shift, last = (end - 1) >> shift;
    if (first == last) {
        if (start % size == 0 && end % size == 0)
            *exclusive += sign > 0 ? 1 : (u64)-1;
        else
            edge(cnt, cap, first, sign, shared);
        return;
    }
    u64 whole = last - first + 1;
    if (start % size) {
        edge(cnt, cap, first, sign, shared);
        whole--;
    }
    if (end % size) {
        edge(cnt, cap, last, sign, shared);
        whole--;
    }
    *exclusive += sign > 0 ? whole : (u64)0 - whole;
}

void pg_add(pages *p, u64 start, u64 len, int sign) {
    if (!len)
        return;
    add(&p->cnt4k, &p->cap4k, &p->exclusive4k, &p->shared4k, 12, start, len, sign);
    add(&p->cnt2m, &p->cap2m, &p->exclusive2m, &p->shared2m, 21, start, len, sign);
}
