/* GPU tests of the quantized weight types (templates/quant.lua): mul_mat through every plan a
 * quantized weight takes (the fused gemv, and the f16 dequantization followed by the tile, gemm
 * and strided-b gemv plans), mul_mat_id with quantized experts (decode and prefill) and
 * get_rows of a quantized table, for q8_0, q4_0, q4_K, q5_K, q6_K, mxfp4, q5_0 and q5_1, each against the CPU
 * reference (ggml's dequantization, sums in double) by NMSE <= 5e-4, ggml's threshold for
 * mul_mat. Batches of 2 .. 64 columns take the quantized tensor-core tile (templates/qmma.lua;
 * K a multiple of 256, every type but mxfp4), other cases the f16 dequantization. K runs over 256·n for n = 1 .. 56 (a sample), with odd row counts. mul_mat_id: the
 * fused quantized GEMV's edges (b broadcast or one row per slot, odd M, K from 256 to 14336,
 * ids out of range, several tokens, up to 96 pairs) and the dequantization path. Rows of 2880
 * (gpt-oss: 90 blocks of 32, rows across mxfp4's 16-block tiles) for the types of 32-element blocks. */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static const kiln_type QTYPES[] = {KILN_Q8_0, KILN_Q4_0, KILN_Q4_K, KILN_Q5_K, KILN_Q6_K, KILN_MXFP4, KILN_Q5_0, KILN_Q5_1};
#define NQ ((int)(sizeof QTYPES / sizeof QTYPES[0]))

/* A weight leaf named `name` filled with random values quantized. */
static kiln_tensor *qweight(kiln_ctx *ctx, hset *h, const char *name, kiln_type t, const int64_t ne[4], uint64_t seed) {
    kiln_tensor *w = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, t, name, 4, ne);
    hdata       *d = hset_add(h, name, t, ne[0] * ne[1] * ne[2] * ne[3]);
    fill(d->data, t, d->n, seed, FILL_ANY);
    return w;
}

static kiln_tensor *f32_input(kiln_ctx *ctx, hset *h, const char *name, const int64_t ne[4], uint64_t seed) {
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, name, 4, ne);
    hdata       *d = hset_add(h, name, KILN_F32, ne[0] * ne[1] * ne[2] * ne[3]);
    fill(d->data, KILN_F32, d->n, seed, FILL_ANY);
    return x;
}

