/* THREADS threads allocate, then wait while the main thread forks. The child has the parent's
 * mappings but only the forking thread, so a recorder gives back the other threads' chunks and
 * location tables in the child. Parent and child each print the bytes they map, leaving out
 * their own raw file (which the recorder maps afresh in the child), and the child the mappings
 * of its parent's raw file that it still has: "parent N", "child N", "parent_raw_in_child N".
 * Bytes, not mapping lines: adjacent areas merge into one line or not, as addresses fall.
 * Usage: fork_threads_maps THREADS */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_barrier_t ready, done;
static char maps[1 << 20];

/* Bytes mapped but those of <own>.raw (or <own>.<n>.raw); *theirs: lines that map <other>.raw.
 * read(2) only: no allocation in between. */
static long mapped(int own, int other, long *theirs) {
    int fd = open("/proc/self/maps", O_RDONLY);
    if (fd < 0) return -1;
    long len = 0, r, bytes = 0;
    while (len < (long)sizeof maps - 1 && (r = read(fd, maps + len, sizeof maps - 1 - len)) > 0)
        len += r;
    close(fd);
    maps[len] = 0;
    char mine[32], their[32];
    snprintf(mine, sizeof mine, "/%d.", own);
    snprintf(their, sizeof their, "/%d.", other);
    *theirs = 0;
    for (char *line = maps; *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
        unsigned long lo, hi;
        int raw = strstr(line, ".raw") != NULL;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && !(raw && strstr(line, mine)))
            bytes += (long)(hi - lo);
        if (raw && other && strstr(line, their)) ++*theirs;
        if (!end) break;
        line = end + 1;
    }
    return bytes;
}

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) free(malloc(100 + (size_t)i));
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&done);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    pthread_t t[64];
    if (threads < 1 || threads > 64) return 2;
    pthread_barrier_init(&ready, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    pthread_barrier_wait(&ready);
    long unused, parent = mapped(getpid(), 0, &unused);
    int ppid = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        long theirs, child = mapped(getpid(), ppid, &theirs);
        char *p = malloc(123);   /* an event of the child's own */
        if (!p) _exit(4);
        p[0] = 1;
        free(p);
        printf("parent %ld\nchild %ld\nparent_raw_in_child %ld\n", parent, child, theirs);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    pthread_barrier_wait(&done);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}
