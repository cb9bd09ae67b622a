/* The class of an allocation under a compiled POLICY, and the online correction of its mistakes.
 *
 * Prediction: the call site (hc_site_of_address of the caller's return address) and the size go
 * to hc_predict_alloc. Both depend only on (return address, size class, op), so a per-thread
 * direct-mapped cache answers repeated calls without the module lookup and the table probe.
 * A site the policy does not know (no module, or only the table's fallback level answered) gets
 * the default class.
 *
 * Mispredictions (LLAMA's idea, at call-site rather than span granularity, because mimalloc owns
 * the spans): one placed block in SAMPLE_EVERY per thread is watched in a lock-free table. When
 * it is freed, or evicted from the table while still live, its age in heap events (the same
 * clock as the trace's lifetime labels) is compared with its class's bound. A site whose watched
 * blocks outlived their class RECLASSIFY_AFTER times is moved to the longest class observed;
 * every thread's cache is dropped then (an epoch counter), so later blocks of the site go to the
 * heap where they belong. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "../policy/heapcast_policy.h"
#include "alloc.h"

#define CACHE 256
#define SAMPLE_EVERY 64
#define SAMPLES 4096
#define SITES HA_WATCHED_SITES
#define SITE_PROBE 16
#define RECLASSIFY_AFTER 4

_Atomic uint64_t ha_clock;
__thread uint32_t ha_clock_pending __attribute__((tls_model("initial-exec")));

#ifdef HC_HAVE_POLICY_RUNTIME
static hc_policy *policy;
extern uint32_t hc_modules_gen;   /* native/policy/modmap.c: dlcloses so far */
#endif

#ifdef HC_HAVE_POLICY_RUNTIME
typedef struct {
    uintptr_t ra;
    uint32_t key;      /* size class and op */
    uint32_t site;
    int32_t cls;
} centry;

static __thread centry cache[CACHE] __attribute__((tls_model("initial-exec")));
static __thread uint32_t cache_epoch __attribute__((tls_model("initial-exec")));
static __thread uint32_t cache_gen __attribute__((tls_model("initial-exec")));
#endif
static __thread uint32_t countdown __attribute__((tls_model("initial-exec")));
static _Atomic uint32_t epoch = 1;
int ha_lifetime_groups = 1;

/* A watched block: addr 0 is a free slot, 1 a slot being written or read. */
typedef struct {
    _Atomic uintptr_t addr;
    uint64_t birth;
    uint32_t site;
    int32_t cls;
} sample;
static sample samples[SAMPLES];

typedef struct {
    _Atomic uint32_t site;       /* 0: empty */
    _Atomic uint32_t misses;
    _Atomic int32_t cls;         /* the longest class its blocks were seen to reach */
    _Atomic int32_t active;      /* reclassified: cls applies */
} site_entry;
static site_entry sites[SITES];

int ha_classify_init(const char *path, char *err, size_t errlen) {
#ifdef HC_HAVE_POLICY_RUNTIME
    hc_policy *p = hc_policy_open(path, err, errlen);
    if (!p)
        return -1;
    if (hc_policy_task(p) != HC_TASK_LIFETIME || hc_policy_labels(p) < HA_CLASSES) {
        snprintf(err, errlen, "%s: the policy predicts task %d with %d labels, but the allocator "
                 "needs lifetime classes (compile a model trained with `heapcast train --task "
                 "lifetime`)", path, hc_policy_task(p), hc_policy_labels(p));
        hc_policy_close(p);
        return -1;
    }
    if (hc_policy_kind(p) != HC_KIND_TABLE) {
        /* A network's prediction needs the stream of every heap event before it (a state the
         * recorder's --policy keeps); malloc sees one call: it would answer nothing, and every
         * block would land in the default group without a word. */
        snprintf(err, errlen, "%s: an rnn policy (the network itself) cannot place blocks: "
                 "its predictions need the whole event stream, which the allocator does not "
                 "keep; compile the model as a lookup table (`heapcast compile MODEL --kind "
                 "table`)", path);
        hc_policy_close(p);
        return -1;
    }
    if (policy) {
        hc_policy_close(p);     /* a check from `heapcast run`: keep the first */
    } else if (!(ha_lifetime_groups = hc_policy_lifetime_groups(p))) {
        /* one group: nothing to predict; its mapped pages (read whole by the load's checksum)
         * would be the only resident memory that sets it apart from --policy none */
        hc_policy_close(p);
    } else {
        policy = p;
    }
    return 0;
#else
    snprintf(err, errlen, "%s: this build of heapcast's allocator has no policy runtime "
             "(native/policy); use --policy none or oracle:TRACE", path);
    return -1;
#endif
}

static inline uint32_t size_key(size_t size, int op) {
    /* four classes per power of two, like the rich vocabulary */
    uint32_t bits = size ? 64 - (uint32_t)__builtin_clzll(size) : 0;
    uint32_t sub = bits >= 3 ? (uint32_t)(size >> (bits - 3)) & 3 : (uint32_t)size;
    return (bits * 4 + sub) << 4 | (uint32_t)op;
}

int ha_reclassified(uint32_t site) {
    uint32_t h = (site * 2654435761u) & (SITES - 1);
    for (int i = 0; i < SITE_PROBE; i++) {
        site_entry *e = &sites[(h + i) & (SITES - 1)];
        uint32_t s = atomic_load_explicit(&e->site, memory_order_acquire);
        if (s == site)
            return atomic_load_explicit(&e->active, memory_order_relaxed)
                       ? atomic_load_explicit(&e->cls, memory_order_relaxed) : -1;
        if (s == 0)
            return -1;
    }
    return -1;
}

