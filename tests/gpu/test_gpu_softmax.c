/* GPU tests of the softmax family (soft_max, soft_max_ext): random cases per op and type,
 * compiled, run on the GPU and compared with kiln_reference by NMSE against fe_ops[op].nmse_tol
 * (ggml's test-backend-ops allows 1e-6 for soft_max), plus fixed cases for every kernel shape
 * (team, block, cluster, streamed), rows of 128k elements and more, and fully masked rows (NaN,
 * or 0 with a sink, as ggml), which NMSE cannot compare.
 *
 * Random soft_max_ext cases draw: a in any layout of gpu_support's operand() (permuted,
 * transposed, viewed with offsets, reshaped); a mask (f16 or f32, any layout, extra rows,
 * broadcast over dims 2 and 3, with -inf holes in contiguous ones); scale != 1; max_bias > 0
 * (ALiBi); sinks. $KILN_TEST_CASES sets the cases per op and type (default 24, at least 20 for a
 * real run). Each tcase can run alone (CK_RUN_CASE) so that a GPU machine can run them in
 * parallel. */
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

/* Shapes: fixed ones first (1, 7, 4097, multi-dim, every kernel shape, rows >= 128k), then
 * random ones of at most 2^20 elements. */
static void gen_shape(rng_t *r, int c, int64_t ne[4]) {
    static const int64_t fixed[][4] = {
        {1, 1, 1, 1},   {7, 1, 1, 1},    {4097, 1, 1, 1}, {4097, 3, 1, 1}, {7, 5, 3, 2},
        {1, 7, 1, 5},   {33, 17, 4, 3},  {131072, 2, 1, 1}, {140007, 1, 2, 1}, {32000, 3, 2, 1},
        {1024, 16, 4, 1}, {16384, 4, 1, 1},
    };
    if (c < (int)(sizeof fixed / sizeof fixed[0])) {
        memcpy(ne, fixed[c], sizeof fixed[c]);
        return;
    }
    static const int64_t pick0[] = {1, 2, 3, 7, 16, 33, 64, 128, 129, 256, 1000, 1024, 1025, 2048,
                                    4096, 4097, 8192, 20000, 32000, 65536, 131072, 200000};
    static const int64_t pick[] = {1, 1, 2, 3, 4, 7, 8, 16, 33};
    ne[0] = pick0[rng_int(r, 0, (int)(sizeof pick0 / sizeof pick0[0]) - 1)];
    for (int i = 1; i < 4; i++) ne[i] = i < rng_int(r, 1, 4) ? pick[rng_int(r, 0, 8)] : 1;
    for (int i = 3; i >= 1; i--)
        while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 20) && ne[i] > 1) ne[i] = (ne[i] + 1) / 2;
}

/* A divisor of n: n, 1, or another one. */
static int64_t divisor(rng_t *r, int64_t n) {
    int k = rng_int(r, 0, 3);
    if (k == 0) return n;
    if (k == 1) return 1;
    for (int64_t d = 2; d < n; d++)
        if (n % d == 0 && rng_int(r, 0, 1)) return d;
    return n;
}

/* -inf at every fifth element of each row from i0 = 3 (never i0 = 0, so no row is all -inf). */
static void punch_holes(hdata *d, int64_t ne0) {
    for (int64_t i = 0; i < d->n; i++)
        if ((i % ne0) % 5 == 3) kb_store_f32(d->data, d->type, i, -INFINITY);
}

typedef struct {
    kiln_type mask_type; /* KILN_TYPE_COUNT: no mask */
    int64_t   mask_ne[4];
    layout    mask_lay;
    bool      holes;
    float     scale, max_bias;
    bool      sinks;
} ext_args;

