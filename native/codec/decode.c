/* Decodes a dense EVENTS column (docs/trace-format.md "EVENTS"; the inverse of encode.c): its
 * stored byte planes put back together into values, the column's encoding undone (a running
 * sum for DELTA, of zigzag differences for ZIGZAG_DELTA, over the non-zero rows for
 * NONZERO_DELTA), and each value stored, truncated to the field's width, at a stride: straight
 * into a reader's 64-byte rows. The numpy passes this replaced (a cast of every plane, a scatter
 * of the planes into the values' bytes, a cumulative sum, a cast, then a strided copy into the
 * rows, each through memory of its own) were most of reading a trace.
 *
 * heapcast.trace.codec calls it through ctypes (heapcast/libheapcast_codec.so); sparse columns'
 * planes (the present rows') and BACKREF columns' codes and escapes come through here too. */
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
} hc_plane_column;

/* Decodes ncols dense columns of count rows (their encodings undone), a tile of ROWS rows at a
 * time through every column: columns of one reader's rows then fill each row's cache line while
 * it is in the cache (column by column, each pass over a section's rows went through memory:
 * 16 MB of 64-byte rows for 2^18 events). Returns 0, ERR_LENGTH (*bad = the column) when a
 * column's bytes are not its planes', ERR_ARGS (*bad likewise) for a bad width, size or
 * encoding. */
HC_API int hc_decode_columns(const hc_plane_column *cols, uint32_t ncols, uint64_t count,
                             uint32_t *bad) {
    unsigned kept[16][8], nk[16];
    uint64_t acc[16] = {0};
    if (ncols > 16 || (ncols && !cols) || !bad) return ERR_ARGS;
    for (uint32_t c = 0; c < ncols; c++) {
        const hc_plane_column *col = &cols[c];
        *bad = c;
        unsigned w = col->width;
        if (!(w == 1 || w == 2 || w == 4 || w == 8) || col->out_size > 8 || !col->out_size ||
            col->encoding < PLAIN || col->encoding > NONZERO_DELTA ||
            (col->encoding != PLAIN && w != 8) || (col->omitted >> w) || (count && !col->out))
            return ERR_ARGS;
        nk[c] = 0;
        for (unsigned k = 0; k < w; k++)
            if (!(col->omitted >> k & 1)) kept[c][nk[c]++] = k;
        if (col->len != (uint64_t)nk[c] * count) return ERR_LENGTH;
    }
    uint64_t v[ROWS];
    for (uint64_t i = 0; i < count; i += ROWS) {
        unsigned n = count - i < ROWS ? (unsigned)(count - i) : ROWS;
        for (uint32_t c = 0; c < ncols; c++) {
            const hc_plane_column *col = &cols[c];
            memset(v, 0, n * sizeof *v);
            for (unsigned p = 0; p < nk[c]; p++) {   /* plane by plane: each read in order */
                const uint8_t *src = col->data + (uint64_t)p * count + i;
                const unsigned shift = 8 * kept[c][p];
                for (unsigned j = 0; j < n; j++) v[j] |= (uint64_t)src[j] << shift;
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
