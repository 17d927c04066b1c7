/* all_reduce and the CPU reference of a tensor-parallel group (ir/ref_collective.c; issue 30):
 * a Megatron-split MLP (column-parallel up, row-parallel down, the partial sums all-reduced)
 * evaluated over 2 and 4 ranks gives every rank the same values, equal to the unsplit graph's
 * within rounding; the op's refusals; errors instead of a hang when the ranks do not meet;
 * codegen's NCCL step (kiln_group runs it: tests/gpu/test_gpu_collective.c) and kiln_group_new's
 * argument checks; and whole models: the graph of each rank of 2 and
 * 4 (kiln_build_opts.tp_size) with its slices of a random model's weights (km_tp_slice), the
 * group evaluated together, gives the whole model's logits. No GPU needed. */
#include "tests/support.h"

#include "model/arch.h"
#include "tests/tp_support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K = 64, F = 96, N = 3 };

/* One rank's host buffers: weights and input by name, the output caught by put. */
typedef struct {
    const float *w1, *w2, *x;
    float       *y;
    int64_t      ny;
} rank_data;

static const void *rd_get(void *user, const char *name, kiln_type type, int64_t n) {
    rank_data *d = user;
    (void)n;
    if (type != KILN_F32) return NULL;
    if (!strcmp(name, "w1")) return d->w1;
    if (!strcmp(name, "w2")) return d->w2;
    if (!strcmp(name, "x")) return d->x;
    return NULL;
}

static void rd_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    rank_data *d = user;
    if (strcmp(name, "y") || type != KILN_F32 || d->y) return;
    d->y = malloc((size_t)n * sizeof *d->y);
    if (d->y) memcpy(d->y, data, (size_t)n * sizeof *d->y), d->ny = n;
}

/* The MLP y = w2 · silu(w1 · x) + x, its FFN width f (F / ranks on a rank); with ranks > 1 the
 * down product's partial sums are all-reduced before the residual add. */
static char *mlp_kg(int f, int ranks) { return ts_tp_mlp_kg(K, f, N, ranks); }

static float *rnd(int64_t n, uint64_t seed) {
    float *v = malloc((size_t)n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v[i] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5);
    }
    return v;
}

/* Evaluates the group of `ranks` MLP shards (rank r: w1's rows r*f.., w2's columns r*f..) and
 * the whole graph; every rank's y must be the same bits, and near the whole y. */
static void split_equals_whole(int ranks) {
    const int f = F / ranks;
    float    *w1 = rnd((int64_t)K * F, 1), *w2 = rnd((int64_t)F * K, 2), *x = rnd((int64_t)K * N, 3);
    /* the whole graph */
    rank_data whole = {w1, w2, x, NULL, 0};
    char     *kg = mlp_kg(F, 1);
    kiln_ctx *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    TS_OK(kiln_reference(g, rd_get, rd_put, &whole));
    ts_graph_free(g, ctx);
    free(kg);
    ck_assert_int_eq(whole.ny, K * N);
    /* the shards */
    rank_data   d[4] = {{0}};
    kiln_ctx   *cs[4];
    kiln_graph *gs[4];
    void       *users[4];
    float      *w1s[4], *w2s[4];
    kg = mlp_kg(f, ranks);
    for (int r = 0; r < ranks; r++) {
        w1s[r] = malloc((size_t)K * f * sizeof(float));
        w2s[r] = malloc((size_t)f * K * sizeof(float));
        ck_assert(w1s[r] && w2s[r]);
        memcpy(w1s[r], w1 + (size_t)r * f * K, (size_t)K * f * sizeof(float)); /* rows r*f .. */
        for (int row = 0; row < K; row++)                                      /* each row's r-th part */
            memcpy(w2s[r] + (size_t)row * f, w2 + (size_t)row * F + (size_t)r * f, (size_t)f * sizeof(float));
        d[r] = (rank_data){w1s[r], w2s[r], x, NULL, 0};
        users[r] = &d[r];
        gs[r] = ts_build(kg, &cs[r]);
    }
    TS_OK(kiln_reference_group((const kiln_graph *const *)gs, ranks, rd_get, rd_put, users));
    double maxd = 0, maxy = 0;
    for (int r = 0; r < ranks; r++) {
        ck_assert_int_eq(d[r].ny, K * N);
        ck_assert_msg(!memcmp(d[r].y, d[0].y, (size_t)K * N * sizeof(float)), "rank %d's sums differ from rank 0's", r);
    }
    for (int i = 0; i < K * N; i++) {
        maxd = fmax(maxd, fabs((double)d[0].y[i] - whole.y[i]));
        maxy = fmax(maxy, fabs((double)whole.y[i]));
    }
    ck_assert_msg(maxd <= 1e-5 * maxy, "%d ranks: max |split - whole| %g (max |y| %g)", ranks, maxd, maxy);
    /* and not trivially: the residual alone differs from y */
    double off = 0;
    for (int i = 0; i < K * N; i++) off = fmax(off, fabs((double)whole.y[i] - x[i]));
    ck_assert(off > 1e-3);
    for (int r = 0; r < ranks; r++) {
        ts_graph_free(gs[r], cs[r]);
        free(d[r].y), free(w1s[r]), free(w2s[r]);
    }
    free(kg), free(whole.y), free(w1), free(w2), free(x);
}

