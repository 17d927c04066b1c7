/* model/ internals of the model builders (model/arch.c, model/arch_build.c) and the GGUF checks
 * (model/hparams.c): the architectures kiln builds and the weights they have. Prefix km_. */
#ifndef KILN_MODEL_ARCH_H
#define KILN_MODEL_ARCH_H

#include "kiln.h"

typedef enum {
    KM_ARCH_LLAMA,
    KM_ARCH_QWEN2,
    KM_ARCH_QWEN3,
    KM_ARCH_QWEN3MOE,
    KM_ARCH_GRANITE,
    KM_ARCH_SMOLLM3,
    KM_ARCH_PHI3,
    KM_ARCH_GEMMA3,
    KM_ARCH_GEMMA2,
    KM_ARCH_GPT_OSS,
    KM_ARCH_DEEPSEEK2,
    KM_ARCH_COUNT
} km_arch;

/* What an architecture's graph has, as llama.cpp builds it (src/models/ARCH.cpp): the one table
 * the builder, the GGUF reader and the checks ask. */
typedef struct {
    const char *name;
    int         rope_mode; /* KILN_ROPE_NORMAL (llama's adjacent pairs) or KILN_ROPE_NEOX */
    bool        moe;       /* routed experts in every layer, no dense FFN, always */
    bool        moe_may;   /* experts when the model has them (llama: Mixtral), else dense */
    bool        qk_norm;   /* an RMS norm of each Q and K head, always */
    bool        bias;      /* Q/K/V biases, always (llama: when the file has them) */
    bool        scales;    /* granite's multipliers: embedding, residual, attention, logits */
    bool        fused;     /* phi3: q/k/v in one matrix (attn_qkv), gate and up in one (ffn_up),
                              and q scaled by 1/sqrt(head size) before attention */
    int         nope_step; /* > 0: layers il with (il + 1) % nope_step == 0 have no rope (smollm3:
                              4, a constant of llama.cpp's loader, no GGUF key) */
    bool        gemma;     /* gemma3: embeddings times sqrt(n_embd), Q scaled by query_scale
                              after its rope (attention unscaled), a norm after attention and
                              after the FFN (post_attention_norm, post_ffw_norm), GeGLU */
    int         swa_pattern; /* the sliding-window layer pattern a file with a window gets
                                (gemma3: 6, gemma2: 2; llama.cpp's set_swa_pattern), and its base
                                (0: the file's rope base): */
    float       rope_freq_base_swa;
    bool        softcap;   /* gemma2: attention and final logit soft-capping */
    bool        oai;       /* gpt-oss: an output-projection bias, attention sinks, the FFN norm
                              named post_attention_norm, routed experts with biases (router and
                              each expert matrix, add_id), softmax over the selected logits,
                              swiglu_oai (alpha 1.702, limit 7) */
    bool        swa_rope_unscaled; /* gemma3: the local layers rope without the file's scaling */
    int64_t     n_swa_default; /* gemma2: the window when the file has none (4096) */
    bool        mla;       /* deepseek2: multi-head latent attention (hp->kv_lora_rank), leading
                              dense layers, shared experts, a YaRN rope of unit magnitude with
                              the attention scaled instead (rope_yarn_log_mul) */
} km_arch_info;
extern const km_arch_info km_archs[KM_ARCH_COUNT];

/* The arch named name, or -1. */
int         km_arch_find(const char *name);
/* For a llama.cpp architecture kiln does not build: what it needs that kiln lacks, else NULL. */
const char *km_arch_missing(const char *name);
const char *km_arch_name(km_arch a);
/* "llama, qwen2, qwen3, qwen3moe, granite, smollm3, phi3", for messages. */
const char *km_arch_list(void);
/* The rope of the architecture of hp (arch_build.c's; also the context shift's re-rope, gen.c):
 * x rotated by positions pos, freqs the llama3 factors or NULL. */