static void finish(kiln_ctx *ctx, hset *h, kiln_tensor *y, const char *label) {
    kiln_set_output(ctx, y, "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_MUL_MAT].nmse_tol};
    check_and_free(g, h, ctx, &co);
}

typedef struct {
    int64_t K, M, N, A2, B2;
    int     view_rows; /* a is rows 1 .. M of a weight with M + view_rows + 1 rows */
    bool    bt;        /* b transposed (strided columns: the dequant + f16 gemv fallback) */
} qcase;

static void mul_mat_case(kiln_type t, const qcase *c, uint64_t seed) {
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    int64_t   nea[4] = {c->K, c->M + (c->view_rows ? c->view_rows + 1 : 0), c->A2, 1};
    kiln_tensor *a = qweight(ctx, &h, "a", t, nea, seed);
    if (c->view_rows) {
        int64_t ne[4] = {c->K, c->M, c->A2, 1};
        size_t  nb[3] = {kiln_tensor_nb(a, 1), kiln_tensor_nb(a, 2), kiln_tensor_nb(a, 3)};
        a = kiln_view(ctx, a, 4, ne, nb, nb[0] * (size_t)c->view_rows);
    }
    kiln_tensor *b;
    if (c->bt) {
        int64_t ne[4] = {c->N, c->K, c->B2, 1};
        b = kiln_transpose(ctx, f32_input(ctx, &h, "b", ne, seed + 1));
    } else {
        int64_t ne[4] = {c->K, c->N, c->B2, 1};
        b = f32_input(ctx, &h, "b", ne, seed + 1);
    }
    char label[256];
    snprintf(label, sizeof label, "mul_mat %s K %lld M %lld N %lld A2 %lld B2 %lld%s%s", kiln_type_name(t),
             (long long)c->K, (long long)c->M, (long long)c->N, (long long)c->A2, (long long)c->B2,
             c->view_rows ? " (row view)" : "", c->bt ? " (b transposed)" : "");
    finish(ctx, &h, kiln_mul_mat(ctx, a, b), label);
}

static const qcase GEMV[] = {
    {4096, 64, 1, 1, 1, 0, false},  {256, 37, 1, 1, 1, 0, false},   {512, 5, 1, 1, 1, 0, false},
    {768, 33, 1, 1, 1, 0, false},   {1280, 19, 1, 1, 1, 0, false},  {1792, 7, 1, 1, 1, 0, false},
    {4096, 13, 1, 1, 1, 2, false},  {14336, 9, 1, 1, 1, 0, false},  {2048, 24, 1, 3, 3, 0, false},
    {1024, 16, 1, 1, 1, 0, true},   {2880, 45, 1, 1, 1, 0, false},  {2880, 7, 1, 2, 2, 3, false}, /* K 2880: block 32 */
};
static const qcase BATCH[] = {
    {1024, 40, 2, 1, 1, 0, false}, {512, 33, 4, 1, 1, 0, false}, {2048, 64, 16, 1, 1, 0, false},
    {256, 20, 40, 1, 1, 0, false}, {1024, 48, 3, 2, 4, 0, false}, {768, 24, 8, 1, 1, 1, false},
    /* the quantized tensor-core tile's edges (64 columns, 63 over 300 rows, split K over 14336)
     * and the f16 dequantization above 64 */
    {2048, 96, 64, 1, 1, 0, false}, {4096, 300, 63, 1, 1, 0, false}, {14336, 40, 8, 1, 1, 0, false},
    {512, 40, 65, 1, 1, 0, false}, {1024, 33, 100, 1, 1, 1, false},
};

START_TEST(gemv) {
    need_gpu();
    for (int q = 0; q < NQ; q++)
        for (int i = 0; i < (int)(sizeof GEMV / sizeof GEMV[0]); i++)
            if (GEMV[i].K % kiln_type_block(QTYPES[q]) == 0) mul_mat_case(QTYPES[q], &GEMV[i], 100 + 7 * q + i);
}
END_TEST

START_TEST(k_sweep) {
    need_gpu();
    /* K = 256·n for n = 1 .. 56 (every n, each type), odd M. */
    for (int q = 0; q < NQ; q++)
        for (int n = 1; n <= 56; n++) {
            qcase c = {256 * n, 3 + 2 * (n % 5), 1, 1, 1, 0, false};
            mul_mat_case(QTYPES[q], &c, 1000 + 61 * q + n);
        }
}
END_TEST

START_TEST(batches) {
    need_gpu();
    for (int q = 0; q < NQ; q++)
        for (int i = 0; i < (int)(sizeof BATCH / sizeof BATCH[0]); i++) mul_mat_case(QTYPES[q], &BATCH[i], 300 + 11 * q + i);
}
END_TEST

typedef struct {
    int64_t K, M, E, U, B1, T;
    bool    bad; /* some ids out of [0, E): -1, E, 2^30 (zero columns) */
} idcase;

static void mul_mat_id_case(kiln_type t, const idcase *c, uint64_t seed) {
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    int64_t   nea[4] = {c->K, c->M, c->E, 1}, neb[4] = {c->K, c->B1, c->T, 1}, nei[2] = {c->U, c->T};
    kiln_tensor *as = qweight(ctx, &h, "as", t, nea, seed);
    kiln_tensor *b = f32_input(ctx, &h, "b", neb, seed + 1);
    kiln_tensor *ids = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "ids", 2, nei);
    hdata       *d = hset_add(&h, "ids", KILN_I32, c->U * c->T);
    rng_t        r = {seed};
    static const int32_t BAD[3] = {-1, 0, 1 << 30};
    for (int64_t i = 0; i < c->U * c->T; i++) {
        int32_t v = rng_int(&r, 0, (int)c->E - 1);
        if (c->bad && i % 5 == 2) v = BAD[i % 3] ? BAD[i % 3] : (int32_t)c->E;
        ((int32_t *)d->data)[i] = v;
    }
    char label[200];
    snprintf(label, sizeof label, "mul_mat_id %s K %lld M %lld E %lld U %lld B1 %lld T %lld%s", kiln_type_name(t),
             (long long)c->K, (long long)c->M, (long long)c->E, (long long)c->U, (long long)c->B1, (long long)c->T,
             c->bad ? " (invalid ids)" : "");
    finish(ctx, &h, kiln_mul_mat_id(ctx, as, b, ids), label);
}

/* The fused GEMV (templates/matmul_id.lua, qgemv_id: up to 64 pairs, or fewer pairs than the
 * dequantization would move) and the f16 dequantization path (T = 33, U = 4 of 16 experts). */
static const idcase IDS[] = {
    {512, 24, 8, 2, 1, 1, false},       {1024, 40, 16, 4, 1, 33, false},   /* the first cases */
    {2048, 768, 8, 8, 1, 1, false},     {768, 2048, 8, 8, 8, 1, false},    /* Qwen3-30B-A3B gate, down rows */
    {256, 37, 4, 2, 1, 3, true},        {256, 5, 3, 3, 3, 2, false},       /* K = 256, odd M, B1 = U */
    {14336, 19, 4, 2, 2, 2, true},      {4096, 33, 8, 4, 2, 16, true},     /* long K; 64 pairs, B1 = 2 */
    {1280, 9, 64, 8, 8, 12, false},     {3072, 130, 6, 1, 1, 4, true},     /* 96 pairs of 64 experts: fused */
    {2880, 45, 32, 4, 1, 1, true},      {2880, 24, 32, 4, 4, 3, false},    /* gpt-oss: K 2880 (block 32 only) */
};

