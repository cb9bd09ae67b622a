/* Encodes the payload of one EVENTS section of a .hct trace file (docs/trace-format.md,
 * "EVENTS"): per column a header (u8 field index, u8 encoding, u16 omitted planes, u32 byte
 * length), then its values transformed by the column's encoding and stored as byte planes
 * ("shuffled": byte k of every value, then byte k + 1...), leaving out the planes that are all
 * zero (most are: deltas of 1, sizes under 2^24, an arg that is nearly always 0...), on which
 * zstd spent about 30% of its time.
 *
 * heapcast.trace.native_codec calls this through ctypes (heapcast/libheapcast_codec.so) from the
 * trace writer's threads. The only state kept between calls is the memory of the
 * back-reference tables and their escape lists (a small pool, see below). The decoder
 * is numpy code (heapcast/trace/codec.py); tests/test_codec_native.py checks that the two agree,
 * byte for byte with the numpy encoder this code replaced.
 *
 * Columns given as one array each (what `heapcast record`'s converter passes) are encoded one
 * after the other. Columns read with a row stride (the fields of a structured numpy array,
 * 64-byte rows, read in place) are encoded TILE rows at a time, column by column, so that the
 * tile's rows stay in the cache while few streams of memory are read and written at once; there
 * the back-reference columns are encoded first, in a pass of their own, because their length
 * (the escapes) decides where the columns after them begin. With SSE2 (any x86-64), the values
 * of PLAIN, DELTA and ZIGZAG_DELTA columns are loaded, transformed and transposed into byte
 * planes in registers, 16 rows at a time; the rest goes through small buffers (stage, flush).
 *
 * Which planes are zero is known only when a column is complete, so a column is written with
 * the low planes it needed in the stream's previous block ("planes written": again with all of
 * them in the rare block that needs more; every plane without the caller's hint) while a
 * bitwise OR of the values it stores is kept (a few instructions per 16 rows, on values already
 * in registers): plane k is zero exactly when byte k of the OR is. close_column() then moves the
 * other planes down over the zero ones. One column after the
 * other, each is written where it begins in the output, and little moves: the zero planes are
 * mostly the high bytes. After tiles, every column moves down over the zero planes of those
 * before it, which costs about 2 ns per event (zstd saves 8).
 *
 * hc_sparsify, a call of its own (the writer runs it on the thread that compresses), then stores
 * the columns whose values are mostly zero as presence bits (predicted from the op column) and
 * their non-zero rows (format version 4, "sparse columns" below). */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE   /* mmap's MAP_ANONYMOUS, madvise */
#endif
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__SSE2__) && !defined(HC_NO_SIMD)
#define HC_SIMD 1
#include <emmintrin.h>
#include <tmmintrin.h>   /* SSSE3's byte shuffle, for sparse columns where the CPU has it */
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the trace format is little-endian, and so must be the host of this encoder"
#endif

#define HC_API __attribute__((visibility("default")))
#define HC_ABI_VERSION 6     /* 3: planes left out (TRACE_VERSION 2); 4: sparse columns (3);
                                5: their presence bits predicted from the ops (4); 6: the
                                encoder's hint of planes written */
#define MAX_COLUMNS 16      /* the format stores 11 */
#define CHUNK 64            /* rows staged together (a multiple of 16: one transposed group) */
#define TILE 4096           /* rows encoded column by column (a multiple of CHUNK) */

enum { PLAIN, DELTA, ZIGZAG_DELTA, NONZERO_DELTA, BACKREF };
#define SPARSE 0x80        /* flag of the header's encoding byte: only the non-zero rows stored */
#define SPARSE_MIN_ROWS 64  /* fewer rows: never sparse */
#define SPARSE_ROOM(n) ((n + 7) / 8 + 16 + (n))   /* sparsify()'s bytes after the payload:
                                                    presence bits, a copy of the ops */
enum { ERR_ARGS = -1, ERR_SPACE = -2, ERR_NOMEM = -3, ERR_TOO_LONG = -4 };

/* One column to encode (mirrored by heapcast.trace.native_codec.Column). */
typedef struct {
    const void *data;   /* row i's value (little-endian, itemsize bytes) at data + i * stride */
    int64_t stride;     /* bytes from one row to the next: itemsize when contiguous, 64 for a
                           field of an EVENT_DTYPE array */
    uint8_t field;      /* field index written in the column header */
    uint8_t encoding;   /* PLAIN .. BACKREF */
    uint8_t itemsize;   /* 1, 2, 4 or 8 */
    uint8_t pad;
    int32_t ref;        /* BACKREF: index in the column array of the column it refers to (addr) */
} hc_column;

typedef struct {
    uint64_t header;    /* where the column is written whole (its header; compact() moves it) */
    uint64_t len;       /* bytes of column data after it, every plane */
    uint64_t prev;      /* the previous (non-zero) value, for the delta encodings */
    uint64_t ored;      /* OR of the values written into the planes: byte k zero = plane k zero */
    uint64_t esc_ored;  /* BACKREF: the same for the escapes */
    uint64_t escapes;   /* BACKREF: how many */
    uint8_t encoding;   /* the encoding written (NONZERO_DELTA and BACKREF fall back to DELTA) */
    uint8_t wrapped;    /* NONZERO_DELTA met a difference of exactly 2**63, see nonzero_delta */
    uint8_t planes;     /* the low planes written (BACKREF: of the codes); the others are left
                           unwritten, predicted zero (see "planes written" below) */
    uint8_t *seen;      /* the caller's hint for this column (planes its previous block needed;
                           0: none), updated; NULL: no hint, every plane written */
    unsigned cur;       /* the buffer that the next chunk goes to */
    unsigned nstaged[2];/* buffer b holds rows staged[b] .. staged[b] + nstaged[b] - 1, transformed */
    uint64_t staged[2];
    union { uint64_t u64[CHUNK]; uint32_t u32[CHUNK]; } buf[2];
} colstate;

static inline uint64_t zigzag(uint64_t d) {
    return (d << 1) ^ (uint64_t)((int64_t)d >> 63);
}

static inline const uint8_t *row(const hc_column *c, uint64_t i) {
    return (const uint8_t *)c->data + (int64_t)i * c->stride;
}

/* Rows i .. i+cnt-1 of a column, widened to u64. */
static void gather64(const hc_column *c, uint64_t i, unsigned cnt, uint64_t *t) {
    const uint8_t *p = row(c, i);
    const int64_t s = c->stride;
    switch (c->itemsize) {
    case 8:
        if (s == 8) memcpy(t, p, cnt * 8);
        else for (unsigned j = 0; j < cnt; j++) memcpy(&t[j], p + j * s, 8);
        break;
    case 4: for (unsigned j = 0; j < cnt; j++) { uint32_t v; memcpy(&v, p + j * s, 4); t[j] = v; } break;
    case 2: for (unsigned j = 0; j < cnt; j++) { uint16_t v; memcpy(&v, p + j * s, 2); t[j] = v; } break;
    default: for (unsigned j = 0; j < cnt; j++) t[j] = p[j * s]; break;
    }
}

/* Rows i .. i+cnt-1 of a column as u64: in place when it is a contiguous u64 column (what the
 * converter passes: no copy), else gathered into t. */
static inline const uint64_t *values64(const hc_column *c, uint64_t i, unsigned cnt,
                                       uint64_t *t) {
    if (c->itemsize == 8 && c->stride == 8 && ((uintptr_t)c->data & 7) == 0)
        return (const uint64_t *)row(c, i);
    gather64(c, i, cnt, t);
    return t;
}

/* Byte planes: byte k of value j goes to dst[k * plane + j], for the low `planes` planes. */
static void put_scalar(const uint64_t *t, unsigned cnt, unsigned size, uint8_t *dst, uint64_t plane,
                       unsigned planes) {
    for (unsigned k = 0; k < size && k < planes; k++)
        for (unsigned j = 0; j < cnt; j++)
            dst[k * plane + j] = (uint8_t)(t[j] >> (8 * k));
}

#ifdef HC_SIMD
/* Interleaves the bytes of registers a and b into lo (first halves) and hi (second halves). */
#define ZIP(lo, hi, a, b) (lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b))
#define STORE(p, v) _mm_storeu_si128((__m128i *)(p), v)

