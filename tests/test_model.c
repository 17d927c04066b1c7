/* GGUF models: hyperparameters to and from GGUF, kiln_model_write_random (gen-model), weight
 * binding and its errors, generation on the CPU reference, and the CLI (kiln gen-model, kiln run
 * MODEL.gguf --cpu). GPU generation against the CPU is tests/gpu/test_gpu_model.c. */
#include "tests/support.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tiny_archs[] = {"llama", "qwen2", "qwen3", "qwen3moe"};

static char *g_dir;

static char *path_in(const char *name) {
    size_t n = strlen(g_dir) + strlen(name) + 2;
    char  *p = malloc(n);
    snprintf(p, n, "%s/%s", g_dir, name);
    return p;
}

/* Writes preset (arch, name) with random weights; caller frees the path. */
static char *write_model(const char *arch, const char *preset, uint64_t seed, const char *file) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, preset, &hp));
    char *p = path_in(file);
    TS_OK(kiln_model_write_random(&hp, seed, p, NULL, NULL));
    return p;
}

static void hparams_equal(const kiln_model_hparams *a, const kiln_model_hparams *b) {
    ck_assert_str_eq(a->arch, b->arch);
#define SAME(f) ck_assert_msg(a->f == b->f, "%s: %s differs: %g vs %g", a->arch, #f, (double)a->f, (double)b->f)
    SAME(n_vocab); SAME(n_ctx_train); SAME(n_embd); SAME(n_layer); SAME(n_head); SAME(n_head_kv);
    SAME(head_dim); SAME(n_ff); SAME(rms_norm_eps); SAME(rope_freq_base); SAME(rope_scaling);
    SAME(rope_factor); SAME(tied_output); SAME(qk_norm); SAME(attn_bias); SAME(n_expert);
    SAME(n_expert_used); SAME(n_ff_exp); SAME(norm_topk_prob); SAME(wtype);
    if (a->rope_scaling == KILN_ROPE_SCALING_LLAMA3) {
        SAME(rope_low_freq_factor); SAME(rope_high_freq_factor); SAME(rope_orig_ctx);
    }
#undef SAME
}

/* Every tiny preset survives gen-model and kiln_model_open with the same hyperparameters. */
START_TEST(tiny_round_trip) {
    const char *arch = tiny_archs[_i];
    char       *p = write_model(arch, "tiny", 7, "rt.gguf");
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    kiln_model_hparams want;
    TS_OK(kiln_model_preset(arch, "tiny", &want));
    hparams_equal(kiln_model_get_hparams(m), &want);
    kiln_model_close(m);
    free(p);
}
END_TEST

/* The large presets' keys, without their weights: the keys plus small stand-ins for the three
 * tensors whose type or presence decides wtype, tied output and llama3 scaling. */
START_TEST(large_presets_keys_round_trip) {
    static const char *const presets[] = {"llama-3.2-1b", "llama-3-8b", "qwen3-30b-a3b"};
    kiln_model_hparams hp, got;
    TS_OK(kiln_model_preset(NULL, presets[_i], &hp));
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_model_hparams_to_gguf(&hp, w);
    static const float zeros[256];
    int64_t f[1] = {hp.head_dim / 2}, o[2] = {8, 8};
    /* Small stand-ins: only the type and presence of these tensors are read. */
    kiln_gguf_add_tensor(w, "blk.0.attn_q.weight", hp.wtype, 2, o, zeros);
    if (!hp.tied_output) kiln_gguf_add_tensor(w, "output.weight", hp.wtype, 2, o, zeros);
    if (hp.rope_scaling == KILN_ROPE_SCALING_LLAMA3) kiln_gguf_add_tensor(w, "rope_freqs.weight", KILN_F32, 1, f, zeros);
    char *p = path_in("keys.gguf");
    TS_OK(kiln_gguf_write(w, p, NULL, NULL, NULL));
    kiln_gguf_writer_free(w);
    kiln_gguf *g;
    TS_OK(kiln_gguf_open(p, &g));
    TS_OK(kiln_model_hparams_from_gguf(g, &got));
    hparams_equal(&got, &hp);
    kiln_gguf_close(g);
    free(p);
}
END_TEST

