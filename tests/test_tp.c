/* Tensor parallelism, the plan (model/tp.c; issue 30): for every preset and 2 and 4 GPUs, each
 * weight is either whole on every rank or cut along exactly one extent, a rank's shares add up
 * to the weight, row-parallel weights map into n_embd, and what cannot split is refused with the
 * hyperparameter named; Llama-3-70B in bf16 fits two 80 GB GPUs (a rank's weights) and in
 * Q4_K_M keeps whole blocks in every rank's rows; kiln compile --tp/--pp fills the cache with
 * what the split's run asks for. No GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "model/arch.h"
#include "model/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of the weights of a model of hp on one rank of g (all layers), and in all. */
static void rank_bytes(const kiln_model_hparams *hp, int g, double *rank, double *all) {
    *rank = *all = 0;
    for (int i = 0; i < KM_W_COUNT; i++) {
        const km_weight *w = &km_weights[i];
        if (!km_weight_present(hp, w, -1)) continue;
        int64_t full[4], part[4];
        km_weight_shape(hp, w, full);
        km_tp_rank_shape(hp, w, g, part);
        double n = w->in_layer ? (double)hp->n_layer : 1.0, es = 2.0; /* bf16 */
        *all += n * es * (double)(full[0] * full[1] * full[2] * full[3]);
        *rank += n * es * (double)(part[0] * part[1] * part[2] * part[3]);
    }
}

/* The weights of preset i split over g GPUs as the plan says, or the preset is refused. */
static void check_preset(int i, int g) {
    const char        *arch, *name = kiln_model_preset_name(i, &arch);
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, name, &hp));
    kiln_status st = km_tp_check(&hp, g);
    if (st) { /* a refusal names the hyperparameter that does not divide */
        ck_assert_msg(strstr(kiln_status_msg(st), "is not a multiple of"), "%s/%s g %d: %s", arch, name, g,
                      kiln_status_msg(st));
        kiln_status_free(st);
        return;
    }
    for (int k = 0; k < KM_W_COUNT; k++) {
        const km_weight *w = &km_weights[k];
        if (!km_weight_present(&hp, w, -1)) continue;
        int cut = 0;
        for (int d = 0; d < w->n_dims; d++) cut += km_tp_sharded(w->ne[d]);
        ck_assert_msg(cut <= 1, "%s/%s: %s is cut along %d extents", arch, name, w->name, cut);
        int64_t full[4], part[4];
        km_weight_shape(&hp, w, full);
        km_tp_rank_shape(&hp, w, g, part);
        int d = km_tp_split_dim(w);
        /* a cut extent: a g-th on each rank; the vocabulary padded up to g rows of ceil(n / g) */
        bool vocab = d >= 0 && w->ne[d] == KM_WD_VOCAB;
        for (int e = 0; e < 4; e++)
            ck_assert_msg(e == d && vocab ? part[e] == (full[e] + g - 1) / g : part[e] * (e == d ? g : 1) == full[e],
                          "%s/%s g %d: %s dim %d: %lld on a rank, %lld whole", arch, name, g, w->name, e,
                          (long long)part[e], (long long)full[e]);
        if (km_tp_row_parallel(w)) ck_assert_int_eq(w->ne[1], KM_WD_EMBD);
    }
    double rank, all;
    rank_bytes(&hp, g, &rank, &all);
    ck_assert_msg(rank < all && rank >= all / g, "%s/%s g %d: %g bytes a rank of %g", arch, name, g, rank, all);
}

START_TEST(every_preset_splits_or_is_refused) {
    for (int i = 0; kiln_model_preset_name(i, NULL); i++) {
        check_preset(i, 2);
        check_preset(i, 4);
    }
}
END_TEST

