/* Decodes the raw files the recorder writes (native/recorder/raw_format.h) into event columns:
 * the chunk scan and the per-window decoding of heapcast.trace.raw.RawProcess, which `heapcast
 * finalize` runs on every slot of a trace.
 *
 * heapcast.trace.native_raw calls these functions through ctypes (heapcast/libheapcast_codec.so,
 * built with encode.c); there is no global state. The raw file is passed as the bytes of its
 * mapping (map, map_len): every read stays inside the chunk it was given, and a chunk that does not
 * lie inside the mapping is refused, so a truncated or hostile file cannot make these functions
 * read outside it. Errors that concern the file's content (a bad op code, a two-slot event without
 * its second slot) are returned with the slot's index, for the caller to raise the TraceError that
 * names the offset.
 *
 * Columns are those of heapcast.trace.format.EVENT_DTYPE but `proc`, each a contiguous array. The
 * times are converted exactly as RawProcess.ticks_to_ns did it with numpy: a float64 product
 * rounded half to even (rint) and added to an int64, so that the values are bit-identical. */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../recorder/raw_format.h"
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the raw format is little-endian, and so must be the host of this decoder"
#endif

#define HC_API __attribute__((visibility("default")))
#define HC_RAW_ABI_VERSION 3   /* 2: the chunk's cursor (ordered, next_*); 3: hc_raw_scan_chunks */

enum { ERR_ARGS = -1, ERR_SPACE = -2, ERR_NOMEM = -3, ERR_EXT = -5,
       ERR_DUP = -6 /* (internal: a seq met twice, see decode_direct) */ };
#define PREFETCH_AHEAD (64 * HC_RECORD_SIZE)   /* bytes of slots read ahead (see decode) */

/* One chunk to decode (mirrored by heapcast.trace.native_raw.CHUNK_DTYPE).
 *
 * The cursor: a window is decoded from where the chunk's previous window stopped. A chunk whose
 * events come in seq order in its slots (`ordered`, from the scan: any chunk of a thread that no
 * signal handler interrupted mid-event) is read from next_slot, whose time base is next_tsc,
 * when the window starts at or above next_seq (every event before next_slot has a lower seq),
 * and only up to its first event at or above the window's end, where hc_raw_window leaves the
 * cursor. Without it, the chunks that straddle the windows' edges were read whole by each window
 * they overlap, twice for interleaved threads (count, then place): 2-3 windows a chunk, where
 * threads decoded at 21-24 ns an event against ring's 8. A zeroed cursor (next_tsc = tsc) reads
 * the chunk from its start, as does every chunk that is not ordered. */
typedef struct {
    uint64_t offset;    /* of the chunk header in the mapping */
    uint64_t size;      /* chunk bytes, header included */
    uint64_t n;         /* slots to read after the header (up to the last non-zero head) */
    uint64_t tsc;       /* the chunk's first time base (its header's tsc) */
    uint32_t tid;
    uint32_t ordered;   /* 1: its events' seqs increase in slot order (hc_raw_scan_chunk) */
    uint64_t next_slot, next_tsc, next_seq;   /* the cursor (ordered chunks only) */
} hc_raw_chunk;

/* Ticks -> ns (mirrored by heapcast.trace.native_raw.Clock): identity, or
 * n0 + rint((double)(ticks - t0) * slope) in int64 arithmetic. */
typedef struct {
    double slope;
    int64_t t0, n0;
    uint32_t identity, pad;
} hc_raw_clock;

/* Where the events go (mirrored by heapcast.trace.native_raw.Columns): row i of each column. */
typedef struct {
    uint64_t *seq, *ts, *addr, *old_addr, *size, *arg;
    uint32_t *loc, *tid, *free_lag;
    uint8_t *op, *flags;
} hc_raw_columns;

static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* numpy's float64 -> int64 cast on x86-64 (cvttsd2si): out of range and NaN give INT64_MIN. */
static inline int64_t to_int64(double x) {
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) return INT64_MIN;
    return (int64_t)x;
}

/* to_int64(rint(x)): on x86-64 one cvtsd2si, which rounds as the MXCSR says (half to even, as
 * rint, in any process that did not change it: heapcast's own) and gives INT64_MIN out of range
 * and for NaN, as to_int64 does; it took a fifth of the window's decoding as the compiler's
 * rint (add and subtract 2^52) and the range check. */
