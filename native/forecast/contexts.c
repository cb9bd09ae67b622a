/* The n-gram's native kernels (heapcast.forecast.models.ngram), each below under its own rule:
 * its context hashes (hc_contexts), the lookup of contexts in its tables (hc_sorted_index,
 * hc_sorted_find), the counting of a table's labels (hc_count_labels) and the in-run memory's
 * latest continuation of each row's context (hc_recent_continuations).
 *
 * The context hashes (NGram._contexts) in one pass over the rows: for each row, the rolling
 * 64-bit hash of the symbols before it in its stream, read at every wanted order. numpy
 * computed it one order at a time, five passes over every row per order (gather, select,
 * multiply, add, mix), 32 orders deep: 7.4 s of `heapcast report`'s 96 on a Python program's
 * 13.7M events; here the hash stays in a register.
 *
 * The arithmetic is numpy's uint64 arithmetic, wrapping, so the hashes are bit-identical
 * (tests/test_forecast_models.py compares the two). heapcast.forecast.native binds it through
 * ctypes (heapcast/libheapcast_forecast.so, with ranks.c). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* ---------------------------------------------------------------- finding contexts in a table
 *
 * An n-gram table's contexts are sorted, distinct hashes (48 bits of mix64: spread evenly over
 * their range). numpy's searchsorted bisects: about 24 dependent reads per query on a table of
 * 20M contexts, each a cache miss (and a TLB miss), and finding the contexts of 20M rows at 10
 * orders took 155 s of the 260 s that a GRU's hints cost on ring's 20M events. Here a table
 * gets a directory once (hc_sorted_index): 2^k buckets by the top bits of (value - first),
 * about four values each, and where each bucket starts in the table (a byte per value). A
 * lookup reads its bucket's start, then a cache line or two of the table; both reads are
 * fetched ahead, for the queries AHEAD and 2 * AHEAD further on, so that the misses of
 * successive queries overlap. Values bunched anywhere only make some buckets long: those are
 * bisected, so no table costs more than bisection. (The compiled policy finds the same contexts
 * through the open-addressing index it stores, native/policy/policy.c hc_index_build: 8 to 16
 * bytes per context and a random write per context to build, which a POLICY pays once at
 * compile time; here a table of a model in memory gets a directory of a byte or two per
 * context, built in one sequential pass.) */
#define AHEAD 8

/* The directory's shape for a table of n values from a to b: 2^k buckets, bucket of v =
 * (v - a) >> shift (always < 2^k). */
static void sorted_shape(uint64_t n, uint64_t a, uint64_t b, unsigned *k, unsigned *shift) {
    unsigned kk = 0;
    while (kk < 31 && (4ull << kk) < n) kk++;            /* about four values per bucket */
    const uint64_t span = b - a;
    const unsigned bits = span ? 64u - (unsigned)__builtin_clzll(span) : 0;   /* of span */
    *shift = bits > kk ? bits - kk : 0;
    *k = kk;
}

/* Buckets of hc_sorted_find's directory for a table of n values (its size is that + 1). */
HC_API uint64_t hc_sorted_buckets(const uint64_t *t, uint64_t n) {
    if (!n || !t) return 0;
    unsigned k, shift;
    sorted_shape(n, t[0], t[n - 1], &k, &shift);
    return 1ull << k;
}

/* Fills dir (hc_sorted_buckets(t, n) + 1 entries): dir[j] = the first index of t whose bucket
 * is j or more; dir[nb] = n. t: n sorted values, n < 2^32. Returns 0, or -1 for bad arguments. */
HC_API int hc_sorted_index(const uint64_t *t, uint64_t n, uint32_t *dir, uint64_t nb) {
    if (!n || !t || !dir || n >= (1ull << 32) || nb != hc_sorted_buckets(t, n)) return -1;
    unsigned k, shift;
    sorted_shape(n, t[0], t[n - 1], &k, &shift);
    uint64_t j = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t bk = (t[i] - t[0]) >> shift;
        if (i && t[i] <= t[i - 1]) return -1;            /* not sorted and distinct */
        while (j <= bk) dir[j++] = (uint32_t)i;
    }
    while (j <= nb) dir[j++] = (uint32_t)n;
    return 0;
}

/* out[i] = the index of q[i] in t (n sorted, distinct values, with their directory dir of nb
 * buckets from hc_sorted_index), or -1 where it is not there. Returns 0, or -1 for bad
 * arguments. */
