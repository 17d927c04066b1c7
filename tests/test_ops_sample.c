/* The sample family (op sample: kiln's sampler inside a program, docs/sampling.md "On the GPU"):
 * shape rules and refusals, the CPU reference against kiln_sample on many random rows,
 * parameters, seeds and positions, the kernels' algorithm emulated on the CPU (each slice's K
 * smallest keys radix-selected digit by digit as templates/sample.lua does, the union selected
 * again and sorted by rank, the chain in its float order) against kiln_sample, every kernel
 * variant compiled by NVRTC for sm_90a and sm_80 without a warning, codegen's refusal past KILN_SAMPLE_GPU_MAX_K, and the model builder's
 * "sample" output. No GPU needed; tests/gpu/test_gpu_sample.c runs the kernels. */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "model/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

/* ---- random rows and parameters ---------------------------------------------------------------- */

static const int64_t NS[] = {1, 2, 3, 17, 100, 257, 1000, 1025, 3000, 5000, 20000};

static kiln_sampler_params random_params(uint64_t *r, int64_t n, bool gpu) {
    static const float    temps[] = {0.0f, -1.0f, 0.1f, 0.7f, 1.0f, 2.5f};
    static const float    top_ps[] = {0.0f, 0.3f, 0.9f, 0.95f, 1.0f};
    static const float    min_ps[] = {0.0f, 0.05f, 0.2f, 1.0f};
    kiln_sampler_params p = kiln_sampler_params_default();
    for (;;) {
        int64_t ks[] = {1, 2, 5, 40, 256, 0, -3, n, n + 5, 300};
        p.temp = temps[ts_rng_next(r) % 6];
        p.top_k = (int32_t)ks[ts_rng_next(r) % 10];
        p.top_p = top_ps[ts_rng_next(r) % 5];
        p.min_p = min_ps[ts_rng_next(r) % 4];
        p.seed = ts_rng_next(r);
        if (ts_rng_next(r) % 4 == 0) p.seed &= 0xffffffffu;
        /* The kernels' range: greedy, or at most KILN_SAMPLE_GPU_MAX_K candidates. */
        int64_t k = p.top_k <= 0 || p.top_k >= n ? n : p.top_k;
        if (!gpu || p.temp <= 0 || k <= KILN_SAMPLE_GPU_MAX_K) return p;
    }
}

/* ---- the reference against kiln_sample ---------------------------------------------------------- */

#define NREF 160

/* The .kg of a sample node over a row of n and np positions, with p's parameters. */
static char *sample_kg(int64_t n, int64_t np, const kiln_sampler_params *p) {
    kb_str s = {0};
    kb_str_addf(&s, "input a: f32[%lld]\ninput pos: i32[%lld]\n"
                      "output y = sample(a, pos, seed_lo=%d, seed_hi=%d, temp=%.9g, top_k=%d, top_p=%.9g, min_p=%.9g)\n",
                  (long long)n, (long long)np, (int32_t)(uint32_t)p->seed, (int32_t)(uint32_t)(p->seed >> 32),
                  (double)p->temp, (int)p->top_k, (double)p->top_p, (double)p->min_p);
    return kb_str_take(&s);
}