/* gen.c for model/batch.c: a generator whose program keeps every row's logits and argmax
 * (outputs ALL, no sampler), whose inputs the caller places itself (tokens, positions, cache slots,
 * each row's key interval and the order of the output rows, up to n_batch rows) before
 * km_gen_rows_run, which reads back the first n_read rows of that order: their logits (n_vocab
 * each, owned by g) or argmax. Its masks are key intervals (kiln_build_opts' mask_intervals):
 * row t sees the cells iv[2t] <= j < iv[2t + 1]. */
typedef struct {
    int32_t *tokens, *positions;
    int64_t *slots;
    int32_t *iv, *iv_swa; /* iv_swa NULL without sliding-window layers */
    int32_t *out_ids;     /* output row r is token out_ids[r]: the rows wanted first */
    int64_t  n_batch;
} km_gen_inputs;
kiln_status   km_gen_new_rows(const kiln_model *m, const kiln_gen_opts *o, kiln_gen **out);
/* The key interval iv[0] <= j < iv[1] of the token at position p of a sequence whose position 0
 * is cell base: its cells up to p, and with window > 0 (sliding-window layers, llama.cpp's
 * is_masked_swa) only the last `window` of them. */
static inline void km_key_interval(int32_t *iv, int64_t base, int64_t p, int64_t window) {
    iv[0] = (int32_t)(base + (window > 0 && p - window + 1 > 0 ? p - window + 1 : 0));
    iv[1] = (int32_t)(base + p + 1);
}
km_gen_inputs km_gen_rows_inputs(kiln_gen *g);
/* picks non-NULL: only each row's argmax is read back (on the GPU the program's argmax output,
 * 4 bytes a row instead of n_vocab floats), into *picks; logits may then be NULL. */
kiln_status   km_gen_rows_run(kiln_gen *g, int64_t nt, int64_t nkv, int64_t n_read, const float **logits,
                              const int32_t **picks);
/* gen.c, for tests: a CPU generator's cache state `name` (its bytes in *bytes), or NULL. */
const void *km_gen_cpu_state(const kiln_gen *g, const char *name, size_t *bytes);
/* The rope's per-frequency factors of a model of hp with a cache of n_ctx rows: the weight's
 * name (llama3: rope_freqs; longrope: the long factors past rope_orig_ctx, else the short ones,
 * as llama.cpp's get_rope_factors), or NULL. */
const char *km_rope_factors(const kiln_model_hparams *hp, int64_t n_ctx);
/* Whether the FFNs of a model of hp are routed experts (n_expert > 0). */
static inline bool km_moe(const kiln_model_hparams *hp) { return hp->n_expert > 0; }
/* Whether layer il of a model of hp ropes its Q and K (the cache shift re-ropes those only). */
bool km_layer_ropes(const kiln_model_hparams *hp, int64_t il);
/* Whether layer il of a model of hp attends through the sliding window (hp->n_swa). */
bool km_layer_swa(const kiln_model_hparams *hp, int64_t il);
kiln_tensor *km_arch_rope(kiln_ctx *ctx, const kiln_model_hparams *hp, kiln_tensor *x, kiln_tensor *pos,
                          kiln_tensor *freqs);
/* km_arch_rope of layer il: a sliding-window layer ropes with rope_freq_base_swa, unscaled. */
kiln_tensor *km_layer_rope(kiln_ctx *ctx, const kiln_model_hparams *hp, int64_t il, kiln_tensor *x, kiln_tensor *pos,
                           kiln_tensor *freqs);

/* ---- the weights --------------------------------------------------------------------------
 * Every weight a model may have, named and shaped as llama.cpp's load_arch_tensors creates
 * them: the one list that the builder (model/arch_build.c) creates its weights from and that
 * a GGUF's tensors are checked against before anything is built (model/hparams.c). In file
 * order: the builder creates them in this order too.
 *
 * X(id, name, in each layer (blk.N.name), mix (the weight's part in the file type's mix of
 * types, km_mix below; F32: never quantized), when, n_dims, ne0, ne1, ne2) with the extents in
 * the KM_WD_ terms below. */
