/* Shape and type rules of the norm family (see frontend/infer.h).
 *
 * As ggml (ggml_norm_impl, ggml_rms_norm_impl, ggml_l2_norm_impl, ggml_group_norm_impl in
 * ggml.c): the result is a new tensor of a's shape and type. ggml's CPU kernels take f32 only;
 * kiln also takes f16 and bf16 (computed in f32, rounded once on store). Any layout of a is
 * accepted: the kernels read rows through strides. ggml's CPU kernels assert eps >= 0 for norm,
 * rms_norm and l2_norm; that is a frontend error here. group_norm asserts nothing on eps, but
 * needs n_groups >= 1 (it divides by it). */
#include "infer.h"

#include <math.h>

/* ggml asserts eps >= 0 in the CPU kernels of these three; NaN fails that assert too. */
static bool row_norm(kiln_ctx *ctx, const char *op, const fe_args *a, kiln_type *type, int64_t ne[4],
                     int *n_dims) {
    float eps = a->fp[0];
    if (!(eps >= 0.0f)) return fe_reject(ctx, KILN_ERR_INVALID, "%s: eps is %g; it must be >= 0", op, (double)eps);
    return fe_like_float_a(ctx, op, a, type, ne, n_dims);
}

bool fe_infer_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return row_norm(ctx, "norm", a, type, ne, n_dims);
}

bool fe_infer_RMS_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return row_norm(ctx, "rms_norm", a, type, ne, n_dims);
}

bool fe_infer_L2_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return row_norm(ctx, "l2_norm", a, type, ne, n_dims);
}

/* Groups of ceil(ne2 / n_groups) channels (dim 2); n_groups above ne2 leaves groups empty, as in
 * ggml, so any n_groups >= 1 is valid. */
bool fe_infer_GROUP_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    int32_t n_groups = a->ip[0];
    if (n_groups < 1)
        return fe_reject(ctx, KILN_ERR_INVALID, "group_norm: n_groups is %d; it must be at least 1", (int)n_groups);
    if (isnan(a->fp[0])) return fe_reject(ctx, KILN_ERR_INVALID, "group_norm: eps is NaN");
    return fe_like_float_a(ctx, "group_norm", a, type, ne, n_dims);
}
