/* heapcast recorder: an LD_PRELOAD library that records every heap call of a program.
 *
 * Hot path: one event = a clock read, one increment of the process-wide sequence number (atomic
 * once a second thread records: "sequence numbers" below), and eight stores into the calling
 * thread's chunk, which is a shared mapping of the raw trace file (raw_format.h). No lock, no
 * format call, no system call. Everything slow (claiming a new chunk, module snapshots, stack
 * interning misses) happens at most once per chunk or per new stack.
 *
 * Rules this file keeps, because it runs inside other people's programs:
 * - never allocate through the hooked functions (bootstrap arena for dlsym, syscalls elsewhere);
 * - never change the program's behaviour: every hook calls the real function with the same
 *   arguments and returns its result and errno untouched;
 * - never lose an event silently: what cannot be written is counted in header.lost;
 * - survive fork (the child gets its own file), exec, threads, signals and SIGKILL (the kernel
 *   keeps the shared file pages).
 *
 * Configured by environment variables set by `heapcast record`:
 *   HEAPCAST_DIR     trace directory (required; without it the library only passes calls through)
 *   HEAPCAST_STACKS  frames per stack (0 = call site only)
 *   HEAPCAST_UNWIND  "fp" (frame pointers, default) or "dwarf" (glibc backtrace)
 *   HEAPCAST_MMAP    "1" to record mmap/munmap/mremap
 *   HEAPCAST_FOLLOW  "1" to trace exec'd images too (otherwise only the first image and its forks)
 *   HEAPCAST_DRAIN   "1": a drainer recycles full chunks (raw_format.h, "Recycling")
 *   HEAPCAST_CLOCK_EVERY  N > 1: one event in N of a thread reads the clock (event_ticks), with
 *                    a drainer only (its clock tick bounds how old a reading may be)
 *   HEAPCAST_POLICY  a compiled POLICY to run online on every event (policy_hook.c)
 *   HEAPCAST_POLICY_EVERY  predict every N-th event only (default 1)
 *   HEAPCAST_POLICY_FEATURES  "1": also log the features of every decision (development mode)
 *   HEAPCAST_PYTHON  "0" to record native call sites in CPython too (default: the Python
 *                    frames of a thread running Python code, pyframes.h)
 *   HEAPCAST_PYMALLOC "1" to record pymalloc's own allocations too (pymalloc.h)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../policy/internal.h"
#include "own_file.h"
#include "policy_hook.h"
#include "quiet.h"
#include "raw_format.h"

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MAX_STACK 64
#define GROW_BYTES (16u << 20)
#define FIRST_BYTES (1u << 20)   /* reserved at the start: a shell's short programs each need
                                    little, and 16 MiB apiece held 3 GB of disk for 200 of them */
#define LOC_TABLE_SLOTS (1u << 14)   /* a thread's first location table */
#define LOC_TABLE_MAX (1u << 22)     /* the largest it grows to (64 MiB) */
/* Slots at the end of every chunk that only a nested event (a signal handler's, while the event it
 * interrupted is being written) may take: it must not replace the chunk then (see slots_slow). */
#define NESTED_RESERVE 32u

#include "pyframes.h"

/* ---------------------------------------------------------------- the real functions */

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);
static void *(*real_pvalloc)(size_t);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static int (*real_munmap)(void *, size_t);
static void *(*real_mremap)(void *, size_t, size_t, int, ...);

/* dlsym may allocate before the real allocator is known: serve it from a static arena whose
 * blocks are never freed (free() recognises them by address). */
static _Alignas(16) char boot_arena[64 << 10];
static size_t boot_used;

static int in_boot_arena(const void *p) {
    return (const char *)p >= boot_arena && (const char *)p < boot_arena + sizeof boot_arena;
}

static void *boot_alloc(size_t n, size_t align) {
    if (align < 16) align = 16;
    size_t start = (__atomic_load_n(&boot_used, __ATOMIC_RELAXED) + 16 + align - 1) & ~(align - 1);
    if (start + n > sizeof boot_arena) return NULL;
    __atomic_store_n(&boot_used, start + n, __ATOMIC_RELAXED);
    ((size_t *)(boot_arena + start))[-1] = n;
    return boot_arena + start;
}

static void resolve_real(void) {
#define RESOLVE(name) real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name)
    RESOLVE(malloc);
    RESOLVE(free);
    RESOLVE(calloc);
    RESOLVE(realloc);
    RESOLVE(posix_memalign);
    RESOLVE(aligned_alloc);
    RESOLVE(memalign);
    RESOLVE(valloc);
    RESOLVE(pvalloc);
    RESOLVE(mmap);
    RESOLVE(munmap);
    RESOLVE(mremap);
#undef RESOLVE
}

/* ---------------------------------------------------------------- process and thread state */

enum { ST_UNINIT, ST_INITING, ST_ACTIVE, ST_OFF };

static volatile int g_state = ST_UNINIT;
static volatile uint32_t g_gen = 1;  /* bumped in a fork child: every thread state becomes stale */
static struct hc_header *H;          /* mapped header page of this process's raw file */
static struct hc_file g_raw = {.fd = -1}, g_mods = {.fd = -1};   /* (own_file.h) */
static int g_stack_depth, g_unwind_dwarf, g_mmap, g_follow, g_use_tsc, g_recycle;
static uint32_t g_clock_every = 1;   /* HEAPCAST_CLOCK_EVERY, with a drainer (event_ticks) */
#define CLOCK_EVERY_MAX 1024
static char g_dir[4096];
static volatile int g_grow_lock;
static uintptr_t g_self_lo, g_self_hi;  /* this library's code: its frames are not the program's */
static uint64_t g_mods_adds = ~0ull, g_mods_subs = ~0ull; /* dl_iterate_phdr counters last written */
static volatile int g_mods_lock;
static volatile int g_exited;        /* the destructor ran */
static int g_python_want;            /* HEAPCAST_PYTHON: Python frames where there is CPython */
static volatile int g_python;        /* CPython 3.11 found: Python frames are recorded */
static int g_pym_want;               /* HEAPCAST_PYMALLOC: pymalloc's allocations too */
static volatile int g_pym_state;     /* pymalloc.h: 0 none, 1 waiting, 2 installing, 3 installed */

struct tstate {
    struct hc_record *rec;           /* current chunk, slot 0 is the chunk header */
    uint64_t off;                    /* its offset in the file */
    uint32_t pos, cap;               /* next free slot, slots in the chunk but NESTED_RESERVE */
    uint32_t gen, tid;
    uint32_t next_size;              /* size of the next chunk to claim */
    int own;                         /* we call something that may allocate for us: pass through */
    int busy;                        /* in a slow path: a nested event (a signal handler's) is
                                        counted as lost */
    int emitting;                    /* events being written on this thread: 2 or more means a
                                        signal handler's event interrupted another one, which
                                        holds a slot pointer and a time base; the nested event
                                        must not replace the chunk or move the base
                                        (slots_slow, event_slots) */
    uint64_t tbase;                  /* time base of the current chunk */
    uintptr_t stk_lo, stk_hi;        /* stack bounds, for frame pointer walks */
    uint64_t *loc_table;             /* open addressing: (key hash, location id) pairs
                                        (table_new: its size and use are kept before it) */
    uint32_t loc_mask;               /* its slots - 1 */
    uintptr_t self;                  /* pthread_self(), to recognise this thread's Python state */
    int boot;                        /* looking for CPython: what dlsym allocates comes from the
                                        boot arena, never from the program's heap */
    struct thread_maps *maps;        /* its entry in g_maps (threads' mappings), or NULL */
    uint64_t spare_off;              /* file space whose mapping failed (spare_size bytes, 0:
                                        none), for the next claim (claim_chunk) */
    uint32_t spare_size;
    uint32_t skip, fails;            /* claims failed in a row, and events to lose before the
                                        next try (slots_slow) */
    uint64_t clock_last;             /* with g_clock_every > 1: the thread's latest clock reading, */
    uint64_t clock_tick;             /* the header's clock tick then, */
    uint32_t clock_left;             /* and how many more events may take it (event_ticks) */
};
static TLS struct tstate T;

static inline size_t chunk_bytes(const struct tstate *t) {   /* of the current chunk */
    return (size_t)(t->cap + NESTED_RESERVE) * HC_RECORD_SIZE;
}

/* ---------------------------------------------------------------- small helpers (no libc allocation) */

static inline uint64_t now_ticks(void) {
#if defined(__x86_64__)
    if (LIKELY(g_use_tsc)) return __builtin_ia32_rdtsc();
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The time of an event. Reading the clock is most of what recording an event costs on some
 * machines (rdtsc: 19 ns a read, 27 ns an event of ring.c on the development VM, where the rest
 * of the event costs 15), so with `record --clock-every N` one event in N of a thread reads it,
 * and so does the first event after the drainer's clock tick (raw_format.h): the others take
 * the thread's latest reading, never older than N - 1 of its events or one tick. A signal
 * handler's event that interrupts this only makes one of the two take a fresher reading. */
static inline uint64_t event_ticks(struct tstate *t) {
    if (LIKELY(g_clock_every == 1)) return now_ticks();
    uint64_t tick = __atomic_load_n(&H->clock_tick, __ATOMIC_RELAXED);
    if (LIKELY(t->clock_left != 0 && tick == t->clock_tick)) {
        t->clock_left--;
        return t->clock_last;
    }
    t->clock_tick = tick;
    t->clock_left = g_clock_every - 1;
    return t->clock_last = now_ticks();
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *sys_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    return (void *)syscall(SYS_mmap, a, n, prot, flags, fd, off);
}

static void sys_munmap(void *a, size_t n) { syscall(SYS_munmap, a, n); }

static void spin_lock(volatile int *l) {
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) sched_yield();
}

static void spin_unlock(volatile int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

/* Signal-safe claim of n slots: a single instruction on x86, so a handler that interrupts us
 * claims different slots. */
static inline uint32_t claim_slots(uint32_t *pos, uint32_t n) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("xaddl %0, %1" : "+r"(n), "+m"(*pos) : : "memory");
    return n;
#else
    return __atomic_fetch_add(pos, n, __ATOMIC_RELAXED);
#endif
}

/* ---------------------------------------------------------------- sequence numbers
 *
 * Every event takes the next number of the process-wide counter H->seq (next_seq). With threads
 * that is a locked increment; but a locked instruction also waits for the clock read before it
 * to complete: the clock read and a locked increment take 15.6 ns together on the development
 * VM, against 7.9 ns with an unlocked one. So while one thread alone records (most programs,
 * and every program until its second thread's first event) the increment is unlocked: a single
 * instruction, which a signal handler on that thread cannot split.
 *
 * The second thread to record switches the process to locked increments for good
 * (seq_go_locked): it sets g_seq_mode, then membarrier(2) makes the first thread pass a full
 * barrier, after which that thread sees the new mode; an unlocked increment it had begun by then
 * shows in g_seq_inside (which only that thread changes while the mode is SEQ_SOLO, and reads the
 * mode again after raising), and is waited for. A fork child starts alone again. Where
 * membarrier's expedited command cannot be registered (before Linux 4.14), every increment is
 * locked. */
enum { SEQ_SOLO, SEQ_SWITCHING, SEQ_LOCKED };
static volatile int g_seq_mode = SEQ_LOCKED;
static volatile int g_seq_inside;     /* next_seq calls under way in SEQ_SOLO (signals nest) */
#define SEQ_WAIT_NS 1000000000ull     /* a handler that never returned (longjmp): go on */
#ifndef MEMBARRIER_CMD_PRIVATE_EXPEDITED
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED (1 << 3)
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED (1 << 4)
#endif

/* The mode for a process whose one thread is about to record: alone, if it can be switched. */
static int seq_start_mode(void) {
#if defined(__x86_64__) && defined(SYS_membarrier)
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
        return SEQ_SOLO;
#endif
    return SEQ_LOCKED;
}

