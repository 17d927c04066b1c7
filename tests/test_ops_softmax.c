/* The softmax family (soft_max, soft_max_ext): the CPU reference against values computed by hand
 * (or by a plain double-precision softmax written here), the frontend's errors, and every op's
 * kernel generated and compiled by NVRTC for sm_90a and sm_80 over a spread of shapes, types,
 * masks and layouts, covering each kernel shape (team, block, cluster, streamed). No GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

/* ---- the reference, by hand ------------------------------------------------------------------ */


static void expect(ts_hands *h, const double *want, int64_t n, double tol, const char *what) {
    const ts_slot *y = ts_hands_slot(h, "y");
    ck_assert_msg(y->n == n, "%s: %lld outputs, want %lld", what, (long long)y->n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(y->v[i] - want[i]) <= tol, "%s: y[%lld] = %.9g, want %.9g", what, (long long)i,
                      (double)y->v[i], want[i]);
}

/* A plain softmax in double of x[0..n) with an optional sink (NAN: none): the oracle's oracle. */
static void softmax_d(const double *x, int n, double sink, double *out) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    if (!isnan(sink) && sink > m) m = sink;
    double s = isnan(sink) ? 0.0 : exp(sink - m);
    for (int i = 0; i < n; i++) s += exp(x[i] - m);
    for (int i = 0; i < n; i++) out[i] = exp(x[i] - m) / s;
}

START_TEST(ref_soft_max_basic) {
    ts_hands h = {0};
    float *a = ts_hands_add(&h, "a");
    const float va[8] = {1, 2, 3, 4, 0, 0, 0, 0};
    memcpy(a, va, sizeof va);
    const ts_slot *y = ts_hands_output("input a: f32[4, 2]\noutput y = soft_max(a)\n", &h, "y");
    const double want[8] = {0.03205860328008499, 0.08714431874203257, 0.23688281808991013, 0.6439142598879724,
                            0.25, 0.25, 0.25, 0.25};
    expect(&h, want, 8, 1e-7, "soft_max([1,2,3,4])");
    ck_assert_int_eq(y->type, KILN_F32);
    /* soft_max_ext with the defaults is soft_max. */
    ts_hands_output("input a: f32[4, 2]\noutput y = soft_max_ext(a)\n", &h, "y");
    expect(&h, want, 8, 1e-7, "soft_max_ext(a) defaults");
}
END_TEST

/* scale and an f32 mask with -inf: x = [0.5, -inf, 1.5, 3]. */
START_TEST(ref_scale_mask_inf) {
    ts_hands h = {0};
    float *a = ts_hands_add(&h, "a"), *m = ts_hands_add(&h, "m");
    const float va[4] = {1, 2, 3, 4}, vm[4] = {0, -INFINITY, 0, 1};
    memcpy(a, va, sizeof va);
    memcpy(m, vm, sizeof vm);
    ts_hands_output("input a: f32[4]\ninput m: f32[4]\noutput y = soft_max_ext(a, m, 0.5)\n", &h, "y");
    const double want[4] = {0.0628900132458675, 0.0, 0.17095278019779026, 0.7661572065563422};
    expect(&h, want, 4, 1e-7, "soft_max_ext(scale 0.5, -inf mask)");
}
END_TEST

/* An f16 mask with more rows than a (the extra row is never read), broadcast over dims 2 and 3:
 * a [3, 2, 4, 2] with a mask [3, 3, 2, 1]: mask plane i2 % 2, the same for both i3. */
START_TEST(ref_mask_broadcast) {
    ts_hands h = {0};
    float *a = ts_hands_add(&h, "a"), *m = ts_hands_add(&h, "m");
    for (int i = 0; i < 48; i++) a[i] = (float)((i * 7) % 11) * 0.25f - 1.0f;
    for (int i = 0; i < 18; i++) m[i] = (float)((i * 5) % 9) * 0.5f - 2.0f; /* exact in f16 */
    m[4] = -INFINITY;                                                       /* (1, 1, 0) */
    for (int i = 6; i < 9; i++) m[i] = 1000.0f; /* row 2 of plane 0: never read */
    const ts_slot *y =
        ts_hands_output("input a: f32[3, 2, 4, 2]\ninput m: f16[3, 3, 2]\noutput y = soft_max_ext(a, m, 0.75)\n", &h, "y");
    double want[48];
    for (int i3 = 0; i3 < 2; i3++)
        for (int i2 = 0; i2 < 4; i2++)
            for (int i1 = 0; i1 < 2; i1++) {
                double x[3];
                int    r = (i3 * 4 + i2) * 2 + i1;
                for (int i0 = 0; i0 < 3; i0++)
                    x[i0] = (double)(a[r * 3 + i0] * 0.75f) + m[(i2 % 2) * 9 + i1 * 3 + i0];
                softmax_d(x, 3, NAN, want + r * 3);
            }
    expect(&h, want, 48, 1e-6, "mask broadcast over dims 2 and 3");
    ck_assert(y->v[4] == 0.0f); /* the -inf element of plane 0, row 1, at i3 = 0 ... */
    ck_assert(y->v[24 + 4] == 0.0f); /* ... and at i3 = 1 */
}
END_TEST