/* 16 u64 values (a0 = values 0 and 1, ..., a7 = 14 and 15) -> 16 bytes in each of 8 planes.
 * Register r, byte p hold value 2r + p/8, byte p%8. Each round zips the registers whose numbers
 * differ in one bit (4, 2, 1, 4): that bit of the register number becomes the low bit of the
 * byte position, and the position's high bit becomes that register bit. After four rounds the
 * byte position is the value index, and register (k&1)<<2 | (k>>2)<<1 | (k>>1&1) holds byte k.
 * Two instructions per value; written out, because -O2 does not unroll loops. Only the low
 * `planes` planes are stored (a branch that goes the same way for a whole column). */
static inline __attribute__((always_inline)) void
transpose16x8(__m128i a0, __m128i a1, __m128i a2, __m128i a3, __m128i a4, __m128i a5, __m128i a6,
              __m128i a7, uint8_t *dst, uint64_t plane, unsigned planes) {
    __m128i b0, b1, b2, b3, b4, b5, b6, b7;
    ZIP(b0, b4, a0, a4); ZIP(b1, b5, a1, a5); ZIP(b2, b6, a2, a6); ZIP(b3, b7, a3, a7);
    ZIP(a0, a2, b0, b2); ZIP(a1, a3, b1, b3); ZIP(a4, a6, b4, b6); ZIP(a5, a7, b5, b7);
    ZIP(b0, b1, a0, a1); ZIP(b2, b3, a2, a3); ZIP(b4, b5, a4, a5); ZIP(b6, b7, a6, a7);
    ZIP(a0, a4, b0, b4); ZIP(a1, a5, b1, b5); ZIP(a2, a6, b2, b6); ZIP(a3, a7, b3, b7);
    STORE(dst + 0 * plane, a0);
    if (planes > 1) STORE(dst + 1 * plane, a4);
    if (planes > 2) STORE(dst + 2 * plane, a1);
    if (planes > 3) STORE(dst + 3 * plane, a5);
    if (planes > 4) STORE(dst + 4 * plane, a2);
    if (planes > 5) STORE(dst + 5 * plane, a6);
    if (planes > 6) STORE(dst + 6 * plane, a3);
    if (planes > 7) STORE(dst + 7 * plane, a7);
}

/* 16 u32 values (a0 = values 0..3, ...) -> 16 bytes in each of 4 planes: register r, byte p hold
 * value 4r + p/4, byte p%4; rounds on bits 2, 1, 2, 1 leave byte k of values 0..15 in register k. */
static inline __attribute__((always_inline)) void
transpose16x4(__m128i a0, __m128i a1, __m128i a2, __m128i a3, uint8_t *dst, uint64_t plane,
              unsigned planes) {
    __m128i b0, b1, b2, b3;
    ZIP(b0, b2, a0, a2); ZIP(b1, b3, a1, a3);
    ZIP(a0, a1, b0, b1); ZIP(a2, a3, b2, b3);
    ZIP(b0, b2, a0, a2); ZIP(b1, b3, a1, a3);
    ZIP(a0, a1, b0, b1); ZIP(a2, a3, b2, b3);
    STORE(dst + 0 * plane, a0);
    if (planes > 1) STORE(dst + 1 * plane, a1);
    if (planes > 2) STORE(dst + 2 * plane, a2);
    if (planes > 3) STORE(dst + 3 * plane, a3);
}

static inline __m128i load2(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }

/* The u64 values of rows at p and p + s. */
static inline __m128i load2s(const uint8_t *p, int64_t s) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p),
                              _mm_loadl_epi64((const __m128i *)(p + s)));
}

static inline __m128i load1_32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtsi32_si128(v);
}

/* The u32 values of rows at p, p + s, p + 2s, p + 3s. */
static inline __m128i load4s_32(const uint8_t *p, int64_t s) {
    return _mm_unpacklo_epi64(_mm_unpacklo_epi32(load1_32(p), load1_32(p + s)),
                              _mm_unpacklo_epi32(load1_32(p + 2 * s), load1_32(p + 3 * s)));
}

/* The values before those of v: (high of before, low of v). */
static inline __m128i previous(__m128i before, __m128i v) {
    return _mm_castpd_si128(_mm_shuffle_pd(_mm_castsi128_pd(before), _mm_castsi128_pd(v), 1));
}

/* The OR of the two u64 lanes. */
static inline uint64_t or_lanes(__m128i v) {
    uint64_t t[2];
    _mm_storeu_si128((__m128i *)t, v);
    return t[0] | t[1];
}

static inline __m128i or4(__m128i a, __m128i b, __m128i c, __m128i d) {
    return _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d));
}

static inline __m128i zigzag2(__m128i d) {
    __m128i sign = _mm_srai_epi32(_mm_shuffle_epi32(d, _MM_SHUFFLE(3, 3, 1, 1)), 31);
    return _mm_xor_si128(_mm_slli_epi64(d, 1), sign);
}

/* Whether rows of this column go through simd_rows. */
static int simd_column(const hc_column *c, const colstate *s) {
    if (s->encoding == PLAIN) return c->itemsize == 8 || c->itemsize == 4;
    return (s->encoding == DELTA || s->encoding == ZIGZAG_DELTA) && c->itemsize == 8;
}

#define LOAD8(L)                                                                            \
    (v0 = L(p), v1 = L(p + 2 * st), v2 = L(p + 4 * st), v3 = L(p + 6 * st),                 \
     v4 = L(p + 8 * st), v5 = L(p + 10 * st), v6 = L(p + 12 * st), v7 = L(p + 14 * st))
#define LOAD2S(q) load2s(q, st)
#define LOAD4S(q) load4s_32(q, st)

/* Rows lo .. hi-1 (hi - lo a multiple of 16) of a simd_column. */
static void simd_rows(const hc_column *c, colstate *s, uint64_t lo, uint64_t hi, uint8_t *out,
                      uint64_t n) {
    const int64_t st = c->stride;
    __m128i v0, v1, v2, v3, v4, v5, v6, v7, acc = _mm_setzero_si128();
    if (s->encoding == PLAIN && c->itemsize == 4) {
        for (uint64_t i = lo; i < hi; i += 16) {
            const uint8_t *p = row(c, i);
            if (st == 4) v0 = load2(p), v1 = load2(p + 16), v2 = load2(p + 32), v3 = load2(p + 48);
            else v0 = LOAD4S(p), v1 = LOAD4S(p + 4 * st), v2 = LOAD4S(p + 8 * st), v3 = LOAD4S(p + 12 * st);
            acc = _mm_or_si128(acc, or4(v0, v1, v2, v3));
            transpose16x4(v0, v1, v2, v3, out + i, n, s->planes);
        }
        uint64_t o = or_lanes(acc);
        s->ored |= (o | o >> 32) & 0xffffffffu;
        return;
    }
    __m128i carry = _mm_set_epi64x((int64_t)s->prev, 0);   /* high: the value before row lo */
    for (uint64_t i = lo; i < hi; i += 16) {
        const uint8_t *p = row(c, i);
        if (st == 8) LOAD8(load2);
        else LOAD8(LOAD2S);
        if (s->encoding != PLAIN) {
            __m128i last = v7;
            v7 = _mm_sub_epi64(v7, previous(v6, v7));
            v6 = _mm_sub_epi64(v6, previous(v5, v6));
            v5 = _mm_sub_epi64(v5, previous(v4, v5));
            v4 = _mm_sub_epi64(v4, previous(v3, v4));
            v3 = _mm_sub_epi64(v3, previous(v2, v3));
            v2 = _mm_sub_epi64(v2, previous(v1, v2));
            v1 = _mm_sub_epi64(v1, previous(v0, v1));
            v0 = _mm_sub_epi64(v0, previous(carry, v0));
            carry = last;
            if (s->encoding == ZIGZAG_DELTA) {
                v0 = zigzag2(v0); v1 = zigzag2(v1); v2 = zigzag2(v2); v3 = zigzag2(v3);
                v4 = zigzag2(v4); v5 = zigzag2(v5); v6 = zigzag2(v6); v7 = zigzag2(v7);
            }
        }
        acc = _mm_or_si128(acc, _mm_or_si128(or4(v0, v1, v2, v3), or4(v4, v5, v6, v7)));
        transpose16x8(v0, v1, v2, v3, v4, v5, v6, v7, out + i, n, s->planes);
    }
    s->ored |= or_lanes(acc);
    uint64_t tail[2];
    _mm_storeu_si128((__m128i *)tail, carry);
    s->prev = tail[1];
}

