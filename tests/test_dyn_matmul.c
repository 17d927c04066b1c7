/* Symbolic dims in mul_mat and mul_mat_id (templates/matmul.lua, matmul_id.lua, epilogue.lua):
 * every plan that takes a symbolic dim generates and compiles with NVRTC for sm_90a and sm_80
 * without warnings, takes the run-time extents (kdims) as its last parameter, picks its plan from
 * the maximum (never the gemv for a symbolic N); the sources of one graph are identical for two
 * bound values (kiln compile --dim); what the templates do not support is refused with a message.
 * No GPU needed (tests/gpu/test_gpu_dyn_matmul.c runs them). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "ir/ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

typedef struct {
    const char *kg;
    const char *want;  /* a substring of some matmul source (the plan) */
    const char *dim;   /* the dim bound to two values in values_identical */
    int         v1, v2;
} dcase;

static const dcase CASES[] = {
    /* 0: prefill GEMM, symbolic N: conversion (valid columns only) + cuBLAS with n_dyn */
    {"dim n_tokens <= 512\nweight a: bf16[4096, 4096]\ninput b: f32[4096, n_tokens]\noutput y = mul_mat(a, b)\n",
     "mul_mat_cvt_bf16", "n_tokens", 7, 300},
    /* 1: small N max: the tensor-core tile */
    {"dim n <= 12\nweight a: bf16[256, 300]\ninput b: f32[256, n]\noutput y = mul_mat(a, b)\n", "mul_mat_mma_n12", "n", 1, 5},
    /* 2: f32 weights, K not a multiple of 4, strided b: the CUDA-core tile */
    {"dim n <= 9\nweight a: f32[100, 37]\ninput b: f32[n, 100]\nbt = transpose(b)\noutput y = mul_mat(a, bt)\n",
     "mul_mat_n9_f32", "n", 2, 8},
    /* 3: residual epilogue on a GEMM: the fallback's epilogue step skips the dead columns */
    {"dim n_tokens <= 64\nweight a: bf16[256, 1024]\ninput b: f32[256, n_tokens]\ninput r: f32[1024, n_tokens]\n"
     "m = mul_mat(a, b)\noutput y = add(m, r)\n",
     "mul_mat_epilogue_one", "n_tokens", 3, 40},
    /* 4: mul_mat_glu (paired) at prefill */
    {"dim n_tokens <= 40\nweight g: bf16[256, 1024]\nweight u: bf16[256, 1024]\ninput x: f32[256, n_tokens]\n"
     "gg = mul_mat(g, x)\nuu = mul_mat(u, x)\noutput y = swiglu(gg, uu)\n",
     "mul_mat_epilogue_pair", "n_tokens", 1, 33},
    /* 5: kq = mul_mat(k, q): symbolic M (n_kv) and N (n_tokens), GQA broadcast (r2 = 4) */
    {"dim n_kv <= 256\ndim n_tokens <= 16\ninput k: f16[64, n_kv, 8]\ninput q: f32[64, n_tokens, 32]\n"
     "output y = mul_mat(k, q)\n",
     "mul_mat_mma_n64", "n_kv", 1, 200},
    /* 6: kqv = mul_mat(v, kq): symbolic K (n_kv); K <= 256 fits one chunk of b, whose staging
     * and weight loads stop at the run-time K */
    {"dim n_kv <= 256\ndim n_tokens <= 16\ninput v: f16[n_kv, 64, 8]\ninput kq: f32[n_kv, n_tokens, 32]\n"
     "output y = mul_mat(v, kq)\n",
     "run-time K", "n_kv", 5, 77},
    /* 7: decode kq (N = 1): symbolic M in the tile */
    {"dim n_kv <= 256\ninput k: bf16[64, n_kv, 8]\ninput q: f32[64, 1, 32]\noutput y = mul_mat(k, q)\n",
     "mul_mat_mma_n4", "n_kv", 1, 255},
    /* 8: gemv with symbolic M and an epilogue */
    {"dim m <= 200\ninput a: bf16[256, m]\ninput b: f32[256]\ninput r: f32[m]\nx = mul_mat(a, b)\noutput y = add(x, r)\n",
     "mul_mat_gemv_ep", "m", 1, 150},
    /* 9: gemv shape with symbolic K: the tile takes it */
    {"dim n_kv <= 200\ninput a: f32[n_kv, 64]\ninput b: f32[n_kv]\noutput y = mul_mat(a, b)\n", "mul_mat_n1_f32", "n_kv", 3,
     100},
    /* 10: symbolic batch dim: broadcast a */
    {"dim nb <= 24\nweight a: f16[64, 100]\ninput b: f32[64, 7, nb]\noutput y = mul_mat(a, b)\n", "kiln_live", "nb", 1, 13},
    /* 11: symbolic batch dim shared by a and b */
    {"dim nb <= 24\ninput a: f32[64, 100, nb]\ninput b: f32[64, 7, nb]\noutput y = mul_mat(a, b)\n", "kiln_live", "nb", 2,
     24},
    /* 12: mul_mat_id prefill (tensor cores) with a residual epilogue, symbolic T */
    {"dim n_tokens <= 40\nweight w: bf16[256, 128, 16]\ninput x: f32[256, 1, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "input r: f32[128, 4, n_tokens]\nm = mul_mat_id(w, x, ids)\noutput y = add(m, r)\n",
     "kiln_n", "n_tokens", 5, 39},
    /* 13: mul_mat_id prefill (FMA) */
    {"dim n_tokens <= 40\nweight w: f32[256, 128, 16]\ninput x: f32[256, 2, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "output y = mul_mat_id(w, x, ids)\n",
     "mul_mat_id_fma", "n_tokens", 1, 40},
    /* 14: mul_mat_id decode shape (T <= 4): the gemv */
    {"dim n_tokens <= 4\nweight w: bf16[256, 128, 16]\ninput x: f32[256, 4, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "output y = mul_mat_id(w, x, ids)\n",
     "mul_mat_id_gemv", "n_tokens", 1, 3},
    /* 15: mul_mat_id paired (mul_mat_glu) at prefill */
    {"dim n_tokens <= 40\nweight g: bf16[256, 128, 16]\nweight u: bf16[256, 128, 16]\ninput x: f32[256, 1, n_tokens]\n"
     "input ids: i32[4, n_tokens]\ngg = mul_mat_id(g, x, ids)\nuu = mul_mat_id(u, x, ids)\noutput y = swiglu(gg, uu)\n",
     "mul_mat_id_epilogue_pair", "n_tokens", 2, 17},
    /* 16: kqv with a long symbolic K (n_kv <= 4096): several chunks, the loop stops at the
     * chunks of the run-time K */
    {"dim n_kv <= 4096\ndim n_tokens <= 16\ninput v: f16[n_kv, 64, 8]\ninput kq: f32[n_kv, n_tokens, 32]\n"
     "output y = mul_mat(v, kq)\n",
     "kiln_nch", "n_kv", 5, 3000},
    /* quantized weights, symbolic N: the quantized tensor-core tile (templates/qmma.lua) for up
     * to 64 columns, the f16 dequantization + cuBLAS above (each run takes one of them) */
    {"dim n_tokens <= 512\nweight a: q4_K[4096, 1024]\ninput b: f32[4096, n_tokens]\noutput y = mul_mat(a, b)\n",
     "runs only while n <= 64", "n_tokens", 3, 300},
    {"dim n <= 48\nweight a: q6_K[512, 768]\ninput b: f32[512, n]\ninput r: f32[768, n]\nm = mul_mat(a, b)\noutput y = add(m, r)\n",
     "quantized tensor-core tile: q6_K", "n", 5, 40},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static bool is_matmul(const ir_node *n) {
    return n->kind == IR_OP && (n->op == FE_OP_MUL_MAT || n->op == FE_OP_MUL_MAT_ID);
}

START_TEST(kernels_compile) {
    ts_dyn_kernels(CASES[_i].kg, CASES[_i].want, g_cache, is_matmul, TS_LAUNCH_ONLY, "matmul", ts_case_label(_i));
}
END_TEST

/* The prefill GEMM's cuBLAS step carries the symbolic n, and the conversion kernel stops at the
 * run-time columns. */
START_TEST(gemm_n_dyn) {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile(CASES[0].kg, "sm_90a", g_cache, 1, &ctx, &g);
    int           gemms = 0;
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        if (k->kind == CG_GEMM) gemms++;
        if (k->kind == CG_LAUNCH) ck_assert_msg(strstr(k->source, "if (col >= (unsigned)(kdims["), "conversion without a column guard");
    }
    ck_assert_int_eq(gemms, 1);
    ts_compiled_free(p, g, ctx);
}
END_TEST

