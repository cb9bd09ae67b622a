/* heapcast policy runtime: the C API (libheapcast_policy.so, and linkable as an object into the
 * recorder and the allocator).
 *
 * A POLICY file (docs/policy-format.md) is a model compiled by `heapcast compile`: a safetensors
 * file whose tensors are the lookup tables or the network, and whose metadata says what it
 * predicts. This runtime loads one (mmap, no heap allocation through malloc), keeps per-stream
 * state in memory the caller provides or that the runtime maps itself, and predicts with no
 * Python, torch or onnxruntime in the process. Everything is deterministic: the same events give
 * the same predictions on every run, thread count and CPU (the SIMD paths sum in the same order
 * as the portable one).
 *
 * Thread safety: a loaded hc_policy is read-only and shared by all threads; an hc_stream is the
 * state of one event stream (a thread, or a process for process-order tasks) and belongs to one
 * thread at a time.
 *
 * Nothing here calls malloc, free or any function an allocator or the recorder hooks: memory
 * comes from mmap, files are read with open/read/mmap.
 */
#ifndef HEAPCAST_POLICY_H
#define HEAPCAST_POLICY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HC_POLICY_ABI 2

/* Kinds of policy. */
enum { HC_KIND_TABLE = 1, HC_KIND_RNN = 2 };

/* Tasks (what the labels mean): the same as `heapcast train --task`. */
enum { HC_TASK_NEXT = 0, HC_TASK_FREE = 1, HC_TASK_LIFETIME = 2 };

/* Lifetime classes of the `lifetime` task (docs/vocabularies.md, "Lifetime classes"). */
enum { HC_LIFE_15 = 0, HC_LIFE_255 = 1, HC_LIFE_4095 = 2, HC_LIFE_65535 = 3, HC_LIFE_LONG = 4,
       HC_LIFE_NEVER = 5, HC_LIFE_CLASSES = 6 };

/* Event kinds fed to a stream (the rich vocabulary's operation kinds). */
enum { HC_OP_MALLOC = 0, HC_OP_CALLOC = 1, HC_OP_REALLOC = 2, HC_OP_ALIGNED = 3, HC_OP_FREE = 4,
       HC_OP_MMAP = 5, HC_OP_MUNMAP = 6, HC_OP_MREMAP = 7 };

typedef struct hc_policy hc_policy;   /* a loaded POLICY (read-only, shared) */
typedef struct hc_stream hc_stream;   /* per-stream state */

/* One heap event as the runtime reads it. `site` is the stable call-site key (hc_site_key),
 * `size` the requested size (for a free: the size of the block it releases, 0 if unknown),
 * `ts_ns` CLOCK_MONOTONIC. `token` is filled by hc_event_token when left at 0xFFFF. */
typedef struct {
    uint32_t site;
    uint16_t op;          /* HC_OP_* */
    uint16_t token;       /* vocabulary token, or 0xFFFF: computed from op and size */
    uint64_t size;
    uint64_t ts_ns;
    uint8_t free_null;    /* a free(NULL) */
    uint8_t free_unknown; /* a free of a block that was not live */
    uint8_t pad[6];
} hc_event;

/* A prediction: up to HC_TOPK labels, best first (-1 padding), and the top label's confidence
 * in [0, 1] (table: the share of training rows of the key that had it; rnn: softmax). */
#define HC_TOPK 5
typedef struct {
    int32_t label[HC_TOPK];
    float conf;
    uint32_t level;       /* table: which key answered: 0 the default, 1 token, 2 call site,
                             3 (site, token), 4.. with context, longest highest */
} hc_prediction;

/* ---- loading -------------------------------------------------------------------------------- */

/* Loads the POLICY at `path`. NULL on error, with a message naming the file and the field that is
 * wrong in err (errlen bytes). The file is mapped read-only; hc_policy_close unmaps it. */
hc_policy *hc_policy_open(const char *path, char *err, size_t errlen);
void hc_policy_close(hc_policy *p);

int hc_policy_kind(const hc_policy *p);        /* HC_KIND_* */
int hc_policy_task(const hc_policy *p);        /* HC_TASK_* */
int hc_policy_labels(const hc_policy *p);      /* number of label classes */
const char *hc_policy_model_hash(const hc_policy *p);   /* hex SHA-256 of the source model */
/* A lifetime policy's placement (the allocator lab's verdict, docs/allocator.md): 1 when blocks
 * should be placed by predicted lifetime class, 0 when in one group (no class pays for itself). */
