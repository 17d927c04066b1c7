/* GPU tests of mul_mat: each case compiled, run on the GPU (CUDA graph) and compared with
 * kiln_reference by NMSE against fe_ops[FE_OP_MUL_MAT].nmse_tol (5e-4, ggml's test-backend-ops
 * for MUL_MAT), for every weight type (f32, f16, bf16).
 *
 * - fixed: every plan of templates/matmul.lua and its edges: gemv (odd K, tails, misaligned rows,
 *   narrow teams, one team per block, batches), tile (n = 3 and 16, K not a multiple of 32,
 *   chunked K, broadcast over dims 2 and 3, column tiles when more than 64 cuBLAS calls would be
 *   needed), conversion + cuBLAS (n = 17 and 512, broadcast, batched), each with b plain,
 *   permuted, transposed or viewed (misaligned) and a plain, viewed (misaligned rows) or reshaped;
 * - random: $KILN_TEST_CASES cases per type (default 24) of random sizes (k, m from odd and
 *   round values, n from 1 to 40), batches with random broadcast, random layouts;
 * - mma_edges: the tensor-core kernel with K not a multiple of 32 or 8 (aligned rows), odd M;
 * - bench: the shapes (gemv 4096x14336 and 14336x4096; n = 16; 4096x1024x512).
 * Each tcase can run alone (CK_RUN_CASE) so that a GPU machine can run them in parallel. */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 24;
    return n > 0 ? n : 24;
}

typedef struct {
    int64_t K, M, N, A2, A3, B2, B3;
    layout  la, lb; /* a: PLAIN, VIEW or RESHAPE (rows stay contiguous); b: any */
} mcase;

/* Builds mul_mat(a, b) for case c with weight type t, runs it and compares. */
static void run_case(const mcase *c, kiln_type t, uint64_t seed, const char *what) {
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], db[192];
    rng_t     lr = {seed ^ 0x5DEECE66Dull};
    int64_t   nea[4] = {c->K, c->M, c->A2, c->A3}, neb[4] = {c->K, c->N, c->B2, c->B3};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, nea, c->la, FILL_ANY, seed * 3 + 1, da, sizeof da);
    kiln_tensor *b = operand(ctx, &h, &lr, "b", KILN_F32, neb, c->lb, FILL_ANY, seed * 5 + 2, db, sizeof db);
    kiln_tensor *y = kiln_mul_mat(ctx, a, b);
    kiln_set_output(ctx, y, "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    char        label[600];
    snprintf(label, sizeof label, "mul_mat %s %s (seed %llu): %s; %s", kiln_type_name(t), what,
             (unsigned long long)seed, da, db);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_MUL_MAT].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}

#define P LAY_PLAIN
#define V LAY_VIEW
#define R LAY_RESHAPE
#define X LAY_PERMUTE
#define T LAY_TRANSPOSE

