/* The CPU reference of topk_moe (IR_FUSED_TOPK_MOE, ir/fuse_topk_moe.c): per token row, exactly
 * what the unfused nodes compute, in their float/double choices and order, so the fused program
 * evaluates bit for bit like the unfused one:
 *   softmax gating   as ir/ref_softmax.c: max in f32 (-inf start, `max > x ? max : x`), expf(x -
 *                    max) in f32 summed in double in index order, times (float)(1.0 / sum);
 *   sigmoid gating   as ir_apply: 1.0f / (1.0f + expf(-x));
 *   delayed          probabilities are the logits themselves;
 *   selection        probs (+ bias[e], f32) ranked as ir/ref_sort.c ranks argsort_top_k: the first
 *                    k of the descending order, ties by index, -0 == +0, NaN above +inf;
 *   weights          probs of the selected experts (get_rows: a copy); delayed: softmax over the k
 *                    as above; norm: the k summed in double in order and rounded to f32 (sum_rows),
 *                    clamped with fmaxf(fminf(s, hi), lo) (clamp), w / s (div); scale: w * s + 0.0f
 *                    (ir_apply's scale with bias 0).
 * Everything is f32 (the pass only fuses f32 intermediates); the weights are rounded once to
 * dst's type when stored. */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ir/ref_sort.c's order-preserving pattern: unsigned comparison orders values as numbers. */
static uint32_t value_key(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu; /* NaN */
    if (u == 0x80000000u) u = 0;                              /* -0 -> +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* In place: x[0..n) becomes its softmax, as ir/ref_softmax.c computes a row (scale 1, no mask). */
static void softmax_row(float *x, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += (double)x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * inv;
}

/* Indices of the k smallest keys in ascending key order (keys are distinct); taken keys become
 * UINT64_MAX, which no real key equals (its low half would be index 2^32 - 1). */
static void select_k(uint64_t *keys, int64_t n, int k, int32_t *ids) {
    for (int j = 0; j < k; j++) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++)
            if (keys[i] < keys[best]) best = i;
        ids[j] = (int32_t)(keys[best] & 0xffffffffu);
        keys[best] = UINT64_MAX;
    }
}

/* The coordinates of weight j of row t in dst, which is [k, T] or [1, k, T]. */
static void weight_at(const ir_ref *d, int k, int64_t T, int j, int64_t t, int64_t c[4]) {
    bool flat = d->ne[0] == k && d->ne[1] == T;
    c[0] = flat ? j : 0, c[1] = flat ? t : j, c[2] = flat ? 0 : t, c[3] = 0;
}

typedef struct {
    float    *probs, *w;
    uint64_t *keys;
    int32_t  *ids;
} moe_scratch;

static void row(const ir_node *n, void **data, int64_t t, const moe_scratch *s) {
    const ir_moe *m = &n->moe;
    const ir_ref *x = ir_operand(n, 0), *b = m->bias_in >= 0 ? &n->in[m->bias_in] : NULL;
    int64_t       E = x->ne[0], T = n->dst2.ne[1];
    for (int64_t e = 0; e < E; e++) {
        int64_t c[4] = {e, t, 0, 0};
        float   v = kb_load_f32(data[x->buf], x->type, ir_offset_at(x, c));
        s->probs[e] = m->gating == IR_GATE_SIGMOID && !m->delayed ? 1.0f / (1.0f + expf(-v)) : v;
    }
    if (m->gating == IR_GATE_SOFTMAX && !m->delayed) softmax_row(s->probs, E);
    for (int64_t e = 0; e < E; e++) {
        int64_t c[4] = {e, t, 0, 0};
        float   sel = b ? s->probs[e] + kb_load_f32(data[b->buf], b->type, ir_offset_at(b, c)) : s->probs[e];
        s->keys[e] = (uint64_t)~value_key(sel) << 32 | (uint64_t)e;
    }
    select_k(s->keys, E, m->k, s->ids);
    for (int j = 0; j < m->k; j++) s->w[j] = s->probs[s->ids[j]];
    if (m->delayed) softmax_row(s->w, m->k);
    if (m->norm) {
        double sum = 0.0;
        for (int j = 0; j < m->k; j++) sum += (double)s->w[j];
        float sf = (float)sum;
        if (m->clamp) sf = fmaxf(fminf(sf, m->clamp_hi), m->clamp_lo);
        for (int j = 0; j < m->k; j++) s->w[j] = s->w[j] / sf;
    }
    if (m->scaled)
        for (int j = 0; j < m->k; j++) s->w[j] = s->w[j] * m->scale + 0.0f;
    for (int j = 0; j < m->k; j++) {
        int64_t ci[4] = {j, t, 0, 0}, cw[4];
        ((int32_t *)data[n->dst2.buf])[ir_offset_at(&n->dst2, ci)] = s->ids[j];
        weight_at(&n->dst, m->k, T, j, t, cw);
        kb_store_f32(data[n->dst.buf], n->dst.type, ir_offset_at(&n->dst, cw), s->w[j]);
    }
}

kiln_status ir_ref_moe(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    const ir_ref *x = ir_operand(n, 0);
    if (!x || n->fused != IR_FUSED_TOPK_MOE || !n->has_dst2 || n->moe.k < 1 || n->moe.k > x->ne[0])
        return kb_error(KILN_ERR_INVALID, "reference: malformed topk_moe node");
    int64_t     E = x->ne[0], T = n->dst2.ne[1];
    moe_scratch s = {malloc((size_t)E * sizeof *s.probs), malloc((size_t)n->moe.k * sizeof *s.w),
                     malloc((size_t)E * sizeof *s.keys), malloc((size_t)n->moe.k * sizeof *s.ids)};
    if (!s.probs || !s.w || !s.keys || !s.ids) {
        free(s.probs), free(s.w), free(s.keys), free(s.ids);
        return kb_oom();
    }
    for (int64_t t = 0; t < T; t++) row(n, data, t, &s);
    free(s.probs), free(s.w), free(s.keys), free(s.ids);
    return NULL;
}