START_TEST(mul_mat_id_quant) {
    need_gpu();
    for (int q = 0; q < NQ; q++)
        for (int i = 0; i < (int)(sizeof IDS / sizeof IDS[0]); i++)
            if (IDS[i].K % kiln_type_block(QTYPES[q]) == 0) mul_mat_id_case(QTYPES[q], &IDS[i], 500 + 13 * q + i);
}
END_TEST

START_TEST(get_rows_quant) {
    need_gpu();
    for (int q = 0; q < NQ; q++) {
        kiln_ctx *ctx = kiln_ctx_new();
        hset      h = {0};
        int64_t   nea[4] = {512, 50, 1, 1}, nei[1] = {9};
        kiln_tensor *a = qweight(ctx, &h, "a", QTYPES[q], nea, 700 + q);
        kiln_tensor *ids = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "ids", 1, nei);
        hdata       *d = hset_add(&h, "ids", KILN_I32, 9);
        for (int i = 0; i < 9; i++) ((int32_t *)d->data)[i] = (i * 17 + 3) % 50;
        char label[96];
        snprintf(label, sizeof label, "get_rows %s", kiln_type_name(QTYPES[q]));
        finish(ctx, &h, kiln_get_rows(ctx, a, ids), label);
    }
}
END_TEST

/* The fusions quantized weights take: mul_mat_glu (the paired gemv at one column, the epilogue
 * fallback through the dequantization at several) and add_chain (a residual add at the store),
 * against the unfused reference. */
START_TEST(fused_quant) {
    need_gpu();
    for (int q = 0; q < NQ; q++)
        for (int n = 1; n <= 5; n += 4) {
            kiln_ctx *ctx = kiln_ctx_new();
            hset      h = {0};
            int64_t   new_[4] = {1024, 96, 1, 1}, nex[4] = {1024, n, 1, 1}, ner[4] = {96, n, 1, 1};
            kiln_tensor *g = qweight(ctx, &h, "g", QTYPES[q], new_, 800 + q), *u = qweight(ctx, &h, "u", QTYPES[q], new_, 900 + q);
            kiln_tensor *x = f32_input(ctx, &h, "x", nex, 1000 + q), *res = f32_input(ctx, &h, "res", ner, 1100 + q);
            kiln_tensor *y = kiln_swiglu(ctx, kiln_mul_mat(ctx, g, x), kiln_mul_mat(ctx, u, x), false);
            char label[96];
            snprintf(label, sizeof label, "glu + residual %s, %d column(s)", kiln_type_name(QTYPES[q]), n);
            finish(ctx, &h, kiln_add(ctx, y, res), label);
        }
}
END_TEST

/* mul_mat_glu on quantized experts, against the unfused reference: the paired expert gemv (one
 * token) and the fallback through the dequantization (40 tokens), ids out of range included. */
START_TEST(fused_quant_experts) {
    need_gpu();
    for (int q = 0; q < NQ; q++)
        for (int T = 1; T <= 40; T += 39) {
            kiln_ctx *ctx = kiln_ctx_new();
            hset      h = {0};
            int64_t   new_[4] = {512, 96, 16, 1}, nex[4] = {512, 1, T, 1}, nei[2] = {4, T};
            kiln_tensor *g = qweight(ctx, &h, "g", QTYPES[q], new_, 1200 + q), *u = qweight(ctx, &h, "u", QTYPES[q], new_, 1300 + q);
            kiln_tensor *x = f32_input(ctx, &h, "x", nex, 1400 + q);
            kiln_tensor *ids = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "ids", 2, nei);
            hdata       *d = hset_add(&h, "ids", KILN_I32, 4 * T);
            rng_t        r = {1500 + (uint64_t)q};
            for (int64_t i = 0; i < 4 * T; i++) ((int32_t *)d->data)[i] = i == 3 ? 16 : rng_int(&r, 0, 15);
            kiln_tensor *y = kiln_swiglu(ctx, kiln_mul_mat_id(ctx, g, x, ids), kiln_mul_mat_id(ctx, u, x, ids), false);
            char label[96];
            snprintf(label, sizeof label, "expert glu %s, %d token(s)", kiln_type_name(QTYPES[q]), (int)T);
            finish(ctx, &h, y, label);
        }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_quant",
                        TS_CASE("mul_mat", 600), TS_TESTS(gemv, k_sweep, batches),
                        TS_CASE("mul_mat_id", 600), TS_TESTS(mul_mat_id_quant),
                        TS_CASE("get_rows", 600), TS_TESTS(get_rows_quant),
                        TS_CASE("fusions", 600), TS_TESTS(fused_quant, fused_quant_experts));
    return ts_main_cache(s, "gpu-quant", &g_cache_dir);
}