static char *file_bytes(const char *path, size_t *len) { return ts_read_file(path, len); }

START_TEST(gen_model_deterministic) {
    char  *a = write_model("qwen3moe", "tiny", 3, "a.gguf"), *b = write_model("qwen3moe", "tiny", 3, "b.gguf");
    char  *c = write_model("qwen3moe", "tiny", 4, "c.gguf");
    size_t na, nb, nc;
    char  *da = file_bytes(a, &na), *db = file_bytes(b, &nb), *dc = file_bytes(c, &nc);
    ck_assert_uint_eq(na, nb);
    ck_assert_msg(memcmp(da, db, na) == 0, "the same seed gave different files");
    ck_assert_uint_eq(na, nc);
    ck_assert_msg(memcmp(da, dc, na) != 0, "another seed gave the same file");
    /* The weights have the documented scales: a matrix's variance is about 1/ne0. */
    kiln_model *m;
    TS_OK(kiln_model_open(a, &m));
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    int64_t     n = hp->n_embd * hp->head_dim * hp->n_head;
    const void *q = kiln_model_weight(m, "blk.0.attn_q.weight", hp->wtype, n);
    ck_assert_ptr_nonnull(q);
    double s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = kb_load_f32(q, hp->wtype, i);
        s2 += x * x;
    }
    double var = s2 / (double)n, want = 1.0 / (double)hp->n_embd;
    ck_assert_msg(var > 0.9 * want && var < 1.1 * want, "variance %g, expected about %g", var, want);
    const float *norm = kiln_model_weight(m, "blk.1.ffn_norm.weight", KILN_F32, hp->n_embd);
    ck_assert_ptr_nonnull(norm);
    for (int64_t i = 0; i < hp->n_embd; i++) ck_assert(norm[i] >= 0.9f && norm[i] < 1.1f);
    kiln_model_close(m);
    free(da), free(db), free(dc), free(a), free(b), free(c);
}
END_TEST

static kiln_gen *cpu_gen(const kiln_model *m, int64_t n_ctx, int64_t n_batch) {
    kiln_gen_opts o = {.n_ctx = n_ctx, .n_batch = n_batch, .cpu = true};
    kiln_gen     *g;
    TS_OK(kiln_gen_new(m, &o, &g));
    return g;
}

static const int32_t prompt[7] = {1, 17, 300, 5, 999, 42, 8};

/* Each tiny arch generates on the CPU: finite logits, and twice the same tokens. */
START_TEST(cpu_generation_deterministic) {
    char       *p = write_model(tiny_archs[_i], "tiny", 11, "gen.gguf");
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    int32_t out[2][12];
    for (int r = 0; r < 2; r++) {
        kiln_gen      *g = cpu_gen(m, 64, 8);
        kiln_gen_stats s;
        TS_OK(kiln_gen_greedy(g, prompt, 7, 12, out[r], &s));
        ck_assert_int_eq(s.prefill_tokens, 7);
        ck_assert_int_eq(s.decode_tokens, 11);
        ck_assert_int_eq(kiln_gen_pos(g), 7 + 11);
        kiln_gen_free(g);
    }
    ck_assert_msg(memcmp(out[0], out[1], sizeof out[0]) == 0, "%s: two runs generated different tokens",
                  tiny_archs[_i]);
    for (int i = 0; i < 12; i++) ck_assert(out[0][i] >= 0 && out[0][i] < kiln_model_get_hparams(m)->n_vocab);
    /* The logits depend on the prompt (a tied-output random model tends to repeat its last
     * token, so the picks alone do not show it). */
    kiln_gen    *a = cpu_gen(m, 16, 8), *b = cpu_gen(m, 16, 8);
    const float *la, *lb;
    int32_t      other[7] = {1, 17, 300, 5, 999, 43, 8};
    TS_OK(kiln_gen_eval(a, prompt, 7, &la));
    TS_OK(kiln_gen_eval(b, other, 7, &lb));
    double d = 0;
    for (int64_t i = 0; i < kiln_model_get_hparams(m)->n_vocab; i++) d = fmax(d, fabs((double)la[i] - lb[i]));
    ck_assert_msg(d > 1e-3, "%s: another token 2 places back changed the logits by only %g", tiny_archs[_i], d);
    kiln_gen_free(a);
    kiln_gen_free(b);
    kiln_model_close(m);
    free(p);
}
END_TEST


