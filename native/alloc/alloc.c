/* heapcast's allocator: every glibc allocation entry point, with glibc's semantics, served by
 * heapcast's packer (pack.c, the default backend); each allocation goes to the group of its
 * predicted lifetime class, whose spans it never shares with another group. What the packer does
 * not serve (alignments above a page; allocations before the configuration is read; everything,
 * if its region cannot be reserved) goes to the allocator beside it: glibc's own malloc in
 * libheapcast_alloc.so (fallback_glibc.c: in every process anyway, so nothing more is loaded),
 * mimalloc in libheapcast_alloc_mimalloc.so (fallback_mimalloc.c), which can also be the backend
 * of every block (HEAPCAST_ALLOC_BACKEND=mimalloc: one mimalloc heap per group and thread). */
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../policy/heapcast_policy.h"
#include "alloc.h"
#include "pack.h"
#include "pack_params.h"

#define EXPORT __attribute__((visibility("default")))

int ha_mode = HA_MODE_NONE;
/* HEAPCAST_ALLOC_BACKEND=pack (the default): blocks up to PACK_MAX from heapcast's packer
 * (pack.c), one group per heap index; =mimalloc (libheapcast_alloc_mimalloc.so): everything from
 * mimalloc's heaps. */
int ha_backend_pack;
uint8_t ha_heap_of[HA_SLOTS] = PACK_HEAP_MAP;   /* short, medium, long+never+default */

/* 0: not yet, 1: being initialized (allocations meanwhile take the default heap), 2: ready */
static _Atomic int init_state;
/* Nothing to classify, time or sample, and the packer serves (--policy none, or a policy placed
 * in one group): malloc and free take their short paths (malloc, free). */
static int plain;
static const char *log_path;
/* The recorder's text, when `heapcast record` runs under this allocator: its hooks call us, so
 * the program's call site is one frame further up. */
static uintptr_t recorder_lo, recorder_hi;

static __thread ha_thread_stats *thread_stats __attribute__((tls_model("initial-exec")));

void ha_message(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

int ha_class_of_lifetime(uint64_t events) {
    if (events == 0)
        events = 1;
    int bits = 64 - __builtin_clzll(events);          /* bit length */
    int cls = (bits - 1) / 4;                          /* powers of 16 events */
    return cls < HC_LIFE_LONG ? cls : HC_LIFE_LONG;
}

/* The heap map: HEAPCAST_ALLOC_HEAPS is one digit per class (0-5) and optionally one for the
 * default, each a heap index below HA_HEAPS (e.g. "001122" or "0123330"). */
static void parse_heap_map(const char *s) {
    size_t n = strlen(s);
    if (n < HA_CLASSES || n > HA_SLOTS) {
        ha_message("heapcast alloc: HEAPCAST_ALLOC_HEAPS=%s: expected 6 or 7 digits 0-%d; "
                   "using the default map\n", s, HA_HEAPS - 1);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] >= '0' + HA_HEAPS) {
            ha_message("heapcast alloc: HEAPCAST_ALLOC_HEAPS=%s: character %zu is not a digit "
                       "0-%d; using the default map\n", s, i, HA_HEAPS - 1);
            return;
        }
    for (size_t i = 0; i < n; i++)
        ha_heap_of[i] = (uint8_t)(s[i] - '0');
}

static int find_recorder_image(struct dl_phdr_info *info, size_t size, void *arg) {
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libheapcast_recorder"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            recorder_lo = info->dlpi_addr + ph->p_vaddr;
            recorder_hi = recorder_lo + ph->p_memsz;
        }
    }
    return 1;
}

/* HEAPCAST_ALLOC_BACKEND: "pack" (the default), or "mimalloc" where this library has it; 0, or
 * -1 with err set (saying what serves the blocks instead). */
static int choose_backend(char *err, size_t errlen) {
    const char *b = getenv("HEAPCAST_ALLOC_BACKEND");
    int bad = 0;
    if (b && *b && strcmp(b, "pack") != 0) {
        if (ha_fallback_backend && strcmp(b, ha_fallback_backend) == 0)
            return 0;
        if (strcmp(b, "mimalloc") == 0)
            snprintf(err, errlen, "heapcast alloc: HEAPCAST_ALLOC_BACKEND=mimalloc: this library "
                     "is built without mimalloc (preload libheapcast_alloc_mimalloc.so: heapcast "
                     "run --backend mimalloc); using the packer");
        else
            snprintf(err, errlen, "heapcast alloc: HEAPCAST_ALLOC_BACKEND=%s: expected pack or "
                     "mimalloc; using the packer", b);
        bad = 1;
    }
    if (pack_init() != 0) {
        snprintf(err, errlen, "heapcast alloc: the packer could not reserve its address space; "
                 "using %s", ha_fallback_name);
        return -1;
    }
    ha_backend_pack = 1;
    return bad ? -1 : 0;
}

