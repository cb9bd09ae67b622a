/* The recorder's module map beside the dynamic loader, in a process that is not a fork child.
 * Built as a library (-DLIB: one function, alpha_alloc, that mallocs) and as the program:
 *   dl_loader dlopen LIB   dlopens LIB and calls its alpha_alloc (malloc 4321); prints
 *                          "dlopen 0" (2 if the library failed).
 *   dl_loader order        a thread's dl_iterate_phdr callback waits for a mutex that the
 *                          main thread holds while it allocates (300,000 malloc/free pairs:
 *                          many chunks, then a new call site), then releases it; prints
 *                          "order 0". The program alone cannot deadlock here; a recorder that
 *                          called dl_iterate_phdr inside malloc would wait for the thread,
 *                          which waits for main. */
#define _GNU_SOURCE
#include <stdlib.h>
#ifdef LIB
void *alpha_alloc(size_t n) { return malloc(n); }
#else
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int call(const char *path, size_t n) {
    void *lib = dlopen(path, RTLD_NOW);
    void *(*f)(size_t) = lib ? (void *(*)(size_t))dlsym(lib, "alpha_alloc") : NULL;
    if (!f) return 2;
    free(f(n));
    return 0;
}

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static int inside[2];

static int wait_for_main(struct dl_phdr_info *info, size_t size, void *arg) {
    char c = 1;
    if (write(inside[1], &c, 1) != 1) return 1;
    pthread_mutex_lock(&held);     /* main holds it while it allocates */
    pthread_mutex_unlock(&held);
    return 1;
}

static void *iterate(void *arg) {
    dl_iterate_phdr(wait_for_main, NULL);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "dlopen") == 0) {
        printf("dlopen %d\n", call(argv[2], 4321));
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "order") == 0) {
        pthread_t t;
        char c;
        if (pipe(inside)) return 2;
        pthread_mutex_lock(&held);
        if (pthread_create(&t, NULL, iterate, NULL)) return 2;
        if (read(inside[0], &c, 1) != 1) return 2;   /* the thread holds the loader's lock */
        for (int i = 0; i < 300000; i++) {
            void *p = malloc(24);
            free(p);
        }
        free(malloc(2345));
        pthread_mutex_unlock(&held);
        pthread_join(t, NULL);
        printf("order 0\n");
        return 0;
    }
    return 2;
}
#endif
