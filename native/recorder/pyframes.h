/* Python frames for the recorder: the innermost Python frame of the calling thread, read straight
 * from CPython's own frame chain (no hook, no shadow stack, nothing on Python calls and returns).
 *
 * Why the interpreter's chain and not a profile or sys.monitoring hook: the chain is what the
 * interpreter itself unwinds, so threads, generators, coroutines, exceptions, fork and
 * subinterpreters keep it exact by construction, and it costs nothing between heap events. A
 * shadow stack costs a callback on every Python call and return (bench/record_overhead.py
 * --python measures both) and must be kept right by hand through every one of those cases.
 *
 * The price is that the layout is version-specific. This file knows CPython 3.11, 3.12 and 3.13
 * (offsets checked against each interpreter's internal headers by tests/test_python_callsites.py);
 * another version, a debug or a free-threaded build (another object header) is detected at start
 * and then only native call sites are recorded. Reading a frame of the calling thread is safe
 * without the GIL: only that thread pushes and pops its frames, and while it is inside malloc it
 * does neither.
 *
 * Included by recorder.c only. */
#ifndef HEAPCAST_PYFRAMES_H
#define HEAPCAST_PYFRAMES_H
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>

/* The layouts (64-bit release builds): field, offset in 3.11, 3.12, 3.13 (-1: not in that
 * version). Where the thread's frame chain starts: 3.11 and 3.12 PyThreadState.cframe ->
 * _PyCFrame.current_frame, 3.13 PyThreadState.current_frame. A frame's instruction: 3.11 and
 * 3.12 prev_instr, 3.13 instr_ptr (both the instruction that is running a call); its code:
 * f_code, 3.13 f_executable. */
#define PY_LAYOUT(X)                                                                              \
    X(rt_finalizing, 24, 24, 608)      /* _PyRuntime._finalizing: set when Py_Finalize starts */ \
    X(rt_tstate_current, 576, -1, -1)  /* _PyRuntime.gilstate.tstate_current: the GIL holder */ \
    X(ts_thread_id, 152, 136, 152)     /* PyThreadState.thread_id (pthread_self) */              \
    X(ts_cframe, 56, 56, -1)           /* PyThreadState.cframe (_PyCFrame *) */                  \
    X(cf_current, 8, 0, -1)            /* _PyCFrame.current_frame */                             \
    X(ts_current_frame, -1, -1, 72)    /* PyThreadState.current_frame */                         \
    X(fr_code, 32, 0, 0)               /* _PyInterpreterFrame.f_code / f_executable */           \
    X(fr_previous, 48, 8, 8)           /* _PyInterpreterFrame.previous */                        \
    X(fr_instr, 56, 56, 56)            /* _PyInterpreterFrame.prev_instr / instr_ptr */          \
    X(fr_is_entry, 68, -1, -1)         /* _PyInterpreterFrame.is_entry: first of a C call */     \
    X(fr_owner, 69, 70, 70)            /* _PyInterpreterFrame.owner (char) */                    \
    X(co_filename, 112, 112, 112)      /* PyCodeObject.co_filename (str) */                      \
    X(co_qualname, 128, 128, 128)      /* PyCodeObject.co_qualname (str) */                      \
    X(co_linetable, 136, 136, 136)     /* PyCodeObject.co_linetable (bytes) */                   \
    X(co_firsttraceable, 168, 176, 184) /* PyCodeObject._co_firsttraceable (int, code units) */  \
    X(co_code, 184, 192, 200)          /* PyCodeObject.co_code_adaptive (the bytecode) */        \
    X(co_firstlineno, 72, 68, 68)      /* PyCodeObject.co_firstlineno (int) */                   \
    X(bytes_size, 16, 16, 16)          /* PyVarObject.ob_size: a bytes object's length */        \
    X(bytes_data, 32, 32, 32)          /* PyBytesObject.ob_sval: its bytes */                    \
    X(str_length, 16, 16, 16)          /* PyASCIIObject.length (code points) */                  \
    X(str_state, 32, 32, 32)           /* PyASCIIObject.state: kind bits 2..4, compact 5, ascii 6 */ \
    X(str_ascii_data, 48, 40, 40)      /* sizeof(PyASCIIObject): compact ASCII text follows */   \
    X(str_data, 72, 56, 56)            /* sizeof(PyCompactUnicodeObject); legacy: data.any */