#define KM_WEIGHTS(X)                                                                               \
    X(TOKEN_EMBD, "token_embd.weight", 0, EMBD, ALWAYS, 2, EMBD, VOCAB, ONE)                      \
    X(ROPE_FREQS, "rope_freqs.weight", 0, F32, LLAMA3, 1, HALF_HEAD, ONE, ONE)                     \
    X(ROPE_FACTORS_LONG, "rope_factors_long.weight", 0, F32, LONGROPE, 1, HALF_HEAD, ONE, ONE)     \
    X(ROPE_FACTORS_SHORT, "rope_factors_short.weight", 0, F32, LONGROPE, 1, HALF_HEAD, ONE, ONE)   \
    X(ATTN_NORM, "attn_norm.weight", 1, F32, ALWAYS, 1, EMBD, ONE, ONE)                            \
    X(ATTN_QKV, "attn_qkv.weight", 1, ATTN_QKV, FUSED, 2, EMBD, QKV, ONE)                           \
    /* deepseek2's Q through a low-rank pair when q_lora_rank (V2 and V3; Lite has attn_q) */       \
    X(ATTN_Q_A_NORM, "attn_q_a_norm.weight", 1, F32, Q_LORA, 1, Q_LORA, ONE, ONE)                   \
    X(ATTN_KV_A_NORM, "attn_kv_a_norm.weight", 1, F32, MLA, 1, KV_LORA, ONE, ONE)                   \
    X(ATTN_Q_A, "attn_q_a.weight", 1, MATRIX, Q_LORA, 2, EMBD, Q_LORA, ONE)                         \
    X(ATTN_Q_B, "attn_q_b.weight", 1, MATRIX, Q_LORA, 2, Q_LORA, Q, ONE)                            \
    X(ATTN_Q, "attn_q.weight", 1, MATRIX, Q_PLAIN, 2, EMBD, Q, ONE)                                 \
    X(ATTN_K, "attn_k.weight", 1, ATTN_K, SPLIT, 2, EMBD, KV, ONE)                                  \
    X(ATTN_V, "attn_v.weight", 1, ATTN_V, SPLIT, 2, EMBD, KV, ONE)                                  \
    /* deepseek2's MLA: the latent and the shared rope key, then per head the latent's K (nope    \
     * part, absorbed into Q) and V maps */                                                        \
    X(ATTN_KV_A_MQA, "attn_kv_a_mqa.weight", 1, MATRIX, MLA, 2, EMBD, KV_A, ONE)                    \
    X(ATTN_K_B, "attn_k_b.weight", 1, MATRIX, MLA, 3, NOPE, KV_LORA, HEADS)                         \
    X(ATTN_V_B, "attn_v_b.weight", 1, MATRIX, MLA, 3, KV_LORA, HEAD_V, HEADS)                       \
    X(ATTN_Q_BIAS, "attn_q.bias", 1, F32, BIAS, 1, Q, ONE, ONE)                                    \
    X(ATTN_K_BIAS, "attn_k.bias", 1, F32, BIAS, 1, KV, ONE, ONE)                                   \
    X(ATTN_V_BIAS, "attn_v.bias", 1, F32, BIAS, 1, KV, ONE, ONE)                                   \
    X(ATTN_Q_NORM, "attn_q_norm.weight", 1, F32, QK_NORM, 1, HEAD, ONE, ONE)                       \
    X(ATTN_K_NORM, "attn_k_norm.weight", 1, F32, QK_NORM, 1, HEAD, ONE, ONE)                       \
    X(ATTN_OUT, "attn_output.weight", 1, ATTN_OUT, ALWAYS, 2, O, EMBD, ONE)                           \
    X(ATTN_OUT_BIAS, "attn_output.bias", 1, F32, OAI, 1, EMBD, ONE, ONE)                              \
    X(ATTN_SINKS, "attn_sinks.weight", 1, F32, OAI, 1, HEADS, ONE, ONE)                               \
    /* gemma2/3: a norm of the attention output; gpt-oss: the FFN's input norm by this name */      \
    X(ATTN_POST_NORM, "post_attention_norm.weight", 1, F32, POST_ATTN, 1, EMBD, ONE, ONE)           \
    X(FFN_NORM, "ffn_norm.weight", 1, F32, FFN_NORM, 1, EMBD, ONE, ONE)                            \
    X(FFN_GATE, "ffn_gate.weight", 1, MATRIX, DENSE_SPLIT, 2, EMBD, FF, ONE)                        \
    X(FFN_UP, "ffn_up.weight", 1, MATRIX, DENSE_SPLIT, 2, EMBD, FF, ONE)                            \
    /* phi3: gate and up in one matrix, the gate's rows first (ggml_swiglu splits it) */           \
    X(FFN_UP_GATE, "ffn_up.weight", 1, MATRIX, DENSE_FUSED, 2, EMBD, FF2, ONE)                      \
    X(FFN_DOWN, "ffn_down.weight", 1, FFN_DOWN, DENSE, 2, FF, EMBD, ONE)                              \
    X(FFN_POST_NORM, "post_ffw_norm.weight", 1, F32, GEMMA, 1, EMBD, ONE, ONE)                      \
    /* the router stays f32 in GGUF files (llama.cpp's converter keeps ffn_gate_inp in f32) */     \
    X(FFN_GATE_INP, "ffn_gate_inp.weight", 1, F32, MOE, 2, EMBD, EXPERT, ONE)                      \
    X(FFN_GATE_EXPS, "ffn_gate_exps.weight", 1, MATRIX, MOE, 3, EMBD, FF_EXP, EXPERT)               \
    X(FFN_UP_EXPS, "ffn_up_exps.weight", 1, MATRIX, MOE, 3, EMBD, FF_EXP, EXPERT)                   \
    X(FFN_DOWN_EXPS, "ffn_down_exps.weight", 1, FFN_DOWN, MOE, 3, FF_EXP, EMBD, EXPERT)               \
    X(FFN_GATE_INP_BIAS, "ffn_gate_inp.bias", 1, F32, OAI, 1, EXPERT, ONE, ONE)                       \
    X(FFN_GATE_EXPS_BIAS, "ffn_gate_exps.bias", 1, F32, OAI, 2, FF_EXP, EXPERT, ONE)                  \
    X(FFN_UP_EXPS_BIAS, "ffn_up_exps.bias", 1, F32, OAI, 2, FF_EXP, EXPERT, ONE)                      \
    X(FFN_DOWN_EXPS_BIAS, "ffn_down_exps.bias", 1, F32, OAI, 2, EMBD, EXPERT, ONE)                    \
    /* deepseek2: the selection bias (V3's e_score_correction_bias), the shared experts */          \
    X(FFN_EXP_PROBS_B, "exp_probs_b.bias", 1, F32, PROBS_B, 1, EXPERT, ONE, ONE)                    \
    X(FFN_GATE_SHEXP, "ffn_gate_shexp.weight", 1, MATRIX, SHEXP, 2, EMBD, FF_SHEXP, ONE)            \
    X(FFN_UP_SHEXP, "ffn_up_shexp.weight", 1, MATRIX, SHEXP, 2, EMBD, FF_SHEXP, ONE)                \
    X(FFN_DOWN_SHEXP, "ffn_down_shexp.weight", 1, FFN_DOWN, SHEXP, 2, FF_SHEXP, EMBD, ONE)          \
    X(OUTPUT_NORM, "output_norm.weight", 0, F32, ALWAYS, 1, EMBD, ONE, ONE)                        \
    X(OUTPUT, "output.weight", 0, OUTPUT, UNTIED, 2, EMBD, VOCAB, ONE)

