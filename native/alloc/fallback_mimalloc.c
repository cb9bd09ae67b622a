/* The allocator beside the packer in libheapcast_alloc_mimalloc.so: mimalloc (Debian's
 * libmimalloc), which can also serve every block (HEAPCAST_ALLOC_BACKEND=mimalloc).
 *
 * Placement on mimalloc: a thread owns one mimalloc first-class heap per lifetime group
 * (ha_heap_of maps the six classes and "no class" to heaps; heap 0 is mimalloc's own default
 * heap). mimalloc never puts blocks of two heaps in one of its pages (64 KiB for small blocks), so
 * blocks of different groups never share a page, and a page whose short-lived blocks are all
 * freed goes back whole. Any thread may free any block (mi_free finds its page); realloc moves a
 * block to the heap of its new class only when mimalloc has to move it anyway.
 *
 * Class heaps die with their thread: mimalloc deletes a thread's heaps (their pages move to the
 * backing heap) in its thread-specific-data destructor. Ours, created right after mimalloc's (so
 * that glibc runs it next), marks the thread's heaps gone, and an allocation after that (another
 * destructor's) makes new ones, which mimalloc will tear down again in its next round. Keys
 * created between mimalloc's and ours (none, unless a library's constructor made one before
 * ours ran) would see deleted heaps. mimalloc reuses the memory of a thread's heaps, so their
 * addresses cannot tell a live heap from a deleted one. */
#define _GNU_SOURCE
#include <errno.h>
#include <mimalloc.h>
#include <pthread.h>
#include <string.h>

#include "alloc.h"

const char ha_fallback_name[] = "mimalloc";
const char *const ha_fallback_backend = "mimalloc";

typedef struct {
    int live;                       /* heap[] are this thread's current heaps */
    int making;                     /* making them (pthread_setspecific may allocate) */
    mi_heap_t *heap[HA_HEAPS];
} thread_heaps;

static __thread thread_heaps th __attribute__((tls_model("initial-exec")));
static pthread_key_t heaps_key;
static int heaps_key_ok;

static void heaps_gone(void *unused) {
    th.live = 0;
}

void ha_fallback_load(void) {
    mi_thread_init();    /* mimalloc's destructor key first, then ours: glibc runs them in order */
    heaps_key_ok = pthread_key_create(&heaps_key, heaps_gone) == 0;
}

/* This thread's heap of index h; NULL means mimalloc's default heap. */
static mi_heap_t *heap_at(int h) {
    if (h <= 0 || h >= HA_HEAPS)
        return NULL;
    if (HA_UNLIKELY(!th.live)) {
        if (th.making)
            return NULL;
        th.making = 1;
        for (int i = 1; i < HA_HEAPS; i++)
            th.heap[i] = mi_heap_new();   /* NULL if out of memory: the default heap serves */
        th.live = 1;
        if (heaps_key_ok)
            pthread_setspecific(heaps_key, (void *)1);   /* our destructor runs at thread end */
        th.making = 0;
    }
    return th.heap[h];
}

/* mimalloc 2.0.9 serves an aligned request whose size is a multiple of the alignment from the
 * plain size class, assuming its blocks are aligned, which they are not in a segment's first
 * page; an odd size takes its general aligned path instead. */
static void *aligned_in(mi_heap_t *h, size_t size, size_t align) {
    void *p = h ? mi_heap_malloc_aligned(h, size, align) : mi_malloc_aligned(size, align);
    if (HA_UNLIKELY(p && ((uintptr_t)p & (align - 1)))) {
        mi_free(p);
        p = h ? mi_heap_malloc_aligned(h, size | 1, align) : mi_malloc_aligned(size | 1, align);
    }
    return p;
}

/* glibc aligns every block to 16 bytes; mimalloc's 8-byte size class does not, so the caller
 * asks for at least 16 bytes. errno stays as it was on success, as glibc leaves it (mimalloc
 * sets it on its way: ENOENT from a new heap's first allocation, seen near RLIMIT_AS). */
void *ha_fallback_alloc(int heap, size_t size, size_t align, int zero) {
    int saved = errno;
    mi_heap_t *h = heap_at(heap);
    void *p;
    if (align > 16) {
        p = aligned_in(h, size, align);
        if (p && zero)
            memset(p, 0, size);
    } else if (h) {
        p = zero ? mi_heap_zalloc(h, size) : mi_heap_malloc(h, size);
    } else {
        p = zero ? mi_zalloc(size) : mi_malloc(size);
    }
    if (p)
        errno = saved;
    return p;
}

size_t ha_fallback_usable(void *p) {
    return mi_usable_size(p);
}

void ha_fallback_free(void *p) {   /* free() leaves errno alone (POSIX.1-2024) */
    int saved = errno;
    mi_free(p);
    errno = saved;
}

void *ha_fallback_realloc(int heap, void *p, size_t size) {
    int saved = errno;
    mi_heap_t *h = heap_at(heap);
    void *q = h ? mi_heap_realloc(h, p, size) : mi_realloc(p, size);
    if (q)
        errno = saved;
    return q;
}
