/* Size classes (heapcast.stats.classes): a size's bit length, as Python's int.bit_length() and
 * the article's classes count it, for a column of values at any byte stride (a field of a
 * reader's rows). numpy had no bit length: its float64 detour (a cast, frexp, a cast back and a
 * check of the sizes a double rounds up) took about 20 ns a value. Loaded with ctypes. */
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* out[i] = bit length of the u64 at x + i * stride (0 for 0, 64 for >= 2^63). */
EXPORT void hc_bit_lengths(const uint8_t *x, uint64_t stride, int64_t *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, x + i * stride, 8);
        out[i] = v ? 64 - __builtin_clzll(v) : 0;
    }
}
