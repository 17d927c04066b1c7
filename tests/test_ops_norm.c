/* The norm family (norm, rms_norm, l2_norm, group_norm): the CPU reference against values
 * computed by hand, the frontend's errors, and every op's kernel generated and compiled by NVRTC
 * for sm_90a and sm_80 over a spread of shapes, types and layouts (no GPU needed). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

/* ---- the reference, by hand ------------------------------------------------------------------ */

static void expect(const ts_slot *s, const float *want, int64_t n, double tol) {
    ck_assert_msg(s->n == n, "%s: %lld values, expected %lld", s->name, (long long)s->n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs((double)s->v[i] - want[i]) <= tol * (1 + fabs(want[i])),
                      "%s[%lld] = %.9g, expected %.9g", s->name, (long long)i, s->v[i], want[i]);
}

START_TEST(rms_norm_by_hand) {
    /* [1, 2, 3, 4]: mean of squares 30/4 = 7.5, y = x / sqrt(7.5) (eps 0). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 2, 2, -2, 2}}, {.name = "y"}, {.name = "e"}}, .ns = 3};
    ts_hands_run("input x: f32[4, 2]\noutput y = rms_norm(x, 0)\n"
                 "r = reshape(x, [2, 4])\noutput e = rms_norm(r, 1)\n", &h);
    const float k = 0.365148372f; /* 1/sqrt(7.5) */
    const float y[8] = {1 * k, 2 * k, 3 * k, 4 * k, 1, 1, -1, 1}; /* [2,2,-2,2]: ms 4, scale 1/2 */
    expect(&h.s[1], y, 8, 1e-6);
    /* rows of 2 with eps 1: [1,2] ms 2.5 -> /sqrt(3.5); [3,4] ms 12.5 -> /sqrt(13.5);
     * [2,2] ms 4 -> /sqrt(5); [-2,2] the same. */
    const float a = 1 / sqrtf(3.5f), b = 1 / sqrtf(13.5f), c = 1 / sqrtf(5);
    const float e[8] = {1 * a, 2 * a, 3 * b, 4 * b, 2 * c, 2 * c, -2 * c, 2 * c};
    expect(&h.s[2], e, 8, 1e-6);
}
END_TEST

START_TEST(norm_by_hand) {
    /* [1,2,3,4]: mean 2.5, variance 1.25 -> (x - 2.5) / sqrt(1.25). [5,5,5,5]: variance 0 ->
     * 0 / sqrt(eps) = 0. [-1, 1, -1, 1]: mean 0, variance 1 -> x / sqrt(1 + eps). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 5, 5, 5, 5, -1, 1, -1, 1}}, {.name = "y"}}, .ns = 2};
    ts_hands_run("input x: f32[4, 3]\noutput y = norm(x, 1e-05)\n", &h);
    const float s = 1 / sqrtf(1.25f + 1e-5f), u = 1 / sqrtf(1 + 1e-5f);
    const float y[12] = {-1.5f * s, -0.5f * s, 0.5f * s, 1.5f * s, 0, 0, 0, 0, -u, u, -u, u};
    expect(&h.s[1], y, 12, 1e-6);
}
END_TEST

START_TEST(l2_norm_by_hand) {
    /* [3, 4] -> [0.6, 0.8]; [0, 0] -> 0 * 1/eps = 0; with eps 10 > |x| = 5: x / 10. */
    ts_hands h = {.s = {{.name = "x", .v = {3, 4, 0, 0}}, {.name = "y"}, {.name = "z"}}, .ns = 3};
    ts_hands_run("input x: f32[2, 2]\noutput y = l2_norm(x, 1e-12)\noutput z = l2_norm(x, 10)\n", &h);
    expect(&h.s[1], (const float[]){0.6f, 0.8f, 0, 0}, 4, 1e-7);
    expect(&h.s[2], (const float[]){0.3f, 0.4f, 0, 0}, 4, 1e-7);
}
END_TEST

