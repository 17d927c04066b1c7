/* The sort family (argsort, argsort_top_k, top_k): shape rules and errors, the CPU reference
 * against orders worked out by hand (ties, NaN, signed zeros, strided operands, f16/bf16, a
 * row of 2^17), the kernel shape each case gets, and every kernel generated and compiled by
 * NVRTC for sm_90a and sm_80 without warnings (no GPU needed). */
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

#define OUT(n) TS_OUT(n)

/* Output `name` is the n indices want[]. */
static void expect_i32(ts_buf *b, const char *name, const int32_t *want, int64_t n) {
    ts_buf *t = ts_buf_find(b, name);
    ck_assert_msg(t->out, "no output %s", name);
    ck_assert_int_eq(t->type, KILN_I32);
    ck_assert_int_eq(t->n, n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(((const int32_t *)t->out)[i] == want[i], "%s[%lld] = %d, want %d", name, (long long)i,
                      ((const int32_t *)t->out)[i], want[i]);
}

/* ---- shape rules and errors ------------------------------------------------------------------ */

START_TEST(shapes) {
    kiln_ctx *ctx = ts_parse("input a: f32[10, 3, 2]\ninput h: bf16[7]\n"
                             "s = argsort(a)\nd = argsort(a, order=desc)\nt = top_k(a, 4)\n"
                             "u = argsort_top_k(h, 7)\n");
    static const struct {
        const char *name;
        int64_t     ne[4];
    } want[] = {{"s", {10, 3, 2, 1}}, {"d", {10, 3, 2, 1}}, {"t", {4, 3, 2, 1}}, {"u", {7, 1, 1, 1}}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kiln_tensor *t = fe_find(ctx, want[i].name);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(kiln_tensor_type(t), KILN_I32);
        for (int d = 0; d < 4; d++) ck_assert_int_eq(kiln_tensor_ne(t, d), want[i].ne[d]);
    }
    ck_assert_int_eq(fe_find(ctx, "s")->ip[0], KILN_SORT_ASC);
    ck_assert_int_eq(fe_find(ctx, "d")->ip[0], KILN_SORT_DESC);
    ck_assert_int_eq(fe_find(ctx, "t")->ip[0], 4);
    kiln_ctx_free(ctx);

    /* The C builders take the same path. */
    ctx = kiln_ctx_new();
    int64_t      ne[2] = {5, 2};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F16, "a", 2, ne);
    kiln_tensor *s = kiln_argsort(ctx, a, KILN_SORT_DESC);
    kiln_tensor *k = kiln_top_k(ctx, a, 2);
    kiln_tensor *q = kiln_argsort_top_k(ctx, kiln_transpose(ctx, a), 1);
    ck_assert(s && k && q);
    ck_assert_int_eq(kiln_tensor_ne(s, 0), 5);
    ck_assert_int_eq(kiln_tensor_ne(k, 0), 2);
    ck_assert_int_eq(kiln_tensor_ne(k, 1), 2);
    ck_assert_int_eq(kiln_tensor_ne(q, 0), 1);
    ck_assert_int_eq(kiln_tensor_ne(q, 1), 5);
    kiln_ctx_free(ctx);
}
END_TEST

/* text must fail to parse with code and a message containing each of the needles. */
static void expect_error(const char *text, kiln_code code, const char *n1, const char *n2) {
    ts_parse_error(text, code, (const char *const[]){n1, n2, NULL});
}

START_TEST(errors) {
    expect_error("input a: i32[4]\ny = argsort(a)\n", KILN_ERR_SHAPE, "argsort: operand 'a'", "f32, f16 or bf16");
    expect_error("input a: i64[4, 2]\ny = top_k(a, 1)\n", KILN_ERR_SHAPE, "top_k", "i64[4, 2]");
    expect_error("input a: f32[4, 3]\ny = top_k(a, 5)\n", KILN_ERR_SHAPE, "top_k: k = 5 exceeds", "f32[4, 3]");
    expect_error("input a: f16[4]\ny = argsort_top_k(a, 9)\n", KILN_ERR_SHAPE, "argsort_top_k: k = 9", "'a'");
    expect_error("input a: f32[4]\ny = top_k(a, 0)\n", KILN_ERR_INVALID, "top_k: k is 0", "at least 1");
    expect_error("input a: f32[4]\ny = argsort_top_k(a, -3)\n", KILN_ERR_INVALID, "k is -3", NULL);
    expect_error("input a: f32[4]\ny = argsort(a, sideways)\n", KILN_ERR_PARSE, "sideways", NULL);

    /* The builders: the error is sticky and surfaces at kiln_graph_new. */
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[1] = {4};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "a", 1, ne);
    ck_assert_ptr_null(kiln_top_k(ctx, a, 5));
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_SHAPE);
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- the reference, by hand ------------------------------------------------------------------ */

