/* The reduce family (sum, sum_rows, mean, argmax, cumsum): the CPU reference against values
 * computed by hand (including the ggml accumulation rules: double for f32 sums, float for
 * cumsum, the last of equal maxima for argmax), the frontend's shapes and errors, and every op's
 * kernel generated and compiled by NVRTC for sm_90a and sm_80 over a spread of shapes, types
 * and layouts, without warnings (no GPU needed). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

/* ---- the reference, by hand ------------------------------------------------------------------ */

/* Exact comparison: every value below is exactly representable and exactly computed. */
static void expect(ts_hands *h, const char *name, kiln_type type, const float *want, int64_t n) {
    const ts_slot *s = ts_hands_find(h, name);
    ck_assert_ptr_nonnull(s);
    ck_assert_msg(s->n == n, "%s: %lld values, expected %lld", name, (long long)s->n, (long long)n);
    ck_assert_msg(s->type == type, "%s: type %s, expected %s", name, kiln_type_name(s->type),
                  kiln_type_name(type));
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(s->v[i] == want[i], "%s[%lld] = %.9g, expected %.9g", name, (long long)i, s->v[i],
                      want[i]);
}

START_TEST(sum_by_hand) {
    /* x = [[1, 2, 3], [4, 5, 6]] (ne [3, 2]): 21 whatever the layout; h (f16): 0.5+0.25+... */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 5, 6}},
                        {.name = "h", .v = {0.5f, 0.25f, 0.125f, 2}},
                        {.name = "y"}, {.name = "t"}, {.name = "z"}, {.name = "w"}},
                  .ns = 6};
    ts_hands_run("input x: f32[3, 2]\ninput h: f16[2, 2]\noutput y = sum(x)\nt0 = transpose(x)\n"
                 "output t = sum(t0)\noutput z = sum(h)\nv = view(x, [2, 2], [12], 4)\noutput w = sum(v)\n",
                 &h);
    expect(&h, "y", KILN_F32, (const float[]){21}, 1);
    expect(&h, "t", KILN_F32, (const float[]){21}, 1);
    expect(&h, "z", KILN_F16, (const float[]){2.875f}, 1);
    expect(&h, "w", KILN_F32, (const float[]){2 + 3 + 5 + 6}, 1); /* columns 1..2 */
}
END_TEST

/* ggml sums f32 rows in double (ggml_float): 1e8 + 1 - 1e8 + 1 is 2, not the f32 loop's 1. */
START_TEST(sum_accumulates_in_double) {
    ts_hands h = {.s = {{.name = "x", .v = {1e8f, 1, -1e8f, 1}}, {.name = "y"}, {.name = "r"}, {.name = "m"}},
                  .ns = 4};
    ts_hands_run("input x: f32[4]\noutput y = sum(x)\noutput r = sum_rows(x)\noutput m = mean(x)\n", &h);
    expect(&h, "y", KILN_F32, (const float[]){2}, 1);
    expect(&h, "r", KILN_F32, (const float[]){2}, 1);
    expect(&h, "m", KILN_F32, (const float[]){0.5f}, 1);
}
END_TEST

START_TEST(sum_rows_and_mean_by_hand) {
    /* rows (1,2,3) and (4,5,6): sums 6, 15, means 2, 5; transposed rows (1,4) (2,5) (3,6). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 5, 6}},
                        {.name = "b", .v = {1, 2, 3, 4, 5, 6, 7, 8}},
                        {.name = "r"}, {.name = "m"}, {.name = "t"}, {.name = "q"}, {.name = "u"}},
                  .ns = 7};
    ts_hands_run("input x: f32[3, 2]\ninput b: bf16[2, 2, 2]\noutput r = sum_rows(x)\n"
                 "output m = mean(x)\nt0 = transpose(x)\noutput t = mean(t0)\noutput q = sum_rows(b)\n"
                 "p = permute(b, 2, 1, 0, 3)\noutput u = mean(p)\n",
                 &h);
    expect(&h, "r", KILN_F32, (const float[]){6, 15}, 2);
    expect(&h, "m", KILN_F32, (const float[]){2, 5}, 2);
    expect(&h, "t", KILN_F32, (const float[]){2.5f, 3.5f, 4.5f}, 3);
    /* sum_rows keeps a's type (bf16), mean is f32. b's rows (1,2) (3,4) (5,6) (7,8). */
    expect(&h, "q", KILN_BF16, (const float[]){3, 7, 11, 15}, 4);
    /* p = permute(b, 2, 1, 0, 3): p's dim 0 is b's dim 2: rows (1,5) (3,7) (2,6) (4,8). */
    expect(&h, "u", KILN_F32, (const float[]){3, 5, 4, 6}, 4);
}
END_TEST