/* kiln_dim_specialize_upto: a q4_K product of up to 512 columns is the quantized tile's steps
 * beside the dequantization and cuBLAS (a run takes one); its variant for at most 64 columns
 * has the tile's steps alone, no cuBLAS call and nothing that skips runs. */
START_TEST(upto_variant_takes_the_small_plan) {
    static const char kg[] = "dim n <= 512 specialize <= 64\nweight a: q4_K[4096, 1024]\ninput b: f32[4096, n]\n"
                             "output y = mul_mat(a, b)\n";
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile(kg, "sm_90a", g_cache, 1, &ctx, &g);
    ck_assert_int_eq(p->nspec, 1);
    ck_assert_int_eq(p->spec_val[0], -64);
    int gemms = 0, skips = 0;
    for (int i = 0; i < p->nkernels; i++) {
        gemms += p->kernels[i].kind == CG_GEMM;
        skips += p->kernels[i].kind == CG_LAUNCH && strstr(p->kernels[i].source, "runs only while n <= 64") != NULL;
    }
    ck_assert_int_eq(gemms, 1);
    ck_assert_int_ge(skips, 1);
    const kiln_program *v = p->spec[0];
    bool tile = false;
    for (int i = 0; i < v->nkernels; i++) {
        ck_assert_msg(v->kernels[i].kind == CG_LAUNCH, "variant kernel %d is a library call", i);
        ck_assert_msg(!strstr(v->kernels[i].source, "return; /*"), "variant kernel %s skips runs", v->kernels[i].name);
        tile |= strstr(v->kernels[i].name, "mul_mat_qmma_q4_K") != NULL;
    }
    ck_assert(tile);
    ts_compiled_free(p, g, ctx);
    /* the frontend's rules: below the maximum, at least 1, 4 at most, printed back as given */
    ts_parse_error("dim n <= 512 specialize <= 512\ninput b: f32[4, n]\noutput y = neg(b)\n", KILN_ERR_SHAPE,
                   (const char *const[]){"specialize n <= 512", "below the maximum", NULL});
    ts_parse_error("dim n <= 512 specialize <= 0\ninput b: f32[4, n]\noutput y = neg(b)\n", KILN_ERR_SHAPE,
                   (const char *const[]){"specialize n <= 0", NULL});
    ts_parse_error("dim n <= 512 specialize 1, 2, 3, <= 64, <= 32\ninput b: f32[4, n]\noutput y = neg(b)\n",
                   KILN_ERR_INVALID, (const char *const[]){"at most 4", NULL});
    kiln_ctx *c2 = ts_parse("dim n <= 512 specialize 1, <= 64\ninput b: f32[4, n]\noutput y = neg(b)\n");
    char     *text = NULL;
    TS_OK(kiln_print(c2, &text));
    ck_assert_msg(strstr(text, "dim n <= 512 specialize 1, <= 64\n"), "%s", text);
    free(text);
    kiln_ctx_free(c2);
}
END_TEST

