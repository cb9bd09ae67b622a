/* heapcast policy runtime: loading a POLICY file, streams, tokens and keys (heapcast_policy.h).
 *
 * A POLICY is a safetensors file: an 8-byte little-endian header length, a JSON header naming
 * every tensor (dtype, shape, data offsets) and a "__metadata__" object of strings, then the
 * tensor bytes. The runtime maps it read-only and points into it; it checks the header, the
 * CRC-32 of the data (metadata "heapcast_crc32") and the dtype and shape of every tensor it reads,
 * and names the file and the field when something is wrong.
 *
 * No malloc: the policy and stream structures live in anonymous mappings.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

void *hc_map_anon(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void hc_unmap(void *p, size_t n) {
    if (p) munmap(p, n);
}

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    if (err && errlen) {
        int k = snprintf(err, errlen, "%s: ", path);
        if (k < 0) k = 0;
        if ((size_t)k < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- CRC-32 (zlib's) */

/* Slicing by 8 (eight bytes per step, eight tables): what every CPU runs on the bytes that the
 * folding below leaves, and on all of them where it cannot run. */
static uint32_t crc_table[8][256];
static volatile int crc_ready;     /* 1: tables built; 2: and the CPU has PCLMULQDQ and SSE4.1 */

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    unsigned a, b, c, d;
    int clmul = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_PCLMUL) && (c & bit_SSE4_1);
    __atomic_store_n(&crc_ready, clmul ? 2 : 1, __ATOMIC_RELEASE);
}

static uint32_t crc_slice8(uint32_t crc, const unsigned char *b, size_t n) {
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, b, 4);
        memcpy(&hi, b + 4, 4);
        lo ^= crc;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        b += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *b++) & 0xFF] ^ (crc >> 8);
    return crc;
}

/* Carry-less multiplication folding (Gopal et al., "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ Instruction", Intel 2009; the constants of its bit-reflected CRC-32): four
 * 16-byte lanes folded 64 bytes at a time, then into one, then a Barrett reduction. About 6x the
 * slicing's speed: a table POLICY of a few MB is checked in a fraction of a millisecond, which a
 * short traced program would otherwise pay at its start. n >= 64, a multiple of 16; `crc` and the
 * result are the register, not zlib's inverted value. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t crc_fold(uint32_t crc, const unsigned char *b, size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4),
                  k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0),
                  k5 = _mm_set_epi64x(0, 0x0163cd6124),
                  poly = _mm_set_epi64x(0x01f7011641, 0x01db710641),
                  low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)b), _mm_cvtsi32_si128((int)crc)),
            x2 = _mm_loadu_si128((const __m128i *)(b + 16)),
            x3 = _mm_loadu_si128((const __m128i *)(b + 32)),
            x4 = _mm_loadu_si128((const __m128i *)(b + 48));
#define FOLD(x, k, next) \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), _mm_clmulepi64_si128(x, k, 0x00)), \
                  next)
    for (b += 64, n -= 64; n >= 64; b += 64, n -= 64) {
        x1 = FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)b));
        x2 = FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(b + 16)));
        x3 = FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(b + 32)));
        x4 = FOLD(x4, k1k2, _mm_loadu_si128((const __m128i *)(b + 48)));
    }
    x1 = FOLD(x1, k3k4, x2);
    x1 = FOLD(x1, k3k4, x3);
    x1 = FOLD(x1, k3k4, x4);
    for (; n >= 16; b += 16, n -= 16) x1 = FOLD(x1, k3k4, _mm_loadu_si128((const __m128i *)b));
#undef FOLD
    /* 128 bits to 64, then the Barrett reduction to 32 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k3k4, 0x10));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00),
                       _mm_srli_si128(x1, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, t), 1);
}

HC_EXPORT uint32_t hc_crc32(uint32_t crc, const void *data, size_t n) {
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) crc_init();
    const unsigned char *b = data;
    crc = ~crc;
    if (n >= 64 && __atomic_load_n(&crc_ready, __ATOMIC_RELAXED) == 2) {
        size_t m = n & ~(size_t)15;
        crc = crc_fold(crc, b, m);
        b += m;
        n -= m;
    }
    return ~crc_slice8(crc, b, n);
}

/* ---------------------------------------------------------------- tokens and keys */

HC_EXPORT uint16_t hc_rich_token(int op, uint64_t size, int free_null, int free_unknown) {
    return hc_rich_token_inline(op, size, free_null, free_unknown);
}

