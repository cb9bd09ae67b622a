/* Python frames for the recorder: the innermost Python frame of the calling thread, read straight
 * from CPython's own frame chain (no hook, no shadow stack, nothing on Python calls and returns).
 *
 * Why the interpreter's chain and not a profile or sys.monitoring hook: the chain is what the
 * interpreter itself unwinds, so threads, generators, coroutines, exceptions, fork and
 * subinterpreters keep it exact by construction, and it costs nothing between heap events. A
 * shadow stack costs a callback on every Python call and return (bench/record_overhead.py
 * --python measures both) and must be kept right by hand through every one of those cases.
 *
 * The price is that the layout is version-specific. This file knows CPython 3.11 (offsets checked
 * against the interpreter's internal headers by tests/test_python_callsites.py); another version
 * or a debug build (another object header) is detected at start and then only native call
 * sites are recorded. Reading a frame of the calling thread is safe without the GIL: only that
 * thread pushes and pops its frames, and while it is inside malloc it does neither.
 *
 * Included by recorder.c only. */
#ifndef HEAPCAST_PYFRAMES_H
#define HEAPCAST_PYFRAMES_H
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>

/* CPython 3.11 (64-bit, release build). */
#define PY_RT_FINALIZING 24      /* _PyRuntime._finalizing: set when Py_Finalize starts */
#define PY_RT_TSTATE_CURRENT 576 /* _PyRuntime.gilstate.tstate_current: the GIL holder's state */
#define PY_TS_CFRAME 56          /* PyThreadState.cframe (_PyCFrame *) */
#define PY_TS_THREAD_ID 152      /* PyThreadState.thread_id (pthread_self of its thread) */
#define PY_CF_CURRENT 8          /* _PyCFrame.current_frame (_PyInterpreterFrame *) */
#define PY_FR_CODE 32            /* _PyInterpreterFrame.f_code */
#define PY_FR_PREVIOUS 48        /* _PyInterpreterFrame.previous */
#define PY_FR_PREV_INSTR 56      /* _PyInterpreterFrame.prev_instr (_Py_CODEUNIT *) */
#define PY_FR_IS_ENTRY 68        /* _PyInterpreterFrame.is_entry (bool): first frame of a C call */
#define PY_FR_OWNER 69           /* _PyInterpreterFrame.owner (char) */
#define PY_OWNED_BY_GENERATOR 1
#define PY_CO_FIRSTLINENO 72     /* PyCodeObject.co_firstlineno (int) */
#define PY_CO_FILENAME 112       /* PyCodeObject.co_filename (str) */
#define PY_CO_QUALNAME 128       /* PyCodeObject.co_qualname (str) */
#define PY_CO_LINETABLE 136      /* PyCodeObject.co_linetable (bytes) */
#define PY_CO_FIRSTTRACEABLE 168 /* PyCodeObject._co_firsttraceable (int, code units) */
#define PY_CO_CODE 184           /* PyCodeObject.co_code_adaptive (the bytecode) */
#define PY_STR_LENGTH 16         /* PyASCIIObject.length (code points) */
#define PY_STR_STATE 32          /* PyASCIIObject.state bit field: kind 2..4, compact 5, ascii 6 */
#define PY_STR_ASCII_DATA 48     /* sizeof(PyASCIIObject): compact ASCII text follows */
#define PY_STR_DATA 72           /* sizeof(PyCompactUnicodeObject); for legacy strings, data.any */

/* A Python frame in a location's frames: a tag bit (user-space code addresses never have it)
 * and the id of a Python frame definition (a "P" line in the .mods file). */
#define PY_FRAME_TAG (1ull << 63)

#define PY_PTR(p, off) (*(const char *const *)((const char *)(p) + (off)))
#define PY_INT(p, off) (*(const int *)((const char *)(p) + (off)))

static void *const *py_tstate_current;        /* &_PyRuntime.gilstate.tstate_current */
static void *const *py_finalizing;            /* &_PyRuntime._finalizing */
static void *(*py_tstate_this_thread)(void);  /* PyGILState_GetThisThreadState */
static int (*py_addr2line)(void *, int);      /* PyCode_Addr2Line: pure, never allocates */
static uintptr_t py_eval_lo, py_eval_hi;      /* _PyEval_EvalFrameDefault's code */

/* Finds a CPython 3.11 release build in the process; 1 if its frames can be read. Calls dlsym:
 * the caller makes the thread's own allocations pass through. */