/* soft_max_ext's arguments for a of shape ne. */
static ext_args gen_ext(rng_t *r, const int64_t ne[4]) {
    ext_args e = {.mask_type = KILN_TYPE_COUNT, .scale = 1.0f};
    if (rng_int(r, 0, 3) != 0) {
        e.mask_type = rng_int(r, 0, 1) ? KILN_F16 : KILN_F32;
        e.mask_ne[0] = ne[0];
        e.mask_ne[1] = ne[1] + (rng_int(r, 0, 2) == 0 ? rng_int(r, 1, 3) : 0);
        e.mask_ne[2] = divisor(r, ne[2]);
        e.mask_ne[3] = divisor(r, ne[3]);
        e.mask_lay = rng_int(r, 0, 2) == 0 ? (layout)rng_int(r, 0, LAY_COUNT - 1) : LAY_PLAIN;
        e.holes = (e.mask_lay == LAY_PLAIN || e.mask_lay == LAY_RESHAPE) && ne[0] >= 4 && rng_int(r, 0, 1);
        if (rng_int(r, 0, 2) == 0) e.max_bias = rng_float(r, 0.5f, 8.0f);
    }
    if (rng_int(r, 0, 3) != 0) e.scale = rng_float(r, 0.05f, 2.0f);
    e.sinks = rng_int(r, 0, 1);
    return e;
}

/* Builds soft_max (ext NULL) or soft_max_ext of a over leaves added to h; describes them in desc. */
static kiln_tensor *build(kiln_ctx *ctx, hset *h, rng_t *lr, kiln_tensor *a, const int64_t ne[4],
                          const ext_args *e, uint64_t seed, char *desc, size_t desc_n) {
    if (!e) return kiln_soft_max(ctx, a);
    kiln_tensor *m = NULL, *k = NULL;
    char         dm[192] = "no mask";
    const char  *mt = "";
    if (e->mask_type != KILN_TYPE_COUNT) {
        m = operand(ctx, h, lr, "m", e->mask_type, e->mask_ne, e->mask_lay, FILL_ANY, seed + 11, dm, sizeof dm);
        mt = e->mask_type == KILN_F16 ? "f16 " : "f32 ";
        if (e->holes) punch_holes(&h->in[h->nin - 1], e->mask_ne[0]);
    }
    if (e->sinks) {
        int64_t ns[1] = {ne[2]};
        k = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F32, "k", 1, ns);
        hdata *d = hset_add(h, "k", KILN_F32, ne[2]);
        fill(d->data, KILN_F32, ne[2], seed + 13, FILL_ANY);
        for (int64_t i = 0; i < ne[2]; i++) ((float *)d->data)[i] *= 3.0f;
    }
    snprintf(desc, desc_n, "; %s%s%s; scale %g, max_bias %g%s", mt, dm,
             e->holes ? " with -inf holes" : "", (double)e->scale, (double)e->max_bias, e->sinks ? ", sinks" : "");
    return kiln_soft_max_ext(ctx, a, m, e->scale, e->max_bias, k);
}

static void run_case(fe_op op, kiln_type t, int c, uint64_t seed) {
    rng_t   r = {seed};
    int64_t ne[4];
    gen_shape(&r, c, ne);
    layout   la = c < 3 ? LAY_PLAIN : (layout)rng_int(&r, 0, LAY_COUNT - 1);
    ext_args e = gen_ext(&r, ne);

    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], dx[512] = "";
    rng_t     lr = {seed ^ 0xABCDEFull};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", t, ne, la, FILL_ANY, seed * 3 + 1, da, sizeof da);
    kiln_tensor *y = build(ctx, &h, &lr, a, ne, op == FE_OP_SOFT_MAX_EXT ? &e : NULL, seed, dx, sizeof dx);
    kiln_set_output(ctx, y, "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    char        label[900];
    snprintf(label, sizeof label, "op %s %s case %d (seed %llu): %s%s", fe_ops[op].name, kiln_type_name(t), c,
             (unsigned long long)seed, da, dx);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}