/* 16 staged u64 values -> 16 bytes in each of the low `planes` of 8 planes. */
static inline void put16x8(const uint64_t *t, uint8_t *dst, uint64_t plane, unsigned planes) {
    const uint8_t *p = (const uint8_t *)t;
    transpose16x8(load2(p), load2(p + 16), load2(p + 32), load2(p + 48), load2(p + 64),
                  load2(p + 80), load2(p + 96), load2(p + 112), dst, plane, planes);
}

static inline void put16x4(const uint32_t *t, uint8_t *dst, uint64_t plane, unsigned planes) {
    const uint8_t *p = (const uint8_t *)t;
    transpose16x4(load2(p), load2(p + 16), load2(p + 32), load2(p + 48), dst, plane, planes);
}
#else
static int simd_column(const hc_column *c, const colstate *s) { (void)c; (void)s; return 0; }

static void simd_rows(const hc_column *c, colstate *s, uint64_t lo, uint64_t hi, uint8_t *out,
                      uint64_t n) {
    (void)c; (void)s; (void)lo; (void)hi; (void)out; (void)n;
}

static inline void put16x8(const uint64_t *t, uint8_t *dst, uint64_t plane, unsigned planes) {
    put_scalar(t, 16, 8, dst, plane, planes);
}

static inline void put16x4(const uint32_t *t, uint8_t *dst, uint64_t plane, unsigned planes) {
    for (unsigned k = 0; k < 4 && k < planes; k++)
        for (unsigned j = 0; j < 16; j++) dst[k * plane + j] = (uint8_t)(t[j] >> (8 * k));
}
#endif

/* cnt (<= CHUNK) staged u64 values as the low `planes` of 8 byte planes of length `plane`,
 * starting at dst. */
static void put64(const uint64_t *t, unsigned cnt, uint8_t *dst, uint64_t plane, unsigned planes) {
    unsigned j = 0;
    for (; j + 16 <= cnt; j += 16) put16x8(t + j, dst + j, plane, planes);
    if (j < cnt) put_scalar(t + j, cnt - j, 8, dst + j, plane, planes);
}

static inline uint64_t or_of(const uint64_t *t, unsigned cnt) {
    uint64_t o = 0;
    for (unsigned j = 0; j < cnt; j++) o |= t[j];
    return o;
}

/* NONZERO_DELTA of t[0..cnt) in place. A difference of exactly 2**63 between non-zero values
 * would be stored as zigzag + 1 = 2**64 = 0, which reads back as a zero value: the format cannot
 * hold it, so the caller notices (*wrapped) and stores the column as DELTA instead. */
static inline uint64_t nonzero_delta(uint64_t *t, unsigned cnt, uint64_t prev, uint8_t *wrapped) {
    uint64_t w = 0;
    for (unsigned j = 0; j < cnt; j++) {   /* branch-free: zeros come at random */
        uint64_t v = t[j], keep = -(uint64_t)(v != 0);
        uint64_t z = zigzag(v - prev) + 1;
        w |= keep & (z == 0);
        t[j] = z & keep;
        prev = (v & keep) | (prev & ~keep);
    }
    *wrapped |= w != 0;
    return prev;
}

/* The other columns' rows go through two steps per chunk: stage() reads and transforms them into
 * one of the column's two buffers, flush() transposes them into the planes. A chunk is flushed
 * after the next one is staged: by then its stores into the buffer have reached the cache, while
 * a 16-byte load right after the 8-byte stores it spans would wait for them (no store-to-load
 * forwarding), which doubled the time. */
static void stage(const hc_column *c, colstate *s, uint64_t i, unsigned cnt) {
    unsigned b = s->cur;
    s->staged[b] = i;
    s->nstaged[b] = cnt;
    if (s->encoding == PLAIN && c->itemsize == 4) {
        const uint8_t *p = row(c, i);
        uint32_t *u = s->buf[b].u32, o = 0;
        for (unsigned j = 0; j < cnt; j++) memcpy(&u[j], p + (int64_t)j * c->stride, 4);
        for (unsigned j = 0; j < cnt; j++) o |= u[j];
        s->ored |= o;
        return;
    }
    uint64_t *t = s->buf[b].u64;
    gather64(c, i, cnt, t);
    uint64_t prev = s->prev;
    switch (s->encoding) {
    case PLAIN:
        break;
    case DELTA:
        for (unsigned j = 0; j < cnt; j++) { uint64_t v = t[j]; t[j] = v - prev; prev = v; }
        break;
    case ZIGZAG_DELTA:
        for (unsigned j = 0; j < cnt; j++) { uint64_t v = t[j]; t[j] = zigzag(v - prev); prev = v; }
        break;
    default: /* NONZERO_DELTA */
        prev = nonzero_delta(t, cnt, prev, &s->wrapped);
        break;
    }
    s->prev = prev;
    s->ored |= or_of(t, cnt);
}

static void flush(const hc_column *c, colstate *s, unsigned b, uint8_t *out, uint64_t n) {
    unsigned cnt = s->nstaged[b];
    s->nstaged[b] = 0;
    if (!cnt) return;   /* (staged[b] is not set then: no pointer from it) */
    uint8_t *dst = out + s->staged[b];
    if (s->encoding != PLAIN || c->itemsize == 8) {
        put64(s->buf[b].u64, cnt, dst, n, s->planes);
    } else if (c->itemsize == 4) {
        const uint32_t *u = s->buf[b].u32;
        unsigned j = 0;
        for (; j + 16 <= cnt; j += 16) put16x4(u + j, dst + j, n, s->planes);
        for (; j < cnt; j++)
            for (unsigned k = 0; k < 4 && k < s->planes; k++)
                dst[k * n + j] = (uint8_t)(u[j] >> (8 * k));
    } else {
        put_scalar(s->buf[b].u64, cnt, c->itemsize, dst, n, s->planes);
    }
}

/* Rows lo .. hi-1 of a column (out: its first data byte). Staged rows may be left for
 * finish_column. */
static void encode_rows(const hc_column *c, colstate *s, uint64_t lo, uint64_t hi, uint8_t *out,
                        uint64_t n) {
    if (s->encoding == PLAIN && c->itemsize == 1) {   /* one plane: the values themselves */
        const uint8_t *p = row(c, lo);
        uint64_t o = 0, w, j = lo;
        if (c->stride == 1) memcpy(out + lo, p, hi - lo);
        else for (uint64_t k = 0; k < hi - lo; k++) out[lo + k] = p[(int64_t)k * c->stride];
        for (; j + 8 <= hi; j += 8) { memcpy(&w, out + j, 8); o |= w; }   /* 8 rows at once */
        for (; j < hi; j++) o |= out[j];
        s->ored |= o != 0;
        return;
    }
    if (simd_column(c, s)) {
        uint64_t end = lo + ((hi - lo) & ~(uint64_t)15);
        simd_rows(c, s, lo, end, out, n);
        lo = end;   /* the last rows of the block, fewer than 16, are staged */
    }
    for (uint64_t i = lo; i < hi; i += CHUNK) {
        stage(c, s, i, hi - i < CHUNK ? (unsigned)(hi - i) : CHUNK);
        s->cur ^= 1;
        flush(c, s, s->cur, out, n);
    }
}

static void encode_column(const hc_column *c, colstate *s, uint8_t *out, uint64_t n);

/* The column's last staged rows; a NONZERO_DELTA column that met a difference it cannot hold
 * (see nonzero_delta) is encoded again, whole, as DELTA. */
static void finish_column(const hc_column *c, colstate *s, uint8_t *out, uint64_t n) {
    flush(c, s, s->cur ^ 1, out, n);
    if (s->wrapped && s->encoding == NONZERO_DELTA) {
        s->encoding = DELTA;
        encode_column(c, s, out, n);
    }
}

static void reset(colstate *s) {
    s->prev = s->ored = s->wrapped = s->cur = 0;
    s->nstaged[0] = s->nstaged[1] = 0;
}

/* A whole column (out: its first data byte). */
static void encode_column(const hc_column *c, colstate *s, uint8_t *out, uint64_t n) {
    reset(s);
    encode_rows(c, s, 0, n, out, n);
    finish_column(c, s, out, n);
}

static int planes_fit(const colstate *s);
static void all_planes(const hc_column *c, colstate *s);

/* Ends a column written with s->planes planes: encoded again, whole, with every plane when its
 * values needed more (see "planes written"). */
static void check_planes(const hc_column *c, colstate *s, uint8_t *out, uint64_t n) {
    if (planes_fit(s)) return;
    all_planes(c, s);
    encode_column(c, s, out, n);
}