HC_EXPORT uint16_t hc_seed64_token(int op, uint64_t size) { return hc_seed64_token_inline(op, size); }

HC_EXPORT uint16_t hc_event_token(const hc_policy *p, const hc_event *ev) {
    return hc_event_token_inline(p, ev);
}

HC_EXPORT uint32_t hc_site_key(uint32_t module_name_crc32, uint64_t offset) {
    /* heapcast.forecast.features: mix64((crc32(basename) << 40) ^ offset), folded to 32 bits */
    uint64_t k = hc_mix64(((uint64_t)module_name_crc32 << 40) ^ offset);
    uint32_t f = (uint32_t)((k >> 32) ^ k);
    return f ? f : 1;
}

/* ---------------------------------------------------------------- open addressing index */

/* Slot of `key` in an index built by hc_index_build: the entry number + 1, or 0 if absent. */
uint32_t hc_slot_probe(const int32_t *slots, uint32_t bits, const uint64_t *keys, uint64_t key) {
    uint64_t mask = (1ull << bits) - 1;
    uint64_t i = (key * 0x9E3779B97F4A7C15ull) >> (64 - bits);
    for (;;) {
        int32_t e = slots[i];
        if (e == 0) return 0;
        if (keys[e - 1] == key) return (uint32_t)e;
        i = (i + 1) & mask;
    }
}

/* Builds the open-addressing index of `n` distinct keys into slots[1 << bits] (zeroed by the
 * caller): the compiler stores it in the POLICY so that loading does no work. */
HC_EXPORT int hc_index_build(const uint64_t *keys, uint64_t n, uint32_t bits, int32_t *slots) {
    if (bits == 0 || bits > 31 || n >= (1ull << bits)) return -1;
    uint64_t mask = (1ull << bits) - 1;
    for (uint64_t e = 0; e < n; e++) {
        uint64_t i = (keys[e] * 0x9E3779B97F4A7C15ull) >> (64 - bits);
        while (slots[i]) {
            if (keys[slots[i] - 1] == keys[e]) return -2;   /* duplicate key */
            i = (i + 1) & mask;
        }
        slots[i] = (int32_t)(e + 1);
    }
    return 0;
}

/* ---------------------------------------------------------------- the safetensors header */

struct parser {
    const char *s, *end, *start;
    const char *path;
    char *err;
    size_t errlen;
};

static void ws(struct parser *q) {
    while (q->s < q->end && (*q->s == ' ' || *q->s == '\n' || *q->s == '\r' || *q->s == '\t'))
        q->s++;
}

static int expect(struct parser *q, char c) {
    ws(q);
    if (q->s >= q->end || *q->s != c)
        return fail(q->err, q->errlen, q->path, "header: expected '%c' at file offset %ld", c,
                    (long)(q->s - q->start) + 8);
    q->s++;
    return 0;
}

/* A JSON string: its raw bytes (escapes left in) in [*a, *a + *n). */
static int string(struct parser *q, const char **a, uint32_t *n) {
    if (expect(q, '"')) return -1;
    const char *start = q->s;
    while (q->s < q->end && *q->s != '"') q->s += *q->s == '\\' ? 2 : 1;
    if (q->s >= q->end) return fail(q->err, q->errlen, q->path, "header: unterminated string");
    *a = start;
    *n = (uint32_t)(q->s - start);
    q->s++;
    return 0;
}

static int number(struct parser *q, uint64_t *v) {
    ws(q);
    if (q->s >= q->end || *q->s < '0' || *q->s > '9')
        return fail(q->err, q->errlen, q->path, "header: expected a number");
    uint64_t x = 0;
    while (q->s < q->end && *q->s >= '0' && *q->s <= '9') x = x * 10 + (uint64_t)(*q->s++ - '0');
    *v = x;
    return 0;
}

static int peek(struct parser *q, char c) {
    ws(q);
    return q->s < q->end && *q->s == c;
}

static int numbers(struct parser *q, uint64_t *out, int max, int *count) {
    if (expect(q, '[')) return -1;
    *count = 0;
    if (peek(q, ']')) { q->s++; return 0; }
    for (;;) {
        uint64_t v = 0;
        if (number(q, &v)) return -1;
        if (*count >= max) return fail(q->err, q->errlen, q->path, "header: array too long");
        out[(*count)++] = v;
        if (peek(q, ',')) { q->s++; continue; }
        return expect(q, ']');
    }
}

