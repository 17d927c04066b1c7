/* Model hyperparameters: the architectures kiln builds, presets, and the checks every builder
 * relies on (docs/models.md). The graphs themselves are built in model/arch_build.c. */
#include "model/arch.h"

#include "base/base.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

const km_arch_info km_archs[KM_ARCH_COUNT] = {
    [KM_ARCH_LLAMA] = {"llama", KILN_ROPE_NORMAL, .moe_may = true},
    [KM_ARCH_QWEN2] = {"qwen2", KILN_ROPE_NEOX, .bias = true},
    [KM_ARCH_QWEN3] = {"qwen3", KILN_ROPE_NEOX, .qk_norm = true},
    [KM_ARCH_QWEN3MOE] = {"qwen3moe", KILN_ROPE_NEOX, .moe = true, .qk_norm = true},
    [KM_ARCH_GRANITE] = {"granite", KILN_ROPE_NORMAL, .scales = true},
    [KM_ARCH_SMOLLM3] = {"smollm3", KILN_ROPE_NORMAL, .nope_step = 4},
    [KM_ARCH_PHI3] = {"phi3", KILN_ROPE_NEOX, .fused = true},
    [KM_ARCH_GEMMA3] = {"gemma3", KILN_ROPE_NEOX, .qk_norm = true, .gemma = true, .swa_pattern = 6,
                        .rope_freq_base_swa = 10000.0f, .swa_rope_unscaled = true},
    [KM_ARCH_GEMMA2] = {"gemma2", KILN_ROPE_NEOX, .gemma = true, .swa_pattern = 2, .softcap = true,
                        .n_swa_default = 4096},
    [KM_ARCH_GPT_OSS] = {"gpt-oss", KILN_ROPE_NEOX, .moe = true, .bias = true, .oai = true, .swa_pattern = 2},
    [KM_ARCH_DEEPSEEK2] = {"deepseek2", KILN_ROPE_NORMAL, .moe = true, .mla = true},
};

const char *km_rope_factors(const kiln_model_hparams *hp, int64_t n_ctx) {
    switch (hp->rope_scaling) {
    case KILN_ROPE_SCALING_LLAMA3: return "rope_freqs.weight";
    case KILN_ROPE_SCALING_LONGROPE: return n_ctx > hp->rope_orig_ctx ? "rope_factors_long.weight" : "rope_factors_short.weight";
    default: return NULL;
    }
}

bool km_layer_ropes(const kiln_model_hparams *hp, int64_t il) {
    int a = km_arch_find(hp->arch);
    return a < 0 || km_archs[a].nope_step <= 0 || (il + 1) % km_archs[a].nope_step != 0;
}

bool km_layer_swa(const kiln_model_hparams *hp, int64_t il) {
    return hp->n_swa > 0 && hp->swa_pattern > 0 && il % hp->swa_pattern < hp->swa_pattern - 1;
}

/* llama.cpp architectures kiln does not build, and what each one needs that kiln lacks: the
 * refusal of such a file says so (issue 27), rather than only "unknown". */
static const struct {
    const char *name, *missing;
} unbuilt[] = {
    {"deepseek", "shared experts beside the routed ones"},
    {"gemma", "Gemma 1's graph (gemma2 and gemma3 are built)"},
    {"gemma3n", "per-layer embeddings, AltUp and LAuReL blocks"},
    {"qwen2moe", "shared experts with a sigmoid gate"},
    {"qwen3next", "gated delta-net linear attention"},
    {"llama4", "chunked attention and interleaved MoE layers"},
    {"mamba", "state-space (recurrent) layers in place of attention"},
    {"mamba2", "state-space (recurrent) layers in place of attention"},
    {"rwkv6", "recurrent (RWKV) time mixing in place of attention"},
    {"rwkv7", "recurrent (RWKV) time mixing in place of attention"},
    {"bert", "a non-causal encoder (embeddings, no KV cache)"},
    {"nomic-bert", "a non-causal encoder (embeddings, no KV cache)"},
    {"t5", "an encoder-decoder with relative position buckets"},
    {"gpt2", "LayerNorm and learned absolute positions"},
    {"phi2", "LayerNorm, parallel attention and FFN, partial rotary embeddings"},
    {"stablelm", "LayerNorm and partial rotary embeddings"},
    {"falcon", "LayerNorm and parallel attention and FFN"},
    {"command-r", "LayerNorm and parallel attention and FFN"},
    {"cohere2", "LayerNorm, parallel attention and FFN, sliding-window layers"},
    {"starcoder2", "LayerNorm and biased GELU FFNs"},
};

const char *km_arch_missing(const char *name) {
    for (size_t i = 0; name && i < sizeof unbuilt / sizeof unbuilt[0]; i++)
        if (strcmp(unbuilt[i].name, name) == 0) return unbuilt[i].missing;
    return NULL;
}

int km_arch_find(const char *name) {
    for (int a = 0; name && a < KM_ARCH_COUNT; a++)
        if (strcmp(km_archs[a].name, name) == 0) return a;
    return -1;
}

const char *km_arch_name(km_arch a) { return (unsigned)a < KM_ARCH_COUNT ? km_archs[a].name : "?"; }
const char *km_arch_list(void) { return "llama, qwen2, qwen3, qwen3moe, granite, smollm3, phi3, gemma3, gemma2, gpt-oss, deepseek2"; }

/* ---- presets -------------------------------------------------------------------------------
 * Real models: the values of their Hugging Face config.json (sources in docs/models.md). The
 * tiny ones keep every feature of their arch (GQA, QK-norm, biases, a head size that is not
 * n_embd / n_head, tied output, experts) at a few MB of weights, for tests and `make run`. */

typedef struct {
    const char        *name;
    kiln_model_hparams hp;
} preset;

#define TINY_COMMON .n_vocab = 1024, .n_ctx_train = 1024, .n_embd = 128, .n_layer = 2, .n_head = 4, \
                    .n_head_kv = 2, .n_ff = 256, .ftype = KILN_FTYPE_MOSTLY_F16

