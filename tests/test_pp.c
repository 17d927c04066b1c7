/* The pipeline (layer) split (issue 30; docs/tp.md): a stage's graph (kiln_build_opts.layer_first,
 * layer_end) and kiln_gen over stages (kiln_gen_opts.pp, model/gen_pp.c) on the CPU reference.
 * A stage's arithmetic is the whole model's, its hidden state handed on in f32, so the logits
 * are the whole model's bit for bit. */
#include "tests/support.h"

#include "model/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether graph gr has a node named `name` of role r. */
static bool has_node(const kiln_graph *gr, const char *name, kiln_role r) {
    for (int i = 0; i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) == r && !strcmp(kiln_tensor_name(t), name)) return true;
    }
    return false;
}

static bool has_output(const kiln_graph *gr, const char *name) { return has_node(gr, name, KILN_ROLE_OUTPUT); }

/* The stages' graphs of a 5-layer tiny llama (tied output): the first takes the tokens and gives
 * "hidden", a middle one takes and gives it, the last takes it and gives the logits (the tied
 * output's token_embd with it); each holds its layers' caches and weights alone. */
START_TEST(stage_graphs) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    hp.n_layer = 5, hp.tied_output = true;
    static const int range[3][2] = {{0, 2}, {2, 4}, {4, 5}};
    for (int s = 0; s < 3; s++) {
        kiln_ctx       *ctx = kiln_ctx_new();
        kiln_build_opts o = {.n_ctx = 32, .n_tokens_max = 8, .layer_first = range[s][0], .layer_end = range[s][1]};
        TS_OK(kiln_build_model(ctx, &hp, &o));
        kiln_graph *gr;
        TS_OK(kiln_graph_new(ctx, &gr));
        ck_assert_int_eq(has_node(gr, "inp_tokens", KILN_ROLE_INPUT), s == 0);
        ck_assert_int_eq(has_node(gr, "inp_hidden", KILN_ROLE_INPUT), s > 0);
        ck_assert_int_eq(has_node(gr, "inp_out_ids", KILN_ROLE_INPUT), s == 2);
        ck_assert_int_eq(has_node(gr, "token_embd.weight", KILN_ROLE_WEIGHT), s != 1);
        ck_assert_int_eq(has_output(gr, "hidden"), s < 2);
        ck_assert_int_eq(has_output(gr, "logits"), s == 2);
        for (int il = 0; il < 5; il++) {
            char k[32], w[32];
            snprintf(k, sizeof k, "cache_k_l%d", il);
            snprintf(w, sizeof w, "blk.%d.attn_q.weight", il);
            bool mine = il >= range[s][0] && il < range[s][1];
            ck_assert_msg(has_node(gr, k, KILN_ROLE_STATE) == mine, "stage %d: %s", s, k);
            ck_assert_msg(has_node(gr, w, KILN_ROLE_WEIGHT) == mine, "stage %d: %s", s, w);
        }
        kiln_graph_free(gr);
        kiln_ctx_free(ctx);
    }
}
END_TEST

/* Ranges outside the layers, a stage split over ranks too, and argmax before the last stage are
 * refused, naming them. */
START_TEST(stage_refusals) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    hp.n_layer = 4;
    static const kiln_build_opts bad[] = {{.layer_first = 2, .layer_end = 2}, {.layer_first = 3, .layer_end = 5},
                                          {.layer_first = -1, .layer_end = 2}, {.layer_end = 2, .tp_size = 2},
                                          {.layer_end = 2, .argmax = true}};
    static const char *const why[] = {"layers 2 .. 1 of 4", "layers 3 .. 4 of 4", "layers -1 .. 1 of 4",
                                      "split over 2 ranks too", "argmax and the sampler belong to the last"};
    for (int i = 0; i < 5; i++) {
        kiln_ctx *ctx = kiln_ctx_new();
        ts_expect_status(kiln_build_model(ctx, &hp, &bad[i]), KILN_ERR_INVALID, why[i]);
        kiln_ctx_free(ctx);
    }
    kiln_model *m;
    TS_OK(kiln_model_random(&hp, 3, &m));
    kiln_gen *g;
    ts_expect_status(kiln_gen_new(m, &(kiln_gen_opts){.cpu = true, .pp = 5}, &g), KILN_ERR_INVALID,
                     "5 stages of 4 layers");
    ts_expect_status(kiln_gen_new(m, &(kiln_gen_opts){.cpu = true, .pp = 2, .tp = 2}, &g), KILN_ERR_INVALID,
                     "one split or the other");
    ts_expect_status(kiln_gen_new(m, &(kiln_gen_opts){.cpu = true, .pp = 65}, &g), KILN_ERR_INVALID, "pp 65");
    kiln_model_close(m);
}
END_TEST

/* kiln_gen over stages against the whole model, every tiny arch (deepseek2's dense lead layer
 * and MLA cache, gemma's sliding layers, gpt-oss's sinks in their stages): the prompt's logits
 * bit for bit (a prompt longer than n_batch), 8 greedy tokens, then the context shift (each
 * layer's cache in its stage) and 4 more. Split in 2, and where the preset has them in 3. */
