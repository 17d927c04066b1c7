/* Shape and type rules of the softmax family (see frontend/infer.h): soft_max, soft_max_ext.
 *
 * As ggml (ggml_soft_max_impl and ggml_soft_max_add_sinks in ggml/src/ggml.c): the result is a
 * new tensor of a's shape and type (ggml_dup_tensor). The optional mask is f16 or f32, has a's
 * ne0, at least a's ne1 rows (only the first ne1 are read), and broadcasts over dims 2 and 3
 * (its ne2 and ne3 divide a's); max_bias > 0 (ALiBi) needs a mask. The optional sinks are f32
 * with one value per head: sinks.ne0 == a.ne2.
 *
 * Differences, all extensions: ggml asserts that a and the mask are contiguous; kiln reads any
 * layout through strides, so views need no cont. ggml's kernels take f32 a only; kiln also takes
 * f16 and bf16 a (computed in f32, rounded once to a's type on store), which gives the result
 * ggml_dup_tensor would give it. */
#include "infer.h"

/* a: any float type; the result copies its shape and type. */
static bool operand_a(kiln_ctx *ctx, const char *op, const kiln_tensor *x, kiln_type *type, int64_t ne[4],
                      int *n_dims) {
    if (!fe_is_float(x->type))
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: operand %s must be f32, f16 or bf16", op, fe_describe(x).s);
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = x->type;
    *n_dims = x->n_dims;
    return true;
}

/* The mask rules of ggml_soft_max_impl. */
static bool check_mask(kiln_ctx *ctx, const kiln_tensor *x, const kiln_tensor *m) {
    if (m->type != KILN_F16 && m->type != KILN_F32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "soft_max_ext: mask %s must be f16 or f32", fe_describe(m).s);
    if (m->ne[0] != x->ne[0] || m->ne[1] < x->ne[1])
        return fe_reject(ctx, KILN_ERR_SHAPE, "soft_max_ext: mask %s must have the ne0 of %s and at least its ne1 rows",
                         fe_describe(m).s, fe_describe(x).s);
    if (x->ne[2] % m->ne[2] != 0 || x->ne[3] % m->ne[3] != 0)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "soft_max_ext: mask %s must broadcast over %s: its ne2 and ne3 must divide a's",
                         fe_describe(m).s, fe_describe(x).s);
    return true;
}

/* The sinks rules of ggml_soft_max_add_sinks: one f32 logit per head (dim 2 of a). */
static bool check_sinks(kiln_ctx *ctx, const kiln_tensor *x, const kiln_tensor *s) {
    if (s->type != KILN_F32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "soft_max_ext: sinks %s must be f32", fe_describe(s).s);
    if (s->ne[0] != x->ne[2])
        return fe_reject(ctx, KILN_ERR_SHAPE, "soft_max_ext: sinks %s must have one value per head: ne0 == ne2 of %s",
                         fe_describe(s).s, fe_describe(x).s);
    return true;
}

bool fe_infer_SOFT_MAX(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return operand_a(ctx, "soft_max", a->t[0], type, ne, n_dims);
}

/* Signature: a, mask?, scale, max_bias, sinks?. */
bool fe_infer_SOFT_MAX_EXT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0], *mask = a->t[1], *sinks = a->t[2];
    if (!operand_a(ctx, "soft_max_ext", x, type, ne, n_dims)) return false;
    if (mask && !check_mask(ctx, x, mask)) return false;
    if (sinks && !check_sinks(ctx, x, sinks)) return false;
    if (a->fp[1] > 0.0f && !mask)
        return fe_reject(ctx, KILN_ERR_INVALID, "soft_max_ext: max_bias %g > 0 (ALiBi) needs a mask", (double)a->fp[1]);
    return true;
}