/* kiln_model_random has the weights gen-model writes for the same seed, byte for byte, and
 * generates the same logits; a graph of other hyperparameters is refused naming a weight. */
START_TEST(random_model_equals_file) {
    char              *p = write_model(tiny_archs[_i], "tiny", 5, "rand.gguf");
    kiln_model        *f, *r;
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(tiny_archs[_i], "tiny", &hp));
    TS_OK(kiln_model_open(p, &f));
    TS_OK(kiln_model_random(&hp, 5, &r));
    ck_assert_ptr_null(kiln_model_gguf(r));
    const kiln_gguf *g = kiln_model_gguf(f);
    for (int64_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        kiln_gguf_tensor t;
        TS_OK(kiln_gguf_tensor_info(g, i, &t));
        int64_t     n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
        const void *a = kiln_model_weight(f, t.name, t.type, n), *b = kiln_model_weight(r, t.name, t.type, n);
        ck_assert_msg(a && b, "%s: weight %s missing (file %p, random %p)", tiny_archs[_i], t.name, a, b);
        ck_assert_msg(memcmp(a, b, (size_t)n * kiln_type_size(t.type)) == 0, "%s: weight %s differs from the file's",
                      tiny_archs[_i], t.name);
    }
    ck_assert_ptr_null(kiln_model_weight(r, "blk.0.attn_q.weight", KILN_F32 == hp.wtype ? KILN_F16 : KILN_F32, 1));
    kiln_gen    *ga = cpu_gen(f, 16, 8), *gb = cpu_gen(r, 16, 8);
    const float *la, *lb;
    TS_OK(kiln_gen_eval(ga, prompt, 7, &la));
    TS_OK(kiln_gen_eval(gb, prompt, 7, &lb));
    ck_assert(memcmp(la, lb, sizeof *la * (size_t)hp.n_vocab) == 0);
    kiln_gen_free(ga);
    kiln_gen_free(gb);
    kiln_model_close(r);
    hp.n_embd *= 2; /* another shape: the model's weights no longer fit the graph */
    kiln_model_hparams other;
    TS_OK(kiln_model_preset(tiny_archs[_i], "tiny", &other));
    TS_OK(kiln_model_random(&other, 5, &r));
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *gr;
    kiln_build_opts o = {.n_ctx = 8, .n_tokens_max = 4};
    TS_OK(kiln_build_model(ctx, &hp, &o));
    TS_OK(kiln_graph_new(ctx, &gr));
    kiln_status st = kiln_model_check_weights(r, gr);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_NOT_FOUND);
    ck_assert_msg(strstr(kiln_status_msg(st), "is not one of the model's"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    kiln_graph_free(gr);
    kiln_ctx_free(ctx);
    kiln_model_close(r);
    kiln_model_close(f);
    free(p);
}
END_TEST

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(a[i]) && isfinite(b[i]), "logit %lld is not finite", (long long)i);
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return d;
}

/* A prompt in chunks of 3 (cache reused across runs) gives the logits of one 7-token run, and
 * so does prefilling 6 then decoding the 7th; reset starts over. */
