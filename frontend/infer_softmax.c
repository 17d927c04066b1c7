/* Shape and type rules of the softmax family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_SOFT_MAX(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "soft_max: not implemented yet");
    return false;
}

bool fe_infer_SOFT_MAX_EXT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "soft_max_ext: not implemented yet");
    return false;
}

