/* Returned pages lower RSS: allocates about 200 MB in small blocks of mixed sizes (16-496
 * bytes), writes every block, frees them all (in an order unlike the allocation order, so that
 * no allocator gets away with trimming the top of a heap), then allocates and frees a few
 * blocks (what lets an allocator that returns pages lazily do so). Prints the resident MB
 * (/proc/self/statm) before, at the peak and after: "rss BEFORE PEAK AFTER". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOTAL (200u << 20)

static double rss_mb(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2)
        return -1;
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}

int main(void) {
    size_t n = 0, cap = TOTAL / 16, bytes = 0;
    char **blocks = malloc(cap * sizeof *blocks);
    if (!blocks)
        return 2;
    double before = rss_mb();
    unsigned seed = 12345;
    while (bytes < TOTAL && n < cap) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 16 + ((seed >> 16) % 31) * 16;
        char *p = malloc(size);
        if (!p)
            return 3;
        memset(p, (int)(n & 0xff), size);
        blocks[n++] = p;
        bytes += size;
    }
    double peak = rss_mb();
    for (size_t step = 0; step < 7; step++)            /* every 7th block, 7 times over */
        for (size_t i = step; i < n; i += 7) {
            if (blocks[i][0] != (char)(i & 0xff))
                return 4;
            free(blocks[i]);
        }
    for (int i = 0; i < 1000; i++)
        free(malloc(64));
    printf("rss %.1f %.1f %.1f\n", before, peak, rss_mb());
    free(blocks);
    return 0;
}
