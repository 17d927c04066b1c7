/* Pass head_rope (ir/fuse_head_rope.c): the per-head nodes of one token after a q/k/v product
 * that no GEMV store takes (Qwen3's and Gemma 3's q/k norms, the ropes after them, the k and v
 * cache rows) become one kernel (templates/heads.lua). It fires for mode 0 and neox ropes, with
 * frequency factors, for f32/f16/bf16 caches, with a node between the members that moves after
 * them (Gemma 3's scale of q) and beside gemv_rope (a v GEMV of another type hosting its own
 * cache row) and with the elementwise node after q's rope inside the run (Gemma 3's scale, when
 * only it reads the rope); it leaves out a norm read twice or one whose rope sits past a node that cannot
 * move, and the graph alone for two tokens or a partial rope; the CPU reference gives the same bits (the IR still says
 * what each node computes); the verifier rejects a norm's result read outside its run; the
 * kernels compile with NVRTC for sm_90a and sm_80 without warnings, and no norm, rope or rows
 * kernel is left. No GPU. */
#include "tests/support.h"

#include "codegen/codegen.h"
#include "ir/ir_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

/* One token's attention front with q/k norms (Qwen3): heads of hd, 4 q heads, kv kv heads,
 * weights of type wt (v: vt), caches of ct, `tokens` tokens; `rope` is the rope's text after
 * its positions, `between` goes between the norms and the ropes, `extra` at the end; q's rope
 * is the output qr unless `qout` names another. */
static char *front(int hd, int kv, const char *wt, const char *vt, const char *ct, int tokens, const char *rope,
                   const char *between, const char *extra) {
    static char kg[4096];
    int         K = !strcmp(wt, "q4_K") ? 256 : 64;
    snprintf(kg, sizeof kg,
             "input x: f32[%d, %d]\ninput pos: i32[%d]\ninput idx: i64[%d]\nweight ff: f32[%d]\n"
             "weight qw: f32[%d]\nweight kw: f32[%d]\n"
             "state cache_k: %s[%d, 16]\nstate cache_v: %s[%d, 16]\n"
             "weight wq: %s[%d, %d]\nweight wk: %s[%d, %d]\nweight wv: %s[%d, %d]\n"
             "q = mul_mat(wq, x)\nk = mul_mat(wk, x)\nv = mul_mat(wv, x)\n"
             "q3 = reshape(q, [%d, 4, %d])\nk3 = reshape(k, [%d, %d, %d])\n"
             "qn = rms_norm(q3, 1e-06)\nqm = mul(qn, qw)\nkn = rms_norm(k3, 1e-06)\nkm = mul(kn, kw)\n%s"
             "output qr = rope_ext(qm, pos%s)\nkr = rope_ext(km, pos%s)\n"
             "k_row = reshape(kr, [%d, %d])\n"
             "k_cache = set_rows(cache_k, k_row, idx)\nv_cache = set_rows(cache_v, v, idx)\n"
             "output kc = cont(k_cache)\noutput vc = cont(v_cache)\n%s",
             K, tokens, tokens, tokens, hd / 2, hd, hd, ct, hd * kv, ct, hd * kv, wt, K, 4 * hd, wt, K, hd * kv,
             vt ? vt : wt, K, hd * kv, hd, tokens, hd, kv, tokens, between ? between : "", rope, rope, hd * kv, tokens,
             extra ? extra : "");
    return kg;
}

static const char *const NEOX = ", n_dims=64, mode=2, n_ctx_orig=4096, freq_base=1000000";
static const char *const ROPE_FF = ", ff, n_dims=64, mode=0, n_ctx_orig=4096, freq_base=10000, ext_factor=1, freq_scale=0.5";
static const char *const ALL = "fused head_rope: qn, qm, kn, km, qr, kr, k_cache, v_cache\n";

/* Gemma 3: q's rope read only by its scale, which attention reads: the scale joins the run */
static char *gemma_front(void) {
    static char kg[4096];
    snprintf(kg, sizeof kg, "%s", front(64, 2, "bf16", NULL, "f16", 1, NEOX, NULL, "output qs = scale(qr, 0.125)\n"));
    char *at = strstr(kg, "output qr = ");
    ck_assert_ptr_nonnull(at);
    memmove(at, at + 7, strlen(at + 7) + 1); /* qr: a temporary */
    return kg;
}

