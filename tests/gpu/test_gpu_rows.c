/* GPU tests of the rows family (get_rows, set_rows, concat, pad, add_id): random cases per op and
 * accepted type (shapes with 1, 7 and 4097, permuted / transposed / viewed / reshaped operands,
 * i32 and i64 ids, broadcast ids, duplicate ids), each compiled, run on the GPU and compared with
 * kiln_reference. The ops only copy, convert once or add once, so on top of ggml's tolerance
 * (fe_ops[op].nmse_tol, test-backend-ops' default 1e-7) every output must match the reference
 * exactly (NMSE 0). Ids out of range are tested on the GPU alone (the reference rejects them).
 *
 * One Check test per (op, type) runs all its cases, holding a session open so that the device's
 * primary context survives between cases. Each op is its own tcase: CK_RUN_CASE=get_rows runs
 * one. $KILN_TEST_CASES sets the cases per op and type (default 24, at least 20 for a real run). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 24;
    return n > 0 ? n : 24;
}

/* A session on a trivial program, kept open while a test runs its cases: the primary context
 * it retains is then reused by every case's session instead of being created again. */
typedef struct {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p;
    kiln_session *s;
} keepalive;

static keepalive keep_open(void) {
    need_gpu();
    keepalive k = {0};
    k.ctx = kiln_ctx_new();
    int64_t one[1] = {1};
    kiln_tensor *x = kiln_new_tensor(k.ctx, KILN_ROLE_INPUT, KILN_F32, "x", 1, one);
    kiln_set_output(k.ctx, kiln_pad(k.ctx, x, 1, 0, 0, 0), "y");
    TS_OK(kiln_graph_new(k.ctx, &k.g));
    k.p = compile(k.g, 0);
    TS_OK(kiln_session_new(k.p, NULL, &k.s));
    return k;
}

static void keep_close(keepalive *k) {
    kiln_session_free(k->s);
    kiln_program_free(k->p);
    kiln_graph_free(k->g);
    kiln_ctx_free(k->ctx);
}

/* Extents the cases draw from: the brief's 1, 7 and 4097, vector-friendly and odd sizes. */
static int64_t pick_extent(rng_t *r) {
    static const int64_t pick[] = {1, 1, 2, 3, 7, 8, 16, 33, 64, 100, 128, 256, 1000, 4096, 4097};
    return pick[rng_int(r, 0, (int)(sizeof pick / sizeof pick[0]) - 1)];
}

/* Row length of case c: fixed first (1, 7, 4097, 4096, 64), then random. */
static int64_t row_length(rng_t *r, int c) {
    static const int64_t fixed[] = {1, 7, 4097, 4096, 64, 128, 8};
    if (c < (int)(sizeof fixed / sizeof fixed[0])) return fixed[c];
    return pick_extent(r);
}

static layout pick_layout(rng_t *r, int c) { return c < 3 ? LAY_PLAIN : (layout)rng_int(r, 0, LAY_COUNT - 1); }

/* Keeps a shape's element count under 2^20 by halving its dims from the last one. */
static void limit(int64_t ne[4], int64_t max) {
    for (int i = 3; i >= 0; i--)
        while (ne[0] * ne[1] * ne[2] * ne[3] > max && ne[i] > 1) ne[i] = (ne[i] + 1) / 2;
}

/* Overwrites the host data of the leaf just added to h (an i32 or i64 tensor) with random
 * indices in [0, n). */
static void fill_ids(hset *h, rng_t *r, int64_t n) {
    hdata *d = &h->in[h->nin - 1];
    for (int64_t i = 0; i < d->n; i++) {
        int64_t v = (int64_t)(rng_next(r) % (uint64_t)n);
        if (d->type == KILN_I64) ((int64_t *)d->data)[i] = v;
        else ((int32_t *)d->data)[i] = (int32_t)v;
    }
}

