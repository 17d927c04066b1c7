/* kiln_build_model: the graph llama.cpp builds for one ubatch of a llama, qwen2, qwen3 or
 * qwen3moe model with flash attention and a KV cache (src/models/llama.cpp, qwen2.cpp,
 * qwen3.cpp, qwen3moe.cpp and llama-graph.cpp's build_inp_*, build_qkv, build_attn,
 * build_ffn, build_moe_ffn), node for node in the order of examples/llama-layer.kg and
 * examples/qwen3moe-layer.kg, so that kiln's fusions see the patterns they expect. Weights
 * carry their GGUF names; intermediate tensors the example layers' names with ".LAYER". */
#include "model/arch.h"
#include "frontend/frontend.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kiln_ctx                 *ctx;
    const kiln_model_hparams *hp;
    km_arch                   arch;
    kiln_build_opts           o;
    const kiln_gguf          *file; /* the weights' types, else the mix of hp->ftype */
    int64_t                   T, KV; /* handles of the symbolic dims n_tokens and n_kv */
    kiln_tensor *embd, *pos, *kv_idxs, *mask, *mask_swa, *out_ids, *rope_freqs;
    int          il;   /* the layer being built; -1 outside the layers */
    int          tp;   /* ranks of the tensor-parallel group (1: the whole model) */
    kiln_tensor *tok_shard; /* tp > 1: 1 where a token is in this rank's vocabulary rows, else 0 */
    int64_t      rows; /* extent of the rows flowing through the layer: T, or 1 after the last
                          layer keeps only the output rows (KILN_OUTPUTS_LAST) */
} mb;

/* One layer's weights, named and shaped as llama.cpp's load_arch_tensors creates them. */
typedef struct {
    kiln_tensor *attn_norm, *wqkv, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *q_norm, *k_norm, *ffn_norm;
    kiln_tensor *attn_post_norm, *ffn_post_norm; /* gemma3 (gpt-oss: attn_post_norm is the FFN norm) */
    kiln_tensor *bo, *sinks;                      /* gpt-oss */
    kiln_tensor *gate_inp_b, *gate_exps_b, *up_exps_b, *down_exps_b;
    kiln_tensor *ffn_gate, *ffn_up, *ffn_down, *ffn_up_gate;     /* dense (phi3: gate and up in one) */
    kiln_tensor *gate_inp, *gate_exps, *up_exps, *down_exps;     /* experts */
    kiln_tensor *cache_k, *cache_v;
    /* deepseek2: MLA (wq_a, q_a_norm, wq_b when q_lora_rank), the selection bias, shared experts */
    kiln_tensor *wq_a, *q_a_norm, *wq_b, *wkv_a, *kv_a_norm, *wk_b, *wv_b;
    kiln_tensor *exp_probs_b, *gate_shexp, *up_shexp, *down_shexp;
} layer_w;

/* ---- naming ---------------------------------------------------------------------------------- */

/* Names t base (outside the layers) or base.LAYER, as llama.cpp's cb(t, name, il) labels it. */
static kiln_tensor *nm(mb *b, kiln_tensor *t, const char *base) {
    char name[FE_MAX_NAME + 16]; /* too long a name is kiln_set_name's error, not a truncation */
    if (b->il >= 0) snprintf(name, sizeof name, "%s.%d", base, b->il);
    else snprintf(name, sizeof name, "%s", base);
    kiln_set_name(b->ctx, t, name);
    return t;
}

/* A leaf named as GGUF names tensors: blk.LAYER.NAME inside the layers, NAME outside. */
static kiln_tensor *leaf(mb *b, kiln_role role, kiln_type type, const char *name, int nd, int64_t ne0,
                         int64_t ne1, int64_t ne2) {
    char    full[FE_MAX_NAME];
    int64_t ne[3] = {ne0, ne1, ne2};
    if (b->il >= 0 && role == KILN_ROLE_WEIGHT) snprintf(full, sizeof full, "blk.%d.%s", b->il, name);
    else snprintf(full, sizeof full, "%s", name);
    return kiln_new_tensor(b->ctx, role, type, full, nd, ne);
}

/* The type of weight w (of the current layer): its tensor's in the file, else the mix's. */
static kiln_type weight_type(const mb *b, const km_weight *w) {
    kiln_type t = km_weight_type(b->hp, w, b->il);
    if (!b->file) return t;
    char name[FE_MAX_NAME];
    if (b->il >= 0) snprintf(name, sizeof name, "blk.%d.%s", b->il, w->name);
    else snprintf(name, sizeof name, "%s", w->name);
    kiln_gguf_tensor info;
    int64_t          i = kiln_gguf_find_tensor(b->file, name);
    kiln_status      st = i >= 0 ? kiln_gguf_tensor_info(b->file, i, &info) : NULL;
    if (st) kiln_status_free(st); /* cannot fail for an index find gave */
    return i >= 0 && !st && info.has_kiln_type ? info.type : t;
}

/* Weight id of the table in model/arch.h, in the current layer when it is a layer's; NULL
 * when the model has none (a bias, a QK-norm, ...). */
static kiln_tensor *weight(mb *b, km_weight_id id) {
    const km_weight *w = &km_weights[id];
    if (!km_weight_present(b->hp, w, b->il)) return NULL;
    int64_t ne[4];
    km_weight_shape(b->hp, w, ne);
    return leaf(b, KILN_ROLE_WEIGHT, weight_type(b, w), w->name, w->n_dims, ne[0], ne[1], ne[2]);
}

/* ---- layer weights ---------------------------------------------------------------------------- */

static void attn_weights(mb *b, layer_w *w) {
    int64_t row = km_cache_row(b->hp);
    w->attn_norm = weight(b, KM_W_ATTN_NORM);
    w->q_a_norm = weight(b, KM_W_ATTN_Q_A_NORM);
    w->kv_a_norm = weight(b, KM_W_ATTN_KV_A_NORM);
    w->wq_a = weight(b, KM_W_ATTN_Q_A);
    w->wq_b = weight(b, KM_W_ATTN_Q_B);
    w->wqkv = weight(b, KM_W_ATTN_QKV);
    w->wq = weight(b, KM_W_ATTN_Q);
    w->wk = weight(b, KM_W_ATTN_K);
    w->wv = weight(b, KM_W_ATTN_V);
    w->wkv_a = weight(b, KM_W_ATTN_KV_A_MQA);
    w->wk_b = weight(b, KM_W_ATTN_K_B);
    w->wv_b = weight(b, KM_W_ATTN_V_B);
    w->bq = weight(b, KM_W_ATTN_Q_BIAS);
    w->bk = weight(b, KM_W_ATTN_K_BIAS);
    w->bv = weight(b, KM_W_ATTN_V_BIAS);
    w->q_norm = weight(b, KM_W_ATTN_Q_NORM);
    w->k_norm = weight(b, KM_W_ATTN_K_NORM);
    w->wo = weight(b, KM_W_ATTN_OUT);
    w->bo = weight(b, KM_W_ATTN_OUT_BIAS);
    w->sinks = weight(b, KM_W_ATTN_SINKS);
    w->attn_post_norm = weight(b, KM_W_ATTN_POST_NORM);
    /* the KV cache of this layer: [n_embd_k_gqa, n_ctx] f16, as llama.cpp's cache_k_lN; MLA
     * has no V cache (V is the latent at the start of each K row) */
    char name[FE_MAX_NAME];
    snprintf(name, sizeof name, "cache_k_l%d", b->il);
    w->cache_k = leaf(b, KILN_ROLE_STATE, KILN_F16, name, 2, row, b->o.n_ctx, 1);
    snprintf(name, sizeof name, "cache_v_l%d", b->il);
    if (!km_mla(b->hp)) w->cache_v = leaf(b, KILN_ROLE_STATE, KILN_F16, name, 2, row, b->o.n_ctx, 1);
}

