/* Checks glibc's allocation semantics and prints one line per property (never an address), so
 * that the output under glibc and under another allocator must be identical: alignment, usable
 * sizes, zeroing, content kept by realloc, errno and results of every failing call. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int aligned(void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed);
}
static int same(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) if (p[i] != (unsigned char)(i * 31 + seed)) return 0;
    return 1;
}
static int zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) if (p[i]) return 0;
    return 1;
}

int main(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    static const size_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 24, 100, 255, 256, 1000, 4095, 4096,
                                   5000, 65536, 100000, 262144, 1 << 20, 5 << 20, 40 << 20};
    int ok = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char *p = malloc(n);
        ok &= p != NULL && aligned(p, 16) && malloc_usable_size(p) >= n;
        fill(p, n, 3);
        ok &= same(p, n, 3);
        free(p);
    }
    printf("malloc: non-null, 16-aligned, usable >= requested, writable: %d\n", ok);
    printf("malloc_usable_size(NULL) = %zu\n", malloc_usable_size(NULL));

    ok = 1;
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            size_t n = sizes[i];
            unsigned char *d = malloc(n + 1);
            memset(d, 0xAB, n + 1);
            free(d);                               /* a dirty block that calloc may get back */
            unsigned char *p = calloc(1, n);
            ok &= p != NULL && zero(p, n) && aligned(p, 16);
            free(p);
            p = calloc(n, 3);
            ok &= p != NULL && zero(p, n * 3);
            free(p);
        }
    printf("calloc zeroes every size: %d\n", ok);
    errno = 0;
    void *c = calloc(SIZE_MAX / 2 + 1, 2);
    printf("calloc overflow: %s errno %d\n", c ? "non-null" : "NULL", errno);
    errno = 0;
    c = calloc((size_t)1 << 33, (size_t)1 << 33);
    printf("calloc overflow 2: %s errno %d\n", c ? "non-null" : "NULL", errno);
    c = calloc(0, 10);
    printf("calloc(0, 10): %s\n", c ? "non-null" : "NULL");
    free(c);

    ok = 1;
    unsigned char *r = realloc(NULL, 10);
    fill(r, 10, 5);
    size_t prev = 10;
    static const size_t steps[] = {20, 3000, 100, 70000, 1 << 21, 50, 8, 200000, 16};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        size_t n = steps[i];
        r = realloc(r, n);
        ok &= r != NULL && aligned(r, 16) && same(r, prev < n ? prev : n, 5) && malloc_usable_size(r) >= n;
        fill(r, n, 5);
        prev = n;
    }
    printf("realloc keeps contents through grow/shrink: %d\n", ok);
    errno = 0;
    void *big = realloc(r, SIZE_MAX - 4096);
    printf("realloc(p, huge): %s errno %d, old block intact %d\n", big ? "non-null" : "NULL",
           errno, same(r, prev, 5));
    errno = 0;
    big = reallocarray(r, SIZE_MAX / 4, 8);
    printf("reallocarray overflow: %s errno %d, old block intact %d\n", big ? "non-null" : "NULL",
           errno, same(r, prev, 5));
    r = reallocarray(r, 100, 3);
    printf("reallocarray(p, 100, 3): %s, first 16 kept %d\n", r ? "non-null" : "NULL", same(r, 16, 5));
    errno = 0;
    void *z = realloc(r, 0);
    printf("realloc(p, 0): %s errno %d\n", z ? "non-null" : "NULL", errno);
    z = realloc(NULL, 0);
    printf("realloc(NULL, 0): %s\n", z ? "non-null" : "NULL");
    free(z);

    ok = 1;
    for (size_t a = sizeof(void *); a <= ((size_t)1 << 20); a <<= 1) {
        void *p = (void *)1;
        errno = 1234;
        int rc = posix_memalign(&p, a, 100);
        ok &= rc == 0 && errno == 1234 && aligned(p, a) && malloc_usable_size(p) >= 100;
        free(p);
        p = memalign(a, 3000);
        ok &= p && aligned(p, a);
        free(p);
        p = aligned_alloc(a, a * 2);
        ok &= p && aligned(p, a);
        free(p);
    }
    printf("posix_memalign, memalign, aligned_alloc: aligned for 8..1M: %d\n", ok);
    static const size_t bad[] = {0, 3, 4, 24, 48};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        void *p = (void *)1;
        errno = 1234;
        int rc = posix_memalign(&p, bad[i], 64);
        printf("posix_memalign(align %zu): rc %d errno %d out untouched %d\n", bad[i], rc, errno,
               p == (void *)1);
        if (rc == 0) free(p);
    }
    void *p = (void *)1;
    printf("posix_memalign(huge): rc %d\n", posix_memalign(&p, 64, SIZE_MAX - 100));
    static const size_t odd[] = {3, 24, 100, 1000};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        errno = 0;
        void *m = memalign(odd[i], 64);
        size_t next = 1;
        while (next < odd[i]) next <<= 1;
        printf("memalign(%zu, 64): %s errno %d aligned to next pow2 %d\n", odd[i],
               m ? "non-null" : "NULL", errno, m ? aligned(m, next) : -1);
        free(m);
    }
    errno = 0;
    p = memalign(SIZE_MAX, 16);
    printf("memalign(SIZE_MAX, 16): %s errno %d\n", p ? "non-null" : "NULL", errno);
    errno = 0;
    p = memalign(64, SIZE_MAX - 10);
    printf("memalign(64, huge): %s errno %d\n", p ? "non-null" : "NULL", errno);

    p = valloc(10);
    printf("valloc: page aligned %d\n", p && aligned(p, page));
    free(p);
    p = pvalloc(1);
    printf("pvalloc(1): page aligned %d usable >= page %d\n", p && aligned(p, page),
           p && malloc_usable_size(p) >= page);
    free(p);
    p = pvalloc(0);
    printf("pvalloc(0): %s\n", p ? "non-null" : "NULL");
    free(p);

    errno = 0;
    p = malloc(SIZE_MAX);
    printf("malloc(SIZE_MAX): %s errno %d\n", p ? "non-null" : "NULL", errno);
    errno = 0;
    p = malloc((size_t)PTRDIFF_MAX + 1);
    printf("malloc(PTRDIFF_MAX + 1): %s errno %d\n", p ? "non-null" : "NULL", errno);
    free(NULL);
    printf("free(NULL): ok\n");
    return 0;
}
