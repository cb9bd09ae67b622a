/* Forks while another thread is inside dl_iterate_phdr: glibc's fork does not reset the lock
 * that it holds, so a child that called dl_iterate_phdr would wait forever (the recorder's
 * module snapshot did, in a new chunk or at a new call site). Built twice: as a library (-DLIB)
 * with one allocating function, and as the program (argv[1]: that library's path).
 * - Child 1 is forked while a thread's dl_iterate_phdr callback waits on a pipe: it allocates
 *   from new call sites (300,000 malloc/free pairs: many chunks, then malloc(2345)) and exits.
 * - Child 2 is forked after the thread has left: it dlopens the library (loaded after the fork:
 *   not in the parent's module map) and allocates 4321 bytes from it.
 * A child not exited after 5 s is counted as hung and killed. main prints "held N" and
 * "dlopen N", the hung children of each. */
#define _GNU_SOURCE
#include <stdlib.h>
#ifdef LIB
void *extra_alloc(size_t n) { return malloc(n); }
#else
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int inside[2], go[2];

static int wait_in_callback(struct dl_phdr_info *info, size_t size, void *arg) {
    char c = 1;
    if (write(inside[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) return 1;
    return 1;
}

static void *hold_loader_lock(void *arg) {
    dl_iterate_phdr(wait_in_callback, NULL);
    return NULL;
}

/* 1 if the child exited within 5 s; else it is killed and 0. */
static int exited(pid_t pid) {
    int status;
    for (int w = 0; w < 5000; w++) {
        struct timespec ms = {0, 1000000};
        if (waitpid(pid, &status, WNOHANG) == pid) return 1;
        nanosleep(&ms, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return 0;
}

static void churn(void) {
    for (int i = 0; i < 300000; i++) {
        void *p = malloc(24);
        free(p);
    }
    void *q = malloc(2345);
    free(q);
}

int main(int argc, char **argv) {
    if (argc < 2 || pipe(inside) || pipe(go)) return 2;
    pthread_t t;
    char c = 0;
    if (pthread_create(&t, NULL, hold_loader_lock, NULL)) return 2;
    if (read(inside[0], &c, 1) != 1) return 2;   /* the thread holds the loader's lock now */
    pid_t pid = fork();
    if (pid == 0) {
        churn();
        _exit(0);
    }
    int held_hung = pid > 0 && !exited(pid);
    if (write(go[1], &c, 1) != 1) return 2;
    pthread_join(t, NULL);
    pid = fork();
    if (pid == 0) {
        void *lib = dlopen(argv[1], RTLD_NOW);
        void *(*extra_alloc)(size_t) = lib ? (void *(*)(size_t))dlsym(lib, "extra_alloc") : NULL;
        if (!extra_alloc) _exit(3);
        free(extra_alloc(4321));
        _exit(0);
    }
    int dlopen_hung = pid > 0 && !exited(pid);
    printf("held %d\ndlopen %d\n", held_hung, dlopen_hung);
    return 0;
}
#endif