typedef enum {
#define KM_W_ENUM(id, ...) KM_W_##id,
    KM_WEIGHTS(KM_W_ENUM)
#undef KM_W_ENUM
    KM_W_COUNT
} km_weight_id;

/* The extents weights have, from the hyperparameters. */
typedef enum {
    KM_WD_ONE,
    KM_WD_EMBD,      /* n_embd */
    KM_WD_VOCAB,     /* n_vocab */
    KM_WD_HEAD,      /* head_dim */
    KM_WD_HEADS,     /* n_head (gpt-oss's sinks) */
    KM_WD_HALF_HEAD, /* head_dim / 2 */
    KM_WD_Q,         /* head_dim * n_head */
    KM_WD_KV,        /* head_dim * n_head_kv */
    KM_WD_FF,        /* n_ff */
    KM_WD_FF2,       /* 2 n_ff (phi3's gate and up together) */
    KM_WD_QKV,       /* head_dim * (n_head + 2 n_head_kv) (phi3's q, k and v together) */
    KM_WD_FF_EXP,    /* n_ff_exp */
    KM_WD_EXPERT,    /* n_expert */
    KM_WD_O,         /* head_dim_v * n_head: the attention output's width */
    KM_WD_Q_LORA,    /* q_lora_rank */
    KM_WD_KV_LORA,   /* kv_lora_rank */
    KM_WD_KV_A,      /* kv_lora_rank + n_rot: the latent and the shared rope key */
    KM_WD_NOPE,      /* head_dim - n_rot: a head's part without rope */
    KM_WD_HEAD_V,    /* head_dim_v */
    KM_WD_FF_SHEXP,  /* n_ff_exp * n_expert_shared */
    KM_WD_COUNT
} km_wdim;