/* ---- back-references: an open-addressing table from address to the latest row producing it ----
 *
 * The table's memory is kept from one block to the next: a block of 2^20 events of a Python
 * program holds about half a million distinct addresses, and a fresh table per block cost more
 * than the encoding itself (the kernel zeroing up to 32 MB of new pages, very slowly in a virtual
 * machine, and a rehash at every doubling). A call takes a store from a small process-wide pool
 * (blocks are encoded on the threads that decode them: the converter's while the program runs,
 * then the main thread's, or several of a user's) and gives it back. A slot is empty unless it
 * carries the epoch of the table in use, so a table is cleared by taking a new epoch, and it
 * starts at the size its store's previous table ended with. */

/* One address (0 is never stored) and the latest rows where each column of a partner pair held
 * it, in 16 bytes: `meta` holds the table's epoch (bits 56-63) and, per column k, 1 + that row
 * (28 bits from bit 28k; 0: none yet; hc_encode_events takes fewer than 2^28 rows). Both address
 * columns are encoded in one pass over one table (encode_backrefs): a row looks its two values
 * up where a pass per column did it twice per row in each pass. (A slot of 24 bytes, with the
 * rows and epoch in words of their own, made a Python program's table half again larger: the
 * whole conversion of py_dicts' raw file took 1.08x as long as with a table per column.) */
typedef struct { uint64_t key, meta; } slot;
_Static_assert((UINT32_MAX / 16) < (1u << 28), "a row + 1 fits 28 bits");

#define ROW_BITS 28
#define ROW_MASK (((uint64_t)1 << ROW_BITS) - 1)
#define EPOCH_SHIFT 56

static inline unsigned slot_epoch(const slot *s) { return (unsigned)(s->meta >> EPOCH_SHIFT); }
static inline uint64_t slot_row(const slot *s, int k) { return s->meta >> (ROW_BITS * k) & ROW_MASK; }

/* Table memory: two buffers (a growth rehashes from one into the other), and the escape lists. */
typedef struct {
    slot *mem[2];
    size_t bytes[2];
    uint32_t epoch;     /* the last epoch taken (1-255); fresh memory (zeros) holds epoch 0 */
    uint64_t last_cap;  /* the capacity its previous table ended with */
    uint64_t *esc;      /* room for 2 * esc_cap escapes (malloc), kept like the table */
    uint64_t esc_cap;
    uint8_t *scratch;   /* a pair's second column, written whole (mmap), kept likewise */
    size_t scratch_bytes;
} table_store;

typedef struct {
    slot *s;
    uint64_t cap, used, max_cap;
    unsigned shift;
    uint32_t epoch;
    int buf;            /* which of the store's buffers holds s (a growth takes the other) */
    table_store *st;
} table;

#define STORES 4        /* more concurrent calls than this get a store of their own */
static table_store stores[STORES];
static int store_busy[STORES];
static pthread_mutex_t stores_lock = PTHREAD_MUTEX_INITIALIZER;

static void store_release(table_store *st) {
    for (int b = 0; b < 2; b++)
        if (st->mem[b]) munmap(st->mem[b], st->bytes[b]);
    free(st->esc);
    if (st->scratch) munmap(st->scratch, st->scratch_bytes);
    memset(st, 0, sizeof *st);
}

/* Room for two escape lists of n values each in the store (the previous room if large enough). */
static uint64_t *store_escapes(table_store *st, uint64_t n) {
    if (st->esc_cap >= n && st->esc) return st->esc;
    free(st->esc);
    st->esc_cap = 0;
    st->esc = malloc(2 * (n ? n : 1) * sizeof *st->esc);
    if (st->esc) st->esc_cap = n;
    return st->esc;
}

/* A store for one call: a free one of the pool, else `own` (released by store_put). */
static table_store *store_get(table_store *own) {
    pthread_mutex_lock(&stores_lock);
    for (int k = 0; k < STORES; k++)
        if (!store_busy[k]) {
            store_busy[k] = 1;
            pthread_mutex_unlock(&stores_lock);
            return &stores[k];
        }
    pthread_mutex_unlock(&stores_lock);
    memset(own, 0, sizeof *own);
    return own;
}

static void store_put(table_store *st) {
    if (st < stores || st >= stores + STORES) {
        store_release(st);
        return;
    }
    pthread_mutex_lock(&stores_lock);
    store_busy[st - stores] = 0;
    pthread_mutex_unlock(&stores_lock);
}

/* Memory of at least *len bytes, rounded up to huge pages (*len: the length mapped), or NULL. */
static void *map_huge(size_t *len) {
    const size_t huge = 2u << 20;
    *len = (*len + huge - 1) & ~(huge - 1);
    void *p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    /* a table is accessed at random: on huge pages, that costs no TLB misses (page walks, slow
     * in a virtual machine); a hint, without it small pages */
    madvise(p, *len, MADV_HUGEPAGE);
#endif
    return p;
}

/* Buffer b of a store, holding at least cap slots (new memory if it was smaller). */
static slot *store_buffer(table_store *st, int b, uint64_t cap) {
    size_t need = cap * sizeof(slot);
    if (st->bytes[b] >= need) return st->mem[b];
    if (st->mem[b]) munmap(st->mem[b], st->bytes[b]);
    st->mem[b] = map_huge(&need);
    st->bytes[b] = st->mem[b] ? need : 0;
    return st->mem[b];
}

/* Room for `bytes` of a column in the store (the previous room if large enough). */
static uint8_t *store_scratch(table_store *st, size_t bytes) {
    if (st->scratch_bytes >= bytes && st->scratch) return st->scratch;
    if (st->scratch) munmap(st->scratch, st->scratch_bytes);
    bytes = bytes ? bytes : 1;
    st->scratch = map_huge(&bytes);
    st->scratch_bytes = st->scratch ? bytes : 0;
    return st->scratch;
}

static inline uint64_t slot_of(const table *tb, uint64_t key) {
    /* The top bits of a multiplication, after folding the high bits in: heap addresses (a dense
     * range of aligned values) spread over the slots with few collisions, fewer than with a
     * plain Fibonacci multiplication. */
    return ((key ^ (key >> 33)) * 0xff51afd7ed558ccdull) >> tb->shift;
}

/* A new, empty table of cap slots in buffer b of store st. */
static int table_init(table *tb, table_store *st, int b, uint64_t cap, uint64_t max_cap) {
    tb->s = store_buffer(st, b, cap);
    if (!tb->s) return ERR_NOMEM;
    st->epoch = (st->epoch + 1) & 0xFF;   /* 8 bits in a slot */
    if (st->epoch == 0) {   /* epochs wrapped (every 255 tables): empty both buffers for real */
        for (int k = 0; k < 2; k++)
            if (st->mem[k]) memset(st->mem[k], 0, st->bytes[k]);
        st->epoch = 1;
    }
    tb->st = st;
    tb->epoch = st->epoch;
    tb->buf = b;
    tb->cap = cap;
    tb->used = 0;
    tb->max_cap = max_cap;
    tb->shift = 64 - (unsigned)__builtin_ctzll(cap);
    return 0;
}

/* Doubles the table (at most to max_cap, which holds a whole block at load 1/2). */
static int table_grow(table *tb) {
    table big;
    if (table_init(&big, tb->st, !tb->buf, tb->cap * 2, tb->max_cap)) return ERR_NOMEM;
    for (uint64_t k = 0; k < tb->cap; k++) {
        if (slot_epoch(&tb->s[k]) != tb->epoch) continue;
        uint64_t h = slot_of(&big, tb->s[k].key);
        while (slot_epoch(&big.s[h]) == big.epoch) h = (h + 1) & (big.cap - 1);
        big.s[h].key = tb->s[k].key;
        big.s[h].meta = (tb->s[k].meta & ~((uint64_t)0xFF << EPOCH_SHIFT)) |
                        (uint64_t)big.epoch << EPOCH_SHIFT;
    }
    big.used = tb->used;
    *tb = big;
    return 0;
}

#define PREFETCH_CAP (1u << 16)   /* slots (1 MiB): a smaller table stays in the cache */

static inline void table_prefetch(const table *tb, uint64_t key) {
    __builtin_prefetch(&tb->s[slot_of(tb, key)]);
}

