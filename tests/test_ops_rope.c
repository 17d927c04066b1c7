/* The rope family (rope_ext): the CPU reference against values computed by hand for every mode,
 * partial rotation, freq_factors, freq_scale/attn_factor, YaRN, views and f16/bf16; ggml's float
 * angle recurrence bit for bit; the frontend's errors; and kernels generated and compiled by
 * NVRTC for sm_90a and sm_80 over a spread of modes, shapes, types and layouts (no GPU needed). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

/* ---- the reference, by hand ------------------------------------------------------------------ */

static void expect(const ts_slot *s, const double *want, int64_t n, double tol) {
    ck_assert_msg(s->n == n, "%s: %lld values, expected %lld", s->name, (long long)s->n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs((double)s->v[i] - want[i]) <= tol * (1 + fabs(want[i])),
                      "%s[%lld] = %.9g, expected %.9g", s->name, (long long)i, s->v[i], want[i]);
}

/* (x0, x1) rotated by theta and scaled by m: into y[e0], y[e1]. */
static void rot(double *y, const float *x, int e0, int e1, double theta, double m) {
    y[e0] = m * (x[e0] * cos(theta) - x[e1] * sin(theta));
    y[e1] = m * (x[e0] * sin(theta) + x[e1] * cos(theta));
}

START_TEST(normal_by_hand) {
    /* head_dim 6, n_dims 4, 2 tokens at positions 0 and 1. theta_scale = 10000^(-2/4) = 0.01.
     * Position 0 leaves everything as it is; position 1 rotates (0,1) by 1 and (2,3) by 0.01;
     * elements 4 and 5 are copied. */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}}, {.name = "p", .iv = {0, 1}}, {.name = "y"}},
                  .ns = 3};
    ts_hands_run("input x: f32[6, 1, 2]\ninput p: i32[2]\noutput y = rope_ext(x, p, n_dims=4)\n", &h);
    double want[12] = {1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 5, 6};
    rot(want + 6, h.s[0].v + 6, 0, 1, 1.0, 1);
    rot(want + 6, h.s[0].v + 6, 2, 3, 0.01, 1);
    expect(&h.s[2], want, 12, 1e-6);
}
END_TEST

START_TEST(neox_by_hand) {
    /* neox rotates (i, i + n_dims/2): (0,2) by 1 and (1,3) by 0.01 at position 1. */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4}}, {.name = "p", .iv = {1}}, {.name = "y"}}, .ns = 3};
    ts_hands_run("input x: f32[4]\ninput p: i32[1]\noutput y = rope_ext(x, p, n_dims=4, mode=2)\n", &h);
    double want[4];
    rot(want, h.s[0].v, 0, 2, 1.0, 1);
    rot(want, h.s[0].v, 1, 3, 0.01, 1);
    expect(&h.s[2], want, 4, 1e-6);
}
END_TEST