/* When a model has a weight. */
typedef enum {
    KM_WHEN_ALWAYS,
    KM_WHEN_LLAMA3,  /* llama3 rope scaling */
    KM_WHEN_BIAS,    /* attn_bias */
    KM_WHEN_QK_NORM, /* qk_norm */
    KM_WHEN_DENSE,   /* a dense FFN in each layer (not qwen3moe) */
    KM_WHEN_MOE,     /* experts (qwen3moe) */
    KM_WHEN_UNTIED,  /* not tied_output */
    KM_WHEN_SPLIT,   /* q, k and v apart (not phi3) */
    KM_WHEN_FUSED,   /* phi3's q/k/v in one matrix */
    KM_WHEN_DENSE_SPLIT, /* a dense FFN with gate and up apart */
    KM_WHEN_DENSE_FUSED, /* phi3's dense FFN: gate and up in one matrix */
    KM_WHEN_LONGROPE, /* longrope scaling (phi3) */
    KM_WHEN_GEMMA,    /* gemma2/3's norm after the FFN */
    KM_WHEN_POST_ATTN, /* gemma2/3's norm after attention; gpt-oss's FFN norm */
    KM_WHEN_FFN_NORM, /* ffn_norm: every arch but gpt-oss */
    KM_WHEN_OAI,      /* gpt-oss's biases and sinks */
    KM_WHEN_Q_PLAIN,  /* attn_q: q apart, not through deepseek2's q_lora pair */
    KM_WHEN_Q_LORA,   /* deepseek2 with q_lora_rank */
    KM_WHEN_MLA,      /* deepseek2's latent attention */
    KM_WHEN_PROBS_B,  /* expert_probs_bias */
    KM_WHEN_SHEXP,    /* shared experts in an expert layer */
} km_when;

/* A weight's part in the mix of types of a file type (model/ftype.c): the rules of
 * llama-quantize's llama_tensor_get_type name these tensors. */