/* Views: a transposed operand normalizes the columns of its source. */
START_TEST(norm_of_views_by_hand) {
    /* x = [[3, 1], [4, 1]] as f32[2, 2] rows (3,1) and (4,1); transpose -> rows (3,4), (1,1). */
    ts_hands h = {.s = {{.name = "x", .v = {3, 1, 4, 1}}, {.name = "y"}, {.name = "v"}}, .ns = 3};
    ts_hands_run("input x: f32[2, 2]\nt = transpose(x)\noutput y = l2_norm(t, 0)\n"
                 "w = view(x, [1, 2], [8], 4)\noutput v = rms_norm(w, 0)\n", &h);
    const float r = 1 / sqrtf(2);
    expect(&h.s[1], (const float[]){0.6f, 0.8f, r, r}, 4, 1e-7);
    /* view: element 1 of each row: [1] and [1] -> rows of one element -> 1. */
    expect(&h.s[2], (const float[]){1, 1}, 2, 1e-7);
}
END_TEST

/* f16 and bf16: computed in f32, rounded once to the type. */
START_TEST(low_precision_by_hand) {
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4}}, {.name = "y"}, {.name = "b"}, {.name = "c"}}, .ns = 4};
    ts_hands_run("input x: f16[4]\noutput y = rms_norm(x, 0)\n"
                 "b = cast(x, bf16)\nr = rms_norm(b, 0)\noutput c = cast(r, f32)\n", &h);
    ck_assert_int_eq(h.s[1].type, KILN_F16);
    const float k = 0.365148372f;
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq(h.s[1].v[i], kb_f16_to_f32(kb_f32_to_f16((float)(i + 1) * k)));
        ck_assert_float_eq(h.s[3].v[i], kb_bf16_to_f32(kb_f32_to_bf16((float)(i + 1) * k)));
    }
}
END_TEST

START_TEST(group_norm_by_hand) {
    /* [1, 1, 4]: channels 1, 2, 3, 4. 2 groups: {1,2} {3,4}, each mean +-0.5, variance 0.25 ->
     * -1, 1, -1, 1 (eps 0). 3 groups: ceil(4/3) = 2 channels each, the third empty: the same.
     * 4 groups: one channel each: 0. */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4}}, {.name = "a"}, {.name = "b"}, {.name = "c"}}, .ns = 4};
    ts_hands_run("input x: f32[1, 1, 4]\noutput a = group_norm(x, 2, 0)\noutput b = group_norm(x, 3, 0)\n"
                 "output c = group_norm(x, 4, 1e-05)\n", &h);
    expect(&h.s[1], (const float[]){-1, 1, -1, 1}, 4, 1e-7);
    expect(&h.s[2], (const float[]){-1, 1, -1, 1}, 4, 1e-7);
    expect(&h.s[3], (const float[]){0, 0, 0, 0}, 4, 0);

    /* [2, 1, 3, 2] with 2 groups: 2 channels per group, the last group one channel. Per i3:
     * group 0 = channels 0,1 (4 values), group 1 = channel 2 (2 values). */
    ts_hands g = {.s = {{.name = "x", .v = {0, 2, 4, 6, 10, 20, /* i3 = 1: */ 1, 1, 1, 5, 7, 9}}, {.name = "y"}},
                  .ns = 2};
    ts_hands_run("input x: f32[2, 1, 3, 2]\noutput y = group_norm(x, 2, 0)\n", &g);
    /* {0,2,4,6}: mean 3, var 5; {10,20}: mean 15, var 25; {1,1,1,5}: mean 2, var 3; {7,9}: mean 8, var 1. */
    const float s5 = 1 / sqrtf(5), s3 = 1 / sqrtf(3);
    const float y[12] = {-3 * s5, -1 * s5, 1 * s5, 3 * s5, -1, 1, -1 * s3, -1 * s3, -1 * s3, 3 * s3, -1, 1};
    expect(&g.s[1], y, 12, 1e-6);
}
END_TEST

/* ggml's rounding steps: rms_norm's mean is the double sum divided in double; with values whose
 * squares sum inexactly in f32 the result still matches a double computation. */
