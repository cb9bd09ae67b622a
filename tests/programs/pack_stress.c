/* Randomized stress of every allocation entry point: THREADS threads run OPS random operations
 * (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign, free) on random sizes from
 * 0 to 1 MB (small, medium and mapped blocks) over a shared table of slots, so that blocks are
 * freed and reallocated by threads other than the one that made them. Every live block is filled
 * with a pattern of its own (a seed in the slot); each operation checks the pattern of the block
 * it touches (realloc: the kept prefix), calloc'd blocks read zero, aligned blocks are aligned,
 * and malloc_usable_size >= the size. Prints "ok OPS-DONE" or the first failure (exit 1).
 * STRESS_MIN_ALIGN=8: blocks not asked for an alignment need only be 8-byte aligned (the
 * packer's --align 8); those of the memalign family must still have theirs. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t min_align = 16;   /* of blocks not asked for an alignment */

#define THREADS 4
#define SLOTS 4096
#define OPS 400000

typedef struct {
    pthread_mutex_t lock;
    unsigned char *p;
    size_t size;
    uint32_t seed;
} slot;

static slot slots[SLOTS];
static _Atomic long done_ops;

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static unsigned char byte_at(uint32_t seed, size_t i) {
    return (unsigned char)((seed * 2654435761u + i * 40503u) >> 13);
}

static void fill(unsigned char *p, size_t from, size_t to, uint32_t seed) {
    for (size_t i = from; i < to; i++)
        p[i] = byte_at(seed, i);
}

static int check(const unsigned char *p, size_t n, uint32_t seed) {
    /* every byte of small blocks; a sample of large ones (every 61st, and the last) */
    size_t step = n > 4096 ? 61 : 1;
    for (size_t i = 0; i < n; i += step)
        if (p[i] != byte_at(seed, i))
            return 0;
    return n == 0 || p[n - 1] == byte_at(seed, n - 1);
}

static void fail(const char *what, size_t size) {
    printf("FAIL %s size %zu\n", what, size);
    fflush(stdout);
    exit(1);
}

static size_t random_size(uint64_t *r) {
    uint64_t x = next(r);
    switch (x % 32) {
    case 0: return 0;
    case 1: return (x >> 8) % 17;                       /* tiny */
    case 2: case 3: case 4: case 5: case 6: case 7: return (x >> 8) % 512;
    case 8: case 9: case 10: return (x >> 8) % 9000;    /* 16-byte and coarser classes */
    case 11: case 12: return (x >> 8) % 100000;
    case 13: return (x >> 8) % 300000;                  /* around the 256 KiB limit */
    case 14: return (x >> 8) % (1u << 20);              /* mappings of their own */
    default: return (x >> 8) % 256;
    }
}

static void *worker(void *arg) {
    uint64_t r = 0x9E3779B97F4A7C15ull ^ (uintptr_t)arg * 7919;
    for (int op = 0; op < OPS / THREADS; op++) {
        slot *s = &slots[next(&r) % SLOTS];
        pthread_mutex_lock(&s->lock);
        if (s->p && !check(s->p, s->size, s->seed))
            fail("pattern", s->size);
        size_t size = random_size(&r);
        uint32_t seed = (uint32_t)next(&r);
        int kind = (int)(next(&r) % 8);
        if (s->p && kind < 3) {                        /* free */
            free(s->p);
            s->p = NULL;
        } else if (s->p && kind < 5) {                 /* realloc: the prefix survives */
            unsigned char *q = realloc(s->p, size);
            if (size == 0) {
                s->p = NULL;                           /* glibc: freed, NULL */
                if (q)
                    fail("realloc(p, 0) returned a block", 0);
            } else {
                if (!q)
                    fail("realloc", size);
                size_t keep = size < s->size ? size : s->size;
                if (!check(q, keep, s->seed))
                    fail("realloc prefix", size);
                if (((uintptr_t)q & (min_align - 1)) || malloc_usable_size(q) < size)
                    fail("realloc alignment/usable", size);
                fill(q, keep, size, s->seed);
                s->p = q;
                s->size = size;
            }
        } else {
            if (s->p)
                free(s->p);
            unsigned char *q;
            size_t align = min_align;
            if (kind == 5) {
                q = calloc(1, size);
                for (size_t i = 0; q && i < size; i += (size > 4096 ? 509 : 1))
                    if (q[i])
                        fail("calloc not zero", size);
            } else if (kind == 6) {
                /* 16 .. 4096, and 1 in 16 above a page (8 .. 64 KiB): the packer passes
                 * those to the allocator beside it, whose blocks are then realloc'd, freed
                 * and asked their size through the same entry points */
                align = (size_t)16 << (next(&r) % 9);
                if (next(&r) % 16 == 0)
                    align = (size_t)8192 << (next(&r) % 4);
                void *v = NULL;
                int which = (int)(next(&r) % 3);
                if (which == 0 && posix_memalign(&v, align, size) != 0)
                    fail("posix_memalign", size);
                if (which == 1)
                    v = aligned_alloc(align, (size + align - 1) / align * align);
                if (which == 2)
                    v = memalign(align, size);
                q = v;
            } else {
                q = malloc(size);
            }
            if (!q)
                fail("allocation", size);
            if (((uintptr_t)q & (align - 1)) || malloc_usable_size(q) < size)
                fail("alignment/usable", size);
            fill(q, 0, size, seed);
            s->p = q;
            s->size = size;
            s->seed = seed;
        }
        pthread_mutex_unlock(&s->lock);
        done_ops++;
    }
    return NULL;
}

int main(void) {
    const char *m = getenv("STRESS_MIN_ALIGN");
    if (m && strcmp(m, "8") == 0)
        min_align = 8;
    for (int i = 0; i < SLOTS; i++)
        pthread_mutex_init(&slots[i].lock, NULL);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].p && !check(slots[i].p, slots[i].size, slots[i].seed))
            fail("final pattern", slots[i].size);
        free(slots[i].p);
    }
    printf("ok %ld\n", (long)done_ops);
    return 0;
}
