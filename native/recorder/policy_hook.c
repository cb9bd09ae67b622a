/* heapcast recorder: a compiled policy run online on the traced program's own events
 * (`heapcast record --policy POLICY [--policy-every N]`, the MLGO "release mode").
 *
 * The recorder calls hc_hook_event after it has written each event. The hook turns the event into
 * what the policy reads (the call-site key of its return address, its token: a free's token needs
 * the size of the block it frees, so the hook keeps a map of live blocks), asks the policy for a
 * prediction every N events and logs it, keyed by the seq of the event it predicted, in
 * <pid>.pred in the trace directory (docs/trace-format.md, "Predictions").
 *   next:     one stream per thread (the task's thread order); the prediction of an event is the
 *             one made before it happened, from the events before it on its thread.
 *   lifetime: one stream per process, under a lock (the task's process order; threads that
 *             allocate at the same moment may be fed in an order other than seq's); predicted at
 *             each allocation.
 * Like the recorder it never allocates through the hooked functions (everything is mmap'd), and a
 * signal handler's event that interrupts the hook on the same thread is left out (counted).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../policy/internal.h"
#include "own_file.h"
#include "policy_hook.h"
#include "quiet.h"
#include "raw_format.h"

#define PRED_MAGIC "HCPRED1"
/* Records buffered per thread before a write: each write(2) costs microseconds here (the kernel's
 * speculation mitigations), a few ns per prediction at 2048 records (32 KB) on every event. */
#define PRED_BUF 8192
#define FEAT_BUF 2048
#define MAX_THREADS 4096

/* A prediction, 16 bytes (version 2): the seq of the event it predicted (bits 0-39), the top
 * label's confidence in 1/255 (bits 40-47) and the top label (bits 48-63), then labels 2-5; labels
 * are int16, -1 padding. */
struct pred_rec { uint64_t seq_conf_top; int16_t label[HC_TOPK - 1]; };
#define PRED_VERSION 2

struct pred_header {                    /* 128 bytes at the start of <pid>.pred */
    char magic[8];
    uint32_t version, task;
    uint32_t every, kind;
    uint32_t vocab, pad0;
    uint64_t skipped;                   /* events left out (nested in a signal handler) */
    char model_sha256[72];
    char pad[16];
};
_Static_assert(sizeof(struct pred_header) == 128, "pred header");
_Static_assert(sizeof(struct pred_rec) == 16, "pred record");

/* Development mode (--log-features): what the policy read and decided, per decision. */
struct feat_rec {                       /* 64 bytes */
    uint64_t seq;
    uint32_t stream;                    /* the thread (next) in order of first event; 0 lifetime */
    uint32_t site;                      /* the event's call-site key */
    uint16_t token;                     /* the event's token */
    uint8_t dt;                         /* bit_length of ns since the stream's previous event */
    uint8_t level;                      /* table: the key level that answered */
    int32_t label;                      /* the event's true label when known then (next), or -1 */
    int32_t hint1, hint2;               /* rnn: the n-gram's hints for this row (class id + 1) */
    uint8_t conf;                       /* rnn: the hint's confidence bucket */
    uint8_t n_cache;
    uint16_t pad;
    int32_t cache[3];                   /* rnn: the in-run memory (class id + 1) */
    int32_t pred[3];                    /* the decision: top labels */
    float pred_conf;
};
_Static_assert(sizeof(struct feat_rec) == 64, "feature record");

struct hook_thread {
    hc_stream *s;
    uint64_t countdown;                 /* events before this stream's next prediction */
    uint32_t n, nf;                     /* records in buf, fbuf */
    uint32_t index;
    struct pred_rec buf[PRED_BUF];
    struct feat_rec fbuf[FEAT_BUF];
};

int hc_hook_on;
static hc_policy *g_pol;
static int g_every = 1, g_thread_streams, g_uses_time, g_features;
static struct hc_file g_pred = {.fd = -1}, g_feat = {.fd = -1};   /* (own_file.h) */
static int g_table_next;                /* a next-event table: the hook steps its stream directly */
static char g_dir[4096];
static hc_stream *g_proc_stream;
static uint64_t g_proc_countdown;    /* allocations before the next lifetime prediction */
static volatile int g_proc_lock, g_map_lock;
static struct hook_thread *g_threads[MAX_THREADS];
static int g_nthreads;
static uint64_t g_skipped;
static __thread struct hook_thread *t_state __attribute__((tls_model("initial-exec")));
static __thread int t_inside __attribute__((tls_model("initial-exec")));

