/* The C builders of the ops whose shape rules live in frontend/infer_*.c: each packs its
 * arguments in signature order (FE_OPS) and goes through fe_build, the parser's path, so the C
 * API and the .kg format cannot disagree. */
#include "frontend.h"
#include "infer.h"

#include <string.h>

/* Every op's shape rule, from its row of FE_OPS: adding an op adds its rule here by itself. */
static const fe_infer_fn infer_fns[FE_OP_COUNT] = {
#define FE_X(id, name, kind, nsrc, sig, fam, types, tol) [FE_OP_##id] = FE_INFER_RULE(kind, id),
    FE_OPS(FE_X)
#undef FE_X
};

fe_infer_fn fe_infer_of(fe_op op) { return (unsigned)op < FE_OP_COUNT ? infer_fns[op] : NULL; }

static kiln_tensor *build(kiln_ctx *ctx, fe_op op, fe_args *a) {
    if (!ctx || ctx->err) return NULL;
    return fe_build(ctx, op, a);
}

/* One operand; the other parameters at their defaults. */
static kiln_tensor *op1(kiln_ctx *ctx, fe_op op, kiln_tensor *x) {
    if (!x) return NULL;
    fe_args a;
    memset(&a, 0, sizeof a);
    fe_args_defaults(op, &a);
    a.t[0] = x;
    return build(ctx, op, &a);
}

static kiln_tensor *glu(kiln_ctx *ctx, fe_op op, kiln_tensor *x, kiln_tensor *g, bool swapped) {
    if (!x) return NULL;
    fe_args a;
    memset(&a, 0, sizeof a);
    fe_args_defaults(op, &a);
    a.t[0] = x;
    a.t[1] = g;
    a.ip[0] = swapped;
    return build(ctx, op, &a);
}

kiln_tensor *kiln_reglu(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped) { return glu(ctx, FE_OP_REGLU, a, b, swapped); }
kiln_tensor *kiln_geglu(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped) { return glu(ctx, FE_OP_GEGLU, a, b, swapped); }
kiln_tensor *kiln_swiglu(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped) { return glu(ctx, FE_OP_SWIGLU, a, b, swapped); }
kiln_tensor *kiln_geglu_erf(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped) { return glu(ctx, FE_OP_GEGLU_ERF, a, b, swapped); }
kiln_tensor *kiln_geglu_quick(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped) { return glu(ctx, FE_OP_GEGLU_QUICK, a, b, swapped); }

kiln_tensor *kiln_swiglu_oai(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped, float alpha,
                             float limit) {
    if (!a) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.t[1] = b;
    x.ip[0] = swapped;
    x.fp[0] = alpha;
    x.fp[1] = limit;
    return build(ctx, FE_OP_SWIGLU_OAI, &x);
}

static kiln_tensor *op2(kiln_ctx *ctx, fe_op op, kiln_tensor *x, kiln_tensor *y) {
    if (!x || !y) return NULL;
    fe_args a;
    memset(&a, 0, sizeof a);
    fe_args_defaults(op, &a);
    a.t[0] = x;
    a.t[1] = y;
    return build(ctx, op, &a);
}

kiln_tensor *kiln_cpy(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return op2(ctx, FE_OP_CPY, a, b); }
kiln_tensor *kiln_dup(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_DUP, a); }
kiln_tensor *kiln_repeat(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return op2(ctx, FE_OP_REPEAT, a, b); }

kiln_tensor *kiln_cast(kiln_ctx *ctx, kiln_tensor *a, kiln_type type) {
    if (!a) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.ip[0] = (int32_t)type;
    return build(ctx, FE_OP_CAST, &x);
}

kiln_tensor *kiln_get_rows(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *ids) { return op2(ctx, FE_OP_GET_ROWS, a, ids); }

static kiln_tensor *op3(kiln_ctx *ctx, fe_op op, kiln_tensor *x, kiln_tensor *y, kiln_tensor *z) {
    if (!x || !y || !z) return NULL;
    fe_args a;
    memset(&a, 0, sizeof a);
    fe_args_defaults(op, &a);
    a.t[0] = x;
    a.t[1] = y;
    a.t[2] = z;
    return build(ctx, op, &a);
}

