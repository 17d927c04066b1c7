/* GPU tests of the reduce family (sum, sum_rows, mean, argmax, cumsum): for every op and every
 * type it accepts, random cases (shapes including 1, 7, 4097 and rows of 131075; plain,
 * permuted, transposed, viewed and reshaped operands) compiled, run on the GPU and compared
 * with kiln_reference.
 *
 * Tolerances are FE_OPS's (ggml's test-backend-ops has no max_nmse_err override for SUM,
 * SUM_ROWS, MEAN or CUMSUM, so the default 1e-7; argmax is exact). The kernels accumulate in
 * f32 in a different order than the reference (double for f32 row sums, float sequentially for
 * cumsum and low-precision sums), which the f32 NMSE absorbs. Inputs follow test-backend-ops:
 * sum and mean read [-0.9, 1.1) (away from cancellation), the others [-1, 1). Two adjustments
 * keep the comparison meaningful rather than lucky:
 *  - sum and sum_rows of f16/bf16 store their result in that type, where an f32 difference of
 *    one part in 10^7 can still flip the last bit of a rounded total (an NMSE of ~1e-6 for a
 *    one-element output). Their inputs are multiples of 2^-7 in [-1, 1] and at most 2^16 of
 *    them, so every partial sum is exact in f32 in any order and the results must agree
 *    exactly;
 *  - argmax inputs have a unique maximum per row (ties are resolved differently by design:
 *    ggml keeps the last of equal maxima, and so do the kernels, but the test does not depend
 *    on it).
 * $KILN_TEST_CASES changes the number of cases per op and type (default 24). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static const fe_op OPS[] = {FE_OP_SUM, FE_OP_SUM_ROWS, FE_OP_MEAN, FE_OP_ARGMAX, FE_OP_CUMSUM};
#define N_OPS ((int)(sizeof OPS / sizeof OPS[0]))

static kiln_tensor *apply(kiln_ctx *ctx, fe_op op, kiln_tensor *a) {
    switch (op) {
    case FE_OP_SUM: return kiln_sum(ctx, a);
    case FE_OP_SUM_ROWS: return kiln_sum_rows(ctx, a);
    case FE_OP_MEAN: return kiln_mean(ctx, a);
    case FE_OP_ARGMAX: return kiln_argmax(ctx, a);
    default: return kiln_cumsum(ctx, a);
    }
}

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 24;
    return n > 0 ? n : 24;
}

/* Whether op accepts type t (the frontend's answer). */
static bool accepts(fe_op op, kiln_type t) {
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[2] = {4, 2};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, "a", 2, ne);
    kiln_set_output(ctx, apply(ctx, op, a), "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    bool        ok = st == NULL;
    kiln_status_free(st);
    ts_graph_free(g, ctx);
    return ok;
}

/* Whether the result is stored in f16/bf16 with few enough bits that inputs must be exact. */
static bool exact_inputs(fe_op op, kiln_type t) {
    return (op == FE_OP_SUM || op == FE_OP_SUM_ROWS) && t != KILN_F32;
}

/* Shapes: fixed ones first (1, 7, 4097, long rows, multi-dim), then random up to 4 dims. */
static void gen_shape(rng_t *r, int c, fe_op op, kiln_type t, int64_t ne[4]) {
    static const int64_t fixed[][4] = {
        {1, 1, 1, 1},   {7, 1, 1, 1},    {4097, 1, 1, 1},   {4097, 3, 1, 1}, {7, 1, 3, 2},
        {1, 7, 1, 5},   {33, 17, 4, 3},  {2, 4097, 1, 1},   {131075, 2, 1, 1}, {1024, 64, 1, 1},
        {4096, 16, 1, 1}, {32, 129, 1, 1},
    };
    if (c < (int)(sizeof fixed / sizeof fixed[0])) {
        memcpy(ne, fixed[c], sizeof fixed[c]);
    } else {
        static const int64_t pick[] = {1, 1, 2, 3, 7, 16, 33, 64, 129, 1000, 4097, 8192};
        int nd = rng_int(r, 1, 4);
        for (int i = 0; i < 4; i++) {
            if (i >= nd) ne[i] = 1;
            else if (rng_int(r, 0, 3) == 0) ne[i] = rng_int(r, 1, 40);
            else ne[i] = pick[rng_int(r, 0, (int)(sizeof pick / sizeof pick[0]) - 1)];
        }
    }
    int64_t cap = exact_inputs(op, t) ? (1 << 16) : (1 << 19);
    for (int i = 3; i >= 0; i--)
        while (ne[0] * ne[1] * ne[2] * ne[3] > cap && ne[i] > 1) ne[i] = (ne[i] + 1) / 2;
    if (op == FE_OP_ARGMAX) { /* a matrix: fold dims 2 and 3 into dim 1 */
        ne[1] *= ne[2] * ne[3];
        ne[2] = ne[3] = 1;
    }
}

