/* Shape and type rules of the reduce family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_SUM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "sum: not implemented yet");
    return false;
}

bool fe_infer_SUM_ROWS(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "sum_rows: not implemented yet");
    return false;
}

bool fe_infer_MEAN(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "mean: not implemented yet");
    return false;
}

bool fe_infer_ARGMAX(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "argmax: not implemented yet");
    return false;
}

bool fe_infer_CUMSUM(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "cumsum: not implemented yet");
    return false;
}

