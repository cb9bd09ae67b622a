/* heapcast policy runtime: the `table` kind, a distilled lookup for nanosecond budgets.
 *
 * The compiler ran the model over traces and stored, per key, the labels it predicted most often
 * there (top-k, and the share of the top one). Keys (docs/policy-format.md): (call site, token) for
 * every pair seen; (call site, token, hash of the K tokens before the row) for each K of
 * tab.ctx_lens where the context changes the answer (a back-off over context lengths, as an
 * n-gram's); (call site); (token); and a default when no key is known.
 *
 * A lookup is one probe in the common case: the (site, token) slot answers, and its flags say which
 * context lengths hold entries under it, so only those are probed, longest first; an unseen
 * (site, token) backs off to (site), then (token). The table is one open-addressing array (linear
 * probing, load at most 1/2) of 16-byte slots: key, list index and flags, confidence; a probe
 * reads the key's home slot first, which holds it or is empty in the common case (the compiler
 * places the array on a cache line of the file, so a slot never straddles two lines). A next/free
 * stream finds the (site, token) slot of its next lookup, computes the keys of the contexts it
 * flags and prefetches their slots and filter words as the event before the prediction is fed
 * (hc_table_feed), so that the misses overlap the program's own work; the recorder's hook does
 * the lookup and the feed in one call per event (hc_table_step) and logs the answer's int16 list
 * as it is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The key level of a context of K tokens. */
#define CTX_LEVEL(k) (100 + (k))
#define CTX_MUL 0x9E3779B97F4A7C15ull
#define KEY_MUL 0xD6E8FEB86659FD93ull

/* The key of a level: (level, site, token, and the context's rolling hash for a context level)
 * through one odd multiplication, a bijection, so that distinct inputs never share a key; the
 * slot's home takes the high bits of a second multiplication. */
static inline uint64_t key_of(uint64_t tag, uint64_t x) {
    uint64_t k = (x ^ (tag << 56)) * KEY_MUL;
    return k ? k : 1;
}

/* The key of a level (0 token, 1 site, 2 site+token, 100+K a context of K tokens whose rolling
 * hash is `ctx`); heapcast.policy.compile.table_key computes the same in numpy. */
HC_EXPORT uint64_t hc_table_key(int level, uint32_t site, uint32_t token, uint64_t ctx) {
    uint64_t x = ((uint64_t)site << 16) ^ token;
    return key_of((uint64_t)level, level >= CTX_LEVEL(0) ? x ^ ctx * CTX_MUL : x);
}

