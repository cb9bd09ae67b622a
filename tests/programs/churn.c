/* churn: allocations of many sizes around 64 long-lived blocks, then a fork whose child
 * allocates too: a real recording for the allocator lab's tests (tests/test_lab_replay.py). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    void *keep[64];
    for (int i = 0; i < 64; i++)
        keep[i] = malloc(16 + i * 24);
    for (int r = 0; r < 3000; r++) {
        char *p = malloc(1 + (r * 37) % 700);
        p[0] = 1;
        p = realloc(p, 1 + (r * 91) % 3000);
        void *q = calloc(3, 1 + r % 50), *a = NULL;
        if (posix_memalign(&a, (size_t)64 << (r % 4), 100 + r % 300))
            return 1;
        free(p);
        free(q);
        free(a);
        if (r % 7 == 0) {
            free(keep[r % 64]);
            keep[r % 64] = malloc(r % 500);
        }
    }
    char *big = malloc(1 << 20);
    memset(big, 1, 4096);
    pid_t c = fork();
    if (c == 0) {   /* the child frees blocks it inherited */
        for (int i = 0; i < 64; i += 2)
            free(keep[i]);
        free(big);
        void *x = malloc(5000);
        free(x);
        exit(0);
    }
    waitpid(c, NULL, 0);
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    free(big);
    return 0;
}
