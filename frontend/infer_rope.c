/* Shape and type rules of the rope family (see frontend/infer.h).
 *
 * As ggml (ggml_rope_impl in ggml.c, and the asserts of ggml_compute_forward_rope_flt in
 * ggml-cpu/ops.cpp, which run at compute time there and are frontend errors here):
 *  - a: f32, f16 or bf16 (ggml's CPU takes f32 and f16; bf16 is computed the same way in f32),
 *    [head_dim, n_head, n_tokens, n_seq]; any layout (the kernel reads through strides);
 *  - pos: an i32 vector of n_tokens positions, or 4 * n_tokens (t, h, w, e) for the mrope
 *    modes (mode & 8: mrope, vision, imrope);
 *  - freq_factors: optional f32 with ne0 >= n_dims / 2 (vision: >= n_dims, the pairs it rotates);
 *  - n_dims even, 0 <= n_dims <= head_dim; vision needs n_dims == head_dim / 2;
 *  - mode one of 0 (normal), 2 (neox), 8 (mrope), 24 (vision), 40 (imrope): the CPU aborts on
 *    any other;
 *  - mrope modes: sections >= 0, one of the first three > 0, their sum <= head_dim.
 * The result has a's shape and type. ggml drops sections for non-mrope modes; kiln keeps them
 * in the node but ignores them there. */
#include "infer.h"

#include <stdio.h>

static bool is_mode(int32_t m) { return m == 0 || m == 2 || m == 8 || m == 24 || m == 40; }

/* The checks of a, pos and freq_factors' types and shapes. */
static bool check_operands(kiln_ctx *ctx, const fe_args *a, int32_t mode, int32_t n_dims) {
    const kiln_tensor *x = a->t[0], *pos = a->t[1], *ff = a->t[2];
    char               sx[96], sp[96];
    if (!fe_is_float(x->type))
        return fe_reject(ctx, KILN_ERR_SHAPE, "rope_ext: operand '%s' is %s; it must be f32, f16 or bf16", x->name,
                         fe_shape_str(x, sx, sizeof sx));
    bool   mrope = (mode & 8) != 0;
    int64_t want = mrope ? 4 * x->ne[2] : x->ne[2];
    if (pos->type != KILN_I32 || pos->ne[1] != 1 || pos->ne[2] != 1 || pos->ne[3] != 1 || pos->ne[0] != want)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "rope_ext: positions '%s' are %s; they must be an i32 vector of %lld (%s'%s' ne2 = %lld)",
                         pos->name, fe_shape_str(pos, sp, sizeof sp), (long long)want, mrope ? "4 per token of " : "",
                         x->name, (long long)x->ne[2]);
    if (ff) {
        int64_t need = mode == 24 ? n_dims : n_dims / 2;
        if (ff->type != KILN_F32 || ff->ne[0] < need)
            return fe_reject(ctx, KILN_ERR_SHAPE,
                             "rope_ext: freq_factors '%s' is %s; it must be f32 with ne0 >= %lld (n_dims = %d%s)",
                             ff->name, fe_shape_str(ff, sp, sizeof sp), (long long)need, (int)n_dims,
                             mode == 24 ? ", vision" : "");
    }
    return true;
}

static bool check_sections(kiln_ctx *ctx, const fe_args *a, int64_t head_dim) {
    const int32_t *s = &a->ip[3];
    int64_t        sum = 0;
    for (int i = 0; i < 4; i++) {
        if (s[i] < 0)
            return fe_reject(ctx, KILN_ERR_INVALID, "rope_ext: sections [%d, %d, %d, %d] has a negative entry",
                             (int)s[0], (int)s[1], (int)s[2], (int)s[3]);
        sum += s[i];
    }
    if (s[0] <= 0 && s[1] <= 0 && s[2] <= 0)
        return fe_reject(ctx, KILN_ERR_INVALID,
                         "rope_ext: mode %d (mrope) needs sections with one of the first three > 0; got [%d, %d, %d, %d]",
                         (int)a->ip[1], (int)s[0], (int)s[1], (int)s[2], (int)s[3]);
    if (sum > head_dim)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "rope_ext: sections [%d, %d, %d, %d] sum to %lld, more than head_dim %lld", (int)s[0],
                         (int)s[1], (int)s[2], (int)s[3], (long long)sum, (long long)head_dim);
    return true;
}

/* ggml_rope_ext / ggml_rope_multi. */
bool fe_infer_ROPE_EXT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    int32_t            nd = a->ip[0], mode = a->ip[1];
    char               sx[96];
    if (!is_mode(mode))
        return fe_reject(ctx, KILN_ERR_INVALID,
                         "rope_ext: mode %d is not one of 0 (normal), 2 (neox), 8 (mrope), 24 (vision), 40 (imrope)",
                         (int)mode);
    if (!check_operands(ctx, a, mode, nd)) return false;
    if (nd < 0 || nd % 2 != 0 || nd > x->ne[0])
        return fe_reject(ctx, KILN_ERR_SHAPE, "rope_ext: n_dims %d must be even and within 0..ne0 of '%s' (%s)",
                         (int)nd, x->name, fe_shape_str(x, sx, sizeof sx));
    if (mode == 24 && (int64_t)nd * 2 != x->ne[0])
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "rope_ext: vision mode needs n_dims == ne0 / 2; n_dims is %d and '%s' is %s", (int)nd, x->name,
                         fe_shape_str(x, sx, sizeof sx));
    if ((mode & 8) && !check_sections(ctx, a, x->ne[0])) return false;
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = x->type;
    *n_dims = x->n_dims;
    return true;
}
