/* The raw recording format: what the preloaded recorder writes while the program runs.
 *
 * One raw file per traced process image, "<pid>.raw" (or "<pid>.<n>.raw" after an exec that kept
 * the pid), in the trace directory. It is written through shared file mappings only, so that the
 * kernel keeps every completed record even when the process dies by SIGKILL. `heapcast record`
 * turns raw files into compressed .hct files when the program has ended (docs/trace-format.md).
 *
 * Layout: a 4096-byte header page, then chunks. A chunk belongs to one thread; it starts with a
 * 32-byte chunk header and holds 32-byte slots. An event takes one slot (malloc, free) or two
 * (the ops with more arguments: the second slot is a struct hc_ext). A slot is complete when its
 * first word (head) is non-zero: the recorder writes head last. Readers skip zero-head slots but
 * read on: a signal handler's records can follow the slot of the event it interrupted, which a
 * SIGKILL may leave unwritten. Chunks are 4 KiB-aligned; their sizes grow per thread from 4 KiB
 * to 1 MiB.
 *
 * Two kinds of slots are not events: HC_LOC defines a location id (a call site, or a stack with
 * --stacks) and HC_TIME moves the chunk's time base (a slot's ts is a 32-bit offset from it).
 * A location frame with bit 63 set is a Python frame (pyframes.h): its low 32 bits are the id of
 * a "P" line of the .mods file (file, function, line), written before the HC_LOC that uses it.
 *
 * Recycling (HC_FLAG_RECYCLE, when `heapcast record` runs a drainer, native/recorder/drain.c):
 * writing fresh file pages costs the program more than the records themselves (the kernel must
 * allocate and zero a page-cache page per 128 slots). So a thread that fills a 1 MiB chunk hands
 * it to the drainer through the header's `sealed` queue and keeps it mapped; the drainer copies
 * it to the end of the file, marks the original HC_CHUNK_DRAINED, zeroes its slots and hands it
 * back through the `free` queue, and a thread reuses it (and its mapped pages) as a new chunk.
 * A drainer that falls far behind the conversion keeps chunks instead of copying them (it marks
 * them HC_CHUNK_KEPT and hands them back with HC_FREE_UNMAP): copies then cost the converter's
 * core and double the dirty pages that the kernel writes back for nothing.
 * When the sealed queue is full (the drainer is behind), the thread leaves the chunk where it is
 * and sets HC_CHUNK_KEPT in its header: readers while the program runs may then take it as they
 * take a copy, since nothing will zero it. The last chunk of a thread that has ended is marked
 * likewise, with HC_CHUNK_ENDED, by the thread that finds it ended (recorder.c, "threads'
 * mappings"): that thread has no more events.
 * Every record stays in the file at every moment, so SIGKILL (of the program or the drainer)
 * loses nothing: a copy is written with magic 0 and given its magic only when complete, and a
 * chunk whose copy completed but that was not yet marked drained is the same chunk twice (same
 * tid, tsc and mono_ns): readers keep one. A copy whose records `heapcast record`'s converter
 * has converted and checkpointed (src/heapcast/recorder/checkpoint.py) is punched out of the file
 * (a hole, which readers skip): its records are then in "<pid>.hct.tmp", which a later
 * conversion goes on from, and the file's pages go back to the kernel for the next copies.
 *
 * Keep in sync with src/heapcast/trace/raw.py. */
#ifndef HEAPCAST_RAW_FORMAT_H
#define HEAPCAST_RAW_FORMAT_H
#include <stdint.h>

#define HC_RAW_MAGIC "HCRAW\0\0\0"
#define HC_RAW_VERSION 1
#define HC_HEADER_SIZE 4096
#define HC_RECORD_SIZE 32
#define HC_CHUNK_MAGIC 0x4b434348u   /* "HCCK" little-endian */
#define HC_CHUNK_DRAINED 0x44434348u /* "HCCD": copied elsewhere in the file; skip (size valid) */
#define HC_QUEUE 64                  /* entries of the sealed and the free queue */
#define HC_FREE_UNMAP 1u              /* in a free queue entry's offset: the chunk was kept in
                                         place, not recycled; the thread that takes it unmaps it */
