/* The op sample on the GPU (templates/sample.lua) against kiln_sample, which is its CPU
 * reference: tokens must be identical, not close.
 *  - rows: for each parameter set (greedy, each stage on and off, top-k 1 .. 256, top-k off over
 *    a short row), one program run over many rows of several kinds (spread logits, ties, -inf,
 *    NaN, +inf and signed zeros sprinkled, no candidate at all, one dominant logit) at random
 *    positions, and over vocabularies of 1 to 256000 logits;
 *  - a model: a tiny model's kiln_gen built with a GPU sampler generates 64 tokens
 *    (kiln_gen_generate: the chained decode fed the program's own sample); a second kiln_gen
 *    without it is fed the same tokens (teacher forcing) and kiln_sample picks on the host from
 *    its logits at each position. Same kernels, same inputs: the logits are the same bits, so
 *    every pick must be equal. */
#include "tests/gpu/gpu_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- rows ------------------------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    float   temp, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
} sample_case;

static const sample_case CASES[] = {
    {151936, 0.8f, 0.95f, 0.05f, 40, 0},                     /* llama.cpp's defaults */
    {151936, 0.8f, 0.95f, 0.05f, 40, 0xfedcba9876543210ull},
    {128256, 0.0f, 0.95f, 0.05f, 40, 3},                     /* greedy */
    {128256, 1.0f, 1.0f, 0.0f, 1, 7},
    {128256, 0.7f, 1.0f, 0.0f, 40, 11},                      /* top-k and temperature only */
    {32000, 0.7f, 0.5f, 0.0f, 100, 12},                      /* top-p only */
    {32000, 1.3f, 1.0f, 0.2f, 64, 13},                       /* min-p only */
    {256000, 1.5f, 0.99f, 0.01f, 256, 14},                   /* the largest K, longest row */
    {256000, 0.6f, 0.9f, 0.05f, 255, 15},
    {1000, 0.9f, 0.95f, 0.05f, 5, 16},
    {200, 2.0f, 1.0f, 0.0f, 0, 17},                          /* top-k off over a short row */
    {1, 0.8f, 0.95f, 0.05f, 40, 18},
    {3, 0.8f, 0.0f, 0.0f, 2, 19},                            /* top-p 0 keeps one */
    {5000, 0.25f, 0.95f, 1.0f, 17, 20},                      /* min-p 1: ties of the max only */
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))
#define ROWS 40

