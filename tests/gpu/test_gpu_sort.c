/* GPU tests of the sort family (argsort, argsort_top_k, top_k): each op over >= 20 random cases
 * (rows of 1, 7, 4097 and >= 131072 elements, batches, permuted/transposed/viewed/reshaped
 * operands, f32/f16/bf16, both orders, k = 1, 8, 32 and k = ne0), compiled with kiln_compile, run
 * on the GPU and compared with kiln_reference exactly (tolerance 0: the outputs are indices).
 *
 * kiln defines the order completely (ties keep index order, NaN above +inf, -0 == +0; see
 * docs/ops-sort.md), so exact comparison holds for any input: f32 inputs are made distinct, as
 * ggml's tests do, while f16/bf16 inputs keep the many ties their few values give, and one case
 * per op mixes in NaN, infinities and signed zeros.
 *
 * $KILN_TEST_CASES changes the number of cases per op (default 24). */
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

/* Distinct f32 values in [-1, 1): an odd multiplier permutes the residues mod 2^24, each exact. */
static void distinct_f32(hdata *d, uint64_t seed) {
    uint32_t mul = (uint32_t)(seed * 2654435761u) | 1u, add = (uint32_t)(seed >> 7);
    for (int64_t i = 0; i < d->n; i++) {
        uint32_t v = ((uint32_t)i * mul + add) & 0xffffffu;
        kb_store_f32(d->data, d->type, i, (float)v * 0x1p-23f - 1.0f);
    }
}

/* Every 7th element a special value: NaN, +-inf, +-0. */
static void special_values(hdata *d) {
    static const float sp[5] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f};
    for (int64_t i = 3; i < d->n; i += 7) kb_store_f32(d->data, d->type, i, sp[(i / 7) % 5]);
}

typedef struct {
    int64_t ne[4];
    int     k; /* top-k ops; 0: k = ne0 */
} sort_shape;

static const int64_t PICK_N[] = {1, 2, 7, 31, 32, 33, 100, 256, 1000, 1024, 1025, 4097, 6000, 20000};
#define N_PICK ((int)(sizeof PICK_N / sizeof PICK_N[0]))

/* A random shape of at most ~2^19 elements. */
static void random_shape(rng_t *r, int64_t ne[4]) {
    ne[0] = PICK_N[rng_int(r, 0, N_PICK - 1)];
    for (int d = 1; d < 4; d++) ne[d] = rng_int(r, 0, 2) ? rng_int(r, 1, 5) : 1;
    while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 19))
        for (int d = 1; d < 4; d++) ne[d] = (ne[d] + 1) / 2;
}

static void argsort_shape(rng_t *r, int c, int64_t ne[4]) {
    static const int64_t fixed[][4] = {
        {1, 1, 1, 1},    {7, 1, 1, 1},    {4097, 1, 1, 1}, {131072, 1, 1, 1}, {131073, 2, 1, 1},
        {7, 3, 2, 1},    {33, 17, 1, 1},  {256, 64, 1, 1}, {5632, 2, 1, 1},   {5633, 1, 1, 1},
        {1, 9, 1, 1},    {1024, 8, 1, 1},
    };
    if (c < (int)(sizeof fixed / sizeof fixed[0])) memcpy(ne, fixed[c], sizeof fixed[c]);
    else random_shape(r, ne);
}

/* Shape and k of a top-k case. */
static int top_k_shape(rng_t *r, int c, int64_t ne[4]) {
    static const sort_shape fixed[] = {
        {{1, 1, 1, 1}, 1},      {{7, 1, 1, 1}, 7},      {{4097, 1, 1, 1}, 1},   {{256, 64, 1, 1}, 8},
        {{512, 16, 1, 1}, 32},  {{8, 33, 1, 1}, 0},     {{4097, 3, 1, 1}, 32},  {{131072, 1, 1, 1}, 8},
        {{9000, 1, 1, 1}, 6000}, {{8000, 1, 1, 1}, 0},  {{64, 5, 3, 1}, 6},     {{1024, 7, 1, 1}, 32},
        {{2000, 3, 1, 1}, 33},  {{140000, 2, 1, 1}, 32},
    };
    if (c < (int)(sizeof fixed / sizeof fixed[0])) {
        memcpy(ne, fixed[c].ne, sizeof fixed[c].ne);
        return fixed[c].k ? fixed[c].k : (int)ne[0];
    }
    random_shape(r, ne);
    static const int ks[] = {1, 8, 32, 0, -1};
    int k = ks[rng_int(r, 0, 4)];
    if (k == 0 || k > ne[0]) k = (int)ne[0];
    if (k < 0) k = rng_int(r, 1, (int)ne[0]);
    return k;
}

