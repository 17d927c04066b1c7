/* Generation that stops (issue 26): kiln_gen_generate on the CPU reference — the -n limit, an
 * end-of-generation pick, the caller's stop, a full cache, a prefill alone — with the tokens of
 * kiln_gen_greedy and the cache position the next turn starts from; kiln_tokenizer_eog's set as
 * llama.cpp's loader makes it; and `kiln run MODEL` streaming its text (byte-equal to the text
 * of its ids), -n -1, -r stop strings, --raw and --ignore-eos. No GPU. */
#include "tests/support.h"

#include "base/base.h"
#include "model/arch.h"
#include "model/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_dir;

/* A tiny llama written by gen-model (extra: more gen-model flags, e.g. "--vocab spm"). */
static char *tiny_model_with(const char *name, const char *extra) {
    char *path = malloc(strlen(g_dir) + strlen(name) + 2), cmd[1024];
    sprintf(path, "%s/%s", g_dir, name);
    snprintf(cmd, sizeof cmd, "%s gen-model --preset tiny --seed 3 %s -o %s >/dev/null 2>&1", ts_kiln_bin(), extra, path);
    ck_assert_int_eq(ts_run(cmd, NULL), 0);
    return path;
}

static char *tiny_model(const char *name) { return tiny_model_with(name, ""); }

static kiln_gen *cpu_gen(const kiln_model *m, int64_t n_ctx) {
    kiln_gen_opts o = {.n_ctx = n_ctx, .n_batch = 8, .cpu = true};
    kiln_gen     *g;
    TS_OK(kiln_gen_new(m, &o, &g));
    return g;
}

static const int32_t prompt[5] = {1, 17, 300, 5, 42};

typedef struct {
    int32_t ids[64];
    int64_t n, stop_after; /* on_token stops once it has seen stop_after tokens (0: never) */
} seen;

static bool on_token(void *user, int32_t id) {
    seen *s = user;
    s->ids[s->n++] = id;
    return s->stop_after && s->n == s->stop_after;
}

/* One generation from the prompt on a fresh generator; the tokens it reported go to *s. */
static kiln_stop run(const kiln_model *m, int64_t n_ctx, int64_t n_predict, const int32_t *eog, int64_t n_eog, seen *s,
                     int64_t *pos) {
    kiln_gen       *g = cpu_gen(m, n_ctx);
    kiln_gen_params p = {.n_predict = n_predict, .eog = eog, .n_eog = n_eog, .on_token = on_token, .user = s};
    kiln_stop       why = KILN_STOP_NONE;
    int64_t         n = -1;
    kiln_gen_stats  st;
    TS_OK(kiln_gen_generate(g, prompt, 5, &p, &n, &why, &st));
    ck_assert_int_eq(n, s->n);
    ck_assert_int_eq(st.prefill_tokens, 5);
    *pos = kiln_gen_pos(g);
    ck_assert_int_eq(st.decode_tokens, *pos - 5);
    kiln_gen_free(g);
    return why;
}

