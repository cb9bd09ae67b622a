/* heapcast policy runtime: call-site keys of return addresses inside a running process.
 *
 * A key hashes the file name of the module that holds the code and the offset from the module's
 * load base (hc_site_key), as heapcast.forecast.features.location_keys does for recorded traces,
 * so that a policy trained on recordings recognises the call sites of a live run despite ASLR.
 *
 * The module map lives in one of two static buffers, published with an atomic pointer. An
 * address outside every known module is looked up with _dl_find_object (glibc 2.35), which takes
 * no lock, and its module added: dl_iterate_phdr's lock is left as it was by glibc's fork, so a
 * child forked while another thread held it would wait forever in dl_iterate_phdr (the recorder
 * did: native/recorder/recorder.c, "modules in a fork child"). Without _dl_find_object the map is
 * rebuilt with dl_iterate_phdr when the loader's add/remove counters moved. No malloc: safe
 * inside an allocator or the recorder.
 *
 * A library unloaded leaves its range in the map and its call sites in the cache, where another
 * library loaded later may take its place: those would be keyed by the old one's name and base.
 * dlclose (interposed where the runtime is preloaded: the recorder, the allocator) therefore
 * starts a new generation, in which the map is empty and the cache forgotten.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define MAX_MODULES 1024

struct module { uint64_t lo, hi, base; uint32_t key_crc; };
struct modmap { int n; uint32_t gen; uint64_t adds, subs; struct module m[MAX_MODULES]; };

static struct modmap maps[2];
static struct modmap *current;
static volatile int lock;
uint32_t hc_modules_gen;   /* dlcloses so far: a map of an older one holds nothing */
static uint32_t exe_crc;
static int exe_crc_ready;

static uint32_t basename_crc(const char *path) {
    const char *b = path;
    for (const char *c = path; *c; c++)
        if (*c == '/') b = c + 1;
    return hc_crc32(0, b, strlen(b));
}

static uint32_t module_crc(const char *name) {
    if (name && name[0]) return basename_crc(name);
    if (!exe_crc_ready) {          /* the main program: its file name, as the recorder keeps it */
        char buf[4096];
        ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = 0;
        exe_crc = basename_crc(buf);
        exe_crc_ready = 1;
    }
    return exe_crc;
}

static int add_module(struct dl_phdr_info *info, size_t size, void *arg) {
    struct modmap *mm = arg;
    (void)size;
    mm->adds = info->dlpi_adds;
    mm->subs = info->dlpi_subs;
    uint64_t lo = ~0ull, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uint64_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo) lo = a;
        if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
    }
    if (hi == 0 || mm->n >= MAX_MODULES) return 0;
    struct module *m = &mm->m[mm->n++];
    m->lo = lo;
    m->hi = hi;
    m->base = info->dlpi_addr;
    m->key_crc = module_crc(info->dlpi_name);
    return 0;
}

static int counters(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    uint64_t *c = arg;
    c[0] = info->dlpi_adds;
    c[1] = info->dlpi_subs;
    return 1;
}

/* Empties mm for generation gen before it is filled (under `lock`). A reader still scanning it
 * (it was published two maps ago) sees the generation change before any entry does (lookup). */
