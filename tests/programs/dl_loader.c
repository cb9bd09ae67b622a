/* The recorder's module map beside the dynamic loader, in a process that is not a fork child.
 * Built as a library (-DLIB: one function, alpha_alloc, that mallocs) and as the program:
 *   dl_loader dlopen LIB   dlopens LIB and calls its alpha_alloc (malloc 4321); prints
 *                          "dlopen 0" (2 if the library failed).
 *   dl_loader order        a thread's dl_iterate_phdr callback waits for a mutex that the
 *                          main thread holds while it allocates (300,000 malloc/free pairs:
 *                          many chunks, then a new call site), then releases it; prints
 *                          "order 0". The program alone cannot deadlock here; a recorder that
 *                          called dl_iterate_phdr inside malloc would wait for the thread,
 *                          which waits for main.
 *   dl_loader order_dlopen LIB
 *                          the same, with the library dlopened before the thread starts and
 *                          its alpha_alloc called while the thread waits (malloc 4321: a new
 *                          call site in a module no snapshot has listed); prints
 *                          "order_dlopen 0".
 *   dl_loader swap LIB BETA
 *                          dlopens LIB, calls alpha_alloc (malloc 1111), dlcloses it, dlopens
 *                          BETA (built with -DLIB -DBETA: beta_alloc, the same code at the
 *                          same offset) and calls beta_alloc (malloc 2222); prints "swap same"
 *                          if BETA was loaded at LIB's address, else "swap moved".
 *   dl_loader churn LIB N  N times: dlopens LIB, calls alpha_alloc (malloc 1111), mallocs
 *                          from its own code (malloc 3333) and dlcloses LIB; prints "churn 0".
 *   dl_loader hold LIB     dlopens LIB, calls alpha_alloc (malloc 1111) and frees that block
 *                          after 3,000 malloc/free pairs of its own of about that size (1100
 *                          bytes): LIB's site keeps its block about 6,000 events, other sites
 *                          of that size free theirs at once; prints "hold 0".
 *   dl_loader swap_same LIB BETA
 *                          swap with blocks of one size: alpha_alloc's and beta_alloc's
 *                          (malloc 1111 each) have the same return address and size if BETA
 *                          takes LIB's place; prints "swap_same same" or "swap_same moved". */
#define _GNU_SOURCE
#include <stdlib.h>
#if defined(LIB) && defined(BETA)
void *beta_alloc(size_t n) { return malloc(n); }
#elif defined(LIB)
void *alpha_alloc(size_t n) { return malloc(n); }
#else
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef void *(*alloc_fn)(size_t);

static alloc_fn load(const char *path, const char *name, void **lib) {
    *lib = dlopen(path, RTLD_NOW);
    return *lib ? (alloc_fn)dlsym(*lib, name) : NULL;
}

static int call(const char *path, size_t n) {
    void *lib;
    alloc_fn f = load(path, "alpha_alloc", &lib);
    if (!f) return 2;
    free(f(n));
    return 0;
}

static void *base_of(void *fn) {
    Dl_info info;
    return dladdr(fn, &info) ? info.dli_fbase : NULL;
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
    int same = argc == 4 && strcmp(argv[1], "swap_same") == 0;
    if (same || (argc == 4 && strcmp(argv[1], "swap") == 0)) {
        void *a, *b;
        alloc_fn f = load(argv[2], "alpha_alloc", &a);
        if (!f) return 2;
        void *at = base_of((void *)f);
        free(f(1111));
        dlclose(a);
        alloc_fn g = load(argv[3], "beta_alloc", &b);
        if (!g) return 2;
        free(g(same ? 1111 : 2222));
        printf("%s %s\n", argv[1], base_of((void *)g) == at ? "same" : "moved");
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "hold") == 0) {
        void *lib;
        alloc_fn f = load(argv[2], "alpha_alloc", &lib);
        if (!f) return 2;
        void *kept = f(1111);
        for (int i = 0; i < 3000; i++) free(malloc(1100));
        free(kept);
        printf("hold 0\n");
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "churn") == 0) {
        for (int i = atoi(argv[3]); i > 0; i--) {
            void *lib;
            alloc_fn f = load(argv[2], "alpha_alloc", &lib);
            if (!f) return 2;
            free(f(1111));
            free(malloc(3333));
            dlclose(lib);
        }
        printf("churn 0\n");
        return 0;
    }
    int late = argc == 3 && strcmp(argv[1], "order_dlopen") == 0;
    if ((argc == 2 && strcmp(argv[1], "order") == 0) || late) {
        pthread_t t;
        char c;
        void *lib;
        alloc_fn f = late ? load(argv[2], "alpha_alloc", &lib) : NULL;
        if (late && !f) return 2;
        if (pipe(inside)) return 2;
        pthread_mutex_lock(&held);
        if (pthread_create(&t, NULL, iterate, NULL)) return 2;
        if (read(inside[0], &c, 1) != 1) return 2;   /* the thread holds the loader's lock */
        for (int i = 0; i < 300000; i++) {
            void *p = malloc(24);
            free(p);
        }
        free(malloc(2345));
        if (late) free(f(4321));
        pthread_mutex_unlock(&held);
        pthread_join(t, NULL);
        printf("%s 0\n", argv[1]);
        return 0;
    }
    return 2;
}
#endif