/* A dense FFN's three matrices, or the router and the experts' (the table says which). */
static void ffn_weights(mb *b, layer_w *w) {
    w->ffn_norm = weight(b, KM_W_FFN_NORM);
    w->ffn_gate = weight(b, KM_W_FFN_GATE);
    w->ffn_up = weight(b, KM_W_FFN_UP);
    w->ffn_up_gate = weight(b, KM_W_FFN_UP_GATE);
    w->ffn_down = weight(b, KM_W_FFN_DOWN);
    w->ffn_post_norm = weight(b, KM_W_FFN_POST_NORM);
    w->gate_inp = weight(b, KM_W_FFN_GATE_INP);
    w->gate_exps = weight(b, KM_W_FFN_GATE_EXPS);
    w->up_exps = weight(b, KM_W_FFN_UP_EXPS);
    w->down_exps = weight(b, KM_W_FFN_DOWN_EXPS);
    w->gate_inp_b = weight(b, KM_W_FFN_GATE_INP_BIAS);
    w->gate_exps_b = weight(b, KM_W_FFN_GATE_EXPS_BIAS);
    w->up_exps_b = weight(b, KM_W_FFN_UP_EXPS_BIAS);
    w->down_exps_b = weight(b, KM_W_FFN_DOWN_EXPS_BIAS);
    w->exp_probs_b = weight(b, KM_W_FFN_EXP_PROBS_B);
    w->gate_shexp = weight(b, KM_W_FFN_GATE_SHEXP);
    w->up_shexp = weight(b, KM_W_FFN_UP_SHEXP);
    w->down_shexp = weight(b, KM_W_FFN_DOWN_SHEXP);
}

/* ---- blocks ------------------------------------------------------------------------------------ */

/* build_norm(LLM_NORM_RMS): rms_norm then the weight (fused by rms_norm_mul). */
static kiln_tensor *norm_w(mb *b, kiln_tensor *x, kiln_tensor *w, const char *n_norm, const char *n_out) {
    kiln_tensor *n = nm(b, kiln_rms_norm(b->ctx, x, b->hp->rms_norm_eps), n_norm);
    return nm(b, kiln_mul(b->ctx, n, w), n_out);
}

/* build_qkv's separate path: the projection, then its bias when the model has one. */
static kiln_tensor *proj(mb *b, kiln_tensor *w, kiln_tensor *bias, kiln_tensor *x, const char *name) {
    kiln_tensor *y = nm(b, kiln_mul_mat(b->ctx, w, x), name);
    if (!bias) return y;
    char nb[FE_MAX_NAME];
    snprintf(nb, sizeof nb, "%s_b", name);
    return nm(b, kiln_add(b->ctx, y, bias), nb);
}

/* Tensor parallelism: a row-parallel product's partial sums (or a rank's share of the lookup)
 * summed over the group; the tensor itself for one rank (no node). */
static kiln_tensor *reduce(mb *b, kiln_tensor *x, const char *name) {
    return b->tp > 1 ? nm(b, kiln_all_reduce(b->ctx, x, b->tp), name) : x;
}

static kiln_tensor *reshape(mb *b, kiln_tensor *x, int nd, int64_t ne0, int64_t ne1, int64_t ne2, const char *name) {
    int64_t ne[3] = {ne0, ne1, ne2};
    return nm(b, kiln_reshape(b->ctx, x, nd, ne), name);
}

kiln_tensor *km_arch_rope(kiln_ctx *ctx, const kiln_model_hparams *hp, kiln_tensor *x, kiln_tensor *pos,
                          kiln_tensor *freqs) {
    int   a = km_arch_find(hp->arch), mode = a >= 0 ? km_archs[a].rope_mode : KILN_ROPE_NORMAL;
    bool  yarn = hp->rope_scaling == KILN_ROPE_SCALING_YARN;
    float freq_scale = hp->rope_scaling == KILN_ROPE_SCALING_LINEAR || yarn ? 1.0f / hp->rope_factor : 1.0f;
    /* beta 32/1: llama.cpp's defaults; ext_factor 1 with YaRN, else 0 (cparams.yarn_ext_factor);
     * attn_factor the file's rope.scaling.attn_factor (longrope, yarn) or 1: ggml's rope itself
     * multiplies YaRN's magnitude by 1 + 0.1 ln(1 / freq_scale) */
    float attn = hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f;
    /* deepseek2: llama.cpp cancels that magnitude (yarn_attn_factor_adjust) and scales the
     * attention instead (mla_scale) */
    if (yarn && a >= 0 && km_archs[a].mla) attn /= 1.0f + 0.1f * logf(hp->rope_factor);
    int   orig = hp->rope_scaling == KILN_ROPE_SCALING_LONGROPE || yarn ? (int)hp->rope_orig_ctx : (int)hp->n_ctx_train;
    return kiln_rope_ext(ctx, x, pos, freqs, (int)km_rot(hp), mode, orig, hp->rope_freq_base, freq_scale,
                         yarn ? 1.0f : 0.0f, attn, 32.0f, 1.0f);
}

kiln_tensor *km_layer_rope(kiln_ctx *ctx, const kiln_model_hparams *hp, int64_t il, kiln_tensor *x, kiln_tensor *pos,
                           kiln_tensor *freqs) {
    if (!km_layer_swa(hp, il)) return km_arch_rope(ctx, hp, x, pos, freqs);
    /* get_rope_freq_base/scale of a sliding-window layer: rope_freq_base_train_swa, and gemma3's
     * rope_freq_scale_train_swa 1 (the others keep the file's scaling) */
    kiln_model_hparams local = *hp;
    int                a = km_arch_find(hp->arch);
    local.rope_freq_base = hp->rope_freq_base_swa;
    if (a >= 0 && km_archs[a].swa_rope_unscaled) local.rope_scaling = KILN_ROPE_SCALING_NONE, freqs = NULL;
    return km_arch_rope(ctx, &local, x, pos, freqs);
}