START_TEST(refusals_name_the_hyperparameter) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(NULL, "qwen3-30b-a3b", &hp));
    ts_expect_status(km_tp_check(&hp, 8), KILN_ERR_INVALID,
                     "tensor parallelism over 8 GPUs: n_head_kv 4 is not a multiple of 8 (the kv heads");
    ts_expect_status(km_tp_check(&hp, 3), KILN_ERR_INVALID, "n_head 32 is not a multiple of 3");
    ts_expect_status(km_tp_check(&hp, 0), KILN_ERR_INVALID, "tensor parallelism over 0 GPUs: 1 .. 64");
    TS_OK(km_tp_check(&hp, 4));
    /* Q4_K experts of 768 columns: 384 on each of 2 GPUs, not whole 256-element blocks */
    ts_expect_status(km_tp_check_type(&hp, &km_weights[KM_W_FFN_DOWN_EXPS], 2, KILN_Q4_K), KILN_ERR_INVALID,
                     "ffn_down_exps.weight's rows would be 384 wide on each GPU, not a multiple of the q4_K block (256)");
    TS_OK(km_tp_check_type(&hp, &km_weights[KM_W_FFN_DOWN_EXPS], 2, KILN_Q8_0));
    /* a column-parallel weight keeps whole rows whatever its type */
    TS_OK(km_tp_check_type(&hp, &km_weights[KM_W_FFN_GATE_EXPS], 4, KILN_Q4_K));
}
END_TEST

START_TEST(llama_70b_over_2_and_4_gpus) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(NULL, "llama-3-70b", &hp));
    for (int g = 2; g <= 4; g += 2) {
        TS_OK(km_tp_check(&hp, g));
        double rank, all;
        rank_bytes(&hp, g, &rank, &all);
        ck_assert_msg(all > 140e9 && all < 142e9, "llama-3-70b bf16: %g bytes", all);
        /* everything but the norms is cut: a rank holds 1/g of the weights and a little more */
        ck_assert_msg(rank < all / g * 1.001, "g %d: %g bytes a rank of %g", g, rank, all);
        hp.ftype = KILN_FTYPE_MOSTLY_Q4_K_M;
        for (int k = 0; k < KM_W_COUNT; k++) {
            const km_weight *w = &km_weights[k];
            if (!km_weight_present(&hp, w, -1)) continue;
            char name[96];
            snprintf(name, sizeof name, w->in_layer ? "blk.0.%s" : "%s", w->name);
            TS_OK(km_tp_check_type(&hp, w, g, kiln_model_weight_type(&hp, name)));
        }
        hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    }
    /* a rank's KV cache: n_head_kv / g heads */
    int64_t kv[4];
    km_tp_rank_shape(&hp, &km_weights[KM_W_ATTN_K], 4, kv);
    ck_assert_int_eq(kv[1], 2 * 128);
}
END_TEST

/* Rank r's elements of an f32 weight, read from its byte ranges of a file whose element e is e:
 * each is the element of the whole weight the split says (a fused extent cut part by part). */