START_TEST(stops) {
    char       *path = tiny_model("gen.gguf");
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    int32_t   want[12];
    kiln_gen *g = cpu_gen(m, 64);
    TS_OK(kiln_gen_greedy(g, prompt, 5, 12, want, NULL));
    kiln_gen_free(g);
    int64_t pos;
    /* The limit: kiln_gen_greedy's tokens; the last is not in the cache. */
    seen a = {0};
    ck_assert_int_eq(run(m, 64, 12, NULL, 0, &a, &pos), KILN_STOP_LIMIT);
    ck_assert_int_eq(a.n, 12);
    ck_assert(memcmp(a.ids, want, sizeof want) == 0);
    ck_assert_int_eq(pos, 5 + 11);
    /* An end-of-generation pick (the first greedy token from the 4th on that did not come before)
     * is not reported and not fed: the cache holds the k reported. */
    int64_t k = 3;
    for (bool earlier = true; k < 12 && earlier; k += earlier) {
        earlier = false;
        for (int64_t j = 0; j < k; j++) earlier |= want[j] == want[k];
    }
    ck_assert_msg(k < 12, "the tiny model repeats one token: pick another seed");
    seen b = {0};
    ck_assert_int_eq(run(m, 64, 12, &want[k], 1, &b, &pos), KILN_STOP_EOG);
    ck_assert_int_eq(b.n, k);
    ck_assert(memcmp(b.ids, want, sizeof *want * (size_t)k) == 0);
    ck_assert_int_eq(pos, 5 + k);
    /* The first pick ends generation: nothing is reported, the prompt alone is in the cache. */
    seen c = {0};
    ck_assert_int_eq(run(m, 64, 12, &want[0], 1, &c, &pos), KILN_STOP_EOG);
    ck_assert_int_eq(c.n, 0);
    ck_assert_int_eq(pos, 5);
    /* The caller stops after its 2nd token: reported, not fed. */
    seen d = {.stop_after = 2};
    ck_assert_int_eq(run(m, 64, 12, NULL, 0, &d, &pos), KILN_STOP_CALLER);
    ck_assert_int_eq(d.n, 2);
    ck_assert_int_eq(pos, 5 + 1);
    /* -1: until the cache is full (n_ctx 16: 5 + 11 fed, 12 reported). */
    seen e = {0};
    ck_assert_int_eq(run(m, 16, -1, NULL, 0, &e, &pos), KILN_STOP_CONTEXT);
    ck_assert_int_eq(e.n, 12);
    ck_assert(memcmp(e.ids, want, sizeof want) == 0);
    ck_assert_int_eq(pos, 16);
    /* 0: the prompt alone. */
    seen f = {0};
    ck_assert_int_eq(run(m, 64, 0, NULL, 0, &f, &pos), KILN_STOP_LIMIT);
    ck_assert_int_eq(f.n, 0);
    ck_assert_int_eq(pos, 5);
    /* A second turn goes on from the position: prompt + 3 tokens, then 2 more. */
    g = cpu_gen(m, 64);
    seen            h = {.stop_after = 3};
    kiln_gen_params p = {.n_predict = -1, .on_token = on_token, .user = &h};
    TS_OK(kiln_gen_generate(g, prompt, 5, &p, NULL, NULL, NULL));
    ck_assert_int_eq(kiln_gen_pos(g), 5 + 2);
    p.n_predict = 2, h.stop_after = 0;
    TS_OK(kiln_gen_generate(g, &h.ids[2], 1, &p, NULL, NULL, NULL)); /* the 3rd token, never fed */
    ck_assert_int_eq(h.n, 5);
    ck_assert(memcmp(h.ids, want, sizeof *want * 5) == 0);
    ck_assert_int_eq(kiln_gen_pos(g), 5 + 4);
    kiln_gen_free(g);
    /* Bad arguments are errors, not crashes. */
    g = cpu_gen(m, 64);
    ts_expect_status(kiln_gen_generate(g, prompt, 0, &p, NULL, NULL, NULL), KILN_ERR_INVALID, "empty prompt");
    ts_expect_status(kiln_gen_generate(g, prompt, 5, NULL, NULL, NULL, NULL), KILN_ERR_INVALID, "bad argument");
    kiln_gen_params bad = {.n_predict = 1, .n_eog = 2};
    ts_expect_status(kiln_gen_generate(g, prompt, 5, &bad, NULL, NULL, NULL), KILN_ERR_INVALID, "bad argument");
    kiln_gen_free(g);
    kiln_model_close(m);
    free(path);
}
END_TEST

/* Sampling: every pick is kiln_sample's over the logits of the tokens before it (recomputed here
 * step by step with kiln_gen_eval), the same seed gives the same tokens, another seed others,
 * and --temp 0 is the greedy run. */
