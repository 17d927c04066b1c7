/* Fusion passes rms_norm_mul and rope_set_rows (issue 5): each fires on its pattern, leaves
 * every broken variant alone, and the CPU reference gives bit for bit the same outputs with and
 * without it (both fused nodes evaluate as the unfused computations they replace, so the
 * comparison is exact: ts_fusion_compare must return 0). The fused kernels are generated and
 * compiled by NVRTC without warnings for sm_90a and sm_80, and both example layers fuse. */
#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The other fusion passes of issue 5, left out so that these tests see only the two passes
 * under test (and ew_chain, which runs after them). */
#define OTHERS "topk_moe,mul_mat_glu,add_chain"

/* Compares fused and unfused reference outputs of kg; returns the fused IR text. */
static char *fuse(const char *kg, int want_live) {
    int    live;
    char  *text;
    double d = ts_fusion_compare(kg, OTHERS, &live, &text);
    ck_assert_msg(d == 0, "fused and unfused reference outputs differ by %g:\n%s\n%s", d, kg, text);
    if (want_live >= 0) ck_assert_msg(live == want_live, "%d kernels, want %d:\n%s\n%s", live, want_live, kg, text);
    return text;
}

static void expect_fused(const char *kg, const char *line, int want_live) {
    char *text = fuse(kg, want_live);
    ck_assert_msg(strstr(text, line), "'%s' missing:\n%s\n%s", line, kg, text);
    free(text);
}

static void expect_not_fused(const char *kg, const char *name) {
    char *text = fuse(kg, -1);
    char  line[64];
    snprintf(line, sizeof line, "fused %s:", name);
    ck_assert_msg(!strstr(text, line), "%s fired:\n%s\n%s", name, kg, text);
    free(text);
}

/* ---- rms_norm_mul --------------------------------------------------------------------------- */

static const struct {
    const char *kg, *line;
    int         live;
} NORM_FIRES[] = {
    /* llama: rms_norm -> mul(weight) */
    {"input x: f32[2048, 1]\nweight w: f32[2048]\nn = rms_norm(x, 1e-05)\noutput y = mul(n, w)\n",
     "fused rms_norm_mul: n, y", 1},
    /* several rows, f16 */
    {"input x: f16[64, 6]\nweight w: f16[64]\nn = rms_norm(x, 1e-06)\noutput y = mul(n, w)\n",
     "fused rms_norm_mul: n, y", 1},
    /* + residual add (either order), bf16 with an f32 weight */
    {"input x: bf16[256, 3]\nweight w: f32[256]\ninput r: bf16[256, 3]\nn = rms_norm(x, 1e-06)\nm = mul(n, w)\n"
     "output y = add(r, m)\n",
     "fused rms_norm_mul: n, m, y", 1},
    /* norm -> mul -> add -> add */
    {"input x: f32[100, 4]\nweight w: f32[100]\ninput r: f32[100, 4]\ninput s: f32[100]\nn = norm(x, 1e-05)\n"
     "m = mul(n, w)\na = add(m, r)\noutput y = add(a, s)\n",
     "fused rms_norm_mul: n, m, a, y", 1},
    /* Qwen3 QK-norm: per-head rows, the weight broadcast over heads and tokens */
    {"input q: f32[128, 32, 3]\nweight w: f32[128]\nn = rms_norm(q, 1e-06)\noutput y = mul(n, w)\n",
     "fused rms_norm_mul: n, y", 1},
    /* a norm of a transposed operand, weight broadcast over dim 1 only */
    {"input x: f32[6, 40]\nweight w: f32[1, 6]\nt = transpose(x)\nn = rms_norm(t, 1e-06)\noutput y = mul(n, w)\n",
     "fused rms_norm_mul: n, y", 1},
    /* the mul's result is also an output: the add stays out */
    {"input x: f32[64, 2]\nweight w: f32[64]\ninput r: f32[64, 2]\nn = rms_norm(x, 1e-06)\noutput m = mul(n, w)\n"
     "output y = add(m, r)\n",
     "fused rms_norm_mul: n, m\n", 2},
    /* other elementwise work after the adds is left to ew_chain */
    {"input x: f32[64, 2]\nweight w: f32[64]\nn = rms_norm(x, 1e-06)\nm = mul(n, w)\noutput y = silu(m)\n",
     "fused rms_norm_mul: n, m\n", 2},
};

START_TEST(norm_fires) { expect_fused(NORM_FIRES[_i].kg, NORM_FIRES[_i].line, NORM_FIRES[_i].live); }
END_TEST

