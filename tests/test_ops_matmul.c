/* mul_mat: the CPU reference against values computed by hand, the frontend's errors, every
 * kernel shape of templates/matmul.lua (gemv, tile on CUDA cores, tile on tensor cores,
 * conversion + cuBLAS) generated and compiled
 * by NVRTC for sm_90a and sm_80 without warnings, and the cuBLAS plans (gemm steps) executed on
 * the CPU — conversion, offsets, leading dimensions, batch strides — against the reference. No
 * GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "ir/ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

/* ---- the reference, by hand ------------------------------------------------------------------ */

/* y = b·aᵀ: a [3, 2] (rows (1,2,3), (4,5,6)), b [3, 2] (columns (1,0,-1), (2,1,0)):
 * y[i, j] = a_i · b_j = (-2, 4; -2, 13). */
START_TEST(ref_basic) {
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 1, 0};
    ts_buf bufs[] = {{.name = "a", .type = KILN_F32, .data = a}, {.name = "b", .type = KILN_F32, .data = b},
                     TS_OUT("y"), {0}};
    ts_reference("weight a: f32[3, 2]\ninput b: f32[3, 2]\noutput y = mul_mat(a, b)\n", bufs);
    ts_buf *y = ts_buf_find(bufs, "y");
    ck_assert_int_eq(y->type, KILN_F32);
    ck_assert_int_eq(y->n, 4);
    const float want[4] = {-2, -2, 4, 13}; /* y[M=2, N=2]: y[i + 2 j] */
    for (int i = 0; i < 4; i++) ck_assert_msg(((float *)y->out)[i] == want[i], "y[%d] = %g", i, ((float *)y->out)[i]);
    ts_buf_free(bufs);
}
END_TEST

/* f16 and bf16 weights are read exactly (values exact in both types); the sum is f32. */
START_TEST(ref_half_weights) {
    static const char *types[2] = {"f16", "bf16"};
    static const kiln_type kt[2] = {KILN_F16, KILN_BF16};
    for (int t = 0; t < 2; t++) {
        const float av[4] = {0.5f, -1.5f, 2.0f, 0.25f}; /* a [2, 2] */
        uint16_t    ah[4];
        for (int i = 0; i < 4; i++) kb_store_f32(ah, kt[t], i, av[i]);
        const float b[2] = {3.0f, 1.0f};
        ts_buf      bufs[] = {{.name = "a", .type = kt[t], .data = ah}, {.name = "b", .type = KILN_F32, .data = b},
                              TS_OUT("y"), {0}};
        char        kg[128];
        snprintf(kg, sizeof kg, "weight a: %s[2, 2]\ninput b: f32[2]\noutput y = mul_mat(a, b)\n", types[t]);
        ts_reference(kg, bufs);
        const float *y = ts_buf_find(bufs, "y")->out;
        ck_assert(y[0] == 0.0f && y[1] == 6.25f);
        ts_buf_free(bufs);
    }
}
END_TEST

/* Broadcast over dims 2 and 3: a [2, 1, 2, 1] (two 1x2 matrices), b [2, 1, 4, 2]: batch (i2, i3)
 * uses a's matrix i2 / 2. a0 = (1, 1), a1 = (1, -1); b's batch (i2, i3) column = (i2 + 4 i3, 1). */