START_TEST(reference_is_kiln_sample) {
    uint64_t r = 0x5a3d1ull + (uint64_t)_i * 7919u;
    int64_t  n = NS[ts_rng_next(&r) % (sizeof NS / sizeof NS[0])];
    int      kind = (int)(ts_rng_next(&r) % 5);
    float   *x = malloc(sizeof *x * (size_t)n);
    ck_assert_ptr_nonnull(x);
    ts_logit_row(&r, x, n, kind);
    kiln_sampler_params p = random_params(&r, n, false);
    int32_t             pos[3] = {(int32_t)(ts_rng_next(&r) % 1000), 5, (int32_t)(ts_rng_next(&r) % 2000000000) - 1};
    int64_t             np = 1 + (int64_t)(ts_rng_next(&r) % 3);
    char               *kg = sample_kg(n, np, &p);
    ts_buf b[] = {{.name = "a", .type = KILN_F32, .data = x, .n = n},
                  {.name = "pos", .type = KILN_I32, .data = pos, .n = np},
                  TS_OUT("y"),
                  {0}};
    ts_reference(kg, b);
    int32_t want = -1;
    TS_OK(kiln_sample(&p, x, n, NULL, 0, (int64_t)pos[np - 1] + 1, &want));
    ts_buf *y = ts_buf_find(b, "y");
    ck_assert_int_eq(y->type, KILN_I32);
    ck_assert_int_eq(y->n, 1);
    ck_assert_msg(((int32_t *)y->out)[0] == want, "case %d (%s, row kind %d): reference %d, kiln_sample %d", _i, kg,
                  kind, ((int32_t *)y->out)[0], want);
    ts_buf_free(b);
    free(kg);
    free(x);
}
END_TEST

/* ---- the kernels' algorithm, emulated ------------------------------------------------------------- */

/* templates/sample.lua's plan: K, KP, slice S, B slices. */
typedef struct {
    int64_t K, KP, S, B;
    bool    greedy;
} plan;

static int64_t pow2_up(int64_t x) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
}

static plan make_plan(const kiln_sampler_params *p, int64_t n) {
    plan q = {0};
    q.greedy = !(p->temp > 0);
    q.K = q.greedy ? 1 : p->top_k <= 0 || p->top_k >= n ? n : p->top_k;
    q.KP = pow2_up(q.K);
    int64_t s = pow2_up((n * q.K + 8191) / 8192), cap = pow2_up(n) > 256 ? pow2_up(n) : 256;
    q.S = s > 1024 ? s : 1024;
    if (q.S > cap) q.S = cap;
    q.B = (n + q.S - 1) / q.S;
    return q;
}

static uint64_t emu_key(float x, uint32_t i) {
    float    l = x == 0.0f ? 0.0f : x;
    uint32_t b;
    memcpy(&b, &l, sizeof b);
    b = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (uint64_t)~b << 32 | i;
}

static float emu_logit(uint64_t k) {
    uint32_t b = ~(uint32_t)(k >> 32);
    b = (b & 0x80000000u) ? b & 0x7fffffffu : ~b;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* kiln_sample_select: the need smallest of n keys (~0 not counted; need below the valid count)
 * as the test (key & pmask) <= prefix, by the kernels' passes: 8-bit digits from the top, a
 * histogram of the keys tied with the prefix, the digit holding the need-th key, until that
 * digit's keys are all needed. */
static void emu_select(const uint64_t *k, int64_t n, uint32_t need, uint64_t *prefix, uint64_t *pmask) {
    *prefix = *pmask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        uint32_t hist[256] = {0};
        for (int64_t i = 0; i < n; i++)
            if (k[i] != ~0ull && (k[i] & *pmask) == *prefix) hist[(k[i] >> shift) & 255u]++;
        uint32_t before = 0, d = 0;
        while (before + hist[d] < need) before += hist[d++];
        ck_assert_uint_lt(d, 256);
        *prefix |= (uint64_t)d << shift;
        *pmask |= 255ull << shift;
        need -= before;
        if (hist[d] == need) return;
    }
    ck_abort_msg("emu_select: the last digit held more than one key");
}

/* A block's K smallest valid keys (in the order of k, as the kernels' compaction may give any),
 * padded with ~0 to out's kp; returns how many. */
static int64_t emu_block(const uint64_t *k, int64_t n, int64_t K, uint64_t *out, int64_t kp) {
    int64_t nv = 0, m = 0;
    for (int64_t i = 0; i < n; i++) nv += k[i] != ~0ull;
    uint32_t need = (uint32_t)(nv < K ? nv : K);
    uint64_t prefix = 0, pmask = 0;
    if (need < nv) emu_select(k, n, need, &prefix, &pmask);
    for (int64_t i = 0; i < n; i++)
        if (k[i] != ~0ull && (k[i] & pmask) <= prefix) out[m++] = k[i];
    ck_assert_int_eq(m, need);
    for (int64_t i = m; i < kp; i++) out[i] = ~0ull;
    return m;
}

