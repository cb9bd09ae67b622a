/* heapcast drainer: recycles the full chunks of running recorders (raw_format.h, "Recycling").
 *
 * `heapcast record` starts it as a thread of its own process (heapcast.drain, through ctypes)
 * while the program runs. It watches the trace directory for raw files whose header has
 * HC_FLAG_RECYCLE, takes the chunks their threads sealed, copies each to the end of its file and
 * hands the chunk back, zeroed, for a thread to reuse: the program then writes into pages that
 * are already in the page cache and already mapped, instead of making the kernel allocate, zero
 * and map fresh ones (which costs more than the records themselves). The copying happens here,
 * on another core.
 *
 * Order of a recycle, so that a SIGKILL of either side at any point loses no record:
 *   1. reserve space at the file's end (fallocate), write the copy with magic 0, then its magic;
 *   2. mark the original HC_CHUNK_DRAINED (readers skip it), zero its slots;
 *   3. put it on the free queue.
 * Killed before 1 ends: the copy reads as unclaimed space, the original holds the records.
 * Between 1 and 2: the chunk is in the file twice, identical; readers keep one.
 * Any failure (no fallocate, disk full) stops recycling for that file: its chunks stay in place.
 *
 * Keep mode (hc_drain_keep, asked by a converter far behind the program): a sealed chunk is not
 * copied but marked HC_CHUNK_KEPT where it is, and handed back with HC_FREE_UNMAP for the thread
 * that takes it to unmap; the thread then takes fresh space. Nothing zeroes it: readers take it
 * as they take a copy.
 *
 * Every completed copy is logged (file inode, offset) for hc_drain_copies: `heapcast record`'s
 * converter (heapcast.recorder.live) reads copies, which never change, while the program runs,
 * and punches out those it has converted and checkpointed (heapcast.recorder.checkpoint). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "raw_format.h"

#define HC_API __attribute__((visibility("default")))
#define MAP_CACHE (2 * HC_QUEUE)     /* chunk mappings kept per file: those in circulation */
#define SCAN_NS 10000000ull          /* look for new raw files every 10 ms */
#define IDLE_MAX_US 2000             /* longest idle sleep: 64 queued chunks outlast it by far */
#define CLOCK_TICK_US 100            /* the clock tick of files with clock_every > 1 (raw_format.h) */

struct mapping { uint64_t off; char *ptr; };

struct proc {                        /* one raw file */
    char name[256];
    int fd, pid, active;
    uint64_t ino;
    struct hc_header *h;
    struct mapping maps[MAP_CACHE];
    unsigned nmaps, evict;
};

struct drainer {
    pthread_t thread;
    int joined;                      /* hc_drain_pause has ended the thread */
    volatile int stop;
    unsigned poll_us;
    char dir[4096];
    struct timespec mtime;           /* of the directory when it was last read */
    struct proc *procs;
    size_t nprocs, cap;
    uint64_t chunks, failures;       /* chunks handed back (copied or kept); files whose
                                        recycling stopped */
    pthread_mutex_t log_lock;        /* copies completed, not yet taken by hc_drain_copies */
    uint64_t *log;                   /* (inode, offset) pairs */
    size_t nlog, caplog;
    uint64_t log_lost;               /* copies not logged (no memory): the converter waits */
    volatile int keep;               /* hc_drain_keep: keep sealed chunks in place, not copy */
    uint64_t *released;              /* under log_lock: (inode, pid) of the files let go of, not
                                        yet taken by hc_drain_released */
    size_t nreleased, capreleased;
};

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void release(struct proc *p) {
    for (unsigned i = 0; i < p->nmaps; i++) munmap(p->maps[i].ptr, HC_CHUNK_MAX);
    p->nmaps = 0;
    if (p->h) munmap(p->h, HC_HEADER_SIZE);
    p->h = NULL;
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->active = 0;
}

/* Notes for hc_drain_released that the file of p will not be touched here any more. Without
 * memory it is not noted: the converter then leaves that file to the conversion after the exit. */
