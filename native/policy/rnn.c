/* heapcast policy runtime: the `rnn` kind, the default forecaster (a GRU with n-gram hints and an
 * in-run memory, heapcast.forecast.models.rnn) executed step by step in C.
 *
 * What makes a step cheap:
 * - Every input of the network is an embedding looked up by an id, and the GRU's input product is
 *   linear, so the compiler multiplies each embedding table by its slice of W_ih ahead of time
 *   ("input projections", one row of 3H floats per id). A step adds a handful of rows instead of
 *   multiplying a 192-wide input by a 384 x 192 matrix.
 * - The recurrent and output products run over the transposed weights, one hidden unit at a time
 *   (y += h[j] * W^T[j]): every output element sees the same additions in the same order in the
 *   portable, AVX2 and AVX-512 builds of the kernel (target_clones picks one at load time; no FMA
 *   contraction), so results do not depend on the CPU.
 * - `--prune F` drops whole hidden units (their recurrent and output weights), so pruned units
 *   cost nothing; `--int8` stores the recurrent and output weights as int8 with a scale per output
 *   and runs the products in exact integer arithmetic on an int8 copy of the hidden state.
 * - The n-gram's hints are a PPM-C blend over hashed contexts, looked up in open-addressing indexes
 *   the compiler built; only the labels the contexts name are touched, never all classes.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static const double CONF_BOUNDS[HC_N_CONF - 1] = {0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99};
#define P_BOS 0
#define NG_P 0x100000001B3ull

/* ---------------------------------------------------------------- loading */