START_TEST(sampled) {
    char       *path = tiny_model("sample.gguf");
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    kiln_sampler_params sp = kiln_sampler_params_default();
    sp.seed = 11, sp.repeat_penalty = 1.1f;
    seen    a = {0}, b = {0}, c = {0};
    int64_t pos;
    for (int r = 0; r < 3; r++) {
        kiln_gen       *g = cpu_gen(m, 64);
        seen           *s = r == 0 ? &a : r == 1 ? &b : &c;
        kiln_sampler_params q = sp;
        if (r == 2) q.seed = 12;
        kiln_gen_params p = {.n_predict = 16, .on_token = on_token, .user = s, .sampler = &q};
        TS_OK(kiln_gen_generate(g, prompt, 5, &p, NULL, NULL, NULL));
        pos = kiln_gen_pos(g);
        kiln_gen_free(g);
    }
    ck_assert_int_eq(a.n, 16);
    ck_assert_int_eq(pos, 5 + 15);
    ck_assert(memcmp(a.ids, b.ids, sizeof *a.ids * 16) == 0);
    ck_assert_msg(memcmp(a.ids, c.ids, sizeof *a.ids * 16) != 0, "seeds 11 and 12 gave the same 16 tokens");
    /* Step by step. */
    kiln_gen    *g = cpu_gen(m, 64);
    int32_t      hist[32];
    const float *lg;
    memcpy(hist, prompt, sizeof prompt);
    TS_OK(kiln_gen_eval(g, prompt, 5, &lg));
    for (int i = 0; i < 16; i++) {
        int32_t want;
        TS_OK(kiln_sample(&sp, lg, kiln_model_get_hparams(m)->n_vocab, hist, 5 + i, kiln_gen_pos(g), &want));
        ck_assert_msg(want == a.ids[i], "pick %d: %d, kiln_sample says %d", i, a.ids[i], want);
        hist[5 + i] = want;
        if (i < 15) TS_OK(kiln_gen_eval(g, &want, 1, &lg));
    }
    kiln_gen_free(g);
    /* --temp 0: the greedy tokens (the chained path). */
    int32_t greedy[8];
    g = cpu_gen(m, 64);
    TS_OK(kiln_gen_greedy(g, prompt, 5, 8, greedy, NULL));
    kiln_gen_free(g);
    seen d = {0};
    sp.temp = 0, sp.repeat_penalty = 1;
    g = cpu_gen(m, 64);
    kiln_gen_params p = {.n_predict = 8, .on_token = on_token, .user = &d, .sampler = &sp};
    TS_OK(kiln_gen_generate(g, prompt, 5, &p, NULL, NULL, NULL));
    ck_assert(memcmp(d.ids, greedy, sizeof greedy) == 0);
    /* Bad parameters are refused before anything runs. */
    sp.top_p = 2;
    ts_expect_status(kiln_gen_generate(g, prompt, 5, &p, NULL, NULL, NULL), KILN_ERR_INVALID, "--top-p 2");
    kiln_gen_free(g);
    kiln_model_close(m);
    free(path);
}
END_TEST

/* The context shift (kiln_gen_shift) of a 20-token prompt keeping 4 and dropping 8: layer 0's
 * cache rows (which depend on their token and position only) equal those of the 12 kept tokens
 * evaluated anew at their new positions, V bit for bit, K up to the f16 rounding of the
 * re-rope; every tiny arch (normal and neox ropes, qk-norm, experts) and YaRN (ARCH/PRESET: the
 * re-rope cancels ggml's YaRN magnitude factor, so K is not scaled twice). (Deeper layers hold
 * what the dropped tokens contributed, as in llama.cpp.) Generation goes on from position 12;
 * bad arguments are refused. */
static const char *const archs[] = {"llama", "qwen2", "qwen3", "qwen3moe", "granite", "smollm3", "phi3", "gemma3", "gemma2", "gpt-oss",
                                    "deepseek2", "qwen3/tiny-yarn"};
#define NARCHS ((int)(sizeof archs / sizeof archs[0]))