/* Called by every thread but the first of this process before its first event. */
static void seq_go_locked(void) {
    int solo = SEQ_SOLO;
    if (__atomic_compare_exchange_n(&g_seq_mode, &solo, SEQ_SWITCHING, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
#if defined(SYS_membarrier)
        syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
        uint64_t t0 = mono_ns();
        while (__atomic_load_n(&g_seq_inside, __ATOMIC_ACQUIRE) > 0 && mono_ns() - t0 < SEQ_WAIT_NS)
            sched_yield();
        __atomic_store_n(&g_seq_mode, SEQ_LOCKED, __ATOMIC_SEQ_CST);
        return;
    }
    while (__atomic_load_n(&g_seq_mode, __ATOMIC_ACQUIRE) == SEQ_SWITCHING) sched_yield();
}

static size_t str_len(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

/* Buffered text output for the .mods file, written with write(2). Other threads append their
 * Python frames' lines ("P") to the same file meanwhile, each with one write (O_APPEND, whole):
 * a buffer is therefore written up to its last whole line, so that theirs fall between lines. */
struct kept_mods;
struct textbuf {   /* written to the .mods file */
    char b[8192];
    size_t n;
    struct kept_mods *copy;   /* what is put is also kept there (a module snapshot's lines), */
    int keep_only;            /* and only there */
    int fd;                   /* > 0: written there instead (the overflow's memfd) */
};
static void kept_put(struct kept_mods *k, const char *s, size_t n);

static uint64_t g_mods_bytes;     /* written to the .mods file */
static uint64_t file_size_limit(void);

/* Writes iov[0..cnt) to fd in one writev where it can (a partial write goes on from where it
 * stopped), or to the .mods file (fd 0), which counts its bytes against RLIMIT_FSIZE; whether
 * all of it was written. */
static int fd_writev(int fd, struct iovec *iov, int cnt) {
    size_t total = 0;
    for (int i = 0; i < cnt; i++) total += iov[i].iov_len;
    if (fd == 0) {
        uint64_t done = __atomic_add_fetch(&g_mods_bytes, total, __ATOMIC_RELAXED);
        if (done > file_size_limit()) {  /* past RLIMIT_FSIZE: SIGXFSZ; drop it */
            __atomic_sub_fetch(&g_mods_bytes, total, __ATOMIC_RELAXED);
            if (H) __atomic_fetch_or(&H->flags, HC_FLAG_TRUNCATED, __ATOMIC_RELAXED);
            return 0;
        }
        fd = hc_file_fd(&g_mods);
    } else {   /* (a memfd counts against RLIMIT_FSIZE too) */
        off_t at = lseek(fd, 0, SEEK_CUR);
        if (at < 0 || (uint64_t)at + total > file_size_limit()) return 0;
    }
    while (fd >= 0 && cnt > 0) {
        ssize_t w = writev(fd, iov, cnt);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        for (; cnt > 0 && (size_t)w >= iov->iov_len; iov++, cnt--) w -= (ssize_t)iov->iov_len;
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return cnt == 0;
}

/* Writes the first `upto` bytes of t and keeps the rest at its front. */
static void tb_flush_upto(struct textbuf *t, size_t upto) {
    struct iovec iov = {t->b, upto};
    if (upto) fd_writev(t->fd, &iov, 1);
    memmove(t->b, t->b + upto, t->n - upto);
    t->n -= upto;
}

static void tb_flush(struct textbuf *t) { tb_flush_upto(t, t->n); }

static void tb_put(struct textbuf *t, const char *s, size_t n) {
    if (t->copy) kept_put(t->copy, s, n);
    if (t->keep_only) return;
    while (n) {
        if (t->n == sizeof t->b) {   /* up to its last whole line (all of a longer line) */
            size_t end = t->n;
            while (end && t->b[end - 1] != '\n') end--;
            tb_flush_upto(t, end ? end : t->n);
        }
        size_t k = sizeof t->b - t->n < n ? sizeof t->b - t->n : n;
        memcpy(t->b + t->n, s, k);
        t->n += k; s += k; n -= k;
    }
}

static void tb_str(struct textbuf *t, const char *s) { tb_put(t, s, str_len(s)); }

static void tb_init(struct textbuf *t) {   /* (for one on the stack; a static one is zero) */
    t->n = 0;
    t->copy = NULL;
    t->keep_only = 0;
    t->fd = 0;
}

static void tb_hex(struct textbuf *t, uint64_t v) {
    char d[17]; int i = 16;
    d[16] = 0;
    do { d[--i] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    tb_str(t, d + i);
}

/* Text fields are hex-encoded so that any byte in a path or argument survives. */
static void tb_hexbytes(struct textbuf *t, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char d[2] = {"0123456789abcdef"[(unsigned char)s[i] >> 4], "0123456789abcdef"[s[i] & 15]};
        tb_put(t, d, 2);
    }
}

static ssize_t read_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    return (ssize_t)n;
}

/* ---------------------------------------------------------------- module snapshots
 *
 * A snapshot lists the loaded modules as of an event. dl_iterate_phdr, which lists them, takes
 * the loader's dl_load_write_lock, and calling it from inside malloc can deadlock a program that
 * would not deadlock alone:
 * - glibc's fork does not reset that lock: a child forked while another thread was inside
 *   dl_iterate_phdr (the recorder's own check, or the program's) waits forever in the first one
 *   it calls (tests/programs/fork_in_constructor.c: one child in 200 hung, about one run in ten
 *   under load);
 * - a thread whose dl_iterate_phdr callback waits for a lock that an allocating thread holds
 *   (tests/programs/dl_loader.c).
 * So the recorder calls it only when the process starts (init_process: the preloaded
 * library's constructor, or the first hook if that comes first), and never again. That first
 * snapshot is written at the first call site (an image that execs before it allocates writes
 * none). Every snapshot's "m" lines and ranges are kept in memory; a new call site in a module
 * the kept snapshot lacks (a library dlopened since, or one that took an unloaded one's place)
 * adds that module from what _dl_find_object (glibc 2.35, lock-free) says of it, drops a module
 * whose range it overlaps (unloaded: two loaded modules never overlap), and writes the snapshot
 * again. A fork child starts from its parent's last snapshot and goes on the same way. A
 * process whose modules at the start do not fit the kept buffers lists them into a memfd
 * instead, writes them from there (as does a fork child of it) and adds none later (no symbols
 * in libraries it loads later). Snapshots are written in whole lines (a kept one in one
 * writev), so that another thread's Python frame line never falls inside one of theirs.
 * Without _dl_find_object (older glibc) the loader's counters are read with dl_iterate_phdr at
 * each new chunk and call site and at exit, as before stop 41, and a fork child's new modules
 * stay unmapped (no symbols there, nothing hangs). */
#define KEPT_TEXT (1 << 20)     /* (.bss: only the pages written cost memory) */
#define KEPT_MODULES 4096
struct kept_mods {
    uint32_t len, n;
    int full;                   /* something did not fit: not to be published */
    uint64_t lo[KEPT_MODULES], hi[KEPT_MODULES], base[KEPT_MODULES];
    uint32_t name[KEPT_MODULES];              /* name_hash of its path */
    uint32_t at[KEPT_MODULES], span[KEPT_MODULES];   /* its "m" line in text */
    char text[KEPT_TEXT];
};
/* One is built (under g_mods_lock) while the other stays whole for a fork in between. */
static struct kept_mods g_kept[2];
static volatile int g_kept_pub = -1;   /* the whole one */
static int g_kept_overflow;            /* the modules at the start did not fit: none added */
static int g_fork_child;               /* this process began in fork: no dl_iterate_phdr */

static void kept_put(struct kept_mods *k, const char *s, size_t n) {
    if (k->len + n > sizeof k->text) { k->full = 1; return; }
    memcpy(k->text + k->len, s, n);
    k->len += (uint32_t)n;
}

static uint32_t name_hash(const char *s) {   /* FNV-1a */
    uint32_t h = 2166136261u;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 16777619u; }
    return h;
}

/* A module's "m" line. */
static void tb_module(struct textbuf *tb, uint64_t base, uint64_t lo, uint64_t hi,
                      const char *name) {
    tb_str(tb, "m ");
    tb_hex(tb, base); tb_str(tb, " ");
    tb_hex(tb, lo); tb_str(tb, " ");
    tb_hex(tb, hi); tb_str(tb, " ");
    tb_hexbytes(tb, name, str_len(name));
    tb_str(tb, "\n");
}

/* Records in k a module whose "m" line was put in its text from byte `at` on. */
static void kept_entry(struct kept_mods *k, uint64_t base, uint64_t lo, uint64_t hi,
                       uint32_t name, uint32_t at) {
    if (k->n == KEPT_MODULES) { k->full = 1; return; }
    k->lo[k->n] = lo;
    k->hi[k->n] = hi;
    k->base[k->n] = base;
    k->name[k->n] = name;
    k->at[k->n] = at;
    k->span[k->n++] = k->len - at;
}

/* Puts a module's "m" line and its range in k (the caller holds g_mods_lock). */
static void kept_module(struct kept_mods *k, uint64_t base, uint64_t lo, uint64_t hi,
                        const char *name) {
    static struct textbuf line = {.keep_only = 1};   /* a formatter into k */
    uint32_t at = k->len;
    line.copy = k;
    tb_module(&line, base, lo, hi, name);
    kept_entry(k, base, lo, hi, name_hash(name), at);
}

/* The buffer to build the next snapshot in (the caller holds g_mods_lock), empty. */
static struct kept_mods *kept_begin(void) {
    struct kept_mods *k = &g_kept[g_kept_pub == 0];
    k->len = k->n = 0;
    k->full = 0;
    return k;
}

static void kept_publish(struct kept_mods *k) {
    __atomic_store_n(&g_kept_pub, (int)(k - g_kept), __ATOMIC_RELEASE);
}

static uint64_t g_snap_seq;   /* of the last snapshot written (under g_mods_lock) */
static int g_snap_unwritten;  /* the first, taken at the start, is written at the first call
                               * site: an image that never allocates (one that execs at once)
                               * writes none */

/* Writes the kept snapshot to the .mods file, in force from sequence number seq: whole, or
 * with `from` > 0 as "M seq +", the last snapshot written plus the kept lines from byte `from`
 * on (a library added: the file grows by its line, not by the whole list again). */
/* A snapshot's first line into tb: "M seq", and " +" for one that only adds lines to the last
 * (the caller holds g_mods_lock). */
static void snap_head(struct textbuf *tb, uint64_t seq, int plus) {
    g_snap_seq = seq;
    tb_str(tb, "M ");
    tb_hex(tb, seq);
    tb_str(tb, plus ? " +\n" : "\n");
}

static void kept_write_from(uint64_t seq, uint32_t from) {
    int i = __atomic_load_n(&g_kept_pub, __ATOMIC_ACQUIRE);
    struct textbuf tb;   /* (a formatter of the first line) */
    tb_init(&tb);
    snap_head(&tb, seq, from > 0);
    struct iovec iov[3] = {{tb.b, tb.n}, {NULL, 0}, {"E\n", 2}};
    if (i >= 0 && from <= g_kept[i].len) {
        iov[1].iov_base = g_kept[i].text + from;
        iov[1].iov_len = g_kept[i].len - from;
    }
    fd_writev(0, iov, 3);   /* one write: no other thread's line falls inside it */
}

static void kept_write(uint64_t seq) { kept_write_from(seq, 0); }

/* Whether k lists module m (its range, load address and path) for pc. */
static int kept_covers(const struct kept_mods *k, uint64_t pc, const struct hc_found_module *m) {
    uint32_t h = 0;
    for (uint32_t j = 0; j < k->n; j++)
        if (pc >= k->lo[j] && pc < k->hi[j] && k->base[j] == m->base) {
            if (!h) h = name_hash(m->name);
            if (k->name[j] == h) return 1;
        }
    return 0;
}

/* Whether a frame of frames[0..n) lies in a module that the kept snapshot lacks (read without
 * the lock: a published snapshot stays whole until the next but one is built). */
static int kept_lacks(const uintptr_t *frames, int n) {
    int i = __atomic_load_n(&g_kept_pub, __ATOMIC_ACQUIRE);
    for (int f = 0; f < n; f++) {
        struct hc_found_module m;
        if (frames[f] & PY_FRAME_TAG) continue;   /* a Python frame's id, not an address */
        if (hc_find_module(frames[f], &m) && (i < 0 || !kept_covers(&g_kept[i], frames[f], &m)))
            return 1;
    }
    return 0;
}

static void python_probe(void);

static int is_libpython(const char *path) {
    const char *base = path;
    for (const char *c = path; *c; c++)
        if (*c == '/') base = c + 1;
    return strncmp(base, "libpython3", 10) == 0;
}

/* Before frames[0..n) of event `seq` become a location: a frame in a module that the kept
 * snapshot lacks adds that module (and drops the unloaded ones its range overlaps), and the
 * snapshot is written again. With _dl_find_object only; no dl_iterate_phdr. */
static void kept_note_frames(const uintptr_t *frames, int n, uint64_t seq) {
    if (g_mods.fd < 0) return;
    if (UNLIKELY(g_snap_unwritten)) {
        spin_lock(&g_mods_lock);
        if (g_snap_unwritten) kept_write(g_snap_seq);
        g_snap_unwritten = 0;
        spin_unlock(&g_mods_lock);
    }
    if (g_kept_overflow || !kept_lacks(frames, n)) return;
    struct hc_found_module add[MAX_STACK];
    int na = 0, python = 0;
    spin_lock(&g_mods_lock);
    int i = __atomic_load_n(&g_kept_pub, __ATOMIC_ACQUIRE);
    struct kept_mods *have = i >= 0 ? &g_kept[i] : NULL;
    for (int f = 0; f < n && na < MAX_STACK; f++) {
        struct hc_found_module m;
        if ((frames[f] & PY_FRAME_TAG) || !hc_find_module(frames[f], &m))
            continue;   /* a Python frame's id, or in no module (generated code) */
        if (have && kept_covers(have, frames[f], &m)) continue;   /* known */
        int dup = 0;
        for (int a = 0; a < na; a++) dup |= add[a].base == m.base && add[a].lo == m.lo;
        if (!dup) add[na++] = m;
    }
    if (na) {   /* (none: another thread added them meanwhile) */
        struct kept_mods *k = kept_begin();
        int dropped = 0;
        for (uint32_t j = 0; have && j < have->n; j++) {
            int gone = 0;
            for (int a = 0; a < na; a++)
                gone |= have->lo[j] < add[a].hi && add[a].lo < have->hi[j];
            if (gone) { dropped = 1; continue; }
            uint32_t at = k->len;
            kept_put(k, have->text + have->at[j], have->span[j]);
            kept_entry(k, have->base[j], have->lo[j], have->hi[j], have->name[j], at);
        }
        uint32_t added_at = k->len;   /* the new modules' lines */
        for (int a = 0; a < na; a++) {
            kept_module(k, add[a].base, add[a].lo, add[a].hi, add[a].name);
            python |= is_libpython(add[a].name);
        }
        if (!k->full) {
            /* A snapshot that only adds modules is in force from the last one's event: the
             * modules loaded since then, and this event and any other thread's event in them
             * comes through here first; it is written as the new lines alone. One that drops
             * a module is written whole, in force from this event. */
            kept_publish(k);
            if (dropped || !have)
                kept_write(dropped && seq > g_snap_seq ? seq : g_snap_seq);
            else
                kept_write_from(g_snap_seq, added_at);
        }
    }
    spin_unlock(&g_mods_lock);
    if (python && (g_python_want || g_pym_want) && !g_python && g_pym_state == 0)
        python_probe();   /* libpython came with a dlopen */
}

struct mods_ctx {
    struct textbuf *tb;
    uint64_t adds, subs;
    int count_only;
    struct kept_mods *keep;   /* the lines and ranges also kept there */
};

/* The address range spanned by a module's loaded segments (hi = 0 if it has none). */
static void module_range(const struct dl_phdr_info *info, uint64_t *lo, uint64_t *hi) {
    *lo = ~0ull;
    *hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type != PT_LOAD) continue;
        uint64_t a = info->dlpi_addr + p->p_vaddr;
        if (a < *lo) *lo = a;
        if (a + p->p_memsz > *hi) *hi = a + p->p_memsz;
    }
}

