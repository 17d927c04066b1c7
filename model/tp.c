/* Tensor parallelism, the plan (issue 30): how the weights of a model split over g GPUs,
 * Megatron-style, before any program or collective exists. The split follows from the extents
 * alone (km_wdim): an extent counted in heads, in FFN columns, in expert FFN columns or in
 * vocabulary rows is sharded, every other one is whole on every rank. So
 *   - q, k, v (and their biases), gate and up (dense, shared and routed experts), MLA's attn_q_b
 *     and per-head attn_k_b / attn_v_b, gpt-oss's sinks: their sharded extent is cut in g
 *     (column-parallel: each rank computes its heads' or columns' outputs);
 *   - attn_output, ffn_down (dense, shared, routed): their input extent is cut (row-parallel:
 *     each rank's product is a partial sum, all-reduced after the layer's attention and FFN);
 *   - token_embd and output: cut by vocabulary rows (the lookup's ranks add their rows, zero
 *     elsewhere; the logits are gathered);
 *   - norms, rope factors, MLA's low-rank q_a / kv_a pair, the router and its biases, the biases
 *     added after a row-parallel product: whole on every rank.
 * phi3's fused attn_qkv and ffn_up (gate and up halves) cut each part alike, so a rank's share
 * is the whole's extent over g. A KV cache holds a rank's kv heads (n_head_kv / g each). */
#include "base/base.h"
#include "model/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether extent d is cut across the ranks (see above). */
bool km_tp_sharded(km_wdim d) {
    switch (d) {
    case KM_WD_HEADS:
    case KM_WD_Q:
    case KM_WD_KV:
    case KM_WD_FF:
    case KM_WD_FF2:
    case KM_WD_QKV:
    case KM_WD_FF_EXP:
    case KM_WD_O:
    case KM_WD_FF_SHEXP:
    case KM_WD_VOCAB: return true;
    default: return false;
    }
}

/* What each sharded extent is counted in, and the hyperparameter that must divide by g. */
typedef struct {
    const char *what; /* for the message: "attention heads", ... */
    const char *key;  /* the hyperparameter */
    int64_t     n;
} tp_unit;

static int units(const kiln_model_hparams *hp, tp_unit u[8]) {
    int n = 0;
    u[n++] = (tp_unit){"attention heads", "n_head", hp->n_head};
    if (!km_mla(hp)) u[n++] = (tp_unit){"kv heads (and the KV cache)", "n_head_kv", hp->n_head_kv};
    if (hp->n_ff > 0) u[n++] = (tp_unit){"FFN columns", "n_ff", hp->n_ff};
    if (hp->n_expert > 0) u[n++] = (tp_unit){"expert FFN columns", "n_ff_exp", hp->n_ff_exp};
    u[n++] = (tp_unit){"vocabulary rows (token_embd, output)", "n_vocab", hp->n_vocab};
    return n;
}

/* The vocabulary is padded instead (km_tp_vocab_share), as Megatron pads it: the other units
 * must divide. */
kiln_status km_tp_check(const kiln_model_hparams *hp, int g) {
    if (g < 1 || g > 64) return kb_error(KILN_ERR_INVALID, "tensor parallelism over %d GPUs: 1 .. 64", g);
    tp_unit u[8];
    int     n = units(hp, u);
    for (int i = 0; i < n; i++)
        if (u[i].n % g != 0 && strcmp(u[i].key, "n_vocab") != 0)
            return kb_error(KILN_ERR_INVALID, "tensor parallelism over %d GPUs: %s %lld is not a multiple of %d (the %s "
                                              "are split across the GPUs)", g, u[i].key, (long long)u[i].n, g, u[i].what);
    return NULL;
}

int km_tp_split_dim(const km_weight *w) {
    for (int d = 0; d < w->n_dims; d++)
        if (km_tp_sharded(w->ne[d])) return d;
    return -1;
}

bool km_tp_row_parallel(const km_weight *w) {
    /* a matrix whose input extent (ne0) is cut: its product is a partial sum */
    return w->n_dims >= 2 && km_tp_sharded(w->ne[0]) && w->ne[1] == KM_WD_EMBD;
}

int64_t km_tp_vocab_share(const kiln_model_hparams *hp, int g) { return g > 1 ? (hp->n_vocab + g - 1) / g : hp->n_vocab; }

void km_tp_rank_shape(const kiln_model_hparams *hp, const km_weight *w, int g, int64_t ne[4]) {
    km_weight_shape(hp, w, ne);
    int d = km_tp_split_dim(w);
    if (d >= 0) ne[d] = w->ne[d] == KM_WD_VOCAB ? km_tp_vocab_share(hp, g) : ne[d] / g;
}