START_TEST(context_shift) {
    char        name[64], extra[64], arch[32];
    const char *slash = strchr(archs[_i], '/');
    snprintf(arch, sizeof arch, "%.*s", slash ? (int)(slash - archs[_i]) : (int)strlen(archs[_i]), archs[_i]);
    snprintf(name, sizeof name, "shift-%s.gguf", slash ? slash + 1 : arch);
    snprintf(extra, sizeof extra, "--arch %s%s%s", arch, slash ? " --preset " : "", slash ? slash + 1 : "");
    char       *path = tiny_model_with(name, extra);
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    int64_t nv = hp->n_vocab, row = km_cache_row(hp);
    int32_t p[20], kept[12], t = 5;
    for (int i = 0; i < 20; i++) p[i] = (int32_t)((i * 37 + 11) % nv);
    memcpy(kept, p, sizeof *p * 4);
    memcpy(kept + 4, p + 12, sizeof *p * 8);
    const float *lg;
    kiln_gen    *a = cpu_gen(m, 64), *b = cpu_gen(m, 64);
    TS_OK(kiln_gen_eval(a, p, 20, &lg));
    TS_OK(kiln_gen_shift(a, 4, 8));
    ck_assert_int_eq(kiln_gen_pos(a), 12);
    TS_OK(kiln_gen_eval(b, kept, 12, &lg));
    size_t          na, nb;
    const uint16_t *ka = km_gen_cpu_state(a, "cache_k_l0", &na), *kb = km_gen_cpu_state(b, "cache_k_l0", &nb);
    const uint16_t *va = km_gen_cpu_state(a, "cache_v_l0", &na), *vb = km_gen_cpu_state(b, "cache_v_l0", &nb);
    ck_assert(ka && kb && (km_mla(hp) ? !va && !vb : va && vb));
    if (va) ck_assert_msg(memcmp(va, vb, sizeof *va * (size_t)(12 * row)) == 0, "%s: V rows moved wrong", archs[_i]);
    for (int64_t r = 0; km_mla(hp) && r < 12; r++) /* deepseek2: the latent (V) moved, only the rope key rotated */
        ck_assert_msg(memcmp(ka + r * row, kb + r * row, sizeof *ka * (size_t)hp->kv_lora_rank) == 0,
                      "%s: the latent of row %lld moved wrong", archs[_i], (long long)r);
    double num = 0, den = 0;
    for (int64_t i = 0; i < 12 * row; i++) {
        double x = kb_f16_to_f32(ka[i]), y = kb_f16_to_f32(kb[i]);
        num += (x - y) * (x - y), den += y * y;
    }
    ck_assert_msg(num / den <= 1e-6, "%s: re-roped K against K roped at the new positions: NMSE %g", archs[_i], num / den);
    TS_OK(kiln_gen_eval(a, &t, 1, &lg)); /* goes on at position 12 */
    ck_assert_int_eq(kiln_gen_pos(a), 13);
    ts_expect_status(kiln_gen_shift(a, 10, 4), KILN_ERR_INVALID, "keep 10 and discard 4 of 13 tokens");
    ts_expect_status(kiln_gen_shift(a, 0, 0), KILN_ERR_INVALID, "discard 0");
    kiln_gen_free(a);
    kiln_gen_free(b);
    kiln_model_close(m);
    free(path);
}
END_TEST

/* A byte-level BPE vocabulary: the 256 byte tokens, then the given extra texts. */
static kiln_tokenizer *vocab(const char *const *extra, int ne, int32_t eos) {
    const char **toks = calloc(256 + (size_t)ne, sizeof *toks);
    char        *store = calloc(256, 8);
    for (int b = 0; b < 256; b++) {
        km_utf8_encode(km_byte_to_cp((uint8_t)b), (uint8_t *)store + 8 * b);
        toks[b] = store + 8 * b;
    }
    for (int i = 0; i < ne; i++) toks[256 + i] = extra[i];
    kiln_tokenizer_spec spec = {.n_tokens = 256 + ne, .tokens = toks, .pre = "gpt2", .bos = -1, .eos = eos};
    kiln_tokenizer     *t = NULL;
    TS_OK(kiln_tokenizer_new(&spec, &t));
    free(toks);
    free(store);
    return t;
}

