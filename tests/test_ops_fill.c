/* The fill family (arange, fill, diag_mask_inf, tri): shape rules and errors, the CPU reference
 * against values worked out by hand from ggml's definitions, and every kernel generated and
 * compiled by NVRTC for sm_90a and sm_80 (no GPU needed). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "frontend/frontend.h"

#include <math.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small reference harness: named host buffers in, named outputs back ------------------- */

/* Output `name` is n floats equal to want[] (bit for bit, -inf included). */
static void expect_f32(ts_buf *b, const char *name, const float *want, int64_t n) {
    ts_buf *t = ts_buf_find(b, name);
    ck_assert_msg(t->out, "no output %s", name);
    ck_assert_int_eq(t->type, KILN_F32);
    ck_assert_int_eq(t->n, n);
    for (int64_t i = 0; i < n; i++) {
        float got = ((const float *)t->out)[i];
        ck_assert_msg(memcmp(&got, &want[i], sizeof got) == 0, "%s[%lld] = %.9g, want %.9g", name,
                      (long long)i, (double)got, (double)want[i]);
    }
}

/* ---- shape rules and errors ------------------------------------------------------------------ */

static kiln_tensor *node(kiln_ctx *ctx, const char *name) {
    kiln_tensor *t = fe_find(ctx, name);
    ck_assert_ptr_nonnull(t);
    return t;
}

START_TEST(shapes) {
    kiln_ctx *ctx = ts_parse("input a: f16[5, 5, 3]\ninput b: bf16[7, 2]\n"
                             "r1 = arange(0, 10, 3)\nr2 = arange(1.5, 3, 0.5)\nr3 = arange(0.5, 1.6, 0.1)\n"
                             "r4 = arange(-2, 2.5, 1)\n"
                             "f = fill(b, 3)\nm = diag_mask_inf(a, 2)\nt = tri(a, lower_diag)\n");
    static const struct {
        const char *name;
        int64_t     n0;
    } ar[] = {{"r1", 4}, {"r2", 3}, {"r3", 11}, {"r4", 5}};
    for (size_t i = 0; i < sizeof ar / sizeof ar[0]; i++) {
        kiln_tensor *t = node(ctx, ar[i].name);
        ck_assert_int_eq(kiln_tensor_type(t), KILN_F32);
        ck_assert_int_eq(kiln_tensor_ne(t, 0), ar[i].n0);
        ck_assert_int_eq(kiln_tensor_nelements(t), ar[i].n0);
    }
    kiln_tensor *f = node(ctx, "f"), *m = node(ctx, "m"), *t = node(ctx, "t");
    ck_assert_int_eq(kiln_tensor_type(f), KILN_BF16);
    ck_assert_int_eq(kiln_tensor_ne(f, 0), 7);
    ck_assert_int_eq(kiln_tensor_ne(f, 1), 2);
    ck_assert_int_eq(kiln_tensor_type(m), KILN_F16);
    ck_assert_int_eq(kiln_tensor_ne(m, 2), 3);
    ck_assert_int_eq(kiln_tensor_type(t), KILN_F16);
    ck_assert_int_eq(kiln_tensor_nelements(t), 75);
    /* ggml_tri_type order: upper_diag = 0, upper = 1, lower_diag = 2, lower = 3 */
    ck_assert_int_eq(t->ip[0], 2);
    ck_assert_int_eq(KILN_TRI_UPPER_DIAG, 0);
    ck_assert_int_eq(KILN_TRI_UPPER, 1);
    ck_assert_int_eq(KILN_TRI_LOWER_DIAG, 2);
    ck_assert_int_eq(KILN_TRI_LOWER, 3);
    ck_assert_int_eq(m->ip[0], 2);
    ck_assert_float_eq(f->fp[0], 3.0f);
    kiln_ctx_free(ctx);

    /* The C builders give the same. */
    ctx = kiln_ctx_new();
    int64_t      ne[2] = {4, 4};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
    kiln_tensor *u = kiln_tri(ctx, x, KILN_TRI_UPPER);
    kiln_tensor *r = kiln_arange(ctx, 0.0f, 1.0f, 0.25f);
    ck_assert_ptr_nonnull(u);
    ck_assert_int_eq(u->ip[0], 1);
    ck_assert_int_eq(kiln_tensor_ne(r, 0), 4);
    char *text;
    kiln_set_output(ctx, u, "u");
    TS_OK(kiln_print(ctx, &text));
    ck_assert_msg(strstr(text, "tri(x, upper)"), "%s", text);
    free(text);
    kiln_ctx_free(ctx);
}
END_TEST

