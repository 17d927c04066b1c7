/* Pass rms_norm_gemv (ir/fuse_rms_norm_gemv.c): the rms_norm_mul feeding a one-column GEMV is
 * computed by the GEMV. It fires on a plain, a concatenated (q/k/v), a paired (GLU) and an
 * epilogue (residual) GEMV, for every weight type, and on each of several GEMVs reading the norm;
 * it leaves the norm alone with two columns, a second reader that is no GEMV, an add after the mul, an f16 norm weight; the CPU reference gives the same
 * bits with and without it; the fused kernels (every gemv team shape: shuffles only, and warps
 * meeting in shared memory) compile with NVRTC for sm_90a and sm_80 without warnings. No GPU. */
#include "tests/support.h"

#include "codegen/codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

/* Only the passes this one builds on. */
static const char *const OTHERS = "rope_set_rows,topk_moe,ew_chain";

/* x [K, N] normalized (times nw: f32, or `nwt`) into the consumer text `use` (reads y). */
static char *norm_kg(const char *wt, const char *nwt, int K, int N, const char *use) {
    static char kg[4096];
    snprintf(kg, sizeof kg,
             "weight nw: %s[%d]\nweight wq: %s[%d, 128]\nweight wk: %s[%d, 32]\nweight wv: %s[%d, 32]\n"
             "weight wg: %s[%d, 96]\nweight wu: %s[%d, 96]\ninput x: f32[%d, %d]\ninput r: f32[128, %d]\n"
             "n = rms_norm(x, 1e-05)\ny = mul(n, nw)\n%s",
             nwt, K, wt, K, wt, K, wt, K, wt, K, wt, K, K, N, N, use);
    return kg;
}

static const char *const USES[] = {
    "output q = mul_mat(wq, y)\n",
    "q = mul_mat(wq, y)\nk = mul_mat(wk, y)\nv = mul_mat(wv, y)\nsq = sum_rows(q)\nsk = sum_rows(k)\noutput o = add(sq, sk)\n"
    "output ov = cont(v)\n",
    "g = mul_mat(wg, y)\nu = mul_mat(wu, y)\noutput a = swiglu(g, u)\n",
    "q = mul_mat(wq, y)\noutput o = add(q, r)\n",
};
static const char *const FUSED[] = {"rms_norm_gemv: n, y, q", "rms_norm_gemv+mul_mat_cat: n, y, q, k, v",
                                    "rms_norm_gemv+mul_mat_glu: n, y, g, u, a", "rms_norm_gemv+add_chain: n, y, q, o"};
#define NUSES (int)(sizeof USES / sizeof USES[0])

/* kg fuses `fused` (no norm kernel left), or nothing when NULL; the reference's bits either way. */
static void expect(const char *kg, const char *fused) {
    char want[160];
    snprintf(want, sizeof want, "fused %s\n", fused ? fused : "");
    ts_expect_fusion(kg, OTHERS, fused ? want : NULL, fused ? "fused rms_norm_mul" : "rms_norm_gemv", -1);
}

START_TEST(fires) {
    static const char *wts[3] = {"bf16", "f16", "f32"};
    for (int u = 0; u < NUSES; u++) expect(norm_kg(wts[_i], "f32", 64, 1, USES[u]), FUSED[u]);
}
END_TEST

/* Several GEMVs read the norm (v of another type than q and k; here mul_mat_cat is off): each
 * computes it, the first one listing the norm's nodes. */
START_TEST(gemv_readers) {
    const char *skip = "rope_set_rows,topk_moe,ew_chain,mul_mat_cat";
    ts_expect_fusion(norm_kg("bf16", "f32", 64, 1, USES[1]), skip, "fused rms_norm_gemv: n, y, q\n", "fused rms_norm_mul",
                     -1);
    ts_expect_fusion(norm_kg("f16", "f32", 64, 1, USES[1]), skip, "fused rms_norm_gemv: v\n", "fused rms_norm_mul", -1);
}
END_TEST

START_TEST(not_fired) {
    expect(norm_kg("bf16", "f32", 64, 2, USES[0]), NULL); /* two columns: not the gemv */
    expect(norm_kg("bf16", "f16", 64, 1, USES[0]), NULL); /* an f16 norm weight */
    expect(norm_kg("bf16", "f32", 64, 1, "q = mul_mat(wq, y)\nsq = sum_rows(q)\nsy = sum_rows(y)\noutput o = add(sq, sy)\n"),
           NULL); /* a second reader */
    expect(norm_kg("bf16", "f32", 64, 1, "z = add(y, x)\noutput q = mul_mat(wq, z)\n"), NULL); /* an add after */
}
END_TEST

/* The fused GEMVs compile cleanly: K 64 (teams within a warp) and K 4096 (warps meet in shared
 * memory), plain and paired, for sm_90a and sm_80; the source computes the scale. */
START_TEST(kernels_compile) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    static const char *const scale[1] = {"const float bscale = 1.0f / sqrtf("};
    int K = _i ? 4096 : 64, u = _i ? 2 : 1;
    for (int a = 0; a < 2; a++) {
        int found;
        ts_kernels_clean(norm_kg("bf16", "f32", K, 1, USES[u]), archs[a], g_cache, scale, &found, 1);
        ck_assert_int_eq(found, 1);
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_rms_norm_gemv",
                        TS_CASE("pass", 120), TS_LOOP(0, 3, fires), TS_TESTS(gemv_readers, not_fired),
                        TS_LOOP(0, 2, kernels_compile));
    return ts_main_cache(s, "fuse-norm-gemv", &g_cache);
}