static bool has(const int32_t *ids, int64_t n, int32_t id) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* llama.cpp's texts, its fill-in-the-middle tokens, eos, and the gpt-oss rule for <|end|>. */
START_TEST(eog_set) {
    static const char *const extra[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|fim_pad|>",
                                        "<|file_sep|>", "<|im_start|>", "<|eot_id|>x", "<s>"};
    kiln_tokenizer *t = vocab(extra, 9, 256 + 8);
    int32_t        *ids;
    int64_t         n;
    TS_OK(kiln_tokenizer_eog(t, NULL, &ids, &n));
    ck_assert_int_eq(n, 7);
    for (int i = 0; i < 6; i++) ck_assert_msg(has(ids, n, 256 + i), "%s is not end of generation", extra[i]);
    ck_assert(has(ids, n, 256 + 8));                                 /* eos */
    ck_assert(!has(ids, n, 256 + 6) && !has(ids, n, 256 + 7));       /* <|im_start|>, a longer text */
    free(ids);
    kiln_tokenizer_free(t);
    /* gpt-oss: with <|return|> and <|call|>, <|end|> ends a message only. */
    static const char *const oss[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
    t = vocab(oss, 4, -1);
    TS_OK(kiln_tokenizer_eog(t, NULL, &ids, &n));
    ck_assert_int_eq(n, 2);
    ck_assert(has(ids, n, 257) && has(ids, n, 258) && !has(ids, n, 256));
    free(ids);
    kiln_tokenizer_free(t);
    ts_expect_status(kiln_tokenizer_eog(NULL, NULL, &ids, &n), KILN_ERR_INVALID, "NULL argument");
}
END_TEST

/* Runs kiln with args; its exit status, and stdout (and stderr when `both`) into *out. */
static int kiln(const char *args, bool both, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s run %s%s", ts_kiln_bin(), args, both ? "" : " 2>/dev/null");
    return ts_run(cmd, out);
}

/* The line of out that starts with `key` (its rest, up to the newline; caller frees), or NULL. */
static char *line(const char *out, const char *key) {
    const char *p = strstr(out, key);
    if (!p) return NULL;
    p += strlen(key);
    const char *e = strchr(p, '\n');
    return strndup(p, e ? (size_t)(e - p) : strlen(p));
}

/* `kiln run PATH --cpu FLAGS` is a usage error (exit 2) whose message holds want. */
static void expect_usage(const char *path, const char *flags, const char *want) {
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "%s --cpu %s", path, flags);
    ck_assert_int_eq(kiln(args, true, &out), 2);
    ck_assert_msg(strstr(out, want), "%s: no '%s' in:\n%s", flags, want, out);
    free(out);
}

