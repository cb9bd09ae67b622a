/* The process ends by exit(7) called from a second thread while the main thread is blocked. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *worker(void *arg) {
    void *a = malloc(1001), *b = malloc(1002), *c = malloc(1003);
    free(b);
    printf("worker %lx %lx %lx\n", (unsigned long)a, (unsigned long)b, (unsigned long)c);
    exit(7);
}

int main(void) {
    void *m = malloc(1000);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);  /* never returns: the worker ends the process */
    free(m);
    return 0;
}