static const void *need(const hc_policy *p, const char *name, int dtype, int ndim, uint64_t d0,
                        uint64_t d1, char *err, size_t errlen) {
    static const char *dn[] = {"float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                               "uint32", "int64", "uint64", "?"};
    const struct hc_tensor *t = hc_find_tensor(p, name);
    int ok = t && t->dtype == dtype && t->ndim == ndim && (ndim < 1 || t->shape[0] == d0) &&
             (ndim < 2 || t->shape[1] == d1);
    if (!ok) {
        if (ndim == 1)
            snprintf(err, errlen, "tensor %s: expected %s[%llu]%s", name, dn[dtype],
                     (unsigned long long)d0, t ? "" : " (missing)");
        else
            snprintf(err, errlen, "tensor %s: expected %s[%llu, %llu]%s", name, dn[dtype],
                     (unsigned long long)d0, (unsigned long long)d1, t ? "" : " (missing)");
        return NULL;
    }
    return t->data;
}

#define NEED(dst, name, dt, nd, a, b)                                          \
    do {                                                                       \
        (dst) = need(p, name, dt, nd, a, b, err, errlen);                      \
        if (!(dst)) return -1;                                                 \
    } while (0)

static int bad(char *err, size_t errlen, const char *msg, int v) {
    snprintf(err, errlen, msg, v);
    return -1;
}

int hc_rnn_load(hc_policy *p, char *err, size_t errlen) {
    const int32_t *c = p->cfg;
    int H = c[CFG_HIDDEN], n_out = c[CFG_N_OUT], G = 3 * H;
    if (H <= 0 || H > 4096) return bad(err, errlen, "cfg[hidden] is %d: expected 1..4096", H);
    if (n_out <= 0 || n_out > 65536) return bad(err, errlen, "cfg[n_out] is %d", n_out);
    if (c[CFG_N_CACHE] < 0 || c[CFG_N_CACHE] > HC_MAX_CACHE)
        return bad(err, errlen, "cfg[n_cache] is %d: at most 8 cache orders", c[CFG_N_CACHE]);
    if (c[CFG_NG_ORDERS] < 0 || c[CFG_NG_ORDERS] > HC_MAX_ORDERS)
        return bad(err, errlen, "cfg[ng_orders] is %d: at most 16 n-gram orders", c[CFG_NG_ORDERS]);
    if (c[CFG_N_LABELS] <= 0) return bad(err, errlen, "cfg[n_labels] is %d", c[CFG_N_LABELS]);
    NEED(p->tok_map, "tok_map", DT_I32, 1, p->vocab_size, 0);
    for (uint32_t t = 0; t < p->vocab_size; t++)
        if (p->tok_map[t] < 0 || p->tok_map[t] >= c[CFG_N_IN_TOKENS])
            return bad(err, errlen, "tensor tok_map: an id out of range at token %d", (int)t);
    NEED(p->classes, "classes", DT_I64, 1, (uint64_t)n_out, 0);
    NEED(p->class_of_label, "class_of_label", DT_I32, 1, (uint64_t)c[CFG_N_LABELS], 0);
    NEED(p->p_tok, "p.tok", DT_F32, 2, (uint64_t)c[CFG_N_IN_TOKENS], (uint64_t)G);
    if (c[CFG_SITE_BUCKETS]) NEED(p->p_site, "p.site", DT_F32, 2, (uint64_t)c[CFG_SITE_BUCKETS], G);
    if (c[CFG_N_DT]) NEED(p->p_dt, "p.dt", DT_F32, 2, (uint64_t)c[CFG_N_DT], (uint64_t)G);
    if (c[CFG_HINTS]) {
        NEED(p->p_hint1, "p.hint1", DT_F32, 2, (uint64_t)n_out + 1, (uint64_t)G);
        NEED(p->p_hint2, "p.hint2", DT_F32, 2, (uint64_t)n_out + 1, (uint64_t)G);
        NEED(p->p_conf, "p.conf", DT_F32, 2, HC_N_CONF, (uint64_t)G);
        NEED(p->boost, "boost", DT_F32, 2, HC_N_CONF, 2);
    }
    if (c[CFG_N_CACHE]) {
        const int32_t *orders;
        NEED(orders, "cache_orders", DT_I32, 1, (uint64_t)c[CFG_N_CACHE], 0);
        NEED(p->cache_boost, "cache_boost", DT_F32, 1, (uint64_t)c[CFG_N_CACHE], 0);
        for (int i = 0; i < c[CFG_N_CACHE]; i++) {
            char name[32];
            snprintf(name, sizeof name, "p.cache%d", i);
            NEED(p->p_cache[i], name, DT_F32, 2, (uint64_t)n_out + 1, (uint64_t)G);
            if (orders[i] < 1 || orders[i] > 32)
                return bad(err, errlen, "tensor cache_orders: order %d out of 1..32", orders[i]);
            p->cache_orders[i] = orders[i];
        }
    }
    NEED(p->bhh, "b.hh", DT_F32, 1, (uint64_t)G, 0);
    NEED(p->bhead, "b.head", DT_F32, 1, (uint64_t)n_out, 0);
    if (c[CFG_INT8]) {
        /* by pairs of kept units: [pairs, outputs * 2] */
        const struct hc_tensor *kt = hc_find_tensor(p, "kept");
        uint64_t pairs = kt && kt->ndim == 1 ? (kt->shape[0] + 1) / 2 : 0;
        NEED(p->q_hh, "q.hh", DT_I8, 2, pairs, 2 * (uint64_t)G);
        NEED(p->q_hh_scale, "q.hh_scale", DT_F32, 1, (uint64_t)G, 0);
        NEED(p->q_head, "q.head", DT_I8, 2, pairs, 2 * (uint64_t)n_out);
        NEED(p->q_head_scale, "q.head_scale", DT_F32, 1, (uint64_t)n_out, 0);
    } else {
        NEED(p->whh_t, "w.hh_t", DT_F32, 2, (uint64_t)H, (uint64_t)G);
        NEED(p->head_t, "w.head_t", DT_F32, 2, (uint64_t)H, (uint64_t)n_out);
    }
    const struct hc_tensor *kept = hc_find_tensor(p, "kept");
    if (!kept || kept->dtype != DT_I32 || kept->ndim != 1 || kept->shape[0] > (uint64_t)H)
        return bad(err, errlen, "tensor kept: expected int32[<= %d] (hidden units kept)", H);
    p->kept = kept->data;
    p->n_kept = (int)kept->shape[0];
    for (int i = 0; i < p->n_kept; i++)
        if (p->kept[i] < 0 || p->kept[i] >= H)
            return bad(err, errlen, "tensor kept: unit %d out of range", p->kept[i]);
    /* the n-gram of the hints */
    if (c[CFG_HINTS]) {
        int n_ng = c[CFG_NG_CLASSES], topk = c[CFG_NG_TOPK];
        if (n_ng <= 0) return bad(err, errlen, "cfg[ng_classes] is %d", n_ng);
        if (topk <= 0 || topk > 64) return bad(err, errlen, "cfg[ng_topk] is %d", topk);
        const int32_t *orders;
        NEED(orders, "ng.orders", DT_I32, 1, (uint64_t)c[CFG_NG_ORDERS], 0);
        NEED(p->ng_to_hint, "ng.to_hint", DT_I32, 1, (uint64_t)n_ng, 0);
        NEED(p->ng_base, "ng.base", DT_F64, 1, (uint64_t)n_ng, 0);
        NEED(p->ng_base_order, "ng.base_order", DT_I32, 1, (uint64_t)n_ng, 0);
        p->n_ng = c[CFG_NG_ORDERS];
        p->ng_max_order = 0;
        for (int i = 0; i < p->n_ng; i++) {
            struct hc_ngram_order *o = &p->ng[i];
            char name[48];
            o->m = orders[i];
            if (o->m < 1 || o->m > 32 || (i && o->m <= p->ng[i - 1].m))
                return bad(err, errlen, "tensor ng.orders: order %d not ascending in 1..32", o->m);
            if (o->m > p->ng_max_order) p->ng_max_order = o->m;
            snprintf(name, sizeof name, "ng%d.ctx", o->m);
            const struct hc_tensor *t = hc_find_tensor(p, name);
            if (!t || t->dtype != DT_U64 || t->ndim != 1) {
                snprintf(err, errlen, "tensor %s: expected uint64[entries]", name);
                return -1;
            }
            o->ctx = t->data;
            o->n_entries = t->shape[0];
            o->topk = (uint64_t)topk;
            uint64_t E = o->n_entries;
            snprintf(name, sizeof name, "ng%d.n", o->m);
            NEED(o->n, name, DT_U32, 1, E, 0);
            snprintf(name, sizeof name, "ng%d.d", o->m);
            NEED(o->d, name, DT_U32, 1, E, 0);
            snprintf(name, sizeof name, "ng%d.cnt", o->m);
            NEED(o->cnt, name, DT_U32, 2, E, (uint64_t)topk);
            snprintf(name, sizeof name, "ng%d.tok", o->m);
            t = hc_find_tensor(p, name);
            o->tok16 = NULL;
            o->tok32 = NULL;
            if (t && t->dtype == DT_U16) NEED(o->tok16, name, DT_U16, 2, E, (uint64_t)topk);
            else NEED(o->tok32, name, DT_U32, 2, E, (uint64_t)topk);
            for (uint64_t k = 0; k < E * (uint64_t)topk; k++) {
                uint32_t v = o->tok16 ? o->tok16[k] : o->tok32[k];
                if (v > (uint32_t)n_ng) {
                    snprintf(err, errlen, "tensor %s: label class %u out of range", name, v);
                    return -1;
                }
            }
            snprintf(name, sizeof name, "ng%d.slots", o->m);
            t = hc_find_tensor(p, name);
            if (!t || t->dtype != DT_I32 || t->ndim != 1 || (t->shape[0] & (t->shape[0] - 1)) ||
                t->shape[0] <= E || t->shape[0] > (1ull << 31)) {
                snprintf(err, errlen, "tensor %s: expected int32[a power of 2 > entries]", name);
                return -1;
            }
            o->slots = t->data;
            o->bits = (uint32_t)__builtin_ctzll(t->shape[0]);
            for (uint64_t k = 0; k < t->shape[0]; k++)
                if (o->slots[k] < 0 || (uint64_t)o->slots[k] > E) {
                    snprintf(err, errlen, "tensor %s: entry %d out of range", name, o->slots[k]);
                    return -1;
                }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- stream memory */

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

size_t hc_rnn_stream_bytes(const hc_policy *p, uint64_t mem_cap) {
    const int32_t *c = p->cfg;
    size_t H = (size_t)c[CFG_HIDDEN], n_out = (size_t)c[CFG_N_OUT];
    size_t n = up64(H * 4) + 2 * up64(3 * H * 4) + up64(n_out * 4) + up64((H + 1) * 2);
    n += up64((3 * H > n_out ? 3 * H : n_out) * 4);
    n += up64((size_t)(c[CFG_HINTS] ? c[CFG_NG_CLASSES] : 0) * 8) + up64(HC_MAX_ORDERS * 64 * 4);
    if (c[CFG_SHIFT]) n += (size_t)c[CFG_N_CACHE] * (up64(mem_cap * 8) + up64(mem_cap * 4));
    return n;
}

void hc_rnn_stream_init(hc_stream *s, char *mem) {
    const int32_t *c = s->p->cfg;
    size_t H = (size_t)c[CFG_HIDDEN], n_out = (size_t)c[CFG_N_OUT];
#define TAKE(dst, type, count) do { (dst) = (type *)mem; mem += up64((count) * sizeof(type)); } while (0)
    TAKE(s->h, float, H);
    TAKE(s->gi, float, 3 * H);
    TAKE(s->gh, float, 3 * H);
    TAKE(s->logits, float, n_out);
    TAKE(s->hp, int16_t, H + 1);
    TAKE(s->acc, int32_t, 3 * H > n_out ? 3 * H : n_out);
    TAKE(s->ng_acc, double, (size_t)(c[CFG_HINTS] ? c[CFG_NG_CLASSES] : 0));
    TAKE(s->ng_touched, int32_t, (size_t)HC_MAX_ORDERS * 64);
    if (c[CFG_SHIFT])
        for (int i = 0; i < c[CFG_N_CACHE]; i++) {
            TAKE(s->mem_keys[i], uint64_t, s->mem_cap);
            TAKE(s->mem_vals[i], int32_t, s->mem_cap);
        }
#undef TAKE
}

/* ---------------------------------------------------------------- kernels */

/* Vector types of GCC's vector extension: each target clone below maps them to its own
 * instructions (SSE in the portable build, AVX2, AVX-512), element by element the same. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int8_t v8b __attribute__((vector_size(8)));
#define BLK 8           /* vectors of 8 per block: 64 outputs stay in registers over all units */

/* y[0:n) += x[0:n) */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void vadd(float *restrict y, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

/* y[i:i+8*nb) += sum over kept units j of h[j] * wt[j][i:i+8*nb): nb <= BLK vectors of 8
 * outputs held in registers over all the units (nb a constant where it is BLK). */
static inline __attribute__((always_inline)) void
matvec_block(float *restrict y, const float *restrict wt, const float *restrict h,
             const int32_t *kept, int nk, int n, int i, int nb) {
    v8f acc[BLK];
    memcpy(acc, y + i, (size_t)nb * sizeof *acc);
    for (int k = 0; k < nk; k++) {
        int j = kept[k];
        const float *w = wt + (size_t)j * (size_t)n + i;
        v8f a = {h[j], h[j], h[j], h[j], h[j], h[j], h[j], h[j]};
        for (int b = 0; b < nb; b++) {
            v8f x;
            memcpy(&x, w + 8 * b, sizeof x);
            acc[b] += a * x;
        }
    }
    memcpy(y + i, acc, (size_t)nb * sizeof *acc);
}

/* y[0:n) += sum over kept units j of h[j] * wt[j][0:n): the transposed product, one unit at a
 * time, 64 outputs at a time held in registers, then the fewer than 64 left (a head of 127
 * labels: 63) as whole vectors of 8 together and the last few together. Every y[i] adds its
 * terms in the order of `kept` in every build and in the scalar tail, so all builds give the
 * same bits. (The outputs past the last 64 were summed one at a time, each a chain of nk
 * dependent additions: 40% of the kernel's time in `heapcast evaluate` of the main job's
 * policy.) */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void matvec_t(float *restrict y, const float *restrict wt, const float *restrict h,
                     const int32_t *kept, int nk, int n) {
    int i = 0;
    for (; i + 8 * BLK <= n; i += 8 * BLK)
        matvec_block(y, wt, h, kept, nk, n, i, BLK);
    int nb = (n - i) / 8;
    if (nb) {
        matvec_block(y, wt, h, kept, nk, n, i, nb);
        i += 8 * nb;
    }
    if (i < n) {
        float acc[8];
        int r = n - i;
        memcpy(acc, y + i, (size_t)r * sizeof *acc);
        for (int k = 0; k < nk; k++) {
            int j = kept[k];
            const float *w = wt + (size_t)j * (size_t)n + i;
            for (int t = 0; t < r; t++) acc[t] += h[j] * w[t];
        }
        memcpy(y + i, acc, (size_t)r * sizeof *acc);
    }
}

/* acc[0:n) += sum over pairs k of kept units of hq[2k] * q[k][i][0] + hq[2k+1] * q[k][i][1]:
 * the int8 weights are stored by pairs of kept units (q[k][i][2]), so that AVX2's vpmaddwd
 * multiplies and adds two units at once. Exact integer arithmetic: the AVX2 and the portable
 * code give the same result. */
static void matvec_q_portable(int32_t *restrict acc, const int8_t *restrict q,
                              const int16_t *restrict hp, int npairs, int n) {
    for (int k = 0; k < npairs; k++) {
        const int8_t *w = q + (size_t)k * (size_t)n * 2;
        int32_t a0 = hp[2 * k], a1 = hp[2 * k + 1];
        for (int i = 0; i < n; i++) acc[i] += a0 * w[2 * i] + a1 * w[2 * i + 1];
    }
}

__attribute__((target("avx2")))
static void matvec_q_avx2(int32_t *restrict acc, const int8_t *restrict q,
                          const int16_t *restrict hp, int npairs, int n) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i s0 = _mm256_loadu_si256((const __m256i *)(acc + i));
        __m256i s1 = _mm256_loadu_si256((const __m256i *)(acc + i + 8));
        __m256i s2 = _mm256_loadu_si256((const __m256i *)(acc + i + 16));
        __m256i s3 = _mm256_loadu_si256((const __m256i *)(acc + i + 24));
        for (int k = 0; k < npairs; k++) {
            const int8_t *w = q + ((size_t)k * (size_t)n + (size_t)i) * 2;
            __m256i a = _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)hp[2 * k] |
                                                    ((uint32_t)(uint16_t)hp[2 * k + 1] << 16)));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w)), a));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16))), a));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 32))), a));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 48))), a));
        }
        _mm256_storeu_si256((__m256i *)(acc + i), s0);
        _mm256_storeu_si256((__m256i *)(acc + i + 8), s1);
        _mm256_storeu_si256((__m256i *)(acc + i + 16), s2);
        _mm256_storeu_si256((__m256i *)(acc + i + 24), s3);
    }
    for (; i < n; i++)
        for (int k = 0; k < npairs; k++) {
            const int8_t *w = q + ((size_t)k * (size_t)n + (size_t)i) * 2;
            acc[i] += (int32_t)hp[2 * k] * w[0] + (int32_t)hp[2 * k + 1] * w[1];
        }
}

