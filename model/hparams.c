/* Hyperparameters from and to GGUF metadata, with llama.cpp's key names ("llama.block_count",
 * "qwen3moe.expert_count", ...) and its conventions: what the keys do not say, the tensors do
 * (tied output, attention biases, llama3 rope scaling through rope_freqs.weight). */
#include "base/base.h"
#include "model/arch.h"
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Every message below starts with the file's path (km_gguf_label); the getters' own errors
 * (a key of another type) already do and pass through as they are. */
typedef struct {
    const kiln_gguf *g;
    const char      *file;
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
        if (required) r->st = kb_error(KILN_ERR_FORMAT, "%s: no key '%s', which %s models need", r->file, key, r->arch);
        return def;
    }
    if (kiln_gguf_kv_type(r->g, i) == KILN_GGUF_ARRAY) {
        r->st = kb_error(KILN_ERR_FORMAT, "%s: '%s' is an array (a value per layer), which kiln does not support", r->file,
                         key);
        return def;
    }
    int64_t v = def;
    r->st = kiln_gguf_get_int(r->g, key, &v);
    return v;
}

/* A float key, which must be finite: every one sizes or scales something. */
static double get_float(reader *r, const char *suffix, bool required, double def) {
    char key[128];
    akey(r, suffix, key, sizeof key);
    if (r->st) return def;
    if (kiln_gguf_find_kv(r->g, key) < 0) {
        if (required) r->st = kb_error(KILN_ERR_FORMAT, "%s: no key '%s', which %s models need", r->file, key, r->arch);
        return def;
    }
    double v = def;
    if ((r->st = kiln_gguf_get_float(r->g, key, &v))) return def;
    if (!isfinite(v)) r->st = kb_error(KILN_ERR_FORMAT, "%s: '%s' is %g, not a finite number", r->file, key, v);
    return v;
}

static bool has_tensor(const kiln_gguf *g, const char *name) { return kiln_gguf_find_tensor(g, name) >= 0; }

/* The file type: general.file_type where it is one kiln knows, else (no key, or a file type
 * such as Q4_K_S or Q3_K_M) the one whose base type the first layer's Q projection has. It only
 * names the file: the graph takes each weight's type from the file (kiln_model_build). */
static kiln_status file_type(const kiln_gguf *g, kiln_ftype *out) {
    int64_t v;
    if (kiln_gguf_find_kv(g, "general.file_type") >= 0) {
        kiln_status st = kiln_gguf_get_int(g, "general.file_type", &v);
        if (st) return st;
        if (v >= 0 && v <= INT32_MAX && km_ftype_known((kiln_ftype)v)) {
            *out = (kiln_ftype)v;
            return NULL;
        }
    }
    const char *file = km_gguf_label(g);
    int64_t     i = kiln_gguf_find_tensor(g, "blk.0.attn_q.weight");
    if (i < 0) i = kiln_gguf_find_tensor(g, "token_embd.weight");
    if (i < 0) return kb_error(KILN_ERR_FORMAT, "%s: no tensor 'blk.0.attn_q.weight' nor 'token_embd.weight'", file);
    kiln_gguf_tensor t;
    kiln_status st = kiln_gguf_tensor_info(g, i, &t);
    if (st) return st;
    if (!t.has_kiln_type || !km_ftype_of_type(t.type, out))
        return kb_error(KILN_ERR_FORMAT, "%s: tensor '%s' is %s; kiln runs %s", file, t.name, t.type_name,
                        km_weight_type_list());
    return NULL;
}

