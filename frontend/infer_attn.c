/* Shape and type rules of the attention family (see frontend/infer.h): flash_attn_ext.
 *
 * As ggml (ggml_flash_attn_ext and ggml_flash_attn_ext_add_sinks in ggml/src/ggml.c):
 *   q    [Dk, n_q,  n_head,    ne3]   f32
 *   k    [Dk, n_kv, n_head_kv, ne3]   f32, f16 or bf16
 *   v    [Dv, n_kv, n_head_kv, ne3]   same type as k, not transposed
 *   mask [n_kv, >= n_q, m2, m3]       f16, optional; m2 | n_head, m3 | ne3
 *        or [2, >= n_q]                i32 key intervals (kiln's; check_intervals)
 *   sinks [n_head]                    f32, optional
 *   result [Dv, n_head, n_q, ne3] f32 — heads and tokens swapped ("permuted"), as ggml.
 * n_head_kv | n_head (GQA: head h reads kv head h / (n_head / n_head_kv)); max_bias > 0
 * (ALiBi) needs a mask. ggml asserts a contiguous mask; kiln reads the mask through strides
 * but still wants its rows contiguous (nb0 = 2), like k and v rows. */
#include "infer.h"

static bool rows_contiguous(kiln_ctx *ctx, const char *what, const kiln_tensor *t) {
    if (t->nb[0] == kiln_type_size(t->type)) return true;
    fe_failf(ctx, KILN_ERR_SHAPE, "flash_attn_ext: %s %s must have contiguous rows (nb0 = element size)",
             what, fe_describe(t).s);
    return false;
}

/* kiln's key intervals: an i32 mask [2, >= n_q] gives token t the keys mask[0, t] <= j <
 * mask[1, t] (what a 0 / -inf f16 mask of a batch of sequences, each in its own range of
 * cells, says in 2 numbers a token instead of n_kv; kiln_batch). One sequence (q's ne3 1). */
static bool check_intervals(kiln_ctx *ctx, const kiln_tensor *q, const kiln_tensor *m) {
    if (m->ne[0] != 2 || m->ne[1] < q->ne[1] || m->ne[2] != 1 || m->ne[3] != 1 || q->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "flash_attn_ext: key intervals %s must be i32 [2, >= n_q (%lld)] over q %s of one sequence",
                         fe_describe(m).s, (long long)q->ne[1], fe_describe(q).s);
    return rows_contiguous(ctx, "key intervals", m);
}

static bool check_mask(kiln_ctx *ctx, const kiln_tensor *q, const kiln_tensor *k, const kiln_tensor *m) {
    if (m->type == KILN_I32) return check_intervals(ctx, q, m);
    if (m->type != KILN_F16)
        return fe_reject(ctx, KILN_ERR_SHAPE, "flash_attn_ext: mask %s must be f16 (or i32 key intervals)",
                         fe_describe(m).s);
    if (m->ne[0] != k->ne[1] || m->ne[1] < q->ne[1])
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "flash_attn_ext: mask %s must have ne0 == n_kv (%lld) and at least n_q (%lld) rows",
                         fe_describe(m).s, (long long)k->ne[1], (long long)q->ne[1]);
    if (q->ne[2] % m->ne[2] != 0 || q->ne[3] % m->ne[3] != 0)
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "flash_attn_ext: mask %s must broadcast over q %s: its ne2 and ne3 must divide q's",
                         fe_describe(m).s, fe_describe(q).s);
    return rows_contiguous(ctx, "mask", m);
}

bool fe_infer_FLASH_ATTN_EXT(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *q = a->t[0], *k = a->t[1], *v = a->t[2], *mask = a->t[3], *sinks = a->t[4];
    if (q->type != KILN_F32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "flash_attn_ext: q %s must be f32", fe_describe(q).s);
    if (!fe_is_float(k->type) || v->type != k->type)
        return fe_reject(ctx, KILN_ERR_SHAPE, "flash_attn_ext: k %s and v %s must have the same type, f32, f16 or bf16",
                         fe_describe(k).s, fe_describe(v).s);
    if (k->ne[0] != q->ne[0] || k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2])
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "flash_attn_ext: q %s, k %s and v %s disagree: need k.ne0 == q.ne0, and k and v with the "
                         "same n_kv (ne1) and kv heads (ne2)", fe_describe(q).s, fe_describe(k).s, fe_describe(v).s);
    if (q->ne[2] % k->ne[2] != 0 || q->ne[3] != k->ne[3] || q->ne[3] != v->ne[3])
        return fe_reject(ctx, KILN_ERR_SHAPE,
                         "flash_attn_ext: the kv heads of k %s must divide the heads of q %s, and ne3 must match",
                         fe_describe(k).s, fe_describe(q).s);
    if (!rows_contiguous(ctx, "k", k) || !rows_contiguous(ctx, "v", v)) return false;
    if (mask && !check_mask(ctx, q, k, mask)) return false;
    if (sinks && (sinks->type != KILN_F32 || sinks->ne[0] != q->ne[2] || fe_nelements(sinks) != sinks->ne[0]))
        return fe_reject(ctx, KILN_ERR_SHAPE, "flash_attn_ext: sinks %s must be f32 [n_head = %lld]",
                         fe_describe(sinks).s, (long long)q->ne[2]);
    if (a->fp[1] > 0.0f && (!mask || mask->type != KILN_F16))
        return fe_reject(ctx, KILN_ERR_INVALID, "flash_attn_ext: max_bias %g > 0 (ALiBi) needs a mask%s",
                         (double)a->fp[1], mask ? " (f16, not key intervals)" : "");
    ne[0] = v->ne[0];
    ne[1] = q->ne[2];
    ne[2] = q->ne[1];
    ne[3] = q->ne[3];
    *type = KILN_F32;
    *n_dims = 4;
    return true;
}