static int mods_cb(struct dl_phdr_info *info, size_t size, void *arg) {
    struct mods_ctx *c = arg;
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
    if (c->count_only) return 1;  /* the counters are the same in every callback */
    uint64_t lo, hi;
    module_range(info, &lo, &hi);
    if (hi == 0) return 0;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    if (c->tb) tb_module(c->tb, info->dlpi_addr, lo, hi, name);
    else kept_module(c->keep, info->dlpi_addr, lo, hi, name);
    return 0;
}

/* Looks for CPython (pyframes.h). dlsym allocates (a failed lookup's message): from the boot
 * arena, so that the program's heap stays exactly as it would be untraced. */
static int pym_probe(void);
static void pym_note(uint64_t seq);

static void python_probe(void) {
    T.own++;
    T.boot++;
    int found = py_probe();
    g_python = found && g_python_want;
    if (found && g_pym_want && g_pym_state == 0 && pym_probe())
        __atomic_store_n(&g_pym_state, 1, __ATOMIC_RELEASE);   /* wrappers wait for Python code */
    T.boot--;
    T.own--;
}

/* A loaded libpython (an embedding program may dlopen it). */
static int libpython_cb(struct dl_phdr_info *info, size_t size, void *arg) {
    return is_libpython(info->dlpi_name ? info->dlpi_name : "");
}

/* The module lines of a listing that overflowed the kept buffers, in a memfd (malloc-free, and
 * inherited by a fork child, which may not list the modules itself and so copies them from
 * there; closed on exec). Checked by device and inode before each use: a program that closes
 * every descriptor may have taken its number. */
static int g_overflow = -1;
static dev_t g_overflow_dev;
static ino_t g_overflow_ino;

static int overflow_ok(void) {
    struct stat st;
    return g_overflow > 0 && fstat(g_overflow, &st) == 0 && st.st_dev == g_overflow_dev &&
           st.st_ino == g_overflow_ino;
}

/* The memfd, emptied (created the first time), or -1 (under g_mods_lock). */
static int overflow_fd(void) {
    struct stat st;
    if (overflow_ok()) {
        if (ftruncate(g_overflow, 0) == 0 && lseek(g_overflow, 0, SEEK_SET) == 0) return g_overflow;
        return -1;
    }
    int fd = hc_high_fd(memfd_create("heapcast-modules", MFD_CLOEXEC));
    if (fd > 0 && fstat(fd, &st) == 0) {
        g_overflow_dev = st.st_dev;
        g_overflow_ino = st.st_ino;
        return g_overflow = fd;
    }
    if (fd >= 0) close(fd);
    return g_overflow = -1;
}

/* Writes the memfd's module lines to the .mods file as a snapshot in force from seq (under
 * g_mods_lock, or in a fork child before it has other threads). */
static void overflow_write(uint64_t seq) {
    static struct textbuf buf;
    static char part[1 << 16];
    tb_init(&buf);
    snap_head(&buf, seq, 0);
    for (off_t off = 0; overflow_ok();) {
        ssize_t r = pread(g_overflow, part, sizeof part, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        tb_put(&buf, part, (size_t)r);
        off += r;
    }
    tb_str(&buf, "E\n");
    tb_flush(&buf);
}

/* Lists the loaded modules (dl_iterate_phdr), in force from event `seq`: SNAP_START, the
 * process's first, kept and written at its first call site (with _dl_find_object; else now);
 * SNAP_IF_MOVED, written if the loader's counters moved since the last one (no
 * _dl_find_object). Not in a fork child. */
enum { SNAP_START, SNAP_IF_MOVED };
static void snapshot_modules(int when, uint64_t seq) {
    if (g_mods.fd < 0 || g_fork_child) return;
    if (when == SNAP_IF_MOVED) {
        struct mods_ctx probe = {0};
        probe.count_only = 1;
        dl_iterate_phdr(mods_cb, &probe);
        if (probe.adds == g_mods_adds && probe.subs == g_mods_subs) return;
    }
    if (when == SNAP_IF_MOVED && (g_python_want || g_pym_want) && !g_python &&
        g_pym_state == 0 && dl_iterate_phdr(libpython_cb, NULL))
        python_probe();   /* libpython came with a dlopen (at the start init_process probed) */
    if (__atomic_exchange_n(&g_mods_lock, 1, __ATOMIC_ACQUIRE)) return;  /* another thread does it */
    if (seq < g_snap_seq) seq = g_snap_seq;   /* (another thread's, written meanwhile) */
    struct mods_ctx c = {NULL, 0, 0, 0, kept_begin()};
    dl_iterate_phdr(mods_cb, &c);
    if (!c.keep->full) {
        kept_publish(c.keep);
        if (when == SNAP_START && hc_have_find_object()) {
            g_snap_seq = seq;
            g_snap_unwritten = 1;
        } else {
            kept_write(seq);
        }
    } else {   /* more than the kept buffers hold: listed into a memfd, written from there, and
                * none added later */
        static struct textbuf buf;  /* under g_mods_lock */
        g_kept_overflow = 1;
        tb_init(&buf);
        buf.fd = overflow_fd();
        c.tb = &buf;
        if (buf.fd > 0) {
            dl_iterate_phdr(mods_cb, &c);
            tb_flush(&buf);
            overflow_write(seq);
        } else {   /* (no memfd: written as listed) */
            buf.fd = 0;
            snap_head(&buf, seq, 0);
            dl_iterate_phdr(mods_cb, &c);
            tb_str(&buf, "E\n");
            tb_flush(&buf);
        }
    }
    g_mods_adds = c.adds;
    g_mods_subs = c.subs;
    spin_unlock(&g_mods_lock);
}

static void write_process_meta(void) {
    static struct textbuf tb;  /* called once per process, before other threads can record */
    static char buf[1 << 16];
    tb.n = 0;
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf);
    tb_str(&tb, "X ");
    if (n > 0) tb_hexbytes(&tb, buf, (size_t)n);
    tb_str(&tb, "\nA ");
    n = read_file("/proc/self/cmdline", buf, sizeof buf);
    if (n > 0) tb_hexbytes(&tb, buf, (size_t)n);
    tb_str(&tb, "\nC ");
    if (getcwd(buf, sizeof buf)) tb_hexbytes(&tb, buf, str_len(buf));
    tb_str(&tb, "\n");
    const char *pm = getenv("PYTHONMALLOC");   /* (CPython's allocator: `record` notes pymalloc) */
    if (pm) {
        tb_str(&tb, "V ");
        tb_hexbytes(&tb, pm, str_len(pm));
        tb_str(&tb, "\n");
    }
    tb_flush(&tb);
}

/* ---------------------------------------------------------------- threads' mappings */
/* (A vfork child shares all of this with its parent: see maps_reap.) */

/* A thread's chunk and location table are mappings of its own, and a thread that ends leaves
 * them behind: glibc frees the thread's last blocks after every exit hook a library can set (key
 * destructors, thread_local destructors), and each free may need them again. Left there, a
 * program that starts and ends threads by the tens of thousands reached the kernel's limit on
 * mappings (vm.max_map_count), and its own mmap calls then failed. So every recording thread has
 * an entry here, and a thread that starts recording reaps the entries of the threads that have
 * ended (tgkill answers ESRCH: the thread runs no more code), once the table has doubled since
 * the last reaping (a system call per thread start, amortized); so does a thread's new chunk,
 * at most every REAP_NS (maps_reap_now_and_then). Reaping marks the ended thread's chunk kept
 * and ended for the conversion while the program runs (raw_format.h) and unmaps both. */
struct thread_maps {
    volatile int32_t os_tid;         /* 0: a free entry */
    uint32_t gen;                    /* g_gen when rec was mapped: rec is in this process's file */
    uint32_t bytes;                  /* rec's size */
    uint32_t next_free;              /* a free entry: the next free one's index + 1 (0: none) */
    struct hc_record *rec;           /* the thread's chunk, or NULL */
    uint64_t *loc_table;
};
#define THREAD_MAPS (1u << 17)       /* entries (4 MiB, MAP_NORESERVE: pages as they are used) */
static struct thread_maps *g_maps;
static uint32_t g_maps_top;          /* entries ever handed out (the others are zero) */
static uint32_t g_maps_free;         /* the first free entry's index + 1 (0: none) */
static uint32_t g_maps_used, g_maps_reaped;  /* entries in use; in use after the last reaping */
static uint64_t g_maps_reap_ns;      /* when the last reaping was */
#define REAP_NS 100000000ull         /* a thread's new chunk reaps if the last one is older */
#define REAP_MOST 256                /* entries it looks at */
static uint32_t g_maps_cursor;       /* where the next reaping starts */
static volatile int g_maps_lock;
/* Location tables of ended threads, for the next threads to take as they are: their ids are
 * this process's (defined in the file before the ended thread's last events, which come before
 * any event of a thread that takes the table), so a new thread neither maps 256 KiB nor defines
 * its call sites again (20,000 short threads: 40,000 definitions for the reader to merge). */
#define TABLE_POOL 64
#define TABLE_POOL_BYTES (32u << 20)  /* in all: a pooled table's pages stay resident, and a
                                         grown one may be 64 MiB (table_grow) */
