/* The token sampler (model/sampler.c, docs/sampling.md), no GPU:
 *  - Philox4x32-10 against Random123's known answers, the uniform number it gives per
 *    (seed, position), km_sampler_exp against exp;
 *  - the penalties, each stage (top-k, top-p, min-p, temperature) and the draw on small
 *    vocabularies against values worked out by hand (derivations in the comments), and the
 *    order of the chain (llama.cpp's: the temperature after the filters);
 *  - greedy at temp 0, NaN and infinities, the partial top-k equal to a full sort on a 256k
 *    vocabulary full of ties;
 *  - determinism per seed, frequencies over many positions near the distribution (fixed seeds,
 *    generous bounds, nothing timed);
 *  - range checks naming the flag, argument errors. */
#include "tests/support.h"

#include "base/base.h"
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Philox, the uniform number, exp -------------------------------------------------------- */

/* Random123's known-answer vectors for philox4x32 with 10 rounds: tests/kat_vectors of
 * https://github.com/DEShawResearch/random123 (lines "philox4x32 10 ..."): counter (4 words),
 * key (2 words), then the expected output (4 words). */
static const uint32_t KAT[3][10] = {
    {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
     0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
     0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
     0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
};

START_TEST(philox_kat) {
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        km_philox4x32_10(KAT[i], KAT[i] + 4, out);
        for (int w = 0; w < 4; w++)
            ck_assert_msg(out[w] == KAT[i][6 + w], "vector %d word %d: %08x, want %08x", i, w, out[w],
                          KAT[i][6 + w]);
    }
}
END_TEST

START_TEST(uniform_from_philox) {
    /* Seed 0, position 0 is the all-zero vector: word 0 0x6627e8d5, top 24 bits 0x6627e8. */
    ck_assert_float_eq(km_sampler_uniform(0, 0), (float)0x6627e8 / 16777216.0f);
    /* The position's high word is counter word 1, the seed's high word key word 1. */
    uint32_t ctr[4] = {5, 1, 0, 0}, key[2] = {7, 3}, out[4];
    km_philox4x32_10(ctr, key, out);
    ck_assert_float_eq(km_sampler_uniform(((uint64_t)3 << 32) | 7, ((int64_t)1 << 32) | 5),
                       (float)(out[0] >> 8) * 0x1p-24f);
    /* [0, 1), and a mean near 1/2 over 100k positions (sd of the mean 0.0009). */
    double sum = 0;
    float  lo = 1, hi = 0;
    for (int64_t pos = 0; pos < 100000; pos++) {
        float u = km_sampler_uniform(42, pos);
        sum += u, lo = fminf(lo, u), hi = fmaxf(hi, u);
    }
    ck_assert(lo >= 0.0f && hi < 1.0f);
    ck_assert_msg(fabs(sum / 100000 - 0.5) < 0.01, "mean %g", sum / 100000);
}
END_TEST

static double ulps(float got, double want) {
    return fabs((double)got - want) / (double)(nextafterf((float)want, INFINITY) - (float)want);
}

START_TEST(exp_accuracy) {
    ck_assert(km_sampler_exp(0.0f) == 1.0f && km_sampler_exp(-0.0f) == 1.0f);
    ck_assert(km_sampler_exp(-86.5f) == 0.0f && km_sampler_exp(-INFINITY) == 0.0f);
    ck_assert(km_sampler_exp(NAN) == 0.0f);
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) { /* [-86, 0] in steps of 43e-6 */
        float x = -86.0f * (float)i / 2000000.0f;
        worst = fmax(worst, ulps(km_sampler_exp(x), exp((double)x)));
    }
    ck_assert_msg(worst <= 2.0, "worst error %g ulp", worst);
    /* The bits a GPU kernel must give (this implementation's, each within 1 ulp of exp): a
     * compiler that fused a multiply-add or used another exp would change some of them. */
    static const struct { float x; uint32_t bits; } pins[] = {
        {-1.0f, 0x3ebc5ab2}, {-0.5f, 0x3f1b4598}, {-0.1f, 0x3f67a36d}, {-10.0f, 0x383e6bce},
        {-85.9f, 0x018698a0}, {-0.346f, 0x3f351f8a},
    };
    for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++) {
        float    e = km_sampler_exp(pins[i].x);
        uint32_t b;
        memcpy(&b, &e, sizeof b);
        ck_assert_msg(b == pins[i].bits, "exp(%g): %08x, want %08x", (double)pins[i].x, b, pins[i].bits);
        ck_assert(ulps(e, exp((double)pins[i].x)) <= 1.0);
    }
}
END_TEST

