/* Pass gemv_rope (ir/fuse_gemv_rope.c): the readers of a one-column q/k/v GEMV (rope of q,
 * rope of k into a cache row, v into a cache row) become tails computed by its store. It fires
 * for every weight type (quantized ones included), with and without the rms_norm_gemv norm and frequency factors,
 * for neox ropes and with q/k/v biases (the GEMV's epilogue); it
 * leaves the graph alone for partial rotation, two tokens, a second reader of the
 * product, a cache that is not a state; it gathers the readers after a GEMV that runs between (v of
 * another type than q and k, or no mul_mat_cat); the CPU reference gives the same bits; the memory plan
 * counts the tails at the host's step (a temporary the GEMV reads is not reused for what its
 * store writes); the verifier rejects broken hosts; the fused kernels compile with NVRTC for
 * sm_90a and sm_80 without warnings (both store paths of the gemv, and the quantized gemv's). No GPU. */
#include "tests/support.h"

#include "codegen/codegen.h"
#include "ir/ir_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

/* The attention front of one token: q/k/v projections of x (K rows; normalized first when
 * `norm`, else scaled), rope of q (an output), rope of k into cache_k, v into cache_v (states,
 * or inputs when !state), both caches read back as outputs (else nothing would need them).
 * `rope` is the rope's text after its operand and positions, `extra` is appended. */
static char *front(const char *wt, int K, int tokens, const char *rope, const char *ct, bool state, bool norm,
                   const char *extra) {
    static char kg[4096];
    snprintf(kg, sizeof kg,
             "input x: f32[%d, %d]\ninput pos: i32[%d]\ninput idx: i64[%d]\nweight nw: f32[%d]\nweight ff: f32[32]\n"
             "%s cache_k: %s[128, 16]\n%s cache_v: %s[128, 16]\n"
             "weight wq: %s[%d, 256]\nweight wk: %s[%d, 128]\nweight wv: %s[%d, 128]\n"
             "%s"
             "q = mul_mat(wq, y)\nk = mul_mat(wk, y)\nv = mul_mat(wv, y)\n"
             "q3 = reshape(q, [64, 4, %d])\nk3 = reshape(k, [64, 2, %d])\n"
             "output qr = rope_ext(q3, pos%s)\nkr = rope_ext(k3, pos%s)\n"
             "k_row = reshape(kr, [128, %d])\n"
             "k_cache = set_rows(cache_k, k_row, idx)\nv_cache = set_rows(cache_v, v, idx)\n"
             "output kc = cont(k_cache)\noutput vc = cont(v_cache)\n%s",
             K, tokens, tokens, tokens, K, state ? "state" : "input", ct, state ? "state" : "input", ct, wt, K, wt, K,
             wt, K, norm ? "n = rms_norm(x, 1e-05)\ny = mul(n, nw)\n" : "y = scale(x, 2)\n", tokens, tokens, rope, rope,
             tokens, extra ? extra : "");
    return kg;
}

static const char *const ROPE = ", n_dims=64, mode=0, n_ctx_orig=4096, freq_base=10000";
static const char *const ROPE_FF = ", ff, n_dims=64, mode=0, n_ctx_orig=4096, freq_base=10000, ext_factor=1, freq_scale=0.5";
static const char *const NEOX = ", n_dims=64, mode=2, n_ctx_orig=4096, freq_base=10000";

/* front() (one token, normalized, state caches) with biases added to q, k and v (qwen2,
 * gpt-oss): the GEMV's products are qb, kb, vb. */
static char *front_bias(const char *wt, const char *rope) {
    static char kg[4096];
    snprintf(kg, sizeof kg,
             "input x: f32[64, 1]\ninput pos: i32[1]\ninput idx: i64[1]\nweight nw: f32[64]\n"
             "weight bq: f32[256]\nweight bk: f32[128]\nweight bv: f32[128]\n"
             "state cache_k: f16[128, 16]\nstate cache_v: f16[128, 16]\n"
             "weight wq: %s[64, 256]\nweight wk: %s[64, 128]\nweight wv: %s[64, 128]\n"
             "n = rms_norm(x, 1e-05)\ny = mul(n, nw)\n"
             "q = mul_mat(wq, y)\nk = mul_mat(wk, y)\nv = mul_mat(wv, y)\nqb = add(q, bq)\nkb = add(k, bk)\nvb = add(v, bv)\n"
             "q3 = reshape(qb, [64, 4, 1])\nk3 = reshape(kb, [64, 2, 1])\n"
             "output qr = rope_ext(q3, pos%s)\nkr = rope_ext(k3, pos%s)\nk_row = reshape(kr, [128, 1])\n"
             "k_cache = set_rows(cache_k, k_row, idx)\nv_cache = set_rows(cache_v, vb, idx)\n"
             "output kc = cont(k_cache)\noutput vc = cont(v_cache)\n",
             wt, wt, wt, rope, rope);
    return kg;
}