/* kiln compile --dim NAME=V1 and =V2 write the same kernel sources. */
START_TEST(values_identical) {
    ts_sources_identical(CASES[_i].kg, CASES[_i].dim, CASES[_i].v1, CASES[_i].v2, ts_case_label(_i));
}
END_TEST

/* What the templates do not take symbolically is refused, naming the dim: by the frontend when
 * the shapes fit only at the dim's maximum (case 0), else by the template at compile time. */
static const struct {
    const char *kg, *dim; /* the dim the message must name */
} REFUSED[] = {
    /* a batch dim over several static a-matrices (GQA-style r2 would change with the value) */
    {"dim nb <= 24\nweight a: f16[64, 100, 3]\ninput b: f32[64, 7, nb]\noutput y = mul_mat(a, b)\n", "nb"},
    /* mul_mat_id: the slots (ids dim 0) */
    {"dim nu <= 8\nweight w: bf16[256, 128, 16]\ninput x: f32[256, 1, 40]\ninput ids: i32[nu, 40]\n"
     "output y = mul_mat_id(w, x, ids)\n",
     "nu"},
    /* mul_mat_id: the experts' K */
    {"dim nk <= 256\ninput w: bf16[nk, 128, 16]\ninput x: f32[nk, 1, 40]\ninput ids: i32[4, 40]\n"
     "output y = mul_mat_id(w, x, ids)\n",
     "nk"},
};

START_TEST(refusals) {
    char *m = ts_refused_msg(REFUSED[_i].kg, g_cache, 1, ts_case_label(_i));
    /* the dim named as 'nb' (codegen) or "symbolic dim nb" (frontend) */
    char quoted[64], named[64];
    snprintf(quoted, sizeof quoted, "'%s'", REFUSED[_i].dim);
    snprintf(named, sizeof named, "symbolic dim %s", REFUSED[_i].dim);
    ck_assert_msg((strstr(m, quoted) && strstr(m, "symbolic")) || strstr(m, named), "case %d: message: %s", _i, m);
    free(m);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("dyn_matmul",
                        TS_CASE("all", 600), TS_LOOP(0, NCASES, kernels_compile), TS_TESTS(gemm_n_dyn, upto_variant_takes_the_small_plan),
                        TS_LOOP(0, NCASES, values_identical),
                        TS_LOOP(0, (int)(sizeof REFUSED / sizeof REFUSED[0]), refusals));
    return ts_main_cache(s, "dyn-matmul", &g_cache);
}