START_TEST(mlp_over_2_and_4_ranks) {
    split_equals_whole(2);
    split_equals_whole(4);
}
END_TEST

/* The group's failures are errors, never a hang: a graph evaluated alone, a group of the wrong
 * size, a rank without the all_reduce, a rank missing its data (the cause is reported). */
START_TEST(group_errors) {
    float      *w1 = rnd((int64_t)K * F, 4), *w2 = rnd((int64_t)F * K, 5), *x = rnd((int64_t)K * N, 6);
    rank_data   d[3] = {{w1, w2, x, NULL, 0}, {w1, w2, x, NULL, 0}, {w1, w2, x, NULL, 0}};
    void       *users[3] = {&d[0], &d[1], &d[2]};
    char       *kg2 = mlp_kg(F / 2, 2), *kg1 = mlp_kg(F / 2, 1);
    kiln_ctx   *c[3];
    kiln_graph *g[3];
    for (int r = 0; r < 3; r++) g[r] = ts_build(kg2, &c[r]);
    /* alone */
    kiln_status st = kiln_reference(g[0], rd_get, rd_put, &d[0]);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "kiln_reference_group"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    /* three graphs, each reducing over 2 */
    st = kiln_reference_group((const kiln_graph *const *)g, 3, rd_get, rd_put, users);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "in a group of 3"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    /* rank 1 has no all_reduce: rank 0 must not wait forever */
    kiln_ctx   *c1;
    kiln_graph *plain = ts_build(kg1, &c1);
    const kiln_graph *mixed[2] = {g[0], plain};
    st = kiln_reference_group(mixed, 2, rd_get, rd_put, users);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "rank 0") && strstr(kiln_status_msg(st), "ended"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    /* rank 1 lacks its weights: that error is the one reported, not rank 0's wait */
    rank_data nodata = {NULL, NULL, NULL, NULL, 0};
    void     *users2[2] = {&d[0], &nodata};
    st = kiln_reference_group((const kiln_graph *const *)g, 2, rd_get, rd_put, users2);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "rank 1") && strstr(kiln_status_msg(st), "no data"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    /* bad arguments */
    st = kiln_reference_group((const kiln_graph *const *)g, 0, rd_get, rd_put, users);
    ck_assert_ptr_nonnull(st);
    kiln_status_free(st);
    st = kiln_reference_group(NULL, 2, rd_get, rd_put, users);
    ck_assert_ptr_nonnull(st);
    kiln_status_free(st);
    ts_graph_free(plain, c1);
    for (int r = 0; r < 3; r++) {
        ts_graph_free(g[r], c[r]);
        free(d[r].y);
    }
    free(kg1), free(kg2), free(w1), free(w2), free(x);
}
END_TEST

