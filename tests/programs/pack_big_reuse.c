/* Blocks over the packer's 256 KiB limit, freed and allocated again: a freed mapping is kept and
 * given to the next big request it fits (at most a quarter larger), calloc's block reads zero
 * though the mapping held other bytes, realloc keeps the contents; a bigger request that none
 * fits gives the smaller kept ones back. Prints one line per check. */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

int main(void) {
    size_t big = 1200 * 1024, small = 1024 * 1024;
    unsigned char *p = malloc(big);
    memset(p, 0xAB, big);
    free(p);
    unsigned char *q = calloc(1, small);
    printf("reused %d\n", q == p);
    printf("calloc zero %d\n", all(q, small, 0));
    printf("usable %d\n", malloc_usable_size(q) >= small);
    memset(q, 0x5C, small);
    unsigned char *r = realloc(q, 3 * small);
    printf("realloc kept %d\n", all(r, small, 0x5C));
    free(r);
    /* a churn of varying sizes: every block zeroed by calloc, every one written whole */
    int zero = 1;
    for (int i = 0; i < 200; i++) {
        size_t n = small + (size_t)(i % 7) * 4096;
        unsigned char *b = (i & 1) ? calloc(1, n) : malloc(n);
        if (i & 1)
            zero &= all(b, n, 0);
        memset(b, i, n);
        free(b);
    }
    printf("churn zero %d\n", zero);
    /* a bigger request that no kept mapping fits: the smaller kept ones are given back */
    unsigned char *a = malloc(small), vec[1];
    memset(a, 1, small);
    free(a);
    unsigned char *b = malloc(4 * small);   /* untouched: if it lies where a was, not resident */
    __asm__ volatile("" : : "r"(b) : "memory");   /* the compiler may not drop the pair */
    int gone = mincore(a, 4096, vec) == -1 ? errno == ENOMEM : !(vec[0] & 1);
    printf("smaller given back %d\n", gone);
    free(b);
    return 0;
}