/* ---- parameters ----------------------------------------------------------------------------- */

START_TEST(defaults) {
    kiln_sampler_params p = kiln_sampler_params_default();
    ck_assert(p.seed == KILN_SAMPLER_DEFAULT_SEED);
    ck_assert(p.temp == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f);
    ck_assert(p.repeat_penalty == 1.0f && p.repeat_last_n == 64);
    ck_assert(p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f);
    TS_OK(kiln_sampler_check(&p));
}
END_TEST

static void check_error(const kiln_sampler_params *p, const char *needle) {
    kiln_status st = kiln_sampler_check(p);
    ck_assert_msg(st && kiln_status_code(st) == KILN_ERR_INVALID, "no error for %s", needle);
    ck_assert_msg(strstr(kiln_status_msg(st), needle), "'%s' lacks '%s'", kiln_status_msg(st), needle);
    kiln_status_free(st);
}

START_TEST(range_checks) {
    const kiln_sampler_params d = kiln_sampler_params_default();
    kiln_sampler_params p;
#define BAD(field, value, needle) (p = d, p.field = (value), check_error(&p, needle))
    BAD(top_p, 1.5f, "--top-p 1.5: must be in [0, 1]");
    BAD(top_p, -0.1f, "--top-p -0.1");
    BAD(top_p, NAN, "--top-p nan");
    BAD(min_p, 2.0f, "--min-p 2: must be in [0, 1]");
    BAD(min_p, -1.0f, "--min-p -1");
    BAD(temp, NAN, "--temp nan: must be a finite number");
    BAD(temp, INFINITY, "--temp inf");
    BAD(repeat_penalty, 0.0f, "--repeat-penalty 0: must be a finite number > 0");
    BAD(repeat_penalty, -1.1f, "--repeat-penalty -1.1");
    BAD(repeat_penalty, INFINITY, "--repeat-penalty inf");
    BAD(repeat_last_n, -2, "--repeat-last-n -2: must be -1");
    BAD(presence_penalty, NAN, "--presence-penalty nan");
    BAD(frequency_penalty, -INFINITY, "--frequency-penalty -inf");
#undef BAD
    /* The ends of the ranges, and values llama.cpp gives a meaning. */
#define GOOD(field, value)                                                                    \
    do {                                                                                      \
        p = d, p.field = (value);                                                             \
        TS_OK(kiln_sampler_check(&p));                                                        \
    } while (0)
    GOOD(top_p, 0.0f);
    GOOD(top_p, 1.0f);
    GOOD(min_p, 0.0f);
    GOOD(min_p, 1.0f);
    GOOD(temp, 0.0f);
    GOOD(temp, -1.0f); /* greedy, as llama.cpp clamps it to 0 */
    GOOD(top_k, 0);
    GOOD(top_k, -1);
    GOOD(repeat_last_n, -1);
    GOOD(repeat_penalty, 1e-3f);
    GOOD(presence_penalty, -2.0f);
    GOOD(seed, UINT64_MAX);
#undef GOOD
    kiln_status st = kiln_sampler_check(NULL);
    ck_assert(st && kiln_status_code(st) == KILN_ERR_INVALID);
    kiln_status_free(st);
}
END_TEST

static void sample_error(const kiln_sampler_params *p, const float *l, int64_t n, const int32_t *h,
                         int64_t nh, int64_t pos, int32_t *out, const char *needle) {
    kiln_status st = kiln_sample(p, l, n, h, nh, pos, out);
    ck_assert_msg(st && kiln_status_code(st) == KILN_ERR_INVALID, "no error for %s", needle);
    ck_assert_msg(strstr(kiln_status_msg(st), needle), "'%s' lacks '%s'", kiln_status_msg(st), needle);
    kiln_status_free(st);
}

