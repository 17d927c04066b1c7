/* kiln_batch on the GPU (issue 28): four sequences of tiny models (llama, experts, sliding
 * windows with sinks, MLA) through one program and one cache, their prompts in one step, then
 * decode steps of all four with a fifth sequence's prompt joining the steps after another
 * closes; at each step every row's logits agree with the CPU reference's batch fed the same
 * tokens (NMSE) and the greedy picks are identical. Then the same picks as kiln_gen alone on the
 * GPU: the batched program's tokens equal single-sequence tokens. A third batch takes the same
 * steps through kiln_batch_step_greedy: the program's argmax rows are the logits' argmax. A fourth
 * has a variant for steps of at most 8 tokens (kiln_batch_opts.n_small), which the decode steps
 * take: its logits agree with the CPU reference's as the first batch's do. */
#include "tests/gpu/gpu_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS 4
#define STEPS 16
#define LOGITS_NMSE 5e-4 /* as test_gpu_model's */

static const char *const archs[] = {"llama", "qwen3moe", "gpt-oss", "deepseek2"};
#define NARCHS ((int)(sizeof archs / sizeof archs[0]))
static char *g_dir;

static double logits_nmse(const float *ref, const float *got, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(got[i]), "GPU logit %lld is %g", (long long)i, got[i]);
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return num / den;
}

/* The program's argmax rule (ggml's): the last of equal maxima. */
static int32_t argmax_last(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] >= x[best]) best = i;
    return (int32_t)best;
}

static int64_t prompt(int s, int32_t *out) {
    int64_t n = 3 + 2 * s;
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)((37 * (s + 1) + 11 * i) % 1000 + 1);
    return n;
}

START_TEST(batch_matches_cpu_and_alone) {
    need_gpu();
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(archs[_i], "tiny", &hp));
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, archs[_i]);
    TS_OK(kiln_model_write_random(&hp, 13, path, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    int64_t         nv = hp.n_vocab;
    /* GPU, CPU, GPU stepped by kiln_batch_step_greedy, GPU with a variant for steps of at most 8
     * tokens (n_small: the decode steps here) */
    kiln_batch     *side[4];
    kiln_batch_opts o = {.n_ctx = 128, .n_batch = 32, .n_seq = NS};
    TS_OK(kiln_batch_new(m, &o, &side[0]));
    TS_OK(kiln_batch_new(m, &o, &side[2]));
    o.n_small = 8;
    TS_OK(kiln_batch_new(m, &o, &side[3]));
    o.n_small = 0;
    o.cpu = true;
    TS_OK(kiln_batch_new(m, &o, &side[1]));
    int32_t p[NS + 1][16], next[NS + 1], toks[NS + 1][STEPS + 1];
    int     seq[4][NS + 1], live[NS] = {0, 1, 2, 3}, done[NS + 1] = {0};
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < NS; s++) TS_OK(kiln_batch_seq_open(side[k], &seq[k][s]));
    double worst = 0;
    for (int step = 0; step <= STEPS + 2; step++) {
        if (step == 3) { /* sequence 1 leaves, sequence 4 (its cells) comes */
            for (int k = 0; k < 4; k++) {
                kiln_batch_seq_close(side[k], seq[k][1]);
                TS_OK(kiln_batch_seq_open(side[k], &seq[k][4]));
            }
            live[1] = 4;
        }
        kiln_batch_item it[4][NS];
        int             who[NS], n = 0;
        for (int i = 0; i < NS; i++) {
            int s = live[i];
            if (done[s] >= STEPS) continue;
            bool first = step == 0 || (s == 4 && kiln_batch_seq_pos(side[0], seq[0][4]) == 0);
            for (int k = 0; k < 4; k++)
                it[k][n] = first ? (kiln_batch_item){seq[k][s], p[s], prompt(s, p[s])}
                                 : (kiln_batch_item){seq[k][s], &next[s], 1};
            who[n++] = s;
        }
        if (!n) break;
        const float *lg[3][NS];
        int32_t      gp[NS];
        for (int k = 0; k < 2; k++) TS_OK(kiln_batch_step(side[k], it[k], n, lg[k]));
        TS_OK(kiln_batch_step(side[3], it[3], n, lg[2]));
        TS_OK(kiln_batch_step_greedy(side[2], it[2], n, gp));
        for (int i = 0; i < n; i++) {
            int    s = who[i];
            double e = logits_nmse(lg[1][i], lg[0][i], nv);
            worst = fmax(worst, e);
            ck_assert_msg(e <= LOGITS_NMSE, "%s: step %d, sequence %d: logits NMSE %g", archs[_i], step, s, e);
            int32_t g = (int32_t)kiln_argmax_f32(lg[0][i], nv), c = (int32_t)kiln_argmax_f32(lg[1][i], nv);
            ck_assert_msg(g == c, "%s: step %d, sequence %d: GPU picks %d, CPU %d", archs[_i], step, s, g, c);
            ck_assert_msg(gp[i] == argmax_last(lg[0][i], nv), "%s: step %d, sequence %d: the program's argmax %d, "
                          "the logits' %d", archs[_i], step, s, gp[i], argmax_last(lg[0][i], nv));
            double es = logits_nmse(lg[1][i], lg[2][i], nv);
            worst = fmax(worst, es);
            ck_assert_msg(es <= LOGITS_NMSE, "%s: step %d, sequence %d: logits NMSE %g with the n <= 8 variant", archs[_i],
                          step, s, es);
            ck_assert_msg((int32_t)kiln_argmax_f32(lg[2][i], nv) == c, "%s: step %d, sequence %d: the n <= 8 variant "
                          "picks %d, CPU %d", archs[_i], step, s, (int32_t)kiln_argmax_f32(lg[2][i], nv), c);
            toks[s][done[s]++] = next[s] = g;
        }
    }
    kiln_gen_stats gs;
    kiln_batch_get_stats(side[0], &gs);
    printf("%s: %d sequences batched, worst logits NMSE %.3g; %lld tokens in %lld ms of GPU time\n", archs[_i],
           NS + 1, worst, (long long)gs.decode_tokens, (long long)gs.decode_gpu_ms);
    for (int k = 0; k < 4; k++) kiln_batch_free(side[k]);
    /* each sequence alone on the GPU: the same greedy tokens */
    kiln_gen_opts go = {.n_ctx = 64};
    for (int s = 0; s <= NS; s++) {
        if (s == 1) continue; /* (it left after 3 steps) */
        kiln_gen *g;
        TS_OK(kiln_gen_new(m, &go, &g));
        int32_t alone[STEPS];
        TS_OK(kiln_gen_greedy(g, p[s], prompt(s, p[s]), STEPS, alone, NULL));
        for (int i = 0; i < STEPS; i++)
            ck_assert_msg(alone[i] == toks[s][i], "%s: sequence %d, token %d: batched %d, alone %d", archs[_i], s, i,
                          toks[s][i], alone[i]);
        kiln_gen_free(g);
    }
    kiln_model_close(m);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

int main(void) {
    Suite *s = TS_SUITE("gpu_batch", TS_CASE_FIXTURE("gpu_batch", 300, setup, teardown),
                        TS_LOOP(0, NARCHS, batch_matches_cpu_and_alone));
    return ts_main_isolated(s, "gpu_batch");
}