typedef enum {
    KM_MIX_F32,      /* norms, biases, the router, rope_freqs: never quantized, always f32 */
    KM_MIX_MATRIX,   /* attn_q, ffn_gate, ffn_up (and the experts'): the file type's base type */
    KM_MIX_EMBD,     /* token_embd: the base type, or the output's when the output is tied */
    KM_MIX_OUTPUT,   /* output.weight */
    KM_MIX_ATTN_K,
    KM_MIX_ATTN_V,
    KM_MIX_ATTN_OUT,
    KM_MIX_FFN_DOWN, /* ffn_down and ffn_down_exps */
    KM_MIX_ATTN_QKV, /* attn_qkv (phi3) */
} km_mix;

typedef struct {
    const char *name;     /* GGUF's name; in a layer, what follows "blk.N." */
    bool        in_layer;
    km_mix      mix;
    km_when     when;
    int         n_dims;
    km_wdim      ne[3];
} km_weight;

extern const km_weight km_weights[KM_W_COUNT];

/* Whether a model of hp (checked by kiln_model_check) has weight w in layer il (-1: outside the
 * layers, or for a layer's weight in any layer: deepseek2's first layers are dense, the others
 * experts). */
bool km_weight_present(const kiln_model_hparams *hp, const km_weight *w, int64_t il);
/* Whether layer il's FFN is routed experts (deepseek2: not its n_layer_dense_lead first). */
bool km_layer_moe(const kiln_model_hparams *hp, int64_t il);
/* The sizes llama.cpp derives: a V head (head_dim_v, else head_dim), the rotary dims (n_rot, else
 * head_dim), and a KV cache row per token (MLA: the latent and the rope key; else a K or V head
 * per kv head). MLA caches K only: V is the first kv_lora_rank values of each K row. */
int64_t km_head_v(const kiln_model_hparams *hp);
int64_t km_rot(const kiln_model_hparams *hp);
int64_t km_cache_row(const kiln_model_hparams *hp);
static inline bool km_mla(const kiln_model_hparams *hp) { return hp->kv_lora_rank > 0; }
/* The value of extent d for hp. */
int64_t km_wdim_value(const kiln_model_hparams *hp, km_wdim d);
/* w's extents for hp (ne: 4, trailing 1s). */
void km_weight_shape(const kiln_model_hparams *hp, const km_weight *w, int64_t ne[4]);

/* ---- tensor parallelism, the plan (model/tp.c; issue 30) ------------------------------------
 * How a model's weights split over g GPUs, Megatron-style: an extent counted in heads, FFN
 * columns, expert FFN columns or vocabulary rows is cut in g (km_tp_sharded), every other one is
 * whole on each rank. */
bool        km_tp_sharded(km_wdim d);
/* NULL when a model of hp splits over g GPUs (heads, kv heads, FFN columns each a multiple of
 * g; the vocabulary is padded: km_tp_vocab_share), else an error naming the hyperparameter. */
kiln_status km_tp_check(const kiln_model_hparams *hp, int g);
/* The dim of w cut across the ranks, or -1 (whole on every rank). */
int         km_tp_split_dim(const km_weight *w);
/* Whether w's product is a partial sum on each rank (its input extent cut: attn_output, the
 * FFN downs), all-reduced after. */
bool        km_tp_row_parallel(const km_weight *w);
/* A rank's vocabulary rows: ceil(n_vocab / g), the last rank's padded with zero rows (as
 * Megatron pads the vocabulary) when g does not divide n_vocab; rank r holds tokens r·share ..
 * (the last rank's real rows: n_vocab - (g - 1)·share). */
int64_t     km_tp_vocab_share(const kiln_model_hparams *hp, int g);
/* w's extents on one rank of g. */
void        km_tp_rank_shape(const kiln_model_hparams *hp, const km_weight *w, int g, int64_t ne[4]);
/* NULL when w in type t still has whole blocks in each rank's rows (a row-parallel weight's rows
 * are cut), else an error naming the weight, its rank width and the block. */
