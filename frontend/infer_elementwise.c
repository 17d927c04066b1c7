/* Shape and type rules of the elementwise-lowered ops: gated units (FE_GLU) and copies
 * (FE_COPY). See frontend/infer.h. */
#include "infer.h"

static bool need_float(kiln_ctx *ctx, const char *op, const char *what, const kiln_tensor *t) {
    if (fe_is_float(t->type)) return true;
    char s[96];
    fe_failf(ctx, KILN_ERR_SHAPE, "%s: %s '%s' is %s; it must be f32, f16 or bf16", op, what, t->name,
             fe_shape_str(t, s, sizeof s));
    return false;
}

static bool same_shape(const kiln_tensor *a, const kiln_tensor *b) {
    for (int d = 0; d < 4; d++)
        if (a->ne[d] != b->ne[d]) return false;
    return true;
}

/* ggml_glu / ggml_glu_split. */
static bool glu(kiln_ctx *ctx, fe_op op, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const char  *name = fe_ops[op].name;
    kiln_tensor *x = a->t[0], *g = a->t[1];
    char         sx[96], sg[96];
    if (!need_float(ctx, name, "operand", x)) return false;
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = x->type;
    *n_dims = x->n_dims;
    if (g) {
        if (!need_float(ctx, name, "gate", g)) return false;
        if (!same_shape(x, g))
            return fe_reject(ctx, KILN_ERR_SHAPE, "%s: '%s' (%s) and '%s' (%s) must have the same shape", name, x->name,
                             fe_shape_str(x, sx, sizeof sx), g->name, fe_shape_str(g, sg, sizeof sg));
        if (g->type != x->type)
            return fe_reject(ctx, KILN_ERR_SHAPE, "%s: '%s' (%s) and '%s' (%s) must have the same type (as in ggml)",
                             name, x->name, fe_shape_str(x, sx, sizeof sx), g->name, fe_shape_str(g, sg, sizeof sg));
        if (a->ip[0])
            return fe_reject(ctx, KILN_ERR_INVALID, "%s: swapped applies to the one-tensor form only (b is given)",
                             name);
        if (g->n_dims > *n_dims) *n_dims = g->n_dims;
        return true;
    }
    if (x->ne[0] % 2 != 0)
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: '%s' (%s) has an odd ne0; the one-tensor form splits ne0 in halves",
                         name, x->name, fe_shape_str(x, sx, sizeof sx));
    ne[0] = x->ne[0] / 2;
    return true;
}

bool fe_infer_REGLU(kiln_ctx *c, const fe_args *a, kiln_type *t, int64_t ne[4], int *n) { return glu(c, FE_OP_REGLU, a, t, ne, n); }
bool fe_infer_GEGLU(kiln_ctx *c, const fe_args *a, kiln_type *t, int64_t ne[4], int *n) { return glu(c, FE_OP_GEGLU, a, t, ne, n); }
bool fe_infer_SWIGLU(kiln_ctx *c, const fe_args *a, kiln_type *t, int64_t ne[4], int *n) { return glu(c, FE_OP_SWIGLU, a, t, ne, n); }
bool fe_infer_SWIGLU_OAI(kiln_ctx *c, const fe_args *a, kiln_type *t, int64_t ne[4], int *n) { return glu(c, FE_OP_SWIGLU_OAI, a, t, ne, n); }
bool fe_infer_GEGLU_ERF(kiln_ctx *c, const fe_args *a, kiln_type *t, int64_t ne[4], int *n) { return glu(c, FE_OP_GEGLU_ERF, a, t, ne, n); }
bool fe_infer_GEGLU_QUICK(kiln_ctx *c, const fe_args *a, kiln_type *t, int64_t ne[4], int *n) { return glu(c, FE_OP_GEGLU_QUICK, a, t, ne, n); }

/* ggml_cpy: a's values in b's shape and type; b only gives the layout. */
bool fe_infer_CPY(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    kiln_tensor *x = a->t[0], *b = a->t[1];
    char         sx[96], sb[96];
    if (!need_float(ctx, "cpy", "source", x) || !need_float(ctx, "cpy", "destination", b)) return false;
    if (fe_nelements(x) != fe_nelements(b))
        return fe_reject(ctx, KILN_ERR_SHAPE, "cpy: '%s' (%s) and '%s' (%s) have different element counts", x->name,
                         fe_shape_str(x, sx, sizeof sx), b->name, fe_shape_str(b, sb, sizeof sb));
    for (int d = 0; d < 4; d++) ne[d] = b->ne[d];
    *type = b->type;
    *n_dims = b->n_dims;
    return true;
}

bool fe_infer_DUP(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    kiln_tensor *x = a->t[0];
    if (!need_float(ctx, "dup", "operand", x)) return false;
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = x->type;
    *n_dims = x->n_dims;
    return true;
}

bool fe_infer_CAST(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    kiln_tensor *x = a->t[0];
    if (!need_float(ctx, "cast", "operand", x)) return false;
    kiln_type to = (kiln_type)a->ip[0];
    if (!fe_is_float(to))
        return fe_reject(ctx, KILN_ERR_SHAPE, "cast: target type %s is not f32, f16 or bf16", kiln_type_name(to));
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = to;
    *n_dims = x->n_dims;
    return true;
}

/* ggml_repeat: a tiled to b's shape. */
bool fe_infer_REPEAT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    kiln_tensor *x = a->t[0], *b = a->t[1];
    char         sx[96], sb[96];
    if (!need_float(ctx, "repeat", "operand", x)) return false;
    if (!fe_can_repeat(x, b))
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "repeat: cannot tile '%s' (%s) to the shape of '%s' (%s): each dim of the first must "
                         "divide the second's", x->name, fe_shape_str(x, sx, sizeof sx), b->name,
                         fe_shape_str(b, sb, sizeof sb));
    for (int d = 0; d < 4; d++) ne[d] = b->ne[d];
    *type = x->type;
    *n_dims = b->n_dims;
    return true;
}