static inline int64_t rint_int64(double x) {
#if defined(__x86_64__) && defined(__SSE2__)
    return _mm_cvtsd_si64(_mm_set_sd(x));
#else
    return to_int64(rint(x));
#endif
}

static inline uint64_t ticks_to_ns(const hc_raw_clock *clk, uint64_t ticks) {
    if (clk->identity) return ticks;
    double d = (double)(int64_t)(ticks - (uint64_t)clk->t0);
    return (uint64_t)clk->n0 + (uint64_t)rint_int64(d * clk->slope);
}

/* The chunk lies in the mapping and its n slots in the chunk. */
static int chunk_ok(uint64_t map_len, const hc_raw_chunk *c) {
    return c->size >= HC_RECORD_SIZE && c->offset <= map_len && c->size <= map_len - c->offset
           && c->n <= (c->size - HC_RECORD_SIZE) / HC_RECORD_SIZE;
}

static inline int has_ext(unsigned op) {   /* op <= HC_MREMAP: takes an HC_EXT second slot */
    return op != HC_MALLOC && op != HC_FREE;
}

/* Where a window's decoding of a chunk starts (slot, time base there) and where it stopped. */
typedef struct { uint64_t start, base, stop, stop_base; } span;

/* The chunk's cursor where it applies to a window starting at lo, else its first slot. */
static inline void span_start(const hc_raw_chunk *c, uint64_t lo, span *sp) {
    const int cursor = c->ordered && lo >= c->next_seq && c->next_slot <= c->n;
    sp->start = cursor ? c->next_slot : 0;
    sp->base = cursor ? c->next_tsc : c->tsc;
}

/* Decodes the events of one chunk whose seq lies in [lo, hi), in slot order from slot
 * sp->start (time base sp->base), into rows of out (cap rows in all): at, at + 1, ... or, with
 * place, row place[seq - lo]++ (place[s]: where the next event of seq lo + s goes), or with
 * seen, row seq - lo, its bit set in seen (ERR_DUP if it was: a seq met twice). An ordered
 * chunk stops at its first event at or above hi (sp->stop, with its time base); any other is
 * read to its end. Returns the rows written, or ERR_EXT with *bad = the index (after the header)
 * of the slot that should have been the HC_EXT slot of the event before it. Every event read is
 * checked, in range or not (an ordered chunk's events beyond hi are checked by a later window).
 * loc: through remap (ids >= nremap give 0) when remap is not NULL. */
static inline __attribute__((always_inline)) int64_t decode(
        const uint8_t *map, const hc_raw_chunk *c, span *sp, const hc_raw_clock *clk,
        uint64_t lo, uint64_t hi, const uint32_t *remap, uint64_t nremap,
        const hc_raw_columns *out, uint64_t at, uint64_t cap, uint32_t *place, uint64_t *seen,
        uint64_t *bad) {
    const uint8_t *slots = map + c->offset + HC_RECORD_SIZE;
    const uint64_t n = c->n;
    const uint32_t tid = c->tid;
    const int ordered = c->ordered;
    uint64_t base = sp->base, m = at, i = sp->start;
    for (; i < n; i++) {
        const uint8_t *s = slots + i * HC_RECORD_SIZE;
        /* 2 KiB ahead: the hardware prefetcher stops at each 4 KiB page of the mapping, and a
         * quarter of the time went to waiting for the slot's first load (decoding 9-13% faster
         * with it; a prefetch does not fault, so past the chunk it costs nothing) */
        __builtin_prefetch(s + PREFETCH_AHEAD);
        const uint64_t head = rd64(s);
        if (!head) continue;   /* not a record (see raw_format.h) */
        const unsigned op = head & 0xFF;
        if (op > HC_MREMAP) {
            if (op == HC_TIME) base = rd64(s + 16);
            continue;   /* HC_LOC, HC_LOCX, HC_EXT (and bad ops, which the scan refuses) */
        }
        const uint64_t seq = head >> 8;
        if (seq >= hi && ordered) break;   /* the rest is for later windows */
        const uint8_t *x = NULL;
        if (has_ext(op)) {
            if (i + 1 >= n || (rd64(s + HC_RECORD_SIZE) & 0xFF) != HC_EXT) {
                *bad = i + 1;
                return ERR_EXT;
            }
            x = s + HC_RECORD_SIZE;
        }
        if (seq < lo || seq >= hi) continue;
        const uint64_t r = place ? place[seq - lo]++ : seen ? seq - lo : m;
        if (r >= cap) return ERR_SPACE;   /* (place: only if the file changed since it counted) */
        if (seen) {
            if (seen[r >> 6] >> (r & 63) & 1) return ERR_DUP;
            seen[r >> 6] |= 1ull << (r & 63);
        }
        const uint64_t a = rd64(s + 16);
        const int released = op == HC_FREE || op == HC_MUNMAP;   /* the address passed in is in a */
        uint64_t old = released ? a : 0, arg = 0;
        uint32_t lag = 0;
        if (x) {
            if (op != HC_MUNMAP) old = rd64(x + 8);   /* ts | loc << 32 */
            arg = rd64(x + 16);
            const uint64_t l = rd64(x) >> 8;
            lag = l > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)l;
        }
        uint32_t loc = rd32(s + 12);
        if (remap) loc = loc < nremap ? remap[loc] : 0;
        out->seq[r] = seq;
        out->ts[r] = ticks_to_ns(clk, (uint64_t)rd32(s + 8) + base);
        out->addr[r] = released ? 0 : a;
        out->old_addr[r] = old;
        out->size[r] = rd64(s + 24);
        out->arg[r] = arg;
        out->loc[r] = loc;
        out->tid[r] = tid;
        out->free_lag[r] = lag;
        out->op[r] = (uint8_t)op;
        out->flags[r] = 0;
        m++;
    }
    sp->stop = i;
    sp->stop_base = base;
    return (int64_t)(m - at);
}