static void lock(volatile int *l) {
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(l, __ATOMIC_RELAXED)) __builtin_ia32_pause();
}

static void unlock(volatile int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

/* ---------------------------------------------------------------- live blocks: address -> token */

/* What a free needs of the block it frees is its token (the policy's token of a free of that
 * size): each live block's is kept in one 8-byte entry, the address in the low 48 bits (a user
 * address is below 2^48; a block above it is not kept) and the token in the high 16.
 * Open addressing with backward-shift deletion, under one lock. The home slot of an address is
 * its own bits (address / 32, the higher bits folded in), not a scrambling hash: malloc hands out
 * neighbouring addresses together and programs free them together, so neighbouring blocks share
 * the map's cache lines and pages, and the map mirrors the heap at 1/4 of its size (a scrambling
 * hash made every event a cache and TLB miss on py_dicts). The map starts at 2^MAP_MIN_LOG2 slots
 * and doubles past half load; at 2^MAP_MAX_LOG2 slots and 3/4 load new blocks are not kept
 * (their frees then read as frees of unknown blocks). */
#define MAP_MIN_LOG2 16
#define MAP_MAX_LOG2 27
#define ADDR_MASK ((1ull << 48) - 1)
static uint64_t *g_map;                 /* [2^g_map_log2]: address | token << 48, 0 empty */
static uint64_t g_map_used;
static int g_map_log2;

static inline uint64_t map_home(uint64_t a, int log2) {
    return ((a >> 5) ^ (a >> (5 + log2))) & ((1ull << log2) - 1);
}

static void map_insert(uint64_t *map, int log2, uint64_t entry) {
    uint64_t mask = (1ull << log2) - 1;
    for (uint64_t i = map_home(entry & ADDR_MASK, log2);; i = (i + 1) & mask)
        if (!map[i]) {
            map[i] = entry;
            return;
        }
}

/* Doubles the map (under the lock); 0 if it cannot (then it stays as it is). */
static int map_grow(void) {
    if (g_map_log2 >= MAP_MAX_LOG2) return 0;
    struct quiet q;   /* (a mapping: quiet.h) */
    quiet_begin(&q);
    uint64_t *next = hc_map_anon((size_t)8 << (g_map_log2 + 1));
    quiet_end(&q);
    if (!next) return 0;
    for (uint64_t i = 0; i < 1ull << g_map_log2; i++)
        if (g_map[i]) map_insert(next, g_map_log2 + 1, g_map[i]);
    quiet_begin(&q);
    hc_unmap(g_map, (size_t)8 << g_map_log2);
    quiet_end(&q);
    g_map = next;
    g_map_log2++;
    return 1;
}

/* map_put and map_take run under the lock that hc_hook_event holds for them. */
static void map_put(uint64_t a, uint16_t token) {
    if (a > ADDR_MASK) return;
    uint64_t entry = a | (uint64_t)token << 48;
    uint64_t mask = (1ull << g_map_log2) - 1;
    for (uint64_t i = map_home(a, g_map_log2);; i = (i + 1) & mask) {
        if ((g_map[i] & ADDR_MASK) == a) { g_map[i] = entry; break; }
        if (g_map[i] == 0) {
            if (2 * (g_map_used + 1) > 1ull << g_map_log2 && map_grow()) {
                map_insert(g_map, g_map_log2, entry);
                g_map_used++;
            } else if (4 * (g_map_used + 1) <= 3ull << g_map_log2) {
                g_map[i] = entry;
                g_map_used++;
            }
            break;
        }
    }
}

/* Removes `a`; the token of its free, or -1 if it was not a live block. */
static int32_t map_take(uint64_t a) {
    int32_t token = -1;
    if (a > ADDR_MASK) return -1;
    uint64_t mask = (1ull << g_map_log2) - 1, i = map_home(a, g_map_log2);
    for (;; i = (i + 1) & mask) {
        if (g_map[i] == 0) goto done;
        if ((g_map[i] & ADDR_MASK) == a) break;
    }
    token = (int32_t)(g_map[i] >> 48);
    g_map_used--;
    for (uint64_t j = (i + 1) & mask;; j = (j + 1) & mask) {   /* backward shift */
        if (g_map[j] == 0) break;
        uint64_t h = map_home(g_map[j] & ADDR_MASK, g_map_log2);
        if (((j - h) & mask) >= ((j - i) & mask)) {
            g_map[i] = g_map[j];
            i = j;
        }
    }
    g_map[i] = 0;
done:
    return token;
}

/* ---------------------------------------------------------------- the predictions file */

/* Writes to f, checked (own_file.h); a full disk ends the file early (its records stay whole). */
static void write_file(struct hc_file *f, const void *buf, size_t n) {
    const char *p = buf;
    int fd = n ? hc_file_fd(f) : -1;
    while (n > 0 && fd >= 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void flush_thread(struct hook_thread *ht) {
    struct quiet q;   /* (writes are cancellation points, and can fail: quiet.h) */
    quiet_begin(&q);
    if (ht && ht->n) {
        write_file(&g_pred, ht->buf, ht->n * sizeof ht->buf[0]);
        ht->n = 0;
    }
    if (ht && ht->nf) {
        write_file(&g_feat, ht->fbuf, ht->nf * sizeof ht->fbuf[0]);
        ht->nf = 0;
    }
    quiet_end(&q);
}

static int open_pred_file(void) {
    char path[4200];
    int pid = (int)getpid();
    char num[16];
    int k = 0;
    do { num[k++] = (char)('0' + pid % 10); pid /= 10; } while (pid);
    size_t d = strlen(g_dir);
    memcpy(path, g_dir, d);
    path[d++] = '/';
    while (k) path[d++] = num[--k];
    memcpy(path + d, ".pred", 6);
    if (hc_file_keep(&g_pred, open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), path,
                     O_WRONLY, 1) < 0)
        return 0;
    if (g_features) {
        memcpy(path + d, ".features", 10);
        if (hc_file_keep(&g_feat, open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600),
                         path, O_WRONLY, 1) < 0)
            return 0;
    }
    struct pred_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, PRED_MAGIC, 8);
    h.version = PRED_VERSION;
    h.task = (uint32_t)hc_policy_task(g_pol);
    h.every = (uint32_t)g_every;
    h.kind = (uint32_t)hc_policy_kind(g_pol);
    h.vocab = (uint32_t)g_pol->cfg[CFG_VOCAB];
    strncpy(h.model_sha256, hc_policy_model_hash(g_pol), sizeof h.model_sha256 - 1);
    write_file(&g_pred, &h, sizeof h);
    if (g_feat.fd >= 0) {
        memcpy(h.magic, "HCFEAT1", 8);
        h.version = 1;
        write_file(&g_feat, &h, sizeof h);
    }
    return 1;
}