static void note_released(struct drainer *d, const struct proc *p) {
    pthread_mutex_lock(&d->log_lock);
    if (d->nreleased + 2 > d->capreleased) {
        size_t cap = d->capreleased ? d->capreleased * 2 : 64;
        uint64_t *nr = realloc(d->released, cap * sizeof *nr);
        if (nr) { d->released = nr; d->capreleased = cap; }
    }
    if (d->nreleased + 2 <= d->capreleased) {
        d->released[d->nreleased++] = p->ino;
        d->released[d->nreleased++] = (uint64_t)(uint32_t)p->pid;
    }
    pthread_mutex_unlock(&d->log_lock);
}

/* Lets go of the files whose process is gone: they will seal nothing more. */
static void reap(struct drainer *d) {
    for (size_t i = 0; i < d->nprocs; i++) {
        struct proc *p = &d->procs[i];
        if (p->active && kill(p->pid, 0) != 0 && errno == ESRCH) {
            release(p);
            note_released(d, p);
        }
    }
}

static int known(struct drainer *d, const char *name) {
    for (size_t i = 0; i < d->nprocs; i++)
        if (strcmp(d->procs[i].name, name) == 0) return 1;
    return 0;
}

/* Opens a raw file whose header is complete; 0 to try again at the next scan. */
static int open_raw(struct drainer *d, const char *name) {
    char path[4096 + 256 + 2];
    size_t dl = strlen(d->dir), nl = strlen(name);
    if (nl >= sizeof d->procs[0].name) return 1;    /* not a name the recorder writes: ignore */
    memcpy(path, d->dir, dl);
    path[dl] = '/';
    memcpy(path + dl + 1, name, nl + 1);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno != ENOENT;             /* gone already: nothing to do */
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < HC_HEADER_SIZE) { close(fd); return 0; }
    struct hc_header *h = mmap(NULL, HC_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) { close(fd); return 0; }
    if (memcmp((const void *)h->magic, HC_RAW_MAGIC, 8) != 0) {  /* written last: not yet */
        munmap(h, HC_HEADER_SIZE);
        close(fd);
        return 0;
    }
    if (d->nprocs == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        struct proc *np = realloc(d->procs, cap * sizeof *np);
        if (!np) { munmap(h, HC_HEADER_SIZE); close(fd); return 0; }
        d->procs = np;
        d->cap = cap;
    }
    struct proc *p = &d->procs[d->nprocs++];
    memset(p, 0, sizeof *p);
    memcpy(p->name, name, nl + 1);
    p->fd = fd;
    p->h = h;
    p->pid = h->pid;
    p->ino = (uint64_t)st.st_ino;
    p->active = 1;
    if (!(__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) & HC_FLAG_RECYCLE)) {
        release(p);
        note_released(d, p);
    }
    return 1;
}

/* Opens the raw files that appeared since the last scan. The directory is read only when its
 * mtime moved, or moved recently (mtime has the kernel's coarse clock: a file created in the same
 * tick as the last read leaves it unchanged), so that a trace of many processes costs little. */
static void scan_dir(struct drainer *d) {
    struct stat st;
    struct timespec real;
    if (stat(d->dir, &st) != 0) return;
    clock_gettime(CLOCK_REALTIME, &real);
    int64_t age = (int64_t)(real.tv_sec - st.st_mtim.tv_sec) * 1000000000 +
                  (real.tv_nsec - st.st_mtim.tv_nsec);
    if (st.st_mtim.tv_sec == d->mtime.tv_sec && st.st_mtim.tv_nsec == d->mtime.tv_nsec &&
        age > 100000000) {
        reap(d);
        return;
    }
    d->mtime = st.st_mtim;
    DIR *dir = opendir(d->dir);
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n > 4 && strcmp(e->d_name + n - 4, ".raw") == 0 && !known(d, e->d_name) &&
            !open_raw(d, e->d_name))
            d->mtime.tv_sec = d->mtime.tv_nsec = 0;   /* header not written yet: read again */
    }
    closedir(dir);
    reap(d);
}

static char *map_chunk(struct proc *p, uint64_t off) {
    for (unsigned i = 0; i < p->nmaps; i++)
        if (p->maps[i].off == off) return p->maps[i].ptr;
    char *m = mmap(NULL, HC_CHUNK_MAX, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, p->fd,
                   (off_t)off);
    if (m == MAP_FAILED) return NULL;
    unsigned i;
    if (p->nmaps < MAP_CACHE) {
        i = p->nmaps++;
    } else {
        i = p->evict++ % MAP_CACHE;
        munmap(p->maps[i].ptr, HC_CHUNK_MAX);
    }
    p->maps[i].off = off;
    p->maps[i].ptr = m;
    return m;
}