static int py_probe(void) {
    const unsigned long *version = dlsym(RTLD_DEFAULT, "Py_Version");
    if (!version || (*version >> 16) != 0x030B) return 0;
    if (dlsym(RTLD_DEFAULT, "_Py_RefTotal")) return 0;  /* debug build: another object layout */
    char *runtime = dlsym(RTLD_DEFAULT, "_PyRuntime");
    void *mine = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    void *a2l = dlsym(RTLD_DEFAULT, "PyCode_Addr2Line");
    void *eval = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    if (!runtime || !mine || !a2l || !eval) return 0;
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (dladdr1(eval, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
        py_eval_lo = (uintptr_t)eval;
        py_eval_hi = (uintptr_t)eval + sym->st_size;
    }
    py_finalizing = (void *const *)(runtime + PY_RT_FINALIZING);
    py_tstate_this_thread = (void *(*)(void))mine;
    py_addr2line = (int (*)(void *, int))a2l;
    __atomic_store_n(&py_tstate_current, (void *const *)(runtime + PY_RT_TSTATE_CURRENT),
                     __ATOMIC_RELEASE);
    return 1;
}

/* A frame that has run its first traceable instruction (the prelude that copies free variables
 * and makes cells is not yet the function's code: CPython's own _PyFrame_IsIncomplete). */
static inline int py_complete(const char *f) {
    const char *code = PY_PTR(f, PY_FR_CODE);
    return f[PY_FR_OWNER] == PY_OWNED_BY_GENERATOR ||
           PY_PTR(f, PY_FR_PREV_INSTR) >= code + PY_CO_CODE + 2 * PY_INT(code, PY_CO_FIRSTTRACEABLE);
}

/* The innermost frame of `f`'s chain that is complete, or NULL. */
static inline const char *py_innermost(const char *f) {
    while (f && !py_complete(f)) f = PY_PTR(f, PY_FR_PREVIOUS);
    return f;
}

/* The thread state of the calling thread: the one holding the GIL if that is this thread (which
 * covers subinterpreters), else this thread's own (it released the GIL, in C code). Not once
 * Py_Finalize has begun: it frees the states of threads that still run (daemon threads). */
static inline const char *py_thread_state(uintptr_t self) {
    const char *ts = __atomic_load_n(py_tstate_current, __ATOMIC_RELAXED);
    if (LIKELY(ts && *(const uintptr_t *)(ts + PY_TS_THREAD_ID) == self)) return ts;
    if (__atomic_load_n(py_finalizing, __ATOMIC_ACQUIRE)) return NULL;
    return py_tstate_this_thread();
}

/* The innermost complete Python frame of the calling thread, or NULL (no Python on this thread,
 * or the interpreter not running). */
static inline const char *py_frame(uintptr_t self) {
    const char *ts = py_thread_state(self);
    if (!ts) return NULL;
    const char *cf = PY_PTR(ts, PY_TS_CFRAME);
    return cf ? py_innermost(PY_PTR(cf, PY_CF_CURRENT)) : NULL;
}

/* The interning key of a frame's current instruction: the instruction's address names the code
 * object and the offset in it; the line table's address guards against a freed code object
 * whose memory another one took. */
static inline uint64_t py_key(const char *f) {
    uint64_t pc = (uint64_t)(uintptr_t)PY_PTR(f, PY_FR_PREV_INSTR);
    uint64_t lt = (uint64_t)(uintptr_t)PY_PTR(PY_PTR(f, PY_FR_CODE), PY_CO_LINETABLE);
    uint64_t h = (pc ^ (lt << 17) ^ (lt >> 13)) * 0xC2B2AE3D27D4EB4Full;
    return (h ^ (h >> 31)) | 1;
}

/* Python frames in a location without --stacks: the innermost is the call site, the ones below
 * say which of the program's own lines called the library code that allocated. */
#ifndef PY_STACK_MAX
#define PY_STACK_MAX 16
#endif

/* The interning key of the Python stack from f down (at most PY_STACK_MAX frames): the frames
 * below the innermost add the addresses of their current instructions (their code objects are
 * alive: the frames hold them). Two loads per frame. */
static inline uint64_t py_stack_key(const char *f) {
    uint64_t h = py_key(f);
    const char *p = PY_PTR(f, PY_FR_PREVIOUS);
    for (int d = 1; p && d < PY_STACK_MAX; d++, p = PY_PTR(p, PY_FR_PREVIOUS)) {
        h ^= (uint64_t)(uintptr_t)PY_PTR(p, PY_FR_PREV_INSTR);
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return h | 1;
}

/* The source line of a frame's current instruction (0 if it has none). */
static int py_line(const char *f) {
    const char *code = PY_PTR(f, PY_FR_CODE);
    long off = PY_PTR(f, PY_FR_PREV_INSTR) - (code + PY_CO_CODE);
    int line = py_addr2line((void *)code, off < 0 ? -1 : (int)off);
    return line > 0 ? line : 0;
}

/* Writes str object `o` as UTF-8 into out[0..cap); returns the bytes written (a longer string
 * is cut). Reads the object's fields: no call into the interpreter, nothing allocated. */
static size_t py_utf8(const char *o, char *out, size_t cap) {
    if (!o) return 0;
    uint32_t state = *(const uint32_t *)(o + PY_STR_STATE);
    uint64_t len = *(const uint64_t *)(o + PY_STR_LENGTH);
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    const unsigned char *d = compact ? (const unsigned char *)o + (ascii ? PY_STR_ASCII_DATA
                                                                         : PY_STR_DATA)
                                     : (const unsigned char *)PY_PTR(o, PY_STR_DATA);
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