int hc_table_load(hc_policy *p, char *err, size_t errlen) {
    int bits = p->cfg[CFG_TAB_BITS];
    if (bits < 2 || bits > 31) {
        snprintf(err, errlen, "cfg[tab_bits] is %d: expected 2..31", bits);
        return -1;
    }
    int nctx = p->cfg[CFG_TAB_CTX];
    if (nctx < 0 || nctx > HC_MAX_CTX) {
        snprintf(err, errlen, "cfg[tab_ctx] is %d: expected 0..%d context lengths", nctx, HC_MAX_CTX);
        return -1;
    }
    if (nctx) {
        const struct hc_tensor *cl = hc_find_tensor(p, "tab.ctx_lens");
        if (!cl || cl->dtype != DT_I32 || cl->ndim != 1 || cl->shape[0] != (uint64_t)nctx) {
            snprintf(err, errlen, "tensor tab.ctx_lens: expected int32[%d]", nctx);
            return -1;
        }
        const int32_t *lens = cl->data;
        for (int i = 0; i < nctx; i++) {
            if (lens[i] < 1 || lens[i] > 32 || (i && lens[i] >= lens[i - 1])) {
                snprintf(err, errlen, "tensor tab.ctx_lens: %d is not a descending length in "
                         "1..32", lens[i]);
                return -1;
            }
            p->tab_ctx_lens[i] = lens[i];
            p->tab_pow[i] = 1;
            for (int k = 1; k < lens[i]; k++) p->tab_pow[i] *= 0x100000001B3ull;
        }
    }
    uint64_t cap = 1ull << bits;
    const struct hc_tensor *sl = hc_find_tensor(p, "tab.slots"), *l = hc_find_tensor(p, "tab.lists"),
                           *d = hc_find_tensor(p, "tab.default"),
                           *dc = hc_find_tensor(p, "tab.default_conf");
    if (!sl || sl->dtype != DT_U64 || sl->ndim != 2 || sl->shape[0] != cap || sl->shape[1] != 2) {
        snprintf(err, errlen, "tensor tab.slots: expected uint64[%llu, 2]", (unsigned long long)cap);
        return -1;
    }
    if (!l || l->dtype != DT_I16 || l->ndim != 2 || l->shape[0] < 1 || l->shape[1] != HC_TOPK) {
        snprintf(err, errlen, "tensor tab.lists: expected int16[lists, %d]", HC_TOPK);
        return -1;
    }
    if (!d || d->dtype != DT_I16 || d->ndim != 1 || d->shape[0] != HC_TOPK || !dc ||
        dc->dtype != DT_F32 || dc->ndim != 1 || dc->shape[0] != 1) {
        snprintf(err, errlen, "tensors tab.default, tab.default_conf: expected int16[%d], "
                 "float32[1]", HC_TOPK);
        return -1;
    }
    /* the context keys' filter: a lookup probes a context only if its bit is set */
    const struct hc_tensor *fl = hc_find_tensor(p, "tab.ctx_filter");
    if (!fl || fl->dtype != DT_U64 || fl->ndim != 1 || fl->shape[0] < 1 ||
        (fl->shape[0] & (fl->shape[0] - 1)) || fl->shape[0] > (1ull << 26)) {
        snprintf(err, errlen, "tensor tab.ctx_filter: expected uint64[2^k words]");
        return -1;
    }
    p->tab_filter = fl->data;
    p->tab_filter_shift = 64 - 6 - __builtin_ctzll(fl->shape[0]);
    p->tab_home_shift = 64 - bits;
    p->tab_nctx = nctx;
    /* levels that hold entries (bit `level`): the others are not probed */
    const struct hc_tensor *lm = hc_find_tensor(p, "tab.level_mask");
    p->tab_level_mask = lm && lm->dtype == DT_I32 && lm->ndim == 1 && lm->shape[0] == 1
                            ? *(const int32_t *)lm->data : -1;
    /* a slot must not straddle two cache lines: slots that the file does not place on a 16-byte
     * boundary (files of older compilers; `compile` aligns them to 64) are copied, once, at load */
    p->tab_slots = sl->data;
    if ((uintptr_t)sl->data % 16) {
        struct hc_tab_slot *copy = hc_map_anon((size_t)cap * sizeof *copy);
        if (!copy) {
            snprintf(err, errlen, "tensor tab.slots: out of memory for its aligned copy");
            return -1;
        }
        memcpy(copy, sl->data, (size_t)cap * sizeof *copy);
        p->tab_slots = copy;
        p->tab_copy_len = (size_t)cap * sizeof *copy;
    }
    p->tab_lists = l->data;
    p->tab_cap = cap;
    const int16_t *dl = d->data;
    for (int i = 0; i < HC_TOPK; i++) p->tab_default[i] = dl[i];
    p->tab_default_conf = *(const float *)dc->data;
    uint64_t used = 0, n_lists = l->shape[0];
    for (uint64_t i = 0; i < cap; i++) {
        if (!p->tab_slots[i].key) continue;
        used++;
        uint32_t info = p->tab_slots[i].info;
        if (TAB_LIST(info) >= n_lists || TAB_FLAGS(info) >> nctx) {
            snprintf(err, errlen, "tensor tab.slots: slot %llu names list %u of %llu and "
                     "context flags 0x%x of %d context lengths", (unsigned long long)i,
                     TAB_LIST(info), (unsigned long long)n_lists, TAB_FLAGS(info), nctx);
            return -1;
        }
    }
    if (used == cap) {
        snprintf(err, errlen, "tensor tab.slots: no empty slot (a lookup of an unknown key would "
                 "never end)");
        return -1;
    }
    for (uint64_t i = 0; i < n_lists * HC_TOPK; i++)
        if (p->tab_lists[i] < -1 || p->tab_lists[i] >= p->cfg[CFG_N_LABELS]) {
            snprintf(err, errlen, "tensor tab.lists: label %d out of range", p->tab_lists[i]);
            return -1;
        }
    return 0;
}