static const mcase FIXED[] = {
    /* gemv (n = 1) */
    {100, 37, 1, 1, 1, 1, 1, P, P},       /* K % 8 != 0: narrower vectors */
    {4096, 300, 1, 1, 1, 1, 1, P, P},     /* aligned, 128-thread teams */
    {14336, 64, 1, 1, 1, 1, 1, P, P},     /* 256-thread teams, 7 vectors per thread */
    {4099, 33, 1, 1, 1, 1, 1, V, V},      /* tails, misaligned rows and b */
    {64, 300, 1, 1, 1, 1, 1, R, T},       /* 4-thread teams, strided b */
    {3, 5, 1, 1, 1, 1, 1, P, P},          /* K smaller than a vector */
    {1, 7, 1, 1, 1, 1, 1, P, P},          /* K = 1 */
    {130, 20, 1, 3, 2, 3, 2, P, X},       /* batched, permuted b */
    {4096, 96, 1, 1, 1, 1, 1, P, X},      /* permuted b, 4-D */
    /* tile (n = 2..16, or broadcast) */
    {67, 45, 3, 1, 1, 1, 1, P, P},        /* n = 3, K odd */
    {1000, 129, 16, 1, 1, 1, 1, P, P},    /* n = 16, M odd */
    {4097, 70, 5, 1, 1, 1, 1, V, T},      /* chunked K with a tail, transposed b */
    {64, 32, 1, 2, 1, 8, 1, P, P},        /* GQA-like broadcast: 4 b-matrices per a */
    {96, 40, 2, 2, 3, 4, 6, R, X},        /* broadcast over dims 2 and 3 (8 columns) */
    {40, 12, 17, 1, 65, 1, 130, P, P},    /* > 64 cuBLAS calls: column tiles */
    {2050, 33, 16, 1, 1, 1, 1, P, V},     /* n = 16, misaligned b: element copies */
    {1000, 45, 3, 1, 1, 1, 1, P, T},      /* n = 3, K % 32 != 0 (f16/bf16: tensor cores) */
    {4104, 129, 9, 1, 1, 1, 1, R, P},     /* n = 9: two n-tiles, chunked K */
    /* conversion + cuBLAS (n > 16) */
    {520, 70, 17, 1, 1, 1, 1, P, P},      /* n = 17 */
    {320, 200, 512, 1, 1, 1, 1, P, P},    /* n = 512 */
    {96, 40, 17, 2, 3, 4, 6, P, P},       /* broadcast over dims 2 and 3 */
    {64, 48, 20, 2, 1, 6, 1, P, X},       /* broadcast r2 = 3, permuted b */
    {72, 24, 33, 3, 2, 3, 2, V, T},       /* batched, misaligned a, transposed b */
    {257, 65, 40, 1, 1, 1, 1, R, V},      /* odd K, misaligned b */
};
#define NFIXED ((int)(sizeof FIXED / sizeof FIXED[0]))

/* _i: type (3) x fixed case. */
START_TEST(test_fixed) {
    need_gpu();
    kiln_type t = FLOAT_TYPES[_i % 3];
    char      what[64];
    snprintf(what, sizeof what, "fixed case %d", _i / 3);
    run_case(&FIXED[_i / 3], t, 1000u + (uint64_t)_i, what);
}
END_TEST

/* A divisor of n: n, 1, or another one. */
static int64_t divisor(rng_t *r, int64_t n) {
    int k = rng_int(r, 0, 3);
    if (k == 0) return n;
    if (k == 1) return 1;
    for (int64_t d = 2; d < n; d++)
        if (n % d == 0 && rng_int(r, 0, 1)) return d;
    return n;
}

static mcase gen_case(rng_t *r) {
    static const int64_t ks[] = {1, 2, 3, 7, 8, 31, 33, 64, 100, 127, 256, 520, 1000, 4096, 4097};
    static const int64_t ms[] = {1, 2, 5, 33, 64, 128, 300};
    static const int64_t ns[] = {1, 1, 1, 2, 3, 4, 5, 8, 15, 16, 17, 24, 40};
    static const int64_t bs[] = {1, 1, 2, 3, 4, 6};
    static const layout  las[] = {LAY_PLAIN, LAY_VIEW, LAY_RESHAPE};
    mcase c;
    c.K = ks[rng_int(r, 0, (int)(sizeof ks / sizeof ks[0]) - 1)];
    c.M = ms[rng_int(r, 0, (int)(sizeof ms / sizeof ms[0]) - 1)];
    c.N = ns[rng_int(r, 0, (int)(sizeof ns / sizeof ns[0]) - 1)];
    c.B2 = bs[rng_int(r, 0, 5)];
    c.B3 = rng_int(r, 0, 2) == 0 ? bs[rng_int(r, 0, 5)] : 1;
    c.A2 = divisor(r, c.B2);
    c.A3 = divisor(r, c.B3);
    /* At most 2^20 weights and 2^24 multiply-adds (the CPU reference's time). */
    while ((c.K * c.M * c.A2 * c.A3 > (1 << 20) || c.K * c.M * c.N * c.B2 * c.B3 > (1 << 24)) && c.M > 1)
        c.M = (c.M + 1) / 2;
    while (c.K * c.M * c.N * c.B2 * c.B3 > (1 << 24) && c.N > 1) c.N = (c.N + 1) / 2;
    c.la = las[rng_int(r, 0, 2)];
    c.lb = (layout)rng_int(r, 0, LAY_COUNT - 1);
    return c;
}