/* ALiBi: 3 heads -> n_head_log2 = 2, max_bias 8: m0 = 2^-4, m1 = 2^-2; slopes 1/16, 1/256 and
 * m1^1 = 1/4. a = 0 and mask = [0, 1, 2, 3], so x = slope * [0, 1, 2, 3]. */
START_TEST(ref_alibi) {
    ts_hands h = {0};
    float *a = ts_hands_add(&h, "a"), *m = ts_hands_add(&h, "m");
    memset(a, 0, 12 * sizeof *a);
    for (int i = 0; i < 4; i++) m[i] = (float)i;
    ts_hands_output("input a: f32[4, 1, 3]\ninput m: f32[4]\noutput y = soft_max_ext(a, m, 1, 8)\n", &h, "y");
    const double want[12] = {0.22707284323348026, 0.2417177833927635,  0.2573072410435041,  0.2739021323302522,
                             0.24853706917441049, 0.24950981575963635, 0.2504863695673511,  0.2514667454986021,
                             0.16529617667112,    0.21224449212702542, 0.27252732244308187, 0.3499320087587727};
    expect(&h, want, 12, 1e-6, "alibi, 3 heads, max_bias 8");

    /* 5 heads: n_head_log2 = 4, max_bias 4: m0 = 2^-1, m1 = 2^-0.5; head 4 uses m1^1. */
    memset(a, 0, 20 * sizeof *a);
    ts_hands_output("input a: f32[4, 1, 5]\ninput m: f32[4]\noutput y = soft_max_ext(a, m, max_bias=4)\n", &h, "y");
    double want5[20];
    const double slopes[5] = {0.5, 0.25, 0.125, 0.0625, 0.7071067811865476};
    for (int hd = 0; hd < 5; hd++) {
        double x[4];
        for (int i = 0; i < 4; i++) x[i] = slopes[hd] * i;
        softmax_d(x, 4, NAN, want5 + hd * 4);
    }
    expect(&h, want5, 20, 1e-6, "alibi, 5 heads, max_bias 4");

    /* max_bias 0 means slope 1, whatever the heads. */
    const ts_slot *y = ts_hands_output("input a: f32[4, 1, 3]\ninput m: f32[4]\noutput y = soft_max_ext(a, m, 1, 0)\n", &h, "y");
    double w1[4], x1[4] = {0, 1, 2, 3};
    softmax_d(x1, 4, NAN, w1);
    for (int hd = 0; hd < 3; hd++)
        for (int i = 0; i < 4; i++) ck_assert(fabs(y->v[hd * 4 + i] - w1[i]) < 1e-7);
}
END_TEST

/* Sinks: one logit per head in the max and the denominator, never in the output. a = 0 (2 per
 * row): head 0's sink ln 2 gives 0.25 each, head 1's sink 0 gives 1/3 each. */
START_TEST(ref_sinks) {
    ts_hands h = {0};
    float *a = ts_hands_add(&h, "a"), *k = ts_hands_add(&h, "k");
    memset(a, 0, 8 * sizeof *a);
    k[0] = 0.69314718f;
    k[1] = 0.0f;
    ts_hands_output("input a: f32[2, 2, 2]\ninput k: f32[2]\noutput y = soft_max_ext(a, sinks=k)\n", &h, "y");
    const double t = 1.0 / 3.0, want[8] = {0.25, 0.25, 0.25, 0.25, t, t, t, t};
    expect(&h, want, 8, 1e-7, "sinks");
    /* A large sink takes almost everything. */
    k[0] = 20.0f;
    const ts_slot *y = ts_hands_output("input a: f32[2, 2, 2]\ninput k: f32[2]\noutput y = soft_max_ext(a, sinks=k)\n", &h, "y");
    ck_assert(y->v[0] < 1e-8 && y->v[0] > 0);
}
END_TEST

/* A row masked entirely to -inf: max = -inf and -inf - -inf = NaN, as ggml; a sink makes the row
 * 0 instead. Other rows are unaffected. */