START_TEST(fires) {
    static const char *wts[5] = {"bf16", "f16", "f32", "q8_0", "q4_K"};
    const char        *wt = wts[_i];
    if (_i < 4) /* (q4_K rows are 256 elements at least) */
        ts_expect_fusion(front(wt, 64, 1, ROPE, "f16", true, true, NULL), NULL,
                         "fused gemv_rope: n, y, q, k, v, qr, kr, k_cache, v_cache\n", "rope_ext nodes:", -1);
    ts_expect_fusion(front(wt, 2048, 1, ROPE_FF, "bf16", true, false, NULL), NULL,
                     "fused gemv_rope: q, k, v, qr, kr, k_cache, v_cache\n", NULL, -1);
    ts_expect_fusion(front(wt, 2048, 1, NEOX, "bf16", true, false, NULL), NULL, /* neox */
                     "fused gemv_rope: q, k, v, qr, kr, k_cache, v_cache\n", NULL, -1);
    if (_i < 4) /* biases: the q/k/v GEMV's epilogue */
        ts_expect_fusion(front_bias(wt, _i % 2 ? NEOX : ROPE), NULL,
                         "fused gemv_rope: n, y, q, k, v, qb, kb, vb, qr, kr, k_cache, v_cache\n", "rope_ext nodes:", -1);
}
END_TEST

/* Without mul_mat_cat (or with a v weight of another type than q and k, which it leaves apart),
 * the GEMVs after q's wait until its rope is done: each GEMV hosts its own readers. */
START_TEST(readers_gathered) {
    ts_expect_fusion(front("bf16", 64, 1, ROPE, "f16", true, true, NULL), "mul_mat_cat", "fused gemv_rope: n, y, q, qr\n",
                     "rope_ext nodes:", -1);
    ts_expect_fusion(front("bf16", 64, 1, ROPE, "f16", true, true, NULL), "mul_mat_cat", "fused gemv_rope: v, v_cache\n",
                     "set_rows nodes:", -1);
    /* Q4_K_M's layers with a q6_K attn_v: q and k joined, v apart, no rope or set_rows kernel */
    char  kg[4096];
    char *at;
    snprintf(kg, sizeof kg, "%s", front("q4_K", 256, 1, ROPE, "f16", true, true, NULL));
    ck_assert_ptr_nonnull(at = strstr(kg, "weight wv: q4_K"));
    memcpy(at + strlen("weight wv: "), "q6_K", 4);
    ts_expect_fusion(kg, NULL, "fused gemv_rope: v, v_cache\n", "rope_ext nodes:", -1);
    ts_expect_fusion(kg, NULL, "fused rms_norm_gemv+mul_mat_cat: n, y, q, k\n", "set_rows nodes:", -1);
    ts_expect_fusion(kg, NULL, "fused rms_norm_gemv: v\n", "rms_norm nodes:", -1);
}
END_TEST

START_TEST(not_fired) {
    const char *part = ", n_dims=32, mode=0, n_ctx_orig=4096, freq_base=10000";
    ts_expect_fusion(front("bf16", 64, 1, part, "f16", true, true, NULL), NULL, NULL, "gemv_rope", -1);
    ts_expect_fusion(front("bf16", 64, 2, ROPE, "f16", true, true, NULL), NULL, NULL, "gemv_rope", -1);
    ts_expect_fusion(front("bf16", 64, 1, ROPE, "f16", true, true, "output qs = sum_rows(q)\n"), NULL, NULL, "gemv_rope",
                     -1);
    ts_expect_fusion(front("bf16", 64, 1, ROPE, "f16", false, true, NULL), NULL, NULL,
                     "gemv_rope", -1);
}
END_TEST


