/* seq_switch: a process's second thread starts recording while its first allocates as fast as
 * it can, ROUNDS times (each round in a fork child, which starts with one thread again).
 * usage: seq_switch ROUNDS N
 * In each child, the main thread releases a waiting thread and at once makes N/2 malloc(777)/free
 * pairs, then malloc(779)/free pairs until the thread has made its first event, then the other
 * N - N/2 malloc(777)/free pairs; the thread makes N malloc(778)/free pairs. The recorder switches
 * from its one-thread sequence numbers to the shared atomic ones at the thread's first event
 * (recorder.c, "sequence numbers"), while the main thread allocates as fast as it can; the
 * thread's events fall among the main thread's 777s however the machine schedules them (on a
 * loaded machine the thread could start only after the main thread's loop). Prints the
 * children's pids. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int go, started;
static long n;

static void pairs(size_t size, long count) {
    for (long i = 0; i < count; i++) {
        void *p = malloc(size);
        if (!p) exit(1);
        ((volatile char *)p)[0] = 1;
        free(p);
    }
}

static void *second(void *arg) {
    (void)arg;
    while (!go) {}   /* no heap call before the main thread's loop is under way */
    pairs(778, 1);
    started = 1;
    pairs(778, n - 1);
    return NULL;
}

static int child(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, second, NULL) != 0) return 2;
    for (int i = 0; i < 64; i++) free(malloc(777 - 1));   /* the main thread recording */
    go = 1;
    pairs(777, n / 2);
    while (!started) pairs(779, 1);
    pairs(777, n - n / 2);
    return pthread_join(t, NULL) != 0 ? 3 : 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    n = argc > 2 ? atol(argv[2]) : 20000;
    free(malloc(775));   /* the parent's own event */
    for (int r = 0; r < rounds; r++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) return 4;
        if (pid == 0) _exit(child());
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 5;
        printf("%d\n", (int)pid);
    }
    return 0;
}