START_TEST(reference_matches_double) {
    ts_hands h = {.s = {{.name = "x"}, {.name = "y"}, {.name = "z"}, {.name = "w"}}, .ns = 4};
    for (int i = 0; i < 48; i++) h.s[0].v[i] = sinf((float)i * 0.7f) * (1 + (float)(i % 5));
    ts_hands_run("input x: f32[48]\noutput y = rms_norm(x, 1e-06)\noutput z = norm(x, 1e-05)\n"
                 "output w = l2_norm(x, 1e-12)\n", &h);
    double s = 0, s2 = 0, q = 0;
    for (int i = 0; i < 48; i++) s += h.s[0].v[i], q += (double)h.s[0].v[i] * h.s[0].v[i];
    double mean = s / 48;
    for (int i = 0; i < 48; i++) s2 += (h.s[0].v[i] - mean) * (h.s[0].v[i] - mean);
    for (int i = 0; i < 48; i++) {
        double x = h.s[0].v[i];
        ck_assert_double_eq_tol(h.s[1].v[i], x / sqrt(q / 48 + 1e-6), 2e-6);
        ck_assert_double_eq_tol(h.s[2].v[i], (x - mean) / sqrt(s2 / 48 + 1e-5), 2e-6);
        ck_assert_double_eq_tol(h.s[3].v[i], x / sqrt(q), 2e-6);
    }
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------------- */

static void expect_error(const char *text, kiln_code code, const char *const *needles) {
    ts_parse_error(text, code, needles);
}

START_TEST(errors) {
    expect_error("input a: i32[4, 2]\noutput y = rms_norm(a, 1e-06)\n", KILN_ERR_SHAPE,
                 (const char *[]){"bad.kg:2", "rms_norm", "'a'", "i32[4, 2]", "f32, f16 or bf16", NULL});
    expect_error("input a: i64[4]\noutput y = norm(a, 1e-05)\n", KILN_ERR_SHAPE,
                 (const char *[]){"norm", "'a'", "i64", NULL});
    expect_error("input a: i32[4, 2, 3]\noutput y = group_norm(a, 1, 1e-05)\n", KILN_ERR_SHAPE,
                 (const char *[]){"group_norm", "'a'", NULL});
    expect_error("input a: i32[4]\noutput y = l2_norm(a, 1e-12)\n", KILN_ERR_SHAPE,
                 (const char *[]){"l2_norm", "'a'", NULL});
    expect_error("input a: f32[4]\noutput y = rms_norm(a, -1)\n", KILN_ERR_INVALID,
                 (const char *[]){"rms_norm", "eps", ">= 0", NULL});
    expect_error("input a: f32[4]\noutput y = l2_norm(a, -0.5)\n", KILN_ERR_INVALID,
                 (const char *[]){"l2_norm", "eps", NULL});
    expect_error("input a: f32[4, 1, 8]\noutput y = group_norm(a, 0, 1e-05)\n", KILN_ERR_INVALID,
                 (const char *[]){"group_norm", "n_groups", "at least 1", NULL});
    expect_error("input a: f32[4, 1, 8]\noutput y = group_norm(a, -3, 1e-05)\n", KILN_ERR_INVALID,
                 (const char *[]){"group_norm", "-3", NULL});

    /* The C API records the same errors. */
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t   ne[1] = {4};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "a", 1, ne);
    ck_assert_ptr_null(kiln_rms_norm(ctx, a, 1e-6f));
    ts_ctx_error(ctx, KILN_ERR_SHAPE, "rms_norm");
}
END_TEST

/* Results keep a's shape and type. */
START_TEST(result_shape_and_type) {
    kiln_ctx *ctx;
    kiln_graph *g = ts_build("input a: bf16[8, 3, 5]\ninput b: f16[6, 2]\n"
                             "output y = norm(a, 1e-05)\noutput z = group_norm(a, 2, 1e-06)\n"
                             "t = transpose(b)\noutput w = rms_norm(t, 1e-06)\n", &ctx);
    for (int i = 0; i < kiln_graph_size(g); i++) {
        kiln_tensor *t = kiln_graph_node(g, i);
        const char  *n = kiln_tensor_name(t);
        if (!strcmp(n, "y") || !strcmp(n, "z")) {
            ck_assert_int_eq(kiln_tensor_type(t), KILN_BF16);
            ck_assert_int_eq(kiln_tensor_ne(t, 0), 8);
            ck_assert_int_eq(kiln_tensor_ne(t, 2), 5);
        }
        if (!strcmp(n, "w")) {
            ck_assert_int_eq(kiln_tensor_type(t), KILN_F16);
            ck_assert_int_eq(kiln_tensor_ne(t, 0), 2);
            ck_assert_int_eq(kiln_tensor_ne(t, 1), 6);
        }
    }
    ts_graph_free(g, ctx);
}
END_TEST

