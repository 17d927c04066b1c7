/* kiln_batch (model/batch.c) on the CPU reference: sequences evaluated together in one program
 * and one shared cache give the logits and the greedy tokens each gives alone (kiln_gen), for
 * tiny models of several archs (experts, sliding windows and sinks, MLA); prefill chunks of new
 * sequences mix with decode steps of running ones; a closed sequence's cells serve a new one;
 * bad steps are refused and change nothing; and the same batch over 2 tensor-parallel ranks. */
#include "tests/support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_dir;

static const char *const archs[] = {"llama", "qwen3moe", "gemma3", "gpt-oss", "deepseek2"};
#define NARCHS ((int)(sizeof archs / sizeof archs[0]))

static kiln_model *tiny(const char *arch) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, "tiny", &hp));
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, arch);
    TS_OK(kiln_model_write_random(&hp, 9, path, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    return m;
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

#define NS 4
#define STEPS 8

/* Sequence s's prompt: 3 + 2s tokens. */
static int64_t prompt(int s, int32_t *out) {
    int64_t n = 3 + 2 * s;
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)((37 * (s + 1) + 11 * i) % 1000 + 1);
    return n;
}

/* What sequence s gives alone: its prompt's logits and STEPS greedy tokens. */
static void alone(const kiln_model *m, int s, float *logits, int32_t *toks) {
    kiln_gen_opts o = {.n_ctx = 64, .cpu = true};
    kiln_gen     *g;
    TS_OK(kiln_gen_new(m, &o, &g));
    int32_t      p[16];
    int64_t      n = prompt(s, p);
    const float *lg;
    TS_OK(kiln_gen_eval(g, p, n, &lg));
    int64_t nv = kiln_model_get_hparams(m)->n_vocab;
    memcpy(logits, lg, sizeof *logits * (size_t)nv);
    int32_t t = (int32_t)kiln_argmax_f32(lg, nv);
    for (int i = 0; i < STEPS; i++) {
        toks[i] = t;
        TS_OK(kiln_gen_eval(g, &t, 1, &lg));
        t = (int32_t)kiln_argmax_f32(lg, nv);
    }
    kiln_gen_free(g);
}

/* The batch of arch ai's tiny model, over tp ranks (0: one; model/gen_tp.c: the ranks' graphs
 * evaluated together, the rows' logits gathered), against each sequence alone on one. */
static void together_equals_alone_over(int ai, int tp) {
    const char *arch = archs[ai];
    kiln_model *m = tiny(arch);
    int64_t     nv = kiln_model_get_hparams(m)->n_vocab;
    float      *want = malloc(sizeof *want * (size_t)(nv * (NS + 1)));
    int32_t     want_t[NS + 1][STEPS], got_t[NS + 1][STEPS];
    for (int s = 0; s <= NS; s++) alone(m, s, want + s * nv, want_t[s]);
    kiln_batch_opts o = {.n_ctx = 96, .n_batch = 32, .n_seq = NS, .cpu = true, .tp = tp};
    /* (split, each product's partial sums add in another order: a little more rounding) */
    const double tol = tp > 1 ? 1e-3 : 1e-4;
    kiln_batch     *b;
    TS_OK(kiln_batch_new(m, &o, &b));
    int             seq[NS + 1];
    int32_t         p[NS + 1][16], next[NS + 1];
    kiln_batch_item it[NS];
    const float    *lg[NS];
    /* the prompts of sequences 0..3 in one step */
    for (int s = 0; s < NS; s++) {
        TS_OK(kiln_batch_seq_open(b, &seq[s]));
        it[s] = (kiln_batch_item){seq[s], p[s], prompt(s, p[s])};
    }
    TS_OK(kiln_batch_step(b, it, NS, lg));
    for (int s = 0; s < NS; s++) {
        double d = max_diff(lg[s], want + s * nv, nv);
        ck_assert_msg(d < tol, "%s: sequence %d's prompt logits differ by %g", arch, s, d);
        next[s] = (int32_t)kiln_argmax_f32(lg[s], nv);
    }
    /* decode steps of all four; after step 2 sequence 1 closes and sequence 4 (its cells) opens:
     * its prompt is a prefill chunk in the same steps as the others' decode tokens */
    int live[NS] = {0, 1, 2, 3}, step_of[NS + 1] = {0};
    for (int k = 0; k < STEPS + 3; k++) {
        if (k == 2) {
            kiln_batch_seq_close(b, seq[1]);
            TS_OK(kiln_batch_seq_open(b, &seq[4]));
            live[1] = 4;
        }
        int n = 0, who[NS];
        for (int i = 0; i < NS; i++) {
            int s = live[i];
            if (step_of[s] >= STEPS) continue;
            bool first = s == 4 && step_of[4] == 0 && kiln_batch_seq_pos(b, seq[4]) == 0;
            it[n] = first ? (kiln_batch_item){seq[4], p[4], prompt(4, p[4])} : (kiln_batch_item){seq[s], &next[s], 1};
            who[n++] = s;
        }
        if (!n) break;
        TS_OK(kiln_batch_step(b, it, n, lg));
        for (int i = 0; i < n; i++) {
            int s = who[i];
            if (s == 4 && kiln_batch_seq_pos(b, seq[4]) == prompt(4, p[4])) { /* its prompt's logits */
                double d = max_diff(lg[i], want + 4 * nv, nv);
                ck_assert_msg(d < tol, "%s: the late sequence's prompt logits differ by %g", arch, d);
                next[4] = (int32_t)kiln_argmax_f32(lg[i], nv);
                continue;
            }
            got_t[s][step_of[s]++] = next[s];
            next[s] = (int32_t)kiln_argmax_f32(lg[i], nv);
        }
    }
    for (int s = 0; s <= NS; s++) {
        if (s == 1) { /* closed after 2 steps */
            ck_assert_int_eq(step_of[1], 2);
            ck_assert(!memcmp(got_t[1], want_t[1], sizeof(int32_t) * 2));
            continue;
        }
        ck_assert_int_eq(step_of[s], STEPS);
        for (int i = 0; i < STEPS; i++)
            ck_assert_msg(got_t[s][i] == want_t[s][i], "%s: sequence %d, token %d: together %d, alone %d", arch, s,
                          i, got_t[s][i], want_t[s][i]);
    }
    kiln_gen_stats gs;
    kiln_batch_get_stats(b, &gs);
    ck_assert_int_gt(gs.decode_tokens, NS * STEPS);
    kiln_batch_free(b);
    kiln_model_close(m);
    free(want);
}

START_TEST(together_equals_alone) { together_equals_alone_over(_i, 0); }
END_TEST

START_TEST(bad_steps_change_nothing) {
    kiln_model     *m = tiny("llama");
    kiln_batch_opts o = {.n_ctx = 16, .n_batch = 8, .n_seq = 2, .cpu = true};
    kiln_batch     *b;
    TS_OK(kiln_batch_new(m, &o, &b));
    int a, c, d;
    TS_OK(kiln_batch_seq_open(b, &a));
    TS_OK(kiln_batch_seq_open(b, &c));
    ts_expect_status(kiln_batch_seq_open(b, &d), KILN_ERR_INVALID, "all 2 sequences are open");
    int32_t         t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, bad = 5000;
    const float    *lg[2];
    kiln_batch_item two[2] = {{a, t, 2}, {a, t, 1}};
    ts_expect_status(kiln_batch_step(b, two, 2, lg), KILN_ERR_INVALID, "items 0 and 1 are both sequence");
    kiln_batch_item big[2] = {{a, t, 5}, {c, t, 5}};
    ts_expect_status(kiln_batch_step(b, big, 2, lg), KILN_ERR_INVALID, "10 tokens; a step takes 8 at most");
    kiln_batch_item nine = {a, t, 9};
    ts_expect_status(kiln_batch_step(b, &nine, 1, lg), KILN_ERR_INVALID,
                     "sequence 0 holds 0 tokens; 9 more pass its 8 cells (n_ctx / n_seq)");
    kiln_batch_item badt = {c, &bad, 1};
    ts_expect_status(kiln_batch_step(b, &badt, 1, lg), KILN_ERR_INVALID, "token 0 is 5000, outside the vocabulary");
    kiln_batch_item closed = {7, t, 1};
    ts_expect_status(kiln_batch_step(b, &closed, 1, lg), KILN_ERR_INVALID, "sequence 7 is not open");
    ck_assert_int_eq(kiln_batch_seq_pos(b, a), 0);
    ck_assert_int_eq(kiln_batch_free_cells(b), 16);
    ck_assert_int_eq(kiln_batch_seq_cells(b), 8);
    kiln_batch_item fill[2] = {{a, t, 8}, {c, t, 0}};
    TS_OK(kiln_batch_step(b, fill, 1, lg));
    fill[0] = (kiln_batch_item){c, t, 8};
    TS_OK(kiln_batch_step(b, fill, 1, lg));
    ck_assert_int_eq(kiln_batch_free_cells(b), 0);
    kiln_batch_item more = {a, t, 1};
    ts_expect_status(kiln_batch_step(b, &more, 1, lg), KILN_ERR_INVALID, "sequence 0 holds 8 tokens; 1 more pass its 8 cells");
    kiln_batch_seq_close(b, c);
    ck_assert_int_eq(kiln_batch_free_cells(b), 8);
    /* c's cells go to the next sequence opened (with c's id), not to a */
    ts_expect_status(kiln_batch_step(b, &more, 1, lg), KILN_ERR_INVALID, "sequence 0 holds 8 tokens");
    TS_OK(kiln_batch_seq_open(b, &d));
    ck_assert_int_eq(d, c);
    more.seq = d;
    TS_OK(kiln_batch_step(b, &more, 1, lg));
    ck_assert_int_eq(kiln_batch_seq_pos(b, d), 1);
    ck_assert_int_eq(kiln_batch_seq_pos(b, a), 8);
    kiln_batch_free(b);
    kiln_batch_opts few = {.n_ctx = 3, .n_seq = 4, .cpu = true};
    ts_expect_status(kiln_batch_new(m, &few, &b), KILN_ERR_INVALID, "n_ctx 3 cells for 4 sequences: each needs one");
    kiln_batch_free(b);
    kiln_model_close(m);
}
END_TEST

/* kiln_batch_step_greedy: the argmax of kiln_batch_step's rows, and the batch goes on alike. */
START_TEST(greedy_steps_pick_the_argmax) {
    kiln_model     *m = tiny("qwen3moe");
    int64_t         nv = kiln_model_get_hparams(m)->n_vocab;
    kiln_batch_opts o = {.n_ctx = 64, .n_batch = 16, .n_seq = 3, .cpu = true};
    kiln_batch     *a, *g;
    TS_OK(kiln_batch_new(m, &o, &a));
    TS_OK(kiln_batch_new(m, &o, &g));
    int32_t p[3][16], next[3];
    int     sa[3], sg[3];
    for (int s = 0; s < 3; s++) {
        TS_OK(kiln_batch_seq_open(a, &sa[s]));
        TS_OK(kiln_batch_seq_open(g, &sg[s]));
    }
    for (int step = 0; step < 6; step++) {
        kiln_batch_item ia[3], ig[3];
        for (int s = 0; s < 3; s++) {
            int64_t n = step ? 1 : prompt(s, p[s]);
            ia[s] = (kiln_batch_item){sa[s], step ? &next[s] : p[s], n};
            ig[s] = (kiln_batch_item){sg[s], step ? &next[s] : p[s], n};
        }
        const float *lg[3];
        int32_t      pk[3];
        TS_OK(kiln_batch_step(a, ia, 3, lg));
        TS_OK(kiln_batch_step_greedy(g, ig, 3, pk));
        for (int s = 0; s < 3; s++) {
            ck_assert_int_eq(pk[s], (int32_t)kiln_argmax_f32(lg[s], nv));
            next[s] = pk[s];
        }
    }
    ts_expect_status(kiln_batch_step_greedy(g, NULL, 1, NULL), KILN_ERR_INVALID, "NULL picks");
    kiln_batch_free(a);
    kiln_batch_free(g);
    kiln_model_close(m);
}
END_TEST

/* The program a batch runs on the GPU (every row's logits and argmax) generates and compiles
 * with NVRTC for sm_90a (no GPU needed), for each arch above. */
START_TEST(gpu_program_compiles) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(archs[_i], "tiny", &hp));
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_build_opts bo = {.n_ctx = 64, .n_tokens_max = 16, .outputs = KILN_OUTPUTS_ALL, .argmax = true};
    TS_OK(kiln_build_model(ctx, &hp, &bo));
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    char cache[512];
    snprintf(cache, sizeof cache, "%s/cache-%s", g_dir, archs[_i]);
    kiln_compile_opts co = {.arch = "sm_90a", .cache_dir = cache};
    kiln_program     *p;
    TS_OK(kiln_compile(g, &co, &p));
    ck_assert_int_gt(kiln_program_kernel_count(p), 0);
    ts_compiled_free(p, g, ctx);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

/* The batch over 2 ranks (kiln_batch_opts.tp, kiln serve --tp): a dense model and one with
 * experts. */
START_TEST(split_over_2_ranks) {
    together_equals_alone_over(0, 2); /* llama */
    together_equals_alone_over(1, 2); /* qwen3moe */
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("batch", TS_CASE_FIXTURE("batch", 120, setup, teardown),
                        TS_LOOP(0, NARCHS, together_equals_alone, gpu_program_compiles),
                        TS_TESTS(bad_steps_change_nothing, greedy_steps_pick_the_argmax, split_over_2_ranks));
    return ts_main_isolated(s, "batch");
}
