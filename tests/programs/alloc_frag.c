/* A heap that fragments glibc: ROUNDS rounds, each allocating PAIRS pairs of a short-lived and a
 * long-lived block of the same size (the long ones are never freed), then freeing the short ones.
 * Every round uses a larger size, so no later block fits the holes between the long-lived blocks:
 * an allocator that mixes the two keeps about twice the live bytes resident, one that separates
 * them by lifetime gives the short blocks' pages back to later rounds. The short and the long
 * blocks come from two call sites (short_block, long_block). Prints the peak RSS (VmHWM, kB).
 * With the argument "keep", the second half of the rounds keeps its short blocks too: a policy
 * learned from a normal run mispredicts them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 48
#define PAIRS 1000

__attribute__((noinline)) static char *short_block(size_t n) { return malloc(n); }
__attribute__((noinline)) static char *long_block(size_t n) { return malloc(n); }

static long vm_hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    int keep = argc > 1 && strcmp(argv[1], "keep") == 0;
    static char *shorts[PAIRS];
    static char *longs[ROUNDS][PAIRS];
    size_t live = 0;
    for (int r = 0; r < ROUNDS; r++) {
        size_t n = 64 + 16 * (size_t)r;
        for (int i = 0; i < PAIRS; i++) {
            shorts[i] = short_block(n);
            memset(shorts[i], 1, n);
            longs[r][i] = long_block(n);
            memset(longs[r][i], 2, n);
            live += n;
        }
        if (keep && r >= ROUNDS / 2)
            continue;              /* never freed: they outlive the class they were given */
        for (int i = 0; i < PAIRS; i++)
            free(shorts[i]);
    }
    long sum = 0;
    for (int r = 0; r < ROUNDS; r++)
        sum += longs[r][PAIRS - 1][0];
    printf("live_kb %zu peak_kb %ld check %ld\n", live / 1024, vm_hwm_kb(), sum);
    return 0;
}