START_TEST(argument_errors) {
    kiln_sampler_params p = kiln_sampler_params_default();
    float               l[3] = {1, 2, 3};
    int32_t             h[2] = {0, 3}, out;
    sample_error(&p, l, 3, h, 2, 2, &out, "history[1] = 3 is not a token id (n_vocab 3)");
    h[1] = -1;
    sample_error(&p, l, 3, h, 2, 2, &out, "history[1] = -1");
    sample_error(&p, l, 3, NULL, 0, -1, &out, "position -1");
    sample_error(&p, l, 0, NULL, 0, 0, &out, "n_vocab 0");
    sample_error(&p, NULL, 3, NULL, 0, 0, &out, "NULL argument");
    sample_error(&p, l, 3, NULL, 0, 0, NULL, "NULL argument");
    sample_error(&p, l, 3, NULL, 1, 0, &out, "NULL argument");
    p.top_p = 7;
    sample_error(&p, l, 3, NULL, 0, 0, &out, "--top-p 7");
}
END_TEST

/* ---- penalties ------------------------------------------------------------------------------ */

/* logits 2, -1, 0.5, 3, 0; repeat 2, frequency 0.5, presence 0.25; history 3 1 0 0 4.
 * Window of 4 (1 0 0 4): counts 0:2, 1:1, 4:1, and token 3 outside it. By hand:
 *  id 0:  2 > 0: 2/2 = 1,      minus 2*0.5 + 0.25 = 1.25  -> -0.25
 *  id 1: -1 <= 0: -1*2 = -2,   minus 1*0.5 + 0.25 = 0.75  -> -2.75
 *  id 4:  0 <= 0: 0*2 = 0,     minus 0.75                 -> -0.75
 *  ids 2, 3 unchanged. Window -1 (all five): id 3 too, 3/2 - 0.75 = 0.75. Every value is
 *  exact in binary, so the comparison is exact. */
START_TEST(penalties_by_hand) {
    kiln_sampler_params p = kiln_sampler_params_default();
    p.repeat_penalty = 2, p.frequency_penalty = 0.5f, p.presence_penalty = 0.25f, p.repeat_last_n = 4;
    const float   in[5] = {2, -1, 0.5f, 3, 0};
    const int32_t hist[5] = {3, 1, 0, 0, 4};
    float         l[5];
    memcpy(l, in, sizeof l);
    TS_OK(km_sampler_penalize(&p, l, 5, hist, 5));
    const float want4[5] = {-0.25f, -2.75f, 0.5f, 3, -0.75f};
    for (int i = 0; i < 5; i++) ck_assert_msg(l[i] == want4[i], "id %d: %g, want %g", i, (double)l[i], (double)want4[i]);
    memcpy(l, in, sizeof l);
    p.repeat_last_n = -1;
    TS_OK(km_sampler_penalize(&p, l, 5, hist, 5));
    ck_assert(l[3] == 0.75f && l[0] == -0.25f);
    memcpy(l, in, sizeof l); /* a window longer than the history: all of it */
    p.repeat_last_n = 100;
    TS_OK(km_sampler_penalize(&p, l, 5, hist, 5));
    ck_assert(l[3] == 0.75f);
    memcpy(l, in, sizeof l); /* 0: off */
    p.repeat_last_n = 0;
    TS_OK(km_sampler_penalize(&p, l, 5, hist, 5));
    ck_assert(!memcmp(l, in, sizeof l));
    /* Only the repeat penalty (llama.cpp's defaults otherwise): 2 -> 1 for id 0 only. */
    p = kiln_sampler_params_default();
    p.repeat_penalty = 2, p.repeat_last_n = 1;
    memcpy(l, in, sizeof l);
    const int32_t h0[1] = {0};
    TS_OK(km_sampler_penalize(&p, l, 5, h0, 1));
    ck_assert(l[0] == 1.0f && l[3] == 3.0f);
}
END_TEST

