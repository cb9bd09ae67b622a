/* 4,096 distinct malloc call sites, called in turn, ROUNDS times (default 64): `many_sites short`
 * frees each block at once, `many_sites keep` keeps every block to the end. Trained on the first
 * and run with the second, every site's blocks outlive their predicted class: more sites than
 * the allocator's table of watched sites holds (native/alloc/classify.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SITE(n)                                                                                 \
    static __attribute__((noinline)) void *site_##n(size_t size) {                             \
        void *p = malloc(size);                                                                 \
        __asm__ volatile("" : : "r"(p) : "memory"); /* code after the call: no tail call */    \
        return p;                                                                               \
    }
/* 16 of M, the hex digits appended to p: one macro per level, each written out (a macro does
 * not expand inside its own expansion) */
#define L1(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) M(p##7) M(p##8) M(p##9) \
    M(p##a) M(p##b) M(p##c) M(p##d) M(p##e) M(p##f)
#define L2(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) M(p##7) M(p##8) M(p##9) \
    M(p##a) M(p##b) M(p##c) M(p##d) M(p##e) M(p##f)
#define L3(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) M(p##7) M(p##8) M(p##9) \
    M(p##a) M(p##b) M(p##c) M(p##d) M(p##e) M(p##f)
#define S16(p) L1(SITE, p)
#define S256(p) L2(S16, p)
L3(S256, _)

#define REF(n) site_##n,
#define R16(p) L1(REF, p)
#define R256(p) L2(R16, p)
static void *(*const sites[])(size_t) = {L3(R256, _)};
#define NSITES (sizeof sites / sizeof *sites)

int main(int argc, char **argv) {
    int keep = argc > 1 && strcmp(argv[1], "keep") == 0;
    long rounds = argc > 2 ? atol(argv[2]) : 64;
    long n = 0;
    for (long r = 0; r < rounds; r++)
        for (size_t i = 0; i < NSITES; i++) {
            /* each round starts one site later: the allocator's every-64th sample reaches
             * every site, not the same 64 */
            void *p = sites[(i + (size_t)r) % NSITES](24);
            if (!p) return 1;
            if (!keep) free(p);
            n++;
        }
    printf("%ld allocations from %zu sites\n", n, NSITES);
    return 0;
}
