/* CPU reference of the fill family: arange, fill, diag_mask_inf, tri.
 *
 * Each follows ggml's CPU kernel (ggml/src/ggml-cpu/ops.cpp):
 *   arange:        y[i] = start + step * (float) i             (two f32 roundings, no FMA)
 *   fill:          y = c, rounded to the output type
 *   diag_mask_inf: y[i0, i1, ...] = i0 > n_past + i1 ? -inf : a[i0, i1, ...]  (every ne2, ne3)
 *   tri:           y[i0, i1, ...] = pred(i0, i1) ? a[i0, i1, ...] : 0, with pred by type:
 *                  upper_diag i0 >= i1, upper i0 > i1, lower_diag i0 <= i1, lower i0 < i1
 * Kept values are copied exactly (a and the result have one type). The reference is built with
 * -std=c11 (ISO mode), where GCC does not contract a * b + c into an FMA, so arange rounds twice
 * as ggml's does; the CUDA kernel uses __fmul_rn/__fadd_rn for the same reason. */
#include "ir_internal.h"

#include <math.h>

/* Whether element (i0, i1) keeps a's value; p is the op's int parameter (n_past or the type). */
typedef bool (*keep_fn)(int64_t i0, int64_t i1, int32_t p);

static bool keep_diag_mask(int64_t i0, int64_t i1, int32_t n_past) { return i0 <= (int64_t)n_past + i1; }

static bool keep_tri(int64_t i0, int64_t i1, int32_t type) {
    switch (type) {
    case KILN_TRI_UPPER_DIAG: return i0 >= i1;
    case KILN_TRI_UPPER: return i0 > i1;
    case KILN_TRI_LOWER_DIAG: return i0 <= i1;
    default: return i0 < i1; /* KILN_TRI_LOWER; the frontend rejects other values */
    }
}

/* y = a where keep, else `masked`, over every matrix of dst. */
static void masked_copy(const ir_node *n, void **data, keep_fn keep, float masked) {
    const ir_ref *a = ir_operand(n, 0), *d = &n->dst;
    int64_t       c[4];
    for (c[3] = 0; c[3] < d->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < d->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < d->ne[1]; c[1]++)
                for (c[0] = 0; c[0] < d->ne[0]; c[0]++) {
                    float v = keep(c[0], c[1], n->ip[0]) ? kb_load_f32(data[a->buf], a->type, ir_offset_at(a, c))
                                                         : masked;
                    kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), v);
                }
}

static void do_fill(const ir_node *n, void **data) {
    const ir_ref *d = &n->dst;
    int64_t       c[4];
    for (c[3] = 0; c[3] < d->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < d->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < d->ne[1]; c[1]++)
                for (c[0] = 0; c[0] < d->ne[0]; c[0]++)
                    kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), n->fp[0]);
}

static void do_arange(const ir_node *n, void **data) {
    const ir_ref *d = &n->dst;
    const float   start = n->fp[0], step = n->fp[2];
    int64_t       c[4] = {0, 0, 0, 0};
    for (c[0] = 0; c[0] < d->ne[0]; c[0]++) {
        const float prod = step * (float)c[0];
        kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), start + prod);
    }
}

kiln_status ir_ref_fill(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    switch (n->op) {
    case FE_OP_ARANGE: do_arange(n, data); return NULL;
    case FE_OP_FILL: do_fill(n, data); return NULL;
    case FE_OP_DIAG_MASK_INF: masked_copy(n, data, keep_diag_mask, -INFINITY); return NULL;
    case FE_OP_TRI: masked_copy(n, data, keep_tri, 0.0f); return NULL;
    default:
        return kb_error(KILN_ERR_INVALID, "reference: %s is not in the fill family", fe_ops[n->op].name);
    }
}