static void begin_map(struct modmap *mm, uint32_t gen) {
    __atomic_store_n(&mm->n, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&mm->gen, gen, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

/* Rebuilds the map with dl_iterate_phdr if the loader's counters moved (no _dl_find_object). */
static void rebuild(void) {
    if (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) return;  /* another thread does it */
    struct modmap *cur = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
    uint32_t gen = __atomic_load_n(&hc_modules_gen, __ATOMIC_ACQUIRE);
    uint64_t c[2] = {0, 0};
    dl_iterate_phdr(counters, c);
    if (!cur || cur->gen != gen || c[0] != cur->adds || c[1] != cur->subs) {
        struct modmap *next = cur == &maps[0] ? &maps[1] : &maps[0];
        begin_map(next, gen);
        dl_iterate_phdr(add_module, next);
        __atomic_store_n(&current, next, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE   /* glibc 2.35 and later */
extern int _dl_find_object(void *pc, struct dl_find_object *result) __attribute__((weak));
#endif

int hc_have_find_object(void) {
#ifdef DLFO_STRUCT_HAS_EH_DBASE
    return _dl_find_object != NULL;
#else
    return 0;
#endif
}

int hc_find_module(uintptr_t pc, struct hc_found_module *out) {
#ifdef DLFO_STRUCT_HAS_EH_DBASE
    struct dl_find_object f;
    if (!_dl_find_object || _dl_find_object((void *)pc, &f) != 0 || !f.dlfo_link_map) return 0;
    out->lo = (uintptr_t)f.dlfo_map_start;
    out->hi = (uintptr_t)f.dlfo_map_end;
    out->base = f.dlfo_link_map->l_addr;
    out->name = f.dlfo_link_map->l_name ? f.dlfo_link_map->l_name : "";
    return 1;
#else
    (void)pc; (void)out;
    return 0;
#endif
}

/* The module that holds `a` (hc_find_module), into *out (NULL if none holds it or there is no
 * _dl_find_object); added to the map unless another thread is adding one: the answer does not
 * depend on that, so every run keys the same call sites. */
static const struct module *find_module(uint64_t a, struct module *out) {
    struct hc_found_module f;
    if (!hc_find_module(a, &f)) return NULL;
    out->lo = f.lo;
    out->hi = f.hi;
    out->base = f.base;
    out->key_crc = module_crc(f.name);
    if (!__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) {
        struct modmap *cur = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
        struct modmap *next = cur == &maps[0] ? &maps[1] : &maps[0];
        uint32_t gen = __atomic_load_n(&hc_modules_gen, __ATOMIC_ACQUIRE);
        int n = cur && cur->gen == gen ? cur->n : 0;   /* (next holds an older prefix of cur:
                                                        * a thread still reading it sees the
                                                        * same entries) */
        if (next->gen != gen) begin_map(next, gen);
        if (n < MAX_MODULES) {
            if (n) memcpy(next->m, cur->m, (size_t)n * sizeof cur->m[0]);
            next->m[n] = *out;
            next->n = n + 1;
            __atomic_store_n(&current, next, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
    }
    return out;
}

/* The module of mm that holds a, copied into *out (NULL if none, or mm is of an older
 * generation). A seqlock's read: the entry counts only if mm's generation, read after it, is
 * still the one read before (begin_map changes it before a writer reuses the buffer). */
static const struct module *lookup(const struct modmap *mm, uint64_t a, struct module *out) {
    if (!mm) return NULL;
    uint32_t gen = __atomic_load_n(&mm->gen, __ATOMIC_ACQUIRE);
    if (gen != __atomic_load_n(&hc_modules_gen, __ATOMIC_ACQUIRE)) return NULL;
    int n = __atomic_load_n(&mm->n, __ATOMIC_ACQUIRE), found = 0;
    for (int i = 0; i < n && i < MAX_MODULES; i++)
        if (a >= mm->m[i].lo && a < mm->m[i].hi) {
            *out = mm->m[i];
            found = 1;
            break;
        }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return found && __atomic_load_n(&mm->gen, __ATOMIC_RELAXED) == gen ? out : NULL;
}

/* A direct-mapped cache of recent answers, shared by all threads (hc_site_of_address_inline,
 * internal.h, reads it). */
struct hc_site_cache_entry hc_site_cache[1 << HC_SITE_CACHE_BITS];

static uint32_t resolve(uintptr_t ra);

HC_EXPORT uint32_t hc_site_of_address(uintptr_t ra) { return hc_site_of_address_inline(ra); }

uint32_t hc_site_resolve(uintptr_t ra) {
    uint64_t i = ((uint64_t)ra * 0x9E3779B97F4A7C15ull) >> (64 - HC_SITE_CACHE_BITS);
    uint32_t gen = __atomic_load_n(&hc_modules_gen, __ATOMIC_ACQUIRE);
    uint32_t key = resolve(ra);
    if (key) {
        __atomic_store_n(&hc_site_cache[i].tag, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&hc_site_cache[i].key, key, __ATOMIC_RELAXED);
        __atomic_store_n(&hc_site_cache[i].tag, (uint64_t)ra ^ key, __ATOMIC_RELEASE);
        /* a dlclose meanwhile may have forgotten the cache before this entry was put */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&hc_modules_gen, __ATOMIC_RELAXED) != gen)
            __atomic_store_n(&hc_site_cache[i].key, 0, __ATOMIC_RELAXED);
    }
    return key;
}

HC_EXPORT void hc_modules_changed(void) {
    __atomic_add_fetch(&hc_modules_gen, 1, __ATOMIC_SEQ_CST);
    /* (a key 0: a miss) Only entries in use are written: in a process whose policy never keyed
     * a site (the recorder without --policy) the cache's pages stay the kernel's zero page,
     * and a dlclose costs it no memory. */
    for (size_t i = 0; i < sizeof hc_site_cache / sizeof hc_site_cache[0]; i++)
        if (__atomic_load_n(&hc_site_cache[i].key, __ATOMIC_RELAXED))
            __atomic_store_n(&hc_site_cache[i].key, 0, __ATOMIC_RELAXED);
}

/* The program's dlclose, where this runtime is preloaded (the recorder's and the allocator's
 * exports.map): glibc's, then a new generation of modules. glibc's own unloading (NSS and iconv
 * modules, through __libc_dlclose) does not come here; those modules rarely allocate, and are
 * rarely unloaded before exit. */
HC_EXPORT int dlclose(void *handle) {
    static int (*next_dlclose)(void *);
    int (*fn)(void *) = __atomic_load_n(&next_dlclose, __ATOMIC_ACQUIRE);
    if (!fn) {
        fn = (int (*)(void *))dlsym(RTLD_NEXT, "dlclose");
        if (!fn) return -1;
        __atomic_store_n(&next_dlclose, fn, __ATOMIC_RELEASE);
    }
    int r = fn(handle);
    hc_modules_changed();
    return r;
}

static uint32_t resolve(uintptr_t ra) {
    uint64_t probe = (uint64_t)ra - 1;    /* a return address: the call is just before it */
    struct module found;
    const struct module *m = lookup(__atomic_load_n(&current, __ATOMIC_ACQUIRE), probe, &found);
    if (!m && hc_have_find_object()) {
        m = find_module(probe, &found);
    } else if (!m) {
        rebuild();
        m = lookup(__atomic_load_n(&current, __ATOMIC_ACQUIRE), probe, &found);
    }
    if (!m) return 0;
    return hc_site_key(m->key_crc, (uint64_t)ra - m->base);
}