/* Scans one chunk: out[0] = n (slots up to the last non-zero head), out[1] = events, out[2] and
 * out[3] = their smallest and largest seq (0 without events), out[4] = HC_LOC slots, out[5] = the
 * index of the first slot whose op is neither an operation nor a marker (UINT64_MAX if none; the
 * caller refuses such a chunk), out[6] = 1 when the events' seqs increase in slot order (the
 * chunk's `ordered`). Returns 0, or ERR_ARGS if the chunk is not inside the mapping. */
HC_API int64_t hc_raw_scan_chunk(const uint8_t *map, uint64_t map_len, uint64_t offset,
                                 uint64_t size, uint64_t *out) {
    hc_raw_chunk c = {.offset = offset, .size = size};
    if (!map || !out || !chunk_ok(map_len, &c)) return ERR_ARGS;
    const uint8_t *slots = map + offset + HC_RECORD_SIZE;
    const uint64_t total = (size - HC_RECORD_SIZE) / HC_RECORD_SIZE;
    uint64_t n = 0, events = 0, lo = UINT64_MAX, hi = 0, locs = 0, bad = UINT64_MAX, last = 0;
    int ordered = 1;
    for (uint64_t i = 0; i < total; i++) {
        __builtin_prefetch(slots + i * HC_RECORD_SIZE + PREFETCH_AHEAD);
        const uint64_t head = rd64(slots + i * HC_RECORD_SIZE);
        if (!head) continue;   /* not a record; records may follow (see raw_format.h) */
        n = i + 1;
        const unsigned op = head & 0xFF;
        if (op <= HC_MREMAP) {
            const uint64_t seq = head >> 8;
            lo = seq < lo ? seq : lo;
            hi = seq > hi ? seq : hi;
            ordered &= !events || seq > last;
            last = seq;
            events++;
        } else if (op == HC_LOC) {
            locs++;
        } else if (op < HC_LOCX && bad == UINT64_MAX) {
            bad = i;
        }
    }
    out[0] = n;
    out[1] = events;
    out[2] = events ? lo : 0;
    out[3] = hi;
    out[4] = locs;
    out[5] = bad;
    out[6] = (uint64_t)ordered;
    return 0;
}

/* Scans n chunks (offsets[i], sizes[i]) as hc_raw_scan_chunk, chunk i's results at out[7 * i]:
 * one call for many chunks, so that a caller can split a file's chunks between threads.
 * Returns 0, or the error of the first chunk that hc_raw_scan_chunk refuses (not inside the
 * mapping), whose index is then in out[0]. */
HC_API int64_t hc_raw_scan_chunks(const uint8_t *map, uint64_t map_len, uint64_t n,
                                  const uint64_t *offsets, const uint64_t *sizes, uint64_t *out) {
    if (!offsets || !sizes || !out) return ERR_ARGS;
    for (uint64_t i = 0; i < n; i++) {
        int64_t rc = hc_raw_scan_chunk(map, map_len, offsets[i], sizes[i], out + 7 * i);
        if (rc) {
            out[0] = i;
            return rc;
        }
    }
    return 0;
}

