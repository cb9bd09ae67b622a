/* heapcast policy runtime: what its source files share (not part of the public API). */
#ifndef HEAPCAST_POLICY_INTERNAL_H
#define HEAPCAST_POLICY_INTERNAL_H

#include "heapcast_policy.h"

#define HC_EXPORT __attribute__((visibility("default")))

/* Integer settings of a policy: the tensor "cfg" (int32), indexed by these. The Python compiler
 * (heapcast.policy.compile) writes them in this order. */
enum {
    CFG_ABI, CFG_KIND, CFG_TASK, CFG_VOCAB, CFG_N_LABELS, CFG_SHIFT,
    /* rnn */
    CFG_HIDDEN, CFG_N_OUT, CFG_N_IN_TOKENS, CFG_SITE_BUCKETS, CFG_N_DT, CFG_HINTS, CFG_N_CACHE,
    CFG_INT8, CFG_NG_ORDERS, CFG_NG_SITES, CFG_NG_DT, CFG_NG_TOPK, CFG_NG_CLASSES,
    /* table */
    CFG_TAB_CTX, CFG_TAB_BITS,
    CFG_COUNT
};

enum { VOCAB_SEED64 = 0, VOCAB_RICH = 1 };

#define HC_MAX_ORDERS 16
#define HC_STR_(x) #x
#define HC_STR(x) HC_STR_(x)
#define HC_MAX_HIST 64
#define HC_MAX_CACHE 8
#define HC_MAX_CTX 8                /* context lengths of a table */
#define HC_N_CONF 8                 /* confidence buckets of the n-gram hint (CONF_BOUNDS + 1) */

/* A tensor of the file, as the safetensors header described it. */
struct hc_tensor {
    const char *name;
    uint32_t name_len;
    int dtype;                      /* DT_* */
    int ndim;
    uint64_t shape[4];
    const void *data;
    uint64_t nbytes;
};
enum { DT_F32, DT_F64, DT_I8, DT_U8, DT_I16, DT_U16, DT_I32, DT_U32, DT_I64, DT_U64, DT_OTHER };

struct hc_ngram_order {             /* one order of the n-gram that gives the network its hints */
    int m;
    uint64_t n_entries, topk;
    const uint64_t *ctx;            /* context hash of each entry */
    const uint32_t *n, *d, *cnt;    /* count, distinct labels, label counts [entry][topk] */
    const uint16_t *tok16;          /* label class ids [entry][topk] (n_classes = padding) */
    const uint32_t *tok32;
    const int32_t *slots;           /* open-addressing index: entry + 1, 0 empty */
    uint32_t bits;
};

/* A table slot (tensor tab.slots, uint64 [cap, 2] on disk): the key (0: empty); `info`, the index
 * of its top-k list in tab.lists (low 24 bits) and, on a (site, token) slot, which context lengths
 * hold entries under it (bit i: tab.ctx_lens[i]; high 8 bits); the top label's confidence. */
struct hc_tab_slot { uint64_t key; uint32_t info; float conf; };
#define TAB_LIST(info) ((info) & 0xFFFFFFu)
#define TAB_FLAGS(info) ((info) >> 24)

struct hc_policy {
    void *map;                      /* the mapped file */
    size_t map_len;
    int32_t cfg[CFG_COUNT];
    int lifetime_groups;            /* tensor alloc.lifetime_groups (1 when absent) */
    char model_hash[72];
    struct hc_tensor tensors[128];
    int n_tensors;
    /* token maps */
    const int32_t *tok_map;         /* vocabulary token -> network input id (rnn) */
    uint32_t vocab_size;
    const int32_t *class_of_label;  /* label -> output class id, -1 (rnn) */
    const int64_t *classes;         /* output class id -> label */
    /* rnn: input projections [rows][3H] (fp32), recurrent and head weights */
    const float *p_tok, *p_site, *p_dt, *p_hint1, *p_hint2, *p_conf, *p_cache[HC_MAX_CACHE];
    const float *whh_t, *bhh, *head_t, *bhead, *boost, *cache_boost;
    const int8_t *q_hh, *q_head;    /* int8 weights by pairs of kept units [pairs][n][2] */
    const float *q_hh_scale, *q_head_scale;
    const int32_t *kept;            /* hidden units whose weights are kept (pruning) */
    int n_kept;
    int cache_orders[HC_MAX_CACHE];
    struct hc_ngram_order ng[HC_MAX_ORDERS];
    int n_ng, ng_max_order;
    const int32_t *ng_to_hint;      /* n-gram class id -> output class id + 1 (0: none) */
    const double *ng_base;          /* order-0 probabilities of the n-gram classes */
    const int32_t *ng_base_order;   /* n-gram classes by decreasing base probability */
    /* table */
    int tab_ctx_lens[HC_MAX_CTX];   /* descending */
    uint64_t tab_pow[HC_MAX_CTX];   /* P^(len - 1) of each length */
    int32_t tab_level_mask;         /* bit `level` set: the level has entries */
    const struct hc_tab_slot *tab_slots;   /* [tab_cap], 16-byte aligned */
    size_t tab_copy_len;            /* bytes of the aligned copy of tab.slots (0: none) */
    const uint64_t *tab_filter;     /* tab.ctx_filter: a bit per hash of the context keys */
    int tab_filter_shift;           /* 64 - log2(bits in the filter) */
    int tab_home_shift;             /* 64 - cfg[tab_bits]: a key's home slot is its hash >> it */
    int tab_nctx;                   /* cfg[tab_ctx] */
    const int16_t *tab_lists;       /* [list][HC_TOPK]: the distinct top-k lists */
    uint64_t tab_cap;
    int16_t tab_default[HC_TOPK];
    float tab_default_conf;
};