static kiln_tensor *rope(mb *b, kiln_tensor *x, const char *name) {
    return nm(b, km_layer_rope(b->ctx, b->hp, b->il, x, b->pos, b->rope_freqs), name);
}

/* The heads of cache rows 0 .. n_kv-1 (llama.cpp's get_k / get_v): [hd, n_head_kv, n_kv]. */
static kiln_tensor *cache_heads(mb *b, kiln_tensor *cache, const char *name) {
    int64_t hd = b->hp->head_dim, es = (int64_t)kiln_type_size(KILN_F16);
    int64_t ne[3] = {hd, b->hp->n_head_kv, b->KV};
    size_t  nb[2] = {(size_t)(hd * es), (size_t)(hd * b->hp->n_head_kv * es)};
    return nm(b, kiln_view(b->ctx, cache, 3, ne, nb, 0), name);
}

/* Heads of the fused q/k/v product [qkv, T]: `heads` heads of head_dim from row `row0`, as
 * build_qkv's ggml_view_3d (the product's row stride kept). */
static kiln_tensor *qkv_part(mb *b, kiln_tensor *qkv, int64_t heads, int64_t row0, const char *name) {
    int64_t hd = b->hp->head_dim, ne[3] = {hd, heads, b->T};
    size_t  es = kiln_type_size(KILN_F32), nb[2] = {(size_t)hd * es, kiln_tensor_nb(qkv, 1)};
    return nm(b, kiln_view(b->ctx, qkv, 3, ne, nb, (size_t)row0 * es), name);
}

/* build_attn with a KV cache and flash attention: Q/K/V, (QK-norm), rope, K and V written into
 * the cache with set_rows, attention over n_kv cache rows, the output projection. */
static kiln_tensor *attention(mb *b, const layer_w *w, kiln_tensor *x) {
    const kiln_model_hparams *hp = b->hp;
    kiln_ctx *ctx = b->ctx;
    int64_t   hd = hp->head_dim, gqa = hd * hp->n_head_kv, T = b->T;
    kiln_tensor *Q, *K, *V3;
    if (w->wqkv) { /* phi3: build_qkv's fused path, q, k and v viewed out of one product */
        kiln_tensor *qkv = nm(b, kiln_mul_mat(ctx, w->wqkv, x), "QKVcur");
        Q = qkv_part(b, qkv, hp->n_head, 0, "Q3");
        K = qkv_part(b, qkv, hp->n_head_kv, hd * hp->n_head, "K3");
        V3 = qkv_part(b, qkv, hp->n_head_kv, hd * hp->n_head + gqa, "V3");
    } else {
        kiln_tensor *Qc = proj(b, w->wq, w->bq, x, "Qcur");
        kiln_tensor *Kc = proj(b, w->wk, w->bk, x, "Kcur");
        kiln_tensor *Vc = proj(b, w->wv, w->bv, x, "Vcur");
        Q = reshape(b, Qc, 3, hd, hp->n_head, T, "Q3");
        K = reshape(b, Kc, 3, hd, hp->n_head_kv, T, "K3");
        V3 = reshape(b, Vc, 3, hd, hp->n_head_kv, T, "V3");
    }
    if (hp->qk_norm) {
        Q = norm_w(b, Q, w->q_norm, "Qn", "Qnw");
        K = norm_w(b, K, w->k_norm, "Kn", "Knw");
    }
    if (km_layer_ropes(hp, b->il)) { /* smollm3: every 4th layer has none */
        Q = rope(b, Q, "Qrope");
        K = rope(b, K, "Krope");
    }
    /* gemma3: Q times f_attention_scale after its rope (the attention then unscaled) */
    if (hp->query_scale != 0.0f) Q = nm(b, kiln_scale(ctx, Q, hp->query_scale, 0.0f), "Qscaled");
    kiln_tensor *k_row = reshape(b, K, 2, gqa, T, 1, "k_row"); /* (a rope's result: contiguous) */
    kiln_tensor *v_row;
    if (w->wqkv) { /* phi3: v's rows are a 2-D view of the fused product; q is scaled itself */
        int64_t ne[2] = {gqa, T};
        size_t  nb[1] = {kiln_tensor_nb(V3, 2)};
        v_row = nm(b, kiln_view(ctx, V3, 2, ne, nb, 0), "v_row");
        Q = nm(b, kiln_scale(ctx, Q, 1.0f / sqrtf((float)hd), 0.0f), "Qscaled");
    } else {
        v_row = reshape(b, V3, 2, gqa, T, 1, "v_row");
    }
    kiln_tensor *k_cache = nm(b, kiln_set_rows(ctx, w->cache_k, k_row, b->kv_idxs), "k_cache");
    kiln_tensor *v_cache = nm(b, kiln_set_rows(ctx, w->cache_v, v_row, b->kv_idxs), "v_cache");
    kiln_tensor *q = nm(b, kiln_permute(ctx, Q, 0, 2, 1, 3), "q");
    kiln_tensor *k_heads = cache_heads(b, k_cache, "k_heads");
    kiln_tensor *v_heads = cache_heads(b, v_cache, "v_heads");
    kiln_tensor *k = nm(b, kiln_permute(ctx, k_heads, 0, 2, 1, 3), "k");
    kiln_tensor *v = nm(b, kiln_permute(ctx, v_heads, 0, 2, 1, 3), "v");
    /* granite: attention_scale replaces 1/sqrt(head size) when set; phi3 and gemma3 scaled q
     * already */
    float scale = w->wqkv || hp->query_scale != 0.0f ? 1.0f
                : hp->attention_scale != 0.0f ? hp->attention_scale : 1.0f / sqrtf((float)hd);
    kiln_tensor *mask = km_layer_swa(hp, b->il) ? b->mask_swa : b->mask;
    /* gemma2: the scores soft-capped (llama.cpp passes f_attn_logit_softcapping when attn_soft_cap) */
    /* gpt-oss: each head's sink joins its softmax (ggml_flash_attn_ext_add_sinks) */
    kiln_tensor *attn = nm(b, kiln_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, hp->attn_softcap, w->sinks), "attn");
    kiln_tensor *flat = reshape(b, attn, 2, hd * hp->n_head, T, 1, "attn_flat");
    kiln_tensor *out = nm(b, kiln_mul_mat(ctx, w->wo, flat), "attn_out");
    out = reduce(b, out, "attn_out_sum");
    return w->bo ? nm(b, kiln_add(ctx, out, w->bo), "attn_out_b") : out; /* gpt-oss: build_attn's bo */
}