/* The slot holding `key`, or NULL. */
static inline const slot *table_find(const table *tb, uint64_t key) {
    for (uint64_t h = slot_of(tb, key);; h = (h + 1) & (tb->cap - 1)) {
        if (slot_epoch(&tb->s[h]) != tb->epoch) return NULL;
        if (tb->s[h].key == key) return &tb->s[h];
    }
}

/* Notes that column k held `key` at row r. */
static inline int table_put(table *tb, uint64_t key, int k, uint64_t r) {
    uint64_t h = slot_of(tb, key);
    const unsigned shift = ROW_BITS * k;
    for (;; h = (h + 1) & (tb->cap - 1)) {
        if (slot_epoch(&tb->s[h]) != tb->epoch) break;
        if (tb->s[h].key == key) {
            tb->s[h].meta = (tb->s[h].meta & ~(ROW_MASK << shift)) | (r + 1) << shift;
            return 0;
        }
    }
    tb->s[h].key = key;
    tb->s[h].meta = (uint64_t)tb->epoch << EPOCH_SHIFT | (r + 1) << shift;
    if (++tb->used * 2 > tb->cap && tb->cap < tb->max_cap) return table_grow(tb);
    return 0;
}

/* The code of value v at row r: r - src + 1 where src is the latest earlier row whose partner
 * held v (in `found`'s row[k]), else 1 and v is an escape. */
static inline uint64_t backref_code(const slot *found, int k, uint64_t v, uint64_t r,
                                    uint64_t *esc, uint64_t *m) {
    uint64_t row = found ? slot_row(found, k) : 0;
    if (row) return r - row + 2;
    esc[(*m)++] = v;
    return 1;
}

/* A BACKREF column's escapes (after its codes, which encode_backrefs wrote) as NONZERO_DELTA,
 * its length and ORs; when they cannot be stored that way, the whole column as DELTA instead. */
static void backref_close(const hc_column *c, colstate *s, uint8_t *out, uint64_t n,
                          const uint64_t *esc, uint64_t m, uint64_t codes_or) {
    uint64_t t[2][CHUNK], prev = 0, esc_or = 0;
    uint8_t wrapped = 0;
    int cur = 0;
    for (uint64_t i = 0; i < m; i += CHUNK, cur ^= 1) {
        unsigned cnt = m - i < CHUNK ? (unsigned)(m - i) : CHUNK;
        memcpy(t[cur], esc + i, cnt * sizeof *esc);
        prev = nonzero_delta(t[cur], cnt, prev, &wrapped);
        esc_or |= or_of(t[cur], cnt);
        if (i) put64(t[!cur], CHUNK, out + 8 * n + i - CHUNK, m, 8);
        if (i + CHUNK >= m) put64(t[cur], cnt, out + 8 * n + i, m, 8);
    }
    s->len = 8 * n + 8 * m;
    s->escapes = m;
    s->ored = codes_or;
    s->esc_ored = esc_or;
    if (wrapped) {
        s->encoding = DELTA;
        s->len = 8 * n;
        encode_column(c, s, out, n);
    }
}

/* Encodes BACKREF columns at their first data bytes: the codes as 8 planes of n bytes, then the
 * escapes (backref_close). With `both`, c[0] and c[1] are partners, each encoded (at out[0],
 * out[1]) by reference to the other; else c[0] alone (out[0]) by reference to c[1]. A release
 * comes before its own row's acquisition, so a row's values are looked up before the row's are
 * noted. */
static int encode_backrefs(table_store *st, const hc_column *c[2], colstate *s[2],
                           uint8_t *out[2], uint64_t n, int both) {
    uint64_t max_cap = 16;
    while (max_cap < 2 * n) max_cap *= 2;
    /* Starts as large as the store's previous block needed (a program's blocks are alike),
     * small for its first: blocks hold far fewer distinct addresses than rows. */
    uint64_t cap = st->last_cap > 4096 ? st->last_cap : 4096;
    table tb;
    uint64_t *esc = store_escapes(st, n);
    if (!esc || table_init(&tb, st, 0, cap < max_cap ? cap : max_cap, max_cap))
        return ERR_NOMEM;
    uint64_t *escs[2] = {esc, esc + n}, m[2] = {0, 0}, codes_or[2] = {0, 0};
    uint64_t t[2][2][CHUNK], v[2][CHUNK];   /* t[column][buffer]: see stage() */
    int rc = 0, cur = 0;
    for (uint64_t i = 0; i < n && !rc; i += CHUNK, cur ^= 1) {
        unsigned cnt = n - i < CHUNK ? (unsigned)(n - i) : CHUNK;
        const uint64_t *va = values64(c[0], i, cnt, v[0]), *vb = values64(c[1], i, cnt, v[1]);
        if (tb.cap > PREFETCH_CAP)   /* a table beyond the caches: the chunk's misses overlap */
            for (unsigned j = 0; j < cnt; j++) {
                if (va[j]) table_prefetch(&tb, va[j]);
                if (vb[j]) table_prefetch(&tb, vb[j]);
            }
        for (unsigned j = 0; j < cnt; j++) {
            uint64_t r = i + j, a = va[j], b = vb[j], ca = 0, cb = 0;
            if (a) ca = backref_code(table_find(&tb, a), 1, a, r, escs[0], &m[0]);
            if (both && b) cb = backref_code(table_find(&tb, b), 0, b, r, escs[1], &m[1]);
            t[0][cur][j] = ca;
            t[1][cur][j] = cb;
            codes_or[0] |= ca;
            codes_or[1] |= cb;
            if (b && (rc = table_put(&tb, b, 1, r))) break;
            if (both && a && (rc = table_put(&tb, a, 0, r))) break;
        }
        for (int k = 0; k <= both; k++) {
            if (i) put64(t[k][!cur], CHUNK, out[k] + i - CHUNK, n, s[k]->planes);
            if (i + CHUNK >= n) put64(t[k][cur], cnt, out[k] + i, n, s[k]->planes);
        }
    }
    st->last_cap = tb.cap;
    if (!rc)
        for (int k = 0; k <= both; k++)
            backref_close(c[k], s[k], out[k], n, escs[k], m[k], codes_or[k]);
    return rc;
}

static int valid(const hc_column *cols, uint32_t ncols) {
    if (ncols > MAX_COLUMNS || (ncols && !cols)) return 0;
    for (uint32_t c = 0; c < ncols; c++) {
        unsigned size = cols[c].itemsize;
        if (cols[c].encoding > BACKREF || !(size == 1 || size == 2 || size == 4 || size == 8))
            return 0;
        if (cols[c].encoding == BACKREF &&
            (cols[c].ref < 0 || (uint32_t)cols[c].ref >= ncols || (uint32_t)cols[c].ref == c))
            return 0;
    }
    return 1;
}

/* Bytes of output that hc_encode_events may need (every plane and escape stored: it writes
 * them all before it leaves the zero planes out, and a column's presence bits beyond the
 * payload before it makes the column sparse); 0 for invalid columns. */
HC_API uint64_t hc_encode_bound(const hc_column *cols, uint32_t ncols, uint64_t n) {
    if (!valid(cols, ncols)) return 0;
    uint64_t total = 0;
    for (uint32_t c = 0; c < ncols; c++) {
        uint64_t width = cols[c].encoding == PLAIN ? cols[c].itemsize
                       : cols[c].encoding == BACKREF ? 16 : 8;
        total += 8 + width * n;
    }
    return total + SPARSE_ROOM(n);
}

/* ---- planes written
 *
 * Most planes of a column are zero, and the same ones block after block of one stream of
 * events (deltas of 1, sizes under 2^24, codes of recent rows...). With a hint from the caller
 * (hc_encode_events' `hint`: per column, the most planes a block of the same stream needed so
 * far; any value gives the same bytes), a column is written with only those low planes, the
 * planes above left unwritten: the encoder writes ~14 bytes per row instead of 62, and touches
 * fewer fresh pages of its output. A block whose values need a plane that was not written (the
 * column's OR shows it) has that column encoded again with every plane. The hint belongs to
 * the stream (a trace writer's process file): one process-wide hint had each process's first
 * blocks mispredicted by the process before (1.15-1.25x the encoding time of every plane on
 * g++, gcc-b and sqlite3, the corpus encoded in one process). */

static unsigned width_of(const hc_column *c, const colstate *s) {
    return s->encoding == PLAIN ? c->itemsize : 8;
}

static void predict_planes(const hc_column *c, colstate *s) {
    unsigned w = width_of(c, s), p = s->seen ? *s->seen : 0;
    s->planes = (uint8_t)(p && p < w ? p : w);
}