static const char *const archs[] = {"llama",  "qwen2",  "qwen3",   "qwen3moe",  "granite",  "smollm3",
                                    "phi3",   "gemma3", "gemma2",  "gpt-oss",   "deepseek2"};
#define NARCHS ((int)(sizeof archs / sizeof archs[0]))

static void gen_over(const kiln_model *m, int pp, const char *label) {
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    static const int32_t      prompt[6] = {1, 17, 300, 5, 99, 42};
    kiln_gen_opts             o1 = {.n_ctx = 32, .n_batch = 4, .cpu = true}, o2 = o1;
    o2.pp = pp;
    kiln_gen *g1, *g2;
    TS_OK(kiln_gen_new(m, &o1, &g1));
    TS_OK(kiln_gen_new(m, &o2, &g2));
    const float *l1, *l2;
    TS_OK(kiln_gen_eval(g1, prompt, 6, &l1));
    TS_OK(kiln_gen_eval(g2, prompt, 6, &l2));
    ck_assert_msg(!memcmp(l1, l2, sizeof *l1 * (size_t)hp->n_vocab), "%s over %d stages: the prompt's logits differ",
                  label, pp);
    kiln_gen_reset(g1), kiln_gen_reset(g2);
    int32_t t1[8], t2[8];
    TS_OK(kiln_gen_greedy(g1, prompt, 6, 8, t1, NULL));
    TS_OK(kiln_gen_greedy(g2, prompt, 6, 8, t2, NULL));
    for (int i = 0; i < 8; i++)
        ck_assert_msg(t1[i] == t2[i], "%s over %d stages: token %d is %d, the whole model's %d", label, pp, i, t2[i],
                      t1[i]);
    TS_OK(kiln_gen_shift(g1, 2, 5));
    TS_OK(kiln_gen_shift(g2, 2, 5));
    TS_OK(kiln_gen_decode_greedy(g1, t1[7], 4, t1));
    TS_OK(kiln_gen_decode_greedy(g2, t2[7], 4, t2));
    for (int i = 0; i < 4; i++)
        ck_assert_msg(t1[i] == t2[i], "%s over %d stages, after the shift: token %d is %d, the whole model's %d", label,
                      pp, i, t2[i], t1[i]);
    kiln_gen_free(g1), kiln_gen_free(g2);
}

START_TEST(gen_over_stages) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(archs[_i], "tiny", &hp));
    kiln_model *m;
    TS_OK(kiln_model_random(&hp, 7, &m));
    gen_over(m, 2, archs[_i]);
    if (hp.n_layer >= 3) gen_over(m, 3, archs[_i]);
    kiln_model_close(m);
    /* more layers than the preset's: uneven stages (2, 2, 1) and a layer a stage */
    if (_i == 0) {
        hp.n_layer = 5;
        TS_OK(kiln_model_random(&hp, 7, &m));
        gen_over(m, 3, "llama, 5 layers");
        gen_over(m, 5, "llama, 5 layers");
        kiln_model_close(m);
    }
}
END_TEST

/* A batch of sequences (kiln_batch, the server's) over 2 stages: each row's logits equal the
 * whole model's batch, bit for bit, a second sequence joining after the first's prompt. */
START_TEST(batch_over_stages) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("qwen3", "tiny", &hp));
    kiln_model *m;
    TS_OK(kiln_model_random(&hp, 9, &m));
    kiln_batch     *b[2];
    kiln_batch_opts o = {.n_ctx = 64, .n_batch = 8, .n_seq = 2, .cpu = true};
    TS_OK(kiln_batch_new(m, &o, &b[0]));
    o.pp = 2;
    TS_OK(kiln_batch_new(m, &o, &b[1]));
    int                  seq[2][2];
    static const int32_t p0[5] = {3, 1, 4, 1, 5}, p1[3] = {9, 2, 6};
    int32_t              next[2] = {7, 8};
    for (int k = 0; k < 2; k++) TS_OK(kiln_batch_seq_open(b[k], &seq[k][0]));
    const float *lg[2][2];
    for (int k = 0; k < 2; k++) TS_OK(kiln_batch_step(b[k], &(kiln_batch_item){seq[k][0], p0, 5}, 1, lg[k]));
    ck_assert(!memcmp(lg[0][0], lg[1][0], sizeof(float) * (size_t)hp.n_vocab));
    for (int k = 0; k < 2; k++) {
        TS_OK(kiln_batch_seq_open(b[k], &seq[k][1]));
        kiln_batch_item it[2] = {{seq[k][0], &next[0], 1}, {seq[k][1], p1, 3}};
        TS_OK(kiln_batch_step(b[k], it, 2, lg[k]));
    }
    for (int i = 0; i < 2; i++)
        ck_assert_msg(!memcmp(lg[0][i], lg[1][i], sizeof(float) * (size_t)hp.n_vocab), "row %d differs over 2 stages",
                      i);
    kiln_batch_free(b[0]), kiln_batch_free(b[1]);
    kiln_model_close(m);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("pp", TS_CASE("graphs", 60), TS_TESTS(stage_graphs, stage_refusals),
                        TS_CASE("gen", 300), TS_LOOP(0, NARCHS, gen_over_stages), TS_TESTS(batch_over_stages));
    return ts_main(s);
}
