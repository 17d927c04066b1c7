/* The model builders (model/arch.c, model/arch_build.c) and kiln gen-graph, no GPU:
 *  - every arch's tiny graph builds, prints, and parses back to the identical text;
 *  - the CPU reference evaluates it to finite logits at 1 and at 4 tokens, and the cache works:
 *    prefill 3 tokens, then decode the 4th with the states the prefill left, gives the logits
 *    of a 4-token prefill's last token; KILN_OUTPUTS_ALL's last row is KILN_OUTPUTS_LAST's row;
 *  - one layer's op sequence is examples/llama-layer.kg's (llama) and
 *    examples/qwen3moe-layer.kg's (qwen3moe with 8 experts used);
 *  - presets have the documented values; unknown arch, preset and bad hyperparameters are
 *    errors naming them;
 *  - the llama-3-8b graph (32 layers) builds and prints with every layer;
 *  - kiln_compile with skip_nvrtc of the tiny graphs succeeds with the fusions applied in every
 *    layer (rms_norm_mul, rope_set_rows, mul_mat_glu, topk_moe);
 *  - kiln gen-graph writes the graph, explains itself and refuses unknown names. */
#include "tests/support.h"

#include "base/base.h"
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const archs[] = {"llama", "qwen2",  "qwen3",  "qwen3moe", "granite",  "smollm3",
                                    "phi3",  "gemma3", "gemma2", "gpt-oss",  "deepseek2"};
#define NARCHS ((int)(sizeof archs / sizeof archs[0]))

static kiln_model_hparams preset(const char *arch, const char *name) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, name, &hp));
    return hp;
}

static kiln_ctx *build(const kiln_model_hparams *hp, int64_t n_ctx, int64_t n_tokens, kiln_model_outputs outs) {
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = n_ctx, .n_tokens_max = n_tokens, .outputs = outs};
    TS_OK(kiln_build_model(ctx, hp, &o));
    return ctx;
}

static char *print(const kiln_ctx *ctx) {
    char *text;
    TS_OK(kiln_print(ctx, &text));
    return text;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

/* ---- running a model on the CPU reference ------------------------------------------------------ */

typedef struct {
    char  name[64];
    void *data;
} ent;

typedef struct {
    ent e[512];
    int n;
} store;

static ent *store_find(store *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].name, name)) return &s->e[i];
    return NULL;
}

static void *store_set(store *s, const char *name, void *data) {
    ent *e = store_find(s, name);
    if (!e) {
        ck_assert_int_lt(s->n, 512);
        e = &s->e[s->n++];
        snprintf(e->name, sizeof e->name, "%s", name);
    } else free(e->data);
    e->data = data;
    return data;
}

static void store_free(store *s) {
    for (int i = 0; i < s->n; i++) free(s->e[i].data);
    s->n = 0;
}

typedef struct {
    const kiln_model_hparams *hp;
    kiln_model_outputs        outs;
    int                       n_past, T;
    store                     tmp;    /* inputs and weights of this run */
    store                    *states; /* KV caches, kept from run to run */
    float                    *logits;
    int64_t                   n_logits;
} run;

static uint64_t name_seed(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Weights: deterministic by name, small (norm weights near 1), so the logits stay finite. */
static void *make_weight(run *r, const char *name, kiln_type type, int64_t n) {
    void *p = calloc((size_t)n, kiln_type_size(type));
    ck_assert_ptr_nonnull(p);
    if (!strcmp(name, "rope_freqs.weight")) {
        TS_OK(kiln_model_rope_freqs(r->hp, p, n));
        return p;
    }
    kb_fill_random(p, type, n, name_seed(name));
    bool norm = strstr(name, "norm.weight") != NULL;
    for (int64_t i = 0; i < n; i++) {
        float v = kb_load_f32(p, type, i);
        kb_store_f32(p, type, i, norm ? 1.0f + 0.1f * v : 0.1f * v);
    }
    return p;
}

static void *make_input(run *r, const char *name, kiln_type type, int64_t n) {
    void *p = calloc((size_t)n, kiln_type_size(type));
    ck_assert_ptr_nonnull(p);
    int n_kv = r->n_past + r->T;
    for (int64_t i = 0; i < n; i++) {
        float v = 0;
        if (!strcmp(name, "inp_tokens")) v = (float)((7 * (r->n_past + i) + 3) % r->hp->n_vocab);
        else if (!strcmp(name, "inp_pos") || !strcmp(name, "kv_idxs")) v = (float)(r->n_past + i);
        else if (!strcmp(name, "kq_mask")) v = i % n_kv <= r->n_past + i / n_kv ? 0.0f : -INFINITY; /* causal */
        else if (!strcmp(name, "kq_mask_swa")) /* causal, and n_swa positions back at most (gemma3) */
            v = i % n_kv <= r->n_past + i / n_kv && r->n_past + i / n_kv - i % n_kv < r->hp->n_swa ? 0.0f : -INFINITY;
        else if (!strcmp(name, "inp_out_ids")) v = r->outs == KILN_OUTPUTS_LAST ? (float)(r->T - 1) : (float)i;
        else ck_abort_msg("unexpected input %s", name);
        kb_store_f32(p, type, i, v);
    }
    return p;
}

static bool is_input(const char *name) {
    static const char *const in[] = {"inp_tokens", "inp_pos", "kv_idxs", "kq_mask", "kq_mask_swa", "inp_out_ids"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(name, in[i])) return true;
    return false;
}

static const void *get(void *user, const char *name, kiln_type type, int64_t n) {
    run *r = user;
    if (!strncmp(name, "cache_", 6)) {
        ent *e = store_find(r->states, name);
        if (e) return e->data;
        return store_set(r->states, name, calloc((size_t)n, kiln_type_size(type)));
    }
    return store_set(&r->tmp, name, is_input(name) ? make_input(r, name, type, n) : make_weight(r, name, type, n));
}

static void put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    run *r = user;
    void *copy = malloc((size_t)n * kiln_type_size(type));
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, data, (size_t)n * kiln_type_size(type));
    if (!strcmp(name, "logits")) {
        ck_assert_int_eq(type, KILN_F32);
        free(r->logits);
        r->logits = copy;
        r->n_logits = n;
    } else store_set(r->states, name, copy);
}