kiln_status km_tp_check_type(const kiln_model_hparams *hp, const km_weight *w, int g, kiln_type t);
/* Rank `rank`'s bytes of w (in type t) as byte ranges of the file's tensor: range i of
 * km_tp_slice_count at *off, *len bytes; their concatenation is the rank's tensor (model/tp.c). */
int64_t     km_tp_slice_count(const kiln_model_hparams *hp, const km_weight *w, int g);
void        km_tp_slice(const kiln_model_hparams *hp, const km_weight *w, int g, int rank, kiln_type t, int64_t i,
                        int64_t *off, int64_t *len);

/* Rank `rank` of g's bytes of model weight `name` (blk.N.X or X) in type t: *data points into
 * the model's data when the rank's share is one range, else at *own, the ranges copied in order
 * (the caller frees *own). KILN_ERR_NOT_FOUND naming the weight when the model lacks it. */
kiln_status km_tp_weight_data(const kiln_model *m, const char *name, kiln_type t, int g, int rank, const void **data,
                              void **own);

/* kiln_gen over the ranks of a tensor-parallel model (model/gen_tp.c): the graph of each of g
 * ranks built with bo (tp_size, tp_rank set here), compiled and run as a kiln_group with each
 * rank's share of the weights, or evaluated by the CPU reference (o->cpu). A run takes kiln_gen's
 * inputs (one sequence's, or a batch's rows) and gives the whole vocabulary's logits of its first
 * n_read rows (n_vocab each), the ranks' rows concatenated. */
/* The states (KV caches) of graph gr in host memory, zeroed, for the CPU reference's runs
 * (model/gen.c): *out gets *n of them (free with km_host_states_free). */
typedef struct {
    const char *name;
    void       *data;
    size_t      bytes;
} km_host_state;
kiln_status km_host_states(const kiln_graph *gr, km_host_state **out, int *n);
/* State `name` of bytes bytes among s[0 .. n-1] read into data, or written from it; false when
 * there is none such. */
/* The CPU reference's run of ctx's graph (a model's: dims n_tokens and n_kv) at nt and nkv. */
kiln_status km_ref_run(const kiln_ctx *ctx, int64_t nt, int64_t nkv, kiln_ref_get_fn get, kiln_ref_put_fn put,
                       void *user);
bool        km_host_state_io(km_host_state *s, int n, const char *name, void *data, size_t bytes, bool write);
void        km_host_states_free(km_host_state *s, int n);

/* A tensor-parallel rank's session s of random model m: each weight made on the device in the
 * rank's shape (km_random_init_rank: the whole weight's distribution, not its slice). */
kiln_status km_model_fill_rank(const kiln_model *m, kiln_session *s);

typedef struct km_tp_gen km_tp_gen;
typedef struct {
    const int32_t  *tokens, *positions, *out_ids;
    const int64_t  *slots;
    const uint16_t *mask, *mask_swa; /* f16 [nkv, nt]; mask_swa NULL without sliding windows */
    const int32_t  *iv, *iv_swa;     /* or, built with mask_intervals (the batch's), i32 [2, nt] */
    int64_t         nt, nkv;
    int64_t         n_out, n_read;   /* out_ids' rows (1, or nt with KILN_OUTPUTS_ALL); the first
                                        n_read rows' logits are gathered */
} km_tp_run;
/* A run's input `name` among inp_pos, kv_idxs, kq_mask(_swa) (intervals: the key intervals) and
 * inp_out_ids, for the CPU reference; NULL for any other name. */
const void *km_run_input(const km_tp_run *in, bool intervals, const char *name);
/* Session s's dims and those inputs set for the run (inp_out_ids when out_ids). */
kiln_status km_run_set_inputs(kiln_session *s, const km_tp_run *in, bool intervals, bool out_ids);
kiln_status km_tp_gen_open(const kiln_model *m, int g, const kiln_build_opts *bo, const kiln_gen_opts *o,
                           kiln_gen_stats *stats, km_tp_gen **out);