START_TEST(ref_broadcast) {
    const float a[4] = {1, 1, 1, -1};
    float       b[16];
    for (int i3 = 0; i3 < 2; i3++)
        for (int i2 = 0; i2 < 4; i2++) {
            b[2 * (i2 + 4 * i3)] = (float)(i2 + 4 * i3);
            b[2 * (i2 + 4 * i3) + 1] = 1.0f;
        }
    ts_buf bufs[] = {{.name = "a", .type = KILN_F32, .data = a}, {.name = "b", .type = KILN_F32, .data = b},
                     TS_OUT("y"), {0}};
    ts_reference("weight a: f32[2, 1, 2]\ninput b: f32[2, 1, 4, 2]\noutput y = mul_mat(a, b)\n", bufs);
    ts_buf *y = ts_buf_find(bufs, "y");
    ck_assert_int_eq(y->n, 8);
    for (int i3 = 0; i3 < 2; i3++)
        for (int i2 = 0; i2 < 4; i2++) {
            float v = (float)(i2 + 4 * i3), want = i2 / 2 == 0 ? v + 1 : v - 1;
            ck_assert_msg(((float *)y->out)[i2 + 4 * i3] == want, "y[%d, %d] = %g want %g", i2, i3,
                          ((float *)y->out)[i2 + 4 * i3], want);
        }
    ts_buf_free(bufs);
}
END_TEST

/* A transposed b: x [2, 3] transposed is b [3, 2] with b[k, j] = x[j, k]. */
START_TEST(ref_transposed_b) {
    const float a[3] = {1, 10, 100}, x[6] = {1, 2, 3, 4, 5, 6}; /* x rows (1,2), (3,4), (5,6) */
    ts_buf      bufs[] = {{.name = "a", .type = KILN_F32, .data = a}, {.name = "x", .type = KILN_F32, .data = x},
                          TS_OUT("y"), {0}};
    ts_reference("weight a: f32[3]\ninput x: f32[2, 3]\nb = transpose(x)\noutput y = mul_mat(a, b)\n", bufs);
    const float *y = ts_buf_find(bufs, "y")->out; /* column j of b = (x[j,0], x[j,1], x[j,2]) = (1,3,5), (2,4,6) */
    ck_assert(y[0] == 531.0f && y[1] == 642.0f);
    ts_buf_free(bufs);
}
END_TEST

/* ---- frontend errors ------------------------------------------------------------------------ */

static void expect_error(const char *kg, kiln_code code, const char *needle) {
    ts_parse_error(kg, code, TS_NEEDLES(needle));
}

START_TEST(errors) {
    expect_error("weight a: f32[4, 2]\ninput b: f16[4, 2]\ny = mul_mat(a, b)\n", KILN_ERR_SHAPE, "must be f32");
    expect_error("weight a: i32[4, 2]\ninput b: f32[4, 2]\ny = mul_mat(a, b)\n", KILN_ERR_SHAPE,
                 "must be f32, f16, bf16 or a quantized type (q8_0 q4_0 q5_0 q5_1 q4_K q5_K q6_K mxfp4)");
    expect_error("weight a: f32[4, 2]\ninput b: f32[5, 2]\ny = mul_mat(a, b)\n", KILN_ERR_SHAPE, "same ne0");
    expect_error("weight a: f32[4, 2, 3]\ninput b: f32[4, 2, 4]\ny = mul_mat(a, b)\n", KILN_ERR_SHAPE,
                 "must broadcast over");
    expect_error("weight a: f32[4, 2, 1, 2]\ninput b: f32[4, 2, 1, 3]\ny = mul_mat(a, b)\n", KILN_ERR_SHAPE,
                 "ne2 and ne3 must divide");
    expect_error("weight w: bf16[2, 4]\na = transpose(w)\ninput b: f32[2, 3]\ny = mul_mat(a, b)\n", KILN_ERR_SHAPE,
                 "contiguous rows");
}
END_TEST

/* ---- kernels: generated and compiled ---------------------------------------------------------- */

static char *g_cache;

typedef struct {
    const char *kg;
    const char *want; /* a substring of the matmul kernels' sources (all steps concatenated) */
} gcase;

/* Every plan and its variants: weight types, vector widths and tails, team sizes, strided and
 * misaligned b, batches and broadcasts, column tiles, chunked K, conversion + cuBLAS plans. */
