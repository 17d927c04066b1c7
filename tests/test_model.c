/* GGUF models: hyperparameters to and from GGUF, kiln_model_write_random (gen-model), weight
 * binding and its errors, generation on the CPU reference, and the CLI (kiln gen-model, kiln run
 * MODEL.gguf --cpu). GPU generation against the CPU is tests/gpu/test_gpu_model.c. */
#include "tests/support.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tiny_archs[] = {"llama",  "qwen2",  "qwen3",  "qwen3moe", "granite",  "smollm3",
                                         "phi3",   "gemma3", "gemma2", "gpt-oss",  "deepseek2"};
#define NTINY ((int)(sizeof tiny_archs / sizeof tiny_archs[0]))

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
    SAME(n_expert_used); SAME(n_ff_exp); SAME(norm_topk_prob); SAME(ftype);
    SAME(n_swa); SAME(swa_pattern); SAME(rope_freq_base_swa); SAME(query_scale); SAME(attn_softcap);
    SAME(final_softcap); SAME(embedding_scale); SAME(residual_scale); SAME(attention_scale); SAME(logit_scale);
    SAME(kv_lora_rank); SAME(q_lora_rank); SAME(head_dim_v); SAME(n_rot); SAME(n_layer_dense_lead);
    SAME(n_expert_shared); SAME(expert_gating); SAME(expert_probs_bias); SAME(expert_weights_scale);
    SAME(n_expert_groups); SAME(n_group_used);
    /* (GGUF holds 0.1 of it, as llama.cpp's converter writes it) */
    ck_assert_msg(fabsf(a->rope_yarn_log_mul - b->rope_yarn_log_mul) <= 1e-6f * b->rope_yarn_log_mul,
                  "%s: rope_yarn_log_mul differs: %g vs %g", a->arch, (double)a->rope_yarn_log_mul,
                  (double)b->rope_yarn_log_mul);
    if (a->rope_scaling == KILN_ROPE_SCALING_LLAMA3) {
        SAME(rope_low_freq_factor); SAME(rope_high_freq_factor); SAME(rope_orig_ctx);
    }
    if (a->rope_scaling == KILN_ROPE_SCALING_YARN || a->rope_scaling == KILN_ROPE_SCALING_LONGROPE) {
        SAME(rope_orig_ctx); SAME(rope_attn_factor);
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
 * tensors whose presence decides tied output and llama3 scaling (general.file_type gives ftype). */
START_TEST(large_presets_keys_round_trip) {
    static const char *const presets[] = {"llama-3.2-1b", "llama-3-8b", "qwen3-30b-a3b", "gemma-3-4b", "gemma-2-9b",
                                          "tiny-yarn"};
    kiln_model_hparams hp, got;
    TS_OK(kiln_model_preset(NULL, presets[_i], &hp));
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_model_hparams_to_gguf(&hp, w);
    static const float zeros[256];
    int64_t f[1] = {hp.head_dim / 2}, o[2] = {8, 8};
    /* Small stand-ins: only the type and presence of these tensors are read. */
    kiln_gguf_add_tensor(w, "blk.0.attn_q.weight", KILN_BF16, 2, o, zeros);
    if (!hp.tied_output) kiln_gguf_add_tensor(w, "output.weight", KILN_BF16, 2, o, zeros);
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
    kiln_type   qt = kiln_model_weight_type(hp, "blk.0.attn_q.weight");
    const void *q = kiln_model_weight(m, "blk.0.attn_q.weight", qt, n);
    ck_assert_ptr_nonnull(q);
    double s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = kb_load_f32(q, qt, i);
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
    ck_assert_ptr_null(kiln_model_weight(r, "blk.0.attn_q.weight", KILN_FTYPE_ALL_F32 == hp.ftype ? KILN_F16 : KILN_F32, 1));
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
    ts_graph_free(gr, ctx);
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

/* Opening path fails with code and a message that starts with the path and contains want. */
static void expect_open_error_code(const char *path, kiln_code code, const char *want) {
    kiln_model *m = (kiln_model *)1;
    kiln_status st = kiln_model_open(path, &m);
    ck_assert_msg(st != NULL, "opening %s succeeded; expected an error with '%s'", path, want);
    ck_assert_ptr_null(m);
    const char *msg = kiln_status_msg(st);
    ck_assert_msg(strstr(msg, want), "expected '%s' in: %s", want, msg);
    ck_assert_msg(!strncmp(msg, path, strlen(path)) && !strncmp(msg + strlen(path), ": ", 2),
                  "the message does not start with the file's path %s: %s", path, msg);
    ck_assert_msg(kiln_status_code(st) == code, "code %s, want %s: %s", kiln_code_name(kiln_status_code(st)),
                  kiln_code_name(code), msg);
    kiln_status_free(st);
}

static void expect_open_error(const char *path, const char *want) {
    expect_open_error_code(path, KILN_ERR_FORMAT, want);
}

static void set_key(const char *path, const char *key, uint32_t type, const void *v);

START_TEST(model_errors_name_the_cause) {
    /* An architecture kiln does not build. */
    char *p = write_model("llama", "tiny", 1, "arch.gguf");
    /* general.architecture's value: the only string of length 5 that is "llama". */
    patch_after(p, "\x05\0\0\0\0\0\0\0llama", 13, 8, "mamba", 5);
    expect_open_error(p, "architecture 'mamba' is not supported yet: it needs state-space (recurrent) layers");
    free(p);
    /* A required key missing: rename llama.block_count. */
    p = write_model("llama", "tiny", 1, "key.gguf");
    patch_file(p, "llama.block_count", "llama.block_xount", 17);
    expect_open_error(p, "no key 'llama.block_count', which llama models need");
    free(p);
    /* A type kiln lacks: blk.0.attn_q.weight's type code (after name, n_dims, ne0, ne1)
     * becomes q4_1, whose 20-byte blocks of 32 fit inside the f16 data. */
    p = write_model("llama", "tiny", 1, "quant.gguf");
    uint32_t q4_1 = 3;
    patch_after(p, "blk.0.attn_q.weight", 19, 19 + 4 + 2 * 8, &q4_1, 4);
    expect_open_error(p, "quant.gguf: tensor 'blk.0.attn_q.weight' is q4_1; kiln runs f32, f16, bf16, q8_0, q4_0, "
                         "q5_0, q5_1, q4_K, q5_K, q6_K and mxfp4");
    free(p);
    /* A weight the graph needs, missing from the file (its name changed): refused when the
     * model opens, before any graph is built. */
    p = write_model("llama", "tiny", 1, "miss.gguf");
    patch_file(p, "blk.1.ffn_up.weight", "blk.1.ffn_up.weighx", 19);
    expect_open_error(p, "no tensor 'blk.1.ffn_up.weight' (f16 [128, 256]), which the llama graph needs");
    free(p);
    /* deepseek2 from before llama.cpp's MLA layout: no key_length_mla (renamed here) */
    p = write_model("deepseek2", "tiny", 1, "mla.gguf");
    patch_file(p, "deepseek2.attention.key_length_mla", "deepseek2.attention.key_length_mlx", 34);
    expect_open_error(p, "no 'deepseek2.attention.key_length_mla': a deepseek2 file from before llama.cpp's MLA "
                         "layout (attn_kv_b instead of attn_k_b and attn_v_b)");
    free(p);
    /* the cached latent's sizes must agree: key_length = kv_lora_rank + rope dims */
    p = write_model("deepseek2", "tiny", 1, "mla2.gguf");
    uint32_t bad = 81;
    set_key(p, "deepseek2.attention.key_length", 4, &bad);
    expect_open_error(p, "deepseek2.attention.key_length 81 and value_length 64 should be the cached latent: "
                         "kv_lora_rank 64 + rope.dimension_count 16, and kv_lora_rank");
    free(p);
}
END_TEST

/* Sets the value of key (of type u32 or f32: 4 bytes) in the file: found by its length, name
 * and type, so that "llama.attention.head_count" does not match head_count_kv. */
static void set_key(const char *path, const char *key, uint32_t type, const void *v) {
    char   needle[128];
    size_t n = strlen(key);
    uint64_t len = n;
    memcpy(needle, &len, 8);
    memcpy(needle + 8, key, n);
    memcpy(needle + 8 + n, &type, 4);
    patch_after(path, needle, 8 + n + 4, 8 + n + 4, v, 4);
}

static void set_u32(const char *path, const char *key, uint32_t v) { set_key(path, key, KILN_GGUF_U32, &v); }

/* Two faults in one file's keys: the first (a missing required key) is the one reported, and
 * the second (a key of the wrong type) neither replaces nor leaks it. fuzz_gguf found the leak
 * (tests/fuzz/corpus/fuzz_gguf/regress-hparams-leak); make test-asan checks it. */
START_TEST(first_key_error_wins) {
    char *p = write_model("qwen3moe", "tiny", 1, "hp.gguf");
    patch_file(p, "qwen3moe.expert_used_count", "qwen3moe.expert_used_cXunt", 26);
    const char name[] = "qwen3moe.expert_weights_norm";
    char       needle[64];
    uint64_t   len = sizeof name - 1;
    uint32_t   u8 = KILN_GGUF_U8; /* was bool: the same one-byte value */
    memcpy(needle, &len, 8);
    memcpy(needle + 8, name, len);
    patch_after(p, needle, 8 + len, 8 + len, &u8, 4);
    expect_open_error(p, "no key 'qwen3moe.expert_used_count', which qwen3moe models need");
    free(p);
}
END_TEST

/* A tiny llama whose key `key` becomes v: opening it fails with want. */
static void expect_u32_refused(const char *arch, const char *key, uint32_t v, const char *want) {
    char *p = write_model(arch, "tiny", 1, "hp.gguf");
    set_u32(p, key, v);
    expect_open_error(p, want);
    free(p);
}

/* The hyperparameters are checked against the tensors the file holds before anything is built:
 * a header claiming 767 layers of a 2-layer file is refused at once, naming the file, the key
 * and the first tensor missing; each extent that differs names the key behind it. */
START_TEST(hparams_checked_against_tensors) {
    expect_u32_refused("llama", "llama.block_count", 767,
                       "hp.gguf: llama.block_count is 767 but the file holds layers 0 .. 1 (no tensor "
                       "blk.2.attn_norm.weight)");
    expect_u32_refused("llama", "llama.block_count", 1,
                       "hp.gguf: llama.block_count is 1 but the file holds layers 0 .. 1 (tensor blk.1.");
    expect_u32_refused("llama", "llama.embedding_length", 256,
                       "tensor 'token_embd.weight' is [128, 1024], not [256, 1024]: its ne[0] should be "
                       "llama.embedding_length = 256");
    expect_u32_refused("llama", "llama.vocab_size", 2000,
                       "tensor 'token_embd.weight' is [128, 1024], not [128, 2000]: its ne[1] should be "
                       "llama.vocab_size = 2000");
    expect_u32_refused("llama", "llama.attention.head_count", 8,
                       "tensor 'blk.0.attn_q.weight' is [128, 128], not [128, 256]: its ne[1] should be "
                       "llama.attention.head_count 8 x the head size 32 (llama.attention.key_length)");
    expect_u32_refused("llama", "llama.attention.head_count_kv", 1,
                       "tensor 'blk.0.attn_k.weight' is [128, 64], not [128, 32]: its ne[1] should be "
                       "llama.attention.head_count_kv 1 x the head size 32");
    expect_u32_refused("llama", "llama.feed_forward_length", 512,
                       "tensor 'blk.0.ffn_gate.weight' is [128, 256], not [128, 512]: its ne[1] should be "
                       "llama.feed_forward_length = 512");
    expect_u32_refused("qwen3", "qwen3.attention.key_length", 32,
                       "qwen3.attention.value_length 64 differs from key_length 32");
    expect_u32_refused("qwen3moe", "qwen3moe.expert_count", 16,
                       "tensor 'blk.0.ffn_gate_inp.weight' is [128, 8], not [128, 16]: its ne[1] should be "
                       "qwen3moe.expert_count = 16");
    expect_u32_refused("qwen3moe", "qwen3moe.expert_feed_forward_length", 32,
                       "tensor 'blk.0.ffn_gate_exps.weight' is [128, 64, 8], not [128, 32, 8]: its ne[1] should be "
                       "qwen3moe.expert_feed_forward_length = 32");
    /* Bounds on the keys themselves, before the tensors. */
    expect_u32_refused("llama", "llama.context_length", 0, "hp.gguf: model: n_ctx_train = 0 is out of range");
    expect_u32_refused("llama", "llama.block_count", 0, "hp.gguf: model: n_layer = 0 is out of range");
    expect_u32_refused("llama", "llama.embedding_length", 3000000000u, "n_embd = 3000000000 is out of range");
    expect_u32_refused("qwen3moe", "qwen3moe.expert_used_count", 9, "n_expert_used = 9 is out of range");
    char *p = write_model("llama", "tiny", 1, "nan.gguf");
    float nan = NAN;
    set_key(p, "llama.rope.freq_base", KILN_GGUF_F32, &nan);
    expect_open_error(p, "'llama.rope.freq_base' is nan, not a finite number");
    free(p);
    /* Without attention.key_length the head size is n_embd / n_head, which must divide. */
    p = write_model("llama", "tiny", 1, "div.gguf");
    patch_file(p, "llama.attention.key_length", "llama.attention.key_lengtx", 26);
    set_u32(p, "llama.attention.head_count", 3);
    expect_open_error(p, "llama.attention.head_count 3 does not divide llama.embedding_length 128, and there is no "
                         "llama.attention.key_length");
    free(p);
    /* Tensors: one missing outside the layers, one of another type, a layer missing one. */
    p = write_model("llama", "tiny", 1, "norm.gguf");
    patch_file(p, "output_norm.weight", "output_norm.weighx", 18);
    expect_open_error(p, "norm.gguf: no tensor 'output_norm.weight' (f32 [128]), which the llama graph needs");
    free(p);
    p = write_model("llama", "tiny", 1, "type.gguf");
    uint32_t f16 = 1; /* blk.1.attn_norm.weight (f32 [128]) as f16: its 256 bytes fit in the 512 */
    patch_after(p, "blk.1.attn_norm.weight", 22, 22 + 4 + 8, &f16, 4);
    expect_open_error(p, "type.gguf: tensor 'blk.1.attn_norm.weight' is f16; the llama graph needs f32");
    free(p);
    p = write_model("qwen3", "tiny", 1, "qkn.gguf");
    patch_file(p, "blk.1.attn_k_norm.weight", "blk.1.attn_k_norm.weighx", 24);
    expect_open_error(p, "qkn.gguf: no tensor 'blk.1.attn_k_norm.weight' (f32 [64]), which the qwen3 graph needs");
    free(p);
    /* The same refusal through the command line, which builds nothing. */
    p = write_model("llama", "tiny", 1, "cli767.gguf");
    set_u32(p, "llama.block_count", 767);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s", ts_kiln_bin(), p);
    ck_assert_int_ne(ts_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "cli767.gguf: llama.block_count is 767 but the file holds layers 0 .. 1"), "%s", out);
    free(out);
    free(p);
}
END_TEST

/* A tiny llama with every optional weight: llama3 rope scaling (rope_freqs.weight), Q/K/V biases,
 * tied output. It opens with the same hyperparameters; a rope_freqs of another length or a
 * missing bias is refused naming it. */
static kiln_model_hparams llama_variant(void) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    hp.rope_scaling = KILN_ROPE_SCALING_LLAMA3;
    hp.rope_factor = 8;
    hp.rope_low_freq_factor = 1;
    hp.rope_high_freq_factor = 4;
    hp.rope_orig_ctx = 256;
    hp.attn_bias = true;
    hp.tied_output = true;
    return hp;
}

