/* CPU reference of the attention family: flash_attn_ext.
 *
 * ggml_compute_forward_flash_attn_ext_f16 (ggml/src/ggml-cpu/ops.cpp), per query row (token
 * iq1, head h, sequence iq3), with kv head h / (n_head / n_head_kv):
 *   scale' = logit_softcap != 0 ? scale / logit_softcap : scale
 *   s_j    = dot(q, k_j) * scale';  s_j = logit_softcap * tanh(s_j) when softcap != 0
 *   s_j   += slope(h) * mask[j, iq1, h % m2, iq3 % m3]   (slope 1 unless max_bias > 0, ALiBi as
 *            soft_max_ext); keys whose mask value is -inf are skipped. An i32 mask [2, n_q]
 *            (kiln's key intervals) lets token iq1 see keys mask[0, iq1] <= j < mask[1, iq1].
 *   out    = sum_j exp(s_j - M) v_j / (sum_j exp(s_j - M) + [sinks] exp(sink_h - M))
 * with M the maximum over the s_j and the sink. A row with no unmasked key and no sink gives
 * zeros (ggml: S == 0 -> 0). The sums run in double; the dot products too. The result goes to
 * dst[:, h, iq1, iq3]. */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const ir_ref *q, *k, *v, *mask, *sinks;
    float scale, max_bias, softcap;
    uint32_t n_head_log2;
    float m0, m1;
} fa_params;

static float slope_of(const fa_params *f, uint32_t h) {
    if (!(f->max_bias > 0.0f)) return 1.0f;
    return h < f->n_head_log2 ? powf(f->m0, h + 1) : powf(f->m1, 2 * (h - f->n_head_log2) + 1);
}

static void load_vec(void **data, const ir_ref *r, int64_t i1, int64_t i2, int64_t i3, float *out) {
    int64_t c[4] = {0, i1, i2, i3};
    int64_t base = ir_offset_at(r, c);
    for (int64_t i = 0; i < r->ne[0]; i++) out[i] = kb_load_f32(data[r->buf], r->type, base + i * r->st[0]);
}

kiln_status ir_ref_attn(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    if (n->op != FE_OP_FLASH_ATTN_EXT)
        return kb_error(KILN_ERR_INVALID, "reference: %s is not an attention op", fe_ops[n->op].name);
    fa_params f = {.q = ir_operand(n, 0), .k = ir_operand(n, 1), .v = ir_operand(n, 2),
                   .mask = ir_operand(n, 3), .sinks = ir_operand(n, 4),
                   .scale = n->fp[0], .max_bias = n->fp[1], .softcap = n->fp[2]};
    uint32_t n_head = (uint32_t)f.q->ne[2];
    f.n_head_log2 = 1u << (uint32_t)floor(log2(n_head));
    f.m0 = powf(2.0f, -(f.max_bias) / f.n_head_log2);
    f.m1 = powf(2.0f, -(f.max_bias / 2.0f) / f.n_head_log2);
    float scale = f.softcap != 0.0f ? f.scale / f.softcap : f.scale;
    int64_t Dk = f.q->ne[0], Dv = f.v->ne[0], n_kv = f.k->ne[1];
    int64_t rk = f.q->ne[2] / f.k->ne[2];

    float  *qv = malloc((size_t)(Dk + Dk + Dv) * sizeof *qv);
    double *acc = malloc((size_t)Dv * sizeof *acc);
    double *s = malloc((size_t)(n_kv ? n_kv : 1) * sizeof *s);
    if (!qv || !acc || !s) {
        free(qv), free(acc), free(s);
        return kb_oom();
    }
    float *kv = qv + Dk, *vv = kv + Dk;
    for (int64_t i3 = 0; i3 < f.q->ne[3]; i3++)
        for (int64_t i1 = 0; i1 < f.q->ne[1]; i1++)
            for (int64_t h = 0; h < f.q->ne[2]; h++) {
                load_vec(data, f.q, i1, h, i3, qv);
                float  slope = slope_of(&f, (uint32_t)h);
                int64_t lo = 0, hi = n_kv; /* key intervals: token i1 sees lo <= j < hi */
                if (f.mask && f.mask->type == KILN_I32) {
                    int64_t c0[4] = {0, i1, 0, 0}, c1[4] = {1, i1, 0, 0};
                    lo = ((const int32_t *)data[f.mask->buf])[ir_offset_at(f.mask, c0)];
                    hi = ((const int32_t *)data[f.mask->buf])[ir_offset_at(f.mask, c1)];
                }
                double M = -INFINITY;
                for (int64_t j = 0; j < n_kv; j++) {
                    s[j] = -INFINITY;
                    float mv = 0.0f;
                    if (f.mask && f.mask->type == KILN_I32) {
                        if (j < lo || j >= hi) continue;
                    } else if (f.mask) {
                        int64_t c[4] = {j, i1, h, i3};
                        mv = slope * kb_load_f32(data[f.mask->buf], f.mask->type, ir_offset_at(f.mask, c));
                        if (mv == -INFINITY) continue;
                    }
                    load_vec(data, f.k, j, h / rk, i3, kv);
                    double d = 0.0;
                    for (int64_t i = 0; i < Dk; i++) d += (double)qv[i] * (double)kv[i];
                    float x = (float)d * scale;
                    if (f.softcap != 0.0f) x = f.softcap * tanhf(x);
                    s[j] = (double)(x + mv);
                    if (s[j] > M) M = s[j];
                }
                double sink = -INFINITY;
                if (f.sinks) {
                    int64_t c[4] = {h, 0, 0, 0};
                    sink = kb_load_f32(data[f.sinks->buf], KILN_F32, ir_offset_at(f.sinks, c));
                    if (sink > M) M = sink;
                }
                double S = 0.0;
                for (int64_t i = 0; i < Dv; i++) acc[i] = 0.0;
                for (int64_t j = 0; j < n_kv; j++) {
                    if (s[j] == -INFINITY) continue;
                    double w = exp(s[j] - M);
                    S += w;
                    load_vec(data, f.v, j, h / rk, i3, vv);
                    for (int64_t i = 0; i < Dv; i++) acc[i] += w * (double)vv[i];
                }
                if (f.sinks && sink != -INFINITY) S += exp(sink - M);
                double inv = S > 0.0 ? 1.0 / S : 0.0;
                for (int64_t i = 0; i < Dv; i++) {
                    int64_t c[4] = {i, h, i1, i3};
                    kb_store_f32(data[n->dst.buf], n->dst.type, ir_offset_at(&n->dst, c), (float)(acc[i] * inv));
                }
            }
    free(qv), free(acc), free(s);
    return NULL;
}
