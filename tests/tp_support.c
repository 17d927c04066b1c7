/* Host data of a tensor-parallel group's graphs for the tests (tests/tp_support.h). */
#include "tests/tp_support.h"

#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *keep(ts_tp_data *d, size_t bytes) {
    if (d->nown == (int)(sizeof d->own / sizeof d->own[0])) return NULL;
    return d->own[d->nown++] = calloc(1, bytes ? bytes : 1);
}

/* The model's weight `name` (blk.N.X or X), or this rank's slices of it in order. */
static const void *weight(ts_tp_data *d, const char *name, kiln_type type, int64_t n) {
    const char *base = name;
    if (!strncmp(name, "blk.", 4) && strchr(name + 4, '.')) base = strchr(name + 4, '.') + 1;
    int64_t il = base == name ? -1 : strtoll(name + 4, NULL, 10);
    const km_weight *w = NULL; /* (phi3's fused ffn_up has its own row: the one this model has) */
    for (int i = 0; i < KM_W_COUNT && !w; i++)
        if (!strcmp(km_weights[i].name, base) && km_weights[i].in_layer == (il >= 0) && km_weight_present(d->hp, &km_weights[i], il))
            w = &km_weights[i];
    if (!w) return NULL;
    int64_t ne[4];
    km_weight_shape(d->hp, w, ne);
    const unsigned char *whole = kiln_model_weight(d->m, name, type, ne[0] * ne[1] * ne[2] * ne[3]);
    if (!whole || d->g == 1) return whole;
    unsigned char *part = keep(d, kiln_row_size(type, n));
    if (!part) return NULL;
    int64_t at = 0, cnt = km_tp_slice_count(d->hp, w, d->g);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t off, len;
        km_tp_slice(d->hp, w, d->g, d->rank, type, i, &off, &len);
        memcpy(part + at, whole + off, (size_t)len);
        at += len;
    }
    /* (the last rank's padding rows of a vocabulary g does not divide: zero, as calloc left them) */
    bool vocab = km_tp_split_dim(w) >= 0 && w->ne[km_tp_split_dim(w)] == KM_WD_VOCAB;
    return at == (int64_t)kiln_row_size(type, n) || (vocab && at < (int64_t)kiln_row_size(type, n)) ? part : NULL;
}

const void *ts_tp_get(void *user, const char *name, kiln_type type, int64_t n) {
    ts_tp_data *d = user;
    if (!strcmp(name, "inp_tokens")) return d->tokens;
    if (!strcmp(name, "inp_pos")) return d->pos;
    if (!strcmp(name, "kv_idxs")) return d->slots;
    if (!strcmp(name, "inp_out_ids")) return d->out_ids;
    if (!strcmp(name, "inp_tok_shard")) return d->shard;
    if (!strcmp(name, "kq_mask")) return d->mask;
    if (!strcmp(name, "kq_mask_swa")) return d->mask_swa;
    if (!strncmp(name, "cache_", 6)) return keep(d, kiln_row_size(type, n));
    return weight(d, name, type, n);
}

void ts_tp_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    ts_tp_data *d = user;
    if (strcmp(name, "logits") || type != KILN_F32 || d->logits) return;
    if ((d->logits = malloc((size_t)n * sizeof *d->logits))) memcpy(d->logits, data, (size_t)n * sizeof(float)), d->nlogits = n;
}

kiln_graph *ts_tp_graph(const kiln_model *m, int g, int rank, kiln_ctx **ctx, kiln_ctx **bound) {
    *ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = TS_TP_CTX, .n_tokens_max = 8, .outputs = KILN_OUTPUTS_ALL, .tp_size = g, .tp_rank = rank};
    TS_OK(kiln_model_build(*ctx, m, &o));
    static const char *const names[2] = {"n_tokens", "n_kv"};
    const int64_t            values[2] = {TS_TP_T, TS_TP_T};
    TS_OK(kiln_ctx_bind(*ctx, 2, names, values, bound));
    kiln_graph *gr = NULL;
    TS_OK(kiln_graph_new(*bound, &gr));
    return gr;
}

/* Tokens spread over the vocabulary (on a rank: its row of each token in its shard, else row 0
 * and a shard weight of 0), positions and cache slots 0.., causal masks. */
static void inputs(ts_tp_data *d, const kiln_model_hparams *hp) {
    const int64_t vs = (hp->n_vocab + d->g - 1) / d->g; /* (a padded vocabulary: docs/tp.md) */
    for (int t = 0; t < TS_TP_T; t++) {
        int32_t tok = (int32_t)((t * 7919 + 13) % hp->n_vocab);
        bool    in = tok / vs == d->rank;
        d->tokens[t] = d->g == 1 ? tok : in ? (int32_t)(tok - d->rank * vs) : 0;
        d->shard[t] = in ? 1.0f : 0.0f;
        d->pos[t] = t, d->out_ids[t] = t, d->slots[t] = t;
        for (int j = 0; j < TS_TP_T; j++) {
            d->mask[t * TS_TP_T + j] = j <= t ? 0 : 0xFC00; /* f16 -inf */
            d->mask_swa[t * TS_TP_T + j] = j <= t && t - j < hp->n_swa ? 0 : 0xFC00;
        }
    }
}

void ts_tp_free(ts_tp_data *d) {
    for (int i = 0; i < d->nown; i++) free(d->own[i]);
    free(d->logits);
}


void ts_tp_init(ts_tp_data *d, const kiln_model *m, int g, int rank) {
    *d = (ts_tp_data){.m = m, .hp = kiln_model_get_hparams(m), .g = g, .rank = rank};
    inputs(d, d->hp);
}

char *ts_tp_mlp_kg(int k, int f, int n, int ranks) {
    char *t = malloc(1024), reduce[64] = "";
    ck_assert_ptr_nonnull(t);
    if (ranks > 1) snprintf(reduce, sizeof reduce, "s = all_reduce(o, %d)\n", ranks);
    snprintf(t, 1024,
             "weight w1: f32[%d, %d]\nweight w2: f32[%d, %d]\ninput x: f32[%d, %d]\n"
             "h = mul_mat(w1, x)\na = silu(h)\no = mul_mat(w2, a)\n%soutput y = add(%s, x)\n",
             k, f, f, k, k, n, reduce, ranks > 1 ? "s" : "o");
    return t;
}
