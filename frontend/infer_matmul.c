/* Shape and type rules of the matmul families (see frontend/infer.h): mul_mat, mul_mat_id.
 *
 * As ggml (ggml_mul_mat, ggml_mul_mat_id in ggml/src/ggml.c):
 *  - mul_mat(a, b) = b·aᵀ: a [K, M, A2, A3], b [K, N, B2, B3] with A2 | B2 and A3 | B3 (a is
 *    broadcast: b's batch i2 uses a's batch i2 / (B2/A2)); the result is f32 [M, N, B2, B3].
 *    a must not be transposed (nb0 > nb1), as ggml asserts.
 *  - mul_mat_id(as, b, ids): as [K, M, n_expert] holds one matrix per expert, ids i32
 *    [n_used, T] selects experts per token, b [K, B1, T] with B1 | n_used (B1 is 1 or n_used:
 *    slot u of token t multiplies b[:, u % B1, t]); the result is f32 [M, n_used, T].
 *
 * kiln's limits, both errors here rather than wrong results later: b is f32 (the activations;
 * weights a/as may be f32, f16, bf16 or quantized: q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K, mxfp4), and a's rows must be contiguous (nb0 = element size),
 * which every weight and every K/V view llama.cpp builds satisfies. b may be any strided view
 * (permuted, transposed). */
#include "infer.h"

static bool weight_ok(kiln_ctx *ctx, const char *op, const char *what, const kiln_tensor *a) {
    if (!fe_is_float(a->type) && !kiln_type_is_quantized(a->type))
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: %s %s must be f32, f16, bf16 or a quantized type (%s)", op,
                         what, fe_describe(a).s, FE_Q);
    if (a->nb[0] != kiln_type_size(a->type) || a->nb[1] < a->nb[0])
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "%s: %s %s must have contiguous rows (nb0 = element size, not transposed); "
                         "use cont() first",
                         op, what, fe_describe(a).s);
    return true;
}

static bool act_ok(kiln_ctx *ctx, const char *op, const kiln_tensor *b) {
    if (b->type != KILN_F32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: b %s must be f32 (the activations; cast it first)", op,
                         fe_describe(b).s);
    return true;
}

bool fe_infer_MUL_MAT(kiln_ctx *ctx, const fe_args *x, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *a = x->t[0], *b = x->t[1];
    if (!weight_ok(ctx, "mul_mat", "a", a) || !act_ok(ctx, "mul_mat", b)) return false;
    if (a->ne[0] != b->ne[0])
        return fe_reject(ctx, KILN_ERR_SHAPE, "mul_mat: a %s and b %s must have the same ne0 (the inner dimension)",
                         fe_describe(a).s, fe_describe(b).s);
    if (b->ne[2] % a->ne[2] != 0 || b->ne[3] % a->ne[3] != 0)
        return fe_reject(ctx, KILN_ERR_SHAPE, "mul_mat: a %s must broadcast over b %s: a's ne2 and ne3 must divide b's",
                         fe_describe(a).s, fe_describe(b).s);
    ne[0] = a->ne[1];
    ne[1] = b->ne[1];
    ne[2] = b->ne[2];
    ne[3] = b->ne[3];
    *type = KILN_F32;
    *n_dims = b->n_dims > 2 ? b->n_dims : 2;
    return true;
}

bool fe_infer_MUL_MAT_ID(kiln_ctx *ctx, const fe_args *x, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *as = x->t[0], *b = x->t[1], *ids = x->t[2];
    if (!weight_ok(ctx, "mul_mat_id", "as", as) || !act_ok(ctx, "mul_mat_id", b)) return false;
    if (ids->type != KILN_I32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "mul_mat_id: ids %s must be i32", fe_describe(ids).s);
    if (as->ne[3] != 1 || b->ne[3] != 1 || ids->ne[2] != 1 || ids->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "mul_mat_id: as %s and b %s must be 3-D and ids %s 2-D (as ggml_mul_mat_id)",
                         fe_describe(as).s, fe_describe(b).s, fe_describe(ids).s);
    if (as->ne[0] != b->ne[0])
        return fe_reject(ctx, KILN_ERR_SHAPE, "mul_mat_id: as %s and b %s must have the same ne0", fe_describe(as).s,
                         fe_describe(b).s);
    if (ids->ne[1] != b->ne[2])
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "mul_mat_id: ids %s must have one row per token of b %s (ids.ne1 == b.ne2)",
                         fe_describe(ids).s, fe_describe(b).s);
    if (ids->ne[0] % b->ne[1] != 0)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "mul_mat_id: b %s must broadcast over the %lld experts used per token: b.ne1 must divide ids.ne0",
                         fe_describe(b).s, (long long)ids->ne[0]);
    ne[0] = as->ne[1];
    ne[1] = ids->ne[0];
    ne[2] = b->ne[2];
    ne[3] = 1;
    *type = KILN_F32;
    *n_dims = 3;
    return true;
}