static uint64_t *g_table_pool[TABLE_POOL];
static uint32_t g_table_pooled;
static uint64_t g_table_pool_bytes;

/* A location table: a mapping of (slots + 1) 16-byte pairs, the first one its header (slots,
 * pairs in use), the table itself the rest. Where a table goes (a thread, the pool of ended
 * threads' tables, a fork child) its size goes with it. */
static uint64_t *table_new(uint32_t slots) {
    uint64_t *m = sys_mmap(NULL, ((size_t)slots + 1) * 16, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    m[0] = slots;
    return m + 2;
}

static inline uint32_t table_slots(const uint64_t *tab) { return (uint32_t)tab[-2]; }

static void table_free(uint64_t *tab) { sys_munmap(tab - 2, ((size_t)table_slots(tab) + 1) * 16); }

static void table_clear(uint64_t *tab) {
    memset(tab, 0, (size_t)table_slots(tab) * 16);
    tab[-1] = 0;
}

/* Makes tab (or NULL) the calling thread's location table. */
static void table_use(struct tstate *t, uint64_t *tab) {
    t->loc_table = tab;
    t->loc_mask = tab ? table_slots(tab) - 1 : 0;
    if (t->maps) t->maps->loc_table = tab;
}

static void maps_init(void) {
    void *m = sys_mmap(NULL, THREAD_MAPS * sizeof *g_maps, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    g_maps = m == MAP_FAILED ? NULL : m;
}

static void maps_lock(void) {
    while (__atomic_exchange_n(&g_maps_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
}
static int maps_trylock(void) { return !__atomic_exchange_n(&g_maps_lock, 1, __ATOMIC_ACQUIRE); }
static void maps_unlock(void) { __atomic_store_n(&g_maps_lock, 0, __ATOMIC_RELEASE); }

static void maps_release(struct thread_maps *e) {   /* under the lock */
    e->os_tid = 0;
    e->rec = NULL;
    e->loc_table = NULL;
    e->next_free = g_maps_free;
    g_maps_free = (uint32_t)(e - g_maps) + 1;
    g_maps_used--;
}

/* Gives back the mappings of the threads that have ended among `most` entries from the cursor
 * on (all of them when most >= g_maps_top), under the lock. */
static void maps_reap(uint32_t most) {
    g_maps_reap_ns = mono_ns();
    pid_t pid = getpid();
    /* A vfork child (or posix_spawn's) runs in its parent's memory, recorder state included,
     * under a pid of its own: to it every thread of the parent looks gone. Only the process
     * whose file this is may reap. */
    if (!H || pid != H->pid) return;
    if (most > g_maps_top) most = g_maps_top;
    for (uint32_t k = 0; k < most; k++) {
        if (g_maps_cursor >= g_maps_top) g_maps_cursor = 0;
        struct thread_maps *e = &g_maps[g_maps_cursor++];
        if (!e->os_tid || syscall(SYS_tgkill, pid, e->os_tid, 0) == 0 || errno != ESRCH)
            continue;
        if (e->rec) {
            if (e->gen == __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE)) {
                struct hc_chunk *c = (struct hc_chunk *)e->rec;
                __atomic_store_n(&c->os_tid, c->os_tid | HC_CHUNK_KEPT | HC_CHUNK_ENDED,
                                 __ATOMIC_RELEASE);
            }
            sys_munmap(e->rec, e->bytes);
        }
        if (e->loc_table) {
            uint64_t bytes = (uint64_t)table_slots(e->loc_table) * 16;
            if (g_table_pooled < TABLE_POOL && g_table_pool_bytes + bytes <= TABLE_POOL_BYTES &&
                e->gen == __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE)) {
                g_table_pool[g_table_pooled++] = e->loc_table;
                g_table_pool_bytes += bytes;
            } else {
                table_free(e->loc_table);
            }
        }
        maps_release(e);
    }
    if (most == g_maps_top) g_maps_reaped = g_maps_used;
}

/* Reaps from a thread's new chunk (`now`: mono_ns) when the last reaping is REAP_NS old, so
 * that an ended thread's chunk is soon marked kept even when no thread starts; never waits, and
 * looks at REAP_MOST entries at most, in turn (10,000 live threads would be 3 ms of tgkill). */
static void maps_reap_now_and_then(uint64_t now) {
    if (!g_maps || now - __atomic_load_n(&g_maps_reap_ns, __ATOMIC_RELAXED) < REAP_NS ||
        !maps_trylock())
        return;
    maps_reap(REAP_MOST);   /* (errno: claim_chunk runs inside slots_slow's quiet bracket) */
    maps_unlock();
}

/* An entry for the calling thread (NULL: none left; its mappings then stay when it ends), after
 * reaping the ended threads' when the table has doubled since the last time; and, when *table is
 * NULL, an ended thread's location table if there is one. */
static struct thread_maps *maps_register(uint64_t **table) {
    if (!g_maps) return NULL;
    maps_lock();   /* (errno: from thread_ready_slow's quiet bracket) */
    if (!*table && g_table_pooled) {
        *table = g_table_pool[--g_table_pooled];
        g_table_pool_bytes -= (uint64_t)table_slots(*table) * 16;
    }
    if (g_maps_used >= 64 && g_maps_used >= 2 * g_maps_reaped) maps_reap(THREAD_MAPS);
    struct thread_maps *e = NULL;
    if (g_maps_free) {
        e = &g_maps[g_maps_free - 1];
        g_maps_free = e->next_free;
    } else if (g_maps_top < THREAD_MAPS) {
        e = &g_maps[g_maps_top++];
    }
    if (e) {
        e->os_tid = (int32_t)syscall(SYS_gettid);
        e->gen = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
        e->rec = NULL;
        e->loc_table = NULL;
        g_maps_used++;
    }
    maps_unlock();
    return e;
}

/* In a fork child: the other threads' mappings came along, and those threads are not here. */
static void maps_after_fork(struct thread_maps *mine) {
    g_maps_lock = 0;   /* (another thread may have held it at the fork: the list is rebuilt) */
    if (!g_maps) return;
    g_maps_free = 0;
    g_maps_used = g_maps_top;
    for (uint32_t i = g_maps_top; i-- > 0;) {
        struct thread_maps *e = &g_maps[i];
        if (e == mine) continue;
        if (e->os_tid) {
            if (e->rec) sys_munmap(e->rec, e->bytes);   /* the parent's file: left as it is */
            if (e->loc_table) table_free(e->loc_table);
        }
        maps_release(e);
    }
    if (mine) {
        mine->os_tid = (int32_t)syscall(SYS_gettid);
        mine->rec = NULL;
    }
    g_maps_reaped = g_maps_used;
    while (g_table_pooled)   /* their ids are the parent's */
        table_free(g_table_pool[--g_table_pooled]);
    g_table_pool_bytes = 0;
}

/* ---------------------------------------------------------------- files */

static void path_join(char *out, size_t cap, const char *name) {
    size_t n = str_len(g_dir), k = str_len(name);
    if (n + 1 + k + 1 > cap) { out[0] = 0; return; }
    memcpy(out, g_dir, n);
    out[n] = '/';
    memcpy(out + n + 1, name, k + 1);
}

static void fmt_name(char *out, int pid, uint32_t image, const char *ext) {
    struct textbuf tb;  /* used only as a formatter */
    tb_init(&tb);
    char d[16]; int i = 15; d[15] = 0;
    unsigned v = (unsigned)pid;
    do { d[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    tb_str(&tb, d + i);
    if (image) {
        i = 15; v = image;
        do { d[--i] = (char)('0' + v % 10); v /= 10; } while (v);
        tb_str(&tb, "."); tb_str(&tb, d + i);
    }
    tb_str(&tb, ext);
    memcpy(out, tb.b, tb.n);
    out[tb.n] = 0;
}

/* The largest file this process may write: growing a file past RLIMIT_FSIZE raises SIGXFSZ,
 * which would kill the program. */
static uint64_t file_size_limit(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_FSIZE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return (uint64_t)r.rlim_cur;
}

/* Writes zeros over [off, off + size) of file fd through the file; 1 if all were written. Before
 * a region is mapped: fallocate leaves "unwritten" extents, and on ext4 the first write fault
 * of each of their pages converts it (a fresh 1 MiB chunk took 2.5-4.2 ms to fill through the
 * mapping, 0.2 ms once written through the file; the first such fault in a new file, 1.7-2.1
 * ms alone). For a chunk a failure is harmless: the mapping's writes then do it the slow way. */
static int write_zeros(int fd, uint64_t off, uint32_t size) {
    static const char zeros[64 << 10];   /* (.bss: the kernel's zero page when read) */
    while (size) {
        uint32_t n = size < sizeof zeros ? size : (uint32_t)sizeof zeros;
        ssize_t w = pwrite(fd, zeros, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 0;
        off += (uint64_t)w;
        size -= (uint32_t)w;
    }
    return 1;
}

/* Moves the reservation frontier (file_reserved) up to `end`, never down: the drainer moves it
 * too, for a copy it places there (drain.c, copy_chunk). */
static void reserved_up_to(uint64_t end) {
    uint64_t r = __atomic_load_n(&H->file_reserved, __ATOMIC_ACQUIRE);
    while (r < end && !__atomic_compare_exchange_n(&H->file_reserved, &r, end, 0,
                                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}

/* Ensures the file is backed up to `end` bytes. fallocate, not ftruncate: a sparse file on a full
 * disk would turn our stores into SIGBUS in the program. A reservation runs from the frontier
 * (file_reserved) to GROW_BYTES past `end`. The drainer's copies also take space at the file's
 * end, each its own fallocate; one placed at the frontier moves it, so that a later reservation
 * does not start below it: it would fallocate again the copies that the converter had punched
 * out once converted (they came back as unwritten extents: disk space held again, and pages
 * that the final scan had to walk one by one, 0.6-1 s after py_dicts' exit). */
static int reserve_file(int fd, uint64_t end) {
    if (end <= __atomic_load_n(&H->file_reserved, __ATOMIC_ACQUIRE)) return 1;
    spin_lock(&g_grow_lock);
    int ok = 1;
    uint64_t have = H->file_reserved;
    uint64_t limit = file_size_limit();
    if (end > have && end > limit) {
        ok = 0;
        __atomic_fetch_or(&H->flags, HC_FLAG_TRUNCATED, __ATOMIC_RELAXED);
    } else if (end > have) {
        uint64_t want = end + GROW_BYTES < limit ? end + GROW_BYTES : limit;
        if (posix_fallocate(fd, (off_t)have, (off_t)(want - have)) == 0) {
            reserved_up_to(want);
        } else if (posix_fallocate(fd, (off_t)have, (off_t)(end - have)) == 0) {
            reserved_up_to(end);
        } else {
            ok = 0;
            __atomic_fetch_or(&H->flags, HC_FLAG_TRUNCATED, __ATOMIC_RELAXED);
        }
    }
    spin_unlock(&g_grow_lock);
    return ok;
}

/* Opens "<pid>[.n].raw" and its ".mods" companion, maps and fills the header. */
static int open_process_files(int forked_from, uint64_t fork_seq) {
    char name[64], path[4200];
    int pid = getpid();
    int fd = -1;
    uint32_t image = 0;
    for (; image < 1000; image++) {
        fmt_name(name, pid, image, ".raw");
        path_join(path, sizeof path, name);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
        if (fd < 0) continue;
        /* A process of this pid that has ended may have been converted already (`heapcast
         * record` converts ended processes while the program runs) and its raw file removed:
         * its .hct keeps the name taken, for a later process that reuses the pid. */
        char hct[64], hpath[4200];
        fmt_name(hct, pid, image, ".hct");
        path_join(hpath, sizeof hpath, hct);
        if (access(hpath, F_OK) != 0) break;
        close(fd);
        unlink(path);
        fd = -1;
    }
    if (fd < 0) return 0;
    fd = hc_file_keep(&g_raw, fd, path, O_RDWR, 0);
    if (fd < 0) {
        unlink(path);
        return 0;
    }
    /* The header page written through the file before it is mapped (write_zeros: the first
     * write fault on it cost a program that runs 200 short programs 2 ms each). It stays zero,
     * so a reader still sees no header yet. */
    uint64_t limit = file_size_limit();
    if (limit >= HC_HEADER_SIZE && !write_zeros(fd, 0, HC_HEADER_SIZE)) {
        hc_file_forget(&g_raw);
        unlink(path);
        return 0;
    }
    uint64_t first = HC_HEADER_SIZE + FIRST_BYTES < limit ? HC_HEADER_SIZE + FIRST_BYTES : limit;
    if (first < HC_HEADER_SIZE || (posix_fallocate(fd, 0, (off_t)first) != 0 &&
                                   posix_fallocate(fd, 0, HC_HEADER_SIZE) != 0)) {
        hc_file_forget(&g_raw);
        unlink(path);
        return 0;
    }
    struct hc_header *h = sys_mmap(NULL, HC_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) { hc_file_forget(&g_raw); return 0; }
    fmt_name(name, pid, image, ".mods");
    path_join(path, sizeof path, name);
    hc_file_keep(&g_mods, open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600),
                 path, O_WRONLY | O_APPEND, 0);
    g_mods_bytes = 0;

    struct stat st;
    uint64_t reserved = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : HC_HEADER_SIZE;
    h->version = HC_RAW_VERSION;
    h->header_size = HC_HEADER_SIZE;
    h->record_size = HC_RECORD_SIZE;
    h->stack_depth = (uint32_t)g_stack_depth;
    h->pid = pid;
    h->ppid = getppid();
    h->forked_from = forked_from;
    h->image = image;
    h->fork_seq = fork_seq;
    h->unwind = (uint32_t)g_unwind_dwarf;
    h->clock_every = g_clock_every;
    /* The process's first clock pair anchors the conversion of ticks to ns (trace/raw.py,
     * fit_clock). The first clock_gettime of a process maps the vDSO's data page (about 7 us
     * in a VM): read once before, or the pair's ns lag its ticks and bias the fitted slope. */
    (void)mono_ns();
    h->start_tsc = now_ticks();
    h->start_mono_ns = mono_ns();
    h->start_real_ns = real_ns();
    h->seq = 1;
    h->file_end = HC_HEADER_SIZE;
    h->file_reserved = reserved;
    h->flags = (g_mmap ? HC_FLAG_MMAP : 0) | (g_use_tsc ? HC_FLAG_TSC : 0) |
               (g_recycle ? HC_FLAG_RECYCLE : 0);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(h->magic, HC_RAW_MAGIC, 8);  /* last: a reader sees a complete header or none */

    H = h;
    g_mods_adds = g_mods_subs = ~0ull;
    if (g_mods.fd >= 0) write_process_meta();
    return 1;
}

static int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    int v = 0;
    for (; *s >= '0' && *s <= '9'; s++) v = v * 10 + (*s - '0');
    return v;
}

static int tsc_is_reliable(void) {
#if defined(__x86_64__)
    char buf[64];
    ssize_t n = read_file("/sys/devices/system/clocksource/clocksource0/current_clocksource",
                          buf, sizeof buf - 1);
    return n >= 3 && memcmp(buf, "tsc", 3) == 0;
#else
    return 0;
#endif
}

static void atfork_child(void);

/* Without --follow-children, the first image to start claims the trace by writing its pid into
 * root.claim. A later image with that same pid (the program exec'd itself into another, as
 * wrapper scripts do) is the same process and is traced; one with another pid (a child that
 * exec'd) is not. */
static int claim_root(void) {
    char path[4200], buf[32];
    int pid = getpid(), n = 0;
    for (int v = pid; v; v /= 10) n++;
    for (int i = n, v = pid; i > 0; v /= 10) buf[--i] = (char)('0' + v % 10);
    path_join(path, sizeof path, "root.claim");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        ssize_t w = write(fd, buf, (size_t)n);
        close(fd);
        return w == n;
    }
    if (errno != EEXIST) return 1;  /* no claim possible: trace rather than lose the program */
    char have[32];
    ssize_t r = read_file(path, have, sizeof have);
    return r == n && memcmp(have, buf, (size_t)n) == 0;
}
static void heapcast_start_marker(void) {}
static int self_cb(struct dl_phdr_info *info, size_t size, void *arg);

/* Appends "U <pid> <ppid> <exe> <cmdline>\n" (hex, as the .mods text fields) to the trace
 * directory's untraced.log, in one O_APPEND write: this image runs untraced (without
 * --follow-children, a child that exec'd another program), and `heapcast record` names it
 * at the end rather than leave the user to wonder where its heap went. Paths and arguments
 * are cut at UNTRACED_FIELD bytes, so that the line fits the one write (the textbuf is only
 * the formatter here: the line never fills it, so it never flushes to the .mods file). */
#define UNTRACED_FIELD 1024
static void note_untraced(void) {
    static struct textbuf tb;   /* (init_process runs once per image) */
    static char field[UNTRACED_FIELD];
    char path[4200];
    path_join(path, sizeof path, "untraced.log");
    if (!path[0]) return;
    tb_init(&tb);
    tb_str(&tb, "U ");
    tb_hex(&tb, (uint64_t)getpid());
    tb_str(&tb, " ");
    tb_hex(&tb, (uint64_t)getppid());
    for (int k = 0; k < 2; k++) {
        ssize_t got = k == 0 ? readlink("/proc/self/exe", field, sizeof field)
                             : read_file("/proc/self/cmdline", field, sizeof field);
        tb_str(&tb, " ");
        if (got > 0) tb_hexbytes(&tb, field, (size_t)got);
    }
    tb_str(&tb, "\n");
    _Static_assert(64 + 4 * UNTRACED_FIELD < sizeof tb.b, "an untraced line fits the buffer");
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    ssize_t w;
    do w = write(fd, tb.b, tb.n); while (w < 0 && errno == EINTR);
    close(fd);
}

static void init_process(void) {
    int expected = ST_UNINIT;
    if (!__atomic_compare_exchange_n(&g_state, &expected, ST_INITING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == ST_INITING) sched_yield();
        return;
    }
    T.own++;
    resolve_real();
    int state = ST_OFF;
    const char *dir = getenv("HEAPCAST_DIR");
    if (dir && *dir && str_len(dir) < sizeof g_dir) {
        memcpy(g_dir, dir, str_len(dir) + 1);
        g_stack_depth = env_int("HEAPCAST_STACKS", 0);
        if (g_stack_depth > MAX_STACK) g_stack_depth = MAX_STACK;
        const char *uw = getenv("HEAPCAST_UNWIND");
        g_unwind_dwarf = uw && strcmp(uw, "dwarf") == 0;
        g_mmap = env_int("HEAPCAST_MMAP", 0) == 1;
        g_follow = env_int("HEAPCAST_FOLLOW", 0) == 1;
        g_recycle = env_int("HEAPCAST_DRAIN", 0) == 1;
        if (g_recycle) {   /* without a drainer no tick bounds a reading's age */
            int every = env_int("HEAPCAST_CLOCK_EVERY", 1);
            g_clock_every = every > 1 ? (every < CLOCK_EVERY_MAX ? (uint32_t)every : CLOCK_EVERY_MAX) : 1;
        }
        g_python_want = env_int("HEAPCAST_PYTHON", 1) == 1;
        g_pym_want = env_int("HEAPCAST_PYMALLOC", 0) == 1;
        if (g_python_want || g_pym_want) python_probe();
        g_use_tsc = tsc_is_reliable();
        int traced = 1;
        if (!g_follow && !claim_root()) {
            traced = 0;
            note_untraced();
        }
        dl_iterate_phdr(self_cb, (void *)(uintptr_t)&heapcast_start_marker);
        if (traced && open_process_files(0, 0)) {
            snapshot_modules(SNAP_START, H->seq);   /* the module map's only dl_iterate_phdr
                                                     * ("module snapshots") */
            if (g_stack_depth && g_unwind_dwarf) {
                void *warm[4];
                backtrace(warm, 4);  /* loads libgcc_s now, not inside a later hook */
            }
            pthread_atfork(NULL, NULL, atfork_child);
            maps_init();
            g_seq_mode = seq_start_mode();
            state = ST_ACTIVE;
            hc_hook_init(getenv("HEAPCAST_POLICY"), g_dir, env_int("HEAPCAST_POLICY_EVERY", 1),
                         env_int("HEAPCAST_POLICY_FEATURES", 0) == 1);
        }
    }
    T.own--;
    __atomic_store_n(&g_state, state, __ATOMIC_RELEASE);
}

/* In a fork child: a new raw file that starts from the parent's heap state at fork_seq. */
static void atfork_child(void) {
    if (g_state != ST_ACTIVE || !H) return;
    int parent = H->pid;
    uint64_t fork_seq = __atomic_load_n(&H->seq, __ATOMIC_ACQUIRE);
    struct hc_header *old = H;
    H = NULL;
    if (T.rec) sys_munmap(T.rec, chunk_bytes(&T));
    T.rec = NULL;
    T.pos = T.cap = 0;
    maps_after_fork(T.maps);
    sys_munmap(old, HC_HEADER_SIZE);
    hc_file_forget(&g_raw);   /* (the parent's files) */
    hc_file_forget(&g_mods);
    g_grow_lock = 0;
    g_mods_lock = 0;
    __atomic_add_fetch(&g_gen, 1, __ATOMIC_RELEASE);
    T.busy++;
    g_seq_inside = 0;
    g_seq_mode = seq_start_mode();   /* this thread is the child's only one */
    struct quiet q;   /* fork() returns 0 in the child with errno as it was, uncancelled */
    quiet_begin(&q);
    g_fork_child = 1;   /* no dl_iterate_phdr from now on: its lock may be held ("modules in a
                         * fork child") */
    int ok = open_process_files(parent, fork_seq);
    g_snap_unwritten = 0;   /* the parent's, if it had not allocated yet: written here */
    if (ok && g_mods.fd >= 0) {   /* (g_mods_lock is free: reset above) */
        if (g_kept_overflow) overflow_write(H->seq);
        else kept_write(H->seq);
    }
    if (ok) hc_hook_fork_child();
    /* the wrappers came with the fork (or some of them: another thread was installing them) */
    if (ok && g_pym_state >= 2) pym_note(fork_seq);
    quiet_end(&q);
    T.busy--;
    if (!ok) __atomic_store_n(&g_state, ST_OFF, __ATOMIC_RELEASE);
}

/* ---------------------------------------------------------------- chunks */

static void stack_bounds(struct tstate *t) {
    pthread_attr_t attr;
    void *addr; size_t size;
    t->stk_lo = t->stk_hi = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
            t->stk_lo = (uintptr_t)addr;
            t->stk_hi = (uintptr_t)addr + size;
        }
        pthread_attr_destroy(&attr);
    }
}

/* Hands a full 1 MiB chunk, still mapped, to the drainer; 0 if the queue is full. */
static int seal_chunk(uint64_t off, struct hc_record *m) {
    struct hc_queue *q = &H->sealed;
    uint64_t t = __atomic_load_n(&q->tail, __ATOMIC_RELAXED);
    do {
        if (t - __atomic_load_n(&q->head, __ATOMIC_ACQUIRE) >= HC_QUEUE) return 0;
    } while (!__atomic_compare_exchange_n(&q->tail, &t, t + 1, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    /* The drainer cleared this entry before it advanced head past it. */
    q->e[t % HC_QUEUE].addr = (uint64_t)(uintptr_t)m;
    __atomic_store_n(&q->e[t % HC_QUEUE].off, off, __ATOMIC_RELEASE);
    return 1;
}

/* Takes a drained 1 MiB chunk (zeroed, still mapped by this process); 0 if there is none. */
static struct hc_record *reuse_chunk(uint64_t *off) {
    struct hc_queue *q = &H->free;
    uint64_t h = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    for (;;) {
        if (h == __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE)) return NULL;
        /* Read before the CAS: the drainer rewrites entry h only after head has passed it, and
         * then this CAS fails. */
        uint64_t o = q->e[h % HC_QUEUE].off, a = q->e[h % HC_QUEUE].addr;
        if (__atomic_compare_exchange_n(&q->head, &h, h + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            if (o & HC_FREE_UNMAP) {   /* kept in place by the drainer: not ours to reuse */
                sys_munmap((void *)(uintptr_t)a, HC_CHUNK_MAX);
                h = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
                continue;
            }
            *off = o;
            return (struct hc_record *)(uintptr_t)a;
        }
    }
}

/* Maps a chunk with room for at least `slots` records after its header: a recycled one when the
 * drainer has handed one back, else fresh file space. */
static int claim_chunk(struct tstate *t, uint32_t slots) {
    if (__atomic_load_n(&H->flags, __ATOMIC_RELAXED) & HC_FLAG_TRUNCATED) return 0;  /* disk full */
    uint32_t size = t->next_size ? t->next_size : HC_CHUNK_MIN;
    while (size < (slots + 1 + NESTED_RESERVE) * HC_RECORD_SIZE) size *= 2;  /* 1: the header */
    if (t->next_size < HC_CHUNK_MAX) t->next_size = size * 2;
    if (t->rec) {
        size_t bytes = chunk_bytes(t);
        if (!(g_recycle && bytes == HC_CHUNK_MAX && seal_chunk(t->off, t->rec))) {
            /* Left in place for good (the drainer's queue is full, or no drainer): say so, so
             * that the conversion while the program runs can read it rather than wait for the
             * exit (raw_format.h). Every slot of it was written before: a signal handler's event
             * in this slow path is lost and counted. */
            struct hc_chunk *c = (struct hc_chunk *)t->rec;
            __atomic_store_n(&c->os_tid, c->os_tid | HC_CHUNK_KEPT, __ATOMIC_RELEASE);
            sys_munmap(t->rec, bytes);
        }
        t->rec = NULL;
        t->cap = 0;
        if (t->maps) t->maps->rec = NULL;
    }
    uint64_t off = 0;
    struct hc_record *m = g_recycle && size == HC_CHUNK_MAX ? reuse_chunk(&off) : NULL;
    if (!m) {
        int fd = hc_file_fd(&g_raw);   /* (checked: the program may have taken its number) */
        if (fd < 0) return 0;
        if (t->spare_size >= size) {   /* the space of a claim whose mapping failed */
            off = t->spare_off;
            size = t->spare_size;
        } else {
            off = __atomic_fetch_add(&H->file_end, size, __ATOMIC_RELAXED);
            if (!reserve_file(fd, off + size)) return 0;
            write_zeros(fd, off, size);
        }
        t->spare_size = 0;
        /* Not MAP_POPULATE: it pre-faults the pages for reading, and every page then faults again
         * on its first write. MADV_POPULATE_WRITE (Linux 5.14) maps them writable in one call; on
         * an older kernel it fails harmlessly and the first writes fault instead. */
        m = sys_mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
        if (m == MAP_FAILED) {
            /* No address space left (RLIMIT_AS, vm.max_map_count): the space is kept for the
             * next try. Taking fresh space at each try grew the file by a chunk per event
             * until the disk was full. */
            t->spare_off = off;
            t->spare_size = size;
            return 0;
        }
        syscall(SYS_madvise, m, size, 23 /* MADV_POPULATE_WRITE */);
    }
    struct hc_chunk *c = (struct hc_chunk *)m;
    c->tid = t->tid;
    c->size = size;
    c->os_tid = (uint32_t)syscall(SYS_gettid);
    c->tsc = now_ticks();
    c->mono_ns = mono_ns();
    t->tbase = c->tsc;
    t->clock_last = c->tsc;   /* (a fresher reading: the next events' times are not below it) */
    __atomic_store_n(&c->magic, HC_CHUNK_MAGIC, __ATOMIC_RELEASE);
    t->rec = m;
    t->off = off;
    t->cap = size / HC_RECORD_SIZE - NESTED_RESERVE;
    t->pos = 1;
    if (t->maps) {
        t->maps->gen = __atomic_load_n(&g_gen, __ATOMIC_RELAXED);
        t->maps->bytes = size;
        t->maps->rec = m;
    }
    maps_reap_now_and_then(c->mono_ns);
    if (!hc_have_find_object()) snapshot_modules(SNAP_IF_MOVED, H->seq);
    return 1;
}

/* Makes the calling thread ready to record; 0 means pass the call through unrecorded. */
static int thread_ready_body(struct tstate *t) {
    if (t->own) return 0;
    if (g_state == ST_UNINIT || g_state == ST_INITING) init_process();
    if (g_state != ST_ACTIVE) return 0;
    if (t->busy) {  /* a signal handler interrupted the recorder on this thread */
        if (H) __atomic_fetch_add(&H->lost, 1, __ATOMIC_RELAXED);
        return 0;
    }
    uint32_t gen = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
    if (t->gen == gen) return 1;
    t->busy++;
    t->rec = NULL;  /* a stale chunk of the parent process was unmapped by atfork_child */
    t->pos = t->cap = 0;
    t->next_size = 0;
    t->spare_size = t->skip = t->fails = 0;   /* (a spare was in the parent's file) */
    t->tid = __atomic_fetch_add(&H->threads, 1, __ATOMIC_RELAXED);
    if (t->tid != 0 && g_seq_mode != SEQ_LOCKED) seq_go_locked();
    t->self = (uintptr_t)pthread_self();
    if (g_stack_depth && !g_unwind_dwarf) {
        t->own++;
        stack_bounds(t);
        t->own--;
    }
    /* After a fork the table's ids belong to the parent's file: it starts empty, and small (a
     * grown one would cost a clear of up to 64 MiB in every child). */
    uint64_t *tab = t->loc_table;
    if (tab && table_slots(tab) > LOC_TABLE_SLOTS) {
        table_free(tab);
        tab = NULL;
    } else if (tab) {
        table_clear(tab);
    }
    if (!t->maps)   /* (after a fork, the forking thread has one) */
        t->maps = maps_register(&tab);
    if (!tab) tab = table_new(LOC_TABLE_SLOTS);
    table_use(t, tab);
    t->gen = gen;
    t->busy--;
    return 1;
}

static __attribute__((noinline)) int thread_ready_slow(struct tstate *t) {
    struct quiet q;   /* (quiet.h) */
    quiet_begin(&q);
    int ready = thread_ready_body(t);
    quiet_end(&q);
    return ready;
}

static inline int thread_ready(struct tstate *t) {
    /* ST_OFF (an image not traced, or tracing that could not start) answers without a call:
     * every heap call of an untraced child passes here. */
    return LIKELY(t->gen == g_gen && g_state == ST_ACTIVE && !(t->own | t->busy)) ||
           (g_state != ST_OFF && thread_ready_slow(t));
}

/* Returns room for n consecutive slots, or NULL (the caller counts the loss). */
static struct hc_record *slots_slow(struct tstate *t, uint32_t i, uint32_t n);

static inline __attribute__((always_inline)) struct hc_record *slots(struct tstate *t, uint32_t n) {
    uint32_t i = claim_slots(&t->pos, n);
    if (LIKELY(i + n <= t->cap)) return &t->rec[i];
    return slots_slow(t, i, n);
}

/* The claim of slots i..i+n ran past the chunk's end: open a new chunk (or lose the event). */
static __attribute__((noinline)) struct hc_record *slots_slow(struct tstate *t, uint32_t i,
                                                              uint32_t n) {
    /* A signal handler that interrupted our own slow path: the nested event is lost, and
     * counted. */
    if (t->busy) return NULL;
    /* A signal handler's event while another event is being written, which holds a slot of this
     * chunk and its time base: this chunk must stay. Its reserve takes the nested event. */
    if (t->emitting > 1)
        return t->rec && i + n <= t->cap + NESTED_RESERVE ? &t->rec[i] : NULL;
    /* After failed claims, the next events are lost without a try, up to 65,536 before each:
     * a thread that cannot map a chunk does not make three system calls per event. */
    if (t->skip) {
        t->skip--;
        return NULL;
    }
    /* Signals wait the few microseconds of a claim, so that a handler that allocates is
     * recorded rather than lost. */
    struct quiet q;   /* (quiet.h) */
    quiet_begin(&q);
    sigset_t all, prev;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &prev);
    t->busy++;
    int ok = claim_chunk(t, n);
    t->busy--;
    pthread_sigmask(SIG_SETMASK, &prev, NULL);
    quiet_end(&q);
    if (!ok) {
        t->skip = 1u << (t->fails < 16 ? t->fails : 16);
        t->fails++;
        return NULL;
    }
    t->fails = 0;
    return slots(t, n);
}

/* ---------------------------------------------------------------- locations */

/* Finds the address range of this library, whose frames are never the program's. */
static int self_cb(struct dl_phdr_info *info, size_t size, void *arg) {
    uint64_t me = (uintptr_t)arg, lo, hi;
    module_range(info, &lo, &hi);
    if (me < lo || me >= hi) return 0;
    g_self_lo = lo;
    g_self_hi = hi;
    return 1;
}

/* Return addresses of the calling stack, innermost first, without this library's own frames:
 * the first one is the call site. */
static int walk_frames(struct tstate *t, uintptr_t *out, int max) {
    uintptr_t raw[MAX_STACK + 8];
    int got = 0, cap = max + 8 > MAX_STACK + 8 ? MAX_STACK + 8 : max + 8;
    if (g_unwind_dwarf && !g_exited) {  /* after exit, libgcc_s may be unloaded under us */
        t->busy++;  /* backtrace does not allocate once warmed up at init */
        got = backtrace((void **)raw, cap);
        t->busy--;
    } else {
        /* Frame pointers: [fp] = caller's fp, [fp+8] = return address. Each step is checked
         * against this thread's stack bounds, so a frame compiled without a frame pointer ends
         * the walk and never faults. */
        uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
        while (got < cap) {
            if (fp < t->stk_lo || fp + 16 > t->stk_hi || (fp & 7)) break;
            uintptr_t ret = ((uintptr_t *)fp)[1];
            uintptr_t next = ((uintptr_t *)fp)[0];
            if (ret < 4096) break;
            raw[got++] = ret;
            if (next <= fp) break;
            fp = next;
        }
    }
    int i = 0, n = 0;
    while (i < got && raw[i] >= g_self_lo && raw[i] < g_self_hi) i++;
    while (i < got && n < max) out[n++] = raw[i++];
    return n;
}

/* Writes an HC_LOC definition for frames[0..n), first used by event `seq`, and returns its new
 * id (0 if it was lost). */
static uint32_t define_loc(struct tstate *t, const uintptr_t *frames, int n, uint64_t seq) {
    /* A new call site may lie in a module loaded since the last snapshot: that module is
     * added now ("module snapshots"). */
    t->busy++;
    if (hc_have_find_object()) kept_note_frames(frames, n, seq);
    else snapshot_modules(SNAP_IF_MOVED, seq);
    t->busy--;
    uint32_t id = (uint32_t)__atomic_add_fetch(&H->locs, 1, __ATOMIC_RELAXED);
    uint32_t extra = n > 2 ? ((uint32_t)n - 2 + 2) / 3 : 0;
    struct hc_record *r = slots(t, 1 + extra);
    if (!r) return 0;
    uint64_t *x = (uint64_t *)(r + 1);
    for (uint32_t k = 0; k < extra; k++) {
        for (int j = 0; j < 3; j++) {
            int f = 2 + (int)k * 3 + j;
            x[4 * k + 1 + j] = f < n ? frames[f] : 0;
        }
        __atomic_store_n(&x[4 * k], HC_LOCX, __ATOMIC_RELEASE);
    }
    r->ts = (uint32_t)n;
    r->loc = 0;
    r->a = frames[0];
    r->b = n > 1 ? frames[1] : 0;
    __atomic_store_n(&r->head, ((uint64_t)id << 8) | HC_LOC, __ATOMIC_RELEASE);
    return id;
}

/* The value kept under key h (odd) in a location table, or NULL. A value is a location id, and
 * for a location with native frames, in its upper half the generation of modules in which
 * those frames were last known to lie in the modules they were defined in (entry_current). */
static inline uint64_t *table_entry(const struct tstate *t, uint64_t h) {
    uint64_t *tab = t->loc_table;
    uint32_t mask = t->loc_mask, i = (uint32_t)(h >> 40) & mask;
    for (uint32_t probe = 0; probe < 32; probe++, i = (i + 1) & mask) {
        if (LIKELY(tab[2 * i] == h)) return &tab[2 * i + 1];
        if (tab[2 * i] == 0) break;
    }
    return NULL;
}

/* Puts key h -> value in table tab (of mask + 1 slots); 0 if its 32 slots from h's are taken by
 * other keys. */
static int table_insert(uint64_t *tab, uint32_t mask, uint64_t h, uint64_t v) {
    uint32_t i = (uint32_t)(h >> 40) & mask;
    for (uint32_t probe = 0; probe < 32; probe++, i = (i + 1) & mask) {
        if (tab[2 * i] == h) { tab[2 * i + 1] = v; return 1; }
        if (tab[2 * i] == 0) {
            tab[2 * i + 1] = v;
            tab[2 * i] = h;
            tab[-1]++;
            return 1;
        }
    }
    return 0;
}

/* Replaces the thread's table by one four times larger holding the same entries; 0 if none
 * could be mapped. Never from a signal handler's event that interrupted another (emitting > 1):
 * that one may hold a pointer into the table. A nested event during the copy reads and writes
 * the old table, whose entries the copy may then miss: they are defined again. */
static int table_grow(struct tstate *t) {
    uint64_t *old = t->loc_table;
    uint32_t slots = table_slots(old);
    if (t->emitting > 1 || slots >= LOC_TABLE_MAX) return 0;
    uint64_t *tab = table_new(slots * 4);
    if (!tab) return 0;
    for (uint32_t i = 0; i < slots; i++)
        if (old[2 * i]) table_insert(tab, slots * 4 - 1, old[2 * i], old[2 * i + 1]);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);   /* a handler finds it whole */
    table_use(t, tab);
    table_free(old);
    return 1;
}

/* Keeps key h -> value in the thread's table. It grows past half full (a program with more call
 * sites than it holds would define them again and again: one definition per event, each a line
 * table scan for a Python frame), up to LOC_TABLE_MAX; crowded there, it starts over (the reader
 * merges the duplicate definitions that follow). */
static void table_put(struct tstate *t, uint64_t h, uint64_t v) {
    if (!t->loc_table) return;
    if (2 * (t->loc_table[-1] + 1) > (uint64_t)t->loc_mask + 1) table_grow(t);
    if (table_insert(t->loc_table, t->loc_mask, h, v)) return;
    if (table_grow(t) && table_insert(t->loc_table, t->loc_mask, h, v)) return;
    table_clear(t->loc_table);
    table_insert(t->loc_table, t->loc_mask, h, v);
}

/* Defines a Python frame (file, function, line of f's current instruction) as a "P" line of the
 * .mods file, one write(2), and returns its id (0 if it could not be written). Its users are
 * location definitions written after it, so a reader always finds it. */
static uint32_t define_pyframe(struct tstate *t, const char *f, int src_line) {
    if (g_mods.fd < 0) return 0;
    const char *code = PY_PTR(f, PL.fr_code);
    char file[512], func[256], line[16 + 2 * (sizeof file + sizeof func) + 16];
    size_t nf = py_utf8(PY_PTR(code, PL.co_filename), file, sizeof file);
    size_t nq = py_utf8(PY_PTR(code, PL.co_qualname), func, sizeof func);
    uint32_t id = (uint32_t)__atomic_add_fetch(&H->locs, 1, __ATOMIC_RELAXED);
    uint64_t fields[2] = {id, (uint64_t)src_line};
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    line[n++] = 'P';
    for (int k = 0; k < 2; k++) {
        char d[16]; int i = 16;
        uint64_t v = fields[k];
        do { d[--i] = hex[v & 15]; v >>= 4; } while (v);
        line[n++] = ' ';
        while (i < 16) line[n++] = d[i++];
    }
    const char *txt[2] = {file, func};
    size_t len[2] = {nf, nq};
    for (int k = 0; k < 2; k++) {
        line[n++] = ' ';
        for (size_t i = 0; i < len[k]; i++) {
            line[n++] = hex[(unsigned char)txt[k][i] >> 4];
            line[n++] = hex[txt[k][i] & 15];
        }
    }
    line[n++] = '\n';
    struct iovec iov = {line, n};
    t->busy++;   /* O_APPEND: one write lands whole, beside other threads' lines */
    int ok = fd_writev(0, &iov, 1);
    t->busy--;
    return ok ? id : 0;
}

/* The frame value of Python frame f: PY_FRAME_TAG | its definition's id, interned per thread
 * (0 if it could not be defined). Keyed by its instruction; an instruction met first finds the
 * id of its line when another instruction of that line has one: each (code object, line) is
 * defined once, not once per instruction (a third of pydoc -k's 344,000 definitions, each a
 * write(2), were lines defined again). */
static uint64_t py_frame_value(struct tstate *t, const char *f) {
    uint64_t h = (py_key(f) * 0x9E3779B97F4A7C15ull) | 1;   /* not the location's key */
    const uint64_t *known = table_entry(t, h);
    if (known) return PY_FRAME_TAG | (uint32_t)*known;
    int line = py_line(f);
    uint64_t hl = py_line_key(f, line);
    known = table_entry(t, hl);
    uint32_t id = known ? (uint32_t)*known : define_pyframe(t, f, line);
    if (!id) return 0;
    if (!known) table_put(t, hl, id);
    table_put(t, h, id);
    return PY_FRAME_TAG | id;
}

/* A hybrid stack: the native frames, each of the interpreter's frame-evaluation function
 * replaced by the Python frames it was running (innermost first, down to the one it entered
 * with), then the Python frames below the last native frame the walk reached (a walk that
 * stopped early, at code without frame pointers). */
static int py_hybrid(struct tstate *t, uintptr_t *frames, int n, const char *f, int max) {
    uintptr_t out[MAX_STACK];
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        if (frames[i] - 1 < py_eval_lo || frames[i] - 1 >= py_eval_hi || !f) {
            out[k++] = frames[i];
            continue;
        }
        while (f && k < max) {
            if (f[PL.fr_owner] == PY_OWNED_BY_CSTACK) {   /* 3.12+: below this call's frames */
                f = PY_PTR(f, PL.fr_previous);
                break;
            }
            int entry = PL.fr_is_entry >= 0 && f[PL.fr_is_entry];   /* 3.11: the first of them */
            if (py_complete(f)) {
                uint64_t v = py_frame_value(t, f);
                if (v) out[k++] = v;
            }
            f = PY_PTR(f, PL.fr_previous);
            if (entry) break;
        }
    }
    for (; f && k < max; f = PY_PTR(f, PL.fr_previous)) {
        if (!py_complete(f)) continue;
        uint64_t v = py_frame_value(t, f);
        if (v) out[k++] = v;
    }
    memcpy(frames, out, (size_t)k * sizeof *out);
    return k;
}

/* Modules and locations. A dlclose (the runtime's, modmap.c) starts a new generation of modules:
 * a library loaded later in the unloaded one's place may have code at the very addresses whose
 * locations were defined in the old one, and such a call site must become a location of its own,
 * defined after the snapshot that lists the new library. A location with native frames is
 * therefore believed, in a generation later than the one its table entry was last checked in,
 * only once its frames are found to lie in modules the kept snapshot has (kept_lacks): most are
 * (the program's own code, libraries still loaded), and the entry is then current again; the
 * others are defined anew. A Python stack's location holds no native frame. */
static inline uint32_t modules_gen(void) { return __atomic_load_n(&hc_modules_gen, __ATOMIC_RELAXED); }

static inline uint64_t entry_value(uint32_t id, uint32_t gen) { return (uint64_t)gen << 32 | id; }

/* Whether entry *v (of frames[0..n), native) holds in generation gen; brings it up to gen if so.
 * Where no module is ever added to the kept snapshot (no .mods file, or the modules at the start
 * overflowed it: kept_note_frames), a new definition would change nothing: it holds. */
static int entry_current(struct tstate *t, uint64_t *v, const uintptr_t *frames, int n,
                         uint32_t gen) {
    if (LIKELY((uint32_t)(*v >> 32) == gen)) return 1;
    int lacks = 0;
    if (g_mods.fd >= 0 && !g_kept_overflow) {
        t->busy++;   /* (_dl_find_object: lock-free, allocates nothing) */
        lacks = kept_lacks(frames, n);
        t->busy--;
    }
    if (lacks) return 0;
    *v = entry_value((uint32_t)*v, gen);
    return 1;
}

/* The interning key of a native call site. */
static inline uint64_t site_key(const void *callsite) {
    return ((uint64_t)(uintptr_t)callsite * 0x9E3779B97F4A7C15ull) | 1;
}

/* The location id of this event: its call site, or with --stacks its whole stack, interned in a
 * per-thread table (the reader merges ids that different threads gave to the same frames). On a
 * thread running Python code the location is its Python stack (pf and the frames below it, at
 * most PY_STACK_MAX), and with --stacks the Python frames among the native ones. */
static void pym_install(struct tstate *t);

static uint32_t intern_location(struct tstate *t, const void *callsite, const char *pf,
                                uint64_t seq) {
    /* pymalloc's wrappers wait here, off the per-event path: a new location comes at once when
     * the interpreter starts running the program's code */
    if (UNLIKELY(g_pym_state == 1)) pym_install(t);
    uintptr_t frames[MAX_STACK];
    int n = 1;
    uint64_t h;
    if (UNLIKELY(!t->loc_table)) return 0;
    uint32_t gen = modules_gen();   /* (before the frames are checked: a dlclose meanwhile
                                     * leaves the entry to be checked again) */
    frames[0] = (uintptr_t)callsite;
    if (UNLIKELY(g_stack_depth)) {
        n = walk_frames(t, frames, g_stack_depth);
        if (n == 0) { frames[0] = (uintptr_t)callsite; n = 1; }
        if (pf) {
            int k = py_hybrid(t, frames, n, pf, g_stack_depth);
            if (k) n = k;
        }
        h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
        for (int i = 0; i < n; i++) { h ^= frames[i]; h *= 0xff51afd7ed558ccdull; h ^= h >> 29; }
    } else if (pf) {
        h = py_stack_key(pf);
    } else {
        h = site_key(callsite);
    }
    h |= 1;  /* 0 marks an empty table slot */
    int python_only = pf && !g_stack_depth;
    uint64_t *known = table_entry(t, h);   /* (py_hybrid may have grown the table) */
    if (known && (python_only || entry_current(t, known, frames, n, gen))) return (uint32_t)*known;
    uint32_t id;
    if (python_only) {  /* a new Python call site: its frames */
        n = 0;
        for (const char *f = pf; f && n < PY_STACK_MAX; f = py_previous(f)) {
            uint64_t v = py_frame_value(t, f);
            if (!v) return intern_location(t, callsite, NULL, seq);
            frames[n++] = (uintptr_t)v;
        }
    }
    id = define_loc(t, frames, n, seq);
    if (id) table_put(t, h, entry_value(id, gen));
    return id;
}

/* `h`: the key that location() computed, 0 if none. */
static __attribute__((noinline)) uint32_t location_slow(struct tstate *t, const void *callsite,
                                                        const char *pf, uint64_t h,
                                                        uint64_t seq) {
    /* A location met before whose key is not at its first slot (6% of py_dicts' events) is
     * found without the bracket below, which costs two system-library calls and errno. */
    if (h && LIKELY(g_pym_state != 1)) {
        uint64_t *known = table_entry(t, h);
        uintptr_t site = (uintptr_t)callsite;
        if (known && (pf || entry_current(t, known, &site, 1, modules_gen())))
            return (uint32_t)*known;
    }
    struct quiet q;   /* (a stack walk, a .mods write: quiet.h) */
    quiet_begin(&q);
    uint32_t id = intern_location(t, callsite, pf, seq);
    quiet_end(&q);
    return id;
}

/* The common case inline: a call site (no stacks) found at its first probe; in Python code, the
 * Python stack, keyed by its frames' current instructions. */
static inline __attribute__((always_inline)) uint32_t location(struct tstate *t,
                                                               const void *callsite,
                                                               uint64_t seq) {
    const char *pf = NULL;
    if (LIKELY(!g_stack_depth && t->loc_table)) {
        uint64_t h = g_python ? py_site(t->self, &pf) : 0;
        if (!h) h = site_key(callsite);
        uint64_t *e = t->loc_table + 2 * ((uint32_t)(h >> 40) & t->loc_mask);
        if (LIKELY(e[0] == h) && (pf || LIKELY((uint32_t)(e[1] >> 32) == modules_gen())))
            return (uint32_t)e[1];
        return location_slow(t, callsite, pf, h, seq);
    } else if (g_python && t->loc_table) {
        pf = py_frame(t->self);
    }
    return location_slow(t, callsite, pf, 0, seq);
}

/* ---------------------------------------------------------------- recording */

static inline uint64_t next_seq(void) {
#if defined(__x86_64__)
    if (LIKELY(g_seq_mode == SEQ_SOLO)) {
        uint64_t n = 1;
        __asm__ volatile("incl %0" : "+m"(g_seq_inside) : : "memory");
        if (LIKELY(g_seq_mode == SEQ_SOLO)) {   /* again, now that the switch can see us */
            __asm__ volatile("xaddq %0, %1" : "+r"(n), "+m"(H->seq) : : "memory");
            __asm__ volatile("decl %0" : "+m"(g_seq_inside) : : "memory");
            return n;
        }
        __asm__ volatile("decl %0" : "+m"(g_seq_inside) : : "memory");
    }
#endif
    return __atomic_fetch_add(&H->seq, 1, __ATOMIC_RELAXED);
}

/* Claims n slots for an event read at clock `now`, and its time offset. The wrappers read the
 * clock before they take the seq: after the locked increment the clock read waits for it to
 * complete (21 ns for both in that order on the development VM, 11.5 ns the other way round).
 * A claim that opens a new chunk moves the time base to the chunk's start, later than `now`:
 * the offset then does not fit, and an HC_TIME slot moves the base back to `now`, as after a
 * long pause (once per chunk at most). */
static inline struct hc_record *event_slots(struct tstate *t, uint32_t n, uint32_t *ts,
                                            uint64_t now) {
    for (;;) {
        struct hc_record *r = slots(t, n);
        if (UNLIKELY(!r)) {
            __atomic_fetch_add(&H->lost, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        uint64_t d = now - t->tbase;
        if (LIKELY(d <= UINT32_MAX)) { *ts = (uint32_t)d; return r; }
        if (t->emitting > 1) {   /* nested (see slots): the base must not move; lost */
            for (uint32_t k = n; k-- > 0;)   /* the claimed slots become no-op markers */
                __atomic_store_n(&r[k].head, (uint64_t)HC_EXT, __ATOMIC_RELEASE);
            __atomic_fetch_add(&H->lost, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        /* Too long since the base (or a new chunk's base after `now`): these slots become
         * HC_TIME slots and we claim again. */
        t->tbase = now;
        for (uint32_t k = n; k-- > 0;) {
            r[k].ts = 0; r[k].loc = 0; r[k].a = now; r[k].b = 0;
            __atomic_store_n(&r[k].head, (uint64_t)HC_TIME, __ATOMIC_RELEASE);
        }
    }
}

/* Brackets the writing of an event (its location, slots, time and head). A plain increment is
 * enough against signal handlers: a handler that interrupts it leaves the count as it found it.
 * The signal fences keep the compiler from moving the bracket's ends past the writes. */
static inline void emit_begin(struct tstate *t) {
    t->emitting++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static inline void emit_end(struct tstate *t) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t->emitting--;
}

/* Fills an event's first slot, its head last (a slot with a non-zero head is complete). */
static inline __attribute__((always_inline)) void fill(struct hc_record *r, int op, uint64_t seq,
        uint32_t ts, uint32_t loc, const void *a, uint64_t b) {
    r->ts = ts;
    r->loc = loc;
    r->a = (uint64_t)(uintptr_t)a;
    r->b = b;
    __atomic_store_n(&r->head, (seq << 8) | (uint64_t)op, __ATOMIC_RELEASE);
}

static inline __attribute__((always_inline)) void emit(struct tstate *t, int op, uint64_t seq,
        uint64_t now, const void *a, uint64_t b, const void *callsite) {
    emit_begin(t);
    uint32_t loc = location(t, callsite, seq);
    uint32_t ts;
    struct hc_record *r = event_slots(t, 1, &ts, now);
    if (LIKELY(r != NULL)) fill(r, op, seq, ts, loc, a, b);
    if (UNLIKELY(hc_hook_on)) hc_hook_event(op, seq, (uint64_t)(uintptr_t)a, b, 0, callsite);
    emit_end(t);
}

static inline __attribute__((always_inline)) void emit_ext(struct tstate *t, int op, uint64_t seq,
        uint64_t now, const void *a, uint64_t b, const void *old, uint64_t arg, uint64_t lag,
        const void *callsite) {
    emit_begin(t);
    uint32_t loc = location(t, callsite, seq);
    uint32_t ts;
    struct hc_record *r = event_slots(t, 2, &ts, now);
    if (UNLIKELY(!r)) { emit_end(t); return; }
    struct hc_ext *x = (struct hc_ext *)(r + 1);
    x->old = (uint64_t)(uintptr_t)old;
    x->arg = arg;
    x->pad = 0;
    __atomic_store_n(&x->head, ((lag > 0xFFFFFFFFull ? 0xFFFFFFFFull : lag) << 8) | HC_EXT,
                     __ATOMIC_RELEASE);
    fill(r, op, seq, ts, loc, a, b);
    if (UNLIKELY(hc_hook_on))
        hc_hook_event(op, seq, (uint64_t)(uintptr_t)a, b, (uint64_t)(uintptr_t)old, callsite);
    emit_end(t);
}

static uint64_t mul_sat(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : (uint64_t)r;
}

#define CALLSITE __builtin_return_address(0)

EXPORT void *malloc(size_t n) {
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t)))
        return real_malloc && !t->boot ? real_malloc(n) : boot_alloc(n, 16);
    void *p = real_malloc(n);
    uint64_t now = event_ticks(t), seq = next_seq();
    emit(t, HC_MALLOC, seq, now, p, n, CALLSITE);
    return p;
}

EXPORT void free(void *p) {
    struct tstate *t = &T;
    if (UNLIKELY(in_boot_arena(p))) return;
    if (UNLIKELY(!thread_ready(t))) { if (real_free) real_free(p); return; }
    /* The sequence number is taken before the block is released, so any later allocation that
     * reuses the address, on any thread, gets a larger one. */
    uint64_t now = event_ticks(t), seq = next_seq();
    emit(t, HC_FREE, seq, now, p, 0, CALLSITE);
    real_free(p);
}

EXPORT void *calloc(size_t nmemb, size_t size) {
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t))) {
        if (real_calloc && !t->boot) return real_calloc(nmemb, size);
        uint64_t total = mul_sat(nmemb, size);
        void *p = total == UINT64_MAX ? NULL : boot_alloc(total, 16);
        if (p) memset(p, 0, total);
        return p;
    }
    void *p = real_calloc(nmemb, size);
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_CALLOC, seq, now, p, mul_sat(nmemb, size), NULL, nmemb, 0, CALLSITE);
    return p;
}

