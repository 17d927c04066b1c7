/* GPU tests of mul_mat_id (mixture-of-experts matmul): cases compiled, run on the GPU and
 * compared with kiln_reference by NMSE against fe_ops[MUL_MAT_ID].nmse_tol (5e-4, ggml's
 * test-backend-ops value for MUL_MAT_ID).
 *
 * - fixed: every design of templates/matmul_id.lua: the decode GEMV (T <= 4; every load width,
 *   one or several rows per warp, the Qwen3-30B-A3B-like benchmark shapes), the prefill
 *   tensor-core kernel (token tiles 16 .. 128, several tiles per expert, K and M tails, K = 2048)
 *   and the prefill FMA kernel (f32 weights, 16-bit weights whose rows are not 16-byte aligned);
 *   T = 1, 2, 3, 4, 5, 16, 17, 33, 40, 512, 4096; n_expert 1, 4, 16, 128; n_used 1, 2, 8; B1 = 1 and n_used;
 *   b plain, permuted, transposed, viewed, reshaped; ids distinct per token, with duplicates,
 *   or with invalid entries (-1, n_expert, 2^30).
 * - random_<type>: random shapes and layouts from the same menus, $KILN_TEST_CASES per type
 *   (default 20).
 * - zero_rows: ids outside [0, n_expert) give rows of exactly +0.0 in each design.
 * Each tcase can run alone (CK_RUN_CASE). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

typedef enum { IDS_DISTINCT, IDS_DUP, IDS_INVALID } ids_mode;
static const char *IDS_NAMES[3] = {"distinct", "duplicates", "invalid"};

typedef struct {
    kiln_type w;
    int64_t   K, M, E, U, B1, T;
    layout    bl;      /* b's layout */
    ids_mode  im;
    bool      as_view; /* as is a view of a wider leaf, one element in: rows not 16-byte aligned */
} mcase;

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 20;
    return n > 0 ? n : 20;
}

/* ids [U, T]: per token U distinct experts (when U <= E), or draws with duplicates (slot 1
 * copies slot 0 in half the tokens), or draws where about one in five is invalid. */
static void fill_ids(int32_t *ids, const mcase *c, rng_t *r) {
    int32_t *perm = malloc((size_t)c->E * sizeof *perm);
    ck_assert_ptr_nonnull(perm);
    for (int64_t t = 0; t < c->T; t++) {
        int32_t *row = ids + t * c->U;
        if (c->im == IDS_DISTINCT && c->U <= c->E) {
            for (int64_t e = 0; e < c->E; e++) perm[e] = (int32_t)e;
            for (int64_t u = 0; u < c->U; u++) {
                int64_t j = u + rng_int(r, 0, (int)(c->E - 1 - u));
                int32_t tmp = perm[u];
                perm[u] = perm[j];
                perm[j] = tmp;
                row[u] = perm[u];
            }
            continue;
        }
        for (int64_t u = 0; u < c->U; u++) row[u] = rng_int(r, 0, (int)c->E - 1);
        if (c->im == IDS_DUP && c->U >= 2 && rng_int(r, 0, 1)) row[1] = row[0];
        if (c->im == IDS_INVALID)
            for (int64_t u = 0; u < c->U; u++) {
                int k = rng_int(r, 0, 9);
                if (k == 0) row[u] = -1;
                else if (k == 1) row[u] = (int32_t)c->E;
                else if (k == 2 && rng_int(r, 0, 3) == 0) row[u] = 1 << 30;
            }
    }
    free(perm);
}

