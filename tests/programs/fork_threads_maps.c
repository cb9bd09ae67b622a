/* THREADS threads allocate, then wait while the main thread forks. Parent and child each print
 * how many mappings they have ("parent N", "child N"): the child has the parent's mappings
 * but only the forking thread, so a recorder gives back the other threads' chunk and location
 * table in the child. Usage: fork_threads_maps THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_barrier_t ready, done;

static long count_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    long n = 0;
    while (fgets(line, sizeof line, f)) n++;
    fclose(f);
    return n;
}

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) free(malloc(100 + (size_t)i));
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&done);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    pthread_t t[64];
    if (threads < 1 || threads > 64) return 2;
    pthread_barrier_init(&ready, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    pthread_barrier_wait(&ready);
    long parent = count_maps();
    pid_t pid = fork();
    if (pid == 0) {
        long child = count_maps();
        char *p = malloc(123);   /* an event of the child's own */
        if (!p) _exit(4);
        p[0] = 1;
        free(p);
        printf("parent %ld\nchild %ld\n", parent, child);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    pthread_barrier_wait(&done);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}