static void *boot_realloc(void *p, size_t n) {
    void *q = real_malloc && !T.boot ? real_malloc(n) : boot_alloc(n, 16);
    if (q && p) {
        size_t old = in_boot_arena(p) ? ((size_t *)p)[-1] : n;
        memcpy(q, p, old < n ? old : n);
        if (!in_boot_arena(p) && real_free) real_free(p);
    }
    return q;
}

/* realloc takes two sequence numbers: one before the call, where the old block is released if
 * the call moves it, and one after, where the new block appears. free_lag holds the difference. */
EXPORT void *realloc(void *p, size_t n) {
    struct tstate *t = &T;
    if (UNLIKELY(in_boot_arena(p) || !thread_ready(t))) {
        if (in_boot_arena(p) || !real_realloc || t->boot) return boot_realloc(p, n);
        return real_realloc(p, n);
    }
    uint64_t before = next_seq();
    void *q = real_realloc(p, n);
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_REALLOC, seq, now, q, n, p, 0, seq - before, CALLSITE);
    return q;
}

/* reallocarray is glibc's own: an overflow check, then realloc through the PLT, which would reach
 * our realloc hook and record the call twice. Doing the same here, with the real realloc, keeps
 * one event per call and the same behaviour. */
EXPORT void *reallocarray(void *p, size_t nmemb, size_t size) {
    struct tstate *t = &T;
    uint64_t total = mul_sat(nmemb, size);
    int overflow = total == UINT64_MAX && nmemb && size && SIZE_MAX / nmemb < size;
    if (UNLIKELY(in_boot_arena(p) || !thread_ready(t))) {
        if (overflow) { errno = ENOMEM; return NULL; }
        if (in_boot_arena(p) || !real_realloc) return boot_realloc(p, total);
        return real_realloc(p, total);
    }
    uint64_t before = next_seq();
    void *q;
    if (overflow) {
        q = NULL;
        errno = ENOMEM;
    } else {
        q = real_realloc(p, (size_t)total);
    }
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_REALLOCARRAY, seq, now, q, total, p, nmemb, seq - before, CALLSITE);
    return q;
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t))) {
        if (real_posix_memalign) return real_posix_memalign(out, align, n);
        void *p = boot_alloc(n, align);
        if (!p) return ENOMEM;
        *out = p;
        return 0;
    }
    int rc = real_posix_memalign(out, align, n);
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_POSIX_MEMALIGN, seq, now, rc == 0 ? *out : NULL, n, NULL, align, 0,
             CALLSITE);
    return rc;
}