/* Evaluates ctx's model for tokens n_past .. n_past+T-1 (cache slots alike); returns the
 * logits (caller frees), every one checked finite. */
static float *evaluate(kiln_ctx *ctx, const kiln_model_hparams *hp, kiln_model_outputs outs, int n_past, int T,
                       store *states, int64_t *n_logits) {
    const char *names[2] = {"n_tokens", "n_kv"};
    int64_t     vals[2] = {T, n_past + T};
    kiln_ctx   *bound;
    kiln_graph *g;
    TS_OK(kiln_ctx_bind(ctx, 2, names, vals, &bound));
    TS_OK(kiln_graph_new(bound, &g));
    run r = {.hp = hp, .outs = outs, .n_past = n_past, .T = T, .states = states};
    TS_OK(kiln_reference(g, get, put, &r));
    ts_graph_free(g, bound);
    store_free(&r.tmp);
    ck_assert_ptr_nonnull(r.logits);
    ck_assert_int_eq(r.n_logits, hp->n_vocab * (outs == KILN_OUTPUTS_LAST ? 1 : T));
    for (int64_t i = 0; i < r.n_logits; i++) ck_assert_msg(isfinite(r.logits[i]), "logit %lld is %g", (long long)i, r.logits[i]);
    *n_logits = r.n_logits;
    return r.logits;
}

/* max |a - b| relative to max |b| */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* prefill 4 == prefill 3 + decode 1 (through the caches); ALL's last row == LAST's row */
static void check_model(const kiln_model_hparams *hp) {
    kiln_ctx *last = build(hp, 16, 4, KILN_OUTPUTS_LAST);
    kiln_ctx *all = build(hp, 16, 4, KILN_OUTPUTS_ALL);
    store     s4 = {0}, s3 = {0}, sa = {0};
    int64_t   n;
    float *p4 = evaluate(last, hp, KILN_OUTPUTS_LAST, 0, 4, &s4, &n);
    float *p1 = evaluate(last, hp, KILN_OUTPUTS_LAST, 0, 1, &sa, &n); /* decode at an empty cache */
    float *p3 = evaluate(last, hp, KILN_OUTPUTS_LAST, 0, 3, &s3, &n);
    float *d4 = evaluate(last, hp, KILN_OUTPUTS_LAST, 3, 1, &s3, &n);
    if (getenv("ARCH_VERBOSE"))
        fprintf(stderr, "%s: decode vs prefill %g, 1 token vs 4 %g\n", hp->arch, rel_diff(d4, p4, hp->n_vocab),
                rel_diff(p1, p4, hp->n_vocab));
    ck_assert_msg(rel_diff(d4, p4, hp->n_vocab) < 1e-3, "%s: decode after prefill differs from prefill by %g",
                  hp->arch, rel_diff(d4, p4, hp->n_vocab));
    ck_assert_msg(rel_diff(p1, p4, hp->n_vocab) > 1e-3, "%s: the logits do not depend on the context", hp->arch);
    store_free(&sa);
    float *a4 = evaluate(all, hp, KILN_OUTPUTS_ALL, 0, 4, &sa, &n);
    ck_assert_msg(rel_diff(a4 + 3 * hp->n_vocab, p4, hp->n_vocab) < 1e-5, "%s: outputs all vs last", hp->arch);
    free(p4), free(p1), free(p3), free(d4), free(a4);
    store_free(&s4), store_free(&s3), store_free(&sa);
    kiln_ctx_free(last);
    kiln_ctx_free(all);
}

START_TEST(tiny_evaluates) {
    kiln_model_hparams hp = preset(archs[_i], "tiny");
    check_model(&hp);
}
END_TEST

/* llama3 rope scaling (rope_freqs.weight as the ropes' freq_factors) and linear scaling */
/* llama with experts (Mixtral's graph): the routed FFN on the CPU reference, decode after
 * prefill as prefill; the Mistral presets' values. */
