/* Shape and type rules of the rows family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_GET_ROWS(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "get_rows: not implemented yet");
    return false;
}

bool fe_infer_SET_ROWS(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "set_rows: not implemented yet");
    return false;
}

bool fe_infer_CONCAT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "concat: not implemented yet");
    return false;
}

bool fe_infer_ADD_ID(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "add_id: not implemented yet");
    return false;
}

bool fe_infer_PAD(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "pad: not implemented yet");
    return false;
}