START_TEST(fires) {
    static const char *cts[3] = {"f16", "bf16", "f32"};
    ts_expect_fusion(front(64, 2, "bf16", NULL, cts[_i], 1, NEOX, NULL, NULL), NULL, ALL, "rope_ext nodes:", -1);
    ts_expect_fusion(front(64, 2, "f16", NULL, cts[_i], 1, ROPE_FF, NULL, NULL), NULL, ALL, "set_rows nodes:", -1);
    if (_i == 0)
        ts_expect_fusion(gemma_front(), NULL, "fused head_rope: qn, qm, kn, km, qr, kr, k_cache, v_cache, qs\n",
                         " ew nodes: qs", -1);
    /* v rows of 3 * 128 = 384: a piece of 256 elements and one of 128 */
    ts_expect_fusion(front(128, 3, "bf16", NULL, cts[_i], 1,
                           ", n_dims=128, mode=2, n_ctx_orig=4096, freq_base=1000000", NULL, NULL),
                     NULL, ALL, "rms_norm nodes:", -1);
}
END_TEST

/* Gemma 3 scales q after its rope, between the ropes: the scale waits until after the run. A v
 * weight of another type (Q4_K_M's q6_K attn_v) gets its own GEMV, which hosts v's cache row
 * (gemv_rope); the norms and ropes of q and k form the run. */
START_TEST(around_others) {
    char kg[4096], *at;
    snprintf(kg, sizeof kg, "%s", front(64, 2, "bf16", NULL, "f16", 1, NEOX, NULL, "output qs = scale(qr, 0.125)\n"));
    ck_assert_ptr_nonnull(at = strstr(kg, "kr = rope_ext"));
    const char *scale = "qs2 = scale(qr, 0.5)\n";
    memmove(at + strlen(scale), at, strlen(at) + 1);
    memcpy(at, scale, strlen(scale));
    strcat(kg, "output o2 = cont(qs2)\n");
    ts_expect_fusion(kg, NULL, ALL, "rope_ext nodes:", -1);
    snprintf(kg, sizeof kg, "%s", front(256, 2, "q4_K", "q6_K", "f16", 1, ", n_dims=256, mode=2, n_ctx_orig=4096, freq_base=1000000", NULL, NULL));
    ts_expect_fusion(kg, NULL, "fused head_rope: qn, qm, kn, km, qr, kr, k_cache\n", "rope_ext nodes:", -1);
    ts_expect_fusion(kg, NULL, "fused gemv_rope: v, v_cache\n", "set_rows nodes:", -1);
}
END_TEST

START_TEST(not_fired) {
    /* two tokens */
    ts_expect_fusion(front(64, 2, "bf16", NULL, "f16", 2, NEOX, NULL, NULL), NULL, NULL, "head_rope", -1);
    /* a partial rope: q and k stay apart, v's cache row is left alone (gemv_rope cannot take it either) */
    const char *part = ", n_dims=32, mode=2, n_ctx_orig=4096, freq_base=1000000";
    ts_expect_fusion(front(64, 2, "bf16", NULL, "f16", 1, part, NULL, NULL), NULL, NULL, "head_rope: qn", -1);
    /* q's norm read twice: q's norm keeps its kernel; k's norm leads a run with q's rope */
    ts_expect_fusion(front(64, 2, "bf16", NULL, "f16", 1, NEOX, NULL, "output s = sum_rows(qm)\n"), NULL,
                     "fused head_rope: kn, km, qr, kr, k_cache, v_cache\n", "head_rope: qn", -1);
    /* a node between that q's rope reads cannot move after it: k's norm stays apart too (its
     * rope would be past that node), q's rope leads */
    char kg[4096], *at;
    snprintf(kg, sizeof kg, "%s", front(64, 2, "bf16", NULL, "f16", 1, NEOX, "qs = scale(qm, 2)\n", NULL));
    ck_assert_ptr_nonnull(at = strstr(kg, "rope_ext(qm,"));
    at[10] = 's';
    ts_expect_fusion(kg, NULL, "fused head_rope: qr, kr, k_cache, v_cache\n", "head_rope: kn", -1);
}
END_TEST



