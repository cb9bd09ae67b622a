/* heapcast's packing allocator (native/alloc/pack.c): blocks up to PACK_MAX bytes in size
 * classes 16 bytes apart (8 with HEAPCAST_PACK_GRAIN=8) up to 8 KiB, then 32 per power of two,
 * carved from spans of one reserved region, no per-block header, free pages given back to the
 * kernel; larger blocks in a mapping each (pack_big_*). alloc.c serves what is left (alignments
 * above a page, allocations before the configuration is read) from mimalloc and dispatches
 * free() by address: pack_owns(p) is a range check. */
#ifndef HEAPCAST_PACK_H
#define HEAPCAST_PACK_H

#include <stddef.h>
#include <stdint.h>

#define PACK_GROUPS 4                 /* lifetime groups (alloc.h's HA_HEAPS): spans never mix them */
#define PACK_MAX ((size_t)256 * 1024)  /* the largest request served */

/* The reserved region [pack_lo, pack_hi); both 0 until pack_init succeeds. */
extern uintptr_t pack_lo, pack_hi;

static inline int pack_owns(const void *p) {
    return (uintptr_t)p - pack_lo < pack_hi - pack_lo;
}

/* Reserves the region and reads HEAPCAST_PACK_* (span size, retention); 0 on success. Call once,
 * before any other pack_* function, from one thread. */
int pack_init(void);
/* A block of at least `size` bytes (<= PACK_MAX) aligned to `align` (a power of two; 16 is always
 * met) in `group`'s spans, or NULL when the packer does not serve it (the caller falls back). */
void *pack_alloc(int group, size_t size, size_t align);
void pack_free(void *p);                  /* p: pack_owns(p) */
size_t pack_usable_size(const void *p);   /* p: pack_owns(p); the block's class size */
/* Blocks over PACK_MAX: one mapping each (page-aligned; `zero`: its first `size` bytes read
 * zero). pack_big_len: the length of p's mapping if p is such a block, else 0; pack_big_free: 1
 * if p was one (and is freed: a few recent ones are kept for reuse, HEAPCAST_PACK_BIG_CACHE). */
void *pack_big_alloc(size_t size, int zero);
size_t pack_big_len(const void *p);
int pack_big_free(void *p);
void *pack_big_realloc(void *p, size_t size);   /* p: pack_big_len(p) != 0; NULL: p untouched */
/* Pages of `group`'s spans given back to the kernel so far (madvise; --log). */
uint64_t pack_pages_returned(int group);
void pack_dump(void);                     /* HEAPCAST_PACK_DEBUG: what each class holds */
size_t pack_class_bytes(size_t size);     /* size <= PACK_MAX: the size of its class */

#endif
