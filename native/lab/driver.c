/* The replay driver: turns a process's events (EVENT_DTYPE blocks, in seq order) into ops in the
 * exact order of docs/trace-format.md ("How a heap is replayed", "Ordering"), matches each release
 * to its block by address, labels blocks with lifetime classes (true ones, predicted ones), and runs
 * every policy over each batch of ops. Memory: the live blocks, one batch, and a reorder window.
 *
 * Order: an event's acquisition happens at its seq; a moved realloc releases its old block at
 * seq - free_lag, which may come before events of other threads numbered in between. Pending ops
 * are kept sorted by (position, releases first) and executed once the stream has moved a window
 * of seq numbers past them: 4096, or twice the largest free_lag seen so far. A release that still
 * comes after ops it should precede is executed at once and counted (late_releases). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define MIN_WINDOW 4096
#define NO_INDEX (~0ULL)
#define MAX_THREADS 16        /* policies run side by side on at most this many threads */
#define PARALLEL_MIN_OPS 4096 /* smaller batches run on the calling thread alone */

enum { P_ACQ, P_REL, P_RESIZE, P_UNBIND, P_REBIND };

typedef struct {
    u64 pos, seq, addr, old_addr, size, ts, evidx, clock;
    u32 loc;
    u8 kind, rank, align_log2, pad;
} pend;

typedef struct {
    u64 size, clock0, evidx;
    u32 loc;
    u8 pred, pad[3];
} dblock;

typedef struct {
    u64 events, ops, acquisitions, releases, reallocs;
    u64 live_bytes, peak_live;
    u64 unknown_frees, double_acquires, late_releases;
    u64 pred_total, pred_exact, pred_shorter;
    u64 ns, clock;
    u64 sum_live16;                 /* live bytes (16-byte units) summed over ops */
} lab_stats;

typedef struct {
    int npol, k, clock_ns;
    u64 quantile;                   /* per mille */
    u64 bound[LAB_MAX_CLASSES];
    policy *pol[POL_COUNT * 2];
    hmap live, detached;            /* trace address -> block id; realloc seq -> block id */
    dblock *blocks;
    size_t block_cap, block_used;
    u32 *free_ids;
    size_t free_cap, free_n;
    pend *pq;                       /* pending ops, sorted, from pq_head */
    size_t pq_cap, pq_head, pq_len;
    u64 last_pos;                   /* position of the last executed op */
    u64 window;                     /* ops this many seq numbers old are executed */
    lab_op *batch;
    size_t batch_cap, batch_n;
    predictor pr;                   /* learned-lifetime's call-site predictor */
    const u8 *oracle, *model;       /* per event of this process, or NULL */
    u8 *lifetimes;                  /* out: true class per acquisition event, or NULL */
    u64 nclass_events;
    u64 series_every, series_left, series_max;
    u64 *s_ts, *s_live;
    size_t s_cap, s_n;
    lab_stats st;
    int threads;                    /* threads for a batch's policies (run_batch) */
    size_t parallel_min;            /* batches of fewer ops run on the calling thread */
    int next_pol;                   /* the next policy a thread of run_batch takes */
    int threads_used;               /* the most threads a batch ran on (lab_threads) */
} lab_replay;

/* Threads for the policies: HEAPCAST_LAB_THREADS if set (then for batches of any size: the
 * tests' way to run small replays side by side), else the CPUs this process may run on. */