static void check_slices_f32(const kiln_model_hparams *hp, const km_weight *w, int g) {
    int64_t full[4], part[4];
    km_weight_shape(hp, w, full);
    int64_t n = full[0] * full[1] * full[2] * full[3], rn = n / (km_tp_split_dim(w) >= 0 ? g : 1);
    float  *file = malloc(sizeof *file * (size_t)n), *mine = malloc(sizeof *mine * (size_t)rn);
    for (int64_t e = 0; e < n; e++) file[e] = (float)e;
    km_tp_rank_shape(hp, w, g, part);
    int64_t fused[3] = {0, 0, 0}, nf = 0;
    if (w->ne[1] == KM_WD_QKV) fused[0] = hp->head_dim * hp->n_head, fused[1] = fused[2] = hp->head_dim * hp->n_head_kv, nf = 3;
    if (w->ne[1] == KM_WD_FF2) fused[0] = fused[1] = hp->n_ff, nf = 2;
    for (int r = 0; r < g; r++) {
        int64_t at = 0;
        for (int64_t i = 0; i < km_tp_slice_count(hp, w, g); i++) {
            int64_t off, len;
            km_tp_slice(hp, w, g, r, KILN_F32, i, &off, &len);
            ck_assert_msg(off % 4 == 0 && len % 4 == 0 && off + len <= n * 4 && at + len / 4 <= rn, "%s: slice %lld", w->name,
                          (long long)i);
            memcpy(mine + at, (const char *)file + off, (size_t)len);
            at += len / 4;
        }
        ck_assert_int_eq(at, rn);
        int d = km_tp_split_dim(w);
        for (int64_t e = 0; e < rn; e++) {
            int64_t c[4] = {e % part[0], e / part[0] % part[1], e / (part[0] * part[1]) % part[2], e / (part[0] * part[1] * part[2])};
            if (d == 0 || d == 2) c[d] += r * part[d];
            if (d == 1 && nf) { /* row c1 of the rank: part p's share, in turn */
                int64_t j = c[1], before = 0, p = 0;
                while (j >= fused[p] / g) j -= fused[p] / g, before += fused[p], p++;
                c[1] = before + r * (fused[p] / g) + j;
            } else if (d == 1) {
                c[1] += r * part[1];
            }
            int64_t want = ((c[3] * full[2] + c[2]) * full[1] + c[1]) * full[0] + c[0];
            ck_assert_msg(mine[e] == (float)want, "%s rank %d: element %lld is %g, want %lld", w->name, r, (long long)e,
                          (double)mine[e], (long long)want);
        }
    }
    free(file);
    free(mine);
}

/* Every weight of every tiny preset (phi3's fused ones included) at 2 GPUs: the ranks' ranges
 * hold the elements the split says; in q8_0 the ranks' ranges cover each byte once. */
START_TEST(rank_slices_of_the_file) {
    static const char *const archs[] = {"llama", "qwen3moe", "phi3", "gemma3", "gpt-oss", "deepseek2"};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        kiln_model_hparams hp;
        TS_OK(kiln_model_preset(archs[a], "tiny", &hp));
        TS_OK(km_tp_check(&hp, 2));
        for (int k = 0; k < KM_W_COUNT; k++) {
            const km_weight *w = &km_weights[k];
            if (!km_weight_present(&hp, w, -1)) continue;
            check_slices_f32(&hp, w, 2);
            int64_t full[4];
            km_weight_shape(&hp, w, full);
            if (full[0] % 64 != 0) continue; /* q8_0 rows cut in 2 must stay whole blocks */
            int64_t bytes = (int64_t)kiln_row_size(KILN_Q8_0, full[0]) * full[1] * full[2] * full[3];
            unsigned char *seen = calloc((size_t)bytes, 1);
            for (int r = 0; r < 2; r++)
                for (int64_t i = 0; i < km_tp_slice_count(&hp, w, 2); i++) {
                    int64_t off, len;
                    km_tp_slice(&hp, w, 2, r, KILN_Q8_0, i, &off, &len);
                    for (int64_t b = off; b < off + len; b++) seen[b]++;
                }
            int64_t want = km_tp_split_dim(w) >= 0 ? 1 : 2; /* a whole weight: each rank reads it all */
            for (int64_t b = 0; b < bytes; b++)
                ck_assert_msg(seen[b] == want, "%s/%s q8_0: byte %lld read %d times", archs[a], w->name, (long long)b, seen[b]);
            free(seen);
        }
    }
}
END_TEST

/* kiln_model_tp_describe: Llama-3-70B over 2 GPUs (a random model: no weights are made), its
 * weights' rows and a GPU's bytes; deepseek2's graph builds, its latent cache whole on each GPU;
 * Qwen3-30B-A3B over 8 refused (n_head_kv 4). */
