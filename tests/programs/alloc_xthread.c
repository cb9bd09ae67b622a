/* Cross-thread frees under churn: THREADS threads allocate blocks of varied sizes (malloc,
 * calloc, realloc, aligned), stamp them, and hand them through a shared pool where other threads
 * check and free them; threads end (their heaps go away) while their blocks live on in the pool,
 * a thread-specific-data destructor allocates after the thread's allocator state was torn down,
 * and new threads start after others ended. Prints "verified N destructors M"; exits 1 on any
 * corrupted block. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define WAVES 3
#define OPS 20000
#define POOL 4096

typedef struct { uint64_t *p; size_t words; } block;
static block pool[POOL];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long verified, destructors, bad;
static pthread_key_t key;

static void check_and_free(block b) {
    for (size_t i = 0; i < b.words; i++)
        if (b.p[i] != ((uintptr_t)b.p ^ i)) { atomic_fetch_add(&bad, 1); break; }
    atomic_fetch_add(&verified, 1);
    free(b.p);
}

static void on_thread_end(void *v) {
    /* runs after the C library's own thread teardown began: allocate again */
    char *s = malloc(100);
    memset(s, 1, 100);
    s = realloc(s, 3000);
    free(s);
    free(v);
    atomic_fetch_add(&destructors, 1);
}

static void *worker(void *arg) {
    uint64_t x = (uintptr_t)arg * 0x9E3779B97F4A7C15ULL + 1;
    pthread_setspecific(key, malloc(64));
    for (int op = 0; op < OPS; op++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t words = 1 + (x >> 40) % ((x & 7) == 0 ? 4096 : 32);
        uint64_t *p;
        switch (x % 4) {
        case 0: p = calloc(words, 8); break;
        case 1: p = aligned_alloc(64, words * 8 + 64 - (words * 8) % 64); break;
        case 2: p = realloc(malloc(8), words * 8); break;
        default: p = malloc(words * 8);
        }
        if (!p) { atomic_fetch_add(&bad, 1); continue; }
        for (size_t i = 0; i < words; i++) p[i] = (uintptr_t)p ^ i;
        size_t slot = (x >> 20) % POOL;
        pthread_mutex_lock(&lock);
        block old = pool[slot];
        pool[slot] = (block){p, words};
        pthread_mutex_unlock(&lock);
        if (old.p) check_and_free(old);   /* usually another thread's block */
    }
    return NULL;
}

int main(void) {
    pthread_key_create(&key, on_thread_end);
    for (int w = 0; w < WAVES; w++) {
        pthread_t t[THREADS];
        for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(w * THREADS + i + 1));
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    }
    for (int i = 0; i < POOL; i++) if (pool[i].p) check_and_free(pool[i]);
    printf("verified %ld destructors %ld\n", (long)verified, (long)destructors);
    return bad ? 1 : 0;
}