HC_API int hc_sorted_find(const uint64_t *t, uint64_t n, const uint32_t *dir, uint64_t nb,
                          const uint64_t *q, uint64_t nq, int64_t *out) {
    if (nq && (!q || !out)) return -1;
    if (!n) {
        for (uint64_t i = 0; i < nq; i++) out[i] = -1;
        return 0;
    }
    if (!t || !dir || nb != hc_sorted_buckets(t, n)) return -1;
    unsigned k, shift;
    const uint64_t a = t[0], b = t[n - 1];
    sorted_shape(n, a, b, &k, &shift);
    for (uint64_t i = 0; i < nq; i++) {
        if (i + 2 * AHEAD < nq) {
            const uint64_t v = q[i + 2 * AHEAD];
            if (v >= a && v <= b) __builtin_prefetch(dir + ((v - a) >> shift));
        }
        if (i + AHEAD < nq) {
            const uint64_t v = q[i + AHEAD];
            if (v >= a && v <= b) __builtin_prefetch(t + dir[(v - a) >> shift]);
        }
        const uint64_t v = q[i];
        int64_t found = -1;
        if (v >= a && v <= b) {
            const uint64_t bk = (v - a) >> shift;
            uint64_t lo = dir[bk], hi = dir[bk + 1];         /* v, if there, is in t[lo..hi) */
            while (hi - lo > 8) {                            /* a long bucket: bisect */
                const uint64_t mid = lo + (hi - lo) / 2;
                if (t[mid] <= v) lo = mid; else hi = mid;
            }
            for (; lo < hi; lo++)
                if (t[lo] >= v) { if (t[lo] == v) found = (int64_t)lo; break; }
        }
        out[i] = found;
    }
    return 0;
}

/* ---------------------------------------------------------------- counting a table's labels
 *
 * NGram._count: from the sorted keys (context << label_bits | label) of the training rows, per
 * context: ctx, n (rows), d (distinct labels) and its min(d, topk) most frequent labels with
 * their counts, by decreasing count, a tie to the lower label. numpy took ten passes over the
 * keys after sorting them (groups, reduceat, a lexsort, gathers): 3.8 of the 5.8 s a table of
 * 20M contexts seen once cost. Here it is one pass. */
#define MAX_TOPK 64

/* keys: n sorted values; the outputs hold room for n contexts and n labels (tok16 or tok32,
 * the other NULL). *ne and *nk: contexts and labels written. Returns 0, or -1 for bad
 * arguments (keys not sorted, label_bits or topk out of range, a count past 2^32). */
HC_API int hc_count_labels(const uint64_t *keys, uint64_t n, unsigned label_bits, unsigned topk,
                           uint64_t *ctx, uint32_t *cn, uint32_t *cd, uint16_t *tok16,
                           uint32_t *tok32, uint32_t *cnt, uint64_t *ne, uint64_t *nk) {
    if (label_bits == 0 || label_bits > 32 || topk == 0 || topk > MAX_TOPK || !ne || !nk ||
        (n && (!keys || !ctx || !cn || !cd || !cnt || (!tok16 == !tok32))))
        return -1;
    const uint64_t lmask = (1ull << label_bits) - 1;
    uint64_t e = 0, k = 0, i = 0;
    uint32_t bc[MAX_TOPK], bl[MAX_TOPK];
    while (i < n) {
        const uint64_t c = keys[i] >> label_bits;
        uint64_t rows = 0, distinct = 0;
        unsigned m = 0;                               /* labels kept so far, best first */
        while (i < n && (keys[i] >> label_bits) == c) {
            const uint64_t key = keys[i];
            uint64_t j = i + 1;
            while (j < n && keys[j] == key) j++;
            if (j < n && keys[j] < key) return -1;
            const uint64_t run = j - i;
            if (run > UINT32_MAX) return -1;
            rows += run;
            distinct++;
            /* labels come in increasing order: a tie stays behind the lower label */
            unsigned p = m;
            while (p > 0 && bc[p - 1] < run) p--;
            if (p < topk) {
                unsigned last = m < topk ? m : topk - 1;
                for (unsigned q = last; q > p; q--) { bc[q] = bc[q - 1]; bl[q] = bl[q - 1]; }
                bc[p] = (uint32_t)run;
                bl[p] = (uint32_t)(key & lmask);
                if (m < topk) m++;
            }
            i = j;
        }
        if (i < n && (keys[i] >> label_bits) < c) return -1;
        if (rows > UINT32_MAX) return -1;
        ctx[e] = c;
        cn[e] = (uint32_t)rows;
        cd[e] = (uint32_t)distinct;
        e++;
        for (unsigned q = 0; q < m; q++, k++) {
            if (tok16) tok16[k] = (uint16_t)bl[q]; else tok32[k] = bl[q];
            cnt[k] = bc[q];
        }
    }
    *ne = e;
    *nk = k;
    return 0;
}

