/* all_reduce and the CPU reference of a tensor-parallel group (ir/ref_collective.c; issue 30):
 * a Megatron-split MLP (column-parallel up, row-parallel down, the partial sums all-reduced)
 * evaluated over 2 and 4 ranks gives every rank the same values, equal to the unsplit graph's
 * within rounding; the op's refusals; errors instead of a hang when the ranks do not meet; and
 * codegen's refusal until the NCCL step exists; and whole models: the graph of each rank of 2 and
 * 4 (kiln_build_opts.tp_size) with its slices of a random model's weights (km_tp_slice), the
 * group evaluated together, gives the whole model's logits. No GPU needed. */
#include "tests/support.h"

#include "model/arch.h"

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
static char *mlp_kg(int f, int ranks) {
    char *t = malloc(1024);
    ck_assert_ptr_nonnull(t);
    char reduce[64] = "";
    if (ranks > 1) snprintf(reduce, sizeof reduce, "s = all_reduce(o, %d)\n", ranks);
    snprintf(t, 1024,
             "weight w1: f32[%d, %d]\nweight w2: f32[%d, %d]\ninput x: f32[%d, %d]\n"
             "h = mul_mat(w1, x)\na = silu(h)\no = mul_mat(w2, a)\n%soutput y = add(%s, x)\n",
             K, f, f, K, K, N, reduce, ranks > 1 ? "s" : "o");
    return t;
}

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

/* Codegen refuses an all_reduce (the NCCL step is not built), naming what is missing. */
START_TEST(codegen_refuses) {
    char       *kg = mlp_kg(F / 2, 2);
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    char       *cache = ts_tmpdir();
    kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = cache, .skip_nvrtc = 1};
    kiln_program     *p = NULL;
    kiln_status       st = kiln_compile(g, &o, &p);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "NCCL step"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    ts_tmpdir_free(cache);
    ts_graph_free(g, ctx);
    free(kg);
}
END_TEST

/* ---- whole models ---------------------------------------------------------------------------- */

enum { MT = 5, MCTX = 16 };

/* One graph's host data: the model's weights (a rank's slices of them), inputs, zero caches. */
typedef struct {
    const kiln_model         *m;
    const kiln_model_hparams *hp; /* the whole model's */
    int                       g, rank;
    int32_t                   tokens[MT], pos[MT], out_ids[MT];
    int64_t                   slots[MT];
    float                     shard[MT];
    uint16_t                  mask[MT * MT], mask_swa[MT * MT];
    void                     *own[256]; /* buffers handed out, freed after */
    int                       nown;
    float                    *logits;
    int64_t                   nlogits;
} model_data;

static void *md_keep(model_data *d, size_t bytes) {
    if (d->nown == (int)(sizeof d->own / sizeof d->own[0])) return NULL;
    return d->own[d->nown++] = calloc(1, bytes ? bytes : 1);
}

/* The model's weight `name` (blk.N.X or X), or this rank's slices of it in order. */
static const void *md_weight(model_data *d, const char *name, kiln_type type, int64_t n) {
    const char *base = name;
    if (!strncmp(name, "blk.", 4) && strchr(name + 4, '.')) base = strchr(name + 4, '.') + 1;
    int64_t il = base == name ? -1 : strtoll(name + 4, NULL, 10);
    const km_weight *w = NULL; /* (phi3's fused ffn_up has its own row: the one this model has) */
    for (int i = 0; i < KM_W_COUNT && !w; i++)
        if (!strcmp(km_weights[i].name, base) && km_weights[i].in_layer == (il >= 0) && km_weight_present(d->hp, &km_weights[i], il))
            w = &km_weights[i];
    if (!w) return NULL;
    int64_t ne[4];
    km_weight_shape(d->hp, w, ne);
    const unsigned char *whole = kiln_model_weight(d->m, name, type, ne[0] * ne[1] * ne[2] * ne[3]);
    if (!whole || d->g == 1) return whole;
    unsigned char *part = md_keep(d, kiln_row_size(type, n));
    if (!part) return NULL;
    int64_t at = 0, cnt = km_tp_slice_count(d->hp, w, d->g);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t off, len;
        km_tp_slice(d->hp, w, d->g, d->rank, type, i, &off, &len);
        memcpy(part + at, whole + off, (size_t)len);
        at += len;
    }
    return at == (int64_t)kiln_row_size(type, n) ? part : NULL;
}