static void matvec_q(int32_t *acc, const int8_t *q, const int16_t *hp, int npairs, int n) {
    static int avx2 = -1;
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    if (avx2) matvec_q_avx2(acc, q, hp, npairs, n);
    else matvec_q_portable(acc, q, hp, npairs, n);
}

/* y = bias + W^T h, fp32 or int8 (acc: scratch of n int32). */
static void product(const hc_stream *s, float *y, const float *bias, const float *wt,
                    const int8_t *q, const float *qscale, float hscale, int n, int32_t *acc) {
    const hc_policy *p = s->p;
    if (q) {
        memset(acc, 0, (size_t)n * sizeof *acc);
        matvec_q(acc, q, s->hp, (p->n_kept + 1) / 2, n);
        for (int i = 0; i < n; i++) y[i] = bias[i] + (float)acc[i] * (qscale[i] * hscale);
    } else {
        memcpy(y, bias, (size_t)n * sizeof *y);
        matvec_t(y, wt, s->h, p->kept, p->n_kept, n);
    }
}

/* lrintf (to nearest, ties to even) without libm: the allocator that compiles this runtime in is
 * preloaded into every program, and loading libm cost programs that do not use it 0.3 MiB of
 * resident pages. cvtss2si rounds as lrintf does in the default rounding mode. */