START_TEST(argmax_by_hand) {
    /* rows (1, 5, 3), (7, 2, 7): 1, and 2 (ggml keeps the last of equal maxima);
     * (-inf, -inf, -inf): 2 as well (every element equals the running max). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 5, 3, 7, 2, 7, -INFINITY, -INFINITY, -INFINITY}},
                        {.name = "i"}, {.name = "t"}},
                  .ns = 3};
    ts_hands_run("input x: f32[3, 3]\noutput i = argmax(x)\nt0 = transpose(x)\noutput t = argmax(t0)\n", &h);
    expect(&h, "i", KILN_I32, (const float[]){1, 2, 2}, 3);
    /* columns (1, 7, -inf), (5, 2, -inf), (3, 7, -inf): 1, 0, 1. */
    expect(&h, "t", KILN_I32, (const float[]){1, 0, 1}, 3);
}
END_TEST

START_TEST(cumsum_by_hand) {
    /* Rows of f32 added one by one in float, as ggml_vec_cumsum_f32: 1e8 + 1 stays 1e8. */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 1e8f, 1, -1e8f, 1}}, {.name = "c"}, {.name = "t"}},
                  .ns = 3};
    ts_hands_run("input x: f32[4, 2]\noutput c = cumsum(x)\nt0 = transpose(x)\noutput t = cumsum(t0)\n", &h);
    expect(&h, "c", KILN_F32, (const float[]){1, 3, 6, 10, 1e8f, 1e8f, 0, 1}, 8);
    /* transposed rows (1, 1e8), (2, 1), (3, -1e8), (4, 1), stored contiguously. */
    expect(&h, "t", KILN_F32, (const float[]){1, 1e8f + 1, 2, 3, 3, 3 - 1e8f, 4, 5}, 8);
}
END_TEST

/* ---- shapes and errors ------------------------------------------------------------------------- */

static void expect_shape(kiln_ctx *ctx, const char *name, kiln_type type, int64_t n0, int64_t n1, int64_t n2,
                         int64_t n3) {
    kiln_tensor *t = fe_find(ctx, name);
    ck_assert_ptr_nonnull(t);
    ck_assert_msg(t->type == type, "%s: %s", name, kiln_type_name(t->type));
    const int64_t want[4] = {n0, n1, n2, n3};
    for (int d = 0; d < 4; d++)
        ck_assert_msg(t->ne[d] == want[d], "%s: ne[%d] = %lld, expected %lld", name, d, (long long)t->ne[d],
                      (long long)want[d]);
}

START_TEST(result_shapes) {
    kiln_ctx *ctx = ts_parse("input a: f16[5, 4, 3, 2]\ninput m: bf16[7, 9]\ninput f: f32[6, 2, 3]\n"
                             "s = sum(a)\nr = sum_rows(a)\nmn = mean(a)\nx = argmax(m)\nc = cumsum(f)\n");
    expect_shape(ctx, "s", KILN_F16, 1, 1, 1, 1);
    expect_shape(ctx, "r", KILN_F16, 1, 4, 3, 2);
    expect_shape(ctx, "mn", KILN_F32, 1, 4, 3, 2);
    expect_shape(ctx, "x", KILN_I32, 9, 1, 1, 1);
    expect_shape(ctx, "c", KILN_F32, 6, 2, 3, 1);
    kiln_ctx_free(ctx);
}
END_TEST

static void expect_error(const char *text, const char *want) { ts_parse_error(text, KILN_ERR_SHAPE, TS_NEEDLES(want)); }