/* A 3-D view of x: ne0 x ne1 x ne2 from element off, rows nb1 and planes nb2 bytes apart. */
static kiln_tensor *view3(mb *b, kiln_tensor *x, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2,
                          int64_t off, const char *name) {
    int64_t ne[3] = {ne0, ne1, ne2};
    size_t  nb[2] = {nb1, nb2};
    return nm(b, kiln_view(b->ctx, x, 3, ne, nb, (size_t)off * kiln_type_size(x->type)), name);
}

/* deepseek2's attention scale: 1/sqrt(head_dim) times mscale^2, mscale = 1 + 0.1 m ln(factor)
 * with YaRN (llama.cpp's kq_scale; its rope then has unit magnitude, km_arch_rope). */
static float mla_scale(const kiln_model_hparams *hp) {
    float ms = 1.0f;
    if (hp->rope_scaling == KILN_ROPE_SCALING_YARN) {
        float attn = hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f;
        ms = attn * (1.0f + 0.1f * hp->rope_yarn_log_mul * logf(hp->rope_factor));
    }
    return ms * ms / sqrtf((float)hp->head_dim);
}

/* deepseek2's multi-head latent attention, the absorbed path llama.cpp builds (deepseek2.cpp,
 * is_mla): each Q head's nope part mapped into the latent by attn_k_b, its rope part roped;
 * K per token the normed latent and one roped key shared by all heads, cached as one row; V
 * the latent (a view of the same rows); each head's output mapped out of the latent by
 * attn_v_b. Attention thus runs over one kv head of kv_lora_rank + n_rot. */
static kiln_tensor *attention_mla(mb *b, const layer_w *w, kiln_tensor *x) {
    const kiln_model_hparams *hp = b->hp;
    kiln_ctx *ctx = b->ctx;
    int64_t   nh = hp->n_head, hd = hp->head_dim, rot = km_rot(hp), nope = hd - rot, lora = hp->kv_lora_rank;
    int64_t   row = lora + rot, dv = km_head_v(hp), T = b->T, fs = (int64_t)kiln_type_size(KILN_F32);
    kiln_tensor *q;
    if (w->wq_a) {
        kiln_tensor *qa = nm(b, kiln_mul_mat(ctx, w->wq_a, x), "q_a");
        q = nm(b, kiln_mul_mat(ctx, w->wq_b, norm_w(b, qa, w->q_a_norm, "q_a_n", "q_a_normed")), "Qcur");
    } else {
        q = nm(b, kiln_mul_mat(ctx, w->wq, x), "Qcur");
    }
    size_t       qrow = kiln_tensor_nb(q, 1);
    kiln_tensor *q_nope = view3(b, q, nope, nh, T, (size_t)(hd * fs), qrow, 0, "q_nope");
    kiln_tensor *q_pe = view3(b, q, rot, nh, T, (size_t)(hd * fs), qrow, nope, "q_pe");
    kiln_tensor *kv = nm(b, kiln_mul_mat(ctx, w->wkv_a, x), "kv_cmpr_pe");
    size_t       kvrow = kiln_tensor_nb(kv, 1);
    int64_t      ne2[2] = {lora, T};
    size_t       nb2[1] = {kvrow};
    kiln_tensor *kv_cmpr = nm(b, kiln_view(ctx, kv, 2, ne2, nb2, 0), "kv_cmpr");
    kiln_tensor *k_pe = view3(b, kv, rot, 1, T, kvrow, kvrow, lora, "k_pe");
    q_pe = rope(b, q_pe, "q_pe_rope");
    k_pe = rope(b, k_pe, "k_pe_rope");
    kv_cmpr = norm_w(b, kv_cmpr, w->kv_a_norm, "kv_n", "kv_cmpr_normed");
    /* absorption: per head h, wk_b[h]^T q_nope[h] ({nope, T, nh} x {nope, lora, nh}) */
    kiln_tensor *q_nope_t = nm(b, kiln_permute(ctx, q_nope, 0, 2, 1, 3), "q_nope_t");
    kiln_tensor *q_abs = nm(b, kiln_mul_mat(ctx, w->wk_b, q_nope_t), "q_nope_absorbed");
    q_abs = nm(b, kiln_permute(ctx, q_abs, 0, 2, 1, 3), "q_abs_t");
    kiln_tensor *Q = nm(b, kiln_concat(ctx, q_abs, q_pe, 0), "Q3");
    kiln_tensor *K = nm(b, kiln_concat(ctx, reshape(b, kv_cmpr, 3, lora, 1, T, "kv_cmpr3"), k_pe, 0), "K3");
    kiln_tensor *k_row = reshape(b, K, 2, row, T, 1, "k_row");
    kiln_tensor *k_cache = nm(b, kiln_set_rows(ctx, w->cache_k, k_row, b->kv_idxs), "k_cache");
    int64_t      es = (int64_t)kiln_type_size(KILN_F16);
    kiln_tensor *k_heads = view3(b, k_cache, row, 1, b->KV, (size_t)(row * es), (size_t)(row * es), 0, "k_heads");
    kiln_tensor *v_heads = view3(b, k_cache, lora, 1, b->KV, (size_t)(row * es), (size_t)(row * es), 0, "v_heads");
    kiln_tensor *qp = nm(b, kiln_permute(ctx, Q, 0, 2, 1, 3), "q");
    kiln_tensor *k = nm(b, kiln_permute(ctx, k_heads, 0, 2, 1, 3), "k");
    kiln_tensor *v = nm(b, kiln_permute(ctx, v_heads, 0, 2, 1, 3), "v");
    kiln_tensor *attn = nm(b, kiln_flash_attn_ext(ctx, qp, k, v, b->mask, mla_scale(hp), 0.0f, 0.0f, NULL), "attn");
    /* out of the latent: per head h, wv_b[h] o[h] ({lora, T, nh} x {lora, dv, nh}) */
    kiln_tensor *attn_t = nm(b, kiln_permute(ctx, attn, 0, 2, 1, 3), "attn_t");
    kiln_tensor *o = nm(b, kiln_mul_mat(ctx, w->wv_b, attn_t), "attn_v_mla");
    o = nm(b, kiln_cont(ctx, nm(b, kiln_permute(ctx, o, 0, 2, 1, 3), "attn_o_t")), "attn_o");
    kiln_tensor *flat = reshape(b, o, 2, dv * nh, T, 1, "attn_flat");
    /* split: each rank's heads give a partial sum (the latent cache is whole on every rank) */
    return reduce(b, nm(b, kiln_mul_mat(ctx, w->wo, flat), "attn_out"), "attn_out_sum");
}

