/* Hyperparameters from and to GGUF metadata, with llama.cpp's key names ("llama.block_count",
 * "qwen3moe.expert_count", ...) and its conventions: what the keys do not say, the tensors do
 * (tied output, attention biases, llama3 rope scaling through rope_freqs.weight). */
#include "base/base.h"
#include "frontend/arch.h"

#include <stdio.h>
#include <string.h>

/* llama.cpp's LLAMA_FTYPE values for unquantized files (general.file_type). */
enum { FTYPE_ALL_F32 = 0, FTYPE_MOSTLY_F16 = 1, FTYPE_MOSTLY_BF16 = 32 };

typedef struct {
    const kiln_gguf *g;
    const char      *arch;
    kiln_status      st; /* the first error */
} reader;

static const char *akey(const reader *r, const char *suffix, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", r->arch, suffix);
    return buf;
}

/* An integer key ARCH.suffix; absent: def when optional, else an error. A per-layer array (some
 * models vary head counts by layer) is refused. */
static int64_t get_int(reader *r, const char *suffix, bool required, int64_t def) {
    char key[128];
    akey(r, suffix, key, sizeof key);
    if (r->st) return def;
    int64_t i = kiln_gguf_find_kv(r->g, key);
    if (i < 0) {
        if (required) r->st = kb_error(KILN_ERR_FORMAT, "model: the GGUF has no '%s', which %s models need", key, r->arch);
        return def;
    }
    if (kiln_gguf_kv_type(r->g, i) == KILN_GGUF_ARRAY) {
        r->st = kb_error(KILN_ERR_FORMAT, "model: '%s' is an array (a value per layer), which kiln does not support", key);
        return def;
    }
    int64_t v = def;
    kiln_status st = kiln_gguf_get_int(r->g, key, &v);
    if (st) r->st = kb_wrap(st, "model");
    return v;
}

static double get_float(reader *r, const char *suffix, bool required, double def) {
    char key[128];
    akey(r, suffix, key, sizeof key);
    if (r->st) return def;
    if (kiln_gguf_find_kv(r->g, key) < 0) {
        if (required) r->st = kb_error(KILN_ERR_FORMAT, "model: the GGUF has no '%s', which %s models need", key, r->arch);
        return def;
    }
    double v = def;
    kiln_status st = kiln_gguf_get_float(r->g, key, &v);
    if (st) r->st = kb_wrap(st, "model");
    return v;
}

static bool has_tensor(const kiln_gguf *g, const char *name) { return kiln_gguf_find_tensor(g, name) >= 0; }

/* wtype: the type of the first layer's Q projection, which every matrix shares in an
 * unquantized file (kiln_model_check_weights checks the rest). */
static kiln_status weight_type(const kiln_gguf *g, kiln_type *out) {
    int64_t i = kiln_gguf_find_tensor(g, "blk.0.attn_q.weight");
    if (i < 0) i = kiln_gguf_find_tensor(g, "token_embd.weight");
    if (i < 0) return kb_error(KILN_ERR_FORMAT, "model: the GGUF has neither 'blk.0.attn_q.weight' nor 'token_embd.weight'");
    kiln_gguf_tensor t;
    kiln_status st = kiln_gguf_tensor_info(g, i, &t);
    if (st) return st;
    if (!t.has_kiln_type || (t.type != KILN_F32 && t.type != KILN_F16 && t.type != KILN_BF16))
        return kb_error(KILN_ERR_FORMAT, "model: tensor '%s' is %s; kiln runs f32, f16 and bf16 weights (quantized "
                                         "types are not supported yet)", t.name, t.type_name);
    *out = t.type;
    return NULL;
}