static int write_all(int fd, struct iovec *iov, int n, uint64_t off) {
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return 0;
        }
        off += (uint64_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) { w -= (ssize_t)iov->iov_len; iov++; n--; }
        if (n > 0) { iov->iov_base = (char *)iov->iov_base + w; iov->iov_len -= (size_t)w; }
    }
    return 1;
}

/* Copies the sealed chunk at `off` to the end of the file and marks the original drained. */
static int copy_chunk(struct proc *p, char *m, uint64_t *copied_at) {
    struct hc_chunk hdr;
    memcpy(&hdr, m, sizeof hdr);
    if (hdr.magic != HC_CHUNK_MAGIC || hdr.size != HC_CHUNK_MAX) return 0;
    uint64_t dst = __atomic_fetch_add(&p->h->file_end, HC_CHUNK_MAX, __ATOMIC_RELAXED);
    /* fallocate, not a write into a hole: on a full disk it fails here, not in the program; and
     * no posix_fallocate emulation may rewrite bytes under the recorder's own reservations. */
    if (fallocate(p->fd, 0, (off_t)dst, HC_CHUNK_MAX) != 0) return 0;
    /* A copy at (or across) the recorder's reservation frontier moves it past itself: the
     * recorder's next reservation then starts above this copy, not over it once it has been
     * punched out (recorder.c, reserve_file). One above the frontier leaves it: the space
     * between belongs to a chunk that a thread claimed and reserves itself. */
    uint64_t r = __atomic_load_n(&p->h->file_reserved, __ATOMIC_ACQUIRE);
    while (r >= dst && r < dst + HC_CHUNK_MAX &&
           !__atomic_compare_exchange_n(&p->h->file_reserved, &r, dst + HC_CHUNK_MAX, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    hdr.magic = 0;
    struct iovec iov[2] = {{&hdr, sizeof hdr}, {m + sizeof hdr, HC_CHUNK_MAX - sizeof hdr}};
    uint32_t magic = HC_CHUNK_MAGIC;
    struct iovec mv = {&magic, sizeof magic};
    if (!write_all(p->fd, iov, 2, dst) || !write_all(p->fd, &mv, 1, dst)) return 0;
    *copied_at = dst;
    __atomic_store_n((uint32_t *)m, HC_CHUNK_DRAINED, __ATOMIC_RELEASE);
    memset(m + sizeof hdr, 0, HC_CHUNK_MAX - sizeof hdr);
    return 1;
}

/* Keeps the sealed chunk at `off` where it is, marked kept (raw_format.h): its header read and
 * written through the file, so that it need not be mapped here. */
static int keep_chunk(struct proc *p, uint64_t off) {
    struct hc_chunk hdr;
    if (pread(p->fd, &hdr, sizeof hdr, (off_t)off) != (ssize_t)sizeof hdr ||
        hdr.magic != HC_CHUNK_MAGIC || hdr.size != HC_CHUNK_MAX)
        return 0;
    uint32_t os_tid = hdr.os_tid | HC_CHUNK_KEPT;
    return pwrite(p->fd, &os_tid, sizeof os_tid,
                  (off_t)(off + offsetof(struct hc_chunk, os_tid))) == (ssize_t)sizeof os_tid;
}

/* Logs a completed copy for hc_drain_copies. Without memory it is counted instead: the converter
 * then leaves that chunk's events to the conversion after the program's exit. */
static void log_copy(struct drainer *d, struct proc *p, uint64_t dst) {
    pthread_mutex_lock(&d->log_lock);
    if (d->nlog + 2 > d->caplog) {
        size_t cap = d->caplog ? d->caplog * 2 : 256;
        uint64_t *nl = realloc(d->log, cap * sizeof *nl);
        if (!nl) { d->log_lost++; pthread_mutex_unlock(&d->log_lock); return; }
        d->log = nl;
        d->caplog = cap;
    }
    d->log[d->nlog++] = p->ino;
    d->log[d->nlog++] = dst;
    pthread_mutex_unlock(&d->log_lock);
}

/* Recycles what the file's threads sealed; returns the number of chunks. */
static unsigned drain(struct drainer *d, struct proc *p) {
    struct hc_queue *sq = &p->h->sealed, *fq = &p->h->free;
    unsigned done = 0;
    /* hc_drain_pause stops it between two chunks: a backlog of sealed chunks (up to HC_QUEUE
     * MiB, 17-165 ms of copying into fresh page-cache pages at a program's exit) is complete
     * in place, where the conversion reads it */
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        uint64_t head = sq->head;   /* the only consumer */
        uint64_t off = __atomic_load_n(&sq->e[head % HC_QUEUE].off, __ATOMIC_ACQUIRE);
        if (!off) break;            /* empty, or an entry reserved but not yet written */
        uint64_t tail = fq->tail;   /* the only producer */
        if (tail - __atomic_load_n(&fq->head, __ATOMIC_ACQUIRE) >= HC_QUEUE) break;
        uint64_t addr = sq->e[head % HC_QUEUE].addr;
        __atomic_store_n(&sq->e[head % HC_QUEUE].off, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&sq->head, head + 1, __ATOMIC_RELEASE);
        int keep = __atomic_load_n(&d->keep, __ATOMIC_ACQUIRE);
        char *m = keep ? NULL : map_chunk(p, off);
        uint64_t copied_at;
        if (keep ? !keep_chunk(p, off) : !m || !copy_chunk(p, m, &copied_at)) {
            d->failures++;   /* the chunk keeps its records in place */
            release(p);
            note_released(d, p);
            break;
        }
        if (!keep) log_copy(d, p, copied_at);
        fq->e[tail % HC_QUEUE].off = off | (keep ? HC_FREE_UNMAP : 0);
        fq->e[tail % HC_QUEUE].addr = addr;
        __atomic_store_n(&fq->tail, tail + 1, __ATOMIC_RELEASE);
        done++;
    }
    return done;
}

/* Polls while there is work; when idle, sleeps from poll_us doubling up to IDLE_MAX_US, so that
 * an idle program does not cost a core thousands of wake-ups per second; up to CLOCK_TICK_US
 * while a file's recorder reads the clock once in N events, whose tick it bumps (raw_format.h). */
static void *run(void *arg) {
    struct drainer *d = arg;
    uint64_t scanned = 0, ticked = 0;
    unsigned idle_us = d->poll_us;
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        uint64_t now = mono_ns();
        if (now - scanned >= SCAN_NS) { scan_dir(d); scanned = now; }
        unsigned work = 0;
        int ticking = 0;   /* a file whose recorder reads the clock once in N events */
        int tick = now - ticked >= CLOCK_TICK_US * 1000ull;
        for (size_t i = 0; i < d->nprocs; i++) {
            struct proc *p = &d->procs[i];
            if (!p->active) continue;
            work += drain(d, p);
            if (p->h && p->h->clock_every > 1) {
                ticking = 1;
                if (tick) __atomic_fetch_add(&p->h->clock_tick, 1, __ATOMIC_RELAXED);
            }
        }
        if (tick) ticked = now;
        d->chunks += work;
        if (work) {
            idle_us = d->poll_us;
        } else {
            unsigned most = ticking ? CLOCK_TICK_US : IDLE_MAX_US;
            if (idle_us > most) idle_us = most;
            struct timespec ts = {0, (long)idle_us * 1000};
            nanosleep(&ts, NULL);
            if (idle_us < most) idle_us = idle_us * 2 < most ? idle_us * 2 : most;
        }
    }
    return NULL;
}