START_TEST(describe_the_split) {
    kiln_model_hparams hp;
    kiln_model        *m = NULL;
    char              *text = NULL;
    TS_OK(kiln_model_preset("llama", "llama-3-70b", &hp));
    hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    TS_OK(kiln_model_random(&hp, 1, &m));
    TS_OK(kiln_model_tp_describe(m, 2, 4096, &text));
    static const char *const want[] = {"over 2 GPUs", "llama, 80 layers", "blk.*.attn_q.weight",
                                       "[8192, 8192] -> [8192, 4096]  output cut (column-parallel)",
                                       "blk.*.ffn_down.weight", "[28672, 8192] -> [14336, 8192]  input cut (row-parallel",
                                       "token_embd.weight", "vocabulary rows cut", "a GPU holds 70.",
                                       "161 a ubatch", "a GPU's graph: builds"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) ck_assert_msg(strstr(text, want[i]), "no '%s' in:\n%s", want[i], text);
    free(text);
    kiln_model_close(m);
    TS_OK(kiln_model_preset("deepseek2", "tiny", &hp));
    TS_OK(kiln_model_random(&hp, 1, &m));
    TS_OK(kiln_model_tp_describe(m, 2, 64, &text));
    ck_assert_msg(strstr(text, "a GPU's graph: builds") && strstr(text, "the latent cache, whole on each GPU"), "%s", text);
    free(text);
    kiln_model_close(m);
    TS_OK(kiln_model_preset("qwen3moe", "qwen3-30b-a3b", &hp));
    TS_OK(kiln_model_random(&hp, 1, &m));
    ts_expect_status(kiln_model_tp_describe(m, 8, 4096, &text), KILN_ERR_INVALID, "n_head_kv 4 is not a multiple of 8");
    ck_assert_ptr_null(text);
    kiln_model_close(m);
}
END_TEST

/* Random weights of a rank's shapes (km_random_init_rank, kiln bench --tp): every weight of a
 * rank's graph gets the whole weight's generator, rope_freqs is computed, and a quantized weight
 * the host would quantize for the whole model is refused by name; names the model lacks too. */
START_TEST(random_weights_of_a_rank) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    km_random *r;
    TS_OK(km_random_new(&hp, 3, false, &r));
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = 16, .n_tokens_max = 4, .tp_size = 2, .tp_rank = 1};
    TS_OK(kiln_build_model(ctx, &hp, &o));
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    int n = 0;
    for (int i = 0; i < kiln_graph_size(g); i++) {
        const kiln_tensor *t = kiln_graph_node(g, i);
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        int64_t ne[4];
        for (int d = 0; d < 4; d++) ne[d] = kiln_tensor_ne(t, d);
        kiln_weight_init w;
        TS_OK(km_random_init_rank(r, kiln_tensor_name(t), kiln_tensor_type(t), ne, &w));
        ck_assert_msg(w.host || w.key || w.scale != 0, "%s: no generator", kiln_tensor_name(t));
        n++;
    }
    ck_assert_int_gt(n, 10);
    int64_t          ne[4] = {1, 1, 1, 1};
    kiln_weight_init w;
    ts_expect_status(km_random_init_rank(r, "blk.0.no_such.weight", KILN_BF16, ne, &w), KILN_ERR_NOT_FOUND,
                     "blk.0.no_such.weight");
    km_random_free(r);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    hp.ftype = KILN_FTYPE_MOSTLY_Q8_0; /* host-quantized random weights: not per rank */
    TS_OK(km_random_new(&hp, 3, false, &r));
    int64_t q[4] = {128, 64, 1, 1};
    ts_expect_status(km_random_init_rank(r, "blk.0.attn_q.weight", KILN_Q8_0, q, &w), KILN_ERR_INVALID,
                     "'blk.0.attn_q.weight' is q8_0, quantized on the host");
    km_random_free(r);
}
END_TEST

/* Every part of split (tp, pp) of model path, built as kiln_gen_new builds it (kiln_gen_part_opts),
 * finds all its kernels in cache: the whole program from the program cache, nothing compiled. */