START_TEST(reference_ties) {
    /* Row 0 [3, 1, 2, 1], row 1 [-1, 5, 5, 0]: equal values keep their index order in both
     * directions (a stable sort). */
    static const float a[8] = {3, 1, 2, 1, -1, 5, 5, 0};
    ts_buf b[] = {{"a", KILN_F32, a, NULL, 8}, OUT("s"), OUT("d"), OUT("t"), OUT("u"), {.name = NULL}};
    ts_reference("input a: f32[4, 2]\noutput s = argsort(a, asc)\noutput d = argsort(a, desc)\n"
            "output t = top_k(a, 2)\noutput u = argsort_top_k(a, 3)\n",
            b);
    static const int32_t s[8] = {1, 3, 2, 0, 0, 3, 1, 2};
    static const int32_t d[8] = {0, 2, 1, 3, 1, 2, 3, 0};
    static const int32_t t[4] = {0, 2, 1, 2};
    static const int32_t u[6] = {0, 2, 1, 1, 2, 3};
    expect_i32(b, "s", s, 8);
    expect_i32(b, "d", d, 8);
    expect_i32(b, "t", t, 4);
    expect_i32(b, "u", u, 6);
    ts_buf_free(b);
}
END_TEST

START_TEST(reference_special_values) {
    /* -0 equals +0 (index order), NaN sorts above +inf. */
    static const float a[6] = {NAN, -0.0f, 0.0f, -INFINITY, 1.0f, INFINITY};
    ts_buf b[] = {{"a", KILN_F32, a, NULL, 6}, OUT("s"), OUT("d"), OUT("t"), {.name = NULL}};
    ts_reference("input a: f32[6]\noutput s = argsort(a)\noutput d = argsort(a, desc)\noutput t = top_k(a, 1)\n", b);
    static const int32_t s[6] = {3, 1, 2, 4, 5, 0};
    static const int32_t d[6] = {0, 5, 4, 1, 2, 3};
    static const int32_t t[1] = {0};
    expect_i32(b, "s", s, 6);
    expect_i32(b, "d", d, 6);
    expect_i32(b, "t", t, 1);
    ts_buf_free(b);
}
END_TEST

START_TEST(reference_strided_and_half) {
    /* b is f32[2, 3]: rows (10, 20), (30, 5), (7, 8); t = transpose(b) has rows (10, 30, 7) and
     * (20, 5, 8). */
    static const float bv[6] = {10, 20, 30, 5, 7, 8};
    /* h = (0.5, -2, 0.5, 3, 1) as f16 and bf16 (all exact). */
    static const float hv[5] = {0.5f, -2, 0.5f, 3, 1};
    uint16_t h16[5], hb16[5];
    for (int i = 0; i < 5; i++) {
        h16[i] = kb_f32_to_f16(hv[i]);
        hb16[i] = kb_f32_to_bf16(hv[i]);
    }
    ts_buf b[] = {{"b", KILN_F32, bv, NULL, 6}, {"h", KILN_F16, h16, NULL, 5}, {"g", KILN_BF16, hb16, NULL, 5},
                OUT("s"), OUT("t"), OUT("hd"), OUT("ga"), OUT("gk"), {.name = NULL}};
    ts_reference("input b: f32[2, 3]\ninput h: f16[5]\ninput g: bf16[5]\ntr = transpose(b)\n"
            "output s = argsort(tr)\noutput t = top_k(tr, 2)\noutput hd = argsort(h, desc)\n"
            "output ga = argsort(g)\noutput gk = argsort_top_k(g, 2)\n",
            b);
    static const int32_t s[6] = {2, 0, 1, 1, 2, 0};
    static const int32_t t[4] = {1, 0, 0, 2};
    static const int32_t hd[5] = {3, 4, 0, 2, 1};
    static const int32_t ga[5] = {1, 0, 2, 4, 3};
    static const int32_t gk[2] = {3, 4};
    expect_i32(b, "s", s, 6);
    expect_i32(b, "t", t, 4);
    expect_i32(b, "hd", hd, 5);
    expect_i32(b, "ga", ga, 5);
    expect_i32(b, "gk", gk, 2);
    ts_buf_free(b);
}
END_TEST