/* build_ffn(LLM_FFN_SILU, LLM_FFN_PAR): up, gate, swiglu(gate, up), down (mul_mat_glu fuses). */
static kiln_tensor *ffn_dense(mb *b, const layer_w *w, kiln_tensor *x) {
    if (w->ffn_up_gate) { /* phi3: LLM_FFN_SWIGLU over one product, its first half the gate */
        kiln_tensor *ug = nm(b, kiln_mul_mat(b->ctx, w->ffn_up_gate, x), "up_gate");
        int64_t      ff = b->hp->n_ff, ne[2] = {ff, b->rows};
        size_t       nb[1] = {kiln_tensor_nb(ug, 1)};
        kiln_tensor *gate = nm(b, kiln_view(b->ctx, ug, 2, ne, nb, 0), "gate");
        kiln_tensor *up = nm(b, kiln_view(b->ctx, ug, 2, ne, nb, (size_t)ff * kiln_type_size(KILN_F32)), "up");
        kiln_tensor *act = nm(b, kiln_swiglu(b->ctx, gate, up, false), "act");
        return nm(b, kiln_mul_mat(b->ctx, w->ffn_down, act), "down");
    }
    kiln_tensor *up = nm(b, kiln_mul_mat(b->ctx, w->ffn_up, x), "up");
    kiln_tensor *gate = nm(b, kiln_mul_mat(b->ctx, w->ffn_gate, x), "gate");
    /* gemma3: LLM_FFN_GELU with a parallel gate, ggml_geglu_split (tanh GELU of the gate) */
    kiln_tensor *act = nm(b, km_archs[b->arch].gemma ? kiln_geglu(b->ctx, gate, up, false) : kiln_swiglu(b->ctx, gate, up, false),
                          "act");
    return nm(b, kiln_mul_mat(b->ctx, w->ffn_down, act), "down");
}

/* build_moe_ffn's group-limited choice (DeepSeek-V3's): the experts in n_expert_groups groups, a
 * group scored by the sum of its two best values of sel, and only experts of the n_group_used
 * best groups chosen. llama.cpp sets the others to -inf through set_rows; here a group scoring
 * below the n_group_used-th best score gets sel - 1e30 (finite: 0 x inf would be NaN), which no
 * top-k of n_expert_used <= n_group_used x group size reaches. The same choice but for exact
 * ties of two group scores at the threshold, where both groups stay. */
static kiln_tensor *group_limit(mb *b, kiln_tensor *sel) {
    const kiln_model_hparams *hp = b->hp;
    kiln_ctx *ctx = b->ctx;
    int64_t   G = hp->n_expert_groups, epg = hp->n_expert / G, R = b->rows, ngu = hp->n_group_used;
    kiln_tensor *groups = reshape(b, sel, 3, epg, G, R, "sel_groups");
    kiln_tensor *top2 = nm(b, kiln_argsort_top_k(ctx, groups, 2), "group_top2");
    int64_t      ne4[4] = {1, epg, G, R};
    kiln_tensor *g4 = nm(b, kiln_reshape(ctx, groups, 4, ne4), "sel_groups4");
    kiln_tensor *vals = nm(b, kiln_get_rows(ctx, g4, top2), "group_top2_vals");
    kiln_tensor *score = nm(b, kiln_sum_rows(ctx, reshape(b, vals, 3, 2, G, R, "group_vals3")), "group_scores");
    kiln_tensor *best = nm(b, kiln_argsort_top_k(ctx, reshape(b, score, 2, G, R, 1, "group_scores2"), (int)ngu),
                           "group_topk");
    kiln_tensor *bestv = nm(b, kiln_get_rows(ctx, score, best), "group_topk_vals"); /* [1, ngu, R], descending */
    kiln_tensor *th = view3(b, bestv, 1, 1, R, kiln_tensor_nb(bestv, 1), kiln_tensor_nb(bestv, 2), ngu - 1,
                            "group_threshold");
    kiln_tensor *gap = nm(b, kiln_scale(ctx, nm(b, kiln_sub(ctx, score, th), "group_margin"), -1.0f, 0.0f), "group_gap");
    kiln_tensor *below = nm(b, kiln_step(ctx, gap), "group_below"); /* 1: under the threshold */
    kiln_tensor *masked = nm(b, kiln_add(ctx, groups, nm(b, kiln_scale(ctx, below, -1e30f, 0.0f), "group_off")),
                             "groups_masked");
    return reshape(b, masked, 2, hp->n_expert, R, 1, "probs_limited");
}

/* build_moe_ffn's routing with softmax gating: the top n_expert_used experts and their
 * probabilities, renormalized when norm_topk_prob (the topk_moe fusion takes all of it).
 * Returns the weights [1, n_used, rows]; *selected gets the experts i32 [n_used, rows]. */
static kiln_tensor *moe_route(mb *b, const layer_w *w, kiln_tensor *x, kiln_tensor **selected) {
    const kiln_model_hparams *hp = b->hp;
    kiln_ctx *ctx = b->ctx;
    int64_t   E = hp->n_expert, k = hp->n_expert_used, R = b->rows;
    kiln_tensor *logits = nm(b, kiln_mul_mat(ctx, w->gate_inp, x), "moe_logits");
    if (w->gate_inp_b) { /* gpt-oss: the router's bias, then LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT: */
        logits = nm(b, kiln_add(ctx, logits, w->gate_inp_b), "moe_logits_b");
        /* the top-k of the logits themselves, their values softmaxed over the selected */
        *selected = nm(b, kiln_argsort_top_k(ctx, logits, (int)k), "selected");
        kiln_tensor *l3 = reshape(b, logits, 3, 1, E, R, "logits3");
        kiln_tensor *sel = nm(b, kiln_get_rows(ctx, l3, *selected), "weights_l");
        kiln_tensor *s2 = nm(b, kiln_soft_max(ctx, reshape(b, sel, 2, k, R, 1, "weights_l2")), "weights_sm");
        return reshape(b, s2, 3, 1, k, R, "weights3");
    }
    /* deepseek2 (V3): sigmoid gating */
    kiln_tensor *probs = nm(b, hp->expert_gating == KILN_GATING_SIGMOID ? kiln_sigmoid(ctx, logits)
                                                                        : kiln_soft_max(ctx, logits), "probs");
    /* deepseek2 (V3): the bias steers the choice only; the weights are the unbiased probs */
    kiln_tensor *sel = w->exp_probs_b ? nm(b, kiln_add(ctx, probs, w->exp_probs_b), "probs_biased") : probs;
    if (hp->n_expert_groups > 1) sel = group_limit(b, sel);
    *selected = nm(b, kiln_argsort_top_k(ctx, sel, (int)k), "selected");
    kiln_tensor *probs3 = reshape(b, probs, 3, 1, E, R, "probs3");
    kiln_tensor *weights = nm(b, kiln_get_rows(ctx, probs3, *selected), "weights");
    if (hp->norm_topk_prob) {
        kiln_tensor *w2 = reshape(b, weights, 2, k, R, 1, "weights2");
        kiln_tensor *sum = nm(b, kiln_sum_rows(ctx, w2), "weights_sum");
        /* deepseek2: llama.cpp clamps the sum (sigmoid weights may all be near 0) */
        if (km_archs[b->arch].mla) sum = nm(b, kiln_clamp(ctx, sum, 6.103515625e-5f, INFINITY), "weights_sum_c");
        kiln_tensor *wn = nm(b, kiln_div(ctx, w2, sum), "weights_n");
        weights = reshape(b, wn, 3, 1, k, R, "weights3");
    }
    /* deepseek2: routed_scaling_factor */
    if (hp->expert_weights_scale != 0.0f)
        weights = nm(b, kiln_scale(ctx, weights, hp->expert_weights_scale, 0.0f), "weights_scaled");
    return weights;
}