/* Builds y = mul_mat_id(as, b, ids) for c over leaves added to h; describes it in desc. */
static kiln_tensor *build(kiln_ctx *ctx, hset *h, const mcase *c, uint64_t seed, char *desc, size_t n) {
    rng_t        r = {seed};
    size_t       es = kiln_type_size(c->w);
    kiln_role    role = rng_int(&r, 0, 1) ? KILN_ROLE_WEIGHT : KILN_ROLE_INPUT;
    kiln_tensor *as;
    int64_t      nas;
    if (c->as_view) {
        int64_t ne[3] = {c->K + 3, c->M, c->E}, vne[3] = {c->K, c->M, c->E};
        kiln_tensor *leaf = kiln_new_tensor(ctx, role, c->w, "as", 3, ne);
        size_t       nb[2] = {(size_t)(c->K + 3) * es, (size_t)((c->K + 3) * c->M) * es};
        as = kiln_view(ctx, leaf, 3, vne, nb, es);
        nas = ne[0] * ne[1] * ne[2];
    } else {
        int64_t ne[3] = {c->K, c->M, c->E};
        as = kiln_new_tensor(ctx, role, c->w, "as", 3, ne);
        nas = c->K * c->M * c->E;
    }
    hdata *da = hset_add(h, "as", c->w, nas);
    fill(da->data, c->w, nas, seed * 5 + 1, FILL_ANY);

    char    db[192];
    int64_t bne[4] = {c->K, c->B1, c->T, 1};
    rng_t   lr = {seed ^ 0x5DEECE66Dull};
    kiln_tensor *b = operand(ctx, h, &lr, "b", KILN_F32, bne, c->bl, FILL_ANY, seed * 5 + 2, db, sizeof db);

    int64_t      ine[2] = {c->U, c->T};
    kiln_tensor *ids = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "ids", 2, ine);
    hdata       *di = hset_add(h, "ids", KILN_I32, c->U * c->T);
    fill_ids(di->data, c, &r);

    snprintf(desc, n, "as %s[%lld, %lld, %lld]%s, %s, ids [%lld, %lld] %s", kiln_type_name(c->w), (long long)c->K,
             (long long)c->M, (long long)c->E, c->as_view ? " (view, offset 1)" : "", db, (long long)c->U,
             (long long)c->T, IDS_NAMES[c->im]);
    return kiln_mul_mat_id(ctx, as, b, ids);
}