START_TEST(llama_experts_evaluate) {
    kiln_model_hparams hp = preset("llama", "tiny-moe");
    check_model(&hp);
    kiln_ctx *ctx = build(&hp, 16, 4, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    ck_assert_int_eq(count(text, " = mul_mat_id("), 3 * (int)hp.n_layer);
    ck_assert_int_eq(count(text, "weight blk.0.ffn_gate_exps.weight: f16[128, 256, 4]\n"), 1);
    free(text);
    kiln_ctx_free(ctx);
    hp = preset("llama", "mixtral-8x7b");
    ck_assert(hp.n_vocab == 32000 && hp.n_expert == 8 && hp.n_expert_used == 2 && hp.n_ff_exp == 14336 &&
              hp.n_ff == 14336 && hp.rope_freq_base == 1000000 && hp.n_ctx_train == 32768 && hp.norm_topk_prob);
    hp = preset("llama", "mistral-7b-v0.3");
    ck_assert(hp.n_vocab == 32768 && hp.n_expert == 0 && hp.n_ff == 14336 && hp.n_head_kv == 8 && !hp.tied_output);
}
END_TEST

/* The sliding window of hp (8 positions in the gemma tiny presets) on the CPU reference: 6
 * tokens give the logits of a window wider than the context, 12 do not, and decode after a
 * 12-token prefill equals the 13-token prefill (the window slides in the decode step too).
 * Returns the 12-token logits (caller frees). */
static float *check_window(const kiln_model_hparams *hp) {
    kiln_model_hparams wide = *hp;
    wide.n_swa = 1000;
    kiln_ctx *ctx = build(hp, 32, 16, KILN_OUTPUTS_LAST), *wctx = build(&wide, 32, 16, KILN_OUTPUTS_LAST);
    store     s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0};
    int64_t   n, nv = hp->n_vocab;
    float *a6 = evaluate(ctx, hp, KILN_OUTPUTS_LAST, 0, 6, &s1, &n);
    float *b6 = evaluate(wctx, &wide, KILN_OUTPUTS_LAST, 0, 6, &s2, &n);
    ck_assert_msg(rel_diff(a6, b6, nv) < 1e-6, "%s: 6 tokens in a window of 8: %g", hp->arch, rel_diff(a6, b6, nv));
    float *a12 = evaluate(ctx, hp, KILN_OUTPUTS_LAST, 0, 12, &s3, &n);
    float *b12 = evaluate(wctx, &wide, KILN_OUTPUTS_LAST, 0, 12, &s4, &n);
    ck_assert_msg(rel_diff(a12, b12, nv) > 1e-3, "%s: 12 tokens: the window changes nothing", hp->arch);
    float *d13 = evaluate(ctx, hp, KILN_OUTPUTS_LAST, 12, 1, &s3, &n);
    float *p13 = evaluate(ctx, hp, KILN_OUTPUTS_LAST, 0, 13, &s5, &n);
    ck_assert_msg(rel_diff(d13, p13, nv) < 1e-3, "%s: decode after prefill: %g", hp->arch, rel_diff(d13, p13, nv));
    free(a6), free(b6), free(b12), free(d13), free(p13);
    store_free(&s1), store_free(&s2), store_free(&s3), store_free(&s4), store_free(&s5);
    kiln_ctx_free(ctx);
    kiln_ctx_free(wctx);
    return a12;
}

/* gemma3 as llama.cpp's gemma3.cpp (iswa) builds it: embeddings times sqrt(n_embd); layers
 * 0-4 of each 6 local (the window's mask, rope base 1e4 unscaled), the 6th global (the causal
 * mask, base 1e6 with linear scaling 1/8); Q times 1/sqrt(head size) after its rope and the
 * attention unscaled; a norm after attention and after the FFN; GeGLU; the window decides on
 * the CPU reference (check_window). */