static const char *const NORM_BROKEN[] = {
    /* the norm's result is an output */
    "input x: f32[64, 2]\nweight w: f32[64]\noutput n = rms_norm(x, 1e-06)\noutput y = mul(n, w)\n",
    /* the norm's result has another reader */
    "input x: f32[64, 2]\nweight w: f32[64]\nn = rms_norm(x, 1e-06)\noutput y = mul(n, w)\noutput z = scale(n, 2, 0)\n",
    /* read twice by the mul */
    "input x: f32[64, 2]\nn = rms_norm(x, 1e-06)\noutput y = mul(n, n)\n",
    /* the first consumer is not a mul */
    "input x: f32[64, 2]\ninput r: f32[64, 2]\nn = rms_norm(x, 1e-06)\noutput y = add(n, r)\n",
    /* the mul broadcasts the norm's result (its space is not the norm's) */
    "input x: f32[64, 1]\nweight w: f32[64, 4]\nn = rms_norm(x, 1e-06)\noutput y = mul(w, n)\n",
    /* the mul reads the result through another layout */
    "input x: f32[64, 8]\nweight w: f32[8, 64]\nn = rms_norm(x, 1e-06)\nt = transpose(n)\noutput y = mul(t, w)\n",
    /* a different norm: l2_norm and group_norm are not part of the pattern */
    "input x: f32[64, 2]\nweight w: f32[64]\nn = l2_norm(x, 1e-12)\noutput y = mul(n, w)\n",
    "input x: f32[8, 8, 4]\nweight w: f32[8, 8, 4]\nn = group_norm(x, 2, 1e-05)\noutput y = mul(n, w)\n",
    /* a cast between: the mul reads another value */
    "input x: f32[64, 2]\nweight w: f16[64]\nn = rms_norm(x, 1e-06)\nc = cast(n, f16)\noutput y = mul(c, w)\n",
};

START_TEST(norm_broken) { expect_not_fused(NORM_BROKEN[_i], "rms_norm_mul"); }
END_TEST

/* ---- rope_set_rows ---------------------------------------------------------------------------- */

/* A K rope of [hd, heads, tokens] written into an [hd * heads, slots] cache of type ct. */
static char *rope_graph(int hd, int heads, int tokens, int mode, const char *ct, const char *it, int slots,
                        const char *extra) {
    char *s = malloc(2048);
    ck_assert_ptr_nonnull(s);
    snprintf(s, 2048,
             "input k: f32[%d, %d, %d]\ninput pos: i32[%d]\ninput idx: %s[%d]\ninput cache: %s[%d, %d]\n"
             "r = rope_ext(k, pos, n_dims=%d, mode=%d, n_ctx_orig=4096, freq_base=10000)\n"
             "rows = reshape(r, [%d, %d])\noutput c = set_rows(cache, rows, idx)\n%s",
             hd, heads, tokens, tokens, it, tokens, ct, hd * heads, slots, hd, mode, hd * heads, tokens,
             extra ? extra : "");
    return s;
}

static const struct {
    int         hd, heads, tokens, mode;
    const char *ct, *it;
    int         slots;
} ROPE_FIRES[] = {
    {64, 8, 1, 0, "f16", "i64", 32}, {128, 4, 1, 2, "f16", "i64", 16}, {64, 2, 5, 0, "f32", "i32", 17},
    {128, 2, 3, 2, "bf16", "i32", 16}, {32, 3, 9, 2, "f16", "i64", 20},
};

START_TEST(rope_fires) {
    char *kg = rope_graph(ROPE_FIRES[_i].hd, ROPE_FIRES[_i].heads, ROPE_FIRES[_i].tokens, ROPE_FIRES[_i].mode,
                          ROPE_FIRES[_i].ct, ROPE_FIRES[_i].it, ROPE_FIRES[_i].slots, NULL);
    expect_fused(kg, "fused rope_set_rows: r, c", 1);
    free(kg);
}
END_TEST

/* The rope with freq_factors and a partial rotation (n_dims < head_dim), neox. */
START_TEST(rope_fires_freq_factors) {
    expect_fused("input k: f32[64, 2, 2]\ninput pos: i32[2]\ninput idx: i64[2]\ninput cache: f16[128, 16]\n"
                 "weight ff: f32[16]\n"
                 "r = rope_ext(k, pos, ff, n_dims=32, mode=2, n_ctx_orig=4096, freq_base=10000, ext_factor=1)\n"
                 "rows = reshape(r, [128, 2])\noutput c = set_rows(cache, rows, idx)\n",
                 "fused rope_set_rows: r, c", 1);
}
END_TEST