/* Per-stream state (mmap'd; hc_stream_open). */
struct hc_stream {
    const hc_policy *p;
    size_t map_len;
    uint64_t events;                /* events fed */
    uint64_t skip_until;            /* rnn: rows before it only feed the histories (hc_run) */
    uint64_t last_ts;
    uint32_t last_site;             /* of the last event fed */
    /* symbol histories, newest first at index (head - 1) */
    uint64_t hint_sym[HC_MAX_HIST], mem_sym[HC_MAX_HIST];
    uint16_t tok_hist[HC_MAX_HIST];
    uint32_t hist_len;              /* events in the histories (saturates at HC_MAX_HIST) */
    uint64_t ctx_h[HC_MAX_CTX];     /* table: rolling hash of the last tab_ctx_lens[i] tokens */
    uint32_t hist_head;
    /* table, next/free: the next lookup's (site, token), key and slot and the keys of the
     * contexts it flags, computed when the event before it was fed (hc_table_feed) */
    uint64_t tab_ctx_keys[HC_MAX_CTX];
    const struct hc_tab_slot *tab_st;   /* its (site, token) slot, NULL if absent */
    uint32_t tab_site;
    uint16_t tab_token;
    int tab_ready;
    /* rnn */
    float *h, *gi, *gh, *logits;
    double *ng_acc;                 /* n-gram score accumulator (zero between uses) */
    int32_t *ng_touched;
    int32_t hint1, hint2, conf, cache[HC_MAX_CACHE];
    uint64_t mem_ctx[HC_MAX_CACHE]; /* the in-run memory's contexts of the row to predict */
    /* the in-run memory: per cache order, open addressing (ctx -> label) */
    uint64_t *mem_keys[HC_MAX_CACHE];
    int32_t *mem_vals[HC_MAX_CACHE];
    uint64_t mem_cap, mem_used[HC_MAX_CACHE];
    int16_t *hp;                    /* int8 path: the kept units' quantized state, by pairs */
    int32_t *acc;                   /* integer accumulators of the int8 path */
    int have_pred;
    hc_prediction pred;
};

/* shared helpers */
static inline uint64_t hc_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- tokens (what hc_rich_token, hc_seed64_token and hc_event_token export; inline here for the
 * recorder's and the allocator's per-event paths) */