/* _i: op (0 soft_max, 1 soft_max_ext) * 3 + type. */
START_TEST(test_random) {
    need_gpu();
    fe_op     op = _i / 3 ? FE_OP_SOFT_MAX_EXT : FE_OP_SOFT_MAX;
    kiln_type t = FLOAT_TYPES[_i % 3];
    int       n = num_cases();
    for (int c = 0; c < n; c++) run_case(op, t, c, 7777ull * (uint64_t)(_i + 1) + 104729ull * (uint64_t)c);
}
END_TEST

/* Every feature at once, in each kernel shape: a permuted, an f16 and an f32 mask broadcast over
 * dims 2 and 3 with an extra row and -inf holes, ALiBi over 6 heads, scale 0.3, sinks. */
START_TEST(test_features) {
    need_gpu();
    static const int64_t n0[] = {33, 1024, 4096, 4097, 32000, 131072, 140007};
    int64_t              ne[4] = {n0[_i / 2], 2, 6, 2};
    while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 21)) ne[3] = 1, ne[1] = 1;
    ext_args e = {.mask_type = _i % 2 ? KILN_F32 : KILN_F16,
                  .mask_ne = {ne[0], ne[1] + 1, 3, 1},
                  .mask_lay = LAY_PLAIN,
                  .holes = true,
                  .scale = 0.3f,
                  .max_bias = 5.0f,
                  .sinks = true};
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], dx[512];
    rng_t     lr = {99 + (uint64_t)_i};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", KILN_F32, ne, LAY_PERMUTE, FILL_ANY, 5 + (uint64_t)_i, da, sizeof da);
    kiln_set_output(ctx, build(ctx, &h, &lr, a, ne, &e, 17, dx, sizeof dx), "out");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    char label[900];
    snprintf(label, sizeof label, "features: %s%s", da, dx);
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_SOFT_MAX_EXT].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}
END_TEST

/* Long rows and the benchmark shapes, contiguous and strided. */
START_TEST(test_long_rows) {
    need_gpu();
    static const struct {
        int64_t   ne[4];
        kiln_type t;
        layout    lay;
        bool      ext;
    } cs[] = {
        {{4096, 4096, 1, 1}, KILN_F32, LAY_PLAIN, false},  {{32000, 64, 1, 1}, KILN_F32, LAY_PLAIN, true},
        {{128256, 4, 1, 1}, KILN_F32, LAY_PLAIN, false},   {{131072, 3, 1, 1}, KILN_BF16, LAY_PLAIN, true},
        {{262144, 2, 1, 1}, KILN_F32, LAY_PLAIN, false},   {{131073, 2, 1, 1}, KILN_F16, LAY_VIEW, true},
        {{200000, 1, 2, 1}, KILN_F32, LAY_TRANSPOSE, true}, {{524288, 1, 1, 1}, KILN_F32, LAY_PLAIN, true},
    };
    int64_t ne[4];
    memcpy(ne, cs[_i].ne, sizeof ne);
    ext_args e = {.mask_type = KILN_F16, .mask_ne = {ne[0], ne[1], 1, 1}, .mask_lay = LAY_PLAIN, .holes = true,
                  .scale = 0.5f, .max_bias = ne[2] > 1 ? 2.0f : 0.0f, .sinks = true};
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      da[192], dx[512] = "";
    rng_t     lr = {7 + (uint64_t)_i};
    kiln_tensor *a = operand(ctx, &h, &lr, "a", cs[_i].t, ne, cs[_i].lay, FILL_ANY, 31 + (uint64_t)_i, da, sizeof da);
    kiln_set_output(ctx, build(ctx, &h, &lr, a, ne, cs[_i].ext ? &e : NULL, 23, dx, sizeof dx), "out");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    char label[900];
    snprintf(label, sizeof label, "long rows %s: %s%s", kiln_type_name(cs[_i].t), da, dx);
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_SOFT_MAX_EXT].nmse_tol};
    check_and_free(g, &h, ctx, &co);
}
END_TEST

