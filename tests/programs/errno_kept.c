/* errno across heap calls, with the address space nearly full: free() and the calls that succeed
 * must leave errno as the program set it, also when the recorder cannot map its next chunk.
 *
 *   errno_kept [pairs]   malloc/free pairs under a limit of the address space 256 KiB above what
 *                        the process uses (RLIMIT_AS), then as many without it; prints how many
 *                        calls changed errno (0 expected) and exits 1 if any did.
 * The trace file may grow by at most 64 MiB (RLIMIT_FSIZE): a recorder that took fresh file
 * space for each event it could not map would reach it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static long vm_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmSize:", 7) == 0) kb = atol(line + 7);
    if (f) fclose(f);
    return kb * 1024;
}

static long pairs(long n) {
    long changed = 0;
    for (long i = 0; i < n; i++) {
        errno = 4343;
        void *p = malloc(32 + i % 32);
        if (p && errno != 4343) changed++;
        errno = 4242;
        free(p);
        if (errno != 4242) changed++;
    }
    return changed;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    struct rlimit fsize = {64 << 20, 64 << 20};
    setrlimit(RLIMIT_FSIZE, &fsize);
    long changed = pairs(1000);   /* the recorder's thread state, before the limit */
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) != 0) return 2;
    struct rlimit tight = {(rlim_t)vm_bytes() + (256 << 10), as.rlim_max};
    if (setrlimit(RLIMIT_AS, &tight) != 0) {
        perror("setrlimit");
        return 2;
    }
    changed += pairs(n);
    setrlimit(RLIMIT_AS, &as);
    changed += pairs(n);
    printf("%ld\n", changed);
    return changed != 0;
}
