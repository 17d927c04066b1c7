/* Shape and type rules of the rope family (see frontend/infer.h). */
#include "infer.h"

bool fe_infer_ROPE_EXT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    fe_failf(ctx, KILN_ERR_INVALID, "rope_ext: not implemented yet");
    return false;
}