START_TEST(optional_weights_checked) {
    kiln_model_hparams hp = llama_variant();
    char              *p = path_in("var.gguf");
    TS_OK(kiln_model_write_random(&hp, 1, p, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    hparams_equal(kiln_model_get_hparams(m), &hp);
    kiln_model_close(m);
    int64_t half = 8; /* rope_freqs.weight's ne0, 16, becomes 8 (the data still fits) */
    patch_after(p, "rope_freqs.weight", 17, 17 + 4, &half, 8);
    expect_open_error(p, "var.gguf: tensor 'rope_freqs.weight' is [8], not [16]: its ne[0] should be half the head "
                         "size 32 (llama.attention.key_length)");
    TS_OK(kiln_model_write_random(&hp, 1, p, NULL, NULL));
    patch_file(p, "blk.1.attn_v.bias", "blk.1.attn_v.bixs", 17);
    expect_open_error(p, "var.gguf: no tensor 'blk.1.attn_v.bias' (f32 [64]), which the llama graph needs");
    free(p);
}
END_TEST

/* The tokenizer's messages name the file too. */
START_TEST(tokenizer_errors_name_the_file) {
    char *p = write_model("llama", "tiny", 1, "tok.gguf");
    patch_file(p, "tokenizer.ggml.pre", "tokenizer.ggml.prx", 18);
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    kiln_tokenizer *t = NULL;
    kiln_status     st = kiln_tokenizer_from_gguf(kiln_model_gguf(m), &t);
    ck_assert_ptr_nonnull(st);
    char want[4200];
    snprintf(want, sizeof want, "%s: tokenizer.ggml.pre is missing", p);
    ck_assert_msg(strstr(kiln_status_msg(st), want), "%s", kiln_status_msg(st));
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
    free(out);
    /* --dump-logits: the prompt's last logits, as the library evaluates them. */
    char *lp = path_in("logits.bin");
    snprintf(cmd, sizeof cmd, "%s run %s --tokens 1,2,3 -n 2 --cpu --dump-logits %s", ts_kiln_bin(), p, lp);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    char  *data = NULL;
    size_t len = 0;
    TS_OK(kb_read_file(lp, &data, &len));
    int64_t nv = kiln_model_get_hparams(m)->n_vocab;
    ck_assert_uint_eq(len, sizeof(float) * (size_t)nv);
    const float *lg;
    kiln_gen_reset(g);
    TS_OK(kiln_gen_eval(g, toks, 3, &lg));
    ck_assert_msg(memcmp(data, lg, len) == 0, "dumped logits differ from kiln_gen_eval's");
    free(data);
    free(lp);
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
    /* llama.cpp's spellings: -m, -f (the prompt from a file), --n-predict, -c, -b give what kiln's
     * own give; -p twice, -f of a missing file and -c 0 are usage errors naming the flag. */
    char *pf = path_in("prompt.txt"), *want_out = NULL, *got_out = NULL;
    TS_OK(kb_write_file(pf, "Hello world", 11));
    snprintf(cmd, sizeof cmd, "%s run %s --prompt 'Hello world' -n 3 --n-ctx 64 --n-batch 8 --cpu", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &want_out) == 0, "%s", want_out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -f %s --n-predict 3 -c 64 -b 8 --cpu", ts_kiln_bin(), p, pf);
    ck_assert_msg(ts_run(cmd, &got_out) == 0, "%s", got_out);
    const char *gw = strstr(want_out, "generated:"), *gg = strstr(got_out, "generated:");
    ck_assert_msg(gw && gg && strncmp(gw, gg, (size_t)(strchr(gw, '\n') - gw)) == 0, "%s\nvs\n%s", want_out, got_out);
    ck_assert_msg(strstr(got_out, "prompt text: \"Hello world\""), "%s", got_out);
    free(want_out);
    free(got_out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p x --prompt y --cpu", ts_kiln_bin(), p);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--prompt: the prompt is given twice"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -f %s.missing --cpu", ts_kiln_bin(), p, pf);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "-f ") && strstr(out, ".missing"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -c 0 --cpu", ts_kiln_bin(), p);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "-c 0: must be 1 .."), "%s", out);
    free(out);
    free(pf);
    /* kiln inspect takes the model's graph. */
    snprintf(cmd, sizeof cmd, "%s inspect %s --n-ctx 64 --n-batch 16", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "topk_moe"), "%s", out);
    free(out);
    free(p);
}
END_TEST

