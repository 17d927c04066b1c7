/* File types (llama.cpp's llama_ftype, GGUF's general.file_type) and the type each gives every
 * weight: kiln's own table of the choices llama-quantize makes (llama.cpp src/llama-quant.cpp:
 * llama_tensor_get_type, llama_tensor_get_type_impl, tensor_type_fallback) for the file types
 * kiln writes, on the architectures kiln builds. docs/models.md lists the mix and where kiln
 * deviates from it. */
#include "model/arch.h"
#include "model/gguf.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define NONE KILN_TYPE_COUNT

/* One row per file type. In the terms of this table, llama-quantize gives a weight that it
 * quantizes (2-D and 3-D ".weight" tensors but norms and the router: KM_MIX_F32 is the rest)
 *   - the base type; float file types stop there (llama.cpp applies no rule to them);
 *   - output.weight, and token_embd.weight when the output is tied to it: `output`, or q8_0 when
 *     the base type's block does not divide its rows;
 *   - attn_v and ffn_down (also ffn_down_exps) in the layers use_more_bits picks: `more_bits`;
 *   - attn_v of a 70B model (use_more_bits aside): q5_K where the base is q4_K;
 *   - with exactly 8 experts: attn_k and attn_v q8_0, attn_output `moe8_out`;
 *   - phi3's fused attn_qkv: `qkv` (q5_K for Q4_K_M, q6_K for Q5_K_M);
 *   - MXFP4_MOE: every 3-D weight (the experts, ffn_down_exps included) `experts`, before any
 *     rule but the output's (llama.cpp: "MoE tensors -> MXFP4, other tensors -> Q8_0");
 * and then falls back (fallback()) where the type's block does not divide the rows. */
typedef struct {
    kiln_ftype  ftype;
    const char *name;
    kiln_type   base, output, more_bits, moe8_out;
    kiln_type   qkv;     /* phi3's fused attn_qkv (NONE: the base type) */
    kiln_type   experts; /* 3-D weights (NONE: the rules above) */
} ftype_row;

static const ftype_row rows[] = {
    {KILN_FTYPE_ALL_F32, "f32", KILN_F32, KILN_F32, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_F16, "f16", KILN_F16, KILN_F16, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_BF16, "bf16", KILN_BF16, KILN_BF16, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_Q8_0, "q8_0", KILN_Q8_0, KILN_Q8_0, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_Q4_0, "q4_0", KILN_Q4_0, KILN_Q6_K, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_Q5_0, "q5_0", KILN_Q5_0, KILN_Q6_K, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_Q5_1, "q5_1", KILN_Q5_1, KILN_Q6_K, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_Q4_K_M, "q4_k_m", KILN_Q4_K, KILN_Q6_K, KILN_Q6_K, KILN_Q5_K, KILN_Q5_K, NONE},
    {KILN_FTYPE_MOSTLY_Q5_K_M, "q5_k_m", KILN_Q5_K, KILN_Q6_K, KILN_Q6_K, NONE, KILN_Q6_K, NONE},
    {KILN_FTYPE_MOSTLY_Q6_K, "q6_k", KILN_Q6_K, KILN_Q6_K, NONE, NONE, NONE, NONE},
    {KILN_FTYPE_MOSTLY_MXFP4_MOE, "mxfp4_moe", KILN_Q8_0, KILN_Q6_K, NONE, NONE, NONE, KILN_MXFP4},
};
#define N_ROWS ((int)(sizeof rows / sizeof rows[0]))

static const ftype_row *row_of(kiln_ftype f) {
    for (int i = 0; i < N_ROWS; i++)
        if (rows[i].ftype == f) return &rows[i];
    return NULL;
}

const char *kiln_ftype_name(kiln_ftype f) {
    const ftype_row *r = row_of(f);
    return r ? r->name : "?";
}

int kiln_ftype_from_name(const char *name, kiln_ftype *out) {
    for (int i = 0; name && out && i < N_ROWS; i++)
        if (strcasecmp(rows[i].name, name) == 0) {
            *out = rows[i].ftype;
            return 0;
        }
    return -1;
}

const char *kiln_ftype_list(void) { return "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k_m, q5_k_m, q6_k, mxfp4_moe"; }

bool km_ftype_known(kiln_ftype f) { return row_of(f) != NULL; }

bool km_ftype_of_type(kiln_type t, kiln_ftype *out) {
    for (int i = 0; i < N_ROWS; i++)
        if (rows[i].base == t) {
            *out = rows[i].ftype;
            return true;
        }
    return false;
}

bool km_weight_type_ok(kiln_type t) {
    switch (t) {
    case KILN_F32: case KILN_F16: case KILN_BF16: case KILN_Q8_0: case KILN_Q4_0: case KILN_Q5_0: case KILN_Q5_1:
    case KILN_Q4_K: case KILN_Q5_K: case KILN_Q6_K: case KILN_MXFP4: return true;
    default: return false;
    }
}