/* Each flag's refusal names it. */
START_TEST(cli_refusals) {
    static const char *const cases[][2] = {
        {"--tokens 1 -r ''", "-r: the stop string is empty"},
        {"--tokens 1 -n -2", "-n -2"},
        {"--tokens 1,2,3 --min-p -0.5", "--min-p -0.5"},
        {"--tokens 1,2,3 --temp hot", "--temp hot: not a finite number"},
        {"-p Hello --chat-template nope", "unknown chat template 'nope'"},
        {"--tokens 1,2 -cnv", "--tokens does not go with -cnv"},
        {"--tokens 1,2 -sys x", "they do not go with --tokens"},
        {"--tokens 1,2 --temp 0.5 --check", "--check compares greedy picks"},
        {"--tokens 1,2,3 -n 40 -c 20", "but --n-ctx is 20 (or --context-shift)"},
        {"--tokens 1,2,3 -n 40 -c 20 --context-shift --keep -2", "--keep -2"},
    };
    char *path = tiny_model("refuse.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_usage(path, cases[i][0], cases[i][1]);
    free(path);
}
END_TEST

START_TEST(cli_stream_and_stops) {
    /* byte-level BPE, then SentencePiece (the stream adds each token's text as the whole text
     * has it: a leading space depends on the token before) */
    char *path = _i ? tiny_model_with("cli-spm.gguf", "--vocab spm") : tiny_model("cli.gguf"), args[1024], *out = NULL;
    /* The streamed text is the text of the generated ids (kiln_detokenize, checked through the
     * "prompt text" printer of the same ids given as the prompt). */
    snprintf(args, sizeof args, "%s --cpu -p 'Hello world' -n 12", path);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    char *text = line(out, "\ntext: \""), *ids = line(out, "\ngenerated: ");
    ck_assert_msg(text && ids && strstr(out, "stop: -n 12 tokens\n"), "%s", out);
    ck_assert(text[strlen(text) - 1] == '"');
    text[strlen(text) - 1] = 0;
    for (char *c = ids; *c; c++) *c = *c == ' ' ? ',' : *c;
    free(out);
    snprintf(args, sizeof args, "%s --cpu --tokens %s -n 1", path, ids);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    char *again = line(out, "prompt text: \"");
    ck_assert(again);
    again[strlen(again) - 1] = 0;
    ck_assert_str_eq(again, text);
    free(out);
    /* -r: generation stops where the string appears, the text ends before it. The string is a
     * piece of the text above, from its 4th byte (not an escaped byte). */
    char stop[8] = {0};
    memcpy(stop, text + 3, 3);
    ck_assert(!strchr(stop, '\\') && !strchr(stop, '\''));
    snprintf(args, sizeof args, "%s --cpu -p 'Hello world' -n 12 -r '%s' -r zzzz", path, stop);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    char *cut = line(out, "\ntext: \"");
    ck_assert_msg(cut && strstr(out, "(-r)\n"), "%s", out);
    ck_assert_msg(strlen(cut) == strlen(text) - strlen(strstr(text, stop)) + 1, "text '%s' cut at '%s': '%s'", text, stop, cut);
    free(cut);
    free(out);
    /* --raw: the text alone on stdout, raw. */
    snprintf(args, sizeof args, "%s --cpu -p 'Hello world' -n 12 -r '%s' --raw", path, stop);
    ck_assert_int_eq(kiln(args, false, &out), 0);
    ck_assert_int_eq(strlen(out), strstr(text, stop) - text + 1);
    ck_assert(strncmp(out, text, strlen(out) - 1) == 0 && out[strlen(out) - 1] == '\n');
    free(out);
    /* -n -1: to a full context (-c 12: 5 prompt tokens and 8 generated, the last not stored). */
    snprintf(args, sizeof args, "%s --cpu --tokens 1,2,3,4,5 -n -1 -c 12 --ignore-eos", path);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    ck_assert_msg(strstr(out, "stop: the context is full (12 tokens)\n") && strstr(out, "decode: 7 tokens"), "%s", out);
    free(out);
    /* --context-shift: 40 tokens through a context of 20 (each shift keeps the bos and --keep 2,
     * drops half the rest), the text still the text of the ids. */
    snprintf(args, sizeof args, "%s --cpu -p 'Hello world' -n 40 -c 20 --context-shift --keep 2 --ignore-eos", path);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    ck_assert_msg(strstr(out, "context shifts: 4 (each kept the first 3 tokens; 32 tokens dropped in all)\n") &&
                      strstr(out, "stop: -n 40 tokens\n"), "%s", out);
    char *sids = line(out, "\ngenerated: "), *stext = line(out, "\ntext: \"");
    int   nids = 1;
    for (const char *c = sids; *c; c++) nids += *c == ' ';
    ck_assert_int_eq(nids, 40);
    free(out);
    for (char *c = sids; *c; c++) *c = *c == ' ' ? ',' : *c;
    snprintf(args, sizeof args, "%s --cpu --tokens %s -n 1 -c 64", path, sids);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    char *stext2 = line(out, "prompt text: \"");
    ck_assert_str_eq(stext2, stext);
    free(out), free(sids), free(stext), free(stext2);
    /* --verbose-prompt lists the prompt's tokens with their texts (the BPE vocabulary's). */
    snprintf(args, sizeof args, "%s --cpu -p 'Hello world' -n 1 --verbose-prompt", path);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    ck_assert_msg(_i || (strstr(out, "number of tokens in prompt = 7\n") && strstr(out, " -> 'H'\n") &&
                         strstr(out, " -> ' wor'\n")), "%s", out);
    free(out);
    /* Sampling flags: the same seed twice, the same ids. */
    snprintf(args, sizeof args, "%s --cpu --tokens 1,2,3 -n 10 --temp 0.9 --top-k 20 -s 5", path);
    char *o1 = NULL, *o2 = NULL;
    ck_assert_int_eq(kiln(args, false, &o1), 0);
    ck_assert_int_eq(kiln(args, false, &o2), 0);
    char *g1 = line(o1, "\ngenerated: "), *g2 = line(o2, "\ngenerated: ");
    ck_assert(g1 && g2);
    ck_assert_str_eq(g1, g2);
    free(o1), free(o2), free(g1), free(g2);
    free(text);
    free(ids);
    free(again);
    free(path);
}
END_TEST

/* Chat templates on the command line: a text prompt as the user's turn (-sys, --chat-template),
 * and a conversation (kiln chat, -cnv) whose second turn evaluates only its new tokens. (Their
 * refusals: cli_refusals.) */
START_TEST(cli_chat) {
    char *path = tiny_model("chat.gguf"), args[1024], *out = NULL;
    snprintf(args, sizeof args, "%s --cpu -p Hello --chat-template chatml -n 2", path);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    ck_assert_msg(strstr(out, "chat template: chatml (--chat-template)\n") &&
                      strstr(out, "prompt text: \"<|im_start|>user\\nHello<|im_end|>\\n<|im_start|>assistant\\n\"\n"),
                  "%s", out);
    free(out);
    snprintf(args, sizeof args, "%s --cpu -p Hello -sys 'Be brief.' -n 2", path);
    ck_assert_int_eq(kiln(args, true, &out), 0);
    ck_assert_msg(strstr(out, "chat template: chatml (the model has none; choose one with --chat-template)\n") &&
                      strstr(out, "prompt text: \"<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nHello"),
                  "%s", out);
    free(out);
    /* Two turns: the replies on stdout, one line each; the second keeps the cache. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'Hello there\\nAnd again\\n' | %s chat %s --cpu -n 4 --verbose-prompt 2>%s/err.txt",
             ts_kiln_bin(), path, g_dir);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    int lines = 0;
    for (const char *c = out; *c; c++) lines += *c == '\n';
    ck_assert_msg(lines == 2, "stdout: '%s'", out);
    free(out);
    snprintf(cmd, sizeof cmd, "cat %s/err.txt", g_dir);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "turn 1: ") && strstr(out, "(the cache started over), 0 in the context before") &&
                      strstr(out, "turn 2: ") && strstr(out, "(the cache kept)"), "%s", out);
    free(out);
    /* Four turns through a context of 90: the second and later turns need --context-shift (the
     * shifted cache keeps the conversation's end, and each turn adds its text to it). */
    const char *four = "printf 'Hello there my friend\\nAnd again please tell\\nThird line here now\\nFourth\\n'";
    snprintf(cmd, sizeof cmd, "%s | %s chat %s --cpu -n 10 -c 90 --context-shift --verbose-prompt 2>&1 >/dev/null", four,
             ts_kiln_bin(), path);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "turn 4: ") && !strstr(out, "turn 4: 0 new") && strstr(out, "decode: "), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s | %s chat %s --cpu -n 10 -c 90 2>&1 >/dev/null", four, ts_kiln_bin(), path);
    ck_assert_int_eq(ts_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "more than the context of 90 (-c; --context-shift drops old turns)"), "%s", out);
    free(out);
    free(path);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

int main(void) {
    Suite *s = TS_SUITE("generate", TS_CASE_FIXTURE("generate", 120, setup, teardown),
                        TS_TESTS(stops, sampled, eog_set, cli_chat, cli_refusals), TS_LOOP(0, 2, cli_stream_and_stops),
                        TS_LOOP(0, NARCHS, context_shift));
    return ts_main(s);
}
