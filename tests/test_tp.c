/* Tensor parallelism, the plan (model/tp.c; issue 30): for every preset and 2 and 4 GPUs, each
 * weight is either whole on every rank or cut along exactly one extent, a rank's shares add up
 * to the weight, row-parallel weights map into n_embd, and what cannot split is refused with the
 * hyperparameter named; Llama-3-70B in bf16 fits two 80 GB GPUs (a rank's weights) and in
 * Q4_K_M keeps whole blocks in every rank's rows. No GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

/* Bytes of the weights of a model of hp on one rank of g (all layers), and in all. */
static void rank_bytes(const kiln_model_hparams *hp, int g, double *rank, double *all) {
    *rank = *all = 0;
    for (int i = 0; i < KM_W_COUNT; i++) {
        const km_weight *w = &km_weights[i];
        if (!km_weight_present(hp, w, -1)) continue;
        int64_t full[4], part[4];
        km_weight_shape(hp, w, full);
        km_tp_rank_shape(hp, w, g, part);
        double n = w->in_layer ? (double)hp->n_layer : 1.0, es = 2.0; /* bf16 */
        *all += n * es * (double)(full[0] * full[1] * full[2] * full[3]);
        *rank += n * es * (double)(part[0] * part[1] * part[2] * part[3]);
    }
}

/* The weights of preset i split over g GPUs as the plan says, or the preset is refused. */
static void check_preset(int i, int g) {
    const char        *arch, *name = kiln_model_preset_name(i, &arch);
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(arch, name, &hp));
    kiln_status st = km_tp_check(&hp, g);
    if (st) { /* a refusal names the hyperparameter that does not divide */
        ck_assert_msg(strstr(kiln_status_msg(st), "is not a multiple of"), "%s/%s g %d: %s", arch, name, g,
                      kiln_status_msg(st));
        kiln_status_free(st);
        return;
    }
    for (int k = 0; k < KM_W_COUNT; k++) {
        const km_weight *w = &km_weights[k];
        if (!km_weight_present(&hp, w, -1)) continue;
        int cut = 0;
        for (int d = 0; d < w->n_dims; d++) cut += km_tp_sharded(w->ne[d]);
        ck_assert_msg(cut <= 1, "%s/%s: %s is cut along %d extents", arch, name, w->name, cut);
        int64_t full[4], part[4];
        km_weight_shape(&hp, w, full);
        km_tp_rank_shape(&hp, w, g, part);
        int d = km_tp_split_dim(w);
        for (int e = 0; e < 4; e++)
            ck_assert_msg(part[e] * (e == d ? g : 1) == full[e], "%s/%s g %d: %s dim %d: %lld on a rank, %lld whole", arch,
                          name, g, w->name, e, (long long)part[e], (long long)full[e]);
        if (km_tp_row_parallel(w)) ck_assert_int_eq(w->ne[1], KM_WD_EMBD);
    }
    double rank, all;
    rank_bytes(&hp, g, &rank, &all);
    ck_assert_msg(rank < all && rank >= all / g, "%s/%s g %d: %g bytes a rank of %g", arch, name, g, rank, all);
}

START_TEST(every_preset_splits_or_is_refused) {
    for (int i = 0; kiln_model_preset_name(i, NULL); i++) {
        check_preset(i, 2);
        check_preset(i, 4);
    }
}
END_TEST

START_TEST(refusals_name_the_hyperparameter) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(NULL, "qwen3-30b-a3b", &hp));
    ts_expect_status(km_tp_check(&hp, 8), KILN_ERR_INVALID,
                     "tensor parallelism over 8 GPUs: n_head_kv 4 is not a multiple of 8 (the kv heads");
    ts_expect_status(km_tp_check(&hp, 3), KILN_ERR_INVALID, "n_head 32 is not a multiple of 3");
    ts_expect_status(km_tp_check(&hp, 0), KILN_ERR_INVALID, "tensor parallelism over 0 GPUs: 1 .. 64");
    TS_OK(km_tp_check(&hp, 4));
    /* Q4_K experts of 768 columns: 384 on each of 2 GPUs, not whole 256-element blocks */
    ts_expect_status(km_tp_check_type(&hp, &km_weights[KM_W_FFN_DOWN_EXPS], 2, KILN_Q4_K), KILN_ERR_INVALID,
                     "ffn_down_exps.weight's rows would be 384 wide on each GPU, not a multiple of the q4_K block (256)");
    TS_OK(km_tp_check_type(&hp, &km_weights[KM_W_FFN_DOWN_EXPS], 2, KILN_Q8_0));
    /* a column-parallel weight keeps whole rows whatever its type */
    TS_OK(km_tp_check_type(&hp, &km_weights[KM_W_FFN_GATE_EXPS], 4, KILN_Q4_K));
}
END_TEST

START_TEST(llama_70b_over_2_and_4_gpus) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(NULL, "llama-3-70b", &hp));
    for (int g = 2; g <= 4; g += 2) {
        TS_OK(km_tp_check(&hp, g));
        double rank, all;
        rank_bytes(&hp, g, &rank, &all);
        ck_assert_msg(all > 140e9 && all < 142e9, "llama-3-70b bf16: %g bytes", all);
        /* everything but the norms is cut: a rank holds 1/g of the weights and a little more */
        ck_assert_msg(rank < all / g * 1.001, "g %d: %g bytes a rank of %g", g, rank, all);
        hp.ftype = KILN_FTYPE_MOSTLY_Q4_K_M;
        for (int k = 0; k < KM_W_COUNT; k++) {
            const km_weight *w = &km_weights[k];
            if (!km_weight_present(&hp, w, -1)) continue;
            char name[96];
            snprintf(name, sizeof name, w->in_layer ? "blk.0.%s" : "%s", w->name);
            TS_OK(km_tp_check_type(&hp, w, g, kiln_model_weight_type(&hp, name)));
        }
        hp.ftype = KILN_FTYPE_MOSTLY_BF16;
    }
    /* a rank's KV cache: n_head_kv / g heads */
    int64_t kv[4];
    km_tp_rank_shape(&hp, &km_weights[KM_W_ATTN_K], 4, kv);
    ck_assert_int_eq(kv[1], 2 * 128);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("tp", TS_CASE("plan", 60),
                        TS_TESTS(every_preset_splits_or_is_refused, refusals_name_the_hyperparameter,
                                 llama_70b_over_2_and_4_gpus));
    return ts_main_isolated(s, "tp");
}
