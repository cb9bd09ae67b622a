/* heapcast's allocator (libheapcast_alloc.so, preloaded by `heapcast run`): the parts shared by
 * its modules. Blocks come from heapcast's packer (pack.c), one set of spans per lifetime group;
 * what it does not serve goes to the allocator beside it (fallback_glibc.c, or in
 * libheapcast_alloc_mimalloc.so fallback_mimalloc.c, which can also serve every block). */
#ifndef HEAPCAST_ALLOC_H
#define HEAPCAST_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define HA_CLASSES 6             /* the lifetime classes of heapcast_policy.h (0..5) */
#define HA_DEFAULT 6             /* "no class": unknown call sites, --policy none, large blocks */
#define HA_SLOTS 7               /* classes + the default */
#define HA_HEAPS 4               /* lifetime groups; on mimalloc heap 0 is its default heap */
/* Blocks above this go to the default heap: mimalloc gives them pages (or segments) of their
 * own anyway, so their lifetime cannot make them share a page with others; the packer keeps the
 * same bound (its spans of such blocks hold eight of them or more, 1-2 MiB a span). */
#define HA_PLACE_MAX (128 * 1024)

enum { HA_MODE_NONE = 0, HA_MODE_POLICY = 1, HA_MODE_ORACLE = 2 };

#define HA_LIKELY(x) __builtin_expect(!!(x), 1)
#define HA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HA_HIDDEN __attribute__((visibility("hidden")))

/* Configuration, read once at load (HEAPCAST_ALLOC_* environment variables). */
extern int ha_mode;
extern int ha_backend_pack;             /* blocks from the packer (pack.c), not mimalloc's heaps */
extern int ha_lifetime_groups;          /* the policy's placement: 0 one group (classify.c) */
extern uint8_t ha_heap_of[HA_SLOTS];   /* class (or HA_DEFAULT) -> heap index */

/* ---- classify.c: the class of an allocation happening now ---- */
int ha_classify_init(const char *policy_path, char *err, size_t errlen);
/* Class of an allocation of `size` bytes made from return address `ra` (op: HC_OP_*); site_out
 * receives the call-site key (0 if unknown) for misprediction tracking. */
int ha_classify(uintptr_t ra, size_t size, int op, uint32_t *site_out);
/* Misprediction tracking (policy mode): every event advances the lifetime clock; a sample of
 * placed blocks is watched until it is freed or outlives its class. The clock counts the heap
 * events of the process: each thread counts its own and adds them to the shared count every
 * CLOCK_BATCH events, so the hot path does no atomic operation; a thread reads the shared count
 * plus its own pending events, which may miss other threads' pending ones (an age is never
 * overestimated: a block is never judged to outlive its class wrongly). */
#define HA_CLOCK_BATCH 256
extern _Atomic uint64_t ha_clock;
extern __thread uint32_t ha_clock_pending;
static inline void ha_tick(void) {
    if (HA_UNLIKELY(++ha_clock_pending == HA_CLOCK_BATCH)) {
        atomic_fetch_add_explicit(&ha_clock, HA_CLOCK_BATCH, memory_order_relaxed);
        ha_clock_pending = 0;
    }
}
static inline uint64_t ha_now(void) {
    return atomic_load_explicit(&ha_clock, memory_order_relaxed) + ha_clock_pending;
}
void ha_sample_alloc(void *p, uint32_t site, int cls);
void ha_sample_free(void *p);
/* The class a site's blocks are given after mispredictions, or -1. */
int ha_reclassified(uint32_t site);

/* ---- oracle.c: classes from a recording of the same run ---- */
int ha_oracle_init(const char *path, char *err, size_t errlen);
int ha_oracle_next(void);            /* the class of the next allocation of this process */
void ha_oracle_after_fork(void);

/* ---- stats.c: the per-class summary written with --log ---- */
typedef struct {
    uint64_t allocs[HA_SLOTS], bytes[HA_SLOTS];
} ha_thread_stats;
ha_thread_stats *ha_stats_claim(void);
void ha_stats_mispredicted(int cls);
void ha_stats_reclassified(int cls);
void ha_stats_untracked(int cls);
/* Sites whose mispredictions are watched (classify.c's table; stats.c logs it). */
#define HA_WATCHED_SITES 2048
void ha_stats_reset_after_fork(void);
void ha_stats_write(const char *path_prefix);

/* ---- fallback_glibc.c or fallback_mimalloc.c: the allocator beside the packer ---- */
extern const char ha_fallback_name[];      /* what it is, for messages */
extern const char *const ha_fallback_backend;   /* its HEAPCAST_ALLOC_BACKEND name if it can
                                                   serve every block, else NULL */
void ha_fallback_load(void);               /* from the library's constructor */
/* A block of `size` (>= 16) bytes aligned to `align` (0: 16), zeroed if `zero`, for heap index
 * `heap` (a lifetime group; mimalloc's heaps only), or NULL. */
void *ha_fallback_alloc(int heap, size_t size, size_t align, int zero);
size_t ha_fallback_usable(void *p);
void ha_fallback_free(void *p);
void *ha_fallback_realloc(int heap, void *p, size_t size);

/* ---- util ---- */
void ha_message(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int ha_class_of_lifetime(uint64_t events);

#endif
