/* The learned policy's default predictor: lifetime class counts per (call site, size class), and
 * per call site, learned online from the replay itself (plus, optionally, counts from another
 * recording). It only knows what a running allocator could know at each moment:
 * - a freed block adds its true class;
 * - a block still live when its age crosses a class bound is a censored observation: its class
 *   is at least the next one. Timer queues, one per bound, find the crossings in O(1) per block
 *   and bound. Long-lived call sites are thus learned while their blocks live, not only when
 *   they die (or never).
 * Prediction: the smallest class c such that the freed blocks of class <= c make `quantile` of
 * the blocks known to be <= c or > c (freed ones, and censored ones whose lower bound is above
 * c; the others are undecided and left out), with at least one freed block; else the longest. */
#include <stdlib.h>
#include <string.h>

#include "lab.h"

#define ANY_SIZE 127

void pr_init(predictor *pr, int k, const u64 *bound, u64 quantile) {
    memset(pr, 0, sizeof(*pr));
    pr->k = k;
    pr->quantile = quantile;
    for (int c = 0; c + 1 < k && bound[c] != ~0ULL; c++)
        pr->bound[pr->nq++] = bound[c];
    hm_init(&pr->row_of);
}

void pr_free(predictor *pr) {
    hm_free(&pr->row_of);
    free(pr->rows);
    for (int j = 0; j < pr->nq; j++)
        free(pr->q[j].e);
    free(pr->blk);
}

void pr_clone(predictor *dst, const predictor *src) {
    *dst = *src;
    hm_clone(&dst->row_of, &src->row_of);
    dst->rows = lab_dup(src->rows, src->rows_cap * sizeof(u32));
    for (int j = 0; j < src->nq; j++)
        dst->q[j].e = lab_dup(src->q[j].e, src->q[j].cap * sizeof(pr_entry));
    dst->blk = lab_dup(src->blk, src->blk_cap * sizeof(pr_block));
}

/* A row: k counts of freed blocks by class, k counts of censored live blocks by lower-bound
 * class (slot 0 unused), then the number of freed blocks. */
static size_t row_len(const predictor *pr) { return 2 * (size_t)pr->k + 1; }

static u32 row(predictor *pr, u32 loc, int sc) {
    u64 key = (u64)loc << 7 | (u64)sc, i;
    if (!hm_get(&pr->row_of, key, &i)) {
        i = pr->nrows++;
        pr->rows = lab_grow(pr->rows, &pr->rows_cap, pr->nrows * row_len(pr), sizeof(u32));
        hm_put(&pr->row_of, key, i);
    }
    return (u32)i;
}

/* Adds n (n < 0: removes) freed blocks of class c to a block's two rows. */
static void add_freed(predictor *pr, const pr_block *b, int c, int n) {
    for (int r = 0; r < 2; r++) {
        u32 *h = &pr->rows[(size_t)(r ? b->row_site : b->row_size) * row_len(pr)];
        h[c] += (u32)n;
        h[2 * pr->k] += (u32)n;
    }
}

static void add_censored(predictor *pr, const pr_block *b, int lower, int n) {
    pr->rows[(size_t)b->row_size * row_len(pr) + pr->k + lower] += (u32)n;
    pr->rows[(size_t)b->row_site * row_len(pr) + pr->k + lower] += (u32)n;
}

void pr_prior(predictor *pr, u32 loc, int sc, int c, u32 n) {
    pr_block b = {0, row(pr, loc, ANY_SIZE), row(pr, loc, sc), 0, {0}};
    add_freed(pr, &b, c, (int)n);
}

static int quantile_class(const predictor *pr, const u32 *h) {
    const u32 *censored = h + pr->k;        /* by lower-bound class; censored[0] is 0 */
    u64 cum = 0, known = h[2 * pr->k];      /* freed, plus censored known to be above c */
    for (int j = 1; j < pr->k; j++)
        known += censored[j];
    for (int c = 0; c < pr->k; c++) {
        cum += h[c];
        known -= censored[c];               /* from here on, undecided: left out */
        if (cum && cum * 1000 >= known * pr->quantile)
            return c;
    }
    return pr->k - 1;
}

u8 pr_predict(predictor *pr, u32 loc, int sc) {
    u64 i;
    size_t n = row_len(pr);
    const u32 *h = NULL;
    if (hm_get(&pr->row_of, (u64)loc << 7 | (u64)sc, &i) && pr->rows[i * n + 2 * pr->k])
        h = &pr->rows[i * n];
    else if (hm_get(&pr->row_of, (u64)loc << 7 | ANY_SIZE, &i) && pr->rows[i * n + 2 * pr->k])
        h = &pr->rows[i * n];
    return (u8)(h ? quantile_class(pr, h) : pr->k - 1);
}

static void enqueue(pr_queue *q, u32 id, u32 gen, u64 clock0) {
    if (q->head && q->head + q->len == q->cap && q->head >= q->len) {   /* mostly dead: compact */
        memmove(q->e, q->e + q->head, q->len * sizeof(pr_entry));
        q->head = 0;
    }
    q->e = lab_grow(q->e, &q->cap, q->head + q->len + 1, sizeof(pr_entry));
    q->e[q->head + q->len++] = (pr_entry){id, gen, clock0};
}

void pr_born(predictor *pr, u32 id, u32 loc, int sc, u64 clock) {
    if (id >= pr->blk_cap)
        pr->blk = lab_grow(pr->blk, &pr->blk_cap, (size_t)id + 1, sizeof(pr_block));
    pr_block *b = &pr->blk[id];
    b->gen++;
    b->row_site = row(pr, loc, ANY_SIZE);
    b->row_size = row(pr, loc, sc);
    b->lower = 0;
    if (pr->nq)
        enqueue(&pr->q[0], id, b->gen, clock);
}

void pr_died(predictor *pr, u32 id, int c) {
    pr_block *b = &pr->blk[id];
    if (b->lower)
        add_censored(pr, b, b->lower, -1);
    add_freed(pr, b, c, 1);
    b->gen++;
}

void pr_advance(predictor *pr, u64 clock) {
    for (int j = 0; j < pr->nq; j++) {
        pr_queue *q = &pr->q[j];
        while (q->len && q->e[q->head].clock0 + pr->bound[j] <= clock) {
            pr_entry e = q->e[q->head++];
            q->len--;
            pr_block *b = &pr->blk[e.id];
            if (b->gen != e.gen)
                continue;   /* freed meanwhile */
            if (b->lower)
                add_censored(pr, b, b->lower, -1);
            b->lower = (u8)(j + 1);   /* lifetime >= bound[j]: class j + 1 at least */
            add_censored(pr, b, b->lower, 1);
            if (j + 1 < pr->nq)
                enqueue(&pr->q[j + 1], e.id, e.gen, e.clock0);
        }
        if (!q->len)
            q->head = 0;
    }
}