START_TEST(penalties_in_chain) {
    kiln_sampler_params p = kiln_sampler_params_default();
    int32_t             out;
    /* Greedy after the penalty: 3 / 1.1 = 2.727 < 2.9, so token 1; the caller's logits stay. */
    p.temp = 0, p.repeat_penalty = 1.1f;
    float         l[2] = {3.0f, 2.9f};
    const int32_t h[1] = {0};
    TS_OK(kiln_sample(&p, l, 2, h, 1, 1, &out));
    ck_assert_int_eq(out, 1);
    ck_assert(l[0] == 3.0f && l[1] == 2.9f);
    /* The penalties come before top-k: 5 / 10 = 0.5 drops token 0 behind token 1 (4), and
     * top-k 1 keeps token 1 alone, whatever the draw. */
    p = kiln_sampler_params_default();
    p.repeat_penalty = 10, p.top_k = 1;
    float l3[3] = {5, 4, 1};
    for (int64_t pos = 0; pos < 16; pos++) {
        TS_OK(kiln_sample(&p, l3, 3, h, 1, pos, &out));
        ck_assert_int_eq(out, 1);
    }
}
END_TEST

/* ---- greedy --------------------------------------------------------------------------------- */

START_TEST(greedy) {
    kiln_sampler_params p = kiln_sampler_params_default();
    int32_t             out;
    p.temp = 0;
    const float ties[5] = {1, 5, NAN, 5, -2}; /* the first of the largest; NaN never wins */
    TS_OK(kiln_sample(&p, ties, 5, NULL, 0, 0, &out));
    ck_assert_int_eq(out, 1);
    p.temp = -1; /* llama.cpp's negative temperature is greedy too */
    TS_OK(kiln_sample(&p, ties, 5, NULL, 0, 0, &out));
    ck_assert_int_eq(out, 1);
    /* Greedy ignores the seed and the position. */
    for (int64_t pos = 0; pos < 8; pos++) {
        p.seed = (uint64_t)pos * 977;
        TS_OK(kiln_sample(&p, ties, 5, NULL, 0, pos, &out));
        ck_assert_int_eq(out, 1);
    }
}
END_TEST

/* ---- the stages on five logits -------------------------------------------------------------- */

/* logits ln 1, ln 2, ln 3, ln 4, ln 10 (ids 0..4): at temperature 1 the probabilities are
 * 1/20, 2/20, 3/20, 4/20, 10/20, i.e. in draw order (ids 4 3 2 1 0) 0.5 0.2 0.15 0.1 0.05, with
 * running sums 0.5 0.7 0.85 0.95 1. The logits are rounded to float and exp is within 2 ulp, so
 * the probabilities match to 1e-6. */
static const float W5[5] = {1, 2, 3, 4, 10};
static float       L5[5];

static void setup5(void) {
    for (int i = 0; i < 5; i++) L5[i] = logf(W5[i]);
}

static kiln_sampler_params plain(float temp) { /* every filter off */
    kiln_sampler_params p = kiln_sampler_params_default();
    p.temp = temp, p.top_k = 0, p.top_p = 1, p.min_p = 0;
    return p;
}

/* Runs the filters over L5 and checks the candidates' ids and probabilities (w / sum). */
static void expect(const kiln_sampler_params *p, int n, const int32_t *ids, const double *probs) {
    km_cands c;
    TS_OK(km_sampler_filter(p, L5, 5, &c));
    ck_assert_int_eq(c.n, n);
    for (int j = 0; j < n; j++) {
        ck_assert_int_eq(c.c[j].id, ids[j]);
        ck_assert_msg(fabs(c.w[j] / c.sum - probs[j]) < 1e-6, "candidate %d: %g, want %g", j,
                      (double)(c.w[j] / c.sum), probs[j]);
    }
    km_cands_free(&c);
}