/* Whether the column's values (their OR) fit the planes written; raises the hint to the planes
 * they needed (at least 1), for the stream's next blocks. The hint only grows: a block that
 * needs fewer planes than an earlier one is written with a few zero planes (cheap), where
 * following each block's need made the address codes of py_dicts (1 to 3 planes from block to
 * block) redo their back-reference pass every few blocks: 1.10x its encoding time. So a
 * column is encoded twice at most width - 1 times per stream. */
static int planes_fit(const colstate *s) {
    unsigned need = s->ored ? (unsigned)(64 - __builtin_clzll(s->ored) + 7) / 8 : 1;
    if (s->seen && need > *s->seen) *s->seen = (uint8_t)need;
    return need <= s->planes;
}

/* For the encoding again of a column whose values did not fit: every plane. */
static void all_planes(const hc_column *c, colstate *s) {
    s->encoding = c->encoding;
    s->planes = 8;
}

/* The planes (bit k: plane k of `width`) whose byte of `ored` is zero. */
static unsigned zero_planes(uint64_t ored, unsigned width) {
    unsigned mask = 0;
    for (unsigned k = 0; k < width; k++)
        if (!(ored >> (8 * k) & 0xff)) mask |= 1u << k;
    return mask;
}

/* Moves the `width` planes of cnt bytes at src but those in `omit` to dst, in order (dst <= src:
 * a plane never lands on one not yet moved). Returns the bytes kept. */
static uint64_t keep_planes(uint8_t *dst, const uint8_t *src, unsigned width, uint64_t cnt,
                            unsigned omit) {
    uint64_t kept = 0;
    for (unsigned k = 0; k < width; k++)
        if (!(omit >> k & 1)) {
            if (dst + kept != src + k * cnt) memmove(dst + kept, src + k * cnt, cnt);
            kept += cnt;
        }
    return kept;
}

/* Writes a column's header at out + off and its planes after it, but the zero ones (the mask of
 * the header: bit k plane k; for BACKREF, bits 8 + k the escapes' planes), moving them from src,
 * where the column was written whole (out + s->header + 8, off <= s->header, or elsewhere).
 * Returns the bytes of header and planes. */
static uint64_t close_from(const hc_column *c, const colstate *s, const uint8_t *src,
                           uint8_t *out, uint64_t off, uint64_t n) {
    uint8_t *dst = out + off + 8;
    unsigned width = s->encoding == PLAIN ? c->itemsize : 8;
    unsigned omit = zero_planes(s->ored, width);
    uint64_t len = keep_planes(dst, src, width, n, omit);
    if (s->encoding == BACKREF) {
        unsigned esc = zero_planes(s->esc_ored, 8);
        len += keep_planes(dst + len, src + 8 * n, 8, s->escapes, esc);
        omit |= esc << 8;
    }
    uint16_t mask = (uint16_t)omit;
    uint32_t len32 = (uint32_t)len;
    out[off] = c->field;
    out[off + 1] = s->encoding;
    memcpy(out + off + 2, &mask, 2);
    memcpy(out + off + 4, &len32, 4);
    return 8 + len;
}

static uint64_t close_column(const hc_column *c, const colstate *s, uint8_t *out, uint64_t off,
                             uint64_t n) {
    return close_from(c, s, out + s->header + 8, out, off, n);
}

/* Whether every column's rows lie side by side (one array per column, as `heapcast record`'s
 * converter gives them), rather than fields of wider rows. */
static int contiguous(const hc_column *cols, uint32_t ncols) {
    for (uint32_t c = 0; c < ncols; c++)
        if (cols[c].stride != cols[c].itemsize) return 0;
    return 1;
}

/* Whether column c and the next are BACKREF partners of each other (addr and old_addr, in the
 * format's column order): encoded together (encode_backrefs). */
static int pair_at(const hc_column *cols, uint32_t ncols, uint32_t c) {
    return c + 1 < ncols && cols[c].encoding == BACKREF && cols[c + 1].encoding == BACKREF &&
           cols[c].ref == (int32_t)(c + 1) && cols[c + 1].ref == (int32_t)c;
}

/* Starts column c at offset off of out: its state, and a BACKREF column encoded whole (its
 * escapes decide its length). A pair (pair_at) is encoded at once, the second column into the
 * table store's scratch memory (kept between calls, so that the output buffer is touched no
 * further than by one whole column: fresh pages cost more than the copy), then moved into out:
 * with `compact` (the caller closes each column as it goes) both are closed here, the first at
 * off and the second after it, and *closed is their bytes; otherwise the second is copied whole
 * after the first, where the caller's final compaction finds it. Returns the number of columns
 * started (1 or 2), or an error of encode_backrefs. */
static int begin_columns(const hc_column *cols, uint32_t ncols, uint32_t c, colstate *st,
                         uint8_t *out, uint64_t off, uint64_t n, int compact, uint64_t *closed,
                         uint8_t *hint) {
    int two = pair_at(cols, ncols, c);
    *closed = 0;
    for (int k = 0; k <= two; k++) {
        reset(&st[c + k]);
        st[c + k].encoding = cols[c + k].encoding;
        st[c + k].seen = hint ? &hint[c + k] : NULL;
        predict_planes(&cols[c + k], &st[c + k]);
    }
    st[c].header = off;
    if (cols[c].encoding != BACKREF)
        return 1;
    table_store own, *store = store_get(&own);
    uint8_t *scratch = two ? store_scratch(store, 16 * n) : NULL;
    const hc_column *pc[2] = {&cols[c], &cols[two ? c + 1 : (uint32_t)cols[c].ref]};
    colstate *ps[2] = {&st[c], two ? &st[c + 1] : NULL};
    uint8_t *po[2] = {out + off + 8, scratch};
    int rc = two && !scratch ? ERR_NOMEM : encode_backrefs(store, pc, ps, po, n, two);
    if (!rc) {   /* codes that need a plane not written: the pair again, with every plane */
        int fit = planes_fit(ps[0]);
        if (two) fit &= planes_fit(ps[1]);
        if (!fit) {
            for (int k = 0; k <= two; k++) all_planes(pc[k], ps[k]);
            rc = encode_backrefs(store, pc, ps, po, n, two);
        }
    }
    if (!rc && two) {
        if (compact) {
            uint64_t first = close_column(&cols[c], &st[c], out, off, n);
            *closed = first + close_from(&cols[c + 1], &st[c + 1], scratch, out, off + first, n);
        } else {
            st[c + 1].header = off + 8 + st[c].len;
            memcpy(out + st[c + 1].header + 8, scratch, st[c + 1].len);
        }
    }
    store_put(store);
    return rc ? rc : 1 + two;
}

/* ---- sparse columns (format versions 3 and 4)
 *
 * A column whose stored values are zero in most rows (a free has no size and produces no
 * address; half of all time deltas are 0) is stored as a presence bit per row followed by its
 * planes of the non-zero rows only. zstd's match finder is at its slowest on planes like those
 * (a third to a half of the bytes random, the rest zero: ~10 ms per MB, against 0.3 for random
 * bytes), and mostly stores them worse than the dense non-zero bytes.
 *
 * Version 4 stores the presence bits XORed with a prediction from the block's op column: which
 * fields a row has follows mostly from its operation (a free has no size and no new address, an
 * allocation no old address). Each sparse column carries a 16-bit op mask (bit o: rows of op o
 * are predicted present), chosen here as the majority of each op's rows; the bits the mask
 * predicts right are stored as zeros, which zstd stores in almost nothing. Version 3's raw
 * presence bits were what made g++'s traces 2% larger than dense columns: over the corpus
 * and the reference workloads, see bench/sparse_columns.py and docs/trace-format.md. */

#define OP_KINDS 16        /* ops an op mask can predict (the format has 13) */

#ifdef HC_SIMD
/* The SIMD helpers below need SSSE3 (byte shuffle) and POPCNT: checked once at run time, with
 * scalar code for CPUs that lack them. shuffle[b]: the positions of the bits set in b, in
 * order: the SSSE3 shuffle that packs the bytes of the present rows among 8 to the front. */
static uint8_t shuffle[256][8];
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static int has_ssse3;

static void simd_init(void) {
    for (unsigned b = 0; b < 256; b++) {
        unsigned k = 0;
        for (unsigned t = 0; t < 8; t++)
            if (b >> t & 1) shuffle[b][k++] = (uint8_t)t;
    }
    __builtin_cpu_init();
    has_ssse3 = __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("popcnt");
}

