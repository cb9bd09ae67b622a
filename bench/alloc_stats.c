/* alloc_stats.so: where jemalloc or tcmalloc says its memory is when the process's resident set
 * is at its highest. bench/alloc_table.py preloads it after the allocator, in a run of its own
 * (not a timed one). A thread reads /proc/self/statm and the allocator's own counters every 2 ms
 * (jemalloc: mallctl("stats.*") after an epoch refresh; tcmalloc:
 * MallocExtension_GetNumericProperty). At exit the process appends one line to
 * $ALLOC_STATS_OUT: its pid, an RSS in bytes, then name=value for each counter, of the sample
 * that holds the most allocated bytes among those within 1% of the highest RSS: an allocator
 * that keeps freed pages stays at its peak RSS after the heap has shrunk, and the split is
 * wanted where the heap was fullest. Neither the sampling nor the writing allocates. A process
 * that forks without exec samples nothing more (its thread is not copied); one that execs starts
 * again with its new image. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const JE_KEYS[] = {"stats.allocated", "stats.active", "stats.metadata",
                                      "stats.resident", "stats.mapped", "stats.retained"};
static const char *const TC_KEYS[] = {
    "generic.current_allocated_bytes", "generic.heap_size", "generic.total_physical_bytes",
    "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.central_cache_free_bytes", "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes"};
#define MAXK 8

static int (*je_mallctl)(const char *, void *, size_t *, void *, size_t);
static int (*tc_property)(const char *, size_t *);
static const char *const *keys;
static int nkeys;
#define MAXS (1 << 15)              /* samples kept: a minute at 2 ms; later ones are dropped */
static size_t samples[MAXS][MAXK + 1];   /* RSS, then the counters; pages touched as filled */
static unsigned nsamples;
static size_t page;
static volatile int stop;
static pthread_t thread;
static pid_t owner;            /* the process whose thread samples (not a forked child) */

static size_t rss_now(void) {
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strchr(buf, ' ');
    return p ? strtoull(p + 1, NULL, 10) * page : 0;
}

static void snapshot(size_t rss) {
    if (nsamples == MAXS)
        return;
    size_t *v = samples[nsamples] + 1;
    if (je_mallctl) {
        uint64_t epoch = 1;
        size_t sz = sizeof epoch;
        je_mallctl("epoch", &epoch, &sz, &epoch, sz);   /* refreshes the stats.* values */
    }
    for (int i = 0; i < nkeys; i++) {
        size_t sz = sizeof v[i];
        if (je_mallctl)
            je_mallctl(keys[i], &v[i], &sz, NULL, 0);
        else
            tc_property(keys[i], &v[i]);
    }
    samples[nsamples++][0] = rss;
}

static void *sample(void *unused) {
    const struct timespec every = {0, 2000000};
    while (!stop) {
        snapshot(rss_now());
        nanosleep(&every, NULL);
    }
    return unused;
}

__attribute__((constructor)) static void start(void) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    je_mallctl = (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT,
                                                                               "mallctl");
    tc_property = (int (*)(const char *, size_t *))dlsym(RTLD_DEFAULT,
                                                         "MallocExtension_GetNumericProperty");
    if (je_mallctl) {
        keys = JE_KEYS;
        nkeys = sizeof JE_KEYS / sizeof *JE_KEYS;
    } else if (tc_property) {
        keys = TC_KEYS;
        nkeys = sizeof TC_KEYS / sizeof *TC_KEYS;
    } else {
        return;   /* neither allocator: nothing to say */
    }
    if (pthread_create(&thread, NULL, sample, NULL) == 0)
        owner = getpid();
}

__attribute__((destructor)) static void finish(void) {
    const char *out = getenv("ALLOC_STATS_OUT");
    if (owner != getpid() || !out)
        return;
    stop = 1;
    pthread_join(thread, NULL);
    snapshot(rss_now());
    size_t top = 0;
    for (unsigned i = 0; i < nsamples; i++)
        if (samples[i][0] > top)
            top = samples[i][0];
    const size_t *best = NULL;   /* counter 0 is the allocated bytes for both allocators */
    for (unsigned i = 0; i < nsamples; i++)
        if (samples[i][0] >= top - top / 100 && (!best || samples[i][1] > best[1]))
            best = samples[i];
    if (!best)
        return;
    char line[2048];
    int n = snprintf(line, sizeof line, "%d %zu", (int)getpid(), best[0]);
    for (int i = 0; i < nkeys && n < (int)sizeof line; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %s=%zu", keys[i], best[i + 1]);
    if (n >= (int)sizeof line - 1)
        return;
    line[n++] = '\n';
    int fd = open(out, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        ssize_t w = write(fd, line, (size_t)n);
        (void)w;
        close(fd);
    }
}