static inline uint64_t home(const hc_policy *p, uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ull) >> p->tab_home_shift;
}

/* The slot of `key` past its home, which holds another key: linear probing up to the first empty
 * slot (rare at a load of at most 1/2). */
static const struct hc_tab_slot *find_past_home(const hc_policy *p, uint64_t key, uint64_t h) {
    uint64_t mask = p->tab_cap - 1;
    for (uint64_t i = (h + 1) & mask;; i = (i + 1) & mask) {
        const struct hc_tab_slot *q = &p->tab_slots[i];
        if (q->key == key) return q;
        if (!q->key) return NULL;
    }
}

/* The slot of `key`, or NULL. At a load of at most 1/2 the key's home slot answers in the common
 * case (it holds the key, or is empty): two compares. */
static inline const struct hc_tab_slot *find(const hc_policy *p, uint64_t key) {
    uint64_t h = home(p, key);
    const struct hc_tab_slot *q = &p->tab_slots[h];
    if (__builtin_expect(q->key == key, 1)) return q;
    return q->key ? find_past_home(p, key, h) : NULL;
}

/* The slot of context key `k`, or NULL: the filter answers most absent keys without a probe. */
static inline const struct hc_tab_slot *find_ctx(const hc_policy *p, uint64_t k) {
    uint64_t bit = k >> p->tab_filter_shift;
    if (!(p->tab_filter[bit >> 6] >> (bit & 63) & 1)) return NULL;   /* surely absent */
    return find(p, k);
}

static inline uint64_t st_key(uint32_t site, uint16_t token) {
    return key_of(2, ((uint64_t)site << 16) ^ token);
}

static inline uint64_t ctx_key(const hc_policy *p, const hc_stream *s, uint64_t x, int c) {
    return key_of((uint64_t)CTX_LEVEL(p->tab_ctx_lens[c]), x ^ s->ctx_h[c] * CTX_MUL);
}

static inline void answer_of(const hc_policy *p, const struct hc_tab_slot *e, uint32_t level,
                             struct hc_tab_answer *a) {
    a->labels = e ? p->tab_lists + (size_t)TAB_LIST(e->info) * HC_TOPK : p->tab_default;
    a->conf = e ? e->conf : p->tab_default_conf;
    a->level = e ? level : 0;
}

/* The lookup of (site, token) whose slot `e` (NULL: absent) was found already; the contexts of
 * stream s unless s is NULL, their keys computed here (answer_next has them ready). */
static void lookup_slot(const hc_policy *p, const hc_stream *s, uint32_t site, uint16_t token,
                        const struct hc_tab_slot *e, struct hc_tab_answer *a) {
    if (e) {
        unsigned flags = s ? TAB_FLAGS(e->info) : 0;
        uint64_t x = ((uint64_t)site << 16) ^ token;
        while (flags) {                      /* the longest context that holds this one */
            int c = __builtin_ctz(flags);
            flags &= flags - 1;
            const struct hc_tab_slot *ec = find_ctx(p, ctx_key(p, s, x, c));
            if (ec) {
                answer_of(p, ec, (uint32_t)(3 + p->tab_nctx - c), a);
                return;
            }
        }
        answer_of(p, e, 3, a);
        return;
    }
    if (p->tab_level_mask >> 2 & 1 && (e = find(p, key_of(1, (uint64_t)site << 16)))) {
        answer_of(p, e, 2, a);
        return;
    }
    if (p->tab_level_mask >> 1 & 1 && (e = find(p, key_of(0, token)))) {
        answer_of(p, e, 1, a);
        return;
    }
    answer_of(p, NULL, 0, a);
}