/* Starts draining the raw files of trace directory `dir`, polling every `poll_us` microseconds
 * (at most IDLE_MAX_US) when idle. Returns a handle for hc_drain_stop, or NULL (errno set) if the thread cannot start. */
HC_API void *hc_drain_start(const char *dir, unsigned poll_us) {
    size_t n = strlen(dir);
    if (n >= sizeof ((struct drainer *)0)->dir) { errno = ENAMETOOLONG; return NULL; }
    struct drainer *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    memcpy(d->dir, dir, n + 1);
    pthread_mutex_init(&d->log_lock, NULL);
    d->poll_us = poll_us ? (poll_us < IDLE_MAX_US ? poll_us : IDLE_MAX_US) : 1;
    int rc = pthread_create(&d->thread, NULL, run, d);
    if (rc != 0) { free(d); errno = rc; return NULL; }
    return d;
}

/* Stops recycling (the thread ends after the copy in progress) but keeps the log of copies for
 * hc_drain_copies: `heapcast record` calls it as soon as the program has exited, when a chunk
 * still sealed no longer needs copying (nothing will reuse it; its records are complete in
 * place), and its converter may still take the copies logged. */
HC_API void hc_drain_pause(void *handle) {
    struct drainer *d = handle;
    if (d->joined) return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    pthread_join(d->thread, NULL);
    d->joined = 1;
}