static inline int hc_bit_length(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* The rich vocabulary's size class: exact below 8, then 4 classes per power of two, 124 above 2^32. */
static inline int hc_fine_size_class(uint64_t s) {
    int bl = hc_bit_length(s);
    if (bl > 32) return 124;
    if (bl <= 3) return (int)s;
    int e = bl - 1;
    return 8 + 4 * (e - 3) + (int)((s >> (e - 2)) & 3);
}

static inline uint16_t hc_rich_token_inline(int op, uint64_t size, int free_null, int free_unknown) {
    if (op == HC_OP_FREE) {
        if (free_null) return 1000;
        if (free_unknown) return 1001;
    }
    return (uint16_t)(op * 125 + hc_fine_size_class(size));
}

static inline uint16_t hc_seed64_token_inline(int op, uint64_t size) {
    int c = hc_bit_length(size);
    if (c > 31) c = 31;
    return (uint16_t)(op == HC_OP_FREE || op == HC_OP_MUNMAP ? 32 + c : c);
}

static inline uint16_t hc_event_token_inline(const hc_policy *p, const hc_event *ev) {
    if (ev->token != 0xFFFF) return ev->token;
    if (p->cfg[CFG_VOCAB] == VOCAB_SEED64)
        return hc_seed64_token_inline(ev->op, ev->free_null || ev->free_unknown ? 0 : ev->size);
    return hc_rich_token_inline(ev->op, ev->size, ev->free_null, ev->free_unknown);
}

/* ---- the loaded module that holds an address (modmap.c), without the loader's lock: glibc's
 * _dl_find_object (2.35). dl_iterate_phdr takes dl_load_write_lock, which glibc's fork leaves
 * held in a child when another thread was inside it, and which a program's own callback may hold
 * while it waits for a lock that an allocating thread holds. */
struct hc_found_module { uint64_t lo, hi, base; const char *name; };   /* name: "" = the program */
int hc_have_find_object(void);   /* 0 where glibc has no _dl_find_object */
int hc_find_module(uintptr_t pc, struct hc_found_module *out);   /* 1 if a module holds pc */
/* dlcloses so far (the runtime's dlclose, hc_modules_changed): an address keyed in an older
 * generation may now lie in another library. The recorder checks its locations again in a new
 * one (recorder.c, entry_current). */
extern uint32_t hc_modules_gen;

/* ---- call-site keys: modmap.c's cache of recent answers, read inline by per-event paths */
#define HC_SITE_CACHE_BITS 12
struct hc_site_cache_entry { uint64_t tag; uint32_t key; };
extern struct hc_site_cache_entry hc_site_cache[1 << HC_SITE_CACHE_BITS];
uint32_t hc_site_resolve(uintptr_t ra);     /* a miss of the cache: resolves and caches */

/* hc_site_of_address: an entry is checked by its tag (address ^ key), so that a torn entry read
 * while another thread writes it is not believed. */
static inline uint32_t hc_site_of_address_inline(uintptr_t ra) {
    if (!ra) return 0;
    uint64_t i = ((uint64_t)ra * 0x9E3779B97F4A7C15ull) >> (64 - HC_SITE_CACHE_BITS);
    uint32_t key = __atomic_load_n(&hc_site_cache[i].key, __ATOMIC_RELAXED);
    if ((__atomic_load_n(&hc_site_cache[i].tag, __ATOMIC_RELAXED) ^ key) == (uint64_t)ra && key)
        return key;
    return hc_site_resolve(ra);
}

/* Pushes an event's symbols into an rnn stream's histories (a table's: hc_table_feed). */
static inline void hc_push_history(hc_stream *s, uint64_t hint_sym, uint64_t mem_sym,
                                   uint16_t token) {
    uint32_t i = s->hist_head;
    s->hint_sym[i] = hint_sym;
    s->mem_sym[i] = mem_sym;
    s->tok_hist[i] = token;
    s->hist_head = (i + 1) % HC_MAX_HIST;
    if (s->hist_len < HC_MAX_HIST) s->hist_len++;
}

/* The i-th newest symbol of a history (i >= 1), or the padding before the stream's start. */
#define HC_PAD 0xFFFFFFFFFFFFull
static inline uint64_t hc_hist(const hc_stream *s, const uint64_t *hist, uint32_t i) {
    return i <= s->hist_len ? hist[(s->hist_head + HC_MAX_HIST - i) % HC_MAX_HIST] : HC_PAD;
}

const struct hc_tensor *hc_find_tensor(const hc_policy *p, const char *name);
void *hc_map_anon(size_t n);
void hc_unmap(void *p, size_t n);
uint32_t hc_slot_probe(const int32_t *slots, uint32_t bits, const uint64_t *keys, uint64_t key);

/* rnn.c / table.c: kind-specific loading and stepping */
int hc_rnn_load(hc_policy *p, char *err, size_t errlen);
int hc_table_load(hc_policy *p, char *err, size_t errlen);
size_t hc_rnn_stream_bytes(const hc_policy *p, uint64_t mem_cap);
void hc_rnn_stream_init(hc_stream *s, char *mem);
void hc_rnn_start(hc_stream *s);
void hc_rnn_feed(hc_stream *s, uint32_t site, uint16_t token, int dt, uint64_t hint_sym,
                 uint64_t mem_sym, int32_t label, int want_pred);
void hc_table_predict(const hc_policy *p, const hc_stream *s, uint32_t site, uint16_t token,
                      int use_ctx, hc_prediction *out);
/* A table's answer: its top-k list (int16, -1 padding), the top label's confidence, the level. */
struct hc_tab_answer { const int16_t *labels; float conf; uint32_t level; };
void hc_tab_answer_fill(const struct hc_tab_answer *a, hc_prediction *out);
void hc_table_predict_next(const hc_stream *s, hc_prediction *out);
void hc_table_ctx_reset(hc_stream *s);
void hc_table_feed(hc_stream *s, uint16_t token, uint32_t site, uint64_t ts_ns, int prepare);
void hc_table_step(hc_stream *s, uint16_t token, uint32_t site, uint64_t ts_ns,
                   struct hc_tab_answer *a, int prepare);
void hc_table_run_shift(hc_stream *s, const hc_event *ev, const uint8_t *want, uint64_t n,
                        hc_prediction *out);

#endif