START_TEST(rows_match_kiln_sample) {
    need_gpu();
    const sample_case *c = &CASES[_i];
    kiln_sampler_params sp = kiln_sampler_params_default();
    sp.temp = c->temp, sp.top_k = c->top_k, sp.top_p = c->top_p, sp.min_p = c->min_p, sp.seed = c->seed;
    char kg[512];
    snprintf(kg, sizeof kg,
             "input a: f32[%lld]\ninput pos: i32[2]\n"
             "output y = sample(a, pos, seed_lo=%d, seed_hi=%d, temp=%.9g, top_k=%d, top_p=%.9g, min_p=%.9g)\n",
             (long long)c->n, (int32_t)(uint32_t)sp.seed, (int32_t)(uint32_t)(sp.seed >> 32), (double)sp.temp,
             (int)sp.top_k, (double)sp.top_p, (double)sp.min_p);
    kiln_ctx   *ctx = ts_parse(kg);
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program *p = compile(g, 0);
    kiln_session *s;
    TS_OK(kiln_session_new(p, NULL, &s));
    float *x = malloc(sizeof *x * (size_t)c->n);
    ck_assert_ptr_nonnull(x);
    uint64_t r = 0x77u + (uint64_t)_i;
    for (int row = 0; row < ROWS; row++) {
        int kind = row % 5;
        ts_logit_row(&r, x, c->n, kind);
        int32_t pos[2] = {0, (int32_t)(ts_rng_next(&r) % 2000000000u)};
        TS_OK(kiln_session_set(s, "a", x, sizeof *x * (size_t)c->n));
        TS_OK(kiln_session_set(s, "pos", pos, sizeof pos));
        TS_OK(kiln_session_run(s));
        int32_t got = -1, want = -2;
        TS_OK(kiln_session_get(s, "y", &got, sizeof got));
        TS_OK(kiln_sample(&sp, x, c->n, NULL, 0, (int64_t)pos[1] + 1, &want));
        ck_assert_msg(got == want, "case %d (n %lld, temp %g, top_k %d, top_p %g, min_p %g), row %d (kind %d, "
                      "position %d): GPU %d, kiln_sample %d", _i, (long long)c->n, (double)c->temp, c->top_k,
                      (double)c->top_p, (double)c->min_p, row, kind, pos[1] + 1, got, want);
    }
    free(x);
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* ---- a model ------------------------------------------------------------------------------------ */

static const char *const archs[] = {"llama", "qwen3moe", "qwen2", "qwen3", "granite", "smollm3", "phi3", "gemma3", "gemma2", "gpt-oss"};
#define NARCHS ((int)(sizeof archs / sizeof archs[0]))
static const int32_t     prompt[7] = {1, 17, 300, 5, 999, 42, 8};
static char             *g_dir;

static bool collect(void *user, int32_t id) {
    int32_t *v = user;
    v[1 + v[0]++] = id;
    return false;
}

START_TEST(model_generates_host_sampler_tokens) {
    need_gpu();
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(archs[_i], "tiny", &hp));
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, archs[_i]);
    TS_OK(kiln_model_write_random(&hp, 33, path, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    int64_t             nv = kiln_model_get_hparams(m)->n_vocab;
    kiln_sampler_params sp = kiln_sampler_params_default();
    sp.seed = 4321 + (uint64_t)_i;
    ck_assert(kiln_sampler_on_gpu(&sp, nv));

    /* The GPU sampler: 64 tokens through kiln_gen_generate's chained decode. */
    kiln_gen_opts o = {.n_ctx = 128, .n_batch = 8, .sampler = &sp};
    kiln_gen     *g;
    TS_OK(kiln_gen_new(m, &o, &g));
    int32_t         got[1 + 64] = {0};
    kiln_gen_params gp = {.n_predict = 64, .on_token = collect, .user = got, .sampler = &sp};
    int64_t         n_out = 0;
    kiln_stop       why;
    kiln_gen_stats  st;
    TS_OK(kiln_gen_generate(g, prompt, 7, &gp, &n_out, &why, &st));
    ck_assert_int_eq(n_out, 64);
    ck_assert_int_eq(got[0], 64);

    /* The host sampler over the same program's logits, fed the same tokens. */
    kiln_gen_opts oh = {.n_ctx = 128, .n_batch = 8};
    kiln_gen     *h;
    TS_OK(kiln_gen_new(m, &oh, &h));
    int32_t      hist[7 + 64];
    const float *lg;
    memcpy(hist, prompt, sizeof prompt);
    for (int i = 0; i < 64; i++) {
        TS_OK(i ? kiln_gen_eval(h, &hist[6 + i], 1, &lg) : kiln_gen_eval(h, prompt, 7, &lg));
        int32_t want;
        TS_OK(kiln_sample(&sp, lg, nv, hist, 7 + i, kiln_gen_pos(h), &want));
        ck_assert_msg(got[1 + i] == want, "%s: step %d: the GPU sampler picked %d, kiln_sample %d", archs[_i], i,
                      got[1 + i], want);
        hist[7 + i] = got[1 + i];
    }
    kiln_gen_free(h);
    kiln_gen_free(g);
    kiln_model_close(m);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

int main(void) {
    Suite *s = TS_SUITE("gpu_sample",
                        TS_CASE("rows", 300), TS_LOOP(0, NCASES, rows_match_kiln_sample),
                        TS_CASE_FIXTURE("model", 300, setup, teardown),
                        TS_LOOP(0, NARCHS, model_generates_host_sampler_tokens));
    return ts_main_cache(s, "gpu-sample", &g_cache_dir);
}