#define HC_CHUNK_MIN (4u << 10)
#define HC_CHUNK_MAX (1u << 20)
#define HC_CHUNK_KEPT 0x80000000u     /* os_tid bit: the thread left this chunk in place without
                                         handing it to the drainer; it never changes again */
#define HC_CHUNK_ENDED 0x40000000u    /* os_tid bit, with HC_CHUNK_KEPT: the thread had ended when
                                         it was set; its events are all written */

/* Operation codes (the low byte of a record's head). */
enum hc_op {
    HC_MALLOC = 0, HC_CALLOC = 1, HC_REALLOC = 2, HC_REALLOCARRAY = 3, HC_POSIX_MEMALIGN = 4,
    HC_ALIGNED_ALLOC = 5, HC_MEMALIGN = 6, HC_VALLOC = 7, HC_PVALLOC = 8, HC_FREE = 9,
    HC_MMAP = 10, HC_MUNMAP = 11, HC_MREMAP = 12,
    /* Slots that are not events (every slot's first word is non-zero, its low byte says what it is): */
    HC_LOCX = 0xFC,  /* more frames of the HC_LOC slot before it: 3 after the head word */
    HC_TIME = 0xFD,  /* a = the new time base of this chunk for the slots that follow */
    HC_LOC = 0xFE,   /* defines location id (head >> 8): ts = frame count, a and b = frames 0, 1 */
    HC_EXT = 0xFF,   /* second slot of the event before it (struct hc_ext) */
};

/* Header flags. */
#define HC_FLAG_MMAP 1u        /* mmap/munmap/mremap were recorded */
#define HC_FLAG_TSC 2u         /* ts fields are TSC ticks; convert with the chunk headers' clock pairs */
#define HC_FLAG_CLEAN_EXIT 4u  /* the library destructor ran (exit() or return from main) */
#define HC_FLAG_TRUNCATED 8u   /* the file could not grow: events after that point are lost */
/* (16: unused; an image not traced writes no raw file at all) */
#define HC_FLAG_RECYCLE 32u    /* full 1 MiB chunks go through the sealed/free queues */

/* A bounded queue of chunks between the recorder's threads and the drainer, in the shared header.
 * An entry is a chunk's file offset (never 0 once written) and the address at which the recorder
 * maps it (the drainer hands it back untouched). `sealed`: threads reserve an index by CAS on
 * tail, then publish `off`; the drainer takes entries in order, clearing `off`, then advancing
 * head. `free`: the drainer writes an entry, then advances tail; threads take one by CAS on head. */
struct hc_queue {
    _Alignas(64) volatile uint64_t head;
    volatile uint64_t tail;
    struct { volatile uint64_t off, addr; } e[HC_QUEUE];
};

