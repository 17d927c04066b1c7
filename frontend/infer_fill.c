/* Shape and type rules of the fill family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_ARANGE(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "arange: not implemented yet");
    return false;
}

bool fe_infer_FILL(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "fill: not implemented yet");
    return false;
}

bool fe_infer_DIAG_MASK_INF(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "diag_mask_inf: not implemented yet");
    return false;
}

bool fe_infer_TRI(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "tri: not implemented yet");
    return false;
}