START_TEST(ref_fully_masked) {
    ts_hands h = {0};
    float *a = ts_hands_add(&h, "a"), *m = ts_hands_add(&h, "m"), *k = ts_hands_add(&h, "k");
    for (int i = 0; i < 6; i++) a[i] = (float)i;
    for (int i = 0; i < 3; i++) m[i] = -INFINITY;
    for (int i = 3; i < 6; i++) m[i] = 0.0f;
    k[0] = 0.0f;
    const ts_slot *y = ts_hands_output("input a: f32[3, 2]\ninput m: f16[3, 2]\noutput y = soft_max_ext(a, m)\n", &h, "y");
    for (int i = 0; i < 3; i++) ck_assert_msg(isnan(y->v[i]), "y[%d] = %g, want NaN", i, (double)y->v[i]);
    double want[3], x[3] = {3, 4, 5};
    softmax_d(x, 3, NAN, want);
    for (int i = 0; i < 3; i++) ck_assert(fabs(y->v[3 + i] - want[i]) < 1e-7);
    ts_hands_output("input a: f32[3, 2]\ninput m: f16[3, 2]\ninput k: f32[1]\noutput y = soft_max_ext(a, m, sinks=k)\n",
                    &h, "y");
    for (int i = 0; i < 3; i++) ck_assert(y->v[i] == 0.0f);
    softmax_d(x, 3, 0.0, want);
    for (int i = 0; i < 3; i++) ck_assert(fabs(y->v[3 + i] - want[i]) < 1e-7);
}
END_TEST

/* Views: a transposed leaf and an offset view give the softmax of their logical values. */
START_TEST(ref_views) {
    ts_hands h = {0};
    float *b = ts_hands_add(&h, "b");
    for (int i = 0; i < 8; i++) b[i] = (float)(i % 4) - (float)(i / 4) * 0.5f; /* [[0,1,2,3],[-.5,.5,1.5,2.5]] */
    ts_hands_output("input b: f32[4, 2]\nt = transpose(b)\noutput y = soft_max_ext(t, scale=2)\n", &h, "y");
    double want[8];
    for (int r = 0; r < 4; r++) {
        double x[2] = {2.0 * b[r], 2.0 * b[4 + r]};
        softmax_d(x, 2, NAN, want + 2 * r);
    }
    expect(&h, want, 8, 1e-7, "transposed");
    ts_hands_output("input b: f32[4, 2]\nv = view(b, [3, 2], [16], 4)\noutput y = soft_max(v)\n", &h, "y");
    for (int r = 0; r < 2; r++) {
        double x[3] = {b[4 * r + 1], b[4 * r + 2], b[4 * r + 3]};
        softmax_d(x, 3, NAN, want + 3 * r);
    }
    expect(&h, want, 6, 1e-7, "offset view");
}
END_TEST

/* f16 and bf16 a: computed in f32, rounded once to a's type. */
START_TEST(ref_half_types) {
    static const char *types[2] = {"f16", "bf16"};
    static const kiln_type kt[2] = {KILN_F16, KILN_BF16};
    for (int t = 0; t < 2; t++) {
        ts_hands h = {0};
        float *a = ts_hands_add(&h, "a");
        const float va[4] = {1, 2, 3, 4};
        memcpy(a, va, sizeof va);
        char kg[128];
        snprintf(kg, sizeof kg, "input a: %s[4]\noutput y = soft_max(a)\n", types[t]);
        const ts_slot *y = ts_hands_output(kg, &h, "y");
        ck_assert_int_eq(y->type, kt[t]);
        const double want[4] = {0.03205860328008499, 0.08714431874203257, 0.23688281808991013, 0.6439142598879724};
        for (int i = 0; i < 4; i++) {
            /* the f32 result rounded to the type, exactly */
            uint16_t r;
            kb_store_f32(&r, kt[t], 0, (float)want[i]);
            float rv = kb_load_f32(&r, kt[t], 0);
            ck_assert_msg(fabsf(y->v[i] - rv) <= fabsf(rv) * (t ? 8e-3f : 1e-3f), "%s y[%d] = %g want %g",
                          types[t], i, (double)y->v[i], (double)rv);
        }
    }
}
END_TEST

/* ---- frontend errors ------------------------------------------------------------------------ */

static void expect_error(const char *kg, kiln_code code, const char *needle) {
    ts_parse_error(kg, code, TS_NEEDLES(needle));
}