/* Builds, checks against the reference (exactly) and frees one case. */
static void check_case(kiln_ctx *ctx, hset *h, kiln_tensor *out, fe_op op, const char *label) {
    kiln_set_output(ctx, out, "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
    double   worst = check_graph(g, h, &co);
    ck_assert_msg(worst == 0, "%s: NMSE %.3g; the op copies or adds once, so it must be exact", label, worst);
    kiln_graph_free(g);
    hset_free(h);
    kiln_ctx_free(ctx);
}

/* ---- the ops --------------------------------------------------------------------------------- */

static void case_get_rows(kiln_type t, int c, uint64_t seed) {
    rng_t   r = {seed};
    int64_t ne0 = row_length(&r, c), nrows = c == 0 ? 1 : pick_extent(&r);
    int64_t n = c == 1 ? 1 : rng_int(&r, 1, 70), m2 = rng_int(&r, 0, 2) ? 1 : rng_int(&r, 1, 3),
            m3 = rng_int(&r, 0, 3) ? 1 : rng_int(&r, 2, 3);
    int64_t na[4] = {ne0, nrows, m2, m3}, ni[4] = {n, m2, m3, 1};
    limit(na, 1 << 20);
    ni[1] = na[2], ni[2] = na[3];
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], di[192], label[512];
    rng_t     lr = {seed ^ 0x5151ull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
    kiln_tensor *ids = operand(ctx, &h, &lr, "ids", KILN_I32, ni, pick_layout(&r, c), FILL_ANY, seed * 3 + 2,
                               di, sizeof di);
    fill_ids(&h, &r, na[1]);
    snprintf(label, sizeof label, "op get_rows %s case %d (seed %llu): %s; %s", kiln_type_name(t), c,
             (unsigned long long)seed, da, di);
    check_case(ctx, &h, kiln_get_rows(ctx, a, ids), FE_OP_GET_ROWS, label);
}

/* A divisor of x: 1, x, or one in between. */
static int64_t pick_divisor(rng_t *r, int64_t x) {
    int k = rng_int(r, 0, 2);
    if (k == 0) return 1;
    if (k == 1) return x;
    for (int64_t d = x / 2; d > 1; d--)
        if (x % d == 0 && rng_int(r, 0, 1)) return d;
    return x;
}

static void case_set_rows(kiln_type t, int c, uint64_t seed) {
    rng_t     r = {seed};
    kiln_type it = c % 2 ? KILN_I64 : KILN_I32;
    int64_t   ne0 = row_length(&r, c), nrows = c == 0 ? 1 : pick_extent(&r);
    int64_t   m2 = rng_int(&r, 0, 1) ? 1 : rng_int(&r, 2, 4), m3 = rng_int(&r, 0, 2) ? 1 : rng_int(&r, 2, 3);
    int64_t   na[4] = {ne0, nrows, m2, m3};
    limit(na, 1 << 20);
    /* b's rows: from one to more than a has, so ids repeat (the last one wins). */
    int64_t nb[4] = {na[0], c == 1 ? 1 : rng_int(&r, 1, (int)(na[1] < 40 ? 2 * na[1] + 1 : 80)), na[2], na[3]};
    while (nb[0] * nb[1] * nb[2] * nb[3] > (1 << 19) && nb[1] > 1) nb[1] = (nb[1] + 1) / 2;
    int64_t ni[4] = {nb[1], pick_divisor(&r, na[2]), pick_divisor(&r, na[3]), 1};
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], db[192], di[192], label[700];
    rng_t     lr = {seed ^ 0x5e7ull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 5 + 1, da, sizeof da);
    kiln_tensor *b = operand(ctx, &h, &lr, "b", KILN_F32, nb, pick_layout(&r, c), FILL_ANY, seed * 5 + 2, db,
                             sizeof db);
    kiln_tensor *ids = operand(ctx, &h, &lr, "ids", it, ni, pick_layout(&r, c), FILL_ANY, seed * 5 + 3, di,
                               sizeof di);
    fill_ids(&h, &r, na[1]);
    snprintf(label, sizeof label, "op set_rows %s ids %s case %d (seed %llu): %s; %s; %s", kiln_type_name(t),
             kiln_type_name(it), c, (unsigned long long)seed, da, db, di);
    check_case(ctx, &h, kiln_set_rows(ctx, a, b, ids), FE_OP_SET_ROWS, label);
}