void hc_tab_answer_fill(const struct hc_tab_answer *a, hc_prediction *out) {
    const int16_t *l = a->labels;
    _Static_assert(HC_TOPK == 5, "fill copies 5 labels");
    out->label[0] = l[0], out->label[1] = l[1], out->label[2] = l[2], out->label[3] = l[3];
    out->label[4] = l[4];
    out->conf = a->conf;
    out->level = a->level;
}

static inline void lookup(const hc_policy *p, const hc_stream *s, uint32_t site, uint16_t token,
                          uint64_t kst, hc_prediction *out) {
    struct hc_tab_answer a;
    lookup_slot(p, s, site, token, find(p, kst), &a);
    hc_tab_answer_fill(&a, out);
}

void hc_table_predict(const hc_policy *p, const hc_stream *s, uint32_t site, uint16_t token,
                      int use_ctx, hc_prediction *out) {
    lookup(p, use_ctx ? s : NULL, site, token, st_key(site, token), out);
}

/* next/free: the answer for the next event, keyed by the last event fed and the tokens before
 * it. When that event was fed with `prepare` (hc_table_feed), its (site, token) slot and the keys
 * of the contexts that slot flags are ready: only those contexts are probed, longest first. */
static inline __attribute__((always_inline)) void answer_next(const hc_stream *s,
                                                              struct hc_tab_answer *a) {
    const hc_policy *p = s->p;
    const struct hc_tab_slot *e = s->tab_st;
    if (s->tab_ready && e) {
        for (unsigned flags = TAB_FLAGS(e->info); flags; flags &= flags - 1) {
            int c = __builtin_ctz(flags);
            const struct hc_tab_slot *ec = find_ctx(p, s->tab_ctx_keys[c]);
            if (ec) {
                answer_of(p, ec, (uint32_t)(3 + p->tab_nctx - c), a);
                return;
            }
        }
        answer_of(p, e, 3, a);
        return;
    }
    if (s->tab_ready) {        /* an unseen (site, token): the back-off */
        lookup_slot(p, s, s->tab_site, s->tab_token, NULL, a);
        return;
    }
    uint16_t token = s->hist_len ? s->tok_hist[(s->hist_head + HC_MAX_HIST - 1) % HC_MAX_HIST]
                                 : 0xFFFF;
    uint32_t site = s->hist_len ? s->last_site : 0;
    lookup_slot(p, s, site, token, find(p, st_key(site, token)), a);   /* keys lazily */
}

void hc_table_predict_next(const hc_stream *s, hc_prediction *out) {
    struct hc_tab_answer a;
    answer_next(s, &a);
    hc_tab_answer_fill(&a, out);
}

/* ---------------------------------------------------------------- context hashes */

/* The context of a table's key: the rolling hash h = sum over i = 1..K of (t_i + 1) P^(K - i) of
 * the K newest tokens t_1 (newest) .. t_K, padding before the stream's start (what
 * heapcast.policy.compile.context_hash computes). A new token t moves it in O(1):
 * h' = (t + 1) P^(K - 1) + (h - (t_K + 1)) / P, the division by the odd P a multiplication by its
 * inverse modulo 2^64. */
#define CTX_P 0x100000001B3ull
#define CTX_PAD 0xFFFFull

#define CTX_INV 0xCE965057AFF6957Bull   /* P^-1 modulo 2^64: CTX_P * CTX_INV == 1 */
_Static_assert(CTX_P * CTX_INV == 1, "CTX_INV is the inverse of CTX_P");