START_TEST(errors) {
    expect_error("input a: i32[4]\ny = soft_max(a)\n", KILN_ERR_SHAPE, "soft_max: operand 'a' (i32[4]) must be f32");
    expect_error("input a: i64[4]\ninput m: f32[4]\ny = soft_max_ext(a, m)\n", KILN_ERR_SHAPE, "soft_max_ext: operand 'a'");
    expect_error("input a: f32[4, 2]\ninput m: bf16[4, 2]\ny = soft_max_ext(a, m)\n", KILN_ERR_SHAPE,
                 "mask 'm' (bf16[4, 2]) must be f16 or f32");
    expect_error("input a: f32[4, 2]\ninput m: f32[5, 2]\ny = soft_max_ext(a, m)\n", KILN_ERR_SHAPE,
                 "must have the ne0 of 'a' (f32[4, 2])");
    expect_error("input a: f32[4, 3]\ninput m: f16[4, 2]\ny = soft_max_ext(a, m)\n", KILN_ERR_SHAPE,
                 "at least its ne1 rows");
    expect_error("input a: f32[4, 2, 3]\ninput m: f16[4, 2, 2]\ny = soft_max_ext(a, m)\n", KILN_ERR_SHAPE,
                 "ne2 and ne3 must divide");
    expect_error("input a: f32[4, 2, 1, 3]\ninput m: f16[4, 2, 1, 2]\ny = soft_max_ext(a, m)\n", KILN_ERR_SHAPE,
                 "must broadcast over");
    expect_error("input a: f32[4, 2, 3]\ninput k: f16[3]\ny = soft_max_ext(a, sinks=k)\n", KILN_ERR_SHAPE,
                 "sinks 'k' (f16[3]) must be f32");
    expect_error("input a: f32[4, 2, 3]\ninput k: f32[2]\ny = soft_max_ext(a, sinks=k)\n", KILN_ERR_SHAPE,
                 "one value per head");
    expect_error("input a: f32[4, 3]\ninput k: f32[3]\ny = soft_max_ext(a, sinks=k)\n", KILN_ERR_SHAPE,
                 "ne0 == ne2 of 'a' (f32[4, 3])");
    expect_error("input a: f32[4, 2]\ny = soft_max_ext(a, scale=1, max_bias=2)\n", KILN_ERR_INVALID,
                 "max_bias 2 > 0 (ALiBi) needs a mask");
    /* the C API takes the same path */
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[2] = {4, 2};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "a", 2, ne);
    ck_assert_ptr_null(kiln_soft_max_ext(ctx, a, NULL, 1.0f, 1.0f, NULL));
    ts_ctx_error(ctx, KILN_ERR_INVALID, NULL);
}
END_TEST

/* The rows that ggml accepts build (negative max_bias is slope 1; mask rows beyond ne1). */
START_TEST(accepted) {
    ts_builds("input a: f32[4, 2]\ninput m: f16[4, 9]\ny = soft_max_ext(a, m, 1, -3)\noutput z = cont(y)\n");
    ts_builds("input a: bf16[4, 2, 6, 2]\ninput m: f32[4, 2, 3]\ninput k: f32[6]\n"
              "output y = soft_max_ext(a, m, 0.5, 8, k)\n");
    ts_builds("input a: f32[4, 3]\ninput s: f32[1]\n"
              "output y = soft_max_ext(a, mask=a, scale=0.5, max_bias=0, sinks=s)\n");
}
END_TEST

/* ---- kernels: generated and compiled ---------------------------------------------------------- */

static char *g_cache;

/* Compiles src straight through NVRTC with kiln's options for arch, to see its log: generated
 * code must compile without warnings. */
typedef struct {
    const char *kg;
    const char *want; /* a substring the softmax kernel's source must contain */
} gcase;

