/* CPU reference of the norm family: norm, rms_norm, l2_norm, group_norm.
 *
 * Each follows ggml's CPU kernel (ggml/src/ggml-cpu/ops.cpp) step by step, including where it
 * sums in ggml_float (double) and where it rounds to float, so the reference is what ggml
 * computes for f32. f16/bf16 operands are widened to f32 on load and the result is rounded to
 * the output type once, on store (ggml's CPU kernels take f32 only).
 *
 *   norm:       sum = (float) sum_d x;  mean = sum / n (float);  v = x - mean (float);
 *               var = (float)(sum_d v*v / n);  y = v * (1.0f / sqrtf(var + eps))
 *   rms_norm:   mean = (float)(sum_d x*x / n);  y = x * (1.0f / sqrtf(mean + eps))
 *   l2_norm:    y = x * (1.0f / fmaxf(sqrtf((float) sum_d x*x), eps))
 *   group_norm: as norm, over the ne0*ne1*step elements of channels [start, start+step) of one
 *               i3, where step = ceil(ne2/n_groups) (the last group shorter); the mean is
 *               (float)(sum_d x / count) — no float rounding of the sum, unlike norm.
 *
 * sum_d is a double accumulation; each square is an f32 product (x*x in float) widened to
 * double, as ggml's `sum += (ggml_float)(x*x)`. ggml's norm takes float sums on its strided
 * (non-contiguous) path; kiln keeps one semantics for every layout, the contiguous one. */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const void *src;
    kiln_type   st;
    void       *dst;
    kiln_type   dt;
} io;

/* One row's input offsets and output offsets: x[i] at in[i], y[i] at out[i]. */
typedef struct {
    int64_t *in, *out;
    int64_t  n;
} span;

static float ld(const io *q, const span *s, int64_t i) { return kb_load_f32(q->src, q->st, s->in[i]); }
static void  st(const io *q, const span *s, int64_t i, float v) { kb_store_f32(q->dst, q->dt, s->out[i], v); }

static void do_norm(const io *q, const span *s, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < s->n; i++) sum += (double)ld(q, s, i);
    const float mean = (float)sum / (float)s->n;
    double      sum2 = 0.0;
    for (int64_t i = 0; i < s->n; i++) {
        const float v = ld(q, s, i) - mean;
        sum2 += (double)(v * v);
    }
    const float var = (float)(sum2 / (double)s->n);
    const float scale = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < s->n; i++) {
        const float v = ld(q, s, i) - mean;
        st(q, s, i, v * scale);
    }
}

static double sum_squares(const io *q, const span *s) {
    double sum = 0.0;
    for (int64_t i = 0; i < s->n; i++) {
        const float x = ld(q, s, i);
        sum += (double)(x * x);
    }
    return sum;
}

static void do_rms_norm(const io *q, const span *s, float eps) {
    const float mean = (float)(sum_squares(q, s) / (double)s->n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < s->n; i++) st(q, s, i, ld(q, s, i) * scale);
}

static void do_l2_norm(const io *q, const span *s, float eps) {
    const float scale = 1.0f / fmaxf(sqrtf((float)sum_squares(q, s)), eps);
    for (int64_t i = 0; i < s->n; i++) st(q, s, i, ld(q, s, i) * scale);
}

/* group_norm differs from norm only in how the mean is rounded (see the header comment). */
static void do_group_norm(const io *q, const span *s, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < s->n; i++) sum += (double)ld(q, s, i);
    const float mean = (float)(sum / (double)s->n);
    double      sum2 = 0.0;
    for (int64_t i = 0; i < s->n; i++) {
        const float v = ld(q, s, i) - mean;
        sum2 += (double)(v * v);
    }
    const float var = (float)(sum2 / (double)s->n);
    const float scale = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < s->n; i++) st(q, s, i, (ld(q, s, i) - mean) * scale);
}

/* Fills s with the offsets of the elements (i0, i1, i2, i3) for i0 < ne0, i1 < ne1 and i2 in
 * [c2, c2 + n2), in that order (i0 fastest). */
static void fill_span(const ir_ref *in, const ir_ref *out, int64_t i3, int64_t c2, int64_t n2,
                      int64_t ne1, span *s) {
    int64_t k = 0, c[4] = {0, 0, 0, i3};
    for (c[2] = c2; c[2] < c2 + n2; c[2]++)
        for (c[1] = 0; c[1] < ne1; c[1]++)
            for (c[0] = 0; c[0] < in->ne[0]; c[0]++, k++) {
                s->in[k] = ir_offset_at(in, c);
                s->out[k] = ir_offset_at(out, c);
            }
    s->n = k;
}

kiln_status ir_ref_norm(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    const ir_ref *a = ir_operand(n, 0);
    if (!a) return kb_error(KILN_ERR_INVALID, "reference: %s has no operand", fe_ops[n->op].name);
    const io      q = {data[a->buf], a->type, data[n->dst.buf], n->dst.type};
    const int64_t *ne = n->dst.ne;
    const float   eps = n->fp[0];
    if (ne[0] * ne[1] * ne[2] * ne[3] == 0) return NULL;

    if (n->op == FE_OP_GROUP_NORM) {
        const int64_t groups = n->ip[0];
        const int64_t per = (ne[2] + groups - 1) / groups; /* channels per group, ggml's rounding up */
        const int64_t cap = ne[0] * ne[1] * per;
        span s = {malloc((size_t)cap * sizeof(int64_t)), malloc((size_t)cap * sizeof(int64_t)), 0};
        if (!s.in || !s.out) {
            free(s.in);
            free(s.out);
            return kb_oom();
        }
        for (int64_t g = 0; g < groups && g * per < ne[2]; g++) {
            const int64_t start = g * per, step = ne[2] - start < per ? ne[2] - start : per;
            for (int64_t i3 = 0; i3 < ne[3]; i3++) {
                fill_span(a, &n->dst, i3, start, step, ne[1], &s);
                do_group_norm(&q, &s, eps);
            }
        }
        free(s.in);
        free(s.out);
        return NULL;
    }

    void (*row)(const io *, const span *, float);
    switch (n->op) {
    case FE_OP_NORM: row = do_norm; break;
    case FE_OP_RMS_NORM: row = do_rms_norm; break;
    case FE_OP_L2_NORM: row = do_l2_norm; break;
    default: return kb_error(KILN_ERR_INVALID, "reference: %s is not a norm op", fe_ops[n->op].name);
    }
    span s = {malloc((size_t)ne[0] * sizeof(int64_t)), malloc((size_t)ne[0] * sizeof(int64_t)), 0};
    if (!s.in || !s.out) {
        free(s.in);
        free(s.out);
        return kb_oom();
    }
    for (int64_t i3 = 0; i3 < ne[3]; i3++)
        for (int64_t i2 = 0; i2 < ne[2]; i2++)
            for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                int64_t c[4] = {0, i1, i2, i3};
                for (c[0] = 0; c[0] < ne[0]; c[0]++) {
                    s.in[c[0]] = ir_offset_at(a, c);
                    s.out[c[0]] = ir_offset_at(&n->dst, c);
                }
                s.n = ne[0];
                row(&q, &s, eps);
            }
    free(s.in);
    free(s.out);
    return NULL;
}