static int eq(const char *a, uint32_t n, const char *lit) {
    return strlen(lit) == n && memcmp(a, lit, n) == 0;
}

static int dtype_of(const char *a, uint32_t n) {
    static const char *names[] = {"F32", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"};
    for (int i = 0; i < DT_OTHER; i++)
        if (eq(a, n, names[i])) return i;
    return DT_OTHER;
}

static const int dtype_size[] = {4, 8, 1, 1, 2, 2, 4, 4, 8, 8, 1};

struct meta { const char *kind, *crc, *abi, *hash; uint32_t kind_n, crc_n, abi_n, hash_n; };

static int parse_metadata(struct parser *q, struct meta *m) {
    if (expect(q, '{')) return -1;
    if (peek(q, '}')) { q->s++; return 0; }
    for (;;) {
        const char *k, *v;
        uint32_t kn, vn;
        if (string(q, &k, &kn) || expect(q, ':') || string(q, &v, &vn)) return -1;
        if (eq(k, kn, "heapcast_kind")) { m->kind = v; m->kind_n = vn; }
        else if (eq(k, kn, "heapcast_crc32")) { m->crc = v; m->crc_n = vn; }
        else if (eq(k, kn, "heapcast_abi")) { m->abi = v; m->abi_n = vn; }
        else if (eq(k, kn, "heapcast_model_sha256")) { m->hash = v; m->hash_n = vn; }
        if (peek(q, ',')) { q->s++; continue; }
        return expect(q, '}');
    }
}

static int parse_tensor(struct parser *q, struct hc_tensor *t, const char *data, uint64_t data_len) {
    uint64_t offs[2] = {0, 0};
    int have_dtype = 0, have_offs = 0, n;
    t->ndim = 0;
    if (expect(q, '{')) return -1;
    for (;;) {
        const char *k = NULL;
        uint32_t kn = 0;
        if (string(q, &k, &kn) || expect(q, ':')) return -1;
        if (eq(k, kn, "dtype")) {
            const char *v;
            uint32_t vn;
            if (string(q, &v, &vn)) return -1;
            t->dtype = dtype_of(v, vn);
            have_dtype = 1;
        } else if (eq(k, kn, "shape")) {
            if (numbers(q, t->shape, 4, &n)) return -1;
            t->ndim = n;
        } else if (eq(k, kn, "data_offsets")) {
            if (numbers(q, offs, 2, &n)) return -1;
            if (n != 2) return fail(q->err, q->errlen, q->path, "header: tensor %.*s: data_offsets "
                                    "needs 2 numbers", (int)t->name_len, t->name);
            have_offs = 1;
        } else {
            return fail(q->err, q->errlen, q->path, "header: tensor %.*s: unknown field %.*s",
                        (int)t->name_len, t->name, (int)kn, k);
        }
        if (peek(q, ',')) { q->s++; continue; }
        if (expect(q, '}')) return -1;
        break;
    }
    if (!have_dtype || !have_offs)
        return fail(q->err, q->errlen, q->path, "header: tensor %.*s lacks dtype or data_offsets",
                    (int)t->name_len, t->name);
    uint64_t elems = 1;
    for (int i = 0; i < t->ndim; i++) elems *= t->shape[i];
    if (offs[1] < offs[0] || offs[1] > data_len ||
        offs[1] - offs[0] != elems * (uint64_t)dtype_size[t->dtype])
        return fail(q->err, q->errlen, q->path, "tensor %.*s: data offsets [%llu, %llu) do not fit "
                    "its shape or the file's %llu data bytes", (int)t->name_len, t->name,
                    (unsigned long long)offs[0], (unsigned long long)offs[1],
                    (unsigned long long)data_len);
    t->data = data + offs[0];
    t->nbytes = offs[1] - offs[0];
    return 0;
}

static int parse_header(hc_policy *p, const char *path, char *err, size_t errlen) {
    const char *base = p->map;
    uint64_t hlen;
    memcpy(&hlen, base, 8);
    if (hlen > p->map_len - 8)
        return fail(err, errlen, path, "header length %llu exceeds the file (%zu bytes): "
                    "truncated, or not a POLICY file", (unsigned long long)hlen, p->map_len);
    const char *data = base + 8 + hlen;
    uint64_t data_len = p->map_len - 8 - hlen;
    struct parser q = {base + 8, base + 8 + hlen, base + 8, path, err, errlen};
    struct meta m = {0};
    int have_meta = 0;
    if (expect(&q, '{')) return -1;
    for (;;) {
        const char *k = NULL;
        uint32_t kn = 0;
        if (string(&q, &k, &kn) || expect(&q, ':')) return -1;
        if (eq(k, kn, "__metadata__")) {
            if (parse_metadata(&q, &m)) return -1;
            have_meta = 1;
        } else {
            if (p->n_tensors >= (int)(sizeof p->tensors / sizeof p->tensors[0]))
                return fail(err, errlen, path, "too many tensors (at most %d)",
                            (int)(sizeof p->tensors / sizeof p->tensors[0]));
            struct hc_tensor *t = &p->tensors[p->n_tensors++];
            t->name = k;
            t->name_len = kn;
            if (parse_tensor(&q, t, data, data_len)) return -1;
        }
        if (peek(&q, ',')) { q.s++; continue; }
        if (expect(&q, '}')) return -1;
        break;
    }
    if (!have_meta || !m.kind)
        return fail(err, errlen, path, "no heapcast_kind in the metadata: a safetensors file, but "
                    "not a heapcast POLICY (compile one with `heapcast compile MODEL -o POLICY`)");
    if (!m.abi || !eq(m.abi, m.abi_n, HC_STR(HC_POLICY_ABI)))
        return fail(err, errlen, path, "field heapcast_abi is %.*s, this runtime reads "
                    HC_STR(HC_POLICY_ABI) " (compile the model again with this heapcast)",
                    m.abi ? (int)m.abi_n : 4, m.abi ? m.abi : "none");
    if (!m.crc) return fail(err, errlen, path, "no heapcast_crc32 in the metadata");
    uint64_t want = 0;
    for (uint32_t i = 0; i < m.crc_n; i++) want = want * 10 + (uint64_t)(m.crc[i] - '0');
    uint32_t got = hc_crc32(0, data, data_len);
    if (got != (uint32_t)want)
        return fail(err, errlen, path, "tensor data is corrupt (CRC-32 %08x, header says %08x)",
                    got, (uint32_t)want);
    if (m.hash && m.hash_n < sizeof p->model_hash) {
        memcpy(p->model_hash, m.hash, m.hash_n);
        p->model_hash[m.hash_n] = 0;
    }
    return 0;
}

const struct hc_tensor *hc_find_tensor(const hc_policy *p, const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].name_len == n && memcmp(p->tensors[i].name, name, n) == 0)
            return &p->tensors[i];
    return NULL;
}

