/* Decodes EVENTS columns (docs/trace-format.md "EVENTS"; the inverse of encode.c): the stored
 * byte planes put back together into values (a sparse column's: those of the rows its presence
 * bits mark, the others zero), the column's encoding undone (a running sum for DELTA, of zigzag
 * differences for ZIGZAG_DELTA, over the non-zero rows for NONZERO_DELTA), and each value
 * stored, truncated to the field's width, at a stride: straight into a reader's 64-byte rows.
 * The numpy passes this replaced (a cast of every plane, a scatter of the planes into the
 * values' bytes, a cumulative sum, a cast, a boolean scatter for sparse columns, then a strided
 * copy into the rows, each through memory of its own) were most of reading a trace.
 *
 * heapcast.trace.codec calls it through ctypes (heapcast/libheapcast_codec.so); the BACKREF
 * columns' codes and escapes come through here too, and their back-references are followed at
 * the end of this file (hc_backref_resolve), straight into the rows as well. */
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the trace format is little-endian, and so must be the host of this decoder"
#endif

#define HC_API __attribute__((visibility("default")))

enum { PLAIN = 0, DELTA = 1, ZIGZAG_DELTA = 2, NONZERO_DELTA = 3 };
enum { ERR_ARGS = -1, ERR_LENGTH = -2 };
enum { ROWS = 256 };   /* values put together at a time (on the stack: 2 KiB) */

static inline uint64_t unzigzag(uint64_t z) { return (z >> 1) ^ (0 - (z & 1)); }

/* One dense column to decode (mirrored by heapcast.trace.codec.PlaneColumn): the planes of its
 * `width`-byte stored values that the mask `omitted` does not leave out (zeros), each `count`
 * bytes, in plane order, in data (len bytes); value i goes into the low out_size bytes at
 * out + i * stride. */
typedef struct {
    const uint8_t *data;
    uint64_t len;
    uint8_t *out;
    uint64_t stride;
    int32_t encoding;
    uint32_t width, omitted, out_size;
    /* A sparse column (bits not NULL): its planes hold only the rows present, the others are
     * zero; row i is present when bit i of `bits` (bit i % 8 of byte i / 8) differs from the
     * prediction of its op (ops[i * ops_stride] < 16 and bit op of `mask` set; none without
     * ops or mask). */
    const uint8_t *bits;
    const uint8_t *ops;
    uint64_t ops_stride;
    uint32_t mask, pad;
} hc_plane_column;

static inline int present(const hc_plane_column *col, uint64_t i) {
    int bit = col->bits[i >> 3] >> (i & 7) & 1;
    if (col->ops) {
        unsigned op = col->ops[i * col->ops_stride];
        bit ^= op < 16 && (col->mask >> op & 1);
    }
    return bit;
}

static uint64_t count_present(const hc_plane_column *col, uint64_t count) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < count; i++) n += (uint64_t)present(col, i);
    return n;
}

/* How many of count rows a sparse column's presence bits mark (see hc_plane_column; ops NULL or
 * mask 0: no prediction): where its planes end. */
HC_API uint64_t hc_count_present(const uint8_t *bits, const uint8_t *ops, uint64_t ops_stride,
                                 uint32_t mask, uint64_t count) {
    hc_plane_column col = {.bits = bits, .ops = mask ? ops : NULL, .ops_stride = ops_stride,
                           .mask = mask};
    return count_present(&col, count);
}

/* ORs n bytes of a plane into the values, at bit `shift`. A whole tile is a loop of a known
 * count, which -O2 vectorizes (a byte at a time, reading a trace took 7-10% more CPU). */
static inline void gather_plane(uint64_t *restrict v, const uint8_t *restrict src,
                                unsigned shift, unsigned n) {
    if (n == ROWS)
        for (unsigned j = 0; j < ROWS; j++) v[j] |= (uint64_t)src[j] << shift;
    else
        for (unsigned j = 0; j < n; j++) v[j] |= (uint64_t)src[j] << shift;
}

/* Decodes ncols columns of count rows (their encodings undone), a tile of ROWS rows at a
 * time through every column: columns of one reader's rows then fill each row's cache line while
 * it is in the cache (column by column, each pass over a section's rows went through memory:
 * 16 MB of 64-byte rows for 2^18 events). Returns 0, ERR_LENGTH (bad[0] = the column, bad[1]
 * = the rows its planes should hold) when a column's bytes are not its planes' (for a sparse
 * one: of the rows its bits mark present), ERR_ARGS (bad[0] likewise) for a bad width, size or
 * encoding. */