static inline long round_float(float x) {
#if defined(__x86_64__)
    return _mm_cvtss_si32(_mm_set_ss(x));
#else
    return lrintf(x);
#endif
}

/* int8 copy of the hidden state with one symmetric scale (returned). */
static float quantize_h(hc_stream *s, int H) {
    float mx = 0;
    for (int j = 0; j < H; j++) {
        float a = fabsf(s->h[j]);
        if (a > mx) mx = a;
    }
    float scale = mx > 0 ? mx / 127.0f : 1.0f;
    const hc_policy *p = s->p;
    for (int k = 0; k < p->n_kept; k++) s->hp[k] = (int16_t)round_float(s->h[p->kept[k]] / scale);
    if (p->n_kept & 1) s->hp[p->n_kept] = 0;
    return scale;
}

/* e^x for the gates and the softmax: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor
 * polynomial to r^6 (relative error under 3e-7), 2^n through the exponent bits. Branch-free, so
 * that the gate loop vectorizes; the same operations, so the same bits, in every build. */
static inline float fexp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;     /* round to nearest */
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float q = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f +
              r * (8.33333377e-3f + r * 1.38888892e-3f)))));
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return q * scale;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + fexp(-x)); }
static inline float tanh_f(float x) { return 2.0f / (1.0f + fexp(-2.0f * x)) - 1.0f; }