static const void *md_get(void *user, const char *name, kiln_type type, int64_t n) {
    model_data *d = user;
    if (!strcmp(name, "inp_tokens")) return d->tokens;
    if (!strcmp(name, "inp_pos")) return d->pos;
    if (!strcmp(name, "kv_idxs")) return d->slots;
    if (!strcmp(name, "inp_out_ids")) return d->out_ids;
    if (!strcmp(name, "inp_tok_shard")) return d->shard;
    if (!strcmp(name, "kq_mask")) return d->mask;
    if (!strcmp(name, "kq_mask_swa")) return d->mask_swa;
    if (!strncmp(name, "cache_", 6)) return md_keep(d, kiln_row_size(type, n));
    return md_weight(d, name, type, n);
}

static void md_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    model_data *d = user;
    if (strcmp(name, "logits") || type != KILN_F32 || d->logits) return;
    if ((d->logits = malloc((size_t)n * sizeof *d->logits))) memcpy(d->logits, data, (size_t)n * sizeof(float)), d->nlogits = n;
}

/* The graph of rank `rank` of g (g = 1: the whole model), bound to MT tokens from an empty cache. */
static kiln_graph *model_graph(const kiln_model *m, int g, int rank, kiln_ctx **ctx, kiln_ctx **bound) {
    *ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = MCTX, .n_tokens_max = 8, .outputs = KILN_OUTPUTS_ALL, .tp_size = g, .tp_rank = rank};
    TS_OK(kiln_model_build(*ctx, m, &o));
    static const char *const names[2] = {"n_tokens", "n_kv"};
    const int64_t            values[2] = {MT, MT};
    TS_OK(kiln_ctx_bind(*ctx, 2, names, values, bound));
    kiln_graph *gr = NULL;
    TS_OK(kiln_graph_new(*bound, &gr));
    return gr;
}

static void model_inputs(model_data *d, const kiln_model_hparams *hp) {
    const int64_t vs = hp->n_vocab / d->g;
    for (int t = 0; t < MT; t++) {
        int32_t tok = (int32_t)((t * 7919 + 13) % hp->n_vocab);
        bool    in = tok / vs == d->rank;
        d->tokens[t] = d->g == 1 ? tok : in ? (int32_t)(tok - d->rank * vs) : 0;
        d->shard[t] = in ? 1.0f : 0.0f;
        d->pos[t] = t, d->out_ids[t] = t, d->slots[t] = t;
        for (int j = 0; j < MT; j++) {
            d->mask[t * MT + j] = j <= t ? 0 : 0xFC00; /* f16 -inf */
            d->mask_swa[t * MT + j] = j <= t && t - j < hp->n_swa ? 0 : 0xFC00;
        }
    }
}

static void md_free(model_data *d) {
    for (int i = 0; i < d->nown; i++) free(d->own[i]);
    free(d->logits);
}

/* Preset `name` of arch, split over g: every rank's logits are the whole model's rows of its
 * vocabulary shard. */