START_TEST(reference_long_row) {
    /* a[i] = (i * 7919) mod 2^17 is a permutation of 0 .. 2^17 - 1 (7919 is odd), so the
     * ascending argsort lists the i with a[i] = 0, 1, 2, ... and the top 5 are the values
     * 2^17 - 1 .. 2^17 - 5. */
    enum { N = 131072 };
    float *a = malloc(N * sizeof *a);
    ck_assert_ptr_nonnull(a);
    for (int64_t i = 0; i < N; i++) a[i] = (float)((i * 7919) % N);
    ts_buf b[] = {{"a", KILN_F32, a, NULL, N}, OUT("s"), OUT("t"), {.name = NULL}};
    ts_reference("input a: f32[131072]\noutput s = argsort(a)\noutput t = top_k(a, 5)\n", b);
    const int32_t *s = ts_buf_find(b, "s")->out, *t = ts_buf_find(b, "t")->out;
    for (int64_t j = 0; j < N; j++) ck_assert_msg(a[s[j]] == (float)j, "s[%lld] = %d", (long long)j, s[j]);
    for (int j = 0; j < 5; j++) ck_assert_msg(a[t[j]] == (float)(N - 1 - j), "t[%d] = %d", j, t[j]);
    ts_buf_free(b);
    free(a);
}
END_TEST

/* ---- kernels: shapes, determinism, NVRTC ----------------------------------------------------- */

/* Generates the program of text without compiling. */
static kiln_program *generate(const char *text, kiln_ctx **ctx_out, kiln_graph **g_out) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(text, &ctx);
    kiln_compile_opts o = {.skip_nvrtc = 1, .cache_mode = KILN_CACHE_OFF};
    kiln_program     *p;
    TS_OK(kiln_compile(g, &o, &p));
    *ctx_out = ctx;
    *g_out = g;
    return p;
}

