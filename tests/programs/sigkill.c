/* Four threads allocate and free without end, counting the mallocs that have returned. When
 * every thread has started and the main thread sees at least TARGET mallocs, it prints
 * "<pid> <count>" (each malloc counted was recorded before it returned, so the trace must hold at
 * least that many) and kills the whole process with SIGKILL: no destructor, no flush, no exit
 * handler runs. With an argument it waits instead, the threads still running, for someone else to
 * kill it. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define TARGET 200000
static atomic_long done;
static atomic_int started;

static void *worker(void *arg) {
    for (long i = 0;; i++) {
        void *p = malloc(24 + (size_t)(i % 200));
        atomic_fetch_add(&done, 1);
        if (i == 0) atomic_fetch_add(&started, 1);
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, NULL);
    while (atomic_load(&started) < 4 || atomic_load(&done) < TARGET) usleep(100);
    char line[48];
    int n = snprintf(line, sizeof line, "%d %ld\n", (int)getpid(), atomic_load(&done));
    write(1, line, (size_t)n);
    if (argc > 1)
        for (;;) pause();
    kill(getpid(), SIGKILL);
    return 0;
}