/* y (a temporary the GEMV reads, dying there) and a temporary rope result (written by the
 * GEMV's store) must not share memory: the tails count at the host's step. */
START_TEST(memplan_group) {
    kiln_ctx   *ctx;
    kiln_graph *g;
    char        kg[4096];
    snprintf(kg, sizeof kg, "%s", front("bf16", 64, 1, ROPE, "f16", true, false, NULL));
    char *q = strstr(kg, "output qr");
    memmove(q, q + 7, strlen(q + 7) + 1); /* qr: a temporary ... */
    strcat(kg, "output o = scale(qr, 3)\n"); /* ... read later */
    ir_prog *p = ts_lowered(kg, &ctx, &g);
    int      h = ts_node_named(p, "q"), r = ts_node_named(p, "qr"), y = ts_node_named(p, "y");
    ck_assert_int_eq(p->nodes[r].host, h + 1);
    const ir_buf *qb = &p->bufs[p->nodes[r].dst.buf], *yb = &p->bufs[p->nodes[y].dst.buf];
    ck_assert_int_eq(qb->kind, IR_BUF_TEMP);
    ck_assert_int_eq(yb->kind, IR_BUF_TEMP);
    ck_assert_int_eq(qb->first, h);
    ck_assert_int_eq(yb->last, h);
    ck_assert_msg(qb->offset >= yb->offset + yb->bytes || yb->offset >= qb->offset + qb->bytes,
                  "qr [%zu, +%zu) overlaps y [%zu, +%zu)", qb->offset, qb->bytes, yb->offset, yb->bytes);
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}
END_TEST


START_TEST(verify_rejects) {
    kiln_ctx   *ctx;
    kiln_graph *g;
    ir_prog    *p = ts_lowered(front("bf16", 64, 1, ROPE, "f16", true, true, "output o = scale(qr, 3)\n"), &ctx, &g);
    int         h = ts_node_named(p, "q"), r = ts_node_named(p, "qr"), kc = ts_node_named(p, "k_cache"), o = ts_node_named(p, "o");
    int         v = ts_node_named(p, "v_cache");
    TS_OK(ir_verify(p));
    p->nodes[r].host = o + 1; /* a host that is not an earlier mul_mat */
    ts_expect_invalid(p, "is not an earlier one-column mul_mat");
    p->nodes[r].host = h + 1;
    p->nodes[kc].host = 0; /* a node with its own kernel between a host and its tail ... */
    ts_expect_invalid(p, "runs between it and its host");
    p->nodes[kc].host = h + 1;
    ir_node saved = p->nodes[o]; /* ... and a node reading the host's result */
    p->nodes[o].in[0] = p->nodes[v].in[p->nodes[v].opd[1]];
    p->nodes[o].in[0].ne[0] = p->nodes[o].dst.ne[0];
    p->nodes[o].in[0].offs = 0;
    ts_expect_invalid(p, "which only its tails may read");
    p->nodes[o] = saved;
    TS_OK(ir_verify(p));
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* The fused GEMVs compile cleanly: K 64 (teams within a warp) and K 2048 (warps meet in shared
 * memory), for sm_90a and sm_80; no rope or set_rows kernel is left. */
START_TEST(kernels_compile) {
    static const char *const needles[3] = {"tail 3: rows [384, 512)", "// kiln rope kernel", "// kiln rows kernel"};
    const char        *kg = _i == 4   ? front_bias("q8_0", NEOX)
                            : _i == 3 ? front("q4_K", 2048, 1, NEOX, "f16", true, true, NULL)
                            : _i == 2 ? front("q4_K", 2048, 1, ROPE_FF, "f16", true, true, NULL)
                            : _i == 1 ? front("bf16", 2048, 1, ROPE_FF, "bf16", true, true, NULL)
                                      : front("f16", 64, 1, ROPE, "f32", true, false, NULL);
    ts_kernels_fused(kg, g_cache, needles, 3);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_gemv_rope",
                        TS_CASE("pass", 120), TS_LOOP(0, 5, fires), TS_TESTS(readers_gathered, not_fired, memplan_group, verify_rejects),
                        TS_LOOP(0, 5, kernels_compile));
    return ts_main_cache(s, "fuse-gemv-rope", &g_cache);
}
