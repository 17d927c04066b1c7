/* CPU reference of the softmax family: soft_max, soft_max_ext.
 *
 * ggml's CPU kernel (ggml_compute_forward_soft_max_f32 in ggml/src/ggml-cpu/ops.cpp), step by
 * step, per row (i1, i2, i3) of a:
 *   w[i]  = a[i] * scale                      f32
 *   w[i] += slope * mask[i, i1, i2 % m.ne2, i3 % m.ne3]   f32 (slope = 1 unless max_bias > 0)
 *   max   = max(w[0..n), sinks[i2])           -inf start; the sink only when present
 *   y[i]  = expf(w[i] - max)                  f32, summed in double
 *   sum  += expf(sinks[i2] - max)             the sink joins the denominator, not the output
 *   out   = y[i] * (float)(1.0 / sum)
 * A row masked entirely to -inf has max = -inf and gives NaN (-inf - -inf), as in ggml, unless
 * a sink makes max finite (then the row is 0). ALiBi: n_head = a.ne2, head h = i2,
 * n_head_log2 = 2^floor(log2(n_head)), m0 = 2^(-max_bias / n_head_log2),
 * m1 = 2^(-max_bias / 2 / n_head_log2), slope = h < n_head_log2 ? m0^(h+1) : m1^(2(h -
 * n_head_log2) + 1). The result is rounded once to dst's type (a's). */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float scale, max_bias;
    const ir_ref *a, *mask, *sinks;
    uint32_t n_head_log2;
    float    m0, m1;
} sm_params;

static sm_params params_of(const ir_node *n) {
    sm_params q = {.scale = 1.0f, .max_bias = 0.0f, .a = ir_operand(n, 0)};
    if (n->op == FE_OP_SOFT_MAX_EXT) {
        q.scale = n->fp[0];
        q.max_bias = n->fp[1];
        q.mask = ir_operand(n, 1);
        q.sinks = ir_operand(n, 2);
    }
    /* As ggml: computed in f32 from the unsigned head count. */
    uint32_t n_head = (uint32_t)q.a->ne[2];
    q.n_head_log2 = 1u << (uint32_t)floor(log2(n_head));
    q.m0 = powf(2.0f, -(q.max_bias) / q.n_head_log2);
    q.m1 = powf(2.0f, -(q.max_bias / 2.0f) / q.n_head_log2);
    return q;
}

static float slope_of(const sm_params *q, uint32_t h) {
    if (!(q->max_bias > 0.0f)) return 1.0f;
    return h < q->n_head_log2 ? powf(q->m0, h + 1) : powf(q->m1, 2 * (h - q->n_head_log2) + 1);
}

/* One row: w is scratch of a.ne0 floats. */
static void row(const sm_params *q, const ir_node *n, void **data, int64_t i1, int64_t i2, int64_t i3, float *w) {
    const ir_ref *a = q->a;
    int64_t       ne0 = a->ne[0];
    float         slope = slope_of(q, (uint32_t)i2);
    for (int64_t i0 = 0; i0 < ne0; i0++) {
        int64_t c[4] = {i0, i1, i2, i3};
        w[i0] = kb_load_f32(data[a->buf], a->type, ir_offset_at(a, c)) * q->scale;
        if (q->mask) w[i0] += slope * kb_load_f32(data[q->mask->buf], q->mask->type, ir_offset_at(q->mask, c));
    }
    float max = -INFINITY;
    for (int64_t i0 = 0; i0 < ne0; i0++) max = max > w[i0] ? max : w[i0];
    float sink = 0.0f;
    if (q->sinks) {
        int64_t cs[4] = {i2, 0, 0, 0};
        sink = kb_load_f32(data[q->sinks->buf], KILN_F32, ir_offset_at(q->sinks, cs));
        max = max > sink ? max : sink;
    }
    double sum = 0.0;
    for (int64_t i0 = 0; i0 < ne0; i0++) {
        w[i0] = expf(w[i0] - max);
        sum += (double)w[i0];
    }
    if (q->sinks) sum += (double)expf(sink - max);
    float inv = (float)(1.0 / sum);
    for (int64_t i0 = 0; i0 < ne0; i0++) {
        int64_t c[4] = {i0, i1, i2, i3};
        kb_store_f32(data[n->dst.buf], n->dst.type, ir_offset_at(&n->dst, c), w[i0] * inv);
    }
}

kiln_status ir_ref_softmax(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    if (n->op != FE_OP_SOFT_MAX && n->op != FE_OP_SOFT_MAX_EXT)
        return kb_error(KILN_ERR_INVALID, "reference: %s is not a softmax op", fe_ops[n->op].name);
    sm_params q = params_of(n);
    const int64_t *ne = q.a->ne;
    float *w = malloc((size_t)ne[0] * sizeof *w);
    if (!w) return kb_oom();
    for (int64_t i3 = 0; i3 < ne[3]; i3++)
        for (int64_t i2 = 0; i2 < ne[2]; i2++)
            for (int64_t i1 = 0; i1 < ne[1]; i1++) row(&q, n, data, i1, i2, i3, w);
    free(w);
    return NULL;
}