kiln_status km_tp_check_type(const kiln_model_hparams *hp, const km_weight *w, int g, kiln_type t) {
    if (!km_tp_row_parallel(w)) return NULL; /* whole rows everywhere else */
    int64_t ne[4];
    km_tp_rank_shape(hp, w, g, ne);
    int64_t bl = kiln_type_block(t);
    if (ne[0] % bl == 0) return NULL;
    return kb_error(KILN_ERR_INVALID, "tensor parallelism over %d GPUs: %s's rows would be %lld wide on each GPU, not a "
                                      "multiple of the %s block (%lld)", g, w->name, (long long)ne[0], kiln_type_name(t),
                    (long long)bl);
}

/* ---- a rank's bytes of a weight (uploads shard by shard) ----------------------------------
 * The rank's tensor (its km_tp_rank_shape, row-major as every weight) is the concatenation of
 * km_tp_slice_count(...) byte ranges of the file's tensor, in order. Whole weights are one range;
 * a cut row count (column-parallel) one range per matrix of the weight (per expert); a cut row
 * (row-parallel, and the vectors) one range per row; cut matrices (per-head tensors) one
 * range. phi3's fused extents are cut part by part: q, k and v of attn_qkv, gate and up of
 * ffn_up, each part's share in turn. */

/* The parts of a fused extent (rows of each part, in order), 1 part otherwise. */
static int parts(const kiln_model_hparams *hp, km_wdim d, int64_t rows[3]) {
    if (d == KM_WD_QKV) {
        rows[0] = hp->head_dim * hp->n_head, rows[1] = rows[2] = hp->head_dim * hp->n_head_kv;
        return 3;
    }
    if (d == KM_WD_FF2) {
        rows[0] = rows[1] = hp->n_ff;
        return 2;
    }
    rows[0] = km_wdim_value(hp, d);
    return 1;
}

int64_t km_tp_slice_count(const kiln_model_hparams *hp, const km_weight *w, int g) {
    int64_t ne[4], rows[3];
    km_weight_shape(hp, w, ne);
    int d = g > 1 ? km_tp_split_dim(w) : -1;
    if (d < 0) return 1;
    if (d == 0) return ne[1] * ne[2] * ne[3];              /* every row cut */
    if (d == 1) return parts(hp, w->ne[1], rows) * ne[2] * ne[3]; /* a block of rows per part and matrix */
    return ne[3];                                          /* a block of matrices */
}

void km_tp_slice(const kiln_model_hparams *hp, const km_weight *w, int g, int rank, kiln_type t, int64_t i,
                 int64_t *off, int64_t *len) {
    int64_t ne[4], rows[3];
    km_weight_shape(hp, w, ne);
    int64_t rb = (int64_t)kiln_row_size(t, ne[0]), mat = rb * ne[1];
    int     d = g > 1 ? km_tp_split_dim(w) : -1;
    if (d < 0) {
        *off = 0, *len = mat * ne[2] * ne[3];
    } else if (d == 0) { /* row i: the rank's share of its elements */
        int64_t share = (int64_t)kiln_row_size(t, ne[0] / g);
        *off = i * rb + rank * share, *len = share;
    } else if (d == 1 && w->ne[1] == KM_WD_VOCAB) { /* the rank's vocabulary rows (the last rank's: fewer) */
        int64_t share = km_tp_vocab_share(hp, g), first = rank * share, n = ne[1] - first;
        n = n < 0 ? 0 : n > share ? share : n;
        *off = i * mat + (n ? first * rb : 0), *len = n * rb;
    } else if (d == 1) { /* part p of matrix m: the rank's share of the part's rows */
        int     np = parts(hp, w->ne[1], rows);
        int64_t m = i / np, p = i % np, before = 0;
        for (int q = 0; q < p; q++) before += rows[q];
        *off = m * mat + (before + rank * (rows[p] / g)) * rb, *len = rows[p] / g * rb;
    } else { /* d == 2: the rank's share of the matrices of block i */
        int64_t share = ne[2] / g;
        *off = i * mat * ne[2] + rank * share * mat, *len = share * mat;
    }
}

/* The table row of weight `name` ("blk.N.X" in layer N, else "X") in a model of hp, or NULL;
 * *il gets N (-1 outside the layers). phi3's fused ffn_up has its own row: the present one. */
