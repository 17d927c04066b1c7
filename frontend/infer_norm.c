/* Shape and type rules of the norm family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "norm: not implemented yet");
    return false;
}

bool fe_infer_RMS_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "rms_norm: not implemented yet");
    return false;
}

bool fe_infer_L2_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "l2_norm: not implemented yet");
    return false;
}

bool fe_infer_GROUP_NORM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "group_norm: not implemented yet");
    return false;
}

