/* Host data of a tensor-parallel group's graphs for the tests (tests/test_collective.c on the
 * CPU reference, tests/gpu/test_gpu_collective.c on GPUs): a random model's weights, or a
 * rank's slices of them (km_tp_slice), and the inputs of TS_TP_T tokens from an empty cache. */
#ifndef KILN_TESTS_TP_SUPPORT_H
#define KILN_TESTS_TP_SUPPORT_H

#include "model/arch.h"

enum { TS_TP_T = 5, TS_TP_CTX = 16 };

/* One graph's host data: the model's weights (a rank's slices of them), inputs, zero caches. */
typedef struct {
    const kiln_model         *m;
    const kiln_model_hparams *hp; /* the whole model's */
    int                       g, rank;
    int32_t                   tokens[TS_TP_T], pos[TS_TP_T], out_ids[TS_TP_T];
    int64_t                   slots[TS_TP_T];
    float                     shard[TS_TP_T];
    uint16_t                  mask[TS_TP_T * TS_TP_T], mask_swa[TS_TP_T * TS_TP_T];
    void                     *own[256]; /* buffers handed out, freed by ts_tp_free */
    int                       nown;
    float                    *logits; /* caught by ts_tp_put */
    int64_t                   nlogits;
} ts_tp_data;

/* Rank `rank` of g's data (g = 1: the whole model) with its inputs set. */
void ts_tp_init(ts_tp_data *d, const kiln_model *m, int g, int rank);
/* kiln_ref_get_fn / kiln_ref_put_fn over a ts_tp_data (put keeps the logits). */
const void *ts_tp_get(void *user, const char *name, kiln_type type, int64_t n);
void        ts_tp_put(void *user, const char *name, kiln_type type, int64_t n, const void *data);
/* The graph of rank `rank` of g (g = 1: the whole model), bound to TS_TP_T tokens from an empty
 * cache: *ctx the model's context, *bound the bound one (free both after the graph). */
kiln_graph *ts_tp_graph(const kiln_model *m, int g, int rank, kiln_ctx **ctx, kiln_ctx **bound);
void        ts_tp_free(ts_tp_data *d);

/* A Megatron-split MLP's graph text (caller frees): weights w1 f32[k, f] (column-parallel up)
 * and w2 f32[f, k] (row-parallel down), input x f32[k, n], y = w2·silu(w1·x) + x, the down
 * product's partial sums all-reduced over `ranks` (none for 1: the whole MLP, f its width). */
char *ts_tp_mlp_kg(int k, int f, int n, int ranks);

#endif