/* ---- quantized file types ------------------------------------------------------------------------ */

static const kiln_ftype quant_ftypes[] = {KILN_FTYPE_MOSTLY_Q8_0, KILN_FTYPE_MOSTLY_Q4_0, KILN_FTYPE_MOSTLY_Q4_K_M,
                                          KILN_FTYPE_MOSTLY_Q5_K_M, KILN_FTYPE_MOSTLY_Q6_K};

static kiln_model_hparams preset_as(const char *arch, const char *name, kiln_ftype ftype) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, name, &hp));
    hp.ftype = ftype;
    return hp;
}

/* A tiny llama whose rows are all multiples of 256, so that K-quants hold every matrix (the
 * tiny presets' n_embd of 128 makes most of their matrices fall back to q8_0). */
static kiln_model_hparams wide_llama(kiln_ftype ftype) {
    kiln_model_hparams hp = preset_as("llama", "tiny", ftype);
    hp.n_embd = 256, hp.n_ff = 512, hp.head_dim = 64;
    return hp;
}

static char *write_hp(const kiln_model_hparams *hp, uint64_t seed, const char *file) {
    char *p = path_in(file);
    TS_OK(kiln_model_write_random(hp, seed, p, NULL, NULL));
    return p;
}

#define TYPE_IS(hp, name, want)                                                                            \
    do {                                                                                                   \
        kiln_type got_ = kiln_model_weight_type((hp), (name));                                             \
        ck_assert_msg(got_ == (want), "%s %s: %s is %s, want %s", (hp)->arch, kiln_ftype_name((hp)->ftype), \
                      (name), kiln_type_name(got_), kiln_type_name(want));                                  \
    } while (0)