/* The first error of parsing text: its code and a fragment of its message. */
static void expect_error(const char *kg, kiln_code code, const char *needle) {
    ts_parse_error(kg, code, TS_NEEDLES(needle));
}

START_TEST(errors) {
    expect_error("r = arange(3, 3, 1)\n", KILN_ERR_INVALID, "stop (3) must be greater than start (3)");
    expect_error("r = arange(5, 1, -1)\n", KILN_ERR_INVALID, "greater than start");
    expect_error("r = arange(0, 1, -0.5)\n", KILN_ERR_INVALID, "step is -0.5");
    expect_error("r = arange(0, 1, 0)\n", KILN_ERR_INVALID, "must be > 0");
    expect_error("r = arange(0, 1e30, 1e-30)\n", KILN_ERR_INVALID, "between 1 and 2^48");
    expect_error("r = arange(0, inf, 1)\n", KILN_ERR_INVALID, "must be finite");
    expect_error("input a: f32[4, 4]\nm = diag_mask_inf(a, -1)\n", KILN_ERR_INVALID, "n_past is -1");
    expect_error("input a: f32[4, 3]\nt = tri(a, lower)\n", KILN_ERR_SHAPE, "'a' (f32[4, 3]) must be square");
    expect_error("input a: i32[4, 4]\nt = tri(a, lower)\n", KILN_ERR_SHAPE, "must be f32, f16 or bf16");
    expect_error("input a: i32[4]\nt = fill(a, 1)\n", KILN_ERR_SHAPE, "fill: operand 'a' is i32[4]");
    expect_error("input a: i64[4]\nt = diag_mask_inf(a, 0)\n", KILN_ERR_SHAPE, "diag_mask_inf");
    expect_error("input a: f32[4, 4]\nt = tri(a, diagonal)\n", KILN_ERR_PARSE, "upper_diag");

    /* A tri type outside the enum through the C API. */
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[2] = {3, 3};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
    ck_assert_ptr_null(kiln_tri(ctx, x, (kiln_tri_type)7));
    ts_ctx_error(ctx, KILN_ERR_INVALID, "tri: type 7");
}
END_TEST

/* ---- the reference, by hand -------------------------------------------------------------------- */

START_TEST(reference_arange_fill) {
    static const float    q[6] = {1, 2, 3, 4, 5, 6};
    static const uint16_t hq[4] = {0, 0, 0, 0};
    ts_buf all[] = {{.name = "q", .type = KILN_F32, .data = q}, {.name = "hq", .type = KILN_F16, .data = hq},
                  {.name = "r1"}, {.name = "r2"}, {.name = "r3"}, {.name = "f"}, {.name = "h"}, {.name = "z"},
                  {.name = NULL}};
    ts_reference("input q: f32[3, 2]\ninput hq: f16[4]\n"
            "output r1 = arange(0, 10, 3)\noutput r2 = arange(-1, 1, 0.5)\n"
            "output r3 = arange(0.5, 1.6, 0.1)\n"
            "output f = fill(q, -2.5)\noutput h = fill(hq, 0.1)\noutput z = fill(q, 0)\n",
            all);
    const float r1[4] = {0, 3, 6, 9};
    const float r2[4] = {-1, -0.5f, 0, 0.5f};
    expect_f32(all, "r1", r1, 4);
    expect_f32(all, "r2", r2, 4);
    /* The count is computed in f32 as ggml does: (1.6f - 0.5f) / 0.1f rounds to exactly 11.0f, so
     * 11 elements (in exact arithmetic the quotient is 11.00000007 and the ceiling 12). Each value
     * is start + step * i with both operations rounded to f32. */
    float r3[11];
    for (int i = 0; i < 11; i++) {
        volatile float prod = 0.1f * (float)i;
        r3[i] = 0.5f + prod;
    }
    ck_assert_float_eq(r3[1], 0.6f);
    ck_assert_float_eq(r3[2], 0.699999988f);
    ck_assert_float_eq(r3[10], 1.5f);
    expect_f32(all, "r3", r3, 11);
    const float f[6] = {-2.5f, -2.5f, -2.5f, -2.5f, -2.5f, -2.5f};
    const float z[6] = {0, 0, 0, 0, 0, 0};
    expect_f32(all, "f", f, 6);
    expect_f32(all, "z", z, 6);
    /* f16 fill: 0.1 rounds to 0x2e66 = 0.0999755859375 */
    ts_buf *h = ts_buf_find(all, "h");
    ck_assert_int_eq(h->type, KILN_F16);
    ck_assert_int_eq(h->n, 4);
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(((const uint16_t *)h->out)[i], 0x2e66);
    ts_buf_free(all);
}
END_TEST