/* One case of op: builds the graph, runs reference and GPU, compares exactly. */
static void run_case(fe_op op, int c, uint64_t seed) {
    rng_t     r = {seed};
    int64_t   ne[4];
    int       k = 0;
    bool      desc = false;
    if (op == FE_OP_ARGSORT) {
        argsort_shape(&r, c, ne);
        desc = c % 2 == 1;
    } else {
        k = top_k_shape(&r, c, ne);
    }
    kiln_type t = FLOAT_TYPES[(c + (int)op) % 3];
    if (c == 3 || c == 7) t = KILN_F32; /* the longest rows in f32, like the MoE/sampling users */
    layout lay = c < 3 ? LAY_PLAIN : (layout)rng_int(&r, 0, LAY_COUNT - 1);
    bool   special = (op == FE_OP_ARGSORT && c == 5) || (op != FE_OP_ARGSORT && c == 10);

    kiln_ctx    *ctx = kiln_ctx_new();
    hset         h = {0};
    char         da[192];
    rng_t        lr = {seed ^ 0xABCDEFull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, ne, lay, FILL_ANY, seed * 3 + 1, da, sizeof da);
    hdata       *d = &h.in[h.nin - 1];
    if (t == KILN_F32) distinct_f32(d, seed);
    if (special) special_values(d);
    kiln_tensor *y = op == FE_OP_ARGSORT ? kiln_argsort(ctx, a, desc ? KILN_SORT_DESC : KILN_SORT_ASC)
                     : op == FE_OP_TOP_K ? kiln_top_k(ctx, a, k)
                                         : kiln_argsort_top_k(ctx, a, k);
    kiln_set_output(ctx, y, "out");
    char label[512], what[64];
    if (op == FE_OP_ARGSORT) snprintf(what, sizeof what, "order %s", desc ? "desc" : "asc");
    else snprintf(what, sizeof what, "k %d", k);
    snprintf(label, sizeof label, "op %s %s case %d (seed %llu): %s, %s%s", fe_ops[op].name, kiln_type_name(t), c,
             (unsigned long long)seed, da, what, special ? ", with NaN/inf/-0" : "");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
    ck_assert_msg(fe_ops[op].nmse_tol == 0, "%s: indices must compare exactly", label);
    check_and_free(g, &h, ctx, &co);
}

static void run_op(fe_op op) {
    need_gpu();
    int n = num_cases();
    for (int c = 0; c < n; c++) run_case(op, c, 7000003ull * (uint64_t)(op + 1) + 104729ull * (uint64_t)c + 17);
}

START_TEST(test_argsort) { run_op(FE_OP_ARGSORT); }
END_TEST

START_TEST(test_top_k) { run_op(FE_OP_TOP_K); }
END_TEST

START_TEST(test_argsort_top_k) { run_op(FE_OP_ARGSORT_TOP_K); }
END_TEST

/* MoE routing as a model builds it: probabilities, the top k experts, their weights by get_rows
 * would follow; here the ids of many tokens over 256 experts, repeated runs replaying the graph
 * give the same ids. */
START_TEST(test_router_replay) {
    need_gpu();
    kiln_ctx    *ctx = kiln_ctx_new();
    hset         h = {0};
    int64_t      ne[4] = {256, 512, 1, 1};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "logits", 2, ne);
    hdata       *d = hset_add(&h, "logits", KILN_F32, ne[0] * ne[1]);
    distinct_f32(d, 99);
    kiln_set_output(ctx, kiln_top_k(ctx, a, 8), "ids");
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    cmp_opts co = {.label = "router top_k 8 of 256, 512 tokens", .tol_f32 = 0};
    check_graph(g, &h, &co);
    co.no_graph = true;
    co.label = "router top_k 8 of 256, 512 tokens, plain launches";
    check_and_free(g, &h, ctx, &co);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_sort",
                        TS_CASE("sort", 600),
                        TS_TESTS(test_argsort, test_top_k, test_argsort_top_k, test_router_replay));
    return ts_main_cache(s, "gpu-sort", &g_cache_dir);
}