/* The op's rules: f32 only, 2 .. 64 ranks in .kg; kiln_all_reduce over one rank is its operand. */
START_TEST(op_rules) {
    ts_parse_error("input a: f32[4, 3]\noutput y = all_reduce(a, 1)\n", KILN_ERR_INVALID,
                   (const char *const[]){"all_reduce", "ranks is 1", NULL});
    ts_parse_error("input a: f32[4, 3]\noutput y = all_reduce(a, 65)\n", KILN_ERR_INVALID,
                   (const char *const[]){"ranks is 65", NULL});
    ts_parse_error("input a: f16[4, 3]\noutput y = all_reduce(a, 2)\n", KILN_ERR_SHAPE,
                   (const char *const[]){"all_reduce", "must be f32", NULL});
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[2] = {4, 3};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "a", 2, ne);
    ck_assert_ptr_eq(kiln_all_reduce(ctx, a, 1), a);
    kiln_tensor *s = kiln_all_reduce(ctx, a, 8);
    ck_assert_ptr_nonnull(s);
    ck_assert_ptr_ne(s, a);
    kiln_ctx_free(ctx);
}
END_TEST

/* Compiles kg into a fresh cache; *cache gets the directory (caller frees). */
static kiln_program *compile_kg(const char *kg, kiln_ctx **ctx, kiln_graph **g, char **cache) {
    *g = ts_build(kg, ctx);
    *cache = ts_tmpdir();
    kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = *cache};
    kiln_program     *p = NULL;
    TS_OK(kiln_compile(*g, &o, &p));
    return p;
}

/* Codegen makes an all_reduce one NCCL step: over the rank's ranks, the node's values (at a
 * symbolic n_tokens: 128 x n of them, the maximum in the program's text), between the node's
 * operand and its buffer; a program hit gives it back the same (the plan keeps the step). */
START_TEST(codegen_nccl_step) {
    char         *kg = mlp_kg(F / 2, 2), *cache;
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = compile_kg(kg, &ctx, &g, &cache);
    char         *d = NULL;
    TS_OK(kiln_program_describe(p, &d));
    char want[96];
    snprintf(want, sizeof want, "all_reduce_f32_2 NCCL all_reduce over 2 ranks, %d floats", K * N);
    ck_assert_msg(strstr(d, want), "no '%s' in:\n%s", want, d);
    int coll = -1;
    for (int i = 0; i < kiln_program_kernel_count(p); i++)
        if (!strncmp(kiln_program_kernel_name(p, i), "all_reduce", 10)) coll = i;
    ck_assert_int_ge(coll, 0);
    ck_assert_msg(strstr(kiln_program_kernel_source(p, coll), "ncclAllReduce(send p"), "%s",
                  kiln_program_kernel_source(p, coll));
    /* the second compile loads the program from the cache, the step with it */
    kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = cache};
    kiln_program     *q = NULL;
    TS_OK(kiln_compile(g, &o, &q));
    kiln_compile_stats cs;
    kiln_program_stats(q, &cs);
    ck_assert_int_eq(cs.program_cached, 1);
    char *e = NULL;
    TS_OK(kiln_program_describe(q, &e));
    ck_assert_str_eq(d, e);
    free(d), free(e);
    kiln_program_free(q);
    kiln_program_free(p);
    ts_tmpdir_free(cache);
    ts_graph_free(g, ctx);
    free(kg);
    /* symbolic n_tokens: the count follows it; its maximum is in the program */
    static const char dyn[] = "dim n <= 40\nweight w: f32[256, 128]\ninput x: f32[256, n]\nm = mul_mat(w, x)\n"
                              "r = all_reduce(m, 4)\noutput y = add(r, m)\n";
    p = compile_kg(dyn, &ctx, &g, &cache);
    TS_OK(kiln_program_describe(p, &d));
    ck_assert_msg(strstr(d, "NCCL all_reduce over 4 ranks, 5120 floats at most"), "%s", d);
    free(d);
    for (int i = 0; i < kiln_program_kernel_count(p); i++)
        if (!strncmp(kiln_program_kernel_name(p, i), "all_reduce", 10))
            ck_assert_msg(strstr(kiln_program_kernel_source(p, i), "count = 128 * kdims[0] at run time"), "%s",
                          kiln_program_kernel_source(p, i));
    kiln_program_free(p);
    ts_tmpdir_free(cache);
    ts_graph_free(g, ctx);
}
END_TEST

/* The template refuses what NCCL's flat count cannot address: a symbolic dim that is not the
 * outermost one. */