START_TEST(errors) {
    expect_error("input a: f32[4, 3, 2]\ny = argmax(a)\n", "argmax: operand 'a' (f32[4, 3, 2]) is not a matrix");
    expect_error("input a: f32[4, 1, 1, 2]\ny = argmax(a)\n", "not a matrix");
    expect_error("input a: f16[8]\ny = cumsum(a)\n", "cumsum: operand 'a' is f16[8]; it must be f32");
    expect_error("input a: bf16[8]\ny = cumsum(a)\n", "must be f32");
    expect_error("input a: i32[8]\ny = sum(a)\n", "sum: operand 'a' is i32[8]; it must be f32, f16 or bf16");
    expect_error("input a: i32[8, 2]\ny = sum_rows(a)\n", "sum_rows: operand 'a'");
    expect_error("input a: i64[8]\ny = mean(a)\n", "mean: operand 'a' is i64[8]");
    expect_error("input a: i32[8, 2]\ny = argmax(a)\n", "argmax: operand 'a' is i32[8, 2]");
}
END_TEST

/* ---- kernels: generated, compiled for sm_90a and sm_80, no NVRTC warnings ----------------------- */

/* Compiles every kernel of text for sm_90a and sm_80 (fresh cache) and checks for warnings;
 * each kernel's name must start with its op (want_kernels of them). */
static void compile_all(const char *text, int want_kernels) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(text, &ctx);
    char *dir = ts_tmpdir();
    static const char *const archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        kiln_compile_opts o = {.arch = archs[a], .cache_dir = dir, .log = NULL};
        kiln_program     *p = NULL;
        TS_OK(kiln_compile(g, &o, &p));
        ck_assert_int_eq(kiln_program_kernel_count(p), want_kernels);
        for (int i = 0; a == 0 && i < kiln_program_kernel_count(p); i++) {
            const char *src = kiln_program_kernel_source(p, i), *name = kiln_program_kernel_name(p, i);
            ck_assert_msg(strstr(src, "#include") == NULL, "#include in %s", name);
            ts_nvrtc_clean(src, name, NULL);
        }
        kiln_program_free(p);
    }
    ts_tmpdir_free(dir);
    ts_graph_free(g, ctx);
}

START_TEST(kernels_compile_rows) {
    /* Rows of 1, 7 (odd, unaligned), 64, 1000 (warp), 4096 and 4097 (blocks), 131072 (1024
     * threads); f16/bf16 (8-wide vectors); permuted and transposed operands (strided rows);
     * a view with an offset; 4-D. */
    compile_all("input a: f32[1, 5]\ninput b: f16[7, 3, 2]\ninput c: bf16[64, 9]\ninput d: f32[1000, 3]\n"
                "input e: f32[4096, 4]\ninput f: f16[4097, 2]\ninput g: f32[131072]\n"
                "input h: bf16[33, 17, 4, 3]\ninput m: f32[128, 64]\n"
                "output o1 = sum_rows(a)\noutput o2 = mean(b)\noutput o3 = sum_rows(c)\n"
                "output o4 = mean(d)\noutput o5 = sum_rows(e)\noutput o6 = argmax(f)\n"
                "output o7 = sum_rows(g)\nph = permute(h, 2, 0, 1, 3)\noutput o8 = mean(ph)\n"
                "tm = transpose(m)\noutput o9 = argmax(tm)\nvm = view(m, [60, 64], [512], 8)\n"
                "output o10 = sum_rows(vm)\noutput o11 = argmax(c)\noutput o12 = argmax(g)\n"
                "vf = view(f, [4000, 2], [8194], 6)\noutput o13 = mean(vf)\n",
                13);
}
END_TEST

START_TEST(kernels_compile_cumsum_and_sum) {
    compile_all("input a: f32[1, 3]\ninput b: f32[7, 5]\ninput c: f32[4097, 2]\ninput d: f32[131072]\n"
                "input m: f32[128, 64]\ninput h: f16[33, 17, 4, 3]\ninput k: bf16[9]\n"
                "output o1 = cumsum(a)\noutput o2 = cumsum(b)\noutput o3 = cumsum(c)\noutput o4 = cumsum(d)\n"
                "tm = transpose(m)\noutput o5 = cumsum(tm)\nvm = view(m, [60, 64], [512], 16)\n"
                "output o6 = cumsum(vm)\noutput s1 = sum(a)\noutput s2 = sum(h)\noutput s3 = sum(k)\n"
                "ph = permute(h, 3, 1, 0, 2)\noutput s4 = sum(ph)\noutput s5 = sum(vm)\n"
                "output s6 = sum(d)\nvb = view(b, [6, 5], [28], 4)\noutput s7 = sum(vb)\n",
                13);
}
END_TEST