/* Element index (in the leaf's data) of x's logical coordinates c: x is the leaf or a view of it. */
static int64_t leaf_index(const kiln_tensor *x, const int64_t c[4]) {
    size_t es = kiln_type_size(x->type), off = x->view_src ? x->view_offs : 0;
    for (int d = 0; d < 4; d++) off += (size_t)c[d] * x->nb[d];
    return (int64_t)(off / es);
}

/* Per logical row of x, keeps the first occurrence of the maximum and lowers its equals to -2. */
static void unique_row_max(const kiln_tensor *x, hdata *d) {
    int64_t c[4];
    for (c[3] = 0; c[3] < x->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < x->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < x->ne[1]; c[1]++) {
                c[0] = 0;
                float m = kb_load_f32(d->data, d->type, leaf_index(x, c));
                for (c[0] = 1; c[0] < x->ne[0]; c[0]++) {
                    float v = kb_load_f32(d->data, d->type, leaf_index(x, c));
                    if (v > m) m = v;
                }
                bool seen = false;
                for (c[0] = 0; c[0] < x->ne[0]; c[0]++) {
                    int64_t i = leaf_index(x, c);
                    if (kb_load_f32(d->data, d->type, i) != m) continue;
                    if (seen) kb_store_f32(d->data, d->type, i, -2.0f);
                    seen = true;
                }
            }
}

static void adjust_inputs(fe_op op, const kiln_tensor *x, hdata *d) {
    for (int64_t i = 0; i < d->n; i++) {
        float v = kb_load_f32(d->data, d->type, i);
        if (exact_inputs(op, d->type)) v = roundf(v * 128.0f) / 128.0f; /* exact in f16 and bf16 */
        else if (op == FE_OP_SUM || op == FE_OP_MEAN) v += 0.1f;      /* [-0.9, 1.1) */
        kb_store_f32(d->data, d->type, i, v);
    }
    if (op == FE_OP_ARGMAX) unique_row_max(x, d);
}

static void run_case(fe_op op, kiln_type t, int c, uint64_t seed) {
    rng_t   r = {seed};
    int64_t ne[4];
    gen_shape(&r, c, op, t, ne);
    /* The first cases plain; then every layout in turn. */
    layout lay = c < 3 ? LAY_PLAIN : (layout)((c - 3) % LAY_COUNT);

    kiln_ctx    *ctx = kiln_ctx_new();
    hset         h = {0};
    char         da[192];
    rng_t        lr = {seed ^ 0xABCDEFull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, ne, lay, FILL_ANY, seed * 3 + 1, da, sizeof da);
    ck_assert_ptr_nonnull(a);
    adjust_inputs(op, a, &h.in[0]);
    kiln_set_output(ctx, apply(ctx, op, a), "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    char        label[400];
    snprintf(label, sizeof label, "op %s %s case %d (seed %llu): %s", fe_ops[op].name, kiln_type_name(t), c,
             (unsigned long long)seed, da);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}

START_TEST(test_reduce_ops) {
    need_gpu();
    fe_op     op = OPS[_i / 3];
    kiln_type t = FLOAT_TYPES[_i % 3];
    if (!accepts(op, t)) {
        ck_assert_msg(t != KILN_F32, "op %s must accept f32", fe_ops[op].name);
        ck_assert_msg(op == FE_OP_CUMSUM, "op %s must accept %s", fe_ops[op].name, kiln_type_name(t));
        printf("note: op %s does not accept %s (as in ggml); skipped\n", fe_ops[op].name, kiln_type_name(t));
        return;
    }
    int n = num_cases();
    for (int c = 0; c < n; c++)
        run_case(op, t, c, 1000003ull * (uint64_t)(_i / 3 + 1) + 7919ull * (uint64_t)(_i % 3) + (uint64_t)c);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_reduce",
                        TS_CASE("reduce", 900), TS_LOOP(0, N_OPS * 3, test_reduce_ops));
    return ts_main_cache(s, "gpu-reduce", &g_cache_dir);
}