/* ---------------------------------------------------------------- setup */

int hc_hook_init(const char *policy_path, const char *dir, int every, int features) {
    if (!policy_path || !*policy_path || strlen(dir) >= sizeof g_dir) return 0;
    char err[512];
    g_pol = hc_policy_open(policy_path, err, sizeof err);
    if (!g_pol) return 0;                /* `heapcast record` checked it before starting us */
    int task = hc_policy_task(g_pol);
    if (task == HC_TASK_FREE) return 0;  /* refused up front by `heapcast record` */
    g_every = every > 0 ? every : 1;
    g_features = features;
    g_thread_streams = task == HC_TASK_NEXT;
    g_table_next = g_thread_streams && g_pol->cfg[CFG_KIND] == HC_KIND_TABLE;
    g_uses_time = g_pol->cfg[CFG_KIND] == HC_KIND_RNN &&
                  (g_pol->cfg[CFG_N_DT] || g_pol->cfg[CFG_NG_DT]);
    memcpy(g_dir, dir, strlen(dir) + 1);
    g_map_log2 = MAP_MIN_LOG2;
    g_map = hc_map_anon((size_t)8 << MAP_MIN_LOG2);
    if (!g_map || !open_pred_file()) return 0;
    if (!g_thread_streams && !(g_proc_stream = hc_stream_open(g_pol))) return 0;
    __atomic_store_n(&hc_hook_on, 1, __ATOMIC_RELEASE);
    return 1;
}

/* In a fork child: its own file, its streams start afresh (a child's events are a new stream of
 * a new process), the parent's live blocks stay known. */
void hc_hook_fork_child(void) {
    if (!hc_hook_on) return;
    g_proc_lock = g_map_lock = 0;
    hc_file_forget(&g_pred);   /* (the parent's files) */
    hc_file_forget(&g_feat);
    for (int i = 0; i < g_nthreads; i++)
        if (g_threads[i] && g_threads[i] != t_state)
            g_threads[i]->n = g_threads[i]->nf = 0;                          /* parent's records */
    if (t_state) {
        t_state->n = t_state->nf = 0;
        t_state->countdown = 0;
        if (t_state->s) hc_stream_reset(t_state->s);
    }
    if (g_proc_stream) hc_stream_reset(g_proc_stream);
    g_proc_countdown = 0;
    g_skipped = 0;
    if (!open_pred_file()) __atomic_store_n(&hc_hook_on, 0, __ATOMIC_RELEASE);
}

