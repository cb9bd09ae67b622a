/* pymalloc's own allocations (`heapcast record --pymalloc`), included by recorder.c.
 *
 * CPython serves objects and PyMem_Malloc's requests of up to 512 bytes from its own arenas
 * (pymalloc), which it maps with mmap: the malloc hooks never see them. Like tracemalloc and
 * memray, we wrap the interpreter's PYMEM_DOMAIN_MEM and PYMEM_DOMAIN_OBJ allocators
 * (PyMem_SetAllocator, a stable API since 3.4): each wrapper calls the allocator it replaced and
 * records the call as a malloc, calloc, realloc or free event. The calls they make below
 * (pymalloc hands a request over 512 bytes to malloc) pass through unrecorded, so each request is
 * one event.
 *
 * When: CPython allows replacing an allocator of a running interpreter if the new one wraps the
 * old, with the GIL held. The recorder installs the wrappers at the first event at a new location
 * (location_slow, never on the per-event path) of a thread that holds the GIL once
 * Py_IsInitialized(); what pymalloc handed out before (the interpreter's start-up) is unknown to
 * the trace, so its later frees are frees of unknown blocks. The .mods file says from which seq
 * on pymalloc was recorded ("Y" line). */

typedef struct {                   /* PyMemAllocatorEx */
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr);
} pym_allocator;

enum { PYM_DOMAIN_MEM = 1, PYM_DOMAIN_OBJ = 2 };   /* PyMemAllocatorDomain */

static pym_allocator pym_orig[2];       /* the allocators replaced: MEM, OBJ */
static int (*pym_is_initialized)(void);
static void (*pym_get)(int, pym_allocator *);
static void (*pym_set)(int, pym_allocator *);

/* The symbols the wrappers need, looked up with py_probe's (dlsym: the caller passes its own
 * allocations through). 0 if this interpreter lacks one. */
static int pym_probe(void) {
    pym_is_initialized = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    pym_get = (void (*)(int, pym_allocator *))dlsym(RTLD_DEFAULT, "PyMem_GetAllocator");
    pym_set = (void (*)(int, pym_allocator *))dlsym(RTLD_DEFAULT, "PyMem_SetAllocator");
    return pym_is_initialized && pym_get && pym_set;
}

/* The wrappers: ctx is the replaced allocator. The calls into it are the recorder's own
 * (t->own): what pymalloc asks of malloc is part of this one event. errno: the slow paths keep
 * it (quiet.h). */
static void *pym_malloc(void *ctx, size_t n) {
    const pym_allocator *o = ctx;
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t))) return o->malloc(o->ctx, n);
    t->own++;
    void *p = o->malloc(o->ctx, n);
    t->own--;
    uint64_t now = event_ticks(t), seq = next_seq();
    emit(t, HC_MALLOC, seq, now, p, n, CALLSITE);
    return p;
}

static void *pym_calloc(void *ctx, size_t nelem, size_t elsize) {
    const pym_allocator *o = ctx;
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t))) return o->calloc(o->ctx, nelem, elsize);
    t->own++;
    void *p = o->calloc(o->ctx, nelem, elsize);
    t->own--;
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_CALLOC, seq, now, p, mul_sat(nelem, elsize), NULL, nelem, 0, CALLSITE);
    return p;
}

static void *pym_realloc(void *ctx, void *p, size_t n) {
    const pym_allocator *o = ctx;
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t))) return o->realloc(o->ctx, p, n);
    uint64_t before = next_seq();
    t->own++;
    void *q = o->realloc(o->ctx, p, n);
    t->own--;
    uint64_t now = event_ticks(t), seq = next_seq();
    emit_ext(t, HC_REALLOC, seq, now, q, n, p, 0, seq - before, CALLSITE);
    return q;
}

static void pym_free(void *ctx, void *p) {
    const pym_allocator *o = ctx;
    struct tstate *t = &T;
    if (UNLIKELY(!thread_ready(t))) { o->free(o->ctx, p); return; }
    uint64_t now = event_ticks(t), seq = next_seq();   /* before the release, as free() takes it */
    emit(t, HC_FREE, seq, now, p, 0, CALLSITE);
    t->own++;
    o->free(o->ctx, p);
    t->own--;
}

/* Whether the calling thread holds the GIL: 3.11, the GIL holder's state is this thread's;
 * 3.12+, a thread state is attached to this thread. */
static int pym_holds_gil(uintptr_t self) {
    if (py_tstate_attached) return py_tstate_attached() != NULL;
    const char *ts = __atomic_load_n(py_tstate_current, __ATOMIC_RELAXED);
    return ts && *(const uintptr_t *)(ts + PL.ts_thread_id) == self;
}

/* Writes "Y <seq>" to the .mods file: pymalloc's allocations are recorded from event seq on. */
static void pym_note(uint64_t seq) {
    if (g_mods.fd < 0) return;
    struct textbuf tb;
    tb_init(&tb);
    tb_str(&tb, "Y ");
    tb_hex(&tb, seq);
    tb_str(&tb, "\n");
    T.busy++;
    tb_flush(&tb);
    T.busy--;
}

/* Installs the wrappers, from an event (at a location the thread had not seen: location_slow)
 * of a thread that holds the GIL once the interpreter is initialized (and not finalizing); other
 * calls return at once. Not from a signal handler's nested event. */
static __attribute__((noinline)) void pym_install(struct tstate *t) {
    if (t->emitting > 1 || t->busy || t->own) return;
    if (!pym_is_initialized() || __atomic_load_n(py_finalizing, __ATOMIC_ACQUIRE) ||
        !pym_holds_gil(t->self))
        return;
    int waiting = 1;
    if (!__atomic_compare_exchange_n(&g_pym_state, &waiting, 2, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    t->own++;   /* neither call allocates; if one did, it would pass through */
    pym_get(PYM_DOMAIN_MEM, &pym_orig[0]);
    pym_get(PYM_DOMAIN_OBJ, &pym_orig[1]);
    pym_allocator mem = {&pym_orig[0], pym_malloc, pym_calloc, pym_realloc, pym_free};
    pym_allocator obj = {&pym_orig[1], pym_malloc, pym_calloc, pym_realloc, pym_free};
    pym_set(PYM_DOMAIN_MEM, &mem);
    pym_set(PYM_DOMAIN_OBJ, &obj);
    t->own--;
    pym_note(__atomic_load_n(&H->seq, __ATOMIC_ACQUIRE));
    __atomic_store_n(&g_pym_state, 3, __ATOMIC_RELEASE);
}
