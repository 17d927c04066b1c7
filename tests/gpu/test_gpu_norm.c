/* GPU tests of the norm family (norm, rms_norm, l2_norm, group_norm): random cases per op and
 * type, each compiled, run on the GPU and compared with the CPU reference by NMSE against
 * fe_ops[op].nmse_tol (ggml's test-backend-ops keeps its default 1e-7 for these ops).
 *
 * Shapes cover rows of 1, 7, 4097 and longer than one block keeps in registers, the warp and
 * block kernels, uneven and empty groups; operands are plain, permuted, transposed, strided
 * views with offsets, and reshapes, in f32, f16 and bf16. $KILN_TEST_CASES sets the number of
 * cases per op and type (default 20). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static const fe_op OPS[] = {FE_OP_NORM, FE_OP_RMS_NORM, FE_OP_L2_NORM, FE_OP_GROUP_NORM};
#define NOPS (int)(sizeof OPS / sizeof OPS[0])

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 20;
    return n > 0 ? n : 20;
}

/* The fixed shapes first, then random ones of at most 2^19 elements. */
static void gen_shape(rng_t *r, fe_op op, int c, int64_t ne[4]) {
    static const int64_t rows[][4] = {
        {1, 1, 1, 1},    {7, 1, 1, 1},    {4097, 1, 1, 1}, {4097, 3, 1, 1},  {7, 5, 3, 2},
        {128, 33, 1, 1}, {1024, 9, 1, 1}, {1025, 4, 2, 1}, {200000, 2, 1, 1}, {64, 7, 4, 3},
        {2048, 16, 1, 1}, {1, 7, 1, 5},
    };
    static const int64_t groups[][4] = {
        {1, 1, 1, 1},  {7, 1, 1, 1},   {4097, 1, 3, 1}, {8, 8, 32, 1}, {7, 5, 3, 2},
        {64, 64, 40, 1}, {33, 17, 12, 2}, {1, 1, 7, 3}, {16, 16, 64, 2}, {5, 3, 10, 2},
    };
    const int64_t(*fixed)[4] = op == FE_OP_GROUP_NORM ? groups : rows;
    int nfixed = op == FE_OP_GROUP_NORM ? (int)(sizeof groups / sizeof groups[0]) : (int)(sizeof rows / sizeof rows[0]);
    if (c < nfixed) {
        memcpy(ne, fixed[c], sizeof fixed[c]);
        return;
    }
    static const int64_t pick[] = {1, 2, 3, 7, 16, 32, 33, 64, 127, 128, 512, 1024, 1025, 4096, 4097};
    int nd = rng_int(r, 1, 4);
    for (int i = 0; i < 4; i++) {
        if (i >= nd) ne[i] = 1;
        else if (rng_int(r, 0, 3) == 0) ne[i] = rng_int(r, 1, 40);
        else ne[i] = pick[rng_int(r, 0, (int)(sizeof pick / sizeof pick[0]) - 1)];
    }
    if (op == FE_OP_GROUP_NORM && ne[2] == 1) ne[2] = rng_int(r, 2, 40);
    for (int i = 3; i >= 0; i--)
        while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 19) && ne[i] > 1) ne[i] = (ne[i] + 1) / 2;
}

static kiln_tensor *build(kiln_ctx *ctx, fe_op op, kiln_tensor *a, int n_groups, float eps) {
    switch (op) {
    case FE_OP_NORM: return kiln_norm(ctx, a, eps);
    case FE_OP_RMS_NORM: return kiln_rms_norm(ctx, a, eps);
    case FE_OP_L2_NORM: return kiln_l2_norm(ctx, a, eps);
    case FE_OP_GROUP_NORM: return kiln_group_norm(ctx, a, n_groups, eps);
    default: ck_abort_msg("not a norm op: %s", fe_ops[op].name);
    }
    return NULL;
}

static void run_case(fe_op op, kiln_type t, int c) {
    uint64_t seed = 0x6e6f726dull * 1000003ull + (uint64_t)op * 7919ull + (uint64_t)t * 104729ull + (uint64_t)c;
    rng_t    r = {seed};
    int64_t  ne[4];
    gen_shape(&r, op, c, ne);
    layout lay = c < 3 ? LAY_PLAIN : (layout)rng_int(&r, 0, LAY_COUNT - 1);
    static const float EPS[] = {1e-5f, 1e-6f, 1e-12f, 0.0f, 0.5f};
    float eps = EPS[rng_int(&r, 0, op == FE_OP_L2_NORM ? 4 : 2)];
    int   n_groups = op == FE_OP_GROUP_NORM ? rng_int(&r, 1, (int)ne[2] + 2) : 0;
    if (op == FE_OP_GROUP_NORM && c == 3) n_groups = 32; /* SD-style: 32 groups of one channel */

    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      desc[192];
    rng_t     lr = {seed ^ 0xABCDEFull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, ne, lay, FILL_ANY, seed * 3 + 1, desc, sizeof desc);
    kiln_set_output(ctx, build(ctx, op, a, n_groups, eps), "out");
    char label[512], groups[32] = "";
    if (op == FE_OP_GROUP_NORM) snprintf(groups, sizeof groups, " n_groups %d", n_groups);
    snprintf(label, sizeof label, "op %s %s case %d (seed %llu): %s, eps %g%s", fe_ops[op].name,
             kiln_type_name(t), c, (unsigned long long)seed, desc, (double)eps, groups);
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}

/* _i = op * 3 + type. */
START_TEST(norm_ops) {
    need_gpu();
    fe_op     op = OPS[_i / 3];
    kiln_type t = FLOAT_TYPES[_i % 3];
    int       n = num_cases();
    for (int c = 0; c < n; c++) run_case(op, t, c);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_norm",
                        TS_CASE("norm", 900), TS_LOOP(0, NOPS * 3, norm_ops));
    return ts_main_cache(s, "gpu-norm", &g_cache_dir);
}
