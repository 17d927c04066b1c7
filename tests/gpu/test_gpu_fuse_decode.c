/* GPU tests of passes mul_mat_cat and rms_norm_gemv (the decode-step fusions).
 * - mul_mat_cat: the attention front of a Llama layer (q, k, v projections of one input, then
 *   rope, rope into a cache, v into a cache) with a run-time token count, run with `kiln run
 *   --dim n_tokens=V --check` at 1, 16 and 512 tokens — the GEMV, tile and cuBLAS plans over the
 *   weight block, their strided readers — against the CPU reference of the unfused graph, with
 *   the CUDA graph and with plain launches; per weight type (bf16, f16, f32).
 * - rms_norm_gemv: rms_norm * w into a one-column GEMV (plain, q/k/v, GLU pair, residual
 *   epilogue) at K 2048 and 4096 (teams of 64 and 128 threads meeting in shared memory) and
 *   K 64 (teams inside a warp), fused and unfused against the CPU reference. */
#include "tests/gpu/gpu_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(qkv_attention_front) {
    static const char *types[3] = {"bf16", "f16", "f32"};
    static const int   vals[3] = {1, 16, 512};
    const char        *t = types[_i];
    char               kg[2048], label[64];
    need_gpu();
    snprintf(kg, sizeof kg,
             "dim n_tokens <= 512\n"
             "input x: f32[1024, n_tokens]\ninput pos: i32[n_tokens]\ninput kv_idxs: i64[n_tokens]\n"
             "state cache_k: f16[256, 1024]\nstate cache_v: f16[256, 1024]\n"
             "weight wq: %s[1024, 1024]\nweight wk: %s[1024, 256]\nweight wv: %s[1024, 256]\n"
             "q = mul_mat(wq, x)\nk = mul_mat(wk, x)\nv = mul_mat(wv, x)\n"
             "q3 = reshape(q, [64, 16, n_tokens])\nk3 = reshape(k, [64, 4, n_tokens])\n"
             "output qr = rope_ext(q3, pos, n_dims=64, mode=0, n_ctx_orig=131072, freq_base=500000)\n"
             "kr = rope_ext(k3, pos, n_dims=64, mode=0, n_ctx_orig=131072, freq_base=500000)\n"
             "k_row = reshape(kr, [256, n_tokens])\n"
             "k_cache = set_rows(cache_k, k_row, kv_idxs)\nv_cache = set_rows(cache_v, v, kv_idxs)\n",
             t, t, t);
    snprintf(label, sizeof label, "mul_mat_cat q/k/v %s", t);
    run_check_at_values(kg, "n_tokens", vals, 3, label);
}
END_TEST

START_TEST(norm_into_gemv) {
    static const int   KS[3] = {2048, 4096, 64};
    static const char *uses[4] = {
        "output q = mul_mat(wq, y)\n",
        "q = mul_mat(wq, y)\nk = mul_mat(wk, y)\nv = mul_mat(wv, y)\noutput oq = scale(q, 0.5)\noutput ok = scale(k, 2)\n"
        "output ov = scale(v, 0.25)\n",
        "g = mul_mat(wg, y)\nu = mul_mat(wu, y)\noutput a = swiglu(g, u)\n",
        "q = mul_mat(wq, y)\noutput o = add(q, x2)\n",
    };
    int  K = KS[_i % 3];
    char kg[2048], what[96];
    need_gpu();
    for (int u = 0; u < 4; u++) {
        snprintf(kg, sizeof kg,
                 "weight nw: f32[%d]\nweight wq: bf16[%d, 1024]\nweight wk: bf16[%d, 1024]\nweight wv: bf16[%d, 1024]\n"
                 "weight wg: bf16[%d, 2048]\nweight wu: bf16[%d, 2048]\ninput x: f32[%d]\ninput x2: f32[1024]\n"
                 "n = rms_norm(x, 1e-05)\ny = mul(n, nw)\n%s",
                 K, K, K, K, K, K, K, uses[u]);
        snprintf(what, sizeof what, "rms_norm_gemv K %d use %d", K, u);
        check_kg_fused(kg, what, 5e-4, 500 + (uint64_t)(_i * 4 + u));
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_decode",
                        TS_CASE("mul_mat_cat", 900), TS_LOOP(0, 3, qkv_attention_front),
                        TS_CASE("rms_norm_gemv", 900), TS_LOOP(0, 3, norm_into_gemv));
    return ts_main_cache(s, "gpu-fuse-decode", &g_cache_dir);
}
