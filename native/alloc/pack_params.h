/* The design constants of heapcast's packer (native/alloc/pack.c), shared with the allocator
 * lab's model of it (native/lab/pol_pack.c), so that the model judges the allocator that runs:
 * a change here changes both. pack.c's comment says why each value, with what was measured;
 * the HEAPCAST_PACK_* variables override some of them in the real allocator only. */
#ifndef HEAPCAST_PACK_PARAMS_H
#define HEAPCAST_PACK_PARAMS_H

#define PACK_UNIT_LOG 16          /* spans are made of 64 KiB units (HEAPCAST_PACK_SPAN) */
#define PACK_FINE_LOG 13          /* classes every 16 (or 8) bytes up to 8 KiB */
#define PACK_STEPS_LOG 5          /* then 32 classes per power of two */
#define PACK_MAX_LOG 18           /* up to 256 KiB; larger blocks get mappings of their own */
#define PACK_NB 8                 /* fullness lists of partly used spans (live in eighths) */
#define PACK_MIN_SPAN_BLOCKS 8    /* a span has enough units to hold at least this many blocks */
#define PACK_MAX_NLOG 7           /* spans of at most 128 units */
#define PACK_KEEP_EMPTY 1         /* empty spans a class keeps (HEAPCAST_PACK_EMPTY) */
#define PACK_DIRTY_BUDGET (256 * 1024)   /* free pages kept resident (HEAPCAST_PACK_DIRTY) */
#define PACK_BIG_CACHE 4          /* freed big mappings kept for the next big request... */
#define PACK_BIG_CACHE_MAX ((size_t)16 << 20)   /* ...and their bytes (HEAPCAST_PACK_BIG_CACHE) */
/* The allocator's default heap map (alloc.c's ha_heap_of; HEAPCAST_ALLOC_HEAPS): lifetime
 * classes 0-5, then "no class", to groups: short-lived, medium, the rest. */
#define PACK_HEAP_MAP {1, 1, 2, 2, 0, 0, 0}

#endif