/* fexp on 8 lanes, operation for operation. */
static inline v8f vfexp(v8f x) {
    const v8f lo = {-87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f};
    const v8f hi = {88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f};
    v8i m = x < lo;
    x = (v8f)(((v8i)x & ~m) | ((v8i)lo & m));
    m = x > hi;
    x = (v8f)(((v8i)x & ~m) | ((v8i)hi & m));
    v8f n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    v8f r = x - n * 0.693145752f - n * 1.42860677e-6f;
    v8f q = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f +
            r * (8.33333377e-3f + r * 1.38888892e-3f)))));
    v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    return q * (v8f)e;
}

/* The GRU's gates and new state for units [0, H): 8 units at a time, then one at a time with
 * the same operations. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void gates(float *restrict h, const float *restrict gi, const float *restrict gh, int H) {
    int j = 0;
    for (; j + 8 <= H; j += 8) {
        v8f ir, iz, in, hr, hz, hn, hv;
        memcpy(&ir, gi + j, 32);
        memcpy(&iz, gi + H + j, 32);
        memcpy(&in, gi + 2 * H + j, 32);
        memcpy(&hr, gh + j, 32);
        memcpy(&hz, gh + H + j, 32);
        memcpy(&hn, gh + 2 * H + j, 32);
        memcpy(&hv, h + j, 32);
        v8f r = 1.0f / (1.0f + vfexp(-(ir + hr)));
        v8f z = 1.0f / (1.0f + vfexp(-(iz + hz)));
        v8f n = 2.0f / (1.0f + vfexp(-2.0f * (in + r * hn))) - 1.0f;
        v8f out = (1.0f - z) * n + z * hv;
        memcpy(h + j, &out, 32);
    }
    for (; j < H; j++) {
        float r = sigmoidf(gi[j] + gh[j]);
        float z = sigmoidf(gi[H + j] + gh[H + j]);
        float n = tanh_f(gi[2 * H + j] + r * gh[2 * H + j]);
        h[j] = (1.0f - z) * n + z * h[j];
    }
}

/* ---------------------------------------------------------------- the n-gram's hints */