/* Decodes one chunk's events with seq in [lo, hi) into rows at.. of out (see decode). Returns the
 * rows written, or an error: ERR_EXT (*bad = the slot index), ERR_SPACE, ERR_ARGS. */
HC_API int64_t hc_raw_decode_chunk(const uint8_t *map, uint64_t map_len, const hc_raw_chunk *chunk,
                                   const hc_raw_clock *clk, uint64_t lo, uint64_t hi,
                                   const uint32_t *remap, uint64_t nremap,
                                   const hc_raw_columns *out, uint64_t at, uint64_t cap,
                                   uint64_t *bad) {
    if (!map || !chunk || !clk || !out || !bad || at > cap || !chunk_ok(map_len, chunk))
        return ERR_ARGS;
    span sp = {0, chunk->tsc, 0, 0};   /* from its start, whatever its cursor */
    return decode(map, chunk, &sp, clk, lo, hi, remap, nremap, out, at, cap, NULL, NULL, bad);
}

/* Adds the events of one chunk with seq in [lo, hi), from slot sp->start on, to
 * count[seq - lo + 1]: the rows that decode will write for it. */
static void count_seqs(const uint8_t *map, const hc_raw_chunk *c, const span *sp, uint64_t lo,
                       uint64_t hi, uint32_t *count) {
    const uint8_t *slots = map + c->offset + HC_RECORD_SIZE;
    for (uint64_t i = sp->start; i < c->n; i++) {
        __builtin_prefetch(slots + i * HC_RECORD_SIZE + PREFETCH_AHEAD);   /* as in decode */
        const uint64_t head = rd64(slots + i * HC_RECORD_SIZE), seq = head >> 8;
        if (!head || (head & 0xFF) > HC_MREMAP) continue;
        if (seq >= hi && c->ordered) break;
        if (seq >= lo && seq < hi) count[seq - lo + 1]++;
    }
}

#define MOVE_ROWS(col, to, from, count) \
    memmove(out->col + (to), out->col + (from), (count) * sizeof *out->col)

/* Moves the rows whose bit is set in seen (rows 0..width-1) down over those whose bit is not,
 * keeping their order; returns how many there are. */
static uint64_t compact(const hc_raw_columns *out, const uint64_t *seen, uint64_t width) {
    uint64_t w = 0, r = 0;
    while (r < width) {
        while (r < width && !(seen[r >> 6] >> (r & 63) & 1))
            r += (r & 63) == 0 && seen[r >> 6] == 0 ? 64 : 1;
        const uint64_t a = r < width ? r : width;
        while (r < width && (seen[r >> 6] >> (r & 63) & 1))
            r += (r & 63) == 0 && r + 64 <= width && seen[r >> 6] == ~0ull ? 64 : 1;
        if (r > width) r = width;
        if (w != a && r > a) {
            MOVE_ROWS(seq, w, a, r - a);
            MOVE_ROWS(ts, w, a, r - a);
            MOVE_ROWS(addr, w, a, r - a);
            MOVE_ROWS(old_addr, w, a, r - a);
            MOVE_ROWS(size, w, a, r - a);
            MOVE_ROWS(arg, w, a, r - a);
            MOVE_ROWS(loc, w, a, r - a);
            MOVE_ROWS(tid, w, a, r - a);
            MOVE_ROWS(free_lag, w, a, r - a);
            MOVE_ROWS(op, w, a, r - a);
            MOVE_ROWS(flags, w, a, r - a);
        }
        w += r - a;
    }
    return w;
}

/* The rows of a window whose threads interleave, in one pass: in a well-formed file every
 * event has a seq of its own, so each goes straight to row seq - lo (the window is no wider
 * than cap), and the rows then move down over the seqs that no event took (a realloc's
 * second one, events lost). Against counting the rows of each seq first (a second pass over
 * every slot), threads.c decodes at 11.8 instead of 17.0 ns an event. A seq met twice (a damaged
 * file) gives ERR_DUP, and the caller counts and places instead, as a stable sort would.
 * Errors as decode's, with *k the chunk. */