START_TEST(stage_temperature) {
    kiln_sampler_params p = plain(1);
    expect(&p, 5, (const int32_t[]){4, 3, 2, 1, 0}, (const double[]){0.5, 0.2, 0.15, 0.1, 0.05});
    /* temp 0.5 squares the weights: 100 16 9 4 1 over 130. */
    p = plain(0.5f);
    expect(&p, 5, (const int32_t[]){4, 3, 2, 1, 0},
           (const double[]){100 / 130.0, 16 / 130.0, 9 / 130.0, 4 / 130.0, 1 / 130.0});
    /* temp 2 takes square roots: sqrt(w) / (1 + 1.41421 + 1.73205 + 2 + 3.16228 = 9.30854). */
    p = plain(2);
    double s = 1 + sqrt(2) + sqrt(3) + 2 + sqrt(10);
    expect(&p, 5, (const int32_t[]){4, 3, 2, 1, 0},
           (const double[]){sqrt(10) / s, 2 / s, sqrt(3) / s, sqrt(2) / s, 1 / s});
}
END_TEST

START_TEST(stage_top_k) {
    kiln_sampler_params p = plain(1);
    p.top_k = 2; /* 10 and 4: 10/14, 4/14 */
    expect(&p, 2, (const int32_t[]){4, 3}, (const double[]){10 / 14.0, 4 / 14.0});
    p.top_k = 1;
    expect(&p, 1, (const int32_t[]){4}, (const double[]){1});
    p.top_k = 9; /* more than the vocabulary: all */
    expect(&p, 5, (const int32_t[]){4, 3, 2, 1, 0}, (const double[]){0.5, 0.2, 0.15, 0.1, 0.05});
}
END_TEST

START_TEST(stage_top_p) {
    kiln_sampler_params p = plain(1);
    p.top_p = 0.6f; /* running sums 0.5 < 0.6 <= 0.7: two, renormalized 10/14, 4/14 */
    expect(&p, 2, (const int32_t[]){4, 3}, (const double[]){10 / 14.0, 4 / 14.0});
    p.top_p = 0.9f; /* 0.85 < 0.9 <= 0.95: four, 10 4 3 2 over 19 */
    expect(&p, 4, (const int32_t[]){4, 3, 2, 1}, (const double[]){10 / 19.0, 4 / 19.0, 3 / 19.0, 2 / 19.0});
    p.top_p = 0; /* the first reaches 0 */
    expect(&p, 1, (const int32_t[]){4}, (const double[]){1});
    /* After top-k 3, top-p renormalizes over 10 4 3 (17): 10/17 = 0.588 < 0.6 <= 14/17. */
    p.top_k = 3, p.top_p = 0.6f;
    expect(&p, 2, (const int32_t[]){4, 3}, (const double[]){10 / 14.0, 4 / 14.0});
    p.top_p = 0.55f; /* 10/17 = 0.588 >= 0.55: one */
    expect(&p, 1, (const int32_t[]){4}, (const double[]){1});
}
END_TEST

START_TEST(stage_min_p) {
    kiln_sampler_params p = plain(1);
    p.min_p = 0.25f; /* ratios to the largest 1 0.4 0.3 0.2 0.1: three, 10 4 3 over 17 */
    expect(&p, 3, (const int32_t[]){4, 3, 2}, (const double[]){10 / 17.0, 4 / 17.0, 3 / 17.0});
    p.min_p = 0.05f; /* llama.cpp's default keeps all five here */
    expect(&p, 5, (const int32_t[]){4, 3, 2, 1, 0}, (const double[]){0.5, 0.2, 0.15, 0.1, 0.05});
    p.min_p = 1; /* only the largest */
    expect(&p, 1, (const int32_t[]){4}, (const double[]){1});
    /* With top-p, the shorter of the two prefixes: top-p 0.9 keeps four, min-p 0.25 three
     * (0.2 < 0.25); top-p 0.6 keeps two, min-p 0.15 would keep four. */
    p.top_p = 0.9f, p.min_p = 0.25f;
    expect(&p, 3, (const int32_t[]){4, 3, 2}, (const double[]){10 / 17.0, 4 / 17.0, 3 / 17.0});
    p.top_p = 0.6f, p.min_p = 0.15f;
    expect(&p, 2, (const int32_t[]){4, 3}, (const double[]){10 / 14.0, 4 / 14.0});
}
END_TEST

