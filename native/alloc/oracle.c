/* --policy oracle:TRACE: the true lifetime class of every allocation, taken from a recording of
 * the very same run, so that a real process shows what clairvoyant placement is worth.
 *
 * `heapcast run` writes the classes into a small file (src/heapcast/alloc/oracle.py):
 *   "HCORACL1", u32 version (2), u32 sections, then per section u64 argv hash (FNV-1a 64 of
 *   /proc/self/cmdline: the arguments, each ending in a NUL, the first without its directory),
 *   u64 name hash (the same of the first argument alone), u64 offset, u64 count; then the
 *   class bytes (0-5) of each section's allocations in the recording's order.
 * A process finds its section by its command line (an exec'd program is matched again), or else
 * by its program name where one section alone has it (a compiler pass whose arguments name
 * temporary files); the n-th
 * allocation it makes gets the n-th class. A forked child, whose allocations the recording holds
 * in a process of its own that nothing here can tell apart, and allocations past the recording's
 * count get the default class. The file is mapped read-only; nothing here calls malloc. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"

#define MAGIC "HCORACL1"
#define HEADER 16
#define SECTION 32

static const uint8_t *classes;     /* this process's section, or NULL */
static uint64_t count;
static _Atomic uint64_t next;

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* FNV-1a 64 of this process's command line, its first argument reduced to the file name (a
 * program run as ./prog or /path/to/prog is the same program). */
static int cmdline_hash(uint64_t *out, uint64_t *name_out) {
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[8192];
    size_t len = 0;
    ssize_t n;
    uint64_t h = 0xcbf29ce484222325ULL;
    int first = 1;
    while ((n = read(fd, buf + len, sizeof buf - len)) > 0) {
        len += (size_t)n;
        size_t start = 0;
        if (first) {                     /* skip argv[0]'s directories once it is complete */
            char *nul = memchr(buf, 0, len);
            if (!nul && len < sizeof buf)
                continue;
            size_t end = nul ? (size_t)(nul - buf) : len;
            for (size_t i = 0; i < end; i++)
                if (buf[i] == '/')
                    start = i + 1;
            uint64_t nh = 0xcbf29ce484222325ULL;
            for (size_t i = start; i <= end && i < len; i++) {
                nh ^= (uint8_t)buf[i];
                nh *= 0x100000001b3ULL;
            }
            *name_out = nh;
            first = 0;
        }
        for (size_t i = start; i < len; i++) {
            h ^= (uint8_t)buf[i];
            h *= 0x100000001b3ULL;
        }
        len = 0;
    }
    close(fd);
    *out = h;
    return n < 0 ? -1 : 0;
}

int ha_oracle_init(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open the oracle file: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < HEADER) {
        snprintf(err, errlen, "%s: offset 0: expected an oracle file header (%d bytes), the file "
                 "has %lld", path, HEADER, (long long)st.st_size);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    const uint8_t *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map the oracle file: %s", path, strerror(errno));
        return -1;
    }
    const char *why = NULL;
    uint64_t bad_at = 0;
    uint32_t nsec = rd32(m + 12);
    if (memcmp(m, MAGIC, 8) != 0)
        why = "magic \"HCORACL1\"";
    else if (rd32(m + 8) != 2)
        why = "version 2", bad_at = 8;
    else if ((uint64_t)HEADER + (uint64_t)nsec * SECTION > size)
        why = "section table within the file", bad_at = 12;
    uint64_t me = 0, my_name = 0;
    int have_me = cmdline_hash(&me, &my_name) == 0;
    const uint8_t *by_name = NULL;
    uint64_t by_name_n = 0;
    int name_matches = 0;
    for (uint32_t i = 0; !why && i < nsec; i++) {
        const uint8_t *s = m + HEADER + (size_t)i * SECTION;
        uint64_t off = rd64(s + 16), n = rd64(s + 24);
        if (off > size || n > size - off) {
            why = "section classes within the file";
            bad_at = HEADER + (uint64_t)i * SECTION + 16;
            break;
        }
        for (uint64_t j = 0; j < n; j++)
            if (m[off + j] >= HA_CLASSES) {
                why = "a lifetime class 0-5";
                bad_at = off + j;
                break;
            }
        if (!why && have_me && rd64(s) == me && !classes) {
            classes = m + off;
            count = n;
        }
        if (!why && have_me && rd64(s + 8) == my_name) {
            by_name = m + off;
            by_name_n = n;
            name_matches++;
        }
    }
    if (!why && !classes && name_matches == 1) {
        classes = by_name;
        count = by_name_n;
    }
    if (why) {
        snprintf(err, errlen, "%s: offset %llu: expected %s", path, (unsigned long long)bad_at, why);
        classes = NULL;
        munmap((void *)m, size);
        return -1;
    }
    return 0;
}

int ha_oracle_next(void) {
    if (!classes)
        return HA_DEFAULT;
    uint64_t n = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
    return n < count ? classes[n] : HA_DEFAULT;
}

void ha_oracle_after_fork(void) {
    classes = NULL;
}
