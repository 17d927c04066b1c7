/* GPU tests of tensor parallelism's NCCL step (issue 30; runtime/group.c, templates/
 * collective.lua): programs whose all_reduce steps run in a kiln_group, one GPU a rank.
 * - A Megatron-split MLP over 2 ranks (and 4 where the machine has them): every rank's output is
 *   the same bits, and equals the whole MLP's CPU reference by NMSE; the group replays its
 *   CUDA graphs (NCCL captured with the kernels) 200 times without a second capture.
 * - The tiny llama, qwen3moe, gpt-oss and deepseek2 over 2 ranks: each rank's logits equal the CPU reference of the
 *   same group (kiln_reference_group) and the whole model's rows of its vocabulary shard.
 * - kiln_gen with tp = 2 (kiln run --tp 2) against one GPU: 32 greedy tokens; and with pp = 2
 *   (kiln run --pp 2: the layers in 2 stages, a GPU each; model/gen_pp.c, no NCCL).
 * - More ranks than GPUs: refused, naming both counts (on any machine: on one GPU, a group of 2).
 * On a machine with one GPU the group cases cannot run: each says so on stdout and checks the
 * refusal instead. */
#include "tests/support.h"

#include "runtime/runtime.h"
#include "tests/gpu/gpu_support.h"
#include "tests/tp_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K = 256, F = 512, N = 8, REPLAYS = 200 };

/* The GPUs of this machine. */
static int gpu_count(void) {
    need_gpu();
    int n = 0;
    ck_assert_int_eq(rt_cuda()->DeviceGetCount(&n), RT_CUDA_SUCCESS);
    return n;
}

static char *mlp_kg(int f, int ranks) { return ts_tp_mlp_kg(K, f, N, ranks); }

static float *rnd(int64_t n, uint64_t seed, float scale) {
    float *v = malloc((size_t)n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v[i] = scale * (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5);
    }
    return v;
}

typedef struct {
    const float *w1, *w2, *x;
    float       *y;
} mlp_data;

static const void *mlp_get(void *user, const char *name, kiln_type type, int64_t n) {
    const mlp_data *d = user;
    (void)type, (void)n;
    return !strcmp(name, "w1") ? d->w1 : !strcmp(name, "w2") ? d->w2 : !strcmp(name, "x") ? d->x : NULL;
}

static void mlp_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    mlp_data *d = user;
    if (!strcmp(name, "y") && (d->y = malloc((size_t)n * sizeof(float)))) memcpy(d->y, data, (size_t)n * sizeof(float));
}

/* A group of `ranks` MLP programs (one program: the ranks differ in their weights' data). */
static kiln_status mlp_group(int ranks, kiln_program **p, kiln_graph **g, kiln_ctx **ctx, kiln_group **grp) {
    char *kg = mlp_kg(F / ranks, ranks);
    *g = ts_build(kg, ctx);
    free(kg);
    *p = compile(*g, 0);
    const kiln_program *ps[8];
    for (int r = 0; r < ranks; r++) ps[r] = *p;
    return kiln_group_new(ps, ranks, NULL, grp);
}

