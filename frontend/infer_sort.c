/* Shape and type rules of the sort family (see frontend/infer.h): argsort, argsort_top_k,
 * top_k. All three sort each row (dim 0) of a float tensor and give i32 indices into the row.
 *
 * ggml (ggml/src/ggml.c): ggml_argsort asserts ne0 <= INT32_MAX and gives i32 of a's shape;
 * ggml_argsort_top_k is a view of the first k columns of a descending argsort and
 * ggml_top_k (GGML_OP_TOP_K) a new i32 [k, ne1, ne2, ne3] tensor, both asserting ne0 >= k.
 * ggml's CPU backend sorts f32 only; kiln also accepts f16 and bf16 (their values compare
 * exactly as f32). kiln needs k >= 1 since tensors have no empty dims. */
#include "infer.h"

#include <stdint.h>

/* a is a float tensor whose rows are indexable by i32. */
static bool check_operand(kiln_ctx *ctx, const char *op, const kiln_tensor *x) {
    char s[96];
    if (!fe_is_float(x->type))
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: operand '%s' is %s; it must be f32, f16 or bf16", op, x->name,
                         fe_shape_str(x, s, sizeof s));
    if (x->ne[0] > INT32_MAX)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "%s: operand '%s' (%s) has rows longer than INT32_MAX: i32 indices cannot "
                         "address them", op, x->name, fe_shape_str(x, s, sizeof s));
    return true;
}

bool fe_infer_ARGSORT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (!check_operand(ctx, "argsort", x)) return false;
    if (a->ip[0] != 0 && a->ip[0] != 1)
        return fe_reject(ctx, KILN_ERR_INVALID, "argsort: order %d is neither asc (0) nor desc (1)", (int)a->ip[0]);
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = KILN_I32;
    *n_dims = x->n_dims;
    return true;
}

/* argsort_top_k and top_k: the indices of the k largest values of each row. */
static bool top_k(kiln_ctx *ctx, const char *op, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    char               s[96];
    if (!check_operand(ctx, op, x)) return false;
    int64_t k = a->ip[0];
    if (k < 1) return fe_reject(ctx, KILN_ERR_INVALID, "%s: k is %lld; it must be at least 1", op, (long long)k);
    if (k > x->ne[0])
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: k = %lld exceeds the row length of '%s' (%s)", op, (long long)k,
                         x->name, fe_shape_str(x, s, sizeof s));
    ne[0] = k;
    for (int d = 1; d < 4; d++) ne[d] = x->ne[d];
    *type = KILN_I32;
    *n_dims = x->n_dims;
    return true;
}

bool fe_infer_ARGSORT_TOP_K(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return top_k(ctx, "argsort_top_k", a, type, ne, n_dims);
}

bool fe_infer_TOP_K(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return top_k(ctx, "top_k", a, type, ne, n_dims);
}
