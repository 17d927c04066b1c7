/* Shape and type rules of the fill family (see frontend/infer.h): arange, fill, diag_mask_inf,
 * tri.
 *
 * As ggml (ggml.c: ggml_arange, ggml_fill_impl, ggml_diag_mask_inf_impl, ggml_tri):
 *  - arange(start, stop, step): f32 [(int64_t) ceilf((stop - start) / step)], the count computed
 *    in f32 exactly as ggml does. ggml asserts stop > start; kiln also needs step > 0 (a
 *    negative step would give a negative count, which ggml never checks) and a finite count.
 *  - fill(a, c): a's shape and type. ggml takes f32 and f16 (contiguous); kiln also bf16 and any
 *    layout of a (a is never read).
 *  - diag_mask_inf(a, n_past): a's shape and type. ggml's CPU kernel asserts n_past >= 0 and
 *    takes f32 only; kiln takes f32, f16 and bf16 (values are copied, never computed on).
 *  - tri(a, type): a's shape and type; ggml asserts f32, contiguous and ne0 == ne1. kiln keeps
 *    ne0 == ne1, and takes f16, bf16 and any layout as well. The type enum follows ggml's
 *    ggml_tri_type order (upper_diag = 0, upper, lower_diag, lower). */
#include "infer.h"

#include <math.h>

/* The element count of arange as ggml computes it: in f32, then ceilf, then truncated. */
static bool arange_count(float start, float stop, float step, int64_t *n) {
    const float q = ceilf((stop - start) / step);
    if (!isfinite(q) || q < 1.0f || q > 281474976710656.0f /* 2^48, fe_build's limit */) return false;
    *n = (int64_t)q;
    return true;
}

bool fe_infer_ARANGE(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const float start = a->fp[0], stop = a->fp[1], step = a->fp[2];
    if (!isfinite(start) || !isfinite(stop) || !isfinite(step))
        return fe_reject(ctx, KILN_ERR_INVALID, "arange: start %g, stop %g and step %g must be finite", (double)start,
                         (double)stop, (double)step);
    if (!(stop > start))
        return fe_reject(ctx, KILN_ERR_INVALID, "arange: stop (%g) must be greater than start (%g)", (double)stop,
                         (double)start);
    if (!(step > 0.0f)) return fe_reject(ctx, KILN_ERR_INVALID, "arange: step is %g; it must be > 0", (double)step);
    int64_t n;
    if (!arange_count(start, stop, step, &n))
        return fe_reject(ctx, KILN_ERR_INVALID,
                         "arange: start %g, stop %g, step %g give ceil((stop - start) / step) = %g "
                         "elements; it must be between 1 and 2^48", (double)start, (double)stop, (double)step,
                         (double)ceilf((stop - start) / step));
    *type = KILN_F32;
    ne[0] = n;
    ne[1] = ne[2] = ne[3] = 1;
    *n_dims = 1;
    return true;
}

bool fe_infer_FILL(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    return fe_like_float_a(ctx, "fill", a, type, ne, n_dims);
}

bool fe_infer_DIAG_MASK_INF(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    if (a->ip[0] < 0)
        return fe_reject(ctx, KILN_ERR_INVALID, "diag_mask_inf: n_past is %d; it must be >= 0", (int)a->ip[0]);
    return fe_like_float_a(ctx, "diag_mask_inf", a, type, ne, n_dims);
}

bool fe_infer_TRI(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (a->ip[0] < KILN_TRI_UPPER_DIAG || a->ip[0] > KILN_TRI_LOWER)
        return fe_reject(ctx, KILN_ERR_INVALID,
                         "tri: type %d is not one of upper_diag (0), upper, lower_diag, lower (3)", (int)a->ip[0]);
    if (!fe_like_float_a(ctx, "tri", a, type, ne, n_dims)) return false;
    if (x->ne[0] != x->ne[1]) {
        char s[96];
        fe_failf(ctx, KILN_ERR_SHAPE, "tri: '%s' (%s) must be square in its first two dims (ne0 == ne1)",
                 x->name, fe_shape_str(x, s, sizeof s));
        return false;
    }
    return true;
}