#define PY_OWNED_BY_GENERATOR 1        /* _PyInterpreterFrame.owner values (every version) */
#define PY_OWNED_BY_CSTACK 3           /* 3.12+: the shim frame below the frames of one C call */
#define PY_OB_TYPE 8                   /* PyObject.ob_type (release, with the GIL) */

struct py_layout {
#define PY_FIELD(name, v11, v12, v13) int name;
    PY_LAYOUT(PY_FIELD)
#undef PY_FIELD
};
static const struct py_layout py_layouts[3] = {
#define PY_V11(name, v11, v12, v13) .name = v11,
#define PY_V12(name, v11, v12, v13) .name = v12,
#define PY_V13(name, v11, v12, v13) .name = v13,
    {PY_LAYOUT(PY_V11)}, {PY_LAYOUT(PY_V12)}, {PY_LAYOUT(PY_V13)},
#undef PY_V11
#undef PY_V12
#undef PY_V13
};
static struct py_layout PL;      /* the running interpreter's, set by py_probe */
static int py_minor;             /* its minor version (11-13), set by py_probe */

/* The per-event reads (py_site) take the layout as a compile-time constant, one copy of them per
 * version: GCC folds a field of py_layouts[k] into the instruction's offset, where a field of PL
 * is a load of its own, and the registers that held them spilled to the stack (py_stack_key 195
 * instructions an event, py_frame 41, on a Python program with 2-5 frames a stack). The other
 * readers pass &PL. */
#define PY_HOT static inline __attribute__((always_inline))

/* A Python frame in a location's frames: a tag bit (user-space code addresses never have it)
 * and the id of a Python frame definition (a "P" line in the .mods file). */
#define PY_FRAME_TAG (1ull << 63)

#define PY_PTR(p, off) (*(const char *const *)((const char *)(p) + (off)))
#define PY_INT(p, off) (*(const int *)((const char *)(p) + (off)))

static void *const *py_tstate_current;        /* 3.11: &_PyRuntime.gilstate.tstate_current */
static void *const *py_finalizing;            /* &_PyRuntime._finalizing */
static void *(*py_tstate_attached)(void);     /* 3.12+: the calling thread's attached state */
static void *(*py_tstate_this_thread)(void);  /* PyGILState_GetThisThreadState */
static int (*py_addr2line)(void *, int);      /* PyCode_Addr2Line: pure, never allocates */

/* CPython's PyCodeAddressRange (cpython/code.h, the same in 3.11-3.13): where a walk of a code
 * object's line table stands. _PyCode_CheckLineNumber moves one from where it stands to the
 * entry of a given offset, forwards or backwards, entry by entry; PyCode_Addr2Line starts each
 * lookup at the table's beginning, which made the definitions of a function's N lines cost
 * N^2/2 steps (a module of 64,000 top-level lines: 25 s). */
struct py_range {
    int ar_start, ar_end, ar_line;
    struct { int computed_line; const uint8_t *lo_next, *limit; } opaque;
};
_Static_assert(sizeof(struct py_range) == 40, "PyCodeAddressRange");
static int (*py_check_line)(int, struct py_range *);   /* _PyCode_CheckLineNumber, or NULL */
/* The calling thread's last walk: of which code object, told by its address, its line table's
 * address, length and first bytes, its first line and its names (a code object freed and another
 * made at its address, as code compiled again and again may be, is not taken for it). `inside`:
 * py_line calls under way on the thread; a signal handler's event that interrupts one walks from
 * the table's start and leaves the walk alone. */
static TLS struct py_lines {
    int inside;
    const char *code, *table, *names[2];
    int64_t size;
    uint64_t head;
    int first;
    struct py_range r;
} py_lines;
static uintptr_t py_eval_lo, py_eval_hi;      /* _PyEval_EvalFrameDefault's code */

/* Finds a CPython 3.11, 3.12 or 3.13 release build in the process; 1 if its frames can be read.
 * Calls dlsym: the caller makes the thread's own allocations pass through. */