struct hc_header {                 /* page 0 of a raw file */
    char magic[8];
    uint32_t version, header_size;
    uint32_t record_size, stack_depth;
    int32_t pid, ppid;
    int32_t forked_from;           /* pid of the process this one was forked from, else 0 */
    uint32_t image;                /* n in "<pid>.<n>.raw": exec count within this pid */
    uint64_t fork_seq;             /* parent's next sequence number when the fork happened */
    uint64_t start_mono_ns, start_real_ns;
    uint64_t start_tsc;
    uint64_t end_mono_ns, end_tsc; /* set by the destructor (clean exit) */
    uint64_t peak_rss_bytes;       /* VmHWM read by the destructor */
    uint32_t unwind;               /* 0 frame pointers, 1 DWARF (backtrace) */
    uint32_t clock_every;          /* 1: every event reads the clock; N > 1: one event in N of a
                                      thread does, or the first after a clock tick (below),
                                      and the others take that reading (`record --clock-every`);
                                      the fields above end before byte 128 */
    /* Shared counters, each on its own cache line. */
    _Alignas(64) volatile uint64_t seq;       /* next sequence number */
    _Alignas(64) volatile uint64_t file_end;  /* next free chunk offset */
    volatile uint64_t file_reserved;          /* the reservation frontier: bytes of the file
                                                 backed by fallocate (recorder.c, reserve_file;
                                                 copies punched out below it stay holes) */
    volatile uint64_t lost;                   /* events that could not be written */
    volatile uint32_t threads;                /* thread ids handed out */
    volatile uint32_t flags;
    volatile uint64_t locs;                   /* location ids handed out */
    struct hc_queue sealed, free;             /* with HC_FLAG_RECYCLE, see above */
    /* Written by `heapcast record`'s converter, never by the recorder (which leaves them 0): the
     * ticks -> ns conversion (ns = n0 + rint((ticks - t0) * slope)) it used to convert events
     * while the program ran, fitted over the clock pairs it had seen; a later conversion of this
     * file uses it too, so that both give the same times. clock_set is written last. */
    _Alignas(64) volatile uint64_t clock_set;  /* HC_CLOCK_SET when the three below are valid */
    double clock_slope;
    int64_t clock_t0, clock_n0;
    /* With clock_every > 1: the clock tick, bumped by the drainer every CLOCK_TICK_US (drain.c)
     * while the program runs. A thread's event after a tick reads the clock, so that no event
     * takes a reading from before a pause of the thread longer than a tick. */
    _Alignas(64) volatile uint64_t clock_tick;
};

#define HC_CLOCK_SET 0x4b434f4c43434800ull  /* "\0HCCLOCK" */

struct hc_chunk {                  /* 32 bytes at the start of every chunk */
    uint32_t magic, tid;
    uint32_t size, os_tid;         /* chunk bytes (header included); kernel thread id, with
                                      HC_CHUNK_KEPT once the thread has left the chunk in place
                                      (and HC_CHUNK_ENDED on the last one of an ended thread) */
    uint64_t tsc, mono_ns;         /* a clock pair taken when the chunk was claimed; tsc is also
                                      the chunk's first time base */
};

struct hc_record {                 /* one slot */
    uint64_t head;                 /* seq << 8 | op; written last, 0 = no record */
    uint32_t ts;                   /* ticks since the chunk's time base (TSC ticks or ns) */
    uint32_t loc;                  /* location id: call site, or stack with --stacks */
    uint64_t a;                    /* address produced (0 if none or failed); free, munmap: the
                                      address passed in */
    uint64_t b;                    /* requested bytes in total (calloc: nmemb*size, saturated) */
};

struct hc_ext {                    /* second slot of realloc, calloc, the memalign family, mmap... */
    uint64_t head;                 /* free_lag << 8 | HC_EXT, where free_lag: for realloc that
                                      moved, old was released free_lag seqs before seq */
    uint64_t old;                  /* realloc, reallocarray, mremap: the address passed in;
                                      mmap: the address hint */
    uint64_t arg;                  /* calloc, reallocarray: nmemb; memalign family: alignment;
                                      mmap: prot << 32 | flags; mremap: old length;
                                      munmap: 1 if it failed */
    uint64_t pad;
};

_Static_assert(sizeof(struct hc_record) == HC_RECORD_SIZE, "record size");
_Static_assert(sizeof(struct hc_chunk) == HC_RECORD_SIZE, "chunk header size");
_Static_assert(sizeof(struct hc_ext) == HC_RECORD_SIZE, "extension size");
_Static_assert(sizeof(struct hc_header) <= HC_HEADER_SIZE, "header size");
_Static_assert(__builtin_offsetof(struct hc_header, clock_set) == 2432, "clock offset (raw.py)");
_Static_assert(__builtin_offsetof(struct hc_header, clock_every) == 100, "clock_every (raw.py)");
_Static_assert(__builtin_offsetof(struct hc_header, clock_tick) == 2496, "clock_tick (trace-format.md)");

#endif