kiln_tensor *kiln_set_rows(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, kiln_tensor *ids) { return op3(ctx, FE_OP_SET_ROWS, a, b, ids); }
kiln_tensor *kiln_add_id(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, kiln_tensor *ids) { return op3(ctx, FE_OP_ADD_ID, a, b, ids); }

kiln_tensor *kiln_concat(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, int dim) {
    if (!a || !b) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.t[1] = b;
    x.ip[0] = dim;
    return build(ctx, FE_OP_CONCAT, &x);
}

kiln_tensor *kiln_pad_ext(kiln_ctx *ctx, kiln_tensor *a, int lp0, int rp0, int lp1, int rp1, int lp2,
                          int rp2, int lp3, int rp3) {
    if (!a) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    int32_t p[8] = {lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3};
    memcpy(x.ip, p, sizeof p);
    return build(ctx, FE_OP_PAD, &x);
}

kiln_tensor *kiln_pad(kiln_ctx *ctx, kiln_tensor *a, int p0, int p1, int p2, int p3) {
    return kiln_pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3);
}

static kiln_tensor *op1f(kiln_ctx *ctx, fe_op op, kiln_tensor *x, float f) {
    if (!x) return NULL;
    fe_args a;
    memset(&a, 0, sizeof a);
    a.t[0] = x;
    a.fp[0] = f;
    return build(ctx, op, &a);
}

kiln_tensor *kiln_norm(kiln_ctx *ctx, kiln_tensor *a, float eps) { return op1f(ctx, FE_OP_NORM, a, eps); }
kiln_tensor *kiln_rms_norm(kiln_ctx *ctx, kiln_tensor *a, float eps) { return op1f(ctx, FE_OP_RMS_NORM, a, eps); }
kiln_tensor *kiln_l2_norm(kiln_ctx *ctx, kiln_tensor *a, float eps) { return op1f(ctx, FE_OP_L2_NORM, a, eps); }
kiln_tensor *kiln_fill(kiln_ctx *ctx, kiln_tensor *a, float c) { return op1f(ctx, FE_OP_FILL, a, c); }

kiln_tensor *kiln_group_norm(kiln_ctx *ctx, kiln_tensor *a, int n_groups, float eps) {
    if (!a) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.ip[0] = n_groups;
    x.fp[0] = eps;
    return build(ctx, FE_OP_GROUP_NORM, &x);
}

kiln_tensor *kiln_soft_max(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_SOFT_MAX, a); }

kiln_tensor *kiln_soft_max_ext(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *mask, float scale,
                               float max_bias, kiln_tensor *sinks) {
    if (!a) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.t[1] = mask;
    x.t[2] = sinks;
    x.fp[0] = scale;
    x.fp[1] = max_bias;
    return build(ctx, FE_OP_SOFT_MAX_EXT, &x);
}

kiln_tensor *kiln_rope_multi(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *pos, kiln_tensor *freq_factors,
                             int n_dims, const int sections[4], int mode, int n_ctx_orig,
                             float freq_base, float freq_scale, float ext_factor, float attn_factor,
                             float beta_fast, float beta_slow) {
    if (!a || !pos) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.t[1] = pos;
    x.t[2] = freq_factors;
    x.ip[0] = n_dims;
    x.ip[1] = mode;
    x.ip[2] = n_ctx_orig;
    for (int i = 0; i < 4; i++) x.ip[3 + i] = sections ? sections[i] : 0;
    float f[6] = {freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow};
    memcpy(x.fp, f, sizeof f);
    return build(ctx, FE_OP_ROPE_EXT, &x);
}

kiln_tensor *kiln_rope_ext(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *pos, kiln_tensor *freq_factors,
                           int n_dims, int mode, int n_ctx_orig, float freq_base, float freq_scale,
                           float ext_factor, float attn_factor, float beta_fast, float beta_slow) {
    return kiln_rope_multi(ctx, a, pos, freq_factors, n_dims, NULL, mode, n_ctx_orig, freq_base,
                           freq_scale, ext_factor, attn_factor, beta_fast, beta_slow);
}

kiln_tensor *kiln_sum(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_SUM, a); }
kiln_tensor *kiln_sum_rows(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_SUM_ROWS, a); }
kiln_tensor *kiln_mean(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_MEAN, a); }
kiln_tensor *kiln_argmax(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_ARGMAX, a); }
kiln_tensor *kiln_cumsum(kiln_ctx *ctx, kiln_tensor *a) { return op1(ctx, FE_OP_CUMSUM, a); }