/* The graphs: every kernel shape, mask types and broadcasts, ALiBi, sinks, scale, layouts, types. */
static const gcase CASES[] = {
    /* team kernels: rows of 1 .. 1024 elements */
    {"input a: f32[1, 3]\noutput y = soft_max(a)\n", "a team of 1 lane per row"},
    {"input a: f32[7, 5, 3]\ninput m: f32[7, 6, 3]\noutput y = soft_max_ext(a, m, 0.5)\n", "a team of 8 lanes"},
    {"input a: f16[64, 33]\ninput m: f16[64, 33]\noutput y = soft_max_ext(a, m, 0.125)\n", "vectors of 4"},
    {"input a: bf16[1024, 16, 4]\ninput m: f16[1024, 16]\ninput k: f32[4]\n"
     "output y = soft_max_ext(a, m, 0.1, 8, k)\n", "powf(m0"},
    {"input b: f32[33, 128]\nt = transpose(b)\noutput y = soft_max_ext(t, scale=2)\n", "element by element"},
    /* block kernels, one block per row */
    {"input a: f32[4096, 300]\noutput y = soft_max(a)\n", "one per row"},
    {"input a: f32[4097, 300]\ninput m: f16[4097, 300]\noutput y = soft_max_ext(a, m)\n", "one per row"},
    {"input a: f16[2048, 9, 300]\ninput m: f32[2048, 9, 3]\ninput k: f32[300]\n"
     "output y = soft_max_ext(a, m, 0.3, 2.5, k)\n", "groups of 4"},
    {"input b: f32[1030, 400]\nv = view(b, [1025, 400], [4120], 4)\noutput y = soft_max(v)\n", "element by element"},
    {"input b: f32[8, 2000, 40]\np = permute(b, 2, 0, 1, 3)\noutput y = soft_max(p)\n", "element by element"},
    /* clusters (sm_90) with their one-block fallback */
    {"input a: f32[32000, 8]\noutput y = soft_max(a)\n", "__cluster_dims__(8, 1, 1)"},
    {"input a: f32[32000, 512]\ninput m: f16[32000, 512]\noutput y = soft_max_ext(a, m, 0.7)\n", "__cluster_dims__(2, 1, 1)"},
    {"input a: f32[131072, 2, 2]\ninput m: f16[131072, 2]\ninput k: f32[2]\n"
     "output y = soft_max_ext(a, m, 1, 4, k)\n", "in registers (one read)"},
    {"input a: bf16[65536, 2]\noutput y = soft_max(a)\n", "kiln_cluster_load"},
    /* streamed: rows longer than a cluster's registers */
    {"input a: f32[262144, 3]\noutput y = soft_max(a)\n", "streamed"},
    {"input a: f32[131073, 2]\ninput m: f32[131073, 2]\ninput k: f32[1]\n"
     "output y = soft_max_ext(a, m, 0.5, 0, k)\n", "streamed"},
    {"input b: f16[2, 140000]\nt = transpose(b)\ninput m: f16[140000, 2]\noutput y = soft_max_ext(t, m, 2)\n",
     "streamed"},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

/* The softmax kernel of p (graphs may hold a cont or view copy too). */
static int softmax_kernel(const kiln_program *p) {
    for (int i = 0; i < kiln_program_kernel_count(p); i++)
        if (strncmp(kiln_program_kernel_name(p, i), "soft_max", 8) == 0) return i;
    ck_abort_msg("no soft_max kernel");
    return -1;
}

START_TEST(kernels_compile) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    const gcase       *c = &CASES[_i];
    for (int a = 0; a < 2; a++) {
        kiln_ctx     *ctx;
        kiln_graph   *g;
        kiln_program *p = ts_compile(c->kg, archs[a], g_cache, 0, &ctx, &g);
        int           k = softmax_kernel(p);
        const char   *src = kiln_program_kernel_source(p, k);
        if (!strstr(src, c->want)) fprintf(stderr, "case %d source:\n%s\n", _i, src);
        ck_assert_msg(strstr(src, c->want), "case %d: missing \"%s\" (source on stderr)", _i, c->want);
        ck_assert_msg(!strstr(src, "#include"), "#include in source");
        /* The cluster fallback is only compiled for sm_80: check both archs' warnings. */
        ts_nvrtc_clean(src, kiln_program_kernel_name(p, k), archs[a]);
        ts_compiled_free(p, g, ctx);
    }
}
END_TEST

static void softmax_header(const kiln_program *p) {
    ck_assert_msg(strstr(kiln_program_kernel_source(p, softmax_kernel(p)), "kiln softmax kernel"), "header comment");
}

/* The same graph gives the same source; names and layouts show in the kernel's comments. */
START_TEST(kernels_deterministic) {
    for (int i = 0; i < NCASES; i++) ts_compile_twice(CASES[i].kg, g_cache, softmax_header);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_softmax",
                        TS_CASE("reference", 0),
                        TS_TESTS(ref_soft_max_basic, ref_scale_mask_inf, ref_mask_broadcast, ref_alibi, ref_sinks,
                                 ref_fully_masked, ref_views, ref_half_types),
                        TS_CASE("frontend", 0), TS_TESTS(errors, accepted),
                        TS_CASE("kernels", 120), TS_LOOP(0, NCASES, kernels_compile), TS_TESTS(kernels_deterministic));
    return ts_main_cache(s, "softmax-test", &g_cache);
}