static kiln_status rope_scaling(reader *r, kiln_model_hparams *hp) {
    char key[128];
    const char *s = NULL;
    size_t      len = 0;
    akey(r, "rope.scaling.type", key, sizeof key);
    if (kiln_gguf_find_kv(r->g, key) >= 0) {
        kiln_status st = kiln_gguf_get_str(r->g, key, &s, &len);
        if (st) return st;
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
    if (r->st) return r->st;
    if (has_tensor(r->g, "rope_factors_long.weight") || has_tensor(r->g, "rope_factors_short.weight")) {
        /* longrope (phi3): the file carries the factors; llama.cpp picks long or short by the
         * cache size against the original context, and scales the rotation by attn_factor. */
        hp->rope_scaling = KILN_ROPE_SCALING_LONGROPE;
        hp->rope_orig_ctx = get_int(r, "rope.scaling.original_context_length", false, hp->n_ctx_train);
        hp->rope_attn_factor = (float)get_float(r, "rope.scaling.attn_factor", false, 0.0);
        return r->st;
    }
    /* As llama.cpp: without a type a factor means linear scaling. */
    if (!s) hp->rope_scaling = hp->rope_factor != 1.0f && hp->rope_factor != 0.0f ? KILN_ROPE_SCALING_LINEAR
                                                                                   : KILN_ROPE_SCALING_NONE;
    else if (len == 4 && memcmp(s, "none", 4) == 0) hp->rope_scaling = KILN_ROPE_SCALING_NONE;
    else if (len == 6 && memcmp(s, "linear", 6) == 0) hp->rope_scaling = KILN_ROPE_SCALING_LINEAR;
    else if (len == 4 && memcmp(s, "yarn", 4) == 0) hp->rope_scaling = KILN_ROPE_SCALING_YARN;
    else {
        char v[41];
        snprintf(v, sizeof v, "%.*s", (int)(len > 40 ? 40 : len), s);
        for (char *c = v; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?'; /* the file's bytes, not control codes */
        return kb_error(KILN_ERR_FORMAT, "%s: '%s' is \"%s\"; kiln knows none, linear, yarn (and llama3 through "
                                         "rope_freqs.weight)", r->file, key, v);
    }
    if (hp->rope_scaling == KILN_ROPE_SCALING_LINEAR && hp->rope_factor <= 0)
        return kb_error(KILN_ERR_FORMAT, "%s: linear rope scaling with factor %g", r->file, hp->rope_factor);
    if (hp->rope_scaling == KILN_ROPE_SCALING_YARN) {
        /* llama.cpp's n_ctx_orig_yarn (else the training context) and rope_attn_factor (1) */
        hp->rope_orig_ctx = get_int(r, "rope.scaling.original_context_length", false, hp->n_ctx_train);
        hp->rope_attn_factor = (float)get_float(r, "rope.scaling.attn_factor", false, 0.0);
        char lk[128];
        int  a = km_arch_find(r->arch);
        /* DeepSeek's log multiplier (stored as 0.1 mscale_all_dim; llama.cpp divides by 0.1 on
         * load) scales deepseek2's attention; another arch's graph has no use for it */
        if (!r->st && a >= 0 && km_archs[a].mla)
            hp->rope_yarn_log_mul = (float)(get_float(r, "rope.scaling.yarn_log_multiplier", false, 0.0) / 0.1);
        else if (!r->st && kiln_gguf_find_kv(r->g, akey(r, "rope.scaling.yarn_log_multiplier", lk, sizeof lk)) >= 0)
            return kb_error(KILN_ERR_FORMAT, "%s: '%s' is set, but the %s graph has no YaRN log multiplier "
                                             "(deepseek2's)", r->file, lk, r->arch);
        if (!r->st && hp->rope_factor <= 0)
            return kb_error(KILN_ERR_FORMAT, "%s: yarn rope scaling with factor %g", r->file, hp->rope_factor);
        return r->st;
    }
    return NULL;
}

static kiln_status read_arch(const kiln_gguf *g, char *arch, size_t cap) {
    const char *s, *file = km_gguf_label(g);
    size_t      len;
    kiln_status st = kiln_gguf_get_str(g, "general.architecture", &s, &len);
    if (st) return st;
    if (len >= cap || memchr(s, 0, len)) return kb_error(KILN_ERR_FORMAT, "%s: general.architecture is not a short name", file);
    memcpy(arch, s, len);
    arch[len] = 0;
    if (km_arch_find(arch) < 0) {
        for (char *c = arch; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        const char *missing = km_arch_missing(arch);
        return kb_error(KILN_ERR_FORMAT, "%s: architecture '%s' is not supported%s%s (kiln builds: %s)", file, arch,
                        missing ? " yet: it needs " : "", missing ? missing : "", km_arch_list());
    }
    return NULL;
}

static int64_t vocab_size(reader *r) {
    int64_t n = get_int(r, "vocab_size", false, 0);
    if (n > 0 || r->st) return n;
    int64_t i = kiln_gguf_find_tensor(r->g, "token_embd.weight");
    kiln_gguf_tensor t;
    if (i >= 0 && !kiln_gguf_tensor_info(r->g, i, &t) && t.n_dims == 2) return t.ne[1];
    r->st = kb_error(KILN_ERR_FORMAT, "%s: no '%s.vocab_size' and no 2-D token_embd.weight to take it from", r->file,
                     r->arch);
    return 0;
}

/* The head size: ARCH.attention.key_length, else n_embd / n_head, which then must divide (as
 * llama.cpp computes n_embd_head_k). */
static int64_t head_size(reader *r, const kiln_model_hparams *hp) {
    char key[128];
    if (r->st) return 0;
    if (kiln_gguf_find_kv(r->g, akey(r, "attention.key_length", key, sizeof key)) >= 0) return get_int(r, "attention.key_length", true, 0);
    if (hp->n_head < 1) return 0; /* kiln_model_check names n_head */
    if (hp->n_embd % hp->n_head)
        r->st = kb_error(KILN_ERR_FORMAT, "%s: %s.attention.head_count %lld does not divide %s.embedding_length %lld, "
                                          "and there is no %s to give the head size", r->file, r->arch,
                         (long long)hp->n_head, r->arch, (long long)hp->n_embd, key);
    return hp->n_embd / hp->n_head;
}

/* deepseek2's latent attention and FFN keys, as llama.cpp's loader reads them. A file converted
 * before llama.cpp's MLA (one attn_kv_b, key_length 192) has no key_length_mla: refused, since
 * kiln builds the absorbed graph only. */
static kiln_status mla_from_gguf(reader *r, kiln_model_hparams *hp, int64_t k_len, int64_t v_len, int64_t n_rot) {
    char key[128];
    if (kiln_gguf_find_kv(r->g, akey(r, "attention.key_length_mla", key, sizeof key)) < 0)
        return kb_error(KILN_ERR_FORMAT, "%s: no '%s': a deepseek2 file from before llama.cpp's MLA layout (attn_kv_b "
                                         "instead of attn_k_b and attn_v_b); kiln builds the absorbed MLA graph only, "
                                         "so convert the model again with a current convert_hf_to_gguf.py", r->file, key);
    hp->head_dim = get_int(r, "attention.key_length_mla", true, 0);
    hp->head_dim_v = get_int(r, "attention.value_length_mla", true, 0);
    hp->kv_lora_rank = get_int(r, "attention.kv_lora_rank", true, 0);
    hp->q_lora_rank = get_int(r, "attention.q_lora_rank", false, 0);
    hp->n_rot = n_rot;
    hp->n_layer_dense_lead = get_int(r, "leading_dense_block_count", true, 0);
    hp->n_expert_shared = get_int(r, "expert_shared_count", true, 0);
    hp->expert_weights_scale = (float)get_float(r, "expert_weights_scale", false, 0.0);
    hp->expert_gating = (kiln_expert_gating)get_int(r, "expert_gating_func", false, KILN_GATING_SOFTMAX);
    hp->n_expert_groups = get_int(r, "expert_group_count", false, 0);
    hp->n_group_used = get_int(r, "expert_group_used_count", false, 0);
    if (r->st) return r->st;
    if (k_len != hp->kv_lora_rank + n_rot || v_len != hp->kv_lora_rank)
        return kb_error(KILN_ERR_FORMAT, "%s: %s.attention.key_length %lld and value_length %lld should be the cached "
                                         "latent: kv_lora_rank %lld + rope.dimension_count %lld, and kv_lora_rank",
                        r->file, r->arch, (long long)k_len, (long long)v_len, (long long)hp->kv_lora_rank,
                        (long long)n_rot);
    char name[64];
    snprintf(name, sizeof name, "blk.%lld.exp_probs_b.bias", (long long)hp->n_layer_dense_lead);
    hp->expert_probs_bias = has_tensor(r->g, name);
    return NULL;
}

kiln_status kiln_model_hparams_from_gguf(const kiln_gguf *g, kiln_model_hparams *hp) {
    if (!g || !hp) return kb_error(KILN_ERR_INVALID, "kiln_model_hparams_from_gguf: NULL argument");
    memset(hp, 0, sizeof *hp);
    kiln_status st = read_arch(g, hp->arch, sizeof hp->arch);
    if (st) return st;
    reader r = {g, km_gguf_label(g), hp->arch, NULL};
    km_arch a = (km_arch)km_arch_find(hp->arch);
    hp->n_ctx_train = get_int(&r, "context_length", true, 0);
    hp->n_embd = get_int(&r, "embedding_length", true, 0);
    hp->n_layer = get_int(&r, "block_count", true, 0);
    hp->n_head = get_int(&r, "attention.head_count", true, 0);
    hp->n_head_kv = get_int(&r, "attention.head_count_kv", false, hp->n_head);
    const km_arch_info *ai = &km_archs[a];
    hp->n_ff = get_int(&r, "feed_forward_length", !ai->moe, 0);
    hp->rms_norm_eps = (float)get_float(&r, "attention.layer_norm_rms_epsilon", true, 0);
    hp->rope_freq_base = (float)get_float(&r, "rope.freq_base", false, 10000.0);
    hp->head_dim = head_size(&r, hp);
    int64_t v_len = get_int(&r, "attention.value_length", false, hp->head_dim);
    int64_t n_rot = get_int(&r, "rope.dimension_count", false, hp->head_dim);
    hp->n_vocab = vocab_size(&r);
    if (r.st) return r.st;
    if (ai->mla) {
        if ((st = mla_from_gguf(&r, hp, hp->head_dim, v_len, n_rot))) return st;
    } else if (v_len != hp->head_dim)
        return kb_error(KILN_ERR_FORMAT, "%s: %s.attention.value_length %lld differs from key_length %lld, which "
                                         "kiln does not support", r.file, hp->arch, (long long)v_len,
                        (long long)hp->head_dim);
    if (!ai->mla && n_rot != hp->head_dim)
        return kb_error(KILN_ERR_FORMAT, "%s: %s.rope.dimension_count %lld is not the head size %lld (partial "
                                         "rotary embeddings are not supported)", r.file, hp->arch, (long long)n_rot,
                        (long long)hp->head_dim);
    if ((st = rope_scaling(&r, hp))) return st;
    hp->tied_output = !has_tensor(g, "output.weight");
    hp->qk_norm = ai->qk_norm;
    hp->attn_bias = ai->bias || (a == KM_ARCH_LLAMA && has_tensor(g, "blk.0.attn_q.bias"));
    if (ai->scales) { /* as llama.cpp's granite loader: only the logit scale is required */
        hp->embedding_scale = (float)get_float(&r, "embedding_scale", false, 0);
        hp->residual_scale = (float)get_float(&r, "residual_scale", false, 0);
        hp->attention_scale = (float)get_float(&r, "attention.scale", false, 0);
        hp->logit_scale = (float)get_float(&r, "logit_scale", true, 0);
        if (r.st) return r.st;
    }
    if (ai->gemma) { /* llama.cpp's gemma2/3 loaders: the window from the file, the rest constants */
        hp->n_swa = get_int(&r, "attention.sliding_window", false, ai->n_swa_default);
        if (ai->softcap) {
            hp->attn_softcap = (float)get_float(&r, "attn_logit_softcapping", false, 50.0);
            hp->final_softcap = (float)get_float(&r, "final_logit_softcapping", false, 30.0);
        }
        if (r.st) return r.st;
        if (hp->n_swa > 0) {
            hp->swa_pattern = ai->swa_pattern;
            hp->rope_freq_base_swa = ai->rope_freq_base_swa != 0.0f ? ai->rope_freq_base_swa : hp->rope_freq_base;
        }
        /* f_attention_scale: the 27B (gemma3 62 layers, gemma2 46) by n_embd / n_head, the others
         * by the head size */
        int64_t big = a == KM_ARCH_GEMMA2 ? 46 : 62;
        hp->query_scale = 1.0f / sqrtf((float)(hp->n_layer == big ? hp->n_embd / hp->n_head : hp->head_dim));
    }
    if (ai->oai) { /* llama.cpp's gpt-oss loader: the window from the file, every other layer */
        hp->n_swa = get_int(&r, "attention.sliding_window", false, 0);
        if (r.st) return r.st;
        if (hp->n_swa > 0) hp->swa_pattern = ai->swa_pattern, hp->rope_freq_base_swa = hp->rope_freq_base;
    }
    if (ai->moe || kiln_gguf_find_kv(g, "llama.expert_count") >= 0) {
        hp->n_expert = get_int(&r, "expert_count", true, 0);
        hp->n_expert_used = get_int(&r, "expert_used_count", true, 0);
        /* llama's experts (Mixtral) are feed_forward_length wide, as llama.cpp creates them */
        hp->n_ff_exp = get_int(&r, "expert_feed_forward_length", ai->moe, ai->moe ? 0 : hp->n_ff);
        if (r.st) return r.st; /* before any other error, which would lose (leak) this one */
        /* llama.cpp always renormalizes qwen3moe's top-k weights; the key is kiln's, for tests.
         * deepseek2's is llama.cpp's key (false when absent). */
        bool norm = !ai->oai && !ai->mla; /* (gpt-oss softmaxes the selected logits: nothing to renormalize) */
        char key[128];
        if (kiln_gguf_find_kv(g, akey(&r, "expert_weights_norm", key, sizeof key)) >= 0 &&
            (st = kiln_gguf_get_bool(g, key, &norm)))
            return st;
        hp->norm_topk_prob = norm;
    }
    if ((st = file_type(g, &hp->ftype))) return st;
    /* Out-of-range values are the file's fault here: a format error naming it. The mix of the
     * file type is not checked: the file's own types are (km_check_tensors). */
    if (!(st = km_check(hp, false))) return NULL;
    kiln_status f = kb_error(KILN_ERR_FORMAT, "%s: %s", r.file, kiln_status_msg(st));
    kiln_status_free(st);
    return f;
}

/* ---- the tensors against the hyperparameters ---------------------------------------------------
 * Driven by model/arch.h's weight table, the list the builder creates its weights from. */

/* What the file holds of the layers: the largest N of its "blk.N." tensors (-1: none) and one
 * tensor of that layer, for messages. */
typedef struct {
    int64_t     max;
    const char *name;
} layers_held;

static layers_held scan_layers(const kiln_gguf *g) {
    layers_held h = {-1, NULL};
    for (int64_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        kiln_gguf_tensor t;
        if (kiln_gguf_tensor_info(g, i, &t)) continue; /* cannot fail for i < count */
        const char *p = t.name;
        if (strncmp(p, "blk.", 4) != 0) continue;
        int64_t n = 0;
        int     digits = 0;
        for (p += 4; *p >= '0' && *p <= '9' && digits < 12; p++, digits++) n = n * 10 + (*p - '0');
        if (!digits || *p != '.' || n <= h.max) continue;
        h.max = n;
        h.name = t.name;
    }
    return h;
}

/* "llama.embedding_length = 128": where extent d of a weight comes from, for messages. */
static void dim_source(const kiln_gguf *g, const kiln_model_hparams *hp, km_wdim d, char *out, size_t n) {
    const char *a = hp->arch;
    char        key[128];
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    char head[160];
    if (kiln_gguf_find_kv(g, key) >= 0) snprintf(head, sizeof head, "the head size %lld (%s)", (long long)hp->head_dim, key);
    else snprintf(head, sizeof head, "the head size %lld (%s.embedding_length / attention.head_count)",
                  (long long)hp->head_dim, a);
    snprintf(key, sizeof key, "%s.vocab_size", a);
    bool vocab_key = kiln_gguf_find_kv(g, key) >= 0;
    switch (d) {
    case KM_WD_ONE: snprintf(out, n, "1"); return;
    case KM_WD_EMBD: snprintf(out, n, "%s.embedding_length = %lld", a, (long long)hp->n_embd); return;
    case KM_WD_VOCAB:
        if (vocab_key) snprintf(out, n, "%s.vocab_size = %lld", a, (long long)hp->n_vocab);
        else snprintf(out, n, "n_vocab = %lld (token_embd.weight's ne[1]; there is no %s)", (long long)hp->n_vocab, key);
        return;
    case KM_WD_HEAD: snprintf(out, n, "%s", head); return;
    case KM_WD_HEADS: snprintf(out, n, "%s.attention.head_count = %lld", a, (long long)hp->n_head); return;
    case KM_WD_HALF_HEAD: snprintf(out, n, "half %s", head); return;
    case KM_WD_Q:
        snprintf(out, n, "%s.attention.head_count %lld x %s", a, (long long)hp->n_head, head);
        return;
    case KM_WD_KV:
        snprintf(out, n, "%s.attention.head_count_kv %lld x %s", a, (long long)hp->n_head_kv, head);
        return;
    case KM_WD_FF: snprintf(out, n, "%s.feed_forward_length = %lld", a, (long long)hp->n_ff); return;
    case KM_WD_FF2: snprintf(out, n, "2 x %s.feed_forward_length %lld (gate and up)", a, (long long)hp->n_ff); return;
    case KM_WD_QKV:
        snprintf(out, n, "(%s.attention.head_count %lld + 2 x head_count_kv %lld) x %s", a, (long long)hp->n_head,
                 (long long)hp->n_head_kv, head);
        return;
    case KM_WD_FF_EXP: snprintf(out, n, "%s.expert_feed_forward_length = %lld", a, (long long)hp->n_ff_exp); return;
    case KM_WD_EXPERT: snprintf(out, n, "%s.expert_count = %lld", a, (long long)hp->n_expert); return;
    case KM_WD_O:
        snprintf(out, n, "%s.attention.head_count %lld x the V head size %lld", a, (long long)hp->n_head,
                 (long long)km_head_v(hp));
        return;
    case KM_WD_Q_LORA: snprintf(out, n, "%s.attention.q_lora_rank = %lld", a, (long long)hp->q_lora_rank); return;
    case KM_WD_KV_LORA: snprintf(out, n, "%s.attention.kv_lora_rank = %lld", a, (long long)hp->kv_lora_rank); return;
    case KM_WD_KV_A:
        snprintf(out, n, "%s.attention.kv_lora_rank %lld + rope.dimension_count %lld", a, (long long)hp->kv_lora_rank,
                 (long long)km_rot(hp));
        return;
    case KM_WD_NOPE:
        snprintf(out, n, "%s.attention.key_length_mla %lld - rope.dimension_count %lld", a, (long long)hp->head_dim,
                 (long long)km_rot(hp));
        return;
    case KM_WD_HEAD_V: snprintf(out, n, "the V head size %lld", (long long)km_head_v(hp)); return;
    case KM_WD_FF_SHEXP:
        snprintf(out, n, "%s.expert_feed_forward_length %lld x expert_shared_count %lld", a, (long long)hp->n_ff_exp,
                 (long long)hp->n_expert_shared);
        return;
    case KM_WD_COUNT: break;
    }
    snprintf(out, n, "?");
}

static kiln_status missing(const kiln_gguf *g, const kiln_model_hparams *hp, const char *name, int64_t il,
                           const layers_held *h, kiln_type type, const int64_t ne[4]) {
    const char *file = km_gguf_label(g);
    if (il > h->max) {
        if (h->max < 0)
            return kb_error(KILN_ERR_FORMAT, "%s: %s.block_count is %lld but the file holds no layers (no tensor %s)",
                            file, hp->arch, (long long)hp->n_layer, name);
        return kb_error(KILN_ERR_FORMAT, "%s: %s.block_count is %lld but the file holds layers 0 .. %lld (no tensor %s)",
                        file, hp->arch, (long long)hp->n_layer, (long long)h->max, name);
    }
    char shape[96];
    km_shape_text(ne, km_n_dims(ne), shape, sizeof shape);
    return kb_error(KILN_ERR_FORMAT, "%s: no tensor '%s' (%s %s), which the %s graph needs", file, name,
                    kiln_type_name(type), shape, hp->arch);
}

/* A matrix or embedding may have any type kiln computes with, each its own (real files mix
 * them); norms, biases, the router and rope_freqs are f32. */
static kiln_status check_type(const char *file, const char *name, const km_weight *w, const kiln_gguf_tensor *t,
                              const char *arch) {
    if (w->mix == KM_MIX_F32) {
        if (t->has_kiln_type && t->type == KILN_F32) return NULL;
        return kb_error(KILN_ERR_FORMAT, "%s: tensor '%s' is %s; the %s graph needs f32 (norms, biases, the router "
                                         "and rope_freqs are f32)", file, name, t->type_name, arch);
    }
    if (!t->has_kiln_type || !km_weight_type_ok(t->type))
        return kb_error(KILN_ERR_FORMAT, "%s: tensor '%s' is %s; kiln runs %s", file, name, t->type_name,
                        km_weight_type_list());
    if (t->ne[0] % kiln_type_block(t->type) != 0) { /* the reader refuses it; kept as the graph's guard */
        char shape[96];
        km_shape_text(t->ne, t->n_dims, shape, sizeof shape);
        return kb_error(KILN_ERR_FORMAT, "%s: tensor '%s' is %s %s: its rows of %lld are not a multiple of %s's "
                                         "%lld-element blocks", file, name, t->type_name, shape, (long long)t->ne[0],
                        t->type_name, (long long)kiln_type_block(t->type));
    }
    return NULL;
}

/* Tensor `name` (weight w of layer il, -1 outside the layers) as hp makes it. */
static kiln_status check_tensor(const kiln_gguf *g, const kiln_model_hparams *hp, const km_weight *w, int64_t il,
                                const layers_held *h) {
    if (!km_weight_present(hp, w, il)) return NULL;
    const char *file = km_gguf_label(g);
    char        name[128];
    if (il >= 0) snprintf(name, sizeof name, "blk.%lld.%s", (long long)il, w->name);
    else snprintf(name, sizeof name, "%s", w->name);
    int64_t   want[4];
    kiln_type type = km_weight_type(hp, w, il);
    km_weight_shape(hp, w, want);
    int64_t i = kiln_gguf_find_tensor(g, name);
    if (i < 0) return missing(g, hp, name, il, h, type, want);
    kiln_gguf_tensor t;
    kiln_status      st = kiln_gguf_tensor_info(g, i, &t);
    if (st) return st;
    for (int d = 0; d < 4; d++) {
        if (t.ne[d] == want[d]) continue;
        char got_s[96], want_s[96], src[256];
        km_shape_text(t.ne, t.n_dims, got_s, sizeof got_s);
        km_shape_text(want, km_n_dims(want), want_s, sizeof want_s);
        dim_source(g, hp, d < 3 && d < w->n_dims ? w->ne[d] : KM_WD_ONE, src, sizeof src);
        return kb_error(KILN_ERR_FORMAT, "%s: tensor '%s' is %s, not %s: its ne[%d] should be %s", file, name, got_s,
                        want_s, d, src);
    }
    return check_type(file, name, w, &t, hp->arch);
}

kiln_status km_check_tensors(const kiln_gguf *g, const kiln_model_hparams *hp) {
    layers_held h = scan_layers(g);
    kiln_status st = NULL;
    for (int k = 0; k < KM_W_COUNT && !st; k++)
        if (!km_weights[k].in_layer) st = check_tensor(g, hp, &km_weights[k], -1, &h);
    /* Stops at the first layer the file lacks: no more layers are visited than it holds. */
    for (int64_t il = 0; il < hp->n_layer && !st; il++)
        for (int k = 0; k < KM_W_COUNT && !st; k++)
            if (km_weights[k].in_layer) st = check_tensor(g, hp, &km_weights[k], il, &h);
    if (!st && h.max >= hp->n_layer) {
        char q[300];
        km_quote(h.name, q);
        st = kb_error(KILN_ERR_FORMAT, "%s: %s.block_count is %lld but the file holds layers 0 .. %lld (tensor %s)",
                      km_gguf_label(g), hp->arch, (long long)hp->n_layer, (long long)h.max, q);
    }
    return st;
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
        if (hp->rope_scaling == KILN_ROPE_SCALING_YARN) {
            set_arch_u32(w, a, "rope.scaling.original_context_length", hp->rope_orig_ctx);
            if (hp->rope_attn_factor != 0.0f) set_arch_f32(w, a, "rope.scaling.attn_factor", hp->rope_attn_factor);
        }
        break;
    case KILN_ROPE_SCALING_LONGROPE: /* as llama.cpp's converter writes Phi-3's: no type key */
        set_arch_u32(w, a, "rope.scaling.original_context_length", hp->rope_orig_ctx);
        if (hp->rope_attn_factor != 0.0f) set_arch_f32(w, a, "rope.scaling.attn_factor", hp->rope_attn_factor);
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
    kiln_gguf_set_u32(w, "general.file_type", (uint32_t)hp->ftype);
    /* llama-quantize's mark of the quantized formats' version (ggml's GGML_QNT_VERSION 2: the
     * block layouts of base/quant.c), which it writes into every quantized file. */
    if (hp->ftype != KILN_FTYPE_ALL_F32 && hp->ftype != KILN_FTYPE_MOSTLY_F16 && hp->ftype != KILN_FTYPE_MOSTLY_BF16)
        kiln_gguf_set_u32(w, "general.quantization_version", 2);
    set_arch_u32(w, a, "vocab_size", hp->n_vocab);
    set_arch_u32(w, a, "context_length", hp->n_ctx_train);
    set_arch_u32(w, a, "embedding_length", hp->n_embd);
    set_arch_u32(w, a, "block_count", hp->n_layer);
    set_arch_u32(w, a, "feed_forward_length", hp->n_ff);
    set_arch_u32(w, a, "attention.head_count", hp->n_head);
    set_arch_u32(w, a, "attention.head_count_kv", hp->n_head_kv);
    if (km_mla(hp)) { /* as llama.cpp's converter: K/V the cached latent, the heads' sizes _mla */
        set_arch_u32(w, a, "attention.key_length", km_cache_row(hp));
        set_arch_u32(w, a, "attention.value_length", hp->kv_lora_rank);
        set_arch_u32(w, a, "attention.key_length_mla", hp->head_dim);
        set_arch_u32(w, a, "attention.value_length_mla", km_head_v(hp));
        set_arch_u32(w, a, "attention.kv_lora_rank", hp->kv_lora_rank);
        /* always, 0 without the pair: llama.cpp reads it for any layer count but 27 and 26 (its
         * test for V2-Lite), and then builds attn_q only when it is 0 in newer versions */
        set_arch_u32(w, a, "attention.q_lora_rank", hp->q_lora_rank);
    } else {
        set_arch_u32(w, a, "attention.key_length", hp->head_dim);
        set_arch_u32(w, a, "attention.value_length", hp->head_dim);
    }
    set_arch_u32(w, a, "rope.dimension_count", km_rot(hp));
    set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", hp->rms_norm_eps);
    set_arch_f32(w, a, "rope.freq_base", hp->rope_freq_base);
    rope_to_gguf(hp, w);
    /* granite's multipliers, the ones it has (0: absent) */
    static const char *const scale_keys[4] = {"embedding_scale", "residual_scale", "attention.scale", "logit_scale"};
    const float scales[4] = {hp->embedding_scale, hp->residual_scale, hp->attention_scale, hp->logit_scale};
    for (int i = 0; i < 4; i++)
        if (scales[i] != 0.0f) set_arch_f32(w, a, scale_keys[i], scales[i]);
    if (hp->n_swa > 0) set_arch_u32(w, a, "attention.sliding_window", hp->n_swa);
    if (hp->attn_softcap != 0.0f) set_arch_f32(w, a, "attn_logit_softcapping", hp->attn_softcap);
    if (hp->final_softcap != 0.0f) set_arch_f32(w, a, "final_logit_softcapping", hp->final_softcap);
    if (hp->n_expert > 0) {
        set_arch_u32(w, a, "expert_count", hp->n_expert);
        set_arch_u32(w, a, "expert_used_count", hp->n_expert_used);
        set_arch_u32(w, a, "expert_feed_forward_length", hp->n_ff_exp);
        char key[128];
        snprintf(key, sizeof key, "%s.expert_weights_norm", a);
        kiln_gguf_set_bool(w, key, hp->norm_topk_prob);
    }
    if (km_mla(hp)) {
        set_arch_u32(w, a, "leading_dense_block_count", hp->n_layer_dense_lead);
        set_arch_u32(w, a, "expert_shared_count", hp->n_expert_shared);
        if (hp->expert_weights_scale != 0.0f) set_arch_f32(w, a, "expert_weights_scale", hp->expert_weights_scale);
        set_arch_u32(w, a, "expert_gating_func", hp->expert_gating ? hp->expert_gating : KILN_GATING_SOFTMAX);
        if (hp->n_expert_groups > 0) {
            set_arch_u32(w, a, "expert_group_count", hp->n_expert_groups);
            set_arch_u32(w, a, "expert_group_used_count", hp->n_group_used);
        }
        if (hp->rope_yarn_log_mul != 0.0f) set_arch_f32(w, a, "rope.scaling.yarn_log_multiplier", 0.1f * hp->rope_yarn_log_mul);
    }
}
