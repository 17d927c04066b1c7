/* The attention family (flash_attn_ext): the CPU reference against values computed by hand,
 * the frontend's shape and type errors, and the kernels of templates/attn.lua generated for a
 * spread of shapes (each kernel kind and its variants: decode with 8 or 16 rows per block, each
 * K/V vector width, split-KV and its combine step, prefill with Q in registers or shared memory,
 * the FMA kernel for f32 and odd head sizes, every optional feature) and compiled by NVRTC for
 * sm_90a and sm_80 without a warning. No GPU needed. */
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
    ck_assert_int_eq(y->type, KILN_F32);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(y->v[i] - want[i]) <= tol, "%s: y[%lld] = %.9g, want %.9g", what, (long long)i,
                      (double)y->v[i], want[i]);
}

/* k0 = [1, 0], k1 = [0, 1]; v0 = [1, 2], v1 = [3, 4]; q = [1, 0]. */
static void two_keys(ts_hands *h) {
    float *q = ts_hands_add(h, "q"), *k = ts_hands_add(h, "k"), *v = ts_hands_add(h, "v");
    const float vq[2] = {1, 0}, vk[4] = {1, 0, 0, 1}, vv[4] = {1, 2, 3, 4};
    memcpy(q, vq, sizeof vq);
    memcpy(k, vk, sizeof vk);
    memcpy(v, vv, sizeof vv);
}

/* out = w0 v0 + w1 v1 with w = softmax(s0, s1) (and a sink when sink is not NaN). */
static void mix(double s0, double s1, double sink, double out[2]) {
    double m = s0 > s1 ? s0 : s1;
    if (!isnan(sink) && sink > m) m = sink;
    double e0 = exp(s0 - m), e1 = exp(s1 - m), d = e0 + e1 + (isnan(sink) ? 0.0 : exp(sink - m));
    out[0] = (e0 * 1 + e1 * 3) / d;
    out[1] = (e0 * 2 + e1 * 4) / d;
}

#define KG2(extra_inputs, call)                                                                           \
    "input q: f32[2, 1, 1]\ninput k: f16[2, 2, 1]\ninput v: f16[2, 2, 1]\n" extra_inputs "output y = " call "\n"

/* One query, two keys: softmax([1, 0]) mixes the two rows of V; scale multiplies the scores. */
START_TEST(ref_basic) {
    ts_hands h = {0};
    two_keys(&h);
    double want[2];
    ts_hands_output(KG2("", "flash_attn_ext(q, k, v)"), &h, "y");
    mix(1, 0, NAN, want);
    expect(&h, want, 2, 1e-6, "basic");
    ck_assert(fabs(want[0] - 1.5378828427399902) < 1e-9); /* 1 + 2 / (e + 1) */
    ts_hands_output(KG2("", "flash_attn_ext(q, k, v, scale=0.5)"), &h, "y");
    mix(0.5, 0, NAN, want);
    expect(&h, want, 2, 1e-6, "scale 0.5");
}
END_TEST

/* A -inf mask entry skips the key; a row masked everywhere gives 0 (not NaN), with or without a
 * sink; finite mask values add to the scores. */
START_TEST(ref_mask) {
    ts_hands h = {0};
    two_keys(&h);
    float *m = ts_hands_add(&h, "m");
    double want[2];
    m[0] = 0;
    m[1] = -INFINITY;
    ts_hands_output(KG2("input m: f16[2, 1]\n", "flash_attn_ext(q, k, v, mask=m)"), &h, "y");
    const double v0[2] = {1, 2};
    expect(&h, v0, 2, 1e-7, "key 1 masked");
    m[0] = -INFINITY;
    ts_hands_output(KG2("input m: f16[2, 1]\n", "flash_attn_ext(q, k, v, mask=m)"), &h, "y");
    const double zero[2] = {0, 0};
    expect(&h, zero, 2, 0, "fully masked");
    float *s = ts_hands_add(&h, "s");
    s[0] = 0.5f;
    ts_hands_output(KG2("input m: f16[2, 1]\ninput s: f32[1]\n", "flash_attn_ext(q, k, v, mask=m, sinks=s)"), &h, "y");
    expect(&h, zero, 2, 0, "fully masked with a sink");
    m[0] = 0.5f;
    m[1] = 2.0f;
    ts_hands_output(KG2("input m: f16[2, 1]\n", "flash_attn_ext(q, k, v, mask=m, scale=2)"), &h, "y");
    mix(2 + 0.5, 0 + 2, NAN, want);
    expect(&h, want, 2, 1e-6, "mask values");
}
END_TEST

