/* GPU tests of pass add_chain: each graph compiled fused and unfused (--no-fuse), run on the
 * GPU and compared with kiln_reference (the unfused graph on the CPU) by NMSE.
 *
 * - moe_sum: the MoE expert sum (product, views per slot, adds, residual) as one kernel, at
 *   decode and prefill token counts, 8 and 4 slots, f32 and f16 residual;
 * - into_matmul: a residual add (or two) as the epilogue of mul_mat at n = 1 (GEMV), 16
 *   (tiles), 512 (cuBLAS, then the epilogue step), and of mul_mat_id at decode. */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static void moe_sum(int D, int S, int T, const char *rt, uint64_t seed) {
    char kg[8192], what[128];
    int  n = snprintf(kg, sizeof kg, "input experts: f32[%d, %d, %d]\ninput w: f32[1, %d, %d]\ninput res: %s[%d, %d]\n"
                                    "weighted = mul(experts, w)\n",
                      D, S, T, S, T, rt, D, T);
    for (int s = 0; s < S; s++)
        n += snprintf(kg + n, sizeof kg - (size_t)n, "e%d = view(weighted, [%d, %d], [%d], %d)\n", s, D, T, D * S * 4,
                      s * D * 4);
    n += snprintf(kg + n, sizeof kg - (size_t)n, "s1 = add(e0, e1)\n");
    for (int s = 2; s < S; s++) n += snprintf(kg + n, sizeof kg - (size_t)n, "s%d = add(s%d, e%d)\n", s, s - 1, s);
    snprintf(kg + n, sizeof kg - (size_t)n, "output out = add(s%d, res)\n", S - 1);
    snprintf(what, sizeof what, "moe_sum D %d slots %d T %d residual %s", D, S, T, rt);
    check_kg_fused(kg, what, 1e-7, seed);
}

START_TEST(test_moe_sum) {
    static const int cases[6][3] = {{2048, 8, 1}, {2048, 8, 5}, {4096, 4, 1}, {768, 8, 64}, {2048, 8, 512}, {64, 2, 3}};
    moe_sum(cases[_i][0], cases[_i][1], cases[_i][2], _i % 2 ? "f16" : "f32", 100 + (uint64_t)_i);
}
END_TEST

START_TEST(test_into_matmul) {
    static const int NS[3] = {1, 16, 512};
    char kg[1024], what[128];
    int  N = NS[_i % 3];
    bool two = _i >= 3;
    snprintf(kg, sizeof kg,
             "weight w: bf16[2048, 1024]\ninput x: f32[2048, %d]\ninput r1: f32[1024, %d]\ninput r2: f32[1024]\n"
             "m = mul_mat(w, x)\n%s",
             N, N, two ? "s = add(m, r1)\noutput y = add(s, r2)\n" : "output y = add(r1, m)\n");
    snprintf(what, sizeof what, "into mul_mat n %d, %s", N, two ? "two adds" : "residual");
    check_kg_fused(kg, what, 5e-4, 200 + (uint64_t)_i);
}
END_TEST

START_TEST(test_into_matmul_id) {
    char kg[1024];
    int  T = _i ? 4 : 1;
    snprintf(kg, sizeof kg,
             "weight as: bf16[2048, 768, 16]\ninput x: f32[2048, 1, %d]\ninput ids: i32[4, %d]\ninput r: f32[768, 4, %d]\n"
             "m = mul_mat_id(as, x, ids)\noutput y = add(m, r)\n",
             T, T, T);
    check_kg_fused(kg, T == 1 ? "into mul_mat_id T 1" : "into mul_mat_id T 4", 5e-4, 300 + (uint64_t)_i);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_add_chain",
                        TS_CASE("moe_sum", 900), TS_LOOP(0, 6, test_moe_sum),
                        TS_CASE("into_matmul", 900), TS_LOOP(0, 6, test_into_matmul),
                        TS_LOOP(0, 2, test_into_matmul_id));
    return ts_main_cache(s, "gpu-fuse-add", &g_cache_dir);
}