static void mlp_over(int ranks) {
    const int f = F / ranks;
    float    *w1 = rnd((int64_t)K * F, 1, 0.2f), *w2 = rnd((int64_t)F * K, 2, 0.2f), *x = rnd((int64_t)K * N, 3, 1.0f);
    mlp_data  whole = {w1, w2, x, NULL};
    char     *kg = mlp_kg(F, 1);
    kiln_ctx *wctx;
    kiln_graph *wg = ts_build(kg, &wctx);
    free(kg);
    TS_OK(kiln_reference(wg, mlp_get, mlp_put, &whole));
    double tol = kiln_graph_nmse_tol(wg);
    ts_graph_free(wg, wctx);

    kiln_program *p;
    kiln_graph   *g;
    kiln_ctx     *ctx;
    kiln_group   *grp;
    TS_OK(mlp_group(ranks, &p, &g, &ctx, &grp));
    float *w1s = malloc((size_t)K * f * sizeof(float)), *w2s = malloc((size_t)f * K * sizeof(float));
    ck_assert(w1s && w2s);
    for (int r = 0; r < ranks; r++) {
        kiln_session *s = kiln_group_session(grp, r);
        memcpy(w1s, w1 + (size_t)r * f * K, (size_t)K * f * sizeof(float)); /* rows r*f .. */
        for (int row = 0; row < K; row++)                                  /* each row's r-th part */
            memcpy(w2s + (size_t)row * f, w2 + (size_t)row * F + (size_t)r * f, (size_t)f * sizeof(float));
        TS_OK(kiln_session_set(s, "w1", w1s, (size_t)K * f * sizeof(float)));
        TS_OK(kiln_session_set(s, "w2", w2s, (size_t)f * K * sizeof(float)));
        TS_OK(kiln_session_set(s, "x", x, (size_t)K * N * sizeof(float)));
    }
    free(w1s), free(w2s);
    float *y[8];
    for (int run = 0; run < REPLAYS; run++) TS_OK(kiln_group_run(grp));
    for (int r = 0; r < ranks; r++) {
        kiln_session *s = kiln_group_session(grp, r);
        ck_assert_ptr_nonnull(y[r] = malloc((size_t)K * N * sizeof(float)));
        TS_OK(kiln_session_get(s, "y", y[r], (size_t)K * N * sizeof(float)));
        kiln_session_stats st;
        kiln_session_get_stats(s, &st);
        /* The first run plain (NCCL connects outside a capture), then one capture replayed. */
        ck_assert_msg(st.runs == REPLAYS && st.plain_runs == 1 && st.captures == 1 && st.replays == REPLAYS - 1,
                      "%d ranks, rank %d: %lld runs, %lld plain, %lld captures, %lld replays (want %d, 1, 1, %d)",
                      ranks, r, (long long)st.runs, (long long)st.plain_runs, (long long)st.captures,
                      (long long)st.replays, REPLAYS, REPLAYS - 1);
        ck_assert_msg(!memcmp(y[r], y[0], (size_t)K * N * sizeof(float)), "%d ranks: rank %d's y differs from rank 0's",
                      ranks, r);
    }
    double e = nmse(y[0], whole.y, KILN_F32, (int64_t)K * N, NULL, NULL);
    printf("mlp over %d GPUs: NMSE %.3g against the whole MLP's reference (tolerance %.3g), %d replays\n", ranks, e,
           tol, REPLAYS);
    ck_assert_msg(e <= tol, "%d ranks: NMSE %g > %g", ranks, e, tol);
    for (int r = 0; r < ranks; r++) free(y[r]);
    kiln_group_free(grp);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
    free(whole.y), free(w1), free(w2), free(x);
}

START_TEST(mlp_split_over_gpus) {
    int n = gpu_count();
    if (n < 2) {
        printf("mlp_split_over_gpus: this machine has %d GPU: the group cannot run (refusal checked)\n", n);
        kiln_program *p;
        kiln_graph   *g;
        kiln_ctx     *ctx;
        kiln_group   *grp = NULL;
        ts_expect_status(mlp_group(2, &p, &g, &ctx, &grp), KILN_ERR_NO_GPU, "2 ranks need 2 GPUs; this machine has 1");
        kiln_program_free(p);
        ts_graph_free(g, ctx);
        return;
    }
    mlp_over(2);
    if (n >= 4) mlp_over(4);
}
END_TEST

