/* The n-gram's k most likely labels per row (heapcast.forecast.models.ngram.NGram.predict_proba),
 * without a dense row of scores over every class.
 *
 * PPM-C blends the orders, longest first: a row whose context an order knows (n rows seen, d
 * distinct labels) gives each of that context's stored labels weight / (n + d) * count, and
 * passes weight * d / (n + d) on; what is left at the end goes to the unigram: weight * base[l]
 * for every class l. Only the labels of the row's contexts (a few per order) get more than the
 * unigram's share, so the best k are among them and the k classes with the largest base that
 * are not among them: no other class can beat those. The scores are computed with the same
 * float64 operations in the same order as the dense version (0 + each order's share, longest
 * first, + weight * base), so they are equal bit for bit; the k best are taken in the order
 * (score descending, class index ascending), which also decides ties at the k-th place (a
 * partition of the dense row chose among them arbitrarily).
 *
 * Built with -ffp-contract=off: no fused multiply-add, the numpy version's roundings. */
#include <stdint.h>
#include <stdlib.h>

#define HC_API __attribute__((visibility("default")))

/* One order's table (heapcast.forecast.models.ngram: NGram._table) and the rows' hits in it. */
typedef struct {
    const int64_t *hit;      /* per row: its context's index in the table, -1 if absent; NULL:
                                the order is skipped (an empty table) */
    const uint32_t *n, *d;   /* per context: rows seen, distinct labels */
    const void *start;       /* per context + 1: where its labels begin (uint32, or int64) */
    const void *tok;         /* labels (class indices: uint16, or uint32) */
    const uint32_t *cnt;     /* their counts */
    uint32_t start64, tok32; /* the widths of start and tok */
} hc_ngram_order;

enum { ERR_ARGS = -1, ERR_NOMEM = -2 };

/* Inserts (s, l) into the best list (best first, at most k long, *m entries). */
static inline void keep(double *bs, int64_t *bl, uint32_t *m, uint32_t k, double s, int64_t l) {
    uint32_t i = *m;
    if (!k) return;
    if (i == k) {   /* full: only if it beats the last */
        if (!(s > bs[k - 1] || (s == bs[k - 1] && l < bl[k - 1]))) return;
        i = k - 1;
    } else {
        (*m)++;
    }
    while (i > 0 && (s > bs[i - 1] || (s == bs[i - 1] && l < bl[i - 1]))) {
        bs[i] = bs[i - 1];
        bl[i] = bl[i - 1];
        i--;
    }
    bs[i] = s;
    bl[i] = l;
}

/* Rows 0..nrows-1: out_label[r * k + i] and out_score[r * k + i], i < k, their k best classes
 * and blended probabilities (class -1 and score 0 past the number of classes). `orders`:
 * longest first. `base`: the unigram's probability of each class; `by_base`: the classes by
 * base descending, index ascending among equal ones. Returns 0, ERR_ARGS or ERR_NOMEM. */
HC_API int hc_ngram_topk(uint64_t nrows, const hc_ngram_order *orders, uint32_t norders,
                         const double *base, const uint32_t *by_base, uint32_t nclasses,
                         uint32_t k, int64_t *out_label, double *out_score) {
    if (!k || (nrows && (!out_label || !out_score)) || (norders && !orders) ||
        (nclasses && (!base || !by_base)))
        return ERR_ARGS;
    int32_t *pos = malloc((nclasses ? nclasses : 1) * sizeof *pos);   /* class -> its entry */
    uint32_t cap = 256, used = 0;
    uint32_t *lab = malloc(cap * sizeof *lab);
    double *acc = malloc(cap * sizeof *acc);
    double *bs = malloc(k * sizeof *bs);
    int64_t *bl = malloc(k * sizeof *bl);
    int rc = 0;
    if (!pos || !lab || !acc || !bs || !bl) {
        rc = ERR_NOMEM;
        goto done;
    }
    for (uint32_t c = 0; c < nclasses; c++) pos[c] = -1;
    const uint32_t kk = k < nclasses ? k : nclasses;
    for (uint64_t r = 0; r < nrows; r++) {
        double w = 1.0;
        used = 0;
        for (uint32_t o = 0; o < norders; o++) {
            const hc_ngram_order *t = &orders[o];
            if (!t->hit) continue;
            const int64_t j = t->hit[r];
            if (j < 0) continue;
            const double n = (double)t->n[j], d = (double)t->d[j];
            const double share = w / (n + d);
            const uint64_t e0 = t->start64 ? (uint64_t)((const int64_t *)t->start)[j]
                                           : ((const uint32_t *)t->start)[j];
            const uint64_t e1 = t->start64 ? (uint64_t)((const int64_t *)t->start)[j + 1]
                                           : ((const uint32_t *)t->start)[j + 1];
            for (uint64_t e = e0; e < e1; e++) {
                const uint32_t l = t->tok32 ? ((const uint32_t *)t->tok)[e]
                                            : ((const uint16_t *)t->tok)[e];
                if (l >= nclasses) continue;   /* padding: no class */
                const double c = share * (double)t->cnt[e];
                if (pos[l] >= 0) {
                    acc[pos[l]] += c;
                    continue;
                }
                if (used == cap) {
                    uint32_t *nl = realloc(lab, 2 * cap * sizeof *lab);
                    if (nl) lab = nl;
                    double *na = nl ? realloc(acc, 2 * cap * sizeof *acc) : NULL;
                    if (!na) {
                        rc = ERR_NOMEM;
                        goto done;
                    }
                    acc = na;
                    cap *= 2;
                }
                pos[l] = (int32_t)used;
                lab[used] = l;
                acc[used++] = 0.0 + c;
            }
            w *= d / (n + d);
        }
        uint32_t m = 0;
        for (uint32_t i = 0; i < used; i++)
            keep(bs, bl, &m, kk, acc[i] + w * base[lab[i]], lab[i]);
        /* The classes that only the unigram scores, by base: the first kk of them, and any
         * after them that tie with the last (a lower index then wins). */
        uint32_t taken = 0;
        double last = 0.0;
        for (uint32_t i = 0; i < nclasses; i++) {
            const uint32_t l = by_base[i];
            if (l >= nclasses) {
                rc = ERR_ARGS;
                goto done;
            }
            if (pos[l] >= 0) continue;
            const double s = 0.0 + w * base[l];
            if (taken >= kk && s != last) break;
            keep(bs, bl, &m, kk, s, l);
            last = s;
            taken++;
        }
        for (uint32_t i = 0; i < used; i++) pos[lab[i]] = -1;
        for (uint32_t i = 0; i < k; i++) {
            out_label[r * k + i] = i < m ? bl[i] : -1;
            out_score[r * k + i] = i < m ? bs[i] : 0.0;
        }
    }
done:
    free(pos);
    free(lab);
    free(acc);
    free(bs);
    free(bl);
    return rc;
}
