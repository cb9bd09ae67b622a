/* callsites: two named allocation sites, leaks, realloc(NULL), free(NULL), calloc: exact op
 * counts and symbolized call sites for tests/test_stats.py. */
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) void *make_big(void) { return malloc(1 << 20); }
__attribute__((noinline)) void *make_small(size_t n) { return malloc(n); }
int main(void) {
    void *keep[100];
    for (int i = 0; i < 100; i++) keep[i] = make_small(16 + i);
    char *big = make_big();
    memset(big, 1, 1 << 20);
    for (int i = 0; i < 100; i++) if (i % 10) free(keep[i]);   /* 10 blocks stay */
    free(big);
    void *r = realloc(NULL, 10);
    r = realloc(r, 100000);
    free(r);
    free(NULL);
    void *c = calloc(4, 8);
    free(c);
    return 0;
}
