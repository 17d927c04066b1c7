/* Shape and type rules of the sort family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_ARGSORT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "argsort: not implemented yet");
    return false;
}

bool fe_infer_ARGSORT_TOP_K(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "argsort_top_k: not implemented yet");
    return false;
}

bool fe_infer_TOP_K(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "top_k: not implemented yet");
    return false;
}