int ha_classify(uintptr_t ra, size_t size, int op, uint32_t *site_out) {
#ifdef HC_HAVE_POLICY_RUNTIME
    /* dropped when a site is reclassified (epoch) and after a dlclose (hc_modules_gen): a
     * library loaded in an unloaded one's place has code at its return addresses, and the
     * cache would place their blocks by the old one's sites */
    uint32_t e = atomic_load_explicit(&epoch, memory_order_relaxed);
    uint32_t g = __atomic_load_n(&hc_modules_gen, __ATOMIC_ACQUIRE);
    if (HA_UNLIKELY(e != cache_epoch || g != cache_gen)) {
        memset(cache, 0, sizeof cache);
        cache_epoch = e;
        cache_gen = g;
    }
    uint32_t key = size_key(size, op);
    centry *c = &cache[((ra ^ ((uint64_t)key << 40)) * 0x9E3779B97F4A7C15ULL) >> 56];   /* CACHE = 256 */
    if (HA_LIKELY(c->ra == ra && c->key == key)) {
        *site_out = c->site;
        return c->cls;
    }
    uint32_t site = hc_site_of_address(ra);
    int cls = HA_DEFAULT;
    if (site) {
        hc_event ev = {.site = site, .op = (uint16_t)op, .token = 0xFFFF, .size = size};
        hc_prediction pr;
        hc_predict_alloc(policy, NULL, &ev, &pr);
        if (pr.label[0] >= 0 && pr.label[0] < HA_CLASSES && pr.level != 0)
            cls = pr.label[0];
        int r = ha_reclassified(site);
        if (r > cls || (r >= 0 && cls == HA_DEFAULT))
            cls = r;
    }
    c->ra = ra;
    c->key = key;
    c->site = site;
    c->cls = cls;
    *site_out = site;
    return cls;
#else
    *site_out = 0;
    return HA_DEFAULT;
#endif
}

static uint64_t bound_of(int cls) {
    return cls < HC_LIFE_LONG ? (uint64_t)1 << (4 * (cls + 1)) : UINT64_MAX;
}

/* A watched block of `site`, placed as `cls`, reached `age` events (still live, or freed now). */
static void observe(uint32_t site, int cls, uint64_t age) {
    if (age < bound_of(cls) || !site)
        return;
    int seen = ha_class_of_lifetime(age);
    ha_stats_mispredicted(cls);
    uint32_t h = (site * 2654435761u) & (SITES - 1);
    for (int i = 0; i < SITE_PROBE; i++) {
        site_entry *e = &sites[(h + i) & (SITES - 1)];
        uint32_t s = atomic_load_explicit(&e->site, memory_order_acquire);
        if (s == 0) {
            uint32_t zero = 0;
            if (!atomic_compare_exchange_strong(&e->site, &zero, site) && zero != site)
                continue;
            s = site;
        }
        if (s != site)
            continue;
        int32_t old = atomic_load(&e->cls);
        while (old < seen && !atomic_compare_exchange_weak(&e->cls, &old, seen))
            ;
        uint32_t n = atomic_fetch_add(&e->misses, 1) + 1;
        if (n >= RECLASSIFY_AFTER && (n == RECLASSIFY_AFTER || old < seen)) {
            if (!atomic_exchange(&e->active, 1) || old < seen)
                ha_stats_reclassified(cls);
            atomic_fetch_add(&epoch, 1);
        }
        return;
    }
    /* no room in the table for this site (its SITE_PROBE slots hold others): it cannot be
     * reclassified; counted, so that the summary says so */
    ha_stats_untracked(cls);
}

static inline sample *slot_of(const void *p) {
    uintptr_t a = (uintptr_t)p >> 4;
    return &samples[(a ^ (a >> 12) ^ (a >> 24)) & (SAMPLES - 1)];
}

void ha_sample_alloc(void *p, uint32_t site, int cls) {
    if (HA_LIKELY(countdown-- != 0))
        return;
    countdown = SAMPLE_EVERY - 1;
    if (!site || cls >= HC_LIFE_LONG)
        return;
    sample *s = slot_of(p);
    uintptr_t old = atomic_load_explicit(&s->addr, memory_order_acquire);
    if (old == 1 || !atomic_compare_exchange_strong(&s->addr, &old, 1))
        return;
    uint64_t now = ha_now();
    if (old > 1)                         /* evicting a block still live: did it outlive? */
        observe(s->site, s->cls, now > s->birth ? now - s->birth : 0);
    s->birth = now;
    s->site = site;
    s->cls = cls;
    atomic_store_explicit(&s->addr, (uintptr_t)p, memory_order_release);
}

void ha_sample_free(void *p) {
    sample *s = slot_of(p);
    uintptr_t want = (uintptr_t)p;
    if (HA_LIKELY(atomic_load_explicit(&s->addr, memory_order_relaxed) != want))
        return;
    if (!atomic_compare_exchange_strong(&s->addr, &want, 1))
        return;
    uint64_t now = ha_now();
    observe(s->site, s->cls, now > s->birth ? now - s->birth : 0);
    atomic_store_explicit(&s->addr, 0, memory_order_release);
}