static int check_cfg(hc_policy *p, const char *path, char *err, size_t errlen) {
    const struct hc_tensor *t = hc_find_tensor(p, "cfg");
    if (!t || t->dtype != DT_I32 || t->ndim != 1 || t->shape[0] != CFG_COUNT)
        return fail(err, errlen, path, "tensor cfg: expected int32[%d] (the policy's settings)",
                    CFG_COUNT);
    memcpy(p->cfg, t->data, sizeof p->cfg);
    if (p->cfg[CFG_ABI] != HC_POLICY_ABI)
        return fail(err, errlen, path, "cfg[abi] is %d, this runtime reads %d", p->cfg[CFG_ABI],
                    HC_POLICY_ABI);
    if (p->cfg[CFG_TASK] < 0 || p->cfg[CFG_TASK] > HC_TASK_LIFETIME)
        return fail(err, errlen, path, "cfg[task] is %d: unknown task", p->cfg[CFG_TASK]);
    if (p->cfg[CFG_VOCAB] != VOCAB_SEED64 && p->cfg[CFG_VOCAB] != VOCAB_RICH)
        return fail(err, errlen, path, "cfg[vocab] is %d: unknown vocabulary", p->cfg[CFG_VOCAB]);
    p->vocab_size = p->cfg[CFG_VOCAB] == VOCAB_SEED64 ? 64 : 1002;
    return 0;
}

