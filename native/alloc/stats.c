/* The per-class summary of `heapcast run --log`: allocations and bytes per class (per-thread
 * counters, so the hot path stores without atomics), blocks found outliving their class and
 * sites reclassified; with the packer, the pages each heap (lifetime group) gave back. Written at exit as PREFIX.PID.json (0600); `heapcast run` merges them. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "pack.h"

#define SLOTS 512

static ha_thread_stats slots[SLOTS];
static _Atomic int used;
static _Atomic uint64_t mispredicted[HA_SLOTS], reclassified[HA_SLOTS], untracked[HA_SLOTS];

ha_thread_stats *ha_stats_claim(void) {
    int i = atomic_fetch_add(&used, 1);
    /* Past SLOTS threads, the last slot is shared: its counts may lose a few racing updates. */
    return &slots[i < SLOTS ? i : SLOTS - 1];
}

void ha_stats_mispredicted(int cls) { atomic_fetch_add_explicit(&mispredicted[cls], 1, memory_order_relaxed); }
void ha_stats_reclassified(int cls) { atomic_fetch_add_explicit(&reclassified[cls], 1, memory_order_relaxed); }
void ha_stats_untracked(int cls) { atomic_fetch_add_explicit(&untracked[cls], 1, memory_order_relaxed); }

void ha_stats_reset_after_fork(void) {
    /* the child counts its own allocations; the forking thread keeps its slot */
    memset(slots, 0, sizeof slots);
    for (int c = 0; c < HA_SLOTS; c++) {
        atomic_store(&mispredicted[c], 0);
        atomic_store(&reclassified[c], 0);
        atomic_store(&untracked[c], 0);
    }
}

static long vm_hwm_kb(void) {
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *p = strstr(buf, "VmHWM:");
    long kb = -1;
    if (p)
        sscanf(p + 6, "%ld", &kb);
    return kb;
}

void ha_stats_write(const char *prefix) {
    static const char *modes[] = {"none", "policy", "oracle"};
    uint64_t allocs[HA_SLOTS] = {0}, bytes[HA_SLOTS] = {0};
    int n = atomic_load(&used);
    for (int i = 0; i < (n < SLOTS ? n : SLOTS); i++)
        for (int c = 0; c < HA_SLOTS; c++) {
            allocs[c] += slots[i].allocs[c];
            bytes[c] += slots[i].bytes[c];
        }
    char path[4096], out[4096];
    if (snprintf(path, sizeof path, "%s.%d.json", prefix, (int)getpid()) >= (int)sizeof path)
        return;
    int len = snprintf(out, sizeof out, "{\"pid\": %d, \"mode\": \"%s\", \"threads\": %d, "
                       "\"lifetime_groups\": %d, \"vm_hwm_kb\": %ld, \"watched_sites\": %d, "
                       "\"heap_of_class\": [",
                       (int)getpid(), modes[ha_mode], n, ha_mode != 0 && ha_lifetime_groups,
                       vm_hwm_kb(), HA_WATCHED_SITES);
    for (int c = 0; c < HA_SLOTS; c++)
        len += snprintf(out + len, sizeof out - len, "%s%d", c ? ", " : "", ha_heap_of[c]);
    len += snprintf(out + len, sizeof out - len, "], \"backend\": \"%s\"",
                    ha_backend_pack ? "pack" : ha_fallback_backend ? ha_fallback_backend
                                                                   : "glibc");
    if (ha_backend_pack) {   /* mimalloc and glibc do not say which group's pages they gave back */
        len += snprintf(out + len, sizeof out - len, ", \"pages_returned_by_heap\": [");
        for (int g = 0; g < HA_HEAPS; g++)
            len += snprintf(out + len, sizeof out - len, "%s%llu", g ? ", " : "",
                            (unsigned long long)pack_pages_returned(g));
        len += snprintf(out + len, sizeof out - len, "]");
    }
    len += snprintf(out + len, sizeof out - len, ", \"classes\": [");
    for (int c = 0; c < HA_SLOTS && len < (int)sizeof out; c++)
        len += snprintf(out + len, sizeof out - len,
                        "%s{\"class\": %d, \"allocations\": %llu, \"bytes\": %llu, "
                        "\"mispredicted\": %llu, \"reclassified_sites\": %llu, "
                        "\"mispredicted_untracked\": %llu}",
                        c ? ", " : "", c == HA_DEFAULT ? -1 : c, (unsigned long long)allocs[c],
                        (unsigned long long)bytes[c],
                        (unsigned long long)atomic_load(&mispredicted[c]),
                        (unsigned long long)atomic_load(&reclassified[c]),
                        (unsigned long long)atomic_load(&untracked[c]));
    if (len < (int)sizeof out)
        len += snprintf(out + len, sizeof out - len, "]}\n");
    if (len >= (int)sizeof out)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    fchmod(fd, 0600);   /* whatever the program's umask: `heapcast run` reads it */
    ssize_t w = write(fd, out, (size_t)len);
    (void)w;
    close(fd);
}