void hc_table_ctx_reset(hc_stream *s) {
    const hc_policy *p = s->p;
    for (int j = 0; j < p->cfg[CFG_TAB_CTX]; j++) {
        uint64_t h = 0;
        for (int i = 0; i < p->tab_ctx_lens[j]; i++) h = h * CTX_P + CTX_PAD + 1;
        s->ctx_h[j] = h;
    }
    /* the history before the stream's start reads as padding: no branch for it in the push */
    for (int i = 0; i < HC_MAX_HIST; i++) s->tok_hist[i] = (uint16_t)CTX_PAD;
    s->tab_ready = 0;
}

/* Feeds a table stream the event of `token` at `site`: pushes the token into its history, moving
 * each context hash by one token. With `prepare`, it also starts the lookup that predicts the
 * next event (this event's site and token, the contexts that end with it): it finds the (site,
 * token) slot and, for the context lengths that slot flags, computes the keys and prefetches the
 * slots and filter words they may read, so that in a running program those misses overlap the
 * program's own work. */
static inline __attribute__((always_inline)) void feed(hc_stream *s, uint16_t token, uint32_t site,
                                                       uint64_t ts_ns, int prepare) {
    const hc_policy *p = s->p;
    const int nctx = p->tab_nctx;
    const uint32_t head = s->hist_head;
    const uint64_t x = ((uint64_t)site << 16) ^ token;
    unsigned flags = 0;
    s->tab_ready = prepare;
    if (prepare) {
        s->tab_site = site;
        s->tab_token = token;
        s->tab_st = find(p, st_key(site, token));
        flags = s->tab_st ? TAB_FLAGS(s->tab_st->info) : 0;
    }
    for (int j = 0; j < nctx; j++) {
        uint64_t out = s->tok_hist[(head - (uint32_t)p->tab_ctx_lens[j]) % HC_MAX_HIST];
        s->ctx_h[j] = ((uint64_t)token + 1) * p->tab_pow[j] + (s->ctx_h[j] - (out + 1)) * CTX_INV;
        if (flags >> j & 1) {      /* only the contexts that hold entries under this slot */
            uint64_t k = s->tab_ctx_keys[j] = ctx_key(p, s, x, j), bit = k >> p->tab_filter_shift;
            __builtin_prefetch(&p->tab_filter[bit >> 6]);
            __builtin_prefetch(&p->tab_slots[home(p, k)]);
        }
    }
    s->tok_hist[head] = token;
    s->hist_head = (head + 1) % HC_MAX_HIST;
    if (s->hist_len < HC_MAX_HIST) s->hist_len++;
    s->last_ts = ts_ns;
    s->last_site = site;
    s->events++;
}

void hc_table_feed(hc_stream *s, uint16_t token, uint32_t site, uint64_t ts_ns, int prepare) {
    feed(s, token, site, ts_ns, prepare);
}

/* next/free in a running program (the recorder's hook), one call per event: the answer for the
 * event of `token` at `site` that is happening now (with `a`; prepared when the event before it
 * was fed), then the feed of that event. */
void hc_table_step(hc_stream *s, uint16_t token, uint32_t site, uint64_t ts_ns,
                   struct hc_tab_answer *a, int prepare) {
    if (a) answer_next(s, a);
    feed(s, token, site, ts_ns, prepare);
}

/* hc_run for a next/free table: the stream loop calling the lookup and the feed directly (what
 * hc_stream_predict and hc_stream_feed do per event, without their per-call dispatch). */
void hc_table_run_shift(hc_stream *s, const hc_event *ev, const uint8_t *want, uint64_t n,
                        hc_prediction *out) {
    const hc_policy *p = s->p;
    uint32_t site = 0;
    uint16_t token = 0xFFFF;
    uint64_t kst = st_key(site, token);
    for (uint64_t j = 0; j < n; j++) {
        if (want[j]) lookup(p, s, site, token, kst, &out[j]);   /* context keys lazily */
        token = ev[j].token != 0xFFFF ? ev[j].token : hc_event_token_inline(p, &ev[j]);
        site = ev[j].site;
        feed(s, token, site, ev[j].ts_ns, 0);
        kst = st_key(site, token);
        __builtin_prefetch(&p->tab_slots[home(p, kst)]);
    }
}