START_TEST(kernel_shapes) {
    static const struct {
        const char *stmt;
        const char *suffix;
    } cases[] = {
        {"input a: f32[256, 64]\noutput y = top_k(a, 8)\n", "top_k_f32_256_k8_warp"},
        {"input a: bf16[1024, 3]\noutput y = argsort_top_k(a, 32)\n", "_warp"},
        {"input a: f32[1024, 3]\noutput y = top_k(a, 33)\n", "_smem"},
        {"input a: f32[1025, 3]\noutput y = top_k(a, 1)\n", "_smem"},
        {"input a: f16[7, 9]\noutput y = argsort(a, desc)\n", "argsort_f16_7_desc_smem"},
        {"input a: f32[5632]\noutput y = argsort(a)\n", "_smem"},
        {"input a: f32[5633]\noutput y = argsort(a)\n", "argsort_f32_5633_asc_global"},
        {"input a: f32[131072, 2]\noutput y = argsort(a, desc)\n", "_global"},
        {"input a: f32[131072, 2]\noutput y = top_k(a, 131072)\n", "_global"},
        {"input a: f32[131072, 2]\noutput y = top_k(a, 8)\n", "top_k_f32_131072_k8_select"},
        {"input a: f32[131072, 2]\noutput y = top_k(a, 10000)\n", "_select"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_ctx     *ctx;
        kiln_graph   *g;
        kiln_program *p = generate(cases[i].stmt, &ctx, &g);
        ck_assert_int_eq(kiln_program_kernel_count(p), 1);
        const char *name = kiln_program_kernel_name(p, 0);
        ck_assert_msg(strstr(name, cases[i].suffix), "%s: kernel %s, want *%s*", cases[i].stmt, name,
                      cases[i].suffix);
        ts_compiled_free(p, g, ctx);
    }
}
END_TEST

/* A graph of many sort-family outputs over a spread of shapes, types, layouts and kernel shapes. */
static char *spread_graph(void) {
    kb_str g = {0};
    static const char *types[] = {"f32", "f16", "bf16"};
    for (int t = 0; t < 3; t++) {
        const char *ty = types[t];
        /* one of each kernel shape in every type */
        kb_str_addf(&g, "input m%d: %s[256, 9]\noutput ym%d = top_k(m%d, 8)\n", t, ty, t, t);
        kb_str_addf(&g, "input s%d: %s[33, 5, 2]\noutput ys%d = argsort(s%d, desc)\n", t, ty, t, t);
        kb_str_addf(&g, "input l%d: %s[131072]\noutput yl%d = argsort(l%d)\n", t, ty, t, t);
        kb_str_addf(&g, "input q%d: %s[9000, 2]\noutput yq%d = argsort_top_k(q%d, 32)\n", t, ty, t, t);
        if (t > 0) continue;
        /* f32: the rest of the spread */
        kb_str_addf(&g, "input a: f32[1]\noutput ya = argsort(a)\noutput yak = top_k(a, 1)\n");
        kb_str_addf(&g, "input b: f32[7, 3]\noutput yb = argsort(b)\noutput ybk = argsort_top_k(b, 7)\n");
        kb_str_addf(&g, "input c: f32[3, 7]\nct = transpose(c)\noutput yc = argsort(ct, desc)\n"
                        "output yck = top_k(ct, 2)\n");
        kb_str_addf(&g, "input d: f32[4, 2, 512]\ndp = permute(d, 1, 2, 0, 3)\noutput yd = top_k(dp, 32)\n"
                        "output yds = argsort(dp)\n");
        kb_str_addf(&g, "input e: f32[4100, 3]\nev = view(e, [4097, 3], [16400], 12)\noutput ye = argsort(ev)\n"
                        "output yek = top_k(ev, 100)\n");
        kb_str_addf(&g, "input f: f32[140000, 2]\nfv = view(f, [131073, 2], [560000], 4)\n"
                        "output yf = argsort(fv, desc)\noutput yfk = top_k(fv, 6000)\n"
                        "output yfa = argsort_top_k(fv, 131073)\n");
        kb_str_addf(&g, "input h: f32[2, 8, 3]\nhp = permute(h, 2, 0, 1, 3)\noutput yh = top_k(hp, 8)\n");
    }
    return kb_str_take(&g);
}

START_TEST(kernels_compile) {
    char       *text = spread_graph();
    char       *cache = ts_tmpdir();
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(text, &ctx);
    static const char *archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        kiln_compile_opts o = {.arch = archs[a], .cache_dir = cache};
        kiln_program     *p;
        TS_OK(kiln_compile(g, &o, &p));
        int nk = kiln_program_kernel_count(p);
        ck_assert_int_ge(nk, 20);
        for (int i = 0; i < nk; i++) {
            const char *src = kiln_program_kernel_source(p, i);
            ck_assert_ptr_null(strstr(src, "#include"));
            if (a == 0) ts_nvrtc_clean(src, kiln_program_kernel_name(p, i), NULL);
        }
        kiln_program_free(p);
    }
    ts_graph_free(g, ctx);
    ts_tmpdir_free(cache);
    free(text);
}
END_TEST

START_TEST(deterministic_sources) {
    char         *text = spread_graph();
    kiln_ctx     *c1, *c2;
    kiln_graph   *g1, *g2;
    kiln_program *p1 = generate(text, &c1, &g1), *p2 = generate(text, &c2, &g2);
    ck_assert_int_eq(kiln_program_kernel_count(p1), kiln_program_kernel_count(p2));
    for (int i = 0; i < kiln_program_kernel_count(p1); i++) {
        ck_assert_str_eq(kiln_program_kernel_source(p1, i), kiln_program_kernel_source(p2, i));
        ck_assert_str_eq(kiln_program_kernel_key(p1, i), kiln_program_kernel_key(p2, i));
    }
    kiln_program_free(p1);
    kiln_program_free(p2);
    kiln_graph_free(g1);
    ts_graph_free(g2, c1);
    kiln_ctx_free(c2);
    free(text);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_sort",
                        TS_CASE("sort", 120),
                        TS_TESTS(shapes, errors, reference_ties, reference_special_values, reference_strided_and_half,
                                 reference_long_row, kernel_shapes, kernels_compile, deterministic_sources));
    return ts_main(s);
}