HC_EXPORT hc_policy *hc_policy_open(const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(err, errlen, path, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        fail(err, errlen, path, "not a regular file");
        return NULL;
    }
    if (st.st_size < 16) {
        close(fd);
        fail(err, errlen, path, "%lld bytes, too short for a POLICY file", (long long)st.st_size);
        return NULL;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fail(err, errlen, path, "cannot map: %s", strerror(errno));
        return NULL;
    }
    hc_policy *p = hc_map_anon(sizeof *p);
    if (!p) {
        munmap(map, (size_t)st.st_size);
        fail(err, errlen, path, "out of memory");
        return NULL;
    }
    p->map = map;
    p->map_len = (size_t)st.st_size;
    int bad = parse_header(p, path, err, errlen) || check_cfg(p, path, err, errlen);
    if (!bad) {
        const struct hc_tensor *g = hc_find_tensor(p, "alloc.lifetime_groups");
        p->lifetime_groups = 1;
        if (g && (g->dtype != DT_I32 || g->ndim != 1 || g->shape[0] != 1 ||
                  (unsigned)*(const int32_t *)g->data > 1))
            bad = fail(err, errlen, path, "tensor alloc.lifetime_groups: expected int32[1], 0 or 1");
        else if (g)
            p->lifetime_groups = *(const int32_t *)g->data;
    }
    if (!bad) {
        int kind = p->cfg[CFG_KIND];
        if (kind == HC_KIND_RNN) bad = hc_rnn_load(p, err, errlen);
        else if (kind == HC_KIND_TABLE) bad = hc_table_load(p, err, errlen);
        else bad = fail(err, errlen, path, "cfg[kind] is %d: neither table (1) nor rnn (2)", kind);
        if (bad && err && errlen && strncmp(err, path, strlen(path)) != 0) {
            /* kind loaders name the tensor; prefix the file */
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s", err);
            fail(err, errlen, path, "%s", tmp);
        }
    }
    if (bad) {
        hc_policy_close(p);
        return NULL;
    }
    return p;
}

HC_EXPORT void hc_policy_close(hc_policy *p) {
    if (!p) return;
    if (p->tab_copy_len) hc_unmap((void *)p->tab_slots, p->tab_copy_len);
    hc_unmap(p->map, p->map_len);
    hc_unmap(p, sizeof *p);
}

HC_EXPORT int hc_policy_kind(const hc_policy *p) { return p->cfg[CFG_KIND]; }
HC_EXPORT int hc_policy_task(const hc_policy *p) { return p->cfg[CFG_TASK]; }
HC_EXPORT int hc_policy_labels(const hc_policy *p) { return p->cfg[CFG_N_LABELS]; }
HC_EXPORT const char *hc_policy_model_hash(const hc_policy *p) { return p->model_hash; }
HC_EXPORT int hc_policy_lifetime_groups(const hc_policy *p) { return p->lifetime_groups; }

/* ---------------------------------------------------------------- streams */

#define DEFAULT_MEMORY_LOG2 20

HC_EXPORT hc_stream *hc_stream_open2(const hc_policy *p, int memory_log2) {
    if (memory_log2 <= 0) memory_log2 = DEFAULT_MEMORY_LOG2;
    if (memory_log2 > 28) memory_log2 = 28;
    uint64_t cap = 1ull << memory_log2;
    size_t extra = p->cfg[CFG_KIND] == HC_KIND_RNN ? hc_rnn_stream_bytes(p, cap) : 0;
    size_t len = (sizeof(hc_stream) + 63) / 64 * 64 + extra;
    char *mem = hc_map_anon(len);
    if (!mem) return NULL;
    hc_stream *s = (hc_stream *)mem;
    s->p = p;
    s->map_len = len;
    s->mem_cap = cap;
    if (p->cfg[CFG_KIND] == HC_KIND_RNN) hc_rnn_stream_init(s, mem + (sizeof(hc_stream) + 63) / 64 * 64);
    hc_stream_reset(s);
    return s;
}

HC_EXPORT hc_stream *hc_stream_open(const hc_policy *p) { return hc_stream_open2(p, 0); }

HC_EXPORT void hc_stream_close(hc_stream *s) {
    if (s) hc_unmap(s, s->map_len);
}

HC_EXPORT void hc_stream_reset(hc_stream *s) {
    s->events = 0;
    s->last_ts = 0;
    s->hist_len = s->hist_head = 0;
    if (s->p->cfg[CFG_KIND] == HC_KIND_TABLE) hc_table_ctx_reset(s);
    s->have_pred = 0;
    if (s->p->cfg[CFG_KIND] == HC_KIND_RNN) hc_rnn_start(s);
}

static inline int dt_bucket(hc_stream *s, uint64_t ts) {
    if (s->events == 0) return 0;
    uint64_t d = ts > s->last_ts ? ts - s->last_ts : 0;
    int b = hc_bit_length(d);
    return b > 63 ? 63 : b;
}