/* Kernel 1 then kernel 2, sequentially: the same selections, the same float order. */
static int32_t emulate(const kiln_sampler_params *p, const float *x, int64_t n, int64_t position) {
    plan      q = make_plan(p, n);
    uint64_t *lists = calloc((size_t)(q.B * q.K), sizeof *lists), *slice = malloc(sizeof *slice * (size_t)q.S);
    uint64_t *top = malloc(sizeof *top * (size_t)q.KP), *s = malloc(sizeof *s * (size_t)q.KP);
    ck_assert(lists && slice && top && s);
    uint32_t ninf = 0xffffffffu;
    for (int64_t b = 0; b < q.B; b++) {
        for (int64_t t = 0; t < q.S; t++) {
            int64_t i = b * q.S + t;
            slice[t] = ~0ull;
            if (i < n && x[i] > -INFINITY) slice[t] = emu_key(x[i], (uint32_t)i);
            else if (i < n && x[i] == -INFINITY && (uint32_t)i < ninf) ninf = (uint32_t)i;
        }
        emu_block(slice, q.S, q.K, lists + b * q.K, q.K);
    }
    int64_t nk = emu_block(lists, q.B * q.K, q.K, top, q.KP);
    for (int64_t j = 0; j < nk; j++) { /* the rank sort */
        int64_t rank = 0;
        for (int64_t i = 0; i < nk; i++) rank += top[i] < top[j];
        s[rank] = top[j];
    }
    int32_t tok = ninf != 0xffffffffu ? (int32_t)ninf : 0;
    if (nk > 0 && q.greedy) tok = (int32_t)(uint32_t)s[0];
    if (nk > 0 && !q.greedy) {
        float *e = malloc(sizeof *e * (size_t)nk), *w = malloc(sizeof *w * (size_t)nk);
        ck_assert(e && w);
        float mx = emu_logit(s[0]);
        for (int64_t j = 0; j < nk; j++) {
            float l = emu_logit(s[j]);
            e[j] = l == mx ? 1.0f : km_sampler_exp(l - mx);
            w[j] = l == mx ? 1.0f : km_sampler_exp((l - mx) / p->temp);
        }
        int64_t m = nk;
        if (p->top_p < 1.0f) {
            float z = 0.0f, cum = 0.0f;
            for (int64_t j = 0; j < nk; j++) z = z + e[j];
            for (int64_t j = 0; j < nk; j++) {
                cum = cum + e[j] / z;
                if (cum >= p->top_p) {
                    m = j + 1;
                    break;
                }
            }
        }
        if (p->min_p > 0.0f) {
            int64_t j = 1;
            while (j < m && e[j] >= p->min_p) j++;
            m = j;
        }
        float wsum = 0.0f, acc = 0.0f;
        for (int64_t j = 0; j < m; j++) wsum = wsum + w[j];
        float   target = km_sampler_uniform(p->seed, position) * wsum;
        int64_t pick = m - 1;
        for (int64_t j = 0; j < m; j++) {
            acc = acc + w[j];
            if (acc >= target) {
                pick = j;
                break;
            }
        }
        tok = (int32_t)(uint32_t)s[pick];
        free(e);
        free(w);
    }
    free(lists);
    free(slice);
    free(top);
    free(s);
    return tok;
}

#define NEMU 400