/* More ranks than GPUs: refused before any session is made. */
START_TEST(more_ranks_than_gpus) {
    int n = gpu_count(), ranks = n + 1 < 2 ? 2 : n + 1;
    if (ranks > 8) return; /* (mlp_group's table; no such machine here) */
    kiln_program *p;
    kiln_graph   *g;
    kiln_ctx     *ctx;
    kiln_group   *grp = NULL;
    char          want[96];
    snprintf(want, sizeof want, "%d ranks need %d GPUs; this machine has %d", ranks, ranks, n);
    ts_expect_status(mlp_group(ranks, &p, &g, &ctx, &grp), KILN_ERR_NO_GPU, want);
    ck_assert_ptr_null(grp);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* Every input and weight of graph g into session s from get (as the CPU reference reads them). */
static void upload(kiln_session *s, const kiln_graph *g, kiln_ref_get_fn get, void *user) {
    for (int i = 0; i < kiln_graph_size(g); i++) {
        const kiln_tensor *t = kiln_graph_node(g, i);
        kiln_role          role = kiln_tensor_role(t);
        if (role != KILN_ROLE_INPUT && role != KILN_ROLE_WEIGHT) continue;
        const void *data = get(user, kiln_tensor_name(t), kiln_tensor_type(t), kiln_tensor_nelements(t));
        ck_assert_msg(data != NULL, "no data for %s", kiln_tensor_name(t));
        TS_OK(kiln_session_set(s, kiln_tensor_name(t), data, kiln_tensor_nbytes(t)));
    }
}

/* The tiny models split over 2 GPUs: a dense one, three with routed experts (gpt-oss: sinks,
 * biases; deepseek2: latent attention, shared experts). */
static const char *const MODELS[][2] = {{"llama", "tiny"}, {"qwen3moe", "tiny"}, {"gpt-oss", "tiny"}, {"deepseek2", "tiny"}};

/* Each rank's logits against the CPU reference of the same group, and against the whole
 * model's rows of the rank's vocabulary. */
START_TEST(tiny_model_over_2_gpus) {
    const char *arch = MODELS[_i][0];
    int         n = gpu_count();
    if (n < 2) {
        printf("tiny %s over 2 GPUs: this machine has %d GPU: not run\n", arch, n);
        return;
    }
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, MODELS[_i][1], &hp));
    hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    kiln_model *m = NULL;
    TS_OK(kiln_model_random(&hp, 11, &m));
    const kiln_model_hparams *mh = kiln_model_get_hparams(m);
    ts_tp_data                whole, d[2], cpu[2];
    ts_tp_init(&whole, m, 1, 0);
    kiln_ctx   *wc, *wb, *cs[2], *bs[2];
    kiln_graph *wg = ts_tp_graph(m, 1, 0, &wc, &wb), *gs[2];
    TS_OK(kiln_reference(wg, ts_tp_get, ts_tp_put, &whole));
    void               *users[2];
    const kiln_program *ps[2];
    kiln_program       *own[2];
    for (int r = 0; r < 2; r++) {
        ts_tp_init(&d[r], m, 2, r);
        ts_tp_init(&cpu[r], m, 2, r);
        gs[r] = ts_tp_graph(m, 2, r, &cs[r], &bs[r]);
        users[r] = &cpu[r];
        ps[r] = own[r] = compile(gs[r], 0);
    }
    TS_OK(kiln_reference_group((const kiln_graph *const *)gs, 2, ts_tp_get, ts_tp_put, users));
    kiln_group *grp;
    TS_OK(kiln_group_new(ps, 2, NULL, &grp));
    for (int r = 0; r < 2; r++) upload(kiln_group_session(grp, r), gs[r], ts_tp_get, &d[r]);
    TS_OK(kiln_group_run(grp));
    const int64_t vs = mh->n_vocab / 2, nl = vs * TS_TP_T;
    for (int r = 0; r < 2; r++) {
        float *lg = malloc((size_t)nl * sizeof *lg);
        ck_assert_ptr_nonnull(lg);
        TS_OK(kiln_session_get(kiln_group_session(grp, r), "logits", lg, (size_t)nl * sizeof *lg));
        ck_assert_int_eq(cpu[r].nlogits, nl);
        double e = nmse(lg, cpu[r].logits, KILN_F32, nl, NULL, NULL);
        /* the whole model's rows of this rank's shard */
        float *rows = malloc((size_t)nl * sizeof *rows);
        ck_assert_ptr_nonnull(rows);
        for (int t = 0; t < TS_TP_T; t++)
            memcpy(rows + t * vs, whole.logits + t * mh->n_vocab + r * vs, (size_t)vs * sizeof *rows);
        double ew = nmse(lg, rows, KILN_F32, nl, NULL, NULL);
        printf("tiny %s over 2 GPUs, rank %d: logits NMSE %.3g against the group's reference, %.3g against the whole "
               "model's\n", arch, r, e, ew);
        ck_assert_msg(e <= 5e-4 && ew <= 5e-4, "%s, rank %d: logits NMSE %g (group reference), %g (whole model)", arch, r, e,
                      ew);
        free(lg), free(rows);
    }
    kiln_group_free(grp);
    for (int r = 0; r < 2; r++) {
        kiln_program_free(own[r]);
        kiln_graph_free(gs[r]), kiln_ctx_free(bs[r]), kiln_ctx_free(cs[r]);
        ts_tp_free(&d[r]), ts_tp_free(&cpu[r]);
    }
    kiln_graph_free(wg), kiln_ctx_free(wb), kiln_ctx_free(wc);
    ts_tp_free(&whole);
    kiln_model_close(m);
}
END_TEST

