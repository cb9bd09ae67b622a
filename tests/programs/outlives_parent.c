/* A program whose forked child outlives it, as a daemon's does: the parent exits at once.
 *
 *   outlives_parent N        the child waits until its parent has exited, and 0.3 s more (so
 *                            that it still runs when `record` sees the parent end, however
 *                            busy the machine), then makes N malloc/free pairs and exits
 *   outlives_parent forever  the child makes pairs until it is killed
 *   outlives_parent exec     the child execs `sleep 30`, a program not traced without
 *                            --follow-children
 *   outlives_parent stopped N
 *                            the parent stops the child (SIGSTOP) as soon as fork returns, most
 *                            often before the child has run at all, and exits at once; the
 *                            child, once continued and its parent gone, makes N malloc/free
 *                            pairs
 * Each prints the child's pid first, on a line of its own. But for `stopped`, the parent exits
 * only once the child runs its own code (the recorder's fork handler, which opens the child's
 * trace file, has run then). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    for (int i = 0; i < 1000; i++) free(malloc(32));
    pid_t parent = getpid();   /* (before the fork: the parent may be gone when the child runs) */
    int stopped = strcmp(argv[1], "stopped") == 0 && argc > 2;
    int started[2];
    if (pipe(started)) return 2;
    pid_t child = fork();
    if (child < 0) return 2;
    if (child > 0) {
        char c;
        if (stopped ? kill(child, SIGSTOP) != 0 : read(started[0], &c, 1) != 1) return 2;
        printf("%d\n", (int)child);
        return 0;
    }
    if (stopped) {
        long n = atol(argv[2]);
        /* a child that runs before its parent's kill waits for the parent to be gone (stopped
         * meanwhile): on a busy machine it had made all its pairs and exited before the
         * SIGSTOP, and nothing was left running */
        while (getppid() == parent) usleep(1000);
        for (long i = 0; i < n; i++) free(malloc(16 + i % 64));
        return 0;
    }
    if (write(started[1], "", 1) != 1) _exit(2);
    if (strcmp(argv[1], "exec") == 0) {
        execl("/bin/sleep", "sleep", "30", (char *)NULL);
        _exit(3);
    }
    int forever = strcmp(argv[1], "forever") == 0;
    long n = forever ? 0 : atol(argv[1]);
    if (!forever) {   /* (no allocation here: the test counts the child's events) */
        while (getppid() == parent) usleep(1000);
        usleep(300000);
    }
    for (long i = 0; forever || i < n; i++) {
        free(malloc(16 + i % 64));
        if (forever && i % 10000 == 0) usleep(1000);
    }
    return 0;
}
