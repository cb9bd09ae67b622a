/* Alignment of the blocks heapcast's packer gives (`heapcast run --align 8` against the
 * default): per size 1..64 the least alignment of 2,000 blocks (capped at 16), then how many
 * blocks of the memalign family, asked for 16, were not 16-byte aligned, then the sizes whose
 * malloc returned NULL (none expected). */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
/* The lowest set bit of p's address, capped at 4096. Not truncated to 32 bits first: a block at
 * a multiple of 4 GiB (the packer's region is large and unit-aligned, and ASLR places it) then
 * read as alignment 0, and the test failed as if malloc had returned NULL (stop 33's CI). */
static unsigned low(void *p) {
    uintptr_t a = (uintptr_t)p, l = a & -a;
    return l > 4096 ? 4096u : (unsigned)l;
}
int main(void) {
    if (low((void *)((uintptr_t)1 << 32)) != 4096) return 3;   /* the case above */
    static void *keep[64][2000];
    static char nulls[64 * 24];
    int at = 0;
    for (int s = 1; s <= 64; s++) {
        unsigned least = 4096, none = 0;
        for (int i = 0; i < 2000; i++) {
            keep[s - 1][i] = malloc((size_t)s);
            if (!keep[s - 1][i]) { none++; continue; }
            if (low(keep[s - 1][i]) < least) least = low(keep[s - 1][i]);
        }
        if (none) at += snprintf(nulls + at, sizeof nulls - (size_t)at, " %d:%u", s, none);
        printf("%d:%u ", s, least < 16 ? least : 16);
    }
    unsigned bad = 0;
    for (int s = 1; s <= 64; s++)
        for (int i = 0; i < 200; i++) {
            void *p = memalign(16, (size_t)s), *q = aligned_alloc(16, 64), *r = NULL;
            if (posix_memalign(&r, 16, (size_t)s)) return 2;
            bad += low(p) < 16 || low(q) < 16 || low(r) < 16;
        }
    printf("\nmisaligned %u\nnull%s\n", bad, nulls);
    return 0;
}