static const gcase CASES[] = {
    /* gemv */
    {"weight a: bf16[4096, 14336]\ninput b: f32[4096]\noutput y = mul_mat(a, b)\n", "8-element vectors (512 full"},
    {"weight a: f16[14336, 4096]\ninput b: f32[14336]\noutput y = mul_mat(a, b)\n", "kiln_f16x2"},
    {"weight a: f16[4096, 14336]\ninput b: f32[4096]\noutput y = mul_mat(a, b)\n", "4-float vector loads"},
    {"weight a: bf16[14336, 4096]\ninput b: f32[14336]\noutput y = mul_mat(a, b)\n", "teams of 256 threads"},
    {"weight a: f32[64, 300]\ninput b: f32[64]\noutput y = mul_mat(a, b)\n", "teams of 8 threads"},
    {"weight a: f32[7, 5]\ninput b: f32[7]\noutput y = mul_mat(a, b)\n", "1-element vectors (7 full"},
    {"weight a: bf16[3]\ninput b: f32[3]\noutput y = mul_mat(a, b)\n", "(1 full + 1 tail"},
    {"weight w: f16[4104, 10]\na = view(w, [4099, 10], [8208], 0)\ninput b: f32[4099]\noutput y = mul_mat(a, b)\n",
     "(512 full + 3 tail"},
    {"weight w: bf16[8, 300, 4]\na = view(w, [7, 300, 4], [16, 4800], 0)\ninput b: f32[7, 1, 4]\n"
     "output y = mul_mat(a, b)\n", "kt += 1u"},
    {"weight a: bf16[128, 33, 3, 2]\ninput x: f32[3, 128, 2]\nb = permute(x, 2, 0, 3, 1)\noutput y = mul_mat(a, b)\n",
     "x 6 matrices"},
    {"input x: f32[2, 4096]\nv = view(x, [1, 4096], [8], 0)\nb = transpose(v)\nweight a: bf16[4096, 64]\n"
     "output y = mul_mat(a, b)\n", "element loads"},
    {"input x: f32[4097]\nb = view(x, [4096], [], 4)\nweight a: bf16[4096, 64]\noutput y = mul_mat(a, b)\n",
     "kiln_ldb1"},
    /* tile */
    {"weight a: bf16[4096, 1024]\ninput b: f32[4096, 8]\noutput y = mul_mat(a, b)\n", "double-buffered"},
    {"weight a: f16[100, 70]\ninput b: f32[100, 3]\noutput y = mul_mat(a, b)\n", "4-element vectors"},
    {"weight a: f32[33, 17]\ninput x: f32[16, 33]\nb = transpose(x)\noutput y = mul_mat(a, b)\n", "element copies"},
    {"weight a: f16[128, 64, 2]\ninput b: f32[128, 1, 8]\noutput y = mul_mat(a, b)\n", "(N 1 x r2 4 x r3 1)"},
    {"weight a: bf16[64, 32, 2, 3]\ninput b: f32[64, 2, 4, 6]\noutput y = mul_mat(a, b)\n", "(N 2 x r2 2 x r3 2)"},
    {"weight a: f32[8, 4, 1, 65]\ninput b: f32[8, 17, 1, 130]\noutput y = mul_mat(a, b)\n", "3 column tiles of 12"},
    {"weight a: bf16[14336, 512]\ninput b: f32[14336, 16]\noutput y = mul_mat(a, b)\n", "chunks of 512"},
    {"weight w: bf16[4104, 40]\na = view(w, [4099, 40], [8208], 0)\ninput b: f32[4099, 5]\noutput y = mul_mat(a, b)\n",
     "else if (k < 4099u)"},
    {"weight a: bf16[4096, 64]\ninput x: f32[3, 4096]\nb = transpose(x)\noutput y = mul_mat(a, b)\n", "kiln_cp4"},
    /* tile on tensor cores (f16/bf16 weights with 16-byte aligned rows) */
    {"weight a: bf16[4096, 2000]\ninput b: f32[4096, 16]\noutput y = mul_mat(a, b)\n", "kiln_mma_bf16"},
    {"weight a: f16[14336, 512]\ninput b: f32[14336, 8]\noutput y = mul_mat(a, b)\n", "1 row tiles of 16"},
    {"weight w: f16[104, 33]\na = view(w, [100, 33], [208], 0)\ninput b: f32[100, 3]\noutput y = mul_mat(a, b)\n",
     "kiln_mma_f16"},
    {"weight a: bf16[128, 64, 2, 3]\ninput x: f32[2, 128, 4, 6]\nb = permute(x, 1, 0, 2, 3)\n"
     "output y = mul_mat(a, b)\n", "(N 2 x r2 2 x r3 2)"},
    {"weight a: f16[64, 20, 1, 65]\ninput b: f32[64, 17, 1, 130]\noutput y = mul_mat(a, b)\n", "3 column tiles of 16"},
    /* conversion + cuBLAS */
    {"weight a: bf16[4096, 4096]\ninput b: f32[4096, 512]\noutput y = mul_mat(a, b)\n", "cublasGemmStridedBatchedEx"},
    {"weight a: f16[256, 128]\ninput b: f32[256, 17]\noutput y = mul_mat(a, b)\n", "kiln_f32_to_f16"},
    {"weight a: f32[64, 48]\ninput x: f32[33, 64]\nb = transpose(x)\noutput y = mul_mat(a, b)\n", "mul_mat_cvt_f32"},
    {"weight a: bf16[100, 48]\ninput x: f32[20, 6, 100]\nb = permute(x, 1, 2, 0, 3)\noutput y = mul_mat(a, b)\n",
     "element loads"},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

/* The steps of the program's matmul node, concatenated (graphs may hold a copy too). */
static bool is_matmul(const ir_node *n) { return n->kind == IR_OP && n->op == FE_OP_MUL_MAT; }

START_TEST(kernels_compile) { ts_kernels_want(CASES[_i].kg, g_cache, is_matmul, CASES[_i].want, _i); }
END_TEST

/* The same graph gives the same sources. */
START_TEST(kernels_deterministic) {
    for (int i = 0; i < NCASES; i++) ts_compile_twice(CASES[i].kg, g_cache, NULL);
}
END_TEST

/* ---- cuBLAS plans, run on the CPU ------------------------------------------------------------ */

typedef struct {
    const char *kg;
    int         gemms;    /* gemm steps wanted; 0: none (the tile kernel takes the node) */
    bool        convert;  /* a conversion step first */
    kiln_type   ctype;    /* its output type */
} pcase;

static const pcase PLANS[] = {
    {"weight a: bf16[64, 48]\ninput b: f32[64, 40]\noutput y = mul_mat(a, b)\n", 1, true, KILN_BF16},
    {"weight a: f16[72, 40]\ninput b: f32[72, 17]\noutput y = mul_mat(a, b)\n", 1, true, KILN_F16},
    {"weight a: f32[64, 48]\ninput b: f32[64, 33]\noutput y = mul_mat(a, b)\n", 1, false, KILN_F32},
    {"weight a: f32[64, 48]\ninput x: f32[33, 64]\nb = transpose(x)\noutput y = mul_mat(a, b)\n", 1, true, KILN_F32},
    /* broadcast r2 = 3 (GQA-like): one call, batch 2, n = 20 * 3 */
    {"weight a: bf16[32, 24, 2]\ninput b: f32[32, 20, 6]\noutput y = mul_mat(a, b)\n", 1, true, KILN_BF16},
    /* broadcast over both dims: r2 = 2, r3 = 2 */
    {"weight a: f16[32, 24, 2, 3]\ninput b: f32[32, 17, 4, 6]\noutput y = mul_mat(a, b)\n", 6, true, KILN_F16},
    /* batches without broadcast, permuted b (4-D) */
    {"weight a: bf16[40, 16, 3, 2]\ninput x: f32[18, 40, 2, 3]\nb = permute(x, 1, 0, 3, 2)\noutput y = mul_mat(a, b)\n",
     1, true, KILN_BF16},
    /* 2..16 columns with large weights: cuBLAS too (measured faster than the tile kernels) */
    {"weight a: bf16[2048, 4096]\ninput b: f32[2048, 3]\noutput y = mul_mat(a, b)\n", 1, true, KILN_BF16},
    {"weight a: f32[4096, 2048]\ninput b: f32[4096, 16]\noutput y = mul_mat(a, b)\n", 1, false, KILN_F32},
    /* ... but not with small ones: the tile kernel */
    {"weight a: bf16[2048, 4095]\ninput b: f32[2048, 3]\noutput y = mul_mat(a, b)\n", 0, false, KILN_BF16},
    /* f32 weights, b used in place across batches; a's batches evenly spaced */
    {"weight a: f32[16, 8, 2, 2]\ninput b: f32[16, 20, 2, 2]\noutput y = mul_mat(a, b)\n", 1, false, KILN_F32},
    /* f32, r2 = 2 with N > 1: b's columns of one a-matrix evenly spaced: in place */
    {"weight a: f32[16, 8, 2]\ninput b: f32[16, 10, 4]\noutput y = mul_mat(a, b)\n", 1, false, KILN_F32},
    /* a with unevenly spaced batches (a view): one call per i3 */
    {"weight w: f32[16, 8, 3, 3]\na = view(w, [16, 8, 2, 3], [64, 512, 1536], 0)\ninput b: f32[16, 20, 2, 3]\n"
     "output y = mul_mat(a, b)\n", 3, false, KILN_F32},
    /* more than 64 calls needed: the tile kernel */
    {"weight a: f32[8, 4, 1, 65]\ninput b: f32[8, 17, 1, 130]\noutput y = mul_mat(a, b)\n", 0, false, KILN_F32},
};
#define NPLANS ((int)(sizeof PLANS / sizeof PLANS[0]))

/* Host memory of kernel parameter `param` of step k. */
static char *param_mem(const cg_kernel *k, int param, void **data, char *scratch) {
    ck_assert_int_lt(param, k->nparams);
    int b = k->params[param];
    return b == CG_PARAM_SCRATCH ? scratch : data[b];
}

/* cublasGemmStridedBatchedEx(alpha 1, beta 0) in column-major terms, in double. */
static void cpu_gemm(const cg_kernel *k, void **data, char *scratch) {
    const cg_gemm *g = &k->gemm;
    char *pa = param_mem(k, g->a.param, data, scratch) + g->a.offset;
    char *pb = param_mem(k, g->b.param, data, scratch) + g->b.offset;
    char *pc = param_mem(k, g->c.param, data, scratch) + g->c.offset;
    ck_assert_int_eq(g->c.type, KILN_F32);
    for (int p = 0; p < g->batch; p++)
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++) {
                double s = 0;
                for (int l = 0; l < g->k; l++) {
                    int64_t ia = g->ta ? l + (int64_t)i * g->a.ld : i + (int64_t)l * g->a.ld;
                    int64_t ib = g->tb ? j + (int64_t)l * g->b.ld : l + (int64_t)j * g->b.ld;
                    s += (double)kb_load_f32(pa, g->a.type, ia + p * g->a.stride) *
                         kb_load_f32(pb, g->b.type, ib + p * g->b.stride);
                }
                kb_store_f32(pc, KILN_F32, i + (int64_t)j * g->c.ld + p * g->c.stride, (float)s);
            }
}

