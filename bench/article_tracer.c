/* article_tracer: the article's libtracemalloc, rebuilt from its description as a baseline for
 * bench/record_overhead.py. Every call takes the time, locks one global mutex, formats a text
 * line with sprintf and write()s it to the log, exactly the cost profile heapcast avoids.
 *
 * Log format (what `heapcast import seed` reads), one line per event:
 *   sec.usec TAB pthread_self TAB size (free: -1) TAB pointer
 * Times are relative to the first traced call, as in the article's sample log.
 * calloc is logged as a malloc of nmemb*size; realloc as a free line of the old pointer and a
 * malloc line of the new one, written together under the lock.
 *
 * usage: gcc -O2 -shared -fPIC -o article_tracer.so article_tracer.c -ldl -pthread
 *        TRACEMALLOC_LOG=/path/to/log LD_PRELOAD=./article_tracer.so CMD
 * Without TRACEMALLOC_LOG, or when the log cannot be created (it must not exist: O_EXCL, as in
 * the article), calls pass through untraced. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);

static int fd = -1;
static struct timeval start;
static pthread_mutex_t write_sync = PTHREAD_MUTEX_INITIALIZER;

/* dlsym may allocate (glibc's dlerror state uses calloc) before the real functions are known:
 * those few requests are served from this static arena and never freed. */
static char bootstrap[8192] __attribute__((aligned(16)));
static size_t bootstrap_used;
static int resolving;

static void *bootstrap_alloc(size_t size) {
    size_t need = (size + 15) & ~(size_t)15;
    if (need > sizeof bootstrap - bootstrap_used) return NULL;
    void *p = bootstrap + bootstrap_used;
    bootstrap_used += need;
    return p;  /* static storage: already zeroed, so calloc is served too */
}

static int in_bootstrap(const void *p) {
    return (const char *)p >= bootstrap && (const char *)p < bootstrap + sizeof bootstrap;
}

/* Resolves the real functions and opens the log, on the first call (before any thread starts). */
static void init(void) {
    resolving = 1;
    real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    resolving = 0;
    const char *log = getenv("TRACEMALLOC_LOG");
    if (log) {
        gettimeofday(&start, NULL);
        fd = open(log, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
}

static void get_time(long *sec, long *usec) {
    struct timeval now;
    gettimeofday(&now, NULL);
    *sec = now.tv_sec - start.tv_sec;
    *usec = now.tv_usec - start.tv_usec;
    if (*usec < 0) {
        *usec += 1000000;
        *sec -= 1;
    }
}

static int malloc_line(char *out, long sec, long usec, size_t size, void *ptr) {
    return sprintf(out, "%ld.%06ld\t%ld\t%zu\t%p\n", sec, usec, (long)pthread_self(), size, ptr);
}

static int free_line(char *out, long sec, long usec, void *ptr) {
    return sprintf(out, "%ld.%06ld\t%ld\t-1\t%p\n", sec, usec, (long)pthread_self(), ptr);
}

static void log_malloc(size_t size, void *ptr) {
    long sec, usec;
    char record[128];  /* the article's 64 bytes overflow on 20-digit sizes */
    get_time(&sec, &usec);
    pthread_mutex_lock(&write_sync);
    ssize_t unused = write(fd, record, malloc_line(record, sec, usec, size, ptr));
    (void)unused;
    pthread_mutex_unlock(&write_sync);
}

void *malloc(size_t size) {
    if (resolving) return bootstrap_alloc(size);
    if (!real_malloc) init();
    void *ptr = real_malloc(size);
    if (fd >= 0) log_malloc(size, ptr);
    return ptr;
}

void *calloc(size_t nmemb, size_t size) {
    if (resolving) return bootstrap_alloc(nmemb * size);
    if (!real_calloc) init();
    void *ptr = real_calloc(nmemb, size);
    if (fd >= 0) log_malloc(nmemb * size, ptr);
    return ptr;
}

void free(void *ptr) {
    if (in_bootstrap(ptr)) return;
    if (!real_free) init();
    if (fd >= 0) {
        /* logged before the block is released, so no reuse of ptr can be logged ahead of it */
        long sec, usec;
        char record[128];
        get_time(&sec, &usec);
        pthread_mutex_lock(&write_sync);
        ssize_t unused = write(fd, record, free_line(record, sec, usec, ptr));
        (void)unused;
        pthread_mutex_unlock(&write_sync);
    }
    real_free(ptr);
}

void *realloc(void *ptr, size_t size) {
    if (resolving) return bootstrap_alloc(size);
    if (!real_realloc) init();
    if (in_bootstrap(ptr)) {  /* move a bootstrap block into the real heap */
        void *moved = malloc(size);
        size_t room = (size_t)(bootstrap + sizeof bootstrap - (char *)ptr);
        if (moved) memcpy(moved, ptr, size < room ? size : room);
        return moved;
    }
    if (fd < 0) return real_realloc(ptr, size);
    long sec, usec;
    char record[256];
    get_time(&sec, &usec);
    /* The lock is held across the call: realloc releases ptr inside it, and another thread's
     * malloc could otherwise log the reused address before this free line. */
    pthread_mutex_lock(&write_sync);
    void *result = real_realloc(ptr, size);
    int len = 0;
    if (ptr && (result || size == 0)) len += free_line(record, sec, usec, ptr);  /* released */
    if (result || size > 0) len += malloc_line(record + len, sec, usec, size, result);
    ssize_t unused = write(fd, record, len);
    (void)unused;
    pthread_mutex_unlock(&write_sync);
    return result;
}