static void choose_threads(lab_replay *r) {
    const char *v = getenv("HEAPCAST_LAB_THREADS");
    int n = v && *v ? atoi(v) : 0;
    r->parallel_min = n > 0 ? 1 : PARALLEL_MIN_OPS;
    if (n <= 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    }
    r->threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

LAB_API lab_replay *lab_new(const int *kinds, int n, const u64 *params, int checked, u64 series_every) {
    if (n < 0 || n > POL_COUNT * 2)
        return NULL;
    lab_replay *r = calloc(1, sizeof(*r));
    if (!r)
        lab_fatal("out of memory");
    r->k = params[PARAM_NCLASSES] ? (int)params[PARAM_NCLASSES] : 1;
    if (r->k > LAB_MAX_CLASSES)
        r->k = LAB_MAX_CLASSES;
    for (int c = 0; c < r->k; c++)
        r->bound[c] = c + 1 < r->k && params[PARAM_BOUND0 + c] ? params[PARAM_BOUND0 + c] : ~0ULL;
    r->clock_ns = params[PARAM_CLOCK] == 1;
    r->quantile = params[PARAM_QUANTILE] ? params[PARAM_QUANTILE] : 900;
    r->series_every = r->series_left = series_every;
    r->window = MIN_WINDOW;
    choose_threads(r);
    for (int i = 0; i < n; i++) {
        r->pol[i] = pol_new(kinds[i], checked, params);
        if (!r->pol[i])
            lab_fatal("unknown policy");
        r->pol[i]->s.every = r->pol[i]->s.countdown = series_every;
        r->npol++;
    }
    hm_init(&r->live);
    hm_init(&r->detached);
    pr_init(&r->pr, r->k, r->bound, r->quantile);
    return r;
}

LAB_API void lab_set_classes(lab_replay *r, const u8 *oracle, const u8 *model, u8 *lifetimes,
                             u64 n_events) {
    r->oracle = oracle;
    r->model = model;
    r->lifetimes = lifetimes;
    r->nclass_events = n_events;
}

static int size_class(u64 size) { return size ? 64 - __builtin_clzll(size) : 0; }

/* Prior class counts learned elsewhere: n rows of (location id, size class, k counts). */
LAB_API void lab_set_prior(lab_replay *r, const u32 *locs, const u8 *scs, const u32 *counts, u64 n) {
    for (u64 i = 0; i < n; i++)
        for (int c = 0; c < r->k; c++)
            if (counts[i * r->k + c])
                pr_prior(&r->pr, locs[i], scs[i], c, counts[i * r->k + c]);
}

static int class_of(const lab_replay *r, u64 lifetime) {
    int c = 0;
    while (c + 1 < r->k && lifetime >= r->bound[c])
        c++;
    return c;
}

static void emit(lab_replay *r, u8 kind, u32 id, u32 old, u64 size, u8 align_log2, u64 clock, u64 ts,
                 u8 oracle, u8 pred) {
    r->batch = lab_grow(r->batch, &r->batch_cap, r->batch_n + 1, sizeof(lab_op));
    r->batch[r->batch_n++] = (lab_op){size, clock, ts, id, old, kind, align_log2, oracle, pred, 0};
    r->st.sum_live16 += r->st.live_bytes >> 4;
    if (r->series_every) {
        if (r->st.live_bytes > r->series_max)
            r->series_max = r->st.live_bytes;
        if (--r->series_left == 0) {
            if (r->s_n == r->s_cap) {
                r->s_cap = r->s_cap ? 2 * r->s_cap : 256;
                r->s_ts = realloc(r->s_ts, r->s_cap * sizeof(u64));
                r->s_live = realloc(r->s_live, r->s_cap * sizeof(u64));
                if (!r->s_ts || !r->s_live)
                    lab_fatal("out of memory");
            }
            r->s_ts[r->s_n] = ts;
            r->s_live[r->s_n++] = r->series_max;
            r->series_left = r->series_every;
            r->series_max = 0;
        }
    }
}

static u32 new_block(lab_replay *r, const pend *x, u8 *oracle, u8 *pred) {
    u32 id;
    if (r->free_n)
        id = r->free_ids[--r->free_n];
    else {
        r->blocks = lab_grow(r->blocks, &r->block_cap, r->block_used + 1, sizeof(dblock));
        id = (u32)r->block_used++;
    }
    int known = x->evidx < r->nclass_events;
    *oracle = known && r->oracle ? r->oracle[x->evidx] : LAB_NO_CLASS;
    int sc = size_class(x->size);
    *pred = known && r->model ? r->model[x->evidx] : pr_predict(&r->pr, x->loc, sc);
    pr_born(&r->pr, id, x->loc, sc, x->clock);
    if (known && r->lifetimes)
        r->lifetimes[x->evidx] = (u8)(r->k - 1);   /* never freed, unless a release says otherwise */
    r->blocks[id] = (dblock){x->size, x->clock, known ? x->evidx : NO_INDEX, x->loc, *pred, {0}};
    r->st.acquisitions++;
    r->st.live_bytes += x->size;
    if (r->st.live_bytes > r->st.peak_live)
        r->st.peak_live = r->st.live_bytes;
    return id;
}

static void end_block(lab_replay *r, u32 id, u64 clock) {
    dblock *b = &r->blocks[id];
    int c = class_of(r, clock >= b->clock0 ? clock - b->clock0 : 0);
    if (b->evidx != NO_INDEX && r->lifetimes)
        r->lifetimes[b->evidx] = (u8)c;
    pr_died(&r->pr, id, c);
    if (b->pred != LAB_NO_CLASS) {
        r->st.pred_total++;
        r->st.pred_exact += b->pred == c;
        r->st.pred_shorter += b->pred < c;
    }
    r->st.releases++;
    r->st.live_bytes -= b->size;
}

static void drop_id(lab_replay *r, u32 id) {
    r->free_ids = lab_grow(r->free_ids, &r->free_cap, r->free_n + 1, sizeof(u32));
    r->free_ids[r->free_n++] = id;
}

static void bind(lab_replay *r, u64 addr, u32 id) {
    u64 old;
    if (hm_get(&r->live, addr, &old))
        r->st.double_acquires++;   /* the old block stays live (leaked), as heap.match does */
    hm_put(&r->live, addr, id);
}

static void acquire(lab_replay *r, const pend *x, u64 addr) {
    u8 o, p;
    u32 id = new_block(r, x, &o, &p);
    bind(r, addr, id);
    emit(r, OP_ALLOC, id, 0, x->size, x->align_log2, x->clock, x->ts, o, p);
}

/* A realloc: `old` (already ended when its release came first) becomes a new block. */
static void reacquire(lab_replay *r, const pend *x, u32 old, int ended) {
    u8 o, p;
    if (!ended)
        end_block(r, old, x->clock);
    u32 id = new_block(r, x, &o, &p);
    bind(r, x->addr, id);
    r->st.reallocs++;
    emit(r, OP_REALLOC, id, old, x->size, x->align_log2, x->clock, x->ts, o, p);
    drop_id(r, old);
}

static void execute(lab_replay *r, const pend *x) {
    u64 v;
    r->last_pos = x->pos;
    pr_advance(&r->pr, x->clock);
    switch (x->kind) {
    case P_ACQ:
        acquire(r, x, x->addr);
        break;
    case P_REL:
        if (!hm_del(&r->live, x->old_addr, &v)) {
            r->st.unknown_frees++;
            break;
        }
        end_block(r, (u32)v, x->clock);
        emit(r, OP_FREE, (u32)v, 0, 0, 0, x->clock, x->ts, 0, 0);
        drop_id(r, (u32)v);
        break;
    case P_RESIZE:
        if (!hm_del(&r->live, x->addr, &v)) {
            r->st.unknown_frees++;
            acquire(r, x, x->addr);
        } else {
            reacquire(r, x, (u32)v, 0);
        }
        break;
    case P_UNBIND:
        if (hm_del(&r->live, x->old_addr, &v)) {
            end_block(r, (u32)v, x->clock);
            hm_put(&r->detached, x->seq, v);
        } else
            r->st.unknown_frees++;
        break;
    case P_REBIND:
        if (hm_del(&r->detached, x->seq, &v))
            reacquire(r, x, (u32)v, 1);
        else
            acquire(r, x, x->addr);
        break;
    }
}

static inline int pend_before(const pend *a, const pend *b) {
    return a->pos < b->pos || (a->pos == b->pos && a->rank < b->rank);
}

static void push(lab_replay *r, const pend *x) {
    if (r->pq_head && r->pq_head + r->pq_len == r->pq_cap && r->pq_head >= r->pq_len) {   /* compact */
        memmove(r->pq, r->pq + r->pq_head, r->pq_len * sizeof(pend));
        r->pq_head = 0;
    }
    r->pq = lab_grow(r->pq, &r->pq_cap, r->pq_head + r->pq_len + 1, sizeof(pend));
    pend *q = r->pq + r->pq_head;
    size_t i = r->pq_len++;
    while (i > 0 && pend_before(x, &q[i - 1])) {   /* out of order: only moved reallocs */
        q[i] = q[i - 1];
        i--;
    }
    q[i] = *x;
    if (x->rank == 0 && x->pos < r->last_pos)
        r->st.late_releases++;
}

/* Executing an op looks its trace address up in the live map, a miss of the cache when the map
 * is large: the op this many places ahead has its slot fetched meanwhile. */
#define PREFETCH_AHEAD 8

static void drain(lab_replay *r, u64 before) {
    while (r->pq_len && r->pq[r->pq_head].pos < before) {
        if (r->pq_len > PREFETCH_AHEAD) {
            const pend *y = &r->pq[r->pq_head + PREFETCH_AHEAD];
            hm_prefetch(&r->live, y->kind == P_REL || y->kind == P_UNBIND ? y->old_addr : y->addr);
        }
        execute(r, &r->pq[r->pq_head]);
        r->pq_head++;
        r->pq_len--;
    }
    if (!r->pq_len)
        r->pq_head = 0;
}

/* Runs policies on the batch, taking the next one not yet taken until none is left. */
static void *run_policies(void *arg) {
    lab_replay *r = arg;
    for (int i; (i = __atomic_fetch_add(&r->next_pol, 1, __ATOMIC_RELAXED)) < r->npol;)
        pol_run(r->pol[i], r->batch, r->batch_n);
    return NULL;
}

/* Every policy over the batch. Each has its heap of its own and reads the batch only, so they
 * run side by side, one thread per CPU (the replays of `heapcast simulate` took half its time
 * on one core of two); each one's figures are what it gives alone. */
static void run_batch(lab_replay *r) {
    pthread_t t[MAX_THREADS];
    int started = 0, want = r->threads < r->npol ? r->threads : r->npol;
    r->next_pol = 0;
    if (r->batch_n >= r->parallel_min)
        while (started < want - 1 && pthread_create(&t[started], NULL, run_policies, r) == 0)
            started++;
    run_policies(r);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    if (started + 1 > r->threads_used)
        r->threads_used = started + 1;
    r->st.ops += r->batch_n;
    r->batch_n = 0;
}

static u8 align_log2_of(const lab_event *e) {
    u64 a = 0;
    if (e->op == EV_POSIX_MEMALIGN || e->op == EV_ALIGNED_ALLOC || e->op == EV_MEMALIGN)
        a = e->arg;
    else if (e->op == EV_VALLOC || e->op == EV_PVALLOC)
        a = 4096;
    if (a <= 8 || (a & (a - 1)))   /* 16 is every policy's default, but not the packer's at grain 8 */
        return 0;
    return (u8)__builtin_ctzll(a);
}

LAB_API void lab_feed(lab_replay *r, const lab_event *ev, u64 n, u64 first_index) {
    u64 t0 = lab_now_ns();
    for (u64 i = 0; i < n; i++) {
        const lab_event *e = &ev[i];
        u64 clock = r->clock_ns ? e->ts : r->st.clock;
        r->st.clock++;
        pend x = {e->seq, e->seq, e->addr, e->old_addr, e->size, e->ts, first_index + i, clock,
                  e->loc, P_ACQ, 1, 0, 0};
        switch (e->op) {
        case EV_MALLOC: case EV_CALLOC: case EV_POSIX_MEMALIGN: case EV_ALIGNED_ALLOC:
        case EV_MEMALIGN: case EV_VALLOC: case EV_PVALLOC:
            if (e->addr) {
                x.align_log2 = align_log2_of(e);
                push(r, &x);
            }
            break;
        case EV_FREE:
            if (e->old_addr) {
                x.kind = P_REL;
                x.rank = 0;
                push(r, &x);
            }
            break;
        case EV_REALLOC: case EV_REALLOCARRAY:
            if (!e->old_addr) {
                if (e->addr)
                    push(r, &x);
            } else if (!e->addr) {
                if (!e->size) {
                    x.kind = P_REL;
                    x.rank = 0;
                    push(r, &x);
                }
            } else if (e->addr == e->old_addr) {
                x.kind = P_RESIZE;
                push(r, &x);
            } else {
                pend u = x;
                u.kind = P_UNBIND;
                u.rank = 0;
                u.pos = e->seq >= e->free_lag ? e->seq - e->free_lag : 0;
                if (2 * (u64)e->free_lag > r->window)
                    r->window = 2 * (u64)e->free_lag;
                push(r, &u);
                x.kind = P_REBIND;
                push(r, &x);
            }
            break;
        default:
            break;   /* mmap, munmap, mremap: not heap blocks */
        }
    }
    r->st.events += n;
    if (n && ev[n - 1].seq > r->window)
        drain(r, ev[n - 1].seq - r->window);
    u64 t1 = lab_now_ns();
    r->st.ns += t1 - t0;
    run_batch(r);
}

LAB_API void lab_finish(lab_replay *r) {
    u64 t0 = lab_now_ns();
    drain(r, ~0ULL);
    for (size_t i = 0; i < r->live.cap; i++) {   /* blocks never freed: the last class */
        if (r->live.e[i].key == ~0ULL)
            continue;
        u8 pred = r->blocks[r->live.e[i].val].pred;
        r->st.pred_total++;
        r->st.pred_exact += pred == r->k - 1;
        r->st.pred_shorter += pred < r->k - 1;
    }
    r->st.ns += lab_now_ns() - t0;
    run_batch(r);
}

/* A forked child's replay: the state just before the parent's seq `fork_seq`, every policy's heap
 * included. Its blocks keep their ids; lifetimes of inherited blocks are not written. */
LAB_API lab_replay *lab_fork(lab_replay *r, u64 fork_seq) {
    drain(r, fork_seq);
    run_batch(r);
    lab_replay *c = malloc(sizeof(*c));
    if (!c)
        lab_fatal("out of memory");
    *c = *r;
    for (int i = 0; i < r->npol; i++) {
        c->pol[i] = pol_clone(r->pol[i]);
        lab_metrics *m = &c->pol[i]->m;
        m->peak_footprint = pol_footprint(c->pol[i]);
        m->peak_live_at_footprint = m->live_bytes;
        m->internal_at_peak = m->chunk_bytes - m->live_bytes;
        m->peak_pages4k = pg_4k(&c->pol[i]->pg);
        m->peak_pages2m = pg_2m(&c->pol[i]->pg);
        m->peak_chunk_bytes = m->chunk_bytes;
        m->peak_mmapped = m->mmapped;
        m->ns = m->ops = m->events = m->moves = m->inplace = m->reclassified = 0;
        m->sum_footprint16 = m->sum_pages4k = 0;
        c->pol[i]->s.n = 0;
    }
    hm_clone(&c->live, &r->live);
    hm_clone(&c->detached, &r->detached);
    c->blocks = lab_dup(r->blocks, r->block_cap * sizeof(dblock));
    for (size_t i = 0; i < c->block_used; i++)
        c->blocks[i].evidx = NO_INDEX;
    c->free_ids = lab_dup(r->free_ids, r->free_cap * sizeof(u32));
    pr_clone(&c->pr, &r->pr);
    c->pq = NULL;
    c->pq_cap = c->pq_head = c->pq_len = 0;
    c->batch = NULL;
    c->batch_cap = c->batch_n = 0;
    c->s_ts = c->s_live = NULL;
    c->s_cap = c->s_n = 0;
    c->oracle = c->model = NULL;
    c->lifetimes = NULL;
    c->nclass_events = 0;
    u64 live = r->st.live_bytes;
    memset(&c->st, 0, sizeof(c->st));
    c->st.live_bytes = c->st.peak_live = live;
    c->st.clock = r->st.clock;
    return c;
}

LAB_API void lab_free(lab_replay *r) {
    if (!r)
        return;
    for (int i = 0; i < r->npol; i++)
        pol_free(r->pol[i]);
    hm_free(&r->live);
    hm_free(&r->detached);
    free(r->blocks);
    free(r->free_ids);
    free(r->pq);
    free(r->batch);
    pr_free(&r->pr);
    free(r->s_ts);
    free(r->s_live);
    free(r);
}

LAB_API void lab_get_stats(const lab_replay *r, lab_stats *out) { *out = r->st; }

LAB_API int lab_get_metrics(const lab_replay *r, int i, lab_metrics *out) {
    if (i < 0 || i >= r->npol)
        return -1;
    *out = r->pol[i]->m;
    out->events = r->st.events;
    return 0;
}

LAB_API const char *lab_failure(const lab_replay *r, int i) {
    return i >= 0 && i < r->npol ? r->pol[i]->failure : NULL;
}

/* Copies the footprint series: policy i (extent, 4 KiB pages) or, for i = -1, the driver's
 * (ns time stamp, live bytes). Returns the number of samples (copies at most cap). */
LAB_API u64 lab_get_series(const lab_replay *r, int i, u64 *a, u64 *b, u64 cap) {
    const u64 *x, *y;
    u64 n;
    if (i < 0) {
        x = r->s_ts, y = r->s_live, n = r->s_n;
    } else if (i < r->npol) {
        x = r->pol[i]->s.extent, y = r->pol[i]->s.pages4k, n = r->pol[i]->s.n;
    } else {
        return 0;
    }
    if (a && b && n) {
        memcpy(a, x, min_u64(n, cap) * sizeof(u64));
        memcpy(b, y, min_u64(n, cap) * sizeof(u64));
    }
    return n;
}

/* The most threads a batch's policies ran on so far (1 when every batch was too small). */
LAB_API int lab_threads(const lab_replay *r) {
    return r->threads_used > 1 ? r->threads_used : 1;
}

/* Struct sizes, for the Python side to check its mirrors: 0 lab_stats, 1 lab_metrics, else
 * lab_event. */
LAB_API u64 lab_sizeof(int what) {
    return what == 0 ? sizeof(lab_stats) : what == 1 ? sizeof(lab_metrics) : sizeof(lab_event);
}