static kiln_tensor *op1i(kiln_ctx *ctx, fe_op op, kiln_tensor *x, int v) {
    if (!x) return NULL;
    fe_args a;
    memset(&a, 0, sizeof a);
    a.t[0] = x;
    a.ip[0] = v;
    return build(ctx, op, &a);
}

kiln_tensor *kiln_argsort(kiln_ctx *ctx, kiln_tensor *a, kiln_sort_order order) { return op1i(ctx, FE_OP_ARGSORT, a, (int)order); }
kiln_tensor *kiln_argsort_top_k(kiln_ctx *ctx, kiln_tensor *a, int k) { return op1i(ctx, FE_OP_ARGSORT_TOP_K, a, k); }
kiln_tensor *kiln_top_k(kiln_ctx *ctx, kiln_tensor *a, int k) { return op1i(ctx, FE_OP_TOP_K, a, k); }
kiln_tensor *kiln_diag_mask_inf(kiln_ctx *ctx, kiln_tensor *a, int n_past) { return op1i(ctx, FE_OP_DIAG_MASK_INF, a, n_past); }

/* Over one rank the sum is the operand: no node (the graph of a single GPU stays as it was). */
kiln_tensor *kiln_all_reduce(kiln_ctx *ctx, kiln_tensor *a, int ranks) {
    if (ranks == 1) return a;
    return op1i(ctx, FE_OP_ALL_REDUCE, a, ranks);
}
kiln_tensor *kiln_tri(kiln_ctx *ctx, kiln_tensor *a, kiln_tri_type type) { return op1i(ctx, FE_OP_TRI, a, (int)type); }

kiln_tensor *kiln_sample_row(kiln_ctx *ctx, kiln_tensor *logits, kiln_tensor *pos, const kiln_sampler_params *p) {
    if (!ctx || !logits || !pos) return NULL;
    if (!p) {
        fe_failf(ctx, KILN_ERR_INVALID, "sample: NULL sampler parameters");
        return NULL;
    }
    /* The op has no history: penalties stay with the host sampler. */
    if (kiln_sampler_penalized(p)) {
        fe_failf(ctx, KILN_ERR_INVALID, "sample: penalties (--repeat-penalty %g, --presence-penalty %g, "
                 "--frequency-penalty %g) are not part of the op", (double)p->repeat_penalty,
                 (double)p->presence_penalty, (double)p->frequency_penalty);
        return NULL;
    }
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = logits;
    x.t[1] = pos;
    x.ip[0] = (int32_t)(uint32_t)p->seed;
    x.ip[1] = (int32_t)(uint32_t)(p->seed >> 32);
    x.ip[2] = p->top_k;
    x.fp[0] = p->temp, x.fp[1] = p->top_p, x.fp[2] = p->min_p;
    return build(ctx, FE_OP_SAMPLE, &x);
}

kiln_tensor *kiln_arange(kiln_ctx *ctx, float start, float stop, float step) {
    fe_args x;
    memset(&x, 0, sizeof x);
    x.fp[0] = start;
    x.fp[1] = stop;
    x.fp[2] = step;
    return build(ctx, FE_OP_ARANGE, &x);
}

kiln_tensor *kiln_mul_mat(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = a;
    x.t[1] = b;
    return build(ctx, FE_OP_MUL_MAT, &x);
}

kiln_tensor *kiln_mul_mat_id(kiln_ctx *ctx, kiln_tensor *as, kiln_tensor *b, kiln_tensor *ids) {
    if (!as || !b || !ids) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = as;
    x.t[1] = b;
    x.t[2] = ids;
    return build(ctx, FE_OP_MUL_MAT_ID, &x);
}

kiln_tensor *kiln_flash_attn_ext(kiln_ctx *ctx, kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                 kiln_tensor *mask, float scale, float max_bias, float logit_softcap,
                                 kiln_tensor *sinks) {
    if (!q || !k || !v) return NULL;
    fe_args x;
    memset(&x, 0, sizeof x);
    x.t[0] = q;
    x.t[1] = k;
    x.t[2] = v;
    x.t[3] = mask;
    x.t[4] = sinks;
    x.fp[0] = scale;
    x.fp[1] = max_bias;
    x.fp[2] = logit_softcap;
    return build(ctx, FE_OP_FLASH_ATTN_EXT, &x);
}