/* _i: type. */
START_TEST(test_random) {
    need_gpu();
    kiln_type t = FLOAT_TYPES[_i];
    int       n = num_cases();
    for (int i = 0; i < n; i++) {
        uint64_t seed = 4242ull * (uint64_t)(_i + 1) + 7919ull * (uint64_t)i;
        rng_t    r = {seed};
        mcase    c = gen_case(&r);
        char     what[160];
        snprintf(what, sizeof what, "random case %d: K %lld M %lld N %lld a batches %lldx%lld b batches %lldx%lld", i,
                 (long long)c.K, (long long)c.M, (long long)c.N, (long long)c.A2, (long long)c.A3, (long long)c.B2,
                 (long long)c.B3);
        run_case(&c, t, seed, what);
    }
}
END_TEST

/* The tensor-core tile kernel at its edges: weight rows 16-byte aligned (a view of a leaf whose
 * rows are padded to a multiple of 8) with K not a multiple of 32 or of 8, odd M, 2..16
 * columns. _i: type (f16, bf16) x case. */
START_TEST(test_mma_edges) {
    need_gpu();
    static const int64_t cs[][3] = {{8, 5, 2}, {13, 33, 3}, {72, 40, 7}, {100, 17, 16}, {1001, 70, 9}, {4099, 48, 4}};
    kiln_type      t = _i % 2 ? KILN_BF16 : KILN_F16;
    const int64_t *c = cs[_i / 2];
    int64_t        K = c[0], M = c[1], N = c[2], Kp = (K + 7) / 8 * 8;
    kiln_ctx      *ctx = kiln_ctx_new();
    hset           h = {0};
    int64_t        nw[2] = {Kp, M}, na[2] = {K, M}, nb[2] = {K, N};
    kiln_tensor   *w = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, t, "w", 2, nw);
    size_t         nb1[1] = {(size_t)Kp * 2};
    kiln_tensor   *a = kiln_view(ctx, w, 2, na, nb1, 0);
    kiln_tensor   *b = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "b", 2, nb);
    fill(hset_add(&h, "w", t, Kp * M)->data, t, Kp * M, 31 + (uint64_t)_i, FILL_ANY);
    fill(hset_add(&h, "b", KILN_F32, K * N)->data, KILN_F32, K * N, 37 + (uint64_t)_i, FILL_ANY);
    kiln_set_output(ctx, kiln_mul_mat(ctx, a, b), "out");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    char label[160];
    snprintf(label, sizeof label, "mma edges %s: K %lld (rows of %lld) M %lld N %lld", kiln_type_name(t), (long long)K,
             (long long)Kp, (long long)M, (long long)N);
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_MUL_MAT].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}
END_TEST

/* The shapes (at a smaller n for the gemm, to keep the CPU reference quick). */
static const mcase BENCH[] = {
    {4096, 14336, 1, 1, 1, 1, 1, P, P},
    {14336, 4096, 1, 1, 1, 1, 1, P, P},
    {4096, 4096, 16, 1, 1, 1, 1, P, P},
    {4096, 1024, 512, 1, 1, 1, 1, P, P},
};

/* _i: weight type (f16, bf16) x bench shape. */
START_TEST(test_bench_shapes) {
    need_gpu();
    kiln_type t = _i % 2 ? KILN_BF16 : KILN_F16;
    char      what[64];
    snprintf(what, sizeof what, "bench shape %d", _i / 2);
    run_case(&BENCH[_i / 2], t, 77u + (uint64_t)_i, what);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_matmul",
                        TS_CASE("fixed", 900), TS_LOOP(0, 3 * NFIXED, test_fixed),
                        TS_CASE_EACH(900, test_random, "random_f32", "random_f16", "random_bf16"),
                        TS_CASE("mma_edges", 900), TS_LOOP(0, 12, test_mma_edges),
                        TS_CASE("bench_shapes", 900),
                        TS_LOOP(0, 2 * (int)(sizeof BENCH / sizeof BENCH[0]), test_bench_shapes));
    return ts_main_cache(s, "gpu-matmul", &g_cache_dir);
}