/* More than 2^31 elements: 64-bit indexing; 2^35 rows: the grid-stride row loop. */
START_TEST(kernels_compile_wide) {
    compile_all("input a: f16[65536, 32769]\ninput z: f16[1, 34359738368]\n"
                "output o1 = sum_rows(a)\noutput o2 = argmax(a)\noutput o3 = sum(a)\n"
                "ta = transpose(a)\noutput o4 = mean(ta)\noutput o5 = sum_rows(z)\n"
                "input c: f32[65536, 32769]\noutput o6 = cumsum(c)\n",
                6);
}
END_TEST

/* The same graph generates byte-identical sources (the cache key depends on them). */
START_TEST(generation_is_deterministic) {
    const char *text = "input a: f32[4097, 3]\ninput h: f16[33, 17, 4, 3]\noutput x = argmax(a)\n"
                       "output c = cumsum(a)\nph = permute(h, 2, 0, 1, 3)\noutput m = mean(ph)\n"
                       "output s = sum(ph)\noutput r = sum_rows(h)\n";
    char *src[2][8] = {{0}};
    int   n = 0;
    for (int run = 0; run < 2; run++) {
        kiln_ctx   *ctx;
        kiln_graph *g = ts_build(text, &ctx);
        kiln_compile_opts o = {.skip_nvrtc = 1, .cache_mode = KILN_CACHE_OFF};
        kiln_program     *p = NULL;
        TS_OK(kiln_compile(g, &o, &p));
        n = kiln_program_kernel_count(p);
        ck_assert_int_eq(n, 5);
        for (int i = 0; i < n; i++) src[run][i] = strdup(kiln_program_kernel_source(p, i));
        ts_compiled_free(p, g, ctx);
    }
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(src[0][i], src[1][i]);
        free(src[0][i]);
        free(src[1][i]);
    }
}
END_TEST

/* The large-row kernels use the layouts the design promises (docs/ops-reduce.md). */
START_TEST(kernel_shapes) {
    const char *text = "input a: f32[4096, 8192]\ninput w: f32[7, 9]\ninput v: f16[4096, 16]\n"
                       "output s = sum_rows(a)\noutput t = sum_rows(w)\noutput u = argmax(v)\n"
                       "output z = sum(a)\n";
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(text, &ctx);
    kiln_compile_opts o = {.skip_nvrtc = 1, .cache_mode = KILN_CACHE_OFF};
    kiln_program     *p = NULL;
    TS_OK(kiln_compile(g, &o, &p));
    ck_assert_int_eq(kiln_program_kernel_count(p), 4);
    const char *s0 = kiln_program_kernel_source(p, 0), *s1 = kiln_program_kernel_source(p, 1);
    const char *s2 = kiln_program_kernel_source(p, 2), *s3 = kiln_program_kernel_source(p, 3);
    ck_assert_str_eq(kiln_program_kernel_name(p, 0), "sum_rows_f32_4096");
    ck_assert_msg(strstr(s0, "8192 blocks of 256 threads, a block per row") && strstr(s0, "kiln_f32x4"), "%s", s0);
    ck_assert_msg(strstr(s1, "a warp per row") && strstr(s1, "element by element"), "%s", s1);
    ck_assert_msg(strstr(s2, "kiln_u16x8") && strstr(s2, "e >= best"), "%s", s2);
    ck_assert_msg(strstr(s3, "1 block of 1024 threads") && strstr(s3, "contiguous range"), "%s", s3);
    ts_compiled_free(p, g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_reduce",
                        TS_CASE("reference", 0),
                        TS_TESTS(sum_by_hand, sum_accumulates_in_double, sum_rows_and_mean_by_hand, argmax_by_hand,
                                 cumsum_by_hand),
                        TS_CASE("frontend", 0), TS_TESTS(result_shapes, errors),
                        TS_CASE("kernels", 120),
                        TS_TESTS(kernels_compile_rows, kernels_compile_cumsum_and_sum, kernels_compile_wide,
                                 generation_is_deterministic, kernel_shapes));
    return ts_main(s);
}