static inline int better(double a, int ai, double b, int bi) {
    return bi < 0 || a > b || (a == b && ai < bi);
}

/* The n-gram's two best labels for the row whose context is the history, and its confidence
 * bucket (heapcast.forecast.models.ngram.NGram.predict_proba and RNNModel._hints). */
static void hints(hc_stream *s) {
    const hc_policy *p = s->p;
    uint64_t ctx[HC_MAX_ORDERS];
    uint64_t h = 0;
    int oi = 0;
    for (int m = 1; m <= p->ng_max_order; m++) {
        h = h * NG_P + hc_hist(s, s->hint_sym, (uint32_t)m) + 1;
        if (oi < p->n_ng && p->ng[oi].m == m) ctx[oi++] = hc_mix64(h ^ (uint64_t)m) >> 16;
    }
    int n_ng = p->cfg[CFG_NG_CLASSES];
    double *acc = s->ng_acc;
    int32_t *touched = s->ng_touched;
    int nt = 0;
    double weight = 1.0;
    for (int i = p->n_ng - 1; i >= 0; i--) {     /* longest context first */
        const struct hc_ngram_order *o = &p->ng[i];
        if (!o->n_entries) continue;
        uint32_t e = hc_slot_probe(o->slots, o->bits, o->ctx, ctx[i]);
        if (!e) continue;
        e--;
        double n = (double)o->n[e], d = (double)o->d[e];
        double w = weight / (n + d);
        for (uint64_t t = 0; t < o->topk; t++) {
            uint32_t lab = o->tok16 ? o->tok16[e * o->topk + t] : o->tok32[e * o->topk + t];
            if (lab >= (uint32_t)n_ng) continue;       /* padding */
            if (acc[lab] == 0) touched[nt++] = (int32_t)lab;
            acc[lab] += w * (double)o->cnt[e * o->topk + t];
        }
        weight *= d / (n + d);
    }
    int b1 = -1, b2 = -1;
    double s1 = 0, s2 = 0;
#define CONSIDER(cls, sc)                                            \
    do {                                                             \
        double v_ = (sc);                                            \
        int c_ = (cls);                                              \
        if (better(v_, c_, s1, b1)) { b2 = b1; s2 = s1; b1 = c_; s1 = v_; } \
        else if (better(v_, c_, s2, b2)) { b2 = c_; s2 = v_; }       \
    } while (0)
    for (int i = 0; i < nt; i++) CONSIDER(touched[i], acc[touched[i]] + weight * p->ng_base[touched[i]]);
    int found = 0;
    for (int i = 0; i < n_ng && found < 2; i++) {
        int cl = p->ng_base_order[i];
        if (acc[cl] != 0) continue;
        CONSIDER(cl, weight * p->ng_base[cl]);
        found++;
    }
#undef CONSIDER
    for (int i = 0; i < nt; i++) acc[touched[i]] = 0;
    s->hint1 = b1 >= 0 ? p->ng_to_hint[b1] : 0;
    s->hint2 = b2 >= 0 ? p->ng_to_hint[b2] : 0;
    double p0 = b1 >= 0 ? (double)(float)s1 : 0.0;
    int conf = 0;
    while (conf < HC_N_CONF - 1 && CONF_BOUNDS[conf] <= p0) conf++;
    s->conf = conf;
}