static int64_t decode_direct(const uint8_t *map, const hc_raw_chunk *chunks, uint64_t nchunks,
                             span *sp, const hc_raw_clock *clk, uint64_t lo, uint64_t hi,
                             const uint32_t *remap, uint64_t nremap, const hc_raw_columns *out,
                             uint64_t *k, uint64_t *bad) {
    const uint64_t width = hi - lo;
    uint64_t *seen = calloc(width / 64 + 1, sizeof *seen);
    if (!seen) return ERR_NOMEM;
    int64_t got = 0;
    for (*k = 0; *k < nchunks; (*k)++) {
        got = decode(map, &chunks[*k], &sp[*k], clk, lo, hi, remap, nremap, out, 0, width, NULL,
                     seen, bad);
        if (got < 0) break;
    }
    if (got >= 0) got = (int64_t)compact(out, seen, width);
    free(seen);
    return got;
}

typedef struct { uint64_t key, row; } keyed;

/* Merges the sorted runs a[lo..mid) and a[mid..hi) into b; ties keep a's order (stable). */
static void merge(const keyed *a, keyed *b, uint64_t lo, uint64_t mid, uint64_t hi) {
    uint64_t i = lo, j = mid, k = lo;
    while (i < mid && j < hi) b[k++] = a[j].key < a[i].key ? a[j++] : a[i++];
    memcpy(b + k, a + i, (mid - i) * sizeof *a);
    k += mid - i;
    memcpy(b + k, a + j, (hi - j) * sizeof *a);
}

#define PERMUTE(col, type)                                                  \
    do {                                                                    \
        type *t_ = (type *)tmp;                                             \
        for (uint64_t r_ = 0; r_ < m; r_++) t_[r_] = out->col[a[r_].row];   \
        memcpy(out->col, t_, m * sizeof(type));                             \
    } while (0)

/* Puts rows 0..m-1 of out in seq order, as a stable sort would (rows of equal seq keep their
 * order): a natural merge sort of the (seq, row) pairs, whose runs are the chunks' rows. */
static int sort_rows(const hc_raw_columns *out, uint64_t m) {
    keyed *a = malloc(m * sizeof *a), *b = malloc(m * sizeof *b);
    uint64_t *runs = malloc((m + 1) * sizeof *runs);
    if (!a || !b || !runs) {
        free(a); free(b); free(runs);
        return ERR_NOMEM;
    }
    uint64_t nruns = 0;
    for (uint64_t r = 0; r < m; r++) {
        a[r].key = out->seq[r];
        a[r].row = r;
        if (r == 0 || a[r].key < a[r - 1].key) runs[nruns++] = r;
    }
    runs[nruns] = m;
    while (nruns > 1) {   /* merge neighbouring runs pairwise, until one is left */
        uint64_t k = 0;
        for (uint64_t i = 0; i < nruns; i += 2) {
            uint64_t lo = runs[i], mid = runs[i + 1], hi = i + 2 <= nruns ? runs[i + 2] : mid;
            if (i + 1 < nruns) merge(a, b, lo, mid, hi);
            else memcpy(b + lo, a + lo, (mid - lo) * sizeof *a);
            runs[k++] = lo;
        }
        runs[k] = m;
        nruns = k;
        keyed *t = a; a = b; b = t;
    }
    free(runs);
    void *tmp = b;   /* m * 16 bytes: room for any column */
    for (uint64_t r = 0; r < m; r++) out->seq[r] = a[r].key;
    PERMUTE(ts, uint64_t);
    PERMUTE(addr, uint64_t);
    PERMUTE(old_addr, uint64_t);
    PERMUTE(size, uint64_t);
    PERMUTE(arg, uint64_t);
    PERMUTE(loc, uint32_t);
    PERMUTE(tid, uint32_t);
    PERMUTE(free_lag, uint32_t);
    PERMUTE(op, uint8_t);
    PERMUTE(flags, uint8_t);
    free(a);
    free(b);
    return 0;
}

/* One window of events: those with seq in [lo, hi) of the given chunks (in the caller's chunk
 * order), in seq order, into rows 0.. of out (cap rows: at least the chunks' n in all). The result
 * is that of a stable sort by seq of the chunks' rows concatenated (rows of equal seq keep their
 * order). The rows are decoded chunk after chunk, as long as they come in seq order (one thread,
 * the common case). When they do not (threads interleave, or a signal handler's event was written
 * before the event it interrupted), every row is decoded again straight into its place: row seq -
 * lo, then moved down over the seqs no event took (decode_direct), or where a seq comes twice,
 * counted beforehand per seq number; for a window much wider than its rows, they are sorted.
 * Each ordered chunk is read from its cursor, which is left where the window ended (see
 * hc_raw_chunk): give the same chunks to the next window.
 * Returns the rows, or an error: ERR_EXT with where[0] = the chunk's index in chunks and where[1]
 * = the slot index (the first in chunk and slot order), ERR_SPACE, ERR_NOMEM, ERR_ARGS (a chunk
 * outside the mapping). */