START_TEST(freq_factors_scale_attn_by_hand) {
    /* freq_factors [2, 4] divide the angles (1 -> 0.5, 0.01 -> 0.0025), freq_scale 0.5 halves
     * them again, and attn_factor 2 scales cos and sin (ext_factor 0: mscale = attn_factor). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4}}, {.name = "p", .iv = {1}}, {.name = "f", .v = {2, 4}}, {.name = "y"}},
                  .ns = 4};
    ts_hands_run("input x: f32[4]\ninput p: i32[1]\ninput f: f32[2]\n"
                 "output y = rope_ext(x, p, f, 4, 2, freq_scale=0.5, attn_factor=2)\n", &h);
    double want[4];
    rot(want, h.s[0].v, 0, 2, 0.25, 2);
    rot(want, h.s[0].v, 1, 3, 0.00125, 2);
    expect(&h.s[3], want, 4, 1e-6);
}
END_TEST

START_TEST(yarn_by_hand) {
    /* n_dims 4, n_ctx_orig 4096, base 10000, beta_fast 32, beta_slow 1: the correction dims are
     * floor(4 ln(4096 / (32*2pi)) / (2 ln 10000)) = floor(0.6545) = 0 and
     * ceil(4 ln(4096 / (2pi)) / (2 ln 10000)) = ceil(1.4071) = 2. The ramp of pair i is
     * 1 - clamp(i / 2, 0, 1): 1 for pair 0, 0.5 for pair 1; with ext_factor 1 that is the mix of
     * the extrapolated angle (p * 0.01^i) into the interpolated one (freq_scale 0.5 times it):
     * pair 0: 1, pair 1: 0.5 * 0.005 + 0.5 * 0.01 = 0.0075. mscale = 1 + 0.1 ln(1/0.5). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4}}, {.name = "p", .iv = {1}}, {.name = "y"}}, .ns = 3};
    ts_hands_run("input x: f32[4]\ninput p: i32[1]\n"
                 "output y = rope_ext(x, p, n_dims=4, n_ctx_orig=4096, freq_scale=0.5, ext_factor=1)\n", &h);
    const double m = 1 + 0.1 * log(2.0);
    double       want[4];
    rot(want, h.s[0].v, 0, 1, 1.0, m);
    rot(want, h.s[0].v, 2, 3, 0.0075, m);
    expect(&h.s[2], want, 4, 1e-6);
}
END_TEST

START_TEST(mrope_imrope_by_hand) {
    /* head_dim 8 = n_dims, sections [2, 1, 1, 0], positions t=1 h=2 w=3 e=4; theta_scale 0.1;
     * pair i's angle is its section's position times 0.1^i, pairs (i, i+4).
     * mrope: sectors 0,1 -> t, 2 -> h, 3 -> w: 1, 0.1, 0.02, 0.003.
     * imrope (interleaved t h w t ...): 0 -> t, 1 -> h, 2 -> w, 3 -> t: 1, 0.2, 0.03, 0.001. */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 5, 6, 7, 8}}, {.name = "p", .iv = {1, 2, 3, 4}}, {.name = "m"}, {.name = "i"}},
                  .ns = 4};
    ts_hands_run("input x: f32[8]\ninput p: i32[4]\n"
                 "output m = rope_ext(x, p, n_dims=8, mode=8, sections=[2, 1, 1, 0])\n"
                 "output i = rope_ext(x, p, n_dims=8, mode=40, sections=[2, 1, 1, 0])\n", &h);
    const double tm[4] = {1, 0.1, 0.02, 0.003}, ti[4] = {1, 0.2, 0.03, 0.001};
    double       wm[8], wi[8];
    for (int i = 0; i < 4; i++) {
        rot(wm, h.s[0].v, i, i + 4, tm[i], 1);
        rot(wi, h.s[0].v, i, i + 4, ti[i], 1);
    }
    expect(&h.s[2], wm, 8, 1e-6);
    expect(&h.s[3], wi, 8, 1e-6);
}
END_TEST

