/* The policy runtime's call-site keys across a dlclose (native/policy/modmap.c). Linked with
 * libheapcast_policy.so, whose dlclose (as in the recorder and the allocator, where the runtime
 * is preloaded) comes before glibc's.
 *   site_swap LIB BETA   dlopens LIB (tests/programs/dl_loader.c -DLIB), keys a return address
 *                        inside its alpha_alloc, dlcloses it, dlopens BETA (-DLIB -DBETA), and
 *                        keys the same address again, now inside BETA if the loader placed it
 *                        in LIB's hole. Prints "alpha RA BASE KEY" and "beta RA BASE KEY"
 *                        (hex RA and BASE, decimal KEY). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

uint32_t hc_site_of_address(uintptr_t return_address);

static void *base_of(void *fn) {
    Dl_info info;
    return dladdr(fn, &info) ? info.dli_fbase : NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *a = dlopen(argv[1], RTLD_NOW);
    void *fa = a ? dlsym(a, "alpha_alloc") : NULL;
    if (!fa) return 3;
    uintptr_t ra = (uintptr_t)fa + 4, base = (uintptr_t)base_of(fa);
    printf("alpha %lx %lx %u\n", (unsigned long)ra, (unsigned long)base, hc_site_of_address(ra));
    if (dlclose(a) != 0) return 4;
    void *b = dlopen(argv[2], RTLD_NOW);
    void *fb = b ? dlsym(b, "beta_alloc") : NULL;
    if (!fb) return 5;
    printf("beta %lx %lx %u\n", (unsigned long)ra, (unsigned long)base_of(fb),
           hc_site_of_address(ra));
    return 0;
}