START_TEST(gemma3_builds_and_slides) {
    kiln_model_hparams hp = preset("gemma3", "tiny");
    kiln_ctx *ctx = build(&hp, 32, 16, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    ck_assert_int_eq(count(text, "inp_scaled = scale(inp_embd, 11.313708, 0)\n"), 1);
    ck_assert_int_eq(count(text, "mask=kq_mask_swa,"), 5);
    ck_assert_int_eq(count(text, "mask=kq_mask,"), 1);
    ck_assert_int_eq(count(text, "freq_base=1e+04, freq_scale=1,"), 2 * 5);
    ck_assert_int_eq(count(text, "freq_base=1e+06, freq_scale=0.125,"), 2);
    ck_assert_int_eq(count(text, " = scale(Qrope."), 6);
    ck_assert_int_eq(count(text, ", scale=1, max_bias"), 6);
    ck_assert_int_eq(count(text, " = geglu(gate."), 6);
    ck_assert_int_eq(count(text, "weight blk.5.post_attention_norm.weight: f32[128]\n"), 1);
    ck_assert_int_eq(count(text, "weight blk.5.post_ffw_norm.weight: f32[128]\n"), 1);
    free(text);
    ck_assert(km_layer_swa(&hp, 0) && km_layer_swa(&hp, 4) && !km_layer_swa(&hp, 5));
    kiln_model_hparams g4 = preset("gemma3", "gemma-3-4b");
    ck_assert(km_layer_swa(&g4, 30) && !km_layer_swa(&g4, 29) && km_layer_swa(&g4, 33));
    kiln_ctx_free(ctx);
    free(check_window(&hp));
}
END_TEST

/* gemma2 as llama.cpp's gemma2-iswa.cpp: gemma3's layer without QK-norm, every other layer local
 * (window 4096 by default, 8 in the tiny preset), one rope base for all, the attention scores
 * soft-capped (flash attention's logit_softcap, 50) and the logits too (30 tanh(x / 30): |logit|
 * < 30 on the CPU reference); the window decides as in gemma3. */
START_TEST(gemma2_caps_and_slides) {
    kiln_model_hparams hp = preset("gemma2", "tiny");
    kiln_ctx *ctx = build(&hp, 32, 16, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    ck_assert_int_eq(count(text, "mask=kq_mask_swa,"), 2);
    ck_assert_int_eq(count(text, "mask=kq_mask,"), 2);
    ck_assert_int_eq(count(text, "logit_softcap=5e+01)"), 4);
    ck_assert_int_eq(count(text, "logits_div = scale(lm_head, 0.033333335, 0)\nlogits_tanh = tanh(logits_div)\n"
                                 "output logits = scale(logits_tanh, 3e+01, 0)\n"), 1);
    ck_assert_int_eq(count(text, "freq_base=1e+04, freq_scale=1,"), 2 * 4);
    ck_assert_int_eq(count(text, " = rms_norm(Q"), 0); /* no QK-norm */
    free(text);
    ck_assert(km_layer_swa(&hp, 0) && !km_layer_swa(&hp, 1) && km_layer_swa(&hp, 2));
    kiln_ctx_free(ctx);
    float *a12 = check_window(&hp);
    for (int64_t i = 0; i < hp.n_vocab; i++) ck_assert_msg(fabsf(a12[i]) < 30.0f, "logit %lld = %g", (long long)i, a12[i]);
    free(a12);
    hp = preset("gemma2", "gemma-2-9b");
    ck_assert(hp.n_vocab == 256000 && hp.n_embd == 3584 && hp.n_layer == 42 && hp.n_head == 16 && hp.n_head_kv == 8 &&
              hp.head_dim == 256 && hp.n_ff == 14336 && hp.n_swa == 4096 && hp.swa_pattern == 2 &&
              hp.attn_softcap == 50.0f && hp.final_softcap == 30.0f && hp.query_scale == 0.0625f && hp.tied_output);
}
END_TEST

/* gpt-oss as llama.cpp's openai-moe-iswa.cpp: Q/K/V and output biases, each head's sink in the
 * attention, layers alternating local and global, YaRN; the FFN norm is post_attention_norm
 * (no ffn_norm); routed experts: the router's bias, the top-k of the logits, softmax over the
 * selected (SOFTMAX_WEIGHT), a bias per expert matrix (add_id), swiglu_oai(1.702, 7). */
START_TEST(gpt_oss_graph) {
    kiln_model_hparams hp = preset("gpt-oss", "tiny");
    int       L = (int)hp.n_layer;
    kiln_ctx *ctx = build(&hp, 32, 8, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    ck_assert_int_eq(count(text, ", sinks=blk."), L);
    ck_assert_int_eq(count(text, "mask=kq_mask_swa,"), L / 2);
    ck_assert_int_eq(count(text, " = add(attn_out."), L);
    ck_assert_int_eq(count(text, " = add(moe_logits."), L);
    ck_assert_int_eq(count(text, " = argsort_top_k(moe_logits_b."), L);
    ck_assert_int_eq(count(text, " = soft_max(weights_l2."), L);
    ck_assert_int_eq(count(text, " = add_id("), 3 * L);
    ck_assert_int_eq(count(text, "swiglu_oai(gate_b."), L);
    ck_assert_int_eq(count(text, ", alpha=1.702, limit=7)"), L);
    ck_assert_int_eq(count(text, "ffn_norm.weight"), 0);
    ck_assert_int_eq(count(text, "ext_factor=1,"), 2 * L);
    free(text);
    kiln_ctx_free(ctx);
    hp = preset("gpt-oss", "gpt-oss-20b");
    ck_assert(hp.n_vocab == 201088 && hp.n_embd == 2880 && hp.n_layer == 24 && hp.n_head == 64 && hp.n_head_kv == 8 &&
              hp.head_dim == 64 && hp.n_expert == 32 && hp.n_expert_used == 4 && hp.n_ff_exp == 2880 && hp.n_swa == 128 &&
              hp.rope_scaling == KILN_ROPE_SCALING_YARN && hp.rope_factor == 32 && hp.rope_orig_ctx == 4096 &&
              hp.rope_freq_base == 150000 && !hp.tied_output && !hp.norm_topk_prob);
}
END_TEST

START_TEST(rope_scaling_evaluates) {
    kiln_model_hparams hp = preset("llama", "tiny");
    hp.rope_scaling = KILN_ROPE_SCALING_LLAMA3;
    hp.rope_factor = 8, hp.rope_low_freq_factor = 1, hp.rope_high_freq_factor = 4, hp.rope_orig_ctx = 64;
    check_model(&hp);
    kiln_ctx *ctx = build(&hp, 16, 4, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    ck_assert_int_eq(count(text, "weight rope_freqs.weight: f32[16]\n"), 1);
    ck_assert_int_eq(count(text, "freq_factors=rope_freqs.weight"), 2 * (int)hp.n_layer);
    free(text);
    kiln_ctx_free(ctx);
    hp.rope_scaling = KILN_ROPE_SCALING_LINEAR;
    hp.rope_factor = 4;
    check_model(&hp);
    ctx = build(&hp, 16, 4, KILN_OUTPUTS_LAST);
    text = print(ctx);
    ck_assert_int_eq(count(text, "freq_scale=0.25"), 2 * (int)hp.n_layer);
    free(text);
    kiln_ctx_free(ctx);
    /* YaRN (qwen3's tiny-yarn): freq_scale 1/factor, ext_factor 1, attn_factor 1 (ggml's rope
     * scales the magnitude by 1 + 0.1 ln(factor) itself), n_ctx_orig the original context */
    hp = preset("qwen3", "tiny-yarn");
    check_model(&hp);
    ctx = build(&hp, 16, 4, KILN_OUTPUTS_LAST);
    text = print(ctx);
    ck_assert_int_eq(count(text, "n_ctx_orig=256, sections=[0, 0, 0, 0], freq_base=1e+06, freq_scale=0.25, ext_factor=1, "
                                 "attn_factor=1, beta_fast=32, beta_slow=1)"), 2 * (int)hp.n_layer);
    free(text);
    kiln_ctx_free(ctx);
}
END_TEST

START_TEST(rope_freqs_llama3) {
    kiln_model_hparams hp = preset("llama", "llama-3.2-1b");
    float f[32];
    TS_OK(kiln_model_rope_freqs(&hp, f, 32));
    ck_assert_float_eq(f[0], 1.0f);   /* short wavelengths keep their frequency */
    ck_assert_float_eq(f[31], 32.0f); /* long ones are divided by the factor */
    for (int i = 1; i < 32; i++) ck_assert(f[i] >= f[i - 1]);
    kiln_status st = kiln_model_rope_freqs(&hp, f, 31);
    ck_assert_ptr_nonnull(st);
    kiln_status_free(st);
}
END_TEST

START_TEST(tiny_prints_and_parses_back) {
    kiln_model_hparams hp = preset(archs[_i], "tiny");
    kiln_ctx *ctx = build(&hp, 0, 0, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    kiln_ctx *back = ts_parse(text);
    char     *again = print(back);
    ck_assert_str_eq(text, again);
    /* the interface docs/models.md promises */
    ck_assert_int_eq(count(text, "dim n_tokens <= 512 specialize 1\n"), 1);
    ck_assert_int_eq(count(text, "dim n_kv <= 1024\n"), 1);
    ck_assert_int_eq(count(text, "input inp_tokens: i32[n_tokens]\n"), 1);
    ck_assert_int_eq(count(text, "input kq_mask: f16[n_kv, n_tokens]\n"), 1);
    ck_assert_int_eq(count(text, "input inp_out_ids: i32[1]\n"), 1);
    ck_assert_int_eq(count(text, "state cache_k_l1: f16["), 1);
    ck_assert_int_eq(count(text, km_archs[km_arch_find(archs[_i])].fused ? "weight blk.1.attn_qkv.weight: f16[128, "
                                                                         : "weight blk.1.attn_q.weight: f16[128, "), 1);
    ck_assert_int_eq(count(text, hp.tied_output ? "mul_mat(token_embd.weight, result_norm)" : "mul_mat(output.weight, result_norm)"), 1);
    ck_assert_int_eq(count(text, "output logits = "), 1);
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_tensor *logits = kiln_graph_node(g, kiln_graph_size(g) - 1);
    ck_assert_str_eq(kiln_tensor_name(logits), "logits");
    ck_assert_int_eq(kiln_tensor_ne(logits, 0), hp.n_vocab);
    ck_assert_int_eq(kiln_tensor_ne(logits, 1), 1);
    kiln_graph_free(g);
    free(text), free(again);
    kiln_ctx_free(ctx), kiln_ctx_free(back);
}
END_TEST

/* ---- node for node -------------------------------------------------------------------------------- */

/* The ops of the defs in canonical text whose name ends in suffix (NULL: all), in order. */
static char *ops_of(const char *text, const char *suffix) {
    kb_str b = {0};
    for (const char *l = text; *l;) {
        const char *nl = strchr(l, '\n'), *eq = strstr(l, " = ");
        if (!nl) nl = l + strlen(l);
        if (eq && eq < nl) {
            const char *name = !strncmp(l, "output ", 7) ? l + 7 : l;
            size_t      nlen = (size_t)(eq - name), slen = suffix ? strlen(suffix) : 0;
            if (!suffix || (nlen > slen && !strncmp(eq - slen, suffix, slen))) {
                const char *op = eq + 3, *paren = strchr(op, '(');
                kb_str_addn(&b, op, (size_t)(paren - op));
                kb_str_add(&b, " ");
            }
        }
        l = *nl ? nl + 1 : nl;
    }
    return kb_str_take(&b);
}

static void same_ops_as(const char *example, const kiln_model_hparams *hp) {
    char *path, *src, *ex_text;
    size_t len;
    ck_assert_int_ge(asprintf(&path, "%s/examples/%s", ts_src_dir(), example), 0);
    TS_OK(kb_read_file(path, &src, &len));
    kiln_ctx *ex = ts_parse(src);
    TS_OK(kiln_print(ex, &ex_text));
    kiln_ctx *ctx = build(hp, 512, 64, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    char     *want = ops_of(ex_text, NULL), *got = ops_of(text, ".0");
    ck_assert_msg(count(want, "mul_mat") >= 7, "no ops read from %s", example);
    ck_assert_str_eq(got, want);
    free(path), free(src), free(ex_text), free(text), free(want), free(got);
    kiln_ctx_free(ex), kiln_ctx_free(ctx);
}

START_TEST(llama_layer_is_the_example) {
    kiln_model_hparams hp = preset("llama", "llama-3.2-1b");
    hp.n_layer = 2, hp.n_vocab = 1000;
    same_ops_as("llama-layer.kg", &hp);
}
END_TEST

START_TEST(qwen3moe_layer_is_the_example) {
    kiln_model_hparams hp = preset("qwen3moe", "qwen3-30b-a3b");
    hp.n_layer = 2, hp.n_vocab = 1000;
    same_ops_as("qwen3moe-layer.kg", &hp);
}
END_TEST

/* ---- presets and errors ------------------------------------------------------------------------------ */

START_TEST(presets_documented) {
    kiln_model_hparams h = preset(NULL, "llama-3-8b");
    ck_assert_str_eq(h.arch, "llama");
    ck_assert(h.n_vocab == 128256 && h.n_embd == 4096 && h.n_layer == 32 && h.n_head == 32 && h.n_head_kv == 8 &&
              h.head_dim == 128 && h.n_ff == 14336 && h.n_ctx_train == 8192 && h.rope_freq_base == 500000 &&
              h.rms_norm_eps == 1e-5f && h.rope_scaling == KILN_ROPE_SCALING_NONE && !h.tied_output &&
              h.ftype == KILN_FTYPE_MOSTLY_BF16);
    h = preset("llama", "llama-3.2-1b");
    ck_assert(h.n_vocab == 128256 && h.n_embd == 2048 && h.n_layer == 16 && h.n_head == 32 && h.n_head_kv == 8 &&
              h.head_dim == 64 && h.n_ff == 8192 && h.n_ctx_train == 131072 && h.rope_freq_base == 500000 &&
              h.rope_scaling == KILN_ROPE_SCALING_LLAMA3 && h.rope_factor == 32 && h.rope_low_freq_factor == 1 &&
              h.rope_high_freq_factor == 4 && h.rope_orig_ctx == 8192 && h.tied_output);
    h = preset("qwen3moe", "qwen3-30b-a3b");
    ck_assert(h.n_vocab == 151936 && h.n_embd == 2048 && h.n_layer == 48 && h.n_head == 32 && h.n_head_kv == 4 &&
              h.head_dim == 128 && h.n_expert == 128 && h.n_expert_used == 8 && h.n_ff_exp == 768 &&
              h.n_ctx_train == 40960 && h.rope_freq_base == 1000000 && h.rms_norm_eps == 1e-6f && h.qk_norm &&
              h.norm_topk_prob && !h.tied_output);
    h = preset("phi3", "phi-3.5-mini");
    ck_assert(h.n_vocab == 32064 && h.n_embd == 3072 && h.n_layer == 32 && h.n_head == 32 && h.n_head_kv == 32 &&
              h.head_dim == 96 && h.n_ff == 8192 && h.rope_scaling == KILN_ROPE_SCALING_LONGROPE &&
              h.rope_orig_ctx == 4096 && h.n_ctx_train == 131072 && !h.tied_output &&
              fabsf(h.rope_attn_factor - sqrtf(1.0f + logf(32.0f) / logf(4096.0f))) < 1e-6f);
    h = preset("smollm3", "smollm3-3b");
    ck_assert(h.n_vocab == 128256 && h.n_embd == 2048 && h.n_layer == 36 && h.n_head == 16 && h.n_head_kv == 4 &&
              h.head_dim == 128 && h.n_ff == 11008 && h.rope_freq_base == 5000000 && h.tied_output);
    ck_assert(km_layer_ropes(&h, 0) && km_layer_ropes(&h, 2) && !km_layer_ropes(&h, 3) && !km_layer_ropes(&h, 35) &&
              km_layer_ropes(&h, 34));
    h = preset("gemma3", "gemma-3-4b");
    ck_assert(h.n_vocab == 262208 && h.n_embd == 2560 && h.n_layer == 34 && h.n_head == 8 && h.n_head_kv == 4 &&
              h.head_dim == 256 && h.n_ff == 10240 && h.rope_freq_base == 1000000 && h.rope_factor == 8 &&
              h.n_swa == 1024 && h.swa_pattern == 6 && h.rope_freq_base_swa == 10000 && h.query_scale == 0.0625f &&
              h.tied_output && h.qk_norm);
    h = preset("granite", "granite-3.3-8b");
    ck_assert(h.n_vocab == 49159 && h.n_embd == 4096 && h.n_layer == 40 && h.n_head == 32 && h.n_head_kv == 8 &&
              h.head_dim == 128 && h.n_ff == 12800 && h.rope_freq_base == 10000000 && h.tied_output &&
              h.embedding_scale == 12.0f && h.residual_scale == 0.22f && h.attention_scale == 0.0078125f &&
              h.logit_scale == 16.0f);
    for (int i = 0; i < NARCHS; i++) {
        h = preset(archs[i], "tiny");
        ck_assert_str_eq(h.arch, archs[i]);
        TS_OK(kiln_model_check(&h));
    }
    const char *name, *arch;
    int         n = 0;
    for (int i = 0; (name = kiln_model_preset_name(i, &arch)); i++) n++;
    ck_assert_int_eq(n, 27);
    h = preset("llama", "llama-3-70b");
    ck_assert(h.n_vocab == 128256 && h.n_embd == 8192 && h.n_layer == 80 && h.n_head == 64 && h.n_head_kv == 8 &&
              h.head_dim == 128 && h.n_ff == 28672 && !h.tied_output);
    h = preset("deepseek2", "deepseek-v2-lite");
    ck_assert(h.n_vocab == 102400 && h.n_embd == 2048 && h.n_layer == 27 && h.n_head == 16 && h.n_head_kv == 1 &&
              h.head_dim == 192 && h.head_dim_v == 128 && h.n_rot == 64 && h.kv_lora_rank == 512 &&
              h.q_lora_rank == 0 && h.n_ff == 10944 && h.n_expert == 64 && h.n_expert_used == 6 &&
              h.n_ff_exp == 1408 && h.n_expert_shared == 2 && h.n_layer_dense_lead == 1 && !h.norm_topk_prob &&
              h.rope_scaling == KILN_ROPE_SCALING_YARN && h.rope_factor == 40 && h.rope_orig_ctx == 4096 &&
              h.rope_yarn_log_mul == 0.707f && !h.tied_output);
}
END_TEST

static void expect_error(kiln_status st, const char *a, const char *b) {
    ck_assert_ptr_nonnull(st);
    const char *msg = kiln_status_msg(st);
    ck_assert_msg(strstr(msg, a) && (!b || strstr(msg, b)), "message '%s' lacks '%s' / '%s'", msg, a, b ? b : "");
    kiln_status_free(st);
}

static kiln_status build_bad(kiln_model_hparams hp) {
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_status st = kiln_build_model(ctx, &hp, NULL);
    kiln_ctx_free(ctx);
    return st;
}

START_TEST(errors_name_the_field) {
    kiln_model_hparams hp;
    expect_error(kiln_model_preset("gpt2", "tiny", &hp), "unknown architecture 'gpt2'", "qwen3moe");
    expect_error(kiln_model_preset("llama", "nope", &hp), "unknown preset 'nope'", "llama-3-8b (llama)");
    expect_error(kiln_model_preset("qwen3", "llama-3-8b", &hp), "preset 'llama-3-8b' is a llama model", "tiny (");
    kiln_model_hparams t = preset("llama", "tiny"), b = t;
    snprintf(b.arch, sizeof b.arch, "mamba");
    expect_error(build_bad(b), "unknown architecture 'mamba'", NULL);
    b = t, b.n_head_kv = 3;
    expect_error(build_bad(b), "n_head_kv = 3", "n_head");
    b = t, b.rope_scaling = KILN_ROPE_SCALING_YARN, b.rope_orig_ctx = 256;
    expect_error(build_bad(b), "rope_factor = 0 is not positive (yarn", NULL);
    b = t, b.ftype = (kiln_ftype)14; /* Q4_K_S: a file type kiln does not write */
    expect_error(build_bad(b), "ftype 14 is not a file type kiln knows", "q4_k_m");
    b = t, b.n_expert = 8; /* llama may have experts (Mixtral), but their routing must be whole */
    expect_error(build_bad(b), "n_expert_used = 0", "n_expert = 8");
    b = t, b.n_expert = 8, b.n_expert_used = 2, b.n_ff_exp = 64;
    expect_error(build_bad(b), "n_ff_exp = 64", "Mixtral");
    b = preset("qwen3", "tiny"), b.n_expert = 8, b.n_expert_used = 2, b.n_ff_exp = 64;
    expect_error(build_bad(b), "n_expert = 8", "has no experts");
    b = t, b.qk_norm = true;
    expect_error(build_bad(b), "qk_norm", NULL);
    b = preset("qwen2", "tiny"), b.attn_bias = false;
    expect_error(build_bad(b), "attn_bias", NULL);
    b = preset("qwen3moe", "tiny"), b.n_expert_used = 9;
    expect_error(build_bad(b), "n_expert_used = 9", NULL);
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = 8, .n_tokens_max = 16};
    expect_error(kiln_build_model(ctx, &t, &o), "n_tokens_max = 16", NULL);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- the large graph, compile ------------------------------------------------------------------------ */

/* How fast it builds is kiln bench's business, not a test's (no wall-clock assertions). */
START_TEST(llama_3_8b_builds) {
    kiln_model_hparams hp = preset("llama", "llama-3-8b");
    kiln_ctx *ctx = build(&hp, 0, 0, KILN_OUTPUTS_LAST);
    char     *text = print(ctx);
    ck_assert_int_eq(count(text, " = flash_attn_ext("), 32);
    ck_assert_int_eq(count(text, "state cache_v_l31: f16[1024, 4096]\n"), 1);
    ck_assert_int_eq(count(text, "weight blk.31.ffn_down.weight: bf16[14336, 4096]\n"), 1);
    ck_assert_int_eq(count(text, "weight output.weight: bf16[4096, 128256]\n"), 1);
    free(text);
    kiln_ctx_free(ctx);
}
END_TEST

START_TEST(tiny_compiles_fused) {
    kiln_model_hparams hp = preset(archs[_i], "tiny");
    kiln_ctx          *ctx = build(&hp, 64, 8, KILN_OUTPUTS_LAST);
    kiln_graph        *g;
    kiln_program      *p;
    kiln_compile_opts  o = {.skip_nvrtc = 1, .cache_mode = KILN_CACHE_OFF};
    TS_OK(kiln_graph_new(ctx, &g));
    TS_OK(kiln_compile(g, &o, &p));
    char *d;
    TS_OK(kiln_program_describe(p, &d));
    /* each count twice: the general program and the decode one (n_tokens = 1). The last layer's
     * FFN and the output norm see one column in both (outputs: the last token), so there
     * rms_norm_gemv takes the FFN norm (dense FFNs: its one reader is the GLU GEMV) and the
     * output norm; in the decode program also every attention norm (the q/k/v GEMV: qwen2's and
     * gpt-oss's q/k/v with their biases too, add_chain+mul_mat_cat) and every dense FFN norm. */
    int L = (int)hp.n_layer, qkn = hp.qk_norm ? 2 * L : 0;
    int post = km_archs[km_arch_find(archs[_i])].gemma ? 2 * L : 0; /* gemma3's norms after attention and FFN */
    /* deepseek2: its first layers dense, the others experts beside shared ones (one more GLU
     * each), and a norm of each layer's latent; its K rows are a concat of the latent and the
     * roped key, so no rope feeds set_rows directly */
    int M = 0;
    for (int il = 0; il < L; il++) M += km_layer_moe(&hp, il);
    int mla = km_mla(&hp), kva = mla ? L : 0, shexp = hp.n_expert_shared > 0 ? M : 0;
    int gemv_norms = 1 + !km_layer_moe(&hp, L - 1), dec_norms = L + 1 + (L - M);
    int roped = 0; /* smollm3: every 4th layer has no rope */
    for (int il = 0; il < L; il++) roped += km_layer_ropes(&hp, il);
    /* phi3: gate and up are one product, its halves the GLU's operands: mul_mat_glu's halves form
     * (its k, roped out of a view of the fused q/k/v product, still goes to the cache with
     * rope_set_rows) */
    ck_assert_int_eq(count(d, "  fused rope_set_rows:"), mla ? 0 : 2 * roped);
    ck_assert_int_eq(count(d, "  fused rms_norm_mul:"), 2 * (2 * L + 1 + qkn + post + kva) - gemv_norms - dec_norms);
    ck_assert_int_eq(count(d, "  fused rms_norm_gemv"), gemv_norms + dec_norms);
    ck_assert_int_eq(count(d, "add_chain+mul_mat_cat:"), hp.attn_bias ? 2 * L : 0);
    /* gpt-oss: the experts' biases (add_id) join the gate/up pair and the down product */
    bool oai = km_archs[km_arch_find(archs[_i])].oai;
    ck_assert_int_eq(count(d, "mul_mat_glu:"), 2 * (L + shexp));
    ck_assert_int_eq(count(d, "  fused mul_mat_id_bias:"), oai ? 2 * L : 0);
    ck_assert_int_eq(count(d, "  fused topk_moe:"), 2 * M);
    if (mla) ck_assert_int_eq(count(d, "mul_mat_cat:"), 2 * L); /* q (or q_a) beside the latent's product */
    ck_assert_int_gt(kiln_program_kernel_count(p), 0);
    free(d);
    ts_compiled_free(p, g, ctx);
}
END_TEST

/* ---- the command ---------------------------------------------------------------------------------------- */

static int kiln(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s", ts_src_dir(),
             ts_kiln_bin()[0] == '/' ? ts_kiln_bin() : "build/kiln", args);
    return ts_run(cmd, out);
}

START_TEST(cli_gen_graph) {
    char *out, *dir = ts_tmpdir(), args[1024];
    ck_assert_int_eq(kiln("gen-graph --arch qwen3moe --preset tiny --n-ctx 64 --n-tokens 8", &out), 0);
    ck_assert(!strncmp(out, "kiln-graph 1\ndim n_tokens <= 8 specialize 1\ndim n_kv <= 64\n", 55));
    kiln_ctx *ctx = ts_parse(out);
    kiln_ctx_free(ctx);
    free(out);
    /* a decode-only graph: n_tokens can only be 1, a static extent (it failed in a reshape) */
    ck_assert_int_eq(kiln("gen-graph --arch llama --preset tiny --n-ctx 64 --n-tokens 1", &out), 0);
    const char *head = "kiln-graph 1\ndim n_tokens <= 1\ndim n_kv <= 64\ninput inp_tokens: i32[1]\n";
    ck_assert(!strncmp(out, head, strlen(head)));
    ctx = ts_parse(out);
    kiln_ctx_free(ctx);
    free(out);
    snprintf(args, sizeof args, "gen-graph --arch llama --preset tiny --outputs all -o '%s/m.kg' && grep -c "
             "'input inp_out_ids: i32\\[n_tokens\\]' '%s/m.kg'", dir, dir);
    ck_assert_int_eq(kiln(args, &out), 0);
    ck_assert_str_eq(out, "1\n");
    free(out);
    ck_assert_int_eq(kiln("help gen-graph", &out), 0);
    ck_assert(strstr(out, "--preset NAME") && strstr(out, "llama-3-8b") && strstr(out, "qwen3-30b-a3b"));
    free(out);
    ck_assert_int_eq(kiln("gen-graph --help", &out), 0);
    free(out);
    ck_assert_int_eq(kiln("help", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "gen-graph"));
    free(out);
    ck_assert_int_eq(kiln("gen-graph --arch gpt2 --preset tiny", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "unknown architecture 'gpt2' (known: llama, qwen2, qwen3, qwen3moe, granite, smollm3, phi3, gemma3, gemma2, gpt-oss, deepseek2)"));
    free(out);
    ck_assert_int_eq(kiln("gen-graph --arch llama --preset huge", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "unknown preset 'huge'; presets: tiny (llama, qwen2, qwen3, qwen3moe, granite, smollm3, phi3, gemma3, gemma2, gpt-oss, deepseek2)"));
    free(out);
    ck_assert_int_eq(kiln("gen-graph --arch llama", &out), 2);
    free(out);
    ck_assert_int_eq(kiln("gen-graph --preset tiny --n-ctx zero", &out), 2);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("arch",
                        TS_CASE("arch", 120), TS_LOOP(0, NARCHS, tiny_prints_and_parses_back, tiny_evaluates),
                        TS_TESTS(llama_experts_evaluate, gemma3_builds_and_slides, gemma2_caps_and_slides, gpt_oss_graph, rope_scaling_evaluates, rope_freqs_llama3, llama_layer_is_the_example,
                                 qwen3moe_layer_is_the_example, presets_documented, errors_name_the_field,
                                 llama_3_8b_builds),
                        TS_LOOP(0, NARCHS, tiny_compiles_fused), TS_TESTS(cli_gen_graph));
    return ts_main(s);
}