/* Rows 0 and 2 of 4 fully masked: NaN as ggml (-inf - -inf), or 0 with a sink; rows 1 and 3 as
 * the reference (relative error 1e-5), in every kernel shape. */
START_TEST(test_fully_masked) {
    need_gpu();
    static const int64_t n0[] = {7, 1000, 4096, 40000, 140000};
    int64_t              n = n0[_i / 2], ne[4] = {n, 4, 1, 1};
    bool                 sink = _i % 2;
    kiln_ctx            *ctx = kiln_ctx_new();
    hset                 h = {0};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "a", 2, ne);
    kiln_tensor *m = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F16, "m", 2, ne);
    hdata       *da = hset_add(&h, "a", KILN_F32, 4 * n), *dm = hset_add(&h, "m", KILN_F16, 4 * n);
    fill(da->data, KILN_F32, 4 * n, 3, FILL_ANY);
    fill(dm->data, KILN_F16, 4 * n, 4, FILL_ANY);
    for (int64_t i = 0; i < n; i++) {
        kb_store_f32(dm->data, KILN_F16, i, -INFINITY);
        kb_store_f32(dm->data, KILN_F16, 2 * n + i, -INFINITY);
    }
    kiln_tensor *k = NULL;
    if (sink) {
        int64_t one = 1;
        k = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F32, "k", 1, &one);
        hdata *dk = hset_add(&h, "k", KILN_F32, 1);
        ((float *)dk->data)[0] = 0.5f;
    }
    kiln_set_output(ctx, kiln_soft_max_ext(ctx, a, m, 0.5f, 0.0f, k), "out");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    TS_OK(kiln_reference(g, ref_get, ref_put, &h));
    ck_assert_int_eq(h.nout, 1);
    kiln_program *p = compile(g, 0);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    TS_OK(kiln_session_set(s, "a", da->data, (size_t)(4 * n) * 4));
    TS_OK(kiln_session_set(s, "m", dm->data, (size_t)(4 * n) * 2));
    if (sink) TS_OK(kiln_session_set(s, "k", h.in[2].data, 4));
    TS_OK(kiln_session_run(s));
    float *out = malloc((size_t)(4 * n) * sizeof *out);
    ck_assert_ptr_nonnull(out);
    TS_OK(kiln_session_get(s, "out", out, (size_t)(4 * n) * 4));
    const float *ref = h.out[0].data;
    for (int64_t i = 0; i < 4 * n; i++) {
        bool masked = (i / n) % 2 == 0;
        if (masked && !sink) {
            ck_assert_msg(isnan(ref[i]) && isnan(out[i]), "n %lld: y[%lld] gpu %g ref %g, want NaN", (long long)n,
                          (long long)i, (double)out[i], (double)ref[i]);
        } else if (masked) {
            ck_assert_msg(ref[i] == 0.0f && out[i] == 0.0f, "n %lld sink: y[%lld] gpu %g ref %g, want 0", (long long)n,
                          (long long)i, (double)out[i], (double)ref[i]);
        } else {
            ck_assert_msg(fabsf(out[i] - ref[i]) <= 1e-5f * fabsf(ref[i]) + 1e-30f, "n %lld%s: y[%lld] gpu %.9g ref %.9g",
                          (long long)n, sink ? " sink" : "", (long long)i, (double)out[i], (double)ref[i]);
        }
    }
    free(out);
    gpu_free(s, p, g, &h, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_softmax",
                        TS_CASE_EACH(900, test_random, "soft_max_f32", "soft_max_f16", "soft_max_bf16",
                                     "soft_max_ext_f32", "soft_max_ext_f16", "soft_max_ext_bf16"),
                        TS_CASE("features", 900), TS_LOOP(0, 14, test_features),
                        TS_CASE("long_rows", 900), TS_LOOP(0, 8, test_long_rows),
                        TS_CASE("fully_masked", 900), TS_LOOP(0, 10, test_fully_masked));
    return ts_main_cache(s, "gpu-softmax", &g_cache_dir);
}