/* kiln_gen over 2 GPUs (kiln_gen_opts.tp, model/gen_tp.c: each GPU reads its part of the file;
 * or pp, model/gen_pp.c: each GPU its layers) against one GPU: the prompt's logits by NMSE, then
 * 32 greedy tokens identical, or the first that differs a near tie in the one GPU's logits (both
 * picks within 1e-3 of the largest logit). */
enum { GEN_STEPS = 32 };

static void gen_over_2_gpus(int i, bool pipeline) {
    const char *arch = MODELS[i][0];
    int         n = gpu_count();
    if (n < 2) {
        printf("kiln_gen of tiny %s over 2 GPUs: this machine has %d GPU: not run\n", arch, n);
        return;
    }
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, MODELS[i][1], &hp));
    char *dir = ts_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    TS_OK(kiln_model_write_random(&hp, 23, path, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    static const int32_t prompt[7] = {1, 17, 300, 5, 999, 42, 8};
    kiln_gen_opts        o1 = {.n_ctx = 64, .n_batch = 8}, o2 = {.n_ctx = 64, .n_batch = 8};
    if (pipeline) o2.pp = 2;
    else o2.tp = 2;
    kiln_gen            *g1, *g2;
    TS_OK(kiln_gen_new(m, &o1, &g1));
    TS_OK(kiln_gen_new(m, &o2, &g2));
    const float *l1, *l2;
    TS_OK(kiln_gen_eval(g1, prompt, 7, &l1));
    TS_OK(kiln_gen_eval(g2, prompt, 7, &l2));
    double e = nmse(l2, l1, KILN_F32, hp.n_vocab, NULL, NULL);
    ck_assert_msg(e <= 5e-4, "%s: prompt logits NMSE %g over 2 GPUs against one", arch, e);
    kiln_gen_reset(g1), kiln_gen_reset(g2);
    int32_t t1[GEN_STEPS], t2[GEN_STEPS];
    TS_OK(kiln_gen_greedy(g1, prompt, 7, GEN_STEPS, t1, NULL));
    TS_OK(kiln_gen_greedy(g2, prompt, 7, GEN_STEPS, t2, NULL));
    int same = 0;
    while (same < GEN_STEPS && t1[same] == t2[same]) same++;
    if (same < GEN_STEPS) { /* the one GPU's logits where the picks part */
        int32_t seq[7 + GEN_STEPS];
        memcpy(seq, prompt, sizeof prompt);
        memcpy(seq + 7, t1, sizeof *t1 * (size_t)same);
        kiln_gen_reset(g1);
        const float *l;
        TS_OK(kiln_gen_eval(g1, seq, 7 + same, &l));
        float top = 0;
        for (int64_t v = 0; v < hp.n_vocab; v++) top = fmaxf(top, fabsf(l[v]));
        float gap = fabsf(l[t1[same]] - l[t2[same]]);
        ck_assert_msg(gap <= 1e-3f * top, "%s: step %d: one GPU picks %d, two pick %d; logits %g and %g (largest %g)",
                      arch, same, t1[same], t2[same], l[t1[same]], l[t2[same]], top);
    }
    printf("kiln_gen of tiny %s over 2 GPUs (%s): prompt logits NMSE %.3g, %d of %d greedy tokens identical to one "
           "GPU's%s\n", arch, pipeline ? "2 stages" : "tp 2", e, same, GEN_STEPS, same < GEN_STEPS ? " (then a near tie)" : "");
    kiln_gen_free(g1), kiln_gen_free(g2);
    kiln_model_close(m);
    ts_tmpdir_free(dir);
}

START_TEST(gen_tokens_over_2_gpus) { gen_over_2_gpus(_i, false); }
END_TEST

/* The same with the layers in 2 stages (kiln_gen_opts.pp): the stages' arithmetic is one GPU's,
 * so the logits agree as closely as two runs of one GPU. */
START_TEST(gen_tokens_over_2_stages) { gen_over_2_gpus(_i, true); }
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_collective", TS_CASE("group", 300),
                        TS_TESTS(mlp_split_over_gpus, more_ranks_than_gpus),
                        TS_LOOP(0, (int)(sizeof MODELS / sizeof MODELS[0]), tiny_model_over_2_gpus, gen_tokens_over_2_gpus,
                                gen_tokens_over_2_stages));
    return ts_main(s);
}