/* llama-quantize's use_more_bits layers of a 32-layer model: the first and last 4, and every
 * third from 6. */
static bool more_bits_32(int il) { return il < 4 || il >= 28 || (il - 4) % 3 == 2; }

/* The mix of each file type on Llama-3-8B (untied output, n_embd 4096: no fallback). */
START_TEST(mix_llama_3_8b) {
    static const struct {
        kiln_ftype ftype;
        kiln_type  base, output, more; /* more: attn_v and ffn_down in the use_more_bits layers */
    } rows[] = {
        {KILN_FTYPE_MOSTLY_Q8_0, KILN_Q8_0, KILN_Q8_0, KILN_Q8_0},
        {KILN_FTYPE_MOSTLY_Q4_0, KILN_Q4_0, KILN_Q6_K, KILN_Q4_0},
        {KILN_FTYPE_MOSTLY_Q4_K_M, KILN_Q4_K, KILN_Q6_K, KILN_Q6_K},
        {KILN_FTYPE_MOSTLY_Q5_K_M, KILN_Q5_K, KILN_Q6_K, KILN_Q6_K},
        {KILN_FTYPE_MOSTLY_Q6_K, KILN_Q6_K, KILN_Q6_K, KILN_Q6_K},
        {KILN_FTYPE_MOSTLY_F16, KILN_F16, KILN_F16, KILN_F16},
        {KILN_FTYPE_MOSTLY_BF16, KILN_BF16, KILN_BF16, KILN_BF16},
        {KILN_FTYPE_ALL_F32, KILN_F32, KILN_F32, KILN_F32},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        kiln_model_hparams hp = preset_as(NULL, "llama-3-8b", rows[r].ftype);
        TS_OK(kiln_model_check(&hp));
        TYPE_IS(&hp, "token_embd.weight", rows[r].base);
        TYPE_IS(&hp, "output.weight", rows[r].output);
        TYPE_IS(&hp, "output_norm.weight", KILN_F32);
        int n_more = 0;
        for (int il = 0; il < 32; il++) {
            char name[64];
            kiln_type v = more_bits_32(il) ? rows[r].more : rows[r].base;
            n_more += more_bits_32(il);
#define LAYER_IS(w, want)                                  \
    do {                                                   \
        snprintf(name, sizeof name, "blk.%d." w, il);      \
        TYPE_IS(&hp, name, want);                          \
    } while (0)
            LAYER_IS("attn_q.weight", rows[r].base);
            LAYER_IS("attn_k.weight", rows[r].base);
            LAYER_IS("attn_v.weight", v);
            LAYER_IS("attn_output.weight", rows[r].base);
            LAYER_IS("ffn_gate.weight", rows[r].base);
            LAYER_IS("ffn_up.weight", rows[r].base);
            LAYER_IS("ffn_down.weight", v);
            LAYER_IS("attn_norm.weight", KILN_F32);
            LAYER_IS("ffn_norm.weight", KILN_F32);
#undef LAYER_IS
        }
        ck_assert_int_eq(n_more, 16); /* layers 0-3, 6, 9, ..., 27 and 28-31 */
    }
    kiln_model_hparams hp = preset_as(NULL, "llama-3-8b", KILN_FTYPE_MOSTLY_Q4_K_M);
    TYPE_IS(&hp, "blk.5.attn_v.weight", KILN_Q4_K);
    TYPE_IS(&hp, "blk.6.attn_v.weight", KILN_Q6_K);
    /* Not weights of this model. */
    TYPE_IS(&hp, "blk.32.attn_q.weight", KILN_TYPE_COUNT);
    TYPE_IS(&hp, "blk.0.attn_q.bias", KILN_TYPE_COUNT);
    TYPE_IS(&hp, "blk.x.attn_q.weight", KILN_TYPE_COUNT);
    TYPE_IS(&hp, "attn_q.weight", KILN_TYPE_COUNT);
    TYPE_IS(&hp, "rope_freqs.weight", KILN_TYPE_COUNT);
}
END_TEST