/* What the conversion kernel computes: b made contiguous ([K, N, B2, B3]) in type t. */
static void cpu_convert(const ir_node *n, void **data, char *scratch, kiln_type t) {
    const ir_ref *b = ir_operand(n, 1);
    int64_t       e = 0;
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++)
            for (int64_t j = 0; j < b->ne[1]; j++)
                for (int64_t k = 0; k < b->ne[0]; k++) {
                    int64_t c[4] = {k, j, i2, i3};
                    kb_store_f32(scratch, t, e++, kb_load_f32(data[b->buf], b->type, ir_offset_at(b, c)));
                }
}

START_TEST(gemm_plans) {
    const pcase  *c = &PLANS[_i];
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile(c->kg, "sm_90a", g_cache, 1, &ctx, &g);
    const ir_prog *ir = p->ir;
    void         **data = calloc((size_t)ir->nbufs, sizeof *data);
    ck_assert_ptr_nonnull(data);
    for (int i = 0; i < ir->nbufs; i++) {
        data[i] = calloc(1, ir->bufs[i].bytes + 16);
        ck_assert_ptr_nonnull(data[i]);
        int64_t n = (int64_t)(ir->bufs[i].bytes / kiln_type_size(ir->bufs[i].type));
        if (ir->bufs[i].kind == IR_BUF_INPUT || ir->bufs[i].kind == IR_BUF_WEIGHT)
            kb_fill_random(data[i], ir->bufs[i].type, n, 1234u + (uint64_t)i);
    }
    /* The reference result of the matmul node. */
    int node = -1;
    for (int i = 0; i < ir->nnodes; i++)
        if (!ir->nodes[i].dead && ir->nodes[i].kind == IR_OP && ir->nodes[i].op == FE_OP_MUL_MAT) node = i;
    ck_assert_int_ge(node, 0);
    const ir_node *n = &ir->nodes[node];
    TS_OK(ir_eval(ir, data));
    size_t dbytes = ir->bufs[n->dst.buf].bytes;
    float *want = malloc(dbytes);
    ck_assert_ptr_nonnull(want);
    memcpy(want, data[n->dst.buf], dbytes);
    memset(data[n->dst.buf], 0xff, dbytes); /* NaN: every element must be written */

    int   gemms = 0;
    bool  convert = false;
    char *scratch = p->scratch_bytes ? calloc(1, p->scratch_bytes) : NULL;
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        if (k->node != node) continue;
        if (k->kind == CG_GEMM) {
            gemms++;
            cpu_gemm(k, data, scratch);
        } else if (strstr(k->name, "_cvt_")) {
            ck_assert_msg(k->step == 0 && k->scratch > 0, "the conversion is step 0 and has scratch");
            convert = true;
            cpu_convert(n, data, scratch, c->ctype);
        }
    }
    ck_assert_msg(gemms == c->gemms, "plan %d: %d gemm steps, want %d", _i, gemms, c->gemms);
    ck_assert_msg(convert == c->convert, "plan %d: conversion %d, want %d", _i, convert, c->convert);
    if (gemms) {
        const float *got = data[n->dst.buf];
        double       num = 0, den = 0;
        for (size_t i = 0; i < dbytes / 4; i++) {
            ck_assert_msg(!isnan(got[i]), "plan %d: element %zu not written", _i, i);
            num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
            den += (double)want[i] * want[i];
        }
        double tol = c->ctype == KILN_F32 ? 1e-12 : 1e-4;
        ck_assert_msg(num / den <= tol, "plan %d: NMSE %g", _i, num / den);
    }
    free(scratch);
    free(want);
    for (int i = 0; i < ir->nbufs; i++) free(data[i]);
    free(data);
    ts_compiled_free(p, g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_matmul",
                        TS_CASE("reference", 0), TS_TESTS(ref_basic, ref_half_weights, ref_broadcast, ref_transposed_b),
                        TS_CASE("frontend", 0), TS_TESTS(errors),
                        TS_CASE("kernels", 120), TS_LOOP(0, NCASES, kernels_compile), TS_TESTS(kernels_deterministic),
                        TS_CASE("gemm_plans", 60), TS_LOOP(0, NPLANS, gemm_plans));
    return ts_main_cache(s, "matmul-test", &g_cache);
}
