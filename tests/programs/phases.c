/* THREADS threads each run PHASES phases of PAIRS malloc/free pairs, sleeping PAUSE_US between
 * phases (time for a chunk drainer to catch up). Prints its pid first, so that a test can watch
 * it. Usage: phases THREADS PHASES PAIRS PAUSE_US. Every malloc and free of the program's own
 * code is exactly THREADS * PHASES * PAIRS of each. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long phases, pairs, pause_us;

static void *worker(void *arg) {
    (void)arg;
    for (long p = 0; p < phases; p++) {
        for (long i = 0; i < pairs; i++) {
            void *q = malloc(16 + (size_t)(i % 64));
            free(q);
        }
        usleep((useconds_t)pause_us);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    int threads = atoi(argv[1]);
    phases = atol(argv[2]);
    pairs = atol(argv[3]);
    pause_us = atol(argv[4]);
    printf("%d\n", (int)getpid());
    fflush(stdout);
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    return 0;
}