static const char *const ROPE_BROKEN[] = {
    /* the rope's result is also an output */
    "input k: f32[64, 2, 1]\ninput pos: i32[1]\ninput idx: i64[1]\ninput cache: f16[128, 16]\n"
    "output r = rope_ext(k, pos, n_dims=64)\nrows = reshape(r, [128, 1])\noutput c = set_rows(cache, rows, idx)\n",
    /* ... or has another reader */
    "input k: f32[64, 2, 1]\ninput pos: i32[1]\ninput idx: i64[1]\ninput cache: f16[128, 16]\n"
    "r = rope_ext(k, pos, n_dims=64)\nrows = reshape(r, [128, 1])\noutput c = set_rows(cache, rows, idx)\n"
    "output q = scale(r, 2, 0)\n",
    /* rows of single heads, not whole tokens */
    "input k: f32[64, 2, 3]\ninput pos: i32[3]\ninput idx: i64[6]\ninput cache: f16[64, 16]\n"
    "r = rope_ext(k, pos, n_dims=64)\nrows = reshape(r, [64, 6])\noutput c = set_rows(cache, rows, idx)\n",
    /* a strided view of the rope's result (the first head of each token) */
    "input k: f32[64, 2, 3]\ninput pos: i32[3]\ninput idx: i64[3]\ninput cache: f16[64, 16]\n"
    "r = rope_ext(k, pos, n_dims=64)\nrows = view(r, [64, 3], [512], 0)\noutput c = set_rows(cache, rows, idx)\n",
    /* a view at an offset */
    "input k: f32[64, 2, 1]\ninput pos: i32[1]\ninput idx: i64[1]\ninput cache: f16[64, 16]\n"
    "r = rope_ext(k, pos, n_dims=64)\nrows = view(r, [64, 1], [256], 256)\noutput c = set_rows(cache, rows, idx)\n",
    /* a set_rows of several matrices (b.ne2 > 1) */
    "input k: f32[64, 2, 3]\ninput pos: i32[3]\ninput idx: i64[1, 6]\ninput cache: f16[64, 16, 6]\n"
    "r = rope_ext(k, pos, n_dims=64)\nrows = reshape(r, [64, 1, 6])\noutput c = set_rows(cache, rows, idx)\n",
};

START_TEST(rope_broken) { expect_not_fused(ROPE_BROKEN[_i], "rope_set_rows"); }
END_TEST

/* ---- kernels ---------------------------------------------------------------------------------- */

/* Graphs whose fused kernels are compiled: the norm's warp and block kernels, rows kept in
 * registers and reread, vector and element operand reads, broadcasts, 16-bit types; the rope's
 * modes, token counts, id and cache types, vector and element copies. `want` names the kernel. */
static const struct {
    const char *kg, *want;
} KERNELS[] = {
    {"input x: f32[2048, 1]\nweight w: f32[2048]\ninput r: f32[2048, 1]\nn = rms_norm(x, 1e-05)\nm = mul(n, w)\n"
     "output y = add(m, r)\n",
     "rms_norm_f32_2048_mul_add"},
    {"input x: bf16[4096, 3]\nweight w: f32[4096]\nn = rms_norm(x, 1e-05)\noutput y = mul(n, w)\n",
     "rms_norm_bf16_4096_mul"},
    {"input x: f16[128, 8, 3]\nweight w: f16[128]\nn = rms_norm(x, 1e-06)\noutput y = mul(n, w)\n",
     "rms_norm_f16_128_mul"},
    {"input x: f32[7, 5, 3]\nweight w: f32[7, 1, 3]\ninput r: f16[7, 5, 3]\nn = norm(x, 1e-05)\nm = mul(n, w)\n"
     "output y = add(m, r)\n",
     "norm_f32_7_mul_add"},
    {"input x: f32[65536, 2]\nweight w: f32[65536]\nn = rms_norm(x, 1e-06)\noutput y = mul(n, w)\n", "reread"},
    {"input x: f32[40, 6]\nweight w: f32[2, 6]\nt = transpose(x)\nn = norm(t, 1e-05)\nwt = transpose(w)\n"
     "output y = mul(n, wt)\n",
     "norm_f32_6_mul"},
    {"input k: f32[64, 8, 1]\ninput pos: i32[1]\ninput idx: i64[1]\ninput cache: f16[512, 64]\n"
     "r = rope_ext(k, pos, n_dims=64, mode=0, n_ctx_orig=131072, freq_base=500000)\n"
     "rows = reshape(r, [512, 1])\noutput c = set_rows(cache, rows, idx)\n",
     "rope_set_rows_normal_f32_64_64_f16_i64"},
    {"input k: f32[128, 8, 5]\ninput pos: i32[5]\ninput idx: i32[5]\ninput cache: bf16[1024, 40]\n"
     "r = rope_ext(k, pos, n_dims=128, mode=2, n_ctx_orig=40960, freq_base=1000000)\n"
     "rows = reshape(r, [1024, 5])\noutput c = set_rows(cache, rows, idx)\n",
     "__syncthreads_or"},
    {"input k: f32[6, 3, 2]\ninput pos: i32[2]\ninput idx: i64[2]\ninput cache: f32[18, 16]\n"
     "r = rope_ext(k, pos, n_dims=4, mode=2)\nrows = reshape(r, [18, 2])\noutput c = set_rows(cache, rows, idx)\n",
     "rope_set_rows_neox_f32_4_6_f32_i64"},
    {"input k: f32[64, 2, 1]\ninput pos: i32[1]\ninput idx: i64[1]\ninput big: f16[130, 17]\n"
     "cache = view(big, [128, 17], [260], 4)\nr = rope_ext(k, pos, n_dims=64)\nrows = reshape(r, [128, 1])\n"
     "output c = set_rows(cache, rows, idx)\n",
     "rope_set_rows_normal_f32_64_64_f16_i64"},
};