START_TEST(kernel_algorithm_is_kiln_sample) {
    uint64_t r = 0xe3u + (uint64_t)_i * 104729u;
    int64_t  n = _i % 50 == 0 ? 256000 : _i % 50 == 1 ? 151936 : NS[ts_rng_next(&r) % (sizeof NS / sizeof NS[0])];
    int      kind = (int)(ts_rng_next(&r) % 5);
    float   *x = malloc(sizeof *x * (size_t)n);
    ck_assert_ptr_nonnull(x);
    ts_logit_row(&r, x, n, kind);
    kiln_sampler_params p = random_params(&r, n, true);
    int64_t             position = (int64_t)(ts_rng_next(&r) % 5000000000ull);
    int32_t             want = -1;
    TS_OK(kiln_sample(&p, x, n, NULL, 0, position, &want));
    int32_t got = emulate(&p, x, n, position);
    ck_assert_msg(got == want, "case %d: n %lld kind %d temp %g top_k %d top_p %g min_p %g: emulated %d, kiln_sample %d",
                  _i, (long long)n, kind, (double)p.temp, p.top_k, (double)p.top_p, (double)p.min_p, got, want);
    free(x);
}
END_TEST

/* ---- shapes and refusals ------------------------------------------------------------------------- */

START_TEST(shapes) {
    kiln_ctx    *ctx = ts_parse("input a: f32[100]\ninput p: i32[4]\n"
                                "output y = sample(a, p, seed_lo=-1, seed_hi=3, temp=0.5, top_k=7)\n");
    kiln_tensor *y = fe_find(ctx, "y");
    ck_assert_int_eq(kiln_tensor_type(y), KILN_I32);
    for (int d = 0; d < 4; d++) ck_assert_int_eq(kiln_tensor_ne(y, d), 1);
    ck_assert_int_eq(y->ip[0], -1);
    ck_assert_int_eq(y->ip[1], 3);
    ck_assert_int_eq(y->ip[2], 7);
    ck_assert(y->fp[0] == 0.5f && y->fp[1] == 0.95f && y->fp[2] == 0.05f); /* llama.cpp's defaults */
    kiln_ctx_free(ctx);

    /* The C builder: the seed's halves, the parameters in their slots. */
    ctx = kiln_ctx_new();
    int64_t             nv = 50, one = 1;
    kiln_tensor        *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "a", 1, &nv);
    kiln_tensor        *pos = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "pos", 1, &one);
    kiln_sampler_params sp = kiln_sampler_params_default();
    sp.seed = 0x123456789abcdef0ull, sp.top_k = 9, sp.temp = 1.25f, sp.top_p = 0.5f, sp.min_p = 0.0f;
    kiln_tensor *t = kiln_sample_row(ctx, a, pos, &sp);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq((uint32_t)t->ip[0], 0x9abcdef0u);
    ck_assert_uint_eq((uint32_t)t->ip[1], 0x12345678u);
    ck_assert_int_eq(t->ip[2], 9);
    ck_assert(t->fp[0] == 1.25f && t->fp[1] == 0.5f && t->fp[2] == 0.0f);
    /* Penalties are the host's. */
    sp.repeat_penalty = 1.1f;
    ck_assert_ptr_null(kiln_sample_row(ctx, a, pos, &sp));
    ts_ctx_error(ctx, KILN_ERR_INVALID, "sample: penalties"); /* frees ctx */
}
END_TEST

static void expect_error(const char *text, kiln_code code, const char *n1, const char *n2) {
    ts_parse_error(text, code, (const char *const[]){n1, n2, NULL});
}

START_TEST(errors) {
    expect_error("input a: f16[8]\ninput p: i32[1]\ny = sample(a, p)\n", KILN_ERR_SHAPE, "sample: logits 'a'", "f32");
    expect_error("input a: f32[8, 2]\ninput p: i32[1]\ny = sample(a, p)\n", KILN_ERR_SHAPE, "one row", "f32[8, 2]");
    expect_error("input a: f32[8]\ninput p: f32[1]\ny = sample(a, p)\n", KILN_ERR_SHAPE, "sample: pos 'p'", "i32 vector");
    expect_error("input a: f32[8]\ninput p: i32[1, 2]\ny = sample(a, p)\n", KILN_ERR_SHAPE, "sample: pos", "i32 vector");
    expect_error("input a: f32[8]\ninput p: i32[1]\ny = sample(a, p, top_p=1.5)\n", KILN_ERR_INVALID, "sample:",
                 "--top-p 1.5");
    expect_error("input a: f32[8]\ninput p: i32[1]\ny = sample(a, p, min_p=-0.5)\n", KILN_ERR_INVALID, "sample:",
                 "--min-p -0.5");
}
END_TEST