/* Tied output, experts, the 70B rule, and the fallback where a block does not divide the rows. */
START_TEST(mix_rules) {
    /* Llama-3.2-1B ties its output to token_embd, which takes the output's type. */
    kiln_model_hparams hp = preset_as(NULL, "llama-3.2-1b", KILN_FTYPE_MOSTLY_Q4_K_M);
    TYPE_IS(&hp, "token_embd.weight", KILN_Q6_K);
    TYPE_IS(&hp, "output.weight", KILN_TYPE_COUNT);
    TYPE_IS(&hp, "rope_freqs.weight", KILN_F32);
    hp.ftype = KILN_FTYPE_MOSTLY_Q4_0;
    TYPE_IS(&hp, "token_embd.weight", KILN_Q6_K);
    hp.ftype = KILN_FTYPE_MOSTLY_Q8_0;
    TYPE_IS(&hp, "token_embd.weight", KILN_Q8_0);
    /* Qwen3-30B-A3B: 128 experts, 48 layers (more bits: < 6, >= 42, (il - 6) % 3 == 2). */
    hp = preset_as(NULL, "qwen3-30b-a3b", KILN_FTYPE_MOSTLY_Q4_K_M);
    TYPE_IS(&hp, "blk.0.ffn_down_exps.weight", KILN_Q6_K);
    TYPE_IS(&hp, "blk.6.ffn_down_exps.weight", KILN_Q4_K);
    TYPE_IS(&hp, "blk.8.ffn_down_exps.weight", KILN_Q6_K);
    TYPE_IS(&hp, "blk.8.attn_v.weight", KILN_Q6_K);
    TYPE_IS(&hp, "blk.7.attn_v.weight", KILN_Q4_K);
    TYPE_IS(&hp, "blk.7.attn_k.weight", KILN_Q4_K);
    TYPE_IS(&hp, "blk.7.ffn_gate_exps.weight", KILN_Q4_K);
    TYPE_IS(&hp, "blk.7.ffn_up_exps.weight", KILN_Q4_K);
    TYPE_IS(&hp, "blk.7.ffn_gate_inp.weight", KILN_F32); /* the router is never quantized */
    TYPE_IS(&hp, "blk.7.attn_q_norm.weight", KILN_F32);
    TYPE_IS(&hp, "blk.47.ffn_down_exps.weight", KILN_Q6_K);
    /* Exactly 8 experts (the tiny qwen3moe): attn_k and attn_v q8_0, and in Q4_K_M attn_output
     * q5_K (its rows, head_dim 64 x 4 heads, are 256). */
    hp = preset_as("qwen3moe", "tiny", KILN_FTYPE_MOSTLY_Q4_K_M);
    TYPE_IS(&hp, "blk.0.attn_k.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.1.attn_v.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.attn_output.weight", KILN_Q5_K);
    hp.ftype = KILN_FTYPE_MOSTLY_Q4_0;
    TYPE_IS(&hp, "blk.0.attn_k.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.attn_output.weight", KILN_Q4_0);
    TYPE_IS(&hp, "blk.0.attn_q.weight", KILN_Q4_0);
    /* MXFP4_MOE (llama-quantize: "MoE tensors -> MXFP4, other tensors -> Q8_0"): gpt-oss-20b's
     * experts mxfp4 (ffn_down_exps too, every layer), the other matrices q8_0; its output takes
     * the output's q6_K rule, whose 256 does not divide 2880: q8_0. Biases, sinks, the router f32. */
    hp = preset_as("gpt-oss", "gpt-oss-20b", KILN_FTYPE_MOSTLY_MXFP4_MOE);
    TYPE_IS(&hp, "blk.0.ffn_gate_exps.weight", KILN_MXFP4);
    TYPE_IS(&hp, "blk.0.ffn_up_exps.weight", KILN_MXFP4);
    TYPE_IS(&hp, "blk.0.ffn_down_exps.weight", KILN_MXFP4);
    TYPE_IS(&hp, "blk.5.ffn_down_exps.weight", KILN_MXFP4);
    TYPE_IS(&hp, "blk.0.attn_q.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.attn_v.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.attn_output.weight", KILN_Q8_0);
    TYPE_IS(&hp, "token_embd.weight", KILN_Q8_0);
    TYPE_IS(&hp, "output.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.ffn_gate_inp.weight", KILN_F32);
    TYPE_IS(&hp, "blk.0.attn_sinks.weight", KILN_F32);
    TYPE_IS(&hp, "blk.0.ffn_down_exps.bias", KILN_F32);
    /* A tied output takes the output's rule there too (q6_K where 256 divides the rows). */
    hp = preset_as("qwen3moe", "tiny", KILN_FTYPE_MOSTLY_MXFP4_MOE);
    hp.tied_output = true, hp.n_embd = 256;
    TYPE_IS(&hp, "token_embd.weight", KILN_Q6_K);
    TYPE_IS(&hp, "blk.0.ffn_gate_exps.weight", KILN_MXFP4);
    TYPE_IS(&hp, "blk.0.attn_k.weight", KILN_Q8_0);
    /* A 70B llama (80 layers, GQA): attn_v q5_K where Q4_K_M would give q4_K; not without GQA. */
    hp = preset_as(NULL, "llama-3-8b", KILN_FTYPE_MOSTLY_Q4_K_M);
    hp.n_layer = 80, hp.n_head = 64, hp.n_embd = 8192;
    TYPE_IS(&hp, "blk.10.attn_v.weight", KILN_Q5_K);
    TYPE_IS(&hp, "blk.12.attn_v.weight", KILN_Q6_K);
    TYPE_IS(&hp, "blk.10.ffn_down.weight", KILN_Q4_K);
    hp.n_head_kv = hp.n_head;
    TYPE_IS(&hp, "blk.10.attn_v.weight", KILN_Q4_K);
    /* Rows of 128 (the tiny presets' n_embd) cannot hold a K-quant: as llama.cpp, q5_0 for q4_K,
     * q8_0 for q6_K (layer 1's attn_v, more bits); the output takes q8_0 by its own rule. Rows of
     * 256 keep it. */
    hp = preset_as("llama", "tiny", KILN_FTYPE_MOSTLY_Q4_K_M);
    TYPE_IS(&hp, "token_embd.weight", KILN_Q5_0);
    TYPE_IS(&hp, "output.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.attn_q.weight", KILN_Q5_0);
    TYPE_IS(&hp, "blk.0.attn_v.weight", KILN_Q5_0);
    TYPE_IS(&hp, "blk.1.attn_v.weight", KILN_Q8_0);
    TYPE_IS(&hp, "blk.0.ffn_down.weight", KILN_Q4_K); /* 2 layers: layer 1 is the last eighth */
    TYPE_IS(&hp, "blk.1.ffn_down.weight", KILN_Q6_K);
    hp.n_embd = 64; /* the example: falls back, never refused */
    TS_OK(kiln_model_check(&hp));
    TYPE_IS(&hp, "blk.0.ffn_up.weight", KILN_Q5_0);
    /* q5_K falls back to q5_1; rows 32 does not divide either: f16, as llama.cpp. */
    hp = preset_as("llama", "tiny", KILN_FTYPE_MOSTLY_Q5_K_M);
    hp.n_ff = 272;
    TS_OK(kiln_model_check(&hp));
    TYPE_IS(&hp, "blk.0.ffn_down.weight", KILN_F16);
    TYPE_IS(&hp, "blk.0.ffn_up.weight", KILN_Q5_1);
    TYPE_IS(&hp, "blk.1.ffn_up.weight", KILN_Q5_1);
    TYPE_IS(&hp, "blk.1.attn_v.weight", KILN_Q8_0); /* q6_K's fallback */
    /* The Q5_0 and Q5_1 file types: the base type everywhere, the output q6_K (rows of 256). */
    hp = preset_as(NULL, "llama-3-8b", KILN_FTYPE_MOSTLY_Q5_0);
    TYPE_IS(&hp, "blk.0.attn_q.weight", KILN_Q5_0);
    TYPE_IS(&hp, "blk.0.ffn_down.weight", KILN_Q5_0);
    TYPE_IS(&hp, "output.weight", KILN_Q6_K);
    hp = preset_as(NULL, "llama-3-8b", KILN_FTYPE_MOSTLY_Q5_1);
    TYPE_IS(&hp, "blk.3.attn_v.weight", KILN_Q5_1);
    TYPE_IS(&hp, "token_embd.weight", KILN_Q5_1);
    /* A block-32 type has no fallback: refused naming the tensor, its shape and the type. */
    hp = preset_as("llama", "tiny", KILN_FTYPE_MOSTLY_Q4_0);
    hp.n_embd = 48;
    kiln_status st = kiln_model_check(&hp);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "file type q4_0 gives tensor 'token_embd.weight' q4_0 [48, 1024], "
                                              "whose rows of 48 are not a multiple of q4_0's 32-element blocks"),
                  "%s", kiln_status_msg(st));
    kiln_status_free(st);
    kiln_ctx *ctx = kiln_ctx_new();
    st = kiln_build_model(ctx, &hp, NULL);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "'token_embd.weight' q4_0 [48, 1024]"), "%s",
                  st ? kiln_status_msg(st) : "built");
    kiln_status_free(st);
    kiln_ctx_free(ctx);
    st = kiln_model_write_random(&hp, 1, "/nonexistent/x.gguf", NULL, NULL);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "not a multiple of q4_0's"), "%s", st ? kiln_status_msg(st) : "");
    kiln_status_free(st);
    /* File types by name. */
    kiln_ftype f;
    ck_assert_int_eq(kiln_ftype_from_name("Q4_K_M", &f), 0);
    ck_assert_int_eq(f, 15);
    ck_assert_int_eq(kiln_ftype_from_name("q4_k_s", &f), -1);
    ck_assert_str_eq(kiln_ftype_name(KILN_FTYPE_MOSTLY_Q5_K_M), "q5_k_m");
    ck_assert_str_eq(kiln_ftype_name((kiln_ftype)14), "?");
}
END_TEST

