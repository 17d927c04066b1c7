/* Shape and type rules of the rows family (see frontend/infer.h): get_rows, set_rows, concat,
 * pad, add_id. Each follows the assertions of its ggml builder (ggml/src/ggml.c: ggml_get_rows,
 * ggml_set_rows, ggml_concat, ggml_pad_ext, ggml_add_id), reported as errors instead. */
#include "infer.h"

/* Names a tensor in messages: 'name' (f32[4, 3]). */
static bool need_float(kiln_ctx *ctx, const char *op, const char *what, const kiln_tensor *t) {
    if (fe_is_float(t->type)) return true;
    fe_failf(ctx, KILN_ERR_SHAPE, "%s: %s %s must be f32, f16 or bf16", op, what, fe_describe(t).s);
    return false;
}

static bool need_type(kiln_ctx *ctx, const char *op, const char *what, const kiln_tensor *t,
                      kiln_type want) {
    if (t->type == want) return true;
    fe_failf(ctx, KILN_ERR_SHAPE, "%s: %s %s must be %s", op, what, fe_describe(t).s, kiln_type_name(want));
    return false;
}

/* ne[da] of x must equal ne[db] of y. */
static bool need_dim_eq(kiln_ctx *ctx, const char *op, const kiln_tensor *x, int da, const kiln_tensor *y,
                        int db) {
    if (x->ne[da] == y->ne[db]) return true;
    fe_failf(ctx, KILN_ERR_SHAPE, "%s: ne%d of %s must equal ne%d of %s", op, da, fe_describe(x).s, db,
             fe_describe(y).s);
    return false;
}

static void copy_shape(const kiln_tensor *t, int64_t ne[4], int *n_dims) {
    for (int d = 0; d < 4; d++) ne[d] = t->ne[d];
    *n_dims = t->n_dims;
}

/* ggml_get_rows: rows ids[i, j, k] of a's matrix (j, k) -> f32 [a.ne0, ids.ne0, ids.ne1, ids.ne2]. */
bool fe_infer_GET_ROWS(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0], *ids = a->t[1];
    /* Quantized sources are dequantized row by row (ggml_get_rows on a quantized embedding). */
    if ((!kiln_type_is_quantized(x->type) && !need_float(ctx, "get_rows", "source", x)) ||
        !need_type(ctx, "get_rows", "ids", ids, KILN_I32))
        return false;
    if (!need_dim_eq(ctx, "get_rows", x, 2, ids, 1) || !need_dim_eq(ctx, "get_rows", x, 3, ids, 2))
        return false;
    if (ids->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE, "get_rows: ids %s must have at most 3 dims", fe_describe(ids).s);
    /* ggml: the result is f32 whatever a's float type (rows are converted on the way). */
    *type = KILN_F32;
    ne[0] = x->ne[0];
    ne[1] = ids->ne[0];
    ne[2] = ids->ne[1];
    ne[3] = ids->ne[2];
    *n_dims = ids->n_dims + 1;
    return true;
}

/* ggml_set_rows: a copy of a whose rows ids[i, j % ids.ne1, k % ids.ne2] are replaced by the rows
 * b[:, i, j, k] (f32) converted to a's type. kiln's is functional (a fresh tensor); see
 * docs/ops-rows.md. */
bool fe_infer_SET_ROWS(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0], *b = a->t[1], *ids = a->t[2];
    const char        *op = "set_rows";
    if (!need_float(ctx, op, "destination", x) || !need_type(ctx, op, "source", b, KILN_F32)) return false;
    if (ids->type != KILN_I32 && ids->type != KILN_I64)
        return fe_reject(ctx, KILN_ERR_SHAPE, "set_rows: ids %s must be i32 or i64", fe_describe(ids).s);
    if (!need_dim_eq(ctx, op, x, 0, b, 0) || !need_dim_eq(ctx, op, x, 2, b, 2) ||
        !need_dim_eq(ctx, op, x, 3, b, 3) || !need_dim_eq(ctx, op, b, 1, ids, 0))
        return false;
    if (b->ne[2] % ids->ne[1] != 0 || b->ne[3] % ids->ne[2] != 0 || ids->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "set_rows: ids %s must broadcast over %s: ids.ne1 must divide ne2, ids.ne2 divide "
                         "ne3, and ids have at most 3 dims", fe_describe(ids).s, fe_describe(b).s);
    *type = x->type;
    copy_shape(x, ne, n_dims);
    return true;
}

/* ggml_concat: a and b joined along dim; every other dim must agree. */
bool fe_infer_CONCAT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0], *y = a->t[1];
    int                dim = a->ip[0];
    if (dim < 0 || dim > 3) return fe_reject(ctx, KILN_ERR_INVALID, "concat: dim is %d; it must be 0, 1, 2 or 3", dim);
    if (!need_float(ctx, "concat", "operand", x)) return false;
    if (x->type != y->type)
        return fe_reject(ctx, KILN_ERR_SHAPE, "concat: %s and %s must have the same type", fe_describe(x).s,
                         fe_describe(y).s);
    for (int d = 0; d < 4; d++) {
        if (d != dim && x->ne[d] != y->ne[d])
            return fe_reject(ctx, KILN_ERR_SHAPE, "concat: %s and %s differ in dim %d (only dim %d may differ)",
                             fe_describe(x).s, fe_describe(y).s, d, dim);
        ne[d] = d == dim ? x->ne[d] + y->ne[d] : x->ne[d];
    }
    *type = x->type;
    *n_dims = x->n_dims > y->n_dims ? x->n_dims : y->n_dims;
    if (*n_dims < dim + 1) *n_dims = dim + 1;
    return true;
}

/* ggml_pad_ext (not circular): lp[d] zeros before and rp[d] zeros after dim d. */
bool fe_infer_PAD(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    static const char *names[8] = {"lp0", "rp0", "lp1", "rp1", "lp2", "rp2", "lp3", "rp3"};
    if (!need_float(ctx, "pad", "operand", x)) return false;
    *n_dims = x->n_dims;
    for (int d = 0; d < 4; d++) {
        int32_t lp = a->ip[2 * d], rp = a->ip[2 * d + 1];
        /* ggml's CUDA and CPU kernels only define non-negative padding (no cropping). */
        if (lp < 0 || rp < 0)
            return fe_reject(ctx, KILN_ERR_INVALID, "pad: %s is %d; padding must be >= 0",
                             names[lp < 0 ? 2 * d : 2 * d + 1], lp < 0 ? lp : rp);
        ne[d] = x->ne[d] + lp + rp;
        if ((lp || rp) && *n_dims < d + 1) *n_dims = d + 1;
    }
    *type = x->type;
    return true;
}

/* ggml_add_id: out[i, j, t] = a[i, j, t] + b[i, ids[j, t]] (f32 only, as ggml's CPU and CUDA). */
bool fe_infer_ADD_ID(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0], *b = a->t[1], *ids = a->t[2];
    const char        *op = "add_id";
    if (!need_type(ctx, op, "operand", x, KILN_F32) || !need_type(ctx, op, "bias", b, KILN_F32) ||
        !need_type(ctx, op, "ids", ids, KILN_I32))
        return false;
    if (!need_dim_eq(ctx, op, x, 0, b, 0) || !need_dim_eq(ctx, op, x, 1, ids, 0) ||
        !need_dim_eq(ctx, op, x, 2, ids, 1))
        return false;
    *type = KILN_F32;
    copy_shape(x, ne, n_dims);
    return true;
}