START_TEST(codegen_refusals) {
    static const char kg[] = "dim n <= 40\ninput x: f32[n, 3]\nr = all_reduce(x, 2)\noutput y = add(r, x)\n";
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    char       *cache = ts_tmpdir();
    kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = cache, .skip_nvrtc = 1};
    kiln_program     *p = NULL;
    kiln_status       st = kiln_compile(g, &o, &p);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "only the outermost dim may be symbolic"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    ts_tmpdir_free(cache);
    ts_graph_free(g, ctx);
}
END_TEST

/* kiln_group_new checks its arguments before it needs a GPU: the rank count, NULL programs,
 * programs whose all_reduce is over another number of ranks, devices named twice. A session
 * alone refuses a program with all_reduce steps when it runs (kiln_session_new needs a GPU:
 * not here). */
START_TEST(group_arguments) {
    char         *kg = mlp_kg(F / 2, 2), *cache;
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = compile_kg(kg, &ctx, &g, &cache);
    const kiln_program *two[2] = {p, p}, *four[4] = {p, p, p, p}, *holes[2] = {p, NULL};
    kiln_group         *grp = (kiln_group *)1;
    ts_expect_status(kiln_group_new(two, 1, NULL, &grp), KILN_ERR_INVALID, "a group has 2 .. 64 ranks, not 1");
    ck_assert_ptr_null(grp);
    ts_expect_status(kiln_group_new(two, 65, NULL, &grp), KILN_ERR_INVALID, "not 65");
    ts_expect_status(kiln_group_new(NULL, 2, NULL, &grp), KILN_ERR_INVALID, "programs is NULL");
    ts_expect_status(kiln_group_new(holes, 2, NULL, &grp), KILN_ERR_INVALID, "the program of rank 1 is NULL");
    ts_expect_status(kiln_group_new(four, 4, NULL, &grp), KILN_ERR_INVALID,
                     "the program of rank 0 has an all_reduce over 2 ranks");
    int            same[2] = {1, 1};
    kiln_group_opts go = {.devices = same};
    ts_expect_status(kiln_group_new(two, 2, &go, &grp), KILN_ERR_INVALID, "ranks 0 and 1 both name device 1");
    ts_expect_status(kiln_group_new(two, 2, NULL, NULL), KILN_ERR_INVALID, "out is NULL");
    /* Valid arguments: without a driver, NCCL or two GPUs, KILN_ERR_NO_GPU saying which; on a
     * machine with them, the group. */
    kiln_status st = kiln_group_new(two, 2, NULL, &grp);
    if (st) {
        ck_assert_msg(kiln_status_code(st) == KILN_ERR_NO_GPU, "%s", kiln_status_msg(st));
        ck_assert_ptr_null(grp);
        kiln_status_free(st);
    } else {
        ck_assert_int_eq(kiln_group_size(grp), 2);
        kiln_group_free(grp);
    }
    ts_expect_status(kiln_group_run(NULL), KILN_ERR_INVALID, "group is NULL");
    ck_assert_int_eq(kiln_group_size(NULL), 0);
    ck_assert_ptr_null(kiln_group_session(NULL, 0));
    kiln_group_free(NULL);
    kiln_program_free(p);
    ts_tmpdir_free(cache);
    ts_graph_free(g, ctx);
    free(kg);
}
END_TEST

/* ---- whole models ---------------------------------------------------------------------------- */

/* Preset `name` of arch, split over g: every rank's logits are the whole model's rows of its
 * vocabulary shard. */