/* ---------------------------------------------------------------- the in-run memory
 *
 * NGram.recent_continuations: for every row, the label of the latest earlier labelled row of
 * its own stream with the same context (-1: none). numpy sorted the rows by (context, stream)
 * and took running maxima over the sorted order: an argsort and six passes of temporaries per
 * order, 5.7 s of a GRU's evaluation on the main job's 13.7M rows at its three orders. Here it
 * is one pass in row order through a hash table from key to the latest label, keyed as numpy
 * keyed it (mix64(ctx ^ stream * 0x9E3779B97F4A7C15), so that the same rows meet), with the
 * slot of the row RECENT_AHEAD rows on prefetched: on a trace whose contexts never repeat the
 * table outgrows the caches. */
#define RECENT_AHEAD 16

struct recent_slot { uint64_t key; int64_t label; };   /* label -1: empty */

static inline uint64_t recent_key(uint64_t ctx, uint64_t stream) {
    return mix64(ctx ^ (stream * 0x9E3779B97F4A7C15ull));
}

static int recent_grow(struct recent_slot **tab, uint64_t *cap) {
    uint64_t ncap = *cap ? *cap * 2 : 1u << 16;
    struct recent_slot *n = malloc(ncap * sizeof *n);
    if (!n) return -1;
    memset(n, 0xFF, ncap * sizeof *n);
    for (uint64_t i = 0; i < *cap; i++) {
        if ((*tab)[i].label < 0) continue;
        uint64_t j = (*tab)[i].key & (ncap - 1);
        while (n[j].label >= 0) j = (j + 1) & (ncap - 1);
        n[j] = (*tab)[i];
    }
    free(*tab);
    *tab = n;
    *cap = ncap;
    return 0;
}

/* ctx: n context hashes in row order; offsets: nstreams + 1 row offsets of the streams (0 ...
 * n); labels: n labels, < 0 for a row without one (it is never remembered). out[i]: the label
 * of the latest row before i in i's stream whose key equals i's, among labelled rows; -1 if
 * none. Returns 0, -1 without memory, -2 for offsets that do not cover 0..n in order. */
HC_API int hc_recent_continuations(const uint64_t *ctx, const int64_t *labels, uint64_t n,
                                   const int64_t *offsets, uint64_t nstreams, int64_t *out) {
    if (nstreams == 0 ? n != 0 : (offsets[0] != 0 || (uint64_t)offsets[nstreams] != n))
        return -2;
    for (uint64_t s = 0; s < nstreams; s++)
        if (offsets[s + 1] < offsets[s]) return -2;
    struct recent_slot *tab = NULL;
    uint64_t cap = 0, used = 0;
    if (recent_grow(&tab, &cap)) return -1;
    uint64_t s = 0, ahead_s = 0;
    for (uint64_t i = 0; i < n; i++) {
        while ((uint64_t)offsets[s + 1] <= i) s++;
        uint64_t a = i + RECENT_AHEAD;
        if (a < n) {
            while ((uint64_t)offsets[ahead_s + 1] <= a) ahead_s++;
            __builtin_prefetch(&tab[recent_key(ctx[a], ahead_s) & (cap - 1)], 1);
        }
        const uint64_t key = recent_key(ctx[i], s);
        uint64_t j = key & (cap - 1);
        while (tab[j].label >= 0 && tab[j].key != key) j = (j + 1) & (cap - 1);
        out[i] = tab[j].label;   /* (-1 when empty) */
        if (labels[i] < 0) continue;
        if (tab[j].label < 0) {
            if (4 * (used + 1) > 3 * cap) {   /* at most 3/4 full: on a trace whose contexts
                                                 never repeat it holds one key per row */
                if (recent_grow(&tab, &cap)) { free(tab); return -1; }
                j = key & (cap - 1);
                while (tab[j].label >= 0) j = (j + 1) & (cap - 1);
            }
            used++;
            tab[j].key = key;
        }
        tab[j].label = labels[i];
    }
    free(tab);
    return 0;
}