static int simd(void) {
    pthread_once(&simd_once, simd_init);
    return has_ssse3;
}
#define SIMD_TARGET __attribute__((target("ssse3,popcnt")))
#endif

/* Presence bits of the rows of `planes` planes of n bytes at src (bit i % 8 of byte i / 8: some
 * plane's byte of row i is non-zero) into bits; returns how many rows are present. Rows from i
 * on, with m found before. */
static uint64_t presence_scalar(const uint8_t *src, unsigned planes, uint64_t n, uint8_t *bits,
                                uint64_t i, uint64_t m) {
    for (; i < n; i++) {
        uint8_t v = 0;
        for (unsigned k = 0; k < planes; k++) v |= src[k * n + i];
        if (v) { bits[i / 8] |= (uint8_t)(1u << (i % 8)); m++; }
    }
    return m;
}

#ifdef HC_SIMD
SIMD_TARGET
static uint64_t presence_simd(const uint8_t *src, unsigned planes, uint64_t n, uint8_t *bits) {
    const __m128i zero = _mm_setzero_si128();
    uint64_t m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(src + i));
        for (unsigned k = 1; k < planes; k++)
            v = _mm_or_si128(v, _mm_loadu_si128((const __m128i *)(src + k * n + i)));
        unsigned b = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) & 0xFFFFu;
        bits[i / 8] = (uint8_t)b;
        bits[i / 8 + 1] = (uint8_t)(b >> 8);
        m += (uint64_t)__builtin_popcount(b);
    }
    return presence_scalar(src, planes, n, bits, i, m);
}
#endif

static uint64_t presence(const uint8_t *src, unsigned planes, uint64_t n, uint8_t *bits) {
    memset(bits, 0, (n + 7) / 8);
#ifdef HC_SIMD
    if (simd()) return presence_simd(src, planes, n, bits);
#endif
    return presence_scalar(src, planes, n, bits, 0, 0);
}

/* How many of the n rows hold each op (ops of OP_KINDS or more are not counted). */
static void count_ops(const uint8_t *op, uint64_t n, uint64_t count[OP_KINDS]) {
    uint32_t part[4][256] = {{0}};   /* four tables: consecutive equal ops do not wait on one
                                        another's store; u32 as a block has < 2^32 rows */
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        part[0][op[i]]++;
        part[1][op[i + 1]]++;
        part[2][op[i + 2]]++;
        part[3][op[i + 3]]++;
    }
    for (; i < n; i++) part[0][op[i]]++;
    for (unsigned o = 0; o < OP_KINDS; o++)
        count[o] = (uint64_t)part[0][o] + part[1][o] + part[2][o] + part[3][o];
}

/* The op mask that predicts the presence bits best: bit o set when most rows of op o are
 * present. count: rows of each op (count_ops). */
static uint16_t op_mask_scalar(const uint8_t *op, const uint8_t *bits, uint64_t n,
                               const uint64_t count[OP_KINDS], uint64_t present[OP_KINDS],
                               uint64_t i) {
    for (; i < n; i++)
        if (op[i] < OP_KINDS) present[op[i]] += bits[i / 8] >> (i % 8) & 1;
    uint16_t mask = 0;
    for (unsigned o = 0; o < OP_KINDS; o++)
        if (2 * present[o] > count[o]) mask |= (uint16_t)(1u << o);
    return mask;
}

#ifdef HC_SIMD
SIMD_TARGET
static uint16_t op_mask_simd(const uint8_t *op, const uint8_t *bits, uint64_t n,
                             const uint64_t count[OP_KINDS]) {
    uint64_t present[OP_KINDS] = {0}, i = 0;
    unsigned ops[OP_KINDS], k = 0;   /* the ops that occur: typically 2 to 5 */
    for (unsigned o = 0; o < OP_KINDS; o++)
        if (count[o]) ops[k++] = o;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(op + i));
        unsigned b = bits[i / 8] | (unsigned)bits[i / 8 + 1] << 8;
        for (unsigned t = 0; t < k; t++) {
            unsigned eq = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8((char)ops[t])));
            present[ops[t]] += (uint64_t)__builtin_popcount(eq & b);
        }
    }
    return op_mask_scalar(op, bits, n, count, present, i);
}
#endif

static uint16_t op_mask(const uint8_t *op, const uint8_t *bits, uint64_t n,
                        const uint64_t count[OP_KINDS]) {
#ifdef HC_SIMD
    if (simd()) return op_mask_simd(op, bits, n, count);
#endif
    uint64_t present[OP_KINDS] = {0};
    return op_mask_scalar(op, bits, n, count, present, 0);
}

/* bits ^= the presence that `mask` predicts from the ops (row i: op[i] < 16 and bit op[i] of
 * mask), rows from i on. */
static void unpredict_scalar(const uint8_t *op, uint16_t mask, uint64_t n, uint8_t *bits,
                             uint64_t i) {
    for (; i < n; i++)
        if (op[i] < OP_KINDS && (mask >> op[i] & 1)) bits[i / 8] ^= (uint8_t)(1u << (i % 8));
}

#ifdef HC_SIMD
SIMD_TARGET
static void unpredict_simd(const uint8_t *op, uint16_t mask, uint64_t n, uint8_t *bits) {
    uint8_t table[16];
    for (unsigned o = 0; o < 16; o++) table[o] = mask >> o & 1 ? 0x80 : 0;
    const __m128i t = _mm_loadu_si128((const __m128i *)table), high = _mm_set1_epi8(0x70);
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* op + 0x70 saturates to 0x80 or more for ops of 16 or more: the shuffle gives 0 there */
        __m128i idx = _mm_adds_epu8(_mm_loadu_si128((const __m128i *)(op + i)), high);
        unsigned p = (unsigned)_mm_movemask_epi8(_mm_shuffle_epi8(t, idx));
        bits[i / 8] ^= (uint8_t)p;
        bits[i / 8 + 1] ^= (uint8_t)(p >> 8);
    }
    unpredict_scalar(op, mask, n, bits, i);
}
#endif

static void unpredict(const uint8_t *op, uint16_t mask, uint64_t n, uint8_t *bits) {
    if (!mask) return;
#ifdef HC_SIMD
    if (simd()) {
        unpredict_simd(op, mask, n, bits);
        return;
    }
#endif
    unpredict_scalar(op, mask, n, bits, 0);
}

/* The bytes of the present rows (bits) of the plane of n bytes at src, in order, to dst (dst <=
 * src: a byte is read before any write reaches it). */
static void keep_present_scalar(uint8_t *dst, const uint8_t *src, const uint8_t *bits,
                                uint64_t n, uint64_t i, uint64_t j) {
    for (; i < n; i++)
        if (bits[i / 8] >> (i % 8) & 1) dst[j++] = src[i];
}

#ifdef HC_SIMD
/* keep_present, 16 rows at a time: each half of 8 bytes packed by one shuffle and stored whole
 * (8 bytes; the ones past the present rows are overwritten next, or land at most 8 bytes past
 * the plane's end: sparsify leaves n - m >= 16 bytes there, whose source was read already). */
SIMD_TARGET
static void keep_present_simd(uint8_t *dst, const uint8_t *src, const uint8_t *bits,
                              uint64_t n) {
    uint64_t i = 0, j = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(src + i));
        unsigned lo = bits[i / 8], hi = bits[i / 8 + 1];
        __m128i a = _mm_shuffle_epi8(v, _mm_loadl_epi64((const __m128i *)shuffle[lo]));
        __m128i b = _mm_shuffle_epi8(_mm_srli_si128(v, 8),
                                     _mm_loadl_epi64((const __m128i *)shuffle[hi]));
        _mm_storel_epi64((__m128i *)(dst + j), a);
        j += (uint64_t)__builtin_popcount(lo);
        _mm_storel_epi64((__m128i *)(dst + j), b);
        j += (uint64_t)__builtin_popcount(hi);
    }
    keep_present_scalar(dst, src, bits, n, i, j);
}
#endif

static void keep_present(uint8_t *dst, const uint8_t *src, const uint8_t *bits, uint64_t n) {
#ifdef HC_SIMD
    if (simd()) {
        keep_present_simd(dst, src, bits, n);
        return;
    }
#endif
    keep_present_scalar(dst, src, bits, n, 0, 0);
}