const char *km_weight_type_list(void) { return "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K and mxfp4"; }

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static bool use_more_bits(int64_t il, int64_t n_layer) {
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

/* llama.cpp's LLM_TYPE_70B among the architectures kiln builds: llama with 80 layers and GQA
 * (without GQA it is the 65B), qwen2 with 80 layers. */
static bool is_70b(const kiln_model_hparams *hp) {
    int a = km_arch_find(hp->arch);
    return hp->n_layer == 80 && ((a == KM_ARCH_LLAMA && hp->n_head != hp->n_head_kv) || a == KM_ARCH_QWEN2);
}

/* The rules above for a quantized file type, before the fallback; more: the layer is one that
 * use_more_bits picks. */
static kiln_type mix_type(const kiln_model_hparams *hp, const ftype_row *r, km_mix mix, bool more, int64_t ne0) {
    bool moe8 = hp->n_expert == 8;
    bool more_bits = more && r->more_bits != NONE;
    switch (mix) {
    case KM_MIX_F32: return KILN_F32;
    case KM_MIX_EMBD:
        if (!hp->tied_output) return r->base;
        return ne0 % kiln_type_block(r->base) != 0 ? KILN_Q8_0 : r->output; /* the output's rule */
    case KM_MIX_OUTPUT: return ne0 % kiln_type_block(r->base) != 0 ? KILN_Q8_0 : r->output;
    case KM_MIX_ATTN_K: return moe8 ? KILN_Q8_0 : r->base;
    case KM_MIX_ATTN_V:
        if (moe8) return KILN_Q8_0;
        if (more_bits) return r->more_bits;
        return r->base == KILN_Q4_K && is_70b(hp) ? KILN_Q5_K : r->base;
    case KM_MIX_ATTN_OUT: return moe8 && r->moe8_out != NONE ? r->moe8_out : r->base;
    case KM_MIX_FFN_DOWN: return more_bits ? r->more_bits : r->base;
    case KM_MIX_ATTN_QKV: return r->qkv != NONE ? r->qkv : r->base; /* q5_K for Q4_K_M, q6_K for Q5_K_M */
    case KM_MIX_MATRIX: break;
    }
    return r->base;
}

/* tensor_type_fallback: a K-quant whose 256-element block does not divide the rows takes a type
 * of 32-element blocks, as llama.cpp: q5_0 for q4_K, q5_1 for q5_K and q8_0 for q6_K (so
 * DeepSeek-V2-Lite's 1408-wide ffn_down_exps in a Q4_K_M file are q5_0). Where 32 does not
 * divide the rows either: f16, as llama.cpp. Block-32 types have no fallback: llama.cpp refuses
 * such a tensor, and so does km_check_mix. */
static kiln_type fallback(kiln_type t, int64_t ne0) {
    if (kiln_type_block(t) != 256 || ne0 % 256 == 0) return t;
    kiln_type f = t == KILN_Q4_K ? KILN_Q5_0 : t == KILN_Q5_K ? KILN_Q5_1 : KILN_Q8_0;
    return ne0 % kiln_type_block(f) == 0 ? f : KILN_F16;
}

static kiln_type type_of(const kiln_model_hparams *hp, const km_weight *w, bool more) {
    const ftype_row *r = row_of(hp->ftype);
    if (w->mix == KM_MIX_F32 || !r) return KILN_F32; /* !r: kiln_model_check refuses hp */
    if (!kiln_type_is_quantized(r->base)) return r->base;
    int64_t ne[4];
    km_weight_shape(hp, w, ne);
    if (r->experts != NONE && ne[2] > 1 && w->mix != KM_MIX_OUTPUT) return fallback(r->experts, ne[0]);
    return fallback(mix_type(hp, r, w->mix, more, ne[0]), ne[0]);
}

kiln_type km_weight_type(const kiln_model_hparams *hp, const km_weight *w, int64_t il) {
    return type_of(hp, w, il >= 0 && use_more_bits(il, hp->n_layer));
}

kiln_status km_check_mix(const kiln_model_hparams *hp) {
    for (int k = 0; k < KM_W_COUNT; k++) {
        const km_weight *w = &km_weights[k];
        if (!km_weight_present(hp, w, -1)) continue;
        int64_t ne[4];
        km_weight_shape(hp, w, ne);
        /* A layer's type depends on the layer only through use_more_bits: both cases. */
        for (int more = 0; more < 2; more++) {
            kiln_type t = type_of(hp, w, more);
            if (ne[0] % kiln_type_block(t) == 0) continue;
            char shape[96];
            km_shape_text(ne, km_n_dims(ne), shape, sizeof shape);
            return kb_error(KILN_ERR_INVALID, "model: file type %s gives tensor '%s%s' %s %s, whose rows of %lld are "
                                              "not a multiple of %s's %lld-element blocks (llama-quantize refuses it "
                                              "too)", kiln_ftype_name(hp->ftype), w->in_layer ? "blk.0." : "",
                            w->name, kiln_type_name(t), shape, (long long)ne[0], kiln_type_name(t),
                            (long long)kiln_type_block(t));
        }
    }
    return NULL;
}

kiln_type kiln_model_weight_type(const kiln_model_hparams *hp, const char *name) {
    if (!hp || !name) return KILN_TYPE_COUNT;
    kiln_status st = km_check(hp, false); /* hyperparameters out of range have no weights */
    if (st) {
        kiln_status_free(st);
        return KILN_TYPE_COUNT;
    }
    int64_t     il = -1;
    const char *rest = name;
    if (strncmp(name, "blk.", 4) == 0) {
        il = 0;
        for (rest = name + 4; *rest >= '0' && *rest <= '9' && il <= hp->n_layer; rest++) il = il * 10 + (*rest - '0');
        if (rest == name + 4 || *rest != '.' || il >= hp->n_layer) return KILN_TYPE_COUNT;
        rest++;
    }
    for (int k = 0; k < KM_W_COUNT; k++) {
        const km_weight *w = &km_weights[k];
        if (w->in_layer == (il >= 0) && strcmp(w->name, rest) == 0 && km_weight_present(hp, w, il))
            return km_weight_type(hp, w, il);
    }
    return KILN_TYPE_COUNT;
}
