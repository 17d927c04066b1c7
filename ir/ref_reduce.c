/* CPU reference of the reduce family: sum, sum_rows, mean, argmax, cumsum.
 *
 * Follows ggml-cpu (ops.cpp and vec.h) operation for operation, rows being taken along dim 0
 * of a's logical layout (any view) in the order i3, i2, i1:
 *  - sum: f32 sums each row in ggml_float (double) and adds the row sums in double, storing the
 *    total as f32 (ggml_compute_forward_sum_f32); f16 and bf16 sum each row in float and add
 *    the row sums in float, rounding the total to the type once (..._sum_f16 / _bf16);
 *  - sum_rows: each row summed in double (ggml_vec_sum_f32), stored as f32, then to the type;
 *  - mean: the same f32 row sum, then divided by (float)ne0 in float;
 *  - argmax: ggml_vec_argmax_f32: max = MAX(max, x[i]); if (max == x[i]) idx = i, so the last
 *    of equal maxima wins;
 *  - cumsum: ggml_vec_cumsum_f32: y[0] = x[0], y[i] = y[i-1] + x[i] in float.
 * f16 and bf16 operands of sum_rows, mean and argmax (kiln extensions) are read as f32. */
#include "ir_internal.h"

#include <math.h>

typedef struct {
    const void   *data;
    const ir_ref *r;
} src_row;

/* Element i of the row of a at coordinates c (c[0] ignored). */
static float row_at(const src_row *s, const int64_t c[4], int64_t i) {
    int64_t o = s->r->offs + i * s->r->st[0];
    for (int d = 1; d < 4; d++) o += c[d] * s->r->st[d];
    return kb_load_f32(s->data, s->r->type, o);
}

static double row_sum_double(const src_row *s, const int64_t c[4]) {
    double sum = 0.0;
    for (int64_t i = 0; i < s->r->ne[0]; i++) sum += (double)row_at(s, c, i);
    return sum;
}

static float row_sum_float(const src_row *s, const int64_t c[4]) {
    float sum = 0.0f;
    for (int64_t i = 0; i < s->r->ne[0]; i++) sum += row_at(s, c, i);
    return sum;
}

static void ref_sum(const src_row *s, const ir_ref *dst, void *out) {
    const int64_t *ne = s->r->ne;
    int64_t        c[4] = {0};
    double         dsum = 0.0;
    float          fsum = 0.0f;
    for (c[3] = 0; c[3] < ne[3]; c[3]++)
        for (c[2] = 0; c[2] < ne[2]; c[2]++)
            for (c[1] = 0; c[1] < ne[1]; c[1]++) {
                if (s->r->type == KILN_F32) dsum += row_sum_double(s, c);
                else fsum += row_sum_float(s, c);
            }
    kb_store_f32(out, dst->type, dst->offs, s->r->type == KILN_F32 ? (float)dsum : fsum);
}

/* sum_rows, mean, argmax, cumsum: one call of `row` per row of a. */
static void each_row(const src_row *s, const ir_ref *dst, void *out, fe_op op) {
    const int64_t *ne = s->r->ne;
    int64_t        c[4] = {0};
    for (c[3] = 0; c[3] < ne[3]; c[3]++)
        for (c[2] = 0; c[2] < ne[2]; c[2]++)
            for (c[1] = 0; c[1] < ne[1]; c[1]++) {
                switch (op) {
                case FE_OP_SUM_ROWS:
                    kb_store_f32(out, dst->type, ir_offset_at(dst, c), (float)row_sum_double(s, c));
                    break;
                case FE_OP_MEAN: {
                    float sum = (float)row_sum_double(s, c);
                    kb_store_f32(out, dst->type, ir_offset_at(dst, c), sum / (float)ne[0]);
                    break;
                }
                case FE_OP_ARGMAX: {
                    float   max = -INFINITY;
                    int32_t idx = 0;
                    for (int64_t i = 0; i < ne[0]; i++) {
                        float x = row_at(s, c, i);
                        max = max > x ? max : x; /* ggml's MAX(max, x[i]) */
                        if (max == x) idx = (int32_t)i;
                    }
                    const int64_t at[4] = {c[1], 0, 0, 0}; /* dst is [ne1] */
                    ((int32_t *)out)[ir_offset_at(dst, at)] = idx;
                    break;
                }
                default: { /* FE_OP_CUMSUM */
                    float   y = 0.0f;
                    int64_t at[4] = {0, c[1], c[2], c[3]};
                    for (int64_t i = 0; i < ne[0]; i++) {
                        float x = row_at(s, c, i);
                        y = i == 0 ? x : y + x;
                        at[0] = i;
                        kb_store_f32(out, dst->type, ir_offset_at(dst, at), y);
                    }
                    break;
                }
                }
            }
}

kiln_status ir_ref_reduce(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    const ir_ref *a = ir_operand(n, 0);
    if (!a) return kb_error(KILN_ERR_INVALID, "reference: %s has no operand", fe_ops[n->op].name);
    src_row s = {data[a->buf], a};
    void   *out = data[n->dst.buf];
    switch (n->op) {
    case FE_OP_SUM: ref_sum(&s, &n->dst, out); return NULL;
    case FE_OP_SUM_ROWS:
    case FE_OP_MEAN:
    case FE_OP_ARGMAX:
    case FE_OP_CUMSUM: each_row(&s, &n->dst, out, n->op); return NULL;
    default: return kb_error(KILN_ERR_INVALID, "reference: %s is not a reduce op", fe_ops[n->op].name);
    }
}