START_TEST(vision_by_hand) {
    /* head_dim 8, n_dims 4 (= 8/2): pairs (i, i+4) for i < 4; sections [2, 2, 0, 0]; theta_scale
     * 10000^(-2/4) = 0.01. Each section restarts its chain: pairs 0, 1 use t (1, 0.01), pairs 2,
     * 3 use h from its start (2, 0.02). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4, 5, 6, 7, 8}}, {.name = "p", .iv = {1, 2, 0, 0}}, {.name = "y"}},
                  .ns = 3};
    ts_hands_run("input x: f32[8]\ninput p: i32[4]\n"
                 "output y = rope_ext(x, p, n_dims=4, mode=24, sections=[2, 2, 0, 0])\n", &h);
    const double t[4] = {1, 0.01, 2, 0.02};
    double       want[8];
    for (int i = 0; i < 4; i++) rot(want, h.s[0].v, i, i + 4, t[i], 1);
    expect(&h.s[2], want, 8, 1e-6);
}
END_TEST

START_TEST(views_by_hand) {
    /* x f32[2, 4] transposed: 2 heads of head_dim 4 whose elements are 2 apart in memory. The
     * result is contiguous: head j is column j of x, rotated (neox, position 1). */
    ts_hands h = {.s = {{.name = "x", .v = {1, 5, 2, 6, 3, 7, 4, 8}}, {.name = "p", .iv = {1}}, {.name = "y"}}, .ns = 3};
    ts_hands_run("input x: f32[2, 4]\ninput p: i32[1]\nt = transpose(x)\noutput y = rope_ext(t, p, n_dims=4, mode=2)\n", &h);
    const float cols[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double      want[8];
    for (int hd = 0; hd < 2; hd++) {
        rot(want + 4 * hd, cols + 4 * hd, 0, 2, 1.0, 1);
        rot(want + 4 * hd, cols + 4 * hd, 1, 3, 0.01, 1);
    }
    expect(&h.s[2], want, 8, 1e-6);
}
END_TEST

/* f16 and bf16: computed in f32 from the widened inputs, rounded once on store. */
START_TEST(low_precision_by_hand) {
    ts_hands h = {.s = {{.name = "x", .v = {1, 2, 3, 4}}, {.name = "p", .iv = {3}}, {.name = "f"}, {.name = "h"}, {.name = "b"}},
                  .ns = 5};
    ts_hands_run("input x: f32[4]\ninput p: i32[1]\noutput f = rope_ext(x, p, n_dims=4, mode=2)\n"
                 "xh = cast(x, f16)\noutput h = rope_ext(xh, p, n_dims=4, mode=2)\n"
                 "xb = cast(x, bf16)\noutput b = rope_ext(xb, p, n_dims=4, mode=2)\n", &h);
    ck_assert_int_eq(h.s[3].type, KILN_F16);
    ck_assert_int_eq(h.s[4].type, KILN_BF16);
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq(h.s[3].v[i], kb_f16_to_f32(kb_f32_to_f16(h.s[2].v[i])));
        ck_assert_float_eq(h.s[4].v[i], kb_bf16_to_f32(kb_f32_to_bf16(h.s[2].v[i])));
    }
}
END_TEST

/* ggml's angles are a float recurrence theta_{i+1} = theta_i * theta_scale from the position,
 * not pos * theta_scale^i: at position 30000 the two differ by far more than the output's
 * tolerance allows, so the reference must follow the recurrence exactly. */