static void init_once(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&init_state, &expected, 1))
        return;
    char err[512];
    if (choose_backend(err, sizeof err) != 0) {
        const char *check = getenv("HEAPCAST_ALLOC_CHECK");
        ha_message("%s\n", err);
        if (check && *check)
            _exit(97);
    }
    const char *map = getenv("HEAPCAST_ALLOC_HEAPS");
    if (map && *map)
        parse_heap_map(map);
    const char *policy = getenv("HEAPCAST_ALLOC_POLICY");
    const char *oracle = getenv("HEAPCAST_ALLOC_ORACLE");
    /* HEAPCAST_ALLOC_CHECK: `heapcast run` checks the files this way before the program
     * starts, so that a bad POLICY is a clear error rather than a silent run without it. */
    const char *check = getenv("HEAPCAST_ALLOC_CHECK");
    int failed = 0;
    if (oracle && *oracle) {
        if (ha_oracle_init(oracle, err, sizeof err) == 0)
            ha_mode = HA_MODE_ORACLE;
        else
            failed = 1;
    } else if (policy && *policy && strcmp(policy, "none") != 0) {
        if (ha_classify_init(policy, err, sizeof err) == 0)
            /* a policy whose placement is one group has nothing to classify, time or sample:
             * it runs as --policy none (its log still says the policy's placement) */
            ha_mode = ha_lifetime_groups ? HA_MODE_POLICY : HA_MODE_NONE;
        else
            failed = 1;
    }
    if (failed && check && *check) {
        ha_message("%s\n", err);
        _exit(97);
    }
    if (failed)
        ha_message("heapcast alloc: %s; running without predictions\n", err);
    log_path = getenv("HEAPCAST_ALLOC_LOG");
    if (log_path && !*log_path)
        log_path = NULL;
    plain = ha_mode == HA_MODE_NONE && ha_backend_pack;
    atomic_store(&init_state, 2);
}

static inline int ready(void) {
    if (HA_LIKELY(atomic_load_explicit(&init_state, memory_order_relaxed) == 2))
        return 1;
    init_once();
    return atomic_load_explicit(&init_state, memory_order_acquire) == 2;
}

static inline ha_thread_stats *stats(void) {
    if (HA_UNLIKELY(!thread_stats))
        thread_stats = ha_stats_claim();
    return thread_stats;
}

/* The class of an allocation happening now (the caller's return address `ra`). */
static inline int place(uintptr_t ra, size_t size, int op, uint32_t *site) {
    *site = 0;
    if (HA_UNLIKELY(!ready()) || ha_mode == HA_MODE_NONE)
        return HA_DEFAULT;
    if (ha_mode == HA_MODE_ORACLE) {
        int cls = ha_oracle_next();     /* counts every allocation, placed or not */
        return size <= HA_PLACE_MAX ? cls : HA_DEFAULT;
    }
    if (size > HA_PLACE_MAX)
        return HA_DEFAULT;
    return ha_classify(ra, size, op, site);
}

static inline void account(int cls, size_t size) {
    ha_thread_stats *s = stats();
    if (HA_LIKELY(s)) {
        s->allocs[cls]++;
        s->bytes[cls] += size;
    }
}

/* glibc's smallest block: every block is 16-byte aligned, and realloc's new size at least this */
#define MIN_SIZE 16

/* What every allocation does with its result: errno as glibc sets it, the --log counts, and in
 * policy mode a sample of the placed blocks watched for mispredictions. */
static inline void *placed(void *p, int cls, size_t size, uint32_t site) {
    if (HA_UNLIKELY(!p)) {
        errno = ENOMEM;
        return NULL;
    }
    account(cls, size);
    if (ha_mode == HA_MODE_POLICY && cls != HA_DEFAULT)
        ha_sample_alloc(p, site, cls);
    return p;
}

/* The packer's block of `size` bytes: up to PACK_MAX from its spans, above from a mapping of its
 * own; NULL where it does not serve the request. */