/* ---- kernels: generated and compiled ------------------------------------------------------------ */

/* Each graph has one norm op; together they cover the warp and block kernels, registers and
 * rereads, vector and element accesses, permuted/strided/offset operands, every type, uneven
 * and empty groups and 64-bit indexing. `want` is a string the source must contain. */
static const struct {
    const char *kg;
    const char *want;
} CASES[] = {
    {"input x: f32[4096, 8192]\noutput y = rms_norm(x, 1e-06)\n", "kiln_f32x4"},
    {"input x: bf16[8192, 4096]\noutput y = norm(x, 1e-05)\n", "kiln_u16x8"},
    {"input x: f16[64, 4096]\noutput y = l2_norm(x, 1e-12)\n", "threadIdx.x % 8u"},
    {"input x: f32[1]\noutput y = norm(x, 1e-05)\n", "live"},
    {"input x: f16[7, 5, 3]\noutput y = rms_norm(x, 1e-06)\n", "live"},
    {"input x: f32[4097, 3]\noutput y = norm(x, 1e-05)\n", "one row per block"},
    {"input x: f32[65536, 2]\noutput y = rms_norm(x, 1e-06)\n", "reread"},
    {"input x: bf16[200000]\noutput y = l2_norm(x, 1e-12)\n", "reread"},
    {"input x: f32[1024, 33]\noutput y = norm(x, 1e-05)\n", "kiln_f32x4"},
    {"input x: f32[64, 128]\nt = transpose(x)\noutput y = rms_norm(t, 1e-06)\n", "* 64u"},
    {"input x: f32[2048, 40]\nt = transpose(x)\noutput y = norm(t, 1e-05)\n", "* 2048u"},
    {"input x: bf16[8, 16, 32, 2]\np = permute(x, 2, 0, 1, 3)\noutput y = norm(p, 1e-05)\n", "r3"},
    {"input x: f16[7, 3, 5, 2]\np = permute(x, 1, 3, 0, 2)\noutput y = l2_norm(p, 1e-12)\n", "kiln_f16_to_f32"},
    {"input x: f32[20, 10]\nv = view(x, [16, 10], [80], 16)\noutput y = rms_norm(v, 1e-06)\n", "kiln_f32x4"},
    {"input x: f32[20, 10]\nv = view(x, [16, 10], [80], 4)\noutput y = rms_norm(v, 1e-06)\n", "p1 + 1u"},
    {"input x: f16[3000, 4]\nv = view(x, [2048, 4], [6000], 2)\noutput y = norm(v, 1e-05)\n", "one row per block"},
    {"input x: f16[65536, 32769]\noutput y = rms_norm(x, 1e-06)\n", "64-bit"},
    {"input x: f32[64, 64, 320]\noutput y = group_norm(x, 32, 1e-06)\n", "group reread"},
    {"input x: f16[5, 3, 10, 2]\noutput y = group_norm(x, 3, 1e-05)\n", "grp == 2u"},
    {"input x: bf16[8, 4, 6, 3]\np = permute(x, 1, 0, 2, 3)\noutput y = group_norm(p, 2, 1e-05)\n", "% 4u"},
    {"input x: f32[4, 2, 4]\noutput y = group_norm(x, 7, 1e-05)\n", "group kept in registers"},
    {"input x: bf16[16, 16, 64, 2]\noutput y = group_norm(x, 8, 1e-05)\n", "kiln_u16x8"},
};

START_TEST(kernels_compile) { ts_one_kernel_case(_i, CASES[_i].kg, CASES[_i].want, "norm_case"); }
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_norm",
                        TS_CASE("reference", 0),
                        TS_TESTS(rms_norm_by_hand, norm_by_hand, l2_norm_by_hand, norm_of_views_by_hand,
                                 low_precision_by_hand, group_norm_by_hand, reference_matches_double),
                        TS_CASE("frontend", 0), TS_TESTS(errors, result_shape_and_type),
                        TS_CASE("kernels", 120), TS_LOOP(0, (int)(sizeof CASES / sizeof CASES[0]), kernels_compile));
    return ts_main(s);
}