START_TEST(angle_recurrence_exact) {
    ts_hands h = {.s = {{.name = "x"}, {.name = "p", .iv = {30000}}, {.name = "y"}}, .ns = 3};
    for (int i = 0; i < 128; i++) h.s[0].v[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    ts_hands_run("input x: f32[128]\ninput p: i32[1]\noutput y = rope_ext(x, p, n_dims=128, mode=2)\n", &h);
    const float ts = (float)pow(10000.0, (double)(-2.0f / 128.0f));
    float       t = 30000.0f;
    int         far = 0;
    for (int i = 0; i < 64; i++) {
        const float *x = h.s[0].v;
        const float  c = cosf(t), s = sinf(t);
        const float  y0 = x[i] * c - x[i + 64] * s, y1 = x[i] * s + x[i + 64] * c;
        ck_assert_float_eq(h.s[2].v[i], y0);
        ck_assert_float_eq(h.s[2].v[i + 64], y1);
        if (fabs((double)t - 30000.0 * pow((double)ts, i)) > 1e-3) far++;
        t *= ts;
    }
    ck_assert_int_gt(far, 0); /* the recurrence is not the closed form */
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------------- */

static void expect_error(const char *text, kiln_code code, const char *const *needles) {
    ts_parse_error(text, code, needles);
}

#define DECL "input x: f32[8, 2, 3]\ninput p: i32[3]\ninput q: i32[12]\ninput pf: f32[3]\n"

START_TEST(errors) {
    expect_error("input x: i32[8, 2, 3]\ninput p: i32[3]\noutput y = rope_ext(x, p, n_dims=8)\n", KILN_ERR_SHAPE,
                 (const char *[]){"bad.kg:3", "rope_ext", "'x'", "i32[8, 2, 3]", "f32, f16 or bf16", NULL});
    expect_error(DECL "output y = rope_ext(x, pf, n_dims=8)\n", KILN_ERR_SHAPE,
                 (const char *[]){"rope_ext", "'pf'", "f32[3]", "i32 vector of 3", NULL});
    expect_error(DECL "output y = rope_ext(x, q, n_dims=8)\n", KILN_ERR_SHAPE,
                 (const char *[]){"'q'", "i32[12]", "vector of 3", NULL});
    expect_error(DECL "output y = rope_ext(x, p, n_dims=8, mode=8, sections=[1, 1, 1, 0])\n", KILN_ERR_SHAPE,
                 (const char *[]){"'p'", "vector of 12", "4 per token", NULL});
    expect_error("input x: f32[8, 2, 3]\ninput p: i32[3, 2]\noutput y = rope_ext(x, p, n_dims=8)\n", KILN_ERR_SHAPE,
                 (const char *[]){"'p'", "i32[3, 2]", NULL});
    expect_error(DECL "output y = rope_ext(x, p, n_dims=7)\n", KILN_ERR_SHAPE,
                 (const char *[]){"n_dims 7", "even", "'x'", NULL});
    expect_error(DECL "output y = rope_ext(x, p, n_dims=10)\n", KILN_ERR_SHAPE, (const char *[]){"n_dims 10", NULL});
    expect_error(DECL "output y = rope_ext(x, p, n_dims=-2)\n", KILN_ERR_SHAPE, (const char *[]){"n_dims -2", NULL});
    expect_error(DECL "output y = rope_ext(x, p, n_dims=8, mode=1)\n", KILN_ERR_INVALID,
                 (const char *[]){"mode 1", "neox", "imrope", NULL});
    expect_error(DECL "output y = rope_ext(x, p, n_dims=8, mode=10)\n", KILN_ERR_INVALID, (const char *[]){"mode 10", NULL});
    expect_error(DECL "input f: f16[4]\noutput y = rope_ext(x, p, f, 8)\n", KILN_ERR_SHAPE,
                 (const char *[]){"freq_factors", "'f'", "f16[4]", "f32", NULL});
    expect_error(DECL "input f: f32[3]\noutput y = rope_ext(x, p, f, 8)\n", KILN_ERR_SHAPE,
                 (const char *[]){"freq_factors", "ne0 >= 4", NULL});
    expect_error(DECL "input f: f32[2]\noutput y = rope_ext(x, q, f, 4, mode=24, sections=[1, 1, 0, 0])\n",
                 KILN_ERR_SHAPE, (const char *[]){"freq_factors", "ne0 >= 4", "vision", NULL});
    expect_error(DECL "output y = rope_ext(x, q, n_dims=2, mode=24, sections=[1, 1, 0, 0])\n", KILN_ERR_SHAPE,
                 (const char *[]){"vision", "n_dims == ne0 / 2", NULL});
    expect_error(DECL "output y = rope_ext(x, q, n_dims=8, mode=8)\n", KILN_ERR_INVALID,
                 (const char *[]){"mrope", "sections", NULL});
    expect_error(DECL "output y = rope_ext(x, q, n_dims=8, mode=40, sections=[0, 0, 0, 4])\n", KILN_ERR_INVALID,
                 (const char *[]){"sections", "first three", NULL});
    expect_error(DECL "output y = rope_ext(x, q, n_dims=8, mode=8, sections=[4, 4, 4, 0])\n", KILN_ERR_SHAPE,
                 (const char *[]){"sum to 12", "head_dim 8", NULL});
    expect_error(DECL "output y = rope_ext(x, q, n_dims=8, mode=8, sections=[4, -1, 1, 0])\n", KILN_ERR_INVALID,
                 (const char *[]){"negative", NULL});

    /* The C API records the same errors. */
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[3] = {8, 2, 3}, np[1] = {3};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 3, ne);
    kiln_tensor *p = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "p", 1, np);
    ck_assert_ptr_null(kiln_rope_ext(ctx, x, p, NULL, 5, 0, 0, 10000, 1, 0, 1, 32, 1));
    ts_ctx_error(ctx, KILN_ERR_SHAPE, "rope_ext");
}
END_TEST

