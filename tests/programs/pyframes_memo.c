/* The recorder's Python stack key (native/recorder/pyframes.h, py_stack_key_in) against itself
 * without its memo: fake frame chains in the layouts of CPython 3.11 and 3.12 (the only fields
 * the key reads: each frame's previous, instruction, code object and owner; each code object's
 * line table, first line and name objects), changed at random from one key to the next, as a
 * thread's stack changes between two events: a frame's instruction or code object, frames
 * pushed and popped (a popped frame's memory left as it was, still holding its instruction and
 * code object, as CPython leaves a data stack), a frame taken out of the chain with its memory
 * intact (a generator resumed from elsewhere), 3.12's shim frames, stacks deeper than the 16
 * frames a key holds. Each key computed with the memo (the thread's last stack) must be the one
 * computed from scratch (the memo bypassed, as for a signal handler's nested event), and two
 * stacks' keys equal exactly when their 16 innermost frames are alike. Half the time a frame out
 * of the chain is made unreadable (its page PROT_NONE), as a frame whose data stack chunk was
 * freed: the key must never read one (it would crash here).
 *
 * Prints "ok KEYS HITS" (HITS: keys whose stack was the last one's), or the first mismatch and
 * exits 1. */
#define _GNU_SOURCE   /* (pyframes.h's dladdr1) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TLS __thread
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#include "../../native/recorder/pyframes.h"

#define FRAMES 48          /* frame slots: a data stack, and a few generator frames */
#define CODES 6
#define DEPTH_MAX 30

#define PAGE 4096
static char *frames[FRAMES];   /* a page each */
static char codes[CODES][256], names[CODES][64];
static int readable[FRAMES];

static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static void put(char *p, int off, const void *v) { memcpy(p + off, &v, sizeof v); }

/* The stack: chain[0] the innermost frame, its previous chain[1] ... (slot numbers). */
static int chain[DEPTH_MAX + 1], depth;
static int instr_of[FRAMES], code_of[FRAMES], shim_of[FRAMES];

static void write_frames(const struct py_layout *L) {
    for (int k = 0; k < depth; k++) {
        char *f = frames[chain[k]];
        put(f, L->fr_previous, k + 1 < depth ? frames[chain[k + 1]] : NULL);
        put(f, L->fr_code, codes[code_of[chain[k]]]);
        put(f, L->fr_instr, codes[code_of[chain[k]]] + L->co_code + 2 * instr_of[chain[k]]);
        f[L->fr_owner] = shim_of[chain[k]] ? PY_OWNED_BY_CSTACK : 0;
    }
}

/* What a key covers: the innermost 16 frames' (instruction, code), shim frames skipped. */
static int signature(const struct py_layout *L, uint64_t *out) {
    int n = 0;
    for (int k = 0; k < depth && n < PY_STACK_MAX; k++) {
        if (k && shim_of[chain[k]] && L != &py_layouts[0]) continue;
        out[n++] = (uint64_t)instr_of[chain[k]] << 8 | (uint64_t)code_of[chain[k]];
    }
    return n;
}

static int used(int slot) {
    for (int k = 0; k < depth; k++)
        if (chain[k] == slot) return 1;
    return 0;
}

static int fresh_slot(void) {
    int slot;
    do slot = (int)rnd(FRAMES); while (used(slot));
    return slot;
}

/* One change of the stack, as between two events of a thread. */
static void mutate(int shims) {
    int inner = depth > 1 ? 1 + (int)rnd((unsigned)depth - 1) : 0;
    switch (rnd(8)) {
    case 0: case 1:    /* the same stack: the most common case */
        break;
    case 2:            /* a frame's instruction moved */
        instr_of[chain[rnd((unsigned)depth)]] = (int)rnd(3);
        break;
    case 3:            /* an outer frame runs another code object at the same address */
        code_of[chain[inner]] = (int)rnd(CODES);
        break;
    case 4:            /* frames popped (their memory left as it was) */
        if (depth > 2) {
            int pop = 1 + (int)rnd((unsigned)depth - 2);
            memmove(chain, chain + pop, (size_t)(depth - pop) * sizeof chain[0]);
            depth -= pop;
        }
        break;
    case 5:            /* frames pushed */
        for (int push = 1 + (int)rnd(6); push-- && depth < DEPTH_MAX;) {
            memmove(chain + 1, chain, (size_t)depth * sizeof chain[0]);
            chain[0] = -1;
            depth++;
            chain[0] = fresh_slot();
            code_of[chain[0]] = (int)rnd(CODES);
            instr_of[chain[0]] = (int)rnd(3);
            shim_of[chain[0]] = 0;
        }
        break;
    case 6:            /* an outer frame taken out of the chain, its memory intact */
        if (depth > 2) {
            memmove(chain + inner, chain + inner + 1, (size_t)(depth - inner - 1) * sizeof chain[0]);
            depth--;
        }
        break;
    case 7:            /* an outer frame becomes, or stops being, a shim frame (3.12+) */
        if (shims && inner) shim_of[chain[inner]] ^= 1;
        break;
    }
}

