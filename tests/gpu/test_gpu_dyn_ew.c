/* Symbolic dims in the elementwise, norm, reduce and fill templates on the GPU: each symbolic
 * graph of tests/test_dyn_ew.c run at several values (1, a middle value, the maximum) with
 * `kiln run --dim NAME=V --check` (the CPU reference of the graph bound to V), with the CUDA graph
 * and with plain launches; then rms_norm+mul [4096, n_tokens <= 512] and an elementwise swiglu
 * (f16 halves of [28672, n_tokens <= 512]) timed at n = 1, 64, 512 against the static graphs of
 * the same n (printed, not asserted). */
#include "tests/gpu/gpu_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *kg, *dim;
    int         vals[3];
} gcase;

static const gcase CASES[] = {
    {"dim n <= 512\ninput x: f32[8192, n]\noutput y = swiglu(x)\n", "n", {1, 300, 512}},
    {"dim n <= 512\ninput g: f16[4096, n]\ninput u: f16[4096, n]\nt = silu(g)\noutput y = mul(t, u)\n", "n", {1, 77, 512}},
    {"dim n <= 64\ninput a: bf16[4096, n]\nweight b: bf16[4096, 1]\noutput y = add(a, b)\n", "n", {1, 33, 64}},
    {"dim n <= 300\ninput a: f32[64, n]\nt = transpose(a)\noutput y = cont(t)\n", "n", {1, 7, 300}},
    {"dim n <= 512\ninput a: f32[4096, n]\noutput y = cast(a, f16)\n", "n", {1, 100, 512}},
    {"dim n <= 128\ninput a: f32[64, 1]\ninput b: f32[64, n]\noutput y = repeat(a, b)\n", "n", {1, 100, 128}},
    {"dim n <= 512\ninput x: f32[4096, n]\nweight w: f32[4096]\nh = rms_norm(x, 1e-6)\noutput y = mul(h, w)\n", "n",
     {1, 200, 512}},
    {"dim n <= 64\ninput x: f16[128, 8, n]\noutput y = norm(x, 1e-5)\n", "n", {1, 33, 64}},
    {"dim n <= 64\ninput x: f32[2048, n, 3]\noutput y = l2_norm(x, 1e-6)\n", "n", {1, 50, 64}},
    {"dim n <= 4\ninput x: f32[16, 16, 32, n]\noutput y = group_norm(x, 8, 1e-6)\n", "n", {1, 3, 4}},
    {"dim n <= 512\ninput x: f32[4096, n]\noutput y = sum_rows(x)\n", "n", {1, 100, 512}},
    {"dim n <= 4096\ninput x: f16[n, 8]\noutput y = mean(x)\n", "n", {1, 1000, 4096}},
    {"dim n <= 64\ninput x: f32[1000, n]\noutput y = argmax(x)\n", "n", {1, 20, 64}},
    {"dim n <= 3000\ninput x: f32[n, 3]\noutput y = cumsum(x)\n", "n", {1, 1025, 3000}},
    {"dim n <= 512\ninput x: f32[4096, n]\noutput y = sum(x)\n", "n", {1, 256, 512}},
    {"dim n <= 512\ninput x: f16[4096, n]\noutput y = fill(x, 1.5)\n", "n", {1, 10, 512}},
    {"dim n_kv <= 512\ninput x: f32[n_kv, 16]\nm = diag_mask_inf(x, 3)\noutput y = exp(m)\n", "n_kv", {1, 400, 512}},
    {"dim n <= 8\ninput x: f32[64, 64, n]\noutput y = tri(x, lower)\n", "n", {1, 5, 8}},
};
/* Case 16 takes exp of the mask: --check's NMSE of -inf outputs is NaN (fails), exp(-inf) = 0. */
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

START_TEST(runs_match_reference) {
    run_case_at_values("dyn_ew", _i, CASES[_i].kg, CASES[_i].dim, CASES[_i].vals);
}
END_TEST


/* %d in the static text is n; the symbolic text has n_tokens <= 512. */
static const struct {
    const char *what, *sym, *stat;
} BENCH[] = {
    {"rms_norm+mul f32 [4096, n]",
     "dim n_tokens <= 512\ninput x: f32[4096, n_tokens]\nweight w: f32[4096]\nh = rms_norm(x, 1e-6)\noutput y = mul(h, w)\n",
     "input x: f32[4096, %d]\nweight w: f32[4096]\nh = rms_norm(x, 1e-6)\noutput y = mul(h, w)\n"},
    {"swiglu f16 halves of [28672, n]", "dim n_tokens <= 512\ninput x: f16[28672, n_tokens]\noutput y = swiglu(x)\n",
     "input x: f16[28672, %d]\noutput y = swiglu(x)\n"},
};

START_TEST(bench_dyn) {
    need_gpu();
    char *dir = ts_tmpdir();
    static const int ns[3] = {1, 64, 512};
    for (int b = 0; b < 2; b++) {
        char *sym = write_kg(dir, "sym", BENCH[b].sym);
        for (int i = 0; i < 3; i++) {
            char kg[512];
            snprintf(kg, sizeof kg, BENCH[b].stat, ns[i]);
            char  *st = write_kg(dir, "static", kg);
            double t_static = run_median_ms(st, "--iters 500");
            double t_dyn = run_median_ms(sym, "--dim n_tokens=%d --iters 500", ns[i]);
            printf("bench %s n=%d: static %.4f ms, symbolic (n_tokens <= 512) %.4f ms\n", BENCH[b].what, ns[i], t_static,
                   t_dyn);
            ck_assert_msg(t_static > 0 && t_dyn > 0, "%s n=%d: a run failed", BENCH[b].what, ns[i]);
            free(st);
        }
        free(sym);
    }
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_dyn_ew",
                        TS_CASE("all", 900), TS_LOOP(0, NCASES, runs_match_reference), TS_TESTS(bench_dyn));
    return ts_main_cache(s, "gpu-dyn-ew", &g_cache_dir);
}