void hc_hook_flush_all(void) {
    if (!hc_hook_on) return;
    int n = __atomic_load_n(&g_nthreads, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) flush_thread(g_threads[i]);
    int fd = hc_file_fd(&g_pred);
    if (fd >= 0)          /* the count of events left out, in the header */
        pwrite(fd, &g_skipped, sizeof g_skipped, offsetof(struct pred_header, skipped));
}

static struct hook_thread *thread_state(void) {
    struct hook_thread *ht = t_state;
    if (ht) return ht;
    struct quiet q;   /* (mappings: quiet.h) */
    quiet_begin(&q);
    ht = hc_map_anon(sizeof *ht);
    if (ht && g_thread_streams && !(ht->s = hc_stream_open(g_pol))) {
        hc_unmap(ht, sizeof *ht);
        ht = NULL;
    }
    quiet_end(&q);
    if (!ht) return NULL;
    int i = __atomic_fetch_add(&g_nthreads, 1, __ATOMIC_ACQ_REL);
    if (i < MAX_THREADS) g_threads[i] = ht;
    ht->index = (uint32_t)i;
    t_state = ht;
    return ht;
}

/* ---------------------------------------------------------------- per event */

static inline int kind_of(int op) {
    switch (op) {
    case HC_MALLOC: return HC_OP_MALLOC;
    case HC_CALLOC: return HC_OP_CALLOC;
    case HC_REALLOC: case HC_REALLOCARRAY: return HC_OP_REALLOC;
    case HC_FREE: return HC_OP_FREE;
    case HC_MMAP: return HC_OP_MMAP;
    case HC_MUNMAP: return HC_OP_MUNMAP;
    case HC_MREMAP: return HC_OP_MREMAP;
    default: return HC_OP_ALIGNED;
    }
}

/* Logs a prediction: its labels as the table stores them (int16, -1 padding) and confidence. */
static inline void log_labels(struct hook_thread *ht, uint64_t seq, const int16_t *label,
                              float conf) {
    struct pred_rec *r = &ht->buf[ht->n];
    float c = conf < 0 ? 0 : conf > 1 ? 1 : conf;
    r->seq_conf_top = (seq & ((1ull << 40) - 1)) | (uint64_t)(uint8_t)(c * 255.0f + 0.5f) << 40 |
                      (uint64_t)(uint16_t)label[0] << 48;
    memcpy(r->label, label + 1, sizeof r->label);
    if (++ht->n == PRED_BUF) flush_thread(ht);
}

static void log_prediction(struct hook_thread *ht, uint64_t seq, const hc_prediction *pr) {
    int16_t label[HC_TOPK];
    for (int i = 0; i < HC_TOPK; i++) label[i] = (int16_t)pr->label[i];
    log_labels(ht, seq, label, pr->conf);
}

/* Development mode: the features a decision reads (the stream's inputs prepared for this row),
 * written into the thread's buffer before the decision ... */
static struct feat_rec *features_begin(struct hook_thread *ht, const hc_stream *s, uint64_t seq,
                                       const hc_event *ev, int32_t label) {
    struct feat_rec *f = &ht->fbuf[ht->nf];
    memset(f, 0, sizeof *f);
    f->seq = seq;
    f->stream = g_thread_streams ? ht->index : 0;
    f->site = ev->site;
    f->token = ev->token;
    uint64_t d = s->events && ev->ts_ns > s->last_ts ? ev->ts_ns - s->last_ts : 0;
    int bl = d ? 64 - __builtin_clzll(d) : 0;
    f->dt = (uint8_t)(bl > 63 ? 63 : bl);
    f->label = label;
    if (g_pol->cfg[CFG_KIND] == HC_KIND_RNN) {
        f->hint1 = s->hint1;
        f->hint2 = s->hint2;
        f->conf = (uint8_t)s->conf;
        f->n_cache = (uint8_t)(g_pol->cfg[CFG_N_CACHE] < 3 ? g_pol->cfg[CFG_N_CACHE] : 3);
        for (int i = 0; i < f->n_cache; i++) f->cache[i] = s->cache[i];
    }
    return f;
}