/* Frames out of the chain unreadable (`hide`), those in it readable and writable. */
static void protect(int hide) {
    for (int slot = 0; slot < FRAMES; slot++) {
        int want = !hide || used(slot);
        if (want != readable[slot]) {
            if (mprotect(frames[slot], PAGE, want ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
                perror("mprotect");
                exit(2);
            }
            readable[slot] = want;
        }
    }
}

static uint64_t key(const struct py_layout *L, int memo) {
    py_outer.inside = memo ? 0 : 1;   /* 1: as a nested event: no memo */
    uint64_t k = L == &py_layouts[0] ? py_stack_key_in(&py_layouts[0], frames[chain[0]])
                                     : py_stack_key_in(&py_layouts[1], frames[chain[0]]);
    py_outer.inside = 0;
    return k;
}

int main(void) {
    long keys = 0, hits = 0;
    char *pages = mmap(NULL, (size_t)FRAMES * PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (int slot = 0; slot < FRAMES; slot++) {
        frames[slot] = pages + (size_t)slot * PAGE;
        readable[slot] = 1;
    }
    for (int v = 0; v < 2; v++) {
        const struct py_layout *L = &py_layouts[v];
        for (int c = 0; c < CODES; c++) {   /* code objects: names (empty), first line, line table */
            uint32_t state = 0x60;          /* compact ASCII */
            memcpy(names[c] + L->str_state, &state, sizeof state);
            uint64_t len = 0;
            memcpy(names[c] + L->str_length, &len, sizeof len);
            put(codes[c], L->co_filename, names[c]);
            put(codes[c], L->co_qualname, names[(c + 1) % CODES]);
            put(codes[c], L->co_linetable, names[c]);
            int first = 10 * c;
            memcpy(codes[c] + L->co_firstlineno, &first, sizeof first);
        }
        memset(&py_outer, 0, sizeof py_outer);
        py_outer.nodes = -1;
        depth = 1 + (int)rnd(DEPTH_MAX);
        for (int k = 0; k < depth; k++) {
            chain[k] = k;
            code_of[k] = (int)rnd(CODES);
            instr_of[k] = (int)rnd(3);
            shim_of[k] = 0;
        }
        uint64_t last_sig[PY_STACK_MAX], last_key = 0;
        int last_n = -1;
        for (int step = 0; step < 200000; step++) {
            mutate(v > 0);
            protect(step / 1000 % 2);
            write_frames(L);
            uint64_t sig[PY_STACK_MAX];
            int n = signature(L, sig);
            uint64_t with = key(L, 1), without = key(L, 0);
            keys++;
            if (with != without) {
                printf("3.%d step %d: key %016llx with the memo, %016llx without\n", 11 + v, step,
                       (unsigned long long)with, (unsigned long long)without);
                return 1;
            }
            int alike = n == last_n && memcmp(sig, last_sig, (size_t)n * sizeof sig[0]) == 0;
            if (alike != (with == last_key)) {
                printf("3.%d step %d: stacks %s, keys %s\n", 11 + v, step,
                       alike ? "alike" : "different", with == last_key ? "equal" : "different");
                return 1;
            }
            hits += alike;
            memcpy(last_sig, sig, sizeof sig);
            last_n = n;
            last_key = with;
        }
    }
    printf("ok %ld %ld\n", keys, hits);
    return 0;
}