/* The run's first node hosts the others; a norm's result (never stored by the kernel) read by a
 * node outside the run, a member that no run computes, a host that is no member: rejected. */
START_TEST(verify_rejects) {
    kiln_ctx   *ctx;
    kiln_graph *g;
    ir_prog    *p = ts_lowered(front(64, 2, "bf16", NULL, "f16", 1, NEOX, NULL, "output o = scale(qr, 3)\n"), &ctx, &g);
    int         h = ts_node_named(p, "qn"), kn = ts_node_named(p, "kn"), kr = ts_node_named(p, "kr"), o = ts_node_named(p, "o");
    TS_OK(ir_verify(p));
    for (int i = h + 1; i <= ts_node_named(p, "v_cache"); i++)
        if (!p->nodes[i].dead) ck_assert_int_eq(p->nodes[i].host, h + 1);
    ir_node saved = p->nodes[o];
    p->nodes[o].in[0] = p->nodes[kr].in[p->nodes[kr].opd[0]]; /* o reads k's norm */
    ts_expect_invalid(p, "which only its tails may read");
    p->nodes[o] = saved;
    p->nodes[kn].host = o + 1; /* a host that is no member and no GEMV */
    ts_expect_invalid(p, "is not an earlier one-column mul_mat or head_rope run");
    p->nodes[kn].host = h + 1;
    TS_OK(ir_verify(p));
    ir_prog_free(p);
    ts_graph_free(g, ctx);
    /* Gemma 3's run: q's rope (its result not stored: the scale in the run reads it) read outside */
    char kg[4096];
    snprintf(kg, sizeof kg, "%s", gemma_front());
    strcat(kg, "output o = scale(kc, 3)\n");
    p = ts_lowered(kg, &ctx, &g);
    int qs = ts_node_named(p, "qs"), qr = ts_node_named(p, "qr");
    o = ts_node_named(p, "o");
    ck_assert_int_eq(p->nodes[qs].host, ts_node_named(p, "qn") + 1);
    TS_OK(ir_verify(p));
    saved = p->nodes[o];
    p->nodes[o].in[0] = p->nodes[qr].dst;
    p->nodes[o].dst.ne[0] = p->nodes[qr].dst.ne[0], p->nodes[o].dst.ne[1] = p->nodes[qr].dst.ne[1];
    ts_expect_invalid(p, "which only its tails may read");
    p->nodes[o] = saved;
    TS_OK(ir_verify(p));
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* The heads kernels compile cleanly: heads of 64 and 128, neox and mode 0 with frequency
 * factors and YaRN, a q scale waiting, a partial piece of a v row, quantized GEMVs before;
 * for sm_90a and sm_80. No norm, rope or rows kernel is left. */
START_TEST(kernels_compile) {
    static const char *const needles[4] = {"// kiln heads kernel", "// kiln rope kernel", "// kiln rows kernel",
                                           "// kiln norm kernel"};
    const char *kg = _i == 4   ? gemma_front()
                     : _i == 0 ? front(64, 2, "bf16", NULL, "f16", 1, NEOX, NULL, NULL)
                     : _i == 1 ? front(64, 2, "f16", NULL, "bf16", 1, ROPE_FF, NULL, "output qs = scale(qr, 0.125)\n")
                     : _i == 2 ? front(128, 3, "bf16", NULL, "f32", 1, ", n_dims=128, mode=2, n_ctx_orig=4096, freq_base=1000000", NULL, NULL)
                               : front(256, 2, "q4_K", "q6_K", "f16", 1, ", n_dims=256, mode=2, n_ctx_orig=4096, freq_base=1000000", NULL, NULL);
    ts_kernels_fused(kg, g_cache, needles, 4);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_head_rope", TS_CASE("pass", 120), TS_LOOP(0, 3, fires),
                        TS_TESTS(around_others, not_fired, verify_rejects), TS_LOOP(0, 5, kernels_compile));
    return ts_main_cache(s, "fuse-head-rope", &g_cache);
}