static inline void *pack_block(int cls, size_t size, size_t align, int zero) {
    if (size > PACK_MAX)
        return align <= 4096 ? pack_big_alloc(size, zero) : NULL;
    void *p = pack_alloc(ha_heap_of[cls], size, align);
    if (p && zero)
        memset(p, 0, size);
    return p;
}

/* A block of `size` bytes for class `cls`: from the packer when it serves it, else from the
 * allocator beside it. */
static inline void *block_in(int cls, size_t size, size_t align, int zero) {
    void *p;
    if (ha_backend_pack && (p = pack_block(cls, size, align, zero)))
        return p;
    return ha_fallback_alloc(ha_heap_of[cls], size < MIN_SIZE ? MIN_SIZE : size, align, zero);
}

static inline void *alloc_in(int cls, size_t size, size_t align, int zero, uint32_t site) {
    void *p = block_in(cls, size, align, zero);
    return placed(p, cls, size < MIN_SIZE ? MIN_SIZE : size, site);
}

/* Three kinds of live blocks: in the packer's region, a mapping of the packer's own (over
 * PACK_MAX), the fallback's (all of them when it is the backend; with the packer: allocations
 * made before the configuration was read, and alignments above a page). */
static inline size_t usable(void *p) {
    if (pack_owns(p))
        return pack_usable_size(p);
    size_t len = ha_backend_pack ? pack_big_len(p) : 0;
    return len ? len : ha_fallback_usable(p);
}

static inline void block_free(void *p) {
    if (pack_owns(p))
        pack_free(p);
    else if (!ha_backend_pack || !pack_big_free(p))
        ha_fallback_free(p);
}

/* realloc by moving: a new block, the contents copied, the old block freed. */
static void *block_move(int cls, void *p, size_t want) {
    void *q = block_in(cls, want, 0, 0);
    if (!q)
        return NULL;
    size_t have = usable(p);
    memcpy(q, p, have < want ? have : want);
    block_free(p);
    return q;
}

/* realloc of a live block to `want` (>= MIN_SIZE) bytes. A packed block stays where it is while
 * `want` has its size class, a mapping is remapped while `want` is over PACK_MAX; other blocks
 * move. With the fallback as the backend (the packer off), its realloc. */
static void *block_realloc(int cls, void *p, size_t want) {
    if (pack_owns(p)) {
        if (want <= PACK_MAX && pack_usable_size(p) == pack_class_bytes(want))
            return p;
        return block_move(cls, p, want);
    }
    if (ha_backend_pack) {
        if (want > PACK_MAX && pack_big_len(p))
            return pack_big_realloc(p, want);
        return block_move(cls, p, want);
    }
    return ha_fallback_realloc(ha_heap_of[cls], p, want);
}

/* The call site of an allocation: the return address of the exported function's caller, or
 * under `heapcast record` (whose hooks call this allocator) that of the hook's caller. Expanded
 * in the exported function itself, from whose frame __builtin_return_address counts: a helper
 * out of line (malloc_at, realloc_at, aligned_at) would see the exported function instead. */
#define CALLER() ({                                                                          \
    uintptr_t ra_ = (uintptr_t)__builtin_extract_return_addr(__builtin_return_address(0));   \
    if (HA_UNLIKELY(ra_ >= recorder_lo && ra_ < recorder_hi))                                \
        ra_ = (uintptr_t)__builtin_extract_return_addr(__builtin_return_address(1));         \
    ra_; })

/* glibc refuses sizes above PTRDIFF_MAX with ENOMEM (mimalloc would report EOVERFLOW). */
static inline int too_large(size_t size) {
    if (HA_UNLIKELY(size > (size_t)PTRDIFF_MAX)) {
        errno = ENOMEM;
        return 1;
    }
    return 0;
}

static inline void tick(void) {
    if (ha_mode == HA_MODE_POLICY)
        ha_tick();
}

static __attribute__((noinline)) void *malloc_at(uintptr_t ra, size_t size) {
    if (too_large(size))
        return NULL;
    uint32_t site;
    int cls = place(ra, size, HC_OP_MALLOC, &site);
    tick();
    return alloc_in(cls, size, 0, 0, site);
}

/* The common case first, in a path that saves no registers: with nothing to classify, a
 * block the packer serves (pack_alloc has its own short path for a thread's bin). Everything
 * else, and this case when the packer cannot serve it, as malloc_at does it. */