/* Stops the drainer and frees it; out[0] = chunks recycled, out[1] = files whose recycling
 * stopped on an error (their chunks stayed in place). Chunks still sealed stay where they are. */
HC_API void hc_drain_stop(void *handle, uint64_t out[2]) {
    struct drainer *d = handle;
    hc_drain_pause(d);
    for (size_t i = 0; i < d->nprocs; i++) release(&d->procs[i]);
    out[0] = d->chunks;
    out[1] = d->failures;
    free(d->procs);
    free(d->log);
    free(d->released);
    pthread_mutex_destroy(&d->log_lock);
    free(d);
}

/* Keeps (on != 0) or copies (0) the chunks sealed from now on: a converter far behind the
 * program asks to keep them (raw_format.h, "Recycling"). */
HC_API void hc_drain_keep(void *handle, int on) {
    struct drainer *d = handle;
    __atomic_store_n(&d->keep, on != 0, __ATOMIC_RELEASE);
}

/* Takes up to `max` of the raw files that the drainer has let go of since the last call (their
 * process is gone, or their recycling stopped): out[2k] = the file's inode, out[2k + 1] = its
 * pid (an inode alone may be a later file's). It will not write to them any more, so once their
 * process is gone too they can be converted whole. Returns how many. */
HC_API size_t hc_drain_released(void *handle, uint64_t *out, size_t max) {
    struct drainer *d = handle;
    pthread_mutex_lock(&d->log_lock);
    size_t n = d->nreleased / 2 < max ? d->nreleased / 2 : max;
    memcpy(out, d->released, 2 * n * sizeof *out);
    memmove(d->released, d->released + 2 * n, (d->nreleased - 2 * n) * sizeof *d->released);
    d->nreleased -= 2 * n;
    pthread_mutex_unlock(&d->log_lock);
    return n;
}

/* Takes up to `max` logged copies, oldest first: out[2k] = the raw file's inode, out[2k + 1] =
 * the copy's offset (complete, never written again). Returns how many; *lost = copies that could
 * not be logged so far. Callable from any thread while the drainer runs. */
HC_API size_t hc_drain_copies(void *handle, uint64_t *out, size_t max, uint64_t *lost) {
    struct drainer *d = handle;
    pthread_mutex_lock(&d->log_lock);
    size_t n = d->nlog / 2 < max ? d->nlog / 2 : max;
    memcpy(out, d->log, n * 2 * sizeof *out);
    memmove(d->log, d->log + 2 * n, (d->nlog - 2 * n) * sizeof *d->log);
    d->nlog -= 2 * n;
    *lost = d->log_lost;
    pthread_mutex_unlock(&d->log_lock);
    return n;
}

/* ns per reading of the recorder's clock on this machine (recorder.c, now_ticks: rdtsc where
 * `tsc`, else clock_gettime), the least of 5 runs of 2,000 readings back to back (40 us here):
 * `heapcast record` suggests --clock-every where reading it is much of what recording costs. */
HC_API double hc_clock_read_ns(int tsc) {
    double best = 0;
    for (int run = 0; run < 5; run++) {
        struct timespec a, b, t;
        volatile uint64_t sink = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < 2000; i++) {
#if defined(__x86_64__)
            if (tsc) {
                sink += __builtin_ia32_rdtsc();
                continue;
            }
#endif
            clock_gettime(CLOCK_MONOTONIC, &t);
            sink += (uint64_t)t.tv_nsec;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 2000;
        if (run == 0 || ns < best) best = ns;
    }
    return best;
}