/* kiln follows llama.cpp's order: top-p and min-p see the probabilities at temperature 1, and
 * the temperature reshapes what they keep. The order (the temperature first) would
 * give other sets, so these pin the order. */
START_TEST(chain_order) {
    kiln_sampler_params p = plain(0.5f);
    /* top-p 0.6 at temperature 1 keeps ids 4, 3 (0.5 < 0.6 <= 0.7), then temperature 0.5:
     * 100/116, 16/116. (Temperature first: 100/130 = 0.77 >= 0.6 would keep id 4 alone.) */
    p.top_p = 0.6f;
    expect(&p, 2, (const int32_t[]){4, 3}, (const double[]){100 / 116.0, 16 / 116.0});
    /* min-p 0.25 keeps ratios >= 0.25 at temperature 1: ids 4 3 2, then 100 16 9 over 125.
     * (Temperature first: ratios 1 0.16 ..., id 4 alone.) */
    p.top_p = 1, p.min_p = 0.25f;
    expect(&p, 3, (const int32_t[]){4, 3, 2}, (const double[]){100 / 125.0, 16 / 125.0, 9 / 125.0});
    /* temp 2 with top-p 0.6: still ids 4, 3, then sqrt(10) and 2 over their sum. */
    p = plain(2);
    p.top_p = 0.6f;
    double s = sqrt(10) + 2;
    expect(&p, 2, (const int32_t[]){4, 3}, (const double[]){sqrt(10) / s, 2 / s});
}
END_TEST

/* The draw: the first candidate whose running sum reaches u * sum. Running sums 0.5 0.7 0.85
 * 0.95 1 over ids 4 3 2 1 0. */