/* ---------------------------------------------------------------- the in-run memory */

static inline uint64_t mem_slot(uint64_t key, uint64_t cap) {
    return (key * 0x9E3779B97F4A7C15ull) >> (64 - __builtin_ctzll(cap));
}

/* The contexts of the row to predict, per cache order (keys never 0: the hash is 48 bits + 1). */
static void memory_contexts(hc_stream *s) {
    const hc_policy *p = s->p;
    uint64_t h = 0;
    int maxm = 0;
    for (int i = 0; i < p->cfg[CFG_N_CACHE]; i++)
        if (p->cache_orders[i] > maxm) maxm = p->cache_orders[i];
    for (int m = 1; m <= maxm; m++) {
        h = h * NG_P + hc_hist(s, s->mem_sym, (uint32_t)m) + 1;
        for (int i = 0; i < p->cfg[CFG_N_CACHE]; i++)
            if (p->cache_orders[i] == m) s->mem_ctx[i] = (hc_mix64(h ^ (uint64_t)m) >> 16) + 1;
    }
}

static void memory_lookup(hc_stream *s) {
    const hc_policy *p = s->p;
    uint64_t mask = s->mem_cap - 1;
    for (int i = 0; i < p->cfg[CFG_N_CACHE]; i++) {
        uint64_t key = s->mem_ctx[i], j = mem_slot(key, s->mem_cap);
        int32_t label = -1;
        for (;;) {
            uint64_t k = s->mem_keys[i][j];
            if (k == 0) break;
            if (k == key) { label = s->mem_vals[i][j]; break; }
            j = (j + 1) & mask;
        }
        int32_t cls = label >= 0 && label < p->cfg[CFG_N_LABELS] ? p->class_of_label[label] : -1;
        s->cache[i] = cls >= 0 ? cls + 1 : 0;
    }
}

/* Row j happened with `label`: its contexts now point to it. Past 3/4 load a full table keeps
 * the contexts it has (exact while a run has fewer distinct contexts than that). */
static void memory_store(hc_stream *s, int32_t label) {
    const hc_policy *p = s->p;
    uint64_t mask = s->mem_cap - 1;
    for (int i = 0; i < p->cfg[CFG_N_CACHE]; i++) {
        uint64_t key = s->mem_ctx[i], j = mem_slot(key, s->mem_cap);
        for (;;) {
            uint64_t k = s->mem_keys[i][j];
            if (k == key) { s->mem_vals[i][j] = label; break; }
            if (k == 0) {
                if (s->mem_used[i] * 4 >= s->mem_cap * 3) break;
                s->mem_keys[i][j] = key;
                s->mem_vals[i][j] = label;
                s->mem_used[i]++;
                break;
            }
            j = (j + 1) & mask;
        }
    }
}

/* ---------------------------------------------------------------- a step */

static void step(hc_stream *s, int tok_id, int site_bucket, int dt) {
    const hc_policy *p = s->p;
    const int32_t *c = p->cfg;
    int H = c[CFG_HIDDEN], G = 3 * H;
    float *gi = s->gi, *gh = s->gh;
    memcpy(gi, p->p_tok + (size_t)tok_id * G, (size_t)G * sizeof *gi);
    if (p->p_site) vadd(gi, p->p_site + (size_t)site_bucket * G, G);
    if (p->p_dt) vadd(gi, p->p_dt + (size_t)dt * G, G);
    if (c[CFG_HINTS]) {
        vadd(gi, p->p_hint1 + (size_t)s->hint1 * G, G);
        vadd(gi, p->p_hint2 + (size_t)s->hint2 * G, G);
        vadd(gi, p->p_conf + (size_t)s->conf * G, G);
    }
    for (int i = 0; i < c[CFG_N_CACHE] && c[CFG_SHIFT]; i++)
        vadd(gi, p->p_cache[i] + (size_t)s->cache[i] * G, G);
    float hscale = c[CFG_INT8] ? quantize_h(s, H) : 1.0f;
    product(s, gh, p->bhh, p->whh_t, p->q_hh, p->q_hh_scale, hscale, G, s->acc);
    gates(s->h, gi, gh, H);
}