START_TEST(reference_masks) {
    /* a: [4, 3, 2], a[i0, i1, i2] = 100 i2 + 10 i1 + i0 */
    float a[24];
    for (int i2 = 0; i2 < 2; i2++)
        for (int i1 = 0; i1 < 3; i1++)
            for (int i0 = 0; i0 < 4; i0++) a[i2 * 12 + i1 * 4 + i0] = (float)(100 * i2 + 10 * i1 + i0);
    /* s: [3, 3], s[i0, i1] = 1 + i0 + 3 i1 (1..9) */
    static const float s[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    ts_buf all[] = {{.name = "a", .type = KILN_F32, .data = a}, {.name = "s", .type = KILN_F32, .data = s},
                  {.name = "m0"}, {.name = "m1"}, {.name = "m9"}, {.name = "ud"}, {.name = "u"},
                  {.name = "ld"}, {.name = "l"},  {.name = "lt"}, {.name = NULL}};
    ts_reference("input a: f32[4, 3, 2]\ninput s: f32[3, 3]\n"
            "output m0 = diag_mask_inf(a, 0)\noutput m1 = diag_mask_inf(a, 1)\noutput m9 = diag_mask_inf(a, 9)\n"
            "output ud = tri(s, upper_diag)\noutput u = tri(s, upper)\noutput ld = tri(s, lower_diag)\n"
            "output l = tri(s, lower)\nst = transpose(s)\noutput lt = tri(st, lower)\n",
            all);
    const float I = INFINITY;
    /* row i1 keeps columns i0 <= n_past + i1; every ne2 matrix alike */
    const float m0[24] = {0,   -I,  -I,  -I,  10,  11,  -I,  -I,  20,  21,  22,  -I,
                          100, -I,  -I,  -I,  110, 111, -I,  -I,  120, 121, 122, -I};
    const float m1[24] = {0,   1,   -I,  -I,  10,  11,  12,  -I,  20,  21,  22,  23,
                          100, 101, -I,  -I,  110, 111, 112, -I,  120, 121, 122, 123};
    expect_f32(all, "m0", m0, 24);
    expect_f32(all, "m1", m1, 24);
    expect_f32(all, "m9", a, 24);
    /* s as rows:  [1 2 3] / [4 5 6] / [7 8 9]  (row i1, column i0) */
    const float ud[9] = {1, 2, 3, 0, 5, 6, 0, 0, 9};
    const float u[9] = {0, 2, 3, 0, 0, 6, 0, 0, 0};
    const float ld[9] = {1, 0, 0, 4, 5, 0, 7, 8, 9};
    const float l[9] = {0, 0, 0, 4, 0, 0, 7, 8, 0};
    /* transpose(s) as rows: [1 4 7] / [2 5 8] / [3 6 9] */
    const float lt[9] = {0, 0, 0, 2, 0, 0, 3, 6, 0};
    expect_f32(all, "ud", ud, 9);
    expect_f32(all, "u", u, 9);
    expect_f32(all, "ld", ld, 9);
    expect_f32(all, "l", l, 9);
    expect_f32(all, "lt", lt, 9);
    ts_buf_free(all);
}
END_TEST

/* f16 and bf16 values are copied exactly; masked ones are -inf and +0 of the type. */
START_TEST(reference_masks_low_precision) {
    uint16_t h[4] = {0x3c00, 0x4000, 0x4200, 0x4400}; /* f16 1 2 3 4, as [2, 2] */
    uint16_t bf[4] = {0x3f80, 0x4000, 0x4040, 0x4080}; /* bf16 1 2 3 4 */
    ts_buf     all[] = {{.name = "h", .type = KILN_F16, .data = h}, {.name = "b", .type = KILN_BF16, .data = bf},
                      {.name = "mh"}, {.name = "tb"}, {.name = NULL}};
    ts_reference("input h: f16[2, 2]\ninput b: bf16[2, 2]\noutput mh = diag_mask_inf(h, 0)\n"
            "output tb = tri(b, upper)\n",
            all);
    const uint16_t mh[4] = {0x3c00, 0xfc00, 0x4200, 0x4400};
    const uint16_t tb[4] = {0, 0x4000, 0, 0};
    ts_buf          *t = ts_buf_find(all, "mh");
    ck_assert_int_eq(t->type, KILN_F16);
    ck_assert_mem_eq(t->out, mh, sizeof mh);
    t = ts_buf_find(all, "tb");
    ck_assert_int_eq(t->type, KILN_BF16);
    ck_assert_mem_eq(t->out, tb, sizeof tb);
    ts_buf_free(all);
}
END_TEST

/* ---- kernels: generated and compiled for sm_90a and sm_80 --------------------------------------- */

/* A graph of many fill-family outputs over a spread of shapes, types and layouts. */
static char *spread_graph(void) {
    kb_str g = {0};
    static const char *types[] = {"f32", "f16", "bf16"};
    static const char *tris[] = {"upper_diag", "upper", "lower_diag", "lower"};
    static const int64_t sq[] = {1, 2, 7, 8, 64, 129};
    int k = 0;
    for (int t = 0; t < 3; t++) {
        const char *ty = types[t];
        for (size_t s = 0; s < sizeof sq / sizeof sq[0]; s++) {
            int64_t n = sq[s];
            kb_str_addf(&g, "input a%d: %s[%lld, %lld, 3]\n", k, ty, (long long)n, (long long)n);
            kb_str_addf(&g, "output y%d_t = tri(a%d, %s)\n", k, k, tris[(s + (size_t)t) % 4]);
            kb_str_addf(&g, "output y%d_m = diag_mask_inf(a%d, %d)\n", k, k, (int)(s % 3));
            kb_str_addf(&g, "output y%d_f = fill(a%d, -1.25)\n", k, k);
            /* permuted (transposed) and viewed operands */
            kb_str_addf(&g, "p%d = permute(a%d, 1, 0, 2, 3)\noutput y%d_tp = tri(p%d, %s)\n", k, k, k, k,
                        tris[(s + 1) % 4]);
            kb_str_addf(&g, "output y%d_mp = diag_mask_inf(p%d, 1)\n", k, k);
            k++;
        }
        /* a view with an offset (unaligned rows), and one with 16-byte aligned padded rows */
        kb_str_addf(&g, "input w%d: %s[10, 9]\nv%d = view(w%d, [8, 8], [%d], %d)\n", t, ty, t, t,
                    10 * (t == 0 ? 4 : 2), t == 0 ? 4 : 2);
        kb_str_addf(&g, "output yv%d = tri(v%d, lower)\noutput yw%d = diag_mask_inf(v%d, 3)\n", t, t, t, t);
        kb_str_addf(&g, "input x%d: %s[16, 8, 2, 2]\nxv%d = view(x%d, [8, 8, 2, 2], [%d, %d, %d], 0)\n", t, ty, t,
                    t, 16 * (t == 0 ? 4 : 2), 128 * (t == 0 ? 4 : 2), 256 * (t == 0 ? 4 : 2));
        kb_str_addf(&g, "output yx%d = tri(xv%d, upper)\n", t, t);
        /* fill with tails: counts not divisible by the vector width */
        kb_str_addf(&g, "input o%d: %s[4097, 3]\noutput yo%d = fill(o%d, 7)\n", t, ty, t, t);
    }
    kb_str_addf(&g, "output r0 = arange(0, 4097, 1)\noutput r1 = arange(-3, 5, 0.37)\noutput r2 = arange(0, 1, 1)\n");
    kb_str_addf(&g, "output r3 = arange(1, 1000000, 0.5)\n");
    return kb_str_take(&g);
}

/* Only the family's own kernels (the graph has no elementwise node), each clean with NVRTC. */
static void fill_kernel_clean(const kiln_program *p, int i) {
    const char *src = kiln_program_kernel_source(p, i), *name = kiln_program_kernel_name(p, i);
    ck_assert_msg(strstr(src, "#include") == NULL, "%s includes", name);
    ck_assert_msg(!strncmp(name, "tri_", 4) || !strncmp(name, "diag_mask_inf_", 14) || !strncmp(name, "fill_", 5) ||
                      !strncmp(name, "arange_", 7),
                  "unexpected kernel %s", name);
    ts_nvrtc_clean(src, name, NULL);
}

START_TEST(kernels_compile) {
    char *text = spread_graph();
    ts_spread_compile(text, 0, 60, fill_kernel_clean);
    free(text);
}
END_TEST

/* Sources are deterministic and pick the vector path where the layout allows it. */
START_TEST(kernel_shapes) {
    kiln_ctx *ctx;
    kiln_graph *g = ts_build("input a: f32[64, 64]\ninput h: f16[7, 7]\ninput q: f32[64, 64]\n"
                             "output y1 = tri(a, lower)\noutput y2 = diag_mask_inf(h, 2)\n"
                             "t = transpose(q)\noutput y3 = tri(t, upper)\noutput y4 = arange(0, 10, 0.3)\n"
                             "output y5 = fill(h, 1)\n", &ctx);
    kiln_compile_opts o = {.skip_nvrtc = 1};
    kiln_program     *p1, *p2;
    TS_OK(kiln_compile(g, &o, &p1));
    TS_OK(kiln_compile(g, &o, &p2));
    ck_assert_int_eq(kiln_program_kernel_count(p1), 5);
    for (int i = 0; i < 5; i++) ck_assert_str_eq(kiln_program_kernel_source(p1, i), kiln_program_kernel_source(p2, i));
    const char *s = kiln_program_kernel_source(p1, 0);
    ck_assert_str_eq(kiln_program_kernel_name(p1, 0), "tri_lower_f32_64");
    ck_assert_msg(strstr(s, "const kiln_f32x4 v = *(const kiln_f32x4 *)(in0 + e);"), "%s", s);
    s = kiln_program_kernel_source(p1, 1); /* ne0 = 7: one f16 per thread */
    ck_assert_msg(strstr(s, "out[e] = i0 <= i1 + 2u ? in0[e] : (unsigned short)0xfc00u;"), "%s", s);
    s = kiln_program_kernel_source(p1, 2); /* transposed: element loads, only of kept elements */
    ck_assert_msg(strstr(s, "in0[(i0 + k) * 64u + i1]"), "%s", s);
    s = kiln_program_kernel_source(p1, 3);
    ck_assert_msg(strstr(s, "__fadd_rn(0.0f, __fmul_rn(0.3f, (float)(e + k)))"), "%s", s);
    ck_assert_msg(strstr(s, "if (e + 4u <= 34u)"), "%s", s);
    s = kiln_program_kernel_source(p1, 4);
    ck_assert_msg(strstr(s, "kiln_f32_to_f16(1.0f)"), "%s", s);
    kiln_program_free(p1);
    ts_compiled_free(p2, g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_fill",
                        TS_CASE("fill", 120),
                        TS_TESTS(shapes, errors, reference_arange_fill, reference_masks, reference_masks_low_precision,
                                 kernels_compile, kernel_shapes));
    return ts_main(s);
}