/* Rewrites the payload of `total` bytes at out (columns of n rows) with every column whose
 * stored values are non-zero in at most 3/4 of the rows sparse: an op mask (u16), the presence
 * bits ((n + 7) / 8 bytes) XORed with what the mask predicts from the column of field index
 * op_field (none: -1, or a column that is not one plane of PLAIN bytes: masks 0), then the
 * planes of the present rows, then (BACKREF) the escapes as before. The op column's own mask
 * is 0. Columns move down over the bytes saved before them. Uses SPARSE_ROOM(n) bytes after
 * the payload (hc_encode_bound counts them): the presence bits, and a copy of the ops (the op
 * column moves too). Returns the new length, or ERR_ARGS if the payload is not columns of n
 * rows (then out is unchanged: a column is checked before anything moves). */
static int64_t sparsify(uint8_t *out, uint64_t total, uint64_t n, int op_field) {
    const uint8_t *ops = NULL;   /* the op column's plane in place; NULL: all ops 0 */
    int have_ops = 0;
    for (uint64_t r = 0; r < total;) {   /* the columns' lengths add up, their planes fit */
        uint16_t mask;
        uint32_t len;
        if (total - r < 8) return ERR_ARGS;
        memcpy(&mask, out + r + 2, 2);
        memcpy(&len, out + r + 4, 4);
        if (len > total - r - 8) return ERR_ARGS;
        if (out[r + 1] == BACKREF ? (8 - (uint64_t)__builtin_popcount(mask & 0xFFu)) * n > len
                                  : (n ? len % n : len) != 0)
            return ERR_ARGS;
        if (op_field >= 0 && out[r] == (unsigned)op_field && out[r + 1] == PLAIN &&
            (len == n || len == 0)) {
            ops = len ? out + r + 8 : NULL;
            have_ops = 1;
        }
        r += 8 + (uint64_t)len;
    }
    if (n < SPARSE_MIN_ROWS) return (int64_t)total;
    const uint64_t nbits = (n + 7) / 8;
    uint8_t *bits = out + total, *opcopy = out + total + nbits + 16;
    uint64_t count[OP_KINDS] = {0};
    if (have_ops) {
        if (ops) memcpy(opcopy, ops, n);
        else memset(opcopy, 0, n);
        count_ops(opcopy, n, count);
    }
    uint64_t r = 0, w = 0;
    while (r < total) {
        uint8_t enc = out[r + 1];
        uint16_t mask;
        uint32_t len;
        memcpy(&mask, out + r + 2, 2);
        memcpy(&len, out + r + 4, 4);
        unsigned planes = enc == BACKREF ? 8 - (unsigned)__builtin_popcount(mask & 0xFFu)
                                         : (unsigned)(len / n);
        uint64_t codes = (uint64_t)planes * n,
                 m = planes ? presence(out + r + 8, planes, n, bits) : n;
        if (!planes || 4 * m > 3 * n) {   /* stays dense: moves down */
            if (w != r) memmove(out + w, out + r, 8 + (uint64_t)len);
        } else {
            const uint8_t *src = out + r + 8;
            uint8_t *dst = out + w + 8;
            uint8_t head[2] = {out[r], (uint8_t)(enc | SPARSE)};
            uint16_t predict = have_ops && out[r] != (unsigned)op_field
                             ? op_mask(opcopy, bits, n, count) : 0;
            for (unsigned k = 0; k < planes; k++) keep_present(dst + k * m, src + k * n, bits, n);
            unpredict(opcopy, predict, n, bits);
            /* m <= 3n/4 and n >= 64: codes - planes * m >= n/4 >= 2 + nbits, so the op mask,
             * the presence bits and the packed planes end before the escapes begin (at
             * src + codes) */
            memmove(dst + 2 + nbits, dst, planes * m);
            memcpy(dst, &predict, 2);
            memcpy(dst + 2, bits, nbits);
            uint64_t kept = 2 + nbits + planes * m;
            if (len > codes) memmove(dst + kept, src + codes, len - codes);   /* escapes */
            uint32_t len32 = (uint32_t)(kept + (len - codes));
            memcpy(out + w, head, 2);
            memcpy(out + w + 2, &mask, 2);
            memcpy(out + w + 4, &len32, 4);
            r += 8 + (uint64_t)len;
            w += 8 + (uint64_t)len32;
            continue;
        }
        r += 8 + (uint64_t)len;
        w += 8 + (uint64_t)len;
    }
    return (int64_t)w;
}

/* Encodes n rows of the columns (in the order given) into out (cap bytes, at least
 * hc_encode_bound). `hint`: NULL, or ncols bytes kept by the caller from one block of a stream to
 * the next (zeros at first), read and updated (see "planes written"). Returns the bytes
 * written, or ERR_ARGS (invalid columns), ERR_SPACE (out too small), ERR_NOMEM, ERR_TOO_LONG (a
 * column over the u32 length of its header). */
HC_API int64_t hc_encode_events(const hc_column *cols, uint32_t ncols, uint64_t n, uint8_t *out,
                                uint64_t cap, uint8_t *hint) {
    if (!valid(cols, ncols) || (!out && cap)) return ERR_ARGS;
    if (n > UINT32_MAX / 16) return ERR_TOO_LONG;   /* 16n bytes must fit the u32 length */
    if (hc_encode_bound(cols, ncols, n) > cap) return ERR_SPACE;
    colstate st[MAX_COLUMNS];
    uint64_t off = 0, closed;
    if (contiguous(cols, ncols)) {
        /* A column at a time, each written whole where it begins in the output: leaving its zero
         * planes out moves only the planes after a zero one, which are few (the zero planes are
         * mostly the high bytes). Tiles would read no less memory here. */
        for (uint32_t c = 0; c < ncols;) {
            int k = begin_columns(cols, ncols, c, st, out, off, n, 1, &closed, hint);
            if (k < 0) return k;
            if (closed) {   /* a pair, closed already */
                off += closed;
                c += (uint32_t)k;
                continue;
            }
            if (cols[c].encoding != BACKREF) {
                encode_column(&cols[c], &st[c], out + off + 8, n);
                check_planes(&cols[c], &st[c], out + off + 8, n);
            }
            off += close_column(&cols[c], &st[c], out, off, n);
            c++;
        }
        return (int64_t)off;
    }
    for (uint32_t c = 0; c < ncols;) {   /* where each column goes; BACKREF ones encoded */
        int k = begin_columns(cols, ncols, c, st, out, off, n, 0, &closed, hint);
        if (k < 0) return k;
        if (cols[c].encoding != BACKREF)
            st[c].len = n * (st[c].encoding == PLAIN ? cols[c].itemsize : 8);
        c += (uint32_t)k;
        off = st[c - 1].header + 8 + st[c - 1].len;
    }
    for (uint64_t lo = 0; lo < n; lo += TILE) {   /* the others, a tile at a time */
        uint64_t hi = n - lo < TILE ? n : lo + TILE;
        for (uint32_t c = 0; c < ncols; c++)
            if (cols[c].encoding != BACKREF)
                encode_rows(&cols[c], &st[c], lo, hi, out + st[c].header + 8, n);
    }
    for (uint32_t c = 0; c < ncols; c++)
        if (cols[c].encoding != BACKREF) {
            finish_column(&cols[c], &st[c], out + st[c].header + 8, n);
            check_planes(&cols[c], &st[c], out + st[c].header + 8, n);
        }
    off = 0;   /* every column moves down over the zero planes of those before it */
    for (uint32_t c = 0; c < ncols; c++) off += close_column(&cols[c], &st[c], out, off, n);
    return (int64_t)off;
}

/* Makes the mostly-zero columns of an encoded payload (hc_encode_events' `total` bytes at out,
 * n rows, in a buffer of cap bytes) sparse, in place; returns the payload's new length, or
 * ERR_SPACE if the buffer lacks SPARSE_ROOM(n) bytes after the payload, ERR_ARGS if the
 * column lengths do not add up to `total`. A call of its own, so
 * that the trace writer runs it on the thread that compresses the block, beside the next
 * block's encoding. */
HC_API int64_t hc_sparsify(uint8_t *out, uint64_t total, uint64_t n, uint64_t cap,
                           int op_field) {
    if (!out || cap < total || cap - total < SPARSE_ROOM(n)) return ERR_SPACE;
    return sparsify(out, total, n, op_field);
}

/* What heapcast.trace.native_codec checks when it loads this library. */
HC_API uint64_t hc_codec_abi(int what) {
    return what == 0 ? HC_ABI_VERSION : what == 1 ? sizeof(hc_column) : 0;
}