static void model_split_equals_whole(const char *arch, kiln_model_hparams hp, int g) {
    hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    kiln_model *m = NULL;
    TS_OK(kiln_model_random(&hp, 11, &m));
    const kiln_model_hparams *mh = kiln_model_get_hparams(m);
    ts_tp_data whole;
    ts_tp_init(&whole, m, 1, 0);
    kiln_ctx   *c, *bc;
    kiln_graph *gr = ts_tp_graph(m, 1, 0, &c, &bc);
    TS_OK(kiln_reference(gr, ts_tp_get, ts_tp_put, &whole));
    kiln_graph_free(gr), kiln_ctx_free(bc), kiln_ctx_free(c);
    ck_assert_int_eq(whole.nlogits, mh->n_vocab * TS_TP_T);

    ts_tp_data *d = calloc((size_t)g, sizeof *d);
    kiln_ctx   *cs[4], *bs[4];
    kiln_graph *gs[4];
    void       *users[4];
    ck_assert_ptr_nonnull(d);
    for (int r = 0; r < g; r++) {
        ts_tp_init(&d[r], m, g, r);
        gs[r] = ts_tp_graph(m, g, r, &cs[r], &bs[r]);
        users[r] = &d[r];
    }
    TS_OK(kiln_reference_group((const kiln_graph *const *)gs, g, ts_tp_get, ts_tp_put, users));
    const int64_t vs = km_tp_vocab_share(mh, g); /* (the last rank's rows past n_vocab: padding) */
    double        maxd = 0, maxl = 0;
    for (int r = 0; r < g; r++) {
        ck_assert_int_eq(d[r].nlogits, vs * TS_TP_T);
        for (int t = 0; t < TS_TP_T; t++)
            for (int64_t v = 0; v < vs && r * vs + v < mh->n_vocab; v++) {
                double a = d[r].logits[t * vs + v], b = whole.logits[t * mh->n_vocab + r * vs + v];
                maxd = fmax(maxd, fabs(a - b)), maxl = fmax(maxl, fabs(b));
            }
    }
    ck_assert_msg(maxl > 0 && maxd <= 1e-4 * maxl, "%s over %d: max |rank - whole| logit %g (max |logit| %g)", arch, g, maxd,
                  maxl);
    for (int r = 0; r < g; r++) {
        kiln_graph_free(gs[r]), kiln_ctx_free(bs[r]), kiln_ctx_free(cs[r]);
        ts_tp_free(&d[r]);
    }
    free(d);
    ts_tp_free(&whole);
    kiln_model_close(m);
}

/* The archs a rank graph is built for, as "arch/preset": the routed experts of qwen3moe, of a
 * Mixtral-like llama and of gpt-oss (its sinks split by heads, its expert down biases added on
 * rank 0 alone, its attention output bias after the sum), and deepseek2's multi-head latent
 * attention (heads split, the latent cache whole) with its shared experts (summed with the routed
 * ones before the all_reduce), V2's softmax routing and V3's group-limited sigmoid. */
static const char *const TP_ARCHS[] = {"llama/tiny",  "qwen2/tiny",   "qwen3/tiny",   "phi3/tiny",    "gemma3/tiny",
                                       "granite/tiny", "smollm3/tiny", "qwen3moe/tiny", "llama/tiny-moe", "gpt-oss/tiny",
                                       "deepseek2/tiny", "deepseek2/tiny-v3"};

START_TEST(model_over_2_and_4_ranks) {
    char arch[32];
    snprintf(arch, sizeof arch, "%s", TP_ARCHS[_i]);
    char *preset = strchr(arch, '/');
    *preset++ = 0;
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, preset, &hp));
    TS_OK(km_tp_check(&hp, 2));
    model_split_equals_whole(arch, hp, 2);
    /* 4 ranks: the tiny presets have 2 kv heads; with as many as the query heads (no GQA; MLA's
     * one latent head serves all of them anyway) */
    if (!km_mla(&hp)) hp.n_head_kv = hp.n_head;
    TS_OK(km_tp_check(&hp, 4));
    model_split_equals_whole(arch, hp, 4);
}
END_TEST

/* A vocabulary the ranks do not divide (1021 tokens, prime) is padded: each rank holds
 * ceil(1021 / g) rows, the last one's past the vocabulary zero; the logits still equal the whole
 * model's. */
START_TEST(padded_vocabulary) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    hp.n_vocab = 1021, hp.n_head_kv = hp.n_head;
    TS_OK(km_tp_check(&hp, 2));
    ck_assert_int_eq(km_tp_vocab_share(&hp, 2), 511);
    ck_assert_int_eq(km_tp_vocab_share(&hp, 4), 256);
    model_split_equals_whole("llama, 1021 tokens", hp, 2);
    model_split_equals_whole("llama, 1021 tokens", hp, 4);
    hp.tied_output = true; /* token_embd serves as the output too */
    model_split_equals_whole("llama, 1021 tokens, tied output", hp, 2);
}
END_TEST