static void run_case(const mcase *c, uint64_t seed, const char *what) {
    kiln_ctx    *ctx = kiln_ctx_new();
    hset         h = {0};
    char         desc[512];
    kiln_tensor *y = build(ctx, &h, c, seed, desc, sizeof desc);
    char         label[700];
    snprintf(label, sizeof label, "%s (seed %llu): %s", what, (unsigned long long)seed, desc);
    ck_assert_msg(y != NULL, "%s: build failed: %s", label, kiln_status_msg(kiln_ctx_status(ctx)));
    kiln_set_output(ctx, y, "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_MUL_MAT_ID].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}

#define BF KILN_BF16
#define H KILN_F16
#define F KILN_F32

static const mcase FIXED[] = {
    /* decode GEMV */
    {BF, 2048, 768, 128, 8, 1, 1, LAY_PLAIN, IDS_DISTINCT, false},   /* benchmark gate/up */
    {BF, 768, 2048, 128, 8, 8, 1, LAY_PLAIN, IDS_DISTINCT, false},   /* benchmark down: 2 rows/warp */
    {H, 200, 100, 4, 2, 2, 3, LAY_PERMUTE, IDS_DUP, false},
    {F, 72, 33, 128, 8, 1, 3, LAY_TRANSPOSE, IDS_INVALID, false},
    {BF, 37, 70, 4, 2, 1, 1, LAY_VIEW, IDS_INVALID, true},           /* 2-byte loads */
    {H, 40, 100, 4, 2, 1, 4, LAY_VIEW, IDS_DUP, false},
    {F, 33, 20, 1, 1, 1, 1, LAY_PLAIN, IDS_DISTINCT, false},
    {H, 38, 129, 16, 1, 1, 2, LAY_RESHAPE, IDS_INVALID, false},      /* 4-byte loads */
    /* prefill, tensor cores */
    {BF, 136, 200, 128, 8, 1, 16, LAY_PLAIN, IDS_DISTINCT, false},   /* 16-token tiles */
    {H, 136, 200, 128, 8, 8, 17, LAY_PERMUTE, IDS_INVALID, false},
    {BF, 200, 136, 4, 2, 2, 17, LAY_PLAIN, IDS_DUP, false},
    {BF, 64, 48, 128, 2, 1, 5, LAY_TRANSPOSE, IDS_INVALID, false},
    {BF, 2048, 128, 128, 8, 1, 33, LAY_PLAIN, IDS_DISTINCT, false},  /* K = 2048: 32 k-tiles */
    {BF, 136, 72, 16, 8, 1, 40, LAY_VIEW, IDS_DUP, false},           /* 32-token tiles */
    {BF, 256, 384, 128, 8, 1, 512, LAY_PLAIN, IDS_DISTINCT, false},  /* 64-token tiles, T = 512 */
    {BF, 1032, 72, 128, 8, 1, 512, LAY_PLAIN, IDS_DISTINCT, false},  /* 128-row tiles, K and M tails */
    {H, 104, 160, 128, 8, 8, 512, LAY_TRANSPOSE, IDS_INVALID, false},
    {BF, 72, 130, 1, 8, 1, 512, LAY_PLAIN, IDS_DUP, false},          /* one expert: 32 tiles of 128 */
    {BF, 768, 200, 16, 4, 4, 512, LAY_RESHAPE, IDS_DISTINCT, false}, /* 128-token tiles, 2+ per expert */
    {BF, 64, 16, 4, 8, 1, 4096, LAY_PLAIN, IDS_INVALID, false},     /* 32768 pairs: ids read twice */
    /* prefill, FMA */
    {F, 72, 130, 4, 2, 2, 512, LAY_PERMUTE, IDS_INVALID, false},
    {BF, 37, 70, 4, 2, 1, 17, LAY_RESHAPE, IDS_DUP, false},
    {H, 64, 100, 4, 1, 1, 16, LAY_PLAIN, IDS_INVALID, true},
    {F, 257, 65, 128, 8, 8, 16, LAY_VIEW, IDS_DISTINCT, false},
};
#define NFIXED ((int)(sizeof FIXED / sizeof FIXED[0]))

START_TEST(test_fixed) {
    need_gpu();
    char what[32];
    snprintf(what, sizeof what, "fixed case %d", _i);
    run_case(&FIXED[_i], 1000 + (uint64_t)_i, what);
}
END_TEST

/* Random shapes from the menus; K * M kept small where T * U is large (the CPU reference). */
static mcase gen_case(rng_t *r, kiln_type w) {
    static const int64_t Ks[] = {8, 16, 37, 64, 72, 136, 200, 257, 512, 1024};
    static const int64_t Ms[] = {1, 7, 33, 128, 130, 200, 300};
    static const int64_t Es[] = {1, 4, 128};
    static const int64_t Us[] = {1, 2, 8};
    static const int64_t Ts[] = {1, 3, 16, 17, 512};
    mcase c = {.w = w};
    c.K = Ks[rng_int(r, 0, 9)];
    c.M = Ms[rng_int(r, 0, 6)];
    c.E = Es[rng_int(r, 0, 2)];
    c.U = Us[rng_int(r, 0, 2)];
    c.B1 = rng_int(r, 0, 1) ? c.U : 1;
    c.T = Ts[rng_int(r, 0, 4)];
    while (c.T * c.U * c.K * c.M > (int64_t)40 << 20) c.K = c.K > 16 ? c.K / 2 : c.K, c.M = c.M > 8 ? c.M / 2 : c.M;
    c.bl = (layout)rng_int(r, 0, LAY_COUNT - 1);
    c.im = (ids_mode)rng_int(r, 0, 2);
    c.as_view = rng_int(r, 0, 4) == 0;
    return c;
}

/* _i: type index into FLOAT_TYPES. */
START_TEST(test_random) {
    need_gpu();
    kiln_type t = FLOAT_TYPES[_i];
    int       n = num_cases();
    for (int i = 0; i < n; i++) {
        uint64_t seed = 9176ull * (uint64_t)(_i + 1) + 7919ull * (uint64_t)i;
        rng_t    r = {seed};
        mcase    c = gen_case(&r, t);
        char     what[48];
        snprintf(what, sizeof what, "random %s case %d", kiln_type_name(t), i);
        run_case(&c, seed, what);
    }
}
END_TEST

/* Tokens whose every id is invalid get columns of exactly +0.0 (bitwise), in each design; the
 * other columns match the reference. */
START_TEST(test_zero_rows) {
    need_gpu();
    static const mcase cs[] = {
        {BF, 2048, 768, 128, 8, 1, 1, LAY_PLAIN, IDS_INVALID, false}, /* gemv */
        {BF, 256, 200, 128, 8, 1, 64, LAY_PLAIN, IDS_INVALID, false}, /* mma */
        {F, 100, 70, 4, 2, 2, 20, LAY_PLAIN, IDS_INVALID, false},     /* fma */
    };
    const mcase *c = &cs[_i];
    kiln_ctx    *ctx = kiln_ctx_new();
    hset         h = {0};
    char         desc[512];
    kiln_tensor *y = build(ctx, &h, c, 77 + (uint64_t)_i, desc, sizeof desc);
    kiln_set_output(ctx, y, "out");
    /* every other token all invalid: -1 and n_expert alternately */
    int32_t *ids = NULL;
    for (int i = 0; i < h.nin; i++)
        if (!strcmp(h.in[i].name, "ids")) ids = h.in[i].data;
    ck_assert_ptr_nonnull(ids);
    for (int64_t t = 0; t < c->T; t += 2)
        for (int64_t u = 0; u < c->U; u++) ids[t * c->U + u] = u % 2 ? (int32_t)c->E : -1;
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    char label[600];
    snprintf(label, sizeof label, "zero rows: %s", desc);
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_MUL_MAT_ID].nmse_tol};
    check_graph(g, &h, &co);
    /* Run again to look at the values themselves: first with every id valid, so that the
     * output holds non-zero values everywhere, then with the invalid tokens: their zeros must be
     * written, not left over. */
    kiln_program *p = compile(g, 0);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    for (int i = 0; i < h.nin; i++)
        if (h.in[i].requested)
            TS_OK(kiln_session_set(s, h.in[i].name, h.in[i].data, (size_t)h.in[i].n * kiln_type_size(h.in[i].type)));
    size_t   ids_bytes = (size_t)(c->U * c->T) * sizeof(int32_t);
    int32_t *valid = malloc(ids_bytes);
    ck_assert_ptr_nonnull(valid);
    for (int64_t i = 0; i < c->U * c->T; i++) valid[i] = ids[i] >= 0 && ids[i] < c->E ? ids[i] : (int32_t)(i % c->E);
    TS_OK(kiln_session_set(s, "ids", valid, ids_bytes));
    TS_OK(kiln_session_run(s));
    free(valid);
    TS_OK(kiln_session_set(s, "ids", ids, ids_bytes));
    int64_t nout = c->M * c->U * c->T;
    float  *out = malloc((size_t)nout * sizeof *out);
    ck_assert_ptr_nonnull(out);
    TS_OK(kiln_session_run(s));
    TS_OK(kiln_session_get(s, "out", out, (size_t)nout * sizeof *out));
    for (int64_t t = 0; t < c->T; t += 2)
        for (int64_t i = 0; i < c->M * c->U; i++) {
            float v = out[t * c->M * c->U + i];
            ck_assert_msg(v == 0.0f && !signbit(v), "%s: token %lld element %lld is %g, want +0", label, (long long)t,
                          (long long)i, (double)v);
        }
    free(out);
    gpu_free(s, p, g, &h, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_matmul_id",
                        TS_CASE("fixed", 900), TS_LOOP(0, NFIXED, test_fixed),
                        TS_CASE_EACH(900, test_random, "random_f32", "random_f16", "random_bf16"),
                        TS_CASE("zero_rows", 900), TS_LOOP(0, 3, test_zero_rows));
    return ts_main_cache(s, "gpu-matmul-id", &g_cache_dir);
}
