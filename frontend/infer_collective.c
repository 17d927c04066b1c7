/* Shape and type rules of the collective family (see frontend/infer.h): all_reduce.
 *
 * all_reduce(a, ranks) is kiln's, not ggml's (ggml splits a graph across GPUs in its scheduler,
 * not in the graph): the elementwise sum of a over the ranks of a tensor-parallel group. The
 * result has a's shape, contiguous; a is f32 (the partial sums of row-parallel products). ranks
 * runs from 2 to 64 (kiln_all_reduce gives back a itself over one rank; docs/tp.md). */
#include "infer.h"

bool fe_infer_ALL_REDUCE(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (x->type != KILN_F32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "all_reduce: operand %s must be f32", fe_describe(x).s);
    if (a->ip[0] < 2 || a->ip[0] > 64)
        return fe_reject(ctx, KILN_ERR_INVALID, "all_reduce: ranks is %d; it must be 2 .. 64 (over one rank the sum is "
                                                "the operand itself)", (int)a->ip[0]);
    *type = KILN_F32;
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *n_dims = x->n_dims;
    return true;
}