HC_API int hc_decode_columns(const hc_plane_column *cols, uint32_t ncols, uint64_t count,
                             uint64_t bad[2]) {
    unsigned kept[16][8], nk[16];
    uint64_t acc[16] = {0}, rows[16], at[16] = {0};   /* rows: of its planes; at: the next */
    if (ncols > 16 || (ncols && !cols) || !bad) return ERR_ARGS;
    for (uint32_t c = 0; c < ncols; c++) {
        const hc_plane_column *col = &cols[c];
        bad[0] = c;
        unsigned w = col->width;
        if (!(w == 1 || w == 2 || w == 4 || w == 8) || col->out_size > 8 || !col->out_size ||
            col->encoding < PLAIN || col->encoding > NONZERO_DELTA ||
            (col->encoding != PLAIN && w != 8) || (col->omitted >> w) || (count && !col->out))
            return ERR_ARGS;
        nk[c] = 0;
        for (unsigned k = 0; k < w; k++)
            if (!(col->omitted >> k & 1)) kept[c][nk[c]++] = k;
        /* a sparse column: the rows present, as many values in each plane */
        rows[c] = col->bits ? count_present(col, count) : count;
        bad[1] = rows[c];
        if (col->len != (uint64_t)nk[c] * rows[c]) return ERR_LENGTH;
    }
    uint64_t v[ROWS];
    for (uint64_t i = 0; i < count; i += ROWS) {
        unsigned n = count - i < ROWS ? (unsigned)(count - i) : ROWS;
        for (uint32_t c = 0; c < ncols; c++) {
            const hc_plane_column *col = &cols[c];
            memset(v, 0, n * sizeof *v);
            if (!col->bits) {
                for (unsigned p = 0; p < nk[c]; p++)   /* plane by plane: each read in order */
                    gather_plane(v, col->data + (uint64_t)p * count + i, 8 * kept[c][p], n);
            } else {   /* the present rows take the planes' next values */
                uint64_t a = at[c];
                for (unsigned j = 0; j < n; j++) {
                    if (!present(col, i + j)) continue;
                    for (unsigned p = 0; p < nk[c]; p++)
                        v[j] |= (uint64_t)col->data[(uint64_t)p * rows[c] + a] << 8 * kept[c][p];
                    a++;
                }
                at[c] = a;
            }
            uint64_t a = acc[c];
            switch (col->encoding) {
            case DELTA:
                for (unsigned j = 0; j < n; j++) v[j] = a += v[j];
                break;
            case ZIGZAG_DELTA:
                for (unsigned j = 0; j < n; j++) v[j] = a += unzigzag(v[j]);
                break;
            case NONZERO_DELTA:   /* 0: no value; else the zigzag difference plus one */
                for (unsigned j = 0; j < n; j++)
                    if (v[j]) v[j] = a += unzigzag(v[j] - 1);
                break;
            }
            acc[c] = a;
            const uint64_t stride = col->stride;
            uint8_t *dst = col->out + i * stride;
            switch (col->out_size) {   /* (little-endian: the low bytes first) */
            case 8:
                for (unsigned j = 0; j < n; j++) memcpy(dst + j * stride, &v[j], 8);
                break;
            case 4:
                for (unsigned j = 0; j < n; j++) {
                    uint32_t x = (uint32_t)v[j];
                    memcpy(dst + j * stride, &x, 4);
                }
                break;
            case 2:
                for (unsigned j = 0; j < n; j++) {
                    uint16_t x = (uint16_t)v[j];
                    memcpy(dst + j * stride, &x, 2);
                }
                break;
            case 1:
                for (unsigned j = 0; j < n; j++) dst[j * stride] = (uint8_t)v[j];
                break;
            default:
                for (unsigned j = 0; j < n; j++) memcpy(dst + j * stride, &v[j], col->out_size);
            }
        }
    }
    return 0;
}

/* ---- the address pair
 *
 * A BACKREF column (addr, old_addr) stores a code per row: 0 for the value 0, 1 for the next of
 * the column's escapes (stored after the codes, in row order), k > 1 for the value that its
 * partner column held k - 1 rows before (encode.c's encode_backrefs). The codes and escapes are
 * decoded by hc_decode_columns; these follow them. */

/* How many of count codes are escapes (1); -1 - i where code i points before the block's start
 * (code - 1 > i). */
HC_API int64_t hc_backref_escapes(const uint64_t *codes, uint64_t count) {
    int64_t m = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t c = codes[i];
        if (c > i + 1) return -1 - (int64_t)i;
        m += c == 1;
    }
    return m;
}

static inline uint64_t load64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void store64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The value of a code at row i of a column whose partner's values are at `partner`. */
static inline uint64_t backref_value(uint64_t c, const uint64_t *esc, uint64_t *e,
                                     const uint8_t *partner, uint64_t i, uint64_t stride) {
    if (c == 0) return 0;
    if (c == 1) return esc[(*e)++];
    return load64(partner + (i - (c - 1)) * stride);
}

/* Puts the pair's values into out_a and out_b (count u64 values each, `stride` bytes apart: a
 * reader's addr and old_addr fields). A column with codes (codes_a, codes_b not NULL: m_a, m_b
 * escapes at esc_a, esc_b) gets them from its codes, in one pass in row order (a code's row is
 * an earlier one, resolved already: chains of reuse run thousands of links deep); a column
 * without is left as it is (its values already there: a generic encoding's). Returns 0; -1 - i
 * where code i points before the block's start; -1 - count where the codes of 1 are not as
 * many as the escapes. */
HC_API int64_t hc_backref_resolve(const uint64_t *codes_a, const uint64_t *esc_a, uint64_t m_a,
                                  const uint64_t *codes_b, const uint64_t *esc_b, uint64_t m_b,
                                  uint8_t *out_a, uint8_t *out_b, uint64_t stride,
                                  uint64_t count) {
    uint64_t ea = 0, eb = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t ca = codes_a ? codes_a[i] : 0, cb = codes_b ? codes_b[i] : 0;
        if (ca > i + 1 || cb > i + 1) return -1 - (int64_t)i;
        if ((ca == 1 && ea == m_a) || (cb == 1 && eb == m_b)) return -1 - (int64_t)count;
        if (codes_a) store64(out_a + i * stride, backref_value(ca, esc_a, &ea, out_b, i, stride));
        if (codes_b) store64(out_b + i * stride, backref_value(cb, esc_b, &eb, out_a, i, stride));
    }
    return ea == m_a && eb == m_b ? 0 : -1 - (int64_t)count;
}