static void compile_kernels(int i, const char *arch, const char *cache) {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile(KERNELS[i].kg, arch, cache, 1, &ctx, &g);
    bool          found = false;
    for (int k = 0; k < kiln_program_kernel_count(p); k++) {
        const char *src = kiln_program_kernel_source(p, k);
        found |= strstr(src, KERNELS[i].want) != NULL;
        ts_nvrtc_clean(src, kiln_program_kernel_name(p, k), arch);
    }
    ck_assert_msg(found, "case %d (%s): no fused kernel containing '%s'", i, KERNELS[i].kg, KERNELS[i].want);
    ts_compiled_free(p, g, ctx);
}

START_TEST(kernels_compile) {
    char *cache = ts_tmpdir();
    compile_kernels(_i, "sm_90a", cache);
    compile_kernels(_i, "sm_80", cache);
    ts_tmpdir_free(cache);
}
END_TEST

/* ---- the example layers ------------------------------------------------------------------------- */

static char *read_example(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/examples/%s", ts_src_dir(), name);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq((long)fread(s, 1, (size_t)n, f), n);
    s[n] = 0;
    fclose(f);
    return s;
}

START_TEST(llama_layer) {
    char *kg = read_example("llama-layer.kg");
    char *text = fuse(kg, -1);
    ck_assert_msg(strstr(text, "fused rms_norm_mul: norm, attn_in\n") && strstr(text, "fused rms_norm_mul: norm2, ffn_in\n") &&
                      strstr(text, "fused rope_set_rows: Krope, k_cache\n"),
                  "%s", text);
    free(text);
    free(kg);
}
END_TEST

START_TEST(qwen3moe_layer) {
    char *kg = read_example("qwen3moe-layer.kg");
    char *text = fuse(kg, -1);
    ck_assert_msg(strstr(text, "fused rms_norm_mul: norm, attn_in\n") && strstr(text, "fused rms_norm_mul: Qn, Qnw\n") &&
                      strstr(text, "fused rms_norm_mul: Kn, Knw\n") && strstr(text, "fused rms_norm_mul: norm2, moe_in\n") &&
                      strstr(text, "fused rope_set_rows: Krope, k_cache\n"),
                  "%s", text);
    free(text);
    free(kg);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_norm_rope",
                        TS_CASE("rms_norm_mul", 0),
                        TS_LOOP(0, (int)(sizeof NORM_FIRES / sizeof NORM_FIRES[0]), norm_fires),
                        TS_LOOP(0, (int)(sizeof NORM_BROKEN / sizeof NORM_BROKEN[0]), norm_broken),
                        TS_CASE("rope_set_rows", 0),
                        TS_LOOP(0, (int)(sizeof ROPE_FIRES / sizeof ROPE_FIRES[0]), rope_fires),
                        TS_TESTS(rope_fires_freq_factors),
                        TS_LOOP(0, (int)(sizeof ROPE_BROKEN / sizeof ROPE_BROKEN[0]), rope_broken),
                        TS_CASE("kernels", 120), TS_LOOP(0, (int)(sizeof KERNELS / sizeof KERNELS[0]), kernels_compile),
                        TS_CASE("examples", 120), TS_TESTS(llama_layer, qwen3moe_layer));
    return ts_main(s);
}
