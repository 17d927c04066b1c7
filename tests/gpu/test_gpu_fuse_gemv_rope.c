/* GPU tests of pass gemv_rope (ir/fuse_gemv_rope.c): the decode q/k/v GEMV rotates q and k and
 * writes the k and v cache rows from its store. Each case is a one-token attention front (q, k,
 * v projections of one column, rope of q, rope of k into a cache, v into a cache, the caches read
 * back as outputs), compiled with every pass; `kiln inspect` must show the fusion, and `kiln run --check` (CUDA graph, then plain
 * launches) compares q and both caches with the CPU reference of the unfused graph. The cases
 * cover both store paths of the gemv (teams inside a warp at K 64; warps meeting in shared
 * memory at K 2048 and 4096; the quantized gemv's two), f32/f16/bf16 and q4_K/q8_0/q6_K weights,
 * f32/f16/bf16 caches, i32 and i64 ids, a v weight of another type (q4_K q and k, q6_K v: two hosts),
 * frequency factors, YaRN (ext_factor, freq_scale, attn_factor) and heads of 64, 96 and 128; rope
 * mode 0 and neox (mode 2: the GEMV computes each head's rows in pair order), and q/k/v biases
 * (qwen2, gpt-oss: the GEMV's epilogue, its values what the tails rotate and store). */
#include "tests/gpu/gpu_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    int         K, hd, hq, hkv;
    const char *wt, *ct, *it;
    bool        ff;
    const char *rope; /* extra rope parameters */
    const char *vt;   /* v's weight type, when not wt's (Q4_K_M's q6_K attn_v layers) */
    int         mode; /* rope mode: 0, or 2 (neox) */
    bool        bias; /* q, k, v biases */
} CASES[] = {
    {2048, 64, 32, 8, "bf16", "f16", "i64", true, "", NULL, 0, false},
    {64, 64, 4, 2, "f16", "bf16", "i32", false, ", freq_scale=0.5, ext_factor=1, attn_factor=1.5", NULL, 0, false},
    {4096, 128, 32, 8, "bf16", "f16", "i64", true, "", NULL, 0, false},
    {4096, 128, 8, 2, "f32", "f32", "i64", false, ", freq_scale=0.25", NULL, 0, false},
    {4096, 128, 32, 8, "q4_K", "f16", "i64", true, "", NULL, 0, false},   /* quantized gemv, warps own their rows */
    {2048, 64, 32, 8, "q8_0", "f16", "i32", false, "", NULL, 0, false},   /* quantized, warps meeting in shared memory */
    {4096, 128, 8, 2, "q6_K", "bf16", "i64", false, ", freq_scale=0.5", NULL, 0, false},
    {4096, 128, 32, 8, "q4_K", "f16", "i64", true, "", "q6_K", 0, false}, /* q and k joined, v apart: two hosts */
    {2048, 64, 32, 8, "bf16", "f16", "i64", false, "", NULL, 2, false},   /* neox */
    {64, 64, 4, 2, "f16", "bf16", "i32", false, "", NULL, 2, true},       /* neox, biases, teams in a warp */
    {3072, 96, 32, 32, "bf16", "f16", "i64", false, "", NULL, 2, false},  /* phi3: heads of 96 */
    {4096, 128, 32, 8, "q4_K", "f16", "i64", true, "", NULL, 2, true},    /* quantized, neox, biases */
    {2880, 64, 64, 8, "q8_0", "f16", "i64", false, ", freq_scale=0.03125, ext_factor=1, attn_factor=1", NULL, 2,
     true}, /* gpt-oss: YaRN, biases, K 2880 */
};

START_TEST(front) {
    char kg[4096], ffdecl[64] = "", ffarg[8] = "", label[128], bdecl[160] = "", badd[160] = "";
    int  K = CASES[_i].K, hd = CASES[_i].hd, hq = CASES[_i].hq, hkv = CASES[_i].hkv;
    need_gpu();
    if (CASES[_i].ff) {
        snprintf(ffdecl, sizeof ffdecl, "weight ff: f32[%d]\n", hd / 2);
        snprintf(ffarg, sizeof ffarg, ", ff");
    }
    if (CASES[_i].bias) {
        snprintf(bdecl, sizeof bdecl, "weight bq: f32[%d]\nweight bk: f32[%d]\nweight bv: f32[%d]\n", hd * hq, hd * hkv,
                 hd * hkv);
        snprintf(badd, sizeof badd, "qb = add(q0, bq)\nkb = add(k0, bk)\nvb = add(v0, bv)\n");
    }
    const char *q = CASES[_i].bias ? "qb" : "q0", *k = CASES[_i].bias ? "kb" : "k0", *v = CASES[_i].bias ? "vb" : "v0";
    snprintf(kg, sizeof kg,
             "input x: f32[%d, 1]\ninput pos: i32[1]\ninput kv_idxs: %s[1]\n%s%s"
             "state cache_k: %s[%d, 64]\nstate cache_v: %s[%d, 64]\n"
             "weight wq: %s[%d, %d]\nweight wk: %s[%d, %d]\nweight wv: %s[%d, %d]\n"
             "q0 = mul_mat(wq, x)\nk0 = mul_mat(wk, x)\nv0 = mul_mat(wv, x)\n%s"
             "q3 = reshape(%s, [%d, %d, 1])\nk3 = reshape(%s, [%d, %d, 1])\n"
             "output qr = rope_ext(q3, pos%s, n_dims=%d, mode=%d, n_ctx_orig=8192, freq_base=500000%s)\n"
             "kr = rope_ext(k3, pos%s, n_dims=%d, mode=%d, n_ctx_orig=8192, freq_base=500000%s)\n"
             "k_row = reshape(kr, [%d, 1])\n"
             "k_cache = set_rows(cache_k, k_row, kv_idxs)\nv_cache = set_rows(cache_v, %s, kv_idxs)\n"
             "output kc = cont(k_cache)\noutput vc = cont(v_cache)\n",
             K, CASES[_i].it, ffdecl, bdecl, CASES[_i].ct, hd * hkv, CASES[_i].ct, hd * hkv, CASES[_i].wt, K, hd * hq,
             CASES[_i].wt, K, hd * hkv, CASES[_i].vt ? CASES[_i].vt : CASES[_i].wt, K, hd * hkv, badd, q, hd, hq, k, hd, hkv,
             ffarg, hd, CASES[_i].mode, CASES[_i].rope, ffarg, hd, CASES[_i].mode, CASES[_i].rope, hd * hkv, v);
    snprintf(label, sizeof label, "gemv_rope K %d head %d %s weights (v %s), %s cache, mode %d%s", K, hd, CASES[_i].wt,
             CASES[_i].vt ? CASES[_i].vt : CASES[_i].wt, CASES[_i].ct, CASES[_i].mode, CASES[_i].bias ? ", biases" : "");

    const char *want[2] = {CASES[_i].vt     ? "fused gemv_rope: v0, v_cache"
                           : CASES[_i].bias ? "fused gemv_rope: q0, k0, v0, qb, kb, vb, qr, kr, k_cache, v_cache"
                                            : "fused gemv_rope: q0, k0, v0, qr, kr, k_cache, v_cache",
                           NULL};
    const char *absent[3] = {"set_rows nodes:", "rope_ext nodes:", NULL};
    fused_run_check(kg, want, absent, label);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_gemv_rope",
                        TS_CASE("front", 600), TS_LOOP(0, (int)(sizeof CASES / sizeof CASES[0]), front));
    return ts_main_cache(s, "gpu-fuse-gemv-rope", &g_cache_dir);
}