/* ... and the decision, after it. */
static void features_end(struct hook_thread *ht, struct feat_rec *f, const hc_prediction *pr) {
    for (int i = 0; i < 3; i++) f->pred[i] = pr->label[i];
    f->pred_conf = pr->conf;
    f->level = (uint8_t)pr->level;
    if (++ht->nf == FEAT_BUF) flush_thread(ht);
}

void hc_hook_event(int op, uint64_t seq, uint64_t addr, uint64_t size, uint64_t old,
                   const void *callsite) {
    if (t_inside) {          /* a signal handler's event inside the hook: left out, counted */
        __atomic_fetch_add(&g_skipped, 1, __ATOMIC_RELAXED);
        return;
    }
    t_inside = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    struct hook_thread *ht = thread_state();
    if (!ht) goto out;
    hc_event ev;
    ev.site = hc_site_of_address_inline((uintptr_t)callsite);
    ev.op = (uint16_t)kind_of(op);
    ev.token = 0xFFFF;
    ev.size = size;
    ev.ts_ns = 0;
    ev.free_null = ev.free_unknown = 0;
    if (g_uses_time) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ev.ts_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    }
    /* one lock per event: the map's, or for lifetime the process stream's, which covers both */
    volatile int *lk = g_thread_streams ? &g_map_lock : &g_proc_lock;
    lock(lk);
    /* the live-block map, as the trace tools' block matching sees it; the event's token, once
     * (the runtime reads it as given) */
    if (op == HC_FREE) {
        int32_t tok = addr ? map_take(addr) : -1;
        ev.free_null = addr == 0;
        ev.free_unknown = addr != 0 && tok < 0;
        ev.size = 0;
        ev.token = tok >= 0 ? (uint16_t)tok : hc_event_token_inline(g_pol, &ev);
    } else {
        ev.token = hc_event_token_inline(g_pol, &ev);
        if (op <= HC_PVALLOC) {
            if ((op == HC_REALLOC || op == HC_REALLOCARRAY) && old && (addr || size == 0))
                map_take(old);
            if (addr) {          /* the token its free will have */
                hc_event fr = {.op = HC_OP_FREE, .token = 0xFFFF, .size = size};
                map_put(addr, hc_event_token_inline(g_pol, &fr));
            }
        }
    }
    if (g_table_next) {              /* next, a table: its answer straight into the log */
        unlock(lk);
        int now = ht->countdown == 0;
        ht->countdown = now ? (uint64_t)g_every - 1 : ht->countdown - 1;
        struct hc_tab_answer a;
        struct feat_rec *f = now && g_features
                                 ? features_begin(ht, ht->s, seq, &ev, (int32_t)ev.token) : NULL;
        hc_table_step(ht->s, ev.token, ev.site, ev.ts_ns, now ? &a : NULL, ht->countdown == 0);
        if (f) {
            hc_prediction pr;
            hc_tab_answer_fill(&a, &pr);
            features_end(ht, f, &pr);
        }
        if (now) log_labels(ht, seq, a.labels, a.conf);
    } else if (g_thread_streams) {   /* next: predicted before it happens, on its thread */
        unlock(lk);
        int32_t label = (int32_t)ev.token;
        int now = ht->countdown == 0;
        if (now) {
            hc_prediction pr;
            struct feat_rec *f = g_features ? features_begin(ht, ht->s, seq, &ev, label) : NULL;
            hc_stream_predict(ht->s, &pr);
            if (f) features_end(ht, f, &pr);
            log_prediction(ht, seq, &pr);
        }
        ht->countdown = now ? (uint64_t)g_every - 1 : ht->countdown - 1;
        hc_stream_feed_ex(ht->s, &ev, label, ht->countdown == 0);
    } else {                          /* lifetime: one stream per process */
        int alloc = op <= HC_PVALLOC, now = alloc && g_proc_countdown == 0;
        if (alloc) g_proc_countdown = now ? (uint64_t)g_every - 1 : g_proc_countdown - 1;
        if (now) {
            hc_prediction pr;
            struct feat_rec *f = g_features ? features_begin(ht, g_proc_stream, seq, &ev, -1)
                                            : NULL;
            hc_predict_alloc(g_pol, g_proc_stream, &ev, &pr);
            if (f) features_end(ht, f, &pr);
            unlock(lk);
            log_prediction(ht, seq, &pr);
        } else {
            hc_stream_feed_ex(g_proc_stream, &ev, -1, 0);
            unlock(lk);
        }
    }
out:
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    t_inside = 0;
}