/* Results keep a's shape and type; the builders store every parameter. */
START_TEST(result_shape_and_params) {
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[4] = {64, 4, 5, 2}, np[1] = {20};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_BF16, "x", 4, ne);
    kiln_tensor *p = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "p", 1, np);
    const int    sec[4] = {8, 12, 12, 0};
    kiln_tensor *y = kiln_rope_multi(ctx, x, p, NULL, 64, sec, KILN_ROPE_MROPE, 4096, 500000, 0.25f, 1, 1,
                                     32, 1);
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(kiln_tensor_type(y), KILN_BF16);
    for (int d = 0; d < 4; d++) ck_assert_int_eq(kiln_tensor_ne(y, d), ne[d]);
    ck_assert_int_eq(y->ip[0], 64);
    ck_assert_int_eq(y->ip[1], 8);
    ck_assert_int_eq(y->ip[2], 4096);
    ck_assert_int_eq(y->ip[4], 12);
    ck_assert_float_eq(y->fp[0], 500000);
    ck_assert_float_eq(y->fp[1], 0.25f);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- kernels: generated and compiled ------------------------------------------------------------ */

/* Each graph has one rope_ext; together they cover every mode, the vector and element paths,
 * registers and chunked caches, partial rotation, freq_factors, YaRN, strided/permuted/offset
 * operands (a K view of a fused QKV tensor), every type, 4-D tensors, split head groups and
 * 64-bit offsets. `want` is a string the source must contain. */
