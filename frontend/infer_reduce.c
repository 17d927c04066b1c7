/* Shape and type rules of the reduce family (see frontend/infer.h), after ggml.c:
 *  - sum(a):      [1] of a's type (ggml_sum: ggml_new_tensor_1d(a->type, 1));
 *  - sum_rows(a): [1, ne1, ne2, ne3] of a's type;
 *  - mean(a):     [1, ne1, ne2, ne3], always f32;
 *  - argmax(a):   a must be a matrix (ggml_is_matrix: ne2 = ne3 = 1), i32 [ne1];
 *  - cumsum(a):   a's shape; ggml_cumsum asserts a is f32, so only f32 is accepted.
 * ggml's CPU backend computes sum for f32, f16 and bf16 but sum_rows, mean and argmax for f32
 * only; kiln also accepts f16 and bf16 there (read as f32, as the f32 path does). */
#include "infer.h"

static bool need_float(kiln_ctx *ctx, const char *op, const kiln_tensor *t) {
    if (fe_is_float(t->type)) return true;
    char s[96];
    fe_failf(ctx, KILN_ERR_SHAPE, "%s: operand '%s' is %s; it must be f32, f16 or bf16", op, t->name,
             fe_shape_str(t, s, sizeof s));
    return false;
}

bool fe_infer_SUM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (!need_float(ctx, "sum", x)) return false;
    *type = x->type;
    ne[0] = ne[1] = ne[2] = ne[3] = 1;
    *n_dims = 1;
    return true;
}

/* sum_rows and mean: one value per row, rows along dim 0. */
static void row_shape(const kiln_tensor *x, int64_t ne[4], int *n_dims) {
    ne[0] = 1;
    for (int d = 1; d < 4; d++) ne[d] = x->ne[d];
    *n_dims = x->n_dims;
}

bool fe_infer_SUM_ROWS(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (!need_float(ctx, "sum_rows", x)) return false;
    *type = x->type;
    row_shape(x, ne, n_dims);
    return true;
}

bool fe_infer_MEAN(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (!need_float(ctx, "mean", x)) return false;
    *type = KILN_F32;
    row_shape(x, ne, n_dims);
    return true;
}

bool fe_infer_ARGMAX(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    char               s[96];
    if (!need_float(ctx, "argmax", x)) return false;
    if (x->ne[2] != 1 || x->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE, "argmax: operand '%s' (%s) is not a matrix: ne2 and ne3 must be 1",
                         x->name, fe_shape_str(x, s, sizeof s));
    if (x->ne[0] > INT32_MAX) { /* the result is an i32 index */
        fe_failf(ctx, KILN_ERR_SHAPE, "argmax: operand '%s' (%s) has rows longer than INT32_MAX", x->name,
                 fe_shape_str(x, s, sizeof s));
        return false;
    }
    *type = KILN_I32;
    ne[0] = x->ne[1];
    ne[1] = ne[2] = ne[3] = 1;
    *n_dims = 1;
    return true;
}

bool fe_infer_CUMSUM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (x->type != KILN_F32) {
        char s[96];
        fe_failf(ctx, KILN_ERR_SHAPE, "cumsum: operand '%s' is %s; it must be f32 (as in ggml)", x->name,
                 fe_shape_str(x, s, sizeof s));
        return false;
    }
    *type = KILN_F32;
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *n_dims = x->n_dims;
    return true;
}