START_TEST(pick_by_hand) {
    kiln_sampler_params p = plain(1);
    km_cands            c;
    TS_OK(km_sampler_filter(&p, L5, 5, &c));
    static const struct { float u; int32_t id; } cases[] = {
        {0.0f, 4}, {0.3f, 4}, {0.49f, 4}, {0.51f, 3}, {0.6f, 3}, {0.69f, 3}, {0.71f, 2},
        {0.84f, 2}, {0.86f, 1}, {0.94f, 1}, {0.96f, 0}, {0.99999994f, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t j = km_sampler_pick(&c, cases[i].u);
        ck_assert_msg(c.c[j].id == cases[i].id, "u %g: id %d, want %d", (double)cases[i].u, c.c[j].id, cases[i].id);
    }
    km_cands_free(&c);
    /* Three equal logits: ids in ascending order, a third each; u 0.5 is in the second. */
    const float eq[3] = {1, 1, 1};
    TS_OK(km_sampler_filter(&p, eq, 3, &c));
    ck_assert(c.c[0].id == 0 && c.c[1].id == 1 && c.c[2].id == 2);
    ck_assert(c.c[km_sampler_pick(&c, 0.5f)].id == 1 && c.c[km_sampler_pick(&c, 0.7f)].id == 2);
    km_cands_free(&c);
}
END_TEST

/* kiln_sample end to end: seed 0, position 0 draws u = 0x6627e8 / 2^24 = 0.39905 (the first
 * known-answer vector), below 0.5: id 4. For 2000 positions of seed 9, the token is where u
 * falls among the running sums worked out by hand (positions whose u lies within 1e-5 of a
 * boundary are skipped, where float rounding may decide). */
START_TEST(sample_by_hand) {
    kiln_sampler_params p = plain(1);
    int32_t             out;
    p.seed = 0;
    TS_OK(kiln_sample(&p, L5, 5, NULL, 0, 0, &out));
    ck_assert_int_eq(out, 4);
    static const double  cdf[5] = {0.5, 0.7, 0.85, 0.95, 1};
    static const int32_t ids[5] = {4, 3, 2, 1, 0};
    p.seed = 9;
    int checked = 0;
    for (int64_t pos = 0; pos < 2000; pos++) {
        double u = km_sampler_uniform(9, pos);
        int    j = 0;
        while (cdf[j] <= u) j++;
        if (fabs(u - cdf[j]) < 1e-5 || (j > 0 && fabs(u - cdf[j - 1]) < 1e-5)) continue;
        TS_OK(kiln_sample(&p, L5, 5, NULL, 0, pos, &out));
        ck_assert_msg(out == ids[j], "position %lld: u %g, id %d, want %d", (long long)pos, u, out, ids[j]);
        checked++;
    }
    ck_assert_int_ge(checked, 1990);
}
END_TEST

/* ---- NaN and infinities --------------------------------------------------------------------- */

START_TEST(non_finite) {
    kiln_sampler_params p = plain(1);
    km_cands            c;
    /* NaN and -inf are never candidates. */
    const float a[4] = {NAN, -INFINITY, 0, 0};
    TS_OK(km_sampler_filter(&p, a, 4, &c));
    ck_assert(c.n_valid == 2 && c.n == 2 && c.c[0].id == 2 && c.c[1].id == 3);
    km_cands_free(&c);
    int32_t out;
    for (int64_t pos = 0; pos < 64; pos++) {
        TS_OK(kiln_sample(&p, a, 4, NULL, 0, pos, &out));
        ck_assert(out == 2 || out == 3);
    }
    /* +inf: the infinite ones share the draw, weight 1 each; the finite weigh 0. */
    const float b[3] = {INFINITY, 0, INFINITY};
    TS_OK(km_sampler_filter(&p, b, 3, &c));
    ck_assert(c.n == 3 && c.c[0].id == 0 && c.c[1].id == 2 && c.w[0] == 1 && c.w[1] == 1 && c.w[2] == 0);
    km_cands_free(&c);
    for (int64_t pos = 0; pos < 64; pos++) {
        TS_OK(kiln_sample(&p, b, 3, NULL, 0, pos, &out));
        ck_assert(out == 0 || out == 2);
    }
    /* Nothing to draw from: the argmax's answer (the first -inf, else 0). */
    const float none[3] = {NAN, -INFINITY, NAN};
    TS_OK(kiln_sample(&p, none, 3, NULL, 0, 0, &out));
    ck_assert_int_eq(out, 1);
    const float nans[2] = {NAN, NAN};
    TS_OK(kiln_sample(&p, nans, 2, NULL, 0, 0, &out));
    ck_assert_int_eq(out, 0);
    /* A tiny temperature: (l - max) / temp is -inf for the others, weight 0; the max wins. */
    p.temp = 1e-30f;
    for (int64_t pos = 0; pos < 16; pos++) {
        TS_OK(kiln_sample(&p, L5, 5, NULL, 0, pos, &out));
        ck_assert_int_eq(out, 4);
    }
}
END_TEST

/* ---- determinism and frequencies ------------------------------------------------------------ */

START_TEST(determinism) {
    kiln_sampler_params p = plain(1);
    const float         flat[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t             a[64], b[64], c[64], d[64];
    for (int64_t pos = 0; pos < 64; pos++) {
        p.seed = 1;
        TS_OK(kiln_sample(&p, flat, 8, NULL, 0, pos, &a[pos]));
        TS_OK(kiln_sample(&p, flat, 8, NULL, 0, pos, &b[pos]));
        p.seed = 2;
        TS_OK(kiln_sample(&p, flat, 8, NULL, 0, pos, &c[pos]));
        p.seed = 1 + ((uint64_t)1 << 32); /* the seed's high word is part of the key */
        TS_OK(kiln_sample(&p, flat, 8, NULL, 0, pos, &d[pos]));
    }
    ck_assert(!memcmp(a, b, sizeof a));
    ck_assert(memcmp(a, c, sizeof a) && memcmp(a, d, sizeof a));
    /* Over 64 positions of one seed, a flat draw over 8 tokens gives several of them. */
    int seen = 0;
    for (int i = 0; i < 64; i++) seen |= 1 << a[i];
    ck_assert_int_ge(__builtin_popcount(seen), 6);
}
END_TEST

/* Frequencies over 40000 positions against the hand-worked probabilities: the sd of a
 * frequency is at most 0.0025, the bound 0.015 six of them. */
static void frequencies(const kiln_sampler_params *p, const double *want) {
    int counts[5] = {0};
    for (int64_t pos = 0; pos < 40000; pos++) {
        int32_t out;
        TS_OK(kiln_sample(p, L5, 5, NULL, 0, pos, &out));
        counts[out]++;
    }
    for (int i = 0; i < 5; i++)
        ck_assert_msg(fabs(counts[i] / 40000.0 - want[i]) < 0.015, "id %d: %g, want %g", i,
                      counts[i] / 40000.0, want[i]);
}

START_TEST(statistics) {
    kiln_sampler_params p = plain(1);
    p.seed = 12345;
    frequencies(&p, (const double[]){0.05, 0.1, 0.15, 0.2, 0.5});
    p = plain(0.5f); /* top-p 0.6 then temperature 0.5 (chain_order): 16/116 and 100/116 */
    p.top_p = 0.6f, p.seed = 777;
    frequencies(&p, (const double[]){0, 0, 0, 16 / 116.0, 100 / 116.0});
}
END_TEST

/* ---- a large vocabulary --------------------------------------------------------------------- */

/* 256k logits from a hash, rounded to 1/4 so that there are ties by the thousand. */
#define NBIG (256 * 1024)
static float *big_logits(void) {
    float *l = malloc(NBIG * sizeof *l);
    ck_assert_ptr_nonnull(l);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < NBIG; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        l[i] = floorf((float)(s >> 40) / (float)(1 << 24) * 40.0f) / 4.0f - 5.0f; /* [-5, 5) */
    }
    return l;
}

START_TEST(top_k_large) {
    float *l = big_logits();
    kiln_sampler_params p = plain(1);
    km_cands            full;
    TS_OK(km_sampler_filter(&p, l, NBIG, &full)); /* top_k 0: every candidate, sorted */
    ck_assert_int_eq(full.n_top_k, NBIG);
    for (int64_t j = 1; j < NBIG; j++) {
        km_cand a = full.c[j - 1], b = full.c[j];
        ck_assert(a.logit > b.logit || (a.logit == b.logit && a.id < b.id));
    }
    static const int32_t ks[] = {1, 40, 1000, NBIG - 1};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        km_cands c;
        p.top_k = ks[i];
        TS_OK(km_sampler_filter(&p, l, NBIG, &c)); /* the heap */
        ck_assert_int_eq(c.n_top_k, ks[i]);
        for (int64_t j = 0; j < ks[i]; j++)
            ck_assert_msg(c.c[j].id == full.c[j].id, "k %d, candidate %lld", ks[i], (long long)j);
        km_cands_free(&c);
    }
    km_cands_free(&full);
    /* The defaults: about 6500 logits are 4.75, the largest, so top-k 40 keeps the 40 of them
     * with the lowest ids, and the draw picks one of those. */
    int64_t fortieth = -1;
    for (int64_t i = 0, seen = 0; i < NBIG && seen < 40; i++)
        if (l[i] == 4.75f) seen++, fortieth = i;
    p = kiln_sampler_params_default();
    for (int64_t pos = 0; pos < 8; pos++) {
        int32_t out;
        TS_OK(kiln_sample(&p, l, NBIG, NULL, 0, pos, &out));
        ck_assert(l[out] == 4.75f && out <= fortieth);
    }
    free(l);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("sampler",
                        TS_CASE("rng", 60),
                        TS_TESTS(philox_kat, uniform_from_philox, exp_accuracy),
                        TS_CASE("params", 0),
                        TS_TESTS(defaults, range_checks, argument_errors),
                        TS_CASE_FIXTURE("stages", 60, setup5, NULL),
                        TS_TESTS(penalties_by_hand, penalties_in_chain, greedy, stage_temperature, stage_top_k,
                                 stage_top_p, stage_min_p, chain_order, pick_by_hand, sample_by_hand,
                                 non_finite, determinism, statistics),
                        TS_CASE("large", 120),
                        TS_TESTS(top_k_large));
    return ts_main(s);
}
