/* Threads cancelled while they allocate: malloc and free are not cancellation points, so a
 * thread that holds a lock around them is never cancelled with it held.
 *
 *   cancelled_threads [rounds]   each round starts a thread that, in a loop, locks a mutex,
 *                                mallocs and frees, unlocks it and checks for cancellation;
 *                                cancels it and joins it; then the mutex must be free.
 * Prints "ok" (exit 0), or the round whose thread died holding the mutex (exit 1). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static volatile int started;

static void *worker(void *arg) {
    (void)arg;
    __atomic_store_n(&started, 1, __ATOMIC_RELEASE);
    for (long i = 0;; i++) {
        pthread_mutex_lock(&mu);
        free(malloc(16 + i % 256));
        pthread_mutex_unlock(&mu);
        pthread_testcancel();
    }
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    for (int r = 0; r < rounds; r++) {
        pthread_t t;
        __atomic_store_n(&started, 0, __ATOMIC_RELEASE);
        if (pthread_create(&t, NULL, worker, NULL) != 0) return 2;
        while (!__atomic_load_n(&started, __ATOMIC_ACQUIRE)) {
        }
        usleep((useconds_t)(r % 7 * 100));
        pthread_cancel(t);
        pthread_join(t, NULL);
        if (pthread_mutex_trylock(&mu) != 0) {
            printf("round %d: the thread was cancelled inside malloc or free\n", r);
            return 1;
        }
        pthread_mutex_unlock(&mu);
    }
    printf("ok\n");
    return 0;
}