static kiln_status rope_scaling(reader *r, kiln_model_hparams *hp) {
    char key[128];
    const char *s = NULL;
    size_t      len = 0;
    akey(r, "rope.scaling.type", key, sizeof key);
    if (kiln_gguf_find_kv(r->g, key) >= 0) {
        kiln_status st = kiln_gguf_get_str(r->g, key, &s, &len);
        if (st) return kb_wrap(st, "model");
    }
    hp->rope_factor = (float)get_float(r, "rope.scaling.factor", false, 0.0); /* 0: none given */
    if (has_tensor(r->g, "rope_freqs.weight")) {
        /* llama3 scaling: the file carries the per-frequency factors the graph uses. The three
         * values below only serve kiln_model_rope_freqs; the keys are kiln's own (llama.cpp's
         * converter folds them into the tensor), with Llama 3.1's values as defaults. */
        hp->rope_scaling = KILN_ROPE_SCALING_LLAMA3;
        hp->rope_low_freq_factor = (float)get_float(r, "rope.scaling.low_freq_factor", false, 1.0);
        hp->rope_high_freq_factor = (float)get_float(r, "rope.scaling.high_freq_factor", false, 4.0);
        hp->rope_orig_ctx = get_int(r, "rope.scaling.original_context_length", false, 8192);
        if (hp->rope_factor == 0.0f) hp->rope_factor = (float)get_float(r, "rope.scaling.llama3_factor", false, 8.0);
        return r->st;
    }
    /* As llama.cpp: without a type a factor means linear scaling. */
    if (!s) hp->rope_scaling = hp->rope_factor != 1.0f && hp->rope_factor != 0.0f ? KILN_ROPE_SCALING_LINEAR
                                                                                   : KILN_ROPE_SCALING_NONE;
    else if (len == 4 && memcmp(s, "none", 4) == 0) hp->rope_scaling = KILN_ROPE_SCALING_NONE;
    else if (len == 6 && memcmp(s, "linear", 6) == 0) hp->rope_scaling = KILN_ROPE_SCALING_LINEAR;
    else if (len == 4 && memcmp(s, "yarn", 4) == 0) hp->rope_scaling = KILN_ROPE_SCALING_YARN;
    else return kb_error(KILN_ERR_FORMAT, "model: '%s' is \"%.*s\"; kiln knows none, linear, yarn (and llama3 "
                                          "through rope_freqs.weight)", key, (int)(len > 40 ? 40 : len), s);
    if (hp->rope_scaling == KILN_ROPE_SCALING_LINEAR && hp->rope_factor <= 0)
        return kb_error(KILN_ERR_FORMAT, "model: linear rope scaling with factor %g", hp->rope_factor);
    return r->st;
}

static kiln_status read_arch(const kiln_gguf *g, char *arch, size_t cap) {
    const char *s;
    size_t      len;
    kiln_status st = kiln_gguf_get_str(g, "general.architecture", &s, &len);
    if (st) return kb_wrap(st, "model");
    if (len >= cap || memchr(s, 0, len)) return kb_error(KILN_ERR_FORMAT, "model: general.architecture is not a short name");
    memcpy(arch, s, len);
    arch[len] = 0;
    if (fe_arch_find(arch) < 0)
        return kb_error(KILN_ERR_FORMAT, "model: architecture '%s' is not supported (kiln builds: %s)", arch,
                        fe_arch_list());
    return NULL;
}

static int64_t vocab_size(reader *r) {
    int64_t n = get_int(r, "vocab_size", false, 0);
    if (n > 0 || r->st) return n;
    int64_t i = kiln_gguf_find_tensor(r->g, "token_embd.weight");
    kiln_gguf_tensor t;
    if (i >= 0 && !kiln_gguf_tensor_info(r->g, i, &t) && t.n_dims == 2) return t.ne[1];
    r->st = kb_error(KILN_ERR_FORMAT, "model: no '%s.vocab_size' and no 2-D token_embd.weight to take it from", r->arch);
    return 0;
}

kiln_status kiln_model_hparams_from_gguf(const kiln_gguf *g, kiln_model_hparams *hp) {
    if (!g || !hp) return kb_error(KILN_ERR_INVALID, "kiln_model_hparams_from_gguf: NULL argument");
    memset(hp, 0, sizeof *hp);
    kiln_status st = read_arch(g, hp->arch, sizeof hp->arch);
    if (st) return st;
    reader r = {g, hp->arch, NULL};
    fe_arch a = (fe_arch)fe_arch_find(hp->arch);
    hp->n_ctx_train = get_int(&r, "context_length", true, 0);
    hp->n_embd = get_int(&r, "embedding_length", true, 0);
    hp->n_layer = get_int(&r, "block_count", true, 0);
    hp->n_head = get_int(&r, "attention.head_count", true, 0);
    hp->n_head_kv = get_int(&r, "attention.head_count_kv", false, hp->n_head);
    hp->n_ff = get_int(&r, "feed_forward_length", a != FE_ARCH_QWEN3MOE, 0);
    hp->rms_norm_eps = (float)get_float(&r, "attention.layer_norm_rms_epsilon", true, 0);
    hp->rope_freq_base = (float)get_float(&r, "rope.freq_base", false, 10000.0);
    int64_t def_head = hp->n_head > 0 ? hp->n_embd / hp->n_head : 0;
    hp->head_dim = get_int(&r, "attention.key_length", false, def_head);
    int64_t v_len = get_int(&r, "attention.value_length", false, hp->head_dim);
    int64_t n_rot = get_int(&r, "rope.dimension_count", false, hp->head_dim);
    hp->n_vocab = vocab_size(&r);
    if (r.st) return r.st;
    if (v_len != hp->head_dim)
        return kb_error(KILN_ERR_FORMAT, "model: %s.attention.value_length %lld differs from key_length %lld, which "
                                         "kiln does not support", hp->arch, (long long)v_len, (long long)hp->head_dim);
    if (n_rot != hp->head_dim)
        return kb_error(KILN_ERR_FORMAT, "model: %s.rope.dimension_count %lld is not the head size %lld (partial "
                                         "rotary embeddings are not supported)", hp->arch, (long long)n_rot,
                        (long long)hp->head_dim);
    if ((st = rope_scaling(&r, hp))) return st;
    hp->tied_output = !has_tensor(g, "output.weight");
    hp->qk_norm = a == FE_ARCH_QWEN3 || a == FE_ARCH_QWEN3MOE;
    hp->attn_bias = a == FE_ARCH_QWEN2 || (a == FE_ARCH_LLAMA && has_tensor(g, "blk.0.attn_q.bias"));
    if (a == FE_ARCH_QWEN3MOE || kiln_gguf_find_kv(g, "llama.expert_count") >= 0) {
        hp->n_expert = get_int(&r, "expert_count", true, 0);
        hp->n_expert_used = get_int(&r, "expert_used_count", true, 0);
        hp->n_ff_exp = get_int(&r, "expert_feed_forward_length", a == FE_ARCH_QWEN3MOE, 0);
        /* llama.cpp always renormalizes qwen3moe's top-k weights; the key is kiln's, for tests. */
        bool norm = true;
        char key[128];
        if (kiln_gguf_find_kv(g, akey(&r, "expert_weights_norm", key, sizeof key)) >= 0 &&
            (st = kiln_gguf_get_bool(g, key, &norm)))
            return kb_wrap(st, "model");
        hp->norm_topk_prob = norm;
        if (r.st) return r.st;
    }
    if ((st = weight_type(g, &hp->wtype))) return st;
    return kiln_model_check(hp);
}

