/* The times of `record --clock-every N`'s events between two clock readings of their thread,
 * estimated in one pass over a section's rows (heapcast/trace/steps.py says what is spread and
 * why). The numpy form this replaced sorted each section's rows by thread and gathered and
 * scattered them: 17-26 ns an event in every read of such a trace; this is a pass with a few
 * loads and stores an event.
 *
 * Each thread has its current run: its reading, how many rows carry it, and the rows themselves
 * (at most N: a longer run is not spread). A row with a new time ends its thread's run; a run of
 * exactly N rows whose next reading is at most max_gap later is spread between the two readings:
 * row k of the run gets t0 + (t1 - t0) * k / N (integer division). Runs still open at the end
 * (a thread's last run in the section) keep their reading. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HC_API __attribute__((visibility("default")))

enum { ERR_NOMEM = -3, ERR_ARGS = -1 };

typedef struct {
    uint32_t tid, count;   /* count: rows of the current run (more than N: not spread) */
    uint64_t t0;           /* the run's reading */
    uint32_t *rows;        /* the run's first N rows, room for `room` (grown as runs need: a
                              section of many threads' short runs must not take N rows each) */
    uint32_t room;
} run;

typedef struct {
    run *slot;             /* open addressing on the thread id; rows == NULL: empty */
    uint32_t cap, used, every;
} runs;

static uint32_t hash(uint32_t tid) { return tid * 2654435761u; }

static int grow(runs *r) {
    uint32_t cap = r->cap ? r->cap * 2 : 16;
    run *slot = calloc(cap, sizeof *slot);
    if (!slot) return 0;
    for (uint32_t i = 0; i < r->cap; i++) {
        if (!r->slot[i].rows) continue;
        uint32_t j = hash(r->slot[i].tid) & (cap - 1);
        while (slot[j].rows) j = (j + 1) & (cap - 1);
        slot[j] = r->slot[i];
    }
    free(r->slot);
    r->slot = slot;
    r->cap = cap;
    return 1;
}

/* The run of thread `tid`, a new empty one the first time; NULL without memory. */
static run *find(runs *r, uint32_t tid) {
    if (r->cap) {
        uint32_t j = hash(tid) & (r->cap - 1);
        for (; r->slot[j].rows; j = (j + 1) & (r->cap - 1))
            if (r->slot[j].tid == tid) return &r->slot[j];
    }
    if (2 * (r->used + 1) > r->cap && !grow(r)) return NULL;
    uint32_t j = hash(tid) & (r->cap - 1);
    while (r->slot[j].rows) j = (j + 1) & (r->cap - 1);
    run *s = &r->slot[j];
    s->room = r->every < 16 ? r->every : 16;
    if (!(s->rows = malloc(sizeof *s->rows * s->room))) return NULL;
    s->tid = tid;
    s->count = 0;
    r->used++;
    return s;
}

/* Spreads, in place, the complete runs of `every` equal times of a thread among n rows in seq
 * order: ts (uint64 ns) and tid (uint32) at byte strides ts_stride and tid_stride. Returns the
 * runs spread, or a negative error (ERR_ARGS: n or every out of range; ERR_NOMEM). */
HC_API int64_t hc_spread_steps(uint8_t *ts, uint64_t ts_stride, const uint8_t *tid,
                               uint64_t tid_stride, uint64_t n, uint32_t every, uint64_t max_gap) {
    if (every < 2 || n > UINT32_MAX) return ERR_ARGS;
    runs r = {.every = every};
    int64_t spread = 0;
    /* The current thread's run is kept in locals (the rows of a section are mostly one thread's
     * in a row), and stored back in its slot when another thread's row comes. */
    run *s = NULL;
    uint32_t cur = 0, count = 0, room = 0, *rows = NULL;
    uint64_t t0 = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t th;
        uint64_t t;
        memcpy(&th, tid + i * tid_stride, 4);
        memcpy(&t, ts + i * ts_stride, 8);
        if (!s || th != cur) {
            if (s) {
                s->t0 = t0;
                s->count = count;
                s->rows = rows;
                s->room = room;
            }
            if (!(s = find(&r, th))) {
                spread = ERR_NOMEM;
                break;
            }
            cur = th, t0 = s->t0, count = s->count, rows = s->rows, room = s->room;
        }
        if (count && t == t0) {
            if (count < every) {
                if (count == room) {   /* (room < every here) */
                    room = room * 2 < every ? room * 2 : every;
                    uint32_t *more = realloc(rows, sizeof *rows * room);
                    if (!more) {
                        spread = ERR_NOMEM;
                        break;
                    }
                    s->rows = rows = more;   /* (freed from its slot at the end) */
                }
                rows[count] = (uint32_t)i;
            }
            count += count <= every;   /* (every + 1: longer than a run, never spread) */
            continue;
        }
        /* (a thread's times never go back; a wrapped difference fails the bound anyway) */
        uint64_t gap = t - t0;
        if (count == every && gap <= max_gap) {
            /* gap * k / every for k = 1.., without a division a row: q * k, plus the carries
             * of r * k (r < every, so at most one a step) */
            uint64_t q = gap / every, rem = gap % every, v = t0, carry = 0;
            for (uint32_t k = 1; k < every; k++) {
                v += q;
                carry += rem;
                if (carry >= every) {
                    carry -= every;
                    v++;
                }
                memcpy(ts + (uint64_t)rows[k] * ts_stride, &v, 8);
            }
            spread++;
        }
        t0 = t;
        count = 1;
        rows[0] = (uint32_t)i;
    }
    for (uint32_t j = 0; j < r.cap; j++) free(r.slot[j].rows);
    free(r.slot);
    return spread;
}
