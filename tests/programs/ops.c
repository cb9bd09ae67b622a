/* Calls every hooked heap function once or more, in a fixed order, including the edge cases
 * (realloc(NULL, n), realloc(p, 0), free(NULL), failed allocations). Nothing is printed until all
 * calls are done, so stdio's own buffer allocation comes after them. Then it prints one line per
 * call, in call order: "<op> <addr> <old_addr>" (hex), and a final line with the errno values the
 * failing calls left, which must be the same with and without the recorder.
 * Built with -fno-builtin so that gcc keeps every call as written. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_CALLS 64
static struct { const char *op; void *addr, *old; } calls[MAX_CALLS];
static int ncalls;

static void note(const char *op, void *addr, void *old) {
    calls[ncalls].op = op;
    calls[ncalls].addr = addr;
    calls[ncalls].old = old;
    ncalls++;
}

int main(void) {
    void *p, *q, *a, *b, *c;
    int errs[4];

    p = malloc(100);                       note("malloc", p, 0);
    q = calloc(10, 30);                    note("calloc", q, 0);
    a = realloc(NULL, 50);                 note("realloc", a, 0);       /* realloc(NULL, n) */
    b = realloc(a, 5000);                  note("realloc", b, a);       /* grows: moves */
    a = realloc(b, 4000);                  note("realloc", a, b);       /* shrinks in place */
    c = realloc(a, 0);                     note("realloc", c, a);       /* frees, returns NULL */
    a = reallocarray(NULL, 7, 9);          note("reallocarray", a, 0);
    b = reallocarray(a, 100, 90);          note("reallocarray", b, a);
    if (posix_memalign(&c, 64, 200) != 0) c = NULL;
                                           note("posix_memalign", c, 0);
    free(c);                               note("free", 0, c);
    c = aligned_alloc(256, 512);           note("aligned_alloc", c, 0);
    free(c);                               note("free", 0, c);
    c = memalign(128, 300);                note("memalign", c, 0);
    free(c);                               note("free", 0, c);
    c = valloc(1000);                      note("valloc", c, 0);
    free(c);                               note("free", 0, c);
    c = pvalloc(5000);                     note("pvalloc", c, 0);
    free(c);                               note("free", 0, c);
    free(NULL);                            note("free", 0, 0);

    /* Failures: the result is NULL (or an error code) and errno is set. */
    errno = 0; c = malloc(SIZE_MAX);       note("malloc", c, 0);        errs[0] = errno;
    errno = 0; c = calloc(SIZE_MAX / 2, 4); note("calloc", c, 0);       errs[1] = errno;
    c = (void *)1;
    errs[2] = posix_memalign(&c, 3, 64);   note("posix_memalign", 0, 0); /* EINVAL, c untouched */
    errno = 0; c = realloc(b, SIZE_MAX);   note("realloc", c, b);       errs[3] = errno;
    c = reallocarray(b, SIZE_MAX / 2, 3);  note("reallocarray", c, b);  /* overflow: b stays */

    free(b);                               note("free", 0, b);
    free(q);                               note("free", 0, q);
    /* p is never freed: the one block the trace must show as leaked. */

    for (int i = 0; i < ncalls; i++)
        printf("%s %lx %lx\n", calls[i].op, (unsigned long)calls[i].addr, (unsigned long)calls[i].old);
    printf("errno %d %d %d %d\n", errs[0], errs[1], errs[2], errs[3]);
    return 0;
}