static int64_t gguf_int(const kiln_gguf *g, const char *key) {
    int64_t v = -1;
    TS_OK(kiln_gguf_get_int(g, key, &v));
    return v;
}

/* Every tensor of g has the mix's type for hp, ggml's byte size for it, an aligned offset, and
 * (quantized) the bytes kb_quant_row makes of the same tensor of f32 file f (the same random
 * values). Returns how many tensors are quantized. */
static int check_file_types(const kiln_gguf *g, const kiln_model_hparams *hp, const kiln_gguf *f) {
    ck_assert_int_eq(gguf_int(g, "general.file_type"), (int64_t)hp->ftype);
    ck_assert_int_eq(gguf_int(g, "general.quantization_version"), 2);
    ck_assert_uint_eq(kiln_gguf_data_offset(g) % 32, 0);
    int n_quant = 0;
    for (int64_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        kiln_gguf_tensor t, u;
        TS_OK(kiln_gguf_tensor_info(g, i, &t));
        kiln_type want = kiln_model_weight_type(hp, t.name);
        ck_assert_msg(t.has_kiln_type && t.type == want, "%s: %s is %s, the mix says %s", kiln_ftype_name(hp->ftype),
                      t.name, t.type_name, kiln_type_name(want));
        int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
        ck_assert_uint_eq(t.bytes, kiln_row_size(t.type, t.ne[0]) * (size_t)rows);
        ck_assert_uint_eq(t.offset % 32, 0);
        if (!kiln_type_is_quantized(t.type)) continue;
        n_quant++;
        TS_OK(kiln_gguf_tensor_info(f, kiln_gguf_find_tensor(f, t.name), &u));
        ck_assert(u.type == KILN_F32 && u.ne[0] == t.ne[0]);
        size_t   rb = kiln_row_size(t.type, t.ne[0]);
        uint8_t *q = malloc(rb);
        for (int64_t r = 0; r < rows; r++) { /* row by row, as the brief of gen-model says */
            ck_assert(kb_quant_row((const float *)u.data + r * u.ne[0], t.type, q, t.ne[0]));
            ck_assert_msg(memcmp(q, (const uint8_t *)t.data + (size_t)r * rb, rb) == 0,
                          "%s: row %lld of %s is not the f32 file's row quantized", kiln_ftype_name(hp->ftype),
                          (long long)r, t.name);
        }
        free(q);
    }
    return n_quant;
}

/* kiln gen-model --type X writes the mix with general.file_type X; the quantized tensors are
 * the f32 file's values quantized. The same through the library for a qwen3moe (3-D experts,
 * 8 of them) and a llama whose rows all hold K-quants. */
START_TEST(gen_model_quantized) {
    kiln_ftype ft = quant_ftypes[_i];
    char      *q = path_in("q.gguf"), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny --arch llama --seed 4 --type %s -o %s", ts_kiln_bin(),
             kiln_ftype_name(ft), q);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    char want[128];
    snprintf(want, sizeof want, "llama preset tiny, %s weights, seed 4", kiln_ftype_name(ft));
    ck_assert_msg(strstr(out, want), "%s", out);
    free(out);
    kiln_model_hparams hps[3] = {preset_as("llama", "tiny", ft), preset_as("qwen3moe", "tiny", ft), wide_llama(ft)};
    for (int k = 0; k < 3; k++) {
        kiln_model_hparams f32 = hps[k];
        f32.ftype = KILN_FTYPE_ALL_F32;
        char *pf = write_hp(&f32, 4, "f32.gguf"), *pq = k == 0 ? NULL : write_hp(&hps[k], 4, "q2.gguf");
        kiln_gguf *g, *f;
        TS_OK(kiln_gguf_open(pq ? pq : q, &g));
        TS_OK(kiln_gguf_open(pf, &f));
        int n = check_file_types(g, &hps[k], f);
        ck_assert_msg(n > 0, "no quantized tensor");
        kiln_gguf_close(g);
        kiln_gguf_close(f);
        /* It opens as a model of that file type, with the hyperparameters written. */
        kiln_model *m;
        TS_OK(kiln_model_open(pq ? pq : q, &m));
        hparams_equal(kiln_model_get_hparams(m), &hps[k]);
        kiln_model_close(m);
        free(pf);
        free(pq);
    }
    free(q);
}
END_TEST