START_TEST(cpu_chunks_agree) {
    char       *p = write_model(tiny_archs[_i], "tiny", 5, "chunk.gguf");
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    int64_t      nv = kiln_model_get_hparams(m)->n_vocab;
    kiln_gen    *whole = cpu_gen(m, 32, 8), *chunked = cpu_gen(m, 32, 3);
    const float *a, *b;
    TS_OK(kiln_gen_eval(whole, prompt, 7, &a));
    TS_OK(kiln_gen_eval(chunked, prompt, 7, &b));
    ck_assert_msg(max_abs_diff(a, b, nv) < 1e-4, "%s: chunked prefill differs by %g", tiny_archs[_i],
                  max_abs_diff(a, b, nv));
    float *keep = malloc(sizeof *keep * (size_t)nv);
    memcpy(keep, a, sizeof *keep * (size_t)nv);
    kiln_gen_reset(whole);
    ck_assert_int_eq(kiln_gen_pos(whole), 0);
    TS_OK(kiln_gen_eval(whole, prompt, 6, &a));
    TS_OK(kiln_gen_eval(whole, prompt + 6, 1, &a));
    ck_assert_msg(max_abs_diff(a, keep, nv) < 1e-4, "%s: 6 + 1 differs from 7 by %g", tiny_archs[_i],
                  max_abs_diff(a, keep, nv));
    free(keep);
    kiln_gen_free(whole);
    kiln_gen_free(chunked);
    kiln_model_close(m);
    free(p);
}
END_TEST

START_TEST(gen_errors) {
    char       *p = write_model("llama", "tiny", 1, "err.gguf");
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    kiln_gen    *g = cpu_gen(m, 8, 4);
    const float *l;
    int32_t      bad = 1024;
    kiln_status  st = kiln_gen_eval(g, &bad, 1, &l);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "outside the vocabulary 0 .. 1023"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    int32_t picks[2];
    st = kiln_gen_decode_greedy(g, bad, 1, picks);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "outside the vocabulary"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    TS_OK(kiln_gen_eval(g, prompt, 7, &l));
    st = kiln_gen_eval(g, prompt, 2, &l);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "do not fit in the cache of 8"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    st = kiln_gen_decode_greedy(g, 3, 2, picks);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "2 steps after 7 do not fit in the cache of 8"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    TS_OK(kiln_gen_decode_greedy(g, 3, 0, picks)); /* nothing to do */
    ck_assert_int_eq(kiln_gen_pos(g), 7);
    TS_OK(kiln_gen_decode_greedy(g, 3, 1, picks));
    ck_assert_int_eq(kiln_gen_pos(g), 8);
    kiln_gen_free(g);
    kiln_gen_opts o = {.n_ctx = 4, .n_batch = 8, .cpu = true};
    st = kiln_gen_new(m, &o, &g);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "n_batch 8"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    kiln_model_close(m);
    free(p);
}
END_TEST

/* Overwrites n bytes at offset `skip` after the first occurrence of needle in the file. */
static void patch_after(const char *path, const void *needle, size_t nlen, size_t skip, const void *to, size_t n) {
    size_t len;
    char  *d = ts_read_file(path, &len);
    char  *at = memmem(d, len, needle, nlen);
    ck_assert_msg(at != NULL, "pattern not in %s", path);
    memcpy(at + skip, to, n);
    FILE *f = fopen(path, "wb");
    ck_assert(f && fwrite(d, 1, len, f) == len);
    fclose(f);
    free(d);
}

/* Overwrites the first occurrence of `from` in the file with `to` (same length). */
static void patch_file(const char *path, const char *from, const void *to, size_t n) {
    patch_after(path, from, strlen(from), 0, to, n);
}

static void expect_open_error(const char *path, const char *want) {
    kiln_model *m = NULL;
    kiln_status st = kiln_model_open(path, &m);
    ck_assert_msg(st != NULL, "opening %s succeeded; expected an error with '%s'", path, want);
    ck_assert_msg(strstr(kiln_status_msg(st), want), "expected '%s' in: %s", want, kiln_status_msg(st));
    kiln_status_free(st);
}