/* The symbols of an event as the n-gram and the in-run memory hash them (forecast/models/ngram.py
 * NGram.symbols): the token, with sites mixed in, with dt buckets mixed in. */
static inline uint64_t symbol(uint64_t tok, uint32_t site, int dt, int sites, int use_dt) {
    uint64_t sym = tok;
    if (sites) sym = hc_mix64(sym ^ ((uint64_t)site << 20));
    if (use_dt) sym = hc_mix64(sym ^ (((uint64_t)dt >> 2) << 56));
    return sym & 0xFFFFFFFFFFFEull;
}

/* Feeds one event: the common part (token, dt, histories) and the kind's step. */
static void feed(hc_stream *s, const hc_event *ev, int32_t label, int want_pred) {
    const hc_policy *p = s->p;
    uint16_t tok = hc_event_token(p, ev);
    if (p->cfg[CFG_KIND] == HC_KIND_RNN) {
        int dt = dt_bucket(s, ev->ts_ns);
        uint64_t hs = symbol(tok, ev->site, dt, p->cfg[CFG_NG_SITES], p->cfg[CFG_NG_DT]);
        uint64_t ms = symbol(tok, ev->site, dt, 1, 0);
        hc_rnn_feed(s, ev->site, tok, dt, hs, ms, label, want_pred);
        s->last_ts = ev->ts_ns;
        s->last_site = ev->site;
        s->events++;
    } else {
        hc_table_feed(s, tok, ev->site, ev->ts_ns, want_pred);
    }
}

HC_EXPORT void hc_stream_feed(hc_stream *s, const hc_event *ev, int32_t label) {
    feed(s, ev, label, s->p->cfg[CFG_SHIFT]);
}

HC_EXPORT void hc_stream_feed_ex(hc_stream *s, const hc_event *ev, int32_t label, int predict_next) {
    feed(s, ev, label, predict_next && s->p->cfg[CFG_SHIFT]);
}

HC_EXPORT void hc_stream_predict(hc_stream *s, hc_prediction *out) {
    const hc_policy *p = s->p;
    if (p->cfg[CFG_KIND] == HC_KIND_TABLE) {
        hc_table_predict_next(s, out);
        return;
    }
    if (s->have_pred) {
        *out = s->pred;
    } else {
        for (int i = 0; i < HC_TOPK; i++) out->label[i] = -1;
        out->conf = 0;
        out->level = 0;
    }
}

HC_EXPORT void hc_predict_alloc(const hc_policy *p, hc_stream *s, const hc_event *ev,
                                hc_prediction *out) {
    if (p->cfg[CFG_KIND] == HC_KIND_TABLE) {
        uint16_t tok = hc_event_token(p, ev);
        hc_table_predict(p, s, ev->site, tok, s != NULL, out);
        if (s) feed(s, ev, -1, 0);
        return;
    }
    if (!s) {   /* an rnn needs its state */
        for (int i = 0; i < HC_TOPK; i++) out->label[i] = -1;
        out->conf = 0;
        out->level = 0;
        return;
    }
    feed(s, ev, -1, 1);
    *out = s->pred;
}

/* Runs one whole stream (heapcast_policy.h). */
HC_EXPORT int hc_run(const hc_policy *p, const hc_event *ev, const int32_t *labels,
                     const uint8_t *want, uint64_t n, hc_prediction *out, int memory_log2,
                     uint64_t warm_from) {
    hc_stream *s = hc_stream_open2(p, memory_log2);
    if (!s) return -1;
    s->skip_until = warm_from;
    int shift = p->cfg[CFG_SHIFT];
    if (shift && p->cfg[CFG_KIND] == HC_KIND_TABLE) {
        hc_table_run_shift(s, ev, want, n, out);
        hc_stream_close(s);
        return 0;
    }
    for (uint64_t j = 0; j < n; j++) {
        if (shift) {
            if (want[j]) hc_stream_predict(s, &out[j]);
            /* the network's head runs only where a prediction is wanted next */
            feed(s, &ev[j], labels[j], j + 1 < n ? want[j + 1] : 0);
        } else if (want[j]) {
            hc_predict_alloc(p, s, &ev[j], &out[j]);
        } else {
            feed(s, &ev[j], -1, 0);
        }
    }
    hc_stream_close(s);
    return 0;
}