int hc_policy_lifetime_groups(const hc_policy *p);

/* ---- streams -------------------------------------------------------------------------------- */

/* A new stream (mmap'd state, freed by hc_stream_close). NULL if out of memory. The in-run
 * memory of an rnn policy has 2^20 slots per order (hc_stream_open2: 2^memory_log2, 0 default). */
hc_stream *hc_stream_open(const hc_policy *p);
hc_stream *hc_stream_open2(const hc_policy *p, int memory_log2);
void hc_stream_close(hc_stream *s);
void hc_stream_reset(hc_stream *s);             /* back to the start of a stream */

/* Feeds one event that has happened. For `next` and `free` the prediction is of the event after
 * it; for `lifetime`, call hc_predict_alloc instead at each allocation. `label` is the true
 * label of this event when known (-1 otherwise): the in-run memory learns from it. */
void hc_stream_feed(hc_stream *s, const hc_event *ev, int32_t label);
/* The same, computing the next prediction only if predict_next (an rnn's state still steps):
 * for callers that predict every N events. */
void hc_stream_feed_ex(hc_stream *s, const hc_event *ev, int32_t label, int predict_next);

/* The prediction for the next event of the stream (next/free tasks). */
void hc_stream_predict(hc_stream *s, hc_prediction *out);

/* The lifetime class prediction for an allocation `ev` that is happening now (lifetime task;
 * table and rnn kinds). For a table policy `s` may be NULL (no context). */
void hc_predict_alloc(const hc_policy *p, hc_stream *s, const hc_event *ev, hc_prediction *out);

/* Runs one whole stream of n events from its start: out[j] is the prediction for row j (made
 * from the rows before it for next/free, at row j for lifetime) where want[j] is nonzero;
 * labels[j] is row j's true label (-1 none), which the in-run memory reads once row j happened.
 * Rows before warm_from feed only the histories and the in-run memory: an rnn's network starts
 * there from rest (0: the whole stream, as a program's run does). 0, or -1 if the stream's state
 * could not be mapped. (heapcast evaluate POLICY uses it.) */
int hc_run(const hc_policy *p, const hc_event *ev, const int32_t *labels, const uint8_t *want,
           uint64_t n, hc_prediction *out, int memory_log2, uint64_t warm_from);

/* ---- keys and tokens (shared with the trace tools: heapcast.forecast.features/vocab) --------- */

/* The rich vocabulary's token of an event: op kind * 125 + fine size class; frees of NULL and of
 * unknown blocks have their own tokens. */
uint16_t hc_rich_token(int op, uint64_t size, int free_null, int free_unknown);
/* The seed64 token (the article's classes). */
uint16_t hc_seed64_token(int op, uint64_t size);
/* The token of `ev` in the policy's vocabulary. */
uint16_t hc_event_token(const hc_policy *p, const hc_event *ev);

/* The stable call-site key of a return address: hash of the module's file name (its CRC-32,
 * zlib's) and the offset from the module's load base. 0 means unknown. */
uint32_t hc_site_key(uint32_t module_name_crc32, uint64_t offset);
uint32_t hc_crc32(uint32_t crc, const void *data, size_t n);   /* zlib's crc32 */
/* The key of a table policy's level (0 token, 1 site, 2 site+token, 100+K with a context of K
 * tokens; docs/policy-format.md), for tools that build tables. */
uint64_t hc_table_key(int level, uint32_t site, uint32_t token, uint64_t ctx);
/* The open-addressing index of n distinct keys into slots[1 << bits] (zeroed): what the
 * compiler stores; 0, -1 (too many keys) or -2 (a duplicate). */
int hc_index_build(const uint64_t *keys, uint64_t n, uint32_t bits, int32_t *slots);

/* Resolves a return address of this process to its call-site key, from a map of the loaded
 * modules filled from _dl_find_object (glibc 2.35; before it, dl_iterate_phdr, rebuilt when a
 * module was loaded or unloaded since) and a cache of recent answers. Async-signal-unsafe but
 * malloc-free; safe to call from inside malloc. 0 if the address is in no module. */
uint32_t hc_site_of_address(uintptr_t return_address);
/* Forgets the map and the cache: a module may have been unloaded, and another loaded in its
 * place. The runtime's dlclose calls it where the runtime is preloaded (the recorder, the
 * allocator); a program that unloads libraries otherwise (its own loader) calls it itself. */
void hc_modules_changed(void);

#ifdef __cplusplus
}
#endif
#endif
