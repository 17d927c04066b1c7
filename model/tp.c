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

kiln_status km_tp_check(const kiln_model_hparams *hp, int g) {
    if (g < 1 || g > 64) return kb_error(KILN_ERR_INVALID, "tensor parallelism over %d GPUs: 1 .. 64", g);
    tp_unit u[8];
    int     n = units(hp, u);
    for (int i = 0; i < n; i++)
        if (u[i].n % g != 0)
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

void km_tp_rank_shape(const kiln_model_hparams *hp, const km_weight *w, int g, int64_t ne[4]) {
    km_weight_shape(hp, w, ne);
    int d = km_tp_split_dim(w);
    if (d >= 0) ne[d] /= g;
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