#define ALIGNED_HOOK(name, OP, params, call, sz, al)                                     \
    EXPORT void *name params {                                                          \
        struct tstate *t = &T;                                                          \
        if (UNLIKELY(!thread_ready(t)))                                                 \
            return real_##name ? real_##name call : boot_alloc(sz, al);                 \
        void *p = real_##name call;                                                     \
        uint64_t now = event_ticks(t), seq = next_seq();                                   \
        emit_ext(t, OP, seq, now, p, sz, NULL, al, 0, CALLSITE);                        \
        return p;                                                                       \
    }

ALIGNED_HOOK(aligned_alloc, HC_ALIGNED_ALLOC, (size_t align, size_t n), (align, n), n, align)
ALIGNED_HOOK(memalign, HC_MEMALIGN, (size_t align, size_t n), (align, n), n, align)
ALIGNED_HOOK(valloc, HC_VALLOC, (size_t n), (n), n, 4096)
ALIGNED_HOOK(pvalloc, HC_PVALLOC, (size_t n), (n), n, 4096)

#include "pymalloc.h"

/* ---------------------------------------------------------------- mmap family (with --mmap) */

EXPORT void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    struct tstate *t = &T;
    void *p = real_mmap ? real_mmap(a, n, prot, flags, fd, off) : sys_mmap(a, n, prot, flags, fd, off);
    if (!g_mmap || !thread_ready(t)) return p;
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_MMAP, seq, now, p == MAP_FAILED ? NULL : p, n, a,
             ((uint64_t)(uint32_t)prot << 32) | (uint32_t)flags, 0, CALLSITE);
    return p;
}
EXPORT void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off)
    __attribute__((alias("mmap")));