static const preset presets[] = {
    {"tiny", {.arch = "llama", TINY_COMMON, .head_dim = 32, .rms_norm_eps = 1e-5f, .rope_freq_base = 500000}},
    {"tiny", {.arch = "qwen2", TINY_COMMON, .head_dim = 32, .rms_norm_eps = 1e-6f, .rope_freq_base = 1000000,
              .attn_bias = true, .tied_output = true}},
    {"tiny", {.arch = "qwen3", TINY_COMMON, .head_dim = 64, .rms_norm_eps = 1e-6f, .rope_freq_base = 1000000,
              .qk_norm = true, .tied_output = true}},
    {"tiny", {.arch = "qwen3moe", TINY_COMMON, .head_dim = 64, .rms_norm_eps = 1e-6f, .rope_freq_base = 1000000,
              .qk_norm = true, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64, .norm_topk_prob = true}},
    {"tiny", {.arch = "granite", TINY_COMMON, .head_dim = 32, .rms_norm_eps = 1e-5f, .rope_freq_base = 10000000,
              .tied_output = true, .embedding_scale = 12.0f, .residual_scale = 0.22f, .attention_scale = 0.03125f,
              .logit_scale = 8.0f}},
    /* four layers: the last one has no rope */
    {"tiny", {.arch = "smollm3", .n_vocab = 1024, .n_ctx_train = 1024, .n_embd = 128, .n_layer = 4, .n_head = 4,
              .n_head_kv = 2, .n_ff = 256, .ftype = KILN_FTYPE_MOSTLY_F16, .head_dim = 32, .rms_norm_eps = 1e-6f,
              .rope_freq_base = 5000000, .tied_output = true}},
    /* phi3 at tiny size: fused q/k/v and gate/up, longrope factors (orig ctx 256) */
    {"tiny", {.arch = "phi3", TINY_COMMON, .head_dim = 32, .rms_norm_eps = 1e-5f, .rope_freq_base = 10000,
              .rope_scaling = KILN_ROPE_SCALING_LONGROPE, .rope_orig_ctx = 256, .rope_attn_factor = 1.1902f}},
    /* gemma3 at tiny size: six layers, the first five local (a window of 8 positions, rope base
     * 10000), the sixth global (rope base 1e6, linear scaling 8); head size 64 of 4 x 32 wide */
    {"tiny", {.arch = "gemma3", .n_vocab = 1024, .n_ctx_train = 1024, .n_embd = 128, .n_layer = 6, .n_head = 4,
              .n_head_kv = 2, .n_ff = 256, .ftype = KILN_FTYPE_MOSTLY_F16, .head_dim = 64, .rms_norm_eps = 1e-6f,
              .rope_freq_base = 1000000, .rope_scaling = KILN_ROPE_SCALING_LINEAR, .rope_factor = 8,
              .qk_norm = true, .tied_output = true, .n_swa = 8, .swa_pattern = 6, .rope_freq_base_swa = 10000,
              .query_scale = 0.125f}},
    /* gemma2 at tiny size: four layers alternating local (window 8) and global, soft caps 50 and
     * 30, head size 32 */
    {"tiny", {.arch = "gemma2", .n_vocab = 1024, .n_ctx_train = 1024, .n_embd = 128, .n_layer = 4, .n_head = 4,
              .n_head_kv = 2, .n_ff = 256, .ftype = KILN_FTYPE_MOSTLY_F16, .head_dim = 32, .rms_norm_eps = 1e-6f, .rope_freq_base = 10000,
              .tied_output = true, .n_swa = 8, .swa_pattern = 2, .rope_freq_base_swa = 10000,
              .query_scale = 0.17677669f, .attn_softcap = 50.0f, .final_softcap = 30.0f}},
    /* qwen3 at tiny size with YaRN (factor 4 over an original context of 256), as Qwen3 files
     * converted with rope_scaling yarn for long contexts */
    {"tiny-yarn", {.arch = "qwen3", TINY_COMMON, .head_dim = 64, .rms_norm_eps = 1e-6f, .rope_freq_base = 1000000,
                   .qk_norm = true, .tied_output = true, .rope_scaling = KILN_ROPE_SCALING_YARN, .rope_factor = 4,
                   .rope_orig_ctx = 256}},
    /* gpt-oss at tiny size: two layers, local (window 8) then global, YaRN 4 over 256, 4 experts
     * of 64 with biases, 2 used, sinks, separate output */
    {"tiny", {.arch = "gpt-oss", TINY_COMMON, .head_dim = 32, .rms_norm_eps = 1e-5f, .rope_freq_base = 150000,
              .rope_scaling = KILN_ROPE_SCALING_YARN, .rope_factor = 4, .rope_orig_ctx = 256, .attn_bias = true,
              .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 64, .n_swa = 8, .swa_pattern = 2,
              .rope_freq_base_swa = 150000}},
    /* deepseek2 at tiny size: MLA (4 heads of 32 + 16 rope dims over a latent of 64, V heads of
     * 32), one dense layer then two of 8 experts of 64 (2 used) and 2 shared, YaRN 4 over 256
     * with DeepSeek's log multiplier */
    {"tiny", {.arch = "deepseek2", .n_vocab = 1024, .n_ctx_train = 1024, .n_embd = 128, .n_layer = 3, .n_head = 4,
              .n_head_kv = 1, .head_dim = 48, .head_dim_v = 32, .n_rot = 16, .kv_lora_rank = 64, .n_ff = 256,
              .rms_norm_eps = 1e-6f, .rope_freq_base = 10000, .rope_scaling = KILN_ROPE_SCALING_YARN,
              .rope_factor = 4, .rope_orig_ctx = 256, .rope_yarn_log_mul = 0.707f, .n_expert = 8,
              .n_expert_used = 2, .n_ff_exp = 64, .n_expert_shared = 2, .n_layer_dense_lead = 1,
              .expert_gating = KILN_GATING_SOFTMAX, .expert_weights_scale = 1.0f, .ftype = KILN_FTYPE_MOSTLY_F16}},
    /* deepseek2 as DeepSeek-V3 builds it, at tiny size: Q through a low-rank pair, sigmoid routing
     * with a selection bias, 8 experts in 4 groups of which 2 are searched, the weights
     * renormalized and scaled by 2.5 */
    {"tiny-v3", {.arch = "deepseek2", .n_vocab = 1024, .n_ctx_train = 1024, .n_embd = 128, .n_layer = 3, .n_head = 4,
                 .n_head_kv = 1, .head_dim = 48, .head_dim_v = 32, .n_rot = 16, .kv_lora_rank = 64, .q_lora_rank = 96,
                 .n_ff = 256, .rms_norm_eps = 1e-6f, .rope_freq_base = 10000, .rope_scaling = KILN_ROPE_SCALING_YARN,
                 .rope_factor = 4, .rope_orig_ctx = 256, .rope_yarn_log_mul = 1.0f, .n_expert = 8, .n_expert_used = 2,
                 .n_ff_exp = 64, .n_expert_shared = 1, .n_layer_dense_lead = 1, .expert_gating = KILN_GATING_SIGMOID,
                 .expert_probs_bias = true, .norm_topk_prob = true, .expert_weights_scale = 2.5f,
                 .n_expert_groups = 4, .n_group_used = 2, .ftype = KILN_FTYPE_MOSTLY_F16}},
    /* meta-llama/Llama-3.2-1B: llama3 rope scaling, tied embeddings */
    {"llama-3.2-1b", {.arch = "llama", .n_vocab = 128256, .n_ctx_train = 131072, .n_embd = 2048, .n_layer = 16,
                      .n_head = 32, .n_head_kv = 8, .head_dim = 64, .n_ff = 8192, .rms_norm_eps = 1e-5f,
                      .rope_freq_base = 500000, .rope_scaling = KILN_ROPE_SCALING_LLAMA3, .rope_factor = 32,
                      .rope_low_freq_factor = 1, .rope_high_freq_factor = 4, .rope_orig_ctx = 8192,
                      .tied_output = true, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* meta-llama/Meta-Llama-3-8B: no rope scaling (that came with 3.1), separate output */
    {"llama-3-8b", {.arch = "llama", .n_vocab = 128256, .n_ctx_train = 8192, .n_embd = 4096, .n_layer = 32,
                    .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 14336, .rms_norm_eps = 1e-5f,
                    .rope_freq_base = 500000, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* meta-llama/Meta-Llama-3-70B (issue 30: tensor parallelism's model, 141 GB in bf16): 80 layers,
     * 64 heads over 8 kv heads, FFN 28672 */
    {"llama-3-70b", {.arch = "llama", .n_vocab = 128256, .n_ctx_train = 8192, .n_embd = 8192, .n_layer = 80,
                     .n_head = 64, .n_head_kv = 8, .head_dim = 128, .n_ff = 28672, .rms_norm_eps = 1e-5f,
                     .rope_freq_base = 500000, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* Qwen/Qwen3-30B-A3B: 128 experts of 768, 8 used, QK-norm, head size 128 (q: 4096 > n_embd) */
    {"qwen3-30b-a3b", {.arch = "qwen3moe", .n_vocab = 151936, .n_ctx_train = 40960, .n_embd = 2048, .n_layer = 48,
                       .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_ff = 6144, .rms_norm_eps = 1e-6f,
                       .rope_freq_base = 1000000, .qk_norm = true, .n_expert = 128, .n_expert_used = 8,
                       .n_ff_exp = 768, .norm_topk_prob = true, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* mistralai/Mistral-7B-v0.3: a llama of 32768 SentencePiece tokens, rope base 1e6, no sliding window */
    {"mistral-7b-v0.3", {.arch = "llama", .n_vocab = 32768, .n_ctx_train = 32768, .n_embd = 4096, .n_layer = 32,
                         .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 14336, .rms_norm_eps = 1e-5f,
                         .rope_freq_base = 1000000, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* mistralai/Mixtral-8x7B-v0.1: a llama whose FFNs are 8 experts of 14336, 2 used, renormalized */
    {"mixtral-8x7b", {.arch = "llama", .n_vocab = 32000, .n_ctx_train = 32768, .n_embd = 4096, .n_layer = 32,
                      .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 14336, .rms_norm_eps = 1e-5f,
                      .rope_freq_base = 1000000, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 14336,
                      .norm_topk_prob = true, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* llama with experts (Mixtral's graph) at tiny size: 4 experts of n_ff, 2 used */
    {"tiny-moe", {.arch = "llama", TINY_COMMON, .head_dim = 32, .rms_norm_eps = 1e-5f, .rope_freq_base = 1000000,
                  .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 256, .norm_topk_prob = true}},
    /* ibm-granite/granite-3.3-8b-instruct: the four multipliers, tied embeddings, rope base 1e7 */
    {"granite-3.3-8b", {.arch = "granite", .n_vocab = 49159, .n_ctx_train = 131072, .n_embd = 4096, .n_layer = 40,
                        .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 12800, .rms_norm_eps = 1e-5f,
                        .rope_freq_base = 10000000, .tied_output = true, .embedding_scale = 12.0f,
                        .residual_scale = 0.22f, .attention_scale = 0.0078125f, .logit_scale = 16.0f,
                        .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* microsoft/Phi-3.5-mini-instruct: MHA of 32 heads of 96, longrope from 4096 to 131072 (attn
     * factor sqrt(1 + ln 32 / ln 4096), as llama.cpp's converter computes it), separate output */
    {"phi-3.5-mini", {.arch = "phi3", .n_vocab = 32064, .n_ctx_train = 131072, .n_embd = 3072, .n_layer = 32,
                      .n_head = 32, .n_head_kv = 32, .head_dim = 96, .n_ff = 8192, .rms_norm_eps = 1e-5f,
                      .rope_freq_base = 10000, .rope_scaling = KILN_ROPE_SCALING_LONGROPE, .rope_orig_ctx = 4096,
                      .rope_attn_factor = 1.1902380714238083f, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* google/gemma-3-4b-it (text_config): 34 layers, 5 local (window 1024, rope base 1e4) to 1
     * global (rope base 1e6, linear scaling 8), 8 heads of 256 over 4 KV heads, q scaled by
     * 1/sqrt(256), tied embeddings of 262208 tokens */
    {"gemma-3-4b", {.arch = "gemma3", .n_vocab = 262208, .n_ctx_train = 131072, .n_embd = 2560, .n_layer = 34,
                    .n_head = 8, .n_head_kv = 4, .head_dim = 256, .n_ff = 10240, .rms_norm_eps = 1e-6f,
                    .rope_freq_base = 1000000, .rope_scaling = KILN_ROPE_SCALING_LINEAR, .rope_factor = 8,
                    .qk_norm = true, .tied_output = true, .n_swa = 1024, .swa_pattern = 6,
                    .rope_freq_base_swa = 10000, .query_scale = 0.0625f, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* google/gemma-2-9b: 42 layers alternating local (window 4096) and global, 16 heads of 256
     * over 8 KV heads, q scaled by 1/sqrt(256) (query_pre_attn_scalar), soft caps 50 and 30 */
    {"gemma-2-9b", {.arch = "gemma2", .n_vocab = 256000, .n_ctx_train = 8192, .n_embd = 3584, .n_layer = 42,
                    .n_head = 16, .n_head_kv = 8, .head_dim = 256, .n_ff = 14336, .rms_norm_eps = 1e-6f,
                    .rope_freq_base = 10000, .tied_output = true, .n_swa = 4096, .swa_pattern = 2,
                    .rope_freq_base_swa = 10000, .query_scale = 0.0625f, .attn_softcap = 50.0f,
                    .final_softcap = 30.0f, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* openai/gpt-oss-20b: 24 layers alternating local (window 128) and global, 64 heads of 64
     * over 8 KV heads with sinks, 32 experts of 2880 (4 used), YaRN 32 over 4096, rope base 150000 */
    {"gpt-oss-20b", {.arch = "gpt-oss", .n_vocab = 201088, .n_ctx_train = 131072, .n_embd = 2880, .n_layer = 24,
                     .n_head = 64, .n_head_kv = 8, .head_dim = 64, .n_ff = 2880, .rms_norm_eps = 1e-5f,
                     .rope_freq_base = 150000, .rope_scaling = KILN_ROPE_SCALING_YARN, .rope_factor = 32,
                     .rope_orig_ctx = 4096, .attn_bias = true, .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880,
                     .n_swa = 128, .swa_pattern = 2, .rope_freq_base_swa = 150000, .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* deepseek-ai/DeepSeek-V2-Lite: 27 layers, MLA of 16 heads (128 + 64 rope dims, V 128) over a
     * latent of 512, layer 0 dense (10944), then 64 experts of 1408 (6 used, softmax, not
     * renormalized) and 2 shared, YaRN 40 over 4096 with mscale_all_dim 0.707 */
    {"deepseek-v2-lite", {.arch = "deepseek2", .n_vocab = 102400, .n_ctx_train = 163840, .n_embd = 2048,
                          .n_layer = 27, .n_head = 16, .n_head_kv = 1, .head_dim = 192, .head_dim_v = 128,
                          .n_rot = 64, .kv_lora_rank = 512, .n_ff = 10944, .rms_norm_eps = 1e-6f,
                          .rope_freq_base = 10000, .rope_scaling = KILN_ROPE_SCALING_YARN, .rope_factor = 40,
                          .rope_orig_ctx = 4096, .rope_yarn_log_mul = 0.707f, .n_expert = 64, .n_expert_used = 6,
                          .n_ff_exp = 1408, .n_expert_shared = 2, .n_layer_dense_lead = 1,
                          .expert_gating = KILN_GATING_SOFTMAX, .expert_weights_scale = 1.0f,
                          .ftype = KILN_FTYPE_MOSTLY_BF16}},
    /* HuggingFaceTB/SmolLM3-3B: no rope in every 4th layer, rope base 5e6, tied embeddings */
    {"smollm3-3b", {.arch = "smollm3", .n_vocab = 128256, .n_ctx_train = 65536, .n_embd = 2048, .n_layer = 36,
                    .n_head = 16, .n_head_kv = 4, .head_dim = 128, .n_ff = 11008, .rms_norm_eps = 1e-6f,
                    .rope_freq_base = 5000000, .tied_output = true, .ftype = KILN_FTYPE_MOSTLY_BF16}},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const char *kiln_model_preset_name(int i, const char **arch) {
    if (i < 0 || i >= N_PRESETS) return NULL;
    if (arch) *arch = presets[i].hp.arch;
    return presets[i].name;
}

/* "tiny (llama, qwen2, qwen3, qwen3moe), llama-3.2-1b (llama), ..." */
static char *preset_list(void) {
    kb_str b = {0};
    for (int i = 0; i < N_PRESETS; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= strcmp(presets[j].name, presets[i].name) == 0;
        if (seen) continue;
        kb_str_addf(&b, "%s%s (", i ? ", " : "", presets[i].name);
        int n = 0;
        for (int j = i; j < N_PRESETS; j++)
            if (strcmp(presets[j].name, presets[i].name) == 0) kb_str_addf(&b, "%s%s", n++ ? ", " : "", presets[j].hp.arch);
        kb_str_add(&b, ")");
    }
    return kb_str_take(&b);
}

static kiln_status preset_error(const char *fmt, const char *a, const char *b) {
    char *list = preset_list();
    char  what[256];
    snprintf(what, sizeof what, fmt, a, b);
    kiln_status st = kb_error(KILN_ERR_INVALID, "%s; presets: %s", what, list ? list : "(out of memory)");
    free(list);
    return st;
}

kiln_status kiln_model_preset(const char *arch, const char *name, kiln_model_hparams *out) {
    if (!name || !out) return kb_error(KILN_ERR_INVALID, "kiln_model_preset: NULL argument");
    if (arch && km_arch_find(arch) < 0)
        return kb_error(KILN_ERR_INVALID, "unknown architecture '%s' (known: %s)", arch, km_arch_list());
    const preset *other = NULL;
    for (int i = 0; i < N_PRESETS; i++) {
        if (strcmp(presets[i].name, name) != 0) continue;
        if (!arch || strcmp(presets[i].hp.arch, arch) == 0) {
            *out = presets[i].hp;
            return NULL;
        }
        other = &presets[i];
    }
    if (other) return preset_error("preset '%s' is a %s model", name, other->hp.arch);
    return preset_error("unknown preset '%s'%s", name, "");
}

/* ---- weights (model/arch.h) --------------------------------------------------------------- */

const km_weight km_weights[KM_W_COUNT] = {
#define KM_W_ROW(id, nm, layer, mx, wh, nd, e0, e1, e2) \
    [KM_W_##id] = {nm, layer, KM_MIX_##mx, KM_WHEN_##wh, nd, {KM_WD_##e0, KM_WD_##e1, KM_WD_##e2}},
    KM_WEIGHTS(KM_W_ROW)
#undef KM_W_ROW
};

bool km_layer_moe(const kiln_model_hparams *hp, int64_t il) { return km_moe(hp) && il >= hp->n_layer_dense_lead; }

int64_t km_head_v(const kiln_model_hparams *hp) { return hp->head_dim_v > 0 ? hp->head_dim_v : hp->head_dim; }
int64_t km_rot(const kiln_model_hparams *hp) { return hp->n_rot > 0 ? hp->n_rot : hp->head_dim; }
int64_t km_cache_row(const kiln_model_hparams *hp) {
    return km_mla(hp) ? hp->kv_lora_rank + km_rot(hp) : hp->head_dim * hp->n_head_kv;
}

/* Whether layer il (-1: any layer) has a dense FFN, or experts. */
static bool has_dense(const kiln_model_hparams *hp, int64_t il) {
    return il >= 0 ? !km_layer_moe(hp, il) : !km_moe(hp) || hp->n_layer_dense_lead > 0;
}
static bool has_experts(const kiln_model_hparams *hp, int64_t il) {
    return il >= 0 ? km_layer_moe(hp, il) : km_moe(hp) && hp->n_layer > hp->n_layer_dense_lead;
}

bool km_weight_present(const kiln_model_hparams *hp, const km_weight *w, int64_t il) {
    int  a = km_arch_find(hp->arch);
    bool fused = a >= 0 && km_archs[a].fused;
    bool dense = has_dense(hp, il), experts = has_experts(hp, il);
    switch (w->when) {
    case KM_WHEN_ALWAYS: return true;
    case KM_WHEN_LLAMA3: return hp->rope_scaling == KILN_ROPE_SCALING_LLAMA3;
    case KM_WHEN_BIAS: return hp->attn_bias;
    case KM_WHEN_QK_NORM: return hp->qk_norm;
    case KM_WHEN_DENSE: return dense;
    case KM_WHEN_MOE: return experts;
    case KM_WHEN_UNTIED: return !hp->tied_output;
    case KM_WHEN_SPLIT: return !fused && !km_mla(hp);
    case KM_WHEN_FUSED: return fused;
    case KM_WHEN_DENSE_SPLIT: return dense && !fused;
    case KM_WHEN_DENSE_FUSED: return dense && fused;
    case KM_WHEN_LONGROPE: return hp->rope_scaling == KILN_ROPE_SCALING_LONGROPE;
    case KM_WHEN_GEMMA: return a >= 0 && km_archs[a].gemma;
    case KM_WHEN_POST_ATTN: return a >= 0 && (km_archs[a].gemma || km_archs[a].oai);
    case KM_WHEN_FFN_NORM: return a < 0 || !km_archs[a].oai;
    case KM_WHEN_OAI: return a >= 0 && km_archs[a].oai;
    case KM_WHEN_Q_PLAIN: return !fused && hp->q_lora_rank == 0;
    case KM_WHEN_Q_LORA: return hp->q_lora_rank > 0;
    case KM_WHEN_MLA: return km_mla(hp);
    case KM_WHEN_PROBS_B: return experts && hp->expert_probs_bias;
    case KM_WHEN_SHEXP: return experts && hp->n_expert_shared > 0;
    }
    return false;
}

int64_t km_wdim_value(const kiln_model_hparams *hp, km_wdim d) {
    switch (d) {
    case KM_WD_ONE: return 1;
    case KM_WD_EMBD: return hp->n_embd;
    case KM_WD_VOCAB: return hp->n_vocab;
    case KM_WD_HEAD: return hp->head_dim;
    case KM_WD_HEADS: return hp->n_head;
    case KM_WD_HALF_HEAD: return hp->head_dim / 2;
    case KM_WD_Q: return hp->head_dim * hp->n_head;
    case KM_WD_KV: return hp->head_dim * hp->n_head_kv;
    case KM_WD_FF: return hp->n_ff;
    case KM_WD_FF2: return 2 * hp->n_ff;
    case KM_WD_QKV: return hp->head_dim * (hp->n_head + 2 * hp->n_head_kv);
    case KM_WD_FF_EXP: return hp->n_ff_exp;
    case KM_WD_EXPERT: return hp->n_expert;
    case KM_WD_O: return km_head_v(hp) * hp->n_head;
    case KM_WD_Q_LORA: return hp->q_lora_rank;
    case KM_WD_KV_LORA: return hp->kv_lora_rank;
    case KM_WD_KV_A: return hp->kv_lora_rank + km_rot(hp);
    case KM_WD_NOPE: return hp->head_dim - km_rot(hp);
    case KM_WD_HEAD_V: return km_head_v(hp);
    case KM_WD_FF_SHEXP: return hp->n_ff_exp * hp->n_expert_shared;
    case KM_WD_COUNT: break;
    }
    return 0;
}

void km_weight_shape(const kiln_model_hparams *hp, const km_weight *w, int64_t ne[4]) {
    for (int d = 0; d < 4; d++) ne[d] = d < 3 && d < w->n_dims ? km_wdim_value(hp, w->ne[d]) : 1;
}

/* ---- checks --------------------------------------------------------------------------------- */

#define CHECK(cond, ...) \
    do {                                                                   \
        if (!(cond)) return kb_error(KILN_ERR_INVALID, __VA_ARGS__);       \
    } while (0)

/* Sizes go to int parameters of the builders (rope's n_dims and n_ctx_orig, layer numbers) and
 * multiply in int64 (head_dim * n_head): at most INT32_MAX each. */
#define MAX_SIZE INT32_MAX

static kiln_status check_sizes(const kiln_model_hparams *hp) {
    static const char *const names[] = {"n_vocab", "n_ctx_train", "n_embd", "n_layer", "n_head", "n_head_kv", "head_dim"};
    const int64_t v[] = {hp->n_vocab, hp->n_ctx_train, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim};
    for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++)
        CHECK(v[i] >= 1 && v[i] <= MAX_SIZE, "model: %s = %lld is out of range (1 .. %d)", names[i], (long long)v[i],
              MAX_SIZE);
    CHECK(hp->n_head % hp->n_head_kv == 0, "model: n_head_kv = %lld does not divide n_head = %lld",
          (long long)hp->n_head_kv, (long long)hp->n_head);
    CHECK(hp->head_dim % 2 == 0, "model: head_dim = %lld is odd (rope rotates pairs)", (long long)hp->head_dim);
    CHECK(hp->rms_norm_eps > 0 && isfinite(hp->rms_norm_eps), "model: rms_norm_eps = %g is not positive",
          hp->rms_norm_eps);
    CHECK(hp->rope_freq_base > 0 && isfinite(hp->rope_freq_base), "model: rope_freq_base = %g is not positive",
          hp->rope_freq_base);
    CHECK(km_ftype_known(hp->ftype), "model: ftype %d is not a file type kiln knows (%s)", (int)hp->ftype,
          kiln_ftype_list());
    return NULL;
}

static kiln_status check_rope(const kiln_model_hparams *hp) {
    switch (hp->rope_scaling) {
    case KILN_ROPE_SCALING_NONE: return NULL;
    case KILN_ROPE_SCALING_LINEAR:
        CHECK(hp->rope_factor > 0 && isfinite(hp->rope_factor), "model: rope_factor = %g is not positive (linear "
              "rope scaling)", hp->rope_factor);
        return NULL;
    case KILN_ROPE_SCALING_LLAMA3:
        CHECK(hp->rope_factor > 0 && isfinite(hp->rope_factor), "model: rope_factor = %g is not positive (llama3 "
              "rope scaling)", hp->rope_factor);
        CHECK(hp->rope_low_freq_factor > 0 && hp->rope_high_freq_factor > hp->rope_low_freq_factor &&
                  isfinite(hp->rope_high_freq_factor),
              "model: rope_low_freq_factor = %g and rope_high_freq_factor = %g: need 0 < low < high (llama3 rope "
              "scaling)", hp->rope_low_freq_factor, hp->rope_high_freq_factor);
        CHECK(hp->rope_orig_ctx >= 1 && hp->rope_orig_ctx <= MAX_SIZE, "model: rope_orig_ctx = %lld is out of range "
              "(1 .. %d; llama3 rope scaling)", (long long)hp->rope_orig_ctx, MAX_SIZE);
        return NULL;
    case KILN_ROPE_SCALING_LONGROPE:
        CHECK(hp->rope_orig_ctx >= 1 && hp->rope_orig_ctx <= MAX_SIZE, "model: rope_orig_ctx = %lld is out of range "
              "(1 .. %d; longrope scaling)", (long long)hp->rope_orig_ctx, MAX_SIZE);
        CHECK(hp->rope_attn_factor >= 0 && isfinite(hp->rope_attn_factor), "model: rope_attn_factor = %g must be "
              "finite and not negative (0: 1)", (double)hp->rope_attn_factor);
        return NULL;
    case KILN_ROPE_SCALING_YARN:
        CHECK(hp->rope_factor > 0 && isfinite(hp->rope_factor), "model: rope_factor = %g is not positive (yarn "
              "rope scaling)", hp->rope_factor);
        CHECK(hp->rope_orig_ctx >= 1 && hp->rope_orig_ctx <= MAX_SIZE, "model: rope_orig_ctx = %lld is out of range "
              "(1 .. %d; yarn rope scaling)", (long long)hp->rope_orig_ctx, MAX_SIZE);
        CHECK(hp->rope_attn_factor >= 0 && isfinite(hp->rope_attn_factor), "model: rope_attn_factor = %g must be "
              "finite and not negative (0: 1)", (double)hp->rope_attn_factor);
        return NULL;
    }
    return kb_error(KILN_ERR_INVALID, "model: rope_scaling = %d is not a kiln_rope_scaling", (int)hp->rope_scaling);
}

/* granite's multipliers (0: absent, as llama.cpp reads them; logit_scale it needs): finite, and
 * no other arch has them. */
static kiln_status check_scales(const kiln_model_hparams *hp, const km_arch_info *ai) {
    const float v[4] = {hp->embedding_scale, hp->residual_scale, hp->attention_scale, hp->logit_scale};
    static const char *const names[4] = {"embedding_scale", "residual_scale", "attention_scale", "logit_scale"};
    for (int i = 0; i < 4; i++) {
        CHECK(isfinite(v[i]) && v[i] >= 0.0f, "model: %s = %g must be finite and not negative", names[i], (double)v[i]);
        CHECK(ai->scales || v[i] == 0.0f, "model: %s = %g, but %s has no such multiplier (granite has)", names[i],
              (double)v[i], hp->arch);
    }
    CHECK(!ai->scales || hp->logit_scale > 0.0f, "model: logit_scale = %g, but %s divides the logits by it (> 0)",
          (double)hp->logit_scale, hp->arch);
    return NULL;
}

/* gemma3's window, its layer pattern and rope base, and the query scale: in range, and only on
 * an arch that has them. */
static kiln_status check_swa(const kiln_model_hparams *hp, const km_arch_info *ai) {
    CHECK(hp->n_swa >= 0 && hp->n_swa <= MAX_SIZE, "model: n_swa = %lld is out of range (0 .. %d)", (long long)hp->n_swa,
          MAX_SIZE);
    CHECK(ai->swa_pattern > 0 || hp->n_swa == 0, "model: n_swa = %lld, but %s has no sliding-window layers (gemma3 has)",
          (long long)hp->n_swa, hp->arch);
    if (hp->n_swa > 0) {
        CHECK(hp->swa_pattern >= 1 && hp->swa_pattern <= MAX_SIZE, "model: swa_pattern = %lld is out of range (1 .. %d)",
              (long long)hp->swa_pattern, MAX_SIZE);
        CHECK(hp->rope_freq_base_swa > 0 && isfinite(hp->rope_freq_base_swa), "model: rope_freq_base_swa = %g is not "
              "positive", (double)hp->rope_freq_base_swa);
    }
    CHECK(isfinite(hp->query_scale) && hp->query_scale >= 0.0f, "model: query_scale = %g must be finite and not "
          "negative", (double)hp->query_scale);
    CHECK(ai->gemma || hp->query_scale == 0.0f, "model: query_scale = %g, but %s does not scale Q (gemma3 does)",
          (double)hp->query_scale, hp->arch);
    CHECK(!ai->gemma || hp->query_scale > 0.0f, "model: query_scale = %g, but %s scales Q by it (> 0)",
          (double)hp->query_scale, hp->arch);
    const float caps[2] = {hp->attn_softcap, hp->final_softcap};
    static const char *const cap_names[2] = {"attn_softcap", "final_softcap"};
    for (int i = 0; i < 2; i++) {
        CHECK(isfinite(caps[i]) && caps[i] >= 0.0f, "model: %s = %g must be finite and not negative", cap_names[i],
              (double)caps[i]);
        CHECK(ai->softcap || caps[i] == 0.0f, "model: %s = %g, but %s has no soft-capping (gemma2 has)", cap_names[i],
              (double)caps[i], hp->arch);
    }
    return NULL;
}

/* deepseek2's latent attention and its FFN variants: in range, and only on deepseek2. */
static kiln_status check_mla(const kiln_model_hparams *hp, const km_arch_info *ai) {
    const int64_t v[] = {hp->kv_lora_rank, hp->q_lora_rank, hp->head_dim_v, hp->n_rot, hp->n_layer_dense_lead,
                         hp->n_expert_shared, hp->n_expert_groups, hp->n_group_used};
    static const char *const names[] = {"kv_lora_rank", "q_lora_rank", "head_dim_v", "n_rot", "n_layer_dense_lead",
                                        "n_expert_shared", "n_expert_groups", "n_group_used"};
    for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++) {
        CHECK(v[i] >= 0 && v[i] <= MAX_SIZE, "model: %s = %lld is out of range (0 .. %d)", names[i], (long long)v[i],
              MAX_SIZE);
        /* n_rot and head_dim_v may restate head_dim on any arch; the others are deepseek2's */
        bool same = (i == 2 || i == 3) && v[i] == hp->head_dim;
        CHECK(ai->mla || v[i] == 0 || same, "model: %s = %lld, but %s has no latent attention (deepseek2 has)",
              names[i], (long long)v[i], hp->arch);
    }
    CHECK(isfinite(hp->rope_yarn_log_mul) && hp->rope_yarn_log_mul >= 0.0f && isfinite(hp->expert_weights_scale) &&
              hp->expert_weights_scale >= 0.0f,
          "model: rope_yarn_log_mul = %g and expert_weights_scale = %g must be finite and not negative",
          (double)hp->rope_yarn_log_mul, (double)hp->expert_weights_scale);
    CHECK(ai->mla || (hp->rope_yarn_log_mul == 0.0f && hp->expert_weights_scale == 0.0f && !hp->expert_probs_bias &&
                      hp->expert_gating == KILN_GATING_DEFAULT),
          "model: rope_yarn_log_mul, expert_weights_scale, expert_probs_bias and expert_gating are deepseek2's; %s "
          "has none of them", hp->arch);
    CHECK(hp->expert_gating == KILN_GATING_DEFAULT || hp->expert_gating == KILN_GATING_SOFTMAX ||
              hp->expert_gating == KILN_GATING_SIGMOID,
          "model: expert_gating = %d is not a kiln_expert_gating (0, 1 softmax, 2 sigmoid)", (int)hp->expert_gating);
    if (!ai->mla) return NULL;
    CHECK(hp->kv_lora_rank >= 1, "model: kv_lora_rank = 0, but deepseek2 attends through a latent (llama.cpp's MLA; "
          "files without attention.key_length_mla are not supported)");
    CHECK(hp->n_head_kv == 1, "model: n_head_kv = %lld, but deepseek2's latent K/V is one head shared by all",
          (long long)hp->n_head_kv);
    CHECK(hp->n_rot >= 2 && hp->n_rot % 2 == 0 && hp->n_rot < hp->head_dim, "model: n_rot = %lld: deepseek2 ropes an "
          "even part of each head, less than head_dim = %lld", (long long)hp->n_rot, (long long)hp->head_dim);
    CHECK(hp->head_dim_v >= 1, "model: head_dim_v = 0, but deepseek2's V heads have their own size");
    CHECK(hp->n_layer_dense_lead <= hp->n_layer, "model: n_layer_dense_lead = %lld is more than n_layer = %lld",
          (long long)hp->n_layer_dense_lead, (long long)hp->n_layer);
    if (hp->n_expert_groups > 1) {
        CHECK(hp->n_expert % hp->n_expert_groups == 0 && hp->n_expert / hp->n_expert_groups >= 2,
              "model: n_expert_groups = %lld must divide n_expert = %lld into groups of 2 or more (a group is scored "
              "by its two best)", (long long)hp->n_expert_groups, (long long)hp->n_expert);
        CHECK(hp->n_group_used >= 1 && hp->n_group_used < hp->n_expert_groups &&
                  hp->n_group_used * (hp->n_expert / hp->n_expert_groups) >= hp->n_expert_used,
              "model: n_group_used = %lld must be 1 .. n_expert_groups - 1 = %lld and hold n_expert_used = %lld "
              "experts", (long long)hp->n_group_used, (long long)(hp->n_expert_groups - 1),
              (long long)hp->n_expert_used);
    }
    return NULL;
}

/* What each arch has (km_archs): llama.cpp builds qwen3 and qwen3moe with QK-norm and qwen2 with
 * Q/K/V biases always; qwen3moe has experts always, llama when the model has them (Mixtral). */
static kiln_status check_arch(const kiln_model_hparams *hp, km_arch a) {
    const km_arch_info *ai = &km_archs[a];
    CHECK(hp->qk_norm == ai->qk_norm, "model: qk_norm = %s, but %s %s QK-norm", hp->qk_norm ? "true" : "false", hp->arch,
          ai->qk_norm ? "always has" : "has no");
    CHECK(!(ai->bias && !hp->attn_bias), "model: attn_bias = false, but %s always has Q/K/V biases", hp->arch);
    CHECK(!(ai->qk_norm && hp->attn_bias), "model: attn_bias = true, but %s has no Q/K/V biases", hp->arch);
    CHECK(!(ai->oai && hp->norm_topk_prob), "model: norm_topk_prob = true, but %s softmaxes the selected logits "
          "(nothing to renormalize)", hp->arch);
    kiln_status st = check_scales(hp, ai);
    if (!st) st = check_swa(hp, ai);
    if (!st) st = check_mla(hp, ai);
    if (st) return st;
    CHECK(hp->n_expert >= 0, "model: n_expert = %lld is negative", (long long)hp->n_expert);
    CHECK(!(ai->moe && hp->n_expert == 0), "model: n_expert = 0, but every %s layer is a mixture of experts",
          hp->arch);
    CHECK(ai->moe || ai->moe_may || hp->n_expert == 0, "model: n_expert = %lld, but %s has no experts (llama has, "
          "as Mixtral)", (long long)hp->n_expert, hp->arch);
    if (!km_moe(hp) || hp->n_layer_dense_lead > 0) {
        CHECK(hp->n_ff >= 1 && hp->n_ff <= MAX_SIZE, "model: n_ff = %lld is out of range (1 .. %d)",
              (long long)hp->n_ff, MAX_SIZE);
        if (!km_moe(hp)) return NULL;
    }
    CHECK(hp->n_expert >= 1 && hp->n_expert <= 4096, "model: n_expert = %lld is out of range (1 .. 4096)",
          (long long)hp->n_expert);
    CHECK(hp->n_expert_used >= 1 && hp->n_expert_used <= hp->n_expert,
          "model: n_expert_used = %lld is out of range (1 .. n_expert = %lld)", (long long)hp->n_expert_used,
          (long long)hp->n_expert);
    CHECK(hp->n_ff_exp >= 1 && hp->n_ff_exp <= MAX_SIZE, "model: n_ff_exp = %lld is out of range (1 .. %d)",
          (long long)hp->n_ff_exp, MAX_SIZE);
    CHECK(ai->moe || hp->n_ff_exp == hp->n_ff, "model: n_ff_exp = %lld, but %s's experts are n_ff = %lld wide (as "
          "llama.cpp creates Mixtral's)", (long long)hp->n_ff_exp, hp->arch, (long long)hp->n_ff);
    return NULL;
}

kiln_status kiln_model_check(const kiln_model_hparams *hp) { return km_check(hp, true); }

kiln_status km_check(const kiln_model_hparams *hp, bool mix) {
    if (!hp) return kb_error(KILN_ERR_INVALID, "kiln_model_check: NULL argument");
    if (!memchr(hp->arch, 0, sizeof hp->arch)) return kb_error(KILN_ERR_INVALID, "model: arch is not terminated");
    int a = km_arch_find(hp->arch);
    if (a < 0) return kb_error(KILN_ERR_INVALID, "unknown architecture '%s' (known: %s)", hp->arch, km_arch_list());
    kiln_status st = check_sizes(hp);
    if (!st) st = check_rope(hp);
    if (!st) st = check_arch(hp, (km_arch)a);
    if (!st && mix) st = km_check_mix(hp);
    return st;
}

/* As llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): wavelengths shorter
 * than orig_ctx / high_freq_factor keep their frequency, longer than orig_ctx / low_freq_factor
 * are divided by factor, and the band between is interpolated smoothly. */
kiln_status kiln_model_rope_freqs(const kiln_model_hparams *hp, float *out, int64_t n) {
    kiln_status st = kiln_model_check(hp);
    if (st) return st;
    if (hp->rope_scaling != KILN_ROPE_SCALING_LLAMA3)
        return kb_error(KILN_ERR_INVALID, "rope_freqs: the model has no llama3 rope scaling");
    if (!out || n != hp->head_dim / 2)
        return kb_error(KILN_ERR_INVALID, "rope_freqs: needs head_dim / 2 = %lld values, got %lld",
                        (long long)(hp->head_dim / 2), (long long)n);
    const double pi = 3.14159265358979323846;
    double low_wavelen = (double)hp->rope_orig_ctx / hp->rope_low_freq_factor;
    double high_wavelen = (double)hp->rope_orig_ctx / hp->rope_high_freq_factor;
    for (int64_t i = 0; i < n; i++) {
        double freq = 1.0 / pow(hp->rope_freq_base, (double)(2 * i) / (double)hp->head_dim);
        double wavelen = 2 * pi / freq;
        if (wavelen < high_wavelen) out[i] = 1.0f;
        else if (wavelen > low_wavelen) out[i] = hp->rope_factor;
        else {
            double smooth = ((double)hp->rope_orig_ctx / wavelen - hp->rope_low_freq_factor) /
                            (hp->rope_high_freq_factor - hp->rope_low_freq_factor);
            out[i] = (float)(1.0 / ((1 - smooth) / hp->rope_factor + smooth));
        }
    }
    return NULL;
}