/* A tiny model of each arch in each quantized file type runs on the CPU reference: twice the
 * same greedy tokens, and the logits of kiln_model_random (no file) equal the file's. */
START_TEST(cpu_run_quantized) {
    kiln_ftype         ft = quant_ftypes[_i / 5];
    int                a = _i % 5;
    kiln_model_hparams hp = a < 4 ? preset_as(tiny_archs[a], "tiny", ft) : wide_llama(ft);
    char              *p = write_hp(&hp, 6, "run.gguf");
    kiln_model        *m, *r;
    TS_OK(kiln_model_open(p, &m));
    TS_OK(kiln_model_random(&hp, 6, &r));
    int32_t out[2][6];
    for (int k = 0; k < 2; k++) {
        kiln_gen *g = cpu_gen(m, 32, 8);
        TS_OK(kiln_gen_greedy(g, prompt, 7, 6, out[k], NULL));
        kiln_gen_free(g);
    }
    ck_assert_msg(memcmp(out[0], out[1], sizeof out[0]) == 0, "%s %s: two runs differ", hp.arch, kiln_ftype_name(ft));
    for (int i = 0; i < 6; i++) ck_assert(out[0][i] >= 0 && out[0][i] < hp.n_vocab);
    kiln_gen    *ga = cpu_gen(m, 16, 8), *gb = cpu_gen(r, 16, 8);
    const float *la, *lb;
    TS_OK(kiln_gen_eval(ga, prompt, 7, &la));
    TS_OK(kiln_gen_eval(gb, prompt, 7, &lb));
    ck_assert_msg(max_abs_diff(la, lb, hp.n_vocab) == 0, "%s %s: the random model's logits differ from the file's",
                  hp.arch, kiln_ftype_name(ft));
    kiln_gen_free(ga);
    kiln_gen_free(gb);
    kiln_model_close(r);
    kiln_model_close(m);
    free(p);
}
END_TEST

/* kiln_model_random_blocks (kiln bench's quantized models): float weights are kiln_model_random's,
 * quantized ones exist only on the device (kiln_model_weight NULL), so the CPU reference refuses
 * the model, naming a quantized weight, instead of computing with values the GPU does not have. */
START_TEST(random_blocks_model) {
    kiln_model_hparams hp = wide_llama(KILN_FTYPE_MOSTLY_Q4_K_M);
    kiln_model        *r, *b;
    TS_OK(kiln_model_random(&hp, 6, &r));
    TS_OK(kiln_model_random_blocks(&hp, 6, &b));
    ck_assert_ptr_null(kiln_model_gguf(b));
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_graph     *gr;
    kiln_build_opts o = {.n_ctx = 8, .n_tokens_max = 4};
    TS_OK(kiln_model_build(ctx, b, &o));
    TS_OK(kiln_graph_new(ctx, &gr));
    TS_OK(kiln_model_check_weights(b, gr));
    int nq = 0, nf = 0;
    for (int i = 0; i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        kiln_type   ty = kiln_tensor_type(t);
        int64_t     n = kiln_tensor_nelements(t);
        const void *a = kiln_model_weight(r, kiln_tensor_name(t), ty, n), *c = kiln_model_weight(b, kiln_tensor_name(t), ty, n);
        ck_assert_msg(a, "%s: kiln_model_random lacks it", kiln_tensor_name(t));
        if (kiln_type_is_quantized(ty)) {
            ck_assert_msg(!c, "%s (%s): host values of a device-only weight", kiln_tensor_name(t), kiln_type_name(ty));
            nq++;
        } else {
            ck_assert_msg(c && memcmp(a, c, (size_t)n * kiln_type_size(ty)) == 0, "%s differs", kiln_tensor_name(t));
            nf++;
        }
    }
    ck_assert(nq > 0 && nf > 0);
    ts_graph_free(gr, ctx);
    kiln_gen_opts go = {.n_ctx = 16, .n_batch = 8, .cpu = true};
    kiln_gen     *g = NULL;
    kiln_status   st = kiln_gen_new(b, &go, &g);
    int32_t       tok;
    if (!st) st = kiln_gen_eval_greedy(g, prompt, 7, &tok);
    ck_assert_msg(st != NULL, "the CPU reference ran a model whose quantized weights exist only on the device");
    ck_assert_msg(strstr(kiln_status_msg(st), "blk.0.") || strstr(kiln_status_msg(st), "token_embd"), "%s",
                  kiln_status_msg(st));
    printf("random_blocks_model: the CPU reference refuses it: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    kiln_gen_free(g);
    kiln_model_close(b);
    kiln_model_close(r);
}
END_TEST

/* The graph of a file takes each weight's type from the file, also where the file's types are
 * not kiln's mix: an f16 file whose blk.0.attn_q.weight says q4_0 (its 18-byte blocks fit in the
 * f16 data) builds with a q4_0 attn_q and runs. */
START_TEST(file_types_rule_the_graph) {
    char    *p = write_model("llama", "tiny", 1, "mixed.gguf");
    uint32_t q4_0 = 2;
    patch_after(p, "blk.0.attn_q.weight", 19, 19 + 4 + 2 * 8, &q4_0, 4);
    kiln_model *m;
    TS_OK(kiln_model_open(p, &m));
    ck_assert_int_eq(kiln_model_get_hparams(m)->ftype, KILN_FTYPE_MOSTLY_F16);
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *gr;
    kiln_build_opts o = {.n_ctx = 8, .n_tokens_max = 4};
    TS_OK(kiln_model_build(ctx, m, &o));
    TS_OK(kiln_graph_new(ctx, &gr));
    TS_OK(kiln_model_check_weights(m, gr));
    int seen = 0;
    for (int i = 0; i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        const char *n = kiln_tensor_name(t);
        kiln_type   want = !strcmp(n, "blk.0.attn_q.weight") ? KILN_Q4_0 : kiln_model_weight_type(kiln_model_get_hparams(m), n);
        ck_assert_msg(kiln_tensor_type(t) == want, "%s is %s", n, kiln_type_name(kiln_tensor_type(t)));
        seen++;
    }
    ck_assert_int_gt(seen, 10);
    ts_graph_free(gr, ctx);
    /* kiln_build_model from the hyperparameters alone gives the mix (f16 attn_q): refused by
     * the file naming both types. */
    ctx = kiln_ctx_new();
    TS_OK(kiln_build_model(ctx, kiln_model_get_hparams(m), &o));
    TS_OK(kiln_graph_new(ctx, &gr));
    kiln_status st = kiln_model_check_weights(m, gr);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "'blk.0.attn_q.weight' is q4_0 in the file; the graph needs f16"),
                  "%s", st ? kiln_status_msg(st) : "accepted");
    kiln_status_free(st);
    ts_graph_free(gr, ctx);
    kiln_gen *g = cpu_gen(m, 16, 8);
    int32_t   ids[3];
    TS_OK(kiln_gen_greedy(g, prompt, 7, 3, ids, NULL));
    kiln_gen_free(g);
    kiln_model_close(m);
    free(p);
}
END_TEST

