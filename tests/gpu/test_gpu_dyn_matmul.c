/* Symbolic dims in mul_mat / mul_mat_id on the GPU: each symbolic graph of tests/test_dyn_matmul.c
 * run at several values (1, a middle value, the maximum) with `kiln run --dim NAME=V --check`
 * (the CPU reference of the graph bound to V), with the CUDA graph and with plain launches; then
 * the prefill GEMM (bf16 4096x4096, n_tokens <= 512) timed at n = 7, 128, 512 against the static
 * graph of the same n (printed, not asserted). */
#include "tests/gpu/gpu_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *kg, *dim;
    int         vals[3];
} gcase;

static const gcase CASES[] = {
    /* quantized weights: the quantized tensor-core tile up to 64 columns (every type but mxfp4),
     * the dequantization + cuBLAS above */
    {"dim n_tokens <= 512\nweight a: q4_K[4096, 1024]\ninput b: f32[4096, n_tokens]\noutput y = mul_mat(a, b)\n", "n_tokens",
     {1, 64, 300}},
    {"dim n_tokens <= 64\nweight a: q4_K[14336, 200]\ninput b: f32[14336, n_tokens]\noutput y = mul_mat(a, b)\n", "n_tokens",
     {2, 17, 63}},
    {"dim n_tokens <= 100\nweight g: q4_K[256, 1024]\nweight u: q4_K[256, 1024]\ninput x: f32[256, n_tokens]\n"
     "gg = mul_mat(g, x)\nuu = mul_mat(u, x)\noutput y = swiglu(gg, uu)\n",
     "n_tokens", {1, 17, 100}},
    {"dim n <= 128\nweight a: q6_K[512, 768]\ninput b: f32[512, n]\ninput r: f32[768, n]\nm = mul_mat(a, b)\noutput y = add(m, r)\n",
     "n", {5, 64, 128}},
    {"dim n <= 80\nweight a: q8_0[1024, 300]\ninput b: f32[1024, n]\noutput y = mul_mat(a, b)\n", "n", {2, 33, 80}},
    {"dim n_tokens <= 512\nweight a: bf16[4096, 4096]\ninput b: f32[4096, n_tokens]\noutput y = mul_mat(a, b)\n", "n_tokens",
     {1, 77, 512}},
    {"dim n <= 12\nweight a: bf16[256, 300]\ninput b: f32[256, n]\noutput y = mul_mat(a, b)\n", "n", {1, 5, 12}},
    {"dim n <= 9\nweight a: f32[100, 37]\ninput b: f32[n, 100]\nbt = transpose(b)\noutput y = mul_mat(a, bt)\n", "n",
     {1, 4, 9}},
    {"dim n_tokens <= 64\nweight a: bf16[256, 1024]\ninput b: f32[256, n_tokens]\ninput r: f32[1024, n_tokens]\n"
     "m = mul_mat(a, b)\noutput y = add(m, r)\n",
     "n_tokens", {1, 33, 64}},
    {"dim n_tokens <= 40\nweight g: bf16[256, 1024]\nweight u: bf16[256, 1024]\ninput x: f32[256, n_tokens]\n"
     "gg = mul_mat(g, x)\nuu = mul_mat(u, x)\noutput y = swiglu(gg, uu)\n",
     "n_tokens", {1, 17, 40}},
    {"dim n_kv <= 256\ninput k: f16[64, n_kv, 8]\ninput q: f32[64, 16, 32]\noutput y = mul_mat(k, q)\n", "n_kv",
     {1, 130, 256}},
    {"dim n_tokens <= 16\ninput k: f16[64, 200, 8]\ninput q: f32[64, n_tokens, 32]\noutput y = mul_mat(k, q)\n", "n_tokens",
     {1, 7, 16}},
    {"dim n_kv <= 256\ninput v: f16[n_kv, 64, 8]\ninput kq: f32[n_kv, 16, 32]\noutput y = mul_mat(v, kq)\n", "n_kv",
     {1, 77, 256}},
    {"dim n_kv <= 256\ninput v: f32[n_kv, 64, 8]\ninput kq: f32[n_kv, 5, 32]\noutput y = mul_mat(v, kq)\n", "n_kv",
     {1, 99, 256}},
    /* a long symbolic K: several chunks of b, the loop bounded by the run-time K */
    {"dim n_kv <= 4096\ninput v: f16[n_kv, 64, 8]\ninput kq: f32[n_kv, 16, 32]\noutput y = mul_mat(v, kq)\n", "n_kv",
     {1, 3001, 4096}},
    {"dim n_kv <= 256\ninput k: bf16[64, n_kv, 8]\ninput q: f32[64, 1, 32]\noutput y = mul_mat(k, q)\n", "n_kv", {1, 100, 256}},
    {"dim m <= 200\ninput a: bf16[256, m]\ninput b: f32[256]\ninput r: f32[m]\nx = mul_mat(a, b)\noutput y = add(x, r)\n", "m",
     {1, 101, 200}},
    {"dim n_kv <= 200\ninput a: f32[n_kv, 64]\ninput b: f32[n_kv]\noutput y = mul_mat(a, b)\n", "n_kv", {1, 61, 200}},
    {"dim nb <= 24\nweight a: f16[64, 100]\ninput b: f32[64, 7, nb]\noutput y = mul_mat(a, b)\n", "nb", {1, 13, 24}},
    {"dim nb <= 24\ninput a: f32[64, 100, nb]\ninput b: f32[64, 7, nb]\noutput y = mul_mat(a, b)\n", "nb", {1, 11, 24}},
    {"dim n_tokens <= 40\nweight w: bf16[256, 128, 16]\ninput x: f32[256, 1, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "input r: f32[128, 4, n_tokens]\nm = mul_mat_id(w, x, ids)\noutput y = add(m, r)\n",
     "n_tokens", {1, 9, 40}},
    {"dim n_tokens <= 40\nweight w: f32[256, 128, 16]\ninput x: f32[256, 2, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "output y = mul_mat_id(w, x, ids)\n",
     "n_tokens", {1, 23, 40}},
    {"dim n_tokens <= 4\nweight w: bf16[256, 128, 16]\ninput x: f32[256, 4, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "output y = mul_mat_id(w, x, ids)\n",
     "n_tokens", {1, 3, 4}},
    {"dim n_tokens <= 40\nweight g: bf16[256, 128, 16]\nweight u: bf16[256, 128, 16]\ninput x: f32[256, 1, n_tokens]\n"
     "input ids: i32[4, n_tokens]\ngg = mul_mat_id(g, x, ids)\nuu = mul_mat_id(u, x, ids)\noutput y = swiglu(gg, uu)\n",
     "n_tokens", {1, 20, 40}},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

START_TEST(runs_match_reference) {
    run_case_at_values("dyn_matmul", _i, CASES[_i].kg, CASES[_i].dim, CASES[_i].vals);
}
END_TEST


START_TEST(bench_prefill_gemm) {
    need_gpu();
    char *dir = ts_tmpdir();
    char *sym = write_kg(dir, "sym", CASES[0].kg);
    static const int ns[3] = {7, 128, 512};
    for (int i = 0; i < 3; i++) {
        char kg[256];
        snprintf(kg, sizeof kg, "weight a: bf16[4096, 4096]\ninput b: f32[4096, %d]\noutput y = mul_mat(a, b)\n", ns[i]);
        char  *st = write_kg(dir, "static", kg);
        double t_static = run_median_ms(st, "--iters 200");
        double t_dyn = run_median_ms(sym, "--dim n_tokens=%d --iters 200", ns[i]);
        double t_plain = run_median_ms(sym, "--dim n_tokens=%d --iters 200 --no-cuda-graph", ns[i]);
        printf("bench prefill GEMM bf16 4096x4096 n=%d: static %.4f ms, symbolic (n_tokens <= 512) %.4f ms, "
               "symbolic plain launches %.4f ms\n",
               ns[i], t_static, t_dyn, t_plain);
        ck_assert_msg(t_static > 0 && t_dyn > 0, "n=%d: a run failed", ns[i]);
        free(st);
    }
    free(sym);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    /* bench is a case of its own: CK_RUN_CASE=bench runs only the timing */
    Suite *s = TS_SUITE("gpu_dyn_matmul",
                        TS_CASE("all", 900), TS_LOOP(0, NCASES, runs_match_reference),
                        TS_CASE("bench", 900), TS_TESTS(bench_prefill_gemm));
    return ts_main_cache(s, "gpu-dyn-matmul", &g_cache_dir);
}