START_TEST(model_errors_name_the_cause) {
    /* An architecture kiln does not build. */
    char *p = write_model("llama", "tiny", 1, "arch.gguf");
    /* general.architecture's value: the only string of length 5 that is "llama". */
    patch_after(p, "\x05\0\0\0\0\0\0\0llama", 13, 8, "mamba", 5);
    expect_open_error(p, "architecture 'mamba' is not supported");
    free(p);
    /* A required key missing: rename llama.block_count. */
    p = write_model("llama", "tiny", 1, "key.gguf");
    patch_file(p, "llama.block_count", "llama.block_xount", 17);
    expect_open_error(p, "llama.block_count");
    free(p);
    /* A quantized tensor: blk.0.attn_q.weight's type code (after name, n_dims, ne0, ne1)
     * becomes q4_0, whose 18-byte blocks of 32 fit inside the f16 data. */
    p = write_model("llama", "tiny", 1, "quant.gguf");
    uint32_t q4_0 = 2;
    patch_after(p, "blk.0.attn_q.weight", 19, 19 + 4 + 2 * 8, &q4_0, 4);
    expect_open_error(p, "'blk.0.attn_q.weight' is q4_0");
    free(p);
    /* A weight the graph needs, missing from the file (its name changed). */
    p = write_model("llama", "tiny", 1, "miss.gguf");
    patch_file(p, "blk.1.ffn_up.weight", "blk.1.ffn_up.weighx", 19);
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    kiln_gen_opts o = {.n_ctx = 8, .cpu = true};
    kiln_gen     *g = NULL;
    kiln_status   st = kiln_gen_new(m, &o, &g);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "no tensor 'blk.1.ffn_up.weight'"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    kiln_model_close(m);
    free(p);
}
END_TEST

START_TEST(cli_gen_model_and_cpu_run) {
    char *p = path_in("cli.gguf"), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny --arch qwen3moe --seed 9 -o %s", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "wrote ") && strstr(out, "qwen3moe preset tiny, f16 weights, seed 9"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --tokens 1,2,3 -n 6 --cpu", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "model ") && strstr(out, "qwen3moe, 2 layers"), "%s", out);
    ck_assert_msg(strstr(out, "prompt: 1 2 3\n") && strstr(out, "generated:"), "%s", out);
    ck_assert_msg(strstr(out, "prefill: 3 tokens in") && strstr(out, "decode: 5 tokens in"), "%s", out);
    /* The library's greedy tokens are the command's. */
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    kiln_gen *g = cpu_gen(m, 0, 0);
    int32_t   ids[6], toks[3] = {1, 2, 3};
    TS_OK(kiln_gen_greedy(g, toks, 3, 6, ids, NULL));
    char want[128];
    int  n = snprintf(want, sizeof want, "generated:");
    for (int i = 0; i < 6; i++) n += snprintf(want + n, sizeof want - (size_t)n, " %d", ids[i]);
    ck_assert_msg(strstr(out, want), "expected '%s' in:\n%s", want, out);
    kiln_gen_free(g);
    kiln_model_close(m);
    free(out);
    /* Usage errors. */
    snprintf(cmd, sizeof cmd, "%s run %s -n 4 --cpu", ts_kiln_bin(), p);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--tokens ID,ID,... or --prompt TEXT"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --tokens 1,x --cpu", ts_kiln_bin(), p);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--tokens 1,x: 'x' is not an integer"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny", ts_kiln_bin());
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "no -o FILE.gguf given"), "%s", out);
    free(out);
    /* kiln inspect takes the model's graph. */
    snprintf(cmd, sizeof cmd, "%s inspect %s --n-ctx 64 --n-batch 16", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "topk_moe"), "%s", out);
    free(out);
    free(p);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) {
    ts_rmtree(g_dir);
    free(g_dir);
}

int main(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, tiny_round_trip, 0, 4);
    tcase_add_loop_test(tc, large_presets_keys_round_trip, 0, 3);
    tcase_add_test(tc, gen_model_deterministic);
    tcase_add_loop_test(tc, cpu_generation_deterministic, 0, 4);
    tcase_add_loop_test(tc, cpu_chunks_agree, 0, 4);
    tcase_add_loop_test(tc, random_model_equals_file, 0, 4);
    tcase_add_test(tc, gen_errors);
    tcase_add_test(tc, model_errors_name_the_cause);
    tcase_add_test(tc, cli_gen_model_and_cpu_run);
    suite_add_tcase(s, tc);
    return ts_main_isolated(s, "model");
}