kiln_status km_tp_gen_run(km_tp_gen *t, const km_tp_run *in, float *logits);
double      km_tp_gen_last_ms(const km_tp_gen *t); /* GPU time of rank 0's last run (0 on the CPU) */
void        km_tp_gen_free(km_tp_gen *t);
int         km_tp_gen_ranks(const km_tp_gen *t);

/* kiln_gen over the stages of a pipeline split (model/gen_pp.c): n stages of consecutive layers
 * (n_layer / n each, the first n_layer % n one more), stage s a session on GPU s or the CPU
 * reference (o->cpu), run one after another with each stage's hidden state handed on; a run
 * takes kiln_gen's inputs and gives the first n_read rows of the last stage's logits. */
typedef struct km_pp_gen km_pp_gen;
/* Stage s of n over L layers: layers [*first, *end), L / n each, the first L % n stages one more. */
void        km_stage_layers(int64_t L, int n, int s, int *first, int *end);
/* The build options of part `part` of a model split over tp ranks or pp stages (whole: the
 * split's own, kiln_gen's), as kiln_gen builds each part (model/gen.c). */
void        km_part_opts(const kiln_model_hparams *hp, const kiln_build_opts *whole, int tp, int pp, int part,
                         kiln_build_opts *out);
kiln_status km_pp_gen_open(const kiln_model *m, int n, const kiln_build_opts *bo, const kiln_gen_opts *o,
                           kiln_gen_stats *stats, km_pp_gen **out);
kiln_status km_pp_gen_run(km_pp_gen *p, const km_tp_run *in, float *logits);
double      km_pp_gen_last_ms(const km_pp_gen *p); /* the last run's GPU time, the stages' summed */
int         km_pp_gen_stage_of(const km_pp_gen *p, int64_t il); /* the stage of layer il, or -1 */
/* Layer il's cache state `name` (its stage's) read into data, or written from it. */
kiln_status km_pp_gen_state(km_pp_gen *p, int64_t il, const char *name, void *data, size_t bytes, bool write);
void        km_pp_gen_free(km_pp_gen *p);
/* Rank `rank`'s cache state `name` (bytes: the rank's size) read into data, or written from it. */
kiln_status km_tp_gen_state(km_tp_gen *t, int rank, const char *name, void *data, size_t bytes, bool write);

/* ---- file types and the mix (model/ftype.c) ------------------------------------------------ */

/* Whether f is a kiln_ftype kiln knows. */
bool km_ftype_known(kiln_ftype f);
/* The file type whose base type is t (f16 for f16, q4_K_M for q4_K, ...), for files that do not
 * say (no general.file_type, or one kiln lacks); false for a type no file type has. */
bool km_ftype_of_type(kiln_type t, kiln_ftype *out);
/* The type hp->ftype gives weight w of layer il (-1 outside the layers), after llama-quantize's
 * fallback for rows its block does not divide. */
kiln_type km_weight_type(const kiln_model_hparams *hp, const km_weight *w, int64_t il);
/* Every weight of hp can hold its type (rows a multiple of the block), else an error naming the
 * tensor, its shape and the type. */
kiln_status km_check_mix(const kiln_model_hparams *hp);
/* The types kiln computes weights with (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K, mxfp4), and
 * "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K and mxfp4" for messages. */
bool        km_weight_type_ok(kiln_type t);
const char *km_weight_type_list(void);

/* kiln_model_check, less the mix (km_check_mix) when mix is false: a file's weights have the
 * types the file gives them, whatever its general.file_type says. */
kiln_status km_check(const kiln_model_hparams *hp, bool mix);
/* kiln_build_model; with file non-NULL each weight takes its type from the file's tensor of
 * that name (km_check_tensors has checked them), else from the mix. */
kiln_status km_build(kiln_ctx *ctx, const kiln_model_hparams *hp, const kiln_build_opts *o, const kiln_gguf *file);

#endif