START_TEST(on_gpu_rule) {
    kiln_sampler_params p = kiln_sampler_params_default();
    ck_assert(kiln_sampler_on_gpu(&p, 151936)); /* llama.cpp's defaults: top-k 40 */
    p.top_k = KILN_SAMPLE_GPU_MAX_K;
    ck_assert(kiln_sampler_on_gpu(&p, 151936));
    p.top_k = KILN_SAMPLE_GPU_MAX_K + 1;
    ck_assert(!kiln_sampler_on_gpu(&p, 151936));
    ck_assert(kiln_sampler_on_gpu(&p, 200)); /* top_k past n_vocab keeps them all: 200 */
    p.top_k = 0;
    ck_assert(!kiln_sampler_on_gpu(&p, 151936));
    ck_assert(kiln_sampler_on_gpu(&p, KILN_SAMPLE_GPU_MAX_K));
    p.top_k = 40;
    p.temp = 0.0f; /* greedy: the argmax serves it */
    ck_assert(!kiln_sampler_on_gpu(&p, 151936));
    p.temp = 0.8f, p.presence_penalty = 0.5f;
    ck_assert(!kiln_sampler_on_gpu(&p, 151936));
    p.repeat_last_n = 0; /* a window of 0: penalties off */
    ck_assert(kiln_sampler_on_gpu(&p, 151936));
    p.top_p = 2.0f;
    ck_assert(!kiln_sampler_on_gpu(&p, 151936));
    ck_assert(!kiln_sampler_on_gpu(NULL, 151936));
}
END_TEST

/* ---- kernels ------------------------------------------------------------------------------------- */

/* Every shape of plan: greedy, each stage on and off, short and long rows, a strided row at an
 * offset, a symbolic pos, the largest K. */
static const char *const KERNELS[] = {
    "input a: f32[151936]\ninput p: i32[1]\noutput y = sample(a, p)\n",
    "input a: f32[151936]\ninput p: i32[3]\noutput y = sample(a, p, seed_lo=5, seed_hi=-7, temp=0.7, top_k=40, top_p=1, min_p=0)\n",
    "input a: f32[151936]\ninput p: i32[3]\noutput y = sample(a, p, temp=0.7, top_k=40, top_p=0.9, min_p=0)\n",
    "input a: f32[151936]\ninput p: i32[3]\noutput y = sample(a, p, temp=0.7, top_k=40, top_p=1, min_p=0.1)\n",
    "input a: f32[1000]\ninput p: i32[1]\noutput y = sample(a, p, temp=0)\n",
    "input a: f32[1]\ninput p: i32[1]\noutput y = sample(a, p, top_k=0)\n",
    "input a: f32[5]\ninput p: i32[1]\noutput y = sample(a, p, top_k=3)\n",
    "input a: f32[256]\ninput p: i32[1]\noutput y = sample(a, p, top_k=0)\n",
    "input a: f32[256000]\ninput p: i32[2]\noutput y = sample(a, p, top_k=256, temp=1.5)\n",
    "input a: f32[128256]\ninput p: i32[1]\noutput y = sample(a, p, top_k=1)\n",
    "input m: f32[1000, 3]\ninput p: i32[2]\nc = view(m, [1000, 1], [4000], 4000)\n"
    "output y = sample(c, p, top_k=50)\n",
    "dim n_tokens <= 64 specialize 1\ninput a: f32[32000]\ninput p: i32[n_tokens]\noutput y = sample(a, p)\n",
};
#define NKERNELS ((int)(sizeof KERNELS / sizeof KERNELS[0]))