EXPORT void *malloc(size_t size) {
    if (HA_LIKELY(plain && atomic_load_explicit(&init_state, memory_order_relaxed) == 2)) {
        void *p = pack_alloc(ha_heap_of[HA_DEFAULT], size, 0);
        if (HA_LIKELY(p)) {
            account(HA_DEFAULT, size < MIN_SIZE ? MIN_SIZE : size);
            return p;
        }
    }
    return malloc_at(CALLER(), size);
}

static __attribute__((noinline)) void free_at(void *p) {
    if (!p)
        return;
    if (ha_mode == HA_MODE_POLICY) {
        tick();
        ha_sample_free(p);
    }
    block_free(p);
}

EXPORT void free(void *p) {
    if (HA_LIKELY(plain && pack_owns(p))) {   /* (plain: set once the packer is ready) */
        pack_free(p);
        return;
    }
    free_at(p);
}

EXPORT void *calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total) || too_large(total)) {
        errno = ENOMEM;
        return NULL;
    }
    uint32_t site;
    int cls = place(CALLER(), total, HC_OP_CALLOC, &site);
    tick();
    return alloc_in(cls, total, 0, 1, site);
}

static void *realloc_at(uintptr_t ra, void *p, size_t size) {
    if (!p) {
        if (too_large(size))
            return NULL;
        uint32_t site;
        int cls = place(ra, size, HC_OP_REALLOC, &site);
        tick();
        return alloc_in(cls, size, 0, 0, site);
    }
    if (size == 0) {                  /* glibc: frees the block, returns NULL */
        free(p);
        return NULL;
    }
    if (too_large(size))
        return NULL;
    uint32_t site;
    int cls = place(ra, size, HC_OP_REALLOC, &site);
    tick();
    if (ha_mode == HA_MODE_POLICY)
        ha_sample_free(p);
    size_t want = size < MIN_SIZE ? MIN_SIZE : size;
    return placed(block_realloc(cls, p, want), cls, size, site);
}

EXPORT void *realloc(void *p, size_t size) {
    return realloc_at(CALLER(), p, size);
}

EXPORT void *reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc_at(CALLER(), p, total);
}

static inline int pow2(size_t x) { return x && !(x & (x - 1)); }

/* memalign, aligned_alloc, valloc, pvalloc: glibc rounds an alignment that is not a power of two
 * up to the next one, and fails with EINVAL only above SIZE_MAX/2 + 1. */
static void *aligned_at(uintptr_t ra, size_t align, size_t size) {
    if (align > (SIZE_MAX >> 1) + 1) {
        errno = EINVAL;
        return NULL;
    }
    if (align < sizeof(void *) * 2)
        align = sizeof(void *) * 2;
    if (!pow2(align))
        align = (size_t)1 << (64 - __builtin_clzll(align));
    if (too_large(size) || size > (size_t)PTRDIFF_MAX - align)
        return NULL;
    uint32_t site;
    int cls = place(ra, size, HC_OP_ALIGNED, &site);
    tick();
    return alloc_in(cls, size, align, 0, site);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size) {
    if (align % sizeof(void *) || !pow2(align))
        return EINVAL;
    int saved = errno;                /* posix_memalign reports through its result, not errno */
    void *p = aligned_at(CALLER(), align, size);
    if (!p) {
        int e = errno;
        errno = saved;
        return e;
    }
    errno = saved;
    *out = p;
    return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t size) {
    return aligned_at(CALLER(), align, size);
}

EXPORT void *memalign(size_t align, size_t size) {
    return aligned_at(CALLER(), align, size);
}

EXPORT void *valloc(size_t size) {
    return aligned_at(CALLER(), (size_t)sysconf(_SC_PAGESIZE), size);
}

EXPORT void *pvalloc(size_t size) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded;
    if (__builtin_add_overflow(size, page - 1, &rounded)) {
        errno = ENOMEM;
        return NULL;
    }
    rounded &= ~(page - 1);
    return aligned_at(CALLER(), page, rounded ? rounded : page);
}

EXPORT size_t malloc_usable_size(void *p) {
    return p ? usable(p) : 0;
}

static void after_fork_child(void) {
    ha_stats_reset_after_fork();
    ha_oracle_after_fork();
}

__attribute__((constructor)) static void alloc_load(void) {
    ha_fallback_load();
    ready();
    dl_iterate_phdr(find_recorder_image, NULL);
    pthread_atfork(NULL, NULL, after_fork_child);
}

__attribute__((destructor)) static void alloc_unload(void) {
    if (log_path)
        ha_stats_write(log_path);
    if (ha_backend_pack && getenv("HEAPCAST_PACK_DEBUG"))
        pack_dump();
}