static void case_concat(kiln_type t, int c, uint64_t seed) {
    rng_t   r = {seed};
    int     dim = c % 4;
    int64_t na[4] = {row_length(&r, c), pick_extent(&r), rng_int(&r, 1, 3), rng_int(&r, 0, 1) ? 1 : rng_int(&r, 2, 3)};
    limit(na, 1 << 19);
    int64_t nb[4] = {na[0], na[1], na[2], na[3]};
    nb[dim] = rng_int(&r, 0, 2) ? rng_int(&r, 1, 9) : pick_extent(&r);
    limit(nb, 1 << 19);
    for (int d = 0; d < 4; d++)
        if (d != dim) na[d] = nb[d]; /* limit may have shrunk b */
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], db[192], label[512];
    rng_t     lr = {seed ^ 0xc0ull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
    kiln_tensor *b = operand(ctx, &h, &lr, "b", t, nb, pick_layout(&r, c), FILL_ANY, seed * 3 + 2, db, sizeof db);
    snprintf(label, sizeof label, "op concat dim %d %s case %d (seed %llu): %s; %s", dim, kiln_type_name(t), c,
             (unsigned long long)seed, da, db);
    check_case(ctx, &h, kiln_concat(ctx, a, b, dim), FE_OP_CONCAT, label);
}

static void case_pad(kiln_type t, int c, uint64_t seed) {
    rng_t   r = {seed};
    int64_t na[4] = {row_length(&r, c), pick_extent(&r), rng_int(&r, 1, 3), rng_int(&r, 0, 2) ? 1 : 2};
    limit(na, 1 << 19);
    int p[8];
    for (int i = 0; i < 8; i++) p[i] = rng_int(&r, 0, 2) ? 0 : rng_int(&r, 1, 3);
    if (c % 3 == 0) p[0] = 4 * rng_int(&r, 0, 2), p[1] = 8; /* whole vectors of padding */
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], label[512];
    rng_t     lr = {seed ^ 0xadull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
    snprintf(label, sizeof label, "op pad %s case %d (seed %llu): %s; lp/rp %d %d %d %d %d %d %d %d",
             kiln_type_name(t), c, (unsigned long long)seed, da, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    check_case(ctx, &h, kiln_pad_ext(ctx, a, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]), FE_OP_PAD, label);
}

static void case_add_id(kiln_type t, int c, uint64_t seed) {
    rng_t   r = {seed};
    int64_t ne0 = c == 3 ? 2880 : row_length(&r, c);
    int64_t na[4] = {ne0, rng_int(&r, 1, 8), c == 2 ? 1 : rng_int(&r, 1, 40), rng_int(&r, 0, 3) ? 1 : 2};
    limit(na, 1 << 19);
    int64_t nb[4] = {na[0], rng_int(&r, 1, 32), 1, 1}, ni[4] = {na[1], na[2], 1, 1};
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], db[192], di[192], label[700];
    rng_t     lr = {seed ^ 0x1dull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 5 + 1, da, sizeof da);
    kiln_tensor *b = operand(ctx, &h, &lr, "b", t, nb, pick_layout(&r, c), FILL_ANY, seed * 5 + 2, db, sizeof db);
    kiln_tensor *ids = operand(ctx, &h, &lr, "ids", KILN_I32, ni, pick_layout(&r, c), FILL_ANY, seed * 5 + 3, di,
                               sizeof di);
    fill_ids(&h, &r, nb[1]);
    snprintf(label, sizeof label, "op add_id %s case %d (seed %llu): %s; %s; %s", kiln_type_name(t), c,
             (unsigned long long)seed, da, db, di);
    check_case(ctx, &h, kiln_add_id(ctx, a, b, ids), FE_OP_ADD_ID, label);
}

typedef void (*case_fn)(kiln_type t, int c, uint64_t seed);

/* Runs every case of one op and type. */
static void run_cases(case_fn f, kiln_type t, uint64_t salt) {
    keepalive k = keep_open();
    int       n = num_cases();
    for (int c = 0; c < n; c++) f(t, c, salt * 1000003ull + (uint64_t)c * 7919ull + (uint64_t)t);
    keep_close(&k);
}