static void model_split_equals_whole(const char *arch, kiln_model_hparams hp, int g) {
    hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    kiln_model *m = NULL;
    TS_OK(kiln_model_random(&hp, 11, &m));
    const kiln_model_hparams *mh = kiln_model_get_hparams(m);
    model_data whole = {.m = m, .hp = mh, .g = 1};
    model_inputs(&whole, mh);
    kiln_ctx   *c, *bc;
    kiln_graph *gr = model_graph(m, 1, 0, &c, &bc);
    TS_OK(kiln_reference(gr, md_get, md_put, &whole));
    kiln_graph_free(gr), kiln_ctx_free(bc), kiln_ctx_free(c);
    ck_assert_int_eq(whole.nlogits, mh->n_vocab * MT);

    model_data *d = calloc((size_t)g, sizeof *d);
    kiln_ctx   *cs[4], *bs[4];
    kiln_graph *gs[4];
    void       *users[4];
    ck_assert_ptr_nonnull(d);
    for (int r = 0; r < g; r++) {
        d[r] = (model_data){.m = m, .hp = mh, .g = g, .rank = r};
        model_inputs(&d[r], mh);
        gs[r] = model_graph(m, g, r, &cs[r], &bs[r]);
        users[r] = &d[r];
    }
    TS_OK(kiln_reference_group((const kiln_graph *const *)gs, g, md_get, md_put, users));
    const int64_t vs = mh->n_vocab / g;
    double        maxd = 0, maxl = 0;
    for (int r = 0; r < g; r++) {
        ck_assert_int_eq(d[r].nlogits, vs * MT);
        for (int t = 0; t < MT; t++)
            for (int64_t v = 0; v < vs; v++) {
                double a = d[r].logits[t * vs + v], b = whole.logits[t * mh->n_vocab + r * vs + v];
                maxd = fmax(maxd, fabs(a - b)), maxl = fmax(maxl, fabs(b));
            }
    }
    ck_assert_msg(maxl > 0 && maxd <= 1e-4 * maxl, "%s over %d: max |rank - whole| logit %g (max |logit| %g)", arch, g, maxd,
                  maxl);
    for (int r = 0; r < g; r++) {
        kiln_graph_free(gs[r]), kiln_ctx_free(bs[r]), kiln_ctx_free(cs[r]);
        md_free(&d[r]);
    }
    free(d);
    md_free(&whole);
    kiln_model_close(m);
}

/* The dense archs a rank graph is built for (experts, MLA and a row-parallel bias are refused). */
static const char *const TP_ARCHS[] = {"llama", "qwen2", "qwen3", "phi3", "gemma3", "granite", "smollm3"};

START_TEST(model_over_2_and_4_ranks) {
    const char *arch = TP_ARCHS[_i];
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, "tiny", &hp));
    TS_OK(km_tp_check(&hp, 2));
    model_split_equals_whole(arch, hp, 2);
    /* 4 ranks: the tiny presets have 2 kv heads; with as many as the query heads (no GQA) */
    hp.n_head_kv = hp.n_head;
    TS_OK(km_tp_check(&hp, 4));
    model_split_equals_whole(arch, hp, 4);
}
END_TEST

/* What a rank graph cannot be yet is refused, naming it. */
START_TEST(model_refusals) {
    static const struct {
        const char *arch, *needle;
    } cases[] = {{"qwen3moe", "experts"}, {"deepseek2", "latent attention"}, {"gpt-oss", "tensor parallelism"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_model_hparams hp;
        TS_OK(kiln_model_preset(cases[i].arch, "tiny", &hp));
        kiln_ctx       *ctx = kiln_ctx_new();
        kiln_build_opts o = {.n_ctx = 16, .n_tokens_max = 4, .tp_size = 2};
        ts_expect_status(kiln_build_model(ctx, &hp, &o), KILN_ERR_INVALID, cases[i].needle);
        kiln_ctx_free(ctx);
    }
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

int main(void) {
    Suite *s = TS_SUITE("collective", TS_CASE("group", 60),
                        TS_TESTS(mlp_over_2_and_4_ranks, group_errors, op_rules, codegen_refuses),
                        TS_CASE("models", 120), TS_LOOP(0, (int)(sizeof TP_ARCHS / sizeof TP_ARCHS[0]), model_over_2_and_4_ranks),
                        TS_TESTS(model_refusals));
    return ts_main_isolated(s, "collective");
}