START_TEST(kernels_compile) {
    static const char *const archs[] = {"sm_90a", "sm_80"};
    static const char *const needles[] = {"sample_slices_", "sample_pick_", "__fadd_rn"};
    for (int a = 0; a < 2; a++) {
        int counts[3];
        ts_kernels_clean(KERNELS[_i], archs[a], g_cache, needles, counts, 3);
        ck_assert_int_ge(counts[0], 1);
        ck_assert_int_ge(counts[1], 1);
        bool greedy = strstr(KERNELS[_i], "temp=0)") != NULL;
        ck_assert_int_eq(counts[2] > 0, !greedy); /* the chain's sums, when it samples */
    }
}
END_TEST

START_TEST(codegen_refuses_large_k) {
    static const char *const kg[] = {
        "input a: f32[1000]\ninput p: i32[1]\noutput y = sample(a, p, top_k=257)\n",
        "input a: f32[1000]\ninput p: i32[1]\noutput y = sample(a, p, top_k=0)\n",
        "input a: f32[300]\ninput p: i32[1]\noutput y = sample(a, p, top_k=-1)\n",
    };
    for (size_t i = 0; i < sizeof kg / sizeof kg[0]; i++) {
        char *m = ts_refused_msg(kg[i], g_cache, 0, ts_case_label((int)i));
        ck_assert_msg(strstr(m, "1 <= top_k <= 256") && strstr(m, "sample"), "case %zu: %s", i, m);
        free(m);
    }
}
END_TEST

/* ---- the model builder --------------------------------------------------------------------------- */

START_TEST(model_sample_output) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    kiln_sampler_params sp = kiln_sampler_params_default();
    kiln_build_opts     o = {.n_ctx = 64, .n_tokens_max = 8, .argmax = true, .sampler = &sp};
    kiln_ctx           *ctx = kiln_ctx_new();
    TS_OK(kiln_build_model(ctx, &hp, &o));
    kiln_tensor *y = fe_find(ctx, "sample");
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(y->op, FE_OP_SAMPLE);
    ck_assert_str_eq(kiln_tensor_name(y->src[1]), "inp_pos");
    ck_assert_ptr_nonnull(fe_find(ctx, "argmax"));
    kiln_ctx_free(ctx);

    /* Refused: every output row, penalties, a top-k past the kernels'. */
    o.outputs = KILN_OUTPUTS_ALL;
    ctx = kiln_ctx_new();
    ts_expect_status(kiln_build_model(ctx, &hp, &o), KILN_ERR_INVALID, "KILN_OUTPUTS_LAST");
    kiln_ctx_free(ctx);
    o.outputs = KILN_OUTPUTS_LAST;
    sp.repeat_penalty = 1.2f;
    ctx = kiln_ctx_new();
    ts_expect_status(kiln_build_model(ctx, &hp, &o), KILN_ERR_INVALID, "penalties on");
    kiln_ctx_free(ctx);
    sp.repeat_penalty = 1.0f;
    sp.top_k = 0;
    ctx = kiln_ctx_new();
    kiln_status st = kiln_build_model(ctx, &hp, &o);
    if (hp.n_vocab > KILN_SAMPLE_GPU_MAX_K) ts_expect_status(st, KILN_ERR_INVALID, "kiln_sampler_on_gpu");
    else TS_OK(st);
    kiln_ctx_free(ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_sample",
                        TS_CASE("frontend", 0), TS_TESTS(shapes, errors, on_gpu_rule, model_sample_output),
                        TS_CASE("reference", 120), TS_LOOP(0, NREF, reference_is_kiln_sample),
                        TS_LOOP(0, NEMU, kernel_algorithm_is_kiln_sample),
                        TS_CASE("kernels", 300), TS_LOOP(0, NKERNELS, kernels_compile),
                        TS_TESTS(codegen_refuses_large_k));
    return ts_main_cache(s, "ops-sample", &g_cache);
}
