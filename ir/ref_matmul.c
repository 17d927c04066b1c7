/* CPU reference of the matmul families: mul_mat and mul_mat_id.
 *
 *   mul_mat:    dst[i, j, i2, i3] = sum_k a[k, i, i2 / (B2/A2), i3 / (B3/A3)] * b[k, j, i2, i3]
 *   mul_mat_id: dst[i, u, t]      = sum_k as[k, i, ids[u, t]] * b[k, u % B1, t]
 *
 * (ggml_compute_forward_mul_mat / _mul_mat_id in ggml/src/ggml-cpu/ggml-cpu.c.) Products of
 * the operands' f32 values are summed in double, so the reference is the exact result rounded
 * once — a stricter oracle than ggml's CPU path, which rounds b to the weight type first for
 * f16/bf16 weights. An expert id outside [0, n_expert) gives a row of zeros (ggml asserts;
 * kiln cannot check run-time data at build time, so it defines the result instead).
 *
 * KILN_REF_Q8=1 rounds the activations of a quantized weight's product as the GPU's int8 GEMVs
 * do (templates/quant.lua's prologue; ggml's CPU rounds to q8_0 alike): per 32 elements,
 * d = max|x| / 127 and x' = round(x * 127 / max|x|) * d. A diagnosis of a greedy sequence the GPU
 * and the exact reference part (tests/gpu/test_gpu_model.c): whether that rounding alone turns
 * the pick, as a near tie of a MoE router does. */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rounds x (K elements, the activations of weight type t) as the GPU's int8 path, where
 * KILN_REF_Q8 asks for it. (Read at each product: a test sets it between evaluations.) */
static void round_q8(kiln_type t, float *x, int64_t K) {
    const char *e = getenv("KILN_REF_Q8");
    if (!e || strcmp(e, "1") || !kiln_type_is_quantized(t) || K % 32) return;
    for (int64_t b = 0; b < K; b += 32) {
        float m = 0.0f;
        for (int i = 0; i < 32; i++) m = fmaxf(m, fabsf(x[b + i]));
        const float id = m > 0.0f ? 127.0f / m : 0.0f, d = m * (1.0f / 127.0f);
        for (int i = 0; i < 32; i++) x[b + i] = nearbyintf(x[b + i] * id) * d; /* (ties to even, as __float2int_rn) */
    }
}

/* Row i (length K) of matrix (i2, i3) of r, widened to f32. */
static void load_row(void **data, const ir_ref *r, int64_t i, int64_t i2, int64_t i3, float *out) {
    int64_t c[4] = {0, i, i2, i3};
    int64_t base = ir_offset_at(r, c);
    for (int64_t k = 0; k < r->ne[0]; k++) out[k] = kb_load_f32(data[r->buf], r->type, base + k * r->st[0]);
}

static float dot(const float *x, const float *y, int64_t n) {
    double s = 0.0;
    for (int64_t k = 0; k < n; k++) s += (double)x[k] * (double)y[k];
    return (float)s;
}

static void store(void **data, const ir_ref *d, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v) {
    int64_t c[4] = {i0, i1, i2, i3};
    kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), v);
}

static kiln_status mul_mat(const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *b = ir_operand(n, 1), *d = &n->dst;
    int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    float *wa = malloc((size_t)(M * K + K) * sizeof *wa);
    if (!wa) return kb_oom();
    float *wb = wa + M * K;
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            if (i2 % r2 == 0 || i2 == 0)
                for (int64_t i = 0; i < M; i++) load_row(data, a, i, i2 / r2, i3 / r3, wa + i * K);
            for (int64_t j = 0; j < N; j++) {
                load_row(data, b, j, i2, i3, wb);
                round_q8(a->type, wb, K);
                for (int64_t i = 0; i < M; i++) store(data, d, i, j, i2, i3, dot(wa + i * K, wb, K));
            }
        }
    free(wa);
    return NULL;
}

static kiln_status mul_mat_id(const ir_node *n, void **data) {
    const ir_ref *as = ir_operand(n, 0), *b = ir_operand(n, 1), *ids = ir_operand(n, 2), *d = &n->dst;
    int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2], U = ids->ne[0], T = ids->ne[1];
    float *wa = malloc((size_t)(K + K) * sizeof *wa);
    if (!wa) return kb_oom();
    float *wb = wa + K;
    for (int64_t t = 0; t < T; t++)
        for (int64_t u = 0; u < U; u++) {
            int64_t c[4] = {u, t, 0, 0};
            int64_t e = (int64_t)((const int32_t *)data[ids->buf])[ir_offset_at(ids, c)];
            if (e < 0 || e >= E) {
                for (int64_t i = 0; i < M; i++) store(data, d, i, u, t, 0, 0.0f);
                continue;
            }
            load_row(data, b, u % b->ne[1], t, 0, wb);
            round_q8(as->type, wb, K);
            for (int64_t i = 0; i < M; i++) {
                load_row(data, as, i, e, 0, wa);
                store(data, d, i, u, t, 0, dot(wa, wb, K));
            }
        }
    free(wa);
    return NULL;
}

kiln_status ir_ref_matmul(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    switch (n->op) {
    case FE_OP_MUL_MAT: return mul_mat(n, data);
    case FE_OP_MUL_MAT_ID: return mul_mat_id(n, data);
    default: return kb_error(KILN_ERR_INVALID, "reference: %s is not a matmul op", fe_ops[n->op].name);
    }
}