START_TEST(test_get_rows) { run_cases(case_get_rows, FLOAT_TYPES[_i], 11); }
END_TEST
START_TEST(test_set_rows) { run_cases(case_set_rows, FLOAT_TYPES[_i], 13); }
END_TEST
START_TEST(test_concat) { run_cases(case_concat, FLOAT_TYPES[_i], 17); }
END_TEST
START_TEST(test_pad) { run_cases(case_pad, FLOAT_TYPES[_i], 19); }
END_TEST
START_TEST(test_add_id) { run_cases(case_add_id, KILN_F32, 23); }
END_TEST

/* ---- ids out of range: the kernels stay in bounds ---------------------------------------------- */

/* Runs kg on the GPU (no reference: it rejects these ids) and returns output "y" as f32. */
static void run_gpu_only(const char *kg, const char *const *names, const void *const *data, const size_t *bytes,
                         int nin, float *y, size_t ybytes) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    kiln_program *p = compile(g, 0);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    for (int i = 0; i < nin; i++) TS_OK(kiln_session_set(s, names[i], data[i], bytes[i]));
    TS_OK(kiln_session_run(s));
    TS_OK(kiln_session_get(s, "y", y, ybytes));
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}

START_TEST(test_ids_out_of_range) {
    keepalive k = keep_open();
    float     a[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* 4 rows of 2 */
    float     b[4] = {10, 20, 30, 40};
    float     y[8];
    /* get_rows: a row of zeros for each bad id. */
    int32_t     gi[3] = {-1, 2, 4};
    const char *gn[2] = {"a", "i"};
    const void *gd[2] = {a, gi};
    size_t      gb[2] = {sizeof a, sizeof gi};
    run_gpu_only("input a: f32[2, 4]\ninput i: i32[3]\noutput y = get_rows(a, i)\n", gn, gd, gb, 2, y, 6 * sizeof(float));
    const float wg[6] = {0, 0, 5, 6, 0, 0};
    for (int i = 0; i < 6; i++) ck_assert_msg(y[i] == wg[i], "get_rows: y[%d] = %g, expected %g", i, y[i], wg[i]);
    /* set_rows: a bad id replaces no row. */
    int64_t     si[2] = {7, 1};
    const char *sn[3] = {"a", "b", "i"};
    const void *sd[3] = {a, b, si};
    size_t      sb[3] = {sizeof a, sizeof b, sizeof si};
    run_gpu_only("input a: f32[2, 4]\ninput b: f32[2, 2]\ninput i: i64[2]\noutput y = set_rows(a, b, i)\n", sn, sd,
                 sb, 3, y, sizeof y);
    const float ws[8] = {1, 2, 30, 40, 5, 6, 7, 8};
    for (int i = 0; i < 8; i++) ck_assert_msg(y[i] == ws[i], "set_rows: y[%d] = %g, expected %g", i, y[i], ws[i]);
    /* add_id: a bad id adds no bias. */
    int32_t     ai[4] = {1, -3, 0, 9};
    const char *an[3] = {"a", "b", "i"};
    const void *ad[3] = {a, b, ai};
    size_t      ab[3] = {sizeof a, sizeof b, sizeof ai};
    run_gpu_only("input a: f32[2, 4]\ninput b: f32[2, 2]\ninput i: i32[4]\noutput y = add_id(a, b, i)\n", an, ad,
                 ab, 3, y, sizeof y);
    const float wa[8] = {31, 42, 3, 4, 15, 26, 7, 8};
    for (int i = 0; i < 8; i++) ck_assert_msg(y[i] == wa[i], "add_id: y[%d] = %g, expected %g", i, y[i], wa[i]);
    keep_close(&k);
}
END_TEST

int main(void) {
    /* test_get_rows' _i: index into FLOAT_TYPES */
    Suite *s = TS_SUITE("gpu_rows",
                        TS_CASE("get_rows", 600), TS_LOOP(0, 3, test_get_rows), TS_TESTS(test_ids_out_of_range),
                        TS_CASE("set_rows", 600), TS_LOOP(0, 3, test_set_rows),
                        TS_CASE("concat", 600), TS_LOOP(0, 3, test_concat),
                        TS_CASE("pad", 600), TS_LOOP(0, 3, test_pad),
                        TS_CASE("add_id", 600), TS_TESTS(test_add_id));
    return ts_main_cache(s, "gpu-rows", &g_cache_dir);
}
