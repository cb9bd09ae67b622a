/* 16 threads allocate and free at the same time, and every block is freed by another thread than
 * the one that allocated it: in round r, thread i frees the blocks that thread (i + 1 + r % 15)
 * allocated in round r - 1 while it allocates its own, so addresses move between threads and are
 * reused across them. Of a thread's PER allocations per round, every 4th is a calloc, the others
 * mallocs, and every 8th is followed by a realloc of the new block. The main thread frees what the
 * last round left. Prints the exact number of calls per op. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 16
#define ROUNDS 20
#define PER 256

static void *blocks[2][THREADS][PER];
static pthread_barrier_t barrier;
static atomic_long n_malloc, n_calloc, n_realloc, n_free;

static void *worker(void *arg) {
    int self = (int)(intptr_t)arg;
    uint64_t x = (uint64_t)(self + 1) * 0x9E3779B97F4A7C15ull;
    for (int r = 0; r < ROUNDS; r++) {
        void *(*mine)[PER] = &blocks[r & 1][self];
        void **victims = blocks[(r & 1) ^ 1][(self + 1 + r % (THREADS - 1)) % THREADS];
        for (int k = 0; k < PER; k++) {
            if (victims[k]) { free(victims[k]); victims[k] = NULL; atomic_fetch_add(&n_free, 1); }
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;  /* xorshift */
            size_t size = 16 + (x >> 40) % 512;
            void *p;
            if (k % 4 == 0) { p = calloc(1 + size / 16, 16); atomic_fetch_add(&n_calloc, 1); }
            else { p = malloc(size); atomic_fetch_add(&n_malloc, 1); }
            if (k % 8 == 1) { p = realloc(p, size * 3); atomic_fetch_add(&n_realloc, 1); }
            *(volatile char *)p = 1;
            (*mine)[k] = p;
        }
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}

int main(void) {
    pthread_t *t = malloc(THREADS * sizeof *t);  /* the main thread's first event: thread id 0 */
    atomic_fetch_add(&n_malloc, 1);
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < PER; k++) { free(blocks[(ROUNDS - 1) & 1][i][k]); atomic_fetch_add(&n_free, 1); }
    free(t);
    atomic_fetch_add(&n_free, 1);
    printf("malloc %ld\ncalloc %ld\nrealloc %ld\nfree %ld\n", atomic_load(&n_malloc),
           atomic_load(&n_calloc), atomic_load(&n_realloc), atomic_load(&n_free));
    return 0;
}