/* A sink joins the denominator only: with e^sink = e + 1 the output halves. */
START_TEST(ref_sinks) {
    ts_hands h = {0};
    two_keys(&h);
    float *s = ts_hands_add(&h, "s");
    s[0] = (float)log(exp(1.0) + 1.0);
    ts_hands_output(KG2("input s: f32[1]\n", "flash_attn_ext(q, k, v, sinks=s)"), &h, "y");
    double want[2];
    mix(1, 0, NAN, want);
    want[0] /= 2, want[1] /= 2;
    expect(&h, want, 2, 1e-6, "sink");
    s[0] = 30.0f; /* takes almost everything */
    const ts_slot *y = ts_hands_output(KG2("input s: f32[1]\n", "flash_attn_ext(q, k, v, sinks=s)"), &h, "y");
    ck_assert(y->v[0] > 0 && y->v[0] < 1e-12);
}
END_TEST

/* logit_softcap c: scores c * tanh(dot * scale / c). */
START_TEST(ref_softcap) {
    ts_hands h = {0};
    two_keys(&h);
    ts_hands_output(KG2("", "flash_attn_ext(q, k, v, scale=4, logit_softcap=2)"), &h, "y");
    double want[2];
    mix(2 * tanh(1 * 4.0 / 2), 0, NAN, want);
    expect(&h, want, 2, 1e-6, "softcap 2, scale 4");
}
END_TEST