EXPORT int munmap(void *a, size_t n) {
    struct tstate *t = &T;
    if (!g_mmap || !thread_ready(t))
        return real_munmap ? real_munmap(a, n) : (int)syscall(SYS_munmap, a, n);
    /* before: the range may be mapped again by another thread */
    uint64_t now = event_ticks(t), seq = next_seq();
    int rc = real_munmap(a, n);
    emit_ext(t, HC_MUNMAP, seq, now, a, n, NULL, (uint64_t)(rc != 0), 0, CALLSITE);
    return rc;
}

EXPORT void *mremap(void *old, size_t old_n, size_t n, int flags, ...) {
    struct tstate *t = &T;
    void *target = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        target = va_arg(ap, void *);
        va_end(ap);
    }
    if (!g_mmap || !thread_ready(t)) {
        if (real_mremap) return real_mremap(old, old_n, n, flags, target);
        return (void *)syscall(SYS_mremap, old, old_n, n, flags, target);
    }
    uint64_t before = next_seq();
    void *p = real_mremap(old, old_n, n, flags, target);
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_MREMAP, seq, now, p == MAP_FAILED ? NULL : p, n, old, old_n, seq - before,
             CALLSITE);
    return p;
}

/* ---------------------------------------------------------------- start and end */

__attribute__((constructor)) static void heapcast_start(void) {
    if (g_state == ST_UNINIT) init_process();
}

__attribute__((destructor)) static void heapcast_end(void) {
    if (g_state != ST_ACTIVE || !H) return;
    T.busy++;
    struct quiet q;   /* for the exit handlers that run after this one */
    quiet_begin(&q);
    char buf[4096];
    ssize_t n = read_file("/proc/self/status", buf, sizeof buf - 1);
    if (n > 0) {
        buf[n] = 0;
        char *s = strstr(buf, "VmHWM:");
        if (s) {
            uint64_t kb = 0;
            for (s += 6; *s == ' ' || *s == '\t'; s++) {}
            for (; *s >= '0' && *s <= '9'; s++) kb = kb * 10 + (uint64_t)(*s - '0');
            H->peak_rss_bytes = kb * 1024;
        }
    }
    if (!hc_have_find_object()) snapshot_modules(SNAP_IF_MOVED, H->seq);
    H->end_tsc = now_ticks();
    H->end_mono_ns = mono_ns();
    __atomic_fetch_or(&H->flags, HC_FLAG_CLEAN_EXIT, __ATOMIC_RELEASE);
    hc_hook_flush_all();
    g_exited = 1;
    quiet_end(&q);
    T.busy--;
}