/* Bad ranks and outputs a rank graph cannot give (argmax needs the whole vocabulary) are refused. */
START_TEST(model_refusals) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    static const kiln_build_opts bad[] = {{.tp_size = 2, .tp_rank = 2}, {.tp_size = 65}, {.tp_size = 2, .argmax = true}};
    static const char *const     why[] = {"rank 2 of 2", "rank 0 of 65", "argmax"};
    for (int i = 0; i < 3; i++) {
        kiln_ctx *ctx = kiln_ctx_new();
        ts_expect_status(kiln_build_model(ctx, &hp, &bad[i]), KILN_ERR_INVALID, why[i]);
        kiln_ctx_free(ctx);
    }
}
END_TEST

/* kiln_gen with tp (model/gen_tp.c) on the CPU reference: the ranks' weights cut from the
 * model's (km_tp_weight_data), the tokens as each rank sees them, the logits gathered: greedy
 * tokens equal the whole model's, with a prompt longer than n_batch, for a dense model, one
 * with experts, a padded vocabulary and MLA (deepseek2: its latent cache whole on each rank);
 * then the context shift (kiln_gen_shift: each rank's cache, its share of the kv heads, moved
 * and re-roped) and 6 more greedy tokens, equal to the whole model's after the same shift (the
 * batch interface over ranks: tests/test_batch.c). */
START_TEST(gen_over_ranks) {
    static const struct {
        const char *arch, *preset;
        int64_t     n_vocab; /* 0: the preset's */
        int         tp;
    } cases[] = {{"llama", "tiny", 0, 2},  {"qwen3moe", "tiny", 0, 2}, {"llama", "tiny", 1021, 2},
                 {"qwen3", "tiny", 0, 4}, {"deepseek2", "tiny", 0, 2}};
    static const int32_t prompt[6] = {1, 17, 300, 5, 999, 42};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kiln_model_hparams hp;
        TS_OK(kiln_model_preset(cases[c].arch, cases[c].preset, &hp));
        if (cases[c].n_vocab) hp.n_vocab = cases[c].n_vocab;
        if (cases[c].tp == 4) hp.n_head_kv = hp.n_head;
        kiln_model *m;
        TS_OK(kiln_model_random(&hp, 5, &m));
        kiln_gen_opts o1 = {.n_ctx = 32, .n_batch = 4, .cpu = true}, o2 = o1;
        o2.tp = cases[c].tp;
        kiln_gen *g1, *g2;
        TS_OK(kiln_gen_new(m, &o1, &g1));
        TS_OK(kiln_gen_new(m, &o2, &g2));
        int32_t t1[8], t2[8];
        TS_OK(kiln_gen_greedy(g1, prompt, 6, 8, t1, NULL));
        TS_OK(kiln_gen_greedy(g2, prompt, 6, 8, t2, NULL));
        for (int i = 0; i < 8; i++)
            ck_assert_msg(t1[i] == t2[i], "%s/%s (n_vocab %lld) over %d: token %d is %d, the whole model's %d", cases[c].arch,
                          cases[c].preset, (long long)hp.n_vocab, cases[c].tp, i, t2[i], t1[i]);
        TS_OK(kiln_gen_shift(g1, 2, 6));
        TS_OK(kiln_gen_shift(g2, 2, 6));
        ck_assert_int_eq(kiln_gen_pos(g2), kiln_gen_pos(g1));
        TS_OK(kiln_gen_decode_greedy(g1, t1[7], 6, t1));
        TS_OK(kiln_gen_decode_greedy(g2, t2[7], 6, t2));
        for (int i = 0; i < 6; i++)
            ck_assert_msg(t1[i] == t2[i], "%s/%s over %d, after the context shift: token %d is %d, the whole model's %d",
                          cases[c].arch, cases[c].preset, cases[c].tp, i, t2[i], t1[i]);
        kiln_gen_free(g1), kiln_gen_free(g2);
        kiln_model_close(m);
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("collective", TS_CASE("group", 60),
                        TS_TESTS(mlp_over_2_and_4_ranks, group_errors, op_rules, codegen_nccl_step, codegen_refusals, group_arguments),
                        TS_CASE("models", 120), TS_LOOP(0, (int)(sizeof TP_ARCHS / sizeof TP_ARCHS[0]), model_over_2_and_4_ranks),
                        TS_TESTS(model_refusals, padded_vocabulary, gen_over_ranks));
    return ts_main_isolated(s, "collective");
}