static void set_arch_u32(kiln_gguf_writer *w, const char *arch, const char *suffix, int64_t v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    kiln_gguf_set_u32(w, key, (uint32_t)v);
}

static void set_arch_f32(kiln_gguf_writer *w, const char *arch, const char *suffix, float v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    kiln_gguf_set_f32(w, key, v);
}

static void rope_to_gguf(const kiln_model_hparams *hp, kiln_gguf_writer *w) {
    const char *a = hp->arch;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    switch (hp->rope_scaling) {
    case KILN_ROPE_SCALING_NONE: break;
    case KILN_ROPE_SCALING_LINEAR:
    case KILN_ROPE_SCALING_YARN:
        kiln_gguf_set_str(w, key, hp->rope_scaling == KILN_ROPE_SCALING_LINEAR ? "linear" : "yarn");
        set_arch_f32(w, a, "rope.scaling.factor", hp->rope_factor);
        break;
    case KILN_ROPE_SCALING_LLAMA3:
        set_arch_f32(w, a, "rope.scaling.llama3_factor", hp->rope_factor);
        set_arch_f32(w, a, "rope.scaling.low_freq_factor", hp->rope_low_freq_factor);
        set_arch_f32(w, a, "rope.scaling.high_freq_factor", hp->rope_high_freq_factor);
        set_arch_u32(w, a, "rope.scaling.original_context_length", hp->rope_orig_ctx);
        break;
    }
}

void kiln_model_hparams_to_gguf(const kiln_model_hparams *hp, kiln_gguf_writer *w) {
    if (!hp || !w) return;
    const char *a = hp->arch;
    kiln_gguf_set_str(w, "general.architecture", a);
    kiln_gguf_set_str(w, "general.name", "kiln random weights");
    kiln_gguf_set_u32(w, "general.file_type", hp->wtype == KILN_F32   ? FTYPE_ALL_F32
                                              : hp->wtype == KILN_F16 ? FTYPE_MOSTLY_F16
                                                                      : FTYPE_MOSTLY_BF16);
    set_arch_u32(w, a, "vocab_size", hp->n_vocab);
    set_arch_u32(w, a, "context_length", hp->n_ctx_train);
    set_arch_u32(w, a, "embedding_length", hp->n_embd);
    set_arch_u32(w, a, "block_count", hp->n_layer);
    set_arch_u32(w, a, "feed_forward_length", hp->n_ff);
    set_arch_u32(w, a, "attention.head_count", hp->n_head);
    set_arch_u32(w, a, "attention.head_count_kv", hp->n_head_kv);
    set_arch_u32(w, a, "attention.key_length", hp->head_dim);
    set_arch_u32(w, a, "attention.value_length", hp->head_dim);
    set_arch_u32(w, a, "rope.dimension_count", hp->head_dim);
    set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", hp->rms_norm_eps);
    set_arch_f32(w, a, "rope.freq_base", hp->rope_freq_base);
    rope_to_gguf(hp, w);
    if (hp->n_expert > 0) {
        set_arch_u32(w, a, "expert_count", hp->n_expert);
        set_arch_u32(w, a, "expert_used_count", hp->n_expert_used);
        set_arch_u32(w, a, "expert_feed_forward_length", hp->n_ff_exp);
        char key[128];
        snprintf(key, sizeof key, "%s.expert_weights_norm", a);
        kiln_gguf_set_bool(w, key, hp->norm_topk_prob);
    }
}
