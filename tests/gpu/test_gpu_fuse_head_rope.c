/* GPU tests of pass head_rope (ir/fuse_head_rope.c, templates/heads.lua): the per-head nodes of
 * one token after a q/k/v product (q and k norms with their weights, the ropes, the k and v cache
 * rows) computed by one kernel, a warp per head. Each case is a one-token attention front as
 * Qwen3 and Gemma 3 build it, compiled with every pass; `kiln inspect` must show the run and no
 * norm, rope or rows kernel, and `kiln run --check` (CUDA graph, then plain launches) compares q
 * and both caches with the CPU reference of the unfused graph. The cases cover heads of 64, 128
 * and 256, neox and mode 0 ropes, frequency factors and YaRN, f32/f16/bf16 caches, i32 and i64
 * ids, v rows of one, three and four pieces (192, 768, 1024 elements: a piece is 256), the scale
 * of q after its rope computed in the run (Gemma 3: q's rope a temporary only the scale reads),
 * and q4_K q/k with a q6_K v whose GEMV writes v's cache row itself (gemv_rope). */
#include "tests/gpu/gpu_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    int         K, hd, hq, hkv;
    const char *wt, *vt, *ct, *it;
    int         mode;
    const char *rope;  /* extra rope parameters (", ff" first for frequency factors) */
    bool        scale; /* q scaled after its rope, between the ropes (Gemma 3) */
} CASES[] = {
    {2048, 128, 32, 4, "bf16", NULL, "f16", "i64", 2, "", false},                       /* Qwen3-30B-A3B */
    {1024, 64, 8, 3, "bf16", NULL, "bf16", "i32", 0, ", ff, ext_factor=1, freq_scale=0.5, attn_factor=1.5", false},
    {2560, 256, 8, 4, "bf16", NULL, "f32", "i64", 2, "", true},                         /* Gemma 3 4B */
    {2048, 128, 16, 6, "q4_K", "q6_K", "f16", "i64", 2, ", freq_scale=0.25", false},    /* Q4_K_M */
};

START_TEST(front) {
    char kg[4096], ffdecl[64] = "", label[160], between[64] = "";
    int  K = CASES[_i].K, hd = CASES[_i].hd, hq = CASES[_i].hq, hkv = CASES[_i].hkv;
    need_gpu();
    if (strstr(CASES[_i].rope, ", ff")) snprintf(ffdecl, sizeof ffdecl, "weight ff: f32[%d]\n", hd / 2);
    if (CASES[_i].scale) snprintf(between, sizeof between, "output qs = scale(qr, 0.0625)\n");
    snprintf(kg, sizeof kg,
             "input x: f32[%d, 1]\ninput pos: i32[1]\ninput kv_idxs: %s[1]\n%s"
             "weight qw: f32[%d]\nweight kw: f32[%d]\n"
             "state cache_k: %s[%d, 64]\nstate cache_v: %s[%d, 64]\n"
             "weight wq: %s[%d, %d]\nweight wk: %s[%d, %d]\nweight wv: %s[%d, %d]\n"
             "q0 = mul_mat(wq, x)\nk0 = mul_mat(wk, x)\nv0 = mul_mat(wv, x)\n"
             "q3 = reshape(q0, [%d, %d, 1])\nk3 = reshape(k0, [%d, %d, 1])\n"
             "qn = rms_norm(q3, 1e-06)\nqm = mul(qn, qw)\nkn = rms_norm(k3, 1e-06)\nkm = mul(kn, kw)\n"
             "%sqr = rope_ext(qm, pos%s, n_dims=%d, mode=%d, n_ctx_orig=8192, freq_base=1000000)\n%s"
             "kr = rope_ext(km, pos%s, n_dims=%d, mode=%d, n_ctx_orig=8192, freq_base=1000000)\n"
             "k_row = reshape(kr, [%d, 1])\n"
             "k_cache = set_rows(cache_k, k_row, kv_idxs)\nv_cache = set_rows(cache_v, v0, kv_idxs)\n"
             "output kc = cont(k_cache)\noutput vc = cont(v_cache)\n",
             K, CASES[_i].it, ffdecl, hd, hd, CASES[_i].ct, hd * hkv, CASES[_i].ct, hd * hkv, CASES[_i].wt, K, hd * hq,
             CASES[_i].wt, K, hd * hkv, CASES[_i].vt ? CASES[_i].vt : CASES[_i].wt, K, hd * hkv, hd, hq, hd, hkv,
             CASES[_i].scale ? "" : "output ", CASES[_i].rope, hd, CASES[_i].mode, between, CASES[_i].rope, hd,
             CASES[_i].mode, hd * hkv);
    snprintf(label, sizeof label, "head_rope K %d heads %d x %d/%d %s weights, %s cache, mode %d%s", K, hd, hq, hkv,
             CASES[_i].wt, CASES[_i].ct, CASES[_i].mode, CASES[_i].scale ? ", q scaled" : "");

    const char *want[3] = {CASES[_i].vt      ? "fused head_rope: qn, qm, kn, km, qr, kr, k_cache\n"
                           : CASES[_i].scale ? "fused head_rope: qn, qm, kn, km, qr, qs, kr, k_cache, v_cache\n"
                                             : "fused head_rope: qn, qm, kn, km, qr, kr, k_cache, v_cache\n",
                           CASES[_i].vt ? "fused gemv_rope: v0, v_cache\n" : NULL, NULL};
    const char *absent[5] = {"set_rows nodes:", "rope_ext nodes:", "rms_norm nodes:", " ew nodes: qs", NULL};
    fused_run_check(kg, want, absent, label);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_head_rope",
                        TS_CASE("front", 600), TS_LOOP(0, (int)(sizeof CASES / sizeof CASES[0]), front));
    return ts_main_cache(s, "gpu-fuse-head-rope", &g_cache_dir);
}