HC_API int64_t hc_raw_window(const uint8_t *map, uint64_t map_len, hc_raw_chunk *chunks,
                             uint64_t nchunks, const hc_raw_clock *clk, uint64_t lo, uint64_t hi,
                             const uint32_t *remap, uint64_t nremap, const hc_raw_columns *out,
                             uint64_t cap, uint64_t *where) {
    if (!map || (nchunks && !chunks) || !clk || !out || !where) return ERR_ARGS;
    for (uint64_t k = 0; k < nchunks; k++)
        if (!chunk_ok(map_len, &chunks[k])) return ERR_ARGS;
    span *sp = malloc((nchunks ? nchunks : 1) * sizeof *sp);
    if (!sp) return ERR_NOMEM;
    for (uint64_t k = 0; k < nchunks; k++) span_start(&chunks[k], lo, &sp[k]);
    uint64_t m = 0, k = 0, bad = 0;
    int64_t got = 0;
    int sorted = 1;
    for (; k < nchunks && sorted; k++) {   /* in order, while the rows come in seq order */
        got = decode(map, &chunks[k], &sp[k], clk, lo, hi, remap, nremap, out, m, cap, NULL, NULL,
                     &bad);
        if (got < 0) goto fail;
        for (uint64_t r = m ? m : 1; r < m + (uint64_t)got; r++) {
            if (out->seq[r] <= out->seq[r - 1]) {
                sorted = 0;
                break;
            }
        }
        m += (uint64_t)got;
    }
    if (sorted) goto done;
    const uint64_t width = hi - lo;
    if (width <= cap) {
        got = decode_direct(map, chunks, nchunks, sp, clk, lo, hi, remap, nremap, out, &k, &bad);
        if (got >= 0) {
            m = (uint64_t)got;
            goto done;
        }
        if (got != ERR_DUP) goto fail;
    }
    if (width <= 4 * cap + (1u << 16) && cap < UINT32_MAX) {
        /* Count the rows of each seq, then decode every chunk again, each row into its place. */
        uint32_t *place = calloc(width + 1, sizeof *place);
        if (!place) {
            got = ERR_NOMEM;
            goto fail;
        }
        for (uint64_t j = 0; j < nchunks; j++) count_seqs(map, &chunks[j], &sp[j], lo, hi, place);
        for (uint64_t s = 1; s <= width; s++) place[s] += place[s - 1];
        m = place[width];
        for (k = 0; k < nchunks; k++) {
            got = decode(map, &chunks[k], &sp[k], clk, lo, hi, remap, nremap, out, 0, cap, place,
                         NULL, &bad);
            if (got < 0) break;
        }
        free(place);
        if (got < 0) goto fail;
        goto done;
    }
    for (; k < nchunks; k++) {   /* the rest in order, then sort them all */
        got = decode(map, &chunks[k], &sp[k], clk, lo, hi, remap, nremap, out, m, cap, NULL, NULL,
                     &bad);
        if (got < 0) goto fail;
        m += (uint64_t)got;
    }
    got = sort_rows(out, m);
    if (got < 0) goto fail;
done:
    for (k = 0; k < nchunks; k++) {   /* each ordered chunk's cursor: where this window ended */
        if (!chunks[k].ordered) continue;
        chunks[k].next_slot = sp[k].stop;
        chunks[k].next_tsc = sp[k].stop_base;
        chunks[k].next_seq = hi;
    }
    free(sp);
    return (int64_t)m;
fail:
    free(sp);
    if (got == ERR_EXT) {
        where[0] = k;
        where[1] = bad;
    }
    return got;
}

HC_API uint64_t hc_raw_abi(int what) {
    return what == 0 ? HC_RAW_ABI_VERSION : what == 1 ? sizeof(hc_raw_chunk)
         : what == 2 ? sizeof(hc_raw_clock) : what == 3 ? sizeof(hc_raw_columns) : 0;
}