static const struct {
    const char *kg;
    const char *want;
} CASES[] = {
    {"input x: f32[128, 32, 4096]\ninput p: i32[4096]\noutput y = rope_ext(x, p, n_dims=128, mode=2)\n", "kiln_rope_f32x4"},
    {"input x: bf16[128, 32, 4096]\ninput p: i32[4096]\noutput y = rope_ext(x, p, n_dims=128, mode=2)\n", "kiln_rope_u16x8"},
    {"input x: f16[128, 8, 7]\ninput p: i32[7]\noutput y = rope_ext(x, p, n_dims=128)\n", "kiln_rope_u16x8"},
    {"input x: f32[128, 8, 7]\ninput p: i32[7]\noutput y = rope_ext(x, p, n_dims=128, mode=0)\n", "(2i, 2i+1)"},
    {"input x: f32[7, 3, 5]\ninput p: i32[5]\noutput y = rope_ext(x, p, n_dims=6)\n", "elements 6..6 copied"},
    {"input x: f32[1, 1, 1]\ninput p: i32[1]\noutput y = rope_ext(x, p, n_dims=0)\n", "elements 0..0 copied"},
    {"input x: f16[6, 2, 3]\ninput p: i32[3]\noutput y = rope_ext(x, p, n_dims=6, mode=2)\n", "element by element"},
    {"input x: f32[80, 16, 9]\ninput p: i32[9]\ninput f: f32[16]\noutput y = rope_ext(x, p, f, 32, 2)\n",
     "__fdiv_rn(theta, ff["},
    {"input x: f32[64, 4, 33]\ninput p: i32[33]\n"
     "output y = rope_ext(x, p, n_dims=64, n_ctx_orig=2048, freq_scale=0.25, ext_factor=1, attn_factor=0.9)\n",
     "rmax"},
    {"input x: bf16[96, 8, 17]\ninput p: i32[17]\ninput f: f32[48]\n"
     "output y = rope_ext(x, p, f, 96, 2, 8192, freq_base=500000, freq_scale=0.125, ext_factor=0.5, beta_fast=16)\n",
     "mix"},
    {"input x: f32[128, 16, 10]\ninput p: i32[40]\noutput y = rope_ext(x, p, n_dims=128, mode=8, sections=[16, 24, 24, 0])\n",
     "theta = tw"},
    {"input x: bf16[128, 16, 10]\ninput p: i32[40]\noutput y = rope_ext(x, p, n_dims=128, mode=40, sections=[24, 20, 20, 0])\n",
     "s % 3 == 1"},
    {"input x: f16[80, 16, 12]\ninput p: i32[48]\noutput y = rope_ext(x, p, n_dims=40, mode=24, sections=[10, 10, 0, 0])\n",
     "if (s == 10) th = ph"},
    {"input x: f32[64, 3, 5]\ninput p: i32[20]\ninput f: f32[32]\n"
     "output y = rope_ext(x, p, f, 32, 24, sections=[8, 8, 0, 0], ext_factor=1, n_ctx_orig=1024)\n",
     "restart"},
    {"input x: f32[12, 2, 3]\ninput p: i32[12]\noutput y = rope_ext(x, p, n_dims=10, mode=8, sections=[2, 1, 1, 1])\n",
     "elements 10..11 copied"},
    /* a K view of a fused QKV tensor (32 q heads, 8 k heads, 8 v heads) */
    {"input qkv: f32[128, 48, 64]\ninput p: i32[64]\nk = view(qkv, [128, 8, 64], [512, 24576], 16384)\n"
     "output y = rope_ext(k, p, n_dims=128, mode=2)\n",
     "p1 + 4096"},
    {"input qkv: bf16[128, 48, 64]\ninput p: i32[64]\nk = view(qkv, [128, 8, 64], [256, 12288], 8196)\n"
     "output y = rope_ext(k, p, n_dims=128, mode=2)\n",
     "kiln_rope_u16x2"},
    {"input x: f32[32, 128, 64]\ninput p: i32[64]\nt = permute(x, 1, 0, 2, 3)\noutput y = rope_ext(t, p, n_dims=128, mode=2)\n",
     "* 32u"},
    {"input x: f16[64, 128, 8]\ninput p: i32[64]\nt = permute(x, 2, 0, 1, 3)\noutput y = rope_ext(t, p, n_dims=96, mode=0)\n",
     "element by element"},
    {"input x: f32[4100, 2, 3]\ninput p: i32[3]\noutput y = rope_ext(x, p, n_dims=4098)\n", "2 chunks of 2048"},
    {"input x: f16[8192, 1, 2]\ninput p: i32[2]\noutput y = rope_ext(x, p, n_dims=8192, mode=2)\n", "2 chunks"},
    {"input x: f32[128, 32, 1]\ninput p: i32[1]\noutput y = rope_ext(x, p, n_dims=128, mode=2)\n", "head groups of 4"},
    {"input x: f32[128, 33, 2]\ninput p: i32[2]\noutput y = rope_ext(x, p, n_dims=128, mode=2)\n", "nh"},
    {"input x: f32[64, 4, 5, 3]\ninput p: i32[5]\noutput y = rope_ext(x, p, n_dims=64, mode=2)\n", "tok / 5u"},
    {"input pp: i32[2, 16]\ninput x: f32[64, 2, 16]\nq = view(pp, [16], [], 4)\noutput y = rope_ext(x, q, n_dims=64, mode=2)\n",
     "(const int *)p2 + 1"},
    {"input x: f32[128, 32, 600000]\ninput p: i32[600000]\noutput y = rope_ext(x, p, n_dims=128, mode=2)\n", "64-bit"},
};

START_TEST(kernels_compile) { ts_one_kernel_case(_i, CASES[_i].kg, CASES[_i].want, "rope_case"); }
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_rope",
                        TS_CASE("reference", 0),
                        TS_TESTS(normal_by_hand, neox_by_hand, freq_factors_scale_attn_by_hand, yarn_by_hand,
                                 mrope_imrope_by_hand, vision_by_hand, views_by_hand, low_precision_by_hand,
                                 angle_recurrence_exact),
                        TS_CASE("frontend", 0), TS_TESTS(errors, result_shape_and_params),
                        TS_CASE("kernels", 120), TS_LOOP(0, (int)(sizeof CASES / sizeof CASES[0]), kernels_compile));
    return ts_main(s);
}
