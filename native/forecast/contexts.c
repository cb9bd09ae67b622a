/* The n-gram's context hashes (heapcast.forecast.models.ngram, NGram._contexts) in one pass over
 * the rows: for each row, the rolling 64-bit hash of the symbols before it in its stream, read
 * at every wanted order. numpy computed it one order at a time, five passes over every row per
 * order (gather, select, multiply, add, mix), 32 orders deep: 7.4 s of `heapcast report`'s
 * 96 on a Python program's 13.7M events; here the hash stays in a register.
 *
 * The arithmetic is numpy's uint64 arithmetic, wrapping, so the hashes are bit-identical
 * (tests/test_forecast_models.py compares the two). heapcast.forecast.native binds it through
 * ctypes (heapcast/libheapcast_forecast.so, with ranks.c). */
#include <stddef.h>
#include <stdint.h>

#define HC_API __attribute__((visibility("default")))

#define P 0x100000001B3ull            /* ngram._P */
#define PAD 0xFFFFFFFFFFFFull         /* ngram._PAD: a symbol before the stream's start */
#define LABEL_BITS 16                 /* ngram._LABEL_BITS */
#define MAX_ORDER 4096u

static inline uint64_t mix64(uint64_t x) {   /* heapcast.forecast.features.mix64 */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Moves the rolling hash of every row from order `from` to order `to` (0 <= from < to): h[i]
 * holds the hash of row rows[i]'s `from` newest symbols (0 for none) and is left holding that
 * of its `to` newest; out[i] = the context hash of order `to` (NGram._contexts: mix64(h ^ to)
 * >> LABEL_BITS). pos[i]: the row's position in its stream (symbols before it: padding). `shift`:
 * the context is the symbols before the row (next, free); else the row's own and those before
 * it (lifetime). Called once per wanted order, ascending, so that each order's hashes can be
 * used (and freed) before the next. Returns 0, or -1 for bad arguments (orders out of range,
 * a row or a position that would read outside sym). */
HC_API int hc_contexts(const uint64_t *sym, uint64_t nsym, const int64_t *rows,
                       const int64_t *pos, uint64_t n, int shift, uint32_t from, uint32_t to,
                       uint64_t *h, uint64_t *out) {
    if (from >= to || to > MAX_ORDER || (n && (!sym || !rows || !pos || !h || !out))) return -1;
    for (uint64_t i = 0; i < n; i++) {
        const int64_t r = rows[i], p = pos[i];
        if (r < 0 || (uint64_t)r >= nsym || p < 0 || p > r) return -1;
        uint64_t v = h[i];
        for (uint32_t m = from + 1; m <= to; m++) {
            const int64_t back = shift ? (int64_t)m : (int64_t)m - 1;
            v = v * P + (p >= back ? sym[r - back] : PAD) + 1;
        }
        h[i] = v;
        out[i] = mix64(v ^ to) >> LABEL_BITS;
    }
    return 0;
}
