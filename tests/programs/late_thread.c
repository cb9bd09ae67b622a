/* PHASES phases of PAIRS malloc/free pairs on the main thread, sleeping PAUSE_US after each (time
 * for the drainer to copy its chunks and the converter to punch the copies out), then, once the
 * file GO exists (the test creates it when enough copies were punched; 30 s at most), a thread
 * that starts late and makes PAIRS more: its first chunks are fresh space, taken after the copies
 * were punched. Usage: late_thread PHASES PAIRS PAUSE_US GO. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static long pairs;

static void run(void) {
    for (long i = 0; i < pairs; i++) {
        void *q = malloc(16 + (size_t)(i % 64));
        free(q);
    }
}

static void *late(void *arg) {
    (void)arg;
    run();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    long phases = atol(argv[1]);
    pairs = atol(argv[2]);
    long pause_us = atol(argv[3]);
    for (long p = 0; p < phases; p++) {
        run();
        usleep((useconds_t)pause_us);
    }
    for (int i = 0; i < 3000 && access(argv[4], F_OK) != 0; i++) usleep(10000);
    pthread_t t;
    if (pthread_create(&t, NULL, late, NULL) != 0) return 1;
    pthread_join(t, NULL);
    return 0;
}