/* Types kiln lacks and shapes a type cannot hold are refused, naming the file, the tensor, the
 * type (and the shape). */
START_TEST(quant_refusals) {
    /* q3_K (11) in blk.0.ffn_down.weight [256, 128]: 110-byte blocks fit in the f16 data. */
    char    *p = write_model("llama", "tiny", 1, "M.gguf");
    uint32_t q3_K = 11;
    patch_after(p, "blk.0.ffn_down.weight", 21, 21 + 4 + 2 * 8, &q3_K, 4);
    expect_open_error(p, "M.gguf: tensor 'blk.0.ffn_down.weight' is q3_K; kiln runs f32, f16, bf16, q8_0, q4_0, "
                         "q5_0, q5_1, q4_K, q5_K, q6_K and mxfp4");
    free(p);
    /* q4_K in blk.0.ffn_up.weight [128, 256]: rows of 128 are no whole 256-element block. */
    p = write_model("llama", "tiny", 1, "rows.gguf");
    uint32_t q4_K = 12;
    patch_after(p, "blk.0.ffn_up.weight", 19, 19 + 4 + 2 * 8, &q4_K, 4);
    expect_open_error(p, "'blk.0.ffn_up.weight'");
    expect_open_error(p, "128 is not a multiple of q4_K's block size 256");
    free(p);
    /* A norm must stay f32. */
    p = write_model("llama", "tiny", 1, "norm.gguf");
    uint32_t q8_0 = 8;
    patch_after(p, "blk.1.ffn_norm.weight", 21, 21 + 4 + 8, &q8_0, 4);
    expect_open_error(p, "tensor 'blk.1.ffn_norm.weight' is q8_0; the llama graph needs f32");
    free(p);
    /* gen-model: a file type kiln does not write, and one whose blocks the rows refuse. */
    char *out = NULL, cmd[1024], *q = path_in("x.gguf");
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny --type q4_k_s -o %s", ts_kiln_bin(), q);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--type wants f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k_m, q5_k_m, q6_k, mxfp4_moe, got 'q4_k_s'"), "%s", out);
    free(out);
    free(q);
}
END_TEST

/* kiln run --cpu and inspect take a quantized file; the model line shows the file type and each
 * type's count. */
START_TEST(cli_quantized_run) {
    char *p = path_in("cliq.gguf"), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny --arch llama --type q4_k_m -o %s", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run %s --tokens 1,2,3 -n 4 --cpu", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    /* 5 norms f32; q8_0: output and layer 1's attn_v (q6_K's fallback); q5_0 (q4_K's):
     * token_embd and 11 layer matrices; ffn_down q4_K and q6_K. */
    ck_assert_msg(strstr(out, "q4_k_m weights (f32 5, q8_0 2, q4_K 1, q6_K 1, q5_0 12)"), "%s", out);
    ck_assert_msg(strstr(out, "generated:"), "%s", out);
    free(out);
    /* kiln inspect takes it (no NVRTC), each weight with its own type. */
    snprintf(cmd, sizeof cmd, "%s inspect %s --n-ctx 64 --n-batch 16", ts_kiln_bin(), p);
    ck_assert_msg(ts_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "weight blk.0.ffn_down.weight q4_K[256, 128] 18432 bytes") &&
                      strstr(out, "weight blk.1.ffn_down.weight q6_K[256, 128]") &&
                      strstr(out, "weight blk.0.attn_q.weight q5_0[128, 128]"),
                  "%s", out);
    free(out);
    free(p);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

/* kiln_build_opts.n_tokens_upto: the graph carries the n_tokens <= V variant (after the decode
 * one); values outside 2 .. n_tokens_max - 1 are refused naming the option. */
START_TEST(n_tokens_upto_variant) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = 64, .n_tokens_max = 16, .n_tokens_upto = 8};
    TS_OK(kiln_build_model(ctx, &hp, &o));
    char *text = NULL;
    TS_OK(kiln_print(ctx, &text));
    ck_assert_msg(strstr(text, "dim n_tokens <= 16 specialize 1, <= 8\n"), "%.300s", text);
    free(text);
    kiln_ctx_free(ctx);
    static const int64_t bad[] = {1, 16, 17, -3};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctx = kiln_ctx_new();
        o.n_tokens_upto = bad[i];
        ts_expect_status(kiln_build_model(ctx, &hp, &o), KILN_ERR_INVALID, "n_tokens_upto");
        kiln_ctx_free(ctx);
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("model",
                        TS_CASE_FIXTURE("model", 120, setup, teardown), TS_LOOP(0, NTINY, tiny_round_trip),
                        TS_LOOP(0, 6, large_presets_keys_round_trip), TS_TESTS(gen_model_deterministic),
                        TS_LOOP(0, NTINY, cpu_generation_deterministic, cpu_chunks_agree, random_model_equals_file),
                        TS_TESTS(gen_errors, model_errors_name_the_cause, hparams_checked_against_tensors,
                                 first_key_error_wins, optional_weights_checked, tokenizer_errors_name_the_file,
                                 cli_gen_model_and_cpu_run, n_tokens_upto_variant),
                        TS_CASE_FIXTURE("quant", 120, setup, teardown), TS_LOOP(0, 5, gen_model_quantized),
                        TS_LOOP(0, 25, cpu_run_quantized),
                        TS_TESTS(mix_llama_3_8b, mix_rules, file_types_rule_the_graph, quant_refusals,
                                 cli_quantized_run, random_blocks_model));
    return ts_main_isolated(s, "model");
}
