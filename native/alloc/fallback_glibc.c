/* The allocator beside the packer in libheapcast_alloc.so: glibc's own malloc, through the entry
 * points glibc exports under its own names (__libc_malloc...), which our interposed malloc does
 * not shadow. It is in every process anyway, so nothing more is loaded: linking mimalloc for
 * these rare blocks (alignments above a page, a region that cannot be reserved) cost 0.45 MiB
 * of resident memory (its pages and libm's) on an empty C program, 0.1-0.4 MiB on the corpus's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "alloc.h"

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_memalign(size_t align, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);

const char ha_fallback_name[] = "glibc's malloc";
const char *const ha_fallback_backend = NULL;

/* glibc's malloc_usable_size (ours interposes it): looked up when the library loads. */
static size_t (*libc_usable)(void *);

void ha_fallback_load(void) {
    libc_usable = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
}

void *ha_fallback_alloc(int heap, size_t size, size_t align, int zero) {
    (void)heap;
    if (align > 16) {
        void *p = __libc_memalign(align, size);
        if (p && zero)
            memset(p, 0, size);
        return p;
    }
    return zero ? __libc_calloc(1, size) : __libc_malloc(size);
}

/* glibc's chunk header, should the lookup have failed (or a block be asked about before the
 * library's constructor ran): the chunk's size word before the block, less its own overhead. */
size_t ha_fallback_usable(void *p) {
    if (libc_usable)
        return libc_usable(p);
    size_t head = ((size_t *)p)[-1];
    return (head & ~(size_t)7) - (head & 2 ? 2 : 1) * sizeof(size_t);
}

void ha_fallback_free(void *p) {
    __libc_free(p);
}

void *ha_fallback_realloc(int heap, void *p, size_t size) {
    (void)heap;
    return __libc_realloc(p, size);
}