static const km_weight *weight_of(const kiln_model_hparams *hp, const char *name, int64_t *il) {
    const char *base = name;
    if (!strncmp(name, "blk.", 4) && strchr(name + 4, '.')) base = strchr(name + 4, '.') + 1;
    *il = base == name ? -1 : strtoll(name + 4, NULL, 10);
    for (int i = 0; i < KM_W_COUNT; i++)
        if (!strcmp(km_weights[i].name, base) && km_weights[i].in_layer == (*il >= 0) &&
            km_weight_present(hp, &km_weights[i], *il))
            return &km_weights[i];
    return NULL;
}

kiln_status km_tp_weight_data(const kiln_model *m, const char *name, kiln_type t, int g, int rank, const void **data,
                              void **own) {
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    *data = NULL, *own = NULL;
    int64_t          il;
    const km_weight *w = weight_of(hp, name, &il);
    if (!w) return kb_error(KILN_ERR_NOT_FOUND, "tensor parallelism: '%s' is not a weight of %s models", name, hp->arch);
    int64_t ne[4];
    km_weight_shape(hp, w, ne);
    const unsigned char *whole = kiln_model_weight(m, name, t, ne[0] * ne[1] * ne[2] * ne[3]);
    if (!whole) return kb_error(KILN_ERR_NOT_FOUND, "tensor parallelism: the model has no %s weight '%s' of %lld elements",
                                kiln_type_name(t), name, (long long)(ne[0] * ne[1] * ne[2] * ne[3]));
    int64_t n = km_tp_slice_count(hp, w, g), off, len, rs[4];
    km_tp_rank_shape(hp, w, g, rs);
    size_t bytes = kiln_row_size(t, rs[0]) * (size_t)(rs[1] * rs[2] * rs[3]), at = 0;
    if (n == 1) { /* one range: the file's bytes as they are, unless padding follows them */
        km_tp_slice(hp, w, g, rank, t, 0, &off, &len);
        if ((size_t)len == bytes) {
            *data = whole + off;
            return NULL;
        }
    }
    unsigned char *part = malloc(bytes ? bytes : 1);
    if (!part) return kb_oom();
    for (int64_t i = 0; i < n && at <= bytes; i++) {
        km_tp_slice(hp, w, g, rank, t, i, &off, &len);
        if (at + (size_t)len <= bytes) memcpy(part + at, whole + off, (size_t)len);
        at += (size_t)len;
    }
    /* (the vocabulary's padding rows: zero, so their logits are 0 and no token reads them) */
    if (at < bytes && km_tp_split_dim(w) >= 0 && w->ne[km_tp_split_dim(w)] == KM_WD_VOCAB) memset(part + at, 0, bytes - at);
    else if (at != bytes) {
        free(part);
        return kb_error(KILN_ERR_INVALID, "tensor parallelism: rank %d's slices of '%s' hold %zu bytes, its shape %zu",
                        rank, name, at, bytes);
    }
    *data = *own = part;
    return NULL;
}

/* ---- kiln_model_tp_describe: the split of a model, for kiln inspect --tp ------------------- */

/* The type of weight w in layer il (-1 outside the layers): the file's, else the ftype's mix. */
static kiln_type tp_weight_type(const kiln_model *m, const km_weight *w, int64_t il) {
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    const kiln_gguf          *f = kiln_model_gguf(m);
    kiln_type                 t = km_weight_type(hp, w, il);
    if (!f) return t;
    char name[128];
    if (il >= 0) snprintf(name, sizeof name, "blk.%lld.%s", (long long)il, w->name);
    else snprintf(name, sizeof name, "%s", w->name);
    int64_t          i = kiln_gguf_find_tensor(f, name);
    kiln_gguf_tensor info;
    kiln_status      st = i >= 0 ? kiln_gguf_tensor_info(f, i, &info) : NULL;
    if (st) kiln_status_free(st);
    return i >= 0 && !st && info.has_kiln_type ? info.type : t;
}

static const char *tp_split_label(const km_weight *w) {
    int d = km_tp_split_dim(w);
    if (d < 0) return "whole on every GPU";
    if (km_tp_row_parallel(w)) return "input cut (row-parallel: all_reduce after)";
    if (w->ne[d] == KM_WD_VOCAB) return "vocabulary rows cut";
    return "output cut (column-parallel)";
}

static void tp_dims(kb_str *o, const int64_t ne[4], int nd) {
    kb_str_add(o, "[");
    for (int d = 0; d < nd; d++) kb_str_addf(o, "%s%lld", d ? ", " : "", (long long)ne[d]);
    kb_str_add(o, "]");
}