/* build_moe_ffn's experts: up and gate through mul_mat_id, swiglu, down, weighted by the
 * routing weights, then the n_used slots summed one add at a time (add_chain fuses). */
static kiln_tensor *ffn_moe(mb *b, const layer_w *w, kiln_tensor *x) {
    const kiln_model_hparams *hp = b->hp;
    kiln_ctx *ctx = b->ctx;
    int64_t   k = hp->n_expert_used, R = b->rows;
    kiln_tensor *selected;
    kiln_tensor *weights = moe_route(b, w, x, &selected);
    kiln_tensor *x3 = reshape(b, x, 3, hp->n_embd, 1, R, "x3");
    kiln_tensor *up = nm(b, kiln_mul_mat_id(ctx, w->up_exps, x3, selected), "up");
    if (w->up_exps_b) up = nm(b, kiln_add_id(ctx, up, w->up_exps_b, selected), "up_b"); /* gpt-oss's biases */
    kiln_tensor *gate = nm(b, kiln_mul_mat_id(ctx, w->gate_exps, x3, selected), "gate");
    if (w->gate_exps_b) gate = nm(b, kiln_add_id(ctx, gate, w->gate_exps_b, selected), "gate_b");
    /* gpt-oss: LLM_FFN_SWIGLU_OAI_MOE, alpha 1.702 and limit 7 (constants of build_moe_ffn) */
    kiln_tensor *par = nm(b, km_archs[b->arch].oai ? kiln_swiglu_oai(ctx, gate, up, false, 1.702f, 7.0f)
                                                   : kiln_swiglu(ctx, gate, up, false), "par");
    kiln_tensor *experts = nm(b, kiln_mul_mat_id(ctx, w->down_exps, par, selected), "experts");
    /* gpt-oss's down biases: split over ranks, each rank's experts give partial sums that the
     * layer's all_reduce adds, so the bias joins on rank 0 alone (weighted, it is still added
     * once: the weighting and the slot sum are linear) */
    if (w->down_exps_b && b->o.tp_rank == 0)
        experts = nm(b, kiln_add_id(ctx, experts, w->down_exps_b, selected), "experts_b");
    kiln_tensor *weighted = nm(b, kiln_mul(ctx, experts, weights), "weighted");
    if (!weighted) return NULL;
    kiln_tensor **e = calloc((size_t)k, sizeof *e);
    if (!e) {
        fe_failf(ctx, KILN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    int64_t ne[2] = {hp->n_embd, R};
    size_t  nb[1] = {kiln_tensor_nb(weighted, 2)};
    char    name[32];
    /* all views before the adds, as build_moe_ffn orders them */
    for (int64_t i = 0; i < k; i++) {
        snprintf(name, sizeof name, "e%d", (int)i);
        e[i] = nm(b, kiln_view(ctx, weighted, 2, ne, nb, (size_t)i * kiln_tensor_nb(weighted, 1)), name);
    }
    kiln_tensor *sum = e[0];
    for (int64_t i = 1; i < k; i++) {
        snprintf(name, sizeof name, i + 1 == k ? "moe_out" : "s%d", (int)i);
        sum = nm(b, kiln_add(ctx, sum, e[i]), name);
    }
    free(e);
    /* one expert: a view of the weighted slots, which llama.cpp makes contiguous */
    if (k == 1) sum = nm(b, kiln_cont(ctx, sum), "moe_out");
    return sum;
}

/* deepseek2's shared experts: build_ffn(LLM_FFN_SILU, LLM_FFN_PAR) of the shexp weights. */
static kiln_tensor *ffn_shexp(mb *b, const layer_w *w, kiln_tensor *x) {
    kiln_tensor *up = nm(b, kiln_mul_mat(b->ctx, w->up_shexp, x), "up_shexp");
    kiln_tensor *gate = nm(b, kiln_mul_mat(b->ctx, w->gate_shexp, x), "gate_shexp");
    kiln_tensor *act = nm(b, kiln_swiglu(b->ctx, gate, up, false), "act_shexp");
    return nm(b, kiln_mul_mat(b->ctx, w->down_shexp, act), "down_shexp");
}

/* granite: a residual branch times residual_scale before its add (llama.cpp's build_layer_ffn),
 * when the model has one. */
static kiln_tensor *residual_scaled(mb *b, kiln_tensor *x, const char *name) {
    return b->hp->residual_scale != 0.0f ? nm(b, kiln_scale(b->ctx, x, b->hp->residual_scale, 0.0f), name) : x;
}

/* One decoder layer. The last one keeps only the output rows (inp_out_ids) after attention,
 * as llama.cpp does, so the FFN and the logits run on n_outputs rows. */
static kiln_tensor *layer(mb *b, kiln_tensor *inpL) {
    const kiln_model_hparams *hp = b->hp;
    kiln_ctx *ctx = b->ctx;
    layer_w   w = {0};
    attn_weights(b, &w);
    ffn_weights(b, &w);
    kiln_tensor *x = norm_w(b, inpL, w.attn_norm, "norm", "attn_in");
    kiln_tensor *cur = km_mla(hp) ? attention_mla(b, &w, x) : attention(b, &w, x);
    kiln_tensor *inpSA = inpL;
    if (b->il == hp->n_layer - 1) {
        cur = nm(b, kiln_get_rows(ctx, cur, b->out_ids), "attn_out_rows");
        inpSA = nm(b, kiln_get_rows(ctx, inpL, b->out_ids), "inp_rows");
        b->rows = b->o.outputs == KILN_OUTPUTS_LAST ? 1 : b->T;
    }
    cur = residual_scaled(b, cur, "attn_scaled");
    /* gemma3: a norm of each branch before its residual add */
    bool gemma = km_archs[b->arch].gemma;
    if (gemma) cur = norm_w(b, cur, w.attn_post_norm, "norm_post", "attn_post_norm");
    kiln_tensor *ffn_inp = nm(b, kiln_add(ctx, cur, inpSA), "ffn_inp");
    /* gpt-oss: the FFN's norm is the weight named post_attention_norm */
    kiln_tensor *ffn_in = norm_w(b, ffn_inp, w.ffn_norm ? w.ffn_norm : w.attn_post_norm, "norm2", "ffn_in");
    kiln_tensor *ffn_out = km_layer_moe(hp, b->il) ? ffn_moe(b, &w, ffn_in) : ffn_dense(b, &w, ffn_in);
    /* deepseek2: the shared experts, one dense FFN beside the routed ones, added unweighted;
     * split, both are partial sums, all-reduced together (one rank: the same graph) */
    if (w.gate_shexp && ffn_out) ffn_out = nm(b, kiln_add(ctx, ffn_out, ffn_shexp(b, &w, ffn_in)), "ffn_moe_shexp");
    if (ffn_out) ffn_out = reduce(b, ffn_out, "ffn_out_sum");
    ffn_out = residual_scaled(b, ffn_out, "ffn_scaled");
    if (w.ffn_post_norm) ffn_out = norm_w(b, ffn_out, w.ffn_post_norm, "norm_ffn_post", "ffn_post_norm");
    return nm(b, kiln_add(ctx, ffn_out, ffn_inp), "l_out");
}

/* ---- inputs and the whole model ------------------------------------------------------------------ */

/* build_inp_embd, build_inp_pos, build_attn_inp_kv, build_inp_out_ids. One slot list serves
 * K and V: with flash attention V is not transposed, so llama.cpp's k_idxs and v_idxs agree. */
static kiln_tensor *inputs(mb *b) {
    int64_t T = b->T;
    bool    first = b->o.layer_first == 0; /* (a later pipeline stage starts from inp_hidden) */
    kiln_tensor *tokens = first ? leaf(b, KILN_ROLE_INPUT, KILN_I32, "inp_tokens", 1, T, 1, 1) : NULL;
    kiln_tensor *embd = b->embd = first ? weight(b, KM_W_TOKEN_EMBD) : NULL;
    b->pos = leaf(b, KILN_ROLE_INPUT, KILN_I32, "inp_pos", 1, T, 1, 1);
    b->kv_idxs = leaf(b, KILN_ROLE_INPUT, KILN_I64, "kv_idxs", 1, T, 1, 1);
    /* the mask, or with mask_intervals each token's [first, end) cell (kiln_build_opts) */
    bool      iv = b->o.mask_intervals;
    kiln_type mt = iv ? KILN_I32 : KILN_F16;
    int64_t   mw = iv ? 2 : b->KV;
    b->mask = leaf(b, KILN_ROLE_INPUT, mt, "kq_mask", 2, mw, T, 1);
    /* gemma3: the sliding-window layers' mask (llama.cpp's iswa cache input, one cache here) */
    if (b->hp->n_swa > 0) b->mask_swa = leaf(b, KILN_ROLE_INPUT, mt, "kq_mask_swa", 2, mw, T, 1);
    if (b->o.layer_end == b->hp->n_layer) /* (the last layer picks the output rows) */
        b->out_ids = leaf(b, KILN_ROLE_INPUT, KILN_I32, "inp_out_ids", 1, b->o.outputs == KILN_OUTPUTS_LAST ? 1 : T, 1, 1);
    /* llama3's factors, or longrope's long or short ones by the cache size (km_rope_factors);
     * both of longrope's are the model's weights (a file has both), one is read. */
    const char  *factors = km_rope_factors(b->hp, b->o.n_ctx);
    kiln_tensor *llama3 = weight(b, KM_W_ROPE_FREQS), *lng = weight(b, KM_W_ROPE_FACTORS_LONG),
                *shrt = weight(b, KM_W_ROPE_FACTORS_SHORT);
    b->rope_freqs = !factors ? NULL : !strcmp(factors, "rope_factors_long.weight") ? lng
                                    : !strcmp(factors, "rope_factors_short.weight") ? shrt : llama3;
    if (!first) return leaf(b, KILN_ROLE_INPUT, KILN_F32, "inp_hidden", 2, b->hp->n_embd, T, 1);
    kiln_tensor *x = nm(b, kiln_get_rows(b->ctx, embd, tokens), "inp_embd");
    if (b->tp > 1) { /* the rows of tokens in this rank's shard, zero elsewhere, summed over the group */
        b->tok_shard = leaf(b, KILN_ROLE_INPUT, KILN_F32, "inp_tok_shard", 2, 1, T, 1);
        x = reduce(b, nm(b, kiln_mul(b->ctx, x, b->tok_shard), "inp_embd_shard"), "inp_embd_sum");
    }
    /* granite: build_inp_embd scales the embeddings by embedding_scale when set */
    if (b->hp->embedding_scale != 0.0f) x = nm(b, kiln_scale(b->ctx, x, b->hp->embedding_scale, 0.0f), "inp_scaled");
    /* gemma3: times sqrt(n_embd) (token embeddings; llama.cpp skips raw embedding inputs) */
    if (km_archs[b->arch].gemma) x = nm(b, kiln_scale(b->ctx, x, sqrtf((float)b->hp->n_embd), 0.0f), "inp_scaled");
    return x;
}

int64_t kiln_default_n_ctx(const kiln_model_hparams *hp) {
    return hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
}

int64_t kiln_default_n_batch(int64_t n_ctx) { return n_ctx < 512 ? n_ctx : 512; }

static kiln_status check_opts(const kiln_model_hparams *hp, const kiln_build_opts *in, kiln_build_opts *o) {
    kiln_build_opts d = {0};
    *o = in ? *in : d;
    if (o->n_ctx == 0) o->n_ctx = kiln_default_n_ctx(hp);
    if (o->n_tokens_max == 0) o->n_tokens_max = kiln_default_n_batch(o->n_ctx);
    if (o->n_ctx < 1 || o->n_ctx > ((int64_t)1 << 31))
        return kb_error(KILN_ERR_INVALID, "build: n_ctx = %lld is out of range (1 .. 2^31)", (long long)o->n_ctx);
    if (o->n_tokens_max < 1 || o->n_tokens_max > o->n_ctx)
        return kb_error(KILN_ERR_INVALID, "build: n_tokens_max = %lld is out of range (1 .. n_ctx = %lld: a "
                        "ubatch writes its tokens into distinct cache slots)", (long long)o->n_tokens_max,
                        (long long)o->n_ctx);
    if (o->tp_size == 0) o->tp_size = 1;
    if (o->tp_size < 1 || o->tp_size > 64 || o->tp_rank < 0 || o->tp_rank >= o->tp_size)
        return kb_error(KILN_ERR_INVALID, "build: tensor parallelism rank %d of %d: the group has 1 .. 64 ranks, the rank "
                        "is 0 .. tp_size - 1", o->tp_rank, o->tp_size);
    if (o->tp_size > 1) {
        kiln_status st = km_tp_check(hp, o->tp_size);
        if (st) return st;
        if (o->argmax || o->sampler)
            return kb_error(KILN_ERR_INVALID, "build: tensor parallelism: a rank's logits are a shard of the vocabulary; "
                            "argmax and the sampler need the ranks' logits gathered first (not built yet)");
        /* Routed experts split by their FFN columns as a dense FFN does (gate and up column-,
         * down row-parallel; the router whole on every rank, so each picks the same experts),
         * and the weighted sum of the partial outputs is all-reduced with the layer's FFN. */

    }
    if (o->layer_end == 0) o->layer_end = (int)hp->n_layer;
    if (o->layer_first < 0 || o->layer_first >= o->layer_end || o->layer_end > hp->n_layer)
        return kb_error(KILN_ERR_INVALID, "build: layers %d .. %d of %lld: a stage is layer_first .. layer_end - 1, "
                        "0 <= layer_first < layer_end <= n_layer", o->layer_first, o->layer_end - 1,
                        (long long)hp->n_layer);
    bool stage = o->layer_first > 0 || o->layer_end < hp->n_layer;
    if (stage && o->tp_size > 1)
        return kb_error(KILN_ERR_INVALID, "build: a pipeline stage (layers %d .. %d) split over %d ranks too: not built",
                        o->layer_first, o->layer_end - 1, o->tp_size);
    if (o->layer_end < hp->n_layer && (o->argmax || o->sampler))
        return kb_error(KILN_ERR_INVALID, "build: a pipeline stage before the last (layers %d .. %d) outputs the hidden "
                        "state; argmax and the sampler belong to the last", o->layer_first, o->layer_end - 1);
    if (o->n_tokens_upto != 0 && (o->n_tokens_upto < 2 || o->n_tokens_upto >= o->n_tokens_max))
        return kb_error(KILN_ERR_INVALID, "build: n_tokens_upto = %lld: 0, or 2 .. n_tokens_max - 1 (%lld)",
                        (long long)o->n_tokens_upto, (long long)(o->n_tokens_max - 1));
    if (o->outputs != KILN_OUTPUTS_LAST && o->outputs != KILN_OUTPUTS_ALL)
        return kb_error(KILN_ERR_INVALID, "build: outputs = %d is not a kiln_model_outputs", (int)o->outputs);
    /* The op samples one row, after the last token (docs/sampling.md, "On the GPU"). */
    if (o->sampler && o->outputs != KILN_OUTPUTS_LAST)
        return kb_error(KILN_ERR_INVALID, "build: a sampler needs outputs = KILN_OUTPUTS_LAST (one row of logits)");
    if (o->sampler && !kiln_sampler_on_gpu(o->sampler, hp->n_vocab))
        return kb_error(KILN_ERR_INVALID, "build: the sampler (temp %g, top_k %d, penalties %s) does not run on the "
                        "GPU: it needs temp > 0, no penalties and 1 <= top_k <= %d (or n_vocab %lld at most that); "
                        "kiln_sampler_on_gpu", (double)o->sampler->temp, (int)o->sampler->top_k,
                        kiln_sampler_penalized(o->sampler) ? "on" : "off", KILN_SAMPLE_GPU_MAX_K, (long long)hp->n_vocab);
    return NULL;
}

kiln_status kiln_build_model(kiln_ctx *ctx, const kiln_model_hparams *hp, const kiln_build_opts *o) {
    return km_build(ctx, hp, o, NULL);
}

kiln_status km_build(kiln_ctx *ctx, const kiln_model_hparams *hp, const kiln_build_opts *o, const kiln_gguf *file) {
    if (!ctx || !hp) return kb_error(KILN_ERR_INVALID, "kiln_build_model: NULL argument");
    kiln_status st = km_check(hp, !file);
    mb b = {.ctx = ctx, .hp = hp, .il = -1, .file = file};
    if (!st) st = check_opts(hp, o, &b.o);
    if (st) return st;
    b.arch = (km_arch)km_arch_find(hp->arch);
    /* A rank's model: its share of every extent the plan cuts (model/tp.c), so the weights,
     * caches and views below take a rank's shapes (km_tp_rank_shape). */
    kiln_model_hparams rank = *hp;
    b.tp = b.o.tp_size;
    if (b.tp > 1) {
        rank.n_head /= b.tp, rank.n_head_kv /= b.tp, rank.n_ff /= b.tp, rank.n_ff_exp /= b.tp;
        rank.n_vocab = km_tp_vocab_share(hp, b.tp); /* (padded: the last rank's extra rows are zero) */
        b.hp = hp = &rank;
    }
    b.T = kiln_dim(ctx, "n_tokens", b.o.n_tokens_max);
    if (b.o.n_tokens_max > 1) kiln_dim_specialize(ctx, "n_tokens", 1);
    if (b.o.n_tokens_upto) kiln_dim_specialize_upto(ctx, "n_tokens", b.o.n_tokens_upto);
    b.KV = kiln_dim(ctx, "n_kv", b.o.n_ctx);
    b.rows = b.T;
    kiln_tensor *cur = inputs(&b);
    for (b.il = b.o.layer_first; b.il < b.o.layer_end && !ctx->err; b.il++) cur = layer(&b, cur);
    b.il = -1;
    if (b.o.layer_end < hp->n_layer) { /* a pipeline stage: its hidden state for the next */
        kiln_set_output(ctx, cur, "hidden");
        return kiln_ctx_status(ctx);
    }
    kiln_tensor *out_norm = weight(&b, KM_W_OUTPUT_NORM);
    kiln_tensor *out_w = !hp->tied_output ? weight(&b, KM_W_OUTPUT) : b.embd ? b.embd : weight(&b, KM_W_TOKEN_EMBD);
    cur = norm_w(&b, cur, out_norm, "norm_out", "result_norm");
    kiln_tensor *logits = kiln_mul_mat(ctx, out_w, cur);
    /* granite: the logits divided by logit_scale (ggml_scale by its reciprocal, as llama.cpp) */
    if (hp->logit_scale != 0.0f) logits = kiln_scale(ctx, nm(&b, logits, "lm_head"), 1.0f / hp->logit_scale, 0.0f);
    /* gemma2: the logits soft-capped, c tanh(logits / c) as three ops */
    if (hp->final_softcap != 0.0f) {
        kiln_tensor *s = nm(&b, kiln_scale(ctx, nm(&b, logits, "lm_head"), 1.0f / hp->final_softcap, 0.0f), "logits_div");
        logits = kiln_scale(ctx, nm(&b, kiln_tanh(ctx, s), "logits_tanh"), hp->final_softcap, 0.0f);
    }
    kiln_set_output(ctx, logits, "logits");
    /* Greedy decoding needs only each row's largest logit: 4 bytes back instead of n_vocab
     * floats, and no host scan over the vocabulary. */
    if (b.o.argmax) kiln_set_output(ctx, kiln_argmax(ctx, logits), "argmax");
    /* Sampling inside the program: the pick follows the last token (its position + 1), and
     * chained decoding feeds it back as argmax's is (model/gen.c). */
    if (b.o.sampler) kiln_set_output(ctx, kiln_sample_row(ctx, logits, b.pos, b.o.sampler), "sample");
    return kiln_ctx_status(ctx);
}