static void parts_cached(const char *path, int tp, int pp, const char *cache) {
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    kiln_gen_opts go = {.tp = tp, .pp = pp};
    for (int part = 0; part < (tp > 1 ? tp : pp); part++) {
        kiln_build_opts bo;
        TS_OK(kiln_gen_part_opts(m, &go, part, &bo));
        ck_assert_int_eq(bo.tp_size, tp > 1 ? tp : 0);
        ck_assert_int_eq(bo.tp_rank, tp > 1 ? part : 0);
        ck_assert(!bo.argmax); /* (a split's logits are gathered on the host) */
        kiln_ctx     *ctx = kiln_ctx_new();
        kiln_graph   *g;
        kiln_program *p;
        TS_OK(kiln_model_build(ctx, m, &bo));
        TS_OK(kiln_graph_new(ctx, &g));
        kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = cache, .cache_mode = KILN_CACHE_READONLY};
        TS_OK(kiln_compile(g, &o, &p));
        kiln_compile_stats st;
        kiln_program_stats(p, &st);
        ck_assert_msg(st.program_cached == 1 && st.compiled == 0, "tp %d pp %d part %d: %d compiled, program cached %d",
                      tp, pp, part, st.compiled, st.program_cached);
        kiln_program_free(p);
        kiln_graph_free(g);
        kiln_ctx_free(ctx);
    }
    kiln_model_close(m);
}

/* kiln compile MODEL.gguf --tp G / --pp G fills the cache with what kiln run --tp G / --pp G
 * will ask for (kiln_gen_new builds each part with kiln_gen_part_opts too); the split's flags are
 * refused where they do not apply, and kiln_gen_part_opts refuses parts that do not exist. */
START_TEST(compile_ahead_of_the_split) {
    char *dir = ts_tmpdir(), path[512], cache[512], cmd[2048], *out;
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    TS_OK(kiln_model_write_random(&hp, 3, path, NULL, NULL));
    snprintf(cmd, sizeof cmd, "'%s' compile '%s' --tp 2 --cache-dir '%s' 2>&1", ts_kiln_bin(), path, cache);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "rank 0 of 2: ") && strstr(out, "rank 1 of 2: "), "%s", out);
    free(out);
    parts_cached(path, 2, 0, cache);
    snprintf(cmd, sizeof cmd, "'%s' compile '%s' --pp 2 --cache-dir '%s' 2>&1", ts_kiln_bin(), path, cache);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "stage 0 of 2: ") && strstr(out, "stage 1 of 2: "), "%s", out);
    free(out);
    parts_cached(path, 0, 2, cache);
    snprintf(cmd, sizeof cmd, "'%s' compile '%s' --tp 2 -o '%s/x.kiln' 2>&1", ts_kiln_bin(), path, dir);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "-o with --tp: a bundle holds one program, a split has 2"), "%s", out);
    free(out);
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    kiln_build_opts bo;
    ts_expect_status(kiln_gen_part_opts(m, &(kiln_gen_opts){.tp = 2}, 2, &bo), KILN_ERR_INVALID, "part 2 of 2");
    ts_expect_status(kiln_gen_part_opts(m, &(kiln_gen_opts){.tp = 2, .pp = 2}, 0, &bo), KILN_ERR_INVALID,
                     "one split or the other");
    TS_OK(kiln_gen_part_opts(m, &(kiln_gen_opts){0}, 0, &bo)); /* one GPU: the program kiln run builds */
    ck_assert(bo.argmax && bo.tp_size == 0 && bo.layer_end == 0);
    kiln_model_close(m);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("tp", TS_CASE("plan", 60),
                        TS_TESTS(every_preset_splits_or_is_refused, refusals_name_the_hyperparameter, random_weights_of_a_rank,
                                 llama_70b_over_2_and_4_gpus, rank_slices_of_the_file, describe_the_split,
                                 compile_ahead_of_the_split));
    return ts_main_isolated(s, "tp");
}
