/* fork while other threads allocate and free: THREADS threads churn blocks of many sizes while
 * the main thread forks ROUNDS times; each child allocates and frees in every size class the
 * threads use (a lock some thread held at the fork would hang it), writes and checks them, and
 * exits 0. The parent counts children that exited 0: prints "forks N ok M"; an alarm ends a hung
 * run with SIGALRM. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 3
#define ROUNDS 40

static atomic_int stop;

static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *keep[64] = {0};
    while (!atomic_load(&stop)) {
        seed = seed * 1103515245u + 12345u;
        int i = (int)((seed >> 8) % 64);
        free(keep[i]);
        size_t size = (seed >> 16) % 3 == 0 ? (seed >> 4) % 400000 : (seed >> 4) % 2048;
        keep[i] = malloc(size + 1);
        if (keep[i])
            memset(keep[i], 7, size + 1);
    }
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

static int child_work(void) {
    for (size_t size = 1; size < 400000; size = size * 5 / 4 + 1) {
        unsigned char *p = malloc(size);
        if (!p)
            return 1;
        memset(p, 0x5a, size);
        if (p[size - 1] != 0x5a)
            return 1;
        p = realloc(p, size * 2);
        if (!p || p[0] != 0x5a)
            return 1;
        free(p);
    }
    return 0;
}

int main(void) {
    alarm(60);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, churn, (void *)(i + 1));
    int ok = 0;
    for (int r = 0; r < ROUNDS; r++) {
        usleep(2000);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20);
            _exit(child_work());
        }
        int status;
        if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
            WEXITSTATUS(status) == 0)
            ok++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("forks %d ok %d\n", ROUNDS, ok);
    return 0;
}
