/* Starts and ends THREADS threads one after another; each makes PAIRS malloc(777)/free pairs,
 * and the main thread sleeps PAUSE_US after each. Then prints how many mappings the process has
 * ("maps N"): a recorder that left each ended thread's mappings behind would reach the kernel's
 * limit (vm.max_map_count). Usage: thread_churn THREADS PAIRS [PAUSE_US] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long pairs;

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < pairs; i++) {
        char *p = malloc(777);
        if (!p) abort();
        p[0] = (char)i;
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? atol(argv[1]) : 1000;
    pairs = argc > 2 ? atol(argv[2]) : 2;
    long pause_us = argc > 3 ? atol(argv[3]) : 0;
    for (long i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) != 0) {
            printf("pthread_create failed at thread %ld\n", i);
            return 1;
        }
        pthread_join(t, NULL);
        if (pause_us) usleep((useconds_t)pause_us);
    }
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 2;
    char line[4096];
    long maps = 0;
    while (fgets(line, sizeof line, f)) maps++;
    fclose(f);
    printf("maps %ld\n", maps);
    return 0;
}