/* The head: logits, the hinted labels' boosts, the top labels and the softmax confidence. */
static void head(hc_stream *s) {
    const hc_policy *p = s->p;
    const int32_t *c = p->cfg;
    int H = c[CFG_HIDDEN], n = c[CFG_N_OUT];
    float *lg = s->logits;
    float hscale = c[CFG_INT8] ? quantize_h(s, H) : 1.0f;
    product(s, lg, p->bhead, p->head_t, p->q_head, p->q_head_scale, hscale, n, s->acc);
    /* boosts in the network's order: hint 1, hint 2, then each cache order */
    if (c[CFG_HINTS]) {
        if (s->hint1 > 0) lg[s->hint1 - 1] += p->boost[s->conf * 2];
        if (s->hint2 > 0) lg[s->hint2 - 1] += p->boost[s->conf * 2 + 1];
    }
    for (int i = 0; i < c[CFG_N_CACHE] && c[CFG_SHIFT]; i++)
        if (s->cache[i] > 0) lg[s->cache[i] - 1] += p->cache_boost[i];
    int best[HC_TOPK];
    int nb = 0;
    for (int i = 0; i < n; i++) {
        /* the top labels, best first; among equal logits the lower index first */
        int pos;
        if (nb < HC_TOPK) pos = nb++;
        else if (lg[i] > lg[best[HC_TOPK - 1]]) pos = HC_TOPK - 1;
        else continue;
        while (pos > 0 && lg[i] > lg[best[pos - 1]]) {
            best[pos] = best[pos - 1];
            pos--;
        }
        best[pos] = i;
    }
    /* softmax share of the top label; terms below e^-30 of it change nothing and are skipped */
    double z = 0, mx = lg[best[0]];
    for (int i = 0; i < n; i++)
        if (lg[i] > mx - 30.0) z += fexp(lg[i] - (float)mx);
    for (int i = 0; i < HC_TOPK; i++) s->pred.label[i] = i < nb ? (int32_t)p->classes[best[i]] : -1;
    s->pred.conf = (float)(1.0 / z);
    s->pred.level = 0;
    s->have_pred = 1;
}

/* ---------------------------------------------------------------- the stream */

static void prepare_row(hc_stream *s) {
    const hc_policy *p = s->p;
    if (p->cfg[CFG_HINTS]) hints(s);
    if (p->cfg[CFG_SHIFT] && p->cfg[CFG_N_CACHE]) {
        memory_contexts(s);
        memory_lookup(s);
    }
}

void hc_rnn_start(hc_stream *s) {
    const hc_policy *p = s->p;
    memset(s->h, 0, (size_t)p->cfg[CFG_HIDDEN] * sizeof *s->h);
    for (int i = 0; i < p->cfg[CFG_N_CACHE] && p->cfg[CFG_SHIFT]; i++)
        if (s->mem_used[i]) {
            memset(s->mem_keys[i], 0, s->mem_cap * sizeof(uint64_t));
            s->mem_used[i] = 0;
        }
    s->have_pred = 0;
    if (p->cfg[CFG_SHIFT]) {
        /* next/free: the first row is predicted from the stream-start token */
        prepare_row(s);
        step(s, P_BOS, 0, 0);
        head(s);
    }
}

void hc_rnn_feed(hc_stream *s, uint32_t site, uint16_t token, int dt, uint64_t hint_sym,
                 uint64_t mem_sym, int32_t label, int want_pred) {
    const hc_policy *p = s->p;
    const int32_t *c = p->cfg;
    if (c[CFG_SHIFT] && c[CFG_N_CACHE] && label >= 0) memory_store(s, label);
    hc_push_history(s, hint_sym, mem_sym, token);
    if (s->events + (uint64_t)c[CFG_SHIFT] < s->skip_until) {
        /* fast-forward (hc_run's warm-up): histories and memory only, the network stays at rest */
        if (c[CFG_SHIFT] && c[CFG_N_CACHE]) memory_contexts(s);
        s->have_pred = 0;
        return;
    }
    /* inputs: this event; hints and memory: of the row to predict (the next one, or this one
     * for lifetime, whose history now ends with this event) */
    prepare_row(s);
    int tok_id = token < p->vocab_size ? p->tok_map[token] : 1;
    int buckets = c[CFG_SITE_BUCKETS];
    int site_bucket = site == 0 || buckets <= 1 ? 0 : 1 + (int)(site % (uint32_t)(buckets - 1));
    step(s, tok_id, site_bucket, dt);
    if (want_pred) head(s);
    else s->have_pred = 0;
}
