/* heapcast policy runtime: the `table` kind, a distilled lookup for nanosecond budgets.
 *
 * The compiler ran the model over traces and stored, per key, the labels it predicted most often
 * there (top-k, and the share of the top one). Keys, most specific first (docs/policy-format.md):
 *   (call site, token, hash of the K tokens before the row) for each K of tab.ctx_lens, longest
 *   first (a back-off over context lengths, as an n-gram's), then
 *   (call site, token), (call site), (token), and a default when no key is known. A lookup is a hash and a short linear probe per level in
 * one open-addressing array of 64-bit keys, whose slot index is also the row of the label table.
 */
#include <stdio.h>

#include "internal.h"

/* The key of a level (heapcast.policy.compile.table_key computes the same in numpy). */
/* The key level of a context of K tokens. */
#define CTX_LEVEL(k) (100 + (k))

static inline uint64_t table_key(int level, uint32_t site, uint32_t token, uint64_t ctx) {
    uint64_t k = hc_mix64(hc_mix64(((uint64_t)level << 56) ^ ((uint64_t)site << 16) ^ token) ^ ctx);
    return k ? k : 1;
}

HC_EXPORT uint64_t hc_table_key(int level, uint32_t site, uint32_t token, uint64_t ctx) {
    return table_key(level, site, token, ctx);
}

int hc_table_load(hc_policy *p, char *err, size_t errlen) {
    int bits = p->cfg[CFG_TAB_BITS];
    if (bits < 1 || bits > 31) {
        snprintf(err, errlen, "cfg[tab_bits] is %d: expected 1..31", bits);
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
    const struct hc_tensor *k = hc_find_tensor(p, "tab.keys"), *l = hc_find_tensor(p, "tab.labels"),
                           *c = hc_find_tensor(p, "tab.conf"), *d = hc_find_tensor(p, "tab.default"),
                           *dc = hc_find_tensor(p, "tab.default_conf");
    if (!k || k->dtype != DT_U64 || k->ndim != 1 || k->shape[0] != cap) {
        snprintf(err, errlen, "tensor tab.keys: expected uint64[%llu]", (unsigned long long)cap);
        return -1;
    }
    if (!l || l->dtype != DT_I16 || l->ndim != 2 || l->shape[0] != cap || l->shape[1] != HC_TOPK) {
        snprintf(err, errlen, "tensor tab.labels: expected int16[%llu, %d]",
                 (unsigned long long)cap, HC_TOPK);
        return -1;
    }
    if (!c || c->dtype != DT_F32 || c->ndim != 1 || c->shape[0] != cap) {
        snprintf(err, errlen, "tensor tab.conf: expected float32[%llu]", (unsigned long long)cap);
        return -1;
    }
    if (!d || d->dtype != DT_I16 || d->ndim != 1 || d->shape[0] != HC_TOPK || !dc ||
        dc->dtype != DT_F32 || dc->ndim != 1 || dc->shape[0] != 1) {
        snprintf(err, errlen, "tensors tab.default, tab.default_conf: expected int16[%d], "
                 "float32[1]", HC_TOPK);
        return -1;
    }
    /* levels that hold entries (bit `level`): the others are not probed */
    const struct hc_tensor *lm = hc_find_tensor(p, "tab.level_mask");
    p->tab_level_mask = lm && lm->dtype == DT_I32 && lm->ndim == 1 && lm->shape[0] == 1
                            ? *(const int32_t *)lm->data : -1;
    p->tab_keys = k->data;
    p->tab_labels = l->data;
    p->tab_conf = c->data;
    p->tab_cap = cap;
    const int16_t *dl = d->data;
    for (int i = 0; i < HC_TOPK; i++) p->tab_default[i] = dl[i];
    p->tab_default_conf = *(const float *)dc->data;
    uint64_t used = 0;
    for (uint64_t i = 0; i < cap; i++) used += p->tab_keys[i] != 0;
    if (used == cap) {
        snprintf(err, errlen, "tensor tab.keys: no empty slot (a lookup of an unknown key would "
                 "never end)");
        return -1;
    }
    for (uint64_t i = 0; i < cap * HC_TOPK; i++)
        if (p->tab_labels[i] < -1 || p->tab_labels[i] >= p->cfg[CFG_N_LABELS]) {
            snprintf(err, errlen, "tensor tab.labels: label %d out of range", p->tab_labels[i]);
            return -1;
        }
    return 0;
}

static inline int64_t find(const hc_policy *p, uint64_t key) {
    uint64_t mask = p->tab_cap - 1;
    uint64_t i = (key * 0x9E3779B97F4A7C15ull) >> (64 - p->cfg[CFG_TAB_BITS]);
    for (;;) {
        uint64_t k = p->tab_keys[i];
        if (k == key) return (int64_t)i;
        if (k == 0) return -1;
        i = (i + 1) & mask;
    }
}

void hc_table_predict(const hc_policy *p, const hc_stream *s, uint32_t site, uint16_t token,
                      int use_ctx, hc_prediction *out) {
    int nctx = use_ctx && s ? p->cfg[CFG_TAB_CTX] : 0;
    uint64_t ctx[HC_MAX_CTX];
    for (int i = 0; i < nctx; i++) ctx[i] = hc_mix64(s->ctx_h[i]);
    /* most specific first; `level` counts from the coarsest key (1: token) up */
    int top = 3 + nctx;
    for (int lv = top; lv >= 1; lv--) {
        if (!(p->tab_level_mask >> lv & 1)) continue;
        uint64_t key;
        if (lv > 3) key = table_key(CTX_LEVEL(p->tab_ctx_lens[top - lv]), site, token, ctx[top - lv]);
        else if (lv == 3) key = table_key(2, site, token, 0);
        else if (lv == 2) key = table_key(1, site, 0, 0);
        else key = table_key(0, 0, token, 0);
        int64_t slot = find(p, key);
        if (slot < 0) continue;
        const int16_t *l = p->tab_labels + (size_t)slot * HC_TOPK;
        for (int j = 0; j < HC_TOPK; j++) out->label[j] = l[j];
        out->conf = p->tab_conf[slot];
        out->level = (uint32_t)lv;
        return;
    }
    for (int j = 0; j < HC_TOPK; j++) out->label[j] = p->tab_default[j];
    out->conf = p->tab_default_conf;
    out->level = 0;
}