/* GQA: 4 query heads over 2 kv heads (h -> h / 2); the result is [Dv, n_head, n_q]. */
START_TEST(ref_gqa_layout) {
    ts_hands  h = {0};
    float *q = ts_hands_add(&h, "q"), *k = ts_hands_add(&h, "k"), *v = ts_hands_add(&h, "v");
    /* q [2, 2 tokens, 4 heads]: token 0 = [1, 0], token 1 = [0, 1], every head */
    for (int hd = 0; hd < 4; hd++) {
        q[hd * 4 + 0] = 1, q[hd * 4 + 1] = 0;
        q[hd * 4 + 2] = 0, q[hd * 4 + 3] = 1;
    }
    /* kv head 0: k = [[1, 0], [0, 1]], v = [[1, 2], [3, 4]]; kv head 1: k swapped, v + 4 */
    const float vk[8] = {1, 0, 0, 1, 0, 1, 1, 0}, vv[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    memcpy(k, vk, sizeof vk);
    memcpy(v, vv, sizeof vv);
    ts_hands_output("input q: f32[2, 2, 4]\ninput k: f16[2, 2, 2]\ninput v: f16[2, 2, 2]\n"
                    "output y = flash_attn_ext(q, k, v)\n",
                    &h, "y");
    double want[16], a[2], b[2];
    mix(1, 0, NAN, a); /* token 0, kv head 0: scores [1, 0] */
    mix(0, 1, NAN, b); /* token 1, kv head 0 */
    for (int t = 0; t < 2; t++)
        for (int hd = 0; hd < 4; hd++) {
            const double *w = (t == 0) == (hd < 2) ? a : b; /* kv head 1 swaps the keys */
            double        add = hd < 2 ? 0 : 4;
            want[(t * 4 + hd) * 2 + 0] = w[0] + add;
            want[(t * 4 + hd) * 2 + 1] = w[1] + add;
        }
    expect(&h, want, 16, 1e-6, "gqa 4/2, [Dv, n_head, n_q]");
}
END_TEST

/* ALiBi as soft_max_ext: 4 heads, max_bias 8 -> slopes 2^-2, 2^-4, 2^-6, 2^-8; q = 0, so the
 * scores are slope * mask = slope * [0, 1]. */
START_TEST(ref_alibi) {
    ts_hands  h = {0};
    float *q = ts_hands_add(&h, "q"), *k = ts_hands_add(&h, "k"), *v = ts_hands_add(&h, "v"), *m = ts_hands_add(&h, "m");
    memset(q, 0, 8 * sizeof *q);
    const float vk[4] = {1, 0, 0, 1}, vv[4] = {1, 2, 3, 4};
    memcpy(k, vk, sizeof vk);
    memcpy(v, vv, sizeof vv);
    m[0] = 0, m[1] = 1;
    ts_hands_output("input q: f32[2, 1, 4]\ninput k: f16[2, 2, 1]\ninput v: f16[2, 2, 1]\ninput m: f16[2, 1]\n"
                    "output y = flash_attn_ext(q, k, v, mask=m, max_bias=8)\n",
                    &h, "y");
    double want[8];
    for (int hd = 0; hd < 4; hd++) mix(0, pow(2.0, -2.0 * (hd + 1)), NAN, want + 2 * hd);
    expect(&h, want, 8, 1e-6, "alibi 4 heads, max_bias 8");
}
END_TEST

/* K/V types: f16, bf16 and f32 give the same result on exactly representable values; K and V
 * rounded to the type first (0.1 is not exact in any). */
START_TEST(ref_types) {
    static const char *types[3] = {"f32", "f16", "bf16"};
    for (int t = 0; t < 3; t++) {
        ts_hands h = {0};
        two_keys(&h);
        char kg[256];
        snprintf(kg, sizeof kg, "input q: f32[2, 1, 1]\ninput k: %s[2, 2, 1]\ninput v: %s[2, 2, 1]\n"
                 "output y = flash_attn_ext(q, k, v)\n", types[t], types[t]);
        ts_hands_output(kg, &h, "y");
        double want[2];
        mix(1, 0, NAN, want);
        expect(&h, want, 2, 1e-6, types[t]);
    }
}
END_TEST

/* ---- frontend errors ------------------------------------------------------------------------ */

static void expect_error(const char *kg, kiln_code code, const char *needle) {
    ts_parse_error(kg, code, TS_NEEDLES(needle));
}

#define QKV "input q: f32[64, 3, 8]\ninput k: f16[64, 10, 2]\ninput v: f16[64, 10, 2]\n"

START_TEST(errors) {
    expect_error("input q: f16[64, 3, 8]\ninput k: f16[64, 10, 2]\ninput v: f16[64, 10, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "q 'q' (f16[64, 3, 8]) must be f32");
    expect_error("input q: f32[64, 3, 8]\ninput k: f16[64, 10, 2]\ninput v: bf16[64, 10, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "must have the same type, f32, f16 or bf16");
    expect_error("input q: f32[64, 3, 8]\ninput k: i32[64, 10, 2]\ninput v: i32[64, 10, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "flash_attn_ext");
    expect_error("input q: f32[64, 3, 8]\ninput k: f16[32, 10, 2]\ninput v: f16[32, 10, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "need k.ne0 == q.ne0");
    expect_error("input q: f32[64, 3, 8]\ninput k: f16[64, 10, 2]\ninput v: f16[64, 11, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "the same n_kv (ne1)");
    expect_error("input q: f32[64, 3, 8]\ninput k: f16[64, 10, 3]\ninput v: f16[64, 10, 3]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "must divide the heads of q");
    expect_error("input q: f32[64, 3, 8, 2]\ninput k: f16[64, 10, 2]\ninput v: f16[64, 10, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "ne3 must match");
    expect_error("input q: f32[64, 3, 8]\ninput kt: f16[10, 64, 2]\nk = transpose(kt)\ninput v: f16[64, 10, 2]\n"
                 "y = flash_attn_ext(q, k, v)\n",
                 KILN_ERR_SHAPE, "k 'k' (f16[64, 10, 2]) must have contiguous rows");
    expect_error(QKV "input m: f32[10, 3]\ny = flash_attn_ext(q, k, v, mask=m)\n", KILN_ERR_SHAPE,
                 "mask 'm' (f32[10, 3]) must be f16");
    expect_error(QKV "input m: f16[9, 3]\ny = flash_attn_ext(q, k, v, mask=m)\n", KILN_ERR_SHAPE,
                 "must have ne0 == n_kv (10)");
    expect_error(QKV "input m: f16[10, 2]\ny = flash_attn_ext(q, k, v, mask=m)\n", KILN_ERR_SHAPE,
                 "at least n_q (3) rows");
    expect_error(QKV "input m: f16[10, 3, 3]\ny = flash_attn_ext(q, k, v, mask=m)\n", KILN_ERR_SHAPE,
                 "its ne2 and ne3 must divide");
    expect_error(QKV "input s: f32[4]\ny = flash_attn_ext(q, k, v, sinks=s)\n", KILN_ERR_SHAPE,
                 "sinks 's' (f32[4]) must be f32 [n_head = 8]");
    expect_error(QKV "input s: f16[8]\ny = flash_attn_ext(q, k, v, sinks=s)\n", KILN_ERR_SHAPE, "sinks 's'");
    expect_error(QKV "y = flash_attn_ext(q, k, v, max_bias=2)\n", KILN_ERR_INVALID, "max_bias 2 > 0 (ALiBi) needs a mask");
    /* the C API takes the same path */
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      nq[3] = {64, 3, 8}, nk[3] = {64, 10, 2};
    kiln_tensor *q = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "q", 3, nq);
    kiln_tensor *k = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F16, "k", 3, nk);
    kiln_tensor *v = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F16, "v", 3, nk);
    ck_assert_ptr_null(kiln_flash_attn_ext(ctx, q, k, v, NULL, 1.0f, 1.0f, 0.0f, NULL));
    ts_ctx_error(ctx, KILN_ERR_INVALID, NULL);
}
END_TEST

/* Accepted: strided K/V views (rows contiguous), mask with extra rows and planes, Dk != Dv. */
START_TEST(accepted) {
    ts_builds(QKV "input m: f16[10, 8, 4]\ninput s: f32[8]\noutput y = flash_attn_ext(q, k, v, m, 0.1, 2, 30, s)\n");
    ts_builds("input q: f32[576, 1, 16]\ninput k: bf16[576, 10, 1]\ninput v: bf16[512, 10, 1]\n"
              "output y = flash_attn_ext(q, k, v)\n");
    ts_builds("input q: f32[64, 3, 8]\ninput c: f16[64, 2, 20]\nk = view(c, [64, 10, 2], [256, 128], 512)\n"
              "output y = flash_attn_ext(q, k, k)\n");
}
END_TEST

/* ---- kernels: generated and compiled ---------------------------------------------------------- */

static char *g_cache;

typedef struct {
    const char *kg;
    const char *kernel; /* the attention kernel's name */
    const char *want;   /* a substring its source must contain */
    int         steps;  /* 1, or 2 with split-KV */
} gcase;

#define LLAMA(t, n) "input q: f32[128, 1, 32]\ninput k: " t "[128, " n ", 8]\ninput v: " t "[128, " n ", 8]\n"

static const gcase CASES[] = {
    /* decode, Llama-3-8B heads: split-KV into 32 splits, 8 rows per block, 16-byte loads */
    {LLAMA("f16", "8192") "output y = flash_attn_ext(q, k, v, scale=0.088)\n", "fattn_dec_f16_d128",
     "32 splits of 256 keys", 2},
    {LLAMA("bf16", "16384") "input m: f16[16384, 1]\ninput s: f32[32]\n"
     "output y = flash_attn_ext(q, k, v, mask=m, scale=0.088, sinks=s)\n", "fattn_dec_bf16_d128", "bf16.bf16", 2},
    /* decode: 16 rows per block (GQA 8 x 2 tokens), ALiBi, softcap, head sizes 64..256 */
    {"input q: f32[64, 2, 8]\ninput k: f16[64, 33, 1]\ninput v: f16[64, 33, 1]\ninput m: f16[33, 4]\n"
     "output y = flash_attn_ext(q, k, v, m, 0.125, 8, 0)\n", "fattn_dec_f16_d64", "16 rows per block", 1},
    {"input q: f32[80, 3, 4]\ninput k: bf16[80, 700, 4]\ninput v: bf16[80, 700, 4]\n"
     "output y = flash_attn_ext(q, k, v, scale=0.11, logit_softcap=30)\n", "fattn_dec_bf16_d80", "tanhf", 2},
    {"input q: f32[96, 1, 16]\ninput k: f16[96, 4097, 2]\ninput v: f16[96, 4097, 2]\ninput m: f16[4097, 1, 16]\n"
     "output y = flash_attn_ext(q, k, v, mask=m, scale=0.1)\n", "fattn_dec_f16_d96", "movmatrix", 2},
    {"input q: f32[112, 16, 1]\ninput k: bf16[112, 31, 1]\ninput v: bf16[112, 31, 1]\n"
     "output y = flash_attn_ext(q, k, v, scale=0.09)\n", "fattn_dec_bf16_d112", "one pass over the keys", 1},
    {"input q: f32[256, 1, 8]\ninput k: f16[256, 1000, 2]\ninput v: f16[256, 1000, 2]\ninput m: f16[1000, 1]\n"
     "input s: f32[8]\noutput y = flash_attn_ext(q, k, v, m, 0.0625, 2, 0, s)\n", "fattn_dec_f16_d256", "powf", 2},
    /* decode: K/V views whose rows start at odd elements (loads of 4, 2 and 1 elements) */
    {"input q: f32[128, 1, 8]\ninput c: f16[132, 300, 2]\nk = view(c, [128, 256, 2], [264, 79200], 8)\n"
     "v = view(c, [128, 256, 2], [264, 79200], 8)\noutput y = flash_attn_ext(q, k, v)\n", "fattn_dec_f16_d128",
     "K loads of 4, V loads of 4", 2},
    {"input q: f32[64, 1, 4]\ninput c: bf16[67, 50, 1]\nk = view(c, [64, 40, 1], [134, 6700], 2)\n"
     "output y = flash_attn_ext(q, k, k)\n", "fattn_dec_bf16_d64", "K loads of 1, V loads of 1", 1},
    /* prefill: Q in registers (<= 128) or shared memory (256), causal mask, GQA packing */
    {"input q: f32[128, 2048, 32]\ninput k: bf16[128, 2048, 8]\ninput v: bf16[128, 2048, 8]\n"
     "input m: f16[2048, 2048]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088)\n", "fattn_pre_bf16_d128",
     "__syncthreads_or", 1},
    {"input q: f32[128, 512, 32]\ninput k: f16[128, 512, 8]\ninput v: f16[128, 512, 8]\n"
     "output y = flash_attn_ext(q, k, v, scale=0.088)\n", "fattn_pre_f16_d128", "Q in registers", 1},
    {"input q: f32[256, 100, 4]\ninput k: bf16[256, 300, 2]\ninput v: bf16[256, 300, 2]\ninput m: f16[300, 101]\n"
     "input s: f32[4]\noutput y = flash_attn_ext(q, k, v, m, 0.06, 3, 20, s)\n", "fattn_pre_bf16_d256",
     "Q from shared memory", 2},
    {"input q: f32[80, 64, 2]\ninput k: f16[80, 77, 1]\ninput v: f16[80, 77, 1]\ninput c: f16[100, 70]\n"
     "m = view(c, [77, 64], [200], 2)\noutput y = flash_attn_ext(q, k, v, mask=m)\n", "fattn_pre_f16_d80",
     "ldmatrix", 1},
    {"input q: f32[64, 40, 4]\ninput k: bf16[64, 16384, 1]\ninput v: bf16[64, 16384, 1]\n"
     "input m: f16[16384, 40]\noutput y = flash_attn_ext(q, k, v, mask=m)\n", "fattn_pre_bf16_d64", "cp.async", 2},
    /* FMA kernel: f32 K/V, odd head sizes */
    {"input q: f32[128, 1, 32]\ninput k: f32[128, 4096, 8]\ninput v: f32[128, 4096, 8]\ninput m: f16[4096, 1]\n"
     "input s: f32[32]\noutput y = flash_attn_ext(q, k, v, m, 0.088, 0, 0, s)\n", "fattn_fma_f32_d128", "f32 K/V", 2},
    {"input q: f32[40, 20, 2]\ninput k: bf16[40, 70, 2]\ninput v: bf16[40, 70, 2]\n"
     "output y = flash_attn_ext(q, k, v, logit_softcap=5)\n", "fattn_fma_bf16_d40", "not a multiple of 16", 2},
    /* DeepSeek's MLA (K 576, V 512, one kv head): the decode kernel, for decode and a 300-token
     * prefill alike (the prefill kernel's 64 rows x 512 accumulators would not fit) */
    {"input q: f32[576, 1, 16]\ninput k: f16[576, 1000, 1]\ninput v: f16[512, 1000, 1]\ninput m: f16[1000, 1]\n"
     "output y = flash_attn_ext(q, k, v, mask=m, scale=0.07)\n", "fattn_dec_f16_d576_512", "decode: 8 rows per block", 2},
    {"input q: f32[576, 300, 16]\ninput k: bf16[576, 600, 1]\ninput v: bf16[512, 600, 1]\ninput m: f16[600, 300]\n"
     "output y = flash_attn_ext(q, k, v, mask=m, scale=0.07)\n", "fattn_dec_bf16_d576_512", "decode: 8 rows per block", 1},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

START_TEST(kernels_compile) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    const gcase       *c = &CASES[_i];
    kiln_ctx          *ctx;
    kiln_graph        *g;
    kiln_program      *p = ts_compile(c->kg, "sm_90a", g_cache, 1, &ctx, &g);
    int                k = ts_named_step(p, c->kernel, c->steps, c->want, _i);
    for (int i = 0; i < kiln_program_kernel_count(p); i++) {
        const char *s = kiln_program_kernel_source(p, i);
        ck_assert_msg(!strstr(s, "#include"), "#include in source");
        if (c->steps == 2) ck_assert_msg(i == k || strncmp(kiln_program_kernel_name(p, i), "fattn_combine", 13) == 0,
                                         "case %d: step %d is %s", _i, i, kiln_program_kernel_name(p, i));
        for (int a = 0; a < 2; a++) ts_nvrtc_clean(s, kiln_program_kernel_name(p, i), archs[a]);
    }
    ts_compiled_free(p, g, ctx);
}
END_TEST

static void attn_header(const kiln_program *p) {
    for (int k = 0; k < kiln_program_kernel_count(p) && k < 2; k++)
        ck_assert_msg(strstr(kiln_program_kernel_source(p, k), "kiln attention kernel"), "header comment");
}

/* The same graph gives the same sources. */
START_TEST(kernels_deterministic) {
    for (int i = 0; i < NCASES; i++) ts_compile_twice(CASES[i].kg, g_cache, attn_header);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_attn",
                        TS_CASE("reference", 0),
                        TS_TESTS(ref_basic, ref_mask, ref_sinks, ref_softcap, ref_gqa_layout, ref_alibi, ref_types),
                        TS_CASE("frontend", 0), TS_TESTS(errors, accepted),
                        TS_CASE("kernels", 120), TS_LOOP(0, NCASES, kernels_compile), TS_TESTS(kernels_deterministic));
    return ts_main_cache(s, "attn-test", &g_cache);
}