kiln_status kiln_model_tp_describe(const kiln_model *m, int g, int64_t n_ctx, char **text) {
    if (!m || !text) return kb_error(KILN_ERR_INVALID, "kiln_model_tp_describe: NULL argument");
    *text = NULL;
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    kiln_status               st = km_tp_check(hp, g);
    if (st) return st;
    kb_str o = {0};
    kb_str_addf(&o, "tensor parallelism over %d GPUs (Megatron-style, docs/tp.md): %s, %lld layers\n", g, hp->arch,
                (long long)hp->n_layer);
    double whole = 0, rank = 0;
    for (int i = 0; i < KM_W_COUNT && !st; i++) {
        const km_weight *w = &km_weights[i];
        int64_t          layers = 0, first = -1;
        if (w->in_layer) {
            for (int64_t il = 0; il < hp->n_layer; il++)
                if (km_weight_present(hp, w, il)) layers++, first = first < 0 ? il : first;
        } else if (km_weight_present(hp, w, -1)) {
            layers = 1;
        }
        if (!layers) continue;
        int64_t ne[4], part[4];
        km_weight_shape(hp, w, ne);
        km_tp_rank_shape(hp, w, g, part);
        kiln_type t = tp_weight_type(m, w, first);
        for (int64_t il = first; il < (w->in_layer ? hp->n_layer : first + 1) && !st; il++)
            if (!w->in_layer || km_weight_present(hp, w, il)) st = km_tp_check_type(hp, w, g, tp_weight_type(m, w, il));
        if (st) break;
        double wb = (double)kiln_row_size(t, ne[0]) * (double)(ne[1] * ne[2] * ne[3]);
        double rb = (double)kiln_row_size(t, part[0]) * (double)(part[1] * part[2] * part[3]);
        whole += wb * (double)layers, rank += rb * (double)layers;
        char name[96];
        snprintf(name, sizeof name, "%s%s", w->in_layer ? "blk.*." : "", w->name);
        kb_str_addf(&o, "  %-30s %-5s ", name, kiln_type_name(t));
        tp_dims(&o, ne, w->n_dims);
        kb_str_add(&o, " -> ");
        tp_dims(&o, part, w->n_dims);
        kb_str_addf(&o, "  %s", tp_split_label(w));
        if (w->in_layer && layers != hp->n_layer) kb_str_addf(&o, " (%lld layers)", (long long)layers);
        kb_str_add(&o, "\n");
    }
    if (st) {
        kb_str_free(&o);
        return st;
    }
    int64_t row = km_cache_row(hp), kv_rows = km_mla(hp) ? 1 : 2;
    double  kv = (double)hp->n_layer * (double)kv_rows * (double)row * (double)n_ctx * 2.0;
    /* (MLA's latent cache serves every head: whole on each GPU) */
    double kv_gpu = km_mla(hp) ? kv : kv / g;
    kb_str_addf(&o, "a GPU holds %.3f GB of the %.3f GB of weights, and %.1f MB of the %.1f MB KV cache at n_ctx %lld%s\n",
                rank / 1e9, whole / 1e9, kv_gpu / 1e6, kv / 1e6, (long long)n_ctx,
                km_mla(hp) ? " (the latent cache, whole on each GPU)" : "");
    kb_str_addf(&o, "collectives: an all_reduce of n_embd (%lld) floats a token after each layer's attention output and "
                    "FFN down products and after the embedding lookup: %lld a ubatch; each GPU's logits are its %lld "
                    "vocabulary rows, gathered on the host\n",
                (long long)hp->n_embd, (long long)(2 * hp->n_layer + 1), (long long)km_tp_vocab_share(hp, g));
    if (hp->n_vocab % g)
        kb_str_addf(&o, "the vocabulary is padded: the last GPU's %lld rows hold %lld tokens and zero rows\n",
                    (long long)km_tp_vocab_share(hp, g), (long long)(hp->n_vocab - (g - 1) * km_tp_vocab_share(hp, g)));
    /* A rank's graph, as kiln_build_opts.tp_size builds it, or why it cannot be built yet. */
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_build_opts bo = {.n_ctx = n_ctx, .n_tokens_max = 1, .tp_size = g};
    kiln_status     bst = ctx ? kiln_model_build(ctx, m, &bo) : kb_oom();
    if (bst) kb_str_addf(&o, "a GPU's graph: not built: %s\n", kiln_status_msg(bst));
    else kb_str_addf(&o, "a GPU's graph: builds; 'kiln run MODEL.gguf --tp %d' runs the GPUs' programs as a group "
                         "(NCCL), or with --cpu the CPU reference evaluates their graphs together\n", g);
    kiln_status_free(bst);
    kiln_ctx_free(ctx);
    *text = kb_str_take(&o);
    return *text ? NULL : kb_oom();
}