static int py_probe(void) {
    const unsigned long *version = dlsym(RTLD_DEFAULT, "Py_Version");
    if (!version || (*version >> 24) != 3) return 0;
    unsigned minor = (unsigned)(*version >> 16) & 0xFF;
    if (minor < 11 || minor > 13) return 0;
    /* Debug builds: another object layout (3.11 exports _Py_RefTotal, 3.12 _Py_GetRefTotal,
     * 3.13 _Py_GetGlobalRefTotal). */
    if (dlsym(RTLD_DEFAULT, "_Py_RefTotal") || dlsym(RTLD_DEFAULT, "_Py_GetRefTotal") ||
        dlsym(RTLD_DEFAULT, "_Py_GetGlobalRefTotal"))
        return 0;
    /* A free-threaded (or trace-refs) build moves ob_type: the code type's type must be the
     * type type where a release build keeps it. */
    char *code_type = dlsym(RTLD_DEFAULT, "PyCode_Type");
    void *type_type = dlsym(RTLD_DEFAULT, "PyType_Type");
    if (!code_type || !type_type || PY_PTR(code_type, PY_OB_TYPE) != (const char *)type_type)
        return 0;
    char *runtime = dlsym(RTLD_DEFAULT, "_PyRuntime");
    void *mine = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    void *a2l = dlsym(RTLD_DEFAULT, "PyCode_Addr2Line");
    void *eval = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    void *attached = minor == 12 ? dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet")
                   : minor == 13 ? dlsym(RTLD_DEFAULT, "PyThreadState_GetUnchecked") : NULL;
    if (!runtime || !mine || !a2l || !eval || (minor > 11 && !attached)) return 0;
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (dladdr1(eval, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
        py_eval_lo = (uintptr_t)eval;
        py_eval_hi = (uintptr_t)eval + sym->st_size;
    }
    PL = py_layouts[minor - 11];
    py_minor = (int)minor;
    py_finalizing = (void *const *)(runtime + PL.rt_finalizing);
    py_tstate_this_thread = (void *(*)(void))mine;
    py_tstate_attached = (void *(*)(void))attached;
    py_addr2line = (int (*)(void *, int))a2l;
    py_check_line = (int (*)(int, struct py_range *))dlsym(RTLD_DEFAULT, "_PyCode_CheckLineNumber");
    if (minor == 11)
        __atomic_store_n(&py_tstate_current, (void *const *)(runtime + PL.rt_tstate_current),
                         __ATOMIC_RELEASE);
    return 1;
}

/* A frame that has run its first traceable instruction (the prelude that copies free variables
 * and makes cells is not yet the function's code: CPython's own _PyFrame_IsIncomplete), and is
 * not a 3.12+ shim frame (whose "code" may not be a code object at all). */
PY_HOT int py_complete_in(const struct py_layout *L, const char *f) {
    char owner = f[L->fr_owner];
    if (owner == PY_OWNED_BY_CSTACK) return 0;
    const char *code = PY_PTR(f, L->fr_code);
    return owner == PY_OWNED_BY_GENERATOR ||
           PY_PTR(f, L->fr_instr) >= code + L->co_code + 2 * PY_INT(code, L->co_firsttraceable);
}
static inline int py_complete(const char *f) { return py_complete_in(&PL, f); }

/* The frame below f, skipping 3.12+ shim frames. */
PY_HOT const char *py_previous_in(const struct py_layout *L, const char *f) {
    do f = PY_PTR(f, L->fr_previous);
    while (f && f[L->fr_owner] == PY_OWNED_BY_CSTACK);
    return f;
}
static inline const char *py_previous(const char *f) { return py_previous_in(&PL, f); }

/* The innermost frame of `f`'s chain that is complete, or NULL. */
PY_HOT const char *py_innermost_in(const struct py_layout *L, const char *f) {
    while (f && !py_complete_in(L, f)) f = PY_PTR(f, L->fr_previous);
    return f;
}

/* The thread state of the calling thread. 3.11: the one holding the GIL if that is this thread
 * (which covers subinterpreters); 3.12+: the one attached to this thread (a thread-local).
 * Else this thread's own (it released the GIL, in C code), but not once Py_Finalize has begun:
 * it frees the states of threads that still run (daemon threads). */
PY_HOT const char *py_thread_state_in(const struct py_layout *L, int minor, uintptr_t self) {
    const char *ts;
    if (minor > 11) {
        ts = py_tstate_attached();
        if (LIKELY(ts != NULL)) return ts;
    } else {
        ts = __atomic_load_n(py_tstate_current, __ATOMIC_RELAXED);
        if (LIKELY(ts && *(const uintptr_t *)(ts + L->ts_thread_id) == self)) return ts;
    }
    if (__atomic_load_n(py_finalizing, __ATOMIC_ACQUIRE)) return NULL;
    return py_tstate_this_thread();
}

/* The innermost complete Python frame of the calling thread, or NULL (no Python on this thread,
 * or the interpreter not running). */
PY_HOT const char *py_frame_in(const struct py_layout *L, int minor, uintptr_t self) {
    const char *ts = py_thread_state_in(L, minor, self);
    if (!ts) return NULL;
    if (L->ts_current_frame >= 0) return py_innermost_in(L, PY_PTR(ts, L->ts_current_frame));
    const char *cf = PY_PTR(ts, L->ts_cframe);
    return cf ? py_innermost_in(L, PY_PTR(cf, L->cf_current)) : NULL;
}
static inline const char *py_frame(uintptr_t self) { return py_frame_in(&PL, py_minor, self); }

/* A str object's length and, where it is compact ASCII (the names of nearly all code), its last
 * 8 characters (all of a shorter one). One load of the 8 bytes that end the string: no byte
 * past the string's own is read; a shorter string's 8 start in its object's header, whose bytes
 * are shifted out. */
PY_HOT uint64_t py_str_tail(const struct py_layout *L, const char *o) {
    uint64_t len = *(const uint64_t *)(o + L->str_length), v = 0;
    uint32_t state = *(const uint32_t *)(o + L->str_state);
    if (LIKELY((state & 0x60u) == 0x60u && len != 0)) {   /* compact (bit 5) and ASCII (bit 6) */
        memcpy(&v, o + L->str_ascii_data + len - 8, 8);
        v >>= len < 8 ? 8 * (8 - len) : 0;
    }
    return v ^ len << 56;
}

/* What tells a code object from another that took a freed one's memory, beyond its address and
 * its line table's: its first line and its file and function names (the name objects'
 * addresses, the file name's length and the function name's end: the objects of a freed code
 * object's names may be freed and their memory taken by the new one's too, as for 8 in 20,000
 * functions compiled one after another on 3.13). Code compiled again and again (exec of
 * generated functions, each freed after use) put new functions at old addresses: their blocks
 * were recorded at the old functions' lines. */
PY_HOT uint64_t py_code_guard_in(const struct py_layout *L, const char *code) {
    const char *file = PY_PTR(code, L->co_filename), *name = PY_PTR(code, L->co_qualname);
    uint64_t g = ((uint64_t)(uintptr_t)file * 0x94D049BB133111EBull) ^ (uint64_t)(uintptr_t)name ^
                 (uint64_t)(uint32_t)PY_INT(code, L->co_firstlineno) << 40;
    if (LIKELY(file && name))   /* (never NULL in a code object) */
        g ^= (py_str_tail(L, name) ^ *(const uint64_t *)(file + L->str_length)) *
             0xD6E8FEB86659FD93ull;
    return g;
}
static inline uint64_t py_code_guard(const char *code) { return py_code_guard_in(&PL, code); }

/* The interning key of a frame's current instruction: the instruction's address names the code
 * object and the offset in it; the line table's address and py_code_guard guard against a freed
 * code object whose memory another one took. */
PY_HOT uint64_t py_key_guarded(const struct py_layout *L, const char *f, const char *code,
                               uint64_t guard) {
    uint64_t pc = (uint64_t)(uintptr_t)PY_PTR(f, L->fr_instr);
    uint64_t lt = (uint64_t)(uintptr_t)PY_PTR(code, L->co_linetable);
    uint64_t h = (pc ^ (lt << 17) ^ (lt >> 13) ^ guard) * 0xC2B2AE3D27D4EB4Full;
    return (h ^ (h >> 31)) | 1;
}
PY_HOT uint64_t py_key_in(const struct py_layout *L, const char *f) {
    const char *code = PY_PTR(f, L->fr_code);
    return py_key_guarded(L, f, code, py_code_guard_in(L, code));
}
static inline uint64_t py_key(const char *f) { return py_key_in(&PL, f); }

/* The interning key of a line of a frame's code object: the code object's address, guarded as
 * in py_key. */
static inline uint64_t py_line_key(const char *f, int line) {
    const char *code = PY_PTR(f, PL.fr_code);
    uint64_t lt = (uint64_t)(uintptr_t)PY_PTR(code, PL.co_linetable);
    uint64_t h = ((uint64_t)(uintptr_t)code ^ (lt << 23) ^ (lt >> 11)) * 0xD6E8FEB86659FD93ull;
    h ^= (uint64_t)(uint32_t)line * 0x9E3779B97F4A7C15ull ^ py_code_guard(code);
    h *= 0xC2B2AE3D27D4EB4Full;
    return (h ^ (h >> 29)) | 1;
}

/* Python frames in a location without --stacks: the innermost is the call site, the ones below
 * say which of the program's own lines called the library code that allocated. */
#ifndef PY_STACK_MAX
#define PY_STACK_MAX 16
#endif

/* The frames below the innermost in a key (and in a location without --stacks). */
#define PY_OUTER (PY_STACK_MAX - 1)

/* The frames and shim frames (3.12+) from the innermost frame's previous down to the last
 * outer frame of a key, at most (more: the chain is not held). */
#define PY_NODES 24

/* The calling thread's last stack (py_stack_key): its outer frames (those below the innermost)
 * and their hashes, so that an event whose outer frames end like those of the thread's last
 * one hashes only the frames that differ; and its innermost frame's code object and guard.
 * The outer frames are held at the end of the arrays, the outermost last (index PY_OUTER - 1):
 * a stack that ends like the last one finds the common frames at the same indices. hash[k] is
 * the hash of the frames from k to the outermost (py_outer_step), hash[PY_OUTER] = 0 that of
 * none. The chain as walked (node: each frame's address, next: its previous, and its instruction
 * and code object) lets py_same_chain check that the outer frames are the last stack's from
 * addresses known in advance, where a walk waits for each frame's previous in turn.
 * `inside`: py_stack_key calls under way on the thread; a signal handler's event nested in one
 * neither reads nor writes the memo. */
static TLS struct py_outer {
    int inside, n;
    const char *instr[PY_OUTER], *code[PY_OUTER];
    uint64_t hash[PY_OUTER + 1];
    const char *inner_code;            /* the innermost frame's code object, and its guard */
    uint64_t inner_guard;
    int nodes;                         /* nodes held; -1: none */
    const char *first;                 /* the innermost frame's previous */
    const char *node[PY_NODES], *next[PY_NODES], *ninstr[PY_NODES], *ncode[PY_NODES];
    char shim[PY_NODES];
} py_outer = {.nodes = -1};

/* Whether the chain below f is the one held: every node where it was, with the same previous,
 * instruction, code object and kind (a shim frame or not). A node is read only once the node
 * before has been found to point to it, so that only frames of the chain as it is now are read
 * (a frame of the last stack may be gone, its data stack chunk unmapped); the processor still
 * loads ahead from the held addresses while the comparisons wait, where a walk cannot know the
 * next frame's address before it has loaded it. */
PY_HOT int py_same_chain(const struct py_layout *L, const struct py_outer *m, const char *f) {
    if (m->nodes < 0 || PY_PTR(f, L->fr_previous) != m->first) return 0;
    for (int j = 0; j < m->nodes; j++) {   /* node[j] is next[j - 1], or first */
        const char *q = m->node[j];
        if ((PY_PTR(q, L->fr_previous) != m->next[j]) | (PY_PTR(q, L->fr_instr) != m->ninstr[j]) |
            (PY_PTR(q, L->fr_code) != m->ncode[j]))
            return 0;
        if (L != &py_layouts[0] && (q[L->fr_owner] == PY_OWNED_BY_CSTACK) != m->shim[j]) return 0;
    }
    return 1;
}

/* The hash of a frame (its current instruction and its code object's guard) and the frames
 * below it (hash h). */
PY_HOT uint64_t py_outer_step(const struct py_layout *L, uint64_t h, const char *instr,
                              const char *code) {
    h ^= (uint64_t)(uintptr_t)instr ^ py_code_guard_in(L, code);
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

/* The interning key of the Python stack from f down (at most PY_STACK_MAX frames): the frames
 * below the innermost add the addresses of their current instructions and their code objects'
 * py_code_guard (alive now, those code objects may have taken the memory of others that an
 * earlier stack of the table ran: a helper called from functions compiled again and again was
 * recorded under its first callers' lines).
 * The code objects of the thread's last stack (py_outer) keep the guards read then: the outer
 * frames that end the stack as they ended the last one (the same instruction and code object
 * addresses, from the outermost) keep their hash, and the innermost frame's code object its
 * guard; a stack that is the last one's (py_same_chain) is not walked at all. A deep stack cost
 * most in those guards' reads and in the walk (bench/record_overhead.py's py_deep, 34 frames:
 * this function was 44% of the program's samples; py_dicts: 99.9% of its events end their stack
 * like the event before). A frame that runs a code object holds it, so the same
 * address is another code object only if the old one was freed and another made at its address
 * between two events of this thread with no event of this thread in between (compiling
 * allocates: its arenas are events), that is by another thread. */
PY_HOT uint64_t py_stack_key_in(const struct py_layout *L, const char *f) {
    const char *inner = PY_PTR(f, L->fr_code);
    struct py_outer *m = &py_outer;
    uint64_t h = 0, guard;
    m->inside++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    int own = m->inside == 1;
    if (LIKELY(own) && py_same_chain(L, m, f)) {
        h = m->hash[PY_OUTER - m->n];
    } else {
        /* The walk (py_previous_in's, its nodes kept): the outer frames' instructions and code
         * objects, innermost first. 3.11 has no shim frames: py_site11 reads no owner. */
        const char *instr[PY_OUTER], *code[PY_OUTER];
        const char *node[PY_NODES], *ninstr[PY_NODES], *ncode[PY_NODES];
        char shim[PY_NODES];
        int n = 0, nodes = 0;
        const char *p = PY_PTR(f, L->fr_previous);
        while (p && n < PY_OUTER) {
            int s = L != &py_layouts[0] && p[L->fr_owner] == PY_OWNED_BY_CSTACK;
            const char *pi = PY_PTR(p, L->fr_instr), *pc = PY_PTR(p, L->fr_code);
            if (nodes < PY_NODES) {
                node[nodes] = p;
                ninstr[nodes] = pi;
                ncode[nodes] = pc;
                shim[nodes] = (char)s;
            }
            nodes++;
            if (!s) {
                instr[n] = pi;
                code[n] = pc;
                n++;
            }
            p = PY_PTR(p, L->fr_previous);
        }
        if (LIKELY(own)) {
            int same = 0;   /* outer frames in common with the last stack, from the outermost */
            while (same < n && same < m->n && instr[n - 1 - same] == m->instr[PY_OUTER - 1 - same] &&
                   code[n - 1 - same] == m->code[PY_OUTER - 1 - same])
                same++;
            h = m->hash[PY_OUTER - same];
            for (int k = n - 1 - same; k >= 0; k--) {
                int at = PY_OUTER - n + k;
                h = py_outer_step(L, h, instr[k], code[k]);
                m->instr[at] = instr[k];
                m->code[at] = code[k];
                m->hash[at] = h;
            }
            m->n = n;
            m->nodes = nodes <= PY_NODES ? nodes : -1;
            m->first = PY_PTR(f, L->fr_previous);
            for (int j = 0; j < m->nodes; j++) {
                m->node[j] = node[j];
                m->next[j] = j + 1 < nodes ? node[j + 1] : p;
                m->ninstr[j] = ninstr[j];
                m->ncode[j] = ncode[j];
                m->shim[j] = shim[j];
            }
        } else {
            for (int k = n - 1; k >= 0; k--) h = py_outer_step(L, h, instr[k], code[k]);
        }
    }
    if (LIKELY(own)) {
        if (inner != m->inner_code) {
            m->inner_guard = py_code_guard_in(L, inner);
            m->inner_code = inner;
        }
        guard = m->inner_guard;
    } else {
        guard = py_code_guard_in(L, inner);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    m->inside--;
    h = (h ^ py_key_guarded(L, f, inner, guard)) * 0xD6E8FEB86659FD93ull;
    return (h ^ (h >> 31)) | 1;
}
static inline uint64_t py_stack_key(const char *f) { return py_stack_key_in(&PL, f); }

/* The calling thread's innermost complete Python frame (*pf; NULL: none) and its stack's key
 * (py_stack_key; 0 without a frame), read with version V's layout as constants. */
#define PY_SITE(V)                                                                                \
    static __attribute__((noinline)) uint64_t py_site##V(uintptr_t self, const char **pf) {    \
        const struct py_layout *L = &py_layouts[V - 11];                                        \
        const char *f = py_frame_in(L, V, self);                                                \
        *pf = f;                                                                                \
        return f ? py_stack_key_in(L, f) : 0;                                                   \
    }
PY_SITE(11)
PY_SITE(12)
PY_SITE(13)
#undef PY_SITE

static inline uint64_t py_site(uintptr_t self, const char **pf) {
    return py_minor == 11 ? py_site11(self, pf) : py_minor == 12 ? py_site12(self, pf)
                                                                 : py_site13(self, pf);
}

/* The source line of a frame's current instruction (0 if it has none). Successive lines of one
 * code object continue the thread's last walk of its line table (py_lines). */
static int py_line(const char *f) {
    const char *code = PY_PTR(f, PL.fr_code);
    long off = PY_PTR(f, PL.fr_instr) - (code + PL.co_code);
    int line;
    const char *table = PY_PTR(code, PL.co_linetable);
    struct py_lines *c = &py_lines;
    c->inside++;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (py_check_line && off >= 0 && off <= INT32_MAX && table && c->inside == 1) {
        int64_t size = *(const int64_t *)(table + PL.bytes_size);
        int first = PY_INT(code, PL.co_firstlineno);
        const char *file = PY_PTR(code, PL.co_filename), *func = PY_PTR(code, PL.co_qualname);
        uint64_t head = 0;
        memcpy(&head, table + PL.bytes_data, size < 8 ? (size_t)size : 8);
        if (c->code != code || c->table != table || c->size != size || c->first != first ||
            c->names[0] != file || c->names[1] != func || c->head != head) {
            /* as _PyLineTable_InitAddressRange starts one */
            c->code = code;
            c->table = table;
            c->size = size;
            c->first = first;
            c->names[0] = file;
            c->names[1] = func;
            c->head = head;
            c->r.opaque.lo_next = (const uint8_t *)table + PL.bytes_data;
            c->r.opaque.limit = c->r.opaque.lo_next + size;
            c->r.ar_start = -1;
            c->r.ar_end = 0;
            c->r.ar_line = -1;
            c->r.opaque.computed_line = first;
        }
        line = py_check_line((int)off, &c->r);
    } else {
        line = py_addr2line((void *)code, off < 0 ? -1 : (int)off);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    c->inside--;
    return line > 0 ? line : 0;
}

/* Writes str object `o` as UTF-8 into out[0..cap); returns the bytes written (a longer string
 * is cut). Reads the object's fields: no call into the interpreter, nothing allocated. */
static size_t py_utf8(const char *o, char *out, size_t cap) {
    if (!o) return 0;
    uint32_t state = *(const uint32_t *)(o + PL.str_state);
    uint64_t len = *(const uint64_t *)(o + PL.str_length);
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    const unsigned char *d = compact ? (const unsigned char *)o + (ascii ? PL.str_ascii_data
                                                                         : PL.str_data)
                                     : (const unsigned char *)PY_PTR(o, PL.str_data);
    if (!d || (kind != 1 && kind != 2 && kind != 4)) return 0;
    size_t n = 0;
    for (uint64_t i = 0; i < len; i++) {
        uint32_t c = kind == 1 ? d[i] : kind == 2 ? ((const uint16_t *)d)[i]
                                                  : ((const uint32_t *)d)[i];
        unsigned char b[4];
        size_t k;
        if (c < 0x80) { b[0] = (unsigned char)c; k = 1; }
        else if (c < 0x800) { b[0] = 0xC0 | (c >> 6); b[1] = 0x80 | (c & 0x3F); k = 2; }
        else if (c < 0x10000) {
            b[0] = 0xE0 | (c >> 12); b[1] = 0x80 | ((c >> 6) & 0x3F); b[2] = 0x80 | (c & 0x3F);
            k = 3;
        } else {
            b[0] = 0xF0 | (c >> 18); b[1] = 0x80 | ((c >> 12) & 0x3F);
            b[2] = 0x80 | ((c >> 6) & 0x3F); b[3] = 0x80 | (c & 0x3F); k = 4;
        }
        if (n + k > cap) break;
        for (size_t j = 0; j < k; j++) out[n++] = (char)b[j];
    }
    return n;
}

#endif
